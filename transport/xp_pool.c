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
 * buffer per direction (xp_tls); where kTLS took the transmit side, that direction splices. The
 * bytes of one direction are moved by xp_pump.c. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "xp_pool.h"
#include "xp_pool_priv.h"
#include "xp_sock.h"
#include "xp_tls.h"
#include "xp_zchunk.h"

enum {
	MSG_ATTACH = 1,
	MSG_ABORT,
	MSG_QUIT,
	MSG_PACE,
	MSG_SUSPEND,
	MSG_RESUME,
	MSG_QUIESCE,
	MSG_UNQUIESCE,
	MSG_RELEASE,
};

#define MSG(type, idx) ((uint32_t)(type) << 24 | (idx))

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

static void arm_inbox(struct xp_worker *w)
{
	struct io_uring_sqe *sqe = get_sqe(w);

	io_uring_prep_read(sqe, w->inbox_fd, &w->inbox_val, sizeof(w->inbox_val), 0);
	io_uring_sqe_set_data64(sqe, UD(OP_INBOX, 0, 0));
}

void xp_ready_unlink(struct xp_worker *w, struct pool_link *l)
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

void xp_link_result_digest(struct xp_link_result *res, unsigned int dir, struct vm_digest **dg)
{
	if (!*dg)
		return;
	res->digested = true;
	res->digest[dir] = vm_digest_value(*dg);
	res->digest_bytes[dir] = vm_digest_bytes(*dg);
	vm_digest_free(*dg);
	*dg = NULL;
}

static void link_finalize(struct xp_worker *w, struct pool_link *l)
{
	/* a moved link's local socket is the other process's now: closed, never reset */
	bool clean = l->res.end == XP_END_CLEAN || l->res.end == XP_END_MOVED;

	xp_ready_unlink(w, l);
	if (framed(l)) {
		l->res.replayed = atomic_load_explicit(&l->pub_replayed, memory_order_relaxed);
		l->res.resumed = atomic_load_explicit(&l->pub_resumed, memory_order_relaxed);
		xp_frame_close(l);
	}
	for (int d = 0; d < 2; d++) {
		struct xp_pump *p = &l->p[d];

		l->res.bytes[d] = atomic_load_explicit(&p->bytes, memory_order_relaxed);
		if (d == 0)
			l->res.shaped_ns =
				atomic_load_explicit(&p->shaped_ns, memory_order_relaxed);
		if (p->pipe[0] >= 0) {
			close(p->pipe[0]);
			close(p->pipe[1]);
			p->pipe[0] = p->pipe[1] = -1;
		}
		free(p->buf);
		p->buf = NULL;
		free(p->peek);
		p->peek = NULL;
		xp_link_result_digest(&l->res, d, &p->dg);
		if (l->fd[d] < 0)
			continue; /* a suspended link's node hop is gone already */
		if (clean)
			close(l->fd[d]);
		else
			xp_close_reset(l->fd[d]);
		l->fd[d] = -1;
	}
	if (l->tls) {
		if (l->res.end == XP_END_ERROR && l->res.err_side == 1)
			snprintf(l->res.detail, sizeof(l->res.detail), "TLS: %s",
				 xp_tls_sess_io_error(l->tls));
		xp_tls_sess_free(l->tls);
		l->tls = NULL;
	}
	if (l->adopt)
		free((void *)l->adopt->kept);
	free(l->adopt);
	l->adopt = NULL;
	l->opts.adopt = NULL;
	l->live = false;
	l->suspended = l->suspending = false;
	l->quiescing = l->freezing = l->quiesced = false;
	w->nlive--;
	xp_outbox_post(w, l->idx);
}

void xp_outbox_post(struct xp_worker *w, uint32_t v)
{
	/* Four entries per slot, the most outstanding: a quiescence report, a suspension
	 * report (after a quiescence let go), another quiescence report and the end. A report
	 * that is not the end carries a copy of the result as it is now: once the link ends (an
	 * abort while the report waits), res says that, and the end is reported on its own. */
	if (v & (OUTBOX_SUSPENDED | OUTBOX_QUIESCED)) {
		struct pool_link *l = &w->links[OUTBOX_IDX(v)];
		unsigned int k = l->nrep++ % OUTBOX_REPS;

		l->rep[k] = l->res;
		v |= (uint32_t)k << OUTBOX_REP_SHIFT;
	}
	spsc_push(&w->outbox, v);
	w->posted = true;
}

