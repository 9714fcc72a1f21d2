/* The TCP mesh between daemons: every node keeps one link to every other
 * node; rank order defines the ring. A higher rank dials a lower one, with
 * backoff, until the world is complete. Links start with a Hello exchange
 * (protocol version, cluster, rank, world size, world fingerprint) and
 * carry frames (frame.h) afterwards.
 *
 * This module knows nothing of jobs and ops: what arrives goes up through
 * the daemon's hooks (daemon.h), which may not free the link's state. */
#ifndef OBD_PEERS_H
#define OBD_PEERS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "daemon.h"
#include "frame.h"

#include "obcomm.pb-c.h"

/* Longest job name a peer may send, terminator included (as job.h's). */
#define OBD_PEER_JOB_NAME 64

struct obd_link;

enum obd_peer_state { OBD_PEER_DOWN, OBD_PEER_CONNECTING, OBD_PEER_UP };

struct obd_peer {
    struct obd_daemon *d;
    int rank;
    enum obd_peer_state state;
    struct obd_link *link; /* the link past its Hello, or NULL */
    uv_timer_t retry;
    uint64_t backoff_ms;
    uint64_t attempt_ms; /* loop time the last dial attempt began */
    uint64_t bytes_sent;
    uint64_t bytes_received;
    uint32_t epoch; /* bumped on every new link */
    /* For obcommctl (ops): when the link came up, and why the last link or
     * attempt ended. */
    uint64_t up_since_unix_ms;
    char last_error[160];
    uint64_t last_error_unix_ms;
};

int obd_peers_start(struct obd_daemon *d);
/* hooks.ops_changed: links parked on a frame of an op that had not
 * started look at it again on a later turn. */
void obd_peers_ops_changed(struct obd_daemon *d);
void obd_peers_close(struct obd_daemon *d);

/* peer_timeout_ms as it applies: at most timeout_ms. */
uint64_t obd_peers_timeout_ms(const struct obd_daemon *d);

/* 1 when node's link was up and is down now (lost; why, when not NULL,
 * gets what ended it), 0 while it is up or before it first came up. */
int obd_peers_lost(const struct obd_daemon *d, int node, char *why, size_t len);

/* 1 when node's link is not up, whether it went down or never came up
 * since this daemon started; why gets what ended it, or that it never
 * came up. 0 while it is up, and for this node. */
int obd_peers_down(const struct obd_daemon *d, int node, char *why, size_t len);

/* 1 when every other node's link is up. */
int obd_peers_complete(const struct obd_daemon *d);

/* Sends a control message to node `to` (not ourselves). Returns 0,
 * OBD_E_PEER_LOST when the link is down or broken, OBD_E_TOOBIG past
 * OBCOMM_WIRE_MAX or OBD_E_NOMEM. */
int obd_peers_send_ctrl(struct obd_daemon *d, int to,
                        const Obcomm__PeerMsg *msg);

/* Sends a data frame to node `to`: the header f (version and type are
 * filled in here) and f->len bytes at `payload`, which must stay valid
 * until done(arg, status) runs, from the write's callback on a later
 * turn, with status 0 or OBD_E_PEER_LOST (the link broke; it closes).
 * Returns 0, or OBD_E_PEER_LOST or OBD_E_NOMEM when nothing was sent
 * (done then never runs). */
int obd_peers_send_data(struct obd_daemon *d, int to, struct obd_frame *f,
                        const void *payload,
                        void (*done)(void *arg, int status), void *arg);

/* The round-trip time and its variation of node `rank`'s link, from
 * TCP_INFO; both 0 when the link is down. */
void obd_peers_tcp_info(const struct obd_daemon *d, int rank, uint32_t *rtt_us,
                        uint32_t *rttvar_us);

/* Names a peer's state. */
const char *obd_peer_state_name(enum obd_peer_state s);

#endif
