/* Jobs owned by their users, against real daemons.
 *
 * The tests run as root and drop to uid/gid 65534 (nobody/nogroup) in a
 * forked child: setresgid, setgroups(0), setresuid, as setpriv
 * --reuid=65534 --regid=65534 --clear-groups does. The daemon's socket is
 * given group 65534 (socket_group) so that the other user can connect at
 * all: mode 0660 keeps everyone else out.
 *
 * a. Another uid cannot join a job it does not own: OBCOMM_E_DENIED with a
 *    message naming the owner; it does not see the job in obcommctl, while
 *    root sees both jobs and the other user its own.
 * b. 300 idle connections of one user do not lock out trainers: at most
 *    max_clients_per_uid of them are held, trainers of another user run
 *    their collective meanwhile, and connections that never join are
 *    closed after client_join_ms.
 * c. A socket directory that everybody may write without the sticky bit,
 *    or that belongs to another user, is refused at start; so is a
 *    state_dir that belongs to another user or that others may write (item
 *    6), and FIFOs named like snapshots do not block the start.
 * d. A job has one owner across the mesh: uid 65534 joins job "rootjob"
 *    on node 1 first, root joins it on nodes 0 and 2; the op fails on
 *    every rank with OBCOMM_E_DENIED naming every node's owner, nobody
 *    sees another's data, and the run stays stopped. The same with
 *    owner_identity = name; nodes that compare owners differently refuse
 *    each other's links, and root on every node runs as usual.
 * e. max_jobs_per_uid: uid 65534 holding its bound of idle jobs (a
 *    quarter of max_jobs) cannot start one more, root still can, and a
 *    full daemon says max_jobs, not the user's bound.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ck_run.h"
#include "harness.h"

#define NOBODY 65534

/* Becomes uid/gid 65534 with no supplementary groups; 0 on success. */
static int drop_privileges(void)
{
    if (setgroups(0, NULL) != 0 || setresgid(NOBODY, NOBODY, NOBODY) != 0 ||
        setresuid(NOBODY, NOBODY, NOBODY) != 0)
        return -1;
    return getuid() == NOBODY && geteuid() == NOBODY ? 0 : -1;
}

/* obcommctl's JSON list of jobs as seen from the calling user. */
static void ops_json(const char *sock, char *out, size_t len)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s -s %s --json ops", getenv("OBCOMMCTL"),
             sock);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, len - 1, p) : 0;
    out[n] = '\0';
    if (p)
        pclose(p);
}

