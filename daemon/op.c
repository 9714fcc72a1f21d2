/* An op's life (job.h, job_impl.h): states, references, deadlines,
 * answers, reports to other nodes and failure; and the job's run of ops. */
#include "err.h"
#include "job_impl.h"

#include <obcomm.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "enforce.h"
#include "ops.h"
#include "wire.h"

/* ---- ops: states, references and the ready queue ---- */

/* legal[from][to]: the transitions of job.h's life of an op, checked at
 * every change in every build. */
static const unsigned char legal[OBD_OP_STATES][OBD_OP_STATES] = {
    [OBD_OP_COLLECT] = {[OBD_OP_LOCAL] = 1, [OBD_OP_DONE] = 1},
    [OBD_OP_LOCAL] = {[OBD_OP_AGREED] = 1, [OBD_OP_DONE] = 1},
    [OBD_OP_AGREED] = {[OBD_OP_RUN] = 1, [OBD_OP_DONE] = 1},
    [OBD_OP_RUN] = {[OBD_OP_DONE] = 1},
    [OBD_OP_DONE] = {[OBD_OP_RETIRED] = 1},
    [OBD_OP_RETIRED] = {[OBD_OP_FREEING] = 1},
};

void obd_op_enter(struct obd_op *op, enum obd_op_state to)
{
    OBD_ENFORCE(legal[op->state][to], "op %llu: state %d to %d",
                (unsigned long long)op->seq, (int)op->state, (int)to);
    op->state = to;
}

void obd_op_schedule(struct obd_op *op)
{
    if (op->state == OBD_OP_FREEING)
        return; /* nothing is left to run */
    obd_runq_post(&op->job->d->runq, &op->ready);
}

static void op_task_begin(struct obd_op *op)
{
    op->refs++;
    op->tasks++;
    op->job->d->pool_tasks++;
}

static void op_task_end(struct obd_op *op)
{
    op->refs--;
    op->tasks--;
    op->job->d->pool_tasks--;
    obd_op_schedule(op);
}

static void on_op_written(void *arg, int status)
{
    struct obd_op *op = arg;
    (void)status; /* a lost link fails the op through peer_lost */
    op->refs--;
    obd_op_schedule(op);
}

static int op_send(struct obd_op *op, int to, uint32_t step, uint32_t segment,
                   const void *payload, uint32_t len)
{
    struct obd_frame f = {.job = op->job->id,
                          .seq = op->seq,
                          .fingerprint = op->fingerprint,
                          .step = step,
                          .segment = segment,
                          .len = len};
    struct obd_daemon *d = op->job->d;
    int rc = d->hooks.send_data(d, to, &f, payload, on_op_written, op);
    if (rc == 0)
        op->refs++;
    return rc;
}

static void on_timer_closed(uv_handle_t *h)
{
    struct obd_op *op = container_of(h, struct obd_op, deadline);
    struct obd_job *job = op->job;
    struct obd_algo const *algo = obd_coll_algo(op->desc.kind);
    if (op->status != 0 && op->failed_agreed && op->ended_in >= OBD_OP_LOCAL &&
        algo != NULL && algo->failed != NULL)
        algo->failed(op);
    if (op->coll != NULL && algo != NULL)
        algo->free(op);
    for (int i = 0; i < OBD_MAX_LOCAL; i++) {
        obd_shm_unref(op->buf[i]);
        obd_shm_unref(op->outbuf[i]);
    }
    free(op->ann);
    free(op);
    job->live--;
    obd_runq_post(&job->d->runq, &job->ready);
    /* A state that this op held may let another job's op start. */
    if (job->d->hooks.ops_changed != NULL)
        job->d->hooks.ops_changed(job->d);
}

void obd_op_advance_seq(struct obd_job *job)
{
    uint64_t next = UINT64_MAX;
    for (struct obd_op *o = job->ops; o; o = o->next)
        if (obd_op_open(o) && o->seq < next)
            next = o->seq;
    /* Without open ops the next op is one past the newest known one. */
    if (next == UINT64_MAX) {
        next = job->next_seq;
        for (struct obd_op *o = job->ops; o; o = o->next)
            if (o->seq + 1 > next)
                next = o->seq + 1;
    }
    job->next_seq = next;
}

/* The timeline: matching (first submit or announce to the verdict) and
 * the run, on the job's track. */
