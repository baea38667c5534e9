// SPDX-License-Identifier: Apache-2.0
/* Socket helpers: address parsing and formatting, listeners and non-blocking connects for TCP and
 * unix sockets. No policy here: callers decide timeouts and retries. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "util.h"
#include "xp_path.h"
#include "xp_sock.h"

int xp_addr_from_host(const char *host, unsigned int port, struct xp_addr *ret)
{
	struct xp_addr a;

	if (port > 65535)
		return -EINVAL;
	memset(&a, 0, sizeof(a));
	struct sockaddr_in *in4 = (struct sockaddr_in *)&a.ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&a.ss;

	if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
		in4->sin_family = AF_INET;
		in4->sin_port = htons(port);
		a.len = sizeof(*in4);
	} else if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(port);
		a.len = sizeof(*in6);
	} else {
		return -EINVAL;
	}
	*ret = a;
	return 0;
}

int xp_addr_parse(const char *s, int allow_zero_port, struct xp_addr *ret)
{
	char host[INET6_ADDRSTRLEN + 2];
	const char *colon, *hs = s;
	size_t hl;
	char *end;
	long port;

	if (s[0] == '[') {
		const char *rb = strchr(s, ']');

		if (!rb || rb[1] != ':')
			return -EINVAL;
		hs = s + 1;
		hl = rb - hs;
		colon = rb + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon)
			return -EINVAL;
		hl = colon - s;
	}
	if (hl == 0 || hl >= sizeof(host))
		return -EINVAL;
	memcpy(host, hs, hl);
	host[hl] = '\0';
	errno = 0;
	port = strtol(colon + 1, &end, 10);
	if (errno || *end || end == colon + 1 || port < 0 || port > 65535 ||
	    (port == 0 && !allow_zero_port))
		return -EINVAL;
	return xp_addr_from_host(host, port, ret);
}

int xp_addr_host(const struct xp_addr *a, char *buf, size_t len)
{
	const void *src;

	if (a->ss.ss_family == AF_INET)
		src = &((const struct sockaddr_in *)&a->ss)->sin_addr;
	else if (a->ss.ss_family == AF_INET6)
		src = &((const struct sockaddr_in6 *)&a->ss)->sin6_addr;
	else
		return -EAFNOSUPPORT;
	if (!inet_ntop(a->ss.ss_family, src, buf, len))
		return -errno;
	return 0;
}

unsigned int xp_addr_port(const struct xp_addr *a)
{
	if (a->ss.ss_family == AF_INET)
		return ntohs(((const struct sockaddr_in *)&a->ss)->sin_port);
	return ntohs(((const struct sockaddr_in6 *)&a->ss)->sin6_port);
}

int xp_addr_format(const struct xp_addr *a, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN];
	int r = xp_addr_host(a, host, sizeof(host));

	if (r < 0)
		return r;
	r = snprintf(buf, len, a->ss.ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u", host,
		     xp_addr_port(a));
	return r < (int)len ? 0 : -ENOSPC;
}

void xp_addr_set_port(struct xp_addr *a, unsigned int port)
{
	if (a->ss.ss_family == AF_INET6)
		((struct sockaddr_in6 *)&a->ss)->sin6_port = htons(port);
	else
		((struct sockaddr_in *)&a->ss)->sin_port = htons(port);
}

int xp_addr_is_wildcard(const struct xp_addr *a)
{
	if (a->ss.ss_family == AF_INET)
		return ((const struct sockaddr_in *)&a->ss)->sin_addr.s_addr == htonl(INADDR_ANY);
	return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)&a->ss)->sin6_addr);
}

int xp_addr_guess_public(char *buf, size_t len)
{
	struct ifaddrs *ifs, *i;
	int r = -EADDRNOTAVAIL;

	if (getifaddrs(&ifs) < 0)
		return -errno;
	for (int fam = 0; fam < 2 && r < 0; fam++) {
		for (i = ifs; i; i = i->ifa_next) {
			struct xp_addr a = { 0 };

			if (!i->ifa_addr || (i->ifa_flags & IFF_LOOPBACK) ||
			    !(i->ifa_flags & IFF_UP))
				continue;
			if (i->ifa_addr->sa_family != (fam == 0 ? AF_INET : AF_INET6))
				continue;
			if (fam == 1 &&
			    IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr))
				continue;
			memcpy(&a.ss, i->ifa_addr,
			       fam == 0 ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
			r = xp_addr_host(&a, buf, len);
			if (r == 0)
				break;
		}
	}
	freeifaddrs(ifs);
	return r;
}

int xp_ipv6_available(void)
{
	FILE *f = fopen("/proc/sys/net/ipv6/conf/default/disable_ipv6", "re");
	int disabled = 0, fd;

	if (f) {
		if (fscanf(f, "%d", &disabled) != 1)
			disabled = 0;
		fclose(f);
	}
	if (disabled)
		return 0;
	fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	close(fd);
	return 1;
}

int xp_tcp_listen(const struct xp_addr *a, int backlog, int *ret_fd, struct xp_addr *bound)
{
	int one = 1, zero = 0, fd, r;

	fd = socket(a->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0)
		goto fail_errno;
	/* KubeVirt listens on "::" for both families; net.ipv6.bindv6only must not decide. */
	if (a->ss.ss_family == AF_INET6 && xp_addr_is_wildcard(a) &&
	    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) < 0)
		goto fail_errno;
	if (bind(fd, (const struct sockaddr *)&a->ss, a->len) < 0)
		goto fail_errno;
	if (listen(fd, backlog) < 0)
		goto fail_errno;
	if (bound) {
		bound->len = sizeof(bound->ss);
		if (getsockname(fd, (struct sockaddr *)&bound->ss, &bound->len) < 0)
			goto fail_errno;
	}
	*ret_fd = fd;
	return 0;

