/*
 * A per-worker cache of denials: while a client is over a limit, its
 * denial provably holds until the retry time Redis gave (other traffic can
 * only use more quota, never return it; what time returns, the retry time
 * counts), so repeated requests are answered locally without a Redis call,
 * for as long as the whole reply stays what Redis would give.
 */
#ifndef DENYCACHE_H
#define DENYCACHE_H

#include <stdint.h>

#include "config.h"
#include "limiter.h"

struct denycache;

struct denycache *denycache_new(void);
/* With the hash keys given, not drawn: a fuzzer's finding must replay. */
struct denycache *denycache_new_keyed(const uint64_t key[4]);
void denycache_free(struct denycache *dc);
/*
 * Remembers a denial if it can be exact; v as limiter_parse reads it (its
 * times at most LIMITER_MS_MAX). Times are CLOCK_MONOTONIC: sent_us
 * when the call was handed to Redis (Redis decided after it), now_us when
 * the reply arrived. link is the store_link() that answered (store_result).
 * Returns 1 when it gave up another client's denial that still held (its
 * set was full), else 0.
 */
int denycache_put(struct denycache *dc, const struct config *config,
    const struct route *route, const struct limit_set *set, const char *client,
    long long cost, const struct verdict *v, long long sent_us,
    long long now_us, unsigned long link);
/* A still-valid denial for this client, under the limits of set, and the
 * same cost (a bigger cost has a later retry time of its own) over the same
 * link, with times aged to now; 1 on a hit. */
int denycache_get(struct denycache *dc, const struct config *config,
    const struct route *route, const struct limit_set *set, const char *client,
    long long cost, long long now_us, unsigned long link, struct verdict *out);

#endif
