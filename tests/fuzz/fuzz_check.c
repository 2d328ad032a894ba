/*
 * libFuzzer target for the request path as the daemon runs it: the real
 * HTTP server (server.c) with the real endpoints (http.c) and checks
 * (check.c), wired by worker_new exactly as one worker of the daemon, with
 * its store, metrics and deny cache, on a policy loaded by config.c that
 * uses every kind of match, key source, override and algorithm. Redis is
 * asked at a loopback port where nothing listens, so the store is down and
 * every check takes the fail-open or fail-closed path that users meet
 * when Redis is gone; no Redis is stubbed.
 *
 * Each input is a client's raw bytes (one or several pipelined requests)
 * over a real loopback TCP connection, half-closed after the last byte;
 * the run ends when the server closes or after a bounded number of loop
 * iterations. Besides crashes, leaks and undefined behaviour, it fails on
 * a reply that is not framed as HTTP/1.1, on the 500 that http_reply_json
 * sends when it could not build a body (our bug, by its own account), and
 * on a rate-limit reply that claims a count while Redis is down (SPEC 3.1:
 * a degraded reply says X-RateLimit-Remaining: -1). Built and run by
 * `make fuzz` (clang, ASan + UBSan).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "config.h"
#include "config_json.h"
#include "log.h"
#include "metrics.h"
#include "policy.h"
#include "worker.h"
#include "xmalloc.h"
#include "loopback.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/*
 * Every route kind a request can meet. failure_mode is closed at the top
 * and open on some routes, deny_status 403 at the top and 429 on one
 * route; 10.0.0.0/8 and fd00::/8 are trusted beside loopback (the
 * harness's peer), so X-Forwarded-For chains of both families are walked.
 * %d is the port nothing listens on.
 */
static const char policy_fmt[] =
    "server:\n"
    "  deny_status: 403\n"
    "  ietf_headers: true\n"
    "redis:\n"
    "  address: 127.0.0.1:%d\n"
    "  timeout: 50ms\n"
    "  connect_timeout: 100ms\n"
    "failure_mode: closed\n"
    "trusted_proxies: [127.0.0.0/8, 10.0.0.0/8, \"::1/128\", \"fd00::/8\"]\n"
    "routes:\n"
    "  - name: login\n"
    "    match: { path: /auth/login, methods: [POST] }\n"
    "    key: ip\n"
    "    failure_mode: open\n"
    "    limits:\n"
    "      - { name: per-minute, algorithm: sliding_window_log, limit: 5, window: 1m }\n"
    "  - name: api\n"
    "    match: { prefix: /api/, host: api.example.com }\n"
    "    key: [header:X-Api-Key, cookie:session, ip]\n"
    "    missing_key: deny\n"
    "    deny_status: 429\n"
    "    failure_mode: open\n"
    "    limits:\n"
    "      - { name: burst, algorithm: token_bucket, rate: \"10/s\", burst: 20 }\n"
    "      - { name: hourly, algorithm: fixed_window, limit: 1000, window: 1h }\n"
    "    overrides:\n"
    "      - keys: [partner-1, 203.0.113.7, \"2001:db8::7\"]\n"
    "        limits: [ { algorithm: gcra, rate: \"100/s\", burst: 50 } ]\n"
    "      - { keys: [internal-monitor], unlimited: true }\n"
    "  - name: uploads\n"
    "    match: { regex: '^/v[0-9]+/upload', methods: [POST, PUT] }\n"
    "    key: global\n"
    "    limits:\n"
    "      - { name: queue, algorithm: leaky_bucket, rate: \"5/s\", burst: 10, delay: false }\n"
    "  - name: shaped\n"
    "    match: { prefix: /shaped/, host: \"[2001:db8::1]:8080\" }\n"
    "    key: header:X-Client\n"
    "    missing_key: allow\n"
    "    limits:\n"
    "      - { algorithm: leaky_bucket, rate: \"2/s\", burst: 4 }\n"
    "  - name: q\n"
    "    match: { prefix: /q/ }\n"
    "    key: query:k\n"
    "    failure_mode: open\n"
    "    limits: [ { name: q, algorithm: fixed_window, limit: 3, window: 1h } ]\n"
    "  - name: session\n"
    "    match: { prefix: /s/, methods: [GET, DELETE] }\n"
    "    key: [cookie:sid, query:sid, header:X-Session]\n"
    "    missing_key: allow\n"
    "    overrides:\n"
    "      - { keys: [admin], unlimited: true }\n"
    "    limits:\n"
    "      - { algorithm: gcra, rate: \"1/s\", burst: 3 }\n"
    "      - { algorithm: sliding_window_counter, limit: 50, window: 10s, precision: 1s }\n"
    "      - { algorithm: fixed_window, limit: 100, window: 1m }\n"
    "      - { algorithm: fixed_window, limit: 1000, window: 1d }\n"
    "  - name: static\n"
    "    match: { regex: '\\.(png|css)$' }\n"
    "    key: global\n"
    "    failure_mode: open\n"
    "    limits: [ { algorithm: token_bucket, rate: \"1000/s\", burst: 1000 } ]\n"
    "  - name: default\n"
    "    match: { prefix: / }\n"
    "    key: [ip, header:X-Real-IP]\n"
    "    shadow: true\n"
    "    limits:\n"
    "      - { algorithm: sliding_window_counter, limit: 100, window: 1m }\n"
    "      - { algorithm: leaky_bucket, rate: \"1/m\", burst: 1, delay: true }\n";

