/* Failure paths through real daemons: mismatched ops, deadlines, trainers
 * that vanish, garbage on the TCP port and the Unix socket. Every failure
 * must reach every rank with the documented code and a message naming who
 * differs or who is missing; the failure stops the run (the next op fails
 * at once naming it) and the daemons serve the job's next run. */
#include <check.h>

#include "ck_run.h"
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <arpa/inet.h>

#include "harness.h"

/* One correct allreduce: the daemons still work. */
static int check_next_op(obcomm_t *c, float *x)
{
    int size = obcomm_size(c);
    for (int i = 0; i < 5; i++)
        x[i] = 1.0f;
    int rc = obcomm_allreduce(c, x, 5, OBCOMM_FLOAT32, OBCOMM_SUM);
    if (rc)
        return hx_fail(c, "next op: %s", obcomm_last_error(c));
    for (int i = 0; i < 5; i++)
        if (x[i] != (float)size)
            return hx_fail(c, "next op: %g, want %d", x[i], size);
    return 0;
}

/* After op `seq` failed with `code`: the run is stopped, so the next op
 * fails at once with the same code, naming op `seq`. */
static int check_stopped(obcomm_t *c, float *x, int code, int seq)
{
    char want[64];
    snprintf(want, sizeof(want), "cannot continue after op %d failed", seq);
    int rc = obcomm_allreduce(c, x, 5, OBCOMM_FLOAT32, OBCOMM_SUM);
    if (rc != code || !strstr(obcomm_last_error(c), want))
        return hx_fail(c, "next op: got %d (%s), want %d naming '%s'", rc,
                       obcomm_last_error(c), code, want);
    return 0;
}

static int expect(obcomm_t *c, int rc, int want, const char *const *needles)
{
    if (rc != want)
        return hx_fail(c, "got %d (%s), want %d; message: %s", rc,
                       obcomm_strerror(rc), want, obcomm_last_error(c));
    for (int i = 0; needles[i]; i++)
        if (strstr(obcomm_last_error(c), needles[i]) == NULL)
            return hx_fail(c, "message '%s' lacks '%s'", obcomm_last_error(c),
                           needles[i]);
    return 0;
}

/* Rank 0 passes count 10, every other rank 11. */
static int trainer_count_mismatch(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, 64, (void **)&x))
        return hx_fail(c, "alloc");
    int rank = obcomm_rank(c);
    int rc =
        obcomm_allreduce(c, x, rank == 0 ? 10 : 11, OBCOMM_FLOAT32, OBCOMM_SUM);
    const char *needles[] = {"count differs", "rank 0", "has 10", "has 11",
                             NULL};
    if (expect(c, rc, OBCOMM_E_MISMATCH, needles))
        return 1;
    return check_stopped(c, x, OBCOMM_E_MISMATCH, 0);
}

static int trainer_plain(obcomm_t *c, void *arg);

START_TEST(count_mismatch_fails_everywhere)
{
    /* Loop 0: two trainers on one node; 1: three nodes, one trainer. */
    static const int shape[][2] = {{1, 2}, {3, 1}};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, shape[_i][0], NULL), 0);
    int failed = hx_run(&cl, shape[_i][1], "mismatch", 20000, 60,
                        trainer_count_mismatch, NULL);
    /* The job's next run works. */
    failed +=
        hx_run(&cl, shape[_i][1], "mismatch", 20000, 60, trainer_plain, NULL);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
}
END_TEST

/* The last node's trainers use another dtype. */
static int trainer_dtype_mismatch(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, 64, (void **)&x))
        return hx_fail(c, "alloc");
    int last = obcomm_rank(c) >= obcomm_size(c) - 2;
    int rc = obcomm_allreduce(c, x, 4, last ? OBCOMM_INT32 : OBCOMM_FLOAT32,
                              OBCOMM_MAX);
    const char *needles[] = {"dtype differs", "ranks 4-5 (node 2) has int32",
                             NULL};
    if (expect(c, rc, OBCOMM_E_MISMATCH, needles))
        return 1;
    return check_stopped(c, x, OBCOMM_E_MISMATCH, 0);
}

