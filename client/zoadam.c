/* 0/1 Adam on top of the public collectives (include/obcomm.h). */
#include <obcomm.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    float thr;    /* the mask: v_i <= thr is held (-1: no mask yet) */
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
    double sum = 0;
    for (size_t i = 0; i < a->count; i++)
        sum += (double)a->v[i];
    double r = (double)OBCOMM_ADAM_AUTO_MASK_RATIO * sqrt(sum / a->count);
    a->thr = (float)(r * r);
}

static void apply_mask(const obcomm_zoadam_t *a, float *x)
{
    if (a->thr < 0.0f)
        return;
    for (size_t i = 0; i < a->count; i++)
        if (a->v[i] <= a->thr)
            x[i] = 0.0f;
}

static int stage1(obcomm_zoadam_t *a, float *p, const float *grads, int full)
{
    const obcomm_zoadam_config_t *k = &a->cfg;
    size_t n = a->count;
    memcpy(a->g, grads, n * sizeof(float));
    int rc;
    if (full) {
        rc = obcomm_allreduce(a->c, a->g, n, OBCOMM_FLOAT32, OBCOMM_AVG);
        if (rc)
            return rc;
        a->rounds_fp32++;
        for (size_t i = 0; i < n; i++)
            a->v[i] = a->v[i] * k->beta2 + (1 - k->beta2) * a->g[i] * a->g[i];
        remask(a);
    } else {
        rc = obcomm_allreduce_1bit(a->c, a->key, a->g, n);
        if (rc)
            return rc;
        a->rounds_1bit++;
        apply_mask(a, a->g);
    }
    for (size_t i = 0; i < n; i++) {
        a->m[i] = a->m[i] * k->beta1 + (1 - k->beta1) * a->g[i];
        float up = a->m[i] / (sqrtf(a->v[i]) + k->eps);
        if (k->weight_decay > 0)
            up += k->weight_decay * p[i];
        p[i] += -k->lr * up;
    }
    return 0;
}

static int stage2(obcomm_zoadam_t *a, float *p, const float *grads, int sync)
{
    const obcomm_zoadam_config_t *k = &a->cfg;
    size_t n = a->count;
    a->lrs += k->lr;
    for (size_t i = 0; i < n; i++) {
        a->m[i] = a->m[i] * k->beta1 + (1 - k->beta1) * grads[i];
        float up = a->m[i] / a->denom[i];
        if (k->weight_decay > 0)
            up += k->weight_decay * p[i];
        p[i] += -k->lr * up;
        a->u[i] += -k->lr * up;
    }
    if (!sync)
        return 0;
    for (size_t i = 0; i < n; i++)
        a->u[i] *= a->denom[i];
    int rc = obcomm_allreduce_1bit(a->c, a->key, a->u, n);
    if (rc)
        return rc;
    a->rounds_1bit++;
    apply_mask(a, a->u);
    float lrs = (float)a->lrs;
    for (size_t i = 0; i < n; i++) {
        if (lrs > 0)
            a->m[i] = a->u[i] / -lrs;
        p[i] = a->x[i] + a->u[i] / a->denom[i];
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
