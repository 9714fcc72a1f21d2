/* Hostile job names against a real daemon: trainers join jobs named
 * "x\nobcommd rank=0 error: FORGED", "\x1b[2J", "\x1b]0;t\x07" and
 * "\xff\xfe" and wait in a barrier. The daemon's log has exactly one join
 * line for each, escaped, and no raw control byte or invalid UTF-8 at
 * all; obcommctl's text output has none either and shows the escaped
 * names; its JSON output stays valid and gives the names back exactly. */
#include <check.h>

#include "ck_run.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "text.h"

static const char *const names[] = {
    "x\nobcommd rank=0 error: FORGED",
    "\x1b[2J",
    "\x1b]0;t\x07",
    "\xff\xfe",
};
static const char *const escaped[] = {
    "x\\nobcommd rank=0 error: FORGED",
    "\\x1b[2J",
    "\\x1b]0;t\\x07",
    "\\xff\\xfe",
};
#define NJOBS (int)(sizeof(names) / sizeof(names[0]))

/* Waits in a barrier that the job's second local trainer never joins. */
static int trainer_wait(obcomm_t *c, void *arg)
{
    (void)arg;
    obcomm_barrier(c);
    return 0;
}

/* The whole output of a command. */
static size_t run(const char *cmd, char *out, size_t len)
{
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, len - 1, p) : 0;
    out[n] = '\0';
    if (p)
        pclose(p);
    return n;
}

/* 1 if s holds no control byte but newline and is valid UTF-8. */
static int clean_text(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = obcomm_utf8_len(p + i);
        if (k == 0 || p[i] == 0x7f || (p[i] < 0x20 && p[i] != '\n'))
            return 0;
        i += k;
    }
    return 1;
}

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)) != NULL; p++)
        n++;
    return n;
}

START_TEST(hostile_job_names_are_escaped)
{
    struct hx_cluster cl;
    ck_assert_int_eq(hx_start(&cl, 1, NULL), 0);
    pid_t pid[NJOBS];
    for (int i = 0; i < NJOBS; i++)
        pid[i] = hx_spawn(&cl, 0, 0, 2, names[i], 30000, trainer_wait, NULL);

    /* Every job listed with its op waiting. */
    static char out[1 << 16];
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s -s %s ops", getenv("OBCOMMCTL"), cl.sock[0]);
    int listed = 0;
    for (int t = 0; t < 400 && listed < NJOBS; t++) {
        run(cmd, out, sizeof(out));
        listed = count(out, "barrier");
        if (listed < NJOBS)
            hx_sleep_ms(25);
    }
    ck_assert_int_eq(listed, NJOBS);
    size_t n = run(cmd, out, sizeof(out));
    ck_assert_msg(clean_text(out, n), "obcommctl ops: %s", out);
    for (int i = 0; i < NJOBS; i++)
        ck_assert_msg(strstr(out, escaped[i]) != NULL, "%s not in %s",
                      escaped[i], out);

    /* JSON: valid, and the names come back exactly. */
    char py[1024];
    snprintf(py, sizeof(py),
             "%s -s %s --json ops | python3 -c 'import json, sys; "
             "j = json.loads(sys.stdin.buffer.read().decode(\"utf-8\")); "
             "print(sorted(x[\"name\"] for x in j[\"jobs\"]) == "
             "sorted([\"x\\nobcommd rank=0 error: FORGED\", \"\\x1b[2J\", "
             "\"\\x1b]0;t\\x07\", \"\\ufffd\\ufffd\"]))'",
             getenv("OBCOMMCTL"), cl.sock[0]);
    run(py, out, sizeof(out));
    ck_assert_str_eq(out, "True\n");

    for (int i = 0; i < NJOBS; i++)
        hx_wait(pid[i], 10);

    /* The log: read it while the daemon still runs (hx_stop removes it). */
    snprintf(cmd, sizeof(cmd), "cat %s/node0.log", cl.dir);
    n = run(cmd, out, sizeof(out));
    ck_assert_int_gt(n, 0);
    ck_assert_msg(clean_text(out, n), "log: %s", out);
    for (int i = 0; i < NJOBS; i++) {
        char line[256];
        snprintf(line, sizeof(line),
                 " obcommd rank=0 info: job %s: local rank 0 of 2 joined (pid ",
                 escaped[i]);
        ck_assert_msg(count(out, line) == 1, "%s in %s", line, out);
    }
    /* No forged line: FORGED appears only after the escaped newline. */
    ck_assert_int_eq(count(out, "FORGED"),
                     count(out, "x\\nobcommd rank=0 error: FORGED"));
    ck_assert_int_eq(count(out, "\nobcommd rank=0 error: FORGED"), 0);
    ck_assert_int_eq(hx_stop(&cl), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("escape");
    TCase *tc = tcase_create("escape");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, hostile_job_names_are_escaped);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