START_TEST(dtype_mismatch_names_the_node)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 3, NULL), 0);
    int failed =
        hx_run(&cl, 2, "dtype", 20000, 60, trainer_dtype_mismatch, NULL);
    failed += hx_run(&cl, 2, "dtype", 20000, 60, trainer_plain, NULL);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
}
END_TEST

/* A pipe every trainer inherits: each rank but the last writes a byte
 * once it has its answer. */
static int answered[2];

/* Reads n bytes from fd, waiting at most ms for each; 0 or -1. */
static int read_bytes(int fd, int n, int ms)
{
    while (n > 0) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        char b[16];
        if (poll(&p, 1, ms) != 1)
            return -1;
        ssize_t got =
            read(fd, b, (size_t)n < sizeof(b) ? (size_t)n : sizeof(b));
        if (got <= 0)
            return -1;
        n -= (int)got;
    }
    return 0;
}

/* The last rank submits only after the deadline: everybody else gets a
 * timeout that names it (the daemon's deadline, not the client's safety
 * net, which would say "did not answer"). */
static int trainer_never_submits(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, 64, (void **)&x))
        return hx_fail(c, "alloc");
    int rank = obcomm_rank(c), size = obcomm_size(c);
    /* The last rank arrives only once every other rank has its answer,
     * and then gets the same answer: the op failed, on its node too,
     * before it came. */
    if (rank == size - 1 && read_bytes(answered[0], size - 1, 30000) != 0)
        return hx_fail(c, "the other ranks got no answer within 30 s");
    int rc = obcomm_allreduce(c, x, 16, OBCOMM_FLOAT32, OBCOMM_SUM);
    if (rank != size - 1 && write(answered[1], "a", 1) != 1)
        return hx_fail(c, "write: %s", strerror(errno));
    const char *needles[] = {"timed out", "never arrived", "rank 3", NULL};
    return expect(c, rc, OBCOMM_E_TIMEOUT, needles);
}

START_TEST(missing_rank_times_out_with_its_name)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    ck_assert_int_eq(pipe(answered), 0);
    int failed = hx_run(&cl, 2, "late", 500, 60, trainer_never_submits, NULL);
    close(answered[0]);
    close(answered[1]);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
}
END_TEST

/* Rank 1 dies in the middle of the job; everybody else's next op fails with
 * PEER_LOST naming it, well before the (long) deadline. */
static int trainer_one_dies(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, 1 << 20, (void **)&x))
        return hx_fail(c, "alloc");
    if (check_next_op(c, x))
        return 1;
    if (obcomm_rank(c) == 1)
        _exit(0); /* no goodbye: the socket just closes */
    int rc = obcomm_allreduce(c, x, 1 << 18, OBCOMM_FLOAT32, OBCOMM_SUM);
    const char *needles[] = {"rank 1 (node 0 local 1)", NULL};
    return expect(c, rc, OBCOMM_E_PEER_LOST, needles);
}

START_TEST(vanished_trainer_fails_the_job)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    int failed = hx_run(&cl, 2, "dies", 600000, 60, trainer_one_dies, NULL);
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
}
END_TEST

