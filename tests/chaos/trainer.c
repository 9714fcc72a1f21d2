/* chaos-trainer: one trainer of the chaos test (tests/chaos/chaos.py), in C
 * over libobcomm so that the many short runs of the test start in
 * milliseconds on a busy machine. A deterministic stream of collectives,
 * one JSON line per op in a log.
 *
 *   chaos-trainer LOG --ops N [--start S] [--stop-file F] [--pace-ms M]
 *                 [--restore] [--save] [--save-dir D] [--restore-id ID]
 *                 [--verify | --snapshot] [--pause-file F --resume-file F]
 *                 [--timeout-ms T] [--wait-s W] [--linger-ms L]
 *
 * The environment is torchrun's: OBCOMM_SOCKET, OBCOMM_JOB, LOCAL_RANK,
 * LOCAL_WORLD_SIZE (tests/python/cluster.py sets the same).
 *
 * The stream: op `seq` is the (seq % 3)-th of: a 1-bit allreduce on key 11
 * (1 Mi floats), a 1-bit allreduce on key 12 (100003 floats), an fp32 sum
 * allreduce (65536 floats). Its input is a deterministic function of (seq,
 * node rank) only, so a healthy run from zero gives the same results bit
 * for bit every time; the log carries a sha256 of every result. The trainer
 * runs ops --start .. N-1 and stops early before an op whose seq is at
 * least the number in --stop-file once that file exists. A failed op is
 * logged and the stream goes on (the checker wants to see what later ops
 * do); after 20 failures in a row it slows to one op per 50 ms.
 *
 *   --restore  first obcomm_adam_load of one optimizer per 1-bit key from
 *              --save-dir (the explicit resume of docs/design.md, "The
 *              1-bit state's lifecycle and failures"); a failed load ends
 *              the trainer there, as it would a real one
 *   --save     after the stream, obcomm_adam_save of those optimizers
 *              (--save-dir/rankR.keyK.adam, and obcomm_snapshot_1bit)
 *   --restore-id ID  first obcomm_restore_1bit of snapshot set ID (hex),
 *              logged as a "restore" line with key 0; the stream follows
 *              whatever it returned
 *   --verify   after the stream a barrier, a pause with nothing in flight
 *              (--pause-file marks it) until --resume-file exists, then a
 *              second barrier: the driver reads every daemon's status
 *   --snapshot after the stream a barrier, a pause as --verify's, then
 *              obcomm_save_1bit, logged as a "snapshot" line with the id
 *              ("" on failure): the driver cuts a node during that op
 *   --linger-ms  at the end, stay joined this long before leaving the job
 *              (a trainer whose exit is slow: its node's run is still
 *              leaving while the next run starts elsewhere)
 *
 * Log lines: {"ev": "start"|"op"|"stopped"|"save"|"restore"|"barrier"|
 * "snapshot"|"end", ...}; "op" lines carry seq, kind, key, status (0 or the
 * negative obcomm code), name (obcomm_strerror), msg (obcomm_last_error),
 * digest
 * ("" on failure), t0 and t1 (wall clock, seconds). Exit status 0 when the
 * trainer ran to its end whatever the ops returned, 2 on bad usage, 3 when
 * it could not join its daemon.
 */
#include <obcomm.h>

#include <sodium.h>

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NKINDS     3
#define FAILS_SLOW 20

static const struct {
    const char *kind;
    uint64_t key;
    size_t count;
} OPS[NKINDS] = {
    {"1bit", 11, 1u << 20},
    {"1bit", 12, 100003},
    {"fp32", 0, 65536},
};

struct args {
    const char *log, *stop_file, *pause_file, *resume_file, *save_dir;
    long start, ops;
    double pace_ms, wait_s, linger_ms;
    int restore, save, verify, snapshot, timeout_ms;
    int has_restore_id;
    uint64_t restore_id;
};

