/*
 * The deny cache: set-associative tables keyed by a 128-bit hash of the
 * encoded client key, checked against the policy generation and route, so a
 * reload or another route never reads a stale entry. An entry stays valid
 * until the latest retry time among the denying limits (no denial ends
 * early: other traffic can only take quota, and what time gives back, each
 * algorithm's retry time already counts), no longer than every limit's
 * numbers in the reply stay what time alone makes them (see unchanged_ms),
 * and only while a limit admits nothing (blocked_ms), so that no other
 * check can change them; counted from when the call
 * was sent (Redis decided later) and less the millisecond the script rounds
 * up: answered from the reply's arrival, a client at 1000/s lost a third of
 * its quota to denials past their time. And at most DENYCACHE_MAX_US, and
 * over the same Redis link: state can vanish (a Redis restart, FLUSHDB, an
 * operator deleting a key to let a client in), and Redis must then be asked.
 */
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "denycache.h"
#include "siphash.h"
#include "xmalloc.h"

/* Sets of ways: a client's entry may sit in any way of its set, so up to
 * four clients whose keys land in one set keep their denials together.
 * With one way (1,024 slots), 300 clients over their limits shared slots
 * enough to send one check in 14 to Redis, and 1,000 one in 9. */
#define DENYCACHE_WAYS	4
/* Two tables, by the number of limits a denial keeps (a route's, or a
 * key override's): most have one to four, and an entry with room for
 * sixteen is 2.7 times the size. With one table of 4,096 sixteen-limit
 * entries (3.1 MB), past about 3,000 clients over their limits at once the
 * rest went to Redis; now 16,384 entries (3.0 MB) serve sets of up to four
 * limits and 4,096 as before (1.9 MB) the others, 4.9 MB in all, touched
 * only as denials fill them (a lookup reads a set's tags only once a put
 * has marked it: see occupied). */
#define NARROW_LIMITS	4
#define NARROW_SETS	4096	/* powers of two */
#define WIDE_SETS	1024
/* An operator's DEL or FLUSHDB shows within this; a hot key over its limit
 * costs one Redis call per worker in this time. */
#define DENYCACHE_MAX_US 10000000

/* What a lookup reads first: the key's first hash, and until when */
struct deny_tag {
	uint64_t		 h1;
	long long		 until_us;	/* valid before this; 0: empty */
};

/* A limit's part of a denial: what the reply tells (a denial is never
 * held, so it has no delay). */
struct deny_result {
	long long		 remaining;
	long long		 reset_ms;
	long long		 retry_ms;
};

struct deny_entry {
	uint64_t		 h2;
	unsigned long		 generation;
	const struct route	*route;
	long long		 cost;
	unsigned long		 link;
	long long		 stored_us;	/* the reply's arrival: ages it */
	long long		 retry_at_us;	/* what clients are told */
	long long		 now_ms;	/* the verdict's */
	uint16_t		 allowed;	/* bit i: limit i allowed */
	uint8_t			 n, headline;
	struct deny_result	 r[];		/* the table's width */
};

/* Entries of one width, set by set, DENYCACHE_WAYS to a set. */
struct deny_table {
	size_t			 sets;		/* a power of two, at least 512 */
	size_t			 width;		/* limits an entry has room for */
	size_t			 stride;	/* bytes from one entry to the next */
	/* A bit per set that may hold a live denial. Every check looks its
	 * client up, and most clients are not denied: a lookup that reads
	 * a tag from memory waits for it (98 % of the lookup's time, with
	 * the tags at 256 kB), where these 512 bytes stay in the cache. */
	uint64_t		*occupied;
	struct deny_tag		*tags;
	unsigned char		*entries;
};

struct denycache {
	uint64_t		 dc_key[4];	/* two SipHash keys, secret */
	struct deny_table	 narrow, wide;
};

/* Two keyed hashes of the encoded client key, which is all an entry keeps
 * of it (a lookup computes the second only once the first has matched a
 * tag: most miss). With a fixed hash, a client who knows another's key (an
 * address, a user id) could search for a key of its own that hashes
 * alike, and have its cached denials answer the other client; the keys
 * are drawn at startup, so it cannot know where any key lands. */
static uint64_t
hash_first(const struct denycache *dc, const char *s, size_t len)
{
	return siphash24(dc->dc_key, s, len);
}

