/* The 1-bit codec in AVX2 (compiled with -mavx2 and without FMA, so every
 * operation is the same IEEE fp32/fp64 operation the portable code does).
 *
 * Layout conventions shared by all functions:
 * - A norm uses four 4-lane double accumulators; element i of a block goes
 *   to lane (i - begin) % 16, i.e. accumulator ((i - begin) % 16) / 4, the
 *   same lanes the portable code uses, so the sums are bit-identical.
 *   Lanes past the end of a block add the square of +0.0, which leaves an
 *   accumulator unchanged (it starts at +0.0 and only grows, so it is
 *   never -0.0): a last partial group sums as the portable code does,
 *   which skips those lanes.
 * - A packed byte holds 8 elements, the first in the most significant bit.
 *   movemask puts lane 0 in bit 0, so the worker step reverses the compare
 *   mask across lanes first and the server step reverses the bits of the
 *   byte by a table lookup on the integer side. Unpacking loads the byte's
 *   8 lane masks (decompress) or sign masks (server step: +-scale = scale
 *   XOR mask) from a table.
 * - The lazy steps (see "Lazy error feedback" in codec.h) read the input
 *   and the previous state once and write the next state once, in one
 *   pass that also emits the packed signs and the block sums. A next
 *   buffer apart from the previous one is written with streaming stores. */
#include "codec.h"
#include "codec_impl.h"

#include <immintrin.h>
#include <string.h>

/* Eight elements of the zero-padded input starting at i. */
static inline __m256 load_x8(const float *x, size_t count, size_t i)
{
    float t[8] = {0};

    if (i + 8 <= count)
        return _mm256_loadu_ps(x + i);
    if (i < count)
        memcpy(t, x + i, (count - i) * sizeof(float));
    return _mm256_loadu_ps(t);
}

static inline __m256i rev_lanes(void)
{
    return _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
}

/* The packed byte of eight "non-negative" compare results. */
static inline unsigned pack8(__m256 ge)
{
    return (unsigned)_mm256_movemask_ps(
        _mm256_permutevar8x32_ps(ge, rev_lanes()));
}

/* Lane masks of every byte value: all-ones in lane j where bit 7 - j is
 * set. One 32-byte load from this 8 KiB table (it stays in L1) replaces a
 * broadcast, an AND and a compare per byte. */
#define LANE(b, j) (-(int32_t)(((b) >> (7 - (j))) & 1))
#define MASK8(b)                                                    \
    {                                                               \
        LANE(b, 0), LANE(b, 1), LANE(b, 2), LANE(b, 3), LANE(b, 4), \
            LANE(b, 5), LANE(b, 6), LANE(b, 7)                      \
    }
#define MASKS4(b)  MASK8(b), MASK8((b) + 1), MASK8((b) + 2), MASK8((b) + 3)
#define MASKS16(b) MASKS4(b), MASKS4((b) + 4), MASKS4((b) + 8), MASKS4((b) + 12)
#define MASKS64(b) \
    MASKS16(b), MASKS16((b) + 16), MASKS16((b) + 32), MASKS16((b) + 48)

static const int32_t lane_masks[256][8] __attribute__((aligned(32))) = {
    MASKS64(0), MASKS64(64), MASKS64(128), MASKS64(192)};

/* All-ones in lane j where bit 7 - j of byte is set. */
static inline __m256 unpack8(unsigned byte)
{
    return _mm256_load_ps((const float *)lane_masks[byte & 0xff]);
}

/* acc[0..3] += squares of 16 floats given as two vectors. */
static inline void acc16(__m256d acc[4], __m256 lo, __m256 hi)
{
    __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(lo));
    __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1));
    __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(hi));
    __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1));

    acc[0] = _mm256_add_pd(acc[0], _mm256_mul_pd(d0, d0));
    acc[1] = _mm256_add_pd(acc[1], _mm256_mul_pd(d1, d1));
    acc[2] = _mm256_add_pd(acc[2], _mm256_mul_pd(d2, d2));
    acc[3] = _mm256_add_pd(acc[3], _mm256_mul_pd(d3, d3));
}

static inline double finish16(const __m256d acc[4])
{
    double a[16];

    for (int k = 0; k < 4; k++)
        _mm256_storeu_pd(a + 4 * k, acc[k]);
    return combine16(a);
}

