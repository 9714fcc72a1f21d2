/* 1-bit Adam on top of the public collectives (docs/design.md, "The idea"). */
#include <obcomm.h>

#include <errno.h>
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

#define ADAM_MAGIC   "OBCMADAM"
#define ADAM_VERSION 3

struct obcomm_adam {
    obcomm_t *c;
    uint64_t key;
    size_t count;
    obcomm_adam_config_t cfg;
    long step;
    int error_feedback;
    int auto_on;       /* automatic mask in use */
    float auto_ratio;  /* masked: sqrt(v) <= ratio * sqrt(mean v) */
    float auto_thr;    /* that threshold on v */
    int auto_frozen;   /* auto_thr comes from the frozen v (kept) */
    uint8_t *keep;     /* explicit mask (owned), or NULL: automatic */
    float *m;          /* shared memory: averaged in place by the collectives */
    float *g;          /* shared memory: the warm-up's gradient average; in
                          the compression stage the next momentum */
    float *avg;        /* where a started warm-up step's average is: g, or
                          the caller's buffer (obcomm_adam_start_inplace) */
    int threads;       /* for the passes (obcomm_adam_set_threads) */
    float *v;          /* private */
    float *d;          /* private: the compression stage's factors, the
                          frozen v's denominators with the mask folded in
                          (freeze_factors) */
    int factors_ready; /* d holds them for the current v, mask and eps */
    const struct obc_adam_kernels *kern; /* AVX2 when the CPU has it */
    /* A started step: its collective (NULL once waited for) and that
     * wait's status, which finish returns. */
    int started;
    obcomm_request_t *req;
    int wait_rc;
};

obcomm_adam_config_t obcomm_adam_defaults(void)
{
    obcomm_adam_config_t cfg = {.lr = 1e-3f,
                                .beta1 = 0.9f,
                                .beta2 = 0.999f,
                                .eps = 1e-8f,
                                .weight_decay = 0.0f,
                                .freeze_step = 100000,
                                .bias_correction = 0};
    return cfg;
}

static int config_valid(const obcomm_adam_config_t *cfg)
{
    return cfg->lr >= 0 && cfg->beta1 >= 0 && cfg->beta1 < 1 &&
           cfg->beta2 >= 0 && cfg->beta2 < 1 && cfg->eps > 0 &&
           cfg->weight_decay >= 0 && cfg->freeze_step >= 0;
}

int obcomm_adam_create(obcomm_t *c, uint64_t key, size_t count,
                       const obcomm_adam_config_t *cfg, obcomm_adam_t **out)
{
    if (c == NULL || cfg == NULL || out == NULL || count == 0 ||
        count > SIZE_MAX / sizeof(float) || !config_valid(cfg))
        return OBCOMM_E_INVAL;
    struct obcomm_adam *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return OBCOMM_E_NOMEM;
    a->c = c;
    a->key = key;
    a->count = count;
    a->cfg = *cfg;
    a->error_feedback = 1;
    a->auto_on = 1;
    a->auto_ratio = OBCOMM_ADAM_AUTO_MASK_RATIO;
    a->kern = obc_adam_kernels_best();
    a->threads = 1;
    int rc = obcomm_alloc(c, count * sizeof(float), (void **)&a->m);
    if (rc == 0)
        rc = obcomm_alloc(c, count * sizeof(float), (void **)&a->g);
    if (rc == 0 && ((a->v = calloc(count, sizeof(float))) == NULL ||
                    (a->d = malloc(count * sizeof(float))) == NULL))
        rc = OBCOMM_E_NOMEM;
    if (rc) {
        obcomm_adam_destroy(a);
        return rc;
    }
    *out = a;
    return 0;
}

void obcomm_adam_destroy(obcomm_adam_t *a)
{
    if (a == NULL)
        return;
    if (a->m)
        obcomm_free(a->c, a->m);
    if (a->g)
        obcomm_free(a->c, a->g);
    if (a->req) { /* the collective writes into m or g until it ends */
        obcomm_wait(a->req);
        obcomm_request_free(a->req);
    }
    free(a->v);
    free(a->d);
    free(a->keep);
    free(a);
}

