/* Liveness through real daemons (docs/design.md, "The 1-bit state's
 * lifecycle and failures": "Faults end in seconds"): a node that dies or
 * goes silent ends the ops that need it with OBCOMM_E_PEER_LOST naming it,
 * also ops submitted after the link went down, and a node that comes back
 * serves a new run.
 *
 * Every op here has a 60 s deadline while peer_timeout_ms is 2 s: an
 * answer of OBCOMM_E_PEER_LOST (and not OBCOMM_E_TIMEOUT) is the proof
 * that the fault was noticed long before the deadline. */
#include <check.h>

#include "ck_run.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define NODES      3
#define VICTIM     2
#define DEADLINE   60000
#define PEER_LIMIT "2000"

/* Trainers tell the test that their first op is done (`done`) and wait
 * for its word (`go`) before the next. */
static int done_pipe[2], go_pipe[2];
/* When each survivor's second op ended (CLOCK_MONOTONIC, ms), in shared
 * memory. */
static volatile long long *ended_ms;

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int one_op(obcomm_t *c, float *x)
{
    for (int i = 0; i < 7; i++)
        x[i] = 1.0f;
    return obcomm_allreduce(c, x, 7, OBCOMM_FLOAT32, OBCOMM_SUM);
}

/* A survivor: one op that succeeds, then, once the victim is dead or
 * silent, one that must fail with PEER_LOST naming node VICTIM. The victim
 * does the first op and then waits on `go`, which never comes: it stays
 * joined, so only its node's fault can end the second op. */
static int trainer(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, 64, (void **)&x))
        return hx_fail(c, "alloc");
    int rc = one_op(c, x);
    if (rc)
        return hx_fail(c, "first op: %s", obcomm_last_error(c));
    if (write(done_pipe[1], "d", 1) != 1)
        return hx_fail(c, "write");
    char b;
    if (obcomm_rank(c) == VICTIM) /* stays joined until it is killed */
        for (;;)
            pause();
    if (read(go_pipe[0], &b, 1) != 1)
        return hx_fail(c, "read");
    rc = one_op(c, x);
    ended_ms[obcomm_rank(c)] = now_ms();
    char want[32];
    snprintf(want, sizeof(want), "node %d", VICTIM);
    if (rc != OBCOMM_E_PEER_LOST || strstr(obcomm_last_error(c), want) == NULL)
        return hx_fail(c, "second op: got %d (%s), want %d naming '%s'", rc,
                       obcomm_last_error(c), OBCOMM_E_PEER_LOST, want);
    return 0;
}

static int trainer_next_run(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, 64, (void **)&x))
        return hx_fail(c, "alloc");
    for (int k = 0; k < 3; k++) {
        int rc = one_op(c, x);
        if (rc)
            return hx_fail(c, "op %d: %s", k, obcomm_last_error(c));
        for (int i = 0; i < 7; i++)
            if (x[i] != (float)obcomm_size(c))
                return hx_fail(c, "op %d: %g, want %d", k, x[i],
                               obcomm_size(c));
    }
    return 0;
}

/* Waits (bounded, generously) until every survivor has logged s. */
static int survivors_logged(struct hx_cluster *cl, const char *s)
{
    for (int t = 0; t < 3000; t++) {
        int all = 1;
        for (int i = 0; i < NODES; i++)
            if (i != VICTIM && !hx_log_contains(cl, i, s))
                all = 0;
        if (all)
            return 1;
        hx_sleep_ms(20);
    }
    return 0;
}

/* Waits (bounded) until every node has every link up again. */
static int mesh_complete(struct hx_cluster *cl)
{
    for (int t = 0; t < 3000; t++) {
        int all = 1;
        for (int i = 0; i < NODES; i++)
            if (hx_metric(cl, i, "links_up") != NODES - 1)
                all = 0;
        if (all)
            return 1;
        hx_sleep_ms(20);
    }
    return 0;
}

/* Starts the cluster and a trainer per node; returns once every first op
 * is done. */
