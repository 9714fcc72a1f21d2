#include "daemon.h"

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
    obd_daemon_close(d);
}

int obd_daemon_init(struct obd_daemon *d, const struct obd_config *cfg)
{
    memset(d, 0, sizeof(*d));
    d->cfg = *cfg;
    d->log.level = cfg->log_level_num;
    d->log.rank = (int)cfg->rank;
    d->ctl_fd = -1;
    d->threads = (int)cfg->threads;
    if (d->threads == 0) {
        uv_cpu_info_t *cpus;
        int ncpu = 1;
        if (uv_cpu_info(&cpus, &ncpu) == 0)
            uv_free_cpu_info(cpus, ncpu);
        d->threads = ncpu > 0 ? ncpu : 1;
    }
    int rc = uv_loop_init(&d->loop);
    if (rc)
        return rc;
    d->start_ms = uv_now(&d->loop);
    uv_signal_init(&d->loop, &d->sigterm);
    uv_signal_init(&d->loop, &d->sigint);
    d->sigterm.data = d;
    d->sigint.data = d;
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
    obd_efstore_restore(d);
    int rc = obd_peers_start(d);
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

int obd_daemon_run(struct obd_daemon *d)
{
    return uv_run(&d->loop, UV_RUN_DEFAULT);
}

/* One large buffer is kept between ops: a fresh allocation of a large
 * tensor costs a page fault per 4 KiB on every op. */
void *obd_daemon_scratch_get(struct obd_daemon *d, size_t bytes, size_t *cap)
{
    if (d->scratch != NULL && d->scratch_bytes >= bytes) {
        void *p = d->scratch;
        *cap = d->scratch_bytes;
        d->scratch = NULL;
        return p;
    }
    *cap = bytes ? bytes : 1;
    return malloc(*cap);
}

void obd_daemon_scratch_put(struct obd_daemon *d, void *p, size_t cap)
{
    if (p == NULL)
        return;
    if (d->scratch == NULL || d->scratch_bytes < cap) {
        free(d->scratch);
        d->scratch = p;
        d->scratch_bytes = cap;
    } else {
        free(p);
    }
}

void obd_daemon_close(struct obd_daemon *d)
{
    if (d->closing)
        return;
    d->closing = 1;
    sd_notify_state("STOPPING=1");
    obd_job_close_all(d);
    if (d->cfg.state_dir[0] != '\0') {
        char why[512];
        if (obd_efstore_save(d, NULL, why, sizeof(why)) != 0)
            obd_log_error(&d->log, "saving error feedback: %s", why);
    }
    obd_stall_close(d); /* ops */
    obd_ctl_close(d);
    obd_peers_close(d);
    if (d->watchdog_on) /* ops */
        uv_close((uv_handle_t *)&d->watchdog, NULL);
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->sigint, NULL);
}

void obd_daemon_fini(struct obd_daemon *d)
{
    /* Close callbacks of handles closed last still need a turn. */
    uv_run(&d->loop, UV_RUN_DEFAULT);
    uv_loop_close(&d->loop);
    free(d->peers);
    d->peers = NULL;
    free(d->scratch);
    d->scratch = NULL;
    obd_efstore_fini(d);
}
