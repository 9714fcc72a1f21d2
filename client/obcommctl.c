/* obcommctl: shows what the node's obcommd is doing, for people (tables),
 * for scripts (--json, built with json-c) and for Prometheus (metrics
 * --format prometheus, the text exposition format that node_exporter's
 * textfile collector reads). It sends one StatusRequest over the daemon's
 * Unix socket and renders the StatusReply; metric names, help texts and
 * Prometheus names all come from the daemon's descriptors.
 *
 * Exit status: 0 on success, 1 when the daemon answers badly or the output
 * cannot be written, 2 on a usage error, 3 when the daemon cannot be
 * reached (no socket, refused, or no answer in time). */
#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <obcomm_build.h>

#include "obcomm.h"
#include "sock.h"
#include "text.h"
#include "wire.h"

/* How long to wait for the daemon's answer. A status query does no
 * collective work, so a healthy daemon answers at once. */
#define CTL_TIMEOUT_MS 10000

/* Widest cell a table column grows to; longer text is cut. */
#define CELL_MAX 64

/* Version of the --json layout: bumped when a field changes meaning or
 * goes away (new fields do not bump it). */
#define JSON_SCHEMA_VERSION 1

enum exit_code {
    EXIT_OK = 0,
    EXIT_FAILED = 1,
    EXIT_USAGE = 2,
    EXIT_UNREACHABLE = 3
};
enum cmd { CMD_STATUS, CMD_PEERS, CMD_OPS, CMD_METRICS };
enum format { F_TEXT, F_JSON, F_PROMETHEUS };

static const char *const cmd_names[] = {"status", "peers", "ops", "metrics"};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: obcommctl [-s PATH] [--json] [status|peers|ops|metrics]\n"
            "       obcommctl [-s PATH] metrics --format prometheus\n"
            "       obcommctl --version\n"
            "\n"
            "  status   the daemon, its world and one-line summaries "
            "(default)\n"
            "  peers    links to the other nodes' daemons: state, up time, "
            "reconnects,\n"
            "           round-trip time, bytes, last error\n"
            "  ops      open ops of every job: op, age, who has not arrived\n"
            "  metrics  counters and latency histograms\n"
            "\n"
            "  -s, --socket PATH    the daemon's socket (default: "
            "$OBCOMM_SOCKET, else %s)\n"
            "  --json               print JSON instead of text "
            "(= --format json)\n"
            "  --format FORMAT      text, json or prometheus (metrics only)\n"
            "  -V, --version        print the version and exit\n"
            "  -h, --help           show this help\n"
            "\n"
            "exit status: 0 ok, 1 failed, 2 usage, 3 daemon unreachable\n",
            OBCOMM_DEFAULT_SOCKET);
}

/* Copies daemon text into buf (len bytes) for a terminal: escaped as
 * obcomm_text_escape says (control bytes, ESC and invalid UTF-8 as "\n",
 * "\x1b", "\xff"), and cut to fit. */
static const char *clean(const char *s, char *buf, size_t len)
{
    obcomm_text_escape(buf, len, s);
    return buf;
}

/* Display width of cleaned text: one column per code point. */
static int width(const char *s)
{
    int w = 0;
    for (; *s; s++)
        w += ((unsigned char)*s & 0xc0) != 0x80;
    return w;
}

static const char *or_dash(const char *s)
{
    return s[0] ? s : "-";
}

static void pad(int n)
{
    for (; n > 0; n--)
        putchar(' ');
}

/* Prints a cleaned cell left-aligned in `w` columns. */
static void cell(const char *s, int w)
{
    char buf[4 * CELL_MAX + 1];
    clean(s, buf, sizeof(buf));
    /* Cut by columns, not bytes, so that wide scripts line up too. */
    int cols = 0;
    char *q = buf;
    for (; *q; q++) {
        if (((unsigned char)*q & 0xc0) != 0x80 && ++cols > CELL_MAX)
            break;
    }
    *q = '\0';
    fputs(buf, stdout);
    pad(w - width(buf));
}

static int cell_width(const char *s)
{
    char buf[4 * CELL_MAX + 1];
    int w = width(clean(s, buf, sizeof(buf)));
    return w > CELL_MAX ? CELL_MAX : w;
}

/* ---- JSON (json-c) ---- */

/* A JSON string of daemon text: invalid UTF-8 becomes U+FFFD so that the
 * output is always valid JSON (json-c passes bytes through). */
static json_object *jstr(const char *s)
{
    size_t n = strlen(s);
    char *buf = malloc(3 * n + 1);
    if (buf == NULL)
        return json_object_new_string("");
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0;
    while (*p) {
        size_t k = obcomm_utf8_len(p);
        if (k == 0) {
            memcpy(buf + o, "\xef\xbf\xbd", 3);
            o += 3;
            p++;
        } else {
            memcpy(buf + o, p, k);
            o += k;
            p += k;
        }
    }
    buf[o] = '\0';
    json_object *j = json_object_new_string(buf);
    free(buf);
    return j;
}

