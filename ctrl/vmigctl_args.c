// SPDX-License-Identifier: Apache-2.0
/* vmigctl's command line (vmigctl_args.h): getopt_long per command from the command table, the
 * help, one-line usage errors and the bash completion script. Not the commands: vmigctl.c. */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "vmigctl_args.h"
#include "vmigd-config.h"

#define MAX_OPTS  48
#define MAX_GIVEN 256
/* A long option's getopt value: its index in the command's option list, above any letter. */
#define LONG_BASE 256

static const struct vc_opt common_opts[] = {
	{ .name = "control",
	  .id = VC_OPT_CONTROL,
	  .arg = "PATH",
	  .help = "the control socket ($VMIGD_CONTROL, else " VMIGD_DEFAULT_CONTROL ")",
	  .complete = "@file" },
	{ .name = "json",
	  .id = VC_OPT_JSON,
	  .help = "print the reply, or the error, as one line of JSON on stdout" },
	{ .name = "help", .id = VC_OPT_HELP, .help = "print this help and exit" },
	{ .name = "version", .id = VC_OPT_VERSION, .help = "print vmigctl's version and exit" },
	{ 0 },
};

/* The common options' letters. */
static const struct {
	char letter;
	int id;
} letters[] = { { 'c', VC_OPT_CONTROL }, { 'h', VC_OPT_HELP }, { 'V', VC_OPT_VERSION } };

static char letter_of(int id)
{
	for (size_t i = 0; i < ARRAY_SIZE(letters); i++)
		if (letters[i].id == id)
			return letters[i].letter;
	return 0;
}

/* The options of cmd, its own then those it shares, in list; returns how many. */
static size_t cmd_opts(const struct vc_cmd *cmd, const struct vc_opt **list)
{
	size_t n = 0;

	for (const struct vc_opt *o = cmd ? cmd->opts : NULL; o && o->name && n < MAX_OPTS; o++)
		list[n++] = o;
	for (const struct vc_opt *o = cmd ? cmd->also : NULL; o && o->name && n < MAX_OPTS; o++)
		list[n++] = o;
	return n;
}

/* A command's options, its own then the common ones, as getopt_long wants them. */
struct opt_set {
	const struct vc_opt *opt[2 * MAX_OPTS];
	struct option lo[2 * MAX_OPTS + 1];
	char shorts[16];
	size_t n;
};

static void opt_set_init(struct opt_set *s, const struct vc_cmd *cmd)
{
	size_t k = 0;

	memset(s, 0, sizeof(*s));
	s->n = cmd_opts(cmd, s->opt);
	for (const struct vc_opt *o = common_opts; o->name; o++)
		s->opt[s->n++] = o;
	/* Before the command, '+' stops at its first word; after it, '-' hands each argument
	 * over in order, wherever the options are (and whatever POSIXLY_CORRECT says). ':' tells
	 * a missing value from an unknown option. */
	s->shorts[k++] = cmd ? '-' : '+';
	s->shorts[k++] = ':';
	for (size_t i = 0; i < ARRAY_SIZE(letters); i++) {
		s->shorts[k++] = letters[i].letter;
		if (letters[i].id == VC_OPT_CONTROL)
			s->shorts[k++] = ':';
	}
	for (size_t i = 0; i < s->n; i++)
		s->lo[i] = (struct option){ s->opt[i]->name,
					    s->opt[i]->arg ? required_argument : no_argument, NULL,
					    (int)(LONG_BASE + i) };
}

static const struct vc_opt *opt_set_find(const struct opt_set *s, int val)
{
	for (size_t i = 0; i < ARRAY_SIZE(letters); i++)
		if (letters[i].letter == val)
			val = letters[i].id;
	if (val >= LONG_BASE && (size_t)(val - LONG_BASE) < s->n)
		return s->opt[val - LONG_BASE];
	for (size_t i = 0; i < s->n; i++)
		if (s->opt[i]->id == val && val < 0)
			return s->opt[i];
	return NULL;
}

