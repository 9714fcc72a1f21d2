/* The 1-bit compressed allreduce among nodes (docs/design.md, "The
 * compressed allreduce, exactly" and "The system"), as an explicit state
 * machine on the loop thread. The codec passes it schedules are plain
 * tasks (onebit_task.h) run on the worker pool.
 *
 * On every node, for op (job, key, count), the op moves through phases:
 *   NORM      WORKER tasks, one pass over each segment of the tensor (the
 *             lazy worker step, codec.h): the exact average of the
 *             trainers plus the worker error, rewritten in place into the
 *             key's worker state, its signs and its block sums; each
 *             segment's signs go to the chunk's server as soon as they
 *             are packed (parameter-server phase); then our scale, and the
 *             worker state commits;
 *   SCALES    our scale follows our signs to every node; the op waits for
 *             every node's scale;
 *   EXCHANGE  as the server of our chunk we run the lazy server step over
 *             a segment once every node's bits of it are in (SERVER: m in
 *             place into the server state, its signs and block sums); with
 *             every segment done the server scale is known and the server
 *             state commits; the servers' chunks travel around the ring
 *             (allgather), each segment's signs as soon as they are packed
 *             and the chunk's server scale after them, and every segment
 *             is decoded into the trainers' buffers once it and its
 *             chunk's scale are in;
 *   COMMIT    everything sent, received and decoded here; the node
 *             reports so to every node and answers success only once every
 *             node has. A node that meets a bad scale or a NaN fails the op
 *             before it reports, and its failure reaches every node before
 *             any answers: the op has one outcome on every rank (only a
 *             link lost after a node's report can still split it);
 *   DONE      every node reported.
 * Segments have states of their own (sign_seg, srv_seg, res_seg below).
 * With one node the op has one phase of its own instead:
 *   AVERAGE   AVERAGE tasks (onebit_task.h) put the exact average of the
 *             trainers into their buffers, in pieces on the pool when
 *             the tensor is large; no state is kept.
 *
 * Error feedback on failure (state kept in place, codec.h and
 * efstate.h): the worker pass changes the key's state from its first
 * segment on, and fp32 cannot undo it. From the moment the worker tasks
 * are queued until the server state commits, the key is torn: an op that
 * fails in between (a NaN or Inf on any node, a bad scale, a lost node, a
 * timeout) resets the key's error feedback to zero at its next op,
 * counted in ef_resets, and a snapshot meanwhile does not save it: a
 * failed op costs its key the accumulated error (codec.h says why the
 * state is kept in place all the same). So that the nodes stay alike,
 * every node does the same whenever the failed op had been agreed on
 * anywhere (every node's view in and alike: some node may have begun its
 * pass), also a node whose own pass had not begun yet or had already
 * committed (onebit_failed). An op that fails before it was agreed on
 * (a mismatch, a trainer that left, a deadline or a shutdown while
 * collecting) leaves every state as it was.
 * Events (a task done, a frame in) only record what happened and post the
 * op; step() is the one place that makes transitions, and every error on
 * the way (a queue that fails, a send that fails, a bad scale) fails the
 * op, which every other node then learns from our announce.
 *
 * Frames: step 0 carries the parameter-server phase: segments 0..nseg-1
 * our packed bits of the chunk, in order, each sent as soon as the worker
 * pass has produced it (the signs do not need the scale), then segment
 * nseg our 4-byte worker scale. Step 1 + s is step s of the allgather, in
 * the same shape: segments 0..nseg-1 the chunk's packed bits, in order,
 * then segment nseg its 4-byte server scale (protocol 7; the scale came
 * first until protocol 6, so the allgather waited for the whole server
 * pass).
 */
#include "coll.h"
#include "err.h"

#include <obcomm.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec.h"
#include "efstate.h"
#include "efstore.h"
#include "onebit_task.h"
#include "ops.h"
#include "ring.h"

enum phase { PH_NORM, PH_SCALES, PH_EXCHANGE, PH_COMMIT, PH_AVERAGE, PH_DONE };

/* A segment of our signs of one chunk. */
enum sign_seg { SG_PACKING, SG_PACKED };
/* A segment of the chunk we serve. */
enum srv_seg { SV_INPUTS, SV_PACKING, SV_PACKED };
/* A segment of one chunk's result. */
enum res_seg { RS_WAIT, RS_IN, RS_DECODING, RS_DONE };

/* Spans of the op's steps for the timeline (trace.h): first and last
 * moment of each, 0 while it has not begun. */
