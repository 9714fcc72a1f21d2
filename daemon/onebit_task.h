/* The codec work of one step of the 1-bit allreduce, as plain data: which
 * pass, over which elements, reading and writing which memory. A task runs
 * on a worker thread and touches exactly the ranges written here, which
 * the loop side (coll_onebit.c) guarantees no one else touches meanwhile.
 * Pure: no libuv, no sockets, testable on its own.
 *
 * The passes (DESIGN.md section 2; n nodes, padded length N, chunk C):
 *   NORM      block sums of squares of b = avg(trainers) + werr over whole
 *             codec blocks [begin, end); with several trainers also stores
 *             b (avg + werr is formed once);
 *   SIGNS     packs the signs of b over [begin, end) and updates werr with
 *             the worker scale (with one trainer it reads the trainer's
 *             tensor again instead of a stored b);
 *   SRV_NORM  block sums of squares of the server's m over [begin, end) of
 *             its chunk, from every node's bits and scale plus serr;
 *   SRV_SIGNS packs the signs of m over [begin, end) and updates serr with
 *             the server scale;
 *   DECODE    writes scale * sign over [begin, end) (clipped to count)
 *             into every local trainer's buffer.
 */
#ifndef OBD_ONEBIT_TASK_H
#define OBD_ONEBIT_TASK_H

#include <stddef.h>
#include <stdint.h>

#include "codec.h"

enum obd_onebit_pass {
    OBD_ONEBIT_NORM,
    OBD_ONEBIT_SIGNS,
    OBD_ONEBIT_SRV_NORM,
    OBD_ONEBIT_SRV_SIGNS,
    OBD_ONEBIT_DECODE
};

/* What every task of one op shares (borrowed from the op). */
struct obd_onebit_ctx {
    const struct obd_codec_impl *impl;
    int n;                    /* nodes */
    int ls;                   /* local trainers */
    size_t count;             /* elements of the trainers' tensors */
    float *const *dst;        /* the trainers' buffers */
    float *werr;              /* padded */
    float *serr;              /* one chunk */
    float *b;                 /* padded; NORM's output when ls > 1 */
    double *wsums;            /* per block of the padded tensor */
    double *ssums;            /* per block of the chunk */
    uint8_t *bits;            /* our signs, padded / 8 */
    const uint8_t *const *in; /* node k's signs of our chunk */
    const float *scales;      /* node k's worker scale */
    uint8_t *out;             /* every chunk's result signs, padded / 8 */
    size_t chunk_begin;       /* our chunk's first element (r * C) */
};

struct obd_onebit_task {
    enum obd_onebit_pass pass;
    size_t begin, end; /* elements: of the padded tensor, or (SRV_*) of
                          our chunk */
    float scale;       /* SIGNS: worker scale; SRV_SIGNS: server scale;
                          DECODE: the chunk's server scale */
};

/* Runs one task (on a worker thread). */
void obd_onebit_task_run(const struct obd_onebit_ctx *ctx,
                         const struct obd_onebit_task *t);

#endif
