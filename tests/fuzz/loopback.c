#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "loopback.h"

/* Loop iterations an input may take: enough for any request the server
 * reads (its buffers fill in a few), few enough for a slow reply to end. */
#define LOOPBACK_LOOPS_MAX	200

int
loopback_listen(struct sockaddr_in *addr)
{
	socklen_t alen = sizeof(*addr);
	int fd;

	if ((fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0)) == -1)
		abort();
	memset(addr, 0, sizeof(*addr));
	addr->sin_family = AF_INET;
	addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)addr, sizeof(*addr)) == -1 ||
	    listen(fd, 64) == -1 ||
	    getsockname(fd, (struct sockaddr *)addr, &alen) == -1)
		abort();
	return fd;
}

void
loopback_exchange(struct event_base *base, const struct sockaddr_in *addr,
    const uint8_t *data, size_t size, int (*drain)(int fd, void *arg),
    void *arg)
{
	size_t off = 0;
	int fd, closed = 0;

	if ((fd = socket(AF_INET, SOCK_STREAM, 0)) == -1)
		return;
	if (connect(fd, (const struct sockaddr *)addr, sizeof(*addr)) == -1) {
		close(fd);
		return;
	}
	fcntl(fd, F_SETFL, O_NONBLOCK);
	for (int i = 0; i < LOOPBACK_LOOPS_MAX && !closed; i++) {
		if (off < size) {
			ssize_t n = write(fd, data + off, size - off);

			if (n > 0)
				off += (size_t)n;
			else if (n == -1 && errno != EAGAIN)
				off = size;	/* refused mid-body: the server closed */
			if (off == size)
				shutdown(fd, SHUT_WR);
		} else if (size == 0 && i == 0)
			shutdown(fd, SHUT_WR);
		event_base_loop(base, EVLOOP_NONBLOCK);
		closed = drain(fd, arg);
	}
	close(fd);
	/* Let the server see the close of a connection it still held. */
	for (int i = 0; i < 4; i++)
		event_base_loop(base, EVLOOP_NONBLOCK);
}
