/* 1-bit LAMB on top of the public collectives (include/obcomm.h). */
#include <obcomm.h>

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "adam_kernels.h"
#include "ckpt_io.h"
#include "client.h"

/* Where the optimizer is; steps move it forward only. */
enum stage {
    WARMUP = 0,      /* full-precision gradients, LAMB */
    FROZEN = 1,      /* v frozen, the layer scales not fixed yet */
    COMPRESSING = 2, /* the layer scales fixed: 1-bit momenta */
};

struct obcomm_lamb {
    obcomm_t *c;
    uint64_t key;
    size_t count, layers;
    size_t *off; /* layers + 1 offsets */
    obcomm_lamb_config_t cfg;
    long step;
    enum stage stage;
    long rounds_fp32, rounds_1bit;
    float *g;       /* shared memory: the averaged gradient (warm-up) */
    float *m;       /* shared memory: the 1-bit allreduce averages it */
    float *v;       /* private: frozen after the warm-up */
    float *fresh;   /* private: v', the variance of the compression stage */
    float *denom;   /* private: sqrt(v) + eps once v is frozen */
    float *work;    /* private: the warm-up's update, else m before a step */
    double *coeff;  /* per layer: the trust ratio's average */
    double *factor; /* per layer: the last factor */
    double *scale;  /* per layer: the momentum's scale */
    float ratio;    /* the automatic mask's ratio (< 0: off) */
    int masking;    /* the mask holds v_i <= thr */
    float thr;
};

obcomm_lamb_config_t obcomm_lamb_defaults(void)
{
    obcomm_lamb_config_t cfg = {.lr = 1e-3f,
                                .beta1 = 0.9f,
                                .beta2 = 0.999f,
                                .eps = 1e-8f,
                                .weight_decay = 0.0f,
                                .max_coeff = 10.0f,
                                .min_coeff = 0.01f,
                                .coeff_beta = 0.9f,
                                .factor_max = 4.0f,
                                .factor_min = 0.5f,
                                .factor_threshold = 0.1f,
                                .freeze_step = 100000};
    return cfg;
}

/* Comparisons written so that NaN fails them. */
static int config_valid(const obcomm_lamb_config_t *k)
{
    return k->lr >= 0 && isfinite(k->lr) && k->beta1 >= 0 && k->beta1 < 1 &&
           k->beta2 >= 0 && k->beta2 < 1 && k->eps > 0 && isfinite(k->eps) &&
           k->weight_decay >= 0 && isfinite(k->weight_decay) &&
           k->min_coeff > 0 && k->min_coeff <= k->max_coeff &&
           isfinite(k->max_coeff) && k->coeff_beta >= 0 && k->coeff_beta < 1 &&
           k->factor_min > 0 && k->factor_min <= k->factor_max &&
           isfinite(k->factor_max) && k->factor_threshold >= 0 &&
           isfinite(k->factor_threshold) && k->freeze_step >= 0;
}

static int layers_valid(size_t count, size_t n, const size_t *off)
{
    if (n == 0 || n > count || off == NULL || off[0] != 0 || off[n] != count)
        return 0;
    for (size_t l = 0; l < n; l++)
        if (off[l + 1] <= off[l])
            return 0;
    return 1;
}

