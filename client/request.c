/* Requests, and everything a handle receives from the daemon.
 *
 * Every op is one Submit answered by one Complete with the same seq. The
 * daemon takes many Submits of a trainer before it answers any, so a handle
 * keeps its requests in flight on a list in seq order and reads the
 * daemon's messages whenever a call needs one: each Complete goes to the
 * request with its seq, in whatever order they come (the daemon runs a
 * job's ops in seq order, but answers an op that failed at submission at
 * once), and the answer to a synchronous exchange (join, registration) to
 * the call waiting for it. Reading never blocks: bytes of a message not yet
 * whole stay in the handle's receive buffer. Only the waits block, in
 * poll() until a deadline.
 *
 * A request lives in two places in turn: in flight it is on its handle's
 * list, done it belongs to its owner alone. Whatever ends an op (its
 * Complete, a failure that kills the handle, obcomm_close) goes through
 * settle(), which takes the request off the list, so a closed handle
 * leaves no pointer behind in a request and no request behind in the
 * handle. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

static const char *daemon_msg_name(Obcomm__DaemonMsg__BodyCase k)
{
    switch (k) {
    case OBCOMM__DAEMON_MSG__BODY_JOIN:
        return "JoinReply";
    case OBCOMM__DAEMON_MSG__BODY_REGISTER:
        return "RegisterReply";
    case OBCOMM__DAEMON_MSG__BODY_COMPLETE:
        return "Complete";
    case OBCOMM__DAEMON_MSG__BODY_STATUS:
        return "StatusReply";
    case OBCOMM__DAEMON_MSG__BODY_GOODBYE:
        return "Goodbye";
    default:
        return "unknown message";
    }
}

/* Ends request r (in flight) with status and msg. An orphan is freed: its
 * owner gave it up. */
static void settle(obcomm_request_t *r, int status, const char *msg)
{
    obcomm_t *c = r->c;
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        c->first = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    else
        c->last = r->prev;
    c->inflight--;
    r->c = NULL;
    r->prev = r->next = NULL;
    r->state = OBC_REQ_DONE;
    r->status = status;
    snprintf(r->err, sizeof(r->err), "%s", msg);
    if (r->orphan)
        free(r);
}

void obc_requests_end(obcomm_t *c, int status, const char *why)
{
    while (c->first != NULL)
        settle(c->first, status, why);
}

/* The daemon's Goodbye, if it is among what the socket still holds
 * (the daemon closed the connection right after it). */
static void read_goodbye(obcomm_t *c)
{
    char err[OBC_ERR_MAX];
    for (int rounds = 0; rounds < 64 && c->goodbye[0] == '\0'; rounds++) {
        Obcomm__DaemonMsg *m;
        int rc = obc_rx_next(&c->rx, &m, err, sizeof(err));
        if (rc < 0)
            return;
        if (rc == 1) {
            if (m->body_case == OBCOMM__DAEMON_MSG__BODY_GOODBYE)
                snprintf(c->goodbye, sizeof(c->goodbye), "%s",
                         m->goodbye->reason);
            obcomm__daemon_msg__free_unpacked(m, NULL);
            continue;
        }
        if (obc_rx_read(c->fd, &c->rx, err, sizeof(err)) <= 0)
            return;
    }
}

/* The closed connection's message: which daemon, whether it shut down
 * cleanly (it said goodbye) or vanished, and what to run. */
static void daemon_gone(obcomm_t *c)
{
    read_goodbye(c);
    if (c->goodbye[0] != '\0')
        obc_fail(c, OBCOMM_E_PEER_LOST,
                 "obcommd at %s shut down cleanly (%s) and closed the "
                 "connection: start it again (systemctl status obcommd "
                 "shows it) and resume the job from its last checkpoint",
                 c->socket, c->goodbye);
    else
        obc_fail(c, OBCOMM_E_PEER_LOST,
                 "obcommd at %s vanished without a goodbye (killed or "
                 "crashed): run `systemctl status obcommd` (and `journalctl "
                 "-u obcommd`) on this node to see why, then resume the job "
                 "from its last checkpoint",
                 c->socket);
}

int obc_kill(obcomm_t *c, int rc)
{
    if (!c->dead && rc == OBCOMM_E_PEER_LOST &&
        strcmp(c->err, OBC_DAEMON_CLOSED) == 0)
        daemon_gone(c);
    if (!c->dead) {
        c->dead = 1;
        c->dead_status = rc;
        memcpy(c->dead_why, c->err, sizeof(c->dead_why));
        obc_requests_end(c, rc, c->dead_why);
    }
    return rc;
}

