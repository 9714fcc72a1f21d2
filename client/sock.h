/* The Unix-socket side of the client protocol, shared by libobcomm and
 * obcommctl: connect, send one framed ClientMsg (optionally carrying a file
 * descriptor), receive one framed DaemonMsg, or read DaemonMsgs
 * incrementally without ever blocking (struct obc_rx). Every wait has a
 * deadline on the monotonic clock; nothing here blocks past it.
 *
 * Errors are returned as negative codes and explained in `err` (a buffer of
 * `errlen` bytes owned by the caller). A transport error (timeout, lost
 * daemon, malformed frame) leaves the stream in an unknown state: the caller
 * must not use the socket for anything but close() afterwards. */
#ifndef OBC_SOCK_H
#define OBC_SOCK_H

#include <stddef.h>
#include <stdint.h>

#include "wire.h"

/* The message of OBCOMM_E_PEER_LOST when the daemon closed the socket;
 * the handle rewrites it (request.c) to name the daemon and say whether it
 * shut down cleanly. */
#define OBC_DAEMON_CLOSED "daemon closed the connection"

/* Milliseconds on the monotonic clock. */
int64_t obc_now_ms(void);

/* Formats a message into err; returns `status` so callers can write
 * `return obc_seterr(...)`. */
int obc_seterr(char *err, size_t errlen, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Connects to the daemon's socket at `path` and returns a non-blocking,
 * close-on-exec descriptor (>= 0), or:
 *   OBCOMM_E_INVAL    the path is empty or too long for sockaddr_un;
 *   OBCOMM_E_NOTCONN  nothing listens there (ENOENT, ECONNREFUSED);
 *   -EACCES           the user may not connect: err names the socket's
 *                     group to join (socket_group) or OBCOMM_SOCKET;
 *   -errno            any other socket()/connect() failure. */
int obc_sock_connect(const char *path, char *err, size_t errlen);

/* Sends `msg` framed by obcomm_wire_pack. When pass_fd >= 0 it travels as
 * SCM_RIGHTS ancillary data of the sendmsg that carries the first byte of
 * the frame (the whole frame is offered to that one sendmsg). `budget_ms` is
 * only used to word the timeout message. Returns 0, OBCOMM_E_NOMEM (message
 * over OBCOMM_WIRE_MAX or malloc failed), OBCOMM_E_TIMEOUT,
 * OBCOMM_E_PEER_LOST (EPIPE, ECONNRESET) or -errno. */
int obc_sock_send(int fd, const Obcomm__ClientMsg *msg, int pass_fd,
                  int64_t deadline, int64_t budget_ms, char *err,
                  size_t errlen);

/* Waits until fd is ready for `events` (POLLIN, POLLOUT) or the deadline
 * passes. Returns 0 when ready or hung up (the next read or write tells
 * which), OBCOMM_E_TIMEOUT, or -errno. No message is written. */
int obc_sock_wait(int fd, short events, int64_t deadline);

/* Receives one DaemonMsg. On success *out is the unpacked message, which the
 * caller frees with obcomm__daemon_msg__free_unpacked(*out, NULL). Returns
 * 0, OBCOMM_E_TIMEOUT ("daemon did not answer within N ms", N =
 * budget_ms), OBCOMM_E_PEER_LOST (EOF, ECONNRESET), OBCOMM_E_PROTO (length
 * over OBCOMM_WIRE_MAX, unparsable body, or no body set), OBCOMM_E_NOMEM or
 * -errno. */
int obc_sock_recv(int fd, int64_t deadline, int64_t budget_ms,
                  Obcomm__DaemonMsg **out, char *err, size_t errlen);

/* An incremental reader of DaemonMsg frames from a non-blocking socket:
 * whatever bytes have arrived are kept until their frame is whole, so a
 * caller that must never block (obcomm_test) can stop between any two
 * bytes. Holds at most one frame (bounded by OBCOMM_WIRE_MAX before it is
 * allocated) plus one read. Start zeroed; free with obc_rx_fini. */
struct obc_rx {
    uint8_t *buf;
    size_t off; /* the first byte not yet taken */
    size_t len; /* bytes in buf */
    size_t cap;
};

/* Reads once from fd without blocking. Returns 1 when bytes arrived, 0
 * when none were there (EAGAIN), OBCOMM_E_PEER_LOST (EOF, ECONNRESET),
 * OBCOMM_E_PROTO (a frame announced over OBCOMM_WIRE_MAX),
 * OBCOMM_E_NOMEM or -errno. */
int obc_rx_read(int fd, struct obc_rx *rx, char *err, size_t errlen);

/* Takes the next whole message out of rx: returns 1 with *out set (freed
 * by the caller with obcomm__daemon_msg__free_unpacked), 0 when no whole
 * frame is buffered, or OBCOMM_E_PROTO (over OBCOMM_WIRE_MAX, unparsable
 * or without a body). */
int obc_rx_next(struct obc_rx *rx, Obcomm__DaemonMsg **out, char *err,
                size_t errlen);

void obc_rx_fini(struct obc_rx *rx);

#endif