/* Eight averaged elements from i, all inside every source (i + 8 <=
 * count); the order of operations of avg8 in codec.c, lane by lane. `inv`
 * is 1/nsrc, used for a power-of-two nsrc only (exact there, see avg8),
 * and `fn` is nsrc. */
static inline __m256 avg8(const float *const *src, int nsrc, size_t i,
                          __m256 inv, __m256 fn)
{
    __m256 a = _mm256_loadu_ps(src[0] + i);

    for (int k = 1; k < nsrc; k++)
        a = _mm256_add_ps(a, _mm256_loadu_ps(src[k] + i));
    if (nsrc == 1)
        return a;
    if ((nsrc & (nsrc - 1)) == 0)
        return _mm256_mul_ps(a, inv);
    return _mm256_div_ps(a, fn);
}

/* Eight averaged elements from i, where the sources may end inside. */
static inline __m256 avg8_tail(const float *const *src, int nsrc, size_t count,
                               size_t i, __m256 inv, __m256 fn)
{
    __m256 a = load_x8(src[0], count, i);

    for (int k = 1; k < nsrc; k++)
        a = _mm256_add_ps(a, load_x8(src[k], count, i));
    if (nsrc == 1)
        return a;
    if ((nsrc & (nsrc - 1)) == 0)
        return _mm256_mul_ps(a, inv);
    return _mm256_div_ps(a, fn);
}

static void v_decompress(const uint8_t *bits, float scale, float *out,
                         size_t elems)
{
    const __m256 pos = _mm256_set1_ps(scale);
    const __m256 neg = _mm256_set1_ps(-scale);
    size_t i = 0;

    for (; i + 8 <= elems; i += 8)
        _mm256_storeu_ps(out + i,
                         _mm256_blendv_ps(neg, pos, unpack8(bits[i / 8])));
    for (; i < elems; i++)
        out[i] = (bits[i / 8] >> (7 - i % 8)) & 1 ? scale : -scale;
}

/* Streaming stores need 16-byte alignment (two halves) or 32 (one
 * store); an output aligned to neither is written by v_decompress. */
static void v_decompress_stream(const uint8_t *bits, float scale, float *out,
                                size_t elems)
{
    const __m256 pos = _mm256_set1_ps(scale);
    const __m256 neg = _mm256_set1_ps(-scale);
    uintptr_t a = (uintptr_t)out;
    size_t i = 0;

    if ((a & 15) != 0) {
        v_decompress(bits, scale, out, elems);
        return;
    }
    if ((a & 31) == 0) {
        for (; i + 8 <= elems; i += 8)
            _mm256_stream_ps(out + i,
                             _mm256_blendv_ps(neg, pos, unpack8(bits[i / 8])));
    } else {
        for (; i + 8 <= elems; i += 8) {
            __m256 v = _mm256_blendv_ps(neg, pos, unpack8(bits[i / 8]));
            _mm_stream_ps(out + i, _mm256_castps256_ps128(v));
            _mm_stream_ps(out + i + 4, _mm256_extractf128_ps(v, 1));
        }
    }
    _mm_sfence();
    for (; i < elems; i++)
        out[i] = (bits[i / 8] >> (7 - i % 8)) & 1 ? scale : -scale;
}

/* ---- Lazy kernels (AVX2) ----
 *
 * The same lanes and order of operations as the portable kernels in
 * codec.c; the mode of the previous state is a compile-time constant in
 * each instantiation of the always-inline bodies. */

/* Sign masks of every byte value: 0x80000000 in lane j where bit 7 - j is
 * clear. +-scale is then scale XOR the mask, one instruction with the
 * table operand in memory (a blend needs the mask in a register). */
#define SLANE(b, j) ((((b) >> (7 - (j))) & 1) ? 0u : 0x80000000u)
#define SMASK8(b)                                                        \
    {                                                                    \
        SLANE(b, 0), SLANE(b, 1), SLANE(b, 2), SLANE(b, 3), SLANE(b, 4), \
            SLANE(b, 5), SLANE(b, 6), SLANE(b, 7)                        \
    }
