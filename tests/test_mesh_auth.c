/* The mesh's TCP side, against real daemons on loopback: a cluster key
 * keeps out peers without it or with another one while a job runs, an
 * impostor of a connected rank changes nothing, a replayed handshake
 * fails, 300 idle connections lock nobody out, nodes with different
 * segment sizes refuse each other by name, and bad key files or an open
 * listen address without a key stop the daemon at start. */
#include <check.h>

#include "ck_run.h"
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "config.h"
#include "frame.h"
#include "harness.h"
#include "obcomm.pb-c.h"
#include "wire.h"

static char keydir[64];

/* A key file of len bytes with the given mode; returns its path (static
 * storage per name). */
static const char *make_key(const char *name, size_t len, mode_t mode,
                            char seed)
{
    static char paths[8][128];
    static int next;
    char *path = paths[next++ % 8];
    if (keydir[0] == '\0') {
        snprintf(keydir, sizeof(keydir), "/tmp/obcomm-keys-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(keydir));
    }
    snprintf(path, 128, "%s/%s", keydir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    for (size_t i = 0; i < len; i++) {
        char c = (char)(seed + (char)(i * 11));
        ck_assert_int_eq(write(fd, &c, 1), 1);
    }
    close(fd);
    ck_assert_int_eq(chmod(path, mode), 0);
    return path;
}

/* ---- a raw peer, speaking the handshake by hand ---- */

static int tcp_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = 2};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* Appends a control frame with body to rec (the bytes sent, for a
 * replay) and sends it. */
static void send_body(int fd, const uint8_t *body, size_t len, uint8_t *rec,
                      size_t *reclen)
{
    uint8_t buf[4096];
    struct obd_frame f = {.version = OBCOMM_PROTO_VERSION,
                          .type = OBD_FRAME_CTRL,
                          .len = (uint32_t)len};
    ck_assert_uint_le(len + OBD_FRAME_HDR, sizeof(buf));
    obd_frame_encode(&f, buf);
    memcpy(buf + OBD_FRAME_HDR, body, len);
    ck_assert_int_eq(send(fd, buf, OBD_FRAME_HDR + len, MSG_NOSIGNAL),
                     (ssize_t)(OBD_FRAME_HDR + len));
    if (rec != NULL) {
        memcpy(rec + *reclen, buf, OBD_FRAME_HDR + len);
        *reclen += OBD_FRAME_HDR + len;
    }
}

static int read_all(int fd, uint8_t *p, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, p + got, len - got, 0);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* The next control message (its packed bytes in raw), or NULL at EOF or
 * after 2 s of silence. */
static Obcomm__PeerMsg *read_msg(int fd, uint8_t *raw, size_t *rawlen)
{
    uint8_t hdr[OBD_FRAME_HDR];
    struct obd_frame f;
    const char *why;
    if (read_all(fd, hdr, sizeof(hdr)) != 0)
        return NULL;
    ck_assert_int_eq(obd_frame_decode(hdr, 4096, 1 << 20, &f, &why), 0);
    ck_assert_int_eq(f.type, OBD_FRAME_CTRL);
    if (read_all(fd, raw, f.len) != 0)
        return NULL;
    *rawlen = f.len;
    return obcomm__peer_msg__unpack(NULL, f.len, raw);
}

/* The world the harness's daemons see, for the fingerprint. */
static void world_of(const struct hx_cluster *cl, struct obd_config *cfg)
{
    char err[256];
    obd_config_defaults(cfg);
    ck_assert_int_eq(obd_config_set(cfg, "peers", cl->peers, err, sizeof(err)),
                     0);
    ck_assert_int_eq(obd_config_set(cfg, "rank", "1", err, sizeof(err)), 0);
    ck_assert_int_eq(obd_config_finish(cfg, err, sizeof(err)), 0);
}

/* Dials node 0 of cl claiming rank 1 and goes through the handshake,
 * proving `key` (NULL: an empty proof). Returns the refusal the daemon
 * sent ("" when it accepted: it says nothing then), or "closed". The
 * frames sent are kept in rec for a replay. */
static const char *claim_rank1(const struct hx_cluster *cl, const uint8_t *key,
                               uint8_t *rec, size_t *reclen)
{
    static char answer[256];
    struct obd_config cfg;
    world_of(cl, &cfg);
    int fd = tcp_to(cl->port[0]);
    ck_assert_int_ge(fd, 0);
    *reclen = 0;

    Obcomm__Hello h = OBCOMM__HELLO__INIT;
    Obcomm__PeerMsg m = OBCOMM__PEER_MSG__INIT;
    Obcomm__Option o1 = OBCOMM__OPTION__INIT, o2 = OBCOMM__OPTION__INIT,
                   o3 = OBCOMM__OPTION__INIT;
    Obcomm__Option *opts[] = {&o1, &o2, &o3};
    uint8_t nonce[32], hd[1024], ha[4096], buf[4096];
    size_t hdlen, halen, len;
    obd_auth_random(nonce, sizeof(nonce));
    o1.name = "segment_bytes";
    o1.value = "1048576";
    o2.name = "wire_protection";
    o2.value = "none";
    o3.name = "owner_identity";
    o3.value = "uid";
    h.proto_version = OBCOMM_PROTO_VERSION;
    h.cluster = cfg.cluster;
    h.rank = 1;
    h.world_size = (uint32_t)cfg.nodes;
    h.world_fingerprint = cfg.fingerprint;
    h.nonce.data = nonce;
    h.nonce.len = sizeof(nonce);
    h.n_options = 3;
    h.options = opts;
    h.peer_rank = 0;
    m.body_case = OBCOMM__PEER_MSG__BODY_HELLO;
    m.hello = &h;
    hdlen = protobuf_c_message_pack(&m.base, hd);
    send_body(fd, hd, hdlen, rec, reclen);

    Obcomm__PeerMsg *r = read_msg(fd, ha, &halen);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->body_case, OBCOMM__PEER_MSG__BODY_HELLO);
    obcomm__peer_msg__free_unpacked(r, NULL);
    r = read_msg(fd, buf, &len);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->body_case, OBCOMM__PEER_MSG__BODY_AUTH);
    ck_assert_uint_eq(r->auth->proof.len, OBD_AUTH_PROOF);
    obcomm__peer_msg__free_unpacked(r, NULL);

    Obcomm__Auth a = OBCOMM__AUTH__INIT;
    Obcomm__PeerMsg am = OBCOMM__PEER_MSG__INIT;
    uint8_t t[32], proof[32];
    if (key != NULL) {
        obd_auth_transcript(hd, hdlen, ha, halen, t);
        obd_auth_proof(key, OBD_AUTH_DIALER, t, proof);
        a.proof.data = proof;
        a.proof.len = sizeof(proof);
    }
    am.body_case = OBCOMM__PEER_MSG__BODY_AUTH;
    am.auth = &a;
    len = protobuf_c_message_pack(&am.base, buf);
    send_body(fd, buf, len, rec, reclen);

    /* Accepted: silence (or the end, once the real node 1 redials and
     * takes the link back). Refused: a Refuse in clear, then the end. */
    r = read_msg(fd, buf, &len);
    if (r == NULL) {
        answer[0] = '\0';
    } else {
        ck_assert_int_eq(r->body_case, OBCOMM__PEER_MSG__BODY_REFUSE);
        snprintf(answer, sizeof(answer), "%s", r->refuse->reason);
        obcomm__peer_msg__free_unpacked(r, NULL);
    }
    close(fd);
    return answer;
}

