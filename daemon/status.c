#include "status.h"

#include <obcomm.h>
#include <obcomm_build.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codec.h"
#include "daemon.h"
#include "efstore.h"
#include "job.h"
#include "ops.h"
#include "peers.h"
#include "wire.h"

static const char *const dtype_names[] = {
    [OBCOMM_FLOAT32] = "float32", [OBCOMM_FLOAT64] = "float64",
    [OBCOMM_FLOAT16] = "float16", [OBCOMM_BFLOAT16] = "bfloat16",
    [OBCOMM_INT32] = "int32",     [OBCOMM_INT64] = "int64",
};

/* Everything the reply points into, freed in one place. */
struct storage {
    Obcomm__PeerStatus *ps;
    Obcomm__PeerStatus **pp;
    char (*addr)[OBD_HOST_MAX + 8];
    Obcomm__JobStatus *js;
    Obcomm__JobStatus **jp;
    char (*inflight)[128];
    Obcomm__OpStatus *os;
    Obcomm__OpStatus **op;
    char (*opname)[32];
    char (*waiting)[160];
    char (*stopped)[OBD_STATUS_STOPPED_MAX];
    Obcomm__KeyStatus *ks;
    Obcomm__KeyStatus **kp;
    Obcomm__EfVersion *ev;
    Obcomm__Metric ms[OBD_M_COUNT];
    Obcomm__Metric *mp[OBD_M_COUNT];
    char prom[OBD_M_COUNT][64];
    Obcomm__Histogram hs[OBD_HK_COUNT * OBD_SC_COUNT];
    Obcomm__Histogram *hp[OBD_HK_COUNT * OBD_SC_COUNT];
    double le[OBD_HIST_BOUNDS];
    uint64_t cum[OBD_HK_COUNT * OBD_SC_COUNT][OBD_HIST_BOUNDS];
};

static void fill_peers(struct obd_daemon *d, Obcomm__StatusReply *r,
                       struct storage *s)
{
    int nodes = d->cfg.nodes;
    for (int i = 0; i < nodes; i++) {
        Obcomm__PeerStatus *p = &s->ps[i];
        obcomm__peer_status__init(p);
        p->rank = (uint32_t)i;
        obd_config_world_entry(&d->cfg, i, s->addr[i], sizeof(s->addr[i]));
        p->address = nodes > 1 ? s->addr[i] : (char *)"(one-node world)";
        if (i == d->cfg.rank) {
            p->state = (char *)"self";
        } else {
            const struct obd_peer *q = &d->peers[i];
            p->state = (char *)obd_peer_state_name(q->state);
            p->bytes_sent = q->bytes_sent;
            p->bytes_received = q->bytes_received;
            p->up_since_unix_ms =
                q->state == OBD_PEER_UP ? q->up_since_unix_ms : 0;
            p->reconnects = q->epoch > 1 ? q->epoch - 1 : 0;
            p->last_error = (char *)q->last_error;
            p->last_error_unix_ms = q->last_error_unix_ms;
            obd_peers_tcp_info(d, i, &p->rtt_us, &p->rttvar_us);
        }
        s->pp[i] = p;
    }
    r->n_peers = (size_t)nodes;
    r->peers = s->pp;
}

static void fill_op(struct obd_daemon *d, const struct obd_op *o,
                    Obcomm__OpStatus *m, char *name, size_t namelen,
                    char *waiting, size_t waitlen)
{
    const struct obd_job *job = o->job;
    /* Before every node agreed, desc is not set yet: show what a local
     * trainer asked for. */
    const struct obd_opdesc *desc = &o->desc;
    if (o->state == OBD_OP_COLLECT)
        for (int i = 0; i < job->local_size; i++)
            if (o->submitted[i]) {
                desc = &o->sub[i];
                break;
            }
    obcomm__op_status__init(m);
    m->seq = o->seq;
    m->op = (char *)obd_metrics_op_name(desc->kind, name, namelen);
    m->state = (char *)(o->state == OBD_OP_RUN ? "running" : "collecting");
    m->age_ms = (uv_hrtime() - o->created_ns) / 1000000;
    m->submitted = (uint32_t)o->nsubmitted;
    m->count = desc->count;
    m->dtype = (char *)(desc->kind == OBCOMM_KIND_ALLREDUCE &&
                                desc->dtype <
                                    sizeof(dtype_names) / sizeof(dtype_names[0])
                            ? dtype_names[desc->dtype]
                            : "");
    m->key = desc->key;
    obd_job_op_waiting(o, waiting, waitlen);
    m->waiting_for = waiting;
    (void)d;
}

/* Root sees every job; any other user only the jobs it owns. */
static int may_see(uid_t uid, const struct obd_job *j)
{
    return uid == 0 || (j->owned && j->owner == uid);
}

