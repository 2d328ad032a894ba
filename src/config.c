/*
 * The policy loader. yamldoc reads the file into a tree of nodes that keep
 * their positions (so every message can name FILE:LINE:COL); the tree is
 * then walked with per-section key tables. Every error is collected and
 * loading goes on, so a user sees all the problems of a file at once;
 * semantic cross-checks (duplicate names, rate sanity) run after.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "duration.h"
#include "log.h"
#include "policy.h"
#include "rxcheck.h"
#include "xmalloc.h"
#include "yamldoc.h"

/* Limits of one route read for their errors, past CONFIG_LIMITS_MAX:
 * a list that long is a mistake, and each is compared with the others. */
#define LIMITS_READ_MAX	(4 * CONFIG_LIMITS_MAX)

#define QUOTA_MAX	RATE_COUNT_MAX
#define REGEX_MAX_LEN	4096
#define LEAKY_HOLD_WARN_US (5 * US_PER_S)
#define SLIDING_BUCKETS_MAX 1000	/* window/precision: bounds Redis memory */
/* sliding_window_log stores one sorted-set member per unit of cost, and a
 * request may cost up to its route's largest quota: at limit 1e12 one
 * request of cost 10^6 held Redis for a second and took 134 MB. */
#define SLIDING_LOG_MAX	10000
#define ECHO_SIZE	160	/* a user's value echoed in a message, escaped */
#define ECHO_SLOTS	4	/* echoed values one message may hold */

/* Where an error is, to print them in file order (errors_sort). */
struct error_pos {
	int	 line, col;
	size_t	 seq;		/* order found, for ties */
	char	*text;
	int	 unsaid;	/* see node_error */
};

/* What a loader pass carries around. */
struct loader {
	const char		*path;
	struct config_errors	*errors;
	struct error_pos	*pos;	/* one per errors->lines[] */
	char			 echo[ECHO_SLOTS][ECHO_SIZE]; /* see echo() */
	unsigned		 necho;
	char			**warnings;	/* see struct config */
	size_t			  nwarnings;
	/* The route being read says shadow: true (wherever in it): it holds
	 * no reply, so its limits are not warned about long holds. */
	int			  in_shadow_route;
	long long		  regex_units;	/* see RXCHECK_UNITS_MAX */
	/* client_ipv6_prefix, read ahead of the routes (wherever the file
	 * puts it): their override keys are compared in its form. */
	int			  client_ipv6_prefix;
};

static unsigned long config_generation;

static const char *const algorithm_names[ALGORITHM_COUNT] = {
	"fixed_window", "token_bucket", "sliding_window_log",
	"sliding_window_counter", "leaky_bucket", "gcra",
};

/* Out of descriptors or memory for a moment: not the file's fault. */
static int
errno_is_passing(int e)
{
	return e == EMFILE || e == ENFILE || e == ENOMEM || e == EAGAIN ||
	    e == EINTR;
}

