/* Throughput of the 1-bit codec against memcpy and against the traffic
 * floor of a single-pass codec, all measured in the same run.
 *
 * usage: bench_codec [-n ELEMS] [-r REPEATS] [-t THREADS] [-i IMPL] [--json]
 *
 * Every operation runs over one tensor of ELEMS fp32 elements (default
 * 64 Mi, i.e. 256 MiB), for each implementation, on one thread and on
 * THREADS threads (default: all online CPUs); -i portable or -i avx2 runs
 * only that implementation. Baselines, one thread each: memcpy of the
 * input into another buffer (reads 4, writes 4 bytes per element), and
 * "floor", a plain pass y[i] = x[i] + y[i] that reads two fp32 streams and
 * writes one in place: the memory traffic of a single-pass codec step
 * (read the input and the state, write the state), so a codec row near
 * ratio_floor 1.0 is memory-bound. "floor (2 buffers)" writes
 * z[i] = x[i] + y[i] to a third buffer with plain stores.
 *
 * REPEATS rounds: each round times memcpy, the floors and every op once,
 * back to back, so load from other processes on a shared machine hits
 * baselines and ops alike. ms is the median time over rounds; a ratio is
 * the median over rounds of the op's time / the baseline's time in the
 * same round. GB/s is tensor bytes (ELEMS * 4) / ms for every row, so rows
 * compare directly. All buffers are 64-byte aligned, like the daemon's.
 *
 * The server step treats the whole tensor as one chunk fed by 4
 * participants (4 packed inputs of ELEMS / 8 bytes and the server error of
 * ELEMS floats), so memcpy of the tensor is memcpy of its chunk.
 *
 * Rows:
 *   lazy compress / lazy server (n=4)
 *                            the single-pass lazy steps (codec.h, "Lazy
 *                            error feedback") from a DEFERRED state, with
 *                            the state in place (as the daemon keeps it)
 *                            and on two buffers used in turn (next apart
 *                            from prev), committed after every step
 *                            through obd_codec_lazy_state
 *   lazy_error               materialising the error e of a lazy state
 *   decompress, decompress_stream (streaming stores)
 *   lazy compress_avg (nsrc=2, 2 buffers)
 *                            the lazy step over the average of AVG_NSRC
 *                            local buffers: (AVG_NSRC + 2) * 4 bytes per
 *                            element
 *
 * Multi-threaded runs split the tensor into whole OBD_CODEC_BLOCK blocks:
 * the pass collects every block's sum of squares and obd_codec_scale
 * combines them in block order. Before timing, the program checks that
 * three steps of every lazy op, on one thread and on THREADS, equal three
 * steps of the two-pass reference of tests/codec_ref.h (bits, scale and
 * error, byte for byte), and exits non-zero if not. The reference is not
 * timed: it is plain C written to be checked, not a contender. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codec.h"
#include "bench_util.h"
#include "codec_ref.h"

#define MAX_THREADS 256
#define SERVER_N    4
#define AVG_NSRC    2

/* A lazy state in place (one buffer, as the daemon keeps it) or on two
 * buffers used in turn: a step reads st[cur] and writes st[1 - cur],
 * the kernels' mode with next apart from prev (codec.h says why the
 * daemon does not use it). */
struct lazy_state {
    float *buf[2];
    int two, cur;
    struct obd_codec_lazy_state st[2];
};

struct bench {
    size_t elems, nblocks;
    float *x, *e, *dst, *err, *out, *x2, *bsc, *fz;
    const float *src[AVG_NSRC];
    uint8_t *bits, *sbits, *in_bits[SERVER_N];
    const uint8_t *in[SERVER_N];
    float scales[SERVER_N];
    double *sums;
    struct lazy_state wl, wl1, sl, sl1; /* worker/server, 2 buffers/in place */
};

enum {
    OP_LAZY_COMPRESS_1,
    OP_LAZY_COMPRESS,
    OP_LAZY_SERVER_1,
    OP_LAZY_SERVER,
    OP_LAZY_ERROR,
    OP_DECOMPRESS,
    OP_DECOMPRESS_STREAM,
    OP_LAZY_COMPRESS_AVG,
    NOPS
};

