/*
 * LD_PRELOAD shim for tests: a resolver that takes SLOW_DNS_MS to answer
 * for the name SLOW_DNS_NAME, which then resolves to 127.0.0.1 (or fails
 * when SLOW_DNS_FAIL is set). With SLOW_DNS_V6_FIRST it resolves like
 * localhost in a stock /etc/hosts: ::1 first when any family will do, and
 * for IPv6. Every other name resolves as usual.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int
getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
    struct addrinfo **res)
{
	static int (*real)(const char *, const char *, const struct addrinfo *,
	    struct addrinfo **);
	const char *name = getenv("SLOW_DNS_NAME"), *ms = getenv("SLOW_DNS_MS");

	if (real == NULL)
		real = (int (*)(const char *, const char *, const struct addrinfo *,
		    struct addrinfo **))dlsym(RTLD_NEXT, "getaddrinfo");
	if (node && name && strcmp(node, name) == 0) {
		long wait = ms ? atol(ms) : 1000;
		struct timespec ts = { wait / 1000, (wait % 1000) * 1000000L };

		nanosleep(&ts, NULL);
		if (getenv("SLOW_DNS_FAIL"))
			return EAI_NONAME;
		node = "127.0.0.1";
		if (getenv("SLOW_DNS_V6_FIRST") &&
		    (hints == NULL || hints->ai_family != AF_INET))
			node = "::1";
	}
	return real(node, service, hints, res);
}
