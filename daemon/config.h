/* obcommd's configuration: one table of options, read from a file and from
 * command-line flags. The parser, --check-config, --help and the example
 * config in deploy/ all come from the same table (config.c). A function
 * that can fail returns 0 or an OBD_E_* code (err.h), OBD_E_INVAL for
 * anything wrong in what was given, with a message in its err or why. */
#ifndef OBD_CONFIG_H
#define OBD_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define OBD_MAX_NODES 256
#define OBD_HOST_MAX  64

/* Room for the options of the table (checked at compile time). */
#define OBD_CONFIG_ROWS 48

/* Room for any peers list of OBD_MAX_NODES entries of the longest host
 * name, with a blank after each comma: a list that does not fit names more
 * nodes than a world can hold. */
#define OBD_PEERS_TEXT_MAX (OBD_MAX_NODES * (OBD_HOST_MAX + 9))

struct obd_addr {
    char host[OBD_HOST_MAX];
    uint16_t port;
};

struct obd_config {
    char cluster[64];
    int64_t rank; /* -1 ("auto") until obd_config_resolve() picks it */
    char peers[OBD_PEERS_TEXT_MAX]; /* "H:P,H:P,...", in rank order */
    char peers_file[4096];
    char listen[OBD_HOST_MAX + 8];
    char socket[108];
    int64_t timeout_ms;
    int64_t segment_bytes;
    int64_t max_buffer_bytes;
    int64_t max_clients;
    int64_t max_jobs;
    int64_t max_jobs_per_uid;
    char owner_identity[8];
    int64_t sock_buf_bytes;
    int64_t connect_backoff_max_ms;
    int64_t keepalive_s;
    int64_t peer_timeout_ms;
    int64_t threads;
    int64_t stall_warn_ms;
    char log_level[8];
    char state_dir[4096];
    char trace_file[4096];
    int64_t ef_max_bytes;
    int64_t retained_sets_max_bytes;
    int64_t retained_sets_max_age_s;
    int64_t state_dir_max_bytes;
    char socket_group[64];
    int64_t max_clients_per_uid;
    int64_t client_join_ms;
    char auth_key_file[4096];
    char allow_insecure[8];
    char wire_protection[16];
    int64_t max_unauth_links;
    int64_t max_unauth_per_addr;
    int64_t max_buffers_per_client;
    int64_t max_buffers_per_uid;
    int64_t max_buffer_bytes_per_uid;
    int64_t max_buffers;

    /* Where each option was set, for messages: src_line[i] is 0 for the
     * default, -1 for a flag, else the line of src_file. */
    char src_file[4096];
    int src_line[OBD_CONFIG_ROWS];

    /* Derived by obd_config_finish() and obd_config_resolve(). */
    struct obd_addr world[OBD_MAX_NODES];
    int nodes;
    struct obd_addr listen_addr; /* port 0: no TCP listener */
    uint64_t fingerprint;        /* of cluster name and world, rank-free */
    int log_level_num;           /* OBD_LOG_* */
    int insecure;                /* allow_insecure is true */
    int wire;                    /* wire_protection as enum obd_wire */
    int owner_by_name;           /* owner_identity is name */
    int resolved;                /* obd_config_resolve() ran */
    int64_t rank_given;          /* rank and threads before it ran */
    int64_t threads_given;
};

/* Sets every option to its default. */
void obd_config_defaults(struct obd_config *cfg);

/* Sets option `name` from text. Integers are decimal; options in
 * milliseconds also take "250ms" and "2s", options in seconds "10s". On
 * failure returns OBD_E_INVAL and writes a message naming the option, the value
 * and the bound into err. */
int obd_config_set(struct obd_config *cfg, const char *name, const char *value,
                   char *err, size_t errlen);

/* Reads "name = value" lines ('#' starts a comment; lines have no length
 * limit) from a regular file. Unknown names, bad values, a name given
 * twice, a file that is not a regular file and unreadable files fail with
 * a message naming file and line. */
int obd_config_load(struct obd_config *cfg, const char *path, char *err,
                    size_t errlen);

/* Parses argv: -c FILE (loaded first, wherever it stands; once at most),
 * then --NAME VALUE / --NAME=VALUE for every option (each once at most),
 * --check-config, --help, --version and --example-config. Flags override
 * the file. *check is set by --check-config; *help is 1 for --help, 2 for
 * --example-config, 3 for --version. */
