/* SPDX-License-Identifier: Apache-2.0 */
/* The daemon's DPDK node hop: one port (xp_dpdk), its sessions (xp_hop) and the thread that
 * moves bytes between QEMU's local sockets and their streams, sleeping when there is nothing to
 * do. xp_io hands it links whose set-up (TLS, preamble, order) ran on a kernel TCP connection. */
#ifndef XP_DHOP_H
#define XP_DHOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "xp_hop.h"
#include "xp_io.h"
#include "xp_pool.h"
#include "xp_seal.h"

struct xp_dhop;

struct xp_dhop_conf {
	const char *eal;     /* EAL arguments (xp_dpdk_conf) */
	const char *address; /* "ADDR/PREFIX" on the port */
	uint16_t udp_port;
	uint32_t link_buffer; /* bytes per link and direction, sent or received and not yet taken */
	unsigned int max_links;
	const struct xp_dhop_wrap *wrap; /* NULL: the port as it is */
};

/*
 * Tests: a port that wraps the hop's own (xp_impair.h), made as the hop opens and freed with it,
 * so that the product carries no test machinery, only these three calls.
 */
struct xp_dhop_wrap {
	/* The wrapping port's ops and port, over the hop's own: 0 or -errno. */
	int (*wrap)(void *arg, const struct xp_hop_port_ops *ops, void *port,
		    const struct xp_hop_port_ops **ret_ops, void **ret_port);
	/* Adds what the wrapping port did to the hop's figures (the *_by_test ones). */
	void (*stats)(void *arg, const void *port, struct xp_hop_stats *st);
	void (*free)(void *arg, void *port);
	void *arg;
};

/* One link: a local socket, the stream id both nodes agreed on, the peer's DPDK address, the
 * keys (both NULL: plain), and the node-hop TCP connection, kept as the link's liveness. */
struct xp_dhop_link_conf {
	int local_fd, tcp_fd;
	uint32_t peer_ip; /* host order */
	uint16_t peer_port;
	uint32_t stream;
	const uint8_t *tx_secret, *rx_secret;
	void *cookie;
	/* As xp_link_opts: the local socket's bytes take tokens from these first (a cap), and
	 * each direction's bytes are shown to its tap ([0]: from the local socket). */
	struct xp_bucket *bucket[2];
	const struct xp_tap_ops *tap_ops[2];
	void *tap_ctx[2];
	bool digest; /* as xp_link_opts: a digest of each direction's bytes in the result */
	/*
	 * Both vmigd resume it (xp_link_opts.resume): when its DPDK path fails (a liveness rule,
	 * or the TCP connection gone before the stream's end) or it is suspended, it delivers
	 * what came in order, resets the TCP connection and ends XP_END_FALLBACK, for the kernel
	 * path to carry on from where it stood.
	 */
	bool resumable;
	size_t keep; /* resumable: the most bytes the kernel path keeps (xp_link_opts.resume) */
	/* As xp_link_opts.z, resumable links only: the local socket's bytes go as compressed
	 * chunks (out), the peer's come so (in): that direction's stream is chunks only. */
	struct {
		enum xp_zmode out;
		int level;
		bool in;
	} z;
};

/* Opens EAL and the port (err says why not: -ENOTSUP in a build without DPDK). */
int xp_dhop_new(const struct xp_dhop_conf *conf, struct xp_dhop **ret, char *err, size_t errlen);
/* Starts the thread; done runs on the caller's thread, from xp_dhop_reap(). */
int xp_dhop_start(struct xp_dhop *d, xp_link_done_fn done, void *arg);
/* Readable when ended links wait to be reaped. */
int xp_dhop_event_fd(const struct xp_dhop *d);
void xp_dhop_reap(struct xp_dhop *d);
/* Aborts every link and joins the thread; no done callback follows. Idempotent. */
void xp_dhop_stop(struct xp_dhop *d);
/* Stops it first. Takes NULL. */
void xp_dhop_free(struct xp_dhop *d);

/* This node's address on the port, host order, and the hop's UDP port. */
uint32_t xp_dhop_ip(const struct xp_dhop *d);
uint16_t xp_dhop_port(const struct xp_dhop *d);
void xp_dhop_stats(const struct xp_dhop *d, struct xp_hop_stats *st);
/* What the hop's thread last saw of its link and its peers (xp_io.h's xp_hop_health): 0. */
int xp_dhop_health(const struct xp_dhop *d, struct xp_hop_health *out);

/* Both fds belong to the hop on success (the local one goes back with an XP_END_FALLBACK
 * report); the link answers its ops (xp_link.h). Its set_pacing does nothing: the hop paces
 * itself; suspend falls back (resumable links only). -EBUSY when every slot is taken, -EEXIST when the
 * peer has a link with that stream id, -ENOMEM. */
int xp_dhop_attach(struct xp_dhop *d, const struct xp_dhop_link_conf *c, struct xp_link **ret);
#endif
