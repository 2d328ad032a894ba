/*
 * ratelimitd: command line, startup, signals, policy reloads and shutdown.
 *
 * The main thread owns the listening socket and the policy file. It starts
 * the workers, then waits on its own event base for signals (HUP reloads,
 * TERM/INT drain) and for changes of the policy file: an inotify watch on
 * the file's directory catches editors' renames and the Kubernetes
 * ConfigMap symlink swap, one on the file its writes in place, and a
 * once-a-second stat() is the fallback. A
 * reload parses into a new policy and hands it to the workers only if it
 * validates; otherwise the old one stays and the errors are logged.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "clock.h"
#include "config.h"
#include "config_json.h"
#include "log.h"
#include "metrics.h"
#include "policy.h"
#include "worker.h"
#include "xmalloc.h"

#define RATELIMITD_VERSION	"0.1.0"
#define MAIN_LISTEN_BACKLOG	4096	/* the kernel caps it at somaxconn */
#define MAIN_POLL_US		1000000	/* stat() fallback for file changes */
/*
 * A changed policy file is loaded once it has held still (same size, times
 * and inode) across MAIN_SETTLE_US, so that a file written in several
 * steps is not loaded half-written, its last routes missing (their traffic
 * would pass unlimited): within SPEC's 2 s of the change, counted from the
 * last write. A writer that never stops for MAIN_SETTLE_US is given up on
 * after MAIN_SETTLE_MAX_US, and the file loaded as it is. That bound was
 * 1.5 s, and a file written line by line over 3.5 s was loaded with its
 * first two routes of eight (an audit).
 */
#define MAIN_SETTLE_US		250000
#define MAIN_GONE_US		1000000	/* missing this long is said */
#define MAIN_SETTLE_MAX_US	10000000

/* The main thread's state. */
struct env {
	struct event_base	*base;
	struct config		*config;	/* the policy in force */
	struct worker		*workers[CONFIG_WORKERS_MAX];
	int			 nworkers;
	int			 listen_fd;
	char			*unix_path;	/* removed at exit */
	struct stat		 unix_stat;	/* ...if it is still this one */
	int			 inotify_fd;
	int			 dir_wd;	/* the policy's directory, or -1 */
	int			 file_wd;	/* the policy file, or -1 */
	struct event		*inotify_ev;
	struct event		*debounce_ev;
	struct event		*poll_ev;
	struct stat		 loaded_stat;	/* of the file last loaded */
	struct stat		 pending_stat;	/* changed, settling */
	int			 pending;
	long long		 pending_since_us; /* first seen changed */
	long long		 gone_since_us;	/* the file missing since, or 0 */
	int			 gone_logged;
	long long		 pending_stat_us; /* first seen as pending_stat */
	int			 stopping;
	struct event		*reload_ev;	/* SIGHUPs, one reload */
	struct event		*worker_exit_ev;
	struct event		*released_ev;	/* policies to free */
};

static void
usage(FILE *fp)
{
	fprintf(fp,
	    "usage: ratelimitd -c FILE      run with this policy file (--config)\n"
	    "       ratelimitd -t -c FILE   validate the policy file and exit (--test)\n"
	    "       ratelimitd -v           print the version (--version)\n"
	    "       ratelimitd -h           print this help (--help)\n");
}

/* Up to CONFIG_ERRORS_SHOWN lines, then how many more, each to say. The
 * count goes at the place of the first line not said, so that it too has
 * the FILE:LINE:COL a tool reading the output expects of every line. */
static void
say_lines(const char *path, char *const *lines, size_t n, const char *what,
    const char *tag, void (*say)(const char *))
{
	size_t plen = strlen(path), unsaid;
	char more[PATH_MAX + 128];
	int line, col, at = 0;

	for (size_t i = 0; i < n && i < CONFIG_ERRORS_SHOWN; i++)
		say(lines[i]);
	if (n <= CONFIG_ERRORS_SHOWN)
		return;
	unsaid = n - CONFIG_ERRORS_SHOWN;
	if (strncmp(lines[CONFIG_ERRORS_SHOWN], path, plen) != 0 ||
	    sscanf(lines[CONFIG_ERRORS_SHOWN] + plen, ":%d:%d: %n", &line, &col,
	    &at) != 2 || at == 0)
		snprintf(more, sizeof(more), "%s: ... and %zu more %s%s", path,
		    unsaid, what, unsaid == 1 ? "" : "s");
	else
		snprintf(more, sizeof(more), "%s:%d:%d: %s... and %zu more %s%s "
		    "from here on", path, line, col, tag, unsaid, what,
		    unsaid == 1 ? "" : "s");
	say(more);
}

