// SPDX-License-Identifier: Apache-2.0
/* xp_seal.h on OpenSSL 3: the exporter, TLS 1.3's HKDF-Expand-Label for keys, IVs and key updates,
 * one reusable AES-256-GCM context per key (no allocation per frame), and the replay window. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>

#include "xp_seal.h"
#include "xp_tls_priv.h"

#define KEY_LEN	 32
#define IV_LEN	 12
#define PN_LIMIT (1ull << 62)
#define WORDS	 (XP_SEAL_REPLAY_WINDOW / 64)

/* One key phase: its secret (to derive the next), key schedule and IV. */
struct phase {
	uint64_t n;
	bool valid;
	uint8_t secret[XP_SEAL_SECRET], iv[IV_LEN];
	EVP_CIPHER_CTX *ctx;
};

struct xp_seal {
	bool opener;
	unsigned int shift;
	/* sealing: cur only; opening: prev, cur, and a candidate for the next phase, which only
	 * becomes cur once a frame opened with it */
	struct phase prev, cur, cand;
	uint64_t top;	  /* opening: the highest packet number accepted */
	uint64_t next_pn; /* sealing: the lowest packet number not yet used */
	bool any;
	uint64_t seen[WORDS]; /* bit i: top - i was accepted */
	struct xp_seal_stats st;
};

int xp_seal_export(struct xp_tls_sess *s, uint8_t client[XP_SEAL_SECRET],
		   uint8_t server[XP_SEAL_SECRET])
{
	static const char lc[] = "EXPORTER-vmigd-hop client", ls[] = "EXPORTER-vmigd-hop server";

	if (!SSL_is_init_finished(s->ssl) || SSL_version(s->ssl) != TLS1_3_VERSION)
		return -EPROTO;
	if (SSL_export_keying_material(s->ssl, client, XP_SEAL_SECRET, lc, sizeof(lc) - 1, NULL, 0,
				       0) != 1 ||
	    SSL_export_keying_material(s->ssl, server, XP_SEAL_SECRET, ls, sizeof(ls) - 1, NULL, 0,
				       0) != 1)
		return -EIO;
	return 0;
}

/* HKDF-Expand-Label(secret, label, "", len) with SHA-256 (RFC 8446, 7.1). */
static int expand_label(const uint8_t *secret, const char *label, uint8_t *out, size_t len)
{
	uint8_t info[2 + 1 + 255 + 1];
	size_t ll = strlen("tls13 ") + strlen(label), n = 0;
	EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
	EVP_KDF_CTX *k = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
	int mode = EVP_KDF_HKDF_MODE_EXPAND_ONLY, r = -EIO;
	OSSL_PARAM p[5];

	if (!k || ll > 255)
		goto out;
	info[n++] = (uint8_t)(len >> 8);
	info[n++] = (uint8_t)len;
	info[n++] = (uint8_t)ll;
	memcpy(info + n, "tls13 ", 6);
	memcpy(info + n + 6, label, ll - 6);
	n += ll;
	info[n++] = 0; /* an empty context */
	p[0] = OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode);
	p[1] = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, "SHA256", 0);
	p[2] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)secret,
						 XP_SEAL_SECRET);
	p[3] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info, n);
	p[4] = OSSL_PARAM_construct_end();
	if (EVP_KDF_derive(k, out, len, p) == 1)
		r = 0;
out:
	EVP_KDF_CTX_free(k);
	EVP_KDF_free(kdf);
	return r;
}

/* Keys ph for its secret (already set) and number n. */
static int phase_key(struct phase *ph, uint64_t n, bool opener)
{
	uint8_t key[KEY_LEN];
	int r;

	ph->valid = false;
	r = expand_label(ph->secret, "key", key, sizeof(key));
	r = r ?: expand_label(ph->secret, "iv", ph->iv, sizeof(ph->iv));
	if (!r && !ph->ctx)
		r = (ph->ctx = EVP_CIPHER_CTX_new()) ? 0 : -ENOMEM;
	if (!r && EVP_CipherInit_ex(ph->ctx, EVP_aes_256_gcm(), NULL, key, NULL, !opener) != 1)
		r = -EIO;
	OPENSSL_cleanse(key, sizeof(key));
	if (r)
		return r;
	ph->n = n;
	ph->valid = true;
	return 0;
}