static int on_complete(obcomm_t *c, const Obcomm__Complete *done)
{
    obcomm_request_t *r = c->first;
    while (r != NULL && r->seq != done->seq)
        r = r->next;
    if (r == NULL) {
        obc_fail(c, OBCOMM_E_PROTO,
                 "obcommd completed op %llu, which is not in flight",
                 (unsigned long long)done->seq);
        return obc_kill(c, OBCOMM_E_PROTO);
    }
    if (done->status > 0) {
        char msg[96];
        snprintf(msg, sizeof(msg), "obcommd completed op %llu with status %d",
                 (unsigned long long)done->seq, (int)done->status);
        settle(r, OBCOMM_E_PROTO, msg);
    } else if (done->status < 0) {
        settle(r, done->status,
               done->message[0] ? done->message
                                : obcomm_strerror(done->status));
    } else {
        r->value = done->value;
        r->bytes = done->bytes;
        settle(r, 0, "");
    }
    return 0;
}

/* Hands one message to whoever waits for it; takes ownership of m. */
static int dispatch(obcomm_t *c, Obcomm__DaemonMsg *m)
{
    if (m->body_case == OBCOMM__DAEMON_MSG__BODY_GOODBYE) {
        snprintf(c->goodbye, sizeof(c->goodbye), "%s", m->goodbye->reason);
        obcomm__daemon_msg__free_unpacked(m, NULL);
        return 0;
    }
    if (m->body_case == OBCOMM__DAEMON_MSG__BODY_COMPLETE) {
        int rc = on_complete(c, m->complete);
        obcomm__daemon_msg__free_unpacked(m, NULL);
        return rc;
    }
    if (m->body_case == c->want && c->reply == NULL) {
        c->reply = m;
        return 0;
    }
    if (c->want != OBCOMM__DAEMON_MSG__BODY__NOT_SET)
        obc_fail(c, OBCOMM_E_PROTO, "expected %s from obcommd, got %s",
                 daemon_msg_name(c->want), daemon_msg_name(m->body_case));
    else
        obc_fail(c, OBCOMM_E_PROTO, "obcommd sent an unexpected %s",
                 daemon_msg_name(m->body_case));
    obcomm__daemon_msg__free_unpacked(m, NULL);
    return obc_kill(c, OBCOMM_E_PROTO);
}

/* Reads and dispatches every whole message the socket holds, without
 * blocking. Returns 0, or the error that killed the handle. */
static int pump(obcomm_t *c)
{
    if (c->dead)
        return c->dead_status;
    for (;;) {
        Obcomm__DaemonMsg *m;
        int rc = obc_rx_next(&c->rx, &m, c->err, sizeof(c->err));
        if (rc < 0)
            return obc_kill(c, rc);
        if (rc == 1) {
            rc = dispatch(c, m);
            if (rc < 0)
                return rc;
            continue;
        }
        rc = obc_rx_read(c->fd, &c->rx, c->err, sizeof(c->err));
        if (rc < 0)
            return obc_kill(c, rc);
        if (rc == 0)
            return 0;
    }
}

typedef int (*ready_fn)(const obcomm_t *c, const void *arg);

/* Reads the daemon's messages until ready(c, arg) holds, blocking in
 * poll() at most until `deadline`; `what` names what is awaited in the
 * timeout message (" op 7", or "" for an exchange). Returns 0, or the
 * error that killed the handle (a timeout kills it too: only a hung
 * daemon misses the deadline by OBC_GRACE_MS, as the daemon ends a
 * stalled op itself). */
static int wait_for(obcomm_t *c, int64_t deadline, const char *what,
                    ready_fn ready, const void *arg)
{
    for (;;) {
        int rc = pump(c);
        if (rc < 0)
            return rc;
        if (ready(c, arg))
            return 0;
        rc = obc_sock_wait(c->fd, POLLIN, deadline);
        if (rc == OBCOMM_E_TIMEOUT) {
            obc_fail(c, rc, "daemon did not answer%s within %lld ms", what,
                     (long long)c->timeout_ms + OBC_GRACE_MS);
            return obc_kill(c, rc);
        }
        if (rc < 0) {
            obc_fail(c, rc, "poll: %s", strerror(-rc));
            return obc_kill(c, rc);
        }
    }
}

static int have_reply(const obcomm_t *c, const void *arg)
{
    (void)arg;
    return c->reply != NULL;
}

static int below_cap(const obcomm_t *c, const void *arg)
{
    (void)arg;
    return c->inflight < OBCOMM_MAX_INFLIGHT;
}

static int request_done(const obcomm_t *c, const void *arg)
{
    (void)c;
    return ((const obcomm_request_t *)arg)->state == OBC_REQ_DONE;
}

