/*
 * Metrics. A worker writes only its own struct with relaxed atomic stores
 * (no lock prefix on the hot path: one writer), and a scrape on any thread
 * reads every worker's struct with relaxed loads and sums them. Route names
 * are interned once into a fixed table so a counter's slot never moves,
 * which is what lets a scrape read it without a lock.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "config.h"
#include "log.h"
#include "metrics.h"
#include "store.h"
#include "xmalloc.h"

/* Upper bounds in seconds: sub-millisecond checks need fine low buckets. */
static const double metrics_buckets[] = {
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1.0,
};
#define NBUCKETS (sizeof(metrics_buckets) / sizeof(metrics_buckets[0]))

/* Checks per script call: powers of two up to the largest max_batch. */
static const double batch_buckets[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000 };
#define NBATCH (sizeof(batch_buckets) / sizeof(batch_buckets[0]))
#define NHTTP_ERRORS 7	/* http_error_statuses */

typedef atomic_ullong counter_t;

struct metrics {
	struct metrics	*next;
	counter_t	 checks[METRICS_ROUTES_MAX][RESULT_COUNT];
	counter_t	 limit_denials[METRICS_LIMITS_MAX];
	counter_t	 buckets[NBUCKETS + 1];	/* last is +Inf */
	counter_t	 duration_ns_sum;
	counter_t	 redis_errors[REDIS_ERROR_COUNT];
	counter_t	 http_errors[NHTTP_ERRORS];
	counter_t	 batch[NBATCH + 1];	/* last is +Inf */
	counter_t	 batch_sum;
	counter_t	 deny_cache_hits;
	counter_t	 deny_cache_evictions;
	atomic_int	 redis_state;
	atomic_llong	 in_flight;
};

static pthread_mutex_t metrics_lock = PTHREAD_MUTEX_INITIALIZER;
static struct metrics *metrics_all;
static char *metrics_names[METRICS_ROUTES_MAX];
static atomic_uint metrics_nnames;
static counter_t metrics_reloads[2];
/* Until a reload fails, and again after one succeeds (see metrics_reload). */
static atomic_int metrics_last_reload_ok = 1;
/* Per route id, the results shown at 0 (see metrics_show_routes). */
static unsigned metrics_shown[METRICS_ROUTES_MAX];

/*
 * The (route, limit) names of ratelimitd_limit_denials_total, interned as
 * route names are: a slot never moves. Each route's labels are chained
 * from metrics_route_limits[route id], so interning a policy's limits
 * looks at one route's few, not at all of them. Slot 0 is what a limit
 * counts under past the table (and one no policy gave an id), shown as
 * route and limit "(other)" once it counts.
 */
struct limit_label {
	unsigned	 route_id;
	char		*name;
	unsigned	 next;		/* the route's next label, or 0 */
};
static struct limit_label metrics_limits[METRICS_LIMITS_MAX];
static atomic_uint metrics_nlimits = 1;
static unsigned metrics_route_limits[METRICS_ROUTES_MAX];
static unsigned char metrics_limit_shown[METRICS_LIMITS_MAX];
static int metrics_limits_full_said;

/* Beside the results' bits in metrics_shown: the route holds replies
 * (shaping), for ratelimitd_route_info. */
#define METRICS_SHOWN_SHAPES	(1u << RESULT_COUNT)

static const char *const result_names[RESULT_COUNT] = {
	"allowed", "denied", "shadow_denied", "failed_open", "failed_closed",
	"no_route",
};
/* Every error status the server and the handlers answer with, shown at 0
 * from the start so an alert on any of them has a series to watch. */
static const int http_error_statuses[NHTTP_ERRORS] = {
	400, 404, 413, 431, 500, 501, 505,
};
_Static_assert(NHTTP_ERRORS > 4, "500 is http_error_statuses[4]");

static const char *const error_names[REDIS_ERROR_COUNT] = {
	"timeout", "disconnected", "error", "noscript",
};

static void
bump(counter_t *c, unsigned long long by)
{
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + by,
	    memory_order_relaxed);
}

struct metrics *
metrics_new(void)
{
	struct metrics *m = xcalloc(1, sizeof(*m));

	pthread_mutex_lock(&metrics_lock);
	m->next = metrics_all;
	metrics_all = m;
	pthread_mutex_unlock(&metrics_lock);
	return m;
}

