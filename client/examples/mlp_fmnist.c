/* obcomm-fmnist: a real data-parallel training run on Fashion-MNIST with
 * libobcomm's 1-bit Adam. One process per trainer; every trainer joins the
 * job on its node's daemon.
 *
 * Model: an MLP 784 -> 256 (ReLU) -> 10, softmax cross-entropy, fp32, all
 * parameters in one flat vector [W1 | b1 | W2 | b2]. Trainer r of W trains
 * on its shard (training samples i with i % W == r), B samples per step,
 * reshuffled every epoch from (seed, rank, epoch). Rank 0 initialises the
 * parameters from the seed and broadcasts them, so every rank starts, and
 * (the optimizer guarantees it) stays, bitwise identical. That is checked
 * every --check-every steps: each rank hashes its parameters and one MAX
 * allreduce of (h, -h) yields both the largest and the smallest hash.
 *
 * Loss log: each rank records its own minibatch loss every step; at each
 * check the buffered losses are averaged over the ranks with one allreduce
 * (a few hundred bytes per check, not one collective per step), and rank 0
 * appends "step,loss" rows to --log. The loss of a row is therefore the mean
 * cross-entropy over the W*B samples of that global step.
 *
 * At the end every rank evaluates its share of the 10000 test and 60000
 * training images; one SUM allreduce combines them and rank 0 prints one
 * JSON line (test accuracy, full training loss, timings).
 *
 * Exit status: 0 done, 1 error, 2 usage, 3 training diverged (a non-finite
 * loss or momentum; the JSON line then has "diverged_at_step").
 *
 *   obcomm-fmnist [--mode adam|onebit|onebit-noef] [--steps N] [--batch B]
 *                 [--lr X] [--schedule constant|cosine] [--freeze-frac F]
 *                 [--seed S] [--data DIR] [--log FILE] [-s SOCKET] [-j JOB]
 *                 [-r LOCAL_RANK] [-n LOCAL_SIZE] ...   (--help lists all)
 */
#include <obcomm.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#define IN 784 /* 28 x 28 pixels */
#ifndef HID    /* obcomm-fmnist-wide builds with -DHID=4096 */
#define HID 256
#endif
#define OUT     10
#define N_W1    (HID * IN)
#define N_B1    HID
#define N_W2    (OUT * HID)
#define N_B2    OUT
#define NPARAMS (N_W1 + N_B1 + N_W2 + N_B2)

#define MAX_SAMPLES 1000000 /* bound on an IDX file's sample count */
#define EVAL_BATCH  256
#define ADAM_KEY    0xF3A1u

/* ---------------------------------------------------------------- data */

struct dataset {
    size_t n;
    uint8_t *x; /* n * IN pixels */
    uint8_t *y; /* n labels in [0, OUT) */
};

static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("obcomm-fmnist: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return -1;
}

/* Reads exactly len bytes; 0 on success. */
static int gz_read_all(gzFile f, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        unsigned chunk = len > (1u << 30) ? (1u << 30) : (unsigned)len;
        int n = gzread(f, p, chunk);
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Opens an IDX file (gzipped or plain: zlib reads both) of unsigned bytes
 * with `ndim` dimensions, checks the header against `want` (0: any value up
 * to MAX_SAMPLES) and returns the payload in *data (caller frees) and the
 * first dimension in *n. */
static int idx_read(const char *path, int ndim, const uint32_t *want,
                    uint8_t **data, size_t *n)
{
    gzFile f = gzopen(path, "rb");
    if (f == NULL)
        return fail("%s: %s", path, strerror(errno ? errno : ENOENT));
    uint8_t magic[4];
    uint32_t dims[4];
    size_t total = 1;
    uint8_t *buf = NULL;
    if (gz_read_all(f, magic, 4) != 0) {
        fail("%s: too short for an IDX header", path);
        goto bad;
    }
    if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 ||
        magic[3] != ndim) {
        fail("%s: not an IDX file of unsigned bytes with %d dimensions "
             "(magic %02x %02x %02x %02x)",
             path, ndim, magic[0], magic[1], magic[2], magic[3]);
        goto bad;
    }
    for (int d = 0; d < ndim; d++) {
        uint8_t b[4];
        if (gz_read_all(f, b, 4) != 0) {
            fail("%s: truncated header", path);
            goto bad;
        }
        dims[d] = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 |
                  (uint32_t)b[2] << 8 | b[3];
        uint32_t bound = want[d] ? want[d] : MAX_SAMPLES;
        if (dims[d] == 0 || dims[d] > bound ||
            (want[d] && dims[d] != want[d])) {
            fail("%s: dimension %d is %" PRIu32 ", want %s%" PRIu32, path, d,
                 dims[d], want[d] ? "" : "1..", bound);
            goto bad;
        }
        total *= dims[d]; /* bounded: at most MAX_SAMPLES * IN */
    }
    if ((buf = malloc(total)) == NULL) {
        fail("%s: out of memory for %zu bytes", path, total);
        goto bad;
    }
    if (gz_read_all(f, buf, total) != 0) {
        fail("%s: truncated: want %zu bytes of data", path, total);
        goto bad;
    }
    uint8_t extra;
    if (gzread(f, &extra, 1) != 0) {
        fail("%s: trailing bytes after the data", path);
        goto bad;
    }
    gzclose(f);
    *data = buf;
    *n = dims[0];
    return 0;
bad:
    free(buf);
    gzclose(f);
    return -1;
}

