// SPDX-License-Identifier: Apache-2.0
/* Node-hop preamble and reply codec. Everything here is bounds-checked arithmetic on a byte
 * buffer; the fuzzer in tests/fuzz drives px_preamble_decode() and px_reply_decode(). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "px_preamble.h"
#include "util.h"

static int key_char_ok(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '-' || c == '_' || c == '.';
}

static int key_valid_n(const char *key, size_t n)
{
	if (n == 0 || n > PX_KEY_MAX)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!key_char_ok(key[i]))
			return 0;
	return 1;
}

int px_key_valid(const char *key)
{
	return key_valid_n(key, strnlen(key, PX_KEY_MAX + 1));
}

/* ip, port, 0, stream: PX_DPDK_LEN bytes */
static void dpdk_put(const struct px_dpdk *d, uint8_t *buf)
{
	vm_put_be32(buf, d->ip);
	vm_put_be16(buf + 4, d->port);
	vm_put_be16(buf + 6, 0);
	vm_put_be32(buf + 8, d->stream);
}

/* 0, or -1 for an address, port or stream id of 0 or a nonzero pad */
static int dpdk_get(const uint8_t *buf, struct px_dpdk *d)
{
	d->ip = vm_get_be32(buf);
	d->port = vm_get_be16(buf + 4);
	d->stream = vm_get_be32(buf + 8);
	return d->ip && d->port && d->stream && !vm_get_be16(buf + 6) ? 0 : -1;
}

#define PARTIAL_BIT (1ull << 63)

static void digests_put(const struct px_digests *d, uint8_t *buf)
{
	for (int i = 0; i < 2; i++) {
		vm_put_be64(buf + 16 * i,
			    (d->bytes[i] & ~PARTIAL_BIT) | (d->partial[i] ? PARTIAL_BIT : 0));
		vm_put_be64(buf + 16 * i + 8, d->digest[i]);
	}
}

static void digests_get(const uint8_t *buf, struct px_digests *d)
{
	for (int i = 0; i < 2; i++) {
		uint64_t b = vm_get_be64(buf + 16 * i);

		d->bytes[i] = b & ~PARTIAL_BIT;
		d->partial[i] = b & PARTIAL_BIT;
		d->digest[i] = vm_get_be64(buf + 16 * i + 8);
	}
}

enum px_verdict px_digests_compare(const struct px_digests *src, const struct px_digests *tgt)
{
	enum px_verdict v = PX_V_MATCH;

	for (int i = 0; i < 2; i++) {
		if (src->bytes[i] == tgt->bytes[i] && src->digest[i] == tgt->digest[i])
			continue;
		if (src->bytes[i] == tgt->bytes[i] || (!src->partial[i] && !tgt->partial[i]))
			return PX_V_MISMATCH;
		v = PX_V_SHORT;
	}
	return v;
}

bool px_digests_equal(const struct px_digests *a, const struct px_digests *b)
{
	return a->bytes[0] == b->bytes[0] && a->bytes[1] == b->bytes[1] &&
	       a->digest[0] == b->digest[0] && a->digest[1] == b->digest[1];
}

int px_preamble_encode(const struct px_preamble *p, uint8_t *buf, size_t len)
{
	size_t kl = strnlen(p->key, PX_KEY_MAX + 1);
	size_t at = PX_PREAMBLE_FIXED + kl;

	if (!key_valid_n(p->key, kl) || p->port > PX_PORT_MAX ||
	    (p->verify && (p->digest || p->dpdk.ip || p->resumable)) ||
	    (p->resume && (p->digest || p->dpdk.ip || p->verify || p->resumable)) ||
	    (p->dpdk_resume && (!p->dpdk.ip || !p->resumable)) || (p->compress && !p->resumable) ||
	    (p->compress_dpdk && (!p->compress || !p->dpdk_resume)))
		return -EINVAL;
	if (len < at + (p->has_secret ? PX_SECRET_LEN : 0) + (p->dpdk.ip ? PX_DPDK_LEN : 0) +
			  (p->verify ? PX_DIGESTS_LEN : 0) + (p->resume ? PX_RESUME_LEN : 0))
		return -ENOSPC;
	vm_put_be32(buf, PX_PREAMBLE_MAGIC);
	vm_put_be16(buf + 4, p->version);
	vm_put_be16(buf + 6, (p->has_secret ? PX_PREAMBLE_F_SECRET : 0) |
				     (p->dpdk.ip ? PX_PREAMBLE_F_DPDK : 0) |
				     (p->digest ? PX_PREAMBLE_F_DIGEST : 0) |
				     (p->verify ? PX_PREAMBLE_F_VERIFY : 0) |
				     (p->resumable ? PX_PREAMBLE_F_RESUMABLE : 0) |
				     (p->resume ? PX_PREAMBLE_F_RESUME : 0) |
				     (p->dpdk_resume ? PX_PREAMBLE_F_DPDK_RESUME : 0) |
				     (p->compress ? PX_PREAMBLE_F_COMPRESS : 0) |
				     (p->compress_dpdk ? PX_PREAMBLE_F_COMPRESS_DPDK : 0));
	vm_put_be32(buf + 8, p->port);
	vm_put_be32(buf + 12, p->seq);
	vm_put_be16(buf + 16, kl);
	vm_put_be16(buf + 18, 0);
	memcpy(buf + PX_PREAMBLE_FIXED, p->key, kl);
	if (p->has_secret) {
		memcpy(buf + at, p->secret, PX_SECRET_LEN);
		at += PX_SECRET_LEN;
	}
	if (p->dpdk.ip) {
		dpdk_put(&p->dpdk, buf + at);
		at += PX_DPDK_LEN;
	}
	if (p->verify) {
		digests_put(&p->dg, buf + at);
		at += PX_DIGESTS_LEN;
	}
	if (p->resume) {
		memcpy(buf + at, p->token, PX_TOKEN_LEN);
		vm_put_be64(buf + at + PX_TOKEN_LEN, p->have);
		at += PX_RESUME_LEN;
	}
	return (int)at;
}

