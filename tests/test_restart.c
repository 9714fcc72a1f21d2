/* Runs that restart, through real daemons (docs/design.md, "A new run never
 * waits"): a new run of a job never waits for its deadline because one node
 * still winds up the last run.
 *
 *   - One node's last trainer of a run leaves 300 ms to 3 s after the
 *     others, while the next run starts on the other nodes: the new run's
 *     first op completes as soon as that node's new trainer is in, with
 *     exact results, and the lingering trainer's late op fails at once.
 *   - A trainer killed with SIGKILL and restarted alone: the next op of
 *     every other rank fails at once naming it; once they restart too, the
 *     new run's 1-bit results equal a fresh job's bit for bit.
 *
 * Every op has a deadline of DEADLINE ms; "at once" is checked as a bound
 * against it (an op that waited for its deadline takes all of it). */
#include <check.h>

#include "ck_run.h"
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define NODES    3
#define DEADLINE 20000
#define COUNT    1003 /* odd: the 1-bit chunks do not divide it */
#define STEPS    4

/* Shared between the test and its trainer processes. */
struct shared {
    volatile int flag[8];
    volatile int go[8];
    volatile int rc[8];
    volatile long long ms[8]; /* how long the op watched took */
    char msg[8][512];
    /* The 1-bit results of each rank's steps: a fresh job's, then the
     * restarted run's. */
    float fresh[NODES][STEPS][COUNT];
    float again[NODES][STEPS][COUNT];
};

static struct shared *sh;

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct shared *shared_new(void)
{
    struct shared *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(s, MAP_FAILED);
    memset(s, 0, sizeof(*s));
    return s;
}

/* Waits (at most wait_ms) until flag i is set. */
static int wait_flag(volatile int *flag, int wait_ms)
{
    for (int t = 0; t < wait_ms; t += 5) {
        if (*flag)
            return 0;
        hx_sleep_ms(5);
    }
    return -1;
}

