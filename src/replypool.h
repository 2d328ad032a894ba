/*
 * hiredis reply objects recycled through a per-thread free list. hiredis
 * 0.14 allocates every reply object, one per element of an array reply,
 * and frees it once the callback has run: a batch reply of N checks cost
 * 7 allocations per check. Installed as a reader's object functions, these
 * build the same redisReply objects, which callbacks read unchanged, and
 * keep them for the next reply.
 */
#ifndef REPLYPOOL_H
#define REPLYPOOL_H

struct redisReplyObjectFunctions;

/* For redisReader.fn (hiredis wants it non-const). */
extern struct redisReplyObjectFunctions replypool_functions;

/* Its freeObject, for a reader whose other functions wrap these. */
void replypool_free_object(void *obj);

/* Frees the calling thread's idle objects; call when its contexts are gone. */
void replypool_thread_free(void);

#endif
