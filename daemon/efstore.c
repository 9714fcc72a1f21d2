#include "efstore.h"
#include "err.h"

#include <obcomm.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A job's newest snapshot set, kept in memory without a state_dir. */
struct obd_memset {
    char job[OBD_EF_JOB_MAX];
    uint64_t id;
    struct obd_ef *list;
    uint64_t bytes;
    uint64_t put_ms;   /* when it was saved (uv_now) */
    int ended;         /* its job's run ended here (none is on) */
    uint64_t ended_ms; /* when */
    int held;          /* pool tasks reading list (memset_find) */
    int dropped;       /* out of d->memsets: freed by the last release */
    struct obd_memset *next;
};

static void free_list(struct obd_ef *ef)
{
    while (ef != NULL) {
        struct obd_ef *next = ef->next;
        obd_ef_free(ef);
        ef = next;
    }
}

void obd_efstore_account(struct obd_daemon *d)
{
    uint64_t bytes = 0, retained = 0;
    for (struct obd_ef *ef = d->efs; ef; ef = ef->next)
        bytes += obd_ef_bytes(ef);
    for (struct obd_memset *m = d->memsets; m; m = m->next)
        retained += m->bytes;
    d->metrics.v[OBD_M_EF_STATE_BYTES] = bytes;
    d->metrics.v[OBD_M_EF_RETAINED_BYTES] = retained;
}

static int same(const struct obd_ef *ef, const char *job, uint64_t run)
{
    return ef->run == run && strcmp(ef->job, job) == 0;
}

static struct obd_ef **find(struct obd_daemon *d, const char *job, uint64_t run,
                            uint64_t key)
{
    struct obd_ef **pp = &d->efs;
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->key == key && same(*pp, job, run))
            break;
    return pp;
}

struct obd_ef *obd_efstore_find(struct obd_daemon *d, const char *job,
                                uint64_t run, uint64_t key)
{
    return *find(d, job, run, key);
}

struct obd_efversion obd_efstore_version(struct obd_daemon *d, const char *job,
                                         uint64_t run, uint64_t key)
{
    struct obd_ef *ef = *find(d, job, run, key);
    struct obd_efversion zero = {0, 0, 0};
    return ef != NULL ? ef->version : zero;
}

int obd_efstore_idle(const struct obd_daemon *d, const char *job, uint64_t run)
{
    for (const struct obd_ef *ef = d->efs; ef; ef = ef->next)
        if (ef->users > 0 && same(ef, job, run))
            return 0;
    return 1;
}

/* The bound on the live runs' states together: ef_max_bytes, or a
 * quarter of the machine's memory. */
static uint64_t limit_of(const struct obd_daemon *d)
{
    if (d->cfg.ef_max_bytes > 0)
        return (uint64_t)d->cfg.ef_max_bytes;
    return uv_get_total_memory() / 4;
}

static void expire(struct obd_daemon *d, const struct obd_memset *keep);

int obd_efstore_get(struct obd_daemon *d, const char *job, uint64_t run,
                    uint64_t key, uint64_t count, struct obd_ef **out,
                    char *why, size_t whylen)
{
    struct obd_ef *ef = *find(d, job, run, key);
    if (ef != NULL) {
        if (ef->count != count) {
            snprintf(why, whylen,
                     "key %llu holds error feedback for %llu elements, the "
                     "op has %llu; reset the key first (obcomm_reset_1bit)",
                     (unsigned long long)key, (unsigned long long)ef->count,
                     (unsigned long long)count);
            return OBD_E_STATE;
        }
        *out = ef;
        return 0;
    }
    expire(d, NULL);
    uint64_t need = obd_ef_bytes_for(count, d->cfg.nodes);
    uint64_t used = d->metrics.v[OBD_M_EF_STATE_BYTES];
    uint64_t limit = limit_of(d);
    if (need == 0 || used + need > limit) {
        obd_metric_add(&d->metrics, OBD_M_EF_LIMIT_REFUSALS, 1);
        snprintf(why, whylen,
                 "error feedback for key %llu needs %llu bytes, %llu are in "
                 "use and ef_max_bytes allows %llu on node %lld; reset keys "
                 "no longer used or raise ef_max_bytes",
                 (unsigned long long)key, (unsigned long long)need,
                 (unsigned long long)used, (unsigned long long)limit,
                 (long long)d->cfg.rank);
        return OBD_E_TOOBIG;
    }
    ef = obd_ef_new(job, key, count, d->cfg.nodes);
    if (ef == NULL) {
        snprintf(why, whylen,
                 "no memory for the error feedback of %llu "
                 "elements",
                 (unsigned long long)count);
        return OBD_E_NOMEM;
    }
    ef->run = run;
    ef->next = d->efs;
    d->efs = ef;
    obd_efstore_account(d);
    *out = ef;
    return 0;
}

