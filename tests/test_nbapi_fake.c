/* The non-blocking API against a scripted fake daemon, where the test
 * decides what arrives when, byte by byte:
 * - Completes out of seq order, one split across reads so that
 *   obcomm_test finds only part of it (it keeps the bytes and never
 *   blocks on the rest), an error status with its message;
 * - a Complete for an op not in flight: the stream is out of step, so
 *   every request in flight ends with OBCOMM_E_PROTO and the handle
 *   refuses every later op;
 * - EOF right behind a Complete: that op succeeds, the other ends with
 *   OBCOMM_E_PEER_LOST "obcommd at SOCKET vanished without a goodbye";
 * - a daemon that never answers: obcomm_wait, and obcomm_test polled over
 *   obcomm_fd, end at the op's deadline plus OBC_GRACE_MS, counted from
 *   the submission, with OBCOMM_E_TIMEOUT (never earlier).
 * Everything runs in the test process, so LeakSanitizer checks it. */
#include <check.h>

#include "ck_run.h"
#include <obcomm.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "wire.h"

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The fake runs in a thread of the test process. It and the test take
 * turns: each step of the script starts when the test says "go" and ends
 * with "done", so every byte the fake writes is in the client's socket
 * before the test looks (a Unix socket queues a write at the reader's end
 * before write() returns). */
struct fake {
    char dir[64], path[108];
    int lfd, fd;
    int go[2], done[2];
    int script;
    uint32_t timeout_ms; /* sent in the JoinReply */
    pthread_t thread;
    uint64_t seqs[64]; /* of the Submits read */
    int nseqs;
    char err[256];
};

static int read_all(int fd, void *buf, size_t len)
{
    for (size_t off = 0; off < len;) {
        ssize_t n = read(fd, (char *)buf + off, len - off);
        if (n <= 0)
            return -1;
        off += (size_t)n;
    }
    return 0;
}

static int write_all(int fd, const void *buf, size_t len)
{
    for (size_t off = 0; off < len;) {
        ssize_t n = write(fd, (const char *)buf + off, len - off);
        if (n <= 0)
            return -1;
        off += (size_t)n;
    }
    return 0;
}

/* Reads one ClientMsg; records a Submit's seq. 0 or -1. */
static int fake_read(struct fake *f, Obcomm__ClientMsg__BodyCase want)
{
    uint8_t prefix[OBCOMM_WIRE_PREFIX];
    if (read_all(f->fd, prefix, sizeof(prefix)) != 0)
        return -1;
    uint32_t len = obcomm_wire_len(prefix);
    uint8_t *body = malloc(len ? len : 1);
    if (body == NULL || read_all(f->fd, body, len) != 0) {
        free(body);
        return -1;
    }
    Obcomm__ClientMsg *m = obcomm__client_msg__unpack(NULL, len, body);
    free(body);
    int ok = m != NULL && m->body_case == want;
    if (ok && want == OBCOMM__CLIENT_MSG__BODY_SUBMIT && f->nseqs < 64)
        f->seqs[f->nseqs++] = m->submit->seq;
    if (m != NULL)
        obcomm__client_msg__free_unpacked(m, NULL);
    return ok ? 0 : -1;
}

/* Writes bytes [from, to) of the framed message (to 0: the end). */
static int fake_write(struct fake *f, const Obcomm__DaemonMsg *m, size_t from,
                      size_t to)
{
    size_t len;
    uint8_t *buf = obcomm_wire_pack(&m->base, &len);
    if (buf == NULL)
        return -1;
    if (to == 0 || to > len)
        to = len;
    int rc = write_all(f->fd, buf + from, to - from);
    free(buf);
    return rc;
}

static int fake_complete(struct fake *f, uint64_t seq, int status,
                         const char *msg, size_t from, size_t to)
{
    Obcomm__Complete done = OBCOMM__COMPLETE__INIT;
    done.seq = seq;
    done.status = status;
    done.message = (char *)msg;
    Obcomm__DaemonMsg m = OBCOMM__DAEMON_MSG__INIT;
    m.body_case = OBCOMM__DAEMON_MSG__BODY_COMPLETE;
    m.complete = &done;
    return fake_write(f, &m, from, to);
}

