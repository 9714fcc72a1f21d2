/* Frame headers and ring arithmetic: pure functions. */
#include <check.h>

#include "ck_run.h"
#include <string.h>

#include "frame.h"
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

    ck_assert_int_eq(obd_frame_decode(buf, 1024, 4095, &g, &why), -1);
    ck_assert_str_eq(why, "data payload longer than a segment");
    buf[0] ^= 1;
    ck_assert_int_eq(obd_frame_decode(buf, 1024, 4096, &g, &why), -1);
    ck_assert_str_eq(why, "bad magic");
    buf[0] ^= 1;
    buf[5] = 9;
    ck_assert_int_eq(obd_frame_decode(buf, 1024, 4096, &g, &why), -1);
    ck_assert_str_eq(why, "unknown frame type");
    buf[5] = OBD_FRAME_CTRL;
    ck_assert_int_eq(obd_frame_decode(buf, 1024, 4096, &g, &why), -1);
    ck_assert_str_eq(why, "control payload length out of bounds");
    buf[5] = OBD_FRAME_DATA;
    buf[47] = 1;
    ck_assert_int_eq(obd_frame_decode(buf, 1024, 4096, &g, &why), -1);
    ck_assert_str_eq(why, "reserved header bytes are not zero");
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
    tcase_add_test(tc, ring_schedule_is_consistent);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
