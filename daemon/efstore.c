#include "efstore.h"

#include <obcomm.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static struct obd_ef_world world_of(const struct obd_daemon *d)
{
    struct obd_ef_world w = {.nodes = (uint32_t)d->cfg.nodes,
                             .rank = (uint32_t)d->cfg.rank,
                             .fingerprint = d->cfg.fingerprint};
    return w;
}

void obd_efstore_account(struct obd_daemon *d)
{
    uint64_t bytes = 0;
    for (struct obd_ef *ef = d->efs; ef; ef = ef->next)
        bytes += obd_ef_bytes(ef);
    d->metrics.v[OBD_M_EF_STATE_BYTES] = bytes;
}

static struct obd_ef **find(struct obd_daemon *d, const char *job, uint64_t key)
{
    struct obd_ef **pp = &d->efs;
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->key == key && strcmp((*pp)->job, job) == 0)
            break;
    return pp;
}

struct obd_ef *obd_efstore_find(struct obd_daemon *d, const char *job,
                                uint64_t key)
{
    return *find(d, job, key);
}

int obd_efstore_idle(const struct obd_daemon *d, const char *job)
{
    for (const struct obd_ef *ef = d->efs; ef; ef = ef->next)
        if (ef->users > 0 && strcmp(ef->job, job) == 0)
            return 0;
    return 1;
}

/* The bound on all states together: ef_max_bytes, or a quarter of the
 * machine's memory. */
static uint64_t limit_of(const struct obd_daemon *d)
{
    if (d->cfg.ef_max_bytes > 0)
        return (uint64_t)d->cfg.ef_max_bytes;
    return uv_get_total_memory() / 4;
}

static void add_state(struct obd_daemon *d, struct obd_ef *ef)
{
    ef->next = d->efs;
    d->efs = ef;
    ef->idle_since_ms = obd_daemon_now(d);
    obd_efstore_account(d);
}

static int load_one(struct obd_daemon *d, const char *path,
                    struct obd_ef **out);

int obd_efstore_get(struct obd_daemon *d, const char *job, uint64_t key,
                    uint64_t count, struct obd_ef **out, char *why,
                    size_t whylen)
{
    struct obd_ef *ef = *find(d, job, key);
    if (ef == NULL && d->cfg.state_dir[0] != '\0') {
        /* Evicted after its job went idle: its snapshot brings it back. */
        char path[4200];
        obd_ef_path(d->cfg.state_dir, job, key, path, sizeof(path));
        if (access(path, F_OK) == 0 && load_one(d, path, &ef) == 0)
            add_state(d, ef);
    }
    if (ef != NULL)
        ef->active = 1; /* an op of the job asks: it has trainers */
    if (ef != NULL) {
        if (ef->count != count) {
            snprintf(why, whylen,
                     "key %llu holds error feedback for %llu elements, the "
                     "op has %llu; reset the key first (obcomm_reset_1bit)",
                     (unsigned long long)key, (unsigned long long)ef->count,
                     (unsigned long long)count);
            return OBCOMM_E_STATE;
        }
        *out = ef;
        return 0;
    }
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
        return OBCOMM_E_NOMEM;
    }
    ef = obd_ef_new(job, key, count, d->cfg.nodes);
    if (ef == NULL) {
        snprintf(why, whylen,
                 "no memory for the error feedback of %llu "
                 "elements",
                 (unsigned long long)count);
        return OBCOMM_E_NOMEM;
    }
    add_state(d, ef);
    ef->active = 1;
    *out = ef;
    return 0;
}

void obd_efstore_job_active(struct obd_daemon *d, const char *job, int active)
{
    for (struct obd_ef *ef = d->efs; ef; ef = ef->next)
        if (strcmp(ef->job, job) == 0) {
            ef->active = active;
            ef->idle_since_ms = obd_daemon_now(d);
        }
}

