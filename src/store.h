/*
 * The Redis link of one worker: every hiredis call lives here (STYLE 12/13).
 * An explicit state machine (DOWN, CONNECTING, UP) with capped exponential
 * backoff, our own connect and stall deadlines (hiredis 0.14 has none), the
 * limits script loaded once per connection, and checks batched into script
 * calls.
 */
#ifndef STORE_H
#define STORE_H

#include <stddef.h>
#include <sys/queue.h>

struct event_base;
struct config;
struct metrics;
struct limit_set;

/* Ordered: the least advanced of the workers is the daemon's (metrics). */
enum store_state { STORE_DOWN, STORE_CONNECTING, STORE_UP };

enum store_status {
	STORE_OK,		/* ints holds the script's integer reply */
	STORE_ERROR,		/* Redis answered an error */
	STORE_NOSCRIPT,		/* script gone (SCRIPT FLUSH, restart); reloading */
	STORE_DISCONNECTED	/* the link dropped before a reply */
};

struct store_result {
	enum store_status	 status;
	const long long		*ints;
	size_t			 nints;
	const char		*error;
};

typedef void (*store_cb)(void *arg, const struct store_result *result);

/*
 * One check handed to the store, owned by the caller. The caller fills in
 * what to check; what those fields point to must stay valid until the call
 * is sent, at the end of the loop iteration, or cancelled. Every call queued
 * in one iteration goes to Redis in as few script calls as redis.max_batch
 * allows, in arrival order.
 */
struct store_call {
	const char		*sc_key_prefix;
	const char		*sc_route;
	const char		*sc_client;	/* encoded */
	const struct limit_set	*sc_set;
	long long		 sc_cost;

	/* the store's */
	struct store		*sc_store;
	store_cb		 sc_cb;
	void			*sc_arg;
	TAILQ_ENTRY(store_call)	 sc_entry;	/* the send queue */
	int			 sc_queued;
};

struct store;

/* worker: the id its log lines carry. */
struct store *store_new(int worker, struct event_base *base,
    const struct config *config, struct metrics *metrics);
/* Adopts the Redis settings of a new policy; reconnects if they changed. */
void store_configure(struct store *st, const struct config *config);
enum store_state store_state(const struct store *st);
/* Is the link up with a call sent within_us ago or more still unanswered
 * (or too many checks with Redis)? Redis runs calls in order, so a new one
 * would wait behind it past its own deadline: a silent Redis, or one that
 * answers, but slower than checks arrive. */
int store_behind(const struct store *st, long long within_us);
/* How many times the link has come up. State read over an earlier link may
 * be gone: a Redis restarted without persistence, or another one. */
unsigned long store_links(const struct store *st);
const char *store_state_name(enum store_state state);
/* Queues the call; the callback runs exactly once (with the reply, or a
 * failure), unless -1 is returned (the link is not up) or the call is
 * cancelled while still queued. */
int store_eval(struct store *st, struct store_call *call, store_cb cb,
    void *arg);
/* Takes back a call that has not been sent yet: 1, and its callback will
 * never run; 0 when it is already with Redis (its callback will run). */
int store_cancel(struct store_call *call);
/* Closes the link; pending calls get STORE_DISCONNECTED. */
void store_free(struct store *st);

#endif
