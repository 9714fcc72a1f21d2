/* The log: line format for people and for journald, and the rate limit
 * (on the log's own clock, set by the test). */
#include <check.h>

#include "ck_run.h"
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"
#include "text.h"

/* Reads back what the log wrote to `f` since the last call. */
static char *drain(FILE *f, long *pos)
{
    static char buf[65536];
    fflush(f);
    long end = ftell(f);
    fseek(f, *pos, SEEK_SET);
    size_t n = fread(buf, 1, (size_t)(end - *pos), f);
    buf[n] = '\0';
    *pos = end;
    fseek(f, end, SEEK_SET);
    return buf;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

START_TEST(people_get_iso_dates_and_rank)
{
    unsetenv("JOURNAL_STREAM");
    FILE *f = tmpfile();
    long pos = 0;
    struct obd_log log = {.level = OBD_LOG_INFO, .rank = 3, .out = f};
    obd_log_warn(&log, "hello %d", 1);
    obd_log_debug(&log, "not shown at level info");
    char *out = drain(f, &pos);
    regex_t re;
    ck_assert_int_eq(regcomp(&re,
                             "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:"
                             "[0-9]{2}\\.[0-9]{3}Z obcommd rank=3 warn: "
                             "hello 1\n$",
                             REG_EXTENDED),
                     0);
    ck_assert_msg(regexec(&re, out, 0, NULL, 0) == 0, "line: %s", out);
    regfree(&re);
    fclose(f);
}
END_TEST

START_TEST(journald_gets_syslog_priorities)
{
    FILE *f = tmpfile();
    long pos = 0;
    struct stat st;
    ck_assert_int_eq(fstat(fileno(f), &st), 0);
    char js[64];
    snprintf(js, sizeof(js), "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    setenv("JOURNAL_STREAM", js, 1);
    struct obd_log log = {.level = OBD_LOG_DEBUG, .rank = 0, .out = f};
    obd_log_error(&log, "e");
    obd_log_warn(&log, "w");
    obd_log_info(&log, "i");
    obd_log_debug(&log, "d");
    ck_assert_str_eq(drain(f, &pos), "<3>rank=0 error: e\n"
                                     "<4>rank=0 warn: w\n"
                                     "<6>rank=0 info: i\n"
                                     "<7>rank=0 debug: d\n");

    /* A JOURNAL_STREAM that is not stderr (a redirect) means people. */
    snprintf(js, sizeof(js), "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino + 1);
    setenv("JOURNAL_STREAM", js, 1);
    struct obd_log log2 = {.level = OBD_LOG_INFO, .rank = 1, .out = f};
    obd_log_info(&log2, "x");
    ck_assert_ptr_nonnull(strstr(drain(f, &pos), "Z obcommd rank=1 info: x"));
    unsetenv("JOURNAL_STREAM");
    fclose(f);
}
END_TEST

START_TEST(repeats_are_counted_not_printed)
{
    unsetenv("JOURNAL_STREAM");
    FILE *f = tmpfile();
    long pos = 0;
    struct obd_log *log = calloc(1, sizeof(*log));
    log->level = OBD_LOG_DEBUG;
    log->out = f;
    log->now_ms = 1000;
    for (int i = 0; i < 25; i++)
        obd_log_warn(log, "link %d is down", i);
    obd_log_warn(log, "another message");
    for (int i = 0; i < 25; i++)
        obd_log_debug(log, "debug %d", i); /* never limited */
    char *out = drain(f, &pos);
    ck_assert_int_eq(count_lines(out), OBD_LOG_BURST + 1 + 25);
    ck_assert_ptr_nonnull(strstr(out, "link 9 is down\n"));
    ck_assert_ptr_null(strstr(out, "link 10 is down"));

    /* Still inside the window: suppressed. */
    log->now_ms = 1000 + OBD_LOG_WINDOW_MS - 1;
    obd_log_warn(log, "link %d is down", 99);
    ck_assert_str_eq(drain(f, &pos), "");
    /* A new window: the next line says how many were dropped. */
    log->now_ms = 1000 + OBD_LOG_WINDOW_MS;
    obd_log_warn(log, "link %d is down", 100);
    out = drain(f, &pos);
    ck_assert_ptr_nonnull(
        strstr(out, "link 100 is down (16 similar messages suppressed)\n"));
    obd_log_warn(log, "link %d is down", 101);
    out = drain(f, &pos);
    ck_assert_ptr_nonnull(strstr(out, "link 101 is down\n"));

    /* Once a minute: one line, then a count. */
    log->now_ms = 100000;
    for (int i = 0; i < 5; i++)
        obd_log_limited(log, OBD_LOG_ERROR, 60000, "peers differ: %d", i);
    out = drain(f, &pos);
    ck_assert_int_eq(count_lines(out), 1);
    ck_assert_ptr_nonnull(strstr(out, "error: peers differ: 0\n"));
    log->now_ms = 159999;
    obd_log_limited(log, OBD_LOG_ERROR, 60000, "peers differ: %d", 5);
    ck_assert_str_eq(drain(f, &pos), "");
    log->now_ms = 160000;
    obd_log_limited(log, OBD_LOG_ERROR, 60000, "peers differ: %d", 6);
    ck_assert_ptr_nonnull(strstr(
        drain(f, &pos), "peers differ: 6 (5 similar messages suppressed)\n"));

    /* More formats than slots: the table stays bounded and keeps
     * working (each literal below is a distinct format). */
#define L(n) obd_log_info(log, "fmt " #n " %d", n)
    L(0), L(1), L(2), L(3), L(4), L(5), L(6), L(7), L(8), L(9), L(10), L(11);
    L(12), L(13), L(14), L(15), L(16), L(17), L(18), L(19), L(20), L(21);
    L(22), L(23), L(24), L(25), L(26), L(27), L(28), L(29), L(30), L(31);
    L(32), L(33), L(34), L(35), L(36), L(37), L(38), L(39);
#undef L
    ck_assert_int_eq(count_lines(drain(f, &pos)), 40);
    free(log);
    fclose(f);
}
END_TEST

/* Hostile job names as arguments: every one stays on its one line, with
 * control bytes, ESC, C1 controls and invalid UTF-8 escaped, backslashes
 * doubled and valid UTF-8 kept. */
START_TEST(outside_text_is_escaped)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"x\nobcommd rank=0 error: FORGED", "x\\nobcommd rank=0 error: FORGED"},
        {"\x1b[2J", "\\x1b[2J"},
        {"\x1b]0;t\x07", "\\x1b]0;t\\x07"},
        {"\xff\xfe", "\\xff\\xfe"},
        {"a\\x1b\tb\r\x7f", "a\\\\x1b\\tb\\r\\x7f"},
        {"\xc2\x9b"
         "1m \xc3\xa9t\xc3\xa9 \xe2\x82\xac",
         "\\xc2\\x9b1m \xc3\xa9t\xc3\xa9 \xe2\x82\xac"},
        {"\xe0\x80\x80 \xed\xa0\x80 \xf4\x90\x80\x80 \xe2\x82",
         "\\xe0\\x80\\x80 \\xed\\xa0\\x80 \\xf4\\x90\\x80\\x80 \\xe2\\x82"},
    };
    unsetenv("JOURNAL_STREAM");
    FILE *f = tmpfile();
    long pos = 0;
    struct obd_log log = {.level = OBD_LOG_INFO, .rank = 0, .out = f};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        obd_log_info(&log, "job %s: local rank 0 of 2 joined", cases[i].in);
        char *out = drain(f, &pos);
        ck_assert_int_eq(count_lines(out), 1);
        char want[256];
        snprintf(want, sizeof(want),
                 " obcommd rank=0 info: job %s: local "
                 "rank 0 of 2 joined\n",
                 cases[i].out);
        char *at = strstr(out, " obcommd rank=0 info: ");
        ck_assert_ptr_nonnull(at);
        ck_assert_str_eq(at, want);
    }
    fclose(f);

    /* Cut to fit, never inside an escape or a character. */
    char small[6];
    ck_assert_uint_eq(obcomm_text_escape(small, sizeof(small), "ab\n\xff"), 4);
    ck_assert_str_eq(small, "ab\\n");
    ck_assert_uint_eq(obcomm_text_escape(small, sizeof(small), "abcd\xc3\xa9"),
                      4);
    ck_assert_str_eq(small, "abcd");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("log");
    TCase *tc = tcase_create("log");
    tcase_add_test(tc, people_get_iso_dates_and_rank);
    tcase_add_test(tc, journald_gets_syslog_priorities);
    tcase_add_test(tc, repeats_are_counted_not_printed);
    tcase_add_test(tc, outside_text_is_escaped);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
