#include "metrics.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ops.h"
#include "reduce.h"

const struct obd_metric_desc obd_metric_descs[OBD_M_COUNT] = {
    [OBD_M_OPS_COMPLETED] = {"ops_completed", "Collectives completed",
                             "counter"},
    [OBD_M_OPS_FAILED] = {"ops_failed", "Collectives failed for any reason",
                          "counter"},
    [OBD_M_OPS_TIMEOUT] = {"ops_timeout",
                           "Collectives that passed their deadline", "counter"},
    [OBD_M_OPS_MISMATCH] = {"ops_mismatch",
                            "Collectives that ranks issued differently",
                            "counter"},
    [OBD_M_BYTES_SENT] = {"bytes_sent",
                          "Bytes written to peer daemons (headers included)",
                          "counter"},
    [OBD_M_BYTES_RECEIVED] = {"bytes_received",
                              "Bytes read from peer daemons (headers included)",
                              "counter"},
    [OBD_M_ALLREDUCE_BYTES_SENT] =
        {"allreduce_bytes_sent",
         "Payload bytes sent for full-precision allreduce", "counter"},
    [OBD_M_BROADCAST_BYTES_SENT] = {"broadcast_bytes_sent",
                                    "Payload bytes sent for broadcast",
                                    "counter"},
    [OBD_M_CTRL_BYTES_SENT] = {"ctrl_bytes_sent",
                               "Bytes of control frames sent", "counter"},
    [OBD_M_LOGICAL_BYTES] =
        {"logical_bytes", "Bytes of the tensors the node's collectives covered",
         "counter"},
    [OBD_M_OP_LATENCY_US_SUM] =
        {"op_latency_us_sum", "Sum of op latencies, first submit to completion",
         "counter", "op_latency_seconds_total", 1e6},
    [OBD_M_OP_LATENCY_US_MAX] = {"op_latency_us_max", "Largest op latency",
                                 "gauge", "op_latency_max_seconds", 1e6},
    [OBD_M_LINKS_UP] = {"links_up", "Peer links past the handshake", "gauge"},
    [OBD_M_LINK_ERRORS] = {"link_errors",
                           "Peer links closed on error or refused", "counter"},
    [OBD_M_FRAMES_REJECTED] = {"frames_rejected", "Malformed frames from peers",
                               "counter"},
    [OBD_M_AUTH_FAILURES] = {"auth_failures",
                             "Peer handshakes that failed the cluster key "
                             "or a frame tag",
                             "counter"},
    [OBD_M_UNAUTH_CLOSED] = {"unauth_closed",
                             "Unauthenticated peer connections closed over "
                             "max_unauth_links or max_unauth_per_addr",
                             "counter"},
    [OBD_M_ACCEPT_PAUSES] = {"accept_pauses",
                             "Times accepting paused for want of file "
                             "descriptors (peer listener and Unix socket)",
                             "counter"},
    [OBD_M_CLIENTS] = {"clients", "Unix-socket connections", "gauge"},
    [OBD_M_CLIENT_ERRORS] = {"client_errors",
                             "Unix-socket connections closed for bad input",
                             "counter"},
    [OBD_M_SHM_BYTES] = {"shm_bytes", "Bytes of trainer shared memory mapped",
                         "gauge"},
    [OBD_M_ONEBIT_OPS] = {"onebit_ops", "1-bit allreduces completed",
                          "counter"},
    [OBD_M_ONEBIT_LATENCY_US_SUM] = {"onebit_latency_us_sum",
                                     "Sum of 1-bit allreduce latencies",
                                     "counter", "onebit_latency_seconds_total",
                                     1e6},
    [OBD_M_ALLREDUCE_OPS] = {"allreduce_ops",
                             "Full-precision allreduces completed", "counter"},
    [OBD_M_ALLREDUCE_LATENCY_US_SUM] = {"allreduce_latency_us_sum",
                                        "Sum of full-precision allreduce "
                                        "latencies",
                                        "counter",
                                        "allreduce_latency_seconds_total", 1e6},
    [OBD_M_ONEBIT_BYTES_SENT] = {"onebit_bytes_sent",
                                 "Bytes sent for 1-bit allreduce, frame "
                                 "headers included (the wire bytes)",
                                 "counter"},
    [OBD_M_ONEBIT_LOGICAL_BYTES] = {"onebit_logical_bytes",
                                    "fp32 bytes of the tensors the 1-bit "
                                    "allreduces covered",
                                    "counter"},
    [OBD_M_EF_STATE_BYTES] = {"ef_state_bytes",
                              "Memory held by the 1-bit error feedback of "
                              "live runs (bounded by ef_max_bytes)",
                              "gauge"},
    [OBD_M_EF_RETAINED_BYTES] = {"ef_retained_bytes",
                                 "Memory held by snapshot sets kept in "
                                 "memory without a state_dir (bounded by "
                                 "retained_sets_max_bytes)",
                                 "gauge"},
    [OBD_M_EF_RESTORED] = {"ef_restored",
                           "Error-feedback states restored from snapshot sets",
                           "counter"},
    [OBD_M_EF_RESETS] = {"ef_resets",
                         "Error-feedback states reset to zero by a failed "
                         "op, a disagreement or a failed restore",
                         "counter"},
    [OBD_M_EF_REJECTED] = {"ef_rejected",
                           "Snapshot sets found damaged or unreadable here (at "
                           "a restore), or not written",
                           "counter"},
    [OBD_M_EF_SAVED] = {"ef_saved",
                        "Error-feedback states saved into snapshot sets",
                        "counter"},
    [OBD_M_EF_DISAGREED] = {"ef_disagreed",
                            "1-bit ops failed because the nodes held "
                            "different versions of the error feedback",
                            "counter"},
    [OBD_M_RUNS_STOPPED] = {"runs_stopped",
                            "Runs of jobs stopped by a failed op (their "
                            "later ops fail at once)",
                            "counter"},
    [OBD_M_EF_LIMIT_REFUSALS] = {"ef_limit_refusals",
                                 "1-bit ops refused because a new key's "
                                 "state would pass ef_max_bytes",
                                 "counter"},
    [OBD_M_PEER_TIMEOUTS] = {"peer_timeouts",
                             "Peer links declared down after nothing "
                             "arrived for peer_timeout_ms",
                             "counter"},
    [OBD_M_ALLGATHER_BYTES_SENT] = {"allgather_bytes_sent",
                                    "Payload bytes sent for allgather",
                                    "counter"},
    [OBD_M_REDUCE_SCATTER_BYTES_SENT] =
        {"reduce_scatter_bytes_sent", "Payload bytes sent for reduce-scatter",
         "counter"},
    [OBD_M_LOCAL_BYTES_WRITTEN] =
        {"local_bytes_written",
         "Bytes the node's own arithmetic wrote: the full-precision "
         "collectives' loads, reductions, stores, divisions and copies, and "
         "the one-node 1-bit average (none for an allreduce over one rank)",
         "counter"},
    [OBD_M_SEGBUFS_ALLOCATED] = {"segment_buffers_allocated",
                                 "Segment buffers allocated afresh (not "
                                 "reused from an earlier op)",
                                 "counter"},
};

