#include "rawclient.h"

#include <obcomm.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ops.h"
#include "sock.h"
#include "wire.h"

int raw_send(struct raw *r, Obcomm__ClientMsg *m, int pass_fd)
{
    return obc_sock_send(r->fd, m, pass_fd, obc_now_ms() + 10000, 10000, r->err,
                         sizeof(r->err));
}

Obcomm__DaemonMsg *raw_recv(struct raw *r, int wait_ms)
{
    Obcomm__DaemonMsg *d = NULL;
    if (obc_sock_recv(r->fd, obc_now_ms() + wait_ms, wait_ms, &d, r->err,
                      sizeof(r->err)) != 0)
        return NULL;
    return d;
}

int raw_open(struct raw *r, const char *sock)
{
    r->fd = obc_sock_connect(sock, r->err, sizeof(r->err));
    return r->fd < 0 ? r->fd : 0;
}

int raw_join(struct raw *r, const char *sock, const char *job, int lr, int ls,
             int timeout_ms)
{
    int rc = raw_open(r, sock);
    if (rc < 0)
        return rc;
    Obcomm__Join j = OBCOMM__JOIN__INIT;
    j.proto_version = OBCOMM_PROTO_VERSION;
    j.job = (char *)job;
    j.local_rank = (uint32_t)lr;
    j.local_size = (uint32_t)ls;
    j.timeout_ms = (uint32_t)timeout_ms;
    Obcomm__ClientMsg m = OBCOMM__CLIENT_MSG__INIT;
    m.body_case = OBCOMM__CLIENT_MSG__BODY_JOIN;
    m.join = &j;
    rc = raw_send(r, &m, -1);
    if (rc < 0)
        return rc;
    Obcomm__DaemonMsg *d = raw_recv(r, 10000);
    if (d == NULL)
        return OBCOMM_E_NOTCONN;
    rc = d->body_case == OBCOMM__DAEMON_MSG__BODY_JOIN ? d->join->status
                                                       : OBCOMM_E_PROTO;
    obcomm__daemon_msg__free_unpacked(d, NULL);
    return rc;
}

int raw_register(struct raw *r, size_t bytes, float **base)
{
    int mfd = memfd_create("lifetime", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (mfd < 0 || ftruncate(mfd, (off_t)bytes) < 0 ||
        fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
        return -errno;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (p == MAP_FAILED)
        return -errno;
    Obcomm__RegisterBuffer reg = OBCOMM__REGISTER_BUFFER__INIT;
    reg.id = 1;
    reg.bytes = bytes;
    Obcomm__ClientMsg m = OBCOMM__CLIENT_MSG__INIT;
    m.body_case = OBCOMM__CLIENT_MSG__BODY_REGISTER;
    m.register_ = &reg;
    int rc = raw_send(r, &m, mfd);
    close(mfd);
    Obcomm__DaemonMsg *d = NULL;
    if (rc == 0 && (d = raw_recv(r, 10000)) == NULL)
        rc = OBCOMM_E_NOTCONN;
    if (rc == 0) {
        rc = d->body_case == OBCOMM__DAEMON_MSG__BODY_REGISTER
                 ? d->register_->status
                 : OBCOMM_E_PROTO;
        obcomm__daemon_msg__free_unpacked(d, NULL);
    }
    *base = p;
    return rc;
}

int raw_submit(struct raw *r, uint64_t seq, unsigned kind, uint64_t count,
               uint64_t key)
{
    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    s.seq = seq;
    s.kind = kind;
    s.count = count;
    s.buffer_id = 1;
    switch (kind) {
    case OBCOMM_KIND_ALLREDUCE:
        s.dtype = OBCOMM_FLOAT32;
        s.redop = OBCOMM_SUM;
        break;
    case OBCOMM_KIND_ALLREDUCE_1BIT:
        s.dtype = OBCOMM_FLOAT32;
        s.redop = OBCOMM_AVG;
        s.key = key;
        break;
    case OBCOMM_KIND_BROADCAST: /* root 0 */
        break;
    default: /* barrier: no buffer */
        s.buffer_id = 0;
        s.count = 0;
    }
    Obcomm__ClientMsg m = OBCOMM__CLIENT_MSG__INIT;
    m.body_case = OBCOMM__CLIENT_MSG__BODY_SUBMIT;
    m.submit = &s;
    return raw_send(r, &m, -1);
}

int raw_release(struct raw *r)
{
    Obcomm__ReleaseBuffer rel = OBCOMM__RELEASE_BUFFER__INIT;
    rel.id = 1;
    Obcomm__ClientMsg m = OBCOMM__CLIENT_MSG__INIT;
    m.body_case = OBCOMM__CLIENT_MSG__BODY_RELEASE;
    m.release = &rel;
    return raw_send(r, &m, -1);
}
