#include "err.h"
#include "stall.h"

#include <obcomm.h>

#include <stdio.h>
#include <stdlib.h>

#include "daemon.h"
#include "coll.h"
#include "job.h"
#include "metrics.h"
#include "peers.h"
#include "reduce.h"

struct obd_stall {
    uv_timer_t timer;
    struct obd_daemon *d;
};

int obd_stall_scan(struct obd_daemon *d, uint64_t now_ms)
{
    uint64_t limit = (uint64_t)d->cfg.stall_warn_ms;
    int logged = 0;
    if (limit == 0)
        return 0;
    for (struct obd_job *j = obd_job_next(d, NULL); j; j = obd_job_next(d, j)) {
        for (struct obd_op *o = obd_job_next_open(j, NULL); o;
             o = obd_job_next_open(j, o)) {
            uint64_t age = now_ms - o->created_ns / 1000000;
            if (o->stall_warned || age < limit)
                continue;
            /* Before every node agreed, desc is not set yet: name what a
             * local trainer asked for. */
            const struct obd_opdesc *desc = &o->desc;
            if (o->state == OBD_OP_COLLECT)
                for (int i = 0; i < j->local_size; i++)
                    if (o->submitted[i]) {
                        desc = &o->sub[i];
                        break;
                    }
            /* The op's fingerprint is set once the local trainers
             * agreed; before, it is the one the first trainer's op has. */
            uint64_t fp = o->fingerprint != 0 ? o->fingerprint
                                              : obd_coll_fingerprint(desc);
            char name[32], who[320], links[400] = "";
            obd_job_op_waiting(o, who, sizeof(who));
            /* Every op needs every node: a link that is not up is why
             * most stalls last, so the line names it. */
            size_t off = 0;
            for (int n = 0; n < d->cfg.nodes && off < sizeof(links); n++) {
                char why[200];
                if (obd_peers_down(d, n, why, sizeof(why)))
                    off += (size_t)snprintf(
                        links + off, sizeof(links) - off,
                        "; the link to node %d is down (%s)", n, why);
            }
            obd_log_warn(&d->log,
                         "op %llu of job %s (%s, count %llu, key %llu, "
                         "fingerprint %016llx) has waited %llu ms, %s: %s%s",
                         (unsigned long long)o->seq, j->name,
                         obd_metrics_op_name(desc->kind, name, sizeof(name)),
                         (unsigned long long)desc->count,
                         (unsigned long long)desc->key, (unsigned long long)fp,
                         (unsigned long long)age,
                         o->state == OBD_OP_RUN ? "running" : "collecting",
                         who[0] ? who : "nobody missing", links);
            o->stall_warned = 1;
            logged++;
        }
    }
    return logged;
}

static void on_tick(uv_timer_t *t)
{
    struct obd_stall *s = container_of(t, struct obd_stall, timer);
    /* The ops' created_ns is uv_hrtime(); compare on the same clock. */
    obd_stall_scan(s->d, uv_hrtime() / 1000000);
}

int obd_stall_start(struct obd_daemon *d)
{
    uint64_t limit = (uint64_t)d->cfg.stall_warn_ms;
    if (limit == 0)
        return 0;
    struct obd_stall *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return OBD_E_NOMEM;
    s->d = d;
    /* A quarter of the limit: an op is logged at most 25% late. */
    uint64_t period = limit / 4;
    period = period < 50 ? 50 : period > 5000 ? 5000 : period;
    uv_timer_init(&d->loop, &s->timer);
    uv_timer_start(&s->timer, on_tick, period, period);
    d->stall = s;
    return 0;
}

static void on_closed(uv_handle_t *h)
{
    free(container_of((uv_timer_t *)h, struct obd_stall, timer));
}

void obd_stall_close(struct obd_daemon *d)
{
    if (d->stall == NULL)
        return;
    uv_close((uv_handle_t *)&d->stall->timer, on_closed);
    d->stall = NULL;
}
