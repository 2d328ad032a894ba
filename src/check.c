/*
 * The check lifecycle. A struct check comes from the worker's pool, so a
 * check allocates nothing of its own; it owns its HTTP request, a timer
 * (the Redis deadline, then the shaping delay), a reference to the policy it
 * started with, and the hiredis call record.
 *
 * Ownership: check_finish replies exactly once. If hiredis still holds the
 * call record at that point (the deadline fired first), the check stays out
 * of the pool until the late reply arrives and is dropped; hiredis always
 * calls back, with NULL when the link dies, so nothing leaks and nothing is
 * touched after it is reused.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <event2/event.h>
#include <jansson.h>

#include "check.h"
#include "clock.h"
#include "config.h"
#include "denycache.h"
#include "http.h"
#include "jsonout.h"
#include "limiter.h"
#include "log.h"
#include "logheld.h"
#include "metrics.h"
#include "policy.h"
#include "server.h"
#include "store.h"
#include "worker.h"
#include "xmalloc.h"

/* A decoded query-string key: as long as any URI we accept (a JSON body's
 * path can be nearly 64 KiB), so a key is never cut, and two long keys
 * cannot meet in one counter. */
#define CHECK_QUERY_KEY_MAX	(SERVER_BODY_MAX + 1)
/* An absolute-form URI's authority, as long as any URI we accept: never
 * cut, so a long one cannot come to match a route's host. */
#define CHECK_AUTHORITY_MAX	POLICY_PATH_MAX
/* Idle checks kept for reuse (about 1.6 KB each): enough for the steady
 * concurrency of a busy sidecar; a spike above it is freed as it ends. */
#define CHECK_POOL_MAX		1024
/* The least Redis time a check gets once its turn comes (see check_run). */
#define CHECK_DEADLINE_FLOOR_US	10000

enum check_phase { CHECK_IDLE, CHECK_WAITING, CHECK_DELAYED, CHECK_DONE };

/* How a check ended, which decides status, headers and metrics. */
enum check_outcome {
	OUTCOME_VERDICT,	/* Redis (or the deny cache) decided */
	OUTCOME_NO_ROUTE,
	OUTCOME_UNLIMITED,	/* missing key allowed, or unlimited override */
	OUTCOME_MISSING_KEY,	/* missing key denied: 403 */
	OUTCOME_DEGRADED	/* Redis failed: the failure mode decides */
};

struct check {
	LIST_ENTRY(check)	 ck_entry;	/* pool or active list */
	struct worker		*ck_worker;
	struct http_request	*ck_req;
	struct config		*ck_config;	/* referenced while active */
	const struct route	*ck_route;
	const struct limit_set	*ck_set;
	long long		 ck_cost;
	int			 ck_json;	/* /v1/check: reply with a body */
	/* The client key as the JSON reply writes it, quoted; empty until
	 * check_run finds one (JSON replies only) */
	struct jsonout		 ck_json_key;
	char			 ck_json_key_first[128];
	char			 ck_client[LIMITER_CLIENT_MAX];
	struct event		*ck_timer;
	struct store_call	 ck_call;
	long long		 ck_start_us;
	long long		 ck_sent_us;	/* last handed to the store */
	enum check_phase	 ck_phase;
	int			 ck_redis_pending; /* hiredis holds ck_call */
	int			 ck_retried;	/* NOSCRIPT retried once */
	int			 ck_abandoned;	/* its client left during the hold */
	struct verdict		 ck_verdict;
};

static void check_on_timer(evutil_socket_t, short, void *);
static void check_send(struct check *);

static struct check *
check_get(struct worker *w, struct http_request *req, int json)
{
	struct check *ck = LIST_FIRST(&w->w_free_checks);

	if (ck) {
		LIST_REMOVE(ck, ck_entry);
		w->w_nfree_checks--;
	} else {
		ck = xcalloc(1, sizeof(*ck));
		ck->ck_worker = w;
		/* One priority for every event: libevent activates an
		 * iteration's I/O before its expired timers, so a reply that
		 * has arrived is used even when its deadline passed while the
		 * thread was descheduled. A lower priority for the deadline
		 * starved it: libevent runs a priority only when every higher
		 * one is idle, and under client load that was never (a check
		 * waited 1.05 s with a 50 ms redis.timeout). */
		ck->ck_timer = evtimer_new(w->w_base, check_on_timer, ck);
	}
	ck->ck_req = req;
	ck->ck_json = json;
	ck->ck_cost = 1;
	ck->ck_route = NULL;
	ck->ck_set = NULL;
	jsonout_init(&ck->ck_json_key, ck->ck_json_key_first,
	    sizeof(ck->ck_json_key_first));
	ck->ck_client[0] = '\0';
	ck->ck_retried = 0;
	ck->ck_abandoned = 0;
	ck->ck_redis_pending = 0;
	ck->ck_phase = CHECK_WAITING;
	ck->ck_start_us = request_arrival_us(req);
	ck->ck_config = config_ref(w->w_config);
	LIST_INSERT_HEAD(&w->w_active, ck, ck_entry);
	w->w_nactive++;
	metrics_in_flight(w->w_metrics, 1);
	return ck;
}

/* Back to the pool, once neither the HTTP side nor hiredis needs it. */
static void
check_release(struct check *ck)
{
	struct worker *w = ck->ck_worker;

	if (w->w_nfree_checks >= CHECK_POOL_MAX) {
		/* After a spike, give the memory back instead of pooling it. */
		event_free(ck->ck_timer);
		free(ck);
		return;
	}
	ck->ck_phase = CHECK_IDLE;
	LIST_INSERT_HEAD(&w->w_free_checks, ck, ck_entry);
	w->w_nfree_checks++;
}

static void check_on_peer_gone(void *);

