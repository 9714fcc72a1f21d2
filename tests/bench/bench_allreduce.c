/* bench_allreduce: times obcomm's collectives over fp32 tensors of a
 * range of sizes, as one trainer of a node: obcomm_allreduce (fp32 SUM),
 * obcomm_allreduce_1bit, obcomm_allgather and obcomm_reduce_scatter (SUM).
 * Run one per node (deploy/netns-cluster.sh exec I ...).
 *
 *   bench_allreduce [-s SOCKET] [-j JOB] [-z "1 4 16 64 256"] [-r REPEATS]
 *                   [-w WARMUP] [-o fp32,1bit,allgather,reduce_scatter]
 *                   [-c OBCOMMCTL] [-d DEV] [-t TIMEOUT_MS]
 *                   [-L LOCAL_SIZE -l LOCAL_RANK]
 *
 * A size (-z) is MiB of one fp32 tensor, the same tensor for every op:
 * the allreduce's data, the allgather's whole result (each of the world's
 * ranks sends 1/world of it) and the reduce-scatter's whole input (each
 * rank receives 1/world of it); for the last two the element count is
 * rounded down to a multiple of the world size. Both buffers of the
 * allgather and the reduce-scatter are distinct obcomm_alloc buffers (not
 * in place), as torch.distributed's and MPI's calls are timed.
 *
 * For every size and op (-o, default fp32,1bit), the program runs WARMUP
 * untimed ops, then REPEATS timed ones (-L/-l: one of LOCAL_SIZE trainers
 * of the node, default 1 and 0; every one of them prints its own lines); before
 * each op all ranks meet in obcomm_barrier, and only the collective itself is
 * timed. Each 1-bit size uses its own key (1000 + size index), so the error
 * feedback of one size never meets another's count.
 *
 * Bytes each node sends per op are measured two ways, both over the timed
 * repeats only (barriers included in the second):
 *   daemon_bytes  the daemon's counter of the op (obcommctl --json
 *                 metrics): allreduce_bytes_sent (fp32), onebit_bytes_sent
 *                 (1-bit), allgather_bytes_sent, reduce_scatter_bytes_sent
 *                 (-c names obcommctl; without it the field is -1);
 *   dev_tx_bytes  tx_bytes of DEV in /proc/net/dev of the caller's network
 *                 namespace (frames with Ethernet/IP/TCP headers), -1 when
 *                 DEV (default ob0) is absent.
 *
 * Output: one JSON line per (op, size) on stdout with the collective
 * ("op": allreduce, allgather or reduce_scatter), the contender
 * (obcomm_fp32 and obcomm_1bit for the allreduces, obcomm for the
 * others), the median, min and max time in ms and every repeat's time. */
#include <obcomm.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

#define MAX_SIZES   32
#define MAX_REPEATS 1000

/* The ops -o names, in the order they run for each size. */
enum bench_op { OP_FP32, OP_1BIT, OP_ALLGATHER, OP_REDUCE_SCATTER, NOPS };

static const struct {
    const char *name;       /* in -o */
    const char *collective; /* "op" in the output */
    const char *contender;  /* "contender" in the output */
    const char *counter;    /* the daemon's bytes-sent counter */
} ops[NOPS] = {
    [OP_FP32] = {"fp32", "allreduce", "obcomm_fp32", "allreduce_bytes_sent"},
    [OP_1BIT] = {"1bit", "allreduce", "obcomm_1bit", "onebit_bytes_sent"},
    [OP_ALLGATHER] = {"allgather", "allgather", "obcomm",
                      "allgather_bytes_sent"},
    [OP_REDUCE_SCATTER] = {"reduce_scatter", "reduce_scatter", "obcomm",
                           "reduce_scatter_bytes_sent"},
};

struct cfg {
    const char *ctl, *dev, *sock;
    double mib[MAX_SIZES];
    int nsizes, repeats, warmup;
    int run[NOPS]; /* 1 for the ops -o names */
};

/* The buffers every op of one size works on (obcomm_alloc): `x` holds
 * the whole tensor (the allreduce's data, the allgather's result, the
 * reduce-scatter's input), `y` one rank's part of it (the allgather's
 * input, the reduce-scatter's result). */
struct bufs {
    float *x, *y;
};

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A counter from `obcommctl --json metrics`; -1 when it cannot be read. */
static long long daemon_counter(const struct cfg *g, const char *name)
{
    char cmd[1024], buf[16384], key[128];
    long long v = -1;
    size_t n;
    FILE *p;

    if (g->ctl == NULL)
        return -1;
    snprintf(cmd, sizeof cmd, "'%s' -s '%s' --json metrics", g->ctl, g->sock);
    p = popen(cmd, "r");
    if (p == NULL)
        return -1;
    n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = '\0';
    pclose(p);
    snprintf(key, sizeof key, "\"name\":\"%s\"", name);
    const char *at = strstr(buf, key);
    if (at != NULL && (at = strstr(at, "\"value\":")) != NULL)
        v = strtoll(at + 8, NULL, 10);
    return v;
}

