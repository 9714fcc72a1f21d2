/* The 1-bit compressed allreduce among nodes (DESIGN.md sections 2 and 3).
 *
 * On every node, for op (job, key, count):
 *   W1  the local trainers' buffers are averaged exactly and the worker
 *       error added, in one pass that also forms the norm (b = avg + werr);
 *   W2  signs of b are packed and the worker error updated, chunk by
 *       chunk; chunk c's bits (and the scale) go straight to node c, the
 *       server of chunk c (parameter-server phase, frames of step 0);
 *   S1  once every node's bits of a segment of our chunk are in, the
 *       server forms m and its norm;
 *   S2  with the server scale known, it packs t and updates the server
 *       error;
 *   AG  the servers' chunks travel around the ring (allgather, steps
 *       1..n-1) and every chunk is decompressed into every local trainer's
 *       buffer as it arrives.
 * Codec work (W1, W2, S1, S2, decompression) runs on libuv's thread pool
 * and never on the loop thread; segments let it overlap with the network.
 *
 * Frames: step 0 carries the parameter-server phase, step 1 + s step s of
 * the allgather. Within a step, segment 0 is the 4-byte scale of the chunk
 * and segments 1..nseg its packed bits, in order.
 */
#include "coll.h"

#include <obcomm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "ctl.h"
#include "efstate.h"
#include "efstore.h"
#include "ops.h"
#include "peers.h"
#include "reduce.h"
#include "ring.h"

enum task_kind { T_W1, T_W2, T_S1, T_S2, T_DEC };

struct onebit;

struct task {
    uv_work_t req;
    struct obd_op *op;
    struct onebit *ob;
    enum task_kind kind;
    int chunk;    /* W2, DEC */
    size_t seg;   /* W2, S1, S2, DEC: segment within the chunk */
    size_t begin; /* W1: element range */
    size_t end;
    int touches_shm; /* reads or writes trainer memory */
};

struct onebit {
    struct obd_daemon *d;
    struct obd_ef *ef;
    const struct obd_codec_impl *impl;
    int n, r, ls;
    size_t count, N, C; /* elements; padded; per chunk */
    size_t seg, nseg;   /* elements per segment; segments per chunk */
    float *const *dst;  /* the local trainers' buffers */

    float *b; /* W1 output, N */
    size_t b_cap;
    double *wsums;  /* worker block sums, N / BLOCK rounded up */
    size_t w1_left; /* W1 tasks not finished */
    float scale;
    int w2_queued;
    int began;        /* holds a use of ef */
    uint8_t *bits;    /* our signs, N / 8 */
    uint8_t *w2_done; /* per (chunk, segment) */

    /* Server of chunk r. */
    uint8_t **in;  /* in[k]: node k's bits of chunk r (in[r] = ours) */
    float *scales; /* node k's worker scale */
    uint8_t *have_scale;
    size_t *ps_recv; /* PS frames received from node k (scale + segs) */
    double *ssums;   /* server block sums, C / BLOCK rounded up */
    size_t s1_left;
    uint8_t *s1_queued;
    float sscale;
    size_t s2_left;
    uint8_t *s2_done;

    /* Allgather. */
    uint8_t *out; /* t bits of every chunk, N / 8 */
    float *sscales;
    uint8_t *have_sscale;
    uint8_t *seg_in; /* per (chunk, segment): bits are in out */
    size_t *ps_sent; /* PS frames sent to node k */
    int ag_send_step, ag_recv_step;
    size_t ag_send_x, ag_recv_x; /* 0 = scale frame, 1..nseg bits */
    size_t dec_left;             /* decompression tasks not finished */
    int tasks;                   /* tasks in flight */
    int failed;
};

static size_t seg_elems(const struct onebit *ob, size_t j)
{
    size_t first = j * ob->seg;
    return ob->C - first < ob->seg ? ob->C - first : ob->seg;
}

/* ---- worker threads ---- */

