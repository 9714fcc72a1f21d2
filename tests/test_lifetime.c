/* Op, buffer and daemon lifetimes, through real daemons. Where the public
 * API cannot express a misbehaving trainer (release a buffer under
 * its own op, close right after a submit, never read the replies) the test
 * speaks the client protocol itself (proto/obcomm.proto: length-prefixed
 * ClientMsg/DaemonMsg, memfd buffers as SCM_RIGHTS) through client/sock.c.
 *
 * The contract, one test each:
 * a. release-before-start: a trainer submits an op on a buffer and then
 *    releases the buffer (or closes its connection) before the other
 *    trainer submits. The daemon survives; the other trainer gets
 *    PEER_LOST after a disconnect; after a release the op keeps the
 *    buffer's memory (docs/design.md: "ops using it keep theirs"), so both
 *    trainers' ops succeed, the fp32 sum exact; the next fresh job is
 *    exact.
 * b. disconnect mid-op: a trainer closes its socket right after submitting
 *    a large fp32 or 1-bit allreduce: every other trainer gets PEER_LOST,
 *    the daemons live, the next fresh job is exact.
 * c. a client that never reads its replies is dropped once its reply queue
 *    passes the bound (1 MiB), and a job running meanwhile is exact; a
 *    trainer that never reads is dropped too, also when its Complete is
 *    what overflows the queue, and its job fails with PEER_LOST.
 * d. a trainer that submits and closes at once on a one-node daemon, 50
 *    times: the daemon lives and then serves a fresh job exactly.
 * e. the last trainer of a job on a node leaves between ops: the other
 *    node's next op fails with PEER_LOST naming "rank 1", not a timeout
 *    (the deadline is 30 s).
 * f. SIGHUP during a 1-bit op: the daemon re-reads its config file, logs
 *    "log_level: info -> debug", and every op succeeds.
 * g. SIGTERM during a 1-bit op with state_dir: the daemons exit with status
 *    0, the trainers get PEER_LOST (no hang), and after a restart a new run
 *    that restores the snapshot taken after step 3 continues exactly as a
 *    run that never had step 4: later results equal that reference bit for
 *    bit.
 * h. error-feedback memory: with ef_max_bytes 10000000 a 4 Mi-float key on
 *    2 nodes fails with NOMEM naming "ef_max_bytes", and the run stops: the
 *    next op fails at once naming it.
 * i. a second run of a job name on the same daemons starts from zero: its
 *    results equal the first run's bit for bit.
 * j. a trainer SIGKILLed with non-blocking ops in flight (ops 4-7, which
 *    wait for a laggard): within seconds (the deadline is 30 s) every
 *    survivor's requests are over, each op the victim submitted either
 *    exact or failed, and from the first failure on (the same op on every
 *    survivor) every op fails with PEER_LOST naming the killed rank, ops
 *    it never submitted included; then the daemons serve a fresh job
 *    exactly. In 3 nodes x 1, 1 node x 3 and 2 nodes x 2 (the victim
 *    sharing its node with a survivor). */
#include <check.h>

#include "ck_run.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "hash.h"
#include "ops.h"
#include "rawclient.h"
#include "sock.h"
#include "wire.h"

#define TIMEOUT_MS 30000
#define WAIT_MS    45000 /* deadline + client grace + slack */
#define BIG        ((size_t)4 << 20)

/* Shared between the test and its trainer processes. */
struct shared {
    volatile int flag[16];
    volatile long ops[16];
    volatile int go;
    volatile uint64_t hash[16];
    volatile int first_rc[16];  /* of the op that SIGTERM interrupts */
    volatile uint64_t snapshot; /* the id obcomm_save_1bit gave rank 0 */
};

static struct shared *shared_new(void)
{
    struct shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(sh, MAP_FAILED);
    memset(sh, 0, sizeof(*sh));
    return sh;
}

/* Waits (at most wait_ms) until n flags from `from` on are set. */
static int wait_flags(struct shared *sh, int from, int n, int wait_ms)
{
    for (int t = 0; t < wait_ms; t += 5) {
        int set = 0;
        for (int i = from; i < from + n; i++)
            set += sh->flag[i] != 0;
        if (set == n)
            return 0;
        hx_sleep_ms(5);
    }
    return -1;
}

