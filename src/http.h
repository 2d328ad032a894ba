/* The HTTP face of a worker: routing of endpoints and reply helpers. */
#ifndef HTTP_H
#define HTTP_H

#include <stddef.h>

struct evhttp_request;
struct worker;

#define HTTP_HEADERS_MAX	16384	/* request line + headers */
#define HTTP_BODY_MAX		65536	/* /v1/check bodies */

/* The evhttp general callback: dispatches by path. */
void http_dispatch(struct evhttp_request *req, void *arg);
/* Replies with our own headers (never evhttp_send_error, which drops them). */
void http_reply(struct evhttp_request *req, int status, const char *content_type,
    const char *body, size_t len);
void http_reply_json_error(struct evhttp_request *req, int status,
    const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const char *http_reason(int status);

#endif
