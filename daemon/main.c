/* obcommd: parses flags and the config file, then runs the daemon core. */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "daemon.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: obcommd [-c FILE] [--rank R] [--peers H:P,H:P,...] "
                 "[--listen H:P]\n"
                 "               [--socket PATH] [--check-config] "
                 "[--OPTION VALUE ...] [--example-config]\n\n"
                 "options (also valid as 'name = value' lines in FILE):\n");
    obd_config_print_help(out, 0);
}

int main(int argc, char **argv)
{
    struct obd_config cfg;
    char err[512];
    int check = 0, help = 0;

    obd_config_defaults(&cfg);
    if (obd_config_parse_args(&cfg, argc, argv, &check, &help, err,
                              sizeof(err))) {
        fprintf(stderr, "obcommd: %s\n", err);
        return 2;
    }
    if (help == 2) {
        printf("# obcommd configuration: 'name = value' lines. Every option "
               "is shown with\n# its default; flags (--name value) override "
               "the file.\n\n");
        obd_config_print_help(stdout, 1);
        return 0;
    }
    if (help) {
        usage(stdout);
        return 0;
    }
    if (obd_config_finish(&cfg, err, sizeof(err))) {
        fprintf(stderr, "obcommd: invalid configuration: %s\n", err);
        return 2;
    }
    if (check) {
        obd_config_print(&cfg, stdout);
        printf("# ok: %d node(s), this is rank %lld\n", cfg.nodes,
               (long long)cfg.rank);
        return 0;
    }

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
