/* Full-precision collectives through real daemons on loopback and real
 * trainer processes: every dtype and op against a local computation, world
 * sizes {1, 2, 3, 4, 8} nodes x {1, 2, 3} trainers, odd counts. */
#include <check.h>

#include "ck_run.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "harness.h"
#include "ring_ref.h"

#define BIG 1000003

static const size_t counts[] = {1, 3, BIG};
static const obcomm_dtype_t dtypes[] = {OBCOMM_FLOAT32, OBCOMM_FLOAT64,
                                        OBCOMM_FLOAT16, OBCOMM_BFLOAT16,
                                        OBCOMM_INT32,   OBCOMM_INT64};
static const obcomm_op_t ops[] = {OBCOMM_SUM, OBCOMM_AVG, OBCOMM_MAX,
                                  OBCOMM_MIN};

static size_t dsize(obcomm_dtype_t t)
{
    switch (t) {
    case OBCOMM_FLOAT32:
    case OBCOMM_INT32:
        return 4;
    case OBCOMM_FLOAT64:
    case OBCOMM_INT64:
        return 8;
    default:
        return 2;
    }
}

/* Small integers, so that every sum is exact in every dtype (|sum| <= 8 *
 * 24 < 256, exact even in bfloat16) and the expected value is unique. */
static int value(int rank, size_t i)
{
    return (int)((rank * 7 + i * 13) % 17) - 8;
}

/* The reference conversions are independent of the daemon's: the
 * compiler's _Float16 and bit arithmetic for bfloat16. */
static uint16_t ref_f16(float f)
{
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

static uint16_t ref_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static void put(void *buf, obcomm_dtype_t t, size_t i, double v)
{
    switch (t) {
    case OBCOMM_FLOAT32:
        ((float *)buf)[i] = (float)v;
        break;
    case OBCOMM_FLOAT64:
        ((double *)buf)[i] = v;
        break;
    case OBCOMM_FLOAT16:
        ((uint16_t *)buf)[i] = ref_f16((float)v);
        break;
    case OBCOMM_BFLOAT16:
        ((uint16_t *)buf)[i] = ref_bf16((float)v);
        break;
    case OBCOMM_INT32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case OBCOMM_INT64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    }
}

/* Expected element for residue class i % 17 (the pattern's period). */
static void expected(obcomm_dtype_t t, obcomm_op_t op, int size, size_t i,
                     void *out)
{
    long sum = 0, mx = -1000, mn = 1000;
    for (int k = 0; k < size; k++) {
        long v = value(k, i);
        sum += v;
        mx = v > mx ? v : mx;
        mn = v < mn ? v : mn;
    }
    switch (op) {
    case OBCOMM_SUM:
        put(out, t, 0, (double)sum);
        break;
    case OBCOMM_MAX:
        put(out, t, 0, (double)mx);
        break;
    case OBCOMM_MIN:
        put(out, t, 0, (double)mn);
        break;
    case OBCOMM_AVG:
        /* Floats divide in their accumulator type (fp32 for the 16-bit
         * ones, then one rounding); integers truncate toward zero. */
        if (t == OBCOMM_FLOAT64)
            put(out, t, 0, (double)sum / size);
        else if (t == OBCOMM_INT32 || t == OBCOMM_INT64)
            put(out, t, 0, (double)(sum / size));
        else
            put(out, t, 0, (double)((float)sum / (float)size));
        break;
    }
}

static int trainer_matrix(obcomm_t *c, void *arg)
{
    (void)arg;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    void *buf;
    int rc = obcomm_alloc(c, BIG * 8, &buf);
    if (rc)
        return hx_fail(c, "alloc: %s", obcomm_strerror(rc));

    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++)
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++)
            for (size_t n = 0; n < sizeof(counts) / sizeof(counts[0]); n++) {
                obcomm_dtype_t t = dtypes[d];
                size_t count = counts[n], es = dsize(t);
                uint8_t want[17][8];
                for (size_t i = 0; i < count; i++)
                    put(buf, t, i, value(rank, i));
                for (size_t r = 0; r < 17; r++)
                    expected(t, ops[o], size, r, want[r]);

                rc = obcomm_allreduce(c, buf, count, t, ops[o]);
                if (rc)
                    return hx_fail(c, "allreduce dtype %d op %d count %zu: %s",
                                   t, ops[o], count, obcomm_last_error(c));
                for (size_t i = 0; i < count; i++)
                    if (memcmp((uint8_t *)buf + i * es, want[i % 17], es))
                        return hx_fail(c,
                                       "dtype %d op %d count %zu: element %zu "
                                       "differs",
                                       t, ops[o], count, i);
            }
    return 0;
}

