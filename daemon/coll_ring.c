/* Full-precision collectives among nodes: pipelined ring allreduce
 * (reduce-scatter then allgather), pipelined chain broadcast, barrier.
 *
 * The local trainers' buffers are reduced exactly into an accumulation
 * buffer first (one read of each), only that buffer travels, and the
 * result is written into every local trainer's buffer at the end. Each
 * chunk is cut into segments of segment_bytes: segment j of step s+1 leaves
 * as soon as segment j of step s has arrived and been reduced, so sending,
 * receiving and reducing overlap.
 */
#include "coll.h"

#include <obcomm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "reduce.h"
#include "ring.h"

struct obd_coll {
    struct obd_daemon *d;
    int n, r;
    size_t count; /* elements (bytes for broadcast) */
    size_t esz;   /* bytes per element on the wire */
    size_t seg;   /* elements per segment */
    uint8_t *acc;
    size_t acc_bytes;
    int zero_copy; /* acc/src are trainer memory (the op holds the buffers) */
    uint8_t *tmp;  /* one segment, for reduce-scatter steps */
    int nsteps;
    int send_step, recv_step;
    size_t send_seg, recv_seg;
    /* broadcast */
    int pos; /* distance from the root node along the chain */
    const uint8_t *src;
};

uint64_t obd_coll_fingerprint(const struct obd_opdesc *d)
{
    uint64_t v[6] = {d->kind,  d->dtype, d->redop,
                     d->count, d->key,   (uint64_t)(int64_t)d->root};
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (int i = 0; i < 6; i++)
        for (int b = 0; b < 8; b++) {
            h ^= (v[i] >> (8 * b)) & 0xff;
            h *= UINT64_C(0x100000001b3);
        }
    return h;
}

static const char *send_error(int rc)
{
    return rc == OBCOMM_E_PEER_LOST ? "link is down"
           : rc == OBCOMM_E_NOMEM   ? "out of memory"
                                    : uv_strerror(rc);
}

/* Sends one data frame; on failure fails the op and returns non-zero. */
static int send_or_fail(struct obd_op *op, int to, uint32_t step,
                        uint32_t segment, const void *payload, size_t len)
{
    int rc = obd_op_send(op, to, step, segment, payload, (uint32_t)len);
    if (rc)
        obd_op_fail(op, OBCOMM_E_PEER_LOST, 1,
                    "op %llu of job %s: cannot send to node %d: %s",
                    (unsigned long long)op->seq, op->job->name, to,
                    send_error(rc));
    return rc;
}

static struct obd_coll *coll_new(struct obd_op *op, size_t count, size_t esz)
{
    struct obd_daemon *d = op->job->d;
    struct obd_coll *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->d = d;
    c->n = d->cfg.nodes;
    c->r = (int)d->cfg.rank;
    c->count = count;
    c->esz = esz;
    c->seg = (size_t)d->cfg.segment_bytes / esz;
    if (c->seg == 0)
        c->seg = 1;
    op->coll = c;
    return c;
}

static void coll_free(struct obd_op *op)
{
    struct obd_coll *c = op->coll;
    if (!c->zero_copy)
        obd_daemon_scratch_put(c->d, c->acc, c->acc_bytes);
    free(c->tmp);
    free(c);
    op->coll = NULL;
}

/* ---- ring allreduce ---- */

static size_t step_chunk_elems(const struct obd_coll *c, int s, int sending,
                               size_t *begin)
{
    size_t b, e;
    int chunk = sending ? obd_ring_send_chunk(c->r, c->n, s)
                        : obd_ring_recv_chunk(c->r, c->n, s);
    obd_ring_chunk(c->count, c->n, chunk, &b, &e);
    *begin = b;
    return e - b;
}

/* Moves a cursor past steps that carry nothing (chunks of zero elements
 * when count < n). */
static void settle(const struct obd_coll *c, int *step, size_t *seg,
                   int sending)
{
    size_t begin;
    while (*step < c->nsteps &&
           *seg >= obd_ring_nseg(step_chunk_elems(c, *step, sending, &begin),
                                 c->seg)) {
        (*step)++;
        *seg = 0;
    }
}

/* Segment j of step s: its element offset and length. */
static size_t seg_range(const struct obd_coll *c, int s, size_t j, int sending,
                        size_t *off)
{
    size_t begin;
    size_t elems = step_chunk_elems(c, s, sending, &begin);
    size_t first = j * c->seg;
    *off = begin + first;
    return elems - first < c->seg ? elems - first : c->seg;
}

