/*
 * The bridge between a policy decision and the limits script. Redis keys are
 * built here: `<prefix>{<route>:<client>}:<limit>:<algorithm>`. The hash tag
 * puts every key of one (route, client) in one Cluster slot; the limit's
 * name and algorithm, not its numbers, name the counter, so a reload that
 * raises a quota keeps everyone's count. Client keys are percent-encoded
 * (every byte outside [A-Za-z0-9._-]), so no byte can close the hash tag or
 * forge a separator, and keys over CONFIG_KEY_RAW_MAX bytes become '#' and
 * their SHA-256, a form the encoding never produces.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt.h"
#include "limiter.h"
#include "sha256.h"
#include "xmalloc.h"


size_t
limiter_encode_client(const char *key, size_t len, char *out)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0;

	if (len > CONFIG_KEY_RAW_MAX) {
		unsigned char d[SHA256_DIGEST_LEN];

		sha256(key, len, d);
		out[o++] = '#';
		for (int i = 0; i < SHA256_DIGEST_LEN; i++) {
			out[o++] = hex[d[i] >> 4];
			out[o++] = hex[d[i] & 0xf];
		}
		out[o] = '\0';
		return o;
	}
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)key[i];

		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		    (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')
			out[o++] = (char)c;
		else {
			out[o++] = '%';
			out[o++] = hex[c >> 4];
			out[o++] = hex[c & 0xf];
		}
	}
	out[o] = '\0';
	return o;
}

static void *
grow(void *p, size_t *cap, size_t need, size_t size)
{
	if (need <= *cap)
		return p;
	*cap = *cap ? *cap * 2 : 64;
	while (*cap < need)
		*cap *= 2;
	return xrealloc(p, *cap * size);
}

/* Makes room for len more bytes in the command buffer. */
static void
reserve(struct limiter_command *cmd, size_t len)
{
	if (cmd->buflen + len > cmd->bufsize)
		cmd->buf = grow(cmd->buf, &cmd->bufsize, cmd->buflen + len, 1);
}

static void
put(struct limiter_command *cmd, const char *s, size_t len)
{
	memcpy(cmd->buf + cmd->buflen, s, len);
	cmd->buflen += len;
}

/* Stages len more bytes, written next, as a piece of list. */
static void
stage(struct limiter_command *cmd, struct limiter_args *list, size_t len)
{
	reserve(cmd, len);
	list->v = grow(list->v, &list->cap, list->n + 1, sizeof(*list->v));
	list->v[list->n].off = cmd->buflen;
	list->v[list->n++].len = len;
}

static void
push(struct limiter_command *cmd, struct limiter_args *list, const char *s,
    size_t len)
{
	stage(cmd, list, len);
	put(cmd, s, len);
}

static void
push_num(struct limiter_command *cmd, struct limiter_args *list, long long v)
{
	char tmp[FMT_LL_MAX];

	push(cmd, list, tmp, fmt_ll(tmp, v));
}

void
limiter_reset(struct limiter_command *cmd)
{
	cmd->keys.n = cmd->setargs.n = cmd->checkargs.n = 0;
	cmd->nsets = cmd->nchecks = cmd->buflen = 0;
}

/* The index (from 1) of set in the batch, which it joins if new: its
 * limits go to ARGV once however many checks use it. A batch holds one
 * set per route or override its checks use, usually one or two. */
static size_t
set_index(struct limiter_command *cmd, const struct limit_set *set)
{
	for (size_t i = 0; i < cmd->nsets; i++)
		if (cmd->sets[i] == set)
			return i + 1;
	cmd->sets = grow(cmd->sets, &cmd->setscap, cmd->nsets + 1,
	    sizeof(*cmd->sets));
	cmd->sets[cmd->nsets++] = set;
	push_num(cmd, &cmd->setargs, (long long)set->nlimits);
	for (size_t i = 0; i < set->nlimits; i++) {
		const struct limit *l = &set->limits[i];
		const char *alg = config_algorithm_name(l->algorithm);

		push(cmd, &cmd->setargs, alg, strlen(alg));
		push_num(cmd, &cmd->setargs, l->quota);
		if (config_algorithm_is_bucket(l->algorithm)) {
			push_num(cmd, &cmd->setargs, l->rate_n);
			push_num(cmd, &cmd->setargs, l->rate_period_us);
		} else {
			push_num(cmd, &cmd->setargs, l->window_us);
			push_num(cmd, &cmd->setargs, l->precision_us);
		}
	}
	return cmd->nsets;
}