/* ---- help ---- */

static bool mentions(const char *text, const char *word)
{
	return text && strstr(text, word);
}

static void print_synopsis(FILE *f, const struct vc_cmd *cmd)
{
	const struct vc_opt *list[MAX_OPTS];
	size_t n = cmd_opts(cmd, list);

	fprintf(f, "vmigctl [-c PATH] [--json] %s", cmd->name);
	if (cmd->args)
		fprintf(f, " %s", cmd->args);
	for (size_t i = 0; i < n; i++)
		if (list[i]->flags & VC_OPT_REQUIRED)
			fprintf(f, " --%s %s%s", list[i]->name, list[i]->arg,
				(list[i]->flags & VC_OPT_REPEAT) ? " ..." : "");
	for (size_t i = 0; i < n; i++)
		if (!(list[i]->flags & VC_OPT_REQUIRED)) {
			fprintf(f, " [OPTION...]");
			break;
		}
	fputc('\n', f);
}

static void print_opt(FILE *f, const struct vc_opt *o)
{
	char head[64], letter = letter_of(o->id);
	int n = 0;

	if (letter)
		n = snprintf(head, sizeof(head), "-%c, ", letter);
	snprintf(head + n, sizeof(head) - n, "--%s%s%s", o->name, o->arg ? " " : "",
		 o->arg ? o->arg : "");
	fprintf(f, "  %-30s %s%s\n", head, o->help,
		(o->flags & VC_OPT_REQUIRED)
			? ((o->flags & VC_OPT_REPEAT) ? " (required, repeatable)" : " (required)")
		: (o->flags & VC_OPT_REPEAT) ? " (repeatable)"
					     : "");
}

static void print_rates(FILE *f)
{
	fputs("RATE: bytes/s, with K, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti (of 1024); bits "
	      "with a\nunit ending in bit or bps (1Gbit); 0 or none: no cap.\n",
	      f);
}

static void print_exit_codes(FILE *f)
{
	fputs("Exit status: 0 done, 1 refused by vmigd, 2 usage error, 3 no vmigd at the control "
	      "socket,\n4 vmigd busy (try again).\n",
	      f);
}

static void cmd_help(const struct vc_cmd *cmd)
{
	const struct vc_opt *list[MAX_OPTS];
	size_t n = cmd_opts(cmd, list);
	bool rates = mentions(cmd->args, "RATE");

	printf("usage: ");
	print_synopsis(stdout, cmd);
	printf("%s\n", cmd->help);
	if (n)
		printf("\nOptions:\n");
	for (size_t i = 0; i < n; i++) {
		print_opt(stdout, list[i]);
		rates = rates || mentions(list[i]->arg, "RATE");
	}
	printf("\nOptions of every command:\n");
	for (const struct vc_opt *o = common_opts; o->name; o++)
		print_opt(stdout, o);
	printf("\n");
	if (rates)
		print_rates(stdout);
	print_exit_codes(stdout);
	printf("See vmigctl(8).\n");
}

static void main_help(const struct vc_cmd *cmds, size_t n)
{
	printf("usage: vmigctl [-c PATH] [--json] COMMAND [ARGUMENT...] [OPTION...]\n"
	       "Controls a running vmigd through its control socket.\n\nCommands:\n");
	for (size_t i = 0; i < n; i++) {
		char head[64];

		if (cmds[i].hidden)
			continue;
		snprintf(head, sizeof(head), "%s%s%s", cmds[i].name, cmds[i].args ? " " : "",
			 cmds[i].args ? cmds[i].args : "");
		printf("  %-26s %s\n", head, cmds[i].help);
	}
	printf("  %-26s %s\n", "help [COMMAND]", "this help, or a command's (as COMMAND --help)");
	printf("\nOptions of every command, before or after it:\n");
	for (const struct vc_opt *o = common_opts; o->name; o++)
		print_opt(stdout, o);
	printf("\n");
	print_rates(stdout);
	print_exit_codes(stdout);
	printf("\"vmigctl COMMAND --help\" lists a command's options. See vmigctl(8).\n");
}

