/* bench_allreduce: times obcomm_allreduce (fp32 SUM) and
 * obcomm_allreduce_1bit over a range of tensor sizes, as one trainer of a
 * node. Run one per node (deploy/netns-cluster.sh exec I ...).
 *
 *   bench_allreduce [-s SOCKET] [-j JOB] [-z "1 4 16 64 256"] [-r REPEATS]
 *                   [-w WARMUP] [-o fp32,1bit] [-c OBCOMMCTL] [-d DEV]
 *                   [-t TIMEOUT_MS] [-L LOCAL_SIZE -l LOCAL_RANK]
 *
 * For every size (MiB of fp32, -z) and op (-o), the program runs WARMUP
 * untimed ops, then REPEATS timed ones (-L/-l: one of LOCAL_SIZE trainers
 * of the node, default 1 and 0; every one of them prints its own lines); before
 * each op all ranks meet in obcomm_barrier, and only the collective itself is
 * timed. Each 1-bit size uses its own key (1000 + size index), so the error
 * feedback of one size never meets another's count.
 *
 * Bytes each node sends per op are measured two ways, both over the timed
 * repeats only (barriers included in the second):
 *   daemon_bytes  the daemon's counter (obcommctl --json metrics):
 *                 allreduce_bytes_sent for fp32, onebit_bytes_sent for 1-bit
 *                 (-c names obcommctl; without it the field is -1);
 *   dev_tx_bytes  tx_bytes of DEV in /proc/net/dev of the caller's network
 *                 namespace (frames with Ethernet/IP/TCP headers), -1 when
 *                 DEV (default ob0) is absent.
 *
 * Output: one JSON line per (op, size) on stdout with the median, min and
 * max time in ms and every repeat's time. */
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

struct cfg {
    const char *ctl, *dev, *sock;
    double mib[MAX_SIZES];
    int nsizes, repeats, warmup, fp32, onebit;
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

static void usage(const char *argv0)
{
    fprintf(
        stderr,
        "usage: %s [-s SOCKET] [-j JOB] [-z \"1 4 16 64 256\"] [-r REPEATS] "
        "[-w WARMUP] [-o fp32,1bit] [-c OBCOMMCTL] [-d DEV] [-t MS] "
        "[-L LOCAL_SIZE -l LOCAL_RANK]\n",
        argv0);
}

/* Runs one (op, size): warm-up, timed repeats, one JSON line. */
static int run_one(obcomm_t *c, const struct cfg *g, float *x, size_t count,
                   double mib, int onebit, uint64_t key)
{
    double t[MAX_REPEATS];
    const char *counter = onebit ? "onebit_bytes_sent" : "allreduce_bytes_sent";
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
        rc = onebit ? obcomm_allreduce_1bit(c, key, x, count)
                    : obcomm_allreduce(c, x, count, OBCOMM_FLOAT32, OBCOMM_SUM);
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
    printf("{\"contender\":\"%s\",\"nodes\":%d,\"rank\":%d,\"mib\":%g,"
           "\"count\":%zu,\"repeats\":%d,\"warmup\":%d,\"median_ms\":%.3f,"
           "\"min_ms\":%.3f,\"max_ms\":%.3f,\"daemon_bytes_per_op\":%lld,"
           "\"dev_tx_bytes_per_op\":%lld,\"times_ms\":[",
           onebit ? "obcomm_1bit" : "obcomm_fp32", obcomm_size(c),
           obcomm_rank(c), mib, count, g->repeats, g->warmup, med, s[0],
           s[g->repeats - 1], d0 >= 0 && d1 >= 0 ? (d1 - d0) / g->repeats : -1,
           n0 >= 0 && n1 >= 0 ? (n1 - n0) / g->repeats : -1);
    for (int i = 0; i < g->repeats; i++)
        printf("%s%.3f", i ? "," : "", t[i]);
    printf("]}\n");
    fflush(stdout);
    return 0;
fail:
    fprintf(stderr, "bench_allreduce: %s %g MiB: %s: %s\n",
            onebit ? "1bit" : "fp32", mib, obcomm_strerror(rc),
            obcomm_last_error(c));
    return 1;
}

int main(int argc, char **argv)
{
    struct cfg g = {
        .dev = "ob0", .repeats = 5, .warmup = 1, .fp32 = 1, .onebit = 1};
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
            g.fp32 = strstr(optarg, "fp32") != NULL;
            g.onebit = strstr(optarg, "1bit") != NULL;
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
    float *x;
    rc = obcomm_alloc(c, maxcount * sizeof(float), (void **)&x);
    if (rc) {
        fprintf(stderr, "bench_allreduce: alloc %zu floats: %s\n", maxcount,
                obcomm_strerror(rc));
        obcomm_close(c);
        return 1;
    }
    /* Small values of both signs: fp32 sums stay finite over many repeats,
     * and the 1-bit codec sees a realistic mix of signs. */
    uint32_t r = 2463534242u + (uint32_t)obcomm_rank(c);
    for (size_t i = 0; i < maxcount; i++) {
        r ^= r << 13, r ^= r >> 17, r ^= r << 5;
        x[i] = ((float)(r >> 8) / 16777216.0f - 0.5f) * 1e-3f;
    }

    int bad = 0;
    for (int i = 0; i < g.nsizes && !bad; i++) {
        size_t count = (size_t)(g.mib[i] * 1048576.0 / sizeof(float));
        if (g.fp32)
            bad |= run_one(c, &g, x, count, g.mib[i], 0, 0);
        if (g.onebit && !bad)
            bad |= run_one(c, &g, x, count, g.mib[i], 1, 1000 + (uint64_t)i);
    }
    obcomm_close(c);
    return bad;
}
