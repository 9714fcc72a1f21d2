/* libobcomm internals: the handle, its buffer table, and the round trip to
 * the daemon shared by every call. Nothing here is exported. */
#ifndef OBC_CLIENT_H
#define OBC_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "obcomm.h"
#include "sock.h"

/* How long past the op deadline the client waits for the daemon's answer:
 * the daemon reports a stalled op itself at the deadline, so only a hung or
 * overloaded daemon makes the client give up. */
#define OBC_GRACE_MS 5000

/* Deadline for the join when the caller leaves it to the daemon
 * (timeout_ms 0): the daemon's effective value is only known from the
 * reply. */
#define OBC_JOIN_DEFAULT_MS 60000

#define OBC_ERR_MAX 512

/* One shared-memory buffer registered with the daemon. */
struct obc_buffer {
    uint64_t id;
    void *base;
    size_t size; /* mapped bytes, a multiple of the page size */
};

struct obcomm {
    int fd;
    /* Set after a transport or protocol failure: the stream is out of step
     * with the daemon, so every later call fails with OBCOMM_E_PEER_LOST. */
    int dead;
    int node_rank, nodes;
    int local_rank, local_size;
    int timeout_ms; /* effective per-op deadline, from the join reply */
    int durable;    /* the daemon keeps 1-bit snapshot sets in a state_dir */
    /* The last obcomm_save_1bit: its id and this node's part's bytes. */
    uint64_t part_id;
    uint64_t part_bytes;
    uint64_t next_seq;
    uint64_t next_buffer_id;
    struct obc_buffer *bufs;
    size_t nbufs, capbufs;
    char err[OBC_ERR_MAX];
    char dead_why[OBC_ERR_MAX];
};

/* Records `status` and its message as the handle's last error and returns
 * status. */
int obc_fail(obcomm_t *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* OBCOMM_E_PEER_LOST (with a message) when the handle is dead, else 0. */
int obc_check_live(obcomm_t *c);

/* Marks the handle dead after a failure whose message is already in c->err
 * and returns rc. */
int obc_kill(obcomm_t *c, int rc);

/* Sends `msg` (with pass_fd as SCM_RIGHTS when >= 0) and receives the
 * daemon's answer, which must be of type `want`; the wait is bounded by the
 * op deadline plus OBC_GRACE_MS. On success *out is the reply, freed by the
 * caller with obcomm__daemon_msg__free_unpacked(*out, NULL). Any failure
 * kills the handle. */
int obc_roundtrip(obcomm_t *c, const Obcomm__ClientMsg *msg, int pass_fd,
                  Obcomm__DaemonMsg__BodyCase want, Obcomm__DaemonMsg **out);

/* The registered buffer that contains [data, data+bytes), with the offset
 * of data in it; NULL when there is none. */
const struct obc_buffer *obc_buffer_find(const obcomm_t *c, const void *data,
                                         size_t bytes, uint64_t *offset);

/* Unmaps every buffer of the handle (used by obcomm_close). */
void obc_buffers_unmap_all(obcomm_t *c);

#endif
