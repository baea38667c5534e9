// SPDX-License-Identifier: Apache-2.0
/* The daemon's DPDK node hop (xp_dhop.h): one thread owns the port and the sessions; the control
 * thread hands it links through a slot table under a mutex and reaps ended ones through an
 * eventfd. Each link is an xp_hop peer of its own, keyed from its own TLS session. Its liveness,
 * and its falling back to the kernel path, are xp_dhop_live.c's. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "xp_bucket.h"
#include "xp_dhop_priv.h"
#include "xp_dpdk_port.h"

static void dhop_link_abort(struct xp_link *xl)
{
	atomic_store(&DHOP_LINK(xl)->abort, true);
}

static void dhop_link_suspend(struct xp_link *xl)
{
	atomic_store(&DHOP_LINK(xl)->suspend, true);
}

static uint64_t dhop_link_shaped_ns(const struct xp_link *xl)
{
	return atomic_load_explicit(&CONST_DHOP_LINK(xl)->shaped_ns, memory_order_relaxed);
}

static void dhop_link_bytes(const struct xp_link *xl, uint64_t out[2])
{
	const struct dhop_link *l = CONST_DHOP_LINK(xl);

	out[0] = atomic_load_explicit(&l->bytes[0], memory_order_relaxed);
	out[1] = atomic_load_explicit(&l->bytes[1], memory_order_relaxed);
}

/* What a peer that resumes the link may have of what it sent: at least what it acknowledged
 * (as of the thread's last round), at most what was read from the local socket. */
static void dhop_link_range(const struct xp_link *xl, uint64_t *acked, uint64_t *sent)
{
	const struct dhop_link *l = CONST_DHOP_LINK(xl);

	*acked = atomic_load_explicit(&l->acked, memory_order_relaxed);
	*sent = atomic_load_explicit(&l->bytes[0], memory_order_relaxed);
}

/* The hop paces itself (xp_rel's window), not through the kernel's socket pacing. */
static void dhop_link_set_pacing(struct xp_link *xl, uint64_t rate)
{
}

static void dhop_link_zfig(const struct xp_link *xl, struct xp_zfig *out)
{
	xp_dhop_z_fig(CONST_DHOP_LINK(xl), out);
}

static void dhop_link_set_zmode(struct xp_link *xl, int mode)
{
	xp_dhop_z_set_mode(DHOP_LINK(xl), mode);
}

static const struct xp_link_ops dhop_link_ops = {
	.abort = dhop_link_abort,
	.bytes = dhop_link_bytes,
	.shaped_ns = dhop_link_shaped_ns,
	.set_pacing = dhop_link_set_pacing,
	.suspend = dhop_link_suspend,
	.range = dhop_link_range,
	.zfig = dhop_link_zfig,
	.set_zmode = dhop_link_set_zmode,
};

