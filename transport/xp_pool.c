// SPDX-License-Identifier: Apache-2.0
/* io_uring worker pool: each worker owns one ring and a fixed array of link slots. The ring
 * waits for readiness (one-shot POLL_ADD per blocked direction); the bytes then move with
 * non-blocking splice(2) source -> pipe -> destination on the worker itself. IORING_OP_SPLICE
 * is not used: io_uring always punts it to io-wq threads, which costs a context switch per
 * chunk on a 2-core node (see doc/design.md for the measurements).
 *
 * Threads talk through two single-producer rings per worker: the control thread posts ATTACH
 * and ABORT (and wakes the worker's eventfd); the worker posts finished slots back and wakes
 * the pool's eventfd. Slots are owned by the control thread while free and by their worker
 * while attached, so nothing is allocated on the data path.
 *
 * A link whose node-hop side is TLS reads and writes that side through OpenSSL with a user-space
 * buffer per direction (xp_tls); where kTLS took the transmit side, that direction splices. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "xp_bucket.h"
#include "xp_pool.h"
#include "xp_sock.h"
#include "xp_tls.h"

enum { OP_INBOX = 1, OP_POLL, OP_CANCEL, OP_TIMER };
enum { MSG_ATTACH = 1, MSG_ABORT, MSG_QUIT, MSG_PACE };

#define UD(op, dir, idx) ((uint64_t)(op) << 56 | (uint64_t)(dir) << 48 | (uint64_t)(idx))
#define UD_OP(ud)	 ((unsigned int)((ud) >> 56))
#define UD_DIR(ud)	 ((unsigned int)((ud) >> 48) & 0xff)
#define UD_IDX(ud)	 ((uint32_t)(ud))
#define MSG(type, idx)	 ((uint32_t)(type) << 24 | (idx))

/* Bytes one direction may move before it yields to the other links of its worker. */
#define PUMP_BUDGET_PIPES 4
/* Plaintext buffered per direction of a TLS link: sixteen full records. */
#define TLS_BUF_SIZE (256 * 1024)
#define TLS_RECORD   16384
/* Ciphertext written per write(2): sixteen records and their headers. */
#define TLS_BATCH_SIZE (16 * (TLS_RECORD + 256))
/* The most a tap is shown at once where bytes are spliced (MSG_PEEK into this buffer). */
#define TAP_PEEK_MAX (64 * 1024)
/* A shaped direction never sleeps longer than this, so a raised cap is seen at once. */
#define SHAPE_WAIT_MAX_NS (20 * 1000000ull)

enum pump_kind {
	PUMP_SPLICE, /* source -> pipe -> destination, no byte in user space */
	PUMP_COPY,   /* read(2)/write(2) through buf */
	PUMP_TLS_TX, /* read(2) plaintext into buf, encrypt to the node hop */
	PUMP_TLS_RX, /* decrypt from the node hop into buf, write(2) plaintext */
};

struct spsc {
	uint32_t *buf;
	uint32_t mask;
	_Atomic uint32_t head;
	_Atomic uint32_t tail;
};

struct xp_pump {
	struct xp_link *link;
	unsigned int dir;
	enum pump_kind kind;
	enum xp_tls_want want; /* TLS: what the last call that would block waits for */
	bool notified;	       /* TLS, direction 0: close_notify is out */
	int pipe[2];	       /* XP_PATH_SPLICE */
	uint8_t *buf;	       /* XP_PATH_COPY: bytes held are buf[head, head + held) */
	size_t head;
	size_t cap;
	size_t held;
	bool eof;    /* the source reached end of stream */
	bool done;   /* eof, pipe drained, destination half-closed */
	bool armed;  /* a POLL_ADD or a TIMEOUT is in flight */
	bool timer;  /* ... and it is the TIMEOUT: waiting for tokens */
	bool queued; /* on the worker's ready list */
	struct xp_pump *next;
	_Atomic uint64_t bytes;
	/* shaping (direction 0 only) */
	struct xp_bucket *bucket[2];
	bool shaped;
	struct __kernel_timespec ts;
	_Atomic uint64_t shaped_ns;
	/* the tap */
	const struct xp_tap_ops *tap;
	void *tap_ctx;
	uint8_t *peek;	  /* SPLICE: bytes shown with MSG_PEEK */
	size_t tap_seen;  /* bytes shown to the tap, not yet moved */
	uint64_t tap_skip; /* after those, bytes it lets pass unseen */
};

