/* Snapshot sets (daemon/snapset.h): a set is usable only whole; the
 * verdict of a set op is the same from every node's reports and names
 * every node that failed; ids are the same on every node and differ
 * between runs and ops. */
#include <check.h>

#include "ck_run.h"

#include <obcomm.h>

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "efstate.h"
#include "snapset.h"

static const struct obd_ef_world world = {2, 1, 0x1234};

/* A state of `count` elements with distinct errors. */
static struct obd_ef *state(const char *job, uint64_t key, uint64_t count)
{
    struct obd_ef *ef = obd_ef_new(job, key, count, 2);
    ck_assert_ptr_nonnull(ef);
    for (size_t i = 0; i < ef->padded; i++)
        ef->werr[i] = (float)i * 0.25f - (float)key;
    for (size_t i = 0; i < ef->padded / 2; i++)
        ef->serr[i] = (float)key - (float)i * 0.5f;
    obd_ef_restored(ef);
    return ef;
}

static void same_errors(const struct obd_ef *a, const struct obd_ef *b)
{
    ck_assert_uint_eq(a->count, b->count);
    ck_assert_uint_eq(a->padded, b->padded);
    float *x = malloc(a->padded * sizeof(float));
    float *y = malloc(a->padded * sizeof(float));
    for (int part = 0; part < 2; part++) {
        size_t n = part ? a->padded / 2 : a->padded;
        obd_ef_error(a, part, x, 0, n);
        obd_ef_error(b, part, y, 0, n);
        ck_assert_int_eq(memcmp(x, y, n * sizeof(float)), 0);
    }
    free(x);
    free(y);
}

static char dir[64];
static int lock_fd = -1; /* state_dir/lock, as the daemon holds it */

static void make_dir(void)
{
    snprintf(dir, sizeof(dir), "/tmp/obcomm-snapset-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char why[512];
    ck_assert_int_eq(obd_snapset_prepare_dir(dir, (unsigned)geteuid(), &lock_fd,
                                             why, sizeof(why)),
                     0);
}

static void remove_dir(void)
{
    if (lock_fd >= 0)
        close(lock_fd);
    lock_fd = -1;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static int count_list(const struct obd_ef *ef)
{
    int n = 0;
    for (; ef; ef = ef->next)
        n++;
    return n;
}

static void free_list(struct obd_ef *ef)
{
    while (ef) {
        struct obd_ef *next = ef->next;
        obd_ef_free(ef);
        ef = next;
    }
}

/* The path of the one file of key `key` in set id of job "j". */
static void file_of(uint64_t id, uint64_t key, char *buf, size_t len)
{
    char set[256];
    snprintf(set, sizeof(set), "%s/set-6a-%016llx", dir,
             (unsigned long long)id);
    obd_ef_path(set, "j", key, buf, len);
}

START_TEST(set_round_trip_exact)
{
    make_dir();
    struct obd_ef *efs[3] = {state("j", 1, 1000), state("j", 2, 77),
                             state("j", 3, 4097)};
    char why[512];
    ck_assert_int_eq(
        obd_snapset_write(dir, "j", 42, efs, 3, &world, why, sizeof(why)), 0);
    struct obd_ef *list = NULL;
    ck_assert_int_eq(obd_snapset_read(dir, "j", 42, &world, 1 << 30, &list, why,
                                      sizeof(why)),
                     0);
    ck_assert_int_eq(count_list(list), 3);
    for (struct obd_ef *ef = list; ef; ef = ef->next)
        same_errors(ef, efs[ef->key - 1]);
    free_list(list);
    /* An empty set is a set too: a run with no 1-bit key yet. */
    ck_assert_int_eq(
        obd_snapset_write(dir, "j", 43, efs, 0, &world, why, sizeof(why)), 0);
    list = NULL;
    ck_assert_int_eq(obd_snapset_read(dir, "j", 43, &world, 1 << 30, &list, why,
                                      sizeof(why)),
                     0);
    ck_assert_ptr_null(list);
    for (int i = 0; i < 3; i++)
        obd_ef_free(efs[i]);
    remove_dir();
}
END_TEST

/* One byte flipped in one file, a file missing its tail, a set of
 * another world, a missing set: no state of the set is returned. */
START_TEST(a_damaged_file_spoils_the_whole_set)
{
    make_dir();
    struct obd_ef *efs[2] = {state("j", 1, 5000), state("j", 2, 5000)};
    char why[512], path[512];
    struct obd_ef *list = (struct obd_ef *)0x1;
    ck_assert_int_eq(
        obd_snapset_write(dir, "j", 7, efs, 2, &world, why, sizeof(why)), 0);
    file_of(7, 2, path, sizeof(path));
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size / 2, SEEK_SET);
    int c = fgetc(f);
    fseek(f, size / 2, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
    ck_assert_int_eq(
        obd_snapset_read(dir, "j", 7, &world, 1 << 30, &list, why, sizeof(why)),
        OBD_E_CORRUPT);
    ck_assert_ptr_eq(list, (struct obd_ef *)0x1);
    ck_assert_ptr_nonnull(strstr(why, "damaged"));

    ck_assert_int_eq(
        obd_snapset_write(dir, "j", 8, efs, 2, &world, why, sizeof(why)), 0);
    file_of(8, 1, path, sizeof(path));
    ck_assert_int_eq(truncate(path, 40), 0);
    ck_assert_int_eq(
        obd_snapset_read(dir, "j", 8, &world, 1 << 30, &list, why, sizeof(why)),
        OBD_E_CORRUPT);

    ck_assert_int_eq(
        obd_snapset_write(dir, "j", 9, efs, 2, &world, why, sizeof(why)), 0);
    struct obd_ef_world other = world;
    other.rank = 0;
    ck_assert_int_eq(
        obd_snapset_read(dir, "j", 9, &other, 1 << 30, &list, why, sizeof(why)),
        OBD_E_CORRUPT);

    ck_assert_int_eq(obd_snapset_read(dir, "j", 10, &world, 1 << 30, &list, why,
                                      sizeof(why)),
                     OBD_E_MISSING);
    ck_assert_ptr_nonnull(strstr(why, "missing"));
    /* Another job's set of the same id is not this job's. */
    ck_assert_int_eq(
        obd_snapset_read(dir, "k", 9, &world, 1 << 30, &list, why, sizeof(why)),
        OBD_E_MISSING);
    ck_assert_ptr_eq(list, (struct obd_ef *)0x1);
    for (int i = 0; i < 2; i++)
        obd_ef_free(efs[i]);
    remove_dir();
}
END_TEST

/* Sets the time of set `id` of job "j" to `sec`. */
static void set_time(uint64_t id, time_t sec)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/set-6a-%016llx", dir,
             (unsigned long long)id);
    struct timespec when[2] = {{sec, 0}, {sec, 0}};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, when, 0), 0);
}

