/* A raw client of obcommd's Unix socket: the protocol without libobcomm,
 * for tests that must send what libobcomm never would, or stop at any
 * point of it. Every wait is bounded (10 s). */
#ifndef OBCOMM_TEST_RAWCLIENT_H
#define OBCOMM_TEST_RAWCLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "obcomm.pb-c.h"

struct raw {
    int fd;
    char err[512];
};

int raw_open(struct raw *r, const char *sock);
int raw_send(struct raw *r, Obcomm__ClientMsg *m, int pass_fd);
/* The next message, or NULL (r->err says why) after wait_ms. Caller frees
 * with obcomm__daemon_msg__free_unpacked. */
Obcomm__DaemonMsg *raw_recv(struct raw *r, int wait_ms);
/* Connects and joins `job` as local rank lr of ls: the JoinReply's
 * status, or a negative code. */
int raw_join(struct raw *r, const char *sock, const char *job, int lr, int ls,
             int timeout_ms);
/* Registers a sealed memfd of `bytes` as buffer id 1, mapped at *base:
 * the RegisterReply's status, or a negative code. */
int raw_register(struct raw *r, size_t bytes, float **base);
/* Sends a Submit of buffer 1 at offset 0 (not waiting for Complete), with
 * the fields libobcomm sends for that kind (client/coll.c). */
int raw_submit(struct raw *r, uint64_t seq, unsigned kind, uint64_t count,
               uint64_t key);
int raw_release(struct raw *r);

#endif
