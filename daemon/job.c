#include "err.h"
#include "job.h"

#include <obcomm.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "efstore.h"
#include "enforce.h"
#include "hash.h"
#include "ops.h"
#include "reduce.h"
#include "wire.h"

static void job_start_next(struct obd_job *job);
static void job_stop(struct obd_job *job, uint64_t from, int status,
                     const char *what, int failure);
static void job_run(struct obd_ready *r);
static void op_run(struct obd_ready *r);
static void op_check_ready(struct obd_op *op);
static void op_announce(struct obd_op *op);
static void op_fail(struct obd_op *op, int status, int announce,
                    const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void op_finish(struct obd_op *op);
static void op_task_begin(struct obd_op *op);
static void op_task_end(struct obd_op *op);
static void op_report(struct obd_op *op, int status, const char *message);
static struct obd_op *op_find(struct obd_job *job, uint64_t seq);

/* ---- what an algorithm gets (coll.h, op->svc) ---- */

static void svc_fail(struct obd_op *op, int status, int announce,
                     const char *message)
{
    op_fail(op, status, announce, "%s", message);
}

/* One large buffer is kept between ops: a fresh allocation of a large
 * tensor costs a page fault per 4 KiB on every op. */
static void *svc_scratch_get(struct obd_op *op, size_t bytes, size_t *cap)
{
    struct obd_daemon *d = op->job->d;
    if (d->scratch != NULL && d->scratch_bytes >= bytes) {
        void *p = d->scratch;
        *cap = d->scratch_bytes;
        d->scratch = NULL;
        return p;
    }
    *cap = bytes ? bytes : 1;
    return malloc(*cap);
}

static void svc_scratch_put(struct obd_op *op, void *p, size_t cap)
{
    struct obd_daemon *d = op->job->d;
    if (p == NULL)
        return;
    if (d->scratch == NULL || d->scratch_bytes < cap) {
        free(d->scratch);
        d->scratch = p;
        d->scratch_bytes = cap;
    } else {
        free(p);
    }
}

/* Segment buffers (a ring's received reduce-scatter segments) are kept
 * between ops too, a few of one size (daemon.h): an op takes a few,
 * and fresh ones cost a page fault per 4 KiB of every frame received into
 * them (tests/bench/results-issue22: on a 4-node ring at 10 Gbit, the
 * faults took about as much CPU as the receive copies themselves). */
static void *svc_segbuf_get(struct obd_op *op, size_t bytes)
{
    struct obd_daemon *d = op->job->d;
    if (d->nsegbufs > 0 && d->segbuf_bytes == bytes)
        return d->segbufs[--d->nsegbufs];
    obd_metric_add(&d->metrics, OBD_M_SEGBUFS_ALLOCATED, 1);
    return malloc(bytes ? bytes : 1);
}

static void svc_segbuf_put(struct obd_op *op, void *p, size_t bytes)
{
    struct obd_daemon *d = op->job->d;
    if (p == NULL)
        return;
    if (d->segbuf_bytes != bytes) {
        /* Another dtype's segments (segment_bytes is not a multiple of
         * every element size): the newest size wins. */
        while (d->nsegbufs > 0)
            free(d->segbufs[--d->nsegbufs]);
        d->segbuf_bytes = bytes;
    }
    if (d->nsegbufs == 0 ||
        (d->nsegbufs < OBD_SEGBUFS_KEPT &&
         (size_t)(d->nsegbufs + 1) * bytes <= OBD_SEGBUFS_KEPT_BYTES))
        d->segbufs[d->nsegbufs++] = p;
    else
        free(p);
}

static int op_send(struct obd_op *op, int to, uint32_t step, uint32_t segment,
                   const void *payload, uint32_t len);
static int op_all_reported(const struct obd_op *op);

static int svc_idle(const struct obd_op *op)
{
    return op->refs == 0;
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

struct obd_job *obd_job_find(struct obd_daemon *d, const char *name)
{
    for (struct obd_job *j = d->jobs; j; j = j->next)
        if (strcmp(j->name, name) == 0)
            return j;
    return NULL;
}

struct obd_job *obd_job_find_id(struct obd_daemon *d, uint32_t id)
{
    for (struct obd_job *j = d->jobs; j; j = j->next)
        if (j->id == id)
            return j;
    return NULL;
}

/* 1 if node `node`'s run `run` of job `id` ended here. */
static int run_ended(const struct obd_daemon *d, uint32_t id, int node,
                     uint64_t run)
{
    for (int i = 0; i < OBD_RUNS_ENDED; i++) {
        const struct obd_run_ended *e = &d->runs_ended[i];
        if (e->run == run && e->job == id && e->node == node)
            return 1;
    }
    return 0;
}

/* Takes the job out of the daemon's list: no trainer, announce or frame
 * finds it any more, and the other nodes' runs it saw are remembered as
 * ended. It is freed by its own turn (job_run) once it has no trainers
 * and no ops. */
static void job_detach(struct obd_job *job)
{
    struct obd_daemon *d = job->d;
    for (struct obd_job **pp = &d->jobs; *pp; pp = &(*pp)->next)
        if (*pp == job) {
            *pp = job->next;
            break;
        }
    job->next = NULL;
    job->detached = 1;
    d->njobs--;
    for (int n = 0; n < d->cfg.nodes; n++)
        if (job->seen_run[n] != 0 &&
            !run_ended(d, job->id, n, job->seen_run[n])) {
            struct obd_run_ended *e =
                &d->runs_ended[d->runs_ended_next++ % OBD_RUNS_ENDED];
            *e = (struct obd_run_ended){job->id, n, job->seen_run[n]};
        }
}

/* A new job named `name` in *out; 0, or with why: OBD_E_INVAL (a name of
 * no bytes or too many), OBD_E_EXISTS (another job's name hashes to the
 * same wire id), OBD_E_BUSY (the daemon holds max_jobs jobs), OBD_E_NOMEM. */
static int job_create(struct obd_daemon *d, const char *name,
                      struct obd_job **out, char *why, size_t whylen)
{
    if (name[0] == '\0' || strlen(name) >= OBD_JOB_NAME) {
        snprintf(why, whylen, "job name must be 1 to %d bytes",
                 OBD_JOB_NAME - 1);
        return OBD_E_INVAL;
    }
    uint32_t id = obd_frame_job_id(name);
    struct obd_job *other = obd_job_find_id(d, id);
    if (other != NULL) {
        snprintf(why, whylen, "job names '%s' and '%s' collide; rename one",
                 name, other->name);
        return OBD_E_EXISTS;
    }
    if (d->njobs >= d->cfg.max_jobs) {
        snprintf(why, whylen,
                 "node %lld holds %d jobs, max_jobs is %lld: wait for one to "
                 "end or raise max_jobs",
                 (long long)d->cfg.rank, d->njobs, (long long)d->cfg.max_jobs);
        return OBD_E_BUSY;
    }
    struct obd_job *job = calloc(1, sizeof(*job));
    uint64_t *node_run = calloc((size_t)d->cfg.nodes, sizeof(*node_run));
    uint64_t *seen_run = calloc((size_t)d->cfg.nodes, sizeof(*seen_run));
    if (job == NULL || node_run == NULL || seen_run == NULL) {
        free(job);
        free(node_run);
        free(seen_run);
        snprintf(why, whylen, "out of memory");
        return OBD_E_NOMEM;
    }
    job->node_run = node_run;
    job->seen_run = seen_run;
    job->d = d;
    strcpy(job->name, name);
    job->id = id;
    job->timeout_ms = (int)d->cfg.timeout_ms;
    job->ready.run = job_run;
    job->next = d->jobs;
    d->jobs = job;
    d->njobs++;
    *out = job;
    return 0;
}

/* max_jobs_per_uid, 0 meaning a quarter of max_jobs (at least 1). */
static int64_t jobs_per_uid(const struct obd_daemon *d)
{
    if (d->cfg.max_jobs_per_uid > 0)
        return d->cfg.max_jobs_per_uid;
    return d->cfg.max_jobs / 4 > 0 ? d->cfg.max_jobs / 4 : 1;
}

/* Whether user `uid` may own one more job here: root always may (bounded
 * by max_jobs only), others while they own fewer than max_jobs_per_uid.
 * 0, or OBD_E_BUSY with why. */
static int uid_may_own(struct obd_daemon *d, uid_t uid, char *why,
                       size_t whylen)
{
    if (uid == 0)
        return 0;
    int64_t n = 0, max = jobs_per_uid(d);
    for (const struct obd_job *j = d->jobs; j; j = j->next)
        n += j->owned && j->owner == uid;
    if (n < max)
        return 0;
    snprintf(why, whylen,
             "uid %u already holds %lld jobs on node %lld, max_jobs_per_uid "
             "is %lld: end one of them or raise max_jobs_per_uid",
             (unsigned)uid, (long long)n, (long long)d->cfg.rank,
             (long long)max);
    return OBD_E_BUSY;
}

int obd_job_join(struct obd_daemon *d, struct obd_client *c, int pid, uid_t uid,
                 const char *name, int local_rank, int local_size,
                 int timeout_ms, struct obd_job **out, char *why, size_t whylen)
{
    if (local_size < 1 || local_size > OBD_MAX_LOCAL || local_rank < 0 ||
        local_rank >= local_size) {
        snprintf(why, whylen,
                 "local rank %d of local size %d is invalid (size 1..%d)",
                 local_rank, local_size, OBD_MAX_LOCAL);
        return OBD_E_INVAL;
    }
    struct obd_owner who;
    int rc = obd_owner_of_uid((uint32_t)uid, d->cfg.owner_by_name, &who, why,
                              whylen);
    if (rc != 0)
        return rc;
    struct obd_job *job = obd_job_find(d, name);
    if (job != NULL && (!job->owned || job->owner == uid) &&
        (job->stopped[0] != '\0' || (job->joined == 0 && job->next_seq > 0))) {
        /* What is left of an earlier run of this job (ops still failing
         * out, a rank gone, trainers of a stopped run still leaving): the
         * trainer starts a new run, which must not meet the old one's ops
         * or wait for its trainers. The old job goes when they do. Only
         * its owner ends it: another user is denied below. */
        job_detach(job);
        obd_runq_post(&d->runq, &job->ready);
        job = NULL;
    }
    /* A job without an owner here (new, or made by another node's
     * announce) would become one more of this user's. */
    if ((job == NULL || !job->owned) &&
        (rc = uid_may_own(d, uid, why, whylen)) != 0)
        return rc;
    if (job == NULL && (rc = job_create(d, name, &job, why, whylen)) != 0)
        return rc;
    if (job->owned && job->owner != uid) {
        snprintf(why, whylen,
                 "job %s belongs to uid %u on node %lld; uid %u may not join "
                 "it (pick another job name)",
                 name, (unsigned)job->owner, (long long)d->cfg.rank,
                 (unsigned)uid);
        return OBD_E_DENIED;
    }

    if (job->local_size != 0 && job->local_size != local_size) {
        snprintf(why, whylen,
                 "job %s has local size %d on this node, the trainer said %d",
                 name, job->local_size, local_size);
        obd_runq_post(&d->runq, &job->ready);
        return OBD_E_MISMATCH;
    }
    if (job->trainer[local_rank] != NULL) {
        snprintf(why, whylen, "local rank %d of job %s is taken by pid %d",
                 local_rank, name, (int)job->pid[local_rank]);
        return OBD_E_BUSY;
    }
    if (job->joined == 0 && timeout_ms > 0)
        job->timeout_ms = timeout_ms;
    job->local_size = local_size;
    job->owner = uid;
    job->owned = 1;
    job->owner_id = who;
    job->trainer[local_rank] = c;
    job->pid[local_rank] = pid;
    if (job->joined++ == 0 && job->run_local == 0) {
        /* A new run begins here. */
        if (uv_random(NULL, NULL, &job->run_local, sizeof(job->run_local), 0,
                      NULL) != 0 ||
            job->run_local == 0)
            job->run_local = uv_hrtime() ^ ((uint64_t)pid << 32) ^ job->id;
    }
    *out = job;
    return 0;
}

/* Node `from`'s trainers of `job` started a new run: this node's run of
 * the job is over (docs/design.md, "A new run never waits"). The job
 * leaves the list first, so that its ops fail here alone (a detached job
 * sends nothing), then stops: its open ops and every later op of its
 * trainers still joined fail at once. A run stopped before keeps its
 * first reason. */
static void job_end_run(struct obd_job *job, int from)
{
    struct obd_daemon *d = job->d;
    char what[240];
    snprintf(what, sizeof(what),
             "node %d started a new run of job %s (its trainers restarted); "
             "this run is over: restart every trainer of the job",
             from, job->name);
    obd_log_info(&d->log,
                 "job %s: node %d started a new run; the run here "
                 "ends (%d trainers still joined)",
                 job->name, from, job->joined);
    job_detach(job);
    job_stop(job, job->next_seq, OBD_E_PEER_LOST, what, job->joined > 0);
    obd_runq_post(&d->runq, &job->ready);
}

/* The job a message of node `from` about job `name` in the sender's run
 * `run` belongs to, or NULL when none does (create == 0, or the job could
 * not be made: logged) or the message is of a run that ended here
 * (dropped). A run this node's job has not seen from that node before
 * ends the job's run here (job_end_run) and goes to a new job. run 0
 * comes from a node where no trainer joined the job: its message belongs
 * to whatever run is here. */
static struct obd_job *job_route(struct obd_daemon *d, int from,
                                 const char *name, uint64_t run, int create)
{
    struct obd_job *job = obd_job_find(d, name);
    if (job != NULL && (run == 0 || job->seen_run[from] == run))
        return job; /* the run here, as most messages are */
    if (run != 0 && run_ended(d, obd_frame_job_id(name), from, run))
        return NULL;
    if (job != NULL && run != 0 && job->seen_run[from] != 0 &&
        job->seen_run[from] != run) {
        job_end_run(job, from);
        job = NULL;
    }
    if (job == NULL) {
        char why[160];
        if (!create)
            return NULL;
        if (job_create(d, name, &job, why, sizeof(why)) != 0) {
            obd_log_warn(&d->log, "a message from node %d for job %s: %s", from,
                         name, why);
            return NULL;
        }
        obd_runq_post(&d->runq, &job->ready); /* frees a job made in vain */
    }
    if (job->seen_run[from] == 0)
        job->seen_run[from] = run;
    return job;
}

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

static void op_enter(struct obd_op *op, enum obd_op_state to)
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

static void job_advance_seq(struct obd_job *job)
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
    op_enter(op, OBD_OP_DONE);
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
    op_enter(op, OBD_OP_RETIRED);
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
    /* A later 1-bit op may wait for this one to announce (op_announce). */
    obd_runq_post(&job->d->runq, &job->ready);
    /* Advanced while the op is still linked, so that it counts as the
     * newest op the job has seen. */
    job_advance_seq(job);
    if (op->state == OBD_OP_DONE && op_retirable(op)) {
        op_unlink(op);
        obd_runq_post(&job->d->runq, &job->ready);
    }
    if (op->state == OBD_OP_RETIRED && op->refs == 0) {
        /* It may have posted itself while it ran (its finish does). */
        obd_runq_cancel(&job->d->runq, &op->ready);
        op_enter(op, OBD_OP_FREEING);
        uv_close((uv_handle_t *)&op->deadline, on_timer_closed);
    }
}

/* Starts ready ops, retires what can go and frees the job once it has
 * neither trainers nor ops. */
static void job_run(struct obd_ready *r)
{
    struct obd_job *job = container_of(r, struct obd_job, ready);
    job_advance_seq(job);
    for (struct obd_op *o = job->ops; o; o = o->next)
        op_announce(o); /* those that waited for earlier ops */
    job_start_next(job);
    if (job->joined > 0 || job->live > 0)
        return;
    if (!job->detached)
        job_detach(job);
    obd_runq_cancel(&job->d->runq, &job->ready);
    free(job->node_run);
    free(job->seen_run);
    free(job);
}

static void announce_to(struct obd_op *op, const struct obd_announce *a,
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
static void announce_to_all(struct obd_op *op, const struct obd_announce *a)
{
    announce_to(op, a, -1);
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

/* A node reports the local phase of a two-phase op done. */
static void on_report(struct obd_daemon *d, int from,
                      const Obcomm__OpAnnounce *m)
{
    struct obd_job *job = job_route(d, from, m->job, m->run, 0);
    struct obd_op *op = job ? op_find(job, m->seq) : NULL;
    if (op == NULL || !obd_op_open(op) || op->ann[from].reported)
        return;
    op->ann[from].reported = 1;
    op->ann[from].report_status = obd_err_from_public(m->status);
    snprintf(op->ann[from].report_message, sizeof(op->ann[from].report_message),
             "%s",
             m->status != 0 && m->message[0] == '\0' ? "failed" : m->message);
    obd_op_schedule(op);
}

void obd_job_on_peer_up(struct obd_daemon *d, int node)
{
    for (struct obd_job *job = d->jobs; job; job = job->next)
        for (struct obd_op *op = job->ops; op; op = op->next)
            if (op->state < OBD_OP_RUN && op->ann[d->cfg.rank].have)
                announce_to(op, &op->ann[d->cfg.rank], node);
}

static void op_fail(struct obd_op *op, int status, int announce,
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
        announce_to_all(op, &a);
    }
    op_done(op);
    job_stop(op->job, op->seq + 1, status, what, 1);
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
static void describe_missing(const struct obd_op *op, char *buf, size_t len)
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
        op_fail(op, OBD_E_TIMEOUT, 1,
                "op %llu of job %s timed out after %d ms on node %d "
                "waiting for %s",
                (unsigned long long)op->seq, job->name, job->timeout_ms,
                (int)job->d->cfg.rank, who);
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
    describe_missing(op, who, sizeof(who));
    op_fail(op, OBD_E_TIMEOUT, 1,
            "op %llu of job %s timed out after %d ms; never arrived: %s",
            (unsigned long long)op->seq, job->name, job->timeout_ms, who);
}

static struct obd_op *op_find(struct obd_job *job, uint64_t seq)
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

static struct obd_op *op_get(struct obd_job *job, uint64_t seq)
{
    struct obd_daemon *d = job->d;
    struct obd_op *op = op_find(job, seq);
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
        op_fail(op, job->stopped_status, 1, "op %llu of job %s: %s",
                (unsigned long long)seq, job->name, job->stopped);
    else if (d->closing)
        op_fail(op, OBD_E_PEER_LOST, 0,
                "op %llu of job %s: obcommd on node %d is shutting down",
                (unsigned long long)seq, job->name, (int)d->cfg.rank);
    else if (lost >= 0)
        op_fail(op, OBD_E_PEER_LOST, 1,
                "op %llu of job %s: node %d was lost: %s",
                (unsigned long long)seq, job->name, lost, why);
    return op;
}

/* ---- matching ---- */

struct field {
    const char *name;
    uint64_t (*get)(const struct obd_opdesc *);
    /* The value as a name ("allreduce_1bit", "float32"), or NULL to print
     * the number. */
    const char *(*text)(uint64_t v, char *buf, size_t len);
};

static const char *kind_text(uint64_t v, char *buf, size_t len)
{
    return obd_metrics_op_name((uint32_t)v, buf, len);
}
static const char *dtype_text(uint64_t v, char *buf, size_t len)
{
    (void)buf;
    (void)len;
    return obd_dtype_name((obcomm_dtype_t)v);
}
static const char *redop_text(uint64_t v, char *buf, size_t len)
{
    (void)buf;
    (void)len;
    return obd_op_name((obcomm_op_t)v);
}

static uint64_t f_kind(const struct obd_opdesc *o)
{
    return o->kind;
}
static uint64_t f_dtype(const struct obd_opdesc *o)
{
    return o->dtype;
}
static uint64_t f_redop(const struct obd_opdesc *o)
{
    return o->redop;
}
static uint64_t f_count(const struct obd_opdesc *o)
{
    return o->count;
}
static uint64_t f_key(const struct obd_opdesc *o)
{
    return o->key;
}
static uint64_t f_root(const struct obd_opdesc *o)
{
    return (uint64_t)(int64_t)o->root;
}

static const struct field fields[] = {
    {"op", f_kind, kind_text},
    {"dtype", f_dtype, dtype_text},
    {"reduction", f_redop, redop_text},
    {"count", f_count, NULL},
    {"key", f_key, NULL},
    {"root", f_root, NULL},
};

/* Writes "count differs: rank 0 has 10, rank 1 has 9; ..." for every field
 * in which the entries differ, op kinds, dtypes and reductions by name
 * ("op differs: rank 0 has snapshot_1bit, rank 1 has allreduce_1bit"). Returns
 * the number of differing fields. */
static int describe_mismatch(const struct obd_opdesc *const *descs,
                             const char *const *labels, int n, char *buf,
                             size_t len)
{
    size_t off = 0;
    int differ = 0;
    buf[0] = '\0';
    /* A restore's count is the bytes of the part each trainer brings (its
     * node's, or none): it may differ. */
    int restore = 1;
    for (int i = 0; i < n; i++)
        restore &= descs[i]->kind == OBCOMM_KIND_RESTORE_1BIT;
    for (size_t f = 0; f < sizeof(fields) / sizeof(fields[0]); f++) {
        if (restore && fields[f].get == f_count)
            continue;
        uint64_t first = fields[f].get(descs[0]);
        int same = 1;
        for (int i = 1; i < n; i++)
            same &= fields[f].get(descs[i]) == first;
        if (same)
            continue;
        differ++;
        if (off < len)
            off += (size_t)snprintf(buf + off, len - off,
                                    "%s%s differs:", differ > 1 ? "; " : "",
                                    fields[f].name);
        for (int i = 0; i < n && off < len; i++) {
            uint64_t v = fields[f].get(descs[i]);
            char num[32];
            if (fields[f].text != NULL)
                off += (size_t)snprintf(buf + off, len - off, "%s %s has %s",
                                        i ? "," : "", labels[i],
                                        fields[f].text(v, num, sizeof(num)));
            else if (fields[f].get == f_root)
                off += (size_t)snprintf(buf + off, len - off, "%s %s has %lld",
                                        i ? "," : "", labels[i],
                                        (long long)(int64_t)v);
            else
                off += (size_t)snprintf(buf + off, len - off, "%s %s has %llu",
                                        i ? "," : "", labels[i],
                                        (unsigned long long)v);
        }
    }
    return differ;
}

/* Fails op with a message naming every field in which the entries differ;
 * returns 1 if it did. */
static int fail_if_differ(struct obd_op *op,
                          const struct obd_opdesc *const *descs,
                          const char *const *labels, int n, int announce)
{
    char diff[400];
    if (!describe_mismatch(descs, labels, n, diff, sizeof(diff)))
        return 0;
    op_fail(op, OBD_E_MISMATCH, announce,
            "op %llu of job %s: ranks issued different ops: %s",
            (unsigned long long)op->seq, op->job->name, diff);
    return 1;
}

static void op_check_local(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    int ls = job->local_size;
    if (op->state != OBD_OP_COLLECT || ls == 0 || op->nsubmitted < ls)
        return;

    const struct obd_opdesc *descs[OBD_MAX_LOCAL];
    char names[OBD_MAX_LOCAL][24];
    const char *labels[OBD_MAX_LOCAL];
    for (int i = 0; i < ls; i++) {
        descs[i] = &op->sub[i];
        snprintf(names[i], sizeof(names[i]), "rank %d",
                 obd_job_rank(job, (int)d->cfg.rank, i));
        labels[i] = names[i];
    }
    /* Local trainers differ: only this node knows, so it announces. */
    if (fail_if_differ(op, descs, labels, ls, 1))
        return;

    op_enter(op, OBD_OP_LOCAL);
    op->desc = op->sub[0];
    op_announce(op);
}

/* 1 while an op of the job before `op` is not DONE here. */
static int earlier_open(const struct obd_op *op)
{
    for (const struct obd_op *o = op->job->ops; o && o->seq < op->seq;
         o = o->next)
        if (obd_op_open(o))
            return 1;
    return 0;
}

/* Announces this node's view of a locally agreed op. A 1-bit allreduce
 * carries the version of its key's error feedback as its op will find
 * it, so it waits until every earlier op of the job is done here (they
 * may change the key); job_run announces it then. */
static void op_announce(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    struct obd_announce *mine = &op->ann[d->cfg.rank];
    if (op->state != OBD_OP_LOCAL || mine->have)
        return;
    int onebit = op->desc.kind == OBCOMM_KIND_ALLREDUCE_1BIT;
    if (onebit && earlier_open(op))
        return;
    mine->have = 1;
    mine->local_size = (uint32_t)job->local_size;
    mine->desc = op->desc;
    mine->run = job->run_local;
    mine->owner = job->owner_id;
    if (onebit)
        mine->ef = obd_efstore_version(d, job->name, job->run, op->desc.key);
    op->nann++;
    if (d->cfg.nodes > 1)
        announce_to_all(op, mine);
    op_check_ready(op);
}

/* Every node's run of the job: the run is agreed at its first op, and a
 * node in another run later fails the op on every node. Returns 1 if it
 * did. */
static int check_run(struct obd_op *op)
{
    struct obd_job *job = op->job;
    int nodes = job->d->cfg.nodes;
    uint64_t h = OBCOMM_HASH_FNV1A_INIT;
    for (int n = 0; n < nodes; n++)
        h = obcomm_hash_fnv1a_word(h, op->ann[n].run);
    h = h != 0 ? h : 1;
    if (job->run == 0) {
        job->run = h;
        for (int n = 0; n < nodes; n++)
            job->node_run[n] = op->ann[n].run;
        return 0;
    }
    if (h == job->run)
        return 0;
    char who[256];
    size_t off = 0;
    for (int n = 0; n < nodes && off < sizeof(who); n++)
        if (op->ann[n].run != job->node_run[n])
            off += (size_t)snprintf(who + off, sizeof(who) - off, "%snode %d",
                                    off ? ", " : "", n);
    op_fail(op, OBD_E_MISMATCH, 1,
            "op %llu of job %s: %s started a new run of the job (its "
            "trainers restarted) while the other nodes go on with run "
            "%016llx; restart every trainer of the job",
            (unsigned long long)op->seq, job->name, who,
            (unsigned long long)job->run);
    return 1;
}

/* A 1-bit allreduce: every node must hold the same version of the key's
 * error feedback before any pass begins. If they differ, every node
 * (all see the same announces) resets the job's error feedback and the
 * op fails on every rank naming the versions; the run stops with it.
 * Returns 1 if it did. */
static int check_ef(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    int nodes = d->cfg.nodes;
    if (op->desc.kind != OBCOMM_KIND_ALLREDUCE_1BIT)
        return 0;
    int same = 1;
    for (int n = 1; n < nodes; n++)
        same &= obd_efversion_equal(&op->ann[n].ef, &op->ann[0].ef);
    if (same)
        return 0;
    char msg[400];
    size_t off = 0;
    for (int n = 0; n < nodes && off < sizeof(msg); n++) {
        const struct obd_efversion *v = &op->ann[n].ef;
        if (v->origin != 0)
            off += (size_t)snprintf(
                msg + off, sizeof(msg) - off,
                "%snode %d has snapshot %016llx + %llu steps (last op %llu)",
                n ? ", " : "", n, (unsigned long long)v->origin,
                (unsigned long long)v->applied,
                (unsigned long long)v->last_seq);
        else
            off += (size_t)snprintf(msg + off, sizeof(msg) - off,
                                    "%snode %d has zero + %llu steps (last "
                                    "op %llu)",
                                    n ? ", " : "", n,
                                    (unsigned long long)v->applied,
                                    (unsigned long long)v->last_seq);
    }
    obd_metric_add(&d->metrics, OBD_M_EF_DISAGREED, 1);
    obd_efstore_reset_run(d, job->name, job->run, msg);
    op_fail(op, OBD_E_STATE, 1,
            "op %llu of job %s: the nodes hold different versions of the "
            "error feedback of key %llu: %s; every node resets the job's "
            "error feedback",
            (unsigned long long)op->seq, job->name,
            (unsigned long long)op->desc.key, msg);
    return 1;
}

/* A job has one owner across the mesh: trainers of different users on
 * different nodes fail the op on every rank, naming every node's owner.
 * Returns 1 if it did. */
static int check_owner(struct obd_op *op)
{
    struct obd_job *job = op->job;
    int nodes = job->d->cfg.nodes;
    const struct obd_owner *owners[OBD_MAX_NODES] = {0};
    for (int n = 0; n < nodes; n++)
        owners[n] = &op->ann[n].owner;
    char who[320];
    if (obd_owner_agree(owners, nodes, who, sizeof(who)))
        return 0;
    op_fail(op, OBD_E_DENIED, 0,
            "op %llu of job %s: the job's trainers belong to different "
            "users: %s; a job has one owner on every node (pick another "
            "job name)",
            (unsigned long long)op->seq, job->name, who);
    return 1;
}

/* Every node's announce is in: all nodes compare the same set, so all reach
 * the same verdict without another round. */
static void op_check_ready(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    int nodes = d->cfg.nodes;
    if (op->state != OBD_OP_LOCAL || op->nann < nodes)
        return;
    if (check_owner(op))
        return;

    for (int n = 0; n < nodes; n++)
        if (op->ann[n].local_size != (uint32_t)job->local_size) {
            char msg[256];
            size_t off = 0;
            for (int m = 0; m < nodes && off < sizeof(msg); m++)
                off += (size_t)snprintf(msg + off, sizeof(msg) - off,
                                        "%snode %d has %u", m ? ", " : "", m,
                                        op->ann[m].local_size);
            op_fail(op, OBD_E_MISMATCH, 1,
                    "job %s: nodes run different numbers of trainers: %s",
                    job->name, msg);
            return;
        }

    const struct obd_opdesc *descs[OBD_MAX_NODES];
    char names[OBD_MAX_NODES][40];
    const char *labels[OBD_MAX_NODES];
    int ls = job->local_size;
    for (int n = 0; n < nodes; n++) {
        descs[n] = &op->ann[n].desc;
        if (ls > 1)
            snprintf(names[n], sizeof(names[n]), "ranks %d-%d (node %d)",
                     n * ls, n * ls + ls - 1, n);
        else
            snprintf(names[n], sizeof(names[n]), "rank %d (node %d)", n, n);
        labels[n] = names[n];
    }
    /* Every node sees the same announces and fails by itself; the failure
     * is announced all the same, so that a node that was sent another
     * view (a damaged or forged announce) fails at once too. */
    if (fail_if_differ(op, descs, labels, nodes, 1) || check_run(op) ||
        check_ef(op))
        return;
    op->fingerprint = obd_coll_fingerprint(&op->desc);
    op_enter(op, OBD_OP_AGREED);
    obd_runq_post(&d->runq, &job->ready);
}

/* Starts the oldest op that is ready, when no op of the job is running:
 * a job's ops run one after another, in sequence order, on every node. */
static void job_start_next(struct obd_job *job)
{
    struct obd_daemon *d = job->d;
    for (struct obd_op *o = job->ops; o; o = o->next) {
        if (!obd_op_open(o))
            continue;
        if (o->state != OBD_OP_AGREED)
            return;
        const struct obd_algo *algo = obd_coll_algo(o->desc.kind);
        if (algo == NULL) {
            op_fail(o, OBD_E_INVAL, 0, "op kind %u is not supported",
                    o->desc.kind);
            return;
        }
        if (algo->can_start != NULL && !algo->can_start(o))
            return;
        op_enter(o, OBD_OP_RUN);
        o->start_ns = uv_hrtime();
        algo->start(o);
        if (d->hooks.ops_changed != NULL)
            d->hooks.ops_changed(d);
        return;
    }
}

int obd_job_submit(struct obd_job *job, int local_rank, uint64_t seq,
                   const struct obd_opdesc *desc, struct obd_shm *buf,
                   void *data, struct obd_shm *outbuf, void *out, int status,
                   char *why, size_t whylen)
{
    struct obd_op *op = op_get(job, seq);
    if (op == NULL && job->stopped[0] != '\0' && seq >= job->stopped_seq) {
        /* The stopped run's ops that other nodes announced may all be over
         * here before this trainer comes to them: it gets the same answer
         * as if it had been in time. */
        snprintf(why, whylen, "op %llu of job %s: %s", (unsigned long long)seq,
                 job->name, job->stopped);
        return job->stopped_status;
    }
    if (op == NULL) {
        snprintf(why, whylen,
                 "op %llu is outside the job's window (next op is %llu)",
                 (unsigned long long)seq, (unsigned long long)job->next_seq);
        return OBD_E_PROTO;
    }
    if (op->submitted[local_rank]) {
        snprintf(why, whylen, "op submitted twice");
        return OBD_E_PROTO;
    }
    op->submitted[local_rank] = 1;
    op->nsubmitted++;
    if (op->nsubmitted == 1 && op->state == OBD_OP_COLLECT) {
        /* The deadline counts from this node's first trainer: the op may
         * have been created earlier by another node's announce, before the
         * job's trainers (and their timeout) were known here. */
        uv_timer_start(&op->deadline, on_deadline, (uint64_t)job->timeout_ms,
                       0);
    }
    op->sub[local_rank] = *desc;
    op->data[local_rank] = data;
    if (buf != NULL) {
        obd_shm_ref(buf);
        op->buf[local_rank] = buf;
    }
    op->out[local_rank] = out;
    if (outbuf != NULL) {
        obd_shm_ref(outbuf);
        op->outbuf[local_rank] = outbuf;
    }

    if (!obd_op_open(op)) {
        /* The op failed before this trainer arrived: it gets the same
         * answer as everybody else, from the ready queue. */
        obd_op_schedule(op);
        return 0;
    }
    if (status != 0) {
        op_fail(op, status, 1, "op %llu of job %s: %s", (unsigned long long)seq,
                job->name, why);
        return 0;
    }
    op_check_local(op);
    return 0;
}

static void on_announce(struct obd_daemon *d, int from,
                        const Obcomm__OpAnnounce *m)
{
    struct obd_announce a = {
        .have = 1,
        .status = obd_err_from_public(m->status),
        .local_size = m->local_size,
        .desc = {.kind = m->kind,
                 .dtype = m->dtype,
                 .redop = m->redop,
                 .count = m->count,
                 .key = m->key,
                 .root = m->root},
    };
    if (m->phase == 1) {
        on_report(d, from, m);
        return;
    }
    a.run = m->run;
    a.owner.uid = m->owner_uid;
    a.owner.by_name = m->owner_by_name;
    /* A name too long to hold stays empty: it equals nobody's. */
    if (strlen(m->owner_name) < sizeof(a.owner.name))
        strcpy(a.owner.name, m->owner_name);
    if (m->ef != NULL)
        a.ef = (struct obd_efversion){m->ef->origin, m->ef->applied,
                                      m->ef->last_seq};
    snprintf(a.message, sizeof(a.message), "%s", m->message);
    if (a.status != 0 && a.message[0] == '\0')
        snprintf(a.message, sizeof(a.message), "node %d failed the op", from);

    /* A failure of an op nobody here waits for makes no job. */
    struct obd_job *job = job_route(d, from, m->job, a.run, a.status == 0);
    if (job == NULL)
        return;
    if (job->joined == 0 && a.status == 0 && m->seq < job->next_seq) {
        /* An op this job is past, from a node with no reason to send it
         * again: that node runs a new run of the job while this node still
         * winds up an earlier one, which must not swallow the new run's
         * announces. That node's run is the new one. */
        job->seen_run[from] = 0;
        job_detach(job);
        obd_runq_post(&d->runq, &job->ready);
        job = job_route(d, from, m->job, a.run, 1);
        if (job == NULL)
            return;
    }
    struct obd_op *op = op_get(job, m->seq);
    obd_runq_post(&d->runq, &job->ready); /* frees a job made in vain */
    if (op != NULL && a.status != 0 && m->agreed)
        op->failed_agreed = 1; /* also when it failed here before */
    if ((op == NULL || !obd_op_open(op)) && a.status != 0 &&
        m->seq < job->next_seq)
        obd_coll_efstate_failed_elsewhere(d, job->name, job->run, m->seq);
    if (op == NULL || !obd_op_open(op))
        return;
    if (a.status != 0) {
        if (!op->ann[from].reported)
            op->ann[from].failed = 1;
        /* Echoed to every node: one that announced this op before it
         * heard of the failure may have reached a node whose trainers had
         * already gone, and created the op there; the echo, behind that
         * announce on the same link, ends it instead of its deadline
         * (where a restarted job of the same name would meet it). */
        op_fail(op, a.status, 1, "%s", a.message);
        return;
    }
    if (op->ann[from].have)
        return;
    a.reported = op->ann[from].reported;
    op->ann[from] = a;
    op->nann++;
    op_check_ready(op);
}

/* Fails every open op of job from seq `from` on. */
static void fail_open(struct obd_job *job, uint64_t from, int status,
                      int announce, const char *reason)
{
    for (struct obd_op *op = job->ops; op; op = op->next)
        if (obd_op_open(op) && op->seq >= from)
            op_fail(op, status, announce, "op %llu of job %s: %s",
                    (unsigned long long)op->seq, job->name, reason);
}

/* The run stops from op `from` on: ops known from there fail now, later
 * ones as they appear (op_get). The earliest stop wins; failing those
 * ops stops the run again from later on, which changes nothing. A
 * failure (not a trainer leaving) is counted and logged. */
static void job_stop(struct obd_job *job, uint64_t from, int status,
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
    fail_open(job, from, status, 1, what);
}

/* Another node's trainer of the job left: its ops from `from_seq` on can
 * never complete, here either. */
static void on_job_left(struct obd_daemon *d, int from,
                        const Obcomm__JobLeft *m)
{
    struct obd_job *job = job_route(d, from, m->job, m->run, 0);
    if (job == NULL)
        return;
    obd_log_info(&d->log, "job %s: node %d reports: %s", job->name, from,
                 m->message);
    /* Failures are announced, so that a node that learnt of the op only
     * from us (no trainer of the job there any more) drops it too. */
    job_stop(job, m->from_seq, OBD_E_PEER_LOST, m->message, 0);
}

void obd_job_on_peer_msg(struct obd_daemon *d, int from,
                         const Obcomm__PeerMsg *m)
{
    switch (m->body_case) {
    case OBCOMM__PEER_MSG__BODY_ANNOUNCE:
        on_announce(d, from, m->announce);
        break;
    case OBCOMM__PEER_MSG__BODY_JOB_LEFT:
        on_job_left(d, from, m->job_left);
        break;
    default:
        break;
    }
}

/* Tells every other node that a rank of the job left: they fail the job's
 * ops from `from_seq` on at once instead of waiting for our announce. Ops
 * before it completed or failed here already, so the others finish them
 * as they would have. */
static void tell_left(struct obd_job *job, uint64_t from_seq,
                      const char *message)
{
    struct obd_daemon *d = job->d;
    Obcomm__JobLeft jl = OBCOMM__JOB_LEFT__INIT;
    Obcomm__PeerMsg msg = OBCOMM__PEER_MSG__INIT;
    if (job->detached)
        return;
    jl.job = job->name;
    jl.from_seq = from_seq;
    jl.message = (char *)message;
    jl.run = job->run_local;
    msg.body_case = OBCOMM__PEER_MSG__BODY_JOB_LEFT;
    msg.job_left = &jl;
    for (int i = 0; i < d->cfg.nodes; i++)
        if (i != d->cfg.rank)
            (void)d->hooks.send_ctrl(d, i, &msg);
}

void obd_job_leave(struct obd_job *job, int local_rank, const char *reason)
{
    struct obd_daemon *d = job->d;
    int rank = obd_job_rank(job, (int)d->cfg.rank, local_rank);
    char gone[256];
    snprintf(gone, sizeof(gone), "rank %d (node %d local %d) left the job: %s",
             rank, (int)d->cfg.rank, local_rank, reason);
    job->trainer[local_rank] = NULL;
    if (--job->joined == 0)
        obd_efstore_run_end(d, job->name, job->run);
    obd_log_info(&d->log, "job %s: rank %d (local %d) left: %s", job->name,
                 rank, local_rank, reason);

    /* The first op this trainer has no answer for: ops before it are over
     * here, ops from it on can never complete. */
    uint64_t from = job->next_seq;
    for (struct obd_op *op = job->ops; op; op = op->next)
        if (obd_op_open(op) || !op->answered[local_rank]) {
            from = op->seq < from ? op->seq : from;
            break;
        }
    for (struct obd_op *op = job->ops; op; op = op->next)
        if (obd_op_open(op))
            op_fail(op, OBD_E_PEER_LOST, 1,
                    "op %llu of job %s: rank %d (node %d local %d) "
                    "left the job: %s",
                    (unsigned long long)op->seq, job->name, rank,
                    (int)d->cfg.rank, local_rank, reason);
    if (job->joined > 0)
        job_stop(job, from, OBD_E_PEER_LOST, gone, 0);
    if (d->cfg.nodes > 1 && !d->closing)
        tell_left(job, from, gone);
    /* Failed ops that waited only for this trainer may retire now. */
    for (struct obd_op *op = job->ops; op; op = op->next)
        obd_op_schedule(op);
    obd_runq_post(&d->runq, &job->ready);
}

void obd_job_fail_all(struct obd_daemon *d, const char *reason)
{
    for (struct obd_job *job = d->jobs; job; job = job->next)
        fail_open(job, 0, OBD_E_PEER_LOST, 1, reason);
}

/* Fails the open ops that still need the node: a running op that has
 * everything it needs from it (its last frames arrived before the link
 * closed, as when a node shuts down right after the op) finishes. */
void obd_job_on_peer_lost(struct obd_daemon *d, int node, const char *why)
{
    char reason[320];
    snprintf(reason, sizeof(reason), "node %d was lost: %s", node, why);
    for (struct obd_job *job = d->jobs; job; job = job->next)
        for (struct obd_op *op = job->ops; op; op = op->next) {
            if (!obd_op_open(op))
                continue;
            const struct obd_algo *algo = obd_coll_algo(op->desc.kind);
            if (op->state == OBD_OP_RUN && op->coll != NULL && algo &&
                algo->needs_node && !algo->needs_node(op, node))
                continue;
            op_fail(op, OBD_E_PEER_LOST, 1, "op %llu of job %s: %s",
                    (unsigned long long)op->seq, job->name, reason);
        }
}

void obd_job_shutdown(struct obd_daemon *d)
{
    char reason[96];
    snprintf(reason, sizeof(reason), "obcommd on node %d is shutting down",
             (int)d->cfg.rank);
    for (struct obd_job *job = d->jobs; job; job = job->next)
        for (struct obd_op *op = job->ops; op; op = op->next)
            if (op->state < OBD_OP_RUN)
                op_fail(op, OBD_E_PEER_LOST, 1, "op %llu of job %s: %s",
                        (unsigned long long)op->seq, job->name, reason);
}

int obd_job_busy(const struct obd_daemon *d)
{
    int busy = d->pool_tasks;
    for (const struct obd_job *job = d->jobs; job; job = job->next)
        for (const struct obd_op *op = job->ops; op; op = op->next)
            busy += obd_op_open(op);
    return busy;
}

struct obd_op *obd_job_op(struct obd_daemon *d, uint32_t job_id, uint64_t seq)
{
    struct obd_job *job = obd_job_find_id(d, job_id);
    return job ? op_find(job, seq) : NULL;
}

/* ---- data frames from the mesh ---- */

enum obd_data_dest obd_job_data_begin(struct obd_daemon *d, int from,
                                      const struct obd_frame *f, void **dst,
                                      void **token)
{
    struct obd_op *op = obd_job_op(d, f->job, f->seq);
    if (op == NULL)
        return OBD_DATA_DISCARD;
    if (op->state == OBD_OP_COLLECT)
        /* The sender runs an op this node never announced: it holds an
         * announce of ours that this op never made, so its data belongs to
         * an earlier incarnation of the job (dropped here, the op re-created
         * by the sender's late announce). Parking would stop this link, and
         * every other job's frames behind it, until the op's deadline. */
        return OBD_DATA_DISCARD;
    if (op->state < OBD_OP_RUN)
        /* The sender has every announce, this node not yet: the op starts
         * here soon (or fails on its deadline). Until then the link stops
         * reading, which pushes back on the sender through TCP. */
        return OBD_DATA_PARK;
    if (op->state != OBD_OP_RUN)
        return OBD_DATA_DISCARD;
    if (op->fingerprint != f->fingerprint) {
        /* The sender runs another op under this (job, seq): the op can
         * never complete, and every node hears so now. */
        obd_metric_add(&d->metrics, OBD_M_FRAMES_REJECTED, 1);
        op_fail(op, OBD_E_PROTO, 1,
                "op %llu of job %s: node %d sent a frame with fingerprint "
                "%016llx; the op agreed here has %016llx",
                (unsigned long long)op->seq, op->job->name, from,
                (unsigned long long)f->fingerprint,
                (unsigned long long)op->fingerprint);
        return OBD_DATA_DISCARD;
    }
    const char *why = "unexpected frame";
    void *p = obd_coll_algo(op->desc.kind)->recv_dest(op, from, f, &why);
    if (p == NULL) {
        obd_metric_add(&d->metrics, OBD_M_FRAMES_REJECTED, 1);
        op_fail(op, OBD_E_PROTO, 1,
                "op %llu of job %s: node %d sent step %u segment %u of "
                "%u bytes: %s",
                (unsigned long long)op->seq, op->job->name, from, f->step,
                f->segment, f->len, why);
        return OBD_DATA_DISCARD;
    }
    op->refs++;
    *dst = p;
    *token = op;
    return OBD_DATA_INTO;
}

int obd_job_data_live(void *token)
{
    const struct obd_op *op = token;
    return op->state == OBD_OP_RUN;
}

void obd_job_data_end(void *token, int from, const struct obd_frame *f,
                      int complete)
{
    struct obd_op *op = token;
    if (complete && op->state == OBD_OP_RUN)
        obd_coll_algo(op->desc.kind)->recv_done(op, from, f);
    op->refs--;
    obd_op_schedule(op);
}

/* ops: for obcommctl's `ops`, who an open op waits for, in the words of
 * its timeout message. */
void obd_job_op_waiting(const struct obd_op *op, char *buf, size_t len)
{
    if (op->state == OBD_OP_RUN && op->coll != NULL)
        obd_coll_algo(op->desc.kind)->waiting_on(op, buf, len);
    else
        describe_missing(op, buf, len);
}
