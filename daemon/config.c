#include "config.h"
#include "auth.h"
#include "err.h"
#include "hash.h"
#include "log.h"
#include "snapset.h"

#include <obcomm.h>

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static int trace_file_ok(const char *path, char *why, size_t len);
static int listen_ok(const struct obd_addr *a, char *why, size_t len);

enum row_type { T_INT, T_STR };

/* The unit of an integer option, and so the suffixes its values take. */
enum row_unit { U_NONE, U_MS, U_S };

struct row {
    const char *name;
    enum row_type type;
    enum row_unit unit;
    size_t offset;
    size_t size; /* T_STR: capacity including the terminator */
    int64_t min, max;
    const char *def;
    const char *help;
};

#define INT_ROW(field, unit, lo, hi, d, h)                                     \
    {                                                                          \
#field, T_INT, unit, offsetof(struct obd_config, field), 0, lo, hi, d, \
            h                                                                  \
    }
#define STR_ROW(field, d, h)                                       \
    {                                                              \
#field, T_STR, U_NONE, offsetof(struct obd_config, field), \
            sizeof(((struct obd_config *)0)->field), 0, 0, d, h    \
    }

/* Every option of obcommd. Names are the config file keys and, prefixed
 * with "--", the flags. */
static const struct row rows[] = {
    STR_ROW(cluster, "obcomm",
            "Cluster name; daemons of different clusters refuse each other."),
    INT_ROW(rank, U_NONE, 0, OBD_MAX_NODES - 1, "auto",
            "This node's rank in the peers list. auto: the one entry whose "
            "host is an address of this machine (and whose port is listen's "
            "port when listen is set)."),
    STR_ROW(peers, "",
            "Every node's daemon as host:port, comma-separated, in rank "
            "order (this node included). Empty: a one-node world, unless "
            "peers_file is set."),
    STR_ROW(peers_file, "",
            "A file listing every node's daemon as host:port, one a line "
            "in rank order ('#' starts a comment); instead of peers."),
    STR_ROW(listen, "",
            "TCP address to listen on for other daemons (host:port). "
            "Empty: this rank's own peers entry (never every interface). "
            "Without auth_key_file only a loopback address is accepted "
            "(see allow_insecure)."),
    STR_ROW(socket, OBCOMM_DEFAULT_SOCKET,
            "Unix socket for trainers and obcommctl. A directory that is "
            "missing is created (mode 0755); one that others may write "
            "without the sticky bit, or of another user, is refused."),
    INT_ROW(timeout_ms, U_MS, 10, 3600000, "60000",
            "Default deadline of every collective, in milliseconds."),
    INT_ROW(segment_bytes, U_NONE, 8192, 64 << 20, "1048576",
            "Tensors are cut into segments of this many bytes so that "
            "sending, receiving and reducing overlap (1-bit segments are "
            "whole 64 Ki-element codec blocks, 8 KiB of bits each)."),
    INT_ROW(max_buffer_bytes, U_NONE, 4096, INT64_C(1) << 40, "17179869184",
            "Largest shared-memory buffer a trainer may register."),
    INT_ROW(max_clients, U_NONE, 1, 4096, "256",
            "Most Unix-socket connections at once."),
    INT_ROW(max_jobs, U_NONE, 1, 1024, "16", "Most jobs at once."),
    INT_ROW(max_jobs_per_uid, U_NONE, 0, 1024, "0",
            "Most jobs one user may own at once on this node (a job is "
            "owned by the user of its first trainer here). root is not "
            "bounded by it, only by max_jobs. 0: a quarter of max_jobs, "
            "at least 1."),
    STR_ROW(owner_identity, "uid",
            "How the nodes compare the owners of a job's trainers: uid "
            "(equal uids) or name (equal user names, each node looking "
            "its trainers' uid up in its user database: for clusters "
            "whose uids differ between nodes). Trainers of different "
            "owners on different nodes fail the job's ops on every rank "
            "with OBCOMM_E_DENIED. Must be equal on every node (a link "
            "between nodes that differ is refused)."),
    INT_ROW(sock_buf_bytes, U_NONE, 65536, 256 << 20, "4194304",
            "SO_SNDBUF and SO_RCVBUF of peer connections."),
    INT_ROW(connect_backoff_max_ms, U_MS, 10, 60000, "1000",
            "Longest wait between two attempts to dial a peer, in "
            "milliseconds."),
    INT_ROW(keepalive_s, U_S, 1, 3600, "10",
            "TCP keepalive idle time of peers, in seconds."),
    INT_ROW(peer_timeout_ms, U_MS, 100, 3600000, "3000",
            "A link to another node that carries nothing for this many "
            "milliseconds (heartbeats go every eighth of it, at least "
            "once a second, and the link is checked as often), or whose "
            "sent data stays unacknowledged as long (TCP_USER_TIMEOUT), "
            "is declared down within that time: the ops that need the "
            "node fail with OBCOMM_E_PEER_LOST. A value above timeout_ms "
            "counts as timeout_ms."),
    INT_ROW(threads, U_NONE, 0, 256, "0",
            "Size of the worker pool (UV_THREADPOOL_SIZE) for codec and "
            "reduction work; 0: one per usable core."),
    INT_ROW(stall_warn_ms, U_MS, 0, 3600000, "10000",
            "Log an op that has waited this long once, with its fingerprint "
            "and who has not arrived (a stall inspector, as Horovod's); 0: "
            "never."),
    STR_ROW(log_level, "info", "error, warn, info or debug."),
    STR_ROW(trace_file, "",
            "File for a timeline of every op's phases on this node (Chrome "
            "trace events: open it in ui.perfetto.dev). Empty: none."),
    STR_ROW(state_dir, "",
            "Directory for the snapshot sets of 1-bit error feedback that "
            "checkpoints name (OneBitAdam.state_dict, obcomm_adam_save); "
            "the newest 4 of each job are kept (and state_dir_max_bytes "
            "bounds them all). One daemon's alone: it holds state_dir/lock "
            "while it runs, and another daemon given the same directory "
            "refuses to start. Empty: the newest set of "
            "each job is kept in memory only."),
    INT_ROW(ef_max_bytes, U_NONE, 0, INT64_C(1) << 50, "0",
            "Most bytes of 1-bit error-feedback state of live runs (all "
            "keys together); a new key past it fails. Snapshot sets kept "
            "in memory do not count (retained_sets_max_bytes). 0: a "
            "quarter of the machine's memory."),
    INT_ROW(retained_sets_max_bytes, U_NONE, 0, INT64_C(1) << 50, "0",
            "Most bytes of the snapshot sets kept in memory without a "
            "state_dir (the newest of each job), all jobs together: past "
            "it the set of the job whose run ended first is dropped, and "
            "a snapshot bigger than it fails. 0: the bound of "
            "ef_max_bytes."),
    INT_ROW(retained_sets_max_age_s, U_S, 0, INT64_C(1) << 31, "3600",
            "A snapshot set kept in memory without a state_dir is dropped "
            "this many seconds after its job's run ended on this node "
            "(a checkpoint that exported it restores from its parts)."),
    INT_ROW(state_dir_max_bytes, U_NONE, 0, INT64_C(1) << 60, "68719476736",
            "Most bytes of the snapshot sets in state_dir, all jobs "
            "together: past it every set of the job whose newest set is "
            "the oldest is deleted, never the committing job's. 0: no "
            "bound (each job still keeps its newest 4 sets)."),
    STR_ROW(socket_group, "",
            "Group (name or number) given the Unix socket, mode 0660: its "
            "members and the daemon's user may connect. Empty: the "
            "daemon's group."),
    INT_ROW(max_clients_per_uid, U_NONE, 1, 4096, "128",
            "Most Unix-socket connections of one user at once."),
    INT_ROW(client_join_ms, U_MS, 100, 600000, "5000",
            "A connection that has neither joined a job nor asked for the "
            "status within this many milliseconds is closed."),
    STR_ROW(auth_key_file, "",
            "File whose whole content is the cluster key (32 to 4096 "
            "bytes, mode 0600 or stricter, owned by the daemon's user or "
            "root): daemons prove to each other that they hold it before "
            "anything else. A relative name is a systemd credential, looked "
            "up in $CREDENTIALS_DIRECTORY: the unit's LoadCredential= hands "
            "over /etc/credstore/obcomm-cluster.key as obcomm-cluster.key. "
            "Empty: no authentication, loopback only."),
    STR_ROW(allow_insecure, "false",
            "true: listen on a non-loopback address without auth_key_file "
            "(anyone who reaches the port can join the mesh)."),
    STR_ROW(wire_protection, "none",
            "Data frames between daemons after the handshake: none (as "
            "they are, zero-copy), integrity (a tag per frame) or "
            "encrypt (ChaCha20-Poly1305). Control frames always carry a "
            "tag when auth_key_file is set. Must be equal on every node."),
    INT_ROW(max_unauth_links, U_NONE, 1, 4096, "64",
            "Most peer connections that have not finished the handshake; "
            "past it the oldest of the busiest source address is closed."),
    INT_ROW(max_unauth_per_addr, U_NONE, 1, 4096, "8",
            "Most such connections from one source address."),
    INT_ROW(max_buffers_per_client, U_NONE, 1, 1 << 20, "1024",
            "Most shared-memory buffers one trainer connection may have "
            "registered at once."),
    INT_ROW(max_buffers_per_uid, U_NONE, 1, 1 << 20, "4096",
            "Most shared-memory buffers one user may have registered at "
            "once, all connections together (each is one mapping in the "
            "daemon, and mappings are bounded by vm.max_map_count)."),
    INT_ROW(max_buffer_bytes_per_uid, U_NONE, 0, INT64_C(1) << 50, "0",
            "Most bytes of shared-memory buffers one user may have "
            "registered at once. 0: the machine's memory."),
    INT_ROW(max_buffers, U_NONE, 0, 1 << 24, "0",
            "Most shared-memory buffers of all users together. 0: half of "
            "vm.max_map_count, so that the daemon's own mappings (segment "
            "buffers, thread stacks) always have room."),
};

