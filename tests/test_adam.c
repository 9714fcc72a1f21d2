/* 1-bit Adam in libobcomm against real daemons.
 *
 * The problem: every rank r minimises 0.5 * |p - target_r(step)|^2, so its
 * gradient p - target depends on the parameters, as in real training.
 * With one node every collective is exact, so a naive reference of
 * docs/design.md, "The idea" (written here), must match bit for bit:
 * warm-up steps are plain Adam on the averaged gradient; from freeze_step
 * on each rank updates its momentum with its own gradient, the momenta are
 * averaged, and v stays frozen. With several nodes the momentum is
 * compressed, so the test checks what must hold exactly: every rank holds
 * bitwise the same parameters after every step, and a save/load continues
 * bit for bit.
 *
 * The momentum mask (obcomm_adam_set_mask, _set_auto_mask) is part of the
 * reference: in the "dead" variant of the problem every fifth coordinate
 * has gradient 0 through the warm-up (v freezes at 0), and the reference
 * zeroes the averaged momentum of exactly the coordinates the documented
 * rule names, so the one-node runs stay bit-exact with every mask setting.
 */
#include <check.h>

#include "ck_run.h"
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "half.h"
#include "harness.h"

#define COUNT 1001

static float target(int rank, int step, size_t i)
{
    return sinf((float)(i % 97) * 0.37f + (float)rank * 1.3f +
                (float)step * 0.05f);
}

static void init_params(float *p)
{
    for (size_t i = 0; i < COUNT; i++)
        p[i] = cosf((float)i);
}

/* How a run masks the momentum. */
enum mask_kind {
    MASK_DEFAULT,  /* the automatic mask, default ratio */
    MASK_RATIO_0,  /* automatic, ratio 0: only v == 0 */
    MASK_OFF,      /* the ablation: no mask */
    MASK_EXPLICIT, /* obcomm_adam_set_mask(keep_of) */
};

static int keep_of(size_t i)
{
    return i % 3 != 1;
}

/* dead: coordinates i % 5 == 0 see gradient 0 before the freeze. */
static void grads_of(int rank, int step, const float *p, float *g, int dead,
                     long freeze)
{
    for (size_t i = 0; i < COUNT; i++)
        g[i] = dead && i % 5 == 0 && step < freeze
                   ? 0.0f
                   : p[i] - target(rank, step, i);
}

/* The documented mask rule over the frozen v (include/obcomm.h): masked
 * when v_i <= (float)((double)ratio * sqrt(mean v))^2, the mean summed in
 * double in index order. */
static void mask_of(enum mask_kind kind, const float *v, uint8_t *masked)
{
    double sum = 0;
    for (size_t i = 0; i < COUNT; i++)
        sum += (double)v[i];
    float ratio = kind == MASK_RATIO_0 ? 0.0f : OBCOMM_ADAM_AUTO_MASK_RATIO;
    double r = (double)ratio * sqrt(sum / COUNT);
    float thr = (float)(r * r);
    for (size_t i = 0; i < COUNT; i++) {
        switch (kind) {
        case MASK_OFF:
            masked[i] = 0;
            break;
        case MASK_EXPLICIT:
            masked[i] = !keep_of(i);
            break;
        default:
            masked[i] = v[i] <= thr;
        }
    }
}

static obcomm_adam_config_t config(long freeze, int bias)
{
    obcomm_adam_config_t k = obcomm_adam_defaults();
    k.lr = 0.01f;
    k.weight_decay = 0.001f;
    k.freeze_step = freeze;
    k.bias_correction = bias;
    return k;
}

/* Mixed precision and clipping (obcomm_adam_start_ex, _finish_ex): the
 * model's parameters and its gradients in `dt`, fp32 masters inside the
 * optimizer; the gradient clipped to norm `clip` as DeepSpeed does it:
 * the average in the warm-up, each rank's own gradient in the
 * compression stage, by max_norm / (norm + 1e-6) when that is below 1. */
struct mixed {
    obcomm_dtype_t dt;
    float clip;       /* 0: no clipping */
    float warm_scale; /* 0: none; else start's scale in the warm-up (each
                         rank's gradient times it before the average) */
};

/* x rounded to dt (nearest even) and back: what a dt tensor holds. */
static float round_to(obcomm_dtype_t dt, float x)
{
    if (dt == OBCOMM_FLOAT16)
        return obcomm_f16_to_f32(obcomm_f32_to_f16(x));
    if (dt == OBCOMM_BFLOAT16)
        return obcomm_bf16_to_f32(obcomm_f32_to_bf16(x));
    return x;
}

/* The factor a gradient of sum of squares `sumsq` is multiplied by. */
static float clip_coef(double sumsq, float max_norm)
{
    if (max_norm <= 0.0f)
        return 1.0f;
    double c = (double)max_norm / (sqrt(sumsq) + 1e-6);
    return c < 1.0 ? (float)c : 1.0f;
}

