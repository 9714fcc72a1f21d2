/* The timeline (option trace_file): every op's phases on this node as
 * Chrome trace events ("X" complete events, microseconds of wall-clock
 * time), viewable in Perfetto (ui.perfetto.dev) or chrome://tracing, as
 * Horovod's timeline is. pid is the node's rank, so the files of all nodes
 * can be concatenated into one view; tid separates the loop's op phases
 * (one track per job) from the worker pool's codec tasks.
 *
 * The file is a JSON array written as events happen; a clean shutdown
 * closes it, and a crash leaves it without the closing bracket, which both
 * viewers accept. It stops growing at OBD_TRACE_MAX_BYTES (logged once).
 * Loop thread only. */
#ifndef OBD_TRACE_H
#define OBD_TRACE_H

#include <stdint.h>
#include <stdio.h>

#define OBD_TRACE_MAX_BYTES (256ull << 20)

/* Tracks (tid) of a node's timeline. */
enum { OBD_TRACE_POOL = 1000000 }; /* codec and reduction tasks */

struct obd_trace {
    FILE *f;
    int rank;
    uint64_t bytes;
    int64_t wall_minus_mono_us; /* wall-clock us = uv_hrtime() / 1000 + it */
    int full;
};

struct obd_daemon;

/* Opens cfg.trace_file when set (0 otherwise); OBD_E_IO with why (the
 * path and the system's reason) when it cannot be created. */
int obd_trace_open(struct obd_daemon *d, char *why, size_t whylen);
void obd_trace_close(struct obd_daemon *d);

/* One span [begin_ns, end_ns] (uv_hrtime() clock) named `name` in category
 * `cat` on track `tid`; args is NULL or the inside of a JSON object
 * ("\"seq\":3"). Does nothing without a trace file. */
void obd_trace_span(struct obd_daemon *d, const char *name, const char *cat,
                    int tid, uint64_t begin_ns, uint64_t end_ns,
                    const char *args);

#endif
