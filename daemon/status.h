/* The StatusReply obcommctl renders: the daemon, its world and links, the
 * ops each job has open, the counters and the latency histograms. */
#ifndef OBD_STATUS_H
#define OBD_STATUS_H

struct obd_client;

/* Most open ops listed per job; the rest are counted in ops_omitted. The
 * bound keeps the reply under OBCOMM_WIRE_MAX with OBD_MAX_NODES peers and
 * max_jobs jobs. */
#define OBD_STATUS_OPS_MAX 16

/* Answers a StatusRequest from client c (queued with obd_ctl_send). */
void obd_status_handle(struct obd_client *c);

#endif