static void run_task(uv_work_t *req)
{
    struct task *t = container_of(req, struct task, req);
    struct onebit *ob = t->ob;
    const struct obd_codec_impl *impl = ob->impl;

    switch (t->kind) {
    case T_W1:
        /* Whole blocks, so the sums do not depend on the split. */
        for (size_t b = t->begin; b < t->end; b += OBD_CODEC_BLOCK) {
            size_t e =
                b + OBD_CODEC_BLOCK < t->end ? b + OBD_CODEC_BLOCK : t->end;
            ob->wsums[b / OBD_CODEC_BLOCK] =
                ob->ls == 1
                    ? impl->sumsq_block(ob->dst[0], ob->count, ob->ef->werr, b,
                                        e)
                    : impl->avg_sumsq_block((const float *const *)ob->dst,
                                            ob->ls, ob->count, ob->ef->werr, b,
                                            e, ob->b);
        }
        break;
    case T_W2: {
        size_t begin = (size_t)t->chunk * ob->C + t->seg * ob->seg;
        size_t end = begin + seg_elems(ob, t->seg);
        /* One trainer: its tensor is the average, so pass 2 reads it and
         * the error again instead of a stored sum (one tensor-sized write
         * fewer; bit-identical, see test_codec). Decompression cannot
         * overwrite a chunk before this pass is done with it: the chunk's
         * result needs this pass's bits first. */
        if (ob->ls == 1)
            impl->compress_range(ob->dst[0], ob->count, ob->ef->werr, begin,
                                 end, ob->scale, ob->bits + begin / 8);
        else
            impl->sign_range(ob->b, ob->ef->werr, begin, end, ob->scale,
                             ob->bits + begin / 8);
        break;
    }
    case T_S1: {
        size_t begin = t->seg * ob->seg;
        size_t end = begin + seg_elems(ob, t->seg);
        for (size_t b = begin; b < end; b += OBD_CODEC_BLOCK) {
            size_t e = b + OBD_CODEC_BLOCK < end ? b + OBD_CODEC_BLOCK : end;
            ob->ssums[b / OBD_CODEC_BLOCK] =
                impl->server_sumsq_block((const uint8_t *const *)ob->in,
                                         ob->scales, ob->n, ob->ef->serr, b, e);
        }
        break;
    }
    case T_S2: {
        size_t begin = t->seg * ob->seg;
        size_t end = begin + seg_elems(ob, t->seg);
        impl->server_range((const uint8_t *const *)ob->in, ob->scales, ob->n,
                           ob->ef->serr, begin, end, ob->sscale,
                           ob->out + ((size_t)ob->r * ob->C + begin) / 8);
        break;
    }
    case T_DEC: {
        size_t begin = (size_t)t->chunk * ob->C + t->seg * ob->seg;
        size_t end = begin + seg_elems(ob, t->seg);
        if (end > ob->count)
            end = ob->count;
        if (begin >= end)
            break;
        for (int i = 0; i < ob->ls; i++)
            impl->decompress(ob->out + begin / 8, ob->sscales[t->chunk],
                             ob->dst[i] + begin, end - begin);
        break;
    }
    }
}

static void progress(struct obd_op *op);
static int begin(struct obd_op *op);

static void task_done(uv_work_t *req, int status)
{
    struct task *t = container_of(req, struct task, req);
    struct obd_op *op = t->op;
    struct onebit *ob = t->ob;
    struct obd_daemon *d = ob->d;
    (void)status;

    ob->tasks--;
    if (t->touches_shm)
        obd_shm_task_done(d);
    switch (t->kind) {
    case T_W1:
        ob->w1_left--;
        break;
    case T_W2:
        ob->w2_done[(size_t)t->chunk * ob->nseg + t->seg] = 1;
        break;
    case T_S1:
        ob->s1_left--;
        break;
    case T_S2:
        ob->s2_done[t->seg] = 1;
        ob->s2_left--;
        ob->seg_in[(size_t)ob->r * ob->nseg + t->seg] = 1;
        break;
    case T_DEC:
        ob->dec_left--;
        break;
    }
    free(t);
    obd_op_unref(op); /* runs progress while the op runs */
}