/* ---- errors ---- */

static void __attribute__((noreturn)) vusage(const struct vc_cmd *cmd, const char *fmt, va_list ap)
{
	fputs("vmigctl: ", stderr);
	vfprintf(stderr, fmt, ap);
	if (cmd)
		fprintf(stderr, "; try \"vmigctl %s --help\"\n", cmd->name);
	else
		fprintf(stderr, "; try \"vmigctl --help\"\n");
	exit(VC_EXIT_USAGE);
}

void vc_usage_error(const struct vc_cmd *cmd, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vusage(cmd, fmt, ap);
	va_end(ap);
}

/* " for \"status\"", or nothing before a command. */
static const char *for_cmd(const struct vc_cmd *cmd, char *buf, size_t len)
{
	if (!cmd)
		return "";
	snprintf(buf, len, " for \"%s\"", cmd->name);
	return buf;
}

/* What getopt_long turned down, as one line naming the word. */
static void __attribute__((noreturn))
option_error(const struct opt_set *s, const struct vc_cmd *cmd, int r, char **argv)
{
	const char *word = argv[optind - 1];
	const struct vc_opt *o = optopt ? opt_set_find(s, optopt) : NULL;
	char name[128], where[160];
	size_t prefix_of = 0;

	for_cmd(cmd, where, sizeof(where));
	if (r == ':') {
		if (o && strncmp(word, "--", 2) != 0)
			snprintf(name, sizeof(name), "-%c", letter_of(o->id));
		else
			snprintf(name, sizeof(name), "%s", word);
		vc_usage_error(cmd, "option \"%s\"%s needs a value (%s)", name, where,
			       o && o->arg ? o->arg : "?");
	}
	if (o) /* --flag=value */
		vc_usage_error(cmd, "option \"--%s\"%s takes no value", o->name, where);
	if (optopt) /* a letter */
		vc_usage_error(cmd, "unknown option \"-%c\"%s", optopt, where);
	/* --name or --name=value: unknown, or the start of several */
	snprintf(name, sizeof(name), "%.*s", (int)strcspn(word, "="), word);
	for (size_t i = 0; i < s->n && strncmp(name, "--", 2) == 0; i++)
		if (strncmp(s->opt[i]->name, name + 2, strlen(name + 2)) == 0)
			prefix_of++;
	if (prefix_of > 1)
		vc_usage_error(cmd, "ambiguous option \"%s\"%s", name, where);
	vc_usage_error(cmd, "unknown option \"%s\"%s", name, where);
}

/* ---- parsing ---- */

static void __attribute__((noreturn)) print_version(void)
{
	printf("vmigctl %s\n", VMIGD_VERSION);
	exit(VC_EXIT_OK);
}

/* Parses the options of argv (argv[0] is the command's last word, or the program) into c, and
 * the command's arguments into c->args; returns where the command starts (before it). */
static int parse_opts(const struct vc_cmd *cmd, int argc, char **argv, struct vc_call *c,
		      const struct vc_cmd *cmds, size_t ncmds)
{
	static struct vc_given given[MAX_GIVEN];
	static char *args[MAX_GIVEN];
	struct opt_set s;
	int r;

	opt_set_init(&s, cmd);
	optind = 0; /* glibc: start afresh, this argv */
	opterr = 0;
	c->args = args;
	while ((r = getopt_long(argc, argv, s.shorts, s.lo, NULL)) != -1) {
		const struct vc_opt *o = (r == '?' || r == ':') ? NULL : opt_set_find(&s, r);

		if (r == 1 && c->nargs < MAX_GIVEN) { /* an argument */
			args[c->nargs++] = optarg;
			continue;
		}
		if (!o)
			option_error(&s, cmd, r, argv);
		switch (o->id) {
		case VC_OPT_CONTROL:
			if (!*optarg)
				vc_usage_error(cmd, "option \"-c\" needs a path, not \"\"");
			c->control = optarg;
			c->control_from = "-c";
			break;
		case VC_OPT_JSON:
			c->json = true;
			break;
		case VC_OPT_HELP:
			if (cmd)
				cmd_help(cmd);
			else
				main_help(cmds, ncmds);
			exit(VC_EXIT_OK);
		case VC_OPT_VERSION:
			print_version();
		default:
			if (c->ngiven == MAX_GIVEN)
				vc_usage_error(cmd, "more than %d options", MAX_GIVEN);
			given[c->ngiven++] = (struct vc_given){ o, optarg };
			c->given = given;
		}
	}
	/* after "--" */
	for (; cmd && optind < argc && c->nargs < MAX_GIVEN; optind++)
		args[c->nargs++] = argv[optind];
	return optind;
}

