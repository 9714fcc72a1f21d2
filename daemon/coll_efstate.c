/* The 1-bit state ops of a job's run: reset, snapshot and restore of the
 * daemons' error feedback (efstore.h holds the states, snapset.h the
 * sets on disk). They move no data between nodes: the announce exchange
 * put every node at the same point of the run, and the two-phase ops
 * exchange one report per node.
 *
 * Snapshot: every node saves the run's states as set
 * id = obd_snapset_id(run, seq), which every node computes alike: files
 * in state_dir, written by a pool task; without a state_dir, copies in
 * memory, made by a pool task. Each node reports how that went. With
 * every report in, every node sees the same reports and reaches the same
 * verdict (obd_snapset_verdict): all saved, the set is committed (older
 * sets pruned on the pool) and the op answers the id; else the op fails
 * on every rank with one message naming each node that could not save,
 * and every node deletes its copy.
 *
 * Restore (key = the set's id): every node reads and checks its whole
 * part of the set (pool task) and reports, with which keys it holds. All
 * read it whole and hold the same keys: every node installs it and the
 * run goes on from it. Any node missing it, or holding it damaged or
 * unreadable: no node uses it; every node resets the run's error feedback to
 * zero, and the op fails on every rank naming each node and why.
 *
 * Export (key = a set's id): every node writes its part of the set (from
 * state_dir or memory) as bytes (snapset.h) into every local trainer's
 * buffer, so that a checkpoint can carry it when the daemons keep no
 * state_dir; a restore that brings a node's part takes the states from it
 * instead of from the node's own set. Both report like the others.
 *
 * File I/O never runs on the loop thread. An op whose reports never all
 * come (a lost node, the deadline) fails like any other op and stops the
 * run. A snapshot op that failed leaves no set: a node whose op failed,
 * for whatever reason, drops the part it saved when the op is freed, and
 * a node that had seen every report and committed the set drops it too
 * when another node's failure of the op reaches it
 * (obd_coll_efstate_failed_elsewhere). */
#include "coll.h"
#include "err.h"

#include <obcomm.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "efstore.h"
#include "ops.h"
#include "snapset.h"

enum efop_phase {
    EP_LOCAL,    /* the pool task saves or reads this node's part */
    EP_REPORTED, /* reported; waiting for every node's report */
    EP_DONE,     /* the verdict is in */
};

struct efop {
    struct obd_daemon *d;
    uv_work_t req;
    enum efop_phase phase;
    uint32_t kind;
    char job[OBD_EF_JOB_MAX];
    uint64_t run;
    uint64_t id;
    const char *state_dir; /* d->cfg's; "" without one */
    struct obd_ef_world world;
    uint64_t max_bytes;
    /* A snapshot: the states saved (each begun), and without a state_dir
     * their copies. A restore: the states read. */
    struct obd_ef **efs;
    int nefs;
    /* A restore or an export without a state_dir: the set in memory,
     * held until the op is freed. */
    const struct obd_ef *from_memory;
    struct obd_memset *hold;
    struct obd_ef *list;
    /* A node's part as bytes: a restore's source, an export's
     * destination (every local trainer's buffer, dst[0..ndst)). */
    const void *part;
    size_t part_bytes;
    void *const *dst;
    int ndst;
    int rc; /* of the pool task: 0 or an OBD_E_* code, with why */
    char why[512];
    /* A restore's part read whole: which keys it holds, reported so that
     * every node sees whether all parts hold the same. */
    char keys[64];
    int saved;     /* this node's part of a snapshot is saved */
    int committed; /* the verdict was success */
};

static struct obd_ef_world world_of(const struct obd_daemon *d)
{
    struct obd_ef_world w = {.nodes = (uint32_t)d->cfg.nodes,
                             .rank = (uint32_t)d->cfg.rank,
                             .fingerprint = d->cfg.fingerprint};
    return w;
}

static void free_list(struct obd_ef *ef)
{
    while (ef != NULL) {
        struct obd_ef *next = ef->next;
        obd_ef_free(ef);
        ef = next;
    }
}

/* ---- on the pool ---- */