void obcomm_adam_set_lr(obcomm_adam_t *a, float lr)
{
    a->cfg.lr = lr;
}

long obcomm_adam_steps(const obcomm_adam_t *a)
{
    return a->step;
}

int obcomm_adam_set_threads(obcomm_adam_t *a, int threads)
{
    if (a == NULL || threads < 1 || threads > OBCOMM_ADAM_MAX_THREADS)
        return OBCOMM_E_INVAL;
    a->threads = threads;
    return 0;
}

void obcomm_adam_set_error_feedback(obcomm_adam_t *a, int on)
{
    a->error_feedback = on;
}

int obcomm_adam_set_mask(obcomm_adam_t *a, const uint8_t *keep)
{
    if (keep == NULL) {
        free(a->keep);
        a->keep = NULL;
        a->factors_ready = 0;
        return 0;
    }
    uint8_t *k = malloc(a->count);
    if (k == NULL)
        return OBCOMM_E_NOMEM;
    memcpy(k, keep, a->count);
    free(a->keep);
    a->keep = k;
    a->factors_ready = 0;
    return 0;
}

void obcomm_adam_set_auto_mask(obcomm_adam_t *a, float ratio)
{
    a->auto_on = ratio >= 0;
    a->auto_ratio = a->auto_on ? ratio : 0.0f;
    a->auto_frozen = 0;
    a->factors_ready = 0;
}

/* The automatic mask's threshold on v, (ratio * sqrt(mean v))^2. v does
 * not change in the compression stage, so there it is computed once and
 * kept; after a load it is computed again from the loaded v, which gives
 * the same threshold, so the mask survives save and load. The mean is
 * summed in double, in index order: the same on every rank. */
static void auto_threshold(obcomm_adam_t *a)
{
    if (a->auto_frozen)
        return;
    a->auto_thr = obc_mask_threshold(a->v, a->count, a->auto_ratio);
    a->auto_frozen = a->step >= a->cfg.freeze_step;
}

/* Whether coordinate i's momentum is held at 0 in the compression stage. */
static int masked(const obcomm_adam_t *a, size_t i)
{
    if (a->keep)
        return a->keep[i] == 0;
    return a->auto_on && a->v[i] <= a->auto_thr;
}

size_t obcomm_adam_masked(obcomm_adam_t *a)
{
    if (!a->keep && a->auto_on)
        auto_threshold(a);
    size_t n = 0;
    for (size_t i = 0; i < a->count; i++)
        n += (size_t)masked(a, i);
    return n;
}

/* The step's constants: lr, betas, eps, weight decay, and the bias
 * corrections mc = 1/(1 - beta1^(step+1)) and vc = 1/(1 - beta2^tv), or
 * 1.0f without bias correction. v is frozen in the compression stage, and
 * so is its correction: tv = step + 1 in the warm-up, freeze_step after
 * it. */
static struct obc_adam_coef coef(const obcomm_adam_t *a)
{
    const obcomm_adam_config_t *k = &a->cfg;
    struct obc_adam_coef c = {.lr = k->lr,
                              .beta1 = k->beta1,
                              .beta2 = k->beta2,
                              .eps = k->eps,
                              .weight_decay = k->weight_decay,
                              .mc = 1.0f,
                              .vc = 1.0f,
                              .gscale = 1.0f};
    if (k->bias_correction) {
        long tv = a->step < k->freeze_step ? a->step + 1 : k->freeze_step;
        c.mc = 1.0f / (1.0f - powf(k->beta1, (float)(a->step + 1)));
        c.vc = tv > 0 ? 1.0f / (1.0f - powf(k->beta2, (float)tv)) : 1.0f;
    }
    return c;
}

/* The compression stage divides by nothing: v, its correction vc and eps
 * are fixed from freeze_step on, so each coordinate's 1/(sqrt(v*vc) + eps)
 * is computed once, here, and the mask is folded into the same array
 * (OBC_ADAM_MASKED), so that the step's one pass reads a single array for
 * both. Run at the first compression step, and again after whatever
 * changes v, the mask or eps (a load, obcomm_adam_set_mask,
 * obcomm_adam_set_auto_mask). */
