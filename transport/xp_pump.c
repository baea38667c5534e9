// SPDX-License-Identifier: Apache-2.0
/* One direction of a link, on its worker: splice(2), read/write, or OpenSSL where the node hop is
 * TLS (kTLS transmit splices), with the tap's planning, the shaper's tokens and the half-close.
 * Not the rings, inboxes or link lifecycle: xp_pool.c. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util.h"
#include "xp_bucket.h"
#include "xp_pool_priv.h"
#include "xp_tls.h"
#include "xp_zchunk.h"

/* Bytes one direction may move before it yields to the other links of its worker. */
#define PUMP_BUDGET_PIPES 4
/* A shaped direction never sleeps longer than this, so a raised cap is seen at once. */
#define SHAPE_WAIT_MAX_NS (20 * 1000000ull)

void xp_pump_arm_poll(struct xp_worker *w, struct xp_pump *p, int fd, unsigned int mask)
{
	struct io_uring_sqe *sqe = get_sqe(w);

	io_uring_prep_poll_add(sqe, fd, mask);
	io_uring_sqe_set_data64(sqe, UD(OP_POLL, p->dir, p->link->idx));
	p->armed = true;
	p->armed_side = fd == p->link->fd[1];
	p->link->inflight++;
}

#define arm_poll xp_pump_arm_poll

/* Direction 0 of a resumable link (its destination is the framed node hop), direction 1 (its
 * source is). */
static bool framed_out(const struct xp_pump *p)
{
	return p->dir == 0 && framed(p->link);
}

static bool framed_in(const struct xp_pump *p)
{
	return p->dir == 1 && framed(p->link);
}

/* Waits for tokens: a one-shot relative TIMEOUT; its completion runs the pump again. */
static void arm_timer(struct xp_worker *w, struct xp_pump *p, uint64_t ns)
{
	struct io_uring_sqe *sqe = get_sqe(w);

	if (ns > SHAPE_WAIT_MAX_NS)
		ns = SHAPE_WAIT_MAX_NS;
	p->ts.tv_sec = (long long)(ns / 1000000000ull);
	p->ts.tv_nsec = (long long)(ns % 1000000000ull);
	io_uring_prep_timeout(sqe, &p->ts, 0, 0);
	io_uring_sqe_set_data64(sqe, UD(OP_TIMER, p->dir, p->link->idx));
	p->armed = p->timer = true;
	p->link->inflight++;
	atomic_fetch_add_explicit(&p->shaped_ns, ns, memory_order_relaxed);
}

/* Room left to take bytes from the source. */
static size_t pump_room(const struct xp_pump *p)
{
	if (framed_out(p))
		return xp_frame_room(p);
	return p->buf ? p->cap - p->head - p->held : p->cap - p->held;
}

/* A TLS call's result in read(2)'s terms: n >= 0, or -1 with errno. */
static ssize_t tls_ret(ssize_t r)
{
	if (r >= 0)
		return r;
	errno = (int)-r;
	return -1;
}