static void
errorf_at(struct loader *ld, int line, int col, int unsaid, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* An error at line:col; one `unsaid` is counted but not printed (see
 * node_error). */
static void
errorf_at(struct loader *ld, int line, int col, int unsaid, const char *fmt, ...)
{
	struct config_errors *e = ld->errors;
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	e->lines = xrealloc(e->lines, (e->n + 1) * sizeof(*e->lines));
	ld->pos = xrealloc(ld->pos, (e->n + 1) * sizeof(*ld->pos));
	ld->pos[e->n].line = line;
	ld->pos[e->n].col = col;
	ld->pos[e->n].unsaid = unsaid;
	e->lines[e->n++] = xasprintf("%s:%d:%d: %s", ld->path, line, col, msg);
}

#define errorf(ld, line, col, ...) errorf_at((ld), (line), (col), 0, __VA_ARGS__)

static void
warnf(struct loader *ld, const struct node *nd, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A warning: kept with the policy (config_load moves them there). */
static void
warnf(struct loader *ld, const struct node *nd, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (nd->refused)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	ld->warnings = xrealloc(ld->warnings, (ld->nwarnings + 1) *
	    sizeof(*ld->warnings));
	ld->warnings[ld->nwarnings++] = xasprintf("%s:%d:%d: warning: %s",
	    ld->path, nd->line, nd->col, msg);
}

static int
error_pos_cmp(const void *a, const void *b)
{
	const struct error_pos *x = a, *y = b;

	if (x->line != y->line)
		return x->line < y->line ? -1 : 1;
	if (x->col != y->col)
		return x->col < y->col ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/*
 * Puts the errors in file order (line, then column, then as found). The
 * walk finds them out of order: a limit's parameters are checked in a
 * fixed order, and a missing key or a duplicate is only known after the
 * children that come after it in the file. The errors not to be said
 * (node_error) go.
 */
static void
errors_sort(struct loader *ld)
{
	struct config_errors *e = ld->errors;
	size_t n;

	for (size_t i = 0; i < e->n; i++) {
		ld->pos[i].seq = i;
		ld->pos[i].text = e->lines[i];
	}
	if (e->n > 1)
		qsort(ld->pos, e->n, sizeof(*ld->pos), error_pos_cmp);
	n = 0;
	for (size_t i = 0; i < e->n; i++) {
		if (ld->pos[i].unsaid)
			free(ld->pos[i].text);
		else
			e->lines[n++] = ld->pos[i].text;
	}
	e->n = n;
	free(ld->pos);
	ld->pos = NULL;
}

/* An error about a node refused as it was read is counted, as the walk
 * decides validity by the count, but not said: it would only be a
 * consequence of the refusal said at the same place (errors_sort). */
#define node_error(ld, nd, ...)						\
	errorf_at((ld), (nd)->line, (nd)->col, (nd)->refused, __VA_ARGS__)

/*
 * The user's text s made safe to print in a message: control bytes, bytes
 * of 0x80 and up, quotes and backslashes escaped as log_escape does, and
 * long text cut with "...". A policy may come from anywhere, and its bytes
 * end up on a terminal or in a log. The result lives in one of the
 * loader's ECHO_SLOTS buffers, enough for the values of one message.
 */
static const char *
echo(struct loader *ld, const char *s)
{
	char *buf = ld->echo[ld->necho++ % ECHO_SLOTS];
	size_t len = strlen(s), need = 0;

	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];

		need += c == '"' || c == '\\' ? 2 : c < 0x20 || c >= 0x7f ? 4 : 1;
	}
	if (need < ECHO_SIZE)
		return log_escape(buf, ECHO_SIZE, s, len);
	log_escape(buf, ECHO_SIZE - 3, s, len);
	strcat(buf, "...");
	return buf;
}

void
config_errors_free(struct config_errors *errors)
{
	for (size_t i = 0; i < errors->n; i++)
		free(errors->lines[i]);
	free(errors->lines);
	errors->lines = NULL;
	errors->n = 0;
	for (size_t i = 0; i < errors->nwarnings; i++)
		free(errors->warnings[i]);
	free(errors->warnings);
	errors->warnings = NULL;
	errors->nwarnings = 0;
}

/* The file's YAML tree, its errors as the policy's; NULL as yamldoc_read. */
static struct node *
read_yaml(struct loader *ld, FILE *fp)
{
	struct yamldoc_errors found;
	struct node *root = yamldoc_read(fp, CONFIG_FILE_MAX, &found);

	for (size_t i = 0; i < found.n; i++)
		errorf(ld, found.v[i].line, found.v[i].col, "%s", found.v[i].text);
	if (found.read_errno)
		ld->errors->passing = errno_is_passing(found.read_errno);
	yamldoc_errors_free(&found);
	return root;
}

/* --- scalar conversions ----------------------------------------------- */

static int
node_is_null(const struct node *nd)
{
	return nd->type == NODE_SCALAR && nd->plain &&
	    (nd->value[0] == '\0' || strcmp(nd->value, "~") == 0 ||
	    strcmp(nd->value, "null") == 0 || strcmp(nd->value, "Null") == 0 ||
	    strcmp(nd->value, "NULL") == 0);
}

static const char *
node_type_name(const struct node *nd)
{
	switch (nd->type) {
	case NODE_MAPPING:
		return "a mapping";
	case NODE_SEQUENCE:
		return "a list";
	default:
		return node_is_null(nd) ? "null" : "a scalar";
	}
}

/* YAML 1.2's booleans (its 1.1 yes, no, on and off are text): 1 for a
 * false, 2 for a true, 0 for any other text. */
static int
is_bool_word(const char *s)
{
	static const char *const words[] = { "false", "False", "FALSE",
	    "true", "True", "TRUE" };

	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
		if (strcmp(s, words[i]) == 0)
			return i < 3 ? 1 : 2;
	return 0;
}

static int
want_scalar(struct loader *ld, const struct node *nd, const char *key)
{
	if (nd->type == NODE_SCALAR && !node_is_null(nd))
		return 0;
	node_error(ld, nd, "%s: expected a value, got %s", key, node_type_name(nd));
	return -1;
}

static int
get_string(struct loader *ld, const struct node *nd, const char *key, char **out)
{
	if (want_scalar(ld, nd, key) == -1)
		return -1;
	/* A bare true or false is YAML's boolean, as get_bool reads it, so
	 * text there is a type mixed up, not a name. A number keeps its
	 * text as written ("v2", 404 and 1.50 lose nothing). */
	if (nd->plain && is_bool_word(nd->value)) {
		node_error(ld, nd, "%s: expected text, got the boolean %s (quote "
		    "it if you mean the word: \"%s\")", key, nd->value,
		    nd->value);
		return -1;
	}
	free(*out);
	*out = xstrdup(nd->value);
	return 0;
}

static int
get_int(struct loader *ld, const struct node *nd, const char *key,
    long long min, long long max, long long *out)
{
	const char *digits;
	char *end;
	long long v;

	if (want_scalar(ld, nd, key) == -1)
		return -1;
	errno = 0;
	v = strtoll(nd->value, &end, 10);
	/* "5" prints like 5, so a bare "got \"5\"" would read as nonsense. */
	if (!nd->plain) {
		node_error(ld, nd, "%s: expected an integer, got the string \"%s\"%s",
		    key, echo(ld, nd->value), end != nd->value && *end == '\0' &&
		    errno == 0 ? " (remove the quotes)" : "");
		return -1;
	}
	if (end != nd->value && *end == '\0' && errno == ERANGE) {
		/* beyond 64 bits, but an integer all the same */
		node_error(ld, nd, "%s: %s is out of range [%lld, %lld]", key,
		    echo(ld, nd->value), min, max);
		return -1;
	}
	if (end == nd->value || *end != '\0' || errno != 0) {
		node_error(ld, nd, "%s: expected an integer, got \"%s\"", key,
		    echo(ld, nd->value));
		return -1;
	}
	/* YAML 1.1 (and so PyYAML, and yq's older modes) reads 010 as octal
	 * 8, YAML 1.2 as 10: a value some of the user's own tools would read
	 * otherwise is refused rather than guessed. */
	digits = nd->value + (nd->value[0] == '-' || nd->value[0] == '+');
	if (digits[0] == '0' && isdigit((unsigned char)digits[1])) {
		node_error(ld, nd, "%s: \"%s\" has a leading zero, which YAML "
		    "1.1 reads as octal: write %lld without it", key,
		    echo(ld, nd->value), v);
		return -1;
	}
	if (v < min || v > max) {
		node_error(ld, nd, "%s: %lld is out of range [%lld, %lld]", key, v,
		    min, max);
		return -1;
	}
	*out = v;
	return 0;
}

static int
get_bool(struct loader *ld, const struct node *nd, const char *key, int *out)
{
	int word;

	if (want_scalar(ld, nd, key) == -1)
		return -1;
	word = is_bool_word(nd->value);
	if (nd->plain && word) {
		*out = word == 2;
		return 0;
	}
	if (!nd->plain)
		node_error(ld, nd, "%s: expected true or false, got the string "
		    "\"%s\"%s", key, echo(ld, nd->value),
		    word ? " (remove the quotes)" : "");
	else
		node_error(ld, nd, "%s: expected true or false, got \"%s\"", key,
		    echo(ld, nd->value));
	return -1;
}

static int
get_duration(struct loader *ld, const struct node *nd, const char *key,
    long long *out)
{
	const char *cause;
	char advice[64];

	if (want_scalar(ld, nd, key) == -1)
		return -1;
	if (duration_parse(nd->value, out, &cause) == -1) {
		node_error(ld, nd, "%s: \"%s\": %s%s", key, echo(ld, nd->value), cause,
		    duration_cause_is_fraction(cause) ? duration_fraction_advice(
		    advice, sizeof(advice), nd->value, -1) : "");
		return -1;
	}
	return 0;
}

int
config_parse_cidr(const char *s, struct cidr *out)
{
	char buf[INET6_ADDRSTRLEN + 8], *slash, *end;
	long bits;

	if (strlen(s) >= sizeof(buf))
		return -1;
	strcpy(buf, s);
	memset(out, 0, sizeof(*out));
	slash = strchr(buf, '/');
	if (slash)
		*slash++ = '\0';
	if (inet_pton(AF_INET, buf, out->addr) == 1) {
		out->family = AF_INET;
		out->bits = 32;
	} else if (inet_pton(AF_INET6, buf, out->addr) == 1) {
		out->family = AF_INET6;
		out->bits = 128;
	} else
		return -1;
	if (slash) {
		errno = 0;
		bits = strtol(slash, &end, 10);
		if (!isdigit((unsigned char)*slash) || *end != '\0' || errno || bits < 0 ||
		    bits > out->bits)
			return -1;
		out->bits = (int)bits;
	}
	/* An IPv4-mapped range (::ffff:10.0.0.0/104, copied from `ss` on a
	 * dual-stack host) names IPv4 peers, and peers and forwarded
	 * addresses in that form are read as IPv4: kept as IPv6, it would
	 * never match. */
	if (out->family == AF_INET6 && out->bits >= 96 &&
	    memcmp(out->addr, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0) {
		memmove(out->addr, out->addr + 12, 4);
		memset(out->addr + 4, 0, sizeof(out->addr) - 4);
		out->family = AF_INET;
		out->bits -= 96;
	}
	return 0;
}

/* Is s a non-empty run of decimal digits? Such a key is most often the
 * rest of a number split at a comma inside { }: "limit: 1,000". */
static int
all_digits(const char *s)
{
	if (*s == '\0')
		return 0;
	for (; *s; s++)
		if (!isdigit((unsigned char)*s))
			return 0;
	return 1;
}

/* --- mapping walker ---------------------------------------------------- */

/* One key of a mapping section: its name and its handler. */
struct key_handler {
	const char *name;
	int (*fn)(struct loader *, const struct node *, const char *, void *);
};

/* Dispatches each key of mapping `map` through `table`; unknown keys and
 * duplicates are errors. `seen` receives a bit per table entry present. */
static void
walk_mapping(struct loader *ld, const struct node *map, const char *where,
    const struct key_handler *table, void *target, unsigned long *seen)
{
	*seen = 0;
	if (map->type != NODE_MAPPING) {
		char advice[128];
		const char *glued = map->type == NODE_SCALAR && map->plain ?
		    yamldoc_glued_key_advice(map->value, advice, sizeof(advice)) : NULL;

		node_error(ld, map, "%s: expected a mapping, got %s%s%s%s", where,
		    node_type_name(map), glued ? " (" : "", glued ? glued : "",
		    glued ? ")" : "");
		return;
	}
	for (size_t i = 0; i + 1 < map->nitems; i += 2) {
		const struct node *k = map->items[i], *v = map->items[i + 1];
		size_t j;

		if (k->type != NODE_SCALAR) {
			node_error(ld, k, "%s: keys must be plain names", where);
			continue;
		}
		for (j = 0; table[j].name; j++)
			if (strcmp(table[j].name, k->value) == 0)
				break;
		if (table[j].name == NULL) {
			char known[512] = "";

			for (size_t t = 0; table[t].name; t++) {
				strncat(known, t ? ", " : "", sizeof(known) - strlen(known) - 1);
				strncat(known, table[j = t].name, sizeof(known) - strlen(known) - 1);
			}
			node_error(ld, k, "%s: unknown key \"%s\" (expected one of: %s%s)",
			    where, echo(ld, k->value), known, all_digits(k->value) ?
			    "; a number takes no thousands separator: 1000, not 1,000" :
			    /* never a secret in the file, which -t, logs and
			     * ConfigMaps show */
			    strcmp(k->value, "password") == 0 && strcmp(where, "redis") == 0 ?
			    "; the password is read from the environment: name the "
			    "variable in password_env" : "");
			continue;
		}
		if (*seen & (1UL << j)) {
			node_error(ld, k, "%s: duplicate key \"%s\"", where, k->value);
			continue;
		}
		*seen |= 1UL << j;
		table[j].fn(ld, v, k->value, target);
	}
}

static int
valid_name(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > CONFIG_NAME_MAX)
		return 0;
	for (const char *p = s; *p; p++)
		if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-' && *p != '.')
			return 0;
	return 1;
}

/* --- server ------------------------------------------------------------- */

/* A DNS name (underscores too: container names have them) or an IPv4
 * address: what a resolver takes. */
static int
hostname_ok(const char *s, size_t len)
{
	if (len == 0 || s[0] == '-')
		return 0;
	for (size_t i = 0; i < len; i++)
		if (!isalnum((unsigned char)s[i]) && s[i] != '.' && s[i] != '-' &&
		    s[i] != '_')
			return 0;
	return 1;
}

static int
validate_listen(const char *s, const char **cause)
{
	const char *colon;
	char *end;
	long port;

	if (strncmp(s, "unix:", 5) == 0) {
		if (s[5] != '/') {
			*cause = "unix socket path must be absolute (unix:/path)";
			return -1;
		}
		if (strlen(s + 5) >= 108) {
			*cause = "unix socket path is too long";
			return -1;
		}
		return 0;
	}
	if (s[0] == '[') {
		const char *close = strchr(s, ']');
		char host[INET6_ADDRSTRLEN];
		unsigned char tmp[16];
		size_t hl;

		if (close == NULL || close[1] != ':') {
			*cause = "expected [ipv6]:port";
			return -1;
		}
		hl = (size_t)(close - s - 1);
		if (hl >= sizeof(host)) {
			*cause = "bad IPv6 address";
			return -1;
		}
		memcpy(host, s + 1, hl);
		host[hl] = '\0';
		if (inet_pton(AF_INET6, host, tmp) != 1) {
			*cause = "bad IPv6 address";
			return -1;
		}
		colon = close + 1;
	} else if (strstr(s, "://") != NULL) {
		*cause = "a URL is not an address: use host:port, [ipv6]:port or "
		    "unix:/path";
		return -1;
	} else {
		colon = strrchr(s, ':');
		if (colon == NULL || colon == s) {
			*cause = "expected host:port, [ipv6]:port or unix:/path";
			return -1;
		}
		if (memchr(s, ':', (size_t)(colon - s)) != NULL) {
			*cause = "IPv6 addresses need brackets: [addr]:port";
			return -1;
		}
		/* Else it fails only at the first connection, as "cannot
		 * resolve". Underscores are allowed: container names; and "*",
		 * which getaddrinfo reads as every address, as nginx does. */
		if (!(colon == s + 1 && s[0] == '*') && !hostname_ok(s, (size_t)(colon - s))) {
			*cause = "the host must be a name or an address";
			return -1;
		}
	}
	if (colon[1] == '\0') {
		*cause = "the port is missing after the last ':'";
		return -1;
	}
	errno = 0;
	port = strtol(colon + 1, &end, 10);
	/* strtol takes a leading space or sign, which no other reader of
	 * the address (nginx, redis-cli) would */
	if (!isdigit((unsigned char)colon[1]) || *end != '\0') {
		*cause = "the port must be written in digits alone, with no "
		    "space or sign";
		return -1;
	}
	if (errno || port < 1 || port > 65535) {
		*cause = "port must be from 1 to 65535";
		return -1;
	}
	return 0;
}

static int
on_address(struct loader *ld, const struct node *nd, const char *key, char **out)
{
	const char *cause;

	if (get_string(ld, nd, key, out) == -1)
		return -1;
	/* redis://user:secret@host: not echoed, it holds a password (an @
	 * in a unix:/path is just a name) */
	if (strncmp(*out, "unix:", 5) != 0 && strchr(*out, '@') != NULL) {
		node_error(ld, nd, "%s: %s with credentials is not an address (the "
		    "value is not repeated here): use host:port, [ipv6]:port or "
		    "unix:/path%s", key, strstr(*out, "://") ? "a URL" : "a user@host",
		    strcmp(key, "address") == 0 ? ", with redis.username and "
		    "redis.password_env" : "");
		return -1;
	}
	if (validate_listen(*out, &cause) == -1) {
		node_error(ld, nd, "%s: \"%s\": %s", key, echo(ld, *out), cause);
		return -1;
	}
	return 0;
}

static int
on_listen(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	struct config *c = t;

	/* -t resolves it only after loading, and says where it is. */
	c->listen_line = nd->line;
	c->listen_col = nd->col;
	return on_address(ld, nd, key, &c->listen);
}

static int
on_workers(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	struct config *c = t;
	long long v;

	if (nd->type == NODE_SCALAR && strcmp(nd->value, "auto") == 0) {
		c->workers = 0;	/* resolved to the core count at startup */
		return 0;
	}
	if (nd->type == NODE_SCALAR && nd->value[0] != '\0' &&
	    !isdigit((unsigned char)nd->value[0]) && nd->value[0] != '-' &&
	    nd->value[0] != '+') {
		node_error(ld, nd, "%s: expected a number of threads (1 to %d) or "
		    "auto, got \"%s\"", key, CONFIG_WORKERS_MAX, echo(ld, nd->value));
		return -1;
	}
	if (get_int(ld, nd, key, 1, CONFIG_WORKERS_MAX, &v) == -1)
		return -1;
	c->workers = (int)v;
	return 0;
}

static int
get_status(struct loader *ld, const struct node *nd, const char *key, int *out)
{
	long long v;

	if (get_int(ld, nd, key, 400, 599, &v) == -1)
		return -1;
	*out = (int)v;
	return 0;
}

static int
on_deny_status(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return get_status(ld, nd, key, &((struct config *)t)->deny_status);
}

static int
on_ietf(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return get_bool(ld, nd, key, &((struct config *)t)->ietf_headers);
}

static int
on_idle_timeout(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return get_duration(ld, nd, key, &((struct config *)t)->idle_timeout_us);
}

static int
on_drain_timeout(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return get_duration(ld, nd, key, &((struct config *)t)->drain_timeout_us);
}

static int
on_max_connections(struct loader *ld, const struct node *nd, const char *key,
    void *t)
{
	return get_int(ld, nd, key, 1, CONFIG_CONNECTIONS_MAX,
	    &((struct config *)t)->max_connections);
}

static const struct key_handler server_keys[] = {
	{ "listen", on_listen },
	{ "workers", on_workers },
	{ "deny_status", on_deny_status },
	{ "ietf_headers", on_ietf },
	{ "idle_timeout", on_idle_timeout },
	{ "drain_timeout", on_drain_timeout },
	{ "max_connections", on_max_connections },
	{ NULL, NULL },
};

/* --- redis -------------------------------------------------------------- */

static int
on_redis_address(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return on_address(ld, nd, key, &((struct config *)t)->redis_address);
}

static int
on_redis_database(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	long long v;

	if (get_int(ld, nd, key, 0, 65535, &v) == -1)
		return -1;
	((struct config *)t)->redis_database = (int)v;
	return 0;
}

static int
on_redis_username(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	struct config *c = t;

	if (node_is_null(nd)) {
		free(c->redis_username);
		c->redis_username = NULL;
		return 0;
	}
	return get_string(ld, nd, key, &c->redis_username);
}

static int
on_redis_password_env(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	struct config *c = t;
	const char *name;
	int ok;

	if (node_is_null(nd)) {
		free(c->redis_password_env);
		c->redis_password_env = NULL;
		return 0;
	}
	if (get_string(ld, nd, key, &c->redis_password_env) == -1)
		return -1;
	/* what a shell, systemd's Environment= or a container spec can set */
	name = c->redis_password_env;
	ok = *name != '\0' && !isdigit((unsigned char)*name);
	for (const char *p = name; ok && *p; p++)
		ok = isalnum((unsigned char)*p) || *p == '_';
	if (!ok) {
		/* Not echoed: what was put here instead of a name is most
		 * likely the password itself. */
		node_error(ld, nd, "%s: the value is not an environment variable name "
		    "(A-Z a-z 0-9 _, not starting with a digit) and is not repeated "
		    "here, as it may be a password: give the name of the variable "
		    "that holds the password", key);
		return -1;
	}
	return 0;
}

static int
on_redis_timeout(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return get_duration(ld, nd, key, &((struct config *)t)->redis_timeout_us);
}

static int
on_redis_connect_timeout(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return get_duration(ld, nd, key,
	    &((struct config *)t)->redis_connect_timeout_us);
}

static int
on_redis_max_batch(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	long long v;

	if (get_int(ld, nd, key, 1, CONFIG_BATCH_MAX, &v) == -1)
		return -1;
	((struct config *)t)->redis_max_batch = (int)v;
	return 0;
}

static int
on_key_prefix(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	struct config *c = t;

	if (nd->type == NODE_SCALAR && !node_is_null(nd) &&
	    (strchr(nd->value, '{') || strchr(nd->value, '}'))) {
		node_error(ld, nd, "%s: must not contain { or } (the hash tag is ours)", key);
		return -1;
	}
	if (nd->type == NODE_SCALAR && nd->value[0] == '\0' && !nd->plain) {
		free(c->key_prefix);
		c->key_prefix = xstrdup("");
		return 0;
	}
	return get_string(ld, nd, key, &c->key_prefix);
}

static const struct key_handler redis_keys[] = {
	{ "address", on_redis_address },
	{ "database", on_redis_database },
	{ "username", on_redis_username },
	{ "password_env", on_redis_password_env },
	{ "timeout", on_redis_timeout },
	{ "connect_timeout", on_redis_connect_timeout },
	{ "max_batch", on_redis_max_batch },
	{ "key_prefix", on_key_prefix },
	{ NULL, NULL },
};

/* --- log ---------------------------------------------------------------- */

static int
get_enum(struct loader *ld, const struct node *nd, const char *key,
    const char *const *names, int *out)
{
	char list[256] = "";

	if (want_scalar(ld, nd, key) == -1)
		return -1;
	for (int i = 0; names[i]; i++) {
		if (strcmp(names[i], nd->value) == 0) {
			*out = i;
			return 0;
		}
		strncat(list, i ? ", " : "", sizeof(list) - strlen(list) - 1);
		strncat(list, names[i], sizeof(list) - strlen(list) - 1);
	}
	node_error(ld, nd, "%s: \"%s\" is not one of: %s", key,
	    echo(ld, nd->value), list);
	return -1;
}

static int
on_log_level(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	static const char *const names[] = { "error", "warn", "info", "debug", NULL };

	return get_enum(ld, nd, key, names, &((struct config *)t)->log_level);
}

static int
on_log_format(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	static const char *const names[] = { "text", "json", NULL };

	return get_enum(ld, nd, key, names, &((struct config *)t)->log_format);
}

static int
on_log_access(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return get_bool(ld, nd, key, &((struct config *)t)->log_access);
}

static const struct key_handler log_keys[] = {
	{ "level", on_log_level },
	{ "format", on_log_format },
	{ "access", on_log_access },
	{ NULL, NULL },
};

/* --- limits --------------------------------------------------------------- */

/* A limit as read, before its algorithm's parameters are checked. */
struct limit_draft {
	struct limit	 l;
	const struct node *node;
	char		 where[32];	/* "limits[N]", what messages call it */
	int		 has_algorithm;
	const struct node *name_nd, *limit_nd, *window_nd, *precision_nd,
			 *rate_nd, *burst_nd, *delay_nd;
};

static int
on_limit_name(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	struct limit_draft *d = t;

	d->name_nd = nd;
	if (get_string(ld, nd, key, &d->l.name) == -1)
		return -1;
	if (!valid_name(d->l.name)) {
		node_error(ld, nd, "%s: \"%s\" must be 1-%d characters of "
		    "A-Z a-z 0-9 _ - .", key, echo(ld, d->l.name), CONFIG_NAME_MAX);
		return -1;
	}
	return 0;
}

static int
on_limit_algorithm(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	static const char *const names[] = { "fixed_window", "token_bucket",
	    "sliding_window_log", "sliding_window_counter", "leaky_bucket",
	    "gcra", NULL };
	struct limit_draft *d = t;
	int v;

	if (get_enum(ld, nd, key, names, &v) == -1)
		return -1;
	d->l.algorithm = (enum algorithm)v;
	d->has_algorithm = 1;
	return 0;
}

#define DRAFT_NODE(field)						\
static int								\
on_limit_##field(struct loader *ld, const struct node *nd,		\
    const char *key, void *t)						\
{									\
	(void)ld; (void)key;						\
	((struct limit_draft *)t)->field##_nd = nd;			\
	return 0;							\
}
DRAFT_NODE(limit)
DRAFT_NODE(window)
DRAFT_NODE(precision)
DRAFT_NODE(rate)
DRAFT_NODE(burst)
DRAFT_NODE(delay)

