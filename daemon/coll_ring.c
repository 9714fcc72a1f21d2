/* The ring allreduce (reduce-scatter then allgather), pipelined, and the
 * core that every full-precision collective shares (coll_ring.h).
 *
 * The local trainers' buffers are reduced exactly into an accumulation
 * buffer first (one read of each), only that buffer travels, and the
 * result is written into every local trainer's buffer at the end; a
 * reduce-scatter of one trainer reads its input where the ring needs it
 * instead (struct ring, `local`). Each chunk is cut into segments of
 * segment_bytes: segment j of step s+1 leaves as soon as segment j of
 * step s has arrived and been reduced, so sending, receiving and reducing
 * overlap.
 *
 * The arithmetic runs on the worker pool when it is large
 * (OBD_RING_POOL_BYTES, in ops of at least OBD_RING_POOL_SEGMENTS
 * segments, coll.h), so that the loop thread mostly moves
 * frames: the local load in pieces of one segment of one chunk, queued in
 * the order the ring needs them (step 0 leaves, and the first partials
 * are reduced, while the rest still loads); every reduce-scatter segment
 * as one task; the final store (or AVG's division in place, or the
 * broadcast's copies) in pieces of one segment, which the pool threads
 * share. Smaller work runs inline, as a pool hop would cost more than the
 * arithmetic; both kinds mix freely in one op, since they go through the
 * same pieces (struct obd_coll_ring_piece) and the same bookkeeping
 * (piece_done). A received reduce-scatter segment waits in a buffer of
 * its own until its reduction ends, so frames keep arriving while earlier
 * segments are still being reduced; the segment leaves again (step s+1)
 * only once it is reduced. An op keeps at most pool_depth() loads and as
 * many reductions on the pool; past that, a reduction, or a load the ring
 * needs now, runs on the loop ("caller runs"), which is what keeps the
 * held buffers few when the pool falls behind the wire.
 *
 * Events (a piece done, a frame in) record what happened and start the
 * reductions that became possible; ring_progress makes every other
 * transition. A failed op is answered only once no piece touches its
 * memory (job.h), and nothing a piece touches is freed before the op.
 */
#include "coll_ring.h"
#include "err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "reduce.h"
#include "ring.h"

/* ---- the core: pieces of arithmetic, inline or on the worker pool ---- */

struct obd_coll_ring_piece *
obd_coll_ring_piece_new(struct obd_op *op, struct obd_coll_ring_core *core,
                        enum obd_coll_ring_piece_kind kind, int nptr)
{
    struct obd_coll_ring_piece *p =
        calloc(1, sizeof(*p) + (size_t)nptr * sizeof(void *));
    if (p == NULL)
        return NULL;
    p->op = op;
    p->core = core;
    p->kind = kind;
    p->dtype = (obcomm_dtype_t)op->desc.dtype;
    p->redop = (obcomm_op_t)op->desc.redop;
    p->nptr = nptr;
    return p;
}

static void piece_run(struct obd_coll_ring_piece *p)
{
    p->begin_ns = uv_hrtime();
    switch (p->kind) {
    case OBD_RING_PC_LOAD:
        obd_reduce_load(p->dtype, p->redop, p->acc, (const void *const *)p->ptr,
                        p->nptr, p->count);
        break;
    case OBD_RING_PC_ACC:
        if (p->local != NULL) {
            const void *const src[2] = {p->local, p->in};
            obd_reduce_load(p->dtype, p->redop, p->acc, src, 2, p->count);
        } else {
            obd_reduce_acc(p->dtype, p->redop, p->acc, p->in, p->count);
        }
        /* The last reduction of our chunk in a zero-copy AVG: the
         * segment is still in cache. */
        if (p->divisor > 0)
            obd_reduce_div_in_place(p->dtype, p->acc, p->count, p->divisor);
        break;
    case OBD_RING_PC_STORE:
        obd_reduce_store_many(p->dtype, p->redop, p->ptr, p->nptr, p->acc,
                              p->count, p->divisor);
        break;
    case OBD_RING_PC_COPY: /* an allgather's part may be in place: memmove */
        for (int i = 0; i < p->nptr; i++)
            memmove(p->ptr[i], p->acc, p->count);
        break;
    }
    p->end_ns = uv_hrtime();
}

static void pool_run(uv_work_t *req)
{
    piece_run(container_of(req, struct obd_coll_ring_piece, req));
}

/* Records that a piece is done (on the loop thread): the algorithm
 * records an ACC or LOAD piece (core->piece_done), and one fewer load,
 * store or copy piece is left. Makes no transition. */
