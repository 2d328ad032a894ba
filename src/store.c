/*
 * The Redis link. hiredis 0.14.1 gives us an async context and nothing for
 * time, so three libevent timers do that work: the reconnect timer (capped
 * exponential backoff, so a dead Redis costs one connect attempt per backoff
 * step, never one per request), the handshake deadline (TCP connect, AUTH,
 * SELECT, INFO and SCRIPT LOAD must all finish within
 * redis.connect_timeout, or the attempt is dropped: a paused Redis accepts
 * TCP connections but never answers), and the stall watchdog (a link that has had calls outstanding
 * and no reply for STORE_STALL_MIN_US or 4x redis.timeout is dropped, which
 * fails its pending calls and starts reconnecting).
 *
 * Batching: store_eval only queues a check; a flush event, activated by the
 * first check of a loop iteration and run after that iteration's I/O (it is
 * queued behind it at the same priority), sends everything queued as script
 * calls of up to redis.max_batch checks each. Redis runs one call's checks
 * in order, each as if alone, so the result is the same as one call per
 * check, at a fraction of Redis's per-call cost. A Redis Cluster node
 * (INFO, asked in the handshake) refuses keys of several slots in
 * one call, so there every call carries one check.
 *
 * hiredis rules we live by: the context may be freed only outside hiredis
 * callbacks (0.14.1 has no in-callback guard), so callbacks only record state
 * and drops are done from timers; a failed connect is freed by hiredis
 * itself after onConnect(REDIS_ERR); pending callbacks get a NULL reply when
 * the context dies.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <hiredis/adapters/libevent.h>

#include "clock.h"
#include "config.h"
#include "limiter.h"
#include "log.h"
#include "metrics.h"
#include "replypool.h"
#include "resolve.h"
#include "script.h"
#include "store.h"
#include "xmalloc.h"

#define STORE_BACKOFF_MIN_US	50000LL		/* first retry after 50 ms */
#define STORE_BACKOFF_MAX_US	1000000LL	/* never wait more than 1 s */
/* Each wait is cut by up to a quarter at random: the sidecars of a fleet
 * that lost one Redis together would otherwise retry in step, each
 * second at the same moment (an audit saw them within 2 ms). */
#define STORE_BACKOFF_JITTER	4
#define STORE_ERROR_TEXT_MAX	512	/* of a server's error, as logged */
#define STORE_STEADY_US		STORE_BACKOFF_MAX_US	/* see st_flapping */
#define STORE_IDLE_PING_US	1000000LL	/* see keep_alive */
#define STORE_STALL_MIN_US	1000000LL
#define STORE_WATCHDOG_US	100000LL
#define STORE_RETIRE_SLACK_US	100000LL
#define STORE_REPLY_INTS_MAX	LIMITER_REPLY_INTS(CONFIG_LIMITS_MAX)
/* The longest reply of any call: a batch of the most checks and limits. */
#define STORE_ARRAY_MAX		(CONFIG_BATCH_MAX * STORE_REPLY_INTS_MAX)
/* Checks with Redis on one link past which new ones fail at once: with a
 * long redis.timeout, the age of the oldest call alone would let a Redis
 * that trickles replies gather hundreds of megabytes of checks. */
#define STORE_INFLIGHT_MAX	16384

/* Handshake step names, passed to hiredis as callback data. */
static char step_auth[] = "AUTH";
static char step_select[] = "SELECT";

/* The checks of one script call, in the order of the reply. */
struct store_batch {
	struct store_batch	*sb_next;	/* free list */
	struct store		*sb_store;
	size_t			 sb_n, sb_cap;
	struct store_call	**sb_calls;
	size_t			*sb_nlimits;	/* read at send: the policy may go */
	long long		 sb_sent_us;
	int			 sb_sent;	/* on st_sent */
	TAILQ_ENTRY(store_batch) sb_sent_entry;
};

struct store {
	int			 st_worker;
	char			*st_who;	/* "worker N: redis ADDRESS", the
						 * start of its log lines */
	struct event_base	*st_base;
	struct metrics		*st_metrics;
	/* Where its state goes: the metrics gauge (the store serving the
	 * checks), a watcher (one being connected while another serves), or
	 * nowhere (one retired, answering what it was sent). */
	enum { REPORT_GAUGE, REPORT_WATCHER, REPORT_NONE } st_report;
	store_ready_cb		 st_ready;
	void			*st_ready_arg;
	redisAsyncContext	*st_ac;
	enum store_state	 st_state;
	int			 st_tcp_up;	/* onConnect(OK) seen */
	/* The link's number, from the worker's count of links (shared by
	 * its stores), so no two links of a worker ever have one. */
	unsigned long		*st_link_count;
	unsigned long		 st_link;

	/* settings from the policy; a change means another store */
	char			*st_address;
	char			*st_username;
	char			*st_password;
	char			*st_password_env;	/* its variable's name */
	int			 st_database;
	long long		 st_connect_timeout_us;
	long long		 st_timeout_us;	/* redis.timeout */
	long long		 st_stall_us;
	long long		 st_retired_us;	/* when another began to serve */
	/* The longest redis.timeout of the checks sent here: a store that
	 * serves on while its successor connects takes the new policy's
	 * checks, whose deadlines may be longer than its own. */
	long long		 st_longest_timeout_us;

	char			 st_sha[41];
	int			 st_script_loading;
	long long		 st_backoff_us;
	struct event		*st_retry_ev;	/* reconnect after backoff */
	struct event		*st_handshake_ev; /* connect deadline */
	struct event		*st_watchdog_ev; /* stall detection */
	struct event		*st_drop_ev;	/* deferred drop, outside hiredis */

