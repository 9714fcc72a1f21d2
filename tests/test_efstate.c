/* Error-feedback snapshots: exact round trip, and every kind of bad file
 * (truncated, a flipped byte, another world, not a snapshot, a header that
 * announces more than the bound, a FIFO, a symlink) is refused without
 * being loaded; a symlink planted at the temporary path is not written
 * through. */
#include <check.h>

#include "ck_run.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codec_ref.h"
#include "efstate.h"

static char dir[64];
static char path[256];
static char why[512];
static const struct obd_ef_world world = {3, 1, 0x1234567890abcdefull};
static const struct obd_ef_set set = {0x5151, 0x7777};

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/obcomm-ef-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    obd_ef_path(dir, "job/with slash", 42, path, sizeof(path));
}

static void teardown(void)
{
    unlink(path);
    rmdir(dir);
}

static struct obd_ef *sample(uint64_t count)
{
    struct obd_ef *ef = obd_ef_new("job/with slash", 42, count, 3);
    ck_assert_ptr_nonnull(ef);
    for (size_t i = 0; i < ef->padded; i++)
        ef->werr[i] = (float)i * 0.25f - 7.0f;
    for (size_t i = 0; i < ef->padded / 3; i++)
        ef->serr[i] = -(float)i;
    obd_ef_restored(ef);
    return ef;
}

static long file_size(void)
{
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    return (long)st.st_size;
}

START_TEST(round_trip_is_exact)
{
    static const uint64_t counts[] = {1, 9, 1000003};
    for (size_t k = 0; k < 3; k++) {
        struct obd_ef *ef = sample(counts[k]), *back = NULL;
        ck_assert_int_eq(
            obd_ef_write(path, ef, &world, &set, NULL, why, sizeof(why)), 0);
        ck_assert_int_eq(obd_ef_read(path, &world, &set, 1 << 30, &back, NULL,
                                     why, sizeof(why)),
                         0);
        ck_assert_str_eq(back->job, "job/with slash");
        ck_assert_uint_eq(back->key, 42);
        ck_assert_uint_eq(back->count, counts[k]);
        ck_assert_uint_eq(back->padded, ef->padded);
        ck_assert_int_eq(
            memcmp(back->werr, ef->werr, ef->padded * sizeof(float)), 0);
        ck_assert_int_eq(
            memcmp(back->serr, ef->serr, ef->padded / 3 * sizeof(float)), 0);
        obd_ef_free(ef);
        obd_ef_free(back);
    }
}
END_TEST

/* A state that took a lazy step holds (b, scale), not e: its snapshot is
 * the error e of the same step taken by the reference (codec_ref.h), byte
 * for byte, it restores as that error, and an abort leaves a state whose
 * snapshot is all zeros. */
