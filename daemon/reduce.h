/* Element-wise reductions over memory: the arithmetic of every
 * full-precision collective.
 *
 * Nothing here knows about sockets, threads or libuv. A reduction runs in
 * three steps over an accumulator buffer:
 *
 *   obd_reduce_load   acc = src[0] op src[1] op ... (the local trainers)
 *   obd_reduce_acc    acc = acc op in               (partials from peers)
 *   obd_reduce_store  dst = acc, converted back (and divided, for AVG)
 *
 * The accumulator type of a dtype (obd_dtype_acc_size): fp16 and bf16
 * accumulate in fp32; every other dtype accumulates in its own type.
 *
 * Exact semantics, which a reference must reproduce:
 *   - Operands are combined left to right in the order given:
 *     ((src[0] op src[1]) op src[2]) ..., and acc op in. Float results
 *     therefore depend only on that order, never on the count, alignment
 *     or how the compiler vectorised the loops.
 *   - SUM and AVG add. Integer addition wraps modulo 2^32 or 2^64 (it is
 *     done in unsigned arithmetic, so overflow is defined).
 *   - MAX and MIN on floats propagate NaN: if either operand is NaN the
 *     result is NaN (as torch.maximum / torch.minimum do). When two
 *     operands compare equal (+0.0 and -0.0) the right-hand one wins.
 *   - AVG divides only at store: floats compute acc / divisor in the
 *     accumulator type (fp32 for fp16 and bf16, then round once to the
 *     dtype); integers use C division, which truncates toward zero
 *     (-7 / 2 == -3).
 *   - fp32 -> fp16 and fp32 -> bf16 round to nearest, ties to even;
 *     values too large become +-Inf; subnormals are produced exactly; NaN
 *     stays NaN and comes out quiet (payload kept where it fits).
 *     Widening to fp32 is exact and also quiets NaN.
 *
 * dtype and op must be valid (obd_dtype_valid, obd_op_valid); passing
 * anything else to a reduction is a broken invariant: the daemon logs it
 * and aborts (OBD_ENFORCE, daemon/enforce.h), in every build.
 * All pointers are borrowed for the duration of the call only. Counts are
 * in elements. Nothing allocates and nothing can fail.
 */
#ifndef OBD_REDUCE_H
#define OBD_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "obcomm.h"

/* Bytes of one element of the dtype; 0 for an invalid dtype. */
size_t obd_dtype_size(obcomm_dtype_t dtype);
/* Bytes of one element of the dtype's accumulator type (4 for fp16 and
 * bf16, else obd_dtype_size); 0 for an invalid dtype. */
size_t obd_dtype_acc_size(obcomm_dtype_t dtype);
/* 1 if the value names an obcomm_dtype_t / obcomm_op_t, else 0. Take an
 * int so that values read off the wire can be checked before the cast. */
int obd_dtype_valid(int dtype);
int obd_op_valid(int op);
/* Lower-case names ("float32", "bfloat16", "sum", "avg", ...); "invalid"
 * for anything else. Static strings. */
const char *obd_dtype_name(obcomm_dtype_t dtype);
const char *obd_op_name(obcomm_op_t op);

/* Half-precision conversions; see the file comment for rounding. */
uint16_t obd_f32_to_f16(float f);
float obd_f16_to_f32(uint16_t h);
uint16_t obd_f32_to_bf16(float f);
float obd_bf16_to_f32(uint16_t h);

/* acc[i] = src[0][i] op src[1][i] op ... op src[nsrc-1][i] for i in
 * [0, count), converted to the accumulator type. Every source is read once,
 * in src order. AVG loads a sum. nsrc >= 1.
 *
 * acc holds count accumulator elements and must not overlap any source,
 * with one exception: when nsrc == 1 and the accumulator type is the dtype
 * itself (fp32, fp64, int32, int64), acc may be src[0] exactly (the load is
 * then a no-op). */
void obd_reduce_load(obcomm_dtype_t dtype, obcomm_op_t op, void *acc,
                     const void *const *src, int nsrc, size_t count);

/* acc[i] = acc[i] op in[i] for i in [0, count), both in the accumulator
 * type. AVG adds. acc and in must not overlap. */
void obd_reduce_acc(obcomm_dtype_t dtype, obcomm_op_t op, void *acc,
                    const void *in, size_t count);

/* dst[i] = acc[i] converted to the dtype; for AVG, acc[i] / divisor
 * converted. divisor >= 1 for AVG and is ignored for every other op. dst
 * must not overlap acc. */
void obd_reduce_store(obcomm_dtype_t dtype, obcomm_op_t op, void *dst,
                      const void *acc, size_t count, int divisor);

/* obd_reduce_store into each of dst[0..ndst-1] (ndst >= 1), reading acc
 * once: every destination receives the same bytes. Destinations must not
 * overlap acc or each other. */
void obd_reduce_store_many(obcomm_dtype_t dtype, obcomm_op_t op,
                           void *const *dst, int ndst, const void *acc,
                           size_t count, int divisor);

/* acc[i] = acc[i] / divisor in place, exactly as obd_reduce_store with
 * AVG computes it, for the dtypes that accumulate in their own type (fp32,
 * fp64, int32, int64; integers truncate toward zero). divisor >= 1. Other
 * dtypes are left untouched. */
void obd_reduce_div_in_place(obcomm_dtype_t dtype, void *acc, size_t count,
                             int divisor);

#endif
