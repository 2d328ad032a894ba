/*
 * Unit tests for the pure modules: durations and rates, the policy loader
 * and its error positions, path normalization, route and key resolution,
 * client IP, Redis key encoding, reply parsing and header values, and the
 * deny cache, chunked bodies. A {name, fn} table; the last line is "N passed, N failed".
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <sys/socket.h>

#include <hiredis/hiredis.h>
#include <jansson.h>

#include "chunked.h"
#include "config.h"
#include "denycache.h"
#include "duration.h"
#include "fmt.h"
#include "jsonout.h"
#include "limiter.h"
#include "policy.h"
#include "rxcheck.h"
#include "sha256.h"
#include "siphash.h"

static int failures;

#define CHECK(cond) do {						\
	if (!(cond)) {							\
		fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
		failures++;						\
	}								\
} while (0)
#define CHECK_STR(a, b) do {						\
	const char *a_ = (a), *b_ = (b);				\
	if (a_ == NULL || b_ == NULL || strcmp(a_, b_) != 0) {		\
		fprintf(stderr, "  %s:%d: \"%s\" != \"%s\"\n", __FILE__, __LINE__, \
		    a_ ? a_ : "(null)", b_ ? b_ : "(null)");		\
		failures++;						\
	}								\
} while (0)

static char tmpdir[] = "/tmp/ratelimitd-unit-XXXXXX";
static char name_burst[] = "burst", name_hourly[] = "hourly";

/* Writes text to a temp policy file and returns its path (static buffer). */
static const char *
write_policy(const char *text)
{
	static char path[256];
	static int n;
	FILE *fp;

	snprintf(path, sizeof(path), "%s/p%d.yaml", tmpdir, n++);
	fp = fopen(path, "w");
	fputs(text, fp);
	fclose(fp);
	return path;
}

static struct config *
load(const char *text, struct config_errors *errors)
{
	return config_load(write_policy(text), errors);
}

/* Loads text expecting failure; returns the number of errors. */
static size_t
load_errors(const char *text, struct config_errors *errors)
{
	struct config *c = load(text, errors);

	CHECK(c == NULL);
	config_unref(c);
	return errors->n;
}

/* The next of a fixed sequence (a 64-bit LCG): random cases that replay. */
static void
next_seed(unsigned long long *seed)
{
	*seed = *seed * 6364136223846793005ULL + 1442695040888963407ULL;
}

/* Loads text expecting success, ready for policy_match; NULL, a failed
 * CHECK, when it does not load. */
static struct config *
load_prepared(const char *text)
{
	struct config_errors e;
	struct config *c = load(text, &e);

	CHECK(c != NULL);
	for (size_t i = 0; c == NULL && i < e.n; i++)
		fprintf(stderr, "    %s\n", e.lines[i]);
	if (c != NULL)
		policy_prepare(c);
	return c;
}

static int
has_error(const struct config_errors *e, const char *pos, const char *needle)
{
	for (size_t i = 0; i < e->n; i++) {
		const char *colon = strstr(e->lines[i], ".yaml:");

		if (colon && strncmp(colon + 6, pos, strlen(pos)) == 0 &&
		    strstr(e->lines[i], needle))
			return 1;
	}
	for (size_t i = 0; i < e->n; i++)
		fprintf(stderr, "    got: %s\n", e->lines[i]);
	return 0;
}

static void
test_durations(void)
{
	long long us, n, p;
	const char *cause;
	char buf[64];

	CHECK(duration_parse("250ms", &us, &cause) == 0 && us == 250000);
	CHECK(duration_parse("1s", &us, &cause) == 0 && us == 1000000);
	CHECK(duration_parse("10m", &us, &cause) == 0 && us == 600000000);
	CHECK(duration_parse("1h", &us, &cause) == 0 && us == 3600000000LL);
	CHECK(duration_parse("2d", &us, &cause) == 0 && us == 172800000000LL);
	CHECK(duration_parse("10x", &us, &cause) == -1);
	CHECK(duration_parse("10", &us, &cause) == -1);
	CHECK(duration_parse("s", &us, &cause) == -1);
	CHECK(duration_parse("0s", &us, &cause) == -1);
	CHECK(duration_parse("-1s", &us, &cause) == -1);
	CHECK(duration_parse("1.5s", &us, &cause) == -1 &&
	    strstr(cause, "whole numbers") != NULL);
	CHECK(duration_parse(".5s", &us, &cause) == -1 &&
	    strstr(cause, "whole numbers") != NULL);
	CHECK(rate_parse("10/1.5s", &n, &p, &cause) == -1 &&
	    strstr(cause, "whole numbers") != NULL);
	CHECK(rate_parse("10/.5s", &n, &p, &cause) == -1 &&
	    strstr(cause, "whole numbers") != NULL);
	CHECK(duration_parse("99999999999999999999d", &us, &cause) == -1);
	CHECK(rate_parse("10/s", &n, &p, &cause) == 0 && n == 10 && p == 1000000);
	CHECK(rate_parse("600/m", &n, &p, &cause) == 0 && n == 600 && p == 60000000);
	CHECK(rate_parse("5/10s", &n, &p, &cause) == 0 && n == 5 && p == 10000000);
	CHECK(rate_parse("1/250ms", &n, &p, &cause) == 0 && n == 1 && p == 250000);
	CHECK(rate_parse("10", &n, &p, &cause) == -1);
	CHECK(rate_parse("0/s", &n, &p, &cause) == -1);
	CHECK(rate_parse("/s", &n, &p, &cause) == -1);
	CHECK(rate_parse("10/x", &n, &p, &cause) == -1);
	CHECK(rate_parse("a/s", &n, &p, &cause) == -1);
	/* The cause names the mistake, not just "unknown unit". */
	CHECK(duration_parse("1 s", &us, &cause) == -1 &&
	    strcmp(cause, "no space between a duration's number and its unit: "
	    "1s, not 1 s") == 0);
	CHECK(duration_parse("1M", &us, &cause) == -1 &&
	    strcmp(cause, "units are lower case: ms, s, m (minutes), h or d") == 0);
	CHECK(rate_parse("10/S", &n, &p, &cause) == -1 &&
	    strcmp(cause, "units are lower case: ms, s, m (minutes), h or d") == 0);
	CHECK(rate_parse("10/", &n, &p, &cause) == -1 &&
	    strcmp(cause, "rate needs a period after its \"/\": \"10/s\" or "
	    "\"5/10s\"") == 0);
	CHECK(rate_parse("10/s/2", &n, &p, &cause) == -1 &&
	    strcmp(cause, "a rate has one \"/\": \"10/s\" or \"5/10s\"") == 0);
	CHECK(rate_parse("10 / s", &n, &p, &cause) == -1 &&
	    strcmp(cause, "no space before a rate's \"/\": \"10/s\"") == 0);
	CHECK(rate_parse("10r/s", &n, &p, &cause) == -1 &&
	    strcmp(cause, "a rate has no r: nginx's 10r/s is \"10/s\" "
	    "here") == 0);
	CHECK(rate_parse("10x/s", &n, &p, &cause) == -1 &&
	    strcmp(cause, "rate count must be an integer from 1 to 10^12") == 0);
	CHECK(rate_parse("10/ s", &n, &p, &cause) == -1 &&
	    strcmp(cause, "no space after a rate's \"/\": \"10/s\"") == 0);
	CHECK(rate_parse("10/min", &n, &p, &cause) == -1 &&
	    strcmp(cause, "units are ms, s, m, h or d: m for minutes") == 0);
	CHECK(duration_parse("2Days", &us, &cause) == -1 &&
	    strcmp(cause, "units are ms, s, m, h or d: d for days") == 0);
	/* Not the unit's fault (an audit saw "unknown duration unit"). */
	for (const char *const *d = (const char *const[]){ "0x10s", "1e3ms",
	    NULL }; *d; d++)
		CHECK(duration_parse(*d, &us, &cause) == -1 &&
		    strcmp(cause, "a duration is one decimal number and one "
		    "unit: 90m, not 1h30m; 1000ms, not 1e3ms") == 0);
	/* A sum is answered with what it adds up to (a canned "90m, not
	 * 1h30m" answered 1m30s, where 90s was right). */
	CHECK(duration_parse("1m30s", &us, &cause) == -1 &&
	    strcmp(cause, "a duration is one number and one unit: 90s, not "
	    "1m30s") == 0);
	CHECK(duration_parse("1h30m", &us, &cause) == -1 &&
	    strcmp(cause, "a duration is one number and one unit: 90m, not "
	    "1h30m") == 0);
	CHECK(duration_parse("1d1h", &us, &cause) == -1 &&
	    strstr(cause, ": 25h, not 1d1h") != NULL);
	CHECK(duration_parse("1s500ms", &us, &cause) == -1 &&
	    strstr(cause, ": 1500ms, not 1s500ms") != NULL);
	CHECK(duration_parse("366d1h", &us, &cause) == -1 &&
	    strstr(cause, "one decimal number") != NULL);	/* past the cap */
	CHECK(duration_parse("1_000ms", &us, &cause) == -1 &&
	    strcmp(cause, "a duration's number has no separators: 1000ms, "
	    "not 1_000ms") == 0);
	CHECK(duration_parse("1,000ms", &us, &cause) == -1 &&
	    strstr(cause, "no separators") != NULL);
	CHECK(duration_parse("1,5s", &us, &cause) == -1 &&
	    duration_cause_is_fraction(cause));	/* a decimal comma */
	CHECK(rate_parse("10/1h30m", &n, &p, &cause) == -1 &&
	    strstr(cause, "not 1h30m") != NULL);
	CHECK(rate_parse("10/-1s", &n, &p, &cause) == -1 &&
	    strcmp(cause, "a rate's period is a duration with no sign: "
	    "\"5/10s\"") == 0);
	CHECK(rate_parse("10/+s", &n, &p, &cause) == -1 &&
	    strstr(cause, "no sign") != NULL);
	CHECK(duration_parse("30sec", &us, &cause) == -1 &&
	    strcmp(cause, "units are ms, s, m, h or d: s for seconds") == 0);
	CHECK(rate_parse("10/fortnight", &n, &p, &cause) == -1 &&
	    strcmp(cause, "unknown rate unit (use ms, s, m, h or d)") == 0);
	CHECK(duration_parse("1.5s", &us, &cause) == -1 &&
	    duration_cause_is_fraction(cause));
	CHECK(strcmp(duration_fraction_advice(buf, sizeof(buf), "1.5s", -1),
	    "; write 1500ms") == 0);
	CHECK(strcmp(duration_fraction_advice(buf, sizeof(buf), "0.5m", 10),
	    "; write \"10/30s\"") == 0);
	CHECK(strcmp(duration_fraction_advice(buf, sizeof(buf), "0.0001s", -1),
	    ", and 1ms is the smallest") == 0);
}

/* The largest unit that states a duration whole, as /v1/policy shows it. */
static void
test_duration_format(void)
{
	static const struct {
		long long us;
		const char *text;
	} cases[] = {
		{ 0, "0s" }, { 1000, "1ms" }, { 1500000, "1500ms" },
		{ 60000000, "1m" }, { 90000000, "90s" }, { 3600000000LL, "1h" },
		{ 86400000000LL, "1d" }, { 100100, "100.1ms" }, { 250, "0.25ms" },
		{ DURATION_MAX_US, "366d" },
	};
	char buf[DURATION_TEXT_SIZE], small[8];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int rc = duration_format(cases[i].us, buf, sizeof(buf));

		if (rc != 0 || strcmp(buf, cases[i].text) != 0)
			fprintf(stderr, "    %lld us: got %d %s, want %s\n", cases[i].us,
			    rc, buf, cases[i].text);
		CHECK(rc == 0 && strcmp(buf, cases[i].text) == 0);
		/* exactly its size fits; one byte less is refused, not cut
		 * ("1ms" would read "1m") */
		size_t need = strlen(cases[i].text) + 1;
		CHECK(duration_format(cases[i].us, buf, need) == 0 &&
		    strcmp(buf, cases[i].text) == 0);
		CHECK(duration_format(cases[i].us, buf, need - 1) == -1 && buf[0] == '\0');
	}
	CHECK(duration_format(100001, small, sizeof(small)) == -1 && small[0] == '\0');
	CHECK(duration_format(1000, small, 0) == -1);
}

