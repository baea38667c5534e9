// SPDX-License-Identifier: Apache-2.0
/* The real xp_io_ops: set-up I/O on sockets and OpenSSL sessions, the control thread's loop and
 * the io_uring pool behind one table. What proxy/ once did by hand with socket calls lives here;
 * the decisions (timeouts, orders, refusals) stay in proxy/. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util.h"
#include "xp_dhop.h"
#include "xp_io.h"
#include "xp_seal.h"
#include "xp_tls.h"

struct xp_io {
	struct xp_loop *loop;
	struct xp_pool_conf pool_conf;
	struct xp_tls *tls; /* NULL: plain text */
	struct xp_pool *pool;
	struct xp_watch *pool_w;
	struct xp_dhop *dhop; /* the DPDK node hop, or NULL */
	struct xp_watch *dhop_w;
};

/* One set-up connection. */
struct io_conn {
	struct xp_conn c;
	struct xp_tls_sess *tls; /* from the first handshake step on */
	bool graceful;		 /* our last words (an alert, a reply) must reach the peer */
	bool server;		 /* accepted: the TLS server */
	char peer[80];		 /* client: the target, for the session cache */
};

#define IO_CONN(xc) container_of(xc, struct io_conn, c)

static int io_watch_add(void *io, int fd, uint32_t events, xp_watch_fn fn, void *arg,
			struct xp_watch **ret)
{
	return xp_watch_add(((struct xp_io *)io)->loop, fd, events, fn, arg, ret);
}

static int io_watch_mod(void *io, struct xp_watch *w, uint32_t events)
{
	return xp_watch_mod(w, events);
}

static void io_watch_del(void *io, struct xp_watch *w)
{
	xp_watch_del(w);
}

static int io_watch_pause(void *io, struct xp_watch *w, uint64_t ms)
{
	return xp_watch_pause(w, ms);
}

static int io_timer_add(void *io, uint64_t deadline_ms, xp_timer_fn fn, void *arg,
			struct xp_timer **ret)
{
	return xp_timer_add(((struct xp_io *)io)->loop, deadline_ms, fn, arg, ret);
}

static void io_timer_del(void *io, struct xp_timer *t)
{
	xp_timer_del(t);
}

static uint64_t io_now_ms(void *io)
{
	return vm_now_ms();
}

static void pool_ready(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	xp_pool_reap(arg);
}

static void dhop_ready(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	xp_dhop_reap(arg);
}

static int io_start(void *arg, xp_link_done_fn done, void *done_arg)
{
	struct xp_io *io = arg;
	int r;

	r = xp_pool_new(&io->pool_conf, done, done_arg, &io->pool);
	if (r < 0)
		return r;
	r = xp_watch_add(io->loop, xp_pool_event_fd(io->pool), EPOLLIN, pool_ready, io->pool,
			 &io->pool_w);
	if (r < 0 || !io->dhop)
		return r;
	r = xp_dhop_start(io->dhop, done, done_arg);
	if (r < 0)
		return r;
	return xp_watch_add(io->loop, xp_dhop_event_fd(io->dhop), EPOLLIN, dhop_ready, io->dhop,
			    &io->dhop_w);
}

static void io_info(void *arg, struct xp_io_info *out)
{
	struct xp_io *io = arg;

	out->threads = io->pool ? xp_pool_threads(io->pool) : 0;
	out->tls_client_problem = io->tls ? xp_tls_client_problem(io->tls) : NULL;
	out->dpdk_ip = io->dhop ? xp_dhop_ip(io->dhop) : 0;
	out->dpdk_port = io->dhop ? xp_dhop_port(io->dhop) : 0;
	if (io->tls)
		out->data_path =
			xp_tls_ktls_enabled(io->tls) ? "io_uring+ktls" : "io_uring+openssl";
	else
		out->data_path =
			io->pool_conf.path == XP_PATH_COPY ? "io_uring+copy" : "io_uring+splice";
}

