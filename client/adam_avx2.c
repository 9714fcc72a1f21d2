/* The passes of 1-bit Adam in AVX2 (compiled with -mavx2 and without FMA,
 * so every operation is the same IEEE fp32 operation the portable code
 * does, in the same order; adam_kernels.h has the arithmetic). Eight
 * elements per iteration, unaligned loads and stores (the parameters are
 * the caller's memory); the last n % 8 elements go through the portable
 * table, which computes them bit for bit as a vector lane would. */
#include "adam_kernels.h"

#include <immintrin.h>

static void v_warmup(size_t n, const float *restrict g, float *restrict m,
                     float *restrict v, float *restrict p,
                     const struct obc_adam_coef *k)
{
    const __m256 b1 = _mm256_set1_ps(k->beta1);
    const __m256 c1 = _mm256_set1_ps(1.0f - k->beta1);
    const __m256 b2 = _mm256_set1_ps(k->beta2);
    const __m256 c2 = _mm256_set1_ps(1.0f - k->beta2);
    const __m256 mc = _mm256_set1_ps(k->mc), vc = _mm256_set1_ps(k->vc);
    const __m256 eps = _mm256_set1_ps(k->eps);
    const __m256 wd = _mm256_set1_ps(k->weight_decay);
    const __m256 lr = _mm256_set1_ps(k->lr);
    const __m256 gs = _mm256_set1_ps(k->gscale);
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), gs);
        __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)),
                                  _mm256_mul_ps(c1, gi));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
                                  _mm256_mul_ps(_mm256_mul_ps(c2, gi), gi));
        __m256 den = _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(vi, vc)), eps);
        __m256 pi = _mm256_loadu_ps(p + i);
        __m256 u = _mm256_add_ps(_mm256_div_ps(_mm256_mul_ps(mi, mc), den),
                                 _mm256_mul_ps(wd, pi));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(p + i, _mm256_sub_ps(pi, _mm256_mul_ps(lr, u)));
    }
    if (i < n)
        obc_adam_kernels_portable()->warmup(n - i, g + i, m + i, v + i, p + i,
                                            k);
}

static void v_momentum(size_t n, const float *restrict m, const float *grad,
                       float *next, float beta1, float gscale)
{
    const __m256 b1 = _mm256_set1_ps(beta1);
    const __m256 c1 = _mm256_set1_ps(1.0f - beta1);
    const __m256 gs = _mm256_set1_ps(gscale);
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(grad + i), gs);
        _mm256_storeu_ps(
            next + i, _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)),
                                    _mm256_mul_ps(c1, gi)));
    }
    if (i < n)
        obc_adam_kernels_portable()->momentum(n - i, m + i, grad + i, next + i,
                                              beta1, gscale);
}

/* The mask is the sign bit of d, spread over its lane by an arithmetic
 * shift. A masked lane's product is replaced by +0.0f (ANDNOT), which is
 * what the portable code adds; its momentum is zeroed with a masked store,
 * issued only for groups that hold a masked lane, so m's cache lines are
 * dirtied only there. */
static void v_compress(size_t n, float *restrict m, const float *restrict d,
                       float *restrict p, const struct obc_adam_coef *k)
{
    const __m256 mc = _mm256_set1_ps(k->mc);
    const __m256 wd = _mm256_set1_ps(k->weight_decay);
    const __m256 lr = _mm256_set1_ps(k->lr);
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        __m256 di = _mm256_loadu_ps(d + i);
        __m256i mask = _mm256_srai_epi32(_mm256_castps_si256(di), 31);
        __m256 prod =
            _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(m + i), mc), di);
        __m256 um = _mm256_andnot_ps(_mm256_castsi256_ps(mask), prod);
        __m256 pi = _mm256_loadu_ps(p + i);
        __m256 u = _mm256_add_ps(um, _mm256_mul_ps(wd, pi));
        _mm256_storeu_ps(p + i, _mm256_sub_ps(pi, _mm256_mul_ps(lr, u)));
        if (_mm256_movemask_ps(di) != 0)
            _mm256_maskstore_ps(m + i, mask, _mm256_setzero_ps());
    }
    if (i < n)
        obc_adam_kernels_portable()->compress(n - i, m + i, d + i, p + i, k);
}

static const struct obc_adam_kernels avx2 = {
    .name = "avx2",
    .warmup = v_warmup,
    .momentum = v_momentum,
    .compress = v_compress,
};

const struct obc_adam_kernels *obc_adam_avx2_table(void)
{
    return &avx2;
}