static int fake_turn(struct fake *f)
{
    char b;
    return read_all(f->go[0], &b, 1);
}

static void fake_done(struct fake *f)
{
    char b = 1;
    if (write_all(f->done[1], &b, 1) != 0)
        abort();
}

/* The test's side of a turn: lets the fake run one step, then waits for
 * it to finish (10 s bound). */
static void step(struct fake *f)
{
    char b = 1;
    ck_assert_int_eq(write_all(f->go[1], &b, 1), 0);
    struct pollfd p = {.fd = f->done[0], .events = POLLIN};
    ck_assert_msg(poll(&p, 1, 10000) == 1, "the fake daemon is stuck: %s",
                  f->err);
    ck_assert_int_eq(read_all(f->done[0], &b, 1), 0);
}

#define FAKE_FAIL(f, ...)                                  \
    do {                                                   \
        snprintf((f)->err, sizeof((f)->err), __VA_ARGS__); \
        fake_done(f);                                      \
        return NULL;                                       \
    } while (0)

static void *fake_main(void *arg)
{
    struct fake *f = arg;
    f->fd = accept(f->lfd, NULL, NULL);
    if (f->fd < 0 || fake_read(f, OBCOMM__CLIENT_MSG__BODY_JOIN) != 0)
        FAKE_FAIL(f, "no join");
    Obcomm__JoinReply jr = OBCOMM__JOIN_REPLY__INIT;
    jr.nodes = 1;
    jr.timeout_ms = f->timeout_ms;
    Obcomm__DaemonMsg m = OBCOMM__DAEMON_MSG__INIT;
    m.body_case = OBCOMM__DAEMON_MSG__BODY_JOIN;
    m.join = &jr;
    if (fake_write(f, &m, 0, 0) != 0)
        FAKE_FAIL(f, "join reply");

    switch (f->script) {
    case 0: /* out of order, split, error, unknown seq */
        if (fake_turn(f))
            return NULL;
        for (int k = 0; k < 3; k++)
            if (fake_read(f, OBCOMM__CLIENT_MSG__BODY_SUBMIT))
                FAKE_FAIL(f, "submit %d", k);
        fake_done(f);
        /* Op 2 whole, then the first 3 bytes of op 0's Complete: not
         * even its length prefix. */
        if (fake_turn(f) || fake_complete(f, 2, 0, "", 0, 0) ||
            fake_complete(f, 0, 0, "", 0, 3))
            FAKE_FAIL(f, "step 2");
        fake_done(f);
        if (fake_turn(f) || fake_complete(f, 0, 0, "", 3, 0) ||
            fake_complete(f, 1, OBCOMM_E_MISMATCH, "count differs", 0, 0))
            FAKE_FAIL(f, "step 3");
        fake_done(f);
        if (fake_turn(f) || fake_read(f, OBCOMM__CLIENT_MSG__BODY_SUBMIT) ||
            fake_read(f, OBCOMM__CLIENT_MSG__BODY_SUBMIT) ||
            fake_complete(f, 99, 0, "", 0, 0))
            FAKE_FAIL(f, "step 4");
        fake_done(f);
        break;
    case 1: /* a Complete, then EOF */
        if (fake_turn(f) || fake_read(f, OBCOMM__CLIENT_MSG__BODY_SUBMIT) ||
            fake_read(f, OBCOMM__CLIENT_MSG__BODY_SUBMIT) ||
            fake_complete(f, 0, 0, "", 0, 0))
            FAKE_FAIL(f, "step 1");
        close(f->fd);
        f->fd = -1;
        fake_done(f);
        break;
    case 2: /* never answers */
        if (fake_turn(f) || fake_read(f, OBCOMM__CLIENT_MSG__BODY_SUBMIT))
            FAKE_FAIL(f, "step 1");
        fake_done(f);
        break;
    }
    /* Holds the connection until the test is done with it. */
    fake_turn(f);
    return NULL;
}