static void trace_op(const struct obd_op *op)
{
    struct obd_daemon *d = op->job->d;
    if (d->trace.f == NULL)
        return;
    const struct obd_algo *algo = obd_coll_algo(op->desc.kind);
    char args[256];
    snprintf(args, sizeof(args),
             "\"job\":\"%s\",\"seq\":%llu,\"count\":%llu,\"status\":%d",
             op->job->name, (unsigned long long)op->seq,
             (unsigned long long)op->desc.count, op->status);
    uint64_t matched = op->start_ns ? op->start_ns : op->done_ns;
    int tid = (int)(op->job->id % OBD_TRACE_POOL);
    obd_trace_span(d, "matching", "op", tid, op->created_ns, matched, args);
    if (op->start_ns)
        obd_trace_span(d, algo ? algo->name : "op", "op", tid, op->start_ns,
                       op->done_ns, args);
}

static void account_done(struct obd_op *op)
{
    struct obd_daemon *d = op->job->d;
    op->done_ns = uv_hrtime();
    uint64_t us = (op->done_ns - op->created_ns) / 1000;
    trace_op(op);
    obd_metric_add(&d->metrics, OBD_M_OP_LATENCY_US_SUM, us);
    obd_metric_max(&d->metrics, OBD_M_OP_LATENCY_US_MAX, us);
    obd_metric_add(&d->metrics,
                   op->status ? OBD_M_OPS_FAILED : OBD_M_OPS_COMPLETED, 1);
    if (op->status == 0 && op->desc.kind == OBCOMM_KIND_ALLREDUCE) {
        obd_metric_add(&d->metrics, OBD_M_ALLREDUCE_OPS, 1);
        obd_metric_add(&d->metrics, OBD_M_ALLREDUCE_LATENCY_US_SUM, us);
    }
    if (op->status == 0 && op->desc.kind == OBCOMM_KIND_ALLREDUCE_1BIT)
        obd_metric_add(&d->metrics, OBD_M_ONEBIT_LATENCY_US_SUM, us);
    if (op->status == 0) /* latency histograms */
        obd_metrics_observe(&d->metrics, op->desc.kind, op->desc.dtype,
                            op->desc.count, us);
}

/* Marks the op DONE with its verdict; the ready queue does the rest. */
static void op_done(struct obd_op *op)
{
    op->ended_in = op->state;
    obd_op_enter(op, OBD_OP_DONE);
    uv_timer_stop(&op->deadline);
    account_done(op);
    obd_op_schedule(op);
}

static void op_finish(struct obd_op *op)
{
    if (!obd_op_open(op))
        return;
    op->status = 0;
    op->message[0] = '\0';
    op_done(op);
}

/* Answers every trainer that submitted and has no answer yet. A failed
 * op answers only once no pool task touches the trainers' memory. */
static void op_answer(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    if (obd_op_open(op) || op->tasks > 0)
        return;
    int answered = 0;
    for (int i = 0; i < job->local_size; i++)
        if (op->submitted[i] && !op->answered[i]) {
            op->answered[i] = 1;
            answered++;
            if (job->trainer[i] != NULL)
                d->hooks.answer(job->trainer[i], op->seq, op->status,
                                op->message, op->status ? 0 : op->value,
                                op->status ? 0 : op->bytes);
        }
    if (answered > 0)
        obd_trace_span(d, "completion", "op", (int)(job->id % OBD_TRACE_POOL),
                       op->done_ns, uv_hrtime(), NULL);
}

/* An op leaves the job's list once every local trainer still joined has
 * its answer: a trainer that has not submitted yet gets the op's result
 * when it does, so a failed op lingers until then. */
static int op_retirable(const struct obd_op *op)
{
    const struct obd_job *job = op->job;
    if (obd_op_open(op) || op->tasks > 0)
        return 0;
    for (int i = 0; i < job->local_size; i++)
        if (job->trainer[i] != NULL && !op->answered[i])
            return 0;
    return 1;
}

static void op_unlink(struct obd_op *op)
{
    struct obd_job *job = op->job;
    for (struct obd_op **pp = &job->ops; *pp; pp = &(*pp)->next)
        if (*pp == op) {
            *pp = op->next;
            break;
        }
    op->next = NULL;
    obd_op_enter(op, OBD_OP_RETIRED);
}

/* Runs an op that was posted: its algorithm's progress while it runs;
 * once DONE the answers, retiring from the job and, when nothing refers
 * to it any more, its free (through the deadline timer's close). This is
 * the only place that ends an op, always on a turn of its own. */
