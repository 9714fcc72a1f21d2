/* The StatusReply obcommctl renders: the daemon, its world and links, the
 * ops each job has open, the counters and the latency histograms. */
#ifndef OBD_STATUS_H
#define OBD_STATUS_H

struct obd_client;

/* Most open ops listed per job and in all, and most jobs listed; the rest
 * are counted in ops_omitted and jobs_omitted. The bounds keep the reply
 * under OBCOMM_WIRE_MAX (256 KiB) whatever the world and max_jobs: about
 * 75 KiB of OBD_MAX_NODES peers, 60 KiB of jobs, 65 KiB of ops, 10 KiB of
 * metrics and histograms. */
#define OBD_STATUS_OPS_MAX   16
#define OBD_STATUS_OPS_TOTAL 256
#define OBD_STATUS_JOBS_MAX  256

/* Answers a StatusRequest from client c (queued with obd_ctl_send). */
void obd_status_handle(struct obd_client *c);

#endif