enum span {
    SP_COMPRESS,
    SP_PS_SEND,
    SP_SERVER,
    SP_ALLGATHER,
    SP_DECODE,
    SP_AVERAGE,
    SP_COUNT
};
static const char *const span_names[SP_COUNT] = {
    "compress",    "parameter-server send",
    "server step", "allgather",
    "decompress",  "average"};

struct onebit {
    struct obd_daemon *d;
    struct obd_ef *ef;
    struct obd_onebit_ctx ctx; /* what the tasks read and write */
    int n, r, ls;
    size_t count, N, C; /* elements; padded; per chunk */
    size_t seg, nseg;   /* elements per segment; segments per chunk */
    enum phase phase;
    int began; /* holds a use of ef */

    /* NORM: WORKER tasks run over whole codec blocks of the padded
     * tensor; block k belongs to the task of the segment holding element
     * k * OBD_CODEC_BLOCK (segments smaller than a block share one). */
    size_t norm_left;  /* WORKER tasks not finished */
    uint8_t *blk_done; /* per block of the padded tensor */
    float scale;

    /* Worker side: our signs of chunk k segment j, and the parameter-server
     * frames sent to node k so far (scale, then segments in order). */
    uint8_t *sign; /* enum sign_seg, n * nseg */
    size_t *ps_sent;

    /* Server of chunk r: node k's scale and frames received so far. */
    float *scales;
    uint8_t *have_scale;
    size_t *ps_recv;
    uint8_t *srv;    /* enum srv_seg, nseg */
    size_t srv_left; /* segments whose SERVER task has not finished */
    float sscale;

    /* Allgather and decoding. */
    float *sscales;
    uint8_t *have_sscale;
    uint8_t *res; /* enum res_seg, n * nseg */
    int ag_send_step, ag_recv_step;
    size_t ag_send_x, ag_recv_x; /* 0..nseg-1 bits, nseg the scale */
    int tasks;                   /* tasks in flight */
    uint64_t span[SP_COUNT][2];
};

static void mark(struct onebit *ob, enum span s, uint64_t when)
{
    if (ob->span[s][0] == 0 || when < ob->span[s][0])
        ob->span[s][0] = when;
    if (when > ob->span[s][1])
        ob->span[s][1] = when;
}

static enum span span_of(enum obd_onebit_pass pass)
{
    switch (pass) {
    case OBD_ONEBIT_WORKER:
        return SP_COMPRESS;
    case OBD_ONEBIT_SERVER:
        return SP_SERVER;
    case OBD_ONEBIT_DECODE:
        break;
    case OBD_ONEBIT_AVERAGE:
        return SP_AVERAGE;
    }
    return SP_DECODE;
}

struct task {
    uv_work_t req;
    struct obd_op *op;
    struct onebit *ob;
    struct obd_onebit_task t;
    int chunk; /* DECODE */
    size_t seg;
    uint64_t begin_ns, end_ns; /* on the worker thread, for the timeline */
    int timed;                 /* set on the loop: a trace file is open */
    uint64_t cpu_ns;           /* the worker thread's CPU time in the pass */
};

static size_t seg_elems(const struct onebit *ob, size_t j)
{
    size_t first = j * ob->seg;
    return ob->C - first < ob->seg ? ob->C - first : ob->seg;
}

/* ---- tasks ---- */

/* CPU time of the calling thread: with the wall time of a pass, the
 * timeline shows how long a pass waited for a core. */
static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void run_task(uv_work_t *req)
{
    struct task *t = container_of(req, struct task, req);
    uint64_t cpu0 = t->timed ? thread_cpu_ns() : 0;
    t->begin_ns = uv_hrtime();
    obd_onebit_task_run(&t->ob->ctx, &t->t);
    t->end_ns = uv_hrtime();
    t->cpu_ns = t->timed ? thread_cpu_ns() - cpu0 : 0;
}