/* Commit keeps the newest `keep` sets of the job (the committed one
 * among them) and no other job's; an unfinished set is removed at start. */
START_TEST(commit_prunes_and_start_removes_unfinished)
{
    make_dir();
    struct obd_ef *efs[1] = {state("j", 1, 100)};
    char why[512], path[512];
    for (uint64_t id = 1; id <= 6; id++) {
        ck_assert_int_eq(
            obd_snapset_write(dir, "j", id, efs, 1, &world, why, sizeof(why)),
            0);
        obd_snapset_commit(dir, "j", id, 3);
        /* Commit stamps the set with the current time; within one clock
         * tick sets would tie. Each set gets its own time instead, in
         * commit order and all in the past, so the next commit's "now"
         * is the newest. */
        set_time(id, (time_t)(1000000000 + id));
    }
    struct obd_ef *kefs[1] = {state("k", 1, 100)};
    ck_assert_int_eq(
        obd_snapset_write(dir, "k", 1, kefs, 1, &world, why, sizeof(why)), 0);
    obd_ef_free(kefs[0]);
    obd_snapset_commit(dir, "k", 1, 3);
    struct obd_ef *list;
    for (uint64_t id = 1; id <= 6; id++) {
        list = NULL;
        int rc = obd_snapset_read(dir, "j", id, &world, 1 << 30, &list, why,
                                  sizeof(why));
        ck_assert_int_eq(rc, id >= 4 ? 0 : OBD_E_MISSING);
        free_list(list);
    }
    list = NULL;
    ck_assert_int_eq(
        obd_snapset_read(dir, "k", 1, &world, 1 << 30, &list, why, sizeof(why)),
        0);
    free_list(list);
    snprintf(path, sizeof(path), "%s/set-6a-0000000000000009.tmp", dir);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    /* A restart: the old daemon's lock goes with it. */
    close(lock_fd);
    ck_assert_int_eq(obd_snapset_prepare_dir(dir, (unsigned)geteuid(), &lock_fd,
                                             why, sizeof(why)),
                     0);
    ck_assert_int_eq(access(path, F_OK), -1);
    obd_snapset_delete(dir, "j", 6);
    list = NULL;
    ck_assert_int_eq(
        obd_snapset_read(dir, "j", 6, &world, 1 << 30, &list, why, sizeof(why)),
        OBD_E_MISSING);
    obd_ef_free(efs[0]);
    remove_dir();
}
END_TEST

