/* The ring reduce-scatter: the ring allreduce's first half over world *
 * count elements, turned by one chunk so that each node ends with its own
 * ranks' block (coll_ring.c, which runs it). */
#include "coll_ring.h"

#include <obcomm.h>

#include "ops.h"

const struct obd_algo obd_algo_reduce_scatter = {
    .kind = OBCOMM_KIND_REDUCE_SCATTER,
    .name = "ring reduce-scatter",
    .start = obd_coll_ring_start,
    .recv_dest = obd_coll_ring_recv_dest,
    .recv_done = obd_coll_ring_recv_done,
    .progress = obd_coll_ring_progress,
    .free = obd_coll_ring_free,
    .waiting_on = obd_coll_ring_waiting_on,
    .needs_node = obd_coll_ring_needs_node,
};
