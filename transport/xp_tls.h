/* SPDX-License-Identifier: Apache-2.0 */
/* Mutual TLS for the node hop, on OpenSSL 3: a context that holds the current certificate
 * generation (reloadable, never half-applied) and non-blocking sessions over a connected socket,
 * with kTLS when the kernel and OpenSSL provide it and user-space crypto otherwise. */
#ifndef XP_TLS_H
#define XP_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct xp_tls;
struct xp_tls_sess;

/* The KubeVirt handler names, accepted when no allow-list is given (kubevirt-migration-proxy §1.7).
 */
#define XP_TLS_DEFAULT_ALLOW                                                                       \
	"kubevirt.io:system:node:virt-handler,kubevirt.io:system:client:virt-handler,"             \
	"kubevirt.io:system:client:migration"
#define XP_TLS_ALLOW_MAX 16
/* The ALPN protocol two vmigd speak: a source offers it, a target selects it; a stock peer
 * (KubeVirt's Go proxy) neither offers nor selects one, so the link is raw (doc/design.md). */
#define XP_TLS_ALPN "vmigd/1"
/* The same, and the peer checks connection digests at their end (PX_PREAMBLE_F_DIGEST). Both are
 * offered and the newest both know is chosen, so a vmigd before the digests still agrees on 1. */
#define XP_TLS_ALPN2 "vmigd/2"
/* The same, and the peer resumes a connection over a new one when the node hop fails
 * (PX_PREAMBLE_F_RESUMABLE). */
#define XP_TLS_ALPN3 "vmigd/3"
/* What a source offers and a target selects from, newest first (wire format). */
#define XP_TLS_ALPNS "\x07" XP_TLS_ALPN3 "\x07" XP_TLS_ALPN2 "\x07" XP_TLS_ALPN

struct xp_tls_conf {
	const char *cert, *key;		      /* PEM: what this node presents as a server */
	const char *client_cert, *client_key; /* as a client; NULL: the same pair */
	const char *ca;			      /* PEM bundle the peer must chain to */
	/* Comma-separated CN/SAN names a peer certificate must carry; "*": any name. */
	const char *allow;
	/* The same per role, where they differ (KubeVirt checks a client's CN and a server's
	 * apart): what a source's certificate may carry, and a target's. NULL: allow. */
	const char *allow_clients, *allow_servers;
	unsigned int min_version; /* 12 or 13: TLS 1.2 or 1.3 at least; 0: 12 */
	/* TLS 1.2 suites, IANA names (as KubeVirt and Go write them) or OpenSSL's, separated by
	 * commas or colons; NULL: vmigd's ECDHE with AES-GCM or ChaCha20-Poly1305. */
	const char *ciphers12;
	bool resumption; /* client: offer tickets from earlier connections to the same peer */
	bool ktls;	 /* ask OpenSSL for kTLS (used only where the kernel has it) */
};

/* Why a handshake failed, from this side's point of view. */
enum xp_tls_refusal {
	XP_TLS_OK,
	XP_TLS_NO_CERT,	      /* the peer sent no certificate */
	XP_TLS_UNTRUSTED,     /* its chain does not end at our CA */
	XP_TLS_EXPIRED,	      /* a certificate in its chain has expired */
	XP_TLS_NOT_YET_VALID, /* ... or is not valid yet */
	XP_TLS_BAD_PURPOSE,   /* not usable as a TLS client/server certificate */
	XP_TLS_NAME,	      /* signed by our CA, but neither CN nor SAN is in the allow-list */
	XP_TLS_PEER_REFUSED,  /* the peer sent an alert: it refused us */
	XP_TLS_PROTOCOL,      /* no common version/cipher, not TLS at all, truncated */
	XP_TLS_CLOSED,	      /* the peer closed the connection during the handshake */
};
#define XP_TLS_REFUSALS (XP_TLS_CLOSED + 1)

/* "no-certificate", "untrusted-ca", "expired", ...: stable tokens for logs and tests. */
const char *xp_tls_refusal_token(enum xp_tls_refusal r);

/* Loads the first generation. -errno, with one line for the operator in err. */
int xp_tls_new(const struct xp_tls_conf *conf, struct xp_tls **ret, char *err, size_t errlen);
/* Takes NULL. Free every session first: sessions point back to it (callbacks, allow-list). */
void xp_tls_free(struct xp_tls *t);
/*
 * Re-reads the files. On success new sessions use the new pair and CA, sessions already open
 * are untouched, and the client's resumption cache is emptied. On failure nothing changes and err
 * says why: each file must be a regular file of at most VM_FILE_MAX bytes, owned by root or our
 * euid and not writable by group or others, and the keys not readable by them either (forgiven
 * on a read-only mount: xp_tls_warnings()); nothing here blocks on a FIFO or a device. 1 when
 * the files were re-read but are the same, 0 on a new generation.
 */
int xp_tls_reload(struct xp_tls *t, char *err, size_t errlen);
unsigned int xp_tls_generation(const struct xp_tls *t);
/* One line on the current certificate: subject, serial, notAfter. */
const char *xp_tls_describe(const struct xp_tls *t);
/*
 * The i-th name of an allow-list ("*" first when any name is accepted), NULL past the end:
 * servers false, what this node accepts from sources; true, from targets.
 */
