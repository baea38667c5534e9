/* SPDX-License-Identifier: Apache-2.0 */
/* The data path: a pool of worker threads, one io_uring each, that carry bytes both ways between
 * two connected sockets (a "link") with splice(2) through a pipe per direction, or through
 * OpenSSL when the node-hop side is TLS. It makes no policy
 * decisions; the control thread attaches links, may abort them, and is told when each ends. */
#ifndef XP_POOL_H
#define XP_POOL_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "xp_link.h"

struct xp_pool;
struct xp_link;
struct xp_tls_sess;
struct xp_bucket;

enum xp_path {
	XP_PATH_SPLICE, /* splice(2) through a pipe: no byte enters user space */
	XP_PATH_COPY,	/* read(2)/write(2) through a user buffer, kept for comparison */
};

struct xp_pool_conf {
	unsigned int threads; /* worker threads, one ring each */
	unsigned int slots;   /* links per worker, fixed at start-up */
	size_t pipe_size;     /* bytes per direction per link (pipe or buffer) */
	enum xp_path path;
	/* The CPUs the workers run on (NULL: any): set before each starts, so that its ring, pipes
	 * and buffers, which it allocates itself, come from those CPUs' NUMA node. */
	const cpu_set_t *cpus;
};

enum xp_link_end {
	XP_END_CLEAN,	/* both directions reached end of stream and were half-closed */
	XP_END_ERROR,	/* a socket error; err says which */
	XP_END_ABORTED, /* xp_link_abort() */
	/*
	 * Not an end: a resumable link's node hop failed (err, err_side 1) or was dropped
	 * (xp_link_suspend()); the link lives on without it, holding the local socket and what it
	 * kept, until xp_link_resume() gives it a new one or xp_link_abort() ends it. The done
	 * callback runs again when it ends.
	 */
	XP_END_SUSPENDED,
	/*
	 * Not an end either: xp_link_quiesce() holds the link still (err 0), ready to move to
	 * another process; or it cannot (err -EBUSY) and goes on. The done callback runs again.
	 */
	XP_END_QUIESCED,
	/* xp_link_release() of a quiesced link: another process carries it on. */
	XP_END_MOVED,
	/*
	 * A resumable link of the DPDK node hop whose hop failed (err, detail) or was dropped
	 * (xp_link_suspend(), asked): it is over on that path, and fallback says where it stood,
	 * its local socket and what the peer may lack included, for a link of the kernel path to
	 * start from (xp_link_opts.adopt). Valid during the done callback only; the socket is the
	 * callee's from then on.
	 */
	XP_END_FALLBACK,
};

struct xp_link_result {
	uint64_t bytes[2]; /* [0]: a to b, [1]: b to a */
	enum xp_link_end end;
	int err;	      /* -errno for XP_END_ERROR */
	int err_side;	      /* the socket that failed: 0 is fd_a, 1 is fd_b */
	bool reset_after_eof; /* a peer reset after it had been sent all its bytes */
	uint64_t undelivered; /* dropped: the local peer had closed after its last byte */
	uint64_t shaped_ns;   /* direction a to b waited this long for its buckets */
	/* why, in words, where err does not say it all: "TLS: REASON" (OpenSSL's, for an error
	 * on fd_b), or the DPDK hop's liveness rule that ended it */
	char detail[192];
	/*
	 * With xp_link_opts.digest: each direction's digest (lib/digest.h) and byte count of what
	 * it read from its source socket, in order (on a TLS side, the plaintext), undelivered
	 * bytes included.
	 */
	bool digested;
	uint64_t digest[2];
	uint64_t digest_bytes[2];
	/*
	 * The direction ended because its destination (the local peer) closed before its source's
	 * end of stream, and not all of the rest had arrived: its digest covers a prefix.
	 */
	bool digest_partial[2];
	/*
	 * Resumable links. XP_END_SUSPENDED: have, the bytes of direction b to a this side took
	 * from the node hop (the peer sends again from there); kept_from and kept_to, the offsets
	 * of direction a to b this side can still send again (the peer's have must lie between).
	 * Always: bytes of direction a to b sent again after resumptions, and how many there were.
	 */
	uint64_t have, kept_from, kept_to;
	bool asked; /* XP_END_SUSPENDED or _FALLBACK by xp_link_suspend(), not by a failure */
	const struct xp_link_state *fallback; /* XP_END_FALLBACK */
	uint64_t replayed;
	unsigned int resumed;
	struct xp_zfig z; /* compression, at the link's end (xp_link_zfig) */
};

/*
 * A passive observer of one direction's bytes (the stream inspector). Called on the worker, in
 * stream order; it can neither change nor hold back a byte. Where bytes never enter user space
 * (splice), the worker shows it the bytes it asks to see with MSG_PEEK and passes the rest unseen.
 */
struct xp_tap_ops {
	/* How many of the next bytes may pass unseen; 0: show them, *want of them at once (>= 1).
	 */
	uint64_t (*plan)(void *ctx, size_t *want);
	/* The next len bytes; buf NULL when they passed unseen (len <= the last plan()). */
	void (*feed)(void *ctx, const uint8_t *buf, size_t len);
};

