/* Counters of the daemon. Each has a static descriptor {name, help, kind};
 * the status reply and obcommctl render from the descriptors. */
#ifndef OBD_METRICS_H
#define OBD_METRICS_H

#include <stddef.h>
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
    OBD_M_EF_RETAINED_BYTES,
    OBD_M_EF_RESTORED,
    OBD_M_EF_RESETS,
    OBD_M_EF_REJECTED,
    OBD_M_EF_SAVED,
    OBD_M_EF_DISAGREED,
    OBD_M_RUNS_STOPPED,
    OBD_M_EF_LIMIT_REFUSALS,
    OBD_M_PEER_TIMEOUTS,
    OBD_M_ALLGATHER_BYTES_SENT,
    OBD_M_REDUCE_SCATTER_BYTES_SENT,
    OBD_M_LOCAL_BYTES_WRITTEN,
    OBD_M_SEGBUFS_ALLOCATED,
    OBD_M_COUNT
};

struct obd_metric_desc {
    const char *name;
    const char *help;
    const char *kind; /* "counter" or "gauge" */
    /* The Prometheus name (without "obcomm_") and the divisor to its unit
     * (1e6: microseconds to seconds), when the defaults do not fit: NULL
     * means name + "_total" for a counter and name for a gauge; 0 means
     * 1. A divisor, not a factor: 100 / 1e6 is exactly 0.0001, while
     * 100 * 1e-6 is 9.999999999999999e-05. */
    const char *prom;
    double prom_div;
};

/* Latency histograms: one series per op kind and size class, with fixed
 * bucket bounds in microseconds (the last bucket is +Inf). */
#define OBD_HIST_BOUNDS 16
enum obd_hist_kind {
    OBD_HK_ALLREDUCE,
    OBD_HK_ALLREDUCE_1BIT,
    OBD_HK_BROADCAST,
    OBD_HK_BARRIER,
    OBD_HK_ALLGATHER,
    OBD_HK_REDUCE_SCATTER,
    OBD_HK_COUNT
};
/* Label values name the upper bound: "1MiB" is 64 KiB < bytes <= 1 MiB. */
enum obd_size_class {
    OBD_SC_64K,  /* up to 64 KiB of tensor */
    OBD_SC_1M,   /* up to 1 MiB */
    OBD_SC_16M,  /* up to 16 MiB */
    OBD_SC_HUGE, /* more */
    OBD_SC_COUNT
};

struct obd_hist {
    uint64_t buckets[OBD_HIST_BOUNDS + 1]; /* not cumulative; last: +Inf */
    uint64_t count;
    uint64_t sum_us;
};

struct obd_metrics {
    uint64_t v[OBD_M_COUNT];
    struct obd_hist latency[OBD_HK_COUNT][OBD_SC_COUNT];
};

extern const struct obd_metric_desc obd_metric_descs[OBD_M_COUNT];

/* The histogram's descriptor, bounds and label values. */
extern const struct obd_metric_desc obd_hist_desc;
extern const uint64_t obd_hist_bounds_us[OBD_HIST_BOUNDS];
extern const char *const obd_hist_kind_names[OBD_HK_COUNT];
extern const char *const obd_size_class_names[OBD_SC_COUNT];

/* Records one completed op of Submit kind `kind` (proto/ops.h) over
 * `count` elements of `dtype` that took `us` microseconds. Kinds without a
 * histogram are ignored. */
void obd_metrics_observe(struct obd_metrics *m, uint32_t kind, uint32_t dtype,
                         uint64_t count, uint64_t us);

/* Names an op kind of proto/ops.h ("allreduce", ...; "kind N" for others,
 * written into buf). */
const char *obd_metrics_op_name(uint32_t kind, char *buf, size_t len);

/* Writes descriptor d's Prometheus name into buf and returns its
 * divisor. */
double obd_metrics_prom(const struct obd_metric_desc *d, char *buf, size_t len);

/* Wall-clock milliseconds since the epoch, for "up since" times. */
uint64_t obd_metrics_unix_ms(void);

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
