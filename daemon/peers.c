#include "peers.h"

#include <obcomm.h>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "wire.h"

/* A link that has not said Hello by then is closed. */
#define HELLO_TIMEOUT_MS 10000
#define DISCARD_BYTES    16384

enum link_state { L_CONNECTING, L_HELLO, L_UP, L_CLOSING };
enum read_state { R_HDR, R_CTRL, R_DATA, R_DISCARD };

struct obd_link {
    struct obd_daemon *d;
    uv_tcp_t tcp;
    uv_connect_t connect;
    uv_timer_t hello_timer;
    enum link_state state;
    int peer;   /* rank once known, else -1 */
    int dialed; /* we dialed it */

    enum read_state rs;
    uint8_t hdr[OBD_FRAME_HDR];
    size_t got;
    struct obd_frame f;
    uint8_t *ctrl;
    uint8_t *dst;
    void *token; /* from data_begin, until data_end */
    int parked;  /* reading paused until the frame's op starts */
    uint8_t discard[DISCARD_BYTES];

    struct obd_link *next; /* in d->unbound */
};

struct data_write {
    uv_write_t req;
    uint8_t hdr[OBD_FRAME_HDR];
    void (*done)(void *arg, int status);
    void *arg;
    struct obd_peer *peer;
    size_t bytes;
};

struct ctrl_write {
    uv_write_t req;
    struct obd_peer *peer;
    size_t bytes;
    uint8_t buf[];
};

static void dial(struct obd_peer *p);
static void link_close(struct obd_link *l, const char *why);

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

static void set_sockopts(struct obd_link *l)
{
    struct obd_daemon *d = l->d;
    uv_tcp_nodelay(&l->tcp, 1);
    uv_tcp_keepalive(&l->tcp, 1, (unsigned)d->cfg.keepalive_s);
    int size = (int)d->cfg.sock_buf_bytes;
    uv_send_buffer_size((uv_handle_t *)&l->tcp, &size);
    size = (int)d->cfg.sock_buf_bytes;
    uv_recv_buffer_size((uv_handle_t *)&l->tcp, &size);
}

/* ---- writing ---- */

static void on_ctrl_written(uv_write_t *req, int status)
{
    struct ctrl_write *w = container_of(req, struct ctrl_write, req);
    if (status == 0) {
        w->peer->bytes_sent += w->bytes;
        obd_metric_add(&w->peer->d->metrics, OBD_M_BYTES_SENT, w->bytes);
        obd_metric_add(&w->peer->d->metrics, OBD_M_CTRL_BYTES_SENT, w->bytes);
    }
    free(w);
}

static int link_send_ctrl(struct obd_link *l, const ProtobufCMessage *msg)
{
    size_t body = protobuf_c_message_get_packed_size(msg);
    if (body > OBCOMM_WIRE_MAX)
        return OBCOMM_E_NOMEM;
    struct ctrl_write *w = malloc(sizeof(*w) + OBD_FRAME_HDR + body);
    if (w == NULL)
        return OBCOMM_E_NOMEM;
    struct obd_frame f = {.version = OBCOMM_PROTO_VERSION,
                          .type = OBD_FRAME_CTRL,
                          .len = (uint32_t)body};
    obd_frame_encode(&f, w->buf);
    protobuf_c_message_pack(msg, w->buf + OBD_FRAME_HDR);
    /* Before the Hello an accepted link has no peer yet; its bytes are
     * counted against our own entry, which status never reports. */
    w->peer = &l->d->peers[l->peer >= 0 ? l->peer : l->d->cfg.rank];
    w->bytes = OBD_FRAME_HDR + body;

    uv_buf_t buf = uv_buf_init((char *)w->buf, (unsigned)w->bytes);
    int rc =
        uv_write(&w->req, (uv_stream_t *)&l->tcp, &buf, 1, on_ctrl_written);
    if (rc) {
        free(w);
        return rc;
    }
    return 0;
}

int obd_peers_send_ctrl(struct obd_daemon *d, int to,
                        const Obcomm__PeerMsg *msg)
{
    struct obd_peer *p = &d->peers[to];
    if (p->state != OBD_PEER_UP)
        return OBCOMM_E_PEER_LOST;
    return link_send_ctrl(p->link, &msg->base);
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
    free(w);
    done(arg, status);
}

