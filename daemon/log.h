/* Leveled logging to stderr (journald picks it up under systemd). */
#ifndef OBD_LOG_H
#define OBD_LOG_H

#include <stdint.h>

enum { OBD_LOG_ERROR = 0, OBD_LOG_WARN, OBD_LOG_INFO, OBD_LOG_DEBUG };

struct obd_log {
    int level; /* messages above this level are dropped */
    int rank;  /* printed in every line; -1 before it is known */
};

/* Returns the level for "error", "warn", "info" or "debug"; -1 otherwise. */
int obd_log_level_parse(const char *name);

void obd_log_printf(const struct obd_log *log, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A repeated line goes out at most once per interval; the ones held back
 * are counted and the next line that goes out says how many. */
struct obd_log_limit {
    uint64_t last_ms;
    uint64_t suppressed;
    int started;
};

/* 1 when the line may go out at now_ms; *suppressed is then how many were
 * held back since the previous one. 0: count it and stay quiet. */
int obd_log_limit(struct obd_log_limit *l, uint64_t now_ms,
                  uint64_t interval_ms, uint64_t *suppressed);

#define obd_log_error(l, ...) obd_log_printf((l), OBD_LOG_ERROR, __VA_ARGS__)
#define obd_log_warn(l, ...)  obd_log_printf((l), OBD_LOG_WARN, __VA_ARGS__)
#define obd_log_info(l, ...)  obd_log_printf((l), OBD_LOG_INFO, __VA_ARGS__)
#define obd_log_debug(l, ...) obd_log_printf((l), OBD_LOG_DEBUG, __VA_ARGS__)

#endif
