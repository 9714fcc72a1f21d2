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
/* Set `id` of run 0x77. */
#define SET(id) (&(const struct obd_ef_set){0x77, (id)})

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
        obd_snapset_write(dir, "j", SET(42), efs, 3, &world, why, sizeof(why)),
        0);
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
        obd_snapset_write(dir, "j", SET(43), efs, 0, &world, why, sizeof(why)),
        0);
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
        obd_snapset_write(dir, "j", SET(7), efs, 2, &world, why, sizeof(why)),
        0);
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
        obd_snapset_write(dir, "j", SET(8), efs, 2, &world, why, sizeof(why)),
        0);
    file_of(8, 1, path, sizeof(path));
    ck_assert_int_eq(truncate(path, 40), 0);
    ck_assert_int_eq(
        obd_snapset_read(dir, "j", 8, &world, 1 << 30, &list, why, sizeof(why)),
        OBD_E_CORRUPT);

    ck_assert_int_eq(
        obd_snapset_write(dir, "j", SET(9), efs, 2, &world, why, sizeof(why)),
        0);
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
        ck_assert_int_eq(obd_snapset_write(dir, "j", SET(id), efs, 1, &world,
                                           why, sizeof(why)),
                         0);
        obd_snapset_commit(dir, "j", id, 3, 0);
        /* Commit stamps the set with the current time; within one clock
         * tick sets would tie. Each set gets its own time instead, in
         * commit order and all in the past, so the next commit's "now"
         * is the newest. */
        set_time(id, (time_t)(1000000000 + id));
    }
    struct obd_ef *kefs[1] = {state("k", 1, 100)};
    ck_assert_int_eq(
        obd_snapset_write(dir, "k", SET(1), kefs, 1, &world, why, sizeof(why)),
        0);
    obd_ef_free(kefs[0]);
    obd_snapset_commit(dir, "k", 1, 3, 0);
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
        ck_assert_int_eq(obd_snapset_write(dir, "j", SET(id), efs, 1, &world,
                                           why, sizeof(why)),
                         0);
        if (id < 5)
            set_time(id, (time_t)4000000000 + (time_t)id); /* year 2096 */
    }
    obd_snapset_commit(dir, "j", 5, 3, 0);
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

static void copy_file(const char *from, const char *to)
{
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "cp -f '%s' '%s'", from, to);
    ck_assert_int_eq(system(cmd), 0);
}

/* Reads set `id` of "j", which must be refused as damaged with why
 * naming `file` and `what`; no state comes back. */
static void refused(uint64_t id, const char *file, const char *what)
{
    char why[1024];
    struct obd_ef *list = (struct obd_ef *)0x1;
    int rc = obd_snapset_read(dir, "j", id, &world, 1 << 30, &list, why,
                              sizeof(why));
    ck_assert_msg(rc == OBD_E_CORRUPT, "rc %d: %s", rc, why);
    ck_assert_ptr_eq(list, (struct obd_ef *)0x1);
    char want[1200];
    snprintf(want, sizeof(want), "damaged: %s: %s", file, what);
    ck_assert_msg(strstr(why, want) != NULL, "got \"%s\", want \"%s\"", why,
                  want);
}

/* Writes set `id` of "j" with keys 1-3, their errors shifted by `salt`. */
static void write_set(uint64_t id, float salt)
{
    struct obd_ef *efs[3];
    for (int k = 0; k < 3; k++) {
        efs[k] = state("j", (uint64_t)k + 1, 3000);
        efs[k]->werr[0] = salt;
        obd_ef_restored(efs[k]);
    }
    char why[512];
    ck_assert_int_eq(
        obd_snapset_write(dir, "j", SET(id), efs, 3, &world, why, sizeof(why)),
        0);
    for (int k = 0; k < 3; k++)
        obd_ef_free(efs[k]);
}

/* A set is whole and of one snapshot, or refused naming the file: one
 * key's file from another set of the job (as a partial restore of a
 * backup leaves it), another set's manifest, a file of the same set id
 * written another time, a file missing, a file added, the manifest
 * missing or damaged. The untouched set reads back. */