static void ring_finish(struct obd_op *op)
{
    struct obd_coll *c = op->coll;
    struct obd_job *job = op->job;
    int ls = job->local_size;
    if (c->zero_copy) {
        if (op->desc.redop == OBCOMM_AVG)
            obd_reduce_div_in_place((obcomm_dtype_t)op->desc.dtype, c->acc,
                                    c->count, c->n * ls);
        obd_op_finish(op);
        return;
    }
    obd_reduce_store_many((obcomm_dtype_t)op->desc.dtype,
                          (obcomm_op_t)op->desc.redop, op->data, ls, c->acc,
                          c->count, c->n * ls);
    obd_op_finish(op);
}

static void ring_progress(struct obd_op *op)
{
    struct obd_coll *c = op->coll;
    struct obd_daemon *d = op->job->d;
    int right = obd_ring_mod(c->r + 1, c->n);

    while (c->send_step < c->nsteps) {
        int s = c->send_step;
        size_t j = c->send_seg;
        /* Segment j of step s > 0 is the one received at step s-1. */
        if (s > 0 && !(c->recv_step > s - 1 ||
                       (c->recv_step == s - 1 && c->recv_seg > j)))
            break;
        size_t off;
        size_t len = seg_range(c, s, j, 1, &off);
        if (send_or_fail(op, right, (uint32_t)s, (uint32_t)j,
                         c->acc + off * c->esz, len * c->esz))
            return;
        obd_metric_add(&d->metrics, OBD_M_ALLREDUCE_BYTES_SENT, len * c->esz);
        c->send_seg++;
        settle(c, &c->send_step, &c->send_seg, 1);
    }
    if (c->send_step == c->nsteps && c->recv_step == c->nsteps && op->refs == 0)
        ring_finish(op);
}

static int ring_start(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    obcomm_dtype_t dt = (obcomm_dtype_t)op->desc.dtype;
    size_t esz = obd_dtype_acc_size(dt);
    struct obd_coll *c = coll_new(op, op->desc.count, esz);
    /* One trainer and a dtype that accumulates in itself: the ring runs in
     * the trainer's shared memory, with no copy in or out. The op's
     * reference keeps the buffer mapped even if the trainer leaves. */
    if (c != NULL && job->local_size == 1 && c->n > 1 &&
        esz == obd_dtype_size(dt)) {
        c->acc = op->data[0];
        c->zero_copy = 1;
    }
    if (c == NULL ||
        (!c->zero_copy && (c->acc = obd_daemon_scratch_get(
                               d, c->count * esz, &c->acc_bytes)) == NULL) ||
        (c->n > 1 && (c->tmp = malloc(c->seg * esz)) == NULL)) {
        obd_op_fail(op, OBCOMM_E_NOMEM, 1,
                    "op %llu of job %s: no memory for %zu elements on node %d",
                    (unsigned long long)op->seq, job->name,
                    (size_t)op->desc.count, c ? c->r : -1);
        return OBCOMM_E_NOMEM;
    }
    obd_metric_add(&d->metrics, OBD_M_LOGICAL_BYTES,
                   c->count * obd_dtype_size(dt));

    if (!c->zero_copy) {
        uint64_t t0 = uv_hrtime();
        obd_reduce_load(dt, (obcomm_op_t)op->desc.redop, c->acc,
                        (const void *const *)op->data, job->local_size,
                        c->count);
        obd_trace_span(d, "local reduce", "ring",
                       (int)(job->id % OBD_TRACE_POOL), t0, uv_hrtime(), NULL);
    }
    if (c->n == 1) {
        ring_finish(op);
        return 0;
    }
    c->nsteps = 2 * (c->n - 1);
    settle(c, &c->send_step, &c->send_seg, 1);
    settle(c, &c->recv_step, &c->recv_seg, 0);
    ring_progress(op);
    return 0;
}

static void *ring_recv_dest(struct obd_op *op, int from,
                            const struct obd_frame *f, const char **why)
{
    struct obd_coll *c = op->coll;
    if (from != obd_ring_mod(c->r - 1, c->n)) {
        *why = "data from a node that is not the left neighbour";
        return NULL;
    }
    if (c->recv_step >= c->nsteps || f->step != (uint32_t)c->recv_step ||
        f->segment != c->recv_seg) {
        *why = "step or segment out of order";
        return NULL;
    }
    size_t off;
    size_t len = seg_range(c, c->recv_step, c->recv_seg, 0, &off);
    if (f->len != len * c->esz) {
        *why = "payload length differs from the segment's";
        return NULL;
    }
    return c->recv_step < c->n - 1 ? c->tmp : c->acc + off * c->esz;
}

