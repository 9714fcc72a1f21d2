/* The option table: defaults, bounds, the file format, flags over the file,
 * and the derived world. */
#include <check.h>

#include "ck_run.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

static char err[512];

START_TEST(defaults_are_a_one_node_world)
{
    struct obd_config c;
    obd_config_defaults(&c);
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    ck_assert_int_eq(c.nodes, 1);
    ck_assert_int_eq(c.rank, 0);
    ck_assert_int_eq(c.listen_addr.port, 0);
    ck_assert_int_eq(c.timeout_ms, 60000);
    ck_assert_int_eq(c.segment_bytes, 1048576);
    ck_assert_str_eq(c.socket, "/tmp/obcommd.sock");
}
END_TEST

START_TEST(bounds_and_types_are_enforced)
{
    struct obd_config c;
    obd_config_defaults(&c);
    ck_assert_int_eq(obd_config_set(&c, "timeout_ms", "5", err, sizeof(err)),
                     -1);
    ck_assert_ptr_nonnull(strstr(err, "out of range [10, 3600000]"));
    ck_assert_int_eq(obd_config_set(&c, "timeout_ms", "12x", err, sizeof(err)),
                     -1);
    ck_assert_ptr_nonnull(strstr(err, "not an integer"));
    ck_assert_int_eq(obd_config_set(&c, "nonsense", "1", err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "unknown option 'nonsense'"));
    ck_assert_int_eq(
        obd_config_set(&c, "segment_bytes", "0x10000", err, sizeof(err)), 0);
    ck_assert_int_eq(c.segment_bytes, 65536);
    char longname[200];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    ck_assert_int_eq(obd_config_set(&c, "cluster", longname, err, sizeof(err)),
                     -1);
    ck_assert_int_eq(obd_config_set(&c, "log_level", "loud", err, sizeof(err)),
                     0);
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "log_level"));
}
END_TEST

START_TEST(file_then_flags_override)
{
    char path[] = "/tmp/obcomm-cfg-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    const char *text = "# a comment\n"
                       "cluster = prod   # trailing comment\n"
                       "peers = 10.0.0.1:7000, 10.0.0.2:7000,10.0.0.3:7001\n"
                       "rank = 2\n"
                       "timeout_ms = 1234\n";
    ck_assert_int_eq(write(fd, text, strlen(text)), (int)strlen(text));
    close(fd);

    struct obd_config c;
    int check = 0, help = 0;
    char *argv[] = {"obcommd",  "--timeout-ms",   "999", "-c", path,
                    "--rank=1", "--check-config", NULL};
    obd_config_defaults(&c);
    ck_assert_int_eq(
        obd_config_parse_args(&c, 7, argv, &check, &help, err, sizeof(err)), 0);
    ck_assert_int_eq(check, 1);
    ck_assert_int_eq(help, 0);
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    ck_assert_str_eq(c.cluster, "prod");
    ck_assert_int_eq(c.rank, 1);
    ck_assert_int_eq(c.timeout_ms, 999);
    ck_assert_int_eq(c.nodes, 3);
    ck_assert_str_eq(c.world[2].host, "10.0.0.3");
    ck_assert_int_eq(c.world[2].port, 7001);
    /* The default listen address is this rank's own, not 0.0.0.0. */
    ck_assert_str_eq(c.listen_addr.host, "10.0.0.2");
    ck_assert_int_eq(c.listen_addr.port, 7000);

    /* The fingerprint covers cluster and world, not the rank. */
    struct obd_config c2 = c;
    c2.rank = 0;
    ck_assert_int_eq(obd_config_finish(&c2, err, sizeof(err)), 0);
    ck_assert_uint_eq(c.fingerprint, c2.fingerprint);
    snprintf(c2.cluster, sizeof(c2.cluster), "other");
    ck_assert_int_eq(obd_config_finish(&c2, err, sizeof(err)), 0);
    ck_assert_uint_ne(c.fingerprint, c2.fingerprint);

    FILE *f = fopen(path, "a");
    fputs("bogus line\n", f);
    fclose(f);
    obd_config_defaults(&c);
    ck_assert_int_eq(obd_config_load(&c, path, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, ":6: expected 'name = value'"));
    unlink(path);
}
END_TEST

START_TEST(bad_worlds_are_refused)
{
    struct obd_config c;
    obd_config_defaults(&c);
    obd_config_set(&c, "peers", "a:1,b:2", err, sizeof(err));
    obd_config_set(&c, "rank", "2", err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "lists only 2 nodes"));

    obd_config_set(&c, "rank", "0", err, sizeof(err));
    obd_config_set(&c, "peers", "a:1,a:1", err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "ranks 0 and 1 are both a:1"));

    obd_config_set(&c, "peers", "a:1,b:99999", err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "'b:99999' is not host:port"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("config");
    tcase_add_test(tc, defaults_are_a_one_node_world);
    tcase_add_test(tc, bounds_and_types_are_enforced);
    tcase_add_test(tc, file_then_flags_override);
    tcase_add_test(tc, bad_worlds_are_refused);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
