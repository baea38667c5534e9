// SPDX-License-Identifier: Apache-2.0
/* libFuzzer target for a takeover offer's moved targets (ctrl/ctl_takeover.h): bytes ->
 * json_tokener -> ctl_takeover_parse_target(). What is accepted is a target vmigd can start: a
 * valid key, distinct ports in range, paths that fit, a rate, TLS said, the secret as written. */
#include <errno.h>
#include <json-c/json.h>
#include <string.h>

#include "fuzz.h"
#include "ctl_json.h"
#include "ctl_takeover.h"
#include "units.h"

static void check_valid(struct json_object *o, const struct ctl_takeover_target *t)
{
	const char *hex = ctl_json_member_cstring(o, "secret");

	FUZZ_CHECK(px_key_valid(t->key));
	FUZZ_CHECK(t->nports >= 1 && t->nports <= PX_PORTS_MAX);
	for (unsigned int i = 0; i < t->nports; i++) {
		FUZZ_CHECK(t->ports[i].id <= PX_PORT_MAX);
		FUZZ_CHECK(t->ports[i].path[0] != '\0');
		FUZZ_CHECK(memchr(t->ports[i].path, '\0', sizeof(t->ports[i].path)) != NULL);
		for (unsigned int j = 0; j < i; j++)
			FUZZ_CHECK(t->ports[i].id != t->ports[j].id);
	}
	FUZZ_CHECK(t->opts.cap <= VM_RATE_MAX);
	FUZZ_CHECK(t->opts.tls == PX_TLS_ON || t->opts.tls == PX_TLS_OFF);
	FUZZ_CHECK(t->opts.has_secret && !t->opts.kubevirt);
	/* The secret is the hex given, byte for byte. */
	FUZZ_CHECK(hex != NULL);
	for (unsigned int i = 0; i < PX_SECRET_LEN; i++) {
		char b[3];

		snprintf(b, sizeof(b), "%02x", t->opts.secret[i]);
		FUZZ_CHECK(memcmp(b, hex + 2 * i, 2) == 0);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct json_tokener *tok = json_tokener_new();
	struct ctl_takeover_target t;
	struct json_object *o;
	char err[256];
	int r;

	FUZZ_CHECK(tok != NULL);
	o = json_tokener_parse_ex(tok, (const char *)data, size);
	json_tokener_free(tok);
	memset(err, 0, sizeof(err));
	/* NULL (not JSON) must be refused too. */
	r = ctl_takeover_parse_target(o, &t, err, sizeof(err));
	if (r == 0) {
		check_valid(o, &t);
	} else {
		FUZZ_CHECK(r == -EPROTO);
		FUZZ_CHECK(err[0] != '\0' && strchr(err, '\n') == NULL);
		FUZZ_CHECK(memchr(err, '\0', sizeof(err)) != NULL);
	}
	json_object_put(o);
	return 0;
}
