/* The op state machine without sockets: several in-process daemons whose
 * hooks (daemon.h) are replaced by a fake transport that carries control
 * messages and data frames between them in order, and fake trainers that
 * record their answers. It checks matching, the deferred completion rule
 * (no answer from inside the call that decided it), a rank that leaves,
 * and the 1-bit op's phases end to end against the algorithm of
 * docs/design.md, "The compressed allreduce, exactly". */
#include <check.h>

#include "ck_run.h"
#include <math.h>
#include <stddef.h>
#include <obcomm.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codec.h"
#include "codec_ref.h"
#include "daemon.h"
#include "job.h"
#include "obcomm.pb-c.h"
#include "ops.h"
#include "ring_ref.h"

#define MAXN 4
#define MAXL 3

/* A fake trainer: the daemon sees its address as a struct obd_client *. */
struct fake {
    int answers;
    int status;
    uint64_t seq;
    char message[512];
};

/* A message in flight on the link from -> to: control (packed PeerMsg) or
 * data (frame header and a copy of the payload). */
struct msg {
    int from, to;
    int is_data;
    uint8_t *buf;
    size_t len;
    struct obd_frame f;
    void (*done)(void *arg, int status);
    void *arg;
    struct msg *next;
};

static struct obd_daemon nodes[MAXN];
static int nnodes;
static struct fake trainers[MAXN][MAXL];
static struct obd_job *jobs[MAXN];
static struct msg *queue_head, *queue_tail;
static int in_call; /* > 0 while the test is inside a call into job.c */
/* Set by tests that fail an op while pool tasks run: every answer must
 * then come once its node has no task in flight (job.h). */
static int answer_after_tasks;
/* segment_bytes for the next start(); NULL: the default. */
static const char *segment_bytes;
/* A directory whose node<i> subdirectories become the state_dirs of the
 * next start(); NULL: none. */
static const char *state_base;
/* Data frames each node has sent since start(). */
static int data_sent[MAXN];
/* Data frames to this node wait on their link (-1: none). */
static int hold_data_to = -1;
/* Scale frames (4 bytes) of this kind sent by node tamper_from carry
 * tamper_value instead (tamper_from -1: none). */
enum { T_WORKER, T_SERVER };
static int tamper_from = -1, tamper_kind;
static float tamper_value;
/* Every message on the link hold_from -> hold_to waits (-1: none). */
static int hold_from = -1, hold_to = -1;

static void answer(struct obd_client *c, uint64_t seq, int status,
                   const char *message, uint64_t value, uint64_t bytes)
{
    (void)value;
    (void)bytes;
    struct fake *t = (struct fake *)c;
    /* docs/design.md, "Lifetimes and trust": never from inside the call
     * that caused it. */
    ck_assert_int_eq(in_call, 0);
    if (answer_after_tasks)
        ck_assert_int_eq(nodes[(t - &trainers[0][0]) / MAXL].pool_tasks, 0);
    t->answers++;
    t->status = obd_err_public(status); /* what ctl.c sends */
    t->seq = seq;
    snprintf(t->message, sizeof(t->message), "%s", message);
}

static int node_of(const struct obd_daemon *d)
{
    return (int)(d - nodes);
}

static void enqueue(struct msg *m)
{
    m->next = NULL;
    if (queue_tail)
        queue_tail->next = m;
    else
        queue_head = m;
    queue_tail = m;
}

static int send_ctrl(struct obd_daemon *d, int to, const Obcomm__PeerMsg *pm)
{
    struct msg *m = calloc(1, sizeof(*m));
    m->from = node_of(d);
    m->to = to;
    m->len = obcomm__peer_msg__get_packed_size(pm);
    m->buf = malloc(m->len ? m->len : 1);
    obcomm__peer_msg__pack(pm, m->buf);
    enqueue(m);
    return 0;
}

static int send_data(struct obd_daemon *d, int to, struct obd_frame *f,
                     const void *payload, void (*done)(void *, int), void *arg)
{
    struct msg *m = calloc(1, sizeof(*m));
    m->from = node_of(d);
    m->to = to;
    m->is_data = 1;
    data_sent[m->from]++;
    m->f = *f;
    m->len = f->len;
    m->buf = malloc(m->len ? m->len : 1);
    memcpy(m->buf, payload, m->len);
    /* Worker scales go in step 0, server scales close each allgather step;
     * bits are never 4 bytes (a codec block is 64 Ki). */
    if (m->from == tamper_from && f->len == sizeof(float) &&
        (tamper_kind == T_WORKER ? f->step == 0 : f->step >= 1))
        memcpy(m->buf, &tamper_value, sizeof(float));
    m->done = done;
    m->arg = arg;
    enqueue(m);
    return 0;
}

/* Delivers one message; 0 if its destination parks it (the op has not
 * started there yet): the link then waits, as a real one stops reading. */
static int deliver(struct msg *m)
{
    struct obd_daemon *d = &nodes[m->to];
    if (m->from == hold_from && m->to == hold_to)
        return 0;
    if (!m->is_data) {
        Obcomm__PeerMsg *pm = obcomm__peer_msg__unpack(NULL, m->len, m->buf);
        ck_assert_ptr_nonnull(pm);
        in_call++;
        obd_job_on_peer_msg(d, m->from, pm);
        in_call--;
        obcomm__peer_msg__free_unpacked(pm, NULL);
        return 1;
    }
    void *dst = NULL, *token = NULL;
    if (m->to == hold_data_to)
        return 0;
    in_call++;
    enum obd_data_dest where =
        obd_job_data_begin(d, m->from, &m->f, &dst, &token);
    if (where == OBD_DATA_INTO) {
        memcpy(dst, m->buf, m->len);
        obd_job_data_end(token, m->from, &m->f, 1);
    }
    in_call--;
    if (where == OBD_DATA_PARK)
        return 0;
    m->done(m->arg, 0); /* the write completed, on the sender's side */
    return 1;
}

/* Delivers every message whose link is not parked; returns how many.
 * What the deliveries send goes behind what stays parked. */
static int deliver_all(void)
{
    int parked[MAXN][MAXN] = {{0}};
    int n = 0;
    struct msg *list = queue_head, *kept = NULL, **kept_tail = &kept;
    queue_head = queue_tail = NULL;
    while (list) {
        struct msg *m = list;
        list = m->next;
        if (!parked[m->from][m->to] && deliver(m)) {
            free(m->buf);
            free(m);
            n++;
            continue;
        }
        parked[m->from][m->to] = 1;
        m->next = NULL;
        *kept_tail = m;
        kept_tail = &m->next;
    }
    if (kept != NULL) {
        *kept_tail = queue_head;
        if (queue_head == NULL)
            queue_tail =
                (struct msg *)((char *)kept_tail - offsetof(struct msg, next));
        queue_head = kept;
    }
    return n;
}

/* Turns every loop and the transport until `done` holds; fails the test
 * after a bound instead of hanging. */
static void pump_until(int (*done)(void))
{
    for (int i = 0; i < 200000; i++) {
        int moved = deliver_all();
        for (int k = 0; k < nnodes; k++)
            uv_run(&nodes[k].loop, UV_RUN_NOWAIT);
        if (done())
            return;
        if (!moved)
            usleep(50);
    }
    ck_abort_msg("the ops did not finish");
}

static int nlocal;
static int all_answered(void)
{
    for (int n = 0; n < nnodes; n++)
        for (int l = 0; l < nlocal; l++)
            if (trainers[n][l].answers == 0)
                return 0;
    return 1;
}

static int all_answered_0(void)
{
    return trainers[0][0].answers > 0;
}

static void reset_answers(void)
{
    memset(trainers, 0, sizeof(trainers));
}

