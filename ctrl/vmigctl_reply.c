// SPDX-License-Identifier: Apache-2.0
/* vmigctl's reading of replies (vmigctl_reply.h): the commands are in vmigctl.c. Text only: no
 * socket, no daemon code. */
#include <inttypes.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "units.h"
#include "vmigctl_reply.h"

/* ---- reading replies ---- */

const char *vc_str_field(struct json_object *o, const char *name)
{
	struct json_object *v;

	/* "-" for a field left out or null, so that printf never sees NULL. */
	return o && json_object_object_get_ex(o, name, &v) && v ? json_object_get_string(v) : "-";
}

bool vc_bool_field(struct json_object *o, const char *name)
{
	struct json_object *v;

	return o && json_object_object_get_ex(o, name, &v) && json_object_get_boolean(v);
}

struct json_object *vc_obj_field(struct json_object *o, const char *name)
{
	struct json_object *v;

	if (!o || !json_object_object_get_ex(o, name, &v) ||
	    !json_object_is_type(v, json_type_object))
		return NULL;
	return v;
}

/*
 * The value at a figure's key in o, "member" or "group.member". *found is false where the key is
 * not there, or its group is not (or is null: a convergence's "job" before the first sample).
 */
struct json_object *vc_at(struct json_object *o, const char *key, bool *found)
{
	const char *dot = strchr(key, '.');
	struct json_object *v = NULL;
	char group[64];

	*found = false;
	if (dot) {
		snprintf(group, sizeof(group), "%.*s", (int)(dot - key), key);
		o = vc_obj_field(o, group);
		key = dot + 1;
	}
	if (o && json_object_is_type(o, json_type_object))
		*found = json_object_object_get_ex(o, key, &v);
	return v;
}

/* 0 when missing: the figures are counters, rates and caps, where 0 reads as none. */
uint64_t vc_u64_at(struct json_object *o, const char *key)
{
	bool found;
	struct json_object *v = vc_at(o, key, &found);

	return v ? json_object_get_uint64(v) : 0;
}

/* ---- figures as text, by their unit (ctl_figures.h) ---- */

/* A measured rate: "0 B/s" when idle (vm_format_rate's 0 is a cap's "unlimited"). */
char *vc_speed(uint64_t v, char *buf, size_t len)
{
	if (v == 0) {
		snprintf(buf, len, "0 B/s");
		return buf;
	}
	return vm_format_rate(v, buf, len);
}

static bool is_zero(struct json_object *v)
{
	if (!v)
		return true;
	switch (json_object_get_type(v)) {
	case json_type_boolean:
		return !json_object_get_boolean(v);
	case json_type_int:
		return json_object_get_int64(v) <= 0;
	case json_type_double:
		return json_object_get_double(v) <= 0;
	case json_type_string:
		return json_object_get_string_len(v) == 0;
	case json_type_object:
		json_object_object_foreach (v, name, val) {
			(void)name;
			if (!is_zero(val))
				return false;
		}
		return true;
	default:
		return false;
	}
}

/* "1.5 s", or "250 ms" below a second. */
static char *duration(double ms, char *buf, size_t len)
{
	if (ms < 0)
		snprintf(buf, len, "-");
	else if (ms < 1000)
		snprintf(buf, len, "%.0f ms", ms);
	else
		snprintf(buf, len, "%.1f s", ms / 1000);
	return buf;
}

/* A figure's value as text; "-" for null. A vector: "NAME N, ..." (non-zero ones with
 * CTL_TXT_NONZERO). Returns buf or a constant. */