static void piece_done(struct obd_coll_ring_core *c,
                       const struct obd_coll_ring_piece *p)
{
    int copy = p->kind == OBD_RING_PC_COPY;
    int store = p->kind == OBD_RING_PC_STORE;
    size_t esz = copy ? 1 : obd_dtype_acc_size(p->dtype);
    size_t dsz = copy ? 1 : obd_dtype_size(p->dtype);
    size_t ndst = store || copy ? (size_t)p->nptr : 1;
    obd_metric_add(&c->d->metrics, OBD_M_LOCAL_BYTES_WRITTEN,
                   p->count * ndst * (store ? dsz : esz));
    if (p->kind == OBD_RING_PC_ACC || p->kind == OBD_RING_PC_LOAD)
        c->piece_done(c, p);
    if (p->kind != OBD_RING_PC_ACC)
        c->pieces--;
}

static void pool_done(uv_work_t *req, int status)
{
    struct obd_coll_ring_piece *p =
        container_of(req, struct obd_coll_ring_piece, req);
    struct obd_op *op = p->op;
    struct obd_coll_ring_core *c = p->core;
    (void)status; /* nothing cancels these tasks */
    piece_done(c, p);
    if (c->d->trace.f != NULL) {
        static const char *const names[] = {"load", "reduce", "store", "copy"};
        char args[96];
        snprintf(args, sizeof(args), "\"seq\":%llu,\"begin\":%zu,\"count\":%zu",
                 (unsigned long long)op->seq, p->begin, p->count);
        obd_trace_span(c->d, names[p->kind], "reduce", OBD_TRACE_POOL,
                       p->begin_ns, p->end_ns, args);
    }
    free(p);
    obd_op_task_end(op);
}

int obd_coll_ring_piece_go(struct obd_op *op, struct obd_coll_ring_piece *p,
                           int pool)
{
    int rc = p == NULL ? OBD_E_NOMEM : 0;
    const char *what = p == NULL ? "allocate" : "queue";
    struct obd_coll_ring_core *c = p != NULL ? p->core : NULL;
    if (rc == 0 && !pool) {
        if (p->kind != OBD_RING_PC_ACC)
            c->pieces++;
        piece_run(p);
        piece_done(c, p);
        free(p);
        return 0;
    }
    if (rc == 0)
        rc = uv_queue_work(&c->d->loop, &p->req, pool_run, pool_done)
                 ? OBD_E_NOMEM
                 : 0;
    if (rc) {
        free(p);
        obd_op_fail(op, OBD_E_NOMEM, 1,
                    "op %llu of job %s on node %d: cannot %s reduction work",
                    (unsigned long long)op->seq, op->job->name,
                    (int)op->job->d->cfg.rank, what);
        return rc;
    }
    if (p->kind != OBD_RING_PC_ACC)
        c->pieces++;
    p->pooled = 1;
    obd_op_task_begin(op);
    return 0;
}

int obd_coll_ring_use_pool(const struct obd_coll_ring_core *c, size_t bytes)
{
    return c->count >= OBD_RING_POOL_SEGMENTS * c->seg &&
           bytes >= OBD_RING_POOL_BYTES;
}

/* Two per thread, so that a thread that ends a piece finds the next one
 * queued instead of waiting for the loop to queue it. */
size_t obd_coll_ring_pool_depth(const struct obd_coll_ring_core *c)
{
    return 2 * (size_t)(c->d->threads > 0 ? c->d->threads : 1);
}

void obd_coll_ring_store_progress(struct obd_op *op,
                                  struct obd_coll_ring_core *c)
{
    if (c->phase != OBD_RING_PH_STORE || c->pieces > 0)
        return;
    c->phase = OBD_RING_PH_DONE;
    obd_op_finish(op);
}

int obd_coll_ring_spread(struct obd_op *op, struct obd_coll_ring_core *c,
                         enum obd_coll_ring_piece_kind kind, void *const *dst,
                         const uint8_t *src)
{
    int ls = op->job->local_size;
    int copy = kind == OBD_RING_PC_COPY;
    size_t dsz = copy ? 1 : obd_dtype_size(op->desc.dtype);
    int pool = obd_coll_ring_use_pool(c, c->count * c->esz);
    size_t unit = pool ? c->seg : c->count;
    int nptr = 0;
    void *ptr[OBD_MAX_LOCAL];
    for (int i = 0; i < ls; i++)
        if (!copy || dst[i] != src)
            ptr[nptr++] = dst[i];
    if (copy && nptr == 0)
        return 0;
    for (size_t b = 0; b < c->count; b += unit) {
        struct obd_coll_ring_piece *p =
            obd_coll_ring_piece_new(op, c, kind, nptr);
        if (p != NULL) {
            p->begin = b;
            p->count = c->count - b < unit ? c->count - b : unit;
            p->divisor = c->n * ls;
            p->acc = copy ? (uint8_t *)src + b : c->acc + b * c->esz;
            for (int i = 0; i < nptr; i++)
                p->ptr[i] = (uint8_t *)ptr[i] + b * dsz;
        }
        if (obd_coll_ring_piece_go(op, p, pool))
            return 1;
    }
    return 0;
}

