/* The 1-bit allreduce through real daemons, against an independent scalar
 * simulation of all n nodes written here from docs/design.md, "The
 * compressed allreduce, exactly": every node averages its trainers,
 * compresses with worker error feedback, every server compresses its chunk
 * with server error feedback, and everybody decompresses the servers'
 * chunks.
 *
 * Tolerance. The simulation sums squares in plain sequential double order;
 * the daemon sums them in 16 lanes per 65536-element block. Both sums are
 * within 1e-16 relative of the exact one, so the float scales agree except
 * when the two doubles straddle a float rounding boundary; then they differ
 * by one ulp, and so do the error-feedback values derived from them. A sign
 * can only differ where the value being signed lies within a few ulps of
 * the scale from zero, which for our inputs happens to at most a handful of
 * elements. So: every scale within 1e-6 relative, every element with the
 * same sign within 1e-6 relative of the reference, and at most
 * count / 10000 + 2 elements per key over the whole run with a different
 * sign ("flips"). In practice the runs below see none.
 */
#include <check.h>

#include "ck_run.h"
#include <errno.h>
#include <glob.h>
#include <signal.h>
#include <stdarg.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define STEPS 20
#define NKEYS 3

static const size_t key_count[NKEYS] = {1, 9, 1000003};

/* ---- inputs: a function of (rank, step, key, element) ---- */

static float input(int rank, int step, int key, size_t i)
{
    uint64_t h = (uint64_t)rank * 0x9e3779b97f4a7c15ull ^
                 (uint64_t)(step + 1) * 0xbf58476d1ce4e5b9ull ^
                 (uint64_t)(key + 1) * 0x94d049bb133111ebull ^ (uint64_t)i;
    h ^= h >> 31;
    h *= 0xd6e9f8a3c1b2a5f7ull;
    h ^= h >> 29;
    return (float)((double)(h >> 40) / 16777216.0 * 2.0 - 1.0);
}

/* ---- the independent simulation ---- */

static size_t padded_len(size_t count, int n)
{
    size_t l = 8;
    while (l % (size_t)n)
        l += 8; /* lcm(n, 8) */
    size_t q = (size_t)n * l;
    return (count + q - 1) / q * q;
}

struct sim {
    int n, ls;
    size_t count, N, C;
    float **werr; /* [node][N] */
    float **serr; /* [node][C] */
};

static void sim_init(struct sim *s, int n, int ls, size_t count)
{
    s->n = n;
    s->ls = ls;
    s->count = count;
    s->N = padded_len(count, n);
    s->C = s->N / (size_t)n;
    s->werr = calloc((size_t)n, sizeof(float *));
    s->serr = calloc((size_t)n, sizeof(float *));
    for (int k = 0; k < n; k++) {
        s->werr[k] = calloc(s->N, sizeof(float));
        s->serr[k] = calloc(s->C, sizeof(float));
    }
}

static void sim_free(struct sim *s)
{
    for (int k = 0; k < s->n; k++) {
        free(s->werr[k]);
        free(s->serr[k]);
    }
    free(s->werr);
    free(s->serr);
}

/* One step; out receives count elements. The trainers of node k are ranks
 * k*ls .. k*ls+ls-1. */
static void sim_step(struct sim *s, int step, int key, float *out)
{
    int n = s->n;
    size_t N = s->N, C = s->C;
    if (n == 1) {
        for (size_t i = 0; i < s->count; i++) {
            float a = 0;
            for (int t = 0; t < s->ls; t++)
                a = t ? a + input(t, step, key, i) : input(t, step, key, i);
            out[i] = a / (float)s->ls;
        }
        return;
    }
    uint8_t *sign = malloc((size_t)n * N);
    float *scale = malloc((size_t)n * sizeof(float));
    for (int k = 0; k < n; k++) {
        float *b = malloc(N * sizeof(float));
        double sq = 0;
        for (size_t i = 0; i < N; i++) {
            float a = 0;
            if (i < s->count) {
                for (int t = 0; t < s->ls; t++) {
                    float x = input(k * s->ls + t, step, key, i);
                    a = t ? a + x : x;
                }
                a = a / (float)s->ls;
            }
            b[i] = a + s->werr[k][i];
            sq += (double)b[i] * b[i];
        }
        scale[k] = (float)sqrt(sq / (double)N);
        for (size_t i = 0; i < N; i++) {
            sign[(size_t)k * N + i] = b[i] >= 0;
            s->werr[k][i] = b[i] >= 0 ? b[i] - scale[k] : b[i] + scale[k];
        }
        free(b);
    }
    for (int r = 0; r < n; r++) {
        float *m = malloc(C * sizeof(float));
        double sq = 0;
        for (size_t i = 0; i < C; i++) {
            float a = 0;
            for (int k = 0; k < n; k++) {
                float v = sign[(size_t)k * N + (size_t)r * C + i] ? scale[k]
                                                                  : -scale[k];
                a = k ? a + v : v;
            }
            m[i] = a / (float)n + s->serr[r][i];
            sq += (double)m[i] * m[i];
        }
        float ss = (float)sqrt(sq / (double)C);
        for (size_t i = 0; i < C; i++) {
            int t = m[i] >= 0;
            s->serr[r][i] = t ? m[i] - ss : m[i] + ss;
            size_t g = (size_t)r * C + i;
            if (g < s->count)
                out[g] = t ? ss : -ss;
        }
        free(m);
    }
    free(sign);
    free(scale);
}

/* ---- the trainers ---- */

struct plan {
    int ls;                /* trainers per node */
    int first_step, steps; /* steps [first_step, first_step + steps) */
    int sim_steps_before;  /* steps the simulation runs first, unchecked */
    int nan_step, nan_key; /* node 1 feeds a NaN there (nan_step > 0) */
    int snapshot_after;    /* obcomm_save_1bit after this step (> 0) */
    int snapshot_fails_on; /* node + 1 whose snapshot fails (0: none) */
    /* Shared with the test: the id rank 0 saved; restore it first. */
    volatile uint64_t *snapshot;
    int restore;
    /* The restore fails with this code naming this text (0: succeeds). */
    int restore_fails, restore_fails_with;
    const char *restore_fails_naming;
    /* Shared with the test: each node's part of the snapshot (exported
     * after the save by its local rank 0), which a restore brings. */
    struct parts *parts;
};

