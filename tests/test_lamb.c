/* 1-bit LAMB in libobcomm (obcomm_lamb_*) against real daemons.
 *
 * Rank r minimises, layer by layer, 0.5 * w_l * |p - target_r(step)|^2
 * over four layers of different sizes and gradient weights w_l, so their
 * momenta's RMS differ and the layer scales matter. With one node every
 * collective is exact (the 1-bit average too), so a reference written out
 * here for every rank must match through the warm-up, the freeze and the
 * compression stage. With two nodes the 1-bit average is compressed, so
 * the test checks what must hold exactly: every rank holds the same bits
 * after every step.
 */
#include <check.h>

#include "ck_run.h"
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define COUNT  1001
#define LAYERS 4
#define STEPS  14
#define FREEZE 6
#define MAXR   4

static const size_t offsets[LAYERS + 1] = {0, 7, 300, 701, COUNT};
static const float weight[LAYERS] = {1.0f, 10.0f, 0.1f, 3.0f};

static float target(int rank, int step, size_t i)
{
    return sinf((float)(i % 97) * 0.37f + (float)rank * 1.3f +
                (float)step * 0.05f);
}

static size_t layer_of(size_t i)
{
    size_t l = 0;
    while (offsets[l + 1] <= i)
        l++;
    return l;
}

/* Coordinates i % 7 == 3 of the third layer see gradient 0 through the
 * warm-up: their variance stays 0, so the mask holds them (and their
 * v / v' is 1, which bounds that layer's factor from below). */
static void grads_of(int rank, int step, const float *p, float *g)
{
    for (size_t i = 0; i < COUNT; i++)
        g[i] = i % 7 == 3 && layer_of(i) == 2 && step < FREEZE
                   ? 0.0f
                   : weight[layer_of(i)] * (p[i] - target(rank, step, i));
}

struct plan {
    int nodes;
    float weight_decay, factor_threshold, factor_min, factor_max;
};

static obcomm_lamb_config_t config(const struct plan *pl)
{
    obcomm_lamb_config_t k = obcomm_lamb_defaults();
    k.lr = 0.01f;
    k.eps = 1e-6f;
    k.weight_decay = pl->weight_decay;
    k.factor_threshold = pl->factor_threshold;
    k.factor_min = pl->factor_min;
    k.factor_max = pl->factor_max;
    k.freeze_step = FREEZE;
    return k;
}

static double sq(double x)
{
    return x * x;
}

/* What the reference saw: how often each clamp decided a factor. */
struct seen {
    int threshold, bounds, blended;
    size_t masked;
};

/* The reference: `size` ranks of one node, written out layer by layer as
 * include/obcomm.h states the algorithm. After `steps` steps, rank `me`'s
 * parameters in out. */
