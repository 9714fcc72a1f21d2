#include "snapset.h"

#include <obcomm.h>

#include <dirent.h>
#include <sodium.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define PATH_ROOM 4400

/* state_dir/set-<job in hex>-<id>[.tmp]: the name is safe whatever the
 * job's name holds. */
static void set_path(const char *state_dir, const char *job, uint64_t id,
                     int tmp, char *buf, size_t len)
{
    char hex[2 * OBD_EF_JOB_MAX + 1];
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)job;
         *p && n + 2 < sizeof(hex); p++, n += 2)
        snprintf(hex + n, 3, "%02x", *p);
    hex[n] = '\0';
    snprintf(buf, len, "%s/set-%s-%016" PRIx64 "%s", state_dir, hex, id,
             tmp ? ".tmp" : "");
}

/* The prefix of every set name of `job`: "set-<hex>-". */
static void set_prefix(const char *job, char *buf, size_t len)
{
    char path[PATH_ROOM];
    set_path("", job, 0, 0, path, sizeof(path));
    snprintf(buf, len, "%.*s", (int)(strlen(path) - 1 - 16), path + 1);
}

/* Removes a directory of plain files. */
static void remove_dir(const char *dir)
{
    DIR *dh = opendir(dir);
    if (dh != NULL) {
        struct dirent *e;
        while ((e = readdir(dh)) != NULL)
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
                (void)unlinkat(dirfd(dh), e->d_name, 0);
        closedir(dh);
    }
    (void)rmdir(dir);
}

/* 0, or OBD_E_IO with why. */
static int fsync_dir(const char *dir, char *why, size_t whylen)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        snprintf(why, whylen, "fsync %s: %s", dir, strerror(errno));
        if (fd >= 0)
            close(fd);
        return OBD_E_IO;
    }
    close(fd);
    return 0;
}

/* ---- the manifest: which keys a node's part of a set holds ---- */

#define MAN_NAME    "manifest"
#define MAN_MAGIC   "OBCMMAN"
#define MAN_VERSION 1
/* Keys a manifest may list: bounds its length before allocation. */
#define MAN_MAX_KEYS (1u << 20)

struct man_hdr {
    char magic[8];
    uint32_t version;
    uint32_t nodes;
    uint32_t rank;
    uint32_t nkeys;
    uint64_t fingerprint;
    uint64_t run;
    uint64_t id;
    char job[OBD_EF_JOB_MAX];
};

struct man_key {
    uint64_t key;
    uint64_t count;
    uint8_t digest[OBD_EF_DIGEST_BYTES]; /* of the key's file */
};

/* The manifest's bytes: the header, the keys, then BLAKE2b-256 of both. */
static size_t man_bytes(uint32_t nkeys)
{
    return sizeof(struct man_hdr) + (size_t)nkeys * sizeof(struct man_key) +
           OBD_EF_DIGEST_BYTES;
}

/* Writes dir/manifest (fsync'd). 0 or OBD_E_IO with why. */
static int man_write(const char *dir, const char *job,
                     const struct obd_ef_set *set, const struct obd_ef_world *w,
                     const struct man_key *keys, int n, char *why,
                     size_t whylen)
{
    size_t bytes = man_bytes((uint32_t)n);
    uint8_t *buf = calloc(1, bytes);
    char path[PATH_ROOM + 16];
    snprintf(path, sizeof(path), "%s/" MAN_NAME, dir);
    if (buf == NULL) {
        snprintf(why, whylen, "%s: out of memory", path);
        return OBD_E_IO;
    }
    struct man_hdr h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, MAN_MAGIC, sizeof(MAN_MAGIC));
    h.version = MAN_VERSION;
    h.nodes = w->nodes;
    h.rank = w->rank;
    h.nkeys = (uint32_t)n;
    h.fingerprint = w->fingerprint;
    h.run = set->run;
    h.id = set->id;
    snprintf(h.job, sizeof(h.job), "%s", job);
    memcpy(buf, &h, sizeof(h));
    if (n > 0)
        memcpy(buf + sizeof(h), keys, (size_t)n * sizeof(*keys));
    crypto_generichash(buf + bytes - OBD_EF_DIGEST_BYTES, OBD_EF_DIGEST_BYTES,
                       buf, bytes - OBD_EF_DIGEST_BYTES, NULL, 0);
    int rc = OBD_E_IO;
    int fd =
        open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
        size_t off = 0;
        while (off < bytes) {
            ssize_t k = write(fd, buf + off, bytes - off);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                break;
            off += (size_t)k;
        }
        if (off == bytes && fsync(fd) == 0)
            rc = 0;
    }
    if (rc != 0)
        snprintf(why, whylen, "%s: %s", path, strerror(errno));
    if (fd >= 0)
        close(fd);
    free(buf);
    return rc;
}

