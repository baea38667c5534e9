// SPDX-License-Identifier: Apache-2.0
/* sd_notify(3) for Type=notify units, in a few lines instead of a libsystemd dependency: the
 * protocol is one AF_UNIX datagram of "VAR=value" lines. Not a listener, no fds; the watchdog's
 * timer is ctl_watchdog.c's. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ctl_notify.h"

/* The address $NOTIFY_SOCKET names, and its length: a path ends with its NUL; an abstract name
 * ("@name") starts with a NUL and is exactly as long as the name, with no NUL after it. */
static int notify_addr(const char *e, struct sockaddr_un *sa, socklen_t *len)
{
	size_t n = strlen(e);

	if (e[0] != '/' && e[0] != '@')
		return -EAFNOSUPPORT;
	if (e[0] == '@' && n == 1)
		return -EINVAL;
	if (n >= sizeof(sa->sun_path))
		return -ENAMETOOLONG;
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path, e, n);
	if (e[0] == '@') {
		sa->sun_path[0] = '\0';
		*len = offsetof(struct sockaddr_un, sun_path) + n;
	} else {
		*len = offsetof(struct sockaddr_un, sun_path) + n + 1;
	}
	return 0;
}

int ctl_notify(const char *state)
{
	const char *e = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa;
	socklen_t salen;
	size_t n;
	ssize_t sent;
	int fd, r;

	if (!e || !*e)
		return 0;
	if (!state || !*state)
		return -EINVAL;
	r = notify_addr(e, &sa, &salen);
	if (r < 0)
		return r;
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	n = strlen(state);
	/* Never wait on the loop's thread: a receiver whose queue is full (a stuck systemd) gets
	 * -EAGAIN instead of a control loop held with it. */
	sent = sendto(fd, state, n, MSG_NOSIGNAL | MSG_DONTWAIT, (struct sockaddr *)&sa, salen);
	r = sent < 0 ? -errno : (size_t)sent == n ? 0 : -EMSGSIZE;
	close(fd);
	return r;
}