/* Sends recorded bytes on a new connection; returns the refusal. */
static const char *replay(const struct hx_cluster *cl, const uint8_t *rec,
                          size_t reclen)
{
    static char answer[256];
    uint8_t buf[4096];
    size_t len;
    int fd = tcp_to(cl->port[0]);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(send(fd, rec, reclen, MSG_NOSIGNAL), (ssize_t)reclen);
    snprintf(answer, sizeof(answer), "closed");
    for (int i = 0; i < 3; i++) {
        Obcomm__PeerMsg *r = read_msg(fd, buf, &len);
        if (r == NULL)
            break;
        int refused = r->body_case == OBCOMM__PEER_MSG__BODY_REFUSE;
        if (refused)
            snprintf(answer, sizeof(answer), "%s", r->refuse->reason);
        obcomm__peer_msg__free_unpacked(r, NULL);
        if (refused)
            break;
    }
    close(fd);
    return answer;
}

/* ---- trainers ---- */

#define COUNT (1u << 20) /* 4 MiB of fp32: four segments */

static int check_sum(obcomm_t *c, float *x, int round)
{
    int size = obcomm_size(c);
    for (uint32_t i = 1; i < COUNT; i++)
        x[i] = (float)(obcomm_rank(c) + 1) * (float)(i % 5 + round % 3);
    int rc = obcomm_allreduce(c, x, COUNT, OBCOMM_FLOAT32, OBCOMM_SUM);
    if (rc)
        return hx_fail(c, "allreduce %d: %s", round, obcomm_strerror(rc));
    float ranks = (float)(size * (size + 1) / 2);
    for (uint32_t i = 1; i < COUNT; i++)
        if (x[i] != ranks * (float)(i % 5 + round % 3))
            return hx_fail(c, "round %d: x[%u] = %g", round, i, (double)x[i]);
    return 0;
}

static int trainer_sums(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, COUNT * sizeof(float), (void **)&x))
        return hx_fail(c, "alloc");
    for (int round = 0; round < 3; round++) {
        x[0] = 0;
        if (check_sum(c, x, round))
            return 1;
    }
    return 0;
}

