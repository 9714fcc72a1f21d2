/* 0/1 Adam in libobcomm (obcomm_zoadam_*) against real daemons.
 *
 * The problem of test_adam.c: rank r minimises 0.5 * |p - target_r(step)|^2.
 * With one node every collective is exact (the 1-bit average too), so a
 * reference written out here for every rank must match bit for bit
 * through both stages: variance updates at doubling intervals, 1-bit
 * steps, the freeze, local steps at doubling intervals, the mask. With
 * two nodes the 1-bit average is compressed, so the test checks what must
 * hold exactly: every rank holds the same bits after every stage-1 step
 * and synchronization, and the rounds follow the schedule.
 */
#include <check.h>

#include "ck_run.h"
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define COUNT 1001
#define STEPS 26
#define MAXR  4

static float target(int rank, int step, size_t i)
{
    return sinf((float)(i % 97) * 0.37f + (float)rank * 1.3f +
                (float)step * 0.05f);
}

/* Coordinates i % 5 == 0 see gradient 0 for the first 8 steps: their
 * variance stays tiny, so the mask holds them for a while. */
static void grads_of(int rank, int step, const float *p, float *g)
{
    for (size_t i = 0; i < COUNT; i++)
        g[i] = i % 5 == 0 && step < 8 ? 0.0f : p[i] - target(rank, step, i);
}

/* A schedule short enough to reach every branch in 26 steps (as
 * tests/python/zeroone_workers.py's). */
static obcomm_zoadam_config_t config(void)
{
    obcomm_zoadam_config_t k = obcomm_zoadam_defaults();
    k.lr = 0.01f;
    k.eps = 1e-4f;
    k.weight_decay = 0.01f;
    k.var_freeze_step = 12;
    k.var_update_scaler = 2;
    k.local_step_scaler = 3;
    k.local_step_clipper = 4;
    return k;
}

/* The reference: `size` ranks of one node, written out. After `steps`
 * steps, rank `me`'s parameters in out; fp32 and 1-bit rounds. */