/* Options that SIGHUP applies while the daemon runs. */
static const char *const reloadable[] = {"log_level"};

#define NROWS (sizeof(rows) / sizeof(rows[0]))
_Static_assert(NROWS <= OBD_CONFIG_ROWS, "raise OBD_CONFIG_ROWS");

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

static size_t row_index(const char *name)
{
    const struct row *r = find_row(name);
    return r ? (size_t)(r - rows) : 0;
}

/* Where option `name` got its value, for the front of a message:
 * "FILE:LINE: ", "command line: " or "" for a default. */
static const char *where(const struct obd_config *cfg, const char *name,
                         char *buf, size_t len)
{
    int line = cfg->src_line[row_index(name)];
    if (line > 0)
        snprintf(buf, len, "%s:%d: ", cfg->src_file, line);
    else if (line < 0)
        snprintf(buf, len, "command line: ");
    else
        buf[0] = '\0';
    return buf;
}

/* Parses a decimal integer with the suffixes its unit allows. Octal and
 * hexadecimal forms are refused on purpose: "timeout_ms = 0100" means 100
 * to a person, and "0x" is not what anyone types into a config file. */
static int parse_int(const char *s, enum row_unit unit, long long *out)
{
    const char *p = s;
    if (*p == '-' || *p == '+')
        p++;
    if (!isdigit((unsigned char)*p))
        return OBD_E_INVAL;
    while (isdigit((unsigned char)*p))
        p++;
    const char *num_end = p;
    long long mul = 1;
    if (*p != '\0') {
        if (unit == U_MS && strcmp(p, "ms") == 0)
            mul = 1;
        else if (unit == U_MS && strcmp(p, "s") == 0)
            mul = 1000;
        else if (unit == U_S && strcmp(p, "s") == 0)
            mul = 1;
        else
            return OBD_E_INVAL;
    }
    char digits[32];
    size_t n = (size_t)(num_end - s);
    if (n >= sizeof(digits))
        return OBD_E_TOOBIG;
    memcpy(digits, s, n);
    digits[n] = '\0';
    errno = 0;
    long long v = strtoll(digits, NULL, 10);
    if (errno != 0)
        return OBD_E_TOOBIG;
    if (v > LLONG_MAX / mul || v < LLONG_MIN / mul)
        return OBD_E_TOOBIG;
    *out = v * mul;
    return 0;
}