static int io_listen_tcp(void *io, const struct xp_addr *a, int *ret_fd, struct xp_addr *bound)
{
	return xp_tcp_listen(a, 1024, ret_fd, bound);
}

static int io_listen_adopt(void *io, int fd, struct xp_addr *bound)
{
	(void)io;
	return xp_tcp_adopt(fd, bound);
}

static int io_listen_unix(void *io, int dirfd, const char *name,
			  const struct xp_unix_owner *owner, int *ret_fd)
{
	return xp_unix_listen_at(dirfd, name, 128, owner, ret_fd);
}

static struct io_conn *conn_new(int fd)
{
	struct io_conn *ic = calloc(1, sizeof(*ic));

	if (ic)
		ic->c.fd = fd;
	return ic;
}

static int io_accept(void *io, int lfd, struct xp_conn **ret, char *peer, size_t peerlen)
{
	struct xp_addr a = { .len = sizeof(a.ss) };
	struct io_conn *ic;
	int fd, r;

	r = xp_accept(lfd, &fd);
	if (r < 0)
		return r;
	ic = conn_new(fd);
	if (!ic) {
		close(fd);
		return -ENOMEM;
	}
	ic->server = true;
	if (getpeername(fd, (struct sockaddr *)&a.ss, &a.len) < 0 ||
	    xp_addr_format(&a, peer, peerlen) < 0)
		snprintf(peer, peerlen, "?");
	*ret = &ic->c;
	return 0;
}

static int io_accept_local(void *io, int lfd, int *ret_fd)
{
	return xp_accept(lfd, ret_fd);
}

static int io_connect(void *io, const struct xp_addr *a, const char *peer, struct xp_conn **ret)
{
	struct io_conn *ic = conn_new(-1);
	int r;

	if (!ic)
		return -ENOMEM;
	snprintf(ic->peer, sizeof(ic->peer), "%s", peer);
	r = xp_tcp_connect(a, &ic->c.fd);
	if (r < 0) {
		free(ic);
		return r;
	}
	*ret = &ic->c;
	return r;
}

static int io_connected(void *io, struct xp_conn *c)
{
	return xp_sock_error(c->fd);
}

static int io_connect_local(void *io, const char *path, int owner_uid, unsigned int timeout_ms,
			    int *ret_fd)
{
	return xp_unix_connect_checked(path, owner_uid, timeout_ms, ret_fd);
}

static uint32_t want_events(enum xp_tls_want want, uint32_t otherwise)
{
	return want == XP_TLS_WANT_WRITE  ? EPOLLOUT
	       : want == XP_TLS_WANT_READ ? EPOLLIN
					  : otherwise;
}

static int io_handshake(void *arg, struct xp_conn *c, unsigned int flags, uint32_t *events)
{
	struct xp_io *io = arg;
	struct io_conn *ic = IO_CONN(c);
	enum xp_tls_want want = XP_TLS_WANT_NONE;
	bool server = flags & XP_HS_SERVER;
	int r;

	if (!(flags & XP_HS_TLS))
		return 0;
	if (!io->tls)
		return -ENOTSUP;
	if (!ic->tls) {
		r = xp_tls_sess_new(io->tls, c->fd, server,
				    server || (flags & XP_HS_FRESH) ? NULL : ic->peer, &ic->tls);
		if (r < 0)
			return r;
	}
	r = xp_tls_handshake(ic->tls, &want);
	if (r == -EAGAIN)
		*events = want_events(want, EPOLLIN);
	else if (r < 0)
		ic->graceful = true;
	return r;
}

static int io_await_server(void *io, struct xp_conn *c, uint32_t *events)
{
	struct io_conn *ic = IO_CONN(c);
	enum xp_tls_want want = XP_TLS_WANT_READ;
	int r;

	if (!ic->tls)
		return 0;
	r = xp_tls_await_server(ic->tls, &want);
	*events = want_events(want, EPOLLIN);
	return r;
}