static const char *send_error(int rc)
{
    return rc == OBD_E_PEER_LOST ? "link is down" : obd_err_str(rc);
}

int obd_coll_ring_send(struct obd_op *op, int to, uint32_t step,
                       uint32_t segment, const void *payload, size_t len)
{
    int rc = obd_op_send(op, to, step, segment, payload, (uint32_t)len);
    if (rc)
        obd_op_fail(op, OBD_E_PEER_LOST, 1,
                    "op %llu of job %s: cannot send to node %d: %s",
                    (unsigned long long)op->seq, op->job->name, to,
                    send_error(rc));
    return rc;
}

void obd_coll_ring_core_init(struct obd_coll_ring_core *c, struct obd_op *op,
                             size_t count, size_t esz)
{
    struct obd_daemon *d = op->job->d;
    c->d = d;
    c->n = d->cfg.nodes;
    c->r = (int)d->cfg.rank;
    c->count = count;
    c->esz = esz;
    c->seg = (size_t)d->cfg.segment_bytes / esz;
    if (c->seg == 0)
        c->seg = 1;
    c->phase = OBD_RING_PH_RING;
}

void obd_coll_ring_core_fini(struct obd_coll_ring_core *c, struct obd_op *op)
{
    if (!c->zero_copy)
        obd_op_scratch_put(op, c->acc, c->acc_bytes);
}

int obd_coll_ring_check_typed(const struct obd_opdesc *d, const char *name,
                              uint64_t n, int reduces, uint64_t *bytes,
                              char *why, size_t len)
{
    if (!obd_dtype_valid((int)d->dtype)) {
        snprintf(why, len, "unknown dtype %u", d->dtype);
        return OBD_E_INVAL;
    }
    if (reduces && !obd_op_valid((int)d->redop)) {
        snprintf(why, len, "unknown reduction %u", d->redop);
        return OBD_E_INVAL;
    }
    size_t dsz = obd_dtype_size((obcomm_dtype_t)d->dtype);
    if (d->count == 0) {
        snprintf(why, len, "%s of 0 elements", name);
        return OBD_E_INVAL;
    }
    if (d->count > UINT64_MAX / n / dsz) {
        snprintf(why, len, "%s of %llu elements overflows", name,
                 (unsigned long long)d->count);
        return OBD_E_INVAL;
    }
    *bytes = d->count * dsz;
    return 0;
}

/* ---- ring allreduce and reduce-scatter ---- */

/* The local load of one segment of one chunk. */
enum load_state {
    LD_WAITING, /* not begun: the loop may still load it itself */
    LD_QUEUED,  /* a piece on the pool loads it */
    LD_DONE,
};

/* The state of a ring allreduce or reduce-scatter. */
struct ring {
    struct obd_coll_ring_core core;
    /* The input of a node's only trainer, which the op holds mapped, when
     * the ring reads it directly. A reduce-scatter whose dtype accumulates
     * in itself has no local load: step 0 sends straight from `local`,
     * and each reduction computes acc = local op received in one pass
     * (obd_reduce_load of the two), the same operands in the same order
     * as a load followed by obd_reduce_acc, without first copying the
     * whole input into acc. NULL otherwise. */
    const uint8_t *local;
    size_t acc_queued; /* reduce-scatter reductions on the pool */
    int nsteps;
    /* A reduce-scatter turns the ring by one chunk (chunk_range), so that
     * each node ends with the reduction of its own ranks' block. */
    int rot;
    int send_step, recv_step;
    size_t send_seg, recv_seg;
    /* Reduce-scatter segment (s, j), s < n-1, has index s * maxseg + j.
     * held[i] is its received data until its reduction starts; reduced[i]
     * is 1 once acc holds it. The reduction cursor (red_step, red_seg)
     * trails the receive cursor: reductions start in order, each once
     * acc holds the local load of its segment. load[c * maxseg + j]
     * (enum load_state) says whether segment j of chunk c is loaded (step
     * 0 sends it, a received partial is added to it); the load cursor
     * (load_j, load_k) walks them in the order the ring needs them
     * (load_more), load_left counts those not done. */
    size_t maxseg;
    uint8_t **held;
    uint8_t *reduced;
    uint8_t *load;
    size_t load_j, load_left;
    int load_k;
    int red_step;
    size_t red_seg;
    /* Segment buffers, one segment each: all of them (freed with the
     * ring, whatever happened to the op) and a stack of the free ones.
     * One is taken per reduce-scatter frame and comes back when its
     * reduction ends, so there are at most as many as reduce-scatter
     * segments ((n-1)/n of the accumulator) and, while the pool keeps
     * pace with the wire, a few. */
    uint8_t **bufs, **spare;
    size_t nbufs, nspare, capbufs;
    uint8_t *rx; /* handed out by recv_dest for the frame coming in */
};

