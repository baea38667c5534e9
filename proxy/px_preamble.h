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
#define PX_DIGESTS_LEN	  32
/* A resumable connection's token (the target's, in its PX_OK_RESUMABLE reply) */
#define PX_TOKEN_LEN 16
/* A resumption: the token, then the offset the source has (u64) */
#define PX_RESUME_LEN (PX_TOKEN_LEN + 8)
/* The longest: key, secret, and one of the DPDK offer, the digests or a resumption. */
#define PX_PREAMBLE_MAX (PX_PREAMBLE_FIXED + PX_KEY_MAX + PX_SECRET_LEN + PX_DIGESTS_LEN)
/* Flags: the migration's secret (from the target's JSON) follows the key. */
#define PX_PREAMBLE_F_SECRET 0x0001
/* The source offers the DPDK node hop: its address, UDP port and a stream id follow. */
#define PX_PREAMBLE_F_DPDK 0x0002
/* The source keeps a digest of this connection's bytes and reports it when the connection ends. */
#define PX_PREAMBLE_F_DIGEST 0x0004
/*
 * Not a QEMU connection: the source's report on connection (port, seq) of the migration, which
 * has ended on its side; its digests follow. The target answers PX_VERIFIED and closes.
 */
#define PX_PREAMBLE_F_VERIFY 0x0008
/* The source can resume this connection over a new one if the node hop fails (the target
 * advertised resumption): a target that agrees answers PX_OK_RESUMABLE. */
#define PX_PREAMBLE_F_RESUMABLE 0x0010
/* Not a new connection: connection (port, seq), resumable, goes on over this one; its token
 * and the source's offset follow. The target answers PX_RESUMED with its own. */
#define PX_PREAMBLE_F_RESUME 0x0020
/* With PX_PREAMBLE_F_DPDK and PX_PREAMBLE_F_RESUMABLE (to a target that advertised
 * "resume_dpdk"): the source can also resume a connection of the DPDK node hop over the kernel
 * path; a target that agrees answers PX_OK_DPDK_RESUMABLE. */
#define PX_PREAMBLE_F_DPDK_RESUME 0x0040
/* With PX_PREAMBLE_F_RESUMABLE (to a target that advertised "compress":"zstd"): should the
 * connection be resumable on the kernel path (PX_OK_RESUMABLE), the source may send compressed
 * chunks (ZDATA frames) in it; a target that did not advertise it ignores the flag. */
#define PX_PREAMBLE_F_COMPRESS 0x0080
/* With PX_PREAMBLE_F_COMPRESS and PX_PREAMBLE_F_DPDK_RESUME (to a target that advertised
 * "compress_dpdk": true): should the connection go over the DPDK node hop
 * (PX_OK_DPDK_RESUMABLE), the source's stream there is made of compressed chunks. */
#define PX_PREAMBLE_F_COMPRESS_DPDK 0x0100
#define PX_REPLY_LEN	     8
/* A PX_OK_DPDK reply: the target's DPDK address and port and the stream id follow. */
#define PX_REPLY_DPDK_LEN (PX_REPLY_LEN + PX_DPDK_LEN)
/* A PX_VERIFIED reply: the verdict (u32) and the target's digests follow. */
#define PX_REPLY_VERIFY_LEN (PX_REPLY_LEN + 4 + PX_DIGESTS_LEN)
/* A PX_OK_RESUMABLE reply: the connection's token follows; a PX_RESUMED one: the offset. */
#define PX_REPLY_RESUMABLE_LEN (PX_REPLY_LEN + PX_TOKEN_LEN)
#define PX_REPLY_RESUMED_LEN   (PX_REPLY_LEN + 8)
/* A PX_OK_DPDK_RESUMABLE reply: the DPDK address, port and stream, then the token. */
#define PX_REPLY_DPDK_RESUMABLE_LEN (PX_REPLY_DPDK_LEN + PX_TOKEN_LEN)
#define PX_REPLY_MAX	    PX_REPLY_VERIFY_LEN
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
	PX_VERIFIED = 12, /* to a report (PX_PREAMBLE_F_VERIFY): the verdict and the target's view */
	PX_OK_RESUMABLE = 13, /* ok, and resumable: the token to resume it with follows */
	PX_RESUMED = 14,      /* to a resumption: it goes on; the target's offset follows */
	PX_ERR_RESUME = 15,   /* a resumption of no resumable connection here, or from an offset
			       * outside what was kept */
	/* ok, over the DPDK node hop, and resumable over the kernel path: address and token */
	PX_OK_DPDK_RESUMABLE = 16,
};

