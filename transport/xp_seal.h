/* SPDX-License-Identifier: Apache-2.0 */
/* Sealing the DPDK node hop's frames: AES-256-GCM in place, one key per direction from the TLS 1.3
 * exporter of the daemons' mutual-TLS control connection, the nonce from the frame's packet
 * number, a replay window, and key phases that roll long before a nonce could repeat. */
#ifndef XP_SEAL_H
#define XP_SEAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define XP_SEAL_SECRET 32
#define XP_SEAL_TAG    16
/* Frames per key phase: 2^23, QUIC's confidentiality limit for AES-GCM (RFC 9001, 6.6). The phase
 * is pn >> shift, so both ends know it without a word; each phase's key comes from the one before
 * (HKDF-Expand-Label "vmigd ku", as TLS 1.3's key update). */
#define XP_SEAL_PHASE_SHIFT 23
/* Packet numbers the opener remembers behind the highest it accepted. */
#define XP_SEAL_REPLAY_WINDOW 1024

struct xp_seal;
struct xp_tls_sess;

struct xp_seal_stats {
	uint64_t sealed, opened, forged, replayed, too_old;
	uint64_t phase; /* the key phase in use (the newest, when opening) */
};

/*
 * The two directions' secrets of a TLS 1.3 session whose handshake is done: exporter labels
 * "EXPORTER-vmigd-hop client" and "... server", RFC 8446 7.5. -EPROTO for an earlier TLS version
 * or a session not yet up; -EIO if OpenSSL refuses.
 */
int xp_seal_export(struct xp_tls_sess *s, uint8_t client[XP_SEAL_SECRET],
		   uint8_t server[XP_SEAL_SECRET]);

/* One direction's state from its secret; opening (the receiver) or sealing. shift: 0 for
 * XP_SEAL_PHASE_SHIFT (tests roll phases sooner). -ENOMEM, -EIO. */
int xp_seal_new(const uint8_t secret[XP_SEAL_SECRET], bool opener, unsigned int shift,
		struct xp_seal **ret);
void xp_seal_free(struct xp_seal *s);

/* Encrypts buf in place and writes the tag; aad (the frame's header) is authenticated too. Packet
 * numbers must rise: -EINVAL for one not above the last sealed (its nonce was used); -ERANGE
 * past 2^62. */
int xp_seal(struct xp_seal *s, uint64_t pn, const uint8_t *aad, size_t aadlen, uint8_t *buf,
	    size_t len, uint8_t tag[XP_SEAL_TAG]);
/* Checks and decrypts in place. -EBADMSG: forged (wrong key, altered bytes); -EALREADY: a
 * packet number already accepted; -ESTALE: too old for the window or its key phase. On error
 * buf may hold garbage, and nothing of it may be used. */
int xp_open(struct xp_seal *s, uint64_t pn, const uint8_t *aad, size_t aadlen, uint8_t *buf,
	    size_t len, const uint8_t tag[XP_SEAL_TAG]);

void xp_seal_stats(const struct xp_seal *s, struct xp_seal_stats *st);

#endif