static struct worker *w;
static struct sockaddr_in addr;
static int refused_fd = -1;	/* holds the port Redis is asked at */
static char *replies;		/* bytes the server sent, not yet checked */
static size_t replies_len, replies_cap;

/* A loopback port bound but not listening: a connect there is refused at
 * once, and no other process can take the port while we hold it. */
static int
refused_port(void)
{
	struct sockaddr_in sin;
	socklen_t len = sizeof(sin);

	if ((refused_fd = socket(AF_INET, SOCK_STREAM, 0)) == -1)
		abort();
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(refused_fd, (struct sockaddr *)&sin, sizeof(sin)) == -1 ||
	    getsockname(refused_fd, (struct sockaddr *)&sin, &len) == -1)
		abort();
	return ntohs(sin.sin_port);
}

static struct config *
load_policy(void)
{
	struct config_errors errors;
	struct config *c;
	char path[64];
	FILE *fp;

	snprintf(path, sizeof(path), "/tmp/ratelimitd-fuzz-check-%d.yaml",
	    (int)getpid());
	if ((fp = fopen(path, "w")) == NULL)
		abort();
	fprintf(fp, policy_fmt, refused_port());
	fclose(fp);
	c = config_load(path, &errors);
	unlink(path);
	if (c == NULL) {
		for (size_t i = 0; i < errors.n; i++)
			fprintf(stderr, "%s\n", errors.lines[i]);
		abort();
	}
	return c;
}

/* What main's run() does before it starts a worker, then one worker on a
 * listening socket of our own; its loop runs on this thread. */
static void
setup(void)
{
	struct sigaction sa;
	struct config *c;
	int fd;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_IGN;
	sigaction(SIGPIPE, &sa, NULL);
	if (evthread_use_pthreads() == -1)
		abort();
	c = load_policy();
	log_configure((enum log_level)c->log_level, (enum log_format)c->log_format);
	metrics_show_policy(c);
	policy_prepare(c);
	c->workers_running = 1;
	config_render_json(c);	/* as main does, once the policy is final */

	fd = loopback_listen(&addr);
	w = worker_new(0, fd, c);
	config_unref(c);	/* the worker holds its own reference */
	close(fd);		/* and its server a dup */
}