static int connect_raw(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int wait_byte(int fd)
{
    char b;
    return read(fd, &b, 1) == 1 ? 0 : -1;
}

static void send_byte(int fd)
{
    char b = 1;
    ck_assert_int_eq(write(fd, &b, 1), 1);
}

/* ---- a. ---- */

START_TEST(another_uid_cannot_join_or_see_a_job)
{
    const char *flags[] = {"--socket_group", "65534", NULL};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, flags), 0);
    ck_assert_int_eq(chmod(cl.dir, 0711), 0); /* the other user may enter */
    struct stat st;
    ck_assert_int_eq(stat(cl.sock[0], &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0660);
    ck_assert_int_eq(st.st_gid, NOBODY);

    /* Root owns job "secret" (rank 0 of 2, so the job stays open). */
    obcomm_options_t o = {.socket_path = cl.sock[0],
                          .job = "secret",
                          .local_rank = 0,
                          .local_size = 2};
    obcomm_t *mine;
    ck_assert_int_eq(obcomm_connect(&o, &mine), 0);

    int up[2], down[2];
    ck_assert_int_eq(pipe(up), 0);
    ck_assert_int_eq(pipe(down), 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        /* 1: privileges, 2: join not denied, 3: message, 4: own job,
         * 5: status shows the other's job, 6: status lacks its own. */
        if (drop_privileges() != 0)
            _exit(1);
        obcomm_options_t t = {.socket_path = cl.sock[0],
                              .job = "secret",
                              .local_rank = 1,
                              .local_size = 2};
        obcomm_t *c;
        int rc = obcomm_connect(&t, &c);
        fprintf(stderr, "uid %u joining root's job: %d (%s): %s\n",
                (unsigned)getuid(), rc, obcomm_strerror(rc),
                obcomm_last_error(NULL));
        if (rc != OBCOMM_E_DENIED)
            _exit(2);
        if (!strstr(obcomm_last_error(NULL),
                    "job secret belongs to uid 0 on node 0; uid 65534 may "
                    "not join it"))
            _exit(3);
        t.job = "theirs";
        t.local_rank = 0;
        t.local_size = 2;
        if (obcomm_connect(&t, &c) != 0)
            _exit(4);
        char out[16384];
        ops_json(cl.sock[0], out, sizeof(out));
        if (strstr(out, "secret"))
            _exit(5);
        if (!strstr(out, "\"theirs\""))
            _exit(6);
        send_byte(up[1]);
        wait_byte(down[0]); /* root looks at the status meanwhile */
        obcomm_close(c);
        _exit(0);
    }
    ck_assert_int_eq(wait_byte(up[0]), 0);
    char out[16384];
    ops_json(cl.sock[0], out, sizeof(out));
    ck_assert_msg(strstr(out, "\"secret\"") && strstr(out, "\"theirs\""),
                  "root sees every job: %s", out);
    send_byte(down[1]);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "the other user's checks failed at step %d",
                  WEXITSTATUS(status));

    /* The owner's job is untouched: root's second rank joins and both
     * ranks run a barrier. */
    o.local_rank = 1;
    pid = fork();
    if (pid == 0) {
        obcomm_t *c;
        if (obcomm_connect(&o, &c) != 0 || obcomm_barrier(c) != 0)
            _exit(1);
        obcomm_close(c);
        _exit(0);
    }
    ck_assert_int_eq(obcomm_barrier(mine), 0);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    obcomm_close(mine);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* ---- b. ---- */

static int trainer_sum(obcomm_t *c, void *arg)
{
    (void)arg;
    float *x;
    if (obcomm_alloc(c, 1000 * sizeof(float), (void **)&x))
        return hx_fail(c, "alloc: %s", obcomm_last_error(c));
    for (int i = 0; i < 1000; i++)
        x[i] = (float)(obcomm_rank(c) + i);
    if (obcomm_allreduce(c, x, 1000, OBCOMM_FLOAT32, OBCOMM_SUM))
        return hx_fail(c, "allreduce: %s", obcomm_last_error(c));
    int n = obcomm_size(c);
    for (int i = 0; i < 1000; i++)
        if (x[i] != (float)(n * (n - 1) / 2 + n * i))
            return hx_fail(c, "x[%d] = %g", i, (double)x[i]);
    return 0;
}

/* Connections open on the daemon's side, obcommctl's own included. */
static long long wait_clients(struct hx_cluster *cl, long long want)
{
    long long n = -1;
    for (int t = 0; t < 400 && n != want; t++) {
        n = hx_metric(cl, 0, "clients");
        if (n != want)
            hx_sleep_ms(50);
    }
    return n;
}

/* Child as uid 65534: opens `n` connections that never say anything,
 * tells the parent, then counts how many the daemon closes within 60 s. */
static void idle_child(const char *sock, int n, int up, int down)
{
    if (drop_privileges() != 0)
        _exit(1);
    int *fd = calloc((size_t)n, sizeof(int));
    for (int i = 0; i < n; i++)
        if ((fd[i] = connect_raw(sock)) < 0)
            _exit(2);
    send_byte(up);
    wait_byte(down);
    int closed = 0;
    /* The daemon says goodbye before it closes: read to the end. */
    for (int i = 0; i < n; i++) {
        char b[256];
        for (;;) {
            struct pollfd p = {.fd = fd[i], .events = POLLIN};
            if (poll(&p, 1, 60000) != 1)
                break;
            ssize_t r = read(fd[i], b, sizeof(b));
            if (r == 0)
                closed++;
            if (r <= 0)
                break;
        }
    }
    fprintf(stderr, "%d of %d idle connections closed by the daemon\n", closed,
            n);
    _exit(closed == n ? 0 : 3);
}