void
check_pool_free(struct worker *w)
{
	while (!LIST_EMPTY(&w->w_free_checks)) {
		struct check *ck = LIST_FIRST(&w->w_free_checks);

		LIST_REMOVE(ck, ck_entry);
		w->w_nfree_checks--;
		event_free(ck->ck_timer);
		free(ck);
	}
}

static const char *
header_lookup(void *ctx, const char *name, unsigned nth)
{
	return request_header_nth(ctx, name, nth);
}

static void
add_header(struct http_request *req, const char *name, const char *value)
{
	if (value[0])
		request_add_header(req, name, value);
}

static void
add_rate_headers(struct http_request *req, const struct limiter_headers *h)
{
	add_header(req, "X-RateLimit-Limit", h->limit);
	add_header(req, "X-RateLimit-Remaining", h->remaining);
	add_header(req, "X-RateLimit-Reset", h->reset);
	add_header(req, "Retry-After", h->retry_after);
	add_header(req, "RateLimit-Policy", h->policy);
	add_header(req, "RateLimit", h->ratelimit);
}

/* ,"key": the client key, or null when the request had none (a route's
 * missing_key: allow) */
static void
json_key(struct jsonout *o, const struct check *ck)
{
	jsonout_raw(o, ",\"key\":");
	if (ck->ck_json_key.len)
		jsonout_rawn(o, ck->ck_json_key.buf, ck->ck_json_key.len);
	else
		jsonout_raw(o, "null");
}

/* "route": its name, or null */
static void
json_route(struct jsonout *o, const struct route *route)
{
	jsonout_raw(o, "\"route\":");
	if (route == NULL || jsonout_string(o, route->name, strlen(route->name)) == -1)
		jsonout_raw(o, "null");
}

static void
json_field_ll(struct jsonout *o, const char *name, long long v)
{
	jsonout_raw(o, name);
	jsonout_ll(o, v);
}

/* Replies with the JSON in o and its last bytes, tail. */
static void
reply_json(struct http_request *req, int status, struct jsonout *o,
    const char *tail)
{
	jsonout_raw(o, tail);
	request_reply(req, status, "application/json", o->buf, o->len);
}

/* /v1/check's verdict (SPEC 4.2), in jansson's compact form as before */
static void
verdict_json(struct jsonout *o, const struct check *ck, int allowed, int degraded)
{
	const struct limit_set *set = ck->ck_set;
	const struct verdict *v = &ck->ck_verdict;
	long long headline_remaining = -1, headline_reset = 0, headline_limit = 0;
	long long retry = 0;

	for (size_t i = 0; set && i < set->nlimits; i++) {
		const struct limit *l = &set->limits[i];

		if (!degraded && i == v->headline) {
			headline_remaining = v->r[i].remaining;
			headline_reset = limiter_ms_to_s(v->r[i].reset_ms);
			headline_limit = l->quota;
		}
		if (degraded && (headline_limit == 0 || l->quota < headline_limit))
			headline_limit = l->quota;
	}
	if (!degraded && !v->allowed) {
		retry = limiter_ms_to_s(v->retry_ms);
		if (retry < 1)
			retry = 1;
	}
	jsonout_raw(o, "{\"allowed\":");
	jsonout_bool(o, allowed);
	jsonout_raw(o, ",");
	json_route(o, ck->ck_route);
	json_key(o, ck);
	json_field_ll(o, ",\"limit\":", headline_limit);
	json_field_ll(o, ",\"remaining\":", headline_remaining);
	json_field_ll(o, ",\"reset\":", headline_reset);
	json_field_ll(o, ",\"retry_after\":", retry);
	jsonout_raw(o, ",\"degraded\":");
	jsonout_bool(o, degraded);
	jsonout_raw(o, ",\"limits\":[");
	for (size_t i = 0; set && i < set->nlimits; i++) {
		const struct limit *l = &set->limits[i];
		const char *algorithm = config_algorithm_name(l->algorithm);

		jsonout_raw(o, i ? ",{\"name\":" : "{\"name\":");
		jsonout_string(o, l->name, strlen(l->name));
		jsonout_raw(o, ",\"algorithm\":");
		jsonout_string(o, algorithm, strlen(algorithm));
		json_field_ll(o, ",\"limit\":", l->quota);
		json_field_ll(o, ",\"remaining\":", degraded ? -1 : v->r[i].remaining);
		json_field_ll(o, ",\"reset\":",
		    degraded ? 0 : limiter_ms_to_s(v->r[i].reset_ms));
		jsonout_raw(o, ",\"allowed\":");
		jsonout_bool(o, degraded ? allowed : v->r[i].allowed);
		jsonout_raw(o, "}");
	}
	jsonout_raw(o, "]}");
}

static void
access_log(const struct check *ck, int status, enum check_result result,
    long long took_us)
{
	static const char *const results[] = { "allowed", "denied",
	    "shadow_denied", "failed_open", "failed_closed", "no_route" };

	log_access(ck->ck_route ? ck->ck_route->name : NULL, ck->ck_client,
	    strlen(ck->ck_client), status, results[result], ck->ck_cost, took_us);
}