/* Records what the task did; step() acts on it on the op's next turn. */
static void task_done(uv_work_t *req, int status)
{
    struct task *t = container_of(req, struct task, req);
    struct obd_op *op = t->op;
    struct onebit *ob = t->ob;
    (void)status;
    ob->tasks--;
    mark(ob, span_of(t->t.pass), t->begin_ns);
    mark(ob, span_of(t->t.pass), t->end_ns);
    if (ob->d->trace.f != NULL) {
        static const char *const pass_names[] = {"worker pass", "server pass",
                                                 "decode", "average"};
        char args[128];
        snprintf(args, sizeof(args),
                 "\"seq\":%llu,\"begin\":%zu,\"end\":%zu,\"cpu_us\":%.1f",
                 (unsigned long long)op->seq, t->t.begin, t->t.end,
                 (double)t->cpu_ns / 1e3);
        obd_trace_span(ob->d, pass_names[t->t.pass], "codec", OBD_TRACE_POOL,
                       t->begin_ns, t->end_ns, args);
    }
    switch (t->t.pass) {
    case OBD_ONEBIT_WORKER:
        ob->norm_left--;
        for (size_t b = t->t.begin; b < t->t.end; b += OBD_CODEC_BLOCK)
            ob->blk_done[b / OBD_CODEC_BLOCK] = 1;
        break;
    case OBD_ONEBIT_SERVER:
        ob->srv[t->seg] = SV_PACKED;
        ob->srv_left--;
        break;
    case OBD_ONEBIT_DECODE:
        ob->res[(size_t)t->chunk * ob->nseg + t->seg] = RS_DONE;
        break;
    case OBD_ONEBIT_AVERAGE:
        obd_metric_add(&ob->d->metrics, OBD_M_LOCAL_BYTES_WRITTEN,
                       t->t.written);
        break;
    }
    free(t);
    obd_op_task_end(op);
}

static void fail(struct obd_op *op, int status, const char *what)
{
    struct onebit *ob = op->coll;
    obd_op_fail(op, status, 1,
                "op %llu of job %s (1-bit, key %llu) on node %d: %s",
                (unsigned long long)op->seq, op->job->name,
                (unsigned long long)op->desc.key, ob->r, what);
}

/* Queues a task; on failure fails the op and returns non-zero. */
static int queue(struct obd_op *op, enum obd_onebit_pass pass, int chunk,
                 size_t seg, size_t begin, size_t end, float scale)
{
    struct onebit *ob = op->coll;
    struct task *t = calloc(1, sizeof(*t));
    int rc = t ? 0 : OBD_E_NOMEM;
    if (t != NULL) {
        t->op = op;
        t->ob = ob;
        t->t = (struct obd_onebit_task){
            .pass = pass, .begin = begin, .end = end, .scale = scale};
        t->chunk = chunk;
        t->seg = seg;
        t->timed = ob->d->trace.f != NULL;
        rc = uv_queue_work(&ob->d->loop, &t->req, run_task, task_done)
                 ? OBD_E_NOMEM
                 : 0;
    }
    if (rc) {
        free(t);
        fail(op, OBD_E_NOMEM, "cannot queue codec work");
        return rc;
    }
    obd_op_task_begin(op);
    ob->tasks++;
    return 0;
}

/* Sends one frame; on failure fails the op and returns non-zero. */
static int send_frame(struct obd_op *op, int to, uint32_t step, size_t x,
                      const void *payload, size_t len)
{
    struct onebit *ob = op->coll;
    int rc = obd_op_send(op, to, step, (uint32_t)x, payload, (uint32_t)len);
    mark(ob, step == 0 ? SP_PS_SEND : SP_ALLGATHER, uv_hrtime());
    if (rc) {
        char msg[96];
        snprintf(msg, sizeof(msg), "cannot send to node %d", to);
        fail(op, OBD_E_PEER_LOST, msg);
        return rc;
    }
    obd_metric_add(&ob->d->metrics, OBD_M_ONEBIT_BYTES_SENT,
                   len + OBD_FRAME_HDR);
    return 0;
}

/* ---- the transitions ---- */

/* Parameter-server phase: node k gets our bits of chunk k segment by
 * segment as they are packed, then our scale once it is known. */
static int send_to_servers(struct obd_op *op)
{
    struct onebit *ob = op->coll;
    for (int k = 0; k < ob->n; k++) {
        if (k == ob->r)
            continue;
        while (ob->ps_sent[k] <= ob->nseg) {
            size_t x = ob->ps_sent[k];
            if (x == ob->nseg) {
                if (!ob->have_scale[ob->r])
                    break;
                if (send_frame(op, k, 0, x, &ob->scale, sizeof(float)))
                    return -1;
            } else {
                if (ob->sign[(size_t)k * ob->nseg + x] != SG_PACKED)
                    break;
                size_t off = (size_t)k * ob->C + x * ob->seg;
                if (send_frame(op, k, 0, x, ob->ctx.bits + off / 8,
                               seg_elems(ob, x) / 8))
                    return -1;
            }
            ob->ps_sent[k]++;
        }
    }
    return 0;
}

/* 0 if a scale from node `node` is one the codec can have made (a norm:
 * finite, not negative); else fails the op, naming the sender and the
 * value, announces the failure to every node (those that have not
 * finished fail too) and returns -1. Decoding with it would write NaN or
 * garbage into this node's tensors. */
