/* The passes of 1-bit Adam in portable C, and the choice of an
 * implementation (adam_kernels.h has the exact arithmetic). Each loop is
 * written as the header's formula, one statement per rounded operation
 * where the order matters, so that the AVX2 version can be checked
 * against it by reading. */
#include "adam_kernels.h"

#include <math.h>

static void p_warmup(size_t n, const float *restrict g, float *restrict m,
                     float *restrict v, float *restrict p,
                     const struct obc_adam_coef *k)
{
    const float b1 = k->beta1, c1 = 1.0f - k->beta1;
    const float b2 = k->beta2, c2 = 1.0f - k->beta2;
    const float mc = k->mc, vc = k->vc, eps = k->eps;
    const float wd = k->weight_decay, lr = k->lr;

    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + (c2 * gi) * gi;
        float u = (mi * mc) / (sqrtf(vi * vc) + eps) + wd * p[i];
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] - lr * u;
    }
}

static void p_momentum(size_t n, const float *restrict m, const float *grad,
                       float *next, float beta1)
{
    const float c1 = 1.0f - beta1;

    for (size_t i = 0; i < n; i++)
        next[i] = beta1 * m[i] + c1 * grad[i];
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

static const struct obc_adam_kernels portable = {
    .name = "portable",
    .warmup = p_warmup,
    .momentum = p_momentum,
    .compress = p_compress,
};

const struct obc_adam_kernels *obc_adam_kernels_portable(void)
{
    return &portable;
}

const struct obc_adam_kernels *obc_adam_kernels_avx2(void)
{
#ifdef OBC_HAVE_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2"))
        return obc_adam_avx2_table();
#endif
    return NULL;
}

const struct obc_adam_kernels *obc_adam_kernels_best(void)
{
    const struct obc_adam_kernels *k = obc_adam_kernels_avx2();

    return k != NULL ? k : &portable;
}