bool xp_link_cancel_polls(struct xp_worker *w, struct pool_link *l)
{
	for (unsigned int d = 0; d < 2; d++)
		if (l->p[d].armed)
			xp_pump_cancel(w, l, d);
	return l->inflight == 0;
}

/* Its completion finalizes (or suspends) the link. */
void xp_pump_cancel(struct xp_worker *w, struct pool_link *l, unsigned int d)
{
	struct io_uring_sqe *sqe = get_sqe(w);

	if (l->p[d].timer)
		io_uring_prep_timeout_remove(sqe, UD(OP_TIMER, d, l->idx), 0);
	else
		io_uring_prep_poll_remove(sqe, UD(OP_POLL, d, l->idx));
	io_uring_sqe_set_data64(sqe, UD(OP_CANCEL, d, l->idx));
}

void xp_link_close(struct xp_worker *w, struct pool_link *l, enum xp_link_end end, int err,
		   unsigned int side)
{
	if (l->closing)
		return;
	l->closing = true;
	l->res.end = end;
	l->res.err = err;
	l->res.err_side = side;
	if (xp_link_cancel_polls(w, l))
		link_finalize(w, l);
}

void xp_link_fail(struct xp_worker *w, struct pool_link *l, int err, unsigned int side)
{
	if (framed(l) && side == 1 && (l->hop_closing || l->p[1].fin.discard)) {
		/*
		 * Both directions were complete, and what failed is only the goodbye; or the local
		 * peer had closed (GONE is out): there is nothing to resume for, what it did not
		 * read it did not want, as on a link that is not resumable.
		 */
		xp_link_close(w, l, XP_END_CLEAN, 0, 0);
		return;
	}
	/*
	 * A frame out of protocol is the peer's fault, not the network's; the far QEMU's close
	 * (GONE) is no fault of the network either: no second try.
	 */
	if (err == -ESHUTDOWN)
		snprintf(l->res.detail, sizeof(l->res.detail),
			 "the peer's QEMU had closed its socket (the peer vmigd said so)");
	if (framed(l) && side == 1 && err != -EBADMSG && err != -ESHUTDOWN) {
		xp_frame_suspend(w, l, err);
		return;
	}
	xp_link_close(w, l, XP_END_ERROR, err, side);
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
		xp_pump_step(w, p);
		if (p == last)
			break;
	}
}

static enum pump_kind pump_kind(const struct pool_link *l, unsigned int dir,
				const struct xp_pool_conf *conf)
{
	/* a link moved here has its TLS session only once it resumes */
	bool tls = l->tls || (l->opts.adopt && l->opts.adopt_tls);

	if (tls && dir == 1)
		return PUMP_TLS_RX;
	/* kTLS encrypts whatever reaches the socket, spliced bytes included. */
	if (tls && !(l->tls && xp_tls_ktls_tx(l->tls)))
		return PUMP_TLS_TX;
	/* chunks are made and decoded in user space */
	if (l->z && (dir == 0 ? l->opts.z.out != XP_Z_OFF : l->opts.z.in))
		return PUMP_COPY;
	return conf->path == XP_PATH_COPY ? PUMP_COPY : PUMP_SPLICE;
}

/* A pipe that would not grow is said once per process: the same limit holds for the next. */
static atomic_bool pipe_size_told;

/* Per connection, never per chunk: a pipe (splice) or a buffer for one direction. */
static int pump_open(struct xp_pump *p, const struct xp_pool_conf *conf)
{
	int r, e;

	if (p->kind != PUMP_SPLICE) {
		p->cap = p->kind == PUMP_COPY ? conf->pipe_size : TLS_BUF_SIZE;
		/* a chunk is decoded whole into the buffer */
		if (p->link->z && p->cap < XP_ZCHUNK_MAX)
			p->cap = XP_ZCHUNK_MAX;
		p->buf = malloc(p->cap);
		return p->buf ? 0 : -ENOMEM;
	}
	if (pipe2(p->pipe, O_NONBLOCK | O_CLOEXEC) < 0)
		return -errno;
	/* Without CAP_SYS_RESOURCE the per-user pipe quota may refuse; keep the default size. */
	e = fcntl(p->pipe[1], F_SETPIPE_SZ, (int)conf->pipe_size) < 0 ? errno : 0;
	r = fcntl(p->pipe[1], F_GETPIPE_SZ);
	p->cap = r > 0 ? (size_t)r : 65536;
	if (e && !atomic_exchange(&pipe_size_told, true))
		log_warn("splice: a pipe would not grow to %zu bytes (--pipe-size): %s (the "
			 "per-user "
			 "quota fs.pipe-user-pages-soft, or fs.pipe-max-size); pipes keep %zu "
			 "bytes, "
			 "so each splice moves at most that. Said once",
			 conf->pipe_size, strerror(e), p->cap);
	return 0;
}