/* A refused file: its errors, then its warnings. -t and a refused start
 * print them; a refused reload logs them. */
static void
say_refused(const char *path, const struct config_errors *errors,
    void (*say_error)(const char *), void (*say_warning)(const char *))
{
	say_lines(path, errors->lines, errors->n, "error", "", say_error);
	say_lines(path, errors->warnings, errors->nwarnings, "warning",
	    "warning: ", say_warning);
}

static void
print_line(const char *line)
{
	fprintf(stderr, "%s\n", line);
}

static void
log_error_line(const char *line)
{
	log_errorx("%s", line);
}

static void
log_warning_line(const char *line)
{
	log_warnx("%s", line);
}

static void
log_warnings(const struct config *c)
{
	long long in_force = config_connections_in_force(c);

	for (size_t i = 0; i < c->nwarnings; i++)
		log_warnx("%s", c->warnings[i]);
	if (in_force < c->max_connections)
		log_warnx("server.max_connections %lld: the file descriptor "
		    "limit (ulimit -n) leaves room for %lld; raise it (systemd "
		    "LimitNOFILE) for more", c->max_connections, in_force);
}

/* Nobody accepts at the socket (connect is refused)? Accepted, or a full
 * backlog (EAGAIN), means a listener is there; any other failure (no
 * permission, a datagram socket) is said as it is, and the socket left. */
static int
unix_socket_stale_or_exit(const char *spec, const struct sockaddr_un *sun)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int rc, error;

	if (fd == -1)
		fatal("socket");
	rc = connect(fd, (const struct sockaddr *)sun, sizeof(*sun));
	error = errno;
	close(fd);
	if (rc == -1 && error == ECONNREFUSED)
		return 1;
	if (rc == 0 || error == EAGAIN || error == EINPROGRESS)
		fatalx("listen %s: another process is listening there", spec);
	fatalx("listen %s: a socket is there, and connecting to it failed (%s): "
	    "remove it if no process uses it", spec, strerror(error));
}

/* 127.0.0.0/8, ::1, or ::ffff:127.0.0.0/104. */
static int
loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ((const unsigned char *)&((const struct sockaddr_in *)
		    (const void *)sa)->sin_addr)[0] == 127;
	if (sa->sa_family == AF_INET6) {
		const struct in6_addr *a = &((const struct sockaddr_in6 *)
		    (const void *)sa)->sin6_addr;

		return IN6_IS_ADDR_LOOPBACK(a) ||
		    (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
	}
	return 0;
}

/* The addresses of a host:port listen spec, and in *chosen the one to
 * bind; NULL with *why when it cannot be resolved. */
static struct addrinfo *
listen_resolve(const char *spec, struct addrinfo **chosen, const char **why)
{
	struct addrinfo hints, *res, *ai;
	char host[256], port[8];
	const char *colon = strrchr(spec, ':');
	size_t hl = (size_t)(colon - spec);
	int rc;

	if (spec[0] == '[') {
		memcpy(host, spec + 1, hl - 2);
		host[hl - 2] = '\0';
	} else {
		if (hl >= sizeof(host)) {
			*why = "host name too long";
			return NULL;
		}
		memcpy(host, spec, hl);
		host[hl] = '\0';
	}
	snprintf(port, sizeof(port), "%s", colon + 1);
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	if ((rc = getaddrinfo(host, port, &hints, &res)) != 0) {
		*why = gai_strerror(rc);
		return NULL;
	}
	/* A name's IPv4 address first, as for redis.address: a stock
	 * /etc/hosts gives ::1 first for localhost, and the daemon
	 * listened there alone while every recipe and the Docker
	 * health check ask 127.0.0.1. */
	for (ai = res; ai != NULL && ai->ai_family != AF_INET; ai = ai->ai_next)
		;
	*chosen = ai != NULL ? ai : res;
	return res;
}

#define LISTEN_BEYOND_LOOPBACK "reaches beyond loopback: whoever can " \
	"connect can ask checks, and so charge any client's limits; keep the " \
	"port to the gateway's network"

/* -t: what starting would say of server.listen, short of binding (nginx
 * -t, too, resolves its listen addresses): the error printed and -1 when
 * starting would fail, else 0 and whether it reaches beyond loopback. */