/* Copies of states, linked; 0 or OBD_E_NOMEM. */
static int copy_all(struct efop *e, const struct obd_ef *const *src, int n,
                    const struct obd_ef *chain)
{
    for (int i = 0; src != NULL ? i < n : chain != NULL; i++) {
        const struct obd_ef *from = src != NULL ? src[i] : chain;
        struct obd_ef *c = obd_ef_copy(from);
        if (c == NULL) {
            free_list(e->list);
            e->list = NULL;
            snprintf(e->why, sizeof(e->why), "out of memory for a copy");
            return OBD_E_NOMEM;
        }
        c->next = e->list;
        e->list = c;
        if (src == NULL)
            chain = chain->next;
    }
    return 0;
}

/* Packs the states of `list` as this node's part into every buffer. */
static int export_part(struct efop *e, const struct obd_ef *list)
{
    int n = 0;
    for (const struct obd_ef *ef = list; ef; ef = ef->next)
        n++;
    const struct obd_ef **efs = calloc((size_t)n + 1, sizeof(*efs));
    if (efs == NULL) {
        snprintf(e->why, sizeof(e->why), "out of memory");
        return OBD_E_NOMEM;
    }
    n = 0;
    for (const struct obd_ef *ef = list; ef; ef = ef->next)
        efs[n++] = ef;
    size_t need = obd_snapset_part_bytes(efs, n);
    int rc = 0;
    if (need != e->part_bytes) {
        snprintf(e->why, sizeof(e->why),
                 "the part of snapshot %016llx has %zu bytes, the buffer %zu",
                 (unsigned long long)e->id, need, e->part_bytes);
        rc = OBD_E_INVAL;
    } else {
        obd_snapset_pack(efs, n, e->job, e->id, &e->world, e->dst[0], need);
        for (int i = 1; i < e->ndst; i++)
            memcpy(e->dst[i], e->dst[0], need);
    }
    free(efs);
    return rc;
}