#define SMASKS4(b) SMASK8(b), SMASK8((b) + 1), SMASK8((b) + 2), SMASK8((b) + 3)
#define SMASKS16(b) \
    SMASKS4(b), SMASKS4((b) + 4), SMASKS4((b) + 8), SMASKS4((b) + 12)
#define SMASKS64(b) \
    SMASKS16(b), SMASKS16((b) + 16), SMASKS16((b) + 32), SMASKS16((b) + 48)

static const uint32_t sign_masks[256][8] __attribute__((aligned(32))) = {
    SMASKS64(0), SMASKS64(64), SMASKS64(128), SMASKS64(192)};

/* +-scale for the eight elements of `byte` (scale as a vector). */
static ALWAYS_INLINE __m256 pm8(__m256 vs, unsigned byte)
{
    return _mm256_xor_ps(vs, _mm256_load_ps((const float *)sign_masks[byte]));
}

/* Bit-reversed bytes: movemask puts lane 0 in bit 0, a packed byte wants
 * it in bit 7. A lookup on the integer side instead of a lane permute
 * keeps the vector pipes, the bottleneck of the server step, free. */
#define R2(n) (n), (n) + 128, (n) + 64, (n) + 192
#define R4(n) R2(n), R2((n) + 32), R2((n) + 16), R2((n) + 48)
#define R6(n) R4(n), R4((n) + 8), R4((n) + 4), R4((n) + 12)
static const uint8_t rev8[256] = {R6(0), R6(2), R6(1), R6(3)};

/* The packed byte of eight values: bit 7 - j set where lane j >= 0. */
static ALWAYS_INLINE unsigned pack8r(__m256 m)
{
    return rev8[_mm256_movemask_ps(
        _mm256_cmp_ps(m, _mm256_setzero_ps(), _CMP_GE_OQ))];
}

/* e of eight elements from i of a state in `mode` (codec.h). */
static ALWAYS_INLINE __m256 lazy_e8(enum obd_codec_lazy_mode mode,
                                    const float *v, __m256 vs, size_t i)
{
    __m256 p, ge;

    switch (mode) {
    case OBD_CODEC_LAZY_ZERO:
        return _mm256_setzero_ps();
    case OBD_CODEC_LAZY_EAGER:
        return _mm256_loadu_ps(v + i);
    default:
        p = _mm256_loadu_ps(v + i);
        ge = _mm256_cmp_ps(p, _mm256_setzero_ps(), _CMP_GE_OQ);
        return _mm256_blendv_ps(_mm256_add_ps(p, vs), _mm256_sub_ps(p, vs), ge);
    }
}

/* Eight averaged elements from i (zero past count; the source itself for
 * nsrc == 1, like avg8). */
static ALWAYS_INLINE __m256 lazy_a8(const float *const *src, int nsrc,
                                    size_t count, size_t i, __m256 inv,
                                    __m256 fn)
{
    if (i + 8 <= count)
        return avg8(src, nsrc, i, inv, fn);
    return avg8_tail(src, nsrc, count, i, inv, fn);
}

/* Software prefetch, PREFETCH_AHEAD floats (4 KiB) ahead of the element
 * being read. Some machines' hardware prefetchers leave a streaming pass
 * waiting on memory: on the 2-vCPU Xeon VM of
 * tests/bench/results-issue22, prefetching each input line 4 KiB early
 * made the worker pass 25-30 % faster (2-8 KiB all did about as well). A
 * prefetch changes no result. One line (16 floats) per call; nothing is
 * prefetched at or past `end`, the end of what `p` points into. */
#define PREFETCH_AHEAD 1024

static ALWAYS_INLINE void prefetch_line(const float *p, size_t i, size_t end)
{
    if (i + PREFETCH_AHEAD < end)
        _mm_prefetch((const char *)(p + i + PREFETCH_AHEAD), _MM_HINT_T0);
}

/* Stores to a separate next buffer bypass the cache: a double-buffered
 * state is read again only at the next step, and a streaming store saves
 * reading each line before it is overwritten. In place, the line was just
 * read and stays cached, so plain stores. Streaming stores need 32-byte
 * (1) or at least 16-byte (2, two halves) alignment; 0 means plain. */
static int use_stream(const struct obd_codec_lazy *prev, const float *next,
                      size_t begin)
{
    uintptr_t a = (uintptr_t)(next + begin);

    if (next == prev->v)
        return 0;
    return (a & 31) == 0 ? 1 : (a & 15) == 0 ? 2 : 0;
}

