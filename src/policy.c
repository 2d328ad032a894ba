/*
 * Route matching, client key resolution and client IP resolution. Everything
 * here is pure: it reads the policy and the request description and writes
 * only into buffers the caller owns, so a check allocates nothing here.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fmt.h"
#include "log.h"
#include "policy.h"
#include "xmalloc.h"

/* The length of an absolute-form URI's "http://" or "https://", else 0. */
static size_t
scheme_len(const char *uri)
{
	if (strncasecmp(uri, "http://", 7) == 0)
		return 7;
	if (strncasecmp(uri, "https://", 8) == 0)
		return 8;
	return 0;
}

const char *
policy_origin_form(const char *uri)
{
	size_t scheme = scheme_len(uri);

	/* The authority ends at the first '/', '?' or '#': a '/' in the
	 * query is not the path. */
	return scheme ? uri + scheme + strcspn(uri + scheme, "/?#") : uri;
}

const char *
policy_uri_authority(const char *uri, char *buf, size_t size)
{
	size_t scheme = scheme_len(uri), len;
	const char *start = uri + scheme, *end, *at;

	if (scheme == 0)
		return NULL;
	end = start + strcspn(start, "/?#");
	/* user:password@ names no host; the last '@' ends it, as a '@'
	 * cannot be in a host */
	for (at = start; at < end; at++)
		if (*at == '@')
			start = at + 1;
	len = (size_t)(end - start);
	if (len == 0 || size == 0)
		return NULL;
	if (len >= size)
		len = size - 1;
	memcpy(buf, start, len);
	buf[len] = '\0';
	return buf;
}

void
policy_normalize_uri(const char *uri, char *buf, size_t size, const char **query)
{
	size_t o = 0;
	const char *p = policy_origin_form(uri);

	*query = NULL;
	if (size < 2) {
		if (size)
			buf[0] = '\0';
		return;
	}
	buf[o++] = '/';
	for (; *p && *p != '?' && *p != '#' && o < size - 1; p++) {
		int c = (unsigned char)*p;

		if (c == '%' && fmt_hexval(p[1]) >= 0 && fmt_hexval(p[2]) >= 0) {
			int d = fmt_hexval(p[1]) * 16 + fmt_hexval(p[2]);

			/* %2F decodes to a slash that separates segments, as
			 * nginx decodes it before choosing a location: left
			 * encoded, "/auth%2Flogin" matched no route while nginx
			 * and most applications served /auth/login. %00 stays
			 * encoded (nginx refuses it). */
			if (d != 0) {
				c = d;
				p += 2;
			}
		}
		if (c == '/') {
			if (buf[o - 1] == '/')
				continue;	/* merge slashes */
		}
		buf[o++] = (char)c;
		/* Resolve "." and ".." once a segment is complete. */
		if (c == '/' || p[1] == '\0' || p[1] == '?' || p[1] == '#') {
			size_t end = c == '/' ? o - 1 : o;
			size_t start = end;

			while (start > 0 && buf[start - 1] != '/')
				start--;
			if (end - start == 1 && buf[start] == '.') {
				o = start;
			} else if (end - start == 2 && buf[start] == '.' &&
			    buf[start + 1] == '.') {
				o = start > 1 ? start - 1 : 1;
				while (o > 1 && buf[o - 1] != '/')
					o--;
			}
			if (o == 0)
				o = 1;
		}
	}
	buf[o] = '\0';
	while (*p && *p != '?' && *p != '#')
		p++;
	if (*p == '?')
		*query = p + 1;
}

