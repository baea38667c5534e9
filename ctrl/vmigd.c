// SPDX-License-Identifier: Apache-2.0
/* vmigd(8): the per-node migration transport daemon. Every option is one entry of opts[], which
 * makes getopt's tables, the --config keys and --help; main turns the options into the node's
 * configuration, starts it, and runs the control loop until SIGTERM/SIGINT drains it. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl_hop.h"
#include "ctl_metrics.h"
#include "ctl_nic.h"
#include "ctl_notify.h"
#include "ctl_server.h"
#include "ctl_takeover.h"
#include "ctl_test.h"
#include "file.h"
#include "log.h"
#include "px_node.h"
#include "units.h"
#include "util.h"
#include "vmigd-config.h"
#include "xp_dpdk.h"
#include "xp_fwatch.h"
#include "xp_tls.h"

/* After the last change to a certificate file, wait this long for its siblings to follow. */
#define TLS_SETTLE_MS 300
/* --help: lines wrap at HELP_WIDTH; an option's help starts at HELP_COL. */
#define HELP_WIDTH 100
#define HELP_COL   32
/* getopt values of options without a short letter: OPT_VAL_BASE + their index in opts[]. */
#define OPT_VAL_BASE 256

/* A --config file's text. Options point into it, so it lives as long as the options. */
struct conf_text {
	struct conf_text *next;
	char *text;
};

/* What the command line and the config files say; defaults come from opts[]. */
struct options {
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
	unsigned long pipe_size;
	unsigned long slots;
	int copy_path; /* OPT_WORDS values are ints */
	uint64_t node_bandwidth;
	double node_share_pct; /* --node-bandwidth N%: of the hop link's speed; 0: a rate */
	int shaper; /* enum px_shaper */
	bool no_inspect;
	int digest; /* enum px_digest */
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
	struct conf_text *conf_texts;
};

struct daemon {
	struct xp_loop *loop;
	struct xp_tls *tls;
	struct xp_fwatch *tls_watch;
	struct px_node *node;
	struct ctl_server *ctl;
	struct ctl_metrics_server *metrics;
	struct cv_set *conv;
	struct ctl_nic *nic; /* NULL where netlink cannot be had */
	uint64_t node_bandwidth; /* --node-bandwidth N%: what it came to */
	char cpus[320];		 /* --cpus: the workers' CPUs, as status shows them; "" for any */
	struct ctl_takeover *takeover;
	struct xp_watch *sigw;
	int sfd;
	struct ctl_daemon_info info;
	unsigned int drain_timeout_s;
	bool draining;
	/* From the options, for start-up. */
	struct px_config pc;
	struct xp_addr metrics_addr;
	struct ctl_takeover_offer offer; /* --takeover: what the old vmigd handed over */
	/* SIGUSR2: this binary (at start) and the arguments to run it with for a takeover */
	char exe[PATH_MAX];
	char **takeover_argv;
};

/* How an option's argument is parsed and where it goes (struct options at off). */
enum opt_kind {
	OPT_STR,   /* const char *, pointing into argv or a config file's text */
	OPT_FLAG,  /* bool, true when given; no argument */
	OPT_ULONG, /* unsigned long from min to max */
	OPT_WORDS, /* int: the value of the word given, one of words[] */
	OPT_FUNC,  /* parse() does it all; an argument when arg is set */
};

enum {
	OPT_DEF_TEXT = 1 << 0, /* def says what happens without the option: not parsed at start */
	OPT_CLI_ONLY = 1 << 1, /* not a config file key */
	OPT_EARLY = 1 << 2,    /* applied in a first pass, before the rest of the command line */
	OPT_SYN_REQ = 1 << 3,  /* synopsis: opens a required group, ( ... ), not [ ... ] */
	OPT_SYN_JOIN = 1 << 4, /* synopsis: inside the previous entry's group */
	OPT_SYN_ALT = 1 << 5,  /* synopsis: the previous group's alternative, " | " */
};

struct opt_word {
	const char *word;
	int value;
};

struct opt;
/* 0, -EINVAL after one line on stderr, or 1: done, exit 0 (--help, --version). where: "" on the
 * command line, "FILE:LINE: " in a config file. */
typedef int (*opt_parse_fn)(const struct opt *op, const char *arg, const char *where,
			    struct options *o);

struct opt {
	const char *name; /* long option and config key; NULL: a short option only */
	char letter;	  /* short option; 0: none */
	enum opt_kind kind;
	unsigned int flags;
	const char *arg; /* argument as shown; NULL: none, or for OPT_WORDS the words */
	const char *def; /* default as shown; NULL: none. Parsed at start unless OPT_DEF_TEXT */
	const char *help;
	size_t off;
	unsigned long min, max;	      /* OPT_ULONG */
	const struct opt_word *words; /* OPT_WORDS, up to a NULL word */
	opt_parse_fn parse;	      /* OPT_FUNC */
};

#define OPT_AT(field)	     .off = offsetof(struct options, field)
#define STR(field)	     .kind = OPT_STR, OPT_AT(field)
#define FLAG(field)	     .kind = OPT_FLAG, OPT_AT(field)
#define ULONG(field, lo, hi) .kind = OPT_ULONG, OPT_AT(field), .min = (lo), .max = (hi)
#define WORDS(field, list)   .kind = OPT_WORDS, OPT_AT(field), .words = (list)
#define FUNC(fn)	     .kind = OPT_FUNC, .parse = (fn)
#define NEEDS_TLS	     "required unless --no-tls"

static const struct opt_word data_paths[] = { { "splice", 0 }, { "copy", 1 }, { NULL, 0 } };
static const struct opt_word digests[] = {
	{ "auto", PX_DIGEST_AUTO },
	{ "on", PX_DIGEST_ON },
	{ "off", PX_DIGEST_OFF },
	{ NULL, 0 },
};
static const struct opt_word shapers[] = {
	{ "bucket", PX_SHAPE_BUCKET },
	{ "pacing", PX_SHAPE_PACING },
	{ NULL, 0 },
};

static int opt_log_level(const struct opt *op, const char *arg, const char *where,
			 struct options *o);
static int opt_socket_owner(const struct opt *op, const char *arg, const char *where,
			    struct options *o);
static int opt_tls_version(const struct opt *op, const char *arg, const char *where,
			   struct options *o);
static int opt_node_bandwidth(const struct opt *op, const char *arg, const char *where,
			      struct options *o);
static int opt_config(const struct opt *op, const char *arg, const char *where, struct options *o);
static int opt_help(const struct opt *op, const char *arg, const char *where, struct options *o);
static int opt_version(const struct opt *op, const char *arg, const char *where, struct options *o);

