#include "err.h"
#include "peers.h"

#include <obcomm.h>

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "auth.h"
#include "link.h"
#include "wire.h"

struct data_write {
    uv_write_t req;
    uint8_t hdr[OBD_FRAME_HDR];
    uint8_t tag[OBD_AUTH_TAG];
    void (*done)(void *arg, int status);
    void *arg;
    struct obd_link *link; /* valid here: closing cancels writes first */
    struct obd_peer *peer;
    size_t bytes;
    uint8_t ct[]; /* wire_protection = encrypt: the payload encrypted */
};

struct ctrl_write {
    uv_write_t req;
    struct obd_link *link; /* valid here: closing cancels writes first */
    struct obd_peer *peer;
    size_t bytes;
    uint8_t buf[];
};

static void dial(struct obd_peer *p);

/* A write that failed (ETIMEDOUT from TCP_USER_TIMEOUT, a reset) ends its
 * link: a link that is not reading (parked) learns of a dead peer only
 * here. A cancelled write belongs to a link that is closing already. */
static void write_failed(struct obd_link *l, int status)
{
    if (status < 0 && status != UV_ECANCELED)
        obd_peers_link_close(l, uv_strerror(status));
}

const char *obd_peer_state_name(enum obd_peer_state s)
{
    switch (s) {
    case OBD_PEER_DOWN:
        return "down";
    case OBD_PEER_CONNECTING:
        return "connecting";
    case OBD_PEER_UP:
        return "up";
    }
    return "?";
}

int obd_peers_complete(const struct obd_daemon *d)
{
    for (int i = 0; i < d->cfg.nodes; i++)
        if (i != d->cfg.rank && d->peers[i].state != OBD_PEER_UP)
            return 0;
    return 1;
}

uint64_t obd_peers_timeout_ms(const struct obd_daemon *d)
{
    int64_t t = d->cfg.peer_timeout_ms;
    if (t > d->cfg.timeout_ms)
        t = d->cfg.timeout_ms;
    return t > 0 ? (uint64_t)t : 1;
}

static void set_sockopts(struct obd_link *l)
{
    struct obd_daemon *d = l->d;
    uv_tcp_nodelay(&l->tcp, 1);
    uv_tcp_keepalive(&l->tcp, 1, (unsigned)d->cfg.keepalive_s);
    /* Sent data that stays unacknowledged this long ends the connection
     * (a partition, a node gone without a word): the write or read fails
     * with ETIMEDOUT and the link closes. */
    uv_os_fd_t fd;
    unsigned user_timeout = (unsigned)obd_peers_timeout_ms(d);
    if (uv_fileno((const uv_handle_t *)&l->tcp, &fd) == 0 &&
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout,
                   sizeof(user_timeout)) != 0)
        obd_log_debug(&d->log, "TCP_USER_TIMEOUT on %s: %s", l->where,
                      strerror(errno));
    int size = (int)d->cfg.sock_buf_bytes;
    uv_send_buffer_size((uv_handle_t *)&l->tcp, &size);
    size = (int)d->cfg.sock_buf_bytes;
    uv_recv_buffer_size((uv_handle_t *)&l->tcp, &size);
}

/* ---- writing ---- */

/* libuv refused to start a write (uv_write's code `uvrc`): the link is
 * broken. Logged with libuv's reason; the caller sees a lost peer. */
static int write_refused(struct obd_link *l, int uvrc)
{
    obd_log_debug(&l->d->log, "write to %s refused: %s", l->where,
                  uv_strerror(uvrc));
    return OBD_E_PEER_LOST;
}

static void on_ctrl_written(uv_write_t *req, int status)
{
    struct ctrl_write *w = container_of(req, struct ctrl_write, req);
    if (status == 0) {
        w->peer->bytes_sent += w->bytes;
        obd_metric_add(&w->peer->d->metrics, OBD_M_BYTES_SENT, w->bytes);
        obd_metric_add(&w->peer->d->metrics, OBD_M_CTRL_BYTES_SENT, w->bytes);
    }
    struct obd_link *l = w->link;
    free(w);
    write_failed(l, status);
}

/* Sends a control frame whose body is packed already; with a session
 * key it gets a tag (and is encrypted under wire_protection = encrypt). */
int obd_peers_link_send(struct obd_link *l, const uint8_t *packed, size_t body)
{
    if (body > OBCOMM_WIRE_MAX)
        return OBD_E_TOOBIG;
    size_t tag = l->tx_on ? OBD_AUTH_TAG : 0;
    struct ctrl_write *w = malloc(sizeof(*w) + OBD_FRAME_HDR + body + tag);
    if (w == NULL)
        return OBD_E_NOMEM;
    struct obd_frame f = {.version = OBCOMM_PROTO_VERSION,
                          .type = OBD_FRAME_CTRL,
                          .len = (uint32_t)body};
    uint8_t *hdr = w->buf, *payload = w->buf + OBD_FRAME_HDR;
    obd_frame_encode(&f, hdr);
    memcpy(payload, packed, body);
    if (l->tx_on) {
        if (l->d->cfg.wire == OBD_WIRE_ENCRYPT) {
            obd_auth_encrypt(l->tx_key, l->tx_ctr, hdr, OBD_FRAME_HDR, payload,
                             body, payload, payload + body);
        } else {
            struct obd_auth_mac m;
            obd_auth_mac_begin(&m, l->tx_key, l->tx_ctr, hdr, OBD_FRAME_HDR, 0);
            obd_auth_mac_update(&m, payload, body);
            obd_auth_mac_final(&m, payload + body);
        }
    }
    /* Before the handshake ends the peer is not known for sure; the bytes
     * are counted against our own entry, which status never reports. */
    w->peer = &l->d->peers[l->state == L_UP ? l->peer : l->d->cfg.rank];
    w->link = l;
    w->bytes = OBD_FRAME_HDR + body + tag;

    uv_buf_t buf = uv_buf_init((char *)w->buf, (unsigned)w->bytes);
    int rc =
        uv_write(&w->req, (uv_stream_t *)&l->tcp, &buf, 1, on_ctrl_written);
    if (rc) {
        free(w);
        return write_refused(l, rc);
    }
    if (l->tx_on)
        l->tx_ctr++;
    return 0;
}