static const struct key_handler limit_keys[] = {
	{ "name", on_limit_name },
	{ "algorithm", on_limit_algorithm },
	{ "limit", on_limit_limit },
	{ "window", on_limit_window },
	{ "precision", on_limit_precision },
	{ "rate", on_limit_rate },
	{ "burst", on_limit_burst },
	{ "delay", on_limit_delay },
	{ NULL, NULL },
};

/* Which of precision's three rules it breaks, in the user's words. */
static void
precision_error(struct loader *ld, const struct limit_draft *d,
    const struct limit *l)
{
	const char *p = echo(ld, d->precision_nd->value);
	const char *w = d->window_nd->value;

	if (l->precision_us < US_PER_MS)
		node_error(ld, d->precision_nd, "precision: %s is under the 1ms "
		    "minimum", p);
	else if (l->precision_us > l->window_us)
		node_error(ld, d->precision_nd, "precision: %s is longer than the "
		    "window, %s", p, w);
	else if (l->window_us % l->precision_us != 0)
		node_error(ld, d->precision_nd, "precision: %s does not divide the "
		    "window, %s, evenly: the window must be a whole number of "
		    "buckets", p, w);
	else
		node_error(ld, d->precision_nd, "precision: %s makes %lld buckets "
		    "of the window, %s; at most %d, so at least %lldms",  p,
		    l->window_us / l->precision_us, w, SLIDING_BUCKETS_MAX,
		    (l->window_us / SLIDING_BUCKETS_MAX + US_PER_MS - 1) / US_PER_MS);
}

/* The key node of a value in map: where an unknown key is reported, so
 * a key that does not belong is reported there too. */
static const struct node *
key_of(const struct node *map, const struct node *value)
{
	for (size_t j = 1; j < map->nitems; j += 2)
		if (map->items[j] == value)
			return map->items[j - 1];
	return value;
}

