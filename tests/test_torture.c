/* Trainer-death torture: real daemons, 2 and 3 nodes with 1 to 3
 * trainers per node, trainers SIGKILLed at random moments while they loop
 * fp32 allreduce, 1-bit allreduce (1-4 Mi floats, so that a kill lands
 * inside the codec work), broadcast and barrier. Every third round the
 * trainers issue non-blocking batches instead: 2 to 6 ops in flight at
 * once (fp32 allreduces and broadcasts on disjoint parts of the buffer,
 * sometimes a barrier), waited for in reverse order, so that the killed
 * trainer has several ops in flight and so do the survivors.
 *
 * The contract, checked in every round:
 * - every SURVIVING trainer gets an error from its current or next op
 *   (batch), and that error is OBCOMM_E_PEER_LOST (every failed op of a
 *   batch): the killed trainer's daemon sees its socket close and fails
 *   the job's ops on every node (JobLeft), so no survivor waits for the
 *   30 s deadline. Any other error, the deadline included (whatever it
 *   names), or no answer at all fails the test. (Data for an op that a
 *   node has not announced yet must not stall the link until that op's
 *   deadline; test_job late_announce_does_not_stall_the_link checks that
 *   without sockets.)
 * - every op that succeeds before the kill has the exact result (fp32
 *   sums of small integers, broadcast bytes; 1-bit results finite);
 * - every daemon is still running after the round;
 * and at the end of each cluster's run a fresh job gets exact results and
 * every daemon exits cleanly at SIGTERM (no sanitizer report: the suite
 * also runs under ASan/UBSan with abort_on_error).
 *
 * Job names: a fresh one every round; a round's 1-bit state is freed
 * when its run ends (its last trainer on the node leaves).
 *
 * Randomness: one seed, printed; $OBCOMM_TORTURE_SEED replays a run. The
 * kills happen after every trainer of the round has joined and allocated
 * its buffer (a trainer that never joined is not "lost"), after a random
 * delay. Rounds: $OBCOMM_TORTURE_ROUNDS in total (default 168, split over
 * the six shapes); odd rounds with at least 3 trainers kill two, so the
 * default kills 238 trainers. */
#include <check.h>

#include "ck_run.h"
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define MAX_TRAINERS (3 * 3)
#define MAX_FLOATS   ((size_t)4 << 20)
#define TIMEOUT_MS   30000
#define MSG_LEN      400

/* Written by the trainers (separate processes), read by the test. */
struct shared {
    volatile int ready[MAX_TRAINERS];
    volatile long ops[MAX_TRAINERS];
    volatile int in_op[MAX_TRAINERS]; /* enum kind of the op in progress */
    char msg[MAX_TRAINERS][MSG_LEN];
};

struct round {
    uint64_t seed;
    struct shared *sh;
    int batches; /* non-blocking batches instead of single ops */
};

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Records why a trainer failed for the test to print, and returns 1. */
static int note(obcomm_t *c, struct shared *sh, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int note(obcomm_t *c, struct shared *sh, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sh->msg[obcomm_rank(c)], MSG_LEN, fmt, ap);
    va_end(ap);
    return 1;
}

enum kind { K_NONE, K_FP32, K_ONEBIT, K_BCAST, K_BARRIER, K_BATCH, K_KINDS };
static const char *const kind_name[K_KINDS] = {
    "between ops", "fp32", "1-bit", "broadcast", "barrier", "batch in flight"};

/* 1-bit keys: each key keeps its count. */
static const size_t onebit_count[] = {(size_t)1 << 20, (size_t)2 << 20,
                                      MAX_FLOATS};

/* One op of the round's sequence, the same on every rank: returns its rc
 * and, for a successful op, 0 or a note about a wrong result. */
