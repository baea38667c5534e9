/* SPDX-License-Identifier: Apache-2.0 */
/* Connection ordering on the target: node-hop connections of one (migration, port) may arrive in
 * any order, but the local socket must see them in the source's accept order. Connection k is
 * opened only after k-1 was; one that never comes fails the whole sequence after a timeout.
 * Pure logic: opening and dropping go through an ops table, time is passed in. */
#ifndef PX_ORDER_H
#define PX_ORDER_H

#include <stdbool.h>
#include <stdint.h>

#include "px_preamble.h"

struct px_order;

struct px_order_ops {
	/* Open the local side of connection seq (conn is the caller's). 0 or -errno. */
	int (*open)(void *ctx, uint32_t seq, void *conn);
	/* A parked connection that will never be opened; why says which status to answer. */
	void (*drop)(void *ctx, uint32_t seq, void *conn, enum px_status why);
};

int px_order_new(const struct px_order_ops *ops, void *ctx, unsigned int max_parked,
		 uint64_t timeout_ms, struct px_order **ret);
/* Drops whatever is parked (PX_ERR_SHUTDOWN). Takes NULL. */
void px_order_free(struct px_order *o);

/*
 * Connection seq arrived. Returns PX_OK when it was opened or parked (then the order owns conn
 * until open or drop is called for it), or a status the caller answers with and then closes conn
 * itself: PX_ERR_DUPLICATE, PX_ERR_FAILED, or PX_ERR_CONNECT when its own open failed (which
 * also fails the sequence and drops everything parked).
 */
enum px_status px_order_arrive(struct px_order *o, uint32_t seq, void *conn, uint64_t now_ms);
/* When the head of the sequence has been missing for timeout_ms: fail and drop. True if it did. */
bool px_order_expire(struct px_order *o, uint64_t now_ms);
/* Fails the sequence (drops everything parked with PX_ERR_FAILED); later arrivals are refused. */
void px_order_fail(struct px_order *o);
/* 0 when nothing waits, else when px_order_expire() should run. */
uint64_t px_order_deadline(const struct px_order *o);
uint32_t px_order_next(const struct px_order *o);
/* A sequence moved here from another vmigd goes on at next (nothing may be parked). */
void px_order_set_next(struct px_order *o, uint32_t next);
unsigned int px_order_parked(const struct px_order *o);
bool px_order_failed(const struct px_order *o);

#endif