static uint64_t
hash_second(const struct denycache *dc, const char *s, size_t len)
{
	return siphash24(dc->dc_key + 2, s, len);
}

/*
 * For how long after the decision a limit's part of the reply is what
 * time alone makes it (other traffic can only take quota): a cached reply
 * is the reply Redis would give, not only the same verdict. A fixed
 * window's count holds until its window ends. Every other algorithm gives
 * quota back as time passes (a bucket refills, a sliding window's old
 * requests leave it), at moments the reply does not tell, unless it has
 * all its quota, or is denied one whole unit short: what it gives back
 * next is that unit, at the retry time. (Its reset, the time until it has
 * all its quota, only counts down meanwhile.)
 */
static long long
unchanged_ms(const struct limit *l, const struct limit_result *r, long long cost)
{
	if (l->algorithm == ALGORITHM_FIXED_WINDOW)
		return r->reset_ms > 0 ? r->reset_ms : LLONG_MAX;
	if (r->remaining >= l->quota)
		return LLONG_MAX;
	if (!r->allowed && r->remaining == cost - 1)
		return r->retry_ms;
	return 0;
}

/*
 * For how long after the decision this limit admits nothing, whatever
 * the cost: while one limit of the route does, no check of this client
 * on it passes, here or on any sidecar, and the others' numbers stay too.
 * Otherwise a smaller request could pass meanwhile, and a cached denial
 * of a larger one would repeat a remaining and a retry time Redis no
 * longer gives (found by an audit: Retry-After 3 s where Redis said 8).
 * A fixed window with nothing left admits nothing until it ends; any
 * other algorithm with less than one unit left, until one comes back,
 * which the reply tells only for a check of cost 1 (its retry time).
 */
static long long
blocked_ms(const struct limit *l, const struct limit_result *r, long long cost)
{
	if (r->remaining > 0)
		return 0;
	if (l->algorithm == ALGORITHM_FIXED_WINDOW)
		return r->reset_ms;
	return !r->allowed && cost == 1 ? r->retry_ms : 0;
}

/* The table for denials under this set of limits: the narrow one when
 * its entries have room for them all. */
static struct deny_table *
table_of(struct denycache *dc, const struct limit_set *set)
{
	return set->nlimits <= dc->narrow.width ? &dc->narrow : &dc->wide;
}

/* The client's set on this route: a client over limits of two routes
 * keeps both denials (a slot from the client alone made them evict each
 * other). */
static size_t
set_of(const struct deny_table *t, const struct route *route, uint64_t h1)
{
	uint64_t r = (uint64_t)(uintptr_t)route * 0x9e3779b97f4a7c15ULL;

	return (size_t)((h1 ^ (r >> 32)) & (t->sets - 1));
}

static struct deny_tag *
tag_at(const struct deny_table *t, size_t idx, size_t w)
{
	return &t->tags[idx * DENYCACHE_WAYS + w];
}

static struct deny_entry *
entry_at(const struct deny_table *t, size_t idx, size_t w)
{
	return (struct deny_entry *)(void *)(t->entries +
	    (idx * DENYCACHE_WAYS + w) * t->stride);
}

static int
is_occupied(const struct deny_table *t, size_t idx)
{
	return (int)(t->occupied[idx / 64] >> (idx % 64) & 1);
}

static void
set_occupied(struct deny_table *t, size_t idx, int on)
{
	if (on)
		t->occupied[idx / 64] |= (uint64_t)1 << (idx % 64);
	else
		t->occupied[idx / 64] &= ~((uint64_t)1 << (idx % 64));
}

/* Is way w of set idx this client's entry on this route (held or not)? */
static int
is_clients(const struct deny_table *t, size_t idx, size_t w, uint64_t h1,
    uint64_t h2, const struct route *route)
{
	const struct deny_entry *e = entry_at(t, idx, w);

	return tag_at(t, idx, w)->h1 == h1 && e->h2 == h2 && e->route == route;
}

/* Bytes from one entry to the next in a table of this width */
static size_t
entry_stride(size_t width)
{
	size_t align = _Alignof(struct deny_entry);

	return (offsetof(struct deny_entry, r) +
	    width * sizeof(struct deny_result) + align - 1) / align * align;
}

