// SPDX-License-Identifier: Apache-2.0
/* xp_dpdk.h in a build without DPDK (-Ddpdk=disabled, or libdpdk not found): it says so. */
#include <errno.h>
#include <stdio.h>

#include "xp_dpdk.h"

bool xp_dpdk_built(void)
{
	return false;
}

int xp_dpdk_open(const struct xp_dpdk_conf *conf, struct xp_dpdk **ret, char *err, size_t errlen)
{
	(void)conf;
	(void)ret;
	snprintf(err, errlen,
		 "--dpdk: this vmigd was built without DPDK (meson setup -Ddpdk=enabled)");
	return -ENOTSUP;
}

void xp_dpdk_close(struct xp_dpdk *d)
{
	(void)d;
}

size_t xp_dpdk_max_payload(const struct xp_dpdk *d)
{
	(void)d;
	return 0;
}

int xp_dpdk_send(struct xp_dpdk *d, uint32_t peer_ip, uint16_t peer_port, const void *data,
		 size_t len, uint64_t now_us)
{
	return -ENOTSUP;
}

int xp_dpdk_frame(struct xp_dpdk *d, uint32_t peer_ip, uint64_t now_us, uint8_t **payload,
		  size_t *cap)
{
	return -ENOTSUP;
}

int xp_dpdk_frame_send(struct xp_dpdk *d, uint16_t peer_port, size_t len, bool sealed)
{
	return -ENOTSUP;
}

int xp_dpdk_flush(struct xp_dpdk *d)
{
	return -ENOTSUP;
}

int xp_dpdk_poll(struct xp_dpdk *d, xp_dpdk_rx_fn fn, void *arg)
{
	return -ENOTSUP;
}

void xp_dpdk_stats(const struct xp_dpdk *d, struct xp_dpdk_stats *st)
{
	(void)d;
	*st = (struct xp_dpdk_stats){ 0 };
}

bool xp_dpdk_link_up(const struct xp_dpdk *d)
{
	(void)d;
	return false;
}

int xp_dpdk_thread_register(void)
{
	return -ENOTSUP;
}

uint32_t xp_dpdk_ip(const struct xp_dpdk *d)
{
	(void)d;
	return 0;
}

bool xp_dpdk_tend(struct xp_dpdk *d, uint64_t now_us)
{
	return false;
}

void xp_dpdk_link_why(const struct xp_dpdk *d, char *buf, size_t len)
{
	snprintf(buf, len, "no DPDK in this build");
}

int xp_dpdk_peer_arp(const struct xp_dpdk *d, uint32_t peer_ip, uint64_t now_us,
		     uint64_t *asking_us)
{
	return -ENOENT;
}

void xp_dpdk_peer_forget(struct xp_dpdk *d, uint32_t peer_ip)
{
}

void xp_dpdk_arp_probe(struct xp_dpdk *d, uint32_t peer_ip, uint64_t now_us)
{
}
