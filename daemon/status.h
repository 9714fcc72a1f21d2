/* The StatusReply obcommctl renders: the daemon, its world and links, the
 * ops each job has open, the counters and the latency histograms. */
#ifndef OBD_STATUS_H
#define OBD_STATUS_H

#include <sys/types.h>

#include <protobuf-c/protobuf-c.h>

struct obd_daemon;

/* Most open ops listed per job and in all, most jobs listed, and most
 * 1-bit keys per job and in all; the rest are counted in ops_omitted and
 * jobs_omitted, or left out (keys). The bounds keep the reply under
 * OBCOMM_WIRE_MAX (256 KiB) whatever the world and max_jobs: about
 * 75 KiB of OBD_MAX_NODES peers, 60 KiB of jobs and 30 KiB of their
 * stop reasons (OBD_STATUS_STOPPED_MAX each), 65 KiB of ops, 6 KiB of
 * keys, 10 KiB of metrics and histograms. */
#define OBD_STATUS_OPS_MAX     16
#define OBD_STATUS_OPS_TOTAL   256
#define OBD_STATUS_JOBS_MAX    256
#define OBD_STATUS_KEYS_MAX    16
#define OBD_STATUS_KEYS_TOTAL  128
#define OBD_STATUS_STOPPED_MAX 112

/* Builds the StatusReply for a client of uid `uid` (root sees every job,
 * others their own) and hands it to send(arg, msg), which must copy or
 * send it before returning. */
void obd_status_handle(struct obd_daemon *d, uid_t uid,
                       void (*send)(void *arg, const ProtobufCMessage *msg),
                       void *arg);

#endif
