// SPDX-License-Identifier: Apache-2.0
/* vmigd's option table, opts[]: getopt's tables, the --config file keys and --help all come from
 * it, as do the defaults. Parses and checks each option alone; what they mean together is
 * vmigd.c's daemon_configure(). */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctl_options.h"
#include "file.h"
#include "log.h"
#include "px_node.h"
#include "units.h"
#include "util.h"
#include "vmigd-config.h"

/* --help: lines wrap at HELP_WIDTH; an option's help starts at HELP_COL. */
#define HELP_WIDTH 100
#define HELP_COL   32
/* getopt values of options without a short letter: OPT_VAL_BASE + their index in opts[]. */
#define OPT_VAL_BASE 256

/* A --config file's text. Options point into it, so it lives as long as the options. */
struct ctl_conf_text {
	struct ctl_conf_text *next;
	char *text;
};

/* How an option's argument is parsed and where it goes (struct ctl_options at off). */
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
			    struct ctl_options *o);

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

#define OPT_AT(field)	     .off = offsetof(struct ctl_options, field)
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
static const struct opt_word compress_modes[] = {
	{ "off", PX_COMPRESS_OFF },
	{ "auto", PX_COMPRESS_AUTO },
	{ "always", PX_COMPRESS_ALWAYS },
	{ NULL, 0 },
};
static const struct opt_word shapers[] = {
	{ "bucket", PX_SHAPE_BUCKET },
	{ "pacing", PX_SHAPE_PACING },
	{ NULL, 0 },
};

static int opt_log_level(const struct opt *op, const char *arg, const char *where,
			 struct ctl_options *o);
static int opt_socket_owner(const struct opt *op, const char *arg, const char *where,
			    struct ctl_options *o);
static int opt_tls_version(const struct opt *op, const char *arg, const char *where,
			   struct ctl_options *o);
static int opt_node_bandwidth(const struct opt *op, const char *arg, const char *where,
			      struct ctl_options *o);
static int opt_config(const struct opt *op, const char *arg, const char *where,
		      struct ctl_options *o);
static int opt_help(const struct opt *op, const char *arg, const char *where,
		    struct ctl_options *o);
static int opt_version(const struct opt *op, const char *arg, const char *where,
		       struct ctl_options *o);

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
	{ "resume-timeout", 0, ULONG(resume_timeout_s, 0, 3600), .arg = "S", .def = "60",
	  .help = "between two vmigd, a connection whose node hop fails waits this long for a new "
		  "one and goes on from the last byte delivered; past it the migration fails (0: "
		  "no resumption, a failed node hop fails the migration)" },
	{ "resume-buffer", 0, ULONG(resume_keep, 65536, 1ul << 30), .arg = "BYTES",
	  .def = "2097152",
	  .help = "what a resumable connection keeps of what it sent until the peer says it "
		  "delivered it; when that is full, the connection waits" },
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
	{ "compress", 0, WORDS(compress, compress_modes), .def = "auto",
	  .help = "compress what a source sends to a vmigd target (zstd, on resumable "
		  "connections of the kernel path; a target that is not off decodes): auto, a "
		  "connection while its cap holds it back and its bytes shrink; always (also for a "
		  "hop bound by its link); off (never, either role)" },
	{ "compress-level", 0, ULONG(compress_level, 1, 19), .arg = "N", .def = "1",
	  .help = "zstd's level for --compress" },
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
		vm_log_early(VM_LOG_ERR, "%s--%s: expected a number from %lu to %lu, got \"%s\"",
			     where, op->name, op->min, op->max, s);
		return -EINVAL;
	}
	*ret = v;
	return 0;
}

static int parse_word(const struct opt *op, const char *s, const char *where, int *ret)
{
	const struct opt_word *w;
	char words[256] = "";
	size_t n = 0;

	for (w = op->words; w->word; w++) {
		if (strcmp(s, w->word) == 0) {
			*ret = w->value;
			return 0;
		}
	}
	for (w = op->words; w->word && n < sizeof(words); w++) {
		const char *sep = w == op->words ? "" : w[1].word ? ", " : " or ";

		n += snprintf(words + n, sizeof(words) - n, "%s%s", sep, w->word);
	}
	vm_log_early(VM_LOG_ERR, "%s--%s: use %s", where, op->name, words);
	return -EINVAL;
}

/* One option with its argument (NULL when it takes none) into o. */
static int opt_apply(const struct opt *op, const char *arg, const char *where,
		     struct ctl_options *o)
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
			 struct ctl_options *o)
{
	if (vm_log_level_parse(arg, &o->log_level) == 0)
		return 0;
	vm_log_early(VM_LOG_ERR, "%s--%s: use error, warning, info or debug", where, op->name);
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
			    struct ctl_options *o)
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
	vm_log_early(VM_LOG_ERR, "%s--%s: expected UID[:GID] (numbers, or -1), got \"%s\"", where,
		     op->name, arg);
	return -EINVAL;
}

