// SPDX-License-Identifier: Apache-2.0
/* Mutual TLS on OpenSSL 3 for the node hop, the context side: certificate generations and their
 * reload, the allow-list and the verify callback, the client's resumption cache, the kTLS probe.
 * Not the sessions (handshake, read, write, shutdown): xp_tls_sess.c. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "file.h"
#include "log.h"
#include "util.h"
#include "xp_tls.h"
#include "xp_tls_priv.h"

#ifndef TCP_ULP
#define TCP_ULP 31
#endif

/* TLS 1.2 suites: ECDHE and AEAD only. TLS 1.3 suites are all AEAD; AES-128 first (faster). */
#define CIPHERS_12                                                                                 \
	"ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"                               \
	"ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"                               \
	"ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"
#define CIPHERS_13 "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
#define GROUPS	   "X25519:P-256:P-384"
/* With read-ahead, one read(2) takes this many bytes of records. */
#define READ_BUFFER    (128 * 1024)
#define SESSION_ID_CTX "vmigd-node-hop"

const char *xp_tls_refusal_token(enum xp_tls_refusal r)
{
	static const char *const tok[] = {
		[XP_TLS_OK] = "ok",
		[XP_TLS_NO_CERT] = "no-certificate",
		[XP_TLS_UNTRUSTED] = "untrusted-ca",
		[XP_TLS_EXPIRED] = "expired",
		[XP_TLS_NOT_YET_VALID] = "not-yet-valid",
		[XP_TLS_BAD_PURPOSE] = "bad-purpose",
		[XP_TLS_NAME] = "name-not-allowed",
		[XP_TLS_PEER_REFUSED] = "peer-refused",
		[XP_TLS_PROTOCOL] = "protocol",
		[XP_TLS_CLOSED] = "closed",
	};

	return (unsigned int)r < ARRAY_SIZE(tok) ? tok[r] : "?";
}

void xp_tls_ssl_error_line(char *buf, size_t len)
{
	unsigned long e = ERR_peek_last_error();

	if (!e)
		snprintf(buf, len, "unknown error");
	else
		ERR_error_string_n(e, buf, len);
	ERR_clear_error();
}

static void time_line(const ASN1_TIME *tm, char *buf, size_t len)
{
	BIO *b = BIO_new(BIO_s_mem());
	int k = 0;

	if (b && ASN1_TIME_print(b, tm) > 0)
		k = BIO_read(b, buf, (int)len - 1);
	buf[k > 0 ? k : 0] = '\0';
	if (k <= 0)
		snprintf(buf, len, "?");
	BIO_free(b);
}

/* ---- allow-lists ---- */

static bool name_allowed(const struct allow_list *a, const char *name, size_t len)
{
	for (unsigned int i = 0; i < a->n; i++)
		if (strlen(a->names[i]) == len && memcmp(a->names[i], name, len) == 0)
			return true;
	return false;
}

bool xp_tls_cert_allowed(const struct xp_tls *t, bool server, X509 *x)
{
	const struct allow_list *a = &t->allow[server ? 0 : 1];
	X509_NAME *subj = X509_get_subject_name(x);
	GENERAL_NAMES *sans;
	bool ok = false;
	int i = -1;

	if (a->any)
		return true;
	while ((i = X509_NAME_get_index_by_NID(subj, NID_commonName, i)) >= 0 && !ok) {
		ASN1_STRING *d = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subj, i));

		ok = name_allowed(a, (const char *)ASN1_STRING_get0_data(d), ASN1_STRING_length(d));
	}
	sans = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
	for (int k = 0; sans && !ok && k < sk_GENERAL_NAME_num(sans); k++) {
		GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, k);
		ASN1_STRING *d = g->type == GEN_DNS   ? g->d.dNSName
				 : g->type == GEN_URI ? g->d.uniformResourceIdentifier
						      : NULL;

		if (d)
			ok = name_allowed(a, (const char *)ASN1_STRING_get0_data(d),
					  ASN1_STRING_length(d));
	}
	GENERAL_NAMES_free(sans);
	return ok;
}

