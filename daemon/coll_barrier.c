/* The barrier: the announce exchange that every op makes before it runs
 * is the whole barrier, so the op finishes as it starts. */
#include "coll.h"

#include <obcomm.h>

#include "ops.h"

static int barrier_start(struct obd_op *op)
{
    obd_op_finish(op);
    return 0;
}

static void barrier_free(struct obd_op *op)
{
    (void)op;
}

/* A barrier has no argument but its kind. */
static void barrier_normalize(struct obd_opdesc *d)
{
    *d = (struct obd_opdesc){.kind = d->kind};
}

const struct obd_algo obd_algo_barrier = {
    .kind = OBCOMM_KIND_BARRIER,
    .name = "barrier",
    .normalize = barrier_normalize,
    .check = obd_coll_check_nothing,
    .start = barrier_start,
    .recv_dest = obd_coll_no_data,
    .recv_done = obd_coll_no_recv,
    .progress = obd_coll_no_progress,
    .free = barrier_free,
    .waiting_on = obd_coll_waiting_on_nobody,
};
