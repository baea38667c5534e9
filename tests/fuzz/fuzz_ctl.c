// SPDX-License-Identifier: Apache-2.0
/* libFuzzer target for control requests: ctl_request_parse() on raw bytes (not NUL-terminated),
 * then the error reply for what it refuses; the duplicate-key scanner on the same bytes, and on
 * json-c's own rewrite of them. Nothing is executed against a node. */
#include <arpa/inet.h>
#include <errno.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <string.h>

#include "ctl_json.h"
#include "ctl_proto.h" /* ctl_error_reply() only: nothing is executed */
#include "ctl_request.h"
#include "fuzz.h"
#include "units.h"

static void check_target(const struct ctl_request *req)
{
	const struct px_portmap *t = &req->target;
	unsigned char addr[16];

	FUZZ_CHECK(strcmp(t->key, req->key) == 0);
	FUZZ_CHECK(inet_pton(AF_INET, t->address, addr) == 1 ||
		   inet_pton(AF_INET6, t->address, addr) == 1);
	/* KubeVirt's form: a TCP port per logical port, none shared. */
	if (t->kubevirt)
		FUZZ_CHECK(t->port == 0);
	else
		FUZZ_CHECK(t->port >= 1 && t->port <= 65535);
	FUZZ_CHECK(t->nports >= 1 && t->nports <= PX_PORTS_MAX);
	for (unsigned int i = 0; i < t->nports; i++) {
		FUZZ_CHECK(t->ports[i] <= PX_PORT_MAX);
		FUZZ_CHECK(t->kubevirt ? t->tcp[i] >= 1 && t->tcp[i] <= 65535 : t->tcp[i] == 0);
		for (unsigned int j = 0; j < i; j++)
			FUZZ_CHECK(t->ports[i] != t->ports[j]);
	}
	FUZZ_CHECK(strnlen(req->dir, sizeof(req->dir)) < sizeof(req->dir));
	/* Only an extension's field sets a hook, and the product's parser has none. */
	FUZZ_CHECK(!req->hook.hold_ms);
	FUZZ_CHECK(req->tls == PX_TLS_DEFAULT || req->tls == PX_TLS_ON || req->tls == PX_TLS_OFF);
}

static void check_accepted(const struct ctl_request *req, size_t size)
{
	FUZZ_CHECK(size <= CTL_REQUEST_MAX);
	FUZZ_CHECK(req->bandwidth <= VM_RATE_MAX);
	switch (req->op) {
	case CTL_LIST:
	case CTL_STATUS:
	case CTL_METRICS:
		FUZZ_CHECK(req->bandwidth == 0);
		return;
	case CTL_NODE_BANDWIDTH:
		return;
	case CTL_TAKEOVER:
		FUZZ_CHECK(req->pid > 0);
		FUZZ_CHECK(req->bandwidth == 0);
		return;
	case CTL_BANDWIDTH:
		FUZZ_CHECK(px_key_valid(req->key));
		return;
	case CTL_TARGET_STOP:
	case CTL_SOURCE_STOP:
		FUZZ_CHECK(px_key_valid(req->key));
		FUZZ_CHECK(req->bandwidth == 0);
		return;
	case CTL_TARGET_START:
		FUZZ_CHECK(px_key_valid(req->key));
		FUZZ_CHECK(req->nports >= 1 && req->nports <= PX_PORTS_MAX);
		for (unsigned int i = 0; i < req->nports; i++) {
			FUZZ_CHECK(req->ports[i].id <= PX_PORT_MAX);
			/* A TCP port of its own: KubeVirt mode's, 1 to 65535, each port's own. */
			FUZZ_CHECK(req->ports[i].tcp <= 65535 &&
				   (!req->ports[i].tcp || req->kubevirt));
			for (unsigned int j = 0; j < i; j++)
				FUZZ_CHECK(!req->ports[i].tcp ||
					   req->ports[i].tcp != req->ports[j].tcp);
			FUZZ_CHECK(strnlen(req->ports[i].path, sizeof(req->ports[i].path)) <
				   sizeof(req->ports[i].path));
		}
		return;
	case CTL_SOURCE_START:
		FUZZ_CHECK(px_key_valid(req->key));
		check_target(req);
		return;
	}
	FUZZ_CHECK(!"op out of range");
}