fail_errno:
	r = -errno;
	close(fd);
	return r;
}

int xp_tcp_connect(const struct xp_addr *a, int *ret_fd)
{
	int fd, r;

	fd = socket(a->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (const struct sockaddr *)&a->ss, a->len) == 0) {
		*ret_fd = fd;
		return 0;
	}
	if (errno == EINPROGRESS) {
		*ret_fd = fd;
		return 1;
	}
	r = -errno;
	close(fd);
	return r;
}

int xp_sock_error(int fd)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		return -errno;
	return -err;
}

static int unix_addr(const char *path, struct sockaddr_un *sun)
{
	size_t n = strlen(path);

	memset(sun, 0, sizeof(*sun));
	sun->sun_family = AF_UNIX;
	if (n == 0)
		return -EINVAL;
	if (n >= sizeof(sun->sun_path))
		return -ENAMETOOLONG;
	memcpy(sun->sun_path, path, n);
	return 0;
}

int xp_unix_path_ok(const char *path)
{
	struct sockaddr_un sun;

	return unix_addr(path, &sun);
}

/* "/proc/self/fd/FD[/NAME]": the file or directory fd names, by a path that cannot be swapped. */
static int fd_path(int fd, const char *name, struct sockaddr_un *sun)
{
	char path[sizeof(sun->sun_path) + 1];
	int n = name ? snprintf(path, sizeof(path), "/proc/self/fd/%d/%s", fd, name)
		     : snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);

	if (n < 0 || n >= (int)sizeof(path))
		return -ENAMETOOLONG;
	return unix_addr(path, sun);
}

int xp_unix_listen_at(int dirfd, const char *name, int backlog, const struct xp_unix_owner *owner,
		      int *ret_fd)
{
	struct sockaddr_un sun;
	struct stat st;
	mode_t old = 0;
	int fd, r;

	if (!*name || strchr(name, '/'))
		return -EINVAL;
	r = fd_path(dirfd, name, &sun);
	if (r < 0)
		return r;
	/* Replace a stale socket (as KubeVirt does), never another kind of file, nor a link. */
	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		if (!S_ISSOCK(st.st_mode))
			return S_ISLNK(st.st_mode) ? -ELOOP : -EEXIST;
		if (unlinkat(dirfd, name, 0) < 0)
			return -errno;
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* The mode comes from the umask at bind(): no chmod on a path someone could swap. Only
	 * the control thread makes files, so the process-wide umask is safe to borrow. */
	if (owner)
		old = umask(~owner->mode & 0777);
	r = bind(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0 ? -errno : 0;
	if (owner)
		umask(old);
	if (r < 0)
		goto fail;
	/* A bound socket that does not listen yet refuses every connect: no window. A link
	 * swapped in meanwhile is changed itself, never what it points to. */
	if (owner && (owner->uid >= 0 || owner->gid >= 0) &&
	    fchownat(dirfd, name, owner->uid, owner->gid, AT_SYMLINK_NOFOLLOW) < 0) {
		r = -errno;
		goto fail_unlink;
	}
	if (listen(fd, backlog) < 0) {
		r = -errno;
		goto fail_unlink;
	}
	*ret_fd = fd;
	return 0;

fail_unlink:
	xp_unix_unlink_at(dirfd, name);
fail:
	close(fd);
	return r;
}

int xp_unix_listen(const char *path, int backlog, const struct xp_unix_owner *owner, int *ret_fd)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	const char *name;
	int dfd, r;

	r = xp_unix_path_ok(path);
	if (r < 0)
		return r;
	r = xp_path_split(path, dir, sizeof(dir), &name);
	if (r < 0)
		return r;
	/* The daemon's own path, from its configuration: links above it are its owner's. */
	dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	r = xp_unix_listen_at(dfd, name, backlog, owner, ret_fd);
	close(dfd);
	return r;
}