int xp_dhop_new(const struct xp_dhop_conf *conf, struct xp_dhop **ret, char *err, size_t errlen)
{
	struct xp_dpdk_conf pc = { .eal = conf->eal,
				   .address = conf->address,
				   .udp_port = conf->udp_port };
	struct xp_hop_conf hc = { .ops = &xp_dpdk_port_ops, .max_streams = 1 };
	struct xp_dhop *d;
	cpu_set_t cpus;
	size_t payload;
	int r;

	err[0] = '\0';
	if (!conf->max_links || !conf->udp_port || conf->link_buffer < 65536) {
		snprintf(err, errlen, "bad DPDK hop settings");
		return -EINVAL;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->conf = *conf;
	d->efd = d->epfd = -1;
	pthread_mutex_init(&d->mu, NULL);
	r = -ENOMEM;
	d->links = calloc(conf->max_links, sizeof(*d->links));
	if (!d->links)
		goto fail;
	d->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	d->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (d->efd < 0 || d->epfd < 0) {
		r = -errno;
		goto fail;
	}
	/* EAL pins the calling thread to its main lcore, and every thread started later would
	 * inherit that: the control thread and the io_uring workers keep the CPUs they had. */
	sched_getaffinity(0, sizeof(cpus), &cpus);
	r = xp_dpdk_open(&pc, &d->port, err, errlen);
	sched_setaffinity(0, sizeof(cpus), &cpus);
	if (r < 0)
		goto fail;
	d->ip = xp_dpdk_ip(d->port);
	payload = xp_dpdk_max_payload(d->port);
	/* a frame is header, SACK blocks, payload and tag; whole 8-byte words of payload */
	hc.mss = (uint32_t)((payload - XP_REL_MAX_HDR - XP_SEAL_TAG) & ~(size_t)7);
	hc.port = d->port;
	if (conf->wrap) {
		r = conf->wrap->wrap(conf->wrap->arg, hc.ops, d->port, &hc.ops, &d->wrapped);
		if (r < 0) {
			snprintf(err, errlen, "DPDK hop port: %s", strerror(-r));
			goto fail;
		}
		hc.port = d->wrapped;
	}
	hc.max_peers = conf->max_links;
	r = xp_hop_new(&hc, &d->hop);
	if (r < 0) {
		snprintf(err, errlen, "DPDK hop sessions: %s", strerror(-r));
		goto fail;
	}
	for (unsigned int i = 0; i < conf->max_links; i++) {
		d->links[i].base.ops = &dhop_link_ops;
		d->links[i].d = d;
	}
	/* the first look, before the thread: health is never unset */
	xp_dhop_port_tend(d, vm_now_ns() / 1000);
	*ret = d;
	return 0;
fail:
	xp_dhop_free(d);
	return r;
}

int xp_dhop_event_fd(const struct xp_dhop *d)
{
	return d->efd;
}

uint32_t xp_dhop_ip(const struct xp_dhop *d)
{
	return d->ip;
}

uint16_t xp_dhop_port(const struct xp_dhop *d)
{
	return d->conf.udp_port;
}

static void stats_add(struct xp_hop_peer_stats *to, const struct xp_hop_peer_stats *s)
{
	to->frames_in += s->frames_in;
	to->frames_out += s->frames_out;
	to->port_busy += s->port_busy;
	to->forged += s->forged;
	to->replayed += s->replayed;
	to->too_old += s->too_old;
	to->malformed += s->malformed;
	to->unknown_stream += s->unknown_stream;
	to->retransmitted_frames += s->retransmitted_frames;
	to->timeouts += s->timeouts;
	to->fast_recoveries += s->fast_recoveries;
}

void xp_dhop_stats(const struct xp_dhop *d, struct xp_hop_stats *st)
{
	struct xp_hop_peer_stats ps = { 0 };
	struct xp_dpdk_stats ds;

	pthread_mutex_lock((pthread_mutex_t *)&d->mu);
	stats_add(&ps, &d->gone);
	stats_add(&ps, &d->live);
	st->unknown_peer = d->unknown_peer;
	st->link_up = d->health.link_up;
	st->link_restarts = d->link_restarts;
	st->unreachable_peers = d->health.npeers;
	pthread_mutex_unlock((pthread_mutex_t *)&d->mu);
	xp_dpdk_stats(d->port, &ds);
	st->rx_frames = ds.rx_frames;
	st->tx_frames = ds.tx_frames;
	st->tx_bursts = ds.tx_bursts;
	st->arp_learned = ds.arp_learned;
	st->retransmitted_frames = ps.retransmitted_frames;
	st->timeouts = ps.timeouts;
	st->fast_recoveries = ps.fast_recoveries;
	st->forged = ps.forged;
	st->replayed = ps.replayed;
	st->too_old = ps.too_old;
	st->malformed = ps.malformed;
	st->unknown_stream = ps.unknown_stream;
	st->polls = atomic_load(&d->polls);
	st->sleeps = atomic_load(&d->sleeps);
	st->dropped_by_test = st->duplicated_by_test = st->reordered_by_test = 0;
	if (d->wrapped)
		d->conf.wrap->stats(d->conf.wrap->arg, d->wrapped, st);
}

int xp_dhop_attach(struct xp_dhop *d, const struct xp_dhop_link_conf *c, struct xp_link **ret)
{
	struct dhop_link *l = NULL;
	struct vm_digest *dg[2] = { NULL, NULL };
	struct dhop_z *z = NULL;
	int r = 0;

	if (!c->stream || !c->peer_ip || !c->tx_secret != !c->rx_secret)
		return -EINVAL;
	if (fcntl(c->local_fd, F_SETFL, fcntl(c->local_fd, F_GETFL) | O_NONBLOCK) < 0)
		return -errno;
	r = xp_dhop_z_new(c, &z);
	if (r < 0)
		return r;
	if (c->digest && (!(dg[0] = vm_digest_new()) || !(dg[1] = vm_digest_new()))) {
		r = -ENOMEM;
		goto out;
	}
	pthread_mutex_lock(&d->mu);
	for (unsigned int i = 0; i < d->conf.max_links && r == 0; i++) {
		struct dhop_link *x = &d->links[i];

		if (x->st == S_FREE && !l)
			l = x;
		else if (x->st != S_FREE && x->c.peer_ip == c->peer_ip && x->c.stream == c->stream)
			r = -EEXIST;
	}
	if (!r && !l)
		r = -EBUSY;
	if (!r) {
		memset(&l->st, 0, sizeof(*l) - offsetof(struct dhop_link, st)); /* keeps base, d */
		l->c = *c;
		l->sealed = c->tx_secret != NULL;
		if (l->sealed) {
			memcpy(l->tx, c->tx_secret, XP_SEAL_SECRET);
			memcpy(l->rx, c->rx_secret, XP_SEAL_SECRET);
		}
		l->c.tx_secret = l->c.rx_secret = NULL;
		l->dg[0] = dg[0];
		l->dg[1] = dg[1];
		dg[0] = dg[1] = NULL;
		l->z = z;
		z = NULL;
		l->st = S_NEW;
		*ret = &l->base;
		atomic_store(&d->new_links, true);
	}
	pthread_mutex_unlock(&d->mu);
out:
	xp_dhop_z_free(z);
	vm_digest_free(dg[0]);
	vm_digest_free(dg[1]);
	return r;
}

/* The thread: a new link becomes a peer with one stream, and its sockets join the epoll set. */
static void link_begin(struct xp_dhop *d, struct dhop_link *l, uint64_t now)
{
	struct xp_hop_peer_conf pc = {
		.ip = l->c.peer_ip,
		.udp_port = l->c.peer_port,
		.tx_secret = l->sealed ? l->tx : NULL,
		.rx_secret = l->sealed ? l->rx : NULL,
		.budget = d->conf.link_buffer,
		.first_stream = l->c.stream,
	};
	uint64_t slot = (uint64_t)(l - d->links);
	struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
				  .data.u64 = slot << 1 };
	struct epoll_event tev = { .events = EPOLLIN | EPOLLRDHUP | EPOLLET,
				   .data.u64 = slot << 1 | 1 };
	int r;

	l->begun_us = l->last_heard_us = now;
	l->live = l->in_ready = l->out_ready = l->tcp_ready = true;
	r = xp_hop_peer_add(d->hop, &pc, &l->peer);
	if (!r)
		r = xp_hop_stream_open(l->peer, l->c.stream, now, &l->rel);
	if (!r && xp_dhop_z_out(l))
		xp_rel_hold(l->rel); /* chunks go only whole: xp_dhop_z_release() */
	explicit_bzero(l->tx, sizeof(l->tx));
	explicit_bzero(l->rx, sizeof(l->rx));
	if (!r && (epoll_ctl(d->epfd, EPOLL_CTL_ADD, l->c.local_fd, &ev) < 0 ||
		   epoll_ctl(d->epfd, EPOLL_CTL_ADD, l->c.tcp_fd, &tev) < 0))
		r = -errno;
	if (r) {
		l->res.end = XP_END_ERROR;
		l->res.err = r;
		l->res.err_side = 1;
		snprintf(l->res.detail, sizeof(l->res.detail), "DPDK hop: cannot open the stream");
	}
}