static int exited_ok(int status)
{
    return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* ---- trainers ---- */

static float pattern(int rank, int step, size_t i)
{
    uint64_t h = (uint64_t)(rank + 1) * 0x9e3779b97f4a7c15ull ^
                 (uint64_t)(step + 1) * 0xbf58476d1ce4e5b9ull ^ (uint64_t)i;
    h ^= h >> 31;
    h *= 0xd6e9f8a3c1b2a5f7ull;
    h ^= h >> 29;
    return (float)((double)(h >> 40) / 16777216.0 * 2.0 - 1.0);
}

/* Exact results: fp32 sums of small integers, a broadcast, and a 1-bit
 * allreduce that is finite and the same on every rank. */
static int trainer_exact(obcomm_t *c, void *arg)
{
    (void)arg;
    const size_t n = (size_t)1 << 18;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    float *x, *y;
    if (obcomm_alloc(c, n * 4, (void **)&x) ||
        obcomm_alloc(c, n * 4, (void **)&y))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    for (int rep = 0; rep < 3; rep++) {
        for (size_t i = 0; i < n; i++)
            x[i] = (float)(rank + 1 + (int)(i % 7) + rep);
        if (obcomm_allreduce(c, x, n, OBCOMM_FLOAT32, OBCOMM_SUM))
            return hx_fail(c, "allreduce: %s", obcomm_last_error(c));
        for (size_t i = 0; i < n; i++) {
            float want =
                (float)(size * (size + 1) / 2 + size * ((int)(i % 7) + rep));
            if (x[i] != want)
                return hx_fail(c, "x[%zu] = %g, want %g", i, x[i], want);
        }
    }
    uint8_t *b = (uint8_t *)x;
    for (size_t i = 0; i < n * 4; i++)
        b[i] = rank == 0 ? (uint8_t)(i * 3 + 1) : 0;
    if (obcomm_broadcast(c, x, n * 4, 0))
        return hx_fail(c, "broadcast: %s", obcomm_last_error(c));
    for (size_t i = 0; i < n * 4; i++)
        if (b[i] != (uint8_t)(i * 3 + 1))
            return hx_fail(c, "broadcast byte %zu", i);
    for (size_t i = 0; i < n; i++)
        x[i] = pattern(rank, 0, i);
    if (obcomm_allreduce_1bit(c, 1234, x, n))
        return hx_fail(c, "1-bit: %s", obcomm_last_error(c));
    for (int op = 0; op < 2; op++) {
        memcpy(y, x, n * 4);
        if (obcomm_allreduce(c, y, n, OBCOMM_FLOAT32,
                             op ? OBCOMM_MIN : OBCOMM_MAX))
            return hx_fail(c, "max/min: %s", obcomm_last_error(c));
        if (memcmp(x, y, n * 4))
            return hx_fail(c, "1-bit result differs between ranks");
    }
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return hx_fail(c, "1-bit x[%zu] = %g", i, x[i]);
    return 0;
}

/* What op `seq` of `job` on daemon i still waits for, as `obcommctl --json
 * ops` says it; "" when the daemon lists no such op. */
static void waiting_for(const struct hx_cluster *cl, int i, const char *job,
                        unsigned seq, char *buf, size_t len)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "%s -s %s --json ops 2>/dev/null | python3 -c '"
             "import json, sys\n"
             "j = json.load(sys.stdin)\n"
             "print(\"\".join(o[\"waiting_for\"] for x in j[\"jobs\"] "
             "if x[\"name\"] == \"%s\" for o in x[\"ops\"] "
             "if o[\"seq\"] == %u))' 2>/dev/null",
             getenv("OBCOMMCTL"), cl->sock[i], job, seq);
    buf[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return;
    if (fgets(buf, (int)len, p) == NULL)
        buf[0] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    pclose(p);
}

/* Every daemon alive, a fresh job with `ls` trainers per node exact, and a
 * clean shutdown. */
static void finish(struct hx_cluster *cl, int ls, const char *job)
{
    for (int i = 0; i < cl->nodes; i++)
        if (!hx_alive(cl, i)) {
            int st = cl->status[i];
            hx_stop(cl);
            ck_abort_msg("daemon %d died (status %#x)", i, st);
        }
    int failed = hx_run(cl, ls, job, TIMEOUT_MS, 120, trainer_exact, NULL);
    ck_assert_int_eq(hx_stop(cl), 0);
    ck_assert_msg(failed == 0, "%d trainers of the fresh job failed", failed);
}

struct one_op {
    struct shared *sh;
    unsigned kind; /* OBCOMM_KIND_ALLREDUCE or _1BIT */
    size_t count;
    int want; /* expected rc */
    int sum2; /* on success, x must be pattern(0) + pattern(1) exactly */
    const char *needle;
    int wait_go; /* submit only once sh->go is set */
    int again;   /* after a success, repeat the op until one fails */
};

/* Sets its flag, issues one op and checks its result code. */
static int trainer_one_op(obcomm_t *c, void *arg)
{
    const struct one_op *o = arg;
    float *x;
    if (obcomm_alloc(c, o->count * 4, (void **)&x))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    for (size_t i = 0; i < o->count; i++)
        x[i] = pattern(obcomm_rank(c), 0, i);
    o->sh->flag[obcomm_rank(c)] = 1;
    for (int t = 0; o->wait_go && !o->sh->go && t < 60000; t += 5)
        hx_sleep_ms(5);
    int rc;
    int n = 0;
    do
        rc = o->kind == OBCOMM_KIND_ALLREDUCE
                 ? obcomm_allreduce(c, x, o->count, OBCOMM_FLOAT32, OBCOMM_SUM)
                 : obcomm_allreduce_1bit(c, 5, x, o->count);
    while (rc == 0 && o->again && ++n < 1000);
    if (rc != o->want)
        return hx_fail(c, "got %d (%s): %s; want %s", rc, obcomm_strerror(rc),
                       obcomm_last_error(c),
                       o->want ? obcomm_strerror(o->want) : "success");
    for (size_t i = 0; rc == 0 && o->sum2 && i < o->count; i++)
        if (x[i] != pattern(0, 0, i) + pattern(1, 0, i))
            return hx_fail(c, "element %zu: %a, want %a", i, (double)x[i],
                           (double)(pattern(0, 0, i) + pattern(1, 0, i)));
    if (o->needle && rc && !strstr(obcomm_last_error(c), o->needle))
        return hx_fail(c, "message '%s' lacks '%s'", obcomm_last_error(c),
                       o->needle);
    return 0;
}

/* ---- a. release-before-start ---- */

/* _i bit 0: 1 node x 2 trainers / 2 nodes x 1; bit 1: release / close;
 * bit 2: fp32 / 1-bit. */
