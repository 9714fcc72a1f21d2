/* obcomm-allreduce: a trainer stand-in. Joins the job on its node's daemon,
 * allreduces a float32 tensor `iters` times, checks every result exactly and
 * prints the time per op.
 *
 *   obcomm-allreduce [-s SOCKET] [-j JOB] -r LOCAL_RANK -n LOCAL_SIZE
 *                    [-c COUNT] [-i ITERS] [-t TIMEOUT_MS]
 */
#include <obcomm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    obcomm_options_t o = {.local_size = 1};
    size_t count = 1 << 20;
    int iters = 10, opt;
    while ((opt = getopt(argc, argv, "s:j:r:n:c:i:t:")) != -1) {
        switch (opt) {
        case 's':
            o.socket_path = optarg;
            break;
        case 'j':
            o.job = optarg;
            break;
        case 'r':
            o.local_rank = atoi(optarg);
            break;
        case 'n':
            o.local_size = atoi(optarg);
            break;
        case 'c':
            count = strtoull(optarg, NULL, 0);
            break;
        case 'i':
            iters = atoi(optarg);
            break;
        case 't':
            o.timeout_ms = atoi(optarg);
            break;
        default:
            fprintf(stderr,
                    "usage: %s [-s SOCKET] [-j JOB] -r LOCAL_RANK -n "
                    "LOCAL_SIZE [-c COUNT] [-i ITERS] [-t MS]\n",
                    argv[0]);
            return 2;
        }
    }

    obcomm_t *c;
    int rc = obcomm_connect(&o, &c);
    if (rc) {
        fprintf(stderr, "connect: %s: %s\n", obcomm_strerror(rc),
                obcomm_last_error(NULL));
        return 1;
    }
    int rank = obcomm_rank(c), size = obcomm_size(c);
    float *x;
    rc = obcomm_alloc(c, count * sizeof(float), (void **)&x);
    if (rc) {
        fprintf(stderr, "alloc: %s\n", obcomm_strerror(rc));
        obcomm_close(c);
        return 1;
    }

    /* Rank r contributes r+1 (+ the iteration): the sum is known exactly. */
    double total = 0;
    for (int it = 0; it < iters; it++) {
        for (size_t i = 0; i < count; i++)
            x[i] = (float)(rank + 1 + it);
        double t0 = now_s();
        rc = obcomm_allreduce(c, x, count, OBCOMM_FLOAT32, OBCOMM_SUM);
        total += now_s() - t0;
        if (rc) {
            fprintf(stderr, "rank %d: allreduce: %s\n", rank,
                    obcomm_last_error(c));
            obcomm_close(c);
            return 1;
        }
        float want = (float)size * (float)(size + 1) / 2 + (float)size * it;
        for (size_t i = 0; i < count; i++)
            if (x[i] != want) {
                fprintf(stderr, "rank %d: element %zu is %g, want %g\n", rank,
                        i, x[i], want);
                obcomm_close(c);
                return 1;
            }
    }
    printf("rank %d of %d: %d allreduces of %zu floats correct, %.2f ms "
           "each\n",
           rank, size, iters, count, total / iters * 1e3);
    obcomm_close(c);
    return 0;
}