static int one_op(obcomm_t *c, struct shared *sh, float *x, uint64_t *rng,
                  long step, int *rc)
{
    int rank = obcomm_rank(c), size = obcomm_size(c);
    uint64_t r = splitmix(rng);
    unsigned kind = (unsigned)(r % 20);
    if (kind < 7) { /* fp32 sum of small integers: exact */
        size_t n = 1 + (size_t)((r >> 8) % ((size_t)1 << 20));
        for (size_t i = 0; i < n; i++)
            x[i] = (float)(rank + 1 + (int)(i % 5));
        sh->in_op[rank] = K_FP32;
        *rc = obcomm_allreduce(c, x, n, OBCOMM_FLOAT32, OBCOMM_SUM);
        if (*rc)
            return 0;
        for (size_t i = 0; i < n; i++) {
            float want = (float)(size * (size + 1) / 2 + size * (int)(i % 5));
            if (x[i] != want)
                return note(c, sh, "op %ld allreduce: x[%zu] = %g, want %g",
                            step, i, x[i], want);
        }
        return 0;
    }
    if (kind < 14) { /* 1-bit, mostly 1-2 Mi floats, sometimes 4 Mi */
        unsigned k = (unsigned)((r >> 8) % 8);
        k = k < 4 ? 0 : k < 7 ? 1 : 2;
        size_t n = onebit_count[k];
        for (size_t i = 0; i < n; i++)
            x[i] = (float)((int)((i * 2654435761u + (size_t)rank * 7 +
                                  (size_t)step) %
                                 201) -
                           100) /
                   64.0f;
        sh->in_op[rank] = K_ONEBIT;
        *rc = obcomm_allreduce_1bit(c, 10 + k, x, n);
        if (*rc)
            return 0;
        for (size_t i = 0; i < n; i += 4093)
            if (!isfinite(x[i]))
                return note(c, sh, "op %ld 1-bit: x[%zu] = %g", step, i, x[i]);
        return 0;
    }
    if (kind < 17) { /* broadcast of up to 4 MiB from a random root */
        size_t bytes = 1 + (size_t)((r >> 8) % (MAX_FLOATS * 4));
        int root = (int)((r >> 40) % (uint64_t)size);
        uint8_t *b = (uint8_t *)x;
        for (size_t i = 0; i < bytes; i++)
            b[i] = rank == root ? (uint8_t)(i * 7 + (size_t)step) : 0;
        sh->in_op[rank] = K_BCAST;
        *rc = obcomm_broadcast(c, x, bytes, root);
        if (*rc)
            return 0;
        for (size_t i = 0; i < bytes; i++)
            if (b[i] != (uint8_t)(i * 7 + (size_t)step))
                return note(c, sh, "op %ld broadcast from %d: byte %zu wrong",
                            step, root, i);
        return 0;
    }
    sh->in_op[rank] = K_BARRIER;
    *rc = obcomm_barrier(c);
    return 0;
}

#define BATCH_MAX   6
#define BATCH_SLICE (MAX_FLOATS / BATCH_MAX)

/* A batch of non-blocking ops, the same on every rank: 2 to 6 fp32 sums
 * and broadcasts on disjoint slices of x, the last one sometimes a
 * barrier, all in flight at once, then waited for in reverse order.
 * *rc is 0, or the first failure in issue order; every failure other
 * than PEER_LOST is noted. Every op that succeeds is checked. */
static int one_batch(obcomm_t *c, struct shared *sh, float *x, uint64_t *rng,
                     long step, int *rc)
{
    int rank = obcomm_rank(c), size = obcomm_size(c);
    uint64_t r = splitmix(rng);
    int nops = 2 + (int)(r % (BATCH_MAX - 1));
    obcomm_request_t *req[BATCH_MAX];
    size_t n[BATCH_MAX];
    int root[BATCH_MAX]; /* -1: fp32 sum; -2: barrier */
    sh->in_op[rank] = K_BATCH;
    for (int k = 0; k < nops; k++) {
        uint64_t q = splitmix(rng);
        float *p = x + (size_t)k * BATCH_SLICE;
        n[k] = 1 + (size_t)(q % BATCH_SLICE);
        int sub;
        if (k == nops - 1 && (r >> 8) % 4 == 0) {
            root[k] = -2;
            sub = obcomm_ibarrier(c, &req[k]);
        } else if ((q >> 40) % 3 == 0) {
            uint8_t *b = (uint8_t *)p;
            root[k] = (int)((q >> 44) % (uint64_t)size);
            for (size_t i = 0; i < n[k] * 4; i++)
                b[i] = rank == root[k] ? (uint8_t)(i * 5 + (size_t)step) : 0;
            sub = obcomm_ibroadcast(c, p, n[k] * 4, root[k], &req[k]);
        } else {
            root[k] = -1;
            for (size_t i = 0; i < n[k]; i++)
                p[i] = (float)(rank + 1 + (int)(i % 3) + k);
            sub = obcomm_iallreduce(c, p, n[k], OBCOMM_FLOAT32, OBCOMM_SUM,
                                    &req[k]);
        }
        if (sub != 0) {
            /* Only a dead connection refuses a valid op; the ops already
             * sent were ended with it. */
            for (int j = 0; j < k; j++)
                obcomm_request_free(req[j]);
            *rc = sub;
            return 0;
        }
    }
    int status[BATCH_MAX];
    for (int k = nops - 1; k >= 0; k--)
        status[k] = obcomm_wait(req[k]);
    int bad = 0;
    *rc = 0;
    for (int k = 0; k < nops && !bad; k++) {
        if (status[k] != 0) {
            if (*rc == 0) {
                *rc = status[k];
                snprintf(sh->msg[rank], MSG_LEN, "%s",
                         obcomm_request_error(req[k]));
            }
            if (status[k] != OBCOMM_E_PEER_LOST)
                bad = note(c, sh, "op %ld.%d failed with %d (%s): %s", step, k,
                           status[k], obcomm_strerror(status[k]),
                           obcomm_request_error(req[k]));
            continue;
        }
        const float *p = x + (size_t)k * BATCH_SLICE;
        if (root[k] == -1) {
            for (size_t i = 0; i < n[k] && !bad; i++) {
                float want =
                    (float)(size * (size + 1) / 2 + size * ((int)(i % 3) + k));
                if (p[i] != want)
                    bad =
                        note(c, sh, "op %ld.%d allreduce: x[%zu] = %g, want %g",
                             step, k, i, p[i], want);
            }
        } else if (root[k] >= 0) {
            const uint8_t *b = (const uint8_t *)p;
            for (size_t i = 0; i < n[k] * 4 && !bad; i++)
                if (b[i] != (uint8_t)(i * 5 + (size_t)step))
                    bad = note(c, sh, "op %ld.%d broadcast from %d: byte %zu",
                               step, k, root[k], i);
        }
    }
    for (int k = 0; k < nops; k++)
        obcomm_request_free(req[k]);
    return bad;
}