static void reference(const struct plan *pl, int size, int me, int steps,
                      float *out, struct seen *seen)
{
    obcomm_lamb_config_t k = config(pl);
    static float p[MAXR][COUNT], m[MAXR][COUNT], g[MAXR][COUNT];
    static float v[COUNT], fresh[COUNT], avg[COUNT], prev[COUNT], up[COUNT];
    double cavg[LAYERS] = {0}, last[LAYERS], scale[LAYERS];
    memset(m, 0, sizeof(m));
    memset(v, 0, sizeof(v));
    memset(fresh, 0, sizeof(fresh));
    memset(seen, 0, sizeof(*seen));
    for (int l = 0; l < LAYERS; l++)
        last[l] = 1.0;
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < COUNT; i++)
            p[r][i] = cosf((float)i);
    float thr = 0;
    for (int t = 1; t <= steps; t++) {
        for (int r = 0; r < size; r++)
            grads_of(r, t - 1, p[r], g[r]);
        if (t <= FREEZE) {
            for (size_t i = 0; i < COUNT; i++) {
                float s = g[0][i];
                for (int r = 1; r < size; r++)
                    s += g[r][i];
                avg[i] = s / (float)size;
                for (int r = 0; r < size; r++)
                    m[r][i] = m[r][i] * k.beta1 + (1 - k.beta1) * avg[i];
                v[i] = v[i] * k.beta2 + (1 - k.beta2) * avg[i] * avg[i];
                if (t == FREEZE)
                    fresh[i] = v[i];
                up[i] = m[0][i] / (sqrtf(v[i]) + k.eps) +
                        (k.weight_decay > 0 ? k.weight_decay * p[0][i] : 0);
            }
            for (int l = 0; l < LAYERS; l++) {
                double pn = 0, un = 0;
                for (size_t i = offsets[l]; i < offsets[l + 1]; i++) {
                    pn += sq(p[0][i]);
                    un += sq(up[i]);
                }
                pn = sqrt(pn);
                un = sqrt(un);
                double c = 1.0;
                if (pn != 0 && un != 0)
                    c = fmin(fmax(pn / un, k.min_coeff), k.max_coeff);
                if (c != 1.0)
                    cavg[l] = k.coeff_beta * cavg[l] +
                              (1.0 - (double)k.coeff_beta) * c;
                float alpha = (float)(-(double)k.lr * c);
                for (int r = 0; r < size; r++)
                    for (size_t i = offsets[l]; i < offsets[l + 1]; i++)
                        p[r][i] += alpha * up[i];
            }
            if (t == FREEZE) {
                double sum = 0;
                for (size_t i = 0; i < COUNT; i++)
                    sum += v[i];
                double cut =
                    (double)OBCOMM_ADAM_AUTO_MASK_RATIO * sqrt(sum / COUNT);
                thr = (float)(cut * cut);
                for (size_t i = 0; i < COUNT; i++)
                    seen->masked += v[i] <= thr;
            }
            continue;
        }
        if (t == FREEZE + 1) {
            double rms[LAYERS], mean = 0;
            for (int l = 0; l < LAYERS; l++) {
                double s = 0;
                for (size_t i = offsets[l]; i < offsets[l + 1]; i++)
                    s += sq(m[0][i]);
                rms[l] = sqrt(s) / sqrt((double)(offsets[l + 1] - offsets[l]));
                mean += rms[l];
            }
            mean /= LAYERS;
            for (int l = 0; l < LAYERS; l++)
                scale[l] = rms[l] > 0 ? mean / rms[l] : 1.0;
        }
        for (size_t i = 0; i < COUNT; i++) {
            float s = (float)scale[layer_of(i)];
            float sum = 0;
            for (int r = 0; r < size; r++) {
                float x = (m[r][i] * k.beta1 + (1 - k.beta1) * g[r][i]) * s;
                sum = r == 0 ? x : sum + x;
            }
            prev[i] = m[0][i];
            float a = sum / (float)size / s;
            if (v[i] <= thr)
                a = 0.0f;
            for (int r = 0; r < size; r++)
                m[r][i] = a;
            float rec = (a - prev[i] * k.beta1) / (1 - k.beta1);
            fresh[i] = fresh[i] * k.beta2 + (1 - k.beta2) * rec * rec;
        }
        for (int l = 0; l < LAYERS; l++) {
            double un = 0, pre_n = 0;
            float fmx = -1.0f;
            for (size_t i = offsets[l]; i < offsets[l + 1]; i++) {
                float d = sqrtf(v[i]) + k.eps;
                float pre = m[0][i] / d;
                up[i] =
                    k.weight_decay > 0 ? pre + p[0][i] * k.weight_decay : pre;
                un += sq(up[i]);
                pre_n += sq(pre);
                fmx = fmaxf(fmx, d / (sqrtf(fresh[i]) + k.eps));
            }
            un = sqrt(un);
            double f = fmx;
            if (k.weight_decay > 0) {
                double q = un > 0 ? fmin(1.0, sqrt(pre_n) / un) : 1.0;
                f = f * q + (1.0 - q);
                seen->blended += q < 1.0;
            }
            double b = fmin(fmax(f, k.factor_min), k.factor_max);
            seen->bounds += b != f;
            double lo = last[l] * (1.0 - (double)k.factor_threshold);
            double hi = last[l] * (1.0 + (double)k.factor_threshold);
            f = fmin(fmax(b, lo), hi);
            seen->threshold += f != b;
            last[l] = f;
            float alpha = (float)(-(double)k.lr * cavg[l] * f);
            for (int r = 0; r < size; r++)
                for (size_t i = offsets[l]; i < offsets[l + 1]; i++)
                    p[r][i] += alpha * up[i];
        }
    }
    memcpy(out, p[me], sizeof(p[me]));
}

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