/* A JSON number: integers as integers (counters are), others as doubles,
 * non-finite values as null (JSON has no NaN). */
static json_object *jnum(double v)
{
    if (!isfinite(v))
        return NULL;
    if (fabs(v) < 9007199254740992.0 && v == (double)(int64_t)v)
        return json_object_new_int64((int64_t)v);
    return json_object_new_double(v);
}

static void jadd(json_object *o, const char *k, json_object *v)
{
    json_object_object_add(o, k, v);
}

static json_object *jroot(const char *command)
{
    json_object *o = json_object_new_object();
    jadd(o, "schema_version", json_object_new_int(JSON_SCHEMA_VERSION));
    jadd(o, "command", json_object_new_string(command));
    return o;
}

static int jprint(json_object *o)
{
    const char *text = json_object_to_json_string_ext(
        o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
    int rc = puts(text) < 0 ? -1 : 0;
    json_object_put(o);
    return rc;
}

/* ---- shared figures ---- */

/* A metric's value by name; 0 when the daemon does not report it. */
static double metric_value(const Obcomm__StatusReply *r, const char *name)
{
    for (size_t i = 0; i < r->n_metrics; i++)
        if (strcmp(r->metrics[i]->name, name) == 0)
            return r->metrics[i]->value;
    return 0;
}

/* The compression ratio of the 1-bit allreduce: fp32 bytes covered over
 * bytes this node put on the wire for it; 0 before the first one. */
static double compression_ratio(const Obcomm__StatusReply *r, double *logical,
                                double *wire)
{
    *logical = metric_value(r, "onebit_logical_bytes");
    *wire = metric_value(r, "onebit_bytes_sent");
    return *logical > 0 && *wire > 0 ? *logical / *wire : 0;
}

/* "3d04h", "2h05m", "4m10s", "12s", "850ms". */
static const char *duration(uint64_t ms, char *buf, size_t len)
{
    uint64_t s = ms / 1000;
    if (s >= 86400)
        snprintf(buf, len, "%" PRIu64 "d%02" PRIu64 "h", s / 86400,
                 s / 3600 % 24);
    else if (s >= 3600)
        snprintf(buf, len, "%" PRIu64 "h%02" PRIu64 "m", s / 3600, s / 60 % 60);
    else if (s >= 60)
        snprintf(buf, len, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
    else if (s > 0)
        snprintf(buf, len, "%" PRIu64 "s", s);
    else
        snprintf(buf, len, "%" PRIu64 "ms", ms);
    return buf;
}

/* ISO-8601 UTC time of a Unix time in milliseconds; "" for 0. */
static const char *iso_time(uint64_t unix_ms, char *buf, size_t len)
{
    if (unix_ms == 0) {
        buf[0] = '\0';
        return buf;
    }
    time_t t = (time_t)(unix_ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    char day[32];
    strftime(day, sizeof(day), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, len, "%s.%03uZ", day, (unsigned)(unix_ms % 1000));
    return buf;
}

static uint64_t age_of(const Obcomm__StatusReply *r, uint64_t unix_ms)
{
    return unix_ms && r->now_unix_ms > unix_ms ? r->now_unix_ms - unix_ms : 0;
}

/* ---- status ---- */

static void add_run_json(json_object *e, const Obcomm__JobStatus *j);

/* A job as JSON: its name, trainers, next op, run and keys. */
static json_object *job_json(const Obcomm__JobStatus *j)
{
    json_object *e = json_object_new_object();
    jadd(e, "name", jstr(j->name));
    jadd(e, "local_size", json_object_new_int64(j->local_size));
    jadd(e, "joined", json_object_new_int64(j->joined));
    jadd(e, "next_seq", json_object_new_uint64(j->next_seq));
    add_run_json(e, j);
    return e;
}

/* A job's run, why it stopped, and its 1-bit keys with their versions,
 * added to e. */
static void add_run_json(json_object *e, const Obcomm__JobStatus *j)
{
    char hex[24];
    snprintf(hex, sizeof(hex), "%016" PRIx64, j->run);
    jadd(e, "run", jstr(hex));
    jadd(e, "stopped", j->stopped[0] ? jstr(j->stopped) : NULL);
    json_object *keys = json_object_new_array();
    for (size_t k = 0; k < j->n_keys; k++) {
        const Obcomm__KeyStatus *ks = j->keys[k];
        json_object *x = json_object_new_object();
        jadd(x, "key", json_object_new_uint64(ks->key));
        jadd(x, "count", json_object_new_uint64(ks->count));
        jadd(x, "op_bytes", json_object_new_uint64(ks->op_bytes));
        uint64_t origin = ks->version ? ks->version->origin : 0;
        snprintf(hex, sizeof(hex), "%016" PRIx64, origin);
        jadd(x, "origin", jstr(hex));
        jadd(x, "applied",
             json_object_new_uint64(ks->version ? ks->version->applied : 0));
        jadd(x, "last_seq",
             json_object_new_uint64(ks->version ? ks->version->last_seq : 0));
        json_object_array_add(keys, x);
    }
    jadd(e, "keys", keys);
}

static void print_runs(const Obcomm__StatusReply *r)
{
    char buf[1024];
    for (size_t i = 0; i < r->n_jobs; i++) {
        const Obcomm__JobStatus *j = r->jobs[i];
        printf("job      %s: run %016" PRIx64 ", %" PRIu32 "/%" PRIu32
               " joined, next op %" PRIu64 "\n",
               clean(j->name, buf, sizeof(buf)), j->run, j->joined,
               j->local_size, j->next_seq);
        if (j->stopped[0])
            printf("         stopped: %s\n",
                   clean(j->stopped, buf, sizeof(buf)));
        for (size_t k = 0; k < j->n_keys; k++) {
            const Obcomm__KeyStatus *ks = j->keys[k];
            const Obcomm__EfVersion *v = ks->version;
            char from[40] = "zero";
            if (v && v->origin)
                snprintf(from, sizeof(from), "snapshot %016" PRIx64, v->origin);
            /* The fp32 ring's, for comparison: 2 (nodes - 1) chunks of
             * count / nodes floats. */
            uint64_t nodes = r->world_size;
            uint64_t fp32 = nodes < 2 ? 0
                                      : 2 * (nodes - 1) *
                                            ((ks->count + nodes - 1) / nodes) *
                                            sizeof(float);
            printf("         key %" PRIu64 ": %" PRIu64 " elements, %" PRIu64
                   " bytes sent per 1-bit op (fp32 ring: about %" PRIu64
                   "), %s + %" PRIu64 " steps (last op %" PRIu64 ")\n",
                   ks->key, ks->count, ks->op_bytes, fp32, from,
                   v ? v->applied : 0, v ? v->last_seq : 0);
        }
    }
}

static int print_status(const Obcomm__StatusReply *r, enum format f)
{
    size_t in_flight = 0;
    for (size_t i = 0; i < r->n_jobs; i++)
        in_flight += r->jobs[i]->n_ops > 0;

    /* Peers summarised by state; the first few distinct states are named
     * and the rest counted together, so the work stays linear. */
    enum { NSTATES = 6 };
    const char *state[NSTATES];
    size_t count[NSTATES] = {0}, other = 0;
    int nstates = 0;
    for (size_t i = 0; i < r->n_peers; i++) {
        const char *st = r->peers[i]->state;
        int k;
        for (k = 0; k < nstates; k++)
            if (strcmp(state[k], st) == 0)
                break;
        if (k == nstates && nstates < NSTATES)
            state[nstates++] = st;
        if (k < nstates)
            count[k]++;
        else
            other++;
    }
    double logical, wire;
    double ratio = compression_ratio(r, &logical, &wire);

    if (f == F_JSON) {
        json_object *o = jroot("status");
        jadd(o, "version", jstr(r->version));
        jadd(o, "proto_version", json_object_new_int64(r->proto_version));
        jadd(o, "codec", jstr(r->codec));
        jadd(o, "build", jstr(r->build));
        jadd(o, "cluster", jstr(r->cluster));
        jadd(o, "rank", json_object_new_int64(r->rank));
        jadd(o, "world_size", json_object_new_int64(r->world_size));
        jadd(o, "pid", json_object_new_int64(r->pid));
        jadd(o, "uptime_ms", json_object_new_uint64(r->uptime_ms));
        jadd(o, "socket", jstr(r->socket));
        jadd(o, "peer_count", json_object_new_uint64(r->n_peers));
        json_object *by = json_object_new_object();
        for (int k = 0; k < nstates; k++)
            jadd(by, state[k], json_object_new_uint64(count[k]));
        if (other)
            jadd(by, "other", json_object_new_uint64(other));
        jadd(o, "peers_by_state", by);
        jadd(o, "job_count", json_object_new_uint64(r->n_jobs));
        jadd(o, "jobs_with_ops_in_flight", json_object_new_uint64(in_flight));
        jadd(o, "metric_count", json_object_new_uint64(r->n_metrics));
        json_object *ob = json_object_new_object();
        jadd(ob, "logical_bytes", jnum(logical));
        jadd(ob, "wire_bytes", jnum(wire));
        jadd(ob, "compression_ratio", ratio > 0 ? jnum(ratio) : NULL);
        jadd(o, "onebit", ob);
        json_object *jobs = json_object_new_array();
        for (size_t i = 0; i < r->n_jobs; i++)
            json_object_array_add(jobs, job_json(r->jobs[i]));
        jadd(o, "jobs", jobs);
        return jprint(o);
    }

    char buf[1024], d[32];
    printf("obcommd  %s (protocol %" PRIu32 ", codec %s)\n",
           clean(r->version, buf, sizeof(buf)), r->proto_version,
           or_dash(r->codec));
    printf("cluster  %s\n", clean(r->cluster, buf, sizeof(buf)));
    printf("rank     %" PRIu32 " of %" PRIu32 "\n", r->rank, r->world_size);
    printf("pid      %" PRIu32 "\n", r->pid);
    printf("uptime   %s\n", duration(r->uptime_ms, d, sizeof(d)));
    printf("socket   %s\n", clean(r->socket, buf, sizeof(buf)));
    printf("peers    %zu", r->n_peers);
    for (int k = 0; k < nstates; k++) {
        char sb[CELL_MAX + 1];
        printf("%s%zu %s", k ? ", " : " (", count[k],
               or_dash(clean(state[k], sb, sizeof(sb))));
    }
    if (other)
        printf(", %zu other", other);
    printf("%s\n", nstates ? ")" : "");
    printf("jobs     %zu (%zu with an op in flight)\n", r->n_jobs, in_flight);
    printf("metrics  %zu\n", r->n_metrics);
    if (ratio > 0)
        printf("1-bit    %.0f fp32 bytes in %.0f wire bytes (%.1fx)\n", logical,
               wire, ratio);
    print_runs(r);
    return 0;
}

/* ---- peers ---- */

static int print_peers(const Obcomm__StatusReply *r, enum format f)
{
    if (f == F_JSON) {
        json_object *o = jroot("peers");
        json_object *a = json_object_new_array();
        for (size_t i = 0; i < r->n_peers; i++) {
            const Obcomm__PeerStatus *p = r->peers[i];
            char t[64];
            json_object *e = json_object_new_object();
            jadd(e, "rank", json_object_new_int64(p->rank));
            jadd(e, "address", jstr(p->address));
            jadd(e, "state", jstr(p->state));
            jadd(e, "up_since",
                 p->up_since_unix_ms
                     ? jstr(iso_time(p->up_since_unix_ms, t, sizeof(t)))
                     : NULL);
            jadd(e, "up_for_ms",
                 p->up_since_unix_ms
                     ? json_object_new_uint64(age_of(r, p->up_since_unix_ms))
                     : NULL);
            jadd(e, "reconnects", json_object_new_int64(p->reconnects));
            jadd(e, "rtt_us",
                 p->rtt_us ? json_object_new_int64(p->rtt_us) : NULL);
            jadd(e, "rttvar_us",
                 p->rtt_us ? json_object_new_int64(p->rttvar_us) : NULL);
            jadd(e, "bytes_sent", json_object_new_uint64(p->bytes_sent));
            jadd(e, "bytes_received",
                 json_object_new_uint64(p->bytes_received));
            jadd(e, "last_error",
                 p->last_error[0] ? jstr(p->last_error) : NULL);
            jadd(e, "last_error_at",
                 p->last_error_unix_ms
                     ? jstr(iso_time(p->last_error_unix_ms, t, sizeof(t)))
                     : NULL);
            json_object_array_add(a, e);
        }
        jadd(o, "peers", a);
        return jprint(o);
    }

    int wa = 7, ws = 5; /* "ADDRESS", "STATE" */
    for (size_t i = 0; i < r->n_peers; i++) {
        int w = cell_width(r->peers[i]->address);
        wa = w > wa ? w : wa;
        w = cell_width(r->peers[i]->state);
        ws = w > ws ? w : ws;
    }
    printf("RANK  %-*s  %-*s  %8s  %10s  %9s  %14s  %14s  %s\n", wa, "ADDRESS",
           ws, "STATE", "UP_FOR", "RECONNECTS", "RTT", "BYTES_SENT",
           "BYTES_RECEIVED", "LAST_ERROR");
    for (size_t i = 0; i < r->n_peers; i++) {
        const Obcomm__PeerStatus *p = r->peers[i];
        char up[32] = "-", rtt[32] = "-", ago[32];
        if (p->up_since_unix_ms)
            duration(age_of(r, p->up_since_unix_ms), up, sizeof(up));
        if (p->rtt_us)
            snprintf(rtt, sizeof(rtt), "%.2fms", p->rtt_us / 1000.0);
        printf("%-4" PRIu32 "  ", p->rank);
        cell(or_dash(p->address), wa);
        fputs("  ", stdout);
        cell(or_dash(p->state), ws);
        printf("  %8s  %10" PRIu32 "  %9s  %14" PRIu64 "  %14" PRIu64 "  ", up,
               p->reconnects, rtt, p->bytes_sent, p->bytes_received);
        if (p->last_error[0]) {
            printf("%s ago: ", duration(age_of(r, p->last_error_unix_ms), ago,
                                        sizeof(ago)));
            cell(p->last_error, 0);
        } else {
            fputs("-", stdout);
        }
        putchar('\n');
    }
    return 0;
}

/* ---- ops ---- */

static int print_ops(const Obcomm__StatusReply *r, enum format f)
{
    if (f == F_JSON) {
        json_object *o = jroot("ops");
        json_object *a = json_object_new_array();
        for (size_t i = 0; i < r->n_jobs; i++) {
            const Obcomm__JobStatus *j = r->jobs[i];
            json_object *e = job_json(j);
            json_object *ops = json_object_new_array();
            for (size_t k = 0; k < j->n_ops; k++) {
                const Obcomm__OpStatus *p = j->ops[k];
                json_object *x = json_object_new_object();
                jadd(x, "seq", json_object_new_uint64(p->seq));
                jadd(x, "op", jstr(p->op));
                jadd(x, "state", jstr(p->state));
                jadd(x, "age_ms", json_object_new_uint64(p->age_ms));
                jadd(x, "submitted", json_object_new_int64(p->submitted));
                jadd(x, "count", json_object_new_uint64(p->count));
                jadd(x, "dtype", p->dtype[0] ? jstr(p->dtype) : NULL);
                jadd(x, "key", json_object_new_uint64(p->key));
                jadd(x, "waiting_for",
                     p->waiting_for[0] ? jstr(p->waiting_for) : NULL);
                json_object_array_add(ops, x);
            }
            jadd(e, "ops", ops);
            jadd(e, "ops_omitted", json_object_new_int64(j->ops_omitted));
            json_object_array_add(a, e);
        }
        jadd(o, "jobs", a);
        jadd(o, "jobs_omitted", json_object_new_int64(r->jobs_omitted));
        return jprint(o);
    }

    int wn = 3, wo = 2; /* "JOB", "OP" */
    for (size_t i = 0; i < r->n_jobs; i++) {
        int w = cell_width(r->jobs[i]->name);
        wn = w > wn ? w : wn;
        for (size_t k = 0; k < r->jobs[i]->n_ops; k++) {
            w = cell_width(r->jobs[i]->ops[k]->op);
            wo = w > wo ? w : wo;
        }
    }
    printf("%-*s  %6s  %10s  %-*s  %-10s  %8s  %9s  %s\n", wn, "JOB", "JOINED",
           "SEQ", wo, "OP", "STATE", "AGE", "SUBMITTED", "WAITING_FOR");
    for (size_t i = 0; i < r->n_jobs; i++) {
        const Obcomm__JobStatus *j = r->jobs[i];
        char joined[32];
        snprintf(joined, sizeof(joined), "%" PRIu32 "/%" PRIu32, j->joined,
                 j->local_size);
        if (j->n_ops == 0) {
            cell(or_dash(j->name), wn);
            printf("  %6s  %10s  %-*s  %-10s  %8s  %9s  %s\n", joined, "-", wo,
                   "-", "idle", "-", "-", "-");
        }
        for (size_t k = 0; k < j->n_ops; k++) {
            const Obcomm__OpStatus *p = j->ops[k];
            char age[32], sub[32], wait[1024];
            snprintf(sub, sizeof(sub), "%" PRIu32 "/%" PRIu32, p->submitted,
                     j->local_size);
            cell(or_dash(j->name), wn);
            printf("  %6s  %10" PRIu64 "  ", joined, p->seq);
            cell(or_dash(p->op), wo);
            fputs("  ", stdout);
            cell(or_dash(p->state), 10);
            printf("  %8s  %9s  %s\n", duration(p->age_ms, age, sizeof(age)),
                   sub, or_dash(clean(p->waiting_for, wait, sizeof(wait))));
        }
        if (j->ops_omitted)
            printf("%*s  (%" PRIu32 " more open ops)\n", wn, "",
                   j->ops_omitted);
    }
    if (r->jobs_omitted)
        printf("(%" PRIu32 " more jobs)\n", r->jobs_omitted);
    return 0;
}

/* ---- metrics ---- */

/* The upper bound of the bucket that holds quantile q: a bound, not an
 * interpolation, so it never claims more precision than the buckets. */
static double quantile(const Obcomm__Histogram *h, double q)
{
    if (h->count == 0)
        return NAN;
    double want = q * (double)h->count;
    for (size_t b = 0; b < h->n_buckets && b < h->n_le_seconds; b++)
        if ((double)h->buckets[b] >= want)
            return h->le_seconds[b];
    return INFINITY;
}

static void seconds_text(double s, char *buf, size_t len)
{
    if (isinf(s))
        snprintf(buf, len, ">%s", "max");
    else if (s < 1e-3)
        snprintf(buf, len, "%.0fus", s * 1e6);
    else if (s < 1)
        snprintf(buf, len, "%.3gms", s * 1e3);
    else
        snprintf(buf, len, "%.3gs", s);
}

/* Integers print without a fraction; other values with 6 digits. */
static void format_value(double v, char *buf, size_t len)
{
    if (v > -1e15 && v < 1e15 && (double)(long long)v == v)
        snprintf(buf, len, "%lld", (long long)v);
    else
        snprintf(buf, len, "%.6g", v);
}

static int metrics_json(const Obcomm__StatusReply *r)
{
    json_object *o = jroot("metrics");
    json_object *a = json_object_new_array();
    for (size_t i = 0; i < r->n_metrics; i++) {
        const Obcomm__Metric *m = r->metrics[i];
        json_object *e = json_object_new_object();
        jadd(e, "name", jstr(m->name));
        jadd(e, "kind", jstr(m->kind));
        jadd(e, "value", jnum(m->value));
        jadd(e, "help", jstr(m->help));
        json_object_array_add(a, e);
    }
    jadd(o, "metrics", a);
    json_object *h = json_object_new_array();
    for (size_t i = 0; i < r->n_histograms; i++) {
        const Obcomm__Histogram *x = r->histograms[i];
        json_object *e = json_object_new_object();
        jadd(e, "name", jstr(x->name));
        jadd(e, "op", jstr(x->op));
        jadd(e, "size_class", jstr(x->size_class));
        jadd(e, "count", json_object_new_uint64(x->count));
        jadd(e, "sum_seconds", jnum(x->sum_seconds));
        json_object *b = json_object_new_array();
        for (size_t k = 0; k < x->n_buckets && k < x->n_le_seconds; k++) {
            json_object *bk = json_object_new_object();
            jadd(bk, "le_seconds", jnum(x->le_seconds[k]));
            jadd(bk, "count", json_object_new_uint64(x->buckets[k]));
            json_object_array_add(b, bk);
        }
        jadd(e, "buckets", b); /* cumulative; +Inf is count */
        json_object_array_add(h, e);
    }
    jadd(o, "histograms", h);
    double logical, wire;
    double ratio = compression_ratio(r, &logical, &wire);
    jadd(o, "onebit_compression_ratio", ratio > 0 ? jnum(ratio) : NULL);
    return jprint(o);
}

/* A label value in the exposition format: \, " and newline escaped. */
static void prom_label(const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            printf("\\%c", *s);
        else if (*s == '\n')
            fputs("\\n", stdout);
        else
            putchar(*s);
    }
}

/* A metric name: only [a-zA-Z0-9_:] survive, anything else becomes '_'. */
static void prom_name(const char *s)
{
    fputs("obcomm_", stdout);
    for (; *s; s++) {
        char c = *s;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                 (c >= '0' && c <= '9') || c == '_' || c == ':';
        putchar(ok ? c : '_');
    }
}

/* HELP text: \ and newline escaped, control characters dropped. */
static void prom_help(const char *s)
{
    for (; *s; s++) {
        if (*s == '\\')
            fputs("\\\\", stdout);
        else if (*s == '\n')
            fputs("\\n", stdout);
        else if ((unsigned char)*s >= 0x20)
            putchar(*s);
    }
}

/* The shortest decimal text that reads back as v: 0.0001, not
 * 9.9999999999999991e-05. */
static const char *shortest(double v, char *buf, size_t len)
{
    if (fabs(v) < 9007199254740992.0 && v == (double)(int64_t)v) {
        snprintf(buf, len, "%" PRId64, (int64_t)v);
        return buf;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    return buf;
}

static void prom_value(double v)
{
    if (isnan(v))
        fputs("NaN", stdout);
    else if (isinf(v))
        fputs(v > 0 ? "+Inf" : "-Inf", stdout);
    else {
        char buf[32];
        fputs(shortest(v, buf, sizeof(buf)), stdout);
    }
}

static void prom_family(const char *name, const char *help, const char *type)
{
    fputs("# HELP ", stdout);
    prom_name(name);
    putchar(' ');
    prom_help(help);
    fputs("\n# TYPE ", stdout);
    prom_name(name);
    printf(" %s\n", type);
}

static int metrics_prometheus(const Obcomm__StatusReply *r)
{
    for (size_t i = 0; i < r->n_metrics; i++) {
        const Obcomm__Metric *m = r->metrics[i];
        const char *name = m->prom_name[0] ? m->prom_name : m->name;
        const char *type = strcmp(m->kind, "counter") == 0 ? "counter"
                           : strcmp(m->kind, "gauge") == 0 ? "gauge"
                                                           : "untyped";
        prom_family(name, m->help, type);
        prom_name(name);
        putchar(' ');
        prom_value(m->value / (m->prom_divisor != 0 ? m->prom_divisor : 1));
        putchar('\n');
    }
    /* One family per histogram name: its series are consecutive. */
    for (size_t i = 0; i < r->n_histograms; i++) {
        const Obcomm__Histogram *h = r->histograms[i];
        const char *name = h->prom_name[0] ? h->prom_name : h->name;
        if (i == 0 || strcmp(r->histograms[i - 1]->prom_name, h->prom_name))
            prom_family(name, h->help, "histogram");
        for (size_t b = 0; b <= h->n_buckets && b <= h->n_le_seconds; b++) {
            int inf = b == h->n_buckets || b == h->n_le_seconds;
            prom_name(name);
            fputs("_bucket{op=\"", stdout);
            prom_label(h->op);
            fputs("\",size=\"", stdout);
            prom_label(h->size_class);
            fputs("\",le=\"", stdout);
            if (inf)
                fputs("+Inf", stdout);
            else
                prom_value(h->le_seconds[b]);
            printf("\"} %" PRIu64 "\n", inf ? h->count : h->buckets[b]);
        }
        const char *suffix[] = {"_sum", "_count"};
        for (int k = 0; k < 2; k++) {
            prom_name(name);
            printf("%s{op=\"", suffix[k]);
            prom_label(h->op);
            fputs("\",size=\"", stdout);
            prom_label(h->size_class);
            fputs("\"} ", stdout);
            if (k == 0)
                prom_value(h->sum_seconds);
            else
                printf("%" PRIu64, h->count);
            putchar('\n');
        }
    }
    return 0;
}

static int print_metrics(const Obcomm__StatusReply *r, enum format f)
{
    if (f == F_JSON)
        return metrics_json(r);
    if (f == F_PROMETHEUS)
        return metrics_prometheus(r);

    int wn = 4, wv = 5; /* "NAME", "VALUE" */
    for (size_t i = 0; i < r->n_metrics; i++) {
        char v[64];
        int w = cell_width(r->metrics[i]->name);
        wn = w > wn ? w : wn;
        format_value(r->metrics[i]->value, v, sizeof(v));
        w = (int)strlen(v);
        wv = w > wv ? w : wv;
    }
    printf("%-*s  %*s  %s\n", wn, "NAME", wv, "VALUE", "HELP");
    for (size_t i = 0; i < r->n_metrics; i++) {
        const Obcomm__Metric *m = r->metrics[i];
        char v[64], help[1024];
        format_value(m->value, v, sizeof(v));
        cell(or_dash(m->name), wn);
        printf("  %*s  %s\n", wv, v, clean(m->help, help, sizeof(help)));
    }

    /* Latency by op and size, for the series that saw ops. */
    int header = 0;
    for (size_t i = 0; i < r->n_histograms; i++) {
        const Obcomm__Histogram *h = r->histograms[i];
        if (h->count == 0)
            continue;
        if (!header) {
            printf("\n%-16s  %-6s  %10s  %9s  %9s  %9s  %9s\n", "LATENCY OP",
                   "SIZE", "COUNT", "MEAN", "P50<=", "P90<=", "P99<=");
            header = 1;
        }
        char mean[32], p50[32], p90[32], p99[32];
        seconds_text(h->sum_seconds / (double)h->count, mean, sizeof(mean));
        seconds_text(quantile(h, 0.5), p50, sizeof(p50));
        seconds_text(quantile(h, 0.9), p90, sizeof(p90));
        seconds_text(quantile(h, 0.99), p99, sizeof(p99));
        cell(h->op, 16);
        fputs("  ", stdout);
        cell(h->size_class, 6);
        printf("  %10" PRIu64 "  %9s  %9s  %9s  %9s\n", h->count, mean, p50,
               p90, p99);
    }
    return 0;
}

static void version(void)
{
    printf("obcommctl %s\n"
           "protocol %d\n"
           "codec %s (built into obcommd; the daemon's choice: obcommctl "
           "status)\n"
           "json-c %s\n"
           "build %s\n",
           OBCOMM_VERSION, OBCOMM_PROTO_VERSION, OBCOMM_BUILD_CODECS,
           json_c_version(), OBCOMM_BUILD_OPTIONS);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"socket", required_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},
        {"format", required_argument, NULL, 'f'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *path = NULL;
    enum format format = F_TEXT;
    int opt;
    opterr = 0; /* getopt would name argv[0]; say "obcommctl" instead */
    while ((opt = getopt_long(argc, argv, "s:hV", longopts, NULL)) != -1) {
        switch (opt) {
        case 's':
            path = optarg;
            break;
        case 'j':
            format = F_JSON;
            break;
        case 'f':
            if (strcmp(optarg, "text") == 0) {
                format = F_TEXT;
            } else if (strcmp(optarg, "json") == 0) {
                format = F_JSON;
            } else if (strcmp(optarg, "prometheus") == 0) {
                format = F_PROMETHEUS;
            } else {
                fprintf(stderr,
                        "obcommctl: --format is text, json or prometheus, "
                        "not '%s'\n",
                        optarg);
                return EXIT_USAGE;
            }
            break;
        case 'V':
            version();
            return EXIT_OK;
        case 'h':
            usage(stdout);
            return EXIT_OK;
        default:
            if (strncmp(argv[optind - 1], "--", 2) == 0)
                fprintf(stderr, "obcommctl: bad option '%s'\n",
                        argv[optind - 1]);
            else if (optopt == 's')
                fprintf(stderr, "obcommctl: -s needs a PATH\n");
            else if (optopt != 0)
                fprintf(stderr, "obcommctl: unknown option '-%c'\n", optopt);
            else
                fprintf(stderr, "obcommctl: unknown option '%s'\n",
                        argv[optind - 1]);
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    enum cmd cmd = CMD_STATUS;
    if (argc - optind > 1) {
        fprintf(stderr, "obcommctl: one command at most\n");
        usage(stderr);
        return EXIT_USAGE;
    }
    if (optind < argc) {
        size_t k;
        for (k = 0; k < sizeof(cmd_names) / sizeof(cmd_names[0]); k++)
            if (strcmp(argv[optind], cmd_names[k]) == 0)
                break;
        if (k == sizeof(cmd_names) / sizeof(cmd_names[0])) {
            fprintf(stderr, "obcommctl: unknown command '%s'\n", argv[optind]);
            usage(stderr);
            return EXIT_USAGE;
        }
        cmd = (enum cmd)k;
    }
    if (format == F_PROMETHEUS && cmd != CMD_METRICS) {
        fprintf(stderr, "obcommctl: --format prometheus is for metrics\n");
        return EXIT_USAGE;
    }
    if (path == NULL || path[0] == '\0')
        path = getenv("OBCOMM_SOCKET");
    if (path == NULL || path[0] == '\0')
        path = OBCOMM_DEFAULT_SOCKET;

    char err[512];
    int fd = obc_sock_connect(path, err, sizeof(err));
    if (fd < 0) {
        fprintf(stderr, "obcommctl: %s\n", err);
        return EXIT_UNREACHABLE;
    }
    Obcomm__StatusRequest req = OBCOMM__STATUS_REQUEST__INIT;
    Obcomm__ClientMsg msg = OBCOMM__CLIENT_MSG__INIT;
    msg.body_case = OBCOMM__CLIENT_MSG__BODY_STATUS;
    msg.status = &req;
    int64_t deadline = obc_now_ms() + CTL_TIMEOUT_MS;
    Obcomm__DaemonMsg *reply = NULL;
    int rc =
        obc_sock_send(fd, &msg, -1, deadline, CTL_TIMEOUT_MS, err, sizeof(err));
    if (rc == 0)
        rc = obc_sock_recv(fd, deadline, CTL_TIMEOUT_MS, &reply, err,
                           sizeof(err));
    close(fd);
    if (rc == OBCOMM_E_TIMEOUT) {
        fprintf(stderr, "obcommctl: obcommd at %s: %s\n", path, err);
        return EXIT_UNREACHABLE;
    }
    if (rc == 0 && reply->body_case != OBCOMM__DAEMON_MSG__BODY_STATUS) {
        snprintf(err, sizeof(err), "expected a StatusReply, got message %d",
                 (int)reply->body_case);
        rc = OBCOMM_E_PROTO;
    }
    if (rc < 0) {
        fprintf(stderr, "obcommctl: obcommd at %s: %s\n", path, err);
        obcomm__daemon_msg__free_unpacked(reply, NULL);
        return EXIT_FAILED;
    }

    static int (*const print[])(const Obcomm__StatusReply *, enum format) = {
        print_status, print_peers, print_ops, print_metrics};
    rc = print[cmd](reply->status, format);
    obcomm__daemon_msg__free_unpacked(reply, NULL);
    if (rc != 0 || fflush(stdout) != 0 || ferror(stdout)) {
        perror("obcommctl: writing output");
        return EXIT_FAILED;
    }
    return EXIT_OK;
}