/* Every option, in the order of --help and vmigd(8). */
static const struct opt opts[] = {
	{ "control", 'c', STR(control), .arg = "PATH", .def = VMIGD_DEFAULT_CONTROL,
	  .help = "control socket; a second daemon on the same path refuses to start" },
	{ "listen", 'l', STR(listen), .arg = "ADDR:PORT", .def = "[::]:0",
	  .help = "node-hop TCP listener, and the address of KubeVirt-mode per-port listeners; "
		  "port 0 picks a free port; [::] is dual stack, 0.0.0.0 where IPv6 is off" },
	{ "advertise", 'a', STR(advertise), .arg = "ADDR", .flags = OPT_DEF_TEXT,
	  .def = "the listen address, or the first non-loopback address when listening on a "
		 "wildcard",
	  .help = "address that target start prints for peers to connect to" },
	{ "hop-interface", 0, STR(hop_interface), .arg = "NAME", .flags = OPT_DEF_TEXT,
	  .def = "none: --listen decides",
	  .help = "carry the node hop on this interface: listen on and advertise its address (its "
		  "first IPv4, else its first global IPv6); --listen then gives the port, or one "
		  "of "
		  "its addresses" },
	{ "cpus", 0, STR(cpus), .arg = "LIST|nic", .flags = OPT_DEF_TEXT, .def = "any",
	  .help = "CPUs of the data-path workers, a list (0-3,8), or nic: those of the NUMA node "
		  "of "
		  "the interface that holds the advertised address; each worker's ring and buffers "
		  "then come from that node" },
	{ "tls-cert", 0, STR(tls.cert), .arg = "FILE", .flags = OPT_DEF_TEXT | OPT_SYN_REQ,
	  .def = NEEDS_TLS,
	  .help = "PEM certificate (chain) this node presents; reloaded on change or SIGHUP" },
	{ "tls-key", 0, STR(tls.key), .arg = "FILE", .flags = OPT_DEF_TEXT | OPT_SYN_JOIN,
	  .def = NEEDS_TLS, .help = "PEM key of --tls-cert" },
	{ "tls-ca", 0, STR(tls.ca), .arg = "FILE", .flags = OPT_DEF_TEXT | OPT_SYN_JOIN,
	  .def = NEEDS_TLS, .help = "PEM CA bundle a peer's certificate must chain to" },
	{ "no-tls", 0, FLAG(no_tls), .flags = OPT_DEF_TEXT | OPT_SYN_ALT, .def = "TLS on",
	  .help = "carry the node hop in plain text, with a warning in the log" },
	{ "tls-client-cert", 0, STR(tls.client_cert), .arg = "FILE", .flags = OPT_DEF_TEXT,
	  .def = "the server pair", .help = "PEM certificate this node presents as a source" },
	{ "tls-client-key", 0, STR(tls.client_key), .arg = "FILE",
	  .flags = OPT_DEF_TEXT | OPT_SYN_JOIN, .def = "the server pair",
	  .help = "PEM key of --tls-client-cert" },
	{ "tls-allow", 0, STR(tls.allow), .arg = "NAMES", .def = XP_TLS_DEFAULT_ALLOW,
	  .help = "comma-separated CN or SAN names a peer certificate must carry, at most 16; "
		  "* accepts any the CA signed" },
	{ "tls-allow-client", 0, STR(tls.allow_clients), .arg = "NAMES", .flags = OPT_DEF_TEXT,
	  .def = "--tls-allow",
	  .help = "the names a source's certificate may carry, where they differ from a target's "
		  "(KubeVirt: kubevirt.io:system:client:migration)" },
	{ "tls-allow-server", 0, STR(tls.allow_servers), .arg = "NAMES", .flags = OPT_DEF_TEXT,
	  .def = "--tls-allow",
	  .help = "the names a target's certificate may carry, where they differ from a source's "
		  "(KubeVirt: kubevirt.io:system:node:virt-handler)" },
	{ "tls-min-version", 0, FUNC(opt_tls_version), .arg = "1.2|1.3", .def = "1.2",
	  .help = "the lowest TLS version spoken (KubeVirt's tlsConfiguration minTLSVersion: "
		  "VersionTLS12 or VersionTLS13)" },
	{ "tls-ciphers", 0, STR(tls.ciphers12), .arg = "SUITES", .flags = OPT_DEF_TEXT,
	  .def = "ECDHE with AES-GCM or ChaCha20-Poly1305",
	  .help = "TLS 1.2 suites, comma-separated, IANA names as KubeVirt's tlsConfiguration "
		  "ciphers (TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256) or OpenSSL's" },
	{ "no-tls-resumption", 0, FLAG(no_tls_resumption), .flags = OPT_DEF_TEXT,
	  .def = "resumption on",
	  .help = "do not offer session tickets from earlier connections to the same peer" },
	{ "no-ktls", 0, FLAG(no_ktls), .flags = OPT_DEF_TEXT, .def = "kTLS where the kernel has it",
	  .help = "never ask OpenSSL for kernel TLS" },
	{ "handshake-timeout", 0, ULONG(handshake_timeout_ms, 100, 600000), .arg = "MS",
	  .def = "10000",
	  .help = "a node-hop connection must finish its TLS handshake within this" },
	{ "preamble-timeout", 0, ULONG(preamble_timeout_ms, 100, 600000), .arg = "MS",
	  .def = "5000", .help = "... and then deliver its preamble within this" },
	{ "max-unauthenticated", 0, ULONG(max_unauth, 1, 65536), .arg = "N", .def = "64",
	  .help = "node-hop connections before their preamble, at most, per listener; at the "
		  "bound the oldest of the address holding most is closed" },
	{ "max-migration-conns", 0, ULONG(max_migration_conns, 1, 65536), .arg = "N", .def = "64",
	  .help = "connections of one migration at once, per role; one more fails the migration" },
	{ "threads", 't', ULONG(threads, 1, 64), .arg = "N", .flags = OPT_DEF_TEXT,
	  .def = "online CPUs, at most 4", .help = "data-path worker threads, one io_uring each" },
	{ "order-timeout", 0, ULONG(order_timeout_ms, 100, 3600000), .arg = "MS", .def = "10000",
	  .help = "how long a target waits for a missing connection of a sequence before it fails "
		  "the migration" },
	{ "connect-timeout", 0, ULONG(connect_timeout_ms, 100, 3600000), .arg = "MS",
	  .def = "10000", .help = "bound on a node-hop connect and on sending the preamble" },
	{ "drain-timeout", 0, ULONG(drain_timeout_s, 0, 86400), .arg = "S", .def = "300",
	  .help = "on SIGTERM or SIGINT, how long connections in flight may run before they are "
		  "cut" },
	{ "link-down-timeout", 0, ULONG(link_down_timeout_s, 0, 86400), .arg = "S", .def = "30",
	  .help = "a migration whose node hop's link has been down this long fails now, not when "
		  "TCP gives up (before QEMU's switchover only; 0: never); convergence waits while "
		  "it is down" },
	{ "pipe-size", 0, ULONG(pipe_size, 4096, 64 << 20), .arg = "BYTES", .def = "1048576",
	  .help = "splice pipe size per direction per connection" },
	{ "max-connections", 0, ULONG(slots, 1, 1 << 20), .arg = "N", .def = "1024",
	  .help = "connections carried at once over all workers; slots are allocated at start-up" },
	{ "data-path", 0, WORDS(copy_path, data_paths), .def = "splice",
	  .help = "copy: read and write through a user buffer, kept to measure against splice" },
	{ "node-bandwidth", 0, FUNC(opt_node_bandwidth), .arg = "RATE|N%", .def = "none",
	  .help = "cap on what this node sends, all migrations together (vmigd(8): RATE UNITS); "
		  "N% of the link speed of the interface that holds the advertised address" },
	{ "shaper", 0, WORDS(shaper, shapers), .def = "bucket",
	  .help = "how caps are enforced: token buckets in the data path, or SO_MAX_PACING_RATE "
		  "on each node-hop socket" },
	{ "no-inspect", 0, FLAG(no_inspect), .flags = OPT_DEF_TEXT, .def = "inspection on",
	  .help = "do not read the QEMU stream as it passes (pages, passes, dirty rate)" },
	{ "digest", 0, WORDS(digest, digests), .def = "auto",
	  .help = "which connections to a vmigd peer get their bytes digested and compared at "
		  "their end (outcome=corrupt on a mismatch): auto, those whose bytes pass through "
		  "user space anyway (TLS, DPDK, --data-path copy); on, all (the splice path then "
		  "reads each byte once more); off, none" },
	{ "keep-cap-at-switchover", 0, FLAG(keep_cap_at_switchover), .flags = OPT_DEF_TEXT,
	  .def = "lifted", .help = "keep a migration's cap after its VM stopped for switchover" },
	{ "dpdk", 0, STR(dpdk_eal), .arg = "EAL_ARGS", .flags = OPT_DEF_TEXT,
	  .def = "off: the kernel path only",
	  .help = "carry the node hop over this DPDK port (an SR-IOV VF, or a vdev) with vmigd's "
		  "own "
		  "reliable transport, sealed with keys from each connection's TLS 1.3 session; "
		  "used "
		  "when the peer has one too (builds with -Ddpdk=enabled)" },
	{ "dpdk-address", 0, STR(dpdk_address), .arg = "ADDR/PREFIX", .flags = OPT_DEF_TEXT,
	  .def = "required with --dpdk", .help = "this node's IPv4 address on the DPDK port" },
	{ "dpdk-port", 0, ULONG(dpdk_port, 1, 65535), .arg = "UDP", .def = "4791",
	  .help = "the DPDK node hop's UDP port (both nodes)" },
	{ "dpdk-buffer", 0, ULONG(dpdk_buffer, 65536, 256 << 20), .arg = "BYTES", .def = "2097152",
	  .help = "DPDK node hop buffer per connection and direction (the window)" },
	{ "socket-owner", 0, FUNC(opt_socket_owner), .arg = "UID[:GID]", .def = "107:107",
	  .help = "owner of a source's sockets (mode 0660) and of migrationproxy/ (0750): "
		  "KubeVirt's qemu user; -1 leaves them to the daemon. The group's members can "
		  "feed a source socket: gid 107 is qemu in a KubeVirt pod but often kvm on a "
		  "Debian node; where that group has members, give 107:-1 or a group of its "
		  "own" },
	{ "metrics", 0, STR(metrics), .arg = "ADDR:PORT", .flags = OPT_DEF_TEXT, .def = "off",
	  .help = "serve Prometheus metrics at http://ADDR:PORT/metrics; port 0 picks a free "
		  "port" },
	{ "log-level", 0, FUNC(opt_log_level), .arg = "error|warning|info|debug", .def = "info",
	  .help = "the least severe messages logged" },
	{ "config", 0, FUNC(opt_config), .arg = "FILE", .flags = OPT_CLI_ONLY | OPT_EARLY,
	  .help = "read options from FILE first: option value lines, long names without --, "
		  "# comments; the command line wins" },
	{ "takeover", 0, FLAG(takeover), .flags = OPT_CLI_ONLY,
	  .help = "take over from the vmigd running on --control: its listeners and the targets "
		  "with no connection yet come here, it carries its migrations in flight to their "
		  "end (bounded by its --drain-timeout) and exits; if this one fails first, "
		  "the old one carries on" },
	{ NULL, 'n', FLAG(check_only), .help = "check the configuration and exit" },
	{ "help", 'h', FUNC(opt_help), .flags = OPT_CLI_ONLY, .help = "print this help and exit" },
	{ "version", 'V', FUNC(opt_version), .flags = OPT_CLI_ONLY,
	  .help = "print the version and exit" },
};

