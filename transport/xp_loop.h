/* SPDX-License-Identifier: Apache-2.0 */
/* The control thread's event loop: fd watches and millisecond timers on epoll. It carries
 * accepts, connects, preambles and the control socket; bulk bytes go through xp_pool instead. */
#ifndef XP_LOOP_H
#define XP_LOOP_H

#include <stdint.h>
#include <sys/epoll.h>

struct xp_loop;
struct xp_watch;
struct xp_timer;

typedef void (*xp_watch_fn)(struct xp_watch *w, int fd, uint32_t events, void *arg);
typedef void (*xp_timer_fn)(void *arg);

int xp_loop_new(struct xp_loop **ret);
void xp_loop_free(struct xp_loop *l);
/* Runs until xp_loop_quit(); returns 0 or -errno. */
int xp_loop_run(struct xp_loop *l);
void xp_loop_quit(struct xp_loop *l);

/* events: EPOLLIN/EPOLLOUT (level-triggered). The loop does not own fd. */
int xp_watch_add(struct xp_loop *l, int fd, uint32_t events, xp_watch_fn fn, void *arg,
		 struct xp_watch **ret);
int xp_watch_mod(struct xp_watch *w, uint32_t events);
/* No events for ms, then the watch's events again (xp_watch_mod ends a pause early): a listener
 * that cannot accept for want of fds would otherwise wake the loop without end. */
int xp_watch_pause(struct xp_watch *w, uint64_t ms);
/* Safe from inside any callback; takes NULL. */
void xp_watch_del(struct xp_watch *w);

/* One-shot timer at an absolute vm_now_ms() deadline; it is freed before fn runs. */
int xp_timer_add(struct xp_loop *l, uint64_t deadline_ms, xp_timer_fn fn, void *arg,
		 struct xp_timer **ret);
void xp_timer_del(struct xp_timer *t);

#endif