/* Runs when the op is freed, so no piece and no receive uses anything
 * here any more: every segment buffer goes back to the daemon, whether it
 * is free, held or was handed to a receive that never completed. */
void obd_coll_ring_free(struct obd_op *op)
{
    struct ring *c = op->coll;
    obd_coll_ring_core_fini(&c->core, op);
    for (size_t i = 0; i < c->nbufs; i++)
        obd_op_segbuf_put(op, c->bufs[i], c->core.seg * c->core.esz);
    free(c->bufs);
    free(c->spare);
    free(c->held);
    free(c->reduced);
    free(c->load);
    free(c);
    op->coll = NULL;
}

/* A free segment buffer, taking one from the daemon's when none is;
 * NULL without memory. */
static uint8_t *buf_get(struct obd_op *op)
{
    struct ring *c = op->coll;
    if (c->nspare > 0)
        return c->spare[--c->nspare];
    if (c->nbufs == c->capbufs) {
        size_t cap = c->capbufs ? 2 * c->capbufs : 4;
        uint8_t **b = realloc(c->bufs, cap * sizeof(*b));
        if (b == NULL)
            return NULL;
        c->bufs = b;
        uint8_t **s = realloc(c->spare, cap * sizeof(*s));
        if (s == NULL)
            return NULL;
        c->spare = s;
        c->capbufs = cap;
    }
    uint8_t *p = obd_op_segbuf_get(op, c->core.seg * c->core.esz);
    if (p != NULL)
        c->bufs[c->nbufs++] = p;
    return p;
}

/* An ACC or LOAD piece ended (core->piece_done): a reduce-scatter
 * segment is reduced and its buffer free again, or a segment is loaded. */
static void ring_piece_done(struct obd_coll_ring_core *core,
                            const struct obd_coll_ring_piece *p)
{
    struct ring *c = container_of(core, struct ring, core);
    if (p->kind == OBD_RING_PC_ACC) {
        c->acc_queued -= (size_t)p->pooled;
        c->reduced[p->idx] = 1;
        c->spare[c->nspare++] = (uint8_t *)p->in;
        return;
    }
    c->load[p->idx] = LD_DONE;
    c->load_left--;
}

/* A world of one rank (one node, one trainer): an op over one operand is
 * the operand, and the result is the input bit for bit, whatever the
 * dtype and the op (AVG divides by 1; docs/c-api.md). So the allreduce
 * leaves the buffer as it is: no load and store run over it (they would
 * cost two passes, and make a signalling NaN quiet). A reduce-scatter
 * moves its input to recv unless it is there already, in one memmove, as
 * recv may overlap the input anywhere. */
static int one_rank(struct obd_op *op)
{
    struct ring *c = op->coll;
    size_t bytes = c->core.count * obd_dtype_size(op->desc.dtype);
    obd_metric_add(&c->core.d->metrics, OBD_M_LOGICAL_BYTES, bytes);
    c->core.zero_copy = 1; /* no accumulator */
    c->core.phase = OBD_RING_PH_STORE;
    if (op->desc.kind == OBCOMM_KIND_REDUCE_SCATTER &&
        op->out[0] != op->data[0]) {
        struct obd_coll_ring_piece *p =
            obd_coll_ring_piece_new(op, &c->core, OBD_RING_PC_COPY, 1);
        if (p != NULL) {
            p->count = bytes;
            p->acc = op->data[0];
            p->ptr[0] = op->out[0];
        }
        if (obd_coll_ring_piece_go(
                op, p,
                obd_coll_ring_use_pool(&c->core, c->core.count * c->core.esz)))
            return OBD_E_NOMEM;
    }
    obd_coll_ring_store_progress(op, &c->core);
    return 0;
}

/* Element range [*b, *e) of ring chunk `chunk` (ring.h). A reduce-scatter
 * (rot = n - 1) maps ring chunk k to block k - 1: its count is a multiple
 * of n, so every chunk has the same size, and node r, which ends the
 * reduce-scatter holding ring chunk r + 1, holds block r, the part of its
 * own ranks. */
static void chunk_range(const struct ring *c, int chunk, size_t *b, size_t *e)
{
    obd_ring_chunk(c->core.count, c->core.n,
                   obd_ring_mod(chunk + c->rot, c->core.n), b, e);
}

