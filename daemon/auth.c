#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"

_Static_assert(sizeof(crypto_onetimeauth_poly1305_state) <=
                   sizeof(((struct obd_auth_mac *)0)->state),
               "obd_auth_mac too small for libsodium's poly1305 state");

static const char *const wire_names[] = {"none", "integrity", "encrypt"};

int obd_auth_wire_parse(const char *text)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(text, wire_names[i]) == 0)
            return i;
    return -1;
}

int obd_auth_init(void)
{
    return sodium_init() < 0 ? OBD_E_SYS : 0;
}

int obd_auth_key_load(const char *path, uint8_t key[OBD_AUTH_KEY], char *err,
                      size_t errlen)
{
    char full[PATH_MAX];
    const char *creds = getenv("CREDENTIALS_DIRECTORY");
    int credential = path[0] != '/';
    if (credential && (creds == NULL || creds[0] == '\0')) {
        /* A relative name means a systemd credential: read from the
         * current directory it would be a different file in every shell
         * the daemon is started from. */
        snprintf(err, errlen,
                 "auth_key_file %s: a relative name is a systemd credential, "
                 "but $CREDENTIALS_DIRECTORY is not set (run under the unit, "
                 "whose LoadCredential= provides it, or give an absolute "
                 "path)",
                 path);
        return OBD_E_INVAL;
    }
    if (credential)
        snprintf(full, sizeof(full), "%s/%s", creds, path);
    else
        snprintf(full, sizeof(full), "%s", path);

    /* O_NONBLOCK: a FIFO planted under the name cannot block the start. */
    int fd = open(full, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        if (credential && errno == ENOENT)
            snprintf(err, errlen,
                     "auth_key_file %s: no such credential (the unit's "
                     "LoadCredential=%s finds the key in "
                     "/etc/credstore/%s; install it there with install -m "
                     "600 -o root)",
                     full, path, path);
        else
            snprintf(err, errlen, "auth_key_file %s: %s", full,
                     strerror(errno));
        return OBD_E_INVAL;
    }
    struct stat st;
    uint8_t buf[OBD_AUTH_KEY_MAX + 1];
    ssize_t n = 0;
    int rc = OBD_E_INVAL;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "auth_key_file %s: %s", full, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "auth_key_file %s: not a regular file", full);
        goto out;
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        snprintf(err, errlen,
                 "auth_key_file %s: mode %04o lets group or others at the "
                 "key; run chmod 600 %s",
                 full, (unsigned)(st.st_mode & 07777), full);
        goto out;
    }
    /* Whoever owns the file can change the key: only this daemon's user
     * and root may (as ssh asks of its keys). */
    if (st.st_uid != geteuid() && st.st_uid != 0) {
        snprintf(err, errlen,
                 "auth_key_file %s: belongs to uid %u, not to this daemon's "
                 "uid %u or root; run chown root %s",
                 full, (unsigned)st.st_uid, (unsigned)geteuid(), full);
        goto out;
    }
    while ((size_t)n < sizeof(buf)) {
        ssize_t r = read(fd, buf + n, sizeof(buf) - (size_t)n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            snprintf(err, errlen, "auth_key_file %s: %s", full,
                     strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        n += r;
    }
    if (n < OBD_AUTH_KEY_MIN || n > OBD_AUTH_KEY_MAX) {
        snprintf(err, errlen,
                 "auth_key_file %s: %zd bytes; a key is %d to %d bytes "
                 "(head -c 32 /dev/urandom > %s makes one)",
                 full, n, OBD_AUTH_KEY_MIN, OBD_AUTH_KEY_MAX, full);
        goto out;
    }
    static const char label[] = "obcomm cluster key v1";
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, OBD_AUTH_KEY);
    crypto_generichash_update(&h, (const uint8_t *)label, sizeof(label));
    crypto_generichash_update(&h, buf, (size_t)n);
    crypto_generichash_final(&h, key, OBD_AUTH_KEY);
    sodium_memzero(&h, sizeof(h));
    rc = 0;
out:
    sodium_memzero(buf, sizeof(buf));
    close(fd);
    return rc;
}

void obd_auth_random(void *buf, size_t len)
{
    randombytes_buf(buf, len);
}

static void put_len(crypto_generichash_state *h, uint64_t v)
{
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(v >> (8 * i));
    crypto_generichash_update(h, le, sizeof(le));
}

void obd_auth_transcript(const uint8_t *hello_d, size_t dlen,
                         const uint8_t *hello_a, size_t alen,
                         uint8_t t[OBD_AUTH_TRANSCRIPT])
{
    static const char label[] = "obcomm handshake v1";
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, OBD_AUTH_TRANSCRIPT);
    crypto_generichash_update(&h, (const uint8_t *)label, sizeof(label));
    put_len(&h, dlen);
    crypto_generichash_update(&h, hello_d, dlen);
    put_len(&h, alen);
    crypto_generichash_update(&h, hello_a, alen);
    crypto_generichash_final(&h, t, OBD_AUTH_TRANSCRIPT);
}

/* BLAKE2b keyed with the cluster key over a label and T. */
static void keyed(const uint8_t key[OBD_AUTH_KEY], const char *label,
                  const uint8_t t[OBD_AUTH_TRANSCRIPT], uint8_t *out,
                  size_t outlen)
{
    crypto_generichash_state h;
    crypto_generichash_init(&h, key, OBD_AUTH_KEY, outlen);
    crypto_generichash_update(&h, (const uint8_t *)label, strlen(label) + 1);
    crypto_generichash_update(&h, t, OBD_AUTH_TRANSCRIPT);
    crypto_generichash_final(&h, out, outlen);
    sodium_memzero(&h, sizeof(h));
}