static void op_run(struct obd_ready *r)
{
    struct obd_op *op = container_of(r, struct obd_op, ready);
    struct obd_job *job = op->job;

    if (op->state == OBD_OP_RUN && op->coll != NULL)
        obd_coll_algo(op->desc.kind)->progress(op);
    if (obd_op_open(op))
        return;
    op_answer(op);
    /* A later 1-bit op may wait for this one to announce (obd_match_announce).
     */
    obd_runq_post(&job->d->runq, &job->ready);
    /* Advanced while the op is still linked, so that it counts as the
     * newest op the job has seen. */
    obd_op_advance_seq(job);
    if (op->state == OBD_OP_DONE && op_retirable(op)) {
        op_unlink(op);
        obd_runq_post(&job->d->runq, &job->ready);
    }
    if (op->state == OBD_OP_RETIRED && op->refs == 0) {
        /* It may have posted itself while it ran (its finish does). */
        obd_runq_cancel(&job->d->runq, &op->ready);
        obd_op_enter(op, OBD_OP_FREEING);
        uv_close((uv_handle_t *)&op->deadline, on_timer_closed);
    }
}

void obd_op_announce_to(struct obd_op *op, const struct obd_announce *a,
                        int only)
{
    struct obd_daemon *d = op->job->d;
    if (op->job->detached)
        return;
    Obcomm__OpAnnounce an = OBCOMM__OP_ANNOUNCE__INIT;
    Obcomm__PeerMsg msg = OBCOMM__PEER_MSG__INIT;
    an.job = op->job->name;
    an.seq = op->seq;
    an.node_rank = (uint32_t)d->cfg.rank;
    an.local_size = a->local_size;
    an.kind = a->desc.kind;
    an.dtype = a->desc.dtype;
    an.redop = a->desc.redop;
    an.count = a->desc.count;
    an.key = a->desc.key;
    an.root = a->desc.root;
    an.status = obd_err_public(a->status);
    an.message = (char *)a->message;
    an.agreed = a->agreed != 0;
    an.run = op->job->run_local;
    an.owner_uid = a->owner.uid;
    an.owner_by_name = a->owner.by_name != 0;
    an.owner_name = (char *)a->owner.name;
    Obcomm__EfVersion ef = OBCOMM__EF_VERSION__INIT;
    if (a->desc.kind == OBCOMM_KIND_ALLREDUCE_1BIT && a->status == 0) {
        ef.origin = a->ef.origin;
        ef.applied = a->ef.applied;
        ef.last_seq = a->ef.last_seq;
        an.ef = &ef;
    }
    msg.body_case = OBCOMM__PEER_MSG__BODY_ANNOUNCE;
    msg.announce = &an;
    for (int i = 0; i < d->cfg.nodes; i++)
        if (i != d->cfg.rank && (only < 0 || i == only))
            (void)d->hooks.send_ctrl(d, i, &msg);
}

/* Announces to every node whose link is up; a link that comes up later
 * gets the announces of open ops then (obd_job_on_peer_up). */
void obd_op_announce_to_all(struct obd_op *op, const struct obd_announce *a)
{
    obd_op_announce_to(op, a, -1);
}

static void op_report(struct obd_op *op, int status, const char *message)
{
    struct obd_daemon *d = op->job->d;
    struct obd_announce *mine = &op->ann[d->cfg.rank];
    mine->reported = 1;
    mine->report_status = status;
    snprintf(mine->report_message, sizeof(mine->report_message), "%s",
             message ? message : "");
    if (op->job->detached) {
        obd_op_schedule(op);
        return;
    }
    Obcomm__OpAnnounce an = OBCOMM__OP_ANNOUNCE__INIT;
    Obcomm__PeerMsg msg = OBCOMM__PEER_MSG__INIT;
    an.job = op->job->name;
    an.seq = op->seq;
    an.node_rank = (uint32_t)d->cfg.rank;
    an.status = obd_err_public(status);
    an.message = mine->report_message;
    an.phase = 1;
    an.run = op->job->run_local;
    msg.body_case = OBCOMM__PEER_MSG__BODY_ANNOUNCE;
    msg.announce = &an;
    for (int i = 0; i < d->cfg.nodes; i++)
        if (i != d->cfg.rank)
            (void)d->hooks.send_ctrl(d, i, &msg);
    obd_op_schedule(op);
}

static int op_all_reported(const struct obd_op *op)
{
    for (int n = 0; n < op->job->d->cfg.nodes; n++)
        if (!op->ann[n].reported)
            return 0;
    return 1;
}