static void reference(int size, int me, int steps, float *out, long *fp32,
                      long *onebit)
{
    obcomm_zoadam_config_t k = config();
    static float p[MAXR][COUNT], m[MAXR][COUNT], u[MAXR][COUNT];
    static float v[COUNT], x[COUNT], d[COUNT], g[MAXR][COUNT], avg[COUNT];
    memset(m, 0, sizeof(m));
    memset(u, 0, sizeof(u));
    memset(v, 0, sizeof(v));
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < COUNT; i++)
            p[r][i] = cosf((float)i);
    long vi = 1, vc = 0, li = 1, lc = 0;
    int frozen = 0;
    float thr = -1.0f;
    double lrs = 0;
    *fp32 = *onebit = 0;
    for (int t = 1; t <= steps; t++) {
        for (int r = 0; r < size; r++)
            grads_of(r, t - 1, p[r], g[r]);
        int full = !frozen && t % vi == 0;
        int sync = frozen && t % li == 0;
        if (!frozen) {
            for (size_t i = 0; i < COUNT; i++) {
                float s = g[0][i];
                for (int r = 1; r < size; r++)
                    s += g[r][i];
                avg[i] = s / (float)size;
            }
            if (full) {
                (*fp32)++;
                double sum = 0;
                for (size_t i = 0; i < COUNT; i++) {
                    v[i] = v[i] * k.beta2 + (1 - k.beta2) * avg[i] * avg[i];
                    sum += (double)v[i];
                }
                double rr =
                    (double)OBCOMM_ZOADAM_AUTO_MASK_RATIO * sqrt(sum / COUNT);
                thr = (float)(rr * rr);
            } else {
                (*onebit)++;
                for (size_t i = 0; i < COUNT; i++)
                    if (thr >= 0 && v[i] <= thr)
                        avg[i] = 0.0f;
            }
            for (int r = 0; r < size; r++)
                for (size_t i = 0; i < COUNT; i++) {
                    m[r][i] = m[r][i] * k.beta1 + (1 - k.beta1) * avg[i];
                    float up = m[r][i] / (sqrtf(v[i]) + k.eps) +
                               k.weight_decay * p[r][i];
                    p[r][i] += -k.lr * up;
                }
        } else {
            lrs += k.lr;
            for (int r = 0; r < size; r++)
                for (size_t i = 0; i < COUNT; i++) {
                    m[r][i] = m[r][i] * k.beta1 + (1 - k.beta1) * g[r][i];
                    float up = m[r][i] / d[i] + k.weight_decay * p[r][i];
                    p[r][i] += -k.lr * up;
                    u[r][i] += -k.lr * up;
                }
            if (sync) {
                (*onebit)++;
                for (size_t i = 0; i < COUNT; i++) {
                    float s = u[0][i] * d[i];
                    for (int r = 1; r < size; r++)
                        s += u[r][i] * d[i];
                    float a = s / (float)size;
                    if (v[i] <= thr)
                        a = 0.0f;
                    for (int r = 0; r < size; r++) {
                        m[r][i] = a / -(float)lrs;
                        p[r][i] = x[i] + a / d[i];
                        u[r][i] = 0.0f;
                    }
                    x[i] = p[0][i];
                }
                lrs = 0;
            }
        }
        if (!frozen) {
            if (full && ++vc == k.var_update_scaler) {
                vc = 0;
                vi *= 2;
            }
        } else if (++lc == k.local_step_scaler) {
            lc = 0;
            li = li * 2 < k.local_step_clipper ? li * 2 : k.local_step_clipper;
        }
        if (!frozen && t > k.var_freeze_step) {
            frozen = 1;
            for (size_t i = 0; i < COUNT; i++) {
                d[i] = sqrtf(v[i]) + k.eps;
                x[i] = p[0][i];
            }
        }
    }
    memcpy(out, p[me], sizeof(p[me]));
}

struct plan {
    int exact; /* one node: compare with the reference */
};

/* 1 when the ranks' p differ, 0 when all hold the same bits, -1 on an
 * error. A collective. */
static int differ(obcomm_t *c, const float *p, float *tmp)
{
    int d = 0;
    for (int op = 0; op < 2; op++) {
        memcpy(tmp, p, COUNT * sizeof(float));
        if (obcomm_allreduce(c, tmp, COUNT, OBCOMM_FLOAT32,
                             op ? OBCOMM_MIN : OBCOMM_MAX)) {
            hx_fail(c, "check: %s", obcomm_last_error(c));
            return -1;
        }
        d |= memcmp(tmp, p, COUNT * sizeof(float)) != 0;
    }
    return d;
}

