/* The option table: defaults, bounds, the file format, flags over the file,
 * and the derived world. */
#include <check.h>
#include <sched.h>

#include "ck_run.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "err.h"

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
    ck_assert_str_eq(c.socket, "/run/obcomm/obcommd.sock");
}
END_TEST

START_TEST(bounds_and_types_are_enforced)
{
    struct obd_config c;
    obd_config_defaults(&c);
    ck_assert_int_eq(obd_config_set(&c, "timeout_ms", "5", err, sizeof(err)),
                     OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "out of range [10, 3600000]"));
    ck_assert_int_eq(obd_config_set(&c, "timeout_ms", "12x", err, sizeof(err)),
                     OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "not a decimal integer"));
    ck_assert_int_eq(obd_config_set(&c, "nonsense", "1", err, sizeof(err)),
                     OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "unknown option 'nonsense'"));
    ck_assert_int_eq(
        obd_config_set(&c, "segment_bytes", "0x10000", err, sizeof(err)),
        OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "'0x10000' is not a decimal integer"));
    char longname[200];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    ck_assert_int_eq(obd_config_set(&c, "cluster", longname, err, sizeof(err)),
                     OBD_E_INVAL);
    ck_assert_int_eq(obd_config_set(&c, "log_level", "loud", err, sizeof(err)),
                     0);
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), OBD_E_INVAL);
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
    ck_assert_int_eq(obd_config_load(&c, path, err, sizeof(err)), OBD_E_INVAL);
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
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "lists only 2 nodes"));

    obd_config_set(&c, "rank", "0", err, sizeof(err));
    obd_config_set(&c, "peers", "a:1,a:1", err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "ranks 0 and 1 are both a:1"));

    obd_config_set(&c, "peers", "a:1,b:99999", err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "'b:99999' is not host:port"));
}
END_TEST

/* Integers are decimal (a leading zero is not octal); options in
 * milliseconds take ms and s, options in seconds take s, others none. */