void xp_tls_allow_line(const struct xp_tls *t, bool server, char *buf, size_t len)
{
	size_t used = 0;
	const char *name;

	buf[0] = '\0';
	for (unsigned int i = 0; (name = xp_tls_allow_list(t, !server, i)) && used < len; i++)
		used += snprintf(buf + used, len - used, "%s%s", i ? "," : "", name);
}

/* option names the list in errors: "--tls-allow", "--tls-allow-client", ... */
static int parse_allow(struct allow_list *a, const char *option, const char *list, char *err,
		       size_t errlen)
{
	const char *p = list;

	while (*p) {
		size_t n;

		p += strspn(p, " \t");
		n = strcspn(p, ",");
		while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t'))
			n--;
		if (n == 1 && *p == '*') {
			a->any = true;
		} else if (n > 0) {
			if (a->n == XP_TLS_ALLOW_MAX || n > 255) {
				snprintf(err, errlen, "%s: at most %d names of 255 bytes", option,
					 XP_TLS_ALLOW_MAX);
				return -EINVAL;
			}
			a->names[a->n] = strndup(p, n);
			if (!a->names[a->n++])
				return -ENOMEM;
		}
		p += n;
		p += strspn(p, " \t");
		p += *p == ',';
	}
	if (!a->any && a->n == 0) {
		snprintf(err, errlen, "%s: no names given", option);
		return -EINVAL;
	}
	return 0;
}

static void allow_free(struct allow_list *a)
{
	for (unsigned int i = 0; i < a->n; i++)
		free(a->names[i]);
	a->n = 0;
}

/* Whether OpenSSL's cipher string s selects at least one suite of TLS 1.2 or below, tried on
 * scratch (SSL_CTX_set_cipher_list() refuses a string that selects none). */
static bool ciphers12_known(SSL_CTX *scratch, const char *s)
{
	int ok = SSL_CTX_set_cipher_list(scratch, s);

	ERR_clear_error();
	return ok == 1;
}

/*
 * --tls-ciphers: each name as IANA (and Go, and KubeVirt's CR) writes it, or OpenSSL's own,
 * into OpenSSL's list. As KubeVirt drops a name Go does not know, a name OpenSSL does not know
 * (or one that selects no TLS 1.2 suite) is left out, with a warning naming it; only a list
 * with no known suite left is refused.
 */
static int parse_ciphers12(struct xp_tls *t, const char *list, char *err, size_t errlen)
{
	SSL_CTX *scratch = SSL_CTX_new(TLS_method());
	unsigned int unknown = 0;
	size_t used = 0;
	const char *p = list;
	int r = -EINVAL;

	if (!scratch) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	t->ciphers12[0] = '\0';
	while (*p) {
		char name[128];
		const char *ossl;
		size_t n;

		p += strspn(p, " \t,:");
		n = strcspn(p, " \t,:");
		if (n == 0)
			break;
		if (n >= sizeof(name)) {
			snprintf(err, errlen, "--tls-ciphers: a name is too long: %.40s...", p);
			goto out;
		}
		memcpy(name, p, n);
		name[n] = '\0';
		p += n;
		ossl = strncmp(name, "TLS_", 4) == 0 ? OPENSSL_cipher_name(name) : name;
		if (!ossl || !strcmp(ossl, "(NONE)") || !ciphers12_known(scratch, ossl)) {
			log_warn("--tls-ciphers: unknown TLS 1.2 suite \"%s\": left out", name);
			unknown++;
			continue;
		}
		if (used + strlen(ossl) + 2 > sizeof(t->ciphers12)) {
			snprintf(err, errlen, "--tls-ciphers: too many suites");
			goto out;
		}
		used += snprintf(t->ciphers12 + used, sizeof(t->ciphers12) - used, "%s%s",
				 used ? ":" : "", ossl);
	}
	if (!used) {
		if (unknown)
			snprintf(err, errlen, "--tls-ciphers: no known TLS 1.2 suite in \"%s\"",
				 list);
		else
			snprintf(err, errlen, "--tls-ciphers: no suites given");
		goto out;
	}
	r = 0;
out:
	SSL_CTX_free(scratch);
	return r;
}

/* ---- verification ---- */

