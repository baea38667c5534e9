// SPDX-License-Identifier: Apache-2.0
/* Migrations on one node, both roles, on the control thread. Connection set-up (accept, connect,
 * TLS handshake, preamble, reply, ordering) happens here; once both sockets of a connection are
 * ready they are handed to the transport pool as a link and come back only when the link ends. */
#include <errno.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "px_inspect.h"
#include "px_node.h"
#include "px_order.h"
#include "px_share.h"
#include "rate.h"
#include "units.h"
#include "util.h"
#include "xp_bucket.h"
#include "xp_pool.h"
#include "xp_tls.h"

/* A target keeps at most this many connections of one port waiting for a missing predecessor. */
#define ORDER_MAX_PARKED 64
/* How long a connect(2) to a local unix socket may wait for room in the listener's backlog. */
#define LOCAL_CONNECT_TIMEOUT_MS 2000
/*
 * After `stop`, how long connections already carried may run on before they are cut. QEMU reports
 * a migration completed a moment before it closes its channels, and orchestrators stop the
 * listeners right then (KubeVirt's StopSourceListener closes only the listener).
 */
#define STOP_GRACE_MS 5000
/* Rate meters, node-cap shares and pacing are brought up to date this often. */
#define TICK_MS 100
/* A migration not held back by its cap may grow by this much before its next share. */
#define SHARE_GROWTH_NUM 5
#define SHARE_GROWTH_DEN 4
#define SHARE_FLOOR	 (1024 * 1024)

enum conn_state {
	C_SRC_DELAY,	 /* held back on purpose (--test-delay-first) */
	C_SRC_CONNECT,	 /* node-hop connect in progress */
	C_SRC_HANDSHAKE, /* TLS handshake with the target */
	C_SRC_SEND,	 /* writing the preamble */
	C_SRC_REPLY,	 /* waiting for the target's reply */
	C_TGT_HANDSHAKE, /* TLS handshake with the source */
	C_TGT_PREAMBLE,	 /* reading the preamble */
	C_TGT_PARKED,	 /* waiting for its predecessors */
	C_LINKED,	 /* carried by the pool */
};

static const char *const state_names[] = {
	[C_SRC_DELAY] = "delayed",	 [C_SRC_CONNECT] = "connecting",
	[C_SRC_HANDSHAKE] = "handshake", [C_SRC_SEND] = "preamble",
	[C_SRC_REPLY] = "waiting-reply", [C_TGT_HANDSHAKE] = "handshake",
	[C_TGT_PREAMBLE] = "preamble",	 [C_TGT_PARKED] = "parked",
	[C_LINKED] = "linked",
};

struct px_conn {
	struct px_node *n;
	struct px_migration *m; /* NULL for a target connection before its preamble */
	struct px_port *port;
	uint32_t seq;
	enum conn_state st;
	int lfd;		 /* local unix socket */
	int rfd;		 /* node-hop TCP socket */
	struct xp_tls_sess *tls; /* until linked; the pool owns it after */
	bool graceful;		 /* a refused handshake: let our alert reach the peer */
	char tls_version[16];	 /* empty: plain text */
	char tls_cipher[48];
	char tls_crypto[16];
	bool tls_resumed;
	struct xp_watch *w;
	struct xp_timer *t;
	uint8_t buf[PX_PREAMBLE_MAX];
	size_t len, off;
	struct xp_link *link;
	char peer[80];
	struct px_insp *insp; /* the QEMU stream's direction, once linked (--no-inspect: NULL) */
	struct vm_rate rate[2];
	uint64_t pacing; /* SO_MAX_PACING_RATE last asked for */
	struct px_conn *prev, *next;
};

struct px_port {
	struct px_migration *m;
	uint32_t id;
	char path[108];
	int lfd; /* source: the unix listener */
	struct xp_watch *w;
	uint32_t next_seq;	/* source: next sequence number to hand out */
	struct px_order *order; /* target */
	uint64_t bytes[2];	/* of its ended connections */
	unsigned int conns_total;
	struct vm_rate rate[2];
};

struct px_migration {
	struct px_node *n;
	char key[PX_KEY_MAX + 1];
	enum px_role role;
	unsigned int nports;
	struct px_port ports[PX_PORTS_MAX];
	struct xp_addr peer;
	char peer_str[80];
	unsigned int delay_first_ms;
	uint64_t started_ms;
	struct px_conn *conns;
	unsigned int conns_total, conns_active, conns_failed, conns_cut, conns_reordered;
	uint64_t bytes[2];
	uint64_t undelivered; /* dropped because the local side had closed (see pool_done) */
	bool failed, stopping;
	unsigned int guard; /* >0 while a teardown walks the connections */
	char error[200];
	uint64_t cap;		   /* bytes/s; 0: none */
	uint64_t limit;		   /* what the bucket (or pacing) holds it to now; 0: none */
	bool cap_lifted;	   /* switchover seen: the cap no longer applies */
	struct xp_bucket *bucket;  /* its direction to the peer, all connections */
	uint64_t held_seen;	   /* xp_bucket_held() at the last tick */
	double pace_gain;	   /* pacing: sum of paces over the limit, corrected once a second */
	uint64_t pace_limit;	   /* the limit pace_gain was last corrected for */
	uint64_t pace_next_ms;	   /* when to correct it next */
	uint64_t shaped_ns_done;   /* of ended connections */
	struct px_insp_summary insp_done; /* counters of ended connections */
	struct vm_rate rate[2];
	struct xp_timer *order_timer;
	struct xp_timer *stop_timer;
	struct px_migration *next;
};

struct px_node {
	struct xp_loop *loop;
	struct px_config conf;
	struct xp_pool *pool;
	struct xp_watch *pool_w;
	int lfd;
	struct xp_watch *lw;
	struct xp_addr bound;
	char listen_str[80];
	char advertise[PX_HOST_MAX];
	struct px_migration *migrations;
	struct px_migration *stopped; /* stopped, waiting for the pool to return their links */
	struct px_conn *unbound; /* target connections before their preamble: unauthenticated */
	unsigned int nunbound;
	unsigned int unauth_refused; /* since the last log line about them */
	uint64_t unauth_logged_ms;
	bool draining;
	struct xp_bucket *bucket; /* the node cap (rate 0: none) */
	struct xp_timer *tick;
	uint64_t bytes_done[2];	  /* of ended connections */
	uint64_t conns_total;
	struct vm_rate rate[2];
	struct xp_timer *drain_timer;
	void (*drain_done)(void *arg);
	void *drain_arg;
};

static const char *role_str(enum px_role r)
{
	return r == PX_ROLE_SOURCE ? "source" : "target";
}

static void conn_list_add(struct px_conn **head, struct px_conn *c)
{
	c->prev = NULL;
	c->next = *head;
	if (*head)
		(*head)->prev = c;
	*head = c;
}

static void conn_list_del(struct px_conn **head, struct px_conn *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		*head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = c->next = NULL;
}