int obcomm_lamb_create(obcomm_t *c, uint64_t key, size_t count, size_t n_layers,
                       const size_t *layer_offsets,
                       const obcomm_lamb_config_t *cfg, obcomm_lamb_t **out)
{
    if (c == NULL || cfg == NULL || out == NULL || count == 0 ||
        count > SIZE_MAX / sizeof(float) / 4 || !config_valid(cfg) ||
        !layers_valid(count, n_layers, layer_offsets))
        return OBCOMM_E_INVAL;
    struct obcomm_lamb *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return OBCOMM_E_NOMEM;
    a->c = c;
    a->key = key;
    a->count = count;
    a->layers = n_layers;
    a->cfg = *cfg;
    a->ratio = OBCOMM_ADAM_AUTO_MASK_RATIO;
    size_t bytes = count * sizeof(float);
    int rc = obcomm_alloc(c, bytes, (void **)&a->g);
    if (rc == 0)
        rc = obcomm_alloc(c, bytes, (void **)&a->m);
    if (rc == 0) {
        a->off = malloc((n_layers + 1) * sizeof(size_t));
        a->v = calloc(count, sizeof(float));
        a->fresh = calloc(count, sizeof(float));
        a->denom = calloc(count, sizeof(float));
        a->work = calloc(count, sizeof(float));
        a->coeff = calloc(n_layers, sizeof(double));
        a->factor = calloc(n_layers, sizeof(double));
        a->scale = calloc(n_layers, sizeof(double));
        if (!a->off || !a->v || !a->fresh || !a->denom || !a->work ||
            !a->coeff || !a->factor || !a->scale)
            rc = OBCOMM_E_NOMEM;
    }
    if (rc != 0) {
        obcomm_lamb_destroy(a);
        return rc;
    }
    memcpy(a->off, layer_offsets, (n_layers + 1) * sizeof(size_t));
    for (size_t l = 0; l < n_layers; l++)
        a->factor[l] = a->scale[l] = 1.0;
    *out = a;
    return 0;
}

void obcomm_lamb_destroy(obcomm_lamb_t *a)
{
    if (a == NULL)
        return;
    if (a->g)
        obcomm_free(a->c, a->g);
    if (a->m)
        obcomm_free(a->c, a->m);
    free(a->off);
    free(a->v);
    free(a->fresh);
    free(a->denom);
    free(a->work);
    free(a->coeff);
    free(a->factor);
    free(a->scale);
    free(a);
}

void obcomm_lamb_set_lr(obcomm_lamb_t *a, float lr)
{
    if (a && lr >= 0)
        a->cfg.lr = lr;
}

long obcomm_lamb_steps(const obcomm_lamb_t *a)
{
    return a ? a->step : 0;
}

void obcomm_lamb_rounds(const obcomm_lamb_t *a, long *fp32, long *onebit)
{
    if (fp32)
        *fp32 = a ? a->rounds_fp32 : 0;
    if (onebit)
        *onebit = a ? a->rounds_1bit : 0;
}

/* OneBitAdam's rule (include/obcomm.h): once v is frozen, held when v_i <=
 * (float)((double)ratio * sqrt(mean v))^2, the mean summed in double in
 * index order. */
static void remask(obcomm_lamb_t *a)
{
    a->masking = a->stage != WARMUP && a->ratio >= 0.0f;
    if (!a->masking)
        return;
    a->thr = obc_mask_threshold(a->v, a->count, a->ratio);
}

void obcomm_lamb_set_auto_mask(obcomm_lamb_t *a, float ratio)
{
    if (a == NULL || isnan(ratio))
        return;
    a->ratio = ratio;
    remask(a);
}

size_t obcomm_lamb_masked(const obcomm_lamb_t *a)
{
    size_t n = 0;
    if (a == NULL || !a->masking)
        return 0;
    for (size_t i = 0; i < a->count; i++)
        n += a->v[i] <= a->thr;
    return n;
}

/* The Euclidean norm of x[0..n), summed in double. */
static double norm(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * (double)x[i];
    return sqrt(s);
}