void
limiter_add(struct limiter_command *cmd, const char *key_prefix,
    const char *route, const char *client, const struct limit_set *set,
    long long cost)
{
	size_t plen = strlen(key_prefix), rlen = strlen(route), clen = strlen(client);

	for (size_t i = 0; i < set->nlimits; i++) {
		const struct limit *l = &set->limits[i];
		const char *alg = config_algorithm_name(l->algorithm);
		size_t nlen = strlen(l->name), alen = strlen(alg);
		size_t len = plen + rlen + clen + nlen + alen + 5; /* {:}:: */

		stage(cmd, &cmd->keys, len);
		put(cmd, key_prefix, plen);
		put(cmd, "{", 1);
		put(cmd, route, rlen);
		put(cmd, ":", 1);
		put(cmd, client, clen);
		put(cmd, "}:", 2);
		put(cmd, l->name, nlen);
		put(cmd, ":", 1);
		put(cmd, alg, alen);
	}
	push_num(cmd, &cmd->checkargs, (long long)set_index(cmd, set));
	push_num(cmd, &cmd->checkargs, cost);
	cmd->nchecks++;
}

/* Appends one RESP bulk string, $len CRLF bytes CRLF, at out + o. */
static size_t
resp_bulk(char *out, size_t o, const char *s, size_t len)
{
	out[o++] = '$';
	o += fmt_ll(out + o, (long long)len);
	out[o++] = '\r';
	out[o++] = '\n';
	memcpy(out + o, s, len);
	o += len;
	out[o++] = '\r';
	out[o++] = '\n';
	return o;
}

/* Appends each piece of list as a bulk string. */
static size_t
resp_list(struct limiter_command *cmd, size_t o, const struct limiter_args *list)
{
	for (size_t i = 0; i < list->n; i++)
		o = resp_bulk(cmd->resp, o, cmd->buf + list->v[i].off,
		    list->v[i].len);
	return o;
}

/*
 * Writes EVALSHA sha numkeys KEYS... 0 S SETS... CHECKS... as the RESP
 * array Redis reads, for redisAsyncFormattedCommand: hiredis's own
 * formatting (from an argv) runs a printf-like sdscatfmt per argument and
 * allocates the result per call, and was about a quarter of the daemon's
 * instructions per check.
 */
void
limiter_finish(struct limiter_command *cmd, const char *sha)
{
	size_t argc = 3 + cmd->keys.n + 2 + cmd->setargs.n + cmd->checkargs.n;
	size_t shalen = strlen(sha), o = 0;
	char numkeys[FMT_LL_MAX], nsets[FMT_LL_MAX];
	size_t nklen = fmt_ll(numkeys, (long long)cmd->keys.n);
	size_t nslen = fmt_ll(nsets, (long long)cmd->nsets);
	/* Every element costs its bytes plus at most FMT_LL_MAX + 5 of framing. */
	size_t need = (argc + 1) * (FMT_LL_MAX + 5) + 7 + shalen + nklen + 1 +
	    nslen + cmd->buflen;

	cmd->resp = grow(cmd->resp, &cmd->respcap, need, 1);
	cmd->resp[o++] = '*';
	o += fmt_ll(cmd->resp + o, (long long)argc);
	cmd->resp[o++] = '\r';
	cmd->resp[o++] = '\n';
	o = resp_bulk(cmd->resp, o, "EVALSHA", 7);
	o = resp_bulk(cmd->resp, o, sha, shalen);
	o = resp_bulk(cmd->resp, o, numkeys, nklen);
	o = resp_list(cmd, o, &cmd->keys);
	o = resp_bulk(cmd->resp, o, "0", 1);	/* time: Redis TIME */
	o = resp_bulk(cmd->resp, o, nsets, nslen);
	o = resp_list(cmd, o, &cmd->setargs);
	o = resp_list(cmd, o, &cmd->checkargs);
	cmd->resplen = o;
}

void
limiter_command_free(struct limiter_command *cmd)
{
	free(cmd->buf);
	free(cmd->resp);
	free(cmd->keys.v);
	free(cmd->setargs.v);
	free(cmd->checkargs.v);
	free(cmd->sets);
	memset(cmd, 0, sizeof(*cmd));
}

/*
 * A time of the reply, in [0, LIMITER_MS_MAX]. A policy can name times
 * past it (a bucket of a million million at 1/366d, denied a cost above
 * its burst, is told the time it would take to fill), which no client
 * waits for; capped, every time in microseconds fits a long long, for the
 * deny cache's deadlines and the shaping timer.
 */
static long long
time_ms(long long ms)
{
	if (ms < 0)
		return 0;
	return ms > LIMITER_MS_MAX ? LIMITER_MS_MAX : ms;
}

