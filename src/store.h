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
	const char		*error;	/* STORE_ERROR: the server's text, the
					 * password cut out, not escaped */
	unsigned long		 link;	/* STORE_OK: the link that answered */
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

/* Called when a store made with one has settled (store_settled): see
 * store_new. It runs inside the store's own code (store_new included), so
 * it should only schedule what it does. */
typedef void (*store_ready_cb)(void *arg);

/*
 * A store connecting to the policy's Redis. worker: the id its log lines
 * carry. link_count: the worker's count of links, which numbers each link
 * of its stores (see store_link). With ready NULL
 * it reports its state to the metrics gauge: it serves the checks. With
 * ready, it is connected while another serves, told to ready instead,
 * until store_serve.
 */
struct store *store_new(int worker, struct event_base *base,
    const struct config *config, struct metrics *metrics,
    unsigned long *link_count, store_ready_cb ready, void *arg);
/* next replaces prev (a policy moved the worker): if prev's outage was
 * logged, next's first link up is logged at its level, so a log kept at
 * warn shows the outage end. */
void store_take_outage(struct store *next, const struct store *prev);
/* The policy's redis.address this store talks to. */
const char *store_address(const struct store *st);
/* Does the policy name the Redis this store talks to: the same address,
 * database and credentials? Otherwise it takes another store. */
int store_same_link(const struct store *st, const struct config *config);
/* Adopts the settings of a new policy that the link keeps across:
 * deadlines and the batch size. */
void store_configure(struct store *st, const struct config *config);
/* Checks of config, a policy the store was not configured with (one that
 * moves to another link, while that link comes up; an older one's retried
 * check), are sent here: the stall watchdog, and a retired store, wait
 * for their deadlines, which may be longer than the store's own. */
void store_take_deadlines(struct store *st, const struct config *config);
/* Is the link up and has it answered a script call (as /readyz counts
 * up), or has an attempt failed? Ready to serve, either way: the policy
 * names this Redis. */
int store_settled(const struct store *st);
/* The store serves the checks from now on: its state goes to the gauge. */
void store_serve(struct store *st);
/* Another store serves the checks now: this one answers what it was sent
 * and reports nothing more. */
void store_retire(struct store *st);
/* Has a retired store answered all it was sent (or had the time to)? It
 * may be freed then without failing a check that still waits. */
int store_retired_done(const struct store *st);
enum store_state store_state(const struct store *st);
/* Is the link up with a call sent within_us ago or more still unanswered
 * (or too many checks with Redis)? Redis runs calls in order, so a new one
 * would wait behind it past its own deadline: a silent Redis, or one that
 * answers, but slower than checks arrive. */
int store_behind(const struct store *st, long long within_us);
/* The number of the current link, or of the last one: a new one each time
 * a link comes up, never reused by the worker's stores. State read over
 * another link may be gone: a Redis restarted without persistence, or
 * another Redis. */
unsigned long store_link(const struct store *st);
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