void obd_efstore_begin(struct obd_daemon *d, struct obd_ef *ef)
{
    if (ef->users == 0 && ef->torn) {
        ef->torn = 0;
        ef->version = (struct obd_efversion){0, 0, 0};
        obd_ef_abort(ef);
        obd_metric_add(&d->metrics, OBD_M_EF_RESETS, 1);
        obd_log_warn(&d->log,
                     "job %s key %llu: error feedback was left half-updated "
                     "by a failed op; it restarts at zero",
                     ef->job, (unsigned long long)ef->key);
    }
    ef->users++;
}

void obd_efstore_end(struct obd_daemon *d, struct obd_ef *ef)
{
    if (--ef->users > 0)
        return;
    if (ef->doomed) {
        obd_ef_free(ef);
        obd_efstore_account(d);
    }
}

void obd_efstore_applied(struct obd_ef *ef, uint64_t seq)
{
    ef->version.applied++;
    ef->version.last_seq = seq;
}

/* Takes ef out of the registry: freed now, or by its last user (the
 * tasks of a failed op may still write it). */
static void unlist(struct obd_ef **pp)
{
    struct obd_ef *ef = *pp;
    *pp = ef->next;
    ef->next = NULL;
    if (ef->users > 0)
        ef->doomed = 1;
    else
        obd_ef_free(ef);
}

/* Forgets every state of (job, run); returns how many. */
static int forget_run(struct obd_daemon *d, const char *job, uint64_t run)
{
    int n = 0;
    for (struct obd_ef **pp = &d->efs; *pp;) {
        if (same(*pp, job, run)) {
            unlist(pp);
            n++;
        } else {
            pp = &(*pp)->next;
        }
    }
    obd_efstore_account(d);
    return n;
}

void obd_efstore_reset(struct obd_daemon *d, const char *job, uint64_t run,
                       uint64_t key)
{
    struct obd_ef **pp = find(d, job, run, key);
    if (*pp != NULL) {
        unlist(pp);
        obd_efstore_account(d);
    }
    obd_log_info(&d->log, "job %s key %llu: error feedback reset", job,
                 (unsigned long long)key);
}

void obd_efstore_reset_run(struct obd_daemon *d, const char *job, uint64_t run,
                           const char *why)
{
    int n = forget_run(d, job, run);
    obd_metric_add(&d->metrics, OBD_M_EF_RESETS, (uint64_t)n);
    obd_log_warn(&d->log,
                 "job %s: the error feedback of %d keys restarts at zero on "
                 "every node: %s",
                 job, n, why);
}

static struct obd_memset **memset_of(struct obd_daemon *d, const char *job);

void obd_efstore_run_end(struct obd_daemon *d, const char *job, uint64_t run)
{
    struct obd_memset *m = *memset_of(d, job);
    if (m != NULL) {
        m->ended = 1;
        m->ended_ms = uv_now(&d->loop);
    }
    expire(d, NULL);
    int n = forget_run(d, job, run);
    if (n > 0)
        obd_log_info(&d->log,
                     "job %s: its run ended; the error feedback of %d keys "
                     "is freed (a new run starts at zero)",
                     job, n);
}

