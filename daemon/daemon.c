#include "daemon.h"
#include "err.h"

#include <obcomm.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ctl.h"
#include "efstore.h"
#include "snapset.h"
#include "job.h"
#include "peers.h"
#include "stall.h"

uint64_t obd_daemon_now(const struct obd_daemon *d)
{
    return uv_now(&d->loop);
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct obd_daemon *d = h->data;
    obd_log_info(&d->log, "signal %d: shutting down", signum);
    char why[64];
    snprintf(why, sizeof(why), "it received %s and shut down",
             signum == SIGTERM ? "SIGTERM" : "SIGINT");
    obd_ctl_goodbye(d, why);
    obd_daemon_close(d);
}

/* SIGHUP: reads the configuration again (the same file and flags) and
 * applies what can change while running; everything else that changed is
 * named, to take effect at the next restart. */
static void on_sighup(uv_signal_t *h, int signum)
{
    struct obd_daemon *d = h->data;
    (void)signum;
    struct obd_config cfg;
    char err[512];
    int check = 0, help = 0;
    obd_config_defaults(&cfg);
    if (d->argv == NULL ||
        obd_config_parse_args(&cfg, d->argc, d->argv, &check, &help, err,
                              sizeof(err)) ||
        obd_config_finish(&cfg, err, sizeof(err))) {
        obd_log_error(&d->log, "SIGHUP: configuration not reloaded: %s",
                      d->argv ? err : "no command line kept");
        return;
    }
    char changed[1024];
    int n = obd_config_reload(&d->cfg, &cfg, changed, sizeof(changed));
    d->log.level = d->cfg.log_level_num;
    if (n == 0)
        obd_log_info(&d->log, "SIGHUP: configuration reloaded; nothing that "
                              "can change while running changed");
    else
        obd_log_info(&d->log, "SIGHUP: configuration reloaded: %s", changed);
    char later[1024];
    if (obd_config_diff_fixed(&d->cfg, &cfg, later, sizeof(later)) > 0)
        obd_log_warn(&d->log,
                     "SIGHUP: changed but applied only at a restart: %s",
                     later);
}

/* The answer hook: job.c reaches trainers only through it. */
static void answer_trainer(struct obd_client *c, uint64_t seq, int status,
                           const char *message, uint64_t value, uint64_t bytes)
{
    obd_ctl_complete(c, seq, status, message, value, bytes);
}

static const struct obd_hooks default_hooks = {
    .answer = answer_trainer,
    .send_ctrl = obd_peers_send_ctrl,
    .send_data = obd_peers_send_data,
    .node_lost = obd_peers_lost,
    .node_down = obd_peers_down,
    .peer_up = obd_job_on_peer_up,
    .peer_lost = obd_job_on_peer_lost,
    .peer_msg = obd_job_on_peer_msg,
    .data_begin = obd_job_data_begin,
    .data_live = obd_job_data_live,
    .data_end = obd_job_data_end,
    .ops_changed = obd_peers_ops_changed,
};

