#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "obcomm.pb-c.h"
#include "sock.h"

/* Ports for test daemons. Two things could take a port between the
 * moment a test picks it and the moment its daemon binds it (and, after
 * hx_restart_node or a listener paused for want of descriptors, binds it
 * again):
 *
 * - the kernel, which hands ephemeral ports to every outgoing connection
 *   that did not bind first (the daemons' own dials among them). It takes
 *   them only from net.ipv4.ip_local_port_range, so the ports come from
 *   just below that range (or just above it, when it starts too low):
 *   the kernel never gives those out on its own;
 * - another test process doing the same. A port is taken while some
 *   process holds flock on HX_PORT_LOCKS/<port>: this function locks the
 *   port's file first, then checks with a bind (no SO_REUSEADDR, so any
 *   socket on the port, a listener or a TIME_WAIT, makes it "in use") that
 *   nobody uses it, and keeps the lock until the process exits. The lock
 *   file descriptor is close-on-exec: the daemons never hold it, forked
 *   trainers do and die with the test. tests/python/ports.py keeps the
 *   same rule for pytest and the shell tests.
 *
 * Each process starts its walk at a point derived from its pid, so that
 * concurrent test processes seldom even try the same port. */
#define HX_PORT_LOCKS  "/tmp/obcomm-test-ports"
#define HX_PORT_WINDOW 8192

/* The kernel's ephemeral range; Linux's default when unreadable. */
static void ephemeral_range(int *lo, int *hi)
{
    *lo = 32768;
    *hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f == NULL)
        return;
    int a, b;
    if (fscanf(f, "%d %d", &a, &b) == 2 && a > 0 && b >= a && b <= 65535) {
        *lo = a;
        *hi = b;
    }
    fclose(f);
}

/* 1 when nothing at all is bound to the port on any IPv4 address. */
static int port_unused(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_ANY)};
    int ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    close(fd);
    return ok;
}

int hx_reserve_port(void)
{
    int elo, ehi, lo, hi;
    ephemeral_range(&elo, &ehi);
    if (elo - 1024 >= 1024) {
        hi = elo - 1;
        lo = hi - HX_PORT_WINDOW + 1 < 1024 ? 1024 : hi - HX_PORT_WINDOW + 1;
    } else if (65535 - ehi >= 1024) {
        lo = ehi + 1;
        hi = lo + HX_PORT_WINDOW - 1 > 65535 ? 65535 : lo + HX_PORT_WINDOW - 1;
    } else {
        fprintf(stderr,
                "harness: ip_local_port_range %d-%d leaves no port the "
                "kernel would not hand out itself\n",
                elo, ehi);
        return -1;
    }
    unsigned span = (unsigned)(hi - lo + 1);
    /* A forked child (Check runs each test in one) walks from its own
     * pid: the ports its parent took are not its to hand out, and its
     * own flock on them fails while the parent's lock stands. */
    static pid_t owner;
    static unsigned next;
    if (owner != getpid()) {
        owner = getpid();
        next = (unsigned)owner * 2654435761u % span;
    }
    if (mkdir(HX_PORT_LOCKS, 01777) == 0)
        chmod(HX_PORT_LOCKS, 01777); /* any user's tests share it */
    int err = 0;
    for (unsigned tries = 0; tries < span; tries++) {
        int port = lo + (int)(next++ % span);
        char path[64];
        snprintf(path, sizeof(path), "%s/%d", HX_PORT_LOCKS, port);
        int fd = open(path, O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0444);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0 || !port_unused(port)) {
            close(fd);
            continue;
        }
        return port; /* fd stays open: the lock lasts as long as we do */
    }
    fprintf(stderr, "harness: no free port in %d-%d%s%s\n", lo, hi,
            err ? "; lock files: " : "", err ? strerror(err) : "");
    return -1;
}

void hx_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

int hx_start(struct hx_cluster *c, int nodes, const char *const *extra)
{
    const char *const *each[HX_MAX_NODES];
    for (int i = 0; i < HX_MAX_NODES; i++)
        each[i] = extra;
    return hx_start_each(c, nodes, each);
}

static void log_path(const struct hx_cluster *c, int i, char *buf, size_t len)
{
    snprintf(buf, len, "%s/node%d.log", c->dir, i);
}

int hx_log_contains(const struct hx_cluster *c, int i, const char *s)
{
    char path[160], line[2048];
    log_path(c, i, path, sizeof(path));
    FILE *f = fopen(path, "r");
    int found = 0;
    while (f && !found && fgets(line, sizeof(line), f))
        found = strstr(line, s) != NULL;
    if (f)
        fclose(f);
    return found;
}

