/*
 * Logging. Every message is formatted into one buffer and written whole,
 * so lines from several worker threads never interleave. Levels are
 * checked before formatting so that disabled debug logging costs nothing.
 * In JSON mode each line is an object {"ts","level","msg"}.
 *
 * Once log_start() has run, lines go to a queue that a thread of its own
 * writes out: a worker that wrote to stderr itself blocked when whatever
 * reads it (a pipe to systemd, Docker, `| tee`) stalled, and with it every
 * check and /healthz, until the reader went on, Redis healthy or not. A
 * full queue drops lines, counted, and says so when it can write again.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

#define LOG_LINE_MAX 4096
/* Queued bytes at most: a few seconds of access lines at full load; pages
 * are touched only as far as the queue ever fills. */
#define LOG_QUEUE_SIZE	(1024 * 1024)
/* Written at most this much at once, ending at a line's end: a pipe takes
 * up to PIPE_BUF bytes whole, so another process's lines on the same
 * stderr never land inside ours. */
#define LOG_WRITE_MAX	4096
#define LOG_STOP_WAIT_MS 2000	/* see log_stop */
/* After a write, the writer waits this long for LOG_WRITE_MAX bytes of
 * access lines before it writes what it has: under load it wakes once per
 * write, not once per line (a wake per access line doubled the daemon's
 * CPU per check). Any other line, and an access line after a quiet spell,
 * is written at once. */
#define LOG_LINGER_US	10000

static struct {
	pthread_mutex_t	 lock;
	pthread_cond_t	 more;		/* the writer waits for lines */
	pthread_cond_t	 drained;	/* log_stop waits for the writer */
	pthread_t	 thread;
	char		*ring;		/* LOG_QUEUE_SIZE bytes */
	size_t		 head, len;	/* queued: len bytes from head */
	int		 running, stopping;
	int		 flushing;	/* log_stop waits: no lingering */
	int		 urgent;	/* a line queued that must not wait */
	enum { WRITER_BUSY, WRITER_IDLE, WRITER_LINGERING } waiting;
	int		 more_monotonic; /* `more` made on CLOCK_MONOTONIC */
	unsigned long long dropped;	/* lines, not yet told */
} queue = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.more = PTHREAD_COND_INITIALIZER,
	.drained = PTHREAD_COND_INITIALIZER,
};
static _Atomic unsigned long long lines_dropped;

/* Written by the main thread on reload, read by every worker: atomic
 * (relaxed: each is one independent setting). */
static _Atomic int log_level_current = LOG_LEVEL_INFO;
static _Atomic int log_format_current = LOG_FORMAT_TEXT;

#define LEVEL()	((enum log_level)atomic_load_explicit(&log_level_current, memory_order_relaxed))
#define FORMAT()	((enum log_format)atomic_load_explicit(&log_format_current, memory_order_relaxed))


void
log_configure(enum log_level level, enum log_format format)
{
	atomic_store_explicit(&log_level_current, level, memory_order_relaxed);
	atomic_store_explicit(&log_format_current, format, memory_order_relaxed);
}

int
log_enabled(enum log_level level)
{
	return level <= LEVEL();
}

/* log_escape, with quotes and backslashes escaped too or as they are. */
static char *
escape(char *dst, size_t dstsize, const char *src, size_t srclen, int quotes)
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;

	if (dstsize == 0)
		return dst;
	for (size_t i = 0; i < srclen; i++) {
		unsigned char c = (unsigned char)src[i];
		char tmp[4];
		size_t n;

		if (quotes && (c == '"' || c == '\\')) {
			tmp[0] = '\\';
			tmp[1] = (char)c;
			n = 2;
		} else if (c < 0x20 || c >= 0x7f) {
			tmp[0] = '\\';
			tmp[1] = 'x';
			tmp[2] = hex[c >> 4];
			tmp[3] = hex[c & 0xf];
			n = 4;
		} else {
			tmp[0] = (char)c;
			n = 1;
		}
		if (o + n >= dstsize)
			break;
		memcpy(dst + o, tmp, n);
		o += n;
	}
	dst[o] = '\0';
	return dst;
}

char *
log_escape(char *dst, size_t dstsize, const char *src, size_t srclen)
{
	return escape(dst, dstsize, src, srclen, 1);
}

char *
log_escape_bytes(char *dst, size_t dstsize, const char *src, size_t srclen)
{
	return escape(dst, dstsize, src, srclen, 0);
}