START_TEST(release_before_start)
{
    int nodes = _i & 1 ? 2 : 1, ls = 3 - nodes;
    int close_it = (_i >> 1) & 1;
    unsigned kind =
        (_i >> 2) & 1 ? OBCOMM_KIND_ALLREDUCE_1BIT : OBCOMM_KIND_ALLREDUCE;
    struct shared *sh = shared_new();
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, nodes, NULL), 0);

    /* The second trainer has joined (so the job exists on every node)
     * and submits only when told. */
    struct one_op o = {.sh = sh,
                       .kind = kind,
                       .count = BIG,
                       .want = close_it ? OBCOMM_E_PEER_LOST : 0,
                       .sum2 = !close_it && kind == OBCOMM_KIND_ALLREDUCE,
                       .wait_go = 1,
                       .again = close_it};
    pid_t pid = hx_spawn(&cl, nodes - 1, ls - 1, ls, "rbs", TIMEOUT_MS,
                         trainer_one_op, &o);
    ck_assert_int_eq(wait_flags(sh, nodes * ls - 1, 1, 30000), 0);

    struct raw r;
    float *base;
    ck_assert_int_eq(raw_join(&r, cl.sock[0], "rbs", 0, ls, TIMEOUT_MS), 0);
    ck_assert_int_eq(raw_register(&r, BIG * 4, &base), 0);
    for (size_t i = 0; i < BIG; i++)
        base[i] = pattern(0, 0, i);
    ck_assert_int_eq(raw_submit(&r, 0, kind, BIG, 5), 0);
    if (close_it) {
        munmap(base, BIG * 4);
        close(r.fd);
    } else {
        ck_assert_int_eq(raw_release(&r), 0);
        munmap(base, BIG * 4);
    }
    sh->go = 1;
    int status = hx_wait(pid, WAIT_MS);
    if (!close_it) {
        /* The releasing trainer's op completes with success: the op
         * held its own reference to the buffer. */
        Obcomm__DaemonMsg *d = NULL;
        int rc = obc_sock_recv(r.fd, obc_now_ms() + WAIT_MS, WAIT_MS, &d, r.err,
                               sizeof(r.err));
        ck_assert_msg(rc == 0, "raw trainer: %d: %s", rc, r.err);
        ck_assert_msg(d->body_case == OBCOMM__DAEMON_MSG__BODY_COMPLETE,
                      "raw trainer: message %d, not a Complete",
                      (int)d->body_case);
        ck_assert_msg(d->complete->status == 0,
                      "raw trainer: op completed with %d '%s'",
                      (int)d->complete->status, d->complete->message);
        obcomm__daemon_msg__free_unpacked(d, NULL);
        close(r.fd);
    }
    ck_assert_msg(exited_ok(status), "second trainer: status %#x", status);
    finish(&cl, ls, "rbs-after");
}
END_TEST

/* ---- b. disconnect mid-op ---- */

/* _i bit 0: the raw trainer is node 1's only one (2 x 1) / node 0's second
 * (2 x 2); bit 1: fp32 / 1-bit. */
START_TEST(disconnect_mid_op)
{
    int ls = _i & 1 ? 2 : 1;
    unsigned kind =
        (_i >> 1) & 1 ? OBCOMM_KIND_ALLREDUCE_1BIT : OBCOMM_KIND_ALLREDUCE;
    int raw_node = ls == 1 ? 1 : 0, raw_lr = ls == 1 ? 0 : 1;
    struct shared *sh = shared_new();
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);

    struct one_op o = {.sh = sh,
                       .kind = kind,
                       .count = BIG,
                       .want = OBCOMM_E_PEER_LOST,
                       .again = 1};
    pid_t pid[4];
    int n = 0;
    for (int node = 0; node < 2; node++)
        for (int lr = 0; lr < ls; lr++)
            if (node != raw_node || lr != raw_lr)
                pid[n++] = hx_spawn(&cl, node, lr, ls, "dmo", TIMEOUT_MS,
                                    trainer_one_op, &o);
    /* The raw client connects after the fork, so that no trainer process
     * inherits its socket and keeps it open. */
    struct raw r;
    float *base;
    ck_assert_int_eq(
        raw_join(&r, cl.sock[raw_node], "dmo", raw_lr, ls, TIMEOUT_MS), 0);
    ck_assert_int_eq(raw_register(&r, BIG * 4, &base), 0);
    for (size_t i = 0; i < BIG; i++)
        base[i] = pattern(7, 0, i);

    /* Every other trainer has submitted, and the raw trainer's node has
     * every other node's announce: that node waits for the raw trainer
     * alone. Then the raw one's submit starts the op and its close lands
     * in it. */
    char only_raw[64], waits[512] = "";
    snprintf(only_raw, sizeof(only_raw), "rank %d (node %d local %d)",
             raw_node * ls + raw_lr, raw_node, raw_lr);
    for (int t = 0; t < 1500 && strcmp(waits, only_raw) != 0; t++) {
        waiting_for(&cl, raw_node, "dmo", 0, waits, sizeof(waits));
        if (strcmp(waits, only_raw) != 0)
            hx_sleep_ms(20);
    }
    int ready = 0;
    for (int i = 0; i < 2 * ls; i++)
        ready += sh->flag[i] != 0;
    ck_assert_msg(strcmp(waits, only_raw) == 0,
                  "node %d waits for '%s', not only the raw trainer", raw_node,
                  waits);
    ck_assert_int_eq(raw_submit(&r, 0, kind, BIG, 5), 0);
    close(r.fd);
    munmap(base, BIG * 4);

    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += !exited_ok(hx_wait(pid[i], WAIT_MS));
    ck_assert_msg(ready == n, "only %d of %d trainers came", ready, n);
    ck_assert_msg(bad == 0, "%d trainers did not get PEER_LOST", bad);
    finish(&cl, ls, "dmo-after");
}
END_TEST

/* ---- c. a client that never reads ---- */

static int trainer_loop_exact(obcomm_t *c, void *arg)
{
    struct shared *sh = arg;
    const size_t n = (size_t)1 << 18;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    float *x, *stop;
    if (obcomm_alloc(c, n * 4, (void **)&x) ||
        obcomm_alloc(c, 4, (void **)&stop))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    sh->flag[rank] = 1;
    for (int rep = 0; rep < 100000; rep++) {
        /* Everybody stops after the same op: the MAX of the go flags. */
        *stop = (float)sh->go;
        if (obcomm_allreduce(c, stop, 1, OBCOMM_FLOAT32, OBCOMM_MAX))
            return hx_fail(c, "stop %d: %s", rep, obcomm_last_error(c));
        if (*stop > 0)
            return 0;
        for (size_t i = 0; i < n; i++)
            x[i] = (float)(rank + (int)(i % 9) + rep % 100);
        if (obcomm_allreduce(c, x, n, OBCOMM_FLOAT32, OBCOMM_SUM))
            return hx_fail(c, "allreduce %d: %s", rep, obcomm_last_error(c));
        for (size_t i = 0; i < n; i++) {
            float want = (float)(size * (size - 1) / 2 +
                                 size * ((int)(i % 9) + rep % 100));
            if (x[i] != want)
                return hx_fail(c, "op %d x[%zu] = %g, want %g", rep, i, x[i],
                               want);
        }
        sh->ops[rank] = rep + 1;
    }
    return hx_fail(c, "never told to stop");
}