struct xp_link {
	struct xp_worker *w;
	uint32_t idx;
	/* set by the control thread before ATTACH */
	int fd[2];
	struct xp_tls_sess *tls; /* on fd[1], or NULL */
	void *cookie;
	struct xp_link_opts opts;
	_Atomic uint64_t pace_rate;
	_Atomic bool pace_posted;
	/* control thread only */
	bool abort_sent;
	/* worker only */
	bool live;
	bool closing;
	unsigned int inflight;
	struct xp_pump p[2];
	struct xp_link_result res;
};

struct xp_worker {
	struct xp_pool *pool;
	unsigned int id;
	pthread_t thread;
	bool started;
	struct io_uring ring;
	int inbox_fd;
	uint64_t inbox_val;
	struct spsc inbox;
	struct spsc outbox;
	struct xp_link *links;
	/* control thread only */
	uint32_t *free_slots;
	unsigned int nfree;
	/* worker only */
	unsigned int nlive;
	bool quit;
	bool posted;
	struct xp_pump *ready_head, *ready_tail;
	int init_err;
};

struct xp_pool {
	struct xp_pool_conf conf;
	struct xp_worker *w;
	unsigned int nthreads;
	int done_fd;
	xp_link_done_fn done;
	void *arg;
	sem_t started;
};

static int spsc_init(struct spsc *q, unsigned int min)
{
	unsigned int n = 1;

	while (n < min)
		n <<= 1;
	q->buf = calloc(n, sizeof(*q->buf));
	if (!q->buf)
		return -ENOMEM;
	q->mask = n - 1;
	atomic_init(&q->head, 0);
	atomic_init(&q->tail, 0);
	return 0;
}

static bool spsc_push(struct spsc *q, uint32_t v)
{
	uint32_t t = atomic_load_explicit(&q->tail, memory_order_relaxed);
	uint32_t h = atomic_load_explicit(&q->head, memory_order_acquire);

	if (t - h > q->mask)
		return false;
	q->buf[t & q->mask] = v;
	atomic_store_explicit(&q->tail, t + 1, memory_order_release);
	return true;
}

static bool spsc_pop(struct spsc *q, uint32_t *v)
{
	uint32_t h = atomic_load_explicit(&q->head, memory_order_relaxed);
	uint32_t t = atomic_load_explicit(&q->tail, memory_order_acquire);

	if (h == t)
		return false;
	*v = q->buf[h & q->mask];
	atomic_store_explicit(&q->head, h + 1, memory_order_release);
	return true;
}

static struct io_uring_sqe *get_sqe(struct xp_worker *w)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);

	if (!sqe) {
		io_uring_submit(&w->ring);
		sqe = io_uring_get_sqe(&w->ring);
	}
	return sqe;
}

static void arm_inbox(struct xp_worker *w)
{
	struct io_uring_sqe *sqe = get_sqe(w);

	io_uring_prep_read(sqe, w->inbox_fd, &w->inbox_val, sizeof(w->inbox_val), 0);
	io_uring_sqe_set_data64(sqe, UD(OP_INBOX, 0, 0));
}