/* A JSON string body: quotes, backslashes, control bytes and every byte
 * of 0x80 or more as \u00XX, so a line is valid JSON whatever the input. */
static void
json_escape(char *dst, size_t size, const char *src)
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;

	for (const unsigned char *p = (const unsigned char *)src; *p; p++) {
		if (*p == '"' || *p == '\\') {
			if (o + 2 >= size)
				break;
			dst[o++] = '\\';
			dst[o++] = (char)*p;
		} else if (*p < 0x20 || *p >= 0x7f) {
			if (o + 6 >= size)
				break;
			memcpy(dst + o, "\\u00", 4);
			dst[o + 4] = hex[*p >> 4];
			dst[o + 5] = hex[*p & 0xf];
			o += 6;
		} else {
			if (o + 1 >= size)
				break;
			dst[o++] = (char)*p;
		}
	}
	dst[o] = '\0';
}

/* The current UTC time as 2026-11-22T11:18:33.123Z. */
static void
format_ts(char *ts, size_t size)
{
	struct timespec now;
	struct tm tm;
	int n;

	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	n = (int)strftime(ts, size, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(ts + n, size - (size_t)n, ".%03ldZ", now.tv_nsec / 1000000);
}

/* Whole, through short writes and EINTR; a stderr that fails (closed,
 * EPIPE) loses the line: it must never take the daemon down. */
static void
write_all(const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(STDERR_FILENO, p, n);

		if (w > 0) {
			p += w;
			n -= (size_t)w;
		} else if (w == -1 && errno != EINTR)
			return;
	}
}

/* A line, queued for the writer thread, or written at once before it
 * runs (start-up, -t) and after it stops. An access line may wait for
 * others (see LOG_LINGER_US); any other goes out at once. */
static void
log_put(const char *line, size_t n, int access)
{
	size_t tail, first;

	pthread_mutex_lock(&queue.lock);
	if (!queue.running) {
		pthread_mutex_unlock(&queue.lock);
		write_all(line, n);
		return;
	}
	if (LOG_QUEUE_SIZE - queue.len < n) {
		queue.dropped++;
		pthread_mutex_unlock(&queue.lock);
		atomic_fetch_add_explicit(&lines_dropped, 1, memory_order_relaxed);
		return;
	}
	tail = (queue.head + queue.len) % LOG_QUEUE_SIZE;
	first = LOG_QUEUE_SIZE - tail < n ? LOG_QUEUE_SIZE - tail : n;
	memcpy(queue.ring + tail, line, first);
	memcpy(queue.ring, line + first, n - first);
	queue.len += n;
	if (!access)
		queue.urgent = 1;
	/* Woken only when it sleeps, and when it lingers only for a line
	 * that must not wait or once a write's worth is queued: no futex
	 * call per access line under load. */
	if (queue.waiting == WRITER_IDLE || (queue.waiting == WRITER_LINGERING &&
	    (!access || queue.len >= LOG_WRITE_MAX)))
		pthread_cond_signal(&queue.more);
	pthread_mutex_unlock(&queue.lock);
}

static void log_emit(enum log_format, const char *, const char *, const char *);

/* Waits, the lock held, unless a write's worth is queued, a line that
 * must not wait is, or the writer is stopped or flushed: until one of
 * those (log_put and log_stop wake it) or LOG_LINGER_US has passed. */
static void
linger(void)
{
	struct timespec until;

	if (queue.len >= LOG_WRITE_MAX || queue.stopping || queue.flushing ||
	    queue.urgent)
		return;
	clock_gettime(queue.more_monotonic ? CLOCK_MONOTONIC : CLOCK_REALTIME,
	    &until);
	until.tv_nsec += LOG_LINGER_US * 1000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	queue.waiting = WRITER_LINGERING;
	/* One wait: a wake is for a line that must go out now. */
	pthread_cond_timedwait(&queue.more, &queue.lock, &until);
	queue.waiting = WRITER_BUSY;
}