/* Sends StatusRequests on fd without reading a reply, `limit` of them at
 * most (0: no limit), adding to *sent. Returns 0 once the daemon dropped
 * the connection, 1 at the limit, -1 at the deadline. */
static int flood(int fd, long limit, int wait_ms, long *sent)
{
    Obcomm__StatusRequest st = OBCOMM__STATUS_REQUEST__INIT;
    Obcomm__ClientMsg m = OBCOMM__CLIENT_MSG__INIT;
    m.body_case = OBCOMM__CLIENT_MSG__BODY_STATUS;
    m.status = &st;
    size_t len;
    uint8_t *frame = obcomm_wire_pack(&m.base, &len);
    int64_t end = obc_now_ms() + wait_ms;
    int rc = -1;
    size_t off = 0;
    while (obc_now_ms() < end) {
        if (limit > 0 && *sent >= limit && off == 0) {
            rc = 1;
            break;
        }
        ssize_t w = send(fd, frame + off, len - off, MSG_NOSIGNAL);
        if (w > 0) {
            off += (size_t)w;
            if (off == len) {
                off = 0;
                ++*sent;
            }
            continue;
        }
        if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            rc = 0;
            break;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR)
            break;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        poll(&p, 1, 100);
        if (p.revents & (POLLHUP | POLLERR)) {
            rc = 0;
            break;
        }
    }
    free(frame);
    return rc;
}

START_TEST(never_reading_client_is_dropped)
{
    struct shared *sh = shared_new();
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    pid_t pid[2];
    for (int node = 0; node < 2; node++)
        pid[node] = hx_spawn(&cl, node, 0, 1, "busy", TIMEOUT_MS,
                             trainer_loop_exact, sh);
    ck_assert_int_eq(wait_flags(sh, 0, 2, 30000), 0);
    struct raw r;
    ck_assert_int_eq(raw_open(&r, cl.sock[0]), 0);
    long sent = 0;
    int dropped = flood(r.fd, 0, 60000, &sent);
    close(r.fd);
    sh->go = 1;
    int bad = 0;
    for (int i = 0; i < 2; i++)
        bad += !exited_ok(hx_wait(pid[i], WAIT_MS));
    fprintf(stderr,
            "never-reading client: %ld status requests sent, dropped: %s; "
            "%ld exact allreduces meanwhile\n",
            sent, dropped == 0 ? "yes" : "no", sh->ops[0]);
    ck_assert_msg(dropped == 0, "not dropped after %ld requests in 60 s", sent);
    ck_assert_int_eq(bad, 0);
    finish(&cl, 1, "busy-after");
}
END_TEST

/* The same by a trainer of a job with an op in flight: its reply queue is
 * filled to about where a client was dropped before, then the op's
 * Complete joins the queue (the drop may then happen inside completion).
 * The other trainer's op or next op fails with PEER_LOST; the daemon
 * serves on. */
START_TEST(never_reading_trainer_is_dropped)
{
    struct shared *sh = shared_new();
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    struct raw probe;
    ck_assert_int_eq(raw_open(&probe, cl.sock[0]), 0);
    long needed = 0;
    ck_assert_int_eq(flood(probe.fd, 0, 60000, &needed), 0);
    close(probe.fd);

    struct one_op o = {.sh = sh,
                       .kind = OBCOMM_KIND_ALLREDUCE,
                       .count = (size_t)1 << 18,
                       .want = OBCOMM_E_PEER_LOST,
                       .wait_go = 1,
                       .again = 1};
    pid_t pid =
        hx_spawn(&cl, 0, 1, 2, "noread", TIMEOUT_MS, trainer_one_op, &o);
    ck_assert_int_eq(wait_flags(sh, 1, 1, 30000), 0);
    struct raw r;
    float *base;
    ck_assert_int_eq(raw_join(&r, cl.sock[0], "noread", 0, 2, TIMEOUT_MS), 0);
    ck_assert_int_eq(raw_register(&r, (size_t)1 << 20, &base), 0);
    /* The split between kernel buffers and the daemon's queue varies, so
     * the drop may come before the submit: a trainer that left. */
    long sent = 0;
    int dropped = flood(r.fd, needed - needed / 4, 60000, &sent);
    if (dropped == 1 &&
        raw_submit(&r, 0, OBCOMM_KIND_ALLREDUCE, 1u << 18, 0) == 0) {
        sh->go = 1;
        dropped = flood(r.fd, 0, 60000, &sent);
    } else if (dropped == 1) {
        dropped = 0; /* the submit found the connection closed */
    }
    sh->go = 1;
    close(r.fd);
    munmap(base, (size_t)1 << 20);
    int status = hx_wait(pid, WAIT_MS);
    ck_assert_msg(dropped == 0, "not dropped after %ld requests in 60 s", sent);
    ck_assert_msg(exited_ok(status), "other trainer: status %#x", status);
    finish(&cl, 2, "noread-after");
}
END_TEST

/* ---- d. submit and close at once, one node ---- */

START_TEST(submit_and_close_one_node)
{
    static const unsigned kinds[] = {
        OBCOMM_KIND_ALLREDUCE, OBCOMM_KIND_ALLREDUCE_1BIT,
        OBCOMM_KIND_BROADCAST, OBCOMM_KIND_BARRIER};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    for (int k = 0; k < 50; k++) {
        char job[32];
        snprintf(job, sizeof(job), "sac-%d", k);
        struct raw r;
        float *base;
        int rc = raw_join(&r, cl.sock[0], job, 0, 1, TIMEOUT_MS);
        if (rc == 0)
            rc = raw_register(&r, (size_t)1 << 20, &base);
        if (rc) {
            hx_stop(&cl); /* prints how a daemon that died exited */
            ck_abort_msg("submit-and-close %d: join/register: %d (%s)", k, rc,
                         r.err);
        }
        unsigned kind = kinds[k % 4];
        uint64_t count = kind == OBCOMM_KIND_BARRIER     ? 0
                         : kind == OBCOMM_KIND_BROADCAST ? (1u << 20)
                                                         : (1u << 18);
        for (size_t i = 0; i < (1u << 18); i++)
            base[i] = pattern(0, k, i);
        ck_assert_int_eq(raw_submit(&r, 0, kind, count, 3), 0);
        close(r.fd);
        munmap(base, (size_t)1 << 20);
        if (!hx_alive(&cl, 0)) {
            int st = cl.status[0];
            hx_stop(&cl);
            ck_abort_msg("daemon died after submit-and-close %d (status %#x)",
                         k, st);
        }
    }
    /* The daemon has read the last submit and the close: it holds no
     * connection but obcommctl's own. */
    long long clients = -1;
    for (int t = 0; t < 500 && clients != 1; t++) {
        clients = hx_metric(&cl, 0, "clients");
        if (clients != 1)
            hx_sleep_ms(20);
    }
    ck_assert_int_eq(clients, 1);
    finish(&cl, 2, "sac-after");
}
END_TEST

