#include "ctl.h"
#include "coll.h"
#include "err.h"
#include "status.h"

#include <obcomm.h>

#include <errno.h>
#include <grp.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "job.h"
#include "ops.h"
#include "peers.h"
#include "reduce.h"
#include "wire.h"

static void on_client_io(uv_poll_t *h, int status, int events);
static void drop_run(struct obd_ready *r);

/* Makes the socket's directory ready at the start: checked as
 * --check-config checks it (config.c), created when missing (and logged
 * then). The socket's group is socket_gid's. */
static int prepare_socket_dir(struct obd_daemon *d, const char *sock)
{
    char why[512];
    int created;
    if (obd_config_socket_dir_ok(sock, 1, why, sizeof(why), &created) != 0) {
        obd_log_error(&d->log, "%s", why);
        return OBD_E_INVAL;
    }
    if (created)
        obd_log_info(&d->log, "created the socket directory of %s", sock);
    return 0;
}

static int socket_gid(struct obd_daemon *d, gid_t *out)
{
    char why[512];
    if (obd_config_socket_gid(d->cfg.socket_group, out, why, sizeof(why))) {
        obd_log_error(&d->log, "%s", why);
        return OBD_E_INVAL;
    }
    return 0;
}

/* Connections of one user, to bound them per uid. */
static int clients_of(const struct obd_daemon *d, uid_t uid)
{
    int n = 0;
    for (const struct obd_client *c = d->clients; c; c = c->next)
        if (!c->closing && c->uid == uid)
            n++;
    return n;
}

/* Buffers a user has registered, all its connections together (those
 * being closed included: their buffers are mapped until they are gone). */
static void buffers_of(const struct obd_daemon *d, uid_t uid, int64_t *n,
                       uint64_t *bytes)
{
    *n = 0;
    *bytes = 0;
    for (const struct obd_client *c = d->clients; c; c = c->next)
        if (c->uid == uid) {
            *n += c->nbufs;
            *bytes += c->buf_bytes;
        }
}

/* max_buffer_bytes_per_uid, 0 meaning the machine's memory. */
static uint64_t buffer_bytes_per_uid(const struct obd_daemon *d)
{
    if (d->cfg.max_buffer_bytes_per_uid > 0)
        return (uint64_t)d->cfg.max_buffer_bytes_per_uid;
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || size <= 0)
        return UINT64_MAX;
    return (uint64_t)pages * (uint64_t)size;
}

/* Decides, before anything is mapped, whether client c may register one
 * more buffer of `bytes` bytes. Every registered buffer is a mapping in
 * the daemon and the kernel bounds the mappings of a process
 * (vm.max_map_count): were one user allowed to take them all, the
 * daemon's own allocations (segment buffers of running ops, thread
 * stacks) would fail and with them the ops of every other user. So each
 * connection and each user has a bound, and all users together stay
 * under max_buffers, which leaves the daemon room of its own. Returns 0
 * or OBD_E_TOOBIG with the bound named in why. */
static int admit_buffer(const struct obd_client *c, uint64_t bytes, char *why,
                        size_t whylen)
{
    const struct obd_daemon *d = c->d;
    int64_t n;
    uint64_t used;
    buffers_of(d, c->uid, &n, &used);
    uint64_t cap = buffer_bytes_per_uid(d);
    if (c->nbufs >= d->cfg.max_buffers_per_client) {
        snprintf(why, whylen,
                 "buffer refused: this connection has %lld buffers "
                 "registered, max_buffers_per_client is %lld",
                 (long long)c->nbufs, (long long)d->cfg.max_buffers_per_client);
        return OBD_E_TOOBIG;
    }
    if (n >= d->cfg.max_buffers_per_uid) {
        snprintf(why, whylen,
                 "buffer refused: uid %u has %lld buffers registered, "
                 "max_buffers_per_uid is %lld",
                 (unsigned)c->uid, (long long)n,
                 (long long)d->cfg.max_buffers_per_uid);
        return OBD_E_TOOBIG;
    }
    if (used > cap || bytes > cap - used) {
        snprintf(why, whylen,
                 "buffer of %llu bytes refused: uid %u has %llu bytes "
                 "registered, max_buffer_bytes_per_uid is %llu",
                 (unsigned long long)bytes, (unsigned)c->uid,
                 (unsigned long long)used, (unsigned long long)cap);
        return OBD_E_TOOBIG;
    }
    if (d->shm_buffers >= d->shm_buffers_max) {
        snprintf(why, whylen,
                 "buffer refused: all users have %lld buffers registered, "
                 "max_buffers is %lld",
                 (long long)d->shm_buffers, (long long)d->shm_buffers_max);
        return OBD_E_TOOBIG;
    }
    return 0;
}