/* Finds DIR/NAME.gz or DIR/NAME. */
static void data_path(char *out, size_t len, const char *dir, const char *name)
{
    snprintf(out, len, "%s/%s.gz", dir, name);
    FILE *f = fopen(out, "rb");
    if (f) {
        fclose(f);
        return;
    }
    snprintf(out, len, "%s/%s", dir, name);
}

static int load_split(const char *dir, const char *prefix, struct dataset *ds)
{
    char ip[4096], lp[4096], name[256];
    const uint32_t img_dims[3] = {0, 28, 28}, lab_dims[1] = {0};
    size_t ni, nl;
    snprintf(name, sizeof(name), "%s-images-idx3-ubyte", prefix);
    data_path(ip, sizeof(ip), dir, name);
    snprintf(name, sizeof(name), "%s-labels-idx1-ubyte", prefix);
    data_path(lp, sizeof(lp), dir, name);
    if (idx_read(ip, 3, img_dims, &ds->x, &ni) != 0)
        return -1;
    if (idx_read(lp, 1, lab_dims, &ds->y, &nl) != 0) {
        free(ds->x);
        return -1;
    }
    if (ni != nl) {
        free(ds->x);
        free(ds->y);
        return fail("%s: %zu images but %zu labels", prefix, ni, nl);
    }
    for (size_t i = 0; i < nl; i++)
        if (ds->y[i] >= OUT) {
            free(ds->x);
            free(ds->y);
            return fail("%s: label %zu is %u, want 0..9", lp, i, ds->y[i]);
        }
    ds->n = ni;
    return 0;
}

/* ----------------------------------------------------------------- rng */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float uniform(uint64_t *s, float lo, float hi) /* [lo, hi) */
{
    return lo + (hi - lo) * (float)((splitmix64(s) >> 40) * 0x1p-24);
}

/* ---------------------------------------------------------------- model */

/* Parameter and gradient views into a flat vector. */
struct view {
    float *w1, *b1, *w2, *b2;
};

static struct view view_of(float *p)
{
    struct view v = {p, p + N_W1, p + N_W1 + N_B1, p + N_W1 + N_B1 + N_W2};
    return v;
}

/* PyTorch's nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for
 * weights and biases. */
static void init_params(float *p, uint64_t seed)
{
    uint64_t s = seed ^ 0x1217C0DEull;
    struct view v = view_of(p);
    float a1 = 1.0f / sqrtf((float)IN), a2 = 1.0f / sqrtf((float)HID);
    for (size_t i = 0; i < N_W1; i++)
        v.w1[i] = uniform(&s, -a1, a1);
    for (size_t i = 0; i < N_B1; i++)
        v.b1[i] = uniform(&s, -a1, a1);
    for (size_t i = 0; i < N_W2; i++)
        v.w2[i] = uniform(&s, -a2, a2);
    for (size_t i = 0; i < N_B2; i++)
        v.b2[i] = uniform(&s, -a2, a2);
}

/* Eight partial sums let the compiler vectorise without reassociating.
 * n must be a multiple of 8 (it is 784 or 256 here). */
