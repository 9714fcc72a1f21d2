#include "ckpt_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int obc_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return OBCOMM_E_IO;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int obc_read_all(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return OBCOMM_E_IO;
        if (n == 0)
            return OBCOMM_E_CORRUPT;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int obc_ckpt_snapshot(obcomm_t *c, uint64_t *snapshot, void **part,
                      size_t *part_bytes)
{
    *part = NULL;
    *part_bytes = 0;
    int rc = *snapshot ? 0 : obcomm_save_1bit(c, snapshot);
    if (rc == 0 && !obcomm_1bit_durable(c))
        rc = obcomm_export_1bit(c, *snapshot, part, part_bytes);
    return rc;
}

int obc_ckpt_write(const char *path, const struct obc_piece *pieces, size_t n)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >=
        (int)sizeof(tmp))
        return OBCOMM_E_IO;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return OBCOMM_E_IO;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = obc_write_all(fd, pieces[i].p, pieces[i].len);
    if (rc == 0 && fsync(fd) != 0)
        rc = OBCOMM_E_IO;
    if (close(fd) != 0 && rc == 0)
        rc = OBCOMM_E_IO;
    if (rc == 0 && rename(tmp, path) != 0)
        rc = OBCOMM_E_IO;
    if (rc)
        unlink(tmp);
    return rc;
}