/* Reads dir/manifest of set `id` of `job`, written by this node of this
 * world: 0 with *out_h and *out_keys (caller frees), else OBD_E_CORRUPT
 * or OBD_E_IO with why naming the file. */
static int man_read(const char *dir, const char *job, uint64_t id,
                    const struct obd_ef_world *w, struct man_hdr *out_h,
                    struct man_key **out_keys, char *why, size_t whylen)
{
    char path[PATH_ROOM + 16];
    snprintf(path, sizeof(path), "%s/" MAN_NAME, dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    struct stat st;
    if (fd < 0) {
        int e = errno;
        snprintf(why, whylen, "damaged: %s: %s", path,
                 e == ENOENT ? "missing (every set holds one)" : strerror(e));
        return e == ENOENT || e == ELOOP ? OBD_E_CORRUPT : OBD_E_IO;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        (uint64_t)st.st_size < man_bytes(0) ||
        (uint64_t)st.st_size > man_bytes(MAN_MAX_KEYS)) {
        snprintf(why, whylen, "damaged: %s: not a manifest of a set", path);
        close(fd);
        return OBD_E_CORRUPT;
    }
    size_t bytes = (size_t)st.st_size;
    uint8_t *buf = malloc(bytes);
    size_t off = 0;
    while (buf != NULL && off < bytes) {
        ssize_t k = read(fd, buf + off, bytes - off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        off += (size_t)k;
    }
    close(fd);
    if (buf == NULL || off != bytes) {
        snprintf(why, whylen, "unreadable: %s", path);
        free(buf);
        return OBD_E_IO;
    }
    struct man_hdr h;
    memcpy(&h, buf, sizeof(h));
    uint8_t digest[OBD_EF_DIGEST_BYTES];
    crypto_generichash(digest, sizeof(digest), buf, bytes - sizeof(digest),
                       NULL, 0);
    const char *bad = NULL;
    if (memcmp(h.magic, MAN_MAGIC, sizeof(MAN_MAGIC)) != 0 ||
        h.version != MAN_VERSION || h.nkeys > MAN_MAX_KEYS ||
        man_bytes(h.nkeys) != bytes)
        bad = "not a manifest of a set";
    else if (sodium_memcmp(digest, buf + bytes - sizeof(digest),
                           sizeof(digest)) != 0)
        bad = "its digest does not match";
    if (bad != NULL) {
        snprintf(why, whylen, "damaged: %s: %s", path, bad);
        free(buf);
        return OBD_E_CORRUPT;
    }
    h.job[sizeof(h.job) - 1] = '\0';
    if (h.nodes != w->nodes || h.rank != w->rank ||
        h.fingerprint != w->fingerprint || h.id != id ||
        strcmp(h.job, job) != 0) {
        snprintf(why, whylen,
                 "damaged: %s: the manifest of set %016" PRIx64
                 " of node %u of a %u-node world%s, not of set %016" PRIx64
                 " of this node %u",
                 path, h.id, (unsigned)h.rank, (unsigned)h.nodes,
                 h.fingerprint != w->fingerprint ? " (another world)"
                 : strcmp(h.job, job) != 0       ? " of another job"
                                                 : "",
                 id, (unsigned)w->rank);
        free(buf);
        return OBD_E_CORRUPT;
    }
    struct man_key *keys = calloc((size_t)h.nkeys + 1, sizeof(*keys));
    if (keys == NULL) {
        snprintf(why, whylen, "unreadable: %s: out of memory", path);
        free(buf);
        return OBD_E_IO;
    }
    if (h.nkeys > 0)
        memcpy(keys, buf + sizeof(h), (size_t)h.nkeys * sizeof(*keys));
    free(buf);
    *out_h = h;
    *out_keys = keys;
    return 0;
}

int obd_snapset_write(const char *state_dir, const char *job,
                      const struct obd_ef_set *set, struct obd_ef *const *efs,
                      int n, const struct obd_ef_world *w, char *why,
                      size_t whylen)
{
    char tmp[PATH_ROOM], final[PATH_ROOM], path[PATH_ROOM + 64];
    set_path(state_dir, job, set->id, 1, tmp, sizeof(tmp));
    set_path(state_dir, job, set->id, 0, final, sizeof(final));
    remove_dir(tmp);
    remove_dir(final); /* a set of this id that did not complete */
    struct man_key *keys = calloc((size_t)n + 1, sizeof(*keys));
    if (keys == NULL) {
        snprintf(why, whylen, "%s: out of memory", tmp);
        return OBD_E_IO;
    }
    if (mkdir(tmp, 0700) != 0) {
        snprintf(why, whylen, "%s: %s", tmp, strerror(errno));
        free(keys);
        return OBD_E_IO;
    }
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        obd_ef_path(tmp, job, efs[i]->key, path, sizeof(path));
        keys[i].key = efs[i]->key;
        keys[i].count = efs[i]->count;
        rc = obd_ef_write(path, efs[i], w, set, keys[i].digest, why, whylen);
    }
    if (rc == 0)
        rc = man_write(tmp, job, set, w, keys, n, why, whylen);
    free(keys);
    if (rc == 0)
        rc = fsync_dir(tmp, why, whylen);
    if (rc == 0 && rename(tmp, final) != 0) {
        rc = OBD_E_IO;
        snprintf(why, whylen, "rename %s: %s", final, strerror(errno));
    }
    if (rc == 0)
        rc = fsync_dir(state_dir, why, whylen);
    if (rc != 0) {
        remove_dir(tmp);
        remove_dir(final);
    }
    return rc;
}

static void free_list(struct obd_ef *ef)
{
    while (ef != NULL) {
        struct obd_ef *next = ef->next;
        obd_ef_free(ef);
        ef = next;
    }
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every entry of dir is the manifest or a key's file that it names: 0, or
 * OBD_E_CORRUPT / OBD_E_IO with why naming the first other entry. */
static int only_listed(const char *dir, const char *job,
                       const struct man_key *keys, uint32_t nkeys, char *why,
                       size_t whylen)
{
    char **names = calloc((size_t)nkeys + 1, sizeof(*names));
    char *store = calloc((size_t)nkeys + 1, 64);
    int rc = 0;
    DIR *dh = names && store ? opendir(dir) : NULL;
    if (dh == NULL) {
        snprintf(why, whylen, "unreadable: %s: %s", dir,
                 names && store ? strerror(errno) : "out of memory");
        free(names);
        free(store);
        return OBD_E_IO;
    }
    for (uint32_t i = 0; i < nkeys; i++) {
        char path[PATH_ROOM + 64];
        obd_ef_path("", job, keys[i].key, path, sizeof(path));
        names[i] = store + (size_t)i * 64;
        snprintf(names[i], 64, "%s", path + 1);
    }
    qsort(names, nkeys, sizeof(*names), name_cmp);
    struct dirent *e;
    while (rc == 0 && (e = readdir(dh)) != NULL) {
        const char *name = e->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 ||
            strcmp(name, MAN_NAME) == 0)
            continue;
        if (nkeys == 0 ||
            bsearch(&name, names, nkeys, sizeof(*names), name_cmp) == NULL) {
            snprintf(why, whylen,
                     "damaged: %s/%s: not in the set's manifest (a file "
                     "added to the set)",
                     dir, name);
            rc = OBD_E_CORRUPT;
        }
    }
    closedir(dh);
    free(names);
    free(store);
    return rc;
}

int obd_snapset_read(const char *state_dir, const char *job, uint64_t id,
                     const struct obd_ef_world *w, uint64_t max_bytes,
                     struct obd_ef **out, char *why, size_t whylen)
{
    char dir[PATH_ROOM], path[PATH_ROOM + 300];
    set_path(state_dir, job, id, 0, dir, sizeof(dir));
    struct stat st;
    if (lstat(dir, &st) != 0) {
        int e = errno;
        snprintf(why, whylen, "missing (%s: %s)", dir, strerror(e));
        return e == ENOENT || e == ENOTDIR ? OBD_E_MISSING : OBD_E_IO;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(why, whylen, "damaged: %s is not a directory", dir);
        return OBD_E_CORRUPT;
    }
    /* Everything is checked before any state is returned: the manifest
     * (this set, this node, this world), no file besides the ones it
     * names, and each of those there, intact, of this set and exactly
     * the file the set was written with (its digest). */
    struct man_hdr h;
    struct man_key *keys = NULL;
    int rc = man_read(dir, job, id, w, &h, &keys, why, whylen);
    if (rc == 0)
        rc = only_listed(dir, job, keys, h.nkeys, why, whylen);
    struct obd_ef *list = NULL;
    const struct obd_ef_set set = {h.run, id};
    for (uint32_t i = 0; rc == 0 && i < h.nkeys; i++) {
        obd_ef_path(dir, job, keys[i].key, path, sizeof(path));
        int there = lstat(path, &st) == 0;
        if (!there || !S_ISREG(st.st_mode)) {
            snprintf(why, whylen, "damaged: %s: %s", path,
                     there ? "not a regular file"
                           : "missing (named in the set's manifest)");
            rc = OBD_E_CORRUPT;
            break;
        }
        struct obd_ef *ef = NULL;
        uint8_t digest[OBD_EF_DIGEST_BYTES];
        char one[512];
        int r = obd_ef_read(path, w, &set, max_bytes, &ef, digest, one,
                            sizeof(one));
        if (r == 0 && (strcmp(ef->job, job) != 0 || ef->key != keys[i].key ||
                       ef->count != keys[i].count)) {
            snprintf(one, sizeof(one),
                     "%s: a state of another job or key than the manifest "
                     "names",
                     path);
            obd_ef_free(ef);
            r = OBD_E_CORRUPT;
        } else if (r == 0 &&
                   sodium_memcmp(digest, keys[i].digest, sizeof(digest)) != 0) {
            snprintf(one, sizeof(one),
                     "%s: not the file the set was written with (its digest "
                     "differs from the manifest's)",
                     path);
            obd_ef_free(ef);
            r = OBD_E_CORRUPT;
        }
        if (r == 0) {
            ef->next = list;
            list = ef;
        } else if (r == OBD_E_IO) {
            snprintf(why, whylen, "unreadable: %s", one);
            rc = OBD_E_IO;
        } else {
            snprintf(why, whylen, "damaged: %s", one);
            rc = OBD_E_CORRUPT;
        }
    }
    free(keys);
    if (rc != 0) {
        free_list(list);
        return rc;
    }
    *out = list;
    return 0;
}

void obd_snapset_delete(const char *state_dir, const char *job, uint64_t id)
{
    char path[PATH_ROOM];
    set_path(state_dir, job, id, 1, path, sizeof(path));
    remove_dir(path);
    set_path(state_dir, job, id, 0, path, sizeof(path));
    remove_dir(path);
}

struct held {
    char name[300];
    struct timespec when;
};

static int newer_first(const void *a, const void *b)
{
    const struct held *x = a, *y = b;
    if (x->when.tv_sec != y->when.tv_sec)
        return x->when.tv_sec < y->when.tv_sec ? 1 : -1;
    if (x->when.tv_nsec != y->when.tv_nsec)
        return x->when.tv_nsec < y->when.tv_nsec ? 1 : -1;
    return strcmp(x->name, y->name);
}

/* Bytes of the plain files in a set's directory. */
static uint64_t dir_bytes(const char *dir)
{
    uint64_t bytes = 0;
    DIR *dh = opendir(dir);
    if (dh == NULL)
        return 0;
    struct dirent *e;
    struct stat st;
    while ((e = readdir(dh)) != NULL)
        if (fstatat(dirfd(dh), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISREG(st.st_mode))
            bytes += (uint64_t)st.st_size;
    closedir(dh);
    return bytes;
}

/* A committed set in state_dir, for the global bound. */
struct any_set {
    char name[300];
    size_t job_len; /* "set-<job hex>" is name[0..job_len) */
    struct timespec when;
    uint64_t bytes;
};

/* The job whose newest set is oldest first. */
static int job_older_first(const void *a, const void *b)
{
    const struct any_set *x = a, *y = b;
    if (x->when.tv_sec != y->when.tv_sec)
        return x->when.tv_sec < y->when.tv_sec ? -1 : 1;
    if (x->when.tv_nsec != y->when.tv_nsec)
        return x->when.tv_nsec < y->when.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The sets of every job in state_dir together stay within max_bytes:
 * whole jobs go, the one whose newest set is oldest first, never `job`. */
static void prune_jobs(const char *state_dir, const char *job,
                       uint64_t max_bytes)
{
    char mine[PATH_ROOM];
    set_prefix(job, mine, sizeof(mine)); /* "set-<hex>-" */
    DIR *dh = opendir(state_dir);
    if (dh == NULL)
        return;
    struct any_set *sets = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    char path[PATH_ROOM + 300];
    struct dirent *e;
    while ((e = readdir(dh)) != NULL) {
        size_t len = strlen(e->d_name);
        struct stat st;
        const char *dash = strrchr(e->d_name, '-');
        if (strncmp(e->d_name, "set-", 4) != 0 || dash == NULL ||
            dash - e->d_name < 4 || strlen(dash + 1) != 16 ||
            len >= sizeof(sets[0].name) ||
            fstatat(dirfd(dh), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISDIR(st.st_mode))
            continue; /* not a set, or one being written (.tmp) */
        if (n == cap) {
            size_t c = cap ? 2 * cap : 64;
            struct any_set *m = realloc(sets, c * sizeof(*sets));
            if (m == NULL)
                break;
            sets = m;
            cap = c;
        }
        struct any_set *a = &sets[n++];
        snprintf(a->name, sizeof(a->name), "%s", e->d_name);
        a->job_len = (size_t)(dash - e->d_name);
        a->when = st.st_mtim;
        snprintf(path, sizeof(path), "%s/%s", state_dir, e->d_name);
        a->bytes = dir_bytes(path);
        total += a->bytes;
    }
    closedir(dh);
    /* Each set stands for its job: the job's newest time, its bytes. */
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            if (j != i && sets[j].job_len == sets[i].job_len &&
                strncmp(sets[j].name, sets[i].name, sets[i].job_len) == 0 &&
                job_older_first(&sets[j], &sets[i]) > 0)
                sets[i].when = sets[j].when;
    if (n > 0)
        qsort(sets, n, sizeof(*sets), job_older_first);
    for (size_t i = 0; i < n && total > max_bytes; i++) {
        if (strncmp(sets[i].name, mine, strlen(mine)) == 0 &&
            strlen(mine) == sets[i].job_len + 1)
            continue;
        snprintf(path, sizeof(path), "%s/%s", state_dir, sets[i].name);
        remove_dir(path);
        total -= sets[i].bytes;
    }
    free(sets);
}

void obd_snapset_commit(const char *state_dir, const char *job, uint64_t id,
                        int keep, uint64_t max_bytes)
{
    char path[PATH_ROOM], prefix[PATH_ROOM], mine[PATH_ROOM];
    set_path(state_dir, job, id, 0, path, sizeof(path));
    (void)utimensat(AT_FDCWD, path, NULL, 0); /* now: the newest */
    set_path("", job, id, 0, mine, sizeof(mine));
    set_prefix(job, prefix, sizeof(prefix));
    DIR *dh = opendir(state_dir);
    if (dh == NULL)
        return;
    struct held *sets = NULL;
    size_t n = 0, cap = 0;
    int committed = 0;
    struct dirent *e;
    while ((e = readdir(dh)) != NULL) {
        size_t len = strlen(e->d_name);
        struct stat st;
        /* The committed set stays whatever its time says: commits within
         * one tick of the file system's clock tie, and a clock set back
         * makes "now" older than earlier commits. */
        if (strcmp(e->d_name, mine + 1) == 0) {
            committed = 1;
            continue;
        }
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 ||
            len != strlen(prefix) + 16 || len >= sizeof(sets[0].name) ||
            fstatat(dirfd(dh), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISDIR(st.st_mode))
            continue;
        if (n == cap) {
            size_t c = cap ? 2 * cap : 16;
            struct held *m = realloc(sets, c * sizeof(*sets));
            if (m == NULL)
                break;
            sets = m;
            cap = c;
        }
        snprintf(sets[n].name, sizeof(sets[n].name), "%s", e->d_name);
        sets[n].when = st.st_mtim;
        n++;
    }
    closedir(dh);
    if (n > 0)
        qsort(sets, n, sizeof(*sets), newer_first);
    size_t others = keep <= committed ? 0 : (size_t)(keep - committed);
    for (size_t i = others; i < n; i++) {
        snprintf(path, sizeof(path), "%s/%s", state_dir, sets[i].name);
        remove_dir(path);
    }
    free(sets);
    if (max_bytes > 0)
        prune_jobs(state_dir, job, max_bytes);
}

/* A directory that does not exist yet is fine for a check when its
 * parent is one this process can create it in. */
static int creatable(const char *opt, const char *dir, char *why, size_t whylen)
{
    char parent[PATH_ROOM];
    snprintf(parent, sizeof(parent), "%s", dir);
    size_t len = strlen(parent);
    while (len > 1 && parent[len - 1] == '/')
        parent[--len] = '\0';
    char *slash = strrchr(parent, '/');
    if (slash == NULL)
        snprintf(parent, sizeof(parent), ".");
    else if (slash == parent)
        parent[1] = '\0';
    else
        *slash = '\0';
    struct stat st;
    if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(why, whylen,
                 "%s %s: missing, and its parent %s is not a directory", opt,
                 dir, parent);
        return -1;
    }
    if (access(parent, W_OK | X_OK) != 0) {
        snprintf(why, whylen, "%s %s: missing, and cannot be created in %s: %s",
                 opt, dir, parent, strerror(errno));
        return -1;
    }
    return 0;
}

int obd_snapset_dir_ok(const char *sd, unsigned uid, int create, char *why,
                       size_t whylen)
{
    struct stat st;
    if (!create && stat(sd, &st) != 0 && errno == ENOENT)
        return creatable("state_dir", sd, why, whylen);
    if (create && mkdir(sd, 0700) != 0 && errno != EEXIST) {
        snprintf(why, whylen, "state_dir %s: %s", sd, strerror(errno));
        return -1;
    }
    if (stat(sd, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(why, whylen, "state_dir %s is not a directory", sd);
        return -1;
    }
    /* Like ssh with its keys: state that another user may write could
     * plant error feedback, or links that the daemon writes through. */
    if (st.st_uid != uid || (st.st_mode & 022) != 0) {
        snprintf(why, whylen,
                 "state_dir %s belongs to uid %u with mode %04o: refused; "
                 "it must belong to the daemon's uid %u and be writable by "
                 "nobody else (chown %u %s; chmod go-w %s)",
                 sd, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), uid,
                 uid, sd, sd);
        return -1;
    }
    if (!create && obd_snapset_lock_free(sd, why, whylen) != 0)
        return -1;
    if (access(sd, W_OK | X_OK) != 0) {
        snprintf(why, whylen, "state_dir %s is not writable: %s", sd,
                 strerror(errno));
        return -1;
    }
    return 0;
}

/* state_dir/lock: held with flock for the life of the daemon that owns the
 * directory, and holds its pid as text. */
#define LOCK_NAME "lock"

/* The pid written in the lock file open at fd, or 0. */
static long lock_pid(int fd)
{
    char buf[32];
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *end;
    long pid = strtol(buf, &end, 10);
    return end != buf && pid > 0 ? pid : 0;
}

static void held_by(const char *sd, int fd, char *why, size_t whylen)
{
    long pid = lock_pid(fd);
    char who[48] = "another obcommd";
    if (pid > 0)
        snprintf(who, sizeof(who), "obcommd pid %ld", pid);
    snprintf(why, whylen,
             "state_dir %s is in use by %s (it holds %s/" LOCK_NAME
             "): each daemon needs a state_dir of its own, or their saves "
             "and starts remove each other's files; give this one another "
             "directory (deploy/local-cluster.sh --state-dir DIR gives "
             "daemon N DIR/nodeN)",
             sd, who, sd);
}

int obd_snapset_lock_free(const char *sd, char *why, size_t whylen)
{
    char path[PATH_ROOM];
    snprintf(path, sizeof(path), "%s/" LOCK_NAME, sd);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return 0; /* no lock file: nobody holds it */
    int rc = 0;
    if (flock(fd, LOCK_SH | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) {
            held_by(sd, fd, why, whylen);
            rc = -1;
        }
    }
    close(fd); /* drops the shared lock, if taken */
    return rc;
}

int obd_snapset_prepare_dir(const char *sd, unsigned uid, int *lock_fd,
                            char *why, size_t whylen)
{
    if (obd_snapset_dir_ok(sd, uid, 1, why, whylen) != 0)
        return -1;
    /* The lock first: the unfinished sets removed below may be another
     * daemon's writes in progress. */
    char path[PATH_ROOM + 300];
    snprintf(path, sizeof(path), "%s/" LOCK_NAME, sd);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        snprintf(why, whylen, "state_dir %s: cannot open its lock file: %s", sd,
                 strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK)
            held_by(sd, fd, why, whylen);
        else
            snprintf(why, whylen, "state_dir %s: cannot lock %s: %s", sd, path,
                     strerror(errno));
        close(fd);
        return -1;
    }
    char pid[32];
    int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
        snprintf(why, whylen, "state_dir %s: cannot write %s: %s", sd, path,
                 strerror(errno));
        close(fd);
        return -1;
    }
    DIR *dh = opendir(sd);
    if (dh != NULL) {
        struct dirent *e;
        while ((e = readdir(dh)) != NULL) {
            size_t len = strlen(e->d_name);
            if (strncmp(e->d_name, "set-", 4) == 0 && len > 4 &&
                strcmp(e->d_name + len - 4, ".tmp") == 0) {
                snprintf(path, sizeof(path), "%s/%s", sd, e->d_name);
                remove_dir(path); /* a set whose writing was interrupted */
            }
        }
        closedir(dh);
    }
    *lock_fd = fd;
    return 0;
}

int obd_snapset_verdict(const struct obd_snapreport *r, int nodes, char *msg,
                        size_t len)
{
    int status = 0;
    size_t off = 0;
    if (len > 0)
        msg[0] = '\0';
    for (int n = 0; n < nodes; n++) {
        if (r[n].status == 0)
            continue;
        if (status == 0)
            status = r[n].status;
        if (off < len)
            off += (size_t)snprintf(
                msg + off, len - off, "%snode %d: %s", off ? "; " : "", n,
                r[n].message && r[n].message[0] ? r[n].message : "failed");
    }
    return status;
}

uint64_t obd_snapset_id(uint64_t run, uint64_t seq)
{
    /* splitmix64 of both: ids of different runs or ops do not collide in
     * practice, and the same pair gives the same id on every node. */
    uint64_t z = run ^ (seq + UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    z ^= z >> 31;
    return z != 0 ? z : 1;
}

/* ---- a node's part in memory ---- */

#define PART_MAGIC   "OBCMPRT"
#define PART_VERSION 1

struct part_hdr {
    char magic[8];
    uint32_t version;
    uint32_t nodes;
    uint32_t rank;
    uint32_t nstates;
    uint64_t fingerprint;
    uint64_t id;
    char job[OBD_EF_JOB_MAX];
    uint8_t digest[32]; /* BLAKE2b-256 of every byte after the header */
};

struct part_state {
    uint64_t key;
    uint64_t count;
    uint64_t padded;
};

static size_t state_bytes(size_t padded, uint32_t nodes)
{
    return sizeof(struct part_state) +
           (padded + padded / nodes) * sizeof(float);
}

size_t obd_snapset_part_bytes(const struct obd_ef *const *efs, int n)
{
    size_t bytes = sizeof(struct part_hdr);
    for (int i = 0; i < n; i++)
        bytes += state_bytes(efs[i]->padded, (uint32_t)efs[i]->nodes);
    return bytes;
}

void obd_snapset_pack(const struct obd_ef *const *efs, int n, const char *job,
                      uint64_t id, const struct obd_ef_world *w, void *part,
                      size_t bytes)
{
    struct part_hdr h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, PART_MAGIC, sizeof(PART_MAGIC));
    h.version = PART_VERSION;
    h.nodes = w->nodes;
    h.rank = w->rank;
    h.nstates = (uint32_t)n;
    h.fingerprint = w->fingerprint;
    h.id = id;
    snprintf(h.job, sizeof(h.job), "%s", job);
    char *p = (char *)part + sizeof(h);
    for (int i = 0; i < n; i++) {
        const struct obd_ef *ef = efs[i];
        struct part_state st = {ef->key, ef->count, ef->padded};
        memcpy(p, &st, sizeof(st));
        p += sizeof(st);
        obd_ef_error(ef, 0, (float *)(void *)p, 0, ef->padded);
        p += ef->padded * sizeof(float);
        size_t chunk = ef->padded / (size_t)ef->nodes;
        obd_ef_error(ef, 1, (float *)(void *)p, 0, chunk);
        p += chunk * sizeof(float);
    }
    crypto_generichash(h.digest, sizeof(h.digest),
                       (const unsigned char *)part + sizeof(h),
                       bytes - sizeof(h), NULL, 0);
    memcpy(part, &h, sizeof(h));
}

int obd_snapset_unpack(const void *part, size_t bytes, const char *job,
                       uint64_t id, const struct obd_ef_world *w,
                       struct obd_ef **out, char *why, size_t whylen)
{
    struct part_hdr h;
    uint8_t digest[32];
    if (bytes < sizeof(h)) {
        snprintf(why, whylen, "damaged: a part of %zu bytes", bytes);
        return OBD_E_CORRUPT;
    }
    memcpy(&h, part, sizeof(h));
    crypto_generichash(digest, sizeof(digest),
                       (const unsigned char *)part + sizeof(h),
                       bytes - sizeof(h), NULL, 0);
    if (memcmp(h.magic, PART_MAGIC, sizeof(PART_MAGIC)) != 0 ||
        h.version != PART_VERSION) {
        snprintf(why, whylen, "damaged: not a part of a snapshot");
        return OBD_E_CORRUPT;
    }
    if (sodium_memcmp(digest, h.digest, sizeof(digest)) != 0) {
        snprintf(why, whylen, "damaged: the part's digest does not match");
        return OBD_E_CORRUPT;
    }
    if (h.nodes != w->nodes || h.fingerprint != w->fingerprint ||
        h.rank != w->rank) {
        snprintf(why, whylen,
                 "damaged: a part of node %u of a %u-node world, this is "
                 "node %u of %u%s",
                 (unsigned)h.rank, (unsigned)h.nodes, (unsigned)w->rank,
                 (unsigned)w->nodes,
                 h.fingerprint != w->fingerprint ? " (another world)" : "");
        return OBD_E_CORRUPT;
    }
    h.job[sizeof(h.job) - 1] = '\0';
    if (h.id != id || strcmp(h.job, job) != 0) {
        snprintf(why, whylen,
                 "damaged: the part is of snapshot %016" PRIx64
                 " of another job or id, not %016" PRIx64,
                 h.id, id);
        return OBD_E_CORRUPT;
    }
    const char *p = (const char *)part + sizeof(h);
    size_t left = bytes - sizeof(h);
    struct obd_ef *list = NULL;
    for (uint32_t i = 0; i < h.nstates; i++) {
        struct part_state st;
        if (left < sizeof(st))
            goto short_part;
        memcpy(&st, p, sizeof(st));
        if (st.padded > left / sizeof(float) || st.padded == 0 ||
            st.padded != obd_codec_padded_len(st.count, (int)h.nodes) ||
            state_bytes(st.padded, h.nodes) > left)
            goto short_part;
        struct obd_ef *ef = obd_ef_new(job, st.key, st.count, (int)h.nodes);
        if (ef == NULL) {
            free_list(list);
            snprintf(why, whylen, "out of memory for a part's state");
            return OBD_E_IO;
        }
        p += sizeof(st);
        memcpy(ef->werr, p, st.padded * sizeof(float));
        p += st.padded * sizeof(float);
        size_t chunk = st.padded / h.nodes;
        memcpy(ef->serr, p, chunk * sizeof(float));
        p += chunk * sizeof(float);
        left -= state_bytes(st.padded, h.nodes);
        obd_ef_restored(ef);
        ef->next = list;
        list = ef;
    }
    if (left != 0)
        goto short_part;
    *out = list;
    return 0;
short_part:
    free_list(list);
    snprintf(why, whylen, "damaged: the part's states do not fit its length");
    return OBD_E_CORRUPT;
}