static int queue(struct obd_op *op, enum task_kind kind, int chunk, size_t seg,
                 size_t begin, size_t end)
{
    struct onebit *ob = op->coll;
    struct task *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return OBCOMM_E_NOMEM;
    t->op = op;
    t->ob = ob;
    t->kind = kind;
    t->chunk = chunk;
    t->seg = seg;
    t->begin = begin;
    t->end = end;
    t->touches_shm = kind == T_W1 || kind == T_DEC;
    int rc = uv_queue_work(&ob->d->loop, &t->req, run_task, task_done);
    if (rc) {
        free(t);
        return rc;
    }
    if (t->touches_shm)
        obd_shm_task_start(ob->d);
    op->refs++;
    ob->tasks++;
    return 0;
}

/* ---- the state machine ---- */

static void fail(struct obd_op *op, int status, const char *what)
{
    struct onebit *ob = op->coll;
    if (ob->failed)
        return;
    ob->failed = 1;
    obd_op_fail(op, status, 1,
                "op %llu of job %s (1-bit, key %llu) on node "
                "%d: %s",
                (unsigned long long)op->seq, op->job->name,
                (unsigned long long)op->desc.key, ob->r, what);
}

static int send_frame(struct obd_op *op, int to, uint32_t step, size_t x,
                      const void *payload, size_t len)
{
    struct onebit *ob = op->coll;
    int rc = obd_peers_send_data(ob->d, to, op, step, (uint32_t)x, payload,
                                 (uint32_t)len);
    if (rc) {
        char msg[96];
        snprintf(msg, sizeof(msg), "cannot send to node %d", to);
        fail(op, OBCOMM_E_PEER_LOST, msg);
        return rc;
    }
    obd_metric_add(&ob->d->metrics, OBD_M_ONEBIT_BYTES_SENT,
                   len + OBD_FRAME_HDR);
    return 0;
}

/* Parameter-server phase: node k gets our scale, then our bits of chunk k
 * segment by segment as W2 finishes them. */
static int progress_ps(struct obd_op *op)
{
    struct onebit *ob = op->coll;
    for (int k = 0; k < ob->n; k++) {
        if (k == ob->r)
            continue;
        while (ob->ps_sent[k] <= ob->nseg) {
            size_t x = ob->ps_sent[k];
            if (x == 0) {
                if (send_frame(op, k, 0, 0, &ob->scale, sizeof(float)))
                    return -1;
            } else {
                size_t j = x - 1;
                if (!ob->w2_done[(size_t)k * ob->nseg + j])
                    break;
                size_t off = (size_t)k * ob->C + j * ob->seg;
                if (send_frame(op, k, 0, x, ob->bits + off / 8,
                               seg_elems(ob, j) / 8))
                    return -1;
            }
            ob->ps_sent[k]++;
        }
    }
    return 0;
}

static int server_inputs_ready(const struct onebit *ob, size_t j)
{
    if (!ob->w2_done[(size_t)ob->r * ob->nseg + j])
        return 0;
    for (int k = 0; k < ob->n; k++)
        if (k != ob->r && ob->ps_recv[k] < j + 2)
            return 0;
    return 1;
}