static void ring_recv_done(struct obd_op *op, int from,
                           const struct obd_frame *f)
{
    struct obd_coll *c = op->coll;
    (void)from;
    (void)f;
    if (c->recv_step < c->n - 1) {
        size_t off;
        size_t len = seg_range(c, c->recv_step, c->recv_seg, 0, &off);
        obd_reduce_acc((obcomm_dtype_t)op->desc.dtype,
                       (obcomm_op_t)op->desc.redop, c->acc + off * c->esz,
                       c->tmp, len);
    }
    c->recv_seg++;
    settle(c, &c->recv_step, &c->recv_seg, 0);
    /* Progress runs when the caller drops the receive's reference. */
}

static void ring_waiting_on(const struct obd_op *op, char *buf, size_t len)
{
    const struct obd_coll *c = op->coll;
    if (c->recv_step < c->nsteps)
        snprintf(buf, len, "data from node %d (step %d, segment %zu)",
                 obd_ring_mod(c->r - 1, c->n), c->recv_step, c->recv_seg);
    else
        snprintf(buf, len, "node %d to take our data",
                 obd_ring_mod(c->r + 1, c->n));
}

static int ring_needs_node(const struct obd_op *op, int node)
{
    const struct obd_coll *c = op->coll;
    return (node == obd_ring_mod(c->r - 1, c->n) && c->recv_step < c->nsteps) ||
           (node == obd_ring_mod(c->r + 1, c->n) && c->send_step < c->nsteps);
}

/* ---- broadcast along the chain root, root+1, ..., root-1 ---- */

static void bcast_finish(struct obd_op *op)
{
    struct obd_coll *c = op->coll;
    struct obd_job *job = op->job;
    for (int i = 0; i < job->local_size; i++)
        if (op->data[i] != c->src)
            memcpy(op->data[i], c->src, c->count);
    obd_op_finish(op);
}

static void bcast_progress(struct obd_op *op)
{
    struct obd_coll *c = op->coll;
    struct obd_daemon *d = op->job->d;
    size_t nseg = obd_ring_nseg(c->count, c->seg);
    int right = obd_ring_mod(c->r + 1, c->n);
    int forwards = c->pos < c->n - 1;

    while (forwards && c->send_seg < nseg &&
           (c->pos == 0 || c->recv_seg > c->send_seg)) {
        size_t off = c->send_seg * c->seg;
        size_t len = c->count - off < c->seg ? c->count - off : c->seg;
        if (send_or_fail(op, right, 0, (uint32_t)c->send_seg, c->src + off,
                         len))
            return;
        obd_metric_add(&d->metrics, OBD_M_BROADCAST_BYTES_SENT, len);
        c->send_seg++;
    }
    int sent = !forwards || c->send_seg == nseg;
    int received = c->pos == 0 || c->recv_seg == nseg;
    if (sent && received && op->refs == 0)
        bcast_finish(op);
}

static int bcast_start(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    int ls = job->local_size;
    int root = op->desc.root;
    if (root < 0 || root >= d->cfg.nodes * ls) {
        obd_op_fail(op, OBCOMM_E_INVAL, 0,
                    "op %llu of job %s: broadcast root %d is not a rank "
                    "(world of %d)",
                    (unsigned long long)op->seq, job->name, root,
                    d->cfg.nodes * ls);
        return OBCOMM_E_INVAL;
    }
    struct obd_coll *c = coll_new(op, op->desc.count, 1);
    if (c == NULL) {
        obd_op_fail(op, OBCOMM_E_NOMEM, 1, "out of memory");
        return OBCOMM_E_NOMEM;
    }
    obd_metric_add(&d->metrics, OBD_M_LOGICAL_BYTES, c->count);
    int root_node = root / ls;
    c->pos = obd_ring_mod(c->r - root_node, c->n);
    /* The root sends straight from its trainer's shared memory, and a node
     * with one trainer receives straight into it; the buffers stay mapped
     * until the op is freed, even if the trainer leaves. Other nodes
     * receive into a kept buffer and copy to each trainer at the end. */
    if (c->pos == 0 || ls == 1) {
        c->zero_copy = 1;
        c->acc = c->pos == 0 ? NULL : op->data[0];
        c->src = c->pos == 0 ? op->data[root % ls] : c->acc;
    } else {
        c->acc = obd_daemon_scratch_get(d, c->count, &c->acc_bytes);
        if (c->acc == NULL) {
            obd_op_fail(op, OBCOMM_E_NOMEM, 1,
                        "op %llu of job %s: no memory for %zu bytes",
                        (unsigned long long)op->seq, job->name, c->count);
            return OBCOMM_E_NOMEM;
        }
        c->src = c->acc;
    }
    bcast_progress(op);
    return 0;
}