/* Checks the parameters of a limit against its algorithm; 0 when valid. */
static int
limit_finish(struct loader *ld, struct limit_draft *d)
{
	struct limit *l = &d->l;
	const char *alg = algorithm_names[l->algorithm];
	const char *cause;
	int bad = 0, window_alg = !config_algorithm_is_bucket(l->algorithm);

#define FORBID(field, label)						\
	if (d->field##_nd) {						\
		node_error(ld, key_of(d->node, d->field##_nd),		\
		    "%s: not a parameter of %s", label, alg);		\
		bad = 1;						\
	}
#define REQUIRE(field, label)						\
	if (d->field##_nd == NULL) {					\
		node_error(ld, d->node, "%s: %s requires \"%s\"", d->where, alg, \
		    label);						\
		bad = 1;						\
	}

	if (window_alg) {
		REQUIRE(limit, "limit")
		REQUIRE(window, "window")
		FORBID(rate, "rate")
		FORBID(burst, "burst")
		FORBID(delay, "delay")
		if (l->algorithm != ALGORITHM_SLIDING_WINDOW_COUNTER)
			FORBID(precision, "precision")
		if (d->limit_nd && get_int(ld, d->limit_nd, "limit", 1, QUOTA_MAX,
		    &l->quota) == -1)
			bad = 1;
		else if (d->limit_nd && l->algorithm == ALGORITHM_SLIDING_WINDOW_LOG &&
		    l->quota > SLIDING_LOG_MAX) {
			node_error(ld, d->limit_nd, "limit: sliding_window_log keeps "
			    "one entry per request unit, so at most %d (use "
			    "sliding_window_counter for larger limits)", SLIDING_LOG_MAX);
			bad = 1;
		}
		if (d->window_nd && get_duration(ld, d->window_nd, "window",
		    &l->window_us) == -1)
			bad = 1;
		if (l->algorithm == ALGORITHM_SLIDING_WINDOW_COUNTER && !bad) {
			if (d->precision_nd) {
				if (get_duration(ld, d->precision_nd, "precision",
				    &l->precision_us) == -1)
					return -1;
			} else
				l->precision_us = l->window_us / 10;
			if (l->precision_us < US_PER_MS ||
			    l->window_us % l->precision_us != 0 ||
			    l->window_us / l->precision_us > SLIDING_BUCKETS_MAX) {
				if (d->precision_nd)
					precision_error(ld, d, l);
				/*
				 * The user never wrote a precision, so say this
				 * one is the default. Windows are whole ms, so
				 * window/10 always divides them into 10 buckets
				 * and can only fail by being under 1ms.
				 */
				else
					node_error(ld, d->node, "precision: the "
					    "default, window/10 = %lld.%lldms, is under "
					    "the 1ms minimum; set precision (1ms or "
					    "more, dividing the window evenly) or use "
					    "a window of 10ms or more",
					    l->precision_us / US_PER_MS,
					    l->precision_us % US_PER_MS / 100);
				bad = 1;
			}
		}
	} else {
		REQUIRE(rate, "rate")
		REQUIRE(burst, "burst")
		FORBID(limit, "limit")
		FORBID(window, "window")
		FORBID(precision, "precision")
		if (l->algorithm != ALGORITHM_LEAKY_BUCKET)
			FORBID(delay, "delay")
		if (d->burst_nd && get_int(ld, d->burst_nd, "burst", 1, QUOTA_MAX,
		    &l->quota) == -1)
			bad = 1;
		if (d->rate_nd) {
			if (want_scalar(ld, d->rate_nd, "rate") == -1)
				bad = 1;
			else if (rate_parse(d->rate_nd->value, &l->rate_n,
			    &l->rate_period_us, &cause) == -1) {
				char advice[64] = "";

				/* the count parsed (into rate_n) before the period */
				if (duration_cause_is_fraction(cause))
					duration_fraction_advice(advice, sizeof(advice),
					    strchr(d->rate_nd->value, '/') + 1,
					    l->rate_n);
				node_error(ld, d->rate_nd, "rate: \"%s\": %s%s",
				    echo(ld, d->rate_nd->value), cause, advice);
				bad = 1;
			}
		}
		if (!bad && l->rate_n > 0) {
			long long a = l->rate_n, b = l->rate_period_us;

			while (b) {
				long long t = a % b;

				a = b;
				b = t;
			}
			/* The scripts keep bucket state as exact fractions in
			 * Lua doubles: burst * period / gcd must stay below 2^53. */
			if ((long double)l->quota * (long double)(l->rate_period_us / a) >=
			    9007199254740992.0L) {
				node_error(ld, d->burst_nd, "burst: %lld with rate \"%s\" is "
				    "too large to count exactly; use a smaller burst or a "
				    "rate over a shorter period", l->quota,
				    echo(ld, d->rate_nd->value));
				bad = 1;
			}
		}
		l->delay = l->algorithm == ALGORITHM_LEAKY_BUCKET;
		if (d->delay_nd && get_bool(ld, d->delay_nd, "delay", &l->delay) == -1)
			bad = 1;
		if (!bad && l->delay && !ld->in_shadow_route && l->rate_n > 0 &&
		    (long double)(l->quota - 1) * l->rate_period_us / l->rate_n >
		    LEAKY_HOLD_WARN_US) {
			/* A gateway gives up on its check long before that:
			 * Envoy's ext_authz after 200ms by default */
			long double hold_s = (long double)(l->quota - 1) *
			    l->rate_period_us / l->rate_n / US_PER_S;

			warnf(ld, d->node, "leaky_bucket with delay: true holds the "
			    "last of a burst %.1Lfs before it answers; the gateway's "
			    "timeout for the check must be longer (conf/nginx.conf "
			    "waits 5s), or use delay: false", hold_s);
		}
	}
#undef FORBID
#undef REQUIRE
	return bad ? -1 : 0;
}

static void
limit_set_free(struct limit_set *set)
{
	for (size_t i = 0; i < set->nlimits; i++)
		free(set->limits[i].name);
	free(set->limits);
	set->limits = NULL;
	set->nlimits = 0;
}

/* Reads a list of limits into `set`; names default to the algorithm. */
static int
parse_limits(struct loader *ld, const struct node *nd, struct limit_set *set)
{
	/* Per item of the list, accepted or refused, its name and where it
	 * is (the name node, or the mapping when unnamed), so that a name
	 * used twice is reported along with whatever else is wrong with
	 * either limit. A refused limit's name is owned here. */
	struct {
		const char		*name;
		const struct node	*at;
		char			*refused;
	} *named;
	int bad = 0;
	size_t nitems;

	if (nd->type != NODE_SEQUENCE) {
		node_error(ld, nd, "limits: expected a list, got %s", node_type_name(nd));
		return -1;
	}
	if (nd->nitems == 0) {
		node_error(ld, nd, "limits: must not be empty");
		return -1;
	}
	/* Over the cap: said, and the limits past it still read (up to
	 * LIMITS_READ_MAX), so that what else is wrong in them is said in the
	 * same run: they are to be cut or moved, not fixed first and found
	 * wrong after. */
	if (nd->nitems > CONFIG_LIMITS_MAX) {
		node_error(ld, nd->items[CONFIG_LIMITS_MAX], "limits[%d]: one too "
		    "many: at most %d limits per route, and this route has %zu",
		    CONFIG_LIMITS_MAX, CONFIG_LIMITS_MAX, nd->nitems);
		bad = 1;
	}
	nitems = nd->nitems > LIMITS_READ_MAX ? LIMITS_READ_MAX : nd->nitems;
	set->limits = xcalloc(nitems, sizeof(*set->limits));
	named = xcalloc(nitems, sizeof(*named));
	for (size_t i = 0; i < nitems; i++) {
		struct limit_draft d;
		struct limit *l;
		unsigned long seen;
		size_t nerr = ld->errors->n;
		int seq = 1;

		memset(&d, 0, sizeof(d));
		d.node = nd->items[i];
		snprintf(d.where, sizeof(d.where), "limits[%zu]", i);
		walk_mapping(ld, d.node, d.where, limit_keys, &d, &seen);
		if (d.node->type != NODE_MAPPING) {
			bad = 1;
			continue;
		}
		if (!d.has_algorithm) {
			if (ld->errors->n == nerr)
				node_error(ld, d.node, "%s: \"algorithm\" is required",
				    d.where);
		}
		if (!d.has_algorithm || limit_finish(ld, &d) == -1 ||
		    ld->errors->n != nerr) {
			if (d.l.name && d.name_nd) {
				named[i].name = named[i].refused = d.l.name;
				named[i].at = d.name_nd;
			} else
				free(d.l.name);
			bad = 1;
			continue;
		}
		l = &set->limits[set->nlimits];
		*l = d.l;
		/* Unnamed: the algorithm, then -2, -3... on repeats. */
		for (size_t j = 0; l->name == NULL && j < set->nlimits; j++)
			if (set->limits[j].algorithm == l->algorithm)
				seq++;
		if (l->name == NULL)
			l->name = seq == 1 ? xstrdup(algorithm_names[l->algorithm]) :
			    xasprintf("%s-%d", algorithm_names[l->algorithm], seq);
		named[i].name = l->name;
		named[i].at = d.name_nd ? d.name_nd : d.node;
		set->nlimits++;
		if (l->quota > set->max_quota)
			set->max_quota = l->quota;
	}
	/* Reported at the later of the two, as duplicate route names are. */
	for (size_t i = 0; i < nitems; i++)
		for (size_t j = 0; named[i].name && j < i; j++)
			if (named[j].name && strcmp(named[i].name, named[j].name) == 0) {
				node_error(ld, named[i].at, "limits: two limits are named "
				    "\"%s\" (%sthe first at %d:%d)", named[i].name,
				    named[i].at->type == NODE_MAPPING ? "this one by "
				    "default, after its algorithm; " : "", named[j].at->line,
				    named[j].at->col);
				bad = 1;
				break;
			}
	/* A name given by place moves with the list: a limit of the same
	 * algorithm added above takes it, and the count with it (an hourly
	 * fixed_window became fixed_window-2 and started from zero, while a
	 * new daily one took its count). Said where that can happen. */
	for (size_t i = 0; !bad && i < set->nlimits; i++) {
		const struct limit *l = &set->limits[i];

		if (named[i].at->type != NODE_MAPPING)
			continue;	/* named in the file */
		for (size_t j = 0; j < set->nlimits; j++)
			if (j != i && set->limits[j].algorithm == l->algorithm) {
				warnf(ld, named[i].at, "limits[%zu]: named \"%s\" "
				    "by its place among this list's %s limits, so a "
				    "%s limit added above it takes that name and its "
				    "count: give each a name", i, l->name,
				    algorithm_names[l->algorithm],
				    algorithm_names[l->algorithm]);
				break;
			}
	}
	for (size_t i = 0; i < nitems; i++)
		free(named[i].refused);
	free(named);
	return bad ? -1 : 0;
}

/* --- routes ------------------------------------------------------------- */

/* A route being read: the route and the nodes checked after the walk. */
struct route_draft {
	struct route	 r;
	const struct node *node, *name_nd, *limits_nd;
	int		 path_fields;
};

static int
on_route_name(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	struct route_draft *d = t;

	d->name_nd = nd;
	if (get_string(ld, nd, key, &d->r.name) == -1)
		return -1;
	if (!valid_name(d->r.name)) {
		node_error(ld, nd, "%s: \"%s\" must be 1-%d characters of "
		    "A-Z a-z 0-9 _ - .", key, echo(ld, d->r.name), CONFIG_NAME_MAX);
		return -1;
	}
	return 0;
}

/*
 * "//" and whole "." and ".." segments are gone from every normalized
 * request path, so a match value with one can never match. A prefix's
 * last segment may be partial: "/." starts "/.env", "/static/.." starts
 * "/static/..foo".
 */
static int
has_dead_segment(const char *path, int whole_last)
{
	const char *seg = path + 1;

	for (;;) {
		const char *slash = strchr(seg, '/');
		size_t len = slash ? (size_t)(slash - seg) : strlen(seg);
		int dots = (len == 1 && seg[0] == '.') ||
		    (len == 2 && seg[0] == '.' && seg[1] == '.');

		if (slash == NULL)
			return whole_last && dots;
		if (len == 0 || dots)
			return 1;
		seg = slash + 1;
	}
}

/* The form to write: as requests are normalized, with no query. A
 * prefix's last segment may be partial, so it is normalized with a
 * sentinel letter after it that no "." or ".." resolution can take away,
 * and the letter is dropped again. */
static char *
suggested_path(const char *path, enum path_match kind)
{
	size_t n = strcspn(path, "?#");
	char *probe = xmalloc(n + 2), *out = xmalloc(n + 3);
	const char *query;

	memcpy(probe, path, n);
	probe[n] = kind == PATH_PREFIX ? 'x' : '\0';
	probe[n + 1] = '\0';
	policy_normalize_uri(probe, out, n + 3, &query);
	if (kind == PATH_PREFIX)
		out[strlen(out) - 1] = '\0';
	free(probe);
	return out;
}

/* `s` as it can be pasted back into the file: valid UTF-8 as it is ("/café",
 * not "/caf\xc3\xa9", which a double-quoted YAML string reads as two
 * other characters), anything else escaped as echo() does. */
static const char *
echo_pastable(struct loader *ld, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	while (*p) {
		size_t n = *p < 0x80 ? 1 : (*p & 0xe0) == 0xc0 ? 2 :
		    (*p & 0xf0) == 0xe0 ? 3 : (*p & 0xf8) == 0xf0 ? 4 : 0;

		if (n == 0 || (n == 1 && (*p < 0x20 || *p == 0x7f || *p == '"' ||
		    *p == '\\')) || (n == 2 && *p < 0xc2))
			return echo(ld, s);
		for (size_t i = 1; i < n; i++)
			if ((p[i] & 0xc0) != 0x80)
				return echo(ld, s);
		p += n;
	}
	return s;
}

/* A path or prefix that no request can match is an error; one that only a
 * request encoding it twice can match (a percent-escape, ? or #: requests
 * are matched percent-decoded, without their query) is a warning. */
static int
check_match_path(struct loader *ld, const struct node *nd, const char *key,
    const char *path, enum path_match kind)
{
	char *suggest;
	const char *star;
	int dead = has_dead_segment(path, kind == PATH_EXACT);
	int encoded = strpbrk(path, "?#") != NULL;

	for (const char *p = strchr(path, '%'); p && !encoded; p = strchr(p + 1, '%'))
		encoded = isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2]) &&
		    !(p[1] == '0' && p[2] == '0');
	/* A glob ("/api/" then a star) as Traefik would mean it: a star is itself
	 * and matches only a path with a '*' in it. */
	if (!dead && (star = strchr(path, '*')) != NULL) {
		int trailing = star[1] == '\0' && star > path && star[-1] == '/';

		if (trailing)
			warnf(ld, nd, "%s: \"%s\": '*' is no wildcard here, it matches "
			    "only a '*' in the path; for everything under %.*s write "
			    "prefix: \"%.*s\"", key, echo(ld, path), (int)(star - path),
			    path, (int)(star - path), path);
		else
			warnf(ld, nd, "%s: \"%s\": '*' is no wildcard here, it matches "
			    "only a '*' in the path; for a pattern write a regex "
			    "(\"[^/]*\" is one segment)", key, echo(ld, path));
	}
	if (!dead && !encoded)
		return 0;
	suggest = suggested_path(path, kind);
	if (dead)
		node_error(ld, nd, "%s: \"%s\" can never match: requests are matched "
		    "on their normalized path (// merged, . and .. segments "
		    "resolved); write \"%s\"", key, echo(ld, path),
		    echo_pastable(ld, suggest));
	else
		warnf(ld, nd, "%s: \"%s\" matches only a request that encodes it "
		    "twice: requests are matched percent-decoded and without their "
		    "query; did you mean \"%s\"?", key, echo(ld, path),
		    echo_pastable(ld, suggest));
	free(suggest);
	return dead ? -1 : 0;
}

static int
set_path(struct loader *ld, const struct node *nd, const char *key,
    struct route_draft *d, enum path_match kind)
{
	char why[256];
	long long units;
	int anchored;
	size_t n;

