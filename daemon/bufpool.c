#include "bufpool.h"

#include <stdlib.h>

void *obd_bufpool_scratch_get(struct obd_bufpool *p, size_t bytes, size_t *cap)
{
    if (p->scratch != NULL && p->scratch_bytes >= bytes) {
        void *buf = p->scratch;
        *cap = p->scratch_bytes;
        p->scratch = NULL;
        return buf;
    }
    size_t n = bytes ? bytes : 1;
    void *buf = malloc(n);
    if (buf != NULL)
        *cap = n;
    return buf;
}

void obd_bufpool_scratch_put(struct obd_bufpool *p, void *buf, size_t cap)
{
    if (buf == NULL)
        return;
    if (p->scratch == NULL || p->scratch_bytes < cap) {
        free(p->scratch);
        p->scratch = buf;
        p->scratch_bytes = cap;
    } else {
        free(buf);
    }
}

void *obd_bufpool_segbuf_get(struct obd_bufpool *p, struct obd_metrics *m,
                             size_t bytes)
{
    if (p->nsegbufs > 0 && p->segbuf_bytes == bytes)
        return p->segbufs[--p->nsegbufs];
    obd_metric_add(m, OBD_M_SEGBUFS_ALLOCATED, 1);
    return malloc(bytes ? bytes : 1);
}

void obd_bufpool_segbuf_put(struct obd_bufpool *p, void *buf, size_t bytes)
{
    if (buf == NULL)
        return;
    if (p->segbuf_bytes != bytes) {
        /* Another dtype's segments (segment_bytes is not a multiple of
         * every element size): the newest size wins. */
        while (p->nsegbufs > 0)
            free(p->segbufs[--p->nsegbufs]);
        p->segbuf_bytes = bytes;
    }
    if (p->nsegbufs == 0 ||
        (p->nsegbufs < OBD_SEGBUFS_KEPT &&
         (size_t)(p->nsegbufs + 1) * bytes <= OBD_SEGBUFS_KEPT_BYTES))
        p->segbufs[p->nsegbufs++] = buf;
    else
        free(buf);
}

void obd_bufpool_fini(struct obd_bufpool *p)
{
    free(p->scratch);
    p->scratch = NULL;
    while (p->nsegbufs > 0)
        free(p->segbufs[--p->nsegbufs]);
}
