#include "config.h"
#include "auth.h"
#include "log.h"

#include <obcomm.h>

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum row_type { T_INT, T_STR };

struct row {
    const char *name;
    enum row_type type;
    size_t offset;
    size_t size; /* T_STR: capacity including the terminator */
    int64_t min, max;
    const char *def;
    const char *help;
};

#define INT_ROW(field, lo, hi, d, h)                                       \
    {                                                                      \
#field, T_INT, offsetof(struct obd_config, field), 0, lo, hi, d, h \
    }
#define STR_ROW(field, d, h)                                    \
    {                                                           \
#field, T_STR, offsetof(struct obd_config, field),      \
            sizeof(((struct obd_config *)0)->field), 0, 0, d, h \
    }

/* Every option of obcommd. Names are the config file keys and, prefixed
 * with "--", the flags. */
static const struct row rows[] = {
    STR_ROW(cluster, "obcomm",
            "Cluster name; daemons of different clusters refuse each other."),
    INT_ROW(rank, 0, OBD_MAX_NODES - 1, "0", "This node's rank in peers."),
    STR_ROW(peers, "",
            "Every node's daemon as host:port, comma-separated, in rank "
            "order (this node included). Empty: a one-node world."),
    STR_ROW(listen, "",
            "TCP address to listen on for other daemons (host:port). "
            "Empty: this rank's own peers entry (never every interface). "
            "Without auth_key_file only a loopback address is accepted "
            "(see allow_insecure)."),
    STR_ROW(socket, OBCOMM_DEFAULT_SOCKET,
            "Unix socket for trainers and obcommctl."),
    INT_ROW(timeout_ms, 10, 3600000, "60000",
            "Default deadline of every collective, in milliseconds."),
    INT_ROW(segment_bytes, 8192, 64 << 20, "1048576",
            "Tensors are cut into segments of this many bytes so that "
            "sending, receiving and reducing overlap (1-bit segments are "
            "whole 64 Ki-element codec blocks, 8 KiB of bits each)."),
    INT_ROW(max_buffer_bytes, 4096, INT64_C(1) << 40, "17179869184",
            "Largest shared-memory buffer a trainer may register."),
    INT_ROW(max_clients, 1, 4096, "256",
            "Most Unix-socket connections at once."),
    INT_ROW(max_jobs, 1, 1024, "16", "Most jobs at once."),
    INT_ROW(sock_buf_bytes, 65536, 256 << 20, "4194304",
            "SO_SNDBUF and SO_RCVBUF of peer connections."),
    INT_ROW(connect_backoff_max_ms, 10, 60000, "1000",
            "Longest wait between two attempts to dial a peer."),
    INT_ROW(keepalive_s, 1, 3600, "10", "TCP keepalive idle time of peers."),
    INT_ROW(threads, 0, 256, "0",
            "Worker threads for codec and reduction work; 0: one per "
            "core."),
    STR_ROW(log_level, "info", "error, warn, info or debug."),
    STR_ROW(state_dir, "",
            "Directory for snapshots of 1-bit error feedback, written on "
            "request and at shutdown, restored at start. Empty: none."),
    INT_ROW(ef_max_bytes, 0, INT64_C(1) << 50, "0",
            "Most bytes of 1-bit error-feedback state (all keys "
            "together); a new key past it fails. 0: a quarter of the "
            "machine's memory."),
    INT_ROW(ef_idle_ms, 0, INT64_C(1) << 40, "3600000",
            "A job with no trainer on this node for this long has its "
            "error feedback snapshotted (when state_dir is set) and freed; "
            "its next op loads the snapshot. 0: never."),
    STR_ROW(auth_key_file, "",
            "File whose whole content is the cluster key (at least 32 "
            "bytes, mode 0600 or stricter): daemons prove to each other "
            "that they hold it before anything else. A relative name is "
            "looked up in $CREDENTIALS_DIRECTORY (systemd LoadCredential=) "
            "when that is set. Empty: no authentication, loopback only."),
    STR_ROW(allow_insecure, "false",
            "true: listen on a non-loopback address without auth_key_file "
            "(anyone who reaches the port can join the mesh)."),
    STR_ROW(wire_protection, "none",
            "Data frames between daemons after the handshake: none (as "
            "they are, zero-copy), integrity (a tag per frame) or "
            "encrypt (ChaCha20-Poly1305). Control frames always carry a "
            "tag when auth_key_file is set. Must be equal on every node."),
    INT_ROW(max_unauth_links, 1, 4096, "64",
            "Most peer connections that have not finished the handshake; "
            "past it the oldest of the busiest source address is closed."),
    INT_ROW(max_unauth_per_addr, 1, 4096, "8",
            "Most such connections from one source address."),
};

