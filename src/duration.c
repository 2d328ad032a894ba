/*
 * Durations and rates as a policy writes them (see duration.h). A wrong
 * one is a user's first mistake in a policy file, so each cause says what
 * would have been right: "1.5s" is answered with "write 1500ms".
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "duration.h"

/* Duration units, smallest first. */
static const struct {
	const char	*unit;
	long long	 us;
} duration_units[] = {
	{ "ms", US_PER_MS }, { "s", US_PER_S }, { "m", 60 * US_PER_S },
	{ "h", 3600 * US_PER_S }, { "d", 86400 * US_PER_S },
};
#define NUNITS	(sizeof(duration_units) / sizeof(duration_units[0]))

/* The cause for a unit spelled out ("min", "seconds"), or NULL. */
static const char *
unit_spelled_out(const char *unit)
{
	static const struct {
		const char *words, *cause;
	} spelled[] = {
		{ " ms msec msecs millisecond milliseconds millis ",
		    "units are ms, s, m, h or d: ms for milliseconds" },
		{ " sec secs second seconds ", "units are ms, s, m, h or d: s for seconds" },
		{ " min mins minute minutes ", "units are ms, s, m, h or d: m for minutes" },
		{ " hr hrs hour hours ", "units are ms, s, m, h or d: h for hours" },
		{ " day days ", "units are ms, s, m, h or d: d for days" },
	};
	char word[16];
	size_t n = strlen(unit);

	if (n == 0 || n > sizeof(word) - 3)
		return NULL;
	word[0] = ' ';
	for (size_t i = 0; i < n; i++) {
		if (!isalpha((unsigned char)unit[i]))
			return NULL;
		word[i + 1] = (char)tolower((unsigned char)unit[i]);
	}
	word[n + 1] = ' ';
	word[n + 2] = '\0';
	for (size_t i = 0; i < sizeof(spelled) / sizeof(spelled[0]); i++)
		if (strstr(spelled[i].words, word))
			return spelled[i].cause;
	return NULL;
}

/* Why unit is not one: in capitals ("M"), spelled out ("min"), or else
 * `unknown`. */
static const char *
bad_unit_cause(const char *unit, const char *unknown)
{
	const char *spelled;

	for (size_t i = 0; i < NUNITS; i++)
		if (strcasecmp(unit, duration_units[i].unit) == 0)
			return "units are lower case: ms, s, m (minutes), h or d";
	spelled = unit_spelled_out(unit);
	return spelled ? spelled : unknown;
}

/* The cause for "1.5s": callers compare against it to add advice. */
static const char duration_fraction[] =
    "durations are whole numbers of a unit (ms, s, m, h or d)";

/* "1m30s" as the one number and unit it means, in a cause ("a duration
 * is one number and one unit: 90s, not 1m30s"); NULL when s is not a
 * sum of whole numbers of units. Thread-local: policies load on the
 * main thread, and a cause is read at once. */
static const char *
sum_cause(const char *s)
{
	static _Thread_local char cause[128];
	char total_text[DURATION_TEXT_SIZE];
	long long total = 0;
	const char *p = s;

	while (*p) {
		long long n = 0;
		size_t i;

		if (!isdigit((unsigned char)*p))
			return NULL;
		for (; isdigit((unsigned char)*p); p++)
			if ((n = n * 10 + (*p - '0')) > DURATION_MAX_US)
				return NULL;
		/* "ms" before "m": the table runs ms first */
		for (i = 0; i < NUNITS; i++)
			if (strncmp(p, duration_units[i].unit,
			    strlen(duration_units[i].unit)) == 0)
				break;
		if (i == NUNITS || n > DURATION_MAX_US / duration_units[i].us)
			return NULL;
		total += n * duration_units[i].us;
		if (total > DURATION_MAX_US)
			return NULL;
		p += strlen(duration_units[i].unit);
	}
	if (total == 0 || duration_format(total, total_text,
	    sizeof(total_text)) == -1)
		return NULL;
	snprintf(cause, sizeof(cause), "a duration is one number and one unit: "
	    "%s, not %.40s", total_text, s);
	return cause;
}