const struct obd_metric_desc obd_hist_desc = {
    "op_latency", "Op latency, first submit to completion, by op and size",
    "histogram", "op_latency_seconds", 1e6};

/* 100 us to 10 s in 1-2.5-5 steps: a loopback barrier lands in the first
 * buckets, a large 1-bit allreduce over 1 GbE in the last. */
const uint64_t obd_hist_bounds_us[OBD_HIST_BOUNDS] = {
    100,   250,    500,    1000,   2500,    5000,    10000,   25000,
    50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000};

const char *const obd_hist_kind_names[OBD_HK_COUNT] = {
    [OBD_HK_ALLREDUCE] = "allreduce",
    [OBD_HK_ALLREDUCE_1BIT] = "allreduce_1bit",
    [OBD_HK_BROADCAST] = "broadcast",
    [OBD_HK_BARRIER] = "barrier",
    [OBD_HK_ALLGATHER] = "allgather",
    [OBD_HK_REDUCE_SCATTER] = "reduce_scatter",
};

const char *const obd_size_class_names[OBD_SC_COUNT] = {
    [OBD_SC_64K] = "64KiB",
    [OBD_SC_1M] = "1MiB",
    [OBD_SC_16M] = "16MiB",
    [OBD_SC_HUGE] = "over16MiB",
};

