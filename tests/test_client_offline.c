/* libobcomm without a daemon: argument checks, the unreachable-daemon path,
 * and error strings. Everything here must hold before a single byte is
 * exchanged with obcommd. */
#include <check.h>

#include "ck_run.h"
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/un.h>
#include <unistd.h>

#include "obcomm.h"

static obcomm_t *const SENTINEL = (obcomm_t *)0x1;

static int try_connect(const char *path, int local_rank, int local_size,
                       int timeout_ms, obcomm_t **out)
{
    obcomm_options_t o = {.socket_path = path,
                          .local_rank = local_rank,
                          .local_size = local_size,
                          .timeout_ms = timeout_ms};
    return obcomm_connect(&o, out);
}

START_TEST(test_connect_rejects_bad_options)
{
    static const int bad[][3] = {
        {0, 0, 0}, {0, 65, 0}, {-1, 2, 0}, {2, 2, 0}, {0, 1, -1},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        obcomm_t *c = SENTINEL;
        ck_assert_int_eq(try_connect("/nonexistent/obcommd.sock", bad[i][0],
                                     bad[i][1], bad[i][2], &c),
                         OBCOMM_E_INVAL);
        ck_assert_ptr_eq(c, SENTINEL); /* written only on success */
        ck_assert_str_ne(obcomm_last_error(NULL), "");
    }
    ck_assert_int_eq(obcomm_connect(NULL, NULL), OBCOMM_E_INVAL);
}
END_TEST

START_TEST(test_connect_missing_socket)
{
    obcomm_t *c = SENTINEL;
    ck_assert_int_eq(try_connect("/nonexistent/obcommd.sock", 0, 1, 0, &c),
                     OBCOMM_E_NOTCONN);
    ck_assert_ptr_eq(c, SENTINEL);
    ck_assert_ptr_nonnull(
        strstr(obcomm_last_error(NULL), "/nonexistent/obcommd.sock"));

    /* Without a path in the options, $OBCOMM_SOCKET names the socket. */
    setenv("OBCOMM_SOCKET", "/nonexistent/from-env.sock", 1);
    ck_assert_int_eq(obcomm_connect(NULL, &c), OBCOMM_E_NOTCONN);
    ck_assert_ptr_nonnull(
        strstr(obcomm_last_error(NULL), "/nonexistent/from-env.sock"));
    unsetenv("OBCOMM_SOCKET");
}
END_TEST

START_TEST(test_connect_refused)
{
    /* A socket file nobody listens on: what a crashed daemon leaves. */
    char path[] = "/tmp/obcomm-test-XXXXXX";
    int tmp = mkstemp(path);
    ck_assert_int_ge(tmp, 0);
    close(tmp);
    unlink(path);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, path);
    ck_assert_int_eq(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);

    obcomm_t *c = SENTINEL;
    ck_assert_int_eq(try_connect(path, 0, 1, 0, &c), OBCOMM_E_NOTCONN);
    ck_assert_ptr_eq(c, SENTINEL);
    ck_assert_ptr_nonnull(strstr(obcomm_last_error(NULL), path));
    close(s);
    unlink(path);
}
END_TEST

/* A user outside the socket's group is told which group to join. */
START_TEST(test_connect_denied_names_the_group)
{
    if (geteuid() != 0)
        return; /* needs root to become another user */
    char dir[] = "/tmp/obcomm-denied-XXXXXX", path[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(chmod(dir, 0755), 0);
    snprintf(path, sizeof(path), "%s/obcommd.sock", dir);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, path);
    ck_assert_int_eq(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(s, 4), 0);
    ck_assert_int_eq(chown(path, 0, 0), 0);
    ck_assert_int_eq(chmod(path, 0660), 0);
    struct group *g = getgrgid(0);
    ck_assert_ptr_nonnull(g);
    char want[512];
    snprintf(want, sizeof(want),
             "permission denied on %s: ask to be added to group %s (the "
             "daemon's socket_group) or set OBCOMM_SOCKET",
             path, g->gr_name);

    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
            _exit(2);
        obcomm_t *c = SENTINEL;
        int rc = try_connect(path, 0, 1, 0, &c);
        const char *m = obcomm_last_error(NULL);
        if (write(fds[1], m, strlen(m)) < 0)
            _exit(3);
        _exit(rc == -EACCES && c == SENTINEL ? 0 : 1);
    }
    close(fds[1]);
    char got[512] = "";
    ssize_t n = read(fds[0], got, sizeof(got) - 1);
    got[n > 0 ? n : 0] = '\0';
    close(fds[0]);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_str_eq(got, want);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(s);
    unlink(path);
    rmdir(dir);
}
END_TEST