_Static_assert(IN % 8 == 0 && HID % 8 == 0, "dot() takes multiples of 8");
static inline float dot(const float *a, const float *b, size_t n)
{
    float acc[8] = {0};
    for (size_t i = 0; i < n; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += a[i + k] * b[i + k];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
           ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

struct work {
    size_t cap; /* samples */
    float *x;   /* cap * IN inputs in [0, 1] */
    float *h;   /* cap * HID hidden activations */
    float *d;   /* cap * OUT: probabilities, then dloss/dlogits */
    float *dh;  /* cap * HID */
    uint8_t *y;
};

static int work_init(struct work *w, size_t cap)
{
    w->cap = cap;
    w->x = malloc(cap * IN * sizeof(float));
    w->h = malloc(cap * HID * sizeof(float));
    w->d = malloc(cap * OUT * sizeof(float));
    w->dh = malloc(cap * HID * sizeof(float));
    w->y = malloc(cap);
    return w->x && w->h && w->d && w->dh && w->y ? 0 : -1;
}

static void work_fini(struct work *w)
{
    free(w->x);
    free(w->h);
    free(w->d);
    free(w->dh);
    free(w->y);
}

static void gather(struct work *w, const struct dataset *ds,
                   const uint32_t *idx, size_t nb)
{
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *src = ds->x + (size_t)idx[b] * IN;
        float *dst = w->x + b * IN;
        for (size_t i = 0; i < IN; i++)
            dst[i] = (float)src[i] * (1.0f / 255.0f);
        w->y[b] = ds->y[idx[b]];
    }
}

/* Forward pass of nb samples in w->x: w->d gets the softmax probabilities.
 * Returns the summed cross-entropy; *correct counts argmax hits. The outer
 * loop runs over the weight rows so each row of W1 is read once per batch
 * while it sits in L1. */
static double forward(const float *p, struct work *w, size_t nb, int *correct)
{
    struct view v = view_of((float *)p);
    for (size_t j = 0; j < HID; j++) {
        const float *row = v.w1 + j * IN;
        for (size_t b = 0; b < nb; b++) {
            float z = v.b1[j] + dot(row, w->x + b * IN, IN);
            w->h[b * HID + j] = z > 0 ? z : 0;
        }
    }
    double loss = 0;
    int hits = 0;
    for (size_t b = 0; b < nb; b++) {
        float *o = w->d + b * OUT, mx = -INFINITY;
        int arg = 0;
        for (size_t k = 0; k < OUT; k++) {
            o[k] = v.b2[k] + dot(v.w2 + k * HID, w->h + b * HID, HID);
            if (o[k] > mx) {
                mx = o[k];
                arg = (int)k;
            }
        }
        float sum = 0;
        for (size_t k = 0; k < OUT; k++)
            sum += (o[k] = expf(o[k] - mx));
        for (size_t k = 0; k < OUT; k++)
            o[k] /= sum;
        /* -log softmax computed from the logits' shifted exponentials,
         * stable for tiny probabilities. */
        loss += (double)logf(sum) - (double)logf(o[w->y[b]] * sum);
        hits += arg == w->y[b];
    }
    if (correct)
        *correct = hits;
    return loss;
}

/* Gradient of the mean cross-entropy over the nb samples of the last
 * forward pass, written to g (overwritten, not accumulated). */
static void backward(const float *p, float *g, struct work *w, size_t nb)
{
    struct view v = view_of((float *)p), gv = view_of(g);
    memset(g, 0, NPARAMS * sizeof(float));
    float inv = 1.0f / (float)nb;
    for (size_t b = 0; b < nb; b++) {
        float *d = w->d + b * OUT;
        d[w->y[b]] -= 1.0f;
        for (size_t k = 0; k < OUT; k++)
            d[k] *= inv;
    }
    /* Output layer, and the gradient reaching the hidden units. */
    for (size_t b = 0; b < nb; b++) {
        const float *d = w->d + b * OUT, *h = w->h + b * HID;
        float *dh = w->dh + b * HID;
        memset(dh, 0, HID * sizeof(float));
        for (size_t k = 0; k < OUT; k++) {
            float dk = d[k];
            float *gw = gv.w2 + k * HID;
            const float *wk = v.w2 + k * HID;
            for (size_t j = 0; j < HID; j++) {
                gw[j] += dk * h[j];
                dh[j] += dk * wk[j];
            }
            gv.b2[k] += dk;
        }
        for (size_t j = 0; j < HID; j++)
            if (h[j] <= 0)
                dh[j] = 0;
    }
    /* First layer: row j of dW1 is sum_b dh[b][j] * x_b. */
    for (size_t j = 0; j < HID; j++) {
        float *gw = gv.w1 + j * IN, gb = 0;
        for (size_t b = 0; b < nb; b++) {
            float s = w->dh[b * HID + j];
            if (s == 0)
                continue;
            const float *x = w->x + b * IN;
            for (size_t i = 0; i < IN; i++)
                gw[i] += s * x[i];
            gb += s;
        }
        gv.b1[j] = gb;
    }
}

/* ------------------------------------------------------------- training */

struct shard {
    uint32_t *idx; /* this rank's sample indices, in this epoch's order */
    size_t n, pos;
    long epoch;
    uint64_t seed;
    int rank, world;
};

static void shard_shuffle(struct shard *s)
{
    uint64_t st = s->seed * 0x100000001B3ull ^ (uint64_t)s->rank << 32 ^
                  (uint64_t)s->epoch;
    /* Start every epoch from the same order so it depends on (seed, rank,
     * epoch) only, not on the previous epochs. */
    for (size_t i = 0; i < s->n; i++)
        s->idx[i] = (uint32_t)((size_t)s->rank + i * (size_t)s->world);
    for (size_t i = s->n - 1; i > 0; i--) {
        size_t j = (size_t)(splitmix64(&st) % (i + 1));
        uint32_t t = s->idx[i];
        s->idx[i] = s->idx[j];
        s->idx[j] = t;
    }
    s->pos = 0;
}

/* The next nb indices of the shard, crossing into a new epoch as needed. */
static void shard_next(struct shard *s, uint32_t *out, size_t nb)
{
    for (size_t b = 0; b < nb; b++) {
        if (s->pos == s->n) {
            s->epoch++;
            shard_shuffle(s);
        }
        out[b] = s->idx[s->pos++];
    }
}

static uint64_t params_hash(const float *p)
{
    const uint8_t *b = (const uint8_t *)p;
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < NPARAMS * sizeof(float); i++)
        h = (h ^ b[i]) * 0x100000001B3ull;
    return h & 0x3FFFFFFFFFFFFFFFull; /* so that -h fits an int64 */
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct opts {
    const char *mode, *data, *log, *schedule, *mask, *dump;
    long steps;
    size_t batch;
    double lr, freeze_frac, eps;
    uint64_t seed;
    long check_every;
    int bias_correction;
};

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [options]\n"
            "  --mode M          adam | onebit | onebit-noef (default onebit)\n"
            "  --steps N         optimizer steps (default 1000)\n"
            "  --batch B         samples per trainer per step (default 32)\n"
            "  --lr X            learning rate (default 1e-3)\n"
            "  --schedule S      constant | cosine (to 0 at the last step; "
            "default constant)\n"
            "  --freeze-frac F   1-bit modes: warm-up = F * steps (default "
            "0.15)\n"
            "  --eps X           Adam epsilon (default 1e-8, as DeepSpeed)\n"
            "  --mask M          auto | off | RATIO: the optimizer's automatic "
            "momentum\n"
            "                    mask (obcomm_adam_set_auto_mask; default "
            "auto, off is\n"
            "                    the ablation)\n"
            "  --dump-freeze P   1-bit modes: write P.adam (optimizer at the "
            "freeze),\n"
            "                    P.p0 and P.p1 (parameters at the freeze and 1 "
            "step later)\n"
            "  --bias-correction Adam bias correction (default off, as "
            "DeepSpeed)\n"
            "  --seed S          initialisation and shuffling (default 1)\n"
            "  --data DIR        IDX files (default "
            "/usr/share/datasets/fashion-mnist)\n"
            "  --log FILE        rank 0 writes step,loss rows (mean over all "
            "ranks)\n"
            "  --check-every N   parameter check and loss log period (default "
            "100)\n"
            "  -s, --socket P    daemon socket ($OBCOMM_SOCKET)\n"
            "  -j, --job NAME    job name (default fmnist)\n"
            "  -r, --local-rank R, -n, --local-size N   trainers on this node\n"
            "  -t, --timeout-ms MS  per-op deadline\n",
            argv0);
}

