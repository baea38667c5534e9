/* SPDX-License-Identifier: Apache-2.0 */
/* The kernel-bypass node hop's sessions: per peer, its streams (one per QEMU connection) over one
 * datagram port, demultiplexed by stream id and sealed per direction; one step moves what can
 * move. The port is an ops table: xp_dpdk in the daemon, an in-memory link in unit tests. */
#ifndef XP_HOP_H
#define XP_HOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "xp_rel.h"
#include "xp_seal.h"

struct xp_hop;
struct xp_hop_peer;

/* What arrived, handed to the hop by the port's poll: data may be changed in place (opened). */
typedef void (*xp_hop_rx_fn)(void *arg, uint32_t peer_ip, uint16_t peer_port, uint8_t *data,
			     size_t len);

struct xp_hop_port_ops {
	/* One datagram: 0, -EAGAIN when the port cannot take it now, or -errno. */
	int (*send)(void *port, uint32_t peer_ip, uint16_t peer_port, const void *data, size_t len,
		    uint64_t now_us);
	/* Hands each datagram that arrived to fn; returns how many. */
	int (*poll)(void *port, xp_hop_rx_fn fn, void *arg);
	/* Optional, zero copy (all three or none): a buffer in the port's next datagram to
	 * peer_ip, to build and seal a frame in (0, or -EAGAIN); frame_send sends its first len
	 * bytes (sealed: the payload has its own check); flush sends what the port holds back
	 * for a burst, once per step. */
	int (*frame)(void *port, uint32_t peer_ip, uint64_t now_us, uint8_t **buf, size_t *cap);
	int (*frame_send)(void *port, uint16_t peer_port, size_t len, bool sealed);
	int (*flush)(void *port);
};

struct xp_hop_conf {
	const struct xp_hop_port_ops *ops;
	void *port;
	uint32_t mss;		  /* most stream payload per frame (the port's MTU less headers) */
	unsigned int max_peers;	  /* peers the table holds (allocated up front) */
	unsigned int max_streams; /* streams per peer */
};

struct xp_hop_peer_conf {
	uint32_t ip; /* host order */
	uint16_t udp_port;
	/* Sealed when both are given (xp_seal_export's secrets, ours to send, theirs to open);
	 * both NULL: plain, for a node hop configured plain. */
	const uint8_t *tx_secret, *rx_secret;
	/* Buffer bytes for this peer, shared among its max_streams streams: each stream gets
	 * budget / max_streams for sending and as much for receiving. */
	uint32_t budget;
	/* 0: the peer is the only one at ip and takes every stream id. Else it takes the ids
	 * first_stream .. first_stream + max_streams - 1, and other peers at the same ip may hold
	 * other ids (the daemon keys each QEMU connection on its own, from its own TLS session). */
	uint32_t first_stream;
};

/* What a peer refused, by reason: nothing of a refused frame reaches a stream. */
struct xp_hop_peer_stats {
	uint64_t frames_in, frames_out, port_busy;
	uint64_t forged, replayed, too_old, malformed, unknown_stream;
	uint64_t retransmitted_frames, timeouts, fast_recoveries;
};

/* -EINVAL for a bad conf, -ENOMEM. */
int xp_hop_new(const struct xp_hop_conf *conf, struct xp_hop **ret);
/* Frees every peer and stream. */
void xp_hop_free(struct xp_hop *h);

/* -EEXIST for an address (and stream ids) already there, -ENOSPC past max_peers, -EINVAL (a
 * stream id outside the peer's range too), -ENOMEM. */
int xp_hop_peer_add(struct xp_hop *h, const struct xp_hop_peer_conf *conf,
		    struct xp_hop_peer **ret);
/* Frees the peer's streams; frames from its address are counted as from no peer after. */
void xp_hop_peer_remove(struct xp_hop *h, struct xp_hop_peer *p);
void xp_hop_peer_stats(const struct xp_hop_peer *p, struct xp_hop_peer_stats *st);

/*
 * Stream id (1 and up, the same number on both nodes: which QEMU connection it is) to this peer:
 * its xp_rel, to write into and read from. Frames for an id not opened yet are dropped and come
 * again (the sender retransmits). -EEXIST, -ENOSPC past max_streams, -EINVAL for id 0, -ENOMEM.
 */
int xp_hop_stream_open(struct xp_hop_peer *p, uint32_t id, uint64_t now_us, struct xp_rel **ret);
/* The stream by id, or NULL. */
struct xp_rel *xp_hop_stream(const struct xp_hop_peer *p, uint32_t id);

/*
 * One round: takes what the port has (opens, parses, hands each frame to its stream), then sends
 * what the streams have, a frame from each stream in turn; a port that is full ends the round.
 * Returns how many frames moved either way (0: idle). Allocates nothing.
 */
int xp_hop_step(struct xp_hop *h, uint64_t now_us);
/* The earliest time a stream's timer wants a step, UINT64_MAX for none. */
uint64_t xp_hop_deadline(const struct xp_hop *h);
/* Datagrams from an address that is no peer's. */
uint64_t xp_hop_unknown_peer(const struct xp_hop *h);

#endif