/* Rounds until `stop` (a file) exists on rank 0; element 0 carries the
 * decision so that every rank stops after the same op. */
static int trainer_until(obcomm_t *c, void *arg)
{
    const char *stop = arg;
    float *x;
    if (obcomm_alloc(c, COUNT * sizeof(float), (void **)&x))
        return hx_fail(c, "alloc");
    for (int round = 0; round < 100000; round++) {
        x[0] = obcomm_rank(c) == 0 && access(stop, F_OK) == 0 ? 1.0f : 0.0f;
        if (check_sum(c, x, round))
            return 1;
        if (x[0] != 0)
            return round >= 2 ? 0 : hx_fail(c, "only %d rounds", round);
    }
    return hx_fail(c, "never told to stop");
}

static const char *wire_names[] = {"none", "integrity", "encrypt"};

/* Every wire mode moves the same bytes between two keyed nodes. */
START_TEST(keyed_mesh_runs_every_wire_mode)
{
    const char *key = make_key("k", 32, 0600, 'a');
    const char *flags[] = {"--auth_key_file", key, "--wire_protection",
                           wire_names[_i], NULL};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, flags), 0);
    ck_assert_int_eq(hx_run(&cl, 2, "sums", 20000, 120, trainer_sums, NULL), 0);
    ck_assert(hx_log_contains(&cl, 0, "is up, authenticated"));
    ck_assert_int_eq(hx_metric(&cl, 0, "auth_failures"), 0);
    ck_assert_int_eq(hx_metric(&cl, 1, "auth_failures"), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* Without the key, with another key, or as an impostor of the connected
 * rank 1: refused with nothing but "authentication failed", logged with
 * the source, counted; the running job never notices. */
START_TEST(intruders_are_refused_and_the_job_runs_on)
{
    const char *key = make_key("k", 32, 0600, 'a');
    const char *flags[] = {"--auth_key_file", key, NULL};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, flags), 0);
    char stop[200];
    snprintf(stop, sizeof(stop), "%s/stop", cl.dir);
    pid_t t0 = hx_spawn(&cl, 0, 0, 1, "long", 20000, trainer_until, stop);
    pid_t t1 = hx_spawn(&cl, 1, 0, 1, "long", 20000, trainer_until, stop);
    ck_assert_int_gt(t0, 0);
    ck_assert_int_gt(t1, 0);
    for (int i = 0; i < 500 && hx_metric(&cl, 0, "allreduce_ops") < 1; i++)
        hx_sleep_ms(20);
    ck_assert_int_ge(hx_metric(&cl, 0, "allreduce_ops"), 1);

    uint8_t rec[4096], wrong[OBD_AUTH_KEY];
    size_t reclen;
    ck_assert_int_eq(obd_auth_init(), 0);
    obd_auth_random(wrong, sizeof(wrong));
    ck_assert_str_eq(claim_rank1(&cl, NULL, rec, &reclen),
                     "authentication failed");
    ck_assert_str_eq(claim_rank1(&cl, wrong, rec, &reclen),
                     "authentication failed");
    /* Auth before any Hello. */
    int fd = tcp_to(cl.port[0]);
    Obcomm__Auth a = OBCOMM__AUTH__INIT;
    Obcomm__PeerMsg am = OBCOMM__PEER_MSG__INIT;
    uint8_t buf[256];
    am.body_case = OBCOMM__PEER_MSG__BODY_AUTH;
    am.auth = &a;
    send_body(fd, buf, protobuf_c_message_pack(&am.base, buf), NULL, NULL);
    size_t len;
    Obcomm__PeerMsg *r = read_msg(fd, buf, &len);
    ck_assert_ptr_nonnull(r);
    ck_assert_str_eq(r->refuse->reason, "authentication failed");
    obcomm__peer_msg__free_unpacked(r, NULL);
    close(fd);

    /* The job runs on past the attacks: an op completes after them
     * before the trainers are told to stop (so each has done two). */
    int ops_during = (int)hx_metric(&cl, 0, "allreduce_ops");
    for (int i = 0; i < 500 && hx_metric(&cl, 0, "allreduce_ops") <= ops_during;
         i++)
        hx_sleep_ms(20);
    fd = open(stop, O_WRONLY | O_CREAT, 0600);
    close(fd);
    int s0 = hx_wait(t0, 60000), s1 = hx_wait(t1, 60000);
    ck_assert(WIFEXITED(s0) && WEXITSTATUS(s0) == 0);
    ck_assert(WIFEXITED(s1) && WEXITSTATUS(s1) == 0);
    /* The attacks came while the job ran, and it ran on past them. */
    ck_assert_int_gt(hx_metric(&cl, 0, "allreduce_ops"), ops_during);

    ck_assert_int_eq(hx_metric(&cl, 0, "auth_failures"), 3);
    ck_assert(hx_log_contains(&cl, 0, "peer connection from 127.0.0.1:"));
    ck_assert(hx_log_contains(&cl, 0, "failed authentication"));
    ck_assert(!hx_log_contains(&cl, 0, "replaced by a new connection"));
    ck_assert(!hx_log_contains(&cl, 0, "link to node 1 is down"));
    ck_assert(!hx_log_contains(&cl, 1, "is down"));
    ck_assert_int_eq(hx_metric(&cl, 0, "links_up"), 1);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* A handshake that succeeded, sent again byte for byte on a new
 * connection, fails: the acceptor's nonce is new. */
