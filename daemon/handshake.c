/* The handshake of a link (auth.h draws it): Hellos, proofs, the session
 * keys and the options that must agree. What the peer says is trusted only
 * after its proof checks; an unauthenticated peer is told nothing but that
 * it was refused. */
#include "err.h"
#include "link.h"

#include <obcomm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

/* Options that must be equal on every node: sent in the Hello and
 * compared once the peer has proved it holds the key. */
static const char *const agreed_options[] = {
    "segment_bytes",
    "wire_protection",
    "owner_identity",
};
#define NAGREED (sizeof(agreed_options) / sizeof(agreed_options[0]))

/* Sends our Hello and keeps its bytes for the transcript. */
int obd_handshake_begin(struct obd_link *l)
{
    struct obd_daemon *d = l->d;
    Obcomm__Hello h = OBCOMM__HELLO__INIT;
    Obcomm__PeerMsg msg = OBCOMM__PEER_MSG__INIT;
    Obcomm__Option opts[NAGREED];
    Obcomm__Option *popts[NAGREED];
    char values[NAGREED][128];
    for (size_t i = 0; i < NAGREED; i++) {
        obcomm__option__init(&opts[i]);
        opts[i].name = (char *)agreed_options[i];
        if (obd_config_value(&d->cfg, agreed_options[i], values[i],
                             sizeof(values[i])))
            values[i][0] = '\0';
        opts[i].value = values[i];
        popts[i] = &opts[i];
    }
    obd_auth_random(l->nonce, sizeof(l->nonce));
    h.proto_version = OBCOMM_PROTO_VERSION;
    h.cluster = d->cfg.cluster;
    h.rank = (uint32_t)d->cfg.rank;
    h.world_size = (uint32_t)d->cfg.nodes;
    h.world_fingerprint = d->cfg.fingerprint;
    /* The list itself, so that a peer that disagrees can name the first
     * entry that differs. */
    char(*text)[OBD_HOST_MAX + 8] = calloc((size_t)d->cfg.nodes, sizeof(*text));
    char **world = calloc((size_t)d->cfg.nodes, sizeof(*world));
    if (text == NULL || world == NULL) {
        free(text);
        free(world);
        return OBD_E_NOMEM;
    }
    for (int i = 0; i < d->cfg.nodes; i++) {
        obd_config_world_entry(&d->cfg, i, text[i], sizeof(text[i]));
        world[i] = text[i];
    }
    h.n_world = (size_t)d->cfg.nodes;
    h.world = world;
    h.nonce.data = l->nonce;
    h.nonce.len = sizeof(l->nonce);
    h.n_options = NAGREED;
    h.options = popts;
    h.peer_rank = l->peer;
    msg.body_case = OBCOMM__PEER_MSG__BODY_HELLO;
    msg.hello = &h;

    size_t len = protobuf_c_message_get_packed_size(&msg.base);
    free(l->hello_mine);
    l->hello_mine = malloc(len);
    if (l->hello_mine != NULL)
        protobuf_c_message_pack(&msg.base, l->hello_mine);
    free(text);
    free(world);
    if (l->hello_mine == NULL)
        return OBD_E_NOMEM;
    l->hello_mine_len = len;
    return obd_peers_link_send(l, l->hello_mine, len);
}

/* Our proof over the transcript (empty without a key). */
static void send_auth(struct obd_link *l, const uint8_t t[OBD_AUTH_TRANSCRIPT])
{
    Obcomm__Auth a = OBCOMM__AUTH__INIT;
    Obcomm__PeerMsg msg = OBCOMM__PEER_MSG__INIT;
    uint8_t proof[OBD_AUTH_PROOF];
    if (l->d->keyed) {
        obd_auth_proof(l->d->auth_key,
                       l->dialed ? OBD_AUTH_DIALER : OBD_AUTH_ACCEPTOR, t,
                       proof);
        a.proof.data = proof;
        a.proof.len = sizeof(proof);
    }
    msg.body_case = OBCOMM__PEER_MSG__BODY_AUTH;
    msg.auth = &a;
    (void)obd_peers_link_send_msg(l, &msg.base);
}

