/* The non-blocking API (obcomm_i*, obcomm_test, obcomm_wait,
 * obcomm_request_free, obcomm_fd) against real daemons on loopback;
 * test_nbapi_fake.c holds it to a scripted daemon.
 *
 * The contract, one test each:
 * a. every non-blocking call gives the blocking call's exact result
 *    (world sizes 1x1 to 3x2); a 1-bit allreduce gives bit for bit what
 *    the blocking one gives on a fresh key (with one node: the exact
 *    average); a finished request tests and waits again with the same
 *    status and "" as its message.
 * b. 40 ops in flight (past OBCOMM_MAX_INFLIGHT): the 33rd submission
 *    waits for the first, every result is exact, waited for in reverse
 *    and in a scattered order.
 * c. requests freed while in flight: the ops still complete (their
 *    buffers hold exact results), later ops are exact.
 * d. obcomm_close with requests in flight: each is done with
 *    OBCOMM_E_PEER_LOST, "the handle was closed with the op in flight",
 *    whatever is done with it afterwards (test, wait, free, or a free
 *    before the close); nothing leaks (the test process itself holds the
 *    handles, so LeakSanitizer checks it).
 * e. obcomm_test polled to completion over poll() on obcomm_fd.
 * f. blocking calls (collectives, obcomm_alloc, the 1-bit state ops)
 *    while requests are in flight, and at the cap: all exact.
 * g. arguments refused before anything is sent (no seq taken: the next
 *    op is exact), *req untouched; allgather and reduce-scatter included.
 * h. the daemon dies with requests in flight (SIGKILL, or SIGTERM with
 *    its goodbye): each is done with OBCOMM_E_PEER_LOST naming the
 *    daemon's socket, whether it shut down cleanly or vanished, and what
 *    to run; the handle then refuses every op.
 * i. allgather and reduce-scatter end to end, blocking and not, in place
 *    and not, every dtype: NEEDS THE DAEMON'S SIDE of
 *    OBCOMM_KIND_ALLGATHER and OBCOMM_KIND_REDUCE_SCATTER. Run by
 *    `test_nbapi gather` (meson test nbapi_gather, registered once
 *    daemon/ctl.c accepts those kinds); never part of the default run. */
#include <check.h>

#include "ck_run.h"
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define TIMEOUT_MS 60000
#define CLOSED_MSG "the handle was closed with the op in flight"

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* World shapes: nodes x trainers per node. */
static const int shapes[][2] = {{1, 1}, {1, 2}, {2, 1}, {2, 2}, {3, 1}, {3, 2}};

/* Connects the test process itself as local rank lr of ls on node 0. */
static obcomm_t *join_here(struct hx_cluster *cl, const char *job, int lr,
                           int ls, int timeout_ms)
{
    obcomm_options_t o = {.socket_path = cl->sock[0],
                          .job = job,
                          .local_rank = lr,
                          .local_size = ls,
                          .timeout_ms = timeout_ms};
    obcomm_t *c = NULL;
    int rc = obcomm_connect(&o, &c);
    ck_assert_msg(rc == 0, "connect: %s", obcomm_last_error(NULL));
    return c;
}

/* Runs fn as the only trainer of a one-node job in the test process, so
 * that LeakSanitizer sees everything it allocated. */
static void run_here(hx_trainer_fn fn, void *arg)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    obcomm_t *c = join_here(&cl, "here", 0, 1, TIMEOUT_MS);
    int rc = fn(c, arg);
    obcomm_close(c);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(rc, 0);
}

static void run_shape(int i, const char *job, hx_trainer_fn fn, void *arg)
{
    struct hx_cluster cl;
    int nodes = shapes[i][0], per = shapes[i][1];
    ck_assert_int_eq(hx_start(&cl, nodes, NULL), 0);
    int failed = hx_run(&cl, per, job, TIMEOUT_MS, 300, fn, arg);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_msg(failed == 0, "%d of %d trainers failed (%d nodes x %d)",
                  failed, nodes * per, nodes, per);
}

/* Waits for r and checks that it succeeded, then that test and wait say
 * the same again. */
static int settled_ok(obcomm_t *c, obcomm_request_t *r, const char *what)
{
    int rc = obcomm_wait(r);
    if (rc != 0)
        return hx_fail(c, "%s: %s: %s", what, obcomm_strerror(rc),
                       obcomm_request_error(r));
    int done = -1;
    rc = obcomm_test(r, &done);
    if (rc != 0 || done != 1 || obcomm_wait(r) != 0 ||
        strcmp(obcomm_request_error(r), "") != 0)
        return hx_fail(c, "%s: test %d done %d, wait again %d, error '%s'",
                       what, rc, done, obcomm_wait(r), obcomm_request_error(r));
    return 0;
}

/* ---- a. every call ---- */

#define EVERY_N 1001

static float onebit_input(int rank, size_t i)
{
    return (float)((int)((i * 31 + (size_t)rank * 17) % 23) - 11) / 8.0f;
}

