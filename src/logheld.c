#include <stdarg.h>
#include <stdio.h>

#include <event2/event.h>

#include "clock.h"
#include "logheld.h"

#define LOGHELD_INTERVAL_US 1000000

void
logheld_init(struct logheld *lh, struct event_base *base, logheld_tell tell,
    void *arg)
{
	*lh = (struct logheld){ .lh_base = base, .lh_tell = tell, .lh_arg = arg };
}

static void
logheld_tell_held(struct logheld *lh)
{
	char ago[48] = "";
	long long now = mono_us(), ago_ms = (now - lh->lh_last_us) / 1000;

	if (lh->lh_unlogged == 0)
		return;
	/* Told by the timer a second on, the latest event is not news: say
	 * when it happened, or it reads as one after whatever came since
	 * (a READONLY after the line saying the link was dropped). */
	if (ago_ms >= 100)
		snprintf(ago, sizeof(ago), " %lld ms ago", ago_ms);
	lh->lh_tell(lh->lh_arg, lh->lh_last, ago, lh->lh_unlogged - 1);
	lh->lh_logged_us = now;
	lh->lh_unlogged = 0;
}

static void
on_flush(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	logheld_tell_held(arg);
}

void
logheld_note(struct logheld *lh, const char *fmt, ...)
{
	long long now = mono_us();
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(lh->lh_last, sizeof(lh->lh_last), fmt, ap);
	va_end(ap);
	lh->lh_unlogged++;
	lh->lh_last_us = now;
	if (lh->lh_logged_us != 0 && now - lh->lh_logged_us < LOGHELD_INTERVAL_US) {
		struct timeval tv = tv_us(lh->lh_logged_us + LOGHELD_INTERVAL_US - now);

		if (lh->lh_flush_ev == NULL)
			lh->lh_flush_ev = evtimer_new(lh->lh_base, on_flush, lh);
		if (!evtimer_pending(lh->lh_flush_ev, NULL))
			evtimer_add(lh->lh_flush_ev, &tv);
		return;
	}
	if (lh->lh_flush_ev)
		evtimer_del(lh->lh_flush_ev);
	logheld_tell_held(lh);
}

void
logheld_finish(struct logheld *lh)
{
	if (lh->lh_flush_ev) {
		event_free(lh->lh_flush_ev);
		lh->lh_flush_ev = NULL;
	}
	logheld_tell_held(lh);
}