static int check_scale(struct obd_op *op, int node, const char *kind, float v)
{
    if (isfinite(v) && v >= 0)
        return 0;
    char what[160];
    snprintf(what, sizeof(what), "node %d sent a %s scale that is %s (%g)",
             node, kind, isfinite(v) ? "negative" : "not finite", (double)v);
    fail(op, OBD_E_PROTO, what);
    return -1;
}

/* 1 once every node's scale is in and sane; fails the op on a bad one. */
static int all_scales(struct obd_op *op)
{
    struct onebit *ob = op->coll;
    for (int k = 0; k < ob->n; k++)
        if (!ob->have_scale[k])
            return 0;
    for (int k = 0; k < ob->n; k++)
        if (check_scale(op, k, "worker", ob->scales[k]))
            return 0;
    return 1;
}

/* Marks every segment of our signs whose blocks are all done. */
static void update_signs(struct onebit *ob)
{
    for (int c = 0; c < ob->n; c++)
        for (size_t j = 0; j < ob->nseg; j++) {
            uint8_t *st = &ob->sign[(size_t)c * ob->nseg + j];
            if (*st == SG_PACKED)
                continue;
            size_t begin = (size_t)c * ob->C + j * ob->seg;
            size_t end = begin + seg_elems(ob, j);
            int done = 1;
            for (size_t k = begin / OBD_CODEC_BLOCK;
                 done && k * OBD_CODEC_BLOCK < end; k++)
                done = ob->blk_done[k];
            if (done)
                *st = SG_PACKED;
        }
}

static int server_inputs_ready(const struct onebit *ob, size_t j)
{
    if (ob->sign[(size_t)ob->r * ob->nseg + j] != SG_PACKED)
        return 0;
    for (int k = 0; k < ob->n; k++)
        if (k != ob->r && ob->ps_recv[k] < j + 1)
            return 0;
    return 1;
}

/* The server of chunk r: runs the lazy server pass over each segment once
 * every node's scale and bits of it are in; with every segment done, forms
 * the server scale and commits the server state. Segments are whole codec
 * blocks of the chunk (or the whole chunk), so the block sums do not
 * depend on them. */
static int serve(struct obd_op *op)
{
    struct onebit *ob = op->coll;
    if (ob->have_sscale[ob->r])
        return 0;
    for (size_t j = 0; j < ob->nseg; j++)
        if (ob->srv[j] == SV_INPUTS && server_inputs_ready(ob, j)) {
            if (queue(op, OBD_ONEBIT_SERVER, ob->r, j, j * ob->seg,
                      j * ob->seg + seg_elems(ob, j), 0))
                return -1;
            ob->srv[j] = SV_PACKING;
        }
    if (ob->srv_left > 0)
        return 0;
    size_t nblocks = (ob->C + OBD_CODEC_BLOCK - 1) / OBD_CODEC_BLOCK;
    if (obd_codec_scale(ob->ctx.ssums, nblocks, ob->C, &ob->sscale)) {
        fail(op, OBD_E_NONFINITE,
             "the server step met a non-finite value (a NaN or Inf in some "
             "node's tensor); this key's error feedback restarts at zero");
        return -1;
    }
    obd_codec_lazy_state_commit(&ob->ef->sl, ob->sscale);
    /* Both states have taken this op's step. */
    ob->ef->torn = 0;
    obd_efstore_applied(ob->ef, op->seq);
    ob->sscales[ob->r] = ob->sscale;
    ob->have_sscale[ob->r] = 1;
    for (size_t j = 0; j < ob->nseg; j++)
        ob->res[(size_t)ob->r * ob->nseg + j] = RS_IN;
    return 0;
}

/* Allgather around the ring: at step s we send chunk r - s and receive
 * chunk r - s - 1; what we receive at step s we forward at step s + 1.
 * Our own chunk's segments leave as the server pass packs them (the signs
 * do not need the server scale), the scale once the pass is over. */
static int allgather(struct obd_op *op)
{
    struct onebit *ob = op->coll;
    int right = obd_ring_mod(ob->r + 1, ob->n);
    while (ob->ag_send_step < ob->n - 1) {
        int s = ob->ag_send_step;
        int chunk = obd_ring_mod(ob->r - s, ob->n);
        size_t x = ob->ag_send_x;
        int ready;
        if (s == 0)
            ready = x == ob->nseg ? ob->have_sscale[ob->r]
                                  : ob->srv[x] == SV_PACKED;
        else
            ready = ob->ag_recv_step > s - 1 ||
                    (ob->ag_recv_step == s - 1 && ob->ag_recv_x > x);
        if (!ready)
            break;
        if (x == ob->nseg) {
            if (send_frame(op, right, (uint32_t)(1 + s), x, &ob->sscales[chunk],
                           sizeof(float)))
                return -1;
        } else {
            size_t off = (size_t)chunk * ob->C + x * ob->seg;
            if (send_frame(op, right, (uint32_t)(1 + s), x,
                           ob->ctx.out + off / 8, seg_elems(ob, x) / 8))
                return -1;
        }
        if (++ob->ag_send_x > ob->nseg) {
            ob->ag_send_x = 0;
            ob->ag_send_step++;
        }
    }
    return 0;
}