enum xp_tls_refusal xp_tls_verify_refusal(int e)
{
	switch (e) {
	case X509_V_ERR_CERT_HAS_EXPIRED:
	case X509_V_ERR_CRL_HAS_EXPIRED:
		return XP_TLS_EXPIRED;
	case X509_V_ERR_CERT_NOT_YET_VALID:
	case X509_V_ERR_CRL_NOT_YET_VALID:
		return XP_TLS_NOT_YET_VALID;
	case X509_V_ERR_INVALID_PURPOSE:
		return XP_TLS_BAD_PURPOSE;
	default:
		return XP_TLS_UNTRUSTED;
	}
}

/* Runs on full handshakes only; a resumed session was checked when it was first made. */
static int verify_cb(int ok, X509_STORE_CTX *ctx)
{
	SSL *ssl = X509_STORE_CTX_get_ex_data(ctx, SSL_get_ex_data_X509_STORE_CTX_idx());
	struct xp_tls_sess *s = SSL_get_ex_data(ssl, xp_tls_sess_idx);
	X509 *x = X509_STORE_CTX_get_current_cert(ctx);
	int depth = X509_STORE_CTX_get_error_depth(ctx);
	char subj[200] = "?";

	if (!s)
		return ok;
	if (s->refusal != XP_TLS_OK)
		return 0;
	if (x)
		name_line(x, subj, sizeof(subj));
	if (!ok) {
		int e = X509_STORE_CTX_get_error(ctx);

		s->refusal = xp_tls_verify_refusal(e);
		if (s->refusal == XP_TLS_EXPIRED && x) {
			char when[64];

			time_line(X509_get0_notAfter(x), when, sizeof(when));
			snprintf(s->error, sizeof(s->error),
				 "certificate \"%s\" (chain depth %d) expired on %s", subj, depth,
				 when);
		} else {
			snprintf(s->error, sizeof(s->error),
				 "certificate \"%s\" (chain depth %d): %s", subj, depth,
				 X509_verify_cert_error_string(e));
		}
		return 0;
	}
	if (depth == 0 && !xp_tls_cert_allowed(s->t, s->server, x)) {
		char allow[256];

		xp_tls_allow_line(s->t, s->server, allow, sizeof(allow));
		s->refusal = XP_TLS_NAME;
		snprintf(s->error, sizeof(s->error),
			 "certificate \"%.100s\" is signed by our CA but neither its CN nor a SAN "
			 "is allowed (allowed: %.150s)",
			 subj, allow);
		X509_STORE_CTX_set_error(ctx, X509_V_ERR_APPLICATION_VERIFICATION);
		return 0;
	}
	return 1;
}

/* ---- resumption cache (client) ---- */

static void cache_clear(struct xp_tls *t)
{
	pthread_mutex_lock(&t->cache_lock);
	for (unsigned int i = 0; i < CACHE_PEERS; i++) {
		SSL_SESSION_free(t->cache[i].sess);
		t->cache[i].sess = NULL;
		t->cache[i].peer[0] = '\0';
	}
	pthread_mutex_unlock(&t->cache_lock);
}

SSL_SESSION *xp_tls_cache_get(struct xp_tls *t, const char *peer)
{
	SSL_SESSION *s = NULL;

	pthread_mutex_lock(&t->cache_lock);
	for (unsigned int i = 0; i < CACHE_PEERS && !s; i++)
		if (t->cache[i].sess && strcmp(t->cache[i].peer, peer) == 0) {
			s = t->cache[i].sess;
			SSL_SESSION_up_ref(s);
		}
	pthread_mutex_unlock(&t->cache_lock);
	return s;
}

