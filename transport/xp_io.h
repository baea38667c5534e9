/* SPDX-License-Identifier: Apache-2.0 */
/* Everything proxy/ asks of the layer below, as one ops table: the control thread's loop, the
 * listeners and connects, set-up I/O on a node-hop connection (through TLS or not), and the data
 * path that carries a finished one. xp_io_new() makes the real one; proxy's tests bring a fake. */
#ifndef XP_IO_H
#define XP_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "xp_loop.h"
#include "xp_pool.h"
#include "xp_sock.h"

struct xp_io;
struct xp_tls;
struct xp_dhop;

/*
 * A node-hop connection while it is set up: its socket, and its TLS session once the handshake
 * began. An implementation embeds it in an object of its own; fd is what the loop watches.
 */
struct xp_conn {
	int fd;
};

/* What a connection runs on, once its handshake is done (for log lines and status). */
struct xp_conn_info {
	char version[16]; /* "TLSv1.3"; empty in plain text */
	char cipher[48];
	char crypto[16]; /* "user-space", "ktls" or "ktls-tx" */
	bool resumed;	 /* from a session ticket */
	bool vmigd;	 /* the peer agreed on XP_TLS_ALPN(2): it speaks the preamble */
	bool digests;	 /* ... XP_TLS_ALPN2: and checks connection digests */
	bool resume;	 /* ... XP_TLS_ALPN3: and resumes connections over new ones */
	/* "tls=TLSv1.3 cipher=... crypto=... resumed=no peer=\"...\"", or "tls=off" */
	char describe[320];
	char peer_name[160]; /* the peer certificate's subject; empty in plain text */
};

/* Why an operation on a set-up connection failed, in the operator's words. */
struct xp_conn_why {
	const char *token;  /* a TLS refusal ("untrusted-ca", ...), else NULL */
	unsigned int refusal; /* the same as an enum xp_tls_refusal; 0 (XP_TLS_OK): none */
	bool closed;	    /* that refusal is "closed": the peer hung up during the handshake */
	const char *detail; /* OpenSSL's reason; NULL when the -errno says it all */
};

/* How a handshake goes: which side, and whether this connection is TLS at all. */
enum {
	XP_HS_SERVER = 1 << 0, /* this side accepted the connection */
	XP_HS_TLS = 1 << 1,    /* TLS (the migration's choice); without it, done at once */
	XP_HS_FRESH = 1 << 2,  /* client: a full handshake, neither offering nor keeping a ticket */
};

/* The data path's shape, for `status` and the start-up line. */
struct xp_io_info {
	unsigned int threads;
	const char *data_path; /* "io_uring+splice", "io_uring+copy", "io_uring+openssl", ... */
	/* With TLS: why this node cannot connect as a TLS client (its client certificate is
	 * for servers only), or NULL. */
	const char *tls_client_problem;
	/* The DPDK node hop's address (host order) and UDP port; 0: none (--dpdk not given). */
	uint32_t dpdk_ip;
	uint16_t dpdk_port;
};

/* What the DPDK node hop did, for metrics and status: its port and all its links, live and
 * ended. proxy/ hands it on whole (px_node_info), and the figures read it there. */
struct xp_hop_stats {
	uint64_t rx_frames, tx_frames, tx_bursts, arp_learned;
	uint64_t retransmitted_frames, timeouts, fast_recoveries;
	uint64_t forged, replayed, too_old, malformed, unknown_stream, unknown_peer;
	uint64_t polls, sleeps; /* loop rounds, and rounds that ended in a sleep */
	/* what the test build's impairing port did (xp_dhop_wrap's stats); 0 in the product */
	uint64_t dropped_by_test, duplicated_by_test, reordered_by_test;
	bool link_up;		    /* the port's link, as the hop's thread last saw it */
	uint64_t link_restarts;	    /* a memif client's port restarted to try its handshake again */
	uint64_t unreachable_peers; /* peers new connections do not go to (xp_hop_health) */
};