static void start(int n, int ls)
{
    char peers[256] = "";
    for (int i = 0; i < n; i++)
        snprintf(peers + strlen(peers), sizeof(peers) - strlen(peers),
                 "%s127.0.0.1:%d", i ? "," : "", 7000 + i);
    nnodes = n;
    nlocal = ls;
    reset_answers();
    for (int i = 0; i < n; i++) {
        struct obd_config cfg;
        char err[256], rank[8];
        obd_config_defaults(&cfg);
        snprintf(rank, sizeof(rank), "%d", i);
        ck_assert_int_eq(obd_config_set(&cfg, "peers", peers, err, 256), 0);
        ck_assert_int_eq(obd_config_set(&cfg, "rank", rank, err, 256), 0);
        ck_assert_int_eq(obd_config_set(&cfg, "log_level", "error", err, 256),
                         0);
        if (state_base != NULL) {
            char sd[128];
            snprintf(sd, sizeof(sd), "%s/node%d", state_base, i);
            ck_assert_int_eq(obd_config_set(&cfg, "state_dir", sd, err, 256),
                             0);
        }
        if (segment_bytes != NULL)
            ck_assert_int_eq(
                obd_config_set(&cfg, "segment_bytes", segment_bytes, err, 256),
                0);
        data_sent[i] = 0;
        ck_assert_int_eq(obd_config_finish(&cfg, err, sizeof(err)), 0);
        ck_assert_int_eq(obd_daemon_init(&nodes[i], &cfg), 0);
        nodes[i].hooks.answer = answer;
        nodes[i].hooks.send_ctrl = send_ctrl;
        nodes[i].hooks.send_data = send_data;
        jobs[i] = NULL;
        for (int l = 0; l < ls; l++) {
            char why[256];
            struct obd_job *job;
            ck_assert_int_eq(obd_job_join(&nodes[i],
                                          (struct obd_client *)&trainers[i][l],
                                          100 + l, 0, "j", l, ls, 20000, &job,
                                          why, sizeof(why)),
                             0);
            jobs[i] = job;
        }
    }
}

static void leave_all(void)
{
    for (int i = 0; i < nnodes; i++)
        for (int l = 0; jobs[i] != NULL && l < nlocal; l++)
            if (jobs[i]->trainer[l] != NULL)
                obd_job_leave(jobs[i], l, "test over");
}

static int nothing_left(void)
{
    for (int i = 0; i < nnodes; i++)
        if (nodes[i].jobs != NULL)
            return 0;
    return queue_head == NULL;
}

/* Everything freed: jobs, ops, messages; then the loops close clean. */
static void stop(void)
{
    leave_all();
    pump_until(nothing_left);
    for (int i = 0; i < nnodes; i++) {
        obd_daemon_close(&nodes[i]);
        uv_run(&nodes[i].loop, UV_RUN_DEFAULT);
        obd_daemon_fini(&nodes[i]);
    }
}

static void submit(int node, int local, uint64_t seq,
                   const struct obd_opdesc *desc, void *data)
{
    char why[256];
    in_call++;
    int rc = obd_job_submit(jobs[node], local, seq, desc, NULL, data, NULL,
                            NULL, 0, why, sizeof(why));
    in_call--;
    ck_assert_int_eq(rc, 0);
}

static void submit_out(int node, int local, uint64_t seq,
                       const struct obd_opdesc *desc, void *data, void *out)
{
    char why[256];
    in_call++;
    int rc = obd_job_submit(jobs[node], local, seq, desc, NULL, data, NULL, out,
                            0, why, sizeof(why));
    in_call--;
    ck_assert_int_eq(rc, 0);
}

START_TEST(answers_are_deferred)
{
    start(1, 2);
    struct obd_opdesc bar = {.kind = OBCOMM_KIND_BARRIER};
    submit(0, 0, 0, &bar, NULL);
    submit(0, 1, 0, &bar, NULL);
    /* Decided inside the second submit, answered only on a later turn. */
    ck_assert_int_eq(trainers[0][0].answers, 0);
    ck_assert_int_eq(trainers[0][1].answers, 0);
    pump_until(all_answered);
    ck_assert_int_eq(trainers[0][0].status, 0);
    ck_assert_int_eq(trainers[0][1].status, 0);
    stop();
}
END_TEST

START_TEST(mismatch_names_both)
{
    start(2, 1);
    float x[16] = {0};
    struct obd_opdesc a = {.kind = OBCOMM_KIND_ALLREDUCE,
                           .dtype = OBCOMM_FLOAT32,
                           .redop = OBCOMM_SUM,
                           .count = 10};
    struct obd_opdesc b = a;
    b.count = 11;
    submit(0, 0, 0, &a, x);
    submit(1, 0, 0, &b, x);
    pump_until(all_answered);
    for (int n = 0; n < 2; n++) {
        ck_assert_int_eq(trainers[n][0].status, OBCOMM_E_MISMATCH);
        ck_assert_ptr_nonnull(strstr(trainers[n][0].message,
                                     "count differs: rank 0 (node 0) "
                                     "has 10, rank 1 (node 1) has 11"));
    }
    stop();
}
END_TEST

/* Op kinds, dtypes and reductions are named, not numbered. */
START_TEST(mismatch_names_op_kinds)
{
    start(2, 1);
    float x[16] = {0};
    struct obd_opdesc a = {.kind = OBCOMM_KIND_ALLREDUCE_1BIT,
                           .dtype = OBCOMM_FLOAT32,
                           .redop = OBCOMM_AVG,
                           .count = 10,
                           .key = 7};
    struct obd_opdesc b = a;
    b.kind = OBCOMM_KIND_ALLREDUCE;
    submit(0, 0, 0, &a, x);
    submit(1, 0, 0, &b, x);
    pump_until(all_answered);
    for (int n = 0; n < 2; n++) {
        ck_assert_int_eq(trainers[n][0].status, OBCOMM_E_MISMATCH);
        ck_assert_str_eq(trainers[n][0].message,
                         "op 0 of job j: ranks issued different ops: op "
                         "differs: rank 0 (node 0) has allreduce_1bit, rank 1 "
                         "(node 1) has allreduce");
    }
    stop();

    start(1, 2);
    a.kind = OBCOMM_KIND_ALLREDUCE;
    b.dtype = OBCOMM_INT32;
    b.redop = OBCOMM_MAX;
    submit(0, 0, 0, &a, x);
    submit(0, 1, 0, &b, x);
    pump_until(all_answered);
    for (int t = 0; t < 2; t++)
        ck_assert_str_eq(trainers[0][t].message,
                         "op 0 of job j: ranks issued different ops: dtype "
                         "differs: rank 0 has float32, rank 1 has int32; "
                         "reduction differs: rank 0 has avg, rank 1 has max");
    stop();
}
END_TEST

static float rnd(void);

/* A failed op stops the run on every node: the next op fails at once with
 * the first failure's code, naming it, until a new run. */