START_TEST(idle_connections_do_not_lock_out_trainers)
{
    const char *flags[] = {"--socket_group",
                           "65534",
                           "--max_clients_per_uid",
                           "64",
                           "--client_join_ms",
                           "600000",
                           NULL};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 2, flags), 0);
    ck_assert_int_eq(chmod(cl.dir, 0711), 0);

    int up[2], down[2];
    ck_assert_int_eq(pipe(up), 0);
    ck_assert_int_eq(pipe(down), 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        idle_child(cl.sock[0], 300, up[1], down[0]);
    ck_assert_int_eq(wait_byte(up[0]), 0);

    /* 64 held (the bound), 236 refused; obcommctl is the 65th. */
    ck_assert_int_eq(wait_clients(&cl, 65), 65);
    ck_assert(hx_log_contains(&cl, 0, "refusing a client of uid 65534 (pid"));
    ck_assert(hx_log_contains(&cl, 0, "max_clients_per_uid (64) reached"));

    /* Trainers of another user (root) join and run meanwhile. */
    ck_assert_int_eq(hx_run(&cl, 2, "work", 20000, 120, trainer_sum, NULL), 0);
    ck_assert_int_eq(wait_clients(&cl, 65), 65);

    /* A reload cannot shorten the wait; stop the daemon: every held
     * connection is closed, so the child counts all 300. */
    ck_assert_int_eq(hx_stop(&cl), 0);
    send_byte(down[1]);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "idle child failed at step %d", WEXITSTATUS(status));
}
END_TEST

START_TEST(connections_that_never_join_are_closed)
{
    const char *flags[] = {"--socket_group", "65534", "--client_join_ms", "300",
                           NULL};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, flags), 0);
    ck_assert_int_eq(chmod(cl.dir, 0711), 0);
    int up[2], down[2];
    ck_assert_int_eq(pipe(up), 0);
    ck_assert_int_eq(pipe(down), 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        idle_child(cl.sock[0], 20, up[1], down[0]);
    ck_assert_int_eq(wait_byte(up[0]), 0);
    send_byte(down[1]);
    /* The daemon is still running: the child sees all 20 closed by the
     * join timer, not by a shutdown. */
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "idle child failed at step %d", WEXITSTATUS(status));
    ck_assert(hx_alive(&cl, 0));
    ck_assert(hx_log_contains(
        &cl, 0, "neither joined a job nor asked for the status within 300 ms"));
    ck_assert_int_eq(hx_metric(&cl, 0, "client_errors"), 20);
    /* A trainer that joins at once is not affected. */
    ck_assert_int_eq(hx_run(&cl, 1, "quick", 20000, 60, trainer_sum, NULL), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* ---- c. ---- */

static int daemon_refuses(const char *dir, const char *needle)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "%s --socket %s/d.sock --log-level info 2>%s.log; "
             "test $? -ne 0 && grep -q '%s' %s.log",
             getenv("OBCOMMD"), dir, dir, needle, dir);
    return system(cmd) == 0;
}

START_TEST(unsafe_socket_directories_are_refused)
{
    char base[] = "/tmp/obcomm-sockdir-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(base));
    char dir[128];
    snprintf(dir, sizeof(dir), "%s/open", base);
    ck_assert_int_eq(mkdir(dir, 0777), 0);
    ck_assert_int_eq(chmod(dir, 0777), 0);
    ck_assert(daemon_refuses(dir, "is writable by everybody without the "
                                  "sticky bit (mode 0777): refused"));
    snprintf(dir, sizeof(dir), "%s/other", base);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    ck_assert_int_eq(chown(dir, NOBODY, NOBODY), 0);
    ck_assert(daemon_refuses(dir, "belongs to uid 65534, not to this daemon"));
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", base);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* state_dir, like an ssh key: refused unless it belongs to the daemon's
 * user and nobody else may write it. A FIFO named like a snapshot set or
 * file does not block the start. */
static int state_dir_refused(const char *base, const char *sd,
                             const char *needle)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "%s --socket %s/d.sock --state-dir %s 2>%s/log; "
             "test $? -ne 0 && grep -q '%s' %s/log",
             getenv("OBCOMMD"), base, sd, base, needle, base);
    return system(cmd) == 0;
}