static void link_start(struct xp_worker *w, struct pool_link *l)
{
	int r = 0;

	l->live = true;
	l->closing = false;
	/* a slot's last link may have been resumable: none of its state carries over */
	l->suspending = l->suspended = l->hop_closing = l->gone_sent = false;
	l->quiescing = l->freezing = l->quiesced = false;
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
		p->kc.n = 0;
		p->kc.replay[0] = p->kc.replay[1] = -1;
		memset(&p->fin, 0, sizeof(p->fin));
		memset(&p->fout, 0, sizeof(p->fout));
		p->wait_ack = p->peer_gone = p->final_acked = false;
		p->ring = 0;
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
		p->dg = NULL;
		if (r == 0 && l->opts.digest && !(p->dg = vm_digest_new()))
			r = -ENOMEM;
	}
	if (r == 0 && framed(l))
		r = xp_frame_open(w, l);
	if (r == 0 && framed(l) && l->opts.adopt) {
		r = xp_frame_adopt(w, l);
		/* what the peer may lack is in the link's keep now */
		free((void *)l->adopt->kept);
		l->adopt->kept = NULL;
		if (r == 0)
			return; /* suspended until its resumption */
	}
	if (r < 0) {
		xp_link_close(w, l, XP_END_ERROR, r, 0);
		return;
	}
	ready_push(w, &l->p[0]);
	ready_push(w, &l->p[1]);
}

static void link_apply_pacing(struct pool_link *l)
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
		struct pool_link *l = &w->links[m & 0xffffff];

		switch (m >> 24) {
		case MSG_ATTACH:
			link_start(w, l);
			break;
		case MSG_ABORT:
			/* A link that already ended is not live any more: nothing to cut. */
			if (l->live)
				xp_link_close(w, l, XP_END_ABORTED, -ECONNABORTED, 0);
			break;
		case MSG_PACE:
			atomic_store(&l->pace_posted, false);
			if (l->live && !l->closing && l->fd[1] >= 0)
				link_apply_pacing(l);
			break;
		case MSG_SUSPEND:
			if (l->live && !l->closing && framed(l) && !l->hop_closing)
				xp_frame_suspend(w, l, 0);
			break;
		case MSG_RESUME:
			xp_frame_resume(w, l);
			break;
		case MSG_QUIESCE:
		case MSG_UNQUIESCE:
			xp_frame_quiesce(w, l, m >> 24 == MSG_QUIESCE);
			break;
		case MSG_RELEASE:
			/* quiesced for its move, or moved here and handed back unresumed */
			if (!l->live || !(l->quiesced || (l->suspended && l->fd[1] < 0)))
				break;
			l->quiesced = l->suspended = false;
			if (l->fd[1] >= 0)
				xp_close_reset(l->fd[1]);
			l->fd[1] = -1;
			xp_link_close(w, l, XP_END_MOVED, 0, 0);
			break;
		case MSG_QUIT:
			w->quit = true;
			for (unsigned int i = 0; i < w->pool->conf.slots; i++)
				if (w->links[i].live)
					xp_link_close(w, &w->links[i], XP_END_ABORTED, -ESHUTDOWN,
						      0);
			break;
		}
	}
}