static int trainer_every(obcomm_t *c, void *arg)
{
    const int *nodes = arg;
    const size_t n = EVERY_N;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    float *a, *d1, *d2;
    int64_t *b;
    uint8_t *bc;
    if (obcomm_alloc(c, n * 4, (void **)&a) ||
        obcomm_alloc(c, n * 8, (void **)&b) ||
        obcomm_alloc(c, n, (void **)&bc) ||
        obcomm_alloc(c, n * 4, (void **)&d1) ||
        obcomm_alloc(c, n * 4, (void **)&d2))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    for (size_t i = 0; i < n; i++) {
        a[i] = (float)(rank + 1 + (int)(i % 5));
        b[i] = (int64_t)rank * 1000 + (int64_t)i;
        bc[i] = rank == size - 1 ? (uint8_t)(i * 7 + 3) : 0;
        d1[i] = d2[i] = onebit_input(rank, i);
    }

    obcomm_request_t *r[5] = {0};
    int rc = obcomm_iallreduce(c, a, n, OBCOMM_FLOAT32, OBCOMM_SUM, &r[0]);
    if (rc == 0)
        rc = obcomm_iallreduce(c, b, n, OBCOMM_INT64, OBCOMM_MAX, &r[1]);
    if (rc == 0)
        rc = obcomm_ibroadcast(c, bc, n, size - 1, &r[2]);
    if (rc == 0)
        rc = obcomm_iallreduce_1bit(c, 11, d1, n, &r[3]);
    if (rc == 0)
        rc = obcomm_ibarrier(c, &r[4]);
    if (rc != 0)
        return hx_fail(c, "submit: %s", obcomm_last_error(c));
    static const char *const what[] = {"iallreduce", "iallreduce int64",
                                       "ibroadcast", "iallreduce_1bit",
                                       "ibarrier"};
    for (int k = 0; k < 5; k++)
        if (settled_ok(c, r[k], what[k]))
            return 1;
    for (int k = 0; k < 5; k++)
        obcomm_request_free(r[k]);

    for (size_t i = 0; i < n; i++) {
        float want = (float)(size * (size + 1) / 2 + size * (int)(i % 5));
        if (a[i] != want)
            return hx_fail(c, "iallreduce a[%zu] = %g, want %g", i, a[i], want);
        if (b[i] != (int64_t)(size - 1) * 1000 + (int64_t)i)
            return hx_fail(c, "iallreduce max b[%zu] = %lld", i,
                           (long long)b[i]);
        if (bc[i] != (uint8_t)(i * 7 + 3))
            return hx_fail(c, "ibroadcast byte %zu = %u", i, bc[i]);
    }
    /* The same inputs through the blocking call on a fresh key: the
     * daemons' state and arithmetic are the same, so the result is too. */
    if (obcomm_allreduce_1bit(c, 12, d2, n))
        return hx_fail(c, "allreduce_1bit: %s", obcomm_last_error(c));
    if (memcmp(d1, d2, n * 4) != 0)
        return hx_fail(c, "iallreduce_1bit differs from allreduce_1bit");
    if (*nodes == 1)
        for (size_t i = 0; i < n; i++) {
            float sum = 0;
            for (int k = 0; k < size; k++)
                sum += onebit_input(k, i);
            /* Eighths summed over at most 2 ranks, halved: exact. */
            if (d1[i] != sum / (float)size)
                return hx_fail(c, "1-bit on one node d[%zu] = %g, want %g", i,
                               d1[i], sum / (float)size);
        }
    return 0;
}

START_TEST(every_call_exact)
{
    int nodes = shapes[_i][0];
    run_shape(_i, "every", trainer_every, &nodes);
}
END_TEST

START_TEST(every_call_exact_here)
{
    int nodes = 1;
    run_here(trainer_every, &nodes);
}
END_TEST

/* ---- b. many in flight ---- */

#define MANY 40

static size_t many_count(int k)
{
    return 101 + 2 * (size_t)k;
}

static size_t many_offset(int k)
{
    size_t off = 0;
    for (int j = 0; j < k; j++)
        off += many_count(j);
    return off;
}

static int32_t many_value(int rank, int k, size_t i)
{
    return rank * 3 + k + (int32_t)(i % 7);
}

/* Submits op k of the many-ops pattern. */
static int many_submit(obcomm_t *c, int32_t *x, int k, obcomm_request_t **r)
{
    int rank = obcomm_rank(c);
    int32_t *p = x + many_offset(k);
    for (size_t i = 0; i < many_count(k); i++)
        p[i] = many_value(rank, k, i);
    int rc =
        obcomm_iallreduce(c, p, many_count(k), OBCOMM_INT32, OBCOMM_SUM, r);
    if (rc)
        return hx_fail(c, "iallreduce %d: %s", k, obcomm_last_error(c));
    return 0;
}

static int many_check(obcomm_t *c, const int32_t *x, int k)
{
    int size = obcomm_size(c);
    const int32_t *p = x + many_offset(k);
    for (size_t i = 0; i < many_count(k); i++) {
        int32_t want = 3 * size * (size - 1) / 2 + size * (k + (int)(i % 7));
        if (p[i] != want)
            return hx_fail(c, "op %d element %zu = %d, want %d", k, i, p[i],
                           want);
    }
    return 0;
}

/* Wait orders: reverse, then every 7th (mod MANY). */
static int many_order(int pass, int j)
{
    return pass == 0 ? MANY - 1 - j : (j * 7) % MANY;
}

