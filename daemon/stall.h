/* The stall inspector (after Horovod's): an op that has waited longer than
 * stall_warn_ms is logged once, with its fingerprint and who has not
 * arrived, well before its deadline fails it. */
#ifndef OBD_STALL_H
#define OBD_STALL_H

#include <stdint.h>

struct obd_daemon;

/* Starts the periodic scan when stall_warn_ms > 0. Returns 0 or a negative
 * code (out of memory). */
int obd_stall_start(struct obd_daemon *d);

/* Stops the scan; the state is freed in the timer's close callback.
 * Idempotent. */
void obd_stall_close(struct obd_daemon *d);

/* One scan at now_ms, in milliseconds of uv_hrtime() (the clock of an op's
 * created_ns); the timer calls it. Returns how many ops it logged. */
int obd_stall_scan(struct obd_daemon *d, uint64_t now_ms);

#endif
