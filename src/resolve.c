/*
 * Name lookups on detached threads. The thread and the loop share one
 * struct lookup: the thread writes the answer, then, under lk_lock, either
 * activates lk_done (the loop runs the callback and frees the lookup) or,
 * when the loop has cancelled it meanwhile, frees it itself. The loop
 * cancels under the same lock, so the event is never activated after it is
 * freed, even when the worker's event base is about to go; and the loop
 * takes the lock before freeing, so the thread is never still unlocking
 * freed memory.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/event.h>

#include "resolve.h"
#include "xmalloc.h"

struct lookup {
	pthread_mutex_t	 lk_lock;
	int		 lk_running;	/* the thread has not answered yet */
	int		 lk_cancelled;	/* the loop no longer wants it */
	struct event	*lk_done;
	lookup_cb	 lk_cb;
	void		*lk_arg;
	char		 lk_host[256];
	char		 lk_ip[INET6_ADDRSTRLEN];
	char		 lk_error[128];
};

static void
lookup_free(struct lookup *lk)
{
	pthread_mutex_destroy(&lk->lk_lock);
	free(lk);
}

static void *
lookup_main(void *arg)
{
	struct lookup *lk = arg;
	struct addrinfo hints, *res = NULL;
	int rc, cancelled;

	/* IPv4 first, then IPv6, as hiredis 0.14 does: with AF_UNSPEC a stock
	 * /etc/hosts gives ::1 first for localhost, and a Redis bound to
	 * 127.0.0.1 was never reached. */
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_INET;
	hints.ai_socktype = SOCK_STREAM;
	rc = getaddrinfo(lk->lk_host, NULL, &hints, &res);
	if (rc != 0) {
		hints.ai_family = AF_INET6;
		rc = getaddrinfo(lk->lk_host, NULL, &hints, &res);
	}
	if (rc != 0)
		strncpy(lk->lk_error, gai_strerror(rc), sizeof(lk->lk_error) - 1);
	else {
		const void *addr = res->ai_family == AF_INET6 ?
		    (const void *)&((struct sockaddr_in6 *)res->ai_addr)->sin6_addr :
		    (const void *)&((struct sockaddr_in *)res->ai_addr)->sin_addr;

		if (inet_ntop(res->ai_family, addr, lk->lk_ip, sizeof(lk->lk_ip)) == NULL)
			strcpy(lk->lk_error, "unusable address");
		freeaddrinfo(res);
	}
	pthread_mutex_lock(&lk->lk_lock);
	lk->lk_running = 0;
	cancelled = lk->lk_cancelled;
	if (!cancelled)
		event_active(lk->lk_done, EV_TIMEOUT, 0);
	pthread_mutex_unlock(&lk->lk_lock);
	if (cancelled)
		lookup_free(lk);
	return NULL;
}

static void
on_lookup_done(evutil_socket_t fd, short what, void *arg)
{
	struct lookup *lk = arg;

	(void)fd;
	(void)what;
	/* The thread may still be between event_active and its unlock: wait
	 * for it to let go before the lookup is freed. */
	pthread_mutex_lock(&lk->lk_lock);
	pthread_mutex_unlock(&lk->lk_lock);
	lk->lk_cb(lk->lk_arg, lk->lk_error[0] ? NULL : lk->lk_ip,
	    lk->lk_error[0] ? lk->lk_error : NULL);
	event_free(lk->lk_done);
	lookup_free(lk);
}

struct lookup *
lookup_start(struct event_base *base, const char *host, lookup_cb cb, void *arg)
{
	struct lookup *lk = xcalloc(1, sizeof(*lk));
	pthread_attr_t attr;
	pthread_t thread;
	int rc;

	pthread_mutex_init(&lk->lk_lock, NULL);
	lk->lk_cb = cb;
	lk->lk_arg = arg;
	strncpy(lk->lk_host, host, sizeof(lk->lk_host) - 1);
	lk->lk_done = event_new(base, -1, 0, on_lookup_done, lk);
	lk->lk_running = 1;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	rc = pthread_create(&thread, &attr, lookup_main, lk);
	pthread_attr_destroy(&attr);
	if (rc != 0) {
		event_free(lk->lk_done);
		lookup_free(lk);
		return NULL;
	}
	return lk;
}

const char *
lookup_host(const struct lookup *lk)
{
	return lk->lk_host;
}

void
lookup_cancel(struct lookup *lk)
{
	int running;

	pthread_mutex_lock(&lk->lk_lock);
	running = lk->lk_running;
	lk->lk_cancelled = 1;
	/* Running: the thread checks lk_cancelled under the lock and frees
	 * the rest. Done: lk_done is active; freeing it takes that back. */
	event_free(lk->lk_done);
	lk->lk_done = NULL;
	pthread_mutex_unlock(&lk->lk_lock);
	if (!running)
		lookup_free(lk);
}

int
lookup_is_numeric(const char *host)
{
	unsigned char buf[sizeof(struct in6_addr)];

	return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}
