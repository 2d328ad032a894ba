/*
 * Vetting a route's regex (see rxcheck.h): a scan of the pattern that
 * tracks groups, brackets and intervals the way glibc's regcomp reads
 * them, counting the copies its intervals write out and what compiling
 * them takes.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rxcheck.h"
#include "xmalloc.h"

/*
 * The end of the bracket expression that opens at p ('['): the ']' that
 * closes it, or NULL when regcomp will say it is unclosed. Inside one a
 * backslash is itself, so a PCRE class there (\d) is refused with the
 * reason in why (*refused set).
 */
static const char *
bracket_end(const char *p, char *why, size_t size, int *refused)
{
	const char *q = p + 1;

	q += *q == '^';
	q += *q == ']';
	for (; *q && *q != ']'; q++) {
		if (*q == '[' && (q[1] == ':' || q[1] == '.' || q[1] == '=')) {
			char close[3] = { q[1], ']', '\0' };
			const char *end = strstr(q + 2, close);

			if (end == NULL)
				return NULL;
			q = end + 1;
		} else if (*q == '\\' && q[1] != '\0' && strchr("dDwWsS", q[1])) {
			snprintf(why, size, "inside [...] a backslash is itself, so "
			    "\\%c there is a backslash or the letter %c: write %s "
			    "inside the brackets", q[1], q[1],
			    q[1] == 'd' || q[1] == 'D' ? "[:digit:]" :
			    q[1] == 'w' || q[1] == 'W' ? "[:alnum:]_" : "[:space:]");
			*refused = 1;
			return NULL;
		}
	}
	return *q ? q : NULL;
}

/* Inside an interval's braces glibc reads an escaped digit or comma as
 * itself: "{1\0\0}" is {100}. q past such a backslash. */
static const char *
brace_unescaped(const char *q)
{
	return q[0] == '\\' && (isdigit((unsigned char)q[1]) || q[1] == ',') ?
	    q + 1 : q;
}

/* How many copies of the last atom an interval "{m}", "{m,}", "{m,n}" or
 * "{,n}" at p makes glibc write out (0 for none), with *end past it; -1
 * when p starts no interval (the brace is a literal, or regcomp's error). */
static long long
interval_copies(const char *p, const char **end, long long *optional)
{
	long long m = 0, n = -1;
	const char *q = brace_unescaped(p + 1);

	if (!isdigit((unsigned char)*q) && *q != ',')
		return -1;
	while (isdigit((unsigned char)*q) && m <= 100000) {
		m = m * 10 + (*q - '0');
		q = brace_unescaped(q + 1);
	}
	if (*q == ',') {
		q = brace_unescaped(q + 1);
		if (isdigit((unsigned char)*q)) {
			n = 0;
			while (isdigit((unsigned char)*q) && n <= 100000) {
				n = n * 10 + (*q - '0');
				q = brace_unescaped(q + 1);
			}
		}
	} else
		n = m;
	if (*q != '}')
		return -1;
	*end = q;
	*optional = n > m ? n - m : 0;
	return n >= 0 ? (n > m ? n : m) : m + 1;	/* "{m,}": m, then a star */
}

