/* Buffers kept between ops: one scratch buffer of any size, and a few
 * segment buffers of one size (a ring's received reduce-scatter segments).
 * A fresh allocation of a large buffer costs a page fault per 4 KiB on
 * every op (tests/bench/results-issue22: on a 4-node ring at 10 Gbit, the
 * faults took about as much CPU as the receive copies themselves), so the
 * daemon keeps one pool (struct obd_daemon's bufpool) and the algorithms
 * borrow from it through their op (coll.h, struct obd_opsvc). Loop thread
 * only. */
#ifndef OBD_BUFPOOL_H
#define OBD_BUFPOOL_H

#include <stddef.h>

#include "metrics.h"

/* At most this many segment buffers are kept, and more than one only
 * within OBD_SEGBUFS_KEPT_BYTES. A ring op takes a few while the pool
 * keeps pace with the wire (5 on 4 nodes at 10 Gbit with the default
 * 1 MiB segments). */
#define OBD_SEGBUFS_KEPT       16
#define OBD_SEGBUFS_KEPT_BYTES (64u << 20)

/* All zero is an empty pool. */
struct obd_bufpool {
    void *scratch;
    size_t scratch_bytes;
    void *segbufs[OBD_SEGBUFS_KEPT]; /* all of segbuf_bytes */
    int nsegbufs;
    size_t segbuf_bytes;
};

/* A buffer of at least `bytes` (its size in *cap), the kept one when it is
 * large enough; NULL out of memory. The caller owns it and gives it back
 * with obd_bufpool_scratch_put(p, buf, cap), which takes ownership (NULL
 * is allowed) and keeps the larger of it and the kept one. */
void *obd_bufpool_scratch_get(struct obd_bufpool *p, size_t bytes, size_t *cap);
void obd_bufpool_scratch_put(struct obd_bufpool *p, void *buf, size_t cap);

/* A buffer of exactly `bytes`, a kept one when they have that size; NULL
 * out of memory. A fresh one counts OBD_M_SEGBUFS_ALLOCATED in m. The
 * caller owns it and gives it back with obd_bufpool_segbuf_put(p, buf,
 * bytes), which takes ownership (NULL is allowed): a buffer of another
 * size than those kept replaces them (the newest size wins). */
void *obd_bufpool_segbuf_get(struct obd_bufpool *p, struct obd_metrics *m,
                             size_t bytes);
void obd_bufpool_segbuf_put(struct obd_bufpool *p, void *buf, size_t bytes);

/* Frees every kept buffer; the pool is empty and usable after. */
void obd_bufpool_fini(struct obd_bufpool *p);

#endif