static ALWAYS_INLINE void store_next(float *p, __m256 v, int stream)
{
    if (stream == 1) {
        _mm256_stream_ps(p, v);
    } else if (stream == 2) {
        _mm_stream_ps(p, _mm256_castps256_ps128(v));
        _mm_stream_ps(p + 4, _mm256_extractf128_ps(v, 1));
    } else {
        _mm256_storeu_ps(p, v);
    }
}

static ALWAYS_INLINE double
v_lazy_worker_mode(enum obd_codec_lazy_mode mode, const float *const *src,
                   int nsrc, size_t count, const struct obd_codec_lazy *prev,
                   float *next, size_t begin, size_t end, uint8_t *bits,
                   int stream)
{
    __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(),
                      _mm256_setzero_pd(), _mm256_setzero_pd()};
    const __m256 inv = _mm256_set1_ps(1.0f / (float)nsrc);
    const __m256 fn = _mm256_set1_ps((float)nsrc);
    const __m256 vs = _mm256_set1_ps(prev->scale);
    const __m256 zero = _mm256_setzero_ps();
    const float *v = prev->v;
    size_t i = begin;

    if (nsrc == 1) {
        /* The common case, without the average's loop. */
        const float *x = src[0];

        for (; i + 16 <= end && i + 16 <= count; i += 16) {
            __m256 lo =
                _mm256_add_ps(_mm256_loadu_ps(x + i), lazy_e8(mode, v, vs, i));
            __m256 hi = _mm256_add_ps(_mm256_loadu_ps(x + i + 8),
                                      lazy_e8(mode, v, vs, i + 8));
            uint16_t w =
                (uint16_t)(pack8(_mm256_cmp_ps(lo, zero, _CMP_GE_OQ)) |
                           pack8(_mm256_cmp_ps(hi, zero, _CMP_GE_OQ)) << 8);
            prefetch_line(x, i, count);
            if (mode != OBD_CODEC_LAZY_ZERO)
                prefetch_line(v, i, end);
            store_next(next + i, lo, stream);
            store_next(next + i + 8, hi, stream);
            memcpy(bits + (i - begin) / 8, &w, 2);
            acc16(acc, lo, hi);
        }
    }
    for (; i + 16 <= end; i += 16) {
        __m256 lo = _mm256_add_ps(lazy_a8(src, nsrc, count, i, inv, fn),
                                  lazy_e8(mode, v, vs, i));
        __m256 hi = _mm256_add_ps(lazy_a8(src, nsrc, count, i + 8, inv, fn),
                                  lazy_e8(mode, v, vs, i + 8));
        uint16_t w =
            (uint16_t)(pack8(_mm256_cmp_ps(lo, zero, _CMP_GE_OQ)) |
                       pack8(_mm256_cmp_ps(hi, zero, _CMP_GE_OQ)) << 8);
        for (int k = 0; k < nsrc; k++)
            prefetch_line(src[k], i, count);
        if (mode != OBD_CODEC_LAZY_ZERO)
            prefetch_line(v, i, end);
        store_next(next + i, lo, stream);
        store_next(next + i + 8, hi, stream);
        memcpy(bits + (i - begin) / 8, &w, 2);
        acc16(acc, lo, hi);
    }
    if (i < end) {
        /* Eight elements left (end - begin is a multiple of 8): lanes 8-15
         * add +0.0, which changes no accumulator (see the file comment). */
        __m256 lo = _mm256_add_ps(lazy_a8(src, nsrc, count, i, inv, fn),
                                  lazy_e8(mode, v, vs, i));
        store_next(next + i, lo, stream);
        bits[(i - begin) / 8] =
            (uint8_t)pack8(_mm256_cmp_ps(lo, zero, _CMP_GE_OQ));
        acc16(acc, lo, zero);
    }
    if (stream)
        _mm_sfence();
    return finish16(acc);
}