static void freeze_factors(obcomm_adam_t *a)
{
    float vc = coef(a).vc, eps = a->cfg.eps;
    if (!a->keep && a->auto_on)
        auto_threshold(a);
    for (size_t i = 0; i < a->count; i++)
        a->d[i] =
            masked(a, i) ? OBC_ADAM_MASKED : obc_adam_factor(a->v[i], vc, eps);
    a->factors_ready = 1;
}

/* The update, one pass over the tensor per step (the kernels of
 * adam_kernels.h, which state the arithmetic to the rounding, run by
 * obc_adam_run on a->threads threads), with mc and vc of coef() and the
 * average's clip scale s (exactly 1 when nothing is clipped):
 *   warm-up:     g = avg*s,
 *                m = b1*m + (1-b1)*g,  v = b2*v + ((1-b2)*g)*g,
 *                p = p - lr*((m*mc) / (sqrt(v*vc) + eps) + wd*p)
 *   compression: with d = 1/(sqrt(v*vc) + eps) of the frozen v,
 *                p = p - lr*((m*mc)*d + wd*p),
 *                and for a masked coordinate m = 0, p = p - lr*(0 + wd*p).
 * So the compression stage multiplies by a rounded reciprocal where the
 * warm-up divides: the two differ in the last bit at times, which is why
 * the formula is stated here and in docs/design.md, "The idea". */
static void update(obcomm_adam_t *a, float *p, float avg_scale,
                   uint16_t *model16, int bf16)
{
    struct obc_adam_pass ps = {.n = a->count,
                               .m = a->m,
                               .p = p,
                               .model16 = model16,
                               .bf16 = bf16,
                               .k = coef(a)};
    if (a->step < a->cfg.freeze_step) {
        ps.kind = OBC_ADAM_WARMUP;
        ps.g = a->avg;
        ps.v = a->v;
        ps.k.gscale = avg_scale;
    } else {
        if (!a->factors_ready)
            freeze_factors(a);
        ps.kind = OBC_ADAM_COMPRESS;
        ps.d = a->d;
    }
    obc_adam_run(a->kern, &ps, a->threads);
}

static int grad_dtype_ok(obcomm_dtype_t dt)
{
    return dt == OBCOMM_FLOAT32 || dt == OBCOMM_FLOAT16 ||
           dt == OBCOMM_BFLOAT16;
}

/* dst[i] = src[i] * s, or a copy when s is 1 (nothing when dst is src). */
static void scale_into(float *dst, const float *src, size_t n, float s)
{
    if (s != 1.0f) {
        for (size_t i = 0; i < n; i++)
            dst[i] = src[i] * s;
    } else if (dst != src) {
        memcpy(dst, src, n * sizeof(float));
    }
}

/* The warm-up's copy of the gradients into the shared buffer, as fp32
 * (exact from fp16 and bf16), times scale unless scale is 1: one pass, the
 * conversion folded into the copy the step makes anyway. */
static void load_grads(obcomm_adam_t *a, const void *src, obcomm_dtype_t dt,
                       float scale)
{
    if (dt == OBCOMM_FLOAT32) {
        scale_into(a->g, src, a->count, scale);
    } else {
        struct obc_adam_pass ps = {.kind = OBC_ADAM_WIDEN,
                                   .n = a->count,
                                   .g16 = src,
                                   .bf16 = dt == OBCOMM_BFLOAT16,
                                   .next = a->g,
                                   .k = {.gscale = scale}};
        obc_adam_run(a->kern, &ps, a->threads);
    }
}

/* start_ex and start_inplace: with `inplace`, grads are fp32 in the
 * connection's shared memory and the warm-up averages them there. */
