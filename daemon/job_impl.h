/* The job module's own header: what its files (job.c, registry.c, op.c,
 * match.c, route.c) call in each other. Not for other subsystems: they
 * use job.h.
 *
 * The files call downwards only, so that no two of them go round:
 *   job.c       entry points: join, submit, leave, peer messages and events;
 *   route.c     data frames from the mesh to the op that waits for them;
 *   registry.c  the jobs of this node by name and id, their runs and turns;
 *   match.c     matching an op across trainers and nodes;
 *   op.c        an op's life: states, deadlines, answers, reports, failure,
 *               and the job's run of ops (stop, next seq, start next).
 * job.c may call every file below it, route.c registry.c and op.c,
 * registry.c match.c and op.c, match.c op.c. The buffers the
 * ops lend their algorithms are a module of their own (bufpool.h).
 */
#ifndef OBD_JOB_IMPL_H
#define OBD_JOB_IMPL_H

#include "job.h"

/* ---- registry.c ---- */

/* A new job named `name` in *out, in the daemon's list (its turn,
 * job_run, frees it once it has neither trainers nor ops); 0, or with why:
 * OBD_E_INVAL (a name of no bytes or too many), OBD_E_EXISTS (another job's
 * name hashes to the same wire id), OBD_E_BUSY (the daemon holds max_jobs
 * jobs), OBD_E_NOMEM. */
int obd_registry_create(struct obd_daemon *d, const char *name,
                        struct obd_job **out, char *why, size_t whylen);
/* Takes the job out of the daemon's list and remembers the other nodes'
 * runs it saw as ended. The job frees itself on its turn once it has no
 * trainers and no ops. */
void obd_registry_detach(struct obd_job *job);
/* The job a message of node `from` about job `name` in the sender's run
 * `run` belongs to, or NULL (create == 0 and none exists, the job could
 * not be made, or the run ended here). A run not seen from that node
 * before ends this node's run of the job and goes to a new job. */
struct obd_job *obd_registry_route(struct obd_daemon *d, int from,
                                   const char *name, uint64_t run, int create);

/* ---- match.c ---- */

/* Every local trainer submitted: compares their ops and, if they agree,
 * moves the op to LOCAL and announces it; else fails it. */
void obd_match_check_local(struct obd_op *op);
/* Announces this node's view of a LOCAL op, unless done or a 1-bit op
 * still waits for earlier ops of its job. */
void obd_match_announce(struct obd_op *op);
/* Every node's announce is in: agrees (AGREED, fingerprint set) or fails
 * the op, with the same verdict on every node. */
void obd_match_check_ready(struct obd_op *op);

/* ---- op.c ---- */

/* Moves the op to state `to`; a transition outside job.h's life of an op
 * logs and aborts (OBD_ENFORCE), in every build. */
void obd_op_enter(struct obd_op *op, enum obd_op_state to);
/* Fails an open op with `status` and a message (printf); announce != 0
 * tells every other node. The job's run stops after it. Does nothing to
 * an op that is DONE already; answers come from the ready queue. */
void obd_op_set_failed(struct obd_op *op, int status, int announce,
                       const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The linked op `seq` of the job, or NULL. */
struct obd_op *obd_op_find(struct obd_job *job, uint64_t seq);
/* The op `seq` of the job, made if it is within the op window; NULL
 * outside it or out of memory. A new op of a stopped run, of a closing
 * daemon or needing a lost node is failed at once. */
struct obd_op *obd_op_get(struct obd_job *job, uint64_t seq);
/* Starts the op's deadline afresh, the job's timeout from now. */
void obd_op_restart_deadline(struct obd_op *op);
/* Sends announce `a` of the op to node `only`, or to every other node
 * when only < 0; a detached job sends nothing. */
void obd_op_announce_to(struct obd_op *op, const struct obd_announce *a,
                        int only);
void obd_op_announce_to_all(struct obd_op *op, const struct obd_announce *a);
/* Who the open op still waits for before it runs, in its timeout's
 * words. */
void obd_op_describe_missing(const struct obd_op *op, char *buf, size_t len);
/* The job's next_seq: its oldest open op, or one past its newest. */
void obd_op_advance_seq(struct obd_job *job);
/* Starts the job's oldest AGREED op when no earlier op is open. */
void obd_op_start_next(struct obd_job *job);
/* Fails every open op of the job from seq `from` on. */
void obd_op_fail_open(struct obd_job *job, uint64_t from, int status,
                      int announce, const char *reason);
/* The job's run stops from op `from` on (the earliest stop wins): ops
 * known from there fail now, later ones as they appear. failure != 0
 * counts and logs it. */
void obd_op_stop_run(struct obd_job *job, uint64_t from, int status,
                     const char *what, int failure);

#endif
