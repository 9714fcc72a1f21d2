/* Throughput of the 1-bit codec against memcpy of the same tensor.
 *
 * usage: bench_codec [-n ELEMS] [-r REPEATS] [-t THREADS] [--json]
 *
 * Every operation runs over one tensor of ELEMS fp32 elements (default
 * 64 Mi, i.e. 256 MiB) and is timed as the median of REPEATS runs, for each
 * implementation, on one thread and on THREADS threads (default: all online
 * CPUs). The baseline is memcpy of the 256 MiB input into another buffer,
 * measured in the same run. GB/s is tensor bytes (ELEMS * 4) per second
 * for every row, so rows compare directly.
 *
 * The server step treats the whole tensor as one chunk fed by 4
 * participants (4 packed inputs of ELEMS / 8 bytes and the server error of
 * ELEMS floats), so its memory traffic is comparable to the other rows.
 *
 * compress_avg is the worker compress of the average of AVG_NSRC = 2 local
 * buffers of ELEMS floats each (obd_codec_compress_avg), with a scratch b
 * of ELEMS floats. Per element it moves (AVG_NSRC + 4) * 4 bytes plus 1/8
 * byte of bits: pass 1 reads the AVG_NSRC sources and e and writes b,
 * pass 2 reads b and writes e (and the bits). memcpy moves 8, so at equal
 * bandwidth its ratio cannot go below (AVG_NSRC + 4) / 2 = 3.0 (more if
 * the stores cost a read for ownership).
 *
 * Multi-threaded runs split the tensor into whole OBD_CODEC_BLOCK blocks:
 * pass 1 collects every block's sum of squares, obd_codec_scale combines
 * them in block order, and pass 2 runs on each thread's range with the
 * common scale. The result must equal the single-threaded one byte for
 * byte; the program checks that before timing and exits non-zero if not. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codec.h"

#define MAX_THREADS 256
#define SERVER_N    4
#define AVG_NSRC    2

struct bench {
    size_t elems, nblocks;
    float *x, *e, *dst, *err, *out, *x2, *bsc;
    const float *src[AVG_NSRC];
    uint8_t *bits, *sbits, *in_bits[SERVER_N];
    const uint8_t *in[SERVER_N];
    float scales[SERVER_N];
    double *sums;
};

/* One thread's share of an operation: blocks [b0, b1). */
struct job {
    const struct obd_codec_impl *impl;
    struct bench *b;
    size_t b0, b1;
    int phase; /* 1: sums, 2: write with the common scale */
    int op;
    float scale;
};