int obd_peers_send_data(struct obd_daemon *d, int to, struct obd_frame *f,
                        const void *payload,
                        void (*done)(void *arg, int status), void *arg)
{
    struct obd_peer *p = &d->peers[to];
    if (p->state != OBD_PEER_UP)
        return OBCOMM_E_PEER_LOST;
    struct data_write *w = malloc(sizeof(*w));
    if (w == NULL)
        return OBCOMM_E_NOMEM;
    f->version = OBCOMM_PROTO_VERSION;
    f->type = OBD_FRAME_DATA;
    obd_frame_encode(f, w->hdr);
    w->done = done;
    w->arg = arg;
    w->peer = p;
    w->bytes = OBD_FRAME_HDR + (size_t)f->len;

    uv_buf_t bufs[2] = {uv_buf_init((char *)w->hdr, OBD_FRAME_HDR),
                        uv_buf_init((char *)payload, f->len)};
    int rc = uv_write(&w->req, (uv_stream_t *)&p->link->tcp, bufs,
                      f->len ? 2 : 1, on_data_written);
    if (rc) {
        free(w);
        return rc;
    }
    return 0;
}

/* ---- the handshake ---- */

static void send_hello(struct obd_link *l)
{
    struct obd_daemon *d = l->d;
    Obcomm__Hello h = OBCOMM__HELLO__INIT;
    Obcomm__PeerMsg msg = OBCOMM__PEER_MSG__INIT;
    h.proto_version = OBCOMM_PROTO_VERSION;
    h.cluster = d->cfg.cluster;
    h.rank = (uint32_t)d->cfg.rank;
    h.world_size = (uint32_t)d->cfg.nodes;
    h.world_fingerprint = d->cfg.fingerprint;
    /* ops: the list itself, so that a peer that disagrees can name the
     * first entry that differs. */
    char text[OBD_MAX_NODES][OBD_HOST_MAX + 8];
    char *world[OBD_MAX_NODES];
    for (int i = 0; i < d->cfg.nodes; i++) {
        obd_config_world_entry(&d->cfg, i, text[i], sizeof(text[i]));
        world[i] = text[i];
    }
    h.n_world = (size_t)d->cfg.nodes;
    h.world = world;
    msg.body_case = OBCOMM__PEER_MSG__BODY_HELLO;
    msg.hello = &h;
    (void)link_send_ctrl(l, &msg.base);
}

static void refuse(struct obd_link *l, const char *reason)
{
    Obcomm__Refuse r = OBCOMM__REFUSE__INIT;
    Obcomm__PeerMsg msg = OBCOMM__PEER_MSG__INIT;
    r.reason = (char *)reason;
    msg.body_case = OBCOMM__PEER_MSG__BODY_REFUSE;
    msg.refuse = &r;
    (void)link_send_ctrl(l, &msg.base);
    obd_metric_add(&l->d->metrics, OBD_M_LINK_ERRORS, 1);
    /* ops: a refused peer dials again every second or so: once a minute. */
    obd_log_limited(&l->d->log, OBD_LOG_ERROR, 60000, "refusing a peer: %s",
                    reason);
    link_close(l, reason);
}

static void unbind_unbound(struct obd_link *l)
{
    for (struct obd_link **pp = &l->d->unbound; *pp; pp = &(*pp)->next)
        if (*pp == l) {
            *pp = l->next;
            return;
        }
}