int obd_peers_link_send_msg(struct obd_link *l, const ProtobufCMessage *msg)
{
    size_t body = protobuf_c_message_get_packed_size(msg);
    if (body > OBCOMM_WIRE_MAX)
        return OBD_E_TOOBIG;
    uint8_t stack[512];
    uint8_t *buf = body <= sizeof(stack) ? stack : malloc(body);
    if (buf == NULL)
        return OBD_E_NOMEM;
    protobuf_c_message_pack(msg, buf);
    int rc = obd_peers_link_send(l, buf, body);
    if (buf != stack)
        free(buf);
    return rc;
}

int obd_peers_send_ctrl(struct obd_daemon *d, int to,
                        const Obcomm__PeerMsg *msg)
{
    struct obd_peer *p = &d->peers[to];
    if (p->state != OBD_PEER_UP)
        return OBD_E_PEER_LOST;
    return obd_peers_link_send_msg(p->link, &msg->base);
}

static void on_data_written(uv_write_t *req, int status)
{
    struct data_write *w = container_of(req, struct data_write, req);
    if (status == 0) {
        w->peer->bytes_sent += w->bytes;
        obd_metric_add(&w->peer->d->metrics, OBD_M_BYTES_SENT, w->bytes);
    }
    void (*done)(void *, int) = w->done;
    void *arg = w->arg;
    struct obd_link *l = w->link;
    free(w);
    write_failed(l, status);
    done(arg, status == 0 ? 0 : OBD_E_PEER_LOST);
}

int obd_peers_send_data(struct obd_daemon *d, int to, struct obd_frame *f,
                        const void *payload,
                        void (*done)(void *arg, int status), void *arg)
{
    struct obd_peer *p = &d->peers[to];
    if (p->state != OBD_PEER_UP)
        return OBD_E_PEER_LOST;
    struct obd_link *l = p->link;
    int wire = l->tx_on ? d->cfg.wire : OBD_WIRE_NONE;
    size_t copy = wire == OBD_WIRE_ENCRYPT ? f->len : 0;
    struct data_write *w = malloc(sizeof(*w) + copy);
    if (w == NULL)
        return OBD_E_NOMEM;
    f->version = OBCOMM_PROTO_VERSION;
    f->type = OBD_FRAME_DATA;
    obd_frame_encode(f, w->hdr);
    w->done = done;
    w->arg = arg;
    w->peer = p;
    w->link = l;

    /* none: header and payload straight from memory. integrity: the tag
     * is computed over the payload in place. encrypt: the payload is
     * encrypted into the write's own buffer. */
    uv_buf_t bufs[3];
    unsigned n = 0;
    bufs[n++] = uv_buf_init((char *)w->hdr, OBD_FRAME_HDR);
    const void *body = payload;
    if (wire == OBD_WIRE_INTEGRITY) {
        struct obd_auth_mac m;
        obd_auth_mac_begin(&m, l->tx_key, l->tx_ctr, w->hdr, OBD_FRAME_HDR, 0);
        obd_auth_mac_update(&m, payload, f->len);
        obd_auth_mac_final(&m, w->tag);
    } else if (wire == OBD_WIRE_ENCRYPT) {
        obd_auth_encrypt(l->tx_key, l->tx_ctr, w->hdr, OBD_FRAME_HDR, payload,
                         f->len, w->ct, w->tag);
        body = w->ct;
    }
    if (f->len)
        bufs[n++] = uv_buf_init((char *)body, f->len);
    if (wire != OBD_WIRE_NONE)
        bufs[n++] = uv_buf_init((char *)w->tag, OBD_AUTH_TAG);
    w->bytes = OBD_FRAME_HDR + (size_t)f->len +
               (wire != OBD_WIRE_NONE ? OBD_AUTH_TAG : 0);

    int rc =
        uv_write(&w->req, (uv_stream_t *)&l->tcp, bufs, n, on_data_written);
    if (rc) {
        free(w);
        return write_refused(l, rc);
    }
    if (wire != OBD_WIRE_NONE)
        l->tx_ctr++;
    return 0;
}

static void unbind_unbound(struct obd_link *l)
{
    for (struct obd_link **pp = &l->d->unbound; *pp; pp = &(*pp)->next)
        if (*pp == l) {
            *pp = l->next;
            return;
        }
}

