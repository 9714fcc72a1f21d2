/* Counters of the daemon. Each has a static descriptor {name, help, kind};
 * the status reply and obcommctl render from the descriptors. */
#ifndef OBD_METRICS_H
#define OBD_METRICS_H

#include <stdint.h>

enum obd_metric_id {
    OBD_M_OPS_COMPLETED,
    OBD_M_OPS_FAILED,
    OBD_M_OPS_TIMEOUT,
    OBD_M_OPS_MISMATCH,
    OBD_M_BYTES_SENT,
    OBD_M_BYTES_RECEIVED,
    OBD_M_ALLREDUCE_BYTES_SENT,
    OBD_M_BROADCAST_BYTES_SENT,
    OBD_M_CTRL_BYTES_SENT,
    OBD_M_LOGICAL_BYTES,
    OBD_M_OP_LATENCY_US_SUM,
    OBD_M_OP_LATENCY_US_MAX,
    OBD_M_LINKS_UP,
    OBD_M_LINK_ERRORS,
    OBD_M_FRAMES_REJECTED,
    OBD_M_AUTH_FAILURES,
    OBD_M_UNAUTH_CLOSED,
    OBD_M_ACCEPT_PAUSES,
    OBD_M_CLIENTS,
    OBD_M_CLIENT_ERRORS,
    OBD_M_SHM_BYTES,
    OBD_M_ONEBIT_OPS,
    OBD_M_ONEBIT_LATENCY_US_SUM,
    OBD_M_ALLREDUCE_OPS,
    OBD_M_ALLREDUCE_LATENCY_US_SUM,
    OBD_M_ONEBIT_BYTES_SENT,
    OBD_M_ONEBIT_LOGICAL_BYTES,
    OBD_M_EF_STATE_BYTES,
    OBD_M_EF_RESTORED,
    OBD_M_EF_RESETS,
    OBD_M_EF_REJECTED,
    OBD_M_EF_SAVED,
    OBD_M_EF_EVICTIONS,
    OBD_M_EF_LIMIT_REFUSALS,
    OBD_M_COUNT
};

struct obd_metric_desc {
    const char *name;
    const char *help;
    const char *kind; /* "counter" or "gauge" */
};

struct obd_metrics {
    uint64_t v[OBD_M_COUNT];
};

extern const struct obd_metric_desc obd_metric_descs[OBD_M_COUNT];

static inline void obd_metric_add(struct obd_metrics *m, enum obd_metric_id id,
                                  uint64_t n)
{
    m->v[id] += n;
}

static inline void obd_metric_max(struct obd_metrics *m, enum obd_metric_id id,
                                  uint64_t n)
{
    if (n > m->v[id])
        m->v[id] = n;
}

#endif