/* A set's four tags are one cache line when the tags start on one. */
#define CACHE_LINE	64

/* Bytes a table needs, with room to start its bitmap and tags on a line */
static size_t
table_bytes(size_t sets, size_t width)
{
	return CACHE_LINE + sets / 64 * sizeof(uint64_t) + sets * DENYCACHE_WAYS *
	    (sizeof(struct deny_tag) + entry_stride(width));
}

/* Lays out a table of this many sets and width at *at, moving it on. */
static void
table_place(struct deny_table *t, size_t sets, size_t width, unsigned char **at)
{
	uintptr_t line = ((uintptr_t)*at + CACHE_LINE - 1) & ~(uintptr_t)(CACHE_LINE - 1);
	unsigned char *start = *at + (line - (uintptr_t)*at);

	t->sets = sets;
	t->width = width;
	t->stride = entry_stride(width);
	/* a whole number of lines (sets is a multiple of 512), so the tags
	 * start on one too */
	t->occupied = (uint64_t *)(void *)start;
	t->tags = (struct deny_tag *)(void *)(start + sets / 64 * sizeof(uint64_t));
	t->entries = (unsigned char *)(t->tags + sets * DENYCACHE_WAYS);
	*at += table_bytes(sets, width);
}

/* One allocation, so that a large calloc maps zero pages the kernel
 * fills only when an entry is written. */
static struct denycache *
denycache_alloc(void)
{
	struct denycache *dc = xcalloc(1, sizeof(*dc) +
	    table_bytes(NARROW_SETS, NARROW_LIMITS) +
	    table_bytes(WIDE_SETS, CONFIG_LIMITS_MAX));
	unsigned char *at = (unsigned char *)(dc + 1);

	table_place(&dc->narrow, NARROW_SETS, NARROW_LIMITS, &at);
	table_place(&dc->wide, WIDE_SETS, CONFIG_LIMITS_MAX, &at);
	return dc;
}