/* The reference's tolerance, relative to the largest parameter. The
 * reference repeats the optimizer's float operations in the same order,
 * so it matches bit for bit with this compiler; the tolerance leaves room
 * for a compiler that contracts a * b + c into an FMA in one of the two
 * translation units and not the other, which moves a parameter by an ulp
 * or so per step (1e-6 is ~10 ulp of float, 14 steps of lr 0.01). A
 * mutation of the algorithm moves them by far more: without the
 * threshold clamp they are 2.7e-4 apart at the first compressed step. */
#define REL_TOL 1e-6

static int trainer(obcomm_t *c, void *arg)
{
    const struct plan *pl = arg;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    obcomm_lamb_config_t k = config(pl);
    obcomm_lamb_t *a;
    int rc = obcomm_lamb_create(c, 5, COUNT, LAYERS, offsets, &k, &a);
    if (rc)
        return hx_fail(c, "create: %s", obcomm_strerror(rc));
    static float p[COUNT], g[COUNT], want[COUNT];
    float *tmp; /* the check's collectives take shared memory */
    if (obcomm_alloc(c, sizeof(p), (void **)&tmp))
        return hx_fail(c, "alloc");
    for (size_t i = 0; i < COUNT; i++)
        p[i] = cosf((float)i);
    for (int t = 1; t <= STEPS; t++) {
        grads_of(rank, t - 1, p, g);
        if ((rc = obcomm_lamb_step(a, p, g)))
            return hx_fail(c, "step %d: %s", t, obcomm_last_error(c));
        int d = differ(c, p, tmp);
        if (d < 0)
            return 1;
        if (d)
            return hx_fail(c, "step %d: ranks differ", t);
        if (pl->nodes > 1)
            continue;
        struct seen seen;
        reference(pl, size, rank, t, want, &seen);
        double worst = 0, big = 0;
        for (size_t i = 0; i < COUNT; i++) {
            worst = fmax(worst, fabs((double)p[i] - want[i]));
            big = fmax(big, fabs((double)want[i]));
        }
        if (!(worst <= REL_TOL * big))
            return hx_fail(c, "step %d: %g from the reference (of %g)", t,
                           worst, big);
        if (t == STEPS && rank == 0)
            printf("lamb wd %g threshold %g: %g from the reference; "
                   "clamps: threshold %d, bounds %d, blended %d; masked %zu\n",
                   (double)pl->weight_decay, (double)pl->factor_threshold,
                   worst, seen.threshold, seen.bounds, seen.blended,
                   seen.masked);
        /* The plan's clamps must have decided factors, else the test
         * would not see them. */
        if (t == STEPS && pl->factor_threshold < 0.01f && seen.threshold == 0)
            return hx_fail(c, "the threshold clamp never bound");
        if (t == STEPS && pl->weight_decay > 0 && seen.blended == 0)
            return hx_fail(c, "the weight decay never blended a factor");
        if (t == STEPS && pl->factor_max < 4.0f && seen.bounds < 4)
            return hx_fail(c, "the bounds decided %d factors", seen.bounds);
        /* No mask in the warm-up; from the freeze on, the reference's. */
        if (obcomm_lamb_masked(a) != (t >= FREEZE ? seen.masked : 0))
            return hx_fail(c, "step %d: masked %zu, the reference %zu", t,
                           obcomm_lamb_masked(a), seen.masked);
    }
    if (obcomm_lamb_masked(a) < (offsets[3] - offsets[2]) / 7)
        return hx_fail(c, "masked %zu", obcomm_lamb_masked(a));
    long f32, ob;
    obcomm_lamb_rounds(a, &f32, &ob);
    if (f32 != FREEZE || ob != STEPS - FREEZE)
        return hx_fail(c, "rounds %ld + %ld", f32, ob);
    if (obcomm_lamb_steps(a) != STEPS)
        return hx_fail(c, "steps %ld", obcomm_lamb_steps(a));
    obcomm_lamb_destroy(a);
    obcomm_free(c, tmp);
    return 0;
}