/* One part per node, in shared memory: as a checkpoint would carry them. */
#define PART_MAX ((size_t)16 << 20)
struct parts {
    size_t bytes[4];
    uint8_t data[4][PART_MAX];
};

/* After a failed op the run is stopped: the next op fails at once with
 * the same code, naming the failed op. Returns 0 if so. */
static int run_is_stopped(obcomm_t *c, int code, int failed_seq)
{
    char want[64];
    snprintf(want, sizeof(want), "cannot continue after op %d failed",
             failed_seq);
    int rc = obcomm_barrier(c);
    if (rc != code || !strstr(obcomm_last_error(c), want))
        return hx_fail(c, "after a failed op: got %d (%s), want %d naming %s",
                       rc, obcomm_last_error(c), code, want);
    return 0;
}

static int compare(obcomm_t *c, int key, int step, const float *got,
                   const float *want, size_t count, long *flips)
{
    for (size_t i = 0; i < count; i++) {
        if ((got[i] >= 0) != (want[i] >= 0)) {
            if (++*flips > (long)(count / 10000 + 2))
                return hx_fail(c,
                               "key %d step %d: too many sign flips "
                               "(element %zu: %g vs %g)",
                               key, step, i, got[i], want[i]);
            continue;
        }
        if (fabsf(got[i] - want[i]) > 1e-6f * fabsf(want[i]))
            return hx_fail(c, "key %d step %d element %zu: %.9g vs %.9g", key,
                           step, i, got[i], want[i]);
    }
    return 0;
}

static int trainer_onebit(obcomm_t *c, void *arg)
{
    const struct plan *p = arg;
    int rank = obcomm_rank(c);
    int ls = p->ls;
    int n_nodes = obcomm_size(c) / ls;
    float *buf[NKEYS], *check;
    struct sim sim[NKEYS];
    long flips[NKEYS] = {0};

    for (int k = 0; k < NKEYS; k++)
        if (obcomm_alloc(c, key_count[k] * sizeof(float), (void **)&buf[k]))
            return hx_fail(c, "alloc");
    if (obcomm_alloc(c, key_count[NKEYS - 1] * sizeof(float), (void **)&check))
        return hx_fail(c, "alloc");
    if (rank == 0)
        for (int k = 0; k < NKEYS; k++)
            sim_init(&sim[k], n_nodes, ls, key_count[k]);

    float *want = malloc(key_count[NKEYS - 1] * sizeof(float));
    int fail = 0;
    if (rank == 0) {
        for (int st = 0; st < p->sim_steps_before; st++)
            for (int k = 0; k < NKEYS; k++)
                sim_step(&sim[k], st, k, want);
    }
    /* The run ended on purpose (a failed op was expected): no more ops. */
    int stopped = 0;
    if (p->restore) {
        int node = rank / ls;
        int rc = p->parts ? obcomm_restore_1bit_part(c, *p->snapshot,
                                                     p->parts->data[node],
                                                     p->parts->bytes[node])
                          : obcomm_restore_1bit(c, *p->snapshot);
        if (p->restore_fails == 0 && rc)
            fail = hx_fail(c, "restore: %s", obcomm_last_error(c));
        if (p->restore_fails) {
            stopped = 1;
            if (rc != p->restore_fails_with ||
                !strstr(obcomm_last_error(c), p->restore_fails_naming))
                fail = hx_fail(c, "restore: got %d (%s), want %d naming %s", rc,
                               obcomm_last_error(c), p->restore_fails_with,
                               p->restore_fails_naming);
            else /* op 0 failed: the run goes no further */
                fail = run_is_stopped(c, rc, 0);
        }
    }
    /* The seq of the next op: a restore took op 0. */
    int seq = p->restore ? 1 : 0;

    for (int st = p->first_step;
         st < p->first_step + p->steps && !fail && !stopped; st++)
        for (int k = 0; k < NKEYS && !fail && !stopped; k++) {
            for (size_t i = 0; i < key_count[k]; i++)
                buf[k][i] = input(rank, st, k, i);
            int nan_here =
                p->nan_step > 0 && st == p->nan_step && k == p->nan_key;
            if (nan_here && rank / ls == 1)
                buf[k][key_count[k] / 2] = NAN;
            int rc = obcomm_allreduce_1bit(c, (uint64_t)k + 100, buf[k],
                                           key_count[k]);
            int op_seq = seq++;
            if (nan_here) {
                /* Every rank fails, and the run stops there. */
                if (rc != OBCOMM_E_NONFINITE ||
                    !strstr(obcomm_last_error(c), "NaN"))
                    fail = hx_fail(c, "NaN step: got %d (%s)", rc,
                                   obcomm_last_error(c));
                else
                    fail = run_is_stopped(c, rc, op_seq);
                stopped = 1;
                break;
            }
            if (rc) {
                fail = hx_fail(c, "key %d step %d: %s", k, st,
                               obcomm_last_error(c));
                break;
            }
            if (rank == 0) {
                sim_step(&sim[k], st, k, want);
                fail = compare(c, k, st, buf[k], want, key_count[k], &flips[k]);
            }
            if (p->snapshot_after > 0 && k == NKEYS - 1 &&
                st == p->snapshot_after && !fail) {
                uint64_t id = 0;
                int rc = obcomm_save_1bit(c, &id);
                int snap_seq = seq++;
                char named[64];
                snprintf(named, sizeof(named), "could not be saved: node %d: ",
                         p->snapshot_fails_on - 1);
                if (p->snapshot_fails_on == 0 && rc)
                    fail = hx_fail(c, "snapshot: %s", obcomm_last_error(c));
                else if (p->snapshot_fails_on == 0 && rank == 0 && p->snapshot)
                    *p->snapshot = id;
                if (!fail && p->parts && p->snapshot_fails_on == 0) {
                    void *part;
                    size_t n;
                    if (obcomm_export_1bit(c, id, &part, &n))
                        fail = hx_fail(c, "export: %s", obcomm_last_error(c));
                    else if (n > PART_MAX)
                        fail = hx_fail(c, "a part of %zu bytes", n);
                    else if (rank % ls == 0) {
                        memcpy(p->parts->data[rank / ls], part, n);
                        p->parts->bytes[rank / ls] = n;
                    }
                    if (!fail)
                        free(part);
                    seq++;
                }
                if (p->snapshot_fails_on > 0) {
                    if (rc != OBCOMM_E_IO ||
                        !strstr(obcomm_last_error(c), named))
                        fail = hx_fail(c,
                                       "snapshot: got %d (%s), want "
                                       "OBCOMM_E_IO naming node %d",
                                       rc, obcomm_last_error(c),
                                       p->snapshot_fails_on - 1);
                    else
                        fail = run_is_stopped(c, rc, snap_seq);
                    stopped = 1;
                }
            }
        }

    /* Every rank holds the same result: the max and the min over ranks of
     * the last output equal it bit for bit. */
    for (int k = 0; k < NKEYS && !fail && !stopped; k++) {
        size_t n = key_count[k];
        for (int op = 0; op < 2 && !fail; op++) {
            memcpy(check, buf[k], n * sizeof(float));
            if (obcomm_allreduce(c, check, n, OBCOMM_FLOAT32,
                                 op ? OBCOMM_MIN : OBCOMM_MAX))
                fail = hx_fail(c, "max/min: %s", obcomm_last_error(c));
            else if (memcmp(check, buf[k], n * sizeof(float)))
                fail = hx_fail(c, "key %d: ranks hold different results", k);
        }
    }
    if (rank == 0) {
        for (int k = 0; k < NKEYS; k++)
            sim_free(&sim[k]);
        if (!fail)
            fprintf(stderr,
                    "onebit %d nodes x %d: %d steps x %d keys agree with the "
                    "simulation; sign flips %ld %ld %ld\n",
                    n_nodes, ls, p->steps, NKEYS, flips[0], flips[1], flips[2]);
    }
    free(want);
    return fail;
}

