/* The ring reduce-scatter: the ring allreduce's first half over world *
 * count elements, turned by one chunk so that each node ends with its own
 * ranks' block (coll_ring.c, which runs it). */
#include "coll_ring.h"

#include <obcomm.h>

#include "ops.h"

/* The input holds world * count elements, the result count. */
static int rs_check(const struct obd_opdesc *d, int world, uint64_t *bytes,
                    uint64_t *out_bytes, char *why, size_t len)
{
    uint64_t part;
    int rc = obd_coll_ring_check_typed(d, "reduce-scatter", (uint64_t)world, 1,
                                       &part, why, len);
    if (rc)
        return rc;
    *bytes = part * (uint64_t)world;
    *out_bytes = part;
    return 0;
}

const struct obd_algo obd_algo_reduce_scatter = {
    .kind = OBCOMM_KIND_REDUCE_SCATTER,
    .name = "ring reduce-scatter",
    .check = rs_check,
    .start = obd_coll_ring_start,
    .recv_dest = obd_coll_ring_recv_dest,
    .recv_done = obd_coll_ring_recv_done,
    .progress = obd_coll_ring_progress,
    .free = obd_coll_ring_free,
    .waiting_on = obd_coll_ring_waiting_on,
    .needs_node = obd_coll_ring_needs_node,
};
