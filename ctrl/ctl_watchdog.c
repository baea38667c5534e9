// SPDX-License-Identifier: Apache-2.0
/* ctl_watchdog.h: WATCHDOG=1 to $NOTIFY_SOCKET at half of $WATCHDOG_USEC, from a timer on the
 * control loop. Only that loop is judged: the data-path workers sleep in io_uring (and the DPDK
 * hop's thread in its idle naps) for as long as they have nothing to carry. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctl_notify.h"
#include "ctl_watchdog.h"
#include "log.h"
#include "util.h"
#include "xp_loop.h"

struct ctl_watchdog {
	struct xp_loop *loop;
	struct xp_timer *timer;
	uint64_t usec;
	uint64_t every_ms;
	bool warned;
};

/* A positive decimal number, all of s; 0 for anything else. */
static uint64_t parse_u64(const char *s)
{
	unsigned long long v;
	char *end;

	if (!s || *s < '0' || *s > '9')
		return 0;
	errno = 0;
	v = strtoull(s, &end, 10);
	return errno || *end ? 0 : (uint64_t)v;
}

static void ping(void *arg)
{
	struct ctl_watchdog *w = arg;
	int r;

	w->timer = NULL;
	r = ctl_notify("WATCHDOG=1");
	if (r < 0 && !w->warned) {
		log_warn("systemd: cannot send WATCHDOG=1 to $NOTIFY_SOCKET: %s", strerror(-r));
		w->warned = true;
	}
	r = xp_timer_add(w->loop, vm_now_ms() + w->every_ms, ping, w, &w->timer);
	if (r < 0)
		log_err("systemd watchdog: cannot arm the next ping (%s): systemd will restart "
			"vmigd when WatchdogSec= runs out",
			strerror(-r));
}

int ctl_watchdog_new(struct xp_loop *loop, int other_pid, struct ctl_watchdog **ret)
{
	const char *usec_s = getenv("WATCHDOG_USEC"), *pid_s = getenv("WATCHDOG_PID");
	struct ctl_watchdog *w;
	uint64_t usec, pid;
	int r;

	*ret = NULL;
	if (!usec_s)
		return 0;
	usec = parse_u64(usec_s);
	if (!usec) {
		log_warn("systemd: ignoring WATCHDOG_USEC=\"%s\": not a positive number", usec_s);
		return 0;
	}
	if (pid_s) {
		pid = parse_u64(pid_s);
		if (!pid) {
			log_warn("systemd: ignoring WATCHDOG_PID=\"%s\": not a pid", pid_s);
			return 0;
		}
		/* Another process's watchdog (a child that inherited the environment). */
		if (pid != (uint64_t)getpid() && (other_pid <= 0 || pid != (uint64_t)other_pid))
			return 0;
	}
	w = calloc(1, sizeof(*w));
	if (!w) {
		log_err("out of memory");
		return -ENOMEM;
	}
	w->loop = loop;
	w->usec = usec;
	w->every_ms = usec / 2000 ?: 1;
	/* The first ping at once, as the loop starts to run; a takeover's new vmigd is not the
	 * main process yet, and systemd would refuse it, so it waits one period. */
	r = xp_timer_add(loop, vm_now_ms() + (other_pid > 0 ? w->every_ms : 0), ping, w, &w->timer);
	if (r < 0) {
		log_err("systemd watchdog: cannot arm a timer: %s", strerror(-r));
		free(w);
		return r;
	}
	log_info("systemd watchdog: %llu ms; the control loop sends WATCHDOG=1 every %llu ms",
		 (unsigned long long)(usec / 1000), (unsigned long long)w->every_ms);
	*ret = w;
	return 0;
}

uint64_t ctl_watchdog_usec(const struct ctl_watchdog *w)
{
	return w ? w->usec : 0;
}

void ctl_watchdog_free(struct ctl_watchdog *w)
{
	if (!w)
		return;
	xp_timer_del(w->timer);
	free(w);
}