static const int matrix[][2] = {{1, 1}, {1, 2}, {1, 3}, {2, 1}, {2, 2},
                                {2, 3}, {3, 1}, {3, 2}, {3, 3}, {4, 1},
                                {4, 2}, {4, 3}, {8, 1}, {8, 2}, {8, 3}};

START_TEST(allreduce_every_dtype_and_op)
{
    struct hx_cluster cl;
    int nodes = matrix[_i][0], per = matrix[_i][1];
    ck_assert_int_eq(hx_start(&cl, nodes, NULL), 0);
    int failed = hx_run(&cl, per, "matrix", 60000, 600, trainer_matrix, NULL);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_msg(failed == 0, "%d of %d trainers failed (%d nodes x %d)",
                  failed, nodes * per, nodes, per);
}
END_TEST

/* Random fp32 values: the sum is checked against an exact (double) sum
 * within the documented bound (size-1) * 2^-24 * sum|x| per element, and
 * every rank must hold bitwise the same result. */
static float rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int trainer_float_sum(obcomm_t *c, void *arg)
{
    (void)arg;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    const size_t count = BIG;
    float *x, *mx, *mn;
    if (obcomm_alloc(c, count * 4, (void **)&x) ||
        obcomm_alloc(c, count * 4, (void **)&mx) ||
        obcomm_alloc(c, count * 4, (void **)&mn))
        return hx_fail(c, "alloc");
    uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1);
    for (size_t i = 0; i < count; i++)
        x[i] = rnd(&seed);
    if (obcomm_allreduce(c, x, count, OBCOMM_FLOAT32, OBCOMM_SUM))
        return hx_fail(c, "allreduce: %s", obcomm_last_error(c));

    double *exact = calloc(count, sizeof(double));
    double *abs_sum = calloc(count, sizeof(double));
    for (int k = 0; k < size; k++) {
        uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(k + 1);
        for (size_t i = 0; i < count; i++) {
            double v = rnd(&s);
            exact[i] += v;
            abs_sum[i] += fabs(v);
        }
    }
    int bad = 0;
    for (size_t i = 0; i < count && !bad; i++) {
        double bound = (size - 1) * ldexp(1.0, -24) * abs_sum[i] * 1.0001;
        if (fabs(x[i] - exact[i]) > bound)
            bad = hx_fail(c, "element %zu: %.9g vs exact %.9g (bound %.3g)", i,
                          x[i], exact[i], bound);
    }
    free(exact);
    free(abs_sum);
    if (bad)
        return 1;

    memcpy(mx, x, count * 4);
    memcpy(mn, x, count * 4);
    if (obcomm_allreduce(c, mx, count, OBCOMM_FLOAT32, OBCOMM_MAX) ||
        obcomm_allreduce(c, mn, count, OBCOMM_FLOAT32, OBCOMM_MIN))
        return hx_fail(c, "allreduce max/min: %s", obcomm_last_error(c));
    if (memcmp(mx, x, count * 4) || memcmp(mn, x, count * 4))
        return hx_fail(c, "ranks hold different sums");
    return 0;
}

START_TEST(float_sum_within_tolerance_and_identical)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 3, NULL), 0);
    int failed = hx_run(&cl, 2, "fsum", 60000, 300, trainer_float_sum, NULL);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
}
END_TEST

static int trainer_hundred(obcomm_t *c, void *arg)
{
    (void)arg;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    int64_t *v;
    const size_t count = 4099;
    if (obcomm_alloc(c, count * 8, (void **)&v))
        return hx_fail(c, "alloc");
    for (int step = 0; step < 100; step++) {
        for (size_t i = 0; i < count; i++)
            v[i] = (int64_t)(rank + 1) * step + (int64_t)i;
        if (obcomm_allreduce(c, v, count, OBCOMM_INT64, OBCOMM_SUM))
            return hx_fail(c, "step %d: %s", step, obcomm_last_error(c));
        int64_t ranksum = (int64_t)size * (size + 1) / 2;
        for (size_t i = 0; i < count; i++)
            if (v[i] != ranksum * step + (int64_t)size * (int64_t)i)
                return hx_fail(c, "step %d element %zu: %lld", step, i,
                               (long long)v[i]);
    }
    return 0;
}