void
policy_host_split(const char *s, struct host_parts *out)
{
	const char *end, *colon;

	/* A proxy that appends to X-Forwarded-Host joins the hosts with
	 * commas, the client's first (RFC 7239's order): the same field on
	 * separate lines already counts by its first, and so does a list.
	 * No host has a comma or a space in it; an empty element ahead of
	 * the first host (", api.example.com") is skipped, as in
	 * X-Forwarded-For. */
	s += strspn(s, " \t,");
	end = s + strcspn(s, ",");
	while (end > s && (end[-1] == ' ' || end[-1] == '\t'))
		end--;
	out->port = NULL;
	out->portlen = 0;
	out->is_v6 = 0;
	if (s[0] == '[') {
		const char *close = memchr(s, ']', (size_t)(end - s));

		if (close) {
			out->name = s + 1;
			out->namelen = (size_t)(close - s - 1);
			if (close + 1 < end && close[1] == ':') {
				out->port = close + 2;
				out->portlen = (size_t)(end - out->port);
			}
			return;
		}
	}
	out->name = s;
	out->namelen = (size_t)(end - s);
	/* One colon parts a port; more are a bare IPv6 address. */
	if ((colon = memchr(s, ':', out->namelen)) != NULL &&
	    memchr(colon + 1, ':', (size_t)(end - colon - 1)) == NULL) {
		out->namelen = (size_t)(colon - s);
		out->port = colon + 1;
		out->portlen = (size_t)(end - out->port);
	}
	if (out->namelen > 0 && s[out->namelen - 1] == '.')
		out->namelen--;	/* a fully qualified name with its root dot */
}

/* s[0..len) as an IPv6 address, no brackets or port: 1 and addr, or 0. */
static int
ipv6_from_text(const char *s, size_t len, unsigned char addr[16])
{
	char text[INET6_ADDRSTRLEN];

	if (len == 0 || len >= sizeof(text) || memchr(s, '\0', len) != NULL)
		return 0;
	memcpy(text, s, len);
	text[len] = '\0';
	return inet_pton(AF_INET6, text, addr) == 1;
}

/* The policy's host against the request's: names alike but for case,
 * brackets and a root dot; the port only when the policy names one, and
 * then as a number. The policy's has no leading zero; a request's may
 * (":08080" reaches the same server as ":8080"), and comparing it as
 * text would let a client step around a route that names the port. */
static int
host_matches(const struct host_parts *w, const struct host_parts *h)
{
	const char *port = h->port;
	size_t portlen = h->portlen;

	if (w->is_v6) {
		/* "[2001:db8:0::1]" is [2001:db8::1]: compared as text, a
		 * client could step around the route by spelling. */
		unsigned char addr[16];

		if (!ipv6_from_text(h->name, h->namelen, addr) ||
		    memcmp(addr, w->v6, sizeof(addr)) != 0)
			return 0;
	} else if (w->namelen != h->namelen ||
	    strncasecmp(w->name, h->name, w->namelen) != 0)
		return 0;
	if (w->port == NULL)
		return 1;
	while (portlen > 1 && port[0] == '0') {
		port++;
		portlen--;
	}
	return w->portlen == portlen && memcmp(w->port, port, portlen) == 0;
}

/* A route's match.host as host_matches compares it: split, and an IPv6
 * address read, once. */
static void
route_host_parts(const char *host, struct host_parts *hp)
{
	policy_host_split(host, hp);
	hp->is_v6 = ipv6_from_text(hp->name, hp->namelen, hp->v6);
}

int
policy_host_covers(const char *a, const char *b)
{
	struct host_parts wa, hb;

	/* b as a request's Host: with no port, it stands for requests on
	 * every port, which a only takes if it names none. */
	route_host_parts(a, &wa);
	policy_host_split(b, &hb);
	return host_matches(&wa, &hb);
}

int
policy_route_takes_method(const struct route *r, const char *method)
{
	/* HEAD is GET without the body (RFC 9110 9.3.2), served by the same
	 * handler: a GET limit that a HEAD stepped around would limit
	 * nothing. nginx's limit_except GET takes HEAD with it too. */
	int head = strcasecmp(method, "HEAD") == 0;

	for (size_t j = 0; j < r->nmethods; j++)
		if (strcasecmp(r->methods[j], method) == 0 ||
		    (head && strcmp(r->methods[j], "GET") == 0))
			return 1;
	return 0;
}

/* Does r take the request? host: the request's, split on the first
 * route that asks (*host_split). */
