/* The tests' bit-identity reference of the 1-bit codec: the arithmetic of
 * daemon/codec.h carried out in two passes over memory, in portable C.
 *
 * Pass 1 forms b = x + e (or the average of several sources plus e, or
 * the server's m) and sums its squares in exactly the block and lane order
 * codec.h specifies; the scale follows from the block sums; pass 2 writes
 * the signs and the new error e = b -+ scale. The error is thus kept
 * eagerly, as e itself. The daemon's lazy kernels keep it instead as the
 * previous step's b and scale and form e inside the next pass; codec.h
 * promises that a sequence of lazy steps gives the bits, the scales and
 * (through lazy_error) the errors of the same sequence of steps here,
 * byte for byte, and the tests hold both implementations of the lazy
 * kernels (portable and AVX2) to that with memcmp.
 *
 * Written in the same lane structure as the daemon's kernels (16 double
 * accumulators for a norm, 8 elements per packed byte), because the sum of
 * squares must be formed in the same order; every other operation is
 * element-wise IEEE fp32 arithmetic, identical in any order once
 * -ffp-contract=off forbids fused multiply-adds. It shares no code with
 * the daemon: a slip in a daemon kernel cannot hide by being copied here.
 *
 * All pointers borrow their buffers for the duration of the call. `x` may
 * be shorter than the padded range: element i reads as 0.0f for i >= count.
 * Ranges [begin, end) are element indices into the padded tensor (or the
 * chunk); `begin` is a multiple of 8. */
#ifndef CODEC_REF_H
#define CODEC_REF_H

#include <stddef.h>
#include <stdint.h>

/* Sum of squares of b = x + e over [begin, end) in the lane order of
 * codec.h (element i into accumulator (i - begin) % 16, then the pairwise
 * tree). `end` need not be a multiple of 8. Reads only. */
double codec_ref_sumsq_block(const float *x, size_t count, const float *e,
                             size_t begin, size_t end);

/* Signs of b = x + e over [begin, end) into bits (bits[0] holds element
 * begin) and e_i = b_i -+ scale in place. `end - begin` is a multiple of
 * 8. */
void codec_ref_compress_range(const float *x, size_t count, float *e,
                              size_t begin, size_t end, float scale,
                              uint8_t *bits);

/* Pass 1 over an average: for i in [begin, end), a_i = src[0][i] + ... +
 * src[nsrc-1][i] left to right in fp32 (0.0f for i >= count), a_i / nsrc
 * in fp32 (a multiply by the exact 1/nsrc for a power-of-two nsrc, which
 * rounds the same), b[i] = a_i + e[i] stored; returns the sum of squares
 * of those b_i as codec_ref_sumsq_block does, so with nsrc == 1 exactly
 * codec_ref_sumsq_block(src[0], count, e, begin, end). b is indexed like
 * e and overlaps neither src nor e; only b[begin..end) is written. */
double codec_ref_avg_sumsq_block(const float *const *src, int nsrc,
                                 size_t count, const float *e, size_t begin,
                                 size_t end, float *b);

/* Pass 2 over a stored b: signs of b over [begin, end) into bits and
 * e[i] = b[i] -+ scale. `end - begin` is a multiple of 8; e does not
 * overlap b. */
void codec_ref_sign_range(const float *b, float *e, size_t begin, size_t end,
                          float scale, uint8_t *bits);

/* Server pass 1: sum of squares of m over [begin, end) of a chunk. in[k]
 * is participant k's packed bits of the whole chunk, scales[k] its scale,
 * err the chunk's server error. */
double codec_ref_server_sumsq_block(const uint8_t *const *in,
                                    const float *scales, int n,
                                    const float *err, size_t begin, size_t end);

/* Server pass 2: signs of m into bits (bits[0] holds element begin) and
 * err_i = m_i -+ sscale in place. `end - begin` is a multiple of 8. */
void codec_ref_server_range(const uint8_t *const *in, const float *scales,
                            int n, float *err, size_t begin, size_t end,
                            float sscale, uint8_t *bits);

/* Whole-tensor steps on one thread, returning 0, OBD_E_INVAL (bad
 * sizes, nsrc or n < 1; nothing written) or OBD_E_NONFINITE (a b_i or
 * m_i not finite, or a participant scale negative or not finite).
 *
 * Worker: x has `count` elements, e and the padded tensor `padded`, bits
 * padded / 8 bytes. On success writes bits, *scale and the new e; on
 * ENONFINITE writes nothing. */
int codec_ref_compress(const float *x, size_t count, float *e, size_t padded,
                       uint8_t *bits, float *scale);

/* Worker over the average of nsrc >= 1 sources of `count` elements each,
 * through the scratch buffer b (`padded` elements, apart from src and e),
 * which holds b = average + old e afterwards. On ENONFINITE, e, bits and
 * *scale are untouched, b is not. With nsrc == 1, bits, *scale and e are
 * those of codec_ref_compress. */
int codec_ref_compress_avg(const float *const *src, int nsrc, size_t count,
                           float *e, float *b, size_t padded, uint8_t *bits,
                           float *scale);

/* Server step for one chunk of `chunk` elements (a multiple of 8): on
 * success writes bits (chunk / 8 bytes), *sscale and the new err; on
 * ENONFINITE writes nothing. */
int codec_ref_server(const uint8_t *const *in, const float *scales, int n,
                     float *err, size_t chunk, uint8_t *bits, float *sscale);

#endif