static int progress_server(struct obd_op *op)
{
    struct onebit *ob = op->coll;
    for (size_t j = 0; j < ob->nseg; j++)
        if (!ob->s1_queued[j] && server_inputs_ready(ob, j)) {
            ob->s1_queued[j] = 1;
            if (queue(op, T_S1, ob->r, j, 0, 0))
                return -1;
        }
    if (ob->s1_left == 0 && ob->s2_left == ob->nseg &&
        !ob->have_sscale[ob->r]) {
        size_t nblocks = (ob->C + OBD_CODEC_BLOCK - 1) / OBD_CODEC_BLOCK;
        if (obd_codec_scale(ob->ssums, nblocks, ob->C, &ob->sscale)) {
            fail(op, OBCOMM_E_NONFINITE,
                 "the server step met a non-finite value (a NaN or Inf in "
                 "some node's tensor or scale)");
            return -1;
        }
        ob->sscales[ob->r] = ob->sscale;
        ob->have_sscale[ob->r] = 1;
        for (size_t j = 0; j < ob->nseg; j++)
            if (queue(op, T_S2, ob->r, j, 0, 0))
                return -1;
    }
    return 0;
}

static void queue_decompress(struct obd_op *op, int chunk, size_t j)
{
    if (queue(op, T_DEC, chunk, j, 0, 0))
        fail(op, OBCOMM_E_NOMEM, "cannot queue decompression");
}

/* Allgather around the ring: at step s we send chunk r - s and receive
 * chunk r - s - 1; what we receive at step s we forward at step s + 1. */
static int progress_ag(struct obd_op *op)
{
    struct onebit *ob = op->coll;
    int right = obd_ring_mod(ob->r + 1, ob->n);
    while (ob->ag_send_step < ob->n - 1) {
        int s = ob->ag_send_step;
        int chunk = obd_ring_mod(ob->r - s, ob->n);
        size_t x = ob->ag_send_x;
        int ready;
        if (s == 0)
            ready = x == 0 ? ob->have_sscale[ob->r] : ob->s2_done[x - 1];
        else
            ready = ob->ag_recv_step > s - 1 ||
                    (ob->ag_recv_step == s - 1 && ob->ag_recv_x > x);
        if (!ready)
            break;
        if (x == 0) {
            if (send_frame(op, right, (uint32_t)(1 + s), 0, &ob->sscales[chunk],
                           sizeof(float)))
                return -1;
        } else {
            size_t off = (size_t)chunk * ob->C + (x - 1) * ob->seg;
            if (send_frame(op, right, (uint32_t)(1 + s), x, ob->out + off / 8,
                           seg_elems(ob, x - 1) / 8))
                return -1;
        }
        if (++ob->ag_send_x > ob->nseg) {
            ob->ag_send_x = 0;
            ob->ag_send_step++;
        }
    }
    return 0;
}

static void finish(struct obd_op *op)
{
    struct onebit *ob = op->coll;
    obd_metric_add(&ob->d->metrics, OBD_M_ONEBIT_OPS, 1);
    obd_op_finish(op);
}

