/* obcomm: collectives and 1-bit Adam for data-parallel training over TCP.
 *
 * A trainer links libobcomm and talks to the obcommd daemon of its node over
 * a Unix socket. Buffers handed to collectives live in shared memory that
 * the daemon maps (obcomm_alloc), so tensors are never copied through a
 * socket. Collectives come blocking and non-blocking (obcomm_i*); a handle
 * is used by one thread at a time. Functions return 0 or a negative error
 * code; obcomm_strerror() explains every code. How it works: man 7 obcomm;
 * this API: man 3 obcomm.
 */
#ifndef OBCOMM_H
#define OBCOMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(OBCOMM_BUILDING) && defined(__GNUC__)
#define OBCOMM_API __attribute__((visibility("default")))
#else
#define OBCOMM_API
#endif

/* Error codes. System errors pass through as negative errno values (libuv's
 * codes are negative errno on Unix); obcomm's own codes live in
 * [-1099, -1000]. */
#define OBCOMM_E_INVAL     (-1000) /* invalid argument */
#define OBCOMM_E_MISMATCH  (-1001) /* ranks issued different ops */
#define OBCOMM_E_TIMEOUT   (-1002) /* deadline passed; names who is missing */
#define OBCOMM_E_PEER_LOST (-1003) /* a node or trainer of the job vanished */
#define OBCOMM_E_PROTO     (-1004) /* malformed or unexpected message */
#define OBCOMM_E_NOMEM     (-1005) /* out of memory or over a bound */
#define OBCOMM_E_NOTCONN   (-1006) /* the daemon is not reachable */
#define OBCOMM_E_VERSION   (-1007) /* protocol versions differ */
#define OBCOMM_E_NONFINITE (-1008) /* NaN or Inf in a 1-bit allreduce */
#define OBCOMM_E_BUSY      (-1009) /* rank taken, or a job bound reached */
#define OBCOMM_E_NOTREG    (-1010) /* data not inside an obcomm_alloc buffer */
#define OBCOMM_E_STATE     (-1011) /* per-key state disagrees (count) */
#define OBCOMM_E_IO        (-1012) /* a file could not be read or written */
#define OBCOMM_E_CORRUPT   (-1013) /* a file is damaged or of another kind */
#define OBCOMM_E_DENIED    (-1014) /* the job belongs to another user */

typedef enum {
    OBCOMM_FLOAT32 = 0,
    OBCOMM_FLOAT64 = 1,
    OBCOMM_FLOAT16 = 2,  /* IEEE binary16, accumulated in fp32 */
    OBCOMM_BFLOAT16 = 3, /* bfloat16, accumulated in fp32 */
    OBCOMM_INT32 = 4,
    OBCOMM_INT64 = 5,
} obcomm_dtype_t;

typedef enum {
    OBCOMM_SUM = 0,
    OBCOMM_AVG = 1, /* sum / world size; integers divide truncating to 0 */
    OBCOMM_MAX = 2,
    OBCOMM_MIN = 3,
} obcomm_op_t;

typedef struct obcomm obcomm_t;

typedef struct {
    const char *socket_path; /* NULL: $OBCOMM_SOCKET, else the default path */
    const char *job;         /* NULL: "default" */
    int local_rank, local_size;
    int timeout_ms; /* per-op deadline; 0: daemon default */
} obcomm_options_t;

/* The daemon's socket when neither the options nor $OBCOMM_SOCKET name one. */
#define OBCOMM_DEFAULT_SOCKET "/run/obcomm/obcommd.sock"

/* Connects to the node's daemon and joins the job. On success *out is a
 * handle the caller closes with obcomm_close. */
OBCOMM_API int obcomm_connect(const obcomm_options_t *opts, obcomm_t **out);
/* Releases every buffer of the handle and leaves the job. NULL is a no-op. */
OBCOMM_API void obcomm_close(obcomm_t *c);
OBCOMM_API int obcomm_rank(const obcomm_t *c); /* node*local_size + local */
OBCOMM_API int obcomm_size(const obcomm_t *c); /* nodes * local_size */

/* Shared-memory buffer of at least `bytes` bytes, zero-filled, 64-byte
 * aligned. Caller frees with obcomm_free (or obcomm_close). */
OBCOMM_API int obcomm_alloc(obcomm_t *c, size_t bytes, void **data);
OBCOMM_API int obcomm_free(obcomm_t *c, void *data);
/* Hands the buffer at data (from obcomm_alloc) over to the caller: the
 * daemon forgets it and the handle stops tracking it, but it stays mapped
 * with its contents, *mapped bytes long, until the caller's
 * munmap(data, *mapped). Collectives refuse it from then on. For language
 * bindings whose arrays may outlive the handle (obcomm_close unmaps every
 * buffer it still tracks). On a failed send to the daemon the buffer is
 * handed over all the same and the error returned. */
OBCOMM_API int obcomm_disown(obcomm_t *c, void *data, size_t *mapped);

/* Collectives. `data` lies inside one buffer from obcomm_alloc; all ranks of
 * the job issue the same collectives in the same order. In a world of one
 * rank an allreduce leaves data as it is, bit for bit, whatever the dtype
 * and op. */