START_TEST(hundred_ops_in_a_row)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 3, NULL), 0);
    int failed = hx_run(&cl, 2, "hundred", 60000, 300, trainer_hundred, NULL);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
}
END_TEST

static int trainer_broadcast(obcomm_t *c, void *arg)
{
    (void)arg;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    static const size_t sizes[] = {1, 3, 3000001};
    uint8_t *b;
    if (obcomm_alloc(c, 3000001, (void **)&b))
        return hx_fail(c, "alloc");
    for (int root = 0; root < size; root++)
        for (size_t s = 0; s < 3; s++) {
            size_t n = sizes[s];
            for (size_t i = 0; i < n; i++)
                b[i] =
                    rank == root ? (uint8_t)(i * 31 + (size_t)root * 7) : 0xee;
            if (obcomm_broadcast(c, b, n, root))
                return hx_fail(c, "broadcast root %d bytes %zu: %s", root, n,
                               obcomm_last_error(c));
            for (size_t i = 0; i < n; i++)
                if (b[i] != (uint8_t)(i * 31 + (size_t)root * 7))
                    return hx_fail(c, "root %d bytes %zu: byte %zu differs",
                                   root, n, i);
        }
    for (int i = 0; i < 5; i++)
        if (obcomm_barrier(c))
            return hx_fail(c, "barrier: %s", obcomm_last_error(c));
    return 0;
}

START_TEST(broadcast_from_every_root_and_barrier)
{
    /* Nodes {1, 2, 3, 4} with 2 trainers (receiving into a daemon buffer)
     * and with 1 (the root sends from, and the others receive straight
     * into, the trainers' shared memory). */
    static const int nodes[] = {1, 2, 3, 4};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, nodes[_i % 4], NULL), 0);
    int failed =
        hx_run(&cl, 2 - _i / 4, "bcast", 60000, 300, trainer_broadcast, NULL);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
}
END_TEST

/* The reductions on the worker pool (OBD_RING_POOL_BYTES, in ops of at
 * least OBD_RING_POOL_SEGMENTS segments: 256 KiB segments and 2 MiB of
 * accumulator here) through real
 * daemons: random fp32, fp16, bf16 and int32 data, SUM, AVG and MAX, every
 * element of every rank bit for bit against ring_ref.h. With 256 KiB
 * segments every full reduce-scatter segment is a pool task and each
 * chunk's tail is reduced inline; with 8 KiB segments the load and the
 * store are a hundred pool pieces each while frames keep arriving. */
enum { POOL_COUNT = 2 * (4 * 65536 + 500) + 1 };

static int trainer_pool(obcomm_t *c, void *arg)
{
    const int *local = arg;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    static const obcomm_dtype_t t4[] = {OBCOMM_FLOAT32, OBCOMM_FLOAT16,
                                        OBCOMM_BFLOAT16, OBCOMM_INT32};
    static const obcomm_op_t o3[] = {OBCOMM_SUM, OBCOMM_AVG, OBCOMM_MAX};
    uint8_t *buf, *want = malloc(POOL_COUNT * 4);
    uint8_t *all = malloc((size_t)size * POOL_COUNT * 4);
    const void *x[HX_MAX_NODES * 3];
    if (want == NULL || all == NULL ||
        obcomm_alloc(c, POOL_COUNT * 4, (void **)&buf))
        return hx_fail(c, "alloc");
    int bad = 0;
    uint64_t seq = 0;
    for (size_t d = 0; d < 4 && !bad; d++)
        for (size_t o = 0; o < 3 && !bad; o++, seq++) {
            obcomm_dtype_t t = t4[d];
            size_t es = rr_size(t);
            for (int k = 0; k < size; k++) {
                x[k] = all + (size_t)k * POOL_COUNT * 4;
                rr_fill(t, (void *)x[k], POOL_COUNT,
                        seq * 64 + (uint64_t)k + 1);
            }
            rr_expect(t, o3[o], size / *local, *local, x, POOL_COUNT, want);
            memcpy(buf, x[rank], POOL_COUNT * es);
            if (obcomm_allreduce(c, buf, POOL_COUNT, t, o3[o])) {
                bad = hx_fail(c, "allreduce dtype %d op %d: %s", t, o3[o],
                              obcomm_last_error(c));
                break;
            }
            for (size_t i = 0; i < POOL_COUNT && !bad; i++)
                if (memcmp(buf + i * es, want + i * es, es))
                    bad = hx_fail(c, "dtype %d op %d: element %zu differs", t,
                                  o3[o], i);
        }
    free(want);
    free(all);
    return bad;
}

