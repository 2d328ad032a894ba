/*
 * A worker: one event-loop thread with its own HTTP server on the shared
 * listening socket, its own Redis link, metrics and deny cache. Workers
 * share nothing mutable but the policy (swapped by reference) and read-only
 * metric names. The main thread talks to a worker only through
 * worker_set_config and worker_drain, which are thread-safe.
 */
#ifndef WORKER_H
#define WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/queue.h>

#include "limiter.h"
#include "logheld.h"

struct config;
struct check;
struct denycache;

struct worker {
	int			 w_id;
	pthread_t		 w_thread;
	struct event_base	*w_base;
	struct server		*w_server;	/* HTTP on the shared socket */
	struct store		*w_store;	/* serves the checks */
	/* Make before break: when a reload names another Redis, the store
	 * that serves goes on serving while w_next_store connects (see
	 * on_config), then answers what it was sent among w_retired. */
	struct store		*w_next_store;
	struct store		**w_retired;	/* oldest first */
	size_t			 w_nretired;
	unsigned long		 w_link_count;	/* numbers its stores' links */
	struct event		*w_promote_ev;
	struct event		*w_retire_ev;
	struct metrics		*w_metrics;
	struct denycache	*w_denycache;
	struct config		*w_config;	/* the policy new checks use */

	pthread_mutex_t		 w_lock;	/* guards w_next_config and
						 * w_loop_done */
	int			 w_loop_done;	/* its events are gone */
	struct config		*w_next_config;	/* handed over by main */
	struct event		*w_config_ev;
	struct event		*w_drain_ev;
	struct event		*w_drain_timer_ev;
	struct event		*w_stop_now_ev;
	struct event		*w_flush_ev;	/* see worker_check_done */
	long long		 w_flush_until_us;
	long long		 w_drain_until_us;	/* drain_timeout's end */
	int			 w_draining;
	struct event		*w_exit_ev;	/* main's, told at the end */
	atomic_int		 w_exited;

	LIST_HEAD(, check)	 w_free_checks;	/* pool: no malloc per check */
	size_t			 w_nfree_checks;
	LIST_HEAD(, check)	 w_active;	/* in flight, for drain */
	size_t			 w_nactive;

	struct logheld		 w_redis_errors; /* see check_tell_redis_errors */
	char			 w_redis_error_address[320]; /* of its latest */
	struct logheld		 w_refusals;	/* see http_on_refused */
};

struct worker *worker_new(int id, int listen_fd, struct config *config);
/* Runs the worker on its thread; exit_ev (main's) is made active when the
 * thread has finished, after w_exited is set. */
int worker_start(struct worker *w, struct event *exit_ev);
/* Hands a new policy to the worker (takes a reference). Thread-safe. */
void worker_set_config(struct worker *w, struct config *config);
/* Stops accepting, finishes checks up to drain_timeout, exits the loop. */
void worker_drain(struct worker *w);
/* Ends the drain now (a second SIGTERM): what is left is answered at once,
 * as at drain_timeout. */
void worker_stop_now(struct worker *w);
void worker_join(struct worker *w);

/* Called by the check module when its last active check is done. */
void worker_check_done(struct worker *w);


#endif
