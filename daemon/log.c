#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int obd_log_level_parse(const char *name)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

void obd_log_printf(const struct obd_log *log, int level, const char *fmt, ...)
{
    if (level > log->level)
        return;

    struct timespec ts;
    struct tm tm;
    char when[32];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(when, sizeof(when), "%H:%M:%S", &tm);

    /* One fprintf per line keeps lines whole when several daemons share a
     * terminal or a log file. */
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s.%03ld obcommd[%d] %s: %s\n", when, ts.tv_nsec / 1000000,
            log->rank, level_names[level], line);
}

int obd_log_limit(struct obd_log_limit *l, uint64_t now_ms,
                  uint64_t interval_ms, uint64_t *suppressed)
{
    if (l->started && now_ms - l->last_ms < interval_ms) {
        l->suppressed++;
        return 0;
    }
    l->started = 1;
    l->last_ms = now_ms;
    *suppressed = l->suppressed;
    l->suppressed = 0;
    return 1;
}