static void node_check_drained(struct px_node *n);
static void migration_finish(struct px_migration *m);
static void migration_fail(struct px_migration *m, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/*
 * Closes after a refused handshake so that the TLS alert already written reaches the peer: a
 * close with unread bytes would reset the connection and drop it.
 */
static void close_gently(int fd)
{
	char buf[4096];

	(void)shutdown(fd, SHUT_WR);
	for (int i = 0; i < 16 && recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0; i++)
		;
	close(fd);
}

/* Frees a connection that is not (or no longer) carried by the pool. */
static void conn_free(struct px_conn *c)
{
	struct px_migration *m = c->m;

	xp_watch_del(c->w);
	xp_timer_del(c->t);
	if (c->st != C_LINKED) {
		xp_tls_sess_free(c->tls);
		if (c->graceful)
			close_gently(c->rfd);
		else
			xp_close_reset(c->rfd);
		if (c->lfd >= 0)
			close(c->lfd);
	}
	px_insp_free(c->insp);
	if (m) {
		conn_list_del(&m->conns, c);
		m->conns_active--;
	} else {
		conn_list_del(&c->n->unbound, c);
		c->n->nunbound--;
	}
	free(c);
}

/* After a connection went away: a stopping migration may now be done, a drain may be over. */
static void migration_maybe_finish(struct px_migration *m)
{
	if (m->stopping && m->conns_active == 0 && m->guard == 0)
		migration_finish(m);
}

static void conn_release(struct px_conn *c)
{
	struct px_migration *m = c->m;
	struct px_node *n = c->n;

	conn_free(c);
	if (m)
		migration_maybe_finish(m);
	node_check_drained(n);
}

/* Node-hop I/O during set-up, through TLS or not: bytes, 0 at end of stream, -EAGAIN with the
 * epoll events to wait for in *ev, or -errno. */
static ssize_t conn_read(struct px_conn *c, void *buf, size_t len, uint32_t *ev)
{
	enum xp_tls_want want = XP_TLS_WANT_READ;
	ssize_t k;

	if (c->tls) {
		k = xp_tls_read(c->tls, buf, len, &want);
	} else {
		k = read(c->rfd, buf, len);
		if (k < 0)
			k = errno == EINTR ? -EAGAIN : -errno;
	}
	*ev = want == XP_TLS_WANT_WRITE ? EPOLLOUT : EPOLLIN;
	return k;
}

static ssize_t conn_write(struct px_conn *c, const void *buf, size_t len, uint32_t *ev)
{
	enum xp_tls_want want = XP_TLS_WANT_WRITE;
	ssize_t k;

	if (c->tls) {
		k = xp_tls_write(c->tls, buf, len, &want);
	} else {
		k = write(c->rfd, buf, len);
		if (k < 0)
			k = errno == EINTR ? -EAGAIN : -errno;
	}
	*ev = want == XP_TLS_WANT_READ ? EPOLLIN : EPOLLOUT;
	return k;
}

/* 0, or -errno (-EIO for a short write). A fresh connection's send buffer is empty, so a
 * failure means the peer is gone; callers refusing a connection need not care. */
static int conn_reply(struct px_conn *c, enum px_status st)
{
	uint8_t r[PX_REPLY_LEN];
	uint32_t ev;
	ssize_t k;

	px_reply_encode(st, r);
	k = conn_write(c, r, sizeof(r), &ev);
	if (k < 0)
		return k == -EAGAIN ? -EIO : (int)k;
	return k == sizeof(r) ? 0 : -EIO;
}

/* After a finished handshake: what the connection runs on, for logs and status. */
static void conn_tls_done(struct px_conn *c)
{
	snprintf(c->tls_version, sizeof(c->tls_version), "%s", xp_tls_sess_version(c->tls));
	snprintf(c->tls_cipher, sizeof(c->tls_cipher), "%s", xp_tls_sess_cipher(c->tls));
	snprintf(c->tls_crypto, sizeof(c->tls_crypto), "%s",
		 xp_tls_ktls_tx(c->tls) && xp_tls_ktls_rx(c->tls) ? "ktls"
		 : xp_tls_ktls_tx(c->tls)			  ? "ktls-tx"
								  : "user-space");
	c->tls_resumed = xp_tls_sess_resumed(c->tls);
}

static void set_nodelay(int fd)
{
	int one = 1;

	/* The return path carries small messages that must not wait for Nagle. */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int conn_link(struct px_conn *c)
{
	struct xp_link_opts o = { 0 };
	char tls[320];
	int r;

	xp_watch_del(c->w);
	xp_timer_del(c->t);
	c->w = NULL;
	c->t = NULL;
	set_nodelay(c->rfd);
	o.tls = c->tls;
	o.cookie = c;
	if (c->n->conf.shaper == PX_SHAPE_BUCKET) {
		o.bucket[0] = c->m->bucket;
		o.bucket[1] = c->n->bucket;
	}
	/* The QEMU stream: from the local socket on a source, from the node hop on a target. */
	if (c->n->conf.inspect && px_insp_new(NULL, &c->insp) == 0) {
		unsigned int d = c->m->role == PX_ROLE_SOURCE ? 0 : 1;

		o.tap_ops[d] = &px_insp_tap_ops;
		o.tap_ctx[d] = c->insp;
	}
	/* Once attached, the data path owns the session and may free it at any time. */
	snprintf(tls, sizeof(tls), "%s", c->tls ? xp_tls_sess_describe(c->tls) : "tls=off");
	r = xp_pool_attach(c->n->pool, c->lfd, c->rfd, &o, &c->link);
	if (r < 0) {
		px_insp_free(c->insp);
		c->insp = NULL;
		return r;
	}
	c->st = C_LINKED;
	c->m->conns_total++;
	c->port->conns_total++;
	c->n->conns_total++;
	c->tls = NULL;
	log_info("migration %s role=%s: port %u connection %u linked %s", c->m->key,
		 role_str(c->m->role), c->port->id, c->seq, tls);
	return 0;
}

/*
 * Adds one connection's inspector figures to a migration's. live: the connection is still carried,
 * so its pass figures count towards the dirty-rate estimate; ended ones only add their counters.
 */
static void insp_fold(struct px_insp_summary *sum, const struct px_insp_stats *st, bool live)
{
	switch (st->kind) {
	case PX_INSP_MAIN:
		sum->main++;
		sum->stream_version = st->stream_version;
		if (st->machine[0])
			snprintf(sum->machine, sizeof(sum->machine), "%s", st->machine);
		break;
	case PX_INSP_MULTIFD:
		sum->multifd++;
		break;
	case PX_INSP_OTHER:
		sum->other++;
		break;
	default:
		break;
	}
	/* Parsing stops at switchover on purpose: device state has no framing to follow. */
	if (st->bytes_only && !st->switchover) {
		if (!sum->bytes_only++)
			snprintf(sum->reason, sizeof(sum->reason), "%s", st->reason);
	}
	if (st->page_size)
		sum->page_size = st->page_size;
	sum->pages += st->pages;
	sum->zero_pages += st->zero_pages;
	sum->packets += st->packets;
	sum->syncs += st->syncs;
	if (st->passes > sum->passes)
		sum->passes = st->passes;
	sum->switchover |= st->switchover;
	/* passes counts passes begun: from 3 on, the last completed one was a dirty-page pass. */
	if (live && st->passes >= 3 && st->pass_ms_last > 0) {
		uint64_t bytes = st->pass_pages_last * (st->page_size ? st->page_size : 4096);

		sum->dirty_known = true;
		sum->dirty_pages_per_pass += st->pass_pages_last;
		sum->dirty_rate += bytes * 1000 / st->pass_ms_last;
	}
}

static void pool_done(void *cookie, const struct xp_link_result *res, void *arg)
{
	struct px_conn *c = cookie;
	struct px_migration *m = c->m;

	m->bytes[0] += res->bytes[0];
	m->bytes[1] += res->bytes[1];
	c->port->bytes[0] += res->bytes[0];
	c->port->bytes[1] += res->bytes[1];
	m->n->bytes_done[0] += res->bytes[0];
	m->n->bytes_done[1] += res->bytes[1];
	m->shaped_ns_done += res->shaped_ns;
	if (c->insp) {
		struct px_insp_stats st;

		px_insp_read(c->insp, &st);
		insp_fold(&m->insp_done, &st, false);
	}
	m->undelivered += res->undelivered;
	if (res->end == XP_END_ERROR) {
		m->conns_failed++;
		log_err("migration %s role=%s: port %u connection %u failed after %llu/%llu bytes "
			"(tx/rx): %s on the %s side%s%s",
			m->key, role_str(m->role), c->port->id, c->seq,
			(unsigned long long)res->bytes[0], (unsigned long long)res->bytes[1],
			strerror(-res->err), res->err_side == 0 ? "local" : "node-hop",
			res->detail[0] ? ": TLS: " : "", res->detail);
	} else {
		if (res->undelivered)
			log_info("migration %s role=%s: port %u connection %u: the local side "
				 "closed "
				 "after its end of stream with %llu bytes from the peer not read "
				 "(QEMU's destination ends multifd channels so)",
				 m->key, role_str(m->role), c->port->id, c->seq,
				 (unsigned long long)res->undelivered);
		log_debug("migration %s: port %u connection %u ended (%s%s), %llu/%llu bytes",
			  m->key, c->port->id, c->seq, res->end == XP_END_CLEAN ? "clean" : "cut",
			  res->reset_after_eof ? ", peer reset after its stream ended" : "",
			  (unsigned long long)res->bytes[0], (unsigned long long)res->bytes[1]);
	}
	conn_release(c);
}

static void pool_ready(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	xp_pool_reap(arg);
}

/* ---- source role ---- */

static void src_error(struct px_conn *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void src_error(struct px_conn *c, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	c->m->conns_failed++;
	log_err("migration %s role=source: port %u connection %u to %s: %s", c->m->key, c->port->id,
		c->seq, c->m->peer_str, msg);
	conn_release(c);
}

static void src_timeout(void *arg)
{
	struct px_conn *c = arg;

	c->t = NULL;
	if (c->st == C_SRC_HANDSHAKE)
		src_error(c,
			  "TLS refused (handshake-timeout): no complete handshake within %llu ms",
			  (unsigned long long)c->n->conf.handshake_timeout_ms);
	else
		src_error(c, c->st == C_SRC_CONNECT ? "connect timed out"
			     : c->st == C_SRC_SEND  ? "sending the preamble timed out"
						    : "no reply from the target in time");
}

/* TLS errors during set-up name the refusal; others are plain socket errors. */
static void src_io_error(struct px_conn *c, const char *what, ssize_t k)
{
	if (c->tls && xp_tls_sess_refusal(c->tls) != XP_TLS_OK)
		src_error(c, "TLS refused (%s) %s: %s",
			  xp_tls_refusal_token(xp_tls_sess_refusal(c->tls)), what,
			  xp_tls_sess_error(c->tls));
	else if (c->tls && k == -EPROTO)
		src_error(c, "%s: TLS: %s", what, xp_tls_sess_io_error(c->tls));
	else
		src_error(c, "%s: %s", what, strerror((int)-k));
}

static void src_io(struct xp_watch *w, int fd, uint32_t events, void *arg);

/* Waits for events on the node-hop socket; the deadline is set on entering a state, not reset. */
static void src_set_wait(struct px_conn *c, enum conn_state st, uint32_t events, uint64_t ms)
{
	if (c->st != st || !c->t) {
		xp_timer_del(c->t);
		c->t = NULL;
		if (xp_timer_add(c->n->loop, vm_now_ms() + ms, src_timeout, c, &c->t) < 0)
			goto nomem;
	}
	c->st = st;
	if ((c->w ? xp_watch_mod(c->w, events)
		  : xp_watch_add(c->n->loop, c->rfd, events, src_io, c, &c->w)) < 0)
		goto nomem;
	return;
nomem:
	src_error(c, "out of memory");
}

static void src_read_reply(struct px_conn *c);

static void src_send(struct px_conn *c)
{
	uint32_t ev = EPOLLOUT;
	ssize_t k = 0;

	while (c->off < c->len) {
		k = conn_write(c, c->buf + c->off, c->len - c->off, &ev);
		if (k <= 0)
			break;
		c->off += k;
	}
	if (k < 0 && k != -EAGAIN) {
		src_io_error(c, "sending the preamble", k);
		return;
	}
	if (c->off < c->len) {
		src_set_wait(c, C_SRC_SEND, ev, c->n->conf.connect_timeout_ms);
		return;
	}
	c->len = 0;
	/* The target answers only once it could open the local socket in order. */
	src_read_reply(c);
}

static void src_start_send(struct px_conn *c)
{
	struct px_preamble p = { .version = PX_PROTO_VERSION, .port = c->port->id, .seq = c->seq };
	int r;

	strcpy(p.key, c->m->key);
	r = px_preamble_encode(&p, c->buf, sizeof(c->buf));
	if (r < 0) {
		src_error(c, "cannot encode the preamble: %s", strerror(-r));
		return;
	}
	c->len = r;
	c->off = 0;
	src_send(c);
}

static void src_handshake(struct px_conn *c)
{
	enum xp_tls_want want;
	int r;

	if (!c->tls) {
		r = xp_tls_sess_new(c->n->conf.tls, c->rfd, false, c->m->peer_str, &c->tls);
		if (r < 0) {
			src_error(c, "TLS: %s", strerror(-r));
			return;
		}
	}
	r = xp_tls_handshake(c->tls, &want);
	if (r == -EAGAIN) {
		src_set_wait(c, C_SRC_HANDSHAKE, want == XP_TLS_WANT_WRITE ? EPOLLOUT : EPOLLIN,
			     c->n->conf.handshake_timeout_ms);
		return;
	}
	if (r < 0) {
		enum xp_tls_refusal why = xp_tls_sess_refusal(c->tls);

		c->graceful = true;
		src_error(c, "TLS refused (%s): %s%s", xp_tls_refusal_token(why),
			  xp_tls_sess_error(c->tls),
			  why == XP_TLS_CLOSED ? " (is the target over its --max-unauthenticated, "
						 "shutting down, or not speaking TLS?)"
					       : "");
		return;
	}
	conn_tls_done(c);
	src_start_send(c);
}

/* Connected: TLS first when configured, then the preamble. */
static void src_connected(struct px_conn *c)
{
	if (c->n->conf.tls)
		src_handshake(c);
	else
		src_start_send(c);
}

static void src_read_reply(struct px_conn *c)
{
	enum px_status st;
	uint32_t ev = EPOLLIN;
	ssize_t k = 0;
	int r = 0;

	while (c->len < PX_REPLY_LEN) {
		k = conn_read(c, c->buf + c->len, PX_REPLY_LEN - c->len, &ev);
		if (k <= 0)
			break;
		c->len += k;
	}
	if (k == 0 && c->len < PX_REPLY_LEN) {
		src_error(c, "the target closed the connection before replying");
		return;
	}
	if (k < 0 && k != -EAGAIN) {
		src_io_error(c, "reading the reply", k);
		return;
	}
	if (c->len < PX_REPLY_LEN) {
		src_set_wait(c, C_SRC_REPLY, ev,
			     c->n->conf.order_timeout_ms + c->n->conf.connect_timeout_ms);
		return;
	}
	r = px_reply_decode(c->buf, c->len, &st);
	if (r < 0) {
		src_error(c, "the target's reply is malformed (not a vmigd of this protocol?)");
		return;
	}
	if (st == PX_ERR_LIMIT) {
		src_error(c, "refused (migration-conn-limit) by the target: %s", px_status_str(st));
		return;
	}
	if (st != PX_OK) {
		src_error(c, "refused by the target: %s", px_status_str(st));
		return;
	}
	r = conn_link(c);
	if (r < 0)
		src_error(c, "cannot hand to the data path: %s", strerror(-r));
}

static void src_io(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	struct px_conn *c = arg;
	int r;

	switch (c->st) {
	case C_SRC_CONNECT:
		r = xp_sock_error(fd);
		if (r < 0) {
			src_error(c, "connect: %s", strerror(-r));
			return;
		}
		src_connected(c);
		return;
	case C_SRC_HANDSHAKE:
		src_handshake(c);
		return;
	case C_SRC_SEND:
		src_send(c);
		return;
	case C_SRC_REPLY:
		src_read_reply(c);
		return;
	default:
		return;
	}
}

static void src_connect(struct px_conn *c)
{
	int r = xp_tcp_connect(&c->m->peer, &c->rfd);

	if (r < 0) {
		src_error(c, "connect: %s", strerror(-r));
		return;
	}
	if (r == 0) {
		src_connected(c);
		return;
	}
	src_set_wait(c, C_SRC_CONNECT, EPOLLOUT, c->n->conf.connect_timeout_ms);
}

static void src_delay_done(void *arg)
{
	struct px_conn *c = arg;

	c->t = NULL;
	src_connect(c);
}

static void src_accept(struct xp_watch *w, int lfd, uint32_t events, void *arg)
{
	struct px_port *port = arg;
	struct px_migration *m = port->m;
	int fd, r;

	while ((r = xp_accept(lfd, &fd)) == 0) {
		struct px_conn *c;

		if (m->conns_active >= m->n->conf.max_migration_conns) {
			log_err("migration %s role=source: port %u connection %u refused "
				"(migration-conn-limit): %u connections already "
				"(--max-migration-conns)",
				m->key, port->id, port->next_seq++, m->conns_active);
			xp_close_reset(fd);
			migration_fail(m, "more than %u connections (--max-migration-conns)",
				       m->n->conf.max_migration_conns);
			continue;
		}
		c = calloc(1, sizeof(*c));
		if (!c) {
			log_err("migration %s: out of memory, dropping a connection", m->key);
			close(fd);
			continue;
		}
		c->n = m->n;
		c->m = m;
		c->port = port;
		c->lfd = fd;
		c->rfd = -1;
		c->seq = port->next_seq++;
		snprintf(c->peer, sizeof(c->peer), "%s", m->peer_str);
		conn_list_add(&m->conns, c);
		m->conns_active++;
		if (c->seq == 0 && m->delay_first_ms) {
			c->st = C_SRC_DELAY;
			if (xp_timer_add(m->n->loop, vm_now_ms() + m->delay_first_ms,
					 src_delay_done, c, &c->t) < 0)
				src_error(c, "out of memory");
			continue;
		}
		src_connect(c);
	}
	if (r != -EAGAIN && r != -EINTR && r != -ECONNABORTED)
		log_err("migration %s: accept on %s: %s", m->key, port->path, strerror(-r));
}

/* ---- target role ---- */

static int tgt_open(void *ctx, uint32_t seq, void *conn)
{
	struct px_port *port = ctx;
	struct px_conn *c = conn;
	int r;

	r = xp_unix_connect(port->path, LOCAL_CONNECT_TIMEOUT_MS, &c->lfd);
	if (r < 0) {
		log_err("migration %s role=target: port %u connection %u: connect to %s: %s",
			port->m->key, port->id, seq, port->path, strerror(-r));
		return r;
	}
	r = conn_reply(c, PX_OK);
	if (r < 0) {
		log_err("migration %s role=target: port %u connection %u: replying to %s: %s",
			port->m->key, port->id, seq, c->peer, strerror(-r));
		return r;
	}
	r = conn_link(c);
	if (r < 0)
		log_err("migration %s role=target: port %u connection %u: data path: %s",
			port->m->key, port->id, seq, strerror(-r));
	return r;
}

static void tgt_drop(void *ctx, uint32_t seq, void *conn, enum px_status why)
{
	struct px_conn *c = conn;

	conn_reply(c, why);
	conn_release(c);
}

static const struct px_order_ops tgt_order_ops = {
	.open = tgt_open,
	.drop = tgt_drop,
};

static void tgt_order_check(void *arg);

static void tgt_order_arm(struct px_migration *m)
{
	uint64_t d = 0;

	xp_timer_del(m->order_timer);
	m->order_timer = NULL;
	for (unsigned int i = 0; i < m->nports; i++) {
		uint64_t pd = px_order_deadline(m->ports[i].order);

		if (pd && (!d || pd < d))
			d = pd;
	}
	if (d && xp_timer_add(m->n->loop, d, tgt_order_check, m, &m->order_timer) < 0)
		migration_fail(m, "out of memory arming the ordering timer");
}

static void tgt_order_check(void *arg)
{
	struct px_migration *m = arg;
	uint64_t now = vm_now_ms();

	m->order_timer = NULL;
	for (unsigned int i = 0; i < m->nports; i++) {
		struct px_port *p = &m->ports[i];
		uint32_t missing = px_order_next(p->order);
		unsigned int parked = px_order_parked(p->order);

		if (px_order_expire(p->order, now)) {
			migration_fail(m,
				       "port %u connection %u did not arrive within %llu ms "
				       "(%u later connections were waiting)",
				       p->id, missing,
				       (unsigned long long)m->n->conf.order_timeout_ms, parked);
			return;
		}
	}
	tgt_order_arm(m);
}

static struct px_migration *find_migration(struct px_node *n, const char *key, enum px_role role)
{
	for (struct px_migration *m = n->migrations; m; m = m->next)
		if (m->role == role && strcmp(m->key, key) == 0)
			return m;
	return NULL;
}

static void tgt_reject(struct px_conn *c, enum px_status st, const char *key)
{
	log_warn("node hop from %s%s%s: %s; connection refused", c->peer, key ? " for " : "",
		 key ? key : "", px_status_str(st));
	conn_reply(c, st);
	conn_release(c);
}

static void tgt_dispatch(struct px_conn *c, const struct px_preamble *p)
{
	struct px_node *n = c->n;
	struct px_migration *m;
	struct px_port *port = NULL;
	enum px_status st;

	m = find_migration(n, p->key, PX_ROLE_TARGET);
	if (!m) {
		tgt_reject(c, n->draining ? PX_ERR_SHUTDOWN : PX_ERR_UNKNOWN_KEY, p->key);
		return;
	}
	for (unsigned int i = 0; i < m->nports; i++)
		if (m->ports[i].id == p->port)
			port = &m->ports[i];
	if (!port) {
		tgt_reject(c, PX_ERR_UNKNOWN_PORT, p->key);
		return;
	}
	if (n->draining) {
		tgt_reject(c, PX_ERR_SHUTDOWN, p->key);
		return;
	}
	if (m->conns_active >= n->conf.max_migration_conns) {
		log_err("migration %s role=target: port %u connection %u from %s refused "
			"(migration-conn-limit): %u connections already (--max-migration-conns)",
			m->key, port->id, p->seq, c->peer, m->conns_active);
		conn_reply(c, PX_ERR_LIMIT);
		conn_release(c);
		migration_fail(m, "more than %u connections (--max-migration-conns)",
			       n->conf.max_migration_conns);
		return;
	}
	xp_watch_del(c->w);
	xp_timer_del(c->t);
	c->w = NULL;
	c->t = NULL;
	conn_list_del(&n->unbound, c);
	n->nunbound--;
	c->m = m;
	c->port = port;
	c->seq = p->seq;
	c->st = C_TGT_PARKED;
	conn_list_add(&m->conns, c);
	m->conns_active++;
	if (p->seq > px_order_next(port->order))
		m->conns_reordered++;
	st = px_order_arrive(port->order, p->seq, c, vm_now_ms());
	if (st == PX_OK && px_order_failed(port->order)) {
		/* This one opened, but a parked successor could not: the sequence is broken. */
		migration_fail(m, "port %u connection %u could not be opened on %s", port->id,
			       px_order_next(port->order), port->path);
		return;
	}
	if (st == PX_OK) {
		tgt_order_arm(m);
		return;
	}
	log_warn("migration %s role=target: port %u connection %u from %s: %s; refused", m->key,
		 port->id, p->seq, c->peer, px_status_str(st));
	conn_reply(c, st);
	conn_release(c);
	if (st == PX_ERR_CONNECT)
		migration_fail(m, "port %u connection %u could not be opened on %s", port->id,
			       p->seq, port->path);
}

static void tgt_read(struct px_conn *c)
{
	struct px_preamble p;
	uint32_t ev;
	size_t want;
	ssize_t k;
	int r;

	/* Exactly the preamble: the bytes after it belong to the local socket. TLS may hold
	 * them decrypted already, so read until it would block, not once per event. */
	for (;;) {
		want = c->len < PX_PREAMBLE_FIXED
			       ? PX_PREAMBLE_FIXED - c->len
			       : PX_PREAMBLE_FIXED + vm_get_be16(c->buf + 16) - c->len;
		k = conn_read(c, c->buf + c->len, want, &ev);
		if (k == -EAGAIN) {
			if (xp_watch_mod(c->w, ev) < 0)
				conn_release(c);
			return;
		}
		if (k < 0) {
			log_warn("node hop from %s: %s before the preamble was complete%s%s",
				 c->peer, k == -EPROTO ? "TLS error" : strerror((int)-k),
				 c->tls && k == -EPROTO ? ": " : "",
				 c->tls && k == -EPROTO ? xp_tls_sess_io_error(c->tls) : "");
			conn_release(c);
			return;
		}
		if (k == 0) {
			log_warn(
				"node hop from %s: closed after %zu bytes, before the preamble was "
				"complete",
				c->peer, c->len);
			conn_release(c);
			return;
		}
		c->len += k;
		r = px_preamble_decode(c->buf, c->len, &p);
		if (r < 0) {
			tgt_reject(c, -r, NULL);
			return;
		}
		if (r > 0) {
			tgt_dispatch(c, &p);
			return;
		}
	}
}

static void tgt_timeout(void *arg)
{
	struct px_conn *c = arg;

	c->t = NULL;
	if (c->st == C_TGT_HANDSHAKE)
		log_warn("node hop from %s: TLS refused (handshake-timeout): no complete handshake "
			 "within %llu ms; dropped",
			 c->peer, (unsigned long long)c->n->conf.handshake_timeout_ms);
	else
		log_warn("node hop from %s: no complete preamble within %llu ms (%zu bytes); "
			 "dropped",
			 c->peer, (unsigned long long)c->n->conf.preamble_timeout_ms, c->len);
	conn_release(c);
}

/* Authenticated (or plain text): the preamble has its own deadline. */
static void tgt_start_preamble(struct px_conn *c)
{
	xp_timer_del(c->t);
	c->t = NULL;
	c->st = C_TGT_PREAMBLE;
	if (xp_timer_add(c->n->loop, vm_now_ms() + c->n->conf.preamble_timeout_ms, tgt_timeout, c,
			 &c->t) < 0) {
		log_err("node hop: out of memory, dropping a connection");
		conn_release(c);
		return;
	}
	tgt_read(c);
}

static void tgt_handshake(struct px_conn *c)
{
	enum xp_tls_want want;
	int r;

	r = xp_tls_handshake(c->tls, &want);
	if (r == -EAGAIN) {
		if (xp_watch_mod(c->w, want == XP_TLS_WANT_WRITE ? EPOLLOUT : EPOLLIN) < 0)
			conn_release(c);
		return;
	}
	if (r < 0) {
		log_warn("node hop from %s: TLS refused (%s): %s", c->peer,
			 xp_tls_refusal_token(xp_tls_sess_refusal(c->tls)),
			 xp_tls_sess_error(c->tls));
		c->graceful = true;
		conn_release(c);
		return;
	}
	conn_tls_done(c);
	tgt_start_preamble(c);
}

static void tgt_io(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	struct px_conn *c = arg;

	if (c->st == C_TGT_HANDSHAKE)
		tgt_handshake(c);
	else
		tgt_read(c);
}

/* Connections that have not yet authenticated are bounded; the excess is closed at once. */
static bool tgt_admit(struct px_node *n, int fd, const char *peer)
{
	uint64_t now = vm_now_ms();

	if (n->nunbound < n->conf.max_unauth)
		return true;
	n->unauth_refused++;
	if (now - n->unauth_logged_ms >= 1000) {
		log_warn("node hop from %s: refused (too-many-unauthenticated): %u connections are "
			 "still authenticating (--max-unauthenticated %u); %u refused since the "
			 "last "
			 "such line",
			 peer, n->nunbound, n->conf.max_unauth, n->unauth_refused);
		n->unauth_refused = 0;
		n->unauth_logged_ms = now;
	}
	xp_close_reset(fd);
	return false;
}

static void tgt_accept(struct xp_watch *w, int lfd, uint32_t events, void *arg)
{
	struct px_node *n = arg;
	int fd, r;

	while ((r = xp_accept(lfd, &fd)) == 0) {
		struct xp_addr a = { .len = sizeof(a.ss) };
		char peer[80];
		struct px_conn *c;

		if (getpeername(fd, (struct sockaddr *)&a.ss, &a.len) < 0 ||
		    xp_addr_format(&a, peer, sizeof(peer)) < 0)
			strcpy(peer, "?");
		if (!tgt_admit(n, fd, peer))
			continue;
		c = calloc(1, sizeof(*c));
		if (!c) {
			log_err("node hop: out of memory, dropping a connection");
			close(fd);
			continue;
		}
		c->n = n;
		c->rfd = fd;
		c->lfd = -1;
		strcpy(c->peer, peer);
		conn_list_add(&n->unbound, c);
		n->nunbound++;
		if (xp_watch_add(n->loop, fd, EPOLLIN, tgt_io, c, &c->w) < 0) {
			log_err("node hop: out of memory, dropping a connection");
			conn_release(c);
			continue;
		}
		if (!n->conf.tls) {
			tgt_start_preamble(c);
			continue;
		}
		c->st = C_TGT_HANDSHAKE;
		if (xp_tls_sess_new(n->conf.tls, fd, true, NULL, &c->tls) < 0 ||
		    xp_timer_add(n->loop, vm_now_ms() + n->conf.handshake_timeout_ms, tgt_timeout,
				 c, &c->t) < 0) {
			log_err("node hop: out of memory, dropping a connection");
			conn_release(c);
			continue;
		}
		tgt_handshake(c);
	}
	if (r != -EAGAIN && r != -EINTR && r != -ECONNABORTED)
		log_err("node hop: accept: %s", strerror(-r));
}

/* ---- migrations ---- */

/* Drops connections still being set up; with links, also cuts those being carried. */
static void cut_conns(struct px_migration *m, bool links)
{
	struct px_conn *c = m->conns, *next;

	for (; c; c = next) {
		next = c->next;
		if (c->st == C_LINKED) {
			if (links) {
				m->conns_cut++;
				xp_link_abort(c->link);
			}
		} else if (c->st != C_TGT_PARKED) {
			/* Parked ones belong to the order, which drops them itself. */
			conn_free(c);
		}
	}
}

/*
 * Fails every port's ordering (parked connections are answered and dropped) and cuts the
 * connections; guarded, so the record outlives the walk even when its last connection goes.
 */
static void migration_cut(struct px_migration *m, bool links)
{
	m->guard++;
	for (unsigned int i = 0; i < m->nports; i++)
		if (m->ports[i].order)
			px_order_fail(m->ports[i].order);
	cut_conns(m, links);
	m->guard--;
}

static void migration_fail(struct px_migration *m, const char *fmt, ...)
{
	va_list ap;

	if (m->failed)
		return;
	m->failed = true;
	va_start(ap, fmt);
	vsnprintf(m->error, sizeof(m->error), fmt, ap);
	va_end(ap);
	log_err("migration %s role=%s failed: %s; closing its %u connections", m->key,
		role_str(m->role), m->error, m->conns_active);
	migration_cut(m, true);
	xp_timer_del(m->order_timer);
	m->order_timer = NULL;
}

static void port_close(struct px_port *p)
{
	xp_watch_del(p->w);
	p->w = NULL;
	if (p->lfd >= 0) {
		close(p->lfd);
		unlink(p->path);
		p->lfd = -1;
	}
}

static void migration_unlink(struct px_migration **head, struct px_migration *m)
{
	struct px_migration **pp = head;

	while (*pp && *pp != m)
		pp = &(*pp)->next;
	if (*pp)
		*pp = m->next;
	m->next = NULL;
}

static void migration_finish(struct px_migration *m)
{
	double secs = (vm_now_ms() - m->started_ms) / 1000.0;
	char outcome[256], undelivered[48] = "";

	if (m->failed)
		snprintf(outcome, sizeof(outcome), "failed (%s)", m->error);
	else if (m->conns_cut)
		snprintf(outcome, sizeof(outcome), "stopped with %u connections in flight",
			 m->conns_cut);
	else if (m->conns_failed)
		snprintf(outcome, sizeof(outcome), "errors on %u connections", m->conns_failed);
	else
		snprintf(outcome, sizeof(outcome), "ok");
	if (m->undelivered)
		snprintf(undelivered, sizeof(undelivered), " undelivered=%llu",
			 (unsigned long long)m->undelivered);
	log_info("migration %s role=%s stop conns=%u reordered=%u bytes=%llu tx=%llu rx=%llu%s "
		 "duration=%.3fs outcome=%s",
		 m->key, role_str(m->role), m->conns_total, m->conns_reordered,
		 (unsigned long long)(m->bytes[0] + m->bytes[1]), (unsigned long long)m->bytes[0],
		 (unsigned long long)m->bytes[1], undelivered, secs, outcome);
	migration_unlink(m->stopping ? &m->n->stopped : &m->n->migrations, m);
	for (unsigned int i = 0; i < m->nports; i++) {
		port_close(&m->ports[i]);
		px_order_free(m->ports[i].order);
	}
	xp_timer_del(m->order_timer);
	xp_timer_del(m->stop_timer);
	xp_bucket_free(m->bucket);
	free(m);
}

static void stop_grace_expired(void *arg)
{
	struct px_migration *m = arg;

	m->stop_timer = NULL;
	log_warn("migration %s role=%s: %u connections still open %d ms after stop; cutting them",
		 m->key, role_str(m->role), m->conns_active, STOP_GRACE_MS);
	migration_cut(m, true);
	migration_maybe_finish(m);
}

/*
 * Leaves the key free at once; the record lives on until the pool returned its links. Links
 * get STOP_GRACE_MS to end by themselves, so a stop right after QEMU's "completed" loses nothing.
 */
static void migration_stop(struct px_migration *m)
{
	struct px_node *n = m->n;

	migration_unlink(&n->migrations, m);
	m->stopping = true;
	m->next = n->stopped;
	n->stopped = m;
	for (unsigned int i = 0; i < m->nports; i++)
		port_close(&m->ports[i]);
	migration_cut(m, false);
	if (m->conns_active > 0 && xp_timer_add(n->loop, vm_now_ms() + STOP_GRACE_MS,
						stop_grace_expired, m, &m->stop_timer) < 0)
		migration_cut(m, true);
	migration_maybe_finish(m);
}

/* ---- caps: buckets or pacing, node shares ---- */

static const char *cap_note(uint64_t cap)
{
	static char buf[64];
	char r[32];

	if (!cap)
		return "";
	snprintf(buf, sizeof(buf), " cap=%s", vm_format_rate(cap, r, sizeof(r)));
	return buf;
}

/*
 * What a sender is taken to want in a share: unbounded while it is held back, else what it sent
 * in the last second plus room to grow.
 */
static uint64_t share_demand(bool held, uint64_t rate)
{
	uint64_t grow = rate * SHARE_GROWTH_NUM / SHARE_GROWTH_DEN;

	if (held)
		return UINT64_MAX;
	return grow > SHARE_FLOOR ? grow : SHARE_FLOOR;
}

/*
 * Pacing: the migration's limit split max-min fairly among its linked connections. Per-socket
 * paces leave unused what a channel does not send (QEMU hands pages to whichever channel is
 * free, and the main channel carries little), so the sum of paces is the limit times a gain that
 * is corrected once a second from what the migration delivered, while it presses against its
 * limit. The kernel also counts headers against a pace; the gain absorbs that too.
 */
static void migration_pace(struct px_migration *m)
{
	struct px_share_in in[64];
	uint64_t out[64], now = vm_now_ms(), r = vm_rate_get(&m->rate[0], 1000);
	struct px_conn *cs[64];
	unsigned int k = 0;

	if (m->limit != m->pace_limit) {
		/* The last second's rate belongs to the old limit: wait for one at the new one. */
		m->pace_limit = m->limit;
		m->pace_next_ms = now + 1500;
	} else if (m->limit && now >= m->pace_next_ms) {
		m->pace_next_ms = now + 1000;
		if (r * 10 >= m->limit * 7) {
			double g = m->pace_gain * (1.0 + 0.5 * ((double)m->limit / (double)r - 1.0));

			m->pace_gain = g < 0.5 ? 0.5 : g > 2.0 ? 2.0 : g;
		}
	}

	for (struct px_conn *c = m->conns; c && k < ARRAY_SIZE(cs); c = c->next) {
		uint64_t cr;

		if (c->st != C_LINKED)
			continue;
		cr = vm_rate_get(&c->rate[0], 1000);
		cs[k] = c;
		in[k].cap = 0;
		/* Held back: it sends at 90 % of its pace or more. */
		in[k].demand = share_demand(c->pacing && cr * 10 >= c->pacing * 9, cr);
		k++;
	}
	if (m->limit && k)
		px_share((uint64_t)((double)m->limit * m->pace_gain), k, in, out);
	for (unsigned int i = 0; i < k; i++) {
		uint64_t pace = m->limit ? out[i] : 0;

		if (pace != cs[i]->pacing) {
			cs[i]->pacing = pace;
			xp_link_set_pacing(cs[i]->link, pace);
		}
	}
}

static void migration_apply_limit(struct px_migration *m, uint64_t limit)
{
	m->limit = limit;
	if (m->n->conf.shaper == PX_SHAPE_BUCKET) {
		if (xp_bucket_rate(m->bucket) != limit)
			xp_bucket_set_rate(m->bucket, limit);
	} else {
		migration_pace(m);
	}
}

/*
 * Every migration's limit: its own cap, or with a node cap its max-min fair share of it. A
 * migration is taken to want more than it sends while its bucket held it back since the last
 * tick (pacing: while it sends at 90 % of its limit); otherwise it gets what it sent plus room
 * to grow.
 */
static void node_share(struct px_node *n)
{
	uint64_t total = n->conf.node_bandwidth;
	struct px_share_in *in = NULL;
	uint64_t *out = NULL;
	unsigned int k = 0, i = 0;

	for (int l = 0; l < 2; l++)
		for (struct px_migration *m = l ? n->stopped : n->migrations; m; m = m->next)
			k++;
	if (total && k) {
		in = calloc(k, sizeof(*in));
		out = calloc(k, sizeof(*out));
		if (!in || !out) {
			/* Keep the limits of the last tick; the node bucket still holds the sum. */
			free(in);
			free(out);
			return;
		}
	}
	for (int l = 0; l < 2; l++) {
		for (struct px_migration *m = l ? n->stopped : n->migrations; m; m = m->next) {
			uint64_t held = xp_bucket_held(m->bucket), r = vm_rate_get(&m->rate[0], 1000);
			bool wants_more = n->conf.shaper == PX_SHAPE_BUCKET
						  ? held != m->held_seen
						  : m->limit && r * 10 >= m->limit * 9;

			m->held_seen = held;
			if (!total)
				continue;
			in[i].cap = m->cap_lifted ? 0 : m->cap;
			in[i].demand = share_demand(wants_more, r);
			i++;
		}
	}
	if (total && k)
		px_share(total, k, in, out);
	i = 0;
	for (int l = 0; l < 2; l++) {
		for (struct px_migration *m = l ? n->stopped : n->migrations; m; m = m->next) {
			uint64_t own = m->cap_lifted ? 0 : m->cap;

			migration_apply_limit(m, total ? out[i++] : own);
		}
	}
	free(in);
	free(out);
}

static void migration_set_cap(struct px_migration *m, uint64_t cap)
{
	m->cap = cap;
	if (!m->n->conf.node_bandwidth)
		migration_apply_limit(m, m->cap_lifted ? 0 : cap);
}

int px_migration_set_cap(struct px_node *n, const char *key, uint64_t cap, char *err,
			 size_t errlen)
{
	unsigned int found = 0;
	char r[32];

	for (struct px_migration *m = n->migrations; m; m = m->next) {
		if (strcmp(m->key, key))
			continue;
		migration_set_cap(m, cap);
		log_info("migration %s role=%s: cap %s%s", key, role_str(m->role),
			 vm_format_rate(cap, r, sizeof(r)),
			 m->cap_lifted ? " (applies no more: switchover was seen)" : "");
		found++;
	}
	if (!found) {
		snprintf(err, errlen, "unknown migration %.130s", key);
		return -ENOENT;
	}
	/* Shares move at once, not at the next tick. */
	if (n->conf.node_bandwidth)
		node_share(n);
	return 0;
}

void px_node_set_bandwidth(struct px_node *n, uint64_t rate)
{
	char r[32];

	n->conf.node_bandwidth = rate;
	if (n->conf.shaper == PX_SHAPE_BUCKET)
		xp_bucket_set_rate(n->bucket, rate);
	log_info("node cap %s (%s)", vm_format_rate(rate, r, sizeof(r)),
		 px_shaper_str(n->conf.shaper));
	node_share(n);
}

const char *px_shaper_str(enum px_shaper sh)
{
	return sh == PX_SHAPE_PACING ? "pacing" : "bucket";
}

/* Brings a migration's meters up to date; adds its live bytes to node[]. */
static void migration_sample(struct px_migration *m, uint64_t now, uint64_t node[2])
{
	uint64_t mb[2] = { m->bytes[0], m->bytes[1] };
	uint64_t pb[PX_PORTS_MAX][2];

	for (unsigned int i = 0; i < m->nports; i++) {
		pb[i][0] = m->ports[i].bytes[0];
		pb[i][1] = m->ports[i].bytes[1];
	}
	for (struct px_conn *c = m->conns; c; c = c->next) {
		unsigned int pi = (unsigned int)(c->port - m->ports);
		uint64_t b[2];

		if (c->st != C_LINKED)
			continue;
		xp_link_bytes(c->link, b);
		for (int d = 0; d < 2; d++) {
			vm_rate_sample(&c->rate[d], now, b[d]);
			mb[d] += b[d];
			pb[pi][d] += b[d];
			node[d] += b[d];
		}
		if (c->insp && !m->cap_lifted && !m->n->conf.keep_cap_at_switchover &&
		    m->role == PX_ROLE_SOURCE) {
			struct px_insp_stats st;

			px_insp_read(c->insp, &st);
			if (st.switchover) {
				/*
				 * QEMU lifts its own limit here: the guest is stopped, and every
				 * byte still to go adds to its downtime.
				 */
				m->cap_lifted = true;
				if (m->cap || m->n->conf.node_bandwidth)
					log_info("migration %s role=source: switchover seen in the "
						 "stream; its cap is lifted for the final copy",
						 m->key);
				if (!m->n->conf.node_bandwidth)
					migration_apply_limit(m, 0);
			}
		}
	}
	for (int d = 0; d < 2; d++) {
		vm_rate_sample(&m->rate[d], now, mb[d]);
		for (unsigned int i = 0; i < m->nports; i++)
			vm_rate_sample(&m->ports[i].rate[d], now, pb[i][d]);
	}
}

static void node_tick(void *arg)
{
	struct px_node *n = arg;
	uint64_t now = vm_now_ms(), b[2] = { n->bytes_done[0], n->bytes_done[1] };

	n->tick = NULL;
	for (int l = 0; l < 2; l++)
		for (struct px_migration *m = l ? n->stopped : n->migrations; m; m = m->next)
			migration_sample(m, now, b);
	for (int d = 0; d < 2; d++)
		vm_rate_sample(&n->rate[d], now, b[d]);
	if (n->conf.node_bandwidth)
		node_share(n);
	else if (n->conf.shaper == PX_SHAPE_PACING)
		for (struct px_migration *m = n->migrations; m; m = m->next)
			if (m->limit)
				migration_pace(m);
	/* Without a timer the meters stand still; that is all that is lost. */
	(void)xp_timer_add(n->loop, now + TICK_MS, node_tick, n, &n->tick);
}

static struct px_migration *migration_new(struct px_node *n, const char *key, enum px_role role)
{
	struct px_migration *m = calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	m->n = n;
	strcpy(m->key, key);
	m->role = role;
	m->started_ms = vm_now_ms();
	m->pace_gain = 1.0;
	for (unsigned int i = 0; i < PX_PORTS_MAX; i++) {
		m->ports[i].m = m;
		m->ports[i].lfd = -1;
	}
	if (xp_bucket_new(0, &m->bucket) < 0) {
		free(m);
		return NULL;
	}
	return m;
}

/* A migration that never started: nothing was linked, nothing to log. */
static void migration_discard(struct px_migration *m)
{
	xp_bucket_free(m->bucket);
	free(m);
}

static int check_key(struct px_node *n, const char *key, enum px_role role, char *err,
		     size_t errlen)
{
	if (!px_key_valid(key)) {
		snprintf(err, errlen,
			 "invalid key \"%.40s\": use 1 to %d characters of A-Z a-z 0-9 . _ -", key,
			 PX_KEY_MAX);
		return -EINVAL;
	}
	if (n->draining) {
		snprintf(err, errlen, "vmigd is shutting down");
		return -ESHUTDOWN;
	}
	if (find_migration(n, key, role)) {
		snprintf(err, errlen, "migration %s already has a %s listener", key,
			 role_str(role));
		return -EEXIST;
	}
	return 0;
}

static int check_dir_of(const char *path, char *err, size_t errlen)
{
	char dir[sizeof(((struct px_port_info *)0)->path)];
	char *slash;
	struct stat st;

	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (!slash)
		return 0;
	if (slash == dir)
		slash[1] = '\0';
	else
		*slash = '\0';
	if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "directory %s does not exist", dir);
		return -ENOENT;
	}
	return 0;
}

static int check_path(const char *path, char *err, size_t errlen)
{
	int r = xp_unix_path_ok(path);

	if (r == -ENAMETOOLONG) {
		snprintf(err, errlen, "socket path too long (at most %zu bytes): %.60s...",
			 sizeof(((struct px_port_info *)0)->path) - 1, path);
		return r;
	}
	if (r < 0 || path[0] != '/') {
		snprintf(err, errlen, "socket path must be absolute: \"%.60s\"", path);
		return -EINVAL;
	}
	return check_dir_of(path, err, errlen);
}

static int check_ports(unsigned int nports, const uint32_t *ids, char *err, size_t errlen)
{
	if (nports == 0 || nports > PX_PORTS_MAX) {
		snprintf(err, errlen, "give 1 to %d ports", PX_PORTS_MAX);
		return -EINVAL;
	}
	for (unsigned int i = 0; i < nports; i++)
		for (unsigned int j = 0; j < i; j++)
			if (ids[i] == ids[j]) {
				snprintf(err, errlen, "port %u is given twice", ids[i]);
				return -EINVAL;
			}
	return 0;
}

int px_target_start(struct px_node *n, const char *key, unsigned int nports,
		    const struct px_port_info *ports, uint64_t cap, struct px_portmap *out,
		    char *err, size_t errlen)
{
	struct px_portmap t = { 0 };
	struct px_migration *m;
	uint32_t ids[PX_PORTS_MAX] = { 0 };
	char list[PX_PORTS_MAX * 120] = "";
	int r;

	r = check_key(n, key, PX_ROLE_TARGET, err, errlen);
	if (r < 0)
		return r;
	for (unsigned int i = 0; i < nports && i < PX_PORTS_MAX; i++)
		ids[i] = ports[i].id;
	r = check_ports(nports, ids, err, errlen);
	if (r < 0)
		return r;
	for (unsigned int i = 0; i < nports; i++) {
		r = check_path(ports[i].path, err, errlen);
		if (r < 0)
			return r;
	}
	m = migration_new(n, key, PX_ROLE_TARGET);
	if (!m)
		goto fail_nomem;
	m->nports = nports;
	migration_set_cap(m, cap);
	for (unsigned int i = 0; i < nports; i++) {
		struct px_port *p = &m->ports[i];
		size_t used = strlen(list);

		p->id = ports[i].id;
		strcpy(p->path, ports[i].path);
		r = px_order_new(&tgt_order_ops, p, ORDER_MAX_PARKED, n->conf.order_timeout_ms,
				 &p->order);
		if (r < 0)
			goto fail_free;
		t.ports[i] = p->id;
		snprintf(list + used, sizeof(list) - used, "%s%u=%s", i ? "," : "", p->id, p->path);
	}
	strcpy(t.key, key);
	strcpy(t.address, n->advertise);
	t.port = xp_addr_port(&n->bound);
	t.nports = nports;
	m->next = n->migrations;
	n->migrations = m;
	log_info("migration %s role=target start ports=%s%s", key, list, cap_note(cap));
	*out = t;
	return 0;

fail_free:
	for (unsigned int i = 0; i < nports; i++)
		px_order_free(m->ports[i].order);
	migration_discard(m);
fail_nomem:
	snprintf(err, errlen, "out of memory");
	return -ENOMEM;
}

static int make_socket_path(const char *dir, const char *key, uint32_t port, char *buf, size_t len)
{
	int r = port ? snprintf(buf, len, "%s/migrationproxy/%s-%u-source.sock", dir, key, port)
		     : snprintf(buf, len, "%s/migrationproxy/%s-source.sock", dir, key);

	return r < (int)len ? 0 : -ENAMETOOLONG;
}

int px_source_start(struct px_node *n, const struct px_portmap *t, const char *dir,
		    unsigned int delay_first_ms, uint64_t cap, struct px_port_info *out, char *err,
		    size_t errlen)
{
	char sub[4096];
	struct px_migration *m;
	struct stat st;
	int r;

	r = check_key(n, t->key, PX_ROLE_SOURCE, err, errlen);
	if (r < 0)
		return r;
	r = check_ports(t->nports, t->ports, err, errlen);
	if (r < 0)
		return r;
	if (dir[0] != '/' || stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "directory %.200s does not exist (give an absolute path)",
			 dir);
		return -ENOENT;
	}
	if (snprintf(sub, sizeof(sub), "%s/migrationproxy", dir) >= (int)sizeof(sub)) {
		snprintf(err, errlen, "directory path too long");
		return -ENAMETOOLONG;
	}
	if (mkdir(sub, 0755) < 0 && errno != EEXIST) {
		r = -errno;
		snprintf(err, errlen, "cannot create %.200s: %s", sub, strerror(errno));
		return r;
	}
	m = migration_new(n, t->key, PX_ROLE_SOURCE);
	if (!m) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r = xp_addr_from_host(t->address, t->port, &m->peer);
	if (r < 0) {
		snprintf(err, errlen, "bad target address %s", t->address);
		goto fail;
	}
	xp_addr_format(&m->peer, m->peer_str, sizeof(m->peer_str));
	m->delay_first_ms = delay_first_ms;
	m->nports = t->nports;
	migration_set_cap(m, cap);
	for (unsigned int i = 0; i < t->nports; i++) {
		struct px_port *p = &m->ports[i];

		p->id = t->ports[i];
		r = make_socket_path(dir, t->key, p->id, p->path, sizeof(p->path));
		if (r < 0) {
			snprintf(err, errlen,
				 "socket path too long (at most %zu bytes) under %.60s",
				 sizeof(p->path) - 1, dir);
			goto fail;
		}
		r = xp_unix_listen(p->path, 128, &p->lfd);
		if (r < 0) {
			snprintf(err, errlen, "cannot listen on %s: %s", p->path,
				 r == -EEXIST ? "a file that is not a socket is in the way"
					      : strerror(-r));
			goto fail;
		}
		r = xp_watch_add(n->loop, p->lfd, EPOLLIN, src_accept, p, &p->w);
		if (r < 0) {
			snprintf(err, errlen, "out of memory");
			goto fail;
		}
		out[i].id = p->id;
		strcpy(out[i].path, p->path);
	}
	m->next = n->migrations;
	n->migrations = m;
	log_info("migration %s role=source start ports=%u%s target=%s sockets=%s%s%s", t->key,
		 m->ports[0].id, m->nports > 1 ? ",..." : "", m->peer_str, m->ports[0].path,
		 m->nports > 1 ? ",..." : "", cap_note(cap));
	return 0;

fail:
	for (unsigned int i = 0; i < m->nports; i++)
		port_close(&m->ports[i]);
	migration_discard(m);
	return r;
}

