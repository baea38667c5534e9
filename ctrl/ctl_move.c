// SPDX-License-Identifier: Apache-2.0
/* What moves at a takeover, as JSON: a target with no connection yet, as the offer lists it; a
 * live migration's line: its record (key, role, TLS, cap, age; a target's secret and source; a
 * source's target map), its ports and connections with their offsets, tokens and digest states
 * in hex, and fds by index. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_json.h"
#include "ctl_move.h"
#include "ctl_portmap.h"
#include "ctl_takeover.h"
#include "units.h"

/* An fd's index in fds, the fd appended. */
static struct json_object *fd_index(int fd, int *fds, unsigned int *nfds)
{
	if (fd < 0 || *nfds >= CTL_MOVE_FDS_MAX)
		return json_object_new_int(-1);
	fds[*nfds] = fd;
	return json_object_new_int((int)(*nfds)++);
}

static void add(struct json_object *o, const char *k, struct json_object *v)
{
	json_object_object_add(o, k, v);
}

static struct json_object *conn_json(const struct px_move_conn *mc, int *fds, unsigned int *nfds)
{
	struct json_object *c = json_object_new_object(), *dg = json_object_new_array();

	add(c, "port", json_object_new_int64(mc->port));
	add(c, "seq", json_object_new_int64(mc->seq));
	add(c, "fd", fd_index(mc->fd, fds, nfds));
	add(c, "token", ctl_json_new_hex(mc->token, sizeof(mc->token)));
	add(c, "digest", json_object_new_boolean(mc->digest));
	add(c, "peer", json_object_new_string(mc->peer));
	add(c, "addr", json_object_new_string(mc->addr));
	add(c, "sent", json_object_new_int64((int64_t)mc->st.sent));
	add(c, "have", json_object_new_int64((int64_t)mc->st.have));
	for (int d = 0; d < 2; d++)
		json_object_array_add(dg, ctl_json_new_hex(mc->st.dg[d], mc->st.dg_len[d]));
	add(c, "digests", dg);
	return c;
}

struct json_object *ctl_move_to_json(const struct px_move *mv, int *fds, unsigned int *nfds)
{
	struct json_object *o = json_object_new_object(), *ports, *conns;

	*nfds = 0;
	if (!o)
		return NULL;
	add(o, "op", json_object_new_string("move"));
	add(o, "key", json_object_new_string(mv->key));
	add(o, "role", json_object_new_string(px_role_str(mv->role)));
	add(o, "tls", json_object_new_boolean(mv->tls));
	add(o, "bandwidth", json_object_new_int64((int64_t)mv->cap));
	add(o, "age_ms", json_object_new_int64((int64_t)mv->age_ms));
	if (mv->role == PX_ROLE_TARGET) {
		add(o, "secret", ctl_json_new_hex(mv->secret, sizeof(mv->secret)));
		add(o, "peer_addr", json_object_new_string(mv->peer_addr));
		add(o, "peer_name", json_object_new_string(mv->peer_name));
	} else {
		add(o, "target", ctl_portmap_to_json(&mv->target));
		add(o, "dir_fd", fd_index(mv->dirfd, fds, nfds));
	}
	ports = json_object_new_array();
	for (unsigned int i = 0; i < mv->nports; i++) {
		struct json_object *p = json_object_new_object();

		add(p, "id", json_object_new_int64(mv->ports[i].id));
		add(p, "path", json_object_new_string(mv->ports[i].path));
		add(p, "next", json_object_new_int64(mv->ports[i].next_seq));
		if (mv->role == PX_ROLE_SOURCE)
			add(p, "fd", fd_index(mv->ports[i].lfd, fds, nfds));
		json_object_array_add(ports, p);
	}
	add(o, "ports", ports);
	conns = json_object_new_array();
	for (unsigned int i = 0; i < mv->nconns; i++)
		json_object_array_add(conns, conn_json(&mv->conns[i], fds, nfds));
	add(o, "conns", conns);
	return o;
}

/* ---- parsing ---- */

struct parse {
	const int *fds;
	unsigned int nfds;
	bool used[CTL_MOVE_FDS_MAX];
	char *err;
	size_t errlen;
};

static int fail(struct parse *ps, const char *what)
{
	snprintf(ps->err, ps->errlen, "the move %s", what);
	return -EPROTO;
}