	if (++d->path_fields > 1) {
		node_error(ld, nd, "match: use only one of path, prefix and regex");
		return -1;
	}
	if (get_string(ld, nd, key, &d->r.path) == -1)
		return -1;
	d->r.path_kind = kind;
	d->r.path_len = strlen(d->r.path);
	if (kind != PATH_REGEX && d->r.path[0] != '/') {
		node_error(ld, nd, "%s: \"%s\" must start with /", key,
		    echo(ld, d->r.path));
		return -1;
	}
	if (kind != PATH_REGEX && check_match_path(ld, nd, key, d->r.path,
	    kind) == -1)
		return -1;
	if (kind == PATH_REGEX && d->r.path[0] == '\0') {
		/* as an empty host or methods list is: it would match every
		 * path, which leaving match out says plainly */
		node_error(ld, nd, "regex: must not be empty (it would match every "
		    "path): leave \"regex\" out to match any path");
		d->r.path_kind = PATH_ANY;
		return -1;
	}
	if (kind == PATH_REGEX && strlen(d->r.path) > REGEX_MAX_LEN) {
		/* glibc's regcomp takes memory that grows with the square of
		 * the pattern: 6 GB for 120 KB of "(a|b)*", in the process that
		 * serves (a reload compiles there) */
		node_error(ld, nd, "regex: %zu bytes long; at most %d", strlen(d->r.path),
		    REGEX_MAX_LEN);
		d->r.path_kind = PATH_ANY;
		return -1;
	}
	if (kind == PATH_REGEX && rxcheck_refused(d->r.path, why, sizeof(why),
	    &anchored, &units)) {
		node_error(ld, nd, "regex: \"%s\": %s", echo(ld, d->r.path), why);
		d->r.path_kind = PATH_ANY;
		return -1;
	}
	if (kind == PATH_REGEX && ld->regex_units + units > RXCHECK_UNITS_MAX) {
		/* Each regex alone may be fine: a thousand routes of them
		 * took 8 GB and 40 s to load (an audit). */
		node_error(ld, nd, "regex: \"%s\": with the regexes above it, its "
		    "repeat counts would take about %lld MB to compile, and at "
		    "most %lld MB are allowed (a {m,n} costs about the square of "
		    "n-m): use + or * where any count will do", echo(ld,
		    d->r.path), ((ld->regex_units + units) * RXCHECK_BYTES_PER_UNIT +
		    999999) / 1000000, RXCHECK_UNITS_MAX * RXCHECK_BYTES_PER_UNIT / 1000000);
		d->r.path_kind = PATH_ANY;
		return -1;
	}
	if (kind == PATH_REGEX)
		ld->regex_units += units;
	if (kind == PATH_REGEX) {
		int rc = regcomp(&d->r.regex, d->r.path, REG_EXTENDED | REG_NOSUB);

		if (rc != 0) {
			char msg[256];

			regerror(rc, &d->r.regex, msg, sizeof(msg));
			node_error(ld, nd, "regex: \"%s\": %s", echo(ld, d->r.path), msg);
			d->r.path_kind = PATH_ANY;
			return -1;
		}
		if (!anchored) {
			/* glibc tries an unanchored pattern from each byte of
			 * the path in turn: "[a-z]+/x" took 0.4 s on a 16 KiB
			 * path of letters. "^.*(RE)" matches the same paths in
			 * one pass (the same 16 KiB: under 1 ms); '.' is any
			 * byte, as the daemon keeps the C locale. Compiled
			 * after the pattern alone, so that an error above
			 * names what the user wrote. */
			size_t len = strlen(d->r.path) + 6;
			char *wrapped = xmalloc(len);

			snprintf(wrapped, len, "^.*(%s)", d->r.path);
			regfree(&d->r.regex);
			rc = regcomp(&d->r.regex, wrapped, REG_EXTENDED | REG_NOSUB);
			free(wrapped);
			if (rc != 0) {
				char msg[256];

				regerror(rc, &d->r.regex, msg, sizeof(msg));
				node_error(ld, nd, "regex: \"%s\" (searched as "
				    "^.*(...)): %s", echo(ld, d->r.path), msg);
				d->r.path_kind = PATH_ANY;
				return -1;
			}
		} else
			d->r.regex_lead_len = rxcheck_lead(d->r.path,
			    d->r.regex_lead, sizeof(d->r.regex_lead));
		n = rxcheck_needle(d->r.path, d->r.regex_needle,
		    sizeof(d->r.regex_needle) - 1);
		d->r.regex_needle[n > d->r.regex_lead_len ? n : 0] = '\0';
	}
	return 0;
}

static int
on_match_path(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return set_path(ld, nd, key, t, PATH_EXACT);
}

static int
on_match_prefix(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return set_path(ld, nd, key, t, PATH_PREFIX);
}

static int
on_match_regex(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return set_path(ld, nd, key, t, PATH_REGEX);
}

int
config_token_ok(const char *s)
{
	static const char tchar[] = "!#$%&'*+-.^_`|~";

	if (*s == '\0')
		return 0;
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && strchr(tchar, *s) == NULL)
			return 0;
	return 1;
}

/* IANA's HTTP method registry, and PURGE (caches' own). */
static int
method_registered(const char *m)
{
	static const char registered[] = " ACL BASELINE-CONTROL BIND CHECKIN "
	    "CHECKOUT CONNECT COPY DELETE GET HEAD LABEL LINK LOCK MERGE "
	    "MKACTIVITY MKCALENDAR MKCOL MKREDIRECTREF MKWORKSPACE MOVE OPTIONS "
	    "ORDERPATCH PATCH POST PRI PROPFIND PROPPATCH PURGE PUT QUERY REBIND "
	    "REPORT SEARCH TRACE UNBIND UNCHECKOUT UNLINK UNLOCK UPDATE "
	    "UPDATEREDIRECTREF VERSION-CONTROL ";
	size_t n = strlen(m);

	for (const char *p = registered; (p = strstr(p, m)) != NULL; p++)
		if (p[-1] == ' ' && p[n] == ' ')
			return 1;
	return 0;
}

static int
on_match_methods(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	struct route_draft *d = t;
	int bad = 0;

	if (nd->type != NODE_SEQUENCE) {
		node_error(ld, nd, "%s: expected a list of methods", key);
		return -1;
	}
	if (nd->nitems == 0) {
		node_error(ld, nd, "%s: an empty list; leave \"methods\" out to "
		    "match every method", key);
		return -1;
	}
	d->r.methods = xcalloc(nd->nitems, sizeof(char *));
	for (size_t i = 0; i < nd->nitems; i++) {
		char *m = NULL;

		if (get_string(ld, nd->items[i], key, &m) == -1) {
			bad = 1;
			continue;
		}
		if (!config_token_ok(m)) {
			node_error(ld, nd->items[i], "%s: \"%s\" is not an HTTP method",
			    key, echo(ld, m));
			free(m);
			bad = 1;
			continue;
		}
		for (char *p = m; *p; p++)
			*p = (char)toupper((unsigned char)*p);
		/* A misspelt GET matches no GET: the route's requests pass
		 * unlimited, or to a later route, without a word. */
		if (!method_registered(m))
			warnf(ld, nd->items[i], "%s: \"%s\" is no method HTTP "
			    "defines (IANA's registry: GET, HEAD, POST, PUT, PATCH, "
			    "DELETE, OPTIONS, WebDAV's...): only a request that "
			    "sends it matches", key, echo(ld, m));
		d->r.methods[d->r.nmethods++] = m;
	}
	return bad ? -1 : 0;
}

/* What a Host header can say: a name, an IPv4 or [IPv6] address, maybe
 * a port, written as clients write it (no leading zero, which the
 * request's port loses before the two compare). */
static int
match_host_ok(const char *host)
{
	struct host_parts h;
	char v6[INET6_ADDRSTRLEN];
	unsigned char addr[16];
	long port = 0;

	if (host[strcspn(host, ", \t")] != '\0')
		return 0;	/* a request's list would match its first host */
	policy_host_split(host, &h);
	if (host[0] == '[' || memchr(h.name, ':', h.namelen) != NULL) {
		if (h.namelen == 0 || h.namelen >= sizeof(v6))
			return 0;
		memcpy(v6, h.name, h.namelen);
		v6[h.namelen] = '\0';
		if (inet_pton(AF_INET6, v6, addr) != 1)
			return 0;
		if (host[0] == '[' && h.name[h.namelen + 1] != '\0' && h.port == NULL)
			return 0;	/* junk after the ']' */
	} else if (!hostname_ok(h.name, h.namelen))
		return 0;
	if (h.port == NULL)
		return 1;
	if (h.portlen == 0 || h.portlen > 5 || h.port[0] == '0')
		return 0;
	for (size_t i = 0; i < h.portlen; i++) {
		if (!isdigit((unsigned char)h.port[i]))
			return 0;
		port = port * 10 + (h.port[i] - '0');
	}
	return port <= 65535;
}

static int
on_match_host(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	struct route_draft *d = t;

	if (get_string(ld, nd, key, &d->r.host) == -1)
		return -1;
	if (d->r.host[0] == '\0') {
		node_error(ld, nd, "%s: empty; leave \"host\" out to match every "
		    "host", key);
		return -1;
	}
	for (char *p = d->r.host; *p; p++)
		*p = (char)tolower((unsigned char)*p);
	if (!match_host_ok(d->r.host)) {
		int utf8 = 0;

		for (const char *p = d->r.host; *p; p++)
			utf8 |= (unsigned char)*p >= 0x80;
		node_error(ld, nd, "%s: \"%s\" is not a host: give a name or "
		    "address, optionally with :port (no wildcard, scheme or path: "
		    "it is compared whole)%s", key, echo(ld, nd->value), utf8 ?
		    "; write an international name in its xn-- form, as clients "
		    "send it" : "");
		return -1;
	}
	return 0;
}

static const struct key_handler match_keys[] = {
	{ "path", on_match_path },
	{ "prefix", on_match_prefix },
	{ "regex", on_match_regex },
	{ "methods", on_match_methods },
	{ "host", on_match_host },
	{ NULL, NULL },
};

static int
on_route_match(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	unsigned long seen;

	(void)key;
	walk_mapping(ld, nd, "match", match_keys, t, &seen);
	return 0;
}

static int
cookie_name_ok(const char *s)
{
	if (*s == '\0')
		return 0;
	for (; *s; s++)
		if ((unsigned char)*s <= 0x20 || *s == 0x7f || strchr("=;,\"", *s))
			return 0;
	return 1;
}

static int
parse_key_source(struct loader *ld, const struct node *nd, struct key_source *ks)
{
	static const struct { const char *prefix; enum key_source_type type; } named[] = {
		{ "header:", KEY_HEADER }, { "query:", KEY_QUERY }, { "cookie:", KEY_COOKIE },
	};

	if (want_scalar(ld, nd, "key") == -1)
		return -1;
	memset(ks, 0, sizeof(*ks));
	if (strcmp(nd->value, "ip") == 0) {
		ks->type = KEY_IP;
		return 0;
	}
	if (strcmp(nd->value, "global") == 0) {
		ks->type = KEY_GLOBAL;
		return 0;
	}
	for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++) {
		size_t pl = strlen(named[i].prefix);

		if (strncmp(nd->value, named[i].prefix, pl) == 0) {
			/* A header name is a token (RFC 9110 5.1). A cookie
			 * name should be one too, but PHP's "cart[1]" is not,
			 * and browsers send it: refused are only what ends a
			 * name in a Cookie header, so "cookie:a=b" would never
			 * be found. */
			const char *name = nd->value + pl;
			int bad_name = named[i].type == KEY_HEADER ? !config_token_ok(name) :
			    named[i].type == KEY_COOKIE ? !cookie_name_ok(name) :
			    *name == '\0';

			if (bad_name) {
				node_error(ld, nd, "key: \"%s\" needs a valid name after "
				    "\"%s\"", echo(ld, nd->value), named[i].prefix);
				return -1;
			}
			ks->type = named[i].type;
			ks->name = xstrdup(nd->value + pl);
			return 0;
		}
	}
	node_error(ld, nd, "key: \"%s\" is not a key source (ip, header:NAME, "
	    "query:NAME, cookie:NAME, global)", echo(ld, nd->value));
	return -1;
}

