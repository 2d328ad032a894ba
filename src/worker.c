/*
 * Worker threads. Each runs its own event base with an HTTP server bound
 * to a dup of the shared listening socket, its own Redis link and metrics.
 * Cross-thread requests (new policy, drain) arrive as events activated from
 * the main thread; everything else a worker touches is its own.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <event2/event.h>

#include "check.h"
#include "clock.h"
#include "config.h"
#include "denycache.h"
#include "http.h"
#include "server.h"
#include "log.h"
#include "metrics.h"
#include "replypool.h"
#include "store.h"
#include "worker.h"
#include "xmalloc.h"

#define WORKER_FLUSH_US		100000	/* at most, for the last replies */
#define WORKER_FLUSH_POLL_US	2000

static void
apply_http_settings(struct worker *w)
{
	const struct config *c = w->w_config;

	server_set_idle_timeout(w->w_server, c->idle_timeout_us);
	/* The daemon's cap, not a share: see conns_open in server.c. */
	server_set_max_connections(w->w_server,
	    (size_t)config_connections_in_force(c));
}

/* A retired store is looked at this often until it is freed. */
#define WORKER_RETIRE_POLL_US	10000

static void
on_retire_check(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	struct timeval tv = tv_us(WORKER_RETIRE_POLL_US);
	size_t i, kept = 0;

	(void)fd;
	(void)what;
	for (i = 0; i < w->w_nretired; i++) {
		if (store_retired_done(w->w_retired[i]))
			store_free(w->w_retired[i]);
		else
			w->w_retired[kept++] = w->w_retired[i];
	}
	w->w_nretired = kept;
	if (kept > 0)
		event_add(w->w_retire_ev, &tv);
}

/* The new store is ready, or has failed an attempt (then checks follow
 * the failure mode, as the policy names that Redis): it serves from now
 * on, and the old one answers what it was sent. */
static void
on_promote(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	struct timeval tv = tv_us(WORKER_RETIRE_POLL_US);

	(void)fd;
	(void)what;
	/* (One that settled may have been replaced since, by a reload.) */
	if (w->w_next_store == NULL || !store_settled(w->w_next_store))
		return;
	/* Each link moved away from keeps answering what it was sent, so
	 * two moves within a redis.timeout fail no check that the first
	 * link would have answered in time. */
	w->w_retired = xrealloc(w->w_retired,
	    (w->w_nretired + 1) * sizeof(*w->w_retired));
	w->w_retired[w->w_nretired++] = w->w_store;
	store_retire(w->w_store);
	w->w_store = w->w_next_store;
	w->w_next_store = NULL;
	store_serve(w->w_store);
	event_add(w->w_retire_ev, &tv);
}

static void
on_next_store_ready(void *arg)
{
	struct worker *w = arg;

	event_active(w->w_promote_ev, EV_READ, 0);
}

/*
 * A policy that names another Redis (address, database or credentials)
 * gets a new store, make before break: the store that serves goes on
 * serving until the new link answers a script call, or fails an attempt
 * (refused, a handshake refused or not done within connect_timeout, a
 * first call held past the stall watchdog), as Envoy warms a new cluster
 * until its timeout. Reconnecting
 * in place failed every check of the handshake's milliseconds by its
 * failure mode: a burst of 503s on a failure_mode: closed route for a
 * routine change.
 */
static void
move_store(struct worker *w, const struct config *c)
{
	store_take_deadlines(w->w_store, c);
	if (store_same_link(w->w_store, c)) {
		/* A move undone before it was made. */
		store_free(w->w_next_store);
		w->w_next_store = NULL;
		store_configure(w->w_store, c);
		return;
	}
	if (w->w_next_store != NULL && store_same_link(w->w_next_store, c)) {
		store_configure(w->w_next_store, c);
		return;
	}
	if (strcmp(c->redis_address, store_address(w->w_store)) != 0)
		log_info("worker %d: redis %s: the policy moves this worker to "
		    "redis %s; this link serves until that one is up", w->w_id,
		    store_address(w->w_store), c->redis_address);
	else
		log_info("worker %d: redis %s: the policy changes its credentials "
		    "or database; this link serves until a new one is up",
		    w->w_id, store_address(w->w_store));
	store_free(w->w_next_store);
	w->w_next_store = store_new(w->w_id, w->w_base, c, w->w_metrics,
	    &w->w_link_count, on_next_store_ready, w);
	store_take_outage(w->w_next_store, w->w_store);
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
	move_store(w, c);
	apply_http_settings(w);
}

