#include "runq.h"

#include <stddef.h>

static void on_idle(uv_idle_t *h);

void obd_runq_init(struct obd_runq *s, uv_loop_t *loop)
{
    s->head = s->tail = NULL;
    s->gen = 0;
    s->started = 0;
    s->closed = 0;
    uv_idle_init(loop, &s->idle);
    s->idle.data = s;
}

void obd_runq_post(struct obd_runq *s, struct obd_ready *r)
{
    if (r->queued || s->closed)
        return;
    r->queued = 1;
    r->gen = s->gen;
    r->next = NULL;
    if (s->tail)
        s->tail->next = r;
    else
        s->head = r;
    s->tail = r;
    if (!s->started) {
        s->started = 1;
        uv_idle_start(&s->idle, on_idle);
    }
}

void obd_runq_cancel(struct obd_runq *s, struct obd_ready *r)
{
    if (!r->queued)
        return;
    struct obd_ready *prev = NULL;
    for (struct obd_ready *it = s->head; it; prev = it, it = it->next)
        if (it == r) {
            if (prev)
                prev->next = r->next;
            else
                s->head = r->next;
            if (s->tail == r)
                s->tail = prev;
            break;
        }
    r->queued = 0;
    r->next = NULL;
}

/* Runs the items posted before this turn; what they post waits for the
 * next turn (the idle handle keeps the loop from blocking meanwhile). The
 * list stays whole while items run, so a run may cancel any other item. */
static void run_batch(struct obd_runq *s)
{
    unsigned gen = s->gen++;
    while (s->head != NULL && (int)(s->head->gen - gen) <= 0) {
        struct obd_ready *r = s->head;
        s->head = r->next;
        if (s->head == NULL)
            s->tail = NULL;
        r->queued = 0;
        r->next = NULL;
        r->run(r);
    }
}

static void on_idle(uv_idle_t *h)
{
    struct obd_runq *s = h->data;
    run_batch(s);
    if (s->head == NULL && s->started) {
        s->started = 0;
        uv_idle_stop(&s->idle);
    }
}

void obd_runq_close(struct obd_runq *s)
{
    if (s->closed)
        return;
    while (s->head != NULL)
        run_batch(s);
    s->closed = 1;
    s->started = 0;
    uv_close((uv_handle_t *)&s->idle, NULL);
}