static int start(obcomm_adam_t *a, const void *grads, obcomm_dtype_t dtype,
                 float scale, int inplace)
{
    if (a == NULL || grads == NULL || a->started || !grad_dtype_ok(dtype) ||
        !(scale >= 0.0f && scale <= 3.4e38f))
        return OBCOMM_E_INVAL;
    const obcomm_adam_config_t *k = &a->cfg;
    int rc;

    if (a->step < k->freeze_step) {
        /* Warm-up: the exact average of the gradients, of a copy (the
         * copy converts and scales) or of the caller's buffer. */
        a->avg = a->g;
        if (!inplace) {
            load_grads(a, grads, dtype, scale);
        } else {
            a->avg = (float *)grads;
            scale_into(a->avg, a->avg, a->count, scale);
        }
        rc = obcomm_iallreduce(a->c, a->avg, a->count, OBCOMM_FLOAT32,
                               OBCOMM_AVG, &a->req);
    } else {
        /* Compression: local momentum, averaged with 1 bit per element;
         * v is never touched again. The new momentum is built in g
         * (unused in this stage), which becomes m when the op succeeds: a
         * failed step leaves m as it was. The gradient is read where it
         * is (fp16 and bf16 widened in the same pass), the scale folded
         * into the momentum pass. */
        if (!a->error_feedback && (rc = obcomm_reset_1bit(a->c, a->key)) != 0)
            return rc;
        int wide = dtype == OBCOMM_FLOAT32;
        struct obc_adam_pass ps = {.kind = OBC_ADAM_MOMENTUM,
                                   .n = a->count,
                                   .g = wide ? grads : NULL,
                                   .g16 = wide ? NULL : grads,
                                   .bf16 = dtype == OBCOMM_BFLOAT16,
                                   .m = a->m,
                                   .next = a->g,
                                   .k = {.beta1 = k->beta1, .gscale = scale}};
        obc_adam_run(a->kern, &ps, a->threads);
        rc = obcomm_iallreduce_1bit(a->c, a->key, a->g, a->count, &a->req);
    }
    if (rc == 0) {
        a->started = 1;
        a->wait_rc = 0;
    }
    return rc;
}

int obcomm_adam_start_ex(obcomm_adam_t *a, const void *grads,
                         obcomm_dtype_t dtype, float scale)
{
    return start(a, grads, dtype, scale, 0);
}

int obcomm_adam_start_inplace(obcomm_adam_t *a, float *grads, float scale)
{
    uint64_t off;
    if (a == NULL || grads == NULL ||
        obc_buffer_find(a->c, grads, a->count * sizeof(float), &off) == NULL)
        return OBCOMM_E_INVAL;
    return start(a, grads, OBCOMM_FLOAT32, scale, 1);
}

int obcomm_adam_start(obcomm_adam_t *a, const float *grads)
{
    return obcomm_adam_start_ex(a, grads, OBCOMM_FLOAT32, 1.0f);
}

int obcomm_adam_wait(obcomm_adam_t *a)
{
    if (a == NULL || !a->started)
        return OBCOMM_E_INVAL;
    if (a->req != NULL) {
        a->wait_rc = obcomm_wait(a->req);
        if (a->wait_rc)
            obc_fail(a->c, a->wait_rc, "%s", obcomm_request_error(a->req));
        obcomm_request_free(a->req);
        a->req = NULL;
    }
    return a->wait_rc;
}

int obcomm_adam_grad_sumsq(obcomm_adam_t *a, double *out)
{
    if (a == NULL || out == NULL || !a->started || a->req != NULL ||
        a->wait_rc != 0 || a->step >= a->cfg.freeze_step)
        return OBCOMM_E_INVAL;
    /* In index order, in double: the same bits on every rank, which hold
     * the same average, so every rank clips alike. */
    double sum = 0;
    for (size_t i = 0; i < a->count; i++)
        sum += (double)a->avg[i] * (double)a->avg[i];
    *out = sum;
    return 0;
}