static void handle_hello(struct obd_link *l, const Obcomm__Hello *h)
{
    struct obd_daemon *d = l->d;
    char why[400];

    if (l->state != L_HELLO) {
        link_close(l, "Hello after the handshake");
        return;
    }
    if (h->proto_version != OBCOMM_PROTO_VERSION) {
        snprintf(why, sizeof(why),
                 "protocol version %u here, %u at the peer (rank %u)",
                 OBCOMM_PROTO_VERSION, h->proto_version, h->rank);
        refuse(l, why);
        return;
    }
    if (strcmp(h->cluster, d->cfg.cluster) != 0) {
        snprintf(why, sizeof(why),
                 "cluster '%s' here (rank %lld), '%s' at the peer (rank %u)",
                 d->cfg.cluster, (long long)d->cfg.rank, h->cluster, h->rank);
        refuse(l, why);
        return;
    }
    if (h->world_size != (uint32_t)d->cfg.nodes ||
        h->world_fingerprint != d->cfg.fingerprint) {
        char diff[256];
        obd_config_world_diff(&d->cfg, (const char *const *)h->world,
                              h->n_world, diff, sizeof(diff));
        snprintf(why, sizeof(why),
                 "world of %d nodes with fingerprint %016llx here (rank "
                 "%lld), %u nodes with fingerprint %016llx at rank %u: the "
                 "peers lists differ: %s",
                 d->cfg.nodes, (unsigned long long)d->cfg.fingerprint,
                 (long long)d->cfg.rank, h->world_size,
                 (unsigned long long)h->world_fingerprint, h->rank, diff);
        refuse(l, why);
        return;
    }
    int r = (int)h->rank;
    if (r >= d->cfg.nodes || r == d->cfg.rank ||
        (l->dialed ? r != l->peer : r < d->cfg.rank)) {
        snprintf(why, sizeof(why),
                 "peer says it is rank %u; expected %s (this is rank %lld)",
                 h->rank, l->dialed ? "the rank dialed" : "a higher rank",
                 (long long)d->cfg.rank);
        refuse(l, why);
        return;
    }

    unbind_unbound(l);
    if (!l->dialed) {
        l->peer = r;
        send_hello(l);
    }
    uv_timer_stop(&l->hello_timer);

    struct obd_peer *p = &d->peers[r];
    if (p->link != NULL && p->link != l) {
        /* The peer restarted: its new link replaces the old one. */
        link_close(p->link, "replaced by a new connection");
    }
    p->link = l;
    p->state = OBD_PEER_UP;
    p->epoch++;
    p->up_since_unix_ms = obd_metrics_unix_ms();
    p->backoff_ms = 0;
    l->state = L_UP;
    obd_metric_add(&d->metrics, OBD_M_LINKS_UP, 1);
    obd_log_info(&d->log, "link to node %d (%s:%u) is up%s", r,
                 d->cfg.world[r].host, d->cfg.world[r].port,
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
        link_close(l, "job message before the handshake");
        return;
    }
    if (strlen(job) >= OBD_PEER_JOB_NAME ||
        (m->body_case == OBCOMM__PEER_MSG__BODY_ANNOUNCE &&
         m->announce->node_rank != (uint32_t)l->peer)) {
        obd_metric_add(&l->d->metrics, OBD_M_FRAMES_REJECTED, 1);
        link_close(l, "job message with a wrong node rank or job name");
        return;
    }
    l->d->hooks.peer_msg(l->d, l->peer, m);
}

static void handle_ctrl(struct obd_link *l, const uint8_t *buf, size_t len)
{
    Obcomm__PeerMsg *m = obcomm__peer_msg__unpack(NULL, len, buf);
    if (m == NULL) {
        obd_metric_add(&l->d->metrics, OBD_M_FRAMES_REJECTED, 1);
        link_close(l, "control frame is not a PeerMsg");
        return;
    }
    switch (m->body_case) {
    case OBCOMM__PEER_MSG__BODY_HELLO:
        handle_hello(l, m->hello);
        break;
    case OBCOMM__PEER_MSG__BODY_REFUSE: {
        char why[512];
        snprintf(why, sizeof(why), "refused by the peer: %s",
                 m->refuse->reason);
        obd_log_limited(&l->d->log, OBD_LOG_ERROR, 60000, "node %d %s", l->peer,
                        why);
        link_close(l, why);
        break;
    }
    case OBCOMM__PEER_MSG__BODY_ANNOUNCE:
    case OBCOMM__PEER_MSG__BODY_JOB_LEFT:
        handle_job_msg(l, m);
        break;
    default:
        link_close(l, "empty PeerMsg");
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
        l->ctrl = malloc(l->f.len);
        if (l->ctrl == NULL) {
            link_close(l, "out of memory");
            return;
        }
        l->rs = R_CTRL;
        return;
    }
    if (l->state != L_UP) {
        obd_metric_add(&d->metrics, OBD_M_FRAMES_REJECTED, 1);
        link_close(l, "data frame before the handshake");
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
    case R_DISCARD: {
        size_t left = l->f.len - l->got;
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
    (void)buf;
    if (nread < 0) {
        link_close(l, nread == UV_EOF ? "connection closed by the peer"
                                      : uv_strerror((int)nread));
        return;
    }
    if (nread == 0 || l->state == L_CLOSING)
        return;

    obd_metric_add(&d->metrics, OBD_M_BYTES_RECEIVED, (uint64_t)nread);
    if (l->peer >= 0 && l->state == L_UP)
        d->peers[l->peer].bytes_received += (uint64_t)nread;
    l->got += (size_t)nread;

    if (l->rs == R_HDR) {
        if (l->got < OBD_FRAME_HDR)
            return;
        const char *why;
        if (obd_frame_decode(l->hdr, OBCOMM_WIRE_MAX,
                             (uint32_t)d->cfg.segment_bytes, &l->f, &why)) {
            char msg[128];
            snprintf(msg, sizeof(msg), "malformed frame: %s", why);
            obd_metric_add(&d->metrics, OBD_M_FRAMES_REJECTED, 1);
            link_close(l, msg);
            return;
        }
        start_payload(l);
        if (l->state == L_CLOSING || l->parked || l->f.len > 0)
            return;
    } else if (l->got < l->f.len) {
        return;
    }
    finish_payload(l);
}

/* Links that paused on a frame of an op that had not started look at it
 * again; posted (d->ops_changed) whenever an op starts or ends. */
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
            finish_payload(l);
    }
}

