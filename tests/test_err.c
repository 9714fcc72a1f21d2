/* The daemon's error table (daemon/err.h): every internal code has a name,
 * a text and a public code of include/obcomm.h, and a code coming back
 * from a peer lands on an internal code of the same public meaning. */
#include <check.h>

#include "ck_run.h"
#include <string.h>

#include "err.h"

START_TEST(every_code_maps_to_a_public_one)
{
    for (int e = -1; e >= -OBD_ERR_COUNT; e--) {
        int pub = obd_err_public(e);
        /* One of obcomm.h's codes, OBCOMM_E_INVAL down to the last. */
        ck_assert_int_le(pub, OBCOMM_E_INVAL);
        ck_assert_int_ge(pub, OBCOMM_E_DENIED);
        /* Through a peer and back: the same public code. */
        ck_assert_int_eq(obd_err_public(obd_err_from_public(pub)), pub);
        ck_assert_int_eq(strncmp(obd_err_name(e), "OBD_E_", 6), 0);
        ck_assert_str_ne(obd_err_name(e), "OBD_E_?");
        ck_assert_int_gt((int)strlen(obd_err_str(e)), 0);
        for (int f = e - 1; f >= -OBD_ERR_COUNT; f--)
            ck_assert_str_ne(obd_err_name(e), obd_err_name(f));
    }
    ck_assert_int_eq(obd_err_public(0), 0);
    ck_assert_int_eq(obd_err_from_public(0), 0);
}
END_TEST

START_TEST(the_mapping_is_the_documented_one)
{
    ck_assert_int_eq(obd_err_public(OBD_E_TIMEOUT), OBCOMM_E_TIMEOUT);
    ck_assert_int_eq(obd_err_public(OBD_E_TOOBIG), OBCOMM_E_NOMEM);
    ck_assert_int_eq(obd_err_public(OBD_E_EXISTS), OBCOMM_E_BUSY);
    ck_assert_int_eq(obd_err_public(OBD_E_MISSING), OBCOMM_E_STATE);
    ck_assert_int_eq(obd_err_public(OBD_E_OTHER_WORLD), OBCOMM_E_STATE);
    ck_assert_int_eq(obd_err_public(OBD_E_SYS), OBCOMM_E_IO);
    ck_assert_int_eq(obd_err_from_public(OBCOMM_E_NOMEM), OBD_E_NOMEM);
    ck_assert_int_eq(obd_err_from_public(OBCOMM_E_STATE), OBD_E_STATE);
    ck_assert_str_eq(obd_err_name(OBD_E_NONFINITE), "OBD_E_NONFINITE");
}
END_TEST

/* What is not a code: an errno, a libuv code, a public code handed out
 * twice. Each is caught, never passed on as some other error. */
START_TEST(strays_are_caught)
{
    ck_assert_int_eq(obd_err_public(-OBD_ERR_COUNT - 1), OBCOMM_E_PROTO);
    ck_assert_int_eq(obd_err_public(OBCOMM_E_TIMEOUT), OBCOMM_E_PROTO);
    ck_assert_int_eq(obd_err_public(-4095), OBCOMM_E_PROTO); /* UV_EOF */
    ck_assert_int_eq(obd_err_public(1), OBCOMM_E_PROTO);
    ck_assert_str_eq(obd_err_name(1), "OBD_E_?");
    ck_assert_int_eq(obd_err_from_public(-999), OBD_E_PROTO);
    ck_assert_int_eq(obd_err_from_public(-1100), OBD_E_PROTO);
    ck_assert_int_eq(obd_err_from_public(OBD_E_TIMEOUT), OBD_E_PROTO);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("err");
    TCase *tc = tcase_create("err");
    tcase_add_test(tc, every_code_maps_to_a_public_one);
    tcase_add_test(tc, the_mapping_is_the_documented_one);
    tcase_add_test(tc, strays_are_caught);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
