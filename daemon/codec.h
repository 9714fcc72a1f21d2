/* The 1-bit codec: DESIGN.md section 2 as plain functions over memory.
 *
 * Nothing here knows about sockets, threads or libuv. A tensor of `count`
 * fp32 elements is padded with zeros to `padded` elements
 * (obd_codec_padded_len) and split among `n` participants into chunks of
 * `padded / n` elements; every chunk is a whole number of bytes once packed.
 *
 * Packed signs: 1 bit per element, most significant bit first within a byte,
 * bit value 1 meaning "non-negative" (zero and -0.0 count as non-negative).
 *
 * Exact arithmetic, which a reference must reproduce:
 *   worker:  b_i = x_i + e_i (fp32; x_i = 0 for i >= count)
 *            scale = (float)sqrt(sumsq / padded), sumsq accumulated in
 *            double (every square is exact in double) in the block and
 *            lane order described at struct obd_codec_impl's sumsq_block
 *            e_i = b_i - scale (s_i = +1) or b_i + scale (s_i = -1)
 *   worker over an average of nsrc local buffers (obd_codec_compress_avg):
 *            a_i = src_0[i], then a_i += src_k[i] for k = 1..nsrc-1 in
 *            order (fp32; every src_k[i] reads as 0 for i >= count, and
 *            a_i = 0.0f there), a_i = a_i / (float)nsrc (fp32),
 *            b_i = a_i + e_i (fp32); then as for the worker, over b.
 *            With nsrc == 1 this is exactly the worker above.
 *   server:  a = +-scale_0, then a += +-scale_k for k = 1..n-1 in order,
 *            m_i = a / (float)n + server_error_i (all fp32)
 *            sscale and the new server error as for the worker, over m.
 *
 * Non-finite input: if any b_i (or m_i) is NaN or +-Inf, or a scale handed
 * to the server step is negative or not finite, the function returns
 * OBD_CODEC_ENONFINITE and writes nothing at all: the error buffers, the
 * packed output and the scale are left exactly as they were. The op that
 * fed such data must fail; error feedback is never poisoned. (The lazy
 * single-pass steps below write their next state and bits as they go,
 * and leave the previous state untouched instead.)
 *
 * Every function exists in a portable C version and, where the CPU has it,
 * an AVX2 version chosen at run time. Both produce bit-identical output for
 * the same input.
 */
#ifndef OBD_CODEC_H
#define OBD_CODEC_H

#include <stddef.h>
#include <stdint.h>

/* Non-finite input or scale; see the file comment. */
#define OBD_CODEC_ENONFINITE (-1)
/* Invalid sizes: a padded length or chunk of 0 or not a multiple of 8,
 * count > padded, or n < 1. Nothing is written. */
#define OBD_CODEC_EINVAL (-2)

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
 * The eager functions below keep the error e itself, which the worker can
 * only update after the scale is known, i.e. in a second pass. The lazy
 * functions keep instead what the last step had before its scale was
 * applied, and form that step's error on the fly in the next pass:
 *
 *   mode ZERO      e_i = 0.0f           (no step taken yet; v unused)
 *   mode EAGER     e_i = v_i            (v holds an error itself, e.g. one
 *                                        restored from a snapshot of e)
 *   mode DEFERRED  e_i = v_i - scale    if v_i >= 0.0f
 *                  e_i = v_i + scale    otherwise (v_i < 0.0f)
 *
 * where v is the b (worker) or m (server) of the last step and scale its
 * scale (sscale). DEFERRED reproduces, bit for bit, the fp32 operation the
 * eager functions perform at the end of a step (e_i = b_i -+ scale), only
 * one step later; so a sequence of lazy steps produces exactly the bits,
 * scales and errors of the same sequence of eager steps, and the error of
 * a lazy state (obd_codec_impl.lazy_error) equals the eager e byte for
 * byte. Every element of v is finite in a state a step committed.
 *
 * One step, worker (the same arithmetic as obd_codec_compress_avg, and so
 * with nsrc == 1 as obd_codec_compress):
 *   a_i = src_0[i] + ... + src_nsrc-1[i] left to right, / (float)nsrc
 *         (fp32; a_i = src_0[i] unchanged when nsrc == 1, 0.0f for i >=
 *         count, see the file comment)
 *   b_i = a_i + e_i      (fp32, e_i from the previous state as above;
 *                         with mode ZERO this is a_i + 0.0f, which turns
 *                         -0.0f into +0.0f exactly as the eager code does
 *                         with a zeroed e)
 *   signs of b into packed bits, sum of squares of b per block (block and
 *   lane order of sumsq_block), b stored as the next state's v;
 *   scale = obd_codec_scale over the block sums; the next state is
 *   {DEFERRED, scale, v = b}.
 * One step, server (the arithmetic of obd_codec_server):
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
 *   restore:   an error snapshot e (the format the eager code writes) is
 *              copied into v, mode EAGER: exact, so old snapshots load
 *              unchanged
 *   snapshot:  between steps, lazy_error over prev (any ranges, e.g.
 *              chunk by chunk into a staging buffer) writes the eager e
 *              byte for byte, so the snapshot format does not change
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
 * for the duration of the call only. `x` may be shorter than the padded
 * range: element i reads as 0.0f for i >= count. Ranges [begin, end) are
 * element indices into the padded tensor; `begin` is a multiple of 8. */
