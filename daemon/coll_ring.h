/* The core that the full-precision collectives share (coll_ring.c):
 * pieces of arithmetic run inline or on the worker pool, the final store
 * or copy to the local trainers, data frames that fail the op when they
 * cannot leave, and the argument check of the collectives over typed
 * elements. The ring allreduce lives in coll_ring.c beside it; the
 * reduce-scatter (coll_reduce_scatter.c) is the same ring stopped halfway
 * and uses its row functions; the allgather (coll_allgather.c) and the
 * broadcast (coll_broadcast.c) keep states of their own that embed
 * struct obd_coll_ring_core.
 *
 * Events (a piece done, a frame in) record what happened; each
 * algorithm's progress makes every other transition. A failed op is
 * answered only once no piece touches its memory (job.h), and nothing a
 * piece touches is freed before the op.
 */
#ifndef OBD_COLL_RING_H
#define OBD_COLL_RING_H

#include "coll.h"

#include <obcomm.h>

/* Phases of a ring collective or a broadcast, in order. */
enum obd_coll_ring_phase {
    OBD_RING_PH_RING,  /* the local load or copies, frames, reductions */
    OBD_RING_PH_STORE, /* the result goes to the local trainers */
    OBD_RING_PH_DONE,
};

enum obd_coll_ring_piece_kind {
    OBD_RING_PC_LOAD,  /* the local trainers' inputs reduced into acc */
    OBD_RING_PC_ACC,   /* a received segment reduced into acc */
    OBD_RING_PC_STORE, /* acc converted into the trainers' buffers */
    OBD_RING_PC_COPY,  /* bytes copied to the trainers' buffers */
};

struct obd_coll_ring_core;

/* A piece takes what it touches from the op when it is made, so that on
 * a pool thread it reads nothing the loop thread owns: pointers into acc,
 * a segment buffer and the trainers' shared memory, which all stay valid
 * while the op holds the piece (obd_op_task_begin). */
struct obd_coll_ring_piece {
    uv_work_t req;
    struct obd_op *op;
    struct obd_coll_ring_core *core;
    enum obd_coll_ring_piece_kind kind;
    obcomm_dtype_t dtype;
    obcomm_op_t redop;
    int divisor;          /* STORE: AVG's; ACC: > 0 to divide after */
    size_t begin, count;  /* elements of acc (bytes for COPY) */
    uint8_t *acc;         /* acc + begin (COPY: the source + begin) */
    const uint8_t *in;    /* ACC: the received segment */
    const uint8_t *local; /* ACC: the trainer's segment, or NULL */
    size_t idx;           /* ACC, LOAD: the algorithm's index */
    uint64_t begin_ns, end_ns;
    int pooled;
    int nptr;
    void *ptr[]; /* LOAD: sources; STORE, COPY: destinations (+ begin) */
};

/* What every full-precision collective's state begins with. */
struct obd_coll_ring_core {
    struct obd_daemon *d;
    int n, r;
    size_t count; /* elements (bytes for allgather and broadcast) */
    size_t esz;   /* bytes per element on the wire */
    size_t seg;   /* elements per segment */
    uint8_t *acc;
    size_t acc_bytes;
    int zero_copy; /* acc is trainer memory, not a scratch buffer */
    enum obd_coll_ring_phase phase;
    uint64_t load_ns; /* uv_hrtime() when the local load or copies began */
    int load_traced;
    size_t pieces; /* LOAD, STORE or COPY pieces not yet done */
    /* Called on the loop thread as an ACC or LOAD piece ends (before a
     * LOAD piece leaves `pieces`): the algorithm records it. NULL when
     * the algorithm makes none. */
    void (*piece_done)(struct obd_coll_ring_core *core,
                       const struct obd_coll_ring_piece *p);
};

/* Sets up core for op: count elements of esz bytes on the wire, segments
 * of the configured segment_bytes. */
void obd_coll_ring_core_init(struct obd_coll_ring_core *core, struct obd_op *op,
                             size_t count, size_t esz);
/* Gives acc back to the daemon unless it is trainer memory. */
void obd_coll_ring_core_fini(struct obd_coll_ring_core *core,
                             struct obd_op *op);

/* A piece with room for nptr pointers, or NULL without memory. */
struct obd_coll_ring_piece *
obd_coll_ring_piece_new(struct obd_op *op, struct obd_coll_ring_core *core,
                        enum obd_coll_ring_piece_kind kind, int nptr);
/* Runs piece p (taking ownership, NULL meaning allocation failed) inline,
 * or queues it on the pool when `pool`. On failure fails the op and
 * returns non-zero. */
int obd_coll_ring_piece_go(struct obd_op *op, struct obd_coll_ring_piece *p,
                           int pool);

/* 1 when work on `bytes` bytes of the op's accumulator goes to the pool
 * (coll.h). */
int obd_coll_ring_use_pool(const struct obd_coll_ring_core *core, size_t bytes);
/* How many loads, and how many reductions, of one op may be on the pool
 * at once. */
size_t obd_coll_ring_pool_depth(const struct obd_coll_ring_core *core);

/* Runs STORE (from acc into dst, AVG's division included) or COPY (from
 * src, skipping a destination that is src) over the whole of core->count:
 * on the pool in pieces of one segment when it is large, else inline in
 * one piece. On failure fails the op and returns non-zero; pieces already
 * queued run to their end. */
int obd_coll_ring_spread(struct obd_op *op, struct obd_coll_ring_core *core,
                         enum obd_coll_ring_piece_kind kind, void *const *dst,
                         const uint8_t *src);
/* PH_STORE: the op finishes once no piece is left. */
void obd_coll_ring_store_progress(struct obd_op *op,
                                  struct obd_coll_ring_core *core);

/* Sends one data frame; on failure fails the op and returns non-zero. */
int obd_coll_ring_send(struct obd_op *op, int to, uint32_t step,
                       uint32_t segment, const void *payload, size_t len);

/* The check of a collective over elements of a dtype (struct obd_algo,
 * check), called `name` in messages, whose larger buffer holds n * count
 * elements; its reduction is checked unless `reduces` is 0. Sets *bytes
 * to the bytes of count elements. */
int obd_coll_ring_check_typed(const struct obd_opdesc *d, const char *name,
                              uint64_t n, int reduces, uint64_t *bytes,
                              char *why, size_t len);

/* The row functions of the ring allreduce, which the reduce-scatter's row
 * uses too (op->desc.kind tells them apart). */
int obd_coll_ring_start(struct obd_op *op);
void *obd_coll_ring_recv_dest(struct obd_op *op, int from,
                              const struct obd_frame *f, const char **why);
void obd_coll_ring_recv_done(struct obd_op *op, int from,
                             const struct obd_frame *f);
void obd_coll_ring_progress(struct obd_op *op);
void obd_coll_ring_free(struct obd_op *op);
void obd_coll_ring_waiting_on(const struct obd_op *op, char *buf, size_t len);
int obd_coll_ring_needs_node(const struct obd_op *op, int node);

/* 1 once cursor (step, seg) has passed segment (s, j). */
static inline int obd_coll_ring_passed(int step, size_t seg, int s, size_t j)
{
    return step > s || (step == s && seg > j);
}

#endif