/*
 * The drain is over once the last replies are out: exiting at once then,
 * rather than a fixed 100 ms later, shortens a restart's gap, in which a
 * gateway with this daemon as its only upstream fails its checks. A
 * request still arriving on a connection (seen in its socket when the
 * drain began) is waited for too, within WORKER_FLUSH_US.
 */
static void
on_flush_check(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	struct timeval tv = tv_us(WORKER_FLUSH_POLL_US);

	(void)fd;
	(void)what;
	if ((w->w_nactive == 0 && !server_busy(w->w_server)) ||
	    mono_us() >= w->w_flush_until_us) {
		event_base_loopexit(w->w_base, NULL);
		return;
	}
	event_add(w->w_flush_ev, &tv);
}

void
worker_check_done(struct worker *w)
{
	long long now = mono_us();

	event_del(w->w_drain_timer_ev);
	/* A request still arriving (a head under way when the signal came)
	 * is waited for until drain_timeout's end, as nginx waits for a
	 * header under way: cut off after 0.1 s, its client had no reply.
	 * The loop ends as soon as nothing is under way. */
	if (w->w_flush_until_us == 0)
		w->w_flush_until_us = w->w_drain_until_us > now + WORKER_FLUSH_US ?
		    w->w_drain_until_us : now + WORKER_FLUSH_US;
	/* Looked at in the next iteration, once this reply is written. */
	event_active(w->w_flush_ev, EV_TIMEOUT, 0);
}

static void
on_drain_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;

	(void)fd;
	(void)what;
	log_warnx("worker %d: drain_timeout reached; answering %zu check%s "
	    "now", w->w_id, w->w_nactive, w->w_nactive == 1 ? "" : "s");
	check_finish_all(w);
	worker_check_done(w);
}

static void on_drain(evutil_socket_t, short, void *);

static void
on_stop_now(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;

	on_drain(fd, what, arg);	/* if its own event has not run yet */
	check_finish_all(w);
	/* now: no more waiting for requests still arriving */
	w->w_flush_until_us = mono_us() + WORKER_FLUSH_US;
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
	w->w_drain_until_us = mono_us() + w->w_config->drain_timeout_us;
	server_drain(w->w_server);
	if (w->w_nactive == 0) {
		worker_check_done(w);
		return;
	}
	event_add(w->w_drain_timer_ev, &tv);
}

/*
 * Most of a large peak of connections has gone. The checks and reply
 * objects pooled at the peak are spread over the pages its connections
 * took, and kept those pages resident after glibc had the rest back: 11
 * of a heap's 27 MB for 2.5 MB in use, after 2,000 connections. They go,
 * and the free pages of every arena go back to the system.
 */
static void
on_quiet(void *arg)
{
	struct worker *w = arg;

	check_pool_free(w);
	replypool_thread_free();
#ifdef __GLIBC__
	/* Some 30 ms after a 2,000-connection peak, holding this loop once
	 * (checks that arrive meanwhile wait; replies that do are used). */
	malloc_trim(0);
#endif
}

