/* The job module's entry points (job.h): trainers join, submit and
 * leave; peer messages and events. The rest of the module is in the files
 * job_impl.h lists. */
#include "err.h"
#include "job_impl.h"

#include <obcomm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "efstore.h"
#include "wire.h"

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
        obd_registry_detach(job);
        obd_runq_post(&d->runq, &job->ready);
        job = NULL;
    }
    /* A job without an owner here (new, or made by another node's
     * announce) would become one more of this user's. */
    if ((job == NULL || !job->owned) &&
        (rc = uid_may_own(d, uid, why, whylen)) != 0)
        return rc;
    if (job == NULL &&
        (rc = obd_registry_create(d, name, &job, why, whylen)) != 0)
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

/* A node reports the local phase of a two-phase op done. */
static void on_report(struct obd_daemon *d, int from,
                      const Obcomm__OpAnnounce *m)
{
    struct obd_job *job = obd_registry_route(d, from, m->job, m->run, 0);
    struct obd_op *op = job ? obd_op_find(job, m->seq) : NULL;
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
                obd_op_announce_to(op, &op->ann[d->cfg.rank], node);
}

int obd_job_submit(struct obd_job *job, int local_rank, uint64_t seq,
                   const struct obd_opdesc *desc, struct obd_shm *buf,
                   void *data, struct obd_shm *outbuf, void *out, int status,
                   char *why, size_t whylen)
{
    struct obd_op *op = obd_op_get(job, seq);
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
        obd_op_restart_deadline(op);
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
        obd_op_set_failed(op, status, 1, "op %llu of job %s: %s",
                          (unsigned long long)seq, job->name, why);
        return 0;
    }
    obd_match_check_local(op);
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
    struct obd_job *job =
        obd_registry_route(d, from, m->job, a.run, a.status == 0);
    if (job == NULL)
        return;
    if (job->joined == 0 && a.status == 0 && m->seq < job->next_seq) {
        /* An op this job is past, from a node with no reason to send it
         * again: that node runs a new run of the job while this node still
         * winds up an earlier one, which must not swallow the new run's
         * announces. That node's run is the new one. */
        job->seen_run[from] = 0;
        obd_registry_detach(job);
        obd_runq_post(&d->runq, &job->ready);
        job = obd_registry_route(d, from, m->job, a.run, 1);
        if (job == NULL)
            return;
    }
    struct obd_op *op = obd_op_get(job, m->seq);
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
        obd_op_set_failed(op, a.status, 1, "%s", a.message);
        return;
    }
    if (op->ann[from].have)
        return;
    a.reported = op->ann[from].reported;
    op->ann[from] = a;
    op->nann++;
    obd_match_check_ready(op);
}

/* Another node's trainer of the job left: its ops from `from_seq` on can
 * never complete, here either. */
static void on_job_left(struct obd_daemon *d, int from,
                        const Obcomm__JobLeft *m)
{
    struct obd_job *job = obd_registry_route(d, from, m->job, m->run, 0);
    if (job == NULL)
        return;
    obd_log_info(&d->log, "job %s: node %d reports: %s", job->name, from,
                 m->message);
    /* Failures are announced, so that a node that learnt of the op only
     * from us (no trainer of the job there any more) drops it too. */
    obd_op_stop_run(job, m->from_seq, OBD_E_PEER_LOST, m->message, 0);
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
            obd_op_set_failed(op, OBD_E_PEER_LOST, 1,
                              "op %llu of job %s: rank %d (node %d local %d) "
                              "left the job: %s",
                              (unsigned long long)op->seq, job->name, rank,
                              (int)d->cfg.rank, local_rank, reason);
    if (job->joined > 0)
        obd_op_stop_run(job, from, OBD_E_PEER_LOST, gone, 0);
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
        obd_op_fail_open(job, 0, OBD_E_PEER_LOST, 1, reason);
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
            obd_op_set_failed(op, OBD_E_PEER_LOST, 1, "op %llu of job %s: %s",
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
                obd_op_set_failed(
                    op, OBD_E_PEER_LOST, 1, "op %llu of job %s: %s",
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

struct obd_job *obd_job_next(struct obd_daemon *d, struct obd_job *prev)
{
    return prev == NULL ? d->jobs : prev->next;
}

struct obd_op *obd_job_next_open(struct obd_job *job, struct obd_op *prev)
{
    struct obd_op *o = prev == NULL ? job->ops : prev->next;
    while (o != NULL && !obd_op_open(o))
        o = o->next;
    return o;
}

/* ops: for obcommctl's `ops`, who an open op waits for, in the words of
 * its timeout message. */
void obd_job_op_waiting(const struct obd_op *op, char *buf, size_t len)
{
    if (op->state == OBD_OP_RUN && op->coll != NULL)
        obd_coll_algo(op->desc.kind)->waiting_on(op, buf, len);
    else
        obd_op_describe_missing(op, buf, len);
}
