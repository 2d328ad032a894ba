/*
 * LD_PRELOAD library for tests/integration/test_allocations.py: counts the
 * calls to malloc, calloc and realloc a process makes, and writes the
 * counts to stderr on SIGWINCH (which the daemon leaves alone) as
 * "allocs N". It only counts; every call goes to the real allocator.
 *
 * dlsym itself may call calloc before the real one is known, so the calls
 * it makes while it looks the real one up are served from a static buffer
 * (free ignores it; realloc moves it). Only those: a block the process
 * itself callocs and later reallocs must be the real allocator's.
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
static int resolving_calloc;	/* inside the dlsym that finds calloc */

static int
is_early(const void *p)
{
	return (const char *)p >= early && (const char *)p < early + sizeof(early);
}

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

		if (resolving_calloc) {
			void *p;

			if (early_used + need > sizeof(early))
				return NULL;
			p = early + early_used;
			early_used += need;
			return p;	/* static storage is already zero */
		}
		resolving_calloc = 1;
		real_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
		resolving_calloc = 0;
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
	if (is_early(p)) {
		/* dlsym's own block, grown: a fresh one with what it held
		 * (its size is not kept; the rest of the buffer bounds it) */
		size_t left = (size_t)(early + sizeof(early) - (char *)p);
		char *q = malloc(size);

		for (size_t i = 0; q && i < size && i < left; i++)
			q[i] = ((char *)p)[i];
		return q;
	}
	return real_realloc(p, size);
}

void
free(void *p)
{
	if (is_early(p))
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