START_TEST(onebit_matches_simulation)
{
    static const int nodes[] = {1, 2, 3, 4, 5, 8};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, nodes[_i], NULL), 0);
    int failed = 0;
    for (int ls = 1; ls <= 3; ls++) {
        char job[32];
        snprintf(job, sizeof(job), "onebit-%d", ls);
        struct plan p = {.ls = ls, .first_step = 0, .steps = STEPS};
        failed += hx_run(&cl, ls, job, 120000, 900, trainer_onebit, &p);
    }
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
}
END_TEST

/* The wire carries about 1/32 of the fp32 ring's bytes: both ops on the
 * same 1000003 floats, counted by the daemons. */
static int trainer_ratio(obcomm_t *c, void *arg)
{
    (void)arg;
    const size_t n = 1000003;
    float *x;
    if (obcomm_alloc(c, n * sizeof(float), (void **)&x))
        return hx_fail(c, "alloc");
    for (size_t i = 0; i < n; i++)
        x[i] = input(obcomm_rank(c), 0, 0, i);
    if (obcomm_allreduce(c, x, n, OBCOMM_FLOAT32, OBCOMM_AVG))
        return hx_fail(c, "fp32: %s", obcomm_last_error(c));
    if (obcomm_barrier(c))
        return hx_fail(c, "barrier");
    if (obcomm_allreduce_1bit(c, 7, x, n))
        return hx_fail(c, "1-bit: %s", obcomm_last_error(c));
    return 0;
}

START_TEST(wire_bytes_are_a_32nd_of_fp32)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 4, NULL), 0);
    int failed = hx_run(&cl, 2, "ratio", 60000, 300, trainer_ratio, NULL);
    long long fp32 = 0, onebit = 0;
    for (int i = 0; i < 4; i++) {
        fp32 += hx_metric(&cl, i, "allreduce_bytes_sent");
        onebit += hx_metric(&cl, i, "onebit_bytes_sent");
    }
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
    double ratio = (double)fp32 / (double)onebit;
    fprintf(stderr,
            "wire bytes for 1000003 floats on 4 nodes x 2 trainers: fp32 "
            "ring %lld, 1-bit %lld (headers and scales included): %.2fx "
            "less\n",
            fp32, onebit, ratio);
    /* 32x less payload, minus frame headers and scales. */
    ck_assert_msg(ratio > 30.0 && ratio <= 32.0, "ratio %.2f", ratio);
}
END_TEST

/* A NaN fails the op on every rank and stops the run; a new run of the
 * job starts from zero on every node, as the simulation does. */
START_TEST(nan_fails_everywhere_and_stops_the_run)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 3, NULL), 0);
    struct plan p = {.ls = 2, .steps = 6, .nan_step = 2, .nan_key = 2};
    int failed = hx_run(&cl, 2, "nan", 60000, 300, trainer_onebit, &p);
    struct plan q = {.ls = 2, .steps = 3};
    failed += hx_run(&cl, 2, "nan", 60000, 300, trainer_onebit, &q);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(hx_metric(&cl, i, "runs_stopped"), 1);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
}
END_TEST

/* ---- one node ---- */

/* With one node the op is the exact average of the node's trainers
 * (docs/design.md, "The compressed allreduce, exactly"): src_0 + src_1 +
 * ... left to right in fp32, divided by (float)ls, and no state is kept.
 * The inputs hold, besides random values, floats whose bits any shortcut
 * would get wrong: -0.0, subnormals, Inf, NaNs with payloads, signalling
 * NaNs (which the division makes quiet, also with one trainer). At most
 * one operand of any addition is a NaN: which payload a sum of two NaNs
 * keeps depends on the order the machine code adds them in, which no
 * contract fixes (tests/bench/onebit_cpu -x compares builds on those). */
static const uint32_t specials[] = {
    0x80000000u, 0x00000000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu,
    0xff800000u, 0x7f800000u, 0x7fc00123u, 0x7f800001u, 0xff812345u};
/* The ones every rank may hold at once: no NaN, and no -Inf, which with
 * another rank's +Inf would make a second NaN where the first rank holds
 * one. */
static const uint32_t shared_specials[] = {0x80000000u, 0x00000001u,
                                           0x807fffffu, 0x7f800000u};
#define NSPECIALS (sizeof(specials) / sizeof(specials[0]))
#define NSHARED   (sizeof(shared_specials) / sizeof(shared_specials[0]))

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static float one_node_input(int rank, int ls, int step, int key, size_t i)
{
    if (i % 97 == 0 && (int)(i / 97 % (size_t)ls) == rank)
        return from_bits(specials[(i / 97 + (size_t)step) % NSPECIALS]);
    if (i % 89 == 0)
        return from_bits(
            shared_specials[(i / 89 + (size_t)step + (size_t)rank) % NSHARED]);
    return input(rank, step, key, i);
}