START_TEST(failed_op_stops_the_run)
{
    start(2, 1);
    float x[16] = {0};
    struct obd_opdesc a = {.kind = OBCOMM_KIND_ALLREDUCE,
                           .dtype = OBCOMM_FLOAT32,
                           .redop = OBCOMM_SUM,
                           .count = 10};
    struct obd_opdesc b = a;
    b.count = 11;
    submit(0, 0, 0, &a, x);
    submit(1, 0, 0, &b, x);
    pump_until(all_answered);
    reset_answers();
    struct obd_opdesc bar = {.kind = OBCOMM_KIND_BARRIER};
    submit(0, 0, 1, &a, x);
    submit(1, 0, 1, &a, x);
    pump_until(all_answered);
    for (int n = 0; n < 2; n++) {
        ck_assert_int_eq(trainers[n][0].status, OBCOMM_E_MISMATCH);
        ck_assert_msg(strstr(trainers[n][0].message,
                             "op 1 of job j: this run cannot continue after "
                             "op 0 failed (op 0 of job j: ranks issued "
                             "different ops: count differs") != NULL,
                      "node %d: %s", n, trainers[n][0].message);
        ck_assert_int_eq(nodes[n].metrics.v[OBD_M_RUNS_STOPPED], 1);
    }
    /* Only one node's trainer goes on: it fails at once all the same. */
    reset_answers();
    submit(0, 0, 2, &bar, NULL);
    pump_until(all_answered_0);
    ck_assert_int_eq(trainers[0][0].status, OBCOMM_E_MISMATCH);
    stop();
}
END_TEST

/* The mesh says node 1's link was up and is down: node 0 fails a new op
 * at once with PEER_LOST naming it and why (not at the deadline), from
 * inside no call; the run stops. */
static int node1_lost(const struct obd_daemon *d, int node, char *why,
                      size_t len)
{
    (void)d;
    if (node != 1)
        return 0;
    if (why != NULL)
        snprintf(why, len, "connection closed by the peer");
    return 1;
}

START_TEST(op_needing_a_lost_node_fails_at_once)
{
    start(2, 1);
    nodes[0].hooks.node_lost = node1_lost;
    float x[16] = {0};
    struct obd_opdesc a = {.kind = OBCOMM_KIND_ALLREDUCE,
                           .dtype = OBCOMM_FLOAT32,
                           .redop = OBCOMM_SUM,
                           .count = 10};
    submit(0, 0, 0, &a, x);
    ck_assert_int_eq(trainers[0][0].answers, 0);
    pump_until(all_answered_0);
    ck_assert_int_eq(trainers[0][0].status, OBCOMM_E_PEER_LOST);
    ck_assert_str_eq(trainers[0][0].message,
                     "op 0 of job j: node 1 was lost: connection closed by "
                     "the peer");
    ck_assert_int_eq(nodes[0].metrics.v[OBD_M_RUNS_STOPPED], 1);
    ck_assert_int_eq(nodes[0].metrics.v[OBD_M_OPS_TIMEOUT], 0);
    nodes[0].hooks.node_lost = NULL;
    stop();
}
END_TEST

/* Nodes that hold different versions of a key's error feedback fail the
 * 1-bit op on every rank before any pass, naming both versions, and both
 * reset the run's state (the same on both). */
START_TEST(versions_differ_fail_everywhere)
{
    start(2, 1);
    enum { COUNT = 1000 };
    static float buf[2][COUNT];
    struct obd_opdesc a = {.kind = OBCOMM_KIND_ALLREDUCE_1BIT,
                           .dtype = OBCOMM_FLOAT32,
                           .redop = OBCOMM_AVG,
                           .count = COUNT,
                           .key = 7};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < COUNT; i++)
            buf[k][i] = rnd();
    for (int k = 0; k < 2; k++)
        submit(k, 0, 0, &a, buf[k]);
    pump_until(all_answered);
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(trainers[k][0].status, 0);
        struct obd_efversion v =
            obd_efstore_version(&nodes[k], "j", jobs[k]->run, 7);
        ck_assert_uint_eq(v.origin, 0);
        ck_assert_uint_eq(v.applied, 1);
        ck_assert_uint_eq(v.last_seq, 0);
    }
    ck_assert_uint_eq(jobs[0]->run, jobs[1]->run);
    /* Node 1 counts one more step than node 0. */
    obd_efstore_find(&nodes[1], "j", jobs[1]->run, 7)->version.applied++;
    reset_answers();
    for (int k = 0; k < 2; k++)
        submit(k, 0, 1, &a, buf[k]);
    pump_until(all_answered);
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(trainers[k][0].status, OBCOMM_E_STATE);
        ck_assert_msg(strstr(trainers[k][0].message,
                             "different versions of the error feedback of "
                             "key 7: node 0 has zero + 1 steps (last op 0), "
                             "node 1 has zero + 2 steps (last op 0)") != NULL,
                      "node %d: %s", k, trainers[k][0].message);
        ck_assert_int_eq(nodes[k].metrics.v[OBD_M_EF_DISAGREED], 1);
        ck_assert_int_eq(nodes[k].metrics.v[OBD_M_EF_RESETS], 1);
        ck_assert_ptr_null(obd_efstore_find(&nodes[k], "j", jobs[k]->run, 7));
    }
    stop();
}
END_TEST

START_TEST(allreduce_exact)
{
    static const int shape[][2] = {{2, 1}, {2, 2}, {3, 3}, {4, 1}};
    int n = shape[_i][0], ls = shape[_i][1];
    enum { COUNT = 100003 };
    start(n, ls);
    static float buf[MAXN][MAXL][COUNT];
    for (int k = 0; k < n; k++)
        for (int l = 0; l < ls; l++)
            for (int i = 0; i < COUNT; i++)
                buf[k][l][i] = (float)((k * ls + l + 1) * (i % 7));
    struct obd_opdesc a = {.kind = OBCOMM_KIND_ALLREDUCE,
                           .dtype = OBCOMM_FLOAT32,
                           .redop = OBCOMM_SUM,
                           .count = COUNT};
    for (int k = 0; k < n; k++)
        for (int l = 0; l < ls; l++)
            submit(k, l, 0, &a, buf[k][l]);
    pump_until(all_answered);
    int world = n * ls;
    float sum_ranks = (float)(world * (world + 1) / 2);
    for (int k = 0; k < n; k++)
        for (int l = 0; l < ls; l++) {
            ck_assert_int_eq(trainers[k][l].status, 0);
            for (int i = 0; i < COUNT; i++)
                ck_assert_float_eq(buf[k][l][i], sum_ranks * (float)(i % 7));
        }
    stop();
}
END_TEST

/* Node 1's only trainer completes op 0 and leaves; node 0's op 1 fails at
 * once with PEER_LOST naming rank 1, not at its 20 s deadline. */
START_TEST(leave_fails_remote_ops)
{
    start(2, 1);
    struct obd_opdesc bar = {.kind = OBCOMM_KIND_BARRIER};
    submit(0, 0, 0, &bar, NULL);
    submit(1, 0, 0, &bar, NULL);
    pump_until(all_answered);
    ck_assert_int_eq(trainers[0][0].status, 0);
    in_call++;
    obd_job_leave(jobs[1], 0, "killed");
    in_call--;
    jobs[1] = NULL; /* freed on a later turn */
    reset_answers();
    nlocal = 1;
    submit(0, 0, 1, &bar, NULL);
    /* Only node 0 waits for an answer now. */
    for (int i = 0; i < 100000 && trainers[0][0].answers == 0; i++) {
        deliver_all();
        uv_run(&nodes[0].loop, UV_RUN_NOWAIT);
        uv_run(&nodes[1].loop, UV_RUN_NOWAIT);
    }
    ck_assert_int_eq(trainers[0][0].answers, 1);
    ck_assert_int_eq(trainers[0][0].status, OBCOMM_E_PEER_LOST);
    ck_assert_ptr_nonnull(strstr(trainers[0][0].message, "rank 1"));
    ck_assert_ptr_nonnull(strstr(trainers[0][0].message, "killed"));
    stop();
}
END_TEST

/* docs/design.md, "A new run never waits": node 1's trainer restarts
 * alone and its new run's first op reaches node 0 while node 0's trainer
 * of the old run is still joined. Node 0's old run ends at once (its
 * trainer's next op fails naming who left), the announce goes to a new
 * job there, and once node 0's trainer restarts too the new run's first
 * op completes on both nodes. */
