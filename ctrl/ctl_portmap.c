// SPDX-License-Identifier: Apache-2.0
/* The port map <-> JSON. The source validates all of it before creating any socket, so a
 * bad or truncated paste fails cleanly at `source start`, not mid-migration. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_json.h"
#include "ctl_portmap.h"
#include "xp_sock.h"

/* "secret": PX_SECRET_LEN bytes as lower-case hex, where the map has one. */
static void add_secret(struct json_object *o, const struct px_portmap *t)
{
	if (!t->has_secret)
		return;
	json_object_object_add(o, "secret", ctl_json_new_hex(t->secret, PX_SECRET_LEN));
}

/* "dpdk": the target's DPDK node hop, "IPV4:UDP", where it has one. */
static void add_dpdk(struct json_object *o, const struct px_portmap *t)
{
	char s[32];

	if (!t->dpdk.ip)
		return;
	px_dpdk_format(&t->dpdk, s, sizeof(s));
	json_object_object_add(o, "dpdk", json_object_new_string(s));
}

/* "digest": the target checks connection digests, with the one algorithm there is so far. */
static void add_digest(struct json_object *o, const struct px_portmap *t)
{
	if (t->digest)
		json_object_object_add(o, "digest", json_object_new_string("xxh3"));
}

/* "resume": the target resumes connections whose node hop failed. */
static void add_resume(struct json_object *o, const struct px_portmap *t)
{
	if (t->resume)
		json_object_object_add(o, "resume", json_object_new_boolean(true));
	if (t->resume && t->resume_dpdk)
		json_object_object_add(o, "resume_dpdk", json_object_new_boolean(true));
	/* compression rides the resumable frames */
	if (t->resume && t->compress)
		json_object_object_add(o, "compress", json_object_new_string("zstd"));
	if (t->resume && t->compress && t->resume_dpdk && t->compress_dpdk)
		json_object_object_add(o, "compress_dpdk", json_object_new_boolean(true));
}

/* The optional "resume" and "resume_dpdk" members into t, "compress" and "compress_dpdk": 0, or
 * -EINVAL when one is not a boolean (a string). */
static int get_resume(struct json_object *o, struct px_portmap *t)
{
	struct json_object *v;

	if (json_object_object_get_ex(o, "resume", &v)) {
		if (!json_object_is_type(v, json_type_boolean))
			return -EINVAL;
		t->resume = json_object_get_boolean(v);
	}
	if (json_object_object_get_ex(o, "resume_dpdk", &v)) {
		if (!json_object_is_type(v, json_type_boolean))
			return -EINVAL;
		t->resume_dpdk = json_object_get_boolean(v);
	}
	/* another algorithm than ours: none */
	if (json_object_object_get_ex(o, "compress", &v)) {
		if (!json_object_is_type(v, json_type_string))
			return -EINVAL;
		t->compress = !strcmp(json_object_get_string(v), "zstd");
	}
	if (json_object_object_get_ex(o, "compress_dpdk", &v)) {
		if (!json_object_is_type(v, json_type_boolean))
			return -EINVAL;
		t->compress_dpdk = json_object_get_boolean(v);
	}
	return 0;
}

/* An optional "digest" member into t: 0 (another algorithm than ours: no check), or -EINVAL
 * when it is not a string. */
static int get_digest(struct json_object *o, struct px_portmap *t)
{
	struct json_object *v;
	const char *s;

	if (!json_object_object_get_ex(o, "digest", &v))
		return 0;
	s = ctl_json_cstring(v);
	if (!s)
		return -EINVAL;
	t->digest = strcmp(s, "xxh3") == 0;
	return 0;
}

/* An optional "dpdk" member into t: 0, or -EINVAL when present and not IPV4:UDP. */
static int get_dpdk(struct json_object *o, struct px_portmap *t)
{
	unsigned int a, b, c, d, port;
	struct json_object *v;
	const char *s;
	char tail;

	if (!json_object_object_get_ex(o, "dpdk", &v))
		return 0;
	s = ctl_json_cstring(v);
	if (!s || sscanf(s, "%3u.%3u.%3u.%3u:%5u%c", &a, &b, &c, &d, &port, &tail) != 5 ||
	    a > 255 || b > 255 || c > 255 || d > 255 || !port || port > 65535 || !(a | b | c | d))
		return -EINVAL;
	t->dpdk.ip = a << 24 | b << 16 | c << 8 | d;
	t->dpdk.port = (uint16_t)port;
	return 0;
}