static double v_lazy_worker_block(const float *const *src, int nsrc,
                                  size_t count,
                                  const struct obd_codec_lazy *prev,
                                  float *next, size_t begin, size_t end,
                                  uint8_t *bits)
{
    int st = use_stream(prev, next, begin);

#define WORKER_CASE(mode, stream)                                            \
    v_lazy_worker_mode(mode, src, nsrc, count, prev, next, begin, end, bits, \
                       stream)
    switch (prev->mode) {
    case OBD_CODEC_LAZY_ZERO:
        return st == 1   ? WORKER_CASE(OBD_CODEC_LAZY_ZERO, 1)
               : st == 2 ? WORKER_CASE(OBD_CODEC_LAZY_ZERO, 2)
                         : WORKER_CASE(OBD_CODEC_LAZY_ZERO, 0);
    case OBD_CODEC_LAZY_EAGER:
        return st == 1   ? WORKER_CASE(OBD_CODEC_LAZY_EAGER, 1)
               : st == 2 ? WORKER_CASE(OBD_CODEC_LAZY_EAGER, 2)
                         : WORKER_CASE(OBD_CODEC_LAZY_EAGER, 0);
    default:
        return st == 1   ? WORKER_CASE(OBD_CODEC_LAZY_DEFERRED, 1)
               : st == 2 ? WORKER_CASE(OBD_CODEC_LAZY_DEFERRED, 2)
                         : WORKER_CASE(OBD_CODEC_LAZY_DEFERRED, 0);
    }
#undef WORKER_CASE
}

/* The participants' sum of 8 elements (in participant order, from the
 * first term) divided by n: for a power-of-two n a multiply by the exact
 * 1/n, which rounds the same real number (see avg8 in codec.c). */
static ALWAYS_INLINE __m256 server_div(__m256 a, int pow2, __m256 inv,
                                       __m256 fn)
{
    return pow2 ? _mm256_mul_ps(a, inv) : _mm256_div_ps(a, fn);
}

static ALWAYS_INLINE double
v_lazy_server_mode(enum obd_codec_lazy_mode mode, const uint8_t *const *in,
                   const float *scales, int n,
                   const struct obd_codec_lazy *prev, float *next, size_t begin,
                   size_t end, uint8_t *bits, int stream)
{
    __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(),
                      _mm256_setzero_pd(), _mm256_setzero_pd()};
    const __m256 inv = _mm256_set1_ps(1.0f / (float)n);
    const __m256 fn = _mm256_set1_ps((float)n);
    const __m256 vs = _mm256_set1_ps(prev->scale);
    const __m256 zero = _mm256_setzero_ps();
    const float *v = prev->v;
    int pow2 = (n & (n - 1)) == 0;
    size_t i = begin;

    for (; i + 32 <= end; i += 32) {
        size_t q = i / 8;
        const uint8_t *p = in[0] + q;
        __m256 vk = _mm256_set1_ps(scales[0]);
        __m256 m0 = pm8(vk, p[0]), m1 = pm8(vk, p[1]);
        __m256 m2 = pm8(vk, p[2]), m3 = pm8(vk, p[3]);
        uint32_t word;

        if (mode != OBD_CODEC_LAZY_ZERO) {
            prefetch_line(v, i, end);
            prefetch_line(v, i + 16, end);
        }
        for (int k = 1; k < n; k++) {
            p = in[k] + q;
            vk = _mm256_set1_ps(scales[k]);
            m0 = _mm256_add_ps(m0, pm8(vk, p[0]));
            m1 = _mm256_add_ps(m1, pm8(vk, p[1]));
            m2 = _mm256_add_ps(m2, pm8(vk, p[2]));
            m3 = _mm256_add_ps(m3, pm8(vk, p[3]));
        }
        m0 = _mm256_add_ps(server_div(m0, pow2, inv, fn),
                           lazy_e8(mode, v, vs, i));
        m1 = _mm256_add_ps(server_div(m1, pow2, inv, fn),
                           lazy_e8(mode, v, vs, i + 8));
        m2 = _mm256_add_ps(server_div(m2, pow2, inv, fn),
                           lazy_e8(mode, v, vs, i + 16));
        m3 = _mm256_add_ps(server_div(m3, pow2, inv, fn),
                           lazy_e8(mode, v, vs, i + 24));
        store_next(next + i, m0, stream);
        store_next(next + i + 8, m1, stream);
        store_next(next + i + 16, m2, stream);
        store_next(next + i + 24, m3, stream);
        word = (uint32_t)pack8r(m0) | (uint32_t)pack8r(m1) << 8 |
               (uint32_t)pack8r(m2) << 16 | (uint32_t)pack8r(m3) << 24;
        memcpy(bits + (i - begin) / 8, &word, 4);
        acc16(acc, m0, m1);
        acc16(acc, m2, m3);
    }
    for (; i < end; i += 16) {
        /* The last 8 or 16 elements, a byte per participant and 8. */
        __m256 m[2] = {zero, zero};
        int ng = i + 16 <= end ? 2 : 1;

        for (int g = 0; g < ng; g++) {
            size_t o = i + 8 * (size_t)g, q = o / 8;
            __m256 a = pm8(_mm256_set1_ps(scales[0]), in[0][q]);

            for (int k = 1; k < n; k++)
                a = _mm256_add_ps(a, pm8(_mm256_set1_ps(scales[k]), in[k][q]));
            m[g] = _mm256_add_ps(server_div(a, pow2, inv, fn),
                                 lazy_e8(mode, v, vs, o));
            store_next(next + o, m[g], stream);
            bits[(o - begin) / 8] = (uint8_t)pack8r(m[g]);
        }
        /* A missing second group adds +0.0 (see the file comment). */
        acc16(acc, m[0], m[1]);
    }
    if (stream)
        _mm_sfence();
    return finish16(acc);
}

