// SPDX-License-Identifier: Apache-2.0
/* The impairing port (xp_impair.h): a port that wraps a port. Its own file, so that only test
 * builds link it: meson makes a second daemon, vmigd-test, from the same libraries plus this and
 * ctrl/ctl_test.c (--dpdk-test-impair), while vmigd links ctrl/ctl_test_stub.c instead. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "xp_impair.h"

struct xp_impair {
	struct xp_impair_conf conf;
	const struct xp_hop_port_ops *inner_ops;
	void *inner;
	xp_hop_rx_fn fn; /* during a poll: the caller's */
	void *fn_arg;
	uint32_t rng;
	uint8_t held[2048], copy[2048]; /* a datagram held back; a duplicate's copy */
	size_t held_len;
	_Atomic uint64_t dropped, duplicated, reordered;
};

static uint32_t draw(struct xp_impair *im)
{
	im->rng = im->rng * 1103515245 + 12345;
	return (im->rng >> 16) % 100;
}

static void on_rx(void *arg, uint32_t ip, uint16_t port, uint8_t *data, size_t len)
{
	struct xp_impair *im = arg;

	if (draw(im) < im->conf.loss_pct) {
		atomic_fetch_add_explicit(&im->dropped, 1, memory_order_relaxed);
		return;
	}
	if (draw(im) < im->conf.reorder_pct && !im->held_len && len <= sizeof(im->held)) {
		memcpy(im->held, data, len); /* goes after the next one */
		im->held_len = len;
		atomic_fetch_add_explicit(&im->reordered, 1, memory_order_relaxed);
		return;
	}
	if (draw(im) < im->conf.dup_pct && len <= sizeof(im->copy)) {
		/* a frame is opened in place: each delivery gets its own bytes */
		memcpy(im->copy, data, len);
		im->fn(im->fn_arg, ip, port, im->copy, len);
		atomic_fetch_add_explicit(&im->duplicated, 1, memory_order_relaxed);
	}
	im->fn(im->fn_arg, ip, port, data, len);
	if (im->held_len) {
		size_t n = im->held_len;

		im->held_len = 0;
		im->fn(im->fn_arg, ip, port, im->held, n);
	}
}

static int im_send(void *port, uint32_t ip, uint16_t udp_port, const void *data, size_t len,
		   uint64_t now)
{
	struct xp_impair *im = port;

	return im->inner_ops->send(im->inner, ip, udp_port, data, len, now);
}

static int im_poll(void *port, xp_hop_rx_fn fn, void *arg)
{
	struct xp_impair *im = port;

	im->fn = fn;
	im->fn_arg = arg;
	return im->inner_ops->poll(im->inner, on_rx, im);
}

static int im_frame(void *port, uint32_t ip, uint64_t now, uint8_t **buf, size_t *cap)
{
	struct xp_impair *im = port;

	return im->inner_ops->frame(im->inner, ip, now, buf, cap);
}

static int im_frame_send(void *port, uint16_t udp_port, size_t len, bool sealed)
{
	struct xp_impair *im = port;

	return im->inner_ops->frame_send(im->inner, udp_port, len, sealed);
}

static int im_flush(void *port)
{
	struct xp_impair *im = port;

	return im->inner_ops->flush(im->inner);
}

static const struct xp_hop_port_ops zero_copy_ops = {
	.send = im_send,
	.poll = im_poll,
	.frame = im_frame,
	.frame_send = im_frame_send,
	.flush = im_flush,
};
static const struct xp_hop_port_ops copy_ops = { .send = im_send, .poll = im_poll };

int xp_impair_new(const struct xp_impair_conf *conf, const struct xp_hop_port_ops *inner_ops,
		  void *inner, struct xp_impair **ret)
{
	struct xp_impair *im = calloc(1, sizeof(*im));

	if (!im)
		return -ENOMEM;
	im->conf = *conf;
	im->inner_ops = inner_ops;
	im->inner = inner;
	im->rng = conf->seed;
	*ret = im;
	return 0;
}

const struct xp_hop_port_ops *xp_impair_ops(const struct xp_impair *im)
{
	return im->inner_ops->frame ? &zero_copy_ops : &copy_ops;
}

void xp_impair_stats(const struct xp_impair *im, struct xp_impair_stats *out)
{
	out->dropped = atomic_load_explicit(&im->dropped, memory_order_relaxed);
	out->duplicated = atomic_load_explicit(&im->duplicated, memory_order_relaxed);
	out->reordered = atomic_load_explicit(&im->reordered, memory_order_relaxed);
}

void xp_impair_free(struct xp_impair *im)
{
	free(im);
}
