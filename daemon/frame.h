/* Frames between daemons: a fixed 48-byte little-endian header, then
 * `len` bytes of payload written straight from memory. Pure functions: no
 * sockets here.
 *
 *   offset size field
 *        0    4 magic "OBCM"
 *        4    1 version (OBCOMM_PROTO_VERSION)
 *        5    1 type (OBD_FRAME_*)
 *        6    2 reserved, zero
 *        8    4 job id (hash of the job name)
 *       12    4 epoch (the sender's link generation)
 *       16    8 sequence number of the op within the job
 *       24    8 op fingerprint (op, dtype, count, key, root)
 *       32    4 step of the algorithm
 *       36    4 segment within the step
 *       40    4 payload length
 *       44    4 reserved, zero
 */
#ifndef OBD_FRAME_H
#define OBD_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define OBD_FRAME_HDR   48
#define OBD_FRAME_MAGIC 0x4d43424fu /* "OBCM" read as little-endian */

enum {
    OBD_FRAME_CTRL = 1, /* payload: a packed PeerMsg */
    OBD_FRAME_DATA = 2, /* payload: tensor bytes of one segment */
};

struct obd_frame {
    uint8_t version;
    uint8_t type;
    uint32_t job;
    uint32_t epoch;
    uint64_t seq;
    uint64_t fingerprint;
    uint32_t step;
    uint32_t segment;
    uint32_t len;
};

void obd_frame_encode(const struct obd_frame *f, uint8_t out[OBD_FRAME_HDR]);

/* Decodes and validates a header: magic, version, type, reserved bytes and
 * the payload bound for its type. Returns 0, OBD_E_VERSION for another
 * frame version, or OBD_E_PROTO; a reason in *why either way. */
int obd_frame_decode(const uint8_t in[OBD_FRAME_HDR], uint32_t max_ctrl,
                     uint32_t max_data, struct obd_frame *f, const char **why);

/* 32-bit id of a job name (FNV-1a folded); names travel in announces too, so
 * a collision is detected, not trusted. */
uint32_t obd_frame_job_id(const char *name);

#endif