static size_t step_chunk_elems(const struct ring *c, int s, int sending,
                               size_t *begin)
{
    size_t b, e;
    int chunk = sending ? obd_ring_send_chunk(c->core.r, c->core.n, s)
                        : obd_ring_recv_chunk(c->core.r, c->core.n, s);
    chunk_range(c, chunk, &b, &e);
    *begin = b;
    return e - b;
}

/* Moves a cursor past steps that carry nothing (chunks of zero elements
 * when count < n). */
static void settle(const struct ring *c, int *step, size_t *seg, int sending)
{
    size_t begin;
    while (*step < c->nsteps &&
           *seg >= obd_ring_nseg(step_chunk_elems(c, *step, sending, &begin),
                                 c->core.seg)) {
        (*step)++;
        *seg = 0;
    }
}

/* Segment j of step s: its element offset and length. */
static size_t seg_range(const struct ring *c, int s, size_t j, int sending,
                        size_t *off)
{
    size_t begin;
    size_t elems = step_chunk_elems(c, s, sending, &begin);
    size_t first = j * c->core.seg;
    *off = begin + first;
    return elems - first < c->core.seg ? elems - first : c->core.seg;
}

static size_t seg_index(const struct ring *c, int s, size_t j)
{
    return (size_t)s * c->maxseg + j;
}

/* ---- the local load ---- */

/* Loads segment j of chunk `chunk` (inline, or a piece on the pool). On
 * failure fails the op and returns non-zero. */
static int load_seg(struct obd_op *op, int chunk, size_t j, int pool)
{
    struct ring *c = op->coll;
    int ls = op->job->local_size;
    size_t dsz = obd_dtype_size(op->desc.dtype);
    size_t b, e;
    chunk_range(c, chunk, &b, &e);
    b += j * c->core.seg;
    struct obd_coll_ring_piece *p =
        obd_coll_ring_piece_new(op, &c->core, OBD_RING_PC_LOAD, ls);
    if (p != NULL) {
        p->begin = b;
        p->count = e - b < c->core.seg ? e - b : c->core.seg;
        p->acc = c->core.acc + b * c->core.esz;
        p->idx = seg_index(c, chunk, j);
        for (int i = 0; i < ls; i++)
            p->ptr[i] = (uint8_t *)op->data[i] + b * dsz;
        c->load[p->idx] = LD_QUEUED;
    }
    return obd_coll_ring_piece_go(op, p, pool);
}

/* Queues the local load in pieces of one segment of one chunk, in the
 * order the ring needs them: segment 0 of the chunk step 0 sends, of the
 * one it receives, of the one step 1 receives, ..., then segment 1, and
 * so on. When the accumulator is large, as many pieces as the pool has
 * threads are queued at a time (the next ones as these end), so that the
 * reductions of arriving partials do not queue behind the whole load;
 * otherwise the whole load runs inline now. On failure fails the op and
 * returns non-zero. */
static int load_more(struct obd_op *op)
{
    struct ring *c = op->coll;
    int pool = obd_coll_ring_use_pool(&c->core, c->core.count * c->core.esz);
    while (c->load_j < c->maxseg &&
           (!pool || c->core.pieces < obd_coll_ring_pool_depth(&c->core))) {
        int chunk = obd_ring_mod(c->core.r - c->load_k, c->core.n);
        size_t j = c->load_j;
        size_t b, e;
        chunk_range(c, chunk, &b, &e);
        if (++c->load_k == c->core.n) {
            c->load_k = 0;
            c->load_j++;
        }
        if (j * c->core.seg < e - b &&
            c->load[seg_index(c, chunk, j)] == LD_WAITING &&
            load_seg(op, chunk, j, pool))
            return 1;
    }
    return 0;
}

/* 1 if segment j of chunk `chunk` is loaded. A segment that the pool has
 * not been given yet is loaded here, inline: the ring needs it now (the
 * caller runs, as for reductions). 0 also when that failed the op. */
static int loaded_now(struct obd_op *op, int chunk, size_t j)
{
    struct ring *c = op->coll;
    size_t idx = seg_index(c, chunk, j);
    if (c->load[idx] == LD_WAITING && load_seg(op, chunk, j, 0))
        return 0;
    return c->load[idx] == LD_DONE;
}

/* Starts the reductions of the reduce-scatter segments received so far,
 * in order, each once its segment is loaded. A large one goes to the pool
 * unless as many of this op's as the pool has threads are already there:
 * the loop thread then reduces it itself ("caller runs"). The link reads
 * every frame that arrives, so without this a pool that falls behind the
 * wire (a busy machine) would have the op hold up to a whole chunk per
 * step in fresh buffers; with it the loop slows its reading down as it
 * did when it reduced everything, and holds a few buffers. On failure the
 * op has failed and this returns non-zero. */
