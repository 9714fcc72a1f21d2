/* What every fuzz target here shares: the libFuzzer entry point, a check
 * that turns a broken invariant into a crash the fuzzer records, and a
 * memory file for code that reads from a file. Each fuzz_<name>.c defines
 * LLVMFuzzerTestOneInput; it is linked either with libFuzzer (deploy/fuzz.sh)
 * or with replay.c, which feeds it the seed corpus (meson test). */
#ifndef OBD_FUZZ_H
#define OBD_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An invariant of the code under test; failing it aborts, which both
 * libFuzzer and the replay driver report with the input that did it. */
#define FUZZ_CHECK(cond)                                               \
    do {                                                               \
        if (!(cond)) {                                                 \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, \
                    __LINE__, #cond);                                  \
            abort();                                                   \
        }                                                              \
    } while (0)

/* Replaces the content of a process-wide memory file with data and returns
 * its fd, rewound to 0 (owned by this module, never closed); -1 on error. */
int fuzz_memfile(const uint8_t *data, size_t size);

/* The world of the node that reads snapshots in fuzz_efstate. */
#define FUZZ_EF_NODES       2
#define FUZZ_EF_RANK        1
#define FUZZ_EF_FINGERPRINT UINT64_C(0x0123456789abcdef)

#endif
