/*
 * Worker threads. Each runs its own event base with an evhttp server bound
 * to a dup of the shared listening socket, its own Redis link and metrics.
 * Cross-thread requests (new policy, drain) arrive as events activated from
 * the main thread; everything else a worker touches is its own.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>

#include "check.h"
#include "config.h"
#include "denycache.h"
#include "http.h"
#include "log.h"
#include "metrics.h"
#include "store.h"
#include "worker.h"
#include "xmalloc.h"

#define WORKER_ACCEPT_RETRY_US	100000	/* pause accepting on EMFILE */
#define WORKER_FLUSH_US		100000	/* let the last replies go out */

static struct timeval
tv_us(long long us)
{
	struct timeval tv = { (time_t)(us / 1000000), (suseconds_t)(us % 1000000) };

	return tv;
}

static void
apply_http_settings(struct worker *w)
{
	struct timeval idle = tv_us(w->w_config->idle_timeout_us);

	evhttp_set_timeout_tv(w->w_http, &idle);
}

/* evhttp_bind_listener makes the evhttp the listener's callback argument,
 * so the accept error callback finds its worker here; filled before any
 * worker thread starts, read-only after. */
static struct {
	struct evconnlistener	*lev;
	struct worker		*w;
} worker_listeners[CONFIG_WORKERS_MAX];

/* Out of descriptors: stop accepting for a moment instead of spinning. */
static void
on_accept_error(struct evconnlistener *lev, void *arg)
{
	struct worker *w = NULL;
	struct timeval tv = tv_us(WORKER_ACCEPT_RETRY_US);
	int err = EVUTIL_SOCKET_ERROR();

	(void)arg;
	for (size_t i = 0; i < CONFIG_WORKERS_MAX; i++)
		if (worker_listeners[i].lev == lev)
			w = worker_listeners[i].w;
	if (w == NULL)
		return;
	if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
		log_warnx("worker %d: accept: %s; pausing for %d ms", w->w_id,
		    strerror(err), WORKER_ACCEPT_RETRY_US / 1000);
		evconnlistener_disable(lev);
		event_add(w->w_accept_retry_ev, &tv);
	}
}

static void
on_accept_retry(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;

	(void)fd;
	(void)what;
	if (w->w_listener && !w->w_draining)
		evconnlistener_enable(w->w_listener);
}

static void
on_config(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	struct config *c, *old;

	(void)fd;
	(void)what;
	pthread_mutex_lock(&w->w_lock);
	c = w->w_next_config;
	w->w_next_config = NULL;
	pthread_mutex_unlock(&w->w_lock);
	if (c == NULL)
		return;
	/* Checks in flight keep their own reference to the old policy. */
	old = w->w_config;
	w->w_config = c;
	config_unref(old);
	store_configure(w->w_store, c);
	apply_http_settings(w);
}

void
worker_check_done(struct worker *w)
{
	struct timeval tv = tv_us(WORKER_FLUSH_US);

	event_del(w->w_drain_timer_ev);
	event_base_loopexit(w->w_base, &tv);
}

static void
on_drain_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;

	(void)fd;
	(void)what;
	log_warnx("worker %d: drain_timeout reached; answering %zu checks now",
	    w->w_id, w->w_nactive);
	check_finish_all(w);
	worker_check_done(w);
}

static void
on_drain(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	struct timeval tv = tv_us(w->w_config->drain_timeout_us);

	(void)fd;
	(void)what;
	if (w->w_draining)
		return;
	w->w_draining = 1;
	if (w->w_bound) {
		for (size_t i = 0; i < CONFIG_WORKERS_MAX; i++)
			if (worker_listeners[i].w == w)
				worker_listeners[i].lev = NULL;
		evhttp_del_accept_socket(w->w_http, w->w_bound);
		w->w_bound = NULL;
		w->w_listener = NULL;
	}
	event_del(w->w_accept_retry_ev);
	if (w->w_nactive == 0) {
		worker_check_done(w);
		return;
	}
	event_add(w->w_drain_timer_ev, &tv);
}