static int trainer_many(obcomm_t *c, void *arg)
{
    (void)arg;
    int32_t *x;
    if (obcomm_alloc(c, many_offset(MANY) * 4, (void **)&x))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    for (int pass = 0; pass < 2; pass++) {
        obcomm_request_t *r[MANY];
        for (int k = 0; k < MANY; k++) {
            if (many_submit(c, x, k, &r[k]))
                return 1;
            if (k == OBCOMM_MAX_INFLIGHT) {
                /* This submission found the cap reached and waited for
                 * the oldest. */
                int done = 0, rc = obcomm_test(r[0], &done);
                if (rc != 0 || done != 1)
                    return hx_fail(c, "op 0 at the cap: rc %d done %d", rc,
                                   done);
            }
        }
        for (int j = 0; j < MANY; j++) {
            int k = many_order(pass, j);
            char what[32];
            snprintf(what, sizeof(what), "op %d", k);
            if (settled_ok(c, r[k], what) || many_check(c, x, k))
                return 1;
        }
        for (int k = 0; k < MANY; k++)
            obcomm_request_free(r[k]);
    }
    return 0;
}

START_TEST(many_in_flight_exact)
{
    run_shape(_i == 0 ? 3 : 5, "many", trainer_many, NULL);
}
END_TEST

START_TEST(many_in_flight_exact_here)
{
    run_here(trainer_many, NULL);
}
END_TEST

/* ---- c. free without wait ---- */

static int trainer_orphans(obcomm_t *c, void *arg)
{
    (void)arg;
    int32_t *x;
    if (obcomm_alloc(c, many_offset(MANY) * 4, (void **)&x))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    obcomm_request_t *r[6];
    for (int k = 0; k < 6; k++) {
        if (many_submit(c, x, k, &r[k]))
            return 1;
        if (k % 2 == 0)
            obcomm_request_free(r[k]);
    }
    /* The daemon completes a job's ops in seq order: once op 5 is done,
     * so are the freed ones before it. */
    for (int k = 1; k < 6; k += 2) {
        if (settled_ok(c, r[k], "kept op"))
            return 1;
        obcomm_request_free(r[k]);
    }
    for (int k = 0; k < 6; k++)
        if (many_check(c, x, k))
            return 1;
    /* Later ops, blocking and not, are exact. */
    for (int k = 6; k < 16; k++) {
        int32_t *p = x + many_offset(k);
        for (size_t i = 0; i < many_count(k); i++)
            p[i] = many_value(obcomm_rank(c), k, i);
        if (obcomm_allreduce(c, p, many_count(k), OBCOMM_INT32, OBCOMM_SUM))
            return hx_fail(c, "allreduce %d: %s", k, obcomm_last_error(c));
        if (many_check(c, x, k))
            return 1;
    }
    /* Orphans still in flight when the handle closes. */
    for (int k = 16; k < 19; k++) {
        if (many_submit(c, x, k, &r[0]))
            return 1;
        obcomm_request_free(r[0]);
    }
    return 0;
}

START_TEST(free_without_wait)
{
    run_shape(_i == 0 ? 2 : 1, "orphans", trainer_orphans, NULL);
}
END_TEST

START_TEST(free_without_wait_here)
{
    run_here(trainer_orphans, NULL);
}
END_TEST

/* ---- d. close with requests in flight ---- */

/* The ops of a job whose second trainer never joins stay in flight. */
static void submit_three(obcomm_t *c, void *buf, obcomm_request_t **r)
{
    ck_assert_int_eq(
        obcomm_iallreduce(c, buf, 16, OBCOMM_FLOAT32, OBCOMM_SUM, &r[0]), 0);
    ck_assert_int_eq(obcomm_ibroadcast(c, buf, 64, 0, &r[1]), 0);
    ck_assert_int_eq(obcomm_ibarrier(c, &r[2]), 0);
    for (int k = 0; k < 3; k++) {
        int done = -1;
        ck_assert_int_eq(obcomm_test(r[k], &done), 0);
        ck_assert_int_eq(done, 0);
        ck_assert_str_eq(obcomm_request_error(r[k]), "");
    }
}

static void assert_closed(obcomm_request_t *r)
{
    int done = -1;
    ck_assert_int_eq(obcomm_test(r, &done), OBCOMM_E_PEER_LOST);
    ck_assert_int_eq(done, 1);
    ck_assert_str_eq(obcomm_request_error(r), CLOSED_MSG);
    ck_assert_int_eq(obcomm_wait(r), OBCOMM_E_PEER_LOST);
}

/* _i: what happens around the close.
 * 0: close, then test, wait and free each request;
 * 1: free one before the close (an orphan), wait one after, free one
 *    without looking;
 * 2: free all before the close;
 * 3: close, then free all without looking. */
