// SPDX-License-Identifier: Apache-2.0
/* The daemon's DPDK node hop (xp_dhop.h): one thread owns the port and the sessions; the control
 * thread hands it links through a slot table under a mutex and reaps ended ones through an
 * eventfd. Each link is an xp_hop peer of its own, keyed from its own TLS session. Liveness: a
 * link that cannot work ends within DEAD_US, and the health new connections are chosen by. */
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

#include "digest.h"
#include "util.h"
#include "xp_bucket.h"
#include "xp_dhop.h"
#include "xp_dpdk.h"
#include "xp_dpdk_port.h"
#include "xp_hop.h"
#include "xp_rel.h"

/* Rounds with nothing moved before the thread sleeps, and how long: short at first (a stream
 * between bursts), up to a millisecond once it has been idle a while. */
#define IDLE_ROUNDS	8
#define IDLE_LONG	4096
#define SLEEP_SHORT_NS	50000
#define SLEEP_LONG_NS	1000000
#define SLEEP_NOLINK_NS 10000000
/* A link whose peer sent no frame this long while bytes of ours waited on it ends with an error. */
#define PEER_SILENT_US (15 * 1000000ull)
/*
 * The bound for a link that never worked (doc/design.md, "Liveness"): one whose port's link has
 * been down this long, or that has heard no frame from its peer since it was set up while bytes
 * of ours waited on it this long, ends with the reason. Short, because nothing is lost by it: a
 * link that never carried a byte, or whose port is down, carries none until it fails; once the
 * peer was heard, a slow peer gets PEER_SILENT_US.
 */
#define DEAD_US	       (5 * 1000000ull)
#define PROBE_GAP_US   1000000 /* an unreachable peer is asked for by ARP this often */
#define PUBLISH_GAP_US 250000  /* the health is published on a change, and at least this often */
#define WRITE_BATCH    (64 * 1024)

enum slot_state {
	S_FREE,
	S_NEW,	 /* attached, the thread has not taken it yet */
	S_LIVE,	 /* the thread's */
	S_ENDED, /* ended, waiting to be reaped */
};

struct dhop_link {
	struct xp_link base; /* first: xp_dhop_attach hands out &base */
	struct xp_dhop *d;
	enum slot_state st; /* under d->mu */
	struct xp_dhop_link_conf c;
	bool sealed;
	uint8_t tx[XP_SEAL_SECRET], rx[XP_SEAL_SECRET];
	atomic_bool abort;
	_Atomic uint64_t bytes[2]; /* [0]: local socket to the peer, [1]: the peer to it */
	_Atomic uint64_t shaped_ns;
	/* the thread's */
	struct xp_hop_peer *peer;
	struct xp_rel *rel;
	bool local_in_done, local_out_done, tcp_gone;
	bool drop_rx; /* QEMU closed its socket: what still comes for it is undelivered */
	bool live;    /* the thread carries it */
	/* readiness from epoll (edge-triggered): a socket is tried only once epoll said so, and
	 * until it answers EAGAIN, so that an idle link costs no system call */
	bool in_ready, out_ready, tcp_ready;
	size_t last_avail; /* in-order bytes for QEMU at the last look, not yet written */
	bool heard;	   /* a frame of the peer's came since set-up */
	uint64_t begun_us, last_heard_us, last_frames_in;
	uint64_t held_until_ns;	 /* the buckets had nothing for the local socket until then */
	struct vm_digest *dg[2]; /* c.digest: what each direction took, in order */
	struct xp_link_result res;
};

