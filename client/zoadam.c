/* 0/1 Adam on top of the public collectives (include/obcomm.h). */
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

struct obcomm_zoadam {
    obcomm_t *c;
    uint64_t key;
    size_t count;
    obcomm_zoadam_config_t cfg;
    long step;
    long var_interval, var_counter;     /* stage 1's schedule */
    long local_interval, local_counter; /* stage 2's */
    int frozen;
    double lrs; /* the learning rates summed since the last sync */
    long rounds_fp32, rounds_1bit;
    float *g;     /* shared memory: the averaged gradient (stage 1) */
    float *u;     /* shared memory: the updates since the last sync */
    float *m, *v; /* private */
    float *denom; /* private: sqrt(v) + eps once v is frozen */
    float *x;     /* private: the parameters at the last sync */
    float ratio;  /* the automatic mask's (negative: off) */
    float thr;    /* the mask: v_i <= thr is held (-1: no mask) */
};

obcomm_zoadam_config_t obcomm_zoadam_defaults(void)
{
    obcomm_zoadam_config_t cfg = {.lr = 1e-3f,
                                  .beta1 = 0.9f,
                                  .beta2 = 0.999f,
                                  .eps = 1e-8f,
                                  .weight_decay = 0.0f,
                                  .var_freeze_step = 100000,
                                  .var_update_scaler = 16,
                                  .local_step_scaler = 32678,
                                  .local_step_clipper = 16};
    return cfg;
}

static int config_valid(const obcomm_zoadam_config_t *cfg)
{
    return cfg->lr >= 0 && cfg->beta1 >= 0 && cfg->beta1 < 1 &&
           cfg->beta2 >= 0 && cfg->beta2 < 1 && cfg->eps > 0 &&
           cfg->weight_decay >= 0 && cfg->var_freeze_step >= 0 &&
           cfg->var_update_scaler >= 1 && cfg->local_step_scaler >= 1 &&
           cfg->local_step_clipper >= 1;
}

int obcomm_zoadam_create(obcomm_t *c, uint64_t key, size_t count,
                         const obcomm_zoadam_config_t *cfg,
                         obcomm_zoadam_t **out)
{
    if (c == NULL || cfg == NULL || out == NULL || count == 0 ||
        count > SIZE_MAX / sizeof(float) || !config_valid(cfg))
        return OBCOMM_E_INVAL;
    struct obcomm_zoadam *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return OBCOMM_E_NOMEM;
    a->c = c;
    a->key = key;
    a->count = count;
    a->cfg = *cfg;
    a->var_interval = a->local_interval = 1;
    a->ratio = OBCOMM_ZOADAM_AUTO_MASK_RATIO;
    a->thr = -1.0f;
    size_t bytes = count * sizeof(float);
    int rc = obcomm_alloc(c, bytes, (void **)&a->g);
    if (rc == 0)
        rc = obcomm_alloc(c, bytes, (void **)&a->u);
    if (rc == 0) {
        a->m = calloc(count, sizeof(float));
        a->v = calloc(count, sizeof(float));
        a->denom = calloc(count, sizeof(float));
        a->x = calloc(count, sizeof(float));
        if (!a->m || !a->v || !a->denom || !a->x)
            rc = OBCOMM_E_NOMEM;
    }
    if (rc != 0) {
        obcomm_zoadam_destroy(a);
        return rc;
    }
    memset(a->u, 0, bytes);
    *out = a;
    return 0;
}

void obcomm_zoadam_destroy(obcomm_zoadam_t *a)
{
    if (a == NULL)
        return;
    if (a->g)
        obcomm_free(a->c, a->g);
    if (a->u)
        obcomm_free(a->c, a->u);
    free(a->m);
    free(a->v);
    free(a->denom);
    free(a->x);
    free(a);
}

void obcomm_zoadam_set_lr(obcomm_zoadam_t *a, float lr)
{
    if (a && lr >= 0)
        a->cfg.lr = lr;
}

long obcomm_zoadam_steps(const obcomm_zoadam_t *a)
{
    return a ? a->step : 0;
}

