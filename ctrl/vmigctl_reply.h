/* SPDX-License-Identifier: Apache-2.0 */
/* vmigctl's reading of replies: fields of the JSON reply, figures as text by the unit their table
 * gives them (ctl_figures.h), and replies of version 1 daemons moved into the version 2 shape. */
#ifndef VMIGCTL_REPLY_H
#define VMIGCTL_REPLY_H

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctl_figures.h"

/* Fields of a reply object: a string ("-" when missing or null), a boolean (false when missing),
 * an object (NULL when missing or not one). o may be NULL. */
const char *vc_str_field(struct json_object *o, const char *name);
bool vc_bool_field(struct json_object *o, const char *name);
struct json_object *vc_obj_field(struct json_object *o, const char *name);

/*
 * The value at a figure's key in o, "member" or "group.member". *found is false where the key is
 * not there, or its group is not (or is null: a convergence's "job" before the first sample).
 */
struct json_object *vc_at(struct json_object *o, const char *key, bool *found);

/* 0 when missing: the figures are counters, rates and caps, where 0 reads as none. */
uint64_t vc_u64_at(struct json_object *o, const char *key);

/* A measured rate: "0 B/s" when idle (vm_format_rate's 0 is a cap's "unlimited"). */
char *vc_speed(uint64_t v, char *buf, size_t len);

/* A figure's value as text by its unit ("1.5 GiB", "52.4 MiB/s", "-" for null), in buf. */
char *vc_value_text(const struct ctl_fig *f, struct json_object *v, char *buf, size_t len);

/* The figures of t in o that share the line tag, as the table writes them. */
char *vc_figure_line(const struct ctl_table *t, struct json_object *o, const char *tag, char *line,
		     size_t len);

/* Every line of t's figures in o: the first after indent and title, the others indented more.
 * Lines whose tag is in but[] are left out. */
void vc_print_figures(const struct ctl_table *t, struct json_object *o, const char *indent,
		      const char *title, const char *const *but);

/*
 * A reply without "version" comes from a daemon of reply version 1 (before the figure tables, see
 * doc/interfaces.md): its keys move to where version 2 has them, so that one printer serves
 * both during a rollout. Figures version 1 did not have stay missing and print as "-".
 */
struct json_object *vc_reply_v2(struct json_object *reply);

#endif
