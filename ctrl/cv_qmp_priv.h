/* SPDX-License-Identifier: Apache-2.0 */
/* The QMP backend's own header, shared by cv_qmp.c (the socket client and the backend's ops) and
 * cv_qmp_json.c (reading QEMU's replies, which the qmp fuzzer drives): limits and the calls between
 * the two files. Nothing outside ctrl/ includes it. */
#ifndef CV_QMP_PRIV_H
#define CV_QMP_PRIV_H

#include <stddef.h>

#include "cv_backend.h"

struct json_object;

/* QEMU sends each message as one line; a query-migrate reply is ~1 KiB, so 1 MiB is only ever
 * reached by something that is not QEMU, or a QEMU gone wrong. */
#define QMP_LINE_MAX (1u << 20)
#define QMP_ERR_MAX  256

/* cv_qmp_json.c */
/* One printable line: QEMU's texts and our own go to logs and status replies. */
void cv_qmp_one_line(char *s);
void __attribute__((format(printf, 3, 4)))
cv_qmp_fmt_err(char *err, size_t errlen, const char *fmt, ...);
/* mig, st: the "return" values of query-migrate and query-status, each may be NULL. */
int cv_qmp_job_from_json(struct json_object *mig, struct json_object *st, struct cv_job *out,
			 char *err, size_t errlen);
/* A whole text is one JSON object, whitespace around it allowed. NULL: not one. */
struct json_object *cv_qmp_parse_object(const char *text, size_t len);

#endif