struct xp_dhop {
	struct xp_dhop_conf conf;
	struct xp_dpdk *port;
	void *wrapped; /* conf.wrap's port, or NULL */
	struct xp_hop *hop;
	uint32_t ip;
	struct dhop_link *links;
	pthread_mutex_t mu;
	pthread_t thread;
	bool running;
	atomic_bool stop;
	int efd;  /* the thread tells the control thread: links ended */
	int epfd; /* the thread sleeps on local sockets and the TCP connections */
	xp_link_done_fn done;
	void *done_arg;
	/* of links already ended, added to the live ones' by xp_dhop_stats() */
	struct xp_hop_peer_stats gone;
	_Atomic uint64_t polls, sleeps;
	atomic_bool new_links;	       /* attach made an S_NEW slot */
	unsigned int hw; /* the thread's: links[hw..] are none of its, what a round scans */
	struct xp_hop_peer_stats live; /* refreshed by the thread, under mu */
	uint64_t unknown_peer;	       /* the same */
	/* the thread's: the port's link and the peers found unreachable (port_tend()) */
	bool link_up;
	uint64_t link_since_us, published_us;
	struct unreachable {
		uint32_t ip;
		uint64_t probed_us;
		char why[sizeof(((struct xp_hop_health *)0)->peers[0].why)];
	} unreachable[XP_HOP_HEALTH_PEERS];
	unsigned int nunreachable;
	/* what the thread published of that, under mu (xp_dhop_health()) */
	struct xp_hop_health health;
	uint64_t health_since_us;
	uint64_t link_restarts;
};

#define DHOP_LINK(xl)	    container_of(xl, struct dhop_link, base)
#define CONST_DHOP_LINK(xl) container_of(xl, const struct dhop_link, base)

static void dhop_link_abort(struct xp_link *xl)
{
	atomic_store(&DHOP_LINK(xl)->abort, true);
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

/* The hop paces itself (xp_rel's window), not through the kernel's socket pacing. */
static void dhop_link_set_pacing(struct xp_link *xl, uint64_t rate)
{
}

static const struct xp_link_ops dhop_link_ops = {
	.abort = dhop_link_abort,
	.bytes = dhop_link_bytes,
	.shaped_ns = dhop_link_shaped_ns,
	.set_pacing = dhop_link_set_pacing,
};

/* The thread's view of the link and the peers, for the control thread (xp_dhop_health()). */
static void publish(struct xp_dhop *d, uint64_t now)
{
	struct xp_hop_health h = { .link_up = d->link_up, .npeers = d->nunreachable };
	struct xp_dpdk_stats ds;

	if (!d->link_up)
		xp_dpdk_link_why(d->port, h.link_why, sizeof(h.link_why));
	for (unsigned int i = 0; i < d->nunreachable; i++) {
		h.peers[i].ip = d->unreachable[i].ip;
		memcpy(h.peers[i].why, d->unreachable[i].why, sizeof(h.peers[i].why));
	}
	xp_dpdk_stats(d->port, &ds);
	pthread_mutex_lock(&d->mu);
	d->health = h;
	d->health_since_us = d->link_since_us;
	d->link_restarts = ds.link_restarts;
	pthread_mutex_unlock(&d->mu);
	d->published_us = now;
}

/*
 * The port's upkeep (xp_dpdk_tend(): a memif client's handshake tried again), and the peers
 * found unreachable: each asked for by ARP once a second while the link is up, and reachable
 * again once it answers.
 */
static void port_tend(struct xp_dhop *d, uint64_t now)
{
	bool up = xp_dpdk_tend(d->port, now), changed = false;
	uint64_t asking;

	if (up != d->link_up || !d->link_since_us) {
		d->link_up = up;
		d->link_since_us = now;
		changed = true;
	}
	for (unsigned int i = 0; i < d->nunreachable;) {
		struct unreachable *u = &d->unreachable[i];

		if (changed && up)
			u->probed_us = 0; /* a link back up asks at once */
		if (xp_dpdk_peer_arp(d->port, u->ip, now, &asking) == 1) {
			*u = d->unreachable[--d->nunreachable];
			changed = true;
			continue;
		}
		if (up && (!u->probed_us || now - u->probed_us >= PROBE_GAP_US)) {
			xp_dpdk_arp_probe(d->port, u->ip, now);
			u->probed_us = now;
		}
		i++;
	}
	if (changed || now - d->published_us >= PUBLISH_GAP_US)
		publish(d, now);
}

/* New connections to ip stop taking the hop (the control thread sees it in the health) until
 * the peer answers ARP again: its MAC is forgotten, as a silent peer may be elsewhere now. */
static void peer_unreachable(struct xp_dhop *d, uint32_t ip, const char *why, uint64_t now)
{
	struct unreachable *u = NULL;

	for (unsigned int i = 0; i < d->nunreachable && !u; i++)
		if (d->unreachable[i].ip == ip)
			u = &d->unreachable[i];
	if (!u && d->nunreachable == XP_HOP_HEALTH_PEERS) {
		/* full: the oldest makes room, and is tried again by the next connection to it */
		memmove(&d->unreachable[0], &d->unreachable[1],
			sizeof(d->unreachable[0]) * (XP_HOP_HEALTH_PEERS - 1));
		d->nunreachable--;
	}
	if (!u)
		u = &d->unreachable[d->nunreachable++];
	u->ip = ip;
	u->probed_us = now;
	snprintf(u->why, sizeof(u->why), "%s", why);
	xp_dpdk_peer_forget(d->port, ip);
	publish(d, now);
}

int xp_dhop_health(const struct xp_dhop *d, struct xp_hop_health *out)
{
	uint64_t now = vm_now_ns() / 1000;

	pthread_mutex_lock((pthread_mutex_t *)&d->mu);
	*out = d->health;
	out->link_for_ms = now > d->health_since_us ? (now - d->health_since_us) / 1000 : 0;
	pthread_mutex_unlock((pthread_mutex_t *)&d->mu);
	return 0;
}

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
	port_tend(d, vm_now_ns() / 1000);
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
	int r = 0;

	if (!c->stream || !c->peer_ip || !c->tx_secret != !c->rx_secret)
		return -EINVAL;
	if (c->digest && (!(dg[0] = vm_digest_new()) || !(dg[1] = vm_digest_new()))) {
		vm_digest_free(dg[0]);
		return -ENOMEM;
	}
	if (fcntl(c->local_fd, F_SETFL, fcntl(c->local_fd, F_GETFL) | O_NONBLOCK) < 0)
		return -errno;
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
		l->st = S_NEW;
		*ret = &l->base;
		atomic_store(&d->new_links, true);
	}
	pthread_mutex_unlock(&d->mu);
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
static void tap_feed(struct dhop_link *l, unsigned int dir, const struct iovec iov[2], size_t n)
{
	size_t a = n < iov[0].iov_len ? n : iov[0].iov_len;

	if (!l->c.tap_ops[dir])
		return;
	l->c.tap_ops[dir]->feed(l->c.tap_ctx[dir], iov[0].iov_base, a);
	if (n > a)
		l->c.tap_ops[dir]->feed(l->c.tap_ctx[dir], iov[1].iov_base, n - a);
}

