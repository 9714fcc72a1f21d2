#include "frame.h"

#include <string.h>

#include "err.h"
#include "hash.h"
#include "wire.h"

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

void obd_frame_encode(const struct obd_frame *f, uint8_t out[OBD_FRAME_HDR])
{
    memset(out, 0, OBD_FRAME_HDR);
    put32(out, OBD_FRAME_MAGIC);
    out[4] = f->version;
    out[5] = f->type;
    put32(out + 8, f->job);
    put32(out + 12, f->epoch);
    put64(out + 16, f->seq);
    put64(out + 24, f->fingerprint);
    put32(out + 32, f->step);
    put32(out + 36, f->segment);
    put32(out + 40, f->len);
}

int obd_frame_decode(const uint8_t in[OBD_FRAME_HDR], uint32_t max_ctrl,
                     uint32_t max_data, struct obd_frame *f, const char **why)
{
    if (get32(in) != OBD_FRAME_MAGIC) {
        *why = "bad magic";
        return OBD_E_PROTO;
    }
    if (in[4] != OBCOMM_PROTO_VERSION) {
        *why = "unsupported frame version";
        return OBD_E_VERSION;
    }
    if (in[6] != 0 || in[7] != 0 || get32(in + 44) != 0) {
        *why = "reserved header bytes are not zero";
        return OBD_E_PROTO;
    }
    f->version = in[4];
    f->type = in[5];
    f->job = get32(in + 8);
    f->epoch = get32(in + 12);
    f->seq = get64(in + 16);
    f->fingerprint = get64(in + 24);
    f->step = get32(in + 32);
    f->segment = get32(in + 36);
    f->len = get32(in + 40);

    switch (f->type) {
    case OBD_FRAME_CTRL:
        if (f->len == 0 || f->len > max_ctrl) {
            *why = "control payload length out of bounds";
            return OBD_E_PROTO;
        }
        return 0;
    case OBD_FRAME_DATA:
        if (f->len > max_data) {
            *why = "data payload longer than a segment";
            return OBD_E_PROTO;
        }
        return 0;
    default:
        *why = "unknown frame type";
        return OBD_E_PROTO;
    }
}

uint32_t obd_frame_job_id(const char *name)
{
    uint64_t h = obcomm_hash_fnv1a_str(OBCOMM_HASH_FNV1A_INIT, name);
    return (uint32_t)(h ^ (h >> 32));
}
