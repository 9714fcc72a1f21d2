/* Helpers shared by the benchmark programs (which link different
 * libraries, so they share a header rather than an object). */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <stdio.h>
#include <string.h>
#include <time.h>

/* Milliseconds of the monotonic clock, and of the calling thread's CPU. */
static inline double bench_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline double bench_thread_cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* qsort comparator for medians. */
static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* z[i] = x[i] + y[i] (z may be y): the read-two-write-one floor of a
 * codec pass. Written with 16-byte vectors so that the compiler emits
 * packed loads and stores without -mavx2; one core saturates its memory
 * path with these. */
typedef float bench_v4f __attribute__((vector_size(16)));

static inline void bench_floor_pass(const float *x, const float *y, float *z,
                                    size_t n)
{
    size_t i = 0;

    for (; i + 4 <= n; i += 4) {
        bench_v4f a, c;
        memcpy(&a, x + i, sizeof(a));
        memcpy(&c, y + i, sizeof(c));
        c += a;
        memcpy(z + i, &c, sizeof(c));
    }
    for (; i < n; i++)
        z[i] = x[i] + y[i];
}

/* Bytes sent by network device `dev` so far (/proc/net/dev), or -1. */
static inline long long dev_tx_bytes(const char *dev)
{
    char line[512];
    long long v = -1;
    size_t len = strlen(dev);
    FILE *f = fopen("/proc/net/dev", "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof line, f) != NULL) {
        char *s = line;
        while (*s == ' ')
            s++;
        if (strncmp(s, dev, len) == 0 && s[len] == ':') {
            unsigned long long f9[9];
            if (sscanf(s + len + 1,
                       "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &f9[0],
                       &f9[1], &f9[2], &f9[3], &f9[4], &f9[5], &f9[6], &f9[7],
                       &f9[8]) == 9)
                v = (long long)f9[8];
            break;
        }
    }
    fclose(f);
    return v;
}

/* A list of names separated by commas or spaces ("fp32,allgather"):
 * on[k] = 1 for each names[k] it holds, 0 for the others. Returns 0, or
 * -1 (on[] then undefined) for an unknown name or an empty list. */
static inline int parse_names(const char *s, const char *const *names, int n,
                              int *on)
{
    int any = 0;

    memset(on, 0, (size_t)n * sizeof(*on));
    while (*s != '\0') {
        size_t len = strcspn(s, ", ");
        if (len > 0) {
            int k = 0;
            while (k < n &&
                   (strlen(names[k]) != len || strncmp(s, names[k], len) != 0))
                k++;
            if (k == n)
                return -1;
            on[k] = any = 1;
        }
        s += len + (s[len] != '\0');
    }
    return any ? 0 : -1;
}

#endif
