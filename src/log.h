/* Logging to stderr, whole lines, text or JSON lines (STYLE 19). */
#ifndef LOG_H
#define LOG_H

#include <stddef.h>

enum log_level { LOG_LEVEL_ERROR, LOG_LEVEL_WARN, LOG_LEVEL_INFO, LOG_LEVEL_DEBUG };
enum log_format { LOG_FORMAT_TEXT, LOG_FORMAT_JSON };

void log_configure(enum log_level level, enum log_format format);
/* From now on lines are queued and written by a thread of their own, so a
 * stalled stderr drops lines instead of stalling the caller; -1 if the
 * thread cannot start (lines are then written at once, as before). */
int log_start(void);
/* Writes out what is queued (waiting 2 s at most for a stalled reader)
 * and goes back to writing at once. */
void log_stop(void);
/* Lines dropped so far because the queue was full. */
unsigned long long log_lines_dropped(void);
int log_enabled(enum log_level level);
void log_errorx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* An access line, written at any level: route (NULL: none matched),
 * escaped key, status, result, cost and microseconds; JSON fields in JSON
 * mode, key=value otherwise. */
void log_access(const char *route, const char *key, size_t keylen, int status,
    const char *result, long long cost, long long took_us);
void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void fatalx(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Copies untrusted bytes into dst as printable ASCII (\xNN, \", \\), always
 * NUL-terminated, truncated to fit; returns dst. */
char *log_escape(char *dst, size_t dstsize, const char *src, size_t srclen);
/* The same with quotes and backslashes as they are: for text that a JSON
 * encoder quotes next (a reply's message). */
char *log_escape_bytes(char *dst, size_t dstsize, const char *src, size_t srclen);

#endif
