#include "err.h"
#include "shm.h"

#include <obcomm.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int obd_shm_map(int fd, uint64_t id, uint64_t bytes, uint64_t max_bytes,
                struct obd_shm **out, char *why, size_t whylen)
{
    int rc = OBD_E_INVAL;
    struct stat st;
    void *base = MAP_FAILED;
    struct obd_shm *b = NULL;

    if (bytes == 0 || bytes > max_bytes) {
        snprintf(why, whylen, "buffer of %llu bytes is outside [1, %llu]",
                 (unsigned long long)bytes, (unsigned long long)max_bytes);
        goto out;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        snprintf(why, whylen,
                 "buffer fd is not a memfd sealed against "
                 "shrinking");
        goto out;
    }
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != bytes) {
        snprintf(why, whylen, "buffer fd has %lld bytes, announced %llu",
                 (long long)st.st_size, (unsigned long long)bytes);
        goto out;
    }
    base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = OBD_E_NOMEM;
        snprintf(why, whylen, "mmap of %llu bytes: %s",
                 (unsigned long long)bytes, strerror(errno));
        goto out;
    }
    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        rc = OBD_E_NOMEM;
        snprintf(why, whylen, "out of memory");
        goto out_unmap;
    }
    b->id = id;
    b->base = base;
    b->size = bytes;
    b->refs = 1;
    *out = b;
    close(fd);
    return 0;

out_unmap:
    munmap(base, bytes);
out:
    close(fd);
    return rc;
}

void obd_shm_ref(struct obd_shm *b)
{
    b->refs++;
}

void obd_shm_unref(struct obd_shm *b)
{
    if (b == NULL || --b->refs > 0)
        return;
    munmap(b->base, b->size);
    free(b);
}

void *obd_shm_range(const struct obd_shm *b, uint64_t offset, uint64_t len)
{
    if (offset > b->size || len > b->size - offset)
        return NULL;
    return (char *)b->base + offset;
}