static bool opt_takes_arg(const struct opt *op)
{
	return op->arg || op->words;
}

/* The argument as shown: arg, or the words joined by '|'. */
static const char *opt_arg(const struct opt *op, char *buf, size_t len)
{
	size_t n = 0;

	if (!op->words)
		return op->arg ? op->arg : "";
	buf[0] = '\0';
	for (const struct opt_word *w = op->words; w->word && n < len; w++)
		n += snprintf(buf + n, len - n, "%s%s", w == op->words ? "" : "|", w->word);
	return buf;
}

/* "--name ARG", or "-n" for a short option only. */
static char *opt_usage(const struct opt *op, char *buf, size_t len)
{
	char arg[64];

	if (!op->name)
		snprintf(buf, len, "-%c", op->letter);
	else
		snprintf(buf, len, "--%s%s%s", op->name, opt_takes_arg(op) ? " " : "",
			 opt_arg(op, arg, sizeof(arg)));
	return buf;
}

static const struct opt *opt_by_name(const char *name)
{
	for (size_t i = 0; i < ARRAY_SIZE(opts); i++)
		if (opts[i].name && strcmp(opts[i].name, name) == 0)
			return &opts[i];
	return NULL;
}

static int opt_val(const struct opt *op)
{
	return op->letter ? op->letter : OPT_VAL_BASE + (int)(op - opts);
}

static const struct opt *opt_by_val(int val)
{
	for (size_t i = 0; i < ARRAY_SIZE(opts); i++)
		if (opt_val(&opts[i]) == val)
			return &opts[i];
	return NULL;
}

/* Prints n bytes of word from column col, after a space when sep, or on a new line indented to
 * indent when it would pass HELP_WIDTH there. Returns the column after it. */
static int put_word(FILE *f, int col, int indent, const char *word, int n, bool sep)
{
	if (col > indent && col + sep + n > HELP_WIDTH) {
		col = fprintf(f, "\n%*s", indent, "") - 1;
		sep = false;
	}
	return col + fprintf(f, "%s%.*s", sep ? " " : "", n, word);
}

/* Prints text a word at a time with put_word(); the first word gets a space only when first_sep. */
static int put_words(FILE *f, int col, int indent, const char *text, bool first_sep)
{
	for (bool sep = first_sep; *text; sep = true) {
		int n = strcspn(text, " ");

		col = put_word(f, col, indent, text, n, sep);
		text += n + strspn(text + n, " ");
	}
	return col;
}

/* The synopsis, one group per option, [--name ARG], or joined as OPT_SYN_* say. */
static void put_synopsis(FILE *f)
{
	static const char lead[] = "usage: vmigd";
	char group[256], one[96];
	const char *sep;
	size_t glen = 0;
	int col = fprintf(f, "%s", lead);

	for (size_t i = 0; i <= ARRAY_SIZE(opts); i++) {
		const struct opt *op = i < ARRAY_SIZE(opts) ? &opts[i] : NULL;

		if (glen && (!op || !(op->flags & (OPT_SYN_JOIN | OPT_SYN_ALT)))) {
			snprintf(group + glen, sizeof(group) - glen, "%c",
				 group[0] == '(' ? ')' : ']');
			col = put_word(f, col, sizeof(lead), group, strlen(group), true);
			glen = 0;
		}
		if (!op)
			break;
		if (!glen)
			sep = op->flags & OPT_SYN_REQ ? "(" : "[";
		else
			sep = op->flags & OPT_SYN_ALT ? " | " : " ";
		snprintf(group + glen, sizeof(group) - glen, "%s%s", sep,
			 opt_usage(op, one, sizeof(one)));
		glen = strlen(group);
	}
	fputc('\n', f);
}

/* The synopsis; with full, one line per option: "  -c, --name ARG   help [MIN..MAX] (default: X)",
 * wrapped at HELP_WIDTH onto lines indented to HELP_COL. tests/meta/test_options.py reads it. */
static void usage(FILE *f, bool full)
{
	put_synopsis(f);
	fprintf(f, "Carries QEMU live-migration connections between nodes. See vmigd(8).\n");
	if (!full)
		return;
	fprintf(f, "\n");
	for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
		const struct opt *op = &opts[i];
		char text[512], name[96], range[48] = "";
		int col;

		if (op->name)
			col = fprintf(f, "  %c%c%c %s", op->letter ? '-' : ' ',
				      op->letter ? op->letter : ' ', op->letter ? ',' : ' ',
				      opt_usage(op, name, sizeof(name)));
		else
			col = fprintf(f, "  %s", opt_usage(op, name, sizeof(name)));
		col += fprintf(f, "%*s", col < HELP_COL - 2 ? HELP_COL - col : 2, "");
		if (op->kind == OPT_ULONG)
			snprintf(range, sizeof(range), " [%lu..%lu]", op->min, op->max);
		snprintf(text, sizeof(text), "%s%s%s%s%s", op->help, range,
			 op->def ? " (default: " : "", op->def ? op->def : "", op->def ? ")" : "");
		put_words(f, col, HELP_COL, text, false);
		fputc('\n', f);
	}
}

static int parse_ulong(const struct opt *op, const char *s, const char *where, unsigned long *ret)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || !*s || *end || *s == '-' || v < op->min || v > op->max) {
		fprintf(stderr, "vmigd: %s--%s: expected a number from %lu to %lu, got \"%s\"\n",
			where, op->name, op->min, op->max, s);
		return -EINVAL;
	}
	*ret = v;
	return 0;
}