static int reduce_received(struct obd_op *op)
{
    struct ring *c = op->coll;
    while (c->red_step < c->core.n - 1 &&
           obd_coll_ring_passed(c->recv_step, c->recv_seg, c->red_step,
                                c->red_seg)) {
        int chunk = obd_ring_recv_chunk(c->core.r, c->core.n, c->red_step);
        if (!loaded_now(op, chunk, c->red_seg))
            return op->state != OBD_OP_RUN;
        size_t off;
        size_t len = seg_range(c, c->red_step, c->red_seg, 0, &off);
        size_t idx = seg_index(c, c->red_step, c->red_seg);
        struct obd_coll_ring_piece *p =
            obd_coll_ring_piece_new(op, &c->core, OBD_RING_PC_ACC, 0);
        if (p != NULL) {
            p->begin = off;
            p->count = len;
            p->acc = c->core.acc + off * c->core.esz;
            p->in = c->held[idx];
            p->local = c->local != NULL ? c->local + off * c->core.esz : NULL;
            p->idx = idx;
            c->held[idx] = NULL; /* the piece has it; it stays in bufs */
            /* A zero-copy AVG divides where the sum is made, at the last
             * reduction of our chunk, so the allgather carries averages
             * and no pass over the trainer's whole tensor follows. */
            if (c->core.zero_copy && op->desc.redop == OBCOMM_AVG &&
                c->red_step == c->core.n - 2)
                p->divisor = c->core.n * op->job->local_size;
        }
        c->red_seg++;
        settle(c, &c->red_step, &c->red_seg, 0);
        int pool = obd_coll_ring_use_pool(&c->core, len * c->core.esz) &&
                   c->acc_queued < obd_coll_ring_pool_depth(&c->core);
        if (obd_coll_ring_piece_go(op, p, pool))
            return 1;
        c->acc_queued += (size_t)pool;
    }
    return 0;
}

/* Sends what is ready: segment j of step 0 once it is loaded, of step
 * s > 0 once it has arrived at step s-1 and, in the reduce-scatter, been
 * reduced. */
static int ring_send(struct obd_op *op)
{
    struct ring *c = op->coll;
    struct obd_daemon *d = op->job->d;
    int right = obd_ring_mod(c->core.r + 1, c->core.n);
    while (c->send_step < c->nsteps) {
        int s = c->send_step;
        size_t j = c->send_seg;
        if (s == 0 && !loaded_now(op, c->core.r, j)) {
            if (op->state != OBD_OP_RUN)
                return 1;
            break;
        }
        if (s > 0 && s - 1 < c->core.n - 1 &&
            !c->reduced[seg_index(c, s - 1, j)])
            break;
        if (s > 0 && !obd_coll_ring_passed(c->recv_step, c->recv_seg, s - 1, j))
            break;
        size_t off;
        size_t len = seg_range(c, s, j, 1, &off);
        const uint8_t *from =
            s == 0 && c->local != NULL ? c->local : c->core.acc;
        if (obd_coll_ring_send(op, right, (uint32_t)s, (uint32_t)j,
                               from + off * c->core.esz, len * c->core.esz))
            return 1;
        obd_metric_add(&d->metrics,
                       op->desc.kind == OBCOMM_KIND_REDUCE_SCATTER
                           ? OBD_M_REDUCE_SCATTER_BYTES_SENT
                           : OBD_M_ALLREDUCE_BYTES_SENT,
                       len * c->core.esz);
        c->send_seg++;
        settle(c, &c->send_step, &c->send_seg, 1);
    }
    return 0;
}

/* A reduce-scatter's store: trainer i of node r gets the m = desc.count
 * elements of acc from (r * local_size + i) * m on, converted (and AVG's
 * division) as the allreduce's store does; in pieces of one segment on
 * the pool when large. On failure fails the op and returns non-zero. */
static int store_blocks(struct obd_op *op)
{
    struct ring *c = op->coll;
    int ls = op->job->local_size;
    size_t m = op->desc.count;
    size_t dsz = obd_dtype_size(op->desc.dtype);
    int pool = obd_coll_ring_use_pool(&c->core, m * (size_t)ls * c->core.esz);
    size_t unit = pool ? c->core.seg : m;
    for (int i = 0; i < ls; i++) {
        size_t first = ((size_t)c->core.r * (size_t)ls + (size_t)i) * m;
        for (size_t b = 0; b < m; b += unit) {
            struct obd_coll_ring_piece *p =
                obd_coll_ring_piece_new(op, &c->core, OBD_RING_PC_STORE, 1);
            if (p != NULL) {
                p->begin = first + b;
                p->count = m - b < unit ? m - b : unit;
                p->divisor = c->core.n * ls;
                p->acc = c->core.acc + (first + b) * c->core.esz;
                p->ptr[0] = (uint8_t *)op->out[i] + b * dsz;
            }
            if (obd_coll_ring_piece_go(op, p, pool))
                return 1;
        }
    }
    return 0;
}