void xp_unix_unlink_at(int dirfd, const char *name)
{
	struct stat st;

	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISSOCK(st.st_mode))
		(void)unlinkat(dirfd, name, 0);
}

/* connect() bounded by SO_SNDTIMEO, then non-blocking. */
static int unix_connect_addr(const struct sockaddr_un *sun, unsigned int timeout_ms, int *ret_fd)
{
	struct timeval tv = { .tv_sec = timeout_ms / 1000, .tv_usec = timeout_ms % 1000 * 1000 };
	int fd, r;

	/*
	 * A unix connect completes at once unless the listener's backlog is full; then a blocking
	 * connect bounded by SO_SNDTIMEO waits for the peer's accept, which is simpler than
	 * retries.
	 */
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0 ||
	    connect(fd, (const struct sockaddr *)sun, sizeof(*sun)) < 0 ||
	    fcntl(fd, F_SETFL, O_NONBLOCK) < 0) {
		r = errno == EAGAIN || errno == EINPROGRESS ? -ETIMEDOUT : -errno;
		close(fd);
		return r;
	}
	tv.tv_sec = tv.tv_usec = 0;
	(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	*ret_fd = fd;
	return 0;
}

int xp_unix_connect(const char *path, unsigned int timeout_ms, int *ret_fd)
{
	struct sockaddr_un sun;
	int r;

	r = unix_addr(path, &sun);
	if (r < 0)
		return r;
	return unix_connect_addr(&sun, timeout_ms, ret_fd);
}

int xp_unix_connect_checked(const char *path, int owner_uid, unsigned int timeout_ms,
			    int *ret_fd)
{
	struct sockaddr_un sun;
	const char *name;
	struct stat st;
	int dfd, sfd, r;

	r = xp_unix_path_ok(path);
	if (r < 0)
		return r;
	r = xp_path_open_parent(path, &dfd, &name);
	if (r < 0)
		return r;
	/* The socket file itself, never through a link: connect() then goes to that inode. */
	sfd = openat(dfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	r = sfd < 0 ? -errno : 0;
	close(dfd);
	if (r < 0)
		return r;
	if (fstat(sfd, &st) < 0)
		r = -errno;
	else if (S_ISLNK(st.st_mode))
		r = -ELOOP;
	else if (!S_ISSOCK(st.st_mode))
		r = -ENOTSOCK;
	else if (owner_uid != XP_ANY_OWNER && st.st_uid != 0 && st.st_uid != geteuid() &&
		 (owner_uid < 0 || st.st_uid != (uid_t)owner_uid))
		r = -EPERM;
	else
		r = fd_path(sfd, NULL, &sun);
	if (r == 0)
		r = unix_connect_addr(&sun, timeout_ms, ret_fd);
	close(sfd);
	return r;
}

int xp_accept(int lfd, int *ret_fd)
{
	int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

	if (fd < 0)
		return -errno;
	*ret_fd = fd;
	return 0;
}

void xp_close_reset(int fd)
{
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };

	if (fd < 0)
		return;
	/* Fails harmlessly on unix sockets, where a close is all the peer can see. */
	(void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

int xp_tcp_liveness(int fd, unsigned int ms)
{
	int on = 1, idle = (int)(ms / 2000) ? (int)(ms / 2000) : 1, intvl = 1;
	int cnt = (int)((ms + 999) / 1000) - idle > 0 ? (int)((ms + 999) / 1000) - idle : 1;
	unsigned int uto = ms;

	if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) < 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) < 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl)) < 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt)) < 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof(uto)) < 0)
		return -errno;
	return 0;
}

