// SPDX-License-Identifier: Apache-2.0
/* A tiny certificate factory on the OpenSSL 3 API; see certfactory.h. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "certfactory.h"

/* Every file made here is 0600 whatever the umask: vmigd refuses a key others can read and any
 * TLS file others can write. */
static FILE *create(const char *path)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	FILE *f;

	if (fd < 0)
		return NULL;
	if (fchmod(fd, 0600) < 0 || !(f = fdopen(fd, "w"))) {
		close(fd);
		return NULL;
	}
	return f;
}

static int fail(const char *what)
{
	unsigned long e = ERR_get_error();
	char line[256] = "";

	if (e)
		ERR_error_string_n(e, line, sizeof(line));
	fprintf(stderr, "certfactory: %s%s%s\n", what, e ? ": " : "", line);
	ERR_clear_error();
	return -1;
}

int cf_tmpdir(char *dir, size_t len)
{
	if (snprintf(dir, len, "/tmp/vmig-certs-XXXXXX") >= (int)len || !mkdtemp(dir)) {
		fprintf(stderr, "certfactory: mkdtemp: %s\n", strerror(errno));
		return -1;
	}
	return 0;
}

void cf_rmdir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;

	if (!d)
		return;
	while ((de = readdir(d))) {
		char path[PATH_MAX];

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		unlink(path);
	}
	closedir(d);
	rmdir(dir);
}

static EVP_PKEY *key_new(void)
{
	EVP_PKEY *k = EVP_EC_gen("P-256");

	if (!k)
		fail("EVP_EC_gen");
	return k;
}

static int write_key(const char *path, EVP_PKEY *k)
{
	FILE *f = create(path);
	int ok;

	if (!f) {
		fprintf(stderr, "certfactory: %s: %s\n", path, strerror(errno));
		return -1;
	}
	ok = PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL);
	if (fclose(f) != 0 || !ok)
		return fail(path);
	return 0;
}

static int write_cert(const char *path, X509 *x)
{
	FILE *f = create(path);
	int ok;

	if (!f) {
		fprintf(stderr, "certfactory: %s: %s\n", path, strerror(errno));
		return -1;
	}
	ok = PEM_write_X509(f, x);
	if (fclose(f) != 0 || !ok)
		return fail(path);
	return 0;
}

static int add_ext(X509 *x, X509 *issuer, int nid, const char *value)
{
	X509V3_CTX ctx;
	X509_EXTENSION *ext;

	X509V3_set_ctx(&ctx, issuer, x, NULL, NULL, 0);
	ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
	if (!ext)
		return fail(value);
	if (!X509_add_ext(x, ext, -1)) {
		X509_EXTENSION_free(ext);
		return fail("X509_add_ext");
	}
	X509_EXTENSION_free(ext);
	return 0;
}

/* A certificate for key with subject cn (none when NULL), valid from now+nb to now+na. */
static X509 *cert_new(EVP_PKEY *key, const char *cn, long nb, long na)
{
	X509 *x = X509_new();
	BIGNUM *bn = BN_new();
	X509_NAME *name;

	if (!x || !bn || !X509_set_version(x, X509_VERSION_3))
		goto fail;
	/* A random 64-bit positive serial: every certificate here is distinct. */
	if (!BN_rand(bn, 64, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) ||
	    !BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)))
		goto fail;
	if (!X509_gmtime_adj(X509_getm_notBefore(x), nb) ||
	    !X509_gmtime_adj(X509_getm_notAfter(x), na ? na : CF_DAY))
		goto fail;
	if (!X509_set_pubkey(x, key))
		goto fail;
	name = X509_get_subject_name(x);
	if (!X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
					(const unsigned char *)"vmigd tests", -1, -1, 0))
		goto fail;
	if (cn && !X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *)cn,
					      -1, -1, 0))
		goto fail;
	BN_free(bn);
	return x;
fail:
	fail("building a certificate");
	BN_free(bn);
	X509_free(x);
	return NULL;
}

int cf_ca_make(struct cf_ca *ca, const char *dir, const char *name, const char *cn)
{
	EVP_PKEY *k = key_new();
	X509 *x = k ? cert_new(k, cn, -CF_DAY, 3650 * CF_DAY) : NULL;

	memset(ca, 0, sizeof(*ca));
	if (!x)
		goto fail;
	if (!X509_set_issuer_name(x, X509_get_subject_name(x)) ||
	    add_ext(x, x, NID_basic_constraints, "critical,CA:TRUE") < 0 ||
	    add_ext(x, x, NID_key_usage, "critical,keyCertSign,cRLSign") < 0 ||
	    add_ext(x, x, NID_subject_key_identifier, "hash") < 0)
		goto fail;
	if (!X509_sign(x, k, EVP_sha256())) {
		fail("signing the CA");
		goto fail;
	}
	snprintf(ca->path, sizeof(ca->path), "%s/%s.pem", dir, name);
	if (write_cert(ca->path, x) < 0)
		goto fail;
	ca->key = k;
	ca->cert = x;
	return 0;
fail:
	X509_free(x);
	EVP_PKEY_free(k);
	return -1;
}

