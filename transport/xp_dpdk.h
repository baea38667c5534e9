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
};

typedef void (*xp_dpdk_rx_fn)(void *arg, uint32_t peer_ip, uint16_t peer_port, uint8_t *data,
			      size_t len);

/* Whether this build has DPDK at all. */
bool xp_dpdk_built(void);
/* Starts EAL and the port; one per process (EAL's rule). -ENOTSUP without DPDK, -EINVAL for a bad
 * address, -ENODEV with no port, -EIO with err set otherwise. */
int xp_dpdk_open(const struct xp_dpdk_conf *conf, struct xp_dpdk **ret, char *err, size_t errlen);
/* Stops the port; EAL and the port's memory stay until the process exits (xp_dpdk.c says why). */
void xp_dpdk_close(struct xp_dpdk *d);
/* The largest UDP payload a frame can carry (the port's MTU less IPv4 and UDP headers). */
size_t xp_dpdk_max_payload(const struct xp_dpdk *d);
/* Sends one UDP datagram to peer_ip:peer_port (host order). -EAGAIN while the peer's MAC is not
 * known (an ARP request went out, at most one per 100 ms) or the port's ring is full; -EMSGSIZE
 * for a payload over xp_dpdk_max_payload(). */
int xp_dpdk_send(struct xp_dpdk *d, uint32_t peer_ip, uint16_t peer_port, const void *data,
		 size_t len, uint64_t now_us);
/* Takes what arrived: answers ARP for our address, learns peers' MACs, hands UDP datagrams for
 * our port to fn (data valid during the call). Returns how many packets it took. */
int xp_dpdk_poll(struct xp_dpdk *d, xp_dpdk_rx_fn fn, void *arg);
void xp_dpdk_stats(const struct xp_dpdk *d, struct xp_dpdk_stats *st);

#endif
