#include "efstate.h"

#include <errno.h>
#include <fcntl.h>
#include <lz4frame.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codec.h"
#include "hash.h"

#define EF_MAGIC   "OBCMEF1"
#define EF_VERSION 2
#define EF_ORDER   0x01020304u
#define IO_CHUNK   (1 << 20)

/* The fixed header at the start of the decompressed content. */
struct ef_hdr {
    char magic[8];
    uint32_t version;
    uint32_t byte_order;
    uint32_t nodes;
    uint32_t rank;
    uint64_t fingerprint;
    uint64_t key;
    uint64_t count;
    uint64_t padded;
    char job[OBD_EF_JOB_MAX];
    uint64_t run; /* the set the file belongs to (struct obd_ef_set) */
    uint64_t set;
};

/* A state buffer: 64-byte aligned (codec.h), zeroed so that no byte of
 * it is ever uninitialized, although a ZERO state does not read it. */
static float *alloc_buf(size_t elems)
{
    size_t bytes = (elems * sizeof(float) + 63) / 64 * 64;
    float *p = aligned_alloc(64, bytes);
    if (p != NULL)
        memset(p, 0, bytes);
    return p;
}

struct obd_ef *obd_ef_new(const char *job, uint64_t key, uint64_t count,
                          int nodes)
{
    size_t padded = obd_codec_padded_len(count, nodes);
    if (padded == 0 || strlen(job) >= OBD_EF_JOB_MAX)
        return NULL;
    struct obd_ef *ef = calloc(1, sizeof(*ef));
    if (ef == NULL)
        return NULL;
    ef->werr = alloc_buf(padded);
    ef->serr = alloc_buf(padded / (size_t)nodes);
    if (ef->werr == NULL || ef->serr == NULL) {
        obd_ef_free(ef);
        return NULL;
    }
    obd_codec_lazy_state_init(&ef->wl, ef->werr);
    obd_codec_lazy_state_init(&ef->sl, ef->serr);
    strcpy(ef->job, job);
    ef->key = key;
    ef->count = count;
    ef->padded = padded;
    ef->nodes = nodes;
    return ef;
}

static void work_free(struct obd_ef_work *w, int nodes)
{
    if (w == NULL)
        return;
    for (int k = 0; w->in && k < nodes; k++)
        if (k != w->rank)
            free(w->in[k]);
    free(w->in);
    free(w->bits);
    free(w->out);
    free(w);
}

void obd_ef_free(struct obd_ef *ef)
{
    if (ef == NULL)
        return;
    work_free(ef->work, ef->nodes);
    free(ef->werr);
    free(ef->serr);
    free(ef);
}

struct obd_ef *obd_ef_copy(const struct obd_ef *src)
{
    struct obd_ef *ef = obd_ef_new(src->job, src->key, src->count, src->nodes);
    if (ef == NULL)
        return NULL;
    obd_ef_error(src, 0, ef->werr, 0, ef->padded);
    obd_ef_error(src, 1, ef->serr, 0, ef->padded / (size_t)ef->nodes);
    obd_ef_restored(ef);
    return ef;
}

void obd_ef_zero(struct obd_ef *ef)
{
    obd_codec_lazy_state_init(&ef->wl, ef->werr);
    obd_codec_lazy_state_init(&ef->sl, ef->serr);
}

void obd_ef_abort(struct obd_ef *ef)
{
    obd_codec_lazy_state_abort(&ef->wl);
    obd_codec_lazy_state_abort(&ef->sl);
}

void obd_ef_restored(struct obd_ef *ef)
{
    /* The errors are in the current buffers already: nothing is copied. */
    obd_codec_lazy_state_restore(&ef->wl, ef->werr, ef->padded);
    obd_codec_lazy_state_restore(&ef->sl, ef->serr,
                                 ef->padded / (size_t)ef->nodes);
}

void obd_ef_error(const struct obd_ef *ef, int serr_part, float *e,
                  size_t begin, size_t end)
{
    struct obd_codec_lazy st =
        obd_codec_lazy_state_prev(serr_part ? &ef->sl : &ef->wl);
    /* The error is elementwise: the range as a state of its own. */
    if (st.v != NULL)
        st.v += begin;
    obd_codec_best()->lazy_error(&st, e, 0, end - begin);
}

/* Two error buffers, then our bits, the results' bits and the other
 * nodes' bits of our chunk. */
static size_t bytes_of(size_t padded, int nodes, int with_work)
{
    size_t chunk = padded / (size_t)nodes;
    size_t b = (padded + chunk) * sizeof(float);
    if (with_work)
        b += 2 * padded / 8 + (size_t)(nodes - 1) * chunk / 8;
    return b;
}

size_t obd_ef_bytes(const struct obd_ef *ef)
{
    return bytes_of(ef->padded, ef->nodes, ef->work != NULL);
}