/* The given options against the command's rules: required, once, exclusive. */
static void check_opts(const struct vc_call *c)
{
	const struct vc_cmd *cmd = c->cmd;
	const struct vc_opt *list[MAX_OPTS];
	size_t n = cmd_opts(cmd, list);

	for (size_t k = 0; k < n; k++) {
		const struct vc_opt *o = list[k];
		int times = 0;

		for (int i = 0; i < c->ngiven; i++)
			times += c->given[i].opt == o;
		if ((o->flags & VC_OPT_REQUIRED) && !times)
			vc_usage_error(cmd, "\"%s\" needs --%s %s", cmd->name, o->name, o->arg);
		if (times > 1 && !(o->flags & VC_OPT_REPEAT))
			vc_usage_error(cmd, "option \"--%s\" given %d times", o->name, times);
	}
	for (int i = 0; i < c->ngiven; i++)
		for (int j = 0; j < i; j++) {
			const struct vc_opt *a = c->given[j].opt, *b = c->given[i].opt;

			if (a->group && a->group == b->group && a != b)
				vc_usage_error(cmd,
					       "options \"--%s\" and \"--%s\" exclude each other",
					       a->name, b->name);
		}
}

/* The command whose words start argv (and how many words it took), or a usage error. */
static const struct vc_cmd *find_cmd(const struct vc_cmd *cmds, size_t n, int argc, char **argv,
				     int *words)
{
	const char *w = argv[0];
	size_t wlen = strlen(w);
	char seconds[256] = "";

	for (size_t i = 0; i < n; i++) {
		const char *name = cmds[i].name, *sp = strchr(name, ' ');

		if (!sp && strcmp(name, w) == 0) {
			*words = 1;
			return &cmds[i];
		}
		if (!sp || (size_t)(sp - name) != wlen || strncmp(name, w, wlen) != 0)
			continue;
		if (argc > 1 && strcmp(sp + 1, argv[1]) == 0) {
			*words = 2;
			return &cmds[i];
		}
		snprintf(seconds + strlen(seconds), sizeof(seconds) - strlen(seconds), "%s%s",
			 seconds[0] ? " or " : "", sp + 1);
	}
	if (!seconds[0])
		vc_usage_error(NULL, "unknown command \"%s\"", w);
	if (argc < 2 || argv[1][0] == '-')
		vc_usage_error(NULL, "\"%s\" needs %s", w, seconds);
	vc_usage_error(NULL, "unknown command \"%s %s\" (%s takes %s)", w, argv[1], w, seconds);
}

static size_t count_words(const char *s)
{
	size_t n = 0;

	for (const char *p = s; p && *p; p += strspn(p, " "))
		if (*p != ' ') {
			n++;
			p += strcspn(p, " ");
		}
	return n;
}

/* The name of argument i of cmd, for an error. */
static const char *arg_name(const struct vc_cmd *cmd, size_t i, char *buf, size_t len)
{
	const char *p = cmd->args;

	for (; i > 0; i--)
		p += strcspn(p, " ") + 1;
	snprintf(buf, len, "%.*s", (int)strcspn(p, " "), p);
	return buf;
}