/* The set just committed is kept whatever the clock says: earlier sets
 * that look newer (a clock set back since) lose to it, and among the
 * others the newest stay. */
START_TEST(a_second_owner_is_refused_naming_the_first)
{
    make_dir();
    char why[512], want[512];
    /* The lock names its holder's pid, here this process's. */
    snprintf(want, sizeof(want),
             "state_dir %s is in use by obcommd pid %ld (it holds %s/lock): "
             "each daemon needs a state_dir of its own, or their saves and "
             "starts remove each other's files; give this one another "
             "directory (deploy/local-cluster.sh --state-dir DIR gives "
             "daemon N DIR/nodeN)",
             dir, (long)getpid(), dir);
    int second = -1;
    ck_assert_int_eq(obd_snapset_prepare_dir(dir, (unsigned)geteuid(), &second,
                                             why, sizeof(why)),
                     -1);
    ck_assert_str_eq(why, want);
    ck_assert_int_eq(second, -1);
    /* --check-config sees the same. */
    ck_assert_int_eq(obd_snapset_lock_free(dir, why, sizeof(why)), -1);
    ck_assert_str_eq(why, want);
    ck_assert_int_eq(
        obd_snapset_dir_ok(dir, (unsigned)geteuid(), 0, why, sizeof(why)), -1);
    ck_assert_str_eq(why, want);
    /* Released with the first owner: a second daemon may take it. */
    close(lock_fd);
    lock_fd = -1;
    ck_assert_int_eq(obd_snapset_lock_free(dir, why, sizeof(why)), 0);
    ck_assert_int_eq(
        obd_snapset_dir_ok(dir, (unsigned)geteuid(), 0, why, sizeof(why)), 0);
    ck_assert_int_eq(obd_snapset_prepare_dir(dir, (unsigned)geteuid(), &lock_fd,
                                             why, sizeof(why)),
                     0);
    remove_dir();
}
END_TEST

START_TEST(commit_keeps_the_committed_set_whatever_the_clock)
{
    make_dir();
    struct obd_ef *efs[1] = {state("j", 1, 100)};
    char why[512];
    for (uint64_t id = 1; id <= 5; id++) {
        ck_assert_int_eq(
            obd_snapset_write(dir, "j", id, efs, 1, &world, why, sizeof(why)),
            0);
        if (id < 5)
            set_time(id, (time_t)4000000000 + (time_t)id); /* year 2096 */
    }
    obd_snapset_commit(dir, "j", 5, 3);
    for (uint64_t id = 1; id <= 5; id++) {
        struct obd_ef *list = NULL;
        int rc = obd_snapset_read(dir, "j", id, &world, 1 << 30, &list, why,
                                  sizeof(why));
        ck_assert_msg(rc == (id >= 3 ? 0 : OBD_E_MISSING), "set %llu: %d (%s)",
                      (unsigned long long)id, rc, why);
        free_list(list);
    }
    obd_ef_free(efs[0]);
    remove_dir();
}
END_TEST

/* A node's part as bytes: exact round trip; a flipped byte, another node,
 * another set or job, or a cut part is refused and returns no state. */