START_TEST(close_with_requests_in_flight)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    char job[16];
    snprintf(job, sizeof(job), "close%d", _i);
    obcomm_t *c = join_here(&cl, job, 0, 2, TIMEOUT_MS);
    void *buf;
    ck_assert_int_eq(obcomm_alloc(c, 4096, &buf), 0);
    obcomm_request_t *r[3];
    submit_three(c, buf, r);
    switch (_i) {
    case 0:
        obcomm_close(c);
        for (int k = 0; k < 3; k++) {
            assert_closed(r[k]);
            obcomm_request_free(r[k]);
        }
        break;
    case 1:
        obcomm_request_free(r[1]);
        obcomm_close(c);
        assert_closed(r[0]);
        obcomm_request_free(r[0]);
        obcomm_request_free(r[2]);
        break;
    case 2:
        for (int k = 0; k < 3; k++)
            obcomm_request_free(r[k]);
        obcomm_close(c);
        break;
    case 3:
        obcomm_close(c);
        for (int k = 0; k < 3; k++)
            obcomm_request_free(r[k]);
        break;
    }
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* ---- e. test() polled to completion ---- */

#define POLL_N ((size_t)1 << 20)

static int trainer_poll(obcomm_t *c, void *arg)
{
    (void)arg;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    float *x;
    if (obcomm_alloc(c, POLL_N * 4, (void **)&x))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    int fd = obcomm_fd(c);
    if (fd < 0)
        return hx_fail(c, "obcomm_fd %d", fd);
    for (int rep = 0; rep < 3; rep++) {
        for (size_t i = 0; i < POLL_N; i++)
            x[i] = (float)(rank + rep + (int)(i % 9));
        obcomm_request_t *r;
        if (obcomm_iallreduce(c, x, POLL_N, OBCOMM_FLOAT32, OBCOMM_SUM, &r))
            return hx_fail(c, "iallreduce: %s", obcomm_last_error(c));
        int done = 0, rc = 0, polls = 0;
        int64_t end = now_ms() + TIMEOUT_MS;
        while ((rc = obcomm_test(r, &done)) == 0 && !done) {
            if (now_ms() > end)
                return hx_fail(c, "not done after %d ms", TIMEOUT_MS);
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, 1000) < 0)
                return hx_fail(c, "poll");
            polls++;
        }
        if (rc != 0 || done != 1)
            return hx_fail(c, "test: rc %d done %d: %s", rc, done,
                           obcomm_request_error(r));
        obcomm_request_free(r);
        for (size_t i = 0; i < POLL_N; i++) {
            float want =
                (float)(size * (size - 1) / 2 + size * (rep + (int)(i % 9)));
            if (x[i] != want)
                return hx_fail(c, "rep %d x[%zu] = %g, want %g (%d polls)", rep,
                               i, x[i], want, polls);
        }
    }
    return 0;
}

START_TEST(test_polled_to_completion)
{
    run_shape(_i == 0 ? 3 : 4, "poll", trainer_poll, NULL);
}
END_TEST

START_TEST(test_polled_to_completion_here)
{
    run_here(trainer_poll, NULL);
}
END_TEST

/* ---- f. blocking calls while requests are in flight ---- */

static int trainer_blocking(obcomm_t *c, void *arg)
{
    (void)arg;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    int32_t *x;
    if (obcomm_alloc(c, many_offset(MANY) * 4, (void **)&x))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    obcomm_request_t *r[MANY];
    for (int k = 0; k < 5; k++)
        if (many_submit(c, x, k, &r[k]))
            return 1;

    /* A registration (a synchronous exchange) and blocking collectives,
     * with Completes of the requests arriving in between. */
    int64_t *y;
    if (obcomm_alloc(c, 999 * 8, (void **)&y))
        return hx_fail(c, "alloc in flight: %s", obcomm_last_error(c));
    for (size_t i = 0; i < 999; i++)
        y[i] = (int64_t)(rank + 1) << 33 | (int64_t)i;
    if (obcomm_allreduce(c, y, 999, OBCOMM_INT64, OBCOMM_SUM))
        return hx_fail(c, "allreduce in flight: %s", obcomm_last_error(c));
    for (size_t i = 0; i < 999; i++)
        if (y[i] !=
            ((int64_t)size * (size + 1) / 2 << 33) + (int64_t)size * (int64_t)i)
            return hx_fail(c, "allreduce y[%zu] = %lld", i, (long long)y[i]);
    uint8_t *b = (uint8_t *)y;
    for (size_t i = 0; i < 999; i++)
        b[i] = rank == 0 ? (uint8_t)(i ^ 0x5a) : 0;
    if (obcomm_broadcast(c, b, 999, 0))
        return hx_fail(c, "broadcast in flight: %s", obcomm_last_error(c));
    for (size_t i = 0; i < 999; i++)
        if (b[i] != (uint8_t)(i ^ 0x5a))
            return hx_fail(c, "broadcast byte %zu", i);
    if (obcomm_barrier(c))
        return hx_fail(c, "barrier in flight: %s", obcomm_last_error(c));

    /* The 1-bit state ops: save (a Complete's value), export (a shared
     * buffer allocated, used and freed around the op), restore. */
    uint64_t snap = 0;
    if (obcomm_save_1bit(c, &snap) || snap == 0)
        return hx_fail(c, "save_1bit in flight: %s", obcomm_last_error(c));
    void *part = NULL;
    size_t bytes = 0;
    if (!obcomm_1bit_durable(c) &&
        obcomm_export_1bit(c, snap, &part, &bytes) != 0)
        return hx_fail(c, "export_1bit in flight: %s", obcomm_last_error(c));
    if (obcomm_restore_1bit_part(c, snap, part, bytes))
        return hx_fail(c, "restore_1bit in flight: %s", obcomm_last_error(c));
    free(part);
    if (obcomm_free(c, y))
        return hx_fail(c, "free in flight: %s", obcomm_last_error(c));

    for (int k = 0; k < 5; k++) {
        if (settled_ok(c, r[k], "op before the blocking calls") ||
            many_check(c, x, k))
            return 1;
        obcomm_request_free(r[k]);
    }

    /* At the cap, a blocking call first waits for the oldest request. */
    for (int k = 0; k < OBCOMM_MAX_INFLIGHT; k++)
        if (many_submit(c, x, k, &r[k]))
            return 1;
    if (obcomm_barrier(c))
        return hx_fail(c, "barrier at the cap: %s", obcomm_last_error(c));
    int done = 0;
    if (obcomm_test(r[0], &done) != 0 || done != 1)
        return hx_fail(c, "oldest not done after a call at the cap");
    for (int k = OBCOMM_MAX_INFLIGHT - 1; k >= 0; k--) {
        if (settled_ok(c, r[k], "op at the cap") || many_check(c, x, k))
            return 1;
        obcomm_request_free(r[k]);
    }
    return 0;
}

