/* Tests of daemon/onebit_task.c's AVERAGE pass, the one-node 1-bit op: in
 * pieces of whole blocks as coll_onebit.c queues them, it must leave in
 * every trainer's buffer exactly what obd_reduce_load and
 * obd_reduce_store_many with OBCOMM_AVG compute over the whole tensor
 * (onebit_task.h), bit for bit. The inputs put NaNs of different payloads
 * on several trainers at the same element, also among the last count % 16
 * elements, where reduce.c's two-source load adds in the other order
 * from its vector body: which payload a sum of two NaNs keeps is where a
 * different split or kernel would show. And it reports exactly the bytes
 * it wrote: with one trainer only the blocks that hold a NaN.
 */
#include <check.h>

#include "ck_run.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "onebit_task.h"
#include "reduce.h"

#define EXPECT(cond, ...)              \
    do {                               \
        if (!(cond)) {                 \
            ck_abort_msg(__VA_ARGS__); \
        }                              \
    } while (0)

#define MAX_LS 5

static const uint32_t specials[] = {0x7f800001u, 0xff812345u, 0x7fc00123u,
                                    0xffc54321u, 0x7f800000u, 0xff800000u,
                                    0x80000000u, 0x00000001u};
#define NSPECIALS (sizeof(specials) / sizeof(specials[0]))

static uint64_t next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Trainer t's input: random floats in [-1, 1), a special float every
 * 61st element and at the last three, different on each trainer, or none
 * (nan = 0: finite values only). */
static void fill(float *x, size_t count, int t, int nan, uint64_t seed)
{
    for (size_t i = 0; i < count; i++) {
        uint64_t r = next(&seed);
        x[i] = (float)((double)(r >> 40) / 8388608.0 - 1.0);
        if (nan && (i % 61 == 0 || i + 3 >= count)) {
            uint32_t u = specials[(i / 61 + i + (size_t)t) % NSPECIALS];
            memcpy(&x[i], &u, sizeof(u));
        }
    }
}

static int has_nan(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (x[i] != x[i])
            return 1;
    return 0;
}

/* Runs the pass over count elements of ls trainers in `parts` pieces of
 * whole blocks and checks the buffers and the bytes written. */
static void check_average(size_t count, int ls, size_t parts, int nan)
{
    float *in[MAX_LS], *got[MAX_LS], *want[MAX_LS];
    float *acc = malloc(count * sizeof(float));
    ck_assert_ptr_nonnull(acc);
    for (int t = 0; t < ls; t++) {
        in[t] = malloc(count * sizeof(float));
        got[t] = malloc(count * sizeof(float));
        want[t] = malloc(count * sizeof(float));
        ck_assert(in[t] && got[t] && want[t]);
        fill(in[t], count, t, nan, 0x9e3779b97f4a7c15ull * (uint64_t)(t + 1));
        memcpy(got[t], in[t], count * sizeof(float));
    }
    obd_reduce_load(OBCOMM_FLOAT32, OBCOMM_SUM, acc, (const void *const *)in,
                    ls, count);
    obd_reduce_store_many(OBCOMM_FLOAT32, OBCOMM_AVG, (void *const *)want, ls,
                          acc, count, ls);

    struct obd_onebit_ctx ctx = {.n = 1, .ls = ls, .count = count, .dst = got};
    size_t blocks = (count + OBD_ONEBIT_AVG_BLOCK - 1) / OBD_ONEBIT_AVG_BLOCK;
    size_t unit = (blocks + parts - 1) / parts * OBD_ONEBIT_AVG_BLOCK;
    size_t written = 0;
    for (size_t b = 0; b < count; b += unit) {
        struct obd_onebit_task task = {.pass = OBD_ONEBIT_AVERAGE,
                                       .begin = b,
                                       .end =
                                           count - b < unit ? count : b + unit};
        obd_onebit_task_run(&ctx, &task);
        written += task.written;
    }

    size_t want_written = 0;
    if (ls > 1)
        want_written = (size_t)ls * count * sizeof(float);
    else
        for (size_t b = 0; b < count; b += OBD_ONEBIT_AVG_BLOCK) {
            size_t n = count - b < OBD_ONEBIT_AVG_BLOCK ? count - b
                                                        : OBD_ONEBIT_AVG_BLOCK;
            if (has_nan(in[0] + b, n))
                want_written += n * sizeof(float);
        }
    for (int t = 0; t < ls; t++) {
        for (size_t i = 0; i < count; i++)
            EXPECT(memcmp(&got[t][i], &want[t][i], sizeof(float)) == 0,
                   "count %zu, %d trainers, %zu parts: trainer %d element "
                   "%zu differs",
                   count, ls, parts, t, i);
        free(in[t]);
        free(got[t]);
        free(want[t]);
    }
    free(acc);
    ck_assert_uint_eq(written, want_written);
}

static const size_t counts[] = {1, 15, 367, 2048, 2063, 65759, 999791};

START_TEST(average_is_load_and_store)
{
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
        for (int ls = 1; ls <= MAX_LS; ls++)
            for (size_t parts = 1; parts <= 4; parts += 3)
                check_average(counts[c], ls, parts, 1);
}
END_TEST

/* One trainer and no NaN: the division by 1 changes nothing, so nothing
 * is written. */
START_TEST(one_trainer_without_nan_writes_nothing)
{
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
        check_average(counts[c], 1, 4, 0);
}
END_TEST

Suite *onebit_task_suite(void)
{
    Suite *s = suite_create("onebit_task");
    TCase *tc = tcase_create("average");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, average_is_load_and_store);
    tcase_add_test(tc, one_trainer_without_nan_writes_nothing);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return ck_run(onebit_task_suite());
}
