/* Data frames from the mesh to the op that waits for them (job.h's
 * obd_job_data_*, the hooks peers.c calls). */
#include "err.h"
#include "job_impl.h"

#include "coll.h"

struct obd_op *obd_job_op(struct obd_daemon *d, uint32_t job_id, uint64_t seq)
{
    struct obd_job *job = obd_job_find_id(d, job_id);
    return job ? obd_op_find(job, seq) : NULL;
}

/* ---- data frames from the mesh ---- */

enum obd_data_dest obd_job_data_begin(struct obd_daemon *d, int from,
                                      const struct obd_frame *f, void **dst,
                                      void **token)
{
    struct obd_op *op = obd_job_op(d, f->job, f->seq);
    if (op == NULL)
        return OBD_DATA_DISCARD;
    if (op->state == OBD_OP_COLLECT)
        /* The sender runs an op this node never announced: it holds an
         * announce of ours that this op never made, so its data belongs to
         * an earlier incarnation of the job (dropped here, the op re-created
         * by the sender's late announce). Parking would stop this link, and
         * every other job's frames behind it, until the op's deadline. */
        return OBD_DATA_DISCARD;
    if (op->state < OBD_OP_RUN)
        /* The sender has every announce, this node not yet: the op starts
         * here soon (or fails on its deadline). Until then the link stops
         * reading, which pushes back on the sender through TCP. */
        return OBD_DATA_PARK;
    if (op->state != OBD_OP_RUN)
        return OBD_DATA_DISCARD;
    if (op->fingerprint != f->fingerprint) {
        /* The sender runs another op under this (job, seq): the op can
         * never complete, and every node hears so now. */
        obd_metric_add(&d->metrics, OBD_M_FRAMES_REJECTED, 1);
        obd_op_set_failed(
            op, OBD_E_PROTO, 1,
            "op %llu of job %s: node %d sent a frame with fingerprint "
            "%016llx; the op agreed here has %016llx",
            (unsigned long long)op->seq, op->job->name, from,
            (unsigned long long)f->fingerprint,
            (unsigned long long)op->fingerprint);
        return OBD_DATA_DISCARD;
    }
    const char *why = "unexpected frame";
    void *p = obd_coll_algo(op->desc.kind)->recv_dest(op, from, f, &why);
    if (p == NULL) {
        obd_metric_add(&d->metrics, OBD_M_FRAMES_REJECTED, 1);
        obd_op_set_failed(
            op, OBD_E_PROTO, 1,
            "op %llu of job %s: node %d sent step %u segment %u of "
            "%u bytes: %s",
            (unsigned long long)op->seq, op->job->name, from, f->step,
            f->segment, f->len, why);
        return OBD_DATA_DISCARD;
    }
    op->refs++;
    *dst = p;
    *token = op;
    return OBD_DATA_INTO;
}

int obd_job_data_live(void *token)
{
    const struct obd_op *op = token;
    return op->state == OBD_OP_RUN;
}

void obd_job_data_end(void *token, int from, const struct obd_frame *f,
                      int complete)
{
    struct obd_op *op = token;
    if (complete && op->state == OBD_OP_RUN)
        obd_coll_algo(op->desc.kind)->recv_done(op, from, f);
    op->refs--;
    obd_op_schedule(op);
}