/*
 * Whether new connections should take the DPDK node hop, as its thread last saw it: the port's
 * link, and the peers it found unreachable (a link to them failed unheard: ARP unanswered, or
 * silent). Such a peer is asked for by ARP once a second, and is reachable again once it answers.
 */
#define XP_HOP_HEALTH_PEERS 8
struct xp_hop_health {
	bool link_up;
	uint64_t link_for_ms; /* the link has been so (up or down) this long */
	char link_why[160];   /* when down: why, in words */
	unsigned int npeers;
	struct {
		uint32_t ip; /* host order */
		char why[192]; /* a failed link's reason (xp_link_result.detail) */
	} peers[XP_HOP_HEALTH_PEERS];
};

/*
 * Calls return 0 (or a count) or -errno, and write their out parameters only on success. Every
 * function runs on the control thread. io is the context the table was handed with.
 */
struct xp_io_ops {
	/* The control thread's loop (xp_loop.h). */
	int (*watch_add)(void *io, int fd, uint32_t events, xp_watch_fn fn, void *arg,
			 struct xp_watch **ret);
	int (*watch_mod)(void *io, struct xp_watch *w, uint32_t events);
	void (*watch_del)(void *io, struct xp_watch *w); /* takes NULL */
	int (*watch_pause)(void *io, struct xp_watch *w, uint64_t ms);
	int (*timer_add)(void *io, uint64_t deadline_ms, xp_timer_fn fn, void *arg,
			 struct xp_timer **ret);
	void (*timer_del)(void *io, struct xp_timer *t); /* takes NULL */
	uint64_t (*now_ms)(void *io);

	/* Starts the data path; done runs on the control thread whenever a link has ended. */
	int (*start)(void *io, xp_link_done_fn done, void *arg);
	void (*info)(void *io, struct xp_io_info *out);
	/* The DPDK node hop's figures; -ENOENT where the io has none. */
	int (*hop_stats)(void *io, struct xp_hop_stats *out);
	/* The DPDK node hop's health (it may change any time after); -ENOENT where there is none. */
	int (*hop_health)(void *io, struct xp_hop_health *out);

	/* Listeners: the node hop's TCP one, and the local unix ones of a source, each name in
	 * a directory others may write (dirfd: xp_path.h). */
	int (*listen_tcp)(void *io, const struct xp_addr *a, int *ret_fd, struct xp_addr *bound);
	int (*listen_unix)(void *io, int dirfd, const char *name, const struct xp_unix_owner *owner,
			   int *ret_fd);
	/* A listening TCP socket handed over by another vmigd (--takeover): its address. */
	int (*listen_adopt)(void *io, int fd, struct xp_addr *bound);
	/* The next node-hop connection, and its peer's address as text; -EAGAIN: none waiting. */
	int (*accept)(void *io, int lfd, struct xp_conn **ret, char *peer, size_t peerlen);
	/* The next local connection of a unix listener, a plain fd; -EAGAIN: none waiting. */
	int (*accept_local)(void *io, int lfd, int *ret_fd);

	/*
	 * A node-hop connect: 0 when connected at once, 1 while in progress (wait for EPOLLOUT,
	 * then call connected()). peer names the target for the client's TLS session cache.
	 */
	int (*connect)(void *io, const struct xp_addr *a, const char *peer, struct xp_conn **ret);
	int (*connected)(void *io, struct xp_conn *c);
	/* A blocking connect to a local unix socket, waiting up to timeout_ms for its backlog;
	 * path resolved without links, the socket owned by root, vmigd or owner_uid
	 * (xp_unix_connect_checked). */
	int (*connect_local)(void *io, const char *path, int owner_uid, unsigned int timeout_ms,
			     int *ret_fd);