struct one_node_plan {
    int ls, steps;
};

static int trainer_one_node(obcomm_t *c, void *arg)
{
    const struct one_node_plan *p = arg;
    static const size_t counts[] = {1, 5001, 1000003};
    int rank = obcomm_rank(c), ls = p->ls;
    float *x, *want = malloc(counts[2] * sizeof(float));
    if (want == NULL || obcomm_alloc(c, counts[2] * sizeof(float), (void **)&x))
        return hx_fail(c, "alloc");
    int fail = 0;
    for (int st = 0; st < p->steps && !fail; st++)
        for (int k = 0; k < 3 && !fail; k++) {
            size_t n = counts[k];
            for (size_t i = 0; i < n; i++) {
                x[i] = one_node_input(rank, ls, st, k, i);
                float a = one_node_input(0, ls, st, k, i);
                for (int t = 1; t < ls; t++)
                    a = a + one_node_input(t, ls, st, k, i);
                want[i] = a / (float)ls;
            }
            if (obcomm_allreduce_1bit(c, (uint64_t)k + 200, x, n))
                fail = hx_fail(c, "key %d step %d: %s", k, st,
                               obcomm_last_error(c));
            for (size_t i = 0; i < n && !fail; i++) {
                uint32_t got, exact;
                memcpy(&got, &x[i], sizeof(got));
                memcpy(&exact, &want[i], sizeof(exact));
                if (got != exact)
                    fail = hx_fail(c,
                                   "key %d step %d element %zu: %08x, the "
                                   "exact average is %08x",
                                   k, st, i, got, exact);
            }
        }
    free(want);
    return fail;
}

START_TEST(one_node_is_the_exact_average_bit_for_bit)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    int failed = 0;
    for (int ls = 1; ls <= 3; ls += 2) {
        struct one_node_plan p = {.ls = ls, .steps = 6};
        failed += hx_run(&cl, ls, ls == 1 ? "one-1" : "one-3", 60000, 300,
                         trainer_one_node, &p);
    }
    long long state = hx_metric(&cl, 0, "ef_state_bytes");
    long long ops = hx_metric(&cl, 0, "onebit_ops");
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
    ck_assert_int_eq(state, 0); /* no error feedback on one node */
    ck_assert_int_eq(ops, 2 * 6 * 3);
}
END_TEST

/* The one-node average writes only what it changes: with one trainer a
 * tensor without NaNs not at all (a division by 1 is exact), a signalling
 * NaN becomes quiet in its block (here the whole tensor of one element);
 * with three trainers every buffer once. local_bytes_written counts it, so
 * that a path that copies or stores the tensor fails here. */
static int trainer_one_node_writes(obcomm_t *c, void *arg)
{
    const int *ls = arg;
    const size_t n = 1000003;
    int rank = obcomm_rank(c);
    float *x;
    if (obcomm_alloc(c, n * sizeof(float), (void **)&x))
        return hx_fail(c, "alloc");
    for (int st = 0; st < 2; st++) {
        for (size_t i = 0; i < n; i++)
            x[i] = input(rank, st, 0, i);
        if (obcomm_allreduce_1bit(c, 300, x, n))
            return hx_fail(c, "step %d: %s", st, obcomm_last_error(c));
    }
    if (*ls == 1) {
        x[0] = from_bits(0x7f800001u);
        if (obcomm_allreduce_1bit(c, 301, x, 1))
            return hx_fail(c, "sNaN: %s", obcomm_last_error(c));
        uint32_t u;
        memcpy(&u, &x[0], sizeof(u));
        if (u != 0x7fc00001u)
            return hx_fail(c, "a signalling NaN came back as %08x", u);
    }
    return 0;
}

START_TEST(one_node_writes_only_what_changes)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    int one = 1, three = 3;
    int failed =
        hx_run(&cl, 1, "w1", 60000, 300, trainer_one_node_writes, &one);
    long long w1 = hx_metric(&cl, 0, "local_bytes_written");
    failed += hx_run(&cl, 3, "w3", 60000, 300, trainer_one_node_writes, &three);
    long long w3 = hx_metric(&cl, 0, "local_bytes_written") - w1;
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
    ck_assert_int_eq(w1, 4);
    ck_assert_int_eq(w3, 2 * 3 * 1000003 * 4);
}
END_TEST

static int trainer_key_mismatch(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, 64 * sizeof(float), (void **)&x))
        return hx_fail(c, "alloc");
    int rc = obcomm_allreduce_1bit(c, obcomm_rank(c) == 2 ? 8 : 9, x, 64);
    if (rc != OBCOMM_E_MISMATCH ||
        !strstr(obcomm_last_error(c), "key differs") ||
        !strstr(obcomm_last_error(c), "rank 2 (node 2) has 8"))
        return hx_fail(c, "got %d: %s", rc, obcomm_last_error(c));
    return 0;
}

START_TEST(key_mismatch_names_the_rank)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 3, NULL), 0);
    int failed = hx_run(&cl, 1, "keys", 20000, 60, trainer_key_mismatch, NULL);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
}
END_TEST

static volatile uint64_t *shared_id(void)
{
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(p, MAP_FAILED);
    memset(p, 0, 4096);
    return p;
}

static void state_dirs(char *base, char sd[][64], const char *flags[][3],
                       const char *const **each, int n)
{
    ck_assert_ptr_nonnull(mkdtemp(base));
    for (int i = 0; i < n; i++) {
        snprintf(sd[i], 64, "%s/node%d", base, i);
        ck_assert_int_eq(mkdir(sd[i], 0700), 0);
        flags[i][0] = "--state-dir";
        flags[i][1] = sd[i];
        flags[i][2] = NULL;
        each[i] = flags[i];
    }
}

/* Snapshots name a step of a run: a new run restores one explicitly, after
 * a crash or a clean shutdown alike; without a restore a new run starts
 * at zero; a set damaged on one node is used by no node. Each node has
 * its own state_dir, kept across restarts on the same ports (the world's
 * fingerprint covers the addresses). */
