/* A config file as obcommd -c reads it (obd_config_load from a memory
 * file), then obd_config_finish. A config that loads must print
 * (obd_config_print) as text that loads again into the same options. */
#include "fuzz.h"

#include <stdio.h>
#include <string.h>

#include "config.h"

static int load(const uint8_t *data, size_t size, struct obd_config *cfg,
                char *err, size_t errlen)
{
    int fd = fuzz_memfile(data, size);
    FUZZ_CHECK(fd >= 0);
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    obd_config_defaults(cfg);
    int rc = obd_config_load(cfg, path, err, errlen);
    FUZZ_CHECK(rc == 0 || rc == -1);
    if (rc != 0)
        FUZZ_CHECK(err[0] != '\0' && strlen(err) < errlen);
    return rc;
}

/* The config in config-file syntax; caller frees. */
static char *print(const struct obd_config *cfg, size_t *len)
{
    char *text = NULL;
    FILE *out = open_memstream(&text, len);
    FUZZ_CHECK(out != NULL);
    obd_config_print(cfg, out);
    FUZZ_CHECK(fclose(out) == 0);
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct obd_config cfg, again;
    char err[512] = "";
    if (load(data, size, &cfg, err, sizeof(err)) != 0)
        return 0;

    size_t len, len2;
    char *text = print(&cfg, &len);
    if (load((const uint8_t *)text, len, &again, err, sizeof(err)) != 0) {
        fprintf(stderr, "printed config does not load: %s\n%s", err, text);
        FUZZ_CHECK(0);
    }
    char *text2 = print(&again, &len2);
    FUZZ_CHECK(len == len2 && memcmp(text, text2, len) == 0);
    free(text);
    free(text2);

    int rc = obd_config_finish(&cfg, err, sizeof(err));
    FUZZ_CHECK(rc == 0 || rc == -1);
    FUZZ_CHECK(obd_config_finish(&again, err, sizeof(err)) == rc);
    if (rc != 0)
        return 0;
    FUZZ_CHECK(cfg.nodes >= 1 && cfg.nodes <= OBD_MAX_NODES);
    /* rank auto (-1) is resolved later, by obd_config_resolve against
     * this machine's addresses, which a fuzz target does not look up. */
    FUZZ_CHECK(cfg.rank == -1 || (cfg.rank >= 0 && cfg.rank < cfg.nodes));
    FUZZ_CHECK(again.nodes == cfg.nodes && again.rank == cfg.rank);
    FUZZ_CHECK(again.fingerprint == cfg.fingerprint);
    FUZZ_CHECK(strcmp(again.listen_addr.host, cfg.listen_addr.host) == 0 &&
               again.listen_addr.port == cfg.listen_addr.port);
    return 0;
}
