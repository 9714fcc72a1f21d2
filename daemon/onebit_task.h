/* The codec work of one step of the 1-bit allreduce, as plain data: which
 * pass, over which elements, reading and writing which memory. A task runs
 * on a worker thread and touches exactly the ranges written here, which
 * the loop side (coll_onebit.c) guarantees no one else touches meanwhile.
 * Pure: no libuv, no sockets, testable on its own.
 *
 * The passes (docs/design.md, "The compressed allreduce, exactly"; codec.h
 * "Lazy error feedback"; n nodes, padded length N, chunk C), each touching
 * every element once:
 *   WORKER    the lazy worker step over whole codec blocks [begin, end)
 *             of the padded tensor: b = avg(trainers) + the error of the
 *             key's worker state, read from and written back to that
 *             state in place, the signs of b into our bits and the
 *             blocks' sums of squares; the worker scale follows from the
 *             sums once every block is done;
 *   SERVER    the lazy server step over [begin, end) of our chunk (whole
 *             codec blocks of the chunk): m from every node's bits and
 *             scale plus the server state's error, written back in place,
 *             the signs of m into the result bits and the blocks' sums;
 *             the server scale follows from the sums;
 *   DECODE    writes scale * sign over [begin, end) (clipped to count)
 *             into every local trainer's buffer, with streaming stores
 *             when the trainers' buffers are large (ctx.stream).
 * With one node there is nothing to compress, and one pass instead:
 *   AVERAGE   the exact average of the trainers over [begin, end) of the
 *             tensor (count elements, no padding), into every trainer's
 *             buffer: src_0[i] + src_1[i] + ... left to right in fp32,
 *             divided by (float)ls, as obd_reduce_load and
 *             obd_reduce_store with OBCOMM_AVG compute it. With one
 *             trainer that division by 1 changes only NaNs (x / 1.0f is
 *             x, bit for bit, for every other float: the quotient is
 *             exact), so the pass reads the tensor and rewrites only the
 *             blocks that hold a NaN; it reports the bytes it wrote
 *             (task.written). Uses only ctx.ls, ctx.count and ctx.dst.
 *             begin is a multiple of OBD_ONEBIT_AVG_BLOCK, so that the
 *             reduction kernels see the blocks they see over the whole
 *             tensor: the scalar tail of reduce.c's two-source load may
 *             add its operands the other way round from its vector body,
 *             which decides whose payload a sum of two NaNs keeps.
 */
#ifndef OBD_ONEBIT_TASK_H
#define OBD_ONEBIT_TASK_H

#include <stddef.h>
#include <stdint.h>

#include "codec.h"

/* Trainer tensors of at least this many bytes are decoded with streaming
 * stores (decompress_stream): larger than a last-level cache, so they are
 * not in it when the trainer reads them anyway. */
#define OBD_ONEBIT_STREAM_BYTES (8u << 20)

/* Elements of an AVERAGE block (a multiple of 16). */
#define OBD_ONEBIT_AVG_BLOCK 2048

enum obd_onebit_pass {
    OBD_ONEBIT_WORKER,
    OBD_ONEBIT_SERVER,
    OBD_ONEBIT_DECODE,
    OBD_ONEBIT_AVERAGE
};

/* What every task of one op shares (borrowed from the op). */
struct obd_onebit_ctx {
    const struct obd_codec_impl *impl;
    int n;                       /* nodes */
    int ls;                      /* local trainers */
    size_t count;                /* elements of the trainers' tensors */
    float *const *dst;           /* the trainers' buffers */
    struct obd_codec_lazy wprev; /* the worker state a WORKER step reads */
    float *wnext;                /* padded; where it writes (may be v) */
    struct obd_codec_lazy sprev; /* the server state, one chunk */
    float *snext;                /* one chunk */
    double *wsums;               /* per block of the padded tensor */
    double *ssums;               /* per block of the chunk */
    uint8_t *bits;               /* our signs, padded / 8 */
    const uint8_t *const *in;    /* node k's signs of our chunk */
    const float *scales;         /* node k's worker scale */
    uint8_t *out;                /* every chunk's result signs, padded / 8 */
    size_t chunk_begin;          /* our chunk's first element (r * C) */
    int stream;                  /* DECODE with decompress_stream */
};

struct obd_onebit_task {
    enum obd_onebit_pass pass;
    size_t begin, end; /* elements: of the padded tensor, or (SERVER) of
                          our chunk */
    float scale;       /* DECODE: the chunk's server scale */
    size_t written;    /* AVERAGE: bytes of trainer buffers it wrote */
};

/* Runs one task (on a worker thread); writes only t->written. */
void obd_onebit_task_run(const struct obd_onebit_ctx *ctx,
                         struct obd_onebit_task *t);

#endif
