// SPDX-License-Identifier: Apache-2.0
/* Stand-ins for the px_node functions that ctl_execute() calls, so that the clang fuzz build of
 * ctl_proto.c links without the data path. fuzz_ctl only parses: reaching any of these is a bug. */
#include "fuzz.h"
#include "px_node.h"

#define UNREACHED(what)                                                                            \
	do {                                                                                       \
		fprintf(stderr, "px_node_stub: %s called from a parse-only fuzzer\n", what);       \
		abort();                                                                           \
	} while (0)

const char *px_node_listen_str(const struct px_node *n)
{
	UNREACHED("px_node_listen_str");
}

const char *px_node_advertise(const struct px_node *n)
{
	UNREACHED("px_node_advertise");
}

unsigned int px_node_threads(const struct px_node *n)
{
	UNREACHED("px_node_threads");
}

const char *px_node_data_path(const struct px_node *n)
{
	UNREACHED("px_node_data_path");
}

unsigned int px_node_migrations(const struct px_node *n)
{
	UNREACHED("px_node_migrations");
}

unsigned int px_node_active_conns(const struct px_node *n)
{
	UNREACHED("px_node_active_conns");
}

int px_target_start(struct px_node *n, const char *key, unsigned int nports,
		    const struct px_port_info *ports, struct px_target_info *out, char *err,
		    size_t errlen)
{
	UNREACHED("px_target_start");
}

int px_target_stop(struct px_node *n, const char *key, char *err, size_t errlen)
{
	UNREACHED("px_target_stop");
}

int px_source_start(struct px_node *n, const struct px_target_info *t, const char *dir,
		    unsigned int delay_first_ms, struct px_port_info *out, char *err, size_t errlen)
{
	UNREACHED("px_source_start");
}

int px_source_stop(struct px_node *n, const char *key, char *err, size_t errlen)
{
	UNREACHED("px_source_stop");
}

void px_node_foreach(struct px_node *n, px_migration_fn fn, void *arg)
{
	UNREACHED("px_node_foreach");
}