/* Options that SIGHUP applies while the daemon runs. */
static const char *const reloadable[] = {"log_level"};

#define NROWS (sizeof(rows) / sizeof(rows[0]))

static void fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static const struct row *find_row(const char *name)
{
    for (size_t i = 0; i < NROWS; i++)
        if (strcmp(rows[i].name, name) == 0)
            return &rows[i];
    return NULL;
}

static int set_row(struct obd_config *cfg, const struct row *r,
                   const char *value, char *err, size_t errlen)
{
    char *field = (char *)cfg + r->offset;

    if (r->type == T_STR) {
        size_t len = strlen(value);
        if (len >= r->size) {
            fail(err, errlen, "%s: value is %zu bytes long, at most %zu",
                 r->name, len, r->size - 1);
            return -1;
        }
        memcpy(field, value, len + 1);
        return 0;
    }

    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 0);
    while (*end == ' ' || *end == '\t')
        end++;
    if (errno != 0 || end == value || *end != '\0') {
        fail(err, errlen, "%s: '%s' is not an integer", r->name, value);
        return -1;
    }
    if (v < r->min || v > r->max) {
        fail(err, errlen, "%s: %lld is out of range [%" PRId64 ", %" PRId64 "]",
             r->name, v, r->min, r->max);
        return -1;
    }
    memcpy(field, &(int64_t){v}, sizeof(int64_t));
    return 0;
}

void obd_config_defaults(struct obd_config *cfg)
{
    char err[256];
    memset(cfg, 0, sizeof(*cfg));
    for (size_t i = 0; i < NROWS; i++)
        (void)set_row(cfg, &rows[i], rows[i].def, err, sizeof(err));
}

int obd_config_set(struct obd_config *cfg, const char *name, const char *value,
                   char *err, size_t errlen)
{
    const struct row *r = find_row(name);
    if (r == NULL) {
        fail(err, errlen, "unknown option '%s'", name);
        return -1;
    }
    return set_row(cfg, r, value, err, errlen);
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

int obd_config_load(struct obd_config *cfg, const char *path, char *err,
                    size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fail(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }

    char line[8192];
    int lineno = 0;
    int rc = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        lineno++;
        if (strchr(line, '\n') == NULL && !feof(f)) {
            fail(err, errlen, "%s:%d: line longer than %zu bytes", path, lineno,
                 sizeof(line) - 2);
            rc = -1;
            break;
        }
        char *hash = strchr(line, '#');
        if (hash != NULL)
            *hash = '\0';
        char *s = trim(line);
        if (*s == '\0')
            continue;
        char *eq = strchr(s, '=');
        if (eq == NULL) {
            fail(err, errlen, "%s:%d: expected 'name = value'", path, lineno);
            rc = -1;
            break;
        }
        *eq = '\0';
        char msg[512];
        if (obd_config_set(cfg, trim(s), trim(eq + 1), msg, sizeof(msg))) {
            fail(err, errlen, "%s:%d: %s", path, lineno, msg);
            rc = -1;
            break;
        }
    }
    fclose(f);
    return rc;
}