int obd_efstore_collect(struct obd_daemon *d, const char *job, uint64_t run,
                        struct obd_ef ***out, int *n, char *why, size_t whylen)
{
    int k = 0;
    for (struct obd_ef *ef = d->efs; ef; ef = ef->next)
        if (same(ef, job, run)) {
            if (ef->torn) {
                snprintf(why, whylen,
                         "key %llu was left half-updated by a failed op",
                         (unsigned long long)ef->key);
                return OBD_E_STATE;
            }
            k++;
        }
    struct obd_ef **efs = calloc((size_t)k + 1, sizeof(*efs));
    if (efs == NULL) {
        snprintf(why, whylen, "out of memory");
        return OBD_E_NOMEM;
    }
    int i = 0;
    for (struct obd_ef *ef = d->efs; ef; ef = ef->next)
        if (same(ef, job, run)) {
            obd_efstore_begin(d, ef);
            efs[i++] = ef;
        }
    *out = efs;
    *n = k;
    return 0;
}

void obd_efstore_release(struct obd_daemon *d, struct obd_ef **efs, int n)
{
    for (int i = 0; i < n; i++)
        obd_efstore_end(d, efs[i]);
    free(efs);
}

void obd_efstore_install(struct obd_daemon *d, const char *job, uint64_t run,
                         struct obd_ef *list, uint64_t origin, uint64_t seq)
{
    forget_run(d, job, run);
    int n = 0;
    while (list != NULL) {
        struct obd_ef *ef = list;
        list = ef->next;
        ef->run = run;
        ef->version = (struct obd_efversion){origin, 0, seq};
        ef->users = 0;
        ef->doomed = 0;
        ef->torn = 0;
        ef->next = d->efs;
        d->efs = ef;
        n++;
    }
    obd_metric_add(&d->metrics, OBD_M_EF_RESTORED, (uint64_t)n);
    obd_efstore_account(d);
    obd_log_info(&d->log,
                 "job %s: error feedback of %d keys restored from snapshot "
                 "%016" PRIx64,
                 job, n, origin);
}

static struct obd_memset **memset_of(struct obd_daemon *d, const char *job)
{
    struct obd_memset **pp = &d->memsets;
    for (; *pp; pp = &(*pp)->next)
        if (strcmp((*pp)->job, job) == 0)
            break;
    return pp;
}

/* Takes the set at *pp out of d->memsets: freed now, or by the last
 * release of a pool task still reading it. */
static void memset_free(struct obd_daemon *d, struct obd_memset **pp,
                        const char *why)
{
    struct obd_memset *m = *pp;
    *pp = m->next;
    m->next = NULL;
    if (why != NULL)
        obd_log_info(&d->log,
                     "job %s: snapshot %016" PRIx64 " (%llu bytes in memory) "
                     "dropped: %s",
                     m->job, m->id, (unsigned long long)m->bytes, why);
    if (m->held > 0) {
        m->dropped = 1;
        return;
    }
    free_list(m->list);
    free(m);
}

uint64_t obd_efstore_retained_limit(const struct obd_daemon *d)
{
    if (d->cfg.retained_sets_max_bytes > 0)
        return (uint64_t)d->cfg.retained_sets_max_bytes;
    return limit_of(d);
}

/* The in-memory sets whose job's run ended retained_sets_max_age_s ago
 * go; then, while all together pass obd_efstore_retained_limit, the one
 * whose run ended first goes, then the oldest of live runs; `keep` and the
 * sets a pool task reads stay. */
