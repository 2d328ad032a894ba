/*
 * A rate-limit check from arrival to reply: resolve the route and the
 * client, ask Redis (or the deny cache) within the deadline, reply once.
 */
#ifndef CHECK_H
#define CHECK_H

struct http_request;
struct worker;

/* /check and /check/<path>: rest is the URI after "/check". */
void check_forward(struct worker *w, struct http_request *req, const char *rest);
/* POST /v1/check with a JSON body. */
void check_json(struct worker *w, struct http_request *req);
/* Drain: answers every check still waiting (Redis or a shaping delay). */
void check_finish_all(struct worker *w);
/* Frees the worker's pool of idle checks. */
void check_pool_free(struct worker *w);
/* The worker's w_redis_errors line (a logheld_tell; arg the worker). */
void check_tell_redis_errors(void *arg, const char *last, const char *ago,
    unsigned long long more);

#endif