static int parse_word(const struct opt *op, const char *s, const char *where, int *ret)
{
	const struct opt_word *w;

	for (w = op->words; w->word; w++) {
		if (strcmp(s, w->word) == 0) {
			*ret = w->value;
			return 0;
		}
	}
	fprintf(stderr, "vmigd: %s--%s: use ", where, op->name);
	for (w = op->words; w->word; w++)
		fprintf(stderr, "%s%s", w == op->words ? "" : w[1].word ? ", " : " or ", w->word);
	fprintf(stderr, "\n");
	return -EINVAL;
}

/* One option with its argument (NULL when it takes none) into o. */
static int opt_apply(const struct opt *op, const char *arg, const char *where, struct options *o)
{
	void *at = (char *)o + op->off;

	switch (op->kind) {
	case OPT_STR:
		*(const char **)at = arg;
		return 0;
	case OPT_FLAG:
		*(bool *)at = true;
		return 0;
	case OPT_ULONG:
		return parse_ulong(op, arg, where, at);
	case OPT_WORDS:
		return parse_word(op, arg, where, at);
	case OPT_FUNC:
		return op->parse(op, arg, where, o);
	}
	return -EINVAL;
}

static int opt_log_level(const struct opt *op, const char *arg, const char *where,
			 struct options *o)
{
	if (vm_log_level_parse(arg, &o->log_level) == 0)
		return 0;
	fprintf(stderr, "vmigd: %s--%s: use error, warning, info or debug\n", where, op->name);
	return -EINVAL;
}

static int parse_id(const char *s, int *ret)
{
	char *end;
	long v;

	if (strcmp(s, "-1") == 0) {
		*ret = -1;
		return 0;
	}
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < 0 || v > 0x7fffffff)
		return -EINVAL;
	*ret = (int)v;
	return 0;
}

/* UID[:GID], numeric (a sidecar's passwd need not know KubeVirt's qemu user); GID: UID. */
static int opt_socket_owner(const struct opt *op, const char *arg, const char *where,
			    struct options *o)
{
	char uid[24];
	const char *colon = strchr(arg, ':');
	size_t n = colon ? (size_t)(colon - arg) : strlen(arg);

	if (n < sizeof(uid)) {
		memcpy(uid, arg, n);
		uid[n] = '\0';
		if (parse_id(uid, &o->socket_uid) == 0 &&
		    parse_id(colon ? colon + 1 : uid, &o->socket_gid) == 0)
			return 0;
	}
	fprintf(stderr, "vmigd: %s--%s: expected UID[:GID] (numbers, or -1), got \"%s\"\n", where,
		op->name, arg);
	return -EINVAL;
}

static int opt_node_bandwidth(const struct opt *op, const char *arg, const char *where,
			      struct options *o)
{
	size_t n = strlen(arg);
	char *end;

	o->node_share_pct = 0;
	if (n > 1 && arg[n - 1] == '%') {
		errno = 0;
		o->node_share_pct = strtod(arg, &end);
		if (!errno && end == arg + n - 1 && o->node_share_pct > 0 &&
		    o->node_share_pct <= 100)
			return 0;
		fprintf(stderr, "vmigd: %s--%s: a share of the link is 1%% to 100%%, got \"%s\"\n",
			where, op->name, arg);
		return -EINVAL;
	}
	if (vm_parse_rate(arg, &o->node_bandwidth) == 0)
		return 0;
	fprintf(stderr,
		"vmigd: %s--%s: expected a rate such as 1Gbit, 500MB, 64Mi or none (vmigd(8): "
		"RATE UNITS), or a share of the link such as 80%%, got \"%s\"\n",
		where, op->name, arg);
	return -EINVAL;
}

static int opt_tls_version(const struct opt *op, const char *arg, const char *where,
			   struct options *o)
{
	if (!strcmp(arg, "1.2") || !strcmp(arg, "VersionTLS12"))
		o->tls.min_version = 12;
	else if (!strcmp(arg, "1.3") || !strcmp(arg, "VersionTLS13"))
		o->tls.min_version = 13;
	else {
		fprintf(stderr,
			"vmigd: %s--%s: use 1.2 or 1.3 (or VersionTLS12, VersionTLS13); vmigd speaks "
			"no older TLS, got \"%s\"\n",
			where, op->name, arg);
		return -EINVAL;
	}
	return 0;
}

static int opt_help(const struct opt *op, const char *arg, const char *where, struct options *o)
{
	usage(stdout, true);
	return 1;
}

static int opt_version(const struct opt *op, const char *arg, const char *where, struct options *o)
{
	printf("vmigd %s\n", VMIGD_VERSION);
	return 1;
}

/* One "name value" line of path. */
static int conf_line(const char *path, int lineno, const char *name, const char *val,
		     struct options *o)
{
	const struct opt *op = opt_by_name(name);
	char where[PATH_MAX + 32], arg[64];

	if (!op) {
		fprintf(stderr, "vmigd: %s:%d: unknown option \"%s\"\n", path, lineno, name);
		return -EINVAL;
	}
	if (op->flags & OPT_CLI_ONLY) {
		fprintf(stderr, "vmigd: %s:%d: %s: only on the command line\n", path, lineno, name);
		return -EINVAL;
	}
	if (opt_takes_arg(op) && !*val) {
		fprintf(stderr, "vmigd: %s:%d: %s needs a value (%s)\n", path, lineno, name,
			opt_arg(op, arg, sizeof(arg)));
		return -EINVAL;
	}
	if (!opt_takes_arg(op) && *val) {
		fprintf(stderr, "vmigd: %s:%d: %s takes no value, got \"%s\"\n", path, lineno, name,
			val);
		return -EINVAL;
	}
	snprintf(where, sizeof(where), "%s:%d: ", path, lineno);
	return opt_apply(op, opt_takes_arg(op) ? val : NULL, where, o) < 0 ? -EINVAL : 0;
}

/* --config FILE: "option value" (or option=value) lines, long names without "--", "#" to the end
 * of a line a comment. The values stay in the file's text, which o keeps. Read as sshd reads its
 * files (vm_file_read_checked()): a regular file that nobody but root (or our uid) can change. */
static int opt_config(const struct opt *op, const char *path, const char *where, struct options *o)
{
	struct conf_text *t = calloc(1, sizeof(*t));
	char *line, *next, msg[600];
	int lineno = 0, r;
	size_t len;

	if (!t)
		return -ENOMEM;
	r = vm_file_read_checked(path, "config", 0, VM_FILE_MAX, &t->text, &len, msg, sizeof(msg));
	if (r < 0) {
		free(t);
		fprintf(stderr, "vmigd: %s\n", msg);
		return r;
	}
	if (r > 0)
		fprintf(stderr, "vmigd: warning: %s\n", msg);
	t->next = o->conf_texts;
	o->conf_texts = t;
	for (line = t->text; *line; line = next) {
		char *name, *val, *end;

		lineno++;
		next = strchrnul(line, '\n');
		if (*next)
			*next++ = '\0';
		name = line + strspn(line, " \t");
		end = name + strcspn(name, "#\r");
		while (end > name && (end[-1] == ' ' || end[-1] == '\t'))
			end--;
		*end = '\0';
		if (!*name)
			continue;
		val = name + strcspn(name, " \t=");
		if (*val) {
			*val++ = '\0';
			val += strspn(val, " \t=");
		}
		r = conf_line(path, lineno, name, val, o);
		if (r < 0)
			return r;
	}
	return 0;
}

static unsigned int default_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n < 1 ? 1 : n > 4 ? 4 : n;
}

/* The defaults: each opts[] default that is a value, parsed as if given. */
static int options_init(struct options *o)
{
	*o = (struct options){ .threads = default_threads() };
	for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
		if (opts[i].def && !(opts[i].flags & OPT_DEF_TEXT) &&
		    opt_apply(&opts[i], opts[i].def, "default: ", o) != 0)
			return -EINVAL;
	}
	return 0;
}

static void options_done(struct options *o)
{
	while (o->conf_texts) {
		struct conf_text *t = o->conf_texts;

		o->conf_texts = t->next;
		free(t->text);
		free(t);
	}
}

