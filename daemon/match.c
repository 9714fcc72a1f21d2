/* Matching an op across the local trainers and the nodes (job_impl.h):
 * descriptors, runs, owners, error-feedback versions and the mismatch
 * messages that name who differs and in what. */
#include "err.h"
#include "job_impl.h"

#include <obcomm.h>

#include <stdio.h>
#include <string.h>

#include "coll.h"
#include "efstore.h"
#include "hash.h"
#include "ops.h"
#include "reduce.h"

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
    obd_op_set_failed(op, OBD_E_MISMATCH, announce,
                      "op %llu of job %s: ranks issued different ops: %s",
                      (unsigned long long)op->seq, op->job->name, diff);
    return 1;
}

void obd_match_check_local(struct obd_op *op)
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

    obd_op_enter(op, OBD_OP_LOCAL);
    op->desc = op->sub[0];
    obd_match_announce(op);
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
void obd_match_announce(struct obd_op *op)
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
        obd_op_announce_to_all(op, mine);
    obd_match_check_ready(op);
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
    obd_op_set_failed(
        op, OBD_E_MISMATCH, 1,
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
    obd_op_set_failed(
        op, OBD_E_STATE, 1,
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
    obd_op_set_failed(
        op, OBD_E_DENIED, 0,
        "op %llu of job %s: the job's trainers belong to different "
        "users: %s; a job has one owner on every node (pick another "
        "job name)",
        (unsigned long long)op->seq, job->name, who);
    return 1;
}

/* Every node's announce is in: all nodes compare the same set, so all reach
 * the same verdict without another round. */
void obd_match_check_ready(struct obd_op *op)
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
            obd_op_set_failed(
                op, OBD_E_MISMATCH, 1,
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
    obd_op_enter(op, OBD_OP_AGREED);
    obd_runq_post(&d->runq, &job->ready);
}