START_TEST(replayed_handshake_is_refused)
{
    const char *path = make_key("k", 40, 0600, 'q');
    const char *flags[] = {"--auth_key_file", path, NULL};
    char err[256];
    uint8_t key[OBD_AUTH_KEY];
    ck_assert_int_eq(obd_auth_init(), 0);
    ck_assert_int_eq(obd_auth_key_load(path, key, err, sizeof(err)), 0);
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, flags), 0);

    uint8_t rec[4096];
    size_t reclen;
    ck_assert_str_eq(claim_rank1(&cl, key, rec, &reclen), "");
    ck_assert_int_eq(hx_metric(&cl, 0, "auth_failures"), 0);
    /* It was taken for node 1 (the key is all it takes). */
    ck_assert(hx_log_contains(&cl, 0, "replaced by a new connection"));
    ck_assert_str_eq(replay(&cl, rec, reclen), "authentication failed");
    ck_assert_int_eq(hx_metric(&cl, 0, "auth_failures"), 1);
    /* The real node 1 comes back and the mesh works. */
    ck_assert_int_eq(hx_run(&cl, 1, "after", 20000, 120, trainer_sums, NULL),
                     0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

static int count_lines(const struct hx_cluster *cl, int i, const char *s)
{
    char path[200], line[2048];
    snprintf(path, sizeof(path), "%s/node%d.log", cl->dir, i);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        n += strstr(line, s) != NULL;
    if (f != NULL)
        fclose(f);
    return n;
}

/* 300 connections that never say Hello: the oldest are closed past
 * max_unauth_per_addr, a restarted node gets back in, trainers run, and
 * the log says so a few times, not 300. */
START_TEST(idle_connections_lock_nobody_out)
{
    const char *key = make_key("k", 32, 0600, 'a');
    const char *flags[] = {"--auth_key_file", key, NULL};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, flags), 0);
    /* The mesh first: then every connection from 127.0.0.1 is the
     * flood's own. */
    for (int i = 0; i < 250 && hx_metric(&cl, 0, "links_up") != 1; i++)
        hx_sleep_ms(20);
    ck_assert_int_eq(hx_metric(&cl, 0, "links_up"), 1);
    static int fds[300];
    for (int i = 0; i < 300; i++) {
        fds[i] = tcp_to(cl.port[0]);
        ck_assert_int_ge(fds[i], 0);
    }
    for (int i = 0; i < 200 && hx_metric(&cl, 0, "unauth_closed") < 292; i++)
        hx_sleep_ms(20);
    ck_assert_int_eq(hx_metric(&cl, 0, "unauth_closed"), 292);

    /* Node 1 crashes and comes back: it must get through to node 0. */
    ck_assert_int_eq(hx_restart_node(&cl, 1, SIGKILL), 0);
    ck_assert_int_eq(hx_run(&cl, 2, "after", 20000, 120, trainer_sums, NULL),
                     0);
    ck_assert_int_le(count_lines(&cl, 0, "too many peer connections"), 2);
    for (int i = 0; i < 300; i++)
        close(fds[i]);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* Node 1 has another cluster key than node 0, and dials it: node 0, the
 * healthy dialed side, sees its proof refused, logs the failed
 * authentication and counts it, as node 1 does. A trainer on node 0 gets
 * OBCOMM_E_TIMEOUT naming node 1 at its deadline: a node that cannot be
 * reached gets no grace beyond it. */
static volatile long long *alone_ms;
static volatile int *alone_rc;

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#define ALONE_DEADLINE 2000

static int trainer_without_node1(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, 64, (void **)&x))
        return hx_fail(c, "alloc");
    for (int i = 0; i < 5; i++)
        x[i] = 1.0f;
    long long t0 = now_ms();
    int rc = obcomm_allreduce(c, x, 5, OBCOMM_FLOAT32, OBCOMM_SUM);
    *alone_ms = now_ms() - t0;
    *alone_rc = rc;
    if (rc != OBCOMM_E_TIMEOUT ||
        strstr(obcomm_last_error(c), "never arrived: node 1") == NULL)
        return hx_fail(c, "got %d (%s), want a timeout naming node 1", rc,
                       obcomm_last_error(c));
    return 0;
}