size_t px_preamble_len(const uint8_t *buf)
{
	return PX_PREAMBLE_FIXED + vm_get_be16(buf + 16) +
	       (vm_get_be16(buf + 6) & PX_PREAMBLE_F_SECRET ? PX_SECRET_LEN : 0) +
	       (vm_get_be16(buf + 6) & PX_PREAMBLE_F_DPDK ? PX_DPDK_LEN : 0) +
	       (vm_get_be16(buf + 6) & PX_PREAMBLE_F_VERIFY ? PX_DIGESTS_LEN : 0) +
	       (vm_get_be16(buf + 6) & PX_PREAMBLE_F_RESUME ? PX_RESUME_LEN : 0);
}

int px_preamble_decode(const uint8_t *buf, size_t len, struct px_preamble *ret)
{
	struct px_preamble p;
	uint16_t kl, flags;

	/* Judge the magic on the first byte that disagrees, so garbage is refused at once. */
	for (size_t i = 0; i < len && i < 4; i++)
		if (buf[i] != (uint8_t)(PX_PREAMBLE_MAGIC >> (24 - 8 * i)))
			return -PX_ERR_MALFORMED;
	if (len >= 6 && vm_get_be16(buf + 4) != PX_PROTO_VERSION)
		return -PX_ERR_VERSION;
	if (len < PX_PREAMBLE_FIXED)
		return 0;
	kl = vm_get_be16(buf + 16);
	flags = vm_get_be16(buf + 6);
	if ((flags &
	     ~(PX_PREAMBLE_F_SECRET | PX_PREAMBLE_F_DPDK | PX_PREAMBLE_F_DIGEST |
		       PX_PREAMBLE_F_VERIFY | PX_PREAMBLE_F_RESUMABLE | PX_PREAMBLE_F_RESUME |
	       PX_PREAMBLE_F_DPDK_RESUME | PX_PREAMBLE_F_COMPRESS | PX_PREAMBLE_F_COMPRESS_DPDK)) ||
	    ((flags & PX_PREAMBLE_F_COMPRESS) && !(flags & PX_PREAMBLE_F_RESUMABLE)) ||
	    ((flags & PX_PREAMBLE_F_COMPRESS_DPDK) &&
	     (~flags & (PX_PREAMBLE_F_COMPRESS | PX_PREAMBLE_F_DPDK_RESUME))) ||
	    ((flags & PX_PREAMBLE_F_DPDK_RESUME) &&
	     (~flags & (PX_PREAMBLE_F_DPDK | PX_PREAMBLE_F_RESUMABLE))) ||
	    ((flags & PX_PREAMBLE_F_VERIFY) &&
	     (flags & (PX_PREAMBLE_F_DPDK | PX_PREAMBLE_F_DIGEST | PX_PREAMBLE_F_RESUMABLE))) ||
	    ((flags & PX_PREAMBLE_F_RESUME) &&
	     (flags & (PX_PREAMBLE_F_DPDK | PX_PREAMBLE_F_DIGEST | PX_PREAMBLE_F_VERIFY |
		       PX_PREAMBLE_F_RESUMABLE))) ||
	    vm_get_be16(buf + 18) != 0 || kl == 0 || kl > PX_KEY_MAX ||
	    vm_get_be32(buf + 8) > PX_PORT_MAX)
		return -PX_ERR_MALFORMED;
	if (len < px_preamble_len(buf))
		return 0;
	if (!key_valid_n((const char *)buf + PX_PREAMBLE_FIXED, kl))
		return -PX_ERR_MALFORMED;
	p.version = PX_PROTO_VERSION;
	p.port = vm_get_be32(buf + 8);
	p.seq = vm_get_be32(buf + 12);
	memcpy(p.key, buf + PX_PREAMBLE_FIXED, kl);
	p.key[kl] = '\0';
	p.has_secret = flags & PX_PREAMBLE_F_SECRET;
	if (p.has_secret)
		memcpy(p.secret, buf + PX_PREAMBLE_FIXED + kl, PX_SECRET_LEN);
	memset(&p.dpdk, 0, sizeof(p.dpdk));
	if ((flags & PX_PREAMBLE_F_DPDK) &&
	    dpdk_get(buf + PX_PREAMBLE_FIXED + kl + (p.has_secret ? PX_SECRET_LEN : 0), &p.dpdk))
		return -PX_ERR_MALFORMED;
	p.digest = flags & PX_PREAMBLE_F_DIGEST;
	p.verify = flags & PX_PREAMBLE_F_VERIFY;
	memset(&p.dg, 0, sizeof(p.dg));
	if (p.verify)
		digests_get(buf + px_preamble_len(buf) - PX_DIGESTS_LEN, &p.dg);
	p.resumable = flags & PX_PREAMBLE_F_RESUMABLE;
	p.resume = flags & PX_PREAMBLE_F_RESUME;
	p.dpdk_resume = flags & PX_PREAMBLE_F_DPDK_RESUME;
	p.compress = flags & PX_PREAMBLE_F_COMPRESS;
	p.compress_dpdk = flags & PX_PREAMBLE_F_COMPRESS_DPDK;
	memset(p.token, 0, sizeof(p.token));
	p.have = 0;
	if (p.resume) {
		const uint8_t *r = buf + px_preamble_len(buf) - PX_RESUME_LEN;

		memcpy(p.token, r, PX_TOKEN_LEN);
		p.have = vm_get_be64(r + PX_TOKEN_LEN);
	}
	*ret = p;
	return (int)px_preamble_len(buf);
}