START_TEST(one_node_matches_reference)
{
    /* A threshold so small that it decides most factors, with weight
     * decay; then none, without, and bounds that decide factors (the frozen
     * v over v' stays near 1 in a few steps). */
    struct plan plans[] = {{1, 0.01f, 0.0003f, 0.5f, 4.0f},
                           {1, 0.0f, 10.0f, 0.999f, 1.0001f}};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(
            hx_run(&cl, 3, "lamb-ref", 20000, 120, trainer, &plans[i]), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

START_TEST(two_nodes_identical)
{
    struct plan pl = {2, 0.01f, 0.0003f, 0.5f, 4.0f};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    ck_assert_int_eq(hx_run(&cl, 2, "lamb-two", 20000, 120, trainer, &pl), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* A checkpoint: run A saves the optimizer and the parameters after step
 * SAVE_AT (in the compression stage, the scales fixed) and writes its
 * final parameters; run B, after the daemons were killed and restarted,
 * loads both and must end with the same bits. */
#define SAVE_AT 9

struct ckpt {
    const char *dir;
    int resume;
};

/* Offsets into the file (include/obcomm.h): the third layer's scale, the
 * second layer offset, the step. */
#define AT_SCALE2  (144 + 8 * (LAYERS + 1) + 8 * (2 * LAYERS + 2))
#define AT_OFFSET1 (144 + 8)
#define AT_STEP    32

static int ckpt_trainer(obcomm_t *c, void *arg)
{
    const struct ckpt *ck = arg;
    int rank = obcomm_rank(c);
    char opt[512], par[512], fin[512], bad[512];
    snprintf(opt, sizeof(opt), "%s/opt.%d", ck->dir, rank);
    snprintf(bad, sizeof(bad), "%s/bad.%d", ck->dir, rank);
    snprintf(par, sizeof(par), "%s/params.%d", ck->dir, rank);
    snprintf(fin, sizeof(fin), "%s/final.%d", ck->dir, rank);
    struct plan pl = {2, 0.01f, 0.0003f, 0.5f, 4.0f};
    obcomm_lamb_config_t k = config(&pl);
    obcomm_lamb_t *a;
    int rc = obcomm_lamb_create(c, 5, COUNT, LAYERS, offsets, &k, &a);
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
        /* Damaged copies are refused before any collective, and the
         * optimizer stays as it was. */
        const long at[] = {AT_SCALE2, AT_OFFSET1, AT_STEP};
        for (int i = 0; i < 3; i++) {
            if (hx_damaged_copy(opt, bad, at[i]) != 0)
                return hx_fail(c, "cannot copy %s", opt);
            if ((rc = obcomm_lamb_load(a, bad)) != OBCOMM_E_CORRUPT ||
                obcomm_lamb_steps(a) != 0)
                return hx_fail(c, "damaged at %ld: %d", at[i], rc);
        }
        if ((rc = obcomm_lamb_load(a, opt)))
            return hx_fail(c, "load: %s", obcomm_last_error(c));
        if (obcomm_lamb_steps(a) != SAVE_AT)
            return hx_fail(c, "loaded at step %ld", obcomm_lamb_steps(a));
        /* The state goes out and back in unchanged (the Python package's
         * state dict does this); a stage that does not fit the step is
         * refused. */
        obcomm_lamb_state_t st;
        const float *m, *v, *fresh;
        const double *cf, *fac, *sc;
        obcomm_lamb_get_state(a, &st, &m, &v, &fresh, &cf, &fac, &sc);
        obcomm_lamb_state_t warm = st;
        warm.stage = 0;
        if (obcomm_lamb_set_state(a, &warm, m, v, fresh, cf, fac, sc) !=
            OBCOMM_E_INVAL)
            return hx_fail(c, "set_state took a warm-up at step %ld", st.step);
        if ((rc = obcomm_lamb_set_state(a, &st, m, v, fresh, cf, fac, sc)))
            return hx_fail(c, "set_state: %d", rc);
        first = SAVE_AT + 1;
    }
    for (int t = first; t <= STEPS; t++) {
        grads_of(rank, t - 1, p, g);
        if ((rc = obcomm_lamb_step(a, p, g)))
            return hx_fail(c, "step %d: %s", t, obcomm_last_error(c));
        if (!ck->resume && t == SAVE_AT) {
            if ((rc = obcomm_lamb_save(a, opt)))
                return hx_fail(c, "save: %s", obcomm_last_error(c));
            FILE *f = fopen(par, "wb");
            if (f == NULL || fwrite(p, sizeof(p), 1, f) != 1 || fclose(f))
                return hx_fail(c, "cannot write %s", par);
        }
    }
    long f32, ob;
    obcomm_lamb_rounds(a, &f32, &ob);
    if (f32 != FREEZE || ob != STEPS - FREEZE)
        return hx_fail(c, "rounds %ld + %ld", f32, ob);
    obcomm_lamb_destroy(a);
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
    char dir[] = "/tmp/obcomm-lamb-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    struct ckpt a = {.dir = dir, .resume = 0}, b = {.dir = dir, .resume = 1};
    ck_assert_int_eq(hx_run(&cl, 1, "lamb-ck", 20000, 120, ckpt_trainer, &a),
                     0);
    /* Without a state_dir the sets are gone: the files' parts restore. */
    hx_halt(&cl, SIGKILL);
    ck_assert_int_eq(hx_restart(&cl), 0);
    ck_assert_int_eq(hx_run(&cl, 1, "lamb-ck", 20000, 120, ckpt_trainer, &b),
                     0);
    ck_assert_int_eq(hx_stop(&cl), 0);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* Every way create refuses its arguments, on a real connection. */
static int args_trainer(obcomm_t *c, void *arg)
{
    (void)arg;
    struct plan pl = {1, 0.0f, 0.1f, 0.5f, 4.0f};
    obcomm_lamb_config_t k = config(&pl);
    obcomm_lamb_t *a = NULL;
    const size_t bad_first[] = {1, 5, 10}, bad_last[] = {0, 5, 9},
                 flat[] = {0, 5, 5, 10}, good[] = {0, 5, 10};
    struct {
        size_t count, n;
        const size_t *off;
    } bad[] = {{10, 2, bad_first}, {10, 2, bad_last}, {10, 3, flat},
               {10, 0, good},      {10, 2, NULL},     {0, 2, good}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (obcomm_lamb_create(c, 1, bad[i].count, bad[i].n, bad[i].off, &k,
                               &a) != OBCOMM_E_INVAL ||
            a != NULL)
            return hx_fail(c, "layers %zu accepted", i);
    obcomm_lamb_config_t w = k;
    w.min_coeff = 20.0f; /* above max_coeff */
    if (obcomm_lamb_create(c, 1, 10, 2, good, &w, &a) != OBCOMM_E_INVAL)
        return hx_fail(c, "min_coeff > max_coeff accepted");
    w = k;
    w.factor_min = 0.0f;
    if (obcomm_lamb_create(c, 1, 10, 2, good, &w, &a) != OBCOMM_E_INVAL)
        return hx_fail(c, "factor_min 0 accepted");
    w = k;
    w.factor_threshold = NAN;
    if (obcomm_lamb_create(c, 1, 10, 2, good, &w, &a) != OBCOMM_E_INVAL)
        return hx_fail(c, "factor_threshold NaN accepted");
    if (obcomm_lamb_create(c, 1, 10, 2, good, &k, &a) != 0 || a == NULL)
        return hx_fail(c, "good layers refused");
    float p[10] = {0};
    if (obcomm_lamb_step(a, NULL, p) != OBCOMM_E_INVAL ||
        obcomm_lamb_step(a, p, NULL) != OBCOMM_E_INVAL ||
        obcomm_lamb_save(a, NULL) != OBCOMM_E_INVAL ||
        obcomm_lamb_load(a, "/nonexistent/lamb") != OBCOMM_E_IO ||
        obcomm_lamb_steps(a) != 0 || obcomm_lamb_masked(a) != 0)
        return hx_fail(c, "bad step, save or load arguments accepted");
    obcomm_lamb_destroy(a);
    return 0;
}

START_TEST(bad_arguments)
{
    obcomm_lamb_config_t k = obcomm_lamb_defaults();
    const size_t off[] = {0, 1};
    obcomm_lamb_t *a = NULL;
    ck_assert_int_eq(obcomm_lamb_create(NULL, 1, 1, 1, off, &k, &a),
                     OBCOMM_E_INVAL);
    ck_assert_int_eq(obcomm_lamb_step(NULL, NULL, NULL), OBCOMM_E_INVAL);
    ck_assert_int_eq(obcomm_lamb_steps(NULL), 0);
    obcomm_lamb_destroy(NULL);
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    ck_assert_int_eq(hx_run(&cl, 1, "lamb-args", 20000, 60, args_trainer, NULL),
                     0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("lamb");
    TCase *tc = tcase_create("lamb");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, bad_arguments);
    tcase_add_test(tc, one_node_matches_reference);
    tcase_add_test(tc, two_nodes_identical);
    tcase_add_test(tc, save_and_load_continue_bit_for_bit);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
