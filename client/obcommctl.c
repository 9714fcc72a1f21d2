/* obcommctl: shows what the node's obcommd is doing, for people (tables)
 * and for scripts (--json). It sends one StatusRequest over the daemon's
 * Unix socket and renders the StatusReply.
 *
 * Exit status: 0 on success, 1 when the daemon cannot be reached or answers
 * badly, 2 on a usage error. */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obcomm.h"
#include "sock.h"

/* How long to wait for the daemon's answer. A status query does no
 * collective work, so a healthy daemon answers at once. */
#define CTL_TIMEOUT_MS 10000

/* Widest cell a table column grows to; longer text is cut. */
#define CELL_MAX 64

enum cmd { CMD_STATUS, CMD_PEERS, CMD_OPS, CMD_METRICS };

static const char *const cmd_names[] = {"status", "peers", "ops", "metrics"};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: obcommctl [-s PATH] [--json] [status|peers|ops|metrics]\n"
            "\n"
            "  status   the daemon, its world and one-line summaries "
            "(default)\n"
            "  peers    links to the other nodes' daemons\n"
            "  ops      jobs and the op each has in flight\n"
            "  metrics  counters: name, value, help\n"
            "\n"
            "  -s, --socket PATH  the daemon's socket (default: "
            "$OBCOMM_SOCKET, else %s)\n"
            "  --json             print JSON instead of text\n"
            "  -h, --help         show this help\n",
            OBCOMM_DEFAULT_SOCKET);
}

/* Length of the valid UTF-8 sequence at s, or 0 when s does not start
 * one. Strings from the daemon end in NUL, which is never a continuation
 * byte, so the checks cannot run past the end. */
static size_t utf8_len(const unsigned char *s)
{
    unsigned char c = s[0];
    unsigned char lo = 0x80, hi = 0xbf;
    size_t n;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4;
    else
        return 0;
    /* Overlong forms, surrogates and code points past U+10FFFF. */
    if (c == 0xe0)
        lo = 0xa0;
    else if (c == 0xed)
        hi = 0x9f;
    else if (c == 0xf0)
        lo = 0x90;
    else if (c == 0xf4)
        hi = 0x8f;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return n;
}

/* Copies daemon text into buf (len bytes) for a terminal: control
 * characters and invalid UTF-8 become '?', and the text is cut to fit. */