static int new_run_answered(void)
{
    return trainers[0][1].answers > 0 && trainers[1][1].answers > 0;
}

START_TEST(new_run_elsewhere_ends_the_old_run_here)
{
    start(2, 1);
    struct obd_opdesc bar = {.kind = OBCOMM_KIND_BARRIER};
    submit(0, 0, 0, &bar, NULL);
    submit(1, 0, 0, &bar, NULL);
    pump_until(all_answered);
    ck_assert_int_eq(trainers[0][0].status, 0);
    struct obd_job *old0 = jobs[0];

    /* Node 1's trainer dies and a new one joins there alone: a new run,
     * whose first op node 1 announces. */
    char why[256];
    in_call++;
    obd_job_leave(jobs[1], 0, "killed");
    ck_assert_int_eq(obd_job_join(&nodes[1],
                                  (struct obd_client *)&trainers[1][1], 201, 0,
                                  "j", 0, 1, 20000, &jobs[1], why, sizeof(why)),
                     0);
    in_call--;
    reset_answers();
    submit(1, 0, 0, &bar, NULL);
    deliver_all();
    for (int k = 0; k < nnodes; k++)
        uv_run(&nodes[k].loop, UV_RUN_NOWAIT);
    /* Node 0 now runs the new run's job; its old one is out of the list. */
    ck_assert_ptr_nonnull(obd_job_find(&nodes[0], "j"));
    ck_assert_ptr_ne(obd_job_find(&nodes[0], "j"), old0);
    ck_assert_int_eq(old0->detached, 1);

    /* The old trainer's next op fails at once, naming who left. */
    jobs[0] = old0;
    submit(0, 0, 1, &bar, NULL);
    pump_until(all_answered_0);
    ck_assert_int_eq(trainers[0][0].status, OBCOMM_E_PEER_LOST);
    ck_assert_ptr_nonnull(
        strstr(trainers[0][0].message, "rank 1 (node 1 local 0) left the job"));
    ck_assert_int_eq(trainers[1][1].answers, 0);

    /* Node 0's trainer restarts: the new run's first op completes. */
    in_call++;
    obd_job_leave(old0, 0, "restarted");
    ck_assert_int_eq(obd_job_join(&nodes[0],
                                  (struct obd_client *)&trainers[0][1], 200, 0,
                                  "j", 0, 1, 20000, &jobs[0], why, sizeof(why)),
                     0);
    in_call--;
    ck_assert_ptr_eq(jobs[0], obd_job_find(&nodes[0], "j"));
    submit(0, 0, 0, &bar, NULL);
    pump_until(new_run_answered);
    ck_assert_int_eq(trainers[0][1].status, 0);
    ck_assert_int_eq(trainers[1][1].status, 0);
    ck_assert_uint_eq(trainers[0][1].seq, 0);
    stop();
}
END_TEST

/* The reference of docs/design.md, "The compressed allreduce, exactly",
 * for one op among n nodes, keeping every node's worker error and every
 * server's error. */
/* What n nodes of ls trainers each must end with, from codec_ref.h (which
 * shares no code with the daemon): node k averages its trainers' buffers
 * and compresses against its worker error werr[k]; node r serves chunk r
 * of every node's signs against its server error serr[r]; out is the
 * decoded result, +-sscale of chunk r by its server's signs. */
static void reference(int n, int ls, size_t count, float *const (*src)[MAXL],
                      float **werr, float **serr, float *out)
{
    size_t N = obd_codec_padded_len(count, n), C = N / (size_t)n;
    float *scales = calloc((size_t)n, sizeof(float));
    uint8_t *bits = calloc((size_t)n * N / 8, 1);
    uint8_t *sbits = calloc(C / 8, 1);
    float *b = calloc(N, sizeof(float));
    for (int k = 0; k < n; k++)
        ck_assert_int_eq(codec_ref_compress_avg(
                             (const float *const *)src[k], ls, count, werr[k],
                             b, N, bits + (size_t)k * N / 8, &scales[k]),
                         0);
    for (int r = 0; r < n; r++) {
        const uint8_t *in[MAXN];
        for (int k = 0; k < n; k++)
            in[k] = bits + (size_t)k * N / 8 + (size_t)r * C / 8;
        float sscale;
        ck_assert_int_eq(
            codec_ref_server(in, scales, n, serr[r], C, sbits, &sscale), 0);
        for (size_t i = 0; i < C && r * C + i < count; i++) {
            int one = sbits[i / 8] >> (7 - i % 8) & 1;
            out[r * C + i] = one ? sscale : -sscale;
        }
    }
    free(scales);
    free(bits);
    free(sbits);
    free(b);
}

static uint32_t rng = 12345;
static float rnd(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((int32_t)(rng >> 8) - (1 << 23)) / (float)(1 << 23);
}

/* Three 1-bit steps through the whole machine (norm, scales, signs, the
 * parameter-server phase, the server, the allgather, decoding): every rank
 * ends with the same bits, and they are codec_ref's, bit for bit. */
START_TEST(onebit_phases)
{
    static const int shape[][2] = {{2, 1}, {2, 2}, {3, 2}, {4, 1}};
    int n = shape[_i][0], ls = shape[_i][1];
    enum { COUNT = 300007 };
    start(n, ls);
    static float buf[MAXN][MAXL][COUNT];
    size_t N = obd_codec_padded_len(COUNT, n);
    float *werr[MAXN], *serr[MAXN];
    float *src[MAXN][MAXL];
    float *want = malloc(COUNT * sizeof(float));
    for (int k = 0; k < n; k++) {
        werr[k] = calloc(N, sizeof(float));
        serr[k] = calloc(N / (size_t)n, sizeof(float));
        for (int l = 0; l < ls; l++)
            src[k][l] = buf[k][l];
    }
    struct obd_opdesc a = {.kind = OBCOMM_KIND_ALLREDUCE_1BIT,
                           .dtype = OBCOMM_FLOAT32,
                           .redop = OBCOMM_AVG,
                           .count = COUNT,
                           .key = 7};
    for (uint64_t step = 0; step < 3; step++) {
        for (int k = 0; k < n; k++)
            for (int i = 0; i < COUNT; i++)
                for (int l = 0; l < ls; l++)
                    buf[k][l][i] = rnd();
        reference(n, ls, COUNT, src, werr, serr, want);
        reset_answers();
        for (int k = 0; k < n; k++)
            for (int l = 0; l < ls; l++)
                submit(k, l, step, &a, buf[k][l]);
        pump_until(all_answered);
        for (int k = 0; k < n; k++)
            for (int l = 0; l < ls; l++) {
                ck_assert_int_eq(trainers[k][l].status, 0);
                ck_assert_int_eq(
                    memcmp(buf[k][l], buf[0][0], COUNT * sizeof(float)), 0);
            }
        for (int i = 0; i < COUNT; i++)
            ck_assert_msg(memcmp(&buf[0][0][i], &want[i], sizeof(float)) == 0,
                          "step %d element %d: %a, codec_ref %a", (int)step, i,
                          (double)buf[0][0][i], (double)want[i]);
    }
    for (int k = 0; k < n; k++) {
        free(werr[k]);
        free(serr[k]);
    }
    free(want);
    stop();
}
END_TEST

/* A scale from a peer that no codec can have made (NaN, Inf, negative)
 * fails the op with a message that names the sender and the value,
 * instead of being decoded into the tensor, on every node: a bad server
 * scale reaches only the nodes after its server on the ring, and node 1,
 * done with node 0's good results, waits for every node's report before
 * it answers, so node 0's failure reaches it first. */