static double clamp(double x, double lo, double hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

static int warmup(obcomm_lamb_t *a, float *p, const float *grads)
{
    const obcomm_lamb_config_t *k = &a->cfg;
    size_t n = a->count;
    memcpy(a->g, grads, n * sizeof(float));
    int rc = obcomm_allreduce(a->c, a->g, n, OBCOMM_FLOAT32, OBCOMM_AVG);
    if (rc)
        return rc;
    a->rounds_fp32++;
    long t = a->step + 1;
    float *u = a->work;
    for (size_t i = 0; i < n; i++) {
        float g = a->g[i];
        a->m[i] = a->m[i] * k->beta1 + (1 - k->beta1) * g;
        a->v[i] = a->v[i] * k->beta2 + (1 - k->beta2) * g * g;
        u[i] = a->m[i] / (sqrtf(a->v[i]) + k->eps);
        if (k->weight_decay > 0)
            u[i] += k->weight_decay * p[i];
    }
    if (t == k->freeze_step)
        memcpy(a->fresh, a->v, n * sizeof(float));
    for (size_t l = 0; l < a->layers; l++) {
        size_t o = a->off[l], len = a->off[l + 1] - o;
        double w = norm(p + o, len), un = norm(u + o, len);
        double coeff = 1.0;
        if (w != 0.0 && un != 0.0)
            coeff = clamp(w / un, k->min_coeff, k->max_coeff);
        if (coeff != 1.0)
            a->coeff[l] = k->coeff_beta * a->coeff[l] +
                          (1.0 - (double)k->coeff_beta) * coeff;
        float alpha = (float)(-(double)k->lr * coeff);
        for (size_t i = o; i < o + len; i++)
            p[i] += alpha * u[i];
    }
    return 0;
}

/* The mean over the layers of the momenta's RMS over each layer's own. */
static void fix_scales(obcomm_lamb_t *a)
{
    double sum = 0;
    for (size_t l = 0; l < a->layers; l++) {
        size_t o = a->off[l], len = a->off[l + 1] - o;
        a->scale[l] = norm(a->m + o, len) / sqrt((double)len);
        sum += a->scale[l];
    }
    double united = sum / (double)a->layers;
    for (size_t l = 0; l < a->layers; l++)
        a->scale[l] = a->scale[l] > 0.0 ? united / a->scale[l] : 1.0;
}

static int compressed(obcomm_lamb_t *a, float *p, const float *grads)
{
    const obcomm_lamb_config_t *k = &a->cfg;
    size_t n = a->count;
    float *last = a->work;
    memcpy(last, a->m, n * sizeof(float));
    for (size_t l = 0; l < a->layers; l++) {
        float s = (float)a->scale[l];
        for (size_t i = a->off[l]; i < a->off[l + 1]; i++)
            a->m[i] = (a->m[i] * k->beta1 + (1 - k->beta1) * grads[i]) * s;
    }
    int rc = obcomm_allreduce_1bit(a->c, a->key, a->m, n);
    if (rc) {
        /* The momentum was the send buffer: the optimizer stays as it
         * was before the step. */
        memcpy(a->m, last, n * sizeof(float));
        return rc;
    }
    a->rounds_1bit++;
    for (size_t l = 0; l < a->layers; l++) {
        float s = (float)a->scale[l];
        for (size_t i = a->off[l]; i < a->off[l + 1]; i++)
            a->m[i] /= s;
    }
    if (a->masking)
        for (size_t i = 0; i < n; i++)
            if (a->v[i] <= a->thr)
                a->m[i] = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float r = (a->m[i] - last[i] * k->beta1) / (1 - k->beta1);
        a->fresh[i] = a->fresh[i] * k->beta2 + (1 - k->beta2) * r * r;
    }
    /* Per layer: |u|, |m / d| and the largest d / (sqrt(v') + eps), then
     * the step. u is recomputed in the second pass, with the same bits. */
    float wd = k->weight_decay;
    for (size_t l = 0; l < a->layers; l++) {
        size_t o = a->off[l], e = a->off[l + 1];
        double su = 0, spre = 0;
        float fmax = 0.0f;
        for (size_t i = o; i < e; i++) {
            float pre = a->m[i] / a->denom[i];
            float u = wd > 0 ? pre + p[i] * wd : pre;
            su += (double)u * (double)u;
            spre += (double)pre * (double)pre;
            float f = a->denom[i] / (sqrtf(a->fresh[i]) + k->eps);
            if (i == o || f > fmax)
                fmax = f;
        }
        double un = sqrt(su), factor = fmax;
        if (wd > 0) {
            double q = un > 0 ? fmin(1.0, sqrt(spre) / un) : 1.0;
            factor = factor * q + (1.0 - q);
        }
        factor = clamp(factor, k->factor_min, k->factor_max);
        double prev = a->factor[l];
        factor = clamp(factor, prev * (1.0 - (double)k->factor_threshold),
                       prev * (1.0 + (double)k->factor_threshold));
        a->factor[l] = factor;
        float alpha = (float)(-(double)k->lr * a->coeff[l] * factor);
        for (size_t i = o; i < e; i++) {
            float pre = a->m[i] / a->denom[i];
            float u = wd > 0 ? pre + p[i] * wd : pre;
            p[i] += alpha * u;
        }
    }
    return 0;
}