/* dst becomes the phase after src. */
static int phase_next(const struct phase *src, struct phase *dst, bool opener)
{
	uint8_t next[XP_SEAL_SECRET];
	int r = expand_label(src->secret, "vmigd ku", next, sizeof(next));

	if (r)
		return r;
	memcpy(dst->secret, next, sizeof(next));
	OPENSSL_cleanse(next, sizeof(next));
	return phase_key(dst, src->n + 1, opener);
}

static void phase_free(struct phase *ph)
{
	EVP_CIPHER_CTX_free(ph->ctx);
	OPENSSL_cleanse(ph, sizeof(*ph));
}

int xp_seal_new(const uint8_t secret[XP_SEAL_SECRET], bool opener, unsigned int shift,
		struct xp_seal **ret)
{
	struct xp_seal *s = calloc(1, sizeof(*s));
	int r;

	if (!s)
		return -ENOMEM;
	s->opener = opener;
	s->shift = shift ? shift : XP_SEAL_PHASE_SHIFT;
	memcpy(s->cur.secret, secret, XP_SEAL_SECRET);
	r = phase_key(&s->cur, 0, opener);
	/* Every context a phase change needs is made now, not on the data path. */
	if (!r && opener) {
		s->prev.ctx = EVP_CIPHER_CTX_new();
		s->cand.ctx = EVP_CIPHER_CTX_new();
		r = s->prev.ctx && s->cand.ctx ? 0 : -ENOMEM;
	}
	if (r) {
		xp_seal_free(s);
		return r;
	}
	*ret = s;
	return 0;
}

void xp_seal_free(struct xp_seal *s)
{
	if (!s)
		return;
	phase_free(&s->prev);
	phase_free(&s->cur);
	phase_free(&s->cand);
	free(s);
}

static void nonce(const struct phase *ph, uint64_t pn, uint8_t out[IV_LEN])
{
	memcpy(out, ph->iv, IV_LEN);
	for (int i = 0; i < 8; i++)
		out[IV_LEN - 1 - i] ^= (uint8_t)(pn >> (8 * i));
}

int xp_seal(struct xp_seal *s, uint64_t pn, const uint8_t *aad, size_t aadlen, uint8_t *buf,
	    size_t len, uint8_t tag[XP_SEAL_TAG])
{
	uint8_t iv[IV_LEN];
	int outl;

	if (s->opener || pn >= PN_LIMIT || len > INT32_MAX || aadlen > INT32_MAX)
		return -ERANGE;
	if (pn < s->next_pn)
		return -EINVAL; /* a nonce used before: never */
	while ((pn >> s->shift) > s->cur.n) {
		struct phase next = { .ctx = s->cur.ctx };
		int r;

		/* The context is keyed again in place: a sealer needs no other. */
		r = phase_next(&s->cur, &next, false);
		if (r)
			return r;
		s->cur = next;
	}
	nonce(&s->cur, pn, iv);
	if (EVP_EncryptInit_ex(s->cur.ctx, NULL, NULL, NULL, iv) != 1 ||
	    EVP_EncryptUpdate(s->cur.ctx, NULL, &outl, aad, (int)aadlen) != 1 ||
	    (len && EVP_EncryptUpdate(s->cur.ctx, buf, &outl, buf, (int)len) != 1) ||
	    EVP_EncryptFinal_ex(s->cur.ctx, buf + len, &outl) != 1 ||
	    EVP_CIPHER_CTX_ctrl(s->cur.ctx, EVP_CTRL_GCM_GET_TAG, XP_SEAL_TAG, tag) != 1)
		return -EIO;
	s->next_pn = pn + 1;
	s->st.sealed++;
	s->st.phase = s->cur.n;
	return 0;
}