/* A source after ip or global (always present), or listed twice, is
 * never the one that gives the key. */
static void
warn_key_sources_unused(struct loader *ld, const struct node *list,
    const struct key_source *ks, size_t n)
{
	for (size_t i = 1; i < n; i++) {
		const struct node *at = list->items[i];

		for (size_t j = 0; j < i; j++) {
			const struct node *before = list->items[j];

			if (ks[j].type == KEY_IP || ks[j].type == KEY_GLOBAL) {
				warnf(ld, at, "key: \"%s\" is never used: \"%s\" (at "
				    "%d:%d) comes first and is always present",
				    echo(ld, at->value), before->value, before->line,
				    before->col);
				break;
			}
			if (ks[j].type == ks[i].type && (ks[i].type == KEY_HEADER ?
			    strcasecmp(ks[j].name, ks[i].name) == 0 :
			    strcmp(ks[j].name, ks[i].name) == 0)) {
				warnf(ld, at, "key: \"%s\" is never used: it is "
				    "listed at %d:%d", echo(ld, at->value),
				    before->line, before->col);
				break;
			}
		}
	}
}

static int
on_route_key(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	struct route_draft *d = t;
	int bad = 0;

	(void)key;
	if (nd->type == NODE_SCALAR) {
		d->r.keys = xcalloc(1, sizeof(*d->r.keys));
		if (parse_key_source(ld, nd, &d->r.keys[0]) == -1)
			return -1;
		d->r.nkeys = 1;
		return 0;
	}
	if (nd->type != NODE_SEQUENCE || nd->nitems == 0) {
		node_error(ld, nd, "key: expected a key source or a non-empty list of them");
		return -1;
	}
	d->r.keys = xcalloc(nd->nitems, sizeof(*d->r.keys));
	for (size_t i = 0; i < nd->nitems; i++) {
		if (parse_key_source(ld, nd->items[i], &d->r.keys[d->r.nkeys]) == -1)
			bad = 1;
		else
			d->r.nkeys++;
	}
	if (!bad)
		warn_key_sources_unused(ld, nd, d->r.keys, d->r.nkeys);
	return bad ? -1 : 0;
}

static int
on_route_missing_key(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	static const char *const names[] = { "deny", "allow", NULL };

	return get_enum(ld, nd, key, names, &((struct route_draft *)t)->r.missing_key_allow);
}

static int
on_route_deny_status(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return get_status(ld, nd, key, &((struct route_draft *)t)->r.deny_status);
}

static int
get_failure_mode(struct loader *ld, const struct node *nd, const char *key,
    enum failure_mode *out)
{
	static const char *const names[] = { "open", "closed", NULL };
	int v;

	if (get_enum(ld, nd, key, names, &v) == -1)
		return -1;
	*out = (enum failure_mode)v;
	return 0;
}

static int
on_route_failure_mode(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return get_failure_mode(ld, nd, key, &((struct route_draft *)t)->r.failure_mode);
}

static int
on_route_shadow(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return get_bool(ld, nd, key, &((struct route_draft *)t)->r.shadow);
}

static int
on_route_limits(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	struct route_draft *d = t;

	(void)key;
	d->limits_nd = nd;
	return parse_limits(ld, nd, &d->r.limits);
}

/* An override being read. */
struct override_draft {
	struct override	 o;
	const struct node *limits_nd, *keys_nd;
	int		 unlimited;
};

static int
on_override_keys(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	struct override_draft *d = t;
	int bad = 0;

	d->keys_nd = nd;
	if (nd->type != NODE_SEQUENCE || nd->nitems == 0) {
		node_error(ld, nd, "%s: expected a non-empty list of client keys", key);
		return -1;
	}
	d->o.keys = xcalloc(nd->nitems, sizeof(char *));
	for (size_t i = 0; i < nd->nitems; i++) {
		char *k = NULL;

		if (get_string(ld, nd->items[i], key, &k) == -1)
			bad = 1;
		else if (k[0] == '\0') {
			node_error(ld, nd->items[i], "%s: an empty key matches no "
			    "client (an empty value is no key)", key);
			free(k);
			bad = 1;
		} else
			d->o.keys[d->o.nkeys++] = k;
	}
	return bad ? -1 : 0;
}

/* A client key of an override, where it was written, and what it is
 * compared as (an address on a route keyed by ip: its canonical form). */
struct override_key_at {
	const char		*key;
	char			*as;
	const struct node	*nd;
};

static int
override_key_cmp(const void *a, const void *b)
{
	const struct override_key_at *x = a, *y = b;
	int c = strcmp(x->as, y->as);

	if (c == 0)
		c = x->nd->line != y->nd->line ? x->nd->line - y->nd->line :
		    x->nd->col - y->nd->col;
	return c;
}

/* The value of a mapping's key, or NULL. */
static const struct node *
mapping_get(const struct node *map, const char *name)
{
	for (size_t j = 0; map->type == NODE_MAPPING && j + 1 < map->nitems; j += 2)
		if (map->items[j]->type == NODE_SCALAR &&
		    strcmp(map->items[j]->value, name) == 0)
			return map->items[j + 1];
	return NULL;
}

/* Two spellings of one address (or of the same non-address text). */
static int
same_address(const char *a, const char *b)
{
	char x[64], y[64];

	if (policy_canonical_ip(128, a, strlen(a), x, sizeof(x)) != 0 ||
	    policy_canonical_ip(128, b, strlen(b), y, sizeof(y)) != 0)
		return strcmp(a, b) == 0;
	return strcmp(x, y) == 0;
}

/* Does an override key that names an IPv6 client (canon, with "/N")
 * have address bits past the prefix, so that it reads as less than the
 * network it names? */
static int
names_less_than_its_network(const char *key, const char *canon)
{
	char whole[64];
	size_t netlen = strcspn(canon, "/");

	return policy_canonical_ip(128, key, strcspn(key, "/"), whole,
	    sizeof(whole)) == 0 && (strlen(whole) != netlen ||
	    memcmp(whole, canon, netlen) != 0);
}

/* A key listed twice in a route's overrides (or an address spelled twice,
 * "::1" and "0:0:0:0:0:0:0:1", on a route keyed by ip): only its first
 * override would ever apply. Read from the nodes as written, so that it is
 * reported with whatever else is wrong in the route; an address is
 * compared as one when the route's keys were read (r->nkeys). */
static void
check_override_keys_unique(struct loader *ld, const struct route *r,
    const struct node *route_nd)
{
	const struct node *overrides_nd = mapping_get(route_nd, "overrides");
	struct override_key_at *all;
	size_t n = 0, k = 0;
	int by_ip = r->nkeys > 0 && policy_route_keys_by_ip(r);

	if (overrides_nd == NULL || overrides_nd->type != NODE_SEQUENCE)
		return;
	for (size_t i = 0; i < overrides_nd->nitems; i++) {
		const struct node *keys_nd = mapping_get(overrides_nd->items[i], "keys");

		if (keys_nd && keys_nd->type == NODE_SEQUENCE)
			n += keys_nd->nitems;
	}
	if (n < 2)
		return;
	all = xcalloc(n, sizeof(*all));
	for (size_t i = 0; i < overrides_nd->nitems; i++) {
		const struct node *keys_nd = mapping_get(overrides_nd->items[i], "keys");

		for (size_t j = 0; keys_nd && keys_nd->type == NODE_SEQUENCE &&
		    j < keys_nd->nitems; j++) {
			const struct node *key_nd = keys_nd->items[j];
			const char *key = key_nd->value;
			char canon[64];

			/* (one that is not a string, or empty, has its error) */
			if (key_nd->type != NODE_SCALAR || key == NULL || *key == '\0')
				continue;
			all[k].key = key;
			all[k].as = xstrdup(by_ip && policy_canonical_ip(
			    ld->client_ipv6_prefix, key, strlen(key), canon,
			    sizeof(canon)) == 0 ? canon : key);
			all[k++].nd = key_nd;
		}
	}
	n = k;
	qsort(all, n, sizeof(*all), override_key_cmp);
	for (size_t i = 1; i < n; i++)
		if (strcmp(all[i].as, all[i - 1].as) == 0) {
			size_t first = i - 1;

			while (first > 0 && strcmp(all[first - 1].as, all[i].as) == 0)
				first--;
			node_error(ld, all[i].nd, "overrides: client key \"%s\" is "
			    "already listed at %d:%d%s; only its first override "
			    "would apply", echo(ld, all[i].key), all[first].nd->line,
			    all[first].nd->col, strcmp(all[i].key, all[first].key) == 0 ?
			    "" : same_address(all[i].key, all[first].key) ?
			    " (the same address)" : " (the same client: "
			    "client_ipv6_prefix counts the addresses of a network "
			    "as one)");
		}
	for (size_t i = 0; i < n; i++)
		free(all[i].as);
	free(all);
}

/* Override keys no client can have, on a route keyed by global (its one
 * client is "*") or by ip (a client is one address: not a range, and on
 * a route keyed by ip alone, no other value but "unix"). They load, as
 * harmless, but are surely not meant. */
static void
warn_override_keys_unmatched(struct loader *ld, const struct route *r,
    const struct node *route_nd)
{
	const struct node *overrides_nd = mapping_get(route_nd, "overrides");
	int by_ip = policy_route_keys_by_ip(r);
	int ip_alone = policy_route_keys_by_ip_alone(r);
	int global = r->nkeys > 0 && r->keys[0].type == KEY_GLOBAL;

	for (size_t i = 0; overrides_nd && i < r->noverrides; i++) {
		const struct node *keys_nd = mapping_get(overrides_nd->items[i], "keys");

		for (size_t j = 0; keys_nd && j < r->overrides[i].nkeys; j++) {
			const char *key = r->overrides[i].keys[j];
			char canon[64];
			struct cidr range;
			int client = policy_canonical_ip(ld->client_ipv6_prefix,
			    key, strlen(key), canon, sizeof(canon)) == 0;

			if (global && strcmp(key, "*") != 0)
				warnf(ld, keys_nd->items[j], "overrides: \"%s\" never "
				    "applies: route \"%s\" is keyed by global, one "
				    "client for every request", echo(ld, key), r->name);
			/* An address with bits past the prefix is its whole
			 * network's: more than it says. */
			else if (by_ip && client && strchr(canon, '/') &&
			    names_less_than_its_network(key, canon))
				warnf(ld, keys_nd->items[j], "overrides: \"%s\" "
				    "applies to every address of %s "
				    "(client_ipv6_prefix: %d counts them as one client)",
				    echo(ld, key), canon, ld->client_ipv6_prefix);
			else if (by_ip && !client && strchr(key, '/') &&
			    config_parse_cidr(key, &range) == 0) {
				char advice[160] = "list its addresses";

				if (range.family == AF_INET6 &&
				    ld->client_ipv6_prefix < 128 &&
				    range.bits == ld->client_ipv6_prefix)
					snprintf(advice, sizeof(advice), "each of "
					    "its addresses is a client whole (an "
					    "IPv4 host written in IPv6, ::1, a "
					    "link-local address): list them");
				else if (range.family == AF_INET6 &&
				    ld->client_ipv6_prefix < 128)
					snprintf(advice, sizeof(advice), "here an "
					    "IPv6 client is a /%d network "
					    "(client_ipv6_prefix), written as its "
					    "address and /%d: list those",
					    ld->client_ipv6_prefix,
					    ld->client_ipv6_prefix);
				warnf(ld, keys_nd->items[j], "overrides: \"%s\" is "
				    "a range, and a key is one client: %s",
				    echo(ld, key), advice);
			}
			else if (ip_alone && strcmp(key, "unix") != 0 && !client)
				warnf(ld, keys_nd->items[j], "overrides: \"%s\" applies "
				    "to no request: route \"%s\" is keyed by ip, and it "
				    "is not an IP address (only a /v1/check that names it "
				    "as the key gets it)", echo(ld, key), r->name);
			/* HTTP strips a header value's surrounding spaces and
			 * tabs, and an address has none: such a key matched
			 * nothing, silently. (A query value may carry them.) */
			else if (!(by_ip && client) && *key != '\0' &&
			    (*key == ' ' || *key == '\t' ||
			    key[strlen(key) - 1] == ' ' || key[strlen(key) - 1] == '\t'))
				warnf(ld, keys_nd->items[j], "overrides: \"%s\" begins "
				    "or ends with a space or tab, which a header's value "
				    "or an address never does (HTTP strips them): it "
				    "applies only to a query or cookie value that has "
				    "them", echo(ld, key));
		}
	}
}