/* Replies once, counts, logs, and releases what it can. */
static void
check_finish(struct check *ck, enum check_outcome outcome)
{
	struct worker *w = ck->ck_worker;
	struct http_request *req = ck->ck_req;
	const struct config *c = ck->ck_config;
	const struct route *route = ck->ck_route;
	struct limiter_headers h;
	enum check_result result = RESULT_ALLOWED;
	int status = 200, allowed = 1;
	long long took;
	struct jsonout reply;	/* a reply's, when it has one */
	char reply_first[1024];

	jsonout_init(&reply, reply_first, sizeof(reply_first));
	event_del(ck->ck_timer);
	/* Not sent yet (a drain): it never will be, and it points into the
	 * policy released below. */
	if (ck->ck_redis_pending && store_cancel(&ck->ck_call))
		ck->ck_redis_pending = 0;
	switch (outcome) {
	case OUTCOME_NO_ROUTE:
		result = RESULT_NO_ROUTE;
		if (ck->ck_json) {
			jsonout_raw(&reply, "{\"allowed\":true,");
			json_route(&reply, NULL);
			reply_json(req, 200, &reply, "}");
		} else
			request_reply(req, 200, NULL, NULL, 0);
		break;
	case OUTCOME_UNLIMITED:
		if (ck->ck_json) {
			jsonout_raw(&reply, "{\"allowed\":true,");
			json_route(&reply, route);
			json_key(&reply, ck);
			reply_json(req, 200, &reply, ",\"unlimited\":true,"
			    "\"degraded\":false,\"limits\":[]}");
		} else
			request_reply(req, 200, NULL, NULL, 0);
		break;
	case OUTCOME_MISSING_KEY:
		/* A shadow route enforces nothing, this denial included: it
		 * is counted as what enforcement would have done, and the
		 * JSON reply names it beside the verdict. */
		result = route->shadow ? RESULT_SHADOW_DENIED : RESULT_DENIED;
		status = route->shadow ? 200 : 403;
		allowed = route->shadow;
		/* /check's body, plus the verdict a JSON client reads first. */
		if (ck->ck_json || !allowed) {
			jsonout_raw(&reply, "{");
			if (ck->ck_json) {
				jsonout_raw(&reply, "\"allowed\":");
				jsonout_bool(&reply, allowed);
				jsonout_raw(&reply, ",");
			}
			jsonout_raw(&reply, "\"error\":\"missing_key\",");
			json_route(&reply, route);
			reply_json(req, status, &reply, "}");
		} else
			request_reply(req, status, NULL, NULL, 0);
		break;
	case OUTCOME_DEGRADED:
		limiter_format_degraded(ck->ck_set, c->ietf_headers, &h);
		add_rate_headers(req, &h);
		if (config_route_failure_mode(c, route) == FAILURE_MODE_CLOSED) {
			/* A shadow route reports what enforcement would do but
			 * always lets the request through. */
			result = RESULT_FAILED_CLOSED;
			status = route->shadow ? 200 : 503;
			allowed = route->shadow;
		} else
			result = RESULT_FAILED_OPEN;
		if (ck->ck_json) {
			verdict_json(&reply, ck, allowed, 1);
			reply_json(req, status, &reply, "");
		} else if (status == 503) {
			jsonout_raw(&reply, "{\"error\":\"rate_limiter_unavailable\",");
			json_route(&reply, route);
			reply_json(req, 503, &reply, "}");
		} else
			request_reply(req, status, NULL, NULL, 0);
		break;
	case OUTCOME_VERDICT: {
		const struct verdict *v = &ck->ck_verdict;

		limiter_format(ck->ck_set, v, c->ietf_headers, &h);
		if (!v->allowed) {
			for (size_t i = 0; i < v->n; i++)
				if (!v->r[i].allowed)
					metrics_limit_denied(w->w_metrics,
					    ck->ck_set->limits[i].metric_id);
			if (route->shadow)
				result = RESULT_SHADOW_DENIED;
			else {
				result = RESULT_DENIED;
				status = config_route_deny_status(c, route);
				allowed = 0;
			}
		}
		if (route->shadow)
			h.retry_after[0] = '\0';	/* the request passes */
		add_rate_headers(req, &h);
		if (ck->ck_json) {
			verdict_json(&reply, ck, allowed, 0);
			reply_json(req, status, &reply, "");
		} else if (!allowed) {
			jsonout_raw(&reply, "{\"error\":\"rate_limited\",");
			json_route(&reply, route);
			jsonout_raw(&reply, ",\"retry_after\":");
			jsonout_raw(&reply, h.retry_after);
			reply_json(req, status, &reply, "}");
		} else
			request_reply(req, status, NULL, NULL, 0);
		break;
	}
	}
	took = mono_us() - ck->ck_start_us;
	metrics_check(w->w_metrics, route ? route->metric_id : 0, result,
	    (uint64_t)took * 1000);
	/* nginx's status for a client that closed before its reply. The
	 * result stays what the limiter decided: the admission is spent. */
	if (c->log_access)
		access_log(ck, ck->ck_abandoned ? 499 : status, result, took);

	ck->ck_phase = CHECK_DONE;
	ck->ck_req = NULL;
	jsonout_free(&reply);
	jsonout_free(&ck->ck_json_key);
	config_unref(ck->ck_config);
	ck->ck_config = NULL;
	LIST_REMOVE(ck, ck_entry);		/* off the active list */
	w->w_nactive--;
	metrics_in_flight(w->w_metrics, -1);
	if (!ck->ck_redis_pending)
		check_release(ck);
	if (w->w_draining && w->w_nactive == 0)
		worker_check_done(w);
}

/* A Redis error for the held line: named by the Redis it came from, which
 * during a reload's move is not always the one the policy names now. */
