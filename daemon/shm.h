/* Shared-memory buffers that trainers register: a memfd received over the
 * Unix socket, checked and mapped into the daemon. */
#ifndef OBD_SHM_H
#define OBD_SHM_H

#include <stddef.h>
#include <stdint.h>

struct obd_shm {
    uint64_t id; /* the trainer's id for it */
    void *base;
    size_t size;
    struct obd_shm *next;
};

/* Maps `fd` (which the call always closes) as a buffer of `bytes` bytes.
 * The memfd must be sealed against shrinking, so that the trainer cannot
 * make the daemon's accesses fault, and exactly `bytes` long. On failure
 * returns a negative code and writes a reason into why. */
int obd_shm_map(int fd, uint64_t id, uint64_t bytes, uint64_t max_bytes,
                struct obd_shm **out, char *why, size_t whylen);

void obd_shm_unmap(struct obd_shm *b);

/* The registered range [offset, offset+len) of buffer b, or NULL if it does
 * not fit. */
void *obd_shm_range(const struct obd_shm *b, uint64_t offset, uint64_t len);

#endif
