#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fmt.h"
#include "jsonout.h"
#include "xmalloc.h"

void
jsonout_init(struct jsonout *o, char *first, size_t size)
{
	o->buf = first;
	o->cap = size;
	o->len = 0;
	o->heap = 0;
}

void
jsonout_free(struct jsonout *o)
{
	if (o->heap)
		free(o->buf);
	o->buf = NULL;
	o->len = o->cap = 0;
	o->heap = 0;
}

/* Room for n more bytes. */
static void
reserve(struct jsonout *o, size_t n)
{
	size_t cap = o->cap ? o->cap : 64;
	char *buf;

	if (o->len + n <= o->cap)
		return;
	/* a reply is bounded by the request's 64 KiB many times over; past
	 * this, doubling would wrap */
	if (n > SIZE_MAX / 4 - o->len)
		abort();
	while (cap < o->len + n)
		cap *= 2;
	if (o->heap)
		buf = xrealloc(o->buf, cap);
	else {
		buf = xmalloc(cap);
		if (o->len)
			memcpy(buf, o->buf, o->len);
	}
	o->buf = buf;
	o->cap = cap;
	o->heap = 1;
}

void
jsonout_rawn(struct jsonout *o, const char *text, size_t len)
{
	reserve(o, len);
	memcpy(o->buf + o->len, text, len);
	o->len += len;
}

void
jsonout_raw(struct jsonout *o, const char *text)
{
	jsonout_rawn(o, text, strlen(text));
}

void
jsonout_ll(struct jsonout *o, long long v)
{
	reserve(o, FMT_LL_MAX);
	o->len += fmt_ll(o->buf + o->len, v);
}

void
jsonout_bool(struct jsonout *o, int v)
{
	jsonout_raw(o, v ? "true" : "false");
}

/* The code point of the UTF-8 sequence at s[0..len) and its length, or 0
 * when none starts there. */
static size_t
utf8_next(const unsigned char *s, size_t len, unsigned long *cp)
{
	size_t n;
	unsigned long c, least;

	if (s[0] < 0x80) {
		*cp = s[0];
		return 1;
	}
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		n = 2, c = s[0] & 0x1f, least = 0x80;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		n = 3, c = s[0] & 0x0f, least = 0x800;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		n = 4, c = s[0] & 0x07, least = 0x10000;
	else
		return 0;	/* a continuation byte, or past U+10FFFF */
	if (n > len)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		c = (c << 6) | (s[i] & 0x3f);
	}
	if (c < least || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
		return 0;
	*cp = c;
	return n;
}

static void
put_u(char *out, unsigned long u)
{
	static const char hex[] = "0123456789ABCDEF";

	out[0] = '\\';
	out[1] = 'u';
	out[2] = hex[(u >> 12) & 0xf];
	out[3] = hex[(u >> 8) & 0xf];
	out[4] = hex[(u >> 4) & 0xf];
	out[5] = hex[u & 0xf];
}

/* What a code point takes in the output */
static size_t
escaped_len(unsigned long cp)
{
	if (cp >= 0x20 && cp != '"' && cp != '\\' && cp <= 0x7f)
		return 1;	/* DEL too: jansson leaves it as it is */
	if (cp == '"' || cp == '\\' || cp == '\b' || cp == '\f' ||
	    cp == '\n' || cp == '\r' || cp == '\t')
		return 2;
	return cp < 0x10000 ? 6 : 12;
}

int
jsonout_string(struct jsonout *o, const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t need = 2;
	unsigned long cp;

	/* Measured first, so that a string that is not UTF-8 leaves o as it
	 * was, and the buffer grows only by what is written: a reservation
	 * for the worst case (6 bytes a byte) moved a 22-byte key's buffer
	 * to the heap. */
	for (size_t i = 0, n; i < len; i += n) {
		if ((n = utf8_next(p + i, len - i, &cp)) == 0)
			return -1;
		need += escaped_len(cp);
	}
	reserve(o, need);
	o->buf[o->len++] = '"';
	for (size_t i = 0, n; i < len; i += n) {
		char *out = o->buf + o->len;

		n = utf8_next(p + i, len - i, &cp);
		if (escaped_len(cp) == 1) {
			*out = (char)cp;
			o->len++;
			continue;
		}
		out[0] = '\\';
		switch (cp) {
		case '"':  out[1] = '"'; break;
		case '\\': out[1] = '\\'; break;
		case '\b': out[1] = 'b'; break;
		case '\f': out[1] = 'f'; break;
		case '\n': out[1] = 'n'; break;
		case '\r': out[1] = 'r'; break;
		case '\t': out[1] = 't'; break;
		default:
			if (cp < 0x10000) {
				put_u(out, cp);
				o->len += 6;
			} else {
				cp -= 0x10000;
				put_u(out, 0xd800 | (cp >> 10));
				put_u(out + 6, 0xdc00 | (cp & 0x3ff));
				o->len += 12;
			}
			continue;
		}
		o->len += 2;
	}
	o->buf[o->len++] = '"';
	return 0;
}
