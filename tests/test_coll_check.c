/* Each algorithm's row checks its own arguments (struct obd_algo,
 * normalize, check and check_buffers in daemon/coll.h): every op kind a
 * trainer may submit has a row with a check, and each check gives the
 * exact buffer sizes, or OBD_E_INVAL with the exact text that ctl.c
 * prefixes with the rank and every rank of the op then sees. */
#include "coll.h" /* before check.h, whose fail() macro clashes */
#include "err.h"
#include "ops.h"

#include <check.h>

#include "ck_run.h"
#include <obcomm.h>
#include <stdint.h>
#include <string.h>

/* Normalizes d as ctl.c does and checks it in a job of `world` ranks. */
static int submit(struct obd_opdesc *d, int world, uint64_t *bytes,
                  uint64_t *out_bytes, char *why, size_t len)
{
    const struct obd_algo *a = obd_coll_algo(d->kind);
    ck_assert_ptr_nonnull(a);
    if (a->normalize != NULL)
        a->normalize(d);
    why[0] = '\0';
    return a->check(d, world, bytes, out_bytes, why, len);
}

/* A refused submission: OBD_E_INVAL with exactly `text`. */
static void refused(struct obd_opdesc d, int world, const char *text)
{
    char why[256];
    uint64_t bytes = 7, out_bytes = 7;
    ck_assert_int_eq(submit(&d, world, &bytes, &out_bytes, why, sizeof(why)),
                     OBD_E_INVAL);
    ck_assert_str_eq(why, text);
    ck_assert_uint_eq(bytes, 7); /* out-parameters only on success */
    ck_assert_uint_eq(out_bytes, 7);
}

/* An accepted one: its data and result buffers have these sizes. */
static void accepted(struct obd_opdesc *d, int world, uint64_t bytes,
                     uint64_t out_bytes)
{
    char why[256];
    uint64_t b = 7, o = 7;
    ck_assert_int_eq(submit(d, world, &b, &o, why, sizeof(why)), 0);
    ck_assert_uint_eq(b, bytes);
    ck_assert_uint_eq(o, out_bytes);
}

START_TEST(every_kind_has_a_row_with_a_check)
{
    for (uint32_t k = OBCOMM_KIND_ALLREDUCE; k <= OBCOMM_KIND_REDUCE_SCATTER;
         k++) {
        const struct obd_algo *a = obd_coll_algo(k);
        ck_assert_ptr_nonnull(a);
        ck_assert_uint_eq(a->kind, k);
        ck_assert_ptr_nonnull(a->check);
    }
    ck_assert_ptr_null(obd_coll_algo(0));
    ck_assert_ptr_null(obd_coll_algo(OBCOMM_KIND_REDUCE_SCATTER + 1));
}
END_TEST

START_TEST(typed_collectives)
{
    uint32_t ar = OBCOMM_KIND_ALLREDUCE, rs = OBCOMM_KIND_REDUCE_SCATTER;
    uint32_t ag = OBCOMM_KIND_ALLGATHER;
    struct obd_opdesc d = {
        .kind = ar, .dtype = OBCOMM_FLOAT16, .redop = OBCOMM_SUM, .count = 11};
    accepted(&d, 6, 22, 0);
    d = (struct obd_opdesc){
        .kind = rs, .dtype = OBCOMM_FLOAT32, .redop = OBCOMM_MAX, .count = 5};
    accepted(&d, 3, 60, 20);
    /* An allgather reduces nothing: its redop is neither checked nor
     * compared (it becomes 0). */
    d = (struct obd_opdesc){
        .kind = ag, .dtype = OBCOMM_FLOAT64, .redop = 99, .count = 3, .key = 4};
    accepted(&d, 4, 24, 96);
    ck_assert_uint_eq(d.redop, 0);
    ck_assert_uint_eq(d.key, 4);

    refused((struct obd_opdesc){.kind = ar, .dtype = 77, .count = 1}, 2,
            "unknown dtype 77");
    refused(
        (struct obd_opdesc){
            .kind = rs, .dtype = OBCOMM_FLOAT32, .redop = 55, .count = 1},
        2, "unknown reduction 55");
    refused((struct obd_opdesc){.kind = ar,
                                .dtype = OBCOMM_FLOAT32,
                                .redop = OBCOMM_SUM},
            2, "allreduce of 0 elements");
    refused((struct obd_opdesc){.kind = ag, .dtype = OBCOMM_FLOAT32}, 2,
            "allgather of 0 elements");
    /* world * count elements of 4 bytes must fit in 64 bits. */
    uint64_t most = UINT64_MAX / 3 / 4;
    d = (struct obd_opdesc){.kind = rs,
                            .dtype = OBCOMM_FLOAT32,
                            .redop = OBCOMM_SUM,
                            .count = most};
    accepted(&d, 3, most * 12, most * 4);
    refused((struct obd_opdesc){.kind = rs,
                                .dtype = OBCOMM_FLOAT32,
                                .redop = OBCOMM_SUM,
                                .count = most + 1},
            3, "reduce-scatter of 1537228672809129302 elements overflows");
}
END_TEST

