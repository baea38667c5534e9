/* SPDX-License-Identifier: Apache-2.0 */
/* A tiny certificate factory for the TLS tests and the TLS fuzz target, on the OpenSSL 3 API:
 * EC P-256 keys, CAs and leaf certificates built in memory and written as PEM into a private
 * temporary directory. Every function returns 0 or -1 with a line on stderr. */
#ifndef VM_CERTFACTORY_H
#define VM_CERTFACTORY_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#define CF_DAY (24L * 3600)

struct cf_ca {
	void *key;  /* EVP_PKEY */
	void *cert; /* X509 */
	char path[PATH_MAX];
};

enum cf_eku {
	CF_EKU_BOTH,   /* serverAuth, clientAuth: what a node presents on both sides */
	CF_EKU_SERVER, /* serverAuth only */
	CF_EKU_CLIENT, /* clientAuth only */
	CF_EKU_NONE,   /* no extendedKeyUsage extension at all */
};

struct cf_leaf {
	const char *cn;	 /* NULL: no CN */
	const char *dns; /* a DNS SAN, or NULL */
	const char *uri; /* a URI SAN, or NULL */
	long not_before; /* seconds from now; usually negative */
	long not_after;	 /* seconds from now; 0 means one day */
	enum cf_eku eku;
};

/* Makes a fresh directory /tmp/vmig-certs-XXXXXX (23 bytes with the NUL). */
int cf_tmpdir(char *dir, size_t len);
/* Removes the directory and the regular files in it. */
void cf_rmdir(const char *dir);
/* A self-signed CA called cn, written to dir/name.pem. */
int cf_ca_make(struct cf_ca *ca, const char *dir, const char *name, const char *cn);
void cf_ca_free(struct cf_ca *ca);
/* A leaf signed by ca with a fresh key: dir/name.crt and dir/name.key (paths returned when the
 * pointers are not NULL; each must hold PATH_MAX bytes). */
int cf_leaf_make(const struct cf_ca *ca, const char *dir, const char *name,
		 const struct cf_leaf *opt, char *cert_path, char *key_path);
/* A fresh key alone, dir/name.key. */
int cf_key_make(const char *dir, const char *name, char *key_path);
/* Concatenates files into out (a CA bundle). */
int cf_cat(const char *out, const char *a, const char *b);
/* Copies a file. */
int cf_copy(const char *from, const char *to);
/* Writes len bytes to path (replacing it). */
int cf_write(const char *path, const void *buf, size_t len);

#endif
