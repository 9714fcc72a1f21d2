/* Leveled logging to stderr, for journald and for people.
 *
 * Under systemd (JOURNAL_STREAM names stderr's device and inode) every line
 * starts with a syslog priority "<N>" so that journald files errors as
 * errors; journald adds the time. Elsewhere every line starts with an
 * ISO-8601 UTC time with the date. Either way the node is "rank=N".
 *
 * Repeated messages are rate-limited here and nowhere else: messages are
 * "similar" when they come from the same format string; past a burst per
 * window the rest are counted, and the next line that passes says how many
 * were suppressed. Logging happens on the loop thread only.
 *
 * Every message is escaped as a whole (obcomm_text_escape in proto/text.h):
 * a newline in a job name becomes "\n", ESC "\x1b", a byte of invalid
 * UTF-8 "\xff", a backslash "\\", so one event is always one line and
 * nothing a client or a peer sends can forge a line or drive a terminal. */
#ifndef OBD_LOG_H
#define OBD_LOG_H

#include <stdint.h>
#include <stdio.h>

enum { OBD_LOG_ERROR = 0, OBD_LOG_WARN, OBD_LOG_INFO, OBD_LOG_DEBUG };

/* The default limit: this many similar messages per window. */
#define OBD_LOG_BURST     10
#define OBD_LOG_WINDOW_MS 10000
/* Formats tracked at once; the one seen longest ago makes room. */
#define OBD_LOG_SLOTS 32

struct obd_log_slot {
    const char *fmt;     /* NULL: free */
    uint64_t window_ms;  /* start of the current window */
    uint64_t last_ms;    /* last message of this format */
    uint32_t shown;      /* lines printed in the current window */
    uint64_t suppressed; /* not printed since the last printed line */
};

/* All fields may start zeroed (journald is looked at on the first line). */
struct obd_log {
    int level;   /* messages above this level are dropped */
    int rank;    /* printed in every line; -1 before it is known */
    int journal; /* 0: not looked at yet, 1: stderr is the journal, 2: not */
    FILE *out;   /* NULL: stderr */
    uint64_t now_ms; /* tests only: nonzero replaces the monotonic clock */
    struct obd_log_slot slots[OBD_LOG_SLOTS];
};

/* Returns the level for "error", "warn", "info" or "debug"; -1 otherwise. */
int obd_log_level_parse(const char *name);

/* Logs with the default limit (OBD_LOG_BURST per OBD_LOG_WINDOW_MS); debug
 * lines are never limited, since an operator asked for them. */
void obd_log_printf(struct obd_log *log, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Logs at most one line of this format per `interval_ms`, for messages that
 * repeat for as long as a condition lasts (a peer refused on every dial). */
void obd_log_limited(struct obd_log *log, int level, uint64_t interval_ms,
                     const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define obd_log_error(l, ...) obd_log_printf((l), OBD_LOG_ERROR, __VA_ARGS__)
#define obd_log_warn(l, ...)  obd_log_printf((l), OBD_LOG_WARN, __VA_ARGS__)
#define obd_log_info(l, ...)  obd_log_printf((l), OBD_LOG_INFO, __VA_ARGS__)
#define obd_log_debug(l, ...) obd_log_printf((l), OBD_LOG_DEBUG, __VA_ARGS__)

#endif