int obcomm_lamb_step(obcomm_lamb_t *a, float *params, const float *grads)
{
    if (a == NULL || params == NULL || grads == NULL)
        return OBCOMM_E_INVAL;
    int rc;
    if (a->stage == WARMUP) {
        if ((rc = warmup(a, params, grads)) != 0)
            return rc;
        a->step++;
        if (a->step >= a->cfg.freeze_step) {
            a->stage = FROZEN;
            for (size_t i = 0; i < a->count; i++)
                a->denom[i] = sqrtf(a->v[i]) + a->cfg.eps;
            remask(a);
        }
        return 0;
    }
    if (a->stage == FROZEN)
        fix_scales(a); /* from m, which a failed step leaves as it was */
    if ((rc = compressed(a, params, grads)) != 0)
        return rc;
    a->stage = COMPRESSING;
    a->step++;
    return 0;
}

/* The checkpoint file (include/obcomm.h has the layout). */
#define LAMB_MAGIC     "OBCMLAMB"
#define LAMB_VERSION   1
#define LAMB_HDR_BYTES 144

static const size_t cfg_at[11] = {48, 52, 56, 60, 64, 68, 72, 76, 80, 84, 88};

static float *cfg_field(obcomm_lamb_config_t *k, int i)
{
    float *f[11] = {&k->lr,         &k->beta1,           &k->beta2,
                    &k->eps,        &k->weight_decay,    &k->max_coeff,
                    &k->min_coeff,  &k->coeff_beta,      &k->factor_max,
                    &k->factor_min, &k->factor_threshold};
    return f[i];
}

static void encode(obcomm_lamb_t *a, uint8_t h[LAMB_HDR_BYTES],
                   uint64_t snapshot, uint64_t part_bytes)
{
    memset(h, 0, LAMB_HDR_BYTES);
    memcpy(h, LAMB_MAGIC, 8);
    obc_put32(h + 8, LAMB_VERSION);
    obc_put32(h + 12, LAMB_HDR_BYTES);
    obc_put64(h + 16, a->count);
    obc_put64(h + 24, a->layers);
    obc_put64(h + 32, (uint64_t)a->step);
    obc_put64(h + 40, a->key);
    for (int i = 0; i < 11; i++)
        obc_put32(h + cfg_at[i], obc_fbits(*cfg_field(&a->cfg, i)));
    obc_put32(h + 92, (uint32_t)a->stage);
    obc_put64(h + 96, (uint64_t)a->cfg.freeze_step);
    obc_put64(h + 104, (uint64_t)a->rounds_fp32);
    obc_put64(h + 112, (uint64_t)a->rounds_1bit);
    obc_put64(h + 120, snapshot);
    obc_put64(h + 128, part_bytes);
    obc_put32(h + 136, (uint32_t)a->c->node_rank);
}

/* Bytes after the header, before the part. */
static uint64_t body_bytes(const obcomm_lamb_t *a)
{
    return 8 * ((uint64_t)a->layers + 1) + 3 * 8 * (uint64_t)a->layers +
           3 * (uint64_t)a->count * sizeof(float);
}

int obcomm_lamb_save(obcomm_lamb_t *a, const char *path)
{
    return obcomm_lamb_save_ex(a, path, 0);
}

int obcomm_lamb_save_ex(obcomm_lamb_t *a, const char *path, uint64_t snapshot)
{
    if (a == NULL || path == NULL)
        return OBCOMM_E_INVAL;
    uint8_t *off = malloc(8 * (a->layers + 1));
    if (off == NULL)
        return OBCOMM_E_NOMEM;
    void *part;
    size_t part_bytes;
    int rc = obc_ckpt_snapshot(a->c, &snapshot, &part, &part_bytes);
    if (rc) {
        free(off);
        return rc;
    }
    uint8_t h[LAMB_HDR_BYTES];
    encode(a, h, snapshot, part_bytes);
    for (size_t l = 0; l <= a->layers; l++)
        obc_put64(off + 8 * l, a->off[l]);
    size_t per = a->layers * sizeof(double), bytes = a->count * sizeof(float);
    struct obc_piece pieces[] = {{h, sizeof(h)},    {off, 8 * (a->layers + 1)},
                                 {a->coeff, per},   {a->factor, per},
                                 {a->scale, per},   {a->m, bytes},
                                 {a->v, bytes},     {a->fresh, bytes},
                                 {part, part_bytes}};
    rc = obc_ckpt_write(path, pieces, 9);
    free(part);
    free(off);
    return rc;
}