/* One getopt pass over the command line, applying the OPT_EARLY options (early) or the others. */
static int options_pass(int argc, char **argv, bool early, struct options *o)
{
	struct option lo[ARRAY_SIZE(opts) + 1];
	char shorts[2 * ARRAY_SIZE(opts) + 1];
	size_t nl = 0, ns = 0;
	int c, r;

	for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
		const struct opt *op = &opts[i];
		int has_arg = opt_takes_arg(op) ? required_argument : no_argument;

		if (op->name)
			lo[nl++] = (struct option){ op->name, has_arg, NULL, opt_val(op) };
		if (op->letter) {
			shorts[ns++] = op->letter;
			if (has_arg)
				shorts[ns++] = ':';
		}
	}
	lo[nl] = (struct option){ NULL, 0, NULL, 0 };
	shorts[ns] = '\0';

	optind = 0; /* glibc: a fresh scan, whatever an earlier pass left */
	opterr = !early;
	while ((c = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
		const struct opt *op = opt_by_val(c);

		if (!op) {
			if (early)
				continue;
			usage(stderr, false);
			return -EINVAL;
		}
		if (!early != !(op->flags & OPT_EARLY))
			continue;
		r = opt_apply(op, optarg, "", o);
		if (r)
			return r;
	}
	if (!early && optind < argc) {
		fprintf(stderr, "vmigd: unexpected argument \"%s\"\n", argv[optind]);
		return -EINVAL;
	}
	return 0;
}

/* The config files first, so that the rest of the command line overrides them. 0, 1 when done
 * (--help, --version) or -EINVAL after one line on stderr. */
static int options_parse(int argc, char **argv, struct options *o)
{
	int r = options_pass(argc, argv, true, o);

	if (r)
		return r < 0 ? -EINVAL : r;
	r = options_pass(argc, argv, false, o);
	return r < 0 ? -EINVAL : r;
}

static void drained(void *arg)
{
	struct daemon *d = arg;

	log_info("drained; exiting");
	xp_loop_quit(d->loop);
}

/* This vmigd handed its listeners to a newer one: what it still carries is all it does. Under
 * systemd the new one becomes the service's main process; it must be in the service's cgroup,
 * which a vmigd started by SIGUSR2 is. */
static void handed_over(void *arg, int pid)
{
	struct daemon *d = arg;
	char state[160];
	int r;

	d->draining = true;
	d->info.metrics = NULL;
	ctl_metrics_server_free(d->metrics);
	d->metrics = NULL;
	snprintf(state, sizeof(state),
		 "MAINPID=%d\nSTATUS=handed over to vmigd pid %d; carrying what is in flight", pid,
		 pid);
	r = ctl_notify(state);
	if (r < 0)
		log_warn("systemd: cannot make pid %d the main process: %s", pid, strerror(-r));
}

/*
 * SIGUSR2: start the binary at this vmigd's path (a package upgrade put the new one there) with
 * the same arguments and --takeover. Forked twice, so that the new vmigd is no child of this one
 * (which exits first) and the service manager reaps it; under systemd it stays in the service's
 * cgroup. If it fails before it took over, this one carries on.
 */
static void spawn_takeover(struct daemon *d)
{
	sigset_t all;
	pid_t child;
	int status;

	if (d->draining || !d->exe[0]) {
		log_warn("SIGUSR2: %s; no takeover started",
			 d->draining ? "this vmigd is handing over or draining already"
				     : "its own binary's path is unknown");
		return;
	}
	child = fork();
	if (child < 0) {
		log_err("SIGUSR2: cannot fork: %s", strerror(errno));
		return;
	}
	if (child == 0) {
		pid_t grandchild = fork();

		if (grandchild != 0)
			_exit(grandchild < 0 ? 1 : 0);
		/* exec keeps the signal mask: the new vmigd blocks what it watches itself. */
		sigemptyset(&all);
		pthread_sigmask(SIG_SETMASK, &all, NULL);
		execv(d->exe, d->takeover_argv);
		fprintf(stderr, "vmigd: SIGUSR2: cannot run %s: %s\n", d->exe, strerror(errno));
		_exit(127);
	}
	if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		log_err("SIGUSR2: cannot start %s --takeover", d->exe);
		return;
	}
	log_info("SIGUSR2: started %s --takeover; this vmigd carries on until it has taken over",
		 d->exe);
}

/* What SIGUSR2 runs: this binary's path (as it was at start) and argv with --takeover. */
static int takeover_setup(struct daemon *d, int argc, char **argv)
{
	ssize_t n = readlink("/proc/self/exe", d->exe, sizeof(d->exe) - 1);
	int k = 0;

	if (n <= 0 || (size_t)n >= sizeof(d->exe) - 1) {
		d->exe[0] = '\0';
		return 0;
	}
	d->exe[n] = '\0';
	d->takeover_argv = calloc(argc + 2, sizeof(char *));
	if (!d->takeover_argv)
		return -ENOMEM;
	for (int i = 0; i < argc; i++)
		if (strcmp(argv[i], "--takeover") != 0)
			d->takeover_argv[k++] = argv[i];
	d->takeover_argv[k++] = "--takeover";
	d->takeover_argv[k] = NULL;
	return 0;
}

static void retired(void *arg)
{
	struct daemon *d = arg;

	log_info("handed over, and what this vmigd carried has ended; exiting");
	xp_loop_quit(d->loop);
}

/* Each mode problem the files were forgiven (on a read-only mount), one warning each. */
static void tls_log_warnings(const struct xp_tls *t)
{
	const char *w = xp_tls_warnings(t);

	while (*w) {
		int n = (int)strcspn(w, "\n");

		log_warn("TLS: %.*s", n, w);
		w += n + (w[n] == '\n');
	}
}

/* New connections get the new pair; links in flight keep theirs. A bad pair changes nothing:
 * neither does a file that is not a regular file (a FIFO), nor one others could change. */
static void tls_reload(struct daemon *d, const char *why)
{
	char err[300];
	int r;

	if (!d->tls) {
		log_info("%s: TLS is off (--no-tls); nothing to reload", why);
		return;
	}
	r = xp_tls_reload(d->tls, err, sizeof(err));
	if (r < 0)
		log_err("TLS: reload refused, keeping generation %u: %s", xp_tls_generation(d->tls),
			err);
	else if (r > 0)
		log_info("TLS: %s: files unchanged, keeping generation %u", why,
			 xp_tls_generation(d->tls));
	else {
		log_info("TLS: generation %u: %s (%s)", xp_tls_generation(d->tls),
			 xp_tls_describe(d->tls), why);
		tls_log_warnings(d->tls);
	}
}

static void tls_files_changed(void *arg)
{
	tls_reload(arg, "certificate files changed");
}

static void on_signal(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	struct daemon *d = arg;
	struct signalfd_siginfo si;

	if (read(fd, &si, sizeof(si)) != sizeof(si))
		return;
	if (si.ssi_signo == SIGHUP) {
		tls_reload(d, "SIGHUP");
		return;
	}
	if (si.ssi_signo == SIGUSR2) {
		spawn_takeover(d);
		return;
	}
	if (d->draining) {
		log_warn("%s again: cutting what is left and exiting", strsignal(si.ssi_signo));
		xp_loop_quit(d->loop);
		return;
	}
	d->draining = true;
	log_info("%s: no new connections; draining", strsignal(si.ssi_signo));
	(void)ctl_notify("STOPPING=1\nSTATUS=draining: no new connections");
	px_node_drain(d->node, d->drain_timeout_s, drained, d);
}

/* Checks what the options say together, loads TLS, and fills d->pc and the rest of d that start-up
 * needs. Each refusal is one line on stderr. */
/* Whether word (an address without its "/LEN") is one of addrs ("A/LEN B/LEN"). */
static bool has_address(const char *addrs, const char *word)
{
	size_t n = strlen(word);

	for (const char *p = addrs; (p = strstr(p, word)); p += n)
		if ((p == addrs || p[-1] == ' ') && (p[n] == '/' || p[n] == ' ' || !p[n]))
			return true;
	return false;
}