START_TEST(bad_scales_fail_everywhere)
{
    static const struct {
        int kind;
        float value;
        const char *text;
    } cases[] = {
        {T_WORKER, NAN, "node 1 sent a worker scale that is not finite (nan)"},
        {T_WORKER, -2.0f, "node 1 sent a worker scale that is negative (-2)"},
        {T_SERVER, NAN, "node 1 sent a server scale that is not finite (nan)"},
        {T_SERVER, INFINITY,
         "node 1 sent a server scale that is not finite (inf)"},
    };
    enum { COUNT = 100003 };
    static float buf[2][COUNT];
    start(2, 1);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < COUNT; i++)
            buf[k][i] = rnd();
    struct obd_opdesc a = {.kind = OBCOMM_KIND_ALLREDUCE_1BIT,
                           .dtype = OBCOMM_FLOAT32,
                           .redop = OBCOMM_AVG,
                           .count = COUNT,
                           .key = 3};
    tamper_from = 1;
    tamper_kind = cases[_i].kind;
    tamper_value = cases[_i].value;
    for (int k = 0; k < 2; k++)
        submit(k, 0, 0, &a, buf[k]);
    pump_until(all_answered);
    tamper_from = -1;
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(trainers[k][0].status, OBCOMM_E_PROTO);
        ck_assert_msg(strstr(trainers[k][0].message, cases[_i].text) != NULL,
                      "node %d: %s", k, trainers[k][0].message);
    }
    stop();
}
END_TEST

/* ---- the ring's reductions on the worker pool ---- */

/* Two full 1 MiB segments of fp32 would take 2 x 262144 elements per
 * chunk; this count gives 2 nodes chunks of one full segment plus a tail
 * of about 1000 elements, so one op mixes pool and inline reductions. */
enum { POOL_COUNT = 2 * (262144 + 1000) + 1 };
static const obcomm_dtype_t pool_dtypes[] = {OBCOMM_FLOAT32, OBCOMM_FLOAT16,
                                             OBCOMM_BFLOAT16, OBCOMM_INT32};
static const obcomm_op_t pool_ops[] = {OBCOMM_SUM, OBCOMM_AVG, OBCOMM_MAX};

/* Every dtype and op above on random data, against ring_ref.h bit for
 * bit. With 1 MiB segments the op is 2 segments, fewer than
 * OBD_RING_POOL_SEGMENTS: everything runs inline on the loop. With
 * smaller segments the local load, the store and the reduce-scatter
 * segments run on the pool. With 8 KiB segments the load and store are hundreds
 * of pool pieces while frames arrive and segments are reduced inline; with 256
 * KiB segments every full segment is a pool task (several in flight, finishing
 * in any order on libuv's 4 threads) and every chunk's tail is reduced inline.
 * Zero-copy runs (one trainer, fp32 or int32) reduce in the trainers' memory.
 */
START_TEST(allreduce_on_the_pool_exact)
{
    static const int shape[][2] = {{2, 1}, {2, 3}, {3, 1}, {3, 2}};
    static const char *const segs[] = {NULL, "262144", "8192"};
    static const char *const seg_name[] = {"1 MiB", "256 KiB", "8 KiB"};
    int n = shape[_i % 4][0], ls = shape[_i % 4][1];
    segment_bytes = segs[_i / 4];
    start(n, ls);
    segment_bytes = NULL;
    static uint8_t buf[MAXN * MAXL][POOL_COUNT * 4];
    static uint8_t want[POOL_COUNT * 4];
    const void *x[MAXN * MAXL];
    uint64_t seq = 0;
    for (size_t d = 0; d < sizeof(pool_dtypes) / sizeof(pool_dtypes[0]); d++)
        for (size_t o = 0; o < sizeof(pool_ops) / sizeof(pool_ops[0]); o++) {
            obcomm_dtype_t t = pool_dtypes[d];
            size_t es = rr_size(t);
            for (int k = 0; k < n * ls; k++) {
                rr_fill(t, buf[k], POOL_COUNT, seq * 64 + (uint64_t)k + 1);
                x[k] = buf[k];
            }
            rr_expect(t, pool_ops[o], n, ls, x, POOL_COUNT, want);
            struct obd_opdesc a = {.kind = OBCOMM_KIND_ALLREDUCE,
                                   .dtype = t,
                                   .redop = pool_ops[o],
                                   .count = POOL_COUNT};
            reset_answers();
            for (int k = 0; k < n; k++)
                for (int l = 0; l < ls; l++)
                    submit(k, l, seq, &a, buf[k * ls + l]);
            pump_until(all_answered);
            /* One memcmp per rank: a check per element would write each
             * to Check's pipe. */
            for (int k = 0; k < n * ls; k++) {
                ck_assert_int_eq(trainers[k / ls][k % ls].status, 0);
                if (memcmp(buf[k], want, POOL_COUNT * es) == 0)
                    continue;
                size_t i = 0;
                while (memcmp(buf[k] + i * es, want + i * es, es) == 0)
                    i++;
                ck_abort_msg("dtype %d op %d (%d x %d, segments %s): rank %d "
                             "element %zu differs",
                             t, pool_ops[o], n, ls, seg_name[_i / 4], k, i);
            }
            seq++;
        }
    stop();
}
END_TEST

/* Elements of one rank's part in gather_and_scatter_exact: odd, so that
 * chunks and segments end short. */
enum { GS_COUNT = 40009, GS_RANKS = 6 };

static void first_difference(const uint8_t *got, const uint8_t *want, size_t n,
                             size_t es, const char *what)
{
    if (memcmp(got, want, n * es) == 0)
        return;
    size_t i = 0;
    while (memcmp(got + i * es, want + i * es, es) == 0)
        i++;
    ck_abort_msg("%s: element %zu differs", what, i);
}

/* Reduce-scatter (every dtype and op) and allgather (every dtype, in place
 * on odd ranks) against ring_ref.h bit for bit, on 1-3 nodes x 1-3
 * trainers. With 1 MiB segments everything runs inline; with 8 KiB
 * segments the load, the store and the copies of large ops go to the pool
 * in pieces while frames arrive. Each op's inputs are new random data. */