static int get_u64(struct json_object *o, const char *k, uint64_t max, uint64_t *ret)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, k, &v) || !json_object_is_type(v, json_type_int) ||
	    json_object_get_int64(v) < 0 || (uint64_t)json_object_get_int64(v) > max)
		return -EPROTO;
	*ret = (uint64_t)json_object_get_int64(v);
	return 0;
}

static int get_bool(struct json_object *o, const char *k, bool *ret)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, k, &v) || !json_object_is_type(v, json_type_boolean))
		return -EPROTO;
	*ret = json_object_get_boolean(v);
	return 0;
}

static int get_str(struct json_object *o, const char *k, char *buf, size_t len)
{
	const char *s = ctl_json_member_cstring(o, k);

	if (!s || strlen(s) >= len)
		return -EPROTO;
	strcpy(buf, s);
	return 0;
}

/* Lower-case hex, at most max bytes: *got says how many. */
static int get_hex(struct json_object *v, uint8_t *buf, size_t max, size_t *got)
{
	const char *s = ctl_json_cstring(v);
	int n = s ? ctl_json_hex_decode(s, true, buf, max) : -EPROTO;

	if (n < 0)
		return -EPROTO;
	*got = (size_t)n;
	return 0;
}

static int get_hex_exact(struct json_object *o, const char *k, uint8_t *buf, size_t len)
{
	struct json_object *v;
	size_t got;

	if (!json_object_object_get_ex(o, k, &v) || get_hex(v, buf, len, &got) < 0 || got != len)
		return -EPROTO;
	return 0;
}

/* An fd index: -1 (none) or one of fds not used before. */
static int get_fd(struct parse *ps, struct json_object *o, const char *k, int *ret)
{
	uint64_t i;
	struct json_object *v;

	if (json_object_object_get_ex(o, k, &v) && json_object_is_type(v, json_type_int) &&
	    json_object_get_int64(v) == -1) {
		*ret = -1;
		return 0;
	}
	if (get_u64(o, k, CTL_MOVE_FDS_MAX - 1, &i) < 0 || i >= ps->nfds || ps->used[i])
		return -EPROTO;
	ps->used[i] = true;
	*ret = ps->fds[i];
	return 0;
}

static int parse_conn(struct parse *ps, struct json_object *c, struct px_move_conn *mc)
{
	struct json_object *dg;
	uint64_t v;

	if (!json_object_is_type(c, json_type_object))
		return fail(ps, "has a connection that is not an object");
	if (get_u64(c, "port", PX_PORT_MAX, &v) < 0)
		return fail(ps, "has a connection without its port");
	mc->port = (uint32_t)v;
	if (get_u64(c, "seq", UINT32_MAX, &v) < 0)
		return fail(ps, "has a connection without its number");
	mc->seq = (uint32_t)v;
	if (get_fd(ps, c, "fd", &mc->fd) < 0 || mc->fd < 0)
		return fail(ps, "has a connection without its socket");
	if (get_hex_exact(c, "token", mc->token, sizeof(mc->token)) < 0)
		return fail(ps, "has a connection without its token");
	if (get_bool(c, "digest", &mc->digest) < 0 ||
	    get_str(c, "peer", mc->peer, sizeof(mc->peer)) ||
	    get_str(c, "addr", mc->addr, sizeof(mc->addr)))
		return fail(ps, "has a connection without its digest flag, peer or address");
	if (get_u64(c, "sent", INT64_MAX, &mc->st.sent) < 0 ||
	    get_u64(c, "have", INT64_MAX, &mc->st.have) < 0)
		return fail(ps, "has a connection without its offsets");
	if (!json_object_object_get_ex(c, "digests", &dg) ||
	    !json_object_is_type(dg, json_type_array) || json_object_array_length(dg) != 2)
		return fail(ps, "has a connection without its two digest states");
	for (int d = 0; d < 2; d++)
		if (get_hex(json_object_array_get_idx(dg, d), mc->st.dg[d], sizeof(mc->st.dg[d]),
			    &mc->st.dg_len[d]) < 0 ||
		    (mc->st.dg_len[d] > 0) != mc->digest)
			return fail(ps,
				    "has a digest state that is not hex, too long, or not as its "
				    "digest flag says");
	mc->st.fd = mc->fd;
	return 0;
}

