/* Jobs and their ops: matching every op across the local trainers and the
 * nodes, deadlines, completion and failure. One module in several files
 * (job.c, route.c, registry.c, match.c, op.c; job_impl.h says
 * which does what): other subsystems use this header only.
 *
 * An op is identified by (job, seq), seq being every trainer's own op
 * counter. Life of an op on a node (enum obd_op_state; op.c's table
 * `legal` holds every transition, obd_op_enter checks it):
 *   COLLECT  local trainers submit;
 *   LOCAL    all have, with the same descriptor: the node announces its
 *            view to every other node (a failure is announced instead);
 *   AGREED   every node's announce is in and all nodes, comparing the same
 *            set, reached the same verdict; the op waits for its turn (a
 *            job runs its ops one at a time, in order);
 *   RUN      the algorithm (coll.h) moves data;
 *   DONE     finished or failed (from any state before); every local
 *            trainer gets its Complete once no pool task touches the op's
 *            memory any more;
 *   RETIRED  every trainer still joined has its answer: the op left the
 *            job's list and waits for its last callbacks (refs);
 *   FREEING  nothing refers to it: its deadline timer closes, then it is
 *            freed.
 * A failure anywhere (mismatch, deadline, lost peer or trainer) is
 * announced to every node, so the op fails on every rank with the same
 * message.
 *
 * Lifetime rules (docs/design.md, "Lifetimes and trust"):
 *   - Nothing here completes, frees or calls back synchronously. obd_op_fail
 *     and obd_op_finish only record the verdict and post the op to the
 *     daemon's ready queue (runq.h); answers to trainers, retiring, the
 *     next op's start and every free happen when the queue runs the op, on
 *     a later loop turn. So a caller may keep using an op after failing it.
 *   - Reference counts only count. op->refs counts callbacks still to come
 *     (writes, reads, pool tasks); op->tasks the pool tasks among them.
 *     Whoever drops a reference posts the op (obd_op_schedule) if it wants
 *     progress; unref never runs anything.
 *   - An op holds a reference on every trainer buffer it was given
 *     (struct obd_shm), until it is freed; a trainer's release or
 *     disconnect drops only the trainer's own reference.
 *   - A job lives while a trainer is joined or an op of it exists
 *     (job->live), so op->job is valid for the op's whole life.
 */
#ifndef OBD_JOB_H
#define OBD_JOB_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "daemon.h"
#include "efstore.h"
#include "frame.h"
#include "owner.h"
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
    uint64_t run;            /* the node's run of the job */
    struct obd_efversion ef; /* 1-bit allreduce: the key's version */
    struct obd_owner owner;  /* the job's owner on the node */
    /* The node finished the op's local phase (obd_op_report), with that
     * status and message. */
    int reported;
    int report_status;
    char report_message[256];
    /* The node failed the op without having reported. */
    int failed;
    /* A failure: the node had agreed on the op before (see obd_op). */
    int agreed;
};

enum obd_op_state {
    OBD_OP_COLLECT,
    OBD_OP_LOCAL,
    OBD_OP_AGREED,
    OBD_OP_RUN,
    OBD_OP_DONE,
    OBD_OP_RETIRED,
    OBD_OP_FREEING,
    OBD_OP_STATES
};

struct obd_op {
    struct obd_job *job; /* valid while the op exists */
    uint64_t seq;
    enum obd_op_state state;
    struct obd_ready ready; /* in the daemon's ready queue */
    uint64_t created_ns;    /* uv_hrtime() at creation */
    uint64_t start_ns;      /* ... when it started running (0: never) */
    uint64_t done_ns;       /* ... when it became DONE */

    /* Local trainers' submissions. */
    int nsubmitted;
    int submitted[OBD_MAX_LOCAL];
    int answered[OBD_MAX_LOCAL];
    struct obd_opdesc sub[OBD_MAX_LOCAL];
    void *data[OBD_MAX_LOCAL];          /* into the trainers' shared memory */
    struct obd_shm *buf[OBD_MAX_LOCAL]; /* holding data; a reference each */
    /* Allgather and reduce-scatter: where each trainer's result goes. */
    void *out[OBD_MAX_LOCAL];
    struct obd_shm *outbuf[OBD_MAX_LOCAL];