static double sumsq_of(const float *g, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * (double)g[i];
    return s;
}

/* The reference: `size` ranks on one node, all exact. */
static void reference(int size, long freeze, int bias, int steps, int dead,
                      enum mask_kind mk, int remask_step, enum mask_kind remask,
                      const struct mixed *mx, float *p_out, size_t *masked_out)
{
    static const struct mixed plain = {.dt = OBCOMM_FLOAT32};
    if (mx == NULL)
        mx = &plain;
    float *pm = malloc(COUNT * sizeof(float)),
          *avg = malloc(COUNT * sizeof(float));
    uint8_t masked[COUNT];
    memset(masked, 0, sizeof(masked));
    obcomm_adam_config_t k = config(freeze, bias);
    float *p = calloc(COUNT, sizeof(float)), *m = calloc(COUNT, sizeof(float));
    float *v = calloc(COUNT, sizeof(float));
    float *g = malloc((size_t)size * COUNT * sizeof(float));
    init_params(p);
    for (int st = 0; st < steps; st++) {
        /* The model holds p rounded to dt; its gradients are dt too. */
        for (size_t i = 0; i < COUNT; i++)
            pm[i] = round_to(mx->dt, p[i]);
        for (int r = 0; r < size; r++) {
            float *gr = g + (size_t)r * COUNT;
            grads_of(r, st, pm, gr, dead, freeze);
            for (size_t i = 0; i < COUNT; i++)
                gr[i] = round_to(mx->dt, gr[i]);
            float cf = st >= freeze
                           ? /* the local gradient, clipped */
                           clip_coef(sumsq_of(gr, COUNT), mx->clip)
                           : mx->warm_scale > 0 ? mx->warm_scale : 1.0f;
            for (size_t i = 0; cf != 1.0f && i < COUNT; i++)
                gr[i] = gr[i] * cf;
        }
        if (st < freeze) { /* the average, clipped */
            for (size_t i = 0; i < COUNT; i++) {
                float a = g[i];
                for (int r = 1; r < size; r++)
                    a += g[(size_t)r * COUNT + i];
                avg[i] = a / (float)size;
            }
            float cf = clip_coef(sumsq_of(avg, COUNT), mx->clip);
            for (size_t i = 0; cf != 1.0f && i < COUNT; i++)
                avg[i] = avg[i] * cf;
        }
        if (st == freeze)
            mask_of(mk, v, masked);
        if (remask_step > 0 && st == remask_step && st >= freeze)
            mask_of(remask, v, masked);
        /* The bias corrections, 1 without; vc stays that of freeze_step
         * once v is frozen. */
        float mc = 1.0f, vc = 1.0f;
        if (bias) {
            long tv = st < freeze ? st + 1 : freeze;
            mc = 1.0f / (1.0f - powf(k.beta1, (float)(st + 1)));
            vc = tv > 0 ? 1.0f / (1.0f - powf(k.beta2, (float)tv)) : 1.0f;
        }
        for (size_t i = 0; i < COUNT; i++) {
            if (st < freeze) {
                float a = avg[i];
                m[i] = k.beta1 * m[i] + (1.0f - k.beta1) * a;
                v[i] = k.beta2 * v[i] + (1.0f - k.beta2) * a * a;
            } else {
                float a = 0;
                for (int r = 0; r < size; r++) {
                    float mr = k.beta1 * m[i] +
                               (1.0f - k.beta1) * g[(size_t)r * COUNT + i];
                    a = r ? a + mr : mr;
                }
                m[i] = masked[i] ? 0.0f : a / (float)size;
            }
            /* The warm-up divides by sqrt(v*vc) + eps, the compression
             * stage multiplies by the rounded reciprocal of the frozen one
             * (docs/design.md, "The idea"). */
            float den = sqrtf(v[i] * vc) + k.eps;
            float um =
                st < freeze ? (m[i] * mc) / den : (m[i] * mc) * (1.0f / den);
            float u = um + k.weight_decay * p[i];
            p[i] -= k.lr * u;
        }
    }
    memcpy(p_out, p, COUNT * sizeof(float));
    *masked_out = 0;
    for (size_t i = 0; i < COUNT; i++)
        *masked_out += masked[i];
    free(p);
    free(m);
    free(v);
    free(g);
    free(pm);
    free(avg);
}