static void *
log_writer(void *arg)
{
	int wrote = 0;

	(void)arg;
	pthread_mutex_lock(&queue.lock);
	for (;;) {
		unsigned long long dropped;
		size_t n;

		/* (A line that must not wait, queued while the writer wrote,
		 * found it busy and woke nothing: urgent keeps linger from
		 * waiting.) */
		if (wrote)
			linger();
		wrote = 0;
		while (queue.len == 0 && !queue.stopping) {
			queue.waiting = WRITER_IDLE;
			pthread_cond_wait(&queue.more, &queue.lock);
			queue.waiting = WRITER_BUSY;
		}
		if (queue.len == 0)
			break;
		/* Up to LOG_WRITE_MAX, back to a line's end; to the ring's end
		 * at most (a line that wraps goes out in two writes). */
		n = queue.len < LOG_QUEUE_SIZE - queue.head ? queue.len :
		    LOG_QUEUE_SIZE - queue.head;
		if (n > LOG_WRITE_MAX) {
			size_t cut = LOG_WRITE_MAX;

			while (cut > 0 && queue.ring[queue.head + cut - 1] != '\n')
				cut--;
			n = cut > 0 ? cut : LOG_WRITE_MAX;
		}
		/* All that is queued goes out in this write. */
		if (n == queue.len)
			queue.urgent = 0;
		/* Producers add after head + len only: these bytes stay. */
		pthread_mutex_unlock(&queue.lock);
		write_all(queue.ring + queue.head, n);
		pthread_mutex_lock(&queue.lock);
		queue.head = (queue.head + n) % LOG_QUEUE_SIZE;
		queue.len -= n;
		wrote = 1;
		if (queue.len == 0)
			pthread_cond_broadcast(&queue.drained);
		/* Told once the backlog is out: under steady lines the
		 * queue, written a whole write at a time, seldom empties. */
		if ((dropped = queue.dropped) > 0 && queue.len < LOG_WRITE_MAX) {
			char msg[160];

			queue.dropped = 0;
			pthread_mutex_unlock(&queue.lock);
			snprintf(msg, sizeof(msg), "%llu log line%s dropped: "
			    "stderr was not read fast enough", dropped,
			    dropped == 1 ? "" : "s");
			log_emit(FORMAT(), "warn", msg, NULL);
			pthread_mutex_lock(&queue.lock);
		}
	}
	pthread_cond_broadcast(&queue.drained);
	pthread_mutex_unlock(&queue.lock);
	return NULL;
}

int
log_start(void)
{
	int rc = 0;

	pthread_mutex_lock(&queue.lock);
	if (!queue.more_monotonic && !queue.running) {
		/* The linger's deadline on the monotonic clock: on the wall
		 * clock, a step back would hold lines for its length. */
		pthread_condattr_t attr;

		if (pthread_condattr_init(&attr) == 0) {
			if (pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0) {
				pthread_cond_destroy(&queue.more);
				if (pthread_cond_init(&queue.more, &attr) == 0)
					queue.more_monotonic = 1;
				else
					pthread_cond_init(&queue.more, NULL);
			}
			pthread_condattr_destroy(&attr);
		}
	}
	if (!queue.running) {
		queue.ring = malloc(LOG_QUEUE_SIZE);
		queue.stopping = 0;
		queue.flushing = 0;
		if (queue.ring == NULL || (rc = pthread_create(&queue.thread,
		    NULL, log_writer, NULL)) != 0) {
			free(queue.ring);
			queue.ring = NULL;
			rc = -1;
		} else
			queue.running = 1;
	}
	pthread_mutex_unlock(&queue.lock);
	return rc;
}

void
log_stop(void)
{
	struct timespec deadline;
	int drained = 1;

	pthread_mutex_lock(&queue.lock);
	if (!queue.running) {
		pthread_mutex_unlock(&queue.lock);
		return;
	}
	/* Out with what is queued now, not a linger at a time. */
	queue.flushing = 1;
	pthread_cond_signal(&queue.more);
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += LOG_STOP_WAIT_MS / 1000;
	while (queue.len > 0 && drained)
		drained = pthread_cond_timedwait(&queue.drained, &queue.lock,
		    &deadline) == 0 || queue.len == 0;
	queue.stopping = 1;
	pthread_cond_signal(&queue.more);
	if (!drained) {
		/* A reader stalled for good: exiting goes on without the
		 * lines, and the writer, blocked, ends with the process. */
		pthread_mutex_unlock(&queue.lock);
		return;
	}
	pthread_mutex_unlock(&queue.lock);
	pthread_join(queue.thread, NULL);
	pthread_mutex_lock(&queue.lock);
	queue.running = 0;
	free(queue.ring);
	queue.ring = NULL;
	pthread_mutex_unlock(&queue.lock);
}

