/* The peer byte stream as peers.c reads it: a 48-byte header decoded by
 * obd_frame_decode with the daemon's bounds, then its payload, then the next
 * header. Payloads are skipped here (CTRL payloads are fuzz_peer_msg's).
 * A header that decodes must re-encode to the same 48 bytes and respect
 * the bound of its type; one that does not must say why. */
#include "fuzz.h"

#include <string.h>

#include "frame.h"
#include "wire.h"

/* The smallest segment_bytes the config accepts: the tightest data bound
 * the daemon ever applies. */
#define MAX_DATA 8192

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    while (size >= OBD_FRAME_HDR) {
        struct obd_frame f;
        const char *why = NULL;
        if (obd_frame_decode(data, OBCOMM_WIRE_MAX, MAX_DATA, &f, &why) != 0) {
            FUZZ_CHECK(why != NULL && why[0] != '\0');
            break;
        }
        FUZZ_CHECK(f.version == OBCOMM_PROTO_VERSION);
        if (f.type == OBD_FRAME_CTRL)
            FUZZ_CHECK(f.len > 0 && f.len <= OBCOMM_WIRE_MAX);
        else
            FUZZ_CHECK(f.type == OBD_FRAME_DATA && f.len <= MAX_DATA);
        uint8_t again[OBD_FRAME_HDR];
        obd_frame_encode(&f, again);
        FUZZ_CHECK(memcmp(again, data, OBD_FRAME_HDR) == 0);

        data += OBD_FRAME_HDR;
        size -= OBD_FRAME_HDR;
        if (f.len > size)
            break; /* the daemon would wait for the rest */
        data += f.len;
        size -= f.len;
    }
    return 0;
}