static int
listen_check(const struct config *c, const char *where, int *beyond)
{
	struct addrinfo *res, *ai;
	const char *why;

	*beyond = 0;
	if (strncmp(c->listen, "unix:", 5) == 0)
		return 0;
	if ((res = listen_resolve(c->listen, &ai, &why)) == NULL) {
		fprintf(stderr, "%s%s: server.listen \"%s\": %s\n", c->path,
		    where, c->listen, why);
		return -1;
	}
	*beyond = !loopback(ai->ai_addr);
	freeaddrinfo(res);
	return 0;
}

static int
listen_socket(const char *spec, char **unix_path, struct stat *unix_stat)
{
	int fd, one = 1;

	if (strncmp(spec, "unix:", 5) == 0) {
		struct sockaddr_un sun;
		struct stat sb;

		memset(&sun, 0, sizeof(sun));
		sun.sun_family = AF_UNIX;
		strncpy(sun.sun_path, spec + 5, sizeof(sun.sun_path) - 1);
		/* A stale socket from a previous run is removed; never
		 * anything else, nor one a process still listens on: that
		 * would silently take a running daemon's gateway away. */
		if (lstat(sun.sun_path, &sb) == 0 && S_ISSOCK(sb.st_mode)) {
			if (unix_socket_stale_or_exit(spec, &sun))
				unlink(sun.sun_path);
		}
		if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    0)) == -1)
			fatal("socket");
		if (bind(fd, (struct sockaddr *)&sun, sizeof(sun)) == -1)
			fatal("bind %s", spec);
		/* Connecting needs write permission, and the gateway runs as
		 * another user: under a umask such as systemd's UMask=0077 the
		 * socket was its owner's alone. As open as a loopback port;
		 * the directory's mode says who may reach it. */
		if (chmod(sun.sun_path, 0666) == -1)
			fatal("chmod %s", sun.sun_path);
		if (lstat(sun.sun_path, unix_stat) == -1)
			fatal("lstat %s", sun.sun_path);
		*unix_path = xstrdup(sun.sun_path);
	} else {
		struct addrinfo *res, *ai;
		const char *why;

		if ((res = listen_resolve(spec, &ai, &why)) == NULL)
			fatalx("listen %s: %s", spec, why);
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK |
		    SOCK_CLOEXEC, 0);
		if (fd == -1)
			fatal("socket");
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == -1)
			fatal("bind %s", spec);
		if (!loopback(ai->ai_addr))
			log_warnx("listen %s " LISTEN_BEYOND_LOOPBACK, spec);
		freeaddrinfo(res);
	}
	if (listen(fd, MAIN_LISTEN_BACKLOG) == -1)
		fatal("listen %s", spec);
	return fd;
}

/* The threads server.workers makes (0 is auto: one per core). */
static int
workers_for(int written)
{
	long n;

	if (written > 0)
		return written;
	n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > CONFIG_WORKERS_MAX ? CONFIG_WORKERS_MAX : (int)n;
}

static void
reload(struct env *env, const char *why)
{
	struct config_errors errors;
	struct config *c;
	struct stat before;

	/* The file's state before it is read: a change while it is read then
	 * still differs from what is recorded, and is loaded in its turn. */
	if (stat(env->config->path, &before) == -1)
		memset(&before, 0, sizeof(before));
	c = config_load(env->config->path, &errors);
	if (c == NULL) {
		/* An error, not a warning: SPEC 2 has every refusal logged
		 * with its places, whatever log.level hides. */
		log_errorx("reload (%s) refused; the policy in force stays:", why);
		say_refused(env->config->path, &errors, log_error_line,
		    log_warning_line);
		metrics_reload(0);
		/* Not again until the file changes; but a file that could not
		 * be read for want of descriptors or memory is tried at the
		 * next look (within a second), or a ConfigMap update made in
		 * such a moment would never be loaded. */
		if (errors.passing)
			log_warnx("reload (%s): a changed file is tried again "
			    "within a second", why);
		else
			env->loaded_stat = before;
		config_errors_free(&errors);
		return;
	}
	/* The socket and threads stay as they are; so does what the policy
	 * says of them, or /v1/policy would show values not in force (and the
	 * next reload would warn again for a file put back as it was). */
	if (strcmp(c->listen, env->config->listen) != 0 ||
	    workers_for(c->workers) != env->nworkers) {
		char asked[16] = "auto";

		if (c->workers > 0)
			snprintf(asked, sizeof(asked), "%d", c->workers);
		log_warnx("reload: server.listen and server.workers take effect "
		    "only on restart; the file asks for listen %s, workers %s; "
		    "in force: listen %s, workers %d", c->listen, asked,
		    env->config->listen, env->nworkers);
	}
	/* "auto" where 2 was written, on 2 cores, is what is in force */
	free(c->listen);
	c->listen = xstrdup(env->config->listen);
	c->workers = env->config->workers;
	c->workers_running = env->config->workers_running;
	metrics_show_policy(c);
	policy_prepare(c);
	config_render_json(c);
	log_configure((enum log_level)c->log_level, (enum log_format)c->log_format);
	for (int i = 0; i < env->nworkers; i++)
		worker_set_config(env->workers[i], c);
	config_unref(env->config);
	env->config = c;
	env->loaded_stat = before;
	metrics_reload(1);
	log_info("reload (%s): policy %s loaded, %zu route%s", why, c->path,
	    c->nroutes, c->nroutes == 1 ? "" : "s");
	log_warnings(c);
}

