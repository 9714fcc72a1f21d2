/* Local bounds that protect other users, and arguments checked at submit,
 * against real daemons.
 *
 * a. A flood of 4 KiB memfd registrations from uid 65534 (a member of
 *    socket_group, in a forked child that drops to nobody/nogroup) while
 *    root's job on 2 nodes runs at least 1,000 fp32 allreduces: every one
 *    of root's ops is exact, the flooder gets OBCOMM_E_NOMEM naming
 *    max_buffers_per_client on each of 4 connections after 1,024 buffers
 *    and max_buffers_per_uid on the fifth, and a new trainer of root can
 *    still allocate while the flooder holds its 4,096 buffers (needs root).
 * b. max_buffer_bytes_per_uid and max_buffers refuse the registration past
 *    them with OBCOMM_E_NOMEM naming the bound; a freed buffer makes room.
 * c. libobcomm refuses a broadcast root outside [0, size), an unknown
 *    dtype or reduction and a count that overflows, at once, naming the
 *    argument; the job goes on.
 * d. The daemon refuses the same from a raw client (the protocol spoken
 *    through client/sock.c), answering at once with OBCOMM_E_INVAL naming
 *    the argument, long before the op's deadline.
 *
 * Without root, a. is skipped and the rest runs. */
#include <check.h>

#include "ck_run.h"
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "ops.h"
#include "rawclient.h"

#define NOBODY     65534
#define TIMEOUT_MS 60000

/* Shared between the test and its trainer and flooder processes. */
struct shared {
    int started[2];          /* pipe: a byte once root's trainers run ops */
    volatile int flood_done; /* the flooder has hit its bounds */
    volatile long ops[2];    /* exact ops per trainer */
    volatile int nconn;      /* connections the flooder opened */
    volatile int count[8];   /* buffers registered on each */
    volatile int rc[8];      /* what refused the next one */
    char msg[8][256];
};

static struct shared *shared_new(void)
{
    struct shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(sh, MAP_FAILED);
    memset(sh, 0, sizeof(*sh));
    return sh;
}

/* Becomes uid/gid 65534 with no supplementary groups; 0 on success. */
static int drop_privileges(void)
{
    if (setgroups(0, NULL) != 0 || setresgid(NOBODY, NOBODY, NOBODY) != 0 ||
        setresuid(NOBODY, NOBODY, NOBODY) != 0)
        return -1;
    return getuid() == NOBODY && geteuid() == NOBODY ? 0 : -1;
}

/* ---- a. ---- */

#define N 257 /* elements; the last one carries rank 0's "flood done" */

/* Allreduces until it has done 1,000 ops and every rank has seen the
 * flood end (rank 0 adds the flag into the last element, so all ranks
 * learn it from the same op and stop after the same one). Each result is
 * checked exactly. */
static int trainer_root(obcomm_t *c, void *arg)
{
    struct shared *sh = arg;
    int rank = obcomm_rank(c), size = obcomm_size(c);
    float *x;
    if (obcomm_alloc(c, N * sizeof(float), (void **)&x))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    for (long i = 0;; i++) {
        for (int k = 0; k < N - 1; k++)
            x[k] = (float)((rank + 1) * (k + 1) + i % 7);
        x[N - 1] = rank == 0 && sh->flood_done ? 1.0f : 0.0f;
        int rc = obcomm_allreduce(c, x, N, OBCOMM_FLOAT32, OBCOMM_SUM);
        if (rc != 0)
            return hx_fail(c, "op %ld: %s: %s", i, obcomm_strerror(rc),
                           obcomm_last_error(c));
        for (int k = 0; k < N - 1; k++) {
            float want =
                (float)(size * (size + 1) / 2 * (k + 1) + size * (int)(i % 7));
            if (x[k] != want)
                return hx_fail(c, "op %ld: element %d is %g, not %g", i, k,
                               (double)x[k], (double)want);
        }
        sh->ops[rank]++;
        if (i == 0 && rank == 0 && write(sh->started[1], "s", 1) != 1)
            return hx_fail(c, "write: %s", strerror(errno));
        if (i + 1 >= 1000 && x[N - 1] == 1.0f)
            return 0;
    }
}

