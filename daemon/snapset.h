/* Snapshot sets of the 1-bit error feedback in state_dir: every state of
 * one run of a job on this node, saved under an id that every node agrees
 * on (the snapshot op's, coll_efstate.c), so that a checkpoint can name
 * it and every node can go back to it together.
 *
 * On disk: state_dir/set-<job in hex>-<id in 16 hex digits>/ holds one
 * efstate.h file per key, each naming its set in its checked header, and
 * a manifest: the set's job, run, id, node and world, and every key with
 * its count and the BLAKE2b-256 digest of its file, under a digest of its
 * own. A set is written into <dir>.tmp and renamed: a node holds the set
 * once the rename is done (and the directory is fsync'd). A set is usable
 * only whole: a file missing, added, damaged, or of another set, run,
 * world or job makes the whole set unusable (read fails), and the op that
 * asked fails on every node (obd_snapset_verdict).
 *
 * Pure file I/O and arithmetic, no libuv: the daemon runs every call
 * that touches the disk on its worker pool, never on the loop thread.
 * state_dir must belong to the daemon's user and be writable by nobody
 * else (obd_snapset_prepare_dir). */
#ifndef OBD_SNAPSET_H
#define OBD_SNAPSET_H

#include <stddef.h>
#include <stdint.h>

#include "efstate.h"

/* Sets of a job a node keeps on disk: the newest ones by commit. */
#define OBD_SNAP_KEEP 4

/* Writes states efs[0..n) (all of one job, none torn, none changed by
 * anyone meanwhile) as set `set` of `job`: the temporary directory, every
 * file, then the manifest, each fsync'd, rename, the state_dir fsync'd.
 * Returns 0 or OBD_E_IO with why. */
int obd_snapset_write(const char *state_dir, const char *job,
                      const struct obd_ef_set *set, struct obd_ef *const *efs,
                      int n, const struct obd_ef_world *w, char *why,
                      size_t whylen);

/* Reads every state of set `id` of `job`, checking all of it before
 * returning any: the manifest (of this set, job, node and world, intact),
 * no file it does not name, and every file it names present, intact, of
 * this set, run, job, key, node and world, with the digest it lists.
 * Each length is bounded by max_bytes before allocation. 0: *out is a
 * list (linked by next) of new states (caller frees each with
 * obd_ef_free), possibly empty; otherwise OBD_E_MISSING (this node holds
 * no set of that id), OBD_E_CORRUPT ("damaged: <file>: what is wrong":
 * a file missing, added, damaged, truncated, or of another set, world or
 * job) or OBD_E_IO (the set could not be read) with why, and *out
 * untouched. */
int obd_snapset_read(const char *state_dir, const char *job, uint64_t id,
                     const struct obd_ef_world *w, uint64_t max_bytes,
                     struct obd_ef **out, char *why, size_t whylen);

/* Deletes set `id` of `job` (and its temporary directory), if any. */
void obd_snapset_delete(const char *state_dir, const char *job, uint64_t id);

/* Set `id` of `job` was committed on every node: marks it the newest
 * (its directory's time) and deletes all but `keep` sets of the job: set
 * `id` itself, whatever the clock says, and the newest others. Then, with
 * max_bytes > 0, the sets of all jobs in state_dir together stay within
 * it: every set of the job whose newest set is the oldest goes first,
 * never those of `job`. */
void obd_snapset_commit(const char *state_dir, const char *job, uint64_t id,
                        int keep, uint64_t max_bytes);

/* Whether state_dir will do: a directory of uid `uid` that nobody else
 * may write and this process may write (-1 with why otherwise). With
 * `create` a missing one is created 0700; without (--check-config) a
 * missing one passes when its parent is a directory it can be created
 * in, as the start would create it, and an existing one fails when
 * another daemon holds its lock (obd_snapset_lock_free). */
int obd_snapset_dir_ok(const char *state_dir, unsigned uid, int create,
                       char *why, size_t whylen);

/* 0 when no process holds state_dir/lock (or there is none), -1 with why
 * naming the holder's pid otherwise. Without `create`,
 * obd_snapset_dir_ok checks this too (--check-config). */
int obd_snapset_lock_free(const char *state_dir, char *why, size_t whylen);

/* Makes state_dir ready at the start: obd_snapset_dir_ok with `create`,
 * then takes state_dir/lock (flock, exclusive; the file holds this pid)
 * and removes the unfinished sets (.tmp) that an interrupted write left.
 * 0 with *lock_fd the lock's descriptor, which the caller keeps open for
 * the daemon's life (closing it releases the lock), or -1 with why
 * (another daemon holds the lock: naming its pid). */
int obd_snapset_prepare_dir(const char *state_dir, unsigned uid, int *lock_fd,
                            char *why, size_t whylen);

/* A node's part of a set as bytes, for a checkpoint to carry when the
 * daemons keep no state_dir (obcomm_export_1bit): a header (world, node,
 * job, the set's id, the number of states, a BLAKE2b-256 digest of all
 * that follows) and per state its key, count and padded length, then its
 * worker and server errors as raw floats in the machine's byte order.
 * The bytes `efs[0..n)` take as a part. */
size_t obd_snapset_part_bytes(const struct obd_ef *const *efs, int n);
/* Writes efs[0..n) (of `job`, as set `id` of node w->rank) into part,
 * which has exactly obd_snapset_part_bytes bytes. */
void obd_snapset_pack(const struct obd_ef *const *efs, int n, const char *job,
                      uint64_t id, const struct obd_ef_world *w, void *part,
                      size_t bytes);
/* Reads a part: 0 and *out a list (linked by next) of new states, when
 * it is intact, of this world and node, of `job` and of set `id`, every
 * length bounded by bytes before allocation; else OBD_E_CORRUPT with
 * why (which names what differs), *out untouched. */
int obd_snapset_unpack(const void *part, size_t bytes, const char *job,
                       uint64_t id, const struct obd_ef_world *w,
                       struct obd_ef **out, char *why, size_t whylen);

/* One node's report of the local phase of a set op (a write or a read):
 * status 0, or an OBD_E_* code with message. */
struct obd_snapreport {
    int status;
    const char *message;
};

/* The verdict of a set op from every node's report, the same on every
 * node since all of them see the same reports: 0 when every node
 * succeeded; else the first failing node's status, and msg names every
 * node that failed and why ("node 1: missing (...); node 2: ..."). */
int obd_snapset_verdict(const struct obd_snapreport *r, int nodes, char *msg,
                        size_t len);

/* The id of a snapshot taken by op `seq` of the run `run`: both agreed on
 * by every node, so every node computes the same id; never 0. */
uint64_t obd_snapset_id(uint64_t run, uint64_t seq);

#endif
