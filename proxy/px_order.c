// SPDX-License-Identifier: Apache-2.0
/* Ordering of one (migration, port) sequence on the target. The parked set is small (at most
 * the channel count), so it is a flat array scanned linearly. */
#include <errno.h>
#include <stdlib.h>

#include "px_order.h"

struct parked {
	uint32_t seq;
	void *conn;
};

struct px_order {
	const struct px_order_ops *ops;
	void *ctx;
	uint64_t timeout_ms;
	uint32_t next;
	bool failed;
	uint64_t waiting_since; /* when the current head (next) started to be awaited */
	unsigned int nparked, max_parked;
	struct parked parked[];
};

int px_order_new(const struct px_order_ops *ops, void *ctx, unsigned int max_parked,
		 uint64_t timeout_ms, struct px_order **ret)
{
	struct px_order *o;

	if (max_parked == 0)
		return -EINVAL;
	o = calloc(1, sizeof(*o) + max_parked * sizeof(o->parked[0]));
	if (!o)
		return -ENOMEM;
	o->ops = ops;
	o->ctx = ctx;
	o->timeout_ms = timeout_ms;
	o->max_parked = max_parked;
	*ret = o;
	return 0;
}

static void drop_all(struct px_order *o, enum px_status why)
{
	/* Copy first: drop callbacks may look at the order. */
	while (o->nparked > 0) {
		struct parked p = o->parked[--o->nparked];

		o->ops->drop(o->ctx, p.seq, p.conn, why);
	}
}

void px_order_free(struct px_order *o)
{
	if (!o)
		return;
	drop_all(o, PX_ERR_SHUTDOWN);
	free(o);
}

void px_order_fail(struct px_order *o)
{
	o->failed = true;
	drop_all(o, PX_ERR_FAILED);
}

static int find_parked(const struct px_order *o, uint32_t seq)
{
	for (unsigned int i = 0; i < o->nparked; i++)
		if (o->parked[i].seq == seq)
			return i;
	return -1;
}

/* Opens parked successors of the head for as long as they are there. */
static void open_parked(struct px_order *o, uint64_t now_ms)
{
	int i;

	while ((i = find_parked(o, o->next)) >= 0) {
		struct parked p = o->parked[i];

		o->parked[i] = o->parked[--o->nparked];
		if (o->ops->open(o->ctx, p.seq, p.conn) < 0) {
			o->failed = true;
			o->ops->drop(o->ctx, p.seq, p.conn, PX_ERR_CONNECT);
			drop_all(o, PX_ERR_FAILED);
			return;
		}
		o->next++;
	}
	o->waiting_since = now_ms;
}

enum px_status px_order_arrive(struct px_order *o, uint32_t seq, void *conn, uint64_t now_ms)
{
	if (o->failed)
		return PX_ERR_FAILED;
	if (seq < o->next || find_parked(o, seq) >= 0)
		return PX_ERR_DUPLICATE;
	if (seq == o->next) {
		if (o->ops->open(o->ctx, seq, conn) < 0) {
			o->failed = true;
			drop_all(o, PX_ERR_FAILED);
			return PX_ERR_CONNECT;
		}
		o->next++;
		open_parked(o, now_ms);
		return PX_OK;
	}
	/* A gap wider than the parking space cannot be a real channel set. */
	if (o->nparked == o->max_parked || seq - o->next > o->max_parked)
		return PX_ERR_MALFORMED;
	if (o->nparked == 0)
		o->waiting_since = now_ms;
	o->parked[o->nparked++] = (struct parked){ .seq = seq, .conn = conn };
	return PX_OK;
}

uint64_t px_order_deadline(const struct px_order *o)
{
	if (o->nparked == 0 || o->failed)
		return 0;
	return o->waiting_since + o->timeout_ms;
}

bool px_order_expire(struct px_order *o, uint64_t now_ms)
{
	uint64_t d = px_order_deadline(o);

	if (d == 0 || now_ms < d)
		return false;
	px_order_fail(o);
	return true;
}

void px_order_set_next(struct px_order *o, uint32_t next)
{
	if (o->nparked == 0)
		o->next = next;
}

uint32_t px_order_next(const struct px_order *o)
{
	return o->next;
}

unsigned int px_order_parked(const struct px_order *o)
{
	return o->nparked;
}

bool px_order_failed(const struct px_order *o)
{
	return o->failed;
}