void obcomm_zoadam_rounds(const obcomm_zoadam_t *a, long *fp32, long *onebit)
{
    if (fp32)
        *fp32 = a ? a->rounds_fp32 : 0;
    if (onebit)
        *onebit = a ? a->rounds_1bit : 0;
}

/* OneBitAdam's rule (include/obcomm.h): held when v_i <= (float)((double)
 * ratio * sqrt(mean v))^2, the mean summed in double in index order. */
static void remask(obcomm_zoadam_t *a)
{
    a->thr = -1.0f;
    if (a->ratio < 0.0f || a->step == 0)
        return;
    a->thr = obc_mask_threshold(a->v, a->count, a->ratio);
}

/* Whether the mask holds coordinate i. */
static inline int held(const obcomm_zoadam_t *a, size_t i)
{
    return a->thr >= 0.0f && a->v[i] <= a->thr;
}

void obcomm_zoadam_set_auto_mask(obcomm_zoadam_t *a, float ratio)
{
    if (a == NULL)
        return;
    a->ratio = ratio;
    remask(a);
}

size_t obcomm_zoadam_masked(const obcomm_zoadam_t *a)
{
    size_t n = 0;
    if (a != NULL)
        for (size_t i = 0; i < a->count; i++)
            n += held(a, i);
    return n;
}

/* One pass each: the averaged (and, on 1-bit steps, masked) gradient
 * into m, and v on full-precision steps, then the step. */
static int stage1(obcomm_zoadam_t *a, float *p, const float *grads, int full)
{
    const obcomm_zoadam_config_t *k = &a->cfg;
    size_t n = a->count;
    memcpy(a->g, grads, n * sizeof(float));
    int rc = full ? obcomm_allreduce(a->c, a->g, n, OBCOMM_FLOAT32, OBCOMM_AVG)
                  : obcomm_allreduce_1bit(a->c, a->key, a->g, n);
    if (rc)
        return rc;
    if (full)
        a->rounds_fp32++;
    else
        a->rounds_1bit++;
    const float b1 = k->beta1, c1 = 1 - k->beta1, b2 = k->beta2,
                c2 = 1 - k->beta2;
    for (size_t i = 0; i < n; i++) {
        float gi = a->g[i];
        if (full)
            a->v[i] = a->v[i] * b2 + c2 * gi * gi;
        else if (held(a, i))
            gi = 0.0f;
        a->m[i] = a->m[i] * b1 + c1 * gi;
        float up = a->m[i] / (sqrtf(a->v[i]) + k->eps);
        if (k->weight_decay > 0)
            up += k->weight_decay * p[i];
        p[i] += -k->lr * up;
    }
    if (full)
        remask(a);
    return 0;
}

/* The local step, with u scaled by sqrt(v) + eps in the same pass on a
 * synchronizing step; then the average, masked, sets m, p and x. */
static int stage2(obcomm_zoadam_t *a, float *p, const float *grads, int sync)
{
    const obcomm_zoadam_config_t *k = &a->cfg;
    size_t n = a->count;
    a->lrs += k->lr;
    const float b1 = k->beta1, c1 = 1 - k->beta1;
    for (size_t i = 0; i < n; i++) {
        a->m[i] = a->m[i] * b1 + c1 * grads[i];
        float up = a->m[i] / a->denom[i];
        if (k->weight_decay > 0)
            up += k->weight_decay * p[i];
        p[i] += -k->lr * up;
        a->u[i] += -k->lr * up;
        if (sync)
            a->u[i] *= a->denom[i];
    }
    if (!sync)
        return 0;
    int rc = obcomm_allreduce_1bit(a->c, a->key, a->u, n);
    if (rc)
        return rc;
    a->rounds_1bit++;
    float lrs = (float)a->lrs;
    for (size_t i = 0; i < n; i++) {
        float ui = held(a, i) ? 0.0f : a->u[i];
        if (lrs > 0)
            a->m[i] = ui / -lrs;
        p[i] = a->x[i] + ui / a->denom[i];
        a->x[i] = p[i];
        a->u[i] = 0.0f;
    }
    a->lrs = 0;
    return 0;
}