size_t obd_ef_bytes_for(uint64_t count, int nodes)
{
    size_t padded = obd_codec_padded_len(count, nodes);
    return padded ? bytes_of(padded, nodes, 1) : 0;
}

const struct obd_ef_work *obd_ef_work(struct obd_ef *ef, int rank)
{
    if (ef->work != NULL)
        return ef->work;
    size_t chunk = ef->padded / (size_t)ef->nodes;
    struct obd_ef_work *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return NULL;
    w->rank = rank;
    w->bits = malloc(ef->padded / 8);
    w->out = malloc(ef->padded / 8);
    w->in = calloc((size_t)ef->nodes, sizeof(*w->in));
    int ok = w->bits && w->out && w->in;
    for (int k = 0; ok && k < ef->nodes; k++) {
        w->in[k] =
            k == rank ? w->bits + (size_t)rank * chunk / 8 : malloc(chunk / 8);
        ok = w->in[k] != NULL;
    }
    if (!ok) {
        work_free(w, ef->nodes);
        return NULL;
    }
    ef->work = w;
    return w;
}

void obd_ef_path(const char *dir, const char *job, uint64_t key, char *buf,
                 size_t len)
{
    /* The job name is in the header; the file name only needs to be
     * unique and safe, so it carries a hash of the name. */
    uint64_t h = obcomm_hash_fnv1a_str(OBCOMM_HASH_FNV1A_INIT, job);
    snprintf(buf, len, "%s/ef-%016llx-%016llx.lz4", dir, (unsigned long long)h,
             (unsigned long long)key);
}

/* 0, or -1 with errno set. */
static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* 0, or -1 with errno set; the bytes also go into the digest. */
static int write_hashed(int fd, crypto_generichash_state *hs, const void *buf,
                        size_t len)
{
    crypto_generichash_update(hs, buf, len);
    return write_all(fd, buf, len);
}

int obd_ef_write(const char *path, const struct obd_ef *ef,
                 const struct obd_ef_world *w, const struct obd_ef_set *set,
                 uint8_t *digest, char *why, size_t whylen)
{
    struct ef_hdr h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, EF_MAGIC, sizeof(EF_MAGIC));
    h.version = EF_VERSION;
    h.byte_order = EF_ORDER;
    h.nodes = w->nodes;
    h.rank = w->rank;
    h.fingerprint = w->fingerprint;
    h.key = ef->key;
    h.count = ef->count;
    h.padded = ef->padded;
    strcpy(h.job, ef->job);
    h.run = set->run;
    h.set = set->id;
    crypto_generichash_state hs;
    crypto_generichash_init(&hs, NULL, 0, OBD_EF_DIGEST_BYTES);

    /* The header, then each state's error, formed chunk by chunk into a
     * staging buffer (the file holds errors, whatever the mode). */
    const struct {
        const void *p; /* NULL: state part - 1 */
        int part;
        size_t len;
    } parts[] = {
        {&h, 0, sizeof(h)},
        {NULL, 0, ef->padded * sizeof(float)},
        {NULL, 1, ef->padded / (size_t)ef->nodes * sizeof(float)},
    };
    LZ4F_preferences_t prefs;
    memset(&prefs, 0, sizeof(prefs));
    prefs.frameInfo.contentChecksumFlag = LZ4F_contentChecksumEnabled;
    prefs.frameInfo.blockChecksumFlag = LZ4F_blockChecksumEnabled;
    prefs.frameInfo.contentSize =
        sizeof(h) +
        (unsigned long long)(ef->padded + ef->padded / (size_t)ef->nodes) *
            sizeof(float);

    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    size_t cap = LZ4F_compressBound(IO_CHUNK, &prefs) + LZ4F_HEADER_SIZE_MAX;
    char *out = malloc(cap);
    float *stage = malloc(IO_CHUNK);
    LZ4F_cctx *cctx = NULL;
    int rc = 0;
    /* A temporary file left by a crash is removed first; a symlink or any
     * other name planted in its place is never followed nor written
     * through (O_NOFOLLOW | O_EXCL: the open fails instead). */
    (void)unlink(tmp);
    int fd =
        open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || out == NULL || stage == NULL ||
        LZ4F_isError(LZ4F_createCompressionContext(&cctx, LZ4F_VERSION))) {
        rc = OBD_E_IO;
        snprintf(why, whylen, "%s: %s", tmp,
                 fd < 0 ? strerror(errno) : "out of memory");
        goto out;
    }

    size_t n = LZ4F_compressBegin(cctx, out, cap, &prefs);
    if (LZ4F_isError(n) || write_hashed(fd, &hs, out, n) != 0)
        goto io;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        const char *p = parts[i].p;
        for (size_t off = 0; off < parts[i].len; off += IO_CHUNK) {
            size_t len =
                parts[i].len - off < IO_CHUNK ? parts[i].len - off : IO_CHUNK;
            const void *src = stage;
            if (p != NULL)
                src = p + off;
            else {
                obd_ef_error(ef, parts[i].part, stage, off / sizeof(float),
                             (off + len) / sizeof(float));
            }
            n = LZ4F_compressUpdate(cctx, out, cap, src, len, NULL);
            if (LZ4F_isError(n) || write_hashed(fd, &hs, out, n) != 0)
                goto io;
        }
    }
    n = LZ4F_compressEnd(cctx, out, cap, NULL);
    if (LZ4F_isError(n) || write_hashed(fd, &hs, out, n) != 0 || fsync(fd) != 0)
        goto io;
    close(fd);
    fd = -1;
    if (rename(tmp, path) != 0) {
        rc = OBD_E_IO;
        snprintf(why, whylen, "rename %s: %s", path, strerror(errno));
        unlink(tmp);
    } else if (digest != NULL) {
        crypto_generichash_final(&hs, digest, OBD_EF_DIGEST_BYTES);
    }
    goto out;