int hx_log_wait(const struct hx_cluster *c, int i, const char *s, int ms)
{
    for (int waited = 0;; waited += 10) {
        if (hx_log_contains(c, i, s))
            return 1;
        if (waited >= ms)
            return 0;
        hx_sleep_ms(10);
    }
}

static void dump_log(const struct hx_cluster *c, int i)
{
    char path[160], line[2048];
    log_path(c, i, path, sizeof(path));
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof(line), f))
        fprintf(stderr, "  node %d| %s", i, line);
    if (f)
        fclose(f);
}

int hx_start_each(struct hx_cluster *c, int nodes,
                  const char *const *const *each)
{
    memset(c, 0, sizeof(*c));
    if (getenv("OBCOMMD") == NULL || nodes < 1 || nodes > HX_MAX_NODES) {
        fprintf(stderr, "harness: set OBCOMMD; nodes 1..%d\n", HX_MAX_NODES);
        return -1;
    }
    snprintf(c->dir, sizeof(c->dir), "/tmp/obcomm-test-XXXXXX");
    if (mkdtemp(c->dir) == NULL)
        return -1;
    c->nodes = nodes;
    for (int i = 0; i < nodes; i++) {
        c->port[i] = hx_reserve_port();
        if (c->port[i] < 0) {
            rmdir(c->dir);
            return -1;
        }
        c->each[i] = each[i];
        snprintf(c->sock[i], sizeof(c->sock[i]), "%s/node%d.sock", c->dir, i);
        size_t off = strlen(c->peers);
        snprintf(c->peers + off, sizeof(c->peers) - off, "%s127.0.0.1:%d",
                 i ? "," : "", c->port[i]);
    }
    if (hx_restart(c) != 0) {
        hx_stop(c);
        return -1;
    }
    return 0;
}

static int has_config(const char *const *flags)
{
    for (int k = 0; flags && flags[k]; k++)
        if (strcmp(flags[k], "-c") == 0 || strcmp(flags[k], "--config") == 0)
            return 1;
    return 0;
}

/* The datagram socket daemon i says READY=1 on, bound at
 * DIR/nodeI.notify; -1 on failure (message on stderr). */
static int notify_open(const struct hx_cluster *c, int i, char *path,
                       size_t len)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(path, len, "%s/node%d.notify", c->dir, i);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        fprintf(stderr, "harness: notify socket %s: %s\n", path,
                strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* Waits up to 30 s (a sanitizer build on a busy machine) for READY=1 on
 * fd from daemon i; 0, or -1 when it exited or never said it. */
static int notify_wait(struct hx_cluster *c, int i, int fd)
{
    for (int waited = 0; waited < 30000; waited += 100) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) == 1) {
            char msg[512];
            ssize_t n = recv(fd, msg, sizeof(msg) - 1, 0);
            if (n > 0) {
                msg[n] = '\0';
                if (strncmp(msg, "READY=1", 7) == 0 || strstr(msg, "\nREADY=1"))
                    return 0;
            }
        }
        if (!hx_alive(c, i))
            break;
    }
    fprintf(stderr, "harness: daemon %d did not come up\n", i);
    return -1;
}

/* Starts daemons lo..hi-1 and waits for each one's READY=1. */
static int spawn_range(struct hx_cluster *c, int lo, int hi)
{
    const char *bin = getenv("OBCOMMD");
    int notify[HX_MAX_NODES];
    char npath[HX_MAX_NODES][160];
    for (int i = lo; i < hi; i++)
        notify[i] = -1;
    int rc = 0;
    for (int i = lo; i < hi; i++) {
        notify[i] = notify_open(c, i, npath[i], sizeof(npath[i]));
        if (notify[i] < 0) {
            rc = -1;
            break;
        }
        const char *argv[64];
        char rank[16];
        int n = 0;
        snprintf(rank, sizeof(rank), "%d", i);
        argv[n++] = bin;
        argv[n++] = "--socket";
        argv[n++] = c->sock[i];
        if (!has_config(c->each[i])) {
            argv[n++] = "--log-level";
            argv[n++] = "info";
        }
        if (c->nodes > 1) {
            argv[n++] = "--rank";
            argv[n++] = rank;
            argv[n++] = "--peers";
            argv[n++] = c->peers;
        }
        for (int k = 0; c->each[i] && c->each[i][k] && n < 62; k++)
            argv[n++] = c->each[i][k];
        argv[n] = NULL;

        char logf[160];
        log_path(c, i, logf, sizeof(logf));
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            int fd = open(logf, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd >= 0)
                dup2(fd, 2);
            setenv("NOTIFY_SOCKET", npath[i], 1);
            execv(bin, (char *const *)argv);
            _exit(127);
        }
        c->daemon[i] = pid;
        c->exited[i] = 0;
        c->status[i] = 0;
    }

    for (int i = lo; i < hi; i++) {
        if (rc == 0)
            rc = c->daemon[i] > 0 ? notify_wait(c, i, notify[i]) : -1;
        if (notify[i] >= 0) {
            close(notify[i]);
            unlink(npath[i]);
        }
    }
    return rc;
}