/* Decodes every result segment that is in once its chunk's server scale
 * is (the scale follows the chunk's bits); returns how many are done. */
static int decode(struct obd_op *op, size_t *done)
{
    struct onebit *ob = op->coll;
    *done = 0;
    for (int c = 0; c < ob->n; c++)
        for (size_t j = 0; j < ob->nseg; j++) {
            uint8_t *st = &ob->res[(size_t)c * ob->nseg + j];
            if (*st == RS_IN && ob->have_sscale[c]) {
                size_t begin = (size_t)c * ob->C + j * ob->seg;
                if (queue(op, OBD_ONEBIT_DECODE, c, j, begin,
                          begin + seg_elems(ob, j), ob->sscales[c]))
                    return -1;
                *st = RS_DECODING;
            }
            *done += *st == RS_DONE;
        }
    return 0;
}

static int exchange_done(const struct obd_op *op, size_t decoded)
{
    const struct onebit *ob = op->coll;
    for (int k = 0; k < ob->n; k++)
        if (k != ob->r && ob->ps_sent[k] <= ob->nseg)
            return 0;
    return ob->ag_send_step == ob->n - 1 && ob->ag_recv_step == ob->n - 1 &&
           decoded == (size_t)ob->n * ob->nseg && ob->tasks == 0 &&
           obd_op_idle(op);
}

/* The one transition function: runs whenever the op is posted. */
static void step(struct obd_op *op)
{
    struct onebit *ob = op->coll;
    size_t decoded;
    if (op->state != OBD_OP_RUN)
        return;
    switch (ob->phase) {
    case PH_NORM: {
        update_signs(ob);
        if (send_to_servers(op) || ob->norm_left > 0)
            return;
        size_t nblocks = (ob->N + OBD_CODEC_BLOCK - 1) / OBD_CODEC_BLOCK;
        if (obd_codec_scale(ob->ctx.wsums, nblocks, ob->N, &ob->scale)) {
            fail(op, OBD_E_NONFINITE,
                 "the averaged tensor plus error feedback holds a NaN or "
                 "Inf; this key's error feedback restarts at zero");
            return;
        }
        obd_codec_lazy_state_commit(&ob->ef->wl, ob->scale);
        ob->scales[ob->r] = ob->scale;
        ob->have_scale[ob->r] = 1;
        ob->phase = PH_SCALES;
    }
        /* fall through */
    case PH_SCALES:
        if (send_to_servers(op) || !all_scales(op))
            return;
        ob->phase = PH_EXCHANGE;
        /* fall through */
    case PH_EXCHANGE:
        if (send_to_servers(op) || serve(op) || allgather(op) ||
            decode(op, &decoded))
            return;
        if (!exchange_done(op, decoded))
            return;
        ob->phase = PH_COMMIT;
        obd_op_report(op, 0, "");
        /* fall through */
    case PH_COMMIT:
        if (!obd_op_all_reported(op))
            return;
        ob->phase = PH_DONE;
        obd_metric_add(&ob->d->metrics, OBD_M_ONEBIT_OPS, 1);
        obd_op_finish(op);
        return;
    case PH_AVERAGE:
        if (ob->tasks > 0)
            return;
        ob->phase = PH_DONE;
        obd_metric_add(&ob->d->metrics, OBD_M_ONEBIT_OPS, 1);
        obd_op_finish(op);
        return;
    case PH_DONE:
        return;
    }
}

/* ---- frames ---- */

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
        if (x == ob->nseg) {
            if (f->len != sizeof(float)) {
                *why = "scale frame of the wrong length";
                return NULL;
            }
            return &ob->scales[from];
        }
        if (f->len != seg_elems(ob, x) / 8) {
            *why = "payload length differs from the segment's";
            return NULL;
        }
        return (uint8_t *)ob->ctx.in[from] + x * ob->seg / 8;
    }

    int s = (int)f->step - 1;
    if (from != obd_ring_mod(ob->r - 1, ob->n) || s != ob->ag_recv_step ||
        f->segment != ob->ag_recv_x) {
        *why = "allgather frame out of order";
        return NULL;
    }
    int chunk = obd_ring_mod(ob->r - s - 1, ob->n);
    if (ob->ag_recv_x == ob->nseg) {
        if (f->len != sizeof(float)) {
            *why = "scale frame of the wrong length";
            return NULL;
        }
        return &ob->sscales[chunk];
    }
    if (f->len != seg_elems(ob, ob->ag_recv_x) / 8) {
        *why = "payload length differs from the segment's";
        return NULL;
    }
    return ob->ctx.out + ((size_t)chunk * ob->C + ob->ag_recv_x * ob->seg) / 8;
}

