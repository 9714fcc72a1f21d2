#include "job.h"

#include <obcomm.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "ctl.h"
#include "ops.h"
#include "peers.h"
#include "wire.h"

static void job_kick(struct obd_job *job);
static void job_start_next(struct obd_job *job);
static void job_maybe_free(struct obd_job *job);
static void op_check_ready(struct obd_op *op);

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

static struct obd_job *job_create(struct obd_daemon *d, const char *name,
                                  char *why, size_t whylen)
{
    if (name[0] == '\0' || strlen(name) >= OBD_JOB_NAME) {
        snprintf(why, whylen, "job name must be 1 to %d bytes",
                 OBD_JOB_NAME - 1);
        return NULL;
    }
    uint32_t id = obd_frame_job_id(name);
    struct obd_job *other = obd_job_find_id(d, id);
    if (other != NULL) {
        snprintf(why, whylen, "job names '%s' and '%s' collide; rename one",
                 name, other->name);
        return NULL;
    }
    if (d->njobs >= d->cfg.max_jobs) {
        snprintf(why, whylen, "max_jobs (%lld) reached",
                 (long long)d->cfg.max_jobs);
        return NULL;
    }
    struct obd_job *job = calloc(1, sizeof(*job));
    if (job == NULL) {
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    job->d = d;
    strcpy(job->name, name);
    job->id = id;
    job->timeout_ms = (int)d->cfg.timeout_ms;
    job->next = d->jobs;
    d->jobs = job;
    d->njobs++;
    return job;
}

int obd_job_join(struct obd_daemon *d, struct obd_client *c, const char *name,
                 int local_rank, int local_size, int timeout_ms,
                 struct obd_job **out, char *why, size_t whylen)
{
    if (local_size < 1 || local_size > OBD_MAX_LOCAL || local_rank < 0 ||
        local_rank >= local_size) {
        snprintf(why, whylen,
                 "local rank %d of local size %d is invalid (size 1..%d)",
                 local_rank, local_size, OBD_MAX_LOCAL);
        return OBCOMM_E_INVAL;
    }
    struct obd_job *job = obd_job_find(d, name);
    if (job == NULL && (job = job_create(d, name, why, whylen)) == NULL)
        return OBCOMM_E_NOMEM;

    if (job->local_size != 0 && job->local_size != local_size) {
        snprintf(why, whylen,
                 "job %s has local size %d on this node, the trainer said %d",
                 name, job->local_size, local_size);
        job_maybe_free(job);
        return OBCOMM_E_MISMATCH;
    }
    if (job->trainer[local_rank] != NULL) {
        snprintf(why, whylen, "local rank %d of job %s is taken by pid %d",
                 local_rank, name, (int)job->trainer[local_rank]->pid);
        return OBCOMM_E_BUSY;
    }
    if (job->joined == 0 && timeout_ms > 0)
        job->timeout_ms = timeout_ms;
    job->local_size = local_size;
    job->trainer[local_rank] = c;
    job->joined++;
    *out = job;
    return 0;
}

/* ---- ops ---- */

static void op_maybe_free(struct obd_op *op)
{
    if (op->refs > 0 || op->timer_live || op->state != OBD_OP_DONE ||
        op->job != NULL)
        return;
    if (op->coll != NULL)
        obd_coll_algo(op->desc.kind)->free(op);
    free(op->ann);
    free(op);
}

static void on_timer_closed(uv_handle_t *h)
{
    struct obd_op *op = container_of(h, struct obd_op, deadline);
    op->timer_live = 0;
    op_maybe_free(op);
}

void obd_op_unref(struct obd_op *op)
{
    op->refs--;
    if (op->state == OBD_OP_DONE)
        op_maybe_free(op);
    else if (op->state == OBD_OP_RUN && op->coll != NULL)
        obd_coll_algo(op->desc.kind)->progress(op);
}

/* Unlinks the op from its job once every local trainer has its answer. A
 * trainer that has not submitted yet still gets the op's result when it
 * does, so a failed op lingers until then. */
static void op_retire(struct obd_op *op)
{
    struct obd_job *job = op->job;
    for (int i = 0; i < job->local_size; i++)
        if (job->trainer[i] != NULL && !op->submitted[i])
            return;

    for (struct obd_op **pp = &job->ops; *pp; pp = &(*pp)->next)
        if (*pp == op) {
            *pp = op->next;
            break;
        }
    op->job = NULL;
    if (op->timer_live)
        uv_close((uv_handle_t *)&op->deadline, on_timer_closed);
    op_maybe_free(op);
}

static void job_advance_seq(struct obd_job *job)
{
    uint64_t next = UINT64_MAX;
    for (struct obd_op *o = job->ops; o; o = o->next)
        if (o->state != OBD_OP_DONE && o->seq < next)
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

static void op_complete(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    if (op->state == OBD_OP_DONE)
        return;
    op->state = OBD_OP_DONE;
    uv_timer_stop(&op->deadline);

    uint64_t us = (uv_hrtime() - op->created_ns) / 1000;
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
    if (op->status == 0) /* ops: latency histograms */
        obd_metrics_observe(&d->metrics, op->desc.kind, op->desc.dtype,
                            op->desc.count, us);

    for (int i = 0; i < job->local_size; i++)
        if (op->submitted[i] && job->trainer[i] != NULL)
            obd_ctl_complete(job->trainer[i], op->seq, op->status, op->message);

    job_advance_seq(job);
    op_retire(op);
    job_kick(job);
    job_maybe_free(job);
}

void obd_op_finish(struct obd_op *op)
{
    op->status = 0;
    op->message[0] = '\0';
    op_complete(op);
}

static void announce_to(struct obd_op *op, const struct obd_announce *a,
                        int only)
{
    struct obd_daemon *d = op->job->d;
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
    an.status = a->status;
    an.message = (char *)a->message;
    msg.body_case = OBCOMM__PEER_MSG__BODY_ANNOUNCE;
    msg.announce = &an;
    for (int i = 0; i < d->cfg.nodes; i++)
        if (i != d->cfg.rank && (only < 0 || i == only))
            (void)obd_peers_send_ctrl(d, i, &msg.base);
}

/* Announces to every node whose link is up; a link that comes up later
 * gets the announces of open ops then (obd_job_on_peer_up). */
static void announce_to_all(struct obd_op *op, const struct obd_announce *a)
{
    announce_to(op, a, -1);
}

void obd_job_on_peer_up(struct obd_daemon *d, int node)
{
    for (struct obd_job *job = d->jobs; job; job = job->next)
        for (struct obd_op *op = job->ops; op; op = op->next)
            if (op->state == OBD_OP_COLLECT && op->local_done)
                announce_to(op, &op->ann[d->cfg.rank], node);
}

void obd_op_fail(struct obd_op *op, int status, int announce, const char *fmt,
                 ...)
{
    if (op->state == OBD_OP_DONE)
        return;
    struct obd_daemon *d = op->job->d;

    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->message, sizeof(op->message), fmt, ap);
    va_end(ap);
    op->status = status;
    if (status == OBCOMM_E_TIMEOUT)
        obd_metric_add(&d->metrics, OBD_M_OPS_TIMEOUT, 1);
    if (status == OBCOMM_E_MISMATCH)
        obd_metric_add(&d->metrics, OBD_M_OPS_MISMATCH, 1);
    obd_log_warn(&d->log, "job %s op %llu failed: %s", op->job->name,
                 (unsigned long long)op->seq, op->message);

    if (announce && d->cfg.nodes > 1) {
        struct obd_announce a = {.have = 1, .status = status};
        snprintf(a.message, sizeof(a.message), "%s", op->message);
        announce_to_all(op, &a);
    }
    op_complete(op);
}

/* Lists the global ranks of the job that have not submitted or announced:
 * "ranks 2, 3 (node 1)". */
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
            if (ls > 0)
                off += (size_t)snprintf(
                    buf + off, len - off, "%snode %d (ranks %d-%d)",
                    off ? ", " : "", n, n * ls, n * ls + ls - 1);
            else
                off += (size_t)snprintf(buf + off, len - off, "%snode %d",
                                        off ? ", " : "", n);
        }
    }
}