int obcomm_zoadam_step(obcomm_zoadam_t *a, float *params, const float *grads)
{
    if (a == NULL || params == NULL || grads == NULL)
        return OBCOMM_E_INVAL;
    long t = ++a->step;
    int full = !a->frozen && t % a->var_interval == 0;
    int sync = a->frozen && t % a->local_interval == 0;
    int rc = a->frozen ? stage2(a, params, grads, sync)
                       : stage1(a, params, grads, full);
    if (rc)
        return rc;
    if (!a->frozen) {
        if (full && ++a->var_counter == a->cfg.var_update_scaler) {
            a->var_counter = 0;
            a->var_interval *= 2;
        }
    } else if (++a->local_counter == a->cfg.local_step_scaler) {
        a->local_counter = 0;
        a->local_interval = a->local_interval * 2 < a->cfg.local_step_clipper
                                ? a->local_interval * 2
                                : a->cfg.local_step_clipper;
    }
    if (!a->frozen && t > a->cfg.var_freeze_step) {
        /* Both error buffers start again at zero on every node: from here
         * on they compress accumulated updates, not gradients. */
        rc = obcomm_reset_1bit(a->c, a->key);
        if (rc)
            return rc;
        a->frozen = 1;
        for (size_t i = 0; i < a->count; i++)
            a->denom[i] = sqrtf(a->v[i]) + a->cfg.eps;
        memcpy(a->x, params, a->count * sizeof(float));
        memset(a->u, 0, a->count * sizeof(float));
    }
    return 0;
}

/* A schedule some run reaches: intervals powers of two within bounds are
 * not required (a config may change between runs), only what keeps step()
 * defined. */
static int state_valid(const obcomm_zoadam_state_t *s)
{
    return s->step >= 0 && (s->frozen == 0 || s->frozen == 1) &&
           s->var_interval >= 1 && s->var_counter >= 0 &&
           s->local_interval >= 1 && s->local_counter >= 0 && s->lrs >= 0 &&
           isfinite(s->lrs) && s->rounds_fp32 >= 0 && s->rounds_1bit >= 0;
}

void obcomm_zoadam_get_state(const obcomm_zoadam_t *a, obcomm_zoadam_state_t *s,
                             const float **m, const float **v, const float **u,
                             const float **x)
{
    obcomm_zoadam_state_t st = {
        .step = a->step,
        .frozen = a->frozen,
        .var_interval = a->var_interval,
        .var_counter = a->var_counter,
        .local_interval = a->local_interval,
        .local_counter = a->local_counter,
        .lrs = a->lrs,
        .rounds_fp32 = a->rounds_fp32,
        .rounds_1bit = a->rounds_1bit,
    };
    if (s)
        *s = st;
    if (m)
        *m = a->m;
    if (v)
        *v = a->v;
    if (u)
        *u = a->u;
    if (x)
        *x = a->x;
}

int obcomm_zoadam_set_state(obcomm_zoadam_t *a, const obcomm_zoadam_state_t *s,
                            const float *m, const float *v, const float *u,
                            const float *x)
{
    if (a == NULL || s == NULL || m == NULL || v == NULL || u == NULL ||
        (s->frozen && x == NULL) || !state_valid(s))
        return OBCOMM_E_INVAL;
    size_t n = a->count, bytes = n * sizeof(float);
    memmove(a->m, m, bytes);
    memmove(a->v, v, bytes);
    memmove(a->u, u, bytes);
    if (s->frozen)
        memmove(a->x, x, bytes);
    a->step = s->step;
    a->frozen = s->frozen;
    a->var_interval = s->var_interval;
    a->var_counter = s->var_counter;
    a->local_interval = s->local_interval;
    a->local_counter = s->local_counter;
    a->lrs = s->lrs;
    a->rounds_fp32 = s->rounds_fp32;
    a->rounds_1bit = s->rounds_1bit;
    /* The mask and the denominators follow from v. */
    remask(a);
    if (a->frozen)
        for (size_t i = 0; i < n; i++)
            a->denom[i] = sqrtf(a->v[i]) + a->cfg.eps;
    return 0;
}

