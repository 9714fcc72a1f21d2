/* Collective algorithms as state machines. An algorithm is a row
 * {kind, name, start, recv_dest, recv_done, progress, free}: the link layer
 * asks where an arriving payload goes, reports when it is in, and write
 * completions call progress. None of them blocks or frees the op.
 *
 * The registry (coll.c) sits between job.c and the algorithms: job looks
 * an algorithm up by kind and calls its row; an algorithm reaches back
 * only through op->svc, the table job hands every op (the obd_op_*
 * wrappers below), so that job.c, coll.c and the coll_*.c files form a
 * tree (docs/design.md, "Layering"; tests/check_layers.py).
 */
#ifndef OBD_COLL_H
#define OBD_COLL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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

/* What job.c hands an algorithm with every op (op->svc). */
struct obd_opsvc {
    /* Fails op with status and message, announces the failure to every
     * node (unless `announce` is 0: it came from one) and posts the op:
     * its trainers get the answer on a later turn, once no pool task
     * touches their memory. */
    void (*fail)(struct obd_op *op, int status, int announce,
                 const char *message);
    /* The algorithm finished: posts the op to answer its trainers. */
    void (*finish)(struct obd_op *op);
    /* Sends a data frame of this op to node `to`, with payload `len`
     * bytes at `payload`, which stays valid because the op holds a
     * reference until the write completes (the op is then posted).
     * Returns 0 or a negative code; on failure nothing was sent and no
     * reference taken. */
    int (*send)(struct obd_op *op, int to, uint32_t step, uint32_t segment,
                const void *payload, uint32_t len);
    /* A pool task that touches the op's memory (trainer buffers, state)
     * begins or ends; task_end posts the op. */
    void (*task_begin)(struct obd_op *op);
    void (*task_end)(struct obd_op *op);
    /* Two-phase ops: this node finished the op's local phase with status
     * (0: it did its part) and message; every node is told, and
     * op->ann[n].reported (with report_status and report_message) is set
     * for each node that reported (the op is posted as each report
     * arrives). all_reported: 1 once every node has. */
    void (*report)(struct obd_op *op, int status, const char *message);
    int (*all_reported)(const struct obd_op *op);
    /* A buffer of at least `bytes` (its size in *cap), reusing the one the
     * daemon keeps between ops when it is large enough; give it back with
     * scratch_put(op, p, cap). */
    void *(*scratch_get)(struct obd_op *op, size_t bytes, size_t *cap);
    void (*scratch_put)(struct obd_op *op, void *p, size_t cap);
    /* A buffer of exactly `bytes`, one of those the daemon keeps between
     * ops (segbuf_put) when they have that size; NULL without memory.
     * Give it back with segbuf_put(op, p, bytes), which keeps a few. */
    void *(*segbuf_get)(struct obd_op *op, size_t bytes);
    void (*segbuf_put)(struct obd_op *op, void *p, size_t bytes);
    /* 1 when none of the op's writes, receives and pool tasks is still to
     * complete (its memory is the algorithm's alone). */
    int (*idle)(const struct obd_op *op);
};