static int exited_ok(int status)
{
    return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* One allreduce of ones: every element must be the world size. */
static int ones(obcomm_t *c, float *x)
{
    for (int i = 0; i < 7; i++)
        x[i] = 1.0f;
    int rc = obcomm_allreduce(c, x, 7, OBCOMM_FLOAT32, OBCOMM_SUM);
    if (rc != 0)
        return rc;
    for (int i = 0; i < 7; i++)
        if (x[i] != (float)obcomm_size(c))
            return hx_fail(c, "x[%d] = %g, want %d", i, (double)x[i],
                           obcomm_size(c));
    return 0;
}

/* ---- a node that lingers ---- */

struct linger {
    int linger_ms; /* the last node's trainer leaves this late */
};

/* The first run: three ops on every rank. The trainer of the last node
 * then stays joined for linger_ms (while the next run starts elsewhere)
 * and submits one more op, which must fail at once: its run is over. */
static int first_run(obcomm_t *c, void *arg)
{
    const struct linger *l = arg;
    float *x;
    if (obcomm_alloc(c, 64, (void **)&x))
        return hx_fail(c, "alloc");
    for (int k = 0; k < 3; k++)
        if (ones(c, x))
            return hx_fail(c, "first run, op %d: %s", k, obcomm_last_error(c));
    if (obcomm_rank(c) != NODES - 1)
        return 0;
    hx_sleep_ms(l->linger_ms);
    long long t0 = now_ms();
    int rc = ones(c, x);
    sh->ms[7] = now_ms() - t0;
    sh->rc[7] = rc;
    snprintf(sh->msg[7], sizeof(sh->msg[7]), "%s", obcomm_last_error(c));
    return 0;
}

/* The next run: its first op is timed, then two more. */
static int next_run(obcomm_t *c, void *arg)
{
    (void)arg;
    int r = obcomm_rank(c);
    float *x;
    if (obcomm_alloc(c, 64, (void **)&x))
        return hx_fail(c, "alloc");
    long long t0 = now_ms();
    int rc = ones(c, x);
    sh->ms[r] = now_ms() - t0;
    sh->rc[r] = rc;
    snprintf(sh->msg[r], sizeof(sh->msg[r]), "%s", obcomm_last_error(c));
    if (rc)
        return hx_fail(c, "next run, op 0: %s", obcomm_last_error(c));
    for (int k = 1; k < 3; k++)
        if (ones(c, x))
            return hx_fail(c, "next run, op %d: %s", k, obcomm_last_error(c));
    return 0;
}

/* The last node's trainer of a run leaves linger_ms after the others, and
 * the next run starts on the other nodes as soon as their trainers left:
 * its first op ends once the last node's new trainer is in (it starts when
 * the old one left), far from the deadline, with exact results; the
 * lingering trainer's late op fails at once with PEER_LOST naming who
 * left. */
START_TEST(lingering_node_does_not_hold_up_the_next_run)
{
    static const int linger[] = {300, 1500, 3000};
    struct linger l = {linger[_i]};
    struct hx_cluster cl;
    sh = shared_new();
    ck_assert_int_eq(hx_start(&cl, NODES, NULL), 0);
    pid_t old[NODES], next[NODES];
    for (int n = 0; n < NODES; n++) {
        old[n] = hx_spawn(&cl, n, 0, 1, "again", DEADLINE, first_run, &l);
        ck_assert_int_gt(old[n], 0);
    }
    /* The next run starts on every node but the last as soon as their
     * trainers of the first run have left... */
    for (int n = 0; n < NODES - 1; n++)
        ck_assert(exited_ok(hx_wait(old[n], 60000)));
    for (int n = 0; n < NODES - 1; n++) {
        next[n] = hx_spawn(&cl, n, 0, 1, "again", DEADLINE, next_run, NULL);
        ck_assert_int_gt(next[n], 0);
    }
    /* ...and there once its lingering trainer has. */
    ck_assert(exited_ok(hx_wait(old[NODES - 1], 60000)));
    next[NODES - 1] =
        hx_spawn(&cl, NODES - 1, 0, 1, "again", DEADLINE, next_run, NULL);
    ck_assert_int_gt(next[NODES - 1], 0);
    int failed = 0;
    for (int n = 0; n < NODES; n++)
        failed += !exited_ok(hx_wait(next[n], 60000));
    for (int n = 0; n < NODES; n++)
        fprintf(stderr,
                "linger %d ms: rank %d's first op: rc %d in %lld ms%s%s\n",
                l.linger_ms, n, sh->rc[n], sh->ms[n], sh->rc[n] ? ": " : "",
                sh->rc[n] ? sh->msg[n] : "");
    fprintf(stderr, "the lingering trainer's late op: rc %d in %lld ms: %s\n",
            sh->rc[7], sh->ms[7], sh->msg[7]);
    ck_assert_int_eq(failed, 0);
    for (int n = 0; n < NODES; n++) {
        ck_assert_int_eq(sh->rc[n], 0);
        ck_assert_int_lt(sh->ms[n], DEADLINE / 2);
    }
    ck_assert_int_eq(sh->rc[7], OBCOMM_E_PEER_LOST);
    ck_assert_int_lt(sh->ms[7], DEADLINE / 2);
    ck_assert_ptr_nonnull(strstr(sh->msg[7], "left the job"));
    ck_assert_int_eq(hx_stop(&cl), 0);
    munmap(sh, sizeof(*sh));
}
END_TEST

/* ---- a trainer restarted alone ---- */

#define VICTIM 1

static float pattern(int rank, int step, int i)
{
    uint64_t h = (uint64_t)(rank + 1) * 0x9e3779b97f4a7c15ull ^
                 (uint64_t)(step + 1) * 0xbf58476d1ce4e5b9ull ^ (uint64_t)i;
    h ^= h >> 31;
    h *= 0xd6e9f8a3c1b2a5f7ull;
    h ^= h >> 29;
    return (float)((double)(h >> 40) / 16777216.0 * 2.0 - 1.0);
}

/* STEPS 1-bit allreduces of key 7 from a fresh run; the results go to
 * out[rank]. */
static int onebit_steps(obcomm_t *c, float (*out)[STEPS][COUNT])
{
    int r = obcomm_rank(c);
    float *x;
    if (obcomm_alloc(c, COUNT * sizeof(float), (void **)&x))
        return hx_fail(c, "alloc");
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < COUNT; i++)
            x[i] = pattern(r, s, i);
        if (obcomm_allreduce_1bit(c, 7, x, COUNT))
            return hx_fail(c, "1-bit step %d: %s", s, obcomm_last_error(c));
        memcpy(out[r][s], x, sizeof(out[r][s]));
    }
    return 0;
}

static int fresh_job(obcomm_t *c, void *arg)
{
    (void)arg;
    return onebit_steps(c, sh->fresh);
}

static int restarted_job(obcomm_t *c, void *arg)
{
    (void)arg;
    return onebit_steps(c, sh->again);
}