/* Payload bytes a node sends in a 1-bit op of `count` elements among
 * `nodes` (coll_onebit.c): in the parameter-server phase its packed signs
 * and 4-byte scale of each other node's chunk, then in the ring
 * allgather nodes - 1 chunks' signs and scales. */
static uint64_t onebit_op_bytes(uint64_t count, int nodes)
{
    if (nodes < 2)
        return 0;
    size_t chunk = obd_codec_padded_len((size_t)count, nodes) / (size_t)nodes;
    return 2 * (uint64_t)(nodes - 1) *
           (obd_codec_packed_bytes(chunk) + sizeof(float));
}

/* The job's run, why it stopped, and its 1-bit keys with their versions
 * and bytes per op. */
static void fill_run(struct obd_daemon *d, const struct obd_job *j,
                     Obcomm__JobStatus *m, struct storage *s, size_t nj,
                     size_t *nk)
{
    m->run = j->run;
    snprintf(s->stopped[nj], sizeof(s->stopped[nj]), "%s", j->stopped);
    m->stopped = s->stopped[nj];
    const struct obd_ef *efs[OBD_STATUS_KEYS_MAX];
    int n = obd_efstore_keys(d, j->name, j->run, efs, OBD_STATUS_KEYS_MAX);
    m->keys = &s->kp[*nk];
    for (int i = 0; i < n && *nk < OBD_STATUS_KEYS_TOTAL; i++, (*nk)++) {
        Obcomm__KeyStatus *k = &s->ks[*nk];
        Obcomm__EfVersion *v = &s->ev[*nk];
        obcomm__key_status__init(k);
        obcomm__ef_version__init(v);
        k->key = efs[i]->key;
        k->count = efs[i]->count;
        k->op_bytes = onebit_op_bytes(k->count, d->cfg.nodes);
        v->origin = efs[i]->version.origin;
        v->applied = efs[i]->version.applied;
        v->last_seq = efs[i]->version.last_seq;
        k->version = v;
        s->kp[*nk] = k;
        m->n_keys++;
    }
}

static void fill_jobs(struct obd_daemon *d, uid_t uid, Obcomm__StatusReply *r,
                      struct storage *s)
{
    size_t nj = 0, no = 0, nk = 0;
    for (struct obd_job *j = obd_job_next(d, NULL); j; j = obd_job_next(d, j)) {
        /* A job that no local trainer ever joined exists here only
         * because another node announced it: nothing to show. */
        if (j->local_size == 0 || !may_see(uid, j))
            continue;
        if (nj == OBD_STATUS_JOBS_MAX) {
            r->jobs_omitted++;
            continue;
        }
        Obcomm__JobStatus *m = &s->js[nj];
        obcomm__job_status__init(m);
        m->name = j->name;
        m->local_size = (uint32_t)j->local_size;
        m->joined = (uint32_t)j->joined;
        m->next_seq = j->next_seq;
        fill_run(d, j, m, s, nj, &nk);
        m->ops = &s->op[no];
        for (struct obd_op *o = obd_job_next_open(j, NULL); o;
             o = obd_job_next_open(j, o)) {
            if (m->n_ops == OBD_STATUS_OPS_MAX || no == OBD_STATUS_OPS_TOTAL) {
                m->ops_omitted++;
                continue;
            }
            fill_op(d, o, &s->os[no], s->opname[no], sizeof(s->opname[no]),
                    s->waiting[no], sizeof(s->waiting[no]));
            s->op[no] = &s->os[no];
            if (m->n_ops == 0)
                snprintf(s->inflight[nj], sizeof(s->inflight[nj]),
                         "seq %llu %s: %s (%d of %d local submitted)",
                         (unsigned long long)o->seq, s->os[no].op,
                         s->os[no].state, o->nsubmitted, j->local_size);
            m->n_ops++;
            no++;
        }
        m->op_in_flight = s->inflight[nj];
        s->jp[nj] = m;
        nj++;
    }
    r->n_jobs = nj;
    r->jobs = s->jp;
}

static void fill_metrics(struct obd_daemon *d, Obcomm__StatusReply *r,
                         struct storage *s)
{
    for (int i = 0; i < OBD_M_COUNT; i++) {
        const struct obd_metric_desc *desc = &obd_metric_descs[i];
        Obcomm__Metric *m = &s->ms[i];
        obcomm__metric__init(m);
        m->name = (char *)desc->name;
        m->help = (char *)desc->help;
        m->kind = (char *)desc->kind;
        m->value = (double)d->metrics.v[i];
        m->prom_divisor =
            obd_metrics_prom(desc, s->prom[i], sizeof(s->prom[i]));
        m->prom_name = s->prom[i];
        s->mp[i] = m;
    }
    r->n_metrics = OBD_M_COUNT;
    r->metrics = s->mp;

