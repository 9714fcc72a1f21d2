/* A snapshot of 1-bit error feedback as obcommd reads it at start
 * (obd_ef_read_fd, the code path of obd_ef_read). The first input byte
 * picks what the rest is:
 *   0: the file itself (LZ4 frame and all);
 *   1: the decompressed content, which this target wraps in an LZ4 frame
 *      with block and content checksums as obd_ef_write does, so that the
 *      fuzzer reaches the header checks behind the checksums.
 * The world of this node is fixed (FUZZ_EF_*); gen_corpus.c writes seeds of
 * it and of another world. */
#include "fuzz.h"

#include <lz4frame.h>
#include <string.h>

#include "codec.h"
#include "efstate.h"

/* Reads allocate at most 1.5 x this (both error buffers). */
#define MAX_BYTES (UINT64_C(4) << 20)
/* sizeof(struct ef_hdr) in efstate.c. */
#define EF_HDR_BYTES 136

static const struct obd_ef_world world = {
    .nodes = FUZZ_EF_NODES,
    .rank = FUZZ_EF_RANK,
    .fingerprint = FUZZ_EF_FINGERPRINT,
};

/* A snapshot that loads is one LZ4 frame with a content checksum and
 * nothing after it, and holds exactly the header and both buffers. */
static void check_one_frame(const uint8_t *data, size_t size,
                            const struct obd_ef *ef)
{
    size_t want = EF_HDR_BYTES +
                  (ef->padded + ef->padded / (size_t)ef->nodes) * sizeof(float);
    uint8_t *out = malloc(want + 1);
    LZ4F_dctx *dctx = NULL;
    FUZZ_CHECK(out != NULL && !LZ4F_isError(LZ4F_createDecompressionContext(
                                  &dctx, LZ4F_VERSION)));
    LZ4F_frameInfo_t fi;
    size_t hlen = size;
    FUZZ_CHECK(!LZ4F_isError(LZ4F_getFrameInfo(dctx, &fi, data, &hlen)));
    FUZZ_CHECK(fi.contentChecksumFlag == LZ4F_contentChecksumEnabled);
    size_t src = size - hlen, dst = want + 1;
    FUZZ_CHECK(LZ4F_decompress(dctx, out, &dst, data + hlen, &src, NULL) == 0);
    FUZZ_CHECK(src == size - hlen && dst == want);
    LZ4F_freeDecompressionContext(dctx);
    free(out);
}

static void read_file(const uint8_t *data, size_t size)
{
    int fd = fuzz_memfile(data, size);
    FUZZ_CHECK(fd >= 0);
    struct obd_ef *ef = NULL;
    char why[512] = "";
    int rc = obd_ef_read_fd(fd, "snapshot", &world, NULL, MAX_BYTES, &ef, NULL,
                            why, sizeof(why));
    if (rc != 0) {
        FUZZ_CHECK(rc == OBD_E_CORRUPT || rc == OBD_E_OTHER_WORLD);
        FUZZ_CHECK(ef == NULL && why[0] != '\0');
        return;
    }
    FUZZ_CHECK(ef != NULL);
    check_one_frame(data, size, ef);
    FUZZ_CHECK(ef->nodes == (int)world.nodes);
    FUZZ_CHECK(ef->padded == obd_codec_padded_len(ef->count, ef->nodes));
    FUZZ_CHECK(ef->padded <= MAX_BYTES / 4);
    FUZZ_CHECK(strlen(ef->job) < OBD_EF_JOB_MAX);
    /* Reading every element lets ASan check both buffers' sizes. */
    volatile float sum = 0;
    for (size_t i = 0; i < ef->padded; i++)
        sum += ef->werr[i];
    for (size_t i = 0; i < ef->padded / (size_t)ef->nodes; i++)
        sum += ef->serr[i];
    (void)sum;
    obd_ef_free(ef);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (data[0] == 0) {
        read_file(data + 1, size - 1);
        return 0;
    }
    if (data[0] != 1)
        return 0;

    LZ4F_preferences_t prefs;
    memset(&prefs, 0, sizeof(prefs));
    prefs.frameInfo.contentChecksumFlag = LZ4F_contentChecksumEnabled;
    prefs.frameInfo.blockChecksumFlag = LZ4F_blockChecksumEnabled;
    prefs.frameInfo.contentSize = size - 1;
    size_t cap = LZ4F_compressFrameBound(size - 1, &prefs);
    uint8_t *frame = malloc(cap);
    FUZZ_CHECK(frame != NULL);
    size_t n = LZ4F_compressFrame(frame, cap, data + 1, size - 1, &prefs);
    FUZZ_CHECK(!LZ4F_isError(n));
    read_file(frame, n);
    free(frame);
    return 0;
}
