/* Buffers kept between ops (job_impl.h). */
#include "job_impl.h"

#include <stdlib.h>

#include "metrics.h"

/* One large buffer is kept between ops: a fresh allocation of a large
 * tensor costs a page fault per 4 KiB on every op. */
void *obd_bufpool_scratch_get(struct obd_op *op, size_t bytes, size_t *cap)
{
    struct obd_daemon *d = op->job->d;
    if (d->scratch != NULL && d->scratch_bytes >= bytes) {
        void *p = d->scratch;
        *cap = d->scratch_bytes;
        d->scratch = NULL;
        return p;
    }
    *cap = bytes ? bytes : 1;
    return malloc(*cap);
}

void obd_bufpool_scratch_put(struct obd_op *op, void *p, size_t cap)
{
    struct obd_daemon *d = op->job->d;
    if (p == NULL)
        return;
    if (d->scratch == NULL || d->scratch_bytes < cap) {
        free(d->scratch);
        d->scratch = p;
        d->scratch_bytes = cap;
    } else {
        free(p);
    }
}

/* Segment buffers (a ring's received reduce-scatter segments) are kept
 * between ops too, a few of one size (daemon.h): an op takes a few,
 * and fresh ones cost a page fault per 4 KiB of every frame received into
 * them (tests/bench/results-issue22: on a 4-node ring at 10 Gbit, the
 * faults took about as much CPU as the receive copies themselves). */
void *obd_bufpool_segbuf_get(struct obd_op *op, size_t bytes)
{
    struct obd_daemon *d = op->job->d;
    if (d->nsegbufs > 0 && d->segbuf_bytes == bytes)
        return d->segbufs[--d->nsegbufs];
    obd_metric_add(&d->metrics, OBD_M_SEGBUFS_ALLOCATED, 1);
    return malloc(bytes ? bytes : 1);
}

void obd_bufpool_segbuf_put(struct obd_op *op, void *p, size_t bytes)
{
    struct obd_daemon *d = op->job->d;
    if (p == NULL)
        return;
    if (d->segbuf_bytes != bytes) {
        /* Another dtype's segments (segment_bytes is not a multiple of
         * every element size): the newest size wins. */
        while (d->nsegbufs > 0)
            free(d->segbufs[--d->nsegbufs]);
        d->segbuf_bytes = bytes;
    }
    if (d->nsegbufs == 0 ||
        (d->nsegbufs < OBD_SEGBUFS_KEPT &&
         (size_t)(d->nsegbufs + 1) * bytes <= OBD_SEGBUFS_KEPT_BYTES))
        d->segbufs[d->nsegbufs++] = p;
    else
        free(p);
}