static void progress(struct obd_op *op)
{
    struct onebit *ob = op->coll;
    if (ob->failed || op->state != OBD_OP_RUN)
        return;

    if (ob->w1_left == 0 && ob->scale < 0) {
        size_t nblocks = (ob->N + OBD_CODEC_BLOCK - 1) / OBD_CODEC_BLOCK;
        if (obd_codec_scale(ob->wsums, nblocks, ob->N, &ob->scale)) {
            fail(op, OBCOMM_E_NONFINITE,
                 "the averaged tensor plus error feedback holds a NaN or "
                 "Inf; the error feedback state is unchanged");
            return;
        }
        ob->scales[ob->r] = ob->scale;
        ob->have_scale[ob->r] = 1;
    }
    if (ob->scale < 0)
        return;
    if (progress_ps(op))
        return;
    if (!ob->w2_queued) {
        /* W2 changes the worker error. It waits until every node's scale
         * is in: a node whose tensor held a NaN sends none and fails the op
         * everywhere instead, so no node's error feedback absorbs a step
         * that failed. */
        for (int k = 0; k < ob->n; k++) {
            if (!ob->have_scale[k])
                return;
            if (!(ob->scales[k] >= 0 && ob->scales[k] <= 3.4028235e38f)) {
                fail(op, OBCOMM_E_PROTO,
                     "a node sent a scale that is "
                     "negative or not finite");
                return;
            }
        }
        ob->w2_queued = 1;
        /* Chunks in the order of their servers starting after us, so
         * that the nodes do not all feed the same server first. */
        for (int i = 1; i <= ob->n; i++) {
            int c = obd_ring_mod(ob->r + i, ob->n);
            for (size_t j = 0; j < ob->nseg; j++)
                if (queue(op, T_W2, c, j, 0, 0)) {
                    fail(op, OBCOMM_E_NOMEM, "cannot queue codec work");
                    return;
                }
        }
    }
    if (progress_ps(op) || progress_server(op) || progress_ag(op))
        return;

    /* Our own server chunk is decompressed as S2 finishes it. */
    for (size_t j = 0; j < ob->nseg; j++)
        if (ob->s2_done[j] == 1) {
            ob->s2_done[j] = 2;
            queue_decompress(op, ob->r, j);
        }

    for (int k = 0; k < ob->n; k++)
        if (k != ob->r && ob->ps_sent[k] <= ob->nseg)
            return;
    if (ob->ag_send_step == ob->n - 1 && ob->ag_recv_step == ob->n - 1 &&
        ob->s2_left == 0 && ob->dec_left == 0 && ob->tasks == 0 &&
        op->refs == 0)
        finish(op);
}

static void *onebit_recv_dest(struct obd_op *op, int from,
                              const struct obd_frame *f, const char **why)
{
    struct onebit *ob = op->coll;
    /* Frames may come before our own codec work is done: every buffer
     * exists from the start of the op. */
    if (f->step == 0) {
        size_t x = ob->ps_recv[from];
        if (from == ob->r || f->segment != x || x > ob->nseg) {
            *why = "parameter-server frame out of order";
            return NULL;
        }
        if (x == 0) {
            if (f->len != sizeof(float)) {
                *why = "scale frame of the wrong length";
                return NULL;
            }
            return &ob->scales[from];
        }
        if (f->len != seg_elems(ob, x - 1) / 8) {
            *why = "payload length differs from the segment's";
            return NULL;
        }
        return ob->in[from] + (x - 1) * ob->seg / 8;
    }

    int s = (int)f->step - 1;
    if (from != obd_ring_mod(ob->r - 1, ob->n) || s != ob->ag_recv_step ||
        f->segment != ob->ag_recv_x) {
        *why = "allgather frame out of order";
        return NULL;
    }
    int chunk = obd_ring_mod(ob->r - s - 1, ob->n);
    if (ob->ag_recv_x == 0) {
        if (f->len != sizeof(float)) {
            *why = "scale frame of the wrong length";
            return NULL;
        }
        return &ob->sscales[chunk];
    }
    if (f->len != seg_elems(ob, ob->ag_recv_x - 1) / 8) {
        *why = "payload length differs from the segment's";
        return NULL;
    }
    return ob->out +
           ((size_t)chunk * ob->C + (ob->ag_recv_x - 1) * ob->seg) / 8;
}

static void onebit_recv_done(struct obd_op *op, int from,
                             const struct obd_frame *f)
{
    struct onebit *ob = op->coll;
    if (f->step == 0) {
        if (ob->ps_recv[from] == 0)
            ob->have_scale[from] = 1;
        ob->ps_recv[from]++;
        return;
    }
    int s = (int)f->step - 1;
    int chunk = obd_ring_mod(ob->r - s - 1, ob->n);
    if (ob->ag_recv_x == 0) {
        ob->have_sscale[chunk] = 1;
    } else {
        ob->seg_in[(size_t)chunk * ob->nseg + ob->ag_recv_x - 1] = 1;
        queue_decompress(op, chunk, ob->ag_recv_x - 1);
    }
    if (++ob->ag_recv_x > ob->nseg) {
        ob->ag_recv_x = 0;
        ob->ag_recv_step++;
    }
}