enum {
    OP_COMPRESS,
    OP_SERVER,
    OP_DECOMPRESS,
    OP_DECOMPRESS_ADD,
    OP_COMPRESS_AVG,
    NOPS
};

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes);

    if (p == NULL) {
        fprintf(stderr, "bench_codec: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

static size_t block_end(const struct bench *b, size_t j)
{
    size_t end = (j + 1) * OBD_CODEC_BLOCK;

    return end < b->elems ? end : b->elems;
}

static void *run_job(void *arg)
{
    struct job *jb = arg;
    struct bench *b = jb->b;
    const struct obd_codec_impl *im = jb->impl;
    size_t lo = jb->b0 * OBD_CODEC_BLOCK, hi = block_end(b, jb->b1 - 1);

    if (jb->b0 >= jb->b1)
        return NULL;
    switch (jb->op) {
    case OP_COMPRESS:
        if (jb->phase == 1)
            for (size_t j = jb->b0; j < jb->b1; j++)
                b->sums[j] = im->sumsq_block(
                    b->x, b->elems, b->e, j * OBD_CODEC_BLOCK, block_end(b, j));
        else
            im->compress_range(b->x, b->elems, b->e, lo, hi, jb->scale,
                               b->bits + lo / 8);
        break;
    case OP_SERVER:
        if (jb->phase == 1)
            for (size_t j = jb->b0; j < jb->b1; j++)
                b->sums[j] = im->server_sumsq_block(b->in, b->scales, SERVER_N,
                                                    b->err, j * OBD_CODEC_BLOCK,
                                                    block_end(b, j));
        else
            im->server_range(b->in, b->scales, SERVER_N, b->err, lo, hi,
                             jb->scale, b->sbits + lo / 8);
        break;
    case OP_COMPRESS_AVG:
        if (jb->phase == 1)
            for (size_t j = jb->b0; j < jb->b1; j++)
                b->sums[j] = im->avg_sumsq_block(b->src, AVG_NSRC, b->elems,
                                                 b->e, j * OBD_CODEC_BLOCK,
                                                 block_end(b, j), b->bsc);
        else
            im->sign_range(b->bsc, b->e, lo, hi, jb->scale, b->bits + lo / 8);
        break;
    case OP_DECOMPRESS:
        im->decompress(b->bits + lo / 8, jb->scale, b->out + lo, hi - lo);
        break;
    case OP_DECOMPRESS_ADD:
        im->decompress_add(b->bits + lo / 8, jb->scale, b->out + lo, hi - lo);
        break;
    }
    return NULL;
}

/* Runs one phase of `op` on `nthreads` threads, each on whole blocks. */
static void run_phase(const struct obd_codec_impl *im, struct bench *b,
                      int nthreads, int op, int phase, float scale)
{
    pthread_t tid[MAX_THREADS];
    struct job jobs[MAX_THREADS];

    for (int t = 0; t < nthreads; t++) {
        jobs[t] = (struct job){
            .impl = im,
            .b = b,
            .b0 = b->nblocks * (size_t)t / (size_t)nthreads,
            .b1 = b->nblocks * (size_t)(t + 1) / (size_t)nthreads,
            .phase = phase,
            .op = op,
            .scale = scale,
        };
    }
    if (nthreads == 1) {
        run_job(&jobs[0]);
        return;
    }
    for (int t = 0; t < nthreads; t++)
        if (pthread_create(&tid[t], NULL, run_job, &jobs[t]) != 0) {
            fprintf(stderr, "bench_codec: pthread_create failed\n");
            exit(2);
        }
    for (int t = 0; t < nthreads; t++)
        pthread_join(tid[t], NULL);
}

/* One whole operation. Single-threaded compress and server go through the
 * public helpers; multi-threaded ones follow the block protocol. */
static int run_op(const struct obd_codec_impl *im, struct bench *b,
                  int nthreads, int op, float *scale_out)
{
    float sc = 0.5f;
    int rc;

    if (op == OP_DECOMPRESS || op == OP_DECOMPRESS_ADD) {
        run_phase(im, b, nthreads, op, 0, 0.5f);
        return 0;
    }
    if (nthreads == 1 && op == OP_COMPRESS)
        return obd_codec_compress(im, b->x, b->elems, b->e, b->elems, b->bits,
                                  scale_out);
    if (nthreads == 1 && op == OP_SERVER)
        return obd_codec_server(im, b->in, b->scales, SERVER_N, b->err,
                                b->elems, b->sbits, scale_out);
    if (nthreads == 1 && op == OP_COMPRESS_AVG)
        return obd_codec_compress_avg(im, b->src, AVG_NSRC, b->elems, b->e,
                                      b->bsc, b->elems, b->bits, scale_out);
    run_phase(im, b, nthreads, op, 1, 0.0f);
    rc = obd_codec_scale(b->sums, b->nblocks, b->elems, &sc);
    if (rc != 0)
        return rc;
    run_phase(im, b, nthreads, op, 2, sc);
    *scale_out = sc;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

static float rng_unit(uint64_t *s)
{
    return (float)((double)(rng_next(s) >> 11) * 0x1p-52 - 1.0);
}

/* Fresh deterministic inputs; also touches every page of every buffer. */
static void reset_inputs(struct bench *b)
{
    uint64_t s = 0x9e3779b97f4a7c15ULL;

    for (size_t i = 0; i < b->elems; i++) {
        b->x[i] = rng_unit(&s);
        b->x2[i] = rng_unit(&s);
        b->e[i] = rng_unit(&s) * 0.1f;
        b->err[i] = rng_unit(&s) * 0.1f;
    }
    for (int k = 0; k < SERVER_N; k++) {
        for (size_t i = 0; i < b->elems / 8; i++)
            b->in_bits[k][i] = (uint8_t)(rng_next(&s) >> 56);
        b->scales[k] = 0.25f * (float)(k + 1);
    }
    memset(b->dst, 0, b->elems * sizeof(float));
    memset(b->bsc, 0, b->elems * sizeof(float));
    memset(b->out, 0, b->elems * sizeof(float));
    memset(b->bits, 0, b->elems / 8);
    memset(b->sbits, 0, b->elems / 8);
}

/* Single- and multi-threaded results must be identical: compress and
 * server step from the same state, then compare every output byte; then
 * the same for compress_avg (bits, scale, error and the scratch b). */
static int check_mt(const struct obd_codec_impl *im, struct bench *b,
                    int nthreads)
{
    size_t fb = b->elems * sizeof(float), nb = b->elems / 8;
    float *e1 = xmalloc(fb), *err1 = xmalloc(fb);
    uint8_t *bits1 = xmalloc(nb), *sbits1 = xmalloc(nb);
    float s1, s2, t1, t2;
    int same;

    reset_inputs(b);
    if (run_op(im, b, 1, OP_COMPRESS, &s1) != 0 ||
        run_op(im, b, 1, OP_SERVER, &t1) != 0)
        return -1;
    memcpy(e1, b->e, fb);
    memcpy(err1, b->err, fb);
    memcpy(bits1, b->bits, nb);
    memcpy(sbits1, b->sbits, nb);
    reset_inputs(b);
    if (run_op(im, b, nthreads, OP_COMPRESS, &s2) != 0 ||
        run_op(im, b, nthreads, OP_SERVER, &t2) != 0)
        return -1;
    same = memcmp(&s1, &s2, sizeof(float)) == 0 &&
           memcmp(&t1, &t2, sizeof(float)) == 0 && memcmp(e1, b->e, fb) == 0 &&
           memcmp(err1, b->err, fb) == 0 && memcmp(bits1, b->bits, nb) == 0 &&
           memcmp(sbits1, b->sbits, nb) == 0;

    reset_inputs(b);
    if (run_op(im, b, 1, OP_COMPRESS_AVG, &s1) != 0)
        return -1;
    memcpy(e1, b->e, fb);
    memcpy(err1, b->bsc, fb);
    memcpy(bits1, b->bits, nb);
    reset_inputs(b);
    if (run_op(im, b, nthreads, OP_COMPRESS_AVG, &s2) != 0)
        return -1;
    same = same && memcmp(&s1, &s2, sizeof(float)) == 0 &&
           memcmp(e1, b->e, fb) == 0 && memcmp(err1, b->bsc, fb) == 0 &&
           memcmp(bits1, b->bits, nb) == 0;
    free(sbits1);
    free(bits1);
    free(err1);
    free(e1);
    return same ? 0 : -1;
}

struct row {
    const char *op, *impl;
    int threads;
    double ms;
};

int main(int argc, char **argv)
{
    static const char *const op_names[] = {"compress", "server (n=4)",
                                           "decompress", "decompress_add",
                                           "compress_avg (nsrc=2)"};
    size_t elems = (size_t)64 << 20;
    int repeats = 7, json = 0, nthreads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const struct obd_codec_impl *impls[2];
    int nimpl = 0, nrows = 0, mt_ok = 1;
    struct row rows[32];
    struct bench b;
    double memcpy_ms, *t;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
            elems = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "-r") == 0 && i + 1 < argc)
            repeats = atoi(argv[++i]);
        else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc)
            nthreads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else {
            fprintf(stderr,
                    "usage: %s [-n ELEMS] [-r REPEATS] [-t THREADS] "
                    "[--json]\n",
                    argv[0]);
            return 2;
        }
    }
    /* The tensor is its own padded length; round up to whole bytes. */
    elems = (elems + 7) / 8 * 8;
    if (elems == 0 || repeats < 1 || nthreads < 1)
        return 2;
    if (nthreads > MAX_THREADS)
        nthreads = MAX_THREADS;

    b.elems = elems;
    b.nblocks = (elems + OBD_CODEC_BLOCK - 1) / OBD_CODEC_BLOCK;
    b.x = xmalloc(elems * sizeof(float));
    b.e = xmalloc(elems * sizeof(float));
    b.dst = xmalloc(elems * sizeof(float));
    b.err = xmalloc(elems * sizeof(float));
    b.out = xmalloc(elems * sizeof(float));
    b.x2 = xmalloc(elems * sizeof(float));
    b.bsc = xmalloc(elems * sizeof(float));
    b.src[0] = b.x;
    b.src[1] = b.x2;
    b.bits = xmalloc(elems / 8);
    b.sbits = xmalloc(elems / 8);
    b.sums = xmalloc(b.nblocks * sizeof(double));
    for (int k = 0; k < SERVER_N; k++) {
        b.in_bits[k] = xmalloc(elems / 8);
        b.in[k] = b.in_bits[k];
    }
    t = xmalloc((size_t)repeats * sizeof(double));
    reset_inputs(&b);

    impls[nimpl++] = obd_codec_portable();
    if (obd_codec_avx2() != NULL)
        impls[nimpl++] = obd_codec_avx2();

    for (int r = 0; r < repeats; r++) {
        double t0 = now_ms();
        memcpy(b.dst, b.x, elems * sizeof(float));
        t[r] = now_ms() - t0;
    }
    memcpy_ms = median(t, repeats);

    for (int k = 0; k < nimpl; k++) {
        int tcounts[2] = {1, nthreads};
        if (check_mt(impls[k], &b, nthreads) != 0)
            mt_ok = 0;
        reset_inputs(&b);
        for (int tc = 0; tc < (nthreads > 1 ? 2 : 1); tc++)
            for (int op = 0; op < NOPS; op++) {
                for (int r = 0; r < repeats; r++) {
                    float sc;
                    double t0 = now_ms();
                    if (run_op(impls[k], &b, tcounts[tc], op, &sc) != 0) {
                        fprintf(stderr, "bench_codec: %s failed\n",
                                op_names[op]);
                        return 1;
                    }
                    t[r] = now_ms() - t0;
                }
                rows[nrows++] = (struct row){op_names[op], impls[k]->name,
                                             tcounts[tc], median(t, repeats)};
            }
    }

    double gb = (double)elems * sizeof(float) / 1e9;
    if (json) {
        printf("{\"elems\": %zu, \"repeats\": %d, \"memcpy_ms\": %.3f, "
               "\"mt_equals_st\": %s, \"rows\": [\n",
               elems, repeats, memcpy_ms, mt_ok ? "true" : "false");
        printf("  {\"op\": \"memcpy\", \"impl\": \"libc\", \"threads\": 1, "
               "\"ms\": %.3f, \"gbps\": %.2f, \"ratio\": 1.00}",
               memcpy_ms, gb / (memcpy_ms / 1e3));
        for (int i = 0; i < nrows; i++)
            printf(",\n  {\"op\": \"%s\", \"impl\": \"%s\", \"threads\": %d, "
                   "\"ms\": %.3f, \"gbps\": %.2f, \"ratio\": %.2f}",
                   rows[i].op, rows[i].impl, rows[i].threads, rows[i].ms,
                   gb / (rows[i].ms / 1e3), rows[i].ms / memcpy_ms);
        printf("\n]}\n");
    } else {
        printf("%zu elements (%.0f MiB fp32), median of %d; GB/s = tensor "
               "bytes / time\n\n",
               elems, (double)elems * 4 / (1 << 20), repeats);
        printf("| op | impl | threads | ms | GB/s | ratio to memcpy |\n");
        printf("|---|---|---|---|---|---|\n");
        printf("| memcpy | libc | 1 | %.2f | %.2f | 1.00 |\n", memcpy_ms,
               gb / (memcpy_ms / 1e3));
        for (int i = 0; i < nrows; i++)
            printf("| %s | %s | %d | %.2f | %.2f | %.2f |\n", rows[i].op,
                   rows[i].impl, rows[i].threads, rows[i].ms,
                   gb / (rows[i].ms / 1e3), rows[i].ms / memcpy_ms);
        printf("\nmulti-threaded (%d) result equals single-threaded: %s\n",
               nthreads, mt_ok ? "yes (memcmp of bits, scale, error)" : "NO");
        printf("compress_avg (nsrc=%d) moves (nsrc + 4) * 4 = %d bytes per "
               "element (+ 1/8 of bits), memcpy 8: a ratio of %.2f at equal "
               "bandwidth\n",
               AVG_NSRC, (AVG_NSRC + 4) * 4, (AVG_NSRC + 4) / 2.0);
    }

    for (int k = 0; k < SERVER_N; k++)
        free(b.in_bits[k]);
    free(t);
    free(b.bsc);
    free(b.x2);
    free(b.sums);
    free(b.sbits);
    free(b.bits);
    free(b.out);
    free(b.err);
    free(b.dst);
    free(b.e);
    free(b.x);
    return mt_ok ? 0 : 1;
}