/* The id of a route name for labels; 0 is the empty route (no match). */
static unsigned
metrics_route_id(const char *name)
{
	unsigned n, id = 0;

	pthread_mutex_lock(&metrics_lock);
	if (metrics_names[0] == NULL) {
		metrics_names[0] = xstrdup("");
		atomic_store(&metrics_nnames, 1);
	}
	n = atomic_load(&metrics_nnames);
	for (unsigned i = 0; i < n; i++)
		if (strcmp(metrics_names[i], name) == 0) {
			id = i;
			goto out;
		}
	if (n < METRICS_ROUTES_MAX - 1) {
		metrics_names[n] = xstrdup(name);
		atomic_store(&metrics_nnames, n + 1);
		id = n;
		goto out;
	}
	/*
	 * Past the table (route names only ever add up, over reloads), a
	 * route is counted under a label no route can have: not under "",
	 * which means no route matched. The table bounds the series a
	 * scrape carries.
	 */
	if (n == METRICS_ROUTES_MAX - 1) {
		metrics_names[n] = xstrdup(METRICS_ROUTE_OTHER);
		atomic_store(&metrics_nnames, n + 1);
		log_warnx("metrics: more than %d route names since start; routes "
		    "named from now on are counted as route=\"%s\" until a restart",
		    METRICS_ROUTES_MAX - 2, METRICS_ROUTE_OTHER);
	}
	id = METRICS_ROUTES_MAX - 1;
out:
	pthread_mutex_unlock(&metrics_lock);
	return id;
}

/* The routes in force: route ids[i] shows the results in bit mask
 * results[i] (1u << enum check_result) even while they are 0, so a
 * Prometheus rate() sees their first increase. Replaces the last set. */
static void
metrics_show_routes(const unsigned *ids, const unsigned *results, size_t n)
{
	(void)metrics_route_id("");	/* id 0, even with no route */
	pthread_mutex_lock(&metrics_lock);
	memset(metrics_shown, 0, sizeof(metrics_shown));
	metrics_shown[0] = 1u << RESULT_NO_ROUTE;
	for (size_t i = 0; i < n; i++)
		metrics_shown[ids[i]] |= results[i];	/* "(other)" takes several */
	pthread_mutex_unlock(&metrics_lock);
}

/* delay is set only on a leaky_bucket (the loader refuses it elsewhere),
 * as the limiter reads it too. */
static int
set_shapes(const struct limit_set *set)
{
	for (size_t i = 0; i < set->nlimits; i++)
		if (set->limits[i].delay)
			return 1;
	return 0;
}

/* Does the route hold replies (a leaky_bucket with delay: true, not on
 * a shadow route, which holds none)? */
static int
route_shapes(const struct route *r)
{
	if (r->shadow)
		return 0;
	if (set_shapes(&r->limits))
		return 1;
	for (size_t i = 0; i < r->noverrides; i++)
		if (set_shapes(&r->overrides[i].set))
			return 1;
	return 0;
}

/* The id of a limit's denials series on a route; with metrics_lock held. */
static unsigned
limit_label_locked(unsigned route_id, const char *name)
{
	unsigned n = atomic_load(&metrics_nlimits);

	for (unsigned id = metrics_route_limits[route_id]; id; id = metrics_limits[id].next)
		if (strcmp(metrics_limits[id].name, name) == 0)
			return id;
	if (n == METRICS_LIMITS_MAX) {
		if (!metrics_limits_full_said) {
			metrics_limits_full_said = 1;
			log_warnx("metrics: more than %d route and limit names since "
			    "start; limits named from now on count their denials "
			    "as route=\"%s\",limit=\"%s\" until a restart",
			    METRICS_LIMITS_MAX - 1, METRICS_ROUTE_OTHER,
			    METRICS_ROUTE_OTHER);
		}
		return 0;
	}
	metrics_limits[n].route_id = route_id;
	metrics_limits[n].name = xstrdup(name);
	metrics_limits[n].next = metrics_route_limits[route_id];
	metrics_route_limits[route_id] = n;
	atomic_store(&metrics_nlimits, n + 1);
	return n;
}

/* Ids for a set's limits, shown from 0; with metrics_lock held. */
static void
show_limits_locked(unsigned route_id, struct limit_set *set)
{
	for (size_t j = 0; j < set->nlimits; j++) {
		struct limit *l = &set->limits[j];

		l->metric_id = limit_label_locked(route_id, l->name);
		if (l->metric_id != 0)
			metrics_limit_shown[l->metric_id] = 1;
	}
}