static void onebit_recv_done(struct obd_op *op, int from,
                             const struct obd_frame *f)
{
    struct onebit *ob = op->coll;
    if (f->step == 0) {
        if (ob->ps_recv[from] == ob->nseg)
            ob->have_scale[from] = 1;
        ob->ps_recv[from]++;
        return;
    }
    int s = (int)f->step - 1;
    int chunk = obd_ring_mod(ob->r - s - 1, ob->n);
    mark(ob, SP_ALLGATHER, uv_hrtime());
    int scale = ob->ag_recv_x == ob->nseg;
    if (scale)
        ob->have_sscale[chunk] = 1;
    else
        ob->res[(size_t)chunk * ob->nseg + ob->ag_recv_x] = RS_IN;
    if (++ob->ag_recv_x > ob->nseg) {
        ob->ag_recv_x = 0;
        ob->ag_recv_step++;
    }
    /* Chunk c's server scale was made by node c, whoever forwarded it. */
    if (scale)
        check_scale(op, chunk, "server", ob->sscales[chunk]);
}

static void onebit_waiting_on(const struct obd_op *op, char *buf, size_t len)
{
    const struct onebit *ob = op->coll;
    if (ob->phase == PH_NORM) {
        snprintf(buf, len, "this node's codec work");
        return;
    }
    if (ob->phase == PH_AVERAGE) {
        snprintf(buf, len, "the average of this node's trainers");
        return;
    }
    if (ob->phase == PH_COMMIT) {
        size_t off = (size_t)snprintf(buf, len, "the reports of node");
        for (int k = 0; k < ob->n && off < len; k++)
            if (!op->ann[k].reported)
                off += (size_t)snprintf(buf + off, len - off, " %d", k);
        if (off < len)
            snprintf(buf + off, len - off, " that they decoded everything");
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

static int onebit_needs_node(const struct obd_op *op, int k)
{
    const struct onebit *ob = op->coll;
    if (ob->phase == PH_DONE || ob->phase == PH_AVERAGE)
        return 0;
    if (ob->phase == PH_COMMIT)
        return !op->ann[k].reported;
    if (ob->ps_recv[k] <= ob->nseg || ob->ps_sent[k] <= ob->nseg)
        return 1;
    return (k == obd_ring_mod(ob->r - 1, ob->n) &&
            ob->ag_recv_step < ob->n - 1) ||
           (k == obd_ring_mod(ob->r + 1, ob->n) &&
            ob->ag_send_step < ob->n - 1);
}

/* ---- start and end ---- */

/* A failed op that some node may have begun: the key restarts at zero at
 * its next op here too (see the file comment). */
static void onebit_failed(struct obd_op *op)
{
    struct obd_ef *ef =
        obd_efstore_find(op->job->d, op->job->name, op->job->run, op->desc.key);
    if (ef != NULL)
        ef->torn = 1;
}

static void onebit_free(struct obd_op *op)
{
    struct onebit *ob = op->coll;
    int tid = (int)(op->job->id % OBD_TRACE_POOL);
    for (int s = 0; s < SP_COUNT; s++)
        if (ob->span[s][0] != 0)
            obd_trace_span(ob->d, span_names[s], "1-bit", tid, ob->span[s][0],
                           ob->span[s][1], NULL);
    free(ob->blk_done);
    free(ob->ctx.wsums);
    free(ob->ctx.ssums);
    free(ob->sign);
    free(ob->ps_sent);
    free(ob->scales);
    free(ob->have_scale);
    free(ob->ps_recv);
    free(ob->srv);
    free(ob->sscales);
    free(ob->have_sscale);
    free(ob->res);
    /* An op of this key waiting for the state (onebit_can_start) is
     * started by the job's turn that follows every op's free. */
    if (ob->ef != NULL && ob->began)
        obd_efstore_end(ob->d, ob->ef);
    free(ob);
    op->coll = NULL;
}

/* A key's state is used by one op at a time: after a failure the old op's
 * codec tasks may still run, and the next op on the key waits for them
 * (its frames wait in the sockets meanwhile). */
static int onebit_can_start(struct obd_op *op)
{
    struct obd_ef *ef =
        obd_efstore_find(op->job->d, op->job->name, op->job->run, op->desc.key);
    return ef == NULL || ef->users == 0;
}

/* With one node there is nothing to compress: the exact average, in the
 * trainers' buffers, with no buffer of its own. A tensor of at least
 * OBD_RING_POOL_BYTES goes to the pool in two pieces of whole AVERAGE
 * blocks per pool thread, so that the loop stays free and the threads
 * share it; a smaller one runs here, as a pool hop would cost more than
 * the pass. */
static int start_one_node(struct obd_op *op, struct onebit *ob)
{
    ob->ctx = (struct obd_onebit_ctx){
        .n = 1,
        .ls = ob->ls,
        .count = ob->count,
        .dst = (float *const *)op->data,
    };
    ob->phase = PH_AVERAGE;
    if (ob->count * sizeof(float) < OBD_RING_POOL_BYTES) {
        struct obd_onebit_task t = {
            .pass = OBD_ONEBIT_AVERAGE, .begin = 0, .end = ob->count};
        obd_onebit_task_run(&ob->ctx, &t);
        obd_metric_add(&ob->d->metrics, OBD_M_LOCAL_BYTES_WRITTEN, t.written);
        step(op);
        return 0;
    }
    size_t parts = 2 * (size_t)(ob->d->threads > 0 ? ob->d->threads : 1);
    size_t blocks =
        (ob->count + OBD_ONEBIT_AVG_BLOCK - 1) / OBD_ONEBIT_AVG_BLOCK;
    size_t unit = (blocks + parts - 1) / parts * OBD_ONEBIT_AVG_BLOCK;
    for (size_t b = 0; b < ob->count; b += unit)
        if (queue(op, OBD_ONEBIT_AVERAGE, 0, 0, b,
                  ob->count - b < unit ? ob->count : b + unit, 0))
            return OBD_E_NOMEM;
    return 0;
}

/* Allocates the op's buffers and queues the WORKER tasks. */
static int begin(struct obd_op *op)
{
    struct onebit *ob = op->coll;
    struct obd_daemon *d = ob->d;
    size_t n = (size_t)ob->n, nseg = ob->nseg;
    obd_efstore_begin(d, ob->ef);
    ob->began = 1;
    const struct obd_ef_work *w = obd_ef_work(ob->ef, ob->r);
    obd_efstore_account(d);
    size_t nblocks = (ob->N + OBD_CODEC_BLOCK - 1) / OBD_CODEC_BLOCK;
    ob->blk_done = calloc(nblocks, 1);
    ob->ctx.wsums = calloc(ob->N / OBD_CODEC_BLOCK + 1, sizeof(double));
    ob->ctx.ssums = calloc(ob->C / OBD_CODEC_BLOCK + 1, sizeof(double));
    ob->sign = calloc(n * nseg, 1);
    ob->ps_sent = calloc(n, sizeof(size_t));
    ob->scales = calloc(n, sizeof(float));
    ob->have_scale = calloc(n, 1);
    ob->ps_recv = calloc(n, sizeof(size_t));
    ob->srv = calloc(nseg, 1);
    ob->sscales = calloc(n, sizeof(float));
    ob->have_sscale = calloc(n, 1);
    ob->res = calloc(n * nseg, 1);
    if (!w || !ob->blk_done || !ob->ctx.wsums || !ob->ctx.ssums || !ob->sign ||
        !ob->ps_sent || !ob->scales || !ob->have_scale || !ob->ps_recv ||
        !ob->srv || !ob->sscales || !ob->have_sscale || !ob->res) {
        fail(op, OBD_E_NOMEM, "out of memory for codec buffers");
        return OBD_E_NOMEM;
    }
    ob->ctx = (struct obd_onebit_ctx){
        .impl = obd_codec_best(),
        .n = ob->n,
        .ls = ob->ls,
        .count = ob->count,
        .dst = (float *const *)op->data,
        .wprev = obd_codec_lazy_state_prev(&ob->ef->wl),
        .wnext = obd_codec_lazy_state_next(&ob->ef->wl),
        .sprev = obd_codec_lazy_state_prev(&ob->ef->sl),
        .snext = obd_codec_lazy_state_next(&ob->ef->sl),
        .wsums = ob->ctx.wsums,
        .ssums = ob->ctx.ssums,
        .bits = w->bits,
        .in = (const uint8_t *const *)w->in,
        .scales = ob->scales,
        .out = w->out,
        .chunk_begin = (size_t)ob->r * ob->C,
        .stream = ob->count * sizeof(float) >= OBD_ONEBIT_STREAM_BYTES,
    };
    ob->srv_left = nseg;

    /* One WORKER task per segment, over the blocks that begin in it, our
     * signs of every chunk in the order of their servers starting after
     * us, so that the nodes do not all feed the same server first. From
     * here on the state changes in place: torn until the server commits
     * (or reset at the next op, see the file comment). */
    ob->phase = PH_NORM;
    ob->ef->torn = 1;
    for (int i = 1; i <= ob->n; i++) {
        int c = obd_ring_mod(ob->r + i, ob->n);
        for (size_t j = 0; j < nseg; j++) {
            size_t first = (size_t)c * ob->C + j * ob->seg;
            size_t last = first + seg_elems(ob, j);
            size_t b0 = (first + OBD_CODEC_BLOCK - 1) / OBD_CODEC_BLOCK;
            size_t b1 = (last + OBD_CODEC_BLOCK - 1) / OBD_CODEC_BLOCK;
            if (b0 >= b1)
                continue; /* no block begins in this segment */
            size_t end =
                b1 * OBD_CODEC_BLOCK < ob->N ? b1 * OBD_CODEC_BLOCK : ob->N;
            if (queue(op, OBD_ONEBIT_WORKER, c, j, b0 * OBD_CODEC_BLOCK, end,
                      0))
                return OBD_E_NOMEM;
            ob->norm_left++;
        }
    }
    return 0;
}

static int onebit_start(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    struct onebit *ob = calloc(1, sizeof(*ob));
    if (ob == NULL) {
        obd_op_fail(op, OBD_E_NOMEM, 1, "out of memory");
        return OBD_E_NOMEM;
    }
    op->coll = ob;
    ob->d = d;
    ob->n = d->cfg.nodes;
    ob->r = (int)d->cfg.rank;
    ob->ls = job->local_size;
    ob->count = op->desc.count;
    obd_metric_add(&d->metrics, OBD_M_ONEBIT_LOGICAL_BYTES,
                   ob->count * sizeof(float));
    if (ob->n == 1)
        return start_one_node(op, ob);

    char why[256];
    int rc = obd_efstore_get(d, job->name, job->run, op->desc.key, ob->count,
                             &ob->ef, why, sizeof(why));
    if (rc) {
        fail(op, rc, why);
        return rc;
    }
    ob->N = ob->ef->padded;
    ob->C = ob->N / (size_t)ob->n;
    /* Segments are whole codec blocks (the server's block sums must not
     * depend on them) of about segment_bytes of the fp32 tensor, as the
     * ring's are: every pass, frame and decode covers that much, so that a
     * tensor of a few segment_bytes per node already pipelines (segments
     * of segment_bytes of packed bits made a 64 MiB tensor on 2 nodes one
     * segment per chunk: no overlap at all). */
    size_t blocks =
        (size_t)d->cfg.segment_bytes / (sizeof(float) * OBD_CODEC_BLOCK);
    ob->seg = (blocks ? blocks : 1) * OBD_CODEC_BLOCK;
    if (ob->seg > ob->C)
        ob->seg = ob->C;
    ob->nseg = (ob->C + ob->seg - 1) / ob->seg;
    return begin(op);
}

/* The 1-bit allreduce averages fp32 elements, whatever was asked. */
static void onebit_normalize(struct obd_opdesc *d)
{
    d->dtype = OBCOMM_FLOAT32;
    d->redop = OBCOMM_AVG;
    d->root = 0;
}

/* One buffer of count fp32 elements (its state's key is any number). */
static int onebit_check(const struct obd_opdesc *d, int world, uint64_t *bytes,
                        uint64_t *out_bytes, char *why, size_t len)
{
    (void)world;
    if (d->count == 0) {
        snprintf(why, len, "1-bit allreduce of 0 elements");
        return OBD_E_INVAL;
    }
    if (d->count > UINT64_MAX / 8) {
        snprintf(why, len, "1-bit allreduce of %llu elements overflows",
                 (unsigned long long)d->count);
        return OBD_E_INVAL;
    }
    *bytes = d->count * sizeof(float);
    *out_bytes = 0;
    return 0;
}

const struct obd_algo obd_algo_onebit = {
    .kind = OBCOMM_KIND_ALLREDUCE_1BIT,
    .name = "1-bit allreduce",
    .normalize = onebit_normalize,
    .check = onebit_check,
    .start = onebit_start,
    .recv_dest = onebit_recv_dest,
    .recv_done = onebit_recv_done,
    .progress = step,
    .free = onebit_free,
    .waiting_on = onebit_waiting_on,
    .needs_node = onebit_needs_node,
    .can_start = onebit_can_start,
    .failed = onebit_failed,
};