/* The first run: two 1-bit steps (the error feedback is not zero any
 * more), then each rank reports and waits for the word to go on. The
 * victim is killed while it waits; every other rank's next op must fail
 * at once with PEER_LOST naming the victim's node. */
static int doomed_run(obcomm_t *c, void *arg)
{
    (void)arg;
    int r = obcomm_rank(c);
    float *x;
    if (obcomm_alloc(c, COUNT * sizeof(float), (void **)&x))
        return hx_fail(c, "alloc");
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < COUNT; i++)
            x[i] = pattern(r, s + 10, i);
        if (obcomm_allreduce_1bit(c, 7, x, COUNT))
            return hx_fail(c, "doomed step %d: %s", s, obcomm_last_error(c));
    }
    sh->flag[r] = 1;
    while (!sh->go[r])
        hx_sleep_ms(2);
    long long t0 = now_ms();
    int rc = obcomm_allreduce_1bit(c, 7, x, COUNT);
    sh->ms[r] = now_ms() - t0;
    sh->rc[r] = rc;
    snprintf(sh->msg[r], sizeof(sh->msg[r]), "%s", obcomm_last_error(c));
    return 0;
}

START_TEST(trainer_restarted_alone_fails_the_next_op_then_a_new_run_is_fresh)
{
    struct hx_cluster cl;
    sh = shared_new();
    ck_assert_int_eq(hx_start(&cl, NODES, NULL), 0);
    /* The reference: a fresh job of another name. */
    ck_assert_int_eq(hx_run(&cl, 1, "fresh", DEADLINE, 60, fresh_job, NULL), 0);

    pid_t pid[NODES];
    for (int n = 0; n < NODES; n++) {
        pid[n] = hx_spawn(&cl, n, 0, 1, "again", DEADLINE, doomed_run, NULL);
        ck_assert_int_gt(pid[n], 0);
    }
    for (int n = 0; n < NODES; n++)
        ck_assert_int_eq(wait_flag(&sh->flag[n], 60000), 0);
    /* kill -9 and restart the victim alone: the restarted trainer begins
     * a new run of the job on its node while the others are in the old
     * one. */
    kill(pid[VICTIM], SIGKILL);
    hx_wait(pid[VICTIM], 10000);
    pid_t restarted =
        hx_spawn(&cl, VICTIM, 0, 1, "again", DEADLINE, restarted_job, NULL);
    ck_assert_int_gt(restarted, 0);
    for (int n = 0; n < NODES; n++)
        sh->go[n] = 1;
    for (int n = 0; n < NODES; n++)
        if (n != VICTIM)
            ck_assert(exited_ok(hx_wait(pid[n], 60000)));
    char want[32];
    snprintf(want, sizeof(want), "node %d", VICTIM);
    for (int n = 0; n < NODES; n++) {
        if (n == VICTIM)
            continue;
        fprintf(stderr, "rank %d's next op: rc %d in %lld ms: %s\n", n,
                sh->rc[n], sh->ms[n], sh->msg[n]);
        ck_assert_int_eq(sh->rc[n], OBCOMM_E_PEER_LOST);
        ck_assert_int_lt(sh->ms[n], DEADLINE / 2);
        ck_assert_ptr_nonnull(strstr(sh->msg[n], want));
        ck_assert_ptr_nonnull(strstr(sh->msg[n], "left the job"));
    }
    /* The others restart: with the restarted victim they make a new run,
     * which equals the fresh job bit for bit. */
    int failed = 0;
    for (int n = 0; n < NODES; n++)
        if (n != VICTIM) {
            pid[n] =
                hx_spawn(&cl, n, 0, 1, "again", DEADLINE, restarted_job, NULL);
            ck_assert_int_gt(pid[n], 0);
        }
    for (int n = 0; n < NODES; n++)
        failed += !exited_ok(hx_wait(n == VICTIM ? restarted : pid[n], 60000));
    ck_assert_int_eq(failed, 0);
    ck_assert_int_eq(memcmp(sh->fresh, sh->again, sizeof(sh->fresh)), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
    munmap(sh, sizeof(*sh));
}
END_TEST

static Suite *restart_suite(void)
{
    Suite *s = suite_create("restart");
    TCase *tc = tcase_create("restart");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, lingering_node_does_not_hold_up_the_next_run, 0, 3);
    tcase_add_test(
        tc, trainer_restarted_alone_fails_the_next_op_then_a_new_run_is_fresh);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return ck_run(restart_suite());
}