static int
route_takes(const struct route *r, const struct check_input *in,
    struct host_parts *host, int *host_split)
{
	switch (r->path_kind) {
	case PATH_ANY:
		break;
	case PATH_EXACT:
		if (strcmp(r->path, in->path) != 0)
			return 0;
		break;
	case PATH_PREFIX:
		if (strncmp(r->path, in->path, r->path_len) != 0)
			return 0;
		break;
	case PATH_REGEX:
		/* a thousand regex routes cost a path 0.1 ms; their leads and
		 * needles, a fraction of it */
		if (strncmp(r->regex_lead, in->path, r->regex_lead_len) != 0 ||
		    (r->regex_needle[0] &&
		    strstr(in->path, r->regex_needle) == NULL) ||
		    regexec(&r->regex, in->path, 0, NULL, 0) != 0)
			return 0;
		break;
	}
	if (r->nmethods && !policy_route_takes_method(r, in->method))
		return 0;
	if (r->host) {
		if (in->host == NULL)
			return 0;
		if (!*host_split) {
			policy_host_split(in->host, host);
			*host_split = 1;
		}
		if (!host_matches(&r->host_parts, host))
			return 0;
	}
	return 1;
}

/* Host names as host_matches compares them, alike but for ASCII case
 * (strncasecmp in the C locale), in an order for config->host_routes:
 * shorter first, then by their lower-case bytes. */
static int
host_name_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
	if (alen != blen)
		return alen < blen ? -1 : 1;
	for (size_t i = 0; i < alen; i++) {
		int x = tolower((unsigned char)a[i]);
		int y = tolower((unsigned char)b[i]);

		if (x != y)
			return x < y ? -1 : 1;
	}
	return 0;
}