/* The first n bytes of iov into direction dir's digest, if it keeps one. */
static void digest_feed(struct dhop_link *l, unsigned int dir, const struct iovec iov[2], size_t n)
{
	size_t a = n < iov[0].iov_len ? n : iov[0].iov_len;

	if (!l->dg[dir])
		return;
	vm_digest_update(l->dg[dir], iov[0].iov_base, a);
	if (n > a)
		vm_digest_update(l->dg[dir], iov[1].iov_base, n - a);
}

/* How much of room the caps let the local socket's bytes have now (room when not capped). */
static size_t shape(struct dhop_link *l, size_t room)
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

__attribute__((format(printf, 4, 5))) static void link_fail(struct dhop_link *l, int err,
							    int side, const char *fmt, ...)
{
	va_list ap;

	if (l->res.end != XP_END_CLEAN || l->res.err)
		return; /* the first reason stands */
	l->res.end = XP_END_ERROR;
	l->res.err = err;
	l->res.err_side = side;
	va_start(ap, fmt);
	vsnprintf(l->res.detail, sizeof(l->res.detail), fmt, ap);
	va_end(ap);
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

/* Moves what it can between the local socket and the stream; returns bytes moved. */
static size_t link_io(struct dhop_link *l)
{
	struct iovec iov[2];
	size_t moved = 0, room;
	ssize_t k;

	while (l->in_ready && !l->local_in_done && (room = xp_rel_write_space(l->rel, iov)) > 0) {
		size_t grant = shape(l, room);

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
			tap_feed(l, 0, iov, (size_t)k);
			digest_feed(l, 0, iov, (size_t)k);
			atomic_fetch_add_explicit(&l->bytes[0], (uint64_t)k, memory_order_relaxed);
			moved += (size_t)k;
			if ((size_t)k < room)
				break;
			continue;
		}
		if (k == 0 || errno == ECONNRESET) {
			/*
			 * A reset is QEMU closing with bytes of ours unread: its end of stream, as
			 * on the kernel path (its destination ends multifd channels so).
			 */
			l->res.reset_after_eof |= k < 0;
			l->local_in_done = true;
			xp_rel_shutdown(l->rel);
		} else if (errno == EAGAIN || errno == EWOULDBLOCK) {
			l->in_ready = false;
		} else if (errno != EINTR) {
			link_fail(l, -errno, 0, "%s", "");
		}
		break;
	}
	while (!l->local_out_done && (room = xp_rel_read_space(l->rel, iov)) > 0) {
		/* QEMU gets its bytes in batches, not a frame at a time: once there are
		 * WRITE_BATCH of them, or when none came since the last look */
		if (room < WRITE_BATCH && room != l->last_avail && !l->drop_rx) {
			l->last_avail = room;
			break;
		}
		l->last_avail = 0;
		if (l->drop_rx) {
			digest_feed(l, 1, iov, room);
			l->res.undelivered += room;
			xp_rel_read_commit(l->rel, room);
			continue;
		}
		if (!l->out_ready)
			break;
		k = writev(l->c.local_fd, iov, iov[1].iov_len ? 2 : 1);
		if (k > 0) {
			tap_feed(l, 1, iov, (size_t)k);
			digest_feed(l, 1, iov, (size_t)k);
			xp_rel_read_commit(l->rel, (size_t)k);
			atomic_fetch_add_explicit(&l->bytes[1], (uint64_t)k, memory_order_relaxed);
			moved += (size_t)k;
			continue;
		}
		if (k < 0 && (errno == EPIPE || errno == ECONNRESET) && l->local_in_done) {
			/* QEMU closed after sending us everything: what it did not read, it did
			 * not want (the kernel path's rule too) */
			l->drop_rx = true;
			continue;
		}
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			l->out_ready = false;
		else if (k < 0 && errno != EINTR)
			link_fail(l, -errno, 0, "%s", "");
		break;
	}
	if (!l->local_out_done && xp_rel_eof(l->rel)) {
		if (!l->drop_rx)
			shutdown(l->c.local_fd, SHUT_WR);
		l->local_out_done = true;
	}
	return moved;
}

