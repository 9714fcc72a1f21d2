/* Internal to the mesh: a link between two daemons, shared by peers.c
 * (sockets, frames, lifetime) and handshake.c (Hello, Auth, agreement).
 * Nothing else includes this. */
#ifndef OBD_LINK_H
#define OBD_LINK_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "auth.h"
#include "daemon.h"
#include "frame.h"

#include "obcomm.pb-c.h"

/* A link that has not finished the handshake by then is closed. */
#define HELLO_TIMEOUT_MS 10000
/* A dialed connection not established by then is given up (and dialed
 * again): about one SYN retransmission. */
#define CONNECT_TIMEOUT_MS 1000
#define DISCARD_BYTES      16384
/* Largest control frame before the handshake ends (a Hello is ~150 bytes):
 * what an unauthenticated connection may make us allocate. */
#define PREAUTH_CTRL_MAX 4096
/* Accepting pauses this long when descriptors run out. */
#define ACCEPT_PAUSE_MS 250
/* A repeated warning goes out at most this often. */
#define LOG_EVERY_MS 10000

/* L_HELLO: waiting for the peer's Hello; L_AUTH: for its Auth. */
enum link_state { L_CONNECTING, L_HELLO, L_AUTH, L_UP, L_CLOSING };
enum read_state { R_HDR, R_CTRL, R_DATA, R_DISCARD, R_TAG };

struct obd_link {
    struct obd_daemon *d;
    uv_tcp_t tcp;
    uv_connect_t connect;
    uv_timer_t hello_timer;
    enum link_state state;
    int peer;       /* rank once known, else -1 */
    int dialed;     /* we dialed it */
    char ip[48];    /* the other end's address, for logs and caps */
    char where[64]; /* ip:port */

    /* The handshake (auth.h): both Hellos as they travelled. */
    uint8_t nonce[OBD_AUTH_NONCE];
    uint8_t *hello_mine, *hello_theirs;
    size_t hello_mine_len, hello_theirs_len;

    /* The session, once keys are set: frames carry tags. */
    int tx_on, rx_on;
    uint8_t tx_key[OBD_AUTH_KEY], rx_key[OBD_AUTH_KEY];
    uint64_t tx_ctr, rx_ctr;
    struct obd_auth_mac rx_mac;
    int rx_tagged, rx_encrypted; /* the frame being read */
    enum read_state after_tag;
    uint8_t tag[OBD_AUTH_TAG];

    enum read_state rs;
    uint8_t hdr[OBD_FRAME_HDR];
    size_t got;
    struct obd_frame f;
    uint8_t *ctrl;
    uint8_t *dst;
    void *token;      /* from data_begin, until data_end */
    int parked;       /* reading paused until the frame's op starts */
    uint64_t rx_ms;   /* loop time of the last bytes read (liveness) */
    uint8_t *discard; /* DISCARD_BYTES, allocated at first use */

    struct obd_link *next; /* in d->unbound */
};

/* peers.c, for handshake.c. */

/* Sends a control frame whose body is packed already (borrowed); with a
 * session it gets its tag. 0, OBD_E_PEER_LOST (the link is broken),
 * OBD_E_TOOBIG (past OBCOMM_WIRE_MAX) or OBD_E_NOMEM. */
int obd_peers_link_send(struct obd_link *l, const uint8_t *packed, size_t len);
/* Packs msg and sends it as obd_peers_link_send. */
int obd_peers_link_send_msg(struct obd_link *l, const ProtobufCMessage *msg);
/* Closes the link (idempotent); the node is told through the hooks when
 * it was the node's link. */
void obd_peers_link_close(struct obd_link *l, const char *why);
/* The handshake is done: the link becomes the node's link, replacing an
 * older one. */
void obd_peers_link_up(struct obd_link *l);

/* handshake.c, for peers.c. */

/* Starts a dialed link's handshake: our Hello. 0 or a negative code. */
int obd_handshake_begin(struct obd_link *l);
/* The peer's Hello (raw: its packed bytes as they travelled). */
void obd_handshake_hello(struct obd_link *l, const Obcomm__Hello *h,
                         const uint8_t *raw, size_t rawlen);
/* The peer's proof; brings the link up through obd_peers_link_up. */
void obd_handshake_auth(struct obd_link *l, const Obcomm__Auth *a);
/* The reason a node sends when a peer's proof fails: the only text an
 * unauthenticated peer reads besides "handshake refused". */
#define OBD_REFUSE_AUTH "authentication failed"
/* The peer refused the link with `reason` (its text, untrusted). Returns 1
 * when that is an authentication failure, which it logs, counts and ends
 * the link for: we accepted and sent our proof, and the dialer refused
 * it with OBD_REFUSE_AUTH (a dialer that checked our proof sends its own
 * even when it refuses for another reason). Else 0: the caller logs the
 * refusal and closes the link. */
int obd_handshake_refused(struct obd_link *l, const char *reason);

#endif