void obd_peers_link_up(struct obd_link *l)
{
    struct obd_daemon *d = l->d;
    int r = l->peer;
    unbind_unbound(l);
    uv_timer_stop(&l->hello_timer);
    free(l->hello_mine);
    free(l->hello_theirs);
    l->hello_mine = l->hello_theirs = NULL;

    struct obd_peer *p = &d->peers[r];
    if (p->link != NULL && p->link != l) {
        /* The peer restarted: its new link, which has proved the key when
         * there is one, replaces the old one. */
        obd_peers_link_close(p->link, "replaced by a new connection");
    }
    p->link = l;
    p->state = OBD_PEER_UP;
    p->epoch++;
    p->up_since_unix_ms = obd_metrics_unix_ms();
    p->backoff_ms = 0;
    l->state = L_UP;
    l->rx_ms = uv_now(&d->loop);
    obd_metric_add(&d->metrics, OBD_M_LINKS_UP, 1);
    obd_log_info(&d->log, "link to node %d (%s:%u) is up%s%s", r,
                 d->cfg.world[r].host, d->cfg.world[r].port,
                 d->keyed ? ", authenticated" : "",
                 obd_peers_complete(d) ? "; the world is complete" : "");
    d->hooks.peer_up(d, r);
}

/* Messages past the handshake go to the jobs; a name longer than a job
 * name can be is malformed. */
static void handle_job_msg(struct obd_link *l, const Obcomm__PeerMsg *m)
{
    const char *job = m->body_case == OBCOMM__PEER_MSG__BODY_ANNOUNCE
                          ? m->announce->job
                          : m->job_left->job;
    if (l->state != L_UP) {
        obd_peers_link_close(l, "job message before the handshake");
        return;
    }
    if (strlen(job) >= OBD_PEER_JOB_NAME ||
        (m->body_case == OBCOMM__PEER_MSG__BODY_ANNOUNCE &&
         m->announce->node_rank != (uint32_t)l->peer)) {
        obd_metric_add(&l->d->metrics, OBD_M_FRAMES_REJECTED, 1);
        obd_peers_link_close(l,
                             "job message with a wrong node rank or job name");
        return;
    }
    l->d->hooks.peer_msg(l->d, l->peer, m);
}