int xp_tcp_adopt(int fd, struct xp_addr *bound)
{
	int v = 0;
	socklen_t vl = sizeof(v);

	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &vl) < 0)
		return -errno;
	if (!v)
		return -EINVAL;
	bound->len = sizeof(bound->ss);
	if (getsockname(fd, (struct sockaddr *)&bound->ss, &bound->len) < 0)
		return -errno;
	if (bound->ss.ss_family != AF_INET && bound->ss.ss_family != AF_INET6)
		return -EINVAL;
	return 0;
}

static int wait_fd(int fd, short events, uint64_t deadline_ms)
{
	struct pollfd p = { .fd = fd, .events = events };
	uint64_t now = vm_now_ms();
	int r;

	if (now >= deadline_ms)
		return -ETIMEDOUT;
	r = poll(&p, 1, (int)(deadline_ms - now));
	if (r < 0)
		return errno == EINTR ? 0 : -errno;
	return r == 0 ? -ETIMEDOUT : 0;
}

/* Room for XP_FDS_MAX fds in a control message, aligned as one. */
union cmsg_fds {
	char b[CMSG_SPACE(sizeof(int) * XP_FDS_MAX)];
	struct cmsghdr align;
};

int xp_send_fds(int sock, const void *buf, size_t len, const int *fds, unsigned int nfds,
		unsigned int timeout_ms)
{
	union cmsg_fds u;
	uint64_t deadline = vm_now_ms() + timeout_ms;
	size_t off = 0;
	int r;

	if (nfds > XP_FDS_MAX || len == 0)
		return -EINVAL;
	while (off < len) {
		struct iovec iov = { .iov_base = (char *)buf + off, .iov_len = len - off };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t k;

		if (off == 0 && nfds) {
			struct cmsghdr *cm;

			memset(&u, 0, sizeof(u));
			msg.msg_control = u.b;
			msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
			cm = CMSG_FIRSTHDR(&msg);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
		}
		k = sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (k > 0) {
			off += k;
			continue;
		}
		if (k < 0 && errno != EAGAIN && errno != EINTR)
			return -errno;
		r = wait_fd(sock, POLLOUT, deadline);
		if (r < 0)
			return r;
	}
	return 0;
}

/* Keeps the fds of a control message, closing what does not fit. */
static void take_fds(struct msghdr *msg, int *fds, unsigned int *nfds, unsigned int max)
{
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
		size_t n;
		int *in;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		in = (int *)CMSG_DATA(cm);
		for (size_t i = 0; i < n; i++) {
			int fd;

			memcpy(&fd, in + i, sizeof(fd));
			if (*nfds < max)
				fds[(*nfds)++] = fd;
			else
				close(fd);
		}
	}
}

ssize_t xp_recv_line_fds(int sock, char *buf, size_t len, int *fds, unsigned int *nfds,
			 unsigned int timeout_ms)
{
	union cmsg_fds u;
	uint64_t deadline = vm_now_ms() + timeout_ms;
	unsigned int max = *nfds;
	size_t off = 0;
	ssize_t r;

	*nfds = 0;
	if (len < 2)
		return -EINVAL;
	/* The fds ride on a message's first byte: read that alone, then up to the newline (a
	 * peek with SCM_RIGHTS would install the fds once per peek). */
	while (off < len - 1) {
		struct iovec iov = { .iov_base = buf + off, .iov_len = 1 };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
		char *nl;
		ssize_t k;

		if (off > 0) {
			k = recv(sock, buf + off, len - 1 - off, MSG_PEEK | MSG_DONTWAIT);
			if (k > 0) {
				nl = memchr(buf + off, '\n', k);
				iov.iov_len = nl ? (size_t)(nl - (buf + off)) + 1 : (size_t)k;
			}
		}
		msg.msg_control = u.b;
		msg.msg_controllen = sizeof(u.b);
		k = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (k > 0) {
			take_fds(&msg, fds, nfds, max);
			off += k;
			if (buf[off - 1] == '\n') {
				buf[off] = '\0';
				return (ssize_t)off;
			}
			continue;
		}
		if (k == 0) {
			r = -ECONNRESET;
			goto fail;
		}
		if (errno != EAGAIN && errno != EINTR) {
			r = -errno;
			goto fail;
		}
		r = wait_fd(sock, POLLIN, deadline);
		if (r < 0)
			goto fail;
	}
	r = -EMSGSIZE;
fail:
	for (unsigned int i = 0; i < *nfds; i++)
		close(fds[i]);
	*nfds = 0;
	return r;
}