/* See rxcheck.h. */
int
rxcheck_refused(const char *re, char *why, size_t size, int *anchored,
    long long *units)
{
	/* per open group: its copies so far, and those of its last atom;
	 * and the units (RXCHECK_UNITS_MAX) of each: a group repeated is
	 * written out whole, what its own intervals cost included */
	struct { long long total, last, units, last_units; } *frames;
	size_t depth = 0;
	long long written = 0;	/* atoms as the pattern writes them */
	int refused = 0, too_many = 0, top_alternation = 0, after_repeat = 0;

	frames = xcalloc(strlen(re) + 2, sizeof(*frames));
	for (const char *p = re; *p && !refused; p++) {
		long long copies, optional, group_units;
		const char *end;
		long long interval = *p == '{' ?
		    interval_copies(p, &end, &optional) : -1;
		int repeat = *p == '*' || *p == '+' || *p == '?' || interval >= 0;

		if (repeat && after_repeat) {
			/* glibc nests them: "a*" then twelve '+' took 10 s and
			 * 880 MB to compile, each one more about four times it */
			snprintf(why, size, "'%c' at byte %zu repeats a repeat, which "
			    "POSIX ERE leaves undefined (PCRE's possessive \"*+\" "
			    "and lazy \"+?\" are not ERE), and glibc compiles a "
			    "chain of them in time and memory exponential in its "
			    "length: keep one, or group what repeats, as in (a*)+",
			    *p, (size_t)(p - re) + 1);
			refused = 1;
			break;
		}
		after_repeat = repeat;
		if (*p == '[') {
			if ((end = bracket_end(p, why, size, &refused)) == NULL)
				break;	/* refused, or regcomp says what */
			p = end;
		} else if (*p == '\\' && p[1] != '\0') {
			if (p[1] >= '1' && p[1] <= '9') {
				snprintf(why, size, "a back-reference (\\%c) is not POSIX "
				    "ERE, and matching one takes time exponential in "
				    "the path's length", p[1]);
				refused = 1;
				break;
			}
			if (isalpha((unsigned char)p[1]) && strchr("wWsSbB", p[1]) == NULL) {
				snprintf(why, size, "\\%c is not POSIX ERE: it would "
				    "match the letter %c%s", p[1], p[1], p[1] == 'd' ?
				    " (write [0-9])" : p[1] == 'D' ? " (write [^0-9])" : "");
				refused = 1;
				break;
			}
			p++;
		} else if (*p == '(' && p[1] == '?') {
			/* glibc said only "Invalid preceding regular
			 * expression" */
			snprintf(why, size, "\"(?\" at byte %zu opens a PCRE group "
			    "((?i), (?:...), a lookaround), which POSIX ERE has not: "
			    "write [Aa] for either case, and (...) for a group",
			    (size_t)(p - re) + 1);
			refused = 1;
			break;
		} else if (*p == '(') {
			memset(&frames[++depth], 0, sizeof(*frames));
			continue;
		} else if (*p == ')') {
			if (depth == 0) {
				snprintf(why, size, "the ')' at byte %zu closes no '(': "
				    "write \\) for the character", (size_t)(p - re) + 1);
				refused = 1;
				break;
			}
			copies = frames[depth].total;
			group_units = frames[depth--].units;
			if (copies == 0) {
				/* glibc writes an empty group out as it does an
				 * atom, and dearer: "(){,4000}" took 557 MB */
				copies = 1;
				written++;
			}
			frames[depth].last = copies;
			frames[depth].total += copies;
			frames[depth].last_units = group_units;
			frames[depth].units += group_units;
			continue;
		} else if (*p == '|') {
			top_alternation |= depth == 0;
			frames[depth].last = 0;
			frames[depth].last_units = 0;
			continue;
		} else if (*p == '*' || *p == '+' || *p == '?') {
			continue;	/* a loop over the atom: no copies */
		} else if (interval >= 0) {
			long long was = frames[depth].last_units;

			copies = interval;

			/* The atom written out copies times, what it costs
			 * too, and each optional copy leads to all those after
			 * it. Past the budget is past it: capped, so nested
			 * counts cannot overflow. */
			frames[depth].last_units = was * copies +
			    frames[depth].last * optional * optional;
			if (frames[depth].last_units > RXCHECK_UNITS_MAX + 1)
				frames[depth].last_units = RXCHECK_UNITS_MAX + 1;
			frames[depth].units += frames[depth].last_units - was;
			if (frames[depth].units > RXCHECK_UNITS_MAX + 1)
				frames[depth].units = RXCHECK_UNITS_MAX + 1;
			/* the atom is written out copies times, not once */
			frames[depth].total += frames[depth].last * (copies - 1);
			frames[depth].last *= copies;
			/* at once, before nested counts can overflow */
			refused = too_many = frames[depth].total - written >
			    RXCHECK_COPIES_MAX;
			p = end;
			continue;
		}
		frames[depth].last = 1;
		frames[depth].last_units = 0;
		frames[depth].total++;
		written++;
	}
	*units = frames[0].units;
	if (!refused && depth == 0 && frames[0].total - written > RXCHECK_COPIES_MAX)
		refused = too_many = 1;	/* groups under it, together over it */
	if (too_many)
		snprintf(why, size, "its repeat counts write out more than %d "
		    "extra copies of what they repeat (nested counts multiply), "
		    "and matching one long path against them would take "
		    "seconds: use + or * where any count will do",
		    RXCHECK_COPIES_MAX);
	free(frames);
	*anchored = re[0] == '^' && !top_alternation;
	return refused;
}

