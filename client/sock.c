#include "sock.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "obcomm.h"

int64_t obc_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int obc_seterr(char *err, size_t errlen, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return status;
}

/* EACCES on the socket: the user is not in the group the daemon gave it
 * (socket_group), or may not enter its directory. Says which group to
 * join, from the socket's own owner, so the fix is in the message. */
static int denied(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return obc_seterr(err, errlen, -EACCES,
                          "permission denied on %s: its directory is closed "
                          "to this user (%s); ask the daemon's operator, or "
                          "set OBCOMM_SOCKET",
                          path, strerror(errno));
    char name[64];
    struct group grp, *found = NULL;
    char buf[4096];
    if (getgrgid_r(st.st_gid, &grp, buf, sizeof(buf), &found) == 0 &&
        found != NULL)
        snprintf(name, sizeof(name), "%s", found->gr_name);
    else
        snprintf(name, sizeof(name), "%u", (unsigned)st.st_gid);
    return obc_seterr(err, errlen, -EACCES,
                      "permission denied on %s: ask to be added to group %s "
                      "(the daemon's socket_group) or set OBCOMM_SOCKET",
                      path, name);
}

int obc_sock_connect(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof(sa.sun_path))
        return obc_seterr(err, errlen, OBCOMM_E_INVAL,
                          "socket path '%s' is empty or longer than %zu bytes",
                          path, sizeof(sa.sun_path) - 1);
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, len + 1);

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return obc_seterr(err, errlen, -errno, "socket: %s", strerror(errno));

    /* Connecting a Unix stream socket only blocks while the listener's
     * backlog is full, and a retry after EINTR is safe: the kernel changes
     * the socket's state only when the connection is made. */
    int rc;
    do
        rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    while (rc < 0 && errno == EINTR);
    if (rc < 0) {
        int e = errno;
        close(fd);
        if (e == ENOENT || e == ECONNREFUSED)
            return obc_seterr(err, errlen, OBCOMM_E_NOTCONN,
                              "cannot reach obcommd at %s: %s", path,
                              strerror(e));
        if (e == EACCES)
            return denied(path, err, errlen);
        return obc_seterr(err, errlen, -e, "cannot reach obcommd at %s: %s",
                          path, strerror(e));
    }

    /* From here on every wait goes through poll() with a deadline. */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        int e = errno;
        close(fd);
        return obc_seterr(err, errlen, -e, "fcntl: %s", strerror(e));
    }
    return fd;
}

int obc_sock_wait(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - obc_now_ms();
        if (left <= 0)
            return OBCOMM_E_TIMEOUT;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
        if (n > 0)
            return (p.revents & POLLNVAL) ? -EBADF : 0;
        if (n < 0 && errno != EINTR)
            return -errno;
    }
}

static int lost(int e)
{
    return e == EPIPE || e == ECONNRESET || e == ENOTCONN;
}

int obc_sock_send(int fd, const Obcomm__ClientMsg *msg, int pass_fd,
                  int64_t deadline, int64_t budget_ms, char *err, size_t errlen)
{
    size_t len;
    uint8_t *buf = obcomm_wire_pack(&msg->base, &len);
    if (buf == NULL)
        return obc_seterr(err, errlen, OBCOMM_E_NOMEM,
                          "cannot frame a message (out of memory or over "
                          "%d bytes)",
                          OBCOMM_WIRE_MAX);

    union {
        struct cmsghdr align;
        char bytes[CMSG_SPACE(sizeof(int))];
    } ctl;
    size_t off = 0;
    int rc = 0;
    while (off < len) {
        struct iovec iov = {.iov_base = buf + off, .iov_len = len - off};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        /* The descriptor rides on the sendmsg that carries the frame's
         * first byte; a sendmsg that sent nothing is retried with it. */
        if (off == 0 && pass_fd >= 0) {
            memset(&ctl, 0, sizeof(ctl));
            mh.msg_control = ctl.bytes;
            mh.msg_controllen = sizeof(ctl.bytes);
            struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
        }
        ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            rc = obc_sock_wait(fd, POLLOUT, deadline);
            if (rc == OBCOMM_E_TIMEOUT) {
                obc_seterr(err, errlen, rc,
                           "daemon did not take a message within %lld ms",
                           (long long)budget_ms);
                break;
            }
            if (rc < 0) {
                obc_seterr(err, errlen, rc, "poll: %s", strerror(-rc));
                break;
            }
            continue;
        }
        int e = n < 0 ? errno : EPIPE;
        if (lost(e))
            rc = obc_seterr(err, errlen, OBCOMM_E_PEER_LOST, OBC_DAEMON_CLOSED);
        else
            rc = obc_seterr(err, errlen, -e, "send to daemon: %s", strerror(e));
        break;
    }
    free(buf);
    return rc;
}

/* Reads exactly `len` bytes. */
static int read_full(int fd, uint8_t *buf, size_t len, int64_t deadline,
                     int64_t budget_ms, char *err, size_t errlen)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = recv(fd, buf + off, len - off, 0);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n == 0 || lost(errno))
            return obc_seterr(err, errlen, OBCOMM_E_PEER_LOST,
                              OBC_DAEMON_CLOSED);
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return obc_seterr(err, errlen, -errno, "read from daemon: %s",
                              strerror(errno));
        int rc = obc_sock_wait(fd, POLLIN, deadline);
        if (rc == OBCOMM_E_TIMEOUT)
            return obc_seterr(err, errlen, rc,
                              "daemon did not answer within %lld ms",
                              (long long)budget_ms);
        if (rc < 0)
            return obc_seterr(err, errlen, rc, "poll: %s", strerror(-rc));
    }
    return 0;
}