static void expire(struct obd_daemon *d, const struct obd_memset *keep)
{
    uint64_t now = uv_now(&d->loop);
    uint64_t age_ms = (uint64_t)d->cfg.retained_sets_max_age_s * 1000;
    uint64_t total = 0;
    for (struct obd_memset **pp = &d->memsets; *pp;) {
        struct obd_memset *m = *pp;
        if (m != keep && m->held == 0 && m->ended &&
            now - m->ended_ms >= age_ms) {
            memset_free(d, pp, "its job ended retained_sets_max_age_s ago");
            continue;
        }
        total += m->bytes;
        pp = &m->next;
    }
    uint64_t limit = obd_efstore_retained_limit(d);
    while (total > limit) {
        struct obd_memset **victim = NULL;
        for (struct obd_memset **pp = &d->memsets; *pp; pp = &(*pp)->next) {
            const struct obd_memset *m = *pp, *v = victim ? *victim : NULL;
            if (m == keep || m->held > 0)
                continue; /* a pool task reads it */
            /* Ended before live; among ended the earliest end, among live
             * the oldest save. */
            if (v == NULL || (m->ended && !v->ended) ||
                (m->ended && v->ended && m->ended_ms < v->ended_ms) ||
                (!m->ended && !v->ended && m->put_ms < v->put_ms))
                victim = pp;
        }
        if (victim == NULL)
            break;
        total -= (*victim)->bytes;
        memset_free(d, victim,
                    "the sets in memory passed retained_sets_max_bytes");
    }
    obd_efstore_account(d);
}

void obd_efstore_memset_put(struct obd_daemon *d, const char *job, uint64_t id,
                            struct obd_ef *list)
{
    struct obd_memset **pp = memset_of(d, job);
    if (*pp != NULL)
        memset_free(d, pp, NULL); /* the job's previous set */
    struct obd_memset *m = NULL;
    if (strlen(job) < OBD_EF_JOB_MAX)
        m = calloc(1, sizeof(*m));
    if (m == NULL) {
        free_list(list);
        obd_efstore_account(d);
        return;
    }
    strcpy(m->job, job);
    m->list = list;
    m->id = id;
    for (const struct obd_ef *ef = list; ef; ef = ef->next)
        m->bytes += obd_ef_bytes(ef);
    m->put_ms = uv_now(&d->loop);
    m->next = d->memsets;
    d->memsets = m;
    expire(d, m);
}

const struct obd_ef *obd_efstore_memset_find(struct obd_daemon *d,
                                             const char *job, uint64_t id,
                                             struct obd_memset **hold)
{
    expire(d, NULL);
    struct obd_memset *m = *memset_of(d, job);
    if (m == NULL || m->id != id)
        return NULL;
    m->ended = 0; /* a live run uses it */
    m->held++;
    *hold = m;
    return m->list;
}

void obd_efstore_memset_release(struct obd_daemon *d, struct obd_memset *hold)
{
    (void)d;
    if (--hold->held > 0 || !hold->dropped)
        return;
    free_list(hold->list);
    free(hold);
}

void obd_efstore_memset_drop(struct obd_daemon *d, const char *job, uint64_t id)
{
    struct obd_memset **pp = memset_of(d, job);
    struct obd_memset *m = *pp;
    if (m == NULL || m->id != id)
        return;
    memset_free(d, pp, "its snapshot op failed on another node");
    obd_efstore_account(d);
}

int obd_efstore_keys(const struct obd_daemon *d, const char *job, uint64_t run,
                     const struct obd_ef **out, int max)
{
    int n = 0;
    for (const struct obd_ef *ef = d->efs; ef && n < max; ef = ef->next)
        if (same(ef, job, run))
            out[n++] = ef;
    return n;
}

void obd_efstore_fini(struct obd_daemon *d)
{
    while (d->memsets != NULL) {
        struct obd_memset *m = d->memsets;
        d->memsets = m->next;
        free_list(m->list);
        free(m);
    }
    while (d->efs != NULL) {
        struct obd_ef *ef = d->efs;
        d->efs = ef->next;
        obd_ef_free(ef);
    }
}
