/* SPDX-License-Identifier: Apache-2.0 */
/* systemd's service watchdog (WatchdogSec=, sd_watchdog_enabled(3)): the control loop sends
 * WATCHDOG=1 from a timer of its own, so a loop that stops turning stops the pings. */
#ifndef CTL_WATCHDOG_H
#define CTL_WATCHDOG_H

#include <stdint.h>

struct xp_loop;
struct ctl_watchdog;

/* Reads $WATCHDOG_USEC and $WATCHDOG_PID as sd_watchdog_enabled(3) does (the pid, where set,
 * must be ours, or other_pid: the vmigd a takeover's new one follows; 0 for none) and, where a
 * watchdog is asked for, pings at once and then at half its interval from a timer on loop. *ret is
 * NULL where none is asked for. 0, or -errno having logged why. */
int ctl_watchdog_new(struct xp_loop *loop, int other_pid, struct ctl_watchdog **ret);
/* The interval systemd asked for, in microseconds. */
uint64_t ctl_watchdog_usec(const struct ctl_watchdog *w);
/* Stops the pings; takes NULL. */
void ctl_watchdog_free(struct ctl_watchdog *w);

#endif