static int parse(int argc, char **argv, struct opts *o, obcomm_options_t *co)
{
    enum {
        O_MODE = 256,
        O_STEPS,
        O_BATCH,
        O_LR,
        O_SCHED,
        O_FREEZE,
        O_EPS,
        O_BIAS,
        O_SEED,
        O_DATA,
        O_LOG,
        O_CHECK,
        O_MASK,
        O_DUMP,
        O_HELP
    };
    static const struct option lo[] = {{"mode", 1, 0, O_MODE},
                                       {"steps", 1, 0, O_STEPS},
                                       {"batch", 1, 0, O_BATCH},
                                       {"lr", 1, 0, O_LR},
                                       {"schedule", 1, 0, O_SCHED},
                                       {"freeze-frac", 1, 0, O_FREEZE},
                                       {"eps", 1, 0, O_EPS},
                                       {"bias-correction", 0, 0, O_BIAS},
                                       {"seed", 1, 0, O_SEED},
                                       {"data", 1, 0, O_DATA},
                                       {"log", 1, 0, O_LOG},
                                       {"check-every", 1, 0, O_CHECK},
                                       {"mask", 1, 0, O_MASK},
                                       {"dump-freeze", 1, 0, O_DUMP},
                                       {"socket", 1, 0, 's'},
                                       {"job", 1, 0, 'j'},
                                       {"local-rank", 1, 0, 'r'},
                                       {"local-size", 1, 0, 'n'},
                                       {"timeout-ms", 1, 0, 't'},
                                       {"help", 0, 0, O_HELP},
                                       {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "s:j:r:n:t:", lo, NULL)) != -1) {
        switch (c) {
        case O_MODE:
            o->mode = optarg;
            break;
        case O_STEPS:
            o->steps = atol(optarg);
            break;
        case O_BATCH:
            o->batch = (size_t)atol(optarg);
            break;
        case O_LR:
            o->lr = atof(optarg);
            break;
        case O_SCHED:
            o->schedule = optarg;
            break;
        case O_FREEZE:
            o->freeze_frac = atof(optarg);
            break;
        case O_EPS:
            o->eps = atof(optarg);
            break;
        case O_BIAS:
            o->bias_correction = 1;
            break;
        case O_SEED:
            o->seed = strtoull(optarg, NULL, 0);
            break;
        case O_DATA:
            o->data = optarg;
            break;
        case O_LOG:
            o->log = optarg;
            break;
        case O_CHECK:
            o->check_every = atol(optarg);
            break;
        case O_MASK:
            o->mask = optarg;
            break;
        case O_DUMP:
            o->dump = optarg;
            break;
        case 's':
            co->socket_path = optarg;
            break;
        case 'j':
            co->job = optarg;
            break;
        case 'r':
            co->local_rank = atoi(optarg);
            break;
        case 'n':
            co->local_size = atoi(optarg);
            break;
        case 't':
            co->timeout_ms = atoi(optarg);
            break;
        case O_HELP:
            usage(stdout, argv[0]);
            exit(0);
        default:
            usage(stderr, argv[0]);
            return -1;
        }
    }
    if (optind != argc)
        return fail("unexpected argument '%s'", argv[optind]);
    if (strcmp(o->mode, "adam") && strcmp(o->mode, "onebit") &&
        strcmp(o->mode, "onebit-noef"))
        return fail("--mode: want adam, onebit or onebit-noef, not '%s'",
                    o->mode);
    char *end;
    if (strcmp(o->mask, "auto") && strcmp(o->mask, "off") &&
        (strtod(o->mask, &end) < 0 || *end != '\0' || end == o->mask))
        return fail("--mask: want auto, off or a ratio >= 0, not '%s'",
                    o->mask);
    if (strcmp(o->schedule, "constant") && strcmp(o->schedule, "cosine"))
        return fail("--schedule: want constant or cosine");
    if (o->steps < 1 || o->steps > 100000000)
        return fail("--steps: want 1..1e8");
    if (o->batch < 1 || o->batch > 4096)
        return fail("--batch: want 1..4096");
    if (!(o->lr > 0) || !(o->freeze_frac >= 0 && o->freeze_frac <= 1) ||
        !(o->eps > 0))
        return fail("--lr and --eps want > 0, --freeze-frac 0..1");
    if (o->check_every < 1 || o->check_every > 100000)
        return fail("--check-every: want 1..100000");
    return 0;
}