static const char *unit_forms(enum row_unit unit)
{
    switch (unit) {
    case U_MS:
        return " (milliseconds: 250, 250ms or 2s)";
    case U_S:
        return " (seconds: 10 or 10s)";
    default:
        return "";
    }
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
            return OBD_E_INVAL;
        }
        memcpy(field, value, len + 1);
        return 0;
    }

    long long v;
    if (strcmp(r->name, "rank") == 0 && strcmp(value, "auto") == 0) {
        v = -1;
    } else {
        int rc = parse_int(value, r->unit, &v);
        if (rc == OBD_E_INVAL) {
            fail(err, errlen, "%s: '%s' is not a decimal integer%s", r->name,
                 value, unit_forms(r->unit));
            return OBD_E_INVAL;
        }
        if (rc == OBD_E_TOOBIG || v < r->min || v > r->max) {
            fail(err, errlen,
                 "%s: %s is out of range [%" PRId64 ", %" PRId64 "]", r->name,
                 value, r->min, r->max);
            return OBD_E_INVAL;
        }
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
        return OBD_E_INVAL;
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

/* Opens a file for reading only when it is a regular file: a directory, a
 * FIFO or a device given by mistake must not run the daemon on defaults or
 * block it. */
static FILE *open_regular(const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        fail(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        fail(err, errlen, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "r");
    if (f == NULL) {
        fail(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

int obd_config_load(struct obd_config *cfg, const char *path, char *err,
                    size_t errlen)
{
    if (strlen(path) >= sizeof(cfg->src_file)) {
        fail(err, errlen, "config file name longer than %zu bytes",
             sizeof(cfg->src_file) - 1);
        return OBD_E_INVAL;
    }
    FILE *f = open_regular(path, err, errlen);
    if (f == NULL)
        return OBD_E_INVAL;
    snprintf(cfg->src_file, sizeof(cfg->src_file), "%s", path);

    char *line = NULL;
    size_t cap = 0;
    int lineno = 0;
    int rc = 0;
    errno = 0;
    while (getline(&line, &cap, f) != -1) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash != NULL)
            *hash = '\0';
        char *s = trim(line);
        if (*s == '\0')
            continue;
        char *eq = strchr(s, '=');
        if (eq == NULL) {
            fail(err, errlen, "%s:%d: expected 'name = value'", path, lineno);
            rc = OBD_E_INVAL;
            break;
        }
        *eq = '\0';
        const char *name = trim(s);
        const struct row *r = find_row(name);
        if (r != NULL && cfg->src_line[r - rows] > 0) {
            fail(err, errlen, "%s:%d: %s is already set at line %d", path,
                 lineno, name, cfg->src_line[r - rows]);
            rc = OBD_E_INVAL;
            break;
        }
        char msg[512];
        if (obd_config_set(cfg, name, trim(eq + 1), msg, sizeof(msg))) {
            fail(err, errlen, "%s:%d: %s", path, lineno, msg);
            rc = OBD_E_INVAL;
            break;
        }
        cfg->src_line[r - rows] = lineno;
    }
    if (rc == 0 && ferror(f)) {
        fail(err, errlen, "%s:%d: %s", path, lineno + 1, strerror(errno));
        rc = OBD_E_IO;
    }
    free(line);
    fclose(f);
    return rc;
}

int obd_config_parse_args(struct obd_config *cfg, int argc, char **argv,
                          int *check, int *help, char *err, size_t errlen)
{
    /* The file comes first so that flags override it wherever -c stands. */
    int files = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc) {
                fail(err, errlen, "%s needs a file name", argv[i]);
                return OBD_E_INVAL;
            }
            if (++files > 1) {
                fail(err, errlen, "%s given twice: one config file at most",
                     argv[i]);
                return OBD_E_INVAL;
            }
            if (obd_config_load(cfg, argv[++i], err, errlen))
                return OBD_E_INVAL;
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
        if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
            *help = 3;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) {
            fail(err, errlen, "unexpected argument '%s' (see --help)", a);
            return OBD_E_INVAL;
        }

        char name[64];
        const char *value;
        const char *eq = strchr(a + 2, '=');
        size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (len >= sizeof(name)) {
            fail(err, errlen, "unknown option '%s'", a);
            return OBD_E_INVAL;
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
            return OBD_E_INVAL;
        }
        const struct row *r = find_row(name);
        if (r != NULL && cfg->src_line[r - rows] < 0) {
            fail(err, errlen, "--%s given twice", name);
            return OBD_E_INVAL;
        }
        if (obd_config_set(cfg, name, value, err, errlen))
            return OBD_E_INVAL;
        cfg->src_line[r - rows] = -1;
    }
    return 0;
}

