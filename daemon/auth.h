/* The cluster key and the crypto of the mesh (libsodium). Pure: no sockets,
 * no loop; peers.c drives it.
 *
 * Handshake (D dials A; both hold the cluster key K):
 *
 *   D -> A  Hello_D   (rank, world, options that must agree, nonce_D)
 *   A -> D  Hello_A   (the same for A, nonce_A)
 *   A -> D  Auth      proof_A = MAC_K("acceptor", T)
 *   D -> A  Auth      proof_D = MAC_K("dialer", T)
 *
 * T = BLAKE2b(Hello_D bytes, Hello_A bytes) binds both ranks, the world
 * fingerprint, the options and both fresh nonces, so a proof recorded on
 * one connection is worthless on any other. MAC_K is keyed BLAKE2b. Each
 * side checks the other's proof before it trusts anything the other said.
 * Session keys, one per direction, are BLAKE2b_K("session", T).
 *
 * Frames after the handshake carry a 16-byte tag after the payload: the
 * ChaCha20-Poly1305 (IETF) tag under the direction's key with a 96-bit
 * nonce that is the direction's frame counter. Integrity: the payload is
 * additional data (sent in clear); encrypt: the payload is the AEAD's
 * ciphertext, the header its additional data. Either tag is computed
 * incrementally (obd_auth_mac_*) so that a payload is authenticated as it
 * arrives; it equals what crypto_aead_chacha20poly1305_ietf_*_detached
 * computes (tests/test_auth.c checks it). */
#ifndef OBD_AUTH_H
#define OBD_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define OBD_AUTH_KEY_MIN    32   /* bytes of key file, at least */
#define OBD_AUTH_KEY_MAX    4096 /* bytes of key file, at most */
#define OBD_AUTH_KEY        32   /* derived key and session keys */
#define OBD_AUTH_NONCE      32   /* handshake nonce */
#define OBD_AUTH_PROOF      32
#define OBD_AUTH_TRANSCRIPT 32
#define OBD_AUTH_TAG        16

/* Who computes a proof. */
enum obd_auth_role { OBD_AUTH_DIALER, OBD_AUTH_ACCEPTOR };

/* How data frames are protected (the wire_protection option). */
enum obd_wire {
    OBD_WIRE_NONE,      /* data frames as they are: zero-copy */
    OBD_WIRE_INTEGRITY, /* a tag over header and payload */
    OBD_WIRE_ENCRYPT,   /* payload encrypted, tag over header and it */
};

/* Returns the mode named by text ("none", "integrity", "encrypt"), or -1. */
int obd_auth_wire_parse(const char *text);

/* Initialises libsodium; 0 or OBD_E_SYS. Call once before anything below. */
int obd_auth_init(void);

/* Reads the cluster key from `path`. A relative path is a systemd
 * credential, looked up in $CREDENTIALS_DIRECTORY (LoadCredential=), and
 * refused when that is not set. The file must be a regular file of
 * OBD_AUTH_KEY_MIN..OBD_AUTH_KEY_MAX bytes, owned by this process's
 * effective uid or root, that neither group nor others may read or write;
 * its whole content is the key, hashed into key[]. Both the start and
 * --check-config call this, so they refuse the same files. On failure
 * returns OBD_E_INVAL with the reason and the fix in err; key is written only
 * on success. */
int obd_auth_key_load(const char *path, uint8_t key[OBD_AUTH_KEY], char *err,
                      size_t errlen);

/* Fresh random bytes (handshake nonces). */
void obd_auth_random(void *buf, size_t len);

/* T from both Hellos as they travelled (packed PeerMsg bytes). */
void obd_auth_transcript(const uint8_t *hello_d, size_t dlen,
                         const uint8_t *hello_a, size_t alen,
                         uint8_t t[OBD_AUTH_TRANSCRIPT]);

void obd_auth_proof(const uint8_t key[OBD_AUTH_KEY], enum obd_auth_role role,
                    const uint8_t t[OBD_AUTH_TRANSCRIPT],
                    uint8_t proof[OBD_AUTH_PROOF]);

/* 0 when `proof` (of len bytes) is role's proof for t, in constant time;
 * OBD_E_PROTO otherwise. */
int obd_auth_proof_check(const uint8_t key[OBD_AUTH_KEY],
                         enum obd_auth_role role,
                         const uint8_t t[OBD_AUTH_TRANSCRIPT],
                         const uint8_t *proof, size_t len);

/* The session's keys: d2a protects what the dialer sends, a2d the rest. */
void obd_auth_session(const uint8_t key[OBD_AUTH_KEY],
                      const uint8_t t[OBD_AUTH_TRANSCRIPT],
                      uint8_t d2a[OBD_AUTH_KEY], uint8_t a2d[OBD_AUTH_KEY]);

/* An incremental frame tag. Opaque; aligned as libsodium wants it. */
struct obd_auth_mac {
    _Alignas(16) unsigned char state[256];
    uint64_t adlen; /* header, plus the payload when it is not encrypted */
    uint64_t clen;  /* encrypted payload */
    int encrypted;
};

/* Starts the tag of the frame numbered `counter` with header hdr (hlen
 * bytes); `encrypted`: the payload that follows is ciphertext. */
void obd_auth_mac_begin(struct obd_auth_mac *m, const uint8_t key[OBD_AUTH_KEY],
                        uint64_t counter, const uint8_t *hdr, size_t hlen,
                        int encrypted);
/* Feeds payload bytes, as sent or received (ciphertext when encrypted). */
void obd_auth_mac_update(struct obd_auth_mac *m, const void *p, size_t len);
void obd_auth_mac_final(struct obd_auth_mac *m, uint8_t tag[OBD_AUTH_TAG]);
/* Finishes and compares with tag in constant time: 0 when equal,
 * OBD_E_PROTO otherwise. */
int obd_auth_mac_check(struct obd_auth_mac *m, const uint8_t tag[OBD_AUTH_TAG]);

/* Encrypts len bytes of `in` into `out` (may be in == out) for frame
 * `counter` with header hdr as additional data, and writes the tag. */
void obd_auth_encrypt(const uint8_t key[OBD_AUTH_KEY], uint64_t counter,
                      const uint8_t *hdr, size_t hlen, const void *in,
                      size_t len, void *out, uint8_t tag[OBD_AUTH_TAG]);
/* Decrypts in place a payload whose tag has been checked. */
void obd_auth_decrypt(const uint8_t key[OBD_AUTH_KEY], uint64_t counter,
                      void *buf, size_t len);

#endif
