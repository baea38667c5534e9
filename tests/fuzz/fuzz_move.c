// SPDX-License-Identifier: Apache-2.0
/* libFuzzer target for a live migration moved at a takeover (ctrl/ctl_move.h): bytes ->
 * json_tokener -> ctl_move_from_json() with stand-in fds. What is accepted is in bounds, uses each
 * fd it was given at most once, and comes back the same through ctl_move_to_json(). */
#include <errno.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "ctl_move.h"
#include "units.h"

#define FD_BASE 1000

static void check_fd(int fd, bool *seen)
{
	FUZZ_CHECK(fd >= FD_BASE && fd < FD_BASE + CTL_MOVE_FDS_MAX);
	FUZZ_CHECK(!seen[fd - FD_BASE]);
	seen[fd - FD_BASE] = true;
}

static void check_valid(const struct px_move *mv)
{
	bool seen[CTL_MOVE_FDS_MAX] = { false };

	FUZZ_CHECK(px_key_valid(mv->key));
	FUZZ_CHECK(mv->role == PX_ROLE_SOURCE || mv->role == PX_ROLE_TARGET);
	FUZZ_CHECK(mv->cap <= VM_RATE_MAX);
	FUZZ_CHECK(mv->nports >= 1 && mv->nports <= PX_PORTS_MAX);
	FUZZ_CHECK(mv->nconns <= PX_MOVE_CONNS_MAX);
	if (mv->role == PX_ROLE_SOURCE) {
		check_fd(mv->dirfd, seen);
		FUZZ_CHECK(!mv->target.kubevirt && !strcmp(mv->target.key, mv->key));
	} else {
		FUZZ_CHECK(mv->dirfd == -1);
	}
	for (unsigned int i = 0; i < mv->nports; i++) {
		FUZZ_CHECK(mv->ports[i].id <= PX_PORT_MAX && mv->ports[i].path[0]);
		FUZZ_CHECK(memchr(mv->ports[i].path, 0, sizeof(mv->ports[i].path)) != NULL);
		if (mv->role == PX_ROLE_SOURCE)
			check_fd(mv->ports[i].lfd, seen);
		else
			FUZZ_CHECK(mv->ports[i].lfd == -1);
	}
	for (unsigned int i = 0; i < mv->nconns; i++) {
		const struct px_move_conn *mc = &mv->conns[i];

		check_fd(mc->fd, seen);
		FUZZ_CHECK(mc->st.fd == mc->fd && mc->port <= PX_PORT_MAX);
		for (int d = 0; d < 2; d++) {
			FUZZ_CHECK(mc->st.dg_len[d] <= sizeof(mc->st.dg[d]));
			FUZZ_CHECK((mc->st.dg_len[d] > 0) == mc->digest);
		}
		FUZZ_CHECK(memchr(mc->peer, 0, sizeof(mc->peer)) &&
			   memchr(mc->addr, 0, sizeof(mc->addr)));
	}
}

/* What to_json writes, read back with the fds it listed, is what was read. */
static void check_round_trip(const struct px_move *mv)
{
	int fds[CTL_MOVE_FDS_MAX];
	unsigned int nfds = 0;
	struct json_object *o = ctl_move_to_json(mv, fds, &nfds);
	struct px_move *back = malloc(sizeof(*back));
	char err[256];

	FUZZ_CHECK(o && back);
	FUZZ_CHECK(ctl_move_from_json(o, fds, nfds, back, err, sizeof(err)) == 0);
	FUZZ_CHECK(!strcmp(back->key, mv->key) && back->role == mv->role && back->tls == mv->tls);
	FUZZ_CHECK(back->cap == mv->cap && back->age_ms == mv->age_ms);
	FUZZ_CHECK(back->nports == mv->nports && back->nconns == mv->nconns);
	FUZZ_CHECK(back->dirfd == mv->dirfd);
	FUZZ_CHECK(!memcmp(back->secret, mv->secret, sizeof(mv->secret)));
	for (unsigned int i = 0; i < mv->nports; i++)
		FUZZ_CHECK(back->ports[i].id == mv->ports[i].id &&
			   back->ports[i].lfd == mv->ports[i].lfd &&
			   back->ports[i].next_seq == mv->ports[i].next_seq &&
			   !strcmp(back->ports[i].path, mv->ports[i].path));
	for (unsigned int i = 0; i < mv->nconns; i++) {
		const struct px_move_conn *a = &mv->conns[i], *b = &back->conns[i];

		FUZZ_CHECK(a->port == b->port && a->seq == b->seq && a->fd == b->fd);
		FUZZ_CHECK(a->st.sent == b->st.sent && a->st.have == b->st.have);
		FUZZ_CHECK(!memcmp(a->token, b->token, sizeof(a->token)));
		for (int d = 0; d < 2; d++)
			FUZZ_CHECK(a->st.dg_len[d] == b->st.dg_len[d] &&
				   !memcmp(a->st.dg[d], b->st.dg[d], a->st.dg_len[d]));
	}
	json_object_put(o);
	free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct json_tokener *tok = json_tokener_new();
	struct px_move *mv = malloc(sizeof(*mv));
	int fds[CTL_MOVE_FDS_MAX];
	struct json_object *o;
	char err[256];
	int r;

	FUZZ_CHECK(tok != NULL && mv != NULL);
	for (int i = 0; i < CTL_MOVE_FDS_MAX; i++)
		fds[i] = FD_BASE + i;
	o = json_tokener_parse_ex(tok, (const char *)data, size);
	json_tokener_free(tok);
	memset(err, 0, sizeof(err));
	/* as many fds as the first byte says: a line may come with fewer than it names */
	r = ctl_move_from_json(o, fds, size ? data[0] % (CTL_MOVE_FDS_MAX + 2) : 0, mv, err,
			       sizeof(err));
	if (r == 0) {
		check_valid(mv);
		check_round_trip(mv);
	} else {
		FUZZ_CHECK(r == -EPROTO);
		FUZZ_CHECK(err[0] != '\0' && memchr(err, '\0', sizeof(err)) != NULL);
		FUZZ_CHECK(mv->dirfd == -1);
		for (unsigned int i = 0; i < PX_MOVE_CONNS_MAX; i++)
			FUZZ_CHECK(mv->conns[i].fd == -1);
	}
	json_object_put(o);
	free(mv);
	return 0;
}