static int parse_ports(struct parse *ps, struct json_object *o, struct px_move *mv)
{
	struct json_object *ports;
	size_t n;

	if (!json_object_object_get_ex(o, "ports", &ports) ||
	    !json_object_is_type(ports, json_type_array) ||
	    (n = json_object_array_length(ports)) == 0 || n > PX_PORTS_MAX)
		return fail(ps, "has no ports, or too many");
	mv->nports = (unsigned int)n;
	for (size_t i = 0; i < n; i++) {
		struct json_object *p = json_object_array_get_idx(ports, i);
		uint64_t v;

		if (!json_object_is_type(p, json_type_object) || get_u64(p, "id", PX_PORT_MAX, &v))
			return fail(ps, "has a port without its id");
		mv->ports[i].id = (uint32_t)v;
		if (get_str(p, "path", mv->ports[i].path, sizeof(mv->ports[i].path)) < 0 ||
		    !mv->ports[i].path[0])
			return fail(ps, "has a port without its path, or one too long");
		if (get_u64(p, "next", UINT32_MAX, &v) < 0)
			return fail(ps, "has a port without its next number");
		mv->ports[i].next_seq = (uint32_t)v;
		mv->ports[i].lfd = -1;
		if (mv->role == PX_ROLE_SOURCE &&
		    (get_fd(ps, p, "fd", &mv->ports[i].lfd) < 0 || mv->ports[i].lfd < 0))
			return fail(ps, "has a source port without its listener");
	}
	return 0;
}

static int parse_role(struct parse *ps, struct json_object *o, struct px_move *mv)
{
	struct json_object *t;

	if (mv->role == PX_ROLE_TARGET) {
		if (get_hex_exact(o, "secret", mv->secret, sizeof(mv->secret)) < 0)
			return fail(ps, "has a target without its secret");
		if (get_str(o, "peer_addr", mv->peer_addr, sizeof(mv->peer_addr)) < 0 ||
		    get_str(o, "peer_name", mv->peer_name, sizeof(mv->peer_name)) < 0)
			return fail(ps, "has a target without its source's address and name");
		return 0;
	}
	if (!json_object_object_get_ex(o, "target", &t) ||
	    ctl_portmap_from_json(t, &mv->target, ps->err, ps->errlen) < 0)
		return fail(ps, "has a source without a valid target map");
	if (mv->target.kubevirt || strcmp(mv->target.key, mv->key))
		return fail(ps, "has a source whose target map is KubeVirt's or another key's");
	if (get_fd(ps, o, "dir_fd", &mv->dirfd) < 0 || mv->dirfd < 0)
		return fail(ps, "has a source without its socket directory");
	return 0;
}

static int parse(struct parse *ps, struct json_object *o, struct px_move *mv)
{
	struct json_object *conns;
	const char *role;
	uint64_t v;
	size_t n;
	int r;

	if (!json_object_is_type(o, json_type_object))
		return fail(ps, "is not a JSON object");
	if (get_str(o, "key", mv->key, sizeof(mv->key)) < 0 || !px_key_valid(mv->key))
		return fail(ps, "has no valid key");
	role = ctl_json_member_cstring(o, "role");
	if (!role || (strcmp(role, "source") && strcmp(role, "target")))
		return fail(ps, "names no role");
	mv->role = strcmp(role, "source") ? PX_ROLE_TARGET : PX_ROLE_SOURCE;
	if (get_bool(o, "tls", &mv->tls) < 0 ||
	    get_u64(o, "bandwidth", VM_RATE_MAX, &mv->cap) < 0 ||
	    get_u64(o, "age_ms", INT64_MAX, &v) < 0)
		return fail(ps, "lacks its TLS, bandwidth or age");
	mv->age_ms = v;
	r = parse_role(ps, o, mv);
	if (r == 0)
		r = parse_ports(ps, o, mv);
	if (r < 0)
		return r;
	if (!json_object_object_get_ex(o, "conns", &conns) ||
	    !json_object_is_type(conns, json_type_array) ||
	    (n = json_object_array_length(conns)) > PX_MOVE_CONNS_MAX)
		return fail(ps, "has no connection list, or one too long");
	for (size_t i = 0; i < n; i++) {
		r = parse_conn(ps, json_object_array_get_idx(conns, i), &mv->conns[i]);
		if (r < 0)
			return r;
		mv->nconns++;
	}
	return 0;
}