/* ---- e. the last trainer of a job on a node leaves between ops ---- */

static int trainer_leaves(obcomm_t *c, void *arg)
{
    struct shared *sh = arg;
    const size_t n = 4096;
    float *x;
    if (obcomm_alloc(c, n * 4, (void **)&x))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    for (int op = 0; op < 3; op++) {
        for (size_t i = 0; i < n; i++)
            x[i] = 1.0f;
        if (obcomm_allreduce(c, x, n, OBCOMM_FLOAT32, OBCOMM_SUM) ||
            x[0] != 2.0f)
            return hx_fail(c, "op %d: %s", op, obcomm_last_error(c));
    }
    if (obcomm_rank(c) == 1)
        return 0; /* obcomm_close follows in hx_spawn */
    /* Rank 1 has closed and exited before op 3 is issued. */
    for (int t = 0; t < 30000 && !sh->go; t += 5)
        hx_sleep_ms(5);
    if (!sh->go)
        return hx_fail(c, "rank 1 never left");
    int rc = obcomm_allreduce(c, x, n, OBCOMM_FLOAT32, OBCOMM_SUM);
    if (rc != OBCOMM_E_PEER_LOST || !strstr(obcomm_last_error(c), "rank 1"))
        return hx_fail(c, "op 3: got %d (%s): %s; want PEER_LOST naming rank 1",
                       rc, obcomm_strerror(rc), obcomm_last_error(c));
    return 0;
}

START_TEST(last_trainer_on_a_node_leaves)
{
    struct shared *sh = shared_new();
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    pid_t p0 = hx_spawn(&cl, 0, 0, 1, "leave", TIMEOUT_MS, trainer_leaves, sh);
    pid_t p1 = hx_spawn(&cl, 1, 0, 1, "leave", TIMEOUT_MS, trainer_leaves, sh);
    int s1 = hx_wait(p1, WAIT_MS);
    sh->go = 1;
    int s0 = hx_wait(p0, WAIT_MS + 30000);
    ck_assert_msg(exited_ok(s1), "rank 1: status %#x", s1);
    ck_assert_msg(exited_ok(s0), "rank 0: status %#x", s0);
    finish(&cl, 1, "leave-after");
}
END_TEST

/* ---- j. killed with ops in flight ---- */

#define KILL_FIRST 4  /* ops every rank completes before the kill */
#define KILL_SENT  8  /* ops the victim submitted before it */
#define KILL_OPS   10 /* ops the survivors submit */
#define KILL_N     4099

struct inflight {
    int ready[2]; /* each trainer writes a byte once its ops are sent */
    int go[2];    /* the test tells the laggard to go on */
    int victim, laggard;
    volatile int *first_failed; /* per rank, shared with the test */
};

static int32_t *kill_slice(int32_t *x, int op)
{
    return x + (size_t)op * KILL_N;
}

static int kill_submit(obcomm_t *c, int32_t *x, int op, obcomm_request_t **r)
{
    int32_t *p = kill_slice(x, op);
    for (size_t i = 0; i < KILL_N; i++)
        p[i] = obcomm_rank(c) + op + (int32_t)(i % 5);
    int rc = obcomm_iallreduce(c, p, KILL_N, OBCOMM_INT32, OBCOMM_SUM, r);
    if (rc)
        return hx_fail(c, "submit op %d: %s", op, obcomm_last_error(c));
    return 0;
}

static int kill_exact(obcomm_t *c, const int32_t *x, int op)
{
    int size = obcomm_size(c);
    const int32_t *p = kill_slice((int32_t *)x, op);
    for (size_t i = 0; i < KILL_N; i++) {
        int32_t want = size * (size - 1) / 2 + size * (op + (int32_t)(i % 5));
        if (p[i] != want)
            return hx_fail(c, "op %d element %zu = %d, want %d", op, i, p[i],
                           want);
    }
    return 0;
}

/* Every rank completes ops 0-3. The victim then submits ops 4-7 and waits
 * to be killed; the other ranks submit ops 4-9, the laggard only once the
 * victim is dead, and wait for them. An op the victim submitted may still
 * complete with its data (the daemon holds the victim's buffer while the
 * op uses it); from the first op that fails, every op fails with
 * PEER_LOST naming the victim, ops 8-9 (which it never submitted)
 * included. */
