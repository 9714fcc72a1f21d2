/* bench_wire: what wire_protection costs per byte on this machine, as
 * ratios to a memcpy of the same buffer timed in the same run (so a shared,
 * loaded machine still gives comparable figures).
 *
 *   bench_wire [-n BYTES] [-r REPEATS]
 *
 * Per frame of BYTES (default 1 MiB, obcommd's default segment), median of
 * REPEATS (default 51): the sender's integrity tag (obd_auth_mac over the
 * payload), the sender's encryption into a send buffer (obd_auth_encrypt),
 * and the receiver's tag check plus in-place decryption. One loop thread
 * does this work in obcommd, so 1 / (ms per MiB) is the rate one node can
 * protect. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum { OP_MEMCPY, OP_TAG, OP_ENCRYPT, OP_DECRYPT, NOPS };
static const char *names[NOPS] = {"memcpy", "integrity: tag",
                                  "encrypt: encrypt into buffer",
                                  "encrypt: check tag + decrypt in place"};

int main(int argc, char **argv)
{
    size_t n = 1 << 20;
    int repeats = 51, opt;
    while ((opt = getopt(argc, argv, "n:r:")) != -1) {
        if (opt == 'n')
            n = strtoull(optarg, NULL, 0);
        else if (opt == 'r')
            repeats = atoi(optarg);
        else {
            fprintf(stderr, "usage: %s [-n BYTES] [-r REPEATS]\n", argv[0]);
            return 2;
        }
    }
    if (obd_auth_init() != 0 || repeats < 1 || n == 0)
        return 1;
    uint8_t *src = malloc(n), *dst = malloc(n), key[OBD_AUTH_KEY], hdr[48];
    uint8_t tag[OBD_AUTH_TAG];
    double *t = malloc(sizeof(double) * (size_t)repeats);
    if (src == NULL || dst == NULL || t == NULL)
        return 1;
    obd_auth_random(key, sizeof(key));
    obd_auth_random(hdr, sizeof(hdr));
    for (size_t i = 0; i < n; i++)
        src[i] = (uint8_t)(i * 2654435761u >> 13);
    memcpy(dst, src, n);

    double median[NOPS];
    for (int op = 0; op < NOPS; op++) {
        for (int r = 0; r < repeats; r++) {
            struct obd_auth_mac m;
            if (op == OP_DECRYPT) /* a fresh ciphertext to check */
                obd_auth_encrypt(key, (uint64_t)r, hdr, 48, src, n, dst, tag);
            double t0 = now_ms();
            switch (op) {
            case OP_MEMCPY:
                memcpy(dst, src, n);
                break;
            case OP_TAG:
                obd_auth_mac_begin(&m, key, (uint64_t)r, hdr, 48, 0);
                obd_auth_mac_update(&m, src, n);
                obd_auth_mac_final(&m, tag);
                break;
            case OP_ENCRYPT:
                obd_auth_encrypt(key, (uint64_t)r, hdr, 48, src, n, dst, tag);
                break;
            case OP_DECRYPT:
                obd_auth_mac_begin(&m, key, (uint64_t)r, hdr, 48, 1);
                obd_auth_mac_update(&m, dst, n);
                if (obd_auth_mac_check(&m, tag) != 0) {
                    fprintf(stderr, "bench_wire: tag check failed\n");
                    return 1;
                }
                obd_auth_decrypt(key, (uint64_t)r, dst, n);
                break;
            }
            t[r] = now_ms() - t0;
        }
        qsort(t, (size_t)repeats, sizeof(double), cmp);
        median[op] = t[repeats / 2];
    }
    if (memcmp(dst, src, n) != 0) {
        fprintf(stderr, "bench_wire: decryption did not restore the input\n");
        return 1;
    }
    printf("| step | ms per %zu bytes | GB/s | ratio to memcpy |\n", n);
    printf("| --- | ---: | ---: | ---: |\n");
    for (int op = 0; op < NOPS; op++)
        printf("| %s | %.3f | %.2f | %.2f |\n", names[op], median[op],
               (double)n / median[op] / 1e6, median[op] / median[OP_MEMCPY]);
    free(src);
    free(dst);
    free(t);
    return 0;
}
