/* Error-feedback state of the 1-bit allreduce, one per (job, key) on every
 * node: the worker error (padded length) and the server error (one chunk).
 *
 * Snapshots: one file per (job, key) in state_dir, an LZ4 frame with block
 * and content checksums holding a fixed header and both error buffers,
 * written to a temporary file and renamed into place. A snapshot is loaded
 * only if it is intact and was written by the same rank of the same world
 * (nodes and world fingerprint); a snapshot of another world is dropped and
 * the state starts at zero, which is logged and counted. Files are in the
 * byte order of the machine (every platform obcomm runs on is
 * little-endian; the header records it).
 */
#ifndef OBD_EFSTATE_H
#define OBD_EFSTATE_H

#include <stddef.h>
#include <stdint.h>

#define OBD_EF_JOB_MAX 64

struct obd_ef {
    char job[OBD_EF_JOB_MAX];
    uint64_t key;
    uint64_t count;
    size_t padded; /* obd_codec_padded_len(count, nodes) */
    int nodes;
    float *werr; /* padded elements */
    float *serr; /* padded / nodes elements */

    /* The packed buffers of an op on this key, kept between ops (fresh
     * ones would cost a page fault per 4 KiB on every op); allocated by
     * obd_ef_work, freed with the state. */
    struct obd_ef_work *work;

    /* Kept by efstore.c: 1-bit ops using the state (one at a time), a
     * reset that came while one did, and when the last one ended. */
    int users;
    int doomed; /* reset while in use: freed when the last user leaves */
    int active; /* its job has a trainer on this node */
    /* Set while a 1-bit op has begun to change the state (worker error)
     * and has not yet committed to change all of it (server error): a
     * failure in between leaves it torn, and it is then reset at its next
     * op and never saved (efstore.c). */
    int torn;
    uint64_t idle_since_ms;

    struct obd_ef *next;
};

struct obd_ef_work {
    uint8_t *bits; /* our signs of every chunk, padded / 8 bytes */
    uint8_t *out;  /* every server's result bits, padded / 8 bytes */
    uint8_t **in;  /* in[k]: node k's signs of our chunk; in[rank] points
                      into bits */
    int rank;
};

/* Who wrote a snapshot, checked on load. */
struct obd_ef_world {
    uint32_t nodes;
    uint32_t rank;
    uint64_t fingerprint;
};

/* Result of obd_ef_read. */
enum {
    OBD_EF_OK = 0,
    OBD_EF_OTHER_WORLD = 1, /* intact, but of another world: reset */
    OBD_EF_CORRUPT = -1,    /* damaged, truncated or not a snapshot */
    OBD_EF_IOERR = -2,
};

/* A zeroed state, or NULL when out of memory. Caller frees with
 * obd_ef_free. */
struct obd_ef *obd_ef_new(const char *job, uint64_t key, uint64_t count,
                          int nodes);
void obd_ef_free(struct obd_ef *ef);
void obd_ef_zero(struct obd_ef *ef);
/* Memory the state holds, work buffers included. */
size_t obd_ef_bytes(const struct obd_ef *ef);

/* Memory a state of count elements among nodes would hold with its work
 * buffers (0 when count cannot be padded): for bounds before allocating. */
size_t obd_ef_bytes_for(uint64_t count, int nodes);

/* The work buffers of ef as seen by node `rank`, allocated on first use;
 * NULL when out of memory. */
const struct obd_ef_work *obd_ef_work(struct obd_ef *ef, int rank);

/* The snapshot file name of (job, key) inside dir. */
void obd_ef_path(const char *dir, const char *job, uint64_t key, char *buf,
                 size_t len);

/* Writes ef atomically (temporary file, fsync, rename). Returns 0 or a
 * negative errno, with a reason in why. */
int obd_ef_write(const char *path, const struct obd_ef *ef,
                 const struct obd_ef_world *w, char *why, size_t whylen);

/* Reads a snapshot. Every length in the file is bounded by max_bytes before
 * anything is allocated. OBD_EF_OK: *out is a new state (caller frees).
 * Otherwise *out is untouched and why says what was wrong. */
int obd_ef_read(const char *path, const struct obd_ef_world *w,
                uint64_t max_bytes, struct obd_ef **out, char *why,
                size_t whylen);

/* The same from an open file: reads fd (borrowed, not closed) from its
 * current offset to its end; `path` only names it in why. */
int obd_ef_read_fd(int fd, const char *path, const struct obd_ef_world *w,
                   uint64_t max_bytes, struct obd_ef **out, char *why,
                   size_t whylen);

#endif