static ssize_t io_read(void *io, struct xp_conn *c, void *buf, size_t len, uint32_t *events)
{
	struct io_conn *ic = IO_CONN(c);
	enum xp_tls_want want = XP_TLS_WANT_READ;
	ssize_t k;

	if (ic->tls) {
		k = xp_tls_read(ic->tls, buf, len, &want);
	} else {
		k = read(c->fd, buf, len);
		if (k < 0)
			k = errno == EINTR ? -EAGAIN : -errno;
	}
	*events = want_events(want, EPOLLIN);
	return k;
}

static ssize_t io_write(void *io, struct xp_conn *c, const void *buf, size_t len, uint32_t *events)
{
	struct io_conn *ic = IO_CONN(c);
	enum xp_tls_want want = XP_TLS_WANT_WRITE;
	ssize_t k;

	if (ic->tls) {
		k = xp_tls_write(ic->tls, buf, len, &want);
	} else {
		k = write(c->fd, buf, len);
		if (k < 0)
			k = errno == EINTR ? -EAGAIN : -errno;
	}
	/* What we wrote is an answer the peer reads after we close: a reset would drop it from
	 * the peer's receive queue when it comes first. */
	if (k > 0)
		ic->graceful = true;
	*events = want_events(want, EPOLLOUT);
	return k;
}

static void io_why(void *io, const struct xp_conn *c, int err, struct xp_conn_why *out)
{
	const struct io_conn *ic = IO_CONN(c);
	enum xp_tls_refusal why = ic->tls ? xp_tls_sess_refusal(ic->tls) : XP_TLS_OK;

	memset(out, 0, sizeof(*out));
	if (why != XP_TLS_OK) {
		out->token = xp_tls_refusal_token(why);
		out->refusal = why;
		out->closed = why == XP_TLS_CLOSED;
		out->detail = xp_tls_sess_error(ic->tls);
	} else if (ic->tls && err == -EPROTO) {
		out->detail = xp_tls_sess_io_error(ic->tls);
	}
}

static void io_conn_info(void *io, const struct xp_conn *c, struct xp_conn_info *out)
{
	const struct io_conn *ic = IO_CONN(c);
	unsigned int alpn;

	memset(out, 0, sizeof(*out));
	if (!ic->tls) {
		snprintf(out->describe, sizeof(out->describe), "tls=off");
		return;
	}
	snprintf(out->version, sizeof(out->version), "%s", xp_tls_sess_version(ic->tls));
	snprintf(out->cipher, sizeof(out->cipher), "%s", xp_tls_sess_cipher(ic->tls));
	snprintf(out->crypto, sizeof(out->crypto), "%s",
		 xp_tls_ktls_tx(ic->tls) && xp_tls_ktls_rx(ic->tls) ? "ktls"
		 : xp_tls_ktls_tx(ic->tls)			    ? "ktls-tx"
								    : "user-space");
	out->resumed = xp_tls_sess_resumed(ic->tls);
	alpn = xp_tls_sess_alpn(ic->tls);
	out->vmigd = alpn > 0;
	out->digests = alpn >= 2;
	out->resume = alpn >= 3;
	snprintf(out->describe, sizeof(out->describe), "%s", xp_tls_sess_describe(ic->tls));
	snprintf(out->peer_name, sizeof(out->peer_name), "%s", xp_tls_sess_peer_name(ic->tls));
}

/*
 * After a refused handshake the TLS alert is already written, after a reply the reply: a reset
 * would reach the peer before it read them and drop them, so end with a FIN and drain a little.
 */
static void close_gently(int fd)
{
	char buf[4096];

	(void)shutdown(fd, SHUT_WR);
	for (int i = 0; i < 16 && recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0; i++)
		;
	close(fd);
}

static void io_close(void *io, struct xp_conn *c)
{
	struct io_conn *ic;

	if (!c)
		return;
	ic = IO_CONN(c);
	xp_tls_sess_free(ic->tls);
	if (ic->graceful)
		close_gently(c->fd);
	else
		xp_close_reset(c->fd);
	free(ic);
}