START_TEST(wrong_key_is_counted_on_the_dialed_side)
{
    const char *ka = make_key("ka", 32, 0600, 'a');
    const char *kb = make_key("kb", 32, 0600, 'b');
    const char *a[] = {"--auth_key_file", ka, NULL};
    const char *b[] = {"--auth_key_file", kb, NULL};
    const char *const *each[] = {a, b};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start_each(&cl, 2, each), 0);
    for (int i = 0; i < 500 && (hx_metric(&cl, 0, "auth_failures") < 1 ||
                                hx_metric(&cl, 1, "auth_failures") < 1);
         i++)
        hx_sleep_ms(20);
    ck_assert_int_ge(hx_metric(&cl, 0, "auth_failures"), 1);
    ck_assert_int_ge(hx_metric(&cl, 1, "auth_failures"), 1);
    ck_assert(hx_log_contains(&cl, 0,
                              "failed authentication: it refused "
                              "our proof"));
    ck_assert(hx_log_contains(&cl, 1, "failed authentication"));
    ck_assert(!hx_log_contains(&cl, 0, "refused by the peer"));
    ck_assert_int_eq(hx_metric(&cl, 0, "links_up"), 0);

    alone_ms = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne((void *)alone_ms, MAP_FAILED);
    alone_rc = (volatile int *)(alone_ms + 1);
    pid_t t = hx_spawn(&cl, 0, 0, 1, "alone", ALONE_DEADLINE,
                       trainer_without_node1, NULL);
    ck_assert_int_gt(t, 0);
    int st = hx_wait(t, 30000);
    fprintf(stderr, "an op without node 1: rc %d after %lld ms (deadline %d)\n",
            *alone_rc, *alone_ms, ALONE_DEADLINE);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ck_assert_int_ge(*alone_ms, ALONE_DEADLINE - 5);
    /* The grace a reachable node gets is a quarter of the deadline. */
    ck_assert_int_lt(*alone_ms, ALONE_DEADLINE + ALONE_DEADLINE / 8);
    munmap((void *)alone_ms, 4096);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* ---- a key holder that sends what it should not ---- */

/* The next control message from fd, data frames skipped; NULL at EOF or
 * after 2 s of silence. */
static Obcomm__PeerMsg *next_ctrl(int fd, uint8_t *raw, size_t cap)
{
    for (;;) {
        uint8_t hdr[OBD_FRAME_HDR];
        struct obd_frame f;
        const char *why;
        if (read_all(fd, hdr, sizeof(hdr)) != 0)
            return NULL;
        ck_assert_int_eq(obd_frame_decode(hdr, 1 << 20, 1 << 20, &f, &why), 0);
        ck_assert_uint_le(f.len, cap);
        if (read_all(fd, raw, f.len) != 0)
            return NULL;
        if (f.type == OBD_FRAME_CTRL)
            return obcomm__peer_msg__unpack(NULL, f.len, raw);
    }
}

/* The next announce (phase 0) of job `job` from fd, or NULL. */
static Obcomm__PeerMsg *next_announce(int fd, const char *job, int failed)
{
    static uint8_t raw[1 << 20];
    for (int i = 0; i < 200; i++) {
        Obcomm__PeerMsg *m = next_ctrl(fd, raw, sizeof(raw));
        if (m == NULL)
            return NULL;
        if (m->body_case == OBCOMM__PEER_MSG__BODY_ANNOUNCE &&
            strcmp(m->announce->job, job) == 0 && m->announce->phase == 0 &&
            (m->announce->status != 0) == failed)
            return m;
        obcomm__peer_msg__free_unpacked(m, NULL);
    }
    return NULL;
}

/* Takes node 1's place in an unkeyed two-node cluster whose node 1 was
 * killed: a handshake as rank 1 with no proof. Returns the socket. */