static const char *unit_text(const struct ctl_fig *f, struct json_object *v, char *buf, size_t len)
{
	if (!v)
		return "-";
	if (json_object_is_type(v, json_type_object)) {
		size_t n = 0;

		buf[0] = '\0';
		json_object_object_foreach (v, name, val) {
			if ((f->flags & CTL_TXT_NONZERO) && is_zero(val))
				continue;
			n += snprintf(buf + n, n < len ? len - n : 0, "%s%s %s", n ? ", " : "",
				      name, json_object_get_string(val));
		}
		return buf;
	}
	switch (f->unit) {
	case CTL_BYTES:
		return vm_format_bytes(json_object_get_uint64(v), buf, len);
	case CTL_RATE:
		return vc_speed(json_object_get_uint64(v), buf, len);
	case CTL_CAP:
		return vm_format_rate(json_object_get_uint64(v), buf, len);
	case CTL_MS:
		return duration(json_object_get_int64(v), buf, len);
	case CTL_SECONDS:
		if (json_object_get_double(v) < 0)
			return "-";
		snprintf(buf, len, "%.1f s", json_object_get_double(v));
		return buf;
	case CTL_BOOL:
		return json_object_get_boolean(v) ? "yes" : "no";
	case CTL_COUNT:
		if (json_object_is_type(v, json_type_int) && json_object_get_int64(v) < 0)
			return "-";
		break;
	case CTL_STR:
		break;
	}
	/* Strings come from the wire (a machine type): one line each, printable. */
	snprintf(buf, len, "%s", json_object_get_string(v));
	for (char *c = buf; *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			*c = '?';
	return buf[0] ? buf : "-";
}

/* The same, always in buf, which it returns. */
char *vc_value_text(const struct ctl_fig *f, struct json_object *v, char *buf, size_t len)
{
	const char *t = unit_text(f, v, buf, len);

	if (t != buf)
		snprintf(buf, len, "%s", t);
	return buf;
}

/* Appends one figure of o, in its text form, to line. */
static void append_figure(char *line, size_t len, const struct ctl_fig *f, struct json_object *o)
{
	size_t n = strlen(line);
	struct json_object *v;
	char val[256];
	bool found;

	v = vc_at(o, f->key, &found);
	if (!found || ((f->flags & CTL_TXT_NONZERO) && is_zero(v)))
		return;
	if (f->unit == CTL_BOOL) {
		const char *bar = strchr(f->text, '|');

		if (!v)
			return;
		if (json_object_get_boolean(v))
			snprintf(line + n, len - n, "%.*s", (int)(bar ? bar - f->text : 256),
				 f->text);
		else if (bar)
			snprintf(line + n, len - n, "%s", bar + 1);
		return;
	}
	/* The table's own format, with one %s for the value. */
	snprintf(line + n, len - n, f->text, vc_value_text(f, v, val, sizeof(val)));
}

/* The figures of t in o that share the line tag, as the table writes them. */
char *vc_figure_line(const struct ctl_table *t, struct json_object *o, const char *tag, char *line,
		     size_t len)
{
	size_t skip = 0;

	line[0] = '\0';
	for (size_t k = 0; k < t->n; k++)
		if (t->figs[k].text && t->figs[k].line && strcmp(t->figs[k].line, tag) == 0)
			append_figure(line, len, &t->figs[k], o);
	/* The first figure's separator has nothing to separate. */
	if (strncmp(line, ", ", 2) == 0)
		skip = 2;
	else if (line[0] == ' ')
		skip = 1;
	memmove(line, line + skip, strlen(line + skip) + 1);
	return line;
}

/* Every line of t's figures in o: the first after indent and title, the others indented more.
 * Lines whose tag is in but[] are left out. */
void vc_print_figures(const struct ctl_table *t, struct json_object *o, const char *indent,
		      const char *title, const char *const *but)
{
	bool first = true;

	for (size_t k = 0; k < t->n; k++) {
		const char *tag = t->figs[k].line;
		char line[2048];
		size_t j;

		if (!tag)
			continue;
		for (j = 0; j < k && (!t->figs[j].line || strcmp(t->figs[j].line, tag)); j++)
			;
		if (j < k) /* printed already */
			continue;
		for (j = 0; but && but[j] && strcmp(but[j], tag); j++)
			;
		if (but && but[j])
			continue;
		vc_figure_line(t, o, tag, line, sizeof(line));
		if (!line[0])
			continue;
		printf("%s%s%s%s\n", indent, first ? "" : "  ", first ? title : "", line);
		first = false;
	}
}

/* ---- replies of daemons before reply version 2 ---- */

/* Adds v to o at path, "member" or "group.member..." (groups made as needed). */
static void put_path(struct json_object *o, const char *path, struct json_object *v)
{
	const char *dot = strchr(path, '.');
	struct json_object *g;
	char group[64];

	if (!dot) {
		json_object_object_add(o, path, v);
		return;
	}
	snprintf(group, sizeof(group), "%.*s", (int)(dot - path), path);
	g = vc_obj_field(o, group);
	if (!g) {
		g = json_object_new_object();
		json_object_object_add(o, group, g);
	}
	put_path(g, dot + 1, v);
}

/* Moves o's "from" to path "to". */
static void move_key(struct json_object *o, const char *from, const char *to)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, from, &v))
		return;
	json_object_get(v);
	json_object_object_del(o, from);
	put_path(o, to, v);
}

