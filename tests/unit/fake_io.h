/* SPDX-License-Identifier: Apache-2.0 */
/* A fake transport for proxy's unit tests: an xp_io_ops table whose loop, clock, sockets, TLS and
 * data path are all scripted by the test. Nothing touches the kernel: fds are numbers, watches
 * fire when the test says so, timers when the test moves the clock. */
#ifndef FAKE_IO_H
#define FAKE_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "xp_io.h"

#define FAKE_MAX	       64
#define FAKE_BUF	       4096
#define FAKE_PATH_MAX	       108
#define FAKE_TCP_LISTEN	       3  /* the node-hop listener's fd */
#define FAKE_FIRST_PORT_LISTEN 50 /* KubeVirt-mode per-port listeners, ports from 41000 */
#define FAKE_FIRST_CONN	       100
#define FAKE_FIRST_LOCAL       1000

/* A node-hop connection, as both ends see it: what the far end sent and what we wrote. */
struct fake_conn {
	struct xp_conn c;
	bool accepted; /* came from a TCP listener (the target side) */
	int lfd;       /* ... that one */
	bool alpn;     /* the source offered and the target chose XP_TLS_ALPN: a vmigd peer */
	bool alpn2;    /* ... XP_TLS_ALPN2: one that checks connection digests */
	unsigned int hs_flags; /* XP_HS_* of the last handshake call */
	/* await_server(): -EAGAIN this many times, then await_result */
	unsigned int await_again, await_calls;
	int await_result;
	/* The far end: bytes for us to read, then the end of the stream or an error. */
	uint8_t in[FAKE_BUF];
	size_t in_len, in_off;
	bool in_eof;
	int in_err; /* returned once in[] is read, instead of -EAGAIN (0: none) */
	/* What we wrote; writes take at most write_room bytes in all (0: unlimited). */
	uint8_t out[FAKE_BUF];
	size_t out_len, write_room;
	/* Connect (source): pending until fake_connect_done(); connect_err fails it. */
	bool connecting;
	int connect_err;
	/* TLS: handshake steps that answer -EAGAIN before it finishes with hs_result. */
	unsigned int hs_again, hs_calls;
	bool hs_waiting; /* answered -EAGAIN: the peer's next flight makes it readable */
	int hs_result;
	const char *refusal, *detail; /* why() of a failed handshake */
	bool refusal_closed;
	bool tls_done;
	bool closed;
	bool attached;
	char peer[80];	     /* accepted: "ADDR:PORT" the target sees (default 198.18.0.1:...) */
	char peer_name[160]; /* accepted under TLS: its certificate's subject (default /CN=fake) */
};

struct fake_link {
	int local_fd;
	struct fake_conn *conn;
	struct xp_link_opts opts;
	uint64_t bytes[2];
	uint64_t shaped_ns;
	uint64_t pacing;
	bool aborted, ended;
	/* with opts.digest: what fake_link_end() reports, per link direction (0: local to hop) */
	uint64_t digest[2], digest_bytes[2];
	bool digest_partial[2];
};

struct fake_local {
	char path[FAKE_PATH_MAX];
	int fd;
	bool closed, reset;
	struct xp_unix_owner owner; /* listeners: as asked for */
};

