/* auth.c without sockets: the incremental frame tags equal libsodium's
 * ChaCha20-Poly1305 (IETF) AEAD, proofs bind key, role and transcript, and
 * key files are refused when short, long, not regular or readable by
 * others. */
#include <check.h>

#include "ck_run.h"
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth.h"
#include "err.h"

static uint8_t key[OBD_AUTH_KEY];
static uint8_t hdr[48];

static void setup(void)
{
    ck_assert_int_eq(obd_auth_init(), 0);
    for (int i = 0; i < OBD_AUTH_KEY; i++)
        key[i] = (uint8_t)(i * 7 + 1);
    for (int i = 0; i < 48; i++)
        hdr[i] = (uint8_t)(200 - i);
}

static void nonce_of(uint64_t ctr, uint8_t n[12])
{
    memset(n, 0, 12);
    for (int i = 0; i < 8; i++)
        n[i] = (uint8_t)(ctr >> (8 * i));
}

/* Feeds p in pieces of awkward sizes, as TCP reads deliver them. */
static void feed(struct obd_auth_mac *m, const uint8_t *p, size_t len)
{
    size_t steps[] = {1, 7, 16, 33, 64, 1000, 4095};
    size_t off = 0, k = 0;
    while (off < len) {
        size_t n = steps[k++ % 7];
        if (n > len - off)
            n = len - off;
        obd_auth_mac_update(m, p + off, n);
        off += n;
    }
}

START_TEST(integrity_tag_is_the_aead_tag)
{
    size_t lens[] = {0, 1, 15, 16, 17, 1000, 65536 + 3};
    size_t len = lens[_i];
    uint8_t *ad = malloc(48 + len);
    memcpy(ad, hdr, 48);
    for (size_t i = 0; i < len; i++)
        ad[48 + i] = (uint8_t)(i * 31);
    uint8_t n[12], want[16], got[16];
    nonce_of(5 + _i, n);
    uint8_t none[1] = {0};
    crypto_aead_chacha20poly1305_ietf_encrypt_detached(
        none, want, NULL, none, 0, ad, 48 + len, NULL, n, key);

    struct obd_auth_mac m;
    obd_auth_mac_begin(&m, key, 5 + _i, hdr, 48, 0);
    feed(&m, ad + 48, len);
    obd_auth_mac_final(&m, got);
    ck_assert_mem_eq(got, want, 16);

    /* One flipped bit anywhere fails the check. */
    obd_auth_mac_begin(&m, key, 5 + _i, hdr, 48, 0);
    feed(&m, ad + 48, len);
    ck_assert_int_eq(obd_auth_mac_check(&m, want), 0);
    if (len > 0) {
        ad[48 + len / 2] ^= 4;
        obd_auth_mac_begin(&m, key, 5 + _i, hdr, 48, 0);
        feed(&m, ad + 48, len);
        ck_assert_int_ne(obd_auth_mac_check(&m, want), 0);
    }
    /* Another counter (a replayed or reordered frame) fails too. */
    obd_auth_mac_begin(&m, key, 6 + _i, hdr, 48, 0);
    feed(&m, ad + 48, len);
    ck_assert_int_ne(obd_auth_mac_check(&m, want), 0);
    free(ad);
}
END_TEST

START_TEST(encrypted_frames_round_trip)
{
    size_t lens[] = {0, 1, 15, 16, 17, 1000, 65536 + 3};
    size_t len = lens[_i];
    uint8_t *plain = malloc(len + 1), *buf = malloc(len + 1);
    uint8_t *lib = malloc(len + 1);
    for (size_t i = 0; i < len; i++)
        plain[i] = (uint8_t)(i * 13 + 5);
    uint8_t n[12], want[16], tag[16];
    nonce_of(9, n);
    crypto_aead_chacha20poly1305_ietf_encrypt_detached(
        lib, want, NULL, plain, len, hdr, 48, NULL, n, key);

    /* In place, as the sender's buffer would allow. */
    memcpy(buf, plain, len);
    obd_auth_encrypt(key, 9, hdr, 48, buf, len, buf, tag);
    ck_assert_mem_eq(tag, want, 16);
    if (len)
        ck_assert_mem_eq(buf, lib, len);

    /* The receiver: tag over the ciphertext as it arrives, then decrypt
     * in place. */
    struct obd_auth_mac m;
    obd_auth_mac_begin(&m, key, 9, hdr, 48, 1);
    feed(&m, buf, len);
    ck_assert_int_eq(obd_auth_mac_check(&m, tag), 0);
    obd_auth_decrypt(key, 9, buf, len);
    if (len) {
        ck_assert_mem_eq(buf, plain, len);
        ck_assert(len < 16 || memcmp(lib, plain, len) != 0);
    }

    /* A changed header fails. */
    hdr[40] ^= 1;
    obd_auth_mac_begin(&m, key, 9, hdr, 48, 1);
    feed(&m, lib, len);
    ck_assert_int_ne(obd_auth_mac_check(&m, tag), 0);
    hdr[40] ^= 1;
    free(plain);
    free(buf);
    free(lib);
}
END_TEST