struct worker *
worker_new(int id, int listen_fd, struct config *config)
{
	struct worker *w = xcalloc(1, sizeof(*w));
	struct event_config *cfg;
	int fd;

	w->w_id = id;
	pthread_mutex_init(&w->w_lock, NULL);
	/* The changelist folds each request's add/del of the same event into
	 * one epoll_ctl (or none) per loop iteration; evhttp toggles its read
	 * and write events on every request. Each base holds one dup of the
	 * listening socket only, which keeps clear of the changelist's caveat
	 * about dup()ed descriptors. */
	if ((cfg = event_config_new()) == NULL)
		fatalx("worker %d: cannot create an event config", id);
	event_config_set_flag(cfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
	w->w_base = event_base_new_with_config(cfg);
	event_config_free(cfg);
	if (w->w_base == NULL)
		fatalx("worker %d: cannot create an event base", id);
	w->w_metrics = metrics_new();
	w->w_denycache = denycache_new();
	w->w_config = config_ref(config);
	if ((w->w_http = evhttp_new(w->w_base)) == NULL)
		fatalx("worker %d: cannot create the HTTP server", id);
	evhttp_set_max_headers_size(w->w_http, HTTP_HEADERS_MAX);
	evhttp_set_max_body_size(w->w_http, HTTP_BODY_MAX);
	evhttp_set_allowed_methods(w->w_http, EVHTTP_REQ_GET | EVHTTP_REQ_POST |
	    EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
	    EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE | EVHTTP_REQ_CONNECT |
	    EVHTTP_REQ_PATCH);
	evhttp_set_gencb(w->w_http, http_dispatch, w);
	apply_http_settings(w);

	if ((fd = dup(listen_fd)) == -1)
		fatal("worker %d: dup", id);
	w->w_listener = evconnlistener_new(w->w_base, NULL, NULL,
	    LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1, fd);
	if (w->w_listener == NULL)
		fatalx("worker %d: cannot listen", id);
	w->w_bound = evhttp_bind_listener(w->w_http, w->w_listener);
	evconnlistener_set_error_cb(w->w_listener, on_accept_error);
	worker_listeners[id].lev = w->w_listener;
	worker_listeners[id].w = w;
	w->w_accept_retry_ev = evtimer_new(w->w_base, on_accept_retry, w);
	w->w_config_ev = event_new(w->w_base, -1, 0, on_config, w);
	w->w_drain_ev = event_new(w->w_base, -1, 0, on_drain, w);
	w->w_drain_timer_ev = evtimer_new(w->w_base, on_drain_timeout, w);
	w->w_store = store_new(w->w_base, config, w->w_metrics);
	return w;
}

static void *
worker_main(void *arg)
{
	struct worker *w = arg;

	event_base_dispatch(w->w_base);
	/* Everything is answered; now the teardown, in dependency order. */
	check_finish_all(w);
	store_free(w->w_store);
	evhttp_free(w->w_http);
	check_pool_free(w);
	limiter_command_free(&w->w_cmd);
	event_free(w->w_accept_retry_ev);
	event_free(w->w_config_ev);
	event_free(w->w_drain_ev);
	event_free(w->w_drain_timer_ev);
	denycache_free(w->w_denycache);
	config_unref(w->w_config);
	pthread_mutex_lock(&w->w_lock);
	config_unref(w->w_next_config);
	w->w_next_config = NULL;
	pthread_mutex_unlock(&w->w_lock);
	event_base_free(w->w_base);
	return NULL;
}

int
worker_start(struct worker *w)
{
	return pthread_create(&w->w_thread, NULL, worker_main, w) == 0 ? 0 : -1;
}

void
worker_set_config(struct worker *w, struct config *config)
{
	struct config *stale;

	pthread_mutex_lock(&w->w_lock);
	stale = w->w_next_config;
	w->w_next_config = config_ref(config);
	pthread_mutex_unlock(&w->w_lock);
	config_unref(stale);
	event_active(w->w_config_ev, EV_READ, 0);
}

void
worker_drain(struct worker *w)
{
	event_active(w->w_drain_ev, EV_READ, 0);
}

void
worker_join(struct worker *w)
{
	pthread_join(w->w_thread, NULL);
	pthread_mutex_destroy(&w->w_lock);
	free(w);
}