/* What the target found when it compared a source's report with its own digests. */
enum px_verdict {
	PX_V_MATCH = 0,	   /* the same bytes both ways */
	PX_V_MISMATCH = 1, /* they differ: the migration is corrupt */
	PX_V_UNKNOWN = 2,  /* the target kept no digest of that connection */
	PX_V_PENDING = 3,  /* the target still carried it when it had to answer */
	PX_V_BROKEN = 4,   /* it ended with an error on the target: its digest covers a part */
	PX_V_SHORT = 5,	   /* a QEMU closed before the stream's end: the digests cover different
			      lengths */
	PX_V_MAX = PX_V_SHORT,
};

/*
 * One connection's bytes as one side saw them, in each direction: [0] from the source QEMU
 * toward the destination, [1] back. A source counts what it read from its QEMU ([0]) and from
 * the node hop ([1]); a target what it read from the node hop ([0]) and from its QEMU ([1]).
 * digest: XXH3-64 (lib/digest.h) of those bytes. partial: that side stopped reading that
 * direction before its end of stream, because the QEMU it delivers to had closed (on the wire,
 * bit 63 of the count).
 */
struct px_digests {
	uint64_t bytes[2];
	uint64_t digest[2];
	bool partial[2];
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
	bool digest;	     /* PX_PREAMBLE_F_DIGEST */
	bool verify;	     /* PX_PREAMBLE_F_VERIFY: dg is the source's report */
	struct px_digests dg;
	bool resumable; /* PX_PREAMBLE_F_RESUMABLE */
	bool resume;	/* PX_PREAMBLE_F_RESUME: token and have follow */
	bool dpdk_resume; /* PX_PREAMBLE_F_DPDK_RESUME (with dpdk and resumable only) */
	bool compress;	  /* PX_PREAMBLE_F_COMPRESS (with resumable only) */
	bool compress_dpdk; /* PX_PREAMBLE_F_COMPRESS_DPDK (with compress and dpdk_resume) */
	uint8_t token[PX_TOKEN_LEN];
	uint64_t have; /* what the source took of the target's direction */
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
/* A PX_OK_RESUMABLE reply with the connection's token, a PX_RESUMED one with the target's
 * offset, into buf (PX_REPLY_MAX bytes); each returns its length. dpdk non-NULL: a
 * PX_OK_DPDK_RESUMABLE reply with that address too. */
size_t px_reply_encode_resumable(const uint8_t token[PX_TOKEN_LEN], const struct px_dpdk *dpdk,
				 uint8_t *buf);
size_t px_reply_encode_resumed(uint64_t have, uint8_t *buf);
/* Once px_reply_decode() took a whole PX_OK_RESUMABLE, PX_OK_DPDK_RESUMABLE or PX_RESUMED reply:
 * what follows it. */
void px_reply_token(const uint8_t *buf, uint8_t token[PX_TOKEN_LEN]);
uint64_t px_reply_have(const uint8_t *buf);
/* A PX_VERIFIED reply into buf (PX_REPLY_VERIFY_LEN bytes); returns its length. */
size_t px_reply_encode_verified(enum px_verdict v, const struct px_digests *dg, uint8_t *buf);
/* How many bytes the reply whose first have bytes are in buf is long, as far as they tell: its
 * fixed part while have is shorter, then the whole reply's length (by its status). A reader
 * reads up to this and asks again, and never takes a byte past the reply. */
size_t px_reply_len(const uint8_t *buf, size_t have);
/* A PX_VERIFIED reply: its length once complete (*dg written unless NULL), 0 while more bytes
 * are needed, -EBADMSG for another status, a bad magic or version, or a verdict out of range. */
int px_reply_decode_verified(const uint8_t *buf, size_t len, enum px_verdict *v,
			     struct px_digests *dg);
const char *px_verdict_str(enum px_verdict v);
/* Whether two sides' digests of one connection agree (byte counts and digests, both ways). */
bool px_digests_equal(const struct px_digests *a, const struct px_digests *b);
/*
 * The source's and the target's digests of one connection compared: PX_V_MISMATCH when a
 * direction's bytes differ though both sides read the same number of them, or though neither
 * stopped early; PX_V_SHORT when they differ only because a side stopped early; else
 * PX_V_MATCH.
 */
enum px_verdict px_digests_compare(const struct px_digests *src, const struct px_digests *tgt);
/* 0 while more bytes are needed, the reply's length when decoded (*dpdk written for PX_OK_DPDK
 * and PX_OK_DPDK_RESUMABLE unless NULL), -EBADMSG on a bad magic or version or such a reply
 * without an address. */
int px_reply_decode(const uint8_t *buf, size_t len, enum px_status *ret, struct px_dpdk *dpdk);

const char *px_status_str(enum px_status st);
/* "A.B.C.D:PORT" for status, the target JSON and the log. */
void px_dpdk_format(const struct px_dpdk *d, char *buf, size_t len);

#endif
