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

    /* Input: one message at a time, bounded by OBCOMM_WIRE_MAX. */
    uint8_t *in;
    size_t inlen;
    int pending_fd; /* from SCM_RIGHTS, for the next RegisterBuffer */

    struct obd_outbuf *outq, *outq_tail;
    size_t outq_bytes;

    /* Trainer state once joined. */
    struct obd_job *job;
    int local_rank;
    struct obd_shm *bufs;
    uint64_t next_seq;

    struct obd_client *next;
};

int obd_ctl_start(struct obd_daemon *d);
void obd_ctl_close(struct obd_daemon *d);

/* Queues a DaemonMsg for the client. A client that does not read is
 * dropped rather than allowed to grow the daemon's memory. */
void obd_ctl_send(struct obd_client *c, const ProtobufCMessage *msg);

/* Sends Complete{seq, status, message}. */
void obd_ctl_complete(struct obd_client *c, uint64_t seq, int status,
                      const char *message);

/* Worker-pool tasks that read or write trainer memory bracket themselves
 * with these; a trainer that leaves meanwhile has its buffers unmapped only
 * once no such task runs. */
void obd_shm_task_start(struct obd_daemon *d);
void obd_shm_task_done(struct obd_daemon *d);

/* Closes the connection (idempotent); the handle is freed in its close
 * callback. */
void obd_ctl_drop(struct obd_client *c, const char *why);

#endif
