/* obcommd: parses flags and the config file, then runs the daemon core. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <obcomm_build.h>
#include <uv.h>

#include "codec.h"
#include "config.h"
#include "daemon.h"
#include "err.h"
#include "wire.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: obcommd [-c FILE] [--rank R] [--peers H:P,H:P,...] "
                 "[--listen H:P]\n"
                 "               [--socket PATH] [--check-config] "
                 "[--OPTION VALUE ...]\n"
                 "               [--example-config] [--version]\n\n"
                 "options (also valid as 'name = value' lines in FILE):\n");
    obd_config_print_help(out, 0, NULL);
}

static void nothing(uv_work_t *req)
{
    (void)req;
}

/* Starts libuv's worker pool now, on a loop of its own: the pool is one
 * per process, so the daemon's loop finds it running with `threads`
 * workers, and a failure to create them shows at start, not in the middle
 * of the first op. 0, or OBD_E_SYS with libuv's reason on stderr. */
static int start_pool(long long threads)
{
    uv_loop_t loop;
    uv_work_t req;
    int rc = uv_loop_init(&loop);
    if (rc == 0) {
        rc = uv_queue_work(&loop, &req, nothing, NULL);
        if (rc == 0)
            rc = uv_run(&loop, UV_RUN_DEFAULT);
        int close_rc = uv_loop_close(&loop);
        rc = rc ? rc : close_rc;
    }
    if (rc == 0)
        return 0;
    fprintf(stderr, "obcommd: starting %lld worker threads: %s\n", threads,
            uv_strerror(rc));
    return OBD_E_SYS;
}

static void version(void)
{
    printf("obcommd %s\n"
           "protocol %d\n"
           "codec %s (built: %s)\n"
           "libuv %s\n"
           "build %s\n",
           OBCOMM_VERSION, OBCOMM_PROTO_VERSION, obd_codec_best()->name,
           OBCOMM_BUILD_CODECS, uv_version_string(), OBCOMM_BUILD_OPTIONS);
}

int main(int argc, char **argv)
{
    struct obd_config cfg;
    char err[8192];
    int check = 0, help = 0;

    obd_config_defaults(&cfg);
    if (obd_config_parse_args(&cfg, argc, argv, &check, &help, err,
                              sizeof(err))) {
        fprintf(stderr, "obcommd: %s\n", err);
        return 2;
    }
    if (help == 3) {
        version();
        return 0;
    }
    if (help == 2) {
        printf("# obcommd configuration: 'name = value' lines. Every option "
               "is shown with\n# its default; flags (--name value) override "
               "the file.\n\n");
        obd_config_print_help(stdout, 1, &cfg);
        return 0;
    }
    if (help) {
        usage(stdout);
        return 0;
    }
    if (obd_config_finish(&cfg, err, sizeof(err)) ||
        obd_config_resolve(&cfg, check, err, sizeof(err))) {
        fprintf(stderr, "obcommd: invalid configuration: %s\n", err);
        return 2;
    }
    if (check) {
        obd_config_print(&cfg, stdout);
        printf("# ok: %d node(s), this is rank %lld\n", cfg.nodes,
               (long long)cfg.rank);
        return 0;
    }

    /* libuv sizes its worker pool from UV_THREADPOOL_SIZE when the pool
     * first starts, which is the first uv_queue_work (or uv_getaddrinfo,
     * uv_fs_*) of the process: setting it here, before the loop exists,
     * makes `threads` the pool's size. */
    char pool[16];
    snprintf(pool, sizeof(pool), "%lld", (long long)cfg.threads);
    if (setenv("UV_THREADPOOL_SIZE", pool, 1) != 0) {
        perror("obcommd: setenv UV_THREADPOOL_SIZE");
        return 1;
    }
    if (start_pool((long long)cfg.threads) != 0)
        return 1;

    struct obd_daemon d;
    int rc = obd_daemon_init(&d, &cfg);
    obd_daemon_set_args(&d, argc, argv);
    if (rc == 0)
        rc = obd_daemon_start(&d);
    if (rc == 0)
        obd_daemon_run(&d);
    obd_daemon_fini(&d);
    return rc == 0 ? 0 : 1;
}
