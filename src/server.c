/*
 * The HTTP/1.1 server. libevent's evhttp costs five system calls per request
 * (readv, an ioctl(FIONREAD), writev and two epoll_ctl, as it toggles read
 * and write interest around every reply); a rate-limit check does so little
 * else that those calls were most of its cost. Here a connection keeps one
 * persistent level-triggered read event for its whole life, reads straight
 * into its buffer, and writes the reply at once with a single write(2);
 * only a reply the socket cannot take whole arms a write event. The parser
 * works in place on the connection's buffer (NUL-terminating the request
 * line and header fields), so a request allocates nothing.
 *
 * One request per connection is in the handler's hands at a time; bytes of
 * pipelined requests wait in the buffer and are parsed after the reply. A
 * connection whose peer leaves while its request is pending is kept until
 * the reply, which is then dropped, so a handler never holds a dangling
 * request; a handler holding a reply on purpose asks to be told instead
 * (request_on_peer_gone).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>
#include <linux/sockios.h>

#include "chunked.h"
#include "clock.h"
#include "fmt.h"
#include "log.h"
#include "server.h"
#include "xmalloc.h"

/* Header fields kept in the connection; a head with more grows a table on
 * the heap for that request, up to as many as 16 KiB can hold (a
 * field is at least "x:" and a line end). SPEC's only limit is the size:
 * nginx adds about 7 fields of its own, and a count cap of 100 turned a
 * client's 95 small headers into a 500 from auth_request. */
#define SERVER_HEADERS_INLINE	 100
#define SERVER_HEADERS_COUNT_MAX (SERVER_HEADERS_MAX / 3)
#define SERVER_OUT_HEADERS_MAX	 4096	/* extra response headers, bytes */
#define SERVER_IN_INITIAL	 4096
#define SERVER_IN_LIMIT		 (SERVER_HEADERS_MAX + SERVER_BODY_MAX + 4096)
#define SERVER_ACCEPT_RETRY_US	 100000	/* pause accepting on EMFILE */
#define SERVER_ACCEPT_LOG_US	 10000000 /* and say so at most this often */
#define SERVER_LINGER_US	 2000000 /* read and drop input after an error */
/* Replies queued but unsent past which a connection's pipelined requests
 * wait: a client that sends and never reads must not grow memory without
 * bound (nginx, too, reads the next request only once a reply is out). */
#define SERVER_OUT_BACKLOG_MAX	 65536
#define SERVER_IDLE_TRIES	 8	/* see close_an_idle_connection */
/* Requests of one connection answered in one go before the others, and
 * Redis's replies, get a turn (see conn_process). */
#define SERVER_REQUESTS_PER_TURN 16
/* A connection that has sent nothing for this long counts as idle at the
 * cap (see conn_idle); while full, that is looked for this often. */
#define SERVER_SILENT_IDLE_US	 1000000
/* A request begun this long ago and still not whole makes room at the cap
 * too (see conn_stalled). */
#define SERVER_STALLED_US	 5000000
/* See conn_free: once a worker's connections fall to a quarter of a peak
 * of at least this many, its quiet callback runs, a second later. */
#define SERVER_QUIET_PEAK	 128
#define SERVER_QUIET_DELAY_US	 1000000

struct header {
	const char	*name;
	size_t		 namelen;	/* most lookups miss: compare this first */
	const char	*value;
};

struct http_request {
	struct conn	*rq_conn;
	const char	*rq_method;
	const char	*rq_uri;
	int		 rq_minor;		/* HTTP/1.rq_minor */
	int		 rq_nheaders;
	const char	*rq_body;
	size_t		 rq_body_len;
	int		 rq_keepalive;
	int		 rq_head;		/* HEAD: headers only */
	long long	 rq_arrival_us;		/* see request_arrival_us */
	request_gone_cb	 rq_gone_cb;		/* see request_on_peer_gone */
	void		*rq_gone_arg;
	/* Not cleared per request: only the first rq_nheaders count. */
	struct header	*rq_headers;		/* rq_headers_inline or grown */
	int		 rq_headers_cap;
	struct header	 rq_headers_inline[SERVER_HEADERS_INLINE];
	char		 rq_out[SERVER_OUT_HEADERS_MAX]; /* "Name: value\r\n"... */
	size_t		 rq_out_len;
};

struct conn {
	struct server	*c_server;
	LIST_ENTRY(conn) c_entry;		/* the server's connections */
	int		 c_fd;
	struct event	*c_read_ev;		/* persistent, level-triggered */
	struct event	*c_write_ev;		/* only while output is queued */
	struct event	*c_idle_ev;		/* idle, linger, or reply timeout */
	struct event	*c_more_ev;		/* see conn_process; made on need */
	long long	 c_active_us;		/* last read or reply, coarse */
	long long	 c_read_us;		/* last read with bytes, exact */
	/* Input not yet answered: c_in_len bytes at c_in, with room for
	 * c_in_cap in all, a window on c_in_buf (c_in_size bytes) that
	 * answered requests move forward (see conn_in_consume). */
	char		*c_in;
	size_t		 c_in_len, c_in_cap;
	char		*c_in_buf;
	size_t		 c_in_size;
	int		 c_head_parsed;		/* c_req holds a parsed head */
	size_t		 c_head_len;		/* bytes of the head in c_in */
	size_t		 c_body_need;		/* Content-Length, or once a
						 * chunked body is whole, its
						 * encoded length */
	int		 c_chunked;		/* Transfer-Encoding: chunked */
	struct chunked	 c_chunk;
	size_t		 c_req_len;		/* head + body, once complete */
	char		*c_out;
	size_t		 c_out_len, c_out_off, c_out_cap;
	/* A body sent from memory the handler lends (request_reply_lent),
	 * after all of c_out: no request is taken while one is held, so
	 * nothing is queued behind it, and c_out_len stays non-zero until it
	 * is out. */
	const char	*c_lent;
	size_t		 c_lent_len, c_lent_off;
	void		(*c_lent_release)(void *);
	void		*c_lent_arg;
	unsigned long long c_written;		/* bytes ever written */
	/* What the peer had taken at the idle timer's last look, valid when
	 * c_delivered_known (see conn_reader_progressed). */
	unsigned long long c_delivered_seen;
	int		 c_delivered_known;
	int		 c_pending;		/* a request is with the handler */
	int		 c_processing;		/* inside conn_process */
	int		 c_more;		/* c_more_ev goes on with c_in */
	int		 c_read_paused;		/* buffer full while pending */
	int		 c_closing;		/* close once the output is out */
	int		 c_eof;			/* peer sent FIN: no more input */
	int		 c_dead;		/* unusable; free after the reply */
	int		 c_continue_sent;	/* 100 Continue for this request */
	int		 c_lingering;		/* error sent: drain input, then close */
	int		 c_answered;		/* a reply went out: keep-alive */
	int		 c_skip;		/* see close_an_idle_connection */
	int		 c_shut;		/* shutdown(SHUT_WR) done */
	int		 c_has_peer;
	char		 c_peer[INET6_ADDRSTRLEN];
	struct http_request c_req;
};

struct server {
	struct event_base	*s_base;
	struct evconnlistener	*s_listener;
	struct event		*s_accept_retry_ev;
	struct event		*s_full_ev;	/* see on_full */
	struct event		*s_cap_ev;	/* see on_cap_reached */
	LIST_ENTRY(server)	 s_entry;	/* in servers */
	long long		 s_idle_us;
	int			 s_draining;	/* see server_drain */
	long long		 s_accept_logged_us;
	unsigned long long	 s_accept_unlogged;
	size_t			 s_nconns;	/* this worker's */
	size_t			 s_nconns_peak;	/* since the last quiet call */
	struct event		*s_quiet_ev;	/* see conn_free */
	server_quiet_cb		 s_on_quiet;
	size_t			 s_max_conns;	/* all workers': SIZE_MAX until set */
	int			 s_full;	/* not accepting: at the cap */
	long long		 s_full_logged_us;
	server_handler		 s_handler;
	server_refused_cb	 s_on_refused;
	void			*s_arg;
	LIST_HEAD(, conn)	 s_conns;
	time_t			 s_date_sec;	/* what s_date says */
	char			 s_date[FMT_HTTP_DATE_MAX];
};

static void conn_process(struct conn *);
static void headers_release(struct http_request *);

static int
conn_backlogged(const struct conn *c)
{
	return c->c_out_len - c->c_out_off >= SERVER_OUT_BACKLOG_MAX ||
	    c->c_lent != NULL;
}

/* The lender's memory is free to go: written out, or the peer is. */
static void
conn_lent_release(struct conn *c)
{
	void (*release)(void *) = c->c_lent_release;

	c->c_lent = NULL;
	c->c_lent_release = NULL;
	if (release != NULL)
		release(c->c_lent_arg);
}

