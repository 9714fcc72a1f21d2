/* Shared-memory buffers that trainers register: a memfd received over the
 * Unix socket, checked and mapped into the daemon. */
#ifndef OBD_SHM_H
#define OBD_SHM_H

#include <stddef.h>
#include <stdint.h>

/* A mapped buffer is referenced by the trainer that registered it (until
 * it releases the buffer or leaves) and by every op that uses it; it is
 * unmapped when the last reference goes. Ops hold their reference until
 * they are freed, which is after every pool task and every write that
 * touches the memory has finished. Loop thread only. */
struct obd_shm {
    uint64_t id; /* the trainer's id for it */
    void *base;
    size_t size;
    int refs;
    struct obd_shm *next; /* in the trainer's list */
};

/* Maps `fd` (which the call always closes) as a buffer of `bytes` bytes,
 * holding one reference (the trainer's).
 * The memfd must be sealed against shrinking, so that the trainer cannot
 * make the daemon's accesses fault, and exactly `bytes` long. On failure
 * returns OBD_E_INVAL (the fd or its size is not what is required) or
 * OBD_E_NOMEM (no memory, or the mapping failed) with a reason in why. */
int obd_shm_map(int fd, uint64_t id, uint64_t bytes, uint64_t max_bytes,
                struct obd_shm **out, char *why, size_t whylen);

/* Takes a reference. */
void obd_shm_ref(struct obd_shm *b);

/* Drops a reference; unmaps and frees the buffer with the last one. */
void obd_shm_unref(struct obd_shm *b);

/* The registered range [offset, offset+len) of buffer b, or NULL if it does
 * not fit. */
void *obd_shm_range(const struct obd_shm *b, uint64_t offset, uint64_t len);

#endif
