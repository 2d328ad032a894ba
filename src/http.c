/*
 * Endpoint dispatch: the forward-auth and JSON checks go to check.c, the
 * operations endpoints are answered here. Every reply carries its own
 * content type; errors are JSON {"error": "..."}.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <jansson.h>

#include "check.h"
#include "config.h"
#include "http.h"
#include "log.h"
#include "policy.h"
#include "metrics.h"
#include "server.h"
#include "store.h"
#include "worker.h"

void
http_reply_json(struct http_request *req, int status, json_t *o)
{
	char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);

	if (s == NULL) {
		/* A body that could not be built (json_pack refuses a string
		 * that is not UTF-8) is our bug, never a reason to crash. */
		static const char internal[] = "{\"error\":\"internal\"}";

		log_warnx("a JSON reply could not be built; answered 500");
		request_reply(req, 500, "application/json", internal,
		    sizeof(internal) - 1);
		json_decref(o);
		return;
	}
	request_reply(req, status, "application/json", s, strlen(s));
	free(s);
	json_decref(o);
}

/*
 * A gateway that sends what the daemon refuses (a header too large, a bad
 * cost, a path it does not serve) turns each refusal into an error of its
 * own (nginx's auth_request: a 500), and nothing here said why: an info
 * line tells the first refusal as it happens, then at most one a second
 * per worker, with how many it stands for; ratelimitd_http_errors_total
 * counts them all.
 */
void
http_on_refused(void *arg, int status, const char *why, const char *peer,
    const char *method, const char *target)
{
	struct worker *w = arg;

	metrics_http_error(w->w_metrics, status);
	if (!log_enabled(LOG_LEVEL_INFO))
		return;
	/* Escaped here, where what is the client's is known: the method and
	 * target; why is ours, its client bytes escaped already. */
	if (method && target) {
		char m[4 * 16 + 1], t[4 * 120 + 1];

		log_escape(m, sizeof(m), method, strnlen(method, 16));
		log_escape(t, sizeof(t), target, strnlen(target, 120));
		logheld_note(&w->w_refusals, "%s %s from %s: %d %s", m, t,
		    peer ? peer : "a unix socket peer", status, why);
	} else
		logheld_note(&w->w_refusals, "a request from %s: %d %s",
		    peer ? peer : "a unix socket peer", status, why);
}

void
http_tell_refusals(void *arg, const char *last, const char *ago,
    unsigned long long more)
{
	struct worker *w = arg;

	if (more > 0)
		log_info("worker %d: refused %s (%s%sand %llu more refused since "
		    "the last such line)", w->w_id, last, ago + (*ago == ' '),
		    *ago ? ", " : "", more);
	else if (*ago)
		log_info("worker %d: refused %s (%s)", w->w_id, last, ago + 1);
	else
		log_info("worker %d: refused %s", w->w_id, last);
}

void
http_reply_json_error(struct http_request *req, int status, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	request_refused(req, status, msg);
	http_reply_json(req, status, json_pack("{s:s}", "error", msg));
}

static void
serve_readyz(struct worker *w, struct http_request *req)
{
	/* Every worker's link, not only this one's: clients reach them all. */
	enum store_state st = (enum store_state)metrics_redis_state_min();
	int ready = w->w_config != NULL && st == STORE_UP && !w->w_draining;

	json_t *body = json_pack("{s:b,s:b,s:s}", "ready", ready, "policy",
	    w->w_config != NULL, "redis", store_state_name(st));

	/* Why a daemon with a policy and Redis is not ready: it is stopping. */
	if (w->w_draining)
		json_object_set_new(body, "draining", json_true());
	http_reply_json(req, ready ? 200 : 503, body);
}

static void
release_config(void *config)
{
	config_unref(config);
}

/* The body rendered at load, lent: a reply of a large policy is neither
 * rebuilt per request nor copied into every connection that asks. */
static void
serve_policy(struct worker *w, struct http_request *req)
{
	struct config *c = w->w_config;

	if (c->json == NULL) {
		http_reply_json_error(req, 500, "internal: the policy could not "
		    "be rendered as JSON");
		return;
	}
	request_reply_lent(req, 200, "application/json", c->json, c->json_len,
	    release_config, config_ref(c));
}

static void
serve_metrics(struct http_request *req)
{
	struct evbuffer *out = evbuffer_new();

	metrics_render(out);
	request_reply(req, 200, "text/plain; version=0.0.4; charset=utf-8",
	    (const char *)evbuffer_pullup(out, -1), evbuffer_get_length(out));
	evbuffer_free(out);
}

void
http_dispatch(struct http_request *req, void *arg)
{
	struct worker *w = arg;
	const char *uri = request_uri(req), *method = request_method(req);
	size_t plen;
	int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;

	/* A server must accept the absolute form (http://host/path), which a
	 * client talking to a proxy sends: the path chooses the endpoint, and
	 * the authority stands for Host (see check.c's original_host). */
	uri = policy_origin_form(uri);
	if (*uri == '\0')
		uri = "/";
	plen = strcspn(uri, "?#");

#define PATH_IS(s) (plen == sizeof(s) - 1 && strncmp(uri, s, plen) == 0)
	if (plen >= 6 && strncmp(uri, "/check", 6) == 0 &&
	    (plen == 6 || uri[6] == '/')) {
		check_forward(w, req, uri + 6);
		return;
	}
	/* A method these paths do not serve is "anything else" to SPEC 3.3,
	 * so a 404; Allow and the error still say which method would do. */
	if (PATH_IS("/v1/check")) {
		if (strcmp(method, "POST") != 0) {
			request_add_header(req, "Allow", "POST");
			http_reply_json_error(req, 404, "not found: /v1/check "
			    "answers POST, with a JSON body");
			return;
		}
		check_json(w, req);
		return;
	}
	if (!get && (PATH_IS("/healthz") || PATH_IS("/readyz") ||
	    PATH_IS("/metrics") || PATH_IS("/v1/policy"))) {
		request_add_header(req, "Allow", "GET, HEAD");
		http_reply_json_error(req, 404, "not found: this path answers "
		    "GET and HEAD");
		return;
	}
	if (PATH_IS("/healthz"))
		request_reply(req, 200, "text/plain", "ok", 2);
	else if (PATH_IS("/readyz"))
		serve_readyz(w, req);
	else if (PATH_IS("/metrics"))
		serve_metrics(req);
	else if (PATH_IS("/v1/policy"))
		serve_policy(w, req);
	else
		http_reply_json_error(req, 404, "not found");
#undef PATH_IS
}