/* Takes at most len bytes from the source. */
static ssize_t pump_fill(struct xp_pump *p, int src, size_t len)
{
	switch (p->kind) {
	case PUMP_SPLICE:
		return splice(src, NULL, p->pipe[1], NULL, len, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
	case PUMP_TLS_RX: {
		ssize_t r = xp_tls_read(p->link->tls, p->buf + p->head + p->held, len, &p->want);

		/* A stock peer (Go) ends with a bare FIN, which Go itself reads as a clean end. */
		return tls_ret(r == -EPIPE && p->link->opts.raw ? 0 : r);
	}
	default:
		return read(src, p->buf + p->head + p->held, len);
	}
}

/*
 * Splice and a tap: the tap sees what it asks to see through MSG_PEEK (the bytes stay queued on
 * the socket) and lets the rest pass unseen. Returns how much the next fill may take (> 0), or a
 * peek's result in read(2)'s terms (0: end of stream; -1: errno) when nothing may be taken yet.
 */
static ssize_t tap_plan_splice(struct xp_pump *p, int src, size_t len)
{
	size_t want = 0;
	ssize_t n;

	if (p->tap_seen == 0 && p->tap_skip == 0) {
		p->tap_skip = p->tap->plan(p->tap_ctx, &want);
		if (p->tap_skip == 0) {
			if (want > TAP_PEEK_MAX)
				want = TAP_PEEK_MAX;
			if (want > len)
				want = len;
			n = recv(src, p->peek, want ? want : 1, MSG_PEEK | MSG_DONTWAIT);
			if (n <= 0)
				return n;
			p->tap->feed(p->tap_ctx, p->peek, (size_t)n);
			p->tap_seen = (size_t)n;
			/* Page data right after a header goes in the same splice. */
			p->tap_skip = p->tap->plan(p->tap_ctx, &want);
		}
	}
	/* tap_skip is UINT64_MAX once the tap has stopped looking: the sum must not wrap. */
	if (p->tap_skip < len && p->tap_seen + p->tap_skip < len)
		len = p->tap_seen + p->tap_skip;
	return (ssize_t)len;
}

/*
 * Splice with a digest: the bytes are read with MSG_PEEK into the worker's buffer first, then at
 * most those are spliced and the ones that moved are digested. Returns what pump_fill() returns.
 */
static ssize_t digest_fill_splice(struct xp_worker *w, struct xp_pump *p, int src, size_t len)
{
	ssize_t k, n;

	if (len > DIGEST_PEEK_MAX)
		len = DIGEST_PEEK_MAX;
	k = recv(src, w->dg_peek, len, MSG_PEEK | MSG_DONTWAIT);
	if (k <= 0)
		return k;
	n = pump_fill(p, src, (size_t)k);
	if (n > 0)
		vm_digest_update(p->dg, w->dg_peek, (size_t)n);
	return n;
}

/* The most a direction whose local peer closed reads on, undelivered, for its digest. */
#define DIGEST_DRAIN_MAX (64u << 20)

/*
 * The local peer closed while this direction still had bytes for it (QEMU's destination closes
 * multifd channels so). With a digest, what already waits on the source is read too, counted
 * undelivered, so that the digest covers the stream up to its end where that has arrived; the
 * direction is marked partial where it had not.
 */
static void digest_drain(struct xp_worker *w, struct xp_pump *p, int src)
{
	struct pool_link *l = p->link;
	size_t total = 0;
	ssize_t n;

	if (!p->dg || p->eof)
		return;
	while (total < DIGEST_DRAIN_MAX) {
		if (p->kind == PUMP_TLS_RX)
			n = tls_ret(xp_tls_read(l->tls, w->dg_peek, DIGEST_PEEK_MAX, &p->want));
		else
			n = read(src, w->dg_peek, DIGEST_PEEK_MAX);
		if (n == 0)
			return;
		if (n < 0)
			break;
		vm_digest_update(p->dg, w->dg_peek, (size_t)n);
		l->res.undelivered += (uint64_t)n;
		total += (size_t)n;
	}
	l->res.digest_partial[p->dir] = true;
}

/* After a fill of n bytes: what the tap saw moves on, what it did not see is counted. */
static void tap_filled(struct xp_pump *p, const uint8_t *at, size_t n)
{
	size_t seen;

	if (p->kind != PUMP_SPLICE) {
		p->tap->feed(p->tap_ctx, at, n);
		return;
	}
	seen = n < p->tap_seen ? n : p->tap_seen;
	p->tap_seen -= seen;
	if (n > seen) {
		p->tap->feed(p->tap_ctx, NULL, n - seen);
		p->tap_skip -= n - seen;
	}
}

/* Ciphertext a TLS_TX pump has made but not yet written to the socket (and a frame header). */
static size_t pump_unsent(const struct xp_pump *p)
{
	if (framed_out(p))
		return xp_frame_unsent(p);
	return p->kind == PUMP_TLS_TX ? xp_tls_unsent(p->link->tls) : 0;
}

/*
 * TLS transmit: encrypt held plaintext into the session's batch, full records, and write the
 * batch out in one write(2), until the socket is full or nothing is held. Returns plaintext
 * taken, 0 when it only emptied the batch, or -1 with errno.
 */
static ssize_t tls_tx_drain(struct xp_pump *p)
{
	struct xp_tls_sess *s = p->link->tls;
	size_t head = p->head, held = p->held, took = 0;
	ssize_t n = 0;
	int r;

	while ((r = xp_tls_flush(s, &p->want)) == 0 && held > 0) {
		while (held > 0 && (n = xp_tls_write(s, p->buf + head, held, &p->want)) > 0) {
			head += (size_t)n;
			held -= (size_t)n;
			took += (size_t)n;
		}
		if (n < 0 && n != -EAGAIN) {
			r = (int)n;
			break;
		}
	}
	p->head = held == 0 ? 0 : head;
	if (took > 0 || r == 0)
		return (ssize_t)took;
	errno = -r;
	return -1;
}

static ssize_t pump_drain(struct xp_pump *p, int dst)
{
	ssize_t n;

	switch (p->kind) {
	case PUMP_SPLICE:
		return splice(p->pipe[0], NULL, dst, NULL, p->held,
			      SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
	case PUMP_TLS_TX:
		return tls_tx_drain(p);
	default:
		n = write(dst, p->buf + p->head, p->held);
		break;
	}
	if (n > 0)
		p->head = (size_t)n == p->held ? 0 : p->head + n;
	return n;
}

/*
 * Whether the local peer closed after everything it sent was read: EOF and nothing queued. A
 * unix socket reports a peer that closed with bytes of ours unread as one ECONNRESET, only once
 * its queue is empty; whichever direction asks first gets it, so it counts here too.
 */
static bool local_peer_ended(int fd)
{
	char c;
	ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);

	return n == 0 || (n < 0 && errno == ECONNRESET);
}

/* The end of one direction: close_notify first on TLS, then the TCP half-close. */
static int pump_finish(struct xp_pump *p, int dst)
{
	struct xp_tls_sess *s = p->link->tls;
	int r;

	/* Also when kTLS carries this direction by splice: the alert goes through OpenSSL. */
	while (p->dir == 0 && s) {
		if (!p->notified) {
			r = xp_tls_shutdown(s, &p->want);
			/* A full batch makes room by flushing; a full socket waits. */
			if (r < 0 && (r != -EAGAIN || !xp_tls_unsent(s)))
				return r;
			p->notified = r == 0;
		}
		r = xp_tls_flush(s, &p->want);
		if (r < 0)
			return r;
		if (p->notified)
			break;
	}
	/* ENOTCONN: the peer is already gone; the other direction will tell. */
	if (shutdown(dst, SHUT_WR) < 0 && errno != ENOTCONN)
		return -errno;
	return 0;
}

/*
 * What a blocked call waits for: on the TLS side (a TLS_RX pump's source, a TLS_TX pump's
 * destination) whatever OpenSSL asked for, elsewhere the plain event.
 */
static unsigned int wait_mask(const struct xp_pump *p, bool tls_side, unsigned int plain)
{
	if (!tls_side)
		return plain;
	return p->want == XP_TLS_WANT_WRITE ? POLLOUT : POLLIN | POLLRDHUP;
}

/* What one round of pump_run found. */
struct pump_round {
	bool progress, src_blocked, dst_blocked, throttled, keep_full;
	uint64_t wait_ns;	/* with throttled: until the shaper has tokens again */
};

/*
 * Direction 1, a ZDATA frame open: its chunk, read as it comes and decoded whole into the buffer
 * at at (in discard mode, dropped). 1: go on taking, 0: stop (r says why, or there is no room
 * for a whole chunk until the local socket takes what is held), or -errno.
 */
static int take_chunk(struct xp_worker *w, struct xp_pump *p, int src, uint8_t *at,
		      struct pump_round *r)
{
	ssize_t n;

	if (!p->fin.discard && pump_room(p) < XP_ZCHUNK_MAX)
		return 0;
	n = xp_frame_z_read(w, p, src, p->fin.discard ? NULL : at);
	if (n < 0 && errno == EAGAIN) {
		r->src_blocked = true;
		return 0;
	}
	if (n < 0)
		return -errno;
	r->progress = true;
	if (n > 0) {
		if (p->dg)
			vm_digest_update(p->dg, at, (size_t)n);
		if (p->tap)
			tap_filled(p, at, (size_t)n);
		p->held += (size_t)n;
	} else if (p->fin.discard) {
		xp_frame_ack(w, p->link);
	}
	return 1;
}

/*
 * Fills the pump from src as far as the shaper, the tap and src allow, saying in r what stopped
 * it. TLS hands out one record per read: several are gathered before one write(2). Returns 0,
 * or -errno on src's error.
 */
static int pump_take(struct xp_worker *w, struct xp_pump *p, int src, struct pump_round *r)
{
	struct pool_link *l = p->link;
	ssize_t n;

	while (!p->eof && pump_room(p) > 0) {
		size_t len = pump_room(p), grant = 0;
		uint8_t *at = p->buf ? p->buf + p->head + p->held : NULL;

		if (framed_in(p)) {
			/* the next DATA frame's payload, and no further */
			ssize_t open = xp_frame_in_open(w, p, src, len);

			if (open == 0) {
				p->eof = true;
				r->progress = true;
				break;
			}
			if (open < 0 && errno == EAGAIN) {
				r->src_blocked = true;
				break;
			}
			if (open < 0)
				return -errno;
			if (p->fin.zdata) {
				int k = take_chunk(w, p, src, at, r);

				if (k <= 0)
					return k;
				continue;
			}
			if (p->fin.discard) {
				n = xp_frame_discard(w, p, src, (size_t)open);
				if (n < 0 && errno == EAGAIN) {
					r->src_blocked = true;
					break;
				}
				if (n < 0)
					return -errno;
				r->progress = true;
				xp_frame_ack(w, l);
				continue;
			}
			len = (size_t)open;
		}
		if (p->shaped) {
			grant = xp_bucket_take(p->bucket, len, vm_now_ns(), &r->wait_ns);
			if (grant == 0) {
				r->throttled = true;
				break;
			}
			len = grant;
		}
		ssize_t lim = p->tap && p->kind == PUMP_SPLICE
				      ? tap_plan_splice(p, src, len)
				      : (ssize_t)len;

		if (lim <= 0)
			n = lim;
		else if (p->dg && p->kind == PUMP_SPLICE)
			n = digest_fill_splice(w, p, src, (size_t)lim);
		else
			n = pump_fill(p, src, (size_t)lim);
		if (n > 0 && p->dg && p->kind != PUMP_SPLICE)
			vm_digest_update(p->dg, at, (size_t)n);
		if (grant > (n > 0 ? (size_t)n : 0))
			xp_bucket_refund(p->bucket, grant - (n > 0 ? (size_t)n : 0));
		if (n > 0) {
			if (p->tap)
				tap_filled(p, at, (size_t)n);
			p->held += n;
			r->progress = true;
			if (framed_in(p))
				xp_frame_in_took(p, (size_t)n);
			else if (framed_out(p) && p->peer_gone)
				return -ESHUTDOWN; /* QEMU still migrates to one that is gone */
			else if (framed_out(p))
				xp_frame_filled(p, (size_t)n);
			if (p->kind == PUMP_TLS_RX && pump_room(p) >= TLS_RECORD)
				continue;
			/*
			 * The tap ended the splice at a packet boundary, not the socket:
			 * fill on, so the pipe still goes out in one piece.
			 */
			if (p->tap && p->kind == PUMP_SPLICE && (size_t)lim < len &&
			    n == lim && pump_room(p) > 0)
				continue;
		} else if (n == 0 && framed_in(p)) {
			/* the node hop ended inside a frame: it failed, whoever closed it */
			return -ECONNRESET;
		} else if (n == 0) {
			p->eof = true;
			r->progress = true;
		} else if (errno == EAGAIN) {
			r->src_blocked = true;
		} else if (errno == ECONNRESET && !framed_in(p) &&
			   (l->p[p->dir ^ 1].done || p->dir == 0)) {
			/*
			 * The peer closed with bytes of ours unread: that is its end of
			 * stream. Either we had delivered everything and half-closed, or
			 * it is the local peer, which can close at any time (QEMU's
			 * destination ends multifd channels so, with the last packets
			 * in its queue). A local close with nothing unread reads as a
			 * plain EOF, so this adds no case; what the other direction
			 * still holds becomes undelivered when it writes.
			 */
			p->eof = true;
			l->res.reset_after_eof = true;
			r->progress = true;
		} else if (errno != EINTR) {
			return -errno;
		}
		break;
	}
	return 0;
}

/*
 * Direction 0 of a resumable link waits for an ACK to free what it keeps: an ACK (read by
 * direction 1) queues it again. The PING that asks for one may wait for room on the socket.
 */
static void park(struct xp_worker *w, struct xp_pump *p, int dst)
{
	xp_frame_park(w, p);
	if (pump_unsent(p) > 0) {
		p->wait_ack = false;
		arm_poll(w, p, dst, wait_mask(p, p->kind == PUMP_TLS_TX, POLLOUT));
	}
}

/*
 * A resumable link's direction at its end of stream, all of it moved. Direction 0: END, then
 * every byte acknowledged. Direction 1 (END read, all delivered): the local half-close, the
 * last ACK, and from then on the ACKs that still come for direction 0. What pump_run returns.
 */
static int framed_end(struct xp_worker *w, struct xp_pump *p, int src, int dst,
		      unsigned int *side)
{
	int r;

	if (p->dir == 0) {
		r = xp_frame_finish_out(w, p, dst);
		if (r == -EAGAIN) {
			arm_poll(w, p, dst, wait_mask(p, p->kind == PUMP_TLS_TX, POLLOUT));
			return 0;
		}
		if (r < 0) {
			*side = 1;
			return r;
		}
		p->done = r == 0;
		return 0;
	}
	if (!p->fin.local_done) {
		r = pump_finish(p, dst);
		if (r < 0) {
			*side = 0;
			return r;
		}
		p->fin.local_done = true;
	}
	if (!p->final_acked && xp_frame_finish_in(w, p) == -EAGAIN) {
		arm_poll(w, p, src, POLLIN | POLLRDHUP | POLLOUT);
		return 0;
	}
	r = xp_frame_in_control(w, p);
	if (r < 0)
		*side = 1;
	return r;
}

/*
 * Moves bytes for one direction until both ends would block or the budget is spent.
 * Returns 1 when it stopped on the budget (run it again soon), 0 when it is waiting on a poll or
 * finished, -errno on a socket error, with the failing socket's index in *side.
 */
static int pump_run(struct xp_worker *w, struct xp_pump *p, unsigned int *side)
{
	struct pool_link *l = p->link;
	int src = l->fd[p->dir], dst = l->fd[p->dir ^ 1];
	size_t moved = 0, budget = PUMP_BUDGET_PIPES * p->cap;
	struct pump_round rd = { 0 };
	int r;

	while (moved < budget) {
		ssize_t n;

		rd = (struct pump_round){ 0 };
		r = pump_take(w, p, src, &rd);
		if (r < 0) {
			/* ESHUTDOWN: the far side's QEMU closed (its vmigd's GONE) */
			*side = r == -ESHUTDOWN ? 1 : p->dir;
			return r;
		}
		if (p->held > 0 || pump_unsent(p) > 0) {
			n = framed_out(p) ? xp_frame_send(w, p, dst) : pump_drain(p, dst);
			if (n == 0) {
				/* TLS: only the batch went out (or, framed, an ACK). */
				rd.progress = true;
			} else if (n > 0) {
				uint64_t b = atomic_load_explicit(&p->bytes, memory_order_relaxed);

				/* framed: sent rewinds at a resumption; the figure counts each
				 * byte once */
				if (!framed_out(p))
					p->held -= n;
				b = framed_out(p) ? (p->sent > b ? p->sent : b) : b + n;
				moved += n;
				atomic_store_explicit(&p->bytes, b, memory_order_relaxed);
				rd.progress = true;
				if (framed_in(p))
					xp_frame_ack(w, l);
			} else if (n < 0 && errno == EAGAIN) {
				rd.dst_blocked = true;
			} else if (n < 0 && errno == ENOBUFS && framed_out(p)) {
				/* what is left is not kept yet: an ACK must make room */
				rd.keep_full = true;
			} else if (n < 0 && (errno == EPIPE || errno == ECONNRESET) &&
				   framed_in(p) && local_peer_ended(dst)) {
				/* framed: what still comes is read and acknowledged, so that the
				 * peer's direction completes */
				l->res.undelivered += p->held;
				xp_frame_drop_rest(p);
				rd.progress = true;
				continue;
			} else if (n < 0 && (errno == EPIPE || errno == ECONNRESET) &&
				   p->dir == 1 && local_peer_ended(dst)) {
				/*
				 * QEMU closed its socket after sending us everything it had (its
				 * destination closes multifd channels this way once the migration
				 * is complete): what it did not read, it did not want.
				 */
				l->res.undelivered += p->held;
				p->held = 0;
				digest_drain(w, p, src);
				p->eof = p->done = true;
				return 0;
			} else if (n < 0 && errno != EINTR) {
				*side = p->dir ^ 1;
				return -errno;
			}
		}
		if (p->eof && p->held == 0 && framed(l))
			return framed_end(w, p, src, dst, side);
		if (p->eof && p->held == 0) {
			r = pump_finish(p, dst);
			if (r == -EAGAIN) {
				arm_poll(w, p, dst, wait_mask(p, true, POLLOUT));
				return 0;
			}
			if (r < 0) {
				*side = p->dir ^ 1;
				return r;
			}
			p->done = true;
			return 0;
		}
		if (!rd.progress)
			break;
	}
	if (p->dir == 0 && l->z)
		xp_frame_z_note(l, rd.throttled);
	if (moved >= budget)
		return 1;
	/*
	 * A full pipe also answers EAGAIN on the source side (socket data can fill the pipe's
	 * slots before its byte capacity), so wait for the destination whenever bytes are held.
	 */
	if ((p->held > 0 || pump_unsent(p) > 0) && rd.dst_blocked)
		arm_poll(w, p, dst, wait_mask(p, p->kind == PUMP_TLS_TX, POLLOUT));
	else if (framed_out(p) && rd.keep_full)
		park(w, p, dst); /* before the source: the pipe may be full with what keep lacks */
	else if (rd.src_blocked)
		arm_poll(w, p, src,
			 wait_mask(p, p->kind == PUMP_TLS_RX, POLLIN | POLLRDHUP) |
				 (framed_in(p) && xp_frame_wants_out(l) ? POLLOUT : 0));
	else if (rd.throttled)
		arm_timer(w, p, rd.wait_ns);
	else if (framed_out(p) && p->held == 0 && pump_room(p) == 0)
		park(w, p, dst);
	else
		return 1;
	return 0;
}

void xp_pump_step(struct xp_worker *w, struct xp_pump *p)
{
	struct pool_link *l = p->link;
	unsigned int side = p->dir;
	int r;

	if (l->closing || l->suspending || l->suspended || l->freezing || l->quiesced || p->done ||
	    p->armed)
		return;
	if (l->hop_closing) {
		if (p->dir == 1)
			xp_frame_hop_closing(w, l);
		return;
	}
	r = pump_run(w, p, &side);
	if (r < 0) {
		xp_link_fail(w, l, r, side);
		return;
	}
	if (l->closing || !l->live)
		return; /* framed: the peer's end after all was complete */
	/*
	 * Reading can make TLS answer the peer (an alert, a key update): that goes out now. The
	 * transmit pump flushes it too, but it may be parked on the local socket.
	 */
	if (p->kind == PUMP_TLS_RX && l->tls && xp_tls_unsent(l->tls) > 0) {
		enum xp_tls_want want;

		(void)xp_tls_flush(l->tls, &want);
	}
	if (l->quiescing)
		xp_frame_quiesce_check(w, l);
	if (l->freezing)
		return;
	if (r > 0)
		ready_push(w, p);
	else if (framed(l) && xp_frame_complete(l))
		xp_frame_close_hop(w, l);
	else if (!framed(l) && ((l->p[0].done && l->p[1].done) ||
				(l->opts.raw && (l->p[0].done || l->p[1].done))))
		xp_link_close(w, l, XP_END_CLEAN, 0, 0);
}
