/*
 * Durations and rates as a policy file writes them ("250ms", "10/s",
 * "5/10s"): parsed into microseconds with a cause a user can act on, and
 * written back in the largest unit that states them whole.
 */
#ifndef DURATION_H
#define DURATION_H

#include <stddef.h>

#define US_PER_MS	1000LL
#define US_PER_S	1000000LL
#define DURATION_MAX_US	(366LL * 24 * 3600 * US_PER_S)	/* one year */
/* A rate's count; limits and bursts share the bound (10^12). */
#define RATE_COUNT_MAX	1000000000000LL

/* Return 0, or -1 with *cause, a sentence without the value. */
int duration_parse(const char *s, long long *us, const char **cause);
/* "10/s" (one of the unit), "5/10s": *n per *period_us. */
int rate_parse(const char *s, long long *n, long long *period_us,
    const char **cause);

/* Was cause given for a fraction ("1.5s")? Then duration_fraction_advice
 * can say what to write instead. */
int duration_cause_is_fraction(const char *cause);
/* Advice to follow that cause, for the duration text s, into buf: the
 * same time as a whole number of the largest unit that fits, written as
 * the rate "count/..." when count >= 0, or else an example. */
const char *duration_fraction_advice(char *buf, size_t size, const char *s,
    long long count);

/* Room for any duration up to DURATION_MAX_US as duration_format writes it. */
#define DURATION_TEXT_SIZE	32
/* us in the largest unit that states it whole ("1m", not "60s"), or in
 * fractional milliseconds ("100.1ms") when no unit does; "0s" for 0.
 * -1, with buf empty, when it does not fit in size: a text cut short
 * would read as another duration ("1ms" as "1m"). */
int duration_format(long long us, char *buf, size_t size);

#endif
