// SPDX-License-Identifier: Apache-2.0
/* xp_dpdk's calls as xp_hop_port_ops (xp_dpdk_port.h); built against the real xp_dpdk or its stub
 * alike, outside the library that gets DPDK's flags. */
#include "xp_dpdk_port.h"

static int port_send(void *port, uint32_t ip, uint16_t udp_port, const void *data, size_t len,
		     uint64_t now)
{
	return xp_dpdk_send(port, ip, udp_port, data, len, now);
}

static int port_poll(void *port, xp_hop_rx_fn fn, void *arg)
{
	return xp_dpdk_poll(port, fn, arg);
}

static int port_frame(void *port, uint32_t ip, uint64_t now, uint8_t **buf, size_t *cap)
{
	return xp_dpdk_frame(port, ip, now, buf, cap);
}

static int port_frame_send(void *port, uint16_t udp_port, size_t len, bool sealed)
{
	return xp_dpdk_frame_send(port, udp_port, len, sealed);
}

static int port_flush(void *port)
{
	return xp_dpdk_flush(port);
}

const struct xp_hop_port_ops xp_dpdk_port_ops = {
	.send = port_send,
	.poll = port_poll,
	.frame = port_frame,
	.frame_send = port_frame_send,
	.flush = port_flush,
};

const struct xp_hop_port_ops xp_dpdk_copy_port_ops = {
	.send = port_send,
	.poll = port_poll,
};