struct denycache *
denycache_new(void)
{
	struct denycache *dc = denycache_alloc();
	struct timespec ts;

	if (getrandom(dc->dc_key, sizeof(dc->dc_key), 0) != sizeof(dc->dc_key)) {
		/* No kernel entropy call (a seccomp filter that refuses it):
		 * keys no client can read are still better than none. */
		clock_gettime(CLOCK_MONOTONIC, &ts);
		dc->dc_key[0] = (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 32;
		dc->dc_key[1] = (uint64_t)(uintptr_t)dc ^ (uint64_t)ts.tv_sec;
		dc->dc_key[2] = siphash24(dc->dc_key, &ts, sizeof(ts));
		dc->dc_key[3] = siphash24(dc->dc_key, dc, sizeof(dc->dc_key));
	}
	return dc;
}

struct denycache *
denycache_new_keyed(const uint64_t key[4])
{
	struct denycache *dc = denycache_alloc();

	memcpy(dc->dc_key, key, sizeof(dc->dc_key));
	return dc;
}

void
denycache_free(struct denycache *dc)
{
	free(dc);
}

int
denycache_put(struct denycache *dc, const struct config *config,
    const struct route *route, const struct limit_set *set, const char *client,
    long long cost, const struct verdict *v, long long sent_us,
    long long now_us, unsigned long link)
{
	long long until_ms = 0, until_us, retry_ms, unchanged = LLONG_MAX;
	long long blocked = 0, least = 0;
	struct deny_table *t = table_of(dc, set);
	struct deny_tag *tag;
	struct deny_entry *e;
	uint64_t h1, h2;
	size_t len, idx, way = 0;

	if (v->allowed || v->n != set->nlimits)
		return 0;
	for (size_t i = 0; i < v->n; i++) {
		long long u = unchanged_ms(&set->limits[i], &v->r[i], cost);
		long long b = blocked_ms(&set->limits[i], &v->r[i], cost);

		if (u < unchanged)
			unchanged = u;
		if (b > blocked)
			blocked = b;
		if (v->r[i].allowed)
			continue;
		if (v->r[i].retry_ms > until_ms)
			until_ms = v->r[i].retry_ms;
	}
	/* Clients are told the retry time; the entry serves while the whole
	 * reply holds. */
	retry_ms = until_ms;
	if (unchanged < until_ms)
		until_ms = unchanged;
	if (blocked < until_ms)
		until_ms = blocked;
	/* The times were rounded up: they surely hold until ms - 1. */
	until_us = sent_us + (until_ms - 1) * 1000;
	if (until_us > now_us + DENYCACHE_MAX_US)
		until_us = now_us + DENYCACHE_MAX_US;
	if (until_us <= now_us)
		return 0;
	len = strlen(client);
	h1 = hash_first(dc, client, len);
	h2 = hash_second(dc, client, len);
	idx = set_of(t, route, h1);
	/* The client's own entry on this route, whatever its cost: one a
	 * client, as with one way. Else the way that serves least: empty,
	 * expired or of an older policy first, then the soonest to expire. */
	for (size_t w = 0; w < DENYCACHE_WAYS; w++) {
		const struct deny_tag *o = tag_at(t, idx, w);
		long long serves = o->until_us <= now_us ||
		    entry_at(t, idx, w)->generation != config->generation ? 0 :
		    o->until_us;

		if (is_clients(t, idx, w, h1, h2, route)) {
			way = w;
			least = 0;	/* its own: nothing given up */
			break;
		}
		if (w == 0 || serves < least) {
			way = w;
			least = serves;
		}
	}
	set_occupied(t, idx, 1);
	tag = tag_at(t, idx, way);
	tag->h1 = h1;
	tag->until_us = until_us;
	e = entry_at(t, idx, way);
	e->h2 = h2;
	e->generation = config->generation;
	e->route = route;
	e->cost = cost;
	e->link = link;
	e->stored_us = now_us;
	e->retry_at_us = now_us + retry_ms * 1000;
	e->now_ms = v->now_ms;
	e->allowed = 0;
	e->n = (uint8_t)v->n;
	e->headline = (uint8_t)v->headline;
	for (size_t i = 0; i < v->n; i++) {
		e->allowed |= (uint16_t)((v->r[i].allowed != 0) << i);
		e->r[i].remaining = v->r[i].remaining;
		e->r[i].reset_ms = v->r[i].reset_ms;
		e->r[i].retry_ms = v->r[i].retry_ms;
	}
	return least > 0;
}

int
denycache_get(struct denycache *dc, const struct config *config,
    const struct route *route, const struct limit_set *set, const char *client,
    long long cost, long long now_us, unsigned long link, struct verdict *out)
{
	struct deny_table *t = table_of(dc, set);
	const struct deny_entry *e = NULL;
	size_t len = strlen(client), idx;
	uint64_t h1 = hash_first(dc, client, len), h2 = 0;
	long long aged_ms;
	int live = 0, have_h2 = 0;

	idx = set_of(t, route, h1);
	if (!is_occupied(t, idx))
		return 0;
	for (size_t w = 0; w < DENYCACHE_WAYS && e == NULL; w++) {
		const struct deny_tag *tag = tag_at(t, idx, w);

		if (tag->until_us <= now_us)
			continue;
		live = 1;
		if (tag->h1 != h1)
			continue;
		if (!have_h2) {
			h2 = hash_second(dc, client, len);
			have_h2 = 1;
		}
		if (is_clients(t, idx, w, h1, h2, route))
			e = entry_at(t, idx, w);
	}
	/* every way expired: the set is empty until a put */
	if (!live)
		set_occupied(t, idx, 0);
	if (e == NULL || e->generation != config->generation ||
	    cost != e->cost || e->link != link || e->n != set->nlimits)
		return 0;
	aged_ms = (now_us - e->stored_us) / 1000;
	memset(out, 0, sizeof(*out));
	out->now_ms = e->now_ms + aged_ms;
	out->n = e->n;
	out->headline = e->headline;
	out->retry_ms = (e->retry_at_us - now_us + 999) / 1000;
	for (size_t i = 0; i < out->n; i++) {
		const struct deny_result *d = &e->r[i];
		struct limit_result *r = &out->r[i];

		r->allowed = e->allowed >> i & 1;
		r->remaining = d->remaining;
		r->reset_ms = d->reset_ms > aged_ms ? d->reset_ms - aged_ms : 0;
		r->retry_ms = d->retry_ms > aged_ms ? d->retry_ms - aged_ms : 0;
		if (!r->allowed && r->retry_ms == 0)
			r->retry_ms = 1;
	}
	return 1;
}