static void *other_thread(void *arg)
{
    (void)arg;
    return (void *)obcomm_last_error(NULL);
}

START_TEST(test_connect_error_is_per_thread)
{
    obcomm_t *c;
    ck_assert_int_eq(try_connect("/nonexistent/x.sock", 0, 1, 0, &c),
                     OBCOMM_E_NOTCONN);
    pthread_t t;
    void *msg;
    ck_assert_int_eq(pthread_create(&t, NULL, other_thread, NULL), 0);
    ck_assert_int_eq(pthread_join(t, &msg), 0);
    ck_assert_str_eq((const char *)msg, "");
    ck_assert_str_ne(obcomm_last_error(NULL), "");
}
END_TEST

START_TEST(test_null_handle)
{
    void *p = SENTINEL;
    obcomm_close(NULL);
    ck_assert_int_eq(obcomm_rank(NULL), OBCOMM_E_INVAL);
    ck_assert_int_eq(obcomm_size(NULL), OBCOMM_E_INVAL);
    ck_assert_int_eq(obcomm_alloc(NULL, 64, &p), OBCOMM_E_INVAL);
    ck_assert_ptr_eq(p, SENTINEL);
    ck_assert_int_eq(obcomm_free(NULL, p), OBCOMM_E_INVAL);
    ck_assert_int_eq(obcomm_allreduce(NULL, p, 1, OBCOMM_FLOAT32, OBCOMM_SUM),
                     OBCOMM_E_INVAL);
    ck_assert_int_eq(obcomm_broadcast(NULL, p, 1, 0), OBCOMM_E_INVAL);
    ck_assert_int_eq(obcomm_barrier(NULL), OBCOMM_E_INVAL);
    ck_assert_int_eq(obcomm_allgather(NULL, p, p, 1, OBCOMM_INT32),
                     OBCOMM_E_INVAL);
    ck_assert_int_eq(
        obcomm_reduce_scatter(NULL, p, p, 1, OBCOMM_INT32, OBCOMM_SUM),
        OBCOMM_E_INVAL);

    /* The non-blocking calls write no request when they fail. */
    obcomm_request_t *r = (obcomm_request_t *)SENTINEL;
    ck_assert_int_eq(
        obcomm_iallreduce(NULL, p, 1, OBCOMM_FLOAT32, OBCOMM_SUM, &r),
        OBCOMM_E_INVAL);
    ck_assert_int_eq(obcomm_iallreduce_1bit(NULL, 1, p, 1, &r), OBCOMM_E_INVAL);
    ck_assert_int_eq(obcomm_ibroadcast(NULL, p, 1, 0, &r), OBCOMM_E_INVAL);
    ck_assert_int_eq(obcomm_iallgather(NULL, p, p, 1, OBCOMM_INT32, &r),
                     OBCOMM_E_INVAL);
    ck_assert_int_eq(
        obcomm_ireduce_scatter(NULL, p, p, 1, OBCOMM_INT32, OBCOMM_SUM, &r),
        OBCOMM_E_INVAL);
    ck_assert_int_eq(obcomm_ibarrier(NULL, &r), OBCOMM_E_INVAL);
    ck_assert_ptr_eq(r, SENTINEL);

    int done = 7;
    ck_assert_int_eq(obcomm_test(NULL, &done), OBCOMM_E_INVAL);
    ck_assert_int_eq(done, 7);
    ck_assert_int_eq(obcomm_wait(NULL), OBCOMM_E_INVAL);
    ck_assert_str_eq(obcomm_request_error(NULL), "");
    obcomm_request_free(NULL);
    ck_assert_int_eq(obcomm_fd(NULL), -1);
}
END_TEST

