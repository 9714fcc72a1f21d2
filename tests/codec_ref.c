/* The two-pass reference of the 1-bit codec; see codec_ref.h. The
 * arithmetic each function performs is the one codec.h specifies, laid
 * out in the lanes the daemon's kernels use. */
#include "codec_ref.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "codec.h"

/* Element i of the zero-padded input. */
static float padded_x(const float *x, size_t count, size_t i)
{
    return i < count ? x[i] : 0.0f;
}

/* The pairwise combine of the 16 lane accumulators of a norm block,
 * written from codec.h: p_j = a_2j + a_2j+1, q_j = p_2j + p_2j+1, then
 * (q0 + q1) + (q2 + q3). */
static double combine16(const double a[16])
{
    double p[8], q[4];

    for (int j = 0; j < 8; j++)
        p[j] = a[2 * j] + a[2 * j + 1];
    for (int j = 0; j < 4; j++)
        q[j] = p[2 * j] + p[2 * j + 1];
    return (q[0] + q[1]) + (q[2] + q[3]);
}

/* A participant's scale is usable if it is a finite number >= 0; -0.0
 * compares equal to 0 and is accepted. */
static int scale_ok(float s)
{
    return s >= 0.0f && s <= FLT_MAX;
}

/* The scale from a sum of squares over `elems` elements; the block sums
 * were added left to right from 0.0 by the caller, as obd_codec_scale
 * adds them. */
static int scale_of(double sum, size_t elems, float *scale)
{
    if (!isfinite(sum))
        return OBD_E_NONFINITE;
    *scale = (float)sqrt(sum / (double)elems);
    return 0;
}

/* Signs select +scale or -scale by flipping the sign bit, which is what
 * negation does in IEEE 754; b - (+-scale) is b + (-+scale) by
 * definition, so the results are the ones codec.h specifies. */

static uint32_t float_bits(float f)
{
    uint32_t u;

    memcpy(&u, &f, sizeof(u));
    return u;
}

/* +scale if bit is 1, -scale if bit is 0; scale given as its bits. */
static float plus_minus(uint32_t scale_bits, unsigned bit)
{
    uint32_t u = scale_bits ^ ((uint32_t)(bit ^ 1u) << 31);
    float f;

    memcpy(&f, &u, sizeof(f));
    return f;
}

double codec_ref_sumsq_block(const float *x, size_t count, const float *e,
                             size_t begin, size_t end)
{
    double acc[16] = {0};

    for (size_t i = begin; i < end; i++) {
        float b = padded_x(x, count, i) + e[i];
        double d = b;
        acc[(i - begin) % 16] += d * d;
    }
    return combine16(acc);
}

void codec_ref_compress_range(const float *x, size_t count, float *e,
                              size_t begin, size_t end, float scale,
                              uint8_t *bits)
{
    uint32_t sb = float_bits(scale);

    for (size_t i = begin; i < end; i += 8) {
        unsigned byte = 0;

        for (int j = 0; j < 8; j++) {
            float b = padded_x(x, count, i + j) + e[i + j];
            unsigned s = b >= 0.0f;
            e[i + j] = b - plus_minus(sb, s);
            byte |= s << (7 - j);
        }
        bits[(i - begin) / 8] = (uint8_t)byte;
    }
}

/* One element of the average, zero past count: the fp32 sum in source
 * order from the first term, then the division by nsrc. For a
 * power-of-two nsrc the code multiplies by 1/nsrc instead: that factor is
 * exact, so the product is the correct rounding of the same real number
 * as the quotient (also when it is subnormal), and the result is
 * identical. */
static float avg1(const float *const *src, int nsrc, size_t count, size_t i)
{
    float a;

    if (i >= count)
        return 0.0f;
    a = src[0][i];
    for (int k = 1; k < nsrc; k++)
        a += src[k][i];
    if (nsrc == 1)
        return a;
    if ((nsrc & (nsrc - 1)) == 0)
        return a * (1.0f / (float)nsrc);
    return a / (float)nsrc;
}

double codec_ref_avg_sumsq_block(const float *const *src, int nsrc,
                                 size_t count, const float *e, size_t begin,
                                 size_t end, float *b)
{
    double acc[16] = {0};

    for (size_t i = begin; i < end; i++) {
        float bi = avg1(src, nsrc, count, i) + e[i];
        double d = bi;
        b[i] = bi;
        acc[(i - begin) % 16] += d * d;
    }
    return combine16(acc);
}