io: /* n is an LZ4F error, or a write or the fsync set errno */
    rc = OBD_E_IO;
    snprintf(why, whylen, "%s: %s", tmp,
             LZ4F_isError(n) ? LZ4F_getErrorName(n) : strerror(errno));
    unlink(tmp);
out:
    if (fd >= 0)
        close(fd);
    LZ4F_freeCompressionContext(cctx);
    free(out);
    free(stage);
    return rc;
}

/* Decompressed content goes to three places in turn: the header, then the
 * worker error, then the server error; the targets are known only once
 * the header has been read and checked. */
struct sink {
    struct ef_hdr h;
    struct obd_ef *ef;
    uint64_t done; /* content bytes placed */
};

static uint8_t *sink_at(struct sink *s, size_t *room)
{
    uint64_t werr_end = sizeof(s->h) + (uint64_t)s->ef->padded * 4;
    if (s->done < sizeof(s->h)) {
        *room = sizeof(s->h) - s->done;
        return (uint8_t *)&s->h + s->done;
    }
    if (s->done < werr_end) {
        *room = werr_end - s->done;
        return (uint8_t *)s->ef->werr + (s->done - sizeof(s->h));
    }
    *room = werr_end + (uint64_t)s->ef->padded / s->ef->nodes * 4 - s->done;
    return (uint8_t *)s->ef->serr + (s->done - werr_end);
}

