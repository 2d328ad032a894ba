/*
 * Chunked request bodies. Line ends may be CRLF or a bare LF, as nginx
 * reads them; chunk extensions and trailer fields are skipped (nothing
 * here has a use for them).
 */
#include <string.h>

#include "chunked.h"
#include "fmt.h"

/* A size line longer than this is no client's (nginx allows about 4 KiB
 * of extensions too). */
#define CHUNKED_LINE_MAX	4096

/*
 * The size line at p[0..len) (its LF excluded): the size, or -1 when it is
 * malformed, -2 when it is more than max.
 */
static long long
size_line(const char *p, size_t len, size_t max)
{
	unsigned long long size = 0;
	size_t i = 0;

	if (len > 0 && p[len - 1] == '\r')
		len--;
	for (; i < len && fmt_hexval((unsigned char)p[i]) >= 0; i++) {
		size = size * 16 + (unsigned long long)fmt_hexval((unsigned char)p[i]);
		if (size > max)
			return -2;	/* before it can overflow */
	}
	if (i == 0)
		return -1;
	while (i < len && (p[i] == ' ' || p[i] == '\t'))
		i++;
	if (i < len && p[i] != ';')
		return -1;
	for (; i < len; i++)	/* extensions: any visible text, no CR */
		if ((unsigned char)p[i] < 0x20 && p[i] != '\t')
			return -1;
	return (long long)size;
}

int
chunked_scan(struct chunked *st, const char *p, size_t n, size_t max,
    size_t *end, const char **why)
{
	while (!st->trailers) {
		size_t at = st->at, window = n - at, line, next;
		const char *lf;
		long long size;

		if (window > CHUNKED_LINE_MAX + 1)
			window = CHUNKED_LINE_MAX + 1;
		if ((lf = memchr(p + at, '\n', window)) == NULL) {
			if (n - at > CHUNKED_LINE_MAX) {
				*why = "chunk size line too long";
				return CHUNKED_BAD;
			}
			return CHUNKED_MORE;
		}
		line = (size_t)(lf - (p + at));
		if ((size = size_line(p + at, line, max - st->data)) == -1) {
			*why = "malformed chunk size";
			return CHUNKED_BAD;
		}
		if (size == -2)
			return CHUNKED_TOO_LARGE;
		next = at + line + 1;
		if (size == 0) {
			st->at = next;
			st->trailers = 1;
			break;
		}
		if (n < next + (size_t)size + 1)
			return CHUNKED_MORE;
		next += (size_t)size;
		if (p[next] == '\r') {
			if (n < next + 2)
				return CHUNKED_MORE;
			next++;
		}
		if (p[next] != '\n') {
			*why = "chunk data not followed by CRLF";
			return CHUNKED_BAD;
		}
		st->at = next + 1;
		st->data += (size_t)size;
	}
	/* Trailer fields, not kept, then an empty line. */
	for (;;) {
		const char *lf = memchr(p + st->at, '\n', n - st->at);

		if (lf == NULL)
			return CHUNKED_MORE;
		if (lf == p + st->at || (lf == p + st->at + 1 && p[st->at] == '\r')) {
			*end = (size_t)(lf - p) + 1;
			return CHUNKED_DONE;
		}
		st->at = (size_t)(lf - p) + 1;
	}
}

size_t
chunked_decode(char *p, size_t end)
{
	size_t at = 0, out = 0;

	while (at < end) {
		const char *lf = memchr(p + at, '\n', end - at);
		size_t size = 0;

		for (size_t i = at; fmt_hexval((unsigned char)p[i]) >= 0; i++)
			size = size * 16 + (size_t)fmt_hexval((unsigned char)p[i]);
		if (size == 0)
			break;	/* the last chunk: trailers follow */
		at = (size_t)(lf - p) + 1;
		memmove(p + out, p + at, size);
		out += size;
		at += size;
		at += p[at] == '\r' ? 2 : 1;
	}
	return out;
}
