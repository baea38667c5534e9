// SPDX-License-Identifier: Apache-2.0
/* A resumable link's node hop, on its worker: DATA frames (ZDATA: xp_frame_z.c) out of
 * direction 0 with a copy kept until the peer acknowledges it (tee(2) into a second pipe, or a
 * ring the bytes were read into), ACKs of what direction 1 delivered, END, the clean close, and
 * suspending and resuming the link around a failed node hop. xp_pump.c calls in here. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util.h"
#include "xp_frame.h"
#include "xp_pool_priv.h"
#include "xp_sock.h"
#include "xp_tls.h"

uint64_t xp_frame_in_done(const struct xp_pump *p)
{
	return atomic_load_explicit(&p->bytes, memory_order_relaxed) + p->dropped;
}

/* ... and of what it took from the node hop: where the peer resends from after a failure. */
static uint64_t in_have(const struct xp_pump *p)
{
	return xp_frame_in_done(p) + p->held;
}

void xp_frame_publish_kept(struct pool_link *l)
{
	const struct xp_pump *p = &l->p[0];
	uint64_t kept = p->ring ? p->sent - p->acked : p->teed - p->acked;

	atomic_store_explicit(&l->pub_kept, kept, memory_order_relaxed);
}

/* A ring of size bytes mapped twice in a row: buf[i] and buf[i + size] are the same byte. */
static int ring_map(size_t size, uint8_t **ret)
{
	uint8_t *base;
	int fd, r = 0;

	fd = memfd_create("vmigd-keep", MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0) {
		r = -errno;
		goto out;
	}
	base = mmap(NULL, 2 * size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED) {
		r = -errno;
		goto out;
	}
	if (mmap(base, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED ||
	    mmap(base + size, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
		    MAP_FAILED) {
		r = -errno;
		munmap(base, 2 * size);
		goto out;
	}
	*ret = base;
out:
	close(fd);
	return r;
}

/* Splice: the chain of pipes direction 0 keeps its copy in, as many as keep bytes take. */
static int chain_open(struct keep_chain *kc, size_t keep, size_t pipe_size, size_t *cap)
{
	size_t n = (keep + pipe_size - 1) / pipe_size;

	if (n > KEEP_PIPES_MAX)
		n = KEEP_PIPES_MAX;
	kc->head = kc->tail = 0;
	kc->replaying = false;
	kc->replay_held = 0;
	for (kc->n = 0; kc->n < n; kc->n++) {
		int *fd = kc->fd[kc->n], r;

		if (pipe2(fd, O_NONBLOCK | O_CLOEXEC) < 0)
			return -errno;
		(void)fcntl(fd[1], F_SETPIPE_SZ, (int)pipe_size);
		r = fcntl(fd[1], F_GETPIPE_SZ);
		kc->size = r > 0 ? (size_t)r : 65536;
		kc->cnt[kc->n] = 0;
	}
	*cap = keep < kc->n * kc->size ? keep : kc->n * kc->size;
	return 0;
}

int xp_frame_open(struct xp_worker *w, struct pool_link *l)
{
	struct xp_pump *o = &l->p[0];
	size_t keep = l->opts.resume.keep, page = (size_t)sysconf(_SC_PAGESIZE);
	int r;

	(void)w;
	l->suspending = l->suspended = l->hop_closing = false;
	l->ack_sent = 0;
	/* a quarter of what the peer keeps, if it keeps what this side does: when it keeps less
	 * and waits, it asks (PING) */
	l->ack_every = keep / 4 > 65536 ? keep / 4 : 65536;
	atomic_store_explicit(&l->pub_replayed, 0, memory_order_relaxed);
	atomic_store_explicit(&l->pub_acked, 0, memory_order_relaxed);
	atomic_store_explicit(&l->pub_sent, 0, memory_order_relaxed);
	atomic_store_explicit(&l->pub_resumed, 0, memory_order_relaxed);
	atomic_store_explicit(&l->pub_kept, 0, memory_order_relaxed);
	for (int d = 0; d < 2; d++) {
		struct xp_pump *p = &l->p[d];

		memset(&p->fin, 0, sizeof(p->fin));
		memset(&p->fout, 0, sizeof(p->fout));
		p->sent = p->teed = p->acked = p->dropped = 0;
		p->wait_ack = p->final_acked = p->peer_gone = false;
	}
	l->gone_sent = l->ping_due = l->pinged = false;
	if (o->kind == PUMP_SPLICE)
		return chain_open(&o->kc, keep, o->cap, &o->keep_cap);
	/* the ring replaces the plain buffer: what was read waits there to be sent, and what was
	 * sent stays behind it until acknowledged */
	size_t size = (keep + page - 1) / page * page;

	if (size < o->cap)
		size = (o->cap + page - 1) / page * page;
	free(o->buf);
	o->buf = NULL;
	r = ring_map(size, &o->buf);
	if (r < 0)
		return r;
	o->ring = o->cap = o->keep_cap = size;
	return 0;
}

void xp_frame_close(struct pool_link *l)
{
	struct xp_pump *o = &l->p[0];
	struct keep_chain *kc = &o->kc;

	for (unsigned int i = 0; i < kc->n; i++) {
		close(kc->fd[i][0]);
		close(kc->fd[i][1]);
	}
	kc->n = 0;
	if (kc->replay[0] >= 0) {
		close(kc->replay[0]);
		close(kc->replay[1]);
		kc->replay[0] = kc->replay[1] = -1;
	}
	if (o->ring) {
		munmap(o->buf, 2 * o->ring);
		o->buf = NULL;
		o->ring = 0;
	}
}

size_t xp_frame_room(const struct xp_pump *p)
{
	size_t kept;

	/* a link about to move reads nothing more from its local socket */
	if (p->link->quiescing)
		return 0;

	if (p->ring) {
		kept = p->sent - p->acked + p->held;
		return kept < p->ring ? p->ring - kept : 0;
	}
	/* tee(2) copies from the head of the pipe: fill only while what the pipe holds is all
	 * new to keep (none of it kept and not yet sent), so that one tee takes all of it; and
	 * nothing new while the old is sent again */
	if (p->teed != p->sent || p->kc.replaying)
		return 0;
	kept = p->teed - p->acked + p->held;
	kept = kept < p->keep_cap ? p->keep_cap - kept : 0;
	return kept < p->cap - p->held ? kept : p->cap - p->held;
}

/* Splice: copies into keep what the pipe holds beyond it, when that is all the pipe holds. */
static void tee_more(struct xp_pump *p)
{
	struct keep_chain *kc = &p->kc;
	ssize_t k;

	if (p->ring || kc->replaying || p->teed != p->sent || p->held == 0 ||
	    p->teed - p->acked >= p->keep_cap)
		return;
	for (;;) {
		k = tee(p->pipe[0], kc->fd[kc->tail][1], p->held, SPLICE_F_NONBLOCK);
		if (k > 0) {
			kc->cnt[kc->tail] += (size_t)k;
			p->teed += (uint64_t)k;
			xp_frame_publish_kept(p->link);
			return;
		}
		/* this one is full (its bytes or its slots): the next, if it is free */
		unsigned int next = (kc->tail + 1) % kc->n;

		if (k < 0 && errno != EAGAIN)
			return;
		if (next == kc->head || kc->cnt[next])
			return;
		kc->tail = next;
	}
}

void xp_frame_filled(struct xp_pump *p, size_t n)
{
	/* kept when it goes out (sendable()): one tee(2) for what several fills took */
	(void)p;
	(void)n;
}

/* Writes raw bytes toward the node hop: the socket, or the TLS session's batch. */
ssize_t xp_frame_hop_write(struct pool_link *l, const void *buf, size_t len, bool more)
{
	struct xp_pump *p = &l->p[0];
	ssize_t n;

	if (p->kind == PUMP_TLS_TX) {
		n = xp_tls_write(l->tls, buf, len, &p->want);
		if (n < 0) {
			errno = (int)-n;
			return -1;
		}
		return n;
	}
	/* the node hop is a socket on either path: a failed peer is an error, never SIGPIPE */
	return send(l->fd[1], buf, len, MSG_DONTWAIT | MSG_NOSIGNAL | (more ? MSG_MORE : 0));
}

/* The header on its way, written as far as the node hop takes it: 0 once out, -1/errno. */
static int hdr_flush(struct pool_link *l)
{
	struct frame_out *f = &l->p[0].fout;

	while (f->off < f->len) {
		ssize_t n = xp_frame_hop_write(l, f->hdr + f->off, f->len - f->off, f->left > 0);

		if (n < 0)
			return -1;
		f->off += (unsigned int)n;
	}
	f->len = f->off = 0;
	return 0;
}

static void hdr_start(struct pool_link *l, enum xp_frame_type type, uint32_t len, uint64_t off)
{
	struct frame_out *f = &l->p[0].fout;
	struct xp_frame fr = { .type = type, .len = len, .off = off };

	xp_frame_put(&fr, f->hdr);
	f->len = XP_FRAME_LEN;
	f->off = 0;
	f->left = type == XP_FRAME_DATA || type == XP_FRAME_ZDATA ? len : 0;
	f->zdata = type == XP_FRAME_ZDATA;
}

static bool ack_due(const struct pool_link *l)
{
	const struct xp_pump *in = &l->p[1];
	uint64_t done = xp_frame_in_done(in);

	/* every ack_every delivered, when the peer asks (it waits), and for the direction's end */
	return done > l->ack_sent &&
	       (done - l->ack_sent >= l->ack_every || l->ping_due || in->fin.end);
}

/* At a frame boundary: queues a GONE once the local peer closed, else an ACK when one is due. */
static void ack_start(struct pool_link *l)
{
	struct frame_out *f = &l->p[0].fout;

	if (f->len || f->left)
		return;
	if (l->p[1].fin.discard && !l->gone_sent) {
		l->gone_sent = true;
		hdr_start(l, XP_FRAME_GONE, 0, xp_frame_in_done(&l->p[1]));
		return;
	}
	if (!ack_due(l))
		return;
	l->ping_due = false;
	l->ack_sent = xp_frame_in_done(&l->p[1]);
	hdr_start(l, XP_FRAME_ACK, 0, l->ack_sent);
}

/* Payload toward the node hop, at most len bytes of what direction 0 holds. */
static ssize_t payload_write(struct xp_pump *p, int dst, size_t len)
{
	struct keep_chain *kc = &p->kc;
	ssize_t n;

	if (!p->ring) {
		n = splice(kc->replaying ? kc->replay[0] : p->pipe[0], NULL, dst, NULL, len,
			   SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
		if (n > 0 && kc->replaying)
			kc->replay_held -= (size_t)n;
		else if (n > 0)
			p->held -= (size_t)n;
		return n;
	}
	n = xp_frame_hop_write(p->link, p->buf + p->head, len, false);
	if (n > 0) {
		p->head = (p->head + (size_t)n) % p->ring;
		p->held -= (size_t)n;
	}
	return n;
}

/*
 * Splice, after a resumption: what the peer lacks comes from keep, one pipe at a time, through
 * the replay pipe (a tee(2), so keep goes on holding it). How much may be sent from it now (0:
 * the replay is over), or -1 with errno.
 */
static ssize_t replay_next(struct xp_pump *p)
{
	struct keep_chain *kc = &p->kc;
	ssize_t k;

	while (kc->replaying && kc->replay_held == 0) {
		unsigned int i = kc->replay_next;

		if (p->sent == p->teed) {
			kc->replaying = false;
			break;
		}
		/* as large as the pipe it copies, and empty: it takes all of it */
		k = tee(kc->fd[i][0], kc->replay[1], kc->cnt[i], SPLICE_F_NONBLOCK);
		if (k < 0 || (size_t)k != kc->cnt[i]) {
			errno = k < 0 ? errno : ENOBUFS;
			return -1;
		}
		kc->replay_held = (size_t)k;
		kc->replay_next = (i + 1) % kc->n;
	}
	return (ssize_t)kc->replay_held;
}

/* What may go out in the next DATA frame: the ring's held bytes, or on the splice path what is
 * sent again, else what keep has of the pipe. -1 with errno. */
static ssize_t sendable(struct xp_pump *p)
{
	ssize_t r;

	if (p->ring)
		return (ssize_t)p->held;
	if (p->kc.replaying) {
		r = replay_next(p);
		if (r != 0 || p->kc.replaying)
			return r;
	}
	tee_more(p);
	return (ssize_t)(p->teed - p->sent);
}

/* TLS: the batch goes out; 0, or -1/errno (EAGAIN: the socket is full). */
static int tls_flush(struct pool_link *l)
{
	int r;

	if (!l->tls || l->p[0].kind != PUMP_TLS_TX)
		return 0;
	r = xp_tls_flush(l->tls, &l->p[0].want);
	if (r < 0) {
		errno = -r;
		return -1;
	}
	return 0;
}

ssize_t xp_frame_send(struct xp_worker *w, struct xp_pump *p, int dst)
{
	struct pool_link *l = p->link;
	struct frame_out *f = &p->fout;
	size_t total = 0;
	int err = 0; /* what stopped it: EAGAIN (the node hop is full), another, 0: nothing left */
	ssize_t n;

	for (;;) {
		size_t can;

		if (hdr_flush(l) < 0) {
			err = errno;
			break;
		}
		if (f->left > 0 && f->zdata) {
			n = xp_frame_z_write(l);
			if (n < 0 && errno == EAGAIN && p->kind == PUMP_TLS_TX && tls_flush(l) == 0)
				continue;
			if (n < 0) {
				err = errno;
				break;
			}
			total += (size_t)n;
			continue;
		}
		if (f->left > 0) {
			/* the open frame's payload comes from where its header said */
			can = p->ring		   ? p->held
			      : p->kc.replaying ? p->kc.replay_held
						: (size_t)(p->teed - p->sent);
			n = payload_write(p, dst, can < f->left ? can : (size_t)f->left);
			if (n < 0 && errno == EAGAIN && p->kind == PUMP_TLS_TX && tls_flush(l) == 0)
				continue;
			if (n <= 0) {
				err = n < 0 ? errno : EAGAIN;
				break;
			}
			f->left -= (uint64_t)n;
			p->sent += (uint64_t)n;
			total += (size_t)n;
			atomic_store_explicit(&l->pub_sent, p->sent, memory_order_relaxed);
			if (p->ring)
				xp_frame_publish_kept(l);
			continue;
		}
		ack_start(l);
		if (f->len)
			continue;
		n = sendable(p);
		if (n <= 0) {
			err = n < 0 ? errno : 0;
			break;
		}
		size_t z = xp_frame_z_start(w, p, (size_t)n);

		if (z)
			hdr_start(l, XP_FRAME_ZDATA, (uint32_t)z, p->sent);
		else
			hdr_start(l, XP_FRAME_DATA, n > XP_FRAME_MAX ? XP_FRAME_MAX : (uint32_t)n,
				  p->sent);
	}
	if ((err == 0 || err == EAGAIN) && tls_flush(l) < 0)
		err = errno;
	if (total > 0)
		return (ssize_t)total; /* what stopped it shows again next time */
	if (err && err != EAGAIN) {
		errno = err;
		return -1;
	}
	if (err == EAGAIN || xp_frame_unsent(p)) {
		errno = EAGAIN;
		return -1;
	}
	/* held bytes keep has no room for yet (its slots, not only its bytes): an ACK frees it */
	if (p->held > 0) {
		errno = ENOBUFS;
		return -1;
	}
	return 0;
}

size_t xp_frame_unsent(const struct xp_pump *p)
{
	const struct pool_link *l = p->link;

	return (p->fout.len - p->fout.off) +
	       (l->tls && p->kind == PUMP_TLS_TX ? xp_tls_unsent(l->tls) : 0) +
	       (p->kc.replaying ? (size_t)(p->teed - p->sent) : 0);
}

int xp_frame_finish_out(struct xp_worker *w, struct xp_pump *p, int dst)
{
	struct pool_link *l = p->link;

	if (xp_frame_send(w, p, dst) < 0 && errno != EAGAIN && errno != ENOBUFS)
		return -errno;
	/* END follows the last byte: after what is sent again too */
	if (!p->fout.end_sent && !p->fout.len && !p->fout.left && !xp_frame_unsent(p) &&
	    p->held == 0) {
		hdr_start(l, XP_FRAME_END, 0, p->sent);
		p->fout.end_sent = true;
	}
	if (hdr_flush(l) < 0 || tls_flush(l) < 0)
		return errno == EAGAIN ? -EAGAIN : -errno;
	if (!p->fout.end_sent || xp_frame_unsent(p))
		return -EAGAIN;
	if (p->acked < p->sent) {
		p->wait_ack = true;
		return 1;
	}
	p->wait_ack = false;
	return 0;
}

/* Reads header bytes from the node hop: the socket, or the TLS session. */
ssize_t xp_frame_hop_read(struct xp_pump *p, int src, void *buf, size_t len)
{
	if (p->kind == PUMP_TLS_RX) {
		ssize_t n = xp_tls_read(p->link->tls, buf, len, &p->want);

		if (n < 0) {
			errno = n == -EPIPE ? ECONNRESET : (int)-n;
			return -1;
		}
		return n;
	}
	if (p->kind == PUMP_COPY)
		return read(src, buf, len);
	return recv(src, buf, len, MSG_DONTWAIT);
}

/* Drops the first n bytes of a pipe (to /dev/null, no copy). 0, or -errno. */
static int pipe_drop(struct xp_worker *w, int fd, uint64_t n)
{
	while (n > 0) {
		ssize_t k = splice(fd, NULL, w->devnull, NULL, n, SPLICE_F_NONBLOCK);

		if (k <= 0)
			return k < 0 ? -errno : -EIO;
		n -= (uint64_t)k;
	}
	return 0;
}

/* Drops the first n bytes kept, from the head pipe on. 0, or -errno. */
static int chain_drop(struct xp_worker *w, struct keep_chain *kc, uint64_t n)
{
	while (n > 0) {
		size_t k = kc->cnt[kc->head] < n ? kc->cnt[kc->head] : (size_t)n;
		int r;

		if (k == 0)
			return -EIO; /* fewer kept than counted: never */
		r = pipe_drop(w, kc->fd[kc->head][0], k);
		if (r < 0)
			return r;
		kc->cnt[kc->head] -= k;
		n -= k;
		if (kc->cnt[kc->head] == 0 && kc->head != kc->tail)
			kc->head = (kc->head + 1) % kc->n;
	}
	return 0;
}

/* The peer delivered everything up to off of direction 0: what was kept of it goes. */
static int on_ack(struct xp_worker *w, struct pool_link *l, uint64_t off)
{
	struct xp_pump *o = &l->p[0];

	/* Below what is acknowledged: an ACK that left before a resumption moved the mark. */
	if (off > o->sent)
		return -EBADMSG;
	if (off <= o->acked)
		return 0;
	if (!o->ring) {
		int r = chain_drop(w, &o->kc, off - o->acked);

		if (r < 0)
			return r;
	}
	o->acked = off;
	l->pinged = false;
	atomic_store_explicit(&l->pub_acked, off, memory_order_relaxed);
	xp_frame_publish_kept(l);
	if (o->wait_ack && !o->armed && !o->done) {
		o->wait_ack = false;
		ready_push(w, o);
	}
	return 0;
}

/*
 * Reads and handles frames until a DATA frame is open or would block. Returns 1 with a DATA
 * frame open, 0 at END (once seen, every later call returns 0 at once unless control is set:
 * then it reads on, ACKs and a repeated END only), or -1 with errno.
 */
static int frames(struct xp_worker *w, struct xp_pump *p, int src, bool control)
{
	struct pool_link *l = p->link;
	struct frame_in *f = &p->fin;
	struct xp_frame fr;

	for (;;) {
		ssize_t n;

		if (f->left > 0)
			return 1;
		if (f->end && !control)
			return 0;
		n = xp_frame_hop_read(p, src, f->hdr + f->have, XP_FRAME_LEN - f->have);
		if (n == 0) {
			errno = ECONNRESET;
			return -1;
		}
		if (n < 0)
			return -1;
		f->have += (unsigned int)n;
		if (f->have < XP_FRAME_LEN)
			continue;
		f->have = 0;
		if (xp_frame_get(f->hdr, &fr) < 0) {
			errno = EBADMSG;
			return -1;
		}
		switch (fr.type) {
		case XP_FRAME_ZDATA:
		case XP_FRAME_DATA:
			/* ZDATA only from a peer that was told it may */
			if (f->end || fr.off != in_have(p) ||
			    (fr.type == XP_FRAME_ZDATA && !(l->z && l->opts.z.in))) {
				errno = EBADMSG;
				return -1;
			}
			f->left = fr.len;
			f->zdata = fr.type == XP_FRAME_ZDATA;
			break;
		case XP_FRAME_ACK: {
			int r = on_ack(w, l, fr.off);

			if (r < 0) {
				errno = -r;
				return -1;
			}
			break;
		}
		case XP_FRAME_PING:
			/* the peer waits for an ACK; it goes at the next frame boundary */
			if (fr.off < in_have(p)) {
				errno = EBADMSG;
				return -1;
			}
			l->ping_due = true;
			xp_frame_ack(w, l);
			break;
		case XP_FRAME_GONE:
			/* the peer's QEMU closed: what ours still writes is an error (pump_take); off
			 * counts our direction, what the peer delivered of it before */
			if (fr.off > l->p[0].sent) {
				errno = EBADMSG;
				return -1;
			}
			l->p[0].peer_gone = true;
			if (!l->p[0].armed && !l->p[0].done)
				ready_push(w, &l->p[0]);
			break;
		case XP_FRAME_END:
			/* again after a resumption: the same length */
			if (fr.off != in_have(p)) {
				errno = EBADMSG;
				return -1;
			}
			if (!f->end) {
				f->end = true;
				if (!control)
					return 0;
			}
			break;
		}
	}
}

ssize_t xp_frame_in_open(struct xp_worker *w, struct xp_pump *p, int src, size_t len)
{
	int r = frames(w, p, src, false);

	if (r <= 0)
		return r;
	return (ssize_t)(len < p->fin.left ? len : p->fin.left);
}

void xp_frame_in_took(struct xp_pump *p, size_t n)
{
	p->fin.left -= n;
}

void xp_frame_ack(struct xp_worker *w, struct pool_link *l)
{
	struct xp_pump *o = &l->p[0];

	if (l->suspending || l->suspended || l->closing || l->fd[1] < 0)
		return;
	/* Mid-frame, direction 0 is waiting to write on the node hop and sends it after. */
	if (o->fout.left)
		return;
	ack_start(l);
	if (hdr_flush(l) == 0)
		(void)tls_flush(l);
	(void)w;
}

void xp_frame_park(struct xp_worker *w, struct xp_pump *p)
{
	struct pool_link *l = p->link;

	(void)w;
	p->wait_ack = true;
	if (l->pinged || p->fout.len || p->fout.left)
		return;
	/* what it keeps is full: the peer acknowledges at its own pace, unless asked */
	l->pinged = true;
	hdr_start(l, XP_FRAME_PING, 0, p->sent);
	if (hdr_flush(l) == 0)
		(void)tls_flush(l);
}

bool xp_frame_wants_out(const struct pool_link *l)
{
	const struct xp_pump *o = &l->p[0];

	if (!o->fout.left && (ack_due(l) || (l->p[1].fin.discard && !l->gone_sent)))
		return true;
	return xp_frame_unsent(o) > 0 && !(o->armed && o->armed_side == 1);
}

int xp_frame_finish_in(struct xp_worker *w, struct xp_pump *p)
{
	struct pool_link *l = p->link;

	xp_frame_ack(w, l);
	if (ack_due(l) || xp_frame_unsent(&l->p[0]))
		return -EAGAIN;
	p->final_acked = true;
	return 0;
}

void xp_frame_drop_rest(struct xp_pump *p)
{
	p->dropped += p->held;
	p->held = 0;
	p->fin.discard = true;
}

ssize_t xp_frame_discard(struct xp_worker *w, struct xp_pump *p, int src, size_t len)
{
	ssize_t n;

	if (len > DIGEST_PEEK_MAX)
		len = DIGEST_PEEK_MAX;
	if (p->kind == PUMP_TLS_RX) {
		n = xp_tls_read(p->link->tls, w->dg_peek, len, &p->want);
		if (n < 0) {
			errno = n == -EPIPE ? ECONNRESET : (int)-n;
			return -1;
		}
	} else {
		n = recv(src, w->dg_peek, len, MSG_DONTWAIT);
	}
	if (n == 0) {
		errno = ECONNRESET;
		return -1;
	}
	if (n > 0) {
		if (p->dg)
			vm_digest_update(p->dg, w->dg_peek, (size_t)n);
		p->fin.left -= (uint64_t)n;
		p->dropped += (uint64_t)n;
		p->link->res.undelivered += (uint64_t)n;
	}
	return n;
}

/* Whether both directions are complete: what this side sent is acknowledged, what the peer sent
 * is delivered and acknowledged, and both ENDs are through. */
static bool complete(const struct pool_link *l)
{
	const struct xp_pump *o = &l->p[0], *in = &l->p[1];

	return o->eof && o->held == 0 && o->fout.end_sent && !xp_frame_unsent(o) &&
	       o->acked == o->sent && in->fin.end && in->held == 0 && in->final_acked;
}

void xp_frame_close_hop(struct xp_worker *w, struct pool_link *l)
{
	struct xp_pump *in = &l->p[1];
	enum xp_tls_want want;

	if (l->hop_closing)
		return;
	l->hop_closing = true;
	if (l->tls) {
		(void)xp_tls_shutdown(l->tls, &want);
		(void)xp_tls_flush(l->tls, &want);
	}
	(void)shutdown(l->fd[1], SHUT_WR);
	in->done = false;
	if (!in->armed)
		ready_push(w, in);
}

void xp_frame_hop_closing(struct xp_worker *w, struct pool_link *l)
{
	struct xp_pump *in = &l->p[1];

	/* What still comes is late ACKs; the peer's FIN (or its failure) ends the link. */
	if (frames(w, in, l->fd[1], true) < 0 && errno == EAGAIN) {
		xp_pump_arm_poll(w, in, l->fd[1], POLLIN | POLLRDHUP);
		return;
	}
	xp_link_close(w, l, XP_END_CLEAN, 0, 0);
}

/* Reads frames once direction 1's own stream is complete (ACKs for direction 0). Returns 0
 * with a poll armed, or -errno; a peer that ends the hop once all is complete ends the link. */
int xp_frame_in_control(struct xp_worker *w, struct xp_pump *p)
{
	struct pool_link *l = p->link;

	if (frames(w, p, l->fd[1], true) < 0) {
		if (errno == EAGAIN) {
			xp_pump_arm_poll(w, p, l->fd[1],
					 POLLIN | POLLRDHUP | (xp_frame_wants_out(l) ? POLLOUT : 0));
			return 0;
		}
		if (errno == ECONNRESET && complete(l)) {
			xp_frame_close_hop(w, l);
			xp_link_close(w, l, XP_END_CLEAN, 0, 0);
			return 0;
		}
		return -errno;
	}
	return 0;
}

bool xp_frame_complete(const struct pool_link *l)
{
	return complete(l);
}

void xp_frame_suspend(struct xp_worker *w, struct pool_link *l, int err)
{
	/* a link that holds still for its move is left alone: the other process resumes it */
	if (l->suspending || l->suspended || l->closing || l->freezing || l->quiesced)
		return;
	l->quiescing = false;
	l->suspending = true;
	l->res.err = err;
	l->res.err_side = 1;
	l->res.asked = err == 0;
	if (xp_link_cancel_polls(w, l))
		xp_frame_suspended(w, l);
}

void xp_frame_suspended(struct xp_worker *w, struct pool_link *l)
{
	struct xp_pump *o = &l->p[0], *in = &l->p[1];

	xp_ready_unlink(w, l);
	if (l->tls) {
		snprintf(l->res.detail, sizeof(l->res.detail), "%s", xp_tls_sess_io_error(l->tls));
		xp_tls_sess_free(l->tls);
		l->tls = NULL;
	} else {
		l->res.detail[0] = '\0';
	}
	xp_close_reset(l->fd[1]);
	l->fd[1] = -1;
	/* The frame on its way is abandoned: the peer's offset says where to go on. */
	memset(&o->fout, 0, sizeof(o->fout));
	xp_frame_z_reset(l);
	in->fin.have = 0;
	in->fin.left = 0;
	in->final_acked = false;
	o->wait_ack = false;
	l->ack_sent = 0;
	l->gone_sent = false; /* said again after the resumption */
	l->ping_due = l->pinged = false;
	for (int d = 0; d < 2; d++) {
		l->p[d].want = XP_TLS_WANT_NONE;
		l->res.bytes[d] = atomic_load_explicit(&l->p[d].bytes, memory_order_relaxed);
	}
	l->res.end = XP_END_SUSPENDED;
	l->res.have = in_have(in);
	l->res.kept_from = o->acked;
	l->res.kept_to = o->sent;
	atomic_store_explicit(&l->pub_have, l->res.have, memory_order_relaxed);
	atomic_store_explicit(&l->pub_acked, o->acked, memory_order_relaxed);
	atomic_store_explicit(&l->pub_sent, o->sent, memory_order_relaxed);
	l->suspending = false;
	l->suspended = true;
	xp_outbox_post(w, l->idx | OUTBOX_SUSPENDED);
}

/*
 * Splice, at a resumption from have: keep drops what the peer has, the pipe what it had sent
 * of keep's, and the replay starts at keep's head (the rest of the pipe, read from QEMU and
 * not yet kept, follows it). 0 or -errno.
 */
static int rewind_chain(struct xp_worker *w, struct xp_pump *o, uint64_t have)
{
	struct keep_chain *kc = &o->kc;
	uint64_t sent_part = o->teed - o->sent;
	int r;

	r = chain_drop(w, kc, have - o->acked);
	if (r == 0)
		r = pipe_drop(w, o->pipe[0], sent_part);
	if (r < 0)
		return r;
	o->held -= (size_t)sent_part;
	if (kc->replay[0] < 0) {
		if (pipe2(kc->replay, O_NONBLOCK | O_CLOEXEC) < 0)
			return -errno;
		(void)fcntl(kc->replay[1], F_SETPIPE_SZ, (int)kc->size);
		r = fcntl(kc->replay[1], F_GETPIPE_SZ);
		if (r < 0 || (size_t)r < kc->size)
			return -ENOBUFS;
	}
	/* a replay cut short by the last failure */
	r = pipe_drop(w, kc->replay[0], kc->replay_held);
	if (r < 0)
		return r;
	kc->replay_held = 0;
	kc->replaying = have < o->teed;
	kc->replay_next = kc->head;
	return 0;
}

void xp_frame_resume(struct xp_worker *w, struct pool_link *l)
{
	struct xp_pump *o = &l->p[0], *in = &l->p[1];
	uint64_t have = l->resume_from;
	int r = 0;

	if (!l->live || !l->suspended || l->closing) {
		xp_tls_sess_free(l->resume_tls);
		xp_close_reset(l->resume_fd);
		return;
	}
	l->fd[1] = l->resume_fd;
	l->tls = l->resume_tls;
	l->resume_fd = -1;
	l->resume_tls = NULL;
	l->suspended = false;
	if (have < o->acked || have > o->sent) {
		xp_link_close(w, l, XP_END_ERROR, -ERANGE, 1);
		return;
	}
	if (l->tls)
		r = xp_tls_sess_batch(l->tls, TLS_BATCH_SIZE);
	if (r == 0 && !o->ring) {
		r = rewind_chain(w, o, have);
	} else if (r == 0) {
		uint64_t back = o->sent - have;

		o->head = (size_t)((o->head + o->ring - back % o->ring) % o->ring);
		o->held += (size_t)back;
	}
	if (r < 0) {
		xp_link_close(w, l, XP_END_ERROR, r, 0);
		return;
	}
	atomic_fetch_add_explicit(&l->pub_replayed, o->sent - have, memory_order_relaxed);
	atomic_fetch_add_explicit(&l->pub_resumed, 1, memory_order_relaxed);
	o->sent = o->acked = have;
	atomic_store_explicit(&l->pub_acked, have, memory_order_relaxed);
	atomic_store_explicit(&l->pub_sent, have, memory_order_relaxed);
	xp_frame_publish_kept(l);
	/* A completed direction says so again: the END may not have arrived. */
	if (o->eof)
		o->done = false;
	o->fout.end_sent = false;
	for (int d = 0; d < 2; d++)
		if (!l->p[d].done)
			ready_push(w, &l->p[d]);
	(void)in;
}