int obd_config_parse_args(struct obd_config *cfg, int argc, char **argv,
                          int *check, int *help, char *err, size_t errlen);

/* Validates cross-option rules and fills the derived fields, without
 * touching the network: the world from peers or peers_file, the listen
 * address once the rank is known. Messages name the file and line (or the
 * flag) that set the option at fault. */
int obd_config_finish(struct obd_config *cfg, char *err, size_t errlen);

/* What needs the system, after obd_config_finish(): resolves every peers
 * entry and refuses two entries that reach the same node (127.0.0.1:7000
 * and localhost:7000), picks rank "auto" as the one entry that is an
 * address of this machine (and, when listen names a port, has that port),
 * and turns threads 0 into the number of usable cores. With `strict`
 * (--check-config) an entry that does not resolve fails, and every check
 * the start makes of the file system applies, without creating anything:
 * the socket's directory and socket_group (obd_config_socket_dir_ok,
 * obd_config_socket_gid), state_dir (obd_snapset_dir_ok) and the key
 * (obd_auth_key_load: mode, owner, size, readable by this process); a
 * missing socket directory or state_dir passes when it can be created.
 * Without it an unresolvable entry is skipped (its daemon keeps
 * retrying). */
int obd_config_resolve(struct obd_config *cfg, int strict, char *err,
                       size_t errlen);

/* The socket's directory, as the start needs it: created (0755) when
 * missing if `create` is set (*created then says so), else a missing one
 * passes when it can be created; refused when it is not a directory, when
 * another user than this process's or root owns it, or everybody may
 * write it without the sticky bit (whoever may write it can replace the
 * socket). 0, or OBD_E_INVAL with why. ctl.c calls it at the start with
 * `create`,
 * --check-config without. */
int obd_config_socket_dir_ok(const char *socket, int create, char *why,
                             size_t len, int *created);

/* socket_group (a name or a number) as a gid, refused (OBD_E_INVAL with why)
 * when there is no such group or this process may not give a file to it (not
 * root and not a member). */
int obd_config_socket_gid(const char *group, gid_t *gid, char *why, size_t len);

/* Prints the effective configuration in config-file syntax. */
void obd_config_print(const struct obd_config *cfg, FILE *out);

/* Prints every option with its default, bounds and help (for --help and
 * deploy/obcommd.conf.example). As a config file, every option has its
 * commented-out default, and the options cfg got from flags or a file
 * follow it as set lines. */
void obd_config_print_help(FILE *out, int as_config_file,
                           const struct obd_config *cfg);

/* SIGHUP: copies the options that may change while running (log_level)
 * from next into cur and writes "name: old -> new, ..." for each that
 * changed into `changed`. Returns how many changed. */
int obd_config_reload(struct obd_config *cur, const struct obd_config *next,
                      char *changed, size_t len);

/* Names the options that differ between cur and next but apply only at a
 * restart, as "name: old -> new, ..."; returns how many. */
int obd_config_diff_fixed(const struct obd_config *cur,
                          const struct obd_config *next, char *changed,
                          size_t len);

/* Writes option `name`'s value as text into buf; OBD_E_INVAL for an
 * unknown name. */
int obd_config_value(const struct obd_config *cfg, const char *name, char *buf,
                     size_t len);

/* Parses "host:port". */
/* Writes world entry i as "host:port". */
void obd_config_world_entry(const struct obd_config *cfg, int i, char *buf,
                            size_t len);

/* Compares this node's world with a peer's `n` entries (borrowed, as its
 * Hello carries them) and writes the first difference into out ("rank 2
 * is a:7000 here, b:7000 at the peer"). Returns 0 when the lists agree. */
int obd_config_world_diff(const struct obd_config *cfg,
                          const char *const *world, size_t n, char *out,
                          size_t len);

struct sockaddr_storage;

/* 1 when sa is a loopback address: 127.0.0.0/8, ::1, or 127.0.0.0/8
 * mapped into IPv6 (::ffff:127.x.y.z); 0 for anything else. The start
 * uses it to keep a daemon without a cluster key on loopback, and to
 * know the world entries that are this machine. */
int obd_config_is_loopback(const struct sockaddr_storage *sa);

/* Parses "host:port" (decimal port 1..65535). */
int obd_config_parse_addr(const char *text, struct obd_addr *out);

#endif
