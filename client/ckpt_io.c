#include "ckpt_io.h"

#include <errno.h>
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
