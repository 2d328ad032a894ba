/*
 * libFuzzer target for the HTTP/1.1 server: any bytes from a client, as one
 * or several pipelined requests, must be answered or refused, never crash,
 * leak or touch memory it should not. Each input goes over a real loopback
 * TCP connection to a real server (src/server.c on a libevent base), whose
 * handler reads what a check reads (headers, lists, body, peer) and
 * replies; the client half-closes, and the run ends when the server closes
 * or after a bounded number of loop iterations. Built and run by
 * `make fuzz` (clang, ASan + UBSan).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "server.h"

#define FUZZ_LOOPS_MAX	200

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct event_base *base;
static struct server *srv;
static struct sockaddr_in addr;

static void
handler(struct http_request *req, void *arg)
{
	char list[256], out[64];
	const char *v, *body;
	size_t len, n = 0;

	(void)arg;
	/* What http.c and check.c look at, so each lookup runs on fuzzed
	 * headers; the reply carries a digest of them. */
	n += strlen(request_method(req)) + strlen(request_uri(req));
	if ((v = request_header(req, "X-Original-URI")) != NULL)
		n += strlen(v);
	if ((v = request_header(req, "Host")) != NULL)
		n += strlen(v);
	if ((v = request_header_list(req, "X-Forwarded-For", list, sizeof(list))) != NULL)
		n += strlen(v);
	if ((v = request_peer(req)) != NULL)
		n += strlen(v);
	body = request_body(req, &len);
	if (body != NULL && len > 0)
		n += (unsigned char)body[len - 1];
	out[0] = '\0';
	for (size_t i = 0; i < 8; i++)
		out[i] = (char)('a' + (n >> (i * 4)) % 16);
	out[8] = '\0';
	request_add_header(req, "X-Digest", out);
	request_reply(req, n % 2 ? 429 : 200, "text/plain", out, 8);
}

static void
setup(void)
{
	socklen_t alen = sizeof(addr);
	int fd;

	base = event_base_new();
	if (base == NULL || (fd = socket(AF_INET, SOCK_STREAM, 0)) == -1)
		abort();
	memset(&addr, 0, sizeof(addr));
	addr.sin_family = AF_INET;
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) == -1 ||
	    listen(fd, 64) == -1 ||
	    getsockname(fd, (struct sockaddr *)&addr, &alen) == -1)
		abort();
	fcntl(fd, F_SETFL, O_NONBLOCK);
	srv = server_new(base, fd, handler, NULL);
	server_set_idle_timeout(srv, 1000000);
	close(fd);		/* the server holds its own dup */
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char buf[65536];
	size_t off = 0;
	int fd, closed = 0;

	if (base == NULL)
		setup();
	if ((fd = socket(AF_INET, SOCK_STREAM, 0)) == -1)
		return 0;
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == -1) {
		close(fd);
		return 0;
	}
	fcntl(fd, F_SETFL, O_NONBLOCK);
	for (int i = 0; i < FUZZ_LOOPS_MAX && !closed; i++) {
		ssize_t n;

		if (off < size) {
			n = write(fd, data + off, size - off);
			if (n > 0)
				off += (size_t)n;
			else if (n == -1 && errno != EAGAIN)
				off = size;	/* refused mid-body: the server closed */
			if (off == size)
				shutdown(fd, SHUT_WR);
		} else if (size == 0 && i == 0)
			shutdown(fd, SHUT_WR);
		event_base_loop(base, EVLOOP_NONBLOCK);
		while ((n = read(fd, buf, sizeof(buf))) > 0)
			;
		if (n == 0 || (n == -1 && errno != EAGAIN))
			closed = 1;
	}
	close(fd);
	/* Let the server see the close of a connection it still held. */
	for (int i = 0; i < 4; i++)
		event_base_loop(base, EVLOOP_NONBLOCK);
	return 0;
}
