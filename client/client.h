/* libobcomm internals: the handle, its buffer table, its requests, and the
 * exchanges with the daemon shared by every call. Nothing here is
 * exported. */
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

/* Where a request is in its life. In flight it is on its handle's list and
 * the handle reads its Complete; done, it holds the op's outcome and
 * belongs to the caller alone. */
enum obc_req_state {
    OBC_REQ_IN_FLIGHT,
    OBC_REQ_DONE,
};

/* One submitted op (obcomm_request_t). A separate allocation, so that it
 * outlives obcomm_close. */
struct obcomm_request {
    enum obc_req_state state;
    /* In flight: the handle and the links of its list, in seq order.
     * Done: NULL. */
    struct obcomm *c;
    struct obcomm_request *prev, *next;
    /* obcomm_request_free came while in flight: the request is freed as
     * soon as it is done, and nobody reads its outcome. */
    int orphan;
    uint64_t seq;
    /* Monotonic ms after which the client stops waiting for the Complete:
     * submission + timeout_ms + OBC_GRACE_MS. */
    int64_t deadline;
    /* Done: the op's status, its message ("" on success) and the
     * Complete's value and bytes. */
    int status;
    uint64_t value, bytes;
    char err[OBC_ERR_MAX];
};

struct obcomm {
    int fd;
    /* Set after a transport or protocol failure: the stream is out of step
     * with the daemon, so every later call fails with OBCOMM_E_PEER_LOST
     * and every request then in flight was completed with dead_status. */
    int dead;
    int dead_status;
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
    /* Requests in flight (orphans included), oldest first. */
    struct obcomm_request *first, *last;
    size_t inflight;
    /* Bytes from the daemon not yet making a whole message. */
    struct obc_rx rx;
    /* A synchronous exchange (join, registration) waits for the one
     * answer of type `want` that is not a Complete; it lands in reply. */
    Obcomm__DaemonMsg__BodyCase want;
    Obcomm__DaemonMsg *reply;
    char err[OBC_ERR_MAX];
    char dead_why[OBC_ERR_MAX];
    char socket[108]; /* the daemon's socket path (sun_path's size) */
    /* The daemon's Goodbye reason, once it said goodbye (a clean
     * shutdown); "" until then. */
    char goodbye[128];
};

/* Records `status` and its message as the handle's last error and returns
 * status. */
int obc_fail(obcomm_t *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* OBCOMM_E_PEER_LOST (with a message) when the handle is dead, else 0. */
int obc_check_live(obcomm_t *c);

/* Marks the handle dead after a failure whose message is already in c->err
 * and returns rc. Every request in flight is done with rc and that
 * message (orphans are freed). */
int obc_kill(obcomm_t *c, int rc);

/* Sends `msg` (with pass_fd as SCM_RIGHTS when >= 0) and receives the
 * daemon's answer, which must be of type `want` (not a Complete); the wait
 * is bounded by the op deadline plus OBC_GRACE_MS. Completes that arrive
 * meanwhile go to their requests. On success *out is the reply, freed by
 * the caller with obcomm__daemon_msg__free_unpacked(*out, NULL). Any
 * failure kills the handle. */
int obc_roundtrip(obcomm_t *c, const Obcomm__ClientMsg *msg, int pass_fd,
                  Obcomm__DaemonMsg__BodyCase want, Obcomm__DaemonMsg **out);

/* Sends Submit `s` with the handle's next seq and returns the request in
 * *out (caller frees with obcomm_request_free). With OBCOMM_MAX_INFLIGHT
 * requests in flight it first waits for the oldest to be done. An op
 * refused before it is sent (dead handle, no memory) takes no seq; a
 * failed send kills the handle. */
int obc_submit(obcomm_t *c, Obcomm__Submit *s, obcomm_request_t **out);

/* A blocking op: obc_submit, obcomm_wait, then the request's message as
 * the handle's last error and *value and *bytes (if not NULL) from its
 * Complete on success. Returns the op's status. */
int obc_run(obcomm_t *c, Obcomm__Submit *s, uint64_t *value, uint64_t *bytes);

/* Ends every request in flight with `status` and message `why` (a handle
 * killed or closed): each stays valid for its owner, orphans are freed. */
void obc_requests_end(obcomm_t *c, int status, const char *why);

/* The registered buffer that contains [data, data+bytes), with the offset
 * of data in it; NULL when there is none. */
const struct obc_buffer *obc_buffer_find(const obcomm_t *c, const void *data,
                                         size_t bytes, uint64_t *offset);

/* Unmaps every buffer of the handle (used by obcomm_close). */
void obc_buffers_unmap_all(obcomm_t *c);

#endif