/* ---- what an algorithm gets (coll.h, op->svc) ---- */

static void svc_fail(struct obd_op *op, int status, int announce,
                     const char *message)
{
    obd_op_set_failed(op, status, announce, "%s", message);
}

static int svc_idle(const struct obd_op *op)
{
    return op->refs == 0;
}

/* The daemon's buffer pool, lent through the op (bufpool.h). */
static void *svc_scratch_get(struct obd_op *op, size_t bytes, size_t *cap)
{
    return obd_bufpool_scratch_get(&op->job->d->bufpool, bytes, cap);
}

static void svc_scratch_put(struct obd_op *op, void *p, size_t cap)
{
    obd_bufpool_scratch_put(&op->job->d->bufpool, p, cap);
}

static void *svc_segbuf_get(struct obd_op *op, size_t bytes)
{
    struct obd_daemon *d = op->job->d;
    return obd_bufpool_segbuf_get(&d->bufpool, &d->metrics, bytes);
}

static void svc_segbuf_put(struct obd_op *op, void *p, size_t bytes)
{
    obd_bufpool_segbuf_put(&op->job->d->bufpool, p, bytes);
}

static const struct obd_opsvc op_svc = {
    .idle = svc_idle,
    .fail = svc_fail,
    .finish = op_finish,
    .send = op_send,
    .task_begin = op_task_begin,
    .task_end = op_task_end,
    .report = op_report,
    .all_reported = op_all_reported,
    .scratch_get = svc_scratch_get,
    .scratch_put = svc_scratch_put,
    .segbuf_get = svc_segbuf_get,
    .segbuf_put = svc_segbuf_put,
};

void obd_op_set_failed(struct obd_op *op, int status, int announce,
                       const char *fmt, ...)
{
    if (!obd_op_open(op))
        return;
    struct obd_daemon *d = op->job->d;

    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->message, sizeof(op->message), fmt, ap);
    va_end(ap);
    op->status = status;
    if (status == OBD_E_TIMEOUT)
        obd_metric_add(&d->metrics, OBD_M_OPS_TIMEOUT, 1);
    if (status == OBD_E_MISMATCH)
        obd_metric_add(&d->metrics, OBD_M_OPS_MISMATCH, 1);
    obd_log_warn(&d->log, "job %s op %llu failed: %s", op->job->name,
                 (unsigned long long)op->seq, op->message);

    if (op->state == OBD_OP_AGREED || op->state == OBD_OP_RUN)
        op->failed_agreed = 1;
    char what[sizeof(op->job->stopped)];
    snprintf(what, sizeof(what),
             "this run cannot continue after op %llu failed (%s); restart "
             "its trainers",
             (unsigned long long)op->seq, op->message);
    if (announce && d->cfg.nodes > 1) {
        struct obd_announce a = {
            .have = 1, .status = status, .agreed = op->failed_agreed};
        snprintf(a.message, sizeof(a.message), "%s", op->message);
        obd_op_announce_to_all(op, &a);
    }
    op_done(op);
    obd_op_stop_run(op->job, op->seq + 1, status, what, 1);
}

/* ", link down" when node n's link is not up (send_ctrl says so). */
static const char *link_words(const struct obd_daemon *d, int n)
{
    if (d->hooks.node_lost != NULL && d->hooks.node_lost(d, n, NULL, 0))
        return ", its link is down";
    return "";
}

/* Every rank and node arrived: says what the op still waits for. */
static void describe_waiting(const struct obd_op *op, char *buf, size_t len)
{
    const struct obd_job *job = op->job;
    const struct obd_daemon *d = job->d;
    for (const struct obd_op *o = job->ops; o && o->seq < op->seq; o = o->next)
        if (obd_op_open(o)) {
            snprintf(buf, len,
                     "nobody (every rank arrived); the op waits for op %llu "
                     "of the job, still %s",
                     (unsigned long long)o->seq,
                     o->state == OBD_OP_RUN ? "running" : "collecting");
            return;
        }
    snprintf(buf, len, "nobody (every rank arrived); the op %s on node %d",
             op->state == OBD_OP_RUN      ? "runs"
             : op->state == OBD_OP_AGREED ? "was agreed and waits to start"
                                          : "waits for the nodes' verdict",
             (int)d->cfg.rank);
}

/* Lists the global ranks of the job that have not submitted or announced:
 * "ranks 2, 3 (node 1)"; when all are in, what the op waits for. */