void codec_ref_sign_range(const float *b, float *e, size_t begin, size_t end,
                          float scale, uint8_t *bits)
{
    uint32_t sb = float_bits(scale);

    for (size_t i = begin; i < end; i += 8) {
        unsigned byte = 0;

        for (int j = 0; j < 8; j++) {
            unsigned s = b[i + j] >= 0.0f;
            e[i + j] = b[i + j] - plus_minus(sb, s);
            byte |= s << (7 - j);
        }
        bits[(i - begin) / 8] = (uint8_t)byte;
    }
}

/* m_i of the server step: the participants' +-scale_k summed in
 * participant order from the first term, divided by n (a multiply by the
 * exact 1/n for a power-of-two n; see avg1), plus the server error. */
static float server_m(const uint8_t *const *in, const float *scales, int n,
                      const float *err, size_t i)
{
    size_t q = i / 8;
    unsigned sh = 7 - (unsigned)(i % 8);
    float acc = plus_minus(float_bits(scales[0]), (in[0][q] >> sh) & 1);

    for (int k = 1; k < n; k++)
        acc += plus_minus(float_bits(scales[k]), (in[k][q] >> sh) & 1);
    if ((n & (n - 1)) == 0)
        return acc * (1.0f / (float)n) + err[i];
    return acc / (float)n + err[i];
}

double codec_ref_server_sumsq_block(const uint8_t *const *in,
                                    const float *scales, int n,
                                    const float *err, size_t begin, size_t end)
{
    double acc[16] = {0};

    for (size_t i = begin; i < end; i++) {
        double d = server_m(in, scales, n, err, i);
        acc[(i - begin) % 16] += d * d;
    }
    return combine16(acc);
}

void codec_ref_server_range(const uint8_t *const *in, const float *scales,
                            int n, float *err, size_t begin, size_t end,
                            float sscale, uint8_t *bits)
{
    uint32_t sb = float_bits(sscale);

    for (size_t i = begin; i < end; i += 8) {
        unsigned byte = 0;

        for (int j = 0; j < 8; j++) {
            float m = server_m(in, scales, n, err, i + j);
            unsigned s = m >= 0.0f;
            err[i + j] = m - plus_minus(sb, s);
            byte |= s << (7 - j);
        }
        bits[(i - begin) / 8] = (uint8_t)byte;
    }
}

static size_t block_end(size_t j, size_t len)
{
    return len - j < OBD_CODEC_BLOCK ? len : j + OBD_CODEC_BLOCK;
}

int codec_ref_compress(const float *x, size_t count, float *e, size_t padded,
                       uint8_t *bits, float *scale)
{
    double sum = 0.0;
    float s;
    int rc;

    if (padded == 0 || padded % 8 != 0 || count > padded)
        return OBD_E_INVAL;
    /* Pass 1 reads only, so a non-finite b leaves everything untouched. */
    for (size_t j = 0; j < padded; j += OBD_CODEC_BLOCK)
        sum += codec_ref_sumsq_block(x, count, e, j, block_end(j, padded));
    rc = scale_of(sum, padded, &s);
    if (rc != 0)
        return rc;
    codec_ref_compress_range(x, count, e, 0, padded, s, bits);
    *scale = s;
    return 0;
}

int codec_ref_compress_avg(const float *const *src, int nsrc, size_t count,
                           float *e, float *b, size_t padded, uint8_t *bits,
                           float *scale)
{
    double sum = 0.0;
    float s;
    int rc;

    if (nsrc < 1 || padded == 0 || padded % 8 != 0 || count > padded)
        return OBD_E_INVAL;
    /* Pass 1 writes only the scratch b. */
    for (size_t j = 0; j < padded; j += OBD_CODEC_BLOCK)
        sum += codec_ref_avg_sumsq_block(src, nsrc, count, e, j,
                                         block_end(j, padded), b);
    rc = scale_of(sum, padded, &s);
    if (rc != 0)
        return rc;
    codec_ref_sign_range(b, e, 0, padded, s, bits);
    *scale = s;
    return 0;
}

int codec_ref_server(const uint8_t *const *in, const float *scales, int n,
                     float *err, size_t chunk, uint8_t *bits, float *sscale)
{
    double sum = 0.0;
    float s;
    int rc;

    if (n < 1 || chunk == 0 || chunk % 8 != 0)
        return OBD_E_INVAL;
    for (int k = 0; k < n; k++)
        if (!scale_ok(scales[k]))
            return OBD_E_NONFINITE;
    for (size_t j = 0; j < chunk; j += OBD_CODEC_BLOCK)
        sum += codec_ref_server_sumsq_block(in, scales, n, err, j,
                                            block_end(j, chunk));
    rc = scale_of(sum, chunk, &s);
    if (rc != 0)
        return rc;
    codec_ref_server_range(in, scales, n, err, 0, chunk, s, bits);
    *sscale = s;
    return 0;
}