START_TEST(gather_and_scatter_exact)
{
    static const int shape[][2] = {{1, 1}, {1, 3}, {2, 1},
                                   {2, 3}, {3, 1}, {3, 2}};
    static const char *const segs[] = {NULL, "8192"};
    static const obcomm_dtype_t dtypes[] = {OBCOMM_FLOAT32, OBCOMM_FLOAT64,
                                            OBCOMM_FLOAT16, OBCOMM_BFLOAT16,
                                            OBCOMM_INT32,   OBCOMM_INT64};
    static const obcomm_op_t ops[] = {OBCOMM_SUM, OBCOMM_AVG, OBCOMM_MAX,
                                      OBCOMM_MIN};
    int n = shape[_i % 6][0], ls = shape[_i % 6][1], world = n * ls;
    segment_bytes = segs[_i / 6];
    start(n, ls);
    segment_bytes = NULL;
    static uint8_t in[GS_RANKS][GS_RANKS * GS_COUNT * 8];
    static uint8_t out[GS_RANKS][GS_RANKS * GS_COUNT * 8];
    static uint8_t want[GS_RANKS * GS_COUNT * 8];
    const void *x[GS_RANKS];
    char what[128];
    uint64_t seq = 0;
    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
        obcomm_dtype_t t = dtypes[d];
        size_t es = rr_size(t);
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++, seq++) {
            for (int k = 0; k < world; k++) {
                rr_fill(t, in[k], (size_t)world * GS_COUNT,
                        seq * 64 + (uint64_t)k + 1);
                x[k] = in[k];
            }
            struct obd_opdesc a = {.kind = OBCOMM_KIND_REDUCE_SCATTER,
                                   .dtype = t,
                                   .redop = ops[o],
                                   .count = GS_COUNT};
            reset_answers();
            for (int k = 0; k < world; k++)
                submit_out(k / ls, k % ls, seq, &a, in[k], out[k]);
            pump_until(all_answered);
            for (int k = 0; k < world; k++) {
                ck_assert_int_eq(trainers[k / ls][k % ls].status, 0);
                rr_expect_rs(t, ops[o], n, ls, x, GS_COUNT, k, want);
                snprintf(what, sizeof(what),
                         "reduce-scatter dtype %d op %d (%d x %d, segments "
                         "%s) rank %d",
                         t, ops[o], n, ls, segs[_i / 6], k);
                first_difference(out[k], want, GS_COUNT, es, what);
            }
        }
        /* Allgather: odd ranks' parts already sit at their place in their
         * result (MPI's in place). */
        for (int k = 0; k < world; k++) {
            rr_fill(t, in[k], GS_COUNT, seq * 64 + (uint64_t)k + 1);
            memcpy(want + (size_t)k * GS_COUNT * es, in[k], GS_COUNT * es);
            memset(out[k], 0xa5, (size_t)world * GS_COUNT * es);
            if (k % 2)
                memcpy(out[k] + (size_t)k * GS_COUNT * es, in[k],
                       GS_COUNT * es);
        }
        struct obd_opdesc g = {
            .kind = OBCOMM_KIND_ALLGATHER, .dtype = t, .count = GS_COUNT};
        reset_answers();
        for (int k = 0; k < world; k++)
            submit_out(k / ls, k % ls, seq, &g,
                       k % 2 ? out[k] + (size_t)k * GS_COUNT * es : in[k],
                       out[k]);
        pump_until(all_answered);
        for (int k = 0; k < world; k++) {
            ck_assert_int_eq(trainers[k / ls][k % ls].status, 0);
            snprintf(what, sizeof(what),
                     "allgather dtype %d (%d x %d, segments %s) rank %d", t, n,
                     ls, segs[_i / 6], k);
            first_difference(out[k], want, (size_t)world * GS_COUNT, es, what);
        }
        seq++;
    }
    stop();
}
END_TEST

/* Reduce-scatter and allgather with 256 KiB segments and ops of more
 * than OBD_RING_POOL_SEGMENTS of them, against ring_ref.h bit for bit.
 * Every full reduce-scatter segment is a pool task; with one trainer and
 * fp32 or int32 no load runs: step 0 leaves from the trainer's input and
 * each reduction adds it on the pool; with two trainers the load runs
 * first. The allgather's local parts are copied on the pool (in place on
 * odd ranks: no copy); with one trainer step 0 leaves from its part
 * meanwhile. */
enum { RSP_COUNT = 262144 + 1001 };
START_TEST(gather_and_scatter_on_the_pool_exact)
{
    static const int shape[][2] = {{2, 1}, {3, 1}, {2, 2}};
    static const obcomm_dtype_t dtypes[] = {OBCOMM_FLOAT32, OBCOMM_INT32};
    static const obcomm_op_t ops[] = {OBCOMM_SUM, OBCOMM_AVG, OBCOMM_MAX};
    int n = shape[_i][0], ls = shape[_i][1], world = n * ls;
    segment_bytes = "262144";
    start(n, ls);
    segment_bytes = NULL;
    static uint8_t in[4][4 * RSP_COUNT * 4], out[4][RSP_COUNT * 4];
    static uint8_t want[RSP_COUNT * 4];
    const void *x[4];
    char what[128];
    uint64_t seq = 0;
    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++)
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++, seq++) {
            obcomm_dtype_t t = dtypes[d];
            for (int k = 0; k < world; k++) {
                rr_fill(t, in[k], (size_t)world * RSP_COUNT,
                        seq * 64 + (uint64_t)k + 1);
                x[k] = in[k];
            }
            struct obd_opdesc a = {.kind = OBCOMM_KIND_REDUCE_SCATTER,
                                   .dtype = t,
                                   .redop = ops[o],
                                   .count = RSP_COUNT};
            reset_answers();
            for (int k = 0; k < world; k++)
                submit_out(k / ls, k % ls, seq, &a, in[k], out[k]);
            pump_until(all_answered);
            for (int k = 0; k < world; k++) {
                ck_assert_int_eq(trainers[k / ls][k % ls].status, 0);
                rr_expect_rs(t, ops[o], n, ls, x, RSP_COUNT, k, want);
                snprintf(what, sizeof(what),
                         "reduce-scatter dtype %d op %d (%d x %d) rank %d", t,
                         ops[o], n, ls, k);
                first_difference(out[k], want, RSP_COUNT, 4, what);
            }
        }
    /* The allgather's result of each rank in in[k], the reduce-scatter's
     * inputs being done with. */
    static uint8_t part[4][RSP_COUNT * 4], all[4 * RSP_COUNT * 4];
    for (int k = 0; k < world; k++) {
        rr_fill(OBCOMM_FLOAT32, part[k], RSP_COUNT, seq * 64 + (uint64_t)k);
        memcpy(all + (size_t)k * RSP_COUNT * 4, part[k], RSP_COUNT * 4);
        memset(in[k], 0xa5, (size_t)world * RSP_COUNT * 4);
        if (k % 2)
            memcpy(in[k] + (size_t)k * RSP_COUNT * 4, part[k], RSP_COUNT * 4);
    }
    struct obd_opdesc g = {.kind = OBCOMM_KIND_ALLGATHER,
                           .dtype = OBCOMM_FLOAT32,
                           .count = RSP_COUNT};
    reset_answers();
    for (int k = 0; k < world; k++)
        submit_out(k / ls, k % ls, seq, &g,
                   k % 2 ? in[k] + (size_t)k * RSP_COUNT * 4 : part[k], in[k]);
    pump_until(all_answered);
    for (int k = 0; k < world; k++) {
        ck_assert_int_eq(trainers[k / ls][k % ls].status, 0);
        snprintf(what, sizeof(what), "allgather (%d x %d) rank %d", n, ls, k);
        first_difference(in[k], all, (size_t)world * RSP_COUNT, 4, what);
    }
    stop();
}
END_TEST

static int all_answered_twice(void)
{
    for (int n = 0; n < nnodes; n++)
        for (int l = 0; l < nlocal; l++)
            if (trainers[n][l].answers < 2)
                return 0;
    return 1;
}

/* With 2 nodes (float addition commutes) a reduce-scatter's part equals
 * the allreduce's bit for bit, AVG and fp16 included. */
START_TEST(reduce_scatter_is_the_allreduce_part)
{
    start(2, 2);
    static uint8_t in[4][4 * GS_COUNT * 2], red[4][4 * GS_COUNT * 2];
    static uint8_t out[4][GS_COUNT * 2];
    struct obd_opdesc rs = {.kind = OBCOMM_KIND_REDUCE_SCATTER,
                            .dtype = OBCOMM_FLOAT16,
                            .redop = OBCOMM_AVG,
                            .count = GS_COUNT};
    struct obd_opdesc ar = rs;
    ar.kind = OBCOMM_KIND_ALLREDUCE;
    ar.count = 4 * GS_COUNT;
    for (int k = 0; k < 4; k++) {
        rr_fill(OBCOMM_FLOAT16, in[k], 4 * GS_COUNT, (uint64_t)k + 7);
        memcpy(red[k], in[k], sizeof(red[k]));
    }
    for (int k = 0; k < 4; k++)
        submit_out(k / 2, k % 2, 0, &rs, in[k], out[k]);
    for (int k = 0; k < 4; k++)
        submit(k / 2, k % 2, 1, &ar, red[k]);
    pump_until(all_answered_twice);
    for (int k = 0; k < 4; k++) {
        ck_assert_int_eq(trainers[k / 2][k % 2].status, 0);
        first_difference(out[k], red[k] + (size_t)k * GS_COUNT * 2, GS_COUNT, 2,
                         "reduce-scatter vs allreduce");
    }
    stop();
}
END_TEST

