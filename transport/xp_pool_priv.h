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
#include "xp_frame.h"
#include "xp_pool.h"
#include "xp_tls.h"

enum { OP_INBOX = 1, OP_POLL, OP_CANCEL, OP_TIMER };

/* An outbox entry with this bit reports a suspended link (its slot stays taken)... */
#define OUTBOX_SUSPENDED 0x80000000u
/* ... with this one, a quiesced link, or one that cannot be (its slot stays taken too). */
#define OUTBOX_QUIESCED 0x40000000u
/* Such a report's copy of the result, in the link's rep[] (the worker may change res before the
 * control thread reaps: a link aborted while its suspension waits to be reaped). */
#define OUTBOX_REP_SHIFT 28
#define OUTBOX_REPS	 4
#define OUTBOX_REP(v)	 (((v) >> OUTBOX_REP_SHIFT) & (OUTBOX_REPS - 1))
#define OUTBOX_IDX(v)                                                                          \
	((v) & ~(OUTBOX_SUSPENDED | OUTBOX_QUIESCED |                                          \
		 (uint32_t)(OUTBOX_REPS - 1) << OUTBOX_REP_SHIFT))

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

/* A resumable link's node-hop side (xp_frame.c): the frame being read, in direction 1. */
struct frame_in {
	uint8_t hdr[XP_FRAME_LEN];
	unsigned int have; /* header bytes read */
	uint64_t left;	   /* payload of the open DATA frame still to come */
	bool end;	   /* END read: the peer's direction is complete */
	bool discard;	   /* the local peer closed: what comes is read, dropped and acknowledged */
	bool zdata;	   /* the open frame is ZDATA: its chunk is gathered whole (xp_frame_z.c) */
	bool local_done;   /* after END: the local socket was half-closed */
};

/*
 * The splice path's kept copy: pipes of one pipe's size each (no bigger pipe is needed, so no
 * CAP_SYS_RESOURCE), used in a ring from head to tail, each holding cnt bytes; after a
 * resumption, what the peer lacks is sent again pipe by pipe through replay (a tee(2) of each).
 */
#define KEEP_PIPES_MAX 16
struct keep_chain {
	int fd[KEEP_PIPES_MAX][2];
	size_t cnt[KEEP_PIPES_MAX];
	unsigned int n, head, tail;
	size_t size; /* each pipe's */
	int replay[2];
	size_t replay_held;
	unsigned int replay_next;
	bool replaying;
};