/*
 * Liveness over DPDK, which the TCP connection cannot tell (it tells of a peer daemon that died;
 * this, of a DPDK path that broke or never worked), within the bounds doc/design.md states: the
 * port's link down DEAD_US; nothing heard from the peer since set-up DEAD_US while bytes of ours
 * wait on it (its ARP unanswered, or the peer silent); nothing heard PEER_SILENT_US while bytes
 * wait, once it was heard. A stream with nothing waiting may stay quiet: libvirt's own
 * connection does for most of a migration. A peer that failed a link unheard is unreachable for
 * new connections until it answers ARP again (port_tend()).
 */
static bool link_dead(struct xp_dhop *d, struct dhop_link *l, uint64_t now)
{
	uint64_t since = d->link_since_us > l->begun_us ? d->link_since_us : l->begun_us, asking;
	struct xp_rel_stats rs;
	char ip[16], why[160];

	if (!d->link_up && now - since > DEAD_US) {
		xp_dpdk_link_why(d->port, why, sizeof(why));
		link_fail(l, -ENETDOWN, 1, "DPDK link down for %llu s: %s", DEAD_US / 1000000ull,
			  why);
		return true;
	}
	xp_rel_stats(l->rel, &rs);
	if (rs.frames_received != l->last_frames_in || !xp_rel_waiting(l->rel)) {
		l->heard |= rs.frames_received != l->last_frames_in;
		l->last_frames_in = rs.frames_received;
		l->last_heard_us = now;
		return false;
	}
	if (now - l->last_heard_us <= (l->heard ? PEER_SILENT_US : DEAD_US))
		return false;
	if (!d->link_up) {
		/* the port, not the peer: a link set up just before it went down gets here first */
		xp_dpdk_link_why(d->port, why, sizeof(why));
		link_fail(l, -ENETDOWN, 1, "DPDK link down for %llu s: %s",
			  (now - d->link_since_us) / 1000000ull, why);
		return true;
	}
	snprintf(ip, sizeof(ip), "%u.%u.%u.%u", l->c.peer_ip >> 24, (l->c.peer_ip >> 16) & 255,
		 (l->c.peer_ip >> 8) & 255, l->c.peer_ip & 255);
	if (l->heard)
		link_fail(l, -ETIMEDOUT, 1,
			  "peer silent for %llu s: no frame from it over DPDK while bytes of ours "
			  "waited on it",
			  PEER_SILENT_US / 1000000ull);
	else if (xp_dpdk_peer_arp(d->port, l->c.peer_ip, now, &asking) != 1)
		/* asked for, or forgotten a moment ago by another link to it that failed so */
		link_fail(l, -EHOSTUNREACH, 1,
			  "ARP for %s unanswered for %llu s: no frame from the peer over DPDK since "
			  "the link was set up",
			  ip, DEAD_US / 1000000ull);
	else
		link_fail(l, -ETIMEDOUT, 1,
			  "peer silent for %llu s: no frame from it over DPDK since the link was "
			  "set up, with bytes of ours waiting",
			  DEAD_US / 1000000ull);
	peer_unreachable(d, l->c.peer_ip, l->res.detail, now);
	return true;
}

