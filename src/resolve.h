/*
 * A host name looked up off the event loop. getaddrinfo blocks (hiredis
 * 0.14 calls it inside redisAsyncConnect), and a slow resolver would stall
 * every check of the worker for as long: the lookup runs on a thread of its
 * own and its answer comes back as an event on the loop's thread.
 */
#ifndef RESOLVE_H
#define RESOLVE_H

struct event_base;
struct lookup;

/* ip: the host's first IPv4 address, else its first IPv6 one (the order
 * hiredis tries), numeric; NULL with error set when none. */
typedef void (*lookup_cb)(void *arg, const char *ip, const char *error);

/* Starts looking up host; cb runs once, on base's thread, unless the
 * lookup is cancelled first. NULL if no thread could be started. */
struct lookup *lookup_start(struct event_base *base, const char *host,
    lookup_cb cb, void *arg);
const char *lookup_host(const struct lookup *lk);
/* cb will not run; a thread still waiting on the resolver frees the rest
 * when it returns. Only on base's thread, before cb has run. */
void lookup_cancel(struct lookup *lk);
/* Is host an address already (no lookup needed)? */
int lookup_is_numeric(const char *host);

#endif