int obd_config_parse_addr(const char *text, struct obd_addr *out)
{
    const char *colon = strrchr(text, ':');
    if (colon == NULL || colon == text)
        return OBD_E_INVAL;
    size_t hlen = (size_t)(colon - text);
    if (hlen >= sizeof(out->host))
        return OBD_E_INVAL;

    const char *p = colon + 1;
    long port = 0;
    if (*p == '\0')
        return OBD_E_INVAL;
    for (; *p; p++) {
        if (!isdigit((unsigned char)*p) || port > 65535)
            return OBD_E_INVAL;
        port = port * 10 + (*p - '0');
    }
    if (port < 1 || port > 65535)
        return OBD_E_INVAL;

    memcpy(out->host, text, hlen);
    out->host[hlen] = '\0';
    out->port = (uint16_t)port;
    return 0;
}

/* Appends one world entry; `src` prefixes messages. */
static int add_node(struct obd_config *cfg, const char *tok, const char *src,
                    char *err, size_t errlen)
{
    if (cfg->nodes == OBD_MAX_NODES) {
        fail(err, errlen, "%smore than %d nodes", src, OBD_MAX_NODES);
        return OBD_E_INVAL;
    }
    if (obd_config_parse_addr(tok, &cfg->world[cfg->nodes])) {
        fail(err, errlen, "%s'%s' is not host:port", src, tok);
        return OBD_E_INVAL;
    }
    cfg->nodes++;
    return 0;
}

static int world_from_text(struct obd_config *cfg, char *err, size_t errlen)
{
    char pre[4200], src[4300];
    where(cfg, "peers", pre, sizeof(pre));
    snprintf(src, sizeof(src), "%speers: ", pre);
    char *copy = strdup(cfg->peers);
    if (copy == NULL) {
        fail(err, errlen, "out of memory");
        return OBD_E_INVAL;
    }
    int rc = 0;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok != NULL && rc == 0;
         tok = strtok_r(NULL, ",", &save))
        rc = add_node(cfg, trim(tok), src, err, errlen);
    free(copy);
    return rc;
}

/* Reads peers_file: one host:port a line, '#' comments, blank lines. */
static int world_from_file(struct obd_config *cfg, char *err, size_t errlen)
{
    char pre[4200];
    where(cfg, "peers_file", pre, sizeof(pre));
    char msg[4400];
    FILE *f = open_regular(cfg->peers_file, msg, sizeof(msg));
    if (f == NULL) {
        fail(err, errlen, "%speers_file: %s", pre, msg);
        return OBD_E_INVAL;
    }
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, rc = 0;
    while (rc == 0 && getline(&line, &cap, f) != -1) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash != NULL)
            *hash = '\0';
        char *s = trim(line);
        if (*s == '\0')
            continue;
        char src[4200];
        snprintf(src, sizeof(src), "%s:%d: ", cfg->peers_file, lineno);
        rc = add_node(cfg, s, src, err, errlen);
    }
    if (rc == 0 && ferror(f)) {
        fail(err, errlen, "%s: %s", cfg->peers_file, strerror(errno));
        rc = OBD_E_IO;
    }
    free(line);
    fclose(f);
    return rc;
}

/* The listen address, once the rank is known. */
static int derive_listen(struct obd_config *cfg, char *err, size_t errlen)
{
    char pre[4200];
    if (cfg->rank >= cfg->nodes) {
        fail(err, errlen,
             "%srank: %" PRId64 " but peers lists only %d nodes (0..%d)",
             where(cfg, "rank", pre, sizeof(pre)), cfg->rank, cfg->nodes,
             cfg->nodes - 1);
        return OBD_E_INVAL;
    }
    if (cfg->listen[0] != '\0') {
        if (obd_config_parse_addr(cfg->listen, &cfg->listen_addr)) {
            fail(err, errlen, "%slisten: '%s' is not host:port",
                 where(cfg, "listen", pre, sizeof(pre)), cfg->listen);
            return OBD_E_INVAL;
        }
    } else {
        /* This rank's own address, never every interface (protected
         * mode: see allow_insecure). */
        snprintf(cfg->listen_addr.host, sizeof(cfg->listen_addr.host), "%s",
                 cfg->world[cfg->rank].host);
        cfg->listen_addr.port = cfg->world[cfg->rank].port;
    }
    return 0;
}

/* allow_insecure, wire_protection and owner_identity (the key file itself
 * is read at start, daemon.c). */
static int finish_security(struct obd_config *cfg, char *err, size_t errlen)
{
    if (strcmp(cfg->allow_insecure, "true") == 0) {
        cfg->insecure = 1;
    } else if (strcmp(cfg->allow_insecure, "false") == 0) {
        cfg->insecure = 0;
    } else {
        fail(err, errlen, "allow_insecure: '%s' is not true or false",
             cfg->allow_insecure);
        return OBD_E_INVAL;
    }
    cfg->wire = obd_auth_wire_parse(cfg->wire_protection);
    if (cfg->wire < 0) {
        fail(err, errlen,
             "wire_protection: '%s' is not one of none, integrity, encrypt",
             cfg->wire_protection);
        return OBD_E_INVAL;
    }
    if (strcmp(cfg->owner_identity, "uid") != 0 &&
        strcmp(cfg->owner_identity, "name") != 0) {
        fail(err, errlen, "owner_identity: '%s' is not one of uid, name",
             cfg->owner_identity);
        return OBD_E_INVAL;
    }
    cfg->owner_by_name = strcmp(cfg->owner_identity, "name") == 0;
    if (cfg->wire != OBD_WIRE_NONE && cfg->auth_key_file[0] == '\0') {
        fail(err, errlen,
             "wire_protection: %s needs auth_key_file (the session keys "
             "come from the cluster key)",
             cfg->wire_protection);
        return OBD_E_INVAL;
    }
    return 0;
}