struct plan {
    long freeze;
    int steps;
    const char *save; /* save after `steps` steps (NULL: no) */
    const char *load; /* load before stepping (NULL: no) */
    int first_step;   /* step number of the first step (after a load) */
    const char *params_in, *params_out; /* files of rank 0's parameters */
    int compare_reference;              /* one node: bit-exact reference */
    int dead;                           /* see grads_of */
    enum mask_kind mask;
    int check_masked; /* obcomm_adam_masked at the end must be: */
    size_t want_masked;
    int expect_blowup; /* some |p_i| ends above 1e6 or not finite (a 1-bit
                        * op may fail with OBCOMM_E_NONFINITE on the way) */
    int split; /* two optimizers (keys 11, 12) over the two halves, stepped
                  with start, start, finish (second), finish (first) */
    int bias;  /* bias_correction */
    int remask_step; /* before this step (> 0) the mask becomes `remask` */
    enum mask_kind remask;
    struct mixed mx; /* stepped with start_ex/finish_ex when set */
    int inplace;     /* fp32 gradients in shared memory, start_inplace */
    int threads;     /* obcomm_adam_set_threads (0: left at 1) */
};

static float model_f32(obcomm_dtype_t dt, const uint16_t *h, size_t i)
{
    return dt == OBCOMM_FLOAT16 ? obcomm_f16_to_f32(h[i])
                                : obcomm_bf16_to_f32(h[i]);
}

/* One step of the mixed plan: the model's dt parameters ph (as fp32 in
 * pm) give the gradients, which travel as dt; fp32 masters p. */
static int same_everywhere(obcomm_t *c, const float *p, float *tmp);

static int mixed_step(obcomm_t *c, obcomm_adam_t *a, const struct plan *pl,
                      int st, float *p, float *pm, uint16_t *ph, float *g,
                      uint16_t *gh, float *gs, float *tmp)
{
    obcomm_dtype_t dt = pl->mx.dt;
    int rank = obcomm_rank(c);
    grads_of(rank, st, dt == OBCOMM_FLOAT32 ? p : pm, g, pl->dead, pl->freeze);
    for (size_t i = 0; i < COUNT; i++) {
        gh[i] = dt == OBCOMM_FLOAT16 ? obcomm_f32_to_f16(g[i])
                                     : obcomm_f32_to_bf16(g[i]);
        if (dt != OBCOMM_FLOAT32)
            g[i] = model_f32(dt, gh, i);
    }
    float local = 1.0f, avg = 1.0f;
    if (st >= pl->freeze)
        local = clip_coef(sumsq_of(g, COUNT), pl->mx.clip);
    else if (pl->mx.warm_scale > 0)
        local = pl->mx.warm_scale;
    int rc;
    if (pl->inplace) {
        memcpy(gs, g, COUNT * sizeof(float));
        rc = obcomm_adam_start_inplace(a, gs, local);
    } else {
        rc = obcomm_adam_start_ex(a, dt == OBCOMM_FLOAT32 ? (void *)g : gh, dt,
                                  local);
    }
    if (rc)
        return rc;
    if (st < pl->freeze && pl->mx.clip > 0) {
        double sq;
        if ((rc = obcomm_adam_wait(a)) != 0 ||
            (rc = obcomm_adam_grad_sumsq(a, &sq)) != 0)
            return rc;
        avg = clip_coef(sq, pl->mx.clip);
    } else if (obcomm_adam_grad_sumsq(a, &(double){0}) != OBCOMM_E_INVAL) {
        return hx_fail(c, "grad_sumsq before the wait or past the freeze");
    }
    rc = obcomm_adam_finish_ex(a, p, dt == OBCOMM_FLOAT32 ? NULL : ph, dt, avg);
    for (size_t i = 0; rc == 0 && dt != OBCOMM_FLOAT32 && i < COUNT; i++)
        pm[i] = model_f32(dt, ph, i);
    /* In place, a warm-up step leaves the average in the buffer (the same
     * on every rank); the compression stage only reads it. */
    if (rc == 0 && pl->inplace && st < pl->freeze)
        return same_everywhere(c, gs, tmp);
    for (size_t i = 0; rc == 0 && pl->inplace && i < COUNT; i++)
        if (memcmp(&gs[i], &g[i], sizeof(float)))
            return hx_fail(c, "start_inplace wrote the gradient at step %d",
                           st);
    return rc;
}

#define HALF (COUNT / 2)

/* One step of the split plan: both halves' collectives in flight at once,
 * finished in the reverse order. Also checks that a second start and a
 * save of a started optimizer are refused. */
static int split_step(obcomm_t *c, obcomm_adam_t *a, obcomm_adam_t *b, float *p,
                      const float *g)
{
    int rc = obcomm_adam_start(a, g);
    if (rc == 0)
        rc = obcomm_adam_start(b, g + HALF);
    if (rc)
        return rc;
    if (obcomm_adam_start(a, g) != OBCOMM_E_INVAL ||
        obcomm_adam_save(b, "/nonexistent/x") != OBCOMM_E_INVAL)
        return hx_fail(c, "a started optimizer took another start or a save");
    if ((rc = obcomm_adam_finish(b, p + HALF)) != 0)
        return rc;
    return obcomm_adam_finish(a, p);
}