/* Called by OpenSSL when a ticket arrives; we keep a copy of the newest one per peer. */
static int new_session_cb(SSL *ssl, SSL_SESSION *sess)
{
	struct xp_tls_sess *s = SSL_get_ex_data(ssl, xp_tls_sess_idx);
	struct xp_tls *t;
	struct cache_entry *slot = NULL;

	if (s)
		s->ticket = true; /* the server took our certificate (xp_tls_await_server()) */
	if (!s || !s->peer[0] || !SSL_SESSION_is_resumable(sess))
		return 0;
	t = s->t;
	pthread_mutex_lock(&t->cache_lock);
	/* A late ticket from an older generation would only be refused by the new server key. */
	if (s->generation == t->generation) {
		for (unsigned int i = 0; i < CACHE_PEERS && !slot; i++)
			if (t->cache[i].sess && strcmp(t->cache[i].peer, s->peer) == 0)
				slot = &t->cache[i];
		if (!slot)
			slot = &t->cache[t->cache_next++ % CACHE_PEERS];
		/* A copy: OpenSSL marks the connection's own session unresumable if that
		 * connection later ends without close_notify, which says nothing of the ticket. */
		SSL_SESSION *dup = SSL_SESSION_dup(sess);

		if (dup) {
			SSL_SESSION_free(slot->sess);
			slot->sess = dup;
			snprintf(slot->peer, sizeof(slot->peer), "%s", s->peer);
		}
	}
	pthread_mutex_unlock(&t->cache_lock);
	return 0;
}

/* ---- contexts ---- */

/* The five files of a generation as read, each checked (vm_file_read_checked()): read once, so
 * that what is hashed is what is loaded, and from memory, so that a FIFO or a device given as a
 * file cannot wedge the control thread. */
enum { F_CERT, F_KEY, F_CLIENT_CERT, F_CLIENT_KEY, F_CA, F_N };

struct pem_files {
	const char *path[F_N];
	char *data[F_N];
	size_t len[F_N];
	char warnings[sizeof(((struct xp_tls *)0)->warnings)];
};

static void files_done(struct pem_files *f)
{
	for (unsigned int i = 0; i < F_N; i++) {
		if (f->data[i])
			OPENSSL_cleanse(f->data[i], f->len[i]);
		free(f->data[i]);
		f->data[i] = NULL;
	}
}

static int files_read(const struct xp_tls *t, struct pem_files *f, char *err, size_t errlen)
{
	static const char *const what[F_N] = { "certificate", "private key", "client certificate",
					       "client key", "CA" };
	const char *path[F_N] = { t->cert, t->key, t->client_cert, t->client_key, t->ca };
	size_t wl = 0;
	char msg[600];
	int r;

	*f = (struct pem_files){ 0 };
	for (unsigned int i = 0; i < F_N; i++) {
		f->path[i] = path[i];
		r = vm_file_read_checked(path[i], what[i],
					 i == F_KEY || i == F_CLIENT_KEY ? VM_FILE_SECRET : 0,
					 VM_FILE_MAX, &f->data[i], &f->len[i], msg, sizeof(msg));
		if (r < 0) {
			snprintf(err, errlen, "%s", msg);
			files_done(f);
			return r;
		}
		/* The default client pair is the server pair: one warning for each file. */
		if (r > 0 && !strstr(f->warnings, msg) && wl < sizeof(f->warnings) - 1)
			wl += (size_t)snprintf(f->warnings + wl, sizeof(f->warnings) - wl, "%s%s",
					       wl ? "\n" : "", msg);
	}
	return 0;
}

/* SHA-256 over the files' bytes. */
static int files_digest(const struct pem_files *f, unsigned char out[32])
{
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	int r = -ENOMEM;

	if (!md || !EVP_DigestInit_ex(md, EVP_sha256(), NULL))
		goto out;
	for (unsigned int i = 0; i < F_N; i++) {
		EVP_DigestUpdate(md, f->data[i], f->len[i]);
		EVP_DigestUpdate(md, "\n", 1);
	}
	r = EVP_DigestFinal_ex(md, out, NULL) ? 0 : -EIO;
out:
	EVP_MD_CTX_free(md);
	return r;
}

/* Never asks for a passphrase (OpenSSL's default would prompt on the terminal). */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
	return -1;
}

static BIO *pem_bio(const struct pem_files *f, unsigned int i)
{
	return BIO_new_mem_buf(f->data[i], (int)f->len[i]);
}