/*
 * Moves the figures of table t in o from their version 1 keys (the table's v1 column). Only
 * scalars move: where a v1 key is now a group's or a list's name ("connections"), a v1 reply's
 * value of that key is the figure, a v2-shaped one's the list.
 */
static void figures_from_v1(struct json_object *o, const struct ctl_table *t)
{
	struct json_object *v;

	for (size_t i = 0; i < t->n; i++) {
		const struct ctl_fig *f = &t->figs[i];

		if (!f->v1 || !json_object_object_get_ex(o, f->v1, &v) ||
		    json_object_is_type(v, json_type_object) ||
		    json_object_is_type(v, json_type_array))
			continue;
		move_key(o, f->v1, f->key);
	}
}

/* A version 1 migration of list or status; a no-op on one of metrics, which had the new shape. */
static void migration_from_v1(struct json_object *m)
{
	struct json_object *ports;

	figures_from_v1(m, &ctl_migration_table);
	/* groups, not figures */
	move_key(m, "connection_list", "connections");
	move_key(m, "rate", "rates");
	if (json_object_object_get_ex(m, "ports", &ports) &&
	    json_object_is_type(ports, json_type_array))
		for (size_t i = 0; i < json_object_array_length(ports); i++)
			figures_from_v1(json_object_array_get_idx(ports, i), &ctl_port_table);
}

static void migrations_from_v1(struct json_object *migs)
{
	if (!json_object_is_type(migs, json_type_array))
		return;
	for (size_t i = 0; i < json_object_array_length(migs); i++)
		migration_from_v1(json_object_array_get_idx(migs, i));
}

/*
 * A reply without "version" comes from a daemon of reply version 1 (before the figure tables, see
 * doc/interfaces.md): its keys move to where version 2 has them, so that one printer serves
 * both during a rollout. Figures version 1 did not have stay missing and print as "-".
 */
struct json_object *vc_reply_v2(struct json_object *reply)
{
	struct json_object *s, *node, *v;

	if (json_object_object_get_ex(reply, "version", NULL))
		return reply;
	if (json_object_object_get_ex(reply, "migrations", &v))
		migrations_from_v1(v);
	node = vc_obj_field(reply, "node");
	if (node)
		figures_from_v1(node, &ctl_node_table);
	/* version 1's status had the node's figures at its top, under names of its own */
	s = vc_obj_field(reply, "status");
	if (s) {
		node = json_object_new_object();
		json_object_object_add(s, "node", node);
		move_key(s, "bandwidth", "node.bandwidth");
		move_key(s, "shaper", "node.shaper");
		move_key(s, "inspect", "node.inspect");
		move_key(s, "migrations", "node.migration_count");
		move_key(s, "connections_active", "node.conns.active");
		move_key(s, "migration_list", "migrations");
		if (json_object_object_get_ex(s, "migrations", &v))
			migrations_from_v1(v);
	}
	return reply;
}