int obd_config_finish(struct obd_config *cfg, char *err, size_t errlen)
{
    char pre[4200];
    cfg->log_level_num = obd_log_level_parse(cfg->log_level);
    if (cfg->log_level_num < 0) {
        fail(err, errlen,
             "%slog_level: '%s' is not one of error, warn, info, debug",
             where(cfg, "log_level", pre, sizeof(pre)), cfg->log_level);
        return OBD_E_INVAL;
    }
    if (cfg->cluster[0] == '\0') {
        fail(err, errlen, "%scluster: must not be empty",
             where(cfg, "cluster", pre, sizeof(pre)));
        return OBD_E_INVAL;
    }
    if (cfg->socket[0] == '\0') {
        fail(err, errlen, "%ssocket: must not be empty",
             where(cfg, "socket", pre, sizeof(pre)));
        return OBD_E_INVAL;
    }
    if (cfg->peers[0] != '\0' && cfg->peers_file[0] != '\0') {
        fail(err, errlen, "%speers_file: set together with peers; give one",
             where(cfg, "peers_file", pre, sizeof(pre)));
        return OBD_E_INVAL;
    }

    if (finish_security(cfg, err, errlen))
        return OBD_E_INVAL;

    cfg->nodes = 0;
    if (cfg->peers[0] != '\0' && world_from_text(cfg, err, errlen))
        return OBD_E_INVAL;
    if (cfg->peers_file[0] != '\0' && world_from_file(cfg, err, errlen))
        return OBD_E_INVAL;
    memset(&cfg->listen_addr, 0, sizeof(cfg->listen_addr));
    if (cfg->nodes == 0) {
        /* One-node world: no TCP at all. */
        if (cfg->rank > 0) {
            fail(err, errlen, "%srank: %" PRId64 " needs a peers list",
                 where(cfg, "rank", pre, sizeof(pre)), cfg->rank);
            return OBD_E_INVAL;
        }
        cfg->rank = 0;
        cfg->nodes = 1;
        memset(&cfg->world[0], 0, sizeof(cfg->world[0]));
    } else {
        const char *src = cfg->peers_file[0] ? "peers_file" : "peers";
        for (int i = 0; i < cfg->nodes; i++)
            for (int j = i + 1; j < cfg->nodes; j++)
                if (cfg->world[i].port == cfg->world[j].port &&
                    strcmp(cfg->world[i].host, cfg->world[j].host) == 0) {
                    fail(err, errlen, "%s%s: ranks %d and %d are both %s:%u",
                         where(cfg, src, pre, sizeof(pre)), src, i, j,
                         cfg->world[i].host, cfg->world[i].port);
                    return OBD_E_INVAL;
                }
        if (cfg->rank >= 0 && derive_listen(cfg, err, errlen))
            return OBD_E_INVAL;
    }

    /* The fingerprint covers what every node must agree on: the cluster
     * name and the world, in rank order. */
    uint64_t h = OBCOMM_HASH_FNV1A_INIT;
    h = obcomm_hash_fnv1a(h, cfg->cluster, strlen(cfg->cluster) + 1);
    for (int i = 0; i < cfg->nodes; i++) {
        h = obcomm_hash_fnv1a(h, cfg->world[i].host,
                              strlen(cfg->world[i].host) + 1);
        /* The port as two bytes, low first, so every host agrees. */
        const uint8_t port[2] = {(uint8_t)(cfg->world[i].port & 0xff),
                                 (uint8_t)(cfg->world[i].port >> 8)};
        h = obcomm_hash_fnv1a(h, port, sizeof(port));
    }
    cfg->fingerprint = h;
    return 0;
}

void obd_config_world_entry(const struct obd_config *cfg, int i, char *buf,
                            size_t len)
{
    snprintf(buf, len, "%s:%u", cfg->world[i].host, cfg->world[i].port);
}

int obd_config_world_diff(const struct obd_config *cfg,
                          const char *const *world, size_t n, char *out,
                          size_t len)
{
    char mine[OBD_HOST_MAX + 8];
    size_t nodes = (size_t)cfg->nodes;
    if (n == 0) {
        snprintf(out, len, "the peer does not say its peers list");
        return 1;
    }
    for (size_t i = 0; i < n && i < nodes; i++) {
        obd_config_world_entry(cfg, (int)i, mine, sizeof(mine));
        if (strcmp(mine, world[i]) != 0) {
            snprintf(out, len, "rank %zu is %s here, %.80s at the peer", i,
                     mine, world[i]);
            return 1;
        }
    }
    if (n < nodes) {
        obd_config_world_entry(cfg, (int)n, mine, sizeof(mine));
        snprintf(out, len,
                 "%d nodes here, %zu at the peer: rank %zu (%s) is missing "
                 "at the peer",
                 cfg->nodes, n, n, mine);
        return 1;
    }
    if (n > nodes) {
        snprintf(out, len,
                 "%d nodes here, %zu at the peer: rank %zu (%.80s) is missing "
                 "here",
                 cfg->nodes, n, nodes, world[nodes]);
        return 1;
    }
    out[0] = '\0';
    return 0;
}

/* ---- what needs the system ---- */

/* The IP addresses one world entry resolves to. */
struct resolved {
    int n;
    struct sockaddr_storage a[8];
};

static int same_ip(const struct sockaddr_storage *x,
                   const struct sockaddr_storage *y)
{
    if (x->ss_family != y->ss_family)
        return 0;
    if (x->ss_family == AF_INET)
        return ((const struct sockaddr_in *)x)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)y)->sin_addr.s_addr;
    return memcmp(&((const struct sockaddr_in6 *)x)->sin6_addr,
                  &((const struct sockaddr_in6 *)y)->sin6_addr,
                  sizeof(struct in6_addr)) == 0;
}