START_TEST(snapshots_restore_reset_and_reject)
{
    char base[] = "/tmp/obcomm-snap-XXXXXX";
    char sd[2][64];
    const char *flags[2][3];
    const char *const *each[2];
    state_dirs(base, sd, flags, each, 2);
    volatile uint64_t *id = shared_id();
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start_each(&cl, 2, each), 0);

    /* Steps 0-6 with a snapshot after step 4, then a crash: a new run
     * restores the state after step 4. */
    struct plan a = {.ls = 2, .steps = 7, .snapshot_after = 4, .snapshot = id};
    ck_assert_int_eq(hx_run(&cl, 2, "snap", 60000, 300, trainer_onebit, &a), 0);
    ck_assert_uint_ne(*id, 0);
    hx_halt(&cl, SIGKILL);
    ck_assert_int_eq(hx_restart(&cl), 0);
    struct plan b = {.ls = 2,
                     .first_step = 5,
                     .steps = 5,
                     .sim_steps_before = 5,
                     .snapshot = id,
                     .restore = 1};
    ck_assert_int_eq(hx_run(&cl, 2, "snap", 60000, 300, trainer_onebit, &b), 0);
    ck_assert_int_eq(hx_metric(&cl, 0, "ef_restored"), NKEYS);
    ck_assert_int_eq(hx_metric(&cl, 1, "ef_restored"), NKEYS);

    /* A clean shutdown saves nothing: a new run without a restore starts
     * at zero, and one with the restore goes back to step 4 again. */
    ck_assert_int_eq(hx_halt(&cl, SIGTERM), 0);
    ck_assert_int_eq(hx_restart(&cl), 0);
    struct plan c = {.ls = 2, .steps = 2};
    ck_assert_int_eq(hx_run(&cl, 2, "snap", 60000, 300, trainer_onebit, &c), 0);
    ck_assert_int_eq(hx_run(&cl, 2, "snap", 60000, 300, trainer_onebit, &b), 0);

    /* One byte damaged on node 0: the restore fails on every rank naming
     * node 0, and no node uses the set. */
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "for f in %s/set-*/ef-*.lz4; do printf '\\377' | dd of=$f bs=1 "
             "seek=200 conv=notrunc status=none; done",
             sd[0]);
    ck_assert_int_eq(system(cmd), 0);
    struct plan d = {.ls = 2,
                     .snapshot = id,
                     .restore = 1,
                     .restore_fails = 1,
                     .restore_fails_with = OBCOMM_E_CORRUPT,
                     .restore_fails_naming = "could not be restored: node 0: "
                                             "damaged"};
    ck_assert_int_eq(hx_run(&cl, 2, "snap", 60000, 300, trainer_onebit, &d), 0);
    ck_assert_int_eq(hx_metric(&cl, 0, "ef_rejected"), 1);
    ck_assert_int_eq(hx_metric(&cl, 1, "ef_rejected"), 0);
    /* ... and the next run starts at zero on both. */
    ck_assert_int_eq(hx_run(&cl, 2, "snap", 60000, 300, trainer_onebit, &c), 0);

    /* A set missing on node 1 is missing: named as such. */
    snprintf(cmd, sizeof(cmd), "rm -rf %s/set-*", sd[1]);
    ck_assert_int_eq(system(cmd), 0);
    struct plan e = d;
    e.restore_fails_with = OBCOMM_E_CORRUPT; /* node 0's comes first */
    e.restore_fails_naming = "node 1: missing";
    ck_assert_int_eq(hx_run(&cl, 2, "snap", 60000, 300, trainer_onebit, &e), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", base);
    ck_assert_int_eq(system(cmd), 0);
    munmap((void *)id, 4096);
}
END_TEST

static int count_sets(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "ls -d %s/set-* 2>/dev/null | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p == NULL || fscanf(p, "%d", &n) != 1)
        n = -1;
    if (p)
        pclose(p);
    return n;
}

/* A snapshot that one node cannot write (its state_dir is a read-only
 * bind mount: root ignores permission bits, not a read-only mount) fails
 * on every rank naming that node and stops the run; the set it could not
 * write is dropped everywhere, and after a crash a new run restores the
 * previous set exactly. */
START_TEST(failed_snapshot_keeps_the_previous_set)
{
    char base[] = "/tmp/obcomm-snapfail-XXXXXX";
    char sd[3][64];
    const char *flags[3][3];
    const char *const *each[3];
    state_dirs(base, sd, flags, each, 3);
    volatile uint64_t *id = shared_id();
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start_each(&cl, 3, each), 0);
    struct plan a = {.ls = 2, .steps = 7, .snapshot_after = 4, .snapshot = id};
    ck_assert_int_eq(hx_run(&cl, 2, "fs", 60000, 300, trainer_onebit, &a), 0);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(count_sets(sd[i]), 1);

    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "mount --bind %s %s && mount -o remount,ro,bind %s", sd[1], sd[1],
             sd[1]);
    ck_assert_int_eq(system(cmd), 0);
    /* A new run: from zero, as the simulation of steps 7-9 alone. */
    struct plan b = {.ls = 2,
                     .first_step = 7,
                     .steps = 3,
                     .snapshot_after = 8,
                     .snapshot_fails_on = 2};
    int failed = hx_run(&cl, 2, "fs", 60000, 300, trainer_onebit, &b);
    snprintf(cmd, sizeof(cmd), "umount %s", sd[1]);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(failed, 0);
    ck_assert(hx_log_contains(&cl, 1, "Read-only file system"));
    /* Nodes 0 and 2 wrote the set and drop it again when the failed op
     * is freed, a loop turn after its answer reached the trainers, with a
     * pool task. Nothing outside the daemon signals that, so this polls
     * the condition itself: the directory, every 50 ms for at most 5 s. */
    for (int i = 0; i < 3; i++) {
        int sets = count_sets(sd[i]);
        for (int t = 0; t < 100 && sets != 1; t++) {
            hx_sleep_ms(50);
            sets = count_sets(sd[i]);
        }
        ck_assert_int_eq(sets, 1);
    }

    /* A crash; a new run restores the state after step 4 on every
     * node. */
    hx_halt(&cl, SIGKILL);
    ck_assert_int_eq(hx_restart(&cl), 0);
    struct plan c = {.ls = 2,
                     .first_step = 5,
                     .steps = 3,
                     .sim_steps_before = 5,
                     .snapshot = id,
                     .restore = 1};
    ck_assert_int_eq(hx_run(&cl, 2, "fs", 60000, 300, trainer_onebit, &c), 0);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(hx_metric(&cl, i, "ef_restored"), NKEYS);
    ck_assert_int_eq(hx_stop(&cl), 0);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", base);
    ck_assert_int_eq(system(cmd), 0);
    munmap((void *)id, 4096);
}
END_TEST