/* An optional "secret" member into t: 0, or -EINVAL when present and not 32 hex digits. */
static int get_secret(struct json_object *o, struct px_portmap *t)
{
	struct json_object *v;
	const char *s;

	if (!json_object_object_get_ex(o, "secret", &v))
		return 0;
	s = ctl_json_cstring(v);
	if (!s || strlen(s) != 2 * PX_SECRET_LEN ||
	    ctl_json_hex_decode(s, false, t->secret, PX_SECRET_LEN) < 0)
		return -EINVAL;
	t->has_secret = true;
	return 0;
}

/* KubeVirt's fields, as virt-handler publishes them in the VMI's migration state. */
static struct json_object *kubevirt_to_json(const struct px_portmap *t)
{
	struct json_object *o = json_object_new_object(), *map = json_object_new_object();

	if (!o || !map) {
		json_object_put(o);
		json_object_put(map);
		return NULL;
	}
	json_object_object_add(o, "targetNodeAddress", json_object_new_string(t->address));
	for (unsigned int i = 0; i < t->nports; i++) {
		char tcp[16];

		snprintf(tcp, sizeof(tcp), "%u", t->tcp[i]);
		json_object_object_add(map, tcp, json_object_new_int(t->ports[i]));
	}
	json_object_object_add(o, "targetDirectMigrationNodePorts", map);
	if (t->key[0])
		json_object_object_add(o, "key", json_object_new_string(t->key));
	json_object_object_add(o, "tls", json_object_new_boolean(t->tls));
	add_secret(o, t);
	add_dpdk(o, t);
	add_digest(o, t);
	add_resume(o, t);
	return o;
}

struct json_object *ctl_portmap_to_json(const struct px_portmap *t)
{
	struct json_object *o, *ports;

	if (t->kubevirt)
		return kubevirt_to_json(t);
	o = json_object_new_object();
	ports = json_object_new_array();
	if (!o || !ports) {
		json_object_put(o);
		json_object_put(ports);
		return NULL;
	}
	json_object_object_add(o, "version", json_object_new_int(CTL_PORTMAP_VERSION));
	json_object_object_add(o, "key", json_object_new_string(t->key));
	json_object_object_add(o, "address", json_object_new_string(t->address));
	json_object_object_add(o, "port", json_object_new_int(t->port));
	for (unsigned int i = 0; i < t->nports; i++)
		json_object_array_add(ports, json_object_new_int(t->ports[i]));
	json_object_object_add(o, "ports", ports);
	add_secret(o, t);
	add_dpdk(o, t);
	add_digest(o, t);
	add_resume(o, t);
	return o;
}

static int fail(char *err, size_t errlen, const char *msg)
{
	snprintf(err, errlen, "invalid target JSON: %s", msg);
	return -EINVAL;
}

static int get_uint(struct json_object *o, const char *name, unsigned int max, unsigned int *ret)
{
	struct json_object *v;
	int64_t n;

	if (!json_object_object_get_ex(o, name, &v) || !json_object_is_type(v, json_type_int))
		return -EINVAL;
	n = json_object_get_int64(v);
	if (n < 0 || n > max)
		return -EINVAL;
	*ret = n;
	return 0;
}

/*
 * {"targetNodeAddress": A, "targetDirectMigrationNodePorts": {"<tcp port>": logical, ...}}, as a
 * stock virt-handler (or vmigd --kubevirt) publishes it; "key" may come along. Other fields are
 * KubeVirt's to add, and are left alone.
 */