/* The checkpoint file: a header of ZO_HDR_BYTES at fixed offsets, every
 * field little-endian (ckpt_io.h), then m, v, u and x (count floats each)
 * and the node's part of the snapshot.
 *   0 magic "OBCMZOAD"   8 u32 version (1)   12 u32 header bytes (176)
 *  16 u64 count         24 i64 step          32 u64 key
 *  40 f32 lr  44 f32 beta1  48 f32 beta2  52 f32 eps  56 f32 weight_decay
 *  60 u32 frozen        64 i64 var_freeze_step   72 i64 var_update_scaler
 *  80 i64 local_step_scaler   88 i64 local_step_clipper
 *  96 i64 var_interval 104 i64 var_counter 112 i64 local_interval
 * 120 i64 local_counter 128 f64 lrs  136 i64 fp32 rounds 144 i64 1-bit
 * 152 u64 snapshot     160 u64 part bytes   168 u32 part's node 172 u32 0 */
#define ZO_MAGIC     "OBCMZOAD"
#define ZO_VERSION   1
#define ZO_HDR_BYTES 176

static void encode(const obcomm_zoadam_t *a, uint8_t h[ZO_HDR_BYTES],
                   uint64_t snapshot, uint64_t part_bytes)
{
    const obcomm_zoadam_config_t *k = &a->cfg;
    uint64_t lrs;
    memcpy(&lrs, &a->lrs, 8);
    memset(h, 0, ZO_HDR_BYTES);
    memcpy(h, ZO_MAGIC, 8);
    obc_put32(h + 8, ZO_VERSION);
    obc_put32(h + 12, ZO_HDR_BYTES);
    obc_put64(h + 16, a->count);
    obc_put64(h + 24, (uint64_t)a->step);
    obc_put64(h + 32, a->key);
    obc_put32(h + 40, obc_fbits(k->lr));
    obc_put32(h + 44, obc_fbits(k->beta1));
    obc_put32(h + 48, obc_fbits(k->beta2));
    obc_put32(h + 52, obc_fbits(k->eps));
    obc_put32(h + 56, obc_fbits(k->weight_decay));
    obc_put32(h + 60, (uint32_t)a->frozen);
    obc_put64(h + 64, (uint64_t)k->var_freeze_step);
    obc_put64(h + 72, (uint64_t)k->var_update_scaler);
    obc_put64(h + 80, (uint64_t)k->local_step_scaler);
    obc_put64(h + 88, (uint64_t)k->local_step_clipper);
    obc_put64(h + 96, (uint64_t)a->var_interval);
    obc_put64(h + 104, (uint64_t)a->var_counter);
    obc_put64(h + 112, (uint64_t)a->local_interval);
    obc_put64(h + 120, (uint64_t)a->local_counter);
    obc_put64(h + 128, lrs);
    obc_put64(h + 136, (uint64_t)a->rounds_fp32);
    obc_put64(h + 144, (uint64_t)a->rounds_1bit);
    obc_put64(h + 152, snapshot);
    obc_put64(h + 160, part_bytes);
    obc_put32(h + 168, (uint32_t)a->c->node_rank);
}

int obcomm_zoadam_save(obcomm_zoadam_t *a, const char *path)
{
    if (a == NULL || path == NULL)
        return OBCOMM_E_INVAL;
    uint64_t snapshot = 0;
    void *part;
    size_t part_bytes;
    int rc = obc_ckpt_snapshot(a->c, &snapshot, &part, &part_bytes);
    if (rc)
        return rc;
    uint8_t h[ZO_HDR_BYTES];
    encode(a, h, snapshot, part_bytes);
    size_t bytes = a->count * sizeof(float);
    struct obc_piece pieces[] = {{h, sizeof(h)}, {a->m, bytes},
                                 {a->v, bytes},  {a->u, bytes},
                                 {a->x, bytes},  {part, part_bytes}};
    rc = obc_ckpt_write(path, pieces, 6);
    free(part);
    return rc;
}

