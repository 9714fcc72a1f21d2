/* The 1-bit codec: docs/design.md, "The compressed allreduce, exactly", as
 * plain functions over memory.
 *
 * Nothing here knows about sockets, threads or libuv. A tensor of `count`
 * fp32 elements is padded with zeros to `padded` elements
 * (obd_codec_padded_len) and split among `n` participants into chunks of
 * `padded / n` elements; every chunk is a whole number of bytes once packed.
 *
 * Packed signs: 1 bit per element, most significant bit first within a byte,
 * bit value 1 meaning "non-negative" (zero and -0.0 count as non-negative).
 *
 * Exact arithmetic of one step, which a reference must reproduce (the
 * tests' is tests/codec_ref.h):
 *   worker, over the average of nsrc >= 1 local buffers src_k, with the
 *   error e the previous step left:
 *            a_i = src_0[i], then a_i += src_k[i] for k = 1..nsrc-1 in
 *            order (fp32; every src_k[i] reads as 0 for i >= count, and
 *            a_i = 0.0f there), a_i = a_i / (float)nsrc (fp32; with
 *            nsrc == 1, a_i = src_0[i] exactly)
 *            b_i = a_i + e_i (fp32)
 *            scale = (float)sqrt(sumsq / padded), sumsq the sum of the
 *            squares of b in the order below
 *            s_i = +1 if b_i >= 0.0f, else -1: the packed bits
 *            e_i = b_i - scale (s_i = +1) or b_i + scale (s_i = -1): the
 *            error the next step starts from
 *   server:  a = +-scale_0, then a += +-scale_k for k = 1..n-1 in order
 *            (participant k's worker scale, signed by its bit i),
 *            m_i = a / (float)n + server_error_i (all fp32)
 *            sscale, the bits and the new server error as for the worker,
 *            over m.
 *
 * Sum of squares: the padded tensor (or the chunk) is cut into blocks of
 * OBD_CODEC_BLOCK elements from its start. Within a block [begin, end),
 * element i is added to accumulator (i - begin) % 16 in increasing i,
 * each of the 16 accumulators starting at 0.0 and adding
 * (double)b_i * (double)b_i (exact in double); the accumulators are then
 * combined as a pairwise tree: p_j = a_2j + a_2j+1, q_j = p_2j + p_2j+1,
 * (q0 + q1) + (q2 + q3). The block sums are added in block order from 0.0
 * (obd_codec_scale).
 *
 * Non-finite input: if any b_i (or m_i) is NaN or +-Inf, or a scale handed
 * to the server step is negative or not finite, the step fails with
 * OBD_E_NONFINITE and yields no scale. The op that fed such data must
 * fail; error feedback is never poisoned (the state model below says what
 * the failed step costs the state).
 *
 * Every function exists in a portable C version and, where the CPU has it,
 * an AVX2 version chosen at run time. Both produce bit-identical output for
 * the same input.
 */
#ifndef OBD_CODEC_H
#define OBD_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* Failures (err.h): OBD_E_NONFINITE, non-finite input or scale (see
 * above); OBD_E_INVAL, invalid sizes: a padded length or chunk of 0 or not
 * a multiple of 8, count > padded, or n < 1. Nothing is written. */

/* Elements per norm block. Sums of squares are formed per block of this
 * many elements (the last block of a tensor may be shorter) and blocks are
 * added in index order, so the result does not depend on how many threads
 * computed the blocks. A multiple of 16. */
#define OBD_CODEC_BLOCK 65536

/* Padded length: `count` rounded up to a multiple of n * lcm(n, 8).
 * n >= 1. Returns 0 for count 0, and 0 (caller must treat as an error) if
 * the result would not fit in size_t. */
size_t obd_codec_padded_len(size_t count, int n);

/* Bytes of packed signs for `elems` elements (elems / 8, rounded up). */
static inline size_t obd_codec_packed_bytes(size_t elems)
{
    return (elems + 7) / 8;
}

