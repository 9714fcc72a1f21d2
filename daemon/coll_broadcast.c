/* The pipelined chain broadcast: root node, root+1, ..., root-1. Each
 * node forwards segment j as soon as it has arrived, so the chain's
 * segments overlap; at the end the node's other trainers get copies (on
 * the worker pool when large, coll_ring.h).
 */
#include "coll_ring.h"
#include "err.h"

#include <stdio.h>
#include <stdlib.h>

#include "ops.h"
#include "ring.h"

struct broadcast {
    struct obd_coll_ring_core core; /* count: bytes; acc: where data lands */
    int pos;                        /* distance from the root node */
    const uint8_t *src;             /* what this node sends and copies */
    size_t send_seg, recv_seg;
};

/* The transition function of the broadcast: frames, then the copies to
 * the other local trainers (on the pool when large), then done. */
static void bcast_progress(struct obd_op *op)
{
    struct broadcast *c = op->coll;
    struct obd_daemon *d = op->job->d;
    size_t nseg = obd_ring_nseg(c->core.count, c->core.seg);
    int right = obd_ring_mod(c->core.r + 1, c->core.n);
    int forwards = c->pos < c->core.n - 1;

    if (c->core.phase == OBD_RING_PH_RING) {
        while (forwards && c->send_seg < nseg &&
               (c->pos == 0 || c->recv_seg > c->send_seg)) {
            size_t off = c->send_seg * c->core.seg;
            size_t len = c->core.count - off < c->core.seg ? c->core.count - off
                                                           : c->core.seg;
            if (obd_coll_ring_send(op, right, 0, (uint32_t)c->send_seg,
                                   c->src + off, len))
                return;
            obd_metric_add(&d->metrics, OBD_M_BROADCAST_BYTES_SENT, len);
            c->send_seg++;
        }
        int sent = !forwards || c->send_seg == nseg;
        int received = c->pos == 0 || c->recv_seg == nseg;
        if (!sent || !received || !obd_op_idle(op))
            return;
        c->core.phase = OBD_RING_PH_STORE;
        if (obd_coll_ring_spread(op, &c->core, OBD_RING_PC_COPY, op->data,
                                 c->src))
            return;
    }
    obd_coll_ring_store_progress(op, &c->core);
}

static int bcast_start(struct obd_op *op)
{
    struct obd_job *job = op->job;
    struct obd_daemon *d = job->d;
    int ls = job->local_size;
    int root = op->desc.root;
    if (root < 0 || root >= d->cfg.nodes * ls) {
        obd_op_fail(op, OBD_E_INVAL, 0,
                    "op %llu of job %s: broadcast root %d is not a rank "
                    "(world of %d)",
                    (unsigned long long)op->seq, job->name, root,
                    d->cfg.nodes * ls);
        return OBD_E_INVAL;
    }
    struct broadcast *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        obd_op_fail(op, OBD_E_NOMEM, 1, "out of memory");
        return OBD_E_NOMEM;
    }
    obd_coll_ring_core_init(&c->core, op, op->desc.count, 1);
    op->coll = c;
    obd_metric_add(&d->metrics, OBD_M_LOGICAL_BYTES, c->core.count);
    int root_node = root / ls;
    c->pos = obd_ring_mod(c->core.r - root_node, c->core.n);
    /* The root sends straight from its trainer's shared memory, and a node
     * with one trainer receives straight into it; the buffers stay mapped
     * until the op is freed, even if the trainer leaves. Other nodes
     * receive into a kept buffer and copy to each trainer at the end. */
    if (c->pos == 0 || ls == 1) {
        c->core.zero_copy = 1;
        c->core.acc = c->pos == 0 ? NULL : op->data[0];
        c->src = c->pos == 0 ? op->data[root % ls] : c->core.acc;
    } else {
        c->core.acc = obd_op_scratch_get(op, c->core.count, &c->core.acc_bytes);
        if (c->core.acc == NULL) {
            obd_op_fail(op, OBD_E_NOMEM, 1,
                        "op %llu of job %s: no memory for %zu bytes",
                        (unsigned long long)op->seq, job->name, c->core.count);
            return OBD_E_NOMEM;
        }
        c->src = c->core.acc;
    }
    bcast_progress(op);
    return 0;
}