/* Waiting on its client alone: no request with the handler, nothing to
 * send, not closing. */
static int
conn_awaiting_client(const struct conn *c)
{
	return !c->c_pending && !c->c_processing && c->c_out_len == 0 &&
	    !c->c_lingering && !c->c_dead && !c->c_closing;
}

/* Nothing under way: no request in hand or half read, nothing to send,
 * not closing. (A request may still wait unread in the socket.) */
static int
conn_quiet(const struct conn *c)
{
	return conn_awaiting_client(c) && c->c_in_len == 0;
}

/* Kept alive with nothing under way: it may make room at the cap. One
 * that was answered; or one that has sent nothing for
 * SERVER_SILENT_IDLE_US since it was accepted, which nginx too counts as
 * reusable: a client's first request follows its connect at once, and one
 * that never sends would hold its slot until idle_timeout (a thousand
 * such kept health probes out for a minute). A fresh connection's first
 * request may be on its way within that second. (A request may still wait
 * unread in its socket.) */
static int
conn_idle(const struct conn *c)
{
	return conn_quiet(c) && (c->c_answered ||
	    mono_coarse_us() - c->c_active_us >= SERVER_SILENT_IDLE_US);
}

/* A request begun SERVER_STALLED_US ago and still not whole, head or
 * body, with nothing else under way. A gateway sends a request at once,
 * so at the cap this one (a slowloris, a client gone quiet mid-request)
 * makes room too: it held its slot until idle_timeout, and a process with
 * as many such connections as the cap stalled every new check that long
 * (an audit: 9.5 s at idle_timeout 10 s). */
static int
conn_stalled(const struct conn *c)
{
	return conn_awaiting_client(c) && c->c_in_len > 0 &&
	    mono_coarse_us() - c->c_active_us >= SERVER_STALLED_US;
}

/* Idle or stalled: at the cap, it may be closed for a new connection. */
static int
conn_reclaimable(const struct conn *c)
{
	return conn_idle(c) || conn_stalled(c);
}

/* Below a quarter of a peak of SERVER_QUIET_PEAK or more connections. */
static int
fallen_from_peak(const struct server *srv)
{
	return srv->s_nconns_peak >= SERVER_QUIET_PEAK &&
	    srv->s_nconns < srv->s_nconns_peak / 4;
}

/* Its last reply is out and it is half-closed, waiting only for its
 * client's EOF (see conn_settle). */
static int
conn_lingering_out(const struct conn *c)
{
	return c->c_lingering && c->c_shut && c->c_out_len == 0;
}

/* Bytes of a next request wait in the socket, not read yet. */
static int
conn_request_waiting(const struct conn *c)
{
	char byte;

	return recv(c->c_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 1;
}

/* Reads again once a pending reply or a backlog is out of the way. */
static void
conn_resume_reading(struct conn *c)
{
	if (c->c_read_paused && !c->c_pending && !c->c_dead && !c->c_eof &&
	    !conn_backlogged(c)) {
		c->c_read_paused = 0;
		event_add(c->c_read_ev, NULL);
	}
}

/*
 * The idle timer is not re-armed per request (an event_add, its lock and a
 * queue move, twice a request): reads and replies only stamp c_active_us,
 * and the timer, once it fires, sleeps again for what is left. The coarse
 * clock is a vDSO read; its few milliseconds do not matter to a timeout.
 */
static void
idle_arm(struct conn *c, long long us)
{
	struct timeval tv = tv_us(us);

	event_add(c->c_idle_ev, &tv);
}

static const char *
reason(int status)
{
	switch (status) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 411: return "Length Required";
	case 413: return "Payload Too Large";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 501: return "Not Implemented";
	case 503: return "Service Unavailable";
	case 505: return "HTTP Version Not Supported";
	default: return status < 500 ? "Client Error" : "Server Error";
	}
}

/*
 * Connections open in every worker together: server.max_connections caps
 * their sum. A share per worker left most of a gateway's pool to one
 * worker's share, as the kernel hands a shared listening socket's
 * connections out unevenly (one worker took 25 of 30), and that worker
 * closed idle connections with the daemon far below the cap. At the cap,
 * the worker taking a new connection closes its own idle longest; one
 * with none stops accepting, and the others, which listen on the same
 * socket, still take connections they can make room for.
 */
static atomic_size_t conns_open;

/* The workers' servers, for the one that reaches the cap to tell the
 * others (see on_cap_reached). */
static pthread_mutex_t servers_lock = PTHREAD_MUTEX_INITIALIZER;
static LIST_HEAD(, server) servers = LIST_HEAD_INITIALIZER(servers);

static size_t
open_total(void)
{
	return atomic_load_explicit(&conns_open, memory_order_relaxed);
}

static void accept_again(struct server *);
static int server_has_waiters(struct server *);
static void server_full(struct server *, int);
static void server_room(struct server *);
static int close_an_idle_connection(struct server *, const struct conn *,
    int);

static void
conn_free(struct conn *c)
{
	struct server *srv = c->c_server;

	LIST_REMOVE(c, c_entry);
	srv->s_nconns--;
	/* 2,000 connections left 31 MB behind them (an audit), which the
	 * RSS an operator watches showed as a leak: once most of a large
	 * peak has gone, the worker is told, to give the memory back. */
	if (srv->s_on_quiet != NULL && fallen_from_peak(srv) &&
	    !evtimer_pending(srv->s_quiet_ev, NULL)) {
		struct timeval tv = tv_us(SERVER_QUIET_DELAY_US);

		evtimer_add(srv->s_quiet_ev, &tv);
	}
	if (atomic_fetch_sub_explicit(&conns_open, 1, memory_order_relaxed) - 1 <
	    srv->s_max_conns)
		server_room(srv);
	event_free(c->c_read_ev);
	event_free(c->c_write_ev);
	event_free(c->c_idle_ev);
	if (c->c_more_ev)
		event_free(c->c_more_ev);
	close(c->c_fd);
	headers_release(&c->c_req);
	conn_lent_release(c);
	free(c->c_in_buf);
	free(c->c_out);
	free(c);
}

/*
 * Frees the connection if nothing needs it any more. Called only where no
 * caller up the stack touches the connection afterwards: the ends of the
 * event callbacks, of conn_process, and of a reply made outside it.
 */
static void
conn_settle(struct conn *c)
{
	if (c->c_pending || c->c_processing)
		return;
	if (c->c_dead) {
		conn_free(c);
		return;
	}
	if (c->c_out_len != 0 || c->c_more)
		return;		/* the write event, or on_more, goes on */
	if (c->c_lingering) {
		/*
		 * Closing with unread input makes the kernel send a reset,
		 * which can destroy our error reply before the client reads
		 * it (a 1 MiB upload answered 413 at its first bytes). So:
		 * half-close, drop what still arrives, close on EOF or after
		 * SERVER_LINGER_US.
		 */
		if (c->c_eof) {
			conn_free(c);
			return;
		}
		if (!c->c_shut) {
			struct timeval tv = { SERVER_LINGER_US / 1000000,
			    SERVER_LINGER_US % 1000000 };

			shutdown(c->c_fd, SHUT_WR);
			c->c_shut = 1;
			event_add(c->c_idle_ev, &tv);
			/* It holds a slot it will never use: a worker at its
			 * cap takes new connections again, and this one makes
			 * room (close_an_idle_connection). */
			if (open_total() <= c->c_server->s_max_conns)
				server_room(c->c_server);
		}
		return;
	}
	if (c->c_closing || c->c_eof)
		conn_free(c);
	else if (c->c_server->s_full && conn_idle(c) &&
	    open_total() <= c->c_server->s_max_conns)
		/* Idle now, at the cap: a connection that came meanwhile
		 * waits in the backlog, unseen. Accepting again lets the next
		 * one make room by closing the connection idle longest. */
		server_room(c->c_server);
}

/* What the peer has taken: bytes written less those the socket holds
 * (not yet sent, or not yet acknowledged); *queued, those it holds. */
static unsigned long long
conn_delivered(const struct conn *c, int *queued)
{
	if (ioctl(c->c_fd, SIOCOUTQ, queued) == -1 || *queued < 0)
		*queued = 0;
	return c->c_written - (unsigned long long)*queued;
}

/* Writes queued output, a lent body after it in the same call; on
 * EAGAIN arms the write event. */
