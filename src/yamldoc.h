/*
 * The policy file as a tree of YAML nodes with their positions (see
 * yamldoc.c). What the nodes mean is config.c's business.
 */
#ifndef YAMLDOC_H
#define YAMLDOC_H

#include <stddef.h>
#include <stdio.h>

enum node_type { NODE_SCALAR, NODE_MAPPING, NODE_SEQUENCE };

/* A YAML node with its position; mappings hold key, value, key, value... */
struct node {
	enum node_type	  type;
	int		  line, col;	/* 1-based */
	char		 *value;	/* scalars */
	int		  plain;	/* unquoted scalar: may be null/bool/int */
	struct node	**items;
	size_t		  nitems, items_cap;
	/* Refused as it was read (an alias, a NUL), and said so there: a
	 * stand-in, so the rest of the file is checked, that no other
	 * message is about. */
	int		  refused;
};

/* What is wrong with the file as YAML, each at its line and column
 * (1-based); read_errno: why reading it failed, or 0. */
struct yamldoc_error {
	int	 line, col;
	char	*text;
};
struct yamldoc_errors {
	struct yamldoc_error	*v;
	size_t			 n;
	int			 read_errno;
};

/* Reads at most max_bytes of fp into one document's root node, or NULL:
 * then errors says why, or is empty for an empty file. Errors about
 * refused values (an alias, a NUL) come with a tree too: their nodes are
 * marked refused. */
struct node *yamldoc_read(FILE *fp, size_t max_bytes, struct yamldoc_errors *errors);
void yamldoc_free(struct node *root);
void yamldoc_errors_free(struct yamldoc_errors *errors);
/* "workers:2", a key glued to its value, which YAML reads as one word:
 * advice naming the fix into buf, or NULL when word does not start so. */
const char *yamldoc_glued_key_advice(const char *word, char *buf, size_t size);

#endif