static int send_all(int fd, const void *buf, size_t len)
{
    return send(fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

/* 1 if the peer closes the connection within a few seconds. */
static int closed_by_peer(int fd)
{
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char b[256];
    for (;;) {
        ssize_t n = recv(fd, b, sizeof(b), 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return 1;
        if (n < 0)
            return 0;
    }
}

static int tcp_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

static int unix_to(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

static int trainer_plain(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, 64, (void **)&x))
        return hx_fail(c, "alloc");
    return check_next_op(c, x);
}

START_TEST(garbage_is_rejected_and_the_daemon_serves_on)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    ck_assert_int_eq(hx_run(&cl, 1, "before", 20000, 60, trainer_plain, NULL),
                     0);

    /* TCP: random bytes; then a well-formed header announcing a payload
     * far over the bound; then a control frame that is not a PeerMsg. */
    uint8_t junk[1000];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)(i * 131 + 7);
    int fd = tcp_to(cl.port[0]);
    ck_assert_int_eq(send_all(fd, junk, sizeof(junk)), 0);
    ck_assert(closed_by_peer(fd));
    close(fd);

    uint8_t hdr[48] = {'O', 'B', 'C', 'M', 1, 2};
    hdr[43] = 0x40; /* len = 1 GiB */
    fd = tcp_to(cl.port[1]);
    ck_assert_int_eq(send_all(fd, hdr, sizeof(hdr)), 0);
    ck_assert(closed_by_peer(fd));
    close(fd);

    uint8_t ctrl[48 + 4] = {'O', 'B', 'C', 'M', 1, 1};
    ctrl[40] = 4;
    memset(ctrl + 48, 0xff, 4);
    fd = tcp_to(cl.port[0]);
    ck_assert_int_eq(send_all(fd, ctrl, sizeof(ctrl)), 0);
    ck_assert(closed_by_peer(fd));
    close(fd);

    /* Unix socket: a length prefix over the bound; then a body that is not
     * a ClientMsg. */
    uint8_t big[4] = {0xff, 0xff, 0xff, 0x7f};
    fd = unix_to(cl.sock[0]);
    ck_assert_int_eq(send_all(fd, big, sizeof(big)), 0);
    ck_assert(closed_by_peer(fd));
    close(fd);

    uint8_t bad[4 + 6] = {6, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    fd = unix_to(cl.sock[1]);
    ck_assert_int_eq(send_all(fd, bad, sizeof(bad)), 0);
    ck_assert(closed_by_peer(fd));
    close(fd);

    ck_assert(hx_alive(&cl, 0));
    ck_assert(hx_alive(&cl, 1));
    ck_assert_int_eq(hx_run(&cl, 2, "after", 20000, 60, trainer_plain, NULL),
                     0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

static int trainer_alone(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, 64, (void **)&x))
        return hx_fail(c, "alloc");
    int rc = obcomm_allreduce(c, x, 4, OBCOMM_FLOAT32, OBCOMM_SUM);
    const char *needles[] = {"never arrived: node", NULL};
    return expect(c, rc, OBCOMM_E_TIMEOUT, needles);
}

/* Daemons of different clusters refuse each other, each logging both
 * sides' values; ops then time out naming the node that never came. */
START_TEST(handshake_mismatch_is_refused_with_both_values)
{
    const char *a[] = {"--cluster", "alpha", NULL};
    const char *b[] = {"--cluster", "beta", NULL};
    const char *const *each[] = {a, b};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start_each(&cl, 2, each), 0);
    int failed = hx_run(&cl, 1, "split", 500, 60, trainer_alone, NULL);
    ck_assert(hx_log_contains(&cl, 0,
                              "cluster 'alpha' here (rank 0), "
                              "'beta' at the peer (rank 1)"));
    ck_assert(hx_log_contains(&cl, 1, "refused by the peer"));
    ck_assert_int_eq(hx_stop(&cl), 0);
    ck_assert_int_eq(failed, 0);
}
END_TEST

Suite *faults_suite(void)
{
    Suite *s = suite_create("faults");
    TCase *tc = tcase_create("faults");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, count_mismatch_fails_everywhere, 0, 2);
    tcase_add_test(tc, dtype_mismatch_names_the_node);
    tcase_add_test(tc, missing_rank_times_out_with_its_name);
    tcase_add_test(tc, vanished_trainer_fails_the_job);
    tcase_add_test(tc, garbage_is_rejected_and_the_daemon_serves_on);
    tcase_add_test(tc, handshake_mismatch_is_refused_with_both_values);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return ck_run(faults_suite());
}