int hx_restart(struct hx_cluster *c)
{
    return spawn_range(c, 0, c->nodes);
}

int hx_crash_restart(struct hx_cluster *c, int i)
{
    return hx_restart_node(c, i, SIGKILL);
}

int hx_restart_node(struct hx_cluster *c, int i, int sig)
{
    /* A node whose link to i is down fails a new op that needs i at once
     * with PEER_LOST, so the mesh must be whole again before the caller
     * starts trainers: the others first see daemon i go (a node with a
     * full mesh has nodes - 1 links, then fewer), and after the new
     * daemon's READY=1 every one of them has its nodes - 1 links back. */
    long long before[HX_MAX_NODES];
    for (int j = 0; j < c->nodes; j++)
        before[j] = j != i && hx_alive(c, j) ? hx_metric(c, j, "links_up") : -1;
    if (c->daemon[i] > 0 && !c->exited[i]) {
        kill(c->daemon[i], sig);
        waitpid(c->daemon[i], &c->status[i], 0);
    }
    for (int j = 0; j < c->nodes; j++)
        for (int t = 0; before[j] == c->nodes - 1 && t < 10000; t += 10) {
            if (hx_metric(c, j, "links_up") < before[j])
                break;
            hx_sleep_ms(10);
        }
    c->daemon[i] = 0;
    c->exited[i] = 0;
    unlink(c->sock[i]);
    if (spawn_range(c, i, i + 1) != 0)
        return -1;
    for (int j = 0; j < c->nodes; j++)
        for (int t = 0; before[j] == c->nodes - 1; t += 10) {
            if (hx_metric(c, j, "links_up") == before[j])
                break;
            if (t >= 20000) {
                fprintf(stderr, "harness: node %d has not its %d links back\n",
                        j, c->nodes - 1);
                return -1;
            }
            hx_sleep_ms(10);
        }
    return 0;
}

long long hx_metric(const struct hx_cluster *c, int i, const char *name)
{
    char err[512];
    int fd = obc_sock_connect(c->sock[i], err, sizeof(err));
    if (fd < 0) {
        fprintf(stderr, "harness: metric %s of daemon %d: %s\n", name, i, err);
        return -1;
    }
    Obcomm__StatusRequest req = OBCOMM__STATUS_REQUEST__INIT;
    Obcomm__ClientMsg msg = OBCOMM__CLIENT_MSG__INIT;
    msg.body_case = OBCOMM__CLIENT_MSG__BODY_STATUS;
    msg.status = &req;
    int64_t deadline = obc_now_ms() + 10000;
    Obcomm__DaemonMsg *reply = NULL;
    int rc = obc_sock_send(fd, &msg, -1, deadline, 10000, err, sizeof(err));
    if (rc == 0)
        rc = obc_sock_recv(fd, deadline, 10000, &reply, err, sizeof(err));
    close(fd);
    long long v = -1;
    if (rc == 0 && reply->body_case == OBCOMM__DAEMON_MSG__BODY_STATUS) {
        const Obcomm__StatusReply *r = reply->status;
        for (size_t k = 0; k < r->n_metrics; k++)
            if (strcmp(r->metrics[k]->name, name) == 0)
                v = (long long)r->metrics[k]->value;
    } else {
        fprintf(stderr, "harness: metric %s of daemon %d: %s\n", name, i,
                rc ? err : "not a StatusReply");
    }
    if (reply)
        obcomm__daemon_msg__free_unpacked(reply, NULL);
    return v;
}

int hx_alive(struct hx_cluster *c, int i)
{
    if (c->daemon[i] <= 0 || c->exited[i])
        return 0;
    if (waitpid(c->daemon[i], &c->status[i], WNOHANG) == c->daemon[i]) {
        c->exited[i] = 1;
        return 0;
    }
    return 1;
}

