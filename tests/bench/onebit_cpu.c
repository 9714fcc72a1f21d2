/* onebit_cpu: one trainer of a node for tests/bench/cpu_per_op.sh. Runs
 * WARMUP + REPEATS 1-bit allreduces of COUNT floats (key 1), or with -k
 * avg fp32 allreduces (OBCOMM_AVG), on inputs that are a function of
 * (rank, step, element), and measures its node's daemon:
 * the daemon's CPU time (utime + stime of /proc/PID/stat) over the REPEATS
 * ops, against a memcpy of the tensor timed in the same run (median of 7,
 * in this thread's CPU time, which a loaded machine's preemption does not
 * inflate, like the daemon's utime + stime).
 *
 *   onebit_cpu -s SOCKET -p DAEMON_PID [-n COUNT] [-w WARMUP] [-r REPEATS]
 *              [-L LOCAL_SIZE -l LOCAL_RANK] [-k 1bit|avg] [-x]
 *
 * With several trainers per node (-L), each one runs this program; each
 * reads the same daemon, so their CPU figures are the node's. -x puts a
 * special float every 61st element, a different one on each rank: NaNs
 * of several payloads (signalling ones among them, on several ranks at
 * once), +-Inf, -0.0, subnormals; so that equal hashes also cover which
 * NaN a sum keeps.
 *
 * Output: one JSON line with the daemon's CPU ms per op (and its loop
 * thread's share of it, loop_cpu_ms_per_op), the memcpy ms,
 * their ratio, the wall ms per op (the collective calls only), and an FNV-1a
 * hash over the 64-bit words of every op's result (equal hashes:
 * bit-identical results, e.g. of two daemon builds). */
#include <obcomm.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

/* utime + stime of pid in ms, or with `loop` of its main thread alone
 * (the daemon's loop thread: sockets, frames and hand-offs, not the
 * pool's codec passes); -1 when unreadable. */
