/*
 * The Redis link of one worker: every hiredis call lives here (STYLE 12/13).
 * An explicit state machine (DOWN, CONNECTING, UP) with capped exponential
 * backoff, our own connect and stall deadlines (hiredis 0.14 has none), and
 * the limits script loaded once per connection.
 */
#ifndef STORE_H
#define STORE_H

#include <stddef.h>

struct event_base;
struct config;
struct metrics;
struct limiter_command;

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

/* One outstanding call; owned by the caller until its callback has run. */
struct store_call {
	struct store	*sc_store;
	store_cb	 sc_cb;
	void		*sc_arg;
};

struct store;

struct store *store_new(struct event_base *base, const struct config *config,
    struct metrics *metrics);
/* Adopts the Redis settings of a new policy; reconnects if they changed. */
void store_configure(struct store *st, const struct config *config);
enum store_state store_state(const struct store *st);
const char *store_state_name(enum store_state state);
/* The SHA1 of the limits script, for EVALSHA. */
const char *store_script_sha(const struct store *st);
/* Sends cmd; the callback runs exactly once, unless -1 is returned (not up,
 * or the link refused the command), in which case it never runs. */
int store_eval(struct store *st, struct limiter_command *cmd,
    struct store_call *call, store_cb cb, void *arg);
/* Closes the link; pending calls get STORE_DISCONNECTED. */
void store_free(struct store *st);

#endif
