/* The memory traffic of a 1-bit op, alone: the floor under the daemon's
 * CPU time per op (tests/bench/cpu_per_op.sh) on this machine.
 *
 *   traffic_floor [-n COUNT] [-k NODES] [-r REPEATS] [-w WARMUP]
 *
 * Forks NODES processes, one per emulated node, all on this machine as the
 * daemons of cpu_per_op.sh and of the netns cluster are. Per op each one
 * moves the bytes a daemon's three passes must move for a tensor of COUNT
 * floats (default 16 Mi) and no more, with the simplest loops:
 *   worker pass  v[i] += x[i] over COUNT      (reads x and v, writes v)
 *   server pass  s[i] += c over COUNT / NODES (reads and writes the chunk)
 *   decode       x[i] = c over COUNT          (streaming stores)
 * The processes start each pass together (a process-shared barrier), as the
 * daemons' passes overlap in an op. The packed signs (1/32 of the bytes)
 * and the norms are left out, so this is a floor, not a model.
 *
 * Output: one JSON line with the upper median over processes of each
 * one's median CPU ms per op and per pass (CLOCK_THREAD_CPUTIME_ID), and a
 * memcpy of COUNT floats timed (CPU) by this process alone afterwards (median
 * of 7), the baseline of cpu_per_op.sh. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "bench_util.h"

#define MAX_NODES   64
#define MAX_REPEATS 1000

struct shared {
    pthread_barrier_t bar;
    double cpu_ms[MAX_NODES];     /* median per op */
    double pass_ms[MAX_NODES][3]; /* median per pass */
};

static void *xalloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == NULL) {
        fprintf(stderr, "traffic_floor: out of memory\n");
        exit(1);
    }
    memset(p, 0, bytes); /* every page mapped before the first op */
    return p;
}

/* y[i] += c, with 16-byte vectors as bench_floor_pass, so that the
 * compiler emits packed loads and stores without -mavx2. */
static void add_const_pass(float *y, float c, size_t n)
{
    bench_v4f cv = {c, c, c, c};
    size_t i = 0;

    for (; i + 4 <= n; i += 4) {
        bench_v4f b;
        memcpy(&b, y + i, sizeof(b));
        b += cv;
        memcpy(y + i, &b, sizeof(b));
    }
    for (; i < n; i++)
        y[i] += c;
}

/* x[i] = c with stores that bypass the cache, as decompress_stream. */
static void stream_fill(float *x, size_t count, float c)
{
    size_t i = 0;
#ifdef __SSE2__
    __m128 v = _mm_set1_ps(c);
    for (; i + 4 <= count; i += 4)
        _mm_stream_ps(x + i, v);
    _mm_sfence();
#endif
    for (; i < count; i++)
        x[i] = c;
}

static void node(struct shared *sh, int k, size_t count, int nodes, int warmup,
                 int repeats)
{
    size_t chunk = count / (size_t)nodes;
    float *x = xalloc(count * sizeof(float));
    float *v = xalloc(count * sizeof(float));
    float *s = xalloc((chunk ? chunk : 1) * sizeof(float));
    static double t[MAX_REPEATS], tp[3][MAX_REPEATS];

    for (int r = 0; r < warmup + repeats; r++) {
        double c[3], c0;

        pthread_barrier_wait(&sh->bar);
        c0 = bench_thread_cpu_ms();
        bench_floor_pass(x, v, v, count);
        c[0] = bench_thread_cpu_ms() - c0;
        pthread_barrier_wait(&sh->bar);
        c0 = bench_thread_cpu_ms();
        add_const_pass(s, 0.5f, chunk);
        c[1] = bench_thread_cpu_ms() - c0;
        pthread_barrier_wait(&sh->bar);
        c0 = bench_thread_cpu_ms();
        stream_fill(x, count, (float)r);
        c[2] = bench_thread_cpu_ms() - c0;
        if (r >= warmup) {
            t[r - warmup] = c[0] + c[1] + c[2];
            for (int j = 0; j < 3; j++)
                tp[j][r - warmup] = c[j];
        }
    }
    qsort(t, (size_t)repeats, sizeof(double), cmp_double);
    for (int j = 0; j < 3; j++) {
        qsort(tp[j], (size_t)repeats, sizeof(double), cmp_double);
        sh->pass_ms[k][j] = tp[j][repeats / 2];
    }
    sh->cpu_ms[k] = t[repeats / 2];
    /* Keep the loops: the results are used. */
    if (v[0] + s[0] == -1.0f)
        printf("\n");
}