int obd_daemon_init(struct obd_daemon *d, const struct obd_config *cfg)
{
    memset(d, 0, sizeof(*d));
    d->cfg = *cfg;
    d->log.level = cfg->log_level_num;
    d->log.rank = (int)cfg->rank;
    d->state_lock_fd = -1;
    d->threads = (int)cfg->threads;
    if (d->threads == 0) {
        uv_cpu_info_t *cpus;
        int ncpu = 1;
        if (uv_cpu_info(&cpus, &ncpu) == 0)
            uv_free_cpu_info(cpus, ncpu);
        d->threads = ncpu > 0 ? ncpu : 1;
    }
    int rc = uv_loop_init(&d->loop);
    if (rc) {
        obd_log_error(&d->log, "event loop: %s", uv_strerror(rc));
        return OBD_E_SYS;
    }
    d->hooks = default_hooks;
    obd_runq_init(&d->runq, &d->loop);
    d->start_ms = uv_now(&d->loop);
    uv_signal_init(&d->loop, &d->sigterm);
    uv_signal_init(&d->loop, &d->sigint);
    uv_signal_init(&d->loop, &d->sighup);
    uv_timer_init(&d->loop, &d->drain);
    uv_timer_init(&d->loop, &d->listen_pause);
    d->sigterm.data = d;
    d->sigint.data = d;
    d->sighup.data = d;
    /* A trainer that dies while we write to it must not kill us. */
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* Tells systemd (Type=notify) that the daemon is serving, or stopping.
 * The protocol is one datagram to $NOTIFY_SOCKET; a leading '@' names an
 * abstract socket. Without systemd this does nothing. */
static void sd_notify_state(const char *state)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (path == NULL || path[0] == '\0' || strlen(path) >= 108)
        return;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, path, strlen(path));
    if (sa.sun_path[0] == '@')
        sa.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    socklen_t len =
        (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path));
    (void)sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa,
                 len);
    close(fd);
}

/* ops: the watchdog period systemd asks for, in microseconds; 0 when
 * there is none or it is meant for another process. */
static uint64_t watchdog_usec(void)
{
    const char *usec = getenv("WATCHDOG_USEC");
    const char *pid = getenv("WATCHDOG_PID");
    if (usec == NULL || usec[0] == '\0')
        return 0;
    if (pid != NULL && pid[0] != '\0' &&
        strtoll(pid, NULL, 10) != (long long)getpid())
        return 0;
    char *end;
    unsigned long long v = strtoull(usec, &end, 10);
    return *end == '\0' ? (uint64_t)v : 0;
}

static void on_watchdog(uv_timer_t *t)
{
    (void)t;
    sd_notify_state("WATCHDOG=1");
}

int obd_daemon_start(struct obd_daemon *d)
{
    uv_signal_start(&d->sigterm, on_signal, SIGTERM);
    uv_signal_start(&d->sigint, on_signal, SIGINT);
    uv_signal_start(&d->sighup, on_sighup, SIGHUP);
    char why[9000]; /* room for state_dir twice (snapset.c) */
    if (obd_trace_open(d, why, sizeof(why)) != 0) {
        obd_log_error(&d->log, "%s", why);
        obd_daemon_close(d);
        return OBD_E_IO;
    }
    if (d->cfg.auth_key_file[0] != '\0') {
        char err[512] = "cannot initialise libsodium";
        if (obd_auth_init() != 0 ||
            obd_auth_key_load(d->cfg.auth_key_file, d->auth_key, err,
                              sizeof(err)) != 0) {
            obd_log_error(&d->log, "%s", err);
            obd_daemon_close(d);
            return OBD_E_INVAL;
        }
        d->keyed = 1;
    }
    int rc = 0;
    if (d->cfg.state_dir[0] != '\0' &&
        obd_snapset_prepare_dir(d->cfg.state_dir, (unsigned)geteuid(),
                                &d->state_lock_fd, why, sizeof(why)) != 0) {
        obd_log_error(&d->log, "%s", why);
        rc = OBD_E_INVAL;
    }
    if (rc == 0)
        rc = obd_peers_start(d);
    if (rc == 0)
        rc = obd_ctl_start(d);
    if (rc == 0)
        rc = obd_stall_start(d); /* ops */
    if (rc) {
        obd_daemon_close(d);
        return rc;
    }
    obd_log_info(
        &d->log, "obcommd 0.1.0: cluster %s, node %lld of %d, socket %s",
        d->cfg.cluster, (long long)d->cfg.rank, d->cfg.nodes, d->cfg.socket);
    char ready[160];
    snprintf(ready, sizeof(ready), "READY=1\nSTATUS=node %lld of %d",
             (long long)d->cfg.rank, d->cfg.nodes);
    sd_notify_state(ready);
    /* ops: a loop that stops turning stops the pings, and systemd restarts
     * the daemon; half the period leaves room for one late turn. */
    uint64_t wd = watchdog_usec() / 2000;
    if (wd > 0) {
        uv_timer_init(&d->loop, &d->watchdog);
        uv_timer_start(&d->watchdog, on_watchdog, wd, wd);
        d->watchdog_on = 1;
    }
    return 0;
}