static int opt_node_bandwidth(const struct opt *op, const char *arg, const char *where,
			      struct ctl_options *o)
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
		vm_log_early(VM_LOG_ERR, "%s--%s: a share of the link is 1%% to 100%%, got \"%s\"",
			     where, op->name, arg);
		return -EINVAL;
	}
	if (vm_parse_rate(arg, &o->node_bandwidth) == 0)
		return 0;
	vm_log_early(VM_LOG_ERR,
		     "%s--%s: expected a rate such as 1Gbit, 500MB, 64Mi or none (vmigd(8): "
		     "RATE UNITS), or a share of the link such as 80%%, got \"%s\"",
		     where, op->name, arg);
	return -EINVAL;
}

static int opt_tls_version(const struct opt *op, const char *arg, const char *where,
			   struct ctl_options *o)
{
	if (!strcmp(arg, "1.2") || !strcmp(arg, "VersionTLS12"))
		o->tls.min_version = 12;
	else if (!strcmp(arg, "1.3") || !strcmp(arg, "VersionTLS13"))
		o->tls.min_version = 13;
	else {
		vm_log_early(VM_LOG_ERR,
			     "%s--%s: use 1.2 or 1.3 (or VersionTLS12, VersionTLS13); vmigd speaks "
			     "no older TLS, got \"%s\"",
			     where, op->name, arg);
		return -EINVAL;
	}
	return 0;
}

static int opt_help(const struct opt *op, const char *arg, const char *where,
		    struct ctl_options *o)
{
	usage(stdout, true);
	return 1;
}

static int opt_version(const struct opt *op, const char *arg, const char *where,
		       struct ctl_options *o)
{
	printf("vmigd %s\n", VMIGD_VERSION);
	return 1;
}

/* One "name value" line of path. */
static int conf_line(const char *path, int lineno, const char *name, const char *val,
		     struct ctl_options *o)
{
	const struct opt *op = opt_by_name(name);
	char where[PATH_MAX + 32], arg[64];

	if (!op) {
		vm_log_early(VM_LOG_ERR, "%s:%d: unknown option \"%s\"", path, lineno, name);
		return -EINVAL;
	}
	if (op->flags & OPT_CLI_ONLY) {
		vm_log_early(VM_LOG_ERR, "%s:%d: %s: only on the command line", path, lineno, name);
		return -EINVAL;
	}
	if (opt_takes_arg(op) && !*val) {
		vm_log_early(VM_LOG_ERR, "%s:%d: %s needs a value (%s)", path, lineno, name,
			     opt_arg(op, arg, sizeof(arg)));
		return -EINVAL;
	}
	if (!opt_takes_arg(op) && *val) {
		vm_log_early(VM_LOG_ERR, "%s:%d: %s takes no value, got \"%s\"", path, lineno, name,
			     val);
		return -EINVAL;
	}
	snprintf(where, sizeof(where), "%s:%d: ", path, lineno);
	return opt_apply(op, opt_takes_arg(op) ? val : NULL, where, o) < 0 ? -EINVAL : 0;
}

/* --config FILE: "option value" (or option=value) lines, long names without "--", "#" to the end
 * of a line a comment. The values stay in the file's text, which o keeps. Read as sshd reads its
 * files (vm_file_read_checked()): a regular file that nobody but root (or our uid) can change. */
static int opt_config(const struct opt *op, const char *path, const char *where,
		      struct ctl_options *o)
{
	struct ctl_conf_text *t = calloc(1, sizeof(*t));
	char *line, *next, msg[600];
	int lineno = 0, r;
	size_t len;

	if (!t)
		return -ENOMEM;
	r = vm_file_read_checked(path, "config", 0, VM_FILE_MAX, &t->text, &len, msg, sizeof(msg));
	if (r < 0) {
		free(t);
		vm_log_early(VM_LOG_ERR, "%s", msg);
		return r;
	}
	if (r > 0)
		vm_log_early(VM_LOG_WARN, "%s", msg);
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

int ctl_options_init(struct ctl_options *o)
{
	*o = (struct ctl_options){ .threads = default_threads() };
	for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
		if (opts[i].def && !(opts[i].flags & OPT_DEF_TEXT) &&
		    opt_apply(&opts[i], opts[i].def, "default: ", o) != 0)
			return -EINVAL;
	}
	return 0;
}

void ctl_options_done(struct ctl_options *o)
{
	while (o->conf_texts) {
		struct ctl_conf_text *t = o->conf_texts;

		o->conf_texts = t->next;
		free(t->text);
		free(t);
	}
}

/* One getopt pass over the command line, applying the OPT_EARLY options (early) or the others. */
static int options_pass(int argc, char **argv, bool early, struct ctl_options *o)
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
		vm_log_early(VM_LOG_ERR, "unexpected argument \"%s\"", argv[optind]);
		return -EINVAL;
	}
	return 0;
}

int ctl_options_parse(int argc, char **argv, struct ctl_options *o)
{
	int r = options_pass(argc, argv, true, o);

	if (r)
		return r < 0 ? -EINVAL : r;
	r = options_pass(argc, argv, false, o);
	return r < 0 ? -EINVAL : r;
}
