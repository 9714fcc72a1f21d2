/* The daemon's error-feedback states, one per (job, key), and their
 * snapshot sets in state_dir.
 *
 * A snapshot set is every state of one job on this node, tagged with a
 * snapshot id that all nodes agree on: state_dir/set-<job>-<id>/, one file
 * per key. A set is written into <dir>.tmp and renamed: a node holds the
 * set once the rename is done. The 1-bit snapshot op is two-phase
 * (coll_onebit.c): every node writes the set, then tells every node; the
 * op succeeds only when every node wrote it, and only then are older sets
 * deleted. Every 1-bit op announces the ids this node holds, so the first
 * 1-bit op of a job after a start restores the newest id that every node
 * holds (obd_efstore_resolve), never a mix; sets not held everywhere are
 * deleted then. When one daemon restarted while the others kept the job's
 * states in memory, all of them go back to that set. States are loaded
 * lazily, on their key's first op.
 *
 * Ids: (epoch << 32) | (seq & 0xffffffff), where epoch is one more than
 * the highest epoch any node announced for the op, so that ids grow across
 * restarts; a clean shutdown writes a set with the job's highest epoch
 * seen plus one and the sequence after its last 1-bit op, which matches on
 * nodes that saw the same ops (where it does not, it is simply not held
 * everywhere and the previous set is restored).
 *
 * Idle eviction writes a state into state_dir/spill/, which is valid only
 * while the daemon runs (emptied at start) and is folded into the next
 * set. state_dir must belong to the daemon's user and be writable by
 * nobody else (refused at start otherwise). */
#ifndef OBD_EFSTORE_H
#define OBD_EFSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "daemon.h"
#include "efstate.h"

/* The state of (job, key): in memory, else from the spill (after an idle
 * eviction), else from the set restored for the job, else created at
 * zero. A key that holds state
 * for another count is an error (OBCOMM_E_STATE), never silently
 * re-initialised; a new state that would pass ef_max_bytes is refused
 * (OBCOMM_E_NOMEM, why names the bound). */
int obd_efstore_get(struct obd_daemon *d, const char *job, uint64_t key,
                    uint64_t count, struct obd_ef **out, char *why,
                    size_t whylen);

/* A 1-bit op begins or ends using ef (one at a time: see
 * obd_efstore_idle). Begin resets a state a failed op left torn (counted
 * in ef_resets); end frees a state reset meanwhile and starts its idle
 * clock. */
void obd_efstore_begin(struct obd_daemon *d, struct obd_ef *ef);
void obd_efstore_end(struct obd_daemon *d, struct obd_ef *ef);

/* A job got its first trainer here (active) or lost its last one: an idle
 * job's states are evicted after ef_idle_ms. */
void obd_efstore_job_active(struct obd_daemon *d, const char *job, int active);

/* The eviction timer (ef_idle_ms): started by init, closed by close. */
void obd_efstore_init(struct obd_daemon *d);
void obd_efstore_close(struct obd_daemon *d);

/* Forgets the state of (job, key) and its snapshot file; the next op on the
 * key starts at zero, with any count. */
void obd_efstore_reset(struct obd_daemon *d, const char *job, uint64_t key);

/* Most snapshot ids a node announces for a job (its newest ones). */
#define OBD_SNAP_HELD 8

/* The ids of the sets of `job` this node holds, ascending, the newest
 * `max` of them; returns how many. */
int obd_efstore_held(struct obd_daemon *d, const char *job, uint64_t *ids,
                     int max);

/* What node n announced with a 1-bit op: the ids of the sets it holds and
 * the id of its daemon's run (obd_daemon.boot_id). */
struct obd_efview {
    const uint64_t *held;
    int nheld;
    uint64_t boot;
};

/* A 1-bit op (allreduce, reset or snapshot) `seq` of `job` is about to
 * start; v[n] is what node n announced for it, ours included. The first
 * call for a job after this daemon started, and the first after any node
 * restarted (its boot id changed), picks the set to restore: the newest id
 * every node holds. When another node restarted, the states of the job
 * in memory here are dropped as well, so that every node goes back to
 * that set (or to zero) together. Returns the id a snapshot op with these
 * announces writes. */
uint64_t obd_efstore_resolve(struct obd_daemon *d, const char *job,
                             uint64_t seq, const struct obd_efview *v,
                             int nodes);

/* Phase 1 of a snapshot: writes every state of `job` (the ones in memory,
 * spilled, and those still in the restored set) as set `id`. Returns 0
 * (this node holds the set), OBCOMM_E_INVAL without a state_dir, OBCOMM_E_IO
 * or OBCOMM_E_STATE (a state half-updated by a failed op) with why. */
int obd_efstore_write_set(struct obd_daemon *d, const char *job, uint64_t id,
                          char *why, size_t whylen);
/* Phase 2: every node holds set `id`: it becomes the one restored, and
 * older sets of the job are deleted. */
void obd_efstore_commit_set(struct obd_daemon *d, const char *job, uint64_t id);
/* Set `id` can be complete nowhere (a node failed to write it): deleted. */
void obd_efstore_drop_set(struct obd_daemon *d, const char *job, uint64_t id);

/* A clean shutdown: writes a set of every job that ran a 1-bit op (see
 * above). Returns 0 or OBCOMM_E_IO with why (the other jobs are still
 * written). */
int obd_efstore_save(struct obd_daemon *d, char *why, size_t whylen);

/* At start: checks state_dir (created 0700 when missing; refused unless it
 * belongs to the daemon's user and nobody else may write it), removes
 * unfinished sets, empties the spill and lists the sets held. Returns 0 or
 * OBCOMM_E_INVAL (logged). */
int obd_efstore_open(struct obd_daemon *d);

void obd_efstore_fini(struct obd_daemon *d);

/* The state of (job, key) if it exists, else NULL. */
struct obd_ef *obd_efstore_find(struct obd_daemon *d, const char *job,
                                uint64_t key);

/* 1 if no state of `job` is in use by a 1-bit op. */
int obd_efstore_idle(const struct obd_daemon *d, const char *job);

/* Recounts the memory the states hold (after work buffers changed). */
void obd_efstore_account(struct obd_daemon *d);

#endif