void vc_parse(const struct vc_cmd *cmds, size_t n, int argc, char **argv, struct vc_call *c)
{
	const char *env = getenv("VMIGD_CONTROL");
	size_t want;
	int i, words;
	char name[64];

	memset(c, 0, sizeof(*c));
	c->control = VMIGD_DEFAULT_CONTROL;
	c->control_from = "default";
	if (env && *env) {
		c->control = env;
		c->control_from = "$VMIGD_CONTROL";
	}
	i = parse_opts(NULL, argc, argv, c, cmds, n);
	if (i >= argc) {
		/* `vmigctl -c status`: -c took the command as its path */
		for (size_t k = 0; k < n && c->control_from[0] == '-'; k++)
			if (strcspn(cmds[k].name, " ") == strlen(c->control) &&
			    strncmp(cmds[k].name, c->control, strlen(c->control)) == 0)
				vc_usage_error(NULL, "no command (\"-c\" took \"%s\" as the path)",
					       c->control);
		vc_usage_error(NULL, "no command given");
	}
	if (strcmp(argv[i], "help") == 0) {
		if (i + 1 >= argc) {
			main_help(cmds, n);
			exit(VC_EXIT_OK);
		}
		c->cmd = find_cmd(cmds, n, argc - i - 1, argv + i + 1, &words);
		if (i + 1 + words < argc)
			vc_usage_error(NULL, "unexpected argument \"%s\" for \"help\"",
				       argv[i + 1 + words]);
		cmd_help(c->cmd);
		exit(VC_EXIT_OK);
	}
	c->cmd = find_cmd(cmds, n, argc - i, argv + i, &words);
	/* argv[0] for getopt: the command's last word, options and arguments after it */
	i += words - 1;
	argc -= i;
	argv += i;
	parse_opts(c->cmd, argc, argv, c, cmds, n);
	want = count_words(c->cmd->args);
	if ((size_t)c->nargs < want)
		vc_usage_error(c->cmd, "\"%s\" needs %s", c->cmd->name,
			       arg_name(c->cmd, c->nargs, name, sizeof(name)));
	if ((size_t)c->nargs > want)
		vc_usage_error(c->cmd, "unexpected argument \"%s\" for \"%s\"", c->args[want],
			       c->cmd->name);
	check_opts(c);
}

const char *vc_opt_val(const struct vc_call *c, int id)
{
	const char *v = NULL;

	for (int i = 0; i < c->ngiven; i++)
		if (c->given[i].opt->id == id)
			v = c->given[i].val;
	return v;
}

bool vc_opt_has(const struct vc_call *c, int id)
{
	for (int i = 0; i < c->ngiven; i++)
		if (c->given[i].opt->id == id)
			return true;
	return false;
}

/* ---- bash completion ---- */

/* The words of every visible command's first word, each once. */
static void print_first_words(const struct vc_cmd *cmds, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		size_t len = strcspn(cmds[i].name, " ");
		size_t j;

		if (cmds[i].hidden)
			continue;
		for (j = 0; j < i; j++)
			if (!cmds[j].hidden && strcspn(cmds[j].name, " ") == len &&
			    strncmp(cmds[j].name, cmds[i].name, len) == 0)
				break;
		if (j == i)
			printf(" %.*s", (int)len, cmds[i].name);
	}
}

#define MAX_ALL (4 * MAX_OPTS)

/* Every option of every command that takes a value, and the common ones, each name once. */
static size_t all_valued(const struct vc_cmd *cmds, size_t n, const struct vc_opt **all)
{
	const struct vc_opt *list[MAX_OPTS];
	size_t nall = 0;

	for (size_t i = 0; i <= n; i++) {
		size_t k = 0, nl = 0;

		if (i < n && !cmds[i].hidden)
			nl = cmd_opts(&cmds[i], list);
		for (const struct vc_opt *o = common_opts; i == n && o->name; o++)
			list[nl++] = o;
		for (; k < nl; k++) {
			size_t j;

			for (j = 0; j < nall && strcmp(all[j]->name, list[k]->name); j++)
				;
			if (list[k]->arg && j == nall && nall < MAX_ALL)
				all[nall++] = list[k];
		}
	}
	return nall;
}