START_TEST(test_strerror)
{
    ck_assert_str_eq(obcomm_strerror(0), "success");
    ck_assert_str_eq(obcomm_strerror(-ENOENT), strerror(ENOENT));
    ck_assert_str_eq(obcomm_strerror(1), "unknown error");
    ck_assert_str_eq(obcomm_strerror(-1099), "unknown error");
    ck_assert_str_eq(obcomm_strerror(-5000), "unknown error");
    /* Every obcomm code has its own message. */
    for (int e = OBCOMM_E_DENIED; e <= OBCOMM_E_INVAL; e++) {
        ck_assert_str_ne(obcomm_strerror(e), "unknown error");
        for (int f = e + 1; f <= OBCOMM_E_INVAL; f++)
            ck_assert_str_ne(obcomm_strerror(e), obcomm_strerror(f));
    }
    ck_assert_str_eq(obcomm_err_name(OBCOMM_E_INVAL), "OBCOMM_E_INVAL");
    ck_assert_str_eq(obcomm_err_name(OBCOMM_E_TIMEOUT), "OBCOMM_E_TIMEOUT");
    ck_assert_str_eq(obcomm_err_name(OBCOMM_E_DENIED), "OBCOMM_E_DENIED");
    ck_assert_ptr_null(obcomm_err_name(0));
    ck_assert_ptr_null(obcomm_err_name(-ENOENT));
    ck_assert_ptr_null(obcomm_err_name(-1099));
    for (int e = OBCOMM_E_DENIED; e <= OBCOMM_E_INVAL; e++)
        ck_assert_ptr_nonnull(obcomm_err_name(e));
}
END_TEST

/* The enums' names and the header's constants, as bindings read them. */
START_TEST(test_enum_names_and_constants)
{
    ck_assert_str_eq(obcomm_dtype_name(OBCOMM_FLOAT32), "OBCOMM_FLOAT32");
    ck_assert_str_eq(obcomm_dtype_name(OBCOMM_BFLOAT16), "OBCOMM_BFLOAT16");
    ck_assert_str_eq(obcomm_dtype_name(OBCOMM_INT64), "OBCOMM_INT64");
    ck_assert_ptr_null(obcomm_dtype_name(OBCOMM_INT64 + 1));
    ck_assert_ptr_null(obcomm_dtype_name(-1));
    ck_assert_str_eq(obcomm_op_name(OBCOMM_SUM), "OBCOMM_SUM");
    ck_assert_str_eq(obcomm_op_name(OBCOMM_MIN), "OBCOMM_MIN");
    ck_assert_ptr_null(obcomm_op_name(OBCOMM_MIN + 1));
    double v = -1;
    ck_assert_int_eq(obcomm_constant("OBCOMM_ADAM_MAX_THREADS", &v), 0);
    ck_assert(v == OBCOMM_ADAM_MAX_THREADS);
    ck_assert_int_eq(obcomm_constant("OBCOMM_MAX_INFLIGHT", &v), 0);
    ck_assert(v == OBCOMM_MAX_INFLIGHT);
    ck_assert_int_eq(obcomm_constant("OBCOMM_ADAM_AUTO_MASK_RATIO", &v), 0);
    ck_assert((float)v == OBCOMM_ADAM_AUTO_MASK_RATIO);
    ck_assert_int_eq(obcomm_constant("OBCOMM_ZOADAM_AUTO_MASK_RATIO", &v), 0);
    ck_assert((float)v == OBCOMM_ZOADAM_AUTO_MASK_RATIO);
    v = -1;
    ck_assert_int_eq(obcomm_constant("OBCOMM_NO_SUCH", &v), OBCOMM_E_INVAL);
    ck_assert(v == -1);
    ck_assert_int_eq(obcomm_constant(NULL, &v), OBCOMM_E_INVAL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client_offline");
    TCase *tc = tcase_create("offline");
    tcase_add_test(tc, test_connect_rejects_bad_options);
    tcase_add_test(tc, test_connect_missing_socket);
    tcase_add_test(tc, test_connect_refused);
    tcase_add_test(tc, test_connect_denied_names_the_group);
    tcase_add_test(tc, test_connect_error_is_per_thread);
    tcase_add_test(tc, test_null_handle);
    tcase_add_test(tc, test_strerror);
    tcase_add_test(tc, test_enum_names_and_constants);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