/* Refuses the peer: `told` is what the peer reads, `why` what we log. */
static void refuse2(struct obd_link *l, const char *told, const char *why)
{
    Obcomm__Refuse r = OBCOMM__REFUSE__INIT;
    Obcomm__PeerMsg msg = OBCOMM__PEER_MSG__INIT;
    r.reason = (char *)told;
    msg.body_case = OBCOMM__PEER_MSG__BODY_REFUSE;
    msg.refuse = &r;
    (void)obd_peers_link_send_msg(l, &msg.base);
    obd_metric_add(&l->d->metrics, OBD_M_LINK_ERRORS, 1);
    /* A refused peer dials again every second or so: once a minute. */
    obd_log_limited(&l->d->log, OBD_LOG_ERROR, 60000,
                    "refusing a peer (%s): %s", l->where, why);
    obd_peers_link_close(l, why);
}

static void refuse(struct obd_link *l, const char *reason)
{
    refuse2(l, reason, reason);
}

/* A peer that failed the cluster key: logged (at most every
 * LOG_EVERY_MS, with how many were held back), counted, and told nothing
 * but that it failed. */
static void refuse_auth(struct obd_link *l, const char *why)
{
    struct obd_daemon *d = l->d;
    obd_metric_add(&d->metrics, OBD_M_AUTH_FAILURES, 1);
    obd_metric_add(&d->metrics, OBD_M_LINK_ERRORS, 1);
    obd_log_limited(&d->log, OBD_LOG_ERROR, LOG_EVERY_MS,
                    "peer connection from %s (claims rank %d) failed "
                    "authentication: %s",
                    l->where, l->peer, why);
    Obcomm__Refuse r = OBCOMM__REFUSE__INIT;
    Obcomm__PeerMsg msg = OBCOMM__PEER_MSG__INIT;
    r.reason = OBD_REFUSE_AUTH;
    msg.body_case = OBCOMM__PEER_MSG__BODY_REFUSE;
    msg.refuse = &r;
    (void)obd_peers_link_send_msg(l, &msg.base);
    obd_peers_link_close(l, "authentication failed");
}

int obd_handshake_refused(struct obd_link *l, const char *reason)
{
    struct obd_daemon *d = l->d;
    if (!d->keyed || l->dialed || l->state != L_AUTH ||
        strcmp(reason, OBD_REFUSE_AUTH) != 0)
        return 0;
    obd_metric_add(&d->metrics, OBD_M_AUTH_FAILURES, 1);
    obd_metric_add(&d->metrics, OBD_M_LINK_ERRORS, 1);
    obd_log_limited(&d->log, OBD_LOG_ERROR, LOG_EVERY_MS,
                    "peer connection from %s (claims rank %d) failed "
                    "authentication: it refused our proof (a wrong "
                    "cluster key on one side)",
                    l->where, l->peer);
    obd_peers_link_close(l, "authentication failed: the peer refused our "
                            "proof");
    return 1;
}

/* What every node must agree on, compared once the peer is
 * authenticated (so the values may be named): cluster, world and the
 * agreed options. 0, or OBD_E_MISMATCH with the difference in why. */