static void
conn_flush(struct conn *c)
{
	while (c->c_out_off < c->c_out_len || c->c_lent != NULL) {
		size_t out_left = c->c_out_len - c->c_out_off;
		ssize_t n;

		if (c->c_lent == NULL)
			n = write(c->c_fd, c->c_out + c->c_out_off, out_left);
		else {
			struct iovec iov[2] = {
				{ c->c_out + c->c_out_off, out_left },
				{ (char *)(uintptr_t)(c->c_lent + c->c_lent_off),
				  c->c_lent_len - c->c_lent_off },
			};

			n = writev(c->c_fd, iov + (out_left == 0),
			    2 - (out_left == 0));
		}

		if (n > 0) {
			size_t from_out = (size_t)n < out_left ? (size_t)n : out_left;

			c->c_out_off += from_out;
			c->c_written += (unsigned long long)n;
			if (c->c_lent != NULL &&
			    (c->c_lent_off += (size_t)n - from_out) == c->c_lent_len)
				conn_lent_release(c);
			continue;
		}
		if (n == -1 && errno == EINTR)
			continue;
		if (n == -1 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			/* A reader slower than its replies: where it stood when
			 * the socket filled is what conn_reader_progressed
			 * compares with (once per backlog, off the fast path). */
			if (!c->c_delivered_known) {
				int queued;

				c->c_delivered_seen = conn_delivered(c, &queued);
				c->c_delivered_known = 1;
			}
			event_add(c->c_write_ev, NULL);
			return;
		}
		c->c_dead = 1;		/* EPIPE, ECONNRESET: the peer is gone */
		event_del(c->c_read_ev);
		return;
	}
	c->c_out_off = c->c_out_len = 0;
}

static void
conn_out_append(struct conn *c, const char *data, size_t len)
{
	if (c->c_out_len + len > c->c_out_cap && c->c_out_off > 0) {
		/* What a slow reader has taken makes room before the buffer
		 * grows: else one that never lets it empty grows it forever. */
		memmove(c->c_out, c->c_out + c->c_out_off,
		    c->c_out_len - c->c_out_off);
		c->c_out_len -= c->c_out_off;
		c->c_out_off = 0;
	}
	if (c->c_out_len + len > c->c_out_cap) {
		c->c_out_cap = (c->c_out_len + len) * 2;
		c->c_out = xrealloc(c->c_out, c->c_out_cap);
	}
	memcpy(c->c_out + c->c_out_len, data, len);
	c->c_out_len += len;
}

/*
 * The peer left (EOF, a reset, or a write that failed) while a handler holds
 * its reply on purpose: a held reply goes nowhere, so the handler answers
 * now, into the void, and the connection and its slot are freed at once.
 * (Half-close counts, as nginx takes it for a client that left: 499.)
 */
static void
conn_tell_gone(struct conn *c)
{
	request_gone_cb gone = c->c_req.rq_gone_cb;

	if (!c->c_pending || gone == NULL)
		return;
	c->c_dead = 1;
	c->c_req.rq_gone_cb = NULL;
	c->c_processing = 1;	/* the reply must not free c under us */
	gone(c->c_req.rq_gone_arg);
	c->c_processing = 0;
}

/* Reading paused behind a held reply: the read event cannot tell that the
 * peer left, so poll for it now and then. */
#define SERVER_GONE_POLL_US	 250000

static int
conn_peer_left(const struct conn *c)
{
	struct pollfd p = { .fd = c->c_fd, .events = POLLRDHUP };

	return poll(&p, 1, 0) == 1 &&
	    (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

static void
on_write(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;

	(void)fd;
	(void)what;
	conn_flush(c);
	if (c->c_dead) {
		/* A reset seen here first: the read event is gone with it. */
		conn_tell_gone(c);
		conn_settle(c);
		return;
	}
	if (c->c_read_paused && !conn_backlogged(c)) {
		conn_resume_reading(c);
		conn_process(c);	/* what waited in the buffer; settles c */
		return;
	}
	conn_settle(c);
}

/* The Date every reply carries (RFC 9110 6.6.1: a server with a clock
 * sends one), formatted once a second. */
static const char *
server_date(struct server *s)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME_COARSE, &ts);
	if (ts.tv_sec != s->s_date_sec || s->s_date[0] == '\0') {
		if (fmt_http_date(s->s_date, ts.tv_sec) == 0)
			s->s_date[0] = '\0';
		s->s_date_sec = ts.tv_sec;
	}
	return s->s_date;
}

static void
conn_refused(struct conn *c, int status, const char *why, const char *method,
    const char *target)
{
	struct server *s = c->c_server;

	if (s->s_on_refused)
		s->s_on_refused(s->s_arg, status, why,
		    c->c_has_peer ? c->c_peer : NULL, method, target);
}

/* Answers a protocol error the handler never saw, then closes; rq is the
 * request whose head was parsed, or NULL when its line is not known. */
static void
conn_error_in(struct conn *c, const struct http_request *rq, int status,
    const char *msg)
{
	char buf[512];
	int n;

	conn_refused(c, status, msg, rq ? rq->rq_method : NULL,
	    rq ? rq->rq_uri : NULL);

	n = snprintf(buf, sizeof(buf), "HTTP/1.1 %d %s\r\nDate: %s\r\n"
	    "Content-Type: application/json\r\nContent-Length: %zu\r\n"
	    "Connection: close\r\n\r\n{\"error\":\"%s\"}", status, reason(status),
	    server_date(c->c_server), strlen(msg) + 12, msg);
	conn_out_append(c, buf, (size_t)n);
	c->c_closing = 1;
	c->c_lingering = 1;	/* whatever follows is not a request */
	conn_flush(c);
}

/* The same before the head is parsed: the request line is not known (a
 * stale one of the connection's last request must not be named). */
static void
conn_error(struct conn *c, int status, const char *msg)
{
	conn_error_in(c, NULL, status, msg);
}

static int
header_is(const struct header *h, const char *name, size_t namelen)
{
	return h->namelen == namelen && strcasecmp(h->name, name) == 0;
}

