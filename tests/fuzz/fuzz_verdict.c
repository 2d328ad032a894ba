/*
 * libFuzzer target for the pure modules between a script reply and a
 * reply's headers: limiter.c (limiter_parse, limiter_format,
 * limiter_format_degraded) and denycache.c. From each input it derives a
 * route of 1 to CONFIG_LIMITS_MAX limits of any algorithm and numbers the
 * loader accepts, written as a policy and loaded by config.c as the daemon
 * loads it; a script reply of any integers and length; and a sequence of
 * deny cache puts and gets at advancing times, for two routes, two policy
 * generations, three Redis links and several clients and costs. It aborts
 * where a result breaks what limiter.h, denycache.h, their comments or
 * SPEC 3.1 promise. Built and run by `make fuzz` (clang, ASan + UBSan).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "denycache.h"
#include "limiter.h"
#include "xmalloc.h"

/* The loader's bounds (config.c), which the generated policy keeps to so
 * that inputs are not wasted on refusals. */
#define FUZZ_QUOTA_MAX		1000000000000LL
#define FUZZ_LOG_MAX		10000
#define FUZZ_DURATION_MAX_MS	(366LL * 24 * 3600 * 1000)
#define FUZZ_OPS_MAX		64
#define FUZZ_POLICIES		64	/* loaded policies kept */
#define FUZZ_CLIENTS		6
/* denycache.c's DENYCACHE_MAX_US: no entry serves longer after its reply */
#define FUZZ_DENYCACHE_MAX_US	10000000

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input, read front to back; past its end every read is 0. */
struct input {
	const uint8_t	*p;
	size_t		 n;
};

static unsigned
u8(struct input *in)
{
	if (in->n == 0)
		return 0;
	in->n--;
	return *in->p++;
}

static unsigned long long
u64(struct input *in)
{
	unsigned long long v = 0;

	for (int i = 0; i < 8; i++)
		v = v << 8 | u8(in);
	return v;
}

/* A number in [1, max]: small, any, or at the top, which the loader
 * accepts exactly. */
static long long
number(struct input *in, long long max)
{
	unsigned long long v = u64(in);

	switch (u8(in) % 4) {
	case 0:
		return 1 + (long long)(v % (max < 10 ? (unsigned long long)max : 10));
	case 1:
		return max - (long long)(v % 3 < (unsigned long long)max ? v % 3 : 0);
	default:
		return 1 + (long long)(v % (unsigned long long)max);
	}
}

/* A duration of at most max_ms, written in one of the loader's units. */
static void
duration(struct input *in, char *out, size_t size, long long max_ms)
{
	static const struct { const char *unit; long long ms; } units[] = {
		{ "ms", 1 }, { "s", 1000 }, { "m", 60000 }, { "h", 3600000 },
		{ "d", 86400000 },
	};
	unsigned u = u8(in) % 5;

	while (u > 0 && units[u].ms > max_ms)
		u--;
	snprintf(out, size, "%lld%s", number(in, max_ms / units[u].ms),
	    units[u].unit);
}

/* Appends one limit, named uniquely by its index (or after its
 * algorithm, by the loader), to the policy text. */