static void
fail(const char *why, const char *reply, size_t len)
{
	fprintf(stderr, "fuzz_check: %s in reply: \"%.*s\"\n", why,
	    (int)(len > 512 ? 512 : len), reply);
	abort();
}

/* The value of header name in a reply head, or NULL. */
static const char *
head_value(const char *head, size_t len, const char *name, size_t *vlen)
{
	size_t nl = strlen(name);
	const char *p = head, *end = head + len, *eol;

	while ((eol = memmem(p, (size_t)(end - p), "\r\n", 2)) != NULL) {
		p = eol + 2;
		if ((size_t)(end - p) > nl + 1 && strncasecmp(p, name, nl) == 0 &&
		    p[nl] == ':') {
			const char *v = p + nl + 1;

			while (v < end && *v == ' ')
				v++;
			eol = memmem(v, (size_t)(end - v), "\r\n", 2);
			*vlen = (size_t)(eol - v);
			return v;
		}
	}
	return NULL;
}

/*
 * Checks the complete replies at the front of buf; returns the bytes they
 * took. A HEAD reply carries Content-Length but no body: it is told by the
 * next reply's status line where its body would be, as no body the daemon
 * sends starts with "HTTP/". What may still be arriving is left for later.
 */
static size_t
check_replies(const char *buf, size_t len)
{
	static const char proto[] = "HTTP/1.1 ";
	size_t off = 0;

	while (off < len) {
		const char *r = buf + off, *end, *v;
		size_t left = len - off, head, body = 0, vlen;
		int status;

		if (memcmp(r, proto, left < 9 ? left : 9) != 0)
			fail("no status line", r, left);
		if ((end = memmem(r, left, "\r\n\r\n", 4)) == NULL)
			break;
		head = (size_t)(end + 4 - r);
		if (head < 14 || r[9] < '1' || r[9] > '5' || r[10] < '0' ||
		    r[10] > '9' || r[11] < '0' || r[11] > '9' || r[12] != ' ')
			fail("malformed status line", r, head);
		status = (r[9] - '0') * 100 + (r[10] - '0') * 10 + (r[11] - '0');
		if (status == 500)
			fail("500 (a body that could not be built)", r, left);
		if ((v = head_value(r, head, "X-RateLimit-Remaining", &vlen)) &&
		    (vlen != 2 || memcmp(v, "-1", 2) != 0))
			fail("a count while Redis is down", r, head);
		if (status >= 200) {
			if ((v = head_value(r, head, "Content-Length", &vlen)) == NULL)
				fail("no Content-Length", r, head);
			body = strtoul(v, NULL, 10);
		}
		if (body > 0) {
			size_t after = left - head, n = after < 9 ? after : 9;

			/* A HEAD reply when the next reply starts here. */
			if (memcmp(r + head, proto, n) == 0) {
				if (n < 9)
					break;	/* cannot tell yet */
				body = 0;
			} else if (after < body)
				break;		/* the rest is on its way */
		}
		off += head + body;
	}
	return off;
}

/* Reads what the server sent; 1 once it has closed the connection. */
static int
read_replies(int fd, void *arg)
{
	ssize_t n;
	size_t used;

	(void)arg;
	for (;;) {
		if (replies_cap - replies_len < 65536) {
			replies_cap = replies_cap ? replies_cap * 2 : 262144;
			replies = xrealloc(replies, replies_cap);
		}
		n = read(fd, replies + replies_len, replies_cap - replies_len);
		if (n <= 0)
			break;
		replies_len += (size_t)n;
		used = check_replies(replies, replies_len);
		memmove(replies, replies + used, replies_len - used);
		replies_len -= used;
	}
	return n == 0 || (n == -1 && errno != EAGAIN);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (w == NULL)
		setup();
	replies_len = 0;
	loopback_exchange(w->w_base, &addr, data, size, read_replies, NULL);
	return 0;
}