/* The ')' that closes the group opening at p, or NULL. */
static const char *
group_end(const char *p)
{
	char why[256];
	int depth = 0, refused = 0;

	for (; *p; p++) {
		if (*p == '[') {
			if ((p = bracket_end(p, why, sizeof(why), &refused)) == NULL)
				return NULL;
		} else if (*p == '\\' && p[1] != '\0')
			p++;
		else if (*p == '(')
			depth++;
		else if (*p == ')' && --depth == 0)
			return p;
	}
	return NULL;
}

/* Does a '|' outside every group and bracket part the whole pattern? */
static int
top_alternation(const char *re)
{
	char why[256];
	int refused = 0;

	for (const char *p = re; *p; p++) {
		if (*p == '|')
			return 1;
		if (*p == '[')
			p = bracket_end(p, why, sizeof(why), &refused);
		else if (*p == '(')
			p = group_end(p);
		else if (*p == '\\' && p[1] != '\0')
			p++;
		if (p == NULL)
			return 1;	/* regcomp's error: say nothing of it */
	}
	return 0;
}

/* The atom at p when it is one plain byte (an escaped metacharacter is
 * that character; no other escape is: \< and \w are glibc's operators):
 * the byte in *byte, and past it returned; else NULL. */
static const char *
plain_byte(const char *p, char *byte)
{
	static const char meta[] = ".[]()*+?{}|\\^$";

	if (p[0] == '\\' && p[1] != '\0' && strchr(meta, p[1])) {
		*byte = p[1];
		return p + 2;
	}
	if (p[0] == '\0' || strchr(meta, p[0]))
		return NULL;
	*byte = p[0];
	return p + 1;
}

/* Past the quantifiers at q, a chain of them ("+*" is "(a+)*"): *optional
 * when they let the atom before them be missing, *repeated when they let
 * it come again. An interval counts as both. */
static const char *
quantifiers(const char *q, int *optional, int *repeated)
{
	const char *end;
	long long extra;

	*optional = *repeated = 0;
	for (;;) {
		if (*q == '*' || *q == '?') {
			*optional = 1;
			*repeated |= *q == '*';
			q++;
		} else if (*q == '+') {
			*repeated = 1;
			q++;
		} else if (*q == '{') {
			*optional = *repeated = 1;
			if (interval_copies(q, &end, &extra) < 0)
				return q + 1;	/* regcomp's error */
			q = end + 1;
		} else
			return q;
	}
}

/* See rxcheck.h. */
size_t
rxcheck_lead(const char *re, char *out, size_t size)
{
	size_t n = 0;
	const char *p = re + 1;	/* past the '^' */

	if (re[0] != '^' || top_alternation(re))
		return 0;
	while (n < size) {
		const char *next;
		char byte;
		int optional, repeated;

		if ((next = plain_byte(p, &byte)) == NULL)
			break;
		next = quantifiers(next, &optional, &repeated);
		if (optional)
			break;	/* maybe not there at all */
		out[n++] = byte;
		if (repeated)
			break;	/* there once, then maybe again */
		p = next;
	}
	return n;
}

/* See rxcheck.h. */
size_t
rxcheck_needle(const char *re, char *out, size_t size)
{
	char *run = xmalloc(size ? size : 1), why[256];
	size_t best = 0, len = 0;	/* len: the run's bytes, kept or not */
	const char *p = re;
	int refused = 0;

	if (top_alternation(re)) {
		free(run);
		return 0;
	}
	for (;;) {
		const char *next;
		char byte;
		int optional = 1, repeated = 1;

		if ((next = plain_byte(p, &byte)) != NULL) {
			next = quantifiers(next, &optional, &repeated);
			if (!optional) {
				if (len < size)
					run[len] = byte;
				len++;
			}
		}
		if (optional || repeated) {
			/* the run ends: any prefix of it is in every match */
			size_t kept = len < size ? len : size;

			if (kept > best) {
				memcpy(out, run, kept);
				best = kept;
			}
			len = 0;
		}
		if (next != NULL) {
			p = next;
			continue;
		}
		if (*p == '\0')
			break;
		/* any other atom, and what quantifies it */
		if (*p == '[')
			next = bracket_end(p, why, sizeof(why), &refused);
		else if (*p == '(')
			next = group_end(p);
		else
			next = p + (*p == '\\' && p[1] != '\0');
		if (next == NULL)
			break;	/* regcomp's error */
		p = quantifiers(next + 1, &optional, &repeated);
	}
	free(run);
	return best;
}