/* What a resumable link does with the bytes it sends (xp_link_opts.z). */
enum xp_zmode {
	XP_Z_OFF,
	XP_Z_AUTO,   /* while its cap holds it back, there is time, and they shrink */
	XP_Z_ALWAYS, /* every chunk, whatever it saves */
};

/* What a link carries besides its two sockets. */
struct xp_link_opts {
	struct xp_tls_sess *tls; /* fd_b is TLS (handshake done); the pool owns it after attach */
	void *cookie;		 /* handed back to the done callback */
	/*
	 * Direction a to b takes its bytes from every bucket here before it reads them (NULL: not
	 * shaped). Buckets must outlive the link.
	 */
	struct xp_bucket *bucket[2];
	const struct xp_tap_ops *tap_ops[2]; /* per direction, or NULL */
	void *tap_ctx[2];		     /* must outlive the link */
	/*
	 * A stock peer's teardown (KubeVirt's Go proxy): the first direction to reach its end of
	 * stream ends the link once that direction is flushed, without waiting for the other; and
	 * a TLS peer's TCP FIN without close_notify is an end of stream, not a truncation.
	 */
	bool raw;
	/* Keep a digest of each direction's bytes (xp_link_result.digest). */
	bool digest;
	/*
	 * xp_io only: carry the link over the DPDK node hop instead (ip 0: not), to the peer's
	 * DPDK address (host order), as the stream both nodes agreed on. Buckets and taps apply
	 * there too; pacing (a TCP socket option) does not.
	 */
	struct {
		uint32_t ip;
		uint16_t port;
		uint32_t stream;
	} dpdk;
	/*
	 * Resumable (both vmigd agreed on it; never raw): fd_b carries frames (xp_frame.h);
	 * direction a to b keeps up to keep bytes it sent until the peer says it delivered them,
	 * and stops reading when that is full; a failure of fd_b suspends the link
	 * (XP_END_SUSPENDED) instead of ending it. silence_ms: fd_b's TCP user timeout and
	 * keepalive, how long a node hop that answers nothing is borne. keep 0: not resumable.
	 * Over DPDK, a failed hop ends the link XP_END_FALLBACK instead (xp_dhop.h).
	 */
	struct {
		size_t keep;
		unsigned int silence_ms;
	} resume;
	/*
	 * Resumable: a link another process quiesced and passed on, or one the DPDK hop gave up
	 * (fd_b -1): it starts suspended (an XP_END_SUSPENDED report follows at once) from these
	 * offsets, digests and kept bytes, to be resumed over a new node hop; adopt_tls: that hop
	 * will be TLS.
	 */
	const struct xp_link_state *adopt;
	bool adopt_tls;
	/*
	 * Resumable links on the kernel path only: compression (xp_frame_z.c). out: how direction
	 * a to b sends, in compressed chunks (ZDATA frames) at zstd level or as DATA; its buckets
	 * then count the chunks' bytes, not QEMU's. in: the peer may send ZDATA frames (both vmigd
	 * agreed). Either puts that direction's bytes through user space (no splice).
	 */
	struct {
		enum xp_zmode out;
		int level;
		bool in;
	} z;
};

struct vm_digest;
/* A direction's digest into res (digested, digest[dir], digest_bytes[dir]); frees *dg, NULL
 * after. Both data paths end their links with it. Takes *dg NULL. */
void xp_link_result_digest(struct xp_link_result *res, unsigned int dir, struct vm_digest **dg);

/* Runs on the control thread, from xp_pool_reap(). The link is gone when it returns. */
typedef void (*xp_link_done_fn)(void *cookie, const struct xp_link_result *res, void *arg);

int xp_pool_new(const struct xp_pool_conf *conf, xp_link_done_fn done, void *arg,
		struct xp_pool **ret);
/* Aborts every link, joins the workers. Takes NULL. */
void xp_pool_free(struct xp_pool *p);
/* Readable when finished links wait to be reaped. */
int xp_pool_event_fd(const struct xp_pool *p);
void xp_pool_reap(struct xp_pool *p);
unsigned int xp_pool_threads(const struct xp_pool *p);

/*
 * Hands fd_a and fd_b to a worker (ownership moves on success). With o->tls, fd_b is read and
 * written through that session, which the pool then owns too. -EBUSY when all slots are taken.
 */
int xp_pool_attach(struct xp_pool *p, int fd_a, int fd_b, const struct xp_link_opts *o,
		   struct xp_link **ret);
/* The link's ops (xp_link.h): abort cuts it from the worker, and its done callback follows;
 * suspend and resume as xp_link.h says (resume sets fd_b's TCP options as attach does);
 * set_pacing sets SO_MAX_PACING_RATE on fd_b from the worker, so that TCP paces what the link
 * sends (the kernel's internal pacing needs no fq qdisc); shaped_ns is direction a to b's. */

#endif