OBCOMM_API int obcomm_allreduce(obcomm_t *c, void *data, size_t count,
                                obcomm_dtype_t dtype, obcomm_op_t op);
/* The 1-bit compressed allreduce (man 7 obcomm, THE COMPRESSED ALLREDUCE):
 * the exact average of the node's trainers, then 1 bit per element plus a
 * scale among the nodes, with error feedback on the worker and the server
 * side. The result is the (compressed) average, identical on every rank.
 * The error feedback lives in the daemons, one state per (job, key),
 * created at zero on first use; a key keeps its count until reset. With
 * one node the result is the exact average and no state is kept.
 *
 * The state belongs to the run of the job: from the first trainer joining
 * a job that has none until the last one leaves. A new run starts at zero
 * on every node; an earlier run's state comes back only through
 * obcomm_restore_1bit. Before any pass begins, the nodes compare their
 * versions of the key's state; if they differ, the op fails on every rank
 * with OBCOMM_E_STATE naming them and every node resets the job's state.
 * NaN or Inf fails the op with OBCOMM_E_NONFINITE.
 *
 * Any failed op stops the run: every later op of the run fails at once on
 * every rank, naming the first failure, until the trainers start a new
 * run (like an aborted NCCL communicator). */
OBCOMM_API int obcomm_allreduce_1bit(obcomm_t *c, uint64_t key, float *data,
                                     size_t count);
/* Collective: forgets the error feedback of `key` on every node, so the
 * next 1-bit allreduce on it starts at zero. */
OBCOMM_API int obcomm_reset_1bit(obcomm_t *c, uint64_t key);
/* Collective: every daemon saves the error feedback of the run (every
 * key) as one snapshot set; *snapshot (if not NULL) gets its id, the same
 * on every rank. With a state_dir the set is a directory there (the
 * newest 4 of a job are kept); without one the daemon keeps the job's
 * newest set in memory until it restarts. Fails on every rank, naming
 * each node that could not save and why, unless every node saved it. */
OBCOMM_API int obcomm_save_1bit(obcomm_t *c, uint64_t *snapshot);
/* obcomm_save_1bit(c, NULL). */
OBCOMM_API int obcomm_snapshot_1bit(obcomm_t *c);
/* 1 if this node's daemon keeps snapshot sets in a state_dir (they then
 * survive its restarts), else 0. */
OBCOMM_API int obcomm_1bit_durable(const obcomm_t *c);
/* Collective, right after obcomm_save_1bit(c, &snapshot): every rank gets
 * its node's part of the snapshot as bytes (*part, malloc'd: caller frees
 * with free; *bytes its size), for a checkpoint to carry when the daemons
 * keep no state_dir. The part is checked when it comes back: its node, its
 * world, its job and snapshot, and a digest. */
OBCOMM_API int obcomm_export_1bit(obcomm_t *c, uint64_t snapshot, void **part,
                                  size_t *bytes);
/* Collective: every node goes back to snapshot set `snapshot` of this job
 * (the run goes on from it), or, if any node misses it or holds it
 * damaged, no node uses it: the run's error feedback restarts at zero on
 * every node and the op fails on every rank naming each node and why
 * (OBCOMM_E_STATE: missing; OBCOMM_E_CORRUPT: damaged). */
OBCOMM_API int obcomm_restore_1bit(obcomm_t *c, uint64_t snapshot);
/* The same, the node taking its states from `part` (bytes from
 * obcomm_export_1bit on this node; borrowed) instead of from its own set:
 * a checkpoint that carried the parts restores on daemons that restarted
 * without a state_dir. A part of another node, world, job or snapshot, or
 * a damaged one, fails like a damaged set. part NULL: obcomm_restore_1bit. */
OBCOMM_API int obcomm_restore_1bit_part(obcomm_t *c, uint64_t snapshot,
                                        const void *part, size_t bytes);

OBCOMM_API int obcomm_broadcast(obcomm_t *c, void *data, size_t bytes,
                                int root);
OBCOMM_API int obcomm_barrier(obcomm_t *c);

/* Allgather (MPI's argument order): every rank contributes `count`
 * elements from `send`; `recv` (world * count elements) gets rank r's at
 * element r * count, on every rank. send may also lie at exactly this
 * rank's place in recv (MPI_IN_PLACE); any other overlap is refused.
 * Reduce-scatter: `send` holds world * recv_count elements on every rank;
 * rank r's `recv` gets elements [r * recv_count, (r + 1) * recv_count) of
 * their reduction, exact and computed as the ring allreduce's first half
 * (fp16 and bf16 accumulated in fp32, AVG divided once at the end). On 2
 * nodes, and for MAX, MIN and integer sums on any number, the values equal
 * that part of an obcomm_allreduce of send bit for bit; on more nodes a
 * float sum may differ in the last bits, because the ring starts each
 * block's sum one node later so that the block ends on its own node.
 * send is only read; recv may overlap it. Both lie inside buffers from
 * obcomm_alloc. */
OBCOMM_API int obcomm_allgather(obcomm_t *c, const void *send, void *recv,
                                size_t count, obcomm_dtype_t dtype);
OBCOMM_API int obcomm_reduce_scatter(obcomm_t *c, const void *send, void *recv,
                                     size_t recv_count, obcomm_dtype_t dtype,
                                     obcomm_op_t op);

