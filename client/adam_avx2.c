/* The passes of 1-bit Adam in AVX2 and F16C (compiled with -mavx2 -mf16c
 * and without FMA,
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

/* fp16 <-> fp32 with F16C (exact one way, round to nearest even the
 * other, as proto/half.h), bf16 with integer operations written after
 * half.h's. */
static void v_widen(size_t n, const uint16_t *restrict src, int bf16,
                    float scale, float *restrict dst)
{
    const __m256 sc = _mm256_set1_ps(scale);
    const __m256i abs = _mm256_set1_epi32(0x7fffffff);
    const __m256i inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x400000);
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        __m256 x;
        if (bf16) {
            __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
            u = _mm256_or_si256(u, _mm256_and_si256(nan, quiet));
            x = _mm256_castsi256_ps(u);
        } else {
            x = _mm256_cvtph_ps(h);
        }
        _mm256_storeu_ps(dst + i, _mm256_mul_ps(x, sc));
    }
    if (i < n)
        obc_adam_kernels_portable()->widen(n - i, src + i, bf16, scale,
                                           dst + i);
}

static void v_narrow(size_t n, const float *restrict src, int bf16,
                     uint16_t *restrict dst)
{
    const __m256i abs = _mm256_set1_epi32(0x7fffffff);
    const __m256i inf = _mm256_set1_epi32(0x7f800000);
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i half = _mm256_set1_epi32(0x7fff);
    const __m256i qbit = _mm256_set1_epi32(0x40);
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(src + i);
        __m128i h;
        if (bf16) {
            __m256i u = _mm256_castps_si256(x);
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
            __m256i hi = _mm256_srli_epi32(u, 16);
            __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, half),
                                         _mm256_and_si256(hi, one));
            r = _mm256_blendv_epi8(_mm256_srli_epi32(r, 16),
                                   _mm256_or_si256(hi, qbit), nan);
            /* Eight 32-bit lanes, each < 2^16, packed to 16 bits: packus
             * works per 128-bit half, the permute joins the halves. */
            __m256i pk = _mm256_packus_epi32(r, r);
            pk = _mm256_permute4x64_epi64(pk, 0x08);
            h = _mm256_castsi256_si128(pk);
        } else {
            h = _mm256_cvtps_ph(x,
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        }
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    if (i < n)
        obc_adam_kernels_portable()->narrow(n - i, src + i, bf16, dst + i);
}

static const struct obc_adam_kernels avx2 = {
    .name = "avx2",
    .warmup = v_warmup,
    .momentum = v_momentum,
    .compress = v_compress,
    .widen = v_widen,
    .narrow = v_narrow,
};

const struct obc_adam_kernels *obc_adam_avx2_table(void)
{
    return &avx2;
}