/* Shows the first n bytes of iov to direction dir's tap. */
void xp_dhop_tap_feed(struct dhop_link *l, unsigned int dir, const struct iovec iov[2], size_t n)
{
	size_t a = n < iov[0].iov_len ? n : iov[0].iov_len;

	if (!l->c.tap_ops[dir])
		return;
	l->c.tap_ops[dir]->feed(l->c.tap_ctx[dir], iov[0].iov_base, a);
	if (n > a)
		l->c.tap_ops[dir]->feed(l->c.tap_ctx[dir], iov[1].iov_base, n - a);
}

/* The first n bytes of iov into direction dir's digest, if it keeps one. */
void xp_dhop_digest_feed(struct dhop_link *l, unsigned int dir, const struct iovec iov[2], size_t n)
{
	size_t a = n < iov[0].iov_len ? n : iov[0].iov_len;

	if (!l->dg[dir])
		return;
	vm_digest_update(l->dg[dir], iov[0].iov_base, a);
	if (n > a)
		vm_digest_update(l->dg[dir], iov[1].iov_base, n - a);
}

/* How much of room the caps let the local socket's bytes have now (room when not capped). */
size_t xp_dhop_shape(struct dhop_link *l, size_t room)
{
	uint64_t now, wait = 0;
	size_t grant;

	if (!l->c.bucket[0] && !l->c.bucket[1])
		return room;
	now = vm_now_ns();
	if (now < l->held_until_ns)
		return 0;
	grant = xp_bucket_take(l->c.bucket, room, now, &wait);
	if (!grant) {
		l->held_until_ns = now + wait;
		atomic_fetch_add_explicit(&l->shaped_ns, wait, memory_order_relaxed);
	}
	return grant;
}