static int coll_fail(obcomm_t *c, int rank, const char *what, int rc)
{
    return fail("rank %d: %s: %s: %s", rank, what, obcomm_strerror(rc),
                obcomm_last_error(c));
}

/* Averages the buffered per-rank losses over the ranks, writes them to the
 * log (rank 0), and checks that every rank holds the same parameters. */
/* --dump-freeze: PREFIX + suffix gets the parameters (raw floats). */
static int dump_params(const char *prefix, const char *suffix,
                       const float *params)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s%s", prefix, suffix);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(params, sizeof(float), NPARAMS, f) == NPARAMS;
    if (f && fclose(f) != 0)
        ok = 0;
    return ok ? 0 : fail("%s: %s", path, strerror(errno));
}

static int checkpoint(obcomm_t *c, int rank, const float *params, float *losses,
                      long first_step, long k, int64_t *hb, FILE *log,
                      long step_done)
{
    int rc = obcomm_allreduce(c, losses, (size_t)k, OBCOMM_FLOAT32, OBCOMM_AVG);
    if (rc)
        return coll_fail(c, rank, "loss allreduce", rc);
    if (log) {
        for (long i = 0; i < k; i++)
            fprintf(log, "%ld,%.6f\n", first_step + i, losses[i]);
        fflush(log);
    }
    int64_t h = (int64_t)params_hash(params);
    hb[0] = h;
    hb[1] = -h;
    rc = obcomm_allreduce(c, hb, 2, OBCOMM_INT64, OBCOMM_MAX);
    if (rc)
        return coll_fail(c, rank, "checksum allreduce", rc);
    if (hb[0] != -hb[1] || hb[0] != h)
        return fail(
            "rank %d: PARAMETERS DIVERGED after step %ld: hash here "
            "%016" PRIx64 ", max over ranks %016" PRIx64 ", min %016" PRIx64,
            rank, step_done, (uint64_t)h, (uint64_t)hb[0], (uint64_t)-hb[1]);
    return 0;
}