static FILE *logf_;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(double ms)
{
    struct timespec ts = {(time_t)(ms / 1000),
                          (long)((ms - 1000.0 * (time_t)(ms / 1000)) * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* A JSON string: quotes, backslashes and control bytes escaped; other
 * bytes as they are (the daemon's messages are ASCII). */
static void jstr(const char *s)
{
    fputc('"', logf_);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(logf_, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            fprintf(logf_, "\\u%04x", c);
        else
            fputc(c, logf_);
    }
    fputc('"', logf_);
}

static void log_end(void)
{
    fputs("}\n", logf_);
    fflush(logf_);
}

static void log_begin(const char *ev)
{
    fprintf(logf_, "{\"ev\": \"%s\", \"t\": %.6f", ev, now_s());
}

static void log_status(int rc, const char *msg)
{
    fprintf(logf_, ", \"status\": %d, \"name\": ", rc);
    jstr(rc ? obcomm_strerror(rc) : "ok");
    fputs(", \"msg\": ", logf_);
    jstr(rc ? msg : "");
}

/* splitmix64: the per-(node, kind) base tensors. */
static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float unit(uint64_t *s)
{
    return (float)((double)(mix(s) >> 11) * (1.0 / 9007199254740992.0)) * 2.0f -
           1.0f;
}

/* x(seq) = base rotated by seq * 7919 and scaled by a factor of seq. */
static void fill(float *x, const float *base, size_t n, long seq)
{
    size_t shift = (size_t)((uint64_t)seq * 7919u % n);
    float scale = 0.25f + (float)((seq * 37) % 17) / 8.0f;
    for (size_t i = 0; i < n; i++) {
        size_t j = i + shift < n ? i + shift : i + shift - n;
        x[i] = base[j] * scale;
    }
}

static void digest(const float *x, size_t n, char hex[65])
{
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, (const unsigned char *)x, n * sizeof(float));
    sodium_bin2hex(hex, 65, h, sizeof(h));
}

static long stop_seq(const char *path)
{
    if (path == NULL)
        return -1;
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    long v = -1;
    if (fscanf(f, "%ld", &v) != 1)
        v = -1;
    fclose(f);
    return v;
}

static int run_op(obcomm_t *c, float **bufs, float **base, long seq)
{
    int k = (int)(seq % NKINDS);
    float *x = bufs[k];
    fill(x, base[k], OPS[k].count, seq);
    double t0 = now_s();
    int rc = OPS[k].key ? obcomm_allreduce_1bit(c, OPS[k].key, x, OPS[k].count)
                        : obcomm_allreduce(c, x, OPS[k].count, OBCOMM_FLOAT32,
                                           OBCOMM_SUM);
    double t1 = now_s();
    char hex[65] = "";
    if (rc == 0)
        digest(x, OPS[k].count, hex);
    log_begin("op");
    fprintf(logf_,
            ", \"seq\": %ld, \"kind\": \"%s\", \"key\": %llu, \"t0\": %.6f, "
            "\"t1\": %.6f, \"digest\": \"%s\"",
            seq, OPS[k].kind, (unsigned long long)OPS[k].key, t0, t1, hex);
    log_status(rc, obcomm_last_error(c));
    log_end();
    return rc;
}

static void stream(obcomm_t *c, float **bufs, float **base,
                   const struct args *a)
{
    int fails = 0;
    for (long seq = a->start; seq < a->ops; seq++) {
        long stop = stop_seq(a->stop_file);
        if (stop >= 0 && seq >= stop) {
            log_begin("stopped");
            fprintf(logf_, ", \"seq\": %ld", seq);
            log_end();
            break;
        }
        fails = run_op(c, bufs, base, seq) ? fails + 1 : 0;
        if (fails >= FAILS_SLOW)
            sleep_ms(50);
        else if (a->pace_ms > 0)
            sleep_ms(a->pace_ms);
    }
}

/* obcomm_adam_save or _load of one optimizer (never stepped) per 1-bit
 * key. Returns 0 when every call succeeded. */
static int adam_all(obcomm_t *c, const struct args *a, int load)
{
    obcomm_adam_config_t cfg = obcomm_adam_defaults();
    for (int k = 0; k < NKINDS; k++) {
        if (OPS[k].key == 0)
            continue;
        obcomm_adam_t *opt = NULL;
        char path[4096];
        snprintf(path, sizeof(path), "%s/rank%d.key%llu.adam", a->save_dir,
                 obcomm_rank(c), (unsigned long long)OPS[k].key);
        double t0 = now_s();
        int rc = obcomm_adam_create(c, OPS[k].key, OPS[k].count, &cfg, &opt);
        if (rc == 0)
            rc = load ? obcomm_adam_load(opt, path)
                      : obcomm_adam_save(opt, path);
        log_begin(load ? "restore" : "save");
        fprintf(logf_, ", \"key\": %llu, \"t0\": %.6f, \"t1\": %.6f",
                (unsigned long long)OPS[k].key, t0, now_s());
        log_status(rc, obcomm_last_error(c));
        log_end();
        obcomm_adam_destroy(opt);
        if (rc)
            return rc;
    }
    return 0;
}

/* obcomm_restore_1bit of set `id`, logged. */
static void restore_id(obcomm_t *c, uint64_t id)
{
    double t0 = now_s();
    int rc = obcomm_restore_1bit(c, id);
    log_begin("restore");
    fprintf(logf_,
            ", \"key\": 0, \"id\": \"%016llx\", \"t0\": %.6f, "
            "\"t1\": %.6f",
            (unsigned long long)id, t0, now_s());
    log_status(rc, obcomm_last_error(c));
    log_end();
}

/* obcomm_save_1bit, logged with the set's id ("" on failure). */
static void save_1bit(obcomm_t *c)
{
    uint64_t id = 0;
    double t0 = now_s();
    int rc = obcomm_save_1bit(c, &id);
    log_begin("snapshot");
    if (rc == 0)
        fprintf(logf_, ", \"id\": \"%016llx\"", (unsigned long long)id);
    else
        fputs(", \"id\": \"\"", logf_);
    fprintf(logf_, ", \"t0\": %.6f, \"t1\": %.6f", t0, now_s());
    log_status(rc, obcomm_last_error(c));
    log_end();
}

static int barrier(obcomm_t *c)
{
    int rc = obcomm_barrier(c);
    log_begin("barrier");
    log_status(rc, obcomm_last_error(c));
    log_end();
    return rc;
}

static int touch(const char *path)
{
    FILE *f = fopen(path, "w");
    return f ? fclose(f) : -1;
}

static int usage(void)
{
    fprintf(stderr, "usage: chaos-trainer LOG --ops N [--start S] "
                    "[--stop-file F] [--pace-ms M] [--restore] [--save] "
                    "[--save-dir D] [--restore-id ID] [--verify | "
                    "--snapshot] [--pause-file F --resume-file F] "
                    "[--timeout-ms T] [--wait-s W] [--linger-ms L]\n");
    return 2;
}

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

int main(int argc, char **argv)
{
    struct args a = {.ops = -1, .wait_s = 120};
    static const struct option opts[] = {
        {"ops", required_argument, 0, 'n'},
        {"start", required_argument, 0, 's'},
        {"stop-file", required_argument, 0, 'S'},
        {"pace-ms", required_argument, 0, 'p'},
        {"restore", no_argument, 0, 'R'},
        {"save", no_argument, 0, 'W'},
        {"save-dir", required_argument, 0, 'd'},
        {"verify", no_argument, 0, 'V'},
        {"pause-file", required_argument, 0, 'P'},
        {"resume-file", required_argument, 0, 'r'},
        {"timeout-ms", required_argument, 0, 't'},
        {"wait-s", required_argument, 0, 'w'},
        {"linger-ms", required_argument, 0, 'L'},
        {"snapshot", no_argument, 0, 'X'},
        {"restore-id", required_argument, 0, 'I'},
        {0, 0, 0, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'n':
            a.ops = atol(optarg);
            break;
        case 's':
            a.start = atol(optarg);
            break;
        case 'S':
            a.stop_file = optarg;
            break;
        case 'p':
            a.pace_ms = atof(optarg);
            break;
        case 'R':
            a.restore = 1;
            break;
        case 'W':
            a.save = 1;
            break;
        case 'd':
            a.save_dir = optarg;
            break;
        case 'V':
            a.verify = 1;
            break;
        case 'P':
            a.pause_file = optarg;
            break;
        case 'r':
            a.resume_file = optarg;
            break;
        case 't':
            a.timeout_ms = atoi(optarg);
            break;
        case 'w':
            a.wait_s = atof(optarg);
            break;
        case 'L':
            a.linger_ms = atof(optarg);
            break;
        case 'X':
            a.snapshot = 1;
            break;
        case 'I': {
            char *end;
            errno = 0;
            a.restore_id = strtoull(optarg, &end, 16);
            if (errno != 0 || end == optarg || *end != '\0')
                return usage();
            a.has_restore_id = 1;
            break;
        }
        default:
            return usage();
        }
    }
    if (optind != argc - 1 || a.ops < 0 ||
        ((a.restore || a.save) && a.save_dir == NULL) ||
        (a.verify && a.snapshot) ||
        ((a.verify || a.snapshot) &&
         (a.pause_file == NULL || a.resume_file == NULL)))
        return usage();
    a.log = argv[optind];
    if (sodium_init() < 0)
        return 1;
    logf_ = fopen(a.log, "a");
    if (logf_ == NULL) {
        perror(a.log);
        return 1;
    }

    obcomm_options_t opt = {.job = getenv("OBCOMM_JOB"),
                            .local_rank = env_int("LOCAL_RANK", 0),
                            .local_size = env_int("LOCAL_WORLD_SIZE", 1),
                            .timeout_ms = a.timeout_ms};
    obcomm_t *c = NULL;
    int rc = obcomm_connect(&opt, &c);
    log_begin("start");
    if (rc) {
        log_status(rc, obcomm_last_error(NULL));
        log_end();
        return 3;
    }
    fprintf(logf_, ", \"rank\": %d, \"size\": %d, \"pid\": %ld", obcomm_rank(c),
            obcomm_size(c), (long)getpid());
    log_status(0, "");
    log_end();

    int node = obcomm_rank(c) / opt.local_size;
    float *base[NKINDS], *bufs[NKINDS];
    for (int k = 0; k < NKINDS; k++) {
        uint64_t s = 1000003u * (uint64_t)(node + 1) + 7919u * (uint64_t)k;
        base[k] = malloc(OPS[k].count * sizeof(float));
        rc = base[k] ? obcomm_alloc(c, OPS[k].count * sizeof(float),
                                    (void **)&bufs[k])
                     : OBCOMM_E_NOMEM;
        if (rc) {
            fprintf(stderr, "chaos-trainer: buffers: %s\n",
                    obcomm_strerror(rc));
            return 1;
        }
        for (size_t i = 0; i < OPS[k].count; i++)
            base[k][i] = unit(&s) + 0.5f * unit(&s);
    }

    if (a.restore && adam_all(c, &a, 1) != 0)
        goto out;
    if (a.has_restore_id)
        restore_id(c, a.restore_id);
    stream(c, bufs, base, &a);
    if (a.save)
        adam_all(c, &a, 0);
    if ((a.verify || a.snapshot) && barrier(c) == 0) {
        touch(a.pause_file);
        double deadline = now_s() + a.wait_s;
        while (access(a.resume_file, F_OK) != 0 && now_s() < deadline)
            sleep_ms(20);
        if (a.verify)
            barrier(c);
        else
            save_1bit(c);
    }
    if (a.linger_ms > 0)
        sleep_ms(a.linger_ms);
out:
    obcomm_close(c);
    for (int k = 0; k < NKINDS; k++)
        free(base[k]);
    log_begin("end");
    log_end();
    fclose(logf_);
    return 0;
}