int obd_config_is_loopback(const struct sockaddr_storage *sa)
{
    if (sa->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in = (const struct sockaddr_in6 *)sa;
        return IN6_IS_ADDR_LOOPBACK(&in->sin6_addr) ||
               (IN6_IS_ADDR_V4MAPPED(&in->sin6_addr) &&
                in->sin6_addr.s6_addr[12] == 127);
    }
    return 0;
}

/* 1 when `s` is an address of this machine: one a socket can bind to.
 * Binding (port 0, closed at once) needs no netlink socket, which the
 * systemd unit does not allow, and agrees with what listen would do. */
static int is_local(const struct sockaddr_storage *s)
{
    if (obd_config_is_loopback(s))
        return 1;
    int fd = socket(s->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_storage a = *s;
    socklen_t len = sizeof(struct sockaddr_in);
    if (a.ss_family == AF_INET) {
        ((struct sockaddr_in *)&a)->sin_port = 0;
    } else {
        ((struct sockaddr_in6 *)&a)->sin6_port = 0;
        len = sizeof(struct sockaddr_in6);
    }
    int ok = bind(fd, (struct sockaddr *)&a, len) == 0;
    close(fd);
    return ok;
}

static int resolve_host(const char *host, struct resolved *out)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
    struct addrinfo *res;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0)
        return rc;
    out->n = 0;
    for (struct addrinfo *ai = res; ai && out->n < 8; ai = ai->ai_next) {
        if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6)
            continue;
        memset(&out->a[out->n], 0, sizeof(out->a[0]));
        memcpy(&out->a[out->n], ai->ai_addr, ai->ai_addrlen);
        out->n++;
    }
    freeaddrinfo(res);
    return 0;
}

static void ip_text(const struct sockaddr_storage *s, char *buf, size_t len)
{
    const void *a =
        s->ss_family == AF_INET
            ? (const void *)&((const struct sockaddr_in *)s)->sin_addr
            : (const void *)&((const struct sockaddr_in6 *)s)->sin6_addr;
    if (inet_ntop(s->ss_family, a, buf, (socklen_t)len) == NULL)
        snprintf(buf, len, "?");
}

/* Decides whether two entries with the same port reach the same daemon:
 * they share an address, or both are addresses of this machine (where one
 * daemon listens on all of them). Writes the reason. */
static int same_node(const struct resolved *x, const struct resolved *y,
                     char *why, size_t len)
{
    for (int i = 0; i < x->n; i++)
        for (int j = 0; j < y->n; j++)
            if (same_ip(&x->a[i], &y->a[j])) {
                char ip[INET6_ADDRSTRLEN];
                ip_text(&x->a[i], ip, sizeof(ip));
                snprintf(why, len, "both reach %s", ip);
                return 1;
            }
    int lx = 0, ly = 0;
    for (int i = 0; i < x->n; i++)
        lx |= is_local(&x->a[i]);
    for (int j = 0; j < y->n; j++)
        ly |= is_local(&y->a[j]);
    if (lx && ly) {
        snprintf(why, len, "both are addresses of this machine");
        return 1;
    }
    return 0;
}

static int usable_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int obd_config_socket_dir_ok(const char *socket, int create, char *why,
                             size_t len, int *created)
{
    char dir[sizeof(((struct obd_config *)0)->socket)];
    snprintf(dir, sizeof(dir), "%s", socket);
    char *slash = strrchr(dir, '/');
    if (slash == NULL)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    if (created != NULL)
        *created = 0;
    struct stat st;
    if (stat(dir, &st) != 0 && errno == ENOENT) {
        if (!create) {
            /* The start creates it: a check passes when it can. */
            char parent[sizeof(dir)];
            snprintf(parent, sizeof(parent), "%s", dir);
            char *p = strrchr(parent, '/');
            if (p == NULL)
                snprintf(parent, sizeof(parent), ".");
            else if (p == parent)
                parent[1] = '\0';
            else
                *p = '\0';
            const char *no = NULL;
            if (stat(parent, &st) != 0)
                no = strerror(errno);
            else if (!S_ISDIR(st.st_mode))
                no = "not a directory";
            else if (access(parent, W_OK | X_OK) != 0)
                no = strerror(errno);
            if (no != NULL) {
                snprintf(why, len,
                         "socket directory %s: missing, and cannot be "
                         "created in %s: %s",
                         dir, parent, no);
                return OBD_E_INVAL;
            }
            return 0;
        }
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            snprintf(why, len, "socket directory %s: cannot create it: %s", dir,
                     strerror(errno));
            return OBD_E_INVAL;
        }
        if (created != NULL)
            *created = 1;
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(why, len, "socket directory %s is not a directory", dir);
        return OBD_E_INVAL;
    }
    if (st.st_uid != geteuid() && st.st_uid != 0) {
        snprintf(why, len,
                 "socket directory %s belongs to uid %u, not to this "
                 "daemon's uid %u or root: refused (another user could "
                 "replace the socket); use a directory of the daemon's "
                 "user such as /run/obcomm",
                 dir, (unsigned)st.st_uid, (unsigned)geteuid());
        return OBD_E_INVAL;
    }
    if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX)) {
        snprintf(why, len,
                 "socket directory %s is writable by everybody without "
                 "the sticky bit (mode %04o): refused (another user "
                 "could replace the socket)",
                 dir, (unsigned)(st.st_mode & 07777));
        return OBD_E_INVAL;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(why, len, "socket directory %s is not writable: %s", dir,
                 strerror(errno));
        return OBD_E_INVAL;
    }
    return 0;
}

