/* The HTTP face of a worker: routing of endpoints and reply helpers. */
#ifndef HTTP_H
#define HTTP_H

#include <stddef.h>

#include <jansson.h>

struct http_request;
struct worker;

/* The server's handler: dispatches by path. */
void http_dispatch(struct http_request *req, void *arg);
/* The server's refused callback (server_on_refused): counts the refusal
 * and logs it through the worker's w_refusals, whose line is told by
 * http_tell_refusals. */
void http_on_refused(void *arg, int status, const char *why, const char *peer,
    const char *method, const char *target);
void http_tell_refusals(void *arg, const char *last, const char *ago,
    unsigned long long more);
/* Replies with a JSON body and takes the reference to o. */
void http_reply_json(struct http_request *req, int status, json_t *o);
void http_reply_json_error(struct http_request *req, int status,
    const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
