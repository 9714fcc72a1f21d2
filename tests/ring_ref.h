/* An independent reference of the full-precision ring allreduce's exact
 * results, for the tests that hold the daemon to them bit for bit.
 *
 * The daemon (daemon/reduce.h, daemon/coll_ring.c) computes, for element i
 * of chunk c (ring.h's cut of count elements into `nodes` chunks), in the
 * accumulator type (fp32 for fp16 and bf16):
 *   load(k)  = ((x[k,0] op x[k,1]) op x[k,2]) ...   over node k's trainers
 *   partial  = load(c); then for m = 1 .. nodes-1:
 *              partial = load((c + m) % nodes) op partial
 * (node c sends its load of chunk c first, every next node in the ring
 * adds its own load to the partial it received), then AVG divides by
 * nodes * local in the accumulator type and the result is converted back
 * once. Float addition is commutative bit for bit, so only this grouping
 * matters. The conversions here are the compiler's (_Float16) and plain
 * bit arithmetic for bfloat16, not the daemon's. Only NaN-free inputs. */
#ifndef RING_REF_H
#define RING_REF_H

#include <obcomm.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline size_t rr_size(obcomm_dtype_t t)
{
    return t == OBCOMM_FLOAT16 || t == OBCOMM_BFLOAT16 ? 2
           : t == OBCOMM_FLOAT64 || t == OBCOMM_INT64  ? 8
                                                       : 4;
}

static inline uint16_t rr_f16(float f)
{
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

static inline float rr_f16_to_f32(uint16_t u)
{
    _Float16 h;
    memcpy(&h, &u, 2);
    return (float)h;
}

static inline uint16_t rr_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline float rr_bf16_to_f32(uint16_t u)
{
    uint32_t w = (uint32_t)u << 16;
    float f;
    memcpy(&f, &w, 4);
    return f;
}

static inline uint64_t rr_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* count random elements of dtype t (floats in [-4, 4) with full
 * mantissas, so that sums round; int32 over its whole range, so that
 * sums wrap) from seed. */
static inline void rr_fill(obcomm_dtype_t t, void *buf, size_t count,
                           uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < count; i++) {
        uint64_t r = rr_next(&s);
        float f = (float)((double)(r >> 11) / 9007199254740992.0 * 8.0 - 4.0);
        switch (t) {
        case OBCOMM_FLOAT32:
            ((float *)buf)[i] = f;
            break;
        case OBCOMM_FLOAT16:
            ((uint16_t *)buf)[i] = rr_f16(f);
            break;
        case OBCOMM_BFLOAT16:
            ((uint16_t *)buf)[i] = rr_bf16(f);
            break;
        case OBCOMM_FLOAT64:
            ((double *)buf)[i] =
                (double)(r >> 11) / 9007199254740992.0 * 8.0 - 4.0;
            break;
        case OBCOMM_INT64:
            ((int64_t *)buf)[i] = (int64_t)r;
            break;
        default: /* OBCOMM_INT32 */
            ((int32_t *)buf)[i] = (int32_t)(uint32_t)(r >> 17);
            break;
        }
    }
}

/* Element i of x as a float (for the float dtypes). */
static inline float rr_get(obcomm_dtype_t t, const void *x, size_t i)
{
    switch (t) {
    case OBCOMM_FLOAT16:
        return rr_f16_to_f32(((const uint16_t *)x)[i]);
    case OBCOMM_BFLOAT16:
        return rr_bf16_to_f32(((const uint16_t *)x)[i]);
    default:
        return ((const float *)x)[i];
    }
}

static inline float rr_op_f(obcomm_op_t op, float a, float b)
{
    return op == OBCOMM_MAX   ? (a > b ? a : b)
           : op == OBCOMM_MIN ? (a < b ? a : b)
                              : a + b;
}

static inline uint32_t rr_op_i(obcomm_op_t op, uint32_t a, uint32_t b)
{
    int32_t x = (int32_t)a, y = (int32_t)b;
    return op == OBCOMM_MAX   ? (uint32_t)(x > y ? x : y)
           : op == OBCOMM_MIN ? (uint32_t)(x < y ? x : y)
                              : a + b;
}

/* One element of a ring reduction, every dtype: out[o] (of dtype t) =
 * the reduction of x[k * local + l][i] over node k's trainers l (in
 * order), the nodes' loads grouped as the ring does for a chunk that node
 * `first` sends first: partial = load(first), then partial =
 * load(first + m) op partial for m = 1 .. nodes-1, in the accumulator
 * type (fp32 for fp16, bf16 and fp32; fp64; integers wrapping), AVG
 * dividing by nodes * local (truncating for integers). */