static void onebit_waiting_on(const struct obd_op *op, char *buf, size_t len)
{
    const struct onebit *ob = op->coll;
    if (ob->scale < 0) {
        snprintf(buf, len, "this node's codec work");
        return;
    }
    for (int k = 0; k < ob->n; k++)
        if (k != ob->r && ob->ps_recv[k] <= ob->nseg) {
            snprintf(buf, len, "node %d's bits of chunk %d", k, ob->r);
            return;
        }
    if (ob->ag_recv_step < ob->n - 1)
        snprintf(buf, len, "allgather data from node %d (step %d)",
                 obd_ring_mod(ob->r - 1, ob->n), ob->ag_recv_step);
    else
        snprintf(buf, len, "codec work or node %d to take our data",
                 obd_ring_mod(ob->r + 1, ob->n));
}

static void onebit_free(struct obd_op *op)
{
    struct onebit *ob = op->coll;
    struct obd_daemon *d = ob->d;
    struct obd_ef *ef = ob->ef;
    free(ob->in);
    obd_daemon_scratch_put(ob->d, ob->b, ob->b_cap);
    free(ob->wsums);
    free(ob->w2_done);
    free(ob->scales);
    free(ob->have_scale);
    free(ob->ps_recv);
    free(ob->ps_sent);
    free(ob->ssums);
    free(ob->s1_queued);
    free(ob->s2_done);
    free(ob->sscales);
    free(ob->have_sscale);
    free(ob->seg_in);
    int began = ob->began;
    free(ob);
    op->coll = NULL;

    if (ef == NULL || !began || --ef->users > 0)
        return;
    if (ef->doomed) {
        obd_ef_free(ef);
        return;
    }
    /* An op of this key may be waiting for the state (onebit_can_start). */
    obd_job_kick_all(d);
}

/* A key's state is used by one op at a time: after a failure the old op's
 * codec tasks may still run, and the next op on the key waits for them
 * (its frames wait in the sockets meanwhile). */
static int onebit_can_start(struct obd_op *op)
{
    struct obd_daemon *d = op->job->d;
    char why[256];
    struct obd_ef *ef;
    if (d->cfg.nodes == 1)
        return 1;
    if (obd_efstore_get(d, op->job->name, op->desc.key, op->desc.count, &ef,
                        why, sizeof(why)) != 0)
        return 1; /* start reports it */
    return ef->users == 0;
}

/* With one node there is nothing to compress: the exact average. */
static int start_one_node(struct obd_op *op, struct onebit *ob)
{
    float *acc = malloc(ob->count * sizeof(float));
    if (acc == NULL) {
        fail(op, OBCOMM_E_NOMEM, "out of memory");
        return OBCOMM_E_NOMEM;
    }
    obd_reduce_load(OBCOMM_FLOAT32, OBCOMM_SUM, acc,
                    (const void *const *)op->data, ob->ls, ob->count);
    obd_reduce_store_many(OBCOMM_FLOAT32, OBCOMM_AVG, op->data, ob->ls, acc,
                          ob->count, ob->ls);
    free(acc);
    finish(op);
    return 0;
}

