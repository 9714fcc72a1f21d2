/* The per-element passes of 1-bit Adam (client/adam.c; docs/design.md,
 * "The idea"): plain functions over memory, so that a reference can be
 * written from this header alone and tested without a daemon
 * (tests/test_adam_kernels.c).
 *
 * Every pass exists as portable C and as AVX2 (adam_avx2.c, compiled with
 * -mavx2 and without FMA). Both perform, element by element, exactly the
 * IEEE fp32 operations written below in the order written (the project
 * builds with -ffp-contract=off, and sqrt and division are correctly
 * rounded in both), so their results are bit-identical. All arithmetic is
 * fp32; ((a*b)*c) means the products are rounded in that order. */
#ifndef OBC_ADAM_KERNELS_H
#define OBC_ADAM_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* A step's constants. mc and vc are the bias corrections
 * 1/(1 - beta1^t) and 1/(1 - beta2^tv) of the step, or exactly 1.0f
 * without bias correction. gscale multiplies the gradient before anything
 * else (the warm-up's clipping of the average, the compression stage's
 * clipping of the local gradient); exactly 1.0f leaves it as it is, since
 * x*1.0f == x. */
struct obc_adam_coef {
    float lr, beta1, beta2, eps, weight_decay;
    float mc, vc;
    float gscale;
};

/* The factor array's value for a masked coordinate. Every other
 * coordinate's factor is 1/(sqrt(v*vc) + eps) >= +0.0f (+0.0f only when
 * the denominator overflows), so the sign bit alone says "masked" and an
 * overflowing denominator is not mistaken for the mask. */
#define OBC_ADAM_MASKED (-0.0f)

/* The frozen factor of one coordinate: 1.0f / (sqrtf(v * vc) + eps). */
static inline float obc_adam_factor(float v, float vc, float eps)
{
    return 1.0f / (sqrtf(v * vc) + eps);
}

/* Function table of one implementation. Every pointer borrows its
 * buffers for the duration of the call only; the arrays have n elements,
 * any alignment, and do not overlap (except where said). */
struct obc_adam_kernels {
    const char *name; /* "portable" or "avx2" */

    /* The warm-up step, after g holds the averaged gradient; for each i,
     * with gi = g[i]*gscale:
     *   m[i] = b1*m[i] + (1-b1)*gi
     *   v[i] = b2*v[i] + ((1-b2)*gi)*gi
     *   u    = (m[i]*mc) / (sqrtf(v[i]*vc) + eps) + wd*p[i]
     *   p[i] = p[i] - lr*u
     * with the new m[i] and v[i], b1 = beta1, b2 = beta2,
     * wd = weight_decay, and 1-b1, 1-b2 rounded to fp32 once. */
    void (*warmup)(size_t n, const float *g, float *m, float *v, float *p,
                   const struct obc_adam_coef *k);

    /* The compression stage's local momentum:
     *   next[i] = b1*m[i] + (1-b1)*(grad[i]*gscale).
     * next may be grad (each element is read before it is written). */
    void (*momentum)(size_t n, const float *m, const float *grad, float *next,
                     float beta1, float gscale);

    /* The compression step after the 1-bit average m, with the frozen
     * factors d (d[i] is OBC_ADAM_MASKED or obc_adam_factor of v[i]);
     * for each i:
     *   masked: m[i] = 0.0f and um = +0.0f
     *   else:   um = (m[i]*mc)*d[i]             (m[i] unchanged)
     *   u    = um + wd*p[i]
     *   p[i] = p[i] - lr*u
     * A masked coordinate thus moves exactly as if its momentum had been
     * set to 0 first. m is written only where masked. */
    void (*compress)(size_t n, float *m, const float *d, float *p,
                     const struct obc_adam_coef *k);

    /* Mixed precision's conversions, exactly those of proto/half.h:
     * widen: dst[i] = f32(src[i]) * scale, src fp16 (bf16 = 0) or bf16
     *        (the conversion is exact; scale 1.0f leaves it so);
     * narrow: dst[i] = src[i] rounded to fp16 or bf16, nearest even,
     *        NaN quiet with the payload bits that fit. */
    void (*widen)(size_t n, const uint16_t *src, int bf16, float scale,
                  float *dst);
    void (*narrow)(size_t n, const float *src, int bf16, uint16_t *dst);
};

/* One pass over a whole tensor, for obc_adam_run: kind says which
 * kernel, and the pointers it reads (warm-up: g, m, v, p; momentum: m, g
 * as grad, next; compress: m, d, p; widen: g16 into next, times
 * k.gscale), all n elements long. Mixed precision, fused in blocks that
 * stay in the cache: with g16 set the momentum pass reads its gradient
 * from g16 (fp16, or bf16 when bf16 is set) instead of g, widening each
 * block just before the kernel uses it; with model16 set the warm-up and
 * compress passes write each block of new parameters, narrowed, into
 * model16 right after the kernel wrote it. The results are those of the
 * separate passes, bit for bit. */
enum obc_adam_pass_kind {
    OBC_ADAM_WARMUP,
    OBC_ADAM_MOMENTUM,
    OBC_ADAM_COMPRESS,
    OBC_ADAM_WIDEN
};

struct obc_adam_pass {
    enum obc_adam_pass_kind kind;
    size_t n;
    const float *g, *d;
    float *m, *v, *p, *next;
    const uint16_t *g16;
    uint16_t *model16;
    int bf16;
    struct obc_adam_coef k;
};

/* Below this many elements per thread a pass is not split: starting a
 * thread costs tens of microseconds, a 64 Ki-element pass about a hundred. */
#define OBC_ADAM_SPLIT_MIN (64 * 1024)

/* Runs the pass with kern on up to `threads` threads: the calling thread
 * takes the first range, threads started for the call (and joined before
 * it returns) the others; ranges are cut at multiples of 16 elements and
 * hold at least OBC_ADAM_SPLIT_MIN each. Every element is computed alone,
 * so the result is bit-identical to one call over the whole tensor. A
 * thread that cannot be started leaves its range to the calling thread.
 * Nothing persists between calls, so a fork() between steps (a data
 * loader's workers) finds no thread of ours. Returns the threads used. */
int obc_adam_run(const struct obc_adam_kernels *kern,
                 const struct obc_adam_pass *ps, int threads);

/* The implementations. obc_adam_kernels_avx2() returns NULL when the CPU
 * (or the build) lacks AVX2; obc_adam_kernels_best() returns it when there
 * is one, else the portable table. */
const struct obc_adam_kernels *obc_adam_kernels_portable(void);
const struct obc_adam_kernels *obc_adam_kernels_avx2(void);
const struct obc_adam_kernels *obc_adam_kernels_best(void);

/* The automatic momentum mask's threshold on v (obcomm_adam_set_auto_mask,
 * and 0/1 Adam's and 1-bit LAMB's): coordinate i is held when v[i] <= it.
 * (float)((ratio * sqrt(mean v))^2), the mean summed in double in index
 * order, so every rank computes the same bits. */
float obc_mask_threshold(const float *v, size_t n, float ratio);

/* The AVX2 table, defined in adam_avx2.c (compiled with -mavx2): calling
 * any of its functions on a CPU without AVX2 faults, so only
 * obc_adam_kernels_avx2() calls this, after checking the CPU. */
const struct obc_adam_kernels *obc_adam_avx2_table(void);

#endif