static int trainer_inflight(obcomm_t *c, void *arg)
{
    const struct inflight *k = arg;
    int rank = obcomm_rank(c);
    int32_t *x;
    if (obcomm_alloc(c, KILL_OPS * KILL_N * 4, (void **)&x))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    obcomm_request_t *r[KILL_OPS];
    for (int op = 0; op < KILL_FIRST; op++)
        if (kill_submit(c, x, op, &r[op]))
            return 1;
    for (int op = 0; op < KILL_FIRST; op++) {
        int rc = obcomm_wait(r[op]);
        if (rc)
            return hx_fail(c, "op %d: %s", op, obcomm_request_error(r[op]));
        if (kill_exact(c, x, op))
            return 1;
        obcomm_request_free(r[op]);
    }
    int sent = rank == k->victim ? KILL_SENT : KILL_OPS;
    if (rank != k->laggard)
        for (int op = KILL_FIRST; op < sent; op++)
            if (kill_submit(c, x, op, &r[op]))
                return 1;
    char b = 1;
    if (write(k->ready[1], &b, 1) != 1)
        return hx_fail(c, "ready pipe");
    if (rank == k->victim)
        for (;;)
            pause(); /* SIGKILLed here, with ops 4-7 in flight */
    if (rank == k->laggard) {
        if (read(k->go[0], &b, 1) != 1)
            return hx_fail(c, "go pipe");
        for (int op = KILL_FIRST; op < KILL_OPS; op++)
            if (kill_submit(c, x, op, &r[op]))
                return 1;
    }

    char victim[16];
    snprintf(victim, sizeof(victim), "rank %d", k->victim);
    int first_failed = -1;
    for (int op = KILL_FIRST; op < KILL_OPS; op++) {
        int rc = obcomm_wait(r[op]);
        if (rc == 0 && first_failed < 0 && op < KILL_SENT) {
            if (kill_exact(c, x, op))
                return 1;
            continue;
        }
        if (first_failed < 0)
            first_failed = op;
        if (rc != OBCOMM_E_PEER_LOST ||
            strstr(obcomm_request_error(r[op]), victim) == NULL)
            return hx_fail(c,
                           "op %d: got %d (%s): %s; want PEER_LOST naming "
                           "%s",
                           op, rc, obcomm_strerror(rc),
                           obcomm_request_error(r[op]), victim);
    }
    k->first_failed[rank] = first_failed;
    for (int op = KILL_FIRST; op < KILL_OPS; op++)
        obcomm_request_free(r[op]);
    return 0;
}

static int read_byte(int fd, int wait_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char b;
    return poll(&p, 1, wait_ms) == 1 && read(fd, &b, 1) == 1 ? 0 : -1;
}

/* _i: 0: 3 nodes x 1; 1: 1 node x 3; 2: 2 nodes x 2, the victim (rank 1)
 * next to survivor rank 0. */
START_TEST(killed_with_ops_in_flight)
{
    static const int shape[][4] = {
        /* nodes, per node, victim, laggard */
        {3, 1, 2, 1},
        {1, 3, 2, 1},
        {2, 2, 1, 3},
    };
    int nodes = shape[_i][0], ls = shape[_i][1], total = nodes * ls;
    struct inflight k = {.victim = shape[_i][2], .laggard = shape[_i][3]};
    k.first_failed = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne((void *)k.first_failed, MAP_FAILED);
    ck_assert_int_eq(pipe(k.ready), 0);
    ck_assert_int_eq(pipe(k.go), 0);
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, nodes, NULL), 0);
    pid_t pid[4] = {0};
    for (int node = 0; node < nodes; node++)
        for (int lr = 0; lr < ls; lr++)
            pid[node * ls + lr] = hx_spawn(&cl, node, lr, ls, "inflight",
                                           TIMEOUT_MS, trainer_inflight, &k);
    for (int i = 0; i < total; i++)
        ck_assert_msg(read_byte(k.ready[0], 30000) == 0,
                      "%d of %d trainers sent their ops", i, total);

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kill(pid[k.victim], SIGKILL);
    char b = 1;
    ck_assert_int_eq(write(k.go[1], &b, 1), 1);
    for (int i = 0; i < total; i++) {
        if (i == k.victim)
            continue;
        int status = hx_wait(pid[i], WAIT_MS);
        ck_assert_msg(exited_ok(status), "rank %d: status %#x", i, status);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long ms =
        (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    ck_assert_msg(ms < 10000, "survivors took %ld ms after the kill", ms);
    /* What docs/operations.md promises ("A failed op stops the run on
     * every rank"): the op the victim's death fails may still complete
     * on a node that had all its data before the failure reached it, but
     * no survivor gets past it: every first failure is that op or the
     * next. */
    int first = k.victim == 0 ? 1 : 0;
    int lo = k.first_failed[first];
    for (int i = 0; i < total; i++)
        if (i != k.victim && k.first_failed[i] < lo)
            lo = k.first_failed[i];
    for (int i = 0; i < total; i++)
        if (i != k.victim)
            ck_assert_msg(k.first_failed[i] >= 0 && k.first_failed[i] <= lo + 1,
                          "rank %d: first failed op %d, the earliest %d", i,
                          k.first_failed[i], lo);
    fprintf(stderr,
            "killed with ops in flight %d: the first op to fail was %d, "
            "%ld ms after the kill\n",
            _i, k.first_failed[first], ms);
    hx_wait(pid[k.victim], 5000);
    close(k.ready[0]);
    close(k.ready[1]);
    close(k.go[0]);
    close(k.go[1]);
    munmap((void *)k.first_failed, 4096);
    finish(&cl, ls, "inflight-after");
}
END_TEST

/* ---- 1-bit sequences (f, g, h) ---- */

struct efplan {
    struct shared *sh;
    size_t count;
    int first, last;    /* steps [first, last] */
    int skip;           /* a step left out (0: none) */
    int snapshot_after; /* obcomm_save_1bit after this step (0: none) */
    int restore;        /* obcomm_restore_1bit(sh->snapshot) first */
    int term_step;      /* the step during which the test sends SIGTERM */
    int withhold;       /* the last rank submits term_step only on go */
};

/* Steps of 1-bit allreduce on key 9; rank 0 keeps each step's result hash
 * in sh->hash[step]; sh->ops[rank] counts completed steps. */
static int trainer_ef(obcomm_t *c, void *arg)
{
    const struct efplan *p = arg;
    struct shared *sh = p->sh;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    float *x;
    if (obcomm_alloc(c, p->count * 4, (void **)&x))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    if (p->restore && obcomm_restore_1bit(c, sh->snapshot))
        return hx_fail(c, "restore: %s", obcomm_last_error(c));
    for (int st = p->first; st <= p->last; st++) {
        if (st == p->skip)
            continue;
        for (size_t i = 0; i < p->count; i++)
            x[i] = pattern(rank, st, i);
        if (st == p->term_step) {
            sh->flag[rank] = 1;
            if (p->withhold && rank == size - 1)
                for (int t = 0; t < 60000 && !sh->go; t += 5)
                    hx_sleep_ms(5);
            int rc = obcomm_allreduce_1bit(c, 9, x, p->count);
            sh->first_rc[rank] = rc;
            /* The op may have completed before the signal: then the next
             * op must fail. */
            for (int k = 0; rc == 0 && k < 100000; k++)
                rc = obcomm_barrier(c);
            if (rc != OBCOMM_E_PEER_LOST)
                return hx_fail(c, "at SIGTERM: got %d (%s): %s", rc,
                               obcomm_strerror(rc), obcomm_last_error(c));
            return 0;
        }
        int rc = obcomm_allreduce_1bit(c, 9, x, p->count);
        if (rc)
            return hx_fail(c, "step %d: %s", st, obcomm_last_error(c));
        for (size_t i = 0; i < p->count; i++)
            if (!isfinite(x[i]))
                return hx_fail(c, "step %d x[%zu] = %g", st, i, x[i]);
        if (rank == 0)
            sh->hash[st] =
                obcomm_hash_fnv1a(OBCOMM_HASH_FNV1A_INIT, x, p->count * 4);
        sh->ops[rank]++;
        uint64_t id;
        if (st == p->snapshot_after && obcomm_save_1bit(c, &id))
            return hx_fail(c, "snapshot: %s", obcomm_last_error(c));
        if (st == p->snapshot_after && rank == 0)
            sh->snapshot = id;
    }
    return 0;
}

/* ---- f. SIGHUP during a 1-bit op ---- */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

START_TEST(sighup_reloads_and_ops_go_on)
{
    char base[] = "/tmp/obcomm-hup-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(base));
    char conf[2][96];
    const char *flags[2][3];
    const char *const *each[2];
    for (int i = 0; i < 2; i++) {
        snprintf(conf[i], sizeof(conf[i]), "%s/node%d.conf", base, i);
        write_file(conf[i], "# test config\nlog_level = info\n");
        flags[i][0] = "-c";
        flags[i][1] = conf[i];
        flags[i][2] = NULL;
        each[i] = flags[i];
    }
    struct shared *sh = shared_new();
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start_each(&cl, 2, each), 0);
    struct efplan p = {
        .sh = sh, .count = (size_t)2 << 20, .first = 1, .last = 12};
    pid_t pid[2];
    for (int node = 0; node < 2; node++)
        pid[node] =
            hx_spawn(&cl, node, 0, 1, "hup", TIMEOUT_MS, trainer_ef, &p);
    for (int t = 0; t < 60000 && sh->ops[0] < 2; t += 5)
        hx_sleep_ms(5);
    for (int i = 0; i < 2; i++) {
        write_file(conf[i], "# test config\nlog_level = debug\n");
        kill(cl.daemon[i], SIGHUP);
    }
    int bad = 0;
    for (int i = 0; i < 2; i++)
        bad += !exited_ok(hx_wait(pid[i], 120000));
    long done = sh->ops[0];
    for (int i = 0; i < 2; i++) {
        if (!hx_alive(&cl, i)) {
            int st = cl.status[i];
            hx_stop(&cl);
            ck_abort_msg("daemon %d died at SIGHUP (status %#x)", i, st);
        }
        ck_assert_msg(hx_log_contains(&cl, i, "log_level: info -> debug"),
                      "daemon %d did not log the reload", i);
    }
    ck_assert_msg(bad == 0 && done == 12, "%d trainers failed; %ld of 12 ops",
                  bad, done);
    finish(&cl, 1, "hup-after");
    for (int i = 0; i < 2; i++)
        unlink(conf[i]);
    rmdir(base);
}
END_TEST