/* Whether the link has ended, and how: its result is filled in. */
static bool link_ended(struct xp_dhop *d, struct dhop_link *l, uint64_t now)
{
	if (l->res.end != XP_END_CLEAN || l->res.err)
		return true;
	if (atomic_load(&l->abort)) {
		l->res.end = XP_END_ABORTED;
		return true;
	}
	if (l->local_in_done && l->local_out_done && xp_rel_send_done(l->rel))
		return true;
	if (l->tcp_gone) {
		/* The peer ends its link once it has every byte of ours and we have all of its. */
		if (l->local_in_done && l->local_out_done)
			return true;
		link_fail(l, -ECONNRESET, 1,
			  "the peer vmigd closed the node-hop connection before the stream ended");
		return true;
	}
	return link_dead(d, l, now);
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

	dhop_link_bytes(&l->base, l->res.bytes);
	l->res.shaped_ns = dhop_link_shaped_ns(&l->base);
	for (unsigned int i = 0; i < 2; i++)
		xp_link_result_digest(&l->res, i, &l->dg[i]);
	epoll_ctl(d->epfd, EPOLL_CTL_DEL, l->c.local_fd, NULL);
	epoll_ctl(d->epfd, EPOLL_CTL_DEL, l->c.tcp_fd, NULL);
	if (l->res.end != XP_END_CLEAN)
		/* a reset, so that QEMU and the peer see an error, not an end of stream */
		setsockopt(l->c.tcp_fd, SOL_SOCKET, SO_LINGER,
			   &(struct linger){ .l_onoff = 1, .l_linger = 0 }, sizeof(struct linger));
	close(l->c.local_fd);
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

static void *dhop_thread(void *arg)
{
	struct xp_dhop *d = arg;
	uint64_t idle = 0, last_refresh = 0;

	/* without an lcore id, every packet buffer comes from the pool's shared ring */
	xp_dpdk_thread_register();
	while (!atomic_load(&d->stop)) {
		uint64_t now = vm_now_ns() / 1000, deadline;
		unsigned int live = 0;
		size_t moved = 0;

		atomic_fetch_add_explicit(&d->polls, 1, memory_order_relaxed);
		take_new(d, now);
		port_tend(d, now);
		readiness(d, 0);
		for (unsigned int i = 0; i < d->hw; i++) {
			struct dhop_link *l = &d->links[i];

			if (!l->live)
				continue;
			if (l->rel) {
				tcp_check(l);
				moved += link_io(l);
			}
			if (link_ended(d, l, now)) {
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
		}
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