/* The kernel's bound on the mappings of a process; 65530 (its default)
 * when it cannot be read. */
static int64_t max_map_count(void)
{
    long long n = 0;
    FILE *f = fopen("/proc/sys/vm/max_map_count", "re");
    if (f != NULL) {
        if (fscanf(f, "%lld", &n) != 1)
            n = 0;
        fclose(f);
    }
    return n > 0 ? (int64_t)n : 65530;
}

/* Adds b to the client's buffers, or takes it out of them, keeping the
 * counts that admit_buffer reads. */
static void buf_link(struct obd_client *c, struct obd_shm *b)
{
    b->next = c->bufs;
    c->bufs = b;
    c->nbufs++;
    c->buf_bytes += b->size;
    c->d->shm_buffers++;
    obd_metric_add(&c->d->metrics, OBD_M_SHM_BYTES, b->size);
}

static void buf_unlink(struct obd_client *c, struct obd_shm **pp)
{
    struct obd_shm *b = *pp;
    *pp = b->next;
    c->nbufs--;
    c->buf_bytes -= b->size;
    c->d->shm_buffers--;
    c->d->metrics.v[OBD_M_SHM_BYTES] -= b->size;
    obd_shm_unref(b);
}

static void on_join_timeout(uv_timer_t *t)
{
    struct obd_client *c = container_of(t, struct obd_client, join_timer);
    char why[96];
    snprintf(why, sizeof(why),
             "neither joined a job nor asked for the status within %lld ms",
             (long long)c->d->cfg.client_join_ms);
    obd_ctl_drop(c, why);
}

/* Refuses to steal the socket of a daemon that is still running, but
 * removes one left behind by a daemon that died. */
static int claim_path(struct obd_daemon *d, const struct sockaddr_un *sa)
{
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) {
        obd_log_error(&d->log, "socket: %s", strerror(errno));
        return OBD_E_SYS;
    }
    int rc = connect(probe, (const struct sockaddr *)sa, sizeof(*sa));
    int err = errno;
    close(probe);
    if (rc == 0) {
        obd_log_error(&d->log, "socket %s: another obcommd is serving it",
                      sa->sun_path);
        return OBD_E_BUSY;
    }
    if (err == ECONNREFUSED)
        unlink(sa->sun_path);
    return 0;
}

/* The Unix socket's accept side, ctl.c's own (the daemon holds only a
 * pointer): freed once both its handles have closed. */
struct obd_ctl_listener {
    struct obd_daemon *d;
    int fd;
    uv_poll_t poll;
    uv_timer_t pause; /* accepting paused after EMFILE/ENFILE */
    int open_handles;
};

static void on_accept(uv_poll_t *h, int status, int events);

/* Out of descriptors: the pending connection stays pending, so a
 * level-triggered poll would fire again at once. Accepting pauses instead
 * and resumes a moment later. */
#define ACCEPT_PAUSE_MS 250

static void on_accept_resume(uv_timer_t *t)
{
    struct obd_ctl_listener *l =
        container_of(t, struct obd_ctl_listener, pause);
    if (!l->d->closing)
        uv_poll_start(&l->poll, UV_READABLE, on_accept);
}

