/* The daemon: one libuv loop that owns every handle, and the state the
 * modules share. Modules get a struct obd_daemon * explicitly; there are no
 * mutable globals.
 *
 * The house (an arrow is "calls into"; tests/check_layers.py fails on any
 * circle of calls or includes, reading the built objects):
 *
 *                              main.c
 *                                |
 *                             daemon.c
 *              (wires struct obd_hooks, signals, shutdown)
 *          /        |          |          \          \
 *      ctl.c      stall.c    peers.c    efstore.c   snapset.c
 *   (trainers)   (warnings) (the mesh)  (EF states)  (set files)
 *     |     \       |    \     |  \
 *  status.c  +--> job.c   +--> | handshake.c -> auth.c
 *     |            |           frame.c
 *     +--> job.c  coll.c (the registry, the fingerprint)
 *                  |
 *   coll_*.c (one per algorithm), coll_onebit.c, coll_efstate.c
 *          |            |               |
 *       reduce.c   onebit_task.c    efstore.c, snapset.c
 *                  codec.c, efstate.c
 *
 * peers.c and handshake.c are one module in two files (a declared friend
 * pair). Upward traffic goes only through pointers: job answers trainers
 * (hooks.answer, served by ctl.c), sends to nodes (hooks.send_ctrl,
 * hooks.send_data, served by peers.c) and tells the mesh that ops changed
 * (hooks.ops_changed); peers hands what arrives to the jobs
 * (hooks.peer_*, hooks.data_*); an algorithm reaches job only through the
 * table job hands each op (coll.h, op->svc); status.c answers through the
 * send function ctl.c passes it. runq.c, shm.c, log.c, trace.c,
 * metrics.c and config.c are leaves that everyone uses. */
#ifndef OBD_DAEMON_H
#define OBD_DAEMON_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "auth.h"
#include "bufpool.h"
#include "config.h"
#include "log.h"
#include "metrics.h"
#include "runq.h"
#include "trace.h"

#define container_of(ptr, type, member) \
    ((type *)((char *)(ptr)-offsetof(type, member)))

struct obd_daemon;
struct obd_client;
struct obd_job;
struct obd_peer;
struct obd_link;
struct obd_ef;
struct obd_memset;
struct obd_shm;
struct obd_frame;
struct Obcomm__PeerMsg;

/* Where a data frame's payload goes (obd_hooks.data_begin). */
enum obd_data_dest {
    OBD_DATA_DISCARD, /* read and drop it: its op is gone or failed */
    OBD_DATA_PARK,    /* stop reading until the op starts here */
    OBD_DATA_INTO,    /* read it into *dst; data_end follows */
};

/* How modules reach the ones above them. The daemon wires these at init
 * (daemon.c), so the modules form a tree: ctl and the collectives call
 * into job, job calls into peers, and peers and job reach back only
 * through these pointers, never by including each other. Tests replace
 * them to drive a module without sockets. No hook may free anything its
 * caller holds: whatever must be released is posted to the ready queue.
 */
struct obd_hooks {
    /* job -> a trainer's connection: Complete{seq, status, message}. */
    void (*answer)(struct obd_client *c, uint64_t seq, int status,
                   const char *message, uint64_t value, uint64_t bytes);
    /* job -> the mesh: a control message to node `to`; 0 or an error. */
    int (*send_ctrl)(struct obd_daemon *d, int to,
                     const struct Obcomm__PeerMsg *msg);
    /* job -> the mesh: 1 when node's link was up and is down now, with
     * what ended it in why; 0 while it is up or before it first came up
     * (as obd_peers_lost). May be NULL: no node is ever lost. */
    int (*node_lost)(const struct obd_daemon *d, int node, char *why,
                     size_t len);
    /* job -> the mesh: 1 while node's link is not up, lost or never up
     * yet, with why (as obd_peers_down). May be NULL: every link is up. */
    int (*node_down)(const struct obd_daemon *d, int node, char *why,
                     size_t len);
    /* job -> the mesh: a data frame, as obd_peers_send_data. */
    int (*send_data)(struct obd_daemon *d, int to, struct obd_frame *f,
                     const void *payload, void (*done)(void *arg, int status),
                     void *arg);
    /* peers -> jobs: a node's link came up, or went down. */
    void (*peer_up)(struct obd_daemon *d, int node);
    void (*peer_lost)(struct obd_daemon *d, int node, const char *why);
    /* peers -> jobs: a control message past the handshake. */
    void (*peer_msg)(struct obd_daemon *d, int from,
                     const struct Obcomm__PeerMsg *msg);
    /* peers -> jobs: where frame f's payload goes. OBD_DATA_INTO sets
     * *dst (exactly f->len bytes) and *token, which holds a reference
     * until data_end. */
    enum obd_data_dest (*data_begin)(struct obd_daemon *d, int from,
                                     const struct obd_frame *f, void **dst,
                                     void **token);
    /* 0 once the destination must not be written any more (its op failed):
     * the rest of the payload is then discarded. */
    int (*data_live)(void *token);
    /* The payload is in (complete) or the link gave up on it. */
    void (*data_end)(void *token, int from, const struct obd_frame *f,
                     int complete);
    /* job -> the mesh: an op started or ended, so a link parked on a
     * frame of an op that had not started may go on (on a later turn).
     * May be NULL. */
    void (*ops_changed)(struct obd_daemon *d);
};