static void io_close_fd(void *io, int fd, bool reset)
{
	if (reset)
		xp_close_reset(fd);
	else if (fd >= 0)
		close(fd);
}

/* Over the DPDK hop: keys from this connection's TLS session, which then goes; the TCP
 * connection stays as the link's liveness. */
static int attach_dpdk(struct xp_io *io, int local_fd, struct io_conn *ic,
		       const struct xp_link_opts *o, struct xp_link **ret)
{
	uint8_t cs[XP_SEAL_SECRET], ss[XP_SEAL_SECRET];
	struct xp_dhop_link_conf lc = {
		.local_fd = local_fd,
		.tcp_fd = ic->c.fd,
		.peer_ip = o->dpdk.ip,
		.peer_port = o->dpdk.port,
		.stream = o->dpdk.stream,
		.cookie = o->cookie,
		.bucket = { o->bucket[0], o->bucket[1] },
		.tap_ops = { o->tap_ops[0], o->tap_ops[1] },
		.tap_ctx = { o->tap_ctx[0], o->tap_ctx[1] },
		.digest = o->digest,
		.resumable = o->resume.keep > 0,
		.keep = o->resume.keep,
		.z = { .out = o->z.out, .level = o->z.level, .in = o->z.in },
	};
	int r;

	if (!io->dhop)
		return -ENOTSUP;
	if (ic->tls) {
		r = xp_seal_export(ic->tls, cs, ss);
		if (r < 0)
			return r;
		lc.tx_secret = ic->server ? ss : cs;
		lc.rx_secret = ic->server ? cs : ss;
	}
	r = xp_dhop_attach(io->dhop, &lc, ret);
	explicit_bzero(cs, sizeof(cs));
	explicit_bzero(ss, sizeof(ss));
	if (r < 0)
		return r;
	xp_tls_sess_free(ic->tls);
	free(ic);
	return 0;
}

static int io_attach(void *arg, int local_fd, struct xp_conn *c, const struct xp_link_opts *o,
		     struct xp_link **ret)
{
	struct xp_io *io = arg;
	struct io_conn *ic = c ? IO_CONN(c) : NULL;
	struct xp_link_opts lo = *o;
	int one = 1, r;

	/* a link moved here from another process: no node hop until it resumes */
	if (!c)
		return o->adopt && o->resume.keep && !o->dpdk.ip
			       ? xp_pool_attach(io->pool, local_fd, -1, &lo, ret)
			       : -EINVAL;
	if (o->dpdk.ip)
		return attach_dpdk(io, local_fd, ic, o, ret);
	/* The return path carries small messages that must not wait for Nagle. */
	(void)setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	lo.tls = ic->tls;
	r = xp_pool_attach(io->pool, local_fd, c->fd, &lo, ret);
	if (r < 0)
		return r;
	/* The pool owns the sockets and the session now, and may free it at any time. */
	free(ic);
	return 0;
}

/* A link is the DPDK hop's or the io_uring pool's: its ops (xp_link.h) know which. */
static void io_link_abort(void *arg, struct xp_link *l)
{
	xp_link_abort(l);
}

static void io_link_bytes(void *arg, const struct xp_link *l, uint64_t out[2])
{
	xp_link_bytes(l, out);
}

static uint64_t io_link_shaped_ns(void *arg, const struct xp_link *l)
{
	return xp_link_shaped_ns(l);
}

static void io_link_set_pacing(void *arg, struct xp_link *l, uint64_t rate)
{
	xp_link_set_pacing(l, rate);
}

static void io_link_suspend(void *arg, struct xp_link *l)
{
	xp_link_suspend(l);
}

static int io_link_resume(void *arg, struct xp_link *l, struct xp_conn *c, uint64_t have)
{
	struct io_conn *ic = IO_CONN(c);
	int r = xp_link_resume(l, c->fd, ic->tls, have);

	if (r < 0)
		return r;
	/* The link owns the socket and the session now. */
	free(ic);
	return 0;
}

