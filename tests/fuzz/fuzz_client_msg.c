/* The Unix-socket stream as ctl.c read_client sees it: a 4-byte
 * little-endian length, checked against OBCOMM_WIRE_MAX before anything is
 * allocated, then a ClientMsg of that length (Join, RegisterBuffer,
 * ReleaseBuffer, Submit, StatusRequest); then the next message. */
#include "fuzz.h"
#include "msgs.h"

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    while (size >= OBCOMM_WIRE_PREFIX) {
        size_t body = obcomm_wire_len(data);
        if (body == 0 || body > OBCOMM_WIRE_MAX)
            break; /* read_client drops the client */
        data += OBCOMM_WIRE_PREFIX;
        size -= OBCOMM_WIRE_PREFIX;
        if (body > size)
            break; /* the daemon would wait for the rest */
        fuzz_client_msg(data, body);
        data += body;
        size -= body;
    }
    return 0;
}