/* Loops ops (or batches) until one fails; exits 0 only when that failure
 * is PEER_LOST. Killed trainers never return. */
static int trainer_loop(obcomm_t *c, void *arg)
{
    const struct round *rd = arg;
    struct shared *sh = rd->sh;
    int rank = obcomm_rank(c);
    float *x;
    if (obcomm_alloc(c, MAX_FLOATS * sizeof(float), (void **)&x))
        return note(c, sh, "alloc: %s", obcomm_last_error(c));
    uint64_t rng = rd->seed;
    sh->ready[rank] = 1;
    for (long step = 0; step < 1000000; step++) {
        int rc = 0;
        if (rd->batches ? one_batch(c, sh, x, &rng, step, &rc)
                        : one_op(c, sh, x, &rng, step, &rc))
            return 1;
        sh->in_op[rank] = K_NONE;
        sh->ops[rank] = step + 1;
        if (rc == 0)
            continue;
        /* A batch leaves its first failure's message in sh->msg. */
        char why[MSG_LEN];
        snprintf(why, sizeof(why), "%s",
                 rd->batches ? sh->msg[rank] : obcomm_last_error(c));
        if (rc != OBCOMM_E_PEER_LOST)
            return note(c, sh, "op %ld failed with %d (%s), want PEER_LOST: %s",
                        step, rc, obcomm_strerror(rc), why);
        return 0;
    }
    return note(c, sh, "a million ops and no error");
}

static void describe(char *buf, size_t len, int status)
{
    if (status == -1)
        snprintf(buf, len, "still running at the deadline (killed)");
    else if (WIFEXITED(status))
        snprintf(buf, len, "exit %d", WEXITSTATUS(status));
    else
        snprintf(buf, len, "signal %d", WTERMSIG(status));
}

/* The failure of a round: stops the cluster (printing the log of any
 * daemon that did not exit cleanly) and fails the test. */
#define ROUND_FAIL(cl, ...)           \
    do {                              \
        fprintf(stderr, __VA_ARGS__); \
        fprintf(stderr, "\n");        \
        hx_stop(cl);                  \
        ck_abort_msg(__VA_ARGS__);    \
    } while (0)