static void json_num(FILE *f, const char *name, double v, int last)
{
    if (isfinite(v))
        fprintf(f, "\"%s\": %.6g%s", name, v, last ? "" : ", ");
    else
        fprintf(f, "\"%s\": null%s", name, last ? "" : ", ");
}

int main(int argc, char **argv)
{
    struct opts o = {.mode = "onebit",
                     .data = "/usr/share/datasets/fashion-mnist",
                     .schedule = "constant",
                     .steps = 1000,
                     .batch = 32,
                     .lr = 1e-3,
                     .freeze_frac = 0.15,
                     /* DeepSpeed's eps: the optimizer's automatic mask
                      * keeps coordinates with a frozen v of 0 from
                      * exploding (docs/convergence.md, "1-bit Adam on
                      * Fashion-MNIST");
                      * --mask off shows what happens without it. */
                     .eps = 1e-8,
                     .mask = "auto",
                     .seed = 1,
                     .check_every = 100};
    obcomm_options_t co = {.job = "fmnist", .local_size = 1};
    if (parse(argc, argv, &o, &co) != 0)
        return 2;

    struct dataset train = {0}, test = {0};
    if (load_split(o.data, "train", &train) != 0 ||
        load_split(o.data, "t10k", &test) != 0)
        return 1;

    obcomm_t *c;
    int rc = obcomm_connect(&co, &c);
    if (rc) {
        fail("connect: %s: %s", obcomm_strerror(rc), obcomm_last_error(NULL));
        return 1;
    }
    int rank = obcomm_rank(c), world = obcomm_size(c);
    int status = 1;
    float *params = NULL, *grads = NULL, *losses = NULL;
    int64_t *hb = NULL;
    double *sums = NULL;
    obcomm_adam_t *adam = NULL;
    FILE *log = NULL;
    struct work w = {0};
    struct shard sh = {0};
    uint32_t *bidx = NULL;

    if ((rc = obcomm_alloc(c, NPARAMS * sizeof(float), (void **)&params)) ||
        (rc = obcomm_alloc(c, (size_t)o.check_every * sizeof(float),
                           (void **)&losses)) ||
        (rc = obcomm_alloc(c, 2 * sizeof(int64_t), (void **)&hb)) ||
        (rc = obcomm_alloc(c, 4 * sizeof(double), (void **)&sums))) {
        coll_fail(c, rank, "alloc", rc);
        goto out;
    }
    grads = malloc(NPARAMS * sizeof(float));
    size_t cap = o.batch > EVAL_BATCH ? o.batch : EVAL_BATCH;
    sh.n = (train.n + (size_t)world - 1 - (size_t)rank) / (size_t)world;
    sh.idx = malloc(sh.n * sizeof(uint32_t));
    bidx = malloc(cap * sizeof(uint32_t));
    if ((size_t)world > train.n) {
        fail("%d trainers but only %zu training samples", world, train.n);
        goto out;
    }
    if (grads == NULL || sh.idx == NULL || bidx == NULL ||
        work_init(&w, cap) != 0) {
        fail("rank %d: out of memory or empty shard", rank);
        goto out;
    }
    sh.seed = o.seed;
    sh.rank = rank;
    sh.world = world;
    shard_shuffle(&sh);

    /* Same start everywhere: rank 0's initialisation, broadcast. */
    if (rank == 0)
        init_params(params, o.seed);
    if ((rc = obcomm_broadcast(c, params, NPARAMS * sizeof(float), 0))) {
        coll_fail(c, rank, "broadcast", rc);
        goto out;
    }

    int onebit = strcmp(o.mode, "adam") != 0;
    obcomm_adam_config_t cfg = obcomm_adam_defaults();
    cfg.lr = (float)o.lr;
    cfg.eps = (float)o.eps;
    cfg.bias_correction = o.bias_correction;
    cfg.freeze_step =
        onebit ? (long)llround(o.freeze_frac * (double)o.steps) : o.steps + 1;
    if ((rc = obcomm_adam_create(c, ADAM_KEY, NPARAMS, &cfg, &adam))) {
        coll_fail(c, rank, "adam_create", rc);
        goto out;
    }
    if (!strcmp(o.mode, "onebit-noef"))
        obcomm_adam_set_error_feedback(adam, 0);
    if (!strcmp(o.mask, "off"))
        obcomm_adam_set_auto_mask(adam, -1.0f);
    else if (strcmp(o.mask, "auto"))
        obcomm_adam_set_auto_mask(adam, (float)atof(o.mask));

    if (rank == 0 && o.log) {
        if ((log = fopen(o.log, "w")) == NULL) {
            fail("%s: %s", o.log, strerror(errno));
            goto out;
        }
        fprintf(log, "step,loss\n");
    }
    if (rank == 0)
        fprintf(stderr,
                "obcomm-fmnist: %d trainers, mode %s, %ld steps of %zu per "
                "trainer, lr %g (%s), freeze_step %ld, %d parameters\n",
                world, o.mode, o.steps, o.batch, o.lr, o.schedule,
                cfg.freeze_step, NPARAMS);

    double t0 = now_s(), t_opt = 0, first_loss = NAN;
    /* Steps from the freeze fraction on are timed apart in every mode, so
     * that Adam and 1-bit Adam compare over the compression stage. */
    long tail_from = (long)llround(o.freeze_frac * (double)o.steps);
    double t_tail = NAN;
    long k = 0, diverged = -1;
    for (long step = 0; step < o.steps && diverged < 0; step++) {
        if (step == tail_from)
            t_tail = now_s();
        shard_next(&sh, bidx, o.batch);
        gather(&w, &train, bidx, o.batch);
        double loss = forward(params, &w, o.batch, NULL) / (double)o.batch;
        backward(params, grads, &w, o.batch);
        if (!strcmp(o.schedule, "cosine"))
            obcomm_adam_set_lr(adam, (float)(o.lr * 0.5 *
                                             (1.0 + cos(M_PI * (double)step /
                                                        (double)o.steps))));
        if (onebit && o.dump && step == cfg.freeze_step) {
            /* Evidence for the mask: v at the freeze, and where the
             * parameters go in the first compressed steps. */
            char path[4096];
            snprintf(path, sizeof(path), "%s.adam", o.dump);
            if ((rc = obcomm_adam_save(adam, path))) {
                coll_fail(c, rank, "adam_save", rc);
                goto out;
            }
            if (rank == 0 && dump_params(o.dump, ".p0", params))
                goto out;
        }
        if (onebit && o.dump && rank == 0 && step == cfg.freeze_step + 1 &&
            dump_params(o.dump, ".p1", params))
            goto out;
        double ts = now_s();
        rc = obcomm_adam_step(adam, params, grads);
        t_opt += now_s() - ts;
        if (rc == OBCOMM_E_NONFINITE) {
            /* The momentum overflowed: the same op failed on every rank,
             * so all of them stop here together. */
            diverged = step;
        } else if (rc) {
            coll_fail(c, rank, "adam_step", rc);
            goto out;
        } else {
            losses[k++] = (float)loss;
        }
        if (k > 0 &&
            (k == o.check_every || step + 1 == o.steps || diverged >= 0)) {
            long first = step + 1 - k - (diverged >= 0);
            if (checkpoint(c, rank, params, losses, first, k, hb, log,
                           step + 1) != 0)
                goto out;
            if (first == 0)
                first_loss = losses[0];
            /* An overflowing loss is divergence too (the same on every
             * rank: the averaged losses are identical). */
            for (long i = 0; i < k && diverged < 0; i++)
                if (!isfinite(losses[i]))
                    diverged = first + i;
            k = 0;
        }
    }
    if (diverged >= 0 && rank == 0)
        fprintf(stderr,
                "obcomm-fmnist: DIVERGED at step %ld (non-finite "
                "loss or momentum); evaluating the parameters as "
                "they are\n",
                diverged);
    double t_train = now_s() - t0;
    double tail_rate = (double)(o.steps - tail_from) / (now_s() - t_tail);

    /* Evaluation, split over the ranks like the training data. */
    double te = now_s();
    double test_loss = 0, train_loss = 0;
    long test_hits = 0, train_hits = 0;
    const struct dataset *sets[2] = {&test, &train};
    for (int s = 0; s < 2; s++) {
        const struct dataset *ds = sets[s];
        size_t nb = 0;
        for (size_t i = (size_t)rank; i < ds->n; i += (size_t)world) {
            bidx[nb++] = (uint32_t)i;
            if (nb == EVAL_BATCH || i + (size_t)world >= ds->n) {
                int hits;
                gather(&w, ds, bidx, nb);
                double l = forward(params, &w, nb, &hits);
                *(s ? &train_loss : &test_loss) += l;
                *(s ? &train_hits : &test_hits) += hits;
                nb = 0;
            }
        }
    }
    sums[0] = (double)test_hits;
    sums[1] = test_loss;
    sums[2] = (double)train_hits;
    sums[3] = train_loss;
    if ((rc = obcomm_allreduce(c, sums, 4, OBCOMM_FLOAT64, OBCOMM_SUM))) {
        coll_fail(c, rank, "eval allreduce", rc);
        goto out;
    }
    te = now_s() - te;
    if (rank == 0) {
        printf("{\"mode\": \"%s\", \"trainers\": %d, \"steps\": %ld, "
               "\"batch\": %zu, \"lr\": %g, \"schedule\": \"%s\", "
               "\"freeze_step\": %ld, \"seed\": %" PRIu64 ", ",
               o.mode, world, o.steps, o.batch, o.lr, o.schedule,
               cfg.freeze_step, o.seed);
        json_num(stdout, "test_accuracy", sums[0] / (double)test.n, 0);
        json_num(stdout, "test_loss", sums[1] / (double)test.n, 0);
        json_num(stdout, "train_accuracy", sums[2] / (double)train.n, 0);
        json_num(stdout, "train_loss", sums[3] / (double)train.n, 0);
        json_num(stdout, "first_step_loss", first_loss, 0);
        if (diverged >= 0)
            printf("\"diverged_at_step\": %ld, ", diverged);
        json_num(stdout, "train_seconds", t_train, 0);
        json_num(stdout, "tail_steps_per_second", tail_rate, 0);
        printf("\"hidden\": %d, \"parameters\": %d, ", HID, NPARAMS);
        printf("\"eps\": %g, \"mask\": \"%s\", \"masked\": %zu, ", o.eps,
               o.mask, onebit ? obcomm_adam_masked(adam) : (size_t)0);
        json_num(stdout, "optimizer_seconds", t_opt, 0);
        json_num(stdout, "eval_seconds", te, 1);
        printf("}\n");
        fflush(stdout);
    }
    status = diverged >= 0 ? 3 : 0;
out:
    if (log && fclose(log) != 0 && status == 0) {
        fail("%s: write failed", o.log);
        status = 1;
    }
    obcomm_adam_destroy(adam);
    obcomm_close(c);
    work_fini(&w);
    free(sh.idx);
    free(bidx);
    free(grads);
    free(train.x);
    free(train.y);
    free(test.x);
    free(test.y);
    return status;
}