static int trainer(obcomm_t *c, void *arg)
{
    const struct plan *pl = arg;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    obcomm_zoadam_config_t k = config();
    obcomm_zoadam_t *a;
    int rc = obcomm_zoadam_create(c, 3, COUNT, &k, &a);
    if (rc)
        return hx_fail(c, "create: %s", obcomm_strerror(rc));
    static float p[COUNT], g[COUNT], want[COUNT];
    float *tmp; /* the check's collectives take shared memory */
    if (obcomm_alloc(c, sizeof(p), (void **)&tmp))
        return hx_fail(c, "alloc");
    for (size_t i = 0; i < COUNT; i++)
        p[i] = cosf((float)i);
    long vi = 1, vc = 0, li = 1, lc = 0;
    int frozen = 0;
    for (int t = 1; t <= STEPS; t++) {
        grads_of(rank, t - 1, p, g);
        int full = !frozen && t % vi == 0, sync = frozen && t % li == 0;
        if ((rc = obcomm_zoadam_step(a, p, g)))
            return hx_fail(c, "step %d: %s", t, obcomm_last_error(c));
        /* Where the ranks synchronized they hold the same bits; on a
         * local step (stage 2, no sync) each its own. */
        int d = differ(c, p, tmp);
        if (d < 0)
            return 1;
        if (d != (frozen && !sync))
            return hx_fail(c, "step %d (%s): ranks %s", t,
                           frozen ? (sync ? "sync" : "local") : "stage 1",
                           d ? "differ" : "agree");
        if (!frozen) {
            if (full && ++vc == k.var_update_scaler) {
                vc = 0;
                vi *= 2;
            }
        } else if (++lc == k.local_step_scaler) {
            lc = 0;
            li = li * 2 < k.local_step_clipper ? li * 2 : k.local_step_clipper;
        }
        frozen = frozen || t > k.var_freeze_step;
    }
    long f32, ob, rf, rb;
    obcomm_zoadam_rounds(a, &f32, &ob);
    reference(size, rank, STEPS, want, &rf, &rb);
    if (f32 != rf || ob != rb)
        return hx_fail(c, "rounds %ld + %ld, the schedule %ld + %ld", f32, ob,
                       rf, rb);
    if (pl->exact && memcmp(p, want, sizeof(p)))
        return hx_fail(c, "parameters differ from the reference");
    if (obcomm_zoadam_steps(a) != STEPS)
        return hx_fail(c, "steps %ld", obcomm_zoadam_steps(a));
    obcomm_zoadam_destroy(a);
    obcomm_free(c, tmp);
    return 0;
}