static inline void obd_op_fail(struct obd_op *op, int status, int announce,
                               const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline void obd_op_fail(struct obd_op *op, int status, int announce,
                               const char *fmt, ...)
{
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    op->svc->fail(op, status, announce, message);
}

static inline void obd_op_finish(struct obd_op *op)
{
    op->svc->finish(op);
}

static inline int obd_op_send(struct obd_op *op, int to, uint32_t step,
                              uint32_t segment, const void *payload,
                              uint32_t len)
{
    return op->svc->send(op, to, step, segment, payload, len);
}

static inline void obd_op_task_begin(struct obd_op *op)
{
    op->svc->task_begin(op);
}

static inline void obd_op_task_end(struct obd_op *op)
{
    op->svc->task_end(op);
}

static inline void obd_op_report(struct obd_op *op, int status,
                                 const char *message)
{
    op->svc->report(op, status, message);
}

static inline int obd_op_all_reported(const struct obd_op *op)
{
    return op->svc->all_reported(op);
}

static inline void *obd_op_scratch_get(struct obd_op *op, size_t bytes,
                                       size_t *cap)
{
    return op->svc->scratch_get(op, bytes, cap);
}

static inline void obd_op_scratch_put(struct obd_op *op, void *p, size_t cap)
{
    op->svc->scratch_put(op, p, cap);
}

static inline void *obd_op_segbuf_get(struct obd_op *op, size_t bytes)
{
    return op->svc->segbuf_get(op, bytes);
}

static inline void obd_op_segbuf_put(struct obd_op *op, void *p, size_t bytes)
{
    op->svc->segbuf_put(op, p, bytes);
}

static inline int obd_op_idle(const struct obd_op *op)
{
    return op->svc->idle(op);
}

struct obd_algo {
    uint32_t kind;
    const char *name;
    /* A trainer's submission, before it becomes an op (ctl.c): the
     * descriptor keeps the fields this kind uses and the others get their
     * fixed values (NULL: every field is used), so that ranks compare
     * what matters. Then check validates it in a job of `world` ranks:
     * 0, with the bytes of the data buffer in *bytes and of the result
     * buffer in *out_bytes (0: the op has none), or OBD_E_INVAL and why,
     * naming the argument that is wrong. */
    void (*normalize)(struct obd_opdesc *d);
    int (*check)(const struct obd_opdesc *d, int world, uint64_t *bytes,
                 uint64_t *out_bytes, char *why, size_t len);
    /* NULL, or checks where the two buffers, resolved in the trainer's
     * shared memory, lie for the trainer of rank `rank`: 0, or
     * OBD_E_INVAL and why. */
    int (*check_buffers)(const void *data, uint64_t bytes, const void *out,
                         uint64_t out_bytes, int rank, char *why, size_t len);
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

/* The full-precision collectives (coll_ring.c), the 1-bit allreduce
 * (coll_onebit.c) and the state ops of a run (coll_efstate.c); the
 * registry (coll.c) lists them all. */
extern const struct obd_algo obd_algo_allreduce;
extern const struct obd_algo obd_algo_reduce_scatter;
extern const struct obd_algo obd_algo_allgather;
extern const struct obd_algo obd_algo_broadcast;
extern const struct obd_algo obd_algo_barrier;
extern const struct obd_algo obd_algo_onebit;
extern const struct obd_algo obd_algo_onebit_reset;
extern const struct obd_algo obd_algo_onebit_snapshot;
extern const struct obd_algo obd_algo_onebit_restore;
extern const struct obd_algo obd_algo_onebit_export;

/* Rows of an algorithm that moves no data: start does everything
 * (barrier-like). Inline, so that every algorithm's file has its own copy
 * and none depends on another. */
static inline void *obd_coll_no_data(struct obd_op *op, int from,
                                     const struct obd_frame *f,
                                     const char **why)
{
    (void)op;
    (void)from;
    (void)f;
    *why = "this op carries no data";
    return NULL;
}

static inline void obd_coll_no_recv(struct obd_op *op, int from,
                                    const struct obd_frame *f)
{
    (void)op;
    (void)from;
    (void)f;
}

static inline void obd_coll_no_progress(struct obd_op *op)
{
    (void)op;
}

/* The check of a kind with no buffer and no argument to check. */
static inline int obd_coll_check_nothing(const struct obd_opdesc *d, int world,
                                         uint64_t *bytes, uint64_t *out_bytes,
                                         char *why, size_t len)
{
    (void)d;
    (void)world;
    (void)why;
    (void)len;
    *bytes = 0;
    *out_bytes = 0;
    return 0;
}

static inline void obd_coll_waiting_on_nobody(const struct obd_op *op,
                                              char *buf, size_t len)
{
    (void)op;
    snprintf(buf, len, "nobody");
}

/* The algorithm for an op kind, or NULL. */
const struct obd_algo *obd_coll_algo(uint32_t kind);

/* Op `seq` of run `run` of `job`, over here, failed on another node: if
 * it was a snapshot that this node committed, its set is dropped here too
 * (a snapshot op that failed anywhere leaves no set; coll_efstate.c). Any
 * other op has no set, and this does nothing. */
void obd_coll_efstate_failed_elsewhere(struct obd_daemon *d, const char *job,
                                       uint64_t run, uint64_t seq);

/* Fingerprint of an op descriptor (op, dtype, count, key, root). */
uint64_t obd_coll_fingerprint(const struct obd_opdesc *d);

#endif