/* tx_bytes of `dev` in this network namespace's /proc/net/dev. */

static int parse_sizes(struct cfg *g, const char *s)
{
    char *end;

    g->nsizes = 0;
    while (*s != '\0') {
        if (*s == ' ' || *s == ',') {
            s++;
            continue;
        }
        if (g->nsizes == MAX_SIZES)
            return -1;
        double v = strtod(s, &end);
        if (end == s || v <= 0)
            return -1;
        g->mib[g->nsizes++] = v;
        s = end;
    }
    return g->nsizes > 0 ? 0 : -1;
}

/* -o: op names separated by commas or spaces. */
static int parse_ops(struct cfg *g, const char *s)
{
    const char *names[NOPS];

    for (int k = 0; k < NOPS; k++)
        names[k] = ops[k].name;
    return parse_names(s, names, NOPS, g->run);
}

static void usage(const char *argv0)
{
    fprintf(
        stderr,
        "usage: %s [-s SOCKET] [-j JOB] [-z \"1 4 16 64 256\"] [-r REPEATS] "
        "[-w WARMUP] [-o fp32,1bit,allgather,reduce_scatter] "
        "[-c OBCOMMCTL] [-d DEV] [-t MS] [-L LOCAL_SIZE -l LOCAL_RANK]\n",
        argv0);
}

/* One op of `count` elements of the whole tensor (a multiple of the
 * world size for allgather and reduce-scatter). */
static int call(obcomm_t *c, enum bench_op k, const struct bufs *b,
                size_t count, uint64_t key)
{
    size_t part = count / (size_t)obcomm_size(c);

    switch (k) {
    case OP_FP32:
        return obcomm_allreduce(c, b->x, count, OBCOMM_FLOAT32, OBCOMM_SUM);
    case OP_1BIT:
        return obcomm_allreduce_1bit(c, key, b->x, count);
    case OP_ALLGATHER:
        return obcomm_allgather(c, b->y, b->x, part, OBCOMM_FLOAT32);
    case OP_REDUCE_SCATTER:
        return obcomm_reduce_scatter(c, b->x, b->y, part, OBCOMM_FLOAT32,
                                     OBCOMM_SUM);
    case NOPS:
        break;
    }
    return OBCOMM_E_INVAL;
}

/* Runs one (op, size): warm-up, timed repeats, one JSON line. */
static int run_one(obcomm_t *c, const struct cfg *g, const struct bufs *b,
                   enum bench_op k, size_t count, double mib, uint64_t key)
{
    double t[MAX_REPEATS];
    const char *counter = ops[k].counter;
    long long d0 = -1, d1, n0 = -1, n1;
    int rc;

    for (int i = 0; i < g->warmup + g->repeats; i++) {
        if (i == g->warmup) {
            d0 = daemon_counter(g, counter);
            n0 = dev_tx_bytes(g->dev);
        }
        rc = obcomm_barrier(c);
        if (rc)
            goto fail;
        double t0 = now_ms();
        rc = call(c, k, b, count, key);
        double t1 = now_ms();
        if (rc)
            goto fail;
        if (i >= g->warmup)
            t[i - g->warmup] = t1 - t0;
    }
    /* Every rank has finished its op, so every node's sends are counted. */
    rc = obcomm_barrier(c);
    if (rc)
        goto fail;
    d1 = daemon_counter(g, counter);
    n1 = dev_tx_bytes(g->dev);

    double s[MAX_REPEATS];
    memcpy(s, t, sizeof(double) * g->repeats);
    qsort(s, g->repeats, sizeof(double), cmp_double);
    double med = g->repeats % 2
                     ? s[g->repeats / 2]
                     : (s[g->repeats / 2 - 1] + s[g->repeats / 2]) / 2;
    printf("{\"contender\":\"%s\",\"op\":\"%s\",\"nodes\":%d,\"rank\":%d,"
           "\"mib\":%g,\"count\":%zu,\"repeats\":%d,\"warmup\":%d,"
           "\"median_ms\":%.3f,\"min_ms\":%.3f,\"max_ms\":%.3f,"
           "\"daemon_bytes_per_op\":%lld,\"dev_tx_bytes_per_op\":%lld,"
           "\"times_ms\":[",
           ops[k].contender, ops[k].collective, obcomm_size(c), obcomm_rank(c),
           mib, count, g->repeats, g->warmup, med, s[0], s[g->repeats - 1],
           d0 >= 0 && d1 >= 0 ? (d1 - d0) / g->repeats : -1,
           n0 >= 0 && n1 >= 0 ? (n1 - n0) / g->repeats : -1);
    for (int i = 0; i < g->repeats; i++)
        printf("%s%.3f", i ? "," : "", t[i]);
    printf("]}\n");
    fflush(stdout);
    return 0;
fail:
    fprintf(stderr, "bench_allreduce: %s %g MiB: %s: %s\n", ops[k].name, mib,
            obcomm_strerror(rc), obcomm_last_error(c));
    return 1;
}