static double v_lazy_server_block(const uint8_t *const *in, const float *scales,
                                  int n, const struct obd_codec_lazy *prev,
                                  float *next, size_t begin, size_t end,
                                  uint8_t *bits)
{
    int st = use_stream(prev, next, begin);

#define SERVER_CASE(mode, stream)                                         \
    v_lazy_server_mode(mode, in, scales, n, prev, next, begin, end, bits, \
                       stream)
    switch (prev->mode) {
    case OBD_CODEC_LAZY_ZERO:
        return st == 1   ? SERVER_CASE(OBD_CODEC_LAZY_ZERO, 1)
               : st == 2 ? SERVER_CASE(OBD_CODEC_LAZY_ZERO, 2)
                         : SERVER_CASE(OBD_CODEC_LAZY_ZERO, 0);
    case OBD_CODEC_LAZY_EAGER:
        return st == 1   ? SERVER_CASE(OBD_CODEC_LAZY_EAGER, 1)
               : st == 2 ? SERVER_CASE(OBD_CODEC_LAZY_EAGER, 2)
                         : SERVER_CASE(OBD_CODEC_LAZY_EAGER, 0);
    default:
        return st == 1   ? SERVER_CASE(OBD_CODEC_LAZY_DEFERRED, 1)
               : st == 2 ? SERVER_CASE(OBD_CODEC_LAZY_DEFERRED, 2)
                         : SERVER_CASE(OBD_CODEC_LAZY_DEFERRED, 0);
    }
#undef SERVER_CASE
}

static void v_lazy_error(const struct obd_codec_lazy *st, float *e,
                         size_t begin, size_t end)
{
    const __m256 vs = _mm256_set1_ps(st->scale);
    size_t i = begin;

    if (st->mode == OBD_CODEC_LAZY_ZERO) {
        memset(e + begin, 0, (end - begin) * sizeof(float));
        return;
    }
    if (st->mode == OBD_CODEC_LAZY_EAGER) {
        if (e != st->v)
            memcpy(e + begin, st->v + begin, (end - begin) * sizeof(float));
        return;
    }
    for (; i + 8 <= end; i += 8) {
        if ((i & 15) == 0)
            prefetch_line(st->v, i, end);
        _mm256_storeu_ps(e + i, lazy_e8(OBD_CODEC_LAZY_DEFERRED, st->v, vs, i));
    }
    for (; i < end; i++) {
        float p = st->v[i];
        e[i] = p >= 0.0f ? p - st->scale : p + st->scale;
    }
}

static const struct obd_codec_impl avx2 = {
    .name = "avx2",
    .lazy_worker_block = v_lazy_worker_block,
    .lazy_server_block = v_lazy_server_block,
    .lazy_error = v_lazy_error,
    .decompress = v_decompress,
    .decompress_stream = v_decompress_stream,
};

const struct obd_codec_impl *obd_codec_avx2_table(void)
{
    return &avx2;
}
