/* SPDX-License-Identifier: Apache-2.0 */
/* systemd's readiness protocol (sd_notify(3)) without libsystemd: one datagram to $NOTIFY_SOCKET.
 * Only the sending side; it never reads the watchdog or any other variable. */
#ifndef CTL_NOTIFY_H
#define CTL_NOTIFY_H

/* Sends state ("READY=1", "STOPPING=1", "STATUS=text", several joined by '\n') as one datagram
 * to $NOTIFY_SOCKET: a path ("/run/systemd/notify") or an abstract name ("@name"). 0 when sent,
 * and 0 without sending when the variable is unset or empty (not started by systemd). Else
 * -errno: -EINVAL (state NULL or empty, or "@" alone), -EAFNOSUPPORT (neither '/' nor '@', e.g.
 * systemd's "vsock:" form), -ENAMETOOLONG (longer than a unix socket address), or what socket()
 * or sendmsg() failed with (-ENOENT, -ECONNREFUSED, ...). Logs nothing; the caller decides. */
int ctl_notify(const char *state);

#endif
