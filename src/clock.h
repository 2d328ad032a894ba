#ifndef CLOCK_H
#define CLOCK_H

/*
 * Time for the event loops: monotonic microseconds, read through the vDSO
 * (no system call), and the timevals libevent's timers take.
 */
#include <sys/time.h>
#include <time.h>

static inline long long
mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* A few milliseconds coarse, and cheaper still: for timeouts only. */
static inline long long
mono_coarse_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline struct timeval
tv_us(long long us)
{
	struct timeval tv = { (time_t)(us / 1000000), (suseconds_t)(us % 1000000) };

	return tv;
}

#endif
