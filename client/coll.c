/* Collectives: each call is one Submit naming a registered buffer by id and
 * offset, answered by one Complete carrying the same sequence number. The
 * daemon does the work on the shared pages. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "ops.h"

static size_t dtype_size(obcomm_dtype_t t)
{
    switch (t) {
    case OBCOMM_FLOAT16:
    case OBCOMM_BFLOAT16:
        return 2;
    case OBCOMM_FLOAT32:
    case OBCOMM_INT32:
        return 4;
    case OBCOMM_FLOAT64:
    case OBCOMM_INT64:
        return 8;
    }
    return 0;
}

/* Locates [data, data+bytes) in a registered buffer and fills in the
 * Submit's buffer_id and offset. */
static int place(obcomm_t *c, Obcomm__Submit *s, const void *data, size_t bytes)
{
    uint64_t offset;
    const struct obc_buffer *b = obc_buffer_find(c, data, bytes, &offset);
    if (b == NULL)
        return obc_fail(c, OBCOMM_E_NOTREG,
                        "[%p, +%zu bytes) is not inside one buffer from "
                        "obcomm_alloc",
                        data, bytes);
    s->buffer_id = b->id;
    s->offset = offset;
    return 0;
}

/* Submits one op and waits for its Complete; *value (if not NULL) gets
 * the Complete's value on success. Sequence numbers count every op sent,
 * so they stay equal across the ranks of a job; an op refused locally
 * before sending does not take one. */
static int submit_value(obcomm_t *c, Obcomm__Submit *s, uint64_t *value,
                        uint64_t *bytes)
{
    s->seq = c->next_seq++;
    Obcomm__ClientMsg msg = OBCOMM__CLIENT_MSG__INIT;
    msg.body_case = OBCOMM__CLIENT_MSG__BODY_SUBMIT;
    msg.submit = s;

    Obcomm__DaemonMsg *reply;
    int rc =
        obc_roundtrip(c, &msg, -1, OBCOMM__DAEMON_MSG__BODY_COMPLETE, &reply);
    if (rc < 0)
        return rc;
    const Obcomm__Complete *done = reply->complete;
    if (done->seq != s->seq) {
        obc_fail(c, OBCOMM_E_PROTO,
                 "expected the completion of op %llu, obcommd completed op "
                 "%llu",
                 (unsigned long long)s->seq, (unsigned long long)done->seq);
        rc = obc_kill(c, OBCOMM_E_PROTO);
    } else if (done->status > 0) {
        rc = obc_fail(c, OBCOMM_E_PROTO,
                      "obcommd completed op %llu with status %d",
                      (unsigned long long)s->seq, (int)done->status);
    } else if (done->status < 0) {
        rc = obc_fail(c, done->status, "%s",
                      done->message[0] ? done->message
                                       : obcomm_strerror(done->status));
    } else {
        if (value != NULL)
            *value = done->value;
        if (bytes != NULL)
            *bytes = done->bytes;
    }
    obcomm__daemon_msg__free_unpacked(reply, NULL);
    return rc;
}

static int submit(obcomm_t *c, Obcomm__Submit *s)
{
    return submit_value(c, s, NULL, NULL);
}

int obcomm_allreduce(obcomm_t *c, void *data, size_t count,
                     obcomm_dtype_t dtype, obcomm_op_t op)
{
    if (c == NULL)
        return OBCOMM_E_INVAL;
    int rc = obc_check_live(c);
    if (rc < 0)
        return rc;
    size_t esize = dtype_size(dtype);
    if (esize == 0)
        return obc_fail(c, OBCOMM_E_INVAL, "unknown dtype %d", (int)dtype);
    if (op != OBCOMM_SUM && op != OBCOMM_AVG && op != OBCOMM_MAX &&
        op != OBCOMM_MIN)
        return obc_fail(c, OBCOMM_E_INVAL, "unknown reduction %d", (int)op);
    if (count == 0)
        return obc_fail(c, OBCOMM_E_INVAL, "allreduce of 0 elements");
    if (count > SIZE_MAX / esize)
        return obc_fail(c, OBCOMM_E_INVAL,
                        "allreduce of %zu elements overflows", count);

    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    s.kind = OBCOMM_KIND_ALLREDUCE;
    s.dtype = (uint32_t)dtype;
    s.redop = (uint32_t)op;
    s.count = count;
    rc = place(c, &s, data, count * esize);
    if (rc < 0)
        return rc;
    return submit(c, &s);
}

int obcomm_broadcast(obcomm_t *c, void *data, size_t bytes, int root)
{
    if (c == NULL)
        return OBCOMM_E_INVAL;
    int rc = obc_check_live(c);
    if (rc < 0)
        return rc;
    if (bytes == 0)
        return obc_fail(c, OBCOMM_E_INVAL, "broadcast of 0 bytes");
    if (root < 0 || root >= obcomm_size(c))
        return obc_fail(c, OBCOMM_E_INVAL, "broadcast root %d not in [0, %d)",
                        root, obcomm_size(c));

    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    s.kind = OBCOMM_KIND_BROADCAST;
    s.count = bytes;
    s.root = root;
    rc = place(c, &s, data, bytes);
    if (rc < 0)
        return rc;
    return submit(c, &s);
}