START_TEST(unsafe_state_dirs_are_refused)
{
    char base[] = "/tmp/obcomm-statedir-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(base));
    char sd[128];
    snprintf(sd, sizeof(sd), "%s/group", base);
    ck_assert_int_eq(mkdir(sd, 0700), 0);
    ck_assert_int_eq(chmod(sd, 0770), 0);
    ck_assert(state_dir_refused(base, sd, "with mode 0770: refused"));
    snprintf(sd, sizeof(sd), "%s/other", base);
    ck_assert_int_eq(mkdir(sd, 0700), 0);
    ck_assert_int_eq(chown(sd, NOBODY, NOBODY), 0);
    ck_assert(state_dir_refused(base, sd, "belongs to uid 65534"));

    snprintf(sd, sizeof(sd), "%s/fifo", base);
    ck_assert_int_eq(mkdir(sd, 0700), 0);
    char f[256];
    snprintf(f, sizeof(f), "%s/set-6a-0000000100000005", sd);
    ck_assert_int_eq(mkfifo(f, 0600), 0);
    snprintf(f, sizeof(f), "%s/ef-0000000000000001-0000000000000002.lz4", sd);
    ck_assert_int_eq(mkfifo(f, 0600), 0);
    const char *flags[] = {"--state-dir", sd, NULL};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, flags), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);

    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", base);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* ---- d. ---- */

#define OWNER_N 1000

/* What a rank of the mixed job must read: DENIED on the first op, with
 * every needle in the message, and DENIED again on the next op (the run
 * is stopped). */
struct denied_case {
    const char *needle[3];
};

/* Runs two allreduces of OWNER_N floats of `mine` and checks both against
 * c; 0 if they fail as c says, else a step number (and a message on
 * stderr). */
static int expect_denied(obcomm_t *comm, const struct denied_case *dc,
                         float mine)
{
    float *x;
    if (obcomm_alloc(comm, OWNER_N * sizeof(float), (void **)&x))
        return hx_fail(comm, "alloc: %s", obcomm_last_error(comm));
    for (int op = 0; op < 2; op++) {
        for (int i = 0; i < OWNER_N; i++)
            x[i] = mine;
        int rc = obcomm_allreduce(comm, x, OWNER_N, OBCOMM_FLOAT32, OBCOMM_SUM);
        const char *msg = obcomm_last_error(comm);
        fprintf(stderr, "rank %d (uid %u), op %d: %d (%s): %s\n",
                obcomm_rank(comm), (unsigned)getuid(), op, rc,
                obcomm_strerror(rc), msg);
        if (rc != OBCOMM_E_DENIED) {
            hx_fail(comm, "op %d: rc %d, not OBCOMM_E_DENIED; x[0] = %g", op,
                    rc, (double)x[0]);
            return 10 + op;
        }
        for (int k = 0; k < 3 && dc->needle[k]; k++)
            if (!strstr(msg, dc->needle[k])) {
                hx_fail(comm, "op %d: '%s' not in the message", op,
                        dc->needle[k]);
                return 20 + op;
            }
        /* The buffer is the rank's own data, untouched by the others. */
        for (int i = 0; i < OWNER_N; i++)
            if (x[i] != mine) {
                hx_fail(comm, "op %d: x[%d] = %g, not its own %g", op, i,
                        (double)x[i], (double)mine);
                return 30 + op;
            }
    }
    return 0;
}

static int root_rank_denied(obcomm_t *comm, void *arg)
{
    return expect_denied(comm, arg, 1.0f);
}

/* Uid 65534 joins `job` on node 1 alone (local size 1) before root's
 * ranks on nodes 0 and 2 join; every rank must read dc. */