static void *bcast_recv_dest(struct obd_op *op, int from,
                             const struct obd_frame *f, const char **why)
{
    struct broadcast *c = op->coll;
    size_t nseg = obd_ring_nseg(c->core.count, c->core.seg);
    if (c->pos == 0 || from != obd_ring_mod(c->core.r - 1, c->core.n)) {
        *why = "broadcast data from a node that is not the one before";
        return NULL;
    }
    if (f->step != 0 || f->segment != c->recv_seg || c->recv_seg >= nseg) {
        *why = "segment out of order";
        return NULL;
    }
    size_t off = c->recv_seg * c->core.seg;
    size_t len =
        c->core.count - off < c->core.seg ? c->core.count - off : c->core.seg;
    if (f->len != len) {
        *why = "payload length differs from the segment's";
        return NULL;
    }
    return c->core.acc + off;
}

static void bcast_recv_done(struct obd_op *op, int from,
                            const struct obd_frame *f)
{
    (void)from;
    (void)f;
    struct broadcast *c = op->coll;
    c->recv_seg++;
}

static void bcast_waiting_on(const struct obd_op *op, char *buf, size_t len)
{
    const struct broadcast *c = op->coll;
    if (c->core.phase >= OBD_RING_PH_STORE)
        snprintf(buf, len,
                 "the copies to the local trainers on node %d's worker pool",
                 c->core.r);
    else if (c->pos != 0 &&
             c->recv_seg < obd_ring_nseg(c->core.count, c->core.seg))
        snprintf(buf, len, "broadcast data from node %d (segment %zu)",
                 obd_ring_mod(c->core.r - 1, c->core.n), c->recv_seg);
    else
        snprintf(buf, len, "node %d to take our data",
                 obd_ring_mod(c->core.r + 1, c->core.n));
}

static int bcast_needs_node(const struct obd_op *op, int node)
{
    const struct broadcast *c = op->coll;
    size_t nseg = obd_ring_nseg(c->core.count, c->core.seg);
    return (node == obd_ring_mod(c->core.r - 1, c->core.n) && c->pos != 0 &&
            c->recv_seg < nseg) ||
           (node == obd_ring_mod(c->core.r + 1, c->core.n) &&
            c->pos < c->core.n - 1 && c->send_seg < nseg);
}

static void bcast_free(struct obd_op *op)
{
    struct broadcast *c = op->coll;
    obd_coll_ring_core_fini(&c->core, op);
    free(c);
    op->coll = NULL;
}

/* A broadcast moves bytes: it has no dtype and reduces nothing. */
static void bcast_normalize(struct obd_opdesc *d)
{
    d->dtype = 0;
    d->redop = 0;
}

/* One buffer of count bytes; the root is a rank of the job. */
static int bcast_check(const struct obd_opdesc *d, int world, uint64_t *bytes,
                       uint64_t *out_bytes, char *why, size_t len)
{
    if (d->count == 0) {
        snprintf(why, len, "broadcast of 0 bytes");
        return OBD_E_INVAL;
    }
    if (d->root < 0 || d->root >= world) {
        snprintf(why, len, "broadcast root %d not in [0, %d)", (int)d->root,
                 world);
        return OBD_E_INVAL;
    }
    *bytes = d->count;
    *out_bytes = 0;
    return 0;
}

const struct obd_algo obd_algo_broadcast = {
    .kind = OBCOMM_KIND_BROADCAST,
    .name = "chain broadcast",
    .normalize = bcast_normalize,
    .check = bcast_check,
    .start = bcast_start,
    .recv_dest = bcast_recv_dest,
    .recv_done = bcast_recv_done,
    .progress = bcast_progress,
    .free = bcast_free,
    .waiting_on = bcast_waiting_on,
    .needs_node = bcast_needs_node,
};
