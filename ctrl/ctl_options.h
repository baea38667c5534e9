/* SPDX-License-Identifier: Apache-2.0 */
/* vmigd's options: one table (ctl_options.c's opts[]) makes getopt's tables, the --config keys
 * and --help. What the options mean together is vmigd.c's business (daemon_configure()). */
#ifndef CTL_OPTIONS_H
#define CTL_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "log.h"
#include "xp_tls.h"

struct ctl_conf_text;

/* What the command line and the config files say; defaults come from opts[]. */
struct ctl_options {
	const char *control;
	const char *listen;
	const char *advertise;
	const char *hop_interface;
	const char *cpus;
	struct xp_tls_conf tls; /* resumption and ktls follow the two flags below */
	bool no_tls;
	bool no_tls_resumption;
	bool no_ktls;
	unsigned long handshake_timeout_ms;
	unsigned long preamble_timeout_ms;
	unsigned long max_unauth;
	unsigned long max_migration_conns;
	unsigned long threads;
	unsigned long order_timeout_ms;
	unsigned long connect_timeout_ms;
	unsigned long drain_timeout_s;
	unsigned long link_down_timeout_s;
	unsigned long resume_timeout_s;
	unsigned long resume_keep;
	unsigned long pipe_size;
	unsigned long slots;
	int copy_path; /* OPT_WORDS values are ints */
	uint64_t node_bandwidth;
	double node_share_pct; /* --node-bandwidth N%: of the hop link's speed; 0: a rate */
	int shaper; /* enum px_shaper */
	bool no_inspect;
	int digest; /* enum px_digest */
	int compress; /* enum px_compress */
	unsigned long compress_level;
	bool keep_cap_at_switchover;
	const char *dpdk_eal;
	const char *dpdk_address;
	unsigned long dpdk_port;
	unsigned long dpdk_buffer;
	const char *metrics;
	enum vm_log_level log_level;
	bool check_only;
	bool takeover;
	int socket_uid, socket_gid;
	struct ctl_conf_text *conf_texts; /* the --config files' text, which options point into */
};

/* The defaults: each option's default that is a value, parsed as if given. 0 or -EINVAL. */
int ctl_options_init(struct ctl_options *o);
/* The config files first, so that the rest of the command line overrides them. 0, 1 when done
 * (--help, --version: exit 0) or -EINVAL after one line on stderr. */
int ctl_options_parse(int argc, char **argv, struct ctl_options *o);
/* Frees the config files' text: o's strings may point into it. */
void ctl_options_done(struct ctl_options *o);

#endif