void obd_op_describe_missing(const struct obd_op *op, char *buf, size_t len)
{
    const struct obd_job *job = op->job;
    const struct obd_daemon *d = job->d;
    size_t off = 0;
    buf[0] = '\0';
    for (int n = 0; n < d->cfg.nodes && off < len; n++) {
        if (n == d->cfg.rank) {
            for (int i = 0; i < job->local_size && off < len; i++)
                if (!op->submitted[i])
                    off += (size_t)snprintf(
                        buf + off, len - off, "%srank %d (node %d local %d%s)",
                        off ? ", " : "", obd_job_rank(job, n, i), n, i,
                        job->trainer[i] ? "" : ", not joined");
        } else if (!op->ann[n].have && off < len) {
            int ls = job->local_size;
            const char *link = link_words(d, n);
            if (ls == 1)
                off += (size_t)snprintf(buf + off, len - off,
                                        "%snode %d (rank %d%s)",
                                        off ? ", " : "", n, n, link);
            else if (ls > 0)
                off += (size_t)snprintf(
                    buf + off, len - off, "%snode %d (ranks %d-%d%s)",
                    off ? ", " : "", n, n * ls, n * ls + ls - 1, link);
            else
                off += (size_t)snprintf(buf + off, len - off, "%snode %d%s",
                                        off ? ", " : "", n,
                                        link[0] ? " (link down)" : "");
        }
    }
    if (off == 0)
        describe_waiting(op, buf, len);
}

/* 1 if a node whose announce the open op misses has its link up: that
 * node may still say why (a trainer of it missing). */
static int missing_reachable(const struct obd_op *op)
{
    const struct obd_daemon *d = op->job->d;
    for (int n = 0; n < d->cfg.nodes; n++)
        if (n != d->cfg.rank && !op->ann[n].have &&
            (d->hooks.node_down == NULL || !d->hooks.node_down(d, n, NULL, 0)))
            return 1;
    return 0;
}

static void on_deadline(uv_timer_t *t)
{
    struct obd_op *op = container_of(t, struct obd_op, deadline);
    struct obd_job *job = op->job;
    char who[320];
    if (!obd_op_open(op))
        return;

    if (op->state == OBD_OP_RUN && op->coll != NULL) {
        who[0] = '\0';
        obd_coll_algo(op->desc.kind)->waiting_on(op, who, sizeof(who));
        if (who[0] == '\0')
            describe_waiting(op, who, sizeof(who));
        obd_op_set_failed(op, OBD_E_TIMEOUT, 1,
                          "op %llu of job %s timed out after %d ms on node %d "
                          "waiting for %s",
                          (unsigned long long)op->seq, job->name,
                          job->timeout_ms, (int)job->d->cfg.rank, who);
        return;
    }
    if (op->state >= OBD_OP_LOCAL && !op->grace && missing_reachable(op)) {
        /* Every local trainer is here: the missing ranks are on other
         * nodes, and the node that misses a trainer can name it. Give its
         * report a moment to arrive before failing with a coarser one. A
         * node whose link is down cannot report: the op fails at its
         * deadline. */
        uint64_t grace = (uint64_t)job->timeout_ms / 4;
        grace = grace < 50 ? 50 : grace > 2000 ? 2000 : grace;
        op->grace = 1;
        uv_timer_start(&op->deadline, on_deadline, grace, 0);
        return;
    }
    obd_op_describe_missing(op, who, sizeof(who));
    obd_op_set_failed(
        op, OBD_E_TIMEOUT, 1,
        "op %llu of job %s timed out after %d ms; never arrived: %s",
        (unsigned long long)op->seq, job->name, job->timeout_ms, who);
}

void obd_op_restart_deadline(struct obd_op *op)
{
    uv_timer_start(&op->deadline, on_deadline, (uint64_t)op->job->timeout_ms,
                   0);
}

struct obd_op *obd_op_find(struct obd_job *job, uint64_t seq)
{
    for (struct obd_op *o = job->ops; o; o = o->next)
        if (o->seq == seq)
            return o;
    return NULL;
}

/* The first node whose link was up and is down now (every op of a job
 * needs every node), with what ended it; -1 when there is none. A node
 * whose link has not come up yet is not lost: the world is still
 * forming, and its ops wait for it until their deadline. */
static int lost_node(const struct obd_daemon *d, char *why, size_t len)
{
    if (d->hooks.node_lost == NULL)
        return -1;
    for (int n = 0; n < d->cfg.nodes; n++)
        if (n != d->cfg.rank && d->hooks.node_lost(d, n, why, len))
            return n;
    return -1;
}