/* The change time too: a chmod that makes a refused file readable is a
 * reason to try it again. */
static int
same_file_state(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino &&
	    a->st_size == b->st_size &&
	    a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
	    a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
	    a->st_ctim.tv_sec == b->st_ctim.tv_sec &&
	    a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* wd watching path for mask, again: the name may have come to mean
 * another file or directory (an editor's rename, a symlink swapped). */
static void
rewatch(int fd, int *wd, const char *path, uint32_t mask)
{
	int now = inotify_add_watch(fd, path, mask);

	if (*wd != -1 && now != *wd)
		(void)inotify_rm_watch(fd, *wd);	/* gone already, maybe */
	*wd = now;
}

/*
 * The policy's directory for names coming and going (an editor's rename,
 * a ConfigMap's symlink swap, a delete) and the file itself for writes in
 * place. One watch on the directory for writes too woke this thread on
 * every write to any file beside the policy: with the daemon's own access
 * log written there, a tenth of a core at 50,000 checks a second.
 */
static void
watch_policy_names(struct env *env)
{
	char *copy;

	if (env->inotify_fd == -1)
		return;
	copy = xstrdup(env->config->path);
	rewatch(env->inotify_fd, &env->dir_wd, dirname(copy), IN_ONLYDIR |
	    IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM);
	free(copy);
	rewatch(env->inotify_fd, &env->file_wd, env->config->path,
	    IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB);
}

/* From the settle timer and the poll: reloads a changed file once it has
 * settled (see MAIN_SETTLE_US). */
static void
on_file_check(evutil_socket_t fd, short what, void *arg)
{
	struct env *env = arg;
	struct stat sb;
	long long now;

	(void)fd;
	(void)what;
	if (env->stopping)
		return;
	watch_policy_names(env);
	now = mono_us();
	if (stat(env->config->path, &sb) == -1) {
		/* Gone for a moment in an editor's or a ConfigMap's swap; for
		 * longer, said once, as nothing else would tell, at the level
		 * of a refused reload, which it counts as. */
		if (env->gone_since_us == 0)
			env->gone_since_us = now;
		else if (!env->gone_logged &&
		    now - env->gone_since_us >= MAIN_GONE_US) {
			log_errorx("%s:1:1: cannot open: %s; the policy in force "
			    "stays, and the file is loaded again when it is back",
			    env->config->path, strerror(errno));
			env->gone_logged = 1;
			/* A refused reload to the alerts, as by SIGHUP: the
			 * policy in force is on disk no more, and the next
			 * start (an ExecStartPre -t) would fail. */
			metrics_reload(0);
		}
		env->pending = 0;
		return;
	}
	env->gone_since_us = 0;
	if (env->gone_logged)
		/* Back: loaded again, even as it was, to say so. */
		memset(&env->loaded_stat, 0, sizeof(env->loaded_stat));
	env->gone_logged = 0;
	if (same_file_state(&sb, &env->loaded_stat)) {
		env->pending = 0;
		return;
	}
	if (!env->pending || !same_file_state(&sb, &env->pending_stat)) {
		if (!env->pending)
			env->pending_since_us = now;
		env->pending = 1;
		env->pending_stat = sb;
		env->pending_stat_us = now;
	}
	/* Held still for the whole settle time (two looks, by the timer and
	 * the poll, a moment apart prove nothing), or out of patience. */
	if (now - env->pending_stat_us < MAIN_SETTLE_US &&
	    now - env->pending_since_us < MAIN_SETTLE_MAX_US) {
		struct timeval tv = tv_us(MAIN_SETTLE_US - (now - env->pending_stat_us));

		event_del(env->debounce_ev);
		event_add(env->debounce_ev, &tv);
		return;
	}
	env->pending = 0;
	reload(env, "file changed");
}

static void
on_inotify(evutil_socket_t fd, short what, void *arg)
{
	struct env *env = arg;
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	struct timeval tv = tv_us(MAIN_SETTLE_US);

	(void)what;
	while (read(fd, buf, sizeof(buf)) > 0)
		;
	watch_policy_names(env);
	/* Not re-armed by every event: another file in the directory that
	 * changes all the time must not hold the reload off. */
	if (!evtimer_pending(env->debounce_ev, NULL))
		event_add(env->debounce_ev, &tv);
}

/*
 * systemd's readiness protocol (sd_notify(3)) without libsystemd: one
 * datagram to $NOTIFY_SOCKET, when there is one. Under Type=notify,
 * `systemctl start` returns, and `systemctl reload` may send SIGHUP, only
 * once the daemon serves and its handlers are in place (a SIGHUP in the
 * first milliseconds after exec, before main runs, ends the process).
 */
static void
notify_systemd(const char *state)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sun;
	size_t plen;
	int fd;

	if (path == NULL || (path[0] != '/' && path[0] != '@') ||
	    (plen = strlen(path)) >= sizeof(sun.sun_path))
		return;
	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	memcpy(sun.sun_path, path, plen);
	if (sun.sun_path[0] == '@')
		sun.sun_path[0] = '\0';	/* an abstract socket */
	if ((fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)) == -1)
		return;
	(void)sendto(fd, state, strlen(state), MSG_NOSIGNAL,
	    (struct sockaddr *)&sun,
	    (socklen_t)(offsetof(struct sockaddr_un, sun_path) + plen));
	close(fd);
}

