/*
 * Framing of a chunked request body (RFC 9112 7.1), pure: the server scans
 * the body as it arrives and, once it is whole, decodes it where it lies.
 */
#ifndef CHUNKED_H
#define CHUNKED_H

#include <stddef.h>

/* How far the scan of one body has got: zeroed for each new body, so a
 * body trickled in is read once, not from its start at every read. */
struct chunked {
	size_t	at;	/* encoded bytes of the whole chunks read */
	size_t	data;	/* their data bytes */
	int	trailers; /* past the last chunk: at is a trailer line's */
};

enum {
	CHUNKED_DONE = 0,	/* *end: encoded length, trailers included */
	CHUNKED_MORE = 1,	/* incomplete */
	CHUNKED_BAD = -1,	/* malformed: *why says how */
	CHUNKED_TOO_LARGE = -2	/* more data than max */
};

/* Reads on through p[0..n), the encoded body received so far. */
int chunked_scan(struct chunked *st, const char *p, size_t n, size_t max,
    size_t *end, const char **why);
/* The data of a body chunked_scan found whole (end bytes), moved to the
 * front of p; returns its length. */
size_t chunked_decode(char *p, size_t end);

#endif
