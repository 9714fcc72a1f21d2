/* Collectives: each call is one Submit naming registered buffers by id and
 * offset, answered by one Complete carrying the same sequence number
 * (request.c). The daemon does the work on the shared pages. A blocking
 * call is the non-blocking one followed by its wait. */
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

/* Locates [data, data+bytes) in a registered buffer: *id and *offset name
 * it for the daemon. `what` names the argument in the error. */
static int place(obcomm_t *c, const char *what, const void *data, size_t bytes,
                 uint64_t *id, uint64_t *offset)
{
    const struct obc_buffer *b = obc_buffer_find(c, data, bytes, offset);
    if (b == NULL)
        return obc_fail(c, OBCOMM_E_NOTREG,
                        "%s [%p, +%zu bytes) is not inside one buffer from "
                        "obcomm_alloc",
                        what, data, bytes);
    *id = b->id;
    return 0;
}

/* The checks every op starts with. */
static int usable(obcomm_t *c)
{
    if (c == NULL)
        return OBCOMM_E_INVAL;
    return obc_check_live(c);
}

static int check_dtype(obcomm_t *c, obcomm_dtype_t dtype)
{
    if (dtype_size(dtype) == 0)
        return obc_fail(c, OBCOMM_E_INVAL, "unknown dtype %d", (int)dtype);
    return 0;
}

static int check_redop(obcomm_t *c, obcomm_op_t op)
{
    if (op != OBCOMM_SUM && op != OBCOMM_AVG && op != OBCOMM_MAX &&
        op != OBCOMM_MIN)
        return obc_fail(c, OBCOMM_E_INVAL, "unknown reduction %d", (int)op);
    return 0;
}

/* Each prepare_* checks an op's arguments as obcommd does at submission,
 * naming the one that is wrong, and fills in its Submit. Nothing is sent
 * and no seq is taken for a refused op, so the job goes on. */

static int prepare_allreduce(obcomm_t *c, Obcomm__Submit *s, void *data,
                             size_t count, obcomm_dtype_t dtype, obcomm_op_t op)
{
    int rc = usable(c);
    if (rc == 0)
        rc = check_dtype(c, dtype);
    if (rc == 0)
        rc = check_redop(c, op);
    if (rc < 0)
        return rc;
    size_t esize = dtype_size(dtype);
    if (count == 0)
        return obc_fail(c, OBCOMM_E_INVAL, "allreduce of 0 elements");
    if (count > SIZE_MAX / esize)
        return obc_fail(c, OBCOMM_E_INVAL,
                        "allreduce of %zu elements overflows", count);
    s->kind = OBCOMM_KIND_ALLREDUCE;
    s->dtype = (uint32_t)dtype;
    s->redop = (uint32_t)op;
    s->count = count;
    return place(c, "data", data, count * esize, &s->buffer_id, &s->offset);
}

static int prepare_allreduce_1bit(obcomm_t *c, Obcomm__Submit *s, uint64_t key,
                                  float *data, size_t count)
{
    int rc = usable(c);
    if (rc < 0)
        return rc;
    if (count == 0)
        return obc_fail(c, OBCOMM_E_INVAL, "1-bit allreduce of 0 elements");
    if (count > SIZE_MAX / sizeof(float))
        return obc_fail(c, OBCOMM_E_INVAL,
                        "1-bit allreduce of %zu elements overflows", count);
    s->kind = OBCOMM_KIND_ALLREDUCE_1BIT;
    s->dtype = OBCOMM_FLOAT32;
    s->redop = OBCOMM_AVG;
    s->count = count;
    s->key = key;
    return place(c, "data", data, count * sizeof(float), &s->buffer_id,
                 &s->offset);
}

static int prepare_broadcast(obcomm_t *c, Obcomm__Submit *s, void *data,
                             size_t bytes, int root)
{
    int rc = usable(c);
    if (rc < 0)
        return rc;
    if (bytes == 0)
        return obc_fail(c, OBCOMM_E_INVAL, "broadcast of 0 bytes");
    if (root < 0 || root >= obcomm_size(c))
        return obc_fail(c, OBCOMM_E_INVAL, "broadcast root %d not in [0, %d)",
                        root, obcomm_size(c));
    s->kind = OBCOMM_KIND_BROADCAST;
    s->count = bytes;
    s->root = root;
    return place(c, "data", data, bytes, &s->buffer_id, &s->offset);
}

/* Allgather and reduce-scatter: `count` elements of dtype per rank, so
 * `whole` = world * count elements in the buffer that holds every rank's
 * part (recv for allgather, send for reduce-scatter). */