START_TEST(allreduce_on_the_pool_exact)
{
    static const char *const segs[] = {"262144", "8192"};
    int nodes = 2 + _i % 2, per = 1 + (_i / 2) % 3;
    const char *flags[] = {"--segment_bytes", segs[_i / 6], NULL};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, nodes, flags), 0);
    int failed = hx_run(&cl, per, "pool", 60000, 300, trainer_pool, &per);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_msg(failed == 0, "%d of %d trainers failed (%d nodes x %d, %s)",
                  failed, nodes * per, nodes, per, segs[_i / 6]);
}
END_TEST

/* Segment buffers outlive the op (job.c keeps them for the next): a
 * fresh buffer costs a page fault per 4 KiB of every reduce-scatter
 * segment received into it, which on a virtual machine took as much CPU
 * as the receive copies themselves (tests/bench/results-issue22). The
 * daemons count the buffers they allocate afresh
 * (segment_buffers_allocated): the two warm-up ops allocate some on
 * every node, the four ops after them none. Every result is exact. */
enum {
    REUSE_COUNT = 4 << 20,
    REUSE_OPS = 4,
    REUSE_SEG_BYTES = REUSE_COUNT / 2 * 4
};

struct reuse {
    const struct hx_cluster *cl;
    /* rank 0's readings of every node, through shared memory */
    long long warm[HX_MAX_NODES], after[HX_MAX_NODES];
};

static int trainer_reuse(obcomm_t *c, void *arg)
{
    struct reuse *ru = arg;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    float *x;
    if (obcomm_alloc(c, REUSE_COUNT * sizeof(float), (void **)&x))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    for (int op = 0; op < 2 + REUSE_OPS; op++) {
        if (op == 2) {
            if (obcomm_barrier(c))
                return hx_fail(c, "barrier: %s", obcomm_last_error(c));
            for (int i = 0; rank == 0 && i < ru->cl->nodes; i++)
                ru->warm[i] = hx_metric(ru->cl, i, "segment_buffers_allocated");
        }
        /* Small integers: every sum is exact in fp32. */
        for (size_t i = 0; i < REUSE_COUNT; i++)
            x[i] = (float)((i + (size_t)rank + (size_t)op) % 1024);
        if (obcomm_allreduce(c, x, REUSE_COUNT, OBCOMM_FLOAT32, OBCOMM_SUM))
            return hx_fail(c, "allreduce %d: %s", op, obcomm_last_error(c));
        for (size_t i = 0; i < REUSE_COUNT; i++) {
            float want = 0;
            for (int r = 0; r < size; r++)
                want += (float)((i + (size_t)r + (size_t)op) % 1024);
            if (x[i] != want)
                return hx_fail(c, "op %d element %zu: %g, want %g", op, i,
                               (double)x[i], (double)want);
        }
    }
    if (obcomm_barrier(c))
        return hx_fail(c, "barrier: %s", obcomm_last_error(c));
    for (int i = 0; rank == 0 && i < ru->cl->nodes; i++)
        ru->after[i] = hx_metric(ru->cl, i, "segment_buffers_allocated");
    return 0;
}

