// SPDX-License-Identifier: Apache-2.0
/* libFuzzer target for the node-hop codec: px_preamble_decode() on every prefix of the input,
 * px_reply_decode() and px_reply_decode_verified(). Checks that decoding is consistent as bytes
 * trickle in, re-encodes (the secret, the DPDK offer, a report's digests, the resumption offer
 * and a resumption's token and offset included). */
#include <errno.h>
#include <string.h>

#include "fuzz.h"
#include "px_preamble.h"

/* Decodes from an exactly-sized heap copy, so ASan catches any read past len. */
static int decode_prefix(const uint8_t *data, size_t len, struct px_preamble *p)
{
	uint8_t *copy = malloc(len ? len : 1);
	int r;

	FUZZ_CHECK(copy != NULL);
	memcpy(copy, data, len);
	r = px_preamble_decode(copy, len, p);
	free(copy);
	return r;
}

static void check_success(const uint8_t *data, int r, const struct px_preamble *p)
{
	uint8_t buf[PX_PREAMBLE_MAX];
	size_t kl = strnlen(p->key, sizeof(p->key));

	FUZZ_CHECK(r > PX_PREAMBLE_FIXED && r <= PX_PREAMBLE_MAX);
	FUZZ_CHECK(kl + (p->has_secret ? PX_SECRET_LEN : 0) + (p->dpdk.ip ? PX_DPDK_LEN : 0) +
			   (p->verify ? PX_DIGESTS_LEN : 0) + (p->resume ? PX_RESUME_LEN : 0) ==
		   (size_t)r - PX_PREAMBLE_FIXED);
	FUZZ_CHECK(p->resumable == !!(data[7] & PX_PREAMBLE_F_RESUMABLE));
	FUZZ_CHECK(p->resume == !!(data[7] & PX_PREAMBLE_F_RESUME));
	/* a resumption is no new connection: it offers nothing and asks for nothing */
	FUZZ_CHECK(!p->resume || (!p->dpdk.ip && !p->digest && !p->verify && !p->resumable));
	FUZZ_CHECK(!p->verify || !p->resumable);
	FUZZ_CHECK(p->digest == !!(data[7] & PX_PREAMBLE_F_DIGEST));
	FUZZ_CHECK(p->verify == !!(data[7] & PX_PREAMBLE_F_VERIFY));
	/* a report is no QEMU connection: no offer, no request for digests */
	FUZZ_CHECK(!p->verify || (!p->dpdk.ip && !p->digest));
	FUZZ_CHECK(p->has_secret == !!(data[7] & PX_PREAMBLE_F_SECRET));
	/* an offer is whole (no field 0) whenever the flag is there */
	FUZZ_CHECK(!!p->dpdk.ip == !!(data[7] & PX_PREAMBLE_F_DPDK));
	FUZZ_CHECK(!p->dpdk.ip || (p->dpdk.port && p->dpdk.stream));
	FUZZ_CHECK(p->version == PX_PROTO_VERSION);
	FUZZ_CHECK(p->port <= PX_PORT_MAX);
	FUZZ_CHECK(px_key_valid(p->key));
	/* What decodes re-encodes to the very same bytes. */
	FUZZ_CHECK(px_preamble_encode(p, buf, sizeof(buf)) == r);
	FUZZ_CHECK(memcmp(buf, data, r) == 0);
}

static void fuzz_preamble(const uint8_t *data, size_t size)
{
	/* The decoder never looks further than this; one more byte shows that it does not. */
	size_t max = size < PX_PREAMBLE_MAX + 1 ? size : PX_PREAMBLE_MAX + 1;
	int first = 0; /* the first nonzero answer, and the prefix length it came at */
	size_t first_at = 0;

	for (size_t len = 0; len <= max; len++) {
		struct px_preamble p, canary;
		int r;

		memset(&p, 0xa5, sizeof(p));
		canary = p;
		r = decode_prefix(data, len, &p);
		FUZZ_CHECK(r == 0 || r == -PX_ERR_MALFORMED || r == -PX_ERR_VERSION ||
			   r > PX_PREAMBLE_FIXED);
		if (r <= 0)
			/* *ret is written only on success. */
			FUZZ_CHECK(memcmp(&p, &canary, sizeof(p)) == 0);
		if (first != 0) {
			/* An answer, once given, does not change as more bytes arrive. */
			FUZZ_CHECK(r == first);
			continue;
		}
		if (r == 0) {
			/* "Need more" only while a complete preamble cannot be there yet. */
			FUZZ_CHECK(len < PX_PREAMBLE_MAX);
			continue;
		}
		first = r;
		first_at = len;
		if (r > 0) {
			/* Success exactly when its last byte arrives, not later. */
			FUZZ_CHECK((size_t)r == len);
			check_success(data, r, &p);
		}
	}
	/* Garbage is refused at its first byte that cannot belong to a preamble. */
	for (size_t i = 0; i < 4 && i < size; i++) {
		if (data[i] != (uint8_t)(PX_PREAMBLE_MAGIC >> (24 - 8 * i))) {
			FUZZ_CHECK(first == -PX_ERR_MALFORMED && first_at == i + 1);
			break;
		}
	}
	/* A wrong version is refused once the version field is there, and only then. */
	if (first == -PX_ERR_VERSION)
		FUZZ_CHECK(first_at == 6 && (data[4] << 8 | data[5]) != PX_PROTO_VERSION);
	if (size >= 6 && memcmp(data, "VMGP", 4) == 0 &&
	    (data[4] << 8 | data[5]) != PX_PROTO_VERSION)
		FUZZ_CHECK(first == -PX_ERR_VERSION);
	if (size > max) {
		struct px_preamble p;

		FUZZ_CHECK(decode_prefix(data, size, &p) == first);
	}
}