static int stop_role(struct px_node *n, const char *key, enum px_role role, char *err,
		     size_t errlen)
{
	struct px_migration *m = find_migration(n, key, role);

	if (!m) {
		snprintf(err, errlen, "unknown migration %.130s: no %s listener with that key", key,
			 role_str(role));
		return -ENOENT;
	}
	migration_stop(m);
	return 0;
}

int px_target_stop(struct px_node *n, const char *key, char *err, size_t errlen)
{
	return stop_role(n, key, PX_ROLE_TARGET, err, errlen);
}

int px_source_stop(struct px_node *n, const char *key, char *err, size_t errlen)
{
	return stop_role(n, key, PX_ROLE_SOURCE, err, errlen);
}

static void rates_of(const struct vm_rate r[2], struct px_rates *out)
{
	out->tx_1s = vm_rate_get(&r[0], 1000);
	out->tx_10s = vm_rate_get(&r[0], 10000);
	out->rx_1s = vm_rate_get(&r[1], 1000);
	out->rx_10s = vm_rate_get(&r[1], 10000);
}

void px_node_foreach(struct px_node *n, px_migration_fn fn, void *arg)
{
	for (struct px_migration *m = n->migrations; m; m = m->next) {
		struct px_conn_info *ci =
			calloc(m->conns_active ? m->conns_active : 1, sizeof(*ci));
		struct px_migration_info mi = {
			.key = m->key,
			.role = m->role,
			.nports = m->nports,
			.peer = m->role == PX_ROLE_SOURCE ? m->peer_str : NULL,
			.started_ms = m->started_ms,
			.conns_total = m->conns_total,
			.conns_active = m->conns_active,
			.conns_failed = m->conns_failed,
			.conns_reordered = m->conns_reordered,
			.bytes_tx = m->bytes[0],
			.bytes_rx = m->bytes[1],
			.state = m->failed ? "failed" : "active",
			.error = m->failed ? m->error : NULL,
			.cap = m->cap,
			.limit = m->limit,
			.cap_lifted = m->cap_lifted,
			.mode = n->conf.tls ? "tls" : "plain",
			.inspected = n->conf.inspect,
			.insp = m->insp_done,
		};
		uint64_t shaped_ns = m->shaped_ns_done;

		rates_of(m->rate, &mi.rate);
		for (unsigned int i = 0; i < m->nports; i++) {
			struct px_port_info *pi = &mi.ports[i];

			pi->id = m->ports[i].id;
			strcpy(pi->path, m->ports[i].path);
			pi->bytes_tx = m->ports[i].bytes[0];
			pi->bytes_rx = m->ports[i].bytes[1];
			pi->conns_total = m->ports[i].conns_total;
			rates_of(m->ports[i].rate, &pi->rate);
		}
		for (struct px_conn *c = m->conns; c; c = c->next) {
			struct px_conn_info *i =
				ci && mi.nconns < m->conns_active ? &ci[mi.nconns++] : NULL;
			struct px_port_info *pi = &mi.ports[c->port - m->ports];
			uint64_t b[2] = { 0, 0 }, sn = 0;
			struct px_insp_stats st;

			pi->conns_active++;
			if (c->st == C_LINKED) {
				xp_link_bytes(c->link, b);
				sn = xp_link_shaped_ns(c->link);
				shaped_ns += sn;
				mi.bytes_tx += b[0];
				mi.bytes_rx += b[1];
				pi->bytes_tx += b[0];
				pi->bytes_rx += b[1];
			}
			if (!strncmp(c->tls_crypto, "ktls", 4))
				mi.mode = "ktls";
			if (c->insp) {
				px_insp_read(c->insp, &st);
				insp_fold(&mi.insp, &st, true);
			}
			if (!i)
				continue;
			i->port = c->port->id;
			i->seq = c->seq;
			i->state = state_names[c->st];
			i->tls = c->tls_version[0] ? c->tls_version : NULL;
			i->cipher = c->tls_cipher;
			i->crypto = c->tls_crypto;
			i->resumed = c->tls_resumed;
			i->bytes_tx = b[0];
			i->bytes_rx = b[1];
			rates_of(c->rate, &i->rate);
			i->shaped_ms = sn / 1000000;
			i->pacing = c->pacing;
			i->inspected = c->insp != NULL;
			if (c->insp)
				i->insp = st;
		}
		mi.shaped_ms = shaped_ns / 1000000;
		mi.conns = ci;
		fn(&mi, arg);
		free(ci);
	}
}