/* As SSL_CTX_use_certificate_chain_file(): the first certificate is ours, the rest its chain. */
static int use_chain(SSL_CTX *ctx, const struct pem_files *f, unsigned int i)
{
	BIO *b = pem_bio(f, i);
	X509 *x = NULL, *ca;
	unsigned long e;
	int ok = 0;

	if (!b)
		return 0;
	x = PEM_read_bio_X509_AUX(b, NULL, no_passphrase, NULL);
	if (!x || SSL_CTX_use_certificate(ctx, x) != 1 || !SSL_CTX_clear_chain_certs(ctx))
		goto out;
	while ((ca = PEM_read_bio_X509(b, NULL, no_passphrase, NULL))) {
		if (!SSL_CTX_add0_chain_cert(ctx, ca)) {
			X509_free(ca);
			goto out;
		}
	}
	e = ERR_peek_last_error();
	if (ERR_GET_LIB(e) != ERR_LIB_PEM || ERR_GET_REASON(e) != PEM_R_NO_START_LINE)
		goto out;
	ERR_clear_error();
	ok = 1;
out:
	X509_free(x);
	BIO_free(b);
	return ok;
}

static int use_key(SSL_CTX *ctx, const struct pem_files *f, unsigned int i)
{
	BIO *b = pem_bio(f, i);
	EVP_PKEY *k = b ? PEM_read_bio_PrivateKey(b, NULL, no_passphrase, NULL) : NULL;
	int ok = k && SSL_CTX_use_PrivateKey(ctx, k) == 1;

	EVP_PKEY_free(k);
	BIO_free(b);
	return ok;
}

/* As SSL_CTX_load_verify_locations(ctx, file, NULL): every certificate and CRL in the file into
 * the context's store. The number of certificates; -1 on an error. */
static int load_ca(SSL_CTX *ctx, const struct pem_files *f)
{
	X509_STORE *st = SSL_CTX_get_cert_store(ctx);
	BIO *b = pem_bio(f, F_CA);
	STACK_OF(X509_INFO) *inf = b ? PEM_X509_INFO_read_bio(b, NULL, no_passphrase, NULL) : NULL;
	int n = -1;

	if (!inf)
		goto out;
	n = 0;
	for (int i = 0; i < sk_X509_INFO_num(inf); i++) {
		X509_INFO *it = sk_X509_INFO_value(inf, i);

		if (it->x509) {
			if (!X509_STORE_add_cert(st, it->x509)) {
				n = -1;
				break;
			}
			n++;
		}
		if (it->crl && !X509_STORE_add_crl(st, it->crl)) {
			n = -1;
			break;
		}
	}
out:
	sk_X509_INFO_pop_free(inf, X509_INFO_free);
	BIO_free(b);
	return n;
}

static int ctx_common(SSL_CTX *ctx, const struct xp_tls *t, const struct pem_files *f,
		      unsigned int icert, unsigned int ikey, char *err, size_t errlen)
{
	const char *cert = f->path[icert], *key = f->path[ikey];
	char e[200];
	int n;

	SSL_CTX_set_min_proto_version(ctx, t->min_version);
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION |
					 SSL_OP_CIPHER_SERVER_PREFERENCE);
	if (t->ktls)
		SSL_CTX_set_options(ctx, SSL_OP_ENABLE_KTLS);
	/* Not SSL_MODE_RELEASE_BUFFERS: it would free and allocate on the data path. */
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	SSL_CTX_set_read_ahead(ctx, 1);
	SSL_CTX_set_default_read_buffer_len(ctx, READ_BUFFER);
	if (!SSL_CTX_set_cipher_list(ctx, t->ciphers12) ||
	    !SSL_CTX_set_ciphersuites(ctx, CIPHERS_13) || !SSL_CTX_set1_groups_list(ctx, GROUPS)) {
		xp_tls_ssl_error_line(e, sizeof(e));
		snprintf(err, errlen, "cipher configuration: %s", e);
		return -EINVAL;
	}
	if (!use_chain(ctx, f, icert)) {
		xp_tls_ssl_error_line(e, sizeof(e));
		snprintf(err, errlen, "certificate %s: %s", cert, e);
		return -EINVAL;
	}
	if (!use_key(ctx, f, ikey)) {
		if (ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH) {
			ERR_clear_error();
			snprintf(err, errlen, "private key %s does not belong to certificate %s",
				 key, cert);
			return -EINVAL;
		}
		xp_tls_ssl_error_line(e, sizeof(e));
		snprintf(err, errlen, "private key %s: %s", key, e);
		return -EINVAL;
	}
	if (SSL_CTX_check_private_key(ctx) != 1) {
		ERR_clear_error();
		snprintf(err, errlen, "private key %s does not belong to certificate %s", key,
			 cert);
		return -EINVAL;
	}
	n = load_ca(ctx, f);
	if (n <= 0) {
		if (n < 0)
			xp_tls_ssl_error_line(e, sizeof(e));
		else
			snprintf(e, sizeof(e), "no PEM certificate in it");
		ERR_clear_error();
		snprintf(err, errlen, "CA %s: %s", t->ca, e);
		return -EINVAL;
	}
	/* Our own certificate must be valid now, or every peer will refuse us. */
	if (X509_cmp_current_time(X509_get0_notAfter(SSL_CTX_get0_certificate(ctx))) < 0) {
		snprintf(err, errlen, "certificate %s has expired", cert);
		return -EKEYEXPIRED;
	}
	if (X509_cmp_current_time(X509_get0_notBefore(SSL_CTX_get0_certificate(ctx))) > 0) {
		snprintf(err, errlen, "certificate %s is not valid yet (check the clock)", cert);
		return -EKEYEXPIRED;
	}
	return 0;
}

