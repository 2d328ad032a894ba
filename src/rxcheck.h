/*
 * Vetting a route's POSIX extended regex before regcomp sees it: what
 * glibc takes but a user cannot mean, what would let a client's path hold
 * a worker, and what compiling it will cost.
 */
#ifndef RXCHECK_H
#define RXCHECK_H

#include <stddef.h>

#define RXCHECK_COPIES_MAX	1000	/* see rxcheck_refused */
/* glibc compiles an interval's optional copies ({m,n}: n - m of them) in
 * memory that grows with their square times the atom's size, about 8
 * bytes a unit: "[a-z]{1,1000}" is 8 MB and 40 ms. A file's regexes
 * together may take this many units (64 MB): 1000 routes of
 * "^/[a-z]{1,64}/" fit, and 50 of "[a-z]{1,1000}" (400 MB) do not. */
#define RXCHECK_UNITS_MAX	8000000LL
#define RXCHECK_BYTES_PER_UNIT	8

/*
 * What glibc's regcomp takes but a user cannot mean, or what would let a
 * client's path hold a worker: true, with the reason in why, when the
 * pattern is refused.
 * - A back-reference (\1; not POSIX ERE): matching one takes time
 *   exponential in the path's length.
 * - A PCRE escape such as \d, which glibc reads as the letter. The GNU
 *   escapes \w \W \s \S \b \B are kept.
 * - An interval is written out as that many copies of what it repeats,
 *   and nested ones multiply: "((a{1,30}){1,30}){1,30}b" is 27,000 copies,
 *   and an audit saw one 2,000-byte path take 12 s (and "[a-z]{1,12000}"
 *   take 1.1 GB). Matching time grows faster than the copies do; with
 *   RXCHECK_COPIES_MAX more copies than the pattern writes, a 16 KiB path
 *   takes about 0.1 s.
 * - A ')' that closes nothing, a literal to glibc but undefined in POSIX,
 *   and it would close the group config.c wraps an unanchored pattern in.
 * *anchored tells whether every alternative of the pattern starts with
 * '^' (then glibc tries the path from its start alone).
 * *units: what compiling it takes, in RXCHECK_BYTES_PER_UNIT bytes.
 */
int rxcheck_refused(const char *re, char *why, size_t size, int *anchored,
    long long *units);

/*
 * Matching a path against a thousand regex routes runs each regex in
 * turn; these give bytes a path must hold for the regex to match, which a
 * string compare rules out first. Never too many, as a byte that may not
 * be there would skip a route that matches: a run stops before anything
 * but a plain byte or an escaped metacharacter, and drops a byte that a
 * '*', '?' or an interval may leave out. Both write at most size bytes (no
 * NUL) to out and return how many; 0 when they know none.
 */
/* What every path the pattern matches starts with, when it is anchored
 * (see rxcheck_refused): "/api/v" of "^/api/v[0-9]+/". */
size_t rxcheck_lead(const char *re, char *out, size_t size);
/* The longest run of bytes every path the pattern matches holds
 * somewhere: ".json" of "\\.json$", "/users/" of "^/[a-z]+/users/". */
size_t rxcheck_needle(const char *re, char *out, size_t size);

#endif
