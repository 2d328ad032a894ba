/*
 * A per-worker cache of denials: while a client is over a limit whose
 * denial provably holds until a known time (fixed_window, token_bucket,
 * gcra: other traffic can only use more quota, never return it), repeated
 * requests are answered locally without a Redis call.
 */
#ifndef DENYCACHE_H
#define DENYCACHE_H

#include "config.h"
#include "limiter.h"

struct denycache;

struct denycache *denycache_new(void);
void denycache_free(struct denycache *dc);
/* Remembers a denial if it can be exact; now_us is CLOCK_MONOTONIC. */
void denycache_put(struct denycache *dc, const struct config *config,
    const struct route *route, const struct limit_set *set, const char *client,
    long long cost, const struct verdict *v, long long now_us);
/* A still-valid denial for this client and the same cost (a bigger cost has
 * a later retry time of its own),
 * with times aged to now; 1 on a hit. */
int denycache_get(struct denycache *dc, const struct config *config,
    const struct route *route, const char *client, long long cost,
    long long now_us, struct verdict *out);

#endif