/* The server's half of ALPN: the newest of ours the client offers, else none (a stock peer). */
static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
		       const unsigned char *in, unsigned int inlen, void *arg)
{
	static const unsigned char ours[] = XP_TLS_ALPNS;
	unsigned char *sel;

	if (SSL_select_next_proto(&sel, outlen, ours, sizeof(ours) - 1, in, inlen) !=
	    OPENSSL_NPN_NEGOTIATED)
		return SSL_TLSEXT_ERR_NOACK;
	*out = sel;
	return SSL_TLSEXT_ERR_OK;
}

/*
 * A source presents its client pair: one KubeVirt issues for servers only (serverAuth) would be
 * refused by every target. Such a node can still be a target, so this is no reason to refuse
 * the pair; sources refuse to start with this line instead (xp_tls_client_problem()).
 */
static void check_client_cert(struct xp_tls *t, SSL_CTX *cli)
{
	X509 *x = SSL_CTX_get0_certificate(cli);

	t->client_problem[0] = '\0';
	if (X509_check_purpose(x, X509_PURPOSE_SSL_CLIENT, 0) == 1)
		return;
	snprintf(t->client_problem, sizeof(t->client_problem),
		 "certificate %.200s cannot be a client certificate (its extendedKeyUsage lacks "
		 "clientAuth), so this node cannot be a source: give --tls-client-cert and "
		 "--tls-client-key (KubeVirt's migration client pair)",
		 t->client_cert);
}