/* Unpacks a frame's body into *out; 0 or OBCOMM_E_PROTO. */
static int unpack(const uint8_t *body, size_t len, Obcomm__DaemonMsg **out,
                  char *err, size_t errlen)
{
    Obcomm__DaemonMsg *m = obcomm__daemon_msg__unpack(NULL, len, body);
    if (m == NULL)
        return obc_seterr(err, errlen, OBCOMM_E_PROTO,
                          "daemon sent a malformed %zu-byte message", len);
    /* The oneof's pointers are all the same union member, so checking one
     * checks the message that is set. */
    if (m->body_case == OBCOMM__DAEMON_MSG__BODY__NOT_SET || m->join == NULL) {
        obcomm__daemon_msg__free_unpacked(m, NULL);
        return obc_seterr(err, errlen, OBCOMM_E_PROTO,
                          "daemon sent a message with no body");
    }
    *out = m;
    return 0;
}

int obc_sock_recv(int fd, int64_t deadline, int64_t budget_ms,
                  Obcomm__DaemonMsg **out, char *err, size_t errlen)
{
    uint8_t prefix[OBCOMM_WIRE_PREFIX];
    int rc =
        read_full(fd, prefix, sizeof(prefix), deadline, budget_ms, err, errlen);
    if (rc < 0)
        return rc;
    uint32_t len = obcomm_wire_len(prefix);
    if (len > OBCOMM_WIRE_MAX)
        return obc_seterr(err, errlen, OBCOMM_E_PROTO,
                          "daemon sent a %u-byte message (bound %d)", len,
                          OBCOMM_WIRE_MAX);

    /* malloc(0) may return NULL; an empty body is read as a 1-byte buffer
     * of which nothing is used. */
    uint8_t *body = malloc(len ? len : 1);
    if (body == NULL)
        return obc_seterr(err, errlen, OBCOMM_E_NOMEM,
                          "out of memory for a %u-byte message", len);
    rc = read_full(fd, body, len, deadline, budget_ms, err, errlen);
    if (rc < 0) {
        free(body);
        return rc;
    }
    rc = unpack(body, len, out, err, errlen);
    free(body);
    return rc;
}

/* Bytes asked of one read beyond the frame in progress: completions are
 * small, so one read usually takes several. */
#define RX_CHUNK 4096

static int rx_too_long(uint32_t len, char *err, size_t errlen)
{
    return obc_seterr(err, errlen, OBCOMM_E_PROTO,
                      "daemon sent a %u-byte message (bound %d)", len,
                      OBCOMM_WIRE_MAX);
}

int obc_rx_read(int fd, struct obc_rx *rx, char *err, size_t errlen)
{
    /* What was taken is dropped first, so the buffer only ever holds the
     * frame in progress and what came behind it. */
    if (rx->off > 0) {
        memmove(rx->buf, rx->buf + rx->off, rx->len - rx->off);
        rx->len -= rx->off;
        rx->off = 0;
    }
    size_t need = rx->len + RX_CHUNK;
    if (rx->len >= OBCOMM_WIRE_PREFIX) {
        uint32_t body = obcomm_wire_len(rx->buf);
        if (body > OBCOMM_WIRE_MAX)
            return rx_too_long(body, err, errlen);
        if (need < OBCOMM_WIRE_PREFIX + (size_t)body)
            need = OBCOMM_WIRE_PREFIX + (size_t)body;
    }
    if (rx->cap < need) {
        uint8_t *b = realloc(rx->buf, need);
        if (b == NULL)
            return obc_seterr(err, errlen, OBCOMM_E_NOMEM,
                              "out of memory for a %zu-byte receive buffer",
                              need);
        rx->buf = b;
        rx->cap = need;
    }
    for (;;) {
        ssize_t n = recv(fd, rx->buf + rx->len, rx->cap - rx->len, 0);
        if (n > 0) {
            rx->len += (size_t)n;
            return 1;
        }
        if (n == 0 || lost(errno))
            return obc_seterr(err, errlen, OBCOMM_E_PEER_LOST,
                              OBC_DAEMON_CLOSED);
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        return obc_seterr(err, errlen, -errno, "read from daemon: %s",
                          strerror(errno));
    }
}

int obc_rx_next(struct obc_rx *rx, Obcomm__DaemonMsg **out, char *err,
                size_t errlen)
{
    size_t have = rx->len - rx->off;
    if (have < OBCOMM_WIRE_PREFIX)
        return 0;
    const uint8_t *p = rx->buf + rx->off;
    uint32_t body = obcomm_wire_len(p);
    if (body > OBCOMM_WIRE_MAX)
        return rx_too_long(body, err, errlen);
    if (have - OBCOMM_WIRE_PREFIX < body)
        return 0;
    rx->off += OBCOMM_WIRE_PREFIX + (size_t)body;
    int rc = unpack(p + OBCOMM_WIRE_PREFIX, body, out, err, errlen);
    return rc < 0 ? rc : 1;
}

void obc_rx_fini(struct obc_rx *rx)
{
    free(rx->buf);
    *rx = (struct obc_rx){0};
}