/* The signals the daemon handles, and their names for the log. */
static const struct {
	int		 signo;
	const char	*name;
} handled_signals[] = {
	{ SIGHUP, "SIGHUP" }, { SIGTERM, "SIGTERM" }, { SIGINT, "SIGINT" },
	{ SIGQUIT, "SIGQUIT" }, { SIGUSR1, "SIGUSR1" }, { SIGUSR2, "SIGUSR2" },
};
#define NHANDLED_SIGNALS (sizeof(handled_signals) / sizeof(handled_signals[0]))

/* SIG_BLOCK or SIG_UNBLOCK the handled signals for the calling thread. */
static void
hold_handled_signals(int how)
{
	sigset_t set;

	sigemptyset(&set);
	for (size_t i = 0; i < NHANDLED_SIGNALS; i++)
		sigaddset(&set, handled_signals[i].signo);
	pthread_sigmask(how, &set, NULL);
}

static void
ignore_sigpipe(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_IGN;
	sigaction(SIGPIPE, &sa, NULL);
}

static const char *
signal_name(int sig)
{
	for (size_t i = 0; i < NHANDLED_SIGNALS; i++)
		if (handled_signals[i].signo == sig)
			return handled_signals[i].name;
	return "signal";
}

/* Activated by SIGHUP: however many arrived since the last reload, and
 * however long each reload takes, one reload runs per loop iteration, and
 * after a SIGTERM of the same iteration none does. (libevent runs a
 * signal's callback once per delivery: 300 SIGHUPs were 300 reloads, and
 * with a large policy a SIGTERM behind them waited past a supervisor's
 * grace period.) */
static void
on_reload(evutil_socket_t fd, short what, void *arg)
{
	struct env *env = arg;

	(void)fd;
	(void)what;
	if (env->stopping)
		log_info("SIGHUP ignored: stopping");
	else
		reload(env, "SIGHUP");
}

