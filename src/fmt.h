/*
 * Formatting for the hot path, without printf: its format parsing was a
 * visible share of a check's CPU, for up to ten numbers per check, the
 * reply's status and length, and the denial's body.
 */
#ifndef FMT_H
#define FMT_H

#include <stddef.h>
#include <string.h>

/* Room for any long long, its sign and the NUL. */
#define FMT_LL_MAX	24

/* Writes v in decimal and a NUL into out (FMT_LL_MAX bytes); returns the
 * length. */
static inline size_t
fmt_ll(char *out, long long v)
{
	char tmp[FMT_LL_MAX];
	unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
	size_t n = 0, len = 0;

	do {
		tmp[n++] = (char)('0' + u % 10);
		u /= 10;
	} while (u);
	if (v < 0)
		out[len++] = '-';
	while (n)
		out[len++] = tmp[--n];
	out[len] = '\0';
	return len;
}

/* Appends the string s at *o in out (size bytes), if it fits with a NUL;
 * returns 0, or -1 (and leaves out as it was) when it does not. */
static inline int
fmt_cat(char *out, size_t size, size_t *o, const char *s)
{
	size_t l = strlen(s);

	if (*o + l >= size)
		return -1;
	memcpy(out + *o, s, l + 1);
	*o += l;
	return 0;
}

#endif