int hx_halt(struct hx_cluster *c, int sig)
{
    int bad = 0;
    for (int i = 0; i < c->nodes; i++)
        if (c->daemon[i] > 0 && !c->exited[i])
            kill(c->daemon[i], sig);
    for (int i = 0; i < c->nodes; i++) {
        if (c->daemon[i] <= 0)
            continue;
        int status = c->status[i];
        int waited = 0;
        while (!c->exited[i] && waitpid(c->daemon[i], &status, WNOHANG) == 0) {
            if (++waited > 1000) { /* 20 s */
                kill(c->daemon[i], SIGKILL);
                waitpid(c->daemon[i], &status, 0);
                fprintf(stderr, "harness: daemon %d ignored SIGTERM\n", i);
                bad++;
                break;
            }
            hx_sleep_ms(20);
        }
        int clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (sig == SIGTERM && !clean) {
            fprintf(stderr, "harness: daemon %d exited with status %#x\n", i,
                    status);
            dump_log(c, i);
            bad++;
        }
        c->daemon[i] = 0;
        c->exited[i] = 0;
        unlink(c->sock[i]);
    }
    return bad;
}

int hx_stop(struct hx_cluster *c)
{
    int bad = hx_halt(c, SIGTERM);
    for (int i = 0; i < c->nodes; i++) {
        char logf[160];
        log_path(c, i, logf, sizeof(logf));
        unlink(logf);
    }
    if (c->dir[0])
        rmdir(c->dir);
    c->nodes = 0;
    return bad;
}

int hx_fail(obcomm_t *comm, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "trainer rank %d: %s\n", comm ? obcomm_rank(comm) : -1,
            msg);
    return 1;
}

pid_t hx_spawn(struct hx_cluster *c, int node, int lr, int per_node,
               const char *job, int timeout_ms, hx_trainer_fn fn, void *arg)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    obcomm_options_t o = {.socket_path = c->sock[node],
                          .job = job,
                          .local_rank = lr,
                          .local_size = per_node,
                          .timeout_ms = timeout_ms};
    obcomm_t *comm;
    int rc = obcomm_connect(&o, &comm);
    if (rc) {
        fprintf(stderr, "trainer node %d local %d: connect: %s\n", node, lr,
                obcomm_last_error(NULL)[0] ? obcomm_last_error(NULL)
                                           : obcomm_strerror(rc));
        fflush(NULL);
        _exit(1);
    }
    rc = fn(comm, arg);
    obcomm_close(comm);
    fflush(NULL);
    /* fn's own status when it is one (a test may tell outcomes apart by
     * it), 1 for anything else non-zero. */
    _exit(rc >= 0 && rc <= 125 ? rc : 1);
}

int hx_wait(pid_t pid, int wait_ms)
{
    int status;
    for (int t = 0;; t += 5) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        if (r < 0 && errno != EINTR)
            return -1;
        if (t >= wait_ms)
            break;
        hx_sleep_ms(5);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

int hx_run(struct hx_cluster *c, int per_node, const char *job, int timeout_ms,
           int wait_s, hx_trainer_fn fn, void *arg)
{
    int total = c->nodes * per_node;
    pid_t pids[HX_MAX_NODES * 8];
    for (int node = 0; node < c->nodes; node++)
        for (int lr = 0; lr < per_node; lr++)
            pids[node * per_node + lr] =
                hx_spawn(c, node, lr, per_node, job, timeout_ms, fn, arg);
    int failed = 0;
    int left = total;
    for (int i = 0; i < total; i++)
        if (pids[i] < 0) {
            failed++;
            left--;
        }
    for (int t = 0; left > 0 && t < wait_s * 50; t++) {
        for (int i = 0; i < total; i++) {
            int status;
            if (pids[i] > 0 && waitpid(pids[i], &status, WNOHANG) == pids[i]) {
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                    failed++;
                pids[i] = 0;
                left--;
            }
        }
        if (left > 0)
            hx_sleep_ms(20);
    }
    for (int i = 0; i < total; i++)
        if (pids[i] > 0) {
            fprintf(stderr, "harness: trainer %d still running after %d s\n", i,
                    wait_s);
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
            failed++;
        }
    return failed;
}

int hx_damaged_copy(const char *src, const char *dst, long off)
{
    char buf[1 << 16];
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    int rc = in && out ? 0 : -1;
    size_t n;
    while (rc == 0 && (n = fread(buf, 1, sizeof(buf), in)) > 0)
        rc = fwrite(buf, 1, n, out) == n ? 0 : -1;
    if (out && fseek(out, off, SEEK_SET) == 0 && rc == 0)
        rc = fwrite("\0\0\0\0\0\0\0\0", 1, 8, out) == 8 ? 0 : -1;
    if (in)
        fclose(in);
    if (out && fclose(out) != 0)
        rc = -1;
    return rc;
}
