/*
 * Counters for /metrics (SPEC §7). Each worker owns one struct metrics and is
 * its only writer; a scrape sums all of them. Route labels are interned by
 * name so counters survive reloads.
 */
#ifndef METRICS_H
#define METRICS_H

#include <stddef.h>
#include <stdint.h>

struct evbuffer;

enum check_result {
	RESULT_ALLOWED, RESULT_DENIED, RESULT_SHADOW_DENIED, RESULT_FAILED_OPEN,
	RESULT_FAILED_CLOSED, RESULT_NO_ROUTE, RESULT_COUNT
};

enum redis_error_kind {
	REDIS_ERROR_TIMEOUT, REDIS_ERROR_DISCONNECTED, REDIS_ERROR_ERROR,
	REDIS_ERROR_NOSCRIPT, REDIS_ERROR_COUNT
};

#define METRICS_ROUTES_MAX 1024	/* distinct route names ever seen */
#define METRICS_ROUTE_OTHER "(other)"	/* the label past the table */
#define METRICS_LIMITS_MAX 4096	/* distinct (route, limit) names ever seen */

struct config;
struct metrics;

struct metrics *metrics_new(void);
/* Gives each route of a loaded policy its label's id (route->metric_id,
 * stable across reloads by name), and each of its limits, its overrides'
 * included, the id of its denials' series (limit->metric_id, by route and
 * limit name); shows the series the policy can move from 0, in place of
 * the last policy's. Once per policy, before a worker uses it. */
void metrics_show_policy(struct config *config);
void metrics_check(struct metrics *m, unsigned route_id, enum check_result r,
    uint64_t duration_ns);
/* A check was denied (or, on a shadow route, would have been), and this
 * limit (limit->metric_id) was one that refused it. */
void metrics_limit_denied(struct metrics *m, unsigned limit_id);
void metrics_redis_error(struct metrics *m, enum redis_error_kind kind);
/* A request was answered with an HTTP error status instead of being served
 * (malformed, too large, an unknown path, a bad field). */
void metrics_http_error(struct metrics *m, int status);
/* A check was answered from the worker's deny cache, with no Redis call. */
void metrics_deny_cache_hit(struct metrics *m);
/* The deny cache gave up a denial that still held, its set full. */
void metrics_deny_cache_eviction(struct metrics *m);
/* A script call carrying `checks` checks was sent. */
void metrics_redis_call(struct metrics *m, size_t checks);
/* The worker's Redis link state, an enum store_state. */
void metrics_set_redis_state(struct metrics *m, int state);
/* The least advanced link state of all workers: /readyz and the gauge say
 * the same thing, whichever worker is asked. */
int metrics_redis_state_min(void);
void metrics_in_flight(struct metrics *m, int delta);
void metrics_reload(int ok);
/* Appends the Prometheus text exposition of every worker's counters. */
void metrics_render(struct evbuffer *out);

#endif