/* One round: returns the number of trainers killed. */
static int run_round(struct hx_cluster *cl, struct shared *sh, int ls,
                     int round, uint64_t *rng, int tag, int *by_kind)
{
    int nodes = cl->nodes, total = nodes * ls;
    struct round rd = {
        .seed = splitmix(rng), .sh = sh, .batches = round % 3 == 2};
    char job[48];
    /* A fresh name every round. The daemons keep 1-bit state per run of a
     * job and free it when the run ends, under fire too. */
    snprintf(job, sizeof(job), "torture-%d-%d", tag, round);
    char where[80];
    snprintf(where, sizeof(where), "%s round %d (%d x %d%s)", job, round, nodes,
             ls, rd.batches ? ", batches" : "");
    memset(sh, 0, sizeof(*sh));

    pid_t pid[MAX_TRAINERS];
    for (int node = 0; node < nodes; node++)
        for (int lr = 0; lr < ls; lr++)
            pid[node * ls + lr] =
                hx_spawn(cl, node, lr, ls, job, TIMEOUT_MS, trainer_loop, &rd);

    /* Everybody joined and allocated (30 s bound). */
    for (int t = 0;; t++) {
        int ready = 0;
        for (int i = 0; i < total; i++)
            ready += sh->ready[i];
        if (ready == total)
            break;
        for (int i = 0; i < total; i++) {
            if (sh->ready[i])
                continue;
            int status;
            if (waitpid(pid[i], &status, WNOHANG) == pid[i]) {
                for (int j = 0; j < total; j++)
                    if (j != i)
                        hx_wait(pid[j], 0);
                int dead = -1;
                for (int k = 0; k < nodes && dead < 0; k++)
                    if (!hx_alive(cl, k))
                        dead = k;
                ROUND_FAIL(cl,
                           "%s: trainer %d exited before it was ready "
                           "(status %#x): %s; %s %d",
                           where, i, status,
                           sh->msg[i][0] ? sh->msg[i] : "its error is above",
                           dead < 0 ? "no daemon dead, checked up to node"
                                    : "daemon dead: node",
                           dead < 0 ? nodes - 1 : dead);
            }
        }
        if (t > 6000) {
            for (int j = 0; j < total; j++)
                hx_wait(pid[j], 0);
            ROUND_FAIL(cl, "%s: trainers not ready after 30 s", where);
        }
        hx_sleep_ms(5);
    }

    uint64_t r = splitmix(rng);
    int kills = (round % 2 == 1 && total >= 3) ? 2 : 1;
    int victim[2];
    victim[0] = (int)(r % (uint64_t)total);
    victim[1] =
        (victim[0] + 1 + (int)((r >> 16) % (uint64_t)(total - 1))) % total;
    /* Pacing, not synchronisation: the kill lands at a random moment of
     * the trainers' op stream, and that moment is what the round tests. */
    hx_sleep_ms((int)((r >> 32) % 400));
    for (int k = 0; k < kills; k++) {
        by_kind[sh->in_op[victim[k]]]++; /* filling or in the call */
        kill(pid[victim[k]], SIGKILL);
    }
    for (int k = 0; k < kills; k++)
        hx_wait(pid[victim[k]], 5000);

    /* Survivors: 30 s op deadline + 5 s client grace + slack. */
    char why[64];
    int bad = -1, bad_status = 0;
    for (int i = 0; i < total; i++) {
        if (i == victim[0] || (kills == 2 && i == victim[1]))
            continue;
        int status = hx_wait(pid[i], bad < 0 ? 45000 : 0);
        if ((status == -1 || !WIFEXITED(status) || WEXITSTATUS(status)) &&
            bad < 0) {
            bad = i;
            bad_status = status;
        }
    }
    if (bad >= 0) {
        char killed[48];
        if (kills == 2)
            snprintf(killed, sizeof(killed), "ranks %d and %d", victim[0],
                     victim[1]);
        else
            snprintf(killed, sizeof(killed), "rank %d", victim[0]);
        describe(why, sizeof(why), bad_status);
        ROUND_FAIL(cl, "%s: killed %s after %ld ops; survivor rank %d: %s: %s",
                   where, killed, sh->ops[victim[0]], bad, why,
                   sh->msg[bad][0] ? sh->msg[bad] : "(no message)");
    }
    for (int i = 0; i < nodes; i++)
        if (!hx_alive(cl, i))
            ROUND_FAIL(cl, "%s: daemon %d died (status %#x)", where, i,
                       cl->status[i]);
    return kills;
}

/* A fresh job after the torture: exact fp32 sums, exact broadcast, and a
 * 1-bit allreduce whose result is finite and the same on every rank. */
