// SPDX-License-Identifier: Apache-2.0
/* libFuzzer target for the target port map, vmigd's form and KubeVirt's: bytes -> json_tokener
 * -> ctl_portmap_from_json(). What is accepted must be valid by the contract and survive a round
 * trip through the text. */
#include <arpa/inet.h>
#include <errno.h>
#include <json-c/json.h>
#include <string.h>

#include "fuzz.h"
#include "ctl_json.h"
#include "ctl_portmap.h"

static void check_valid(const struct px_portmap *t)
{
	unsigned char addr[16];

	/* KubeVirt's form may come without a key: the request's is the migration's. */
	FUZZ_CHECK(px_key_valid(t->key) || (t->kubevirt && !t->key[0]));
	FUZZ_CHECK(strnlen(t->address, sizeof(t->address)) < sizeof(t->address));
	FUZZ_CHECK(inet_pton(AF_INET, t->address, addr) == 1 ||
		   inet_pton(AF_INET6, t->address, addr) == 1);
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
}

static void check_round_trip(const struct px_portmap *t)
{
	struct json_object *o = ctl_portmap_to_json(t), *back;
	struct px_portmap u;
	char err[256];
	const char *text;

	FUZZ_CHECK(o != NULL);
	text = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
	FUZZ_CHECK(text != NULL && strchr(text, '\n') == NULL);
	back = json_tokener_parse(text);
	FUZZ_CHECK(back != NULL);
	FUZZ_CHECK(ctl_portmap_from_json(back, &u, err, sizeof(err)) == 0);
	FUZZ_CHECK(strcmp(u.key, t->key) == 0);
	FUZZ_CHECK(strcmp(u.address, t->address) == 0);
	FUZZ_CHECK(u.port == t->port);
	FUZZ_CHECK(u.kubevirt == t->kubevirt);
	FUZZ_CHECK(u.nports == t->nports);
	FUZZ_CHECK(memcmp(u.ports, t->ports, t->nports * sizeof(t->ports[0])) == 0);
	FUZZ_CHECK(memcmp(u.tcp, t->tcp, t->nports * sizeof(t->tcp[0])) == 0);
	json_object_put(back);
	json_object_put(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct json_tokener *tok = json_tokener_new();
	struct px_portmap t, canary;
	struct json_object *o;
	char err[256];
	int r;

	FUZZ_CHECK(tok != NULL);
	o = json_tokener_parse_ex(tok, (const char *)data, size);
	json_tokener_free(tok);
	/* NULL (not JSON) is one of the inputs ctl_portmap_from_json must refuse. */
	memset(&t, 0x5a, sizeof(t));
	canary = t;
	memset(err, 0, sizeof(err));
	r = ctl_portmap_from_json(o, &t, err, sizeof(err));
	if (r == 0) {
		struct json_object *v;

		FUZZ_CHECK(json_object_is_type(o, json_type_object));
		/* Strings are taken whole: a NUL inside does not cut them short. */
		if (!fuzz_skip("nul")) {
			FUZZ_CHECK((t.kubevirt && !t.key[0]) ||
				   (json_object_object_get_ex(o, "key", &v) &&
				    (size_t)json_object_get_string_len(v) == strlen(t.key)));
			FUZZ_CHECK(json_object_object_get_ex(
					   o, t.kubevirt ? "targetNodeAddress" : "address", &v) &&
				   (size_t)json_object_get_string_len(v) == strlen(t.address));
		}
		check_valid(&t);
		check_round_trip(&t);
	} else {
		FUZZ_CHECK(r == -EINVAL);
		/* *ret written only on success; the reason is one non-empty line. */
		FUZZ_CHECK(memcmp(&t, &canary, sizeof(t)) == 0);
		FUZZ_CHECK(err[0] != '\0' && strchr(err, '\n') == NULL);
		FUZZ_CHECK(memchr(err, '\0', sizeof(err)) != NULL);
	}
	json_object_put(o);
	return 0;
}
