/* Internals shared by the codec's implementations (codec.c and
 * codec_avx2.c). Not part of the codec's interface: only those two files
 * include it. */
#ifndef OBD_CODEC_IMPL_H
#define OBD_CODEC_IMPL_H

#include <stddef.h>

#include "codec.h"

/* The AVX2 table. Defined in codec_avx2.c, which is compiled with -mavx2;
 * calling any of its functions on a CPU without AVX2 faults, so only
 * obd_codec_avx2() calls this, after checking the CPU. */
const struct obd_codec_impl *obd_codec_avx2_table(void);

/* Kernel bodies taking the mode of a lazy state (and the store kind) as a
 * parameter are instantiated once per constant value with this, so the
 * per-element code has no branch on them. */
#define ALWAYS_INLINE inline __attribute__((always_inline))

/* The fixed pairwise combine of the 16 lane accumulators of a norm block.
 * Both implementations call this one function, so the combine cannot
 * drift apart between them. */
static inline double combine16(const double a[16])
{
    double p[8], q[4];

    for (int j = 0; j < 8; j++)
        p[j] = a[2 * j] + a[2 * j + 1];
    for (int j = 0; j < 4; j++)
        q[j] = p[2 * j] + p[2 * j + 1];
    return (q[0] + q[1]) + (q[2] + q[3]);
}

#endif