int obcomm_adam_finish_ex(obcomm_adam_t *a, float *params, void *model,
                          obcomm_dtype_t model_dtype, float avg_scale)
{
    if (a == NULL || params == NULL || !a->started ||
        (model != NULL && !grad_dtype_ok(model_dtype)) ||
        !(avg_scale >= 0.0f && avg_scale <= 3.4e38f) ||
        (avg_scale != 1.0f && a->step >= a->cfg.freeze_step))
        return OBCOMM_E_INVAL;
    int rc = obcomm_adam_wait(a);
    a->started = 0;
    if (rc)
        return rc;
    if (a->step >= a->cfg.freeze_step) {
        float *m = a->g;
        a->g = a->m;
        a->m = m;
        /* The mask applies as DeepSpeed applies exp_avg_mask: after the
         * average, so every rank zeroes the same coordinates of the same
         * momentum (in update's pass). */
    }
    /* The model's copy, rounded to nearest even: fp16 and bf16 written
     * in the update's pass, block by block. */
    int narrow = model != NULL && model_dtype != OBCOMM_FLOAT32;
    update(a, params, avg_scale, narrow ? model : NULL,
           model_dtype == OBCOMM_BFLOAT16);
    if (model != NULL && !narrow && model != params)
        memcpy(model, params, a->count * sizeof(float));
    a->step++;
    return 0;
}

int obcomm_adam_finish(obcomm_adam_t *a, float *params)
{
    return obcomm_adam_finish_ex(a, params, NULL, OBCOMM_FLOAT32, 1.0f);
}

int obcomm_adam_step(obcomm_adam_t *a, float *params, const float *grads)
{
    if (a == NULL || params == NULL || grads == NULL)
        return OBCOMM_E_INVAL;
    int rc = obcomm_adam_start(a, grads);
    return rc ? rc : obcomm_adam_finish(a, params);
}

/* The checkpoint file (obcomm.h, obcomm_adam_save): a header of
 * ADAM_HDR_BYTES at fixed offsets, every field little-endian, then m and v
 * (count floats each, little-endian) and the node's part of the snapshot.
 * The header is encoded field by field, never dumped from a struct, so
 * the file means the same to every compiler. This file is the format's
 * one home: the Python package takes the state through
 * obcomm_adam_get_state and _set_state, never through the file.
 *   0 magic "OBCMADAM"   8 u32 version (3)   12 u32 header bytes (96)
 *  16 u64 count         24 i64 step          32 u64 key
 *  40 f32 lr  44 f32 beta1  48 f32 beta2  52 f32 eps  56 f32 weight_decay
 *  60 u32 bias_correction   64 i64 freeze_step
 *  72 u64 snapshot      80 u64 part bytes    88 u32 part's node  92 u32 0
 * Version 2 files (the header as this machine's struct) are still read. */
#define ADAM_HDR_BYTES 96

struct adam_file {
    uint32_t version;
    uint64_t count;
    int64_t step;
    uint64_t key;
    obcomm_adam_config_t cfg;
    uint64_t snapshot;   /* the daemons' error feedback (obcomm_save_1bit) */
    uint64_t part_bytes; /* without a state_dir: node part_node's part of
                            the snapshot, after v (obcomm_export_1bit) */
    uint32_t part_node;
    size_t header_bytes; /* where m begins */
};

/* Version 2's header, this machine's layout of the struct it was. */
struct adam_hdr_v2 {
    char magic[8];
    uint32_t version;
    uint32_t reserved;
    uint64_t count;
    int64_t step;
    uint64_t key;
    obcomm_adam_config_t cfg;
    uint64_t snapshot;
    uint64_t part_bytes;
    uint32_t part_node;
    uint32_t reserved2;
};

static void encode_header(uint8_t h[ADAM_HDR_BYTES], const struct adam_file *f)
{
    memset(h, 0, ADAM_HDR_BYTES);
    memcpy(h, ADAM_MAGIC, 8);
    obc_put32(h + 8, ADAM_VERSION);
    obc_put32(h + 12, ADAM_HDR_BYTES);
    obc_put64(h + 16, f->count);
    obc_put64(h + 24, (uint64_t)f->step);
    obc_put64(h + 32, f->key);
    obc_put32(h + 40, obc_fbits(f->cfg.lr));
    obc_put32(h + 44, obc_fbits(f->cfg.beta1));
    obc_put32(h + 48, obc_fbits(f->cfg.beta2));
    obc_put32(h + 52, obc_fbits(f->cfg.eps));
    obc_put32(h + 56, obc_fbits(f->cfg.weight_decay));
    obc_put32(h + 60, (uint32_t)f->cfg.bias_correction);
    obc_put64(h + 64, (uint64_t)(int64_t)f->cfg.freeze_step);
    obc_put64(h + 72, f->snapshot);
    obc_put64(h + 80, f->part_bytes);
    obc_put32(h + 88, f->part_node);
}