static void mixed_owners(struct hx_cluster *cl, const char *job,
                         const struct denied_case *dc)
{
    ck_assert_int_eq(chmod(cl->dir, 0711), 0);
    int up[2];
    ck_assert_int_eq(pipe(up), 0);
    fflush(NULL);
    pid_t other = fork();
    if (other == 0) {
        if (drop_privileges() != 0)
            _exit(1);
        obcomm_options_t t = {.socket_path = cl->sock[1],
                              .job = job,
                              .local_rank = 0,
                              .local_size = 1,
                              .timeout_ms = 30000};
        obcomm_t *c;
        if (obcomm_connect(&t, &c) != 0) {
            fprintf(stderr, "uid 65534 could not join: %s\n",
                    obcomm_last_error(NULL));
            _exit(2);
        }
        send_byte(up[1]);
        int rc = expect_denied(c, dc, 1000.0f);
        obcomm_close(c);
        _exit(rc);
    }
    close(up[1]); /* a child that fails early ends the wait */
    ck_assert_int_eq(wait_byte(up[0]), 0); /* it joined first */
    pid_t root0 =
        hx_spawn(cl, 0, 0, 1, job, 30000, root_rank_denied, (void *)dc);
    pid_t root2 =
        hx_spawn(cl, 2, 0, 1, job, 30000, root_rank_denied, (void *)dc);
    int st[3] = {hx_wait(root0, 60000), 0, hx_wait(root2, 60000)};
    ck_assert_int_eq(waitpid(other, &st[1], 0), other);
    for (int n = 0; n < 3; n++)
        ck_assert_msg(
            st[n] != -1 && WIFEXITED(st[n]) && WEXITSTATUS(st[n]) == 0,
            "the rank on node %d failed at step %d", n,
            st[n] != -1 && WIFEXITED(st[n]) ? WEXITSTATUS(st[n]) : -1);
    close(up[0]);
}