static uint64_t io_link_kept(void *arg, const struct xp_link *l)
{
	return xp_link_kept(l);
}

static void io_link_zfig(void *arg, const struct xp_link *l, struct xp_zfig *out)
{
	xp_link_zfig(l, out);
}

static void io_link_set_zmode(void *arg, struct xp_link *l, int mode)
{
	xp_link_set_zmode(l, mode);
}

static void io_link_quiesce(void *arg, struct xp_link *l, bool on)
{
	xp_link_quiesce(l, on);
}

static int io_link_state(void *arg, const struct xp_link *l, struct xp_link_state *out)
{
	return xp_link_state(l, out);
}

static void io_link_release(void *arg, struct xp_link *l)
{
	xp_link_release(l);
}

static void io_link_range(void *arg, const struct xp_link *l, uint64_t *acked, uint64_t *sent)
{
	xp_link_range(l, acked, sent);
}

static int io_hop_stats(void *arg, struct xp_hop_stats *out)
{
	struct xp_io *io = arg;

	if (!io->dhop)
		return -ENOENT;
	xp_dhop_stats(io->dhop, out);
	return 0;
}

static int io_hop_health(void *arg, struct xp_hop_health *out)
{
	struct xp_io *io = arg;

	if (!io->dhop)
		return -ENOENT;
	return xp_dhop_health(io->dhop, out);
}

const struct xp_io_ops xp_io_ops = {
	.watch_add = io_watch_add,
	.watch_mod = io_watch_mod,
	.watch_del = io_watch_del,
	.watch_pause = io_watch_pause,
	.timer_add = io_timer_add,
	.timer_del = io_timer_del,
	.now_ms = io_now_ms,
	.start = io_start,
	.info = io_info,
	.hop_stats = io_hop_stats,
	.hop_health = io_hop_health,
	.listen_tcp = io_listen_tcp,
	.listen_unix = io_listen_unix,
	.listen_adopt = io_listen_adopt,
	.accept = io_accept,
	.accept_local = io_accept_local,
	.connect = io_connect,
	.connected = io_connected,
	.connect_local = io_connect_local,
	.handshake = io_handshake,
	.await_server = io_await_server,
	.read = io_read,
	.write = io_write,
	.why = io_why,
	.conn_info = io_conn_info,
	.close = io_close,
	.close_fd = io_close_fd,
	.attach = io_attach,
	.link_abort = io_link_abort,
	.link_bytes = io_link_bytes,
	.link_shaped_ns = io_link_shaped_ns,
	.link_set_pacing = io_link_set_pacing,
	.link_suspend = io_link_suspend,
	.link_resume = io_link_resume,
	.link_kept = io_link_kept,
	.link_zfig = io_link_zfig,
	.link_set_zmode = io_link_set_zmode,
	.link_range = io_link_range,
	.link_quiesce = io_link_quiesce,
	.link_state = io_link_state,
	.link_release = io_link_release,
};

int xp_io_new(struct xp_loop *loop, const struct xp_pool_conf *pool, struct xp_tls *tls,
	      struct xp_dhop *hop, struct xp_io **ret)
{
	struct xp_io *io = calloc(1, sizeof(*io));

	if (!io)
		return -ENOMEM;
	io->loop = loop;
	io->pool_conf = *pool;
	io->tls = tls;
	io->dhop = hop;
	*ret = io;
	return 0;
}

void xp_io_stop(struct xp_io *io)
{
	xp_watch_del(io->pool_w);
	io->pool_w = NULL;
	xp_pool_free(io->pool);
	io->pool = NULL;
	xp_watch_del(io->dhop_w);
	io->dhop_w = NULL;
	xp_dhop_stop(io->dhop);
}

void xp_io_free(struct xp_io *io)
{
	if (!io)
		return;
	xp_io_stop(io);
	xp_dhop_free(io->dhop);
	free(io);
}
