/* Frame headers, the hashes they carry, and ring arithmetic: pure
 * functions. */
/* coll.h before check.h: Check's fail() macro would rename the member
 * fail of coll.h's struct obd_opsvc. */
#include "coll.h"

#include <check.h>

#include "ck_run.h"
#include <string.h>

#include "config.h"
#include "efstate.h"
#include "frame.h"
#include "hash.h"
#include "job.h"
#include "ring.h"
#include "wire.h"

START_TEST(frame_round_trip_and_bounds)
{
    struct obd_frame f = {.version = OBCOMM_PROTO_VERSION,
                          .type = OBD_FRAME_DATA,
                          .job = 0xdeadbeef,
                          .epoch = 7,
                          .seq = 0x0102030405060708ull,
                          .fingerprint = 0xfedcba9876543210ull,
                          .step = 5,
                          .segment = 9,
                          .len = 4096};
    uint8_t buf[OBD_FRAME_HDR];
    obd_frame_encode(&f, buf);
    ck_assert_int_eq(buf[0], 'O');
    ck_assert_int_eq(buf[3], 'M');
    ck_assert_int_eq(buf[16], 0x08); /* little-endian seq */

    struct obd_frame g;
    const char *why = NULL;
    ck_assert_int_eq(obd_frame_decode(buf, 1024, 4096, &g, &why), 0);
    ck_assert_int_eq(g.type, f.type);
    ck_assert_uint_eq(g.job, f.job);
    ck_assert_uint_eq(g.epoch, f.epoch);
    ck_assert_uint_eq(g.seq, f.seq);
    ck_assert_uint_eq(g.fingerprint, f.fingerprint);
    ck_assert_uint_eq(g.step, f.step);
    ck_assert_uint_eq(g.segment, f.segment);
    ck_assert_uint_eq(g.len, f.len);

    ck_assert_int_eq(obd_frame_decode(buf, 1024, 4095, &g, &why), OBD_E_PROTO);
    ck_assert_str_eq(why, "data payload longer than a segment");
    buf[0] ^= 1;
    ck_assert_int_eq(obd_frame_decode(buf, 1024, 4096, &g, &why), OBD_E_PROTO);
    ck_assert_str_eq(why, "bad magic");
    buf[0] ^= 1;
    buf[5] = 9;
    ck_assert_int_eq(obd_frame_decode(buf, 1024, 4096, &g, &why), OBD_E_PROTO);
    ck_assert_str_eq(why, "unknown frame type");
    buf[5] = OBD_FRAME_CTRL;
    ck_assert_int_eq(obd_frame_decode(buf, 1024, 4096, &g, &why), OBD_E_PROTO);
    ck_assert_str_eq(why, "control payload length out of bounds");
    buf[5] = OBD_FRAME_DATA;
    buf[47] = 1;
    ck_assert_int_eq(obd_frame_decode(buf, 1024, 4096, &g, &why), OBD_E_PROTO);
    ck_assert_str_eq(why, "reserved header bytes are not zero");
    buf[47] = 0;
    buf[4] = OBCOMM_PROTO_VERSION + 1;
    ck_assert_int_eq(obd_frame_decode(buf, 1024, 4096, &g, &why),
                     OBD_E_VERSION);
    ck_assert_str_eq(why, "unsupported frame version");
}
END_TEST

/* FNV-1a (proto/hash.h) against the published test vectors, and the
 * values built on it that nodes compare or files carry in their names:
 * the job id and the op fingerprint of every frame header, the world's
 * fingerprint in Hello, an efstate file's name. They are fixed for good;
 * a change here splits a cluster of old and new daemons. */