void obd_auth_proof(const uint8_t key[OBD_AUTH_KEY], enum obd_auth_role role,
                    const uint8_t t[OBD_AUTH_TRANSCRIPT],
                    uint8_t proof[OBD_AUTH_PROOF])
{
    keyed(key,
          role == OBD_AUTH_DIALER ? "obcomm proof dialer"
                                  : "obcomm proof acceptor",
          t, proof, OBD_AUTH_PROOF);
}

int obd_auth_proof_check(const uint8_t key[OBD_AUTH_KEY],
                         enum obd_auth_role role,
                         const uint8_t t[OBD_AUTH_TRANSCRIPT],
                         const uint8_t *proof, size_t len)
{
    uint8_t want[OBD_AUTH_PROOF];
    if (len != OBD_AUTH_PROOF)
        return OBD_E_PROTO;
    obd_auth_proof(key, role, t, want);
    int rc = crypto_verify_32(want, proof) == 0 ? 0 : OBD_E_PROTO;
    sodium_memzero(want, sizeof(want));
    return rc;
}

void obd_auth_session(const uint8_t key[OBD_AUTH_KEY],
                      const uint8_t t[OBD_AUTH_TRANSCRIPT],
                      uint8_t d2a[OBD_AUTH_KEY], uint8_t a2d[OBD_AUTH_KEY])
{
    uint8_t both[2 * OBD_AUTH_KEY];
    keyed(key, "obcomm session keys", t, both, sizeof(both));
    memcpy(d2a, both, OBD_AUTH_KEY);
    memcpy(a2d, both + OBD_AUTH_KEY, OBD_AUTH_KEY);
    sodium_memzero(both, sizeof(both));
}

/* The frame's 96-bit nonce: its counter, little-endian, then zeros. */
static void frame_nonce(uint64_t counter,
                        uint8_t n[crypto_aead_chacha20poly1305_IETF_NPUBBYTES])
{
    memset(n, 0, crypto_aead_chacha20poly1305_IETF_NPUBBYTES);
    for (int i = 0; i < 8; i++)
        n[i] = (uint8_t)(counter >> (8 * i));
}

static crypto_onetimeauth_poly1305_state *st(struct obd_auth_mac *m)
{
    return (crypto_onetimeauth_poly1305_state *)m->state;
}

/* What crypto_aead_chacha20poly1305_ietf_encrypt_detached does, in
 * pieces: Poly1305 keyed by ChaCha20 block 0 over ad, pad, ciphertext,
 * pad, both lengths. */
void obd_auth_mac_begin(struct obd_auth_mac *m, const uint8_t key[OBD_AUTH_KEY],
                        uint64_t counter, const uint8_t *hdr, size_t hlen,
                        int encrypted)
{
    uint8_t nonce[crypto_aead_chacha20poly1305_IETF_NPUBBYTES];
    uint8_t block0[64];
    frame_nonce(counter, nonce);
    crypto_stream_chacha20_ietf(block0, sizeof(block0), nonce, key);
    crypto_onetimeauth_poly1305_init(st(m), block0);
    sodium_memzero(block0, sizeof(block0));
    crypto_onetimeauth_poly1305_update(st(m), hdr, hlen);
    m->adlen = hlen;
    m->clen = 0;
    m->encrypted = encrypted;
    if (encrypted) {
        static const uint8_t zero[16];
        crypto_onetimeauth_poly1305_update(st(m), zero, (16 - hlen) & 15);
    }
}

void obd_auth_mac_update(struct obd_auth_mac *m, const void *p, size_t len)
{
    crypto_onetimeauth_poly1305_update(st(m), p, len);
    if (m->encrypted)
        m->clen += len;
    else
        m->adlen += len;
}

void obd_auth_mac_final(struct obd_auth_mac *m, uint8_t tag[OBD_AUTH_TAG])
{
    static const uint8_t zero[16];
    uint8_t lens[16];
    if (!m->encrypted)
        crypto_onetimeauth_poly1305_update(st(m), zero, (16 - m->adlen) & 15);
    else
        crypto_onetimeauth_poly1305_update(st(m), zero, (16 - m->clen) & 15);
    for (int i = 0; i < 8; i++) {
        lens[i] = (uint8_t)(m->adlen >> (8 * i));
        lens[8 + i] = (uint8_t)(m->clen >> (8 * i));
    }
    crypto_onetimeauth_poly1305_update(st(m), lens, sizeof(lens));
    crypto_onetimeauth_poly1305_final(st(m), tag);
    sodium_memzero(m->state, sizeof(m->state));
}

int obd_auth_mac_check(struct obd_auth_mac *m, const uint8_t tag[OBD_AUTH_TAG])
{
    uint8_t want[OBD_AUTH_TAG];
    obd_auth_mac_final(m, want);
    return crypto_verify_16(want, tag) == 0 ? 0 : OBD_E_PROTO;
}

void obd_auth_encrypt(const uint8_t key[OBD_AUTH_KEY], uint64_t counter,
                      const uint8_t *hdr, size_t hlen, const void *in,
                      size_t len, void *out, uint8_t tag[OBD_AUTH_TAG])
{
    uint8_t nonce[crypto_aead_chacha20poly1305_IETF_NPUBBYTES];
    frame_nonce(counter, nonce);
    crypto_aead_chacha20poly1305_ietf_encrypt_detached(
        out, tag, NULL, in, len, hdr, hlen, NULL, nonce, key);
}

void obd_auth_decrypt(const uint8_t key[OBD_AUTH_KEY], uint64_t counter,
                      void *buf, size_t len)
{
    uint8_t nonce[crypto_aead_chacha20poly1305_IETF_NPUBBYTES];
    frame_nonce(counter, nonce);
    crypto_stream_chacha20_ietf_xor_ic(buf, buf, len, nonce, 1, key);
}