void px_node_info(struct px_node *n, struct px_node_info *out)
{
	struct px_node_info ni = {
		.bandwidth = n->conf.node_bandwidth,
		.shaper = n->conf.shaper,
		.inspect = n->conf.inspect,
		.bytes_tx = n->bytes_done[0],
		.bytes_rx = n->bytes_done[1],
		.conns_total = n->conns_total,
	};

	for (int l = 0; l < 2; l++) {
		for (struct px_migration *m = l ? n->stopped : n->migrations; m; m = m->next) {
			ni.migrations += !l;
			ni.conns_active += m->conns_active;
			for (struct px_conn *c = m->conns; c; c = c->next) {
				uint64_t b[2];

				if (c->st != C_LINKED)
					continue;
				xp_link_bytes(c->link, b);
				ni.bytes_tx += b[0];
				ni.bytes_rx += b[1];
			}
		}
	}
	rates_of(n->rate, &ni.rate);
	*out = ni;
}

/* ---- node ---- */

unsigned int px_node_active_conns(const struct px_node *n)
{
	unsigned int k = n->nunbound;

	for (struct px_migration *m = n->migrations; m; m = m->next)
		k += m->conns_active;
	for (struct px_migration *m = n->stopped; m; m = m->next)
		k += m->conns_active;
	return k;
}