/* Non-blocking collectives (MPI's MPI_I*, UCC's post/test). Each call
 * checks its arguments, sends the op to the daemon and returns at once
 * with *req, which the caller tests or waits on and then frees; the
 * buffers stay untouched by the caller until then. A call that returns an
 * error sent nothing, wrote no *req, and left its message in
 * obcomm_last_error; once an op is sent, its outcome and message belong to
 * its request. Many ops may be in flight on one handle; they are matched
 * across ranks in the order they were issued (the blocking calls
 * included, which are submit + wait). The daemon runs a job's ops one at
 * a time in that order, so requests normally complete in issue order (an
 * op the daemon refuses at submission is answered at once); waiting on
 * them in any order is fine. Each op's deadline (timeout_ms) runs from its
 * submission, in the daemon too: a queue of long ops must fit in it.
 * Up to OBCOMM_MAX_INFLIGHT ops are in flight per handle (freed requests
 * whose op is not over yet included); a call past that first waits for
 * the oldest one to complete. A handle and its requests are used by one
 * thread at a time.
 *
 * When the connection fails (the daemon died or sent something
 * malformed, or did not answer an op within its deadline plus 5 s), every
 * request in flight completes with that error and message, and the
 * handle refuses every later call with OBCOMM_E_PEER_LOST. */
typedef struct obcomm_request obcomm_request_t;
#define OBCOMM_MAX_INFLIGHT 32

OBCOMM_API int obcomm_iallreduce(obcomm_t *c, void *data, size_t count,
                                 obcomm_dtype_t dtype, obcomm_op_t op,
                                 obcomm_request_t **req);
OBCOMM_API int obcomm_iallreduce_1bit(obcomm_t *c, uint64_t key, float *data,
                                      size_t count, obcomm_request_t **req);
OBCOMM_API int obcomm_ibroadcast(obcomm_t *c, void *data, size_t bytes,
                                 int root, obcomm_request_t **req);
OBCOMM_API int obcomm_iallgather(obcomm_t *c, const void *send, void *recv,
                                 size_t count, obcomm_dtype_t dtype,
                                 obcomm_request_t **req);
OBCOMM_API int obcomm_ireduce_scatter(obcomm_t *c, const void *send, void *recv,
                                      size_t recv_count, obcomm_dtype_t dtype,
                                      obcomm_op_t op, obcomm_request_t **req);
OBCOMM_API int obcomm_ibarrier(obcomm_t *c, obcomm_request_t **req);
/* Reads whatever answers have arrived, without blocking. *done is 1 once
 * the op is over; the call then returns the op's status (0, or the error
 * every rank gets, explained by obcomm_request_error), else 0. Past the
 * bound obcomm_wait has (the op's deadline plus 5 s from its submission)
 * the daemon is taken as hung: the op ends with OBCOMM_E_TIMEOUT and the
 * handle with it, as in obcomm_wait. */
OBCOMM_API int obcomm_test(obcomm_request_t *req, int *done);
/* Blocks until the op is over and returns its status. The wait is bounded
 * by the op's deadline plus 5 s from its submission (the daemon itself
 * fails an op at its deadline); past that the daemon is taken as hung and
 * the connection fails with OBCOMM_E_TIMEOUT. Waiting again, or on a
 * request that is over, returns the same status at once. */
OBCOMM_API int obcomm_wait(obcomm_request_t *req);
/* The message of a failed request; "" before it is over or on success.
 * Borrowed: valid until the request is freed. */
OBCOMM_API const char *obcomm_request_error(const obcomm_request_t *req);
/* Frees the request. One still in flight is not cancelled (the other ranks
 * take part in it): the op goes on, its answer is discarded when it comes
 * and the request is freed then. NULL is a no-op. Requests outlive
 * obcomm_close, which completes every outstanding one with
 * OBCOMM_E_PEER_LOST ("the handle was closed with the op in flight");
 * after that, free only frees. */
OBCOMM_API void obcomm_request_free(obcomm_request_t *req);
/* For event loops: the descriptor that becomes readable when an answer
 * from the daemon (or part of one) has arrived, or the connection failed;
 * then call obcomm_test. The same descriptor until obcomm_close; -1 for
 * NULL. Polling it needs no lock; reading or writing it directly breaks
 * the handle. */
OBCOMM_API int obcomm_fd(const obcomm_t *c);

/* The message of the last failed call on this handle (names ranks and
 * fields for mismatches and timeouts); "" when there is none. Borrowed:
 * valid until the next call on the handle. */
OBCOMM_API const char *obcomm_last_error(const obcomm_t *c);
OBCOMM_API const char *obcomm_strerror(int err);
/* The name of one of obcomm's own codes ("OBCOMM_E_TIMEOUT"), NULL for
 * any other value (libuv's uv_err_name). */
OBCOMM_API const char *obcomm_err_name(int err);
/* The name of an obcomm_dtype_t ("OBCOMM_BFLOAT16") or obcomm_op_t
 * ("OBCOMM_AVG"), NULL for any other value: bindings read the enums from
 * the library in use (the Python package's DTYPES and OPS). */
