/*
 * JSON written by hand into a growing buffer, byte for byte as jansson's
 * json_dumps(JSON_COMPACT | JSON_ENSURE_ASCII) writes it: /v1/check built
 * and dumped each verdict with jansson, 3-4 us of about 20 for the check.
 * Replies keep one format whichever writes them.
 */
#ifndef JSONOUT_H
#define JSONOUT_H

#include <stddef.h>

struct jsonout {
	char	*buf;
	size_t	 len, cap;
	int	 heap;		/* buf is ours to free (it outgrew the first) */
};

/* Starts empty in first[0..size) (a caller's buffer, for the usual
 * size), moving to the heap if the text outgrows it. */
void jsonout_init(struct jsonout *o, char *first, size_t size);
void jsonout_free(struct jsonout *o);

/* Appends JSON text as it is ("{\"allowed\":", "true"). */
void jsonout_raw(struct jsonout *o, const char *text);
void jsonout_rawn(struct jsonout *o, const char *text, size_t len);
void jsonout_ll(struct jsonout *o, long long v);
void jsonout_bool(struct jsonout *o, int v);

/* Appends s[0..len) as a quoted string: \" \\ \b \f \n \r \t, \u00XX for
 * other control bytes, \uXXXX (a surrogate pair past U+FFFF) for every
 * code point past ASCII. Returns 0, or -1 and appends nothing when s is
 * not UTF-8 (RFC 3629: no overlong forms, surrogates or code points past
 * U+10FFFF), which JSON text cannot carry. */
int jsonout_string(struct jsonout *o, const char *s, size_t len);

#endif