/* The fields each op takes, as doc/interfaces.md lists them (not read from ctl_request.c). */
static const char *const fields_of[][8] = {
	[CTL_TARGET_START] = { "key", "sockets", "bandwidth", "kubevirt", "listen", "tls" },
	[CTL_TARGET_STOP] = { "key" },
	[CTL_SOURCE_START] = { "key", "target", "dir", "bandwidth", "convergence", "tls" },
	[CTL_SOURCE_STOP] = { "key" },
	[CTL_LIST] = { NULL },
	[CTL_STATUS] = { NULL },
	[CTL_BANDWIDTH] = { "key", "bandwidth" },
	[CTL_NODE_BANDWIDTH] = { "bandwidth" },
	[CTL_METRICS] = { NULL },
	[CTL_TAKEOVER] = { "pid", "version" },
};

/* A request accepted has no member its op does not take: a typo is never dropped silently. */
static void check_strict(struct json_object *o, enum ctl_op op)
{
	FUZZ_CHECK((size_t)op < sizeof(fields_of) / sizeof(fields_of[0]));
	json_object_object_foreach (o, name, val) {
		bool known = !strcmp(name, "op");

		(void)val;
		for (unsigned int i = 0; !known && i < 8 && fields_of[op][i]; i++)
			known = !strcmp(name, fields_of[op][i]);
		FUZZ_CHECK(known);
	}
}

/* A string field of the request, taken whole: a NUL inside does not cut it short. */
static void check_string(struct json_object *o, const char *name, const char *got)
{
	struct json_object *v;

	FUZZ_CHECK(json_object_object_get_ex(o, name, &v));
	if (!fuzz_skip("nul"))
		FUZZ_CHECK((size_t)json_object_get_string_len(v) == strlen(got));
	FUZZ_CHECK(strncmp(json_object_get_string(v), got, strlen(got)) == 0);
}

/* What was accepted is what the text says, read again independently of ctl_request.c. */
static void check_exact(const uint8_t *data, size_t size, const struct ctl_request *req)
{
	struct json_tokener *tok = json_tokener_new();
	struct json_object *o, *socks, *bw;
	unsigned int i = 0;

	FUZZ_CHECK(tok != NULL);
	o = json_tokener_parse_ex(tok, (const char *)data, size);
	json_tokener_free(tok);
	FUZZ_CHECK(o != NULL && json_object_is_type(o, json_type_object));
	check_strict(o, req->op);
	if (req->op != CTL_LIST && req->op != CTL_STATUS && req->op != CTL_METRICS &&
	    req->op != CTL_NODE_BANDWIDTH && req->op != CTL_TAKEOVER)
		check_string(o, "key", req->key);
	if (req->op == CTL_TAKEOVER)
		FUZZ_CHECK(json_object_get_int64(json_object_object_get(o, "pid")) == req->pid);
	/* A bandwidth taken is the JSON integer as written; one left out is 0 ... */
	if (req->op == CTL_BANDWIDTH || req->op == CTL_NODE_BANDWIDTH)
		FUZZ_CHECK(json_object_object_get_ex(o, "bandwidth", &bw));
	if (req->op == CTL_TARGET_START || req->op == CTL_SOURCE_START ||
	    req->op == CTL_BANDWIDTH || req->op == CTL_NODE_BANDWIDTH) {
		if (json_object_object_get_ex(o, "bandwidth", &bw)) {
			FUZZ_CHECK(json_object_is_type(bw, json_type_int));
			FUZZ_CHECK(json_object_get_int64(bw) >= 0);
			FUZZ_CHECK(json_object_get_uint64(bw) == req->bandwidth);
		} else {
			/* ... unless the convergence policy gives it (bandwidth or
			 * bandwidthPerMigration): the two are one cap. */
			FUZZ_CHECK(req->bandwidth == 0 ||
				   (req->converge && req->bandwidth == req->conv.policy.bandwidth));
		}
	}
	if (req->op == CTL_SOURCE_START)
		check_string(o, "dir", req->dir);
	if (req->op == CTL_TARGET_START) {
		FUZZ_CHECK(json_object_object_get_ex(o, "sockets", &socks));
		FUZZ_CHECK(json_object_object_length(socks) == (int)req->nports);
		json_object_object_foreach(socks, name, val)
		{
			uint32_t id;

			/* A PORTID is written in digits only: no sign, no white space. */
			if (!fuzz_skip("portid"))
				FUZZ_CHECK(strspn(name, "0123456789") == strlen(name));
			FUZZ_CHECK(px_port_parse(name, &id) == 0 && id == req->ports[i].id);
			if (!fuzz_skip("nul"))
				FUZZ_CHECK((size_t)json_object_get_string_len(val) ==
					   strlen(req->ports[i].path));
			FUZZ_CHECK(strncmp(json_object_get_string(val), req->ports[i].path,
					   sizeof(req->ports[i].path)) == 0);
			i++;
		}
		/* Each TCP port taken is the one "listen" gives that port; the others none. */
		for (i = 0; i < req->nports; i++) {
			struct json_object *l, *v = NULL;

			if (json_object_object_get_ex(o, "listen", &l)) {
				json_object_object_foreach (l, lname, lval) {
					uint32_t n;

					if (px_port_parse(lname, &n) == 0 && n == req->ports[i].id)
						v = lval;
				}
			}
			FUZZ_CHECK(v ? json_object_get_int64(v) == req->ports[i].tcp
				     : req->ports[i].tcp == 0);
		}
	}
	json_object_put(o);
}

