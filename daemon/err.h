/* The daemon's one error type.
 *
 * Every daemon function that can fail returns 0 or a negative OBD_E_*
 * code, whatever its layer: the codec kernels, the config parser, a
 * snapshot read, a socket. OBD_ERR_MAP lists each code once, with what it
 * means and the public code (include/obcomm.h) a client or a peer receives
 * for it; obd_err_public and obd_err_from_public are the only crossings
 * between the two, at the wire (Complete, JoinReply, RegisterReply,
 * OpAnnounce). Several internal codes may share a public one ("too big"
 * and "out of memory" are both OBCOMM_E_NOMEM to a trainer): a code that
 * comes back from a peer is the first internal code of its public one.
 *
 * An errno or a libuv code is not an obd error: it is logged, with its
 * text, where the call failed, and the function returns the OBD_E_* code
 * that says what failed (OBD_E_SYS for a socket or a thread, OBD_E_IO for
 * a file). Like libuv's UV_ERRNO_MAP, the table is an X-macro, so the
 * enum, the names, the texts and the mapping cannot drift apart. */
#ifndef OBD_ERR_H
#define OBD_ERR_H

#include <obcomm.h>

/* XX(name, public code, text) */
#define OBD_ERR_MAP(XX)                                                        \
    XX(INVAL, OBCOMM_E_INVAL, "invalid argument")                              \
    XX(MISMATCH, OBCOMM_E_MISMATCH, "ranks issued different ops")              \
    XX(TIMEOUT, OBCOMM_E_TIMEOUT, "deadline passed")                           \
    XX(PEER_LOST, OBCOMM_E_PEER_LOST, "a node or trainer of the job vanished") \
    XX(PROTO, OBCOMM_E_PROTO, "malformed or unexpected message")               \
    XX(NOMEM, OBCOMM_E_NOMEM, "out of memory")                                 \
    XX(TOOBIG, OBCOMM_E_NOMEM, "over a bound")                                 \
    XX(VERSION, OBCOMM_E_VERSION, "protocol versions differ")                  \
    XX(NONFINITE, OBCOMM_E_NONFINITE, "NaN or Inf in a 1-bit allreduce")       \
    XX(BUSY, OBCOMM_E_BUSY, "local rank taken, or a job bound")                \
    XX(EXISTS, OBCOMM_E_BUSY, "name already in use")                           \
    XX(NOTREG, OBCOMM_E_NOTREG, "data not inside a registered buffer")         \
    XX(STATE, OBCOMM_E_STATE, "1-bit state disagrees")                         \
    XX(MISSING, OBCOMM_E_STATE, "no 1-bit snapshot of that id")                \
    XX(OTHER_WORLD, OBCOMM_E_STATE, "1-bit state of another world")            \
    XX(IO, OBCOMM_E_IO, "a file could not be read or written")                 \
    XX(CORRUPT, OBCOMM_E_CORRUPT, "a file is damaged or of another kind")      \
    XX(DENIED, OBCOMM_E_DENIED, "the job belongs to another user")             \
    XX(SYS, OBCOMM_E_IO, "a system call failed")

enum obd_err_index {
#define XX(name, pub, text) OBD_ERR_INDEX_##name,
    OBD_ERR_MAP(XX)
#undef XX
        OBD_ERR_COUNT
};

/* -1, -2, ...: apart from the public codes (-1000...), so that a code
 * which skipped obd_err_public is caught, not passed on. */
enum obd_err {
#define XX(name, pub, text) OBD_E_##name = -1 - OBD_ERR_INDEX_##name,
    OBD_ERR_MAP(XX)
#undef XX
};

/* The public code for err (0 for 0). A value that is not an OBD_E_* code
 * is a bug: it maps to OBCOMM_E_PROTO. */
int obd_err_public(int err);
/* The OBD_E_* code for a public one received from a peer (0 for 0); a
 * code this daemon does not know (a newer peer's) is OBD_E_PROTO. */
int obd_err_from_public(int code);
/* "OBD_E_TIMEOUT", or "OBD_E_?" for a value that is not a code. */
const char *obd_err_name(int err);
/* The code's text ("deadline passed"); "success" for 0. */
const char *obd_err_str(int err);

#endif
