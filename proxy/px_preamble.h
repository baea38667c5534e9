/* SPDX-License-Identifier: Apache-2.0 */
/* The node-hop preamble (source -> target) and its reply (target -> source): a pure codec, no
 * I/O. Layout in doc/interfaces.md. */
#ifndef PX_PREAMBLE_H
#define PX_PREAMBLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PX_PREAMBLE_MAGIC 0x564d4750u /* "VMGP" */
#define PX_REPLY_MAGIC	  0x564d4752u /* "VMGR" */
#define PX_PROTO_VERSION  1
#define PX_KEY_MAX	  128
#define PX_PREAMBLE_FIXED 20
#define PX_SECRET_LEN	  16
#define PX_DPDK_LEN	  12
#define PX_PREAMBLE_MAX	  (PX_PREAMBLE_FIXED + PX_KEY_MAX + PX_SECRET_LEN + PX_DPDK_LEN)
/* Flags: the migration's secret (from the target's JSON) follows the key. */
#define PX_PREAMBLE_F_SECRET 0x0001
/* The source offers the DPDK node hop: its address, UDP port and a stream id follow. */
#define PX_PREAMBLE_F_DPDK 0x0002
#define PX_REPLY_LEN	   8
/* A PX_OK_DPDK reply: the target's DPDK address and port and the stream id follow. */
#define PX_REPLY_DPDK_LEN (PX_REPLY_LEN + PX_DPDK_LEN)
#define PX_PORT_MAX	  65535

enum px_status {
	PX_OK = 0,
	PX_ERR_MALFORMED = 1,
	PX_ERR_VERSION = 2,
	PX_ERR_UNKNOWN_KEY = 3,
	PX_ERR_UNKNOWN_PORT = 4,
	PX_ERR_DUPLICATE = 5,
	PX_ERR_CONNECT = 6,
	PX_ERR_FAILED = 7,
	PX_ERR_SHUTDOWN = 8,
	PX_ERR_LIMIT = 9, /* the migration has --max-migration-conns connections already */
	PX_ERR_AUTH = 10, /* no or a wrong secret, or a peer other than the migration's first */
	PX_OK_DPDK = 11,  /* ok, and the connection's bytes go over the DPDK node hop */
};

/* A DPDK node-hop address and the stream id of one connection on it (ip 0: none). */
struct px_dpdk {
	uint32_t ip; /* host order */
	uint16_t port;
	uint32_t stream;
};

struct px_preamble {
	uint16_t version;
	uint32_t port;
	uint32_t seq;
	char key[PX_KEY_MAX + 1];
	bool has_secret;
	uint8_t secret[PX_SECRET_LEN];
	struct px_dpdk dpdk; /* the source's offer; ip 0: none */
};

/* 1..PX_KEY_MAX characters of [A-Za-z0-9._-]. */
int px_key_valid(const char *key);

/* Returns the encoded length, or -EINVAL / -ENOSPC. */
int px_preamble_encode(const struct px_preamble *p, uint8_t *buf, size_t len);
/*
 * Returns the number of bytes the preamble takes once all of it is in buf, 0 while more bytes are
 * needed, or a negative enum px_status (-PX_ERR_MALFORMED, -PX_ERR_VERSION) on bad input. A
 * version-2 peer is refused as soon as the fixed part arrives. *ret is written only on success.
 */
int px_preamble_decode(const uint8_t *buf, size_t len, struct px_preamble *ret);
/* How long the preamble whose fixed part is in buf (PX_PREAMBLE_FIXED bytes) is, in all;
 * px_preamble_decode() judges whether that length is valid. */
size_t px_preamble_len(const uint8_t *buf);

/* Writes the reply into buf (PX_REPLY_DPDK_LEN bytes of room); returns its length. dpdk is used
 * with PX_OK_DPDK only. */
size_t px_reply_encode(enum px_status st, const struct px_dpdk *dpdk, uint8_t *buf);
/* 0 while more bytes are needed, the reply's length when decoded (*dpdk written for PX_OK_DPDK
 * unless NULL),
 * -EBADMSG on a bad magic or version or a PX_OK_DPDK without an address. */
int px_reply_decode(const uint8_t *buf, size_t len, enum px_status *ret, struct px_dpdk *dpdk);

const char *px_status_str(enum px_status st);
/* "A.B.C.D:PORT" for status, the target JSON and the log. */
void px_dpdk_format(const struct px_dpdk *d, char *buf, size_t len);

#endif