static void
limit_yaml(struct input *in, size_t i, char *out, size_t size)
{
	static const char *const algs[] = { "fixed_window", "token_bucket",
	    "sliding_window_log", "sliding_window_counter", "leaky_bucket",
	    "gcra" };
	static const char name_chars[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-";
	unsigned a = u8(in) % 6, flags = u8(in);
	char name[80] = "", window[32], precision[48] = "", rate[64], delay[32] = "";
	size_t o = strlen(out);

	if (flags & 1) {
		size_t len = 1 + u8(in) % 64;

		strcpy(name, "name: ");
		name[6] = (char)('A' + i);	/* unique among the route's */
		for (size_t k = 1; k < len; k++)
			name[6 + k] = name_chars[u8(in) % (sizeof(name_chars) - 1)];
		name[6 + len] = '\0';
		strcat(name, ", ");
	}
	if (a == 0 || a == 2 || a == 3) {
		long long quota = number(in, a == 2 ? FUZZ_LOG_MAX : FUZZ_QUOTA_MAX);

		if (a == 3 && (flags & 2)) {
			/* precision divides the window into at most 1000 */
			long long p = number(in, FUZZ_DURATION_MAX_MS);
			long long buckets = number(in, 1000);

			if (p > FUZZ_DURATION_MAX_MS / buckets)
				p = FUZZ_DURATION_MAX_MS / buckets;
			snprintf(window, sizeof(window), "%lldms", p * buckets);
			snprintf(precision, sizeof(precision), ", precision: %lldms", p);
		} else
			duration(in, window, sizeof(window), FUZZ_DURATION_MAX_MS);
		snprintf(out + o, size - o, "      - { %salgorithm: %s, limit: %lld, "
		    "window: %s%s }\n", name, algs[a], quota, window, precision);
	} else {
		long long burst = number(in, FUZZ_QUOTA_MAX);
		long long count = number(in, FUZZ_QUOTA_MAX);

		duration(in, window, sizeof(window), FUZZ_DURATION_MAX_MS);
		snprintf(rate, sizeof(rate), "%lld/%s", count, window);
		if (a == 4 && (flags & 4))
			snprintf(delay, sizeof(delay), ", delay: %s",
			    flags & 8 ? "true" : "false");
		snprintf(out + o, size - o, "      - { %salgorithm: %s, rate: \"%s\", "
		    "burst: %lld%s }\n", name, algs[a], rate, burst, delay);
	}
}

/*
 * Two routes with the same limits: the deny cache tells them apart. A
 * load takes over a millisecond under ASan, most of a run's time, and
 * most mutations leave the policy's bytes alone: the last policies loaded
 * (or refused) are kept by their text and used again (read only, as a
 * worker does).
 */
static struct config *
load_policy(struct input *in)
{
	static struct {
		char		*text;
		struct config	*config;
	} kept[FUZZ_POLICIES];
	static char path[64];
	char text[2 * 8192], limits[8192] = "";
	struct config_errors errors;
	size_t nlimits = 1 + u8(in) % CONFIG_LIMITS_MAX, k;
	uint64_t h = 0xcbf29ce484222325ULL;
	FILE *fp;

	for (size_t i = 0; i < nlimits; i++)
		limit_yaml(in, i, limits, sizeof(limits));
	snprintf(text, sizeof(text), "routes:\n"
	    "  - name: r\n    match: { prefix: /r/ }\n    limits:\n%s"
	    "  - name: s\n    limits:\n%s", limits, limits);
	for (const char *t = text; *t; t++)
		h = (h ^ (unsigned char)*t) * 0x100000001b3ULL;
	k = h % FUZZ_POLICIES;
	if (kept[k].text && strcmp(kept[k].text, text) == 0)
		return kept[k].config;
	free(kept[k].text);
	config_unref(kept[k].config);
	kept[k].text = NULL;
	kept[k].config = NULL;
	if (path[0] == '\0')
		snprintf(path, sizeof(path), "/tmp/ratelimitd-fuzz-verdict-%d.yaml",
		    (int)getpid());
	if ((fp = fopen(path, "w")) == NULL)
		abort();
	fputs(text, fp);
	fclose(fp);
	if ((kept[k].config = config_load(path, &errors)) == NULL)
		config_errors_free(&errors);	/* refused: kept as such */
	unlink(path);
	kept[k].text = xstrdup(text);
	return kept[k].config;
}

/* A reply integer: the values a script gives, and any other. */
static long long
reply_int(struct input *in)
{
	unsigned long long v = u64(in);

	switch (u8(in) % 8) {
	case 0: return 0;
	case 1: return 1;
	case 2: return -1;
	case 3: return (long long)(v % 1000);
	case 4: return (long long)(v % 100000000);	/* ms: about a day */
	case 5: return (long long)(v % (1ULL << 53));	/* a Lua double's */
	case 6: return v & 1 ? LLONG_MAX - (long long)(v % 2048) :
		    LLONG_MIN + (long long)(v % 2048);
	default: return (long long)v;
	}
}

static void
fail(const char *what, const char *value)
{
	fprintf(stderr, "fuzz_verdict: %s: \"%s\"\n", what, value ? value : "");
	abort();
}

/* Is s a decimal integer, with a sign only when negative is allowed? */
static int
decimal(const char *s, int negative)
{
	if (negative && *s == '-')
		s++;
	if (*s == '\0' || (*s == '0' && s[1] != '\0'))
		return 0;
	for (; *s; s++)
		if (*s < '0' || *s > '9')
			return 0;
	return 1;
}

/* Whole seconds rounded up, as SPEC 3.1 shows time. */
static long long
seconds_up(long long ms)
{
	return ms <= 0 ? 0 : (long long)(((__int128)ms + 999) / 1000);
}

/* Is s exactly the IETF list SPEC 3.1 describes, one item per limit in
 * policy order: "name";a=X;b=Y, ... ? */
static int
ietf_list(const char *s, const struct limit_set *set, char a, const long long *x,
    char b, const long long *y)
{
	char item[256];

	for (size_t i = 0; i < set->nlimits; i++) {
		int n = snprintf(item, sizeof(item), "%s\"%s\";%c=%lld;%c=%lld",
		    i ? ", " : "", set->limits[i].name, a, x[i], b, y[i]);

		if (strncmp(s, item, (size_t)n) != 0)
			return 0;
		s += n;
	}
	return *s == '\0';
}

static void
check_headers(const struct limit_set *set, const struct verdict *v, int ietf)
{
	const struct limit_result *hl = &v->r[v->headline];
	struct limiter_headers h;
	long long q[CONFIG_LIMITS_MAX], w[CONFIG_LIMITS_MAX];
	long long r[CONFIG_LIMITS_MAX], t[CONFIG_LIMITS_MAX];
	char want[FMT_LL_MAX];

	memset(&h, 'x', sizeof(h));	/* every field must be written */
	limiter_format(set, v, ietf, &h);
	if (memchr(h.limit, '\0', sizeof(h.limit)) == NULL ||
	    memchr(h.remaining, '\0', sizeof(h.remaining)) == NULL ||
	    memchr(h.reset, '\0', sizeof(h.reset)) == NULL ||
	    memchr(h.retry_after, '\0', sizeof(h.retry_after)) == NULL ||
	    memchr(h.policy, '\0', sizeof(h.policy)) == NULL ||
	    memchr(h.ratelimit, '\0', sizeof(h.ratelimit)) == NULL)
		fail("a header not terminated in its buffer", NULL);
	/* The headline limit's numbers, in decimal. */
	snprintf(want, sizeof(want), "%lld", set->limits[v->headline].quota);
	if (strcmp(h.limit, want) != 0)
		fail("X-RateLimit-Limit is not the headline's quota", h.limit);
	snprintf(want, sizeof(want), "%lld", hl->remaining);
	if (!decimal(h.remaining, 0) || strcmp(h.remaining, want) != 0)
		fail("X-RateLimit-Remaining is not the headline's, >= 0", h.remaining);
	snprintf(want, sizeof(want), "%lld", seconds_up(hl->reset_ms));
	if (!decimal(h.reset, 0) || strcmp(h.reset, want) != 0)
		fail("X-RateLimit-Reset is not the headline's, in seconds up",
		    h.reset);
	if (v->allowed ? h.retry_after[0] != '\0' :
	    !decimal(h.retry_after, 0) || strcmp(h.retry_after, "0") == 0)
		fail("Retry-After is not >= 1 on a denial only", h.retry_after);
	if (!ietf) {
		if (h.policy[0] || h.ratelimit[0])
			fail("IETF fields without ietf_headers", h.policy);
		return;
	}
	for (size_t i = 0; i < set->nlimits; i++) {
		q[i] = set->limits[i].quota;
		w[i] = config_limit_window_seconds(&set->limits[i]);
		r[i] = v->r[i].remaining;
		t[i] = seconds_up(v->r[i].reset_ms);
	}
	if (!ietf_list(h.policy, set, 'q', q, 'w', w))
		fail("RateLimit-Policy is not one item per limit", h.policy);
	if (!ietf_list(h.ratelimit, set, 'r', r, 't', t))
		fail("RateLimit is not one item per limit", h.ratelimit);
}

/* What limiter.h, its comments and SPEC 3.1 promise of a parsed verdict
 * and of its headers. */
static void
check_verdict(const struct limit_set *set, const long long *ints, size_t n)
{
	struct verdict v;
	struct limiter_headers h, full;
	long long quota;

	if (limiter_parse(set, ints, n, &v) == -1)
		return;
	if (n != LIMITER_REPLY_INTS(set->nlimits))
		fail("a reply of the wrong length accepted", NULL);
	if (v.n != set->nlimits || v.headline >= v.n)
		fail("verdict of the wrong size", NULL);
	for (size_t i = 0; i < v.n; i++) {
		const struct limit_result *r = &v.r[i], *hl = &v.r[v.headline];

		if (r->remaining < 0 || r->reset_ms < 0 || r->retry_ms < 0 ||
		    r->delay_ms < 0)
			fail("a negative number in a limit's result", NULL);
		/* closest to exhaustion: lowest remaining, then longest reset */
		if (r->remaining < hl->remaining || (r->remaining == hl->remaining &&
		    r->reset_ms > hl->reset_ms))
			fail("the headline is not the limit closest to exhaustion",
			    NULL);
		if (!v.allowed && !r->allowed && v.retry_ms < r->retry_ms)
			fail("retry_ms is before a denying limit's", NULL);
	}
	if (!v.allowed && v.retry_ms <= 0)
		fail("a denial without a retry time", NULL);
	if (v.delay_ms < 0)
		fail("a hold of negative time", NULL);
	check_headers(set, &v, 0);
	check_headers(set, &v, 1);

	memset(&h, 'x', sizeof(h));
	limiter_format_degraded(set, 1, &h);
	limiter_format(set, &v, 1, &full);
	if (memchr(h.policy, '\0', sizeof(h.policy)) == NULL ||
	    strcmp(h.policy, full.policy) != 0 || h.ratelimit[0])
		fail("degraded RateLimit-Policy is not the verdict's, or RateLimit is sent", NULL);
	memset(&h, 'x', sizeof(h));
	limiter_format_degraded(set, 0, &h);
	quota = set->limits[0].quota;
	for (size_t i = 1; i < set->nlimits; i++)
		if (set->limits[i].quota < quota)
			quota = set->limits[i].quota;
	if (memchr(h.limit, '\0', sizeof(h.limit)) == NULL ||
	    !decimal(h.limit, 0) || strtoll(h.limit, NULL, 10) != quota)
		fail("degraded X-RateLimit-Limit is not the smallest quota", NULL);
	if (strcmp(h.remaining, "-1") != 0 || h.reset[0] || h.retry_after[0] ||
	    h.policy[0] || h.ratelimit[0])
		fail("degraded headers other than Limit and Remaining: -1", NULL);
}

/* A denial put in the cache, as check.c does after a script reply. */
struct put {
	const struct config	*config;
	const struct route	*route;
	size_t			 client;
	long long		 cost;
	unsigned long		 link;
	long long		 sent_us;
	long long		 answered_us;
	struct verdict		 v;
};

/*
 * May this hit be the cached reply of put p? The same route, policy
 * generation, client, cost and link (denycache.h); not past the latest
 * retry time of its denying limits counted from the send (no denial of
 * any algorithm ends before it: denycache.h), nor DENYCACHE_MAX_US after
 * the reply; the reply Redis gave, with times aged, never extended.
 */
static int
hit_of(const struct put *p, const struct config *config,
    const struct route *route, size_t client, long long cost,
    unsigned long link, long long now_us, const struct verdict *out)
{
	long long retry_ms = 0;

	if (p->config->generation != config->generation || p->route != route ||
	    p->client != client || p->cost != cost || p->link != link)
		return 0;
	if (out->allowed || out->n != p->v.n || out->headline != p->v.headline)
		return 0;
	for (size_t i = 0; i < p->v.n; i++) {
		const struct limit_result *a = &p->v.r[i], *b = &out->r[i];

		/* (a denying limit that gave no time is told 1 ms) */
		if (a->allowed != b->allowed || a->remaining != b->remaining ||
		    b->reset_ms > a->reset_ms || b->retry_ms > (a->allowed ||
		    a->retry_ms > 0 ? a->retry_ms : 1))
			return 0;
		if (a->allowed)
			continue;
		if (a->retry_ms > retry_ms)
			retry_ms = a->retry_ms;
	}
	return (__int128)now_us < (__int128)p->sent_us + (__int128)retry_ms * 1000 &&
	    now_us < p->answered_us + FUZZ_DENYCACHE_MAX_US;
}

/*
 * A worker's deny cache over a few dozen steps: the clock only moves
 * forward (CLOCK_MONOTONIC), each put is a denial answered after its call
 * was sent, and a reload is a new generation whose routes may sit where
 * the old ones were. The policy is seen under two generations of its own
 * (copies of it, which is all the cache reads of a policy), never used by
 * another input: the cache lives as long as the worker's, across inputs
 * (a new one per input was 780 KB to fault in each time), and an earlier
 * input's entries are then for other policies.
 */
static void
check_denycache(struct input *in, const struct config *c)
{
	static const char *const clients[FUZZ_CLIENTS] = { "k1", "k2", "*",
	    "ip=203.0.113.7", "%FF%00",
	    ("#0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF") };
	static struct put puts[FUZZ_OPS_MAX];
	static struct denycache *dc;
	static unsigned long generation = 1UL << 62;	/* past any load's */
	struct config policy[2];
	long long now_us = 1000000000000LL + (long long)(u64(in) % 1000000000);
	size_t nputs = 0;

	if (dc == NULL) {
		static const uint64_t keys[4] = { 1, 2, 3, 4 };

		dc = denycache_new_keyed(keys);
	}
	for (int i = 0; i < 2; i++) {
		memcpy(&policy[i], c, sizeof(policy[i]));
		policy[i].generation = generation++;
	}
	for (int op = 0; op < FUZZ_OPS_MAX && in->n > 0; op++) {
		unsigned what = u8(in);
		const struct config *config = &policy[what >> 1 & 1];
		const struct route *route = &c->routes[what >> 2 & 1];
		size_t client = u8(in) % FUZZ_CLIENTS;
		long long cost = 1 + u8(in) % 3;
		unsigned long link = 1 + u8(in) % 3;
		struct verdict out;

		switch (u8(in) % 3) {
		case 0:
			now_us += (long long)(u64(in) % 1000);
			break;
		case 1:
			now_us += (long long)(u64(in) % 2000000);
			break;
		default:
			now_us += (long long)(u64(in) % 20000000);
			break;
		}
		if (what & 1) {
			const struct limit_set *set = &route->limits;
			long long ints[LIMITER_REPLY_INTS(CONFIG_LIMITS_MAX)];
			size_t n = LIMITER_REPLY_INTS(set->nlimits);
			struct put *p = &puts[nputs];

			for (size_t i = 0; i < n; i++)
				ints[i] = reply_int(in);
			/* check.c caches what it parsed, and denials only */
			if (limiter_parse(set, ints, n, &p->v) == -1 || p->v.allowed)
				continue;
			p->config = config;
			p->route = route;
			p->client = client;
			p->cost = cost;
			p->link = link;
			p->sent_us = now_us - (long long)(u64(in) % 200000);
			p->answered_us = now_us;
			denycache_put(dc, config, route, set, clients[client], cost,
			    &p->v, p->sent_us, now_us, link);
			nputs++;
		} else if (denycache_get(dc, config, route, &route->limits,
		    clients[client], cost, now_us, link, &out)) {
			size_t i;

			for (i = 0; i < nputs; i++)
				if (hit_of(&puts[i], config, route, client, cost, link,
				    now_us, &out))
					break;
			if (i == nputs)
				fail("a deny cache hit no put accounts for",
				    clients[client]);
		}
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct input in = { data, size };
	long long ints[LIMITER_REPLY_INTS(CONFIG_LIMITS_MAX) + 4];
	struct config *c;
	size_t n;

	if ((c = load_policy(&in)) == NULL)
		return 0;
	/* Mostly the length a script gives, sometimes any other. */
	n = u8(&in);
	n = n & 1 ? n / 2 % (sizeof(ints) / sizeof(ints[0]) + 1) :
	    LIMITER_REPLY_INTS(c->routes[0].limits.nlimits);
	for (size_t i = 0; i < n; i++)
		ints[i] = reply_int(&in);
	check_verdict(&c->routes[0].limits, ints, n);
	check_denycache(&in, c);
	return 0;
}