/* A case pattern, "--a|-a|--b", of the options that take a value completed as complete (NULL:
 * all of them); "--" if none. */
static void print_valued(const struct vc_cmd *cmds, size_t n, const char *complete)
{
	const struct vc_opt *all[MAX_ALL];
	size_t nall = all_valued(cmds, n, all);
	bool first = true;

	for (size_t i = 0; i < nall; i++) {
		const struct vc_opt *o = all[i];

		if (complete && (!o->complete || strcmp(o->complete, complete)))
			continue;
		printf("%s--%s", first ? "" : "|", o->name);
		if (letter_of(o->id))
			printf("|-%c", letter_of(o->id));
		first = false;
	}
	if (first)
		printf("--");
}

/* _vmigctl's first half: the words before the cursor, read as vmigctl reads them (the command,
 * its arguments counted, option values skipped, -c PATH kept). */
static void print_scan(const struct vc_cmd *cmds, size_t n)
{
	printf("_vmigctl()\n{\n"
	       "\tlocal cur prev words cword\n"
	       "\tif declare -F _get_comp_words_by_ref >/dev/null; then\n"
	       "\t\t_get_comp_words_by_ref -n =: cur prev words cword\n"
	       "\telse\n"
	       "\t\tcur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}\n"
	       "\t\twords=(\"${COMP_WORDS[@]}\") cword=$COMP_CWORD\n"
	       "\tfi\n"
	       "\tlocal i w cmd= nargs=0 value= ctl=() opts= keys=- prog=${words[0]}\n"
	       "\tCOMPREPLY=()\n"
	       "\tfor ((i = 1; i < cword; i++)); do\n"
	       "\t\tw=${words[i]}\n"
	       "\t\tif [[ -n $value ]]; then\n"
	       "\t\t\t[[ $value == -c ]] && ctl=(-c \"$w\")\n"
	       "\t\t\tvalue=\n"
	       "\t\t\tcontinue\n"
	       "\t\tfi\n"
	       "\t\tcase $w in\n"
	       "\t\t-c | --control) value=-c; continue ;;\n"
	       "\t\t--control=*) ctl=(-c \"${w#--control=}\"); continue ;;\n"
	       "\t\t");
	print_valued(cmds, n, NULL);
	printf(") value=$w; continue ;;\n"
	       "\t\t-*) continue ;;\n"
	       "\t\tesac\n"
	       "\t\tif [[ -z $cmd ]]; then\n"
	       "\t\t\tcmd=$w\n"
	       "\t\telif [[ $cmd == help ]]; then\n"
	       "\t\t\t:\n"
	       "\t\telse\n"
	       "\t\t\tcase $cmd in\n");
	/* the first words of two-word commands take their second word */
	for (size_t i = 0; i < n; i++) {
		size_t len = strcspn(cmds[i].name, " ");
		size_t j;

		if (!cmds[i].name[len] || cmds[i].hidden)
			continue;
		for (j = 0; j < i && strncmp(cmds[j].name, cmds[i].name, len + 1); j++)
			;
		if (j == i)
			printf("\t\t\t%.*s) cmd=\"$cmd $w\"; continue ;;\n", (int)len,
			       cmds[i].name);
	}
	printf("\t\t\tesac\n"
	       "\t\t\tnargs=$((nargs + 1))\n"
	       "\t\tfi\n"
	       "\tdone\n");
}