static int kubevirt_from_json(struct json_object *o, struct px_portmap *ret, char *err,
			      size_t errlen)
{
	struct px_portmap t;
	struct json_object *map, *v;
	struct xp_addr a;
	const char *s;

	memset(&t, 0, sizeof(t));
	t.kubevirt = true;
	s = ctl_json_member_cstring(o, "targetNodeAddress");
	if (!s)
		return fail(err, errlen, "missing \"targetNodeAddress\"");
	if (strlen(s) >= sizeof(t.address) || xp_addr_from_host(s, 1, &a) < 0)
		return fail(err, errlen, "\"targetNodeAddress\" is not a numeric IP address");
	strcpy(t.address, s);
	if (json_object_object_get_ex(o, "key", &v)) {
		s = ctl_json_cstring(v);
		if (!s || !px_key_valid(s))
			return fail(err, errlen, "bad \"key\"");
		strcpy(t.key, s);
	}
	if (get_secret(o, &t) < 0)
		return fail(err, errlen, "\"secret\" must be 32 hex digits");
	if (get_dpdk(o, &t) < 0)
		return fail(err, errlen, "\"dpdk\" must be IPV4:UDP");
	if (get_digest(o, &t) < 0)
		return fail(err, errlen, "\"digest\" must be a string");
	if (get_resume(o, &t) < 0)
		return fail(err, errlen, "\"resume\" must be true or false");
	json_object_object_get_ex(o, "targetDirectMigrationNodePorts", &map);
	if (!json_object_is_type(map, json_type_object))
		return fail(err, errlen, "\"targetDirectMigrationNodePorts\" must be an object");
	if (json_object_object_length(map) == 0 || json_object_object_length(map) > PX_PORTS_MAX)
		return fail(err, errlen,
			    "\"targetDirectMigrationNodePorts\" must map 1 to 8 TCP ports");
	json_object_object_foreach (map, tcp, logical) {
		uint32_t port, id;
		int64_t n;

		if (px_port_parse(tcp, &port) < 0 || port == 0)
			return fail(err, errlen,
				    "a key of \"targetDirectMigrationNodePorts\" is not a TCP port");
		if (!json_object_is_type(logical, json_type_int))
			return fail(err, errlen, "a logical port is not an integer");
		n = json_object_get_int64(logical);
		if (n < 0 || n > PX_PORT_MAX)
			return fail(err, errlen, "a logical port is outside 0..65535");
		id = (uint32_t)n;
		if (!px_kubevirt_port(id)) {
			snprintf(err, errlen,
				 "invalid target JSON: KubeVirt's map names logical port %u (TCP port "
				 "%u); it has only 0 (libvirt), 49152 (QEMU) and 49153 (NBD)",
				 id, port);
			return -EINVAL;
		}
		for (unsigned int j = 0; j < t.nports; j++) {
			if (t.ports[j] == id)
				return fail(err, errlen, "a logical port is listed twice");
			/* "4" and "04" are one TCP port: two logical ports cannot share it. */
			if (t.tcp[j] == port)
				return fail(err, errlen, "a TCP port is listed twice");
		}
		t.ports[t.nports] = id;
		t.tcp[t.nports++] = port;
	}
	*ret = t;
	return 0;
}

int ctl_portmap_from_json(struct json_object *o, struct px_portmap *ret, char *err, size_t errlen)
{
	struct px_portmap t;
	struct json_object *ports;
	struct xp_addr a;
	unsigned int version;
	const char *s;

	memset(&t, 0, sizeof(t));
	if (!o || !json_object_is_type(o, json_type_object))
		return fail(err, errlen, "not a JSON object");
	if (json_object_object_get_ex(o, "targetDirectMigrationNodePorts", NULL))
		return kubevirt_from_json(o, ret, err, errlen);
	if (get_uint(o, "version", 65535, &version) < 0)
		return fail(err, errlen, "missing or bad \"version\"");
	if (version != CTL_PORTMAP_VERSION)
		return fail(err, errlen, "unsupported \"version\" (this vmigd speaks 1)");
	s = ctl_json_member_cstring(o, "key");
	if (!s || !px_key_valid(s))
		return fail(err, errlen, "missing or bad \"key\"");
	strcpy(t.key, s);
	s = ctl_json_member_cstring(o, "address");
	if (!s)
		return fail(err, errlen, "missing \"address\"");
	if (strlen(s) >= sizeof(t.address) || xp_addr_from_host(s, 1, &a) < 0)
		return fail(err, errlen, "\"address\" is not a numeric IP address");
	strcpy(t.address, s);
	if (get_uint(o, "port", 65535, &t.port) < 0 || t.port == 0)
		return fail(err, errlen, "missing or bad \"port\"");
	if (get_secret(o, &t) < 0)
		return fail(err, errlen, "\"secret\" must be 32 hex digits");
	if (get_dpdk(o, &t) < 0)
		return fail(err, errlen, "\"dpdk\" must be IPV4:UDP");
	if (get_digest(o, &t) < 0)
		return fail(err, errlen, "\"digest\" must be a string");
	if (get_resume(o, &t) < 0)
		return fail(err, errlen, "\"resume\" must be true or false");
	if (!json_object_object_get_ex(o, "ports", &ports) ||
	    !json_object_is_type(ports, json_type_array))
		return fail(err, errlen, "missing \"ports\" array");
	t.nports = json_object_array_length(ports);
	if (t.nports == 0 || t.nports > PX_PORTS_MAX)
		return fail(err, errlen, "\"ports\" must list 1 to 8 logical ports");
	for (unsigned int i = 0; i < t.nports; i++) {
		struct json_object *p = json_object_array_get_idx(ports, i);
		int64_t n;

		if (!json_object_is_type(p, json_type_int))
			return fail(err, errlen, "\"ports\" holds a non-integer");
		n = json_object_get_int64(p);
		if (n < 0 || n > PX_PORT_MAX)
			return fail(err, errlen, "a logical port is outside 0..65535");
		t.ports[i] = n;
		for (unsigned int j = 0; j < i; j++)
			if (t.ports[j] == t.ports[i])
				return fail(err, errlen, "a logical port is listed twice");
	}
	*ret = t;
	return 0;
}
