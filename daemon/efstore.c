#include "efstore.h"

#include <obcomm.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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

/* ---- snapshot sets on disk ---- */

struct obd_efjob {
    char job[OBD_EF_JOB_MAX];
    uint64_t held[OBD_SNAP_HELD]; /* ascending; the newest ones */
    int nheld;
    int resolved;     /* the set to restore is chosen */
    uint64_t restore; /* 0: none */
    int ran;          /* a 1-bit op of the job started in this run */
    uint32_t epoch;   /* highest epoch any node announced */
    uint64_t boots;   /* hash of every node's boot id at the last resolve */
    uint64_t last_seq;
    struct obd_efjob *next;
};

static struct obd_efjob *efjob(struct obd_daemon *d, const char *job,
                               int create)
{
    for (struct obd_efjob *j = d->efjobs; j; j = j->next)
        if (strcmp(j->job, job) == 0)
            return j;
    if (!create || strlen(job) >= OBD_EF_JOB_MAX)
        return NULL;
    struct obd_efjob *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return NULL;
    strcpy(j->job, job);
    j->next = d->efjobs;
    d->efjobs = j;
    return j;
}

static void held_add(struct obd_efjob *j, uint64_t id)
{
    for (int i = 0; i < j->nheld; i++)
        if (j->held[i] == id)
            return;
    if (j->nheld == OBD_SNAP_HELD) {
        if (id < j->held[0])
            return; /* only the newest are announced */
        memmove(j->held, j->held + 1, sizeof(j->held[0]) * (OBD_SNAP_HELD - 1));
        j->nheld--;
    }
    int at = j->nheld;
    while (at > 0 && j->held[at - 1] > id) {
        j->held[at] = j->held[at - 1];
        at--;
    }
    j->held[at] = id;
    j->nheld++;
}

static void held_remove(struct obd_efjob *j, uint64_t id)
{
    for (int i = 0; i < j->nheld; i++)
        if (j->held[i] == id) {
            memmove(j->held + i, j->held + i + 1,
                    sizeof(j->held[0]) * (size_t)(j->nheld - i - 1));
            j->nheld--;
            return;
        }
}

/* state_dir/set-<job in hex>-<id>[.tmp]: the name is safe whatever the
 * job's name holds, and gives the job back. */
static void set_path(const struct obd_daemon *d, const char *job, uint64_t id,
                     int tmp, char *buf, size_t len)
{
    char hex[2 * OBD_EF_JOB_MAX + 1];
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)job;
         *p && n + 2 < sizeof(hex); p++, n += 2)
        snprintf(hex + n, 3, "%02x", *p);
    hex[n] = '\0';
    snprintf(buf, len, "%s/set-%s-%016" PRIx64 "%s", d->cfg.state_dir, hex, id,
             tmp ? ".tmp" : "");
}

/* Parses "set-<hex>-<id>[.tmp]"; 0 on success. */
static int parse_set(const char *name, char *job, uint64_t *id, int *tmp)
{
    size_t len = strlen(name);
    if (strncmp(name, "set-", 4) != 0)
        return -1;
    *tmp = len > 4 && strcmp(name + len - 4, ".tmp") == 0;
    if (*tmp)
        len -= 4;
    if (len < 4 + 2 + 1 + 16 || name[len - 17] != '-')
        return -1;
    size_t hexlen = len - 17 - 4;
    if (hexlen % 2 != 0 || hexlen / 2 >= OBD_EF_JOB_MAX || hexlen == 0)
        return -1;
    for (size_t i = 0; i < hexlen / 2; i++) {
        unsigned v;
        if (sscanf(name + 4 + 2 * i, "%2x", &v) != 1 || v == 0)
            return -1;
        job[i] = (char)v;
    }
    job[hexlen / 2] = '\0';
    char idtext[17];
    memcpy(idtext, name + len - 16, 16);
    idtext[16] = '\0';
    char *end;
    *id = strtoull(idtext, &end, 16);
    return *end == '\0' ? 0 : -1;
}

static void spill_dir(const struct obd_daemon *d, char *buf, size_t len)
{
    snprintf(buf, len, "%s/spill", d->cfg.state_dir);
}

/* Removes a directory of plain files (a set, or the spill's contents). */
static void remove_files(const char *dir, int and_dir)
{
    DIR *dh = opendir(dir);
    if (dh != NULL) {
        struct dirent *e;
        while ((e = readdir(dh)) != NULL)
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
                (void)unlinkat(dirfd(dh), e->d_name, 0);
        closedir(dh);
    }
    if (and_dir)
        (void)rmdir(dir);
}

static void fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