/* _vmigctl's second half: the words that fit at the cursor. */
static void print_complete(const struct vc_cmd *cmds, size_t n)
{
	const struct vc_opt *all[MAX_ALL], *list[MAX_OPTS];
	size_t nall, nl;

	printf("\tif [[ -n $value ]]; then\n"
	       "\t\tcase $value in\n"
	       "\t\t");
	print_valued(cmds, n, "@file");
	printf(") COMPREPLY=($(compgen -f -- \"$cur\")) ;;\n\t\t");
	print_valued(cmds, n, "@dir");
	printf(") COMPREPLY=($(compgen -d -- \"$cur\")) ;;\n");
	nall = all_valued(cmds, n, all);
	for (size_t i = 0; i < nall; i++)
		if (all[i]->complete && all[i]->complete[0] != '@')
			printf("\t\t--%s) COMPREPLY=($(compgen -W \"%s\" -- \"$cur\")) ;;\n",
			       all[i]->name, all[i]->complete);
	printf("\t\tesac\n"
	       "\t\treturn\n"
	       "\tfi\n"
	       "\tcase $cmd in\n");
	for (size_t i = 0; i < n; i++) {
		if (cmds[i].hidden)
			continue;
		printf("\t\"%s\") opts=\"", cmds[i].name);
		nl = cmd_opts(&cmds[i], list);
		for (size_t k = 0; k < nl; k++)
			printf("--%s ", list[k]->name);
		printf("\"");
		if (cmds[i].keys)
			printf(" keys=%s", cmds[i].keys[0] ? cmds[i].keys : "''");
		printf(" ;;\n");
	}
	printf("\tesac\n"
	       "\tif [[ $cur == -* ]]; then\n"
	       "\t\tCOMPREPLY=($(compgen -W \"$opts--control --json --help%s\" -- \"$cur\"))\n"
	       "\telif [[ -z $cmd || $cmd == help ]]; then\n"
	       "\t\tCOMPREPLY=($(compgen -W \"",
	       " --version");
	print_first_words(cmds, n);
	printf(" help\" -- \"$cur\"))\n"
	       "\telse\n"
	       "\t\tcase $cmd in\n");
	for (size_t i = 0; i < n; i++) {
		size_t len = strcspn(cmds[i].name, " ");
		size_t j;

		if (!cmds[i].name[len] || cmds[i].hidden)
			continue;
		for (j = 0; j < i && strncmp(cmds[j].name, cmds[i].name, len + 1); j++)
			;
		if (j < i)
			continue;
		printf("\t\t%.*s) COMPREPLY=($(compgen -W \"", (int)len, cmds[i].name);
		for (j = i; j < n; j++)
			if (strncmp(cmds[j].name, cmds[i].name, len + 1) == 0)
				printf("%s%s", j > i ? " " : "", cmds[j].name + len + 1);
		printf("\" -- \"$cur\")) ;;\n");
	}
	printf("\t\t*)\n"
	       "\t\t\t[[ $keys != - && $nargs == 0 ]] &&\n"
	       "\t\t\t\tCOMPREPLY=($(compgen -W \"$(_vmigctl_keys \"$keys\" \"${ctl[@]}\")\" -- "
	       "\"$cur\"))\n"
	       "\t\t\t;;\n"
	       "\t\tesac\n"
	       "\tfi\n"
	       "}\n");
}

void vc_print_bash_completion(const struct vc_cmd *cmds, size_t n)
{
	printf("# bash completion for vmigctl(8), made by `vmigctl completion bash` from its "
	       "command table.\n\n"
	       "# The keys of `vmigctl list` in role $1 (empty: any); then vmigctl's -c PATH. "
	       "$prog is\n"
	       "# the vmigctl being completed (_vmigctl's).\n"
	       "_vmigctl_keys()\n{\n"
	       "\tlocal role=$1 key r rest\n"
	       "\tshift\n"
	       "\t\"$prog\" \"$@\" list 2>/dev/null | while read -r key r rest; do\n"
	       "\t\t[[ -z $role || $r == \"$role\" ]] && printf '%%s\\n' \"$key\"\n"
	       "\tdone\n}\n\n");
	print_scan(cmds, n);
	print_complete(cmds, n);
	printf("\ncomplete -F _vmigctl vmigctl\n");
}