void obd_daemon_set_args(struct obd_daemon *d, int argc, char **argv)
{
    d->argc = argc;
    d->argv = argv;
}

int obd_daemon_run(struct obd_daemon *d)
{
    return uv_run(&d->loop, UV_RUN_DEFAULT);
}

/* The last step of a shutdown, once no op runs and the pool is empty:
 * every handle closes. The error feedback is not saved: a run's state
 * ends with the run, and a checkpoint's snapshot set was written when
 * the trainers asked (efstore.h). */
static void close_handles(struct obd_daemon *d)
{
    d->closing = 2;
    uv_close((uv_handle_t *)&d->drain, NULL);
    obd_stall_close(d); /* ops */
    obd_ctl_close(d);
    obd_peers_close(d);
    if (d->watchdog_on) /* ops */
        uv_close((uv_handle_t *)&d->watchdog, NULL);
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->sigint, NULL);
    uv_close((uv_handle_t *)&d->sighup, NULL);
    uv_close((uv_handle_t *)&d->listen_pause, NULL);
    obd_trace_close(d);
}

/* Polls the drain: running ops may finish until the grace ends, after
 * which they fail; either way the handles close only once no pool task
 * runs any more, so no task writes into freed memory. */
static void on_drain(uv_timer_t *t)
{
    struct obd_daemon *d = container_of(t, struct obd_daemon, drain);
    if (d->closing != 1)
        return;
    if (obd_daemon_now(d) >= d->drain_deadline)
        obd_job_fail_all(d, "obcommd is shutting down");
    if (obd_job_busy(d) == 0)
        close_handles(d);
}

void obd_daemon_close(struct obd_daemon *d)
{
    if (d->closing)
        return;
    d->closing = 1;
    sd_notify_state("STOPPING=1");
    obd_job_shutdown(d);
    uint64_t grace = (uint64_t)d->cfg.timeout_ms;
    if (grace > OBD_SHUTDOWN_GRACE_MS)
        grace = OBD_SHUTDOWN_GRACE_MS;
    d->drain_deadline = obd_daemon_now(d) + grace;
    uv_timer_start(&d->drain, on_drain, 0, 10);
}

void obd_daemon_fini(struct obd_daemon *d)
{
    /* Close callbacks of handles closed last still need a turn. */
    if (d->closing != 2 && d->closing != 0)
        close_handles(d);
    if (d->closing == 0) {
        /* Start failed before the loop ran: close what init opened. */
        d->closing = 2;
        uv_close((uv_handle_t *)&d->drain, NULL);
        obd_ctl_close(d);
        obd_peers_close(d);
        uv_close((uv_handle_t *)&d->sigterm, NULL);
        uv_close((uv_handle_t *)&d->sigint, NULL);
        uv_close((uv_handle_t *)&d->sighup, NULL);
        uv_close((uv_handle_t *)&d->listen_pause, NULL);
    }
    uv_run(&d->loop, UV_RUN_DEFAULT);
    obd_runq_close(&d->runq);
    uv_run(&d->loop, UV_RUN_DEFAULT);
    uv_loop_close(&d->loop);
    free(d->peers);
    d->peers = NULL;
    obd_bufpool_fini(&d->bufpool);
    obd_efstore_fini(d);
    explicit_bzero(d->auth_key, sizeof(d->auth_key));
    if (d->state_lock_fd >= 0) {
        close(d->state_lock_fd); /* releases state_dir/lock */
        d->state_lock_fd = -1;
    }
}