static int ctx_build(struct xp_tls *t, const struct pem_files *f, SSL_CTX **srv, SSL_CTX **cli,
		     char *err, size_t errlen)
{
	static const unsigned char alpn[] = XP_TLS_ALPNS;
	int r = -ENOMEM;

	*srv = SSL_CTX_new(TLS_server_method());
	*cli = SSL_CTX_new(TLS_client_method());
	if (!*srv || !*cli) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	r = ctx_common(*srv, t, f, F_CERT, F_KEY, err, errlen);
	if (r < 0)
		goto fail;
	r = ctx_common(*cli, t, f, F_CLIENT_CERT, F_CLIENT_KEY, err, errlen);
	if (r < 0)
		goto fail;
	check_client_cert(t, *cli);
	SSL_CTX_set_alpn_select_cb(*srv, alpn_select, NULL);
	/* Every source offers it: a vmigd target selects it, a stock one ignores it. */
	if (SSL_CTX_set_alpn_protos(*cli, alpn, sizeof(alpn) - 1) != 0) {
		snprintf(err, errlen, "out of memory");
		r = -ENOMEM;
		goto fail;
	}
	SSL_CTX_set_verify(*srv, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, verify_cb);
	SSL_CTX_set_verify(*cli, SSL_VERIFY_PEER, verify_cb);
	/* Stateless tickets; a fresh context (a new generation) has a fresh ticket key. */
	SSL_CTX_set_session_id_context(*srv, (const unsigned char *)SESSION_ID_CTX,
				       sizeof(SESSION_ID_CTX) - 1);
	SSL_CTX_set_num_tickets(*srv, 1);
	SSL_CTX_set_session_cache_mode(*cli,
				       SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
	SSL_CTX_sess_set_new_cb(*cli, new_session_cb);
	return 0;

fail:
	SSL_CTX_free(*srv);
	SSL_CTX_free(*cli);
	*srv = *cli = NULL;
	return r;
}

/* An ASN1 time as Unix seconds; 0 if it cannot be read. */
static int64_t unix_time(const ASN1_TIME *tm)
{
	struct tm t;

	if (!tm || ASN1_TIME_to_tm(tm, &t) != 1)
		return 0;
	return (int64_t)timegm(&t);
}

/* The node certificate's notAfter and the earliest one in the CA store. */
static void note_expiry(struct xp_tls *t)
{
	STACK_OF(X509_OBJECT) *objs = X509_STORE_get0_objects(SSL_CTX_get_cert_store(t->srv));

	t->node_not_after = unix_time(X509_get0_notAfter(SSL_CTX_get0_certificate(t->srv)));
	t->ca_not_after = 0;
	for (int i = 0; objs && i < sk_X509_OBJECT_num(objs); i++) {
		X509 *x = X509_OBJECT_get0_X509(sk_X509_OBJECT_value(objs, i));
		int64_t at = x ? unix_time(X509_get0_notAfter(x)) : 0;

		if (at && (!t->ca_not_after || at < t->ca_not_after))
			t->ca_not_after = at;
	}
}

static void describe_cert(struct xp_tls *t)
{
	X509 *x = SSL_CTX_get0_certificate(t->srv);
	char subj[200], serial[80] = "?", when[64];
	BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), NULL);
	char *hex = bn ? BN_bn2hex(bn) : NULL;

	name_line(x, subj, sizeof(subj));
	if (hex)
		snprintf(serial, sizeof(serial), "%s", hex);
	time_line(X509_get0_notAfter(x), when, sizeof(when));
	snprintf(t->desc, sizeof(t->desc), "certificate \"%.180s\" serial %.64s expires %.40s",
		 subj, serial, when);
	OPENSSL_free(hex);
	BN_free(bn);
	note_expiry(t);
}

int xp_tls_reload(struct xp_tls *t, char *err, size_t errlen)
{
	unsigned char digest[32];
	struct pem_files f;
	SSL_CTX *srv, *cli;
	int r;

	r = files_read(t, &f, err, errlen);
	if (r < 0)
		return r;
	r = files_digest(&f, digest);
	if (r < 0) {
		snprintf(err, errlen, "cannot hash the files: %s", strerror(-r));
		goto out;
	}
	if (t->generation && memcmp(digest, t->digest, sizeof(digest)) == 0) {
		r = 1;
		goto out;
	}
	r = ctx_build(t, &f, &srv, &cli, err, errlen);
	if (r < 0)
		goto out;
	SSL_CTX_free(t->srv);
	SSL_CTX_free(t->cli);
	t->srv = srv;
	t->cli = cli;
	memcpy(t->digest, digest, sizeof(digest));
	memcpy(t->warnings, f.warnings, sizeof(t->warnings));
	pthread_mutex_lock(&t->cache_lock);
	t->generation++;
	pthread_mutex_unlock(&t->cache_lock);
	cache_clear(t);
	describe_cert(t);
out:
	files_done(&f);
	return r;
}