/* One daemon crashes and restarts while the other kept the run's error
 * feedback in memory (the run ended with its trainers, so it is freed):
 * a new run restores the snapshot on both (never one node at step 6 and
 * the other at step 4), and one without a restore starts at zero on
 * both. Without a state_dir the newest set lives in memory: the same
 * daemons restore it; a restarted one has lost it, and the restore fails
 * on every rank naming it. */
START_TEST(one_daemon_restarts_both_go_back_to_the_snapshot)
{
    char base[] = "/tmp/obcomm-partial-XXXXXX";
    char sd[2][64];
    const char *flags[2][3];
    const char *const *each[2];
    state_dirs(base, sd, flags, each, 2);
    volatile uint64_t *id = shared_id();
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start_each(&cl, 2, each), 0);
    struct plan a = {.ls = 2, .steps = 7, .snapshot_after = 4, .snapshot = id};
    ck_assert_int_eq(hx_run(&cl, 2, "part", 60000, 300, trainer_onebit, &a), 0);
    ck_assert_int_eq(hx_crash_restart(&cl, 1), 0);
    struct plan b = {.ls = 2,
                     .first_step = 5,
                     .steps = 3,
                     .sim_steps_before = 5,
                     .snapshot = id,
                     .restore = 1};
    ck_assert_int_eq(hx_run(&cl, 2, "part", 60000, 300, trainer_onebit, &b), 0);
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(hx_metric(&cl, i, "ef_restored"), NKEYS);
    struct plan z = {.ls = 2, .steps = 3};
    ck_assert_int_eq(hx_run(&cl, 2, "part", 60000, 300, trainer_onebit, &z), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);

    /* No state_dir: in memory, and each node's part exported (as a
     * checkpoint carries it). The same daemons restore the set; after a
     * crash of node 1 its part restores it exactly; without the part the
     * restore fails on every rank naming node 1. */
    struct parts *parts = mmap(NULL, sizeof(*parts), PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(parts, MAP_FAILED);
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    struct plan ap = a;
    ap.parts = parts;
    ck_assert_int_eq(hx_run(&cl, 2, "mem", 60000, 300, trainer_onebit, &ap), 0);
    ck_assert_uint_gt(parts->bytes[0], 0);
    ck_assert_uint_eq(parts->bytes[0], parts->bytes[1]);
    ck_assert_int_eq(hx_run(&cl, 2, "mem", 60000, 300, trainer_onebit, &b), 0);
    ck_assert_int_eq(hx_crash_restart(&cl, 1), 0);
    struct plan bp = b;
    bp.parts = parts;
    ck_assert_int_eq(hx_run(&cl, 2, "mem", 60000, 300, trainer_onebit, &bp), 0);
    /* Node 0's part carried to node 1: refused there as another node's. */
    memcpy(parts->data[1], parts->data[0], parts->bytes[0]);
    struct plan wrong = bp;
    wrong.restore_fails = 1;
    wrong.restore_fails_with = OBCOMM_E_CORRUPT;
    wrong.restore_fails_naming = "node 1: damaged: a part of node 0";
    ck_assert_int_eq(hx_run(&cl, 2, "mem", 60000, 300, trainer_onebit, &wrong),
                     0);
    munmap(parts, sizeof(*parts));
    ck_assert_int_eq(hx_crash_restart(&cl, 1), 0);
    struct plan d = {.ls = 2,
                     .snapshot = id,
                     .restore = 1,
                     .restore_fails = 1,
                     .restore_fails_with = OBCOMM_E_STATE,
                     .restore_fails_naming = "node 1: missing (no state_dir"};
    ck_assert_int_eq(hx_run(&cl, 2, "mem", 60000, 300, trainer_onebit, &d), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", base);
    ck_assert_int_eq(system(cmd), 0);
    munmap((void *)id, 4096);
}
END_TEST

/* The file of key `key` in set `id` of job "tamper" in state_dir sd. */
static void tamper_file(const char *sd, uint64_t id, uint64_t key, char *buf,
                        size_t len)
{
    char pat[512];
    /* "tamper" in hex */
    snprintf(pat, sizeof(pat), "%s/set-74616d706572-%016llx/ef-*-%016llx.lz4",
             sd, (unsigned long long)id, (unsigned long long)key);
    glob_t g;
    ck_assert_int_eq(glob(pat, 0, NULL, &g), 0);
    ck_assert_uint_eq(g.gl_pathc, 1);
    snprintf(buf, len, "%s", g.gl_pathv[0]);
    globfree(&g);
}

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    ck_assert_msg(system(cmd) == 0, "%s", cmd);
}

/* Waits (every 20 ms, at most 10 s) until no trainer is connected to any
 * daemon (obcommctl's own connection is the one left): the trainers of
 * the last run are gone everywhere before the next run of the job
 * starts, so that no late departure of one of them meets the new run. */
static void settle(const struct hx_cluster *cl)
{
    for (int i = 0; i < cl->nodes; i++) {
        long long n = hx_metric(cl, i, "clients");
        for (int t = 0; t < 500 && n > 1; t++) {
            usleep(20 * 1000);
            n = hx_metric(cl, i, "clients");
        }
        ck_assert_int_le(n, 1);
    }
}

/* Real files of a real set tampered with on node 1, each way a partial
 * restore of a backup or a slip of the hand leaves them: one key's file
 * from an older set of the job, one key's file gone, a file added, a byte
 * damaged. Each time the restore fails on every rank naming node 1 and
 * the file, no node uses the set, and the next run starts at zero and is
 * exact. Put back whole, the set restores exactly. */