static int
on_override_limits(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	struct override_draft *d = t;

	(void)key;
	d->limits_nd = nd;
	return parse_limits(ld, nd, &d->o.set);
}

static int
on_override_unlimited(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return get_bool(ld, nd, key, &((struct override_draft *)t)->unlimited);
}

static const struct key_handler override_keys[] = {
	{ "keys", on_override_keys },
	{ "limits", on_override_limits },
	{ "unlimited", on_override_unlimited },
	{ NULL, NULL },
};

static void
override_free(struct override *o)
{
	for (size_t i = 0; i < o->nkeys; i++) {
		free(o->keys[i]);
		if (o->canon_ip)
			free(o->canon_ip[i]);
	}
	free(o->keys);
	free(o->canon_ip);
	limit_set_free(&o->set);
}

static int
on_route_overrides(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	struct route_draft *d = t;
	int bad = 0;

	if (nd->type != NODE_SEQUENCE) {
		node_error(ld, nd, "%s: expected a list", key);
		return -1;
	}
	d->r.overrides = xcalloc(nd->nitems ? nd->nitems : 1, sizeof(*d->r.overrides));
	for (size_t i = 0; i < nd->nitems; i++) {
		struct override_draft od;
		unsigned long seen;
		size_t nerr = ld->errors->n;

		memset(&od, 0, sizeof(od));
		walk_mapping(ld, nd->items[i], "override", override_keys, &od, &seen);
		if (nd->items[i]->type == NODE_MAPPING && ld->errors->n == nerr) {
			if (od.keys_nd == NULL)
				node_error(ld, nd->items[i], "override: \"keys\" is required");
			else if (od.unlimited && od.limits_nd)
				node_error(ld, nd->items[i], "override: use either "
				    "\"limits\" or \"unlimited: true\", not both");
			else if (!od.unlimited && od.limits_nd == NULL)
				node_error(ld, nd->items[i], "override: needs \"limits\" "
				    "or \"unlimited: true\"");
		}
		if (ld->errors->n != nerr) {
			override_free(&od.o);
			bad = 1;
			continue;
		}
		od.o.set.unlimited = od.unlimited;
		d->r.overrides[d->r.noverrides++] = od.o;
	}
	return bad ? -1 : 0;
}

static const struct key_handler route_keys[] = {
	{ "name", on_route_name },
	{ "match", on_route_match },
	{ "key", on_route_key },
	{ "missing_key", on_route_missing_key },
	{ "deny_status", on_route_deny_status },
	{ "failure_mode", on_route_failure_mode },
	{ "shadow", on_route_shadow },
	{ "limits", on_route_limits },
	{ "overrides", on_route_overrides },
	{ NULL, NULL },
};

static void
route_free(struct route *r)
{
	free(r->name);
	if (r->path_kind == PATH_REGEX)
		regfree(&r->regex);
	free(r->path);
	for (size_t i = 0; i < r->nmethods; i++)
		free(r->methods[i]);
	free(r->methods);
	free(r->host);
	for (size_t i = 0; i < r->nkeys; i++)
		free(r->keys[i].name);
	free(r->keys);
	limit_set_free(&r->limits);
	for (size_t i = 0; i < r->noverrides; i++)
		override_free(&r->overrides[i]);
	free(r->overrides);
	free(r->by_ip);
	free(r->by_value);
}

/* Does every request that route b matches also match route a? Routes
 * match on path, methods and host only. */
static int
route_covers(const struct route *a, const struct route *b)
{
	if (a->nmethods > 0) {
		if (b->nmethods == 0)
			return 0;
		/* b's GET takes HEAD too, and a's GET covers that */
		for (size_t i = 0; i < b->nmethods; i++)
			if (!policy_route_takes_method(a, b->methods[i]))
				return 0;
	}
	if (a->host && (b->host == NULL || !policy_host_covers(a->host, b->host)))
		return 0;
	switch (a->path_kind) {
	case PATH_ANY:
		return 1;
	case PATH_PREFIX:	/* every normalized path starts with "/" */
		if (strcmp(a->path, "/") == 0)
			return 1;
		return (b->path_kind == PATH_EXACT || b->path_kind == PATH_PREFIX) &&
		    strncmp(b->path, a->path, strlen(a->path)) == 0;
	case PATH_EXACT:
		return b->path_kind == PATH_EXACT && strcmp(a->path, b->path) == 0;
	default:
		return 0;	/* a regex: not worked out */
	}
}

/* Does this route's mapping say shadow: true? Read ahead of its keys,
 * which come in any order; a bad value is on_route_shadow's to report. */
static int
says_shadow(const struct node *route)
{
	if (route->type != NODE_MAPPING)
		return 0;
	for (size_t i = 0; i + 1 < route->nitems; i += 2) {
		const struct node *k = route->items[i], *v = route->items[i + 1];

		if (k->type == NODE_SCALAR && strcmp(k->value, "shadow") == 0 &&
		    v->type == NODE_SCALAR && v->plain && is_bool_word(v->value) == 2)
			return 1;
	}
	return 0;
}

static int
on_routes(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	struct config *c = t;
	char **names;
	const struct node **name_nds, **kept_nds;
	size_t nnames = 0, nitems;

	if (nd->type != NODE_SEQUENCE) {
		node_error(ld, nd, "%s: expected a list of routes", key);
		return -1;
	}
	/* Over the cap: said, and the first CONFIG_ROUTES_MAX still read,
	 * so that what else is wrong in them is said in the same run. */
	if (nd->nitems > CONFIG_ROUTES_MAX)
		node_error(ld, nd->items[CONFIG_ROUTES_MAX], "%s[%d]: one too many: "
		    "at most %d routes, and this file has %zu", key, CONFIG_ROUTES_MAX,
		    CONFIG_ROUTES_MAX, nd->nitems);
	nitems = nd->nitems > CONFIG_ROUTES_MAX ? CONFIG_ROUTES_MAX : nd->nitems;
	if (nitems == 0)
		warnf(ld, nd, "%s: the list is empty: every check is answered 200, "
		    "no request is limited", key);
	c->routes = xcalloc(nitems ? nitems : 1, sizeof(*c->routes));
	/* Names of every route read so far, valid or not, for duplicates. */
	names = xcalloc(nitems ? nitems : 1, sizeof(*names));
	name_nds = xcalloc(nitems ? nitems : 1, sizeof(*name_nds));
	kept_nds = xcalloc(nitems ? nitems : 1, sizeof(*kept_nds));
	for (size_t i = 0; i < nitems; i++) {
		struct route_draft d;
		unsigned long seen;
		size_t nerr = ld->errors->n;

		memset(&d, 0, sizeof(d));
		d.node = nd->items[i];
		d.r.failure_mode = FAILURE_MODE_INHERIT;
		ld->in_shadow_route = says_shadow(d.node);
		walk_mapping(ld, d.node, "route", route_keys, &d, &seen);
		ld->in_shadow_route = 0;
		if (d.node->type == NODE_MAPPING) {
			if (d.name_nd == NULL)
				node_error(ld, d.node, "route: \"name\" is required");
			if (d.limits_nd == NULL)
				node_error(ld, d.node, "route: \"limits\" is required");
		}
		if (d.r.nkeys == 0 && ld->errors->n == nerr) {
			d.r.keys = xcalloc(1, sizeof(*d.r.keys));
			d.r.keys[0].type = KEY_IP;
			d.r.nkeys = 1;
		}
		/* Read whole, its override keys are warned about even when the
		 * check after finds one listed twice: "the file's warnings
		 * after its errors" (an audit saw them only once it was fixed). */
		if (ld->errors->n == nerr)
			warn_override_keys_unmatched(ld, &d.r, d.node);
		check_override_keys_unique(ld, &d.r, d.node);
		/* The first copy only: naming every earlier one made n copies
		 * n²/2 errors (a 10 KB file of 1,000 gave 499,500 lines). */
		for (size_t j = 0; d.r.name && j < nnames; j++)
			if (strcmp(names[j], d.r.name) == 0) {
				node_error(ld, d.name_nd, "route: duplicate route name "
				    "\"%s\" (first at %d:%d)", echo(ld, d.r.name),
				    name_nds[j]->line, name_nds[j]->col);
				break;
			}
		if (d.r.name) {
			name_nds[nnames] = d.name_nd;
			names[nnames++] = xstrdup(d.r.name);
		}
		if (ld->errors->n != nerr) {
			route_free(&d.r);
			continue;
		}
		for (size_t j = 0; j < c->nroutes; j++)
			if (route_covers(&c->routes[j], &d.r)) {
				warnf(ld, d.node, "route \"%s\" can never match: "
				    "route \"%s\" (at %d:%d) comes first and matches "
				    "every request it would", echo(ld, d.r.name),
				    echo(ld, c->routes[j].name), kept_nds[j]->line,
				    kept_nds[j]->col);
				break;
			}
		kept_nds[c->nroutes] = d.node;
		c->routes[c->nroutes++] = d.r;
	}
	for (size_t j = 0; j < nnames; j++)
		free(names[j]);
	free(names);
	free(name_nds);
	free(kept_nds);
	return 0;
}

static int
on_failure_mode(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return get_failure_mode(ld, nd, key, &((struct config *)t)->failure_mode);
}

/* 10.1.2.3/8 is the range 10.0.0.0/8 (the address bits past the prefix
 * are never compared), but likelier a typo of the prefix: said, as nginx
 * does, and the range stored as the network it is. */
static void
cidr_drop_host_bits(struct loader *ld, const struct node *nd, const char *key,
    struct cidr *c)
{
	unsigned char given[sizeof(c->addr)];
	char net[INET6_ADDRSTRLEN];

	memcpy(given, c->addr, sizeof(given));
	config_addr_fill_past(c->addr, sizeof(c->addr), c->bits, 0);
	if (memcmp(given, c->addr, sizeof(given)) != 0 &&
	    inet_ntop(c->family, c->addr, net, sizeof(net)) != NULL)
		warnf(ld, nd, "%s: \"%s\" has address bits past its prefix: it "
		    "is the range %s/%d", key, echo(ld, nd->value), net, c->bits);
}

/* The range just read (the next slot) inside one listed before it: a
 * duplicate, or a narrower range a wider one already trusts, which reads
 * as though it meant something the wider one does not. */
static void
warn_cidr_covered(struct loader *ld, const struct node *nd, const char *key,
    const struct config *c)
{
	const struct cidr *added = &c->trusted_proxies[c->ntrusted_proxies];

	for (size_t i = 0; i < c->ntrusted_proxies; i++) {
		const struct cidr *earlier = &c->trusted_proxies[i];

		if (earlier->bits <= added->bits &&
		    config_cidr_contains(earlier, added->family, added->addr)) {
			warnf(ld, nd, "%s: \"%s\" is already trusted: item %zu "
			    "covers it", key, echo(ld, nd->value), i + 1);
			return;
		}
	}
}

