/* Full-precision collectives among nodes: pipelined ring allreduce
 * (reduce-scatter then allgather), reduce-scatter (the allreduce's first
 * half), allgather, pipelined chain broadcast, barrier.
 *
 * The local trainers' buffers are reduced exactly into an accumulation
 * buffer first (one read of each), only that buffer travels, and the
 * result is written into every local trainer's buffer at the end; a
 * reduce-scatter of one trainer reads its input where the ring needs it
 * instead (struct obd_coll, `local`). Each
 * chunk is cut into segments of segment_bytes: segment j of step s+1 leaves
 * as soon as segment j of step s has arrived and been reduced, so sending,
 * receiving and reducing overlap.
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
 * same pieces (struct piece) and the same bookkeeping (piece_done). A
 * received reduce-scatter segment waits in a buffer of its own until its
 * reduction ends, so frames keep arriving while earlier segments are
 * still being reduced; the segment leaves again (step s+1) only once it
 * is reduced. An op keeps at most pool_depth() loads and as many
 * reductions on the pool; past that, a reduction, or a load the ring
 * needs now, runs on the loop ("caller runs"), which is what keeps the
 * held buffers few when the pool falls behind the wire.
 *
 * Events (a piece done, a frame in) record what happened and start the
 * reductions that became possible; ring_progress and bcast_progress make
 * every other transition. A failed op is answered only once no piece
 * touches its memory (job.h), and nothing a piece touches is freed
 * before the op.
 */
#include "coll.h"
#include "err.h"

#include <obcomm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "reduce.h"
#include "ring.h"

/* Phases of a ring allreduce or a broadcast, in order. */
enum phase {
    PH_RING,  /* the local load, frames, reduce-scatter reductions */
    PH_STORE, /* the result goes to the local trainers */
    PH_DONE,
};

/* The local load of one segment of one chunk. */
enum load_state {
    LD_WAITING, /* not begun: the loop may still load it itself */
    LD_QUEUED,  /* a piece on the pool loads it */
    LD_DONE,
};

struct obd_coll {
    struct obd_daemon *d;
    int n, r;
    size_t count; /* elements (bytes for broadcast) */
    size_t esz;   /* bytes per element on the wire */
    size_t seg;   /* elements per segment */
    uint8_t *acc;
    size_t acc_bytes;
    int zero_copy; /* acc/src are trainer memory (the op holds the buffers) */
    /* The input of a node's only trainer, which the op holds mapped, when
     * the ring reads it directly. A reduce-scatter whose dtype accumulates
     * in itself has no local load: step 0 sends straight from `local`,
     * and each reduction computes acc = local op received in one pass
     * (obd_reduce_load of the two), the same operands in the same order
     * as a load followed by obd_reduce_acc, without first copying the
     * whole input into acc. An allgather's step 0 sends the trainer's
     * part from `local` while the pool still copies it into the result.
     * NULL otherwise. */
    const uint8_t *local;
    enum phase phase;
    uint64_t load_ns; /* uv_hrtime() when the local load began */
    int load_traced;
    size_t pieces;     /* load, store or copy pieces not yet done */
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
     * coll, whatever happened to the op) and a stack of the free ones.
     * One is taken per reduce-scatter frame and comes back when its
     * reduction ends, so there are at most as many as reduce-scatter
     * segments ((n-1)/n of the accumulator) and, while the pool keeps
     * pace with the wire, a few. */
    uint8_t **bufs, **spare;
    size_t nbufs, nspare, capbufs;
    uint8_t *rx; /* handed out by recv_dest for the frame coming in */
    /* broadcast */
    int pos; /* distance from the root node along the chain */
    const uint8_t *src;
};

/* ---- pieces of arithmetic, inline or on the worker pool ---- */

enum piece_kind { PC_LOAD, PC_ACC, PC_STORE, PC_COPY };

/* A piece takes what it touches from the op when it is made, so that on
 * a pool thread it reads nothing the loop thread owns: pointers into acc,
 * a segment buffer and the trainers' shared memory, which all stay valid
 * while the op holds the piece (obd_op_task_begin). */
struct piece {
    uv_work_t req;
    struct obd_op *op;
    enum piece_kind kind;
    obcomm_dtype_t dtype;
    obcomm_op_t redop;
    int divisor;          /* STORE: AVG's; ACC: > 0 to divide after */
    size_t begin, count;  /* elements of acc (bytes for COPY) */
    uint8_t *acc;         /* acc + begin (COPY: the source + begin) */
    const uint8_t *in;    /* ACC: the received segment */
    const uint8_t *local; /* ACC: the trainer's segment (coll.local), or NULL */
    size_t idx;           /* ACC: reduced[idx]; LOAD: load[idx] */
    uint64_t begin_ns, end_ns;
    int pooled;
    int nptr;
    void *ptr[]; /* LOAD: sources; STORE, COPY: destinations (+ begin) */
};