START_TEST(blocking_calls_while_in_flight)
{
    run_shape(_i == 0 ? 3 : 5, "blocking", trainer_blocking, NULL);
}
END_TEST

START_TEST(blocking_calls_while_in_flight_here)
{
    run_here(trainer_blocking, NULL);
}
END_TEST

/* ---- g. arguments refused before sending ---- */

static obcomm_request_t *const UNTOUCHED = (obcomm_request_t *)0x1;

static void refused(obcomm_t *c, int rc, obcomm_request_t *r, int want_rc,
                    const char *want)
{
    ck_assert_int_eq(rc, want_rc);
    ck_assert_ptr_eq(r, UNTOUCHED);
    ck_assert_str_eq(obcomm_last_error(c), want);
}

START_TEST(bad_arguments_refused_locally)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    obcomm_t *c = join_here(&cl, "args", 0, 1, TIMEOUT_MS);
    int32_t *x;
    ck_assert_int_eq(obcomm_alloc(c, 4096, (void **)&x), 0);
    int32_t local[4];
    obcomm_request_t *r = UNTOUCHED;
    char want[256];

    refused(c, obcomm_iallreduce(c, x, 4, OBCOMM_INT32, OBCOMM_SUM, NULL), r,
            OBCOMM_E_INVAL, "req is NULL");
    refused(c, obcomm_ibarrier(c, NULL), r, OBCOMM_E_INVAL, "req is NULL");
    ck_assert_int_eq(obcomm_ibarrier(NULL, &r), OBCOMM_E_INVAL);
    ck_assert_ptr_eq(r, UNTOUCHED);
    refused(c, obcomm_iallreduce(c, x, 4, (obcomm_dtype_t)99, OBCOMM_SUM, &r),
            r, OBCOMM_E_INVAL, "unknown dtype 99");
    refused(c, obcomm_iallreduce(c, x, 4, OBCOMM_INT32, (obcomm_op_t)99, &r), r,
            OBCOMM_E_INVAL, "unknown reduction 99");
    refused(c, obcomm_iallreduce(c, x, 0, OBCOMM_INT32, OBCOMM_SUM, &r), r,
            OBCOMM_E_INVAL, "allreduce of 0 elements");
    refused(c, obcomm_iallreduce_1bit(c, 1, (float *)x, 0, &r), r,
            OBCOMM_E_INVAL, "1-bit allreduce of 0 elements");
    refused(c, obcomm_ibroadcast(c, x, 16, 1, &r), r, OBCOMM_E_INVAL,
            "broadcast root 1 not in [0, 1)");
    snprintf(want, sizeof(want),
             "data [%p, +4100 bytes) is not inside one buffer from "
             "obcomm_alloc",
             (void *)x);
    refused(c, obcomm_iallreduce(c, x, 1025, OBCOMM_INT32, OBCOMM_SUM, &r), r,
            OBCOMM_E_NOTREG, want);

    /* Allgather: count elements per rank in send, world * count in
     * recv; reduce-scatter the other way round. */
    refused(c, obcomm_iallgather(c, x, x + 8, 4, (obcomm_dtype_t)7, &r), r,
            OBCOMM_E_INVAL, "unknown dtype 7");
    refused(c, obcomm_iallgather(c, x, x + 8, 0, OBCOMM_INT32, &r), r,
            OBCOMM_E_INVAL, "allgather of 0 elements");
    snprintf(want, sizeof(want),
             "allgather of %zu elements per rank overflows (1 ranks)",
             SIZE_MAX / 2);
    refused(c, obcomm_iallgather(c, x, x, SIZE_MAX / 2, OBCOMM_INT32, &r), r,
            OBCOMM_E_INVAL, want);
    snprintf(want, sizeof(want),
             "send [%p, +16 bytes) is not inside one buffer from "
             "obcomm_alloc",
             (void *)local);
    refused(c, obcomm_iallgather(c, local, x, 4, OBCOMM_INT32, &r), r,
            OBCOMM_E_NOTREG, want);
    snprintf(want, sizeof(want),
             "recv [%p, +16 bytes) is not inside one buffer from "
             "obcomm_alloc",
             (void *)(x + 1021));
    refused(c, obcomm_allgather(c, x, x + 1021, 4, OBCOMM_INT32), r,
            OBCOMM_E_NOTREG, want);
    refused(c,
            obcomm_ireduce_scatter(c, x, x + 8, 4, OBCOMM_INT32, (obcomm_op_t)9,
                                   &r),
            r, OBCOMM_E_INVAL, "unknown reduction 9");
    refused(
        c,
        obcomm_ireduce_scatter(c, x, x + 8, 0, OBCOMM_FLOAT64, OBCOMM_MAX, &r),
        r, OBCOMM_E_INVAL, "reduce-scatter of 0 elements");
    snprintf(want, sizeof(want),
             "reduce-scatter of %zu elements per rank overflows (1 ranks)",
             SIZE_MAX / 4);
    refused(c,
            obcomm_reduce_scatter(c, x, x, SIZE_MAX / 4, OBCOMM_FLOAT64,
                                  OBCOMM_SUM),
            r, OBCOMM_E_INVAL, want);
    snprintf(want, sizeof(want),
             "send [%p, +8 bytes) is not inside one buffer from "
             "obcomm_alloc",
             (void *)(x + 1023));
    refused(
        c,
        obcomm_ireduce_scatter(c, x + 1023, x, 1, OBCOMM_INT64, OBCOMM_SUM, &r),
        r, OBCOMM_E_NOTREG, want);
    snprintf(want, sizeof(want),
             "recv [%p, +8 bytes) is not inside one buffer from "
             "obcomm_alloc",
             (void *)local);
    refused(
        c, obcomm_ireduce_scatter(c, x, local, 1, OBCOMM_INT64, OBCOMM_SUM, &r),
        r, OBCOMM_E_NOTREG, want);

    /* Nothing was sent, so no seq was taken: the daemon would drop a
     * trainer whose next op skipped one. */
    for (int i = 0; i < 4; i++)
        x[i] = i + 1;
    ck_assert_int_eq(obcomm_iallreduce(c, x, 4, OBCOMM_INT32, OBCOMM_SUM, &r),
                     0);
    ck_assert_int_eq(obcomm_wait(r), 0);
    obcomm_request_free(r);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(x[i], i + 1);
    obcomm_close(c);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* ---- h. the daemon dies with requests in flight ---- */

