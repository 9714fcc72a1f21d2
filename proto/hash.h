/* FNV-1a, 64 bit (Fowler, Noll, Vo): the one hash of the protocol's
 * fingerprints and ids (the world's fingerprint in Hello, the job id and
 * the op fingerprint in every frame header, a job's run) and of the
 * names of efstate files. A fingerprint, not a defence against
 * adversaries: wherever a collision would matter, what was hashed is
 * compared too (job names travel in announces, the world is compared
 * entry by entry).
 *
 * Nodes compare these values and files carry them in their names, so
 * they never change: the same bytes give the same value on every build
 * and host (tests/test_frame.c pins the values of the protocol's). A
 * caller that hashes a number feeds its bytes in a fixed order, never
 * the host's. Start with OBCOMM_HASH_FNV1A_INIT and feed the parts in
 * order; each function returns the new state.
 *
 * Pure arithmetic, no allocation, no libuv. */
#ifndef OBCOMM_HASH_H
#define OBCOMM_HASH_H

#include <stddef.h>
#include <stdint.h>

#define OBCOMM_HASH_FNV1A_INIT  UINT64_C(0xcbf29ce484222325)
#define OBCOMM_HASH_FNV1A_PRIME UINT64_C(0x100000001b3)

/* The len bytes at data, in order (FNV-1a proper). */
static inline uint64_t obcomm_hash_fnv1a(uint64_t h, const void *data,
                                         size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * OBCOMM_HASH_FNV1A_PRIME;
    return h;
}

/* The bytes of the string s, without its terminating NUL. */
static inline uint64_t obcomm_hash_fnv1a_str(uint64_t h, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        h = (h ^ *p) * OBCOMM_HASH_FNV1A_PRIME;
    return h;
}

/* The 8 bytes of v, least significant first whatever the host's byte
 * order. */
static inline uint64_t obcomm_hash_fnv1a_u64(uint64_t h, uint64_t v)
{
    for (int b = 0; b < 8; b++)
        h = (h ^ ((v >> (8 * b)) & 0xff)) * OBCOMM_HASH_FNV1A_PRIME;
    return h;
}

/* FNV-1a's step applied to the whole word v at once instead of to its
 * bytes: one multiply per word, weaker mixing than obcomm_hash_fnv1a_u64
 * and a different value. It identifies a job's run from every node's run
 * (job.c), where it is shown to people and compared across nodes, so it
 * stays as it is. */
static inline uint64_t obcomm_hash_fnv1a_word(uint64_t h, uint64_t v)
{
    return (h ^ v) * OBCOMM_HASH_FNV1A_PRIME;
}

#endif