/* How an op runs: LAZY ops are one pass collecting block sums, then a
 * commit with the scale; PLAIN ops are one pass with no scale. */
enum kind { LAZY, PLAIN };

/* The step of the reference a LAZY op must equal. */
enum ref { REF_NONE, REF_COMPRESS, REF_SERVER, REF_COMPRESS_AVG, NREFS };

static const struct {
    const char *name;
    enum kind kind;
    enum ref ref;
} ops[NOPS] = {
    [OP_LAZY_COMPRESS_1] = {"lazy compress (in place)", LAZY, REF_COMPRESS},
    [OP_LAZY_COMPRESS] = {"lazy compress (2 buffers)", LAZY, REF_COMPRESS},
    [OP_LAZY_SERVER_1] = {"lazy server (n=4, in place)", LAZY, REF_SERVER},
    [OP_LAZY_SERVER] = {"lazy server (n=4, 2 buffers)", LAZY, REF_SERVER},
    [OP_LAZY_ERROR] = {"lazy_error", PLAIN, REF_NONE},
    [OP_DECOMPRESS] = {"decompress", PLAIN, REF_NONE},
    [OP_DECOMPRESS_STREAM] = {"decompress_stream", PLAIN, REF_NONE},
    [OP_LAZY_COMPRESS_AVG] = {"lazy compress_avg (nsrc=2, 2 buffers)", LAZY,
                              REF_COMPRESS_AVG},
};

/* One thread's share of an operation: blocks [b0, b1). */
struct job {
    const struct obd_codec_impl *impl;
    struct bench *b;
    size_t b0, b1;
    int op;
    float scale;
};

/* Every buffer 64-byte aligned, as the daemon's are: the trainers'
 * shared memory is page-aligned and codec.h asks for aligned state. */
