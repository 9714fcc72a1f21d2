#include "enforce.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void obd_enforce_fail(const char *file, int line, const char *cond,
                      const char *fmt, ...)
{
    /* One line, built before it is written, so that a log reader never
     * sees half of it; stderr is where the journal or the test harness
     * collects the daemon's messages. */
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    fprintf(stderr, "obcommd: %s:%d: invariant broken: %s: %s\n", file, line,
            cond, what);
    fflush(stderr);
    abort();
}