int obcomm_lamb_load(obcomm_lamb_t *a, const char *path)
{
    return obcomm_lamb_load_ex(a, path, 1);
}

/* The header's promises that the body cannot contradict, and its config;
 * 0 or OBCOMM_E_CORRUPT. */
static int check_header(const obcomm_lamb_t *a, const uint8_t *h,
                        obcomm_lamb_config_t *cfg)
{
    if (memcmp(h, LAMB_MAGIC, 8) != 0 || obc_get32(h + 8) != LAMB_VERSION ||
        obc_get32(h + 12) != LAMB_HDR_BYTES || obc_get64(h + 16) != a->count ||
        obc_get64(h + 24) != a->layers || obc_get64(h + 40) != a->key ||
        obc_get64(h + 120) == 0 || (int64_t)obc_get64(h + 32) < 0 ||
        obc_get32(h + 92) > COMPRESSING || obc_get32(h + 140) != 0)
        return OBCOMM_E_CORRUPT;
    *cfg = a->cfg;
    for (int i = 1; i < 11; i++)
        *cfg_field(cfg, i) = obc_bitsf(obc_get32(h + cfg_at[i]));
    cfg->freeze_step = (long)(int64_t)obc_get64(h + 96);
    if (!config_valid(cfg))
        return OBCOMM_E_CORRUPT;
    return 0;
}

/* Whether a state is one a run with freeze_step reaches: a step past the
 * warm-up is frozen, one within it is not; the scales are fixed by the
 * first step after the warm-up; the per-layer values are finite (c_avg
 * >= 0, the factor and s > 0). */
static int state_valid(const obcomm_lamb_t *a, long freeze_step,
                       const obcomm_lamb_state_t *s, const double *coeff,
                       const double *factor, const double *scale)
{
    if (s->step < 0 || s->stage < WARMUP || s->stage > COMPRESSING ||
        s->rounds_fp32 < 0 || s->rounds_1bit < 0 ||
        (s->stage == WARMUP) != (s->step < freeze_step || s->step == 0) ||
        (s->stage == FROZEN && s->step != (freeze_step > 0 ? freeze_step : 1)))
        return 0;
    for (size_t l = 0; l < a->layers; l++)
        if (!(coeff[l] >= 0 && isfinite(coeff[l]) && factor[l] > 0 &&
              isfinite(factor[l]) && scale[l] > 0 && isfinite(scale[l])))
            return 0;
    return 1;
}

void obcomm_lamb_get_state(const obcomm_lamb_t *a, obcomm_lamb_state_t *s,
                           const float **m, const float **v,
                           const float **fresh, const double **coeff,
                           const double **factor, const double **scale)
{
    if (s) {
        s->step = a->step;
        s->stage = (int)a->stage;
        s->rounds_fp32 = a->rounds_fp32;
        s->rounds_1bit = a->rounds_1bit;
    }
    if (m)
        *m = a->m;
    if (v)
        *v = a->v;
    if (fresh)
        *fresh = a->fresh;
    if (coeff)
        *coeff = a->coeff;
    if (factor)
        *factor = a->factor;
    if (scale)
        *scale = a->scale;
}

int obcomm_lamb_set_state(obcomm_lamb_t *a, const obcomm_lamb_state_t *s,
                          const float *m, const float *v, const float *fresh,
                          const double *coeff, const double *factor,
                          const double *scale)
{
    if (a == NULL || s == NULL || !m || !v || !fresh || !coeff || !factor ||
        !scale || !state_valid(a, a->cfg.freeze_step, s, coeff, factor, scale))
        return OBCOMM_E_INVAL;
    size_t n = a->count, nl = a->layers;
    memmove(a->m, m, n * sizeof(float));
    memmove(a->v, v, n * sizeof(float));
    memmove(a->fresh, fresh, n * sizeof(float));
    memmove(a->coeff, coeff, nl * sizeof(double));
    memmove(a->factor, factor, nl * sizeof(double));
    memmove(a->scale, scale, nl * sizeof(double));
    a->step = s->step;
    a->stage = (enum stage)s->stage;
    a->rounds_fp32 = s->rounds_fp32;
    a->rounds_1bit = s->rounds_1bit;
    /* The denominators and the mask follow from v. */
    if (a->stage != WARMUP)
        for (size_t i = 0; i < n; i++)
            a->denom[i] = sqrtf(a->v[i]) + a->cfg.eps;
    remask(a);
    return 0;
}