int obd_config_socket_gid(const char *group, gid_t *out, char *why, size_t len)
{
    char *end;
    gid_t gid;
    unsigned long n = strtoul(group, &end, 10);
    if (*group != '\0' && *end == '\0') {
        gid = (gid_t)n;
    } else {
        struct group grp, *found = NULL;
        char buf[4096];
        if (getgrnam_r(group, &grp, buf, sizeof(buf), &found) != 0 ||
            found == NULL) {
            snprintf(why, len, "socket_group %s: no such group", group);
            return OBD_E_INVAL;
        }
        gid = found->gr_gid;
    }
    /* Giving a file to a group needs membership (or root's privilege). */
    int member = geteuid() == 0 || getegid() == gid;
    gid_t groups[256];
    int ng = getgroups(256, groups);
    for (int i = 0; i < ng && !member; i++)
        member = groups[i] == gid;
    if (!member) {
        snprintf(why, len,
                 "socket_group %s: this daemon's user (uid %u) is not a "
                 "member, so it cannot give the socket to the group (the "
                 "unit needs SupplementaryGroups=%s)",
                 group, (unsigned)geteuid(), group);
        return OBD_E_INVAL;
    }
    *out = gid;
    return 0;
}

int obd_config_resolve(struct obd_config *cfg, int strict, char *err,
                       size_t errlen)
{
    char pre[4200];
    int rc = OBD_E_INVAL;
    struct resolved *res = NULL;
    const char *src = cfg->peers_file[0] ? "peers_file" : "peers";

    /* What was given, before "auto" and 0 become values: a SIGHUP
     * compares the file as given with this, not with what this machine
     * made of it. */
    if (!cfg->resolved) {
        cfg->rank_given = cfg->rank;
        cfg->threads_given = cfg->threads;
        cfg->resolved = 1;
    }
    if (cfg->threads == 0)
        cfg->threads = usable_cores();

    if (strict) {
        /* The start's own checks (ctl.c, daemon.c), without creating
         * anything. */
        char why[4400];
        gid_t gid;
        if (obd_config_socket_dir_ok(cfg->socket, 0, why, sizeof(why), NULL) !=
                0 ||
            (cfg->socket_group[0] != '\0' &&
             obd_config_socket_gid(cfg->socket_group, &gid, why, sizeof(why)) !=
                 0) ||
            (cfg->state_dir[0] != '\0' &&
             obd_snapset_dir_ok(cfg->state_dir, (unsigned)geteuid(), 0, why,
                                sizeof(why)) != 0) ||
            (cfg->trace_file[0] != '\0' &&
             trace_file_ok(cfg->trace_file, why, sizeof(why)) != 0)) {
            fail(err, errlen, "%s", why);
            return OBD_E_INVAL;
        }
        if (cfg->auth_key_file[0] != '\0') {
            uint8_t key[OBD_AUTH_KEY];
            snprintf(why, sizeof(why), "cannot initialise libsodium");
            int bad = obd_auth_init() != 0 ||
                      obd_auth_key_load(cfg->auth_key_file, key, why,
                                        sizeof(why)) != 0;
            explicit_bzero(key, sizeof(key));
            if (bad) {
                fail(err, errlen, "%s", why);
                return OBD_E_INVAL;
            }
        }
    }

    if (cfg->peers[0] == '\0' && cfg->peers_file[0] == '\0')
        return 0; /* one-node world: rank 0, no TCP */

    res = calloc((size_t)cfg->nodes, sizeof(*res));
    if (res == NULL) {
        fail(err, errlen, "out of memory");
        return OBD_E_INVAL;
    }
    where(cfg, src, pre, sizeof(pre));
    for (int i = 0; i < cfg->nodes; i++) {
        int g = resolve_host(cfg->world[i].host, &res[i]);
        if (g != 0) {
            res[i].n = 0;
            if (strict) {
                fail(err, errlen,
                     "%s%s: rank %d's host %s does not resolve: %s", pre, src,
                     i, cfg->world[i].host, gai_strerror(g));
                goto out;
            }
        }
    }

    for (int i = 0; i < cfg->nodes; i++)
        for (int j = i + 1; j < cfg->nodes; j++) {
            char why[128];
            if (cfg->world[i].port == cfg->world[j].port &&
                same_node(&res[i], &res[j], why, sizeof(why))) {
                fail(err, errlen,
                     "%s%s: ranks %d (%s:%u) and %d (%s:%u) are the same "
                     "node: %s",
                     pre, src, i, cfg->world[i].host, cfg->world[i].port, j,
                     cfg->world[j].host, cfg->world[j].port, why);
                goto out;
            }
        }

    if (cfg->rank < 0) {
        struct obd_addr want;
        int by_port = cfg->listen[0] != '\0' &&
                      obd_config_parse_addr(cfg->listen, &want) == 0;
        int found = -1;
        for (int i = 0; i < cfg->nodes; i++) {
            int local = 0;
            for (int k = 0; k < res[i].n; k++)
                local |= is_local(&res[i].a[k]);
            if (!local || (by_port && cfg->world[i].port != want.port))
                continue;
            if (found >= 0) {
                fail(err, errlen,
                     "rank: auto, but ranks %d (%s:%u) and %d (%s:%u) are "
                     "both addresses of this machine; set rank (or listen "
                     "with the port)",
                     found, cfg->world[found].host, cfg->world[found].port, i,
                     cfg->world[i].host, cfg->world[i].port);
                goto out;
            }
            found = i;
        }
        if (found < 0) {
            fail(err, errlen,
                 "rank: auto, but no entry of %s is an address of this "
                 "machine%s; set rank",
                 src, by_port ? " with listen's port" : "");
            goto out;
        }
        cfg->rank = found;
        if (derive_listen(cfg, err, errlen))
            goto out;
    }
    if (strict && cfg->listen_addr.port != 0) {
        char why[600];
        if (listen_ok(&cfg->listen_addr, why, sizeof(why)) != 0) {
            fail(err, errlen, "%s", why);
            goto out;
        }
    }
    rc = 0;
out:
    free(res);
    return rc;
}

