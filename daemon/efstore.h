/* The daemon's error-feedback states, one per (job, key), and their
 * snapshots in state_dir: restored at start when the world matches, written
 * on request (a collective, so every node writes at the same point) and at
 * a clean shutdown. */
#ifndef OBD_EFSTORE_H
#define OBD_EFSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "daemon.h"
#include "efstate.h"

/* The state of (job, key): in memory, else from its snapshot in state_dir
 * (after an idle eviction), else created at zero. A key that holds state
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

/* Writes every state of `job` (all jobs when NULL) into state_dir. Returns
 * 0, OBCOMM_E_INVAL without a state_dir, or OBCOMM_E_IO with why. */
int obd_efstore_save(struct obd_daemon *d, const char *job, char *why,
                     size_t whylen);

/* Loads the snapshots in state_dir (at start). */
void obd_efstore_restore(struct obd_daemon *d);

void obd_efstore_fini(struct obd_daemon *d);

/* The state of (job, key) if it exists, else NULL. */
struct obd_ef *obd_efstore_find(struct obd_daemon *d, const char *job,
                                uint64_t key);

/* 1 if no state of `job` is in use by a 1-bit op. */
int obd_efstore_idle(const struct obd_daemon *d, const char *job);

/* Recounts the memory the states hold (after work buffers changed). */
void obd_efstore_account(struct obd_daemon *d);

#endif