START_TEST(integers_are_decimal_with_unit_suffixes)
{
    struct obd_config c;
    obd_config_defaults(&c);
    ck_assert_int_eq(obd_config_set(&c, "timeout_ms", "0100", err, sizeof(err)),
                     0);
    ck_assert_int_eq(c.timeout_ms, 100);
    ck_assert_int_eq(
        obd_config_set(&c, "timeout_ms", "250ms", err, sizeof(err)), 0);
    ck_assert_int_eq(c.timeout_ms, 250);
    ck_assert_int_eq(obd_config_set(&c, "timeout_ms", "2s", err, sizeof(err)),
                     0);
    ck_assert_int_eq(c.timeout_ms, 2000);
    ck_assert_int_eq(
        obd_config_set(&c, "timeout_ms", "3601s", err, sizeof(err)),
        OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "3601s is out of range [10, 3600000]"));
    ck_assert_int_eq(obd_config_set(&c, "keepalive_s", "30s", err, sizeof(err)),
                     0);
    ck_assert_int_eq(c.keepalive_s, 30);
    ck_assert_int_eq(
        obd_config_set(&c, "keepalive_s", "30ms", err, sizeof(err)),
        OBD_E_INVAL);
    ck_assert_int_eq(
        obd_config_set(&c, "segment_bytes", "65536s", err, sizeof(err)),
        OBD_E_INVAL);
    ck_assert_int_eq(obd_config_set(&c, "max_jobs", "1e3", err, sizeof(err)),
                     OBD_E_INVAL);
    ck_assert_int_eq(obd_config_set(&c, "max_jobs", "", err, sizeof(err)),
                     OBD_E_INVAL);
    ck_assert_int_eq(obd_config_set(&c, "max_jobs", "99999999999999999999", err,
                                    sizeof(err)),
                     OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "out of range"));
    ck_assert_int_eq(obd_config_set(&c, "rank", "-1", err, sizeof(err)),
                     OBD_E_INVAL);
    ck_assert_int_eq(obd_config_set(&c, "rank", "auto", err, sizeof(err)), 0);
    ck_assert_int_eq(c.rank, -1);
    ck_assert_int_eq(c.max_jobs, 16); /* untouched by the failures */
}
END_TEST

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(files_are_checked_and_errors_name_file_and_line)
{
    char dir[] = "/tmp/obcomm-cfgdir-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof(path), "%s/obcommd.conf", dir);
    struct obd_config c;

    /* A directory (or a FIFO, a device) is not a config file. */
    obd_config_defaults(&c);
    ck_assert_int_eq(obd_config_load(&c, dir, err, sizeof(err)), OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "not a regular file"));

    /* A key given twice is an error naming both lines. */
    write_file(path, "timeout_ms = 100\n# x\ntimeout_ms = 200\n");
    obd_config_defaults(&c);
    ck_assert_int_eq(obd_config_load(&c, path, err, sizeof(err)), OBD_E_INVAL);
    ck_assert_ptr_nonnull(
        strstr(err, ":3: timeout_ms is already set at line 1"));

    /* Cross-option errors found later still name the line. */
    write_file(path, "cluster = x\n\npeers = a:1, b:2\nrank = 2\n");
    obd_config_defaults(&c);
    ck_assert_int_eq(obd_config_load(&c, path, err, sizeof(err)), 0);
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), OBD_E_INVAL);
    char want[256];
    snprintf(want, sizeof(want),
             "%s:4: rank: 2 but peers lists only 2 nodes (0..1)", path);
    ck_assert_str_eq(err, want);
    write_file(path, "peers = a:1, b:x\n");
    obd_config_defaults(&c);
    ck_assert_int_eq(obd_config_load(&c, path, err, sizeof(err)), 0);
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), OBD_E_INVAL);
    snprintf(want, sizeof(want), "%s:1: peers: 'b:x' is not host:port", path);
    ck_assert_str_eq(err, want);

    /* A flag given twice, and a second -c, are refused; a flag that sets
     * a key the file set overrides it. */
    write_file(path, "timeout_ms = 100\n");
    int check = 0, help = 0;
    char *argv1[] = {"obcommd", "--rank", "1", "--rank=0", NULL};
    obd_config_defaults(&c);
    ck_assert_int_eq(
        obd_config_parse_args(&c, 4, argv1, &check, &help, err, sizeof(err)),
        OBD_E_INVAL);
    ck_assert_str_eq(err, "--rank given twice");
    char *argv2[] = {"obcommd", "-c", path, "-c", path, NULL};
    obd_config_defaults(&c);
    ck_assert_int_eq(
        obd_config_parse_args(&c, 5, argv2, &check, &help, err, sizeof(err)),
        OBD_E_INVAL);
    char *argv3[] = {"obcommd", "-c", path, "--timeout-ms", "7s", NULL};
    obd_config_defaults(&c);
    ck_assert_int_eq(
        obd_config_parse_args(&c, 5, argv3, &check, &help, err, sizeof(err)),
        0);
    ck_assert_int_eq(c.timeout_ms, 7000);

    unlink(path);
    rmdir(dir);
}
END_TEST

/* 256 nodes with 60-character host names: a line far longer than 4,095
 * bytes (lines are read whole, of any length), through both the peers
 * line and peers_file. */
START_TEST(long_worlds_fit_in_a_line_and_in_peers_file)
{
    enum { N = 256 };
    size_t cap = 80 * N + 64;
    char *line = malloc(cap), *file = malloc(cap + 4096);
    ck_assert_ptr_nonnull(line);
    ck_assert_ptr_nonnull(file);
    size_t lo = 0, fo = 0;
    lo += (size_t)snprintf(line + lo, cap - lo, "peers = ");
    fo += (size_t)snprintf(file + fo, cap + 4096 - fo, "# the world\n\n");
    for (int i = 0; i < N; i++) {
        char host[80];
        snprintf(host, sizeof(host),
                 "node-%03d.rack-%02d.cluster.example.invalid.xxxxxxxxxxxxxx",
                 i, i / 16);
        lo += (size_t)snprintf(line + lo, cap - lo, "%s%s:7000", i ? ", " : "",
                               host);
        fo += (size_t)snprintf(file + fo, cap + 4096 - fo,
                               "%s:7000   # rank %d\n", host, i);
    }
    ck_assert_uint_gt(lo, 4096 * 3);

    char path[] = "/tmp/obcomm-peers-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    char conf[] = "/tmp/obcomm-conf-XXXXXX";
    fd = mkstemp(conf);
    ck_assert_int_ge(fd, 0);
    close(fd);

    struct obd_config c;
    write_file(conf, line);
    obd_config_defaults(&c);
    ck_assert_int_eq(obd_config_load(&c, conf, err, sizeof(err)), 0);
    obd_config_set(&c, "rank", "255", err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    ck_assert_int_eq(c.nodes, N);
    ck_assert_str_eq(c.world[255].host,
                     "node-255.rack-15.cluster.example.invalid.xxxxxxxxxxxxxx");
    uint64_t fp = c.fingerprint;

    write_file(path, file);
    obd_config_defaults(&c);
    obd_config_set(&c, "peers_file", path, err, sizeof(err));
    obd_config_set(&c, "rank", "255", err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    ck_assert_int_eq(c.nodes, N);
    ck_assert_int_eq(c.listen_addr.port, 7000);
    ck_assert_uint_eq(c.fingerprint, fp); /* the same world */

    /* A bad line names peers_file's line; peers and peers_file exclude
     * each other. */
    write_file(path, "a:1\n# c\nb:2:x\n");
    obd_config_defaults(&c);
    obd_config_set(&c, "peers_file", path, err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, ":3: 'b:2:x' is not host:port"));
    obd_config_set(&c, "peers", "a:1", err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "set together with peers"));
    unlink(path);
    unlink(conf);
    free(line);
    free(file);
}
END_TEST

