/* The registry of the daemon's error-feedback states: the one place that
 * knows which state belongs to which run of which job, its version, and
 * whether it is in use, torn or doomed.
 *
 * A run is one incarnation of a job on this node: from the first trainer
 * joining the job while it has none until the last one leaves (job.c
 * draws a random run id then; the nodes agree on the run as the hash of
 * every node's id). Every state belongs to one run: a state is found
 * only by its own run, and the run's end frees every state of it. So a
 * new run starts from zero on every node, and a state of an earlier run
 * is used only when the new run restores a snapshot set explicitly
 * (obd_efstore_install).
 *
 * Snapshot sets (snapset.h) hold a run's states under an id. With a
 * state_dir they are files; without one the daemon keeps the newest set
 * of each job in memory here (lost when the daemon stops). Those sets are
 * bounded apart from the live runs' states (which ef_max_bytes bounds):
 * a set whose job's run ended here retained_sets_max_age_s ago is
 * dropped, and all of them together stay within retained_sets_max_bytes
 * (sets of ended runs go first, the earliest ended first). The bounds
 * are applied whenever a set is saved or looked up, a run ends or a new
 * state is made.
 *
 * Everything here runs on the loop thread and does no file I/O. */
#ifndef OBD_EFSTORE_H
#define OBD_EFSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "daemon.h"
#include "efstate.h"

/* The state of (job, run, key), created at zero on its first use. A key
 * that holds state for another count is an error (OBD_E_STATE), never
 * silently re-initialised; a new state that would pass ef_max_bytes is
 * refused (OBD_E_TOOBIG, why names the bound). */
int obd_efstore_get(struct obd_daemon *d, const char *job, uint64_t run,
                    uint64_t key, uint64_t count, struct obd_ef **out,
                    char *why, size_t whylen);

/* The state of (job, run, key) if it exists, else NULL. */
struct obd_ef *obd_efstore_find(struct obd_daemon *d, const char *job,
                                uint64_t run, uint64_t key);

/* The version of (job, run, key): {0, 0, 0} without a state. */
struct obd_efversion obd_efstore_version(struct obd_daemon *d, const char *job,
                                         uint64_t run, uint64_t key);

/* An op begins or ends using ef (a 1-bit op, one at a time; a snapshot's
 * write). Begin resets a state a failed op left torn (counted in
 * ef_resets, its version back to zero); end frees a state doomed
 * meanwhile. */
void obd_efstore_begin(struct obd_daemon *d, struct obd_ef *ef);
void obd_efstore_end(struct obd_daemon *d, struct obd_ef *ef);

/* A 1-bit op `seq` committed both states of ef: its version counts it. */
void obd_efstore_applied(struct obd_ef *ef, uint64_t seq);

/* Forgets the state of (job, run, key): the next op on the key starts at
 * zero, with any count. */
void obd_efstore_reset(struct obd_daemon *d, const char *job, uint64_t run,
                       uint64_t key);

/* Every state of (job, run) back to zero (forgotten), counted in
 * ef_resets and logged with why: what every node does together when the
 * nodes' states disagree or a restore failed. */
void obd_efstore_reset_run(struct obd_daemon *d, const char *job, uint64_t run,
                           const char *why);

/* The run ended (its last trainer here left): its states are freed. */
void obd_efstore_run_end(struct obd_daemon *d, const char *job, uint64_t run);

/* 1 if no state of (job, run) is in use. */
int obd_efstore_idle(const struct obd_daemon *d, const char *job, uint64_t run);

/* The states of (job, run), each begun (obd_efstore_begin), into a new
 * array *out of *n (caller ends each and frees the array:
 * obd_efstore_release). OBD_E_STATE with why when one is torn (it is
 * neither the old step nor the new one), OBD_E_NOMEM. */
int obd_efstore_collect(struct obd_daemon *d, const char *job, uint64_t run,
                        struct obd_ef ***out, int *n, char *why, size_t whylen);
void obd_efstore_release(struct obd_daemon *d, struct obd_ef **efs, int n);

/* Replaces every state of (job, run) by `list` (linked by next; takes
 * ownership): the run goes back to snapshot `origin` at op `seq`. */
void obd_efstore_install(struct obd_daemon *d, const char *job, uint64_t run,
                         struct obd_ef *list, uint64_t origin, uint64_t seq);

/* Without a state_dir: the newest set of a job, in memory. put takes
 * ownership of `list` (copies, linked by next), drops the job's previous
 * set and applies the bounds (never to the set just put). find returns
 * set `id`'s states and *hold, or NULL (not held here; *hold untouched);
 * the states stay valid, even if the set is dropped meanwhile, until
 * obd_efstore_memset_release(d, *hold) (a pool task reads them). */
void obd_efstore_memset_put(struct obd_daemon *d, const char *job, uint64_t id,
                            struct obd_ef *list);
const struct obd_ef *obd_efstore_memset_find(struct obd_daemon *d,
                                             const char *job, uint64_t id,
                                             struct obd_memset **hold);
void obd_efstore_memset_release(struct obd_daemon *d, struct obd_memset *hold);
/* The bound on every in-memory set together: retained_sets_max_bytes, or
 * without it the live states' bound (ef_max_bytes, or a quarter of the
 * machine's memory). */
uint64_t obd_efstore_retained_limit(const struct obd_daemon *d);
/* Forgets set `id` of `job` (a snapshot that failed on another node). */
void obd_efstore_memset_drop(struct obd_daemon *d, const char *job,
                             uint64_t id);

/* Writes up to max keys of (job, run) with their count and version;
 * returns how many (obcommctl status). */
int obd_efstore_keys(const struct obd_daemon *d, const char *job, uint64_t run,
                     const struct obd_ef **out, int max);

/* Recounts the memory the states and in-memory sets hold. */
void obd_efstore_account(struct obd_daemon *d);

void obd_efstore_fini(struct obd_daemon *d);

#endif