unsigned long long
log_lines_dropped(void)
{
	return atomic_load_explicit(&lines_dropped, memory_order_relaxed);
}

/* In the format the caller read once: a reload between two reads could
 * wrap a text line in JSON. */
static void
log_emit(enum log_format format, const char *level, const char *msg,
    const char *err)
{
	char line[LOG_LINE_MAX + 256], ts[40];
	int n;

	format_ts(ts, sizeof(ts));

	if (format == LOG_FORMAT_JSON) {
		char emsg[LOG_LINE_MAX], eerr[256];

		json_escape(emsg, sizeof(emsg), msg);
		json_escape(eerr, sizeof(eerr), err ? err : "");
		n = snprintf(line, sizeof(line),
		    "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":\"%s%s%s\"}\n",
		    ts, level, emsg, err ? ": " : "", eerr);
	} else {
		n = snprintf(line, sizeof(line), "%s %s %s%s%s\n", ts, level,
		    msg, err ? ": " : "", err ? err : "");
	}
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(line)) {
		n = sizeof(line) - 1;
		line[n - 1] = '\n';
	}
	log_put(line, (size_t)n, strcmp(level, "access") == 0);
}

static void
log_vlog(enum log_level level, const char *label, int with_errno,
    const char *fmt, va_list ap) __attribute__((format(printf, 4, 0)));

static void
log_vlog(enum log_level level, const char *label, int with_errno,
    const char *fmt, va_list ap)
{
	char msg[LOG_LINE_MAX];
	int saved = errno;

	if (level > LEVEL())
		return;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	log_emit(FORMAT(), label, msg, with_errno ? strerror(saved) : NULL);
	errno = saved;
}

void
log_errorx(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_vlog(LOG_LEVEL_ERROR, "error", 0, fmt, ap);
	va_end(ap);
}

void
log_warn(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_vlog(LOG_LEVEL_WARN, "warn", 1, fmt, ap);
	va_end(ap);
}

void
log_warnx(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_vlog(LOG_LEVEL_WARN, "warn", 0, fmt, ap);
	va_end(ap);
}

void
log_info(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_vlog(LOG_LEVEL_INFO, "info", 0, fmt, ap);
	va_end(ap);
}

void
log_debug(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_vlog(LOG_LEVEL_DEBUG, "debug", 0, fmt, ap);
	va_end(ap);
}

void
log_access(const char *route, const char *key, size_t keylen, int status,
    const char *result, long long cost, long long took_us)
{
	char ekey[1024], line[LOG_LINE_MAX], ts[40];
	enum log_format format = FORMAT();
	int n;

	if (format == LOG_FORMAT_TEXT) {
		log_escape(ekey, sizeof(ekey), key, keylen);
		snprintf(line, sizeof(line), "check route=%s key=\"%s\" status=%d "
		    "result=%s cost=%lld us=%lld", route ? route : "-", ekey,
		    status, result, cost, took_us);
		log_emit(format, "access", line, NULL);
		return;
	}
	{
		char raw[sizeof(ekey)];	/* a whole encoded key (771 bytes at most) */

		snprintf(raw, sizeof(raw), "%.*s", (int)(keylen < sizeof(raw) - 1 ?
		    keylen : sizeof(raw) - 1), key);
		json_escape(ekey, sizeof(ekey), raw);
	}
	format_ts(ts, sizeof(ts));
	/* No route is null, as /v1/check says it; route names need no
	 * escaping (the loader takes A-Z a-z 0-9 _ - . only). */
	n = snprintf(line, sizeof(line), "{\"ts\":\"%s\",\"level\":\"access\","
	    "\"msg\":\"check\",\"route\":%s%s%s,\"key\":\"%s\",\"status\":%d,"
	    "\"result\":\"%s\",\"cost\":%lld,\"us\":%lld}\n", ts,
	    route ? "\"" : "", route ? route : "null", route ? "\"" : "", ekey,
	    status, result, cost, took_us);
	if (n > 0 && (size_t)n < sizeof(line))
		log_put(line, (size_t)n, 1);
}

void
fatal(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_vlog(LOG_LEVEL_ERROR, "fatal", 1, fmt, ap);
	va_end(ap);
	log_stop();
	exit(1);
}

void
fatalx(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_vlog(LOG_LEVEL_ERROR, "fatal", 0, fmt, ap);
	va_end(ap);
	log_stop();
	exit(1);
}