static void
note_redis_error(struct worker *w, const struct store *st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void
note_redis_error(struct worker *w, const struct store *st, const char *fmt, ...)
{
	char text[LOGHELD_TEXT_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	snprintf(w->w_redis_error_address, sizeof(w->w_redis_error_address),
	    "%s", store_address(st));
	logheld_note(&w->w_redis_errors, "%s", text);
}

static void
check_on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct check *ck = arg;

	(void)fd;
	(void)what;
	if (ck->ck_phase == CHECK_WAITING) {
		metrics_redis_error(ck->ck_worker->w_metrics, REDIS_ERROR_TIMEOUT);
		/* a stall too short for the watchdog is still told */
		note_redis_error(ck->ck_worker, ck->ck_redis_pending ?
		    ck->ck_call.sc_store : ck->ck_worker->w_store, "route %s: "
		    "no reply within redis.timeout (%lld ms)", ck->ck_route->name,
		    ck->ck_config->redis_timeout_us / 1000);
		check_finish(ck, OUTCOME_DEGRADED);
	} else if (ck->ck_phase == CHECK_DELAYED)
		check_finish(ck, OUTCOME_VERDICT);
}

static void
check_on_peer_gone(void *arg)
{
	struct check *ck = arg;

	ck->ck_abandoned = 1;
	check_finish(ck, OUTCOME_VERDICT);
}

/*
 * A Redis error reply (OOM under maxmemory, READONLY after a failover), or
 * a timeout, fails every check alike, tens of thousands a second: one line
 * a second per worker (w_redis_errors), saying how many it stands for.
 * The metrics count them all.
 */
void
check_tell_redis_errors(void *arg, const char *last_raw, const char *ago,
    unsigned long long more)
{
	struct worker *w = arg;
	/* The server's bytes in it escaped as every untrusted byte in a
	 * line is (the store has cut the password out); once per line,
	 * not per failed check. */
	char last[LOGHELD_TEXT_MAX * 4];

	log_escape(last, sizeof(last), last_raw, strlen(last_raw));
	/* Named as the store's lines are: which worker, which Redis. The
	 * others held back may be of any route and kind: the line names the
	 * latest, the metrics tell them apart. */
	if (more > 0)
		log_warnx("worker %d: redis %s: error%s on %s (and %llu more Redis "
		    "error%s, of any route or kind, since the last such line)",
		    w->w_id, w->w_redis_error_address, ago, last, more,
		    more == 1 ? "" : "s");
	else
		log_warnx("worker %d: redis %s: error%s on %s", w->w_id,
		    w->w_redis_error_address, ago, last);
}

static void
check_on_reply(void *arg, const struct store_result *res)
{
	struct check *ck = arg;
	struct worker *w = ck->ck_worker;

	ck->ck_redis_pending = 0;
	if (ck->ck_phase != CHECK_WAITING) {
		/* The deadline answered already (and counted its timeout): drop
		 * the late reply, or the failure of a link dropped since. */
		if (ck->ck_phase == CHECK_DONE)
			check_release(ck);
		return;
	}
	switch (res->status) {
	case STORE_NOSCRIPT:
		metrics_redis_error(w->w_metrics, REDIS_ERROR_NOSCRIPT);
		if (!ck->ck_retried) {
			/* The store queued SCRIPT LOAD ahead of this retry,
			 * which goes to the store serving now: one of a later
			 * policy, maybe, that must wait for this deadline. */
			ck->ck_retried = 1;
			if (ck->ck_config != w->w_config)
				store_take_deadlines(w->w_store, ck->ck_config);
			check_send(ck);
			return;
		}
		check_finish(ck, OUTCOME_DEGRADED);
		return;
	case STORE_DISCONNECTED:
		metrics_redis_error(w->w_metrics, REDIS_ERROR_DISCONNECTED);
		check_finish(ck, OUTCOME_DEGRADED);
		return;
	case STORE_ERROR:
		metrics_redis_error(w->w_metrics, REDIS_ERROR_ERROR);
		note_redis_error(w, ck->ck_call.sc_store, "route %s: %s",
		    ck->ck_route->name, res->error ? res->error : "unknown");
		check_finish(ck, OUTCOME_DEGRADED);
		return;
	case STORE_OK:
		break;
	}
	if (limiter_parse(ck->ck_set, res->ints, res->nints, &ck->ck_verdict) == -1) {
		note_redis_error(w, ck->ck_call.sc_store, "route %s: malformed "
		    "script reply", ck->ck_route->name);
		metrics_redis_error(w->w_metrics, REDIS_ERROR_ERROR);
		check_finish(ck, OUTCOME_DEGRADED);
		return;
	}
	if (!ck->ck_verdict.allowed &&
	    denycache_put(w->w_denycache, ck->ck_config, ck->ck_route, ck->ck_set,
	    ck->ck_client, ck->ck_cost, &ck->ck_verdict, ck->ck_sent_us,
	    mono_us(), res->link))
		metrics_deny_cache_eviction(w->w_metrics);
	/* Held while draining too: a verdict that arrives after SIGTERM must
	 * not pass ahead of the holds already waiting (all are released at
	 * their turn, or at drain_timeout). A shadow route holds nothing: a
	 * hold is enforcement, which it only reports (its delay is charged
	 * and its headers tell the truth). */
	if (ck->ck_verdict.allowed && ck->ck_verdict.delay_ms > 0 &&
	    !ck->ck_route->shadow) {
		struct timeval tv = tv_us(ck->ck_verdict.delay_ms * 1000);

		/* Shaping: the reply waits for its turn on a loop timer, unless
		 * its client has left, which ends the wait (a thousand held
		 * sockets would otherwise sit in CLOSE-WAIT, each with its
		 * buffers and a connection slot, for as long as the hold). */
		event_del(ck->ck_timer);
		if (request_on_peer_gone(ck->ck_req, check_on_peer_gone, ck) == -1) {
			check_on_peer_gone(ck);
			return;
		}
		ck->ck_phase = CHECK_DELAYED;
		event_add(ck->ck_timer, &tv);
		return;
	}
	check_finish(ck, OUTCOME_VERDICT);
}

/* Sends (or resends) the script call; answers by the failure mode if the
 * link cannot take it. */
static void
check_send(struct check *ck)
{
	struct worker *w = ck->ck_worker;

	ck->ck_call.sc_key_prefix = ck->ck_config->key_prefix;
	ck->ck_call.sc_route = ck->ck_route->name;
	ck->ck_call.sc_client = ck->ck_client;
	ck->ck_call.sc_set = ck->ck_set;
	ck->ck_call.sc_cost = ck->ck_cost;
	ck->ck_sent_us = mono_us();
	if (store_eval(w->w_store, &ck->ck_call, check_on_reply, ck) == -1) {
		metrics_redis_error(w->w_metrics, REDIS_ERROR_DISCONNECTED);
		check_finish(ck, OUTCOME_DEGRADED);
		return;
	}
	ck->ck_redis_pending = 1;
}

/* From a resolved route and client key to a reply or a pending call. */
static void
check_run(struct check *ck, const char *key, size_t keylen, int kind)
{
	struct worker *w = ck->ck_worker;
	long long deadline_us;
	struct timeval tv;

	if (ck->ck_route == NULL) {
		check_finish(ck, OUTCOME_NO_ROUTE);
		return;
	}
	if (key == NULL) {
		check_finish(ck, ck->ck_route->missing_key_allow ? OUTCOME_UNLIMITED :
		    OUTCOME_MISSING_KEY);
		return;
	}
	if (kind == POLICY_KEY_GLOBAL)
		strcpy(ck->ck_client, "*");
	else if (kind == POLICY_KEY_IP && policy_route_mixes_ip(ck->ck_route)) {
		/* "ip=" is no encoded value's start ('=' is always encoded), so
		 * a header spelling an address is not that address's client. */
		memcpy(ck->ck_client, "ip=", 3);
		limiter_encode_client(key, keylen, ck->ck_client + 3);
	} else
		limiter_encode_client(key, keylen, ck->ck_client);
	/* The key as the client sent it, when JSON can carry it: a query value
	 * decodes to any bytes ("k=%FF"), and one that is not UTF-8 is shown
	 * as in its Redis key and the log, percent-encoded. */
	if (ck->ck_json && ck->ck_json_key.len == 0 &&
	    jsonout_string(&ck->ck_json_key, key, keylen) == -1)
		jsonout_string(&ck->ck_json_key, ck->ck_client,
		    strlen(ck->ck_client));
	if (ck->ck_set == NULL)
		ck->ck_set = policy_limits(ck->ck_route, key, keylen,
		    kind == POLICY_KEY_IP);
	if (ck->ck_set->unlimited) {
		check_finish(ck, OUTCOME_UNLIMITED);
		return;
	}
	/* Only while the link it came from is up: with Redis gone, a check
	 * gets the failure mode's answer like any other (SPEC 3.1). */
	if (store_state(w->w_store) == STORE_UP &&
	    denycache_get(w->w_denycache, ck->ck_config, ck->ck_route, ck->ck_set,
	    ck->ck_client, ck->ck_cost, mono_us(), store_link(w->w_store),
	    &ck->ck_verdict)) {
		metrics_deny_cache_hit(w->w_metrics);
		check_finish(ck, OUTCOME_VERDICT);
		return;
	}
	/* Redis runs calls in order: while it has left one unanswered for
	 * redis.timeout, this one would wait behind it past its own deadline.
	 * Answer at once, as when the link is down; and the backlog of a Redis
	 * slower than the traffic stays what it can answer in that time. */
	if (store_behind(w->w_store, ck->ck_config->redis_timeout_us)) {
		metrics_redis_error(w->w_metrics, REDIS_ERROR_TIMEOUT);
		note_redis_error(w, w->w_store, "route %s: not sent: a call has "
		    "waited redis.timeout (%lld ms) for its reply",
		    ck->ck_route->name, ck->ck_config->redis_timeout_us / 1000);
		check_finish(ck, OUTCOME_DEGRADED);
		return;
	}
	/* The deadline counts from the check's arrival. A link that is not up
	 * refuses the call in check_send, which answers at once. */
	deadline_us = ck->ck_config->redis_timeout_us - (mono_us() - ck->ck_start_us);
	/* A check pipelined behind others may find its deadline gone when its
	 * turn comes, behind a shaped reply held on purpose: it still gets
	 * enough for a Redis that is answering (a silent one was handled
	 * above). */
	if (deadline_us < CHECK_DEADLINE_FLOOR_US)
		deadline_us = ck->ck_config->redis_timeout_us < CHECK_DEADLINE_FLOOR_US ?
		    ck->ck_config->redis_timeout_us : CHECK_DEADLINE_FLOOR_US;
	tv = tv_us(deadline_us);
	event_add(ck->ck_timer, &tv);
	check_send(ck);
}

/* The first of two headers with a value, else `otherwise`: an empty one
 * ("X-Original-URI:") counts as absent, as for key sources, rather than
 * resolving to no path, method or host and so to no route. */
static const char *
first_present(const char *(*lookup)(void *, const char *, unsigned), void *ctx,
    const char *a, const char *b, const char *otherwise)
{
	const char *v = lookup(ctx, a, 0);

	if (v == NULL || *v == '\0')
		v = lookup(ctx, b, 0);
	return v && *v ? v : otherwise;
}

/*
 * The original request's host: X-Forwarded-Host, which a proxy sets to
 * say it; else the authority of request_target when it is in absolute
 * form, which RFC 9112 3.2.2 puts in place of Host (nginx's $host reads
 * it so); else Host. request_target is the check request's own request
 * line, or /v1/check's "path": what the gateway or the caller wrote, never
 * an X-Original-URI a gateway may pass through from its client (no gateway
 * writes one absolute: nginx's $request_uri never has the authority).
 */
static const char *
original_host(const char *(*lookup)(void *, const char *, unsigned), void *ctx,
    const char *request_target, char *authority, size_t size)
{
	const char *host = lookup(ctx, "X-Forwarded-Host", 0);

	if (host && *host)
		return host;
	if (request_target && (host = policy_uri_authority(request_target,
	    authority, size)) != NULL)
		return host;
	host = lookup(ctx, "Host", 0);
	return host && *host ? host : NULL;
}

/* The client IP of the check request itself (peer, XFF, X-Real-IP). */
static void
request_client_ip(const struct config *c, struct http_request *req,
    char *ip, size_t size)
{
	char xff[SERVER_HEADERS_MAX];

	policy_client_ip(c, request_peer(req), request_header_list(req,
	    "X-Forwarded-For", xff, sizeof(xff)), request_header(req, "X-Real-IP"),
	    ip, size);
}

void
check_forward(struct worker *w, struct http_request *req, const char *rest)
{
	struct check *ck;
	char path[POLICY_PATH_MAX], qkey[CHECK_QUERY_KEY_MAX], ip[64];
	char authority[CHECK_AUTHORITY_MAX];
	struct check_input in;
	const char *uri, *key = NULL;
	size_t keylen = 0;
	int rc = -1;

	in.method = first_present(header_lookup, req, "X-Original-Method",
	    "X-Forwarded-Method", request_method(req));
	/* The request line's method is a token already. One from a header
	 * that is not ("$request_method $uri" in a gateway's config) would
	 * match no route's methods and so pass unlimited, unseen: as
	 * /v1/check's "method" field, it is refused, naming the header. */
	if (!config_token_ok(in.method)) {
		const char *h = request_header(req, "X-Original-Method");

		http_reply_json_error(req, 400, "header %s is not an HTTP method "
		    "(a token, such as GET)", h && *h ? "X-Original-Method" :
		    "X-Forwarded-Method");
		return;
	}
	ck = check_get(w, req, 0);
	uri = first_present(header_lookup, req, "X-Original-URI", "X-Forwarded-Uri",
	    rest);
	policy_normalize_uri(uri, path, sizeof(path), &in.query);
	in.path = path;
	in.host = original_host(header_lookup, req, request_uri(req), authority,
	    sizeof(authority));
	in.ip = NULL;
	in.header = header_lookup;
	in.header_ctx = req;

	ck->ck_route = policy_match(ck->ck_config, &in);
	/* Routes match on method, path, host and headers, never the IP:
	 * resolve it (XFF walk, two address conversions) only for a route
	 * that keys by it. */
	if (ck->ck_route && policy_route_keys_by_ip(ck->ck_route)) {
		request_client_ip(ck->ck_config, req, ip, sizeof(ip));
		in.ip = ip;
	}
	if (ck->ck_route && (rc = policy_client_key(ck->ck_route, &in, qkey,
	    sizeof(qkey), &key, &keylen)) == POLICY_KEY_NONE)
		key = NULL;
	check_run(ck, key, keylen, rc);
}

/* Case-insensitive header lookup in a JSON object of strings, which has no
 * repeated names (duplicate keys are refused). */
static const char *
json_header_lookup(void *ctx, const char *name, unsigned nth)
{
	const char *k;
	json_t *v;

	if (ctx == NULL || nth > 0)
		return NULL;
	json_object_foreach((json_t *)ctx, k, v)
		if (strcasecmp(k, name) == 0)
			return json_string_value(v);
	return NULL;
}

struct named_header {
	const char	*name;
	size_t		 at;	/* its place in the object */
};

static int
named_header_cmp(const void *a, const void *b)
{
	const struct named_header *x = a, *y = b;
	int d = strcasecmp(x->name, y->name);

	return d ? d : (x->at > y->at) - (x->at < y->at);
}

/*
 * The first name of the object that another names again in another case,
 * or NULL. Sorted, not compared pairwise: a 64 KiB body holds 7,000 names,
 * and comparing each with each took the worker 0.9 s.
 */
static const char *
header_named_twice(json_t *headers)
{
	size_t n = json_object_size(headers), i = 0;
	struct named_header *names, *twice = NULL;
	const char *k, *found = NULL;
	json_t *v;

	if (n < 2)
		return NULL;
	names = xcalloc(n, sizeof(*names));
	json_object_foreach(headers, k, v) {
		names[i].name = k;
		names[i].at = i;
		i++;
	}
	qsort(names, n, sizeof(*names), named_header_cmp);
	for (i = 1; i < n; i++)
		if (strcasecmp(names[i - 1].name, names[i].name) == 0 &&
		    (twice == NULL || names[i - 1].at < twice->at))
			twice = &names[i - 1];
	if (twice)
		found = twice->name;
	free(names);
	return found;
}

static const struct route *
route_by_name(const struct config *c, const char *name)
{
	for (size_t i = 0; i < c->nroutes; i++)
		if (strcmp(c->routes[i].name, name) == 0)
			return &c->routes[i];
	return NULL;
}

/* A JSON string with a NUL in it (decoded with JSON_ALLOW_NUL). */
static int
json_string_has_nul(const json_t *v)
{
	return strlen(json_string_value(v)) != json_string_length(v);
}

/* A JSON string with a CR or LF: no header field's value holds one. */
static int
json_string_breaks_line(const json_t *v)
{
	const char *s = json_string_value(v);
	size_t len = json_string_length(v);

	return memchr(s, '\r', len) != NULL || memchr(s, '\n', len) != NULL;
}

/* Validates the optional string field `name`; -1 after replying 400. */
static int
json_opt_string(struct http_request *req, json_t *body, const char *name,
    const char **out, size_t *outlen)
{
	json_t *v = json_object_get(body, name);

	*out = NULL;
	if (v == NULL || json_is_null(v))
		return 0;
	if (!json_is_string(v)) {
		http_reply_json_error(req, 400, "field \"%s\" must be a string", name);
		return -1;
	}
	*out = json_string_value(v);
	/* A key may hold any byte (a query's %00 decodes to one), so it
	 * can be named back; no path, method, host or address has a NUL. */
	if (outlen)
		*outlen = json_string_length(v);
	else if (json_string_has_nul(v)) {
		http_reply_json_error(req, 400, "field \"%s\" must not contain "
		    "\\u0000", name);
		return -1;
	}
	return 0;
}

/* What a /v1/check body says of the request it describes. */
struct described {
	const char	*method, *uri, *host, *ip;
	json_t		*headers;	/* NULL when absent */
};

/*
 * The described request as /check would read it, into in (its path
 * written to path; ip holds d->ip, canonical, or is where the peer's
 * address is written when the body names none).
 */
static void
json_describe(const struct config *c, struct http_request *req,
    const struct described *d, char *ip, size_t iplen, char *path,
    size_t pathlen, char authority[CHECK_AUTHORITY_MAX], struct check_input *in)
{
	const char *uri = d->uri;

	if (d->ip == NULL) {
		const char *xff = json_header_lookup(d->headers,
		    "X-Forwarded-For", 0);
		const char *real_ip = json_header_lookup(d->headers,
		    "X-Real-IP", 0);

		/* The described request's forwarding headers count as /check
		 * counts a gateway's: walked from the caller's own address,
		 * so only a caller in trusted_proxies is believed. */
		if ((xff && *xff) || (real_ip && *real_ip))
			policy_client_ip(c, request_peer(req), xff, real_ip, ip,
			    iplen);
		else
			request_client_ip(c, req, ip, iplen);
	}
	if (uri == NULL || *uri == '\0')
		uri = first_present(json_header_lookup, d->headers,
		    "X-Original-URI", "X-Forwarded-Uri", "/");
	policy_normalize_uri(uri, path, pathlen, &in->query);
	in->path = path;
	/* As /check resolves them, from the described request's own headers
	 * when not given; a described request with no method is a GET, as
	 * curl sends one. */
	in->method = d->method && *d->method ? d->method :
	    first_present(json_header_lookup, d->headers, "X-Original-Method",
	    "X-Forwarded-Method", "GET");
	in->host = d->host && *d->host ? d->host :
	    original_host(json_header_lookup, d->headers, d->uri, authority,
	    CHECK_AUTHORITY_MAX);
	in->ip = ip;
	in->header = json_header_lookup;
	in->header_ctx = d->headers;
}

void
check_json(struct worker *w, struct http_request *req)
{
	static const char *const fields[] = { "method", "path", "host", "ip",
	    "headers", "cost", "route", "key", NULL };
	size_t len;
	const char *data = request_body(req, &len);
	const struct config *c = w->w_config;
	char path[POLICY_PATH_MAX], qkey[CHECK_QUERY_KEY_MAX], ip[64];
	char authority[CHECK_AUTHORITY_MAX];
	const char *route_name, *key = NULL, *k;
	const struct route *route = NULL;
	const struct limit_set *set = NULL;
	struct described desc;
	struct check_input in;
	json_t *body, *headers, *v, *cost_v;
	json_error_t err;
	long long cost = 1;
	size_t keylen = 0;
	int kind = POLICY_KEY_VALUE;	/* {"route", "key"} names a value */
	struct check *ck;

	if (len == 0) {
		http_reply_json_error(req, 400, "empty body: expected a JSON object");
		return;
	}
	/* Any value decodes, so that a string or null is told it is not an
	 * object rather than that it is malformed. */
	body = json_loadb(data, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY |
	    JSON_ALLOW_NUL, &err);
	if (body == NULL) {
		/* jansson quotes the bytes near the error as they came, and
		 * they need not be UTF-8, which the reply cannot carry (a
		 * broken "\u" escape got a 500). */
		char text[JSON_ERROR_TEXT_LENGTH * 4];
		const char *why = log_escape_bytes(text, sizeof(text), err.text,
		    strlen(err.text));

		/* jansson's own wording names its flags and says little. */
		if (strstr(why, "NUL byte in object key"))
			why = "\\u0000 is not allowed in a field name";
		else if (strstr(why, "too big"))
			why = "number too big";
		http_reply_json_error(req, 400, "malformed JSON at line %d column %d: %s",
		    err.line, err.column, why);
		return;
	}
	if (!json_is_object(body)) {
		http_reply_json_error(req, 400, "body must be a JSON object");
		goto out;
	}
	json_object_foreach(body, k, v) {
		size_t i;

		for (i = 0; fields[i]; i++)
			if (strcmp(fields[i], k) == 0)
				break;
		if (fields[i] == NULL) {
			char esc[128];

			log_escape(esc, sizeof(esc), k, strlen(k));
			http_reply_json_error(req, 400, "unknown field \"%s\"", esc);
			goto out;
		}
	}
	cost_v = json_object_get(body, "cost");
	if (cost_v && !json_is_null(cost_v)) {
		if (!json_is_integer(cost_v)) {
			http_reply_json_error(req, 400, "field \"cost\" must be an integer");
			goto out;
		}
		cost = json_integer_value(cost_v);
		if (cost < 1) {
			http_reply_json_error(req, 400, "field \"cost\" must be at least 1");
			goto out;
		}
	}
	if (json_opt_string(req, body, "route", &route_name, NULL) == -1 ||
	    json_opt_string(req, body, "key", &key, &keylen) == -1 ||
	    json_opt_string(req, body, "method", &desc.method, NULL) == -1 ||
	    json_opt_string(req, body, "path", &desc.uri, NULL) == -1 ||
	    json_opt_string(req, body, "host", &desc.host, NULL) == -1 ||
	    json_opt_string(req, body, "ip", &desc.ip, NULL) == -1)
		goto out;
	/* One rule whichever form the body takes: where the route and key
	 * are named, or the route keys by none, the address goes unused, but
	 * a caller who sent a bad one hears of it. */
	if (desc.ip) {
		if (policy_canonical_ip(c->client_ipv6_prefix, desc.ip,
		    strlen(desc.ip), ip, sizeof(ip)) == -1) {
			http_reply_json_error(req, 400, "field \"ip\" is not an IP address");
			goto out;
		}
		desc.ip = ip;	/* canonical, where json_describe looks for it */
	}
	/* A method is a token (RFC 9110 9.1), as a request line carries it:
	 * "G ET" would never match a route's methods, and say nothing of
	 * why. */
	if (desc.method && *desc.method && !config_token_ok(desc.method)) {
		http_reply_json_error(req, 400, "field \"method\" is not an HTTP "
		    "method (a token, such as GET)");
		goto out;
	}
	/* What /check can carry in its 16 KiB head (nginx refuses a request
	 * line over 8 KiB): each regex route scans the whole path, so a longer
	 * one only buys a client more of the worker's time. */
	if (desc.uri && strlen(desc.uri) > SERVER_HEADERS_MAX) {
		http_reply_json_error(req, 400, "field \"path\" is longer than %d "
		    "bytes", SERVER_HEADERS_MAX);
		goto out;
	}
	headers = json_object_get(body, "headers");
	if (headers && !json_is_null(headers)) {
		if (!json_is_object(headers)) {
			http_reply_json_error(req, 400, "field \"headers\" must be an object");
			goto out;
		}
		json_object_foreach(headers, k, v) {
			char esc[128];

			if (config_token_ok(k) && json_is_string(v) &&
			    !json_string_has_nul(v) && !json_string_breaks_line(v))
				continue;
			log_escape(esc, sizeof(esc), k, strlen(k));
			if (!config_token_ok(k))	/* as /check's head would be */
				http_reply_json_error(req, 400, "field \"headers\": "
				    "\"%s\" is not a header name", esc);
			else if (!json_is_string(v))
				http_reply_json_error(req, 400, "field \"headers.%s\" "
				    "must be a string", esc);
			else if (json_string_has_nul(v))	/* no header value can */
				http_reply_json_error(req, 400, "field \"headers.%s\" "
				    "must not contain \\u0000", esc);
			else	/* nor a line end: /check's head refuses a bare CR */
				http_reply_json_error(req, 400, "field \"headers.%s\" "
				    "must not contain a CR or LF (\\r, \\n)", esc);
			goto out;
		}
		if ((k = header_named_twice(headers)) != NULL) {
			char esc[128];

			/* header names are case-insensitive: which one counts? */
			log_escape(esc, sizeof(esc), k, strlen(k));
			http_reply_json_error(req, 400, "field \"headers\" names \"%s\" "
			    "twice (header names are case-insensitive)", esc);
			goto out;
		}
	} else
		headers = NULL;
	desc.headers = headers;

	if (route_name) {
		/* Named directly: the route, and the key or else a
		 * description of the client. */
		if ((route = route_by_name(c, route_name)) == NULL) {
			char esc[256];

			log_escape(esc, sizeof(esc), route_name, strlen(route_name));
			http_reply_json_error(req, 400, "field \"route\": unknown route "
			    "\"%s\"", esc);
			goto out;
		}
		if (route->nkeys > 0 && route->keys[0].type == KEY_GLOBAL) {
			/* The route has one bucket, whoever the caller names:
			 * a named key of its own would be a bucket /check
			 * never charges, with a quota of its own. */
			key = "*";
			keylen = 1;
			kind = POLICY_KEY_GLOBAL;
		} else if (key == NULL && (desc.ip || desc.headers || desc.uri)) {
			/* The route named, the client described: its key is
			 * the one /check would resolve for that route. */
			json_describe(c, req, &desc, ip, sizeof(ip), path,
			    sizeof(path), authority, &in);
			if ((kind = policy_client_key(route, &in, qkey,
			    sizeof(qkey), &key, &keylen)) == POLICY_KEY_NONE)
				key = NULL;
		} else if (key == NULL || keylen == 0) {
			http_reply_json_error(req, 400, key ? "field \"key\" must not "
			    "be empty" : "field \"key\" is required with \"route\" "
			    "(or describe the client: \"ip\", \"headers\", \"path\")");
			goto out;
		} else {
			if (policy_route_keys_by_ip_alone(route) &&
			    policy_canonical_ip(c->client_ipv6_prefix, key,
			    keylen, ip, sizeof(ip)) == 0) {
				/* A route keyed by IP alone: an address is
				 * that client, however spelled, with its
				 * bucket and its overrides, as /check sees it. */
				key = ip;
				keylen = strlen(ip);
				kind = POLICY_KEY_IP;
			}
		}
	} else if (key) {
		/* Else the client would be resolved from the described
		 * request, not the key the caller believes it named. */
		http_reply_json_error(req, 400, "field \"key\" needs \"route\" "
		    "(or describe the request without it)");
		goto out;
	} else {
		json_describe(c, req, &desc, ip, sizeof(ip), path,
		    sizeof(path), authority, &in);
		route = policy_match(c, &in);
		if (route && (kind = policy_client_key(route, &in, qkey,
		    sizeof(qkey), &key, &keylen)) == POLICY_KEY_NONE)
			key = NULL;
	}
	if (route && key) {
		set = policy_limits(route, key, keylen, kind == POLICY_KEY_IP);
		if (!set->unlimited && cost > set->max_quota) {
			/* An override's quotas are not the route's: say which
			 * the caller is held to, or 1000 in the policy reads
			 * as a wrong 50 here. */
			http_reply_json_error(req, 400, "field \"cost\": %lld is above "
			    "the largest quota (%lld) of %s %s", cost,
			    set->max_quota, set == &route->limits ?
			    "route" : "this key's override on route",
			    route->name);
			goto out;
		}
	}
	ck = check_get(w, req, 1);
	ck->ck_route = route;
	ck->ck_set = set;
	ck->ck_cost = cost;
	check_run(ck, key, keylen, kind);
out:
	json_decref(body);
}

void
check_finish_all(struct worker *w)
{
	while (!LIST_EMPTY(&w->w_active)) {
		struct check *ck = LIST_FIRST(&w->w_active);

		if (ck->ck_phase == CHECK_DELAYED)
			check_finish(ck, OUTCOME_VERDICT);	/* held: let it pass */
		else
			check_finish(ck, OUTCOME_DEGRADED);
	}
}