OBCOMM_API const char *obcomm_dtype_name(int dtype);
OBCOMM_API const char *obcomm_op_name(int op);
/* The value of one of this header's numeric constants by its name
 * ("OBCOMM_ADAM_MAX_THREADS", "OBCOMM_MAX_INFLIGHT",
 * "OBCOMM_ADAM_AUTO_MASK_RATIO", "OBCOMM_ZOADAM_AUTO_MASK_RATIO"; the
 * ratios are the floats widened): 0 and *value set, or OBCOMM_E_INVAL for
 * any other name. */
OBCOMM_API int obcomm_constant(const char *name, double *value);

/* 1-bit Adam (man 7 obcomm, 1-BIT ADAM). Warm-up (step < freeze_step): the
 * gradients are averaged in full precision, then Adam. From freeze_step on
 * the variance is frozen, each rank updates its momentum with its own
 * gradient, the momentum is averaged with obcomm_allreduce_1bit(key), and
 * the update uses the frozen variance. As DeepSpeed's 1-bit Adam: no bias
 * correction unless bias_correction is set, weight decay added to the
 * update: p -= lr * (m / (sqrt(v) + eps) + weight_decay * p), where the
 * compression stage multiplies by 1/(sqrt(v) + eps), computed once from
 * the frozen v (docs/design.md, "The idea", has the rounding). Every rank of
 * the job must create the optimizer with the same key, count and config and
 * step together; parameters then stay bitwise identical on every rank if
 * they start so (broadcast them first). */
typedef struct obcomm_adam obcomm_adam_t;
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    long freeze_step;
    int bias_correction;
} obcomm_adam_config_t;

/* Defaults of DeepSpeed's 1-bit Adam: lr 1e-3, betas (0.9, 0.999), eps
 * 1e-8, no weight decay, freeze_step 100000, no bias correction. */
OBCOMM_API obcomm_adam_config_t obcomm_adam_defaults(void);

/* Borrows c, which must outlive the optimizer. The optimizer keeps m and a
 * gradient buffer in shared memory (obcomm_alloc), and v and the frozen
 * factors 1/(sqrt(v) + eps) (count floats each) in private memory.
 * Caller frees with obcomm_adam_destroy. */
OBCOMM_API int obcomm_adam_create(obcomm_t *c, uint64_t key, size_t count,
                                  const obcomm_adam_config_t *cfg,
                                  obcomm_adam_t **out);
/* One step: params (count floats, any memory) are updated in place from
 * this rank's grads. A collective: every rank calls it. */
OBCOMM_API int obcomm_adam_step(obcomm_adam_t *a, float *params,
                                const float *grads);
/* The same step in two halves, so that communication overlaps other work
 * (a backward pass producing other gradients): start reads grads and
 * submits the step's collective without waiting (grads may change once it
 * returns); finish waits for it and updates params. step = start + finish.
 * One step at a time per optimizer: start again, save or load before
 * finish is OBCOMM_E_INVAL. A failed start or finish leaves the optimizer
 * as before the step (the step is not counted); destroy finishes nothing
 * but waits for a started collective to end. */
OBCOMM_API int obcomm_adam_start(obcomm_adam_t *a, const float *grads);
OBCOMM_API int obcomm_adam_finish(obcomm_adam_t *a, float *params);
/* Mixed precision and gradient clipping, as DeepSpeed trains with 1-bit
 * Adam. start_ex reads grads of dtype FLOAT32, FLOAT16 or BFLOAT16
 * (converted exactly to fp32 as the step copies them) times `scale` (1:
 * untouched); finish_ex updates params, the fp32 master copy, and, when
 * model is not NULL, writes the new parameters rounded to nearest even
 * into `model` (count elements of model_dtype: the model's own fp16 or
 * bf16 parameters). Clipping as DeepSpeed: in the warm-up the averaged
 * gradient is clipped, so obcomm_adam_wait ends the collective,
 * obcomm_adam_grad_sumsq gives the average's sum of squares (the same on
 * every rank: summed in double in index order), and finish_ex's avg_scale
 * multiplies the average before Adam uses it (m = b1*m + (1-b1)*(g*s));
 * in the compression stage the local gradient is clipped, through
 * start_ex's scale, and avg_scale must be 1. A wait that fails ends
 * nothing: finish_ex then returns the same error and ends the step.
 * start and finish are start_ex (FLOAT32, 1) and finish_ex (NULL, 1). */
OBCOMM_API int obcomm_adam_start_ex(obcomm_adam_t *a, const void *grads,
                                    obcomm_dtype_t dtype, float scale);
/* start without the copy of the gradients: grads (count floats) lie in
 * memory from obcomm_alloc on the optimizer's connection, and belong to the
 * optimizer from start_inplace until finish returns. In the warm-up the
 * collective averages them where they are (scaled first when scale is not
 * 1), so afterwards they hold the average, as DDP leaves a gradient; in the
 * compression stage they are only read. OBCOMM_E_INVAL when grads are not
 * such memory. The step is otherwise start_ex's, bit for bit. */
OBCOMM_API int obcomm_adam_start_inplace(obcomm_adam_t *a, float *grads,
                                         float scale);