/* ---- link lifetime ---- */

static void on_link_closed(uv_handle_t *h)
{
    struct obd_link *l = container_of(h, struct obd_link, tcp);
    free(l->ctrl);
    free(l);
}

static void on_hello_timer_closed(uv_handle_t *h)
{
    struct obd_link *l = container_of(h, struct obd_link, hello_timer);
    uv_close((uv_handle_t *)&l->tcp, on_link_closed);
}

static void link_close(struct obd_link *l, const char *why)
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
                        "unidentified connection closed: %s", why);
    }
}

static void on_hello_timeout(uv_timer_t *t)
{
    struct obd_link *l = container_of(t, struct obd_link, hello_timer);
    link_close(l, "no Hello within the handshake timeout");
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
        link_close(l, uv_strerror(status));
        return;
    }
    set_sockopts(l);
    l->state = L_HELLO;
    uv_timer_start(&l->hello_timer, on_hello_timeout, HELLO_TIMEOUT_MS, 0);
    uv_read_start((uv_stream_t *)&l->tcp, on_alloc, on_read);
    send_hello(l);
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
    l->state = L_CONNECTING;
    l->next = d->unbound;
    d->unbound = l;
    p->state = OBD_PEER_CONNECTING;
    int rc = uv_tcp_connect(&l->connect, &l->tcp, (struct sockaddr *)&sa,
                            on_connect);
    if (rc) {
        l->state = L_HELLO;
        link_close(l, uv_strerror(rc));
    }
}

/* Schedules the next attempt to reach a lower rank, with exponential
 * backoff up to connect_backoff_max_ms. */
static void dial(struct obd_peer *p)
{
    struct obd_daemon *d = p->d;
    uint64_t max = (uint64_t)d->cfg.connect_backoff_max_ms;
    p->backoff_ms = p->backoff_ms ? p->backoff_ms * 2 : 20;
    if (p->backoff_ms > max)
        p->backoff_ms = max;
    p->state = OBD_PEER_CONNECTING;
    uv_timer_start(&p->retry, on_retry, p->backoff_ms, 0);
}

static void on_incoming(uv_stream_t *server, int status)
{
    struct obd_daemon *d = container_of(server, struct obd_daemon, listener);
    if (status < 0)
        return;
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
    set_sockopts(l);
    uv_timer_start(&l->hello_timer, on_hello_timeout, HELLO_TIMEOUT_MS, 0);
    uv_read_start((uv_stream_t *)&l->tcp, on_alloc, on_read);
}

int obd_peers_start(struct obd_daemon *d)
{
    d->links_resume.run = resume_links;
    d->ops_changed = &d->links_resume;
    d->peers = calloc((size_t)d->cfg.nodes, sizeof(*d->peers));
    if (d->peers == NULL)
        return OBCOMM_E_NOMEM;
    for (int i = 0; i < d->cfg.nodes; i++) {
        d->peers[i].d = d;
        d->peers[i].rank = i;
        d->peers[i].state = i == d->cfg.rank ? OBD_PEER_UP : OBD_PEER_DOWN;
        uv_timer_init(&d->loop, &d->peers[i].retry);
    }
    if (d->cfg.nodes == 1)
        return 0;

    struct sockaddr_storage sa;
    if (resolve(&d->cfg.listen_addr, &sa) != 0) {
        obd_log_error(&d->log, "cannot resolve listen address %s",
                      d->cfg.listen_addr.host);
        return OBCOMM_E_INVAL;
    }
    uv_tcp_init(&d->loop, &d->listener);
    d->listening = 1;
    int rc = uv_tcp_bind(&d->listener, (struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&d->listener, 128, on_incoming);
    if (rc) {
        obd_log_error(&d->log, "listen on %s:%u: %s", d->cfg.listen_addr.host,
                      d->cfg.listen_addr.port, uv_strerror(rc));
        return rc;
    }
    obd_log_info(&d->log, "listening for peers on %s:%u",
                 d->cfg.listen_addr.host, d->cfg.listen_addr.port);

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
            link_close(p->link, "shutting down");
    }
    while (d->unbound != NULL)
        link_close(d->unbound, "shutting down");
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