/* Every kind of proto/ops.h by name; the histogram's kinds among them. */
static const struct {
    uint32_t kind;
    const char *name;
    int hist; /* enum obd_hist_kind, or -1 */
} kinds[] = {
    {OBCOMM_KIND_ALLREDUCE, "allreduce", OBD_HK_ALLREDUCE},
    {OBCOMM_KIND_BROADCAST, "broadcast", OBD_HK_BROADCAST},
    {OBCOMM_KIND_BARRIER, "barrier", OBD_HK_BARRIER},
    {OBCOMM_KIND_ALLREDUCE_1BIT, "allreduce_1bit", OBD_HK_ALLREDUCE_1BIT},
    {OBCOMM_KIND_RESET_1BIT, "reset_1bit", -1},
    {OBCOMM_KIND_SNAPSHOT_1BIT, "snapshot_1bit", -1},
    {OBCOMM_KIND_RESTORE_1BIT, "restore_1bit", -1},
    {OBCOMM_KIND_EXPORT_1BIT, "export_1bit", -1},
    {OBCOMM_KIND_ALLGATHER, "allgather", OBD_HK_ALLGATHER},
    {OBCOMM_KIND_REDUCE_SCATTER, "reduce_scatter", OBD_HK_REDUCE_SCATTER},
};

#define NKINDS (sizeof(kinds) / sizeof(kinds[0]))

const char *obd_metrics_op_name(uint32_t kind, char *buf, size_t len)
{
    for (size_t i = 0; i < NKINDS; i++)
        if (kinds[i].kind == kind)
            return kinds[i].name;
    snprintf(buf, len, "kind %u", kind);
    return buf;
}

void obd_metrics_observe(struct obd_metrics *m, uint32_t kind, uint32_t dtype,
                         uint64_t count, uint64_t us)
{
    int hk = -1;
    for (size_t i = 0; i < NKINDS; i++)
        if (kinds[i].kind == kind)
            hk = kinds[i].hist;
    if (hk < 0)
        return;
    uint64_t bytes = count;
    if (kind == OBCOMM_KIND_ALLREDUCE || kind == OBCOMM_KIND_ALLGATHER ||
        kind == OBCOMM_KIND_REDUCE_SCATTER) /* one rank's part */
        bytes = count * obd_dtype_size((obcomm_dtype_t)dtype);
    else if (kind == OBCOMM_KIND_ALLREDUCE_1BIT)
        bytes = count * sizeof(float);
    else if (kind == OBCOMM_KIND_BARRIER)
        bytes = 0;
    int sc = bytes <= (UINT64_C(64) << 10)   ? OBD_SC_64K
             : bytes <= (UINT64_C(1) << 20)  ? OBD_SC_1M
             : bytes <= (UINT64_C(16) << 20) ? OBD_SC_16M
                                             : OBD_SC_HUGE;
    struct obd_hist *h = &m->latency[hk][sc];
    int b = 0;
    while (b < OBD_HIST_BOUNDS && us > obd_hist_bounds_us[b])
        b++;
    h->buckets[b]++;
    h->count++;
    h->sum_us += us;
}

double obd_metrics_prom(const struct obd_metric_desc *d, char *buf, size_t len)
{
    if (d->prom != NULL)
        snprintf(buf, len, "%s", d->prom);
    else if (strcmp(d->kind, "counter") == 0)
        snprintf(buf, len, "%s_total", d->name);
    else
        snprintf(buf, len, "%s", d->name);
    return d->prom_div != 0 ? d->prom_div : 1;
}

uint64_t obd_metrics_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}