static const char *clean(const char *s, char *buf, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0;
    while (*p) {
        size_t n = utf8_len(p);
        if (n == 0 || *p < 0x20 || *p == 0x7f) {
            if (o + 1 >= len)
                break;
            buf[o++] = '?';
            p += n ? n : 1;
            continue;
        }
        if (o + n >= len)
            break;
        memcpy(buf + o, p, n);
        o += n;
        p += n;
    }
    buf[o] = '\0';
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

static void json_str(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    putchar('"');
    while (*p) {
        size_t n = utf8_len(p);
        if (n == 0) {
            fputs("\\ufffd", stdout);
            p++;
        } else if (*p == '"' || *p == '\\') {
            printf("\\%c", *p++);
        } else if (*p == '\n') {
            fputs("\\n", stdout);
            p++;
        } else if (*p == '\t') {
            fputs("\\t", stdout);
            p++;
        } else if (*p < 0x20) {
            printf("\\u%04x", *p++);
        } else {
            fwrite(p, 1, n, stdout);
            p += n;
        }
    }
    putchar('"');
}

static void json_num(double v)
{
    if (isfinite(v))
        printf("%.17g", v);
    else
        fputs("null", stdout); /* JSON has no NaN or Inf */
}

/* Integers print without a fraction; other values with 6 digits. */
static void format_value(double v, char *buf, size_t len)
{
    if (v > -1e15 && v < 1e15 && (double)(long long)v == v)
        snprintf(buf, len, "%lld", (long long)v);
    else
        snprintf(buf, len, "%.6g", v);
}

/* A metric's value by name; 0 when the daemon does not report it. */
static double metric_value(const Obcomm__StatusReply *r, const char *name)
{
    for (size_t i = 0; i < r->n_metrics; i++)
        if (strcmp(r->metrics[i]->name, name) == 0)
            return r->metrics[i]->value;
    return 0;
}

static void print_status(const Obcomm__StatusReply *r, int json)
{
    size_t in_flight = 0;
    for (size_t i = 0; i < r->n_jobs; i++)
        in_flight += r->jobs[i]->op_in_flight[0] != '\0';

    if (json) {
        fputs("{\"version\":", stdout);
        json_str(r->version);
        fputs(",\"cluster\":", stdout);
        json_str(r->cluster);
        printf(",\"rank\":%" PRIu32 ",\"world_size\":%" PRIu32
               ",\"pid\":%" PRIu32 ",\"uptime_ms\":%" PRIu64 ",\"socket\":",
               r->rank, r->world_size, r->pid, r->uptime_ms);
        json_str(r->socket);
        printf(",\"peer_count\":%zu,\"job_count\":%zu,\"ops_in_flight\":%zu"
               ",\"metric_count\":%zu}\n",
               r->n_peers, r->n_jobs, in_flight, r->n_metrics);
        return;
    }

    char buf[1024];
    uint64_t s = r->uptime_ms / 1000;
    printf("obcommd  %s\n", clean(r->version, buf, sizeof(buf)));
    printf("cluster  %s\n", clean(r->cluster, buf, sizeof(buf)));
    printf("rank     %" PRIu32 " of %" PRIu32 "\n", r->rank, r->world_size);
    printf("pid      %" PRIu32 "\n", r->pid);
    printf("uptime   %" PRIu64 "d %02u:%02u:%02u\n", s / 86400,
           (unsigned)(s / 3600 % 24), (unsigned)(s / 60 % 60),
           (unsigned)(s % 60));
    printf("socket   %s\n", clean(r->socket, buf, sizeof(buf)));

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

    /* The compression ratio of the 1-bit allreduce: fp32 bytes covered
     * over bytes this node put on the wire for it. */
    double logical = metric_value(r, "onebit_logical_bytes");
    double wire = metric_value(r, "onebit_bytes_sent");
    if (logical > 0 && wire > 0)
        printf("1-bit    %.0f fp32 bytes in %.0f wire bytes (%.1fx)\n", logical,
               wire, logical / wire);
}

static void print_peers(const Obcomm__StatusReply *r, int json)
{
    if (json) {
        fputs("{\"peers\":[", stdout);
        for (size_t i = 0; i < r->n_peers; i++) {
            const Obcomm__PeerStatus *p = r->peers[i];
            printf("%s{\"rank\":%" PRIu32 ",\"address\":", i ? "," : "",
                   p->rank);
            json_str(p->address);
            fputs(",\"state\":", stdout);
            json_str(p->state);
            printf(",\"bytes_sent\":%" PRIu64 ",\"bytes_received\":%" PRIu64
                   "}",
                   p->bytes_sent, p->bytes_received);
        }
        fputs("]}\n", stdout);
        return;
    }
    int wa = 7, ws = 5; /* "ADDRESS", "STATE" */
    for (size_t i = 0; i < r->n_peers; i++) {
        int w = cell_width(r->peers[i]->address);
        wa = w > wa ? w : wa;
        w = cell_width(r->peers[i]->state);
        ws = w > ws ? w : ws;
    }
    printf("RANK  %-*s  %-*s  %20s  %20s\n", wa, "ADDRESS", ws, "STATE",
           "BYTES_SENT", "BYTES_RECEIVED");
    for (size_t i = 0; i < r->n_peers; i++) {
        const Obcomm__PeerStatus *p = r->peers[i];
        printf("%-4" PRIu32 "  ", p->rank);
        cell(or_dash(p->address), wa);
        fputs("  ", stdout);
        cell(or_dash(p->state), ws);
        printf("  %20" PRIu64 "  %20" PRIu64 "\n", p->bytes_sent,
               p->bytes_received);
    }
}

static void print_ops(const Obcomm__StatusReply *r, int json)
{
    if (json) {
        fputs("{\"jobs\":[", stdout);
        for (size_t i = 0; i < r->n_jobs; i++) {
            const Obcomm__JobStatus *j = r->jobs[i];
            fputs(i ? ",{\"name\":" : "{\"name\":", stdout);
            json_str(j->name);
            printf(",\"local_size\":%" PRIu32 ",\"joined\":%" PRIu32
                   ",\"next_seq\":%" PRIu64 ",\"op_in_flight\":",
                   j->local_size, j->joined, j->next_seq);
            json_str(j->op_in_flight);
            putchar('}');
        }
        fputs("]}\n", stdout);
        return;
    }
    int wn = 3; /* "JOB" */
    for (size_t i = 0; i < r->n_jobs; i++) {
        int w = cell_width(r->jobs[i]->name);
        wn = w > wn ? w : wn;
    }
    printf("%-*s  %6s  %20s  %s\n", wn, "JOB", "JOINED", "NEXT_SEQ",
           "OP_IN_FLIGHT");
    for (size_t i = 0; i < r->n_jobs; i++) {
        const Obcomm__JobStatus *j = r->jobs[i];
        char buf[1024];
        char joined[32];
        snprintf(joined, sizeof(joined), "%" PRIu32 "/%" PRIu32, j->joined,
                 j->local_size);
        cell(or_dash(j->name), wn);
        printf("  %6s  %20" PRIu64 "  %s\n", joined, j->next_seq,
               or_dash(clean(j->op_in_flight, buf, sizeof(buf))));
    }
}

static void print_metrics(const Obcomm__StatusReply *r, int json)
{
    if (json) {
        fputs("{\"metrics\":[", stdout);
        for (size_t i = 0; i < r->n_metrics; i++) {
            const Obcomm__Metric *m = r->metrics[i];
            fputs(i ? ",{\"name\":" : "{\"name\":", stdout);
            json_str(m->name);
            fputs(",\"kind\":", stdout);
            json_str(m->kind);
            fputs(",\"value\":", stdout);
            json_num(m->value);
            fputs(",\"help\":", stdout);
            json_str(m->help);
            putchar('}');
        }
        fputs("]}\n", stdout);
        return;
    }
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
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"socket", required_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *path = NULL;
    int json = 0, opt;
    opterr = 0; /* getopt would name argv[0]; say "obcommctl" instead */
    while ((opt = getopt_long(argc, argv, "s:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 's':
            path = optarg;
            break;
        case 'j':
            json = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
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
            return 2;
        }
    }
    enum cmd cmd = CMD_STATUS;
    if (argc - optind > 1) {
        fprintf(stderr, "obcommctl: one command at most\n");
        usage(stderr);
        return 2;
    }
    if (optind < argc) {
        size_t k;
        for (k = 0; k < sizeof(cmd_names) / sizeof(cmd_names[0]); k++)
            if (strcmp(argv[optind], cmd_names[k]) == 0)
                break;
        if (k == sizeof(cmd_names) / sizeof(cmd_names[0])) {
            fprintf(stderr, "obcommctl: unknown command '%s'\n", argv[optind]);
            usage(stderr);
            return 2;
        }
        cmd = (enum cmd)k;
    }
    if (path == NULL || path[0] == '\0')
        path = getenv("OBCOMM_SOCKET");
    if (path == NULL || path[0] == '\0')
        path = OBCOMM_DEFAULT_SOCKET;

    char err[512];
    int fd = obc_sock_connect(path, err, sizeof(err));
    if (fd < 0) {
        fprintf(stderr, "obcommctl: %s\n", err);
        return 1;
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
    if (rc == 0 && reply->body_case != OBCOMM__DAEMON_MSG__BODY_STATUS) {
        snprintf(err, sizeof(err), "expected a StatusReply, got message %d",
                 (int)reply->body_case);
        rc = OBCOMM_E_PROTO;
    }
    if (rc < 0) {
        fprintf(stderr, "obcommctl: obcommd at %s: %s\n", path, err);
        obcomm__daemon_msg__free_unpacked(reply, NULL);
        return 1;
    }

    static void (*const print[])(const Obcomm__StatusReply *, int) = {
        print_status, print_peers, print_ops, print_metrics};
    print[cmd](reply->status, json);
    obcomm__daemon_msg__free_unpacked(reply, NULL);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        perror("obcommctl: writing output");
        return 1;
    }
    return 0;
}
