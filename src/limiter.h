/*
 * From (route, client, limits, cost) to the script call, and from the
 * script's reply to a verdict and its headers. Pure: no I/O.
 */
#ifndef LIMITER_H
#define LIMITER_H

#include <stddef.h>

#include "config.h"

/* An encoded client key: 256 bytes percent-encoded, or '#' + 64 hex. */
#define LIMITER_CLIENT_MAX	(CONFIG_KEY_RAW_MAX * 3 + 1)
#define LIMITER_ARGC_MAX	(3 + CONFIG_LIMITS_MAX * 5 + 2)
#define LIMITER_IETF_MAX	(CONFIG_LIMITS_MAX * 96)

/* An EVALSHA command built into reusable storage. */
struct limiter_command {
	int		 argc;
	const char	*argv[LIMITER_ARGC_MAX];
	size_t		 argvlen[LIMITER_ARGC_MAX];
	char		*buf;		/* grows once, then reused */
	size_t		 bufsize;
};

struct limit_result {
	int		allowed;
	long long	remaining;
	long long	reset_ms;
	long long	retry_ms;
	long long	delay_ms;
};

struct verdict {
	int			allowed;
	long long		now_ms;		/* Redis time of the decision */
	size_t			n;
	struct limit_result	r[CONFIG_LIMITS_MAX];
	size_t			headline;	/* closest to exhaustion */
	long long		retry_ms;	/* until every denying limit passes */
	long long		delay_ms;	/* shaping: hold the reply this long */
};

/* Header values of a reply; empty strings are not sent. */
struct limiter_headers {
	char	limit[24];
	char	remaining[24];
	char	reset[24];
	char	retry_after[24];
	char	policy[LIMITER_IETF_MAX];	/* IETF RateLimit-Policy */
	char	ratelimit[LIMITER_IETF_MAX];	/* IETF RateLimit */
};

/* Writes the Redis-safe form of a client key into out (LIMITER_CLIENT_MAX
 * bytes); returns its length. */
size_t limiter_encode_client(const char *key, size_t len, char *out);

/* Builds EVALSHA sha for the route's limits; client is encoded. */
void limiter_build(struct limiter_command *cmd, const char *sha,
    const char *key_prefix, const char *route, const char *client,
    const struct limit_set *set, long long cost);
void limiter_command_free(struct limiter_command *cmd);

/* Reads the script reply (integers) into v; 0, or -1 when malformed. */
int limiter_parse(const struct limit_set *set, const long long *ints, size_t n,
    struct verdict *v);

/* Seconds rounded up, as the headers show time. */
long long limiter_ms_to_s(long long ms);

void limiter_format(const struct limit_set *set, const struct verdict *v,
    int ietf, struct limiter_headers *h);
/* The headers of a degraded answer: smallest quota, remaining -1. */
void limiter_format_degraded(const struct limit_set *set, struct limiter_headers *h);

#endif