void
metrics_show_policy(struct config *c)
{
	unsigned *ids = xcalloc(c->nroutes ? c->nroutes : 1, sizeof(*ids));
	unsigned *results = xcalloc(c->nroutes ? c->nroutes : 1, sizeof(*results));

	for (size_t i = 0; i < c->nroutes; i++) {
		const struct route *r = &c->routes[i];

		c->routes[i].metric_id = ids[i] = metrics_route_id(r->name);
		results[i] = 1u << RESULT_ALLOWED |
		    1u << (r->shadow ? RESULT_SHADOW_DENIED : RESULT_DENIED) |
		    1u << (config_route_failure_mode(c, r) == FAILURE_MODE_CLOSED ?
		    RESULT_FAILED_CLOSED : RESULT_FAILED_OPEN) |
		    (route_shapes(r) ? METRICS_SHOWN_SHAPES : 0);
	}
	metrics_show_routes(ids, results, c->nroutes);
	pthread_mutex_lock(&metrics_lock);
	memset(metrics_limit_shown, 0, sizeof(metrics_limit_shown));
	for (size_t i = 0; i < c->nroutes; i++) {
		struct route *r = &c->routes[i];

		show_limits_locked(ids[i], &r->limits);
		for (size_t k = 0; k < r->noverrides; k++)
			show_limits_locked(ids[i], &r->overrides[k].set);
	}
	pthread_mutex_unlock(&metrics_lock);
	free(ids);
	free(results);
}

void
metrics_check(struct metrics *m, unsigned route_id, enum check_result r,
    uint64_t duration_ns)
{
	double s = (double)duration_ns / 1e9;
	size_t b = 0;

	bump(&m->checks[route_id][r], 1);
	while (b < NBUCKETS && s > metrics_buckets[b])
		b++;
	bump(&m->buckets[b], 1);
	bump(&m->duration_ns_sum, duration_ns);
}

void
metrics_limit_denied(struct metrics *m, unsigned limit_id)
{
	bump(&m->limit_denials[limit_id < METRICS_LIMITS_MAX ? limit_id : 0], 1);
}

void
metrics_redis_error(struct metrics *m, enum redis_error_kind kind)
{
	bump(&m->redis_errors[kind], 1);
}

void
metrics_http_error(struct metrics *m, int status)
{
	size_t i;

	for (i = 0; i < NHTTP_ERRORS; i++)
		if (http_error_statuses[i] == status)
			break;
	/* Every status answered is listed; one added later without its
	 * place here counts as its class's first rather than not at all. */
	if (i == NHTTP_ERRORS)
		i = status >= 500 ? 4 : 0;
	bump(&m->http_errors[i], 1);
}

void
metrics_redis_call(struct metrics *m, size_t checks)
{
	size_t b = 0;

	while (b < NBATCH && (double)checks > batch_buckets[b])
		b++;
	bump(&m->batch[b], 1);
	bump(&m->batch_sum, checks);
}

void
metrics_set_redis_state(struct metrics *m, int state)
{
	atomic_store_explicit(&m->redis_state, state, memory_order_relaxed);
}

/* The least advanced link of all workers (STORE_DOWN when there are
 * none); with metrics_lock held. */
static int
redis_state_min_locked(void)
{
	int least = -1;

	for (struct metrics *m = metrics_all; m; m = m->next) {
		int s = atomic_load_explicit(&m->redis_state, memory_order_relaxed);

		if (least < 0 || s < least)
			least = s;
	}
	return least < 0 ? STORE_DOWN : least;
}

int
metrics_redis_state_min(void)
{
	int least;

	pthread_mutex_lock(&metrics_lock);
	least = redis_state_min_locked();
	pthread_mutex_unlock(&metrics_lock);
	return least;
}

void
metrics_deny_cache_hit(struct metrics *m)
{
	bump(&m->deny_cache_hits, 1);
}

void
metrics_deny_cache_eviction(struct metrics *m)
{
	bump(&m->deny_cache_evictions, 1);
}

void
metrics_in_flight(struct metrics *m, int delta)
{
	atomic_store_explicit(&m->in_flight, atomic_load_explicit(&m->in_flight,
	    memory_order_relaxed) + delta, memory_order_relaxed);
}

void
metrics_reload(int ok)
{
	atomic_fetch_add(&metrics_reloads[ok ? 0 : 1], 1);
	/* The counters alone cannot say whether the file on disk is in force:
	 * an alert on increase(...{result="error"}[10m]) resolves after ten
	 * minutes while the file that failed is still there, not loaded. */
	atomic_store(&metrics_last_reload_ok, ok);
}

/* One Prometheus histogram: per-bucket counts (the last is +Inf) made
 * cumulative, then _sum (already formatted) and _count. */