int
limiter_parse(const struct limit_set *set, const long long *ints, size_t n,
    struct verdict *v)
{
	if (n != LIMITER_REPLY_INTS(set->nlimits))
		return -1;
	memset(v, 0, sizeof(*v));
	v->allowed = ints[0] == 1;
	v->now_ms = time_ms(ints[1]);	/* the deny cache ages it */
	v->n = set->nlimits;
	for (size_t i = 0; i < set->nlimits; i++) {
		const long long *p = ints + 2 + 5 * i;
		struct limit_result *r = &v->r[i];

		r->allowed = p[0] == 1;
		r->remaining = p[1] < 0 ? 0 : p[1];
		r->reset_ms = time_ms(p[2]);
		r->retry_ms = time_ms(p[3]);
		r->delay_ms = time_ms(p[4]);
		if (!r->allowed && r->retry_ms > v->retry_ms)
			v->retry_ms = r->retry_ms;
		if (v->allowed && set->limits[i].delay && r->delay_ms > v->delay_ms)
			v->delay_ms = r->delay_ms;
		/* The headline: lowest remaining; on a tie, the longest reset. */
		if (i > 0) {
			const struct limit_result *h = &v->r[v->headline];

			if (r->remaining < h->remaining || (r->remaining ==
			    h->remaining && r->reset_ms > h->reset_ms))
				v->headline = i;
		}
	}
	if (!v->allowed && v->retry_ms == 0)
		v->retry_ms = 1000;	/* denied by a limit that gave no time */
	return 0;
}

long long
limiter_ms_to_s(long long ms)
{
	return ms <= 0 ? 0 : ms / 1000 + (ms % 1000 != 0);
}

/* Appends one IETF list item, `"name";k=x;k=y` (", " first when it is
 * not the first), at *o: at most LIMITER_IETF_ITEM_MAX bytes, and the
 * field has room for one per limit. Without printf: with ietf_headers,
 * every check writes two of these per limit. */
static void
ietf_item(char *out, size_t *o, size_t i, const char *name, const char *kx,
    long long x, const char *ky, long long y)
{
	char *p = out + *o;
	size_t nl = strnlen(name, CONFIG_NAME_MAX);	/* the loader's bound */

	if (i > 0) {
		memcpy(p, ", ", 2);
		p += 2;
	}
	*p++ = '"';
	memcpy(p, name, nl);
	p += nl;
	*p++ = '"';
	memcpy(p, kx, 3);
	p += 3;
	p += fmt_ll(p, x);
	memcpy(p, ky, 3);
	p += 3;
	p += fmt_ll(p, y);	/* and the NUL */
	*o = (size_t)(p - out);
}

/* RateLimit-Policy: what the limits are, known without Redis. */
static void
format_policy(const struct limit_set *set, struct limiter_headers *h)
{
	size_t po = 0;

	h->policy[0] = '\0';
	for (size_t i = 0; i < set->nlimits; i++)
		ietf_item(h->policy, &po, i, set->limits[i].name, ";q=",
		    set->limits[i].quota, ";w=",
		    config_limit_window_seconds(&set->limits[i]));
}

void
limiter_format(const struct limit_set *set, const struct verdict *v, int ietf,
    struct limiter_headers *h)
{
	const struct limit_result *r = &v->r[v->headline];

	fmt_ll(h->limit, set->limits[v->headline].quota);
	fmt_ll(h->remaining, r->remaining);
	fmt_ll(h->reset, limiter_ms_to_s(r->reset_ms));
	h->retry_after[0] = '\0';
	if (!v->allowed) {
		long long s = limiter_ms_to_s(v->retry_ms);

		fmt_ll(h->retry_after, s < 1 ? 1 : s);
	}
	h->policy[0] = h->ratelimit[0] = '\0';
	if (ietf) {
		size_t ro = 0;

		format_policy(set, h);
		for (size_t i = 0; i < v->n; i++)
			ietf_item(h->ratelimit, &ro, i, set->limits[i].name, ";r=",
			    v->r[i].remaining, ";t=",
			    limiter_ms_to_s(v->r[i].reset_ms));
	}
}

/* Without Redis's answer only the policy is known: RateLimit-Policy goes
 * with the smallest quota, the state (RateLimit, the reset) does not. */
void
limiter_format_degraded(const struct limit_set *set, int ietf,
    struct limiter_headers *h)
{
	long long quota = set->limits[0].quota;

	for (size_t i = 1; i < set->nlimits; i++)
		if (set->limits[i].quota < quota)
			quota = set->limits[i].quota;
	fmt_ll(h->limit, quota);
	fmt_ll(h->remaining, -1);
	h->reset[0] = h->retry_after[0] = h->policy[0] = h->ratelimit[0] = '\0';
	if (ietf)
		format_policy(set, h);
}