static void fuzz_reply(const uint8_t *data, size_t size)
{
	size_t max = size < PX_REPLY_MAX + 1 ? size : PX_REPLY_MAX + 1;
	unsigned int status = size >= PX_REPLY_LEN ? (unsigned int)(data[6] << 8 | data[7]) : 0;
	bool dpdk = status == PX_OK_DPDK || status == PX_OK_DPDK_RESUMABLE;
	/* how long a reply of this status is: the length its status gives, nothing more */
	size_t whole = status == PX_OK_DPDK_RESUMABLE ? PX_REPLY_DPDK_RESUMABLE_LEN
		       : dpdk			      ? PX_REPLY_DPDK_LEN
		       : status == PX_VERIFIED	      ? PX_REPLY_VERIFY_LEN
		       : status == PX_OK_RESUMABLE    ? PX_REPLY_RESUMABLE_LEN
		       : status == PX_RESUMED	      ? PX_REPLY_RESUMED_LEN
						      : PX_REPLY_LEN;

	for (size_t len = 0; len <= max; len++) {
		uint8_t *copy = malloc(len ? len : 1), buf[PX_REPLY_MAX], tok[PX_TOKEN_LEN];
		enum px_status st = (enum px_status)0x7777;
		struct px_dpdk d = { 0 };
		int r;

		FUZZ_CHECK(copy != NULL);
		memcpy(copy, data, len);
		r = px_reply_decode(copy, len, &st, &d);
		free(copy);
		if (len < whole && r == 0) {
			FUZZ_CHECK(st == (enum px_status)0x7777);
			continue;
		}
		if (r == -EBADMSG) {
			FUZZ_CHECK(st == (enum px_status)0x7777);
			FUZZ_CHECK(memcmp(data, "VMGR\0\1", 6) != 0 || dpdk);
			continue;
		}
		FUZZ_CHECK(r == (int)whole && st == status);
		FUZZ_CHECK(!dpdk || (d.ip && d.port && d.stream));
		if (st == PX_OK_RESUMABLE) {
			px_reply_token(data, tok);
			px_reply_encode_resumable(tok, NULL, buf);
		} else if (st == PX_OK_DPDK_RESUMABLE) {
			px_reply_token(data, tok);
			px_reply_encode_resumable(tok, &d, buf);
		} else if (st == PX_RESUMED) {
			px_reply_encode_resumed(px_reply_have(data), buf);
		} else {
			px_reply_encode(st, &d, buf);
		}
		/* a report's verdict is px_reply_decode_verified()'s: the fixed part here */
		FUZZ_CHECK(memcmp(buf, data, st == PX_VERIFIED ? PX_REPLY_LEN : (size_t)r) == 0);
	}
}

/* The answer to a report: its length from its status, and a verdict only when whole and known. */
static void fuzz_verified(const uint8_t *data, size_t size)
{
	size_t max = size < PX_REPLY_VERIFY_LEN + 1 ? size : PX_REPLY_VERIFY_LEN + 1;
	bool verified = size >= PX_REPLY_LEN && data[6] == 0 && data[7] == PX_VERIFIED;

	FUZZ_CHECK(px_reply_len(data, size < PX_REPLY_LEN ? size : 0) == PX_REPLY_LEN);
	if (size >= PX_REPLY_LEN)
		FUZZ_CHECK(px_reply_len(data, size) ==
			   (verified			      ? PX_REPLY_VERIFY_LEN
			    : data[6] != 0		      ? PX_REPLY_LEN
			    : data[7] == PX_OK_DPDK	      ? PX_REPLY_DPDK_LEN
			    : data[7] == PX_OK_RESUMABLE      ? PX_REPLY_RESUMABLE_LEN
			    : data[7] == PX_RESUMED	      ? PX_REPLY_RESUMED_LEN
			    : data[7] == PX_OK_DPDK_RESUMABLE ? PX_REPLY_DPDK_RESUMABLE_LEN
							      : PX_REPLY_LEN));
	for (size_t len = 0; len <= max; len++) {
		uint8_t *copy = malloc(len ? len : 1), buf[PX_REPLY_VERIFY_LEN];
		enum px_verdict v = (enum px_verdict)0x7777;
		struct px_digests dg;
		int r;

		FUZZ_CHECK(copy != NULL);
		memcpy(copy, data, len);
		r = px_reply_decode_verified(copy, len, &v, &dg);
		free(copy);
		if (r <= 0) {
			FUZZ_CHECK(r == 0 || r == -EBADMSG);
			FUZZ_CHECK(v == (enum px_verdict)0x7777);
			/* "need more" only before a whole answer could be there */
			FUZZ_CHECK(r == -EBADMSG || len < PX_REPLY_VERIFY_LEN);
			continue;
		}
		FUZZ_CHECK(verified && r == PX_REPLY_VERIFY_LEN && len >= PX_REPLY_VERIFY_LEN);
		FUZZ_CHECK(v <= PX_V_MAX && px_verdict_str(v) != NULL);
		px_reply_encode_verified(v, &dg, buf);
		FUZZ_CHECK(memcmp(buf, data, PX_REPLY_VERIFY_LEN) == 0);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_preamble(data, size);
	fuzz_reply(data, size);
	fuzz_verified(data, size);
	return 0;
}