/* The address to carry the node hop on, of addrs: the first IPv4, else the first IPv6 that is
 * not link-local (a peer could not reach that without the interface's name). */
static bool pick_address(const char *addrs, char *out, size_t len)
{
	char buf[sizeof(((struct ctl_nic_info *)0)->addrs)], *save, *w;

	for (int want6 = 0; want6 < 2; want6++) {
		snprintf(buf, sizeof(buf), "%s", addrs);
		for (w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
			bool v6 = strchr(w, ':') != NULL;

			*strchrnul(w, '/') = '\0';
			if (v6 != want6 || (v6 && !strncasecmp(w, "fe80:", 5)))
				continue;
			snprintf(out, len, "%s", w);
			return true;
		}
	}
	return false;
}

/* --hop-interface: the listener on the interface's address, and that address advertised. */
static int hop_interface(const struct options *o, struct px_config *pc)
{
	struct ctl_nic_info nic;
	struct ctl_nl *nl;
	char err[300], addr[64];
	int r = ctl_nl_new(NULL, NULL, NULL, &nl);

	if (r < 0) {
		fprintf(stderr, "vmigd: --hop-interface: cannot open netlink: %s\n", strerror(-r));
		return r;
	}
	r = ctl_nl_by_name(nl, o->hop_interface, &nic, err, sizeof(err));
	ctl_nl_free(nl);
	if (r < 0) {
		fprintf(stderr, "vmigd: --hop-interface: %s\n", err);
		return r;
	}
	if (!xp_addr_is_wildcard(&pc->listen)) {
		xp_addr_host(&pc->listen, addr, sizeof(addr));
		if (!has_address(nic.addrs, addr)) {
			fprintf(stderr,
				"vmigd: --listen %s is not an address of --hop-interface %s (it "
				"has: "
				"%s)\n",
				o->listen, nic.name, nic.addrs[0] ? nic.addrs : "none");
			return -EINVAL;
		}
	} else if (!pick_address(nic.addrs, addr, sizeof(addr)) ||
		   xp_addr_from_host(addr, xp_addr_port(&pc->listen), &pc->listen) < 0) {
		fprintf(stderr,
			"vmigd: --hop-interface %s has no IPv4 or global IPv6 address to carry the "
			"node hop on (it has: %s)\n",
			nic.name, nic.addrs[0] ? nic.addrs : "none");
		return -EINVAL;
	}
	if (!o->advertise)
		snprintf(pc->advertise, sizeof(pc->advertise), "%s", addr);
	if (!nic.up)
		fprintf(stderr, "vmigd: warning: --hop-interface %s is down (%s)\n", nic.name,
			nic.operstate);
	return 0;
}

/* "0-3,8" into set; false for anything else, or a CPU past the set's size. */
static bool parse_cpulist(const char *s, cpu_set_t *set)
{
	CPU_ZERO(set);
	while (*s && *s != '\n') {
		char *end;
		unsigned long a = strtoul(s, &end, 10), b = a;

		if (end == s)
			return false;
		if (*end == '-') {
			s = end + 1;
			b = strtoul(s, &end, 10);
			if (end == s || b < a)
				return false;
		}
		if (b >= CPU_SETSIZE)
			return false;
		for (unsigned long i = a; i <= b; i++)
			CPU_SET(i, set);
		s = end;
		if (*s == ',')
			s++;
		else if (*s && *s != '\n')
			return false;
	}
	return CPU_COUNT(set) > 0;
}

/* --cpus: a list, or "nic", the CPUs of the NUMA node of the interface holding the address the
 * node hop is advertised on. What it came to is kept for status and the start line. */
static int cpus_option(struct daemon *d, const struct options *o, struct px_config *pc)
{
	char path[96], list[256] = "", host[64] = "", err[300];
	struct ctl_nic_info nic;
	struct ctl_nl *nl;
	FILE *f;

	if (strcmp(o->cpus, "nic")) {
		if (!parse_cpulist(o->cpus, &pc->cpus)) {
			fprintf(stderr,
				"vmigd: --cpus: expected a CPU list such as 0-3,8 or nic, got "
				"\"%s\"\n",
				o->cpus);
			return -EINVAL;
		}
		snprintf(d->cpus, sizeof(d->cpus), "%s", o->cpus);
		pc->pin = true;
		return 0;
	}
	if (pc->advertise[0])
		snprintf(host, sizeof(host), "%s", pc->advertise);
	else if (!xp_addr_is_wildcard(&pc->listen))
		xp_addr_host(&pc->listen, host, sizeof(host));
	if (!host[0]) {
		fprintf(stderr, "vmigd: --cpus nic needs the node hop's own address: give "
				"--hop-interface, --listen ADDR:PORT or --advertise\n");
		return -EINVAL;
	}
	if (ctl_nl_new(NULL, NULL, NULL, &nl) < 0) {
		fprintf(stderr, "vmigd: --cpus nic: cannot open netlink\n");
		return -EINVAL;
	}
	if (ctl_nl_owner(nl, host, &nic, err, sizeof(err)) < 0) {
		ctl_nl_free(nl);
		fprintf(stderr, "vmigd: --cpus nic: %s\n", err);
		return -EINVAL;
	}
	ctl_nl_free(nl);
	if (nic.numa_node < 0) {
		fprintf(stderr, "vmigd: --cpus nic: %s has no NUMA node (%s); give a CPU list\n",
			nic.name,
			nic.pci[0] ? "its device does not say: a one-node machine" : "no device");
		return -EINVAL;
	}
	snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", nic.numa_node);
	f = fopen(path, "re");
	if (!f || !fgets(list, sizeof(list), f) || !parse_cpulist(list, &pc->cpus)) {
		if (f)
			fclose(f);
		fprintf(stderr, "vmigd: --cpus nic: cannot read the CPUs of NUMA node %d (%s)\n",
			nic.numa_node, path);
		return -EINVAL;
	}
	fclose(f);
	list[strcspn(list, "\n")] = '\0';
	snprintf(d->cpus, sizeof(d->cpus), "%s (NUMA node %d of %s)", list, nic.numa_node,
		 nic.name);
	pc->pin = true;
	return 0;
}