/* ---- g. SIGTERM during a 1-bit op ---- */

#define EF_COUNT ((size_t)2 << 20)

/* Runs steps [first, last] but `skip` on a fresh 2 x 2 cluster and copies
 * rank 0's result hashes of steps 5..7 into out[5..7]. */
static void reference(int skip, uint64_t *out)
{
    struct shared *sh = shared_new();
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    struct efplan p = {
        .sh = sh, .count = EF_COUNT, .first = 1, .last = 7, .skip = skip};
    int failed = hx_run(&cl, 2, "ref", TIMEOUT_MS, 300, trainer_ef, &p);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
    for (int st = 5; st <= 7; st++)
        out[st] = sh->hash[st];
    munmap(sh, sizeof(*sh));
}

static void state_dirs(char *base, char sd[][96], const char *flags[][5],
                       const char *const **each, int n, const char *extra,
                       const char *extra_val)
{
    ck_assert_ptr_nonnull(mkdtemp(base));
    for (int i = 0; i < n; i++) {
        snprintf(sd[i], 96, "%s/node%d", base, i);
        ck_assert_int_eq(mkdir(sd[i], 0700), 0);
        flags[i][0] = "--state-dir";
        flags[i][1] = sd[i];
        flags[i][2] = extra;
        flags[i][3] = extra_val;
        flags[i][4] = NULL;
        each[i] = flags[i];
    }
}

static void remove_tree(const char *base)
{
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", base);
    ck_assert_int_eq(system(cmd), 0);
}

/* One cluster with state_dir: steps 1-3, a snapshot, step 4 interrupted
 * by SIGTERM to every daemon, a restart, a new run that restores the
 * snapshot, steps 5-7 compared with the reference that skipped step 4. */
