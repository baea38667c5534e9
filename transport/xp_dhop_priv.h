/* SPDX-License-Identifier: Apache-2.0 */
/* The DPDK node hop's own header, shared by xp_dhop.c (the links, the thread, the bytes) and
 * xp_dhop_live.c (liveness, health and falling back to the kernel path): the records of the hop
 * and its links, and the calls between the two files. Nothing outside transport/ includes it. */
#ifndef XP_DHOP_PRIV_H
#define XP_DHOP_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "digest.h"
#include "util.h"
#include "xp_dhop.h"
#include "xp_dpdk.h"
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
	atomic_bool suspend;	   /* xp_link_suspend(): fall back to the kernel path */
	_Atomic uint64_t bytes[2]; /* [0]: local socket to the peer, [1]: the peer to it */
	_Atomic uint64_t acked;	   /* of bytes[0], what the peer has in order (once a round) */
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
	/*
	 * Falling back to the kernel path (c.resumable): res holds why; the local socket is no
	 * longer read, what came in order is delivered, then fb says where the link stood (kept:
	 * what the peer may lack, freed once reaped).
	 */
	bool falling;
	struct xp_link_state fb;
	struct xp_link_result res;
	/* compression (c.z, xp_dhop_z.c): made at attach, freed once reaped; NULL without */
	struct dhop_z *z;
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
	atomic_bool new_links; /* attach made an S_NEW slot */
	unsigned int hw;       /* the thread's: links[hw..] are none of its, what a round scans */
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
	/* the share of the last 100 ms the thread moved nothing (auto compression's input) */
	_Atomic unsigned int idle_pct;
	uint64_t win_start_ns, win_idle_ns;
};

#define DHOP_LINK(xl)	    container_of(xl, struct dhop_link, base)
#define CONST_DHOP_LINK(xl) container_of(xl, const struct dhop_link, base)

/* xp_dhop_live.c, on the hop's thread */
/* The port's link, a memif client's handshake tried again, unreachable peers asked for by ARP,
 * and the health published for the control thread. */
void xp_dhop_port_tend(struct xp_dhop *d, uint64_t now);
/* The link fails with err on side (0: QEMU's, 1: the node hop), the first reason standing. */
__attribute__((format(printf, 4, 5))) void xp_dhop_link_fail(struct dhop_link *l, int err, int side,
							     const char *fmt, ...);
/* Falling back, QEMU's socket failed: the link ends with that error. */
void xp_dhop_fall_broken(struct dhop_link *l, int err);
/* Whether the link has ended on this path (over, or fallen back): its result is filled in. */
bool xp_dhop_link_ended(struct xp_dhop *d, struct dhop_link *l, uint64_t now);

/* xp_dhop.c, for xp_dhop_z.c: each direction's bytes to its tap and digest, and the caps */
void xp_dhop_tap_feed(struct dhop_link *l, unsigned int dir, const struct iovec iov[2], size_t n);
void xp_dhop_digest_feed(struct dhop_link *l, unsigned int dir, const struct iovec iov[2],
			 size_t n);
/* A read of the local socket that gave k <= 0 bytes (errno set where k < 0): QEMU's end of
 * stream (an end, or a reset), nothing for now, or the link fails. */
void xp_dhop_read_none(struct dhop_link *l, ssize_t k);
/* A write to the local socket that gave k <= 0 bytes: true when QEMU had closed after its end
 * of stream (drop_rx now: go on, dropping what comes), false to stop for now (EAGAIN) or after
 * the link failed (falling back: xp_dhop_fall_broken()). */
bool xp_dhop_write_none(struct dhop_link *l, ssize_t k);
/* How much of room the caps let the local socket's bytes have now (room when not capped). */
size_t xp_dhop_shape(struct dhop_link *l, size_t room);

/* xp_dhop_z.c: compressed chunks. new/free on the control thread (attach, reap), the rest on
 * the hop's thread. */
int xp_dhop_z_new(const struct xp_dhop_link_conf *c, struct dhop_z **ret);
void xp_dhop_z_free(struct dhop_z *z);
bool xp_dhop_z_out(const struct dhop_link *l); /* its local socket's bytes go as chunks */
bool xp_dhop_z_in(const struct dhop_link *l);  /* the peer's come as chunks */
/* Local socket to chunks in the stream, and chunks to the local socket: bytes moved. */
size_t xp_dhop_z_send(struct dhop_link *l);
size_t xp_dhop_z_recv(struct dhop_link *l);
/* The chunks the peer acknowledged whole leave the stream's buffer; acked follows. */
void xp_dhop_z_release(struct dhop_link *l);
/* Every decoded byte went to the local socket; ... and no chunk is half in. */
bool xp_dhop_z_drained(const struct dhop_link *l);
bool xp_dhop_z_eof(const struct dhop_link *l);
/* Falling back: the plain bytes of the chunks the stream holds (those the peer may lack), which
 * end at bytes[0], in *ret (malloc'd, *len of them; NULL for none): 0, -ENOMEM, -EPROTO. */
int xp_dhop_z_kept(struct dhop_link *l, uint8_t **ret, size_t *len);
void xp_dhop_z_fig(const struct dhop_link *l, struct xp_zfig *out);
void xp_dhop_z_set_mode(struct dhop_link *l, int mode);

#endif
