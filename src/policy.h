/*
 * Request to route to client key to limits: the pure decisions of a check,
 * with no I/O, so the unit tests drive them directly.
 */
#ifndef POLICY_H
#define POLICY_H

#include <stddef.h>

#include "config.h"

#define POLICY_PATH_MAX	65537	/* normalized path: any URI we accept fits */

/* The original request as the gateway described it. */
struct check_input {
	const char	*method;
	const char	*path;		/* normalized, no query */
	const char	*query;		/* after '?', raw; NULL when none */
	const char	*host;		/* NULL when unknown */
	const char	*ip;		/* the client IP, canonical text; NULL
					 * when the route does not key by it */
	/* The nth (from 0) line of a request header, by name
	 * (case-insensitive); NULL past the last. */
	const char	*(*header)(void *ctx, const char *name, unsigned nth);
	void		*header_ctx;
};

/* Splits a raw URI into a normalized path (percent-decoded except %00,
 * merged slashes, dot segments resolved, like nginx before location
 * matching) written to buf, and a pointer to the raw query inside uri. */
void policy_normalize_uri(const char *uri, char *buf, size_t size,
    const char **query);
/* The path and query of an absolute-form URI (http://host/path?q; RFC 9112
 * 3.2.2), maybe empty; any other URI as it is. */
const char *policy_origin_form(const char *uri);
/* The host[:port] of an absolute-form URI, copied to buf without the
 * userinfo (cut to size - 1 bytes); NULL for any other URI or an empty
 * authority. */
const char *policy_uri_authority(const char *uri, char *buf, size_t size);

/* Splits a Host value into its parts (struct host_parts). */
void policy_host_split(const char *host, struct host_parts *out);
/* Does every request that match.host b takes match host a too? */
int policy_host_covers(const char *a, const char *b);

/* Does r's match.methods list method (GET takes HEAD with it)? r must
 * list some. */
int policy_route_takes_method(const struct route *r, const char *method);
/* The first route, in file order, that takes the request, or NULL; the
 * config prepared (policy_prepare indexes its routes by host). */
const struct route *policy_match(const struct config *config,
    const struct check_input *in);

/* What policy_client_key found. */
#define POLICY_KEY_NONE		(-1)	/* no source present */
#define POLICY_KEY_VALUE	0	/* a header, query or cookie value */
#define POLICY_KEY_GLOBAL	1	/* the route-wide key, "*" */
#define POLICY_KEY_IP		2	/* the client IP */

/* The client key of the route: the first key source present. *key points into
 * the request or into buf. Returns a POLICY_KEY_* (Redis names the global
 * key "*", which no encoded client key can be). */
int policy_client_key(const struct route *route, const struct check_input *in,
    char *buf, size_t size, const char **key, size_t *keylen);

/* Does any of the route's key sources take the client IP? */
int policy_route_keys_by_ip(const struct route *route);
/* Is the client IP its only key source (so every key is an address)? */
int policy_route_keys_by_ip_alone(const struct route *route);

/* Does the route key by the client IP and by a value the client sends
 * (header, query, cookie)? Then a value that spells an address must not
 * be that address's client: see policy_limits and check_run. */
int policy_route_mixes_ip(const struct route *route);

/* Derives what the checks of a loaded policy would otherwise work out on
 * every request: which routes mix the IP with values, the canonical form
 * of their override keys that are addresses, and the sorted indexes
 * policy_limits, policy_match and the client IP search. Once, before use:
 * policy_limits refuses a route it has not prepared. */
void policy_prepare(struct config *config);

/* The limits that apply to this client (an override's, or the route's);
 * from_ip: the key is the client IP (POLICY_KEY_IP). */
const struct limit_set *policy_limits(const struct route *route,
    const char *key, size_t keylen, int from_ip);

/* The client IP (SPEC §5) as canonical text in out, an IPv6 one cut to
 * config->client_ipv6_prefix ("2001:db8:1:2::/64"); config prepared
 * (policy_prepare sorts its trusted_proxies). A NULL peer is a unix
 * socket peer, on this host by definition, so it is trusted like a listed
 * proxy; with no forwarding header its client is "unix". Returns 0, or -1
 * when no address was found. */
int policy_client_ip(const struct config *config, const char *peer,
    const char *forwarded_for, const char *real_ip, char *out, size_t size);

/* An IP literal (v4, v6, [v6]) as the client it names, in the form
 * policy_client_ip writes (an IPv6 address cut to ipv6_prefix bits, which
 * may also be given as "ADDRESS/ipv6_prefix"); 0 or -1. */
int policy_canonical_ip(int ipv6_prefix, const char *s, size_t len, char *out,
    size_t size);

#endif