static void
test_cidr(void)
{
	struct cidr c;

	CHECK(config_parse_cidr("10.0.0.0/8", &c) == 0 && c.bits == 8);
	CHECK(config_parse_cidr("127.0.0.1", &c) == 0 && c.bits == 32);
	CHECK(config_parse_cidr("::1/128", &c) == 0 && c.bits == 128);
	CHECK(config_parse_cidr("10.0.0.0/33", &c) == -1);
	CHECK(config_parse_cidr("nope", &c) == -1);
	CHECK(config_parse_cidr("10.0.0.0/", &c) == -1);
	/* IPv4-mapped ranges name IPv4 peers, which is how they are read. */
	CHECK(config_parse_cidr("::ffff:10.1.0.0/112", &c) == 0 &&
	    c.family == AF_INET && c.bits == 16 &&
	    memcmp(c.addr, "\x0a\x01\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 16) == 0);
	CHECK(config_parse_cidr("::ffff:127.0.0.1", &c) == 0 &&
	    c.family == AF_INET && c.bits == 32);
	CHECK(config_parse_cidr("::ffff:0:0/96", &c) == 0 &&
	    c.family == AF_INET && c.bits == 0);
	CHECK(config_parse_cidr("::ffff:0:0/95", &c) == 0 && c.family == AF_INET6);
	CHECK(config_parse_cidr("::1:ffff:0:0/112", &c) == 0 && c.family == AF_INET6);
}

static const char *good_policy =
    "server:\n"
    "  listen: 127.0.0.1:8080\n"
    "  workers: 2\n"
    "  ietf_headers: true\n"
    "redis:\n"
    "  address: 127.0.0.1:6379\n"
    "  username: ~\n"
    "  timeout: 50ms\n"
    "failure_mode: open\n"
    "trusted_proxies: [127.0.0.1/32, 10.0.0.0/8]\n"
    "routes:\n"
    "  - name: login\n"
    "    match: { path: /auth/login, methods: [post] }\n"
    "    key: ip\n"
    "    limits:\n"
    "      - { name: per-minute, algorithm: sliding_window_log, limit: 5, window: 1m }\n"
    "  - name: api\n"
    "    match: { prefix: /api/, host: API.example.com }\n"
    "    key: [header:X-Api-Key, query:key, cookie:sid, ip]\n"
    "    deny_status: 403\n"
    "    failure_mode: closed\n"
    "    limits:\n"
    "      - { algorithm: token_bucket, rate: \"10/s\", burst: 20 }\n"
    "      - { algorithm: token_bucket, rate: \"1/s\", burst: 5 }\n"
    "      - { name: hourly, algorithm: fixed_window, limit: 1000, window: 1h }\n"
    "    overrides:\n"
    "      - { keys: [partner-1], limits: [ { algorithm: gcra, rate: \"100/s\", burst: 50 } ] }\n"
    "      - { keys: [internal, 10.9.9.9, \"2001:DB8:0::1\"], unlimited: true }\n"
    "  - name: versioned\n"
    "    match: { regex: '^/v[0-9]+/' }\n"
    "    key: global\n"
    "    limits:\n"
    "      - { algorithm: sliding_window_counter, limit: 100, window: 1m }\n"
    "      - { algorithm: leaky_bucket, rate: \"5/s\", burst: 10, delay: false }\n"
    "  - name: default\n"
    "    match: { prefix: / }\n"
    "    shadow: true\n"
    "    limits:\n"
    "      - { algorithm: fixed_window, limit: 100, window: 1m }\n";

static void
test_config_good(void)
{
	struct config_errors e;
	struct config *c = load(good_policy, &e);
	const struct route *api;

	CHECK(c != NULL);
	if (c == NULL) {
		for (size_t i = 0; i < e.n; i++)
			fprintf(stderr, "    %s\n", e.lines[i]);
		config_errors_free(&e);
		return;
	}
	CHECK(c->workers == 2 && c->ietf_headers == 1 && c->nroutes == 4);
	CHECK(c->redis_timeout_us == 50000 && c->redis_username == NULL);
	CHECK(c->ntrusted_proxies == 2);
	api = &c->routes[1];
	CHECK_STR(api->limits.limits[0].name, "token_bucket");
	CHECK_STR(api->limits.limits[1].name, "token_bucket-2");
	CHECK(api->limits.max_quota == 1000);
	CHECK(api->deny_status == 403 && api->failure_mode == FAILURE_MODE_CLOSED);
	CHECK_STR(api->host, "api.example.com");
	CHECK(api->nkeys == 4 && api->keys[1].type == KEY_QUERY);
	CHECK(api->noverrides == 2 && api->overrides[1].set.unlimited);
	CHECK_STR(c->routes[0].methods[0], "POST");
	CHECK(c->routes[2].limits.limits[0].precision_us == 6000000);
	CHECK(c->routes[2].limits.limits[1].delay == 0);
	CHECK(c->routes[3].shadow && c->routes[3].keys[0].type == KEY_IP);
	CHECK(config_limit_window_seconds(&api->limits.limits[0]) == 2);
	CHECK(config_route_deny_status(c, &c->routes[0]) == 429);
	config_unref(c);
}

static void
test_config_errors(void)
{
	struct config_errors e;

	/* unknown key, bad duration, bad rate: all three reported */
	CHECK(load_errors(
	    "server:\n"
	    "  listen: 127.0.0.1:8080\n"
	    "  bogus: 1\n"
	    "redis:\n"
	    "  timeout: 10x\n"
	    "routes:\n"
	    "  - name: a\n"
	    "    limits:\n"
	    "      - { algorithm: token_bucket, rate: \"ten/s\", burst: 1 }\n", &e) == 3);
	CHECK(has_error(&e, "3:3:", "unknown key \"bogus\""));
	CHECK(has_error(&e, "5:12:", "10x"));
	CHECK(has_error(&e, "9:42:", "rate"));
	config_errors_free(&e);

	CHECK(load_errors("routes:\n  - name: a\n    limits: []\n"
	    "  - name: a\n    limits: [ { algorithm: fixed_window, limit: 1, window: 1s } ]\n",
	    &e) == 2);
	CHECK(has_error(&e, "3:13:", "must not be empty"));
	CHECK(has_error(&e, "4:11:", "duplicate route name"));
	config_errors_free(&e);

	CHECK(load_errors("routes:\n  - name: a\n    match: { regex: '(' }\n"
	    "    limits: [ { algorithm: fixed_window, limit: 1, window: 1s } ]\n", &e) >= 1);
	CHECK(has_error(&e, "3:21:", "regex"));
	config_errors_free(&e);

	/* one limit too many is said, and the first 16 still checked */
	{
		char text[4096];
		size_t n = (size_t)snprintf(text, sizeof(text),
		    "routes:\n  - name: a\n    limits:\n"
		    "      - { algorithm: fixed_window, limit: 1, window: 1x }\n");

		for (int i = 1; i < 17; i++)
			n += (size_t)snprintf(text + n, sizeof(text) - n,
			    "      - { name: l%d, algorithm: fixed_window, limit: 1, "
			    "window: 1s }\n", i);
		CHECK(load_errors(text, &e) == 2);
		CHECK(has_error(&e, "4:", "unknown duration unit"));
		CHECK(has_error(&e, "20:", "limits[16]: one too many"));
		config_errors_free(&e);
	}

	/* an anchor or tag is refused, and the rest still checked */
	CHECK(load_errors("server: &a { listen: 1 }\nroutes: []\n", &e) == 2);
	CHECK(has_error(&e, "1:9:", "the anchor &a: anchors"));
	CHECK(has_error(&e, "1:22:", "host:port"));
	config_errors_free(&e);
	CHECK(load_errors("routes:\n  - name: a\n    limt: 1\n"
	    "    limits: [ { algorithm: fixed_window, limit: !!int 1, window: 1s } ]\n",
	    &e) == 2);
	CHECK(has_error(&e, "3:5:", "unknown key \"limt\""));
	CHECK(has_error(&e, "4:49:", "the tag !!int: tags"));
	config_errors_free(&e);

	CHECK(load_errors("server:\n  listen: [oops\n", &e) == 1);
	CHECK(has_error(&e, "", "YAML syntax error"));
	config_errors_free(&e);

	CHECK(load_errors("server: { listen: nohost }\nroutes: []\n", &e) == 1);
	CHECK(has_error(&e, "1:19:", "host:port"));
	config_errors_free(&e);

	CHECK(load_errors("server: {}\n", &e) == 1);
	CHECK(has_error(&e, "1:1:", "\"routes\" is required"));
	config_errors_free(&e);

	CHECK(load_errors("routes:\n  - name: a\n    limits:\n"
	    "      - { algorithm: fixed_window, limit: 1, window: 1s, rate: \"1/s\" }\n"
	    "      - { algorithm: gcra, burst: 1 }\n"
	    "      - { algorithm: nope }\n", &e) == 3);
	CHECK(has_error(&e, "4:", "not a parameter of fixed_window"));
	CHECK(has_error(&e, "5:", "requires \"rate\""));
	CHECK(has_error(&e, "6:", "is not one of"));
	config_errors_free(&e);

	CHECK(load_errors("routes:\n  - name: a\n    key: \"header:\"\n"
	    "    limits: [ { algorithm: fixed_window, limit: 0, window: 1s } ]\n", &e) == 2);
	config_errors_free(&e);

	/* an invalid name is quoted with its own quotes and backslashes escaped */
	CHECK(load_errors("routes:\n  - name: 'a\"b\\c'\n"
	    "    limits: [ { algorithm: fixed_window, limit: 1, window: 1s } ]\n", &e) == 1);
	CHECK(has_error(&e, "2:11:", "\"a\\\"b\\\\c\" must be"));
	config_errors_free(&e);

	CHECK(load_errors("--- {routes: []}\n--- {routes: []}\n", &e) == 1);
	CHECK(has_error(&e, "2:1:", "only one YAML document"));
	config_errors_free(&e);
	/* the first document is still checked */
	CHECK(load_errors("--- {routes: [], bogus: 1}\n--- {routes: []}\n", &e) == 2);
	CHECK(has_error(&e, "1:18:", "unknown key \"bogus\""));
	config_errors_free(&e);

	CHECK(load_errors("", &e) == 1);
	config_errors_free(&e);
}

static void
test_normalize(void)
{
	/* uri, the normalized path, the query (NULL: none) */
	static const struct { const char *uri, *path, *query; } cases[] = {
		{ "/api/users?id=1", "/api/users", "id=1" },
		{ "//api///x", "/api/x", NULL },
		{ "/a/./b/../c", "/a/c", NULL },
		{ "/../../etc", "/etc", NULL },
		{ "/auth/%6Cogin", "/auth/login", NULL },
		/* %2F is a slash, as nginx decodes it before choosing a location */
		{ "/auth%2Flogin", "/auth/login", NULL },
		{ "/x/..%2Fauth/login", "/auth/login", NULL },
		{ "/api/..%2F..%2Fk/x", "/k/x", NULL },
		{ "/a%2f%2F/b", "/a/b", NULL },
		{ "/a%00b", "/a%00b", NULL },
		{ "", "/", NULL },
		{ "?x=1", "/", "x=1" },
		{ "http://h.example/p?q", "/p", "q" },
		/* the authority ends at '?': a '/' in the query is not the path */
		{ "http://h?u=/admin", "/", "u=/admin" },
		{ "/a/..", "/", NULL },
		{ "/a/b/.", "/a/b/", NULL },
	};
	char buf[256];
	const char *q;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		policy_normalize_uri(cases[i].uri, buf, sizeof(buf), &q);
		CHECK_STR(buf, cases[i].path);
		if (cases[i].query)
			CHECK(q && strcmp(q, cases[i].query) == 0);
		else
			CHECK(q == NULL);
	}
}

static void
test_authority_and_host_cover(void)
{
	/* uri, its authority (NULL: none) */
	static const struct { const char *uri, *authority; } cases[] = {
		{ "http://api.example.com/x", "api.example.com" },
		{ "HTTPS://API.example.com:8443?q=/x", "API.example.com:8443" },
		{ "http://user:pw@h@api.example.com#f", "api.example.com" },
		{ "http://[::1]:8080/", "[::1]:8080" },
		{ "http:///x", NULL },
		{ "http://", NULL },
		{ "/check/x", NULL },
		{ "//api.example.com/x", NULL },	/* a path, to HTTP */
		{ "ftp://api.example.com/x", NULL },
	};
	/* a route's host, a later route's, does the first take all of its */
	static const struct { const char *a, *b; int covers; } covers[] = {
		{ "api.example.com", "API.example.com.", 1 },
		{ "[2001:db8:0::1]", "2001:db8::1", 1 },
		{ "api.example.com", "api.example.com:443", 1 },
		{ "api.example.com:443", "api.example.com", 0 },
		{ "api.example.com:443", "api.example.com:443", 1 },
		{ "api.example.com:443", "api.example.com:8443", 0 },
		{ "a.example.com", "b.example.com", 0 },
	};
	char buf[64], tiny[5];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *got = policy_uri_authority(cases[i].uri, buf, sizeof(buf));

		if (cases[i].authority)
			CHECK(got == buf && strcmp(got, cases[i].authority) == 0);
		else
			CHECK(got == NULL);
	}
	/* cut to the buffer, never past it */
	CHECK(policy_uri_authority("http://api.example.com/", tiny, sizeof(tiny)) ==
	    tiny && strcmp(tiny, "api.") == 0);
	for (size_t i = 0; i < sizeof(covers) / sizeof(covers[0]); i++)
		CHECK(policy_host_covers(covers[i].a, covers[i].b) == covers[i].covers);
}