/* An op without a buffer: barrier and the 1-bit state ops; *value and
 * *bytes (if not NULL) get the Complete's. */
static int submit_no_data(obcomm_t *c, uint32_t kind, uint64_t key,
                          uint64_t *value, uint64_t *bytes)
{
    if (c == NULL)
        return OBCOMM_E_INVAL;
    int rc = obc_check_live(c);
    if (rc < 0)
        return rc;
    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    s.kind = kind;
    s.key = key;
    return submit_value(c, &s, value, bytes);
}

int obcomm_barrier(obcomm_t *c)
{
    return submit_no_data(c, OBCOMM_KIND_BARRIER, 0, NULL, NULL);
}

int obcomm_allreduce_1bit(obcomm_t *c, uint64_t key, float *data, size_t count)
{
    if (c == NULL)
        return OBCOMM_E_INVAL;
    int rc = obc_check_live(c);
    if (rc < 0)
        return rc;
    if (count == 0)
        return obc_fail(c, OBCOMM_E_INVAL, "1-bit allreduce of 0 elements");
    if (count > SIZE_MAX / sizeof(float))
        return obc_fail(c, OBCOMM_E_INVAL,
                        "1-bit allreduce of %zu elements overflows", count);

    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    s.kind = OBCOMM_KIND_ALLREDUCE_1BIT;
    s.dtype = OBCOMM_FLOAT32;
    s.redop = OBCOMM_AVG;
    s.count = count;
    s.key = key;
    rc = place(c, &s, data, count * sizeof(float));
    if (rc < 0)
        return rc;
    return submit(c, &s);
}

int obcomm_reset_1bit(obcomm_t *c, uint64_t key)
{
    return submit_no_data(c, OBCOMM_KIND_RESET_1BIT, key, NULL, NULL);
}

int obcomm_save_1bit(obcomm_t *c, uint64_t *snapshot)
{
    uint64_t id = 0, bytes = 0;
    int rc = submit_no_data(c, OBCOMM_KIND_SNAPSHOT_1BIT, 0, &id, &bytes);
    if (rc)
        return rc;
    c->part_id = id;
    c->part_bytes = bytes;
    if (snapshot != NULL)
        *snapshot = id;
    return 0;
}

int obcomm_1bit_durable(const obcomm_t *c)
{
    return c != NULL && c->durable;
}

/* Submits s (kind and key set) with a shared buffer of `bytes` bytes as
 * its data: filled from `in` first, copied to `out` on success (either
 * may be NULL). */
static int submit_shm(obcomm_t *c, Obcomm__Submit *s, size_t bytes,
                      const void *in, void *out)
{
    void *shm;
    int rc = obcomm_alloc(c, bytes, &shm);
    if (rc)
        return rc;
    if (in != NULL)
        memcpy(shm, in, bytes);
    s->count = bytes;
    rc = place(c, s, shm, bytes);
    if (rc == 0)
        rc = submit(c, s);
    if (rc == 0 && out != NULL)
        memcpy(out, shm, bytes);
    obcomm_free(c, shm);
    return rc;
}

int obcomm_export_1bit(obcomm_t *c, uint64_t snapshot, void **part,
                       size_t *bytes)
{
    if (c == NULL || part == NULL || bytes == NULL)
        return OBCOMM_E_INVAL;
    if (snapshot == 0 || snapshot != c->part_id)
        return obc_fail(c, OBCOMM_E_INVAL,
                        "snapshot %016llx is not the one this handle saved "
                        "last (%016llx): export right after obcomm_save_1bit",
                        (unsigned long long)snapshot,
                        (unsigned long long)c->part_id);
    if (c->part_bytes > SIZE_MAX)
        return obc_fail(c, OBCOMM_E_NOMEM, "a part of %llu bytes",
                        (unsigned long long)c->part_bytes);
    size_t n = (size_t)c->part_bytes;
    void *copy = malloc(n);
    if (copy == NULL)
        return obc_fail(c, OBCOMM_E_NOMEM, "no memory for a part of %zu bytes",
                        n);
    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    s.kind = OBCOMM_KIND_EXPORT_1BIT;
    s.key = snapshot;
    int rc = submit_shm(c, &s, n, NULL, copy);
    if (rc) {
        free(copy);
        return rc;
    }
    *part = copy;
    *bytes = n;
    return 0;
}

int obcomm_snapshot_1bit(obcomm_t *c)
{
    return obcomm_save_1bit(c, NULL);
}

int obcomm_restore_1bit(obcomm_t *c, uint64_t snapshot)
{
    return obcomm_restore_1bit_part(c, snapshot, NULL, 0);
}

int obcomm_restore_1bit_part(obcomm_t *c, uint64_t snapshot, const void *part,
                             size_t bytes)
{
    if (c == NULL)
        return OBCOMM_E_INVAL;
    if (snapshot == 0)
        return obc_fail(c, OBCOMM_E_INVAL, "snapshot id 0 names no snapshot");
    if (part == NULL || bytes == 0)
        return submit_no_data(c, OBCOMM_KIND_RESTORE_1BIT, snapshot, NULL,
                              NULL);
    int rc = obc_check_live(c);
    if (rc < 0)
        return rc;
    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    s.kind = OBCOMM_KIND_RESTORE_1BIT;
    s.key = snapshot;
    return submit_shm(c, &s, bytes, part, NULL);
}
