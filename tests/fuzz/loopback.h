/*
 * The client half of the fuzz targets that send each input to a real
 * server over a real loopback TCP connection (fuzz_http, fuzz_check).
 */
#ifndef FUZZ_LOOPBACK_H
#define FUZZ_LOOPBACK_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;

/* A non-blocking socket listening on 127.0.0.1 at a port the kernel
 * picks, its address in *addr; aborts when there is none. */
int loopback_listen(struct sockaddr_in *addr);

/*
 * Sends data to the server at addr as one client, half-closing after the
 * last byte, and runs base between writes, for a bounded number of loop
 * iterations: drain(fd, arg) reads what the server sent and returns 1 once
 * it has closed the connection. Then closes, and lets the server see it.
 */
void loopback_exchange(struct event_base *base, const struct sockaddr_in *addr,
    const uint8_t *data, size_t size, int (*drain)(int fd, void *arg),
    void *arg);

#endif