struct worker *
worker_new(int id, int listen_fd, struct config *config)
{
	struct worker *w = xcalloc(1, sizeof(*w));
	struct event_config *cfg;

	w->w_id = id;
	LIST_INIT(&w->w_free_checks);
	LIST_INIT(&w->w_active);
	pthread_mutex_init(&w->w_lock, NULL);
	/* The changelist folds an event's add and delete within one loop
	 * iteration into one epoll_ctl or none: 0.14 epoll_ctl per check
	 * against 0.46 without it (strace, 2 workers). Its epoll_ctl for a
	 * socket closed meanwhile comes after the close, when another worker
	 * may hold the descriptor's number (ThreadSanitizer reports that
	 * reuse). That is safe only because every socket's events are deleted
	 * before it is closed (conn_free; hiredis's cleanup before its close),
	 * so the late call is a DEL, which the kernel refuses for a number not
	 * in this epoll set; an ADD or MOD there would register another
	 * worker's socket in this one. Each base holds one dup of the
	 * listening socket, never closed while it runs. */
	if ((cfg = event_config_new()) == NULL)
		fatalx("worker %d: cannot create an event config", id);
#ifndef RATELIMITD_NO_EPOLL_CHANGELIST	/* make tsan */
	event_config_set_flag(cfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
#endif
	w->w_base = event_base_new_with_config(cfg);
	event_config_free(cfg);
	if (w->w_base == NULL)
		fatalx("worker %d: cannot create an event base", id);
	w->w_metrics = metrics_new();
	w->w_denycache = denycache_new();
	w->w_config = config_ref(config);
	w->w_server = server_new(w->w_base, listen_fd, http_dispatch, w);
	server_on_refused(w->w_server, http_on_refused);
	server_on_quiet(w->w_server, on_quiet);
	logheld_init(&w->w_refusals, w->w_base, http_tell_refusals, w);
	logheld_init(&w->w_redis_errors, w->w_base, check_tell_redis_errors, w);
	apply_http_settings(w);
	w->w_config_ev = event_new(w->w_base, -1, 0, on_config, w);
	w->w_drain_ev = event_new(w->w_base, -1, 0, on_drain, w);
	w->w_drain_timer_ev = evtimer_new(w->w_base, on_drain_timeout, w);
	w->w_stop_now_ev = event_new(w->w_base, -1, 0, on_stop_now, w);
	w->w_flush_ev = evtimer_new(w->w_base, on_flush_check, w);
	w->w_promote_ev = event_new(w->w_base, -1, 0, on_promote, w);
	w->w_retire_ev = evtimer_new(w->w_base, on_retire_check, w);
	w->w_store = store_new(id, w->w_base, config, w->w_metrics,
	    &w->w_link_count, NULL, NULL);
	return w;
}

static void *
worker_main(void *arg)
{
	struct worker *w = arg;

	event_base_dispatch(w->w_base);
	/* From here on main must not touch the events: worker_stop_now. */
	pthread_mutex_lock(&w->w_lock);
	w->w_loop_done = 1;
	pthread_mutex_unlock(&w->w_lock);
	/* Everything is answered; now the teardown, in dependency order. */
	check_finish_all(w);
	store_free(w->w_store);
	store_free(w->w_next_store);
	while (w->w_nretired > 0)
		store_free(w->w_retired[--w->w_nretired]);
	free(w->w_retired);
	/* The thread's last link is gone, and with it the last use of its
	 * idle reply objects. (Freed with each store, they went from under
	 * the store still serving whenever a reload replaced another.) */
	replypool_thread_free();
	server_free(w->w_server);
	check_pool_free(w);
	/* what is held at shutdown is told, and the timers freed */
	logheld_finish(&w->w_redis_errors);
	logheld_finish(&w->w_refusals);
	event_free(w->w_config_ev);
	event_free(w->w_drain_ev);
	event_free(w->w_drain_timer_ev);
	event_free(w->w_stop_now_ev);
	event_free(w->w_flush_ev);
	event_free(w->w_promote_ev);
	event_free(w->w_retire_ev);
	denycache_free(w->w_denycache);
	config_unref(w->w_config);
	pthread_mutex_lock(&w->w_lock);
	config_unref(w->w_next_config);
	w->w_next_config = NULL;
	pthread_mutex_unlock(&w->w_lock);
	event_base_free(w->w_base);
	atomic_store(&w->w_exited, 1);
	event_active(w->w_exit_ev, EV_READ, 0);
	return NULL;
}

int
worker_start(struct worker *w, struct event *exit_ev)
{
	w->w_exit_ev = exit_ev;
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
worker_stop_now(struct worker *w)
{
	/* A worker that has finished its drain has freed its events. */
	pthread_mutex_lock(&w->w_lock);
	if (!w->w_loop_done)
		event_active(w->w_stop_now_ev, EV_READ, 0);
	pthread_mutex_unlock(&w->w_lock);
}

void
worker_join(struct worker *w)
{
	pthread_join(w->w_thread, NULL);
	pthread_mutex_destroy(&w->w_lock);
	free(w);
}