/* RFC 9110 tchar, as a table: every byte of every header name is checked. */
static const unsigned char tchar_table[256] = {
	['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1, ['&'] = 1, ['\''] = 1,
	['*'] = 1, ['+'] = 1, ['-'] = 1, ['.'] = 1, ['^'] = 1, ['_'] = 1,
	['`'] = 1, ['|'] = 1, ['~'] = 1,
	['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1,
	['6'] = 1, ['7'] = 1, ['8'] = 1, ['9'] = 1,
	['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1,
	['G'] = 1, ['H'] = 1, ['I'] = 1, ['J'] = 1, ['K'] = 1, ['L'] = 1,
	['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1, ['Q'] = 1, ['R'] = 1,
	['S'] = 1, ['T'] = 1, ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1,
	['Y'] = 1, ['Z'] = 1,
	['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1,
	['g'] = 1, ['h'] = 1, ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1,
	['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1,
	['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1,
	['y'] = 1, ['z'] = 1,
};

static int
is_tchar(int ch)
{
	return tchar_table[(unsigned char)ch];
}

/* The length of the head including its blank line, or 0 if incomplete.
 * Bare LF line ends are accepted. */
static size_t
find_head_end(const char *buf, size_t len)
{
	const char *p = buf, *end = buf + len;

	while ((p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
		if (p + 1 < end && p[1] == '\n')
			return (size_t)(p + 2 - buf);
		if (p + 2 < end && p[1] == '\r' && p[2] == '\n')
			return (size_t)(p + 3 - buf);
		p++;
	}
	return 0;
}

/* Cuts the next line (ending in LF or CRLF) at *p, NUL-terminating it. */
static char *
next_line(char **p, char *end)
{
	char *line = *p, *nl = memchr(line, '\n', (size_t)(end - line));

	if (nl == NULL)
		return NULL;
	*nl = '\0';
	if (nl > line && nl[-1] == '\r')
		nl[-1] = '\0';
	*p = nl + 1;
	return line;
}

/* Doubles the header table, moving it to the heap the first time. */
static void
headers_grow(struct http_request *rq)
{
	int cap = rq->rq_headers_cap * 2;

	if (cap > SERVER_HEADERS_COUNT_MAX)
		cap = SERVER_HEADERS_COUNT_MAX;
	if (rq->rq_headers == rq->rq_headers_inline) {
		rq->rq_headers = xmalloc((size_t)cap * sizeof(*rq->rq_headers));
		memcpy(rq->rq_headers, rq->rq_headers_inline,
		    sizeof(rq->rq_headers_inline));
	} else
		rq->rq_headers = xrealloc(rq->rq_headers,
		    (size_t)cap * sizeof(*rq->rq_headers));
	rq->rq_headers_cap = cap;
}

/* Back to the inline table: a grown one goes with its request (kept, 4,000
 * fields held 98 kB per idle connection). */
static void
headers_release(struct http_request *rq)
{
	if (rq->rq_headers != rq->rq_headers_inline) {
		free(rq->rq_headers);
		rq->rq_headers = rq->rq_headers_inline;
		rq->rq_headers_cap = SERVER_HEADERS_INLINE;
	}
}

/* Parses the head in place; 0, or an HTTP error status with *why. */
static int
parse_head(struct http_request *rq, char *buf, size_t head_len, const char **why)
{
	char *p = buf, *end = buf + head_len, *line, *sp1, *sp2;
	int hosts = 0;

	if (memchr(buf, '\0', head_len)) {
		*why = "NUL byte in the request head";
		return 400;
	}
	/* Empty lines before the request line are ignored (RFC 9112 2.2). */
	do {
		if ((line = next_line(&p, end)) == NULL) {
			*why = "malformed request line";
			return 400;
		}
	} while (*line == '\0' && p < end);
	sp1 = strchr(line, ' ');
	sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
	if (sp1 == NULL || sp2 == NULL || sp1 == line || sp2 == sp1 + 1 ||
	    strchr(sp2 + 1, ' ')) {
		*why = "malformed request line";
		return 400;
	}
	*sp1 = *sp2 = '\0';
	for (const char *m = line; *m; m++)
		if (!is_tchar((unsigned char)*m)) {
			*why = "malformed method";
			return 400;
		}
	for (const char *u = sp1 + 1; *u; u++)
		if ((unsigned char)*u <= 0x20 || *u == 0x7f) {
			*why = "malformed request target";
			return 400;
		}
	if (strncmp(sp2 + 1, "HTTP/", 5) != 0) {
		*why = "malformed request line";
		return 400;
	}
	if (strncmp(sp2 + 1, "HTTP/1.", 7) != 0 || sp2[8] < '0' ||
	    sp2[8] > '9' || sp2[9] != '\0') {
		*why = "unsupported HTTP version";
		return 505;
	}
	rq->rq_method = line;
	rq->rq_uri = sp1 + 1;
	/* RFC 9112 2.3: a later 1.x is served as the 1.1 we speak, as nginx
	 * serves it. */
	rq->rq_minor = sp2[8] == '0' ? 0 : 1;
	rq->rq_nheaders = 0;
	while ((line = next_line(&p, end)) != NULL && *line != '\0') {
		char *colon = strchr(line, ':'), *v, *ve;

		if (*line == ' ' || *line == '\t') {
			*why = "obsolete header line folding";
			return 400;
		}
		if (colon == NULL || colon == line) {
			*why = "malformed header line";
			return 400;
		}
		*colon = '\0';
		for (const char *n = line; *n; n++)
			if (!is_tchar((unsigned char)*n)) {
				*why = "malformed header name";
				return 400;
			}
		v = colon + 1;
		while (*v == ' ' || *v == '\t')
			v++;
		ve = v + strlen(v);
		while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
			*--ve = '\0';
		/* Other control bytes pass (nginx forwards them too); the
		 * daemon escapes whatever it logs. A bare CR could split lines
		 * for a less careful reader downstream. */
		if (strchr(v, '\r')) {
			*why = "bare CR in a header value";
			return 400;
		}
		if (rq->rq_nheaders == rq->rq_headers_cap) {
			if (rq->rq_headers_cap >= SERVER_HEADERS_COUNT_MAX) {
				*why = "too many header fields";
				return 431;
			}
			headers_grow(rq);
		}
		rq->rq_headers[rq->rq_nheaders].name = line;
		rq->rq_headers[rq->rq_nheaders].namelen = (size_t)(colon - line);
		rq->rq_headers[rq->rq_nheaders].value = v;
		if (header_is(&rq->rq_headers[rq->rq_nheaders++], "Host", 4) &&
		    ++hosts > 1) {
			/* Which one names the route? RFC 9112 3.2 and nginx:
			 * neither, refuse. */
			*why = "more than one Host header";
			return 400;
		}
	}
	/* RFC 9112 3.2: an HTTP/1.1 request must name its host (nginx
	 * refuses one that does not too). A 1.0 request may leave it out. */
	if (hosts == 0 && rq->rq_minor == 1) {
		*why = "HTTP/1.1 request without a Host header";
		return 400;
	}
	return 0;
}

/* Does a comma-separated header value list this token? */
static int
has_token(const char *value, const char *token)
{
	size_t tl = strlen(token);

	for (const char *p = value; p && *p;) {
		while (*p == ' ' || *p == '\t' || *p == ',')
			p++;
		if (strncasecmp(p, token, tl) == 0 &&
		    (p[tl] == '\0' || p[tl] == ',' || p[tl] == ' ' || p[tl] == '\t'))
			return 1;
		p = strchr(p, ',');
	}
	return 0;
}

/* Moves the parsed request's pointers after c_in moved in memory. */
static void
request_rebase(struct http_request *rq, const char *old, char *new)
{
#define REBASE(ptr) do { if (ptr) (ptr) = new + ((ptr) - old); } while (0)
	REBASE(rq->rq_method);
	REBASE(rq->rq_uri);
	REBASE(rq->rq_body);
	for (int i = 0; i < rq->rq_nheaders; i++) {
		REBASE(rq->rq_headers[i].name);
		REBASE(rq->rq_headers[i].value);
	}
#undef REBASE
}

/* The bytes of n answered requests (or empty lines) are done with: the
 * window moves past them. Copying the rest to the front instead, per
 * request, cost a pipeline of small requests in an 84 KiB buffer 84 KiB
 * of copying each, and loop turns of tens of milliseconds. */
static void
conn_in_consume(struct conn *c, size_t n)
{
	c->c_in_len -= n;
	if (c->c_in_len == 0) {
		c->c_in = c->c_in_buf;
		c->c_in_cap = c->c_in_size;
	} else {
		c->c_in += n;
		c->c_in_cap -= n;
	}
}

/* Takes back the room before the window, when room runs out. */
static void
conn_in_compact(struct conn *c)
{
	char *old = c->c_in;

	if (old == c->c_in_buf)
		return;
	memmove(c->c_in_buf, old, c->c_in_len);
	c->c_in = c->c_in_buf;
	c->c_in_cap = c->c_in_size;
	if (c->c_head_parsed)
		request_rebase(&c->c_req, old, c->c_in);
}

/* Makes room for `need` bytes of input in total; 0, or -1 past the limit. */
static int
conn_in_reserve(struct conn *c, size_t need)
{
	size_t size = c->c_in_size;
	char *old;

	if (need <= c->c_in_cap)
		return 0;
	conn_in_compact(c);
	if (need <= c->c_in_cap)
		return 0;
	if (need > SERVER_IN_LIMIT)
		return -1;
	while (size < need)
		size *= 2;
	if (size > SERVER_IN_LIMIT)
		size = SERVER_IN_LIMIT;
	old = c->c_in;
	c->c_in_buf = xrealloc(c->c_in_buf, size);
	c->c_in = c->c_in_buf;
	c->c_in_size = c->c_in_cap = size;
	if (c->c_head_parsed && c->c_in != old)
		request_rebase(&c->c_req, old, c->c_in);
	return 0;
}

/* Transfer-Encoding: chunked, and no other coding before it. */
static int
is_chunked(const char *te)
{
	while (*te == ' ' || *te == '\t')
		te++;
	if (strncasecmp(te, "chunked", 7) != 0)
		return 0;
	for (te += 7; *te == ' ' || *te == '\t'; te++)
		;
	return *te == '\0';
}

/* Can the line begun in buf (empty lines skipped) already not be a request
 * line? A method is a token ended by a space, so any other byte before
 * that space is wrong at once. A client speaking TLS or another protocol
 * to this port (a gateway set up for https) may never send a line end: it
 * hears 400 now, as nginx answers it, rather than waiting out
 * idle_timeout. */
static int
method_refused_early(const char *buf, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		if (is_tchar((unsigned char)buf[i]))
			continue;
		/* A line end is parse_head's to judge, whole. */
		return buf[i] != '\r' && buf[i] != '\n' && (buf[i] != ' ' || i == 0);
	}
	return 0;
}

/* Does the head begun in buf hold a CR that is no line end's? A head with
 * bare CRs for line ends never ends, so parse_head (which refuses a bare
 * CR) would not see it until idle_timeout: nginx answers 400 at once. */
static int
bare_cr(const char *buf, size_t len)
{
	const char *p = buf, *end = buf + len;

	while ((p = memchr(p, '\r', (size_t)(end - p))) != NULL && p + 1 < end) {
		if (p[1] != '\n')
			return 1;
		p += 2;
	}
	return 0;
}

/* Parses the head of the next request; 0 ok, 1 incomplete, -1 answered. */
static int
conn_parse_head(struct conn *c)
{
	struct http_request *rq = &c->c_req;
	const char *why = NULL, *cl, *te, *conn_hdr;
	size_t head_len = find_head_end(c->c_in, c->c_in_len);
	unsigned long long body = 0;
	int status, conn_close = 0, conn_keep = 0;

	if (head_len == 0 || head_len > SERVER_HEADERS_MAX) {
		if (head_len > SERVER_HEADERS_MAX || c->c_in_len > SERVER_HEADERS_MAX) {
			conn_error(c, 431, "request head larger than 16 KiB");
			return -1;
		}
		if (method_refused_early(c->c_in, c->c_in_len)) {
			conn_error(c, 400, "malformed method");
			return -1;
		}
		if (bare_cr(c->c_in, c->c_in_len)) {
			conn_error(c, 400, "bare CR in the request head");
			return -1;
		}
		return 1;
	}
	memset(rq, 0, offsetof(struct http_request, rq_headers));
	rq->rq_conn = c;
	if ((status = parse_head(rq, c->c_in, head_len, &why)) != 0) {
		conn_error(c, status, why);
		return -1;
	}
	cl = request_header(rq, "Content-Length");
	if ((te = request_header(rq, "Transfer-Encoding")) != NULL) {
		int lines = 0;

		for (int i = 0; i < rq->rq_nheaders; i++)
			lines += header_is(&rq->rq_headers[i], "Transfer-Encoding", 17);
		/* RFC 9112 6.1 and 6.3: a body chunked by a client that
		 * streams it (Go's http.Client, requests with a generator)
		 * is read; framing that could be read two ways is refused,
		 * and so is a coding nothing here can undo. */
		if (cl != NULL) {
			conn_error_in(c, &c->c_req, 400,
			    "both Transfer-Encoding and Content-Length");
			return -1;
		}
		if (rq->rq_minor == 0) {
			conn_error_in(c, &c->c_req, 400,
			    "Transfer-Encoding in an HTTP/1.0 request");
			return -1;
		}
		if (lines > 1) {	/* which one counts? as nginx */
			conn_error_in(c, &c->c_req, 400,
			    "Transfer-Encoding given twice");
			return -1;
		}
		if (!is_chunked(te)) {
			conn_error_in(c, &c->c_req, 501,
			    "Transfer-Encoding other than chunked");
			return -1;
		}
	}
	c->c_chunked = te != NULL;
	memset(&c->c_chunk, 0, sizeof(c->c_chunk));
	for (int i = 0; cl != NULL && i < rq->rq_nheaders; i++)
		if (header_is(&rq->rq_headers[i], "Content-Length", 14) &&
		    strcmp(rq->rq_headers[i].value, cl) != 0) {
			/* Two lengths: a request-smuggling attempt; refuse. */
			conn_error_in(c, &c->c_req, 400,
			    "conflicting Content-Length headers");
			return -1;
		}
	if (cl != NULL) {
		const char *d = cl;

		if (*d == '\0') {
			conn_error_in(c, &c->c_req, 400, "malformed Content-Length");
			return -1;
		}
		for (; *d; d++) {
			if (*d < '0' || *d > '9') {
				conn_error_in(c, &c->c_req, 400, "malformed Content-Length");
				return -1;
			}
			body = body * 10 + (unsigned long long)(*d - '0');
			if (body > SERVER_BODY_MAX) {
				conn_error_in(c, &c->c_req, 413,
				    "request body larger than 64 KiB");
				return -1;
			}
		}
	}
	/* Every Connection line (one list, RFC 9110 5.3), and close wins
	 * over keep-alive (RFC 9112 9.3), in 1.0 too. */
	for (int i = 0; i < rq->rq_nheaders; i++) {
		if (!header_is(&rq->rq_headers[i], "Connection", 10))
			continue;	/* one pass: a head may hold 1,300 of them */
		conn_hdr = rq->rq_headers[i].value;
		conn_close |= has_token(conn_hdr, "close");
		conn_keep |= has_token(conn_hdr, "keep-alive");
	}
	rq->rq_keepalive = !conn_close && (rq->rq_minor == 1 || conn_keep);
	rq->rq_head = strcmp(rq->rq_method, "HEAD") == 0;
	c->c_head_parsed = 1;
	c->c_head_len = head_len;
	c->c_body_need = (size_t)body;
	c->c_continue_sent = 0;
	if (conn_in_reserve(c, head_len + (size_t)body) == -1) {
		conn_error_in(c, &c->c_req, 413, "request too large");
		return -1;
	}
	return 0;
}

/* Drops empty lines before a request line (RFC 9112 2.2: some clients
 * send a CRLF after a body), so they neither end a head at once nor keep
 * an idle connection from counting as idle. Returns what is left. */
static size_t
conn_skip_empty_lines(struct conn *c)
{
	size_t n = 0;

	while (n < c->c_in_len && (c->c_in[n] == '\n' || (c->c_in[n] == '\r' &&
	    n + 1 < c->c_in_len && c->c_in[n + 1] == '\n')))
		n += c->c_in[n] == '\n' ? 1 : 2;
	if (n > 0)
		conn_in_consume(c, n);
	return c->c_in_len;
}

/* A body still to come: the client that asked for it hears it may send. */
static void
conn_continue(struct conn *c)
{
	static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
	const char *expect = request_header(&c->c_req, "Expect");

	if (expect && strcasecmp(expect, "100-continue") == 0 &&
	    c->c_req.rq_minor == 1 && !c->c_continue_sent) {
		conn_out_append(c, cont, sizeof(cont) - 1);
		conn_flush(c);
		c->c_continue_sent = 1;
	}
}

/*
 * A chunked body, once whole, decoded where it lies (after the head) and
 * its length returned; (size_t)-1 while incomplete or when answered with
 * an error. The encoded body is read within the input limit that a
 * Content-Length body of 64 KiB has, so chunks small enough to need more
 * than that for 64 KiB of data get 413 too.
 */
static size_t
conn_chunked_body(struct conn *c)
{
	const char *why = NULL;
	size_t end;

	switch (chunked_scan(&c->c_chunk, c->c_in + c->c_head_len,
	    c->c_in_len - c->c_head_len, SERVER_BODY_MAX, &end, &why)) {
	case CHUNKED_DONE:
		c->c_body_need = end;
		c->c_chunked = 0;	/* decoded: not again */
		return chunked_decode(c->c_in + c->c_head_len, end);
	case CHUNKED_MORE:
		if (c->c_in_len < SERVER_IN_LIMIT) {
			conn_continue(c);
			return (size_t)-1;
		}
		conn_error_in(c, &c->c_req, 413, "request too large: its head "
		    "and chunked body over 84 KiB");
		return (size_t)-1;
	case CHUNKED_TOO_LARGE:
		conn_error_in(c, &c->c_req, 413,
		    "request body larger than 64 KiB");
		return (size_t)-1;
	default:
		conn_error_in(c, &c->c_req, 400, why);
		return (size_t)-1;
	}
}

static void
on_more(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;

	(void)fd;
	(void)what;
	c->c_more = 0;
	conn_process(c);	/* settles c */
}

/*
 * Hands complete requests to the handler, one at a time, until one is
 * pending, input runs out, or the connection is closing. Requests answered
 * at once (a denied key from the deny cache, /healthz) would otherwise go
 * on for a whole pipeline: 200 connections pipelining a denied key took
 * loop turns of a second, in which other clients' checks waited and
 * Redis's replies went unread until their checks failed open. After
 * SERVER_REQUESTS_PER_TURN the rest waits for the next turn of the loop.
 */
static void
conn_process(struct conn *c)
{
	struct server *srv = c->c_server;
	struct http_request *rq = &c->c_req;
	size_t body_len;
	int handled = 0;

	if (c->c_processing || c->c_more)
		return;
	c->c_processing = 1;
	while (!c->c_pending && !c->c_closing && !c->c_dead && c->c_in_len > 0) {
		if (handled == SERVER_REQUESTS_PER_TURN) {
			struct timeval now = { 0, 0 };

			if (c->c_more_ev == NULL)
				c->c_more_ev = evtimer_new(srv->s_base, on_more, c);
			evtimer_add(c->c_more_ev, &now);
			c->c_more = 1;
			break;
		}
		/* What this pass answered goes out first, in one write. */
		if (conn_backlogged(c) && c->c_out_off == 0)
			conn_flush(c);
		if (c->c_dead)
			break;
		if (conn_backlogged(c)) {
			if (!c->c_read_paused) {
				event_del(c->c_read_ev);
				c->c_read_paused = 1;
			}
			break;
		}
		if (!c->c_head_parsed && conn_skip_empty_lines(c) == 0)
			break;
		if (!c->c_head_parsed && conn_parse_head(c) != 0)
			break;
		if (c->c_chunked) {
			if ((body_len = conn_chunked_body(c)) == (size_t)-1)
				break;
		} else if (c->c_in_len < c->c_head_len + c->c_body_need) {
			conn_continue(c);
			break;
		} else
			body_len = c->c_body_need;
		rq->rq_body = c->c_in + c->c_head_len;
		rq->rq_body_len = body_len;
		c->c_req_len = c->c_head_len + c->c_body_need;
		rq->rq_out_len = 0;
		rq->rq_arrival_us = c->c_read_us;
		c->c_pending = 1;
		handled++;
		srv->s_handler(rq, srv->s_arg);
	}
	if (c->c_out_off == 0 && c->c_out_len > 0 && !c->c_dead)
		conn_flush(c);
	c->c_processing = 0;
	conn_settle(c);
}

/* Only CR and LF: no request has begun (see conn_skip_empty_lines). */
static int
only_empty_lines(const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != '\r' && p[i] != '\n')
			return 0;
	return 1;
}

static void
on_read(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;
	ssize_t n;

	(void)what;
	if (c->c_lingering) {
		n = read(fd, c->c_in, c->c_in_cap);
		if (n > 0 || (n == -1 && (errno == EAGAIN || errno == EINTR)))
			return;
		event_del(c->c_read_ev);
		c->c_eof = 1;
		conn_settle(c);
		return;
	}
	if (c->c_in_cap - c->c_in_len < 1024 &&
	    conn_in_reserve(c, c->c_in_len + 1024) == -1 &&
	    c->c_in_len == c->c_in_cap) {
		/* Full: only pipelined bytes behind a pending request get here. */
		event_del(c->c_read_ev);
		c->c_read_paused = 1;
		if (c->c_req.rq_gone_cb)
			idle_arm(c, SERVER_GONE_POLL_US);
		return;
	}
	n = read(fd, c->c_in + c->c_in_len, c->c_in_cap - c->c_in_len);
	if (n > 0) {
		/* The idle clock restarts when a request begins, not with every
		 * byte of it: a head trickled a byte at a time (slowloris) must
		 * be complete within idle_timeout, like nginx's
		 * client_header_timeout. */
		if (!c->c_pending && c->c_in_len == 0 &&
		    !only_empty_lines(c->c_in, (size_t)n))
			c->c_active_us = mono_coarse_us();
		c->c_in_len += (size_t)n;
		c->c_read_us = mono_us();
		conn_process(c);
		return;
	}
	if (n == -1 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	/* EOF (a half-close still gets its replies) or a reset. */
	event_del(c->c_read_ev);
	if (n == 0)
		c->c_eof = 1;
	else
		c->c_dead = 1;
	conn_tell_gone(c);
	conn_settle(c);
}

/*
 * Replies wait for a reader that takes them slowly (a client that
 * pipelined a thousand requests and reads at its own pace): it is not idle
 * while it takes any, as nginx's send_timeout counts from the last
 * progress, not over the whole transfer. Progress is seen in steps of
 * the peer's receive window (64 KiB on loopback), so it is looked for
 * over a whole idle_timeout: since the socket filled, or since the last
 * look. With no mark to compare (the socket took everything, the peer's
 * buffers hold it), the first look sets one and waits another period.
 * 1 if the reader may stay, the timer re-armed.
 */
static int
conn_reader_progressed(struct conn *c)
{
	int queued;
	unsigned long long delivered = conn_delivered(c, &queued);

	if (c->c_out_len == c->c_out_off && c->c_lent == NULL && queued == 0) {
		c->c_delivered_known = 0;
		return 0;	/* nothing waits for it: idle */
	}
	if (c->c_delivered_known && delivered == c->c_delivered_seen)
		return 0;	/* took nothing in a whole period */
	c->c_delivered_known = 1;
	c->c_delivered_seen = delivered;
	c->c_active_us = mono_coarse_us();
	idle_arm(c, c->c_server->s_idle_us);
	return 1;
}

static void
on_idle(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;

	(void)fd;
	(void)what;
	if (c->c_pending && c->c_read_paused && c->c_req.rq_gone_cb) {
		if (conn_peer_left(c)) {
			conn_tell_gone(c);
			conn_settle(c);
		} else
			idle_arm(c, SERVER_GONE_POLL_US);
		return;
	}
	if (!c->c_shut) {
		long long left = c->c_active_us + c->c_server->s_idle_us -
		    mono_coarse_us();

		/* The handler's own deadline answers a pending request. */
		if (c->c_pending)
			left = c->c_server->s_idle_us;
		if (left > 0) {
			idle_arm(c, left);
			return;
		}
		if (conn_reader_progressed(c))
			return;
	}
	c->c_dead = 1;	/* idle, lingered out, or not reading its replies */
	conn_settle(c);
}

static void
on_accept(struct evconnlistener *lev, evutil_socket_t fd, struct sockaddr *sa,
    int salen, void *arg)
{
	struct server *srv = arg;
	struct conn *c = xcalloc(1, sizeof(*c));
	size_t total;
	int one = 1;

	(void)lev;
	(void)salen;
	c->c_server = srv;
	c->c_fd = fd;
	if (sa->sa_family == AF_INET || sa->sa_family == AF_INET6) {
		const void *addr = sa->sa_family == AF_INET ?
		    (const void *)&((struct sockaddr_in *)sa)->sin_addr :
		    (const void *)&((struct sockaddr_in6 *)sa)->sin6_addr;

		/* Replies are one small write: send it now, not after 40 ms. */
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		c->c_has_peer = inet_ntop(sa->sa_family, addr, c->c_peer,
		    sizeof(c->c_peer)) != NULL;
	}
	c->c_in_size = c->c_in_cap = SERVER_IN_INITIAL;
	c->c_in_buf = c->c_in = xmalloc(c->c_in_size);
	c->c_req.rq_headers = c->c_req.rq_headers_inline;
	c->c_req.rq_headers_cap = SERVER_HEADERS_INLINE;
	c->c_read_ev = event_new(srv->s_base, fd, EV_READ | EV_PERSIST, on_read, c);
	c->c_write_ev = event_new(srv->s_base, fd, EV_WRITE, on_write, c);
	c->c_idle_ev = evtimer_new(srv->s_base, on_idle, c);
	LIST_INSERT_HEAD(&srv->s_conns, c, c_entry);
	event_add(c->c_read_ev, NULL);
	c->c_active_us = mono_coarse_us();
	idle_arm(c, srv->s_idle_us);
	/* Over the cap, the connection idle longest makes room; at it, the
	 * worker stops accepting unless one is idle to make room for the
	 * next. (So the daemon holds one more than the cap while another
	 * connection goes from idle to busy in the meantime, or one more per
	 * worker when they accept at the same moment.) */
	if (++srv->s_nconns > srv->s_nconns_peak)
		srv->s_nconns_peak = srv->s_nconns;
	total = atomic_fetch_add_explicit(&conns_open, 1, memory_order_relaxed) + 1;
	/* As many as the daemon is over: another worker that took one past
	 * the cap, with nothing idle to close, leaves it to the next. */
	while (total > srv->s_max_conns && close_an_idle_connection(srv, c, 1))
		total = open_total();
	if (total > srv->s_max_conns)
		server_full(srv, 1);
	/* At the cap (after making room, too): the next needs another. */
	else if (total == srv->s_max_conns && !close_an_idle_connection(srv, c, 0))
		server_full(srv, 1);
}

/*
 * At the cap, the connection idle longest (no request under way, nothing
 * to send, nothing arriving) makes room, as nginx closes an idle
 * keep-alive connection when it runs out at worker_connections: else a
 * gateway's pool of idle connections would hold every slot while its new
 * connections, and a health probe's, waited in the backlog. A gateway
 * whose idle connection is closed opens another. One whose request has
 * stalled (conn_stalled) counts as idle here. Never the one just
 * accepted. 1 if there is one (closed if close_it).
 */
static int
close_an_idle_connection(struct server *srv, const struct conn *newest,
    int close_it)
{
	struct conn *c, *oldest = NULL;
	int tries, found = 0;

	/* One whose reply is out and that only waits for its client to
	 * close (lingering) goes first: it will never take a request. */
	LIST_FOREACH(c, &srv->s_conns, c_entry)
		if (c != newest && conn_lingering_out(c)) {
			oldest = c;
			found = 1;
			break;
		}
	/* A connection with a request waiting in its socket is not idle:
	 * skipped, and the next oldest looked at, a few times over. */
	for (tries = 0; tries < SERVER_IDLE_TRIES && !found; tries++) {
		oldest = NULL;
		LIST_FOREACH(c, &srv->s_conns, c_entry) {
			if (c == newest || c->c_skip || !conn_reclaimable(c))
				continue;
			if (oldest == NULL || c->c_active_us < oldest->c_active_us)
				oldest = c;
		}
		if (oldest == NULL)
			break;
		if (conn_request_waiting(oldest))
			oldest->c_skip = 1;
		else
			found = 1;
	}
	LIST_FOREACH(c, &srv->s_conns, c_entry)
		c->c_skip = 0;
	if (found && close_it)
		conn_free(oldest);
	return found;
}

static int
conn_older(const void *a, const void *b)
{
	const struct conn *x = *(struct conn *const *)a;
	const struct conn *y = *(struct conn *const *)b;

	return (x->c_active_us > y->c_active_us) - (x->c_active_us < y->c_active_us);
}

/* The cap lowered (a reload) below what is open: up to `excess` idle ones
 * go now, longest idle first, as they would one by one for new connections
 * at the cap; else new connections waited until enough of the idle ones
 * reached server.idle_timeout. One pass and a sort: the cap may drop by
 * thousands. */
static void
close_idle_connections(struct server *srv, size_t excess)
{
	struct conn **idle = xcalloc(srv->s_nconns, sizeof(*idle));
	struct conn *c;
	size_t n = 0;

	LIST_FOREACH(c, &srv->s_conns, c_entry)
		if (conn_lingering_out(c) ||
		    (conn_reclaimable(c) && !conn_request_waiting(c)))
			idle[n++] = c;
	qsort(idle, n, sizeof(*idle), conn_older);
	for (size_t i = 0; i < n && i < excess; i++)
		conn_free(idle[i]);
	free(idle);
}

static void
full_arm(struct server *srv)
{
	struct timeval tv = tv_us(SERVER_SILENT_IDLE_US);

	evtimer_add(srv->s_full_ev, &tv);
}

/*
 * At server.max_connections: new connections wait in the kernel's backlog
 * (nginx at worker_connections does the same) until one closes. Each
 * connection holds buffers, up to 80 KiB while a body arrives: the cap is
 * what bounds the memory a flood of connections can take.
 */
static void
server_full(struct server *srv, int tell_others)
{
	long long now = mono_us();

	if (srv->s_full || srv->s_listener == NULL)
		return;
	srv->s_full = 1;
	evconnlistener_disable(srv->s_listener);
	full_arm(srv);
	if (tell_others) {
		struct server *o;

		pthread_mutex_lock(&servers_lock);
		LIST_FOREACH(o, &servers, s_entry)
			if (o != srv)
				event_active(o->s_cap_ev, 0, 0);
		pthread_mutex_unlock(&servers_lock);
	}
	if (srv->s_max_conns > 0 && (srv->s_full_logged_us == 0 ||
	    now - srv->s_full_logged_us >= SERVER_ACCEPT_LOG_US)) {
		size_t total = open_total();

		log_warnx("%zu connection%s open (%zu in this worker), at "
		    "server.max_connections %zu; new ones wait", total,
		    total == 1 ? "" : "s", srv->s_nconns, srv->s_max_conns);
		srv->s_full_logged_us = now;
	}
}

/* Out of server_full: there is room again. */
static void
server_room(struct server *srv)
{
	if (srv->s_full) {
		srv->s_full = 0;
		evtimer_del(srv->s_full_ev);
		accept_again(srv);
	}
}

/* Another worker reached the cap: one with nothing idle to close stops
 * accepting now, not after taking one more connection past the cap. */
static void
on_cap_reached(evutil_socket_t fd, short what, void *arg)
{
	struct server *srv = arg;

	(void)fd;
	(void)what;
	if (!srv->s_full && open_total() >= srv->s_max_conns &&
	    !close_an_idle_connection(srv, NULL, 0))
		server_full(srv, 0);
}

/* Full, and nothing closed or went idle since: a connection that has
 * said nothing may have become idle by waiting (conn_idle). The next
 * connection accepted closes it. */
static void
on_full(evutil_socket_t fd, short what, void *arg)
{
	struct server *srv = arg;

	(void)fd;
	(void)what;
	if (!srv->s_full)
		return;
	/* Room made in another worker is seen here: its closes wake only
	 * itself. */
	if (open_total() < srv->s_max_conns ||
	    close_an_idle_connection(srv, NULL, 0))
		server_room(srv);
	else
		full_arm(srv);
}

/* Are connections waiting in the listening socket's backlog? */
static int
server_has_waiters(struct server *srv)
{
	struct pollfd pfd;

	if (srv->s_listener == NULL)
		return 0;
	pfd.fd = evconnlistener_get_fd(srv->s_listener);
	pfd.events = POLLIN;
	return poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLIN);
}

static void
accept_again(struct server *srv)
{
	if (srv->s_listener && !srv->s_full &&
	    !evtimer_pending(srv->s_accept_retry_ev, NULL))
		evconnlistener_enable(srv->s_listener);
}

/* Out of descriptors: pause accepting instead of spinning on EMFILE. */
static void
on_accept_error(struct evconnlistener *lev, void *arg)
{
	struct server *srv = arg;
	struct timeval tv = { 0, SERVER_ACCEPT_RETRY_US };
	int err = EVUTIL_SOCKET_ERROR();

	if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
		long long now = mono_us();

		/* Once, then once every 10 s with a count: a pause every
		 * 100 ms is 36,000 lines an hour per worker otherwise. */
		if (srv->s_accept_logged_us == 0 ||
		    now - srv->s_accept_logged_us >= SERVER_ACCEPT_LOG_US) {
			if (srv->s_accept_unlogged)
				log_warnx("accept: %s; pausing for %d ms (and %llu "
				    "more pauses since)", strerror(err),
				    SERVER_ACCEPT_RETRY_US / 1000,
				    srv->s_accept_unlogged);
			else
				log_warnx("accept: %s; pausing for %d ms",
				    strerror(err), SERVER_ACCEPT_RETRY_US / 1000);
			srv->s_accept_logged_us = now;
			srv->s_accept_unlogged = 0;
		} else
			srv->s_accept_unlogged++;
		evconnlistener_disable(lev);
		event_add(srv->s_accept_retry_ev, &tv);
	}
}

static void
on_quiet(evutil_socket_t fd, short what, void *arg)
{
	struct server *srv = arg;

	(void)fd;
	(void)what;
	/* A new burst within the second: its connections need the memory,
	 * and the next fall arms this again. */
	if (!fallen_from_peak(srv))
		return;
	srv->s_nconns_peak = srv->s_nconns;
	srv->s_on_quiet(srv->s_arg);
}

static void
on_accept_retry(evutil_socket_t fd, short what, void *arg)
{
	struct server *srv = arg;

	(void)fd;
	(void)what;
	accept_again(srv);
}

struct server *
server_new(struct event_base *base, int listen_fd, server_handler handler,
    void *arg)
{
	struct server *srv = xcalloc(1, sizeof(*srv));
	int fd;

	LIST_INIT(&srv->s_conns);
	srv->s_base = base;
	srv->s_max_conns = SIZE_MAX;
	srv->s_handler = handler;
	srv->s_arg = arg;
	server_set_idle_timeout(srv, 60LL * 1000000);
	if ((fd = dup(listen_fd)) == -1)
		fatal("dup");
	/* Backlog 0: the socket is listening already. With -1 libevent calls
	 * listen(fd, 128) again and cuts main's backlog down to 128, and a
	 * burst of connects then loses SYNs to 1 s retransmits. */
	srv->s_listener = evconnlistener_new(base, on_accept, srv,
	    LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd);
	if (srv->s_listener == NULL)
		fatalx("cannot listen");
	evconnlistener_set_error_cb(srv->s_listener, on_accept_error);
	srv->s_accept_retry_ev = evtimer_new(base, on_accept_retry, srv);
	srv->s_full_ev = evtimer_new(base, on_full, srv);
	srv->s_quiet_ev = evtimer_new(base, on_quiet, srv);
	srv->s_cap_ev = event_new(base, -1, 0, on_cap_reached, srv);
	pthread_mutex_lock(&servers_lock);
	LIST_INSERT_HEAD(&servers, srv, s_entry);
	pthread_mutex_unlock(&servers_lock);
	return srv;
}

void
server_on_quiet(struct server *srv, server_quiet_cb cb)
{
	srv->s_on_quiet = cb;
}

void
server_on_refused(struct server *srv, server_refused_cb cb)
{
	srv->s_on_refused = cb;
}

void
server_set_idle_timeout(struct server *srv, long long us)
{
	srv->s_idle_us = us;	/* each connection's next timer uses it */
}

void
server_set_max_connections(struct server *srv, size_t n)
{
	size_t total = open_total();

	srv->s_max_conns = n;
	/* Each worker closes its part of the excess, in proportion to what
	 * it holds, rounded down; then one at a time while the daemon is
	 * still over, as the others' closes change the total meanwhile. */
	if (total > n)
		close_idle_connections(srv, (total - n) * srv->s_nconns / total);
	while (open_total() > n && close_an_idle_connection(srv, NULL, 1))
		;
	total = open_total();
	if (total > n || (total == n && !close_an_idle_connection(srv, NULL, 0)))
		server_full(srv, 0);
	else
		server_room(srv);
}

void
server_stop_accepting(struct server *srv)
{
	if (srv->s_listener) {
		evconnlistener_free(srv->s_listener);
		srv->s_listener = NULL;
	}
	event_del(srv->s_accept_retry_ev);
}

void
server_drain(struct server *srv)
{
	struct conn *c, *next;

	server_stop_accepting(srv);
	srv->s_draining = 1;
	for (c = LIST_FIRST(&srv->s_conns); c != NULL; c = next) {
		next = LIST_NEXT(c, c_entry);
		if (!conn_quiet(c))
			continue;	/* its reply, or its close, is coming */
		/* A request already in the socket is answered (with close)
		 * rather than reset by closing over it unread. */
		if (conn_request_waiting(c))
			continue;
		c->c_closing = 1;
		conn_settle(c);
	}
}

int
server_busy(struct server *srv)
{
	struct conn *c;

	LIST_FOREACH(c, &srv->s_conns, c_entry) {
		if (c->c_dead)
			continue;
		if (c->c_out_len != 0)
			return 1;
		/* A lingering connection's input is only dropped. */
		if (!c->c_lingering && (c->c_pending || c->c_in_len > 0 ||
		    conn_request_waiting(c)))
			return 1;
	}
	return 0;
}

void
server_free(struct server *srv)
{
	if (srv == NULL)
		return;
	pthread_mutex_lock(&servers_lock);
	LIST_REMOVE(srv, s_entry);
	pthread_mutex_unlock(&servers_lock);
	server_stop_accepting(srv);
	while (!LIST_EMPTY(&srv->s_conns))
		conn_free(LIST_FIRST(&srv->s_conns));
	event_free(srv->s_accept_retry_ev);
	event_free(srv->s_full_ev);
	event_free(srv->s_quiet_ev);
	event_free(srv->s_cap_ev);
	free(srv);
}

long long
request_arrival_us(const struct http_request *req)
{
	return req->rq_arrival_us;
}

const char *
request_method(const struct http_request *req)
{
	return req->rq_method;
}

const char *
request_uri(const struct http_request *req)
{
	return req->rq_uri;
}

const char *
request_header(const struct http_request *req, const char *name)
{
	return request_header_nth(req, name, 0);
}

const char *
request_header_nth(const struct http_request *req, const char *name,
    unsigned nth)
{
	size_t namelen = strlen(name);

	for (int i = 0; i < req->rq_nheaders; i++)
		if (header_is(&req->rq_headers[i], name, namelen) && nth-- == 0)
			return req->rq_headers[i].value;
	return NULL;
}

const char *
request_header_list(const struct http_request *req, const char *name,
    char *buf, size_t size)
{
	const char *first = NULL;
	size_t namelen = strlen(name), o = 0;
	int n = 0;

	for (int i = 0; i < req->rq_nheaders; i++) {
		const char *v = req->rq_headers[i].value;
		size_t vl;

		if (!header_is(&req->rq_headers[i], name, namelen))
			continue;
		vl = strlen(v);
		if (n++ == 0)
			first = v;
		if (o + vl + 3 > size)
			break;		/* keep what fits: the walk is right to left */
		if (o) {
			memcpy(buf + o, ", ", 2);
			o += 2;
		}
		memcpy(buf + o, v, vl);
		o += vl;
	}
	if (n <= 1)
		return first;
	buf[o] = '\0';
	return buf;
}

const char *
request_body(const struct http_request *req, size_t *len)
{
	*len = req->rq_body_len;
	return req->rq_body;
}

const char *
request_peer(const struct http_request *req)
{
	return req->rq_conn->c_has_peer ? req->rq_conn->c_peer : NULL;
}

void
request_add_header(struct http_request *req, const char *name, const char *value)
{
	size_t nl = strlen(name), vl = strlen(value);

	if (req->rq_out_len + nl + vl + 4 > sizeof(req->rq_out))
		return;		/* cannot happen with our few, short headers */
	memcpy(req->rq_out + req->rq_out_len, name, nl);
	req->rq_out_len += nl;
	memcpy(req->rq_out + req->rq_out_len, ": ", 2);
	req->rq_out_len += 2;
	memcpy(req->rq_out + req->rq_out_len, value, vl);
	req->rq_out_len += vl;
	memcpy(req->rq_out + req->rq_out_len, "\r\n", 2);
	req->rq_out_len += 2;
}

int
request_on_peer_gone(struct http_request *req, request_gone_cb cb, void *arg)
{
	struct conn *c = req->rq_conn;

	if (c->c_dead || c->c_eof) {
		/* Gone before the hold began: the reply will go nowhere. */
		c->c_dead = 1;
		return -1;
	}
	req->rq_gone_cb = cb;
	req->rq_gone_arg = arg;
	if (c->c_read_paused)
		idle_arm(c, SERVER_GONE_POLL_US);
	return 0;
}

/* Appends s to a reply head of SERVER_REPLY_HEAD_MAX bytes; what cannot
 * fit is cut (our status lines and content types are far shorter). */
#define SERVER_REPLY_HEAD_MAX	256
static size_t
head_put(char *head, size_t n, const char *s)
{
	size_t l = strlen(s);
	/* The length and Connection lines after the last cut take < 48. */
	size_t room = n < SERVER_REPLY_HEAD_MAX - 48 ? SERVER_REPLY_HEAD_MAX - 48 - n : 0;

	if (l > room)
		l = room;
	memcpy(head + n, s, l);
	return n + l;
}

void
request_refused(struct http_request *req, int status, const char *why)
{
	conn_refused(req->rq_conn, status, why, req->rq_method, req->rq_uri);
}

void
request_reply(struct http_request *req, int status, const char *content_type,
    const char *body, size_t len)
{
	request_reply_lent(req, status, content_type, body, len, NULL, NULL);
}

void
request_reply_lent(struct http_request *req, int status,
    const char *content_type, const char *body, size_t len,
    void (*release)(void *), void *arg)
{
	struct conn *c = req->rq_conn;
	char head[SERVER_REPLY_HEAD_MAX], num[FMT_LL_MAX];
	size_t n = 0;
	/* Draining, every reply is its connection's last; at the connection
	 * cap too while others wait in the backlog, so that they get a turn;
	 * and over it (lowered by a reload while connections were busy), so
	 * that the daemon comes back under it. */
	int keepalive = req->rq_keepalive && !c->c_server->s_draining &&
	    !(c->c_server->s_full && server_has_waiters(c->c_server)) &&
	    open_total() <= c->c_server->s_max_conns;

	c->c_pending = 0;
	c->c_answered = 1;
	req->rq_gone_cb = NULL;
	if (!c->c_dead) {
		/* Built by hand: snprintf's format parsing showed in profiles of
		 * the hot path, and every piece here is short and bounded. */
		/* 1.1 to a 1.0 request too, as nginx does: the version we
		 * speak (RFC 9110 2.5), not the client's. */
		n = head_put(head, n, "HTTP/1.1 ");
		fmt_ll(num, status);
		n = head_put(head, n, num);
		n = head_put(head, n, " ");
		n = head_put(head, n, reason(status));
		n = head_put(head, n, "\r\nDate: ");
		n = head_put(head, n, server_date(c->c_server));
		n = head_put(head, n, "\r\n");
		if (content_type) {
			n = head_put(head, n, "Content-Type: ");
			n = head_put(head, n, content_type);
			n = head_put(head, n, "\r\n");
		}
		n = head_put(head, n, "Content-Length: ");
		fmt_ll(num, (long long)len);
		n = head_put(head, n, num);
		n = head_put(head, n, "\r\n");
		if (!keepalive)
			n = head_put(head, n, "Connection: close\r\n");
		else if (req->rq_minor == 0)
			n = head_put(head, n, "Connection: keep-alive\r\n");
		conn_out_append(c, head, n);
		conn_out_append(c, req->rq_out, req->rq_out_len);
		conn_out_append(c, "\r\n", 2);
		if (!req->rq_head && len && release == NULL)
			conn_out_append(c, body, len);
		else if (!req->rq_head && len) {
			c->c_lent = body;
			c->c_lent_len = len;
			c->c_lent_off = 0;
			c->c_lent_release = release;
			c->c_lent_arg = arg;
			release = NULL;		/* the connection's to call now */
		}
		if (!keepalive) {
			c->c_closing = 1;
			/* Bytes after this request (a client pipelining past
			 * its own close): closing with them unread sends a
			 * reset, which can destroy this reply. */
			if (c->c_in_len > c->c_req_len || conn_request_waiting(c))
				c->c_lingering = 1;
		}
		/* Else the write event is armed already; or conn_process,
		 * answering a pipeline, writes its replies in one go. */
		if (c->c_out_off == 0 && !c->c_processing)
			conn_flush(c);
	}
	if (release != NULL)
		release(arg);	/* not kept: sent as HEAD, or to no one */
	conn_in_consume(c, c->c_req_len);
	c->c_req_len = 0;
	c->c_head_parsed = 0;
	headers_release(req);
	conn_resume_reading(c);
	c->c_active_us = mono_coarse_us();
	if (!c->c_processing)
		conn_process(c);	/* pipelined requests; may free c */
}