static int trainer_fresh(obcomm_t *c, void *arg)
{
    (void)arg;
    const size_t n = (size_t)1 << 20;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    float *x, *y;
    if (obcomm_alloc(c, n * sizeof(float), (void **)&x) ||
        obcomm_alloc(c, n * sizeof(float), (void **)&y))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(rank * 3 + (int)(i % 11));
    if (obcomm_allreduce(c, x, n, OBCOMM_FLOAT32, OBCOMM_SUM))
        return hx_fail(c, "allreduce: %s", obcomm_last_error(c));
    for (size_t i = 0; i < n; i++) {
        float want = (float)(3 * size * (size - 1) / 2 + size * (int)(i % 11));
        if (x[i] != want)
            return hx_fail(c, "allreduce x[%zu] = %g, want %g", i, x[i], want);
    }
    uint8_t *b = (uint8_t *)x;
    for (size_t i = 0; i < n * 4; i++)
        b[i] = rank == size - 1 ? (uint8_t)(i * 13 + 5) : 0;
    if (obcomm_broadcast(c, x, n * 4, size - 1))
        return hx_fail(c, "broadcast: %s", obcomm_last_error(c));
    for (size_t i = 0; i < n * 4; i++)
        if (b[i] != (uint8_t)(i * 13 + 5))
            return hx_fail(c, "broadcast byte %zu wrong", i);
    if (obcomm_barrier(c))
        return hx_fail(c, "barrier: %s", obcomm_last_error(c));
    for (int step = 0; step < 3; step++) {
        for (size_t i = 0; i < n; i++)
            x[i] = sinf((float)(i + (size_t)rank * 31 + (size_t)step));
        if (obcomm_allreduce_1bit(c, 77, x, n))
            return hx_fail(c, "1-bit: %s", obcomm_last_error(c));
        for (size_t i = 0; i < n; i++)
            if (!isfinite(x[i]))
                return hx_fail(c, "1-bit x[%zu] = %g", i, x[i]);
        for (int op = 0; op < 2; op++) {
            memcpy(y, x, n * sizeof(float));
            if (obcomm_allreduce(c, y, n, OBCOMM_FLOAT32,
                                 op ? OBCOMM_MIN : OBCOMM_MAX))
                return hx_fail(c, "max/min: %s", obcomm_last_error(c));
            if (memcmp(x, y, n * sizeof(float)))
                return hx_fail(c, "1-bit step %d: ranks differ", step);
        }
    }
    return 0;
}

static uint64_t base_seed(void)
{
    const char *s = getenv("OBCOMM_TORTURE_SEED");
    if (s && *s)
        return strtoull(s, NULL, 0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec ^
           (uint64_t)getpid() << 20;
}

static int total_rounds(void)
{
    const char *s = getenv("OBCOMM_TORTURE_ROUNDS");
    int n = s && *s ? atoi(s) : 168;
    return n < 6 ? 6 : n;
}

static uint64_t seed;

START_TEST(trainers_die_daemons_live)
{
    int nodes = 2 + _i;
    int per_shape = total_rounds() / 6;
    uint64_t rng = seed + (uint64_t)_i;
    struct shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(sh, MAP_FAILED);
    struct hx_cluster cl;
    /* Every round's job may linger while its ops fail out; the bound per
     * user must not be the one that refuses a round (tests may run as
     * any user). */
    static const char *const flags[] = {"--max_jobs", "256",
                                        "--max_jobs_per_uid", "256", NULL};
    ck_assert_int_eq(hx_start(&cl, nodes, flags), 0);

    int kills = 0, by_kind[K_KINDS] = {0};
    /* With 1 trainer per node every kill is also the last trainer of the
     * job on its node leaving: that node ends its run of the job (and
     * frees the run's 1-bit state) while the other nodes still hold ops of
     * it, a path the shapes with more trainers per node do not take. */
    static const int shapes[] = {2, 3, 1};
    int round = 0;
    for (int k = 0; k < 3; k++)
        for (int r = 0; r < per_shape; r++, round++)
            kills += run_round(&cl, sh, shapes[k], round, &rng, nodes, by_kind);

    int failed = hx_run(&cl, 2, "fresh", TIMEOUT_MS, 300, trainer_fresh, NULL);
    for (int i = 0; i < nodes; i++)
        ck_assert_msg(hx_alive(&cl, i), "daemon %d died in the fresh job", i);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
    fprintf(stderr, "torture %d nodes: %d rounds, %d trainers killed (", nodes,
            3 * per_shape, kills);
    for (int k = 0; k < K_KINDS; k++)
        fprintf(stderr, "%s%d %s", k ? ", " : "", by_kind[k], kind_name[k]);
    fprintf(stderr,
            "), every survivor got PEER_LOST, fresh job exact (seed %#llx)\n",
            (unsigned long long)seed);
    munmap(sh, sizeof(*sh));
}
END_TEST

Suite *torture_suite(void)
{
    Suite *s = suite_create("torture");
    TCase *tc = tcase_create("torture");
    tcase_set_timeout(tc, 1500);
    tcase_add_loop_test(tc, trainers_die_daemons_live, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    seed = base_seed();
    fprintf(stderr,
            "torture: seed %#llx (OBCOMM_TORTURE_SEED replays it), "
            "%d rounds\n",
            (unsigned long long)seed, total_rounds());
    return ck_run(torture_suite());
}
