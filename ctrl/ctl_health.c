// SPDX-License-Identifier: Apache-2.0
/* /readyz's judgement (ctl_metrics.h): whether the node is ready for migrations, from its figures
 * alone, so that a test can try every reason. */
#include <stdio.h>

#include "ctl_metrics.h"

int ctl_metrics_ready(const struct px_node_info *ni, bool listening, bool want_dpdk,
		      double now_unix, char *buf, size_t len)
{
	int n = 0;
	size_t k = 0;

#define REASON(...)                                                                                \
	do {                                                                                       \
		n++;                                                                               \
		if (k < len)                                                                       \
			k += snprintf(buf + k, len - k, __VA_ARGS__);                              \
	} while (0)
	if (len)
		buf[0] = '\0';
	if (!listening)
		REASON("node hop: not listening (draining, or handed over to another vmigd)\n");
	if (ni->tls.on && !ni->tls.node_expiry)
		REASON("tls: no node certificate loaded\n");
	else if (ni->tls.on && ni->tls.node_expiry <= now_unix)
		REASON("tls: the node certificate expired at %lld (Unix time)\n",
		       (long long)ni->tls.node_expiry);
	if (ni->tls.on && !ni->tls.ca_expiry)
		REASON("tls: no CA certificate loaded\n");
	else if (ni->tls.on && ni->tls.ca_expiry <= now_unix)
		REASON("tls: a CA certificate expired at %lld (Unix time)\n",
		       (long long)ni->tls.ca_expiry);
	if (want_dpdk && !ni->dpdk.on)
		REASON("dpdk: --dpdk was given, but the DPDK node hop is not running\n");
#undef REASON
	return n;
}
