/*
 * A lean HTTP/1.1 server on the libevent loop: keep-alive, pipelining,
 * Content-Length bodies, size limits, idle timeout, and exactly one read and
 * one write per request on the hot path. A handler gets a request and must
 * answer it exactly once with request_reply, now or later.
 */
#ifndef SERVER_H
#define SERVER_H

#include <stddef.h>

struct event_base;
struct server;
struct http_request;

#define SERVER_HEADERS_MAX	16384	/* request line + headers, bytes */
#define SERVER_BODY_MAX		65536	/* request body, bytes */

typedef void (*server_handler)(struct http_request *req, void *arg);
typedef void (*request_gone_cb)(void *arg);
/* A request answered with an error instead of being served: the status,
 * why (escaped already), the peer (NULL for a unix socket), and method and
 * target when the request line could be read (else NULL, untrusted). */
typedef void (*server_refused_cb)(void *arg, int status, const char *why,
    const char *peer, const char *method, const char *target);

struct server *server_new(struct event_base *base, int listen_fd,
    server_handler handler, void *arg);
void server_set_idle_timeout(struct server *srv, long long us);
/* Told of every request the server refuses (with the handler's arg), and
 * of those the handler refuses through request_refused. */
void server_on_refused(struct server *srv, server_refused_cb cb);
/* Called (with the handler's arg) a second after the worker's connections
 * fell, and stayed, below a quarter of a peak of 128 or more: what the
 * peak took may go. */
typedef void (*server_quiet_cb)(void *arg);
void server_on_quiet(struct server *srv, server_quiet_cb cb);
/* Caps the connections open in all the workers together at n: at it, the
 * one idle longest in the worker taking a new one is closed for it; with
 * none idle, that worker stops accepting until there is room. */
void server_set_max_connections(struct server *srv, size_t n);
/* Stops accepting; connections already open keep being served. */
void server_stop_accepting(struct server *srv);
/*
 * Shutting down: stops accepting, closes the connections with nothing
 * under way, and makes every later reply the last of its connection
 * (Connection: close), as nginx does when it exits.
 */
void server_drain(struct server *srv);
/* Is a reply still going out, or a request coming in (read, or waiting
 * in a socket)? */
int server_busy(struct server *srv);
/* Closes every connection. Every request must have been answered. */
void server_free(struct server *srv);

const char *request_method(const struct http_request *req);
/* When the request arrived (CLOCK_MONOTONIC, us): the last read before it
 * was handed over, so a pipelined request that waited in the buffer behind
 * others counts from when its bytes came, not from when its turn came. */
long long request_arrival_us(const struct http_request *req);
/* The request target as sent (path and query). */
const char *request_uri(const struct http_request *req);
/* A header's value (case-insensitive name; the first if repeated) or NULL. */
const char *request_header(const struct http_request *req, const char *name);
/* The nth (from 0) line of a header sent on several lines, or NULL. */
const char *request_header_nth(const struct http_request *req,
    const char *name, unsigned nth);
/* A header sent on several lines, joined with ", " as one list (RFC 9110
 * 5.3) into buf; the value itself when sent once; NULL when absent. */
const char *request_header_list(const struct http_request *req,
    const char *name, char *buf, size_t size);
const char *request_body(const struct http_request *req, size_t *len);
/* The peer's IP address as text, or NULL for a unix socket peer. */
const char *request_peer(const struct http_request *req);
/* Adds a response header; both strings must be free of CR and LF. */
void request_add_header(struct http_request *req, const char *name,
    const char *value);
/*
 * For a reply held on purpose: cb(arg) runs if the client closes (or
 * half-closes) the connection before the reply, and must answer at once;
 * that reply, like any other after the client left, is dropped. Returns -1,
 * with no callback set, when the client has left already: answer now, and
 * the reply is dropped the same way.
 */
int request_on_peer_gone(struct http_request *req, request_gone_cb cb,
    void *arg);
/* The handler is about to answer req with an error status: tells the
 * server's refused callback. */
void request_refused(struct http_request *req, int status, const char *why);
/* Sends the reply; the request must not be touched afterwards. */
void request_reply(struct http_request *req, int status,
    const char *content_type, const char *body, size_t len);
/*
 * The same with a body that is not copied (one large reply sent to many
 * connections at once): the server writes it from body until it is out,
 * then calls release(arg), as it does at once when it is not sent. No
 * other request of the connection is read meanwhile.
 */
void request_reply_lent(struct http_request *req, int status,
    const char *content_type, const char *body, size_t len,
    void (*release)(void *), void *arg);

#endif