static int become_node1(const struct hx_cluster *cl)
{
    struct obd_config cfg;
    world_of(cl, &cfg);
    int fd = tcp_to(cl->port[0]);
    ck_assert_int_ge(fd, 0);
    Obcomm__Hello h = OBCOMM__HELLO__INIT;
    Obcomm__PeerMsg m = OBCOMM__PEER_MSG__INIT;
    Obcomm__Option o1 = OBCOMM__OPTION__INIT, o2 = OBCOMM__OPTION__INIT,
                   o3 = OBCOMM__OPTION__INIT;
    Obcomm__Option *opts[] = {&o1, &o2, &o3};
    uint8_t nonce[32], buf[4096];
    size_t len;
    obd_auth_random(nonce, sizeof(nonce));
    o1.name = "segment_bytes";
    o1.value = "1048576";
    o2.name = "wire_protection";
    o2.value = "none";
    o3.name = "owner_identity";
    o3.value = "uid";
    h.proto_version = OBCOMM_PROTO_VERSION;
    h.cluster = cfg.cluster;
    h.rank = 1;
    h.world_size = (uint32_t)cfg.nodes;
    h.world_fingerprint = cfg.fingerprint;
    h.nonce.data = nonce;
    h.nonce.len = sizeof(nonce);
    h.n_options = 3;
    h.options = opts;
    h.peer_rank = 0;
    m.body_case = OBCOMM__PEER_MSG__BODY_HELLO;
    m.hello = &h;
    send_body(fd, buf, protobuf_c_message_pack(&m.base, buf), NULL, NULL);
    Obcomm__PeerMsg *r = read_msg(fd, buf, &len);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->body_case, OBCOMM__PEER_MSG__BODY_HELLO);
    obcomm__peer_msg__free_unpacked(r, NULL);
    r = read_msg(fd, buf, &len);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->body_case, OBCOMM__PEER_MSG__BODY_AUTH);
    obcomm__peer_msg__free_unpacked(r, NULL);
    Obcomm__Auth a = OBCOMM__AUTH__INIT;
    Obcomm__PeerMsg am = OBCOMM__PEER_MSG__INIT;
    am.body_case = OBCOMM__PEER_MSG__BODY_AUTH;
    am.auth = &a;
    send_body(fd, buf, protobuf_c_message_pack(&am.base, buf), NULL, NULL);
    struct timeval tv = {.tv_sec = 30};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

#define FORGED_DEADLINE 20000
#define FORGED_COUNT    1003

static int trainer_forged(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, FORGED_COUNT * sizeof(float), (void **)&x))
        return hx_fail(c, "alloc");
    for (int i = 0; i < FORGED_COUNT; i++)
        x[i] = 1.0f;
    long long t0 = now_ms();
    int rc = obcomm_allreduce(c, x, FORGED_COUNT, OBCOMM_FLOAT32, OBCOMM_SUM);
    alone_ms[0] = now_ms() - t0;
    *alone_rc = rc;
    snprintf((char *)(alone_ms + 2), 1024, "%s", obcomm_last_error(c));
    return 0;
}

/* A key holder (here: any peer of an unkeyed cluster) as node 1 answers
 * node 0's announce (_i == 1: with another count) and then (_i == 0)
 * sends a data frame of the op under another fingerprint. Node 0's
 * trainer gets the error at once, not at the deadline, and node 0
 * announces the failure, so that every other node fails the op at once
 * too. */