static struct piece *piece_new(struct obd_op *op, enum piece_kind kind,
                               int nptr)
{
    struct piece *p = calloc(1, sizeof(*p) + (size_t)nptr * sizeof(void *));
    if (p == NULL)
        return NULL;
    p->op = op;
    p->kind = kind;
    p->dtype = (obcomm_dtype_t)op->desc.dtype;
    p->redop = (obcomm_op_t)op->desc.redop;
    p->nptr = nptr;
    return p;
}

static void piece_run(struct piece *p)
{
    p->begin_ns = uv_hrtime();
    switch (p->kind) {
    case PC_LOAD:
        obd_reduce_load(p->dtype, p->redop, p->acc, (const void *const *)p->ptr,
                        p->nptr, p->count);
        break;
    case PC_ACC:
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
    case PC_STORE:
        obd_reduce_store_many(p->dtype, p->redop, p->ptr, p->nptr, p->acc,
                              p->count, p->divisor);
        break;
    case PC_COPY: /* an allgather's part may be in place: memmove */
        for (int i = 0; i < p->nptr; i++)
            memmove(p->ptr[i], p->acc, p->count);
        break;
    }
    p->end_ns = uv_hrtime();
}

static void pool_run(uv_work_t *req)
{
    piece_run(container_of(req, struct piece, req));
}

/* Records that a piece is done (on the loop thread): a reduce-scatter
 * segment is reduced and its buffer free again, a segment is loaded, or
 * one fewer load, store or copy piece is left. Makes no transition. */
static void piece_done(struct obd_coll *c, const struct piece *p)
{
    size_t esz = p->kind == PC_COPY ? 1 : obd_dtype_acc_size(p->dtype);
    size_t dsz = p->kind == PC_COPY ? 1 : obd_dtype_size(p->dtype);
    size_t ndst =
        p->kind == PC_STORE || p->kind == PC_COPY ? (size_t)p->nptr : 1;
    obd_metric_add(&c->d->metrics, OBD_M_LOCAL_BYTES_WRITTEN,
                   p->count * ndst * (p->kind == PC_STORE ? dsz : esz));
    if (p->kind == PC_ACC) {
        c->acc_queued -= (size_t)p->pooled;
        c->reduced[p->idx] = 1;
        c->spare[c->nspare++] = (uint8_t *)p->in;
        return;
    }
    if (p->kind == PC_LOAD) {
        c->load[p->idx] = LD_DONE;
        c->load_left--;
    }
    c->pieces--;
}

static void pool_done(uv_work_t *req, int status)
{
    struct piece *p = container_of(req, struct piece, req);
    struct obd_op *op = p->op;
    struct obd_coll *c = op->coll;
    (void)status; /* nothing cancels these tasks */
    piece_done(c, p);
    if (c->d->trace.f != NULL) {
        static const char *const names[] = {"load", "reduce", "store",
                                            "average", "copy"};
        char args[96];
        snprintf(args, sizeof(args), "\"seq\":%llu,\"begin\":%zu,\"count\":%zu",
                 (unsigned long long)op->seq, p->begin, p->count);
        obd_trace_span(c->d, names[p->kind], "reduce", OBD_TRACE_POOL,
                       p->begin_ns, p->end_ns, args);
    }
    free(p);
    obd_op_task_end(op);
}

/* Runs piece p (taking ownership) inline, or queues it on the pool when
 * `pool`. On failure fails the op and returns non-zero. */
static int piece_go(struct obd_op *op, struct piece *p, int pool)
{
    struct obd_coll *c = op->coll;
    int rc = p == NULL ? OBD_E_NOMEM : 0;
    const char *what = p == NULL ? "allocate" : "queue";
    if (rc == 0 && !pool) {
        if (p->kind != PC_ACC)
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
                    (unsigned long long)op->seq, op->job->name, c->r, what);
        return rc;
    }
    if (p->kind != PC_ACC)
        c->pieces++;
    c->acc_queued += p->kind == PC_ACC ? 1 : 0;
    p->pooled = 1;
    obd_op_task_begin(op);
    return 0;
}

/* 1 when work on `bytes` bytes of the op's accumulator goes to the pool
 * (coll.h). */
static int use_pool(const struct obd_coll *c, size_t bytes)
{
    return c->count >= OBD_RING_POOL_SEGMENTS * c->seg &&
           bytes >= OBD_RING_POOL_BYTES;
}

