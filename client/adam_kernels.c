/* The passes of 1-bit Adam in portable C, and the choice of an
 * implementation (adam_kernels.h has the exact arithmetic). Each loop is
 * written as the header's formula, one statement per rounded operation
 * where the order matters, so that the AVX2 version can be checked
 * against it by reading. */
#include "adam_kernels.h"

#include "half.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>

static void p_warmup(size_t n, const float *restrict g, float *restrict m,
                     float *restrict v, float *restrict p,
                     const struct obc_adam_coef *k)
{
    const float b1 = k->beta1, c1 = 1.0f - k->beta1;
    const float b2 = k->beta2, c2 = 1.0f - k->beta2;
    const float mc = k->mc, vc = k->vc, eps = k->eps;
    const float wd = k->weight_decay, lr = k->lr, gs = k->gscale;

    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gs;
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + (c2 * gi) * gi;
        float u = (mi * mc) / (sqrtf(vi * vc) + eps) + wd * p[i];
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] - lr * u;
    }
}

static void p_momentum(size_t n, const float *restrict m, const float *grad,
                       float *next, float beta1, float gscale)
{
    const float c1 = 1.0f - beta1;

    for (size_t i = 0; i < n; i++)
        next[i] = beta1 * m[i] + c1 * (grad[i] * gscale);
}

/* A masked coordinate's momentum is zeroed here, in the pass that reads
 * it anyway, rather than in a pass of its own; m is written only there,
 * so a run with few masked coordinates does not write m back. */
static void p_compress(size_t n, float *restrict m, const float *restrict d,
                       float *restrict p, const struct obc_adam_coef *k)
{
    const float mc = k->mc, wd = k->weight_decay, lr = k->lr;

    for (size_t i = 0; i < n; i++) {
        float um = 0.0f;
        if (signbit(d[i]))
            m[i] = 0.0f;
        else
            um = (m[i] * mc) * d[i];
        float u = um + wd * p[i];
        p[i] = p[i] - lr * u;
    }
}

static void p_widen(size_t n, const uint16_t *restrict src, int bf16,
                    float scale, float *restrict dst)
{
    for (size_t i = 0; i < n; i++) {
        float x = bf16 ? obcomm_bf16_to_f32(src[i]) : obcomm_f16_to_f32(src[i]);
        dst[i] = x * scale;
    }
}

static void p_narrow(size_t n, const float *restrict src, int bf16,
                     uint16_t *restrict dst)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16 ? obcomm_f32_to_bf16(src[i]) : obcomm_f32_to_f16(src[i]);
}

static const struct obc_adam_kernels portable = {
    .name = "portable",
    .warmup = p_warmup,
    .momentum = p_momentum,
    .compress = p_compress,
    .widen = p_widen,
    .narrow = p_narrow,
};

const struct obc_adam_kernels *obc_adam_kernels_portable(void)
{
    return &portable;
}

const struct obc_adam_kernels *obc_adam_kernels_avx2(void)
{
#ifdef OBC_HAVE_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))
        return obc_adam_avx2_table();
#endif
    return NULL;
}

const struct obc_adam_kernels *obc_adam_kernels_best(void)
{
    const struct obc_adam_kernels *k = obc_adam_kernels_avx2();

    return k != NULL ? k : &portable;
}

/* One range of a pass, for one thread. */
struct part {
    const struct obc_adam_kernels *kern;
    const struct obc_adam_pass *ps;
    size_t b, e;
};

/* Mixed precision's passes go in blocks of this many elements: 16 KiB
 * of fp32, which the second kernel reads back from L1. */
#define BLOCK 4096

/* The pass on [b, b + n). */
static void run_range(const struct obc_adam_kernels *kern,
                      const struct obc_adam_pass *ps, size_t b, size_t n)
{
    const struct obc_adam_coef *k = &ps->k;

    switch (ps->kind) {
    case OBC_ADAM_WARMUP:
        kern->warmup(n, ps->g + b, ps->m + b, ps->v + b, ps->p + b, k);
        break;
    case OBC_ADAM_MOMENTUM:
        if (ps->g16 == NULL) {
            kern->momentum(n, ps->m + b, ps->g + b, ps->next + b, k->beta1,
                           k->gscale);
            break;
        }
        /* The block's gradient widened into the block of next, then the
         * momentum built there (next may be the gradient). */
        kern->widen(n, ps->g16 + b, ps->bf16, 1.0f, ps->next + b);
        kern->momentum(n, ps->m + b, ps->next + b, ps->next + b, k->beta1,
                       k->gscale);
        break;
    case OBC_ADAM_COMPRESS:
        kern->compress(n, ps->m + b, ps->d + b, ps->p + b, k);
        break;
    case OBC_ADAM_WIDEN:
        kern->widen(n, ps->g16 + b, ps->bf16, k->gscale, ps->next + b);
        break;
    }
    if (ps->model16 != NULL &&
        (ps->kind == OBC_ADAM_WARMUP || ps->kind == OBC_ADAM_COMPRESS))
        kern->narrow(n, ps->p + b, ps->bf16, ps->model16 + b);
}

static void *run_part(void *arg)
{
    const struct part *t = arg;
    const struct obc_adam_pass *ps = t->ps;
    int fused = (ps->kind == OBC_ADAM_MOMENTUM && ps->g16 != NULL) ||
                ps->model16 != NULL;
    size_t step = fused ? BLOCK : t->e - t->b;

    for (size_t b = t->b; b < t->e; b += step)
        run_range(t->kern, ps, b, t->e - b < step ? t->e - b : step);
    return NULL;
}

#define MAX_THREADS 64

int obc_adam_run(const struct obc_adam_kernels *kern,
                 const struct obc_adam_pass *ps, int threads)
{
    size_t n = ps->n;
    size_t most = n / OBC_ADAM_SPLIT_MIN;
    int t = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    if ((size_t)t > most)
        t = most > 0 ? (int)most : 1;
    if (t == 1) {
        struct part whole = {kern, ps, 0, n};
        run_part(&whole);
        return 1;
    }

    struct part parts[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    size_t per = (n / (size_t)t + 15) / 16 * 16;
    for (int j = 0; j < t; j++) {
        size_t b = per * (size_t)j, e = b + per;
        b = b > n ? n : b;
        e = e > n || j == t - 1 ? n : e;
        parts[j] = (struct part){kern, ps, b, e};
    }
    /* The threads take no signals: the process's handlers run on its own
     * threads, as they would without us. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int j = 1; j < t; j++)
        started[j] = pthread_create(&tid[j], NULL, run_part, &parts[j]) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    int used = 1;
    for (int j = 0; j < t; j++)
        if (j == 0 || !started[j])
            run_part(&parts[j]);
    for (int j = 1; j < t; j++)
        if (started[j]) {
            pthread_join(tid[j], NULL);
            used++;
        }
    return used;
}

float obc_mask_threshold(const float *v, size_t n, float ratio)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)v[i];
    double r = (double)ratio * sqrt(sum / (double)n);
    return (float)(r * r);
}
