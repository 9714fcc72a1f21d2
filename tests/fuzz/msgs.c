#include "msgs.h"

#include "fuzz.h"

#include <obcomm.h>

#include <stdlib.h>
#include <string.h>

#include "job.h"
#include "ops.h"
#include "reduce.h"
#include "wire.h"

/* Every string the daemon reads from a message (strcmp, strlen, "%s") must
 * be there and end within its allocation; reading all of it lets ASan see
 * an overrun. */
static void check_string(const char *s)
{
    FUZZ_CHECK(s != NULL);
    volatile size_t n = strlen(s);
    (void)n;
}

/* pack(unpack(x)) must unpack again and pack to the same bytes: the daemon
 * answers with messages built from fields it was sent. Unknown fields are
 * kept and packed back as they came, and protobuf-c accepts some on unpack
 * that it refuses in their shortest form (field number 0 behind a tag of
 * more than one byte), so a message that carries any is only required to
 * pack. `body` is the member of the oneof, or NULL. */
static void check_repack(const ProtobufCMessage *m,
                         const ProtobufCMessage *body)
{
    FUZZ_CHECK(protobuf_c_message_check(m));
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *a = malloc(len ? len : 1);
    FUZZ_CHECK(a != NULL);
    FUZZ_CHECK(protobuf_c_message_pack(m, a) == len);
    ProtobufCMessage *again =
        protobuf_c_message_unpack(m->descriptor, NULL, len, a);
    if (again == NULL && (m->n_unknown_fields > 0 ||
                          (body != NULL && body->n_unknown_fields > 0))) {
        free(a);
        return;
    }
    FUZZ_CHECK(again != NULL);
    size_t len2 = protobuf_c_message_get_packed_size(again);
    FUZZ_CHECK(len2 == len);
    uint8_t *b = malloc(len2 ? len2 : 1);
    FUZZ_CHECK(b != NULL);
    FUZZ_CHECK(protobuf_c_message_pack(again, b) == len2);
    FUZZ_CHECK(memcmp(a, b, len) == 0);
    protobuf_c_message_free_unpacked(again, NULL);
    free(a);
    free(b);
}

/* The predicates handle_submit checks a Submit's values with, before it
 * casts them to enums: they must agree with each other for every value off
 * the wire. The count bound divides by obd_dtype_size, so a dtype that
 * passes obd_dtype_valid must have a non-zero size (and accumulator size);
 * exactly the valid dtypes and redops have names. */
static void check_submit(const Obcomm__Submit *s)
{
    int dt_ok = obd_dtype_valid((int)s->dtype);
    obcomm_dtype_t dt = (obcomm_dtype_t)s->dtype;
    size_t dt_size = obd_dtype_size(dt);
    FUZZ_CHECK(dt_ok ? dt_size > 0 : dt_size == 0);
    FUZZ_CHECK(dt_ok ? obd_dtype_acc_size(dt) >= dt_size
                     : obd_dtype_acc_size(dt) == 0);
    FUZZ_CHECK(dt_ok == (strcmp(obd_dtype_name(dt), "invalid") != 0));
    int op_ok = obd_op_valid((int)s->redop);
    FUZZ_CHECK(op_ok ==
               (strcmp(obd_op_name((obcomm_op_t)s->redop), "invalid") != 0));
    if (s->kind == OBCOMM_KIND_ALLREDUCE && dt_ok && op_ok && s->count != 0 &&
        s->count <= UINT64_MAX / dt_size) {
        uint64_t bytes = s->count * dt_size;
        FUZZ_CHECK(bytes / dt_size == s->count);
    }
}

static const ProtobufCMessage *client_body(const Obcomm__ClientMsg *m)
{
    switch (m->body_case) {
    case OBCOMM__CLIENT_MSG__BODY_JOIN:
        return &m->join->base;
    case OBCOMM__CLIENT_MSG__BODY_REGISTER:
        return &m->register_->base;
    case OBCOMM__CLIENT_MSG__BODY_RELEASE:
        return &m->release->base;
    case OBCOMM__CLIENT_MSG__BODY_SUBMIT:
        return &m->submit->base;
    case OBCOMM__CLIENT_MSG__BODY_STATUS:
        return &m->status->base;
    default:
        return NULL;
    }
}

void fuzz_client_msg(const uint8_t *body, size_t len)
{
    Obcomm__ClientMsg *m = obcomm__client_msg__unpack(NULL, len, body);
    if (m == NULL)
        return; /* ctl.c drops the client */
    switch (m->body_case) {
    case OBCOMM__CLIENT_MSG__BODY_JOIN:
        FUZZ_CHECK(m->join != NULL);
        check_string(m->join->job);
        break;
    case OBCOMM__CLIENT_MSG__BODY_REGISTER:
        FUZZ_CHECK(m->register_ != NULL);
        break;
    case OBCOMM__CLIENT_MSG__BODY_RELEASE:
        FUZZ_CHECK(m->release != NULL);
        break;
    case OBCOMM__CLIENT_MSG__BODY_SUBMIT:
        FUZZ_CHECK(m->submit != NULL);
        check_submit(m->submit);
        break;
    case OBCOMM__CLIENT_MSG__BODY_STATUS:
        FUZZ_CHECK(m->status != NULL);
        break;
    default:
        FUZZ_CHECK(m->body_case == OBCOMM__CLIENT_MSG__BODY__NOT_SET);
        break;
    }
    check_repack(&m->base, client_body(m));
    obcomm__client_msg__free_unpacked(m, NULL);
}

/* handle_announce's checks and copy into a struct obd_announce. */
static void check_announce(const Obcomm__OpAnnounce *m)
{
    check_string(m->job);
    check_string(m->message);
    if (strlen(m->job) >= OBD_JOB_NAME)
        return; /* peers.c closes the link */
    struct obd_announce a = {.have = 1, .status = m->status};
    snprintf(a.message, sizeof(a.message), "%s", m->message);
    FUZZ_CHECK(strlen(a.message) < sizeof(a.message));
}

static const ProtobufCMessage *peer_body(const Obcomm__PeerMsg *m)
{
    switch (m->body_case) {
    case OBCOMM__PEER_MSG__BODY_HELLO:
        return &m->hello->base;
    case OBCOMM__PEER_MSG__BODY_REFUSE:
        return &m->refuse->base;
    case OBCOMM__PEER_MSG__BODY_ANNOUNCE:
        return &m->announce->base;
    default:
        return NULL;
    }
}

void fuzz_peer_msg(const uint8_t *payload, size_t len)
{
    Obcomm__PeerMsg *m = obcomm__peer_msg__unpack(NULL, len, payload);
    if (m == NULL)
        return; /* peers.c closes the link */
    switch (m->body_case) {
    case OBCOMM__PEER_MSG__BODY_HELLO:
        FUZZ_CHECK(m->hello != NULL);
        check_string(m->hello->cluster);
        break;
    case OBCOMM__PEER_MSG__BODY_REFUSE:
        FUZZ_CHECK(m->refuse != NULL);
        check_string(m->refuse->reason);
        break;
    case OBCOMM__PEER_MSG__BODY_ANNOUNCE:
        FUZZ_CHECK(m->announce != NULL);
        check_announce(m->announce);
        break;
    default:
        FUZZ_CHECK(m->body_case == OBCOMM__PEER_MSG__BODY__NOT_SET);
        break;
    }
    check_repack(&m->base, peer_body(m));
    obcomm__peer_msg__free_unpacked(m, NULL);
}