OBCOMM_API int obcomm_adam_wait(obcomm_adam_t *a);
OBCOMM_API int obcomm_adam_grad_sumsq(obcomm_adam_t *a, double *sumsq);
OBCOMM_API int obcomm_adam_finish_ex(obcomm_adam_t *a, float *params,
                                     void *model, obcomm_dtype_t model_dtype,
                                     float avg_scale);
OBCOMM_API void obcomm_adam_destroy(obcomm_adam_t *a);

/* Threads for the optimizer's passes over the tensor, 1 (the default) to
 * OBCOMM_ADAM_MAX_THREADS: each pass of a large tensor is split into equal
 * ranges, on threads started for the pass and joined before it ends (no
 * thread outlives a call, so fork() stays safe), at least 64 Ki elements
 * each. The results are bit-identical for any count. Returns 0 or
 * OBCOMM_E_INVAL. */
#define OBCOMM_ADAM_MAX_THREADS 64
OBCOMM_API int obcomm_adam_set_threads(obcomm_adam_t *a, int threads);
/* Learning rate from the next step on (schedules). */
OBCOMM_API void obcomm_adam_set_lr(obcomm_adam_t *a, float lr);
/* Steps taken so far; the compression stage runs from freeze_step on. */
OBCOMM_API long obcomm_adam_steps(const obcomm_adam_t *a);
/* Ablation: with 0, the daemons' error feedback of the key is reset before
 * every compression step, i.e. 1-bit compression without error
 * compensation. Default 1. */
OBCOMM_API void obcomm_adam_set_error_feedback(obcomm_adam_t *a, int on);

/* The momentum mask of the compression stage (DeepSpeed's exp_avg_mask).
 * The 1-bit allreduce gives every coordinate of a chunk the same magnitude,
 * the chunk's scale, so a coordinate whose frozen variance is 0 or tiny
 * (a pixel that is almost always black, a unit that almost never fires)
 * moves by up to lr * scale / (sqrt(v) + eps) per step: with eps = 1e-8,
 * far more than Adam would ever move it. After each compressed allreduce,
 * a masked coordinate's momentum is set to 0, so its parameter changes
 * only by weight decay.
 *
 * By default the mask is automatic: coordinate i is masked when
 * sqrt(v_i) <= ratio * sqrt(mean v) over the frozen v, with ratio
 * OBCOMM_ADAM_AUTO_MASK_RATIO (docs/convergence.md, "The momentum mask", has
 * the measurements behind the rule and the value). Without a warm-up
 * (freeze_step 0) v is 0 everywhere and every coordinate is masked:
 * 1-bit Adam needs the warm-up to estimate v. */
#define OBCOMM_ADAM_AUTO_MASK_RATIO 0.01f
/* Sets the automatic mask's ratio; 0 masks only coordinates whose frozen v
 * is exactly 0 (gradient exactly 0 through the warm-up); a negative ratio
 * turns the automatic mask off (the ablation). */
OBCOMM_API void obcomm_adam_set_auto_mask(obcomm_adam_t *a, float ratio);
/* Replaces the automatic mask with an explicit one: `keep` holds count
 * bytes, nonzero keeps the coordinate, 0 masks it; the optimizer copies
 * it. NULL returns to the automatic mask. Returns 0 or OBCOMM_E_NOMEM (the
 * previous mask then stays). The mask is not part of obcomm_adam_save's
 * file; the automatic one follows from v, so a load restores it. */
OBCOMM_API int obcomm_adam_set_mask(obcomm_adam_t *a, const uint8_t *keep);
/* Coordinates the mask holds at 0 (explicit, or automatic from the
 * current v; 0 when no mask is on). */
OBCOMM_API size_t obcomm_adam_masked(obcomm_adam_t *a);

/* A checkpoint of the whole optimizer, a collective: save asks every
 * daemon to save the job's error feedback (obcomm_save_1bit), then writes
 * step, m, v and the snapshot's id to `path` (atomically); it fails, and
 * writes nothing, unless every node saved. load reads such a file, brings
 * every daemon back to that snapshot (obcomm_restore_1bit) and only then
 * restores step, m and v: training continues bit for bit as if
 * uninterrupted, on the same daemons or restarted ones (with a
 * state_dir), or fails on every rank saying which node lacks the
 * snapshot or holds it damaged. */
/* The file: a 96-byte header, every field little-endian at a fixed offset
 * (magic "OBCMADAM", u32 version 3, u32 header bytes, u64 count, i64 step,
 * u64 key, f32 lr, beta1, beta2, eps, weight_decay, u32 bias_correction,
 * i64 freeze_step, u64 snapshot, u64 part bytes, u32 part's node, u32 0),
 * then m and v (count little-endian floats each), then the part. Files of
 * format 2 are still loaded. */
OBCOMM_API int obcomm_adam_save(obcomm_adam_t *a, const char *path);
OBCOMM_API int obcomm_adam_load(obcomm_adam_t *a, const char *path);
/* Several optimizers of one job saved as one checkpoint (the buckets of
 * a model): a snapshot set holds every key of the job, so the first save
 * takes it (snapshot 0, as obcomm_adam_save) and the others name it
 * (the snapshot field of the first file, at offset 72), and the first
 * load restores it while the others load with restore 0, their keys
 * restored already. A file named a set that is gone fails its restore,
 * on every rank. */