	size_t			 st_inflight;	/* checks sent, not answered */
	TAILQ_HEAD(, store_batch) st_sent;	/* with Redis, oldest first */
	/* The watchdog dropped a link, and no call has been answered since. A
	 * Redis can take the handshake but no script call (CLIENT PAUSE WRITE
	 * in a failover): a new link is not taken as recovery (no "connected",
	 * no backoff reset) until a call is answered, and the drops of such
	 * links are one outage in the log. */
	int			 st_stalled;
	/* A link was dropped for READONLY, and no check has been answered
	 * without it since. With INFO refused to the ACL user, the handshake
	 * cannot tell a replica, and the probe (zero checks, no write) is
	 * answered by one: then only a check answered without READONLY ends
	 * the outage (see link_answered), so the drops back off to a second
	 * apart and are one outage in the log. */
	int			 st_readonly;
	/* The current link has answered a script call. Until it has, /readyz
	 * and the gauge call it connecting: the handshake alone proves little
	 * (a Redis in CLIENT PAUSE WRITE answers it and holds every call). */
	int			 st_answered;
	long long		 st_progress_us; /* last reply or first send */
	int			 st_logged_down; /* "still down" logged once */
	/* It replaces a store whose outage was logged (store_take_outage):
	 * its first link up ends that outage in the log. */
	int			 st_after_outage;
	int			 st_logged_handshake; /* see handshake_refused */
	/* This link is being dropped (its handshake was refused, or its
	 * server turned replica): the replies already read behind it (a
	 * Redis without a password refuses AUTH but runs SCRIPT LOAD) must
	 * not bring it up before the drop. */
	int			 st_link_failed;
	/* The last link was lost within STORE_STEADY_US of coming up, and
	 * none has held that long since. A peer that takes the handshake and
	 * breaks each call (a protocol error, a proxy that garbles replies)
	 * would otherwise be met with a fresh backoff and a "connected" line
	 * at every handshake: a reconnect every 60 ms, and a log storm. Its
	 * links back off to a second apart and are one outage in the log,
	 * until one holds (the watchdog says so). */
	int			 st_flapping;
	uint64_t		 st_random;	/* see store_random */
	long long		 st_up_us;	/* when the link came up */
	/* The peer sent a reply that no command awaits (see guarded_functions). */
	int			 st_unsolicited;
	/* The peer began an array no call of ours gets: nested, or longer
	 * than any batch's reply (see guarded_array), of this many elements. */
	int			 st_oversized;
	long long		 st_oversized_elements;
	/* A script reply of a shape no call of ours gets (a status, an array
	 * of the wrong length) was read: the replies on this link are out
	 * of step with the calls, each the one meant for the call before it,
	 * so none behind it is delivered (see on_batch_reply). */
	int			 st_out_of_step;
	int			 st_pinging;	/* a keep_alive PING is unanswered */
	struct lookup		*st_lookup;	/* the host's name being looked up */

	int			 st_max_batch;	/* redis.max_batch */
	int			 st_cluster;	/* a Cluster node: one check a call */
	TAILQ_HEAD(, store_call) st_queue;	/* not yet sent */
	struct event		*st_flush_ev;
	struct store_batch	*st_free_batches;
	struct limiter_command	 st_cmd;	/* reused for every call */
};

static void store_connect(struct store *);
static void store_drop(struct store *, const char *);
static void handshake_refused(struct store *, const char *, const char *);

int
store_behind(const struct store *st, long long within_us)
{
	const struct store_batch *oldest = TAILQ_FIRST(&st->st_sent);

	return st->st_state == STORE_UP && oldest != NULL &&
	    (mono_us() - oldest->sb_sent_us >= within_us ||
	    st->st_inflight >= STORE_INFLIGHT_MAX);
}

unsigned long
store_link(const struct store *st)
{
	return st->st_link;
}

const char *
store_state_name(enum store_state state)
{
	static const char *const names[] = { "down", "connecting", "up" };

	return names[state];
}

/* The state /readyz and the gauge show: a link is up once it has answered
 * a script call. */
static enum store_state
shown_state(const struct store *st)
{
	if (st->st_state == STORE_UP && !st->st_answered)
		return STORE_CONNECTING;
	return st->st_state;
}

int
store_settled(const struct store *st)
{
	return shown_state(st) != STORE_CONNECTING;
}

static void
report_state(const struct store *st)
{
	enum store_state shown = shown_state(st);

	switch (st->st_report) {
	case REPORT_GAUGE:
		metrics_set_redis_state(st->st_metrics, (int)shown);
		break;
	case REPORT_WATCHER:
		if (shown != STORE_CONNECTING)
			st->st_ready(st->st_ready_arg);
		break;
	case REPORT_NONE:
		break;
	}
}

static void
set_state(struct store *st, enum store_state state)
{
	if (state == STORE_UP && st->st_state != STORE_UP) {
		st->st_link = ++*st->st_link_count;
		st->st_answered = 0;
		st->st_up_us = mono_us();
	} else if (state != STORE_UP && st->st_state == STORE_UP)
		st->st_flapping = mono_us() - st->st_up_us < STORE_STEADY_US;
	st->st_state = state;
	report_state(st);
}

/* A link up, or answering, again: after a logged outage at the outage's
 * level, or a log kept at warn shows Redis going and never coming back;
 * a first link at info. */
static void
log_link_up(struct store *st, const char *what)
{
	if (st->st_logged_down || st->st_after_outage)
		log_warnx("%s: %s", st->st_who, what);
	else
		log_info("%s: %s", st->st_who, what);
	st->st_after_outage = 0;
}

void
store_take_outage(struct store *next, const struct store *prev)
{
	next->st_after_outage = prev->st_logged_down || prev->st_after_outage;
}

/* A script call was answered on the current link, whatever the reply:
 * Redis takes calls again. After a READONLY drop, only an allowed check
 * answered without it (it wrote: checks_written) or a handshake that
 * found a primary says so: the probe and denials write nothing, and a
 * replica answers them. */
static void
link_answered(struct store *st, int checks_written)
{
	if (st->st_stalled && (checks_written || !st->st_readonly)) {
		log_link_up(st, "answering again");
		st->st_stalled = 0;
		st->st_readonly = 0;
		st->st_backoff_us = STORE_BACKOFF_MIN_US;
		st->st_logged_down = 0;
	}
	if (!st->st_answered) {
		st->st_answered = 1;
		/* Not at the handshake's end: the probe can still be refused,
		 * and that outage is said once too. */
		st->st_logged_handshake = 0;
		report_state(st);
	}
}

/* The call every new link makes once the script is loaded: no limit sets
 * and no checks (keys 0, time 0, sets 0), so it charges nothing, and the
 * script answers it with an empty array, not an error that would count in
 * Redis's errorstats. Redis holds it exactly as it would hold a check
 * (CLIENT PAUSE WRITE holds every script call), and its answer makes the
 * link ready even when no check comes. */
static void
on_probe_reply(redisAsyncContext *ac, void *r, void *privdata)
{
	struct store *st = ac->data;
	redisReply *reply = r;

	(void)privdata;
	if (reply == NULL || st == NULL || st->st_ac != ac)
		return;
	/* An ACL user without EVALSHA: every check would fail the same way,
	 * so the link is refused as a wrong password is, and /readyz says
	 * so. Other errors (BUSY, a proxy that wants a key) still mean Redis
	 * answers; the checks report their own. */
	if (reply->type == REDIS_REPLY_ERROR &&
	    strncmp(reply->str, "NOPERM", 6) == 0) {
		handshake_refused(st, "EVALSHA of the limits script", reply->str);
		return;
	}
	link_answered(st, 0);
}