    /* One announce per node, ours included. */
    struct obd_announce *ann;
    int nann;

    struct obd_opdesc desc; /* from LOCAL on: what the trainers asked for */
    uint64_t fingerprint;   /* from AGREED on */
    /* The state the op was in when it became DONE. */
    enum obd_op_state ended_in;
    /* Failed after agreeing, here or on the node that says so: the op may
     * have begun on any node (algo->failed runs when it is freed). */
    int failed_agreed;

    uint64_t value; /* answered with success: a snapshot's id, */
    uint64_t bytes; /* ... and the bytes of this node's part */

    uv_timer_t deadline; /* closed in FREEING */
    int grace;           /* the deadline was extended once; see on_deadline */
    int status;
    char message[512];

    void *coll; /* the algorithm's own state while RUN */
    /* What job hands the algorithm (coll.h): its only way to the job and
     * the daemon. */
    const struct obd_opsvc *svc;
    int refs;            /* callbacks to come: writes, reads, pool tasks */
    int tasks;           /* pool tasks in flight (among refs) */
    int stall_warned;    /* logged once by stall.c */
    struct obd_op *next; /* in job->ops until RETIRED */
};

/* 1 while the op has no verdict yet (before DONE). */
static inline int obd_op_open(const struct obd_op *op)
{
    return op->state < OBD_OP_DONE;
}

struct obd_job {
    struct obd_daemon *d;
    char name[OBD_JOB_NAME];
    uint32_t id;
    int local_size; /* 0 until the first trainer joins */
    /* The uid of the job's first trainer here: trainers of other users
     * are refused (OBD_E_DENIED) while the job lives. owner_id is the
     * same owner as announced to the other nodes (owner.h). */
    uid_t owner;
    int owned;
    struct obd_owner owner_id;
    int timeout_ms;
    struct obd_client *trainer[OBD_MAX_LOCAL]; /* opaque: for hooks.answer */
    int pid[OBD_MAX_LOCAL];
    int joined;
    uint64_t next_seq;  /* ops below it have completed */
    struct obd_op *ops; /* linked ops, ascending seq */
    int live;           /* ops that exist, linked or not */
    /* Out of d->jobs: an earlier run being wound up. Its ops end here
     * alone: it sends nothing to the other nodes, which have gone on to
     * another run. */
    int detached;
    struct obd_ready ready;
    /* The run: random when the first trainer joins here (run_local), and
     * the hash of every node's run_local as first agreed on (run; 0 until
     * an op was agreed), with each node's at that time. */
    uint64_t run_local;
    uint64_t run;
    uint64_t *node_run; /* nodes entries */
    /* Each node's run as its first message of the job here said (0: none
     * yet). A message of that node in another run means that its
     * trainers started a new run: this job's run ends here and the
     * message goes to a new job (docs/design.md, "A new run never
     * waits"). */
    uint64_t *seen_run;
    /* Once an op of the run failed anywhere, or a rank left, the run is
     * stopped: ops from stopped_seq on fail at once with `stopped`, on
     * every node, until the trainers start a new run (docs/design.md,
     * "The 1-bit state's lifecycle and failures"; NCCL and Gloo abort the
     * communicator likewise). */
    char stopped[400];
    uint64_t stopped_seq;
    int stopped_status; /* the first failure's */
    struct obd_job *next;
};

struct obd_job *obd_job_find(struct obd_daemon *d, const char *name);
struct obd_job *obd_job_find_id(struct obd_daemon *d, uint32_t id);