int obcomm_zoadam_load(obcomm_zoadam_t *a, const char *path)
{
    if (a == NULL || path == NULL)
        return OBCOMM_E_INVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return OBCOMM_E_IO;
    uint8_t h[ZO_HDR_BYTES];
    int rc = obc_read_all(fd, h, sizeof(h));
    if (rc == 0 &&
        (memcmp(h, ZO_MAGIC, 8) != 0 || obc_get32(h + 8) != ZO_VERSION ||
         obc_get32(h + 12) != ZO_HDR_BYTES || obc_get64(h + 16) != a->count ||
         obc_get64(h + 32) != a->key || obc_get64(h + 152) == 0))
        rc = OBCOMM_E_CORRUPT;
    uint64_t part_bytes = rc == 0 ? obc_get64(h + 160) : 0;
    size_t bytes = a->count * sizeof(float);
    /* Read into new memory: a short or damaged file leaves the optimizer
     * as it was. The part is bounded by the file's length first. */
    struct stat fs;
    if (rc == 0 && (fstat(fd, &fs) != 0 || fs.st_size < 0 ||
                    (uint64_t)fs.st_size !=
                        ZO_HDR_BYTES + 4 * (uint64_t)bytes + part_bytes))
        rc = OBCOMM_E_CORRUPT;
    float *arrays = rc == 0 ? malloc(4 * bytes) : NULL;
    void *part = NULL;
    if (rc == 0 && (arrays == NULL ||
                    (part_bytes > 0 && (part = malloc(part_bytes)) == NULL)))
        rc = OBCOMM_E_NOMEM;
    if (rc == 0)
        rc = obc_read_all(fd, arrays, 4 * bytes);
    if (rc == 0 && part != NULL)
        rc = obc_read_all(fd, part, part_bytes);
    close(fd);
    int mine = part != NULL && obc_get32(h + 168) == (uint32_t)a->c->node_rank;
    /* The schedule is checked before anything is restored: a damaged
     * interval would divide by zero on the next step. */
    obcomm_zoadam_config_t cfg = a->cfg;
    obcomm_zoadam_state_t st = {0};
    if (rc == 0) {
        cfg.beta1 = obc_bitsf(obc_get32(h + 44));
        cfg.beta2 = obc_bitsf(obc_get32(h + 48));
        cfg.eps = obc_bitsf(obc_get32(h + 52));
        cfg.weight_decay = obc_bitsf(obc_get32(h + 56));
        cfg.var_freeze_step = (long)obc_get64(h + 64);
        cfg.var_update_scaler = (long)obc_get64(h + 72);
        cfg.local_step_scaler = (long)obc_get64(h + 80);
        cfg.local_step_clipper = (long)obc_get64(h + 88);
        st.step = (long)obc_get64(h + 24);
        st.frozen = obc_get32(h + 60) > 1 ? -1 : (int)obc_get32(h + 60);
        st.var_interval = (long)obc_get64(h + 96);
        st.var_counter = (long)obc_get64(h + 104);
        st.local_interval = (long)obc_get64(h + 112);
        st.local_counter = (long)obc_get64(h + 120);
        uint64_t lrs = obc_get64(h + 128);
        memcpy(&st.lrs, &lrs, 8);
        st.rounds_fp32 = (long)obc_get64(h + 136);
        st.rounds_1bit = (long)obc_get64(h + 144);
        if (!config_valid(&cfg) || !state_valid(&st))
            rc = OBCOMM_E_CORRUPT;
    }
    if (rc == 0)
        rc =
            obcomm_restore_1bit_part(a->c, obc_get64(h + 152),
                                     mine ? part : NULL, mine ? part_bytes : 0);
    free(part);
    if (rc == 0) {
        /* The schedule's config comes from the file, the learning rate
         * from the caller's schedule. */
        a->cfg = cfg;
        size_t n = a->count;
        rc = obcomm_zoadam_set_state(a, &st, arrays, arrays + n, arrays + 2 * n,
                                     arrays + 3 * n);
    }
    free(arrays);
    return rc;
}