static void handle_ctrl(struct obd_link *l, const uint8_t *buf, size_t len)
{
    Obcomm__PeerMsg *m = obcomm__peer_msg__unpack(NULL, len, buf);
    if (m == NULL) {
        obd_metric_add(&l->d->metrics, OBD_M_FRAMES_REJECTED, 1);
        obd_peers_link_close(l, "control frame is not a PeerMsg");
        return;
    }
    switch (m->body_case) {
    case OBCOMM__PEER_MSG__BODY_HELLO:
        obd_handshake_hello(l, m->hello, buf, len);
        break;
    case OBCOMM__PEER_MSG__BODY_AUTH:
        obd_handshake_auth(l, m->auth);
        break;
    case OBCOMM__PEER_MSG__BODY_REFUSE: {
        char why[512];
        snprintf(why, sizeof(why), "refused by the peer: %s",
                 m->refuse->reason);
        /* The text may come from anyone: no control characters in logs. */
        for (char *c = why; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?';
        if (obd_handshake_refused(l, why + strlen("refused by the peer: ")))
            break;
        /* A refused peer dials again every second or so: once a minute. */
        obd_log_limited(&l->d->log, OBD_LOG_ERROR, 60000, "node %d (%s) %s",
                        l->peer, l->where, why);
        obd_peers_link_close(l, why);
        break;
    }
    case OBCOMM__PEER_MSG__BODY_ANNOUNCE:
    case OBCOMM__PEER_MSG__BODY_JOB_LEFT:
        handle_job_msg(l, m);
        break;
    case OBCOMM__PEER_MSG__BODY_HEARTBEAT:
        /* Its bytes count as a sign of life (on_read); nothing else. */
        if (l->state != L_UP)
            obd_peers_link_close(l, "heartbeat before the handshake");
        break;
    default:
        obd_peers_link_close(l, "empty PeerMsg");
        break;
    }
    obcomm__peer_msg__free_unpacked(m, NULL);
}

/* ---- reading ---- */

static void start_payload(struct obd_link *l)
{
    struct obd_daemon *d = l->d;
    l->got = 0;
    if (l->f.type == OBD_FRAME_CTRL) {
        l->ctrl = malloc(l->f.len ? l->f.len : 1);
        if (l->ctrl == NULL) {
            obd_peers_link_close(l, "out of memory");
            return;
        }
        l->rs = R_CTRL;
        return;
    }
    if (l->state != L_UP) {
        obd_metric_add(&d->metrics, OBD_M_FRAMES_REJECTED, 1);
        obd_peers_link_close(l, "data frame before the handshake");
        return;
    }

    void *dst = NULL;
    switch (d->hooks.data_begin(d, l->peer, &l->f, &dst, &l->token)) {
    case OBD_DATA_PARK:
        l->parked = 1;
        uv_read_stop((uv_stream_t *)&l->tcp);
        return;
    case OBD_DATA_INTO:
        l->dst = dst;
        l->rs = R_DATA;
        return;
    case OBD_DATA_DISCARD:
        /* Frames of an op that failed here (or never ran) are read and
         * dropped: the link itself is fine. */
        l->rs = R_DISCARD;
        return;
    }
}

/* The payload's destination went away (its op failed): what is left of
 * the frame is read and dropped. */
static void give_up_payload(struct obd_link *l)
{
    void *token = l->token;
    l->token = NULL;
    l->rs = R_DISCARD;
    l->d->hooks.data_end(token, l->peer, &l->f, 0);
}

/* Every payload byte is in: the tag follows when the frame has one. */
static void payload_done(struct obd_link *l);

static void finish_payload(struct obd_link *l)
{
    enum read_state rs = l->rs;
    l->rs = R_HDR;
    l->got = 0;
    if (rs == R_CTRL) {
        uint8_t *buf = l->ctrl;
        l->ctrl = NULL;
        handle_ctrl(l, buf, l->f.len);
        free(buf);
    } else if (rs == R_DATA) {
        void *token = l->token;
        l->token = NULL;
        l->d->hooks.data_end(token, l->peer, &l->f, 1);
    }
}

static void payload_done(struct obd_link *l)
{
    if (!l->rx_tagged) {
        finish_payload(l);
        return;
    }
    l->after_tag = l->rs;
    l->rs = R_TAG;
    l->got = 0;
}

/* The tag is in: checked, then the payload decrypted in place when it
 * was encrypted, then handed on. */
static void tag_done(struct obd_link *l)
{
    struct obd_daemon *d = l->d;
    if (obd_auth_mac_check(&l->rx_mac, l->tag) != 0) {
        obd_metric_add(&d->metrics, OBD_M_AUTH_FAILURES, 1);
        obd_metric_add(&d->metrics, OBD_M_FRAMES_REJECTED, 1);
        obd_log_limited(&d->log, OBD_LOG_ERROR, LOG_EVERY_MS,
                        "a frame from node %d (%s) failed its tag: closing "
                        "the link",
                        l->peer, l->where);
        obd_peers_link_close(l, "a frame failed authentication");
        return;
    }
    l->rs = l->after_tag;
    if (l->rx_encrypted) {
        if (l->rs == R_CTRL)
            obd_auth_decrypt(l->rx_key, l->rx_ctr, l->ctrl, l->f.len);
        else if (l->rs == R_DATA)
            obd_auth_decrypt(l->rx_key, l->rx_ctr, l->dst, l->f.len);
    }
    l->rx_ctr++;
    finish_payload(l);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct obd_link *l = container_of(h, struct obd_link, tcp);
    (void)suggested;
    if (l->rs == R_DATA && !l->d->hooks.data_live(l->token))
        give_up_payload(l);
    switch (l->rs) {
    case R_HDR:
        *buf = uv_buf_init((char *)l->hdr + l->got,
                           (unsigned)(OBD_FRAME_HDR - l->got));
        break;
    case R_CTRL:
        *buf = uv_buf_init((char *)l->ctrl + l->got,
                           (unsigned)(l->f.len - l->got));
        break;
    case R_DATA:
        *buf =
            uv_buf_init((char *)l->dst + l->got, (unsigned)(l->f.len - l->got));
        break;
    case R_TAG:
        *buf = uv_buf_init((char *)l->tag + l->got,
                           (unsigned)(OBD_AUTH_TAG - l->got));
        break;
    case R_DISCARD: {
        size_t left = l->f.len - l->got;
        if (l->discard == NULL)
            l->discard = malloc(DISCARD_BYTES);
        if (l->discard == NULL) {
            *buf = uv_buf_init(NULL, 0); /* on_read gets UV_ENOBUFS */
            break;
        }
        *buf = uv_buf_init(
            (char *)l->discard,
            (unsigned)(left < DISCARD_BYTES ? left : DISCARD_BYTES));
        break;
    }
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct obd_link *l = container_of(s, struct obd_link, tcp);
    struct obd_daemon *d = l->d;
    if (nread < 0) {
        obd_peers_link_close(l, nread == UV_EOF
                                    ? "connection closed by the peer"
                                    : uv_strerror((int)nread));
        return;
    }
    if (nread == 0 || l->state == L_CLOSING)
        return;

    obd_metric_add(&d->metrics, OBD_M_BYTES_RECEIVED, (uint64_t)nread);
    l->rx_ms = uv_now(&d->loop);
    if (l->peer >= 0 && l->state == L_UP)
        d->peers[l->peer].bytes_received += (uint64_t)nread;
    l->got += (size_t)nread;

    if (l->rs == R_HDR) {
        if (l->got < OBD_FRAME_HDR)
            return;
        const char *why;
        /* Before the handshake ends only small control frames. */
        uint32_t max_ctrl =
            l->state == L_UP ? OBCOMM_WIRE_MAX : PREAUTH_CTRL_MAX;
        if (obd_frame_decode(l->hdr, max_ctrl, (uint32_t)d->cfg.segment_bytes,
                             &l->f, &why)) {
            char msg[128];
            snprintf(msg, sizeof(msg), "malformed frame: %s", why);
            obd_metric_add(&d->metrics, OBD_M_FRAMES_REJECTED, 1);
            obd_peers_link_close(l, msg);
            return;
        }
        /* With a session every control frame has a tag, and data frames
         * too unless wire_protection is none. */
        l->rx_tagged = l->rx_on && (l->f.type == OBD_FRAME_CTRL ||
                                    d->cfg.wire != OBD_WIRE_NONE);
        l->rx_encrypted = l->rx_tagged && d->cfg.wire == OBD_WIRE_ENCRYPT;
        if (l->rx_tagged)
            obd_auth_mac_begin(&l->rx_mac, l->rx_key, l->rx_ctr, l->hdr,
                               OBD_FRAME_HDR, l->rx_encrypted);
        start_payload(l);
        if (l->state == L_CLOSING || l->parked || l->f.len > 0)
            return;
        payload_done(l);
        return;
    }
    if (l->rs == R_TAG) {
        if (l->got == OBD_AUTH_TAG)
            tag_done(l);
        return;
    }
    /* The tag covers the payload as it arrives, wherever it goes. */
    if (l->rx_tagged)
        obd_auth_mac_update(&l->rx_mac, buf->base, (size_t)nread);
    if (l->got < l->f.len)
        return;
    payload_done(l);
}

/* Links that paused on a frame of an op that had not started look at it
 * again; posted (obd_peers_ops_changed) whenever an op starts or ends. */
static void resume_links(struct obd_ready *r)
{
    struct obd_daemon *d = container_of(r, struct obd_daemon, links_resume);
    for (int i = 0; i < d->cfg.nodes; i++) {
        struct obd_link *l = d->peers[i].link;
        if (l == NULL || !l->parked || l->state != L_UP)
            continue;
        l->parked = 0;
        start_payload(l);
        if (l->parked || l->state == L_CLOSING)
            continue;
        uv_read_start((uv_stream_t *)&l->tcp, on_alloc, on_read);
        if (l->f.len == 0)
            payload_done(l);
    }
}

/* ---- liveness ---- */

int obd_peers_lost(const struct obd_daemon *d, int node, char *why, size_t len)
{
    if (d->peers == NULL || node == d->cfg.rank)
        return 0;
    const struct obd_peer *p = &d->peers[node];
    /* epoch counts the links that came up: 0 before the first one. */
    if (p->state == OBD_PEER_UP || p->epoch == 0)
        return 0;
    if (why != NULL && len > 0)
        snprintf(why, len, "%s",
                 p->last_error[0] ? p->last_error : "its link is down");
    return 1;
}

int obd_peers_down(const struct obd_daemon *d, int node, char *why, size_t len)
{
    if (d->peers == NULL || node == d->cfg.rank)
        return 0;
    const struct obd_peer *p = &d->peers[node];
    if (p->state == OBD_PEER_UP)
        return 0;
    if (p->epoch > 0)
        return obd_peers_lost(d, node, why, len);
    snprintf(why, len, "never up since this daemon started%s%s",
             p->last_error[0] ? "; last attempt: " : "", p->last_error);
    return 1;
}

/* The tick: an eighth of peer_timeout_ms, 10 ms to 1 s. */
static uint64_t heartbeat_every(const struct obd_daemon *d)
{
    uint64_t every = obd_peers_timeout_ms(d) / 8;
    return every < 10 ? 10 : every > 1000 ? 1000 : every;
}

/* Every tick: a link that has read nothing (no heartbeat, no data) for
 * peer_timeout_ms less a tick is declared down, so that a silence is
 * found within peer_timeout_ms of the last thing received, whatever the
 * phase of the tick; then each link that is up gets a heartbeat. A peer
 * sends one every tick, so a live link is silent for about a tick at
 * most. A parked link reads nothing on purpose and is not judged by
 * it: a dead peer shows there as a failed write (TCP_USER_TIMEOUT). A
 * tick that comes far too late means this loop stood still (a stopped
 * process, a swapped machine), not the peers: the clocks start again. */
static void on_heartbeat(uv_timer_t *t)
{
    struct obd_daemon *d = container_of(t, struct obd_daemon, heartbeat);
    uint64_t now = uv_now(&d->loop);
    uint64_t every = heartbeat_every(d);
    uint64_t timeout = obd_peers_timeout_ms(d);
    uint64_t limit = timeout > 2 * every ? timeout - every : every;
    int late = now - d->heartbeat_ms > 2 * every + 100;
    d->heartbeat_ms = now;
    Obcomm__Heartbeat hb = OBCOMM__HEARTBEAT__INIT;
    Obcomm__PeerMsg msg = OBCOMM__PEER_MSG__INIT;
    msg.body_case = OBCOMM__PEER_MSG__BODY_HEARTBEAT;
    msg.heartbeat = &hb;
    for (int i = 0; i < d->cfg.nodes; i++) {
        struct obd_link *l = d->peers[i].link;
        if (i == d->cfg.rank || l == NULL || l->state != L_UP)
            continue;
        if (late || l->parked)
            l->rx_ms = now;
        if (now - l->rx_ms >= limit) {
            char why[96];
            snprintf(why, sizeof(why),
                     "nothing received for %llu ms (peer_timeout_ms)",
                     (unsigned long long)(now - l->rx_ms));
            obd_metric_add(&d->metrics, OBD_M_PEER_TIMEOUTS, 1);
            obd_peers_link_close(l, why);
            continue;
        }
        if (obd_peers_link_send_msg(l, &msg.base) != 0)
            obd_peers_link_close(l, "cannot send a heartbeat");
    }
}

/* ---- link lifetime ---- */

static void on_link_closed(uv_handle_t *h)
{
    struct obd_link *l = container_of(h, struct obd_link, tcp);
    free(l->ctrl);
    free(l->discard);
    free(l->hello_mine);
    free(l->hello_theirs);
    memset(l->tx_key, 0, sizeof(l->tx_key));
    memset(l->rx_key, 0, sizeof(l->rx_key));
    free(l);
}

static void on_hello_timer_closed(uv_handle_t *h)
{
    struct obd_link *l = container_of(h, struct obd_link, hello_timer);
    uv_close((uv_handle_t *)&l->tcp, on_link_closed);
}

void obd_peers_link_close(struct obd_link *l, const char *why)
{
    struct obd_daemon *d = l->d;
    if (l->state == L_CLOSING)
        return;
    int was_up = l->state == L_UP;
    l->state = L_CLOSING;

    if (l->token != NULL) {
        void *token = l->token;
        l->token = NULL;
        d->hooks.data_end(token, l->peer, &l->f, 0);
    }
    unbind_unbound(l);

    uv_read_stop((uv_stream_t *)&l->tcp);
    uv_close((uv_handle_t *)&l->hello_timer, on_hello_timer_closed);

    if (l->peer >= 0) {
        struct obd_peer *p = &d->peers[l->peer];
        if (!d->closing) {
            snprintf(p->last_error, sizeof(p->last_error), "%s", why);
            p->last_error_unix_ms = obd_metrics_unix_ms();
        }
        if (p->link == l) {
            p->link = NULL;
            p->state = OBD_PEER_DOWN;
            d->metrics.v[OBD_M_LINKS_UP]--;
            if (!d->closing) {
                obd_metric_add(&d->metrics, OBD_M_LINK_ERRORS, 1);
                obd_log_warn(&d->log, "link to node %d is down: %s", p->rank,
                             why);
                d->hooks.peer_lost(d, p->rank, why);
            }
        } else if (!was_up && !d->closing) {
            obd_log_debug(&d->log, "connection to node %d closed: %s", l->peer,
                          why);
        }
        if (l->dialed && p->link == NULL && !d->closing)
            dial(p);
    } else if (!d->closing) {
        obd_log_limited(&d->log, OBD_LOG_WARN, 60000,
                        "unidentified connection from %s closed: %s", l->where,
                        why);
    }
}

static void on_hello_timeout(uv_timer_t *t)
{
    struct obd_link *l = container_of(t, struct obd_link, hello_timer);
    if (l->state == L_CONNECTING)
        obd_peers_link_close(l, "no answer to the connection attempt");
    else
        obd_peers_link_close(l, "no Hello within the handshake timeout");
}

static struct obd_link *link_new(struct obd_daemon *d)
{
    struct obd_link *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    l->d = d;
    l->peer = -1;
    uv_tcp_init(&d->loop, &l->tcp);
    uv_timer_init(&d->loop, &l->hello_timer);
    return l;
}

static void on_connect(uv_connect_t *req, int status)
{
    struct obd_link *l = container_of(req, struct obd_link, connect);
    struct obd_daemon *d = l->d;
    struct obd_peer *p = &d->peers[l->peer];
    if (l->state == L_CLOSING)
        return;
    if (status < 0) {
        obd_log_debug(&d->log, "dial node %d: %s", p->rank,
                      uv_strerror(status));
        l->state = L_HELLO; /* not up: closing it redials with backoff */
        obd_peers_link_close(l, uv_strerror(status));
        return;
    }
    set_sockopts(l);
    l->state = L_HELLO;
    uv_timer_start(&l->hello_timer, on_hello_timeout, HELLO_TIMEOUT_MS, 0);
    uv_read_start((uv_stream_t *)&l->tcp, on_alloc, on_read);
    if (obd_handshake_begin(l) != 0)
        obd_peers_link_close(l, "cannot send our Hello");
}

static int resolve(const struct obd_addr *a, struct sockaddr_storage *out)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res;
    char port[8];
    snprintf(port, sizeof(port), "%u", a->port);
    if (getaddrinfo(a->host, port, &hints, &res) != 0)
        return -1;
    memcpy(out, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

static void on_retry(uv_timer_t *t)
{
    struct obd_peer *p = container_of(t, struct obd_peer, retry);
    struct obd_daemon *d = p->d;
    struct sockaddr_storage sa;
    if (d->closing || p->link != NULL)
        return;
    if (resolve(&d->cfg.world[p->rank], &sa) != 0) {
        obd_log_warn(&d->log, "cannot resolve node %d's host %s", p->rank,
                     d->cfg.world[p->rank].host);
        snprintf(p->last_error, sizeof(p->last_error), "cannot resolve %s",
                 d->cfg.world[p->rank].host);
        p->last_error_unix_ms = obd_metrics_unix_ms();
        dial(p);
        return;
    }
    struct obd_link *l = link_new(d);
    if (l == NULL) {
        dial(p);
        return;
    }
    l->peer = p->rank;
    l->dialed = 1;
    snprintf(l->ip, sizeof(l->ip), "%s", d->cfg.world[p->rank].host);
    snprintf(l->where, sizeof(l->where), "%s:%u", d->cfg.world[p->rank].host,
             d->cfg.world[p->rank].port);
    l->state = L_CONNECTING;
    l->next = d->unbound;
    d->unbound = l;
    p->state = OBD_PEER_CONNECTING;
    p->attempt_ms = uv_now(&d->loop);
    int rc = uv_tcp_connect(&l->connect, &l->tcp, (struct sockaddr *)&sa,
                            on_connect);
    if (rc) {
        l->state = L_HELLO;
        obd_peers_link_close(l, uv_strerror(rc));
        return;
    }
    /* A SYN lost in a partition is retried by the kernel after 1, 3, 7,
     * 15... s: a healed link would wait for the next one. The attempt
     * ends instead and a new one starts (dial), so one begins at least
     * every CONNECT_TIMEOUT_MS + connect_backoff_max_ms. */
    uv_timer_start(&l->hello_timer, on_hello_timeout, CONNECT_TIMEOUT_MS, 0);
}

/* Schedules the next attempt to reach a lower rank, with exponential
 * backoff up to connect_backoff_max_ms, counted from the start of the
 * attempt that just ended: an attempt that took its whole timeout is
 * followed by the next one at once. */
static void dial(struct obd_peer *p)
{
    struct obd_daemon *d = p->d;
    uint64_t max = (uint64_t)d->cfg.connect_backoff_max_ms;
    p->backoff_ms = p->backoff_ms ? p->backoff_ms * 2 : 20;
    if (p->backoff_ms > max)
        p->backoff_ms = max;
    uint64_t spent = uv_now(&d->loop) - p->attempt_ms;
    uint64_t wait = spent < p->backoff_ms ? p->backoff_ms - spent : 0;
    p->state = OBD_PEER_CONNECTING;
    uv_timer_start(&p->retry, on_retry, wait, 0);
}

/* Connections that have not finished the handshake are bounded: at most
 * max_unauth_per_addr from one address and max_unauth_links in all. Over
 * a bound the oldest one of the busiest address goes, so a flood from one
 * place cannot keep a real node (which finishes in a round trip) out. */
static void bound_unauth(struct obd_daemon *d, struct obd_link *nl)
{
    for (;;) {
        int total = 0, same = 0, busiest = 0;
        struct obd_link *victim = NULL;
        for (struct obd_link *l = d->unbound; l; l = l->next) {
            if (l->dialed)
                continue;
            total++;
            if (strcmp(l->ip, nl->ip) == 0)
                same++;
        }
        if (same > d->cfg.max_unauth_per_addr) {
            for (struct obd_link *l = d->unbound; l; l = l->next)
                if (!l->dialed && l != nl && strcmp(l->ip, nl->ip) == 0)
                    victim = l; /* the list is newest first */
        } else if (total > d->cfg.max_unauth_links) {
            for (struct obd_link *l = d->unbound; l; l = l->next) {
                if (l->dialed || l == nl)
                    continue;
                int n = 0;
                for (struct obd_link *m = d->unbound; m; m = m->next)
                    if (!m->dialed && strcmp(m->ip, l->ip) == 0)
                        n++;
                if (n >= busiest) {
                    busiest = n;
                    victim = l;
                }
            }
        }
        if (victim == NULL)
            return;
        obd_metric_add(&d->metrics, OBD_M_UNAUTH_CLOSED, 1);
        obd_log_limited(&d->log, OBD_LOG_WARN, LOG_EVERY_MS,
                        "too many peer connections without a handshake (%d, "
                        "%d from %s): closing the oldest from %s",
                        total, same, nl->ip, victim->ip);
        obd_peers_link_close(victim,
                             "too many connections without a handshake");
    }
}

static void peer_address(struct obd_link *l)
{
    struct sockaddr_storage sa;
    int len = sizeof(sa);
    snprintf(l->ip, sizeof(l->ip), "?");
    if (uv_tcp_getpeername(&l->tcp, (struct sockaddr *)&sa, &len) != 0)
        return;
    unsigned port = 0;
    if (sa.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&sa;
        uv_ip4_name(in, l->ip, sizeof(l->ip));
        port = ntohs(in->sin_port);
    } else if (sa.ss_family == AF_INET6) {
        const struct sockaddr_in6 *in = (const struct sockaddr_in6 *)&sa;
        uv_ip6_name(in, l->ip, sizeof(l->ip));
        port = ntohs(in->sin6_port);
    }
    snprintf(l->where, sizeof(l->where), "%s:%u", l->ip, port);
}

static int listen_open(struct obd_daemon *d);

static void on_listen_resume(uv_timer_t *t)
{
    struct obd_daemon *d = container_of(t, struct obd_daemon, listen_pause);
    if (d->closing || d->listening)
        return;
    if (listen_open(d) != 0)
        uv_timer_start(&d->listen_pause, on_listen_resume, ACCEPT_PAUSE_MS, 0);
}

static void on_listener_paused(uv_handle_t *h)
{
    struct obd_daemon *d = container_of(h, struct obd_daemon, listener);
    if (!d->closing)
        uv_timer_start(&d->listen_pause, on_listen_resume, ACCEPT_PAUSE_MS, 0);
}

static void on_incoming(uv_stream_t *server, int status)
{
    struct obd_daemon *d = container_of(server, struct obd_daemon, listener);
    if (status < 0) {
        obd_log_limited(&d->log, OBD_LOG_WARN, LOG_EVERY_MS,
                        "accepting a peer connection: %s", uv_strerror(status));
        /* Out of descriptors: libuv would call us again at once. The
         * listener closes for a moment instead (peers redial). */
        if ((status == UV_EMFILE || status == UV_ENFILE) && d->listening) {
            obd_metric_add(&d->metrics, OBD_M_ACCEPT_PAUSES, 1);
            d->listening = 0;
            uv_close((uv_handle_t *)&d->listener, on_listener_paused);
        }
        return;
    }
    struct obd_link *l = link_new(d);
    if (l == NULL)
        return;
    if (uv_accept(server, (uv_stream_t *)&l->tcp) != 0) {
        uv_close((uv_handle_t *)&l->hello_timer, on_hello_timer_closed);
        return;
    }
    l->state = L_HELLO;
    l->next = d->unbound;
    d->unbound = l;
    peer_address(l);
    set_sockopts(l);
    uv_timer_start(&l->hello_timer, on_hello_timeout, HELLO_TIMEOUT_MS, 0);
    uv_read_start((uv_stream_t *)&l->tcp, on_alloc, on_read);
    bound_unauth(d, l);
}

static int listen_open(struct obd_daemon *d)
{
    struct sockaddr_storage sa;
    if (resolve(&d->cfg.listen_addr, &sa) != 0) {
        obd_log_error(&d->log, "cannot resolve listen address %s",
                      d->cfg.listen_addr.host);
        return OBD_E_INVAL;
    }
    /* Protected mode: without a key only loopback. */
    if (!d->keyed && !d->cfg.insecure && !obd_config_is_loopback(&sa)) {
        obd_log_error(
            &d->log,
            "refusing to listen on %s:%u without a cluster key: anyone who "
            "reaches that address could join the mesh. Set auth_key_file on "
            "every node (head -c 32 /dev/urandom > /etc/obcomm/cluster.key; "
            "chmod 600 it; copy it to every node), or set allow_insecure = "
            "true to accept the risk",
            d->cfg.listen_addr.host, d->cfg.listen_addr.port);
        return OBD_E_INVAL;
    }
    uv_tcp_init(&d->loop, &d->listener);
    d->listening = 1;
    int rc = uv_tcp_bind(&d->listener, (struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&d->listener, 128, on_incoming);
    if (rc) {
        obd_log_error(&d->log, "listen on %s:%u: %s", d->cfg.listen_addr.host,
                      d->cfg.listen_addr.port, uv_strerror(rc));
        d->listening = 0;
        uv_close((uv_handle_t *)&d->listener, NULL);
        return OBD_E_SYS;
    }
    return 0;
}

void obd_peers_ops_changed(struct obd_daemon *d)
{
    if (d->links_resume.run != NULL) /* the mesh has started */
        obd_runq_post(&d->runq, &d->links_resume);
}

int obd_peers_start(struct obd_daemon *d)
{
    d->links_resume.run = resume_links;
    d->peers = calloc((size_t)d->cfg.nodes, sizeof(*d->peers));
    if (d->peers == NULL)
        return OBD_E_NOMEM;
    for (int i = 0; i < d->cfg.nodes; i++) {
        d->peers[i].d = d;
        d->peers[i].rank = i;
        d->peers[i].state = i == d->cfg.rank ? OBD_PEER_UP : OBD_PEER_DOWN;
        uv_timer_init(&d->loop, &d->peers[i].retry);
    }
    uv_timer_init(&d->loop, &d->heartbeat);
    if (d->cfg.nodes == 1)
        return 0;
    d->heartbeat_ms = uv_now(&d->loop);
    uv_timer_start(&d->heartbeat, on_heartbeat, heartbeat_every(d),
                   heartbeat_every(d));

    int rc = listen_open(d);
    if (rc)
        return rc;
    obd_log_info(&d->log, "listening for peers on %s:%u (%s)",
                 d->cfg.listen_addr.host, d->cfg.listen_addr.port,
                 d->keyed ? "cluster key set"
                          : "no cluster key: unauthenticated");

    /* A higher rank dials every lower one. */
    for (int i = 0; i < d->cfg.rank; i++)
        dial(&d->peers[i]);
    return 0;
}

void obd_peers_close(struct obd_daemon *d)
{
    if (d->peers == NULL)
        return;
    for (int i = 0; i < d->cfg.nodes; i++) {
        struct obd_peer *p = &d->peers[i];
        uv_close((uv_handle_t *)&p->retry, NULL);
        if (p->link != NULL)
            obd_peers_link_close(p->link, "shutting down");
    }
    uv_close((uv_handle_t *)&d->heartbeat, NULL);
    while (d->unbound != NULL)
        obd_peers_link_close(d->unbound, "shutting down");
    if (d->listening) {
        d->listening = 0;
        uv_close((uv_handle_t *)&d->listener, NULL);
    }
}

/* ops: for obcommctl's `peers`. */
void obd_peers_tcp_info(const struct obd_daemon *d, int rank, uint32_t *rtt_us,
                        uint32_t *rttvar_us)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    uv_os_fd_t fd;
    const struct obd_link *l = d->peers[rank].link;
    *rtt_us = 0;
    *rttvar_us = 0;
    if (l == NULL || uv_fileno((const uv_handle_t *)&l->tcp, &fd) != 0)
        return;
    memset(&ti, 0, sizeof(ti));
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
        return;
    *rtt_us = ti.tcpi_rtt;
    *rttvar_us = ti.tcpi_rttvar;
}