static void arm_poll(struct xp_worker *w, struct xp_pump *p, int fd, unsigned int mask)
{
	struct io_uring_sqe *sqe = get_sqe(w);

	io_uring_prep_poll_add(sqe, fd, mask);
	io_uring_sqe_set_data64(sqe, UD(OP_POLL, p->dir, p->link->idx));
	p->armed = true;
	p->link->inflight++;
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

static void ready_push(struct xp_worker *w, struct xp_pump *p)
{
	if (p->queued)
		return;
	p->queued = true;
	p->next = NULL;
	if (w->ready_tail)
		w->ready_tail->next = p;
	else
		w->ready_head = p;
	w->ready_tail = p;
}

static void ready_unlink(struct xp_worker *w, struct xp_link *l)
{
	struct xp_pump **pp = &w->ready_head;

	w->ready_tail = NULL;
	while (*pp) {
		if ((*pp)->link == l) {
			(*pp)->queued = false;
			*pp = (*pp)->next;
			continue;
		}
		w->ready_tail = *pp;
		pp = &(*pp)->next;
	}
}

static void link_finalize(struct xp_worker *w, struct xp_link *l)
{
	bool clean = l->res.end == XP_END_CLEAN;

	ready_unlink(w, l);
	for (int d = 0; d < 2; d++) {
		struct xp_pump *p = &l->p[d];

		l->res.bytes[d] = atomic_load_explicit(&p->bytes, memory_order_relaxed);
		if (d == 0)
			l->res.shaped_ns = atomic_load_explicit(&p->shaped_ns, memory_order_relaxed);
		if (p->pipe[0] >= 0) {
			close(p->pipe[0]);
			close(p->pipe[1]);
			p->pipe[0] = p->pipe[1] = -1;
		}
		free(p->buf);
		p->buf = NULL;
		free(p->peek);
		p->peek = NULL;
		if (clean)
			close(l->fd[d]);
		else
			xp_close_reset(l->fd[d]);
		l->fd[d] = -1;
	}
	if (l->tls) {
		if (l->res.end == XP_END_ERROR && l->res.err_side == 1)
			snprintf(l->res.detail, sizeof(l->res.detail), "%s",
				 xp_tls_sess_io_error(l->tls));
		xp_tls_sess_free(l->tls);
		l->tls = NULL;
	}
	l->live = false;
	w->nlive--;
	/* The outbox holds one entry per slot, so this cannot fail. */
	spsc_push(&w->outbox, l->idx);
	w->posted = true;
}

/* Starts tearing a link down: polls in flight are cancelled, their completions awaited. */
static void link_close(struct xp_worker *w, struct xp_link *l, enum xp_link_end end, int err,
		       unsigned int side)
{
	if (l->closing)
		return;
	l->closing = true;
	l->res.end = end;
	l->res.err = err;
	l->res.err_side = side;
	for (int d = 0; d < 2; d++) {
		if (l->p[d].armed) {
			struct io_uring_sqe *sqe = get_sqe(w);

			if (l->p[d].timer)
				io_uring_prep_timeout_remove(sqe, UD(OP_TIMER, d, l->idx), 0);
			else
				io_uring_prep_poll_remove(sqe, UD(OP_POLL, d, l->idx));
			io_uring_sqe_set_data64(sqe, UD(OP_CANCEL, d, l->idx));
		}
	}
	if (l->inflight == 0)
		link_finalize(w, l);
}

/* Room left to take bytes from the source. */
static size_t pump_room(const struct xp_pump *p)
{
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
	case PUMP_TLS_RX:
		return tls_ret(xp_tls_read(p->link->tls, p->buf + p->head + p->held, len, &p->want));
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

/* Ciphertext a TLS_TX pump has made but not yet written to the socket. */
static size_t pump_unsent(const struct xp_pump *p)
{
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

/*
 * Moves bytes for one direction until both ends would block or the budget is spent.
 * Returns 1 when it stopped on the budget (run it again soon), 0 when it is waiting on a poll or
 * finished, -errno on a socket error, with the failing socket's index in *side.
 */
static int pump_run(struct xp_worker *w, struct xp_pump *p, unsigned int *side)
{
	struct xp_link *l = p->link;
	int src = l->fd[p->dir], dst = l->fd[p->dir ^ 1];
	size_t moved = 0, budget = PUMP_BUDGET_PIPES * p->cap;
	bool src_blocked = false, dst_blocked = false, throttled = false;
	uint64_t wait_ns = 0;

	while (moved < budget) {
		bool progress = false;
		ssize_t n;

		src_blocked = dst_blocked = throttled = false;
		/* TLS hands out one record per read: gather several before one write(2). */
		while (!p->eof && pump_room(p) > 0) {
			size_t len = pump_room(p), grant = 0;
			uint8_t *at = p->buf ? p->buf + p->head + p->held : NULL;

			if (p->shaped) {
				grant = xp_bucket_take(p->bucket, len, vm_now_ns(), &wait_ns);
				if (grant == 0) {
					throttled = true;
					break;
				}
				len = grant;
			}
			ssize_t lim = p->tap && p->kind == PUMP_SPLICE ? tap_plan_splice(p, src, len)
								       : (ssize_t)len;

			n = lim > 0 ? pump_fill(p, src, (size_t)lim) : lim;
			if (grant > (n > 0 ? (size_t)n : 0))
				xp_bucket_refund(p->bucket, grant - (n > 0 ? (size_t)n : 0));
			if (n > 0) {
				if (p->tap)
					tap_filled(p, at, (size_t)n);
				p->held += n;
				progress = true;
				if (p->kind == PUMP_TLS_RX && pump_room(p) >= TLS_RECORD)
					continue;
				/*
				 * The tap ended the splice at a packet boundary, not the socket:
				 * fill on, so the pipe still goes out in one piece.
				 */
				if (p->tap && p->kind == PUMP_SPLICE && (size_t)lim < len &&
				    n == lim && pump_room(p) > 0)
					continue;
			} else if (n == 0) {
				p->eof = true;
				progress = true;
			} else if (errno == EAGAIN) {
				src_blocked = true;
			} else if (errno == ECONNRESET &&
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
				progress = true;
			} else if (errno != EINTR) {
				*side = p->dir;
				return -errno;
			}
			break;
		}
		if (p->held > 0 || pump_unsent(p) > 0) {
			n = pump_drain(p, dst);
			if (n == 0) {
				/* TLS: only the batch went out. */
				progress = true;
			} else if (n > 0) {
				p->held -= n;
				moved += n;
				atomic_store_explicit(
					&p->bytes,
					atomic_load_explicit(&p->bytes, memory_order_relaxed) + n,
					memory_order_relaxed);
				progress = true;
			} else if (n < 0 && errno == EAGAIN) {
				dst_blocked = true;
			} else if (n < 0 && (errno == EPIPE || errno == ECONNRESET) &&
				   p->dir == 1 && local_peer_ended(dst)) {
				/*
				 * QEMU closed its socket after sending us everything it had (its
				 * destination closes multifd channels this way once the migration
				 * is complete): what it did not read, it did not want.
				 */
				l->res.undelivered += p->held;
				p->held = 0;
				p->eof = p->done = true;
				return 0;
			} else if (n < 0 && errno != EINTR) {
				*side = p->dir ^ 1;
				return -errno;
			}
		}
		if (p->eof && p->held == 0) {
			int r = pump_finish(p, dst);

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
		if (!progress)
			break;
	}
	if (moved >= budget)
		return 1;
	/*
	 * A full pipe also answers EAGAIN on the source side (socket data can fill the pipe's
	 * slots before its byte capacity), so wait for the destination whenever bytes are held.
	 */
	if ((p->held > 0 || pump_unsent(p) > 0) && dst_blocked)
		arm_poll(w, p, dst, wait_mask(p, p->kind == PUMP_TLS_TX, POLLOUT));
	else if (src_blocked)
		arm_poll(w, p, src, wait_mask(p, p->kind == PUMP_TLS_RX, POLLIN | POLLRDHUP));
	else if (throttled)
		arm_timer(w, p, wait_ns);
	else
		return 1;
	return 0;
}

static void pump_step(struct xp_worker *w, struct xp_pump *p)
{
	struct xp_link *l = p->link;
	unsigned int side = p->dir;
	int r;

	if (l->closing || p->done || p->armed)
		return;
	r = pump_run(w, p, &side);
	/*
	 * Reading can make TLS answer the peer (an alert, a key update): that goes out now. The
	 * transmit pump flushes it too, but it may be parked on the local socket.
	 */
	if (r >= 0 && p->kind == PUMP_TLS_RX && xp_tls_unsent(l->tls) > 0) {
		enum xp_tls_want want;

		(void)xp_tls_flush(l->tls, &want);
	}
	if (r < 0) {
		link_close(w, l, XP_END_ERROR, r, side);
		return;
	}
	if (r > 0)
		ready_push(w, p);
	else if (l->p[0].done && l->p[1].done)
		link_close(w, l, XP_END_CLEAN, 0, 0);
}

static void run_ready(struct xp_worker *w)
{
	struct xp_pump *p, *last = w->ready_tail;

	/* One pass over what is queued now; pumps re-queued during the pass wait for the next. */
	while ((p = w->ready_head)) {
		w->ready_head = p->next;
		if (!w->ready_head)
			w->ready_tail = NULL;
		p->queued = false;
		pump_step(w, p);
		if (p == last)
			break;
	}
}

static enum pump_kind pump_kind(const struct xp_link *l, unsigned int dir,
				const struct xp_pool_conf *conf)
{
	if (l->tls && dir == 1)
		return PUMP_TLS_RX;
	/* kTLS encrypts whatever reaches the socket, spliced bytes included. */
	if (l->tls && !xp_tls_ktls_tx(l->tls))
		return PUMP_TLS_TX;
	return conf->path == XP_PATH_COPY ? PUMP_COPY : PUMP_SPLICE;
}

/* Per connection, never per chunk: a pipe (splice) or a buffer for one direction. */
static int pump_open(struct xp_pump *p, const struct xp_pool_conf *conf)
{
	int r;

	if (p->kind != PUMP_SPLICE) {
		p->cap = p->kind == PUMP_COPY ? conf->pipe_size : TLS_BUF_SIZE;
		p->buf = malloc(p->cap);
		return p->buf ? 0 : -ENOMEM;
	}
	if (pipe2(p->pipe, O_NONBLOCK | O_CLOEXEC) < 0)
		return -errno;
	/* Without CAP_SYS_RESOURCE the per-user pipe quota may refuse; keep the default size. */
	(void)fcntl(p->pipe[1], F_SETPIPE_SZ, (int)conf->pipe_size);
	r = fcntl(p->pipe[1], F_GETPIPE_SZ);
	p->cap = r > 0 ? (size_t)r : 65536;
	return 0;
}

static void link_start(struct xp_worker *w, struct xp_link *l)
{
	int r = 0;

	l->live = true;
	l->closing = false;
	l->inflight = 0;
	memset(&l->res, 0, sizeof(l->res));
	w->nlive++;
	for (int d = 0; d < 2; d++) {
		struct xp_pump *p = &l->p[d];

		p->link = l;
		p->dir = d;
		p->held = 0;
		p->head = 0;
		p->buf = NULL;
		p->eof = p->done = p->armed = p->timer = p->queued = p->notified = false;
		p->bucket[0] = d == 0 ? l->opts.bucket[0] : NULL;
		p->bucket[1] = d == 0 ? l->opts.bucket[1] : NULL;
		p->shaped = p->bucket[0] || p->bucket[1];
		atomic_store_explicit(&p->shaped_ns, 0, memory_order_relaxed);
		p->tap = l->opts.tap_ops[d];
		p->tap_ctx = l->opts.tap_ctx[d];
		p->tap_seen = 0;
		p->tap_skip = 0;
		p->peek = NULL;
		p->kind = pump_kind(l, d, &w->pool->conf);
		p->want = XP_TLS_WANT_NONE;
		if (r == 0 && d == 1 && l->tls)
			r = xp_tls_sess_batch(l->tls, TLS_BATCH_SIZE);
		p->pipe[0] = p->pipe[1] = -1;
		atomic_store_explicit(&p->bytes, 0, memory_order_relaxed);
		if (r == 0)
			r = pump_open(p, &w->pool->conf);
		if (r == 0 && p->tap && p->kind == PUMP_SPLICE && !(p->peek = malloc(TAP_PEEK_MAX)))
			r = -ENOMEM;
	}
	if (r < 0) {
		link_close(w, l, XP_END_ERROR, r, 0);
		return;
	}
	ready_push(w, &l->p[0]);
	ready_push(w, &l->p[1]);
}

static void link_apply_pacing(struct xp_link *l)
{
	uint64_t rate = atomic_load(&l->pace_rate);
	unsigned long v = rate ? (unsigned long)rate : ~0UL;

	/* Best effort: a socket that refuses keeps its pace; the bytes still flow. */
	(void)setsockopt(l->fd[1], SOL_SOCKET, SO_MAX_PACING_RATE, &v, sizeof(v));
}

static void handle_inbox(struct xp_worker *w)
{
	uint32_t m;

	while (spsc_pop(&w->inbox, &m)) {
		struct xp_link *l = &w->links[m & 0xffffff];

		switch (m >> 24) {
		case MSG_ATTACH:
			link_start(w, l);
			break;
		case MSG_ABORT:
			/* A link that already ended is not live any more: nothing to cut. */
			if (l->live)
				link_close(w, l, XP_END_ABORTED, -ECONNABORTED, 0);
			break;
		case MSG_PACE:
			atomic_store(&l->pace_posted, false);
			if (l->live && !l->closing)
				link_apply_pacing(l);
			break;
		case MSG_QUIT:
			w->quit = true;
			for (unsigned int i = 0; i < w->pool->conf.slots; i++)
				if (w->links[i].live)
					link_close(w, &w->links[i], XP_END_ABORTED, -ESHUTDOWN, 0);
			break;
		}
	}
}

static void handle_cqe(struct xp_worker *w, const struct io_uring_cqe *cqe)
{
	uint64_t ud = io_uring_cqe_get_data64(cqe);
	struct xp_link *l;
	struct xp_pump *p;

	switch (UD_OP(ud)) {
	case OP_INBOX:
		handle_inbox(w);
		if (!w->quit)
			arm_inbox(w);
		return;
	case OP_POLL:
	case OP_TIMER:
		l = &w->links[UD_IDX(ud)];
		p = &l->p[UD_DIR(ud)];
		p->armed = p->timer = false;
		l->inflight--;
		if (l->closing) {
			if (l->inflight == 0)
				link_finalize(w, l);
			return;
		}
		/* POLLERR and POLLHUP come back as events; the splice reports the actual error. */
		if (cqe->res < 0 && cqe->res != -ECANCELED &&
		    !(UD_OP(ud) == OP_TIMER && cqe->res == -ETIME)) {
			link_close(w, l, XP_END_ERROR, cqe->res, p->dir);
			return;
		}
		pump_step(w, p);
		return;
	default:
		return;
	}
}

static int ring_init(struct xp_worker *w)
{
	static const unsigned int flag_sets[] = {
		IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
		IORING_SETUP_COOP_TASKRUN,
		0,
	};
	unsigned int entries = 8;
	int r = -EINVAL;

	while (entries < 2 * w->pool->conf.slots + 8)
		entries <<= 1;
	/* Newest flags first; older kernels reject them with EINVAL. */
	for (unsigned int i = 0; i < ARRAY_SIZE(flag_sets); i++) {
		struct io_uring_params params = { .flags = flag_sets[i] | IORING_SETUP_CQSIZE,
						  .cq_entries = 4 * entries };

		r = io_uring_queue_init_params(entries, &w->ring, &params);
		if (r != -EINVAL)
			break;
	}
	return r;
}

static void *worker_main(void *arg)
{
	struct xp_worker *w = arg;
	struct xp_pool *pool = w->pool;
	int r;

	w->init_err = ring_init(w);
	sem_post(&pool->started);
	if (w->init_err < 0)
		return NULL;
	arm_inbox(w);
	while (!w->quit || w->nlive > 0) {
		struct io_uring_cqe *cqe;
		unsigned int head, n = 0;

		run_ready(w);
		r = io_uring_submit_and_wait(&w->ring, w->ready_head ? 0 : 1);
		if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
			log_err("worker %u: io_uring_submit_and_wait: %s", w->id, strerror(-r));
			break;
		}
		io_uring_for_each_cqe (&w->ring, head, cqe) {
			handle_cqe(w, cqe);
			n++;
		}
		io_uring_cq_advance(&w->ring, n);
		if (w->posted) {
			w->posted = false;
			eventfd_write(pool->done_fd, 1);
		}
	}
	io_uring_queue_exit(&w->ring);
	return NULL;
}

static int worker_init(struct xp_pool *pool, struct xp_worker *w, unsigned int id)
{
	unsigned int slots = pool->conf.slots;
	int r;

	w->pool = pool;
	w->id = id;
	w->inbox_fd = eventfd(0, EFD_CLOEXEC);
	if (w->inbox_fd < 0)
		return -errno;
	w->links = calloc(slots, sizeof(*w->links));
	w->free_slots = calloc(slots, sizeof(*w->free_slots));
	if (!w->links || !w->free_slots)
		return -ENOMEM;
	r = spsc_init(&w->inbox, 3 * slots + 2);
	if (r < 0)
		return r;
	r = spsc_init(&w->outbox, slots);
	if (r < 0)
		return r;
	for (unsigned int i = 0; i < slots; i++) {
		w->links[i].w = w;
		w->links[i].idx = i;
		w->links[i].fd[0] = w->links[i].fd[1] = -1;
		w->free_slots[i] = slots - 1 - i;
	}
	w->nfree = slots;
	r = pthread_create(&w->thread, NULL, worker_main, w);
	if (r)
		return -r;
	w->started = true;
	sem_wait(&pool->started);
	return w->init_err;
}

static void worker_post(struct xp_worker *w, uint32_t msg)
{
	/*
	 * The inbox holds three messages per slot plus QUIT, the most that can be outstanding:
	 * ATTACH, ABORT and one PACE each.
	 */
	spsc_push(&w->inbox, msg);
	eventfd_write(w->inbox_fd, 1);
}

void xp_pool_free(struct xp_pool *p)
{
	if (!p)
		return;
	for (unsigned int i = 0; i < p->nthreads; i++) {
		struct xp_worker *w = &p->w[i];

		if (w->started) {
			worker_post(w, MSG(MSG_QUIT, 0));
			pthread_join(w->thread, NULL);
		}
		if (w->inbox_fd >= 0)
			close(w->inbox_fd);
		free(w->links);
		free(w->free_slots);
		free(w->inbox.buf);
		free(w->outbox.buf);
	}
	if (p->done_fd >= 0)
		close(p->done_fd);
	sem_destroy(&p->started);
	free(p->w);
	free(p);
}

int xp_pool_new(const struct xp_pool_conf *conf, xp_link_done_fn done, void *arg,
		struct xp_pool **ret)
{
	struct xp_pool *p;
	int r;

	if (conf->threads == 0 || conf->slots == 0 || conf->slots > 0xffffff)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->conf = *conf;
	p->done = done;
	p->arg = arg;
	sem_init(&p->started, 0, 0);
	p->done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	p->w = calloc(conf->threads, sizeof(*p->w));
	if (p->done_fd < 0 || !p->w) {
		r = p->done_fd < 0 ? -errno : -ENOMEM;
		goto fail;
	}
	for (unsigned int i = 0; i < conf->threads; i++) {
		p->w[i].inbox_fd = -1;
		p->nthreads++;
		r = worker_init(p, &p->w[i], i);
		if (r < 0)
			goto fail;
	}
	*ret = p;
	return 0;

fail:
	xp_pool_free(p);
	return r;
}

int xp_pool_event_fd(const struct xp_pool *p)
{
	return p->done_fd;
}

unsigned int xp_pool_threads(const struct xp_pool *p)
{
	return p->nthreads;
}

void xp_pool_reap(struct xp_pool *p)
{
	eventfd_t v;

	(void)eventfd_read(p->done_fd, &v);
	for (unsigned int i = 0; i < p->nthreads; i++) {
		struct xp_worker *w = &p->w[i];
		uint32_t idx;

		while (spsc_pop(&w->outbox, &idx)) {
			struct xp_link *l = &w->links[idx];
			struct xp_link_result res = l->res;
			void *cookie = l->cookie;

			l->cookie = NULL;
			l->abort_sent = false;
			w->free_slots[w->nfree++] = idx;
			p->done(cookie, &res, p->arg);
		}
	}
}

int xp_pool_attach(struct xp_pool *p, int fd_a, int fd_b, const struct xp_link_opts *o,
		   struct xp_link **ret)
{
	struct xp_worker *best = NULL;
	struct xp_link *l;

	/* The worker with the most free slots carries the fewest links. */
	for (unsigned int i = 0; i < p->nthreads; i++)
		if (p->w[i].nfree > 0 && (!best || p->w[i].nfree > best->nfree))
			best = &p->w[i];
	if (!best)
		return -EBUSY;
	l = &best->links[best->free_slots[--best->nfree]];
	l->fd[0] = fd_a;
	l->fd[1] = fd_b;
	l->opts = *o;
	l->tls = o->tls;
	l->cookie = o->cookie;
	l->abort_sent = false;
	atomic_store_explicit(&l->pace_rate, 0, memory_order_relaxed);
	atomic_store(&l->pace_posted, false);
	worker_post(best, MSG(MSG_ATTACH, l->idx));
	*ret = l;
	return 0;
}

void xp_link_abort(struct xp_link *l)
{
	if (l->abort_sent)
		return;
	l->abort_sent = true;
	worker_post(l->w, MSG(MSG_ABORT, l->idx));
}

void xp_link_bytes(const struct xp_link *l, uint64_t out[2])
{
	for (int d = 0; d < 2; d++)
		out[d] = atomic_load_explicit(&l->p[d].bytes, memory_order_relaxed);
}

void xp_link_set_pacing(struct xp_link *l, uint64_t rate)
{
	atomic_store(&l->pace_rate, rate);
	/* At most one PACE in the inbox per link; it reads the newest rate when it runs. */
	if (l->abort_sent || atomic_exchange(&l->pace_posted, true))
		return;
	worker_post(l->w, MSG(MSG_PACE, l->idx));
}

uint64_t xp_link_shaped_ns(const struct xp_link *l)
{
	return atomic_load_explicit(&l->p[0].shaped_ns, memory_order_relaxed);
}