static void node_check_drained(struct px_node *n)
{
	void (*done)(void *arg) = n->drain_done;

	if (!n->draining || !done || px_node_active_conns(n) > 0)
		return;
	n->drain_done = NULL;
	xp_timer_del(n->drain_timer);
	n->drain_timer = NULL;
	done(n->drain_arg);
}

static void drain_expired(void *arg)
{
	struct px_node *n = arg;

	n->drain_timer = NULL;
	log_warn("drain timeout: cutting %u connections still in flight", px_node_active_conns(n));
	while (n->unbound)
		conn_free(n->unbound);
	for (struct px_migration *m = n->migrations; m; m = m->next)
		migration_cut(m, true);
	node_check_drained(n);
}

void px_node_drain(struct px_node *n, unsigned int timeout_s, void (*done)(void *arg), void *arg)
{
	n->draining = true;
	n->drain_done = done;
	n->drain_arg = arg;
	xp_watch_del(n->lw);
	n->lw = NULL;
	if (n->lfd >= 0)
		close(n->lfd);
	n->lfd = -1;
	for (struct px_migration *m = n->migrations; m; m = m->next)
		for (unsigned int i = 0; i < m->nports; i++)
			port_close(&m->ports[i]);
	if (px_node_active_conns(n) > 0)
		log_info("draining: %u connections in flight, waiting up to %u s",
			 px_node_active_conns(n), timeout_s);
	if (xp_timer_add(n->loop, vm_now_ms() + timeout_s * 1000ull, drain_expired, n,
			 &n->drain_timer) < 0)
		drain_expired(n);
	else
		node_check_drained(n);
}

