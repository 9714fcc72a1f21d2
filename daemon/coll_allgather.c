/* The ring allgather. Bytes, whatever the dtype. The result is world blocks of
 * one rank's part each; node r's trainers own the consecutive parts of block r
 * (count / n bytes). The ring runs in the first local trainer's result buffer:
 * its node's parts are copied there (unless a part already is, in place), then
 * at step s (0 .. n-2) node r sends block r - s to r + 1, segment by
 * segment, and receives block r - s - 1 from r - 1 straight to its place;
 * segment j of step s leaves once it arrived at step s - 1. Step 0 waits
 * for the copies, except on a node of one trainer, whose block is its
 * part: it leaves from there at once. At the end the other local trainers
 * copy the whole result. */
#include "coll_ring.h"
#include "err.h"

#include <stdio.h>
#include <stdlib.h>

#include "ops.h"
#include "reduce.h"
#include "ring.h"

struct allgather {
    struct obd_coll_ring_core core; /* acc: the first trainer's result */
    /* The part of a node's only trainer: step 0 sends it from there while
     * the pool still copies it into the result. NULL otherwise. */
    const uint8_t *local;
    int nsteps;
    int send_step, recv_step;
    size_t send_seg, recv_seg;
};

static size_t ag_block_bytes(const struct allgather *c)
{
    return c->core.count / (size_t)c->core.n;
}

/* Segment j of the block sent (or received) at step s: its offset in the
 * result and its length. */
static size_t ag_seg(const struct allgather *c, int s, size_t j, int sending,
                     size_t *off)
{
    size_t bb = ag_block_bytes(c);
    int block = obd_ring_mod(c->core.r - s - (sending ? 0 : 1), c->core.n);
    size_t first = j * c->core.seg;
    *off = (size_t)block * bb + first;
    return bb - first < c->core.seg ? bb - first : c->core.seg;
}

static void ag_advance(const struct allgather *c, int *step, size_t *seg)
{
    if (++*seg == obd_ring_nseg(ag_block_bytes(c), c->core.seg)) {
        (*step)++;
        *seg = 0;
    }
}

static void ag_progress(struct obd_op *op)
{
    struct allgather *c = op->coll;
    struct obd_daemon *d = op->job->d;
    int right = obd_ring_mod(c->core.r + 1, c->core.n);
    if (c->core.phase == OBD_RING_PH_RING) {
        if (c->core.pieces == 0 && !c->core.load_traced) {
            c->core.load_traced = 1;
            obd_trace_span(d, "local gather", "ring",
                           (int)(op->job->id % OBD_TRACE_POOL), c->core.load_ns,
                           uv_hrtime(), NULL);
        }
        /* Step 0 sends this node's block: from the only trainer's part at
         * once, else once every local part is in the result. Later steps
         * forward what arrived, which lies in other blocks. */
        while (c->send_step < c->nsteps &&
               (c->send_step == 0
                    ? c->local != NULL || c->core.pieces == 0
                    : obd_coll_ring_passed(c->recv_step, c->recv_seg,
                                           c->send_step - 1, c->send_seg))) {
            size_t off;
            size_t len = ag_seg(c, c->send_step, c->send_seg, 1, &off);
            const uint8_t *from = c->send_step == 0 && c->local != NULL
                                      ? c->local + c->send_seg * c->core.seg
                                      : c->core.acc + off;
            if (obd_coll_ring_send(op, right, (uint32_t)c->send_step,
                                   (uint32_t)c->send_seg, from, len))
                return;
            obd_metric_add(&d->metrics, OBD_M_ALLGATHER_BYTES_SENT, len);
            ag_advance(c, &c->send_step, &c->send_seg);
        }
        if (c->core.pieces > 0 || c->send_step < c->nsteps ||
            c->recv_step < c->nsteps || !obd_op_idle(op))
            return;
        c->core.phase = OBD_RING_PH_STORE;
        if (obd_coll_ring_spread(op, &c->core, OBD_RING_PC_COPY, op->out,
                                 c->core.acc))
            return;
    }
    obd_coll_ring_store_progress(op, &c->core);
}

static int ag_start(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    int ls = job->local_size;
    size_t part = op->desc.count * obd_dtype_size(op->desc.dtype);
    struct allgather *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        obd_op_fail(op, OBD_E_NOMEM, 1, "out of memory");
        return OBD_E_NOMEM;
    }
    obd_coll_ring_core_init(&c->core, op,
                            part * (size_t)ls * (size_t)d->cfg.nodes, 1);
    op->coll = c;
    obd_metric_add(&d->metrics, OBD_M_LOGICAL_BYTES, c->core.count);
    c->core.zero_copy = 1;
    c->core.acc = op->out[0];
    if (ls == 1)
        c->local = op->data[0];
    c->nsteps = c->core.n - 1;
    c->core.load_ns = uv_hrtime();
    int pool = obd_coll_ring_use_pool(&c->core, part);
    size_t unit = pool ? c->core.seg : part;
    for (int i = 0; i < ls; i++) {
        uint8_t *to =
            c->core.acc + ((size_t)c->core.r * (size_t)ls + (size_t)i) * part;
        if ((uint8_t *)op->data[i] == to)
            continue; /* in place: the part is there */
        for (size_t b = 0; b < part; b += unit) {
            struct obd_coll_ring_piece *p =
                obd_coll_ring_piece_new(op, &c->core, OBD_RING_PC_COPY, 1);
            if (p != NULL) {
                p->begin = b;
                p->count = part - b < unit ? part - b : unit;
                p->acc = (uint8_t *)op->data[i] + b;
                p->ptr[0] = to + b;
            }
            if (obd_coll_ring_piece_go(op, p, pool))
                return OBD_E_NOMEM;
        }
    }
    ag_progress(op);
    return 0;
}