/* obd_config_resolve: loopback names and documentation addresses (TEST-NET-2,
 * -3) only, which resolve from /etc/hosts or numerically without a network. */
START_TEST(resolve_finds_the_rank_and_refuses_two_spellings)
{
    struct obd_config c;
    obd_config_defaults(&c);
    obd_config_set(&c, "peers", "127.0.0.1:7000,localhost:7000", err,
                   sizeof(err));
    obd_config_set(&c, "rank", "0", err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    ck_assert_int_eq(obd_config_resolve(&c, 0, err, sizeof(err)), OBD_E_INVAL);
    ck_assert_ptr_nonnull(
        strstr(err, "ranks 0 (127.0.0.1:7000) and 1 (localhost:7000) are the "
                    "same node"));

    /* Different ports on one machine are different daemons. */
    obd_config_set(&c, "peers", "127.0.0.1:7000,localhost:7001", err,
                   sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    ck_assert_int_eq(obd_config_resolve(&c, 0, err, sizeof(err)), 0);

    /* rank auto: the one local entry. */
    obd_config_defaults(&c);
    obd_config_set(&c, "peers",
                   "198.51.100.1:7000,127.0.0.1:7000,203.0.113.1:7000", err,
                   sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    ck_assert_int_eq(c.rank, -1);
    ck_assert_int_eq(obd_config_resolve(&c, 0, err, sizeof(err)), 0);
    ck_assert_int_eq(c.rank, 1);
    ck_assert_int_eq(c.listen_addr.port, 7000);

    /* Two local entries: ambiguous, unless listen names the port. */
    obd_config_defaults(&c);
    obd_config_set(&c, "peers", "127.0.0.1:7000,127.0.0.1:7001", err,
                   sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    ck_assert_int_eq(obd_config_resolve(&c, 0, err, sizeof(err)), OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "both addresses of this machine"));
    obd_config_set(&c, "listen", "127.0.0.1:7001", err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    ck_assert_int_eq(obd_config_resolve(&c, 0, err, sizeof(err)), 0);
    ck_assert_int_eq(c.rank, 1);

    /* No local entry at all. */
    obd_config_defaults(&c);
    obd_config_set(&c, "peers", "198.51.100.1:7000,203.0.113.1:7000", err,
                   sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    ck_assert_int_eq(obd_config_resolve(&c, 0, err, sizeof(err)), OBD_E_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "no entry of peers is an address"));

    /* threads 0 becomes the number of usable cores. */
    cpu_set_t set;
    ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
    ck_assert_int_eq(c.threads, CPU_COUNT(&set));
}
END_TEST

START_TEST(check_config_is_strict)
{
    struct obd_config c;
    obd_config_defaults(&c);
    obd_config_set(&c, "peers", "127.0.0.1:7000,no-such-host.invalid:7000", err,
                   sizeof(err));
    obd_config_set(&c, "rank", "0", err, sizeof(err));
    obd_config_set(&c, "socket", "/tmp/x.sock", err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    /* At start an unresolvable peer is retried later; the check fails. */
    ck_assert_int_eq(obd_config_resolve(&c, 0, err, sizeof(err)), 0);
    ck_assert_int_eq(obd_config_resolve(&c, 1, err, sizeof(err)), OBD_E_INVAL);
    ck_assert_ptr_nonnull(
        strstr(err, "rank 1's host no-such-host.invalid does not resolve"));

    /* A socket directory the start would create passes; one it could not
     * create fails. */
    char dir[] = "/tmp/obcomm-check-XXXXXX", path[256];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    obd_config_defaults(&c);
    snprintf(path, sizeof(path), "%s/run/obcommd.sock", dir);
    obd_config_set(&c, "socket", path, err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    ck_assert_int_eq(obd_config_resolve(&c, 1, err, sizeof(err)), 0);
    snprintf(path, sizeof(path), "%s/run", dir);
    ck_assert_int_eq(access(path, F_OK), -1); /* the check created nothing */
    snprintf(path, sizeof(path), "%s/no/run/obcommd.sock", dir);
    obd_config_set(&c, "socket", path, err, sizeof(err));
    ck_assert_int_eq(obd_config_resolve(&c, 1, err, sizeof(err)), OBD_E_INVAL);
    char want[512];
    snprintf(want, sizeof(want),
             "socket directory %s/no/run: missing, and cannot be created in "
             "%s/no: No such file or directory",
             dir, dir);
    ck_assert_str_eq(err, want);

    /* state_dir as the start judges it: a directory of this user that
     * nobody else may write; a missing one passes when it can be made. */
    obd_config_set(&c, "socket", "/tmp/obcommd.sock", err, sizeof(err));
    obd_config_set(&c, "state_dir", "/etc/hostname", err, sizeof(err));
    ck_assert_int_eq(obd_config_resolve(&c, 1, err, sizeof(err)), OBD_E_INVAL);
    ck_assert_str_eq(err, "state_dir /etc/hostname is not a directory");
    obd_config_set(&c, "state_dir", "/tmp", err, sizeof(err));
    ck_assert_int_eq(obd_config_resolve(&c, 1, err, sizeof(err)), OBD_E_INVAL);
    ck_assert_ptr_nonnull(
        strstr(err, "state_dir /tmp belongs to uid 0 with mode 1777: "
                    "refused"));
    snprintf(path, sizeof(path), "%s/state", dir);
    obd_config_set(&c, "state_dir", path, err, sizeof(err));
    ck_assert_int_eq(obd_config_resolve(&c, 1, err, sizeof(err)), 0);
    ck_assert_int_eq(access(path, F_OK), -1);

    /* trace_file as the start opens it, without creating it. */
    obd_config_set(&c, "state_dir", "", err, sizeof(err));
    snprintf(path, sizeof(path), "%s/trace.json", dir);
    obd_config_set(&c, "trace_file", path, err, sizeof(err));
    ck_assert_int_eq(obd_config_resolve(&c, 1, err, sizeof(err)), 0);
    ck_assert_int_eq(access(path, F_OK), -1);
    snprintf(path, sizeof(path), "%s/none/trace.json", dir);
    obd_config_set(&c, "trace_file", path, err, sizeof(err));
    ck_assert_int_eq(obd_config_resolve(&c, 1, err, sizeof(err)), OBD_E_INVAL);
    snprintf(want, sizeof(want),
             "trace_file %s/none/trace.json: directory %s/none: No such "
             "file or directory",
             dir, dir);
    ck_assert_str_eq(err, want);
    obd_config_set(&c, "trace_file", dir, err, sizeof(err));
    ck_assert_int_eq(obd_config_resolve(&c, 1, err, sizeof(err)), OBD_E_INVAL);
    snprintf(want, sizeof(want), "trace_file %s is not a regular file", dir);
    ck_assert_str_eq(err, want);
    rmdir(dir);

    /* listen: an address this machine has (a daemon on its port does not
     * count against it), not one it lacks (TEST-NET-1). */
    obd_config_defaults(&c);
    obd_config_set(&c, "socket", "/tmp/obcommd.sock", err, sizeof(err));
    obd_config_set(&c, "peers", "127.0.0.1:7000,127.0.0.1:7001", err,
                   sizeof(err));
    obd_config_set(&c, "rank", "0", err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    ck_assert_msg(obd_config_resolve(&c, 1, err, sizeof(err)) == 0, "%s", err);
    obd_config_set(&c, "listen", "192.0.2.1:7000", err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    ck_assert_int_eq(obd_config_resolve(&c, 1, err, sizeof(err)), OBD_E_INVAL);
    ck_assert_str_eq(err, "listen 192.0.2.1:7000: this machine cannot listen "
                          "there: Cannot assign requested address");
}
END_TEST

/* --check-config reads the key as the start does (obd_auth_key_load):
 * a key others may read, or a relative name outside systemd, fails. */
START_TEST(check_config_reads_the_key_as_the_start_does)
{
    char dir[] = "/tmp/obcomm-checkkey-XXXXXX", path[256], want[512];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/cluster.key", dir);
    write_file(path, "0123456789abcdef0123456789abcdef");
    ck_assert_int_eq(chmod(path, 0644), 0);
    struct obd_config c;
    obd_config_defaults(&c);
    obd_config_set(&c, "socket", "/tmp/obcommd.sock", err, sizeof(err));
    obd_config_set(&c, "auth_key_file", path, err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    ck_assert_int_eq(obd_config_resolve(&c, 1, err, sizeof(err)), OBD_E_INVAL);
    snprintf(want, sizeof(want),
             "auth_key_file %s: mode 0644 lets group or others at the key; "
             "run chmod 600 %s",
             path, path);
    ck_assert_str_eq(err, want);
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert_int_eq(obd_config_resolve(&c, 1, err, sizeof(err)), 0);

    unsetenv("CREDENTIALS_DIRECTORY");
    obd_config_set(&c, "auth_key_file", "cluster.key", err, sizeof(err));
    ck_assert_int_eq(obd_config_resolve(&c, 1, err, sizeof(err)), OBD_E_INVAL);
    ck_assert_str_eq(err, "auth_key_file cluster.key: a relative name is a "
                          "systemd credential, but $CREDENTIALS_DIRECTORY is "
                          "not set (run under the unit, whose LoadCredential= "
                          "provides it, or give an absolute path)");
    setenv("CREDENTIALS_DIRECTORY", dir, 1);
    ck_assert_int_eq(obd_config_resolve(&c, 1, err, sizeof(err)), 0);
    obd_config_set(&c, "auth_key_file", "obcomm-cluster.key", err, sizeof(err));
    ck_assert_int_eq(obd_config_resolve(&c, 1, err, sizeof(err)), OBD_E_INVAL);
    snprintf(want, sizeof(want),
             "auth_key_file %s/obcomm-cluster.key: no such credential (the "
             "unit's LoadCredential=obcomm-cluster.key finds the key in "
             "/etc/credstore/obcomm-cluster.key; install it there with "
             "install -m 600 -o root)",
             dir);
    ck_assert_str_eq(err, want);
    unsetenv("CREDENTIALS_DIRECTORY");
    unlink(path);
    rmdir(dir);
}
END_TEST

/* SIGHUP compares the configuration as given: rank auto and threads 0
 * that the start resolved are not changes. */
START_TEST(reload_names_only_what_changed)
{
    struct obd_config cur, next;
    char changed[1024];
    obd_config_defaults(&cur);
    obd_config_set(&cur, "peers", "127.0.0.1:7301,127.0.0.1:7302", err,
                   sizeof(err));
    obd_config_set(&cur, "listen", "127.0.0.1:7301", err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&cur, err, sizeof(err)), 0);
    ck_assert_int_eq(obd_config_resolve(&cur, 0, err, sizeof(err)), 0);
    ck_assert_int_eq(cur.rank, 0);
    ck_assert_int_gt(cur.threads, 0);

    obd_config_defaults(&next);
    obd_config_set(&next, "peers", "127.0.0.1:7301,127.0.0.1:7302", err,
                   sizeof(err));
    obd_config_set(&next, "listen", "127.0.0.1:7301", err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&next, err, sizeof(err)), 0);
    ck_assert_int_eq(
        obd_config_diff_fixed(&cur, &next, changed, sizeof(changed)), 0);
    ck_assert_str_eq(changed, "");
    ck_assert_int_eq(obd_config_reload(&cur, &next, changed, sizeof(changed)),
                     0);

    obd_config_set(&next, "threads", "3", err, sizeof(err));
    obd_config_set(&next, "rank", "1", err, sizeof(err));
    obd_config_set(&next, "log_level", "debug", err, sizeof(err));
    ck_assert_int_eq(
        obd_config_diff_fixed(&cur, &next, changed, sizeof(changed)), 2);
    ck_assert_str_eq(changed, "rank: auto -> 1, threads: 0 -> 3");
    ck_assert_int_eq(obd_config_reload(&cur, &next, changed, sizeof(changed)),
                     1);
    ck_assert_str_eq(changed, "log_level: info -> debug");
}
END_TEST

START_TEST(world_diff_names_the_first_entry_that_differs)
{
    struct obd_config c;
    obd_config_defaults(&c);
    obd_config_set(&c, "peers", "a:1,b:2,c:3", err, sizeof(err));
    obd_config_set(&c, "rank", "0", err, sizeof(err));
    ck_assert_int_eq(obd_config_finish(&c, err, sizeof(err)), 0);
    char out[256];
    const char *same[] = {"a:1", "b:2", "c:3"};
    ck_assert_int_eq(obd_config_world_diff(&c, same, 3, out, sizeof(out)), 0);
    const char *other[] = {"a:1", "b:20", "c:3"};
    ck_assert_int_eq(obd_config_world_diff(&c, other, 3, out, sizeof(out)), 1);
    ck_assert_str_eq(out, "rank 1 is b:2 here, b:20 at the peer");
    ck_assert_int_eq(obd_config_world_diff(&c, same, 2, out, sizeof(out)), 1);
    ck_assert_str_eq(out, "3 nodes here, 2 at the peer: rank 2 (c:3) is "
                          "missing at the peer");
    const char *longer[] = {"a:1", "b:2", "c:3", "d:4"};
    ck_assert_int_eq(obd_config_world_diff(&c, longer, 4, out, sizeof(out)), 1);
    ck_assert_str_eq(out, "3 nodes here, 4 at the peer: rank 3 (d:4) is "
                          "missing here");
    ck_assert_int_eq(obd_config_world_diff(&c, NULL, 0, out, sizeof(out)), 1);
}
END_TEST

static int loopback(int family, const char *text)
{
    struct sockaddr_storage sa = {.ss_family = (sa_family_t)family};
    void *at = family == AF_INET
                   ? (void *)&((struct sockaddr_in *)&sa)->sin_addr
                   : (void *)&((struct sockaddr_in6 *)&sa)->sin6_addr;
    ck_assert_int_eq(inet_pton(family, text, at), 1);
    return obd_config_is_loopback(&sa);
}

/* Loopback is 127.0.0.0/8, ::1 and 127.0.0.0/8 mapped into IPv6; no
 * other address, and no other family. */
START_TEST(loopback_addresses)
{
    ck_assert_int_eq(loopback(AF_INET, "127.0.0.1"), 1);
    ck_assert_int_eq(loopback(AF_INET, "127.255.0.9"), 1);
    ck_assert_int_eq(loopback(AF_INET6, "::1"), 1);
    ck_assert_int_eq(loopback(AF_INET6, "::ffff:127.0.0.1"), 1);
    ck_assert_int_eq(loopback(AF_INET6, "::ffff:127.3.2.1"), 1);
    ck_assert_int_eq(loopback(AF_INET, "0.0.0.0"), 0);
    ck_assert_int_eq(loopback(AF_INET, "128.0.0.1"), 0);
    ck_assert_int_eq(loopback(AF_INET, "10.127.0.1"), 0);
    ck_assert_int_eq(loopback(AF_INET6, "::"), 0);
    ck_assert_int_eq(loopback(AF_INET6, "::2"), 0);
    ck_assert_int_eq(loopback(AF_INET6, "::ffff:10.0.0.1"), 0);
    ck_assert_int_eq(loopback(AF_INET6, "::127.0.0.1"), 0);
    ck_assert_int_eq(loopback(AF_INET6, "fe80::1"), 0);
    struct sockaddr_storage unix_sa = {.ss_family = AF_UNIX};
    ck_assert_int_eq(obd_config_is_loopback(&unix_sa), 0);
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
    tcase_add_test(tc, integers_are_decimal_with_unit_suffixes);
    tcase_add_test(tc, files_are_checked_and_errors_name_file_and_line);
    tcase_add_test(tc, long_worlds_fit_in_a_line_and_in_peers_file);
    tcase_add_test(tc, resolve_finds_the_rank_and_refuses_two_spellings);
    tcase_add_test(tc, check_config_is_strict);
    tcase_add_test(tc, check_config_reads_the_key_as_the_start_does);
    tcase_add_test(tc, reload_names_only_what_changed);
    tcase_add_test(tc, world_diff_names_the_first_entry_that_differs);
    tcase_add_test(tc, loopback_addresses);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