/* The one transition function of the allreduce: ring (with the load),
 * store, done. Runs from start and whenever the op is posted (a piece
 * done, a frame in or out). */
void obd_coll_ring_progress(struct obd_op *op)
{
    struct ring *c = op->coll;
    if (c->core.phase == OBD_RING_PH_RING) {
        if (load_more(op) || reduce_received(op) || ring_send(op))
            return;
        if (!c->core.zero_copy && c->local == NULL && !c->core.load_traced &&
            c->load_left == 0) {
            c->core.load_traced = 1;
            obd_trace_span(c->core.d, "local reduce", "ring",
                           (int)(op->job->id % OBD_TRACE_POOL), c->core.load_ns,
                           uv_hrtime(), NULL);
        }
        /* Loaded, every frame out and in, every reduction done (it held a
         * reference), and no write still reads acc. */
        if (c->load_left > 0 || c->send_step < c->nsteps ||
            c->recv_step < c->nsteps || !obd_op_idle(op))
            return;
        c->core.phase = OBD_RING_PH_STORE;
        int rc = 0;
        if (op->desc.kind == OBCOMM_KIND_REDUCE_SCATTER)
            rc = store_blocks(op);
        else if (!c->core.zero_copy) /* zero-copy: the result is in place */
            rc = obd_coll_ring_spread(op, &c->core, OBD_RING_PC_STORE, op->data,
                                      NULL);
        if (rc)
            return;
    }
    obd_coll_ring_store_progress(op, &c->core);
}

int obd_coll_ring_start(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    obcomm_dtype_t dt = (obcomm_dtype_t)op->desc.dtype;
    size_t esz = obd_dtype_acc_size(dt);
    /* A reduce-scatter reduces world * count elements and stops after the
     * allreduce's first half (nsteps below). */
    int rs = op->desc.kind == OBCOMM_KIND_REDUCE_SCATTER;
    size_t count = op->desc.count;
    if (rs)
        count *= (size_t)d->cfg.nodes * (size_t)job->local_size;
    struct ring *c = calloc(1, sizeof(*c));
    if (c != NULL) {
        obd_coll_ring_core_init(&c->core, op, count, esz);
        c->core.piece_done = ring_piece_done;
        op->coll = c;
    }
    if (c != NULL && c->core.n == 1 && job->local_size == 1)
        return one_rank(op);
    if (c != NULL && rs)
        c->rot = c->core.n - 1;
    /* One trainer and a dtype that accumulates in itself: the ring runs in
     * the trainer's shared memory, with no copy in or out. The op's
     * reference keeps the buffer mapped even if the trainer leaves. A
     * reduce-scatter only reads its input. */
    if (c != NULL && !rs && job->local_size == 1 && c->core.n > 1 &&
        esz == obd_dtype_size(dt)) {
        c->core.acc = op->data[0];
        c->core.zero_copy = 1;
    }
    if (c != NULL && rs && job->local_size == 1 && c->core.n > 1 &&
        esz == obd_dtype_size(dt))
        c->local = op->data[0];
    if (c != NULL) {
        size_t b, e;
        obd_ring_chunk(c->core.count, c->core.n, 0, &b,
                       &e); /* the largest chunk */
        c->maxseg = obd_ring_nseg(e - b, c->core.seg);
    }
    size_t nidx = c ? (size_t)c->core.n * c->maxseg + 1 : 0;
    if (c == NULL ||
        (!c->core.zero_copy &&
         (c->core.acc = obd_op_scratch_get(op, c->core.count * esz,
                                           &c->core.acc_bytes)) == NULL) ||
        (c->held = calloc(nidx, sizeof(*c->held))) == NULL ||
        (c->reduced = calloc(nidx, 1)) == NULL ||
        (c->load = calloc(nidx, 1)) == NULL) {
        obd_op_fail(op, OBD_E_NOMEM, 1,
                    "op %llu of job %s: no memory for %zu elements on node %d",
                    (unsigned long long)op->seq, job->name, count,
                    c ? c->core.r : -1);
        return OBD_E_NOMEM;
    }
    obd_metric_add(&d->metrics, OBD_M_LOGICAL_BYTES,
                   c->core.count * obd_dtype_size(dt));

    c->nsteps = c->core.n > 1 ? (rs ? 1 : 2) * (c->core.n - 1) : 0;
    settle(c, &c->send_step, &c->send_seg, 1);
    settle(c, &c->recv_step, &c->recv_seg, 0);
    settle(c, &c->red_step, &c->red_seg, 0);
    /* Frames that arrive before their segment is loaded wait in their
     * buffers (reduce_received). */
    c->core.load_ns = uv_hrtime();
    int no_load = c->core.zero_copy || c->local != NULL;
    for (int k = 0; k < c->core.n; k++) {
        size_t b, e;
        chunk_range(c, k, &b, &e);
        size_t nseg = obd_ring_nseg(e - b, c->core.seg);
        c->load_left += no_load ? 0 : nseg;
        if (no_load)
            memset(c->load + seg_index(c, k, 0), LD_DONE, nseg);
    }
    if (no_load)
        c->load_j = c->maxseg; /* nothing to load */
    obd_coll_ring_progress(op);
    return 0;
}