static void *ag_recv_dest(struct obd_op *op, int from,
                          const struct obd_frame *f, const char **why)
{
    struct allgather *c = op->coll;
    if (from != obd_ring_mod(c->core.r - 1, c->core.n)) {
        *why = "data from a node that is not the left neighbour";
        return NULL;
    }
    if (c->recv_step >= c->nsteps || f->step != (uint32_t)c->recv_step ||
        f->segment != c->recv_seg) {
        *why = "step or segment out of order";
        return NULL;
    }
    size_t off;
    size_t len = ag_seg(c, c->recv_step, c->recv_seg, 0, &off);
    if (f->len != len) {
        *why = "payload length differs from the segment's";
        return NULL;
    }
    return c->core.acc + off;
}

static void ag_recv_done(struct obd_op *op, int from, const struct obd_frame *f)
{
    struct allgather *c = op->coll;
    (void)from;
    (void)f;
    ag_advance(c, &c->recv_step, &c->recv_seg);
}

static void ag_waiting_on(const struct obd_op *op, char *buf, size_t len)
{
    const struct allgather *c = op->coll;
    if (c->core.phase == OBD_RING_PH_RING && c->core.pieces > 0)
        snprintf(buf, len, "the local copies on node %d's worker pool",
                 c->core.r);
    else if (c->core.phase >= OBD_RING_PH_STORE)
        snprintf(buf, len,
                 "the copies to the local trainers on node %d's worker pool",
                 c->core.r);
    else if (c->recv_step < c->nsteps)
        snprintf(buf, len, "data from node %d (step %d, segment %zu)",
                 obd_ring_mod(c->core.r - 1, c->core.n), c->recv_step,
                 c->recv_seg);
    else
        snprintf(buf, len, "node %d to take our data",
                 obd_ring_mod(c->core.r + 1, c->core.n));
}

static void ag_free(struct obd_op *op)
{
    struct allgather *c = op->coll;
    obd_coll_ring_core_fini(&c->core, op);
    free(c);
    op->coll = NULL;
}

static int ag_needs_node(const struct obd_op *op, int node)
{
    const struct allgather *c = op->coll;
    return (node == obd_ring_mod(c->core.r - 1, c->core.n) &&
            c->recv_step < c->nsteps) ||
           (node == obd_ring_mod(c->core.r + 1, c->core.n) &&
            c->send_step < c->nsteps);
}

/* An allgather reduces nothing. */
static void ag_normalize(struct obd_opdesc *d)
{
    d->redop = 0;
}

/* The input holds count elements, the result world * count. */
static int ag_check(const struct obd_opdesc *d, int world, uint64_t *bytes,
                    uint64_t *out_bytes, char *why, size_t len)
{
    uint64_t part;
    int rc = obd_coll_ring_check_typed(d, "allgather", (uint64_t)world, 0,
                                       &part, why, len);
    if (rc)
        return rc;
    *bytes = part;
    *out_bytes = part * (uint64_t)world;
    return 0;
}

/* The send may lie apart from the result, or exactly at this rank's
 * place in it (MPI's in place); any other overlap would have the ring
 * overwrite data that is still to be sent. */
static int ag_check_buffers(const void *data, uint64_t bytes, const void *out,
                            uint64_t out_bytes, int rank, char *why, size_t len)
{
    const uint8_t *s = data, *r = out;
    if (s + bytes <= r || r + out_bytes <= s || s == r + (uint64_t)rank * bytes)
        return 0;
    snprintf(why, len,
             "allgather: send overlaps recv other than at this "
             "rank's own place in it");
    return OBD_E_INVAL;
}

const struct obd_algo obd_algo_allgather = {
    .kind = OBCOMM_KIND_ALLGATHER,
    .name = "ring allgather",
    .normalize = ag_normalize,
    .check = ag_check,
    .check_buffers = ag_check_buffers,
    .start = ag_start,
    .recv_dest = ag_recv_dest,
    .recv_done = ag_recv_done,
    .progress = ag_progress,
    .free = ag_free,
    .waiting_on = ag_waiting_on,
    .needs_node = ag_needs_node,
};