static void on_accept(uv_poll_t *h, int status, int events)
{
    struct obd_ctl_listener *l = container_of(h, struct obd_ctl_listener, poll);
    struct obd_daemon *d = l->d;
    (void)events;
    if (status < 0)
        return;

    for (;;) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == EAGAIN || e == EINTR)
                return;
            obd_log_limited(&d->log, OBD_LOG_WARN, 10000, "accept on %s: %s",
                            d->cfg.socket, strerror(e));
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
                obd_metric_add(&d->metrics, OBD_M_ACCEPT_PAUSES, 1);
                uv_poll_stop(&l->poll);
                uv_timer_start(&l->pause, on_accept_resume, ACCEPT_PAUSE_MS, 0);
            }
            return;
        }
        if (d->nclients >= d->cfg.max_clients) {
            obd_log_warn(&d->log,
                         "refusing a client: max_clients (%lld) "
                         "reached",
                         (long long)d->cfg.max_clients);
            close(fd);
            continue;
        }
        struct ucred cred;
        socklen_t credlen = sizeof(cred);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &credlen) != 0) {
            close(fd);
            continue;
        }
        if (clients_of(d, cred.uid) >= d->cfg.max_clients_per_uid) {
            obd_log_warn(&d->log,
                         "refusing a client of uid %u (pid %d): "
                         "max_clients_per_uid (%lld) reached",
                         (unsigned)cred.uid, (int)cred.pid,
                         (long long)d->cfg.max_clients_per_uid);
            close(fd);
            continue;
        }
        struct obd_client *c = calloc(1, sizeof(*c));
        if (c == NULL || uv_poll_init(&d->loop, &c->poll, fd) != 0) {
            free(c);
            close(fd);
            continue;
        }
        uv_timer_init(&d->loop, &c->join_timer);
        uv_timer_start(&c->join_timer, on_join_timeout,
                       (uint64_t)d->cfg.client_join_ms, 0);
        c->handles = 2;
        c->pid = cred.pid;
        c->uid = cred.uid;
        c->d = d;
        c->fd = fd;
        c->pending_fd = -1;
        c->local_rank = -1;
        c->drop.run = drop_run;
        c->next = d->clients;
        d->clients = c;
        d->nclients++;
        d->metrics.v[OBD_M_CLIENTS] = (uint64_t)d->nclients;
        uv_poll_start(&c->poll, UV_READABLE, on_client_io);
    }
}

int obd_ctl_start(struct obd_daemon *d)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (strlen(d->cfg.socket) >= sizeof(sa.sun_path))
        return OBD_E_INVAL;
    strcpy(sa.sun_path, d->cfg.socket);

    gid_t gid = (gid_t)-1;
    int rc = prepare_socket_dir(d, d->cfg.socket);
    if (rc == 0 && d->cfg.socket_group[0] != '\0')
        rc = socket_gid(d, &gid);
    if (rc == 0)
        rc = claim_path(d, &sa);
    if (rc)
        return rc;

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        obd_log_error(&d->log, "socket: %s", strerror(errno));
        return OBD_E_SYS;
    }
    /* Created 0660 from the start (the loop has no other thread yet, so
     * the process-wide umask is ours for the call): the daemon's user and
     * socket_group may connect, nobody else. SO_PEERCRED then says which
     * user each connection is, and jobs belong to users. */
    mode_t old = umask(0117);
    rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    umask(old);
    if (rc != 0 || listen(fd, 128) != 0 ||
        (gid != (gid_t)-1 && chown(d->cfg.socket, (uid_t)-1, gid) != 0) ||
        chmod(d->cfg.socket, 0660) != 0) {
        obd_log_error(&d->log, "socket %s: %s", d->cfg.socket, strerror(errno));
        close(fd);
        return OBD_E_SYS;
    }

    int64_t maps = max_map_count();
    d->shm_buffers_max = d->cfg.max_buffers > 0 ? d->cfg.max_buffers : maps / 2;
    obd_log_info(&d->log,
                 "shared-memory buffers: at most %lld of all users together "
                 "(max_buffers; vm.max_map_count is %lld)",
                 (long long)d->shm_buffers_max, (long long)maps);

    struct obd_ctl_listener *l = calloc(1, sizeof(*l));
    if (l == NULL) {
        obd_log_error(&d->log, "socket %s: out of memory", d->cfg.socket);
        close(fd);
        return OBD_E_NOMEM;
    }
    l->d = d;
    l->fd = fd;
    uv_poll_init(&d->loop, &l->poll, fd);
    uv_timer_init(&d->loop, &l->pause);
    l->poll.data = l;
    l->pause.data = l;
    l->open_handles = 2;
    uv_poll_start(&l->poll, UV_READABLE, on_accept);
    d->ctl_listener = l;
    return 0;
}