int ctl_move_from_json(struct json_object *o, const int *fds, unsigned int nfds, struct px_move *mv,
		       char *err, size_t errlen)
{
	struct parse ps = {
		.fds = fds, .nfds = nfds > CTL_MOVE_FDS_MAX ? 0 : nfds, .err = err, .errlen = errlen
	};
	int r;

	memset(mv, 0, sizeof(*mv));
	mv->dirfd = -1;
	for (unsigned int i = 0; i < PX_PORTS_MAX; i++)
		mv->ports[i].lfd = -1;
	r = o ? parse(&ps, o, mv) : fail(&ps, "is not JSON");
	if (r == 0 && nfds > CTL_MOVE_FDS_MAX)
		r = fail(&ps, "came with too many fds");
	if (r < 0) {
		mv->dirfd = -1;
		for (unsigned int i = 0; i < PX_PORTS_MAX; i++)
			mv->ports[i].lfd = -1;
		for (unsigned int i = 0; i < PX_MOVE_CONNS_MAX; i++)
			mv->conns[i].fd = mv->conns[i].st.fd = -1;
	}
	return r;
}

/* ---- a target with no connection yet, in the offer ---- */

int ctl_takeover_parse_target(struct json_object *m, struct ctl_takeover_target *out, char *err,
			      size_t errlen)
{
	struct json_object *socks, *v;
	const char *key = ctl_json_member_cstring(m, "key");
	const char *hex = ctl_json_member_cstring(m, "secret");
	uint32_t ids[PX_PORTS_MAX];
	size_t n;

	memset(out, 0, sizeof(*out));
	out->opts.has_secret = true;
	if (!json_object_is_type(m, json_type_object) || !key || !px_key_valid(key)) {
		snprintf(err, errlen, "the offer has a target without a valid key");
		return -EPROTO;
	}
	strcpy(out->key, key);
	if (!hex || strlen(hex) != 2 * PX_SECRET_LEN) {
		snprintf(err, errlen, "target %s: the offer has no secret of %d hex digits", key,
			 2 * PX_SECRET_LEN);
		return -EPROTO;
	}
	if (ctl_json_hex_decode(hex, true, out->opts.secret, PX_SECRET_LEN) < 0) {
		snprintf(err, errlen, "target %s: the offer's secret is not lower-case hex", key);
		return -EPROTO;
	}
	if (!json_object_object_get_ex(m, "sockets", &socks) ||
	    !json_object_is_type(socks, json_type_array) ||
	    (n = json_object_array_length(socks)) == 0 || n > PX_PORTS_MAX) {
		snprintf(err, errlen, "target %s: the offer has no sockets, or over %d", key,
			 PX_PORTS_MAX);
		return -EPROTO;
	}
	for (size_t i = 0; i < n; i++) {
		struct json_object *p = json_object_array_get_idx(socks, i), *id;
		const char *path = ctl_json_member_cstring(p, "path");

		if (!json_object_object_get_ex(p, "id", &id) ||
		    !json_object_is_type(id, json_type_int) || json_object_get_int64(id) < 0 ||
		    json_object_get_int64(id) > PX_PORT_MAX || !path || !path[0] ||
		    strlen(path) >= sizeof(out->ports[i].path)) {
			snprintf(err, errlen, "target %s: the offer describes socket %zu badly",
				 key, i);
			return -EPROTO;
		}
		out->ports[i].id = (uint32_t)json_object_get_int64(id);
		ids[i] = out->ports[i].id;
		strcpy(out->ports[i].path, path);
	}
	out->nports = (unsigned int)n;
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < i; j++)
			if (ids[i] == ids[j]) {
				snprintf(err, errlen, "target %s: the offer has port %u twice", key,
					 ids[i]);
				return -EPROTO;
			}
	v = json_object_object_get(m, "bandwidth");
	if (v && (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0 ||
		  json_object_get_uint64(v) > VM_RATE_MAX)) {
		snprintf(err, errlen, "target %s: the offer's bandwidth is not a rate", key);
		return -EPROTO;
	}
	out->opts.cap = v ? json_object_get_uint64(v) : 0;
	v = json_object_object_get(m, "tls");
	if (!v || !json_object_is_type(v, json_type_boolean)) {
		snprintf(err, errlen, "target %s: the offer does not say whether it is TLS", key);
		return -EPROTO;
	}
	out->opts.tls = json_object_get_boolean(v) ? PX_TLS_ON : PX_TLS_OFF;
	return 0;
}