static void handle_cqe(struct xp_worker *w, const struct io_uring_cqe *cqe)
{
	uint64_t ud = io_uring_cqe_get_data64(cqe);
	struct pool_link *l;
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
		if (l->suspending) {
			if (l->inflight == 0)
				xp_frame_suspended(w, l);
			return;
		}
		if (l->freezing) {
			if (l->inflight == 0)
				xp_frame_frozen(w, l);
			return;
		}
		/* POLLERR and POLLHUP come back as events; the splice reports the actual error. */
		if (cqe->res < 0 && cqe->res != -ECANCELED &&
		    !(UD_OP(ud) == OP_TIMER && cqe->res == -ETIME)) {
			xp_link_fail(w, l, cqe->res, UD_OP(ud) == OP_POLL ? p->armed_side : p->dir);
			return;
		}
		xp_pump_step(w, p);
		return;
	case OP_CANCEL:
		/*
		 * EALREADY: the poll was being woken when the cancel came (a socket's state
		 * changed, e.g. our own FIN was acknowledged, and its re-poll is queued as task
		 * work); once that runs it is armed again, with nothing left to end it. A link
		 * whose first finished direction ends it (raw) meets this at every close. Ask
		 * again: the next io_uring_enter runs the task work before it waits.
		 */
		l = &w->links[UD_IDX(ud)];
		p = &l->p[UD_DIR(ud)];
		if (cqe->res == -EALREADY && l->live &&
		    (l->closing || l->suspending || l->freezing) && p->armed)
			xp_pump_cancel(w, l, UD_DIR(ud));
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

/* Wakes the control thread for the links this worker posted back since the last call. */
static void post_done(struct xp_worker *w)
{
	if (w->posted) {
		w->posted = false;
		eventfd_write(w->pool->done_fd, 1);
	}
}

/* Waits for completions, and counts the time it waited (xp_worker.idle_pct). */
static int wait_timed(struct xp_worker *w)
{
	uint64_t t0 = vm_now_ns(), t1;
	int r = io_uring_submit_and_wait(&w->ring, w->ready_head ? 0 : 1);

	t1 = vm_now_ns();
	w->win_wait += t1 - t0;
	if (t1 - w->win_start >= 100000000ull) {
		w->idle_pct = (unsigned int)(w->win_wait * 100 / (t1 - w->win_start));
		w->win_start = t1;
		w->win_wait = 0;
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
		/* A link that ended in a ready pump, with nothing armed, brings no completion:
		 * tell the control thread before waiting, or it hears only after the next one. */
		post_done(w);
		r = wait_timed(w);
		if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
			log_err("worker %u: io_uring_submit_and_wait: %s", w->id, strerror(-r));
			break;
		}
		io_uring_for_each_cqe (&w->ring, head, cqe) {
			handle_cqe(w, cqe);
			n++;
		}
		io_uring_cq_advance(&w->ring, n);
		post_done(w);
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
	w->dg_peek = malloc(DIGEST_PEEK_MAX);
	w->idle_pct = 100; /* until its first 100 ms are measured */
	w->win_start = vm_now_ns();
	if (!w->links || !w->free_slots || !w->dg_peek)
		return -ENOMEM;
	w->devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
	if (w->devnull < 0)
		return -errno;
	r = spsc_init(&w->inbox, 8 * slots + 2);
	if (r < 0)
		return r;
	r = spsc_init(&w->outbox, 4 * slots);
	if (r < 0)
		return r;
	for (unsigned int i = 0; i < slots; i++) {
		w->links[i].w = w;
		w->links[i].idx = i;
		w->links[i].fd[0] = w->links[i].fd[1] = -1;
		w->links[i].resume_fd = -1;
		w->free_slots[i] = slots - 1 - i;
	}
	w->nfree = slots;
	if (pool->conf.cpus) {
		pthread_attr_t attr;

		pthread_attr_init(&attr);
		r = pthread_attr_setaffinity_np(&attr, sizeof(cpu_set_t), pool->conf.cpus);
		if (!r)
			r = pthread_create(&w->thread, &attr, worker_main, w);
		pthread_attr_destroy(&attr);
	} else {
		r = pthread_create(&w->thread, NULL, worker_main, w);
	}
	if (r)
		return -r;
	w->started = true;
	sem_wait(&pool->started);
	return w->init_err;
}

static void worker_post(struct xp_worker *w, uint32_t msg)
{
	/*
	 * The inbox holds five messages per slot plus QUIT, the most that can be outstanding:
	 * ATTACH, ABORT, one PACE, one SUSPEND and one RESUME each.
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
		if (w->devnull > 0)
			close(w->devnull);
		for (unsigned int k = 0; w->links && k < p->conf.slots; k++)
			xp_frame_z_close(&w->links[k]);
		free(w->links);
		free(w->free_slots);
		free(w->dg_peek);
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
			struct pool_link *l = &w->links[OUTBOX_IDX(idx)];
			struct xp_link_result res;
			void *cookie = l->cookie;

			if (idx & (OUTBOX_SUSPENDED | OUTBOX_QUIESCED)) {
				/* still the worker's: only its report changes hands, as it was when
				 * posted (the link may have ended since: its end follows) */
				res = l->rep[OUTBOX_REP(idx)];
				p->done(cookie, &res, p->arg);
				continue;
			}
			res = l->res;
			xp_frame_z_fig(l, &res.z);
			xp_frame_z_close(l);
			l->cookie = NULL;
			l->abort_sent = false;
			w->free_slots[w->nfree++] = idx;
			p->done(cookie, &res, p->arg);
		}
	}
}

