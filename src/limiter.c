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
#include <string.h>

#include "limiter.h"
#include "sha256.h"
#include "xmalloc.h"

#define NUM_MAX 24	/* a formatted long long */

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

/* Appends a string to the command buffer and records it as an argument. */
static void
push(struct limiter_command *cmd, size_t *off, const char *s, size_t len)
{
	memcpy(cmd->buf + *off, s, len);
	cmd->argv[cmd->argc] = cmd->buf + *off;
	cmd->argvlen[cmd->argc++] = len;
	*off += len;
}

static void
push_num(struct limiter_command *cmd, size_t *off, long long v)
{
	char tmp[NUM_MAX];
	int n = snprintf(tmp, sizeof(tmp), "%lld", v);

	push(cmd, off, tmp, (size_t)n);
}

void
limiter_build(struct limiter_command *cmd, const char *sha,
    const char *key_prefix, const char *route, const char *client,
    const struct limit_set *set, long long cost)
{
	size_t plen = strlen(key_prefix), rlen = strlen(route), clen = strlen(client);
	size_t need = 64 + NUM_MAX * 2, off = 0;

	for (size_t i = 0; i < set->nlimits; i++) {
		const struct limit *l = &set->limits[i];

		need += plen + rlen + clen + strlen(l->name) +
		    strlen(config_algorithm_name(l->algorithm)) * 2 + 8 + NUM_MAX * 3;
	}
	if (need > cmd->bufsize) {
		cmd->buf = xrealloc(cmd->buf, need);
		cmd->bufsize = need;
	}
	cmd->argc = 0;
	push(cmd, &off, "EVALSHA", 7);
	push(cmd, &off, sha, strlen(sha));
	push_num(cmd, &off, (long long)set->nlimits);
	for (size_t i = 0; i < set->nlimits; i++) {
		const struct limit *l = &set->limits[i];
		const char *alg = config_algorithm_name(l->algorithm);
		size_t start = off;

		memcpy(cmd->buf + off, key_prefix, plen);
		off += plen;
		cmd->buf[off++] = '{';
		memcpy(cmd->buf + off, route, rlen);
		off += rlen;
		cmd->buf[off++] = ':';
		memcpy(cmd->buf + off, client, clen);
		off += clen;
		cmd->buf[off++] = '}';
		cmd->buf[off++] = ':';
		memcpy(cmd->buf + off, l->name, strlen(l->name));
		off += strlen(l->name);
		cmd->buf[off++] = ':';
		memcpy(cmd->buf + off, alg, strlen(alg));
		off += strlen(alg);
		cmd->argv[cmd->argc] = cmd->buf + start;
		cmd->argvlen[cmd->argc++] = off - start;
	}
	push(cmd, &off, "0", 1);	/* time: Redis TIME */
	push_num(cmd, &off, cost);
	for (size_t i = 0; i < set->nlimits; i++) {
		const struct limit *l = &set->limits[i];
		const char *alg = config_algorithm_name(l->algorithm);

		push(cmd, &off, alg, strlen(alg));
		if (config_algorithm_is_bucket(l->algorithm)) {
			push_num(cmd, &off, l->quota);
			push_num(cmd, &off, l->rate_n);
			push_num(cmd, &off, l->rate_period_us);
		} else {
			push_num(cmd, &off, l->quota);
			push_num(cmd, &off, l->window_us);
			push_num(cmd, &off, l->precision_us);
		}
	}
}

void
limiter_command_free(struct limiter_command *cmd)
{
	free(cmd->buf);
	cmd->buf = NULL;
	cmd->bufsize = 0;
}

int
limiter_parse(const struct limit_set *set, const long long *ints, size_t n,
    struct verdict *v)
{
	if (n != 2 + 5 * set->nlimits)
		return -1;
	memset(v, 0, sizeof(*v));
	v->allowed = ints[0] == 1;
	v->now_ms = ints[1];
	v->n = set->nlimits;
	for (size_t i = 0; i < set->nlimits; i++) {
		const long long *p = ints + 2 + 5 * i;
		struct limit_result *r = &v->r[i];

		r->allowed = p[0] == 1;
		r->remaining = p[1] < 0 ? 0 : p[1];
		r->reset_ms = p[2] < 0 ? 0 : p[2];
		r->retry_ms = p[3] < 0 ? 0 : p[3];
		r->delay_ms = p[4] < 0 ? 0 : p[4];
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
	return ms <= 0 ? 0 : (ms + 999) / 1000;
}

void
limiter_format(const struct limit_set *set, const struct verdict *v, int ietf,
    struct limiter_headers *h)
{
	const struct limit_result *r = &v->r[v->headline];

	snprintf(h->limit, sizeof(h->limit), "%lld", set->limits[v->headline].quota);
	snprintf(h->remaining, sizeof(h->remaining), "%lld", r->remaining);
	snprintf(h->reset, sizeof(h->reset), "%lld", limiter_ms_to_s(r->reset_ms));
	h->retry_after[0] = '\0';
	if (!v->allowed) {
		long long s = limiter_ms_to_s(v->retry_ms);

		snprintf(h->retry_after, sizeof(h->retry_after), "%lld", s < 1 ? 1 : s);
	}
	h->policy[0] = h->ratelimit[0] = '\0';
	if (ietf) {
		size_t po = 0, ro = 0;

		for (size_t i = 0; i < v->n; i++) {
			const struct limit *l = &set->limits[i];
			int n;

			n = snprintf(h->policy + po, sizeof(h->policy) - po,
			    "%s\"%s\";q=%lld;w=%lld", i ? ", " : "", l->name,
			    l->quota, config_limit_window_seconds(l));
			if (n > 0 && (size_t)n < sizeof(h->policy) - po)
				po += (size_t)n;
			n = snprintf(h->ratelimit + ro, sizeof(h->ratelimit) - ro,
			    "%s\"%s\";r=%lld;t=%lld", i ? ", " : "", l->name,
			    v->r[i].remaining, limiter_ms_to_s(v->r[i].reset_ms));
			if (n > 0 && (size_t)n < sizeof(h->ratelimit) - ro)
				ro += (size_t)n;
		}
	}
}

void
limiter_format_degraded(const struct limit_set *set, struct limiter_headers *h)
{
	long long quota = set->limits[0].quota;

	for (size_t i = 1; i < set->nlimits; i++)
		if (set->limits[i].quota < quota)
			quota = set->limits[i].quota;
	snprintf(h->limit, sizeof(h->limit), "%lld", quota);
	snprintf(h->remaining, sizeof(h->remaining), "-1");
	h->reset[0] = h->retry_after[0] = h->policy[0] = h->ratelimit[0] = '\0';
}
