/*
 * The free list is per thread because hiredis's freeObject gets no context
 * to find a per-connection one; each worker thread runs its own Redis link,
 * so nothing here is shared or locked.
 */
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "replypool.h"
#include "xmalloc.h"

/* Idle objects kept per thread: a few batch replies' worth. */
#define REPLYPOOL_IDLE_MAX	4096
/* An element vector kept for the next array, at most: a default batch of
 * 64 checks of 16 limits needs 5,248. A longer one, of a larger
 * redis.max_batch, is made for its reply and freed with it. */
#define REPLYPOOL_KEEP_ELEMENTS	8192

struct pooled {
	redisReply	 r;		/* first: a struct pooled * is a redisReply * */
	struct pooled	*next;
	redisReply	**elements;	/* an array's element vector, kept */
	size_t		 cap;
};

static _Thread_local struct pooled *idle;
static _Thread_local size_t nidle;

static struct pooled *
take(const redisReadTask *task, int type)
{
	struct pooled *p = idle;

	if (p) {
		idle = p->next;
		nidle--;
	} else
		p = xcalloc(1, sizeof(*p));
	memset(&p->r, 0, sizeof(p->r));
	p->r.type = type;
	if (task->parent) {
		redisReply *parent = task->parent->obj;

		parent->element[task->idx] = &p->r;
	}
	return p;
}

void
replypool_free_object(void *obj)
{
	struct pooled *p = obj;
	redisReply *r = &p->r;

	switch (r->type) {
	case REDIS_REPLY_ARRAY:
		for (size_t i = 0; i < r->elements; i++)
			if (r->element[i])
				replypool_free_object(r->element[i]);
		if (p->cap > REPLYPOOL_KEEP_ELEMENTS) {
			free(p->elements);
			p->elements = NULL;
			p->cap = 0;
		}
		break;
	case REDIS_REPLY_STRING:
	case REDIS_REPLY_STATUS:
	case REDIS_REPLY_ERROR:
		free(r->str);
		break;
	default:
		break;
	}
	if (nidle >= REPLYPOOL_IDLE_MAX) {
		free(p->elements);
		free(p);
		return;
	}
	p->next = idle;
	idle = p;
	nidle++;
}

static void *
create_string(const redisReadTask *task, char *str, size_t len)
{
	struct pooled *p = take(task, task->type);

	p->r.str = xmalloc(len + 1);
	memcpy(p->r.str, str, len);
	p->r.str[len] = '\0';
	p->r.len = len;
	return p;
}

static void *
create_array(const redisReadTask *task, int elements)
{
	struct pooled *p = take(task, REDIS_REPLY_ARRAY);
	size_t n = elements > 0 ? (size_t)elements : 0;

	if (n > p->cap) {
		p->elements = xrealloc(p->elements, n * sizeof(*p->elements));
		p->cap = n;
	}
	if (n > 0) {
		/* Unfilled slots must read NULL if the reply is cut short. */
		memset(p->elements, 0, n * sizeof(*p->elements));
		p->r.element = p->elements;
	}
	p->r.elements = n;
	return p;
}

static void *
create_integer(const redisReadTask *task, long long value)
{
	struct pooled *p = take(task, REDIS_REPLY_INTEGER);

	p->r.integer = value;
	return p;
}

static void *
create_nil(const redisReadTask *task)
{
	return take(task, REDIS_REPLY_NIL);
}

redisReplyObjectFunctions replypool_functions = {
	create_string, create_array, create_integer, create_nil,
	replypool_free_object,
};

void
replypool_thread_free(void)
{
	while (idle) {
		struct pooled *p = idle;

		idle = p->next;
		free(p->elements);
		free(p);
	}
	nidle = 0;
}
