/* Jobs and their ops: matching every op across the local trainers and the
 * nodes, deadlines, completion and failure.
 *
 * An op is identified by (job, seq), seq being every trainer's own op
 * counter. Life of an op on a node:
 *   COLLECT  local trainers submit; when all have, their descriptors are
 *            compared and the node announces its view (or why it failed)
 *            to every other node;
 *            when every node's announce is in, all nodes compare the same
 *            set and reach the same verdict;
 *   RUN      the algorithm (coll.h) moves data;
 *   then every local trainer gets a Complete message and the op is freed
 *   once no write references its memory.
 * A failure anywhere (mismatch, deadline, lost peer or trainer) is
 * announced to every node, so the op fails on every rank with the same
 * message.
 */
#ifndef OBD_JOB_H
#define OBD_JOB_H

#include <stdint.h>
#include <uv.h>

#include "daemon.h"
#include "shm.h"

#define OBD_MAX_LOCAL 64
#define OBD_JOB_NAME  64
/* Ops of a job that may be known at once (announced ahead by fast nodes). */
#define OBD_OP_WINDOW 64

struct obd_opdesc {
    uint32_t kind;
    uint32_t dtype;
    uint32_t redop;
    uint64_t count;
    uint64_t key;
    int32_t root;
};

struct obd_announce {
    int have;
    int status;
    uint32_t local_size;
    struct obd_opdesc desc;
    char message[256];
};

enum obd_op_state { OBD_OP_COLLECT, OBD_OP_RUN, OBD_OP_DONE };

struct obd_op {
    struct obd_job *job;
    uint64_t seq;
    enum obd_op_state state;
    uint64_t created_ns; /* uv_hrtime() at creation */

    /* Local trainers' submissions. */
    int nsubmitted;
    int submitted[OBD_MAX_LOCAL];
    struct obd_opdesc sub[OBD_MAX_LOCAL];
    void *data[OBD_MAX_LOCAL]; /* into the trainers' shared memory */
    int local_done;            /* all local trainers in and agreed */

    /* One announce per node, ours included. */
    struct obd_announce *ann;
    int nann;

    struct obd_opdesc desc; /* what everybody agreed on */
    uint64_t fingerprint;
    int agreed; /* every node announced the same op */

    uv_timer_t deadline;
    int timer_live;
    int grace; /* the deadline was extended once; see on_deadline */
    int status;
    char message[512];

    void *coll;       /* the algorithm's own state while RUN */
    int refs;         /* writes in flight that read this op's memory */
    int stall_warned; /* ops: logged by stall.c */
    struct obd_op *next;
};

struct obd_job {
    struct obd_daemon *d;
    char name[OBD_JOB_NAME];
    uint32_t id;
    int local_size; /* 0 until the first trainer joins */
    int timeout_ms;
    struct obd_client *trainer[OBD_MAX_LOCAL];
    int joined;
    uint64_t next_seq;  /* ops below it have completed */
    struct obd_op *ops; /* ascending seq */
    int busy;           /* > 0 while a loop walks ops: do not free */
    char gone[256];     /* set when a trainer left while others stay */
    struct obd_job *next;
};

struct obd_job *obd_job_find(struct obd_daemon *d, const char *name);
struct obd_job *obd_job_find_id(struct obd_daemon *d, uint32_t id);

/* A trainer joins: checks local rank and size against the job. On failure
 * returns a negative code with a reason in why. */
int obd_job_join(struct obd_daemon *d, struct obd_client *c, const char *name,
                 int local_rank, int local_size, int timeout_ms,
                 struct obd_job **out, char *why, size_t whylen);

/* A trainer leaves (disconnect): fails its ops for everyone. */
void obd_job_leave(struct obd_job *job, int local_rank, const char *reason);

/* A trainer submits op `seq`; data points into its shared memory (NULL for
 * barrier). A non-zero status means the daemon refused the request (reason
 * in why): the op then fails on every rank with that message. */
void obd_job_submit(struct obd_job *job, int local_rank, uint64_t seq,
                    const struct obd_opdesc *desc, void *data, int status,
                    const char *why);

/* A node's announce arrived. */
void obd_job_on_announce(struct obd_daemon *d, int from,
                         const struct obd_announce *a, const char *job,
                         uint64_t seq);

/* A node's link came up: it gets our announces of ops still collecting. */
void obd_job_on_peer_up(struct obd_daemon *d, int node);

/* A node's link went down: fails the ops that needed it. */
void obd_job_on_peer_lost(struct obd_daemon *d, int node, const char *why);

/* Starts every job's next op that has become ready. */
void obd_job_kick_all(struct obd_daemon *d);

/* The op (job id, seq) this node knows, in any state, or NULL. */
struct obd_op *obd_job_op(struct obd_daemon *d, uint32_t job_id, uint64_t seq);

/* Fails op with status and message, announces the failure to every node
 * (unless it came from one) and completes the trainers. */
void obd_op_fail(struct obd_op *op, int status, int announce, const char *fmt,
                 ...) __attribute__((format(printf, 4, 5)));

/* The algorithm finished: completes the trainers with success. */
void obd_op_finish(struct obd_op *op);

/* Drops a reference taken for a write; frees a finished op at zero. */
void obd_op_unref(struct obd_op *op);

/* Fails every op and forgets every job (shutdown). */
void obd_job_close_all(struct obd_daemon *d);

/* Writes who open op `op` waits for ("rank 3 (node 1 local 1)", "node 2
 * (ranks 4-5)") into buf; empty when nobody. */
void obd_job_op_waiting(const struct obd_op *op, char *buf, size_t len);

/* Global rank of a node's local trainer. */
static inline int obd_job_rank(const struct obd_job *job, int node, int local)
{
    return node * job->local_size + local;
}

#endif