/* A trainer of user `uid` joins: checks the owner, local rank and size
 * against the job; the first trainer's uid becomes the owner. On failure
 * returns a negative code with a reason in why: OBD_E_DENIED (the job
 * belongs to another user here, or owner_identity is name and the uid has
 * no usable name), OBD_E_BUSY (the local rank is taken, the user owns
 * max_jobs_per_uid jobs here already, or the daemon holds max_jobs jobs). */
int obd_job_join(struct obd_daemon *d, struct obd_client *c, int pid, uid_t uid,
                 const char *name, int local_rank, int local_size,
                 int timeout_ms, struct obd_job **out, char *why,
                 size_t whylen);

/* A trainer leaves (disconnect): fails its job's open ops on every node
 * and tells the other nodes, whose later ops of the job then fail at once.
 * The job may be freed on a later turn: the caller forgets it. */
void obd_job_leave(struct obd_job *job, int local_rank, const char *reason);

/* A trainer submits op `seq`; data points into its shared memory buffer
 * buf (both NULL for ops without data; the op takes its own reference on
 * buf), and out into outbuf where an allgather or reduce-scatter writes
 * its result (else both NULL). A non-zero status means the daemon refused the
 * request (reason in why): the op then fails on every rank with that message.
 * Returns 0, or a negative code when the submission itself is invalid (outside
 * the op window, twice) or answered already (an op of a stopped run that is
 * over here: the run's first failure): the caller answers that trainer directly
 * with the code and why. */
int obd_job_submit(struct obd_job *job, int local_rank, uint64_t seq,
                   const struct obd_opdesc *desc, struct obd_shm *buf,
                   void *data, struct obd_shm *outbuf, void *out, int status,
                   char *why, size_t whylen);

/* The hooks peers.c calls through (struct obd_hooks). */
void obd_job_on_peer_up(struct obd_daemon *d, int node);
void obd_job_on_peer_lost(struct obd_daemon *d, int node, const char *why);
void obd_job_on_peer_msg(struct obd_daemon *d, int from,
                         const struct Obcomm__PeerMsg *msg);
enum obd_data_dest obd_job_data_begin(struct obd_daemon *d, int from,
                                      const struct obd_frame *f, void **dst,
                                      void **token);
int obd_job_data_live(void *token);
void obd_job_data_end(void *token, int from, const struct obd_frame *f,
                      int complete);

/* Shutdown: ops still collecting fail at once (and ops submitted from now
 * on); running ops go on. */
void obd_job_shutdown(struct obd_daemon *d);
/* Fails every open op (the end of the shutdown grace). */
void obd_job_fail_all(struct obd_daemon *d, const char *reason);
/* Ops not yet DONE plus pool tasks in flight: 0 when the daemon is quiet. */
int obd_job_busy(const struct obd_daemon *d);

/* The jobs of this node, one after another: the first when prev is NULL,
 * NULL after the last. Borrowed: valid until the caller returns to the
 * loop. Status and stall reports walk the jobs through it. */
struct obd_job *obd_job_next(struct obd_daemon *d, struct obd_job *prev);
/* The job's open ops (not DONE yet) in ascending seq: the first when prev
 * is NULL, NULL after the last. Borrowed, as obd_job_next's. */
struct obd_op *obd_job_next_open(struct obd_job *job, struct obd_op *prev);

/* The op (job id, seq) this node knows, in any state, or NULL. */
struct obd_op *obd_job_op(struct obd_daemon *d, uint32_t job_id, uint64_t seq);

/* Posts the op to the ready queue: its algorithm's progress runs on a
 * later turn while it runs; answers, retiring and freeing follow once it
 * is DONE. */
void obd_op_schedule(struct obd_op *op);

/* Writes who open op `op` waits for ("rank 3 (node 1 local 1)", "node 2
 * (ranks 4-5)") into buf; empty when nobody. */
void obd_job_op_waiting(const struct obd_op *op, char *buf, size_t len);

/* Global rank of a node's local trainer. */
static inline int obd_job_rank(const struct obd_job *job, int node, int local)
{
    return node * job->local_size + local;
}

#endif