int obd_config_parse_args(struct obd_config *cfg, int argc, char **argv,
                          int *check, int *help, char *err, size_t errlen)
{
    /* The file comes first so that flags override it wherever -c stands. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc) {
                fail(err, errlen, "%s needs a file name", argv[i]);
                return -1;
            }
            if (obd_config_load(cfg, argv[++i], err, errlen))
                return -1;
        }
    }

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-c") == 0 || strcmp(a, "--config") == 0) {
            i++;
            continue;
        }
        if (strcmp(a, "--check-config") == 0) {
            *check = 1;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *help = 1;
            continue;
        }
        if (strcmp(a, "--example-config") == 0) {
            *help = 2;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) {
            fail(err, errlen, "unexpected argument '%s' (see --help)", a);
            return -1;
        }

        char name[64];
        const char *value;
        const char *eq = strchr(a + 2, '=');
        size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (len >= sizeof(name)) {
            fail(err, errlen, "unknown option '%s'", a);
            return -1;
        }
        memcpy(name, a + 2, len);
        name[len] = '\0';
        for (char *p = name; *p; p++)
            if (*p == '-')
                *p = '_';
        if (eq != NULL) {
            value = eq + 1;
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            fail(err, errlen, "--%s needs a value", name);
            return -1;
        }
        if (obd_config_set(cfg, name, value, err, errlen))
            return -1;
    }
    return 0;
}

int obd_config_parse_addr(const char *text, struct obd_addr *out)
{
    const char *colon = strrchr(text, ':');
    if (colon == NULL || colon == text)
        return -1;
    size_t hlen = (size_t)(colon - text);
    if (hlen >= sizeof(out->host))
        return -1;

    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (errno != 0 || end == colon + 1 || *end != '\0' || port < 1 ||
        port > 65535)
        return -1;

    memcpy(out->host, text, hlen);
    out->host[hlen] = '\0';
    out->port = (uint16_t)port;
    return 0;
}

/* FNV-1a, 64 bit: a fingerprint, not a defence against adversaries. */
static uint64_t fnv1a(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

/* allow_insecure and wire_protection (the key file itself is read at
 * start, daemon.c). */
static int finish_security(struct obd_config *cfg, char *err, size_t errlen)
{
    if (strcmp(cfg->allow_insecure, "true") == 0) {
        cfg->insecure = 1;
    } else if (strcmp(cfg->allow_insecure, "false") == 0) {
        cfg->insecure = 0;
    } else {
        fail(err, errlen, "allow_insecure: '%s' is not true or false",
             cfg->allow_insecure);
        return -1;
    }
    cfg->wire = obd_auth_wire_parse(cfg->wire_protection);
    if (cfg->wire < 0) {
        fail(err, errlen,
             "wire_protection: '%s' is not one of none, integrity, encrypt",
             cfg->wire_protection);
        return -1;
    }
    if (cfg->wire != OBD_WIRE_NONE && cfg->auth_key_file[0] == '\0') {
        fail(err, errlen,
             "wire_protection: %s needs auth_key_file (the session keys "
             "come from the cluster key)",
             cfg->wire_protection);
        return -1;
    }
    return 0;
}

int obd_config_finish(struct obd_config *cfg, char *err, size_t errlen)
{
    cfg->log_level_num = obd_log_level_parse(cfg->log_level);
    if (cfg->log_level_num < 0) {
        fail(err, errlen,
             "log_level: '%s' is not one of error, warn, info, "
             "debug",
             cfg->log_level);
        return -1;
    }
    if (cfg->cluster[0] == '\0') {
        fail(err, errlen, "cluster: must not be empty");
        return -1;
    }
    if (cfg->socket[0] == '\0') {
        fail(err, errlen, "socket: must not be empty");
        return -1;
    }

    if (finish_security(cfg, err, errlen))
        return -1;

    cfg->nodes = 0;
    if (cfg->peers[0] != '\0') {
        char copy[sizeof(cfg->peers)];
        memcpy(copy, cfg->peers, sizeof(copy));
        char *save = NULL;
        for (char *tok = strtok_r(copy, ",", &save); tok != NULL;
             tok = strtok_r(NULL, ",", &save)) {
            tok = trim(tok);
            if (cfg->nodes == OBD_MAX_NODES) {
                fail(err, errlen, "peers: more than %d nodes", OBD_MAX_NODES);
                return -1;
            }
            if (obd_config_parse_addr(tok, &cfg->world[cfg->nodes])) {
                fail(err, errlen, "peers: '%s' is not host:port", tok);
                return -1;
            }
            cfg->nodes++;
        }
    }
    if (cfg->nodes == 0) {
        /* One-node world: no TCP at all. */
        if (cfg->rank != 0) {
            fail(err, errlen, "rank: %" PRId64 " needs a peers list",
                 cfg->rank);
            return -1;
        }
        cfg->nodes = 1;
        memset(&cfg->world[0], 0, sizeof(cfg->world[0]));
        memset(&cfg->listen_addr, 0, sizeof(cfg->listen_addr));
    } else {
        if (cfg->rank >= cfg->nodes) {
            fail(err, errlen,
                 "rank: %" PRId64 " but peers lists only %d nodes (0..%d)",
                 cfg->rank, cfg->nodes, cfg->nodes - 1);
            return -1;
        }
        for (int i = 0; i < cfg->nodes; i++)
            for (int j = i + 1; j < cfg->nodes; j++)
                if (cfg->world[i].port == cfg->world[j].port &&
                    strcmp(cfg->world[i].host, cfg->world[j].host) == 0) {
                    fail(err, errlen, "peers: ranks %d and %d are both %s:%u",
                         i, j, cfg->world[i].host, cfg->world[i].port);
                    return -1;
                }
        if (cfg->listen[0] != '\0') {
            if (obd_config_parse_addr(cfg->listen, &cfg->listen_addr)) {
                fail(err, errlen, "listen: '%s' is not host:port", cfg->listen);
                return -1;
            }
        } else {
            /* This rank's own address, never every interface. */
            snprintf(cfg->listen_addr.host, sizeof(cfg->listen_addr.host), "%s",
                     cfg->world[cfg->rank].host);
            cfg->listen_addr.port = cfg->world[cfg->rank].port;
        }
    }

    /* The fingerprint covers what every node must agree on: the cluster
     * name and the world, in rank order. */
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    h = fnv1a(h, cfg->cluster, strlen(cfg->cluster) + 1);
    for (int i = 0; i < cfg->nodes; i++) {
        h = fnv1a(h, cfg->world[i].host, strlen(cfg->world[i].host) + 1);
        h = fnv1a(h, &cfg->world[i].port, sizeof(cfg->world[i].port));
    }
    cfg->fingerprint = h;
    return 0;
}

void obd_config_print(const struct obd_config *cfg, FILE *out)
{
    for (size_t i = 0; i < NROWS; i++) {
        const char *field = (const char *)cfg + rows[i].offset;
        if (rows[i].type == T_STR) {
            fprintf(out, "%s = %s\n", rows[i].name, field);
        } else {
            int64_t v;
            memcpy(&v, field, sizeof(v));
            fprintf(out, "%s = %" PRId64 "\n", rows[i].name, v);
        }
    }
}

void obd_config_print_help(FILE *out, int as_config_file)
{
    for (size_t i = 0; i < NROWS; i++) {
        const struct row *r = &rows[i];
        char bounds[96] = "";
        if (r->type == T_INT)
            snprintf(bounds, sizeof(bounds), " [%" PRId64 "..%" PRId64 "]",
                     r->min, r->max);
        if (as_config_file)
            fprintf(out, "# %s%s\n# %s = %s\n\n", r->help, bounds, r->name,
                    r->def);
        else
            fprintf(out, "  --%-24s %s%s (default: %s)\n", r->name, r->help,
                    bounds, r->def[0] ? r->def : "empty");
    }
}

static int is_reloadable(const char *name)
{
    for (size_t i = 0; i < sizeof(reloadable) / sizeof(reloadable[0]); i++)
        if (strcmp(reloadable[i], name) == 0)
            return 1;
    return 0;
}

/* The value of row r in cfg as text. */
static void row_text(const struct obd_config *cfg, const struct row *r,
                     char *buf, size_t len)
{
    const char *field = (const char *)cfg + r->offset;
    if (r->type == T_STR) {
        snprintf(buf, len, "%s", field);
    } else {
        int64_t v;
        memcpy(&v, field, sizeof(v));
        snprintf(buf, len, "%" PRId64, v);
    }
}

int obd_config_value(const struct obd_config *cfg, const char *name, char *buf,
                     size_t len)
{
    const struct row *r = find_row(name);
    if (r == NULL)
        return -1;
    row_text(cfg, r, buf, len);
    return 0;
}

/* Appends "name: old -> new" for every row that differs and is (or is
 * not) reloadable; copies the reloadable ones when apply is set. */
static int diff_rows(struct obd_config *cur, const struct obd_config *next,
                     int want_reloadable, int apply, char *buf, size_t len)
{
    size_t off = 0;
    int n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < NROWS; i++) {
        const struct row *r = &rows[i];
        if (is_reloadable(r->name) != want_reloadable)
            continue;
        char a[128], b[128];
        row_text(cur, r, a, sizeof(a));
        row_text(next, r, b, sizeof(b));
        if (strcmp(a, b) == 0)
            continue;
        n++;
        if (off < len)
            off += (size_t)snprintf(buf + off, len - off, "%s%s: %s -> %s",
                                    n > 1 ? ", " : "", r->name, a, b);
        if (apply)
            memcpy((char *)cur + r->offset, (const char *)next + r->offset,
                   r->type == T_STR ? r->size : sizeof(int64_t));
    }
    return n;
}

int obd_config_reload(struct obd_config *cur, const struct obd_config *next,
                      char *changed, size_t len)
{
    int n = diff_rows(cur, next, 1, 1, changed, len);
    cur->log_level_num = obd_log_level_parse(cur->log_level);
    return n;
}

int obd_config_diff_fixed(const struct obd_config *cur,
                          const struct obd_config *next, char *changed,
                          size_t len)
{
    return diff_rows((struct obd_config *)cur, next, 0, 0, changed, len);
}