void *obd_coll_ring_recv_dest(struct obd_op *op, int from,
                              const struct obd_frame *f, const char **why)
{
    struct ring *c = op->coll;
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
    size_t len = seg_range(c, c->recv_step, c->recv_seg, 0, &off);
    if (f->len != len * c->core.esz) {
        *why = "payload length differs from the segment's";
        return NULL;
    }
    if (c->recv_step >= c->core.n - 1)
        return c->core.acc +
               off * c->core.esz; /* allgather: straight into acc */
    /* A receive that did not complete left its buffer in rx: reuse it. */
    if (c->rx == NULL && (c->rx = buf_get(op)) == NULL) {
        *why = "no memory for a segment buffer";
        return NULL;
    }
    return c->rx;
}

void obd_coll_ring_recv_done(struct obd_op *op, int from,
                             const struct obd_frame *f)
{
    struct ring *c = op->coll;
    (void)from;
    (void)f;
    if (c->recv_step < c->core.n - 1) {
        c->held[seg_index(c, c->recv_step, c->recv_seg)] = c->rx;
        c->rx = NULL;
    }
    c->recv_seg++;
    settle(c, &c->recv_step, &c->recv_seg, 0);
    /* Its reduction starts now (inline, or queued on the pool) unless its
     * segment is still loading; sending waits for progress, which runs
     * when the caller drops the receive's reference. A failure here has
     * failed the op. */
    (void)reduce_received(op);
}

void obd_coll_ring_waiting_on(const struct obd_op *op, char *buf, size_t len)
{
    const struct ring *c = op->coll;
    int s = c->send_step;
    if (c->core.phase == OBD_RING_PH_RING && c->load_left > 0)
        snprintf(buf, len, "the local reduction on node %d's worker pool",
                 c->core.r);
    else if (c->core.phase >= OBD_RING_PH_STORE)
        snprintf(buf, len, "the store of the result on node %d's worker pool",
                 c->core.r);
    else if (c->recv_step < c->nsteps)
        snprintf(buf, len, "data from node %d (step %d, segment %zu)",
                 obd_ring_mod(c->core.r - 1, c->core.n), c->recv_step,
                 c->recv_seg);
    else if (s < c->nsteps && s > 0 && s - 1 < c->core.n - 1 &&
             !c->reduced[seg_index(c, s - 1, c->send_seg)])
        snprintf(buf, len,
                 "a reduction on node %d's worker pool (step %d, segment %zu)",
                 c->core.r, s - 1, c->send_seg);
    else
        snprintf(buf, len, "node %d to take our data",
                 obd_ring_mod(c->core.r + 1, c->core.n));
}

int obd_coll_ring_needs_node(const struct obd_op *op, int node)
{
    const struct ring *c = op->coll;
    return (node == obd_ring_mod(c->core.r - 1, c->core.n) &&
            c->recv_step < c->nsteps) ||
           (node == obd_ring_mod(c->core.r + 1, c->core.n) &&
            c->send_step < c->nsteps);
}

/* One buffer of count elements, reduced in place. */
static int allreduce_check(const struct obd_opdesc *d, int world,
                           uint64_t *bytes, uint64_t *out_bytes, char *why,
                           size_t len)
{
    (void)world;
    int rc = obd_coll_ring_check_typed(d, "allreduce", 1, 1, bytes, why, len);
    if (rc == 0)
        *out_bytes = 0;
    return rc;
}

const struct obd_algo obd_algo_allreduce = {
    .kind = OBCOMM_KIND_ALLREDUCE,
    .name = "ring allreduce",
    .check = allreduce_check,
    .start = obd_coll_ring_start,
    .recv_dest = obd_coll_ring_recv_dest,
    .recv_done = obd_coll_ring_recv_done,
    .progress = obd_coll_ring_progress,
    .free = obd_coll_ring_free,
    .waiting_on = obd_coll_ring_waiting_on,
    .needs_node = obd_coll_ring_needs_node,
};