/* How many loads, and how many reductions, of one op may be on the pool
 * at once: two per thread, so that a thread that ends a piece finds the
 * next one queued instead of waiting for the loop to queue it. */
static size_t pool_depth(const struct obd_coll *c)
{
    return 2 * (size_t)(c->d->threads > 0 ? c->d->threads : 1);
}

/* PH_STORE, for both collectives: the op finishes once no store,
 * division or copy piece is left. */
static void store_progress(struct obd_op *op)
{
    struct obd_coll *c = op->coll;
    if (c->phase != PH_STORE || c->pieces > 0)
        return;
    c->phase = PH_DONE;
    obd_op_finish(op);
}

/* Runs `kind` (STORE or COPY) over the whole of acc: on the pool in
 * pieces of one segment when it is large, else inline in one piece. On
 * failure fails the op and returns non-zero; pieces already queued run to
 * their end. */
static int spread(struct obd_op *op, enum piece_kind kind)
{
    struct obd_coll *c = op->coll;
    struct obd_job *job = op->job;
    int ls = job->local_size;
    size_t dsz = kind == PC_COPY ? 1 : obd_dtype_size(op->desc.dtype);
    int pool = use_pool(c, c->count * c->esz);
    size_t unit = pool ? c->seg : c->count;
    int nptr = 0;
    void *ptr[OBD_MAX_LOCAL];
    void *const *dst =
        op->desc.kind == OBCOMM_KIND_ALLGATHER ? op->out : op->data;
    if (kind == PC_STORE)
        for (int i = 0; i < ls; i++)
            ptr[nptr++] = dst[i];
    if (kind == PC_COPY)
        for (int i = 0; i < ls; i++)
            if (dst[i] != c->src)
                ptr[nptr++] = dst[i];
    if (kind == PC_COPY && nptr == 0)
        return 0;
    for (size_t b = 0; b < c->count; b += unit) {
        struct piece *p = piece_new(op, kind, nptr);
        if (p != NULL) {
            p->begin = b;
            p->count = c->count - b < unit ? c->count - b : unit;
            p->divisor = c->n * ls;
            p->acc =
                kind == PC_COPY ? (uint8_t *)c->src + b : c->acc + b * c->esz;
            for (int i = 0; i < nptr; i++)
                p->ptr[i] = (uint8_t *)ptr[i] + b * dsz;
        }
        if (piece_go(op, p, pool))
            return 1;
    }
    return 0;
}

static const char *send_error(int rc)
{
    return rc == OBD_E_PEER_LOST ? "link is down" : obd_err_str(rc);
}

/* Sends one data frame; on failure fails the op and returns non-zero. */
static int send_or_fail(struct obd_op *op, int to, uint32_t step,
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
    c->phase = PH_RING;
    op->coll = c;
    return c;
}

/* Runs when the op is freed, so no piece and no receive uses anything
 * here any more: every segment buffer goes back to the daemon, whether it
 * is free, held or was handed to a receive that never completed. */
static void coll_free(struct obd_op *op)
{
    struct obd_coll *c = op->coll;
    if (!c->zero_copy)
        obd_op_scratch_put(op, c->acc, c->acc_bytes);
    for (size_t i = 0; i < c->nbufs; i++)
        obd_op_segbuf_put(op, c->bufs[i], c->seg * c->esz);
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
    struct obd_coll *c = op->coll;
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
    uint8_t *p = obd_op_segbuf_get(op, c->seg * c->esz);
    if (p != NULL)
        c->bufs[c->nbufs++] = p;
    return p;
}

/* ---- ring allreduce and reduce-scatter ---- */

/* A world of one rank (one node, one trainer): an op over one operand is
 * the operand, and the result is the input bit for bit, whatever the
 * dtype and the op (AVG divides by 1; docs/c-api.md). So the allreduce
 * leaves the buffer as it is: no load and store run over it (they would
 * cost two passes, and make a signalling NaN quiet). A reduce-scatter
 * moves its input to recv unless it is there already, in one memmove, as
 * recv may overlap the input anywhere. */
static int one_rank(struct obd_op *op)
{
    struct obd_coll *c = op->coll;
    size_t bytes = c->count * obd_dtype_size(op->desc.dtype);
    obd_metric_add(&c->d->metrics, OBD_M_LOGICAL_BYTES, bytes);
    c->zero_copy = 1; /* no accumulator */
    c->phase = PH_STORE;
    if (op->desc.kind == OBCOMM_KIND_REDUCE_SCATTER &&
        op->out[0] != op->data[0]) {
        struct piece *p = piece_new(op, PC_COPY, 1);
        if (p != NULL) {
            p->count = bytes;
            p->acc = op->data[0];
            p->ptr[0] = op->out[0];
        }
        if (piece_go(op, p, use_pool(c, c->count * c->esz)))
            return OBD_E_NOMEM;
    }
    store_progress(op);
    return 0;
}

