/* SPDX-License-Identifier: Apache-2.0 */
/* Socket helpers for the node hop (TCP) and the local side (unix): parse and format addresses,
 * listen, and start non-blocking connects. Every fd returned is non-blocking and close-on-exec. */
#ifndef XP_SOCK_H
#define XP_SOCK_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

struct xp_addr {
	struct sockaddr_storage ss;
	socklen_t len;
};

/* "1.2.3.4:80", "[::1]:80", "host:80" (numeric only); port 0 allowed when allow_zero. */
int xp_addr_parse(const char *s, int allow_zero_port, struct xp_addr *ret);
/* Host part only ("1.2.3.4", "::1"), port taken from port. */
int xp_addr_from_host(const char *host, unsigned int port, struct xp_addr *ret);
/* "1.2.3.4:80" or "[::1]:80". */
int xp_addr_format(const struct xp_addr *a, char *buf, size_t len);
int xp_addr_host(const struct xp_addr *a, char *buf, size_t len);
unsigned int xp_addr_port(const struct xp_addr *a);
void xp_addr_set_port(struct xp_addr *a, unsigned int port);
int xp_addr_is_wildcard(const struct xp_addr *a);
/* First global IPv4 (else IPv6) address of this host/namespace, for --advertise's default. */
int xp_addr_guess_public(char *buf, size_t len);

/* Whether this host (network namespace) has IPv6: a "[::]" listener would work. */
int xp_ipv6_available(void);
/* Binds and listens; *bound gets the address the kernel chose (port 0 → a free port). An IPv6
 * wildcard ("[::]") listens dual stack, IPv4 too. */
int xp_tcp_listen(const struct xp_addr *a, int backlog, int *ret_fd, struct xp_addr *bound);
/* Returns 0 when connected at once, 1 when in progress (wait for EPOLLOUT, then xp_sock_error). */
int xp_tcp_connect(const struct xp_addr *a, int *ret_fd);
int xp_sock_error(int fd);

/* Who may connect to a unix listener: its owner and mode, whatever the process's umask. */
struct xp_unix_owner {
	int uid, gid; /* -1: leave as created */
	unsigned int mode;
};

/*
 * -ENAMETOOLONG when path does not fit sun_path. An existing socket file at path is replaced.
 * With owner, the socket file gets its owner and mode before it listens, so no one else can
 * connect in between.
 */
int xp_unix_listen(const char *path, int backlog, const struct xp_unix_owner *owner, int *ret_fd);
/*
 * The same for name in the directory dirfd, where others may write (xp_path.h): a link or
 * another file there is refused (-ELOOP, -EEXIST), the mode comes from the umask at bind()
 * and the owner is set without following a link swapped in.
 */
int xp_unix_listen_at(int dirfd, const char *name, int backlog, const struct xp_unix_owner *owner,
		      int *ret_fd);
/* Removes name in dirfd if it is a socket (never another file, nor through a link). */
void xp_unix_unlink_at(int dirfd, const char *name);
/* Connects to a listening unix socket, waiting up to timeout_ms for room in its backlog. The fd
 * returned is non-blocking. For the daemon's own paths. */
int xp_unix_connect(const char *path, unsigned int timeout_ms, int *ret_fd);
/*
 * The same for a socket in a directory others may write: path resolves as xp_path_open_dir()
 * says, its last component must be a socket (a link: -ELOOP; another file: -ENOTSOCK) owned by
 * root, this process's user or owner_uid (-1: none), else -EPERM; the connect goes to that
 * very inode.
 */
int xp_unix_connect_checked(const char *path, int owner_uid, unsigned int timeout_ms,
			    int *ret_fd);
/* owner_uid for a socket whose owner is not known in advance: links still refused. */
#define XP_ANY_OWNER (-2)
int xp_unix_path_ok(const char *path);

int xp_accept(int lfd, int *ret_fd);
/* Whether an accept failed for want of fds or memory: the listener stays readable, so its
 * caller should rest it (xp_watch_pause) rather than try again at once. */
static inline bool xp_accept_starved(int r)
{
	return r == -EMFILE || r == -ENFILE || r == -ENOBUFS || r == -ENOMEM;
}
/* A listening TCP socket handed in (vmigd --takeover): *bound gets its address. -ENOTSOCK,
 * -EINVAL when fd is not one. */
int xp_tcp_adopt(int fd, struct xp_addr *bound);

/* At most this many fds go with one message over a unix socket. */
#define XP_FDS_MAX 64
/*
 * Sends len bytes over a unix stream socket, with nfds fds (SCM_RIGHTS) on the first byte;
 * blocks until all is written or timeout_ms passes. 0 or -errno.
 */
int xp_send_fds(int sock, const void *buf, size_t len, const int *fds, unsigned int nfds,
		unsigned int timeout_ms);
/*
 * Reads one line (up to and with '\n', NUL-terminated in buf) from a unix stream socket, and
 * the fds that came with it, waiting up to timeout_ms in all. The fds are close-on-exec and
 * the caller's, also on failure, where they are closed. Returns the line's length or -errno
 * (-EMSGSIZE: no newline within len - 1 bytes; -ECONNRESET: the end of stream first).
 */
ssize_t xp_recv_line_fds(int sock, char *buf, size_t len, int *fds, unsigned int *nfds,
			 unsigned int timeout_ms);

/* Close so that the peer sees a reset, not a clean end of stream. */
void xp_close_reset(int fd);
/*
 * A TCP connection that answers nothing for about ms fails (ETIMEDOUT) instead of waiting for
 * TCP's own patience (minutes): TCP_USER_TIMEOUT for data not acknowledged, and keepalive probes
 * from ms/2 of silence, one a second, for an idle one. 0, or -errno.
 */
int xp_tcp_liveness(int fd, unsigned int ms);

#endif
