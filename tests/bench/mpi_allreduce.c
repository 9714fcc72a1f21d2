/* mpi_allreduce: times Open MPI's collectives over fp32 tensors of a range
 * of sizes, the same way bench_allreduce times obcomm: MPI_Allreduce
 * (MPI_FLOAT, MPI_SUM, in place), MPI_Allgather and
 * MPI_Reduce_scatter_block (MPI_SUM). Per size and op WARMUP untimed ops,
 * then REPEATS timed ones, each after an MPI_Barrier, only the collective
 * timed. One rank per node (run_bench.sh starts it with mpirun in the
 * network namespaces).
 *
 *   mpi_allreduce [-z "1 4 16 64 256"] [-r REPEATS] [-w WARMUP] [-d DEV]
 *                 [-o allreduce,allgather,reduce_scatter]
 *
 * A size (-z) is MiB of one fp32 tensor, as for bench_allreduce: the
 * allreduce's data, the allgather's whole result, the reduce-scatter's
 * whole input (those two rounded down to a multiple of the world size);
 * the allgather and the reduce-scatter use distinct send and receive
 * buffers. -o lists the ops (default allreduce).
 *
 * Bytes each node sends per op: tx_bytes of DEV (default ob0) in
 * /proc/net/dev of the rank's network namespace, over the timed repeats
 * (barriers included), -1 when DEV is absent. One JSON line per op, size
 * and rank on stdout, "op" naming the collective. */
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"

#define MAX_SIZES   32
#define MAX_REPEATS 1000

enum bench_op { OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCE_SCATTER, NOPS };

static const char *const op_names[NOPS] = {"allreduce", "allgather",
                                           "reduce_scatter"};

/* One op over `count` floats of the whole tensor: x holds the whole
 * tensor, y one rank's part. */
static void call(enum bench_op k, float *x, float *y, size_t count, int size)
{
    int part = (int)(count / (size_t)size);

    switch (k) {
    case OP_ALLREDUCE:
        /* In place, like obcomm: the same buffer is input and output. */
        MPI_Allreduce(MPI_IN_PLACE, x, (int)count, MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
        break;
    case OP_ALLGATHER:
        MPI_Allgather(y, part, MPI_FLOAT, x, part, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case OP_REDUCE_SCATTER:
        MPI_Reduce_scatter_block(x, y, part, MPI_FLOAT, MPI_SUM,
                                 MPI_COMM_WORLD);
        break;
    case NOPS:
        break;
    }
}

/* Small values of both signs, different on every rank, before every (op,
 * size), so that sums stay finite whatever ran before. */
static void fill(float *x, size_t xcount, float *y, size_t ycount, int rank)
{
    unsigned r = 2463534242u + (unsigned)rank;
    for (size_t i = 0; i < xcount + ycount; i++) {
        r ^= r << 13, r ^= r >> 17, r ^= r << 5;
        float v = ((float)(r >> 8) / 16777216.0f - 0.5f) * 1e-3f;
        if (i < xcount)
            x[i] = v;
        else
            y[i - xcount] = v;
    }
}

int main(int argc, char **argv)
{
    double mib[MAX_SIZES] = {1, 4, 16, 64, 256};
    int nsizes = 5, repeats = 5, warmup = 1, opt, rank, size;
    int run[NOPS] = {[OP_ALLREDUCE] = 1};
    const char *dev = "ob0";

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    while ((opt = getopt(argc, argv, "z:r:w:d:o:")) != -1) {
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
        case 'o':
            if (parse_names(optarg, op_names, NOPS, run)) {
                if (rank == 0)
                    fprintf(stderr, "mpi_allreduce: bad ops '%s'\n", optarg);
                MPI_Abort(MPI_COMM_WORLD, 2);
            }
            break;
        default:
            if (rank == 0)
                fprintf(stderr,
                        "usage: %s [-z SIZES_MIB] [-r REPEATS] "
                        "[-w WARMUP] [-d DEV] "
                        "[-o allreduce,allgather,reduce_scatter]\n",
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
    size_t maxpart = maxcount / (size_t)size + 1;
    float *x = malloc(maxcount * sizeof(float));
    float *y = malloc(maxpart * sizeof(float));
    if (x == NULL || y == NULL)
        MPI_Abort(MPI_COMM_WORLD, 1);

    for (int i = 0; i < nsizes; i++) {
        for (int k = 0; k < NOPS; k++) {
            if (!run[k])
                continue;
            size_t count = (size_t)(mib[i] * 1048576.0 / sizeof(float));
            if (k != OP_ALLREDUCE)
                count -= count % (size_t)size;
            double t[MAX_REPEATS], s[MAX_REPEATS];
            long long n0 = -1, n1;
            fill(x, maxcount, y, maxpart, rank);
            for (int j = 0; j < warmup + repeats; j++) {
                if (j == warmup)
                    n0 = dev_tx_bytes(dev);
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                call((enum bench_op)k, x, y, count, size);
                double t1 = MPI_Wtime();
                if (j >= warmup)
                    t[j - warmup] = (t1 - t0) * 1e3;
            }
            MPI_Barrier(MPI_COMM_WORLD);
            n1 = dev_tx_bytes(dev);
            memcpy(s, t, sizeof(double) * repeats);
            qsort(s, repeats, sizeof(double), cmp_double);
            double med = repeats % 2
                             ? s[repeats / 2]
                             : (s[repeats / 2 - 1] + s[repeats / 2]) / 2;
            printf("{\"contender\":\"openmpi\",\"op\":\"%s\",\"nodes\":%d,"
                   "\"rank\":%d,\"mib\":%g,\"count\":%zu,\"repeats\":%d,"
                   "\"warmup\":%d,\"median_ms\":%.3f,\"min_ms\":%.3f,"
                   "\"max_ms\":%.3f,\"daemon_bytes_per_op\":-1,"
                   "\"dev_tx_bytes_per_op\":%lld,\"times_ms\":[",
                   op_names[k], size, rank, mib[i], count, repeats, warmup, med,
                   s[0], s[repeats - 1],
                   n0 >= 0 && n1 >= 0 ? (n1 - n0) / repeats : -1);
            for (int j = 0; j < repeats; j++)
                printf("%s%.3f", j ? "," : "", t[j]);
            printf("]}\n");
            fflush(stdout);
        }
    }
    free(y);
    free(x);
    MPI_Finalize();
    return 0;
}
