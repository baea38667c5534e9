// SPDX-License-Identifier: Apache-2.0
/* Reading figures out of the daemon's structs by their table entries, and the JSON objects built
 * from them. What a figure is and where it lives is ctl_figures.c's business, not this file's. */
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ctl_report.h"
#include "util.h"

void ctl_env_now(struct ctl_env *env)
{
	struct timespec ts;

	env->now_ms = vm_now_ms();
	clock_gettime(CLOCK_REALTIME, &ts);
	env->now_unix = ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *enum_name(enum ctl_names names, int v)
{
	switch (names) {
	case CTL_N_ROLE:
		return px_role_str(v);
	case CTL_N_SHAPER:
		return px_shaper_str(v);
	case CTL_N_INSP_KIND:
		return px_insp_kind_str(v);
	case CTL_N_CV_MODE:
		return cv_mode_str(v);
	case CTL_N_CV_STATUS:
		return cv_status_str(v);
	case CTL_N_CV_ACT:
		return cv_act_str(v);
	case CTL_N_OUTCOME:
		return px_outcome_str(v);
	case CTL_N_TLS_REFUSAL:
		return px_tls_refusal_str(v);
	case CTL_N_NONE:
		break;
	}
	return "unknown";
}

/* The member at g->off, memcpy'd: obj is any of the structs the tables describe. */
#define AT(type, obj, g)                                                                           \
	({                                                                                         \
		type x_;                                                                           \
		memcpy(&x_, (const char *)(obj) + (g)->off, sizeof(x_));                           \
		x_;                                                                                \
	})

/* A condition: the member is set (non-zero, true, a non-empty string); negate turns it round. */
static bool holds(const struct ctl_get *g, const void *obj)
{
	bool set;

	switch (g->type) {
	case CTL_C_U64:
		set = AT(uint64_t, obj, g) != 0;
		break;
	case CTL_C_I64:
		set = AT(int64_t, obj, g) != 0;
		break;
	case CTL_C_UINT:
		set = AT(unsigned int, obj, g) != 0;
		break;
	case CTL_C_INT:
	case CTL_C_ENUM:
		set = AT(int, obj, g) != 0;
		break;
	case CTL_C_BOOL:
		set = AT(bool, obj, g);
		break;
	case CTL_C_STR: {
		const char *s = AT(const char *, obj, g);

		set = s && *s;
		break;
	}
	case CTL_C_CHARS:
		set = *((const char *)obj + g->off) != '\0';
		break;
	default:
		set = true;
		break;
	}
	return set != g->negate;
}

bool ctl_fig_present(const struct ctl_fig *f, const void *obj)
{
	if (f->group_when.type && !holds(&f->group_when, obj))
		return false;
	if (f->absent == CTL_ALWAYS)
		return true;
	return holds(f->when.type ? &f->when : &f->get, obj);
}

unsigned int ctl_fig_count(const struct ctl_fig *f)
{
	return f->get.type == CTL_C_COUNTS ? f->get.last - f->get.first + 1 : 1;
}

void ctl_fig_read(const struct ctl_fig *f, const void *obj, const struct ctl_env *env,
		  unsigned int i, struct ctl_value *v)
{
	const struct ctl_get *g = &f->get;

	memset(v, 0, sizeof(*v));
	switch (g->type) {
	case CTL_C_U64:
		v->kind = CTL_V_U64;
		v->u = AT(uint64_t, obj, g);
		break;
	case CTL_C_UINT:
		v->kind = CTL_V_U64;
		v->u = AT(unsigned int, obj, g);
		break;
	case CTL_C_I64:
		v->kind = CTL_V_I64;
		v->i = AT(int64_t, obj, g);
		break;
	case CTL_C_INT:
		v->kind = CTL_V_I64;
		v->i = AT(int, obj, g);
		break;
	case CTL_C_BOOL:
		v->kind = CTL_V_BOOL;
		v->b = AT(bool, obj, g);
		break;
	case CTL_C_STR:
		v->s = AT(const char *, obj, g);
		if (!v->s)
			v->s = g->dflt;
		v->kind = v->s ? CTL_V_STR : CTL_V_NULL;
		break;
	case CTL_C_CHARS:
		v->kind = CTL_V_STR;
		v->s = (const char *)obj + g->off;
		break;
	case CTL_C_ENUM:
		v->kind = CTL_V_STR;
		v->s = enum_name(g->names, AT(int, obj, g));
		break;
	case CTL_C_COUNTS:
		v->kind = CTL_V_U64;
		v->u = ((const unsigned int *)((const char *)obj + g->off))[g->first + i];
		v->name = enum_name(g->names, g->first + i);
		break;
	case CTL_C_CALC:
		g->calc(obj, env, v);
		break;
	case CTL_C_NONE:
		break;
	}
}

static struct json_object *json_value(const struct ctl_fig *f, const struct ctl_value *v)
{
	switch (v->kind) {
	case CTL_V_U64:
		if (f->unit == CTL_SECONDS)
			return json_object_new_double(v->u / 1000.0);
		return json_object_new_uint64(v->u);
	case CTL_V_I64:
		if (f->unit == CTL_SECONDS)
			return json_object_new_double(v->i / 1000.0);
		return json_object_new_int64(v->i);
	case CTL_V_BOOL:
		return json_object_new_boolean(v->b);
	case CTL_V_STR:
		return json_object_new_string(v->s);
	case CTL_V_NULL:
		break;
	}
	return NULL;
}

/* A figure's JSON: its value, or for a vector an object of its elements by name. */
static struct json_object *json_figure(const struct ctl_fig *f, const void *obj,
				       const struct ctl_env *env)
{
	struct ctl_value v;
	struct json_object *o;

	if (f->get.type != CTL_C_COUNTS) {
		ctl_fig_read(f, obj, env, 0, &v);
		return json_value(f, &v);
	}
	o = json_object_new_object();
	for (unsigned int i = 0; i < ctl_fig_count(f); i++) {
		ctl_fig_read(f, obj, env, i, &v);
		json_object_object_add(o, v.name, json_value(f, &v));
	}
	return o;
}

void ctl_report_figures(struct json_object *o, const struct ctl_table *t, const void *obj,
			const struct ctl_env *env)
{
	for (size_t k = 0; k < t->n; k++) {
		const struct ctl_fig *f = &t->figs[k];
		const char *member = f->key, *dot = strchr(f->key, '.');
		struct json_object *parent = o;

		if (dot) {
			char group[64];

			snprintf(group, sizeof(group), "%.*s", (int)(dot - f->key), f->key);
			member = dot + 1;
			/* The group's first figure decides whether the group is null; a group of
			 * figures all omitted (OMIT_UNLESS) has no key until one is there. */
			if (!json_object_object_get_ex(o, group, &parent)) {
				if (f->absent == CTL_OMIT && f->when.type && !holds(&f->when, obj))
					continue;
				parent = f->group_when.type && !holds(&f->group_when, obj)
						 ? NULL
						 : json_object_new_object();
				json_object_object_add(o, group, parent);
			}
			if (!parent)
				continue;
		}
		if ((f->absent == CTL_NULL || f->absent == CTL_OMIT) &&
		    !holds(f->when.type ? &f->when : &f->get, obj)) {
			if (f->absent == CTL_NULL)
				json_object_object_add(parent, member, NULL);
			continue;
		}
		json_object_object_add(parent, member, json_figure(f, obj, env));
	}
}

static struct json_object *figures(const struct ctl_table *t, const void *obj,
				   const struct ctl_env *env)
{
	struct json_object *o = json_object_new_object();

	ctl_report_figures(o, t, obj, env);
	return o;
}

struct json_object *ctl_report_node(const struct px_node_info *ni, const struct ctl_env *env)
{
	return figures(&ctl_node_table, ni, env);
}

static struct json_object *conv_object(const struct cv_report *r, const struct ctl_env *env)
{
	struct json_object *o = figures(&ctl_conv_table, r, env), *acts = json_object_new_array();

	for (unsigned int i = 0; i < r->nactions && i < CV_ACTIONS_MAX; i++)
		json_object_array_add(acts, figures(&ctl_action_table, &r->actions[i], env));
	json_object_object_add(o, "actions", acts);
	return o;
}

struct json_object *ctl_report_nic(const struct ctl_nic_view *nic, const struct ctl_env *env)
{
	return nic ? figures(&ctl_nic_table, nic, env) : NULL;
}

struct json_object *ctl_report_migration(const struct px_migration_info *mi,
					 const struct cv_report *cv, const struct ctl_nic_view *nic,
					 const struct ctl_env *env)
{
	struct json_object *o = figures(&ctl_migration_table, mi, env);
	struct json_object *ports = json_object_new_array(), *conns = json_object_new_array();

	json_object_object_add(o, "inspect",
			       mi->inspected ? figures(&ctl_insp_summary_table, &mi->insp, env)
					     : NULL);
	for (unsigned int i = 0; i < mi->nports; i++)
		json_object_array_add(ports, figures(&ctl_port_table, &mi->ports[i], env));
	json_object_object_add(o, "ports", ports);
	for (unsigned int i = 0; i < mi->nconns; i++) {
		const struct px_conn_info *c = &mi->conns[i];
		struct json_object *co = figures(&ctl_conn_table, c, env);

		json_object_object_add(co, "inspect",
				       c->inspected ? figures(&ctl_insp_stats_table, &c->insp, env)
						    : NULL);
		json_object_array_add(conns, co);
	}
	json_object_object_add(o, "connections", conns);
	json_object_object_add(o, "convergence", cv ? conv_object(cv, env) : NULL);
	json_object_object_add(o, "nic", ctl_report_nic(nic, env));
	return o;
}