const char *xp_tls_allow_list(const struct xp_tls *t, bool servers, unsigned int i);
/* Why the client pair cannot serve a source (a serverAuth-only certificate), or NULL. */
const char *xp_tls_client_problem(const struct xp_tls *t);
/* "TLSv1.2" or "TLSv1.3": the lowest version this node speaks. */
const char *xp_tls_min_version(const struct xp_tls *t);
/* Whether sessions ask OpenSSL for kTLS: configured and the kernel has it. */
bool xp_tls_ktls_enabled(const struct xp_tls *t);
/* What the current generation's files were forgiven (a key readable by others on a read-only
 * mount, as Kubernetes secret volumes are), one line each, for the caller to log; "" if nothing. */
const char *xp_tls_warnings(const struct xp_tls *t);
/* The current generation's notAfter, Unix seconds: the node's certificate, and the earliest of
 * the CA bundle's certificates (0 where there is none). */
void xp_tls_expiry(const struct xp_tls *t, int64_t *node, int64_t *ca);
/* Files to watch for rotation (the ones given in the configuration, duplicates included). */
unsigned int xp_tls_files(const struct xp_tls *t, const char *out[5]);
/* Whether the running kernel offers kTLS (TCP_ULP "tls"); probed once. */
bool xp_tls_kernel_has_ktls(void);

enum xp_tls_want { XP_TLS_WANT_NONE, XP_TLS_WANT_READ, XP_TLS_WANT_WRITE };

/*
 * A session on connected, non-blocking socket fd (not owned). peer names the remote node for
 * the client's resumption cache (its address), NULL on the server.
 */
int xp_tls_sess_new(struct xp_tls *t, int fd, bool server, const char *peer,
		    struct xp_tls_sess **ret);
void xp_tls_sess_free(struct xp_tls_sess *s);
/*
 * One step of the handshake: 0 when done and the peer is authorised, -EAGAIN with *want set,
 * or -EPROTO/-ECONNRESET/... with the reason in xp_tls_sess_refusal() and xp_tls_sess_error().
 */
int xp_tls_handshake(struct xp_tls_sess *s, enum xp_tls_want *want);
enum xp_tls_refusal xp_tls_sess_refusal(const struct xp_tls_sess *s);
/* One line: what failed and on which certificate. */
const char *xp_tls_sess_error(const struct xp_tls_sess *s);
/*
 * Non-blocking I/O after the handshake: bytes moved (> 0), 0 on the peer's close_notify (read),
 * -EAGAIN with *want set, or -errno (-EPROTO for a TLS error, -EPIPE for a stream cut without
 * close_notify). Writes emit full 16 KiB records and may be partial.
 */
ssize_t xp_tls_read(struct xp_tls_sess *s, void *buf, size_t len, enum xp_tls_want *want);
ssize_t xp_tls_write(struct xp_tls_sess *s, const void *buf, size_t len, enum xp_tls_want *want);
/*
 * From now on (after the handshake), records wait in a cap-byte buffer and leave in one
 * write(2) per xp_tls_flush() instead of one per record, and one read(2) takes up to cap bytes
 * of records. Directions kTLS carries keep the socket.
 */
int xp_tls_sess_batch(struct xp_tls_sess *s, size_t cap);
/* Ciphertext waiting in the batch. */
size_t xp_tls_unsent(const struct xp_tls_sess *s);
/* Writes the batch out: 0 when empty, -EAGAIN with *want, or -errno. */
int xp_tls_flush(struct xp_tls_sess *s, enum xp_tls_want *want);
/* Sends close_notify (half-close on TLS 1.3): 0, -EAGAIN with *want, or -errno. With a batch,
 * the alert waits there for xp_tls_flush(). */
int xp_tls_shutdown(struct xp_tls_sess *s, enum xp_tls_want *want);
/* kTLS took the transmit direction: plaintext written to the socket is encrypted by the kernel. */
bool xp_tls_ktls_tx(const struct xp_tls_sess *s);
bool xp_tls_ktls_rx(const struct xp_tls_sess *s);
/* "tls=TLSv1.3 cipher=TLS_AES_128_GCM_SHA256 crypto=user-space resumed=no peer=\"/CN=...\"". */
const char *xp_tls_sess_describe(const struct xp_tls_sess *s);
/* The peer certificate's subject, one line; empty before the handshake is done. */
const char *xp_tls_sess_peer_name(const struct xp_tls_sess *s);
const char *xp_tls_sess_version(const struct xp_tls_sess *s);
/* Which of ours the handshake agreed on: 3 (XP_TLS_ALPN3), 2 (XP_TLS_ALPN2), 1 (XP_TLS_ALPN),
 * 0: none (a stock peer). */
unsigned int xp_tls_sess_alpn(const struct xp_tls_sess *s);
/*
 * A client in TLS 1.3 learns that the server refused its certificate only from the server's
 * next record. Reads records without taking application data: 0 once the server's session
 * ticket or its first data has arrived (at once below TLS 1.3), -EAGAIN with *want, or -errno
 * (then xp_tls_sess_refusal()).
 */
int xp_tls_await_server(struct xp_tls_sess *s, enum xp_tls_want *want);
const char *xp_tls_sess_cipher(const struct xp_tls_sess *s);
bool xp_tls_sess_resumed(const struct xp_tls_sess *s);
/* The latest OpenSSL reason from a failed read/write, for the log line. */
const char *xp_tls_sess_io_error(const struct xp_tls_sess *s);

#endif