START_TEST(daemon_death_ends_requests)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    obcomm_t *c = join_here(&cl, "death", 0, 2, TIMEOUT_MS);
    void *buf;
    ck_assert_int_eq(obcomm_alloc(c, 4096, &buf), 0);
    obcomm_request_t *r[4];
    submit_three(c, buf, r);
    ck_assert_int_eq(obcomm_ibarrier(c, &r[3]), 0);
    obcomm_request_free(r[3]); /* an orphan when the handle dies */
    /* _i: SIGKILL, no goodbye; 1: SIGTERM, the daemon says goodbye. */
    int sig = _i == 0 ? SIGKILL : SIGTERM;
    char gone[512];
    if (sig == SIGKILL)
        snprintf(gone, sizeof(gone),
                 "obcommd at %s vanished without a goodbye (killed or "
                 "crashed): run `systemctl status obcommd` (and `journalctl "
                 "-u obcommd`) on this node to see why, then resume the job "
                 "from its last checkpoint",
                 cl.sock[0]);
    else
        snprintf(gone, sizeof(gone),
                 "obcommd at %s shut down cleanly (it received SIGTERM and "
                 "shut down) and closed the connection: start it again "
                 "(systemctl status obcommd shows it) and resume the job "
                 "from its last checkpoint",
                 cl.sock[0]);
    ck_assert_int_eq(hx_halt(&cl, sig), 0);

    ck_assert_int_eq(obcomm_wait(r[1]), OBCOMM_E_PEER_LOST);
    for (int k = 0; k < 3; k++) {
        int done = -1;
        ck_assert_int_eq(obcomm_test(r[k], &done), OBCOMM_E_PEER_LOST);
        ck_assert_int_eq(done, 1);
        ck_assert_str_eq(obcomm_request_error(r[k]), gone);
    }
    obcomm_request_t *late = UNTOUCHED;
    ck_assert_int_eq(obcomm_ibarrier(c, &late), OBCOMM_E_PEER_LOST);
    ck_assert_ptr_eq(late, UNTOUCHED);
    char unusable[600];
    snprintf(unusable, sizeof(unusable),
             "connection to obcommd unusable after an earlier failure: %s",
             gone);
    ck_assert_str_eq(obcomm_last_error(c), unusable);
    ck_assert_int_eq(obcomm_barrier(c), OBCOMM_E_PEER_LOST);
    obcomm_close(c);
    for (int k = 0; k < 3; k++)
        obcomm_request_free(r[k]);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* ---- i. allgather and reduce-scatter (need the daemon's side) ---- */

static const obcomm_dtype_t gdtypes[] = {OBCOMM_FLOAT32, OBCOMM_FLOAT64,
                                         OBCOMM_FLOAT16, OBCOMM_BFLOAT16,
                                         OBCOMM_INT32,   OBCOMM_INT64};
static const size_t gcounts[] = {1, 3, 1001};

static size_t gsize(obcomm_dtype_t t)
{
    switch (t) {
    case OBCOMM_FLOAT32:
    case OBCOMM_INT32:
        return 4;
    case OBCOMM_FLOAT64:
    case OBCOMM_INT64:
        return 8;
    default:
        return 2;
    }
}

/* Small integers: exact in every dtype, sums over 6 ranks included. */
static int gvalue(int rank, size_t i)
{
    return (int)((rank * 5 + i * 3) % 11) - 5;
}

static void gput(void *buf, obcomm_dtype_t t, size_t i, int v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    switch (t) {
    case OBCOMM_FLOAT32:
        ((float *)buf)[i] = f;
        break;
    case OBCOMM_FLOAT64:
        ((double *)buf)[i] = v;
        break;
    case OBCOMM_FLOAT16: {
        _Float16 h = (_Float16)f;
        memcpy((uint16_t *)buf + i, &h, 2);
        break;
    }
    case OBCOMM_BFLOAT16: /* small integers: the top half is exact */
        ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
        break;
    case OBCOMM_INT32:
        ((int32_t *)buf)[i] = v;
        break;
    case OBCOMM_INT64:
        ((int64_t *)buf)[i] = v;
        break;
    }
}

static int trainer_gather(obcomm_t *c, void *arg)
{
    (void)arg;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    const size_t maxn = 1001;
    uint8_t *send, *recv, *want;
    if (obcomm_alloc(c, (size_t)size * maxn * 8, (void **)&send) ||
        obcomm_alloc(c, (size_t)size * maxn * 8, (void **)&recv))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    want = malloc((size_t)size * maxn * 8);
    if (want == NULL)
        return hx_fail(c, "malloc");
    int bad = 0;
    for (size_t d = 0; d < 6 && !bad; d++)
        for (size_t n = 0; n < 3 && !bad; n++)
            for (int mode = 0; mode < 4 && !bad; mode++) {
                obcomm_dtype_t t = gdtypes[d];
                size_t count = gcounts[n], es = gsize(t);
                int nb = mode & 1, in_place = mode >> 1;
                /* Allgather: rank r's part at element r * count. In
                 * place, send is this rank's part of recv. */
                uint8_t *src =
                    in_place ? recv + (size_t)rank * count * es : send;
                for (size_t i = 0; i < count; i++)
                    gput(src, t, i, gvalue(rank, i));
                for (int k = 0; k < size; k++)
                    for (size_t i = 0; i < count; i++)
                        gput(want + (size_t)k * count * es, t, i, gvalue(k, i));
                int rc;
                if (nb) {
                    obcomm_request_t *r;
                    rc = obcomm_iallgather(c, src, recv, count, t, &r);
                    if (rc == 0) {
                        rc = obcomm_wait(r);
                        obcomm_request_free(r);
                    }
                } else {
                    rc = obcomm_allgather(c, src, recv, count, t);
                }
                if (rc)
                    bad = hx_fail(c,
                                  "allgather dtype %d count %zu mode %d: "
                                  "%s",
                                  t, count, mode, obcomm_last_error(c));
                else if (memcmp(recv, want, (size_t)size * count * es))
                    bad = hx_fail(c,
                                  "allgather dtype %d count %zu mode %d: "
                                  "wrong result",
                                  t, count, mode);
                if (bad)
                    break;

                /* Reduce-scatter (SUM): send holds world * count; this
                 * rank gets elements [rank * count, (rank + 1) * count)
                 * of the sum. In place, recv is this rank's part of
                 * send. */
                for (size_t i = 0; i < (size_t)size * count; i++)
                    gput(send, t, i, gvalue(rank, i));
                uint8_t *dst =
                    in_place ? send + (size_t)rank * count * es : recv;
                for (size_t i = 0; i < count; i++) {
                    int sum = 0;
                    for (int k = 0; k < size; k++)
                        sum += gvalue(k, (size_t)rank * count + i);
                    gput(want, t, i, sum);
                }
                if (nb) {
                    obcomm_request_t *r;
                    rc = obcomm_ireduce_scatter(c, send, dst, count, t,
                                                OBCOMM_SUM, &r);
                    if (rc == 0) {
                        rc = obcomm_wait(r);
                        obcomm_request_free(r);
                    }
                } else {
                    rc = obcomm_reduce_scatter(c, send, dst, count, t,
                                               OBCOMM_SUM);
                }
                if (rc)
                    bad = hx_fail(c,
                                  "reduce-scatter dtype %d count %zu "
                                  "mode %d: %s",
                                  t, count, mode, obcomm_last_error(c));
                else if (memcmp(dst, want, count * es))
                    bad = hx_fail(c,
                                  "reduce-scatter dtype %d count %zu "
                                  "mode %d: wrong result",
                                  t, count, mode);
            }
    free(want);
    return bad;
}

START_TEST(allgather_reduce_scatter_exact)
{
    run_shape(_i, "gather", trainer_gather, NULL);
}
END_TEST

/* 1 with a message unless rc is `want` and the request's message holds
 * every needle. */
static int expect_error(obcomm_t *c, obcomm_request_t *r, int rc, int want,
                        const char *const *needles)
{
    const char *msg = obcomm_request_error(r);
    if (rc != want)
        return hx_fail(c, "status %d, want %d: %s", rc, want, msg);
    for (int i = 0; needles[i] != NULL; i++)
        if (strstr(msg, needles[i]) == NULL)
            return hx_fail(c, "'%s' lacks '%s'", msg, needles[i]);
    return 0;
}

/* 2 nodes x 1 trainer, a 2 s deadline. Op 0: rank 1 gathers 5 elements
 * where rank 0 gathers 4: both get MISMATCH naming the field, both ranks
 * and their counts. That op stops the run, so the job "gdl2" then checks
 * the deadline: rank 1 never submits its reduce-scatter, and rank 0's
 * fails with TIMEOUT naming it. */
static int trainer_gather_mismatch(obcomm_t *c, void *arg)
{
    (void)arg;
    int rank = obcomm_rank(c);
    float *buf;
    if (obcomm_alloc(c, 64 * sizeof(float), (void **)&buf))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    obcomm_request_t *r;
    if (obcomm_iallgather(c, buf, buf + 16, rank == 0 ? 4 : 5, OBCOMM_FLOAT32,
                          &r))
        return hx_fail(c, "iallgather: %s", obcomm_last_error(c));
    const char *needles[] = {"count differs", "rank 0 (node 0) has 4",
                             "rank 1 (node 1) has 5", NULL};
    int bad = expect_error(c, r, obcomm_wait(r), OBCOMM_E_MISMATCH, needles);
    obcomm_request_free(r);
    return bad;
}

/* arg: a path rank 0 creates once its op is over, so that rank 1 stays
 * joined (and the op waits for it) until then. */
static int trainer_scatter_deadline(obcomm_t *c, void *arg)
{
    const char *done = arg;
    float *buf;
    if (obcomm_alloc(c, 64 * sizeof(float), (void **)&buf))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    if (obcomm_rank(c) == 1) { /* never submits */
        for (int i = 0; i < 6000 && access(done, F_OK) != 0; i++)
            hx_sleep_ms(10);
        return access(done, F_OK) == 0 ? 0 : hx_fail(c, "rank 0 never done");
    }
    obcomm_request_t *r;
    if (obcomm_ireduce_scatter(c, buf, buf + 32, 8, OBCOMM_FLOAT32, OBCOMM_SUM,
                               &r))
        return hx_fail(c, "ireduce_scatter: %s", obcomm_last_error(c));
    /* Named as a rank, or as its node when the node never announced. */
    const char *needles[] = {"timed out", "never arrived", "node 1", NULL};
    int bad = expect_error(c, r, obcomm_wait(r), OBCOMM_E_TIMEOUT, needles);
    obcomm_request_free(r);
    int fd = open(done, O_CREAT | O_WRONLY, 0600);
    if (fd >= 0)
        close(fd);
    return bad;
}

START_TEST(gather_mismatch_and_deadline)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    int failed =
        hx_run(&cl, 1, "gdl1", 2000, 120, trainer_gather_mismatch, NULL);
    char done[512];
    snprintf(done, sizeof(done), "%s/gdl2-done", cl.dir);
    failed += hx_run(&cl, 1, "gdl2", 2000, 120, trainer_scatter_deadline, done);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
}
END_TEST