static int same_everywhere(obcomm_t *c, const float *p, float *tmp)
{
    for (int op = 0; op < 2; op++) {
        memcpy(tmp, p, COUNT * sizeof(float));
        if (obcomm_allreduce(c, tmp, COUNT, OBCOMM_FLOAT32,
                             op ? OBCOMM_MIN : OBCOMM_MAX))
            return hx_fail(c, "check: %s", obcomm_last_error(c));
        if (memcmp(tmp, p, COUNT * sizeof(float)))
            return hx_fail(c, "parameters differ between ranks");
    }
    return 0;
}

/* A mask changed in the middle of the compression stage (a plan's
 * remask): the optimizer's frozen factors must follow it. */
static int set_mask_kind(obcomm_adam_t *a, enum mask_kind kind)
{
    uint8_t keep[COUNT];
    switch (kind) {
    case MASK_EXPLICIT:
        for (size_t i = 0; i < COUNT; i++)
            keep[i] = (uint8_t)keep_of(i);
        return obcomm_adam_set_mask(a, keep);
    case MASK_OFF:
        obcomm_adam_set_auto_mask(a, -1.0f);
        break;
    case MASK_RATIO_0:
        obcomm_adam_set_auto_mask(a, 0.0f);
        break;
    default:
        obcomm_adam_set_auto_mask(a, OBCOMM_ADAM_AUTO_MASK_RATIO);
    }
    return obcomm_adam_set_mask(a, NULL);
}

static int trainer_adam(obcomm_t *c, void *arg)
{
    const struct plan *pl = arg;
    int rank = obcomm_rank(c);
    float p[COUNT], g[COUNT], pm[COUNT], *tmp, *gs = NULL;
    uint16_t ph[COUNT], gh[COUNT];
    int mixed = pl->mx.dt != OBCOMM_FLOAT32 || pl->mx.clip > 0 ||
                pl->mx.warm_scale > 0 || pl->inplace;
    if (obcomm_alloc(c, COUNT * sizeof(float), (void **)&tmp) ||
        (pl->inplace && obcomm_alloc(c, COUNT * sizeof(float), (void **)&gs)))
        return hx_fail(c, "alloc");
    init_params(p);
    for (size_t i = 0; i < COUNT; i++) {
        ph[i] = pl->mx.dt == OBCOMM_FLOAT16 ? obcomm_f32_to_f16(p[i])
                                            : obcomm_f32_to_bf16(p[i]);
        pm[i] = round_to(pl->mx.dt, p[i]);
    }
    if (pl->params_in) {
        FILE *f = fopen(pl->params_in, "rb");
        if (!f || fread(p, sizeof(float), COUNT, f) != COUNT)
            return hx_fail(c, "cannot read %s", pl->params_in);
        fclose(f);
    }

    obcomm_adam_config_t k = config(pl->freeze, pl->bias);
    obcomm_adam_t *a, *b = NULL;
    int rc = obcomm_adam_create(c, 11, pl->split ? HALF : COUNT, &k, &a);
    if (rc == 0 && pl->split)
        rc = obcomm_adam_create(c, 12, COUNT - HALF, &k, &b);
    if (rc)
        return hx_fail(c, "create: %s", obcomm_strerror(rc));
    if (pl->threads && (rc = obcomm_adam_set_threads(a, pl->threads)) != 0)
        return hx_fail(c, "set_threads: %s", obcomm_strerror(rc));
    if (obcomm_adam_set_threads(a, 0) != OBCOMM_E_INVAL ||
        obcomm_adam_set_threads(a, OBCOMM_ADAM_MAX_THREADS + 1) !=
            OBCOMM_E_INVAL)
        return hx_fail(c, "set_threads took 0 or too many threads");
    /* In place wants the connection's shared memory. */
    if (pl->inplace && obcomm_adam_start_inplace(a, g, 1.0f) != OBCOMM_E_INVAL)
        return hx_fail(c, "start_inplace took private memory");
    if (pl->mask == MASK_RATIO_0 && b)
        obcomm_adam_set_auto_mask(b, 0.0f);
    if (pl->mask == MASK_RATIO_0)
        obcomm_adam_set_auto_mask(a, 0.0f);
    if (pl->mask == MASK_OFF)
        obcomm_adam_set_auto_mask(a, -1.0f);
    if (pl->mask == MASK_EXPLICIT) {
        uint8_t keep[COUNT];
        for (size_t i = 0; i < COUNT; i++)
            keep[i] = (uint8_t)keep_of(i);
        if ((rc = obcomm_adam_set_mask(a, keep)) != 0)
            return hx_fail(c, "set_mask: %s", obcomm_strerror(rc));
    }
    if (pl->load && (rc = obcomm_adam_load(a, pl->load)) != 0)
        return hx_fail(c, "load: %s", obcomm_strerror(rc));
    if (obcomm_adam_steps(a) != pl->first_step)
        return hx_fail(c, "optimizer at step %ld, want %d",
                       obcomm_adam_steps(a), pl->first_step);

    for (int st = pl->first_step; st < pl->first_step + pl->steps; st++) {
        if (pl->remask_step > 0 && st == pl->remask_step &&
            (rc = set_mask_kind(a, pl->remask)) != 0)
            return hx_fail(c, "set_mask: %s", obcomm_strerror(rc));
        if (mixed) {
            rc = mixed_step(c, a, pl, st, p, pm, ph, g, gh, gs, tmp);
        } else {
            grads_of(rank, st, p, g, pl->dead, pl->freeze);
            rc = b ? split_step(c, a, b, p, g) : obcomm_adam_step(a, p, g);
        }
        if (rc == OBCOMM_E_NONFINITE && pl->expect_blowup) {
            obcomm_adam_destroy(a);
            return 0;
        }
        if (rc != 0)
            return hx_fail(c, "step %d: %s", st, obcomm_last_error(c));
        if (same_everywhere(c, p, tmp))
            return 1;
    }
    if (pl->save && (rc = obcomm_adam_save(a, pl->save)) != 0)
        return hx_fail(c, "save: %s", obcomm_last_error(c));
    if (pl->expect_blowup) {
        obcomm_adam_destroy(a);
        for (size_t i = 0; i < COUNT; i++)
            if (!(fabsf(p[i]) <= 1e6f))
                return 0;
        return hx_fail(c, "no parameter blew up");
    }
    size_t nm = obcomm_adam_masked(a) + (b ? obcomm_adam_masked(b) : 0);
    obcomm_adam_destroy(b);
    if (pl->check_masked && nm != pl->want_masked)
        return hx_fail(c, "%zu coordinates masked, want %zu", nm,
                       pl->want_masked);
    obcomm_adam_destroy(a);

    if (rank == 0 && pl->compare_reference) {
        float want[COUNT];
        size_t want_masked;
        reference(obcomm_size(c), pl->freeze, pl->bias, pl->steps, pl->dead,
                  pl->mask, pl->remask_step, pl->remask, &pl->mx, want,
                  &want_masked);
        if (memcmp(want, p, sizeof(want)))
            return hx_fail(c, "parameters differ from the reference");
        for (size_t i = 0; pl->mx.dt != OBCOMM_FLOAT32 && i < COUNT; i++)
            if (model_f32(pl->mx.dt, ph, i) != round_to(pl->mx.dt, want[i]))
                return hx_fail(c,
                               "model parameter %zu is not the master's "
                               "rounding",
                               i);
        if (pl->freeze < pl->steps && nm != want_masked)
            return hx_fail(c, "%zu coordinates masked, the reference %zu", nm,
                           want_masked);
    }
    if (rank == 0 && pl->params_out) {
        FILE *f = fopen(pl->params_out, "wb");
        if (!f || fwrite(p, sizeof(float), COUNT, f) != COUNT)
            return hx_fail(c, "cannot write %s", pl->params_out);
        fclose(f);
    }
    return 0;
}

