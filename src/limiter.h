/*
 * From (route, client, limits, cost) to the script call, and from the
 * script's reply to a verdict and its headers. Pure: no I/O.
 */
#ifndef LIMITER_H
#define LIMITER_H

#include <stddef.h>

#include "config.h"
#include "fmt.h"

/* An encoded client key: 256 bytes percent-encoded, or '#' + 64 hex. */
#define LIMITER_CLIENT_MAX	(CONFIG_KEY_RAW_MAX * 3 + 1)
/* One IETF list item at its longest: ", ", the quoted name, two ";k=N". */
#define LIMITER_IETF_ITEM_MAX	(2 + CONFIG_NAME_MAX + 2 + 2 * (3 + FMT_LL_MAX))
#define LIMITER_IETF_MAX	(CONFIG_LIMITS_MAX * LIMITER_IETF_ITEM_MAX + 1)
/* The longest time a verdict carries: 10^15 ms, about 31,700 years. */
#define LIMITER_MS_MAX		1000000000000000LL

/* A piece of a command under construction: an offset into buf, so the
 * buffer may grow while checks are added. */
struct limiter_arg {
	size_t	off;
	size_t	len;
};

/* A list of staged pieces. */
struct limiter_args {
	struct limiter_arg	*v;
	size_t			 n, cap;
};

/* One EVALSHA carrying a batch of checks, built into storage that grows to
 * the largest batch seen and is then reused: no allocation per check. The
 * script takes every check's keys first in KEYS; in ARGV the time, each
 * distinct limit set of the batch once, then per check its set's index
 * and its cost. So the keys, the sets and the checks are staged apart and
 * joined by limiter_finish. */
struct limiter_command {
	struct limiter_args	 keys, setargs, checkargs;
	const struct limit_set	**sets;		/* the batch's, by index - 1 */
	size_t			 nsets, setscap;
	size_t			 nchecks;
	char			*buf;
	size_t			 buflen, bufsize;
	char			*resp;		/* the command, after limiter_finish */
	size_t			 resplen, respcap;
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
	long long		now_ms;		/* Redis time of the decision, capped */
	size_t			n;
	struct limit_result	r[CONFIG_LIMITS_MAX];
	size_t			headline;	/* closest to exhaustion */
	long long		retry_ms;	/* until every denying limit passes */
	long long		delay_ms;	/* shaping: hold the reply this long */
};

/* Header values of a reply; empty strings are not sent. */
struct limiter_headers {
	char	limit[FMT_LL_MAX];
	char	remaining[FMT_LL_MAX];
	char	reset[FMT_LL_MAX];
	char	retry_after[FMT_LL_MAX];
	char	policy[LIMITER_IETF_MAX];	/* IETF RateLimit-Policy */
	char	ratelimit[LIMITER_IETF_MAX];	/* IETF RateLimit */
};

/* Writes the Redis-safe form of a client key into out (LIMITER_CLIENT_MAX
 * bytes); returns its length. */
size_t limiter_encode_client(const char *key, size_t len, char *out);

/* Empties cmd for a new batch. */
void limiter_reset(struct limiter_command *cmd);
/* Appends one check of the route's limits; client is encoded. */
void limiter_add(struct limiter_command *cmd, const char *key_prefix,
    const char *route, const char *client, const struct limit_set *set,
    long long cost);
/* Writes EVALSHA sha numkeys KEYS... 0 S SETS... CHECKS... into resp, as
 * the RESP array Redis reads. */
void limiter_finish(struct limiter_command *cmd, const char *sha);
void limiter_command_free(struct limiter_command *cmd);

/* The script's reply to one check: 2 + 5 integers per limit. */
#define LIMITER_REPLY_INTS(nlimits)	(2 + 5 * (nlimits))

/* Reads one check's slice of the script reply into v, its times capped
 * at LIMITER_MS_MAX; 0, or -1 when malformed. */
int limiter_parse(const struct limit_set *set, const long long *ints, size_t n,
    struct verdict *v);

/* Seconds rounded up, as the headers show time. */
long long limiter_ms_to_s(long long ms);

void limiter_format(const struct limit_set *set, const struct verdict *v,
    int ietf, struct limiter_headers *h);
/* The headers of a degraded answer: smallest quota, remaining -1, and
 * with ietf the RateLimit-Policy field. */
void limiter_format_degraded(const struct limit_set *set, int ietf,
    struct limiter_headers *h);

#endif