static void start(struct hx_cluster *cl, pid_t *pid)
{
    static const char *const flags[] = {"--peer-timeout-ms", PEER_LIMIT, NULL};
    ck_assert_int_eq(pipe(done_pipe), 0);
    ck_assert_int_eq(pipe(go_pipe), 0);
    ended_ms = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne((void *)ended_ms, MAP_FAILED);
    ck_assert_int_eq(hx_start(cl, NODES, flags), 0);
    for (int n = 0; n < NODES; n++) {
        pid[n] = hx_spawn(cl, n, 0, 1, "live", DEADLINE, trainer, NULL);
        ck_assert_int_gt(pid[n], 0);
    }
    for (int n = 0; n < NODES; n++) {
        char b;
        ck_assert_int_eq(read(done_pipe[0], &b, 1), 1);
    }
}

/* Lets the survivors submit their second op and collects them; the
 * victim's trainer is killed. */
static int finish(struct hx_cluster *cl, pid_t *pid)
{
    (void)cl;
    int failed = 0;
    ck_assert_int_eq(write(go_pipe[1], "gg", NODES - 1), NODES - 1);
    for (int n = 0; n < NODES; n++) {
        if (n == VICTIM)
            continue;
        int st = hx_wait(pid[n], 120000);
        failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    kill(pid[VICTIM], SIGKILL);
    hx_wait(pid[VICTIM], 10000);
    close(done_pipe[0]);
    close(done_pipe[1]);
    close(go_pipe[0]);
    close(go_pipe[1]);
    return failed;
}

/* kill -9 of a daemon while the trainers are between ops: the next op on
 * the survivors fails at once with PEER_LOST naming the node. */
START_TEST(dead_daemon_fails_the_next_op)
{
    struct hx_cluster cl;
    pid_t pid[NODES];
    start(&cl, pid);
    kill(cl.daemon[VICTIM], SIGKILL);
    int st;
    ck_assert_int_eq(waitpid(cl.daemon[VICTIM], &st, 0), cl.daemon[VICTIM]);
    cl.exited[VICTIM] = 1;
    cl.status[VICTIM] = 0; /* killed on purpose */
    char down[48];
    snprintf(down, sizeof(down), "link to node %d is down", VICTIM);
    ck_assert(survivors_logged(&cl, down));
    int failed = finish(&cl, pid);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
}
END_TEST

/* A stopped daemon (SIGSTOP) says nothing and its kernel still acks: the
 * heartbeats find it within peer_timeout_ms of the last thing it sent
 * (which was before the stop), and the survivors' op, which waits for its
 * announce, fails with PEER_LOST then, not at the deadline. After SIGCONT
 * the mesh comes back and a new run works on every node. */
START_TEST(silent_node_is_found_and_heals)
{
    struct hx_cluster cl;
    pid_t pid[NODES];
    start(&cl, pid);
    long long stopped = now_ms();
    kill(cl.daemon[VICTIM], SIGSTOP);
    int failed = finish(&cl, pid);
    for (int i = 0; i < NODES; i++)
        if (i != VICTIM) {
            fprintf(stderr,
                    "node %d found the silence after %lld ms "
                    "(peer_timeout_ms %s)\n",
                    i, ended_ms[i] - stopped, PEER_LIMIT);
            /* Slack for the answer to reach the trainer on a loaded machine. */
            ck_assert_int_le(ended_ms[i] - stopped,
                             atoi(PEER_LIMIT) + atoi(PEER_LIMIT) / 10);
        }
    char down[96];
    snprintf(down, sizeof(down), "link to node %d is down: nothing received",
             VICTIM);
    ck_assert(survivors_logged(&cl, down));
    for (int i = 0; i < NODES; i++)
        if (i != VICTIM)
            ck_assert_int_ge(hx_metric(&cl, i, "peer_timeouts"), 1);

    kill(cl.daemon[VICTIM], SIGCONT);
    ck_assert(mesh_complete(&cl));
    failed += hx_run(&cl, 1, "healed", DEADLINE, 120, trainer_next_run, NULL);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
}
END_TEST

static Suite *liveness_suite(void)
{
    Suite *s = suite_create("liveness");
    TCase *tc = tcase_create("liveness");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, dead_daemon_fails_the_next_op);
    tcase_add_test(tc, silent_node_is_found_and_heals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return ck_run(liveness_suite());
}