int main(int argc, char **argv)
{
    size_t count = (size_t)16 << 20;
    int nodes = 2, repeats = 20, warmup = 3, opt;

    while ((opt = getopt(argc, argv, "n:k:r:w:")) != -1) {
        switch (opt) {
        case 'n':
            count = strtoull(optarg, NULL, 10);
            break;
        case 'k':
            nodes = atoi(optarg);
            break;
        case 'r':
            repeats = atoi(optarg);
            break;
        case 'w':
            warmup = atoi(optarg);
            break;
        default:
            fprintf(stderr,
                    "usage: %s [-n COUNT] [-k NODES] [-r REPEATS] "
                    "[-w WARMUP]\n",
                    argv[0]);
            return 2;
        }
    }
    if (count < 16 || nodes < 1 || nodes > MAX_NODES || repeats < 1 ||
        repeats > MAX_REPEATS || warmup < 0) {
        fprintf(stderr,
                "traffic_floor: COUNT >= 16, 1 <= NODES <= %d, "
                "1 <= REPEATS <= %d\n",
                MAX_NODES, MAX_REPEATS);
        return 2;
    }

    struct shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pthread_barrierattr_t ba;
    if (sh == MAP_FAILED) {
        perror("traffic_floor: mmap");
        return 1;
    }
    pthread_barrierattr_init(&ba);
    pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(&sh->bar, &ba, (unsigned)nodes);

    pid_t pids[MAX_NODES];
    for (int k = 0; k < nodes; k++) {
        pids[k] = fork();
        if (pids[k] < 0) {
            perror("traffic_floor: fork");
            return 1;
        }
        if (pids[k] == 0) {
            node(sh, k, count, nodes, warmup, repeats);
            _exit(0);
        }
    }
    int ok = 1;
    for (int k = 0; k < nodes; k++) {
        int st;
        while (waitpid(pids[k], &st, 0) < 0 && errno == EINTR)
            ;
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    if (!ok) {
        fprintf(stderr, "traffic_floor: a node process failed\n");
        return 1;
    }

    /* The baseline, as onebit_cpu times it: CPU time of a memcpy alone,
     * median of 7. */
    float *a = xalloc(count * sizeof(float)),
          *b = xalloc(count * sizeof(float));
    double m[7], f[MAX_NODES];
    for (int k = 0; k < 7; k++) {
        double t0 = bench_thread_cpu_ms();
        memcpy(b, a, count * sizeof(float));
        m[k] = bench_thread_cpu_ms() - t0;
        a[k] = b[count - 1 - (size_t)k];
    }
    qsort(m, 7, sizeof(double), cmp_double);
    double med[4];
    for (int j = 0; j < 4; j++) {
        for (int k = 0; k < nodes; k++)
            f[k] = j < 3 ? sh->pass_ms[k][j] : sh->cpu_ms[k];
        qsort(f, (size_t)nodes, sizeof(double), cmp_double);
        med[j] = f[nodes / 2];
    }
    printf("{\"count\":%zu,\"nodes\":%d,\"repeats\":%d,\"floor_cpu_ms_per_op\":"
           "%.3f,\"worker_ms\":%.3f,\"server_ms\":%.3f,\"decode_ms\":%.3f,"
           "\"memcpy_ms\":%.3f,\"ratio\":%.3f}\n",
           count, nodes, repeats, med[3], med[0], med[1], med[2], m[3],
           med[3] / m[3]);
    return 0;
}
