/* What the optimizers' checkpoint files share (adam.c, zoadam.c, lamb.c): fixed
 * little-endian fields, whole reads and writes, and the snapshot of the
 * daemons' error feedback a file names (with this node's part when its
 * daemon keeps no state_dir). */
#ifndef OBC_CKPT_IO_H
#define OBC_CKPT_IO_H

#include <obcomm.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the checkpoints store floats as they lie in memory: add byte swaps"
#endif

static inline void obc_put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}
static inline void obc_put64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static inline uint32_t obc_get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t obc_get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint32_t obc_fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float obc_bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* 0, or OBCOMM_E_IO. */
int obc_write_all(int fd, const void *buf, size_t len);

/* The snapshot a checkpoint names: *snapshot if nonzero (a set taken
 * already, for optimizers saved together), else a new set, which every
 * daemon saves before any file names it. *part is this node's part of it,
 * malloc'd, when the daemon keeps no state_dir (a load after a restart
 * needs it), else NULL. A collective when *snapshot is 0. */
int obc_ckpt_snapshot(obcomm_t *c, uint64_t *snapshot, void **part,
                      size_t *part_bytes);

/* One run of bytes of a file. */
struct obc_piece {
    const void *p;
    size_t len;
};

/* Writes the pieces in order to path through path.tmp.PID, fsync'd and
 * renamed into place: a reader finds the whole file or the old one, and
 * ranks may save to the same path. 0, or OBCOMM_E_IO (nothing left
 * behind). */
int obc_ckpt_write(const char *path, const struct obc_piece *pieces, size_t n);
/* 0, OBCOMM_E_IO, or OBCOMM_E_CORRUPT at an early end of file. */
int obc_read_all(int fd, void *buf, size_t len);

#endif