/* Small values of both signs, different on every rank, written before
 * every (op, size): fp32 sums stay finite whatever ran before, and the
 * 1-bit codec sees a realistic mix of signs. */
static void fill(const struct bufs *b, size_t xcount, size_t ycount, int rank)
{
    uint32_t r = 2463534242u + (uint32_t)rank;
    for (size_t i = 0; i < xcount + ycount; i++) {
        r ^= r << 13, r ^= r >> 17, r ^= r << 5;
        float v = ((float)(r >> 8) / 16777216.0f - 0.5f) * 1e-3f;
        if (i < xcount)
            b->x[i] = v;
        else
            b->y[i - xcount] = v;
    }
}

int main(int argc, char **argv)
{
    struct cfg g = {.dev = "ob0",
                    .repeats = 5,
                    .warmup = 1,
                    .run = {[OP_FP32] = 1, [OP_1BIT] = 1}};
    obcomm_options_t o = {
        .job = "bench", .local_size = 1, .timeout_ms = 600000};
    int opt;

    parse_sizes(&g, "1 4 16 64 256");
    while ((opt = getopt(argc, argv, "s:j:z:r:w:o:c:d:t:L:l:h")) != -1) {
        switch (opt) {
        case 's':
            o.socket_path = optarg;
            break;
        case 'j':
            o.job = optarg;
            break;
        case 'z':
            if (parse_sizes(&g, optarg)) {
                fprintf(stderr, "bench_allreduce: bad sizes '%s'\n", optarg);
                return 2;
            }
            break;
        case 'r':
            g.repeats = atoi(optarg);
            break;
        case 'w':
            g.warmup = atoi(optarg);
            break;
        case 'o':
            if (parse_ops(&g, optarg)) {
                fprintf(stderr, "bench_allreduce: bad ops '%s'\n", optarg);
                return 2;
            }
            break;
        case 'c':
            g.ctl = optarg;
            break;
        case 'd':
            g.dev = optarg;
            break;
        case 't':
            o.timeout_ms = atoi(optarg);
            break;
        case 'L':
            o.local_size = atoi(optarg);
            break;
        case 'l':
            o.local_rank = atoi(optarg);
            break;
        default:
            usage(argv[0]);
            return opt == 'h' ? 0 : 2;
        }
    }
    if (g.repeats < 1 || g.repeats > MAX_REPEATS || g.warmup < 0) {
        usage(argv[0]);
        return 2;
    }
    g.sock = o.socket_path ? o.socket_path : getenv("OBCOMM_SOCKET");
    if (g.sock == NULL)
        g.sock = OBCOMM_DEFAULT_SOCKET;

    obcomm_t *c;
    int rc = obcomm_connect(&o, &c);
    if (rc) {
        fprintf(stderr, "bench_allreduce: connect: %s: %s\n",
                obcomm_strerror(rc), obcomm_last_error(NULL));
        return 1;
    }
    double maxmib = 0;
    for (int i = 0; i < g.nsizes; i++)
        if (g.mib[i] > maxmib)
            maxmib = g.mib[i];
    size_t maxcount = (size_t)(maxmib * 1048576.0 / sizeof(float));
    size_t maxpart = maxcount / (size_t)obcomm_size(c) + 1;
    struct bufs b;
    rc = obcomm_alloc(c, maxcount * sizeof(float), (void **)&b.x);
    if (rc == 0)
        rc = obcomm_alloc(c, maxpart * sizeof(float), (void **)&b.y);
    if (rc) {
        fprintf(stderr, "bench_allreduce: alloc %zu + %zu floats: %s\n",
                maxcount, maxpart, obcomm_strerror(rc));
        obcomm_close(c);
        return 1;
    }

    int bad = 0;
    for (int i = 0; i < g.nsizes && !bad; i++) {
        size_t count = (size_t)(g.mib[i] * 1048576.0 / sizeof(float));
        for (int k = 0; k < NOPS && !bad; k++) {
            if (!g.run[k])
                continue;
            /* The allgather's parts and the reduce-scatter's blocks are
             * equal: round the whole tensor down to a multiple of the
             * world. */
            size_t n = k == OP_ALLGATHER || k == OP_REDUCE_SCATTER
                           ? count - count % (size_t)obcomm_size(c)
                           : count;
            fill(&b, maxcount, maxpart, obcomm_rank(c));
            bad |= run_one(c, &g, &b, (enum bench_op)k, n, g.mib[i],
                           1000 + (uint64_t)i);
        }
    }
    obcomm_close(c);
    return bad;
}