void obd_efstore_begin(struct obd_daemon *d, struct obd_ef *ef)
{
    if (ef->users == 0 && ef->torn) {
        ef->torn = 0;
        if (obd_ef_abort(ef) > 0) {
            obd_metric_add(&d->metrics, OBD_M_EF_RESETS, 1);
            obd_log_warn(&d->log,
                         "job %s key %llu: error feedback was left "
                         "half-updated by a failed op; it restarts at zero",
                         ef->job, (unsigned long long)ef->key);
        }
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
        return;
    }
    ef->idle_since_ms = obd_daemon_now(d);
    obd_efstore_account(d);
}

void obd_efstore_reset(struct obd_daemon *d, const char *job, uint64_t key)
{
    struct obd_ef **pp = find(d, job, key);
    if (*pp != NULL) {
        struct obd_ef *ef = *pp;
        *pp = ef->next;
        /* Tasks of a failed op may still write it: freed when they end. */
        if (ef->users > 0)
            ef->doomed = 1;
        else
            obd_ef_free(ef);
        obd_efstore_account(d);
    }
    if (d->cfg.state_dir[0] != '\0') {
        char path[4200];
        obd_ef_path(d->cfg.state_dir, job, key, path, sizeof(path));
        unlink(path);
    }
    obd_log_info(&d->log, "job %s key %llu: error feedback reset", job,
                 (unsigned long long)key);
}

int obd_efstore_save(struct obd_daemon *d, const char *job, char *why,
                     size_t whylen)
{
    if (d->cfg.state_dir[0] == '\0') {
        snprintf(why, whylen, "no state_dir is configured on node %lld",
                 (long long)d->cfg.rank);
        return OBCOMM_E_INVAL;
    }
    struct obd_ef_world w = world_of(d);
    for (struct obd_ef *ef = d->efs; ef; ef = ef->next) {
        if (job != NULL && strcmp(ef->job, job) != 0)
            continue;
        char path[4200];
        obd_ef_path(d->cfg.state_dir, ef->job, ef->key, path, sizeof(path));
        if (ef->torn) {
            /* Neither the old step nor the new one: never written, and an
             * older file of the key goes too, so that a restart cannot load
             * a step the other nodes have left behind. */
            unlink(path);
            obd_log_warn(&d->log,
                         "job %s key %llu: error feedback half-updated by a "
                         "failed op is not saved; it restarts at zero",
                         ef->job, (unsigned long long)ef->key);
            continue;
        }
        if (obd_ef_write(path, ef, &w, why, whylen) != 0)
            return OBCOMM_E_IO;
        obd_metric_add(&d->metrics, OBD_M_EF_SAVED, 1);
    }
    return 0;
}

/* Moves a snapshot that must not be loaded out of the way, keeping it for
 * a person to look at. */
static void set_aside(struct obd_daemon *d, const char *path,
                      const char *suffix)
{
    char to[4300];
    snprintf(to, sizeof(to), "%s.%s", path, suffix);
    if (rename(path, to) != 0)
        obd_log_warn(&d->log, "cannot rename %s: %s", path, strerror(errno));
}

/* Reads one snapshot; an intact one of this world is returned (0),
 * anything else is counted, logged and set aside (-1). */
static int load_one(struct obd_daemon *d, const char *path, struct obd_ef **out)
{
    struct obd_ef_world w = world_of(d);
    char why[512];
    struct obd_ef *ef = NULL;
    int rc = obd_ef_read(path, &w, (uint64_t)d->cfg.max_buffer_bytes * 2, &ef,
                         why, sizeof(why));
    if (rc == OBD_EF_OK) {
        obd_metric_add(&d->metrics, OBD_M_EF_RESTORED, 1);
        obd_log_info(&d->log,
                     "restored error feedback of job %s key %llu (%llu "
                     "elements)",
                     ef->job, (unsigned long long)ef->key,
                     (unsigned long long)ef->count);
        *out = ef;
        return 0;
    }
    if (rc == OBD_EF_OTHER_WORLD) {
        obd_metric_add(&d->metrics, OBD_M_EF_RESETS, 1);
        obd_log_warn(&d->log,
                     "snapshot of another world, not loaded; its key "
                     "starts at zero: %s",
                     why);
        set_aside(d, path, "other-world");
    } else {
        obd_metric_add(&d->metrics, OBD_M_EF_REJECTED, 1);
        obd_log_error(&d->log, "rejected snapshot: %s", why);
        if (rc == OBD_EF_CORRUPT)
            set_aside(d, path, "corrupt");
    }
    return -1;
}