struct fake_headers {
	const char *names[4], *values[4];
};

static const char *
fake_lookup(void *ctx, const char *name, unsigned nth)
{
	struct fake_headers *h = ctx;

	for (int i = 0; i < 4 && h->names[i]; i++)
		if (strcasecmp(h->names[i], name) == 0 && nth-- == 0)
			return h->values[i];
	return NULL;
}

static void
test_routes_and_keys(void)
{
	struct config *c = load_prepared(good_policy);
	struct fake_headers h = { { "X-Api-Key", "Cookie" }, { "  k1 ", "a=b; sid=\"s9\"" } };
	struct check_input in = { "GET", "/api/users", "id=7&key=q%20v", "api.example.com:8443",
	    "203.0.113.7", fake_lookup, &h };
	const struct route *r;
	const char *key;
	size_t keylen;
	char buf[128];

	if (c == NULL)
		return;
	r = policy_match(c, &in);
	CHECK(r && strcmp(r->name, "api") == 0);
	CHECK(policy_route_keys_by_ip(r));	/* its last key source */
	CHECK(policy_client_key(r, &in, buf, sizeof(buf), &key, &keylen) == 0);
	CHECK(keylen == 2 && memcmp(key, "k1", 2) == 0);
	h.names[0] = "X-Other";
	CHECK(policy_client_key(r, &in, buf, sizeof(buf), &key, &keylen) == 0);
	CHECK(keylen == 3 && memcmp(key, "q v", 3) == 0);
	/* names compare decoded; an empty value is absent, a later one counts */
	in.query = "key=&k%65y=z+1&key=late";
	CHECK(policy_client_key(r, &in, buf, sizeof(buf), &key, &keylen) == 0);
	CHECK(keylen == 3 && memcmp(key, "z 1", 3) == 0);
	in.query = "keyx=1&ke=2&key%=3&key=%4";
	CHECK(policy_client_key(r, &in, buf, sizeof(buf), &key, &keylen) == 0);
	CHECK(keylen == 2 && memcmp(key, "%4", 2) == 0);
	in.query = NULL;
	CHECK(policy_client_key(r, &in, buf, sizeof(buf), &key, &keylen) == 0);
	CHECK(keylen == 2 && memcmp(key, "s9", 2) == 0);
	/* cookies sent on several lines; an empty one is absent */
	h.values[1] = "a=b; sid=";
	h.names[2] = "cookie";
	h.values[2] = "sid=s10";
	CHECK(policy_client_key(r, &in, buf, sizeof(buf), &key, &keylen) == 0);
	CHECK(keylen == 3 && memcmp(key, "s10", 3) == 0);
	h.names[2] = NULL;
	h.names[1] = NULL;
	CHECK(policy_client_key(r, &in, buf, sizeof(buf), &key, &keylen) == POLICY_KEY_IP);
	CHECK_STR(key, "203.0.113.7");
	CHECK(policy_route_mixes_ip(r));
	CHECK(policy_limits(r, "partner-1", 9, 0) == &r->overrides[0].set);
	CHECK(policy_limits(r, "partner-", 8, 0) == &r->limits);
	CHECK(policy_limits(r, "internal", 8, 0)->unlimited);
	/* a value is never an address's client, nor an address a value's */
	CHECK(policy_limits(r, "partner-1", 9, 1) == &r->limits);
	CHECK(policy_limits(r, "10.9.9.9", 8, 1)->unlimited);
	CHECK(policy_limits(r, "10.9.9.9", 8, 0) == &r->limits);
	CHECK(policy_limits(r, "2001:db8::1", 11, 1)->unlimited);	/* canonical */
	CHECK(policy_limits(r, "2001:DB8:0::1", 13, 0) == &r->limits);

	/* a proxy's appended X-Forwarded-Host list counts by its first */
	in.host = " api.example.com:8443 , other.example.com";
	r = policy_match(c, &in);
	CHECK(r && strcmp(r->name, "api") == 0);
	in.host = "[::1]:8443,api.example.com";
	r = policy_match(c, &in);
	CHECK(r && strcmp(r->name, "default") == 0);
	in.host = "other.example.com, api.example.com";
	r = policy_match(c, &in);
	CHECK(r && strcmp(r->name, "default") == 0);
	in.host = "other.example.com";		/* host mismatch: falls to default */
	r = policy_match(c, &in);
	CHECK(r && strcmp(r->name, "default") == 0);
	in.path = "/auth/login";
	in.method = "post";
	r = policy_match(c, &in);
	CHECK(r && strcmp(r->name, "login") == 0);
	in.method = "GET";
	r = policy_match(c, &in);
	CHECK(r && strcmp(r->name, "default") == 0);
	in.method = "HEAD";	/* only a GET route takes HEAD with it */
	r = policy_match(c, &in);
	CHECK(r && strcmp(r->name, "default") == 0);
	in.path = "/v2/things";
	r = policy_match(c, &in);
	CHECK(r && strcmp(r->name, "versioned") == 0);
	CHECK(policy_client_key(r, &in, buf, sizeof(buf), &key, &keylen) == 1);
	CHECK_STR(key, "*");
	CHECK(!policy_route_keys_by_ip(r));
	/* Unresolved (NULL) when the route does not key by it: no key, no crash. */
	h.names[0] = h.names[1] = NULL;
	in.ip = NULL;
	in.path = "/api/users";
	in.host = "api.example.com";
	r = policy_match(c, &in);
	CHECK(r && strcmp(r->name, "api") == 0);
	CHECK(policy_client_key(r, &in, buf, sizeof(buf), &key, &keylen) == -1);
	config_unref(c);
}

/* HEAD is GET without a body: a GET route takes it, and nothing else does. */
static void
test_methods(void)
{
	struct config *c = load_prepared("routes:\n"
	    "  - name: reads\n"
	    "    match: { prefix: /r/, methods: [get] }\n"
	    "    limits: [{ algorithm: fixed_window, limit: 5, window: 1m }]\n"
	    "  - name: heads\n"
	    "    match: { prefix: /h/, methods: [HEAD] }\n"
	    "    limits: [{ algorithm: fixed_window, limit: 5, window: 1m }]\n");
	struct check_input in = { "head", "/r/x", NULL, NULL, "203.0.113.7", NULL, NULL };
	const struct route *r;

	if (c == NULL)
		return;
	r = policy_match(c, &in);
	CHECK(r && strcmp(r->name, "reads") == 0);
	in.method = "GET";
	CHECK(policy_match(c, &in) == r);
	in.method = "POST";
	CHECK(policy_match(c, &in) == NULL);
	in.method = "HEADX";
	CHECK(policy_match(c, &in) == NULL);
	in.path = "/h/x";
	in.method = "GET";	/* a HEAD route does not take GET */
	CHECK(policy_match(c, &in) == NULL);
	in.method = "Head";
	r = policy_match(c, &in);
	CHECK(r && strcmp(r->name, "heads") == 0);
	config_unref(c);
}

/* policy_match looks only at the routes of the request's host name and
 * those of any host: it picks what trying every route in order picks.
 * Random policies against each route loaded alone, and tried as it is. */
static void
test_route_host_index(void)
{
	static const char *const paths[] = {
		"", "path: /a/x, ", "prefix: /a/, ", "prefix: /, ", "regex: '^/b/', ",
	};
	static const char *const methods[] = { "", "methods: [GET], ", "methods: [POST], " };
	static const char *const hosts[] = {
		NULL, "a.example.com", "A.Example.com", "a.example.com:8080",
		"b.example.com", "b.example.com.", "\"[::1]\"", "\"::1\"",
		"10.0.0.1", "a.example.co", "a.example.comm",
	};
	static const char *const req_paths[] = { "/a/x", "/a/y", "/b/x", "/c" };
	static const char *const req_methods[] = { "GET", "post", "HEAD", "PUT" };
	static const char *const req_hosts[] = {
		NULL, "", "a.example.com", "A.EXAMPLE.COM", "a.example.com:8080",
		"a.example.com:08080", "a.example.com:80", "a.example.com.",
		"b.example.com", "B.example.com.:1", "[::1]", "[0:0::1]:8080",
		"::1", "10.0.0.1", "10.0.0.1:8080", "c.example.com",
		" a.example.com , b.example.com", "a.example.co", "a.example.comm",
	};
	unsigned long long seed = 0x2545f4914f6cdd1dULL;
	size_t nh = sizeof(hosts) / sizeof(hosts[0]);

	for (int t = 0; t < 40; t++) {
		enum { NROUTES = 24 };
		struct config *whole, *alone[NROUTES];
		static char text[256 * NROUTES + 16];
		char one[512], alone_text[600];
		int loaded = 1;

		strcpy(text, "routes:\n");
		for (int i = 0; i < NROUTES; i++) {
			const char *host;
			char match[256];

			next_seed(&seed);
			host = hosts[(seed >> 33) % nh];
			snprintf(match, sizeof(match), "%s%s%s%s", paths[(seed >> 20) % 5],
			    methods[(seed >> 13) % 3], host ? "host: " : "", host ? host : "");
			/* a match with nothing in it is written out as {} */
			if (match[0] && match[strlen(match) - 2] == ',')
				match[strlen(match) - 2] = '\0';
			snprintf(one, sizeof(one), "  - name: r%d\n"
			    "    match: { %s }\n"
			    "    limits: [{ algorithm: fixed_window, limit: 5, window: 1m }]\n",
			    i, match);
			strcat(text, one);
			snprintf(alone_text, sizeof(alone_text), "routes:\n%s", one);
			alone[i] = load_prepared(alone_text);
			loaded &= alone[i] != NULL;
			/* tried as it stands, not looked up by its host name */
			if (alone[i] != NULL && alone[i]->nhost_routes == 1) {
				alone[i]->nhost_routes = 0;
				alone[i]->hostless_routes[0] = 0;
				alone[i]->nhostless_routes = 1;
			}
		}
		whole = load_prepared(text);
		for (size_t p = 0; loaded && whole && p < 4; p++)
			for (size_t m = 0; m < 4; m++)
				for (size_t hi = 0; hi < sizeof(req_hosts) / sizeof(req_hosts[0]); hi++) {
					struct check_input in = { req_methods[m], req_paths[p],
					    NULL, req_hosts[hi], "203.0.113.7", NULL, NULL };
					const struct route *got = policy_match(whole, &in);
					int want = -1;

					for (int i = 0; want < 0 && i < NROUTES; i++)
						if (policy_match(alone[i], &in) != NULL)
							want = i;
					if ((want < 0 && got != NULL) || (want >= 0 &&
					    (got == NULL || got != &whole->routes[want]))) {
						fprintf(stderr, "    policy %d, %s %s host %s: got %s, "
						    "want r%d\n%s", t, req_methods[m], req_paths[p],
						    req_hosts[hi] ? req_hosts[hi] : "(none)",
						    got ? got->name : "none", want, text);
						CHECK(0);
						p = 4, m = 4;
						break;
					}
				}
		for (int i = 0; i < NROUTES; i++)
			config_unref(alone[i]);
		config_unref(whole);
	}
}