/* The trace file as the start opens it (O_CREAT | O_NOFOLLOW, for
 * writing), without creating it: a regular file we may write, or a new
 * name in a directory we may write. */
static int trace_file_ok(const char *path, char *why, size_t len)
{
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISREG(st.st_mode)) {
            snprintf(why, len, "trace_file %s is not a regular file", path);
            return OBD_E_INVAL;
        }
        if (access(path, W_OK) != 0) {
            snprintf(why, len, "trace_file %s: %s", path, strerror(errno));
            return OBD_E_INVAL;
        }
        return 0;
    }
    if (errno != ENOENT) {
        snprintf(why, len, "trace_file %s: %s", path, strerror(errno));
        return OBD_E_INVAL;
    }
    char dir[4200];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = '\0';
    else if (slash != NULL)
        *slash = '\0';
    else
        snprintf(dir, sizeof(dir), ".");
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(why, len, "trace_file %s: directory %s: %s", path, dir,
                 strerror(errno));
        return OBD_E_INVAL;
    }
    return 0;
}

/* The listen address is one this machine has: a socket binds to it (on
 * a port the kernel picks, so a daemon already listening there does not
 * count against it). */
static int listen_ok(const struct obd_addr *a, char *why, size_t len)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *res;
    int g = getaddrinfo(a->host[0] ? a->host : NULL, "0", &hints, &res);
    if (g != 0) {
        snprintf(why, len, "listen %s:%u does not resolve: %s", a->host,
                 a->port, gai_strerror(g));
        return OBD_E_INVAL;
    }
    int rc = -1, e = 0;
    for (struct addrinfo *r = res; r && rc != 0; r = r->ai_next) {
        int fd = socket(r->ai_family, r->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            e = errno;
            continue;
        }
        rc = bind(fd, r->ai_addr, r->ai_addrlen);
        if (rc != 0)
            e = errno;
        close(fd);
    }
    freeaddrinfo(res);
    if (rc == 0)
        return 0;
    snprintf(why, len, "listen %s:%u: this machine cannot listen there: %s",
             a->host, a->port, strerror(e));
    return OBD_E_INVAL;
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
            if (strcmp(rows[i].name, "rank") == 0 && v == -1)
                fprintf(out, "rank = auto\n"); /* not resolved yet */
            else
                fprintf(out, "%s = %" PRId64 "\n", rows[i].name, v);
        }
    }
}

/* Prints `text` as '#' comment lines of at most 78 columns. */
static void print_comment(FILE *out, const char *text)
{
    const char *p = text;
    while (*p) {
        size_t n = strlen(p);
        if (n > 76) {
            n = 76;
            while (n > 0 && p[n] != ' ')
                n--;
            if (n == 0)
                n = strcspn(p, " ");
        }
        fprintf(out, "# %.*s\n", (int)n, p);
        p += n;
        while (*p == ' ')
            p++;
    }
}

void obd_config_print_help(FILE *out, int as_config_file,
                           const struct obd_config *cfg)
{
    for (size_t i = 0; i < NROWS; i++) {
        const struct row *r = &rows[i];
        char bounds[96] = "";
        if (r->type == T_INT && strcmp(r->name, "rank") == 0)
            snprintf(bounds, sizeof(bounds), " [auto, 0..%" PRId64 "]", r->max);
        else if (r->type == T_INT)
            snprintf(bounds, sizeof(bounds), " [%" PRId64 "..%" PRId64 "]%s",
                     r->min, r->max,
                     r->unit == U_MS  ? " (also 250ms, 2s)"
                     : r->unit == U_S ? " (also 10s)"
                                      : "");
        if (as_config_file) {
            char text[1024];
            snprintf(text, sizeof(text), "%s%s", r->help, bounds);
            print_comment(out, text);
            /* The default always, commented out, so that the example
             * alone says every default (deploy/man/gen-options.sh reads
             * obcommd(8)'s OPTIONS from it); then the value set, if any. */
            if (cfg->src_line[i] == 0) {
                fprintf(out, "# %s = %s\n\n", r->name, r->def);
            } else {
                fprintf(out, "# %s = %s\n", r->name, r->def);
                const char *field = (const char *)cfg + r->offset;
                if (r->type == T_STR) {
                    fprintf(out, "%s = %s\n\n", r->name, field);
                } else {
                    int64_t v;
                    memcpy(&v, field, sizeof(v));
                    if (v < 0) /* rank auto */
                        fprintf(out, "%s = auto\n\n", r->name);
                    else
                        fprintf(out, "%s = %" PRId64 "\n\n", r->name, v);
                }
            }
        } else
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
        return OBD_E_INVAL;
    row_text(cfg, r, buf, len);
    return 0;
}

/* The value of row r as the configuration gave it: rank and threads of
 * a resolved configuration as they were before obd_config_resolve()
 * turned "auto" and 0 into this machine's values. */
static void row_text_given(const struct obd_config *cfg, const struct row *r,
                           char *buf, size_t len)
{
    int64_t rank = cfg->resolved ? cfg->rank_given : cfg->rank;
    if (strcmp(r->name, "rank") == 0 && rank < 0)
        snprintf(buf, len, "auto");
    else if (cfg->resolved && strcmp(r->name, "rank") == 0)
        snprintf(buf, len, "%" PRId64, rank);
    else if (cfg->resolved && strcmp(r->name, "threads") == 0)
        snprintf(buf, len, "%" PRId64, cfg->threads_given);
    else
        row_text(cfg, r, buf, len);
}

/* Appends "name: old -> new" for every row that differs and is (or is
 * not) reloadable; copies the reloadable ones when apply is set. Both
 * sides are compared as given (row_text_given), so an option nobody
 * changed is never named. */
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
        row_text_given(cur, r, a, sizeof(a));
        row_text_given(next, r, b, sizeof(b));
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