/* ... and the frame being written, in direction 0 (ACKs for direction 1 go out here too). */
struct frame_out {
	uint8_t hdr[XP_FRAME_LEN];
	unsigned int len, off; /* a header on its way: off of its len bytes written */
	uint64_t left;	       /* payload of the open DATA frame still to send */
	bool end_sent;
	bool zdata; /* the open frame is ZDATA: its payload is the link's compressed chunk */
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
	unsigned int armed_side; /* ... a POLL_ADD on fd[armed_side] */
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
	/*
	 * Resumable links (link->opts.resume.keep): direction 0 keeps what it sent until the
	 * peer acknowledges it, in a second pipe (splice: keep, [acked, teed)) or behind head in
	 * buf, a ring of ring bytes mapped twice in a row (so any ring bytes from any offset are
	 * one run). Offsets count the stream from its start; sent rewinds at a resumption, bytes
	 * (the figure) does not.
	 */
	struct frame_in fin;   /* direction 1 */
	struct frame_out fout; /* direction 0 */
	struct keep_chain kc;  /* direction 0, splice */
	size_t keep_cap;   /* what may be kept: bytes (splice), or the ring's size */
	size_t ring;	   /* buffer kinds: the ring's size; 0: a plain buffer */
	uint64_t sent;	   /* stream offset of the next byte to send */
	uint64_t teed;	   /* splice: bytes up to this offset are in keep */
	uint64_t acked;	   /* what the peer delivered */
	uint64_t dropped;  /* direction 1: read and dropped (the local peer had closed) */
	bool wait_ack;	   /* parked until an ACK makes room or completes the direction */
	bool peer_gone;	   /* direction 0: GONE read: a byte more from QEMU is an error */
	bool final_acked;  /* direction 1: the ACK of its whole stream is out */
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
	struct xp_link_state *adopt; /* opts.adopt's copy, the link's own until it ends */
	_Atomic uint64_t pace_rate;
	_Atomic bool pace_posted;
	/* control thread only */
	bool abort_sent, suspend_sent, release_sent;
	/* worker only */
	bool live;
	bool closing;
	unsigned int inflight;
	struct xp_pump p[2];
	struct xp_link_result res;
	/* the worker's copies of res for the reports that are not its end (OUTBOX_REP) */
	struct xp_link_result rep[OUTBOX_REPS];
	unsigned int nrep;
	/*
	 * Resumable links: suspending while the polls are cancelled, suspended once the node hop
	 * is closed and the control thread told; hop_closing once both directions are complete
	 * and the FIN is out, reading the hop to its end. ack_sent: direction 1's count last
	 * acknowledged; ack_every: how many delivered bytes make an ACK due.
	 */
	bool suspending, suspended, hop_closing;
	bool gone_sent; /* direction 1 in discard mode said GONE */
	/*
	 * Moving to another process (xp_link_quiesce): quiescing until all is acknowledged and
	 * delivered, freezing while its polls are cancelled, quiesced once it holds still.
	 */
	bool quiescing, freezing, quiesced;
	bool ping_due;	/* the peer asked for an ACK (PING) */
	bool pinged;	/* direction 0 asked for one, and none came since */
	uint64_t ack_sent, ack_every;
	/* set by the control thread before MSG_RESUME */
	int resume_fd;
	struct xp_tls_sess *resume_tls;
	uint64_t resume_from;
	/* for the control thread: stable while suspended, otherwise figures */
	_Atomic uint64_t pub_acked, pub_sent, pub_kept, pub_replayed, pub_have;
	_Atomic unsigned int pub_resumed;
	/* compression, with opts.z (xp_frame_z.c); NULL without */
	struct frame_z *z;
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
	int devnull;	  /* where acknowledged kept bytes and dropped ones are spliced */
	/* the share of the last full 100 ms the worker spent waiting (%), and the window's own
	 * start and wait so far: what compression's reasons report */
	unsigned int idle_pct;
	uint64_t win_start, win_wait;
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
/* Asks the kernel to end direction d's armed poll or timer. */
void xp_pump_cancel(struct xp_worker *w, struct pool_link *l, unsigned int d);
/* Cancels both directions' armed polls and timers: true when none is in flight, so the caller
 * goes on at once; otherwise handle_cqe() does, once the last one came back (closing,
 * suspending or freezing says how). */
bool xp_link_cancel_polls(struct xp_worker *w, struct pool_link *l);
/* Tells the control thread about a slot: ended, or (OUTBOX_SUSPENDED) suspended. */
void xp_outbox_post(struct xp_worker *w, uint32_t v);
/* Takes the link's directions off the ready list. */
void xp_ready_unlink(struct xp_worker *w, struct pool_link *l);
/* Starts tearing a link down: polls in flight are cancelled, their completions awaited. */
void xp_link_close(struct xp_worker *w, struct pool_link *l, enum xp_link_end end, int err,
		   unsigned int side);

/* A socket error on side (0 local, 1 node hop): a resumable link whose node hop failed is
 * suspended (xp_frame.c), any other ends with the error. */
void xp_link_fail(struct xp_worker *w, struct pool_link *l, int err, unsigned int side);

/* xp_pump.c, on the link's worker */
/* Runs one direction that is neither armed nor done; queues it again when it stopped on its
 * budget, and closes the link on an error or when both directions are done. */
void xp_pump_step(struct xp_worker *w, struct xp_pump *p);
void xp_pump_arm_poll(struct xp_worker *w, struct xp_pump *p, int fd, unsigned int mask);

/* xp_frame.c, on the link's worker: a resumable link's framing, keeping and resuming */
static inline bool framed(const struct pool_link *l)
{
	return l->opts.resume.keep > 0;
}
/* Direction 1's count of what it is done with: delivered, or dropped for a closed local peer. */
uint64_t xp_frame_in_done(const struct xp_pump *p);
/* What direction 0 keeps now, for the control thread's figures. */
void xp_frame_publish_kept(struct pool_link *l);
/* Per link, at its start: the kept pipe or the ring (direction 0), the ACK pace. */
int xp_frame_open(struct xp_worker *w, struct pool_link *l);
void xp_frame_close(struct pool_link *l);
/* Room direction 0 may fill now: what its pipe or ring and what it keeps allow. */
size_t xp_frame_room(const struct xp_pump *p);
/* Direction 0, after n bytes were filled: keeps a copy (splice: tee into keep). */
void xp_frame_filled(struct xp_pump *p, size_t n);
/* Direction 0: sends held bytes in DATA frames, and any ACK due. Payload bytes sent (>= 0), or
 * -1 with errno (EAGAIN: the node hop is full). */
ssize_t xp_frame_send(struct xp_worker *w, struct xp_pump *p, int dst);
/* Bytes of header or ciphertext direction 0 has begun and not yet written, and after a
 * resumption what it still sends again. */
size_t xp_frame_unsent(const struct xp_pump *p);
/* Direction 0 at its end of stream, all sent: END, then every byte acknowledged. 0 when
 * complete, -EAGAIN (wait for the node hop), 1 (parked for ACKs), or -errno. */
int xp_frame_finish_out(struct xp_worker *w, struct xp_pump *p, int dst);
/* Direction 1: before a fill, the next DATA frame's payload is open (handling ACK and END
 * frames on the way). How much of len may be read now (> 0), 0 at END, or -1 with errno
 * (EAGAIN; ECONNRESET: the hop ended without END; EBADMSG: a frame out of protocol). */
ssize_t xp_frame_in_open(struct xp_worker *w, struct xp_pump *p, int src, size_t len);
/* Direction 1, after n payload bytes were read. */
void xp_frame_in_took(struct xp_pump *p, size_t n);
/* Direction 1 delivered (or dropped) bytes: an ACK when one is due, if it can go now. */
void xp_frame_ack(struct xp_worker *w, struct pool_link *l);
/* Direction 0 can send nothing until an ACK frees room: parked, and the peer asked for one. */
void xp_frame_park(struct xp_worker *w, struct xp_pump *p);
/* Direction 1: whether its poll on the node hop should also wait for POLLOUT (an ACK or
 * header waits there and direction 0 will not write it). */
bool xp_frame_wants_out(const struct pool_link *l);
/* Direction 1 after its END and the local half-close: the last ACK. 0 once out, -EAGAIN. */
int xp_frame_finish_in(struct xp_worker *w, struct xp_pump *p);
/* Direction 1, once its own stream is complete: reads ACKs for direction 0 (a poll armed), or
 * ends the link when the peer closes once all is complete. 0, or -errno. */
int xp_frame_in_control(struct xp_worker *w, struct xp_pump *p);
/* Both directions complete (see xp_frame.c). */
bool xp_frame_complete(const struct pool_link *l);
/* Direction 1, the local peer closed: the rest is read and dropped (discard mode). */
void xp_frame_drop_rest(struct xp_pump *p);
/* Direction 1 in discard mode: reads and drops up to the open frame's payload. */
ssize_t xp_frame_discard(struct xp_worker *w, struct xp_pump *p, int src, size_t len);
/* Both directions complete: close_notify and FIN toward the peer, then read to its end. */
void xp_frame_close_hop(struct xp_worker *w, struct pool_link *l);
/* hop_closing: reads and drops what still comes; the link ends cleanly at the peer's end. */
void xp_frame_hop_closing(struct xp_worker *w, struct pool_link *l);
/* Suspends the link (its polls are cancelled first), then tells the control thread. */
void xp_frame_suspend(struct xp_worker *w, struct pool_link *l, int err);
/* Once the suspending link's last poll came back. */
void xp_frame_suspended(struct xp_worker *w, struct pool_link *l);
/* MSG_RESUME: carries on over the new node hop from the peer's offset. */
void xp_frame_resume(struct xp_worker *w, struct pool_link *l);
/* xp_frame_move.c, on the link's worker: moving a link to another process */
/* MSG_QUIESCE: starts quiescing, or (on false) lets a quiescing or quiesced link go on. */
void xp_frame_quiesce(struct xp_worker *w, struct pool_link *l, bool on);
/* After a step of either direction, and after an ACK: a quiescing link that is still freezes. */
void xp_frame_quiesce_check(struct xp_worker *w, struct pool_link *l);
/* Once the freezing link's last poll came back: it holds still, and the control thread hears. */
void xp_frame_frozen(struct xp_worker *w, struct pool_link *l);
/* At the start of a link moved here (opts.adopt): its offsets and digests, then suspended. */
int xp_frame_adopt(struct xp_worker *w, struct pool_link *l);

/* xp_frame.c, for xp_frame_z.c: the node hop's raw writes and reads (the socket or the TLS
 * session), in send(2)'s and recv(2)'s terms. */
ssize_t xp_frame_hop_write(struct pool_link *l, const void *buf, size_t len, bool more);
ssize_t xp_frame_hop_read(struct xp_pump *p, int src, void *buf, size_t len);

/* xp_frame_z.c: compressed chunks (ZDATA frames) */
/* On the control thread, at attach with opts.z: contexts and buffers (all of its memory);
 * they go at the reap of its end (after its figures), so the control thread may read them
 * until then. 0, -errno. */
int xp_frame_z_open(struct pool_link *l);
void xp_frame_z_close(struct pool_link *l);
void xp_frame_z_fig(const struct pool_link *l, struct xp_zfig *out);
/* A compressing link's mode from its next chunk on (not to or from XP_Z_OFF: ignored). */
void xp_frame_z_set_mode(struct pool_link *l, int mode);
/* On the worker. A suspended link's chunks on their way, in or out, are abandoned. */
void xp_frame_z_reset(struct pool_link *l);
/* Direction 0 after a round: whether it waited for tokens. */
void xp_frame_z_note(struct pool_link *l, bool throttled);
/* Direction 0, ring: whether the next of avail held bytes go compressed; if so the chunk is
 * made, and its length (> 0) returned; 0: send them as DATA. */
size_t xp_frame_z_start(struct xp_worker *w, struct xp_pump *p, size_t avail);
/* Direction 0: writes what is left of the open ZDATA frame; at its end the chunk's plain bytes
 * count as sent: those (> 0), 0 while some is left, or -1 with errno. */
ssize_t xp_frame_z_write(struct pool_link *l);
/* Direction 1, a ZDATA frame open: reads of it what has come; once it is whole, decodes it into
 * dst (room for XP_ZCHUNK_MAX) and returns the plain length; with dst NULL (discard mode) drops
 * it, digested and counted, and returns 0. 0 while some is to come; -1 with errno (EBADMSG: a
 * chunk no vmigd writes, said in res.detail). */
ssize_t xp_frame_z_read(struct xp_worker *w, struct xp_pump *p, int src, uint8_t *dst);

#endif
