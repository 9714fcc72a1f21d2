#include "trace.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "err.h"

int obd_trace_open(struct obd_daemon *d, char *why, size_t whylen)
{
    struct obd_trace *t = &d->trace;
    memset(t, 0, sizeof(*t));
    t->rank = (int)d->cfg.rank;
    if (d->cfg.trace_file[0] == '\0')
        return 0;
    int fd = open(d->cfg.trace_file,
                  O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0640);
    if (fd < 0 || (t->f = fdopen(fd, "w")) == NULL) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        snprintf(why, whylen, "trace_file %s: %s", d->cfg.trace_file,
                 strerror(err));
        return OBD_E_IO;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    t->wall_minus_mono_us = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000 -
                            (int64_t)(uv_hrtime() / 1000);
    fprintf(t->f,
            "[{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,"
            "\"args\":{\"name\":\"obcommd rank %d\"}},\n"
            "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
            "\"args\":{\"name\":\"worker pool\"}}",
            t->rank, t->rank, t->rank, OBD_TRACE_POOL);
    return 0;
}

void obd_trace_close(struct obd_daemon *d)
{
    struct obd_trace *t = &d->trace;
    if (t->f == NULL)
        return;
    fputs("\n]\n", t->f);
    fclose(t->f);
    t->f = NULL;
}

void obd_trace_span(struct obd_daemon *d, const char *name, const char *cat,
                    int tid, uint64_t begin_ns, uint64_t end_ns,
                    const char *args)
{
    struct obd_trace *t = &d->trace;
    if (t->f == NULL || t->full)
        return;
    if (t->bytes > OBD_TRACE_MAX_BYTES) {
        t->full = 1;
        obd_log_warn(&d->log, "trace_file %s reached %llu bytes; tracing stops",
                     d->cfg.trace_file, (unsigned long long)t->bytes);
        return;
    }
    if (end_ns < begin_ns)
        end_ns = begin_ns;
    int n =
        fprintf(t->f,
                ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,"
                "\"tid\":%d,\"ts\":%lld,\"dur\":%.3f,\"args\":{%s}}",
                name, cat, t->rank, tid,
                (long long)((int64_t)(begin_ns / 1000) + t->wall_minus_mono_us),
                (double)(end_ns - begin_ns) / 1000.0, args ? args : "");
    if (n > 0)
        t->bytes += (uint64_t)n;
}