static int prepare_parts(obcomm_t *c, Obcomm__Submit *s, const char *name,
                         uint32_t kind, const void *send, void *recv,
                         size_t count, obcomm_dtype_t dtype, obcomm_op_t op)
{
    int rc = usable(c);
    if (rc == 0)
        rc = check_dtype(c, dtype);
    if (rc == 0 && kind == OBCOMM_KIND_REDUCE_SCATTER)
        rc = check_redop(c, op);
    if (rc < 0)
        return rc;
    size_t esize = dtype_size(dtype), world = (size_t)obcomm_size(c);
    if (count == 0)
        return obc_fail(c, OBCOMM_E_INVAL, "%s of 0 elements", name);
    if (count > SIZE_MAX / esize / world)
        return obc_fail(c, OBCOMM_E_INVAL,
                        "%s of %zu elements per rank overflows (%zu ranks)",
                        name, count, world);
    size_t part = count * esize, whole = part * world;
    int gather = kind == OBCOMM_KIND_ALLGATHER;
    s->kind = kind;
    s->dtype = (uint32_t)dtype;
    s->redop = gather ? 0 : (uint32_t)op;
    s->count = count;
    rc = place(c, "send", send, gather ? part : whole, &s->buffer_id,
               &s->offset);
    if (rc == 0)
        rc = place(c, "recv", recv, gather ? whole : part, &s->recv_buffer_id,
                   &s->recv_offset);
    return rc;
}

static int submit_no_data(obcomm_t *c, uint32_t kind, uint64_t key,
                          uint64_t *value, uint64_t *bytes)
{
    int rc = usable(c);
    if (rc < 0)
        return rc;
    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    s.kind = kind;
    s.key = key;
    return obc_run(c, &s, value, bytes);
}

/* The non-blocking calls send what the blocking ones would; req is written
 * only on success. */
static int start(obcomm_t *c, int rc, Obcomm__Submit *s, obcomm_request_t **req)
{
    if (rc < 0)
        return rc;
    if (req == NULL)
        return obc_fail(c, OBCOMM_E_INVAL, "req is NULL");
    return obc_submit(c, s, req);
}

int obcomm_allreduce(obcomm_t *c, void *data, size_t count,
                     obcomm_dtype_t dtype, obcomm_op_t op)
{
    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    int rc = prepare_allreduce(c, &s, data, count, dtype, op);
    return rc < 0 ? rc : obc_run(c, &s, NULL, NULL);
}

int obcomm_iallreduce(obcomm_t *c, void *data, size_t count,
                      obcomm_dtype_t dtype, obcomm_op_t op,
                      obcomm_request_t **req)
{
    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    return start(c, prepare_allreduce(c, &s, data, count, dtype, op), &s, req);
}

int obcomm_allreduce_1bit(obcomm_t *c, uint64_t key, float *data, size_t count)
{
    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    int rc = prepare_allreduce_1bit(c, &s, key, data, count);
    return rc < 0 ? rc : obc_run(c, &s, NULL, NULL);
}

int obcomm_iallreduce_1bit(obcomm_t *c, uint64_t key, float *data, size_t count,
                           obcomm_request_t **req)
{
    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    return start(c, prepare_allreduce_1bit(c, &s, key, data, count), &s, req);
}

int obcomm_broadcast(obcomm_t *c, void *data, size_t bytes, int root)
{
    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    int rc = prepare_broadcast(c, &s, data, bytes, root);
    return rc < 0 ? rc : obc_run(c, &s, NULL, NULL);
}

int obcomm_ibroadcast(obcomm_t *c, void *data, size_t bytes, int root,
                      obcomm_request_t **req)
{
    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    return start(c, prepare_broadcast(c, &s, data, bytes, root), &s, req);
}

int obcomm_allgather(obcomm_t *c, const void *send, void *recv, size_t count,
                     obcomm_dtype_t dtype)
{
    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    int rc = prepare_parts(c, &s, "allgather", OBCOMM_KIND_ALLGATHER, send,
                           recv, count, dtype, OBCOMM_SUM);
    return rc < 0 ? rc : obc_run(c, &s, NULL, NULL);
}

int obcomm_iallgather(obcomm_t *c, const void *send, void *recv, size_t count,
                      obcomm_dtype_t dtype, obcomm_request_t **req)
{
    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    return start(c,
                 prepare_parts(c, &s, "allgather", OBCOMM_KIND_ALLGATHER, send,
                               recv, count, dtype, OBCOMM_SUM),
                 &s, req);
}

int obcomm_reduce_scatter(obcomm_t *c, const void *send, void *recv,
                          size_t recv_count, obcomm_dtype_t dtype,
                          obcomm_op_t op)
{
    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    int rc = prepare_parts(c, &s, "reduce-scatter", OBCOMM_KIND_REDUCE_SCATTER,
                           send, recv, recv_count, dtype, op);
    return rc < 0 ? rc : obc_run(c, &s, NULL, NULL);
}

int obcomm_ireduce_scatter(obcomm_t *c, const void *send, void *recv,
                           size_t recv_count, obcomm_dtype_t dtype,
                           obcomm_op_t op, obcomm_request_t **req)
{
    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    return start(c,
                 prepare_parts(c, &s, "reduce-scatter",
                               OBCOMM_KIND_REDUCE_SCATTER, send, recv,
                               recv_count, dtype, op),
                 &s, req);
}

int obcomm_barrier(obcomm_t *c)
{
    return submit_no_data(c, OBCOMM_KIND_BARRIER, 0, NULL, NULL);
}

int obcomm_ibarrier(obcomm_t *c, obcomm_request_t **req)
{
    Obcomm__Submit s = OBCOMM__SUBMIT__INIT;
    s.kind = OBCOMM_KIND_BARRIER;
    return start(c, usable(c), &s, req);
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
    rc = place(c, "data", shm, bytes, &s->buffer_id, &s->offset);
    if (rc == 0)
        rc = obc_run(c, s, NULL, NULL);
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