/* Three digits and no fourth: what follows a thousands separator. */
static int
thousands_group(const char *p)
{
	return isdigit((unsigned char)p[0]) && isdigit((unsigned char)p[1]) &&
	    isdigit((unsigned char)p[2]) && !isdigit((unsigned char)p[3]);
}

int
duration_parse(const char *s, long long *us, const char **cause)
{
	const char *p = s, *sum;
	long long n = 0;

	if (*p == '.') {
		*cause = duration_fraction;
		return -1;
	}
	if (!isdigit((unsigned char)*p)) {
		*cause = "expected a duration such as 250ms, 1s, 10m, 1h or 1d";
		return -1;
	}
	while (isdigit((unsigned char)*p)) {
		n = n * 10 + (*p - '0');
		if (n > DURATION_MAX_US) {
			*cause = "duration is too long (at most 366d)";
			return -1;
		}
		p++;
	}
	if (*p == '.') {
		*cause = duration_fraction;
		return -1;
	}
	for (size_t i = 0; i < NUNITS; i++) {
		if (strcmp(p, duration_units[i].unit) == 0) {
			if (n > DURATION_MAX_US / duration_units[i].us) {
				*cause = "duration is too long (at most 366d)";
				return -1;
			}
			*us = n * duration_units[i].us;
			if (*us == 0) {
				*cause = "duration must be greater than zero";
				return -1;
			}
			return 0;
		}
	}
	*cause = *p == '\0' ? "duration needs a unit: ms, s, m, h or d" :
	    *p == ' ' || *p == '\t' ? "no space between a duration's number "
	    "and its unit: 1s, not 1 s" :
	    /* 1h30m, 0x10s, 1e3ms, 1_000ms: not the unit's fault */
	    (sum = sum_cause(s)) != NULL ? sum :
	    *p == '_' || (*p == ',' && thousands_group(p + 1)) ? "a "
	    "duration's number has no separators: 1000ms, not 1_000ms" :
	    *p == ',' ? duration_fraction :	/* "1,5s": a decimal comma */
	    strpbrk(p, "0123456789") ? "a duration is one decimal number and "
	    "one unit: 90m, not 1h30m; 1000ms, not 1e3ms" :
	    bad_unit_cause(p, "unknown duration unit (use ms, s, m, h or d)");
	return -1;
}

int
rate_parse(const char *s, long long *n, long long *period_us,
    const char **cause)
{
	const char *slash = strchr(s, '/');
	char *end, unit[32];

	if (slash == NULL || slash == s) {
		*cause = "expected a rate such as \"10/s\", \"600/m\" or \"5/10s\"";
		return -1;
	}
	errno = 0;
	*n = strtoll(s, &end, 10);
	if (end != slash || errno != 0 || !isdigit((unsigned char)*s) ||
	    *n < 1 || *n > RATE_COUNT_MAX) {
		size_t after = isdigit((unsigned char)*s) ? (size_t)(end - s) : 0;

		/* what a count was followed by, when it was one */
		*cause = after && (s[after] == ' ' || s[after] == '\t') ?
		    "no space before a rate's \"/\": \"10/s\"" :
		    after && s + after + 1 == slash && s[after] == 'r' ?
		    "a rate has no r: nginx's 10r/s is \"10/s\" here" :
		    "rate count must be an integer from 1 to 10^12";
		return -1;
	}
	slash++;
	if (*slash == '\0') {
		*cause = "rate needs a period after its \"/\": \"10/s\" or \"5/10s\"";
		return -1;
	}
	if (strchr(slash, '/') != NULL) {
		*cause = "a rate has one \"/\": \"10/s\" or \"5/10s\"";
		return -1;
	}
	if (isdigit((unsigned char)*slash) || *slash == '.')
		return duration_parse(slash, period_us, cause);
	if (*slash == '-' || *slash == '+') {
		*cause = "a rate's period is a duration with no sign: \"5/10s\"";
		return -1;
	}
	/* A bare unit means one of it: "10/s" is "10/1s". */
	if (strlen(slash) >= sizeof(unit) - 1) {
		*cause = "unknown rate unit (use ms, s, m, h or d)";
		return -1;
	}
	snprintf(unit, sizeof(unit), "1%s", slash);
	if (duration_parse(unit, period_us, cause) == -1) {
		*cause = *slash == ' ' ? "no space after a rate's \"/\": \"10/s\"" :
		    bad_unit_cause(slash, "unknown rate unit (use ms, s, m, h or d)");
		return -1;
	}
	return 0;
}

