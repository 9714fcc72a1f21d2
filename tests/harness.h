/* Test harness: real obcommd processes on loopback, real trainer processes
 * linking libobcomm. Every process it starts dies with the test process
 * (PR_SET_PDEATHSIG) and is reaped by hx_stop, also after a failure. */
#ifndef HX_HARNESS_H
#define HX_HARNESS_H

#include <obcomm.h>
#include <sys/types.h>

#define HX_MAX_NODES 8

struct hx_cluster {
    int nodes;
    pid_t daemon[HX_MAX_NODES];
    int exited[HX_MAX_NODES]; /* reaped early; status below */
    int status[HX_MAX_NODES];
    int port[HX_MAX_NODES];
    char sock[HX_MAX_NODES][108];
    char dir[128];
    char peers[HX_MAX_NODES * 24];
    const char *const *each[HX_MAX_NODES]; /* extra flags per node */
};

/* A TCP port for a test daemon, or -1 (message on stderr): free on every
 * IPv4 address, outside the kernel's ephemeral range (so no outgoing
 * connection gets it) and locked against other test processes until this
 * process exits (harness.c says how). Tests take their ports from here:
 * a fixed number may be in use, a kernel-chosen one (bind to port 0) may
 * be handed to some connection before the daemon binds it. */
int hx_reserve_port(void);

/* Sleeps ms milliseconds (the one sleep of the tests). */
void hx_sleep_ms(int ms);

/* Starts `nodes` daemons (binary from $OBCOMMD) on 127.0.0.1 with ports
 * from hx_reserve_port, each with its own socket, plus `extra` flags (may be
 * NULL), and waits until every daemon says READY=1 on the NOTIFY_SOCKET
 * the harness gives it (as systemd's Type=notify does: the daemon says it
 * once its sockets listen). Returns 0 or -1 (message on stderr). Daemons log at
 * info, unless their flags name a config file
 * (-c/--config): then the file decides (a flag would override it, also on
 * reload). */
int hx_start(struct hx_cluster *c, int nodes, const char *const *extra);

/* As hx_start, with flags per node: each[i] is NULL or NULL-terminated. */
int hx_start_each(struct hx_cluster *c, int nodes,
                  const char *const *const *each);

/* 1 if daemon i's stderr (kept in the cluster's directory) contains s. */
int hx_log_contains(const struct hx_cluster *c, int i, const char *s);
/* As hx_log_contains, polling for up to ms: for a line the daemon writes
 * after its socket already answers. */
int hx_log_wait(const struct hx_cluster *c, int i, const char *s, int ms);

/* SIGTERM to every daemon, then waits; returns the number of daemons that
 * did not exit with status 0 (a sanitizer report makes it non-zero).
 * Removes the cluster's directory. */
int hx_stop(struct hx_cluster *c);

/* Sends sig (SIGTERM: a clean shutdown, counted as hx_stop does; SIGKILL:
 * a crash) to every daemon and reaps them, keeping ports, sockets, flags
 * and logs for hx_restart. */
int hx_halt(struct hx_cluster *c, int sig);
int hx_restart(struct hx_cluster *c);
/* SIGKILLs daemon i alone (a crash) and starts it again with the same
 * port, socket, flags and log while the others keep running. */
int hx_crash_restart(struct hx_cluster *c, int i);

/* Stops daemon i alone with sig (SIGKILL: a crash), reaps it, waits (up to
 * 10 s) until every other daemon that had a full mesh has seen its link
 * to i go (links_up), and starts it again with the same port, socket and
 * flags; waits for its READY=1 and then until those daemons have their
 * full mesh back (a node whose link to i is down fails a new op at once).
 * Returns 0 or -1. */
int hx_restart_node(struct hx_cluster *c, int i, int sig);

/* A counter of daemon i, from one StatusRequest over its socket (what
 * obcommctl shows); -1 if unavailable (message on stderr). */
long long hx_metric(const struct hx_cluster *c, int i, const char *name);

/* 1 if daemon i is still running. */
int hx_alive(struct hx_cluster *c, int i);

/* A trainer's body; returns 0 on success. rank and size are obcomm's. */
typedef int (*hx_trainer_fn)(obcomm_t *comm, void *arg);

/* Starts one trainer process: local rank lr of per_node on node `node`,
 * joining `job` with the given op deadline, that runs fn and exits with
 * fn's return value when it is 0..125, else 1 (also when it could not
 * connect). It
 * dies with the test process and inherits its descriptors (open a raw
 * client connection after spawning, or the trainer keeps it open). Returns
 * its pid, or -1 when fork failed. The caller reaps it with hx_wait. */
pid_t hx_spawn(struct hx_cluster *c, int node, int lr, int per_node,
               const char *job, int timeout_ms, hx_trainer_fn fn, void *arg);

/* Waits at most wait_ms for process pid (from hx_spawn) to exit and returns
 * its wait status; -1 when it was still running, in which case it has been
 * SIGKILLed and reaped. */
int hx_wait(pid_t pid, int wait_ms);

/* Runs fn in per_node trainer processes on every node of job `job`, with
 * the given op deadline, and waits for all of them (at most wait_s
 * seconds, then kills them). Returns the number of trainers that failed. */
int hx_run(struct hx_cluster *c, int per_node, const char *job, int timeout_ms,
           int wait_s, hx_trainer_fn fn, void *arg);

/* Copies the file src to dst with the 8 bytes at off zeroed (a damaged
 * checkpoint); 0 or -1. */
int hx_damaged_copy(const char *src, const char *dst, long off);

/* Prints a trainer-side failure with its rank and returns 1. */
int hx_fail(obcomm_t *comm, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
