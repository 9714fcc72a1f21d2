/* The ready queue: work that must run on a later turn of the loop, never
 * inside the call that made it necessary (libuv's rule: no callback from
 * inside the call that caused it; nng's aio task queue and UCC's progress
 * queue are the models).
 *
 * An owner embeds a struct obd_ready in the object that needs the turn (an
 * op, a client being dropped) and posts it; the queue calls `run` from an
 * idle handle on a later turn, once per posting however often it was
 * posted meanwhile. The queue holds no reference: an owner that frees the
 * object first cancels the item. Posting during a run queues the item for
 * the next turn, so a run never loops on itself within one turn.
 *
 * Pure loop-side code: everything here runs on the loop thread.
 */
#ifndef OBD_RUNQ_H
#define OBD_RUNQ_H

#include <uv.h>

struct obd_ready {
    void (*run)(struct obd_ready *r);
    struct obd_ready *next;
    int queued;
    unsigned gen; /* the turn it was posted for */
};

struct obd_runq {
    uv_idle_t idle;
    struct obd_ready *head, *tail;
    unsigned gen; /* bumped at every turn */
    int started;  /* the idle handle is active */
    int closed;
};

void obd_runq_init(struct obd_runq *s, uv_loop_t *loop);

/* Queues r for a later turn (no-op while it is queued, and after
 * obd_runq_close). */
void obd_runq_post(struct obd_runq *s, struct obd_ready *r);

/* Removes r if it is queued. */
void obd_runq_cancel(struct obd_runq *s, struct obd_ready *r);

/* Drains the queue for the shutdown, once the loop has stopped: runs what
 * is queued and, batch after batch within this call, whatever those runs
 * post, until the queue is empty (an op that ends posts its job, whose
 * run frees the job once nothing is left in it), then closes the idle
 * handle. A run that posts itself every time would keep it from
 * returning. Idempotent; items posted after it are never run. */
void obd_runq_close(struct obd_runq *s);

#endif