START_TEST(lazy_step_snapshots_its_error)
{
    const uint64_t count = 1000003;
    struct obd_ef *ef = sample(count), *back = NULL;
    size_t N = ef->padded, C = N / 3;
    const struct obd_codec_impl *impl = obd_codec_best();
    float *x = malloc(count * sizeof(float));
    float *e = malloc(N * sizeof(float)), *se = malloc(C * sizeof(float));
    uint8_t *bits = malloc(N / 8), *want_bits = malloc(N / 8);
    for (size_t i = 0; i < count; i++)
        x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    memcpy(e, ef->werr, N * sizeof(float));
    memcpy(se, ef->serr, C * sizeof(float));

    float want, got;
    ck_assert_int_eq(codec_ref_compress(x, count, e, N, want_bits, &want), 0);
    struct obd_codec_lazy prev = obd_codec_lazy_state_prev(&ef->wl);
    const float *src[] = {x};
    ck_assert_int_eq(obd_codec_lazy_compress(impl, src, 1, count, &prev,
                                             obd_codec_lazy_state_next(&ef->wl),
                                             N, bits, &got),
                     0);
    obd_codec_lazy_state_commit(&ef->wl, got);
    ck_assert_int_eq(memcmp(&got, &want, sizeof(float)), 0);
    ck_assert_int_eq(memcmp(bits, want_bits, N / 8), 0);

    ck_assert_int_eq(
        obd_ef_write(path, ef, &world, &set, NULL, why, sizeof(why)), 0);
    ck_assert_int_eq(
        obd_ef_read(path, &world, &set, 1 << 30, &back, NULL, why, sizeof(why)),
        0);
    ck_assert_int_eq(back->wl.mode, OBD_CODEC_LAZY_EAGER);
    ck_assert_int_eq(memcmp(back->werr, e, N * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(back->serr, se, C * sizeof(float)), 0);
    obd_ef_free(back);

    /* A torn state aborted: both roles restart at zero. */
    obd_ef_abort(ef);
    ck_assert_int_eq(ef->wl.mode, OBD_CODEC_LAZY_ZERO);
    ck_assert_int_eq(ef->sl.mode, OBD_CODEC_LAZY_ZERO);
    ck_assert_int_eq(
        obd_ef_write(path, ef, &world, &set, NULL, why, sizeof(why)), 0);
    ck_assert_int_eq(
        obd_ef_read(path, &world, &set, 1 << 30, &back, NULL, why, sizeof(why)),
        0);
    float *zero = calloc(N, sizeof(float)); /* +0.0f */
    ck_assert_int_eq(memcmp(back->werr, zero, N * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(back->serr, zero, C * sizeof(float)), 0);
    free(zero);
    obd_ef_free(back);
    obd_ef_free(ef);
    free(x);
    free(e);
    free(se);
    free(bits);
    free(want_bits);
}
END_TEST

START_TEST(damaged_files_are_rejected)
{
    struct obd_ef *ef = sample(100000), *back = NULL;
    ck_assert_int_eq(
        obd_ef_write(path, ef, &world, &set, NULL, why, sizeof(why)), 0);
    long size = file_size();

    /* A flipped byte in the middle: the block checksum catches it. */
    int fd = open(path, O_RDWR);
    unsigned char byte;
    ck_assert_int_eq(pread(fd, &byte, 1, size / 2), 1);
    byte ^= 0x10;
    ck_assert_int_eq(pwrite(fd, &byte, 1, size / 2), 1);
    close(fd);
    ck_assert_int_eq(
        obd_ef_read(path, &world, &set, 1 << 30, &back, NULL, why, sizeof(why)),
        OBD_E_CORRUPT);
    ck_assert_ptr_null(back);
    ck_assert_ptr_nonnull(strstr(why, "not an intact snapshot"));

    /* Truncated at several points. */
    static const double cuts[] = {0.0, 0.01, 0.5, 0.99};
    for (size_t i = 0; i < 4; i++) {
        ck_assert_int_eq(
            obd_ef_write(path, ef, &world, &set, NULL, why, sizeof(why)), 0);
        ck_assert_int_eq(truncate(path, (off_t)(size * cuts[i])), 0);
        ck_assert_int_ne(obd_ef_read(path, &world, &set, 1 << 30, &back, NULL,
                                     why, sizeof(why)),
                         0);
        ck_assert_ptr_null(back);
    }

    /* Not a snapshot at all. */
    FILE *f = fopen(path, "w");
    fputs("this is not an lz4 frame", f);
    fclose(f);
    ck_assert_int_eq(
        obd_ef_read(path, &world, &set, 1 << 30, &back, NULL, why, sizeof(why)),
        OBD_E_CORRUPT);
    obd_ef_free(ef);
}
END_TEST

/* A FIFO named like a snapshot: refused at once (open would block for a
 * writer without O_NONBLOCK), and a symlink is not followed. */
START_TEST(only_regular_files_are_read)
{
    struct obd_ef *back = NULL;
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(
        obd_ef_read(path, &world, &set, 1 << 30, &back, NULL, why, sizeof(why)),
        OBD_E_IO);
    ck_assert_ptr_null(back);
    ck_assert_ptr_nonnull(strstr(why, "not a regular file"));
    unlink(path);

    char real[300];
    snprintf(real, sizeof(real), "%s/real", dir);
    struct obd_ef *ef = sample(9);
    ck_assert_int_eq(
        obd_ef_write(real, ef, &world, &set, NULL, why, sizeof(why)), 0);
    ck_assert_int_eq(symlink(real, path), 0);
    ck_assert_int_eq(
        obd_ef_read(path, &world, &set, 1 << 30, &back, NULL, why, sizeof(why)),
        OBD_E_IO);
    ck_assert_ptr_null(back);
    unlink(path);
    unlink(real);
    obd_ef_free(ef);
}
END_TEST

/* Somebody planted a symlink where the temporary file goes: it is removed,
 * never written through, and the snapshot lands in place. */
START_TEST(planted_temp_symlink_is_not_followed)
{
    char tmp[300], victim[300];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    snprintf(victim, sizeof(victim), "%s/victim", dir);
    FILE *f = fopen(victim, "w");
    ck_assert_ptr_nonnull(f);
    fputs("precious", f);
    fclose(f);
    ck_assert_int_eq(symlink(victim, tmp), 0);
    struct obd_ef *ef = sample(9), *back = NULL;
    ck_assert_int_eq(
        obd_ef_write(path, ef, &world, &set, NULL, why, sizeof(why)), 0);
    struct stat st;
    ck_assert_int_eq(stat(victim, &st), 0);
    ck_assert_int_eq(st.st_size, 8); /* untouched */
    ck_assert_int_eq(lstat(tmp, &st), -1);
    ck_assert_int_eq(
        obd_ef_read(path, &world, &set, 1 << 30, &back, NULL, why, sizeof(why)),
        0);
    ck_assert_mem_eq(back->werr, ef->werr, ef->padded * sizeof(float));
    obd_ef_free(back);
    obd_ef_free(ef);
    unlink(victim);
}
END_TEST

START_TEST(other_world_and_bound)
{
    struct obd_ef *ef = sample(1000), *back = NULL;
    ck_assert_int_eq(
        obd_ef_write(path, ef, &world, &set, NULL, why, sizeof(why)), 0);

    struct obd_ef_world other = world;
    other.nodes = 4;
    ck_assert_int_eq(
        obd_ef_read(path, &other, &set, 1 << 30, &back, NULL, why, sizeof(why)),
        OBD_E_OTHER_WORLD);
    ck_assert_ptr_nonnull(strstr(why, "rank 1 of a 3-node world"));
    other = world;
    other.rank = 2;
    ck_assert_int_eq(
        obd_ef_read(path, &other, &set, 1 << 30, &back, NULL, why, sizeof(why)),
        OBD_E_OTHER_WORLD);
    other = world;
    other.fingerprint++;
    ck_assert_int_eq(
        obd_ef_read(path, &other, &set, 1 << 30, &back, NULL, why, sizeof(why)),
        OBD_E_OTHER_WORLD);

    /* The header announces more than the bound: refused before any
     * allocation of that size. */
    ck_assert_int_eq(
        obd_ef_read(path, &world, &set, 1000, &back, NULL, why, sizeof(why)),
        OBD_E_CORRUPT);
    ck_assert_ptr_null(back);
    obd_ef_free(ef);
}
END_TEST

/* A file names its set in its checked header: read as a file of another
 * set or run it is refused; the digest is that of the file's bytes, the
 * same when written and when read. */
START_TEST(a_file_names_its_set)
{
    struct obd_ef *ef = sample(500), *back = NULL;
    uint8_t wrote[OBD_EF_DIGEST_BYTES], read[OBD_EF_DIGEST_BYTES];
    ck_assert_int_eq(
        obd_ef_write(path, ef, &world, &set, wrote, why, sizeof(why)), 0);
    struct obd_ef_set other = {set.run, set.id + 1};
    ck_assert_int_eq(obd_ef_read(path, &world, &other, 1 << 30, &back, NULL,
                                 why, sizeof(why)),
                     OBD_E_CORRUPT);
    ck_assert_ptr_nonnull(
        strstr(why, "a file of set 0000000000007777 of run 0000000000005151, "
                    "not of set 0000000000007778"));
    other = (struct obd_ef_set){set.run + 1, set.id};
    ck_assert_int_eq(obd_ef_read(path, &world, &other, 1 << 30, &back, NULL,
                                 why, sizeof(why)),
                     OBD_E_CORRUPT);
    ck_assert_ptr_null(back);
    ck_assert_int_eq(
        obd_ef_read(path, &world, &set, 1 << 30, &back, read, why, sizeof(why)),
        0);
    ck_assert_mem_eq(read, wrote, sizeof(read));
    obd_ef_free(back);
    back = NULL;
    /* NULL: a file of any set. */
    ck_assert_int_eq(
        obd_ef_read(path, &world, NULL, 1 << 30, &back, NULL, why, sizeof(why)),
        0);
    obd_ef_free(back);
    obd_ef_free(ef);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("efstate");
    TCase *tc = tcase_create("efstate");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, round_trip_is_exact);
    tcase_add_test(tc, lazy_step_snapshots_its_error);
    tcase_add_test(tc, damaged_files_are_rejected);
    tcase_add_test(tc, other_world_and_bound);
    tcase_add_test(tc, only_regular_files_are_read);
    tcase_add_test(tc, planted_temp_symlink_is_not_followed);
    tcase_add_test(tc, a_file_names_its_set);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
