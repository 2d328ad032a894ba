/*
 * The policy file: its data model, the loader with FILE:LINE:COL errors, and
 * the reference count that lets a reload swap policies while requests still
 * hold the old one.
 */
#ifndef CONFIG_H
#define CONFIG_H

#include <regex.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#define CONFIG_LIMITS_MAX	16	/* limits on one route (one script call) */
/* Checks one script call may carry: a call blocks Redis for its whole run
 * (a few microseconds per check), so batches stay well under a millisecond. */
#define CONFIG_BATCH_DEFAULT	64
#define CONFIG_BATCH_MAX	1000
#define CONFIG_ROUTES_MAX	1000
#define CONFIG_FILE_MAX		(16 << 20)	/* bytes of a policy file */
#define CONFIG_WORKERS_MAX	64
#define CONFIG_CONNECTIONS_DEFAULT 10000	/* server.max_connections */
#define CONFIG_CONNECTIONS_MAX	1000000
#define CONFIG_FDS_RESERVED	(64 + 2 * CONFIG_WORKERS_MAX)
#define CONFIG_KEY_RAW_MAX	256	/* longer client keys are hashed */
#define CONFIG_NAME_MAX		64	/* a route's or a limit's name */

enum algorithm {
	ALGORITHM_FIXED_WINDOW,
	ALGORITHM_TOKEN_BUCKET,
	ALGORITHM_SLIDING_WINDOW_LOG,
	ALGORITHM_SLIDING_WINDOW_COUNTER,
	ALGORITHM_LEAKY_BUCKET,
	ALGORITHM_GCRA,
	ALGORITHM_COUNT
};

enum failure_mode { FAILURE_MODE_INHERIT = -1, FAILURE_MODE_OPEN, FAILURE_MODE_CLOSED };
enum key_source_type { KEY_IP, KEY_HEADER, KEY_QUERY, KEY_COOKIE, KEY_GLOBAL };
enum path_match { PATH_ANY, PATH_EXACT, PATH_PREFIX, PATH_REGEX };

struct limit {
	char		*name;
	enum algorithm	 algorithm;
	long long	 quota;		/* limit (windows) or burst (buckets) */
	long long	 window_us;	/* window algorithms */
	long long	 precision_us;	/* sliding_window_counter bucket width */
	long long	 rate_n;	/* buckets: rate_n units ... */
	long long	 rate_period_us; /* ... per this many microseconds */
	int		 delay;		/* leaky_bucket: hold replies (shaping) */
	unsigned	 metric_id;	/* its denials' series (metrics_show_policy) */
};

struct limit_set {
	struct limit	*limits;
	size_t		 nlimits;
	int		 unlimited;	/* an override that lifts every limit */
	long long	 max_quota;	/* largest cost a request may ask for */
};

struct override {
	char		**keys;
	size_t		  nkeys;
	char		**canon_ip;	/* per key: its canonical address, or NULL
					 * (policy_prepare, routes keyed by ip) */
	struct limit_set  set;
};

/* A route's override keys as a client key is compared with them, sorted
 * (policy_prepare) so that a check finds its client's override in
 * log n: a route may list a million keys. */
struct override_index {
	const char		*key;	/* the form compared (see policy.c) */
	size_t			 len;
	const struct override	*override;
	size_t			 order;	/* place in the file: the first wins */
};

struct key_source {
	enum key_source_type	 type;
	char			*name;	/* header, query or cookie name */
};

/* A Host value's name (without a [v6] literal's brackets or a root dot)
 * and port (NULL when none), pointing into the value. */
struct host_parts {
	const char	*name;
	size_t		 namelen;
	const char	*port;
	size_t		 portlen;
	/* A route's host that is an IPv6 address, which a request's matches
	 * however it is spelled (policy_prepare sets these). */
	int		 is_v6;
	unsigned char	 v6[16];
};

#define ROUTE_REGEX_LEAD_MAX	64	/* any more tells routes apart no better */

struct route {
	char			*name;
	unsigned		 metric_id;	/* stable across reloads, by name */
	enum path_match		 path_kind;
	char			*path;		/* exact path, prefix or regex text */
	size_t			 path_len;
	regex_t			 regex;
	/* What every path the regex matches starts with (rxcheck_lead),
	 * and holds somewhere (rxcheck_needle; "" when it is no longer) */
	char			 regex_lead[ROUTE_REGEX_LEAD_MAX];
	size_t			 regex_lead_len;
	char			 regex_needle[ROUTE_REGEX_LEAD_MAX + 1];
	char			**methods;	/* upper case; none = any method */
	size_t			 nmethods;
	char			*host;		/* lower case; NULL = any host */
	struct host_parts	 host_parts;	/* of host (policy_prepare) */
	struct key_source	*keys;		/* first present wins */
	size_t			 nkeys;
	int			 missing_key_allow;
	int			 deny_status;	/* 0 = server.deny_status */
	enum failure_mode	 failure_mode;	/* INHERIT = top level */
	int			 shadow;
	struct limit_set	 limits;
	struct override		*overrides;
	size_t			 noverrides;
	/* The override keys a client key from its address is compared
	 * with, and those a value's is (policy_limits). */
	struct override_index	*by_ip, *by_value;
	size_t			 nby_ip, nby_value;
	int			 mixes_ip;	/* see policy_route_mixes_ip */
};

/* A route's match.host name (lower case, in its host_parts) */
struct host_route {
	const char	*name;
	size_t		 namelen;
	size_t		 route;		/* index into config->routes */
};

/* first..last, both in, of one family; big-endian, so memcmp orders them */
struct addr_range {
	unsigned char	first[16], last[16];
};

struct cidr {
	int		family;		/* AF_INET or AF_INET6 */
	unsigned char	addr[16];
	int		bits;
};

