/* The Unix socket: trainers (join, buffers, ops) and obcommctl (status).
 * Connections are driven with uv_poll and recvmsg/sendmsg directly, since
 * buffers arrive as memfds in SCM_RIGHTS ancillary data. */
#ifndef OBD_CTL_H
#define OBD_CTL_H

#include <stdint.h>
#include <protobuf-c/protobuf-c.h>
#include <sys/types.h>
#include <uv.h>

#include "daemon.h"
#include "shm.h"

/* Most bytes queued towards one client before it counts as stuck. */
#define OBD_CLIENT_OUTQ_MAX (1 << 20)

struct obd_outbuf {
    uint8_t *data;
    size_t len, off;
    struct obd_outbuf *next;
};

struct obd_client {
    struct obd_daemon *d;
    uv_poll_t poll;
    int fd;
    int closing;
    pid_t pid;
    uid_t uid;
    uint64_t id;
    /* Closes a connection that neither joins nor asks for the status
     * within client_join_ms; stopped once it does. */
    uv_timer_t join_timer;
    int handles; /* poll and join_timer not yet closed; freed at 0 */

    /* Input: one message at a time, bounded by OBCOMM_WIRE_MAX. */
    uint8_t *in;
    size_t inlen;
    int pending_fd; /* from SCM_RIGHTS, for the next RegisterBuffer */

    struct obd_outbuf *outq, *outq_tail;
    size_t outq_bytes;

    /* Set by obd_ctl_drop; the ready queue closes the client. */
    struct obd_ready drop;
    char drop_why[160];

    /* Trainer state once joined. */
    struct obd_job *job;
    int local_rank;
    struct obd_shm *bufs;
    int64_t nbufs;      /* in bufs */
    uint64_t buf_bytes; /* of bufs, together */
    uint64_t next_seq;

    struct obd_client *next;
};

int obd_ctl_start(struct obd_daemon *d);
void obd_ctl_close(struct obd_daemon *d);
/* Queues a Goodbye with `reason` (borrowed) to every client and writes
 * what the sockets take now, before a shutdown closes them: a trainer
 * then tells a clean shutdown from a daemon that vanished. */
void obd_ctl_goodbye(struct obd_daemon *d, const char *reason);

/* Queues a DaemonMsg for the client. A client that does not read, or
 * whose socket fails, is dropped (see obd_ctl_drop): never inside this
 * call, so callers may go on using the client, its job and their ops. */
void obd_ctl_send(struct obd_client *c, const ProtobufCMessage *msg);

/* Sends Complete{seq, status, message} (obd_hooks.answer). A client being
 * dropped gets nothing. */
void obd_ctl_complete(struct obd_client *c, uint64_t seq, int status,
                      const char *message, uint64_t value, uint64_t bytes);

/* Marks the client dead and stops reading it; leaving its job, releasing
 * its buffers and closing the socket happen from the ready queue on a
 * later turn (docs/design.md, "Lifetimes and trust": no drop inside the
 * call that found the problem). Idempotent. */
void obd_ctl_drop(struct obd_client *c, const char *why);

#endif