static int check_agreement(struct obd_link *l, const Obcomm__Hello *h,
                           char *why, size_t len)
{
    struct obd_daemon *d = l->d;
    long long me = (long long)d->cfg.rank;
    if (strcmp(h->cluster, d->cfg.cluster) != 0) {
        snprintf(why, len, "cluster '%s' here (rank %lld), '%s' at rank %u",
                 d->cfg.cluster, me, h->cluster, h->rank);
        return OBD_E_MISMATCH;
    }
    if (h->world_size != (uint32_t)d->cfg.nodes ||
        h->world_fingerprint != d->cfg.fingerprint) {
        char diff[256];
        obd_config_world_diff(&d->cfg, (const char *const *)h->world,
                              h->n_world, diff, sizeof(diff));
        snprintf(why, len,
                 "world of %d nodes with fingerprint %016llx here (rank "
                 "%lld), %u nodes with fingerprint %016llx at rank %u: the "
                 "peers lists differ: %s",
                 d->cfg.nodes, (unsigned long long)d->cfg.fingerprint, me,
                 h->world_size, (unsigned long long)h->world_fingerprint,
                 h->rank, diff);
        return OBD_E_MISMATCH;
    }
    for (size_t i = 0; i < NAGREED; i++) {
        char mine[128];
        const char *theirs = "(not sent)";
        if (obd_config_value(&d->cfg, agreed_options[i], mine, sizeof(mine)))
            mine[0] = '\0';
        for (size_t j = 0; j < h->n_options; j++)
            if (strcmp(h->options[j]->name, agreed_options[i]) == 0)
                theirs = h->options[j]->value;
        if (strcmp(mine, theirs) != 0) {
            snprintf(why, len,
                     "option %s is %s here (rank %lld) and %.64s at rank %u; "
                     "it must be equal on every node",
                     agreed_options[i], mine, me, theirs, h->rank);
            return OBD_E_MISMATCH;
        }
    }
    return 0;
}

/* The peer's Hello: what must hold before anything else (protocol, rank,
 * direction). Without a key the cluster and world are compared here too,
 * since there is no proof to wait for; with one they wait until the peer
 * has proved the key, so that an unauthenticated peer learns nothing of
 * the cluster and reads only "handshake refused". */
void obd_handshake_hello(struct obd_link *l, const Obcomm__Hello *h,
                         const uint8_t *raw, size_t rawlen)
{
    struct obd_daemon *d = l->d;
    char why[400];
    const char *generic = "handshake refused";

    if (l->state != L_HELLO) {
        obd_peers_link_close(l, "Hello out of turn");
        return;
    }
    if (h->proto_version != OBCOMM_PROTO_VERSION) {
        snprintf(why, sizeof(why),
                 "protocol version %u here, %u at the peer (rank %u)",
                 OBCOMM_PROTO_VERSION, h->proto_version, h->rank);
        refuse(l, why);
        return;
    }
    int r = (int)h->rank;
    if (h->rank >= (uint32_t)d->cfg.nodes || r == d->cfg.rank ||
        (l->dialed ? r != l->peer : r < d->cfg.rank) ||
        h->peer_rank != (int32_t)d->cfg.rank) {
        snprintf(why, sizeof(why),
                 "peer says it is rank %u and dials rank %d; expected %s "
                 "(this is rank %lld)",
                 h->rank, h->peer_rank,
                 l->dialed ? "the rank dialed" : "a higher rank",
                 (long long)d->cfg.rank);
        refuse2(l, d->keyed ? generic : why, why);
        return;
    }
    if (!d->keyed && strcmp(h->cluster, d->cfg.cluster) != 0) {
        snprintf(why, sizeof(why),
                 "cluster '%s' here (rank %lld), '%s' at the peer (rank %u)",
                 d->cfg.cluster, (long long)d->cfg.rank, h->cluster, h->rank);
        refuse(l, why);
        return;
    }
    if (!d->keyed && (h->world_size != (uint32_t)d->cfg.nodes ||
                      h->world_fingerprint != d->cfg.fingerprint)) {
        /* The fingerprint is not told: it would help an impostor. */
        /* Without a key the mesh is loopback (or explicitly insecure)
         * and the peer may read which entry differs, but not the
         * fingerprint: it would help an impostor. */
        char diff[256], told[400];
        obd_config_world_diff(&d->cfg, (const char *const *)h->world,
                              h->n_world, diff, sizeof(diff));
        snprintf(told, sizeof(told),
                 "world of %d nodes here (rank %lld), %u at rank %u: the "
                 "peers lists differ: %s",
                 d->cfg.nodes, (long long)d->cfg.rank, h->world_size, h->rank,
                 diff);
        snprintf(why, sizeof(why),
                 "%s (fingerprints %016llx here, %016llx "
                 "there)",
                 told, (unsigned long long)d->cfg.fingerprint,
                 (unsigned long long)h->world_fingerprint);
        refuse2(l, told, why);
        return;
    }

    l->hello_theirs = malloc(rawlen ? rawlen : 1);
    if (l->hello_theirs == NULL) {
        obd_peers_link_close(l, "out of memory");
        return;
    }
    memcpy(l->hello_theirs, raw, rawlen);
    l->hello_theirs_len = rawlen;
    l->state = L_AUTH;
    if (l->dialed)
        return; /* the acceptor's Auth follows */

    /* Acceptor: our Hello, then our proof over both. */
    l->peer = r;
    uint8_t t[OBD_AUTH_TRANSCRIPT];
    if (obd_handshake_begin(l) != 0) {
        obd_peers_link_close(l, "cannot send our Hello");
        return;
    }
    obd_auth_transcript(l->hello_theirs, l->hello_theirs_len, l->hello_mine,
                        l->hello_mine_len, t);
    send_auth(l, t);
}

