/*
 * Formatting for the hot path, without printf: its format parsing was a
 * visible share of a check's CPU, for up to ten numbers per check, the
 * reply's status and length, and the denial's body.
 */
#ifndef FMT_H
#define FMT_H

#include <stddef.h>
#include <string.h>
#include <time.h>

/* A hex digit's value, or -1 (percent-escapes, chunk sizes). */
static inline int
fmt_hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

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

/* An IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT", RFC 9110 5.6.7) and
 * its NUL. */
#define FMT_HTTP_DATE_MAX	30

/* Writes t as an IMF-fixdate into out (FMT_HTTP_DATE_MAX bytes); returns
 * the length, or 0 for a time gmtime cannot break down. By hand, not
 * strftime: its day and month names follow the locale. */
static inline size_t
fmt_http_date(char *out, time_t t)
{
	static const char days[] = "SunMonTueWedThuFriSat";
	static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
	struct tm tm;
	char *o = out;

	if (gmtime_r(&t, &tm) == NULL || tm.tm_year + 1900 > 9999 ||
	    tm.tm_year + 1900 < 0)
		return 0;
	memcpy(o, days + 3 * tm.tm_wday, 3);
	o += 3;
	*o++ = ',';
	*o++ = ' ';
	*o++ = (char)('0' + tm.tm_mday / 10);
	*o++ = (char)('0' + tm.tm_mday % 10);
	*o++ = ' ';
	memcpy(o, months + 3 * tm.tm_mon, 3);
	o += 3;
	*o++ = ' ';
	*o++ = (char)('0' + (tm.tm_year + 1900) / 1000);
	*o++ = (char)('0' + (tm.tm_year + 1900) / 100 % 10);
	*o++ = (char)('0' + (tm.tm_year + 1900) / 10 % 10);
	*o++ = (char)('0' + (tm.tm_year + 1900) % 10);
	*o++ = ' ';
	*o++ = (char)('0' + tm.tm_hour / 10);
	*o++ = (char)('0' + tm.tm_hour % 10);
	*o++ = ':';
	*o++ = (char)('0' + tm.tm_min / 10);
	*o++ = (char)('0' + tm.tm_min % 10);
	*o++ = ':';
	*o++ = (char)('0' + tm.tm_sec / 10);
	*o++ = (char)('0' + tm.tm_sec % 10);
	memcpy(o, " GMT", 5);
	return (size_t)(o + 4 - out);
}

#endif