/* ---- Lazy error feedback: the single-pass codec ---------------------
 *
 * The error e of a step is known only once its scale is, that is after a
 * pass over the whole tensor; kept as e itself, it would take a second
 * pass to write. The codec keeps instead what the last step had before
 * its scale was applied, and forms that step's error on the fly in the
 * next pass:
 *
 *   mode ZERO      e_i = 0.0f           (no step taken yet; v unused)
 *   mode EAGER     e_i = v_i            (v holds an error itself, e.g. one
 *                                        restored from a snapshot of e)
 *   mode DEFERRED  e_i = v_i - scale    if v_i >= 0.0f
 *                  e_i = v_i + scale    otherwise (v_i < 0.0f)
 *
 * where v is the b (worker) or m (server) of the last step and scale its
 * scale (sscale). DEFERRED is, bit for bit, the fp32 operation
 * e_i = b_i -+ scale of the file comment, performed one step later; so a
 * sequence of lazy steps produces exactly the bits, scales and errors of
 * that arithmetic applied step by step, and the error of a lazy state
 * (obd_codec_impl.lazy_error) is its e byte for byte. The tests hold
 * every implementation to a reference that keeps e itself, in two passes
 * (tests/codec_ref.h), with memcmp. Every element of v is finite in a
 * state a step committed.
 *
 * One step, worker:
 *   a_i as in the file comment (the average of the sources)
 *   b_i = a_i + e_i      (fp32, e_i from the previous state as above;
 *                         with mode ZERO this is a_i + 0.0f, which turns
 *                         -0.0f into +0.0f exactly as a zero e does)
 *   signs of b into packed bits, sum of squares of b per block (in the
 *   order of the file comment), b stored as the next state's v;
 *   scale = obd_codec_scale over the block sums; the next state is
 *   {DEFERRED, scale, v = b}.
 * One step, server:
 *   m_i = (+-scale_0 + ... + +-scale_n-1, left to right) / (float)n + e_i
 *   then signs, block sums and the next state {DEFERRED, sscale, v = m}.
 *
 * Each tensor element is read once (sources, previous v) and written
 * once (next v) per step, in one pass; the signs and block sums come out
 * of that pass, the scale right after it.
 *
 * State model the daemon keeps, per key and per role (worker: padded
 * elements; server: one chunk): struct obd_codec_lazy_state below, one
 * buffer v that every step rewrites in place (next == v); its functions
 * are the only transitions. A step that fails once its pass has begun
 * (this node's own NaN/Inf, another node's, a peer's bad scale, a
 * timeout) has overwritten v with a b that never became a step, and
 * b = a + e cannot be undone exactly (fp32 addition is not invertible):
 * the state is reset to ZERO, as for a new key, and the daemon counts the
 * reset. A failed step leaves no trace of its data, but the key loses its
 * accumulated error.
 *
 * Transitions:
 *   init:      mode ZERO (the buffer needs no contents)
 *   restore:   an error snapshot e (the error itself, as lazy_error
 *              writes it) is copied into v, mode EAGER: exact
 *   snapshot:  between steps, lazy_error over prev (any ranges, e.g.
 *              chunk by chunk into a staging buffer) writes e byte for
 *              byte
 *   step:      prev = obd_codec_lazy_state_prev(), next =
 *              obd_codec_lazy_state_next() (v itself); the blocks, on any
 *              threads, then obd_codec_scale over their sums
 *   commit:    the op succeeded on every node: obd_codec_lazy_state_commit
 *              with the step's scale (mode DEFERRED)
 *   abort:     the op failed after the step's pass began on this state
 *              (worker and server state each on its own):
 *              obd_codec_lazy_state_abort, mode ZERO. A state whose pass
 *              never began needs nothing.
 *
 * Why in place: the kernels can also write next to a second buffer and
 * leave prev as it was, so that a failed step would leave no trace at
 * all, however late the failure is learned. That doubles the
 * error-feedback memory, 4 * (N + N/n) bytes more per key, and makes the
 * passes 4-21% slower, measured by tests/bench/bench_codec (its "in
 * place" and "2 buffers" rows; one thread, medians of 15 runs at 16 Mi
 * floats and 10 at 64 Mi on a shared 2-core machine under load): worker
 * 0.99x memcpy against 0.82x in place (64 Mi: 0.99x against 0.95x),
 * server step with 4 inputs 1.20x against 1.04x (64 Mi: 1.11x against
 * 1.05x), although both move the same bytes: the separate next buffer is
 * written with streaming stores, but reading one region while writing
 * another costs the memory system more than writing back the lines just
 * read. In place meets the codec's targets (<= 1.1x memcpy per pass)
 * where two buffers miss the server's, and halves the memory; what it
 * gives up is the error of a key whose op failed anyway, which restarts
 * from zero, counted.
 *
 * State buffers are allocated 64-byte aligned (aligned_alloc), like the
 * trainers' page-aligned shared memory, so that vector loads never split
 * a cache line. A next buffer apart from prev is written with streaming
 * stores, which need 16 bytes at least (32 for whole-vector stores); one
 * whose offset within a page differed slightly from the input's was
 * measured up to 2x slower (4 KiB aliasing between loads and stores).
 */