OBCOMM_API int obcomm_adam_save_ex(obcomm_adam_t *a, const char *path,
                                   uint64_t snapshot);
OBCOMM_API int obcomm_adam_load_ex(obcomm_adam_t *a, const char *path,
                                   int restore);

/* The optimizer's state for a caller's own checkpoint format (the Python
 * package's state dict), without the file: the steps taken and m and v,
 * count floats each, borrowed until the next step, set_state, load or
 * destroy. OBCOMM_E_INVAL while a step is started. The daemons' error
 * feedback is the caller's to save and restore with it
 * (obcomm_save_1bit, obcomm_export_1bit, obcomm_restore_1bit_part), as
 * obcomm_adam_save_ex and _load_ex do. */
OBCOMM_API int obcomm_adam_get_state(const obcomm_adam_t *a, long *step,
                                     const float **m, const float **v);
/* Copies step, m and v in (count floats each, borrowed) and takes cfg's
 * settings except lr (the schedule owns it; NULL keeps the settings), as
 * obcomm_adam_load_ex does from its file. OBCOMM_E_INVAL, and nothing
 * changed, while a step is started, for a negative step or for settings
 * obcomm_adam_create refuses. */
OBCOMM_API int obcomm_adam_set_state(obcomm_adam_t *a, long step,
                                     const obcomm_adam_config_t *cfg,
                                     const float *m, const float *v);

/* 0/1 Adam (Lu et al. 2022, arXiv 2202.06009), as DeepSpeed's ZeroOneAdam.
 * Stage 1, step t <= var_freeze_step: on steps where t % var_interval == 0
 * the gradients are averaged in full precision and m and v are updated;
 * on the others the gradients are averaged by obcomm_allreduce_1bit(key)
 * and only m is updated; var_interval starts at 1 and doubles after every
 * var_update_scaler variance updates. Stage 2: v is frozen and each rank
 * steps on its own gradient, accumulating its updates u; every
 * local_step_interval steps (1, doubling every local_step_scaler steps up
 * to local_step_clipper) u * (sqrt(v) + eps) is averaged 1 bit per element,
 * and every rank sets p to the last synchronized parameters plus the
 * average / (sqrt(v) + eps) and m to minus the average over the summed
 * learning rates. The key's error feedback is reset (obcomm_reset_1bit) on
 * the step the stages meet. The update is DeepSpeed's: no bias correction,
 * weight decay added to m / (sqrt(v) + eps). OneBitAdam's automatic mask,
 * with ratio OBCOMM_ZOADAM_AUTO_MASK_RATIO over v after each variance
 * update, zeroes the 1-bit averaged gradient and synchronized update of the
 * coordinates it holds. Every rank of the job creates it with the same key,
 * count and config and steps together; parameters then stay bitwise identical
 * on every rank after every stage-1 step and synchronization. A failed step
 * stops the run, as every failed op. */
typedef struct obcomm_zoadam obcomm_zoadam_t;
/* 0/1 Adam's default mask ratio, 3x OneBitAdam's: on the CNN of
 * docs/convergence.md ("0/1 Adam's mask") 0.01 let 2 of 4 seeds diverge
 * and 0.03 none. */
#define OBCOMM_ZOADAM_AUTO_MASK_RATIO 0.03f
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    long var_freeze_step, var_update_scaler, local_step_scaler,
        local_step_clipper;
} obcomm_zoadam_config_t;

/* DeepSpeed's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight
 * decay, var_freeze_step 100000, var_update_scaler 16, local_step_scaler
 * 32678, local_step_clipper 16. */
OBCOMM_API obcomm_zoadam_config_t obcomm_zoadam_defaults(void);
/* Borrows c. Keeps the gradient and u in shared memory, m, v, the frozen
 * denominators and the synchronized parameters in private memory (count
 * floats each). Caller frees with obcomm_zoadam_destroy. */
OBCOMM_API int obcomm_zoadam_create(obcomm_t *c, uint64_t key, size_t count,
                                    const obcomm_zoadam_config_t *cfg,
                                    obcomm_zoadam_t **out);
/* One step of params (count floats, any memory) from this rank's grads. A
 * collective on the steps that communicate; every rank calls it. */
OBCOMM_API int obcomm_zoadam_step(obcomm_zoadam_t *a, float *params,
                                  const float *grads);
OBCOMM_API void obcomm_zoadam_set_lr(obcomm_zoadam_t *a, float lr);
OBCOMM_API long obcomm_zoadam_steps(const obcomm_zoadam_t *a);
/* The collectives the steps issued: full precision and 1-bit. */
OBCOMM_API void obcomm_zoadam_rounds(const obcomm_zoadam_t *a, long *fp32,
                                     long *onebit);
OBCOMM_API void obcomm_zoadam_destroy(obcomm_zoadam_t *a);
/* Collectives with obcomm_adam_save's and _load's semantics: save has
 * every daemon save the run's error feedback as a snapshot set and writes
 * the optimizer's state (schedule, m, v, the accumulated updates, the
 * synchronized parameters, the snapshot's id, and this node's part of it
 * when its daemon keeps no state_dir) to path; load brings every daemon
 * back to that set and the optimizer to the file, so the run continues bit
 * for bit, or fails on every rank (the optimizer then stays as it was).
 * The parameters are the caller's to save. */