void cf_ca_free(struct cf_ca *ca)
{
	X509_free(ca->cert);
	EVP_PKEY_free(ca->key);
	ca->cert = ca->key = NULL;
}

int cf_leaf_make(const struct cf_ca *ca, const char *dir, const char *name,
		 const struct cf_leaf *opt, char *cert_path, char *key_path)
{
	static const char *const eku[] = {
		[CF_EKU_BOTH] = "serverAuth,clientAuth",
		[CF_EKU_SERVER] = "serverAuth",
		[CF_EKU_CLIENT] = "clientAuth",
	};
	char crt[PATH_MAX], key[PATH_MAX], san[600] = "";
	EVP_PKEY *k = key_new();
	X509 *x = k ? cert_new(k, opt->cn, opt->not_before, opt->not_after) : NULL;
	int r = -1;

	if (!x)
		goto out;
	if (opt->dns)
		snprintf(san, sizeof(san), "DNS:%s", opt->dns);
	if (opt->uri)
		snprintf(san + strlen(san), sizeof(san) - strlen(san), "%sURI:%s",
			 san[0] ? "," : "", opt->uri);
	if (!X509_set_issuer_name(x, X509_get_subject_name(ca->cert)) ||
	    add_ext(x, ca->cert, NID_basic_constraints, "critical,CA:FALSE") < 0 ||
	    add_ext(x, ca->cert, NID_key_usage, "critical,digitalSignature") < 0 ||
	    add_ext(x, ca->cert, NID_subject_key_identifier, "hash") < 0 ||
	    add_ext(x, ca->cert, NID_authority_key_identifier, "keyid:always") < 0 ||
	    (opt->eku != CF_EKU_NONE &&
	     add_ext(x, ca->cert, NID_ext_key_usage, eku[opt->eku]) < 0) ||
	    (san[0] && add_ext(x, ca->cert, NID_subject_alt_name, san) < 0))
		goto out;
	if (!X509_sign(x, ca->key, EVP_sha256())) {
		fail("signing a leaf");
		goto out;
	}
	snprintf(crt, sizeof(crt), "%s/%s.crt", dir, name);
	snprintf(key, sizeof(key), "%s/%s.key", dir, name);
	if (write_cert(crt, x) < 0 || write_key(key, k) < 0)
		goto out;
	if (cert_path)
		snprintf(cert_path, PATH_MAX, "%s", crt);
	if (key_path)
		snprintf(key_path, PATH_MAX, "%s", key);
	r = 0;
out:
	X509_free(x);
	EVP_PKEY_free(k);
	return r;
}

int cf_key_make(const char *dir, const char *name, char *key_path)
{
	EVP_PKEY *k = key_new();
	char key[PATH_MAX];
	int r;

	if (!k)
		return -1;
	snprintf(key, sizeof(key), "%s/%s.key", dir, name);
	r = write_key(key, k);
	EVP_PKEY_free(k);
	if (r == 0 && key_path)
		snprintf(key_path, PATH_MAX, "%s", key);
	return r;
}

static int append(FILE *out, const char *path)
{
	FILE *f = fopen(path, "r");
	char buf[4096];
	size_t n;

	if (!f) {
		fprintf(stderr, "certfactory: %s: %s\n", path, strerror(errno));
		return -1;
	}
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		fwrite(buf, 1, n, out);
	fclose(f);
	return 0;
}

int cf_cat(const char *out, const char *a, const char *b)
{
	FILE *f = create(out);
	int r;

	if (!f) {
		fprintf(stderr, "certfactory: %s: %s\n", out, strerror(errno));
		return -1;
	}
	r = append(f, a);
	if (r == 0 && b)
		r = append(f, b);
	if (fclose(f) != 0)
		r = -1;
	return r;
}

int cf_copy(const char *from, const char *to)
{
	return cf_cat(to, from, NULL);
}

int cf_write(const char *path, const void *buf, size_t len)
{
	FILE *f = create(path);
	size_t n;

	if (!f) {
		fprintf(stderr, "certfactory: %s: %s\n", path, strerror(errno));
		return -1;
	}
	n = fwrite(buf, 1, len, f);
	if (fclose(f) != 0 || n != len)
		return -1;
	return 0;
}