/* What a route's regex is refused for, and what compiling it costs. */
static void
test_rxcheck(void)
{
	static const struct {
		const char	*re;
		int		 refused, anchored;
		long long	 units;		/* -1: refused, not asked */
		const char	*why;		/* a part of the reason */
	} cases[] = {
		{ "^/api/", 0, 1, 0, NULL },
		{ "^/[a-z0-9-]{1,64}/", 0, 1, 63 * 63, NULL },
		{ "[a-z]{1,1000}", 0, 0, 999 * 999, NULL },	/* 8 MB */
		{ "a{2}", 0, 0, 0, NULL },	/* no optional copies */
		{ "^a|^b", 0, 0, 0, NULL },	/* an alternation: not said */
		{ "(a)\\1", 1, 0, -1, "back-reference" },
		{ "\\d+", 1, 0, -1, "write [0-9]" },
		{ "[\\d]", 1, 0, -1, "[:digit:]" },
		{ "a)", 1, 0, -1, "closes no '('" },
		{ "((a{1,30}){1,30}){1,30}b", 1, 0, -1, "more than 1000 extra copies" },
		/* glibc reads an escaped digit in the braces as the digit */
		{ "((a{1,3\\0}){1,3\\0}){1,3\\0}b", 1, 0, -1,
		  "more than 1000 extra copies" },
		{ "^/[a-z0-9-]{1\\0,6\\0}/", 0, 1, 50 * 50, NULL },
		/* a repeat of a repeat: undefined, and exponential to compile */
		{ "/*++++++++++++x", 1, 0, -1, "'+' at byte 3 repeats a repeat" },
		{ "^/[0-9]++$", 1, 0, -1, "possessive" },
		{ "a{2}*", 1, 0, -1, "repeats a repeat" },
		{ "a+{2}", 1, 0, -1, "repeats a repeat" },
		{ "(a*)+b?c*", 0, 0, 0, NULL },
		/* an empty group repeated costs as an atom does, or more */
		{ "x(){,1000}", 0, 0, 1000 * 1000, NULL },
		{ "(|){1,2000}", 1, 0, -1, "more than 1000 extra copies" },
		{ "()(())((){,6660})", 1, 0, -1, "more than 1000 extra copies" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char why[256] = "";
		int anchored = -1;
		long long units = -1;
		int refused = rxcheck_refused(cases[i].re, why, sizeof(why),
		    &anchored, &units);

		if (refused != cases[i].refused || (!refused && (anchored !=
		    cases[i].anchored || units != cases[i].units)) ||
		    (cases[i].why && strstr(why, cases[i].why) == NULL)) {
			fprintf(stderr, "    %s: refused %d anchored %d units %lld "
			    "why \"%s\"\n", cases[i].re, refused, anchored, units, why);
			CHECK(0);
		}
	}
}

/* What a regex's paths start with (anchored), and hold somewhere: plain
 * bytes, without one that may not be there. */
static void
test_rxcheck_lead(void)
{
	static const struct { const char *re, *lead, *needle; } cases[] = {
		{ "^/api/v[0-9]+/", "/api/v", "/api/v" }, { "^/a$", "/a", "/a" },
		{ "^/ab?c", "/a", "/a" }, { "^/ab*", "/a", "/a" },
		{ "^/ab{0,2}", "/a", "/a" }, { "^/ab{2}cde", "/a", "cde" },
		{ "^/ab+c", "/ab", "/ab" }, { "^/a\\.json", "/a.json", "/a.json" },
		{ "^/a\\|b\\{", "/a|b{", "/a|b{" }, { "^/a\\.?", "/a", "/a" },
		/* a chain of quantifiers: "b+*" is "(b+)*", maybe no b */
		{ "^/ab+*", "/a", "/a" }, { "^/ab+?cde", "/a", "cde" },
		{ "^/ab++c", "/ab", "/ab" },
		{ "^/a\\<b", "/a", "/a" }, { "^/a\\wbcd", "/a", "bcd" }, { "[ab]{0,1}cd", "", "cd" },
		{ "(ab)*cd", "", "cd" }, { "a.*bcd", "", "bcd" },
		{ "^/a(b|c)", "/a", "/a" }, { "^/a.bcd", "/a", "bcd" },
		{ "^^/a", "", "/a" }, { "^", "", "" }, { "", "", "" },
		/* an alternation outside groups parts the whole pattern */
		{ "^/ab|^/cd", "", "" }, { "^/ab(c|d)|x", "", "" },
		{ "^/a[|]bcd", "/a", "bcd" }, { "^/a(x|y)bcd", "/a", "bcd" },
		{ "\\.json$", "", ".json" }, { "[a-z]+/x", "", "/x" },
		{ "^/[a-z]+/users/[0-9]+", "/", "/users/" },
		{ "\\<abc\\>", "", "abc" }, { "a\\|bc", "", "a|bc" },
		{ "^/a{\\0,}b", "/", "/" }, { "a{\\00,}", "", "" },
		{ "^/0123456789012345678901234567890123456789012345678901234567890123456789",
		  "/012345678901234567890123456789012345678901234567890123456789012",
		  "/012345678901234567890123456789012345678901234567890123456789012" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char lead[ROUTE_REGEX_LEAD_MAX], needle[ROUTE_REGEX_LEAD_MAX];
		size_t n = rxcheck_lead(cases[i].re, lead, sizeof(lead));
		size_t m = rxcheck_needle(cases[i].re, needle, sizeof(needle));

		if (n != strlen(cases[i].lead) || memcmp(lead, cases[i].lead, n) != 0 ||
		    m != strlen(cases[i].needle) ||
		    memcmp(needle, cases[i].needle, m) != 0) {
			fprintf(stderr, "    %s: lead \"%.*s\", want \"%s\"; needle "
			    "\"%.*s\", want \"%s\"\n", cases[i].re, (int)n, lead,
			    cases[i].lead, (int)m, needle, cases[i].needle);
			CHECK(0);
		}
	}
}

/* No path a regex matches misses its lead or needle, or matching would
 * skip a route that matches: random patterns against every short path
 * over the bytes they name. */
static void
test_rxcheck_lead_never_skips(void)
{
	static const char *const atoms[] = {
		"a", "b", "/", "ab", ".", "\\.", "\\|", "\\{", "[ab]", "[|]", "(a|b)",
		"\\<", "\\w", "$", "^", "*", "+", "?", "+*", "+?", "{2}", "{0,1}",
		"{1,}", "|",
	};
	static const char alphabet[] = "ab/.|{";
	unsigned long long seed = 0x9e3779b97f4a7c15ULL;
	unsigned matched = 0, past_lead = 0, past_needle = 0;

	for (int t = 0; t < 600; t++) {
		char re[64], lead[ROUTE_REGEX_LEAD_MAX], needle[ROUTE_REGEX_LEAD_MAX + 1];
		char why[256];
		int natoms, anchored;
		long long units;
		size_t n, m;
		regex_t rx;

		next_seed(&seed);
		strcpy(re, seed >> 63 ? "^" : "");
		natoms = 1 + (int)((seed >> 60) & 3) + (int)((seed >> 58) & 1);
		for (int k = 0; k < natoms; k++) {
			next_seed(&seed);
			strcat(re, atoms[(seed >> 33) % (sizeof(atoms) / sizeof(atoms[0]))]);
		}
		if (rxcheck_refused(re, why, sizeof(why), &anchored, &units) ||
		    regcomp(&rx, re, REG_EXTENDED | REG_NOSUB) != 0)
			continue;
		n = anchored ? rxcheck_lead(re, lead, sizeof(lead)) : 0;
		m = rxcheck_needle(re, needle, sizeof(needle) - 1);
		needle[m] = '\0';
		/* every path of up to 5 bytes over the alphabet */
		for (unsigned code = 0, len = 0, count = 1; len <= 5; code++) {
			char path[8];

			if (code == count) {
				code = 0;
				count *= 6;
				if (++len > 5)
					break;
			}
			for (unsigned k = 0, c = code; k < len; k++, c /= 6)
				path[k] = alphabet[c % 6];
			path[len] = '\0';
			if (regexec(&rx, path, 0, NULL, 0) != 0)
				continue;
			matched++;
			past_lead += n > 0;
			past_needle += m > 0;
			if (len < n || memcmp(path, lead, n) != 0 ||
			    strstr(path, needle) == NULL) {
				fprintf(stderr, "    %s matches \"%s\" but its lead is "
				    "\"%.*s\", its needle \"%s\"\n", re, path, (int)n,
				    lead, needle);
				CHECK(0);
				break;
			}
		}
		regfree(&rx);
	}
	CHECK(past_lead > 1000 && past_needle > past_lead && matched > past_needle);
}

/* An unanchored regex is searched as "^.*(RE)": the same paths match. */
static void
test_regex_routes(void)
{
	static const struct { const char *path, *route; } cases[] = {
		{ "/zz/abc/x", "mid" }, { "/abc/x/more", "mid" },
		{ "/a", "alt" }, { "/b/a", NULL }, { "/q/yy", "alt" },
		{ "/q\n\xff/abc/x", "mid" },	/* "." is any byte */
		{ "/end.json", "end" }, { "/x/end.json", "end" },
		{ "/x/end.jsonx", NULL }, { "/ABC/x", NULL }, { "/%0a", NULL },
		/* their leads, "/api/v" and "/api/" */
		{ "/api/v2/x", "ver" }, { "/api/v/x", "mid" }, { "/api/w", "api" },
		{ "/apI/w", NULL }, { "/ap", NULL },
	};
	struct config *c = load_prepared("routes:\n"
	    "  - name: mid\n"
	    "    match: { regex: '[a-z]+/x' }\n"
	    "    limits: [{ algorithm: fixed_window, limit: 5, window: 1m }]\n"
	    "  - name: alt\n"
	    "    match: { regex: '^/a$|yy' }\n"
	    "    limits: [{ algorithm: fixed_window, limit: 5, window: 1m }]\n"
	    "  - name: end\n"
	    "    match: { regex: '\\.json$' }\n"
	    "    limits: [{ algorithm: fixed_window, limit: 5, window: 1m }]\n"
	    "  - name: ver\n"
	    "    match: { regex: '^/api/v[0-9]+/x' }\n"
	    "    limits: [{ algorithm: fixed_window, limit: 5, window: 1m }]\n"
	    "  - name: api\n"
	    "    match: { regex: '^/api/' }\n"
	    "    limits: [{ algorithm: fixed_window, limit: 5, window: 1m }]\n");
	struct check_input in = { "GET", NULL, NULL, NULL, "203.0.113.7", NULL, NULL };

	if (c == NULL)
		return;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct route *r;

		in.path = cases[i].path;
		r = policy_match(c, &in);
		if (cases[i].route ? !(r && strcmp(r->name, cases[i].route) == 0) : r != NULL) {
			fprintf(stderr, "    %s: got %s, want %s\n", cases[i].path,
			    r ? r->name : "none", cases[i].route ? cases[i].route : "none");
			CHECK(0);
		}
	}
	config_unref(c);
}

/* A proxy is trusted when any listed range holds it, as a scan of the
 * list says: random lists of nested, repeated and separate ranges of both
 * families, against addresses at and around their edges. */
static void
test_trusted_proxies_lookup(void)
{
	unsigned long long seed = 0x2545f4914f6cdd1dULL;
	unsigned asked = 0, trusted_seen = 0;

	for (int t = 0; t < 40; t++) {
		char text[16384], list[12000] = "", peer[64], ip[64];
		struct config *c;
		struct cidr cidrs[120];
		size_t n = 0, used = 0;

		for (int k = 0; k < 1 + t * 3; k++) {
			int v6, bits;
			unsigned a, b;

			next_seed(&seed);
			v6 = (seed >> 63) & 1;
			bits = v6 ? 112 + (int)((seed >> 40) % 17) : 16 + (int)((seed >> 40) % 17);
			a = (unsigned)(seed >> 20) & 0xff;
			b = (unsigned)(seed >> 28) & 0x3;	/* crowded: many nest */
			if (v6)
				used += (size_t)snprintf(list + used, sizeof(list) - used,
				    "%s'2001:db8::%x:%x/%d'", n ? ", " : "", b, a, bits);
			else
				used += (size_t)snprintf(list + used, sizeof(list) - used,
				    "%s10.0.%u.%u/%d", n ? ", " : "", b, a, bits);
			n++;
		}
		snprintf(text, sizeof(text), "trusted_proxies: [%s]\nroutes:\n"
		    "  - name: all\n    match: { prefix: / }\n    key: ip\n"
		    "    limits: [{ algorithm: fixed_window, limit: 5, window: 1m }]\n",
		    list);
		if ((c = load_prepared(text)) == NULL)
			return;
		CHECK(c->ntrusted_proxies == n);
		for (size_t k = 0; k < c->ntrusted_proxies && k < 120; k++)
			cidrs[k] = c->trusted_proxies[k];
		for (unsigned b = 0; b < 5; b++)
			for (unsigned a = 0; a < 256; a += (a % 16 == 0 || a % 16 == 15) ? 1 : 7)
				for (int v6 = 0; v6 < 2; v6++) {
					unsigned char addr[16] = { 0 };
					int want = 0, family = v6 ? AF_INET6 : AF_INET;

					if (v6) {
						snprintf(peer, sizeof(peer), "2001:db8::%x:%x", b, a);
						addr[0] = 0x20; addr[1] = 0x01; addr[2] = 0x0d;
						addr[3] = 0xb8; addr[13] = (unsigned char)b;
						addr[15] = (unsigned char)a;
					} else {
						snprintf(peer, sizeof(peer), "10.0.%u.%u", b, a);
						addr[0] = 10; addr[2] = (unsigned char)b;
						addr[3] = (unsigned char)a;
					}
					for (size_t k = 0; k < n; k++)
						want |= config_cidr_contains(&cidrs[k], family, addr);
					policy_client_ip(c, peer, "203.0.113.1", NULL, ip, sizeof(ip));
					asked++;
					trusted_seen += want;
					if (want != (strcmp(ip, "203.0.113.1") == 0)) {
						fprintf(stderr, "    %s among [%s]: client %s, "
						    "want %s trusted\n", peer, list, ip,
						    want ? "it" : "not");
						CHECK(0);
						config_unref(c);
						return;
					}
				}
		config_unref(c);
	}
	CHECK(trusted_seen > asked / 10 && trusted_seen < asked - asked / 10);
}

static void
test_client_ip(void)
{
	struct config *c = load_prepared(good_policy);	/* trusts 127.0.0.1, 10/8 */
	char ip[64];

	if (c == NULL)
		return;
	policy_client_ip(c, "127.0.0.1", "203.0.113.7, 10.1.2.3", NULL, ip, sizeof(ip));
	CHECK_STR(ip, "203.0.113.7");
	policy_client_ip(c, "127.0.0.1", "198.51.100.1, 203.0.113.7", NULL, ip, sizeof(ip));
	CHECK_STR(ip, "203.0.113.7");
	policy_client_ip(c, "127.0.0.1", "10.0.0.1, 10.0.0.2", NULL, ip, sizeof(ip));
	CHECK_STR(ip, "10.0.0.1");
	policy_client_ip(c, "127.0.0.1", NULL, "198.51.100.9", ip, sizeof(ip));
	CHECK_STR(ip, "198.51.100.9");
	policy_client_ip(c, "192.0.2.1", "203.0.113.7", "198.51.100.9", ip, sizeof(ip));
	CHECK_STR(ip, "192.0.2.1");
	policy_client_ip(c, "127.0.0.1", "garbage, 203.0.113.8", NULL, ip, sizeof(ip));
	CHECK_STR(ip, "203.0.113.8");
	/* empty list elements are skipped, not taken for garbage */
	policy_client_ip(c, "127.0.0.1", "203.0.113.7,,", NULL, ip, sizeof(ip));
	CHECK_STR(ip, "203.0.113.7");
	policy_client_ip(c, "127.0.0.1", "198.51.100.1, ,203.0.113.6, 10.0.0.1", NULL,
	    ip, sizeof(ip));
	CHECK_STR(ip, "203.0.113.6");
	policy_client_ip(c, "127.0.0.1", " , ", NULL, ip, sizeof(ip));
	CHECK_STR(ip, "127.0.0.1");
	policy_client_ip(c, "127.0.0.1", ",", "198.51.100.9", ip, sizeof(ip));
	CHECK_STR(ip, "198.51.100.9");		/* no list: X-Real-IP */
	policy_client_ip(c, "127.0.0.1", "2001:DB8::1", NULL, ip, sizeof(ip));
	CHECK_STR(ip, "2001:db8::1");
	policy_client_ip(c, "::ffff:127.0.0.1", "203.0.113.5", NULL, ip, sizeof(ip));
	CHECK_STR(ip, "203.0.113.5");
	/* a unix-socket peer is local: its forwarding headers are believed */
	CHECK(policy_client_ip(c, NULL, "203.0.113.9", NULL, ip, sizeof(ip)) == 0);
	CHECK_STR(ip, "203.0.113.9");
	CHECK(policy_client_ip(c, NULL, NULL, NULL, ip, sizeof(ip)) == -1);
	CHECK_STR(ip, "unix");
	CHECK(policy_canonical_ip(128, "[::1]", 5, ip, sizeof(ip)) == 0);
	CHECK_STR(ip, "::1");
	CHECK(policy_canonical_ip(128, "1.2.3", 5, ip, sizeof(ip)) == -1);
	/* a proxy's ":port" is digits, and nothing else follows an address */
	CHECK(policy_canonical_ip(128, "1.2.3.4:8080", 12, ip, sizeof(ip)) == 0);
	CHECK_STR(ip, "1.2.3.4");
	CHECK(policy_canonical_ip(128, "[2001:db8::1]:443", 17, ip, sizeof(ip)) == 0);
	CHECK_STR(ip, "2001:db8::1");
	CHECK(policy_canonical_ip(128, "1.2.3.4:x", 9, ip, sizeof(ip)) == -1);
	CHECK(policy_canonical_ip(128, "1.2.3.4:", 8, ip, sizeof(ip)) == -1);
	CHECK(policy_canonical_ip(128, "1.2.3.4:123456", 14, ip, sizeof(ip)) == -1);
	CHECK(policy_canonical_ip(128, "[::1]x", 6, ip, sizeof(ip)) == -1);
	CHECK(policy_canonical_ip(128, "[::1]:", 6, ip, sizeof(ip)) == -1);

	/* client_ipv6_prefix: an IPv6 client is its network, written with
	 * its length; IPv4 (v4-mapped too) stays the whole address */
	c->client_ipv6_prefix = 64;
	policy_client_ip(c, "2001:db8:1:2:aaaa:bbbb:cccc:dddd", NULL, NULL, ip,
	    sizeof(ip));
	CHECK_STR(ip, "2001:db8:1:2::/64");
	policy_client_ip(c, "127.0.0.1", "203.0.113.5", NULL, ip, sizeof(ip));
	CHECK_STR(ip, "203.0.113.5");
	policy_client_ip(c, "::ffff:198.51.100.7", NULL, NULL, ip, sizeof(ip));
	CHECK_STR(ip, "198.51.100.7");
	policy_client_ip(c, "127.0.0.1", "2001:DB8:1:2::9", NULL, ip, sizeof(ip));
	CHECK_STR(ip, "2001:db8:1:2::/64");
	c->client_ipv6_prefix = 56;
	policy_client_ip(c, "2001:db8:1:2ff:1::1", NULL, NULL, ip, sizeof(ip));
	CHECK_STR(ip, "2001:db8:1:200::/56");
	c->client_ipv6_prefix = 1;
	policy_client_ip(c, "ffff::1", NULL, NULL, ip, sizeof(ip));
	CHECK_STR(ip, "8000::/1");
	/* the written form names its client; another length names none */
	CHECK(policy_canonical_ip(64, "2001:DB8:1:2::/64", 17, ip, sizeof(ip)) == 0);
	CHECK_STR(ip, "2001:db8:1:2::/64");
	CHECK(policy_canonical_ip(64, "2001:db8:1:2::77/64", 19, ip, sizeof(ip)) == 0);
	CHECK_STR(ip, "2001:db8:1:2::/64");
	CHECK(policy_canonical_ip(64, "[2001:db8::1]:443", 17, ip, sizeof(ip)) == 0);
	CHECK_STR(ip, "2001:db8::/64");
	CHECK(policy_canonical_ip(64, "2001:db8::/48", 13, ip, sizeof(ip)) == -1);
	CHECK(policy_canonical_ip(64, "2001:db8::/064", 14, ip, sizeof(ip)) == -1);
	CHECK(policy_canonical_ip(64, "2001:db8::/", 11, ip, sizeof(ip)) == -1);
	CHECK(policy_canonical_ip(64, "10.0.0.0/64", 11, ip, sizeof(ip)) == -1);
	CHECK(policy_canonical_ip(128, "2001:db8::/128", 14, ip, sizeof(ip)) == -1);
	CHECK(policy_canonical_ip(64, "10.1.2.3", 8, ip, sizeof(ip)) == 0);
	CHECK_STR(ip, "10.1.2.3");
	CHECK(policy_canonical_ip(64, " 2001:db8::/64\t", 15, ip, sizeof(ip)) == 0);
	CHECK_STR(ip, "2001:db8::/64");
	/* one host whatever the low bits say: an IPv4 host written in IPv6
	 * (a /64 of NAT64's prefix is every IPv4 client of the translator),
	 * ::1, link-local (every host of a link shares fe80::/64) */
	{
		static const char *const whole[] = {
			"64:ff9b::c633:6401", "64:ff9b:1::a00:1", "::1", "::",
			"::1.2.3.4", "::ffff:0:102:304", "fe80::1", "febf::1",
		};

		for (size_t i = 0; i < sizeof(whole) / sizeof(whole[0]); i++) {
			const char *want = whole[i];

			c->client_ipv6_prefix = 64;
			policy_client_ip(c, "127.0.0.1", whole[i], NULL, ip, sizeof(ip));
			CHECK_STR(ip, want);
			CHECK(policy_canonical_ip(64, whole[i], strlen(whole[i]), ip,
			    sizeof(ip)) == 0);
			CHECK_STR(ip, want);
		}
	}
	policy_client_ip(c, "127.0.0.1", "64:ff9b::198.51.100.1", NULL, ip, sizeof(ip));
	CHECK_STR(ip, "64:ff9b::c633:6401");
	policy_client_ip(c, "127.0.0.1", "fec0::1", NULL, ip, sizeof(ip));
	CHECK_STR(ip, "fec0::/64");		/* past fe80::/10 */
	/* a network names its clients that are not whole hosts: ::/64 those
	 * outside ::/96; one whose addresses all are names none */
	CHECK(policy_canonical_ip(64, "64:ff9b::/64", 12, ip, sizeof(ip)) == 0);
	CHECK_STR(ip, "64:ff9b::/64");
	policy_client_ip(c, "127.0.0.1", "64:ff9b::1:0:0:5", NULL, ip, sizeof(ip));
	CHECK_STR(ip, "64:ff9b::/64");
	CHECK(policy_canonical_ip(64, "::ffff:1.2.3.4/64", 17, ip, sizeof(ip)) == 0);
	CHECK_STR(ip, "::/64");
	CHECK(policy_canonical_ip(64, "fe80::/64", 9, ip, sizeof(ip)) == -1);
	CHECK(policy_canonical_ip(64, "64:ff9b:1::/64", 14, ip, sizeof(ip)) == -1);
	config_unref(c);
}


/* A command as Redis reads it, taken apart again. */
struct decoded {
	int		 argc;
	const char	*argv[4096];
	size_t		 argvlen[4096];
};

static long long
read_len(const char **p, const char *end, char tag)
{
	long long v = 0;

	if (*p >= end || **p != tag)
		return -1;
	for ((*p)++; *p < end && **p >= '0' && **p <= '9'; (*p)++)
		v = v * 10 + (**p - '0');
	if (end - *p < 2 || (*p)[0] != '\r' || (*p)[1] != '\n')
		return -1;
	*p += 2;
	return v;
}

/* Splits cmd's RESP array into d (strictly: every length and CRLF must be
 * where it says), then checks it is byte for byte what hiredis formats
 * from the same argv. */
static void
decode_resp(const struct limiter_command *cmd, struct decoded *d)
{
	static const char none[64];	/* what a failed decode leaves */
	const char *p = cmd->resp, *end = cmd->resp + cmd->resplen;
	long long n = read_len(&p, end, '*');
	char *want = NULL;

	d->argc = 0;
	for (size_t i = 0; i < 4096; i++) {
		d->argv[i] = none;
		d->argvlen[i] = 0;
	}
	CHECK(n > 0 && n <= 4096);
	for (long long i = 0; i < n && n <= 4096; i++) {
		long long len = read_len(&p, end, '$');

		if (len < 0 || end - p < len + 2 || p[len] != '\r' || p[len + 1] != '\n') {
			CHECK(!"malformed RESP");
			return;
		}
		d->argv[d->argc] = p;
		d->argvlen[d->argc++] = (size_t)len;
		p += len + 2;
	}
	CHECK(p == end);
	n = redisFormatCommandArgv(&want, d->argc, d->argv, d->argvlen);
	CHECK(n > 0 && (size_t)n == cmd->resplen && memcmp(want, cmd->resp, (size_t)n) == 0);
	redisFreeCommand(want);
}

static void
test_encode_and_build(void)
{
	char out[LIMITER_CLIENT_MAX], big[300];
	struct limiter_command cmd = { 0 };
	struct limit l[2] = {
		{ name_burst, ALGORITHM_TOKEN_BUCKET, 20, 0, 0, 10, 1000000, 0, 0 },
		{ name_hourly, ALGORITHM_FIXED_WINDOW, 1000, 3600000000LL, 0, 0, 0, 0, 0 },
	};
	struct limit_set set = { l, 2, 0, 1000 }, other = { l + 1, 1, 0, 1000 };
	unsigned char d[SHA256_DIGEST_LEN];
	static struct decoded dec;

	CHECK(limiter_encode_client("k1", 2, out) == 2);
	CHECK_STR(out, "k1");
	limiter_encode_client("a:b{c}%", 7, out);
	CHECK_STR(out, "a%3Ab%7Bc%7D%25");
	limiter_encode_client("a\0b", 3, out);
	CHECK_STR(out, "a%00b");
	memset(big, 'x', sizeof(big));
	CHECK(limiter_encode_client(big, sizeof(big), out) == 65 && out[0] == '#');
	sha256("abc", 3, d);
	CHECK(d[0] == 0xba && d[1] == 0x78 && d[31] == 0xad);
	sha256("", 0, d);
	CHECK(d[0] == 0xe3 && d[31] == 0x55);
	{
		/* The reference vectors: key 00..0f, messages 00..n-1. */
		static const struct { size_t len; uint64_t h; } sip[] = {
			{ 0, 0x726fdb47dd0e0e31ULL }, { 1, 0x74f839c593dc67fdULL },
			{ 7, 0xab0200f58b01d137ULL }, { 8, 0x93f5f5799a932462ULL },
			{ 15, 0xa129ca6149be45e5ULL }, { 16, 0x3f2acc7f57c29bdbULL },
			{ 63, 0x958a324ceb064572ULL },
		};
		const uint64_t key[2] = { 0x0706050403020100ULL, 0x0f0e0d0c0b0a0908ULL };
		unsigned char msg[64];

		for (size_t i = 0; i < sizeof(msg); i++)
			msg[i] = (unsigned char)i;
		for (size_t i = 0; i < sizeof(sip) / sizeof(sip[0]); i++)
			CHECK(siphash24(key, msg, sip[i].len) == sip[i].h);
	}

	limiter_reset(&cmd);
	limiter_add(&cmd, "rl:", "api", "k1", &set, 3);
	limiter_finish(&cmd, "0123456789012345678901234567890123456789");
	decode_resp(&cmd, &dec);
	/* EVALSHA sha 2 key key 0 1 n alg a b c alg a b c set cost */
	CHECK(dec.argc == 3 + 2 + 2 + 9 + 2);
	CHECK(dec.argvlen[2] == 1 && dec.argv[2][0] == '2');
	CHECK(dec.argvlen[3] == strlen("rl:{api:k1}:burst:token_bucket") &&
	    memcmp(dec.argv[3], "rl:{api:k1}:burst:token_bucket", dec.argvlen[3]) == 0);
	CHECK(memcmp(dec.argv[4], "rl:{api:k1}:hourly:fixed_window", dec.argvlen[4]) == 0);
	CHECK(dec.argvlen[5] == 1 && dec.argv[5][0] == '0');
	CHECK(dec.argvlen[6] == 1 && dec.argv[6][0] == '1');
	CHECK(dec.argvlen[7] == 1 && dec.argv[7][0] == '2');
	CHECK(memcmp(dec.argv[8], "token_bucket", 12) == 0);
	CHECK(memcmp(dec.argv[9], "20", 2) == 0);
	CHECK(memcmp(dec.argv[10], "10", 2) == 0 && memcmp(dec.argv[11], "1000000", 7) == 0);
	CHECK(memcmp(dec.argv[12], "fixed_window", 12) == 0);
	CHECK(dec.argvlen[14] == 10 && memcmp(dec.argv[14], "3600000000", 10) == 0);
	CHECK(dec.argvlen[16] == 1 && dec.argv[16][0] == '1');
	CHECK(dec.argvlen[17] == 1 && dec.argv[17][0] == '3');

	/* A batch: every check's keys first, then the time, each distinct
	 * set once in the order first used, then each check's set and cost,
	 * in the order added. Enough checks to make every staging array and
	 * the buffer grow. */
	limiter_reset(&cmd);
	for (int i = 0; i < 300; i++) {
		char client[16];

		snprintf(client, sizeof(client), "c%d", i);
		limiter_add(&cmd, "rl:", "api", client, i % 3 == 1 ? &other : &set,
		    i + 1);
	}
	limiter_finish(&cmd, "0123456789012345678901234567890123456789");
	decode_resp(&cmd, &dec);
	CHECK(cmd.nchecks == 300);
	/* 200 checks of set (2 keys), 100 of other (1 key) */
	CHECK(dec.argc == 3 + 500 + 2 + 9 + 5 + 300 * 2);
	CHECK(dec.argvlen[2] == 3 && memcmp(dec.argv[2], "500", 3) == 0);
	CHECK(dec.argvlen[0] == 7 && memcmp(dec.argv[0], "EVALSHA", 7) == 0);
	CHECK(dec.argvlen[1] == 40 && dec.argv[1][39] == '9');
	CHECK(memcmp(dec.argv[3 + 499], "rl:{api:c299}:hourly:fixed_window",
	    dec.argvlen[3 + 499]) == 0);
	CHECK(memcmp(dec.argv[3 + 2], "rl:{api:c1}:hourly:fixed_window",
	    dec.argvlen[3 + 2]) == 0);
	CHECK(dec.argvlen[503] == 1 && dec.argv[503][0] == '0');
	CHECK(dec.argvlen[504] == 1 && dec.argv[504][0] == '2');
	CHECK(memcmp(dec.argv[506], "token_bucket", 12) == 0);
	CHECK(dec.argvlen[514] == 1 && dec.argv[514][0] == '1');
	CHECK(memcmp(dec.argv[515], "fixed_window", 12) == 0);
	/* check 1 (other) is set 2; check 299 (set) is set 1, cost 300 */
	CHECK(dec.argvlen[521] == 1 && dec.argv[521][0] == '2');
	CHECK(dec.argvlen[519] == 1 && dec.argv[519][0] == '1');
	CHECK(dec.argvlen[519 + 2 * 299] == 1 && dec.argv[519 + 2 * 299][0] == '1');
	CHECK(dec.argvlen[520 + 2 * 299] == 3 &&
	    memcmp(dec.argv[520 + 2 * 299], "300", 3) == 0);
	limiter_command_free(&cmd);
}

static void
test_verdict_and_headers(void)
{
	struct limit l[2] = {
		{ name_burst, ALGORITHM_TOKEN_BUCKET, 20, 0, 0, 10, 1000000, 0, 0 },
		{ name_hourly, ALGORITHM_FIXED_WINDOW, 1000, 3600000000LL, 0, 0, 0, 0, 0 },
	};
	struct limit_set set = { l, 2, 0, 1000 };
	struct limiter_headers h;
	struct verdict v;
	long long allowed[] = { 1, 5000, 1, 3, 200, 0, 0, 1, 977, 1800000, 0, 0 };
	long long denied[] = { 0, 5000, 0, 0, 2000, 150, 0, 1, 977, 1800000, 0, 0 };
	long long tie[] = { 1, 5000, 1, 5, 1000, 0, 0, 1, 5, 1800001, 0, 0 };

	CHECK(limiter_parse(&set, allowed, 12, &v) == 0);
	CHECK(v.allowed && v.headline == 0);
	limiter_format(&set, &v, 1, &h);
	CHECK_STR(h.limit, "20");
	CHECK_STR(h.remaining, "3");
	CHECK_STR(h.reset, "1");
	CHECK_STR(h.retry_after, "");
	CHECK_STR(h.policy, "\"burst\";q=20;w=2, \"hourly\";q=1000;w=3600");
	CHECK_STR(h.ratelimit, "\"burst\";r=3;t=1, \"hourly\";r=977;t=1800");

	CHECK(limiter_parse(&set, denied, 12, &v) == 0);
	CHECK(!v.allowed && v.retry_ms == 150);
	limiter_format(&set, &v, 0, &h);
	CHECK_STR(h.retry_after, "1");
	CHECK_STR(h.remaining, "0");
	CHECK_STR(h.policy, "");

	CHECK(limiter_parse(&set, tie, 12, &v) == 0);
	CHECK(v.headline == 1);		/* same remaining, longer reset */
	CHECK(limiter_parse(&set, tie, 11, &v) == -1);

	limiter_format_degraded(&set, 0, &h);
	CHECK_STR(h.limit, "20");
	CHECK_STR(h.remaining, "-1");
	CHECK_STR(h.reset, "");
	CHECK_STR(h.policy, "");
	/* The limits are known without Redis; their state is not. */
	limiter_format_degraded(&set, 1, &h);
	CHECK_STR(h.remaining, "-1");
	CHECK_STR(h.policy, "\"burst\";q=20;w=2, \"hourly\";q=1000;w=3600");
	CHECK_STR(h.ratelimit, "");
	CHECK(limiter_ms_to_s(1) == 1 && limiter_ms_to_s(1000) == 1 &&
	    limiter_ms_to_s(1001) == 2 && limiter_ms_to_s(0) == 0);
	CHECK(limiter_ms_to_s(LLONG_MAX) == LLONG_MAX / 1000 + 1);

	/* A policy can name times no client waits for (found by fuzzing:
	 * denycache_put and the shaping timer multiplied them into
	 * microseconds past a long long); they are capped as read. So is the
	 * reply's time, which denycache_get ages (found by fuzzing: a time
	 * of LLONG_MAX - 1490 overflowed there). */
	{
		long long huge[] = { 0, LLONG_MAX - 1490, 0, 0, LLONG_MAX, LLONG_MAX - 5,
		    LLONG_MAX, 1, 977, 1800000, 0, 0 };

		CHECK(limiter_parse(&set, huge, 12, &v) == 0);
		CHECK(v.r[0].reset_ms == LIMITER_MS_MAX && v.r[0].retry_ms == LIMITER_MS_MAX &&
		    v.r[0].delay_ms == LIMITER_MS_MAX && v.retry_ms == LIMITER_MS_MAX);
		CHECK(v.now_ms == LIMITER_MS_MAX);
	}

	/* The IETF fields of the longest route, whole (found by fuzzing: cut
	 * at 1535 bytes, the last item read "P...";q=10000000000). */
	{
		struct limit many[CONFIG_LIMITS_MAX];
		char names[CONFIG_LIMITS_MAX][CONFIG_NAME_MAX + 1], last[256];
		long long ints[LIMITER_REPLY_INTS(CONFIG_LIMITS_MAX)];
		struct limit_set big = { many, CONFIG_LIMITS_MAX, 0, 0 };

		for (int i = 0; i < CONFIG_LIMITS_MAX; i++) {
			memset(names[i], 'P', CONFIG_NAME_MAX);
			names[i][CONFIG_NAME_MAX] = '\0';
			names[i][0] = (char)('a' + i);
			many[i] = (struct limit){ names[i], ALGORITHM_TOKEN_BUCKET,
			    LLONG_MAX, 0, 0, 1, LLONG_MAX, 0, 0 };
		}
		ints[0] = 0;
		ints[1] = LLONG_MIN;
		for (int i = 0; i < CONFIG_LIMITS_MAX; i++) {
			long long *p = ints + 2 + 5 * i;

			p[0] = 0;
			p[1] = LLONG_MAX;
			p[2] = p[3] = p[4] = LLONG_MAX;
		}
		CHECK(limiter_parse(&big, ints, LIMITER_REPLY_INTS(CONFIG_LIMITS_MAX), &v) == 0);
		limiter_format(&big, &v, 1, &h);
		snprintf(last, sizeof(last), "\"%s\";q=%lld;w=%lld", names[15], LLONG_MAX,
		    config_limit_window_seconds(&many[15]));
		CHECK(strlen(h.policy) > strlen(last) &&
		    strcmp(h.policy + strlen(h.policy) - strlen(last), last) == 0);
		snprintf(last, sizeof(last), "\"%s\";r=%lld;t=%lld", names[15], LLONG_MAX,
		    limiter_ms_to_s(LIMITER_MS_MAX));
		CHECK(strlen(h.ratelimit) > strlen(last) &&
		    strcmp(h.ratelimit + strlen(h.ratelimit) - strlen(last), last) == 0);
	}
}

/* Does jsonout_string write in[0..len) as jansson does, or refuse it as
 * jansson does? *valid: it was UTF-8. */
static int
json_string_as_jansson(const unsigned char *in, size_t len, int *valid)
{
	json_t *ref = json_stringn((const char *)in, len);
	char *want = ref ? json_dumps(ref, JSON_ENCODE_ANY | JSON_COMPACT |
	    JSON_ENSURE_ASCII) : NULL;
	char first[8];		/* small: the text moves to the heap */
	struct jsonout o;
	int rc, same;

	jsonout_init(&o, first, sizeof(first));
	jsonout_raw(&o, "x");
	rc = jsonout_string(&o, (const char *)in, len);
	same = ref == NULL ? rc == -1 && o.len == 1 :
	    rc == 0 && want && o.len == 1 + strlen(want) &&
	    memcmp(o.buf + 1, want, o.len - 1) == 0;
	if (!same) {
		fprintf(stderr, "    ");
		for (size_t i = 0; i < len; i++)
			fprintf(stderr, "%02x", in[i]);
		fprintf(stderr, ": jansson %s, jsonout %.*s\n",
		    want ? want : "refuses", (int)o.len, o.buf);
	}
	*valid = ref != NULL;
	free(want);
	json_decref(ref);
	jsonout_free(&o);
	return same;
}

/* jsonout_string writes what jansson writes, and refuses what it does:
 * UTF-8's edges, and random bytes, most of them near those edges, with
 * json_stringn and json_dumps as the reference. */
static void
test_json_strings(void)
{
	static const char *const cases[] = {
		"\xf4\x8f\xbf\xbf", "\xf4\x90\x80\x80", "\xed\x9f\xbf", "\xed\xa0\x80",
		"\xed\xbf\xbf", "\xee\x80\x80", "\xe0\x9f\xbf", "\xe0\xa0\x80",
		"\xf0\x8f\xbf\xbf", "\xf0\x90\x80\x80", "\xc1\xbf", "\xc2\x80",
		"\xe2\x82", "\xe2\x82\xac", "\xf8\x88\x80\x80\x80", "\x7f", "/",
	};
	static const unsigned char edges[] = {
		0x00, 0x01, 0x08, 0x09, 0x0a, 0x0c, 0x0d, 0x1f, 0x20, '"', '\\', '/',
		'a', 0x7e, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1,
		0xc2, 0xdf, 0xe0, 0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff,
	};
	unsigned long long seed = 0x853c49e6748fea9bULL;
	unsigned nvalid = 0;
	int valid;
	char first[8];
	struct jsonout o;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		CHECK(json_string_as_jansson((const unsigned char *)cases[i],
		    strlen(cases[i]), &valid));
	for (int t = 0; t < 20000; t++) {
		unsigned char in[12];
		size_t len;

		next_seed(&seed);
		len = (size_t)(seed >> 60) % 12;
		for (size_t i = 0; i < len; i++) {
			next_seed(&seed);
			in[i] = (seed >> 40) & 1 ? edges[(seed >> 33) % sizeof(edges)] :
			    (unsigned char)(seed >> 50);
		}
		if (!json_string_as_jansson(in, len, &valid)) {
			CHECK(0);
			break;
		}
		nvalid += valid;
	}
	CHECK(nvalid > 2000 && nvalid < 18000);	/* both kinds were tried */
	{
		/* a string takes what it needs, and one refused takes nothing */
		char key[101], room[128];

		memset(key, 'k', 100);
		key[100] = '\0';
		jsonout_init(&o, room, sizeof(room));
		CHECK(jsonout_string(&o, key, 100) == 0 && o.len == 102 && !o.heap);
		key[99] = (char)0xff;
		CHECK(jsonout_string(&o, key, 100) == -1 && o.len == 102 && !o.heap);
		jsonout_free(&o);
	}
	jsonout_init(&o, first, sizeof(first));
	jsonout_ll(&o, LLONG_MIN);
	jsonout_raw(&o, ",");
	jsonout_bool(&o, 1);
	CHECK(o.len == 25 && memcmp(o.buf, "-9223372036854775808,true", 25) == 0);
	jsonout_free(&o);
}

static void
test_formatting(void)
{
	char n[FMT_LL_MAX], d[FMT_HTTP_DATE_MAX];

	CHECK(fmt_ll(n, 0) == 1 && strcmp(n, "0") == 0);
	CHECK(fmt_ll(n, -9223372036854775807LL - 1) == 20 &&
	    strcmp(n, "-9223372036854775808") == 0);
	/* RFC 9110 5.6.7's own example, the epoch, a leap day, 2038. */
	CHECK(fmt_http_date(d, 784111777) == 29);
	CHECK_STR(d, "Sun, 06 Nov 1994 08:49:37 GMT");
	fmt_http_date(d, 0);
	CHECK_STR(d, "Thu, 01 Jan 1970 00:00:00 GMT");
	fmt_http_date(d, 1709164800);
	CHECK_STR(d, "Thu, 29 Feb 2024 00:00:00 GMT");
	fmt_http_date(d, 2147483648LL);
	CHECK_STR(d, "Tue, 19 Jan 2038 03:14:08 GMT");
	fmt_http_date(d, 253402300799LL);
	CHECK_STR(d, "Fri, 31 Dec 9999 23:59:59 GMT");
	CHECK(fmt_http_date(d, 253402300800LL) == 0);	/* year 10000 */
}

/* Caches key's denial by the first limit of set (the others allow),
 * retry_ms from now, for a call sent and answered at the times given;
 * 1 when it gave up another denial that still held. */
static int
cache_denial(struct denycache *dc, struct config *c, const struct route *route,
    struct limit_set *set, const char *key, long long retry_ms,
    long long sent_us, long long answered_us, struct verdict *v)
{
	long long ints[LIMITER_REPLY_INTS(CONFIG_LIMITS_MAX)] = { 0, 5000,
	    0, 0, 2000, retry_ms, 0 };

	for (size_t i = 1; i < set->nlimits; i++)
		memcpy(ints + 2 + 5 * i, (long long[]){ 1, 977, 1800000, 0, 0 },
		    5 * sizeof(long long));
	CHECK(limiter_parse(set, ints, LIMITER_REPLY_INTS(set->nlimits), v) == 0);
	return denycache_put(dc, c, route, set, key, 1, v, sent_us, answered_us, 1);
}

/* How many of n clients ("prefix-0" on) have a denial cached at at_us */
static unsigned
cached_denials(struct denycache *dc, struct config *c, const struct route *route,
    struct limit_set *set, const char *prefix, int n, long long at_us)
{
	struct verdict out;
	unsigned hits = 0;
	char key[32];

	for (int i = 0; i < n; i++) {
		snprintf(key, sizeof(key), "%s-%d", prefix, i);
		hits += denycache_get(dc, c, route, set, key, 1, at_us, 1, &out);
	}
	return hits;
}

/* Caches the denials of n clients ("prefix-0" on, 5 s to wait) answered
 * at at_us, then looks each up a microsecond later: *hits found; returns
 * how many puts said they gave up another denial that still held. */
static unsigned
cache_denials(struct denycache *dc, struct config *c, const struct route *route,
    struct limit_set *set, const char *prefix, int n, long long at_us,
    unsigned *hits)
{
	struct verdict v;
	unsigned given_up = 0;
	char key[32];

	for (int i = 0; i < n; i++) {
		snprintf(key, sizeof(key), "%s-%d", prefix, i);
		given_up += cache_denial(dc, c, route, set, key, 5000, at_us, at_us, &v);
	}
	*hits = cached_denials(dc, c, route, set, prefix, n, at_us + 1);
	return given_up;
}

/* Scans body whole, and again fed one byte more at a time (as reads may
 * bring it), and checks both agree; returns the result and *out the data. */
static int
chunked_both(const char *body, size_t max, char *out, size_t *outlen,
    const char **why)
{
	size_t n = strlen(body), end = 0, end1 = 0;
	struct chunked st, st1;
	char *buf = strdup(body);
	int r, r1 = CHUNKED_MORE;

	memset(&st, 0, sizeof(st));
	r = chunked_scan(&st, buf, n, max, &end, why);
	memset(&st1, 0, sizeof(st1));
	for (size_t i = 1; i <= n && r1 == CHUNKED_MORE; i++)
		r1 = chunked_scan(&st1, buf, i, max, &end1, why);
	CHECK(r == r1);
	if (r == CHUNKED_DONE) {
		CHECK(end == end1);
		*outlen = chunked_decode(buf, end);
		memcpy(out, buf, *outlen);
		out[*outlen] = '\0';
	}
	free(buf);
	return r;
}

static void
test_chunked(void)
{
	char out[256];
	size_t len = 0, end = 0;
	const char *why = NULL;
	struct chunked st;

	CHECK(chunked_both("5\r\nhello\r\n6;ext=\"a b\"\r\n world\r\n0\r\n\r\n",
	    100, out, &len, &why) == CHUNKED_DONE);
	CHECK_STR(out, "hello world");
	/* bare LF, leading zeros, upper-case hex, trailers skipped */
	CHECK(chunked_both("0A\nabcdefghij\n000\nX-T: 1\nY: 2\n\n", 100, out,
	    &len, &why) == CHUNKED_DONE);
	CHECK_STR(out, "abcdefghij");
	CHECK(chunked_both("0\r\n\r\n", 100, out, &len, &why) == CHUNKED_DONE);
	CHECK(len == 0);
	CHECK(chunked_both("zz\r\n", 100, out, &len, &why) == CHUNKED_BAD);
	CHECK_STR(why, "malformed chunk size");
	CHECK(chunked_both("3 x\r\nabc\r\n0\r\n\r\n", 100, out, &len, &why) ==
	    CHUNKED_BAD);
	CHECK(chunked_both("3\r\nabcd\r\n0\r\n\r\n", 100, out, &len, &why) ==
	    CHUNKED_BAD);
	CHECK_STR(why, "chunk data not followed by CRLF");
	/* data over max, however the sizes are split; hex that would
	 * overflow is too large, not wrapped */
	CHECK(chunked_both("6\r\nabcdef\r\n5\r\nghijk\r\n0\r\n\r\n", 10, out, &len,
	    &why) == CHUNKED_TOO_LARGE);
	CHECK(chunked_both("5\r\nabcde\r\n5\r\nfghij\r\n0\r\n\r\n", 10, out, &len,
	    &why) == CHUNKED_DONE);
	CHECK(chunked_both("10000000000000001\r\nx\r\n", 10, out, &len, &why) ==
	    CHUNKED_TOO_LARGE);
	/* incomplete until the empty line after the trailers */
	memset(&st, 0, sizeof(st));
	CHECK(chunked_scan(&st, "1\r\na\r\n0\r\nX: y\r\n", 15, 10, &end, &why) ==
	    CHUNKED_MORE);
	/* a size line with no end is refused once it is longer than any */
	{
		char line[5000];

		memset(line, '0', sizeof(line) - 1);
		line[sizeof(line) - 1] = '\0';
		memset(&st, 0, sizeof(st));
		CHECK(chunked_scan(&st, line, strlen(line), 10, &end, &why) ==
		    CHUNKED_BAD);
	}
	/* what follows the body (a pipelined request) is not read */
	memset(&st, 0, sizeof(st));
	CHECK(chunked_scan(&st, "1\r\na\r\n0\r\n\r\nGET / HTTP/1.1\r\n", 26, 10,
	    &end, &why) == CHUNKED_DONE && end == 11);
}

/* Puts the denials of n clients under `width` copies of route's first
 * limit (a fixed window), each number of each limit its own, and checks
 * that every one found reads back as it was put, and that nearly every
 * entry of the table holds one. */
static void
check_denial_fields(struct config *c, const struct route *route, size_t width,
    int n)
{
	static const uint64_t fixed[4] = { 5, 6, 7, 8 };
	struct denycache *dc = denycache_new_keyed(fixed);
	struct limit limits[CONFIG_LIMITS_MAX];
	struct limit_set set = { limits, width, 0, 20 };
	long long ints[LIMITER_REPLY_INTS(CONFIG_LIMITS_MAX)];
	struct verdict v, out;
	int found = 0;
	char key[32];

	for (size_t j = 0; j < width; j++)
		limits[j] = route->limits.limits[0];
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < n; i++) {
			/* the first limit denies, with nothing left, for 5 s */
			long long head[] = { 0, 5000 + i, 0, 0, 60000 + i, 5000 + i % 97, 0 };

			memcpy(ints, head, sizeof(head));
			for (size_t j = 1; j < width; j++)
				memcpy(ints + 2 + 5 * j, (long long[]){ 1, 16 * i + (long long)j,
				    10000 + 16 * i + (long long)j, 0, 0 }, 5 * sizeof(long long));
			CHECK(limiter_parse(&set, ints, LIMITER_REPLY_INTS(width), &v) == 0);
			snprintf(key, sizeof(key), "field-%d", i);
			if (pass == 0) {
				denycache_put(dc, c, route, &set, key, 1, &v, 1000000,
				    1000000, 1);
				continue;
			}
			if (!denycache_get(dc, c, route, &set, key, 1, 1000000, 1, &out))
				continue;
			found++;
			CHECK(!out.allowed && out.n == width && out.headline == 0 &&
			    out.now_ms == v.now_ms && out.retry_ms == v.retry_ms);
			for (size_t j = 0; j < width; j++)
				CHECK(out.r[j].allowed == v.r[j].allowed &&
				    out.r[j].remaining == v.r[j].remaining &&
				    out.r[j].reset_ms == v.r[j].reset_ms &&
				    out.r[j].retry_ms == v.r[j].retry_ms);
		}
	}
	/* of 16,384 or 4,096 entries, those of sets that drew four keys */
	CHECK(found >= (width == 4 ? 16200 : 4040));
	denycache_free(dc);
}

