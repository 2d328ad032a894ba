/*
 * Endpoint dispatch and replies. Every reply goes through http_reply so that
 * status, content type and our rate-limit headers survive (evhttp_send_error
 * would replace them with text/html and Connection: close).
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <jansson.h>

#include "check.h"
#include "config.h"
#include "http.h"
#include "metrics.h"
#include "store.h"
#include "worker.h"

const char *
http_reason(int status)
{
	switch (status) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 413: return "Payload Too Large";
	case 429: return "Too Many Requests";
	case 500: return "Internal Server Error";
	case 503: return "Service Unavailable";
	default: return status < 500 ? "Client Error" : "Server Error";
	}
}

void
http_reply(struct evhttp_request *req, int status, const char *content_type,
    const char *body, size_t len)
{
	struct evbuffer *out = evhttp_request_get_output_buffer(req);
	struct evkeyvalq *hdrs = evhttp_request_get_output_headers(req);

	if (content_type)
		evhttp_add_header(hdrs, "Content-Type", content_type);
	if (len)
		evbuffer_add(out, body, len);
	evhttp_send_reply(req, status, http_reason(status), NULL);
}

void
http_reply_json_error(struct evhttp_request *req, int status, const char *fmt, ...)
{
	char msg[512];
	json_t *o;
	char *s;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	o = json_pack("{s:s}", "error", msg);
	s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
	http_reply(req, status, "application/json", s, strlen(s));
	free(s);
	json_decref(o);
}

static void
reply_json(struct evhttp_request *req, int status, json_t *o)
{
	char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);

	http_reply(req, status, "application/json", s, strlen(s));
	free(s);
	json_decref(o);
}

static void
serve_readyz(struct worker *w, struct evhttp_request *req)
{
	enum store_state st = store_state(w->w_store);
	int ready = w->w_config != NULL && st == STORE_UP && !w->w_draining;

	reply_json(req, ready ? 200 : 503, json_pack("{s:b,s:b,s:s}", "ready", ready,
	    "policy", w->w_config != NULL, "redis", store_state_name(st)));
}

static void
serve_metrics(struct evhttp_request *req)
{
	struct evbuffer *out = evhttp_request_get_output_buffer(req);

	metrics_render(out);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
	    "text/plain; version=0.0.4; charset=utf-8");
	evhttp_send_reply(req, 200, "OK", NULL);
}

void
http_dispatch(struct evhttp_request *req, void *arg)
{
	struct worker *w = arg;
	const char *uri = evhttp_request_get_uri(req);
	enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
	size_t plen = strcspn(uri, "?#");

#define PATH_IS(s) (plen == sizeof(s) - 1 && strncmp(uri, s, plen) == 0)
	if (plen >= 6 && strncmp(uri, "/check", 6) == 0 &&
	    (plen == 6 || uri[6] == '/')) {
		check_forward(w, req, uri + 6);
		return;
	}
	if (PATH_IS("/v1/check")) {
		if (cmd != EVHTTP_REQ_POST) {
			evhttp_add_header(evhttp_request_get_output_headers(req),
			    "Allow", "POST");
			http_reply_json_error(req, 405, "use POST for /v1/check");
			return;
		}
		check_json(w, req);
		return;
	}
	if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD &&
	    (PATH_IS("/healthz") || PATH_IS("/readyz") || PATH_IS("/metrics") ||
	    PATH_IS("/v1/policy"))) {
		evhttp_add_header(evhttp_request_get_output_headers(req), "Allow",
		    "GET, HEAD");
		http_reply_json_error(req, 405, "use GET");
		return;
	}
	if (PATH_IS("/healthz"))
		http_reply(req, 200, "text/plain", "ok\n", 3);
	else if (PATH_IS("/readyz"))
		serve_readyz(w, req);
	else if (PATH_IS("/metrics"))
		serve_metrics(req);
	else if (PATH_IS("/v1/policy"))
		reply_json(req, 200, config_to_json(w->w_config));
	else
		http_reply_json_error(req, 404, "not found");
#undef PATH_IS
}