START_TEST(tampered_sets_are_refused_naming_node_and_file)
{
    char base[] = "/tmp/obcomm-tamper-XXXXXX";
    char sd[2][64];
    const char *flags[2][3];
    const char *const *each[2];
    state_dirs(base, sd, flags, each, 2);
    volatile uint64_t *id = shared_id();
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start_each(&cl, 2, each), 0);

    /* Set X after step 2 of one run, set Y after step 4 of another. */
    struct plan px = {.ls = 2, .steps = 4, .snapshot_after = 2, .snapshot = id};
    ck_assert_int_eq(hx_run(&cl, 2, "tamper", 60000, 300, trainer_onebit, &px),
                     0);
    uint64_t x = *id;
    struct plan py = {.ls = 2, .steps = 6, .snapshot_after = 4, .snapshot = id};
    settle(&cl);
    ck_assert_int_eq(hx_run(&cl, 2, "tamper", 60000, 300, trainer_onebit, &py),
                     0);
    uint64_t y = *id;
    ck_assert_uint_ne(x, y);
    char ydir[256], keep[256], file[512], xfile[512];
    snprintf(ydir, sizeof(ydir), "%s/set-74616d706572-%016llx", sd[1],
             (unsigned long long)y);
    snprintf(keep, sizeof(keep), "%s/y-whole", base);
    sh("cp -a %s %s", ydir, keep);

    struct plan fails = {.ls = 2,
                         .snapshot = id,
                         .restore = 1,
                         .restore_fails = 1,
                         .restore_fails_with = OBCOMM_E_CORRUPT};
    struct plan zero = {.ls = 2, .steps = 2};
    char naming[1024];
    for (int way = 0; way < 4; way++) {
        sh("rm -rf %s && cp -a %s %s", ydir, keep, ydir);
        tamper_file(sd[1], y, 100 + (uint64_t)way % 3, file, sizeof(file));
        switch (way) {
        case 0: /* key 100's file of set X in set Y */
            tamper_file(sd[1], x, 100, xfile, sizeof(xfile));
            sh("cp -f %s %s", xfile, file);
            snprintf(naming, sizeof(naming),
                     "node 1: damaged: %s: a file of set", file);
            break;
        case 1:
            sh("rm -f %s", file);
            snprintf(naming, sizeof(naming),
                     "node 1: damaged: %s: missing (named in the set's "
                     "manifest)",
                     file);
            break;
        case 2:
            snprintf(file, sizeof(file),
                     "%s/ef-0000000000000000-00000000000000ff.lz4", ydir);
            sh("cp -f %s/manifest %s", ydir, file);
            snprintf(naming, sizeof(naming),
                     "node 1: damaged: "
                     "%s/ef-0000000000000000-00000000000000ff.lz4: not in "
                     "the set's manifest",
                     ydir);
            break;
        default:
            sh("printf '\\377' | dd of=%s bs=1 seek=200 conv=notrunc "
               "status=none",
               file);
            snprintf(naming, sizeof(naming), "node 1: damaged: %s: ", file);
            break;
        }
        *id = y;
        fails.restore_fails_naming = naming;
        settle(&cl);
        ck_assert_int_eq(
            hx_run(&cl, 2, "tamper", 60000, 300, trainer_onebit, &fails), 0);
        settle(&cl);
        ck_assert_int_eq(
            hx_run(&cl, 2, "tamper", 60000, 300, trainer_onebit, &zero), 0);
    }
    ck_assert_int_eq(hx_metric(&cl, 1, "ef_rejected"), 4);
    ck_assert_int_eq(hx_metric(&cl, 0, "ef_rejected"), 0);
    ck_assert_int_eq(hx_metric(&cl, 0, "ef_restored"), 0);

    /* Put back whole: Y restores exactly, and so does X. */
    sh("rm -rf %s && cp -a %s %s", ydir, keep, ydir);
    *id = y;
    struct plan ry = {.ls = 2,
                      .first_step = 5,
                      .steps = 2,
                      .sim_steps_before = 5,
                      .snapshot = id,
                      .restore = 1};
    settle(&cl);
    ck_assert_int_eq(hx_run(&cl, 2, "tamper", 60000, 300, trainer_onebit, &ry),
                     0);
    *id = x;
    struct plan rx = {.ls = 2,
                      .first_step = 3,
                      .steps = 2,
                      .sim_steps_before = 3,
                      .snapshot = id,
                      .restore = 1};
    settle(&cl);
    ck_assert_int_eq(hx_run(&cl, 2, "tamper", 60000, 300, trainer_onebit, &rx),
                     0);
    ck_assert_int_eq(hx_metric(&cl, 1, "ef_restored"), 2 * NKEYS);
    ck_assert_int_eq(hx_stop(&cl), 0);
    sh("rm -rf %s", base);
    munmap((void *)id, 4096);
}
END_TEST

/* A big key, two 1-bit steps, then a snapshot: the test kills node 2's
 * daemon while the nodes write their parts. */
#define BIG_COUNT ((size_t)8 << 20)

static int trainer_snapshot_dies(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, BIG_COUNT * sizeof(float), (void **)&x))
        return hx_fail(c, "alloc");
    for (int st = 0; st < 2; st++) {
        for (size_t i = 0; i < BIG_COUNT; i++)
            x[i] = input(obcomm_rank(c), st, 0, i);
        if (obcomm_allreduce_1bit(c, 7, x, BIG_COUNT))
            return hx_fail(c, "step %d: %s", st, obcomm_last_error(c));
    }
    uint64_t id = 0;
    int rc = obcomm_save_1bit(c, &id);
    if (obcomm_rank(c) == 2)
        return 0; /* its daemon is gone */
    if (rc == 0)
        return hx_fail(c, "the snapshot succeeded although node 2 died");
    return 0;
}

/* Sets in sd once they settle (a failed op's part is dropped by a pool
 * task after the op is freed): polls every 50 ms for at most 5 s. */
static int settled_sets(const char *sd, int want)
{
    int n = count_sets(sd);
    for (int t = 0; t < 100 && n != want; t++) {
        usleep(50 * 1000);
        n = count_sets(sd);
    }
    return n;
}

/* A snapshot op that fails because a node dies while the nodes write
 * their parts (the op fails on the others with the node lost, before any
 * verdict) leaves no set on any node; the next run starts at zero and is
 * exact. */