static int daemon_configure(struct daemon *d, struct options *o)
{
	struct px_config *pc = &d->pc;

	vm_log_setup("vmigd", o->log_level);
	o->tls.resumption = !o->no_tls_resumption;
	o->tls.ktls = !o->no_ktls;
	if (o->no_tls && (o->tls.cert || o->tls.key || o->tls.ca)) {
		fprintf(stderr, "vmigd: --no-tls contradicts --tls-cert/--tls-key/--tls-ca\n");
		return -EINVAL;
	}
	if (!o->no_tls && (!o->tls.cert || !o->tls.key || !o->tls.ca)) {
		fprintf(stderr,
			"vmigd: the node hop is TLS by default: give --tls-cert, --tls-key and "
			"--tls-ca (PEM), or --no-tls to carry migrations in plain text\n");
		return -EINVAL;
	}
	if (!o->tls.client_cert != !o->tls.client_key) {
		fprintf(stderr, "vmigd: --tls-client-cert and --tls-client-key go together\n");
		return -EINVAL;
	}
	if (!o->no_tls) {
		char err[300];

		if (xp_tls_new(&o->tls, &d->tls, err, sizeof(err)) < 0) {
			fprintf(stderr, "vmigd: TLS: %s\n", err);
			return -EINVAL;
		}
		tls_log_warnings(d->tls);
	}
	if (xp_addr_parse(o->listen, 1, &pc->listen) < 0) {
		fprintf(stderr, "vmigd: --listen: expected ADDR:PORT (numeric), got \"%s\"\n",
			o->listen);
		return -EINVAL;
	}
	/* As KubeVirt: "::" for both families, "0.0.0.0" where IPv6 is off. */
	if (pc->listen.ss.ss_family == AF_INET6 && xp_addr_is_wildcard(&pc->listen) &&
	    !xp_ipv6_available()) {
		unsigned int port = xp_addr_port(&pc->listen);

		xp_addr_from_host("0.0.0.0", port, &pc->listen);
	}
	if (o->hop_interface && hop_interface(o, pc) < 0)
		return -EINVAL;
	if (o->cpus && cpus_option(d, o, pc) < 0)
		return -EINVAL;
	if (o->advertise) {
		struct xp_addr a;

		if (strlen(o->advertise) >= sizeof(pc->advertise) ||
		    xp_addr_from_host(o->advertise, 1, &a) < 0) {
			fprintf(stderr,
				"vmigd: --advertise: expected a numeric IP address, got \"%s\"\n",
				o->advertise);
			return -EINVAL;
		}
		strcpy(pc->advertise, o->advertise);
	}
	if (o->metrics && xp_addr_parse(o->metrics, 1, &d->metrics_addr) < 0) {
		fprintf(stderr,
			"vmigd: --metrics: expected ADDR:PORT (numeric; IPv6 as [ADDR]:PORT), got "
			"\"%s\"\n",
			o->metrics);
		return -EINVAL;
	}
	if (xp_unix_path_ok(o->control) < 0) {
		fprintf(stderr, "vmigd: --control: path too long or empty: \"%s\"\n", o->control);
		return -EINVAL;
	}
	pc->threads = o->threads;
	pc->slots = (o->slots + o->threads - 1) / o->threads;
	pc->pipe_size = o->pipe_size;
	pc->copy_path = o->copy_path;
	pc->order_timeout_ms = o->order_timeout_ms;
	pc->connect_timeout_ms = o->connect_timeout_ms;
	pc->tls = d->tls;
	pc->handshake_timeout_ms = o->handshake_timeout_ms;
	pc->preamble_timeout_ms = o->preamble_timeout_ms;
	pc->max_unauth = o->max_unauth;
	pc->max_migration_conns = o->max_migration_conns;
	pc->node_bandwidth = o->node_bandwidth;
	pc->shaper = o->shaper;
	pc->inspect = !o->no_inspect;
	pc->digest = o->digest;
	pc->keep_cap_at_switchover = o->keep_cap_at_switchover;
	pc->socket_uid = o->socket_uid;
	pc->socket_gid = o->socket_gid;
	if (!o->dpdk_eal != !o->dpdk_address) {
		fprintf(stderr, "vmigd: --dpdk and --dpdk-address go together\n");
		return -EINVAL;
	}
	if (o->dpdk_eal && !xp_dpdk_built()) {
		fprintf(stderr, "vmigd: --dpdk: this vmigd was built without DPDK (meson setup "
				"-Ddpdk=enabled)\n");
		return -ENOTSUP;
	}
	d->drain_timeout_s = o->drain_timeout_s;
	d->info.tls = d->tls;
	d->info.control_path = o->control;
	return 0;
}

static void log_tls_start(struct daemon *d, const struct options *o)
{
	const char *files[5];
	unsigned int nf = xp_tls_files(d->tls, files);
	char allow[2][300] = { "", "" };
	int r;

	for (int servers = 0; servers < 2; servers++)
		for (unsigned int i = 0; xp_tls_allow_list(d->tls, servers, i); i++)
			snprintf(allow[servers] + strlen(allow[servers]),
				 sizeof(allow[servers]) - strlen(allow[servers]), "%s%s",
				 i ? "," : "", xp_tls_allow_list(d->tls, servers, i));
	/* "allow" is what sources may present; a target's names only where they differ. */
	log_info("TLS: generation %u: %s; CA %s; allow %s%s%s; min %s; resumption %s; kernel "
		 "kTLS %s",
		 xp_tls_generation(d->tls), xp_tls_describe(d->tls), o->tls.ca, allow[0],
		 strcmp(allow[0], allow[1]) ? "; targets allowed " : "",
		 strcmp(allow[0], allow[1]) ? allow[1] : "", xp_tls_min_version(d->tls),
		 o->tls.resumption ? "on" : "off",
		 xp_tls_kernel_has_ktls() ? (o->tls.ktls ? "used" : "present, off (--no-ktls)")
					  : "absent: user-space crypto");
	r = xp_fwatch_new(d->loop, files, nf, TLS_SETTLE_MS, tls_files_changed, d, &d->tls_watch);
	if (r < 0)
		log_warn("TLS: cannot watch the certificate files (%s); reload with SIGHUP",
			 strerror(-r));
}

/*
 * A carried connection holds FDS_PER_CONN fds (its two sockets and a splice pipe each way);
 * FDS_SPARE cover listeners, control clients, QMP and libvirt. The soft limit is raised to what
 * --max-connections needs, as far as the hard limit allows; short of it, say so, since each
 * connection past the limit waits in a listen queue.
 */
#define FDS_PER_CONN 6
#define FDS_SPARE    256