static void pool_link_abort(struct xp_link *xl)
{
	struct pool_link *l = POOL_LINK(xl);

	if (l->abort_sent)
		return;
	l->abort_sent = true;
	worker_post(l->w, MSG(MSG_ABORT, l->idx));
}

static void pool_link_bytes(const struct xp_link *xl, uint64_t out[2])
{
	const struct pool_link *l = CONST_POOL_LINK(xl);

	for (int d = 0; d < 2; d++)
		out[d] = atomic_load_explicit(&l->p[d].bytes, memory_order_relaxed);
}

static void pool_link_set_pacing(struct xp_link *xl, uint64_t rate)
{
	struct pool_link *l = POOL_LINK(xl);

	atomic_store(&l->pace_rate, rate);
	/* At most one PACE in the inbox per link; it reads the newest rate when it runs. */
	if (l->abort_sent || atomic_exchange(&l->pace_posted, true))
		return;
	worker_post(l->w, MSG(MSG_PACE, l->idx));
}

static uint64_t pool_link_shaped_ns(const struct xp_link *xl)
{
	return atomic_load_explicit(&CONST_POOL_LINK(xl)->p[0].shaped_ns, memory_order_relaxed);
}

static void pool_link_suspend(struct xp_link *xl)
{
	struct pool_link *l = POOL_LINK(xl);

	if (l->abort_sent || l->suspend_sent || !framed(l))
		return;
	l->suspend_sent = true;
	worker_post(l->w, MSG(MSG_SUSPEND, l->idx));
}

/* The node hop's options on a resumable link: no Nagle (the return path's small messages),
 * and a bound on how long it may answer nothing before it counts as failed. */
static void hop_options(int fd, const struct xp_link_opts *o)
{
	int one = 1;

	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (o->resume.keep && o->resume.silence_ms)
		(void)xp_tcp_liveness(fd, o->resume.silence_ms);
}

/* Runs on the control thread after the link's suspension report: the worker leaves a
 * suspended link alone until MSG_RESUME, so the offsets it published hold still. */
static int pool_link_resume(struct xp_link *xl, int fd, struct xp_tls_sess *tls, uint64_t have)
{
	struct pool_link *l = POOL_LINK(xl);

	if (!framed(l))
		return -ENOTSUP;
	if (l->abort_sent)
		return -ECONNABORTED;
	if (have < atomic_load_explicit(&l->pub_acked, memory_order_relaxed) ||
	    have > atomic_load_explicit(&l->pub_sent, memory_order_relaxed))
		return -ERANGE;
	hop_options(fd, &l->opts);
	l->resume_fd = fd;
	l->resume_tls = tls;
	l->resume_from = have;
	l->suspend_sent = false;
	worker_post(l->w, MSG(MSG_RESUME, l->idx));
	return 0;
}

static uint64_t pool_link_kept(const struct xp_link *xl)
{
	return atomic_load_explicit(&CONST_POOL_LINK(xl)->pub_kept, memory_order_relaxed);
}

static void pool_link_range(const struct xp_link *xl, uint64_t *acked, uint64_t *sent)
{
	const struct pool_link *l = CONST_POOL_LINK(xl);

	*acked = atomic_load_explicit(&l->pub_acked, memory_order_relaxed);
	*sent = atomic_load_explicit(&l->pub_sent, memory_order_relaxed);
}

static void pool_link_quiesce(struct xp_link *xl, bool on)
{
	struct pool_link *l = POOL_LINK(xl);

	if (l->abort_sent || l->release_sent || !framed(l))
		return;
	worker_post(l->w, MSG(on ? MSG_QUIESCE : MSG_UNQUIESCE, l->idx));
}

