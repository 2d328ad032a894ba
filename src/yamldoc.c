/*
 * The policy file read into a tree of nodes that keep their positions, so
 * that every message about it can name FILE:LINE:COL. libyaml's event
 * stream is folded into the tree, refusing anchors, aliases, tags, NULs
 * and extra documents on the way (each said, and the file read on without
 * it, so the rest is still checked); a syntax error stops the reading and
 * is explained: where the construct it broke began, a tab, a key glued to
 * its value, a bare IPv6 address in a flow list (which the reader gets
 * past; see FLOW_COLON).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "xmalloc.h"
#include "yamldoc.h"

/* See restore_flow_colons. */
#define FLOW_COLON		"\xee\x80\x80"
#define FLOW_COLON_LEN		3
#define FLOW_COLON_RETRIES	64
#define YAML_DEPTH_MAX		32
#define MESSAGE_MAX		512

/* What one reading carries around. */
struct reader {
	struct yamldoc_errors	*errors;
	size_t			 max_bytes;
	yaml_mark_t		 colon_at[FLOW_COLON_RETRIES]; /* see FLOW_COLON */
	unsigned		 ncolons;
};

static void errorf(struct reader *rd, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* An error at line:col (1-based). */
static void
errorf(struct reader *rd, int line, int col, const char *fmt, ...)
{
	struct yamldoc_errors *e = rd->errors;
	char msg[MESSAGE_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	e->v = xrealloc(e->v, (e->n + 1) * sizeof(*e->v));
	e->v[e->n].line = line;
	e->v[e->n].col = col;
	e->v[e->n++].text = xstrdup(msg);
}

/* Forgets the errors found since there were n. */
static void
errors_truncate(struct reader *rd, size_t n)
{
	struct yamldoc_errors *e = rd->errors;

	while (e->n > n)
		free(e->v[--e->n].text);
}

void
yamldoc_errors_free(struct yamldoc_errors *errors)
{
	for (size_t i = 0; i < errors->n; i++)
		free(errors->v[i].text);
	free(errors->v);
	memset(errors, 0, sizeof(*errors));
}


void
yamldoc_free(struct node *nd)
{
	if (nd == NULL)
		return;
	for (size_t i = 0; i < nd->nitems; i++)
		yamldoc_free(nd->items[i]);
	free(nd->items);
	free(nd->value);
	free(nd);
}

static struct node *
node_new(enum node_type type, const yaml_mark_t *mark)
{
	struct node *nd = xcalloc(1, sizeof(*nd));

	nd->type = type;
	nd->line = (int)mark->line + 1;
	nd->col = (int)mark->column + 1;
	return nd;
}

static void
node_append(struct node *parent, struct node *child)
{
	/* Doubling: a list of a million override keys is read in linear
	 * time by allocators that move a block on each realloc (ASan's). */
	if (parent->nitems == parent->items_cap) {
		parent->items_cap = parent->items_cap ? parent->items_cap * 2 : 4;
		parent->items = xrealloc(parent->items,
		    parent->items_cap * sizeof(*parent->items));
	}
	parent->items[parent->nitems++] = child;
}

static void restore_flow_colons(char *);
static void restore_flow_colon(const struct reader *, char *, const yaml_mark_t *);

/* An anchor or an explicit tag: refused, and the node read on without it,
 * so that what else is wrong in the file is said in the same run. */
static void
anchor_or_tag_refused(struct reader *rd, const yaml_mark_t *m,
    const yaml_char_t *anchor, const yaml_char_t *tag)
{
	if (anchor)
		errorf(rd, (int)m->line + 1, (int)m->column + 1, "the anchor &%s: "
		    "anchors and aliases are not allowed in a policy file; write "
		    "the values out where they are used", (const char *)anchor);
	if (tag) {
		/* libyaml resolves !!int to its full name: shown as written */
		static const char core[] = "tag:yaml.org,2002:";
		const char *t = (const char *)tag;
		int is_core = strncmp(t, core, sizeof(core) - 1) == 0;

		errorf(rd, (int)m->line + 1, (int)m->column + 1, "the tag %s%s: "
		    "tags are not allowed in a policy file; remove it (a value's "
		    "type is where it goes: quote text that looks like a number)",
		    is_core ? "!!" : "", is_core ? t + sizeof(core) - 1 : t);
	}
}

/* Reads the next node from the parser; NULL on a syntax error (reported). */
static struct node *
yaml_read_node(struct reader *rd, yaml_parser_t *parser, yaml_event_t *first,
    int depth)
{
	struct node *nd = NULL;
	yaml_event_t ev;
	const yaml_mark_t *m = &first->start_mark;

	if (depth > YAML_DEPTH_MAX) {
		errorf(rd, (int)m->line + 1, (int)m->column + 1,
		    "nesting deeper than %d levels", YAML_DEPTH_MAX);
		return NULL;
	}
	switch (first->type) {
	case YAML_ALIAS_EVENT:
		errorf(rd, (int)m->line + 1, (int)m->column + 1,
		    "aliases are not allowed in a policy file");
		nd = node_new(NODE_SCALAR, m);
		nd->value = xstrdup("");
		nd->refused = 1;
		return nd;
	case YAML_SCALAR_EVENT:
		anchor_or_tag_refused(rd, m, first->data.scalar.anchor,
		    first->data.scalar.plain_implicit == 0 &&
		    first->data.scalar.quoted_implicit == 0 ?
		    first->data.scalar.tag : NULL);
		nd = node_new(NODE_SCALAR, m);
		if (memchr(first->data.scalar.value, '\0',
		    first->data.scalar.length) != NULL) {
			/* "\0" or "\u0000" in a double-quoted string: C
			 * strings would end there, and the rest be ignored */
			errorf(rd, (int)m->line + 1, (int)m->column + 1,
			    "a NUL character (\\0) is not allowed in a value");
			nd->refused = 1;
		}
		nd->value = xstrndup((const char *)first->data.scalar.value,
		    first->data.scalar.length);
		if (first->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
		    strncmp(nd->value, FLOW_COLON, FLOW_COLON_LEN) == 0)
			restore_flow_colon(rd, nd->value, m);
		nd->plain = first->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
		return nd;
	case YAML_SEQUENCE_START_EVENT:
	case YAML_MAPPING_START_EVENT: {
		int is_map = first->type == YAML_MAPPING_START_EVENT;
		yaml_char_t *anchor = is_map ? first->data.mapping_start.anchor :
		    first->data.sequence_start.anchor;
		yaml_char_t *tag = is_map ? first->data.mapping_start.tag :
		    first->data.sequence_start.tag;
		int implicit = is_map ? first->data.mapping_start.implicit :
		    first->data.sequence_start.implicit;

		anchor_or_tag_refused(rd, m, anchor, implicit ? NULL : tag);
		nd = node_new(is_map ? NODE_MAPPING : NODE_SEQUENCE, m);
		for (;;) {
			struct node *child;

			if (!yaml_parser_parse(parser, &ev)) {
				yamldoc_free(nd);
				return NULL;
			}
			if (ev.type == YAML_SEQUENCE_END_EVENT ||
			    ev.type == YAML_MAPPING_END_EVENT) {
				yaml_event_delete(&ev);
				return nd;
			}
			child = yaml_read_node(rd, parser, &ev, depth + 1);
			yaml_event_delete(&ev);
			if (child == NULL) {
				yamldoc_free(nd);
				return NULL;
			}
			node_append(nd, child);
		}
	}
	default:
		errorf(rd, (int)m->line + 1, (int)m->column + 1,
		    "unexpected YAML structure");
		return NULL;
	}
}

/*
 * YAML 1.1 cannot start a plain scalar with ':' inside a flow collection,
 * so libyaml refuses the contract's own `trusted_proxies: [127.0.0.1/32,
 * ::1/128]`. Where it fails on such a word (and only there, at most
 * FLOW_COLON_RETRIES times), the loader puts U+E000, a private-use
 * character that is one column wide like ':' and no YAML indicator, in
 * place of that ':' and parses again; the plain scalars that start at one
 * of those places get their ':' back (restore_flow_colon). Positions stay
 * those of the file. restore_flow_colons puts them back in a line quoted
 * in an error.
 */
static void
restore_flow_colons(char *value)
{
	char *r = value, *w = value;

	if (strstr(value, FLOW_COLON) == NULL)
		return;
	while (*r) {
		if (strncmp(r, FLOW_COLON, FLOW_COLON_LEN) == 0) {
			*w++ = ':';
			r += FLOW_COLON_LEN;
		} else
			*w++ = *r++;
	}
	*w = '\0';
}

/* The ':' replaced at the start of this plain scalar, if it was one (a
 * U+E000 the file itself has stays). */
static void
restore_flow_colon(const struct reader *rd, char *value, const yaml_mark_t *m)
{
	for (unsigned i = 0; i < rd->ncolons; i++)
		if (rd->colon_at[i].line == m->line &&
		    rd->colon_at[i].column == m->column) {
			value[0] = ':';
			memmove(value + 1, value + FLOW_COLON_LEN,
			    strlen(value + FLOW_COLON_LEN) + 1);
			return;
		}
}

/* The whole policy file, as libyaml reads it. */
struct source {
	char	*buf;
	size_t	 len;
};

/* The UTF-8 byte order mark libyaml drops before it counts columns. */
static size_t
bom_len(const struct source *src)
{
	return src->len >= 3 && memcmp(src->buf, "\xef\xbb\xbf", 3) == 0 ? 3 : 0;
}

/* Byte offset of the start of line `line` (0-based, as libyaml counts:
 * \n, \r\n or \r ends one), or -1 past the end. */
static long
line_start(const struct source *src, size_t line)
{
	size_t i = 0, cur = 0;

	while (cur < line && i < src->len) {
		char ch = src->buf[i++];

		if (ch == '\r') {
			if (i < src->len && src->buf[i] == '\n')
				i++;
			cur++;
		} else if (ch == '\n')
			cur++;
	}
	if (cur < line)
		return -1;
	return (long)(i == 0 ? bom_len(src) : i);
}

/* Byte offset of character column `col` of line `line`, or -1. */
static long
mark_offset(const struct source *src, size_t line, size_t col)
{
	long i = line_start(src, line);

	if (i < 0)
		return -1;
	for (; col > 0; col--) {
		if ((size_t)i >= src->len)
			return -1;
		do
			i++;
		while ((size_t)i < src->len && ((unsigned char)src->buf[i] & 0xc0) == 0x80);
	}
	return i;
}

/* Line `line` of the file, without its break and with any flow colon as
 * written (the caller frees it); NULL if it is missing. */
static char *
source_line(const struct source *src, size_t line)
{
	long i = line_start(src, line);
	size_t n = 0;
	char *text;

	if (i < 0)
		return NULL;
	while ((size_t)i + n < src->len && src->buf[i + (long)n] != '\n' &&
	    src->buf[i + (long)n] != '\r')
		n++;
	text = xstrndup(src->buf + i, n);
	restore_flow_colons(text);
	return text;
}

/* A reader error (a byte that is not UTF-8, a control character) has only
 * a byte offset: its line and character column. */
static void
offset_position(const struct source *src, size_t offset, int *line, int *col)
{
	*line = 1;
	*col = 1;
	for (size_t i = bom_len(src); i < offset && i < src->len; i++) {
		char ch = src->buf[i];

		if (ch == '\n' || (ch == '\r' && (i + 1 >= src->len ||
		    src->buf[i + 1] != '\n'))) {
			(*line)++;
			*col = 1;
		} else if (ch != '\r' && ((unsigned char)ch & 0xc0) != 0x80)
			(*col)++;
	}
}

/*
 * Whether the unquoted word at or just before character column `col` of
 * `text` looks like a bare IPv6 address: it starts with ':' (after any
 * bracket) or contains "::". YAML 1.1 cannot start a plain scalar with ':'
 * in a flow collection, so `[127.0.0.1/32, ::1/128]` and `listen:
 * [::1]:8080` are syntax errors that libyaml words in terms of nodes and
 * flows; quoting is the fix, and saying so saves a trip to the YAML spec.
 */
static int
looks_like_bare_ipv6(const char *text, size_t col)
{
	static const char delims[] = " \t,[]{}";
	const char *p = text, *word = NULL;
	size_t c = 0, wlen = 0;
	int quoted = 0;

	while (*p) {
		const char *start;
		size_t cstart = c;
		int q = 0;

		if (strchr(delims, *p)) {
			p++;
			c++;
			continue;
		}
		if (*p == '#' && (p == text || strchr(delims, p[-1])))
			break;		/* a comment */
		if (cstart > col)
			break;
		start = p;
		if (*p == '"' || *p == '\'') {
			char quote = *p;

			/* '' and \" do not end a quoted scalar */
			for (q = 1, p++, c++; *p; p++) {
				if ((*p & 0xc0) != 0x80)
					c++;
				if (quote == '"' && *p == '\\' && p[1]) {
					p++;
					c++;
				} else if (*p == quote && quote == '\'' && p[1] == '\'') {
					p++;
					c++;
				} else if (*p == quote) {
					p++;
					break;
				}
			}
		} else {
			for (; *p && !strchr(delims, *p); p++)
				if ((*p & 0xc0) != 0x80)
					c++;
		}
		word = start;
		wlen = (size_t)(p - start);
		quoted = q;
	}
	if (word == NULL || quoted)
		return 0;
	return (word[0] == ':' && wlen > 1) ||
	    memmem(word, wlen, "::", 2) != NULL;
}

/* What a failed parse leaves to report (libyaml's strings are constants). */
struct yaml_failure {
	yaml_error_type_t	 error;
	const char		*problem, *context;
	yaml_mark_t		 problem_mark, context_mark;
	size_t			 problem_offset;
	yaml_encoding_t		 encoding;
};

static struct yaml_failure
yaml_failure_of(const yaml_parser_t *p)
{
	struct yaml_failure f = { p->error, p->problem, p->context,
	    p->problem_mark, p->context_mark, p->problem_offset, p->encoding };

	return f;
}

/* Is the parser stopped on a bare IPv6 word (see looks_like_bare_ipv6)? */
static int
stopped_on_ipv6(const struct source *src, const struct yaml_failure *parser)
{
	const yaml_mark_t *m = parser->problem ? &parser->problem_mark :
	    &parser->context_mark;
	char *text;
	int yes;

	if ((parser->error != YAML_SCANNER_ERROR &&
	    parser->error != YAML_PARSER_ERROR) ||
	    parser->encoding != YAML_UTF8_ENCODING ||
	    (text = source_line(src, m->line)) == NULL)
		return 0;
	yes = looks_like_bare_ipv6(text, m->column);
	free(text);
	return yes;
}

/* When the parser stopped on a plain scalar that starts with ':' in a flow
 * collection, puts a FLOW_COLON in its place; 0 if it did. */
static int
replace_flow_colon(struct reader *rd, struct source *src,
    const struct yaml_failure *parser)
{
	const yaml_mark_t *m = &parser->problem_mark;
	long at;

	if (!parser->problem || parser->error != YAML_PARSER_ERROR ||
	    !stopped_on_ipv6(src, parser) ||
	    (at = mark_offset(src, m->line, m->column)) < 0 || src->buf[at] != ':')
		return -1;
	src->buf = xrealloc(src->buf, src->len + FLOW_COLON_LEN);
	memmove(src->buf + at + FLOW_COLON_LEN, src->buf + at + 1,
	    src->len - (size_t)at - 1);
	memcpy(src->buf + at, FLOW_COLON, FLOW_COLON_LEN);
	src->len += FLOW_COLON_LEN - 1;
	rd->colon_at[rd->ncolons].line = m->line;
	rd->colon_at[rd->ncolons++].column = m->column;
	return 0;
}

/* Is the scanner stopped on a tab, which cannot start a token? */
static int
stopped_on_tab(const struct source *src, const struct yaml_failure *parser)
{
	long at;

	if (parser->error != YAML_SCANNER_ERROR || !parser->problem ||
	    strncmp(parser->problem, "found character that cannot start", 33) != 0)
		return 0;
	at = mark_offset(src, parser->problem_mark.line, parser->problem_mark.column);
	return at >= 0 && (size_t)at < src->len && src->buf[at] == '\t';
}

/*
 * "workers:2": a key glued to its value, which YAML reads as one word.
 * Advice naming the fix into buf, or NULL when word does not start so.
 */
const char *
yamldoc_glued_key_advice(const char *word, char *buf, size_t size)
{
	const char *colon = word;

	while (isalnum((unsigned char)*colon) || *colon == '_' || *colon == '-')
		colon++;
	if (colon == word || *colon != ':' || colon[1] == '\0' || colon[1] == ' ' ||
	    colon[1] == ':' || colon[1] == '#')
		return NULL;
	snprintf(buf, size, "a key needs a space after its colon: \"%.*s: %.24s\"",
	    (int)(colon - word > 32 ? 32 : colon - word), word, colon + 1);
	return buf;
}

/*
 * "failure_mode:closed" is one plain word to YAML, and the colon of the
 * next key ("routes:") is then where it fails, "mapping values are not
 * allowed". The nearest line from there up whose first word is a key
 * glued to its value is the mistake: advice naming it into buf, or NULL.
 */
static const char *
key_glued_above(const struct source *src, size_t line, char *buf, size_t size)
{
	for (size_t back = 0; back <= line && back < 3; back++) {
		char *text = source_line(src, line - back), advice[128];
		const char *p;

		if (text == NULL)
			return NULL;
		p = text + strspn(text, " ");
		if (*p == '-')
			p += 1 + strspn(p + 1, " ");
		if (yamldoc_glued_key_advice(p, advice, sizeof(advice)) != NULL) {
			snprintf(buf, size, " (line %zu: %s)", line - back + 1, advice);
			free(text);
			return buf;
		}
		free(text);
	}
	return NULL;
}

static void
yaml_report_parser_error(struct reader *rd, const struct source *src,
    const struct yaml_failure *parser)
{
	const yaml_mark_t *m = parser->problem ? &parser->problem_mark :
	    &parser->context_mark;
	const char *hint = "", *what = NULL;
	char start[128] = "", glued[192];

	if (parser->error == YAML_READER_ERROR) {
		/* libyaml gives a byte offset only, and no mark */
		int line, col;
		const char *why = parser->problem ? parser->problem :
		    "cannot decode the file";

		offset_position(src, parser->problem_offset, &line, &col);
		errorf(rd, line, col, "%s%s", why, strstr(why, "UTF-8") ?
		    " (the file must be UTF-8)" : strstr(why, "control") ?
		    " (YAML allows only tab and line breaks)" : "");
		return;
	}
	if (stopped_on_ipv6(src, parser))
		hint = " (quote IPv6 addresses: \"::1/128\", \"[::1]:8080\")";
	else if (stopped_on_tab(src, parser))
		hint = " (a tab: YAML indents with spaces only)";
	else if (parser->problem && strcmp(parser->problem,
	    "mapping values are not allowed in this context") == 0 &&
	    (hint = key_glued_above(src, m->line, glued, sizeof(glued))) == NULL)
		hint = " (quote a value that contains \": \" or ends in \":\")";
	/*
	 * An unterminated quote or bracket is only noticed where the file
	 * ends or the next token fails, maybe many lines on; the position
	 * stays that (it is where parsing failed), and the context ("while
	 * scanning a quoted scalar") gets where its construct began.
	 */
	if (parser->problem && parser->context &&
	    parser->context_mark.line != parser->problem_mark.line) {
		if (strncmp(parser->context, "while scanning ", 15) == 0)
			what = parser->context + 15;
		else if (strncmp(parser->context, "while parsing ", 14) == 0)
			what = parser->context + 14;
		if (what && (strncmp(what, "a ", 2) == 0 || strncmp(what, "an ", 3) == 0))
			snprintf(start, sizeof(start), " (the %s starts at %d:%d)",
			    strchr(what, ' ') + 1, (int)parser->context_mark.line + 1,
			    (int)parser->context_mark.column + 1);
	}
	errorf(rd, (int)m->line + 1, (int)m->column + 1, "YAML syntax error: %s%s%s%s%s",
	    parser->problem ? parser->problem : "unknown problem",
	    parser->context ? " " : "", parser->context ? parser->context : "",
	    start, hint);
}

/* One parse of the source into one document's root node, or NULL: then
 * either errors were reported or the parser holds a syntax error. */
static struct node *
yaml_parse_source(struct reader *rd, const struct source *src, yaml_parser_t *parser)
{
	yaml_event_t ev;
	struct node *root = NULL;
	int ndocs = 0, failed = 0;

	yaml_parser_set_input_string(parser, (const unsigned char *)src->buf, src->len);
	for (;;) {
		if (!yaml_parser_parse(parser, &ev)) {
			failed = 1;
			break;
		}
		if (ev.type == YAML_STREAM_END_EVENT) {
			yaml_event_delete(&ev);
			break;
		}
		if (ev.type == YAML_DOCUMENT_START_EVENT) {
			if (++ndocs > 1) {
				/* The first is still checked, and its errors
				 * said with this one. */
				errorf(rd, (int)ev.start_mark.line + 1,
				    (int)ev.start_mark.column + 1,
				    "only one YAML document is allowed");
				yaml_event_delete(&ev);
				break;
			}
		} else if (ev.type != YAML_STREAM_START_EVENT &&
		    ev.type != YAML_DOCUMENT_END_EVENT) {
			struct node *nd = yaml_read_node(rd, parser, &ev, 0);

			if (nd == NULL) {
				yaml_event_delete(&ev);
				failed = 1;
				break;
			}
			root = nd;
		}
		yaml_event_delete(&ev);
	}
	if (failed) {
		yamldoc_free(root);
		return NULL;
	}
	return root;
}

/* Parses the file into one document's root node, or NULL (errors reported,
 * or none for an empty file). */
static struct node *
yaml_load_file(struct reader *rd, FILE *fp)
{
	struct source src = { NULL, 0 };
	struct yaml_failure first[FLOW_COLON_RETRIES];
	struct node *root = NULL;
	size_t cap = 0, n;

	/* Bounded: a path swapped for a FIFO that a writer keeps feeding, or
	 * for something endless, must not take the daemon's memory. */
	do {
		if (src.len == cap) {
			cap = cap ? cap * 2 : 8192;
			src.buf = xrealloc(src.buf, cap);
		}
		n = fread(src.buf + src.len, 1, cap - src.len, fp);
		src.len += n;
	} while (n > 0 && src.len <= rd->max_bytes);
	if (src.len > rd->max_bytes) {
		errorf(rd, 1, 1, "larger than %zu MiB: not a policy file",
		    rd->max_bytes >> 20);
		free(src.buf);
		return NULL;
	}
	if (ferror(fp)) {
		rd->errors->read_errno = errno;
		errorf(rd, 1, 1, "cannot read: %s", strerror(errno));
		free(src.buf);
		return NULL;
	}
	/* first[k]: the failure that had colon k replaced, reported if the
	 * parse still fails on its line (so "listen: [::1]:8080" is
	 * reported where the address starts, not at ":8080") */
	for (int tries = 0;; tries++) {
		yaml_parser_t parser;
		struct yaml_failure f;
		size_t nerr = rd->errors->n;

		yaml_parser_initialize(&parser);
		root = yaml_parse_source(rd, &src, &parser);
		f = yaml_failure_of(&parser);
		yaml_parser_delete(&parser);
		if (root != NULL || f.error == YAML_NO_ERROR)
			break;
		if (tries < FLOW_COLON_RETRIES &&
		    replace_flow_colon(rd, &src, &f) == 0) {
			first[tries] = f;
			/* what this pass said (an anchor, an alias) the next
			 * says again */
			errors_truncate(rd, nerr);
			continue;		/* parse again, past that colon */
		}
		/* still stopped on the address, further on its line; past
		 * the last retry it is stopped on the next address instead,
		 * which is where the file has to change */
		for (int k = 0; tries < FLOW_COLON_RETRIES && k < tries &&
		    stopped_on_ipv6(&src, &f); k++)
			if (first[k].problem_mark.line == f.problem_mark.line) {
				f = first[k];
				break;
			}
		yaml_report_parser_error(rd, &src, &f);
		break;
	}
	free(src.buf);
	return root;
}

struct node *
yamldoc_read(FILE *fp, size_t max_bytes, struct yamldoc_errors *errors)
{
	struct reader rd = { .errors = errors, .max_bytes = max_bytes };

	memset(errors, 0, sizeof(*errors));
	return yaml_load_file(&rd, fp);
}