/* splitmix64: enough to spread retries, and each store's own. */
static uint64_t
store_random(struct store *st)
{
	uint64_t z = (st->st_random += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Arms the reconnect timer with the current backoff, less up to a
 * STORE_BACKOFF_JITTER-th of it, then doubles it. */
static void
schedule_retry(struct store *st)
{
	long long cut = (long long)(store_random(st) %
	    (uint64_t)(st->st_backoff_us / STORE_BACKOFF_JITTER + 1));
	struct timeval tv = tv_us(st->st_backoff_us - cut);

	set_state(st, STORE_DOWN);
	st->st_tcp_up = 0;
	st->st_inflight = 0;
	event_del(st->st_handshake_ev);
	event_add(st->st_retry_ev, &tv);
	st->st_backoff_us *= 2;
	if (st->st_backoff_us > STORE_BACKOFF_MAX_US)
		st->st_backoff_us = STORE_BACKOFF_MAX_US;
}

static void
on_connect(const redisAsyncContext *ac, int status)
{
	struct store *st = ac->data;

	if (st == NULL || st->st_ac != ac)
		return;
	if (status != REDIS_OK) {
		/* hiredis frees the context itself after this callback. */
		if (!st->st_logged_down)
			log_warnx("%s: connect failed: %s", st->st_who,
			    ac->errstr[0] ? ac->errstr : "unknown error");
		st->st_logged_down = 1;
		st->st_ac = NULL;
		schedule_retry(st);
		return;
	}
	st->st_tcp_up = 1;
}

static void
on_disconnect(const redisAsyncContext *ac, int status)
{
	struct store *st = ac->data;

	(void)status;
	if (st == NULL || st->st_ac != ac)
		return;
	/* Closed (or answered with something not RESP) before the handshake
	 * was done, with no Redis error to quote: the log lists what does
	 * this, the TLS-only port of a managed Redis among them. */
	if (!st->st_logged_down && st->st_unsolicited)
		log_warnx("%s: sent a reply that no command asked for: a server "
		    "that is not Redis, or a proxy that garbles replies; "
		    "reconnecting", st->st_who);
	else if (!st->st_logged_down && st->st_oversized)
		log_warnx("%s: began a reply no call of ours gets (an array "
		    "of %lld elements, nested or over the %d of the largest "
		    "batch's): a server that is not Redis, or a proxy that "
		    "garbles replies; reconnecting", st->st_who,
		    st->st_oversized_elements, STORE_ARRAY_MAX);
	else if (!st->st_logged_down && st->st_state == STORE_CONNECTING && st->st_tcp_up)
		log_warnx("%s: closed by the server before the handshake finished%s%s "
		    "(Redis restarting or killed, a proxy or TLS tunnel whose Redis "
		    "is down, a Redis that accepts only TLS: see \"Redis over TLS\" "
		    "in the README, or a server that is not Redis)", st->st_who,
		    ac->errstr[0] ? ": " : "", ac->errstr[0] ? ac->errstr : "");
	else if (!st->st_logged_down)
		log_warnx("%s: disconnected%s%s", st->st_who,
		    ac->errstr[0] ? ": " : "", ac->errstr[0] ? ac->errstr : "");
	st->st_logged_down = 1;
	st->st_ac = NULL;
	schedule_retry(st);
}

/*
 * A server's error text with the password cut out, into buf (or error
 * itself when there is nothing to cut). Redis's own AUTH errors never hold
 * it, but a Redis whose AUTH is renamed away answers "unknown command
 * 'AUTH', with args beginning with: '<password>'" (cut short at 128
 * bytes), and a proxy or a server that is not Redis may echo anything
 * (an audit saw both): SPEC 8 has the password appear nowhere. A run of
 * STORE_SECRET_RUN or more bytes that begins the password is cut too, as
 * an echo cut short ends with one.
 */
#define STORE_SECRET_RUN	4
static const char *
error_without_password(const struct store *st, const char *error, char *buf,
    size_t size)
{
	static const char mark[] = "(password)";
	const char *pw = st->st_password, *p = error;
	size_t plen, o = 0;
	int cut = 0;

	if (pw == NULL || (plen = strlen(pw)) == 0)
		return error;
	/* Cut where it stood, a password this short would still be read
	 * back from the texts Redis words alike every time. */
	if (plen < STORE_SECRET_RUN)
		return strstr(error, pw) ? "(not shown: the server's text holds "
		    "the password's characters)" : error;
	while (*p != '\0') {
		size_t m = 0;

		while (m < plen && p[m] == pw[m])
			m++;
		if (m >= STORE_SECRET_RUN) {
			if (o + sizeof(mark) - 1 >= size)
				break;
			memcpy(buf + o, mark, sizeof(mark) - 1);
			o += sizeof(mark) - 1;
			p += m;
			cut = 1;
			continue;
		}
		if (o + 1 >= size)
			break;
		buf[o++] = *p++;
	}
	buf[o] = '\0';
	/* Cut short (the rest may hold it) or cut: the copy, never the
	 * server's text as it came. */
	return cut || *p != '\0' ? buf : error;
}

/* A server's error text as a log line may hold it: the password cut out,
 * then escaped as every untrusted byte is (a server that is not Redis may
 * send a terminal's escape sequences). */
static const char *
error_for_log(const struct store *st, const char *error, char *buf, size_t size)
{
	char cut[STORE_ERROR_TEXT_MAX];
	const char *text = error_without_password(st, error, cut, sizeof(cut));

	return log_escape(buf, size, text, strlen(text));
}

/*
 * A handshake step refused (AUTH, SELECT, INFO, SCRIPT LOAD): the server's
 * message, logged once per outage (a wrong password fails every attempt
 * the same way); the replies already read behind it must not bring the
 * link up before the drop.
 */
static void
handshake_refused(struct store *st, const char *step, const char *error)
{
	/* What to do about the two an operator meets first. */
	char hint[256] = "", text[STORE_ERROR_TEXT_MAX * 4];

	if (strncmp(error, "NOAUTH", 6) == 0 && st->st_password == NULL) {
		if (st->st_password_env)
			snprintf(hint, sizeof(hint), " (this Redis wants a password: "
			    "%s, the variable redis.password_env names, is unset or "
			    "empty in the daemon's environment)", st->st_password_env);
		else
			snprintf(hint, sizeof(hint), " (this Redis wants a password: "
			    "set redis.password_env to the name of an environment "
			    "variable that holds it)");
	} else if (strncmp(error, "WRONGPASS", 9) == 0)
		snprintf(hint, sizeof(hint), " (check redis.username and the "
		    "variable redis.password_env names)");
	if (!st->st_logged_handshake)
		log_warnx("%s: %s failed: %s%s", st->st_who, step,
		    error_for_log(st, error, text, sizeof(text)), hint);
	st->st_logged_handshake = 1;
	st->st_logged_down = 1;
	st->st_link_failed = 1;
	store_drop(st, NULL);
}

/* AUTH and SELECT replies: an error ends the attempt. */
static void
on_handshake_reply(redisAsyncContext *ac, void *r, void *privdata)
{
	struct store *st = ac->data;
	redisReply *reply = r;

	(void)privdata;
	if (reply == NULL || st == NULL || st->st_ac != ac)
		return;
	if (reply->type == REDIS_REPLY_ERROR)
		handshake_refused(st, privdata, reply->str);
}

static void
on_script_loaded(redisAsyncContext *ac, void *r, void *privdata)
{
	struct store *st = ac->data;
	redisReply *reply = r;

	(void)privdata;
	if (st == NULL || st->st_ac != ac)
		return;
	st->st_script_loading = 0;
	if (reply == NULL || st->st_link_failed || st->st_out_of_step)
		return;
	if (reply->type != REDIS_REPLY_STRING || reply->len != 40) {
		handshake_refused(st, "SCRIPT LOAD", reply->type == REDIS_REPLY_ERROR ?
		    reply->str : "unexpected reply");
		return;
	}
	memcpy(st->st_sha, reply->str, 40);
	st->st_sha[40] = '\0';
	if (st->st_state != STORE_UP) {
		event_del(st->st_handshake_ev);
		st->st_progress_us = mono_us();
		if (!st->st_stalled && !st->st_flapping) {
			st->st_backoff_us = STORE_BACKOFF_MIN_US;
			/* Said for the first link too: an operator sees
			 * which Redis each worker uses. */
			log_link_up(st, "connected");
			st->st_logged_down = 0;
		} else
			log_debug("%s: connected again; waiting for %s",
			    st->st_who, st->st_stalled ? "an answer" :
			    "the link to hold");
		set_state(st, STORE_UP);
		/* Redis answers in order, so until it answers this no call
		 * on the link is answered: the stall watchdog covers it as
		 * !st_answered, or a link gone silent would stay unready for
		 * as long as no check arrives. */
		redisAsyncCommand(ac, on_probe_reply, NULL,
		    "EVALSHA %s 0 0 0", st->st_sha);
	}
}

/*
 * A Redis that evicts keys under maxmemory (any policy but noeviction:
 * every key of ours has a TTL, so volatile-* policies take them too)
 * drops a limit's count without a word, and its client starts again with
 * its whole quota: said when a link finds it, once for the process (the
 * workers' links share the Redis) until a link finds it no longer does.
 * noeviction instead refuses the script's writes with OOM, which fails
 * checks by their failure mode and is counted and logged.
 */
static atomic_int evicting_said;

static void
warn_if_evicting(struct store *st, const char *info)
{
	const char *mm = strstr(info, "\nmaxmemory:");
	const char *pol = strstr(info, "\nmaxmemory_policy:");
	char name[32 * 4];
	long long maxmemory;
	size_t len;

	if (mm == NULL || pol == NULL)
		return;
	maxmemory = strtoll(mm + strlen("\nmaxmemory:"), NULL, 10);
	pol += strlen("\nmaxmemory_policy:");
	len = strcspn(pol, "\r\n");
	if (maxmemory <= 0 || (len == 10 && strncmp(pol, "noeviction", 10) == 0)) {
		atomic_store(&evicting_said, 0);
		return;
	}
	if (atomic_exchange(&evicting_said, 1))
		return;
	log_escape(name, sizeof(name), pol, len < 32 ? len : 32);
	log_warnx("%s: this Redis evicts keys when full (maxmemory-policy %s, "
	    "maxmemory %lld bytes): a count it evicts starts afresh, and its "
	    "client gets its whole quota back; set maxmemory-policy noeviction, "
	    "or give the limits a Redis of their own", st->st_who, name,
	    maxmemory);
}

/* INFO's default sections: what the server is.
 *
 * A replica cannot be our Redis: a read-only one refuses the script's
 * writes (every check failed by its failure mode while /readyz said up),
 * and a writable one loses them at its next sync with the primary. A
 * Sentinel knows the primary's address but runs no scripts. Either
 * refuses the attempt with the fix; the retries (at most a second apart)
 * find the primary when a failover moves it behind the same address.
 *
 * Only a Cluster node needs one check per call. NOPERM (INFO not allowed
 * to this ACL user) leaves batching on, as on a plain Redis. Any other
 * error is the reason the attempt fails, and is said: NOAUTH (a password
 * is needed), or "max number of clients reached", which Redis sends
 * before closing (else the log showed SCRIPT LOAD's protocol error, or a
 * reset). */
static void
on_info(redisAsyncContext *ac, void *r, void *privdata)
{
	struct store *st = ac->data;
	redisReply *reply = r;
	const char *info;

	(void)privdata;
	if (reply == NULL || st == NULL || st->st_ac != ac || st->st_link_failed)
		return;
	if (reply->type == REDIS_REPLY_ERROR && strncmp(reply->str, "NOPERM", 6) != 0) {
		handshake_refused(st, "INFO", reply->str);
		return;
	}
	if (reply->type != REDIS_REPLY_ERROR && reply->type != REDIS_REPLY_STRING) {
		/* Redis answers INFO with a bulk string, always */
		handshake_refused(st, "INFO", "unexpected reply: a server that is "
		    "not Redis, or a proxy that garbles replies");
		return;
	}
	info = reply->type == REDIS_REPLY_STRING ? reply->str : "";
	if (strstr(info, "\nredis_mode:sentinel") != NULL) {
		handshake_refused(st, "INFO role check", "this is a Sentinel, "
		    "not the Redis server: set redis.address to the primary it "
		    "names (SENTINEL get-master-addr-by-name)");
		return;
	}
	if (strstr(info, "\nrole:slave") != NULL) {
		handshake_refused(st, "INFO role check", "this is a replica "
		    "(role:slave), which cannot keep the limits' counts: set "
		    "redis.address to the primary");
		return;
	}
	/* A primary, by its own word: the probe's answer is recovery. */
	if (reply->type == REDIS_REPLY_STRING)
		st->st_readonly = 0;
	warn_if_evicting(st, info);
	st->st_cluster = strstr(info, "\ncluster_enabled:1") != NULL;
	if (st->st_cluster && st->st_max_batch > 1)
		log_info("%s: a Cluster node; one check per script call",
		    st->st_who);
}

static void
load_script(struct store *st)
{
	if (st->st_script_loading || st->st_ac == NULL)
		return;
	if (redisAsyncCommand(st->st_ac, on_script_loaded, NULL, "SCRIPT LOAD %s",
	    script_source) == REDIS_OK)
		st->st_script_loading = 1;
}

/* The host part of a TCP address ("[v6]:port" or "host:port"). */
static void
address_host(const char *address, char *host, size_t size)
{
	const char *colon = strrchr(address, ':');
	size_t hl = (size_t)(colon - address);

	if (address[0] == '[') {
		hl -= 2;
		address++;
	}
	if (hl >= size)
		hl = size - 1;
	memcpy(host, address, hl);
	host[hl] = '\0';
}

static void connect_to(struct store *, const char *);

static void
on_lookup(void *arg, const char *ip, const char *error)
{
	struct store *st = arg;

	st->st_lookup = NULL;
	/* Answered after this attempt gave up: the next one asks again. */
	if (st->st_state != STORE_CONNECTING || st->st_ac != NULL)
		return;
	if (ip == NULL) {
		if (!st->st_logged_down)
			log_warnx("%s: cannot resolve the host: %s",
			    st->st_who, error);
		st->st_logged_down = 1;
		schedule_retry(st);
		return;
	}
	connect_to(st, ip);
}

/* A new attempt: connect, after looking the host's name up off the loop
 * when it is not an address. connect_timeout covers the lookup too. */
static void
store_connect(struct store *st)
{
	char host[256];
	struct timeval tv = tv_us(st->st_connect_timeout_us);

	if (strncmp(st->st_address, "unix:", 5) == 0) {
		connect_to(st, NULL);
		return;
	}
	address_host(st->st_address, host, sizeof(host));
	if (lookup_is_numeric(host)) {
		connect_to(st, host);
		return;
	}
	if (st->st_lookup && strcmp(lookup_host(st->st_lookup), host) != 0) {
		lookup_cancel(st->st_lookup);
		st->st_lookup = NULL;
	}
	/* A lookup an earlier attempt gave up on may still be running: wait
	 * for it rather than pile up threads behind a hung resolver. */
	if (st->st_lookup == NULL &&
	    (st->st_lookup = lookup_start(st->st_base, host, on_lookup, st)) == NULL) {
		connect_to(st, host);	/* no thread: as hiredis would, blocking */
		return;
	}
	set_state(st, STORE_CONNECTING);
	event_add(st->st_handshake_ev, &tv);
}

/*
 * hiredis 0.14 aborts the process (an assert in redisProcessCallbacks)
 * when a reply arrives that no command awaits, unless it is an error: a
 * peer that is not Redis (one that answers "+OK" per line), or a proxy
 * that garbles replies, would take the daemon down. These wrap the reply
 * pool's functions: the first object of such a reply is refused, which
 * hiredis takes as a reader error and drops the link (the disconnect
 * callback names the cause). The reader's privdata is the context, and
 * hiredis builds a reply before it takes the reply's callback off the
 * list, so the list is empty exactly when nothing awaits this reply.
 */
static int
reply_unsolicited(const redisReadTask *task)
{
	redisAsyncContext *ac = task->privdata;
	struct store *st;

	if (task->parent != NULL || ac == NULL || ac->replies.head != NULL)
		return 0;
	if ((st = ac->data) != NULL)
		st->st_unsolicited = 1;
	return 1;
}

static void *
guarded_string(const redisReadTask *task, char *str, size_t len)
{
	/* an error no command awaits hiredis handles itself (Redis sends
	 * "max number of clients reached" before it closes) */
	if (task->type != REDIS_REPLY_ERROR && reply_unsolicited(task))
		return NULL;
	return replypool_functions.createString(task, str, len);
}

/*
 * hiredis makes an array when it reads the header, before any element
 * arrives: "*200000000" alone had the worker zero 1.6 GB and stall for
 * seconds, and the pool kept the vector. No call of ours is answered by
 * a nested array or by one longer than the largest batch's reply, so
 * such a header is refused as an unsolicited reply is (the link drops).
 */
static void *
guarded_array(const redisReadTask *task, int elements)
{
	redisAsyncContext *ac = task->privdata;

	if (reply_unsolicited(task))
		return NULL;
	if (task->parent != NULL || elements > STORE_ARRAY_MAX) {
		struct store *st = ac != NULL ? ac->data : NULL;

		if (st != NULL) {
			st->st_oversized = 1;
			st->st_oversized_elements = elements;
		}
		return NULL;
	}
	return replypool_functions.createArray(task, elements);
}

static void *
guarded_integer(const redisReadTask *task, long long value)
{
	if (reply_unsolicited(task))
		return NULL;
	return replypool_functions.createInteger(task, value);
}

static void *
guarded_nil(const redisReadTask *task)
{
	if (reply_unsolicited(task))
		return NULL;
	return replypool_functions.createNil(task);
}

static redisReplyObjectFunctions guarded_functions = {
	guarded_string, guarded_array, guarded_integer, guarded_nil,
	replypool_free_object,
};

/* Connects to ip (NULL: the unix socket) and queues the handshake. */
static void
connect_to(struct store *st, const char *ip)
{
	redisAsyncContext *ac;
	struct timeval tv = tv_us(st->st_connect_timeout_us);

	if (ip == NULL)
		ac = redisAsyncConnectUnix(st->st_address + 5);
	else
		ac = redisAsyncConnect(ip, atoi(strrchr(st->st_address, ':') + 1));
	if (ac == NULL || ac->err) {
		if (!st->st_logged_down)
			log_warnx("%s: connect failed: %s", st->st_who,
			    ac ? ac->errstr : "out of memory");
		st->st_logged_down = 1;
		if (ac)
			redisAsyncFree(ac);
		schedule_retry(st);
		return;
	}
	ac->data = st;
	ac->c.reader->fn = &guarded_functions;
	ac->c.reader->privdata = ac;
	st->st_ac = ac;
	st->st_unsolicited = 0;
	st->st_oversized = 0;
	st->st_out_of_step = 0;
	st->st_pinging = 0;
	st->st_tcp_up = 0;
	st->st_script_loading = 0;
	st->st_link_failed = 0;
	redisLibeventAttach(ac, st->st_base);
	redisAsyncSetConnectCallback(ac, on_connect);
	redisAsyncSetDisconnectCallback(ac, on_disconnect);
	if (strncmp(st->st_address, "unix:", 5) != 0)
		redisEnableKeepAlive(&ac->c);	/* fails on a unix socket */
	set_state(st, STORE_CONNECTING);
	/* hiredis queues these until the socket is writable. */
	if (st->st_password) {
		if (st->st_username)
			redisAsyncCommand(ac, on_handshake_reply, step_auth,
			    "AUTH %s %s", st->st_username, st->st_password);
		else
			redisAsyncCommand(ac, on_handshake_reply, step_auth,
			    "AUTH %s", st->st_password);
	}
	if (st->st_database)
		redisAsyncCommand(ac, on_handshake_reply, step_select,
		    "SELECT %d", st->st_database);
	st->st_cluster = 0;
	redisAsyncCommand(ac, on_info, NULL, "INFO");
	load_script(st);
	/* After a lookup, its timer runs on: it covers both. */
	if (!evtimer_pending(st->st_handshake_ev, NULL))
		event_add(st->st_handshake_ev, &tv);
}

/* Frees the context from outside hiredis: now if safe, else deferred. */
static void
store_drop(struct store *st, const char *why)
{
	if (why)
		log_warnx("%s: %s; reconnecting", st->st_who, why);
	event_active(st->st_drop_ev, EV_TIMEOUT, 0);
}

static void
on_drop(evutil_socket_t fd, short what, void *arg)
{
	struct store *st = arg;
	redisAsyncContext *ac = st->st_ac;

	(void)fd;
	(void)what;
	if (ac == NULL)
		return;
	st->st_ac = NULL;
	schedule_retry(st);
	/* Runs every pending callback with NULL, so the calls fail now. */
	redisAsyncFree(ac);
}

static void
on_retry(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	store_connect(arg);
}

static void
on_handshake_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct store *st = arg;

	(void)fd;
	(void)what;
	if (st->st_state != STORE_CONNECTING)
		return;
	if (st->st_ac == NULL) {
		/* Still looking the name up; the lookup runs on, for the next
		 * attempt to use. */
		if (!st->st_logged_down)
			log_warnx("%s: the host's name was not resolved within "
			    "connect_timeout", st->st_who);
		st->st_logged_down = 1;
		schedule_retry(st);
		return;
	}
	/* Which half failed says where to look: the network (a firewall
	 * that drops, a host that is gone) or the server (paused, loading,
	 * overloaded, or a proxy in front of a Redis that is). */
	if (!st->st_logged_down)
		log_warnx("%s: no answer within connect_timeout (%lld ms): %s",
		    st->st_who, st->st_connect_timeout_us / 1000, st->st_tcp_up ?
		    "the connection was made, and nothing of the handshake "
		    "was answered (a Redis paused or overloaded, or a proxy "
		    "whose Redis is)" : "the TCP connection was not made (a "
		    "firewall that drops packets, a host that is down)");
	st->st_logged_down = 1;
	on_drop(-1, 0, st);
}

static void
on_ping_reply(redisAsyncContext *ac, void *r, void *privdata)
{
	struct store *st = ac->data;

	(void)privdata;
	if (r == NULL || st == NULL || st->st_ac != ac)
		return;
	st->st_pinging = 0;
	st->st_progress_us = mono_us();
}

/*
 * A link idle for STORE_IDLE_PING_US is sent a PING. A Redis `timeout`
 * closes an idle client (a managed Redis may: Azure's after 10 minutes),
 * and so does a NAT or load balancer that forgets an idle flow, silently:
 * then the next check met a closed or dead link and failed open. The PING
 * keeps the link in use, and a link that has died without a word is found
 * by the watchdog (no reply to the PING) before a check needs it. Once a
 * second, so that a Redis `timeout` of 2 s or more never closes it (at 5 s
 * apart, `timeout 3` cycled both links every 4 s, and a check in the gap
 * failed open); an idle daemon's PING costs Redis next to nothing.
 */
static void
keep_alive(struct store *st, long long now)
{
	if (st->st_state != STORE_UP || !st->st_answered || st->st_inflight > 0 ||
	    st->st_pinging || now - st->st_progress_us < STORE_IDLE_PING_US)
		return;
	if (redisAsyncCommand(st->st_ac, on_ping_reply, NULL, "PING") == REDIS_OK) {
		st->st_pinging = 1;
		st->st_progress_us = now;
	}
}

static void
on_watchdog(evutil_socket_t fd, short what, void *arg)
{
	struct store *st = arg;
	long long now = mono_us();

	(void)fd;
	(void)what;
	if (st->st_flapping && st->st_state == STORE_UP && !st->st_stalled &&
	    now - st->st_up_us >= STORE_STEADY_US) {
		char held[64];

		snprintf(held, sizeof(held), "connected (the link has held for "
		    "%lld ms)", STORE_STEADY_US / 1000);
		log_link_up(st, held);
		st->st_flapping = 0;
		st->st_backoff_us = STORE_BACKOFF_MIN_US;
		st->st_logged_down = 0;
	}
	keep_alive(st, now);
	if (st->st_state == STORE_UP && (st->st_inflight > 0 || !st->st_answered ||
	    st->st_pinging) && now - st->st_progress_us > st->st_stall_us) {
		long long silent_ms = (now - st->st_progress_us) / 1000;

		if (!st->st_stalled) {		/* said once, when it began */
			if (st->st_inflight > 0)
				log_warnx("%s: no reply for %lld ms with %zu "
				    "check%s pending; dropping the link", st->st_who,
				    silent_ms, st->st_inflight,
				    st->st_inflight == 1 ? "" : "s");
			else
				log_warnx("%s: no reply to %s for %lld ms; "
				    "dropping the link", st->st_who, st->st_pinging ?
				    "a PING on the idle link" : "the first script call",
				    silent_ms);
		}
		st->st_stalled = 1;
		st->st_logged_down = 1;
		on_drop(-1, 0, st);
	}
}

static struct store_batch *
batch_get(struct store *st)
{
	struct store_batch *b = st->st_free_batches;
	size_t cap = (size_t)st->st_max_batch;

	if (b)
		st->st_free_batches = b->sb_next;
	else {
		b = xcalloc(1, sizeof(*b));
		b->sb_store = st;
	}
	if (b->sb_cap < cap) {
		b->sb_calls = xrealloc(b->sb_calls, cap * sizeof(*b->sb_calls));
		b->sb_nlimits = xrealloc(b->sb_nlimits, cap * sizeof(*b->sb_nlimits));
		b->sb_cap = cap;
	}
	b->sb_n = 0;
	return b;
}

static void
batch_put(struct store *st, struct store_batch *b)
{
	b->sb_next = st->st_free_batches;
	st->st_free_batches = b;
}

static void
batch_free_all(struct store *st)
{
	while (st->st_free_batches) {
		struct store_batch *b = st->st_free_batches;

		st->st_free_batches = b->sb_next;
		free(b->sb_calls);
		free(b->sb_nlimits);
		free(b);
	}
}

/* Answers one call without a reply (failure statuses only). */
static void
call_fail(struct store_call *call, enum store_status status, const char *error)
{
	struct store_result res = { status, NULL, 0, error, 0 };

	call->sc_cb(call->sc_arg, &res);
}

/* Every check of the batch gets the same failure. */
static void
batch_fail(struct store_batch *b, enum store_status status, const char *error)
{
	for (size_t i = 0; i < b->sb_n; i++)
		call_fail(b->sb_calls[i], status, error);
}

static int
slice_is_ints(redisReply *const *slice, size_t n)
{
	for (size_t k = 0; k < n; k++)
		if (slice[k]->type != REDIS_REPLY_INTEGER)
			return 0;
	return 1;
}

static int
is_readonly(const char *error)
{
	return strncmp(error, "READONLY", 8) == 0;
}

/* NOPERM for the command itself ("... no permissions to run the 'evalsha'
 * command"), not for a key: Redis 7 checks a call's declared keys against
 * the ACL before the script runs and refuses the whole call for one key
 * it keeps from the user, which other calls' keys may not be. */
static int
is_evalsha_refused(const char *error)
{
	return strncmp(error, "NOPERM", 6) == 0 &&
	    strstr(error, "permissions to run") != NULL;
}

#define DELIVERED_READONLY	1	/* a check failed with READONLY */
#define DELIVERED_WROTE		2	/* a check was allowed: it wrote */
#define DELIVERED_OUT_OF_STEP	4	/* see st_out_of_step */
#define DELIVERED_NOPERM	8	/* the call itself was refused by ACL */

/* Hands each check its slice of the reply: 2 + 5 integers per limit, or,
 * for a check whose Redis commands failed (WRONGTYPE, OOM), -1 and the
 * error's text: that check alone fails. Returns DELIVERED_* flags. */
static int
batch_deliver(struct store_batch *b, const redisReply *reply)
{
	long long ints[STORE_REPLY_INTS_MAX];
	size_t want = 0, at = 0;
	int flags = 0;

	for (size_t i = 0; i < b->sb_n; i++)
		want += LIMITER_REPLY_INTS(b->sb_nlimits[i]);
	if (reply->elements != want) {
		batch_fail(b, STORE_ERROR, "script reply has the wrong length");
		return DELIVERED_OUT_OF_STEP;
	}
	/* The whole reply's shape first: one that is not this call's is
	 * no check's verdict, not even of the slices before the odd one. */
	for (size_t i = 0; i < b->sb_n; i++) {
		redisReply **slice = reply->element + at;
		size_t n = LIMITER_REPLY_INTS(b->sb_nlimits[i]);

		at += n;
		if (slice[0]->type == REDIS_REPLY_INTEGER && slice[0]->integer == -1)
			continue;	/* a failed check: -1, its text, zeros */
		if (!slice_is_ints(slice, n)) {
			batch_fail(b, STORE_ERROR, "script reply is not integers");
			return DELIVERED_OUT_OF_STEP;
		}
	}
	at = 0;
	for (size_t i = 0; i < b->sb_n; i++) {
		struct store_result res = { STORE_OK, ints,
		    LIMITER_REPLY_INTS(b->sb_nlimits[i]), NULL, b->sb_store->st_link };
		redisReply **slice = reply->element + at;

		at += res.nints;
		if (slice[0]->type == REDIS_REPLY_INTEGER && slice[0]->integer == -1) {
			const char *error = slice[1]->type == REDIS_REPLY_STRING ?
			    slice[1]->str : "script error";
			char cut[STORE_ERROR_TEXT_MAX];

			if (is_readonly(error))
				flags |= DELIVERED_READONLY;
			call_fail(b->sb_calls[i], STORE_ERROR,
			    error_without_password(b->sb_store, error, cut,
			    sizeof(cut)));
			continue;
		}
		for (size_t k = 0; k < res.nints; k++)
			ints[k] = slice[k]->integer;	/* integers: checked above */
		if (ints[0] == 1)
			flags |= DELIVERED_WROTE;
		b->sb_calls[i]->sc_cb(b->sb_calls[i]->sc_arg, &res);
	}
	return flags;
}

static void
on_batch_reply(redisAsyncContext *ac, void *r, void *privdata)
{
	struct store_batch *b = privdata;
	struct store *st = b->sb_store;
	redisReply *reply = r;
	int flags = 0;

	if (b->sb_sent) {
		TAILQ_REMOVE(&st->st_sent, b, sb_sent_entry);
		b->sb_sent = 0;
	}
	if (st->st_ac == ac && st->st_inflight >= b->sb_n) {
		st->st_inflight -= b->sb_n;
		st->st_progress_us = mono_us();
	}
	if (reply == NULL)
		batch_fail(b, STORE_DISCONNECTED, NULL);
	else if (st->st_ac == ac && st->st_out_of_step)
		/* Another call's reply, or anything: the link is going. */
		batch_fail(b, STORE_DISCONNECTED, NULL);
	else if (reply->type == REDIS_REPLY_ERROR) {
		if (strncmp(reply->str, "NOSCRIPT", 8) == 0) {
			/* Queued ahead of the checks' retries. */
			load_script(st);
			batch_fail(b, STORE_NOSCRIPT, NULL);
		} else {
			char cut[STORE_ERROR_TEXT_MAX];

			if (is_readonly(reply->str))
				flags = DELIVERED_READONLY;
			else if (is_evalsha_refused(reply->str))
				flags = DELIVERED_NOPERM;
			batch_fail(b, STORE_ERROR, error_without_password(st,
			    reply->str, cut, sizeof(cut)));
		}
	} else if (reply->type == REDIS_REPLY_ARRAY)
		flags = batch_deliver(b, reply);
	else {
		batch_fail(b, STORE_ERROR, "unexpected script reply");
		flags = DELIVERED_OUT_OF_STEP;
	}
	batch_put(st, b);
	if (st->st_ac != ac || reply == NULL || st->st_out_of_step)
		return;
	if (flags & DELIVERED_NOPERM) {
		/* EVALSHA taken from the user while linked: as at a link's
		 * first call (on_probe_reply), so /readyz and the alert on the
		 * link say it, not only the errors. A key the ACL keeps from
		 * the user fails its call alone (is_evalsha_refused). */
		if (!st->st_link_failed)
			handshake_refused(st, "EVALSHA of the limits script",
			    reply->str);
		return;
	}
	if (flags & DELIVERED_OUT_OF_STEP) {
		/* A reply some middlebox added: the replies behind it would
		 * each be taken for the next call's, verdicts of other
		 * clients. Redis itself never sends such a reply. (One of
		 * the same shape as the call's, or one lost, cannot be told.)
		 * A link already being dropped is only kept from delivering. */
		if (!st->st_link_failed)
			store_drop(st, "a script reply of a shape no call gets: "
			    "the replies on this link are out of step with the "
			    "calls (a proxy that adds or drops replies, or a "
			    "server that is not Redis)");
		st->st_out_of_step = 1;
		return;
	}
	/* Only an allowed check wrote: a replica answers a denial too. */
	if (!(flags & DELIVERED_READONLY))
		link_answered(st, flags & DELIVERED_WROTE);
	else if (!st->st_link_failed) {
		/* The primary was made a replica under us (a failover): the
		 * link goes, and the next handshake says what it is now. */
		st->st_link_failed = 1;		/* one drop per link */
		store_drop(st, st->st_readonly ? NULL :
		    "READONLY: the server is a replica now");
		st->st_readonly = 1;
		st->st_stalled = 1;
		st->st_logged_down = 1;
	}
}

static struct store_call *
queue_pop(struct store *st)
{
	struct store_call *call = TAILQ_FIRST(&st->st_queue);

	if (call != NULL) {
		TAILQ_REMOVE(&st->st_queue, call, sc_entry);
		call->sc_queued = 0;
	}
	return call;
}

/* Sends what this loop iteration queued, max_batch checks per call. */
static void
on_flush(evutil_socket_t fd, short what, void *arg)
{
	struct store *st = arg;
	size_t max = st->st_cluster ? 1 : (size_t)st->st_max_batch;
	struct store_call *call;
	int sent = 0;

	(void)fd;
	(void)what;
	while (!TAILQ_EMPTY(&st->st_queue)) {
		struct store_batch *b;

		if (st->st_state != STORE_UP || st->st_ac == NULL) {
			/* The link went down after these were queued. */
			while ((call = queue_pop(st)) != NULL)
				call_fail(call, STORE_DISCONNECTED, NULL);
			return;
		}
		b = batch_get(st);
		limiter_reset(&st->st_cmd);
		while (b->sb_n < max && (call = queue_pop(st)) != NULL) {
			limiter_add(&st->st_cmd, call->sc_key_prefix, call->sc_route,
			    call->sc_client, call->sc_set, call->sc_cost);
			b->sb_nlimits[b->sb_n] = call->sc_set->nlimits;
			b->sb_calls[b->sb_n++] = call;
		}
		limiter_finish(&st->st_cmd, st->st_sha);
		if (redisAsyncFormattedCommand(st->st_ac, on_batch_reply, b,
		    st->st_cmd.resp, st->st_cmd.resplen) != REDIS_OK) {
			batch_fail(b, STORE_DISCONNECTED, NULL);
			batch_put(st, b);
			continue;
		}
		b->sb_sent_us = mono_us();
		if (st->st_inflight == 0)
			st->st_progress_us = b->sb_sent_us;
		st->st_inflight += b->sb_n;
		TAILQ_INSERT_TAIL(&st->st_sent, b, sb_sent_entry);
		b->sb_sent = 1;
		metrics_redis_call(st->st_metrics, b->sb_n);
		sent = 1;
	}
	/* Write now rather than on the next loop iteration's EV_WRITE: one
	 * poll round trip less per batch. On a write error hiredis frees the
	 * context (we are outside its callbacks) and fails the calls. */
	if (sent && st->st_ac != NULL)
		redisAsyncHandleWrite(st->st_ac);
}

int
store_eval(struct store *st, struct store_call *call, store_cb cb, void *arg)
{
	if (st->st_state != STORE_UP || st->st_ac == NULL)
		return -1;
	call->sc_store = st;
	call->sc_cb = cb;
	call->sc_arg = arg;
	if (TAILQ_EMPTY(&st->st_queue))
		event_active(st->st_flush_ev, EV_TIMEOUT, 0);
	TAILQ_INSERT_TAIL(&st->st_queue, call, sc_entry);
	call->sc_queued = 1;
	return 0;
}

int
store_cancel(struct store_call *call)
{
	struct store *st = call->sc_store;

	if (!call->sc_queued)
		return 0;
	TAILQ_REMOVE(&st->st_queue, call, sc_entry);
	call->sc_queued = 0;
	return 1;
}

enum store_state
store_state(const struct store *st)
{
	return st->st_state;
}

static int
str_differs(const char *a, const char *b)
{
	if (a == NULL || b == NULL)
		return a != b;
	return strcmp(a, b) != 0;
}

static void
replace(char **dst, const char *src)
{
	if (*dst) {
		explicit_bzero(*dst, strlen(*dst));
		free(*dst);
	}
	*dst = src ? xstrdup(src) : NULL;
}

const char *
store_address(const struct store *st)
{
	return st->st_address;
}

int
store_same_link(const struct store *st, const struct config *c)
{
	return !str_differs(st->st_address, c->redis_address) &&
	    !str_differs(st->st_username, c->redis_username) &&
	    !str_differs(st->st_password, c->redis_password) &&
	    st->st_database == c->redis_database;
}

/* How long a call may go unanswered before the link is taken for dead:
 * well past the deadline of the checks it carries. */
static long long
stall_for(long long timeout_us)
{
	return timeout_us * 4 < STORE_STALL_MIN_US ? STORE_STALL_MIN_US :
	    timeout_us * 4;
}

void
store_configure(struct store *st, const struct config *c)
{
	st->st_connect_timeout_us = c->redis_connect_timeout_us;
	st->st_max_batch = c->redis_max_batch;
	st->st_timeout_us = c->redis_timeout_us;
	st->st_stall_us = stall_for(c->redis_timeout_us);
	store_take_deadlines(st, c);
}

void
store_take_deadlines(struct store *st, const struct config *c)
{
	if (c->redis_timeout_us > st->st_longest_timeout_us)
		st->st_longest_timeout_us = c->redis_timeout_us;
	if (stall_for(c->redis_timeout_us) > st->st_stall_us)
		st->st_stall_us = stall_for(c->redis_timeout_us);
}

void
store_serve(struct store *st)
{
	st->st_report = REPORT_GAUGE;
	report_state(st);
}

void
store_retire(struct store *st)
{
	st->st_report = REPORT_NONE;
	st->st_retired_us = mono_us();
}

int
store_retired_done(const struct store *st)
{
	/* Every check sent here has its answer by its redis.timeout after
	 * the last was sent: from then on, freeing the store can only fail
	 * calls whose checks were answered by their deadline. */
	return (TAILQ_EMPTY(&st->st_queue) && TAILQ_EMPTY(&st->st_sent)) ||
	    mono_us() - st->st_retired_us > st->st_longest_timeout_us +
	    STORE_RETIRE_SLACK_US;
}

struct store *
store_new(int worker, struct event_base *base, const struct config *config,
    struct metrics *metrics, unsigned long *link_count, store_ready_cb ready,
    void *arg)
{
	struct store *st = xcalloc(1, sizeof(*st));
	struct timeval wd = tv_us(STORE_WATCHDOG_US);

	st->st_worker = worker;
	st->st_base = base;
	st->st_metrics = metrics;
	st->st_link_count = link_count;
	st->st_report = ready != NULL ? REPORT_WATCHER : REPORT_GAUGE;
	st->st_ready = ready;
	st->st_ready_arg = arg;
	TAILQ_INIT(&st->st_queue);
	TAILQ_INIT(&st->st_sent);
	st->st_backoff_us = STORE_BACKOFF_MIN_US;
	/* Sidecars started together differ in pid, and their workers in
	 * number; the clock adds the rest. */
	st->st_random = (uint64_t)mono_us() ^ ((uint64_t)getpid() << 32) ^
	    (uint64_t)worker * 0x9e3779b97f4a7c15ULL;
	st->st_retry_ev = evtimer_new(base, on_retry, st);
	st->st_handshake_ev = evtimer_new(base, on_handshake_timeout, st);
	st->st_drop_ev = event_new(base, -1, 0, on_drop, st);
	/* Activated during an iteration's I/O, it runs after all of it (every
	 * event has the one priority). */
	st->st_flush_ev = event_new(base, -1, 0, on_flush, st);
	st->st_watchdog_ev = event_new(base, -1, EV_PERSIST, on_watchdog, st);
	event_add(st->st_watchdog_ev, &wd);
	st->st_state = STORE_DOWN;
	store_configure(st, config);
	replace(&st->st_address, config->redis_address);
	st->st_who = xasprintf("worker %d: redis %s", worker, st->st_address);
	replace(&st->st_username, config->redis_username);
	replace(&st->st_password, config->redis_password);
	replace(&st->st_password_env, config->redis_password_env);
	st->st_database = config->redis_database;
	store_connect(st);
	return st;
}

void
store_free(struct store *st)
{
	if (st == NULL)
		return;
	if (st->st_lookup)
		lookup_cancel(st->st_lookup);
	if (st->st_ac) {
		redisAsyncContext *ac = st->st_ac;

		st->st_ac = NULL;
		redisAsyncFree(ac);
	}
	set_state(st, STORE_DOWN);
	/* Sent batches have had their callbacks; nothing may be queued. */
	batch_free_all(st);
	limiter_command_free(&st->st_cmd);
	event_free(st->st_flush_ev);
	event_free(st->st_retry_ev);
	event_free(st->st_handshake_ev);
	event_free(st->st_drop_ev);
	event_free(st->st_watchdog_ev);
	replace(&st->st_address, NULL);
	free(st->st_who);
	replace(&st->st_username, NULL);
	replace(&st->st_password, NULL);
	replace(&st->st_password_env, NULL);
	free(st);
}