/* Longest a shutdown waits for running ops to finish. */
#define OBD_SHUTDOWN_GRACE_MS 5000

/* Other nodes' ended runs the daemon remembers (registry.c): a detached job
 * adds one per node, the oldest go first. */
#define OBD_RUNS_ENDED 512
struct obd_stall;
struct obd_ctl_listener;

struct obd_daemon {
    uv_loop_t loop;
    struct obd_config cfg;
    struct obd_log log;
    uv_signal_t sigterm;
    uv_signal_t sigint;
    uv_signal_t sighup;
    /* ops: systemd's watchdog (WatchdogSec=): WATCHDOG=1 from the loop. */
    uv_timer_t watchdog;
    int watchdog_on;
    struct obd_stall *stall; /* ops: stall.c */
    uint64_t start_ms;
    /* Shutdown: 1 while running ops drain and the pool empties, 2 once
     * the handles are closing (daemon.c). */
    int closing;
    uv_timer_t drain;
    uint64_t drain_deadline;
    /* The command line, re-read on SIGHUP. */
    int argc;
    char **argv;

    struct obd_hooks hooks;
    struct obd_runq runq;
    struct obd_trace trace; /* trace_file's timeline (trace.c) */
    /* Posted by hooks.ops_changed: links parked on a frame of an op that
     * had not started look at it again (peers.c). */
    struct obd_ready links_resume;
    /* Pool tasks in flight, all ops together (op.c counts them). */
    int pool_tasks;

    /* Unix socket for trainers and obcommctl (ctl.c). */
    /* ctl.c's own: the socket's accept side (NULL until obd_ctl_start and
     * after obd_ctl_close). */
    struct obd_ctl_listener *ctl_listener;
    struct obd_client *clients;
    int nclients;
    /* Buffers the clients have registered, all together, and the bound
     * on them (max_buffers, resolved by obd_ctl_start). */
    int64_t shm_buffers;
    int64_t shm_buffers_max;

    /* Jobs and their ops (job.c). */
    struct obd_job *jobs;
    int njobs;
    /* Other nodes' runs of jobs that ended here, newest last (registry.c): a
     * late message of one is dropped, not taken for a new run. */
    struct obd_run_ended {
        uint32_t job;
        int node;
        uint64_t run;
    } runs_ended[OBD_RUNS_ENDED];
    unsigned runs_ended_next;

    /* The mesh (peers.c): one entry per node, ours included. */
    struct obd_peer *peers;
    uv_tcp_t listener;
    int listening;
    struct obd_link *unbound; /* links before the end of the handshake */
    /* Heartbeats on every established link, and the check that each
     * carried something within peer_timeout_ms (peers.c). */
    uv_timer_t heartbeat;
    uint64_t heartbeat_ms; /* loop time of the last tick */
    /* state_dir/lock, held for the daemon's life (snapset.c); -1 without
     * a state_dir. */
    int state_lock_fd;

    /* The cluster key (auth_key_file), read at start. */
    uint8_t auth_key[OBD_AUTH_KEY];
    int keyed;
    /* Accepting paused after EMFILE/ENFILE (peers.c: the listener), and
     * repeated log lines held back. */
    uv_timer_t listen_pause;

    /* Error-feedback states of the 1-bit allreduce and, without a
     * state_dir, the newest snapshot set of each job (efstore.c). */
    struct obd_ef *efs;
    struct obd_memset *memsets;

    int threads;

    /* Buffers kept between ops, lent to the algorithms (bufpool.h). */
    struct obd_bufpool bufpool;

    struct obd_metrics metrics;
};

/* Sets up the loop and reads nothing: cfg must be finished. */
int obd_daemon_init(struct obd_daemon *d, const struct obd_config *cfg);
/* Opens the Unix socket, the TCP listener and starts dialing peers. */
int obd_daemon_start(struct obd_daemon *d);
/* Keeps the command line for SIGHUP, which re-reads it (borrowed: must
 * stay valid while the daemon runs). */
void obd_daemon_set_args(struct obd_daemon *d, int argc, char **argv);

/* Runs until obd_daemon_close() and every handle is closed. */
int obd_daemon_run(struct obd_daemon *d);
/* Begins a clean shutdown: ops still collecting fail at once, running ops
 * get a moment to finish, then, once the worker pool has drained, the
 * error feedback is saved and every handle closed. Idempotent and
 * non-blocking. */
void obd_daemon_close(struct obd_daemon *d);
void obd_daemon_fini(struct obd_daemon *d);

/* Milliseconds on the loop's clock. */
uint64_t obd_daemon_now(const struct obd_daemon *d);

#endif
