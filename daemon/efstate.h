/* Error-feedback state of the 1-bit allreduce, one per (job, key) on every
 * node: the worker error (padded length) and the server error (one chunk),
 * each held as a lazy state (codec.h "Lazy error feedback"): one buffer
 * per role, which a step rewrites in place in its single pass, and the
 * error formed on the fly from (buffer, mode, scale).
 *
 * A failed op: once a step's pass has begun on the buffers, the op is torn
 * (below) until both states have committed; a torn state cannot be undone
 * (fp32 addition is not invertible), so it is aborted at the key's next op
 * (obd_ef_abort: both states back to ZERO, counted in ef_resets) and never
 * saved. The op's other nodes do the same (coll_onebit.c, onebit_failed):
 * once an op was agreed on anywhere, its failure tears the key everywhere,
 * so that the nodes stay alike. An op that fails before it was agreed on
 * leaves the state as a valid step.
 *
 * Snapshots: one file per (job, key) in a snapshot set (snapset.h), an LZ4
 * frame with block and content checksums holding a fixed header and both
 * error buffers, written to a temporary file and renamed into place. The
 * header, under the content checksum, names the file's set: job, the run
 * that took it, the set's id, key, node and world. A snapshot is loaded
 * only if it is intact, was written by the same rank of the same world
 * (nodes and world fingerprint) and belongs to the set being read;
 * otherwise its whole set is unusable (snapset.h). Files are in the
 * byte order of the machine (every platform obcomm runs on is
 * little-endian; the header records it).
 */
#ifndef OBD_EFSTATE_H
#define OBD_EFSTATE_H

#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "err.h"

#define OBD_EF_JOB_MAX 64

/* Which step a key's error feedback holds. Nodes whose states agree hold
 * equal versions: every 1-bit op compares them before its pass begins
 * (job.c). A state at zero, or none at all, is {0, 0, 0}. */
struct obd_efversion {
    uint64_t origin;   /* the snapshot set it was restored from; 0: zero */
    uint64_t applied;  /* 1-bit steps applied since */
    uint64_t last_seq; /* the op of the last of them (applied > 0) */
};

static inline int obd_efversion_equal(const struct obd_efversion *a,
                                      const struct obd_efversion *b)
{
    return a->origin == b->origin && a->applied == b->applied &&
           a->last_seq == b->last_seq;
}

struct obd_ef {
    char job[OBD_EF_JOB_MAX];
    uint64_t key;
    uint64_t count;
    size_t padded; /* obd_codec_padded_len(count, nodes) */
    int nodes;
    /* The states' buffers (64-byte aligned, owned): not the errors
     * themselves; read the errors with obd_ef_error. */
    float *werr;                    /* padded elements */
    float *serr;                    /* padded / nodes elements */
    struct obd_codec_lazy_state wl; /* borrows werr */
    struct obd_codec_lazy_state sl; /* borrows serr */

    /* The packed buffers of an op on this key, kept between ops (fresh
     * ones would cost a page fault per 4 KiB on every op); allocated by
     * obd_ef_work, freed with the state. */
    struct obd_ef_work *work;

    /* Kept by efstore.c (the registry): the run of the job the state
     * belongs to, its version, the 1-bit ops using it (one at a time)
     * and a reset that came while one did. */
    uint64_t run;
    struct obd_efversion version;
    int users;
    int doomed; /* reset while in use: freed when the last user leaves */
    /* Set while a 1-bit op has begun to change the state (its worker
     * pass was queued) and has not yet committed both the worker and the
     * server state: a failure in between leaves it torn, and it is then
     * aborted (reset to ZERO, counted) at its next op and never saved
     * (efstore.c). */
    int torn;

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

/* The set a snapshot file belongs to, named in its checked header. */
struct obd_ef_set {
    uint64_t run; /* the run that took the snapshot */
    uint64_t id;  /* the set's id (obd_snapset_id) */
};

/* BLAKE2b-256 of a snapshot file's bytes, as a set's manifest holds it. */
#define OBD_EF_DIGEST_BYTES 32

/* A zeroed state, or NULL when out of memory. Caller frees with
 * obd_ef_free. */
struct obd_ef *obd_ef_new(const char *job, uint64_t key, uint64_t count,
                          int nodes);
void obd_ef_free(struct obd_ef *ef);
/* A new state holding exactly the errors of src (EAGER), without work
 * buffers, run or version; NULL when out of memory. src must not be torn
 * or in use by a running pass. */
struct obd_ef *obd_ef_copy(const struct obd_ef *src);
/* Both states back to ZERO, as for a new key. */
void obd_ef_zero(struct obd_ef *ef);
/* Aborts both states of a torn key (obd_codec_lazy_state_abort): both
 * back to ZERO; the caller counts the reset in ef_resets. */
void obd_ef_abort(struct obd_ef *ef);
/* werr and serr were written with errors (a snapshot's, or a test's):
 * both states become EAGER, holding exactly those errors. */
void obd_ef_restored(struct obd_ef *ef);
/* The errors the states hold, elements [begin, end) of the worker error
 * (serr_part 0) or of the server error (1), into e: what a snapshot
 * stores, byte for byte the errors e of codec.h's arithmetic. */
void obd_ef_error(const struct obd_ef *ef, int serr_part, float *e,
                  size_t begin, size_t end);
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

/* Writes ef as a file of set `set` atomically (temporary file, fsync,
 * rename). Returns 0, with the digest of the file's bytes in digest
 * (OBD_EF_DIGEST_BYTES; NULL: not wanted), or OBD_E_IO with a reason in
 * why. */
int obd_ef_write(const char *path, const struct obd_ef *ef,
                 const struct obd_ef_world *w, const struct obd_ef_set *set,
                 uint8_t *digest, char *why, size_t whylen);

/* Reads a snapshot. Every length in the file is bounded by max_bytes before
 * anything is allocated. 0: *out is a new state (caller frees), and the
 * digest of the file's bytes in digest (NULL: not wanted). Otherwise
 * *out is untouched, why says what was wrong and the result is
 * OBD_E_CORRUPT (damaged, truncated, not a snapshot, or a file of another
 * set than `set`), OBD_E_OTHER_WORLD (intact, but written by another
 * world) or OBD_E_IO. `set` NULL: a file of any set. */
int obd_ef_read(const char *path, const struct obd_ef_world *w,
                const struct obd_ef_set *set, uint64_t max_bytes,
                struct obd_ef **out, uint8_t *digest, char *why, size_t whylen);

/* The same from an open file: reads fd (borrowed, not closed) from its
 * current offset to its end; `path` only names it in why. */
int obd_ef_read_fd(int fd, const char *path, const struct obd_ef_world *w,
                   const struct obd_ef_set *set, uint64_t max_bytes,
                   struct obd_ef **out, uint8_t *digest, char *why,
                   size_t whylen);

#endif