static int
on_trusted_proxies(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	struct config *c = t;
	int bad = 0;

	if (nd->type != NODE_SEQUENCE) {
		node_error(ld, nd, "%s: expected a list of addresses or CIDR ranges", key);
		return -1;
	}
	free(c->trusted_proxies);
	c->trusted_proxies = xcalloc(nd->nitems ? nd->nitems : 1, sizeof(struct cidr));
	c->ntrusted_proxies = 0;
	for (size_t i = 0; i < nd->nitems; i++) {
		const struct node *it = nd->items[i];

		if (want_scalar(ld, it, key) == -1) {
			bad = 1;
			continue;
		}
		if (config_parse_cidr(it->value, &c->trusted_proxies[c->ntrusted_proxies]) == -1) {
			node_error(ld, it, "%s: \"%s\" is not an IP address or CIDR range",
			    key, echo(ld, it->value));
			bad = 1;
			continue;
		}
		cidr_drop_host_bits(ld, it, key, &c->trusted_proxies[c->ntrusted_proxies]);
		warn_cidr_covered(ld, it, key, c);
		/* Perhaps meant, behind a balancer that owns the network, but
		 * said: ::ffff:0:0/96 is this too, read as IPv4. */
		if (c->trusted_proxies[c->ntrusted_proxies].bits == 0)
			warnf(ld, it, "%s: \"%s\" trusts every %s address: any "
			    "client of that family can name its own address in "
			    "X-Forwarded-For", key, echo(ld, it->value),
			    c->trusted_proxies[c->ntrusted_proxies].family == AF_INET ?
			    "IPv4" : "IPv6");
		c->ntrusted_proxies++;
	}
	return bad ? -1 : 0;
}

static int
on_client_ipv6_prefix(struct loader *ld, const struct node *nd, const char *key,
    void *t)
{
	long long v;

	if (get_int(ld, nd, key, 1, 128, &v) == -1)
		return -1;
	((struct config *)t)->client_ipv6_prefix = (int)v;
	/* Shorter than a site's /48, one client would be whole providers. */
	if (v < 32)
		warnf(ld, nd, "%s: %lld counts every address under one /%lld as "
		    "one client, which can be many sites or a whole provider "
		    "(64 is one host's network, 48 one site's)", key, v, v);
	return 0;
}

/* The value client_ipv6_prefix will have, for the routes read before it:
 * a bad one has its error from on_client_ipv6_prefix, and leaves 128. */
static int
client_ipv6_prefix_ahead(const struct node *root)
{
	const struct node *nd = root->type == NODE_MAPPING ?
	    mapping_get(root, "client_ipv6_prefix") : NULL;
	char *end;
	long v;

	if (nd == NULL || nd->type != NODE_SCALAR || !nd->plain || nd->value == NULL)
		return 128;
	v = strtol(nd->value, &end, 10);
	return *end == '\0' && end != nd->value && nd->value[0] != '0' &&
	    v >= 1 && v <= 128 ? (int)v : 128;
}

static int
on_section(struct loader *ld, const struct node *nd, const char *key,
    const struct key_handler *table, void *t)
{
	unsigned long seen;

	walk_mapping(ld, nd, key, table, t, &seen);
	return 0;
}

static int
on_server(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return on_section(ld, nd, key, server_keys, t);
}

static int
on_redis(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return on_section(ld, nd, key, redis_keys, t);
}

static int
on_log(struct loader *ld, const struct node *nd, const char *key, void *t)
{
	return on_section(ld, nd, key, log_keys, t);
}

/* The place of "routes" in top_keys: its bit in walk_mapping's seen. */
#define TOP_KEY_ROUTES	6

static const struct key_handler top_keys[] = {
	{ "server", on_server },
	{ "redis", on_redis },
	{ "failure_mode", on_failure_mode },
	{ "trusted_proxies", on_trusted_proxies },
	{ "client_ipv6_prefix", on_client_ipv6_prefix },
	{ "log", on_log },
	{ "routes", on_routes },
	{ NULL, NULL },
};

/* --- the config object -------------------------------------------------- */

static struct config *
config_defaults(const char *path)
{
	struct config *c = xcalloc(1, sizeof(*c));

	atomic_init(&c->refs, 1);
	c->path = xstrdup(path);
	c->listen = xstrdup("127.0.0.1:8080");
	c->workers = 1;
	c->deny_status = 429;
	c->idle_timeout_us = 60 * US_PER_S;
	c->drain_timeout_us = 5 * US_PER_S;
	c->max_connections = CONFIG_CONNECTIONS_DEFAULT;
	c->redis_address = xstrdup("127.0.0.1:6379");
	c->redis_password_env = xstrdup("REDIS_PASSWORD");
	c->redis_timeout_us = 50 * US_PER_MS;
	c->redis_connect_timeout_us = 500 * US_PER_MS;
	c->redis_max_batch = CONFIG_BATCH_DEFAULT;
	c->key_prefix = xstrdup("rl:");
	c->failure_mode = FAILURE_MODE_OPEN;
	c->trusted_proxies = xcalloc(2, sizeof(struct cidr));
	config_parse_cidr("127.0.0.1/32", &c->trusted_proxies[0]);
	config_parse_cidr("::1/128", &c->trusted_proxies[1]);
	c->ntrusted_proxies = 2;
	c->client_ipv6_prefix = 128;
	c->log_level = LOG_LEVEL_INFO;
	c->log_format = LOG_FORMAT_TEXT;
	return c;
}

static void
config_free(struct config *c)
{
	if (c == NULL)
		return;
	free(c->path);
	free(c->listen);
	free(c->redis_address);
	free(c->redis_username);
	free(c->redis_password_env);
	if (c->redis_password) {
		explicit_bzero(c->redis_password, strlen(c->redis_password));
		free(c->redis_password);
	}
	free(c->key_prefix);
	free(c->trusted_proxies);
	free(c->trusted_ranges[0]);
	free(c->trusted_ranges[1]);
	for (size_t i = 0; i < c->nroutes; i++)
		route_free(&c->routes[i]);
	free(c->routes);
	free(c->host_routes);
	free(c->hostless_routes);
	for (size_t i = 0; i < c->nwarnings; i++)
		free(c->warnings[i]);
	free(c->warnings);
	free(c->json);
	free(c);
}

long long
config_connections_in_force(const struct config *c)
{
	struct rlimit rl;
	long long room;

	if (getrlimit(RLIMIT_NOFILE, &rl) == -1 || rl.rlim_cur == RLIM_INFINITY)
		return c->max_connections;
	room = (long long)rl.rlim_cur - CONFIG_FDS_RESERVED;
	if (room < 1)
		room = 1;
	return c->max_connections < room ? c->max_connections : room;
}

struct config *
config_ref(struct config *config)
{
	atomic_fetch_add_explicit(&config->refs, 1, memory_order_relaxed);
	return config;
}

static pthread_mutex_t released_lock = PTHREAD_MUTEX_INITIALIZER;
static struct config *released;
static void (*released_wake)(void *);
static void *released_wake_arg;

void
config_unref(struct config *config)
{
	void (*wake)(void *);
	void *arg;

	if (config == NULL || atomic_fetch_sub_explicit(&config->refs, 1,
	    memory_order_acq_rel) != 1)
		return;
	pthread_mutex_lock(&released_lock);
	if ((wake = released_wake) != NULL) {
		config->released_next = released;
		released = config;
	}
	arg = released_wake_arg;
	pthread_mutex_unlock(&released_lock);
	if (wake == NULL)
		config_free(config);
	else
		wake(arg);
}

void
config_defer_free(void (*wake)(void *), void *arg)
{
	pthread_mutex_lock(&released_lock);
	released_wake = wake;
	released_wake_arg = arg;
	pthread_mutex_unlock(&released_lock);
}

void
config_free_released(void)
{
	struct config *c;

	pthread_mutex_lock(&released_lock);
	c = released;
	released = NULL;
	pthread_mutex_unlock(&released_lock);
	while (c != NULL) {
		struct config *next = c->released_next;

		config_free(c);
		c = next;
	}
}

struct config *
config_load(const char *path, struct config_errors *errors)
{
	struct loader ld = { .path = path, .errors = errors };
	struct config *c = NULL;
	struct node *root = NULL;
	unsigned long seen;
	struct stat st;
	FILE *fp = NULL;
	int fd;

	memset(errors, 0, sizeof(*errors));
	memset(&st, 0, sizeof(st));	/* (fstat may fail: then not a FIFO) */
	/* O_NONBLOCK: opening a FIFO with no writer would block the main
	 * thread, and with it reloads and SIGTERM; reads block again below,
	 * and one from a FIFO nobody writes is an empty file. */
	if ((fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)) == -1) {
		errors->passing = errno_is_passing(errno);
		errorf(&ld, 1, 1, "cannot open: %s", strerror(errno));
	}
	/* open takes a directory, whose read would fail as "input error",
	 * and a device, of which /dev/zero reads without end */
	else if (fstat(fd, &st) == 0 && (S_ISDIR(st.st_mode) ||
	    S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))) {
		errorf(&ld, 1, 1, "is a %s, not a policy file",
		    S_ISDIR(st.st_mode) ? "directory" : "device");
		close(fd);
	} else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == -1 ||
	    (fp = fdopen(fd, "r")) == NULL) {
		errors->passing = errno_is_passing(errno);
		errorf(&ld, 1, 1, "cannot open: %s", strerror(errno));
		close(fd);
	} else if ((root = read_yaml(&ld, fp)) == NULL && errors->n == 0)
		/* A FIFO (a pipe, -c <(...)) is read once, from a writer
		 * that is there when it opens. */
		errorf(&ld, 1, 1, S_ISFIFO(st.st_mode) ? "is a FIFO with no writer "
		    "or nothing written: a policy is read from it once, at each "
		    "load" : "the policy file is empty");
	if (fp)
		fclose(fp);
	if (root) {
		c = config_defaults(path);
		ld.client_ipv6_prefix = client_ipv6_prefix_ahead(root);
		walk_mapping(&ld, root, "policy", top_keys, c, &seen);
		if (root->type == NODE_MAPPING && !(seen & (1UL << TOP_KEY_ROUTES)))
			node_error(&ld, root, "policy: \"routes\" is required");
		if (c->redis_password_env) {
			const char *pw = getenv(c->redis_password_env);

			if (pw && *pw)
				c->redis_password = xstrdup(pw);
		}
		yamldoc_free(root);
	}
	errors_sort(&ld);
	if (errors->n > 0) {
		errors->warnings = ld.warnings;
		errors->nwarnings = ld.nwarnings;
		config_free(c);
		return NULL;
	}
	c->warnings = ld.warnings;
	c->nwarnings = ld.nwarnings;
	c->generation = __atomic_add_fetch(&config_generation, 1, __ATOMIC_RELAXED);
	return c;
}

/* --- accessors ---------------------------------------------------------- */

const char *
config_algorithm_name(enum algorithm algorithm)
{
	return algorithm_names[algorithm];
}

int
config_algorithm_is_bucket(enum algorithm algorithm)
{
	return algorithm == ALGORITHM_TOKEN_BUCKET ||
	    algorithm == ALGORITHM_LEAKY_BUCKET || algorithm == ALGORITHM_GCRA;
}

long long
config_limit_window_seconds(const struct limit *l)
{
	long long us;

	if (!config_algorithm_is_bucket(l->algorithm))
		us = l->window_us;
	else {
		/* burst / rate = burst * period / n, rounded up; a policy
		 * keeps it far below the cap, which keeps the cast defined */
		long double v = (long double)l->quota * l->rate_period_us / l->rate_n;

		if (v > (long double)(LLONG_MAX - US_PER_S))
			v = (long double)(LLONG_MAX - US_PER_S);
		us = (long long)v;
		if ((long double)us < v)
			us++;
	}
	return (us + US_PER_S - 1) / US_PER_S;
}

enum failure_mode
config_route_failure_mode(const struct config *config, const struct route *route)
{
	return route->failure_mode == FAILURE_MODE_INHERIT ? config->failure_mode :
	    route->failure_mode;
}

int
config_route_deny_status(const struct config *config, const struct route *route)
{
	return route->deny_status ? route->deny_status : config->deny_status;
}
