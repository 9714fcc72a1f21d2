#include "fuzz.h"

#include <sys/mman.h>
#include <unistd.h>

int fuzz_memfile(const uint8_t *data, size_t size)
{
    static int fd = -1;
    if (fd < 0)
        fd = memfd_create("obd-fuzz", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, 0) != 0)
        return -1;
    size_t off = 0;
    while (off < size) {
        ssize_t n = pwrite(fd, data + off, size - off, (off_t)off);
        if (n <= 0)
            return -1;
        off += (size_t)n;
    }
    if (lseek(fd, 0, SEEK_SET) != 0)
        return -1;
    return fd;
}