START_TEST(segment_buffers_are_reused_across_ops)
{
    char seg[24];
    snprintf(seg, sizeof(seg), "%d", REUSE_SEG_BYTES);
    const char *flags[] = {"--segment_bytes", seg, NULL};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, flags), 0);
    struct reuse *ru = mmap(NULL, sizeof(*ru), PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert(ru != MAP_FAILED);
    ru->cl = &cl;
    int failed = hx_run(&cl, 1, "reuse", 60000, 300, trainer_reuse, ru);
    struct reuse got = *ru;
    munmap(ru, sizeof(*ru));
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(got.warm[i] >= 1,
                      "node %d: %lld segment buffers allocated by the "
                      "warm-up ops",
                      i, got.warm[i]);
        ck_assert_msg(got.after[i] == got.warm[i],
                      "node %d: %lld segment buffers allocated afresh over "
                      "%d ops after the warm-up",
                      i, got.after[i] - got.warm[i], REUSE_OPS);
    }
}
END_TEST

/* A world of one rank (one node, one trainer): every reduction over one
 * operand is the operand, so the allreduce of every dtype and op leaves
 * the buffer as it is, bit for bit: random bits (NaNs of every payload,
 * signalling ones among them, -0.0, subnormals, Inf) and, in the first
 * elements, each of those on purpose. The daemon does not touch the data:
 * local_bytes_written stays 0 over every allreduce, an in-place
 * reduce-scatter and allgather and a broadcast, and counts exactly the
 * one copy of an out-of-place reduce-scatter and allgather. Then the same
 * node with two trainers reduces (load and store): the counter sees it. */
static uint64_t bits64(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void fill_bits(uint8_t *buf, obcomm_dtype_t t, size_t count,
                      uint64_t seed)
{
    static const uint32_t f32[] = {0x80000000u, 0x00000001u, 0x807fffffu,
                                   0x7f800001u, 0xff812345u, 0x7fc00001u,
                                   0xffffffffu, 0xff800000u};
    static const uint64_t f64[] = {
        0x8000000000000000ull, 0x1ull,
        0x7ff0000000000001ull, 0xfff4000000000123ull,
        0x7ff8000000000001ull, 0xfff0000000000000ull};
    static const uint16_t f16[] = {0x8000, 0x0001, 0x7c01,
                                   0xfd23, 0x7e01, 0xfc00};
    static const uint16_t bf16[] = {0x8000, 0x0001, 0x7f81,
                                    0xff92, 0x7fc1, 0xff80};
    size_t es = dsize(t), bytes = count * es;
    for (size_t i = 0; i < bytes; i += 8) {
        uint64_t v = bits64(&seed);
        memcpy(buf + i, &v, bytes - i < 8 ? bytes - i : 8);
    }
    const void *sp = t == OBCOMM_FLOAT32    ? (const void *)f32
                     : t == OBCOMM_FLOAT64  ? (const void *)f64
                     : t == OBCOMM_FLOAT16  ? (const void *)f16
                     : t == OBCOMM_BFLOAT16 ? (const void *)bf16
                                            : NULL;
    size_t nsp = t == OBCOMM_FLOAT32    ? sizeof(f32)
                 : t == OBCOMM_FLOAT64  ? sizeof(f64)
                 : t == OBCOMM_FLOAT16  ? sizeof(f16)
                 : t == OBCOMM_BFLOAT16 ? sizeof(bf16)
                                        : 0;
    if (sp != NULL)
        memcpy(buf, sp, nsp < bytes ? nsp : bytes);
}

/* The bytes the one-rank trainer's out-of-place reduce-scatter and
 * allgather copy (everything else it does copies nothing). */
enum { ONE_RANK_COPIED = 2 * BIG * 4 };

static int trainer_one_rank(obcomm_t *c, void *arg)
{
    (void)arg;
    uint8_t *buf, *recv, *want = malloc(BIG * 8);
    if (want == NULL || obcomm_alloc(c, BIG * 8, (void **)&buf) ||
        obcomm_alloc(c, BIG * 8, (void **)&recv))
        return hx_fail(c, "alloc");
    uint64_t seed = 0x243f6a8885a308d3ull;
    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++)
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++)
            for (size_t n = 0; n < sizeof(counts) / sizeof(counts[0]); n++) {
                obcomm_dtype_t t = dtypes[d];
                size_t count = counts[n], bytes = count * dsize(t);
                fill_bits(buf, t, count, ++seed);
                memcpy(want, buf, bytes);
                if (obcomm_allreduce(c, buf, count, t, ops[o]))
                    return hx_fail(c, "allreduce dtype %d op %d: %s", t, ops[o],
                                   obcomm_last_error(c));
                if (memcmp(buf, want, bytes))
                    return hx_fail(c,
                                   "allreduce dtype %d op %d count %zu: not "
                                   "the input bit for bit",
                                   t, ops[o], count);
                if (obcomm_reduce_scatter(c, buf, buf, count, t, ops[o]) ||
                    memcmp(buf, want, bytes))
                    return hx_fail(c,
                                   "in-place reduce-scatter dtype %d op "
                                   "%d: not the input",
                                   t, ops[o]);
            }
    fill_bits(buf, OBCOMM_FLOAT64, BIG, ++seed);
    memcpy(want, buf, BIG * 8);
    if (obcomm_allgather(c, buf, buf, BIG, OBCOMM_FLOAT64) ||
        obcomm_broadcast(c, buf, BIG * 8, 0) || obcomm_barrier(c) ||
        memcmp(buf, want, BIG * 8))
        return hx_fail(c, "in-place allgather, broadcast: %s",
                       obcomm_last_error(c));
    memset(recv, 0xee, BIG * 4);
    if (obcomm_reduce_scatter(c, buf, recv, BIG, OBCOMM_FLOAT32, OBCOMM_AVG) ||
        memcmp(recv, want, BIG * 4))
        return hx_fail(c, "reduce-scatter into recv: not the input");
    memset(recv, 0xee, BIG * 4);
    if (obcomm_allgather(c, buf, recv, BIG, OBCOMM_FLOAT32) ||
        memcmp(recv, want, BIG * 4))
        return hx_fail(c, "allgather into recv: not the input");
    free(want);
    return 0;
}