START_TEST(a_snapshot_failed_by_a_lost_node_leaves_no_set)
{
    char base[] = "/tmp/obcomm-snaplost-XXXXXX";
    char sd[3][64];
    const char *flags[3][3];
    const char *const *each[3];
    state_dirs(base, sd, flags, each, 3);
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start_each(&cl, 3, each), 0);
    pid_t t[3];
    for (int n = 0; n < 3; n++)
        t[n] =
            hx_spawn(&cl, n, 0, 1, "lost", 60000, trainer_snapshot_dies, NULL);
    /* Node 0 writes its part: its temporary directory is there. */
    char pat[128];
    snprintf(pat, sizeof(pat), "%s/set-*.tmp", sd[0]);
    int seen = 0;
    for (int i = 0; i < 120000 && !seen; i++) {
        glob_t g;
        seen = glob(pat, 0, NULL, &g) == 0;
        globfree(&g);
        if (!seen)
            usleep(500);
    }
    ck_assert(seen);
    ck_assert_int_eq(kill(cl.daemon[2], SIGKILL), 0);
    for (int n = 0; n < 3; n++) {
        int st = hx_wait(t[n], 120000);
        if (n < 2)
            ck_assert_msg(st == 0, "trainer of node %d: status %d", n, st);
    }
    ck_assert_int_eq(settled_sets(sd[0], 0), 0);
    ck_assert_int_eq(settled_sets(sd[1], 0), 0);
    /* Node 2 died in the middle of its write: its start removes the
     * unfinished part. */
    ck_assert_int_eq(hx_restart_node(&cl, 2, SIGKILL), 0);
    ck_assert_int_eq(count_sets(sd[2]), 0);
    struct plan zero = {.ls = 1, .steps = 2};
    settle(&cl);
    ck_assert_int_eq(hx_run(&cl, 1, "lost", 60000, 300, trainer_onebit, &zero),
                     0);
    ck_assert_int_eq(hx_stop(&cl), 0);
    sh("rm -rf %s", base);
}
END_TEST

/* A leftover set: a node that saw every report of a snapshot op and
 * committed the set, while the op failed on the others (a link that went
 * down between the reports and the verdict: the others' failure never
 * reaches it), keeps its part; the others dropped theirs when their op
 * failed. Here the set is saved on every node of job "left", then
 * nodes 0 and 1 drop their parts as a failed op does. A restore of it
 * fails on every rank naming the nodes that lack it, no node installs
 * it, the next run starts at zero, and the node's later commits prune it
 * like any older set of the job (the newest 4 are kept). */
START_TEST(a_leftover_set_is_never_used)
{
    char base[] = "/tmp/obcomm-leftover-XXXXXX";
    char sd[3][64];
    const char *flags[3][3];
    const char *const *each[3];
    state_dirs(base, sd, flags, each, 3);
    volatile uint64_t *id = shared_id();
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start_each(&cl, 3, each), 0);
    struct plan a = {.ls = 1, .steps = 7, .snapshot_after = 4, .snapshot = id};
    ck_assert_int_eq(hx_run(&cl, 1, "left", 60000, 300, trainer_onebit, &a), 0);
    uint64_t left = *id;
    ck_assert_uint_ne(left, 0);
    char leftover[128];
    snprintf(leftover, sizeof(leftover), "%s/set-%s-%016llx", sd[2], "6c656674",
             (unsigned long long)left);
    ck_assert_int_eq(access(leftover, F_OK), 0);
    sh("rm -rf %s/set-* %s/set-*", sd[0], sd[1]);

    struct plan b = {.ls = 1,
                     .snapshot = id,
                     .restore = 1,
                     .restore_fails = 1,
                     .restore_fails_with = OBCOMM_E_STATE,
                     .restore_fails_naming = "could not be restored: node 0: "
                                             "missing"};
    ck_assert_int_eq(hx_run(&cl, 1, "left", 60000, 300, trainer_onebit, &b), 0);
    b.restore_fails_naming = "; node 1: missing";
    ck_assert_int_eq(hx_run(&cl, 1, "left", 60000, 300, trainer_onebit, &b), 0);
    for (int n = 0; n < 3; n++)
        ck_assert_int_eq(hx_metric(&cl, n, "ef_restored"), 0);
    /* The next run starts at zero: the simulation from step 0. */
    struct plan c = {.ls = 1, .steps = 3};
    ck_assert_int_eq(hx_run(&cl, 1, "left", 60000, 300, trainer_onebit, &c), 0);
    /* Four later sets of the job: node 2 keeps the newest 4, so the
     * leftover goes. */
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(access(leftover, F_OK), 0);
        ck_assert_int_eq(hx_run(&cl, 1, "left", 60000, 300, trainer_onebit, &a),
                         0);
        ck_assert_uint_ne(*id, left);
    }
    ck_assert_int_ne(access(leftover, F_OK), 0);
    for (int n = 0; n < 3; n++)
        ck_assert_int_eq(count_sets(sd[n]), 4);
    ck_assert_int_eq(hx_stop(&cl), 0);
    sh("rm -rf %s", base);
    munmap((void *)id, 4096);
}
END_TEST

Suite *onebit_suite(void)
{
    Suite *s = suite_create("onebit");
    TCase *tc = tcase_create("onebit");
    tcase_set_timeout(tc, 1800);
    tcase_add_loop_test(tc, onebit_matches_simulation, 0, 6);
    tcase_add_test(tc, wire_bytes_are_a_32nd_of_fp32);
    tcase_add_test(tc, nan_fails_everywhere_and_stops_the_run);
    tcase_add_test(tc, key_mismatch_names_the_rank);
    suite_add_tcase(s, tc);
    /* CK_RUN_CASE=snapshots runs these alone. */
    TCase *snap = tcase_create("snapshots");
    tcase_set_timeout(snap, 1800);
    tcase_add_test(snap, snapshots_restore_reset_and_reject);
    tcase_add_test(snap, failed_snapshot_keeps_the_previous_set);
    tcase_add_test(snap, one_daemon_restarts_both_go_back_to_the_snapshot);
    tcase_add_test(snap, tampered_sets_are_refused_naming_node_and_file);
    tcase_add_test(snap, a_snapshot_failed_by_a_lost_node_leaves_no_set);
    tcase_add_test(snap, a_leftover_set_is_never_used);
    suite_add_tcase(s, snap);
    /* CK_RUN_CASE=one_node runs these alone. */
    TCase *one = tcase_create("one_node");
    tcase_set_timeout(one, 600);
    tcase_add_test(one, one_node_is_the_exact_average_bit_for_bit);
    tcase_add_test(one, one_node_writes_only_what_changes);
    suite_add_tcase(s, one);
    return s;
}

int main(void)
{
    return ck_run(onebit_suite());
}
