/* SPDX-License-Identifier: Apache-2.0 */
/* The data path's own header, shared by xp_pool.c (the pool, its workers, their rings and inboxes,
 * the link lifecycle) and xp_pump.c (one direction's byte moving): the records of a worker and its
 * links, and the calls between the two files. Nothing outside transport/ includes it. */
#ifndef XP_POOL_PRIV_H
#define XP_POOL_PRIV_H

#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "digest.h"
#include "xp_pool.h"
#include "xp_tls.h"

enum { OP_INBOX = 1, OP_POLL, OP_CANCEL, OP_TIMER };

#define UD(op, dir, idx) ((uint64_t)(op) << 56 | (uint64_t)(dir) << 48 | (uint64_t)(idx))
#define UD_OP(ud)	 ((unsigned int)((ud) >> 56))
#define UD_DIR(ud)	 ((unsigned int)((ud) >> 48) & 0xff)
#define UD_IDX(ud)	 ((uint32_t)(ud))

/* Plaintext buffered per direction of a TLS link: sixteen full records. */
#define TLS_BUF_SIZE (256 * 1024)
#define TLS_RECORD   16384
/* Ciphertext written per write(2): sixteen records and their headers. */
#define TLS_BATCH_SIZE (16 * (TLS_RECORD + 256))
/* The most a tap is shown at once where bytes are spliced (MSG_PEEK into this buffer). */
#define TAP_PEEK_MAX (64 * 1024)
/* Where bytes are spliced and digested, the most read at once with MSG_PEEK (one per worker). */
#define DIGEST_PEEK_MAX (256 * 1024)

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
	struct pool_link *link;
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
	uint8_t *peek;	   /* SPLICE: bytes shown with MSG_PEEK */
	size_t tap_seen;   /* bytes shown to the tap, not yet moved */
	uint64_t tap_skip; /* after those, bytes it lets pass unseen */
	struct vm_digest *dg; /* what it read, in order; NULL: no digest */
};

struct pool_link {
	struct xp_link base; /* first: xp_pool_attach hands out &base */
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

#define POOL_LINK(xl)	    container_of(xl, struct pool_link, base)
#define CONST_POOL_LINK(xl) container_of(xl, const struct pool_link, base)

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
	struct pool_link *links;
	/* control thread only */
	uint32_t *free_slots;
	unsigned int nfree;
	/* worker only */
	unsigned int nlive;
	bool quit;
	bool posted;
	struct xp_pump *ready_head, *ready_tail;
	uint8_t *dg_peek; /* DIGEST_PEEK_MAX: spliced bytes shown to a digest */
	int init_err;
};

/* Both files queue SQEs through it: inline here, rather than a call across files. */
static inline struct io_uring_sqe *get_sqe(struct xp_worker *w)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);

	if (!sqe) {
		io_uring_submit(&w->ring);
		sqe = io_uring_get_sqe(&w->ring);
	}
	return sqe;
}

static inline void ready_push(struct xp_worker *w, struct xp_pump *p)
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

/* xp_pool.c, on the link's worker */
/* Starts tearing a link down: polls in flight are cancelled, their completions awaited. */
void xp_link_close(struct xp_worker *w, struct pool_link *l, enum xp_link_end end, int err,
		   unsigned int side);

/* xp_pump.c, on the link's worker */
/* Runs one direction that is neither armed nor done; queues it again when it stopped on its
 * budget, and closes the link on an error or when both directions are done. */
void xp_pump_step(struct xp_worker *w, struct xp_pump *p);

#endif