START_TEST(hashes_are_fixed)
{
    uint64_t h = OBCOMM_HASH_FNV1A_INIT;
    ck_assert_uint_eq(obcomm_hash_fnv1a(h, "", 0),
                      UINT64_C(0xcbf29ce484222325));
    ck_assert_uint_eq(obcomm_hash_fnv1a(h, "a", 1),
                      UINT64_C(0xaf63dc4c8601ec8c));
    ck_assert_uint_eq(obcomm_hash_fnv1a_str(h, "foobar"),
                      UINT64_C(0x85944171f73967e8));
    ck_assert_uint_eq(obcomm_hash_fnv1a_u64(h, UINT64_C(0x0102030405060708)),
                      UINT64_C(0x0c6d4496e17859d5));
    ck_assert_uint_eq(obcomm_hash_fnv1a_word(h, 0x1111),
                      (h ^ 0x1111) * OBCOMM_HASH_FNV1A_PRIME);

    ck_assert_uint_eq(obd_frame_job_id(""), 0x4fd0bfc1);
    ck_assert_uint_eq(obd_frame_job_id("j"), 0x29621871);
    ck_assert_uint_eq(obd_frame_job_id("torture-1-2"), 0xc1a18f25);
    struct obd_opdesc a = {4, 1, 0, 1000003, 77, -1};
    struct obd_opdesc b = {2, 0, 3, 12, 0, 5};
    ck_assert_uint_eq(obd_coll_fingerprint(&a), UINT64_C(0x01ea7275d6eb062b));
    ck_assert_uint_eq(obd_coll_fingerprint(&b), UINT64_C(0x580b58f90899230d));

    char path[128];
    obd_ef_path("/d", "job/with slash", 42, path, sizeof(path));
    ck_assert_str_eq(path, "/d/ef-86d52485ba7f2fa8-000000000000002a.lz4");

    struct obd_config c;
    char err[512];
    int check = 0, help = 0;
    char *argv[] = {"obcommd",
                    "--cluster",
                    "prod",
                    "--peers",
                    "10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7001",
                    "--rank",
                    "1",
                    NULL};
    obd_config_defaults(&c);
    ck_assert_int_eq(
        obd_config_parse_args(&c, 7, argv, &check, &help, err, sizeof(err)), 0);
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    ck_assert_uint_eq(c.fingerprint, UINT64_C(0x47ca030d9c513241));
}
END_TEST

/* For every world size and count: chunks tile the tensor, the chunk a node
 * receives at step s is the one it sends at s+1, and after the
 * reduce-scatter every chunk has passed through every node exactly once. */
START_TEST(ring_schedule_is_consistent)
{
    static const size_t counts[] = {0, 1, 3, 7, 8, 1000003};
    for (int n = 1; n <= 16; n++)
        for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
            size_t prev_end = 0;
            for (int c = 0; c < n; c++) {
                size_t b, e;
                obd_ring_chunk(counts[k], n, c, &b, &e);
                ck_assert_uint_eq(b, prev_end);
                ck_assert_uint_le(e - b, counts[k] / (size_t)n + 1);
                prev_end = e;
            }
            ck_assert_uint_eq(prev_end, counts[k]);
        }
    for (int n = 2; n <= 16; n++)
        for (int r = 0; r < n; r++) {
            for (int s = 0; s + 1 < 2 * (n - 1); s++)
                ck_assert_int_eq(obd_ring_recv_chunk(r, n, s),
                                 obd_ring_send_chunk(r, n, s + 1));
            /* What r receives at step s, its left neighbour sends. */
            for (int s = 0; s < 2 * (n - 1); s++)
                ck_assert_int_eq(obd_ring_recv_chunk(r, n, s),
                                 obd_ring_send_chunk((r + n - 1) % n, n, s));
            ck_assert_int_eq(obd_ring_recv_chunk(r, n, n - 2), (r + 1) % n);
        }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("frame");
    TCase *tc = tcase_create("frame");
    tcase_add_test(tc, frame_round_trip_and_bounds);
    tcase_add_test(tc, hashes_are_fixed);
    tcase_add_test(tc, ring_schedule_is_consistent);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
