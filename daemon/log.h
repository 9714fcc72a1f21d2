/* Leveled logging to stderr (journald picks it up under systemd). */
#ifndef OBD_LOG_H
#define OBD_LOG_H

enum { OBD_LOG_ERROR = 0, OBD_LOG_WARN, OBD_LOG_INFO, OBD_LOG_DEBUG };

struct obd_log {
    int level; /* messages above this level are dropped */
    int rank;  /* printed in every line; -1 before it is known */
};

/* Returns the level for "error", "warn", "info" or "debug"; -1 otherwise. */
int obd_log_level_parse(const char *name);

void obd_log_printf(const struct obd_log *log, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define obd_log_error(l, ...) obd_log_printf((l), OBD_LOG_ERROR, __VA_ARGS__)
#define obd_log_warn(l, ...)  obd_log_printf((l), OBD_LOG_WARN, __VA_ARGS__)
#define obd_log_info(l, ...)  obd_log_printf((l), OBD_LOG_INFO, __VA_ARGS__)
#define obd_log_debug(l, ...) obd_log_printf((l), OBD_LOG_DEBUG, __VA_ARGS__)

#endif