void obd_efstore_restore(struct obd_daemon *d)
{
    if (d->cfg.state_dir[0] == '\0')
        return;
    if (mkdir(d->cfg.state_dir, 0700) != 0 && errno != EEXIST)
        obd_log_warn(&d->log, "state_dir %s: %s", d->cfg.state_dir,
                     strerror(errno));
    DIR *dir = opendir(d->cfg.state_dir);
    if (dir == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "ef-", 3) != 0 || len < 8 ||
            strcmp(e->d_name + len - 4, ".lz4") != 0)
            continue;
        char path[4200];
        snprintf(path, sizeof(path), "%s/%s", d->cfg.state_dir, e->d_name);
        struct obd_ef *ef = NULL;
        if (load_one(d, path, &ef) != 0)
            continue;
        if (*find(d, ef->job, ef->key) == NULL)
            add_state(d, ef);
        else
            obd_ef_free(ef);
    }
    closedir(dir);
    obd_efstore_account(d);
}

/* Frees the states of jobs that have had no trainer here for ef_idle_ms,
 * after writing their snapshot when there is a state_dir (a state that
 * cannot be written stays). A job's state comes back from its snapshot at
 * its next op. */
static void on_evict(uv_timer_t *t)
{
    struct obd_daemon *d = container_of(t, struct obd_daemon, evict);
    uint64_t now = obd_daemon_now(d);
    struct obd_ef_world w = world_of(d);
    for (struct obd_ef **pp = &d->efs; *pp;) {
        struct obd_ef *ef = *pp;
        if (ef->users > 0 || ef->active ||
            now - ef->idle_since_ms < (uint64_t)d->cfg.ef_idle_ms) {
            pp = &ef->next;
            continue;
        }
        if (d->cfg.state_dir[0] != '\0') {
            char path[4200], why[512];
            obd_ef_path(d->cfg.state_dir, ef->job, ef->key, path, sizeof(path));
            if (obd_ef_write(path, ef, &w, why, sizeof(why)) != 0) {
                obd_log_warn(&d->log,
                             "job %s key %llu idle, but its snapshot failed "
                             "(%s): kept in memory",
                             ef->job, (unsigned long long)ef->key, why);
                ef->idle_since_ms = now;
                pp = &ef->next;
                continue;
            }
            obd_metric_add(&d->metrics, OBD_M_EF_SAVED, 1);
        }
        obd_log_info(&d->log,
                     "job %s key %llu: idle for %lld ms, error feedback %s "
                     "and freed",
                     ef->job, (unsigned long long)ef->key,
                     (long long)d->cfg.ef_idle_ms,
                     d->cfg.state_dir[0] ? "snapshotted" : "not kept");
        *pp = ef->next;
        obd_ef_free(ef);
        obd_metric_add(&d->metrics, OBD_M_EF_EVICTIONS, 1);
    }
    obd_efstore_account(d);
}

void obd_efstore_init(struct obd_daemon *d)
{
    uv_timer_init(&d->loop, &d->evict);
    if (d->cfg.ef_idle_ms > 0) {
        uint64_t every = (uint64_t)d->cfg.ef_idle_ms / 4;
        every = every < 50 ? 50 : every > 10000 ? 10000 : every;
        uv_timer_start(&d->evict, on_evict, every, every);
    }
}

void obd_efstore_close(struct obd_daemon *d)
{
    if (!uv_is_closing((uv_handle_t *)&d->evict))
        uv_close((uv_handle_t *)&d->evict, NULL);
}

void obd_efstore_fini(struct obd_daemon *d)
{
    while (d->efs != NULL) {
        struct obd_ef *ef = d->efs;
        d->efs = ef->next;
        obd_ef_free(ef);
    }
}