static double cpu_ms_of(long pid, int loop)
{
    char path[64], buf[4096];
    if (loop)
        snprintf(path, sizeof(path), "/proc/%ld/task/%ld/stat", pid, pid);
    else
        snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the name may hold spaces */
    unsigned long long ut = 0, st = 0;
    if (p == NULL || sscanf(p + 2,
                            "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
                            "%llu %llu",
                            &ut, &st) != 2)
        return -1;
    return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

static double cpu_ms(long pid)
{
    return cpu_ms_of(pid, 0);
}

static const uint32_t specials[] = {0x7f800001u, 0xff812345u, 0x7fc00123u,
                                    0xffc54321u, 0x7f800000u, 0xff800000u,
                                    0x80000000u, 0x00000001u, 0x807fffffu};

static float input(int rank, int step, size_t i, int special)
{
    if (special && i % 61 == 0) {
        uint32_t u = specials[(i / 61 + (size_t)rank + (size_t)step) %
                              (sizeof(specials) / sizeof(specials[0]))];
        float f;
        memcpy(&f, &u, sizeof(f));
        return f;
    }
    uint64_t h = (uint64_t)(rank + 1) * 0x9e3779b97f4a7c15ull ^
                 (uint64_t)(step + 1) * 0xbf58476d1ce4e5b9ull ^ (uint64_t)i;
    h ^= h >> 31;
    h *= 0xd6e9f8a3c1b2a5f7ull;
    h ^= h >> 29;
    return (float)((double)(h >> 40) / 16777216.0 * 2.0 - 1.0);
}

int main(int argc, char **argv)
{
    const char *sock = NULL;
    long pid = 0;
    size_t count = 16u << 20;
    int warmup = 5, repeats = 20, lsize = 1, lrank = 0, avg = 0, special = 0;
    int opt;
    while ((opt = getopt(argc, argv, "s:p:n:w:r:L:l:k:x")) != -1) {
        switch (opt) {
        case 's':
            sock = optarg;
            break;
        case 'p':
            pid = atol(optarg);
            break;
        case 'n':
            count = strtoull(optarg, NULL, 10);
            break;
        case 'w':
            warmup = atoi(optarg);
            break;
        case 'r':
            repeats = atoi(optarg);
            break;
        case 'L':
            lsize = atoi(optarg);
            break;
        case 'l':
            lrank = atoi(optarg);
            break;
        case 'x':
            special = 1;
            break;
        case 'k':
            avg = strcmp(optarg, "avg") == 0;
            if (avg || strcmp(optarg, "1bit") == 0)
                break;
            /* fall through */
        default:
            fprintf(stderr, "usage: onebit_cpu -s SOCKET -p DAEMON_PID [-n "
                            "COUNT] [-w WARMUP] [-r REPEATS] [-L LOCAL_SIZE "
                            "-l LOCAL_RANK] [-k 1bit|avg] [-x]\n");
            return 2;
        }
    }
    if (pid <= 0 || repeats < 1 || count == 0 || lsize < 1 || lrank < 0 ||
        lrank >= lsize) {
        fprintf(stderr, "onebit_cpu: -p DAEMON_PID is required\n");
        return 2;
    }
    obcomm_options_t o = {.socket_path = sock,
                          .job = "cpu",
                          .local_rank = lrank,
                          .local_size = lsize};
    obcomm_t *c;
    if (obcomm_connect(&o, &c)) {
        fprintf(stderr, "onebit_cpu: connect: %s\n", obcomm_last_error(NULL));
        return 1;
    }
    int rank = obcomm_rank(c);
    float *x, *copy = malloc(count * sizeof(float));
    if (obcomm_alloc(c, count * sizeof(float), (void **)&x) || copy == NULL) {
        fprintf(stderr, "onebit_cpu: alloc\n");
        return 1;
    }
    uint64_t hash = 0xcbf29ce484222325ull;
    double cpu0 = 0, loop0 = 0, wall = 0;
    for (int s = 0; s < warmup + repeats; s++) {
        for (size_t i = 0; i < count; i++)
            x[i] = input(rank, s, i, special);
        if (obcomm_barrier(c)) {
            fprintf(stderr, "onebit_cpu: barrier: %s\n", obcomm_last_error(c));
            return 1;
        }
        if (s == warmup) {
            cpu0 = cpu_ms(pid);
            loop0 = cpu_ms_of(pid, 1);
        }
        double t0 = bench_now_ms();
        if (avg ? obcomm_allreduce(c, x, count, OBCOMM_FLOAT32, OBCOMM_AVG)
                : obcomm_allreduce_1bit(c, 1, x, count)) {
            fprintf(stderr, "onebit_cpu: %s: %s\n", avg ? "allreduce" : "1-bit",
                    obcomm_last_error(c));
            return 1;
        }
        if (s >= warmup)
            wall += bench_now_ms() - t0;
        const uint64_t *w = (const uint64_t *)x;
        for (size_t i = 0; i < count / 2; i++)
            hash = (hash ^ w[i]) * 0x100000001b3ull;
        for (size_t i = count / 2 * 2; i < count; i++) {
            uint32_t v;
            memcpy(&v, &x[i], sizeof(v));
            hash = (hash ^ v) * 0x100000001b3ull;
        }
    }
    /* Filling the inputs and hashing run in this process, not the daemon;
     * the daemon's CPU counts only the ops and barriers. */
    double cpu = cpu_ms(pid) - cpu0, loop = cpu_ms_of(pid, 1) - loop0;
    double mc[7];
    for (int k = 0; k < 7; k++) {
        double t = bench_thread_cpu_ms();
        memcpy(copy, x, count * sizeof(float));
        mc[k] = bench_thread_cpu_ms() - t;
        x[k] += copy[count - 1 - (size_t)k]; /* keep the copy live */
    }
    qsort(mc, 7, sizeof(double), cmp_double);
    printf("{\"rank\":%d,\"count\":%zu,\"repeats\":%d,\"daemon_cpu_ms_per_op\":"
           "%.3f,\"loop_cpu_ms_per_op\":%.3f,\"memcpy_ms\":%.3f,\"ratio\":"
           "%.3f,\"wall_ms_per_op\":%.3f,\"hash\":\"%016" PRIx64 "\"}\n",
           rank, count, repeats, cpu / repeats, loop / repeats, mc[3],
           cpu / repeats / mc[3], wall / repeats, hash);
    free(copy);
    obcomm_close(c);
    return 0;
}