static int by_key(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

/* "keys N HASH": the keys and counts of a part, the same text on every
 * node whose part holds the same (FNV-1a over them in key order). */
static int describe_keys(struct efop *e)
{
    size_t n = 0;
    for (const struct obd_ef *ef = e->list; ef; ef = ef->next)
        n++;
    uint64_t *kc = calloc(2 * n + 2, sizeof(*kc));
    if (kc == NULL) {
        snprintf(e->why, sizeof(e->why), "out of memory");
        return OBD_E_NOMEM;
    }
    size_t i = 0;
    for (const struct obd_ef *ef = e->list; ef; ef = ef->next, i++) {
        kc[2 * i] = ef->key;
        kc[2 * i + 1] = ef->count;
    }
    qsort(kc, n, 2 * sizeof(*kc), by_key);
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    const unsigned char *p = (const unsigned char *)kc;
    for (size_t b = 0; b < 2 * n * sizeof(*kc); b++)
        h = (h ^ p[b]) * UINT64_C(0x100000001b3);
    free(kc);
    snprintf(e->keys, sizeof(e->keys), "keys %zu %016" PRIx64, n, h);
    return 0;
}

static void run_local(uv_work_t *req)
{
    struct efop *e = container_of(req, struct efop, req);
    int disk = e->state_dir[0] != '\0';
    if (e->kind == OBCOMM_KIND_EXPORT_1BIT) {
        const struct obd_ef *src = e->from_memory;
        if (disk) {
            e->rc = obd_snapset_read(e->state_dir, e->job, e->id, &e->world,
                                     e->max_bytes, &e->list, e->why,
                                     sizeof(e->why));
            src = e->list;
        }
        if (e->rc == 0)
            e->rc = export_part(e, src);
    } else if (e->kind == OBCOMM_KIND_SNAPSHOT_1BIT && disk) {
        const struct obd_ef_set set = {e->run, e->id};
        e->rc = obd_snapset_write(e->state_dir, e->job, &set, e->efs, e->nefs,
                                  &e->world, e->why, sizeof(e->why));
    } else if (e->kind == OBCOMM_KIND_SNAPSHOT_1BIT) {
        e->rc =
            copy_all(e, (const struct obd_ef *const *)e->efs, e->nefs, NULL);
    } else if (e->part != NULL) {
        e->rc = obd_snapset_unpack(e->part, e->part_bytes, e->job, e->id,
                                   &e->world, &e->list, e->why, sizeof(e->why));
    } else if (disk) {
        e->rc =
            obd_snapset_read(e->state_dir, e->job, e->id, &e->world,
                             e->max_bytes, &e->list, e->why, sizeof(e->why));
    } else {
        e->rc = copy_all(e, NULL, 0, e->from_memory);
    }
    if (e->kind == OBCOMM_KIND_RESTORE_1BIT && e->rc == 0)
        e->rc = describe_keys(e);
}

/* Pool work that outlives its op: committing or deleting a set. Counted
 * in d->pool_tasks, so a shutdown waits for it. */
struct chore {
    struct obd_daemon *d;
    uv_work_t req;
    int commit; /* else delete */
    char job[OBD_EF_JOB_MAX];
    uint64_t id;
};

static void run_chore(uv_work_t *req)
{
    struct chore *c = container_of(req, struct chore, req);
    if (c->commit)
        obd_snapset_commit(c->d->cfg.state_dir, c->job, c->id, OBD_SNAP_KEEP,
                           (uint64_t)c->d->cfg.state_dir_max_bytes);
    else
        obd_snapset_delete(c->d->cfg.state_dir, c->job, c->id);
}

static void chore_done(uv_work_t *req, int status)
{
    struct chore *c = container_of(req, struct chore, req);
    (void)status;
    c->d->pool_tasks--;
    free(c);
}

static void chore(struct obd_daemon *d, int commit, const char *job,
                  uint64_t id)
{
    struct chore *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return; /* a set left behind is pruned by a later commit */
    c->d = d;
    c->commit = commit;
    snprintf(c->job, sizeof(c->job), "%s", job);
    c->id = id;
    if (uv_queue_work(&d->loop, &c->req, run_chore, chore_done) != 0) {
        free(c);
        return;
    }
    d->pool_tasks++;
}

/* ---- on the loop ---- */

static void release_saved(struct efop *e)
{
    if (e->efs != NULL)
        obd_efstore_release(e->d, e->efs, e->nefs);
    e->efs = NULL;
    e->nefs = 0;
}

static void local_done(uv_work_t *req, int status)
{
    struct efop *e = container_of(req, struct efop, req);
    struct obd_op *op = e->req.data;
    if (status != 0 && e->rc == 0) {
        e->rc = OBD_E_IO;
        snprintf(e->why, sizeof(e->why), "the pool task was cancelled");
    }
    e->saved = e->kind == OBCOMM_KIND_SNAPSHOT_1BIT && e->rc == 0;
    if (e->saved)
        obd_metric_add(&e->d->metrics, OBD_M_EF_SAVED, (uint64_t)e->nefs);
    if (e->rc == OBD_E_CORRUPT || e->rc == OBD_E_IO)
        obd_metric_add(&e->d->metrics, OBD_M_EF_REJECTED, 1);
    release_saved(e); /* the states may change again */
    if (op->state == OBD_OP_RUN) {
        char msg[600];
        snprintf(msg, sizeof(msg), "%s", e->why);
        e->phase = EP_REPORTED;
        obd_op_report(op, e->rc, e->rc ? msg : e->keys);
    }
    obd_op_task_end(op);
}

static int efop_queue(struct obd_op *op, struct efop *e)
{
    e->req.data = op;
    int rc = uv_queue_work(&e->d->loop, &e->req, run_local, local_done);
    if (rc != 0) {
        release_saved(e);
        obd_op_fail(op, OBD_E_NOMEM, 1,
                    "op %llu of job %s on node %d: cannot queue file work",
                    (unsigned long long)op->seq, op->job->name,
                    (int)e->d->cfg.rank);
        return OBD_E_NOMEM;
    }
    obd_op_task_begin(op);
    return 0;
}

static struct efop *efop_new(struct obd_op *op)
{
    struct obd_daemon *d = op->job->d;
    struct efop *e = calloc(1, sizeof(*e));
    if (e == NULL) {
        obd_op_fail(op, OBD_E_NOMEM, 1, "out of memory");
        return NULL;
    }
    op->coll = e;
    e->d = d;
    e->kind = op->desc.kind;
    snprintf(e->job, sizeof(e->job), "%s", op->job->name);
    e->run = op->job->run;
    e->state_dir = d->cfg.state_dir;
    e->world = world_of(d);
    e->max_bytes = (uint64_t)d->cfg.max_buffer_bytes * 2;
    return e;
}

static int snapshot_start(struct obd_op *op)
{
    struct efop *e = efop_new(op);
    if (e == NULL)
        return OBD_E_NOMEM;
    e->id = obd_snapset_id(e->run, op->seq);
    int rc = obd_efstore_collect(e->d, e->job, e->run, &e->efs, &e->nefs,
                                 e->why, sizeof(e->why));
    if (rc == 0)
        op->bytes = obd_snapset_part_bytes((const struct obd_ef *const *)e->efs,
                                           e->nefs);
    uint64_t bound = obd_efstore_retained_limit(e->d);
    if (rc == 0 && e->state_dir[0] == '\0' && op->bytes > bound) {
        release_saved(e);
        rc = OBD_E_TOOBIG;
        snprintf(e->why, sizeof(e->why),
                 "the set needs %llu bytes in memory, retained_sets_max_bytes "
                 "allows %llu (or give the daemons a state_dir)",
                 (unsigned long long)op->bytes, (unsigned long long)bound);
    }
    if (rc != 0) {
        /* Nothing to save: reported like a failed write. */
        e->rc = rc;
        e->phase = EP_REPORTED;
        obd_op_report(op, rc, e->why);
        return 0;
    }
    return efop_queue(op, e);
}

static int export_start(struct obd_op *op)
{
    struct efop *e = efop_new(op);
    if (e == NULL)
        return OBD_E_NOMEM;
    e->id = op->desc.key;
    e->part_bytes = op->desc.count;
    e->dst = op->data;
    e->ndst = op->job->local_size;
    if (e->state_dir[0] == '\0') {
        e->from_memory = obd_efstore_memset_find(e->d, e->job, e->id, &e->hold);
        if (e->hold == NULL) {
            e->rc = OBD_E_STATE;
            snprintf(e->why, sizeof(e->why),
                     "missing (obcommd keeps only the newest set of a job, "
                     "in memory, until it restarts)");
            e->phase = EP_REPORTED;
            obd_op_report(op, e->rc, e->why);
            return 0;
        }
    }
    return efop_queue(op, e);
}

static int restore_start(struct obd_op *op)
{
    struct efop *e = efop_new(op);
    if (e == NULL)
        return OBD_E_NOMEM;
    e->id = op->desc.key;
    /* The node's part, if a local trainer brought one. */
    for (int i = 0; i < op->job->local_size && e->part == NULL; i++)
        if (op->sub[i].count > 0 && op->data[i] != NULL) {
            e->part = op->data[i];
            e->part_bytes = op->sub[i].count;
        }
    if (e->part == NULL && e->state_dir[0] == '\0') {
        e->from_memory = obd_efstore_memset_find(e->d, e->job, e->id, &e->hold);
        if (e->hold == NULL) {
            e->rc = OBD_E_STATE;
            snprintf(e->why, sizeof(e->why),
                     "missing (no state_dir: obcommd keeps only the newest "
                     "set of a job, in memory, until it restarts)");
            e->phase = EP_REPORTED;
            obd_op_report(op, e->rc, e->why);
            return 0;
        }
    }
    return efop_queue(op, e);
}

/* Every node read its part whole: all parts must hold the same keys (a
 * node's part complete in itself but of fewer or other keys than the
 * others' is not of the same snapshot). 0, or OBD_E_CORRUPT with msg
 * naming what every node holds. */
static int same_keys(const struct obd_snapreport *r, int nodes, char *msg,
                     size_t len)
{
    int differ = 0;
    for (int n = 1; n < nodes; n++)
        differ |= strcmp(r[n].message ? r[n].message : "",
                         r[0].message ? r[0].message : "") != 0;
    if (!differ)
        return 0;
    size_t off = (size_t)snprintf(msg, len,
                                  "the nodes' parts of the set "
                                  "hold different keys:");
    for (int n = 0; n < nodes && off < len; n++)
        off += (size_t)snprintf(msg + off, len - off, "%s node %d: %s",
                                n ? ";" : "", n, r[n].message);
    return OBD_E_CORRUPT;
}

/* Every node has reported: the same verdict everywhere. */
static void efop_progress(struct obd_op *op)
{
    struct efop *e = op->coll;
    int nodes = e->d->cfg.nodes;
    if (e->phase != EP_REPORTED || !obd_op_all_reported(op))
        return;
    e->phase = EP_DONE;
    struct obd_snapreport r[OBD_MAX_NODES];
    for (int n = 0; n < nodes; n++)
        r[n] = (struct obd_snapreport){op->ann[n].report_status,
                                       op->ann[n].report_message};
    char msg[1024];
    int status = obd_snapset_verdict(r, nodes, msg, sizeof(msg));
    int snap = e->kind == OBCOMM_KIND_SNAPSHOT_1BIT;
    if (status == 0 && e->kind == OBCOMM_KIND_RESTORE_1BIT)
        status = same_keys(r, nodes, msg, sizeof(msg));
    if (e->kind == OBCOMM_KIND_EXPORT_1BIT) {
        if (status == 0)
            obd_op_finish(op);
        else
            obd_op_fail(op, status, 0,
                        "op %llu of job %s: snapshot %016llx could not be "
                        "exported: %s",
                        (unsigned long long)op->seq, e->job,
                        (unsigned long long)e->id, msg);
        return;
    }
    if (status == 0) {
        if (snap && e->state_dir[0] != '\0') {
            chore(e->d, 1, e->job, e->id);
        } else if (snap) {
            obd_efstore_memset_put(e->d, e->job, e->id, e->list);
            e->list = NULL;
        } else {
            obd_efstore_install(e->d, e->job, e->run, e->list, e->id, op->seq);
            e->list = NULL;
        }
        e->committed = 1;
        op->value = e->id;
        obd_log_info(&e->d->log, "job %s: snapshot %016" PRIx64 " %s", e->job,
                     e->id, snap ? "saved on every node" : "restored");
        obd_op_finish(op);
        return;
    }
    if (!snap)
        obd_efstore_reset_run(e->d, e->job, e->run,
                              "a snapshot could not be restored");
    obd_op_fail(op, status, 0,
                "op %llu of job %s: snapshot %016llx could not be %s: %s%s",
                (unsigned long long)op->seq, e->job, (unsigned long long)e->id,
                snap ? "saved" : "restored", msg,
                snap ? "" : "; every node's error feedback restarts at zero");
}

static void efop_free(struct obd_op *op)
{
    struct efop *e = op->coll;
    /* A snapshot that failed, here or anywhere (a verdict, a lost node,
     * the deadline): no node keeps its part. */
    if (e->saved && !e->committed && e->state_dir[0] != '\0')
        chore(e->d, 0, e->job, e->id);
    release_saved(e);
    if (e->hold != NULL)
        obd_efstore_memset_release(e->d, e->hold);
    free_list(e->list);
    free(e);
    op->coll = NULL;
}

static void efop_waiting_on(const struct obd_op *op, char *buf, size_t len)
{
    const struct efop *e = op->coll;
    size_t off = 0;
    if (e->phase == EP_LOCAL) {
        snprintf(buf, len, "this node's snapshot %s",
                 e->state_dir[0] ? "file work" : "copy");
        return;
    }
    for (int n = 0; n < e->d->cfg.nodes && off < len; n++)
        if (!op->ann[n].reported)
            off += (size_t)snprintf(buf + off, len - off, "%snode %d",
                                    off ? ", " : "the report of ", n);
    if (off == 0 && len > 0)
        buf[0] = '\0';
}

/* No 1-bit op of the run uses its states (the failed op's tasks may). */
static int efop_can_start(struct obd_op *op)
{
    return obd_efstore_idle(op->job->d, op->job->name, op->job->run);
}

/* A snapshot has no argument but its kind. */
static void snapshot_normalize(struct obd_opdesc *d)
{
    *d = (struct obd_opdesc){.kind = d->kind};
}

/* An export or a restore names a snapshot (key) and the bytes of this
 * node's part in its buffer (count; a restore without one has 0). */
static void part_normalize(struct obd_opdesc *d)
{
    *d = (struct obd_opdesc){.kind = d->kind, .key = d->key, .count = d->count};
}

static int part_check(const struct obd_opdesc *d, int world, uint64_t *bytes,
                      uint64_t *out_bytes, char *why, size_t len)
{
    (void)world;
    if (d->key == 0 || (d->kind == OBCOMM_KIND_EXPORT_1BIT && d->count == 0)) {
        snprintf(why, len, "snapshot %llu with %llu bytes",
                 (unsigned long long)d->key, (unsigned long long)d->count);
        return OBD_E_INVAL;
    }
    *bytes = d->count;
    *out_bytes = 0;
    return 0;
}

/* The rows of the three two-phase state ops: they move no data. */
#define EFOP_ALGO(k, n, s, norm, chk)                                  \
    {                                                                  \
        .kind = (k), .name = (n), .normalize = (norm), .check = (chk), \
        .start = (s), .recv_dest = obd_coll_no_data,                   \
        .recv_done = obd_coll_no_recv, .progress = efop_progress,      \
        .free = efop_free, .waiting_on = efop_waiting_on,              \
        .can_start = efop_can_start,                                   \
    }

const struct obd_algo obd_algo_onebit_snapshot =
    EFOP_ALGO(OBCOMM_KIND_SNAPSHOT_1BIT, "1-bit snapshot", snapshot_start,
              snapshot_normalize, obd_coll_check_nothing);
const struct obd_algo obd_algo_onebit_export =
    EFOP_ALGO(OBCOMM_KIND_EXPORT_1BIT, "1-bit export", export_start,
              part_normalize, part_check);
const struct obd_algo obd_algo_onebit_restore =
    EFOP_ALGO(OBCOMM_KIND_RESTORE_1BIT, "1-bit restore", restore_start,
              part_normalize, part_check);

void obd_coll_efstate_failed_elsewhere(struct obd_daemon *d, const char *job,
                                       uint64_t run, uint64_t seq)
{
    if (run == 0)
        return; /* no op of the run was agreed: no snapshot was taken */
    uint64_t id = obd_snapset_id(run, seq);
    if (d->cfg.state_dir[0] != '\0') {
        chore(d, 0, job, id);
        return;
    }
    obd_efstore_memset_drop(d, job, id);
}

/* ---- reset ---- */

static int reset_start(struct obd_op *op)
{
    obd_efstore_reset(op->job->d, op->job->name, op->job->run, op->desc.key);
    obd_op_finish(op);
    return 0;
}

static int reset_can_start(struct obd_op *op)
{
    struct obd_ef *ef =
        obd_efstore_find(op->job->d, op->job->name, op->job->run, op->desc.key);
    return ef == NULL || ef->users == 0;
}

static void no_free(struct obd_op *op)
{
    (void)op;
}

/* A reset names the state it resets (key), and nothing else. */
static void reset_normalize(struct obd_opdesc *d)
{
    *d = (struct obd_opdesc){.kind = d->kind, .key = d->key};
}

const struct obd_algo obd_algo_onebit_reset = {
    .kind = OBCOMM_KIND_RESET_1BIT,
    .name = "1-bit reset",
    .normalize = reset_normalize,
    .check = obd_coll_check_nothing,
    .start = reset_start,
    .recv_dest = obd_coll_no_data,
    .recv_done = obd_coll_no_recv,
    .progress = obd_coll_no_progress,
    .free = no_free,
    .waiting_on = obd_coll_waiting_on_nobody,
    .can_start = reset_can_start,
};