START_TEST(a_set_is_whole_and_of_one_snapshot_or_refused)
{
    make_dir();
    char x[512], y[512], aside[512], path[600];
    write_set(20, 1.5f);
    file_of(20, 2, x, sizeof(x));
    file_of(21, 2, y, sizeof(y));
    char ydir[300];
    snprintf(ydir, sizeof(ydir), "%s/set-6a-%016llx", dir, 21ull);

    write_set(21, 2.5f);
    copy_file(x, y);
    refused(21, y,
            "a file of set 0000000000000014 of run 0000000000000077, not of "
            "set 0000000000000015");

    write_set(21, 2.5f);
    snprintf(path, sizeof(path), "%s/manifest", ydir);
    char xman[600];
    snprintf(xman, sizeof(xman), "%s/set-6a-%016llx/manifest", dir, 20ull);
    copy_file(xman, path);
    refused(21, path, "the manifest of set 0000000000000014");

    /* Set 21 written twice: the first time's file of key 2 has the right
     * header but is not the file the second manifest lists. */
    write_set(21, 7.5f);
    snprintf(aside, sizeof(aside), "%s/key2-aside", dir);
    copy_file(y, aside);
    write_set(21, 2.5f);
    copy_file(aside, y);
    refused(21, y, "not the file the set was written with");

    write_set(21, 2.5f);
    file_of(21, 3, path, sizeof(path));
    ck_assert_int_eq(unlink(path), 0);
    refused(21, path, "missing (named in the set's manifest)");

    write_set(21, 2.5f);
    snprintf(path, sizeof(path), "%s/ef-extra.lz4", ydir);
    copy_file(y, path);
    refused(21, path, "not in the set's manifest");

    write_set(21, 2.5f);
    snprintf(path, sizeof(path), "%s/manifest", ydir);
    ck_assert_int_eq(unlink(path), 0);
    refused(21, path, "missing (every set holds one)");

    write_set(21, 2.5f);
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, 100, SEEK_SET);
    fputc(0x5a, f);
    fclose(f);
    refused(21, path, "its digest does not match");

    /* Another node's manifest (and files): refused as such. */
    write_set(21, 2.5f);
    struct obd_ef_world node0 = world;
    node0.rank = 0;
    char why[512];
    struct obd_ef *list = NULL;
    ck_assert_int_eq(obd_snapset_read(dir, "j", 21, &node0, 1 << 30, &list, why,
                                      sizeof(why)),
                     OBD_E_CORRUPT);
    ck_assert_ptr_nonnull(strstr(why, "of node 1 of a 2-node world"));

    ck_assert_int_eq(obd_snapset_read(dir, "j", 21, &world, 1 << 30, &list, why,
                                      sizeof(why)),
                     0);
    ck_assert_int_eq(count_list(list), 3);
    for (struct obd_ef *ef = list; ef; ef = ef->next) {
        float e;
        obd_ef_error(ef, 0, &e, 0, 1);
        ck_assert_float_eq(e, 2.5f);
    }
    free_list(list);
    list = NULL;
    ck_assert_int_eq(obd_snapset_read(dir, "j", 20, &world, 1 << 30, &list, why,
                                      sizeof(why)),
                     0);
    ck_assert_int_eq(count_list(list), 3);
    free_list(list);
    remove_dir();
}
END_TEST

/* The time of set `id` of the job whose name is `hex` in hex. */
static void set_time_of(const char *hex, uint64_t id, time_t sec)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/set-%s-%016llx", dir, hex,
             (unsigned long long)id);
    struct timespec when[2] = {{sec, 0}, {sec, 0}};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, when, 0), 0);
}

static int sets_in_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "ls -d %s/set-* 2>/dev/null | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

/* state_dir is bounded across jobs: past max_bytes the jobs whose newest
 * set is oldest go, whole; the committing job stays even when it is the
 * oldest; each job still keeps its newest `keep`. */
START_TEST(commit_bounds_every_job_together)
{
    make_dir();
    struct obd_ef *efs[1] = {state("a", 1, 1000)};
    char why[512], job[2] = "a", hex[3];
    /* One set's bytes: its files. */
    ck_assert_int_eq(
        obd_snapset_write(dir, "a", SET(1), efs, 1, &world, why, sizeof(why)),
        0);
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "du -sb --apparent-size %s/set-61-*/* | "
             "awk '{s += $1} END {print s}'",
             dir);
    FILE *p = popen(cmd, "r");
    long one = 0;
    ck_assert_int_eq(fscanf(p, "%ld", &one), 1);
    pclose(p);
    ck_assert_int_gt(one, 0);
    obd_snapset_delete(dir, "a", 1);
    obd_ef_free(efs[0]);
    /* 100 job names, one set each, every set's name and files distinct:
     * at most 3 sets' bytes stay, the newest jobs'. */
    uint64_t bound = (uint64_t)one * 3 + (uint64_t)one / 2;
    for (int j = 0; j < 100; j++) {
        char name[8];
        snprintf(name, sizeof(name), "job%02d", j);
        struct obd_ef *e[1] = {state(name, 1, 1000)};
        ck_assert_int_eq(obd_snapset_write(dir, name, SET(1), e, 1, &world, why,
                                           sizeof(why)),
                         0);
        obd_ef_free(e[0]);
        obd_snapset_commit(dir, name, 1, 4, bound);
        char h[16];
        snprintf(h, sizeof(h), "6a6f62%02x%02x", name[3], name[4]);
        set_time_of(h, 1, (time_t)(1000000000 + j));
        ck_assert_int_le(sets_in_dir(), 3);
    }
    for (int j = 0; j < 100; j++) {
        char name[8];
        snprintf(name, sizeof(name), "job%02d", j);
        struct obd_ef *list = NULL;
        int rc = obd_snapset_read(dir, name, 1, &world, 1 << 30, &list, why,
                                  sizeof(why));
        ck_assert_int_eq(rc, j >= 97 ? 0 : OBD_E_MISSING);
        free_list(list);
    }
    /* The oldest job commits: it stays, the others make room. */
    struct obd_ef *e[1] = {state("job00", 1, 1000)};
    ck_assert_int_eq(
        obd_snapset_write(dir, "job00", SET(2), e, 1, &world, why, sizeof(why)),
        0);
    obd_ef_free(e[0]);
    set_time_of("6a6f623030", 2, (time_t)999999999);
    obd_snapset_commit(dir, "job00", 2, 4, bound);
    struct obd_ef *list = NULL;
    ck_assert_int_eq(obd_snapset_read(dir, "job00", 2, &world, 1 << 30, &list,
                                      why, sizeof(why)),
                     0);
    free_list(list);
    ck_assert_int_le(sets_in_dir(), 3);
    (void)job;
    (void)hex;
    remove_dir();
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
    tcase_add_test(tc, a_set_is_whole_and_of_one_snapshot_or_refused);
    tcase_add_test(tc, commit_bounds_every_job_together);
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