/* The reply the daemon sends for a refusal: one JSON object on one line, carrying err. */
static void check_error_reply(const char *err)
{
	char *reply = ctl_error_reply(err, -EINVAL);
	struct json_object *o, *v;
	size_t n;

	FUZZ_CHECK(reply != NULL);
	n = strlen(reply);
	FUZZ_CHECK(n > 0 && reply[n - 1] == '\n' && strchr(reply, '\n') == reply + n - 1);
	o = json_tokener_parse(reply);
	FUZZ_CHECK(o != NULL && json_object_is_type(o, json_type_object));
	FUZZ_CHECK(json_object_object_get_ex(o, "ok", &v) && !json_object_get_boolean(v));
	/* The reply is UTF-8 whatever err holds (a request quoted and cut inside a character);
	 * err comes back as it was where it was UTF-8 already. */
	FUZZ_CHECK(ctl_json_utf8_valid(reply, n));
	FUZZ_CHECK(json_object_object_get_ex(o, "error", &v));
	if (ctl_json_utf8_valid(err, strlen(err)))
		FUZZ_CHECK(strcmp(json_object_get_string(v), err) == 0);
	json_object_put(o);
	free(reply);
}

/*
 * The duplicate-key scanner on any bytes: an answer in range, a key that is a C string. Where
 * json-c parses the bytes, its own serialization (each key once) must scan clean: a key the
 * scanner decodes differently from json-c would show up as a false duplicate here.
 */
static void check_duplicates(const uint8_t *data, size_t size)
{
	struct json_tokener *tok = json_tokener_new();
	struct json_object *o;
	char key[32];
	const char *text;
	int r;

	memset(key, 0x5a, sizeof(key));
	r = ctl_json_duplicate_key((const char *)data, size, key, sizeof(key));
	FUZZ_CHECK(r == 0 || r == 1 || r == -EINVAL);
	if (r == 1)
		FUZZ_CHECK(memchr(key, '\0', sizeof(key)) != NULL);
	FUZZ_CHECK(tok != NULL);
	o = json_tokener_parse_ex(tok, (const char *)data, size);
	/* At a NUL byte json-c stops and may hand back the value it was in (a bare "list" from
	 * inside an object, say) as a success: the product then refuses what is not an object.
	 * Such text is no JSON the scanner must agree on. */
	if (o && !memchr(data, '\0', json_tokener_get_parse_end(tok))) {
		text = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
		FUZZ_CHECK(ctl_json_duplicate_key(text, strlen(text), key, sizeof(key)) == 0);
		/* What json-c accepted, our scanner reads to the end. */
		r = ctl_json_duplicate_key((const char *)data, json_tokener_get_parse_end(tok), key,
					   sizeof(key));
		FUZZ_CHECK(r >= 0);
	}
	json_object_put(o);
	json_tokener_free(tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ctl_request *req = malloc(sizeof(*req)), *canary = malloc(sizeof(*req));
	char err[512];
	int r;

	FUZZ_CHECK(req != NULL && canary != NULL);
	memset(req, 0x5a, sizeof(*req));
	memcpy(canary, req, sizeof(*req));
	memset(err, 0, sizeof(err));
	r = ctl_request_parse((const char *)data, size, req, err, sizeof(err));
	if (r == 0) {
		check_accepted(req, size);
		check_exact(data, size, req);
	} else {
		FUZZ_CHECK(r == -EINVAL);
		/* *req is filled only on success; the reason is one non-empty line. */
		FUZZ_CHECK(memcmp(req, canary, sizeof(*req)) == 0);
		FUZZ_CHECK(memchr(err, '\0', sizeof(err)) != NULL);
		FUZZ_CHECK(err[0] != '\0');
		if (!fuzz_skip("oneline"))
			FUZZ_CHECK(strchr(err, '\n') == NULL);
		check_error_reply(err);
	}
	check_duplicates(data, size);
	free(canary);
	free(req);
	return 0;
}