START_TEST(forged_frames_fail_the_op_at_once_everywhere)
{
    struct hx_cluster cl;
    ck_assert_int_eq(obd_auth_init(), 0);
    ck_assert_int_eq(hx_start(&cl, 2, NULL), 0);
    for (int i = 0; i < 500 && hx_metric(&cl, 0, "links_up") != 1; i++)
        hx_sleep_ms(20);
    kill(cl.daemon[1], SIGKILL);
    int st;
    ck_assert_int_eq(waitpid(cl.daemon[1], &st, 0), cl.daemon[1]);
    cl.exited[1] = 1;
    cl.status[1] = 0; /* killed on purpose */
    ck_assert(hx_log_wait(&cl, 0, "link to node 1 is down", 10000));
    int fd = become_node1(&cl);
    for (int i = 0; i < 500 && hx_metric(&cl, 0, "links_up") != 1; i++)
        hx_sleep_ms(20);
    ck_assert_int_eq(hx_metric(&cl, 0, "links_up"), 1);

    alone_ms = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne((void *)alone_ms, MAP_FAILED);
    alone_rc = (volatile int *)(alone_ms + 1);
    pid_t t =
        hx_spawn(&cl, 0, 0, 1, "forged", FORGED_DEADLINE, trainer_forged, NULL);
    ck_assert_int_gt(t, 0);

    Obcomm__PeerMsg *m = next_announce(fd, "forged", 0);
    ck_assert_ptr_nonnull(m);
    Obcomm__OpAnnounce an = *m->announce;
    an.base = m->announce->base;
    an.node_rank = 1;
    an.run = 0x5eed5eed5eed5eedull;
    an.ef = NULL;
    if (_i == 1)
        an.count = FORGED_COUNT - 1;
    Obcomm__PeerMsg out = OBCOMM__PEER_MSG__INIT;
    out.body_case = OBCOMM__PEER_MSG__BODY_ANNOUNCE;
    out.announce = &an;
    static uint8_t buf[1 << 16];
    send_body(fd, buf, protobuf_c_message_pack(&out.base, buf), NULL, NULL);
    uint64_t seq = an.seq;
    obcomm__peer_msg__free_unpacked(m, NULL);
    if (_i == 0) {
        /* A frame of the op, which now runs on node 0, under another
         * fingerprint. */
        uint8_t frame[OBD_FRAME_HDR + 16] = {0};
        struct obd_frame f = {.version = OBCOMM_PROTO_VERSION,
                              .type = OBD_FRAME_DATA,
                              .job = obd_frame_job_id("forged"),
                              .seq = seq,
                              .fingerprint = 0xbadf00dbadf00dull,
                              .len = 16};
        obd_frame_encode(&f, frame);
        ck_assert_int_eq(send(fd, frame, sizeof(frame), MSG_NOSIGNAL),
                         (ssize_t)sizeof(frame));
    }
    /* Node 0 tells node 1 that the op failed. */
    m = next_announce(fd, "forged", 1);
    ck_assert_ptr_nonnull(m);
    ck_assert_uint_eq(m->announce->seq, seq);
    ck_assert_int_eq(m->announce->status,
                     _i == 0 ? OBCOMM_E_PROTO : OBCOMM_E_MISMATCH);
    obcomm__peer_msg__free_unpacked(m, NULL);

    ck_assert_int_eq(hx_wait(t, 60000) != -1, 1);
    fprintf(stderr, "forged %s: rc %d after %lld ms: %s\n",
            _i == 0 ? "fingerprint" : "announce", *alone_rc, alone_ms[0],
            (const char *)(alone_ms + 2));
    ck_assert_int_eq(*alone_rc, _i == 0 ? OBCOMM_E_PROTO : OBCOMM_E_MISMATCH);
    ck_assert_int_lt(alone_ms[0], FORGED_DEADLINE / 2);
    ck_assert_ptr_nonnull(strstr(
        (const char *)(alone_ms + 2),
        _i == 0 ? "node 1 sent a frame with fingerprint" : "count differs"));
    close(fd);
    munmap((void *)alone_ms, 4096);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* Options that must agree are compared after the proofs: both nodes name
 * the option and both values. Also without a key. */
START_TEST(different_segment_sizes_are_refused_by_name)
{
    const char *key = make_key("k", 32, 0600, 'a');
    const char *a_keyed[] = {"--auth_key_file", key, NULL};
    const char *b_keyed[] = {"--auth_key_file", key, "--segment_bytes", "65536",
                             NULL};
    const char *b_plain[] = {"--segment_bytes", "65536", NULL};
    const char *const *each[] = {_i ? a_keyed : NULL, _i ? b_keyed : b_plain};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start_each(&cl, 2, each), 0);
    const char *at0 = "option segment_bytes is 1048576 here (rank 0) and "
                      "65536 at rank 1";
    const char *at1 = "option segment_bytes is 65536 here (rank 1) and "
                      "1048576 at rank 0";
    for (int i = 0; i < 250 && !(hx_log_contains(&cl, 0, at0) &&
                                 hx_log_contains(&cl, 1, at1));
         i++)
        hx_sleep_ms(20);
    ck_assert(hx_log_contains(&cl, 0, at0));
    ck_assert(hx_log_contains(&cl, 1, at1));
    ck_assert_int_eq(hx_metric(&cl, 0, "links_up"), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

static int unix_to(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A daemon out of descriptors pauses accepting (counted) instead of
 * spinning on the pending connection, says so a few times rather than
 * once per attempt, and serves again once descriptors are free. */
START_TEST(out_of_descriptors_pauses_accepting)
{
    struct rlimit was, low;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &was), 0);
    low = was;
    low.rlim_cur = 64; /* the daemons inherit it */
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
    struct hx_cluster cl;
    int started = hx_start(&cl, 2, NULL);
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &was), 0);
    ck_assert_int_eq(started, 0);

    /* Unix connections (that never say anything) use up node 0's
     * descriptors; then peers knock too. */
    static int fds[200];
    int n = 0;
    for (; n < 120; n++) {
        fds[n] = unix_to(cl.sock[0]);
        if (fds[n] < 0)
            break;
    }
    for (int i = 0; i < 20; i++) {
        int fd = tcp_to(cl.port[0]);
        if (fd >= 0)
            fds[n++] = fd;
    }
    /* obcommctl itself cannot get in while descriptors are out, so the
     * pause is seen in the log (a file the daemon already holds open):
     * accept4 failing with EMFILE logs "Too many open files" as it
     * pauses. The counter is read after the descriptors are free again. */
    for (int i = 0; i < 500 && !hx_log_contains(&cl, 0, "Too many open files");
         i++)
        hx_sleep_ms(20);
    ck_assert_msg(hx_log_contains(&cl, 0, "Too many open files"),
                  "node 0 never ran out of descriptors");
    for (int i = 0; i < n; i++)
        close(fds[i]);
    long long pauses = -1;
    for (int i = 0; i < 100 && pauses < 1; i++) {
        pauses = hx_metric(&cl, 0, "accept_pauses");
        hx_sleep_ms(20);
    }
    ck_assert_int_ge(pauses, 1);
    ck_assert_int_le(count_lines(&cl, 0, "Too many open files"), 3);
    ck_assert_int_eq(hx_run(&cl, 1, "after", 20000, 120, trainer_sums, NULL),
                     0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* Runs obcommd with args for at most 3 s; returns its exit status (-1:
 * still running, then stopped) and its stderr in out. */
static int run_daemon(const char *const *args, char *out, size_t outlen)
{
    char logf[128];
    snprintf(logf, sizeof(logf), "%s/run.log", keydir);
    const char *argv[32];
    int n = 0;
    argv[n++] = getenv("OBCOMMD");
    for (int i = 0; args[i]; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(logf, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status = -1;
    for (int i = 0; i < 150; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            break;
        status = -1;
        hx_sleep_ms(20);
    }
    if (status == -1) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
    }
    FILE *f = fopen(logf, "r");
    size_t got = f ? fread(out, 1, outlen - 1, f) : 0;
    out[got] = '\0';
    if (f)
        fclose(f);
    return status == -1 ? -1 : WEXITSTATUS(status);
}

START_TEST(bad_keys_and_open_listeners_stop_the_start)
{
    char out[4096], sock[128], peers[64];
    const char *shortk = make_key("short", 31, 0600, 'a');
    const char *openk = make_key("open", 32, 0644, 'a');
    make_key("good", 32, 0600, 'a');
    snprintf(sock, sizeof(sock), "%s/d.sock", keydir);
    int port = hx_reserve_port();
    snprintf(peers, sizeof(peers), "127.0.0.1:%d,127.0.0.1:%d", port,
             hx_reserve_port());
    const char *base[] = {"--socket", sock, "--rank", "0", "--peers", peers};
#define ARGS(...)                                                 \
    (const char *const[]){base[0], base[1], base[2],     base[3], \
                          base[4], base[5], __VA_ARGS__, NULL}
    ck_assert_int_eq(
        run_daemon(ARGS("--auth_key_file", shortk), out, sizeof(out)), 1);
    ck_assert_ptr_nonnull(strstr(out, "31 bytes; a key is 32 to 4096 bytes"));
    ck_assert_int_eq(
        run_daemon(ARGS("--auth_key_file", openk), out, sizeof(out)), 1);
    ck_assert_ptr_nonnull(strstr(out, "chmod 600"));

    /* Protected mode: every interface without a key is refused... */
    char listen[32];
    snprintf(listen, sizeof(listen), "0.0.0.0:%d", port);
    ck_assert_int_eq(run_daemon(ARGS("--listen", listen), out, sizeof(out)), 1);
    ck_assert_ptr_nonnull(strstr(out, "refusing to listen on 0.0.0.0"));
    ck_assert_ptr_nonnull(strstr(out, "allow_insecure = true"));
    /* ...unless asked for, or with a key (relative: from systemd's
     * credentials directory). */
    int rc = run_daemon(ARGS("--listen", listen, "--allow_insecure", "true"),
                        out, sizeof(out));
    ck_assert_msg(rc == -1, "exited %d, not still running: %s", rc, out);
    setenv("CREDENTIALS_DIRECTORY", keydir, 1);
    rc = run_daemon(ARGS("--listen", listen, "--auth_key_file", "good"), out,
                    sizeof(out));
    ck_assert_msg(rc == -1, "exited %d, not still running: %s", rc, out);
    ck_assert_ptr_nonnull(strstr(out, "cluster key set"));
    unsetenv("CREDENTIALS_DIRECTORY");
    ck_assert_int_eq(
        run_daemon(ARGS("--wire_protection", "encrypt"), out, sizeof(out)), 2);
    ck_assert_ptr_nonnull(strstr(out, "encrypt needs auth_key_file"));
#undef ARGS
}
END_TEST

Suite *mesh_auth_suite(void)
{
    Suite *s = suite_create("mesh_auth");
    TCase *tc = tcase_create("mesh_auth");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, keyed_mesh_runs_every_wire_mode, 0, 3);
    tcase_add_test(tc, intruders_are_refused_and_the_job_runs_on);
    tcase_add_test(tc, replayed_handshake_is_refused);
    tcase_add_test(tc, idle_connections_lock_nobody_out);
    tcase_add_loop_test(tc, different_segment_sizes_are_refused_by_name, 0, 2);
    tcase_add_test(tc, bad_keys_and_open_listeners_stop_the_start);
    tcase_add_test(tc, out_of_descriptors_pauses_accepting);
    tcase_add_test(tc, wrong_key_is_counted_on_the_dialed_side);
    tcase_add_loop_test(tc, forged_frames_fail_the_op_at_once_everywhere, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return ck_run(mesh_auth_suite());
}