static void fake_start(struct fake *f, int script, uint32_t timeout_ms)
{
    memset(f, 0, sizeof(*f));
    f->script = script;
    f->timeout_ms = timeout_ms;
    f->fd = -1;
    snprintf(f->dir, sizeof(f->dir), "/tmp/obcomm-fake-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(f->dir));
    snprintf(f->path, sizeof(f->path), "%s/fake.sock", f->dir);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", f->path);
    f->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(f->lfd, 0);
    ck_assert_int_eq(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(f->lfd, 1), 0);
    ck_assert_int_eq(pipe(f->go), 0);
    ck_assert_int_eq(pipe(f->done), 0);
    ck_assert_int_eq(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

static obcomm_t *fake_connect(struct fake *f)
{
    obcomm_options_t o = {
        .socket_path = f->path, .local_rank = 0, .local_size = 1};
    obcomm_t *c = NULL;
    ck_assert_msg(obcomm_connect(&o, &c) == 0, "connect: %s",
                  obcomm_last_error(NULL));
    return c;
}

static void fake_stop(struct fake *f)
{
    char b = 1;
    ck_assert_int_eq(write_all(f->go[1], &b, 1), 0);
    pthread_join(f->thread, NULL);
    ck_assert_str_eq(f->err, "");
    if (f->fd >= 0)
        close(f->fd);
    close(f->lfd);
    close(f->go[0]);
    close(f->go[1]);
    close(f->done[0]);
    close(f->done[1]);
    unlink(f->path);
    rmdir(f->dir);
}

static void assert_state(obcomm_request_t *r, int want_done, int want_rc,
                         const char *want_msg)
{
    int done = -1;
    ck_assert_int_eq(obcomm_test(r, &done), want_rc);
    ck_assert_int_eq(done, want_done);
    ck_assert_str_eq(obcomm_request_error(r), want_msg);
}

START_TEST(fake_out_of_order_and_split)
{
    struct fake f;
    fake_start(&f, 0, 60000);
    obcomm_t *c = fake_connect(&f);
    obcomm_request_t *r[5];
    for (int k = 0; k < 3; k++)
        ck_assert_int_eq(obcomm_ibarrier(c, &r[k]), 0);
    step(&f); /* the fake read all three */
    ck_assert_int_eq(f.nseqs, 3);
    for (int k = 0; k < 3; k++) {
        ck_assert_int_eq(f.seqs[k], k);
        assert_state(r[k], 0, 0, "");
    }

    step(&f); /* op 2's Complete, 3 bytes of op 0's */
    assert_state(r[2], 1, 0, "");
    assert_state(r[0], 0, 0, "");
    assert_state(r[1], 0, 0, "");

    step(&f); /* the rest of op 0's, op 1 failed */
    assert_state(r[1], 1, OBCOMM_E_MISMATCH, "count differs");
    assert_state(r[0], 1, 0, "");
    ck_assert_int_eq(obcomm_wait(r[1]), OBCOMM_E_MISMATCH);

    /* A Complete of an op not in flight: the stream is out of step, so
     * every request in flight ends with OBCOMM_E_PROTO. */
    ck_assert_int_eq(obcomm_ibarrier(c, &r[3]), 0);
    ck_assert_int_eq(obcomm_ibarrier(c, &r[4]), 0);
    obcomm_request_free(r[4]);
    step(&f);
    ck_assert_int_eq(f.seqs[3], 3);
    ck_assert_int_eq(f.seqs[4], 4);
    ck_assert_int_eq(obcomm_wait(r[3]), OBCOMM_E_PROTO);
    assert_state(r[3], 1, OBCOMM_E_PROTO,
                 "obcommd completed op 99, which is not in flight");
    ck_assert_int_eq(obcomm_barrier(c), OBCOMM_E_PEER_LOST);
    ck_assert_str_eq(obcomm_last_error(c),
                     "connection to obcommd unusable after an earlier "
                     "failure: obcommd completed op 99, which is not in "
                     "flight");
    for (int k = 0; k < 4; k++)
        obcomm_request_free(r[k]);
    obcomm_close(c);
    fake_stop(&f);
}
END_TEST

START_TEST(fake_complete_then_eof)
{
    struct fake f;
    fake_start(&f, 1, 60000);
    obcomm_t *c = fake_connect(&f);
    obcomm_request_t *r[2];
    ck_assert_int_eq(obcomm_ibarrier(c, &r[0]), 0);
    ck_assert_int_eq(obcomm_ibarrier(c, &r[1]), 0);
    step(&f);
    /* The Complete ahead of the EOF is delivered; the other op is lost. */
    ck_assert_int_eq(obcomm_wait(r[1]), OBCOMM_E_PEER_LOST);
    char gone[512];
    snprintf(gone, sizeof(gone),
             "obcommd at %s vanished without a goodbye (killed or crashed): "
             "run `systemctl status obcommd` (and `journalctl -u obcommd`) "
             "on this node to see why, then resume the job from its last "
             "checkpoint",
             f.path);
    assert_state(r[1], 1, OBCOMM_E_PEER_LOST, gone);
    assert_state(r[0], 1, 0, "");
    obcomm_close(c);
    obcomm_request_free(r[0]);
    obcomm_request_free(r[1]);
    fake_stop(&f);
}
END_TEST

START_TEST(fake_never_answers)
{
    struct fake f;
    fake_start(&f, 2, 300);
    obcomm_t *c = fake_connect(&f);
    obcomm_request_t *r;
    int64_t t0 = now_ms();
    ck_assert_int_eq(obcomm_ibarrier(c, &r), 0);
    step(&f);
    int done = -1;
    ck_assert_int_eq(obcomm_test(r, &done), 0);
    ck_assert_int_eq(done, 0);
    ck_assert_int_eq(obcomm_wait(r), OBCOMM_E_TIMEOUT);
    int64_t took = now_ms() - t0;
    ck_assert_msg(took >= 5300, "waited %lld ms", (long long)took);
    assert_state(r, 1, OBCOMM_E_TIMEOUT,
                 "daemon did not answer op 0 within 5300 ms");
    obcomm_request_free(r);
    obcomm_close(c);
    fake_stop(&f);
}
END_TEST

/* A caller that only tests (a progress thread polling obcomm_fd) meets
 * the same bound as obcomm_wait. */
START_TEST(fake_never_answers_to_test)
{
    struct fake f;
    fake_start(&f, 2, 300);
    obcomm_t *c = fake_connect(&f);
    obcomm_request_t *r;
    int64_t t0 = now_ms();
    ck_assert_int_eq(obcomm_ibarrier(c, &r), 0);
    step(&f);
    int done = 0, rc = 0;
    while (!done) {
        struct pollfd p = {.fd = obcomm_fd(c), .events = POLLIN};
        poll(&p, 1, 100);
        rc = obcomm_test(r, &done);
    }
    ck_assert_int_eq(rc, OBCOMM_E_TIMEOUT);
    int64_t took = now_ms() - t0;
    ck_assert_msg(took >= 5300, "timed out after %lld ms", (long long)took);
    assert_state(r, 1, OBCOMM_E_TIMEOUT,
                 "daemon did not answer op 0 within 5300 ms");
    obcomm_request_free(r);
    obcomm_close(c);
    fake_stop(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("nbapi_fake");
    TCase *tc = tcase_create("fake");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, fake_out_of_order_and_split);
    tcase_add_test(tc, fake_complete_then_eof);
    tcase_add_test(tc, fake_never_answers);
    tcase_add_test(tc, fake_never_answers_to_test);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
