/* SPDX-License-Identifier: Apache-2.0 */
/* vmigctl's command line: one table of commands (words, options, arguments, a line of help) from
 * which the parsing (getopt_long per command), the help, the errors and the bash completion all
 * come. The commands themselves are in vmigctl.c; nothing here talks to vmigd. */
#ifndef VMIGCTL_ARGS_H
#define VMIGCTL_ARGS_H

#include <stdbool.h>
#include <stddef.h>

/* vmigctl's exit status (vmigctl(8), EXIT STATUS). */
enum vc_exit {
	VC_EXIT_OK = 0,
	VC_EXIT_REFUSED = 1,   /* vmigd refused the request, or sent no valid reply */
	VC_EXIT_USAGE = 2,     /* the command line is wrong: nothing was sent */
	VC_EXIT_NO_DAEMON = 3, /* nothing to connect to at the control socket */
	VC_EXIT_BUSY = 4,      /* vmigd turned the connection away (its client cap): try again */
};

/* Option flags. */
enum {
	VC_OPT_REQUIRED = 1 << 0, /* the command needs it */
	VC_OPT_REPEAT = 1 << 1,	  /* may be given more than once (else: a usage error) */
};

/* One option of a command: --name, with a value named arg or none. */
struct vc_opt {
	const char *name; /* without the dashes */
	int id;		  /* the command's own number for it, what its handler switches on */
	const char *arg;  /* what the value is, for help ("PORTID=UNIXPATH"); NULL: a flag */
	const char *help;
	unsigned int flags;
	int group;	      /* options of the same non-zero group exclude each other */
	const char *complete; /* the value's completion: "@file", "@dir", or words; NULL: none */
};

/* An option as given, in command-line order. */
struct vc_given {
	const struct vc_opt *opt;
	const char *val; /* NULL for a flag */
};

struct vc_call;

struct vc_cmd {
	const char *name;	   /* its words: "target start", "list" */
	const char *args;	   /* its arguments' names, by spaces ("KEY RATE"); NULL: none */
	const char *help;	   /* one line */
	const struct vc_opt *opts; /* ends with a NULL name; NULL: none of its own */
	const struct vc_opt *also; /* more, shared with other commands; NULL: none */
	void (*run)(const struct vc_call *c);
	const char *keys; /* completes its first argument from `list`: "" any key, or
			   * a role's; NULL: not a key of a running migration */
	bool hidden;	  /* left out of the help */
};

/* A parsed command line. */
struct vc_call {
	const struct vc_cmd *cmd;
	char **args; /* the arguments, as many as cmd->args names */
	int nargs;
	struct vc_given *given; /* cmd's options (not the common ones) */
	int ngiven;
	bool json;
	const char *control;	  /* the control socket */
	const char *control_from; /* where that came from: "-c", "$VMIGD_CONTROL" or "default" */
};

/* The options every command takes, before or after its words. */
enum { VC_OPT_CONTROL = -1, VC_OPT_JSON = -2, VC_OPT_HELP = -3, VC_OPT_VERSION = -4 };

/*
 * Parses argv by the table cmds (n of them) into *c. --help, --version and `help` print to stdout
 * and exit 0; a wrong command line prints one line naming the offending word and exits
 * VC_EXIT_USAGE. Returns only with a command to run.
 */
void vc_parse(const struct vc_cmd *cmds, size_t n, int argc, char **argv, struct vc_call *c);

/* A usage error of c's command (NULL: of the command line): one line, then exit VC_EXIT_USAGE. */
void vc_usage_error(const struct vc_cmd *cmd, const char *fmt, ...)
	__attribute__((noreturn, format(printf, 2, 3)));

/* The last value given for option id (NULL if none); has: whether it was given. */
const char *vc_opt_val(const struct vc_call *c, int id);
bool vc_opt_has(const struct vc_call *c, int id);

/* The bash completion script, from the table, on stdout. */
void vc_print_bash_completion(const struct vc_cmd *cmds, size_t n);

#endif