static void delete_set(struct obd_daemon *d, struct obd_efjob *j, uint64_t id)
{
    char path[4400];
    set_path(d, j->job, id, 0, path, sizeof(path));
    remove_files(path, 1);
    held_remove(j, id);
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
        /* Evicted after its job went idle: the spill brings it back; else
         * the set every node holds, on the key's first use. */
        char dir[4400], path[4600];
        spill_dir(d, dir, sizeof(dir));
        obd_ef_path(dir, job, key, path, sizeof(path));
        struct obd_efjob *j = efjob(d, job, 0);
        if (access(path, F_OK) != 0 && j != NULL && j->restore != 0) {
            set_path(d, job, j->restore, 0, dir, sizeof(dir));
            obd_ef_path(dir, job, key, path, sizeof(path));
        }
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
        /* Every node runs the reset: the key leaves the restored set on
         * all of them. */
        char dir[4400], path[4600];
        spill_dir(d, dir, sizeof(dir));
        obd_ef_path(dir, job, key, path, sizeof(path));
        unlink(path);
        struct obd_efjob *j = efjob(d, job, 0);
        if (j != NULL && j->restore != 0) {
            set_path(d, job, j->restore, 0, dir, sizeof(dir));
            obd_ef_path(dir, job, key, path, sizeof(path));
            unlink(path);
        }
    }
    obd_log_info(&d->log, "job %s key %llu: error feedback reset", job,
                 (unsigned long long)key);
}

int obd_efstore_held(struct obd_daemon *d, const char *job, uint64_t *ids,
                     int max)
{
    struct obd_efjob *j = efjob(d, job, 0);
    int n = 0;
    if (j == NULL)
        return 0;
    for (int i = j->nheld > max ? j->nheld - max : 0; i < j->nheld; i++)
        ids[n++] = j->held[i];
    return n;
}

static int listed(const uint64_t *ids, int n, uint64_t id)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == id)
            return 1;
    return 0;
}

/* Forgets every state of `job` in memory and in the spill: the job goes
 * back to its restored set. */
static void forget_job(struct obd_daemon *d, const char *job)
{
    for (struct obd_ef **pp = &d->efs; *pp;) {
        struct obd_ef *ef = *pp;
        if (strcmp(ef->job, job) != 0) {
            pp = &ef->next;
            continue;
        }
        *pp = ef->next;
        if (ef->users > 0)
            ef->doomed = 1; /* a failed op's tasks still write it */
        else
            obd_ef_free(ef);
    }
    obd_efstore_account(d);
    if (d->cfg.state_dir[0] == '\0')
        return;
    char dir[4400], path[4600];
    spill_dir(d, dir, sizeof(dir));
    obd_ef_path("", job, 0, path, sizeof(path));
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "%.20s", path + 1); /* "ef-<hash>-" */
    DIR *dh = opendir(dir);
    if (dh == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(dh)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            (void)unlinkat(dirfd(dh), e->d_name, 0);
    closedir(dh);
}

uint64_t obd_efstore_resolve(struct obd_daemon *d, const char *job,
                             uint64_t seq, const struct obd_efview *v,
                             int nodes)
{
    uint32_t top = 0;
    uint64_t boots = UINT64_C(0xcbf29ce484222325);
    for (int n = 0; n < nodes; n++) {
        for (int i = 0; i < v[n].nheld; i++)
            if ((uint32_t)(v[n].held[i] >> 32) > top)
                top = (uint32_t)(v[n].held[i] >> 32);
        boots = (boots ^ v[n].boot) * UINT64_C(0x100000001b3);
    }
    uint64_t id = ((uint64_t)(top + 1) << 32) | (seq & 0xffffffffu);
    /* Kept without a state_dir too: a restarted daemon then starts the
     * job at zero, and so must the others. */
    struct obd_efjob *j = efjob(d, job, 1);
    if (j == NULL)
        return id;
    if (top > j->epoch)
        j->epoch = top;
    j->last_seq = seq;
    j->ran = 1;
    if (j->resolved && j->boots == boots)
        return id;
    if (j->resolved) {
        /* Another daemon restarted: it can only restore a set, so every
         * node goes back to that set, or nodes would hold different
         * steps. */
        forget_job(d, job);
        obd_log_warn(&d->log,
                     "job %s: a daemon of the world restarted; every node "
                     "goes back to the newest snapshot that all of them hold",
                     job);
    }
    j->resolved = 1;
    j->boots = boots;
    j->restore = 0;

    /* The newest set that every node holds; every node computes it from
     * the same announces. Ours that are not it can never be restored any
     * more (some node lacks each newer one, and the older ones are
     * superseded), so they go. */
    int me = (int)d->cfg.rank;
    for (int i = v[me].nheld - 1; i >= 0 && j->restore == 0; i--) {
        int everywhere = 1;
        for (int n = 0; n < nodes && everywhere; n++)
            everywhere = listed(v[n].held, v[n].nheld, v[me].held[i]);
        if (everywhere)
            j->restore = v[me].held[i];
    }
    for (int i = j->nheld - 1; i >= 0; i--)
        if (j->held[i] != j->restore)
            delete_set(d, j, j->held[i]);
    if (j->restore != 0)
        obd_log_info(&d->log,
                     "job %s: restoring snapshot %016" PRIx64
                     ", the newest every node holds",
                     job, j->restore);
    else if (v[me].nheld > 0 && d->cfg.state_dir[0] != '\0')
        obd_log_warn(&d->log,
                     "job %s: no snapshot is held by every node; its error "
                     "feedback starts at zero",
                     job);
    return id;
}