struct obd_codec_impl {
    const char *name; /* "portable" or "avx2" */

    /* Sum of squares of b = x + e over [begin, end), where end - begin <=
     * OBD_CODEC_BLOCK and begin is a multiple of OBD_CODEC_BLOCK (or the
     * caller accepts a different rounding). Lane order: element i is added
     * to accumulator (i - begin) % 16 in increasing i, each accumulator
     * starting at 0.0 and adding (double)b_i * (double)b_i; the 16
     * accumulators are then combined as a pairwise tree:
     * p_j = a_2j + a_2j+1, q_j = p_2j + p_2j+1, (q0 + q1) + (q2 + q3).
     * Reads only; `end` need not be a multiple of 8. */
    double (*sumsq_block)(const float *x, size_t count, const float *e,
                          size_t begin, size_t end);

    /* Signs of b = x + e over [begin, end) into bits (bits[0] holds
     * element begin), and e_i = b_i -+ scale in place. `end - begin` is a
     * multiple of 8. Cannot fail: the caller checked the norm first. */
    void (*compress_range)(const float *x, size_t count, float *e, size_t begin,
                           size_t end, float scale, uint8_t *bits);

    /* The worker's pass 1 over an average (obd_codec_compress_avg): for i
     * in [begin, end), a_i = src[0][i] + src[1][i] + ... + src[nsrc-1][i]
     * added left to right in fp32 (a_i = 0.0f for i >= count), then
     * a_i = a_i / (float)nsrc in fp32, and b[i] = a_i + e[i] in fp32 is
     * stored. (For a power-of-two nsrc the code multiplies by 1/nsrc,
     * which is exact and rounds to the same float.) Returns the sum of
     * squares of those b_i in the block and lane order of sumsq_block, so
     * with nsrc == 1 it returns exactly sumsq_block(src[0], count, e,
     * begin, end). nsrc >= 1. b is indexed like e (b[i] for padded index
     * i). Reads src and e and writes only b[begin..end); b must not
     * overlap src or e. `end` need not be a multiple of 8. */
    double (*avg_sumsq_block)(const float *const *src, int nsrc, size_t count,
                              const float *e, size_t begin, size_t end,
                              float *b);

    /* The worker's pass 2 over a b stored by avg_sumsq_block: signs of b
     * over [begin, end) into bits (bits[0] holds element begin) and
     * e[i] = b[i] - scale (bit 1) or b[i] + scale (bit 0). `end - begin`
     * is a multiple of 8. Reads b, writes e and bits; e must not overlap
     * b. Cannot fail: the caller checked the norm first. */
    void (*sign_range)(const float *b, float *e, size_t begin, size_t end,
                       float scale, uint8_t *bits);

    /* Server step, pass 1: sum of squares of m over [begin, end) of a chunk
     * of `chunk` elements. in[k] points to participant k's packed bits of
     * the whole chunk; scales[k] its scale; err is the chunk's server error.
     * Same block and lane rules as sumsq_block. */
    double (*server_sumsq_block)(const uint8_t *const *in, const float *scales,
                                 int n, const float *err, size_t begin,
                                 size_t end);

    /* Server step, pass 2: signs of m into bits (bits[0] holds element
     * begin) and err_i = m_i -+ sscale in place. `end - begin` is a
     * multiple of 8. Cannot fail: the caller checked the scales and the
     * norm first. */
    void (*server_range)(const uint8_t *const *in, const float *scales, int n,
                         float *err, size_t begin, size_t end, float sscale,
                         uint8_t *bits);

