/* The 1-bit allreduce through real daemons, against an independent scalar
 * simulation of all n nodes written here from DESIGN.md section 2: every
 * node averages its trainers, compresses with worker error feedback, every
 * server compresses its chunk with server error feedback, and everybody
 * decompresses the servers' chunks.
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
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
};

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
    if (rank == 0)
        for (int st = 0; st < p->sim_steps_before; st++)
            for (int k = 0; k < NKEYS; k++)
                sim_step(&sim[k], st, k, want);

    for (int st = p->first_step; st < p->first_step + p->steps && !fail; st++)
        for (int k = 0; k < NKEYS && !fail; k++) {
            for (size_t i = 0; i < key_count[k]; i++)
                buf[k][i] = input(rank, st, k, i);
            int rc = obcomm_allreduce_1bit(c, (uint64_t)k + 100, buf[k],
                                           key_count[k]);
            if (rc) {
                fail = hx_fail(c, "key %d step %d: %s", k, st,
                               obcomm_last_error(c));
                break;
            }
            if (rank == 0) {
                sim_step(&sim[k], st, k, want);
                fail = compare(c, k, st, buf[k], want, key_count[k], &flips[k]);
            }
        }

    /* Every rank holds the same result: the max and the min over ranks of
     * the last output equal it bit for bit. */
    for (int k = 0; k < NKEYS && !fail; k++) {
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

Suite *onebit_suite(void)
{
    Suite *s = suite_create("onebit");
    TCase *tc = tcase_create("onebit");
    tcase_set_timeout(tc, 1800);
    tcase_add_loop_test(tc, onebit_matches_simulation, 0, 6);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(onebit_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
