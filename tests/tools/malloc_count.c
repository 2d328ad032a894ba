/*
 * LD_PRELOAD library for tests/integration/test_allocations.py: counts the
 * calls to malloc, calloc and realloc a process makes, and writes the
 * counts to stderr on SIGWINCH (which the daemon leaves alone) as
 * "allocs N". It only counts; every call goes to the real allocator.
 *
 * dlsym itself may call calloc before the real one is known, so the first
 * few calloc calls are served from a static buffer (and free ignores it).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static atomic_ulong allocs;
static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);
static _Alignas(16) char early[8192];
static size_t early_used;

void *
malloc(size_t size)
{
	if (real_malloc == NULL)
		real_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
	atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
	return real_malloc(size);
}

void *
calloc(size_t n, size_t size)
{
	if (real_calloc == NULL) {
		size_t need = (n * size + 15) & ~(size_t)15;

		if (early_used + need <= sizeof(early)) {
			void *p = early + early_used;

			early_used += need;
			return p;	/* static storage is already zero */
		}
		real_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
	}
	atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
	return real_calloc(n, size);
}

void *
realloc(void *p, size_t size)
{
	if (real_realloc == NULL)
		real_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
	atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
	return real_realloc(p, size);
}

void
free(void *p)
{
	if ((char *)p >= early && (char *)p < early + sizeof(early))
		return;
	if (real_free == NULL)
		real_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
	real_free(p);
}

static void
report(int sig)
{
	char line[64];
	int n = snprintf(line, sizeof(line), "allocs %lu\n",
	    atomic_load_explicit(&allocs, memory_order_relaxed));

	(void)sig;
	if (n > 0)
		(void)!write(2, line, (size_t)n);
}

__attribute__((constructor)) static void
install(void)
{
	signal(SIGWINCH, report);
}
