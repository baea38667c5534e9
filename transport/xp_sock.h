/* SPDX-License-Identifier: Apache-2.0 */
/* Socket helpers for the node hop (TCP) and the local side (unix): parse and format addresses,
 * listen, and start non-blocking connects. Every fd returned is non-blocking and close-on-exec. */
#ifndef XP_SOCK_H
#define XP_SOCK_H

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
int xp_addr_is_wildcard(const struct xp_addr *a);
/* First global IPv4 (else IPv6) address of this host/namespace, for --advertise's default. */
int xp_addr_guess_public(char *buf, size_t len);

/* Binds and listens; *bound gets the address the kernel chose (port 0 → a free port). */
int xp_tcp_listen(const struct xp_addr *a, int backlog, int *ret_fd, struct xp_addr *bound);
/* Returns 0 when connected at once, 1 when in progress (wait for EPOLLOUT, then xp_sock_error). */
int xp_tcp_connect(const struct xp_addr *a, int *ret_fd);
int xp_sock_error(int fd);

/* -ENAMETOOLONG when path does not fit sun_path. An existing socket file at path is replaced. */
int xp_unix_listen(const char *path, int backlog, int *ret_fd);
/* Connects to a listening unix socket, waiting up to timeout_ms for room in its backlog. The fd
 * returned is non-blocking. */
int xp_unix_connect(const char *path, unsigned int timeout_ms, int *ret_fd);
int xp_unix_path_ok(const char *path);

int xp_accept(int lfd, int *ret_fd);
/* Close so that the peer sees a reset, not a clean end of stream. */
void xp_close_reset(int fd);

#endif
