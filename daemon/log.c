#include "log.h"
#include "text.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static const char *const level_names[] = {"error", "warn", "info", "debug"};

/* syslog(3) priorities: LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG. */
static const int level_prio[] = {3, 4, 6, 7};

int obd_log_level_parse(const char *name)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

/* systemd sets JOURNAL_STREAM to "DEV:INO" of the stream it connected to
 * stdout/stderr; the stream is the journal only if stderr still is that
 * file (a shell redirect inside the unit would change it). */
static int stderr_is_journal(FILE *out)
{
    const char *js = getenv("JOURNAL_STREAM");
    if (js == NULL || js[0] == '\0')
        return 0;
    unsigned long long dev, ino;
    if (sscanf(js, "%llu:%llu", &dev, &ino) != 2)
        return 0;
    struct stat st;
    if (fstat(fileno(out), &st) != 0)
        return 0;
    return (unsigned long long)st.st_dev == dev &&
           (unsigned long long)st.st_ino == ino;
}

static uint64_t now_ms(const struct obd_log *log)
{
    if (log->now_ms != 0)
        return log->now_ms;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static struct obd_log_slot *slot_of(struct obd_log *log, const char *fmt)
{
    struct obd_log_slot *free_slot = NULL, *oldest = &log->slots[0];
    for (int i = 0; i < OBD_LOG_SLOTS; i++) {
        struct obd_log_slot *s = &log->slots[i];
        if (s->fmt == fmt)
            return s;
        if (s->fmt == NULL && free_slot == NULL)
            free_slot = s;
        if (s->last_ms < oldest->last_ms)
            oldest = s;
    }
    struct obd_log_slot *s = free_slot ? free_slot : oldest;
    memset(s, 0, sizeof(*s));
    s->fmt = fmt;
    return s;
}

/* Decides whether a line of `fmt` passes: at most `burst` lines per
 * `window_ms`. Returns how many were suppressed before it, or -1 when this
 * one is suppressed too. */
static int64_t admit(struct obd_log *log, const char *fmt, uint32_t burst,
                     uint64_t window_ms)
{
    uint64_t now = now_ms(log);
    struct obd_log_slot *s = slot_of(log, fmt);
    if (s->shown == 0 || now - s->window_ms >= window_ms) {
        s->window_ms = now;
        s->shown = 0;
    }
    s->last_ms = now;
    if (s->shown >= burst) {
        s->suppressed++;
        return -1;
    }
    s->shown++;
    int64_t n = (int64_t)s->suppressed;
    s->suppressed = 0;
    return n;
}

static void emit(struct obd_log *log, int level, int64_t suppressed,
                 const char *fmt, va_list ap)
{
    FILE *out = log->out ? log->out : stderr;
    if (log->journal == 0)
        log->journal = stderr_is_journal(out) ? 1 : 2;

    /* Arguments carry outside text (job names, messages from peers and
     * clients), so the whole formatted message is escaped: it stays one
     * line, moves no terminal and is valid UTF-8, whatever it holds. */
    char raw[1024], msg[4 * sizeof(raw)];
    vsnprintf(raw, sizeof(raw), fmt, ap);
    obcomm_text_escape(msg, sizeof(msg), raw);
    char more[80] = "";
    if (suppressed > 0)
        snprintf(more, sizeof(more), " (%lld similar messages suppressed)",
                 (long long)suppressed);

    /* One fprintf per line keeps lines whole when several daemons share a
     * terminal or a log file. */
    if (log->journal == 1) {
        fprintf(out, "<%d>rank=%d %s: %s%s\n", level_prio[level], log->rank,
                level_names[level], msg, more);
    } else {
        struct timespec ts;
        struct tm tm;
        char when[32];
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
        fprintf(out, "%s.%03ldZ obcommd rank=%d %s: %s%s\n", when,
                ts.tv_nsec / 1000000, log->rank, level_names[level], msg, more);
    }
    fflush(out);
}

void obd_log_printf(struct obd_log *log, int level, const char *fmt, ...)
{
    if (level > log->level)
        return;
    int64_t suppressed = 0;
    if (level != OBD_LOG_DEBUG) {
        suppressed = admit(log, fmt, OBD_LOG_BURST, OBD_LOG_WINDOW_MS);
        if (suppressed < 0)
            return;
    }
    va_list ap;
    va_start(ap, fmt);
    emit(log, level, suppressed, fmt, ap);
    va_end(ap);
}

void obd_log_limited(struct obd_log *log, int level, uint64_t interval_ms,
                     const char *fmt, ...)
{
    if (level > log->level)
        return;
    int64_t suppressed = admit(log, fmt, 1, interval_ms);
    if (suppressed < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    emit(log, level, suppressed, fmt, ap);
    va_end(ap);
}