static int onebit_start(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    struct onebit *ob = calloc(1, sizeof(*ob));
    if (ob == NULL) {
        obd_op_fail(op, OBCOMM_E_NOMEM, 1, "out of memory");
        return OBCOMM_E_NOMEM;
    }
    op->coll = ob;
    ob->d = d;
    ob->n = d->cfg.nodes;
    ob->r = (int)d->cfg.rank;
    ob->ls = job->local_size;
    ob->count = op->desc.count;
    ob->dst = (float *const *)op->data;
    ob->scale = -1;
    obd_metric_add(&d->metrics, OBD_M_ONEBIT_LOGICAL_BYTES,
                   ob->count * sizeof(float));
    if (ob->n == 1)
        return start_one_node(op, ob);

    char why[256];
    int rc = obd_efstore_get(d, job->name, op->desc.key, ob->count, &ob->ef,
                             why, sizeof(why));
    if (rc) {
        fail(op, rc, why);
        return rc;
    }
    ob->impl = obd_codec_best();
    ob->N = ob->ef->padded;
    ob->C = ob->N / (size_t)ob->n;
    /* Segments are whole codec blocks (the server's block sums must not
     * depend on them) of about segment_bytes of packed bits. */
    size_t blocks = (size_t)d->cfg.segment_bytes * 8 / OBD_CODEC_BLOCK;
    ob->seg = (blocks ? blocks : 1) * OBD_CODEC_BLOCK;
    if (ob->seg > ob->C)
        ob->seg = ob->C;
    ob->nseg = (ob->C + ob->seg - 1) / ob->seg;

    return begin(op);
}

struct work {
    uint8_t *bits, *out;
    uint8_t **in;
    int n;
};

static void work_free(void *p)
{
    struct work *w = p;
    if (w == NULL)
        return;
    free(w->bits);
    free(w->out);
    for (int k = 0; w->in && k < w->n; k++)
        free(w->in[k]);
    free(w->in);
    free(w);
}

/* The packed buffers of a key, kept with its state: allocating them fresh
 * on every op costs a page fault per 4 KiB. */
static struct work *work_get(struct onebit *ob)
{
    struct obd_ef *ef = ob->ef;
    if (ef->work != NULL)
        return ef->work;
    struct work *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return NULL;
    w->n = ob->n;
    w->bits = malloc(ob->N / 8);
    w->out = malloc(ob->N / 8);
    w->in = calloc((size_t)ob->n, sizeof(*w->in));
    int ok = w->bits && w->out && w->in;
    for (int k = 0; ok && k < ob->n; k++)
        if (k != ob->r)
            ok = (w->in[k] = malloc(ob->C / 8)) != NULL;
    if (!ok) {
        work_free(w);
        return NULL;
    }
    ef->work = w;
    ef->work_free = work_free;
    ef->work_bytes = 2 * ob->N / 8 + (size_t)(ob->n - 1) * ob->C / 8;
    obd_efstore_account(ob->d);
    return w;
}

/* Allocates the op's buffers and queues the first pass. */
static int begin(struct obd_op *op)
{
    struct onebit *ob = op->coll;
    struct obd_daemon *d = ob->d;
    size_t n = (size_t)ob->n, nseg = ob->nseg;
    ob->ef->users++;
    ob->began = 1;
    struct work *w = work_get(ob);
    if (ob->ls > 1)
        ob->b = obd_daemon_scratch_get(d, ob->N * sizeof(float), &ob->b_cap);
    ob->wsums = calloc(ob->N / OBD_CODEC_BLOCK + 1, sizeof(double));
    ob->w2_done = calloc(n * nseg, 1);
    ob->in = calloc(n, sizeof(*ob->in));
    ob->scales = calloc(n, sizeof(float));
    ob->have_scale = calloc(n, 1);
    ob->ps_recv = calloc(n, sizeof(size_t));
    ob->ps_sent = calloc(n, sizeof(size_t));
    ob->ssums = calloc(ob->C / OBD_CODEC_BLOCK + 1, sizeof(double));
    ob->s1_queued = calloc(nseg, 1);
    ob->s2_done = calloc(nseg, 1);
    ob->sscales = calloc(n, sizeof(float));
    ob->have_sscale = calloc(n, 1);
    ob->seg_in = calloc(n * nseg, 1);
    int ok = w && (ob->b || ob->ls == 1) && ob->wsums && ob->w2_done &&
             ob->in && ob->scales && ob->have_scale && ob->ps_recv &&
             ob->ps_sent && ob->ssums && ob->s1_queued && ob->s2_done &&
             ob->sscales && ob->have_sscale && ob->seg_in;
    if (!ok) {
        fail(op, OBCOMM_E_NOMEM, "out of memory for codec buffers");
        return OBCOMM_E_NOMEM;
    }
    ob->bits = w->bits;
    ob->out = w->out;
    for (int k = 0; k < ob->n; k++)
        ob->in[k] =
            k == ob->r ? ob->bits + (size_t)ob->r * ob->C / 8 : w->in[k];
    ob->s1_left = nseg;
    ob->s2_left = nseg;
    ob->dec_left = n * nseg;

    /* W1 over whole blocks, split across the pool's threads. */
    size_t nblocks = (ob->N + OBD_CODEC_BLOCK - 1) / OBD_CODEC_BLOCK;
    size_t parts = (size_t)d->threads;
    if (parts > nblocks)
        parts = nblocks;
    ob->w1_left = parts;
    for (size_t p = 0; p < parts; p++) {
        size_t b0 = nblocks * p / parts, b1 = nblocks * (p + 1) / parts;
        size_t end =
            b1 * OBD_CODEC_BLOCK < ob->N ? b1 * OBD_CODEC_BLOCK : ob->N;
        if (queue(op, T_W1, 0, 0, b0 * OBD_CODEC_BLOCK, end)) {
            ob->w1_left -= parts - p;
            fail(op, OBCOMM_E_NOMEM, "cannot queue codec work");
            return OBCOMM_E_NOMEM;
        }
    }
    return 0;
}