/* The peer's proof. Nothing the peer said is trusted before it checks. */
void obd_handshake_auth(struct obd_link *l, const Obcomm__Auth *a)
{
    struct obd_daemon *d = l->d;
    char why[400];
    if (l->state != L_AUTH) {
        if (l->state == L_HELLO)
            refuse_auth(l, "Auth before Hello");
        else
            obd_peers_link_close(l, "Auth out of turn");
        return;
    }
    const uint8_t *hd = l->dialed ? l->hello_mine : l->hello_theirs;
    size_t hdlen = l->dialed ? l->hello_mine_len : l->hello_theirs_len;
    const uint8_t *ha = l->dialed ? l->hello_theirs : l->hello_mine;
    size_t halen = l->dialed ? l->hello_theirs_len : l->hello_mine_len;
    uint8_t t[OBD_AUTH_TRANSCRIPT];
    obd_auth_transcript(hd, hdlen, ha, halen, t);

    if (d->keyed) {
        if (obd_auth_proof_check(
                d->auth_key, l->dialed ? OBD_AUTH_ACCEPTOR : OBD_AUTH_DIALER, t,
                a->proof.data, a->proof.len) != 0) {
            refuse_auth(l, a->proof.len == 0
                               ? "it has no cluster key"
                               : "wrong cluster key, or a replayed handshake");
            return;
        }
        uint8_t d2a[OBD_AUTH_KEY], a2d[OBD_AUTH_KEY];
        obd_auth_session(d->auth_key, t, d2a, a2d);
        memcpy(l->tx_key, l->dialed ? d2a : a2d, OBD_AUTH_KEY);
        memcpy(l->rx_key, l->dialed ? a2d : d2a, OBD_AUTH_KEY);
        memset(d2a, 0, sizeof(d2a));
        memset(a2d, 0, sizeof(a2d));
    } else if (a->proof.len != 0) {
        refuse(l, "the peer proves a cluster key and this node has none "
                  "(set auth_key_file on every node)");
        return;
    }

    Obcomm__PeerMsg *m =
        obcomm__peer_msg__unpack(NULL, l->hello_theirs_len, l->hello_theirs);
    if (m == NULL || m->body_case != OBCOMM__PEER_MSG__BODY_HELLO) {
        if (m != NULL)
            obcomm__peer_msg__free_unpacked(m, NULL);
        obd_peers_link_close(l, "out of memory re-reading the peer's Hello");
        return;
    }
    int agreed = check_agreement(l, m->hello, why, sizeof(why));
    obcomm__peer_msg__free_unpacked(m, NULL);

    /* The dialer sends its proof even when it refuses: the acceptor then
     * knows that the refusal comes from a node with the key. */
    if (l->dialed)
        send_auth(l, t);
    /* From here on every frame carries a tag. */
    l->tx_on = l->rx_on = d->keyed;
    if (agreed != 0) {
        refuse(l, why);
        return;
    }
    obd_peers_link_up(l);
}
