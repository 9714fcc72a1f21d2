/* libobcomm: the connection to the node's daemon, joining a job, and error
 * reporting. Buffers live in buffers.c, collectives in coll.c, requests
 * and the reading of the daemon's answers in request.c. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"

/* obcomm_connect returns no handle on failure, so its message is kept per
 * thread and shown by obcomm_last_error(NULL). */
static __thread char connect_err[OBC_ERR_MAX];

int obc_fail(obcomm_t *c, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
    return status;
}

int obc_check_live(obcomm_t *c)
{
    if (!c->dead)
        return 0;
    return obc_fail(c, OBCOMM_E_PEER_LOST,
                    "connection to obcommd unusable after an earlier "
                    "failure: %s",
                    c->dead_why);
}

static int connect_fail(int status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int connect_fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(connect_err, sizeof(connect_err), fmt, ap);
    va_end(ap);
    return status;
}

/* Checks the join reply and fills in the handle's place in the world.
 * Returns the daemon's refusal, OBCOMM_E_PROTO for a reply that makes no
 * sense, or 0. Messages go to c->err. */
static int apply_join_reply(obcomm_t *c, const Obcomm__JoinReply *r,
                            int requested_ms)
{
    if (r->status > 0)
        return obc_fail(c, OBCOMM_E_PROTO,
                        "obcommd answered the join with status %d",
                        (int)r->status);
    if (r->status < 0)
        return obc_fail(c, r->status, "obcommd refused the join: %s",
                        r->message[0] ? r->message
                                      : obcomm_strerror(r->status));
    if (r->nodes == 0 || r->node_rank >= r->nodes ||
        r->nodes > (uint32_t)(INT_MAX / c->local_size) ||
        r->timeout_ms > INT_MAX - OBC_GRACE_MS)
        return obc_fail(c, OBCOMM_E_PROTO,
                        "obcommd sent an impossible join reply (node %u of "
                        "%u, timeout %u ms)",
                        r->node_rank, r->nodes, r->timeout_ms);
    c->node_rank = (int)r->node_rank;
    c->durable = r->state_dir;
    c->nodes = (int)r->nodes;
    /* The daemon is meant to send its effective deadline; if it leaves the
     * field 0, the requested one (or the join default) still bounds every
     * wait. */
    if (r->timeout_ms > 0)
        c->timeout_ms = (int)r->timeout_ms;
    else
        c->timeout_ms = requested_ms > 0 ? requested_ms : OBC_JOIN_DEFAULT_MS;
    return 0;
}

int obcomm_connect(const obcomm_options_t *opts, obcomm_t **out)
{
    connect_err[0] = '\0';
    if (out == NULL)
        return connect_fail(OBCOMM_E_INVAL, "obcomm_connect: out is NULL");

    obcomm_options_t o = {.local_rank = 0, .local_size = 1};
    if (opts != NULL)
        o = *opts;
    /* An empty path anywhere means "not set", as in obcommctl. */
    const char *path = o.socket_path;
    if (path == NULL || path[0] == '\0')
        path = getenv("OBCOMM_SOCKET");
    if (path == NULL || path[0] == '\0')
        path = OBCOMM_DEFAULT_SOCKET;
    const char *job = o.job != NULL ? o.job : "default";

    if (o.local_size < 1 || o.local_size > 64)
        return connect_fail(OBCOMM_E_INVAL, "local_size %d not in [1, 64]",
                            o.local_size);
    if (o.local_rank < 0 || o.local_rank >= o.local_size)
        return connect_fail(OBCOMM_E_INVAL, "local_rank %d not in [0, %d)",
                            o.local_rank, o.local_size);
    if (o.timeout_ms < 0 || o.timeout_ms > INT_MAX - OBC_GRACE_MS)
        return connect_fail(OBCOMM_E_INVAL,
                            "timeout_ms %d is negative or too large",
                            o.timeout_ms);

    obcomm_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return connect_fail(OBCOMM_E_NOMEM, "out of memory");
    c->local_rank = o.local_rank;
    c->local_size = o.local_size;
    c->next_buffer_id = 1;
    c->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : OBC_JOIN_DEFAULT_MS;

    snprintf(c->socket, sizeof(c->socket), "%s", path);
    c->fd = obc_sock_connect(path, c->err, sizeof(c->err));
    if (c->fd < 0) {
        int rc = connect_fail(c->fd, "%s", c->err);
        free(c);
        return rc;
    }

    Obcomm__Join join = OBCOMM__JOIN__INIT;
    join.proto_version = OBCOMM_PROTO_VERSION;
    join.job = (char *)job;
    join.local_rank = (uint32_t)o.local_rank;
    join.local_size = (uint32_t)o.local_size;
    join.timeout_ms = (uint32_t)o.timeout_ms;
    Obcomm__ClientMsg msg = OBCOMM__CLIENT_MSG__INIT;
    msg.body_case = OBCOMM__CLIENT_MSG__BODY_JOIN;
    msg.join = &join;

    Obcomm__DaemonMsg *reply;
    int rc = obc_roundtrip(c, &msg, -1, OBCOMM__DAEMON_MSG__BODY_JOIN, &reply);
    if (rc == 0) {
        rc = apply_join_reply(c, reply->join, o.timeout_ms);
        obcomm__daemon_msg__free_unpacked(reply, NULL);
    }
    if (rc < 0) {
        connect_fail(rc, "%s", c->err);
        close(c->fd);
        obc_rx_fini(&c->rx);
        free(c);
        return rc;
    }
    c->err[0] = '\0';
    *out = c;
    return 0;
}

