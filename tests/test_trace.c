/* The timeline (trace_file): two real daemons trace an fp32 allreduce, a
 * 1-bit allreduce and a broadcast; after a clean shutdown each file is a
 * complete JSON array of Chrome trace events whose pid is the node's rank,
 * with every phase docs/operations.md ("Timeline") names, each inside its
 * op. */
#include <check.h>

#include "ck_run.h"
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

enum { COUNT = 1 << 20 };

static int trainer(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, COUNT * sizeof(float), (void **)&x))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    for (int i = 0; i < COUNT; i++)
        x[i] = (float)(i % 5) - 2.0f + 0.25f * (float)obcomm_rank(c);
    if (obcomm_allreduce(c, x, COUNT, OBCOMM_FLOAT32, OBCOMM_SUM))
        return hx_fail(c, "allreduce: %s", obcomm_last_error(c));
    if (obcomm_allreduce_1bit(c, 5, x, COUNT))
        return hx_fail(c, "1-bit: %s", obcomm_last_error(c));
    if (obcomm_broadcast(c, x, 4096, 0))
        return hx_fail(c, "broadcast: %s", obcomm_last_error(c));
    return 0;
}

/* The span named `name` on this node, or NULL. */
static json_object *find(json_object *arr, const char *name)
{
    for (size_t i = 0; i < json_object_array_length(arr); i++) {
        json_object *e = json_object_array_get_idx(arr, i), *n;
        if (json_object_object_get_ex(e, "name", &n) &&
            strcmp(json_object_get_string(n), name) == 0)
            return e;
    }
    return NULL;
}

static int64_t field(json_object *e, const char *key)
{
    json_object *v;
    ck_assert_msg(json_object_object_get_ex(e, key, &v), "no %s", key);
    return json_object_get_int64(v);
}

/* Every codec pass carries its thread's CPU time (args.cpu_us), which
 * cannot exceed the pass's wall time by more than the clock reads around
 * it; returns the passes' total CPU microseconds. */
static double codec_cpu_us(json_object *arr)
{
    double total = 0.0;

    for (size_t i = 0; i < json_object_array_length(arr); i++) {
        json_object *e = json_object_array_get_idx(arr, i), *cat, *args, *cpu;
        if (!json_object_object_get_ex(e, "cat", &cat) ||
            strcmp(json_object_get_string(cat), "codec") != 0)
            continue;
        ck_assert(json_object_object_get_ex(e, "args", &args));
        ck_assert_msg(json_object_object_get_ex(args, "cpu_us", &cpu),
                      "a codec pass without cpu_us");
        double us = json_object_get_double(cpu);
        double dur = json_object_get_double(json_object_object_get(e, "dur"));
        ck_assert_msg(us >= 0.0 && us <= dur + 100.0,
                      "cpu_us %.1f against dur %.1f", us, dur);
        total += us;
    }
    return total;
}

START_TEST(every_phase_is_on_the_timeline)
{
    char dir[] = "/tmp/obcomm-trace-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char t0[128], t1[128];
    snprintf(t0, sizeof(t0), "%s/node0.json", dir);
    snprintf(t1, sizeof(t1), "%s/node1.json", dir);
    /* 256 KiB segments: the 4 MiB ops are 16 segments, enough for the
     * ring's reductions to go to the pool (coll.h). */
    const char *f0[] = {"--trace_file", t0, "--segment_bytes", "262144", NULL};
    const char *f1[] = {"--trace_file", t1, "--segment_bytes", "262144", NULL};
    const char *const *each[] = {f0, f1};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start_each(&cl, 2, each), 0);
    int failed = hx_run(&cl, 2, "traced", 20000, 120, trainer, NULL);
    ck_assert_int_eq(hx_stop(&cl), 0); /* closes the files */
    ck_assert_int_eq(failed, 0);

    static const char *const phases[] = {"matching",
                                         "ring allreduce",
                                         "local reduce",
                                         "1-bit allreduce",
                                         "compress",
                                         "parameter-server send",
                                         "server step",
                                         "allgather",
                                         "decompress",
                                         "completion",
                                         "chain broadcast",
                                         "worker pass",
                                         "server pass",
                                         "decode",
                                         "load",
                                         "reduce",
                                         "store"};
    const char *files[] = {t0, t1};
    for (int node = 0; node < 2; node++) {
        json_object *arr = json_object_from_file(files[node]);
        ck_assert_msg(arr != NULL && json_object_is_type(arr, json_type_array),
                      "%s is not a JSON array", files[node]);
        for (size_t i = 1; i < json_object_array_length(arr); i++) {
            json_object *e = json_object_array_get_idx(arr, i), *ph;
            ck_assert_int_eq(field(e, "pid"), node);
            ck_assert(json_object_object_get_ex(e, "ph", &ph));
            if (strcmp(json_object_get_string(ph), "X") == 0)
                ck_assert_int_ge(field(e, "dur"), 0);
        }
        for (size_t p = 0; p < sizeof(phases) / sizeof(phases[0]); p++)
            ck_assert_msg(find(arr, phases[p]) != NULL, "node %d: no '%s'",
                          node, phases[p]);
        /* The 1-bit steps lie inside the 1-bit op. */
        json_object *op = find(arr, "1-bit allreduce");
        int64_t b = field(op, "ts"), e = b + field(op, "dur") + 1;
        static const char *const inner[] = {"compress", "server step",
                                            "decompress"};
        for (int k = 0; k < 3; k++) {
            json_object *s = find(arr, inner[k]);
            ck_assert_int_ge(field(s, "ts"), b);
            ck_assert_int_le(field(s, "ts") + field(s, "dur"), e);
        }
        double cpu = codec_cpu_us(arr);
        ck_assert_msg(cpu > 0.0, "node %d: codec passes took no CPU", node);
        printf("node %d: %zu trace events, every phase present, codec "
               "passes %.0f us of CPU\n",
               node, json_object_array_length(arr), cpu);
        json_object_put(arr);
        unlink(files[node]);
    }
    rmdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("trace");
    TCase *tc = tcase_create("trace");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, every_phase_is_on_the_timeline);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