	/*
	 * TLS, with XP_HS_TLS in flags: 0 once done and the peer is allowed (at once in plain
	 * text), -EAGAIN with the epoll events to wait for in *events, or -errno (then why()).
	 * -ENOTSUP: TLS asked for on an io made without it (vmigd --no-tls).
	 */
	int (*handshake)(void *io, struct xp_conn *c, unsigned int flags, uint32_t *events);
	/*
	 * A source about to relay raw (no reply to wait for): 0 once the server's first record
	 * came (in TLS 1.3 it refuses a client certificate only there), at once in plain text or
	 * TLS 1.2; -EAGAIN with *events; -errno (then why()).
	 */
	int (*await_server)(void *io, struct xp_conn *c, uint32_t *events);
	/* Bytes, 0 at the end of the stream, -EAGAIN with *events, or -errno (-EPROTO: TLS). */
	ssize_t (*read)(void *io, struct xp_conn *c, void *buf, size_t len, uint32_t *events);
	ssize_t (*write)(void *io, struct xp_conn *c, const void *buf, size_t len,
			 uint32_t *events);
	/* For a failed handshake, read or write (err: what it returned). */
	void (*why)(void *io, const struct xp_conn *c, int err, struct xp_conn_why *out);
	void (*conn_info)(void *io, const struct xp_conn *c, struct xp_conn_info *out);
	/*
	 * Closes a connection that is not carried: so that the peer sees a reset, or, once
	 * anything was written on it (an alert, a reply), so that that reaches it. Takes NULL.
	 */
	void (*close)(void *io, struct xp_conn *c);
	/* A local fd: reset the peer (a refused source connection) or just close. Takes -1. */
	void (*close_fd)(void *io, int fd, bool reset);

	/*
	 * Hands local_fd and c to the data path as a link: on success both belong to it (c is
	 * gone), and done follows when the link ends. -EBUSY when every slot is taken. c NULL: a
	 * resumable link moved here from another process (o->adopt), suspended until resumed.
	 */
	int (*attach)(void *io, int local_fd, struct xp_conn *c, const struct xp_link_opts *o,
		      struct xp_link **ret);
	void (*link_abort)(void *io, struct xp_link *l);
	void (*link_bytes)(void *io, const struct xp_link *l, uint64_t out[2]);
	uint64_t (*link_shaped_ns)(void *io, const struct xp_link *l);
	void (*link_set_pacing)(void *io, struct xp_link *l, uint64_t rate);
	/*
	 * Resumable links (xp_link_opts.resume, xp_link.h): drop the node hop as if it failed (a
	 * suspension report follows through done); carry a suspended link on over c, from have,
	 * the offset of the local socket's stream the peer has (on success c is the link's;
	 * -ERANGE: outside what it kept, c still the caller's); bytes it keeps for the peer now.
	 * Live: the offsets the peer's have may take now, [acked, sent].
	 */
	void (*link_suspend)(void *io, struct xp_link *l);
	int (*link_resume)(void *io, struct xp_link *l, struct xp_conn *c, uint64_t have);
	uint64_t (*link_kept)(void *io, const struct xp_link *l);
	void (*link_range)(void *io, const struct xp_link *l, uint64_t *acked, uint64_t *sent);
	/* Moving a resumable link to another process (a takeover): xp_link.h's quiesce, state
	 * and release. */
	void (*link_quiesce)(void *io, struct xp_link *l, bool on);
	int (*link_state)(void *io, const struct xp_link *l, struct xp_link_state *out);
	void (*link_release)(void *io, struct xp_link *l);
	/* Compression figures (xp_link.h's zfig); a compressing link's mode from now on. */
	void (*link_zfig)(void *io, const struct xp_link *l, struct xp_zfig *out);
	void (*link_set_zmode)(void *io, struct xp_link *l, int mode);
};

/* The real table: sockets, OpenSSL (tls NULL: plain text), the loop and the io_uring pool. */
extern const struct xp_io_ops xp_io_ops;

/* tls is not owned and must outlive the io. hop: the DPDK node hop (xp_dhop.h) or NULL, the
 * io's on success. The pool, and the hop's thread, start in start(). */
int xp_io_new(struct xp_loop *loop, const struct xp_pool_conf *pool, struct xp_tls *tls,
	      struct xp_dhop *hop, struct xp_io **ret);
/* Joins the workers: every link's sockets close, and no done callback follows. Idempotent. */
void xp_io_stop(struct xp_io *io);
/* Stops it first. Takes NULL. */
void xp_io_free(struct xp_io *io);

#endif
