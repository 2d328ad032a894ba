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
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "loopback.h"
#include "server.h"

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
	int fd;

	if ((base = event_base_new()) == NULL)
		abort();
	fd = loopback_listen(&addr);
	srv = server_new(base, fd, handler, NULL);
	server_set_idle_timeout(srv, 1000000);
	close(fd);		/* the server holds its own dup */
}

/* Reads and drops what the server sent; 1 once it has closed. */
static int
drain(int fd, void *arg)
{
	char buf[65536];
	ssize_t n;

	(void)arg;
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		;
	return n == 0 || (n == -1 && errno != EAGAIN);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (base == NULL)
		setup();
	loopback_exchange(base, &addr, data, size, drain, NULL);
	return 0;
}