START_TEST(another_uid_on_another_node_is_denied_everywhere)
{
    const char *flags[] = {"--socket_group", "65534", NULL};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 3, flags), 0);
    struct denied_case dc = {{"op 0 of job rootjob: the job's trainers "
                              "belong to different users: uid 0 on nodes 0, "
                              "2; uid 65534 on node 1",
                              NULL}};
    /* The second op reads the run's first failure. */
    mixed_owners(&cl, "rootjob", &dc);
    for (int n = 0; n < 3; n++)
        ck_assert_int_ge(hx_metric(&cl, n, "runs_stopped"), 1);
    /* Root's own job on every node runs as usual. */
    ck_assert_int_eq(hx_run(&cl, 1, "rootjob2", 20000, 120, trainer_sum, NULL),
                     0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

START_TEST(owners_compared_by_name)
{
    const char *flags[] = {"--socket_group", "65534", "--owner_identity",
                           "name", NULL};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 3, flags), 0);
    struct denied_case dc = {{"the job's trainers belong to different "
                              "users: user root (uid 0) on nodes 0, 2; user "
                              "nobody (uid 65534) on node 1",
                              NULL}};
    mixed_owners(&cl, "rootjob", &dc);
    ck_assert_int_eq(hx_run(&cl, 1, "rootjob2", 20000, 120, trainer_sum, NULL),
                     0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

START_TEST(nodes_comparing_owners_differently_refuse_jobs)
{
    /* The link is refused at the handshake, naming the option on both
     * sides (announces say the rule too: test_owner_rules.c). */
    const char *name[] = {"--owner_identity", "name", NULL};
    const char *const *each[2] = {NULL, name};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start_each(&cl, 2, each), 0);
    ck_assert(hx_log_wait(&cl, 0,
                          "option owner_identity is uid here (rank 0) and "
                          "name at rank 1; it must be equal on every node",
                          10000));
    ck_assert(hx_log_wait(&cl, 1,
                          "option owner_identity is name here (rank 1) and "
                          "uid at rank 0; it must be equal on every node",
                          10000));
    ck_assert_int_eq(hx_metric(&cl, 0, "links_up"), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

/* ---- e. ---- */

/* Joins `job` as local rank 0 of 2, so that it stays an idle job of the
 * caller's; 0 or the code, with the message in msg. */
static int join_idle(const char *sock, const char *job, obcomm_t **out,
                     char *msg, size_t len)
{
    obcomm_options_t t = {
        .socket_path = sock, .job = job, .local_rank = 0, .local_size = 2};
    int rc = obcomm_connect(&t, out);
    snprintf(msg, len, "%s", rc ? obcomm_last_error(NULL) : "");
    return rc;
}

START_TEST(one_user_cannot_take_every_job)
{
    /* max_jobs_per_uid is left at its default: 8 / 4 = 2. */
    const char *flags[] = {"--socket_group", "65534", "--max_jobs", "8", NULL};
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, flags), 0);
    ck_assert_int_eq(chmod(cl.dir, 0711), 0);
    int up[2], down[2];
    ck_assert_int_eq(pipe(up), 0);
    ck_assert_int_eq(pipe(down), 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (drop_privileges() != 0)
            _exit(1);
        obcomm_t *c[3];
        char msg[512];
        if (join_idle(cl.sock[0], "a", &c[0], msg, sizeof(msg)) != 0 ||
            join_idle(cl.sock[0], "b", &c[1], msg, sizeof(msg)) != 0)
            _exit(2);
        int rc = join_idle(cl.sock[0], "c", &c[2], msg, sizeof(msg));
        fprintf(stderr, "uid 65534's third job: %d (%s): %s\n", rc,
                obcomm_strerror(rc), msg);
        if (rc != OBCOMM_E_BUSY)
            _exit(3);
        if (!strstr(msg, "uid 65534 already holds 2 jobs on node 0, "
                         "max_jobs_per_uid is 2"))
            _exit(4);
        send_byte(up[1]);
        wait_byte(down[0]); /* its jobs stay while root joins */
        _exit(0);
    }
    close(up[1]); /* a child that fails early ends the wait */
    int status;
    if (wait_byte(up[0]) != 0) {
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_abort_msg("the other user's checks failed at step %d",
                     WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }

    /* Root starts a job and runs it meanwhile; once its trainers are gone
     * (the other user's two connections and obcommctl's remain), root
     * starts jobs up to max_jobs, and the next is refused for the
     * daemon's bound. */
    ck_assert_int_eq(hx_run(&cl, 1, "work", 20000, 60, trainer_sum, NULL), 0);
    ck_assert_int_eq(wait_clients(&cl, 3), 3);
    obcomm_t *mine[6];
    char msg[512], name[16];
    for (int i = 0; i < 6; i++) {
        snprintf(name, sizeof(name), "root%d", i);
        ck_assert_msg(join_idle(cl.sock[0], name, &mine[i], msg, sizeof(msg)) ==
                          0,
                      "root's job %d: %s", i, msg);
    }
    obcomm_t *extra;
    int rc = join_idle(cl.sock[0], "root6", &extra, msg, sizeof(msg));
    ck_assert_int_eq(rc, OBCOMM_E_BUSY);
    ck_assert_msg(strstr(msg, "node 0 holds 8 jobs, max_jobs is 8"), "%s", msg);
    ck_assert_ptr_null(strstr(msg, "max_jobs_per_uid"));

    send_byte(down[1]);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "the other user's checks failed at step %d",
                  WEXITSTATUS(status));
    for (int i = 0; i < 6; i++)
        obcomm_close(mine[i]);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

int main(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_owner needs root (it switches users); "
                        "skipped\n");
        return 77;
    }
    Suite *s = suite_create("owner");
    TCase *tc = tcase_create("owner");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, another_uid_cannot_join_or_see_a_job);
    tcase_add_test(tc, idle_connections_do_not_lock_out_trainers);
    tcase_add_test(tc, connections_that_never_join_are_closed);
    tcase_add_test(tc, unsafe_socket_directories_are_refused);
    tcase_add_test(tc, unsafe_state_dirs_are_refused);
    tcase_add_test(tc, another_uid_on_another_node_is_denied_everywhere);
    tcase_add_test(tc, owners_compared_by_name);
    tcase_add_test(tc, nodes_comparing_owners_differently_refuse_jobs);
    tcase_add_test(tc, one_user_cannot_take_every_job);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