enum obd_codec_lazy_mode {
    OBD_CODEC_LAZY_ZERO,
    OBD_CODEC_LAZY_EAGER,
    OBD_CODEC_LAZY_DEFERRED,
};

/* A state as the kernels read it (borrowed: v must stay valid for the
 * call). v may be NULL when mode is ZERO. */
struct obd_codec_lazy {
    enum obd_codec_lazy_mode mode;
    float scale; /* DEFERRED only: finite and >= 0 (the step's scale) */
    const float *v;
};

/* The lazy state of one key and role, over one buffer that the caller
 * owns and frees; the struct only borrows it. Fields are read-only
 * outside the functions below. */
struct obd_codec_lazy_state {
    float *v;
    float scale; /* DEFERRED only */
    enum obd_codec_lazy_mode mode;
};

/* No step taken yet: mode ZERO. */
void obd_codec_lazy_state_init(struct obd_codec_lazy_state *s, float *v);

/* Restore an error snapshot: e (n floats, the state's length) is copied
 * into v, and the mode becomes EAGER. e may be v itself (a snapshot read
 * in place): nothing is copied then. */
void obd_codec_lazy_state_restore(struct obd_codec_lazy_state *s,
                                  const float *e, size_t n);

/* What a step reads (borrows v). */
struct obd_codec_lazy
obd_codec_lazy_state_prev(const struct obd_codec_lazy_state *s);

/* Where a step writes: v itself, in place. */
float *obd_codec_lazy_state_next(const struct obd_codec_lazy_state *s);

/* The step (its b or m in v, its scale `scale`) succeeded on every node:
 * mode DEFERRED. */
void obd_codec_lazy_state_commit(struct obd_codec_lazy_state *s, float scale);

/* The op failed after the step's pass began: v holds part of a step that
 * never happened, and the state becomes ZERO (the caller counts the
 * reset). */
void obd_codec_lazy_state_abort(struct obd_codec_lazy_state *s);

/* Function table of one implementation. All pointers borrow their buffers
 * for the duration of the call only. Ranges [begin, end) are element
 * indices into the padded tensor (or the chunk); `begin` is a multiple of
 * 8. */
struct obd_codec_impl {
    const char *name; /* "portable" or "avx2" */

    /* Lazy worker step over [begin, end) (see "Lazy error feedback"):
     * forms b_i from the sources and prev's error, stores next[i] = b_i,
     * writes the signs of b into bits (bits[0] holds element begin) and
     * returns the sum of squares of b over the range in the lane order of
     * the file comment. nsrc >= 1; src[k] has `count` elements (reads as
     * 0.0f past count). `end - begin` is a multiple of 8; a caller that
     * wants the step's scale runs whole OBD_CODEC_BLOCK blocks (begin a
     * multiple of OBD_CODEC_BLOCK). next is indexed like prev->v; it is
     * either exactly prev->v (in place) or overlaps neither it nor src.
     * Each element of src and prev->v is read once, before next[i] is
     * written. prev must be a state obd_codec_lazy_compress accepts (it
     * checks, this does not). Cannot fail: a non-finite b_i makes the
     * returned sum non-finite, which obd_codec_scale reports. With next
     * apart from prev->v and at least 16-byte aligned at begin, the AVX2
     * version writes next with streaming stores (see the state model). */
    double (*lazy_worker_block)(const float *const *src, int nsrc, size_t count,
                                const struct obd_codec_lazy *prev, float *next,
                                size_t begin, size_t end, uint8_t *bits);