/* After the XP_END_QUIESCED report (err 0): the worker leaves a quiesced link alone. */
static int pool_link_state(const struct xp_link *xl, struct xp_link_state *out)
{
	const struct pool_link *l = CONST_POOL_LINK(xl);

	if (!framed(l))
		return -ENOTSUP;
	memset(out, 0, sizeof(*out));
	out->fd = l->fd[0];
	out->sent = atomic_load_explicit(&l->pub_sent, memory_order_relaxed);
	out->have = atomic_load_explicit(&l->pub_have, memory_order_relaxed);
	for (int d = 0; d < 2; d++) {
		int r = l->p[d].dg ? vm_digest_save(l->p[d].dg, out->dg[d], sizeof(out->dg[d])) : 0;

		if (r < 0)
			return r;
		out->dg_len[d] = (size_t)r;
	}
	return 0;
}

static void pool_link_release(struct xp_link *xl)
{
	struct pool_link *l = POOL_LINK(xl);

	if (l->abort_sent || l->release_sent)
		return;
	l->release_sent = true;
	worker_post(l->w, MSG(MSG_RELEASE, l->idx));
}

static void pool_link_zfig(const struct xp_link *xl, struct xp_zfig *out)
{
	xp_frame_z_fig(CONST_POOL_LINK(xl), out);
}

static void pool_link_set_zmode(struct xp_link *xl, int mode)
{
	xp_frame_z_set_mode(POOL_LINK(xl), mode);
}

static const struct xp_link_ops pool_link_ops = {
	.abort = pool_link_abort,
	.bytes = pool_link_bytes,
	.shaped_ns = pool_link_shaped_ns,
	.set_pacing = pool_link_set_pacing,
	.suspend = pool_link_suspend,
	.resume = pool_link_resume,
	.kept = pool_link_kept,
	.range = pool_link_range,
	.quiesce = pool_link_quiesce,
	.state = pool_link_state,
	.release = pool_link_release,
	.zfig = pool_link_zfig,
	.set_zmode = pool_link_set_zmode,
};

int xp_pool_attach(struct xp_pool *p, int fd_a, int fd_b, const struct xp_link_opts *o,
		   struct xp_link **ret)
{
	struct xp_worker *best = NULL;
	struct pool_link *l;
	int r;

	/* The worker with the most free slots carries the fewest links. */
	for (unsigned int i = 0; i < p->nthreads; i++)
		if (p->w[i].nfree > 0 && (!best || p->w[i].nfree > best->nfree))
			best = &p->w[i];
	if (!best)
		return -EBUSY;
	if (o->adopt) {
		/* the caller's may go before the worker starts the link: a copy of its own */
		struct xp_link_state *st = malloc(sizeof(*st));
		uint8_t *kept = NULL;

		if (!st || (o->adopt->kept_len && !(kept = malloc(o->adopt->kept_len)))) {
			free(st);
			return -ENOMEM;
		}
		*st = *o->adopt;
		if (kept)
			memcpy(kept, o->adopt->kept, st->kept_len);
		st->kept = kept;
		best->nfree--;
		l = &best->links[best->free_slots[best->nfree]];
		l->adopt = st;
	} else {
		l = &best->links[best->free_slots[--best->nfree]];
	}
	l->opts = *o;
	l->opts.adopt = l->adopt;
	r = xp_frame_z_open(l);
	if (r < 0) {
		if (l->adopt)
			free((void *)l->adopt->kept);
		free(l->adopt);
		l->adopt = NULL;
		best->free_slots[best->nfree++] = l->idx;
		return r;
	}
	l->fd[0] = fd_a;
	l->fd[1] = fd_b;
	l->tls = o->tls;
	l->cookie = o->cookie;
	l->abort_sent = l->suspend_sent = l->release_sent = false;
	if (framed(l) && fd_b >= 0)
		hop_options(fd_b, o);
	atomic_store_explicit(&l->pace_rate, 0, memory_order_relaxed);
	atomic_store(&l->pace_posted, false);
	l->base.ops = &pool_link_ops;
	worker_post(best, MSG(MSG_ATTACH, l->idx));
	*ret = &l->base;
	return 0;
}