/* One node, 1 and 3 trainers: bit-exact against the reference, for a run
 * that is all warm-up, one that switches at step 7, and one that
 * compresses from the start, each without and with bias correction. The
 * daemon's counters show the stage switch at exactly freeze_step: 1-bit
 * ops = steps - freeze_step. */
START_TEST(one_node_matches_reference)
{
    static const long freezes[] = {100, 7, 0};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    long long before = 0;
    for (int ls = 1; ls <= 3; ls += 2)
        for (int f = 0; f < 6; f++) {
            struct plan pl = {.freeze = freezes[f % 3],
                              .steps = 20,
                              .compare_reference = 1,
                              .bias = f / 3};
            char job[32];
            snprintf(job, sizeof(job), "ref-%d-%d", ls, f);
            ck_assert_int_eq(
                hx_run(&cl, ls, job, 20000, 120, trainer_adam, &pl), 0);
            long long ops = hx_metric(&cl, 0, "onebit_ops");
            long want = freezes[f % 3] >= 20 ? 0 : 20 - freezes[f % 3];
            ck_assert_int_eq(ops - before, want);
            before = ops;
        }
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* The momentum mask, one node (1 and 3 trainers), freeze at 7 of 20:
 * bit-exact against the reference with the default automatic mask and
 * with ratio 0 on the "dead" problem (ratio 0 masks exactly its 201
 * coordinates i % 5 == 0, whose v froze at 0), with the mask off and with
 * an explicit mask (its 334 coordinates i % 3 == 1), and with a mask that
 * changes at step 12, in the compression stage (the optimizer's frozen
 * factors hold the mask and must follow). The ablation: with
 * the mask off, the dead coordinates move by lr * m / eps = 1e6 * m per
 * step and blow up (|p| > 1e6 or not finite; the parameters of the other
 * runs stay O(1)). */
START_TEST(one_node_masks)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    const struct plan plans[] = {
        {.dead = 1, .mask = MASK_DEFAULT},
        {.dead = 1,
         .mask = MASK_RATIO_0,
         .check_masked = 1,
         .want_masked = 201},
        {.dead = 0, .mask = MASK_OFF, .check_masked = 1, .want_masked = 0},
        {.dead = 0,
         .mask = MASK_EXPLICIT,
         .check_masked = 1,
         .want_masked = 334},
        {.dead = 0,
         .mask = MASK_DEFAULT,
         .bias = 1,
         .remask_step = 12,
         .remask = MASK_EXPLICIT,
         .check_masked = 1,
         .want_masked = 334},
        {.dead = 0,
         .mask = MASK_EXPLICIT,
         .remask_step = 12,
         .remask = MASK_OFF,
         .check_masked = 1,
         .want_masked = 0},
    };
    for (int ls = 1; ls <= 3; ls += 2)
        for (size_t k = 0; k < sizeof(plans) / sizeof(plans[0]); k++) {
            struct plan pl = plans[k];
            pl.freeze = 7;
            pl.steps = 20;
            pl.compare_reference = 1;
            char job[32];
            snprintf(job, sizeof(job), "mask-%d-%zu", ls, k);
            ck_assert_int_eq(
                hx_run(&cl, ls, job, 20000, 120, trainer_adam, &pl), 0);
        }
    struct plan off = {.freeze = 7,
                       .steps = 20,
                       .dead = 1,
                       .mask = MASK_OFF,
                       .expect_blowup = 1};
    ck_assert_int_eq(hx_run(&cl, 2, "mask-off", 20000, 120, trainer_adam, &off),
                     0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* obcomm_adam_start/finish with two optimizers over the halves, both
 * collectives in flight at once: on one node (1 and 3 trainers) bit-exact
 * against the one-optimizer reference (ratio 0 masks by v alone, so the
 * halves mask what the whole would: the 201 dead coordinates), and on
 * 2 x 2 every rank identical after every step. */
START_TEST(split_steps_overlap)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    for (int ls = 1; ls <= 3; ls += 2) {
        struct plan pl = {.freeze = 7,
                          .steps = 20,
                          .dead = 1,
                          .mask = MASK_RATIO_0,
                          .split = 1,
                          .compare_reference = 1,
                          .check_masked = 1,
                          .want_masked = 201};
        char job[32];
        snprintf(job, sizeof(job), "split-%d", ls);
        ck_assert_int_eq(hx_run(&cl, ls, job, 20000, 120, trainer_adam, &pl),
                         0);
    }
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    struct plan pl = {.freeze = 5, .steps = 20, .split = 1};
    ck_assert_int_eq(hx_run(&cl, 2, "split", 20000, 120, trainer_adam, &pl), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* Mixed precision and clipping (start_ex, wait, grad_sumsq, finish_ex)
 * on one node, 1 and 3 trainers, freeze at 7 of 20: bit-exact against the
 * reference fed the same dt gradients and clipped as DeepSpeed clips (and,
 * in two cases, scaled by start's scale 0.5 in the warm-up), and the
 * model's parameters exactly the masters rounded. Against plain fp32
 * the masters stay close: the mean of |p - p_fp32| is at most 5e-4 with
 * fp16 and 4e-3 with bf16, against 0.2 that 20 steps of lr 0.01 can move a
 * parameter (measured, and deterministic on one node: fp16 8.4e-5 and
 * 4.5e-5, bf16 7.7e-4 and 3.7e-4 with 1 and 3 trainers; the largest single
 * deviations, 0.017 and 0.16, are coordinates that sit at their optimum,
 * where the rounded gradient's sign decides Adam's step). On 2 x 2,
 * every rank holds the same masters after every step, clipped through
 * the freeze. */
START_TEST(mixed_precision_and_clipping)
{
    static const struct mixed mxs[] = {
        {OBCOMM_FLOAT16, 0.0f, 0.0f},  {OBCOMM_BFLOAT16, 0.0f, 0.0f},
        {OBCOMM_FLOAT32, 5.0f, 0.5f},  {OBCOMM_BFLOAT16, 5.0f, 0.0f},
        {OBCOMM_BFLOAT16, 0.0f, 0.5f},
    };
    static const double tol[] = {5e-4, 4e-3};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    char out[64];
    snprintf(out, sizeof(out), "/tmp/obcomm-mixed-%d.bin", (int)getpid());
    for (int ls = 1; ls <= 3; ls += 2)
        for (size_t k = 0; k < sizeof(mxs) / sizeof(mxs[0]); k++) {
            struct plan pl = {.freeze = 7,
                              .steps = 20,
                              .compare_reference = 1,
                              .mx = mxs[k],
                              .params_out = out};
            char job[32];
            snprintf(job, sizeof(job), "mixed-%d-%zu", ls, k);
            ck_assert_int_eq(
                hx_run(&cl, ls, job, 20000, 120, trainer_adam, &pl), 0);
            if (k >= 2)
                continue;
            float got[COUNT], want[COUNT];
            size_t nm;
            FILE *f = fopen(out, "rb");
            ck_assert_ptr_nonnull(f);
            ck_assert_int_eq(fread(got, sizeof(float), COUNT, f), COUNT);
            fclose(f);
            reference(ls, 7, 0, 20, 0, MASK_DEFAULT, 0, MASK_DEFAULT, NULL,
                      want, &nm);
            double worst = 0, sum = 0;
            for (size_t i = 0; i < COUNT; i++) {
                double d = fabs((double)got[i] - (double)want[i]);
                worst = d > worst ? d : worst;
                sum += d;
            }
            fprintf(stderr,
                    "mixed %s, %d trainers: |p - p_fp32| mean %g, max %g\n",
                    k ? "bf16" : "fp16", ls, sum / COUNT, worst);
            ck_assert_double_le(sum / COUNT, tol[k]);
        }
    unlink(out);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    struct plan pl = {.freeze = 5, .steps = 20, .mx = mxs[3]};
    ck_assert_int_eq(hx_run(&cl, 2, "mixed", 20000, 120, trainer_adam, &pl), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* obcomm_adam_start_inplace, with and without clipping (with it, also
 * start's scale 0.5 in the warm-up, applied in place), on 3 threads
 * (obcomm_adam_set_threads; COUNT is below a split, which test_adam_kernels
 * covers): on one node, 1 and 3 trainers, bit-exact against the same
 * reference as the copying start; the warm-up leaves the same average in
 * every rank's buffer and the compression stage leaves it untouched
 * (mixed_step); on 2 x 2, the same parameters on every rank. */
START_TEST(inplace_matches_reference)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    for (int ls = 1; ls <= 3; ls += 2)
        for (int clip = 0; clip < 2; clip++) {
            struct plan pl = {
                .freeze = 7,
                .steps = 20,
                .compare_reference = 1,
                .mx = {OBCOMM_FLOAT32, clip ? 5.0f : 0.0f, clip ? 0.5f : 0.0f},
                .inplace = 1,
                .threads = 3};
            char job[32];
            snprintf(job, sizeof(job), "inplace-%d-%d", ls, clip);
            ck_assert_int_eq(
                hx_run(&cl, ls, job, 20000, 120, trainer_adam, &pl), 0);
        }
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    struct plan pl = {
        .freeze = 5, .steps = 20, .mx = {OBCOMM_FLOAT32, 5.0f}, .inplace = 1};
    ck_assert_int_eq(hx_run(&cl, 2, "inplace", 20000, 120, trainer_adam, &pl),
                     0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* Several nodes: identical parameters on every rank after every step
 * (checked inside the trainer), through the switch at step 5. */
START_TEST(nodes_hold_identical_parameters)
{
    static const int shape[][2] = {{2, 2}, {3, 1}};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, shape[_i][0], NULL), 0);
    struct plan pl = {.freeze = 5, .steps = 20};
    ck_assert_int_eq(
        hx_run(&cl, shape[_i][1], "same", 20000, 120, trainer_adam, &pl), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

static int files_equal(const char *a, const char *b)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "cmp -s %s %s", a, b);
    return system(cmd) == 0;
}

/* Save then load continues exactly as an uninterrupted run: everything is
 * exact because step, m and v are saved bit for bit and the daemons' error
 * feedback is the one of the save point, whether the daemons kept running
 * or were killed and restarted from their snapshot. */
/* Rewrites checkpoint `path` (format 3: the fixed little-endian header,
 * checked field by field here) as format 2, whose header was the struct
 * below as this machine lays it out; 0 on success. */
static int rewrite_as_v2(const char *path)
{
    struct v2 {
        char magic[8];
        uint32_t version, reserved;
        uint64_t count;
        int64_t step;
        uint64_t key;
        obcomm_adam_config_t cfg;
        uint64_t snapshot, part_bytes;
        uint32_t part_node, reserved2;
    } h;
    FILE *f = fopen(path, "rb");
    static uint8_t buf[96 + 2 * COUNT * 4 + (1 << 20)];
    size_t n = f ? fread(buf, 1, sizeof(buf), f) : 0;
    if (f)
        fclose(f);
    uint32_t u32;
    uint64_t u64;
    memcpy(&u32, buf + 12, 4);
    memcpy(&u64, buf + 16, 8);
    if (n < 96 || memcmp(buf, "OBCMADAM", 8) != 0 || buf[8] != 3 || u32 != 96 ||
        u64 != COUNT)
        return -1;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, "OBCMADAM", 8);
    h.version = 2;
    h.count = u64;
    memcpy(&h.step, buf + 24, 8);
    memcpy(&h.key, buf + 32, 8);
    memcpy(&h.cfg.lr, buf + 40, 4);
    memcpy(&h.cfg.beta1, buf + 44, 4);
    memcpy(&h.cfg.beta2, buf + 48, 4);
    memcpy(&h.cfg.eps, buf + 52, 4);
    memcpy(&h.cfg.weight_decay, buf + 56, 4);
    memcpy(&u32, buf + 60, 4);
    h.cfg.bias_correction = (int)u32;
    int64_t fs;
    memcpy(&fs, buf + 64, 8);
    h.cfg.freeze_step = (long)fs;
    memcpy(&h.snapshot, buf + 72, 8);
    memcpy(&h.part_bytes, buf + 80, 8);
    memcpy(&h.part_node, buf + 88, 4);
    f = fopen(path, "wb");
    if (f == NULL || fwrite(&h, sizeof(h), 1, f) != 1 ||
        fwrite(buf + 96, 1, n - 96, f) != n - 96) {
        if (f)
            fclose(f);
        return -1;
    }
    return fclose(f);
}

START_TEST(save_and_load_continue_bit_for_bit)
{
    char dir[] = "/tmp/obcomm-adam-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char full[128], half[128], resumed[128], resumed2[128], ckpt[128];
    char sd0[128], sd1[128];
    snprintf(full, sizeof(full), "%s/full.bin", dir);
    snprintf(half, sizeof(half), "%s/half.bin", dir);
    snprintf(resumed, sizeof(resumed), "%s/resumed.bin", dir);
    snprintf(resumed2, sizeof(resumed2), "%s/resumed2.bin", dir);
    snprintf(ckpt, sizeof(ckpt), "%s/adam.ckpt", dir);
    snprintf(sd0, sizeof(sd0), "%s/state0", dir);
    snprintf(sd1, sizeof(sd1), "%s/state1", dir);
    const char *f0[] = {"--state-dir", sd0, NULL};
    const char *f1[] = {"--state-dir", sd1, NULL};
    const char *const *each[] = {f0, f1};

    struct hx_cluster cl;
    ck_assert_int_eq(hx_start_each(&cl, 2, each), 0);
    struct plan whole = {.freeze = 4, .steps = 16, .params_out = full};
    ck_assert_int_eq(hx_run(&cl, 2, "whole", 20000, 120, trainer_adam, &whole),
                     0);

    /* The same job in two halves, same daemons. */
    struct plan first = {
        .freeze = 4, .steps = 8, .save = ckpt, .params_out = half};
    struct plan second = {.freeze = 4,
                          .steps = 8,
                          .load = ckpt,
                          .first_step = 8,
                          .params_in = half,
                          .params_out = resumed};
    ck_assert_int_eq(hx_run(&cl, 2, "halves", 20000, 120, trainer_adam, &first),
                     0);
    ck_assert_int_eq(
        hx_run(&cl, 2, "halves", 20000, 120, trainer_adam, &second), 0);
    ck_assert(files_equal(full, resumed));

    /* A checkpoint of format 2 (an earlier obcomm's) resumes alike. */
    ck_assert_int_eq(hx_run(&cl, 2, "v2", 20000, 120, trainer_adam, &first), 0);
    ck_assert_int_eq(rewrite_as_v2(ckpt), 0);
    ck_assert_int_eq(hx_run(&cl, 2, "v2", 20000, 120, trainer_adam, &second),
                     0);
    ck_assert(files_equal(full, resumed));

    /* Again, with a daemon crash between the halves. */
    ck_assert_int_eq(hx_run(&cl, 2, "crash", 20000, 120, trainer_adam, &first),
                     0);
    hx_halt(&cl, SIGKILL);
    ck_assert_int_eq(hx_restart(&cl), 0);
    second.params_out = resumed2;
    ck_assert_int_eq(hx_run(&cl, 2, "crash", 20000, 120, trainer_adam, &second),
                     0);
    ck_assert(files_equal(full, resumed2));
    ck_assert_int_eq(hx_stop(&cl), 0);

    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("adam");
    TCase *tc = tcase_create("adam");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, one_node_matches_reference);
    tcase_add_test(tc, one_node_masks);
    tcase_add_test(tc, split_steps_overlap);
    tcase_add_test(tc, mixed_precision_and_clipping);
    tcase_add_test(tc, inplace_matches_reference);
    tcase_add_loop_test(tc, nodes_hold_identical_parameters, 0, 2);
    tcase_add_test(tc, save_and_load_continue_bit_for_bit);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
