/* SPDX-License-Identifier: Apache-2.0 */
/* xp_tls's own header, shared by xp_tls.c (contexts, allow-list, verification, resumption cache)
 * and xp_tls_sess.c (sessions and their batching BIO): the records of both and the calls between
 * the two files. Nothing outside transport/ includes it. */
#ifndef XP_TLS_PRIV_H
#define XP_TLS_PRIV_H

#include <openssl/ssl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "xp_tls.h"

#define CACHE_PEERS 32

struct cache_entry {
	char peer[80];
	SSL_SESSION *sess;
};

/* Names a peer's certificate must carry (CN or a DNS/URI SAN). */
struct allow_list {
	char *names[XP_TLS_ALLOW_MAX];
	unsigned int n;
	bool any;
};

struct xp_tls {
	char *cert, *key, *client_cert, *client_key, *ca;
	struct allow_list allow[2]; /* [0]: clients we accept, [1]: servers we accept */
	bool resumption, ktls;
	int min_version;     /* TLS1_2_VERSION or TLS1_3_VERSION */
	char ciphers12[512]; /* OpenSSL's names */
	char client_problem[400]; /* why the client pair cannot be a client; empty: it can */
	SSL_CTX *srv, *cli;
	unsigned int generation;
	unsigned char digest[32]; /* of the files' bytes, to tell a real change from a touch */
	char desc[320];
	int64_t node_not_after, ca_not_after; /* Unix seconds (xp_tls_expiry()) */
	char warnings[1200]; /* the generation's files' forgiven mode problems, one a line */
	pthread_mutex_t cache_lock; /* tickets may arrive on a worker */
	struct cache_entry cache[CACHE_PEERS];
	unsigned int cache_next;
};

struct xp_tls_sess {
	struct xp_tls *t;
	SSL *ssl;
	int fd;
	/* xp_tls_sess_batch(): records wait in batch[off, len) for one write(2) */
	uint8_t *batch;
	size_t batch_cap, batch_off, batch_len;
	/* ... and records read from the socket wait in rbatch[roff, rlen) */
	uint8_t *rbatch;
	size_t rbatch_cap, rbatch_off, rbatch_len;
	bool server;
	bool ticket; /* client: the server's session ticket arrived */
	unsigned int generation;
	char peer[80];
	enum xp_tls_refusal refusal;
	char error[448];
	char desc[256];
	char peer_name[160]; /* the peer certificate's subject, once the handshake is done */
	const char *io_error;
};

static inline void name_line(X509 *x, char *buf, size_t len)
{
	X509_NAME_oneline(X509_get_subject_name(x), buf, (int)len);
}

/* xp_tls.c */
/* The most recent OpenSSL error as one line; empties the thread's queue. */
void xp_tls_ssl_error_line(char *buf, size_t len);
/* Whether the certificate's CN or one of its DNS/URI SANs is on the list of its role: a server
 * checks its clients against allow[0], a client its server against allow[1]. */
bool xp_tls_cert_allowed(const struct xp_tls *t, bool server, X509 *x);
/* The allow-list a side checks its peer against, as one line. */
void xp_tls_allow_line(const struct xp_tls *t, bool server, char *buf, size_t len);
/* The refusal an X509_V_ERR_* code stands for. */
enum xp_tls_refusal xp_tls_verify_refusal(int e);
/* The newest ticket kept for peer, a reference the caller frees; NULL: none. */
SSL_SESSION *xp_tls_cache_get(struct xp_tls *t, const char *peer);

/* xp_tls_sess.c: made once, by the first xp_tls_new() */
extern pthread_once_t xp_tls_once;
void xp_tls_init_once(void);
/* SSL ex_data: the struct xp_tls_sess of an SSL, for the callbacks. */
extern int xp_tls_sess_idx;

#endif