/* The flooder, as uid 65534: connections of job "flood" (local ranks 0..7
 * of 8), each registering 4 KiB buffers until the daemon refuses one;
 * stops after a connection that gets none. Then holds them all until the
 * parent closes `hold`. */
static void flooder(const char *sock, struct shared *sh, int hold)
{
    if (drop_privileges() != 0)
        _exit(10);
    /* Root's job runs first. The test holds the pipe's write end until
     * the job is over, so a job that never ran ends this wait too. */
    close(sh->started[1]);
    struct pollfd go = {.fd = sh->started[0], .events = POLLIN};
    char byte;
    if (poll(&go, 1, 60000) != 1 || read(sh->started[0], &byte, 1) != 1)
        _exit(12);
    obcomm_t *conn[8];
    for (int i = 0; i < 8; i++) {
        obcomm_options_t o = {.socket_path = sock,
                              .job = "flood",
                              .local_rank = i,
                              .local_size = 8};
        if (obcomm_connect(&o, &conn[i]) != 0)
            _exit(11);
        sh->nconn = i + 1;
        void *p;
        int rc;
        while ((rc = obcomm_alloc(conn[i], 4096, &p)) == 0)
            sh->count[i]++;
        sh->rc[i] = rc;
        snprintf(sh->msg[i], sizeof(sh->msg[i]), "%s",
                 obcomm_last_error(conn[i]));
        if (sh->count[i] == 0)
            break;
    }
    sh->flood_done = 1;
    char b;
    (void)!read(hold, &b, 1);
    _exit(0);
}

static int trainer_alloc(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, 1 << 20, (void **)&x))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    x[0] = 1.0f;
    if (obcomm_allreduce(c, x, 1, OBCOMM_FLOAT32, OBCOMM_SUM) || x[0] != 2.0f)
        return hx_fail(c, "allreduce: %s", obcomm_last_error(c));
    return 0;
}

START_TEST(memfd_flood_of_another_uid_does_not_fail_roots_ops)
{
    const char *flags[] = {"--socket_group", "65534", NULL};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, flags), 0);
    ck_assert_int_eq(chmod(cl.dir, 0711), 0);
    ck_assert(hx_log_wait(&cl, 0, "(max_buffers; vm.max_map_count is ", 5000));
    struct shared *sh = shared_new();

    int hold[2];
    ck_assert_int_eq(pipe(hold), 0);
    ck_assert_int_eq(pipe(sh->started), 0);
    fflush(NULL);
    pid_t fl = fork();
    if (fl == 0) {
        close(hold[1]);
        flooder(cl.sock[0], sh, hold[0]);
    }
    close(hold[0]);

    ck_assert_int_eq(hx_run(&cl, 1, "root", TIMEOUT_MS, 120, trainer_root, sh),
                     0);
    close(sh->started[0]);
    close(sh->started[1]);
    ck_assert(sh->flood_done);
    ck_assert_int_ge(sh->ops[0], 1000);
    ck_assert_int_eq(sh->ops[0], sh->ops[1]);

    ck_assert_int_eq(sh->nconn, 5);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(sh->count[i], 1024);
        ck_assert_int_eq(sh->rc[i], OBCOMM_E_NOMEM);
        ck_assert_msg(strstr(sh->msg[i],
                             ": buffer refused: this connection has 1024 "
                             "buffers registered, max_buffers_per_client is "
                             "1024") != NULL,
                      "connection %d: %s", i, sh->msg[i]);
    }
    ck_assert_int_eq(sh->count[4], 0);
    ck_assert_int_eq(sh->rc[4], OBCOMM_E_NOMEM);
    ck_assert_msg(strstr(sh->msg[4], ": buffer refused: uid 65534 has 4096 "
                                     "buffers registered, max_buffers_per_uid "
                                     "is 4096") != NULL,
                  "%s", sh->msg[4]);

    /* While the flooder holds its 4,096 buffers, root starts a new job. */
    ck_assert_int_eq(
        hx_run(&cl, 1, "again", TIMEOUT_MS, 60, trainer_alloc, NULL), 0);
    close(hold[1]);
    int status;
    ck_assert_int_eq(waitpid(fl, &status, 0), fl);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "flooder failed at step %d", WEXITSTATUS(status));
    ck_assert_int_eq(hx_stop(&cl), 0);
    munmap(sh, sizeof(*sh));
}
END_TEST