int obc_roundtrip(obcomm_t *c, const Obcomm__ClientMsg *msg, int pass_fd,
                  Obcomm__DaemonMsg__BodyCase want, Obcomm__DaemonMsg **out)
{
    int64_t budget = (int64_t)c->timeout_ms + OBC_GRACE_MS;
    int64_t deadline = obc_now_ms() + budget;
    int rc = obc_sock_send(c->fd, msg, pass_fd, deadline, budget, c->err,
                           sizeof(c->err));
    if (rc < 0)
        return obc_kill(c, rc);

    c->want = want;
    rc = wait_for(c, deadline, "", have_reply, NULL);
    Obcomm__DaemonMsg *m = c->reply;
    c->reply = NULL;
    c->want = OBCOMM__DAEMON_MSG__BODY__NOT_SET;
    if (rc < 0) {
        if (m != NULL)
            obcomm__daemon_msg__free_unpacked(m, NULL);
        return rc;
    }
    *out = m;
    return 0;
}

int obc_submit(obcomm_t *c, Obcomm__Submit *s, obcomm_request_t **out)
{
    /* The daemon holds at most OBD_OP_WINDOW ops of a job at once; a cap
     * of half that per trainer keeps every trainer inside the window even
     * when some of the job's trainers run ahead of others. */
    while (c->inflight >= OBCOMM_MAX_INFLIGHT) {
        char what[32];
        snprintf(what, sizeof(what), " op %llu",
                 (unsigned long long)c->first->seq);
        int rc = wait_for(c, c->first->deadline, what, below_cap, NULL);
        if (rc < 0)
            return rc;
    }
    int rc = obc_check_live(c);
    if (rc < 0)
        return rc;
    obcomm_request_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return obc_fail(c, OBCOMM_E_NOMEM, "out of memory for a request");

    int64_t budget = (int64_t)c->timeout_ms + OBC_GRACE_MS;
    r->deadline = obc_now_ms() + budget;
    s->seq = c->next_seq++;
    r->seq = s->seq;
    Obcomm__ClientMsg msg = OBCOMM__CLIENT_MSG__INIT;
    msg.body_case = OBCOMM__CLIENT_MSG__BODY_SUBMIT;
    msg.submit = s;
    rc = obc_sock_send(c->fd, &msg, -1, r->deadline, budget, c->err,
                       sizeof(c->err));
    if (rc < 0) {
        free(r);
        return obc_kill(c, rc);
    }

    r->state = OBC_REQ_IN_FLIGHT;
    r->c = c;
    r->prev = c->last;
    if (c->last != NULL)
        c->last->next = r;
    else
        c->first = r;
    c->last = r;
    c->inflight++;
    *out = r;
    return 0;
}

int obc_run(obcomm_t *c, Obcomm__Submit *s, uint64_t *value, uint64_t *bytes)
{
    obcomm_request_t *r;
    int rc = obc_submit(c, s, &r);
    if (rc < 0)
        return rc;
    rc = obcomm_wait(r);
    if (rc < 0) {
        obc_fail(c, rc, "%s", r->err);
    } else {
        if (value != NULL)
            *value = r->value;
        if (bytes != NULL)
            *bytes = r->bytes;
    }
    obcomm_request_free(r);
    return rc;
}

int obcomm_test(obcomm_request_t *req, int *done)
{
    if (req == NULL || done == NULL)
        return OBCOMM_E_INVAL;
    /* A failure while reading ends every request in flight, req included,
     * so its outcome is below either way. */
    if (req->state == OBC_REQ_IN_FLIGHT)
        pump(req->c);
    if (req->state == OBC_REQ_IN_FLIGHT && obc_now_ms() >= req->deadline) {
        /* The same bound as obcomm_wait's: only a hung daemon misses it,
         * so a caller that only tests (a progress thread) fails too. */
        obcomm_t *c = req->c;
        obc_fail(c, OBCOMM_E_TIMEOUT,
                 "daemon did not answer op %llu within %lld ms",
                 (unsigned long long)req->seq,
                 (long long)c->timeout_ms + OBC_GRACE_MS);
        obc_kill(c, OBCOMM_E_TIMEOUT);
    }
    if (req->state == OBC_REQ_IN_FLIGHT) {
        *done = 0;
        return 0;
    }
    *done = 1;
    return req->status;
}

int obcomm_wait(obcomm_request_t *req)
{
    if (req == NULL)
        return OBCOMM_E_INVAL;
    if (req->state == OBC_REQ_IN_FLIGHT) {
        char what[32];
        snprintf(what, sizeof(what), " op %llu", (unsigned long long)req->seq);
        /* Returns only once req is done: on success by its Complete, on
         * failure because the failure killed the handle. */
        wait_for(req->c, req->deadline, what, request_done, req);
    }
    return req->status;
}

const char *obcomm_request_error(const obcomm_request_t *req)
{
    if (req == NULL || req->state != OBC_REQ_DONE)
        return "";
    return req->err;
}

void obcomm_request_free(obcomm_request_t *req)
{
    if (req == NULL)
        return;
    if (req->state == OBC_REQ_IN_FLIGHT)
        req->orphan = 1;
    else
        free(req);
}

int obcomm_fd(const obcomm_t *c)
{
    return c == NULL ? -1 : c->fd;
}
