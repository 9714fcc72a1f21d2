/* One PeerMsg, the payload of a CTRL frame between daemons (peers.c
 * handle_ctrl): Hello, Refuse or OpAnnounce. */
#include "fuzz.h"
#include "msgs.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_peer_msg(data, size);
    return 0;
}