/* Element range [*b, *e) of ring chunk `chunk` (ring.h). A reduce-scatter
 * (rot = n - 1) maps ring chunk k to block k - 1: its count is a multiple
 * of n, so every chunk has the same size, and node r, which ends the
 * reduce-scatter holding ring chunk r + 1, holds block r, the part of its
 * own ranks. */
static void chunk_range(const struct obd_coll *c, int chunk, size_t *b,
                        size_t *e)
{
    obd_ring_chunk(c->count, c->n, obd_ring_mod(chunk + c->rot, c->n), b, e);
}

static size_t step_chunk_elems(const struct obd_coll *c, int s, int sending,
                               size_t *begin)
{
    size_t b, e;
    int chunk = sending ? obd_ring_send_chunk(c->r, c->n, s)
                        : obd_ring_recv_chunk(c->r, c->n, s);
    chunk_range(c, chunk, &b, &e);
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

static size_t seg_index(const struct obd_coll *c, int s, size_t j)
{
    return (size_t)s * c->maxseg + j;
}

/* 1 once cursor (step, seg) has passed segment (s, j). */
static int passed(int step, size_t seg, int s, size_t j)
{
    return step > s || (step == s && seg > j);
}

/* ---- the local load ---- */

/* Loads segment j of chunk `chunk` (inline, or a piece on the pool). On
 * failure fails the op and returns non-zero. */
static int load_seg(struct obd_op *op, int chunk, size_t j, int pool)
{
    struct obd_coll *c = op->coll;
    int ls = op->job->local_size;
    size_t dsz = obd_dtype_size(op->desc.dtype);
    size_t b, e;
    chunk_range(c, chunk, &b, &e);
    b += j * c->seg;
    struct piece *p = piece_new(op, PC_LOAD, ls);
    if (p != NULL) {
        p->begin = b;
        p->count = e - b < c->seg ? e - b : c->seg;
        p->acc = c->acc + b * c->esz;
        p->idx = seg_index(c, chunk, j);
        for (int i = 0; i < ls; i++)
            p->ptr[i] = (uint8_t *)op->data[i] + b * dsz;
        c->load[p->idx] = LD_QUEUED;
    }
    return piece_go(op, p, pool);
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
    struct obd_coll *c = op->coll;
    int pool = use_pool(c, c->count * c->esz);
    while (c->load_j < c->maxseg && (!pool || c->pieces < pool_depth(c))) {
        int chunk = obd_ring_mod(c->r - c->load_k, c->n);
        size_t j = c->load_j;
        size_t b, e;
        chunk_range(c, chunk, &b, &e);
        if (++c->load_k == c->n) {
            c->load_k = 0;
            c->load_j++;
        }
        if (j * c->seg < e - b &&
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
    struct obd_coll *c = op->coll;
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
    struct obd_coll *c = op->coll;
    while (c->red_step < c->n - 1 &&
           passed(c->recv_step, c->recv_seg, c->red_step, c->red_seg)) {
        int chunk = obd_ring_recv_chunk(c->r, c->n, c->red_step);
        if (!loaded_now(op, chunk, c->red_seg))
            return op->state != OBD_OP_RUN;
        size_t off;
        size_t len = seg_range(c, c->red_step, c->red_seg, 0, &off);
        size_t idx = seg_index(c, c->red_step, c->red_seg);
        struct piece *p = piece_new(op, PC_ACC, 0);
        if (p != NULL) {
            p->begin = off;
            p->count = len;
            p->acc = c->acc + off * c->esz;
            p->in = c->held[idx];
            p->local = c->local != NULL ? c->local + off * c->esz : NULL;
            p->idx = idx;
            c->held[idx] = NULL; /* the piece has it; it stays in bufs */
            /* A zero-copy AVG divides where the sum is made, at the last
             * reduction of our chunk, so the allgather carries averages
             * and no pass over the trainer's whole tensor follows. */
            if (c->zero_copy && op->desc.redop == OBCOMM_AVG &&
                c->red_step == c->n - 2)
                p->divisor = c->n * op->job->local_size;
        }
        c->red_seg++;
        settle(c, &c->red_step, &c->red_seg, 0);
        if (piece_go(op, p,
                     use_pool(c, len * c->esz) &&
                         c->acc_queued < pool_depth(c)))
            return 1;
    }
    return 0;
}

/* Sends what is ready: segment j of step 0 once it is loaded, of step
 * s > 0 once it has arrived at step s-1 and, in the reduce-scatter, been
 * reduced. */
static int ring_send(struct obd_op *op)
{
    struct obd_coll *c = op->coll;
    struct obd_daemon *d = op->job->d;
    int right = obd_ring_mod(c->r + 1, c->n);
    while (c->send_step < c->nsteps) {
        int s = c->send_step;
        size_t j = c->send_seg;
        if (s == 0 && !loaded_now(op, c->r, j)) {
            if (op->state != OBD_OP_RUN)
                return 1;
            break;
        }
        if (s > 0 && s - 1 < c->n - 1 && !c->reduced[seg_index(c, s - 1, j)])
            break;
        if (s > 0 && !passed(c->recv_step, c->recv_seg, s - 1, j))
            break;
        size_t off;
        size_t len = seg_range(c, s, j, 1, &off);
        const uint8_t *from = s == 0 && c->local != NULL ? c->local : c->acc;
        if (send_or_fail(op, right, (uint32_t)s, (uint32_t)j,
                         from + off * c->esz, len * c->esz))
            return 1;
        obd_metric_add(&d->metrics,
                       op->desc.kind == OBCOMM_KIND_REDUCE_SCATTER
                           ? OBD_M_REDUCE_SCATTER_BYTES_SENT
                           : OBD_M_ALLREDUCE_BYTES_SENT,
                       len * c->esz);
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
    struct obd_coll *c = op->coll;
    int ls = op->job->local_size;
    size_t m = op->desc.count;
    size_t dsz = obd_dtype_size(op->desc.dtype);
    int pool = use_pool(c, m * (size_t)ls * c->esz);
    size_t unit = pool ? c->seg : m;
    for (int i = 0; i < ls; i++) {
        size_t first = ((size_t)c->r * (size_t)ls + (size_t)i) * m;
        for (size_t b = 0; b < m; b += unit) {
            struct piece *p = piece_new(op, PC_STORE, 1);
            if (p != NULL) {
                p->begin = first + b;
                p->count = m - b < unit ? m - b : unit;
                p->divisor = c->n * ls;
                p->acc = c->acc + (first + b) * c->esz;
                p->ptr[0] = (uint8_t *)op->out[i] + b * dsz;
            }
            if (piece_go(op, p, pool))
                return 1;
        }
    }
    return 0;
}

/* The one transition function of the allreduce: ring (with the load),
 * store, done. Runs from start and whenever the op is posted (a piece
 * done, a frame in or out). */
static void ring_progress(struct obd_op *op)
{
    struct obd_coll *c = op->coll;
    if (c->phase == PH_RING) {
        if (load_more(op) || reduce_received(op) || ring_send(op))
            return;
        if (!c->zero_copy && c->local == NULL && !c->load_traced &&
            c->load_left == 0) {
            c->load_traced = 1;
            obd_trace_span(c->d, "local reduce", "ring",
                           (int)(op->job->id % OBD_TRACE_POOL), c->load_ns,
                           uv_hrtime(), NULL);
        }
        /* Loaded, every frame out and in, every reduction done (it held a
         * reference), and no write still reads acc. */
        if (c->load_left > 0 || c->send_step < c->nsteps ||
            c->recv_step < c->nsteps || !obd_op_idle(op))
            return;
        c->phase = PH_STORE;
        int rc = 0;
        if (op->desc.kind == OBCOMM_KIND_REDUCE_SCATTER)
            rc = store_blocks(op);
        else if (!c->zero_copy) /* zero-copy: the result is in place */
            rc = spread(op, PC_STORE);
        if (rc)
            return;
    }
    store_progress(op);
}

static int ring_start(struct obd_op *op)
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
    struct obd_coll *c = coll_new(op, count, esz);
    if (c != NULL && c->n == 1 && job->local_size == 1)
        return one_rank(op);
    if (c != NULL && rs)
        c->rot = c->n - 1;
    /* One trainer and a dtype that accumulates in itself: the ring runs in
     * the trainer's shared memory, with no copy in or out. The op's
     * reference keeps the buffer mapped even if the trainer leaves. A
     * reduce-scatter only reads its input. */
    if (c != NULL && !rs && job->local_size == 1 && c->n > 1 &&
        esz == obd_dtype_size(dt)) {
        c->acc = op->data[0];
        c->zero_copy = 1;
    }
    if (c != NULL && rs && job->local_size == 1 && c->n > 1 &&
        esz == obd_dtype_size(dt))
        c->local = op->data[0];
    if (c != NULL) {
        size_t b, e;
        obd_ring_chunk(c->count, c->n, 0, &b, &e); /* the largest chunk */
        c->maxseg = obd_ring_nseg(e - b, c->seg);
    }
    size_t nidx = c ? (size_t)c->n * c->maxseg + 1 : 0;
    if (c == NULL ||
        (!c->zero_copy && (c->acc = obd_op_scratch_get(
                               op, c->count * esz, &c->acc_bytes)) == NULL) ||
        (c->held = calloc(nidx, sizeof(*c->held))) == NULL ||
        (c->reduced = calloc(nidx, 1)) == NULL ||
        (c->load = calloc(nidx, 1)) == NULL) {
        obd_op_fail(op, OBD_E_NOMEM, 1,
                    "op %llu of job %s: no memory for %zu elements on node %d",
                    (unsigned long long)op->seq, job->name, count,
                    c ? c->r : -1);
        return OBD_E_NOMEM;
    }
    obd_metric_add(&d->metrics, OBD_M_LOGICAL_BYTES,
                   c->count * obd_dtype_size(dt));

    c->nsteps = c->n > 1 ? (rs ? 1 : 2) * (c->n - 1) : 0;
    settle(c, &c->send_step, &c->send_seg, 1);
    settle(c, &c->recv_step, &c->recv_seg, 0);
    settle(c, &c->red_step, &c->red_seg, 0);
    /* Frames that arrive before their segment is loaded wait in their
     * buffers (reduce_received). */
    c->load_ns = uv_hrtime();
    int no_load = c->zero_copy || c->local != NULL;
    for (int k = 0; k < c->n; k++) {
        size_t b, e;
        chunk_range(c, k, &b, &e);
        size_t nseg = obd_ring_nseg(e - b, c->seg);
        c->load_left += no_load ? 0 : nseg;
        if (no_load)
            memset(c->load + seg_index(c, k, 0), LD_DONE, nseg);
    }
    if (no_load)
        c->load_j = c->maxseg; /* nothing to load */
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
    if (c->recv_step >= c->n - 1)
        return c->acc + off * c->esz; /* allgather: straight into acc */
    /* A receive that did not complete left its buffer in rx: reuse it. */
    if (c->rx == NULL && (c->rx = buf_get(op)) == NULL) {
        *why = "no memory for a segment buffer";
        return NULL;
    }
    return c->rx;
}

static void ring_recv_done(struct obd_op *op, int from,
                           const struct obd_frame *f)
{
    struct obd_coll *c = op->coll;
    (void)from;
    (void)f;
    if (c->recv_step < c->n - 1) {
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

static void ring_waiting_on(const struct obd_op *op, char *buf, size_t len)
{
    const struct obd_coll *c = op->coll;
    int s = c->send_step;
    if (c->phase == PH_RING && c->load_left > 0)
        snprintf(buf, len, "the local reduction on node %d's worker pool",
                 c->r);
    else if (c->phase >= PH_STORE)
        snprintf(buf, len, "the store of the result on node %d's worker pool",
                 c->r);
    else if (c->recv_step < c->nsteps)
        snprintf(buf, len, "data from node %d (step %d, segment %zu)",
                 obd_ring_mod(c->r - 1, c->n), c->recv_step, c->recv_seg);
    else if (s < c->nsteps && s > 0 && s - 1 < c->n - 1 &&
             !c->reduced[seg_index(c, s - 1, c->send_seg)])
        snprintf(buf, len,
                 "a reduction on node %d's worker pool (step %d, segment %zu)",
                 c->r, s - 1, c->send_seg);
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

/* ---- allgather ----
 *
 * Bytes, whatever the dtype. The result is world blocks of one rank's part
 * each; node r's trainers own the consecutive parts of block r (count / n
 * bytes). The ring runs in the first local trainer's result buffer: its
 * node's parts are copied there (unless a part already is, in place), then
 * at step s (0 .. n-2) node r sends block r - s to r + 1, segment by
 * segment, and receives block r - s - 1 from r - 1 straight to its place;
 * segment j of step s leaves once it arrived at step s - 1. Step 0 waits
 * for the copies, except on a node of one trainer, whose block is its
 * part: it leaves from there at once. At the end the other local trainers
 * copy the whole result. */

static size_t ag_block_bytes(const struct obd_coll *c)
{
    return c->count / (size_t)c->n;
}

/* Segment j of the block sent (or received) at step s: its offset in the
 * result and its length. */
static size_t ag_seg(const struct obd_coll *c, int s, size_t j, int sending,
                     size_t *off)
{
    size_t bb = ag_block_bytes(c);
    int block = obd_ring_mod(c->r - s - (sending ? 0 : 1), c->n);
    size_t first = j * c->seg;
    *off = (size_t)block * bb + first;
    return bb - first < c->seg ? bb - first : c->seg;
}

static void ag_advance(const struct obd_coll *c, int *step, size_t *seg)
{
    if (++*seg == obd_ring_nseg(ag_block_bytes(c), c->seg)) {
        (*step)++;
        *seg = 0;
    }
}

static void ag_progress(struct obd_op *op)
{
    struct obd_coll *c = op->coll;
    struct obd_daemon *d = op->job->d;
    int right = obd_ring_mod(c->r + 1, c->n);
    if (c->phase == PH_RING) {
        if (c->pieces == 0 && !c->load_traced) {
            c->load_traced = 1;
            obd_trace_span(d, "local gather", "ring",
                           (int)(op->job->id % OBD_TRACE_POOL), c->load_ns,
                           uv_hrtime(), NULL);
        }
        /* Step 0 sends this node's block: from the only trainer's part at
         * once, else once every local part is in the result. Later steps
         * forward what arrived, which lies in other blocks. */
        while (c->send_step < c->nsteps &&
               (c->send_step == 0 ? c->local != NULL || c->pieces == 0
                                  : passed(c->recv_step, c->recv_seg,
                                           c->send_step - 1, c->send_seg))) {
            size_t off;
            size_t len = ag_seg(c, c->send_step, c->send_seg, 1, &off);
            const uint8_t *from = c->send_step == 0 && c->local != NULL
                                      ? c->local + c->send_seg * c->seg
                                      : c->acc + off;
            if (send_or_fail(op, right, (uint32_t)c->send_step,
                             (uint32_t)c->send_seg, from, len))
                return;
            obd_metric_add(&d->metrics, OBD_M_ALLGATHER_BYTES_SENT, len);
            ag_advance(c, &c->send_step, &c->send_seg);
        }
        if (c->pieces > 0 || c->send_step < c->nsteps ||
            c->recv_step < c->nsteps || !obd_op_idle(op))
            return;
        c->phase = PH_STORE;
        if (spread(op, PC_COPY))
            return;
    }
    store_progress(op);
}

static int ag_start(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    int ls = job->local_size;
    size_t part = op->desc.count * obd_dtype_size(op->desc.dtype);
    struct obd_coll *c =
        coll_new(op, part * (size_t)ls * (size_t)d->cfg.nodes, 1);
    if (c == NULL) {
        obd_op_fail(op, OBD_E_NOMEM, 1, "out of memory");
        return OBD_E_NOMEM;
    }
    obd_metric_add(&d->metrics, OBD_M_LOGICAL_BYTES, c->count);
    c->zero_copy = 1;
    c->acc = op->out[0];
    c->src = c->acc;
    if (ls == 1)
        c->local = op->data[0];
    c->nsteps = c->n - 1;
    c->load_ns = uv_hrtime();
    int pool = use_pool(c, part);
    size_t unit = pool ? c->seg : part;
    for (int i = 0; i < ls; i++) {
        uint8_t *to = c->acc + ((size_t)c->r * (size_t)ls + (size_t)i) * part;
        if ((uint8_t *)op->data[i] == to)
            continue; /* in place: the part is there */
        for (size_t b = 0; b < part; b += unit) {
            struct piece *p = piece_new(op, PC_COPY, 1);
            if (p != NULL) {
                p->begin = b;
                p->count = part - b < unit ? part - b : unit;
                p->acc = (uint8_t *)op->data[i] + b;
                p->ptr[0] = to + b;
            }
            if (piece_go(op, p, pool))
                return OBD_E_NOMEM;
        }
    }
    ag_progress(op);
    return 0;
}

static void *ag_recv_dest(struct obd_op *op, int from,
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
    size_t len = ag_seg(c, c->recv_step, c->recv_seg, 0, &off);
    if (f->len != len) {
        *why = "payload length differs from the segment's";
        return NULL;
    }
    return c->acc + off;
}

static void ag_recv_done(struct obd_op *op, int from, const struct obd_frame *f)
{
    struct obd_coll *c = op->coll;
    (void)from;
    (void)f;
    ag_advance(c, &c->recv_step, &c->recv_seg);
}

static void ag_waiting_on(const struct obd_op *op, char *buf, size_t len)
{
    const struct obd_coll *c = op->coll;
    if (c->phase == PH_RING && c->pieces > 0)
        snprintf(buf, len, "the local copies on node %d's worker pool", c->r);
    else if (c->phase >= PH_STORE)
        snprintf(buf, len,
                 "the copies to the local trainers on node %d's worker pool",
                 c->r);
    else if (c->recv_step < c->nsteps)
        snprintf(buf, len, "data from node %d (step %d, segment %zu)",
                 obd_ring_mod(c->r - 1, c->n), c->recv_step, c->recv_seg);
    else
        snprintf(buf, len, "node %d to take our data",
                 obd_ring_mod(c->r + 1, c->n));
}

/* ---- broadcast along the chain root, root+1, ..., root-1 ---- */

/* The transition function of the broadcast: frames, then the copies to
 * the other local trainers (on the pool when large), then done. */
static void bcast_progress(struct obd_op *op)
{
    struct obd_coll *c = op->coll;
    struct obd_daemon *d = op->job->d;
    size_t nseg = obd_ring_nseg(c->count, c->seg);
    int right = obd_ring_mod(c->r + 1, c->n);
    int forwards = c->pos < c->n - 1;

    if (c->phase == PH_RING) {
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
        if (!sent || !received || !obd_op_idle(op))
            return;
        c->phase = PH_STORE;
        if (spread(op, PC_COPY))
            return;
    }
    store_progress(op);
}
static int bcast_start(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    int ls = job->local_size;
    int root = op->desc.root;
    if (root < 0 || root >= d->cfg.nodes * ls) {
        obd_op_fail(op, OBD_E_INVAL, 0,
                    "op %llu of job %s: broadcast root %d is not a rank "
                    "(world of %d)",
                    (unsigned long long)op->seq, job->name, root,
                    d->cfg.nodes * ls);
        return OBD_E_INVAL;
    }
    struct obd_coll *c = coll_new(op, op->desc.count, 1);
    if (c == NULL) {
        obd_op_fail(op, OBD_E_NOMEM, 1, "out of memory");
        return OBD_E_NOMEM;
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
        c->acc = obd_op_scratch_get(op, c->count, &c->acc_bytes);
        if (c->acc == NULL) {
            obd_op_fail(op, OBD_E_NOMEM, 1,
                        "op %llu of job %s: no memory for %zu bytes",
                        (unsigned long long)op->seq, job->name, c->count);
            return OBD_E_NOMEM;
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
    if (c->phase >= PH_STORE)
        snprintf(buf, len,
                 "the copies to the local trainers on node %d's worker pool",
                 c->r);
    else if (c->pos != 0 && c->recv_seg < obd_ring_nseg(c->count, c->seg))
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
        obd_op_fail(op, OBD_E_NOMEM, 1, "out of memory");
        return OBD_E_NOMEM;
    }
    obd_op_finish(op);
    return 0;
}

const struct obd_algo obd_algo_allreduce = {.kind = OBCOMM_KIND_ALLREDUCE,
                                            .name = "ring allreduce",
                                            .start = ring_start,
                                            .recv_dest = ring_recv_dest,
                                            .recv_done = ring_recv_done,
                                            .progress = ring_progress,
                                            .free = coll_free,
                                            .waiting_on = ring_waiting_on,
                                            .needs_node = ring_needs_node};

const struct obd_algo obd_algo_reduce_scatter = {.kind =
                                                     OBCOMM_KIND_REDUCE_SCATTER,
                                                 .name = "ring reduce-scatter",
                                                 .start = ring_start,
                                                 .recv_dest = ring_recv_dest,
                                                 .recv_done = ring_recv_done,
                                                 .progress = ring_progress,
                                                 .free = coll_free,
                                                 .waiting_on = ring_waiting_on,
                                                 .needs_node = ring_needs_node};

const struct obd_algo obd_algo_allgather = {.kind = OBCOMM_KIND_ALLGATHER,
                                            .name = "ring allgather",
                                            .start = ag_start,
                                            .recv_dest = ag_recv_dest,
                                            .recv_done = ag_recv_done,
                                            .progress = ag_progress,
                                            .free = coll_free,
                                            .waiting_on = ag_waiting_on,
                                            .needs_node = ring_needs_node};

const struct obd_algo obd_algo_broadcast = {.kind = OBCOMM_KIND_BROADCAST,
                                            .name = "chain broadcast",
                                            .start = bcast_start,
                                            .recv_dest = bcast_recv_dest,
                                            .recv_done = bcast_recv_done,
                                            .progress = bcast_progress,
                                            .free = coll_free,
                                            .waiting_on = bcast_waiting_on,
                                            .needs_node = bcast_needs_node};

const struct obd_algo obd_algo_barrier = {.kind = OBCOMM_KIND_BARRIER,
                                          .name = "barrier",
                                          .start = barrier_start,
                                          .recv_dest = obd_coll_no_data,
                                          .recv_done = obd_coll_no_recv,
                                          .progress = obd_coll_no_progress,
                                          .free = coll_free,
                                          .waiting_on =
                                              obd_coll_waiting_on_nobody};
