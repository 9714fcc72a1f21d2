/* Shared-memory buffers: a sealed memfd per buffer, mapped here and passed
 * to the daemon, which maps the same pages. Collectives name a buffer by id
 * and an offset into it, so tensors never cross the socket. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client.h"

/* Makes room for one more buffer, so that nothing can fail after the
 * daemon has accepted a registration. */
static int reserve(obcomm_t *c)
{
    if (c->nbufs < c->capbufs)
        return 0;
    size_t cap = c->capbufs ? c->capbufs * 2 : 16;
    struct obc_buffer *b = realloc(c->bufs, cap * sizeof(*b));
    if (b == NULL)
        return obc_fail(c, OBCOMM_E_NOMEM, "out of memory");
    c->bufs = b;
    c->capbufs = cap;
    return 0;
}

/* Sends RegisterBuffer with the memfd and waits for the daemon's answer. */
static int register_buffer(obcomm_t *c, uint64_t id, size_t size, int fd)
{
    Obcomm__RegisterBuffer reg = OBCOMM__REGISTER_BUFFER__INIT;
    reg.id = id;
    reg.bytes = size;
    Obcomm__ClientMsg msg = OBCOMM__CLIENT_MSG__INIT;
    msg.body_case = OBCOMM__CLIENT_MSG__BODY_REGISTER;
    msg.register_ = &reg;

    Obcomm__DaemonMsg *reply;
    int rc =
        obc_roundtrip(c, &msg, fd, OBCOMM__DAEMON_MSG__BODY_REGISTER, &reply);
    if (rc < 0)
        return rc;
    const Obcomm__RegisterReply *r = reply->register_;
    if (r->id != id) {
        obc_fail(c, OBCOMM_E_PROTO,
                 "obcommd answered the registration of buffer %llu with "
                 "buffer %llu",
                 (unsigned long long)id, (unsigned long long)r->id);
        rc = obc_kill(c, OBCOMM_E_PROTO);
    } else if (r->status > 0) {
        rc = obc_fail(c, OBCOMM_E_PROTO,
                      "obcommd answered a registration with status %d",
                      (int)r->status);
    } else if (r->status < 0) {
        rc = obc_fail(c, r->status, "obcommd refused buffer %llu: %s",
                      (unsigned long long)id,
                      r->message[0] ? r->message : obcomm_strerror(r->status));
    }
    obcomm__daemon_msg__free_unpacked(reply, NULL);
    return rc;
}

int obcomm_alloc(obcomm_t *c, size_t bytes, void **data)
{
    if (c == NULL || data == NULL)
        return OBCOMM_E_INVAL;
    int rc = obc_check_live(c);
    if (rc < 0)
        return rc;
    if (bytes == 0)
        return obc_fail(c, OBCOMM_E_INVAL, "obcomm_alloc of 0 bytes");

    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (bytes > (size_t)INT64_MAX - page)
        return obc_fail(c, OBCOMM_E_NOMEM,
                        "obcomm_alloc of %zu bytes is "
                        "too large",
                        bytes);
    size_t size = (bytes + page - 1) / page * page;
    rc = reserve(c);
    if (rc < 0)
        return rc;

    /* Sealing the size keeps the daemon safe from a trainer that shrinks
     * the file under its mapping (SIGBUS), and F_SEAL_SEAL keeps anyone
     * from undoing that. */
    int fd = memfd_create("obcomm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return obc_fail(c, -errno, "memfd_create: %s", strerror(errno));
    void *base = MAP_FAILED;
    if (ftruncate(fd, (off_t)size) < 0) {
        rc = obc_fail(c, -errno, "ftruncate of a %zu-byte memfd: %s", size,
                      strerror(errno));
        goto out_fd;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        rc = obc_fail(c, -errno, "sealing a memfd: %s", strerror(errno));
        goto out_fd;
    }
    base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc =
            obc_fail(c, -errno, "mmap of %zu bytes: %s", size, strerror(errno));
        goto out_fd;
    }

    uint64_t id = c->next_buffer_id++;
    rc = register_buffer(c, id, size, fd);
    if (rc < 0)
        goto out_map;

    c->bufs[c->nbufs++] = (struct obc_buffer){id, base, size};
    close(fd);
    *data = base;
    return 0;

out_map:
    munmap(base, size);
out_fd:
    close(fd);
    return rc;
}

/* Tells the daemon to forget the buffer at data and drops it from the
 * handle; unmaps it too unless the caller takes it over (*mapped then
 * gets its mapped size). */
static int release(obcomm_t *c, void *data, const char *who, size_t *mapped)
{
    if (c == NULL)
        return OBCOMM_E_INVAL;
    size_t i;
    for (i = 0; i < c->nbufs; i++)
        if (c->bufs[i].base == data)
            break;
    if (i == c->nbufs)
        return obc_fail(c, OBCOMM_E_NOTREG,
                        "%s: %p is not a buffer from obcomm_alloc", who, data);

    /* The pages are given back even when the daemon is gone: it released
     * its side when the connection dropped. */
    int rc = obc_check_live(c);
    if (rc == 0) {
        Obcomm__ReleaseBuffer rel = OBCOMM__RELEASE_BUFFER__INIT;
        rel.id = c->bufs[i].id;
        Obcomm__ClientMsg msg = OBCOMM__CLIENT_MSG__INIT;
        msg.body_case = OBCOMM__CLIENT_MSG__BODY_RELEASE;
        msg.release = &rel;
        int64_t budget = (int64_t)c->timeout_ms + OBC_GRACE_MS;
        rc = obc_sock_send(c->fd, &msg, -1, obc_now_ms() + budget, budget,
                           c->err, sizeof(c->err));
        if (rc < 0)
            obc_kill(c, rc);
    }
    if (mapped != NULL)
        *mapped = c->bufs[i].size;
    else
        munmap(c->bufs[i].base, c->bufs[i].size);
    c->bufs[i] = c->bufs[--c->nbufs];
    return rc;
}

int obcomm_free(obcomm_t *c, void *data)
{
    return release(c, data, "obcomm_free", NULL);
}

int obcomm_disown(obcomm_t *c, void *data, size_t *mapped)
{
    if (mapped == NULL)
        return c == NULL ? OBCOMM_E_INVAL
                         : obc_fail(c, OBCOMM_E_INVAL,
                                    "obcomm_disown: mapped is NULL");
    /* The pages stay mapped here (MAP_SHARED of a memfd): the daemon's
     * side goes, the caller's stays until it unmaps. */
    return release(c, data, "obcomm_disown", mapped);
}

const struct obc_buffer *obc_buffer_find(const obcomm_t *c, const void *data,
                                         size_t bytes, uint64_t *offset)
{
    uintptr_t p = (uintptr_t)data;
    for (size_t i = 0; i < c->nbufs; i++) {
        const struct obc_buffer *b = &c->bufs[i];
        uintptr_t base = (uintptr_t)b->base;
        if (p >= base && p - base < b->size && bytes <= b->size - (p - base)) {
            *offset = p - base;
            return b;
        }
    }
    return NULL;
}

void obc_buffers_unmap_all(obcomm_t *c)
{
    for (size_t i = 0; i < c->nbufs; i++)
        munmap(c->bufs[i].base, c->bufs[i].size);
    free(c->bufs);
    c->bufs = NULL;
    c->nbufs = c->capbufs = 0;
}