/* Reads the header of either version; 0, OBCOMM_E_IO or OBCOMM_E_CORRUPT
 * (not a checkpoint, or of an unknown version). */
static int read_header(int fd, struct adam_file *f)
{
    uint8_t h[sizeof(struct adam_hdr_v2) > ADAM_HDR_BYTES
                  ? sizeof(struct adam_hdr_v2)
                  : ADAM_HDR_BYTES];
    int rc = obc_read_all(fd, h, 12);
    if (rc)
        return rc;
    if (memcmp(h, ADAM_MAGIC, 8) != 0)
        return OBCOMM_E_CORRUPT;
    f->version = obc_get32(h + 8);
    if (f->version == 2) {
        struct adam_hdr_v2 v2;
        memcpy(&v2, h, 12);
        rc = obc_read_all(fd, (uint8_t *)&v2 + 12, sizeof(v2) - 12);
        if (rc)
            return rc;
        f->count = v2.count;
        f->step = v2.step;
        f->key = v2.key;
        f->cfg = v2.cfg;
        f->snapshot = v2.snapshot;
        f->part_bytes = v2.part_bytes;
        f->part_node = v2.part_node;
        f->header_bytes = sizeof(v2);
        return 0;
    }
    if (f->version != ADAM_VERSION)
        return OBCOMM_E_CORRUPT;
    rc = obc_read_all(fd, h + 12, ADAM_HDR_BYTES - 12);
    if (rc)
        return rc;
    if (obc_get32(h + 12) != ADAM_HDR_BYTES)
        return OBCOMM_E_CORRUPT;
    f->count = obc_get64(h + 16);
    f->step = (int64_t)obc_get64(h + 24);
    f->key = obc_get64(h + 32);
    f->cfg.lr = obc_bitsf(obc_get32(h + 40));
    f->cfg.beta1 = obc_bitsf(obc_get32(h + 44));
    f->cfg.beta2 = obc_bitsf(obc_get32(h + 48));
    f->cfg.eps = obc_bitsf(obc_get32(h + 52));
    f->cfg.weight_decay = obc_bitsf(obc_get32(h + 56));
    f->cfg.bias_correction = (int)obc_get32(h + 60);
    f->cfg.freeze_step = (long)(int64_t)obc_get64(h + 64);
    f->snapshot = obc_get64(h + 72);
    f->part_bytes = obc_get64(h + 80);
    f->part_node = obc_get32(h + 88);
    f->header_bytes = ADAM_HDR_BYTES;
    return 0;
}

int obcomm_adam_save(obcomm_adam_t *a, const char *path)
{
    return obcomm_adam_save_ex(a, path, 0);
}

int obcomm_adam_save_ex(obcomm_adam_t *a, const char *path, uint64_t snapshot)
{
    struct adam_file h;
    if (a->started)
        return obc_fail(a->c, OBCOMM_E_INVAL,
                        "a step is started, not finished");
    memset(&h, 0, sizeof(h));
    /* The daemons' error feedback first: no file names a snapshot that
     * some node could not save. A set covers every key of the job, so
     * optimizers saved together name one set; with a part, the file holds
     * the saving rank's node's part. */
    h.snapshot = snapshot;
    void *part;
    size_t part_bytes;
    int rc = obc_ckpt_snapshot(a->c, &h.snapshot, &part, &part_bytes);
    if (rc)
        return rc;
    h.part_bytes = part_bytes;
    h.part_node = (uint32_t)a->c->node_rank;
    h.count = a->count;
    h.step = a->step;
    h.key = a->key;
    h.cfg = a->cfg;
    uint8_t hdr[ADAM_HDR_BYTES];
    encode_header(hdr, &h);
    size_t bytes = a->count * sizeof(float);
    struct obc_piece pieces[] = {
        {hdr, sizeof(hdr)}, {a->m, bytes}, {a->v, bytes}, {part, part_bytes}};
    rc = obc_ckpt_write(path, pieces, 4);
    free(part);
    return rc;
}

