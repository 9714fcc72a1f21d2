#include "wire.h"

#include <stdlib.h>

uint8_t *obcomm_wire_pack(const ProtobufCMessage *msg, size_t *len)
{
    size_t body = protobuf_c_message_get_packed_size(msg);
    if (body > OBCOMM_WIRE_MAX)
        return NULL;

    uint8_t *buf = malloc(OBCOMM_WIRE_PREFIX + body);
    if (buf == NULL)
        return NULL;
    buf[0] = (uint8_t)body;
    buf[1] = (uint8_t)(body >> 8);
    buf[2] = (uint8_t)(body >> 16);
    buf[3] = (uint8_t)(body >> 24);
    protobuf_c_message_pack(msg, buf + OBCOMM_WIRE_PREFIX);
    *len = OBCOMM_WIRE_PREFIX + body;
    return buf;
}