/* Is addr (of family) inside c? Inline: the client IP asks it per hop. */
static inline int
config_cidr_contains(const struct cidr *c, int family, const unsigned char *addr)
{
	int full = c->bits / 8, rest = c->bits % 8;

	if (c->family != family || memcmp(c->addr, addr, (size_t)full) != 0)
		return 0;
	if (rest) {
		unsigned char mask = (unsigned char)(0xff << (8 - rest));

		return (c->addr[full] & mask) == (addr[full] & mask);
	}
	return 1;
}

/* Sets the bits of addr[0..size) past its first `bits` to 1 (ones) or 0:
 * the first or the last address of the range addr/bits. */
static inline void
config_addr_fill_past(unsigned char *addr, size_t size, int bits, int ones)
{
	size_t full = (size_t)bits / 8;

	if (bits % 8) {
		unsigned char low = (unsigned char)(0xff >> (bits % 8));

		addr[full] = ones ? addr[full] | low : addr[full] & ~low;
		full++;
	}
	memset(addr + full, ones ? 0xff : 0, size - full);
}

struct config {
	atomic_int	 refs;
	struct config	*released_next;	/* see config_defer_free */
	char		*path;
	unsigned long	 generation;	/* bumps on every successful load */

	char		*listen;
	int		 listen_line, listen_col;	/* 0: the default */
	int		 workers;	/* as written; 0 = auto */
	int		 workers_running; /* threads in force, set by main */
	int		 deny_status;
	int		 ietf_headers;
	long long	 idle_timeout_us;
	long long	 drain_timeout_us;
	long long	 max_connections;	/* the daemon's, shared by workers */

	char		*redis_address;
	int		 redis_database;
	char		*redis_username;
	char		*redis_password_env;
	char		*redis_password;	/* from the environment; never printed */
	long long	 redis_timeout_us;
	long long	 redis_connect_timeout_us;
	int		 redis_max_batch;	/* checks per script call, at most */
	char		*key_prefix;

	enum failure_mode failure_mode;
	struct cidr	*trusted_proxies;
	size_t		 ntrusted_proxies;
	/* The same, per family as sorted ranges, none inside another
	 * (policy_prepare): each X-Forwarded-For hop is looked up in them,
	 * where a scan of 10,000 CIDRs halved the checks a second */
	struct addr_range *trusted_ranges[2];	/* [0] IPv4, [1] IPv6 */
	size_t		 ntrusted_ranges[2];
	int		 client_ipv6_prefix;	/* bits of an IPv6 client key */

	int		 log_level;		/* enum log_level */
	int		 log_format;		/* enum log_format */
	int		 log_access;

	struct route	*routes;
	size_t		 nroutes;
	/* policy_match's view of routes (policy_prepare): those naming a
	 * host by name, sorted by it, and the rest (no host, or an IPv6
	 * address, spelled many ways), each in file order. A request looks
	 * only at its host's and the rest: scanning 999 host routes took
	 * 0.3 of a check's time. */
	struct host_route *host_routes;
	size_t		 nhost_routes;
	size_t		*hostless_routes;	/* indexes into routes */
	size_t		 nhostless_routes;

	/* GET /v1/policy's body, rendered once by config_render_json (on the
	 * main thread: a large policy takes tens of milliseconds, which no
	 * worker's loop should spend per request) and lent to each reply. */
	char		*json;
	size_t		 json_len;

	/* "FILE:LINE:COL: warning: ..." for what loads but is surely not
	 * meant (a route that can never match); -t prints them, the daemon
	 * logs them on each load */
	char		**warnings;
	size_t		  nwarnings;
};

/* Errors collected while loading, each "FILE:LINE:COL: message". */
struct config_errors {
	char	**lines;
	size_t	  n;
	/* The file's warnings, said with its errors: else fixing the errors
	 * brought new messages up at the next run. */
	char	**warnings;
	size_t	  nwarnings;
	int	  passing;	/* unread for want of descriptors or memory:
				 * the same file may load a moment later */
};

struct config *config_load(const char *path, struct config_errors *errors);
/* Errors said at most, then how many more (a file of 200,000 unknown keys
 * printed as many lines, and a reload's flooded the log). */
#define CONFIG_ERRORS_SHOWN	100
/* server.max_connections, or fewer when the file descriptor limit would
 * not leave CONFIG_FDS_RESERVED for Redis links, the policy file and the
 * rest: accepts must never take the descriptor a Redis reconnect needs. */
long long config_connections_in_force(const struct config *config);
struct config *config_ref(struct config *config);
void config_unref(struct config *config);
/* From now on a policy whose last reference goes is not freed by the
 * thread that let it go (a worker, whose loop a large policy's free would
 * hold up for milliseconds) but kept for config_free_released(), and
 * wake(arg) is called; wake NULL frees at once again. */
void config_defer_free(void (*wake)(void *), void *arg);
/* Frees the policies released since the last call (the main thread). */
void config_free_released(void);
void config_errors_free(struct config_errors *errors);

const char *config_algorithm_name(enum algorithm algorithm);
int config_algorithm_is_bucket(enum algorithm algorithm);
/* Seconds shown as the IETF `w` parameter: the window, or burst/rate. */
long long config_limit_window_seconds(const struct limit *limit);
enum failure_mode config_route_failure_mode(const struct config *config,
    const struct route *route);
int config_route_deny_status(const struct config *config, const struct route *route);

/* Pure parsers, exposed for the unit tests. Return 0 or -1 with *cause. */
int config_parse_cidr(const char *s, struct cidr *out);
/* Is s an HTTP token (RFC 9110 5.6.2), as a method or header name is? */
int config_token_ok(const char *s);

#endif