    char hprom[64];
    double div = obd_metrics_prom(&obd_hist_desc, hprom, sizeof(hprom));
    for (int b = 0; b < OBD_HIST_BOUNDS; b++)
        s->le[b] = (double)obd_hist_bounds_us[b] / div;
    size_t n = 0;
    for (int k = 0; k < OBD_HK_COUNT; k++)
        for (int c = 0; c < OBD_SC_COUNT; c++, n++) {
            const struct obd_hist *h = &d->metrics.latency[k][c];
            Obcomm__Histogram *m = &s->hs[n];
            obcomm__histogram__init(m);
            m->name = (char *)obd_hist_desc.name;
            m->help = (char *)obd_hist_desc.help;
            m->prom_name = (char *)obd_hist_desc.prom;
            m->op = (char *)obd_hist_kind_names[k];
            m->size_class = (char *)obd_size_class_names[c];
            m->n_le_seconds = OBD_HIST_BOUNDS;
            m->le_seconds = s->le;
            uint64_t acc = 0;
            for (int b = 0; b < OBD_HIST_BOUNDS; b++) {
                acc += h->buckets[b];
                s->cum[n][b] = acc;
            }
            m->n_buckets = OBD_HIST_BOUNDS;
            m->buckets = s->cum[n];
            m->count = h->count;
            m->sum_seconds = (double)h->sum_us / div;
            s->hp[n] = m;
        }
    r->n_histograms = n;
    r->histograms = s->hp;
}

void obd_status_handle(struct obd_daemon *d, uid_t uid,
                       void (*send)(void *arg, const ProtobufCMessage *msg),
                       void *arg)
{
    Obcomm__StatusReply r = OBCOMM__STATUS_REPLY__INIT;
    Obcomm__DaemonMsg msg = OBCOMM__DAEMON_MSG__INIT;
    size_t nodes = (size_t)d->cfg.nodes;
    size_t jobs = OBD_STATUS_JOBS_MAX;
    size_t ops = OBD_STATUS_OPS_TOTAL;

    struct storage *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return;
    s->ps = calloc(nodes, sizeof(*s->ps));
    s->pp = calloc(nodes, sizeof(*s->pp));
    s->addr = calloc(nodes, sizeof(*s->addr));
    s->js = calloc(jobs, sizeof(*s->js));
    s->jp = calloc(jobs, sizeof(*s->jp));
    s->inflight = calloc(jobs, sizeof(*s->inflight));
    s->os = calloc(ops, sizeof(*s->os));
    s->op = calloc(ops, sizeof(*s->op));
    s->opname = calloc(ops, sizeof(*s->opname));
    s->waiting = calloc(ops, sizeof(*s->waiting));
    s->stopped = calloc(jobs, sizeof(*s->stopped));
    s->ks = calloc(OBD_STATUS_KEYS_TOTAL, sizeof(*s->ks));
    s->kp = calloc(OBD_STATUS_KEYS_TOTAL, sizeof(*s->kp));
    s->ev = calloc(OBD_STATUS_KEYS_TOTAL, sizeof(*s->ev));
    if (!s->ps || !s->pp || !s->addr || !s->js || !s->jp || !s->inflight ||
        !s->os || !s->op || !s->opname || !s->waiting || !s->stopped ||
        !s->ks || !s->kp || !s->ev)
        goto out;

    r.version = (char *)OBCOMM_VERSION;
    r.proto_version = OBCOMM_PROTO_VERSION;
    r.codec = (char *)obd_codec_best()->name;
    r.build = (char *)OBCOMM_BUILD_OPTIONS;
    r.cluster = d->cfg.cluster;
    r.rank = (uint32_t)d->cfg.rank;
    r.world_size = (uint32_t)nodes;
    r.uptime_ms = uv_now(&d->loop) - d->start_ms;
    r.now_unix_ms = obd_metrics_unix_ms();
    r.pid = (uint32_t)getpid();
    r.socket = d->cfg.socket;
    fill_peers(d, &r, s);
    fill_jobs(d, uid, &r, s);
    fill_metrics(d, &r, s);

    msg.body_case = OBCOMM__DAEMON_MSG__BODY_STATUS;
    msg.status = &r;
    send(arg, &msg.base);
out:
    free(s->ps);
    free(s->pp);
    free(s->addr);
    free(s->js);
    free(s->jp);
    free(s->inflight);
    free(s->os);
    free(s->op);
    free(s->opname);
    free(s->waiting);
    free(s->stopped);
    free(s->ks);
    free(s->kp);
    free(s->ev);
    free(s);
}