static TCase *tcase(Suite *s, const char *name, int timeout)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, timeout);
    suite_add_tcase(s, tc);
    return tc;
}

int main(int argc, char **argv)
{
    Suite *s = suite_create("nbapi");
    int nshapes = (int)(sizeof(shapes) / sizeof(shapes[0]));
    if (argc > 1 && strcmp(argv[1], "gather") == 0) {
        TCase *tc = tcase(s, "gather", 600);
        tcase_add_loop_test(tc, allgather_reduce_scatter_exact, 0, nshapes);
        tcase_add_test(tc, gather_mismatch_and_deadline);
        return ck_run(s);
    }
    TCase *tc = tcase(s, "calls", 600);
    tcase_add_loop_test(tc, every_call_exact, 0, nshapes);
    tcase_add_test(tc, every_call_exact_here);
    tc = tcase(s, "many", 600);
    tcase_add_loop_test(tc, many_in_flight_exact, 0, 2);
    tcase_add_test(tc, many_in_flight_exact_here);
    tcase_add_loop_test(tc, free_without_wait, 0, 2);
    tcase_add_test(tc, free_without_wait_here);
    tc = tcase(s, "close", 120);
    tcase_add_loop_test(tc, close_with_requests_in_flight, 0, 4);
    tcase_add_loop_test(tc, daemon_death_ends_requests, 0, 2);
    tc = tcase(s, "poll", 600);
    tcase_add_loop_test(tc, test_polled_to_completion, 0, 2);
    tcase_add_test(tc, test_polled_to_completion_here);
    tc = tcase(s, "blocking", 600);
    tcase_add_loop_test(tc, blocking_calls_while_in_flight, 0, 2);
    tcase_add_test(tc, blocking_calls_while_in_flight_here);
    tc = tcase(s, "args", 120);
    tcase_add_test(tc, bad_arguments_refused_locally);
    return ck_run(s);
}