static void
on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct env *env = arg;

	(void)what;
	if (sig == SIGHUP) {
		event_active(env->reload_ev, EV_TIMEOUT, 0);
		return;
	}
	/* nginx and Envoy reopen their log files on SIGUSR1; this log is
	 * stderr, and the default action would end the process. */
	if (sig == SIGUSR1 || sig == SIGUSR2) {
		log_info("%s ignored: the log goes to stderr, there is no file "
		    "to reopen", signal_name(sig));
		return;
	}
	if (env->stopping) {
		/* Ctrl-C twice, or an impatient supervisor: stop waiting. */
		log_info("%s again: answering what is left now", signal_name(sig));
		for (int i = 0; i < env->nworkers; i++)
			worker_stop_now(env->workers[i]);
		return;
	}
	/* SIGQUIT too: nginx's graceful stop, where its default would
	 * dump core without draining. */
	env->stopping = 1;
	notify_systemd("STOPPING=1");
	log_info("%s: draining (at most %lld ms)", signal_name(sig),
	    env->config->drain_timeout_us / 1000);
	for (int i = 0; i < env->nworkers; i++)
		worker_drain(env->workers[i]);
	/* Workers close their duplicates as they drain; closing ours makes the
	 * kernel refuse new connections at once instead of queueing them. */
	close(env->listen_fd);
	env->listen_fd = -1;
	/* The loop runs on until the workers are done (on_worker_exit), so a
	 * second signal is still heard. */
}

/* A worker let go of a policy's last reference: it is freed here, off the
 * workers' loops (a policy of 1,000 regex routes takes about 10 ms). */
static void
wake_main_to_free(void *arg)
{
	event_active(arg, EV_READ, 0);
}

static void
on_released(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	config_free_released();
}

static void
on_worker_exit(evutil_socket_t fd, short what, void *arg)
{
	struct env *env = arg;

	(void)fd;
	(void)what;
	for (int i = 0; i < env->nworkers; i++)
		if (!atomic_load(&env->workers[i]->w_exited))
			return;
	event_base_loopexit(env->base, NULL);
}

static void
watch_policy_file(struct env *env)
{
	struct timeval poll = { MAIN_POLL_US / 1000000, MAIN_POLL_US % 1000000 };

	env->debounce_ev = evtimer_new(env->base, on_file_check, env);
	env->poll_ev = event_new(env->base, -1, EV_PERSIST, on_file_check, env);
	event_add(env->poll_ev, &poll);
	env->inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (env->inotify_fd == -1)
		log_warn("inotify: the policy file is looked at once a second "
		    "only");
	else {
		/* Both are tried again at every poll. */
		watch_policy_names(env);
		if (env->dir_wd == -1 || env->file_wd == -1)
			log_warnx("inotify on the policy %s failed: its changes are "
			    "seen by a look once a second until it takes",
			    env->dir_wd == -1 ? "file's directory" : "file");
		env->inotify_ev = event_new(env->base, env->inotify_fd,
		    EV_READ | EV_PERSIST, on_inotify, env);
		event_add(env->inotify_ev, NULL);
	}
}

/*
 * Exiting: a signal from now on (a supervisor's second SIGTERM, or `make
 * run`'s trap forwarding Ctrl-C) must not turn a clean exit into death by
 * that signal, 128+N. Freeing a signal event puts back the default action,
 * so the signals are held first and ignored after (which drops any held).
 */
static void
ignore_handled_signals(struct event **sigs)
{
	struct sigaction ign;

	hold_handled_signals(SIG_BLOCK);
	memset(&ign, 0, sizeof(ign));
	ign.sa_handler = SIG_IGN;
	for (size_t i = 0; i < NHANDLED_SIGNALS; i++) {
		event_free(sigs[i]);
		sigaction(handled_signals[i].signo, &ign, NULL);
	}
}