/* The kinds are named in a mismatch, and a count that differs names both
 * ranks. */
START_TEST(gather_mismatch_names_kinds)
{
    start(2, 1);
    static float x[64], y[128];
    struct obd_opdesc a = {
        .kind = OBCOMM_KIND_ALLGATHER, .dtype = OBCOMM_FLOAT32, .count = 10};
    struct obd_opdesc b = a;
    b.kind = OBCOMM_KIND_REDUCE_SCATTER;
    submit_out(0, 0, 0, &a, x, y);
    submit_out(1, 0, 0, &b, x, y);
    pump_until(all_answered);
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(trainers[k][0].status, OBCOMM_E_MISMATCH);
        ck_assert_str_eq(trainers[k][0].message,
                         "op 0 of job j: ranks issued different ops: op "
                         "differs: rank 0 (node 0) has allgather, rank 1 "
                         "(node 1) has reduce_scatter");
    }
    stop();
}
END_TEST

/* A gate over libuv's worker pool: while closed, every pool thread waits
 * in a task of ours, so the daemons' tasks stay queued (in flight for the
 * op) whatever the loops do. main() sizes the pool to GATE_THREADS. */
enum { GATE_THREADS = 4 };
static uv_sem_t gate_open, gate_entered;
static uv_work_t gate_work[GATE_THREADS];
static int gate_left;

static void gate_wait(uv_work_t *w)
{
    (void)w;
    uv_sem_post(&gate_entered);
    uv_sem_wait(&gate_open);
}

static void gate_done(uv_work_t *w, int status)
{
    (void)w;
    (void)status;
    gate_left--;
}

static void gate_close(uv_loop_t *loop)
{
    ck_assert_int_eq(uv_sem_init(&gate_open, 0), 0);
    ck_assert_int_eq(uv_sem_init(&gate_entered, 0), 0);
    gate_left = GATE_THREADS;
    for (int i = 0; i < GATE_THREADS; i++)
        ck_assert_int_eq(
            uv_queue_work(loop, &gate_work[i], gate_wait, gate_done), 0);
    for (int i = 0; i < GATE_THREADS; i++)
        uv_sem_wait(&gate_entered); /* every thread is inside */
}

static void gate_release(uv_loop_t *loop)
{
    for (int i = 0; i < GATE_THREADS; i++)
        uv_sem_post(&gate_open);
    while (gate_left > 0)
        uv_run(loop, UV_RUN_ONCE);
    uv_sem_destroy(&gate_open);
    uv_sem_destroy(&gate_entered);
}

static int answered_but(int node, int local)
{
    for (int n = 0; n < nnodes; n++)
        for (int l = 0; l < nlocal; l++)
            if ((n != node || l != local) && trainers[n][l].answers == 0)
                return 0;
    return 1;
}

static int node0_second_gone(void)
{
    return answered_but(0, 1);
}

static int both_sent(void)
{
    return data_sent[0] > 0 && data_sent[1] > 0;
}

/* Turns the loops and the transport a while. */
static void pump_some(int turns)
{
    for (int i = 0; i < turns; i++) {
        deliver_all();
        for (int k = 0; k < nnodes; k++)
            uv_run(&nodes[k].loop, UV_RUN_NOWAIT);
    }
}

static int k_answered(void)
{
    return trainers[0][1].answers > 0 && trainers[1][1].answers > 0;
}

static int j_answered(void)
{
    return trainers[0][0].answers > 0 && trainers[1][0].answers > 0;
}

/* A snapshot's file work runs on the pool, never on the loop: while the
 * pool is held, the snapshot waits and another job's ops complete; once
 * the pool runs, the snapshot completes with the set on both nodes. */
START_TEST(snapshot_write_on_the_pool_does_not_stall_other_jobs)
{
    char base[] = "/tmp/obcomm-job-snap-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(base));
    for (int n = 0; n < 2; n++) {
        char sd[64];
        snprintf(sd, sizeof(sd), "%s/node%d", base, n);
        ck_assert_int_eq(mkdir(sd, 0700), 0);
    }
    state_base = base;
    start(2, 1);
    state_base = NULL;
    enum { COUNT = 5000 };
    static float one[2][COUNT];
    struct obd_opdesc a = {.kind = OBCOMM_KIND_ALLREDUCE_1BIT,
                           .dtype = OBCOMM_FLOAT32,
                           .redop = OBCOMM_AVG,
                           .count = COUNT,
                           .key = 3};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < COUNT; i++)
            one[k][i] = rnd();
        submit(k, 0, 0, &a, one[k]);
    }
    pump_until(all_answered);
    ck_assert_int_eq(trainers[0][0].status, 0);

    /* Job k, one trainer per node (the fake trainers [n][1]). */
    struct obd_job *kj[2];
    for (int n = 0; n < 2; n++) {
        char why[256];
        ck_assert_int_eq(
            obd_job_join(&nodes[n], (struct obd_client *)&trainers[n][1], 200,
                         0, "k", 0, 1, 20000, &kj[n], why, sizeof(why)),
            0);
    }
    reset_answers();
    gate_close(&nodes[0].loop);
    struct obd_opdesc snap = {.kind = OBCOMM_KIND_SNAPSHOT_1BIT};
    for (int n = 0; n < 2; n++)
        submit(n, 0, 1, &snap, NULL);
    pump_some(200);
    ck_assert_int_eq(trainers[0][0].answers + trainers[1][0].answers, 0);

    static float x[2][16];
    struct obd_opdesc sum = {.kind = OBCOMM_KIND_ALLREDUCE,
                             .dtype = OBCOMM_FLOAT32,
                             .redop = OBCOMM_SUM,
                             .count = 16};
    for (int n = 0; n < 2; n++) {
        char why[256];
        for (int i = 0; i < 16; i++)
            x[n][i] = (float)(n + 1);
        in_call++;
        ck_assert_int_eq(obd_job_submit(kj[n], 0, 0, &sum, NULL, x[n], NULL,
                                        NULL, 0, why, sizeof(why)),
                         0);
        in_call--;
    }
    pump_until(k_answered);
    for (int n = 0; n < 2; n++) {
        ck_assert_int_eq(trainers[n][1].status, 0);
        for (int i = 0; i < 16; i++)
            ck_assert(x[n][i] == 3.0f);
    }
    /* The other job went through; the snapshot still waits for the pool. */
    ck_assert_int_eq(trainers[0][0].answers + trainers[1][0].answers, 0);
    gate_release(&nodes[0].loop);
    pump_until(j_answered);
    char cmd[256];
    for (int n = 0; n < 2; n++) {
        ck_assert_int_eq(trainers[n][0].status, 0);
        ck_assert_int_eq(nodes[n].metrics.v[OBD_M_EF_SAVED], 1);
        snprintf(cmd, sizeof(cmd), "test -d %s/node%d/set-6a-*", base, n);
        ck_assert_int_eq(system(cmd), 0);
    }
    for (int n = 0; n < 2; n++)
        obd_job_leave(kj[n], 0, "test over");
    stop();
    snprintf(cmd, sizeof(cmd), "rm -rf %s", base);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A node loses its peer while a reduce-scatter segment's reduction is on
 * the pool (_i 0), and a trainer leaves while the local load is (_i 1):
 * the op fails on every node, every answer comes only once its node has
 * no task in flight, and nothing the tasks touch is freed before they end
 * (the ASan build checks). The gate keeps the tasks queued while the
 * loops turn and the op fails. */
