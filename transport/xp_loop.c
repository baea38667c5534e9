// SPDX-License-Identifier: Apache-2.0
/* epoll event loop for the control thread. Watches removed during a dispatch are freed after
 * the batch, so a callback may delete any watch, its own included. Timers are few (one per
 * pending connection), so a list scan is enough. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "util.h"
#include "xp_loop.h"

struct xp_watch {
	struct xp_loop *loop;
	int fd;
	uint32_t events;
	struct xp_timer *resume; /* while paused */
	bool dead;
	xp_watch_fn fn;
	void *arg;
	struct xp_watch *next_dead;
};

struct xp_timer {
	struct xp_loop *loop;
	uint64_t deadline;
	xp_timer_fn fn;
	void *arg;
	struct xp_timer *prev, *next;
};

struct xp_loop {
	int epfd;
	bool quit;
	struct xp_watch *dead;
	struct xp_timer *timers;
};

int xp_loop_new(struct xp_loop **ret)
{
	struct xp_loop *l = calloc(1, sizeof(*l));
	int r;

	if (!l)
		return -ENOMEM;
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (l->epfd < 0) {
		r = -errno;
		free(l);
		return r;
	}
	*ret = l;
	return 0;
}

static void reap_dead(struct xp_loop *l)
{
	while (l->dead) {
		struct xp_watch *w = l->dead;

		l->dead = w->next_dead;
		free(w);
	}
}

void xp_loop_free(struct xp_loop *l)
{
	if (!l)
		return;
	while (l->timers)
		xp_timer_del(l->timers);
	reap_dead(l);
	close(l->epfd);
	free(l);
}

int xp_watch_add(struct xp_loop *l, int fd, uint32_t events, xp_watch_fn fn, void *arg,
		 struct xp_watch **ret)
{
	struct xp_watch *w = calloc(1, sizeof(*w));
	struct epoll_event ev = { .events = events };

	if (!w)
		return -ENOMEM;
	w->loop = l;
	w->fd = fd;
	w->events = events;
	w->fn = fn;
	w->arg = arg;
	ev.data.ptr = w;
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		int r = -errno;

		free(w);
		return r;
	}
	if (ret)
		*ret = w;
	return 0;
}

int xp_watch_mod(struct xp_watch *w, uint32_t events)
{
	struct epoll_event ev = { .events = events, .data.ptr = w };

	if (epoll_ctl(w->loop->epfd, EPOLL_CTL_MOD, w->fd, &ev) < 0)
		return -errno;
	w->events = events;
	xp_timer_del(w->resume);
	w->resume = NULL;
	return 0;
}

static void watch_resume(void *arg)
{
	struct xp_watch *w = arg;

	w->resume = NULL;
	(void)xp_watch_mod(w, w->events);
}

int xp_watch_pause(struct xp_watch *w, uint64_t ms)
{
	struct epoll_event ev = { .events = 0, .data.ptr = w };

	if (w->resume)
		return 0;
	if (epoll_ctl(w->loop->epfd, EPOLL_CTL_MOD, w->fd, &ev) < 0)
		return -errno;
	return xp_timer_add(w->loop, vm_now_ms() + ms, watch_resume, w, &w->resume);
}

void xp_watch_del(struct xp_watch *w)
{
	if (!w || w->dead)
		return;
	xp_timer_del(w->resume);
	w->resume = NULL;
	epoll_ctl(w->loop->epfd, EPOLL_CTL_DEL, w->fd, NULL);
	w->dead = true;
	w->next_dead = w->loop->dead;
	w->loop->dead = w;
}

int xp_timer_add(struct xp_loop *l, uint64_t deadline_ms, xp_timer_fn fn, void *arg,
		 struct xp_timer **ret)
{
	struct xp_timer *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	t->loop = l;
	t->deadline = deadline_ms;
	t->fn = fn;
	t->arg = arg;
	t->next = l->timers;
	if (l->timers)
		l->timers->prev = t;
	l->timers = t;
	if (ret)
		*ret = t;
	return 0;
}

void xp_timer_del(struct xp_timer *t)
{
	if (!t)
		return;
	if (t->prev)
		t->prev->next = t->next;
	else
		t->loop->timers = t->next;
	if (t->next)
		t->next->prev = t->prev;
	free(t);
}

static int next_timeout(struct xp_loop *l, uint64_t now)
{
	uint64_t min = UINT64_MAX;

	for (struct xp_timer *t = l->timers; t; t = t->next)
		if (t->deadline < min)
			min = t->deadline;
	if (min == UINT64_MAX)
		return -1;
	return min <= now ? 0 : (int)(min - now > 60000 ? 60000 : min - now);
}

/* Fires one expired timer per scan: a callback may delete any other timer. */
static void run_timers(struct xp_loop *l)
{
	uint64_t now = vm_now_ms();
	bool fired = true;

	while (fired && !l->quit) {
		fired = false;
		for (struct xp_timer *t = l->timers; t; t = t->next) {
			if (t->deadline <= now) {
				xp_timer_fn fn = t->fn;
				void *arg = t->arg;

				xp_timer_del(t);
				fn(arg);
				fired = true;
				break;
			}
		}
	}
}

int xp_loop_run(struct xp_loop *l)
{
	struct epoll_event evs[64];

	l->quit = false;
	while (!l->quit) {
		int n = epoll_wait(l->epfd, evs, ARRAY_SIZE(evs), next_timeout(l, vm_now_ms()));

		if (n < 0 && errno != EINTR)
			return -errno;
		for (int i = 0; i < n && !l->quit; i++) {
			struct xp_watch *w = evs[i].data.ptr;

			if (!w->dead)
				w->fn(w, w->fd, evs[i].events, w->arg);
		}
		reap_dead(l);
		run_timers(l);
		reap_dead(l);
	}
	return 0;
}

void xp_loop_quit(struct xp_loop *l)
{
	l->quit = true;
}