static void
render_histogram(struct evbuffer *out, const char *name, const char *help,
    const double *bounds, size_t nbounds, const unsigned long long *counts,
    const char *sum)
{
	unsigned long long cum = 0;

	evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	for (size_t b = 0; b < nbounds; b++) {
		cum += counts[b];
		evbuffer_add_printf(out, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[b], cum);
	}
	cum += counts[nbounds];
	evbuffer_add_printf(out, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %s\n%s_count %llu\n",
	    name, cum, name, sum, name, cum);
}

static unsigned long long
load(counter_t *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
}

void
metrics_render(struct evbuffer *out)
{
	unsigned long long total, sum_ns = 0, errors[REDIS_ERROR_COUNT] = { 0 };
	unsigned long long http_errors[NHTTP_ERRORS] = { 0 };
	char sum[32];
	unsigned long long buckets[NBUCKETS + 1] = { 0 };
	unsigned long long batch[NBATCH + 1] = { 0 }, batch_sum = 0;
	unsigned long long deny_hits = 0, deny_evictions = 0;
	long long in_flight = 0;
	int least, nworkers = 0;
	unsigned n = atomic_load(&metrics_nnames), nlimits;
	struct metrics *m;

	pthread_mutex_lock(&metrics_lock);
	evbuffer_add_printf(out,
	    "# HELP ratelimitd_checks_total Checks answered, by route and result.\n"
	    "# TYPE ratelimitd_checks_total counter\n");
	for (unsigned id = 0; id < n; id++) {
		for (int r = 0; r < RESULT_COUNT; r++) {
			total = 0;
			for (m = metrics_all; m; m = m->next)
				total += load(&m->checks[id][r]);
			if (total == 0 && !(metrics_shown[id] & (1u << r)))
				continue;
			evbuffer_add_printf(out, "ratelimitd_checks_total{route=\"%s\","
			    "result=\"%s\"} %llu\n", metrics_names[id],
			    result_names[r], total);
		}
	}
	/* What a route's counts mean depends on how it is set: a shadow
	 * route's failed_closed and shadow_denied were answered 200, and a
	 * shaping route's durations include its holds. An alert
	 * joins on this (`unless on(route) ...{shadow="true"}`): the result
	 * series alone cannot say, as one counted stays after a reload. */
	evbuffer_add_printf(out,
	    "# HELP ratelimitd_route_info The routes in force, with how they answer.\n"
	    "# TYPE ratelimitd_route_info gauge\n");
	for (unsigned id = 1; id < n && id < METRICS_ROUTES_MAX - 1; id++) {
		unsigned shown = metrics_shown[id];

		if (!(shown & (1u << RESULT_ALLOWED)))
			continue;	/* not in force */
		evbuffer_add_printf(out, "ratelimitd_route_info{route=\"%s\","
		    "shadow=\"%s\",failure_mode=\"%s\",shapes=\"%s\"} 1\n",
		    metrics_names[id],
		    shown & (1u << RESULT_SHADOW_DENIED) ? "true" : "false",
		    shown & (1u << RESULT_FAILED_CLOSED) ? "closed" : "open",
		    shown & METRICS_SHOWN_SHAPES ? "true" : "false");
	}
	/* Which of a route's limits deny: a route with a burst and an
	 * hourly limit says which one its denials come from. */
	evbuffer_add_printf(out,
	    "# HELP ratelimitd_limit_denials_total Denied checks (shadow ones "
	    "included), by route and each limit that refused them.\n"
	    "# TYPE ratelimitd_limit_denials_total counter\n");
	nlimits = atomic_load(&metrics_nlimits);
	for (unsigned id = 0; id < nlimits; id++) {
		total = 0;
		for (m = metrics_all; m; m = m->next)
			total += load(&m->limit_denials[id]);
		if (total == 0 && !metrics_limit_shown[id])
			continue;
		evbuffer_add_printf(out, "ratelimitd_limit_denials_total{route=\"%s\","
		    "limit=\"%s\"} %llu\n", id ? metrics_names[metrics_limits[id].route_id] :
		    METRICS_ROUTE_OTHER, id ? metrics_limits[id].name :
		    METRICS_ROUTE_OTHER, total);
	}
	for (m = metrics_all; m; m = m->next) {
		for (size_t b = 0; b <= NBUCKETS; b++)
			buckets[b] += load(&m->buckets[b]);
		sum_ns += load(&m->duration_ns_sum);
		for (int k = 0; k < REDIS_ERROR_COUNT; k++)
			errors[k] += load(&m->redis_errors[k]);
		for (size_t k = 0; k < NHTTP_ERRORS; k++)
			http_errors[k] += load(&m->http_errors[k]);
		for (size_t b = 0; b <= NBATCH; b++)
			batch[b] += load(&m->batch[b]);
		batch_sum += load(&m->batch_sum);
		deny_hits += load(&m->deny_cache_hits);
		deny_evictions += load(&m->deny_cache_evictions);
		in_flight += atomic_load_explicit(&m->in_flight, memory_order_relaxed);
		nworkers++;
	}
	least = redis_state_min_locked();
	pthread_mutex_unlock(&metrics_lock);

	snprintf(sum, sizeof(sum), "%.9f", (double)sum_ns / 1e9);
	render_histogram(out, "ratelimitd_check_duration_seconds",
	    "Time from a check's arrival to its reply.", metrics_buckets, NBUCKETS,
	    buckets, sum);
	evbuffer_add_printf(out,
	    "# HELP ratelimitd_redis_errors_total Redis failures seen by checks, by kind.\n"
	    "# TYPE ratelimitd_redis_errors_total counter\n");
	for (int k = 0; k < REDIS_ERROR_COUNT; k++)
		evbuffer_add_printf(out, "ratelimitd_redis_errors_total{kind=\"%s\"} %llu\n",
		    error_names[k], errors[k]);
	snprintf(sum, sizeof(sum), "%llu", batch_sum);
	render_histogram(out, "ratelimitd_redis_batch_size",
	    "Checks carried by each script call sent to Redis.", batch_buckets,
	    NBATCH, batch, sum);
	evbuffer_add_printf(out,
	    "# HELP ratelimitd_deny_cache_hits_total Checks answered from a "
	    "worker's deny cache, with no Redis call.\n"
	    "# TYPE ratelimitd_deny_cache_hits_total counter\n"
	    "ratelimitd_deny_cache_hits_total %llu\n"
	    "# HELP ratelimitd_deny_cache_evictions_total Denials a worker's deny "
	    "cache gave up while they still held, for want of room.\n"
	    "# TYPE ratelimitd_deny_cache_evictions_total counter\n"
	    "ratelimitd_deny_cache_evictions_total %llu\n",
	    deny_hits, deny_evictions);
	evbuffer_add_printf(out,
	    "# HELP ratelimitd_redis_connected 1 when every worker's Redis link is up.\n"
	    "# TYPE ratelimitd_redis_connected gauge\n"
	    "ratelimitd_redis_connected %d\n",
	    nworkers > 0 && least == STORE_UP);
	evbuffer_add_printf(out,
	    "# HELP ratelimitd_http_errors_total Requests answered with an HTTP "
	    "error instead of being served (malformed, too large, an unknown "
	    "path, a bad field), by status.\n"
	    "# TYPE ratelimitd_http_errors_total counter\n");
	for (size_t k = 0; k < NHTTP_ERRORS; k++)
		evbuffer_add_printf(out, "ratelimitd_http_errors_total{status=\"%d\"} %llu\n",
		    http_error_statuses[k], http_errors[k]);
	evbuffer_add_printf(out,
	    "# HELP ratelimitd_config_reloads_total Policy reloads, by result.\n"
	    "# TYPE ratelimitd_config_reloads_total counter\n"
	    "ratelimitd_config_reloads_total{result=\"success\"} %llu\n"
	    "ratelimitd_config_reloads_total{result=\"error\"} %llu\n",
	    load(&metrics_reloads[0]), load(&metrics_reloads[1]));
	evbuffer_add_printf(out,
	    "# HELP ratelimitd_config_last_reload_successful 0 while the last "
	    "reload failed: the policy in force is older than the file.\n"
	    "# TYPE ratelimitd_config_last_reload_successful gauge\n"
	    "ratelimitd_config_last_reload_successful %d\n",
	    atomic_load(&metrics_last_reload_ok));
	evbuffer_add_printf(out,
	    "# HELP ratelimitd_in_flight Checks waiting for Redis or a shaping delay.\n"
	    "# TYPE ratelimitd_in_flight gauge\n"
	    "ratelimitd_in_flight %lld\n", in_flight);
	evbuffer_add_printf(out,
	    "# HELP ratelimitd_log_lines_dropped_total Log lines dropped because "
	    "stderr was not read fast enough.\n"
	    "# TYPE ratelimitd_log_lines_dropped_total counter\n"
	    "ratelimitd_log_lines_dropped_total %llu\n", log_lines_dropped());
}
