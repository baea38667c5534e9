/* SPDX-License-Identifier: Apache-2.0 */
/* The DPDK port of the node hop: EAL, one port (an SR-IOV VF, or memif/af_packet in tests), its
 * IPv4 address with ARP for it and for peers, and UDP datagrams in and out. What rides in them is
 * xp_rel's frames. Built with -Ddpdk=enabled; otherwise every call says -ENOTSUP. */
#ifndef XP_DPDK_H
#define XP_DPDK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct xp_dpdk;

struct xp_dpdk_conf {
	const char *eal;     /* EAL arguments, split on spaces, e.g. "--no-huge -m 256 --no-pci
			      * --vdev=net_memif0,role=server,socket=/run/x.sock,socket-abstract=no" */
	const char *address; /* this node's IPv4 address on the port, "ADDR/PREFIX" */
	uint16_t udp_port;   /* the node hop's UDP port */
};

struct xp_dpdk_stats {
	uint64_t rx_frames, tx_frames, rx_bytes, tx_bytes;
	uint64_t arp_requests_sent, arp_replies_sent, arp_learned;
	uint64_t rx_not_ours, rx_bad, tx_no_mbuf, tx_ring_full, tx_no_arp;
	uint64_t tx_bursts; /* rte_eth_tx_burst() calls: frames per burst is tx_frames / this */
	uint64_t link_restarts; /* a memif client's port stopped and started again (xp_dpdk_tend) */
};

typedef void (*xp_dpdk_rx_fn)(void *arg, uint32_t peer_ip, uint16_t peer_port, uint8_t *data,
			      size_t len);

/* Whether this build has DPDK at all. */
bool xp_dpdk_built(void);
/* Starts EAL and the port; one per process (EAL's rule). -ENOTSUP without DPDK, -EINVAL for a bad
 * address, -ENODEV with no port, -EIO with err set otherwise. A memif client whose server is not
 * there yet is no error: its port starts later, from xp_dpdk_tend(). */
int xp_dpdk_open(const struct xp_dpdk_conf *conf, struct xp_dpdk **ret, char *err, size_t errlen);
/* Stops the port; EAL and the port's memory stay until the process exits (xp_dpdk.c says why). */
void xp_dpdk_close(struct xp_dpdk *d);
/* This node's address on the port (--dpdk-address), host order. */
uint32_t xp_dpdk_ip(const struct xp_dpdk *d);
/* The largest UDP payload a frame can carry (the port's MTU less IPv4 and UDP headers). */
size_t xp_dpdk_max_payload(const struct xp_dpdk *d);
/* Sends one UDP datagram to peer_ip:peer_port (host order) at once, copied. -EAGAIN while the
 * peer's MAC is not known (an ARP request went out, at most one per 100 ms) or the port's ring
 * is full; -EMSGSIZE for a payload over xp_dpdk_max_payload(). */
int xp_dpdk_send(struct xp_dpdk *d, uint32_t peer_ip, uint16_t peer_port, const void *data,
		 size_t len, uint64_t now_us);
/*
 * Zero copy: the payload area of the next datagram to peer_ip, cap bytes, to build a frame in
 * (and seal it) in place; -EAGAIN as xp_dpdk_send(). Asked again before it is sent, the same
 * buffer comes back (for this peer or another). xp_dpdk_frame_send() puts the headers in front
 * of its first len bytes and queues it; the queue leaves in one burst when full or at
 * xp_dpdk_flush(). sealed: the payload carries its own check (an AEAD tag), so the UDP
 * checksum, a second pass over every byte, is left 0 ("none", RFC 768). -EAGAIN when a full
 * queue met a full ring (frames dropped and counted in tx_ring_full), -EINVAL with no buffer.
 */
int xp_dpdk_frame(struct xp_dpdk *d, uint32_t peer_ip, uint64_t now_us, uint8_t **payload,
		  size_t *cap);
int xp_dpdk_frame_send(struct xp_dpdk *d, uint16_t peer_port, size_t len, bool sealed);
int xp_dpdk_flush(struct xp_dpdk *d);
/* Takes what arrived: answers ARP for our address, learns peers' MACs, hands UDP datagrams for
 * our port to fn (data valid during the call). Returns how many packets it took. */
int xp_dpdk_poll(struct xp_dpdk *d, xp_dpdk_rx_fn fn, void *arg);
void xp_dpdk_stats(const struct xp_dpdk *d, struct xp_dpdk_stats *st);
/* Makes the calling thread (not started by EAL) an lcore of EAL's, so that it gets a packet
 * buffer cache of its own; its CPU affinity stays as it was. 0, or -errno. */
int xp_dpdk_thread_register(void);
/* Whether the port's link is up now (a memif whose peer has not connected is down). */
bool xp_dpdk_link_up(const struct xp_dpdk *d);
/*
 * The port's upkeep, from the thread that owns it, as often as it likes (it looks at most every
 * 100 ms): reads the link, and where the link stays down for a memif client (DPDK 22.11's client
 * connects only when its port starts, and a server that refused it, or went away, leaves it down
 * for good), stops and starts the port every half second to try its handshake again. Whether the
 * link is up, as of the last look.
 */
bool xp_dpdk_tend(struct xp_dpdk *d, uint64_t now_us);
/* Why the link is down, in words ("" when it is up): for the log and a failed link's reason. */
void xp_dpdk_link_why(const struct xp_dpdk *d, char *buf, size_t len);
/* A peer's ARP state: 1 when its MAC is known; 0 while it is asked for and has not answered, with
 * *asking_us how long since the first request; -ENOENT when it was never asked for. */
int xp_dpdk_peer_arp(const struct xp_dpdk *d, uint32_t peer_ip, uint64_t now_us,
		     uint64_t *asking_us);
/* Forgets a peer's MAC (a peer that went silent may be elsewhere now): the next frame to it, or
 * xp_dpdk_arp_probe(), asks again. */
void xp_dpdk_peer_forget(struct xp_dpdk *d, uint32_t peer_ip);
/* Asks for a peer's MAC unless it is known or was asked for within 100 ms. */
void xp_dpdk_arp_probe(struct xp_dpdk *d, uint32_t peer_ip, uint64_t now_us);

#endif