/* Links a file of another directory into the set being written, unless
 * the set has that key already (a newer state). */
static int link_missing(const char *from_dir, const char *name,
                        const char *to_dir, char *why, size_t whylen)
{
    char from[4600], to[4600];
    snprintf(from, sizeof(from), "%s/%s", from_dir, name);
    snprintf(to, sizeof(to), "%s/%s", to_dir, name);
    if (access(to, F_OK) == 0)
        return 0;
    if (link(from, to) != 0) {
        snprintf(why, whylen, "link %s: %s", to, strerror(errno));
        return OBCOMM_E_IO;
    }
    return 0;
}

/* Links every snapshot file of `job` in `dir` into `tmp`. */
static int link_all(const char *dir, const char *prefix, const char *tmp,
                    char *why, size_t whylen)
{
    DIR *dh = opendir(dir);
    if (dh == NULL)
        return 0;
    int rc = 0;
    struct dirent *e;
    struct stat st;
    while (rc == 0 && (e = readdir(dh)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 &&
            strlen(e->d_name) > 4 &&
            strcmp(e->d_name + strlen(e->d_name) - 4, ".lz4") == 0 &&
            fstatat(dirfd(dh), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISREG(st.st_mode))
            rc = link_missing(dir, e->d_name, tmp, why, whylen);
    closedir(dh);
    return rc;
}

int obd_efstore_write_set(struct obd_daemon *d, const char *job, uint64_t id,
                          char *why, size_t whylen)
{
    if (d->cfg.state_dir[0] == '\0') {
        snprintf(why, whylen, "no state_dir is configured on node %lld",
                 (long long)d->cfg.rank);
        return OBCOMM_E_INVAL;
    }
    struct obd_efjob *j = efjob(d, job, 1);
    if (j == NULL) {
        snprintf(why, whylen, "out of memory");
        return OBCOMM_E_NOMEM;
    }
    char tmp[4400], final[4400], dir[4400], prefix[64], path[4600];
    set_path(d, job, id, 1, tmp, sizeof(tmp));
    set_path(d, job, id, 0, final, sizeof(final));
    remove_files(tmp, 1);
    remove_files(final, 1); /* a set of this id that did not complete */
    held_remove(j, id);
    if (mkdir(tmp, 0700) != 0) {
        snprintf(why, whylen, "%s: %s", tmp, strerror(errno));
        return OBCOMM_E_IO;
    }
    struct obd_ef_world w = world_of(d);
    int rc = 0;
    for (struct obd_ef *ef = d->efs; ef && rc == 0; ef = ef->next) {
        if (strcmp(ef->job, job) != 0)
            continue;
        if (ef->torn) {
            /* Neither the old step nor the new one: the set would mix
             * steps with the other nodes, so there is none. */
            snprintf(why, whylen,
                     "key %llu was left half-updated by a failed op; reset "
                     "it or run an op on it first",
                     (unsigned long long)ef->key);
            rc = OBCOMM_E_STATE;
            break;
        }
        obd_ef_path(tmp, ef->job, ef->key, path, sizeof(path));
        if (obd_ef_write(path, ef, &w, why, whylen) != 0)
            rc = OBCOMM_E_IO;
        else
            obd_metric_add(&d->metrics, OBD_M_EF_SAVED, 1);
    }
    /* States not in memory: spilled ones, then those of the restored set
     * never loaded in this run. */
    obd_ef_path("", job, 0, path, sizeof(path));
    snprintf(prefix, sizeof(prefix), "%.20s", path + 1); /* "ef-<hash>-" */
    if (rc == 0) {
        spill_dir(d, dir, sizeof(dir));
        rc = link_all(dir, prefix, tmp, why, whylen);
    }
    if (rc == 0 && j->restore != 0) {
        set_path(d, job, j->restore, 0, dir, sizeof(dir));
        rc = link_all(dir, prefix, tmp, why, whylen);
    }
    if (rc == 0) {
        fsync_dir(tmp);
        if (rename(tmp, final) != 0) {
            snprintf(why, whylen, "rename %s: %s", final, strerror(errno));
            rc = OBCOMM_E_IO;
        }
    }
    if (rc != 0) {
        remove_files(tmp, 1);
        return rc;
    }
    fsync_dir(d->cfg.state_dir);
    held_add(j, id);
    return 0;
}

void obd_efstore_commit_set(struct obd_daemon *d, const char *job, uint64_t id)
{
    struct obd_efjob *j = efjob(d, job, 0);
    if (j == NULL)
        return;
    j->restore = id;
    j->resolved = 1;
    for (int i = j->nheld - 1; i >= 0; i--)
        if (j->held[i] < id)
            delete_set(d, j, j->held[i]);
    obd_log_info(&d->log,
                 "job %s: snapshot %016" PRIx64 " complete on every node", job,
                 id);
}

void obd_efstore_drop_set(struct obd_daemon *d, const char *job, uint64_t id)
{
    struct obd_efjob *j = efjob(d, job, 0);
    if (j != NULL && id != j->restore)
        delete_set(d, j, id);
}

int obd_efstore_save(struct obd_daemon *d, char *why, size_t whylen)
{
    int rc = 0;
    for (struct obd_efjob *j = d->efjobs; j; j = j->next) {
        if (!j->ran || d->cfg.state_dir[0] == '\0')
            continue;
        uint64_t id = ((uint64_t)(j->epoch + 1) << 32) |
                      ((j->last_seq + 1) & 0xffffffffu);
        char one[512];
        if (obd_efstore_write_set(d, j->job, id, one, sizeof(one)) != 0) {
            snprintf(why, whylen, "job %s: %s", j->job, one);
            rc = OBCOMM_E_IO;
        }
    }
    return rc;
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

int obd_efstore_open(struct obd_daemon *d)
{
    const char *sd = d->cfg.state_dir;
    if (uv_random(NULL, NULL, &d->boot_id, sizeof(d->boot_id), 0, NULL) != 0)
        d->boot_id = uv_hrtime() ^ ((uint64_t)getpid() << 32);
    if (sd[0] == '\0')
        return 0;
    if (mkdir(sd, 0700) != 0 && errno != EEXIST) {
        obd_log_error(&d->log, "state_dir %s: %s", sd, strerror(errno));
        return OBCOMM_E_INVAL;
    }
    struct stat st;
    if (stat(sd, &st) != 0 || !S_ISDIR(st.st_mode)) {
        obd_log_error(&d->log, "state_dir %s is not a directory", sd);
        return OBCOMM_E_INVAL;
    }
    /* Like ssh with its keys: state that another user may write could
     * plant error feedback, or links that the daemon writes through. */
    if (st.st_uid != geteuid() || (st.st_mode & 022) != 0) {
        obd_log_error(&d->log,
                      "state_dir %s belongs to uid %u with mode %04o: refused; "
                      "it must belong to the daemon's uid %u and be writable "
                      "by nobody else (chown %u %s; chmod go-w %s)",
                      sd, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
                      (unsigned)geteuid(), (unsigned)geteuid(), sd, sd);
        return OBCOMM_E_INVAL;
    }
    char spill[4400];
    spill_dir(d, spill, sizeof(spill));
    if (mkdir(spill, 0700) != 0 && errno != EEXIST)
        obd_log_warn(&d->log, "%s: %s", spill, strerror(errno));
    remove_files(spill, 0);

    DIR *dir = opendir(sd);
    if (dir == NULL)
        return 0;
    int old = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        char job[OBD_EF_JOB_MAX], path[4400];
        uint64_t id;
        int tmp;
        if (strncmp(e->d_name, "ef-", 3) == 0)
            old++;
        if (parse_set(e->d_name, job, &id, &tmp) != 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", sd, e->d_name);
        struct stat es;
        if (fstatat(dirfd(dir), e->d_name, &es, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISDIR(es.st_mode)) {
            obd_log_warn(&d->log, "%s is not a directory; ignored", path);
            continue;
        }
        if (tmp) {
            remove_files(path, 1); /* a set whose writing was interrupted */
            continue;
        }
        struct obd_efjob *j = efjob(d, job, 1);
        if (j != NULL)
            held_add(j, id);
    }
    closedir(dir);
    if (old > 0)
        obd_log_warn(&d->log,
                     "state_dir %s: %d snapshot files of the layout before "
                     "snapshot sets are ignored",
                     sd, old);
    return 0;
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
            char dir[4400], path[4600], why[512];
            spill_dir(d, dir, sizeof(dir));
            obd_ef_path(dir, ef->job, ef->key, path, sizeof(path));
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
    while (d->efjobs != NULL) {
        struct obd_efjob *j = d->efjobs;
        d->efjobs = j->next;
        free(j);
    }
    while (d->efs != NULL) {
        struct obd_ef *ef = d->efs;
        d->efs = ef->next;
        obd_ef_free(ef);
    }
}