size_t px_reply_encode(enum px_status st, const struct px_dpdk *dpdk, uint8_t *buf)
{
	vm_put_be32(buf, PX_REPLY_MAGIC);
	vm_put_be16(buf + 4, PX_PROTO_VERSION);
	vm_put_be16(buf + 6, st);
	if (st != PX_OK_DPDK)
		return PX_REPLY_LEN;
	dpdk_put(dpdk, buf + PX_REPLY_LEN);
	return PX_REPLY_DPDK_LEN;
}

size_t px_reply_encode_resumable(const uint8_t token[PX_TOKEN_LEN], const struct px_dpdk *dpdk,
				 uint8_t *buf)
{
	if (!dpdk) {
		px_reply_encode(PX_OK_RESUMABLE, NULL, buf);
		memcpy(buf + PX_REPLY_LEN, token, PX_TOKEN_LEN);
		return PX_REPLY_RESUMABLE_LEN;
	}
	px_reply_encode(PX_OK_DPDK_RESUMABLE, NULL, buf);
	dpdk_put(dpdk, buf + PX_REPLY_LEN);
	memcpy(buf + PX_REPLY_DPDK_LEN, token, PX_TOKEN_LEN);
	return PX_REPLY_DPDK_RESUMABLE_LEN;
}

size_t px_reply_encode_resumed(uint64_t have, uint8_t *buf)
{
	px_reply_encode(PX_RESUMED, NULL, buf);
	vm_put_be64(buf + PX_REPLY_LEN, have);
	return PX_REPLY_RESUMED_LEN;
}

void px_reply_token(const uint8_t *buf, uint8_t token[PX_TOKEN_LEN])
{
	bool dpdk = vm_get_be16(buf + 6) == PX_OK_DPDK_RESUMABLE;

	memcpy(token, buf + (dpdk ? PX_REPLY_DPDK_LEN : PX_REPLY_LEN), PX_TOKEN_LEN);
}

uint64_t px_reply_have(const uint8_t *buf)
{
	return vm_get_be64(buf + PX_REPLY_LEN);
}

size_t px_reply_encode_verified(enum px_verdict v, const struct px_digests *dg, uint8_t *buf)
{
	px_reply_encode(PX_VERIFIED, NULL, buf);
	vm_put_be32(buf + PX_REPLY_LEN, v);
	digests_put(dg, buf + PX_REPLY_LEN + 4);
	return PX_REPLY_VERIFY_LEN;
}