static void
test_denycache(void)
{
	struct config_errors e;
	struct config *c = load(good_policy, &e);
	struct denycache *dc = denycache_new();
	const struct route *api;
	struct verdict v, out;

	if (c == NULL) {
		CHECK(c != NULL);
		denycache_free(dc);
		return;
	}
	api = &c->routes[1];
	/* api's first two limits are token buckets; reuse a 2-limit slice */
	struct limit_set two = { api->limits.limits, 2, 0, 20 };
	cache_denial(dc, c, api, &two, "k1", 1500, 1000000, 1000000, &v);
	CHECK(denycache_get(dc, c, api, &two, "k1", 1, 1500000, 1, &out) == 1);
	CHECK(out.retry_ms == 1000 && !out.allowed);
	CHECK(denycache_get(dc, c, api, &two, "k2", 1, 1500000, 1, &out) == 0);
	CHECK(denycache_get(dc, c, api, &two, "k1", 1, 2500000, 1, &out) == 0);	/* expired */
	CHECK(denycache_get(dc, c, &c->routes[0], &c->routes[0].limits, "k1", 1, 1500000, 1, &out) == 0);
	/* another Redis link: the state may be gone */
	CHECK(denycache_get(dc, c, api, &two, "k1", 1, 1500000, 2, &out) == 0);

	/* Valid from the send, less the millisecond the script rounded up
	 * (retry 500 ms: surely denied until 499 ms after the send); told
	 * from the arrival, so a client is never sent back early. */
	cache_denial(dc, c, api, &two, "k3", 500, 1000000, 1004000, &v);
	CHECK(denycache_get(dc, c, api, &two, "k3", 1, 1498999, 1, &out) == 1);
	CHECK(out.retry_ms == 6);
	CHECK(denycache_get(dc, c, api, &two, "k3", 1, 1499000, 1, &out) == 0);
	/* a retry of 1 ms cannot be known to hold past the send */
	cache_denial(dc, c, api, &two, "k4", 1, 1000000, 1000000, &v);
	CHECK(denycache_get(dc, c, api, &two, "k4", 1, 1000000, 1, &out) == 0);
	/* at most 10 s, whatever the retry */
	cache_denial(dc, c, api, &two, "k5", 3600000, 1000000, 1000000, &v);
	CHECK(denycache_get(dc, c, api, &two, "k5", 1, 10999999, 1, &out) == 1);
	CHECK(out.retry_ms == 3590001);
	CHECK(denycache_get(dc, c, api, &two, "k5", 1, 11000000, 1, &out) == 0);

	/* one client over limits of two routes keeps both denials */
	{
		const struct route *dflt = &c->routes[3];
		struct verdict fw;

		CHECK(limiter_parse(&dflt->limits, (long long[]){ 0, 5000, 0, 0, 60000, 500, 0 },
		    7, &fw) == 0);
		denycache_put(dc, c, api, &two, "k6", 1, &v, 1000000, 1000000, 1);
		denycache_put(dc, c, dflt, &dflt->limits, "k6", 1, &fw, 1000000, 1000000, 1);
		CHECK(denycache_get(dc, c, api, &two, "k6", 1, 1000001, 1, &out) == 1);
		CHECK(denycache_get(dc, c, dflt, &dflt->limits, "k6", 1, 1000001, 1, &out) == 1);
	}

	/* A denial of cost 3 while 1 is left: a check of cost 1 may pass
	 * meanwhile and change the numbers, so it is not cached; with none
	 * left, nothing passes until the window ends, and it is. */
	{
		const struct route *dflt = &c->routes[3];
		struct verdict fw;

		CHECK(limiter_parse(&dflt->limits, (long long[]){ 0, 5000, 0, 1, 60000,
		    60000, 0 }, 7, &fw) == 0);
		denycache_put(dc, c, dflt, &dflt->limits, "k7", 3, &fw, 1000000, 1000000, 1);
		CHECK(denycache_get(dc, c, dflt, &dflt->limits, "k7", 3, 1000001, 1, &out) == 0);
		CHECK(limiter_parse(&dflt->limits, (long long[]){ 0, 5000, 0, 0, 60000,
		    60000, 0 }, 7, &fw) == 0);
		denycache_put(dc, c, dflt, &dflt->limits, "k7", 3, &fw, 1000000, 1000000, 1);
		CHECK(denycache_get(dc, c, dflt, &dflt->limits, "k7", 3, 1000001, 1, &out) == 1);
		/* a bucket denied a cost of 2 one unit short: a check of cost
		 * 1 passes at once (the audit's case); with under one unit
		 * left, one passes when a unit arrives, which the reply of a
		 * check of cost 2 does not tell */
		for (long long left = 1; left >= 0; left--) {
			CHECK(limiter_parse(&two, (long long[]){ 0, 5000, 0, left, 2000,
			    1500, 0, 1, 977, 1800000, 0, 0 }, 12, &v) == 0);
			denycache_put(dc, c, api, &two, "k8", 2, &v, 1000000, 1000000, 1);
			CHECK(denycache_get(dc, c, api, &two, "k8", 2, 1000001, 1, &out) == 0);
		}
	}

	/* A sliding_window_log denial of cost 1 with nothing left holds
	 * until its oldest request leaves the window, the retry time: cached
	 * until the millisecond before, its times counted down. One of cost
	 * 2 with 1 left is not: a check of cost 1 may pass meanwhile. */
	CHECK(limiter_parse(&c->routes[0].limits, (long long[]){ 0, 1, 0, 0, 100, 40, 0 },
	    7, &v) == 0);
	denycache_put(dc, c, &c->routes[0], &c->routes[0].limits, "k9", 1, &v, 1000000,
	    1000000, 1);
	CHECK(denycache_get(dc, c, &c->routes[0], &c->routes[0].limits, "k9", 1, 1038999, 1, &out) == 1);
	CHECK(out.r[0].retry_ms == 2 && out.r[0].reset_ms == 62 && out.r[0].remaining == 0);
	CHECK(denycache_get(dc, c, &c->routes[0], &c->routes[0].limits, "k9", 1, 1039000, 1, &out) == 0);
	CHECK(limiter_parse(&c->routes[0].limits, (long long[]){ 0, 1, 0, 1, 100, 40, 0 },
	    7, &v) == 0);
	denycache_put(dc, c, &c->routes[0], &c->routes[0].limits, "k10", 2, &v, 1000000,
	    1000000, 1);
	CHECK(denycache_get(dc, c, &c->routes[0], &c->routes[0].limits, "k10", 2, 1000001, 1, &out) == 0);

	/* 3,000 clients over their limits keep their denials together
	 * (in one table of 4,096 entries, a tenth went to Redis; with one
	 * way, 300 clients shared slots enough to send one check in 14); a
	 * full set gives up the entry that serves least: after 16,000 denials
	 * that expired, 3,000 new ones stay. A set holds four, and a few of
	 * 3,000 keys over 4,096 sets may come fifth to theirs: at least 99 %
	 * stay. A route of more than four limits has a table of its own
	 * (4,096 entries, as before), where 1,000 clients stay, and neither
	 * table gives up the other's denials. Fixed hash keys: the same sets
	 * on every run. */
	{
		static const uint64_t fixed[4] = { 1, 2, 3, 4 };
		struct denycache *many = denycache_new_keyed(fixed);
		struct limit five_limits[5];
		struct limit_set five = { five_limits, 5, 0, 20 };
		unsigned given_up, hits;

		five_limits[0] = api->limits.limits[0];
		for (int i = 1; i < 5; i++)
			five_limits[i] = api->limits.limits[1];
		given_up = cache_denials(many, c, api, &two, "many", 3000, 2000000, &hits);
		CHECK(hits >= 2970 && given_up == 3000 - hits);	/* each one said */
		given_up = cache_denials(many, c, api, &five, "wide", 1000, 2000000, &hits);
		CHECK(hits >= 990 && given_up == 1000 - hits);
		CHECK(cached_denials(many, c, api, &two, "many", 3000, 2000002) >= 2970);
		cache_denials(many, c, api, &two, "brief", 16000, 2000000, &hits);
		given_up = cache_denials(many, c, api, &two, "later", 3000, 7000000, &hits);
		/* the expired went first: only a later one gave way, if any */
		CHECK(hits >= 2970 && given_up == 3000 - hits);
		denycache_free(many);
	}
	/* A lookup that finds every denial of its set expired marks the set
	 * empty, so that the next lookups there read no tags; never a set
	 * where another client's denial still holds, and a put marks it
	 * again. */
	{
		static const uint64_t fixed[4] = { 9, 10, 11, 12 };
		struct denycache *mixed = denycache_new_keyed(fixed);
		unsigned hits, held;

		for (int i = 0; i < 3000; i++) {
			char key[32];

			snprintf(key, sizeof(key), "short-%d", i);
			cache_denial(mixed, c, api, &two, key, 1000, 2000000, 2000000, &v);
			snprintf(key, sizeof(key), "long-%d", i);
			cache_denial(mixed, c, api, &two, key, 5000, 2000000, 2000000, &v);
		}
		held = cached_denials(mixed, c, api, &two, "long", 3000, 2000001);
		CHECK(held >= 2970);
		CHECK(cached_denials(mixed, c, api, &two, "short", 3000, 3500000) == 0);
		CHECK(cached_denials(mixed, c, api, &two, "long", 3000, 3500000) == held);
		cache_denials(mixed, c, api, &two, "short", 3000, 3500000, &hits);
		CHECK(hits >= 2970);
		denycache_free(mixed);
	}
	/* Entries filled to their table's width, every way of every set
	 * written, give back each number they were given: a stride a limit
	 * short would let an entry's last limit and its neighbour's head
	 * overwrite each other (past the last entry, out of the allocation,
	 * which ASan sees). */
	for (size_t width = 4; width <= CONFIG_LIMITS_MAX; width += 12)
		check_denial_fields(c, &c->routes[3], width, width == 4 ? 40000 : 10000);
	/* A client's set of limits is what it was put under (a reload is a
	 * new generation): one of another size never reads the entry. */
	{
		struct limit_set one = { two.limits, 1, 0, 20 };

		cache_denial(dc, c, api, &two, "k11", 5000, 1000000, 1000000, &v);
		CHECK(denycache_get(dc, c, api, &two, "k11", 1, 1000001, 1, &out) == 1);
		CHECK(denycache_get(dc, c, api, &one, "k11", 1, 1000001, 1, &out) == 0);
	}
	denycache_free(dc);
	config_unref(c);
}

