/* Collective algorithms as state machines. An algorithm is a row
 * {kind, name, start, recv_dest, recv_done, progress, free}: the link layer
 * asks where an arriving payload goes, reports when it is in, and write
 * completions call progress. None of them blocks or frees the op.
 */
#ifndef OBD_COLL_H
#define OBD_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "job.h"

/* The full-precision collectives (coll_ring.c) run their arithmetic on
 * the worker pool when it covers at least this many bytes of accumulator
 * (a reduce-scatter segment; the whole tensor for the local load, the
 * final store and a broadcast's copies, which pool threads then share in
 * pieces of one segment), and inline on the loop thread below it. A pool
 * hop (a thread wake-up and a loop turn) costs some tens of microseconds,
 * more than the arithmetic on a few kilobytes; 256 KiB of fp32 take
 * longer to add than the hop costs, and free the loop for that time. */
#define OBD_RING_POOL_BYTES ((size_t)256 << 10)
/* ... and only in ops whose accumulator holds at least this many
 * segments (segment_bytes): each pool hop sits on the pipeline's critical
 * path, so an op of few segments pays them without gaining overlap. On a
 * 2-core machine running two daemons with 1 MiB segments, the hops cost a
 * 4 MiB op 1.5-2 ms of its 3-4 ms (tests/bench/ring_threads.sh), while a
 * 64 MiB op's loop thread gets back half its time. */
#define OBD_RING_POOL_SEGMENTS 8

struct obd_algo {
    uint32_t kind;
    const char *name;
    /* Sets up op->coll (local reduction included) and sends what it can.
     * Returns 0 or fails the op itself and returns its status. */
    int (*start)(struct obd_op *op);
    /* Where the payload of frame f from node `from` goes: a pointer to
     * exactly f->len bytes, or NULL if the frame is not the one expected
     * (the caller then fails the op as a protocol error, naming why). */
    void *(*recv_dest)(struct obd_op *op, int from, const struct obd_frame *f,
                       const char **why);
    /* The payload asked for by recv_dest has fully arrived. */
    void (*recv_done)(struct obd_op *op, int from, const struct obd_frame *f);
    /* Sends what has become ready; finishes the op when all is done. */
    void (*progress)(struct obd_op *op);
    void (*free)(struct obd_op *op);
    /* Nodes this op still waits on, for timeout messages. */
    void (*waiting_on)(const struct obd_op *op, char *buf, size_t len);
    /* 1 while the running op still needs node `node` (frames to come from
     * it, or frames still to send to it): losing that node fails the op,
     * losing another one that it is done with does not. NULL: always. */
    int (*needs_node)(const struct obd_op *op, int node);
    /* NULL, or 0 while the op cannot start yet; the op then stays in
     * COLLECT and obd_job_kick_all() is called when that may change. */
    int (*can_start)(struct obd_op *op);
    /* NULL, or called as a failed op is freed when it had been agreed on
     * somewhere (op->failed_agreed), so that it may have begun on any
     * node, whether or not it began here. */
    void (*failed)(struct obd_op *op);
};

/* The 1-bit allreduce (coll_onebit.c) and the state ops of a run
 * (coll_efstate.c). */
extern const struct obd_algo obd_algo_onebit;
extern const struct obd_algo obd_algo_onebit_reset;
extern const struct obd_algo obd_algo_onebit_snapshot;
extern const struct obd_algo obd_algo_onebit_restore;
extern const struct obd_algo obd_algo_onebit_export;

/* An algorithm that moves no data: start does everything (barrier-like). */
void *obd_coll_no_data(struct obd_op *op, int from, const struct obd_frame *f,
                       const char **why);

void obd_coll_no_recv(struct obd_op *op, int from, const struct obd_frame *f);
void obd_coll_no_progress(struct obd_op *op);
void obd_coll_waiting_on_nobody(const struct obd_op *op, char *buf, size_t len);

/* The algorithm for an op kind, or NULL. */
const struct obd_algo *obd_coll_algo(uint32_t kind);

/* Fingerprint of an op descriptor (op, dtype, count, key, root). */
uint64_t obd_coll_fingerprint(const struct obd_opdesc *d);

#endif
