/* Kinds of collective carried in Submit.kind and OpAnnounce.kind. libobcomm
 * and obcommd both include this file, so the numbers cannot drift apart. */
#ifndef OBCOMM_OPS_H
#define OBCOMM_OPS_H

enum obcomm_op_kind {
    OBCOMM_KIND_ALLREDUCE = 1, /* count = elements of dtype, redop used */
    OBCOMM_KIND_BROADCAST = 2, /* dtype 0, count = bytes, root = rank */
    OBCOMM_KIND_BARRIER = 3,   /* no buffer: buffer_id 0, offset 0, count 0 */
    OBCOMM_KIND_ALLREDUCE_1BIT = 4,  /* fp32, key names the state */
    OBCOMM_KIND_RESET_1BIT = 5,      /* no buffer; key names the state */
    OBCOMM_KIND_SNAPSHOT_1BIT = 6,   /* no buffer; the job's states saved as a
                                        set; Complete.value its id */
    OBCOMM_KIND_RESTORE_1BIT = 7,    /* key = the id of the set every node
                                        goes back to; count = bytes of this
                                        node's part in the buffer (0: none,
                                        the daemon's own set) */
    OBCOMM_KIND_EXPORT_1BIT = 8,     /* key = a set's id; count = bytes: every
                                        local trainer's buffer gets the node's
                                        part of the set */
    OBCOMM_KIND_ALLGATHER = 9,       /* count = elements of dtype per rank;
                                        buffer: send; recv_buffer: world *
                                        count elements */
    OBCOMM_KIND_REDUCE_SCATTER = 10, /* count = elements per rank's result;
                                        buffer: send (world * count);
                                        recv_buffer: count elements */
};

#endif
