/* The HTTP face of a worker: routing of endpoints and reply helpers. */
#ifndef HTTP_H
#define HTTP_H

#include <stddef.h>

#include <jansson.h>

struct http_request;
struct worker;

/* The server's handler: dispatches by path. */
void http_dispatch(struct http_request *req, void *arg);
/* Replies with a JSON body and takes the reference to o. */
void http_reply_json(struct http_request *req, int status, json_t *o);
void http_reply_json_error(struct http_request *req, int status,
    const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