static void raise_nofile(unsigned long conns)
{
	rlim_t want = (rlim_t)conns * FDS_PER_CONN + FDS_SPARE, was;
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	was = rl.rlim_cur;
	if (rl.rlim_cur < want) {
		rl.rlim_cur =
			rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			rl.rlim_cur = was;
	}
	if (rl.rlim_cur < want)
		log_warn("open files limit %llu (hard limit %llu) is below the %llu that "
			 "--max-connections %lu needs (%u per connection, %u spare): past it, "
			 "connections wait in the listen queues until fds are free; raise "
			 "LimitNOFILE= or the hard limit",
			 (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max,
			 (unsigned long long)want, conns, FDS_PER_CONN, FDS_SPARE);
	else if (rl.rlim_cur != was)
		log_info("open files limit raised from %llu to %llu for --max-connections %lu",
			 (unsigned long long)was, (unsigned long long)rl.rlim_cur, conns);
}

/* --node-bandwidth N%: the node cap from the speed of the link that holds the advertised
 * address, fixed at start. A link whose speed is not known is an error, not a guess. */
static int node_share(struct daemon *d, const struct options *o)
{
	struct ctl_nic_view v;
	char speed[32], rate[32];

	if (!d->nic || !ctl_nic_node(d->nic, &v)) {
		log_err("--node-bandwidth %g%%: no interface here holds the advertised address %s, "
			"so there is no link speed to take a share of; give a rate",
			o->node_share_pct, px_node_advertise(d->node));
		return -EINVAL;
	}
	if (!v.speed_known) {
		log_err("--node-bandwidth %g%%: the speed of %s (%s) is unknown (%s); give a rate",
			o->node_share_pct, v.nic.name, v.nic.kind,
			v.nic.pci[0]
				? "its device reports none, or it has no carrier"
				: "it has no device: veth, bridges and the like have no speed");
		return -EINVAL;
	}
	d->node_bandwidth = (uint64_t)(v.speed * o->node_share_pct / 100);
	px_node_set_bandwidth(d->node, d->node_bandwidth);
	log_info("node cap: %g%% of %s's %s = %s", o->node_share_pct, v.nic.name,
		 vm_format_rate(v.speed, speed, sizeof(speed)),
		 vm_format_rate(d->node_bandwidth, rate, sizeof(rate)));
	return 0;
}

/* The event loop, the node, convergence control, the control socket, metrics and the signals;
 * what was made before a failure is left in d for daemon_done(). Logs its errors. */
static int daemon_start(struct daemon *d, const struct options *o)
{
	struct ctl_hop_conf hop = {
		.eal = o->dpdk_eal,
		.address = o->dpdk_address,
		.udp_port = (uint16_t)o->dpdk_port,
		.buffer = (uint32_t)o->dpdk_buffer,
		.wrap = ctl_test_hop_wrap(),
	};
	struct xp_io *io;
	char rate[32];
	sigset_t mask;
	int holder, r;

	d->info.started_ms = vm_now_ms();
	raise_nofile(o->slots);
	/* Writes to a closed peer must come back as EPIPE, not kill the daemon. */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	sigaddset(&mask, SIGUSR2);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);

	r = xp_loop_new(&d->loop);
	if (r < 0) {
		log_err("cannot create the event loop: %s", strerror(-r));
		return r;
	}
	if (o->takeover) {
		char err[400];

		r = ctl_takeover_ask(o->control, &d->offer, err, sizeof(err));
		if (r < 0) {
			log_err("takeover: %s", err);
			return r;
		}
		log_info("takeover: vmigd pid %d offers its listeners", d->offer.pid);
		d->pc.adopt = true;
		d->pc.adopt_fd = d->offer.node_fd;
		d->offer.node_fd = -1;
	}
	r = ctl_io_new(d->loop, &d->pc, &hop, &io);
	if (r < 0)
		return r;
	r = px_node_new(io, &d->pc, &d->node);
	if (r < 0)
		return r;
	r = cv_set_new(d->loop, d->node, &d->conv);
	if (r < 0) {
		log_err("cannot set up convergence control: %s", strerror(-r));
		return r;
	}
	d->info.conv = d->conv;
	r = ctl_nic_new(d->loop, d->node, d->conv, o->link_down_timeout_s, &d->nic);
	if (r < 0)
		log_warn("cannot follow the node hop's interfaces through netlink (%s): status and "
			 "metrics show no NIC, and link events are not seen",
			 strerror(-r));
	d->info.nic = d->nic;
	d->info.cpus = d->cpus[0] ? d->cpus : NULL;
	if (o->node_share_pct > 0) {
		r = node_share(d, o);
		if (r < 0)
			return r;
	}
	if (o->takeover) {
		r = ctl_server_adopt(d->loop, o->control, d->offer.ctl_fd, d->offer.lock_fd,
				     d->node, &d->info, &d->ctl);
		if (r < 0) {
			log_err("takeover: cannot serve the control socket handed over: %s",
				strerror(-r));
			return r;
		}
		d->offer.ctl_fd = d->offer.lock_fd = -1;
	} else {
		r = ctl_server_new(d->loop, o->control, d->node, &d->info, &holder, &d->ctl);
	}
	if (r == -EADDRINUSE) {
		log_err("another vmigd (pid %d) is already running with control socket %s", holder,
			o->control);
		return r;
	}
	if (r < 0) {
		log_err("cannot create control socket %s: %s", o->control, strerror(-r));
		return r;
	}
	if (o->metrics) {
		char err[300];

		if (d->offer.metrics_fd >= 0) {
			r = ctl_metrics_server_adopt(d->loop, d->node, d->conv, d->nic,
						     d->offer.metrics_fd, &d->metrics, err,
						     sizeof(err));
			d->offer.metrics_fd = -1;
		} else {
			r = ctl_metrics_server_new(d->loop, d->node, d->conv, d->nic,
						   &d->metrics_addr, &d->metrics, err, sizeof(err));
		}
		if (r < 0) {
			log_err("metrics: %s", err);
			return r;
		}
		d->info.metrics = ctl_metrics_server_addr(d->metrics);
		log_info("metrics: serving http://%s/metrics", d->info.metrics);
	}
	if (d->offer.metrics_fd >= 0)
		log_warn("takeover: the previous vmigd served metrics; this one runs without "
			 "--metrics, so the endpoint closes");
	r = ctl_takeover_new(&(struct ctl_takeover_parts){ .loop = d->loop,
							   .node = d->node,
							   .info = &d->info,
							   .ctl = d->ctl,
							   .metrics = d->metrics,
							   .drain_timeout_s = d->drain_timeout_s,
							   .committed = handed_over,
							   .retired = retired,
							   .arg = d },
			     &d->takeover);
	if (r < 0) {
		log_err("out of memory");
		return r;
	}
	d->info.takeover = d->takeover;
	if (o->takeover) {
		char err[400];

		r = ctl_takeover_finish(d->takeover, &d->offer, err, sizeof(err));
		if (r < 0) {
			log_err("takeover: %s; vmigd pid %d carries on", err, d->offer.pid);
			return r;
		}
		ctl_takeover_offer_done(&d->offer);
	}
	d->sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (d->sfd < 0 || xp_watch_add(d->loop, d->sfd, EPOLLIN, on_signal, d, &d->sigw) < 0) {
		log_err("cannot watch signals: %s", strerror(errno));
		return -errno;
	}
	if (d->tls)
		log_tls_start(d, o);
	else
		log_warn("node hop is plain text (--no-tls): migration data crosses the network "
			 "unencrypted and peers are not authenticated");
	log_info("vmigd %s started: listen=%s advertise=%s control=%s threads=%u data_path=%s "
		 "cpus=%s",
		 VMIGD_VERSION, px_node_listen_str(d->node), px_node_advertise(d->node), o->control,
		 px_node_threads(d->node), px_node_data_path(d->node),
		 d->cpus[0] ? d->cpus : "any");
	log_info("bandwidth: node cap %s, shaper %s, inspection %s, digests %s, caps %s at "
		 "switchover",
		 vm_format_rate(o->node_share_pct > 0 ? d->node_bandwidth : o->node_bandwidth, rate,
				sizeof(rate)),
		 px_shaper_str(o->shaper), o->no_inspect ? "off" : "on",
		 px_digest_str(o->digest), o->keep_cap_at_switchover ? "kept" : "lifted");
	if (o->dpdk_eal)
		log_info("DPDK node hop: %s udp %lu, %s, for peers that have one too",
			 o->dpdk_address, o->dpdk_port,
			 d->tls ? "sealed with AES-256-GCM keys from each connection's TLS 1.3 "
				  "session"
				: "plain text (--no-tls)");
	/* systemd (Type=notify): the control socket and the node-hop listener accept from here.
	 * A vmigd that took over is made the main process by the old one, and the service is
	 * ready already. */
	if (o->takeover)
		return 0;
	r = ctl_notify("READY=1");
	if (r < 0)
		log_warn("systemd: cannot send READY=1 to $NOTIFY_SOCKET: %s", strerror(-r));
	return 0;
}

/* Until a signal and a drain end the loop. */
static int daemon_run(struct daemon *d)
{
	int r = xp_loop_run(d->loop);

	if (r < 0)
		log_err("event loop: %s", strerror(-r));
	return r;
}

/* Takes a daemon in any state daemon_configure() or daemon_start() left it. */
static void daemon_done(struct daemon *d)
{
	xp_watch_del(d->sigw);
	if (d->sfd >= 0)
		close(d->sfd);
	ctl_takeover_free(d->takeover);
	ctl_takeover_offer_done(&d->offer);
	free(d->takeover_argv);
	ctl_metrics_server_free(d->metrics);
	ctl_server_free(d->ctl);
	xp_fwatch_free(d->tls_watch);
	/* Monitors read the node's figures: stop them first. */
	ctl_nic_free(d->nic);
	cv_set_free(d->conv);
	/* The node's links hold TLS sessions: free it first. */
	px_node_free(d->node);
	xp_tls_free(d->tls);
	xp_loop_free(d->loop);
}

int main(int argc, char **argv)
{
	struct options o;
	struct daemon d = { .sfd = -1,
			    .offer = { .sock = -1,
				       .ctl_fd = -1,
				       .lock_fd = -1,
				       .node_fd = -1,
				       .metrics_fd = -1 } };
	int r, status = 1;

	r = options_init(&o);
	if (r < 0)
		goto out_options;
	r = ctl_test_init(&argc, argv);
	if (r < 0)
		goto out_options;
	r = options_parse(argc, argv, &o);
	if (r != 0) {
		status = r > 0 ? 0 : 1;
		goto out_options;
	}
	if (daemon_configure(&d, &o) < 0)
		goto out_daemon;
	if (o.check_only) {
		printf("vmigd: configuration ok\n");
		status = 0;
		goto out_daemon;
	}
	if (takeover_setup(&d, argc, argv) < 0)
		goto out_daemon;
	if (daemon_start(&d, &o) < 0 || daemon_run(&d) < 0)
		goto out_daemon;
	status = 0;
out_daemon:
	daemon_done(&d);
	if (status == 0 && !o.check_only)
		log_info("stopped");
out_options:
	options_done(&o);
	return status;
}