/* Two trainers on the node: the load writes the accumulator, the store
 * both buffers. */
static int trainer_two_local(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, BIG * 4, (void **)&x))
        return hx_fail(c, "alloc");
    for (size_t i = 0; i < BIG; i++)
        x[i] = (float)value(obcomm_rank(c), i);
    if (obcomm_allreduce(c, x, BIG, OBCOMM_FLOAT32, OBCOMM_SUM))
        return hx_fail(c, "allreduce: %s", obcomm_last_error(c));
    for (size_t i = 0; i < BIG; i++)
        if (x[i] != (float)(value(0, i) + value(1, i)))
            return hx_fail(c, "element %zu: %g", i, (double)x[i]);
    return 0;
}

START_TEST(one_rank_leaves_the_data_as_it_is)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    int failed = hx_run(&cl, 1, "one", 60000, 300, trainer_one_rank, NULL);
    long long written = hx_metric(&cl, 0, "local_bytes_written");
    int failed2 = hx_run(&cl, 2, "two", 60000, 300, trainer_two_local, NULL);
    long long written2 = hx_metric(&cl, 0, "local_bytes_written");
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
    ck_assert_int_eq(failed2, 0);
    ck_assert_int_eq(written, ONE_RANK_COPIED);
    ck_assert_int_eq(written2 - written, 3 * BIG * 4);
}
END_TEST

Suite *coll_suite(void)
{
    Suite *s = suite_create("coll");
    TCase *tc = tcase_create("allreduce");
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, allreduce_every_dtype_and_op, 0,
                        (int)(sizeof(matrix) / sizeof(matrix[0])));
    tcase_add_test(tc, float_sum_within_tolerance_and_identical);
    tcase_add_test(tc, hundred_ops_in_a_row);
    tcase_add_loop_test(tc, broadcast_from_every_root_and_barrier, 0, 8);
    suite_add_tcase(s, tc);
    /* CK_RUN_CASE=one_rank runs it alone. */
    TCase *one = tcase_create("one_rank");
    tcase_set_timeout(one, 600);
    tcase_add_test(one, one_rank_leaves_the_data_as_it_is);
    suite_add_tcase(s, one);
    TCase *pool = tcase_create("pool");
    tcase_set_timeout(pool, 600);
    tcase_add_loop_test(pool, allreduce_on_the_pool_exact, 0, 12);
    suite_add_tcase(s, pool);
    TCase *reuse = tcase_create("reuse");
    tcase_set_timeout(reuse, 300);
    tcase_add_test(reuse, segment_buffers_are_reused_across_ops);
    suite_add_tcase(s, reuse);
    return s;
}

int main(void)
{
    return ck_run(coll_suite());
}