int obd_ef_read(const char *path, const struct obd_ef_world *w,
                const struct obd_ef_set *set, uint64_t max_bytes,
                struct obd_ef **out, uint8_t *digest, char *why, size_t whylen)
{
    /* O_NONBLOCK: a FIFO named like a snapshot must not block the daemon
     * in open; obd_ef_read_fd's fstat then keeps everything but a regular
     * file out. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) {
        snprintf(why, whylen, "%s: %s", path, strerror(errno));
        return OBD_E_IO;
    }
    int rc =
        obd_ef_read_fd(fd, path, w, set, max_bytes, out, digest, why, whylen);
    close(fd);
    return rc;
}

int obd_ef_read_fd(int fd, const char *path, const struct obd_ef_world *w,
                   const struct obd_ef_set *set, uint64_t max_bytes,
                   struct obd_ef **out, uint8_t *digest, char *why,
                   size_t whylen)
{
    crypto_generichash_state hs;
    crypto_generichash_init(&hs, NULL, 0, OBD_EF_DIGEST_BYTES);
    int rc = OBD_E_CORRUPT;
    struct sink s;
    memset(&s, 0, sizeof(s));
    struct obd_ef hdr_only = {.padded = 0, .nodes = 1};
    s.ef = &hdr_only;
    LZ4F_dctx *dctx = NULL;
    uint8_t *in = malloc(IO_CHUNK);
    uint8_t *stage = malloc(IO_CHUNK);
    int frame_done = 0, header_checked = 0;
    struct stat st;
    if (in == NULL || stage == NULL ||
        LZ4F_isError(LZ4F_createDecompressionContext(&dctx, LZ4F_VERSION))) {
        snprintf(why, whylen, "%s: out of memory", path);
        rc = OBD_E_IO;
        goto out;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, whylen, "%s: not a regular file", path);
        rc = OBD_E_IO;
        goto out;
    }

    for (;;) {
        ssize_t got = read(fd, in, IO_CHUNK);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            snprintf(why, whylen, "%s: %s", path, strerror(errno));
            rc = OBD_E_IO;
            goto out;
        }
        if (got == 0)
            break;
        crypto_generichash_update(&hs, in, (size_t)got);
        size_t off = 0;
        if (!header_checked) {
            /* obd_ef_write always sets the content checksum; without one a
             * damaged file could not be told from an intact one. The whole
             * frame header is in the first read (or the file is shorter). */
            LZ4F_frameInfo_t fi;
            size_t hlen = (size_t)got;
            size_t hint = LZ4F_getFrameInfo(dctx, &fi, in, &hlen);
            if (LZ4F_isError(hint) || fi.frameType != LZ4F_frame ||
                fi.contentChecksumFlag != LZ4F_contentChecksumEnabled) {
                snprintf(why, whylen,
                         "%s: not an LZ4 frame with a content checksum", path);
                goto out;
            }
            off = hlen;
            header_checked = 1;
        }
        while (off < (size_t)got) {
            /* One frame and nothing after it: a second frame's content
             * would be taken without its end being checked. */
            if (frame_done) {
                snprintf(why, whylen, "%s: data after the end of the snapshot",
                         path);
                goto out;
            }
            size_t src_len = (size_t)got - off, dst_len = IO_CHUNK;
            size_t hint = LZ4F_decompress(dctx, stage, &dst_len, in + off,
                                          &src_len, NULL);
            if (LZ4F_isError(hint)) {
                snprintf(why, whylen, "%s: not an intact snapshot (lz4: %s)",
                         path, LZ4F_getErrorName(hint));
                goto out;
            }
            off += src_len;
            for (size_t used = 0; used < dst_len;) {
                if (s.done >= sizeof(s.h) && s.ef == &hdr_only) {
                    snprintf(why, whylen,
                             "%s: content beyond the header "
                             "before it was checked",
                             path);
                    goto out;
                }
                size_t room;
                uint8_t *dst = sink_at(&s, &room);
                if (room == 0) {
                    snprintf(why, whylen, "%s: longer than its header says",
                             path);
                    goto out;
                }
                size_t take = dst_len - used < room ? dst_len - used : room;
                memcpy(dst, stage + used, take);
                used += take;
                s.done += take;

                if (s.done == sizeof(s.h) && s.ef == &hdr_only) {
                    /* Check the header before allocating anything. */
                    struct ef_hdr *h = &s.h;
                    size_t padded =
                        h->nodes ? obd_codec_padded_len(h->count, (int)h->nodes)
                                 : 0;
                    if (memcmp(h->magic, EF_MAGIC, sizeof(EF_MAGIC)) != 0 ||
                        h->version != EF_VERSION || h->byte_order != EF_ORDER ||
                        memchr(h->job, 0, sizeof(h->job)) == NULL ||
                        h->nodes == 0 || h->nodes > 65536 || padded == 0 ||
                        padded != h->padded || h->padded > max_bytes / 4) {
                        snprintf(why, whylen,
                                 "%s: header is not that of an obcomm "
                                 "snapshot of version %d",
                                 path, EF_VERSION);
                        goto out;
                    }
                    if (h->nodes != w->nodes || h->rank != w->rank ||
                        h->fingerprint != w->fingerprint) {
                        snprintf(why, whylen,
                                 "%s: written by rank %u of a %u-node world "
                                 "(fingerprint %016llx), this is rank %u of "
                                 "%u (%016llx)",
                                 path, h->rank, h->nodes,
                                 (unsigned long long)h->fingerprint, w->rank,
                                 w->nodes, (unsigned long long)w->fingerprint);
                        rc = OBD_E_OTHER_WORLD;
                        goto out;
                    }
                    if (set != NULL &&
                        (h->run != set->run || h->set != set->id)) {
                        snprintf(why, whylen,
                                 "%s: a file of set %016llx of run %016llx, "
                                 "not of set %016llx of run %016llx",
                                 path, (unsigned long long)h->set,
                                 (unsigned long long)h->run,
                                 (unsigned long long)set->id,
                                 (unsigned long long)set->run);
                        goto out;
                    }
                    s.ef = obd_ef_new(h->job, h->key, h->count, (int)h->nodes);
                    if (s.ef == NULL) {
                        s.ef = &hdr_only;
                        snprintf(why, whylen, "%s: out of memory", path);
                        rc = OBD_E_IO;
                        goto out;
                    }
                }
            }
            if (hint == 0)
                frame_done = 1;
        }
    }

    size_t room = 0;
    if (s.ef != &hdr_only)
        sink_at(&s, &room);
    if (!frame_done || s.ef == &hdr_only || room != 0) {
        snprintf(why, whylen, "%s: truncated snapshot", path);
        goto out;
    }
    obd_ef_restored(s.ef);
    if (digest != NULL)
        crypto_generichash_final(&hs, digest, OBD_EF_DIGEST_BYTES);
    *out = s.ef;
    s.ef = &hdr_only;
    rc = 0;
out:
    if (s.ef != &hdr_only)
        obd_ef_free(s.ef);
    LZ4F_freeDecompressionContext(dctx);
    free(in);
    free(stage);
    return rc;
}