START_TEST(broadcast_and_barrier)
{
    uint32_t bc = OBCOMM_KIND_BROADCAST;
    /* Bytes: the dtype and the reduction become 0, the root stays. */
    struct obd_opdesc d = {.kind = bc,
                           .dtype = OBCOMM_FLOAT32,
                           .redop = OBCOMM_SUM,
                           .count = 9,
                           .root = 5};
    accepted(&d, 6, 9, 0);
    ck_assert_uint_eq(d.dtype, 0);
    ck_assert_uint_eq(d.redop, 0);
    ck_assert_int_eq(d.root, 5);
    refused((struct obd_opdesc){.kind = bc, .root = 0}, 6,
            "broadcast of 0 bytes");
    refused((struct obd_opdesc){.kind = bc, .count = 1, .root = 6}, 6,
            "broadcast root 6 not in [0, 6)");
    refused((struct obd_opdesc){.kind = bc, .count = 1, .root = -1}, 6,
            "broadcast root -1 not in [0, 6)");

    d = (struct obd_opdesc){.kind = OBCOMM_KIND_BARRIER,
                            .dtype = 3,
                            .count = 8,
                            .key = 2,
                            .root = 1};
    accepted(&d, 2, 0, 0);
    ck_assert_int_eq(memcmp(&d,
                            &(struct obd_opdesc){.kind = OBCOMM_KIND_BARRIER},
                            sizeof(d)),
                     0);
}
END_TEST

START_TEST(onebit_and_state_ops)
{
    uint32_t ob = OBCOMM_KIND_ALLREDUCE_1BIT;
    struct obd_opdesc d = {.kind = ob,
                           .dtype = OBCOMM_FLOAT64,
                           .redop = OBCOMM_MIN,
                           .count = 10,
                           .key = 3,
                           .root = 2};
    accepted(&d, 4, 40, 0);
    ck_assert_uint_eq(d.dtype, OBCOMM_FLOAT32);
    ck_assert_uint_eq(d.redop, OBCOMM_AVG);
    ck_assert_int_eq(d.root, 0);
    ck_assert_uint_eq(d.key, 3);
    refused((struct obd_opdesc){.kind = ob}, 4,
            "1-bit allreduce of 0 elements");
    refused((struct obd_opdesc){.kind = ob, .count = UINT64_MAX / 8 + 1}, 4,
            "1-bit allreduce of 2305843009213693952 elements overflows");

    d = (struct obd_opdesc){
        .kind = OBCOMM_KIND_RESET_1BIT, .dtype = 1, .count = 5, .key = 9};
    accepted(&d, 2, 0, 0);
    ck_assert_uint_eq(d.key, 9);
    ck_assert_uint_eq(d.count, 0);
    ck_assert_uint_eq(d.dtype, 0);

    d = (struct obd_opdesc){.kind = OBCOMM_KIND_SNAPSHOT_1BIT, .key = 9};
    accepted(&d, 2, 0, 0);
    ck_assert_uint_eq(d.key, 0);

    /* A restore may come without a buffer; an export may not. */
    d = (struct obd_opdesc){
        .kind = OBCOMM_KIND_RESTORE_1BIT, .key = 12, .root = 1};
    accepted(&d, 2, 0, 0);
    ck_assert_int_eq(d.root, 0);
    d = (struct obd_opdesc){
        .kind = OBCOMM_KIND_EXPORT_1BIT, .key = 12, .count = 100};
    accepted(&d, 2, 100, 0);
    refused((struct obd_opdesc){.kind = OBCOMM_KIND_EXPORT_1BIT, .key = 12}, 2,
            "snapshot 12 with 0 bytes");
    refused((struct obd_opdesc){.kind = OBCOMM_KIND_RESTORE_1BIT, .count = 8},
            2, "snapshot 0 with 8 bytes");
}
END_TEST

START_TEST(allgather_buffers)
{
    const struct obd_algo *a = obd_coll_algo(OBCOMM_KIND_ALLGATHER);
    char why[256] = "";
    static uint8_t mem[64];
    ck_assert_ptr_nonnull(a->check_buffers);
    /* Apart, or exactly at rank 2's place (in place): fine. */
    ck_assert_int_eq(a->check_buffers(mem, 8, mem + 8, 32, 2, why, 256), 0);
    ck_assert_int_eq(a->check_buffers(mem + 40, 8, mem, 32, 2, why, 256), 0);
    ck_assert_int_eq(a->check_buffers(mem + 16, 8, mem, 32, 2, why, 256), 0);
    /* Any other overlap would be overwritten before it is sent. */
    ck_assert_int_eq(a->check_buffers(mem + 8, 8, mem, 32, 2, why, 256),
                     OBD_E_INVAL);
    ck_assert_str_eq(why, "allgather: send overlaps recv other than at this "
                          "rank's own place in it");
    /* The other kinds have no rule on where their buffers lie. */
    ck_assert_ptr_null(
        obd_coll_algo(OBCOMM_KIND_REDUCE_SCATTER)->check_buffers);
    ck_assert_ptr_null(obd_coll_algo(OBCOMM_KIND_ALLREDUCE)->check_buffers);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("coll_check");
    TCase *tc = tcase_create("coll_check");
    tcase_add_test(tc, every_kind_has_a_row_with_a_check);
    tcase_add_test(tc, typed_collectives);
    tcase_add_test(tc, broadcast_and_barrier);
    tcase_add_test(tc, onebit_and_state_ops);
    tcase_add_test(tc, allgather_buffers);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