static int
run(const char *path)
{
	struct env env;
	struct config_errors errors;
	struct event *sigs[NHANDLED_SIGNALS];

	memset(&env, 0, sizeof(env));
	env.inotify_fd = -1;
	env.dir_wd = env.file_wd = -1;
	if (stat(path, &env.loaded_stat) == -1)
		memset(&env.loaded_stat, 0, sizeof(env.loaded_stat));
	if ((env.config = config_load(path, &errors)) == NULL) {
		say_refused(path, &errors, print_line, print_line);
		config_errors_free(&errors);
		return 1;
	}
	log_configure((enum log_level)env.config->log_level,
	    (enum log_format)env.config->log_format);
	/* Before the workers, with the handled signals still blocked: the
	 * writer thread inherits the mask, as they do. */
	if (log_start() == -1)
		log_warnx("cannot start the log writer thread: lines are "
		    "written by the threads that log them");
	log_warnings(env.config);
	metrics_show_policy(env.config);
	policy_prepare(env.config);

	if (evthread_use_pthreads() == -1)
		fatalx("libevent has no pthreads support");
	if ((env.base = event_base_new()) == NULL)
		fatalx("cannot create the event base");

	env.released_ev = event_new(env.base, -1, 0, on_released, NULL);
	config_defer_free(wake_main_to_free, env.released_ev);
	env.listen_fd = listen_socket(env.config->listen, &env.unix_path,
	    &env.unix_stat);
	env.nworkers = workers_for(env.config->workers);
	env.config->workers_running = env.nworkers;
	config_render_json(env.config);
	for (int i = 0; i < env.nworkers; i++)
		env.workers[i] = worker_new(i, env.listen_fd, env.config);
	env.worker_exit_ev = event_new(env.base, -1, 0, on_worker_exit, &env);
	for (int i = 0; i < env.nworkers; i++)
		if (worker_start(env.workers[i], env.worker_exit_ev) == -1)
			fatalx("cannot start worker %d", i);
	env.reload_ev = event_new(env.base, -1, 0, on_reload, &env);
	for (size_t i = 0; i < NHANDLED_SIGNALS; i++) {
		sigs[i] = evsignal_new(env.base, handled_signals[i].signo,
		    on_signal, &env);
		event_add(sigs[i], NULL);
	}
	hold_handled_signals(SIG_UNBLOCK);	/* blocked in main() */
	watch_policy_file(&env);
	log_info("ratelimitd %s listening on %s with %d worker%s, redis %s, "
	    "%zu route%s", RATELIMITD_VERSION, env.config->listen, env.nworkers,
	    env.nworkers == 1 ? "" : "s", env.config->redis_address,
	    env.config->nroutes, env.config->nroutes == 1 ? "" : "s");
	notify_systemd("READY=1");

	event_base_dispatch(env.base);

	for (int i = 0; i < env.nworkers; i++)
		worker_join(env.workers[i]);
	config_defer_free(NULL, NULL);
	config_free_released();
	event_free(env.released_ev);
	if (env.listen_fd != -1)
		close(env.listen_fd);
	/* Not a socket put there since (a daemon started after ours was
	 * deleted): that one's gateway would lose it. */
	if (env.unix_path) {
		struct stat sb;

		if (lstat(env.unix_path, &sb) == 0 && sb.st_dev == env.unix_stat.st_dev &&
		    sb.st_ino == env.unix_stat.st_ino)
			unlink(env.unix_path);
		free(env.unix_path);
	}
	ignore_handled_signals(sigs);
	event_free(env.reload_ev);
	if (env.inotify_ev)
		event_free(env.inotify_ev);
	if (env.inotify_fd != -1)
		close(env.inotify_fd);
	event_free(env.debounce_ev);
	event_free(env.poll_ev);
	event_free(env.worker_exit_ev);
	event_base_free(env.base);
	config_unref(env.config);
	log_info("stopped");
	log_stop();
	return 0;
}

/* libevent's own messages (out of descriptors, a failed epoll_ctl) went
 * to stderr in its "[warn] ..." form, between JSON log lines. */
static void
on_libevent_log(int severity, const char *msg)
{
	if (severity == EVENT_LOG_ERR)
		log_errorx("libevent: %s", msg);
	else if (severity == EVENT_LOG_WARN)
		log_warnx("libevent: %s", msg);
	else if (severity == EVENT_LOG_MSG)
		log_info("libevent: %s", msg);
	else
		log_debug("libevent: %s", msg);
}

/* Started with fd 0, 1 or 2 closed, the next descriptors opened took
 * their numbers: libevent's signal pipe became fd 2, and every log line
 * was read back as signals (an audit saw a logged path end the process as
 * SIGTERM). /dev/null holds each closed one, as sshd does. */
static void
standard_streams_open(void)
{
	for (int fd = 0; fd <= 2; fd++) {
		if (fcntl(fd, F_GETFD) != -1 || errno != EBADF)
			continue;
		if (open("/dev/null", O_RDWR) != fd)
			_exit(1);	/* no stderr to say it on */
	}
}

