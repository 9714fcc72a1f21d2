/* The daemon: one libuv loop that owns every handle, and the state the
 * modules share. Modules get a struct obd_daemon * explicitly; there are no
 * mutable globals. */
#ifndef OBD_DAEMON_H
#define OBD_DAEMON_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "log.h"
#include "metrics.h"

#define container_of(ptr, type, member) \
    ((type *)((char *)(ptr)-offsetof(type, member)))

struct obd_client;
struct obd_job;
struct obd_peer;
struct obd_link;
struct obd_ef;
struct obd_shm;
struct obd_stall;

struct obd_daemon {
    uv_loop_t loop;
    struct obd_config cfg;
    struct obd_log log;
    uv_signal_t sigterm;
    uv_signal_t sigint;
    /* ops: systemd's watchdog (WatchdogSec=): WATCHDOG=1 from the loop. */
    uv_timer_t watchdog;
    int watchdog_on;
    struct obd_stall *stall; /* ops: stall.c */
    uint64_t start_ms;
    int closing;

    /* Unix socket for trainers and obcommctl (ctl.c). */
    int ctl_fd;
    uv_poll_t ctl_poll;
    int ctl_started;
    struct obd_client *clients;
    int nclients;

    /* Jobs and their ops (job.c). */
    struct obd_job *jobs;
    int njobs;

    /* The mesh (peers.c): one entry per node, ours included. */
    struct obd_peer *peers;
    uv_tcp_t listener;
    int listening;
    struct obd_link *unbound; /* accepted links before their Hello */

    /* Error-feedback states of the 1-bit allreduce (efstore.c). */
    struct obd_ef *efs;

    /* Worker-pool tasks that touch trainer memory, and buffers whose
     * trainer left while such a task ran: unmapped when none runs. */
    int threads;
    int shm_tasks;
    struct obd_shm *zombies;

    /* An accumulation buffer kept between ops (coll_ring.c). */
    void *scratch;
    size_t scratch_bytes;

    struct obd_metrics metrics;
};

/* Sets up the loop and reads nothing: cfg must be finished. */
int obd_daemon_init(struct obd_daemon *d, const struct obd_config *cfg);
/* Opens the Unix socket, the TCP listener and starts dialing peers. */
int obd_daemon_start(struct obd_daemon *d);
/* Runs until obd_daemon_close() and every handle is closed. */
int obd_daemon_run(struct obd_daemon *d);
/* Begins a clean shutdown: fails ops in flight, closes every handle.
 * Idempotent and non-blocking. */
void obd_daemon_close(struct obd_daemon *d);
void obd_daemon_fini(struct obd_daemon *d);

/* A buffer of at least `bytes` (its size in *cap), reusing the one kept
 * from an earlier op when it is large enough; give it back with
 * obd_daemon_scratch_put(d, p, cap). */
void *obd_daemon_scratch_get(struct obd_daemon *d, size_t bytes, size_t *cap);
void obd_daemon_scratch_put(struct obd_daemon *d, void *p, size_t cap);

/* Milliseconds on the loop's clock. */
uint64_t obd_daemon_now(const struct obd_daemon *d);

#endif
