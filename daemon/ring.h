/* Ring arithmetic, free of sockets: which chunk a node sends and receives
 * at every step of a ring reduce-scatter + allgather, and how a tensor is
 * cut into chunks and segments. */
#ifndef OBD_RING_H
#define OBD_RING_H

#include <stddef.h>

/* Element range [*begin, *end) of chunk c of `count` elements cut into n
 * chunks whose sizes differ by at most one. */
static inline void obd_ring_chunk(size_t count, int n, int c, size_t *begin,
                                  size_t *end)
{
    size_t base = count / (size_t)n, extra = count % (size_t)n;
    size_t uc = (size_t)c;
    *begin = uc * base + (uc < extra ? uc : extra);
    *end = *begin + base + (uc < extra ? 1 : 0);
}

static inline int obd_ring_mod(int a, int n)
{
    return ((a % n) + n) % n;
}

/* Steps 0..n-2 reduce-scatter, n-1..2n-3 allgather. At step s node r sends
 * chunk obd_ring_send_chunk(r, s) to r+1 and receives chunk
 * obd_ring_recv_chunk(r, s) from r-1; the chunk received at step s is the
 * one sent at step s+1, and after step n-2 node r holds the fully reduced
 * chunk r+1. */
static inline int obd_ring_send_chunk(int r, int n, int s)
{
    return s < n - 1 ? obd_ring_mod(r - s, n)
                     : obd_ring_mod(r + 1 - (s - (n - 1)), n);
}

static inline int obd_ring_recv_chunk(int r, int n, int s)
{
    return s < n - 1 ? obd_ring_mod(r - s - 1, n)
                     : obd_ring_mod(r - (s - (n - 1)), n);
}

/* Number of segments of `elems` elements, seg elements each (last shorter). */
static inline size_t obd_ring_nseg(size_t elems, size_t seg)
{
    return (elems + seg - 1) / seg;
}

#endif