START_TEST(part_round_trip_and_refusals)
{
    struct obd_ef *efs[2] = {state("j", 1, 3000), state("j", 2, 17)};
    const struct obd_ef *const *c = (const struct obd_ef *const *)efs;
    size_t n = obd_snapset_part_bytes(c, 2);
    uint8_t *part = malloc(n);
    obd_snapset_pack(c, 2, "j", 77, &world, part, n);
    struct obd_ef *list = NULL;
    char why[512];
    ck_assert_int_eq(
        obd_snapset_unpack(part, n, "j", 77, &world, &list, why, sizeof(why)),
        0);
    ck_assert_int_eq(count_list(list), 2);
    for (struct obd_ef *ef = list; ef; ef = ef->next)
        same_errors(ef, efs[ef->key - 1]);
    free_list(list);

    struct obd_ef *none = (struct obd_ef *)0x1;
    struct obd_ef_world node0 = world;
    node0.rank = 0;
    ck_assert_int_eq(
        obd_snapset_unpack(part, n, "j", 77, &node0, &none, why, sizeof(why)),
        OBD_E_CORRUPT);
    ck_assert_ptr_nonnull(strstr(why, "a part of node 1"));
    ck_assert_int_eq(
        obd_snapset_unpack(part, n, "j", 78, &world, &none, why, sizeof(why)),
        OBD_E_CORRUPT);
    ck_assert_int_eq(
        obd_snapset_unpack(part, n, "k", 77, &world, &none, why, sizeof(why)),
        OBD_E_CORRUPT);
    ck_assert_int_eq(obd_snapset_unpack(part, n - 4, "j", 77, &world, &none,
                                        why, sizeof(why)),
                     OBD_E_CORRUPT);
    part[n / 2] ^= 1;
    ck_assert_int_eq(
        obd_snapset_unpack(part, n, "j", 77, &world, &none, why, sizeof(why)),
        OBD_E_CORRUPT);
    ck_assert_ptr_nonnull(strstr(why, "digest"));
    ck_assert_ptr_eq(none, (struct obd_ef *)0x1);
    free(part);
    for (int i = 0; i < 2; i++)
        obd_ef_free(efs[i]);
}
END_TEST

START_TEST(verdict_names_every_failing_node)
{
    char msg[512];
    struct obd_snapreport ok[3] = {{0, ""}, {0, ""}, {0, NULL}};
    ck_assert_int_eq(obd_snapset_verdict(ok, 3, msg, sizeof(msg)), 0);
    ck_assert_str_eq(msg, "");

    struct obd_snapreport r[3] = {{0, ""},
                                  {OBD_E_CORRUPT, "damaged: x.lz4"},
                                  {OBD_E_STATE, "missing (y)"}};
    ck_assert_int_eq(obd_snapset_verdict(r, 3, msg, sizeof(msg)),
                     OBD_E_CORRUPT);
    ck_assert_str_eq(msg, "node 1: damaged: x.lz4; node 2: missing (y)");

    struct obd_snapreport one[2] = {{OBD_E_IO, ""}, {0, ""}};
    ck_assert_int_eq(obd_snapset_verdict(one, 2, msg, sizeof(msg)), OBD_E_IO);
    ck_assert_str_eq(msg, "node 0: failed");
    /* A short buffer is cut, never overrun. */
    char tiny[8];
    ck_assert_int_eq(obd_snapset_verdict(r, 3, tiny, sizeof(tiny)),
                     OBD_E_CORRUPT);
    ck_assert_str_eq(tiny, "node 1:");
}
END_TEST

START_TEST(ids_agree_and_differ)
{
    ck_assert_uint_eq(obd_snapset_id(5, 9), obd_snapset_id(5, 9));
    ck_assert_uint_ne(obd_snapset_id(5, 9), obd_snapset_id(5, 10));
    ck_assert_uint_ne(obd_snapset_id(5, 9), obd_snapset_id(6, 9));
    for (uint64_t s = 0; s < 1000; s++)
        ck_assert_uint_ne(obd_snapset_id(s * 7919, s), 0);
}
END_TEST

START_TEST(versions_compare_every_field)
{
    struct obd_efversion a = {1, 2, 3}, b = a;
    ck_assert(obd_efversion_equal(&a, &b));
    b.origin = 9;
    ck_assert(!obd_efversion_equal(&a, &b));
    b = a;
    b.applied = 9;
    ck_assert(!obd_efversion_equal(&a, &b));
    b = a;
    b.last_seq = 9;
    ck_assert(!obd_efversion_equal(&a, &b));
}
END_TEST

static Suite *snapset_suite(void)
{
    Suite *s = suite_create("snapset");
    TCase *tc = tcase_create("snapset");
    tcase_add_test(tc, set_round_trip_exact);
    tcase_add_test(tc, a_damaged_file_spoils_the_whole_set);
    tcase_add_test(tc, commit_prunes_and_start_removes_unfinished);
    tcase_add_test(tc, a_second_owner_is_refused_naming_the_first);
    tcase_add_test(tc, commit_keeps_the_committed_set_whatever_the_clock);
    tcase_add_test(tc, part_round_trip_and_refusals);
    tcase_add_test(tc, verdict_names_every_failing_node);
    tcase_add_test(tc, ids_agree_and_differ);
    tcase_add_test(tc, versions_compare_every_field);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return ck_run(snapset_suite());
}