    /* Lazy worker step over [begin, end) (see "Lazy error feedback"):
     * forms b_i from the sources and prev's error, stores next[i] = b_i,
     * writes the signs of b into bits (bits[0] holds element begin) and
     * returns the sum of squares of b in the block and lane order of
     * sumsq_block. nsrc >= 1; src[k] has `count` elements (reads as 0.0f
     * past count). `end - begin` is a multiple of 8; a caller that wants
     * the eager functions' scale runs whole OBD_CODEC_BLOCK blocks (begin
     * a multiple of OBD_CODEC_BLOCK). next is indexed like prev->v; it is
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
     * of m as sumsq_block does. The scales must have passed the checks
     * obd_codec_server makes (finite, >= 0). Same rules for `end - begin`,
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

    /* out[i] += +-scale for i in [0, elems). */
    void (*decompress_add)(const uint8_t *bits, float scale, float *out,
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
 * *scale = (float)sqrt(sum / elems). Returns OBD_CODEC_ENONFINITE if the sum
 * is not finite and OBD_CODEC_EINVAL if elems is 0; *scale is written only
 * on success. A caller that splits a tensor over threads collects the block
 * sums of blocks [j * OBD_CODEC_BLOCK, (j + 1) * OBD_CODEC_BLOCK) and gets
 * the same scale as obd_codec_compress. */
int obd_codec_scale(const double *block_sums, size_t nblocks, size_t elems,
                    float *scale);

/* Whole-tensor helpers on one thread, built from the table above.
 *
 * Worker compress (steps 1-3): x has `count` elements, e and the padded
 * tensor `padded` elements, bits padded / 8 bytes. On success writes bits,
 * *scale and updates e. */
int obd_codec_compress(const struct obd_codec_impl *impl, const float *x,
                       size_t count, float *e, size_t padded, uint8_t *bits,
                       float *scale);

/* Worker compress of the exact average of nsrc >= 1 local buffers
 * (src[k] of `count` elements each; see the file comment for the
 * arithmetic), in two passes: avg_sumsq_block stores b = average + e into
 * the scratch buffer b (`padded` elements, overlapping neither src nor e)
 * while it sums squares, then sign_range reads b and writes bits and e.
 * Each src[k] is read once. On success writes bits (padded / 8 bytes),
 * *scale and e, and leaves b = average + e (the old e). Returns
 * OBD_CODEC_EINVAL for bad sizes or nsrc < 1, writing nothing; returns
 * OBD_CODEC_ENONFINITE (any b_i not finite, e.g. a NaN or Inf in a source
 * or in e, or an average that overflows) with e, bits and *scale untouched
 * but b partly or wholly overwritten. With nsrc == 1, bits, *scale and e
 * are byte-identical to obd_codec_compress's. */
int obd_codec_compress_avg(const struct obd_codec_impl *impl,
                           const float *const *src, int nsrc, size_t count,
                           float *e, float *b, size_t padded, uint8_t *bits,
                           float *scale);

/* Server step (step 4) for one chunk of `chunk` elements (a multiple of 8):
 * in[k], scales[k] from each of the n participants, err the chunk's server
 * error. On success writes bits (chunk / 8 bytes), *sscale and updates
 * err. */
int obd_codec_server(const struct obd_codec_impl *impl,
                     const uint8_t *const *in, const float *scales, int n,
                     float *err, size_t chunk, uint8_t *bits, float *sscale);

/* Whole-tensor lazy steps on one thread, built from the table above (the
 * daemon runs the same blocks on its pool and combines the sums with
 * obd_codec_scale).
 *
 * Worker: src[k] (k < nsrc) of `count` elements, prev and next of
 * `padded` elements, bits padded / 8 bytes. On success writes bits, next
 * and *scale; the caller then commits {DEFERRED, *scale, next}. Returns
 * OBD_CODEC_EINVAL (bad sizes, nsrc < 1, a DEFERRED prev with a scale that
 * is negative or not finite, or a non-ZERO prev without v), writing
 * nothing; OBD_CODEC_ENONFINITE when some b_i is NaN or +-Inf, with bits
 * and next partly written and *scale untouched: prev is untouched when
 * next != prev->v, and destroyed when they are the same buffer (that
 * caller resets the state to ZERO). With a ZERO or an EAGER prev holding
 * e, bits, *scale and next's error are byte-identical to
 * obd_codec_compress_avg (obd_codec_compress for nsrc == 1) on e. */
int obd_codec_lazy_compress(const struct obd_codec_impl *impl,
                            const float *const *src, int nsrc, size_t count,
                            const struct obd_codec_lazy *prev, float *next,
                            size_t padded, uint8_t *bits, float *scale);

/* Server, for one chunk of `chunk` elements (a multiple of 8): the same
 * contract as obd_codec_server, with the server error held as prev (read)
 * and next (written) as for obd_codec_lazy_compress. OBD_CODEC_ENONFINITE
 * for a bad participant scale (nothing written) or a non-finite m_i
 * (bits and next partly written). */
int obd_codec_lazy_server(const struct obd_codec_impl *impl,
                          const uint8_t *const *in, const float *scales, int n,
                          const struct obd_codec_lazy *prev, float *next,
                          size_t chunk, uint8_t *bits, float *sscale);

#endif