/* The first of config->host_routes named name[0..len) (past: after) */
static size_t
host_routes_bound(const struct config *config, const char *name, size_t len,
    int past)
{
	size_t lo = 0, hi = config->nhost_routes;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct host_route *hr = &config->host_routes[mid];
		int c = host_name_cmp(hr->name, hr->namelen, name, len);

		if (c < 0 || (past && c == 0))
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

const struct route *
policy_match(const struct config *config, const struct check_input *in)
{
	struct host_parts host;
	int host_split = 0;	/* the request's, once a route asks */
	size_t any = 0, named = 0, named_end = 0;

	if (in->host != NULL && config->nhost_routes > 0) {
		policy_host_split(in->host, &host);
		host_split = 1;
		named = host_routes_bound(config, host.name, host.namelen, 0);
		named_end = host_routes_bound(config, host.name, host.namelen, 1);
	}
	/* the routes of the request's host name and those of any host, in
	 * file order, as if each had been tried */
	while (any < config->nhostless_routes || named < named_end) {
		size_t i;

		if (named == named_end || (any < config->nhostless_routes &&
		    config->hostless_routes[any] < config->host_routes[named].route))
			i = config->hostless_routes[any++];
		else
			i = config->host_routes[named++].route;
		if (route_takes(&config->routes[i], in, &host, &host_split))
			return &config->routes[i];
	}
	return NULL;
}

/* The byte of src[0..len) that starts at *i, percent-decoded ('+' is a
 * space); advances *i past it. */
static char
form_byte(const char *src, size_t len, size_t *i)
{
	char c = src[*i];

	if (c == '+')
		c = ' ';
	else if (c == '%' && *i + 2 < len && fmt_hexval(src[*i + 1]) >= 0 &&
	    fmt_hexval(src[*i + 2]) >= 0) {
		c = (char)(fmt_hexval(src[*i + 1]) * 16 + fmt_hexval(src[*i + 2]));
		*i += 2;
	}
	(*i)++;
	return c;
}

/* Does src[0..len), percent-decoded, spell name[0..nl)? */
static int
form_equals(const char *src, size_t len, const char *name, size_t nl)
{
	size_t i = 0, o = 0;

	while (i < len && o < nl)
		if (form_byte(src, len, &i) != name[o++])
			return 0;
	return i == len && o == nl;
}

/* Finds NAME=VALUE in a '&'-separated query and percent-decodes VALUE into
 * buf. Names are compared decoded, as the application will read them
 * ("us%65r" is "user"), and an empty value counts as absent, as it does for
 * every key source, so a later non-empty one is found. Returns the length,
 * or -1 when absent or empty. */
static long
query_lookup(const char *query, const char *name, char *buf, size_t size)
{
	size_t nl = strlen(name);
	const char *p = query;

	while (p && *p && *p != '#') {
		const char *end = p + strcspn(p, "&#");
		const char *eq = memchr(p, '=', (size_t)(end - p));

		if (eq != NULL && form_equals(p, (size_t)(eq - p), name, nl)) {
			size_t vl = (size_t)(end - eq - 1), i = 0, o = 0;

			while (i < vl && o < size - 1)
				buf[o++] = form_byte(eq + 1, vl, &i);
			buf[o] = '\0';
			if (o > 0)
				return (long)o;
		}
		p = *end == '&' ? end + 1 : NULL;
	}
	return -1;
}

/* Finds a cookie's value in a Cookie header (name=value; name2=value2). */
static int
cookie_lookup(const char *header, const char *name, const char **val, size_t *len)
{
	size_t nl = strlen(name);
	const char *p = header;

	while (p && *p) {
		const char *end;

		while (*p == ' ' || *p == '\t' || *p == ';')
			p++;
		end = p + strcspn(p, ";");
		if ((size_t)(end - p) > nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
			const char *v = p + nl + 1;
			size_t l = (size_t)(end - v);

			while (l > 0 && (v[l - 1] == ' ' || v[l - 1] == '\t'))
				l--;
			if (l >= 2 && v[0] == '"' && v[l - 1] == '"') {
				v++;
				l -= 2;
			}
			if (l > 0) {		/* empty counts as absent */
				*val = v;
				*len = l;
				return 0;
			}
		}
		p = *end ? end + 1 : NULL;
	}
	return -1;
}

int
policy_route_keys_by_ip(const struct route *route)
{
	for (size_t i = 0; i < route->nkeys; i++)
		if (route->keys[i].type == KEY_IP)
			return 1;
	return 0;
}

int
policy_route_keys_by_ip_alone(const struct route *route)
{
	return route->nkeys == 1 && route->keys[0].type == KEY_IP;
}

int
policy_route_mixes_ip(const struct route *route)
{
	return route->mixes_ip;
}

/*
 * On a route keyed by IP and by a value the client sends, an override key
 * that is an address is for the client with that address (compared in
 * canonical form), any other for a client sending that value: else anyone
 * could send "X-Api-Key: 10.9.9.9" and take the exemption of host
 * 10.9.9.9. On a route keyed by IP alone, an address is compared in
 * canonical form too; elsewhere an override key is matched as written.
 * So each override key has one form a client's address is compared with
 * (or none) and one a value is (or none); these fill the route's two
 * indexes.
 */
static const char *
override_form(const struct route *route, const struct override *o, size_t j,
    int from_ip)
{
	const char *canon = o->canon_ip ? o->canon_ip[j] : NULL;

	if (route->mixes_ip) {
		if ((canon != NULL) != from_ip)
			return NULL;
		return canon ? canon : o->keys[j];
	}
	return from_ip && canon ? canon : o->keys[j];
}

/* The index's order: by length, then bytes (what the search compares). */
static int
override_key_cmp(const struct override_index *e, const char *key, size_t len)
{
	if (e->len != len)
		return e->len < len ? -1 : 1;
	return memcmp(e->key, key, len);
}

static int
override_index_cmp(const void *a, const void *b)
{
	const struct override_index *x = a, *y = b;
	int c = override_key_cmp(x, y->key, y->len);

	if (c != 0)
		return c;
	return x->order < y->order ? -1 : x->order > y->order;
}

static void
override_index_build(const struct route *route, int from_ip,
    struct override_index **out, size_t *n)
{
	size_t total = 0, order = 0;

	for (size_t i = 0; i < route->noverrides; i++)
		total += route->overrides[i].nkeys;
	*out = xcalloc(total ? total : 1, sizeof(**out));
	*n = 0;
	for (size_t i = 0; i < route->noverrides; i++) {
		const struct override *o = &route->overrides[i];

		for (size_t j = 0; j < o->nkeys; j++, order++) {
			const char *form = override_form(route, o, j, from_ip);

			if (form == NULL)
				continue;
			(*out)[*n].key = form;
			(*out)[*n].len = strlen(form);
			(*out)[*n].override = o;
			(*out)[(*n)++].order = order;
		}
	}
	qsort(*out, *n, sizeof(**out), override_index_cmp);
	*out = xrealloc(*out, (*n ? *n : 1) * sizeof(**out));
}

/* By first address; of two that start together, the wider first */
static int
range_order(const void *a, const void *b)
{
	const struct addr_range *x = a, *y = b;
	int first = memcmp(x->first, y->first, sizeof(x->first));

	return first ? first : memcmp(y->last, x->last, sizeof(x->last));
}

/* config->trusted_ranges from trusted_proxies (see config.h) */
static void
prepare_trusted_ranges(struct config *config)
{
	for (int v6 = 0; v6 < 2; v6++) {
		struct addr_range *ranges;
		size_t n = 0, kept = 0, len = v6 ? 16 : 4;

		free(config->trusted_ranges[v6]);
		ranges = xcalloc(config->ntrusted_proxies + 1, sizeof(*ranges));
		for (size_t i = 0; i < config->ntrusted_proxies; i++) {
			const struct cidr *c = &config->trusted_proxies[i];

			if ((c->family == AF_INET6) != v6)
				continue;
			memcpy(ranges[n].first, c->addr, len);
			memcpy(ranges[n].last, c->addr, len);
			config_addr_fill_past(ranges[n].first, len, c->bits, 0);
			config_addr_fill_past(ranges[n].last, len, c->bits, 1);
			n++;
		}
		qsort(ranges, n, sizeof(*ranges), range_order);
		/* CIDRs nest or stay apart: one that starts inside the range
		 * before it is inside it */
		for (size_t i = 0; i < n; i++)
			if (kept == 0 || memcmp(ranges[i].first,
			    ranges[kept - 1].last, len) > 0)
				ranges[kept++] = ranges[i];
		config->trusted_ranges[v6] = ranges;
		config->ntrusted_ranges[v6] = kept;
	}
}

static int
host_route_order(const void *a, const void *b)
{
	const struct host_route *x = a, *y = b;
	int c = host_name_cmp(x->name, x->namelen, y->name, y->namelen);

	if (c != 0)
		return c;
	return (x->route > y->route) - (x->route < y->route);
}

/* config->host_routes and hostless_routes (see config.h), once each
 * route's host_parts are set */
static void
prepare_route_index(struct config *config)
{
	size_t named = 0, any = 0;

	free(config->host_routes);
	free(config->hostless_routes);
	config->host_routes = xcalloc(config->nroutes + 1,
	    sizeof(*config->host_routes));
	config->hostless_routes = xcalloc(config->nroutes + 1,
	    sizeof(*config->hostless_routes));
	for (size_t i = 0; i < config->nroutes; i++) {
		const struct route *r = &config->routes[i];

		if (r->host && !r->host_parts.is_v6) {
			config->host_routes[named].name = r->host_parts.name;
			config->host_routes[named].namelen = r->host_parts.namelen;
			config->host_routes[named++].route = i;
		} else
			config->hostless_routes[any++] = i;
	}
	qsort(config->host_routes, named, sizeof(*config->host_routes),
	    host_route_order);
	config->nhost_routes = named;
	config->nhostless_routes = any;
}

void
policy_prepare(struct config *config)
{
	char canon[INET6_ADDRSTRLEN + 8];

	prepare_trusted_ranges(config);

	for (size_t i = 0; i < config->nroutes; i++) {
		struct route *r = &config->routes[i];
		int ip = 0, value = 0;

		for (size_t k = 0; k < r->nkeys; k++) {
			ip |= r->keys[k].type == KEY_IP;
			value |= r->keys[k].type == KEY_HEADER ||
			    r->keys[k].type == KEY_QUERY ||
			    r->keys[k].type == KEY_COOKIE;
		}
		r->mixes_ip = ip && value;
		if (r->host)
			route_host_parts(r->host, &r->host_parts);
		/* An address as an override key is compared in canonical
		 * form, as the client IP is written: "2001:DB8::1" is
		 * 2001:db8::1's exemption. */
		for (size_t j = 0; ip && j < r->noverrides; j++) {
			struct override *o = &r->overrides[j];

			o->canon_ip = xcalloc(o->nkeys, sizeof(*o->canon_ip));
			for (size_t k = 0; k < o->nkeys; k++)
				if (policy_canonical_ip(config->client_ipv6_prefix,
				    o->keys[k], strlen(o->keys[k]), canon,
				    sizeof(canon)) == 0)
					o->canon_ip[k] = xstrdup(canon);
		}
		/* Only the indexes a client key of this route can look in: a
		 * million keys take 32 MB an index. On a route keyed by ip
		 * alone a value's key (one /v1/check names that is no
		 * address) looks in the address index, which holds every
		 * key that is no address as written (policy_limits). */
		free(r->by_ip);
		free(r->by_value);
		r->by_ip = r->by_value = NULL;
		r->nby_ip = r->nby_value = 0;
		if (ip)
			override_index_build(r, 1, &r->by_ip, &r->nby_ip);
		if (!policy_route_keys_by_ip_alone(r))
			override_index_build(r, 0, &r->by_value, &r->nby_value);
	}
	prepare_route_index(config);
}

int
policy_client_key(const struct route *route, const struct check_input *in,
    char *buf, size_t size, const char **key, size_t *keylen)
{
	for (size_t i = 0; i < route->nkeys; i++) {
		const struct key_source *ks = &route->keys[i];
		const char *v;
		long n;

		switch (ks->type) {
		case KEY_IP:
			if (in->ip && *in->ip) {
				*key = in->ip;
				*keylen = strlen(in->ip);
				return POLICY_KEY_IP;
			}
			break;
		case KEY_GLOBAL:
			*key = "*";
			*keylen = 1;
			return POLICY_KEY_GLOBAL;
		case KEY_HEADER:
			/* the first line with a value: an empty one is absent */
			for (unsigned nth = 0; (v = in->header(in->header_ctx,
			    ks->name, nth)) != NULL; nth++) {
				size_t l;

				while (*v == ' ' || *v == '\t')
					v++;
				l = strlen(v);
				while (l > 0 && (v[l - 1] == ' ' || v[l - 1] == '\t'))
					l--;
				if (l > 0) {
					*key = v;
					*keylen = l;
					return POLICY_KEY_VALUE;
				}
			}
			break;
		case KEY_QUERY:
			if (in->query && (n = query_lookup(in->query, ks->name, buf,
			    size)) > 0) {
				*key = buf;
				*keylen = (size_t)n;
				return POLICY_KEY_VALUE;
			}
			break;
		case KEY_COOKIE:
			/* A client speaking HTTP/2 may send its cookies as
			 * several fields, which a gateway can pass on as
			 * several Cookie lines (RFC 9113 8.2.3). */
			for (unsigned nth = 0; (v = in->header(in->header_ctx,
			    "Cookie", nth)) != NULL; nth++)
				if (cookie_lookup(v, ks->name, key, keylen) == 0)
					return POLICY_KEY_VALUE;
			break;
		}
	}
	return POLICY_KEY_NONE;
}

const struct limit_set *
policy_limits(const struct route *route, const char *key, size_t keylen,
    int from_ip)
{
	/* A route keyed by ip alone has no value index: see policy_prepare. */
	int by_ip = from_ip || route->by_value == NULL;
	const struct override_index *idx = by_ip ? route->by_ip : route->by_value;
	size_t lo = 0, n = by_ip ? route->nby_ip : route->nby_value, hi = n;

	/* A prepared route has at least one index, empty or not. */
	if (route->by_ip == NULL && route->by_value == NULL)
		fatalx("policy_limits: route %s was not prepared", route->name);

	/* The first entry of this key (sorted by place after the key): the
	 * loader refuses a key listed twice, but the file's order decides
	 * whatever it lets through. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (override_key_cmp(&idx[mid], key, keylen) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < n && override_key_cmp(&idx[lo], key, keylen) == 0)
		return &idx[lo].override->set;
	return &route->limits;
}

/* The ":port" a proxy may write after an address: one to five digits. */
static int
port_suffix_ok(const char *p, size_t len)
{
	if (len == 0)
		return 1;
	if (p[0] != ':' || len < 2 || len > 6)
		return 0;
	for (size_t i = 1; i < len; i++)
		if (p[i] < '0' || p[i] > '9')
			return 0;
	return 1;
}

/* Parses an IP literal (optionally [v6] or with a v4 :port) into family and
 * bytes. */
static int
parse_ip(const char *s, size_t len, int *family, unsigned char addr[16])
{
	char buf[INET6_ADDRSTRLEN + 8];

	while (len > 0 && (*s == ' ' || *s == '\t')) {
		s++;
		len--;
	}
	while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t'))
		len--;
	/* inet_pton would stop at a NUL and take "10.0.0.1\0x" for an
	 * address; a key named in /v1/check can carry one. */
	if (len == 0 || len >= sizeof(buf) || memchr(s, '\0', len))
		return -1;
	if (s[0] == '[') {
		const char *close = memchr(s, ']', len);

		if (close == NULL || !port_suffix_ok(close + 1, len - (size_t)(close + 1 - s)))
			return -1;
		len = (size_t)(close - s - 1);
		s++;
	}
	memcpy(buf, s, len);
	buf[len] = '\0';
	if (inet_pton(AF_INET6, buf, addr) == 1) {
		/* v4-mapped v6 is the v4 client, as a dual-stack socket reports it */
		static const unsigned char mapped[12] = { 0,0,0,0,0,0,0,0,0,0,0xff,0xff };

		if (memcmp(addr, mapped, 12) == 0) {
			memmove(addr, addr + 12, 4);
			*family = AF_INET;
		} else
			*family = AF_INET6;
		return 0;
	}
	/* "1.2.3.4:5678" as some proxies write it */
	char *colon = strchr(buf, ':');
	if (colon) {
		if (!port_suffix_ok(colon, strlen(colon)))
			return -1;
		*colon = '\0';
	}
	if (inet_pton(AF_INET, buf, addr) == 1) {
		*family = AF_INET;
		return 0;
	}
	return -1;
}

/*
 * Is this IPv6 address one host whatever its low bits say: an IPv4 host
 * written in IPv6 (v4-compatible, SIIT's ::ffff:0:0:0/96, NAT64's
 * 64:ff9b::/96 and local-use 64:ff9b:1::/48, where a /64 would be every
 * IPv4 client of the translator), ::, ::1, or a link-local address
 * (every host of a link shares fe80::/64)?
 */
static int
whole_ipv6_host(const unsigned char a[16])
{
	static const unsigned char zero[12], siit[12] = { [8] = 0xff, [9] = 0xff },
	    wkp[12] = { 0, 0x64, 0xff, 0x9b }, local[6] = { 0, 0x64, 0xff, 0x9b, 0, 1 };

	return memcmp(a, zero, 12) == 0 || memcmp(a, siit, 12) == 0 ||
	    memcmp(a, wkp, 12) == 0 || memcmp(a, local, 6) == 0 ||
	    (a[0] == 0xfe && (a[1] & 0xc0) == 0x80);
}

/* An IPv6 network as a client is written: its address cut to `bits`,
 * then "/bits". */
static int
network_form(int bits, unsigned char addr[16], char *out, size_t size)
{
	size_t len;

	config_addr_fill_past(addr, 16, bits, 0);
	if (inet_ntop(AF_INET6, addr, out, (socklen_t)size) == NULL)
		return -1;
	len = strlen(out);
	return (size_t)snprintf(out + len, size - len, "/%d", bits) <
	    size - len ? 0 : -1;
}

/* An address as the text that names its client: canonical, and an IPv6
 * one cut to its first ipv6_prefix bits with "/N" after it when that is
 * under 128 (one host's /64 is otherwise 2^64 clients, each with a fresh
 * quota). IPv4, v4-mapped IPv6 included, and the IPv6 addresses that are
 * one host whatever their low bits (whole_ipv6_host) are always the
 * whole address. */
static int
client_form(int ipv6_prefix, int family, unsigned char addr[16], char *out,
    size_t size)
{
	if (family != AF_INET6 || ipv6_prefix >= 128 || whole_ipv6_host(addr))
		return inet_ntop(family, addr, out, (socklen_t)size) ? 0 : -1;
	return network_form(ipv6_prefix, addr, out, size);
}

int
policy_canonical_ip(int ipv6_prefix, const char *s, size_t len, char *out,
    size_t size)
{
	unsigned char addr[16];
	const char *slash;
	int family;

	/* Spaces around it, as parse_ip allows around an address. */
	while (len > 0 && (*s == ' ' || *s == '\t')) {
		s++;
		len--;
	}
	while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t'))
		len--;
	/* "2001:db8:1:2::/64" is how such a client is written (in replies,
	 * logs, an override key), and so names it too; another length names
	 * no client, nor does a network whose addresses are all clients
	 * whole (fe80::/64). ::/64 does name the clients of it outside
	 * ::/96. */
	if (ipv6_prefix < 128 && (slash = memchr(s, '/', len)) != NULL) {
		size_t n = len - (size_t)(slash - s) - 1, alen = (size_t)(slash - s);
		int bits = 0;

		if (n == 0 || n > 3 || slash[1] == '0')
			return -1;
		for (size_t i = 1; i <= n; i++) {
			if (slash[i] < '0' || slash[i] > '9')
				return -1;
			bits = bits * 10 + (slash[i] - '0');
		}
		while (alen > 0 && (s[alen - 1] == ' ' || s[alen - 1] == '\t'))
			alen--;
		/* Not parse_ip: it reads ::ffff:1.2.3.4 as IPv4, and as a
		 * network it is ::/N. */
		if (bits != ipv6_prefix || !ipv6_from_text(s, alen, addr))
			return -1;
		if (whole_ipv6_host(addr)) {
			unsigned char last[16];

			memcpy(last, addr, sizeof(last));
			config_addr_fill_past(last, sizeof(last), bits, 1);
			if (whole_ipv6_host(last))
				return -1;
		}
		return network_form(ipv6_prefix, addr, out, size);
	}
	if (parse_ip(s, len, &family, addr) == -1)
		return -1;
	return client_form(ipv6_prefix, family, addr, out, size);
}

static int
trusted(const struct config *config, int family, const unsigned char *addr)
{
	int v6 = family == AF_INET6;
	const struct addr_range *ranges = config->trusted_ranges[v6];
	size_t lo = 0, hi = config->ntrusted_ranges[v6], len = v6 ? 16 : 4;

	/* the last range that starts at or before addr is the only one
	 * that can hold it */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (memcmp(ranges[mid].first, addr, len) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo > 0 && memcmp(addr, ranges[lo - 1].last, len) <= 0;
}

int
policy_client_ip(const struct config *config, const char *peer,
    const char *forwarded_for, const char *real_ip, char *out, size_t size)
{
	unsigned char addr[16], best_addr[16];
	int family, best_family = AF_INET;
	int found = 0;

	if (peer != NULL) {
		if (parse_ip(peer, strlen(peer), &family, addr) == -1) {
			snprintf(out, size, "unix");
			return -1;
		}
		best_family = family;
		memcpy(best_addr, addr, sizeof(addr));
		found = 1;
		if (!trusted(config, family, addr))
			goto done;
	}
	/* A list of empty elements only ("X-Forwarded-For: ,") is no list */
	if (forwarded_for && forwarded_for[strspn(forwarded_for, " \t,")] != '\0') {
		const char *end = forwarded_for + strlen(forwarded_for);

		/* Right to left: the first hop we do not trust is the client. */
		while (end > forwarded_for) {
			const char *start = end, *p;

			while (start > forwarded_for && start[-1] != ',')
				start--;
			p = start;
			while (p < end && (*p == ' ' || *p == '\t'))
				p++;
			if (p == end) {
				/* An empty list element ("a,,b", "a, "): RFC 9110
				 * 5.6.1 has recipients ignore it, not the list. */
				end = start > forwarded_for ? start - 1 : start;
				continue;
			}
			if (parse_ip(start, (size_t)(end - start), &family, addr) == -1)
				break;	/* garbage: stop at the last good hop */
			best_family = family;
			memcpy(best_addr, addr, sizeof(addr));
			found = 1;
			if (!trusted(config, family, addr))
				break;
			end = start > forwarded_for ? start - 1 : start;
		}
	} else if (real_ip && parse_ip(real_ip, strlen(real_ip), &family, addr) == 0) {
		best_family = family;
		memcpy(best_addr, addr, sizeof(addr));
		found = 1;
	}
done:
	if (!found) {
		snprintf(out, size, "unix");
		return -1;
	}
	client_form(config->client_ipv6_prefix, best_family, best_addr, out, size);
	return 0;
}