static bool seen(const struct xp_seal *s, uint64_t pn)
{
	uint64_t i = s->top - pn;

	return s->seen[i / 64] >> (i % 64) & 1;
}

static void remember(struct xp_seal *s, uint64_t pn)
{
	if (!s->any || pn > s->top) {
		uint64_t shift = s->any ? pn - s->top : XP_SEAL_REPLAY_WINDOW;

		if (shift >= XP_SEAL_REPLAY_WINDOW) {
			memset(s->seen, 0, sizeof(s->seen));
		} else {
			/* Slide the bitmap by shift bits towards older. */
			for (int w = WORDS - 1; w >= 0; w--) {
				uint64_t v = 0;
				int from = w - (int)(shift / 64);

				if (from >= 0) {
					v = s->seen[from] << (shift % 64);
					if (shift % 64 && from > 0)
						v |= s->seen[from - 1] >> (64 - shift % 64);
				}
				s->seen[w] = v;
			}
		}
		s->top = pn;
		s->any = true;
	}
	s->seen[(s->top - pn) / 64] |= 1ull << ((s->top - pn) % 64);
}

static int open_with(struct phase *ph, uint64_t pn, const uint8_t *aad, size_t aadlen, uint8_t *buf,
		     size_t len, const uint8_t tag[XP_SEAL_TAG])
{
	uint8_t iv[IV_LEN];
	int outl;

	nonce(ph, pn, iv);
	if (EVP_DecryptInit_ex(ph->ctx, NULL, NULL, NULL, iv) != 1 ||
	    EVP_DecryptUpdate(ph->ctx, NULL, &outl, aad, (int)aadlen) != 1 ||
	    (len && EVP_DecryptUpdate(ph->ctx, buf, &outl, buf, (int)len) != 1) ||
	    EVP_CIPHER_CTX_ctrl(ph->ctx, EVP_CTRL_GCM_SET_TAG, XP_SEAL_TAG, (void *)tag) != 1)
		return -EIO;
	return EVP_DecryptFinal_ex(ph->ctx, buf + len, &outl) == 1 ? 0 : -EBADMSG;
}

int xp_open(struct xp_seal *s, uint64_t pn, const uint8_t *aad, size_t aadlen, uint8_t *buf,
	    size_t len, const uint8_t tag[XP_SEAL_TAG])
{
	uint64_t n = pn >> s->shift;
	struct phase *ph;
	int r;

	if (!s->opener || pn >= PN_LIMIT || len > INT32_MAX || aadlen > INT32_MAX)
		return -ERANGE;
	if (s->any && pn + XP_SEAL_REPLAY_WINDOW <= s->top) {
		s->st.too_old++;
		return -ESTALE;
	}
	if (s->any && pn <= s->top && seen(s, pn)) {
		s->st.replayed++;
		return -EALREADY;
	}
	if (n == s->cur.n) {
		ph = &s->cur;
	} else if (s->prev.valid && n == s->prev.n) {
		ph = &s->prev;
	} else if (n == s->cur.n + 1) {
		/* The next phase: keyed on the side, kept only if the frame is genuine. */
		if (!s->cand.valid || s->cand.n != n) {
			r = phase_next(&s->cur, &s->cand, true);
			if (r)
				return r;
		}
		ph = &s->cand;
	} else {
		s->st.too_old++; /* a phase long gone, or one no sealer could be in yet */
		return -ESTALE;
	}
	r = open_with(ph, pn, aad, aadlen, buf, len, tag);
	if (r) {
		s->st.forged += r == -EBADMSG;
		return r;
	}
	if (ph == &s->cand) {
		struct phase old = s->prev;

		s->prev = s->cur;
		s->cur = s->cand;
		s->cand = old; /* its context is reused for the phase after */
		s->cand.valid = false;
	}
	remember(s, pn);
	s->st.opened++;
	s->st.phase = s->cur.n;
	return 0;
}

void xp_seal_stats(const struct xp_seal *s, struct xp_seal_stats *st)
{
	*st = s->st;
}