struct obd_op *obd_op_get(struct obd_job *job, uint64_t seq)
{
    struct obd_daemon *d = job->d;
    struct obd_op *op = obd_op_find(job, seq);
    if (op != NULL)
        return op;
    if (seq < job->next_seq || seq - job->next_seq >= OBD_OP_WINDOW)
        return NULL;

    op = calloc(1, sizeof(*op));
    if (op == NULL)
        return NULL;
    op->ann = calloc((size_t)d->cfg.nodes, sizeof(*op->ann));
    if (op->ann == NULL) {
        free(op);
        return NULL;
    }
    op->job = job;
    op->seq = seq;
    op->svc = &op_svc;
    op->ready.run = op_run;
    op->created_ns = uv_hrtime();
    uv_timer_init(&d->loop, &op->deadline);
    uv_timer_start(&op->deadline, on_deadline, (uint64_t)job->timeout_ms, 0);
    job->live++;

    struct obd_op **pp = &job->ops;
    while (*pp && (*pp)->seq < seq)
        pp = &(*pp)->next;
    op->next = *pp;
    *pp = op;

    /* Once the run stopped (an op failed, a rank left), every later op
     * fails at once instead of on its deadline; so does an op that needs
     * a node whose link is down. */
    char why[200];
    int lost = lost_node(d, why, sizeof(why));
    if (job->stopped[0] != '\0' && seq >= job->stopped_seq)
        obd_op_set_failed(op, job->stopped_status, 1, "op %llu of job %s: %s",
                          (unsigned long long)seq, job->name, job->stopped);
    else if (d->closing)
        obd_op_set_failed(
            op, OBD_E_PEER_LOST, 0,
            "op %llu of job %s: obcommd on node %d is shutting down",
            (unsigned long long)seq, job->name, (int)d->cfg.rank);
    else if (lost >= 0)
        obd_op_set_failed(op, OBD_E_PEER_LOST, 1,
                          "op %llu of job %s: node %d was lost: %s",
                          (unsigned long long)seq, job->name, lost, why);
    return op;
}

/* Starts the oldest op that is ready, when no op of the job is running:
 * a job's ops run one after another, in sequence order, on every node. */
void obd_op_start_next(struct obd_job *job)
{
    struct obd_daemon *d = job->d;
    for (struct obd_op *o = job->ops; o; o = o->next) {
        if (!obd_op_open(o))
            continue;
        if (o->state != OBD_OP_AGREED)
            return;
        const struct obd_algo *algo = obd_coll_algo(o->desc.kind);
        if (algo == NULL) {
            obd_op_set_failed(o, OBD_E_INVAL, 0, "op kind %u is not supported",
                              o->desc.kind);
            return;
        }
        if (algo->can_start != NULL && !algo->can_start(o))
            return;
        obd_op_enter(o, OBD_OP_RUN);
        o->start_ns = uv_hrtime();
        algo->start(o);
        if (d->hooks.ops_changed != NULL)
            d->hooks.ops_changed(d);
        return;
    }
}

/* Fails every open op of job from seq `from` on. */
void obd_op_fail_open(struct obd_job *job, uint64_t from, int status,
                      int announce, const char *reason)
{
    for (struct obd_op *op = job->ops; op; op = op->next)
        if (obd_op_open(op) && op->seq >= from)
            obd_op_set_failed(op, status, announce, "op %llu of job %s: %s",
                              (unsigned long long)op->seq, job->name, reason);
}

/* The run stops from op `from` on: ops known from there fail now, later
 * ones as they appear (obd_op_get). The earliest stop wins; failing those
 * ops stops the run again from later on, which changes nothing. A
 * failure (not a trainer leaving) is counted and logged. */
void obd_op_stop_run(struct obd_job *job, uint64_t from, int status,
                     const char *what, int failure)
{
    if (job->stopped[0] != '\0' && job->stopped_seq <= from)
        return;
    if (job->stopped[0] == '\0' && failure) {
        obd_metric_add(&job->d->metrics, OBD_M_RUNS_STOPPED, 1);
        obd_log_warn(&job->d->log, "job %s: from op %llu on: %s", job->name,
                     (unsigned long long)from, what);
    }
    snprintf(job->stopped, sizeof(job->stopped), "%s", what);
    job->stopped_seq = from;
    job->stopped_status = status;
    obd_op_fail_open(job, from, status, 1, what);
}