int
main(int argc, char **argv)
{
	/* The long forms people type by habit. */
	static const struct option longopts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "test", no_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'v' },
		{ NULL, 0, NULL, 0 }
	};
	const char *path = NULL;
	int test_only = 0, want_help = 0, want_version = 0, ch;

	/* A signal before its handler is in place would take its default
	 * action: a SIGHUP (`systemctl reload` just after start) or a
	 * SIGUSR1 (a log rotation) would end the process, and a SIGTERM
	 * while a large policy loads would end it with 143, not 0. Held
	 * back from the first instruction of ours until run() has the
	 * handlers, each is then acted on. The workers, started meanwhile,
	 * keep them blocked, so they are always the main thread's. A
	 * SIGPIPE (a peer gone mid-write; anyone's kill) is ignored, and
	 * first: whoever sees the others held back can send it safely. A
	 * write's EPIPE says all it would. */
	ignore_sigpipe();
	hold_handled_signals(SIG_BLOCK);
	standard_streams_open();
	event_set_log_callback(on_libevent_log);

	/* Our own messages, named "ratelimitd" as the others are, rather
	 * than getopt's, named after however the binary was invoked. */
	opterr = 0;
	while ((ch = getopt_long(argc, argv, ":c:thv", longopts, NULL)) != -1) {
		switch (ch) {
		case 'c':
			/* One daemon serves one policy: a second file given
			 * by habit or by a wrapper script would otherwise
			 * win silently, and -t would vouch for it alone. */
			if (path != NULL) {
				fprintf(stderr, "ratelimitd: -c given twice "
				    "(\"%s\" and \"%s\"): one policy file per "
				    "daemon\n", path, optarg);
				usage(stderr);
				return 1;
			}
			path = optarg;
			break;
		case 't':
			test_only = 1;
			break;
		/* Acted on once the whole line is read: a mistaken option
		 * beside them is said, not passed over with exit 0. */
		case 'h':
			want_help = 1;
			break;
		case 'v':
			want_version = 1;
			break;
		case ':':
			fprintf(stderr, "ratelimitd: %s needs a file name\n",
			    optopt == 'c' && strncmp(argv[optind - 1], "--", 2) != 0 ?
			    "-c" : "--config");
			usage(stderr);
			return 1;
		default:
			if (strncmp(argv[optind - 1], "--", 2) != 0)
				fprintf(stderr, "ratelimitd: unknown option -%c\n", optopt);
			else if (optopt != 0)	/* a known one, given a value */
				fprintf(stderr, "ratelimitd: \"%s\": that option takes "
				    "no value\n", argv[optind - 1]);
			else
				fprintf(stderr, "ratelimitd: unknown option \"%s\"\n",
				    argv[optind - 1]);
			usage(stderr);
			return 1;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "ratelimitd: unexpected argument \"%s\"\n", argv[optind]);
		usage(stderr);
		return 1;
	}
	if (want_help) {
		/* nginx -v -h: the version above the help */
		if (want_version)
			printf("ratelimitd %s\n", RATELIMITD_VERSION);
		usage(stdout);
		return 0;
	}
	if (want_version) {
		printf("ratelimitd %s\n", RATELIMITD_VERSION);
		/* nginx -v -t: the version, then the check */
		if (!test_only)
			return 0;
	}
	if (path == NULL || *path == '\0') {
		fprintf(stderr, "ratelimitd: %s\n", path ? "-c needs a file name, "
		    "not an empty one" : "-c FILE is required");
		usage(stderr);
		return 1;
	}
	if (test_only) {
		struct config_errors errors;
		struct config *c;

		hold_handled_signals(SIG_UNBLOCK);	/* Ctrl-C ends a check */
		c = config_load(path, &errors);

		if (c == NULL) {
			say_refused(path, &errors, print_line, print_line);
			config_errors_free(&errors);
			return 1;
		}
		char where[32] = "";
		int failed, beyond;

		if (c->listen_line > 0)	/* FILE:LINE:COL, as other errors */
			snprintf(where, sizeof(where), ":%d:%d", c->listen_line,
			    c->listen_col);
		/* the error first, then the warnings, as for a refused file */
		failed = listen_check(c, where, &beyond) == -1;
		for (size_t i = 0; i < c->nwarnings; i++)
			fprintf(stderr, "%s\n", c->warnings[i]);
		if (beyond)
			fprintf(stderr, "%s%s: warning: server.listen %s "
			    LISTEN_BEYOND_LOOPBACK "\n", c->path, where, c->listen);
		if (failed) {
			config_unref(c);
			return 1;
		}
		printf("%s: ok\n", path);
		config_unref(c);
		return 0;
	}
	return run(path);
}
