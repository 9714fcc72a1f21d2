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

/* A step's constants. mc and vc are the bias corrections
 * 1/(1 - beta1^t) and 1/(1 - beta2^tv) of the step, or exactly 1.0f
 * without bias correction. */
struct obc_adam_coef {
    float lr, beta1, beta2, eps, weight_decay;
    float mc, vc;
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

    /* The warm-up step, after g holds the averaged gradient; for each i:
     *   m[i] = b1*m[i] + (1-b1)*g[i]
     *   v[i] = b2*v[i] + ((1-b2)*g[i])*g[i]
     *   u    = (m[i]*mc) / (sqrtf(v[i]*vc) + eps) + wd*p[i]
     *   p[i] = p[i] - lr*u
     * with the new m[i] and v[i], b1 = beta1, b2 = beta2,
     * wd = weight_decay, and 1-b1, 1-b2 rounded to fp32 once. */
    void (*warmup)(size_t n, const float *g, float *m, float *v, float *p,
                   const struct obc_adam_coef *k);

    /* The compression stage's local momentum:
     *   next[i] = b1*m[i] + (1-b1)*grad[i].
     * next may be grad (each element is read before it is written). */
    void (*momentum)(size_t n, const float *m, const float *grad, float *next,
                     float beta1);

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
};

/* The implementations. obc_adam_kernels_avx2() returns NULL when the CPU
 * (or the build) lacks AVX2; obc_adam_kernels_best() returns it when there
 * is one, else the portable table. */
const struct obc_adam_kernels *obc_adam_kernels_portable(void);
const struct obc_adam_kernels *obc_adam_kernels_avx2(void);
const struct obc_adam_kernels *obc_adam_kernels_best(void);

/* The AVX2 table, defined in adam_avx2.c (compiled with -mavx2): calling
 * any of its functions on a CPU without AVX2 faults, so only
 * obc_adam_kernels_avx2() calls this, after checking the CPU. */
const struct obc_adam_kernels *obc_adam_avx2_table(void);

#endif