static void term_trial(int withhold, int trial, const uint64_t *before)
{
    char base[] = "/tmp/obcomm-term-XXXXXX";
    char sd[2][96];
    const char *flags[2][5];
    const char *const *each[2];
    state_dirs(base, sd, flags, each, 2, NULL, NULL);
    struct shared *sh = shared_new();
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start_each(&cl, 2, each), 0);
    struct efplan p = {.sh = sh,
                       .count = EF_COUNT,
                       .first = 1,
                       .last = 4,
                       .snapshot_after = 3,
                       .term_step = 4,
                       .withhold = withhold};
    pid_t pid[4];
    for (int i = 0; i < 4; i++)
        pid[i] =
            hx_spawn(&cl, i / 2, i % 2, 2, "ef", TIMEOUT_MS, trainer_ef, &p);
    ck_assert_int_eq(wait_flags(sh, 0, withhold ? 3 : 4, 120000), 0);
    /* A random moment: with the op withheld, node 0 may be in its codec
     * work; without, the op may be anywhere, even done. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int delay = withhold ? (int)(ts.tv_nsec / 1000 % 300)
                         : trial * 3 + (int)(ts.tv_nsec / 1000 % 3);
    hx_sleep_ms(delay);
    int unclean = hx_halt(&cl, SIGTERM);
    sh->go = 1;
    int bad = 0;
    for (int i = 0; i < 4; i++)
        bad += !exited_ok(hx_wait(pid[i], WAIT_MS));
    ck_assert_msg(unclean == 0, "%d daemons did not exit cleanly", unclean);
    ck_assert_msg(bad == 0, "%d trainers did not get PEER_LOST", bad);

    /* A new run names the snapshot: exactly the state after step 3,
     * whatever the shutdown did to step 4. */
    ck_assert_int_eq(hx_restart(&cl), 0);
    struct efplan q = {
        .sh = sh, .count = EF_COUNT, .first = 5, .last = 7, .restore = 1};
    int failed = hx_run(&cl, 2, "ef", TIMEOUT_MS, 300, trainer_ef, &q);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
    for (int st = 5; st <= 7; st++)
        ck_assert_msg(sh->hash[st] == before[st],
                      "trial %d: step %d after the restore differs from the "
                      "run that skipped step 4",
                      trial, st);
    remove_tree(base);
    munmap(sh, sizeof(*sh));
}

/* _i 0: the last rank withholds the interrupted op, so it cannot complete
 * anywhere and the restored state must be exactly the one before it; 1:
 * everybody submits and SIGTERM lands 0-18 ms after the last rank
 * submitted (6 trials; the op takes ~10 ms here), so the state is the one
 * before or after it. */
START_TEST(sigterm_during_onebit_restores_exactly)
{
    int withhold = _i == 0;
    uint64_t before[8] = {0};
    reference(4, before);
    for (int trial = 0; trial < (withhold ? 1 : 6); trial++)
        term_trial(withhold, trial, before);
}
END_TEST

/* ---- h. error-feedback memory bound ---- */

static int trainer_ef_bound(obcomm_t *c, void *arg)
{
    (void)arg;
    const size_t small = (size_t)1 << 16;
    float *x;
    if (obcomm_alloc(c, BIG * 4, (void **)&x))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    for (size_t i = 0; i < small; i++)
        x[i] = pattern(obcomm_rank(c), 0, i);
    if (obcomm_allreduce_1bit(c, 1, x, small))
        return hx_fail(c, "small key: %s", obcomm_last_error(c));
    for (size_t i = 0; i < BIG; i++)
        x[i] = pattern(obcomm_rank(c), 1, i);
    int rc = obcomm_allreduce_1bit(c, 2, x, BIG);
    if (rc != OBCOMM_E_NOMEM || !strstr(obcomm_last_error(c), "ef_max_bytes"))
        return hx_fail(c,
                       "4 Mi key: got %d (%s): %s; want NOMEM naming "
                       "ef_max_bytes",
                       rc, obcomm_strerror(rc), obcomm_last_error(c));
    /* The failed op stopped the run: the next one fails at once, naming
     * it. */
    rc = obcomm_allreduce_1bit(c, 1, x, small);
    if (rc != OBCOMM_E_NOMEM ||
        !strstr(obcomm_last_error(c), "cannot continue after op 1 failed"))
        return hx_fail(c, "the op after: got %d: %s", rc, obcomm_last_error(c));
    return 0;
}

START_TEST(ef_memory_is_bounded)
{
    const char *flags[] = {"--ef_max_bytes", "10000000", NULL};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, flags), 0);
    int failed =
        hx_run(&cl, 1, "bound", TIMEOUT_MS, 120, trainer_ef_bound, NULL);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
}
END_TEST

/* Two runs of one job name on the same daemons: the second starts from
 * zero, so its steps equal the first run's (steps 5-7 of the reference);
 * a run that only snapshotted changes nothing either. */
START_TEST(new_run_starts_at_zero)
{
    uint64_t ref[8] = {0};
    reference(0, ref);
    struct shared *sh = shared_new();
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    for (int run = 0; run < 2; run++) {
        memset((void *)sh->hash, 0, sizeof(sh->hash));
        struct efplan p = {.sh = sh,
                           .count = EF_COUNT,
                           .first = 1,
                           .last = 7,
                           .snapshot_after = run == 0 ? 6 : 0};
        ck_assert_int_eq(hx_run(&cl, 2, "ref", TIMEOUT_MS, 300, trainer_ef, &p),
                         0);
        for (int st = 5; st <= 7; st++)
            ck_assert_msg(sh->hash[st] == ref[st],
                          "run %d step %d differs from a fresh run", run, st);
    }
    ck_assert_int_eq(hx_stop(&cl), 0);
    munmap(sh, sizeof(*sh));
}
END_TEST

/* One case per contract, so that CK_RUN_CASE=<name> runs one of them. */
static void add(Suite *s, const char *name, const TTest *t, int loops)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, t, 0, loops);
    suite_add_tcase(s, tc);
}

Suite *lifetime_suite(void)
{
    Suite *s = suite_create("lifetime");
    add(s, "release", release_before_start, 8);
    add(s, "disconnect", disconnect_mid_op, 4);
    add(s, "noread", never_reading_client_is_dropped, 1);
    add(s, "noread_trainer", never_reading_trainer_is_dropped, 1);
    add(s, "close1", submit_and_close_one_node, 1);
    add(s, "leave", last_trainer_on_a_node_leaves, 1);
    add(s, "hup", sighup_reloads_and_ops_go_on, 1);
    add(s, "term", sigterm_during_onebit_restores_exactly, 2);
    add(s, "efbound", ef_memory_is_bounded, 1);
    add(s, "newrun", new_run_starts_at_zero, 1);
    add(s, "inflight", killed_with_ops_in_flight, 3);
    return s;
}

int main(void)
{
    return ck_run(lifetime_suite());
}