int px_node_new(struct xp_loop *loop, const struct px_config *conf, struct px_node **ret)
{
	struct xp_pool_conf pc = {
		.threads = conf->threads,
		.slots = conf->slots,
		.pipe_size = conf->pipe_size,
		.path = conf->copy_path ? XP_PATH_COPY : XP_PATH_SPLICE,
	};
	struct px_node *n;
	int r;

	n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->loop = loop;
	n->conf = *conf;
	n->lfd = -1;
	r = xp_bucket_new(conf->shaper == PX_SHAPE_BUCKET ? conf->node_bandwidth : 0, &n->bucket);
	if (r < 0)
		goto fail;
	r = xp_pool_new(&pc, pool_done, n, &n->pool);
	if (r < 0) {
		log_err("cannot start %u data-path workers (io_uring): %s", conf->threads,
			strerror(-r));
		goto fail;
	}
	r = xp_watch_add(loop, xp_pool_event_fd(n->pool), EPOLLIN, pool_ready, n->pool, &n->pool_w);
	if (r < 0)
		goto fail;
	r = xp_tcp_listen(&conf->listen, 1024, &n->lfd, &n->bound);
	if (r < 0) {
		char a[80] = "?";

		xp_addr_format(&conf->listen, a, sizeof(a));
		log_err("cannot listen on %s: %s", a, strerror(-r));
		goto fail;
	}
	xp_addr_format(&n->bound, n->listen_str, sizeof(n->listen_str));
	r = xp_watch_add(loop, n->lfd, EPOLLIN, tgt_accept, n, &n->lw);
	if (r < 0)
		goto fail;
	if (conf->advertise[0]) {
		strcpy(n->advertise, conf->advertise);
	} else if (!xp_addr_is_wildcard(&n->bound)) {
		xp_addr_host(&n->bound, n->advertise, sizeof(n->advertise));
	} else if (xp_addr_guess_public(n->advertise, sizeof(n->advertise)) < 0) {
		log_warn("no non-loopback address found; advertising 127.0.0.1 (use --advertise)");
		strcpy(n->advertise, "127.0.0.1");
	}
	r = xp_timer_add(loop, vm_now_ms() + TICK_MS, node_tick, n, &n->tick);
	if (r < 0)
		goto fail;
	*ret = n;
	return 0;

fail:
	px_node_free(n);
	return r;
}