static const struct {
	const char *name;
	void (*fn)(void);
} tests[] = {
	{ "durations and rates", test_durations },
	{ "durations written back", test_duration_format },
	{ "cidr", test_cidr },
	{ "policy: a good file", test_config_good },
	{ "policy: errors with positions", test_config_errors },
	{ "path normalization", test_normalize },
	{ "absolute-form authority, host covers", test_authority_and_host_cover },
	{ "routes and keys", test_routes_and_keys },
	{ "methods: HEAD with GET", test_methods },
	{ "routes by host, in file order", test_route_host_index },
	{ "regex vetting", test_rxcheck },
	{ "regex leads", test_rxcheck_lead },
	{ "regex leads never skip a match", test_rxcheck_lead_never_skips },
	{ "regex routes", test_regex_routes },
	{ "client ip", test_client_ip },
	{ "trusted proxies lookup", test_trusted_proxies_lookup },
	{ "redis keys and command", test_encode_and_build },
	{ "verdict and headers", test_verdict_and_headers },
	{ "JSON strings as jansson writes them", test_json_strings },
	{ "numbers and dates", test_formatting },
	{ "deny cache", test_denycache },
	{ "chunked bodies", test_chunked },
};

int
main(void)
{
	int passed = 0, failed = 0;
	char cmd[300];

	if (mkdtemp(tmpdir) == NULL) {
		perror("mkdtemp");
		return 1;
	}
	for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
		int before = failures;

		tests[i].fn();
		if (failures == before) {
			printf("ok   %s\n", tests[i].name);
			passed++;
		} else {
			printf("FAIL %s\n", tests[i].name);
			failed++;
		}
	}
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmpdir);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