size_t px_reply_len(const uint8_t *buf, size_t have)
{
	if (have < PX_REPLY_LEN)
		return PX_REPLY_LEN; /* the status is in the fixed part */
	switch (vm_get_be16(buf + 6)) {
	case PX_OK_DPDK:
		return PX_REPLY_DPDK_LEN;
	case PX_VERIFIED:
		return PX_REPLY_VERIFY_LEN;
	case PX_OK_RESUMABLE:
		return PX_REPLY_RESUMABLE_LEN;
	case PX_RESUMED:
		return PX_REPLY_RESUMED_LEN;
	case PX_OK_DPDK_RESUMABLE:
		return PX_REPLY_DPDK_RESUMABLE_LEN;
	default:
		return PX_REPLY_LEN;
	}
}

int px_reply_decode_verified(const uint8_t *buf, size_t len, enum px_verdict *v,
			     struct px_digests *dg)
{
	uint32_t verdict;

	if (len < PX_REPLY_LEN)
		return 0;
	if (vm_get_be32(buf) != PX_REPLY_MAGIC || vm_get_be16(buf + 4) != PX_PROTO_VERSION ||
	    vm_get_be16(buf + 6) != PX_VERIFIED)
		return -EBADMSG;
	if (len < PX_REPLY_VERIFY_LEN)
		return 0;
	verdict = vm_get_be32(buf + PX_REPLY_LEN);
	if (verdict > PX_V_MAX)
		return -EBADMSG;
	*v = (enum px_verdict)verdict;
	if (dg)
		digests_get(buf + PX_REPLY_LEN + 4, dg);
	return PX_REPLY_VERIFY_LEN;
}

const char *px_verdict_str(enum px_verdict v)
{
	switch (v) {
	case PX_V_MATCH:
		return "the same bytes on both nodes";
	case PX_V_MISMATCH:
		return "the bytes differ between the nodes";
	case PX_V_UNKNOWN:
		return "the target kept no digest of this connection";
	case PX_V_PENDING:
		return "the target was still carrying this connection";
	case PX_V_BROKEN:
		return "the connection ended with an error on the target";
	case PX_V_SHORT:
		return "a QEMU closed its socket before the stream's end, so the two digests cover "
		       "different lengths";
	}
	return "unknown verdict";
}

int px_reply_decode(const uint8_t *buf, size_t len, enum px_status *ret, struct px_dpdk *dpdk)
{
	struct px_dpdk d;
	enum px_status st;
	size_t want;

	if (len < PX_REPLY_LEN)
		return 0;
	if (vm_get_be32(buf) != PX_REPLY_MAGIC || vm_get_be16(buf + 4) != PX_PROTO_VERSION)
		return -EBADMSG;
	st = vm_get_be16(buf + 6);
	want = px_reply_len(buf, len);
	if (len < want)
		return 0;
	if (st == PX_OK_DPDK || st == PX_OK_DPDK_RESUMABLE) {
		if (dpdk_get(buf + PX_REPLY_LEN, &d))
			return -EBADMSG;
		if (dpdk)
			*dpdk = d;
	}
	*ret = st;
	return (int)want;
}

const char *px_status_str(enum px_status st)
{
	switch (st) {
	case PX_OK:
		return "ok";
	case PX_OK_DPDK:
		return "ok, over the DPDK node hop";
	case PX_VERIFIED:
		return "verified";
	case PX_OK_RESUMABLE:
		return "ok, resumable";
	case PX_OK_DPDK_RESUMABLE:
		return "ok, over the DPDK node hop, resumable over the kernel path";
	case PX_RESUMED:
		return "resumed";
	case PX_ERR_RESUME:
		return "no such resumable connection here, or an offset outside what was kept";
	case PX_ERR_MALFORMED:
		return "malformed preamble";
	case PX_ERR_VERSION:
		return "unsupported protocol version";
	case PX_ERR_UNKNOWN_KEY:
		return "unknown migration key";
	case PX_ERR_UNKNOWN_PORT:
		return "unknown logical port";
	case PX_ERR_DUPLICATE:
		return "duplicate connection sequence number";
	case PX_ERR_CONNECT:
		return "target could not connect to its local socket";
	case PX_ERR_FAILED:
		return "migration already failed on the target";
	case PX_ERR_SHUTDOWN:
		return "target daemon is shutting down";
	case PX_ERR_LIMIT:
		return "too many connections for this migration on the target";
	case PX_ERR_AUTH:
		return "not this migration's peer (no or a wrong secret, or another address or "
		       "certificate than its first connection's)";
	}
	return "unknown status";
}

void px_dpdk_format(const struct px_dpdk *d, char *buf, size_t len)
{
	snprintf(buf, len, "%u.%u.%u.%u:%u", d->ip >> 24, (d->ip >> 16) & 255, (d->ip >> 8) & 255,
		 d->ip & 255, d->port);
}