static void on_client_closed(uv_handle_t *h)
{
    struct obd_client *c = h->data;
    if (--c->handles > 0)
        return;
    close(c->fd);
    free(c);
}

/* Marks the client dead and posts the rest: nothing a caller holds (its
 * job, an op being completed, the client itself) goes away inside the
 * call. */
void obd_ctl_drop(struct obd_client *c, const char *why)
{
    struct obd_daemon *d = c->d;
    if (c->closing)
        return;
    c->closing = 1;
    if (why != NULL) {
        obd_log_warn(&d->log, "client pid %d: %s; closing it", (int)c->pid,
                     why);
        obd_metric_add(&d->metrics, OBD_M_CLIENT_ERRORS, 1);
    }
    snprintf(c->drop_why, sizeof(c->drop_why), "%s",
             why ? why : "disconnected from the daemon");
    uv_poll_stop(&c->poll);
    uv_timer_stop(&c->join_timer);
    obd_runq_post(&d->runq, &c->drop);
}

/* The dropped client leaves its job (whose ops then fail on every node),
 * gives up its own reference on each buffer (ops that use one keep it
 * mapped) and is closed. */
static void drop_run(struct obd_ready *r)
{
    struct obd_client *c = container_of(r, struct obd_client, drop);
    struct obd_daemon *d = c->d;

    if (c->job != NULL) {
        struct obd_job *job = c->job;
        c->job = NULL;
        obd_job_leave(job, c->local_rank, c->drop_why);
    }
    while (c->bufs != NULL)
        buf_unlink(c, &c->bufs);
    while (c->outq != NULL) {
        struct obd_outbuf *o = c->outq;
        c->outq = o->next;
        free(o->data);
        free(o);
    }
    free(c->in);
    c->in = NULL;
    if (c->pending_fd >= 0)
        close(c->pending_fd);

    for (struct obd_client **pp = &d->clients; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    d->nclients--;
    d->metrics.v[OBD_M_CLIENTS] = (uint64_t)d->nclients;
    c->poll.data = c;
    c->join_timer.data = c;
    uv_close((uv_handle_t *)&c->poll, on_client_closed);
    uv_close((uv_handle_t *)&c->join_timer, on_client_closed);
}

void obd_ctl_goodbye(struct obd_daemon *d, const char *reason)
{
    Obcomm__Goodbye bye = OBCOMM__GOODBYE__INIT;
    bye.reason = (char *)reason;
    Obcomm__DaemonMsg m = OBCOMM__DAEMON_MSG__INIT;
    m.body_case = OBCOMM__DAEMON_MSG__BODY_GOODBYE;
    m.goodbye = &bye;
    for (struct obd_client *c = d->clients; c; c = c->next)
        obd_ctl_send(c, &m.base);
}

static void on_listener_closed(uv_handle_t *h)
{
    struct obd_ctl_listener *l = h->data;
    if (--l->open_handles == 0)
        free(l);
}

void obd_ctl_close(struct obd_daemon *d)
{
    for (struct obd_client *c = d->clients; c; c = c->next)
        obd_ctl_drop(c, NULL);
    struct obd_ctl_listener *l = d->ctl_listener;
    if (l != NULL) {
        d->ctl_listener = NULL;
        uv_close((uv_handle_t *)&l->poll, on_listener_closed);
        uv_close((uv_handle_t *)&l->pause, on_listener_closed);
        close(l->fd);
        unlink(d->cfg.socket);
    }
}

/* Writes as much of the queue as the socket takes; watches for
 * writability while anything is left. */
static void flush(struct obd_client *c)
{
    while (c->outq != NULL) {
        struct obd_outbuf *o = c->outq;
        ssize_t n = send(c->fd, o->data + o->off, o->len - o->off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                break;
            obd_ctl_drop(c, NULL); /* deferred: the caller goes on */
            return;
        }
        o->off += (size_t)n;
        c->outq_bytes -= (size_t)n;
        if (o->off < o->len)
            break;
        c->outq = o->next;
        if (c->outq == NULL)
            c->outq_tail = NULL;
        free(o->data);
        free(o);
    }
    if (!c->closing)
        uv_poll_start(&c->poll, UV_READABLE | (c->outq ? UV_WRITABLE : 0),
                      on_client_io);
}

void obd_ctl_send(struct obd_client *c, const ProtobufCMessage *msg)
{
    if (c->closing)
        return;
    size_t len;
    uint8_t *buf = obcomm_wire_pack(msg, &len);
    struct obd_outbuf *o = buf ? calloc(1, sizeof(*o)) : NULL;
    if (o == NULL || c->outq_bytes + len > OBD_CLIENT_OUTQ_MAX) {
        free(buf);
        free(o);
        obd_ctl_drop(c, "does not read its replies");
        return;
    }
    o->data = buf;
    o->len = len;
    if (c->outq_tail)
        c->outq_tail->next = o;
    else
        c->outq = o;
    c->outq_tail = o;
    c->outq_bytes += len;
    flush(c);
}

void obd_ctl_complete(struct obd_client *c, uint64_t seq, int status,
                      const char *message, uint64_t value, uint64_t bytes)
{
    Obcomm__Complete done = OBCOMM__COMPLETE__INIT;
    Obcomm__DaemonMsg msg = OBCOMM__DAEMON_MSG__INIT;
    done.seq = seq;
    done.status = obd_err_public(status);
    done.value = value;
    done.bytes = bytes;
    done.message = (char *)(message ? message : "");
    msg.body_case = OBCOMM__DAEMON_MSG__BODY_COMPLETE;
    msg.complete = &done;
    obd_ctl_send(c, &msg.base);
}

static void reply_join(struct obd_client *c, int status, const char *message)
{
    struct obd_daemon *d = c->d;
    Obcomm__JoinReply r = OBCOMM__JOIN_REPLY__INIT;
    Obcomm__DaemonMsg msg = OBCOMM__DAEMON_MSG__INIT;
    r.status = obd_err_public(status);
    r.message = (char *)message;
    r.node_rank = (uint32_t)d->cfg.rank;
    r.nodes = (uint32_t)d->cfg.nodes;
    r.timeout_ms = c->job ? (uint32_t)c->job->timeout_ms : 0;
    r.state_dir = d->cfg.state_dir[0] != '\0';
    msg.body_case = OBCOMM__DAEMON_MSG__BODY_JOIN;
    msg.join = &r;
    obd_ctl_send(c, &msg.base);
}

static void handle_join(struct obd_client *c, const Obcomm__Join *j)
{
    char why[256] = "";
    if (c->job != NULL) {
        reply_join(c, OBD_E_PROTO, "already joined a job");
        return;
    }
    if (j->proto_version != OBCOMM_PROTO_VERSION) {
        snprintf(why, sizeof(why),
                 "client speaks protocol %u, this daemon speaks %u",
                 j->proto_version, OBCOMM_PROTO_VERSION);
        reply_join(c, OBD_E_VERSION, why);
        return;
    }
    int timeout = j->timeout_ms ? (int)j->timeout_ms : 0;
    int rc =
        obd_job_join(c->d, c, (int)c->pid, c->uid, j->job, (int)j->local_rank,
                     (int)j->local_size, timeout, &c->job, why, sizeof(why));
    if (rc == 0) {
        uv_timer_stop(&c->join_timer);
        c->local_rank = (int)j->local_rank;
        obd_log_info(&c->d->log, "job %s: local rank %u of %u joined (pid %d)",
                     j->job, j->local_rank, j->local_size, (int)c->pid);
    }
    reply_join(c, rc, why);
}

static void reply_register(struct obd_client *c, uint64_t id, int status,
                           const char *message)
{
    Obcomm__RegisterReply r = OBCOMM__REGISTER_REPLY__INIT;
    Obcomm__DaemonMsg msg = OBCOMM__DAEMON_MSG__INIT;
    r.status = obd_err_public(status);
    r.message = (char *)message;
    r.id = id;
    msg.body_case = OBCOMM__DAEMON_MSG__BODY_REGISTER;
    msg.register_ = &r;
    obd_ctl_send(c, &msg.base);
}

static struct obd_shm *find_buf(struct obd_client *c, uint64_t id)
{
    for (struct obd_shm *b = c->bufs; b; b = b->next)
        if (b->id == id)
            return b;
    return NULL;
}

static void handle_register(struct obd_client *c,
                            const Obcomm__RegisterBuffer *r)
{
    char why[256];
    int fd = c->pending_fd;
    c->pending_fd = -1;
    if (fd < 0) {
        reply_register(c, r->id, OBD_E_PROTO,
                       "RegisterBuffer came without a file descriptor");
        return;
    }
    if (r->id == 0 || find_buf(c, r->id) != NULL) {
        close(fd);
        reply_register(c, r->id, OBD_E_INVAL, "buffer id 0 or in use");
        return;
    }
    int rc = admit_buffer(c, r->bytes, why, sizeof(why));
    if (rc) {
        close(fd);
        obd_log_warn(&c->d->log, "client pid %d: %s", (int)c->pid, why);
        reply_register(c, r->id, rc, why);
        return;
    }
    struct obd_shm *b;
    rc = obd_shm_map(fd, r->id, r->bytes, (uint64_t)c->d->cfg.max_buffer_bytes,
                     &b, why, sizeof(why));
    if (rc) {
        reply_register(c, r->id, rc, why);
        return;
    }
    buf_link(c, b);
    reply_register(c, r->id, 0, "");
}

/* Drops the trainer's reference: an op that uses the buffer keeps it
 * mapped until the op is freed. */
static void handle_release(struct obd_client *c, const Obcomm__ReleaseBuffer *r)
{
    for (struct obd_shm **pp = &c->bufs; *pp; pp = &(*pp)->next)
        if ((*pp)->id == r->id) {
            buf_unlink(c, pp);
            return;
        }
}

/* Resolves and checks a submission. Errors fail the op on every rank, so
 * that the others do not wait for a trainer whose request was refused. */
static void handle_submit(struct obd_client *c, const Obcomm__Submit *s)
{
    char why[256] = "";
    int status = 0;
    void *data = NULL, *out = NULL;
    struct obd_shm *buf = NULL, *outbuf = NULL;
    struct obd_opdesc desc = {
        .kind = s->kind,
        .dtype = s->dtype,
        .redop = s->redop,
        .count = s->count,
        .key = s->key,
        .root = s->root,
    };

    if (c->job == NULL) {
        obd_ctl_complete(c, s->seq, OBD_E_PROTO, "submit before join", 0, 0);
        return;
    }
    if (s->seq != c->next_seq) {
        snprintf(why, sizeof(why), "op sequence %llu, expected %llu",
                 (unsigned long long)s->seq, (unsigned long long)c->next_seq);
        obd_ctl_drop(c, why);
        return;
    }
    c->next_seq++;

    /* The op's algorithm checks every argument, naming the one that is
     * wrong, so that a bad op fails at once on every rank instead of
     * waiting for the deadline (libobcomm checks the same before it
     * sends). */
    uint64_t bytes = 0, out_bytes = 0;
    int size = (int)c->d->cfg.nodes * c->job->local_size;
    const struct obd_algo *algo = obd_coll_algo(s->kind);
    if (algo == NULL) {
        status = OBD_E_INVAL;
        snprintf(why, sizeof(why), "unknown op kind %u", s->kind);
    } else {
        if (algo->normalize != NULL)
            algo->normalize(&desc);
        status = algo->check(&desc, size, &bytes, &out_bytes, why, sizeof(why));
    }

    if (status == 0 && bytes > 0) {
        buf = find_buf(c, s->buffer_id);
        data = buf ? obd_shm_range(buf, s->offset, bytes) : NULL;
        if (data == NULL) {
            buf = NULL;
            status = OBD_E_NOTREG;
            snprintf(why, sizeof(why),
                     "data (buffer %llu, offset %llu, %llu bytes) is not "
                     "inside a registered buffer",
                     (unsigned long long)s->buffer_id,
                     (unsigned long long)s->offset, (unsigned long long)bytes);
        }
    }
    if (status == 0 && out_bytes > 0) {
        outbuf = find_buf(c, s->recv_buffer_id);
        out = outbuf ? obd_shm_range(outbuf, s->recv_offset, out_bytes) : NULL;
        if (out == NULL) {
            outbuf = NULL;
            status = OBD_E_NOTREG;
            snprintf(why, sizeof(why),
                     "result (buffer %llu, offset %llu, %llu bytes) is not "
                     "inside a registered buffer",
                     (unsigned long long)s->recv_buffer_id,
                     (unsigned long long)s->recv_offset,
                     (unsigned long long)out_bytes);
        } else if (algo->check_buffers != NULL) {
            int rank = obd_job_rank(c->job, (int)c->d->cfg.rank, c->local_rank);
            status = algo->check_buffers(data, bytes, out, out_bytes, rank, why,
                                         sizeof(why));
        }
    }
    if (status != 0) {
        int rank = obd_job_rank(c->job, (int)c->d->cfg.rank, c->local_rank);
        char msg[320];
        snprintf(msg, sizeof(msg), "rank %d: %s", rank, why);
        snprintf(why, sizeof(why), "%s", msg);
    }
    int rc = obd_job_submit(c->job, c->local_rank, s->seq, &desc, buf, data,
                            outbuf, out, status, why, sizeof(why));
    if (rc != 0)
        obd_ctl_complete(c, s->seq, rc, why, 0, 0);
}

static void send_status(void *arg, const ProtobufCMessage *msg)
{
    obd_ctl_send(arg, msg);
}

static void dispatch(struct obd_client *c, const uint8_t *body, size_t len)
{
    Obcomm__ClientMsg *m = obcomm__client_msg__unpack(NULL, len, body);
    if (m == NULL) {
        obd_ctl_drop(c, "sent a message that is not a ClientMsg");
        return;
    }
    switch (m->body_case) {
    case OBCOMM__CLIENT_MSG__BODY_JOIN:
        handle_join(c, m->join);
        break;
    case OBCOMM__CLIENT_MSG__BODY_REGISTER:
        handle_register(c, m->register_);
        break;
    case OBCOMM__CLIENT_MSG__BODY_RELEASE:
        handle_release(c, m->release);
        break;
    case OBCOMM__CLIENT_MSG__BODY_SUBMIT:
        handle_submit(c, m->submit);
        break;
    case OBCOMM__CLIENT_MSG__BODY_STATUS:
        if (c->job == NULL)
            uv_timer_stop(&c->join_timer); /* a status client, not idle */
        obd_status_handle(c->d, c->uid, send_status, c);
        break;
    default:
        obd_ctl_drop(c, "sent an empty ClientMsg");
        break;
    }
    obcomm__client_msg__free_unpacked(m, NULL);
}

/* Reads what the socket has, one message at a time: the 4-byte prefix is
 * checked against OBCOMM_WIRE_MAX before the body is allocated. */
static void read_client(struct obd_client *c)
{
    for (int rounds = 0; rounds < 64 && !c->closing; rounds++) {
        uint8_t *dst;
        size_t want;
        if (c->in == NULL) {
            c->in = malloc(OBCOMM_WIRE_PREFIX);
            if (c->in == NULL) {
                obd_ctl_drop(c, "out of memory");
                return;
            }
        }
        if (c->inlen < OBCOMM_WIRE_PREFIX) {
            dst = c->in + c->inlen;
            want = OBCOMM_WIRE_PREFIX - c->inlen;
        } else {
            size_t body = obcomm_wire_len(c->in);
            dst = c->in + c->inlen;
            want = OBCOMM_WIRE_PREFIX + body - c->inlen;
        }

        char cbuf[CMSG_SPACE(sizeof(int) * 4)];
        struct iovec iov = {dst, want};
        struct msghdr mh = {.msg_iov = &iov,
                            .msg_iovlen = 1,
                            .msg_control = cbuf,
                            .msg_controllen = sizeof(cbuf)};
        ssize_t n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return;
            obd_ctl_drop(c, NULL);
            return;
        }
        if (n == 0) {
            obd_ctl_drop(c, NULL);
            return;
        }

        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm;
             cm = CMSG_NXTHDR(&mh, cm)) {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                continue;
            int nfd = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            int *fds = (int *)CMSG_DATA(cm);
            int had = c->pending_fd >= 0;
            for (int i = 0; i < nfd; i++) {
                if (!had && i == 0)
                    c->pending_fd = fds[i];
                else
                    close(fds[i]);
            }
            if (nfd != 1 || had) {
                obd_ctl_drop(c, "sent more file descriptors than buffers");
                return;
            }
        }
        if (mh.msg_flags & MSG_CTRUNC) {
            obd_ctl_drop(c, "sent too much ancillary data");
            return;
        }

        c->inlen += (size_t)n;
        if (c->inlen == OBCOMM_WIRE_PREFIX) {
            size_t body = obcomm_wire_len(c->in);
            if (body == 0 || body > OBCOMM_WIRE_MAX) {
                char why[96];
                snprintf(why, sizeof(why),
                         "announced a message of %zu bytes (bound %d)", body,
                         OBCOMM_WIRE_MAX);
                obd_ctl_drop(c, why);
                return;
            }
            uint8_t *grown = realloc(c->in, OBCOMM_WIRE_PREFIX + body);
            if (grown == NULL) {
                obd_ctl_drop(c, "out of memory");
                return;
            }
            c->in = grown;
        } else if (c->inlen > OBCOMM_WIRE_PREFIX &&
                   c->inlen == OBCOMM_WIRE_PREFIX + obcomm_wire_len(c->in)) {
            uint8_t *msg = c->in;
            size_t len = c->inlen - OBCOMM_WIRE_PREFIX;
            c->in = NULL;
            c->inlen = 0;
            dispatch(c, msg + OBCOMM_WIRE_PREFIX, len);
            free(msg);
        }
    }
}

static void on_client_io(uv_poll_t *h, int status, int events)
{
    struct obd_client *c = container_of(h, struct obd_client, poll);
    if (status < 0) {
        obd_ctl_drop(c, NULL);
        return;
    }
    if (events & UV_WRITABLE)
        flush(c);
    if (!c->closing && (events & (UV_READABLE | UV_DISCONNECT)))
        read_client(c);
}