const struct obd_algo obd_algo_onebit = {
    .kind = OBCOMM_KIND_ALLREDUCE_1BIT,
    .name = "1-bit allreduce",
    .start = onebit_start,
    .recv_dest = onebit_recv_dest,
    .recv_done = onebit_recv_done,
    .progress = progress,
    .free = onebit_free,
    .waiting_on = onebit_waiting_on,
    .can_start = onebit_can_start,
};

/* Reset and snapshot move no data: the announce exchange already put every
 * node at the same point of the job, which is all they need. */
static int reset_start(struct obd_op *op)
{
    obd_efstore_reset(op->job->d, op->job->name, op->desc.key);
    obd_op_finish(op);
    return 0;
}

static int snapshot_start(struct obd_op *op)
{
    char why[512];
    int rc = obd_efstore_save(op->job->d, op->job->name, why, sizeof(why));
    if (rc) {
        obd_op_fail(op, rc, 1, "op %llu of job %s: snapshot on node %lld: %s",
                    (unsigned long long)op->seq, op->job->name,
                    (long long)op->job->d->cfg.rank, why);
        return rc;
    }
    obd_op_finish(op);
    return 0;
}

static int reset_can_start(struct obd_op *op)
{
    struct obd_ef *ef =
        obd_efstore_find(op->job->d, op->job->name, op->desc.key);
    return ef == NULL || ef->users == 0;
}

static int snapshot_can_start(struct obd_op *op)
{
    return obd_efstore_idle(op->job->d, op->job->name);
}

static void no_free(struct obd_op *op)
{
    (void)op;
}

const struct obd_algo obd_algo_onebit_reset = {
    .kind = OBCOMM_KIND_RESET_1BIT,
    .name = "1-bit reset",
    .start = reset_start,
    .recv_dest = obd_coll_no_data,
    .recv_done = obd_coll_no_recv,
    .progress = obd_coll_no_progress,
    .free = no_free,
    .waiting_on = obd_coll_waiting_on_nobody,
    .can_start = reset_can_start,
};

const struct obd_algo obd_algo_onebit_snapshot = {
    .kind = OBCOMM_KIND_SNAPSHOT_1BIT,
    .name = "1-bit snapshot",
    .start = snapshot_start,
    .recv_dest = obd_coll_no_data,
    .recv_done = obd_coll_no_recv,
    .progress = obd_coll_no_progress,
    .free = no_free,
    .waiting_on = obd_coll_waiting_on_nobody,
    .can_start = snapshot_can_start,
};