START_TEST(one_node_matches_reference)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    struct plan pl = {.exact = 1};
    ck_assert_int_eq(hx_run(&cl, 3, "zo-ref", 20000, 120, trainer, &pl), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

START_TEST(two_nodes_identical_where_synchronized)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    struct plan pl = {.exact = 0};
    ck_assert_int_eq(hx_run(&cl, 2, "zo-two", 20000, 120, trainer, &pl), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* A checkpoint: run A saves the optimizer and the parameters after step
 * SAVE_AT (a local step, between synchronizations) and writes its final
 * parameters; run B, after the daemons restarted, loads both and must end
 * with the same bits. */
#define SAVE_AT 21

struct ckpt {
    const char *dir;
    int resume;
};

static int ckpt_trainer(obcomm_t *c, void *arg)
{
    const struct ckpt *ck = arg;
    int rank = obcomm_rank(c);
    char opt[512], par[512], fin[512], bad[512];
    snprintf(opt, sizeof(opt), "%s/opt.%d", ck->dir, rank);
    snprintf(bad, sizeof(bad), "%s/bad.%d", ck->dir, rank);
    snprintf(par, sizeof(par), "%s/params.%d", ck->dir, rank);
    snprintf(fin, sizeof(fin), "%s/final.%d", ck->dir, rank);
    obcomm_zoadam_config_t k = config();
    obcomm_zoadam_t *a;
    int rc = obcomm_zoadam_create(c, 3, COUNT, &k, &a);
    if (rc)
        return hx_fail(c, "create: %s", obcomm_strerror(rc));
    static float p[COUNT], g[COUNT], want[COUNT];
    int first = 1;
    for (size_t i = 0; i < COUNT; i++)
        p[i] = cosf((float)i);
    if (ck->resume) {
        FILE *f = fopen(par, "rb");
        if (f == NULL || fread(p, sizeof(p), 1, f) != 1)
            return hx_fail(c, "cannot read %s", par);
        fclose(f);
        /* A copy whose local-step interval is 0 is refused before any
         * collective, and the optimizer stays as it was. */
        if ((rc = hx_damaged_copy(opt, bad, 112)) != 0)
            return hx_fail(c, "cannot copy %s", opt);
        if ((rc = obcomm_zoadam_load(a, bad)) != OBCOMM_E_CORRUPT ||
            obcomm_zoadam_steps(a) != 0)
            return hx_fail(c, "a zero interval loaded: %d", rc);
        if ((rc = obcomm_zoadam_load(a, opt)))
            return hx_fail(c, "load: %s", obcomm_last_error(c));
        if (obcomm_zoadam_steps(a) != SAVE_AT)
            return hx_fail(c, "loaded at step %ld", obcomm_zoadam_steps(a));
        /* The state goes out and back in unchanged (the Python package's
         * state dict does this); a zero interval is refused. */
        obcomm_zoadam_state_t st;
        const float *m, *v, *u, *x;
        obcomm_zoadam_get_state(a, &st, &m, &v, &u, &x);
        obcomm_zoadam_state_t zero = st;
        zero.var_interval = 0;
        if (obcomm_zoadam_set_state(a, &zero, m, v, u, x) != OBCOMM_E_INVAL)
            return hx_fail(c, "set_state took a zero interval");
        if (!st.frozen || (rc = obcomm_zoadam_set_state(a, &st, m, v, u, x)))
            return hx_fail(c, "set_state: %d (frozen %d)", rc, st.frozen);
        first = SAVE_AT + 1;
    }
    for (int t = first; t <= STEPS; t++) {
        grads_of(rank, t - 1, p, g);
        if ((rc = obcomm_zoadam_step(a, p, g)))
            return hx_fail(c, "step %d: %s", t, obcomm_last_error(c));
        if (!ck->resume && t == SAVE_AT) {
            if ((rc = obcomm_zoadam_save(a, opt)))
                return hx_fail(c, "save: %s", obcomm_last_error(c));
            FILE *f = fopen(par, "wb");
            if (f == NULL || fwrite(p, sizeof(p), 1, f) != 1 || fclose(f))
                return hx_fail(c, "cannot write %s", par);
        }
    }
    obcomm_zoadam_destroy(a);
    FILE *f = fopen(fin, ck->resume ? "rb" : "wb");
    if (f == NULL)
        return hx_fail(c, "cannot open %s", fin);
    int ok = ck->resume ? fread(want, sizeof(want), 1, f) == 1 &&
                              memcmp(p, want, sizeof(p)) == 0
                        : fwrite(p, sizeof(p), 1, f) == 1;
    fclose(f);
    return ok ? 0 : hx_fail(c, "the resumed run ends elsewhere");
}

START_TEST(save_and_load_continue_bit_for_bit)
{
    char dir[] = "/tmp/obcomm-zoadam-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    struct ckpt a = {.dir = dir, .resume = 0}, b = {.dir = dir, .resume = 1};
    ck_assert_int_eq(hx_run(&cl, 1, "zo-ck", 20000, 120, ckpt_trainer, &a), 0);
    /* Without a state_dir the sets are gone: the files' parts restore. */
    hx_halt(&cl, SIGKILL);
    ck_assert_int_eq(hx_restart(&cl), 0);
    ck_assert_int_eq(hx_run(&cl, 1, "zo-ck", 20000, 120, ckpt_trainer, &b), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(bad_arguments)
{
    obcomm_zoadam_config_t k = config();
    obcomm_zoadam_t *a = NULL;
    ck_assert_int_eq(obcomm_zoadam_create(NULL, 1, 1, &k, &a), OBCOMM_E_INVAL);
    k.var_update_scaler = 0;
    ck_assert_int_eq(obcomm_zoadam_create(NULL, 1, 1, &k, &a), OBCOMM_E_INVAL);
    ck_assert_int_eq(obcomm_zoadam_step(NULL, NULL, NULL), OBCOMM_E_INVAL);
    obcomm_zoadam_destroy(NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("zoadam");
    TCase *tc = tcase_create("zoadam");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, bad_arguments);
    tcase_add_test(tc, one_node_matches_reference);
    tcase_add_test(tc, two_nodes_identical_where_synchronized);
    tcase_add_test(tc, save_and_load_continue_bit_for_bit);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