/* ---- b. ---- */

struct bound {
    int fit;          /* 4 KiB buffers that fit */
    const char *want; /* in the refusal of the next one */
};

static int trainer_bound(obcomm_t *c, void *arg)
{
    const struct bound *b = arg;
    void *p[64], *q;
    for (int i = 0; i < b->fit; i++)
        if (obcomm_alloc(c, 4096, &p[i]))
            return hx_fail(c, "alloc %d: %s", i, obcomm_last_error(c));
    int rc = obcomm_alloc(c, 4096, &q);
    if (rc != OBCOMM_E_NOMEM || strstr(obcomm_last_error(c), b->want) == NULL)
        return hx_fail(c, "alloc past the bound: %d %s", rc,
                       obcomm_last_error(c));
    if (obcomm_free(c, p[0]) || obcomm_alloc(c, 4096, &q))
        return hx_fail(c, "alloc after a free: %s", obcomm_last_error(c));
    return 0;
}

START_TEST(bytes_per_uid_and_daemon_wide_bounds)
{
    const char *bytes[] = {"--max_buffer_bytes_per_uid", "65536", NULL};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, bytes), 0);
    struct bound b = {16, ": buffer of 4096 bytes refused: uid %u has 65536 "
                          "bytes registered, max_buffer_bytes_per_uid is "
                          "65536"};
    char want[256];
    snprintf(want, sizeof(want), b.want, (unsigned)getuid());
    b.want = want;
    ck_assert_int_eq(hx_run(&cl, 1, "bytes", TIMEOUT_MS, 60, trainer_bound, &b),
                     0);
    ck_assert_int_eq(hx_stop(&cl), 0);

    const char *all[] = {"--max_buffers", "10", NULL};
    ck_assert_int_eq(hx_start(&cl, 1, all), 0);
    ck_assert(hx_log_wait(&cl, 0, "at most 10 of all users together", 5000));
    struct bound a = {10, ": buffer refused: all users have 10 buffers "
                          "registered, max_buffers is 10"};
    ck_assert_int_eq(hx_run(&cl, 1, "all", TIMEOUT_MS, 60, trainer_bound, &a),
                     0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* ---- c. ---- */

static int refused(obcomm_t *c, int rc, const char *want)
{
    if (rc != OBCOMM_E_INVAL || strcmp(obcomm_last_error(c), want) != 0)
        return hx_fail(c, "wanted INVAL \"%s\", got %d \"%s\"", want, rc,
                       obcomm_last_error(c));
    return 0;
}

static int trainer_client_checks(obcomm_t *c, void *arg)
{
    (void)arg;
    double *x;
    if (obcomm_alloc(c, 4096, (void **)&x))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    char want[128];
    size_t huge = SIZE_MAX / 4;
    snprintf(want, sizeof(want), "allreduce of %zu elements overflows", huge);
    if (refused(c, obcomm_broadcast(c, x, 16, 1000),
                "broadcast root 1000 not in [0, 2)") ||
        refused(c, obcomm_broadcast(c, x, 16, -1),
                "broadcast root -1 not in [0, 2)") ||
        refused(c, obcomm_broadcast(c, x, 16, 2),
                "broadcast root 2 not in [0, 2)") ||
        refused(c, obcomm_allreduce(c, x, 4, (obcomm_dtype_t)99, OBCOMM_SUM),
                "unknown dtype 99") ||
        refused(c, obcomm_allreduce(c, x, 4, OBCOMM_FLOAT64, (obcomm_op_t)99),
                "unknown reduction 99") ||
        refused(c, obcomm_allreduce(c, x, huge, OBCOMM_FLOAT64, OBCOMM_SUM),
                want))
        return 1;
    /* Nothing was sent: the job goes on. */
    x[0] = 1.0;
    if (obcomm_allreduce(c, x, 1, OBCOMM_FLOAT64, OBCOMM_SUM) || x[0] != 2.0)
        return hx_fail(c, "allreduce after the refusals: %s",
                       obcomm_last_error(c));
    return 0;
}

START_TEST(client_refuses_bad_arguments)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    ck_assert_int_eq(
        hx_run(&cl, 1, "args", TIMEOUT_MS, 60, trainer_client_checks, NULL), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* ---- d. ---- */

/* Joins `job` as its only trainer and registers a 4 KiB buffer as id 1. */
static void raw_start(struct raw *r, const char *sock, const char *job)
{
    float *base;
    ck_assert_int_eq(raw_join(r, sock, job, 0, 1, TIMEOUT_MS), 0);
    ck_assert_int_eq(raw_register(r, 4096, &base), 0);
}

struct bad_submit {
    uint32_t kind, dtype, redop;
    uint64_t count;
    int32_t root;
    const char *want; /* after "op 0 of job J: rank 0: " */
};

static const struct bad_submit bad[] = {
    {OBCOMM_KIND_BROADCAST, 0, 0, 16, 1000,
     "broadcast root 1000 not in [0, 1)"},
    {OBCOMM_KIND_BROADCAST, 0, 0, 16, -1, "broadcast root -1 not in [0, 1)"},
    {OBCOMM_KIND_BROADCAST, 0, 0, 16, 1, "broadcast root 1 not in [0, 1)"},
    {OBCOMM_KIND_ALLREDUCE, 99, OBCOMM_SUM, 4, 0, "unknown dtype 99"},
    {OBCOMM_KIND_ALLREDUCE, OBCOMM_FLOAT32, 99, 4, 0, "unknown reduction 99"},
    {OBCOMM_KIND_ALLREDUCE, OBCOMM_FLOAT64, OBCOMM_SUM, UINT64_C(1) << 62, 0,
     "allreduce of 4611686018427387904 elements overflows"},
    {OBCOMM_KIND_ALLREDUCE_1BIT, OBCOMM_FLOAT32, OBCOMM_AVG, UINT64_C(1) << 62,
     0, "1-bit allreduce of 4611686018427387904 elements overflows"},
    {77, 0, 0, 4, 0, "unknown op kind 77"},
};

START_TEST(daemon_refuses_bad_arguments_at_submit)
{
    const struct bad_submit *b = &bad[_i];
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    char job[32];
    snprintf(job, sizeof(job), "bad%d", _i);
    struct raw r;
    raw_start(&r, cl.sock[0], job);

    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    s.seq = 0;
    s.kind = b->kind;
    s.dtype = b->dtype;
    s.redop = b->redop;
    s.count = b->count;
    s.root = b->root;
    s.buffer_id = 1;
    Obcomm__ClientMsg m = OBCOMM__CLIENT_MSG__INIT;
    m.body_case = OBCOMM__CLIENT_MSG__BODY_SUBMIT;
    m.submit = &s;
    ck_assert_int_eq(raw_send(&r, &m, -1), 0);
    /* At once: the deadline is 60 s, the answer must come within 10. */
    Obcomm__DaemonMsg *d = raw_recv(&r, 10000);
    ck_assert_msg(d != NULL, "%s", r.err);
    ck_assert_int_eq(d->body_case, OBCOMM__DAEMON_MSG__BODY_COMPLETE);
    ck_assert_int_eq(d->complete->seq, 0);
    ck_assert_int_eq(d->complete->status, OBCOMM_E_INVAL);
    char want[256];
    snprintf(want, sizeof(want), "op 0 of job %s: rank 0: %s", job, b->want);
    ck_assert_str_eq(d->complete->message, want);
    obcomm__daemon_msg__free_unpacked(d, NULL);
    close(r.fd);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("bounds");
    TCase *tc = tcase_create("bounds");
    tcase_set_timeout(tc, 300);
    if (geteuid() == 0)
        tcase_add_test(tc, memfd_flood_of_another_uid_does_not_fail_roots_ops);
    else
        fprintf(stderr, "test_bounds: the memfd flood needs root (it "
                        "switches users); skipped\n");
    tcase_add_test(tc, bytes_per_uid_and_daemon_wide_bounds);
    tcase_add_test(tc, client_refuses_bad_arguments);
    tcase_add_loop_test(tc, daemon_refuses_bad_arguments_at_submit, 0,
                        (int)(sizeof(bad) / sizeof(bad[0])));
    suite_add_tcase(s, tc);
    return ck_run(s);
}
