// SPDX-License-Identifier: Apache-2.0
/* Stand-ins for the px_node, xp_tls and cv_watch functions that ctl_execute() calls (itself or
 * through ctl_report.c), so that the clang fuzz build of ctl_proto.c links without the data path
 * or the convergence monitors. fuzz_ctl only parses: reaching any of these is a bug. */
#include "cv_watch.h"
#include "fuzz.h"
#include "px_node.h"
#include "xp_tls.h"

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

int px_target_start(struct px_node *n, const char *key, unsigned int nports,
		    const struct px_port_info *ports, uint64_t cap, struct px_portmap *out,
		    char *err, size_t errlen)
{
	UNREACHED("px_target_start");
}

int px_target_stop(struct px_node *n, const char *key, char *err, size_t errlen)
{
	UNREACHED("px_target_stop");
}

int px_source_start(struct px_node *n, const struct px_portmap *t, const char *dir,
		    unsigned int delay_first_ms, uint64_t cap, struct px_port_info *out, char *err,
		    size_t errlen)
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

int px_migration_set_cap(struct px_node *n, const char *key, uint64_t cap, char *err, size_t errlen)
{
	UNREACHED("px_migration_set_cap");
}

void px_node_set_bandwidth(struct px_node *n, uint64_t rate)
{
	UNREACHED("px_node_set_bandwidth");
}

void px_node_info(struct px_node *n, struct px_node_info *out)
{
	UNREACHED("px_node_info");
}

const char *px_shaper_str(enum px_shaper s)
{
	UNREACHED("px_shaper_str");
}

/* px_inspect.c is not linked either: the replies name channel kinds with this (ctl_report.c). */
const char *px_insp_kind_str(enum px_insp_kind k)
{
	UNREACHED("px_insp_kind_str");
}

/* status describes TLS; xp_tls.c would bring OpenSSL into a parse-only fuzzer. */
unsigned int xp_tls_generation(const struct xp_tls *t)
{
	UNREACHED("xp_tls_generation");
}

const char *xp_tls_describe(const struct xp_tls *t)
{
	UNREACHED("xp_tls_describe");
}

const char *xp_tls_allow_list(const struct xp_tls *t, unsigned int i)
{
	UNREACHED("xp_tls_allow_list");
}

bool xp_tls_ktls_enabled(const struct xp_tls *t)
{
	UNREACHED("xp_tls_ktls_enabled");
}

bool xp_tls_kernel_has_ktls(void)
{
	UNREACHED("xp_tls_kernel_has_ktls");
}

int cv_watch_start(struct cv_set *set, const char *key, const struct cv_spec *spec, char *err,
		   size_t errlen)
{
	UNREACHED("cv_watch_start");
}

void cv_watch_stop(struct cv_set *set, const char *key)
{
	UNREACHED("cv_watch_stop");
}

bool cv_watch_report(struct cv_set *set, const char *key, struct cv_report *out)
{
	UNREACHED("cv_watch_report");
}