START_TEST(failure_while_reducing_on_the_pool)
{
    segment_bytes = "262144"; /* 8 or more segments: the pool (coll.h) */
    start(2, 2);
    segment_bytes = NULL;
    static float buf[2][2][POOL_COUNT];
    for (int k = 0; k < 2; k++)
        for (int l = 0; l < 2; l++)
            for (int i = 0; i < POOL_COUNT; i++)
                buf[k][l][i] = (float)(k * 2 + l + i % 5);
    struct obd_opdesc a = {.kind = OBCOMM_KIND_ALLREDUCE,
                           .dtype = OBCOMM_FLOAT32,
                           .redop = OBCOMM_SUM,
                           .count = POOL_COUNT};
    answer_after_tasks = 1;
    if (_i == 0) {
        /* Both loads end (each node has sent its step 0) while node 0
         * gets no data; then node 1's step 0 reaches it behind the
         * closed gate: its full segments are pool tasks that cannot run. */
        hold_data_to = 0;
        for (int k = 0; k < 2; k++)
            for (int l = 0; l < 2; l++)
                submit(k, l, 0, &a, buf[k][l]);
        pump_until(both_sent);
        gate_close(&nodes[0].loop);
        /* Tasks that ended before the gate closed still count until their
         * done callbacks run on the loop. */
        pump_some(10);
        hold_data_to = -1;
        deliver_all();
        int held = nodes[0].pool_tasks;
        ck_assert_int_ge(held, 1);
        pump_some(100);
        ck_assert_int_ge(nodes[0].pool_tasks, held); /* none can end */
        in_call++;
        obd_job_on_peer_lost(&nodes[0], 1, "test: the link to node 1 is lost");
        in_call--;
        pump_some(100);
        ck_assert_int_eq(trainers[0][0].answers + trainers[0][1].answers, 0);
        gate_release(&nodes[0].loop);
        pump_until(all_answered);
        for (int l = 0; l < 2; l++) {
            ck_assert_int_eq(trainers[0][l].status, OBCOMM_E_PEER_LOST);
            ck_assert_int_ne(trainers[1][l].status, 0);
        }
    } else {
        /* Node 0's load: a pool piece per segment of each chunk (four
         * full 256 KiB ones and a tail, twice), up to two per thread at a time,
         * queued behind the gate. */
        gate_close(&nodes[0].loop);
        for (int k = 0; k < 2; k++)
            for (int l = 0; l < 2; l++)
                submit(k, l, 0, &a, buf[k][l]);
        for (int i = 0; i < 100000 && nodes[0].pool_tasks == 0; i++)
            pump_some(1);
        int depth = 2 * nodes[0].threads;
        ck_assert_int_eq(nodes[0].pool_tasks, depth < 4 ? depth : 4);
        /* What a deadline now would name. */
        char who[320];
        obd_job_op_waiting(obd_job_op(&nodes[0], jobs[0]->id, 0), who,
                           sizeof(who));
        ck_assert_str_eq(who, "the local reduction on node 0's worker pool");
        in_call++;
        obd_job_leave(jobs[0], 1, "killed");
        in_call--;
        pump_some(100);
        ck_assert_int_eq(trainers[0][0].answers, 0);
        gate_release(&nodes[0].loop);
        pump_until(node0_second_gone);
        ck_assert_int_eq(trainers[0][1].answers, 0);
        ck_assert_int_eq(trainers[0][0].status, OBCOMM_E_PEER_LOST);
        for (int l = 0; l < 2; l++)
            ck_assert_int_eq(trainers[1][l].status, OBCOMM_E_PEER_LOST);
    }
    answer_after_tasks = 0;
    stop();
}
END_TEST

/* Node 1's trainer announces op 0 and dies; its JobLeft is late, and so
 * node 0 runs op 0 and sends node 1 data while node 1, which has dropped
 * the job, meets node 0's announce and re-creates the op waiting for a
 * trainer that will never come. That op's data must not stop the link:
 * the failure node 0 echoes behind it ends the re-created job at once,
 * not at its deadline (seen in the torture test: every later job on the
 * link stalled with it). */
START_TEST(late_announce_does_not_stall_the_link)
{
    start(2, 1);
    static float x[2][POOL_COUNT];
    struct obd_opdesc a = {.kind = OBCOMM_KIND_ALLREDUCE,
                           .dtype = OBCOMM_FLOAT32,
                           .redop = OBCOMM_SUM,
                           .count = POOL_COUNT};
    submit(1, 0, 0, &a, x[1]);
    pump_some(5); /* node 0 has node 1's announce */
    hold_from = 1;
    hold_to = 0;
    in_call++;
    obd_job_leave(jobs[1], 0, "killed");
    in_call--;
    jobs[1] = NULL;
    for (int i = 0; i < 1000 && nodes[1].jobs != NULL; i++)
        pump_some(1);
    ck_assert_msg(nodes[1].jobs == NULL, "node 1 did not drop job j");
    nlocal = 1;
    submit(0, 0, 0, &a, x[0]);
    for (int i = 0; i < 1000 && data_sent[0] == 0; i++)
        pump_some(1);
    ck_assert_int_gt(data_sent[0], 0); /* node 0 runs op 0 */
    ck_assert_msg(nodes[1].jobs != NULL, "node 1 did not re-create job j");
    hold_from = hold_to = -1; /* the JobLeft arrives */
    for (int i = 0; i < 1000 && trainers[0][0].answers == 0; i++)
        pump_some(1);
    ck_assert_int_eq(trainers[0][0].status, OBCOMM_E_PEER_LOST);
    for (int i = 0; i < 1000 && nodes[1].jobs != NULL; i++)
        pump_some(1);
    ck_assert_msg(nodes[1].jobs == NULL, "node 1 still has job j");
    stop();
}
END_TEST

int main(void)
{
    /* The gate above holds every pool thread. */
    setenv("UV_THREADPOOL_SIZE", "4", 1);
    Suite *s = suite_create("job");
    TCase *tc = tcase_create("machine");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, answers_are_deferred);
    tcase_add_test(tc, mismatch_names_both);
    tcase_add_test(tc, mismatch_names_op_kinds);
    tcase_add_test(tc, failed_op_stops_the_run);
    tcase_add_test(tc, op_needing_a_lost_node_fails_at_once);
    tcase_add_test(tc, versions_differ_fail_everywhere);
    tcase_add_test(tc, snapshot_write_on_the_pool_does_not_stall_other_jobs);
    tcase_add_loop_test(tc, allreduce_exact, 0, 4);
    tcase_add_test(tc, leave_fails_remote_ops);
    tcase_add_test(tc, new_run_elsewhere_ends_the_old_run_here);
    tcase_add_loop_test(tc, onebit_phases, 0, 4);
    tcase_add_loop_test(tc, bad_scales_fail_everywhere, 0, 4);
    tcase_add_loop_test(tc, allreduce_on_the_pool_exact, 0, 12);
    tcase_add_loop_test(tc, gather_and_scatter_exact, 0, 12);
    tcase_add_test(tc, reduce_scatter_is_the_allreduce_part);
    tcase_add_loop_test(tc, gather_and_scatter_on_the_pool_exact, 0, 3);
    tcase_add_test(tc, gather_mismatch_names_kinds);
    tcase_add_loop_test(tc, failure_while_reducing_on_the_pool, 0, 2);
    tcase_add_test(tc, late_announce_does_not_stall_the_link);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