static inline void rr_reduce_at(obcomm_dtype_t t, obcomm_op_t op, int nodes,
                                int local, const void *const *x, size_t i,
                                int first, void *out, size_t o)
{
    int world = nodes * local;
    if (t == OBCOMM_INT32 || t == OBCOMM_INT64) {
        int wide = t == OBCOMM_INT64;
        uint64_t part = 0;
        for (int m = 0; m < nodes; m++) {
            int k = (first + m) % nodes;
            uint64_t ld = 0;
            for (int l = 0; l < local; l++) {
                const void *p = x[k * local + l];
                uint64_t v = wide ? (uint64_t)((const int64_t *)p)[i]
                                  : (uint64_t)(uint32_t)((const int32_t *)p)[i];
                if (l == 0) {
                    ld = v;
                    continue;
                }
                if (wide) {
                    int64_t a = (int64_t)ld, b = (int64_t)v;
                    ld = op == OBCOMM_MAX   ? (uint64_t)(a > b ? a : b)
                         : op == OBCOMM_MIN ? (uint64_t)(a < b ? a : b)
                                            : ld + v;
                } else {
                    ld = rr_op_i(op, (uint32_t)ld, (uint32_t)v);
                }
            }
            if (m == 0) {
                part = ld;
            } else if (wide) {
                int64_t a = (int64_t)ld, b = (int64_t)part;
                part = op == OBCOMM_MAX   ? (uint64_t)(a > b ? a : b)
                       : op == OBCOMM_MIN ? (uint64_t)(a < b ? a : b)
                                          : ld + part;
            } else {
                part = rr_op_i(op, (uint32_t)ld, (uint32_t)part);
            }
        }
        if (wide) {
            int64_t v = (int64_t)part;
            ((int64_t *)out)[o] = op == OBCOMM_AVG ? v / world : v;
        } else {
            int32_t v = (int32_t)(uint32_t)part;
            ((int32_t *)out)[o] = op == OBCOMM_AVG ? v / world : v;
        }
        return;
    }
    if (t == OBCOMM_FLOAT64) {
        double part = 0;
        for (int m = 0; m < nodes; m++) {
            int k = (first + m) % nodes;
            double ld = ((const double *)x[k * local])[i];
            for (int l = 1; l < local; l++) {
                double v = ((const double *)x[k * local + l])[i];
                ld = op == OBCOMM_MAX   ? (ld > v ? ld : v)
                     : op == OBCOMM_MIN ? (ld < v ? ld : v)
                                        : ld + v;
            }
            part = m == 0             ? ld
                   : op == OBCOMM_MAX ? (ld > part ? ld : part)
                   : op == OBCOMM_MIN ? (ld < part ? ld : part)
                                      : ld + part;
        }
        ((double *)out)[o] = op == OBCOMM_AVG ? part / (double)world : part;
        return;
    }
    float part = 0;
    for (int m = 0; m < nodes; m++) {
        int k = (first + m) % nodes;
        float ld = rr_get(t, x[k * local], i);
        for (int l = 1; l < local; l++)
            ld = rr_op_f(op, ld, rr_get(t, x[k * local + l], i));
        part = m == 0 ? ld : rr_op_f(op, ld, part);
    }
    if (op == OBCOMM_AVG)
        part = part / (float)world;
    if (t == OBCOMM_FLOAT16)
        ((uint16_t *)out)[o] = rr_f16(part);
    else if (t == OBCOMM_BFLOAT16)
        ((uint16_t *)out)[o] = rr_bf16(part);
    else
        ((float *)out)[o] = part;
}

/* out[i] for every i: the result of the allreduce of x[k * local + l]
 * (node k's trainer l) over nodes x local trainers. Dtypes fp32, fp16,
 * bf16 and int32. */
static inline void rr_expect(obcomm_dtype_t t, obcomm_op_t op, int nodes,
                             int local, const void *const *x, size_t count,
                             void *out)
{
    for (int c = 0; c < nodes; c++) {
        size_t base = count / (size_t)nodes, extra = count % (size_t)nodes;
        size_t uc = (size_t)c;
        size_t b = uc * base + (uc < extra ? uc : extra);
        size_t e = b + base + (uc < extra ? 1 : 0);
        for (size_t i = b; i < e; i++)
            rr_reduce_at(t, op, nodes, local, x, i, c, out, i);
    }
}

/* out (recv_count elements): what rank `rank` (node rank / local) gets
 * from a reduce-scatter of x (world * recv_count elements each). Node b's
 * block (its ranks' parts) is reduced in the ring's grouping with node
 * b + 1 first: the ring is the allreduce's first half turned by one
 * chunk, so that each node ends with its own block (coll_ring.c). With 2
 * nodes (float addition commutes) and for MAX and MIN this equals the
 * allreduce's values bit for bit. */
static inline void rr_expect_rs(obcomm_dtype_t t, obcomm_op_t op, int nodes,
                                int local, const void *const *x,
                                size_t recv_count, int rank, void *out)
{
    int node = rank / local;
    for (size_t j = 0; j < recv_count; j++)
        rr_reduce_at(t, op, nodes, local, x, (size_t)rank * recv_count + j,
                     (node + 1) % nodes, out, j);
}

#endif
