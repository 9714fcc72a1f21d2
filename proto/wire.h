/* Length-prefixed protobuf-c messages, shared by obcommd, libobcomm and
 * obcommctl: a 4-byte little-endian body length, then the packed message.
 * Every length is checked against OBCOMM_WIRE_MAX before anything is
 * allocated. */
#ifndef OBCOMM_WIRE_H
#define OBCOMM_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "obcomm.pb-c.h"

/* Bytes of the length prefix and the largest body accepted. */
#define OBCOMM_WIRE_PREFIX 4
#define OBCOMM_WIRE_MAX    (256 * 1024)

/* Protocol version of the control messages and data frames. 8: every
 * announce, report and JobLeft carries its sender's run of the job, and
 * every announce the job's owner on its sender (owner_uid, owner_by_name,
 * owner_name), which every node compares; a node without them would let
 * another user's trainers into a job or a new run wait for an old one. */
#define OBCOMM_PROTO_VERSION 8

/* Packs `msg` behind its length prefix into a malloc'd buffer; the caller
 * frees it with free(). Returns NULL when out of memory or when the message
 * is larger than OBCOMM_WIRE_MAX. */
uint8_t *obcomm_wire_pack(const ProtobufCMessage *msg, size_t *len);

/* Reads a length prefix. */
static inline uint32_t obcomm_wire_len(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

#endif