void obcomm_close(obcomm_t *c)
{
    if (c == NULL)
        return;
    /* The daemon releases a trainer's buffers and leaves the job for it
     * when the connection closes, so no message is needed. Requests in
     * flight are not waited for: the other ranks learn that this one
     * left, and the requests' owners learn it here. */
    obc_requests_end(c, OBCOMM_E_PEER_LOST,
                     "the handle was closed with the op in flight");
    obc_buffers_unmap_all(c);
    close(c->fd);
    obc_rx_fini(&c->rx);
    free(c);
}

int obcomm_rank(const obcomm_t *c)
{
    if (c == NULL)
        return OBCOMM_E_INVAL;
    return c->node_rank * c->local_size + c->local_rank;
}

int obcomm_size(const obcomm_t *c)
{
    if (c == NULL)
        return OBCOMM_E_INVAL;
    return c->nodes * c->local_size;
}

const char *obcomm_last_error(const obcomm_t *c)
{
    return c == NULL ? connect_err : c->err;
}

/* obcomm's own codes: one row each, for obcomm_strerror and
 * obcomm_err_name (and through it the Python package's E_* names). */
#define ERR(x, text)                       \
    {                                      \
        OBCOMM_E_##x, "OBCOMM_E_" #x, text \
    }
static const struct {
    int code;
    const char *name, *text;
} errors[] = {
    ERR(INVAL, "invalid argument"),
    ERR(MISMATCH, "ranks issued different collectives"),
    ERR(TIMEOUT, "deadline passed before every rank arrived"),
    ERR(PEER_LOST, "a node, trainer or the daemon of the job vanished"),
    ERR(PROTO, "malformed or unexpected message"),
    ERR(NOMEM, "out of memory or over a bound"),
    ERR(NOTCONN, "the daemon is not reachable"),
    ERR(VERSION, "protocol versions differ"),
    ERR(NONFINITE, "NaN or Inf in a 1-bit allreduce"),
    ERR(BUSY, "local rank already taken, or a bound on jobs reached"),
    ERR(NOTREG, "data is not inside a buffer from obcomm_alloc"),
    ERR(STATE, "per-key state disagrees"),
    ERR(IO, "a file could not be read or written"),
    ERR(CORRUPT, "a file is damaged or of another kind"),
    ERR(DENIED, "the job belongs to another user"),
};
#undef ERR

const char *obcomm_err_name(int err)
{
    for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
        if (errors[i].code == err)
            return errors[i].name;
    return NULL;
}

/* The enums and constants of obcomm.h, one row each, for bindings. */
#define ROW(x) \
    {          \
        x, #x  \
    }
static const struct {
    int value;
    const char *name;
} dtypes[] = {ROW(OBCOMM_FLOAT32),  ROW(OBCOMM_FLOAT64), ROW(OBCOMM_FLOAT16),
              ROW(OBCOMM_BFLOAT16), ROW(OBCOMM_INT32),   ROW(OBCOMM_INT64)},
  ops[] = {ROW(OBCOMM_SUM), ROW(OBCOMM_AVG), ROW(OBCOMM_MAX), ROW(OBCOMM_MIN)};
#undef ROW

#define ROW(x)          \
    {                   \
        (double)(x), #x \
    }
static const struct {
    double value;
    const char *name;
} constants[] = {
    ROW(OBCOMM_MAX_INFLIGHT),
    ROW(OBCOMM_ADAM_MAX_THREADS),
    ROW(OBCOMM_ADAM_AUTO_MASK_RATIO),
    ROW(OBCOMM_ZOADAM_AUTO_MASK_RATIO),
};
#undef ROW

const char *obcomm_dtype_name(int dtype)
{
    for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
        if (dtypes[i].value == dtype)
            return dtypes[i].name;
    return NULL;
}

const char *obcomm_op_name(int op)
{
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
        if (ops[i].value == op)
            return ops[i].name;
    return NULL;
}

int obcomm_constant(const char *name, double *value)
{
    if (name == NULL || value == NULL)
        return OBCOMM_E_INVAL;
    for (size_t i = 0; i < sizeof(constants) / sizeof(constants[0]); i++)
        if (strcmp(constants[i].name, name) == 0) {
            *value = constants[i].value;
            return 0;
        }
    return OBCOMM_E_INVAL;
}

const char *obcomm_strerror(int err)
{
    if (err == 0)
        return "success";
    for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
        if (errors[i].code == err)
            return errors[i].text;
    /* errno values are small; anything in obcomm's range that is not
     * listed above is unknown rather than an errno. */
    if (err < 0 && err > -1000) {
        /* strerrordesc_np, unlike strerror, never writes a shared buffer. */
        const char *s = strerrordesc_np(-err);
        if (s != NULL)
            return s;
    }
    return "unknown error";
}