static void *bcast_recv_dest(struct obd_op *op, int from,
                             const struct obd_frame *f, const char **why)
{
    struct obd_coll *c = op->coll;
    size_t nseg = obd_ring_nseg(c->count, c->seg);
    if (c->pos == 0 || from != obd_ring_mod(c->r - 1, c->n)) {
        *why = "broadcast data from a node that is not the one before";
        return NULL;
    }
    if (f->step != 0 || f->segment != c->recv_seg || c->recv_seg >= nseg) {
        *why = "segment out of order";
        return NULL;
    }
    size_t off = c->recv_seg * c->seg;
    size_t len = c->count - off < c->seg ? c->count - off : c->seg;
    if (f->len != len) {
        *why = "payload length differs from the segment's";
        return NULL;
    }
    return c->acc + off;
}

static void bcast_recv_done(struct obd_op *op, int from,
                            const struct obd_frame *f)
{
    (void)from;
    (void)f;
    struct obd_coll *c = op->coll;
    c->recv_seg++;
}

static void bcast_waiting_on(const struct obd_op *op, char *buf, size_t len)
{
    const struct obd_coll *c = op->coll;
    if (c->pos != 0 && c->recv_seg < obd_ring_nseg(c->count, c->seg))
        snprintf(buf, len, "broadcast data from node %d (segment %zu)",
                 obd_ring_mod(c->r - 1, c->n), c->recv_seg);
    else
        snprintf(buf, len, "node %d to take our data",
                 obd_ring_mod(c->r + 1, c->n));
}

static int bcast_needs_node(const struct obd_op *op, int node)
{
    const struct obd_coll *c = op->coll;
    size_t nseg = obd_ring_nseg(c->count, c->seg);
    return (node == obd_ring_mod(c->r - 1, c->n) && c->pos != 0 &&
            c->recv_seg < nseg) ||
           (node == obd_ring_mod(c->r + 1, c->n) && c->pos < c->n - 1 &&
            c->send_seg < nseg);
}

/* ---- barrier: the announce exchange is the whole barrier ---- */

static int barrier_start(struct obd_op *op)
{
    struct obd_coll *c = coll_new(op, 0, 1);
    if (c == NULL) {
        obd_op_fail(op, OBCOMM_E_NOMEM, 1, "out of memory");
        return OBCOMM_E_NOMEM;
    }
    obd_op_finish(op);
    return 0;
}

void *obd_coll_no_data(struct obd_op *op, int from, const struct obd_frame *f,
                       const char **why)
{
    (void)op;
    (void)from;
    (void)f;
    *why = "this op carries no data";
    return NULL;
}

void obd_coll_no_recv(struct obd_op *op, int from, const struct obd_frame *f)
{
    (void)op;
    (void)from;
    (void)f;
}

void obd_coll_no_progress(struct obd_op *op)
{
    (void)op;
}

void obd_coll_waiting_on_nobody(const struct obd_op *op, char *buf, size_t len)
{
    (void)op;
    snprintf(buf, len, "nobody");
}

static const struct obd_algo algos[] = {
    {.kind = OBCOMM_KIND_ALLREDUCE,
     .name = "ring allreduce",
     .start = ring_start,
     .recv_dest = ring_recv_dest,
     .recv_done = ring_recv_done,
     .progress = ring_progress,
     .free = coll_free,
     .waiting_on = ring_waiting_on,
     .needs_node = ring_needs_node},
    {.kind = OBCOMM_KIND_BROADCAST,
     .name = "chain broadcast",
     .start = bcast_start,
     .recv_dest = bcast_recv_dest,
     .recv_done = bcast_recv_done,
     .progress = bcast_progress,
     .free = coll_free,
     .waiting_on = bcast_waiting_on,
     .needs_node = bcast_needs_node},
    {.kind = OBCOMM_KIND_BARRIER,
     .name = "barrier",
     .start = barrier_start,
     .recv_dest = obd_coll_no_data,
     .recv_done = obd_coll_no_recv,
     .progress = obd_coll_no_progress,
     .free = coll_free,
     .waiting_on = obd_coll_waiting_on_nobody},
};

const struct obd_algo *obd_coll_algo(uint32_t kind)
{
    for (size_t i = 0; i < sizeof(algos) / sizeof(algos[0]); i++)
        if (algos[i].kind == kind)
            return &algos[i];
    const struct obd_algo *const onebit[] = {
        &obd_algo_onebit, &obd_algo_onebit_reset, &obd_algo_onebit_snapshot};
    for (size_t i = 0; i < 3; i++)
        if (onebit[i]->kind == kind)
            return onebit[i];
    return NULL;
}
