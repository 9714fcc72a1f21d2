/* mpi_allreduce: times MPI_Allreduce (MPI_FLOAT, MPI_SUM) over a range of
 * tensor sizes, the same way bench_allreduce times obcomm: per size WARMUP
 * untimed ops, then REPEATS timed ones, each after an MPI_Barrier, only the
 * collective timed. One rank per node (run_bench.sh starts it with mpirun
 * in the network namespaces).
 *
 *   mpi_allreduce [-z "1 4 16 64 256"] [-r REPEATS] [-w WARMUP] [-d DEV]
 *
 * Bytes each node sends per op: tx_bytes of DEV (default ob0) in
 * /proc/net/dev of the rank's network namespace, over the timed repeats
 * (barriers included), -1 when DEV is absent. One JSON line per size and
 * rank on stdout. */
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"

#define MAX_SIZES   32
#define MAX_REPEATS 1000

int main(int argc, char **argv)
{
    double mib[MAX_SIZES] = {1, 4, 16, 64, 256};
    int nsizes = 5, repeats = 5, warmup = 1, opt, rank, size;
    const char *dev = "ob0";

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    while ((opt = getopt(argc, argv, "z:r:w:d:")) != -1) {
        switch (opt) {
        case 'z': {
            char *s = optarg, *end;
            nsizes = 0;
            while (*s != '\0' && nsizes < MAX_SIZES) {
                if (*s == ' ' || *s == ',') {
                    s++;
                    continue;
                }
                mib[nsizes] = strtod(s, &end);
                if (end == s || mib[nsizes] <= 0)
                    MPI_Abort(MPI_COMM_WORLD, 2);
                nsizes++;
                s = end;
            }
            break;
        }
        case 'r':
            repeats = atoi(optarg);
            break;
        case 'w':
            warmup = atoi(optarg);
            break;
        case 'd':
            dev = optarg;
            break;
        default:
            if (rank == 0)
                fprintf(stderr,
                        "usage: %s [-z SIZES_MIB] [-r REPEATS] "
                        "[-w WARMUP] [-d DEV]\n",
                        argv[0]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (repeats < 1 || repeats > MAX_REPEATS || warmup < 0 || nsizes < 1)
        MPI_Abort(MPI_COMM_WORLD, 2);

    double maxmib = 0;
    for (int i = 0; i < nsizes; i++)
        if (mib[i] > maxmib)
            maxmib = mib[i];
    size_t maxcount = (size_t)(maxmib * 1048576.0 / sizeof(float));
    /* In place, like obcomm: the same buffer is input and output. */
    float *x = malloc(maxcount * sizeof(float));
    if (x == NULL)
        MPI_Abort(MPI_COMM_WORLD, 1);
    unsigned r = 2463534242u + (unsigned)rank;
    for (size_t i = 0; i < maxcount; i++) {
        r ^= r << 13, r ^= r >> 17, r ^= r << 5;
        x[i] = ((float)(r >> 8) / 16777216.0f - 0.5f) * 1e-3f;
    }

    for (int k = 0; k < nsizes; k++) {
        size_t count = (size_t)(mib[k] * 1048576.0 / sizeof(float));
        double t[MAX_REPEATS], s[MAX_REPEATS];
        long long n0 = -1, n1;
        for (int i = 0; i < warmup + repeats; i++) {
            if (i == warmup)
                n0 = dev_tx_bytes(dev);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, x, (int)count, MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
            double t1 = MPI_Wtime();
            if (i >= warmup)
                t[i - warmup] = (t1 - t0) * 1e3;
        }
        MPI_Barrier(MPI_COMM_WORLD);
        n1 = dev_tx_bytes(dev);
        memcpy(s, t, sizeof(double) * repeats);
        qsort(s, repeats, sizeof(double), cmp_double);
        double med = repeats % 2 ? s[repeats / 2]
                                 : (s[repeats / 2 - 1] + s[repeats / 2]) / 2;
        printf("{\"contender\":\"openmpi\",\"nodes\":%d,\"rank\":%d,"
               "\"mib\":%g,\"count\":%zu,\"repeats\":%d,\"warmup\":%d,"
               "\"median_ms\":%.3f,\"min_ms\":%.3f,\"max_ms\":%.3f,"
               "\"daemon_bytes_per_op\":-1,\"dev_tx_bytes_per_op\":%lld,"
               "\"times_ms\":[",
               size, rank, mib[k], count, repeats, warmup, med, s[0],
               s[repeats - 1], n0 >= 0 && n1 >= 0 ? (n1 - n0) / repeats : -1);
        for (int i = 0; i < repeats; i++)
            printf("%s%.3f", i ? "," : "", t[i]);
        printf("]}\n");
        fflush(stdout);
    }
    free(x);
    MPI_Finalize();
    return 0;
}