static void *xmalloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);

    if (p == NULL) {
        fprintf(stderr, "bench_codec: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

static size_t block_end(const struct bench *b, size_t j)
{
    size_t end = (j + 1) * OBD_CODEC_BLOCK;

    return end < b->elems ? end : b->elems;
}

static struct lazy_state *op_state(struct bench *b, int op)
{
    switch (op) {
    case OP_LAZY_COMPRESS_1:
        return &b->wl1;
    case OP_LAZY_SERVER_1:
        return &b->sl1;
    case OP_LAZY_SERVER:
    case OP_LAZY_ERROR:
        return &b->sl;
    default:
        return &b->wl;
    }
}

/* The previous state and the buffer the step writes. */
static void lazy_prev(const struct lazy_state *st, struct obd_codec_lazy *prev,
                      float **next)
{
    *prev = obd_codec_lazy_state_prev(&st->st[st->cur]);
    *next = obd_codec_lazy_state_next(&st->st[st->two ? 1 - st->cur : st->cur]);
}

/* The step succeeded. */
static void lazy_commit(struct lazy_state *st, float scale)
{
    if (st->two)
        st->cur = 1 - st->cur;
    obd_codec_lazy_state_commit(&st->st[st->cur], scale);
}

static void *run_job(void *arg)
{
    struct job *jb = arg;
    struct bench *b = jb->b;
    const struct obd_codec_impl *im = jb->impl;
    size_t lo = jb->b0 * OBD_CODEC_BLOCK, hi = block_end(b, jb->b1 - 1);
    struct obd_codec_lazy prev;
    float *next;

    if (jb->b0 >= jb->b1)
        return NULL;
    lazy_prev(op_state(b, jb->op), &prev, &next);
    switch (jb->op) {
    case OP_LAZY_COMPRESS_1:
    case OP_LAZY_COMPRESS:
        for (size_t j = jb->b0; j < jb->b1; j++)
            b->sums[j] = im->lazy_worker_block(
                b->src, 1, b->elems, &prev, next, j * OBD_CODEC_BLOCK,
                block_end(b, j), b->bits + j * OBD_CODEC_BLOCK / 8);
        break;
    case OP_LAZY_COMPRESS_AVG:
        for (size_t j = jb->b0; j < jb->b1; j++)
            b->sums[j] = im->lazy_worker_block(
                b->src, AVG_NSRC, b->elems, &prev, next, j * OBD_CODEC_BLOCK,
                block_end(b, j), b->bits + j * OBD_CODEC_BLOCK / 8);
        break;
    case OP_LAZY_SERVER_1:
    case OP_LAZY_SERVER:
        for (size_t j = jb->b0; j < jb->b1; j++)
            b->sums[j] = im->lazy_server_block(
                b->in, b->scales, SERVER_N, &prev, next, j * OBD_CODEC_BLOCK,
                block_end(b, j), b->sbits + j * OBD_CODEC_BLOCK / 8);
        break;
    case OP_LAZY_ERROR:
        im->lazy_error(&prev, b->out, lo, hi);
        break;
    case OP_DECOMPRESS:
        im->decompress(b->bits + lo / 8, jb->scale, b->out + lo, hi - lo);
        break;
    case OP_DECOMPRESS_STREAM:
        im->decompress_stream(b->bits + lo / 8, jb->scale, b->out + lo,
                              hi - lo);
        break;
    }
    return NULL;
}

/* Runs the pass of `op` on `nthreads` threads, each on whole blocks. */
static void run_pass(const struct obd_codec_impl *im, struct bench *b,
                     int nthreads, int op, float scale)
{
    pthread_t tid[MAX_THREADS];
    struct job jobs[MAX_THREADS];

    for (int t = 0; t < nthreads; t++) {
        jobs[t] = (struct job){
            .impl = im,
            .b = b,
            .b0 = b->nblocks * (size_t)t / (size_t)nthreads,
            .b1 = b->nblocks * (size_t)(t + 1) / (size_t)nthreads,
            .op = op,
            .scale = scale,
        };
    }
    if (nthreads == 1) {
        run_job(&jobs[0]);
        return;
    }
    for (int t = 0; t < nthreads; t++)
        if (pthread_create(&tid[t], NULL, run_job, &jobs[t]) != 0) {
            fprintf(stderr, "bench_codec: pthread_create failed\n");
            exit(2);
        }
    for (int t = 0; t < nthreads; t++)
        pthread_join(tid[t], NULL);
}

/* One whole operation, as the daemon runs a step: the pass on whole
 * blocks, the scale from the block sums, the commit. */
static int run_op(const struct obd_codec_impl *im, struct bench *b,
                  int nthreads, int op, float *scale_out)
{
    float sc = 0.5f;
    int rc;

    if (ops[op].kind == PLAIN) {
        run_pass(im, b, nthreads, op, 0.5f);
        return 0;
    }
    run_pass(im, b, nthreads, op, 0.0f);
    rc = obd_codec_scale(b->sums, b->nblocks, b->elems, &sc);
    if (rc != 0)
        return rc;
    lazy_commit(op_state(b, op), sc);
    *scale_out = sc;
    return 0;
}

/* The baselines: memcpy, and the read-two-write-one floor
 * (bench_floor_pass) in place and to a third buffer. */

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

static float rng_unit(uint64_t *s)
{
    return (float)((double)(rng_next(s) >> 11) * 0x1p-52 - 1.0);
}

/* A lazy state holding the error e (mode EAGER, as a snapshot restores). */
static void lazy_from(struct lazy_state *st, const float *e, size_t n)
{
    obd_codec_lazy_state_init(&st->st[0], st->buf[0]);
    obd_codec_lazy_state_init(&st->st[1], st->buf[1]);
    st->cur = 0;
    obd_codec_lazy_state_restore(&st->st[0], e, n);
}

/* Fresh deterministic inputs; also touches every page of every buffer. */
static void reset_inputs(struct bench *b)
{
    uint64_t s = 0x9e3779b97f4a7c15ULL;

    for (size_t i = 0; i < b->elems; i++) {
        b->x[i] = rng_unit(&s);
        b->x2[i] = rng_unit(&s);
        b->e[i] = rng_unit(&s) * 0.1f;
        b->err[i] = rng_unit(&s) * 0.1f;
    }
    for (int k = 0; k < SERVER_N; k++) {
        for (size_t i = 0; i < b->elems / 8; i++)
            b->in_bits[k][i] = (uint8_t)(rng_next(&s) >> 56);
        b->scales[k] = 0.25f * (float)(k + 1);
    }
    lazy_from(&b->wl, b->e, b->elems);
    lazy_from(&b->wl1, b->e, b->elems);
    lazy_from(&b->sl, b->err, b->elems);
    lazy_from(&b->sl1, b->err, b->elems);
    memset(b->dst, 0, b->elems * sizeof(float));
    memset(b->fz, 0, b->elems * sizeof(float));
    memset(b->bsc, 0, b->elems * sizeof(float));
    memset(b->out, 0, b->elems * sizeof(float));
    memset(b->bits, 0, b->elems / 8);
    memset(b->sbits, 0, b->elems / 8);
}

/* The error of a lazy state, materialised into b->out. */
static const float *lazy_e(const struct obd_codec_impl *im, struct bench *b,
                           const struct lazy_state *st)
{
    struct obd_codec_lazy prev;
    float *next;

    lazy_prev(st, &prev, &next);
    im->lazy_error(&prev, b->out, 0, b->elems);
    return b->out;
}

/* The bits, the scale and the error after some steps from the inputs'
 * fresh state, for comparison. */
struct snap {
    float *e;
    uint8_t *bits;
    float scale;
};

/* `steps` steps of a lazy op on `nthreads`; e is the state's error. */
static int snap_op(const struct obd_codec_impl *im, struct bench *b,
                   int nthreads, int op, int steps, struct snap *out)
{
    size_t nb = b->elems / 8;

    reset_inputs(b);
    for (int s = 0; s < steps; s++)
        if (run_op(im, b, nthreads, op, &out->scale) != 0)
            return -1;
    memcpy(out->e, lazy_e(im, b, op_state(b, op)), b->elems * sizeof(float));
    memcpy(out->bits, ops[op].ref == REF_SERVER ? b->sbits : b->bits, nb);
    return 0;
}

/* `steps` steps of the reference over the same inputs, which keeps the
 * error itself in b->e (worker) or b->err (server). */
static int snap_ref(struct bench *b, enum ref ref, int steps, struct snap *out)
{
    size_t n = b->elems;
    int rc = 0;

    reset_inputs(b);
    for (int s = 0; s < steps && rc == 0; s++) {
        switch (ref) {
        case REF_COMPRESS:
            rc = codec_ref_compress(b->x, n, b->e, n, b->bits, &out->scale);
            break;
        case REF_SERVER:
            rc = codec_ref_server(b->in, b->scales, SERVER_N, b->err, n,
                                  b->sbits, &out->scale);
            break;
        default:
            rc = codec_ref_compress_avg(b->src, AVG_NSRC, n, b->e, b->bsc, n,
                                        b->bits, &out->scale);
            break;
        }
    }
    if (rc != 0)
        return -1;
    memcpy(out->e, ref == REF_SERVER ? b->err : b->e, n * sizeof(float));
    memcpy(out->bits, ref == REF_SERVER ? b->sbits : b->bits, n / 8);
    return 0;
}

static int snap_eq(const struct snap *a, const struct snap *b, size_t elems)
{
    return memcmp(&a->scale, &b->scale, sizeof(float)) == 0 &&
           memcmp(a->e, b->e, elems * sizeof(float)) == 0 &&
           memcmp(a->bits, b->bits, elems / 8) == 0;
}

/* Before timing: three steps of every lazy op of every implementation,
 * on one thread and on `nthreads`, equal three steps of the reference
 * (bits, scale and error byte for byte). */
static int check(const struct obd_codec_impl *const *im, int nimpl,
                 struct bench *b, int nthreads)
{
    int tcounts[2] = {1, nthreads};
    struct snap s[2];
    int ok = 1;

    for (int k = 0; k < 2; k++) {
        s[k].e = xmalloc(b->elems * sizeof(float));
        s[k].bits = xmalloc(b->elems / 8);
    }
    for (int r = REF_NONE + 1; r < NREFS; r++) {
        if (snap_ref(b, (enum ref)r, 3, &s[0]) != 0) {
            fprintf(stderr, "bench_codec: the reference failed\n");
            ok = 0;
            continue;
        }
        for (int k = 0; k < nimpl; k++)
            for (int op = 0; op < NOPS; op++)
                for (int t = 0; t < (nthreads > 1 ? 2 : 1); t++) {
                    if (ops[op].ref != (enum ref)r)
                        continue;
                    if (snap_op(im[k], b, tcounts[t], op, 3, &s[1]) == 0 &&
                        snap_eq(&s[0], &s[1], b->elems))
                        continue;
                    fprintf(stderr,
                            "bench_codec: %s: %s on %d thread(s) differs "
                            "from the reference\n",
                            im[k]->name, ops[op].name, tcounts[t]);
                    ok = 0;
                }
    }
    for (int k = 0; k < 2; k++) {
        free(s[k].bits);
        free(s[k].e);
    }
    return ok ? 0 : -1;
}

struct row {
    const char *op, *impl;
    int threads;
    double ms, ratio, ratio_floor;
};

static double time_once(void (*fn)(struct bench *), struct bench *b)
{
    double t0 = bench_now_ms();

    fn(b);
    return bench_now_ms() - t0;
}

static void do_memcpy(struct bench *b)
{
    memcpy(b->dst, b->x, b->elems * sizeof(float));
}

static void do_floor(struct bench *b)
{
    bench_floor_pass(b->x, b->dst, b->dst, b->elems);
}

static void do_floor2(struct bench *b)
{
    bench_floor_pass(b->x, b->dst, b->fz, b->elems);
}

static void lazy_alloc(struct lazy_state *st, size_t elems, int inplace)
{
    st->two = !inplace;
    st->buf[0] = xmalloc(elems * sizeof(float));
    st->buf[1] = inplace ? NULL : xmalloc(elems * sizeof(float));
}

static void lazy_free(struct lazy_state *st)
{
    free(st->buf[0]);
    free(st->buf[1]);
}

int main(int argc, char **argv)
{
    size_t elems = (size_t)64 << 20;
    const char *only = NULL;
    int repeats = 7, json = 0, nthreads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const struct obd_codec_impl *impls[2];
    int nimpl = 0, nrows = 0, ok = 1;
    struct row rows[64];
    struct bench b;
    double *t, *t2, *tm, *tf, *tf2, *top[NOPS], *base[3];
    double bms[3], bratio[3], bfloor[3];
    int nbase;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
            elems = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "-r") == 0 && i + 1 < argc)
            repeats = atoi(argv[++i]);
        else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc)
            nthreads = atoi(argv[++i]);
        else if (strcmp(argv[i], "-i") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else {
            fprintf(stderr,
                    "usage: %s [-n ELEMS] [-r REPEATS] [-t THREADS] "
                    "[-i portable|avx2] [--json]\n",
                    argv[0]);
            return 2;
        }
    }
    /* The tensor is its own padded length; round up to whole bytes. */
    elems = (elems + 7) / 8 * 8;
    if (elems == 0 || repeats < 1 || nthreads < 1)
        return 2;
    if (nthreads > MAX_THREADS)
        nthreads = MAX_THREADS;

    b.elems = elems;
    b.nblocks = (elems + OBD_CODEC_BLOCK - 1) / OBD_CODEC_BLOCK;
    b.x = xmalloc(elems * sizeof(float));
    b.e = xmalloc(elems * sizeof(float));
    b.dst = xmalloc(elems * sizeof(float));
    b.fz = xmalloc(elems * sizeof(float));
    b.err = xmalloc(elems * sizeof(float));
    b.out = xmalloc(elems * sizeof(float));
    b.x2 = xmalloc(elems * sizeof(float));
    b.bsc = xmalloc(elems * sizeof(float));
    b.src[0] = b.x;
    b.src[1] = b.x2;
    b.bits = xmalloc(elems / 8);
    b.sbits = xmalloc(elems / 8);
    b.sums = xmalloc(b.nblocks * sizeof(double));
    for (int k = 0; k < SERVER_N; k++) {
        b.in_bits[k] = xmalloc(elems / 8);
        b.in[k] = b.in_bits[k];
    }
    lazy_alloc(&b.wl, elems, 0);
    lazy_alloc(&b.wl1, elems, 1);
    lazy_alloc(&b.sl, elems, 0);
    lazy_alloc(&b.sl1, elems, 1);
    t = xmalloc((size_t)repeats * 4 * sizeof(double));
    t2 = xmalloc((size_t)repeats * sizeof(double));
    tm = xmalloc((size_t)repeats * sizeof(double));
    tf = xmalloc((size_t)repeats * sizeof(double));
    tf2 = xmalloc((size_t)repeats * sizeof(double));
    for (int op = 0; op < NOPS; op++)
        top[op] = xmalloc((size_t)repeats * sizeof(double));
    for (int j = 0; j < 3; j++)
        base[j] = xmalloc((size_t)repeats * 4 * sizeof(double));

    if (only == NULL || strcmp(only, "portable") == 0)
        impls[nimpl++] = obd_codec_portable();
    if (obd_codec_avx2() != NULL && (only == NULL || strcmp(only, "avx2") == 0))
        impls[nimpl++] = obd_codec_avx2();
    if (nimpl == 0) {
        fprintf(stderr, "bench_codec: no implementation \"%s\"\n", only);
        return 2;
    }
    if (check(impls, nimpl, &b, nthreads) != 0)
        ok = 0;
    reset_inputs(&b);

    /* Rounds: every round times memcpy, the floors and every op once,
     * back to back, so that load from other processes on a shared machine
     * hits the baselines and the ops alike; ratios are per round, and the
     * table shows their medians. */
    nbase = 0;
    for (int k = 0; k < nimpl; k++) {
        int tcounts[2] = {1, nthreads};
        for (int tc = 0; tc < (nthreads > 1 ? 2 : 1); tc++) {
            float sc;

            /* Lazy ops are timed from a DEFERRED state, the steady
             * state: one untimed step first. */
            reset_inputs(&b);
            for (int op = 0; op < NOPS; op++)
                if (ops[op].kind == LAZY)
                    run_op(impls[k], &b, tcounts[tc], op, &sc);
            for (int r = 0; r < repeats; r++) {
                tm[r] = time_once(do_memcpy, &b);
                tf[r] = time_once(do_floor, &b);
                tf2[r] = time_once(do_floor2, &b);
                base[0][nbase] = tm[r];
                base[1][nbase] = tf[r];
                base[2][nbase++] = tf2[r];
                for (int op = 0; op < NOPS; op++) {
                    double t0 = bench_now_ms();
                    if (run_op(impls[k], &b, tcounts[tc], op, &sc) != 0) {
                        fprintf(stderr, "bench_codec: %s failed\n",
                                ops[op].name);
                        return 1;
                    }
                    top[op][r] = bench_now_ms() - t0;
                }
            }
            for (int op = 0; op < NOPS; op++) {
                struct row *w = &rows[nrows++];

                *w = (struct row){
                    ops[op].name, impls[k]->name, tcounts[tc], 0, 0, 0};
                for (int r = 0; r < repeats; r++) {
                    t[r] = top[op][r] / tm[r];
                    t2[r] = top[op][r] / tf[r];
                }
                w->ratio = median(t, repeats);
                w->ratio_floor = median(t2, repeats);
                w->ms = median(top[op], repeats);
            }
        }
    }
    for (int j = 0; j < 3; j++) {
        for (int r = 0; r < nbase; r++)
            t[r] = base[j][r] / base[0][r];
        bratio[j] = median(t, nbase);
        for (int r = 0; r < nbase; r++)
            t[r] = base[j][r] / base[1][r];
        bfloor[j] = median(t, nbase);
        bms[j] = median(base[j], nbase);
    }

    double gb = (double)elems * sizeof(float) / 1e9;
    static const char *const bname[3] = {"memcpy", "floor",
                                         "floor (2 buffers)"};
    static const char *const bimpl[3] = {"libc", "plain", "plain"};
    if (json) {
        printf("{\"elems\": %zu, \"repeats\": %d, \"memcpy_ms\": %.3f, "
               "\"floor_ms\": %.3f, \"floor2_ms\": %.3f, "
               "\"checks_pass\": %s, \"mt_equals_st\": %s, \"rows\": [\n",
               elems, repeats, bms[0], bms[1], bms[2], ok ? "true" : "false",
               ok ? "true" : "false");
        for (int j = 0; j < 3; j++)
            printf("%s  {\"op\": \"%s\", \"impl\": \"%s\", \"threads\": 1, "
                   "\"ms\": %.3f, \"gbps\": %.2f, \"ratio\": %.2f, "
                   "\"ratio_floor\": %.2f}",
                   j ? ",\n" : "", bname[j], bimpl[j], bms[j],
                   gb / (bms[j] / 1e3), bratio[j], bfloor[j]);
        for (int i = 0; i < nrows; i++)
            printf(",\n  {\"op\": \"%s\", \"impl\": \"%s\", \"threads\": %d, "
                   "\"ms\": %.3f, \"gbps\": %.2f, \"ratio\": %.2f, "
                   "\"ratio_floor\": %.2f}",
                   rows[i].op, rows[i].impl, rows[i].threads, rows[i].ms,
                   gb / (rows[i].ms / 1e3), rows[i].ratio, rows[i].ratio_floor);
        printf("\n]}\n");
    } else {
        printf("%zu elements (%.0f MiB fp32), %d rounds; ms = median time, "
               "GB/s = tensor bytes / ms, ratios = median over rounds of the "
               "time / the baseline's time in the same round\n\n",
               elems, (double)elems * 4 / (1 << 20), repeats);
        printf("| op | impl | threads | ms | GB/s | ratio to memcpy | ratio "
               "to floor |\n");
        printf("|---|---|---|---|---|---|---|\n");
        for (int j = 0; j < 3; j++)
            printf("| %s | %s | 1 | %.2f | %.2f | %.2f | %.2f |\n", bname[j],
                   bimpl[j], bms[j], gb / (bms[j] / 1e3), bratio[j], bfloor[j]);
        for (int i = 0; i < nrows; i++)
            printf("| %s | %s | %d | %.2f | %.2f | %.2f | %.2f |\n", rows[i].op,
                   rows[i].impl, rows[i].threads, rows[i].ms,
                   gb / (rows[i].ms / 1e3), rows[i].ratio, rows[i].ratio_floor);
        printf("\nlazy steps on 1 and %d threads equal the reference "
               "(tests/codec_ref.h): %s\n",
               nthreads, ok ? "yes (memcmp of bits, scale, error)" : "NO");
        printf("floor: y = x + y in place (read 2, write 1 stream); "
               "floor (2 buffers): z = x + y\n");
    }

    for (int j = 0; j < 3; j++)
        free(base[j]);
    for (int op = 0; op < NOPS; op++)
        free(top[op]);
    free(tf2);
    free(tf);
    free(tm);
    free(t2);
    for (int k = 0; k < SERVER_N; k++)
        free(b.in_bits[k]);
    lazy_free(&b.sl1);
    lazy_free(&b.sl);
    lazy_free(&b.wl1);
    lazy_free(&b.wl);
    free(t);
    free(b.bsc);
    free(b.x2);
    free(b.sums);
    free(b.sbits);
    free(b.bits);
    free(b.out);
    free(b.err);
    free(b.fz);
    free(b.dst);
    free(b.e);
    free(b.x);
    return ok ? 0 : 1;
}