/* The state a file holds: its header's step, stage and rounds. */
static obcomm_lamb_state_t file_state(const uint8_t *h)
{
    uint32_t stage = obc_get32(h + 92);
    obcomm_lamb_state_t s = {
        .step = (long)(int64_t)obc_get64(h + 32),
        .stage = stage > COMPRESSING ? -1 : (int)stage,
        .rounds_fp32 = (long)(int64_t)obc_get64(h + 104),
        .rounds_1bit = (long)(int64_t)obc_get64(h + 112),
    };
    return s;
}

int obcomm_lamb_load_ex(obcomm_lamb_t *a, const char *path, int restore)
{
    if (a == NULL || path == NULL)
        return OBCOMM_E_INVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return OBCOMM_E_IO;
    uint8_t h[LAMB_HDR_BYTES];
    obcomm_lamb_config_t cfg;
    int rc = obc_read_all(fd, h, sizeof(h));
    if (rc == 0)
        rc = check_header(a, h, &cfg);
    uint64_t part_bytes = rc == 0 ? obc_get64(h + 128) : 0;
    uint64_t body = body_bytes(a);
    /* Read into new memory: a short or damaged file leaves the optimizer
     * as it was. The part is bounded by the file's length first. */
    struct stat fs;
    if (rc == 0 && (fstat(fd, &fs) != 0 || fs.st_size < 0 ||
                    part_bytes > (uint64_t)fs.st_size ||
                    (uint64_t)fs.st_size != LAMB_HDR_BYTES + body + part_bytes))
        rc = OBCOMM_E_CORRUPT;
    uint8_t *raw = rc == 0 ? malloc(body) : NULL;
    void *part = NULL;
    if (rc == 0 && (raw == NULL ||
                    (part_bytes > 0 && (part = malloc(part_bytes)) == NULL)))
        rc = OBCOMM_E_NOMEM;
    if (rc == 0)
        rc = obc_read_all(fd, raw, body);
    if (rc == 0 && part != NULL)
        rc = obc_read_all(fd, part, part_bytes);
    close(fd);
    /* The layout after the header: offsets, per-layer doubles, arrays.
     * The doubles are copied out, for their alignment. */
    size_t nl = a->layers, n = a->count;
    double *per_layer = rc == 0 ? malloc(3 * nl * sizeof(double)) : NULL;
    if (rc == 0 && per_layer == NULL)
        rc = OBCOMM_E_NOMEM;
    obcomm_lamb_state_t st = {0};
    if (rc == 0) {
        st = file_state(h);
        memcpy(per_layer, raw + 8 * (nl + 1), 3 * nl * sizeof(double));
        for (size_t l = 0; l <= nl; l++)
            if (obc_get64(raw + 8 * l) != a->off[l])
                rc = OBCOMM_E_CORRUPT;
        if (!state_valid(a, cfg.freeze_step, &st, per_layer, per_layer + nl,
                         per_layer + 2 * nl))
            rc = OBCOMM_E_CORRUPT;
    }
    int mine = part != NULL && obc_get32(h + 136) == (uint32_t)a->c->node_rank;
    if (rc == 0 && restore)
        rc =
            obcomm_restore_1bit_part(a->c, obc_get64(h + 120),
                                     mine ? part : NULL, mine ? part_bytes : 0);
    free(part);
    if (rc == 0) {
        /* The config comes from the file, the learning rate from the
         * caller's schedule. */
        a->cfg = cfg;
        const float *arrays =
            (const float *)(raw + 8 * (nl + 1) + 3 * nl * sizeof(double));
        rc = obcomm_lamb_set_state(a, &st, arrays, arrays + n, arrays + 2 * n,
                                   per_layer, per_layer + nl,
                                   per_layer + 2 * nl);
    }
    free(per_layer);
    free(raw);
    return rc;
}