const char *
duration_fraction_advice(char *buf, size_t size, const char *s, long long count)
{
	long long whole = 0, frac = 0, scale = 1, unit = 0, us;
	const char *p = s;
	size_t i;

	snprintf(buf, size, ", such as 1500ms");
	for (; isdigit((unsigned char)*p) && whole <= DURATION_MAX_US; p++)
		whole = whole * 10 + (*p - '0');
	if (*p++ != '.' || !isdigit((unsigned char)*p))
		return buf;
	/* six digits keep frac * unit within 64 bits */
	for (; isdigit((unsigned char)*p) && scale < 1000000; p++) {
		frac = frac * 10 + (*p - '0');
		scale *= 10;
	}
	for (i = 0; i < NUNITS; i++)
		if (strcmp(p, duration_units[i].unit) == 0)
			unit = duration_units[i].us;
	if (unit == 0 || whole > DURATION_MAX_US / unit)
		return buf;
	us = whole * unit + frac * unit / scale;
	if (us > DURATION_MAX_US)
		return buf;
	if (us == 0) {
		snprintf(buf, size, ", greater than zero");
		return buf;
	}
	if (frac * unit % scale != 0 || us % US_PER_MS != 0) {
		snprintf(buf, size, ", and 1ms is the smallest");
		return buf;
	}
	for (i = NUNITS; us % duration_units[i - 1].us != 0; i--)
		;
	if (count >= 0)
		snprintf(buf, size, "; write \"%lld/%lld%s\"", count,
		    us / duration_units[i - 1].us, duration_units[i - 1].unit);
	else
		snprintf(buf, size, "; write %lld%s", us / duration_units[i - 1].us,
		    duration_units[i - 1].unit);
	return buf;
}

int
duration_cause_is_fraction(const char *cause)
{
	return cause == duration_fraction;
}

int
duration_format(long long us, char *buf, size_t size)
{
	char text[DURATION_TEXT_SIZE];
	size_t n;

	if (us == 0)
		snprintf(text, sizeof(text), "0s");
	else {
		size_t i;

		for (i = NUNITS; i-- > 0;)	/* the table runs ms to d */
			if (us % duration_units[i].us == 0)
				break;
		if (i < NUNITS)
			snprintf(text, sizeof(text), "%lld%s",
			    us / duration_units[i].us, duration_units[i].unit);
		else {
			/* a default precision, window/10, of a window that is
			 * not a multiple of 10ms: 1001ms gives 100.1ms, as in
			 * force */
			n = (size_t)snprintf(text, sizeof(text), "%lld.%03lld",
			    us / US_PER_MS, us % US_PER_MS);
			while (text[n - 1] == '0')
				text[--n] = '\0';
			snprintf(text + n, sizeof(text) - n, "ms");
		}
	}
	/* Cut, "1ms" would read "1m": a minute. */
	n = strlen(text);
	if (n >= size) {
		if (size > 0)
			buf[0] = '\0';
		return -1;
	}
	memcpy(buf, text, n + 1);
	return 0;
}