static void on_deadline(uv_timer_t *t)
{
    struct obd_op *op = container_of(t, struct obd_op, deadline);
    struct obd_job *job = op->job;
    char who[320];
    if (job == NULL || op->state == OBD_OP_DONE)
        return;

    if (op->state == OBD_OP_RUN && op->coll != NULL) {
        obd_coll_algo(op->desc.kind)->waiting_on(op, who, sizeof(who));
        obd_op_fail(op, OBCOMM_E_TIMEOUT, 1,
                    "op %llu of job %s timed out after %d ms on node %d "
                    "waiting for %s",
                    (unsigned long long)op->seq, job->name, job->timeout_ms,
                    (int)job->d->cfg.rank, who);
        return;
    }
    if (op->local_done && !op->grace) {
        /* Every local trainer is here: the missing ranks are on other
         * nodes, and the node that misses a trainer can name it. Give its
         * report a moment to arrive before failing with a coarser one. */
        uint64_t grace = (uint64_t)job->timeout_ms / 4;
        grace = grace < 50 ? 50 : grace > 2000 ? 2000 : grace;
        op->grace = 1;
        uv_timer_start(&op->deadline, on_deadline, grace, 0);
        return;
    }
    describe_missing(op, who, sizeof(who));
    obd_op_fail(op, OBCOMM_E_TIMEOUT, 1,
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

static struct obd_op *first_open(struct obd_job *job)
{
    for (struct obd_op *o = job->ops; o; o = o->next)
        if (o->state != OBD_OP_DONE)
            return o;
    return NULL;
}

/* Retires every done op whose trainers all have their answer. */
static void retire_done(struct obd_job *job)
{
    /* op_retire may unlink the op but never frees it here (its timer
     * closes asynchronously), so its successor stays valid. */
    struct obd_op *next;
    for (struct obd_op *o = job->ops; o; o = next) {
        next = o->next;
        if (o->state == OBD_OP_DONE)
            op_retire(o);
    }
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
    op->created_ns = uv_hrtime();
    uv_timer_init(&d->loop, &op->deadline);
    op->timer_live = 1;
    uv_timer_start(&op->deadline, on_deadline, (uint64_t)job->timeout_ms, 0);

    struct obd_op **pp = &job->ops;
    while (*pp && (*pp)->seq < seq)
        pp = &(*pp)->next;
    op->next = *pp;
    *pp = op;

    /* Once a trainer has left, the job cannot complete a collective
     * again: every later op fails at once instead of on its deadline. */
    if (job->gone[0] != '\0')
        obd_op_fail(op, OBCOMM_E_PEER_LOST, 1, "op %llu of job %s: %s",
                    (unsigned long long)seq, job->name, job->gone);
    return op;
}

/* ---- matching ---- */

struct field {
    const char *name;
    uint64_t (*get)(const struct obd_opdesc *);
};

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
    {"op", f_kind},     {"dtype", f_dtype}, {"reduction", f_redop},
    {"count", f_count}, {"key", f_key},     {"root", f_root},
};

/* Writes "count: rank 0 has 10, rank 1 has 9; ..." for every field in which
 * the entries differ. Returns the number of differing fields. */
static int describe_mismatch(const struct obd_opdesc *const *descs,
                             const char *const *labels, int n, char *buf,
                             size_t len)
{
    size_t off = 0;
    int differ = 0;
    buf[0] = '\0';
    for (size_t f = 0; f < sizeof(fields) / sizeof(fields[0]); f++) {
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
            if (fields[f].get == f_root)
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
    obd_op_fail(op, OBCOMM_E_MISMATCH, announce,
                "op %llu of job %s: ranks issued different ops: %s",
                (unsigned long long)op->seq, op->job->name, diff);
    return 1;
}

static void op_check_local(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    int ls = job->local_size;
    if (op->local_done || op->state != OBD_OP_COLLECT || ls == 0 ||
        op->nsubmitted < ls)
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

    op->local_done = 1;
    op->desc = op->sub[0];
    struct obd_announce *mine = &op->ann[d->cfg.rank];
    mine->have = 1;
    mine->local_size = (uint32_t)ls;
    mine->desc = op->desc;
    op->nann++;
    if (d->cfg.nodes > 1)
        announce_to_all(op, mine);
    op_check_ready(op);
}

/* Every node's announce is in: all nodes compare the same set, so all reach
 * the same verdict without another round. */
static void op_check_ready(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    int nodes = d->cfg.nodes;
    if (op->state != OBD_OP_COLLECT || !op->local_done || op->nann < nodes)
        return;

    for (int n = 0; n < nodes; n++)
        if (op->ann[n].local_size != (uint32_t)job->local_size) {
            char msg[256];
            size_t off = 0;
            for (int m = 0; m < nodes && off < sizeof(msg); m++)
                off += (size_t)snprintf(msg + off, sizeof(msg) - off,
                                        "%snode %d has %u", m ? ", " : "", m,
                                        op->ann[m].local_size);
            obd_op_fail(op, OBCOMM_E_MISMATCH, 0,
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
    /* Every node sees the same announces and fails by itself. */
    if (fail_if_differ(op, descs, labels, nodes, 0))
        return;
    op->fingerprint = obd_coll_fingerprint(&op->desc);
    op->agreed = 1;
    job_kick(job);
}

/* Starts the oldest op that is ready, when no op of the job is running:
 * a job's ops run one after another, in sequence order, on every node. */
static void job_kick(struct obd_job *job)
{
    job_start_next(job);
    obd_peers_resume(job->d);
}

static void job_start_next(struct obd_job *job)
{
    for (struct obd_op *o = job->ops; o; o = o->next) {
        if (o->state == OBD_OP_DONE)
            continue;
        if (o->state == OBD_OP_RUN)
            return;
        if (!o->agreed)
            return;
        const struct obd_algo *algo = obd_coll_algo(o->desc.kind);
        if (algo == NULL) {
            obd_op_fail(o, OBCOMM_E_INVAL, 0, "op kind %u is not supported",
                        o->desc.kind);
            return;
        }
        if (algo->can_start != NULL && !algo->can_start(o))
            return;
        o->state = OBD_OP_RUN;
        algo->start(o);
        return;
    }
}

void obd_job_submit(struct obd_job *job, int local_rank, uint64_t seq,
                    const struct obd_opdesc *desc, void *data, int status,
                    const char *why)
{
    struct obd_client *c = job->trainer[local_rank];
    struct obd_op *op = op_get(job, seq);
    if (op == NULL) {
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "op %llu is outside the job's window (next op is %llu)",
                 (unsigned long long)seq, (unsigned long long)job->next_seq);
        obd_ctl_complete(c, seq, OBCOMM_E_PROTO, msg);
        return;
    }
    if (op->submitted[local_rank]) {
        obd_ctl_complete(c, seq, OBCOMM_E_PROTO, "op submitted twice");
        return;
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

    if (op->state == OBD_OP_DONE) {
        /* The op failed before this trainer arrived: it gets the same
         * answer as everybody else. */
        obd_ctl_complete(c, seq, op->status, op->message);
        op_retire(op);
        job_maybe_free(job);
        return;
    }
    if (status != 0) {
        obd_op_fail(op, status, 1, "op %llu of job %s: %s",
                    (unsigned long long)seq, job->name, why);
        return;
    }
    op_check_local(op);
}

void obd_job_on_announce(struct obd_daemon *d, int from,
                         const struct obd_announce *a, const char *name,
                         uint64_t seq)
{
    char why[160];
    struct obd_job *job = obd_job_find(d, name);
    if (job == NULL) {
        if (a->status != 0)
            return; /* a failure of an op nobody here waits for */
        job = job_create(d, name, why, sizeof(why));
        if (job == NULL) {
            obd_log_warn(&d->log, "announce from node %d for job %s: %s", from,
                         name, why);
            return;
        }
    }
    struct obd_op *op = op_get(job, seq);
    if (op == NULL || op->state == OBD_OP_DONE) {
        job_maybe_free(job);
        return;
    }
    if (a->status != 0) {
        obd_op_fail(op, a->status, 0, "%s", a->message);
        return;
    }
    if (op->ann[from].have)
        return;
    op->ann[from] = *a;
    op->nann++;
    op_check_ready(op);
}

void obd_job_leave(struct obd_job *job, int local_rank, const char *reason)
{
    struct obd_daemon *d = job->d;
    int rank = obd_job_rank(job, (int)d->cfg.rank, local_rank);
    job->trainer[local_rank] = NULL;
    job->joined--;
    obd_log_info(&d->log, "job %s: rank %d (local %d) left: %s", job->name,
                 rank, local_rank, reason);
    if (job->joined > 0 && job->gone[0] == '\0')
        snprintf(job->gone, sizeof(job->gone),
                 "rank %d (node %d local %d) left the job: %s", rank,
                 (int)d->cfg.rank, local_rank, reason);

    job->busy++;
    struct obd_op *op;
    while ((op = first_open(job)) != NULL)
        obd_op_fail(op, OBCOMM_E_PEER_LOST, 1,
                    "op %llu of job %s: rank %d (node %d local %d) "
                    "vanished: %s",
                    (unsigned long long)op->seq, job->name, rank,
                    (int)d->cfg.rank, local_rank, reason);
    retire_done(job);
    job->busy--;
    job_maybe_free(job);
}

/* Fails every open op of every job with PEER_LOST and `reason`. */
static void fail_all_open(struct obd_daemon *d, int announce,
                          const char *reason)
{
    struct obd_job *jnext;
    for (struct obd_job *job = d->jobs; job; job = jnext) {
        jnext = job->next;
        job->busy++;
        struct obd_op *op;
        while ((op = first_open(job)) != NULL)
            obd_op_fail(op, OBCOMM_E_PEER_LOST, announce,
                        "op %llu of job %s: %s", (unsigned long long)op->seq,
                        job->name, reason);
        job->busy--;
        job_maybe_free(job);
    }
}

void obd_job_on_peer_lost(struct obd_daemon *d, int node, const char *why)
{
    char reason[320];
    snprintf(reason, sizeof(reason), "node %d was lost: %s", node, why);
    fail_all_open(d, 1, reason);
}

void obd_job_kick_all(struct obd_daemon *d)
{
    struct obd_job *next;
    for (struct obd_job *job = d->jobs; job; job = next) {
        next = job->next;
        job_kick(job);
    }
}

struct obd_op *obd_job_op(struct obd_daemon *d, uint32_t job_id, uint64_t seq)
{
    struct obd_job *job = obd_job_find_id(d, job_id);
    return job ? op_find(job, seq) : NULL;
}

/* A job without trainers and without ops is forgotten. */
static void job_maybe_free(struct obd_job *job)
{
    struct obd_daemon *d = job->d;
    if (job->joined > 0 || job->busy > 0)
        return;
    /* Failed ops that only wait for trainers who are gone are dropped. */
    retire_done(job);
    if (job->ops != NULL)
        return;
    for (struct obd_job **pp = &d->jobs; *pp; pp = &(*pp)->next)
        if (*pp == job) {
            *pp = job->next;
            break;
        }
    d->njobs--;
    free(job);
}

void obd_job_close_all(struct obd_daemon *d)
{
    char reason[96];
    snprintf(reason, sizeof(reason), "obcommd on node %d is shutting down",
             (int)d->cfg.rank);
    fail_all_open(d, 0, reason);
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