/* The TCP connection is the link's liveness: its end or error, and anything on it is drained. */
static void tcp_check(struct dhop_link *l)
{
	char buf[512];
	ssize_t k;

	if (!l->tcp_ready)
		return;
	l->tcp_ready = false;
	while ((k = recv(l->c.tcp_fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
		;
	if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
		l->tcp_gone = true;
}

void xp_dhop_read_none(struct dhop_link *l, ssize_t k)
{
	if (k == 0 || errno == ECONNRESET) {
		/*
		 * A reset is QEMU closing with bytes of ours unread: its end of stream, as on the
		 * kernel path (its destination ends multifd channels so).
		 */
		l->res.reset_after_eof |= k < 0;
		l->local_in_done = true;
		xp_rel_shutdown(l->rel);
	} else if (errno == EAGAIN || errno == EWOULDBLOCK) {
		l->in_ready = false;
	} else if (errno != EINTR) {
		xp_dhop_link_fail(l, -errno, 0, "%s", "");
	}
}

bool xp_dhop_write_none(struct dhop_link *l, ssize_t k)
{
	if (k < 0 && (errno == EPIPE || errno == ECONNRESET) && l->local_in_done) {
		/* QEMU closed after sending us everything: what it did not read, it did not want
		 * (the kernel path's rule too) */
		l->drop_rx = true;
		return true;
	}
	if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		l->out_ready = false;
	else if (k < 0 && errno != EINTR && l->falling)
		xp_dhop_fall_broken(l, -errno);
	else if (k < 0 && errno != EINTR)
		xp_dhop_link_fail(l, -errno, 0, "%s", "");
	return false;
}

/* The local socket's bytes into the stream as they are; returns bytes moved. */
static size_t plain_send(struct dhop_link *l)
{
	struct iovec iov[2];
	size_t moved = 0, room;
	ssize_t k;

	while (l->in_ready && !l->local_in_done && !l->falling &&
	       (room = xp_rel_write_space(l->rel, iov)) > 0) {
		size_t grant = xp_dhop_shape(l, room);

		if (!grant)
			break;
		if (grant < iov[0].iov_len) {
			iov[0].iov_len = grant;
			iov[1].iov_len = 0;
		} else {
			iov[1].iov_len = grant - iov[0].iov_len;
		}
		k = readv(l->c.local_fd, iov, iov[1].iov_len ? 2 : 1);
		if (grant != room)
			xp_bucket_refund(l->c.bucket, grant - (k > 0 ? (size_t)k : 0));
		room = grant;
		if (k > 0) {
			xp_rel_write_commit(l->rel, (size_t)k);
			xp_dhop_tap_feed(l, 0, iov, (size_t)k);
			xp_dhop_digest_feed(l, 0, iov, (size_t)k);
			atomic_fetch_add_explicit(&l->bytes[0], (uint64_t)k, memory_order_relaxed);
			moved += (size_t)k;
			if ((size_t)k < room)
				break;
			continue;
		}
		xp_dhop_read_none(l, k);
		break;
	}
	return moved;
}

/* The stream's in-order bytes to the local socket as they are; returns bytes moved. */
static size_t plain_recv(struct dhop_link *l)
{
	struct iovec iov[2];
	size_t moved = 0, room;
	ssize_t k;

	while (!l->local_out_done && (room = xp_rel_read_space(l->rel, iov)) > 0) {
		/* QEMU gets its bytes in batches, not a frame at a time: once there are
		 * WRITE_BATCH of them, or when none came since the last look */
		if (room < WRITE_BATCH && room != l->last_avail && !l->drop_rx && !l->falling) {
			l->last_avail = room;
			break;
		}
		l->last_avail = 0;
		if (l->drop_rx) {
			xp_dhop_digest_feed(l, 1, iov, room);
			l->res.undelivered += room;
			xp_rel_read_commit(l->rel, room);
			continue;
		}
		if (!l->out_ready)
			break;
		k = writev(l->c.local_fd, iov, iov[1].iov_len ? 2 : 1);
		if (k > 0) {
			xp_dhop_tap_feed(l, 1, iov, (size_t)k);
			xp_dhop_digest_feed(l, 1, iov, (size_t)k);
			xp_rel_read_commit(l->rel, (size_t)k);
			atomic_fetch_add_explicit(&l->bytes[1], (uint64_t)k, memory_order_relaxed);
			moved += (size_t)k;
			continue;
		}
		if (xp_dhop_write_none(l, k))
			continue;
		break;
	}
	return moved;
}

/* Moves what it can between the local socket and the stream; returns bytes moved. */
static size_t link_io(struct dhop_link *l)
{
	size_t moved = xp_dhop_z_out(l) ? xp_dhop_z_send(l) : plain_send(l);

	moved += xp_dhop_z_in(l) ? xp_dhop_z_recv(l) : plain_recv(l);
	if (!l->local_out_done && xp_rel_eof(l->rel) && xp_dhop_z_drained(l)) {
		if (!xp_dhop_z_eof(l)) {
			xp_dhop_link_fail(l, -EBADMSG, 1, "the peer's stream ended inside a chunk");
			return moved;
		}
		if (!l->drop_rx)
			shutdown(l->c.local_fd, SHUT_WR);
		l->local_out_done = true;
	}
	return moved;
}

/*
 * The figures status reads: the live links' summed now, and ended's (a link that just ended)
 * moved to the ended ones' in the same step, so that a counter never goes back.
 */
static void refresh_live(struct xp_dhop *d, const struct xp_hop_peer_stats *ended)
{
	struct xp_hop_peer_stats sum = { 0 }, ps;

	for (unsigned int i = 0; i < d->hw; i++)
		if (d->links[i].live && d->links[i].peer) {
			xp_hop_peer_stats(d->links[i].peer, &ps);
			stats_add(&sum, &ps);
		}
	pthread_mutex_lock(&d->mu);
	if (ended)
		stats_add(&d->gone, ended);
	d->live = sum;
	d->unknown_peer = xp_hop_unknown_peer(d->hop);
	pthread_mutex_unlock(&d->mu);
}

static void link_end(struct xp_dhop *d, struct dhop_link *l)
{
	struct xp_hop_peer_stats ps;

	bool fell = l->res.end == XP_END_FALLBACK;

	dhop_link_bytes(&l->base, l->res.bytes);
	xp_dhop_z_fig(l, &l->res.z);
	l->res.shaped_ns = dhop_link_shaped_ns(&l->base);
	for (unsigned int i = 0; i < 2; i++) {
		if (fell) {
			vm_digest_free(l->dg[i]); /* its state is in fb */
			l->dg[i] = NULL;
		} else {
			xp_link_result_digest(&l->res, i, &l->dg[i]);
		}
	}
	epoll_ctl(d->epfd, EPOLL_CTL_DEL, l->c.local_fd, NULL);
	epoll_ctl(d->epfd, EPOLL_CTL_DEL, l->c.tcp_fd, NULL);
	if (l->res.end != XP_END_CLEAN)
		/* a reset, so that QEMU and the peer see an error, not an end of stream (a peer
		 * that resumes falls back on it too) */
		setsockopt(l->c.tcp_fd, SOL_SOCKET, SO_LINGER,
			   &(struct linger){ .l_onoff = 1, .l_linger = 0 }, sizeof(struct linger));
	if (!fell)
		close(l->c.local_fd); /* else the done callback's */
	close(l->c.tcp_fd);
	memset(&ps, 0, sizeof(ps));
	if (l->peer) {
		xp_hop_peer_stats(l->peer, &ps);
		xp_hop_peer_remove(d->hop, l->peer);
		l->peer = NULL;
		l->rel = NULL;
	}
	l->live = false;
	while (d->hw && !d->links[d->hw - 1].live)
		d->hw--;
	refresh_live(d, &ps);
	pthread_mutex_lock(&d->mu);
	l->st = S_ENDED;
	pthread_mutex_unlock(&d->mu);
	eventfd_write(d->efd, 1);
}

/* Takes what epoll has on the sockets, waiting up to ns for it (0: not at all). */
static void readiness(struct xp_dhop *d, uint64_t ns)
{
	struct epoll_event ev[64];
	struct timespec ts = { (time_t)(ns / 1000000000), (long)(ns % 1000000000) };
	int n = epoll_pwait2(d->epfd, ev, 64, &ts, NULL);

	if (ns)
		atomic_fetch_add_explicit(&d->sleeps, 1, memory_order_relaxed);
	for (int i = 0; i < n; i++) {
		struct dhop_link *l = &d->links[ev[i].data.u64 >> 1];

		if (ev[i].data.u64 & 1) {
			l->tcp_ready = true;
			continue;
		}
		/* an error or hang-up: both ways try, and say what it is */
		if (ev[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
			l->in_ready = true;
		if (ev[i].events & (EPOLLOUT | EPOLLHUP | EPOLLERR))
			l->out_ready = true;
	}
}

/* Links attached since the last look become the thread's. */
static void take_new(struct xp_dhop *d, uint64_t now)
{
	if (!atomic_exchange(&d->new_links, false))
		return;
	for (unsigned int i = 0; i < d->conf.max_links; i++) {
		struct dhop_link *l = &d->links[i];
		bool is_new;

		pthread_mutex_lock(&d->mu);
		is_new = l->st == S_NEW;
		if (is_new)
			l->st = S_LIVE;
		pthread_mutex_unlock(&d->mu);
		if (is_new) {
			link_begin(d, l, now);
			d->hw = i + 1 > d->hw ? i + 1 : d->hw;
		}
	}
}

/* Every 100 ms: the share of them the thread moved nothing, for auto compression. */
static void idle_window(struct xp_dhop *d, uint64_t now)
{
	uint64_t span = now - d->win_start_ns;

	if (span < 100 * 1000000ull)
		return;
	atomic_store_explicit(&d->idle_pct, (unsigned int)(d->win_idle_ns * 100 / span),
			      memory_order_relaxed);
	d->win_start_ns = now;
	d->win_idle_ns = 0;
}

static void *dhop_thread(void *arg)
{
	struct xp_dhop *d = arg;
	uint64_t idle = 0, last_refresh = 0, last_t0 = 0;
	bool spare = false;

	/* without an lcore id, every packet buffer comes from the pool's shared ring */
	xp_dpdk_thread_register();
	d->win_start_ns = vm_now_ns();
	atomic_store(&d->idle_pct, 100); /* until its first 100 ms are measured */
	while (!atomic_load(&d->stop)) {
		uint64_t t0 = vm_now_ns(), now = t0 / 1000, deadline;
		unsigned int live = 0;
		size_t moved = 0;

		/* a round that moved nothing, and the sleep after it, were time to spare */
		if (spare)
			d->win_idle_ns += t0 - last_t0;
		last_t0 = t0;
		spare = false;
		idle_window(d, t0);

		atomic_fetch_add_explicit(&d->polls, 1, memory_order_relaxed);
		take_new(d, now);
		xp_dhop_port_tend(d, now);
		readiness(d, 0);
		for (unsigned int i = 0; i < d->hw; i++) {
			struct dhop_link *l = &d->links[i];

			if (!l->live)
				continue;
			if (l->rel) {
				struct iovec iov[2];
				uint64_t sent;

				tcp_check(l);
				moved += link_io(l);
				if (xp_dhop_z_out(l)) {
					xp_dhop_z_release(l);
				} else {
					sent = atomic_load_explicit(&l->bytes[0],
								    memory_order_relaxed);
					atomic_store_explicit(&l->acked,
							      sent - xp_rel_unacked(l->rel, iov),
							      memory_order_relaxed);
				}
			}
			if (xp_dhop_link_ended(d, l, now)) {
				link_end(d, l);
				continue;
			}
			live++;
		}
		moved += (size_t)xp_hop_step(d->hop, now);
		if (now - last_refresh > 100000) {
			refresh_live(d, NULL);
			last_refresh = now;
		}
		if (moved) {
			idle = 0;
			continue;
		}
		spare = true;
		if (!live) {
			/* ARP for the next link's peer still gets an answer within this */
			readiness(d, SLEEP_NOLINK_NS);
			continue;
		}
		if (++idle <= IDLE_ROUNDS)
			continue;
		deadline = xp_hop_deadline(d->hop);
		if (deadline > now + SLEEP_SHORT_NS / 1000) {
			uint64_t ns = idle > IDLE_LONG ? SLEEP_LONG_NS : SLEEP_SHORT_NS;

			if (deadline != UINT64_MAX && (deadline - now) * 1000 < ns)
				ns = (deadline - now) * 1000;
			readiness(d, ns);
		}
	}
	return NULL;
}

int xp_dhop_start(struct xp_dhop *d, xp_link_done_fn done, void *arg)
{
	int r;

	d->done = done;
	d->done_arg = arg;
	r = pthread_create(&d->thread, NULL, dhop_thread, d);
	if (r)
		return -r;
	pthread_setname_np(d->thread, "vmigd-dpdk");
	d->running = true;
	return 0;
}

void xp_dhop_reap(struct xp_dhop *d)
{
	eventfd_t v;

	eventfd_read(d->efd, &v);
	for (unsigned int i = 0; i < d->conf.max_links; i++) {
		struct dhop_link *l = &d->links[i];
		bool ended;

		pthread_mutex_lock(&d->mu);
		ended = l->st == S_ENDED;
		pthread_mutex_unlock(&d->mu);
		if (!ended)
			continue;
		d->done(l->c.cookie, &l->res, d->done_arg);
		free((void *)l->fb.kept);
		l->fb.kept = NULL;
		xp_dhop_z_free(l->z);
		l->z = NULL;
		pthread_mutex_lock(&d->mu);
		l->st = S_FREE;
		pthread_mutex_unlock(&d->mu);
	}
}

void xp_dhop_stop(struct xp_dhop *d)
{
	if (!d || !d->running)
		return;
	atomic_store(&d->stop, true);
	pthread_join(d->thread, NULL);
	d->running = false;
	for (unsigned int i = 0; i < d->conf.max_links; i++) {
		struct dhop_link *l = &d->links[i];

		if (l->st == S_NEW || l->st == S_LIVE) {
			close(l->c.local_fd);
			close(l->c.tcp_fd);
		} else if (l->st == S_ENDED && l->res.end == XP_END_FALLBACK) {
			close(l->c.local_fd); /* never handed on */
			free((void *)l->fb.kept);
			l->fb.kept = NULL;
		}
		xp_dhop_z_free(l->z);
		l->z = NULL;
		l->st = S_FREE;
	}
}

void xp_dhop_free(struct xp_dhop *d)
{
	if (!d)
		return;
	xp_dhop_stop(d);
	xp_hop_free(d->hop);
	if (d->wrapped)
		d->conf.wrap->free(d->conf.wrap->arg, d->wrapped);
	xp_dpdk_close(d->port);
	if (d->efd >= 0)
		close(d->efd);
	if (d->epfd >= 0)
		close(d->epfd);
	free(d->links);
	pthread_mutex_destroy(&d->mu);
	free(d);
}