void px_node_free(struct px_node *n)
{
	if (!n)
		return;
	/* Joining the workers closes every link's sockets. */
	xp_watch_del(n->pool_w);
	xp_pool_free(n->pool);
	n->pool = NULL;
	n->drain_done = NULL;
	while (n->unbound)
		conn_free(n->unbound);
	/* Every migration still here gets its stop line; its links are gone with the pool. */
	for (int stopped = 0; stopped < 2; stopped++) {
		struct px_migration **head = stopped ? &n->stopped : &n->migrations;

		while (*head) {
			struct px_migration *m = *head;

			m->guard++;
			for (unsigned int i = 0; i < m->nports; i++) {
				px_order_free(m->ports[i].order);
				m->ports[i].order = NULL;
			}
			while (m->conns) {
				if (m->conns->st == C_LINKED)
					m->conns_cut++;
				conn_free(m->conns);
			}
			migration_finish(m);
		}
	}
	xp_timer_del(n->drain_timer);
	xp_timer_del(n->tick);
	xp_watch_del(n->lw);
	if (n->lfd >= 0)
		close(n->lfd);
	xp_bucket_free(n->bucket);
	free(n);
}

const char *px_node_listen_str(const struct px_node *n)
{
	return n->listen_str;
}

const char *px_node_advertise(const struct px_node *n)
{
	return n->advertise;
}

const char *px_node_data_path(const struct px_node *n)
{
	if (n->conf.tls)
		return xp_tls_ktls_enabled(n->conf.tls) ? "io_uring+ktls" : "io_uring+openssl";
	return n->conf.copy_path ? "io_uring+copy" : "io_uring+splice";
}

unsigned int px_node_threads(const struct px_node *n)
{
	return xp_pool_threads(n->pool);
}

unsigned int px_node_migrations(const struct px_node *n)
{
	unsigned int k = 0;

	for (struct px_migration *m = n->migrations; m; m = m->next)
		k++;
	return k;
}