OBCOMM_API int obcomm_zoadam_save(obcomm_zoadam_t *a, const char *path);
OBCOMM_API int obcomm_zoadam_load(obcomm_zoadam_t *a, const char *path);
/* The automatic mask's ratio, as obcomm_adam_set_auto_mask's: 0 masks only
 * coordinates whose v is 0, a negative ratio turns the mask off. */
OBCOMM_API void obcomm_zoadam_set_auto_mask(obcomm_zoadam_t *a, float ratio);
/* Coordinates the mask holds at 0 now (0 before the first step). */
OBCOMM_API size_t obcomm_zoadam_masked(const obcomm_zoadam_t *a);

/* The optimizer's state for a caller's own checkpoint format (the Python
 * package's state dict): the schedule, and m, v, u (the updates since the
 * last synchronization) and x (the parameters at it), count floats each,
 * borrowed until the next step, set_state, load or destroy. The daemons'
 * error feedback is the caller's to save and restore with it
 * (obcomm_save_1bit, obcomm_restore_1bit_part). */
typedef struct {
    long step;
    int frozen;
    long var_interval, var_counter, local_interval, local_counter;
    double lrs; /* the learning rates summed since the last sync */
    long rounds_fp32, rounds_1bit;
} obcomm_zoadam_state_t;

OBCOMM_API void obcomm_zoadam_get_state(const obcomm_zoadam_t *a,
                                        obcomm_zoadam_state_t *s,
                                        const float **m, const float **v,
                                        const float **u, const float **x);
/* Copies a state in (x is read only when s->frozen); OBCOMM_E_INVAL, and
 * nothing changed, when the schedule is not one a run can reach. */
OBCOMM_API int obcomm_zoadam_set_state(obcomm_zoadam_t *a,
                                       const obcomm_zoadam_state_t *s,
                                       const float *m, const float *v,
                                       const float *u, const float *x);

/* 1-bit LAMB (Li et al. 2021, arXiv 2104.06069), as DeepSpeed's OnebitLamb,
 * over layers: the parameters are cut into n_layers contiguous layers
 * (elements layer_offsets[l] .. layer_offsets[l + 1]), each with its own
 * trust ratio. Norms, sums and the per-layer ratios are kept in double.
 *
 * Warm-up, steps 1 .. freeze_step: the gradients are averaged in full
 * precision; m = b1*m + (1-b1)*g, v = b2*v + (1-b2)*g*g; each layer moves
 * by lr * c * u, u = m / (sqrt(v) + eps) + weight_decay * p, where the
 * trust ratio c = |p| / |u| is clipped to [min_coeff, max_coeff] (1 when
 * either norm is 0); when c != 1 the layer's average ratio c_avg =
 * coeff_beta * c_avg + (1 - coeff_beta) * c. On step freeze_step the
 * fresh variance v' takes a copy of v. After the warm-up v is frozen:
 * d = sqrt(v) + eps.
 *
 * Compression stage: at its first step each layer's scale s is fixed as
 * the mean over the layers of the momenta's RMS over the layer's own (1
 * when the layer's RMS is 0). Each step, m = b1*m + (1-b1)*g with this
 * rank's g; each layer's m is multiplied by s, averaged with
 * obcomm_allreduce_1bit(key), divided by s; the mask zeroes the
 * coordinates it holds. The reconstructed gradient r = (m - b1*m_prev) /
 * (1-b1) updates v' = b2*v' + (1-b2)*r*r. Each layer's factor is the
 * largest d / (sqrt(v') + eps) over the layer; with weight decay it is
 * blended, f*q + (1-q), by q = min(1, |m/d| / |u|) (1 when |u| is 0); it
 * is clipped to [factor_min, factor_max] and to the previous factor (1 at
 * first) times [1 - factor_threshold, 1 + factor_threshold]; the layer
 * moves by lr * c_avg * f * u, u = m / d + weight_decay * p.
 *
 * No bias correction (DeepSpeed's update). OneBitAdam's automatic mask
 * (OBCOMM_ADAM_AUTO_MASK_RATIO over the frozen v, the rule of
 * obcomm_adam_set_auto_mask) holds the momentum of coordinates whose
 * variance is tiny. Every rank of the job creates it with the same key,
 * layers and config and steps together; parameters then stay bitwise
 * identical on every rank if they start so. A failed step leaves the
 * optimizer as it was (the step is not counted); it stops the run, as
 * every failed op. */
typedef struct obcomm_lamb obcomm_lamb_t;
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float max_coeff, min_coeff, coeff_beta;
    float factor_max, factor_min, factor_threshold;
    long freeze_step;
} obcomm_lamb_config_t;

/* DeepSpeed's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight
 * decay, freeze_step 100000, max_coeff 10, min_coeff 0.01, coeff_beta 0.9,
 * factor_max 4, factor_min 0.5, factor_threshold 0.1. */
OBCOMM_API obcomm_lamb_config_t obcomm_lamb_defaults(void);
/* Borrows c; copies layer_offsets (n_layers + 1 entries, 0 first, count
 * last, strictly increasing: OBCOMM_E_INVAL otherwise, also for a config
 * out of range). Keeps the gradient and m in shared memory, v, v', the
 * frozen denominators and a scratch copy in private memory (count floats
 * each). Caller frees with obcomm_lamb_destroy. */
