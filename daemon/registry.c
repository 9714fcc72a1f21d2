/* The jobs of this node by name and id (job_impl.h): create, route a
 * peer's message to its run, detach, and each job's turn on the ready
 * queue. */
#include "err.h"
#include "job_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void job_run(struct obd_ready *r);

struct obd_job *obd_job_find(struct obd_daemon *d, const char *name)
{
    for (struct obd_job *j = d->jobs; j; j = j->next)
        if (strcmp(j->name, name) == 0)
            return j;
    return NULL;
}

struct obd_job *obd_job_find_id(struct obd_daemon *d, uint32_t id)
{
    for (struct obd_job *j = d->jobs; j; j = j->next)
        if (j->id == id)
            return j;
    return NULL;
}

/* 1 if node `node`'s run `run` of job `id` ended here. */
static int run_ended(const struct obd_daemon *d, uint32_t id, int node,
                     uint64_t run)
{
    for (int i = 0; i < OBD_RUNS_ENDED; i++) {
        const struct obd_run_ended *e = &d->runs_ended[i];
        if (e->run == run && e->job == id && e->node == node)
            return 1;
    }
    return 0;
}

/* Takes the job out of the daemon's list: no trainer, announce or frame
 * finds it any more, and the other nodes' runs it saw are remembered as
 * ended. It is freed by its own turn (job_run) once it has no trainers
 * and no ops. */
void obd_registry_detach(struct obd_job *job)
{
    struct obd_daemon *d = job->d;
    for (struct obd_job **pp = &d->jobs; *pp; pp = &(*pp)->next)
        if (*pp == job) {
            *pp = job->next;
            break;
        }
    job->next = NULL;
    job->detached = 1;
    d->njobs--;
    for (int n = 0; n < d->cfg.nodes; n++)
        if (job->seen_run[n] != 0 &&
            !run_ended(d, job->id, n, job->seen_run[n])) {
            struct obd_run_ended *e =
                &d->runs_ended[d->runs_ended_next++ % OBD_RUNS_ENDED];
            *e = (struct obd_run_ended){job->id, n, job->seen_run[n]};
        }
}

/* A new job named `name` in *out; 0, or with why: OBD_E_INVAL (a name of
 * no bytes or too many), OBD_E_EXISTS (another job's name hashes to the
 * same wire id), OBD_E_BUSY (the daemon holds max_jobs jobs), OBD_E_NOMEM. */
int obd_registry_create(struct obd_daemon *d, const char *name,
                        struct obd_job **out, char *why, size_t whylen)
{
    if (name[0] == '\0' || strlen(name) >= OBD_JOB_NAME) {
        snprintf(why, whylen, "job name must be 1 to %d bytes",
                 OBD_JOB_NAME - 1);
        return OBD_E_INVAL;
    }
    uint32_t id = obd_frame_job_id(name);
    struct obd_job *other = obd_job_find_id(d, id);
    if (other != NULL) {
        snprintf(why, whylen, "job names '%s' and '%s' collide; rename one",
                 name, other->name);
        return OBD_E_EXISTS;
    }
    if (d->njobs >= d->cfg.max_jobs) {
        snprintf(why, whylen,
                 "node %lld holds %d jobs, max_jobs is %lld: wait for one to "
                 "end or raise max_jobs",
                 (long long)d->cfg.rank, d->njobs, (long long)d->cfg.max_jobs);
        return OBD_E_BUSY;
    }
    struct obd_job *job = calloc(1, sizeof(*job));
    uint64_t *node_run = calloc((size_t)d->cfg.nodes, sizeof(*node_run));
    uint64_t *seen_run = calloc((size_t)d->cfg.nodes, sizeof(*seen_run));
    if (job == NULL || node_run == NULL || seen_run == NULL) {
        free(job);
        free(node_run);
        free(seen_run);
        snprintf(why, whylen, "out of memory");
        return OBD_E_NOMEM;
    }
    job->node_run = node_run;
    job->seen_run = seen_run;
    job->d = d;
    strcpy(job->name, name);
    job->id = id;
    job->timeout_ms = (int)d->cfg.timeout_ms;
    job->ready.run = job_run;
    job->next = d->jobs;
    d->jobs = job;
    d->njobs++;
    *out = job;
    return 0;
}

/* Node `from`'s trainers of `job` started a new run: this node's run of
 * the job is over (docs/design.md, "A new run never waits"). The job
 * leaves the list first, so that its ops fail here alone (a detached job
 * sends nothing), then stops: its open ops and every later op of its
 * trainers still joined fail at once. A run stopped before keeps its
 * first reason. */
static void job_end_run(struct obd_job *job, int from)
{
    struct obd_daemon *d = job->d;
    char what[240];
    snprintf(what, sizeof(what),
             "node %d started a new run of job %s (its trainers restarted); "
             "this run is over: restart every trainer of the job",
             from, job->name);
    obd_log_info(&d->log,
                 "job %s: node %d started a new run; the run here "
                 "ends (%d trainers still joined)",
                 job->name, from, job->joined);
    obd_registry_detach(job);
    obd_op_stop_run(job, job->next_seq, OBD_E_PEER_LOST, what, job->joined > 0);
    obd_runq_post(&d->runq, &job->ready);
}

/* The job a message of node `from` about job `name` in the sender's run
 * `run` belongs to, or NULL when none does (create == 0, or the job could
 * not be made: logged) or the message is of a run that ended here
 * (dropped). A run this node's job has not seen from that node before
 * ends the job's run here (job_end_run) and goes to a new job. run 0
 * comes from a node where no trainer joined the job: its message belongs
 * to whatever run is here. */
struct obd_job *obd_registry_route(struct obd_daemon *d, int from,
                                   const char *name, uint64_t run, int create)
{
    struct obd_job *job = obd_job_find(d, name);
    if (job != NULL && (run == 0 || job->seen_run[from] == run))
        return job; /* the run here, as most messages are */
    if (run != 0 && run_ended(d, obd_frame_job_id(name), from, run))
        return NULL;
    if (job != NULL && run != 0 && job->seen_run[from] != 0 &&
        job->seen_run[from] != run) {
        job_end_run(job, from);
        job = NULL;
    }
    if (job == NULL) {
        char why[160];
        if (!create)
            return NULL;
        if (obd_registry_create(d, name, &job, why, sizeof(why)) != 0) {
            obd_log_warn(&d->log, "a message from node %d for job %s: %s", from,
                         name, why);
            return NULL;
        }
        obd_runq_post(&d->runq, &job->ready); /* frees a job made in vain */
    }
    if (job->seen_run[from] == 0)
        job->seen_run[from] = run;
    return job;
}

/* Starts ready ops, retires what can go and frees the job once it has
 * neither trainers nor ops. */
static void job_run(struct obd_ready *r)
{
    struct obd_job *job = container_of(r, struct obd_job, ready);
    obd_op_advance_seq(job);
    for (struct obd_op *o = job->ops; o; o = o->next)
        obd_match_announce(o); /* those that waited for earlier ops */
    obd_op_start_next(job);
    if (job->joined > 0 || job->live > 0)
        return;
    if (!job->detached)
        obd_registry_detach(job);
    obd_runq_cancel(&job->d->runq, &job->ready);
    free(job->node_run);
    free(job->seen_run);
    free(job);
}
