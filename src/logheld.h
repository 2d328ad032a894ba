/*
 * One log line for a burst of like events (Redis errors failing every
 * check, a gateway sending what the daemon refuses): the first is told at
 * once, then at most one line a second, naming the latest event and how
 * many more it stands for. What is held is told by the next line, or by a
 * timer a second after the last line, so the tale of a burst that ends is
 * not lost. One per worker and kind; the metrics count every event.
 */
#ifndef LOGHELD_H
#define LOGHELD_H

struct event;
struct event_base;

#define LOGHELD_TEXT_MAX 600

/* Writes the line: last as noted (raw, for the teller to escape), ago
 * ("" or " 250 ms ago": when last happened, if not just now), and how
 * many events before it the line also stands for. */
typedef void (*logheld_tell)(void *arg, const char *last, const char *ago,
    unsigned long long more);

struct logheld {
	struct event_base	*lh_base;
	struct event		*lh_flush_ev;	/* made on first use */
	logheld_tell		 lh_tell;
	void			*lh_arg;
	long long		 lh_logged_us;	/* the last line */
	long long		 lh_last_us;	/* the latest event */
	unsigned long long	 lh_unlogged;	/* events since the last line */
	char			 lh_last[LOGHELD_TEXT_MAX];
};

void logheld_init(struct logheld *lh, struct event_base *base,
    logheld_tell tell, void *arg);
/* An event: its text, formatted. */
void logheld_note(struct logheld *lh, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Tells what is held now and frees the timer (at shutdown). */
void logheld_finish(struct logheld *lh);

#endif
