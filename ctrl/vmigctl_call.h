/* SPDX-License-Identifier: Apache-2.0 */
/* vmigctl's exchange with vmigd: one request and one reply on the control socket, and a run's
 * failures, each with its exit status (vmigctl_args.h) and, with --json, as JSON on stdout. */
#ifndef VMIGCTL_CALL_H
#define VMIGCTL_CALL_H

#include <json-c/json.h>

#include "vmigctl_args.h"

/* This run's command line (its control socket, --json); once, before the first call. */
void vc_call_setup(const struct vc_call *c);

/* A new request {"op":op[,"key":key]}, owned here until the next one or exit. */
struct json_object *vc_request(const char *op, const char *key);

/* Sends req and returns the reply once it says "ok" (owned here until the next call or exit).
 * Any failure ends the run: no daemon (VC_EXIT_NO_DAEMON), busy (VC_EXIT_BUSY), a refusal or
 * no valid reply (VC_EXIT_REFUSED). A reply's "note" goes to stderr. */
struct json_object *vc_call(struct json_object *req);

/* One object on one line of stdout: what --json prints, replies and errors alike. */
void vc_print_json(struct json_object *o);

/*
 * Ends the run with exit status code: one line on stderr; with --json also, on stdout,
 * {"ok":false,"error":MSG,"code":"ENAME","errno":N} (code and errno when err, an errno, is
 * not 0).
 */
void vc_fail(int code, int err, const char *fmt, ...)
	__attribute__((noreturn, format(printf, 3, 4)));

#endif