int obcomm_adam_get_state(const obcomm_adam_t *a, long *step, const float **m,
                          const float **v)
{
    if (a->started)
        return obc_fail(a->c, OBCOMM_E_INVAL,
                        "a step is started, not finished");
    *step = a->step;
    *m = a->m;
    *v = a->v;
    return 0;
}

int obcomm_adam_set_state(obcomm_adam_t *a, long step,
                          const obcomm_adam_config_t *cfg, const float *m,
                          const float *v)
{
    if (a->started)
        return obc_fail(a->c, OBCOMM_E_INVAL,
                        "a step is started, not finished");
    if (step < 0)
        return obc_fail(a->c, OBCOMM_E_INVAL, "step %ld", step);
    if (cfg != NULL && !config_valid(cfg))
        return obc_fail(a->c, OBCOMM_E_INVAL, "invalid settings");
    memcpy(a->m, m, a->count * sizeof(float));
    memcpy(a->v, v, a->count * sizeof(float));
    a->step = step;
    a->auto_frozen = 0;
    a->factors_ready = 0;
    if (cfg != NULL) {
        float lr = a->cfg.lr;
        a->cfg = *cfg;
        a->cfg.lr = lr; /* the schedule owns the learning rate */
    }
    return 0;
}

int obcomm_adam_load(obcomm_adam_t *a, const char *path)
{
    return obcomm_adam_load_ex(a, path, 1);
}

int obcomm_adam_load_ex(obcomm_adam_t *a, const char *path, int restore)
{
    struct adam_file h = {0};
    if (a->started)
        return obc_fail(a->c, OBCOMM_E_INVAL,
                        "a step is started, not finished");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return OBCOMM_E_IO;
    int rc = read_header(fd, &h);
    if (rc == 0 && (h.count != a->count || h.key != a->key || h.step < 0 ||
                    h.snapshot == 0))
        rc = OBCOMM_E_CORRUPT;
    /* m and v are read into place only once the header is known good;
     * a short file leaves the optimizer as it was. */
    float *m = NULL, *v = NULL;
    if (rc == 0 && ((m = malloc(a->count * sizeof(float))) == NULL ||
                    (v = malloc(a->count * sizeof(float))) == NULL))
        rc = OBCOMM_E_NOMEM;
    if (rc == 0)
        rc = obc_read_all(fd, m, a->count * sizeof(float));
    if (rc == 0)
        rc = obc_read_all(fd, v, a->count * sizeof(float));
    /* The part, bounded by the file's length before allocation. */
    struct stat st;
    void *part = NULL;
    uint64_t want = h.header_bytes + 2 * (uint64_t)a->count * sizeof(float);
    if (rc == 0 && (fstat(fd, &st) != 0 || st.st_size < 0 ||
                    (uint64_t)st.st_size != want + h.part_bytes))
        rc = OBCOMM_E_CORRUPT;
    if (rc == 0 && h.part_bytes > 0 && (part = malloc(h.part_bytes)) == NULL)
        rc = OBCOMM_E_NOMEM;
    if (rc == 0 && part != NULL)
        rc = obc_read_all(fd, part, h.part_bytes);
    close(fd);
    /* Every daemon back to the checkpoint's error feedback (this node from
     * the file's part when it is this node's), or an error on every rank:
     * then the optimizer stays as it was. */
    int mine = part != NULL && h.part_node == (uint32_t)a->c->node_rank;
    if (rc == 0 && restore)
        rc = obcomm_restore_1bit_part(a->c, h.snapshot, mine ? part : NULL,
                                      mine ? h.part_bytes : 0);
    free(part);
    if (rc == 0) {
        memcpy(a->m, m, a->count * sizeof(float));
        memcpy(a->v, v, a->count * sizeof(float));
        a->step = h.step;
        a->auto_frozen = 0;
        a->factors_ready = 0;
        float lr = a->cfg.lr;
        a->cfg = h.cfg;
        a->cfg.lr = lr; /* the schedule owns the learning rate */
    }
    free(m);
    free(v);
    return rc;
}
