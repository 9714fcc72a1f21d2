/* The protobuf-c messages obcommd accepts, unpacked and checked the way the
 * daemon uses them right after unpacking (ctl.c dispatch, peers.c
 * handle_ctrl). Shared by the fuzz targets and the seed generator. */
#ifndef OBD_FUZZ_MSGS_H
#define OBD_FUZZ_MSGS_H

#include <stddef.h>
#include <stdint.h>

/* Unpacks one ClientMsg body (after its length prefix) and checks it. */
void fuzz_client_msg(const uint8_t *body, size_t len);

/* Unpacks one PeerMsg (the payload of a CTRL frame) and checks it. */
void fuzz_peer_msg(const uint8_t *payload, size_t len);

#endif