int xp_tls_new(const struct xp_tls_conf *conf, struct xp_tls **ret, char *err, size_t errlen)
{
	struct xp_tls *t;
	int r = -ENOMEM;

	pthread_once(&xp_tls_once, xp_tls_init_once);
	if (!conf->cert || !conf->key || !conf->ca) {
		snprintf(err, errlen, "TLS needs --tls-cert, --tls-key and --tls-ca");
		return -EINVAL;
	}
	t = calloc(1, sizeof(*t));
	if (!t)
		goto nomem;
	pthread_mutex_init(&t->cache_lock, NULL);
	t->cert = strdup(conf->cert);
	t->key = strdup(conf->key);
	t->client_cert = strdup(conf->client_cert ? conf->client_cert : conf->cert);
	t->client_key = strdup(conf->client_key ? conf->client_key : conf->key);
	t->ca = strdup(conf->ca);
	t->resumption = conf->resumption;
	t->ktls = conf->ktls && xp_tls_kernel_has_ktls();
	if (!t->cert || !t->key || !t->client_cert || !t->client_key || !t->ca)
		goto fail_nomem;
	if (conf->min_version && conf->min_version != 12 && conf->min_version != 13) {
		snprintf(err, errlen, "--tls-min-version: vmigd speaks TLS 1.2 and 1.3");
		r = -EINVAL;
		goto fail;
	}
	t->min_version = conf->min_version == 13 ? TLS1_3_VERSION : TLS1_2_VERSION;
	r = parse_ciphers12(t, conf->ciphers12 ? conf->ciphers12 : CIPHERS_12, err, errlen);
	if (r < 0)
		goto fail;
	r = parse_allow(&t->allow[0], conf->allow_clients ? "--tls-allow-client" : "--tls-allow",
			conf->allow_clients ? conf->allow_clients
			: conf->allow	    ? conf->allow
					    : XP_TLS_DEFAULT_ALLOW,
			err, errlen);
	if (r < 0)
		goto fail;
	r = parse_allow(&t->allow[1], conf->allow_servers ? "--tls-allow-server" : "--tls-allow",
			conf->allow_servers ? conf->allow_servers
			: conf->allow	    ? conf->allow
					    : XP_TLS_DEFAULT_ALLOW,
			err, errlen);
	if (r < 0)
		goto fail;
	r = xp_tls_reload(t, err, errlen);
	if (r < 0)
		goto fail;
	*ret = t;
	return 0;

fail_nomem:
	r = -ENOMEM;
nomem:
	snprintf(err, errlen, "out of memory");
fail:
	xp_tls_free(t);
	return r;
}

void xp_tls_free(struct xp_tls *t)
{
	if (!t)
		return;
	cache_clear(t);
	SSL_CTX_free(t->srv);
	SSL_CTX_free(t->cli);
	allow_free(&t->allow[0]);
	allow_free(&t->allow[1]);
	free(t->cert);
	free(t->key);
	free(t->client_cert);
	free(t->client_key);
	free(t->ca);
	pthread_mutex_destroy(&t->cache_lock);
	free(t);
}

unsigned int xp_tls_generation(const struct xp_tls *t)
{
	return t->generation;
}

const char *xp_tls_describe(const struct xp_tls *t)
{
	return t->desc;
}

const char *xp_tls_allow_list(const struct xp_tls *t, bool servers, unsigned int i)
{
	const struct allow_list *a = &t->allow[servers ? 1 : 0];

	if (a->any && i == 0)
		return "*";
	i -= a->any;
	return i < a->n ? a->names[i] : NULL;
}

void xp_tls_expiry(const struct xp_tls *t, int64_t *node, int64_t *ca)
{
	*node = t->node_not_after;
	*ca = t->ca_not_after;
}

const char *xp_tls_warnings(const struct xp_tls *t)
{
	return t->warnings;
}

const char *xp_tls_client_problem(const struct xp_tls *t)
{
	return t->client_problem[0] ? t->client_problem : NULL;
}

const char *xp_tls_min_version(const struct xp_tls *t)
{
	return t->min_version == TLS1_3_VERSION ? "TLSv1.3" : "TLSv1.2";
}

bool xp_tls_ktls_enabled(const struct xp_tls *t)
{
	return t->ktls;
}

unsigned int xp_tls_files(const struct xp_tls *t, const char *out[5])
{
	out[0] = t->cert;
	out[1] = t->key;
	out[2] = t->client_cert;
	out[3] = t->client_key;
	out[4] = t->ca;
	return 5;
}

bool xp_tls_kernel_has_ktls(void)
{
	static int cached = -1;
	int fd;

	if (cached >= 0)
		return cached;
	/* On an unconnected socket the "tls" ULP answers ENOTCONN if it exists, ENOENT if not. */
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false;
	cached = setsockopt(fd, IPPROTO_TCP, TCP_ULP, "tls", 3) == 0 || errno == ENOTCONN;
	close(fd);
	return cached;
}
