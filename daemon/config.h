/* obcommd's configuration: one table of options, read from a file and from
 * command-line flags. The parser, --check-config, --help and the example
 * config in deploy/ all come from the same table (config.c). */
#ifndef OBD_CONFIG_H
#define OBD_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define OBD_MAX_NODES 256
#define OBD_HOST_MAX  64

struct obd_addr {
    char host[OBD_HOST_MAX];
    uint16_t port;
};

struct obd_config {
    char cluster[64];
    int64_t rank;
    char peers[4096]; /* "H:P,H:P,...", the world in rank order */
    char listen[OBD_HOST_MAX + 8];
    char socket[108];
    int64_t timeout_ms;
    int64_t segment_bytes;
    int64_t max_buffer_bytes;
    int64_t max_clients;
    int64_t max_jobs;
    int64_t sock_buf_bytes;
    int64_t connect_backoff_max_ms;
    int64_t keepalive_s;
    int64_t threads;
    char log_level[8];
    char state_dir[4096];
    int64_t ef_max_bytes;
    int64_t ef_idle_ms;
    char auth_key_file[4096];
    char allow_insecure[8];
    char wire_protection[16];
    int64_t max_unauth_links;
    int64_t max_unauth_per_addr;

    /* Derived by obd_config_finish(). */
    struct obd_addr world[OBD_MAX_NODES];
    int nodes;
    struct obd_addr listen_addr; /* port 0: no TCP listener */
    uint64_t fingerprint;        /* of cluster name and world, rank-free */
    int log_level_num;           /* OBD_LOG_* */
    int insecure;                /* allow_insecure is true */
    int wire;                    /* wire_protection as enum obd_wire */
};

/* Sets every option to its default. */
void obd_config_defaults(struct obd_config *cfg);

/* Sets option `name` from text. On failure returns -1 and writes a message
 * naming the option, the value and the bound into err. */
int obd_config_set(struct obd_config *cfg, const char *name, const char *value,
                   char *err, size_t errlen);

/* Reads "name = value" lines ('#' starts a comment). Unknown names, bad
 * values and unreadable files fail with a message naming file and line. */
int obd_config_load(struct obd_config *cfg, const char *path, char *err,
                    size_t errlen);

/* Parses argv: -c FILE (loaded first, wherever it stands), then
 * --NAME VALUE / --NAME=VALUE for every option, --check-config, --help
 * and --example-config. Flags override the file. *check is set by
 * --check-config; *help is 1 for --help, 2 for --example-config. */
int obd_config_parse_args(struct obd_config *cfg, int argc, char **argv,
                          int *check, int *help, char *err, size_t errlen);

/* Validates cross-option rules and fills the derived fields. */
int obd_config_finish(struct obd_config *cfg, char *err, size_t errlen);

/* Prints the effective configuration in config-file syntax. */
void obd_config_print(const struct obd_config *cfg, FILE *out);

/* Prints every option with its default, bounds and help (for --help and
 * deploy/obcommd.conf.example). */
void obd_config_print_help(FILE *out, int as_config_file);

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

/* Writes option `name`'s value as text into buf; -1 for an unknown name. */
int obd_config_value(const struct obd_config *cfg, const char *name, char *buf,
                     size_t len);

/* Parses "host:port". */
int obd_config_parse_addr(const char *text, struct obd_addr *out);

#endif