    /* Lazy server step over [begin, end) of a chunk: m_i from in[k]
     * (participant k's packed bits of the whole chunk, bit i for chunk
     * element i), scales[k] and prev's error, next[i] = m_i, signs of m
     * into bits (bits[0] holds element begin), returns the sum of squares
     * of m in the same order. The scales must be finite and >= 0
     * (obd_codec_lazy_server checks them). Same rules for `end - begin`,
     * next and prev->v as lazy_worker_block. */
    double (*lazy_server_block)(const uint8_t *const *in, const float *scales,
                                int n, const struct obd_codec_lazy *prev,
                                float *next, size_t begin, size_t end,
                                uint8_t *bits);

    /* The error a lazy state holds, e[i] for i in [begin, end): 0.0f,
     * v[i], or v[i] -+ scale as the mode says. e may be v itself. */
    void (*lazy_error)(const struct obd_codec_lazy *st, float *e, size_t begin,
                       size_t end);

    /* out[i] = +-scale for i in [0, elems), bit i of bits. */
    void (*decompress)(const uint8_t *bits, float scale, float *out,
                       size_t elems);

    /* decompress with streaming (non-temporal) stores where the CPU has
     * them: the same out, but written around the caches, which saves
     * reading every output line before overwriting it. For outputs larger
     * than the last-level cache, which are not in it anyway when they
     * are read next; a small output is better written by decompress. */
    void (*decompress_stream)(const uint8_t *bits, float scale, float *out,
                              size_t elems);
};

/* The implementations. obd_codec_avx2() returns NULL when the CPU (or the
 * build) lacks AVX2. obd_codec_best() is the fastest available; it honours
 * OBCOMM_CODEC=portable in the environment (read once). */
const struct obd_codec_impl *obd_codec_portable(void);
const struct obd_codec_impl *obd_codec_avx2(void);
const struct obd_codec_impl *obd_codec_best(void);

/* Combines per-block sums of squares into a scale: sum = 0.0, then
 * sum += block_sums[j] for j = 0..nblocks-1 in order (double), and
 * *scale = (float)sqrt(sum / elems). Returns OBD_E_NONFINITE if the sum
 * is not finite and OBD_E_INVAL if elems is 0; *scale is written only
 * on success. A caller that splits a tensor over threads collects the block
 * sums of blocks [j * OBD_CODEC_BLOCK, (j + 1) * OBD_CODEC_BLOCK) and gets
 * the same scale as obd_codec_lazy_compress. */
int obd_codec_scale(const double *block_sums, size_t nblocks, size_t elems,
                    float *scale);

/* Whole-tensor lazy steps on one thread, built from the table above (the
 * daemon runs the same blocks on its pool and combines the sums with
 * obd_codec_scale).
 *
 * Worker: src[k] (k < nsrc) of `count` elements, prev and next of
 * `padded` elements, bits padded / 8 bytes. On success writes bits, next
 * and *scale: the bits and scale of the worker step of the file comment
 * from prev's error, whose new error {DEFERRED, *scale, next} holds byte
 * for byte; the caller then commits that state. Returns OBD_E_INVAL
 * (bad sizes, nsrc < 1, a DEFERRED prev with a scale that is negative or
 * not finite, or a non-ZERO prev without v), writing nothing;
 * OBD_E_NONFINITE when some b_i is NaN or +-Inf, with bits and next
 * partly written and *scale untouched: prev is untouched when
 * next != prev->v, and destroyed when they are the same buffer (that
 * caller resets the state to ZERO). */
int obd_codec_lazy_compress(const struct obd_codec_impl *impl,
                            const float *const *src, int nsrc, size_t count,
                            const struct obd_codec_lazy *prev, float *next,
                            size_t padded, uint8_t *bits, float *scale);

/* Server, for one chunk of `chunk` elements (a multiple of 8): in[k] and
 * scales[k] from each of the n participants (in[k] the chunk's bits), the
 * chunk's server error held as prev (read) and next (written) as for
 * obd_codec_lazy_compress. On success writes bits (chunk / 8 bytes), next
 * and *sscale. OBD_E_INVAL as for obd_codec_lazy_compress (n < 1
 * for nsrc); OBD_E_NONFINITE for a participant scale that is
 * negative or not finite (nothing written) or a non-finite m_i (bits and
 * next partly written, *sscale untouched). */
int obd_codec_lazy_server(const struct obd_codec_impl *impl,
                          const uint8_t *const *in, const float *scales, int n,
                          const struct obd_codec_lazy *prev, float *next,
                          size_t chunk, uint8_t *bits, float *sscale);

#endif
