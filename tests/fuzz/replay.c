/* Replays a seed corpus through one fuzz target without libFuzzer: every
 * file named on the command line, or found (sorted) in a directory named
 * there, is read into a buffer of exactly its size and passed to
 * LLVMFuzzerTestOneInput, so that the normal and the ASan/UBSan builds run
 * every seed and every past crash input on each `meson test`. An empty
 * corpus fails: a missing directory must not pass silently. */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = -1;
    uint8_t *buf = NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size > (64 << 20))
        goto out;
    size_t size = (size_t)st.st_size;
    /* malloc(0) may return NULL; the target still gets a valid pointer. */
    buf = malloc(size ? size : 1);
    if (buf == NULL || fread(buf, 1, size, f) != size)
        goto out;
    LLVMFuzzerTestOneInput(buf, size);
    rc = 0;
out:
    if (rc != 0)
        fprintf(stderr, "%s: cannot read\n", path);
    free(buf);
    fclose(f);
    return rc;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* Returns the number of inputs replayed, or -1. */
static int replay_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode))
        return replay_file(path) == 0 ? 1 : -1;

    struct dirent **names;
    int n = scandir(path, &names, NULL, by_name);
    if (n < 0) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return -1;
    }
    int count = 0;
    for (int i = 0; i < n; i++) {
        char file[4096];
        snprintf(file, sizeof(file), "%s/%s", path, names[i]->d_name);
        if (names[i]->d_name[0] != '.' && stat(file, &st) == 0 &&
            S_ISREG(st.st_mode)) {
            if (count >= 0 && replay_file(file) == 0)
                count++;
            else
                count = -1;
        }
        free(names[i]);
    }
    free(names);
    return count;
}

int main(int argc, char **argv)
{
    int total = 0;
    for (int i = 1; i < argc; i++) {
        int n = replay_path(argv[i]);
        if (n < 0)
            return EXIT_FAILURE;
        printf("%s: %d inputs\n", argv[i], n);
        total += n;
    }
    if (total == 0) {
        fprintf(stderr, "no inputs to replay\n");
        return EXIT_FAILURE;
    }
    printf("replayed %d inputs, no invariant failed\n", total);
    return EXIT_SUCCESS;
}