START_TEST(proofs_bind_key_role_and_transcript)
{
    const uint8_t hd[] = "hello from the dialer";
    const uint8_t ha[] = "hello from the acceptor";
    uint8_t t[32], t2[32], p[32], other[OBD_AUTH_KEY];
    obd_auth_transcript(hd, sizeof(hd), ha, sizeof(ha), t);
    /* Moving a byte from one Hello to the other changes T. */
    obd_auth_transcript(hd, sizeof(hd) - 1, ha, sizeof(ha), t2);
    ck_assert(memcmp(t, t2, 32) != 0);

    obd_auth_proof(key, OBD_AUTH_DIALER, t, p);
    ck_assert_int_eq(obd_auth_proof_check(key, OBD_AUTH_DIALER, t, p, 32), 0);
    ck_assert_int_ne(obd_auth_proof_check(key, OBD_AUTH_ACCEPTOR, t, p, 32), 0);
    ck_assert_int_ne(obd_auth_proof_check(key, OBD_AUTH_DIALER, t2, p, 32), 0);
    ck_assert_int_ne(obd_auth_proof_check(key, OBD_AUTH_DIALER, t, p, 31), 0);
    ck_assert_int_ne(obd_auth_proof_check(key, OBD_AUTH_DIALER, t, NULL, 0), 0);
    memcpy(other, key, sizeof(other));
    other[3] ^= 0x80;
    ck_assert_int_ne(obd_auth_proof_check(other, OBD_AUTH_DIALER, t, p, 32), 0);

    uint8_t d2a[32], a2d[32];
    obd_auth_session(key, t, d2a, a2d);
    ck_assert(memcmp(d2a, a2d, 32) != 0);
    ck_assert(memcmp(d2a, key, 32) != 0);
}
END_TEST

static char dir[64];

static void write_key(const char *name, size_t len, mode_t mode)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    for (size_t i = 0; i < len; i++)
        ck_assert_int_eq(write(fd, &(char){(char)('a' + i % 26)}, 1), 1);
    close(fd);
    ck_assert_int_eq(chmod(path, mode), 0);
}

START_TEST(key_files_are_checked)
{
    char err[512], path[128];
    uint8_t k1[32], k2[32];
    snprintf(dir, sizeof(dir), "/tmp/obcomm-auth-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));

    write_key("short", 31, 0600);
    snprintf(path, sizeof(path), "%s/short", dir);
    ck_assert_int_eq(obd_auth_key_load(path, k1, err, sizeof(err)),
                     OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "31 bytes; a key is 32 to 4096 bytes"));

    write_key("long", OBD_AUTH_KEY_MAX + 1, 0600);
    snprintf(path, sizeof(path), "%s/long", dir);
    ck_assert_int_eq(obd_auth_key_load(path, k1, err, sizeof(err)),
                     OBD_E_INVAL);

    write_key("open", 32, 0640);
    snprintf(path, sizeof(path), "%s/open", dir);
    ck_assert_int_eq(obd_auth_key_load(path, k1, err, sizeof(err)),
                     OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "mode 0640"));
    ck_assert_ptr_nonnull(strstr(err, "chmod 600"));

    write_key("world", 32, 0604);
    snprintf(path, sizeof(path), "%s/world", dir);
    ck_assert_int_eq(obd_auth_key_load(path, k1, err, sizeof(err)),
                     OBD_E_INVAL);

    snprintf(path, sizeof(path), "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(obd_auth_key_load(path, k1, err, sizeof(err)),
                     OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "not a regular file"));

    write_key("good", 32, 0600);
    write_key("same", 32, 0400);
    write_key("other", 33, 0600);
    snprintf(path, sizeof(path), "%s/good", dir);
    ck_assert_int_eq(obd_auth_key_load(path, k1, err, sizeof(err)), 0);
    /* A relative name is looked up in systemd's credentials directory. */
    setenv("CREDENTIALS_DIRECTORY", dir, 1);
    ck_assert_int_eq(obd_auth_key_load("same", k2, err, sizeof(err)), 0);
    ck_assert_mem_eq(k1, k2, 32);
    ck_assert_int_eq(obd_auth_key_load("other", k2, err, sizeof(err)), 0);
    ck_assert(memcmp(k1, k2, 32) != 0);
    unsetenv("CREDENTIALS_DIRECTORY");

    const char *names[] = {"short", "long", "open", "world",
                           "fifo",  "good", "same", "other"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}
END_TEST

START_TEST(wire_modes_parse)
{
    ck_assert_int_eq(obd_auth_wire_parse("none"), OBD_WIRE_NONE);
    ck_assert_int_eq(obd_auth_wire_parse("integrity"), OBD_WIRE_INTEGRITY);
    ck_assert_int_eq(obd_auth_wire_parse("encrypt"), OBD_WIRE_ENCRYPT);
    ck_assert_int_eq(obd_auth_wire_parse("tls"), -1);
}
END_TEST

Suite *auth_suite(void)
{
    Suite *s = suite_create("auth");
    TCase *tc = tcase_create("auth");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_loop_test(tc, integrity_tag_is_the_aead_tag, 0, 7);
    tcase_add_loop_test(tc, encrypted_frames_round_trip, 0, 7);
    tcase_add_test(tc, proofs_bind_key_role_and_transcript);
    tcase_add_test(tc, key_files_are_checked);
    tcase_add_test(tc, wire_modes_parse);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return ck_run(auth_suite());
}