OBCOMM_API int obcomm_lamb_create(obcomm_t *c, uint64_t key, size_t count,
                                  size_t n_layers, const size_t *layer_offsets,
                                  const obcomm_lamb_config_t *cfg,
                                  obcomm_lamb_t **out);
/* One step of params (count floats, any memory) from this rank's grads
 * (only read). A collective: every rank calls it. */
OBCOMM_API int obcomm_lamb_step(obcomm_lamb_t *a, float *params,
                                const float *grads);
OBCOMM_API void obcomm_lamb_set_lr(obcomm_lamb_t *a, float lr);
OBCOMM_API long obcomm_lamb_steps(const obcomm_lamb_t *a);
/* The collectives the steps issued: full precision and 1-bit. */
OBCOMM_API void obcomm_lamb_rounds(const obcomm_lamb_t *a, long *fp32,
                                   long *onebit);
/* The automatic mask's ratio, as obcomm_adam_set_auto_mask: 0 holds only
 * coordinates whose frozen v is 0, a negative ratio turns the mask off. */
OBCOMM_API void obcomm_lamb_set_auto_mask(obcomm_lamb_t *a, float ratio);
/* Coordinates the mask holds (0 before the variance is frozen). */
OBCOMM_API size_t obcomm_lamb_masked(const obcomm_lamb_t *a);
OBCOMM_API void obcomm_lamb_destroy(obcomm_lamb_t *a);
/* Collectives with obcomm_zoadam_save's and _load's semantics: save has
 * every daemon save the run's error feedback as a snapshot set and writes
 * the optimizer's state (step, stage, the layers, per layer c_avg, the
 * last factor and s, then m, v and v', the snapshot's id, and this node's
 * part of it when its daemon keeps no state_dir) to path; load checks the
 * whole file before any collective, brings every daemon back to that set
 * and the optimizer to the file (its config but the learning rate), so
 * the run continues bit for bit, or fails on every rank (the optimizer
 * then stays as it was): OBCOMM_E_CORRUPT for a damaged file or one of
 * other layers or key. The parameters are the caller's to save.
 *
 * The file: a 144-byte header, every field little-endian at a fixed
 * offset (magic "OBCMLAMB", u32 version 1, u32 header bytes, u64 count,
 * u64 n_layers, i64 step, u64 key, f32 lr, beta1, beta2, eps,
 * weight_decay, max_coeff, min_coeff, coeff_beta, factor_max, factor_min,
 * factor_threshold, u32 stage (0 warm-up, 1 frozen, 2 scales fixed), i64
 * freeze_step, i64 fp32 rounds, i64 1-bit rounds, u64 snapshot at 120, u64
 * part bytes, u32 part's node, u32 0), then the layer offsets (n_layers +
 * 1 u64), c_avg, the last factors and s (n_layers f64 each), m, v and v'
 * (count f32 each), then the part.
 *
 * save_ex and load_ex, as obcomm_adam_save_ex and _load_ex, save several
 * optimizers of one job as one checkpoint: snapshot 0 takes a new set, any
 * other names one taken already (its part is exported again); restore 0
 * loads without touching the daemons, whose set the caller restored. */
OBCOMM_API int obcomm_lamb_save(obcomm_lamb_t *a, const char *path);
OBCOMM_API int obcomm_lamb_load(obcomm_lamb_t *a, const char *path);
OBCOMM_API int obcomm_lamb_save_ex(obcomm_lamb_t *a, const char *path,
                                   uint64_t snapshot);
OBCOMM_API int obcomm_lamb_load_ex(obcomm_lamb_t *a, const char *path,
                                   int restore);

/* The optimizer's state for a caller's own checkpoint format (the Python
 * package's state dict), as obcomm_zoadam_get_state: the step, the stage
 * (0 warm-up, 1 frozen, 2 scales fixed) and the rounds; m, v and v' (count
 * floats each) and per layer c_avg, the last factor and s (n_layers
 * doubles each), borrowed until the next step, set_state, load or
 * destroy. The daemons' error feedback is the caller's to save and
 * restore with it. */
typedef struct {
    long step;
    int stage;
    long rounds_fp32, rounds_1bit;
} obcomm_lamb_state_t;

OBCOMM_API void obcomm_lamb_get_state(const obcomm_lamb_t *a,
                                      obcomm_lamb_state_t *s, const float **m,
                                      const float **v, const float **fresh,
                                      const double **coeff,
                                      const double **factor,
                                      const double **scale);
/* Copies a state in; OBCOMM_E_INVAL, and nothing changed, when the stage
 * does not fit the step and freeze_step or a per-layer value is not
 * finite (c_avg >= 0, the factor and s > 0), as obcomm_lamb_load checks. */
OBCOMM_API int obcomm_lamb_set_state(obcomm_lamb_t *a,
                                     const obcomm_lamb_state_t *s,
                                     const float *m, const float *v,
                                     const float *fresh, const double *coeff,
                                     const double *factor, const double *scale);

#ifdef __cplusplus
}
#endif

#endif