struct fake_io {
	uint64_t now;
	bool tls; /* the node hop runs TLS: handshakes go through hs_* */
	struct xp_watch *watches[FAKE_MAX];
	struct xp_timer *timers[FAKE_MAX];
	xp_link_done_fn done;
	void *done_arg;
	/* The node-hop listener's queue of connections to accept. */
	struct fake_conn *pending[FAKE_MAX];
	unsigned int npending;
	/* Every node-hop connection, accepted or connected, in order. */
	struct fake_conn *conns[FAKE_MAX];
	unsigned int nconns;
	int connect_err;    /* the next connect() fails at once with it */
	bool connect_later; /* connects stay in progress until fake_connect_done() */
	/* Unix listeners of the source, and the local connections QEMU made to them. */
	struct fake_local listeners[FAKE_MAX];
	unsigned int nlisteners;
	int local_queue[FAKE_MAX]; /* fds waiting on a listener, any listener: lfd per slot */
	int local_queue_lfd[FAKE_MAX];
	unsigned int nlocal_queue;
	/* Local connects of the target (to QEMU's socket), in order; the path fails if listed. */
	struct fake_local local_connects[FAKE_MAX];
	unsigned int nlocal_connects;
	char refuse_local[FAKE_PATH_MAX];
	/* Local fds closed (the source's refused or dropped QEMU connections). */
	int closed_fds[FAKE_MAX];
	bool closed_reset[FAKE_MAX];
	unsigned int nclosed_fds;
	struct fake_link links[FAKE_MAX];
	unsigned int nlinks;
	int attach_err;
	int next_fd;
	bool listened; /* the node-hop listener is made */
	/* A DPDK node hop, as info() and hop_stats() tell of it (dpdk_ip 0: none): set before
	 * the node is made. */
	uint32_t dpdk_ip; /* host order */
	uint16_t dpdk_port;
	struct xp_hop_stats hop_stats;
	/* ... and hop_health() (its link up, no peer unreachable, unless a test says otherwise) */
	struct xp_hop_health hop_health;
	unsigned int nport_listeners;
	/* A TCP port another process holds: listening on it fails with EADDRINUSE. */
	unsigned int busy_port;
};

extern const struct xp_io_ops fake_io_ops;

void fake_io_init(struct fake_io *f, bool tls);
/* Frees what the fake still holds (call after px_node_free). */
void fake_io_done(struct fake_io *f);

/* A node-hop connection from a source, waiting on the listener; the target's accept handler
 * runs when the test fires the listener's watch (fake_fire(f, FAKE_TCP_LISTEN)). */
struct fake_conn *fake_incoming(struct fake_io *f, const void *data, size_t len);
/* The same on a KubeVirt-mode port's own listener lfd. */
struct fake_conn *fake_incoming_on(struct fake_io *f, int lfd, const void *data, size_t len);
/* More bytes from the far end of c, or its end of stream. */
void fake_feed(struct fake_conn *c, const void *data, size_t len);
/* QEMU connects to the source's unix socket at path: returns the local fd. */
int fake_qemu_connect(struct fake_io *f, const char *path);
/* Runs the watch callback of fd (with the events it waits for); false if fd has no watch. */
bool fake_fire(struct fake_io *f, int fd);
/* Fires the watches of every connection and listener until nothing more happens. */
void fake_settle(struct fake_io *f);
/* The same for at most rounds rounds: for peers that keep answering "again". */
void fake_settle_some(struct fake_io *f, unsigned int rounds);
/*
 * The end of the loop's pass, as the real loop after a pass's events: the timers already due run
 * (proxy's housekeeping). fake_fire, fake_settle and fake_link_end end theirs; a test that calls
 * proxy itself (as the control socket would) ends its own.
 */
void fake_end_pass(struct fake_io *f);
/* Moves the clock and runs the timers that are due, in deadline order. */
void fake_advance(struct fake_io *f, uint64_t ms);
/* Finishes a pending connect (err 0: connected). */
void fake_connect_done(struct fake_io *f, struct fake_conn *c, int err);
/* The data path ends link l: its done callback runs. */
void fake_link_end(struct fake_io *f, struct fake_link *l, enum xp_link_end end, int err);
struct fake_link *fake_link_of(struct fake_io *f, const struct fake_conn *c);
bool fake_watched(const struct fake_io *f, int fd);
unsigned int fake_timers_live(const struct fake_io *f);

/* stderr, captured: what the daemon logged since fake_log_begin(). */
void fake_log_begin(void);
const char *fake_log(void);
void fake_log_end(void);

#endif
