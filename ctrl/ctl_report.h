/* SPDX-License-Identifier: Apache-2.0 */
/* The daemon's figures read through the tables of ctl_figures.h: one figure's value (for JSON and
 * Prometheus alike), and the JSON objects of a node and of a migration that status, list and
 * metrics reply with. Pure; not part of vmigctl. */
#ifndef CTL_REPORT_H
#define CTL_REPORT_H

#include <stdbool.h>

#include "ctl_figures.h"

struct json_object;

/* The clocks, now. */
void ctl_env_now(struct ctl_env *env);

/*
 * Whether f has a value in obj (the struct its table describes): its group and its own condition
 * hold (ctl_fig.absent). Without one, Prometheus has no sample; JSON shows null or nothing.
 */
bool ctl_fig_present(const struct ctl_fig *f, const void *obj);
/* How many values f has: a vector's elements (CTL_C_COUNTS), else 1. */
unsigned int ctl_fig_count(const struct ctl_fig *f);
/* f's value i (0 for all but vectors) in obj. */
void ctl_fig_read(const struct ctl_fig *f, const void *obj, const struct ctl_env *env,
		  unsigned int i, struct ctl_value *v);

/* Adds the figures of t in obj to o, making the objects of groups ("rates": {...}) as needed. */
void ctl_report_figures(struct json_object *o, const struct ctl_table *t, const void *obj,
			const struct ctl_env *env);
/* New JSON objects (json-c references); doc/interfaces.md has their shape. */
struct json_object *ctl_report_node(const struct px_node_info *ni, const struct ctl_env *env);
/* cv: the migration's convergence report, NULL when it has none ("convergence": null); nic:
 * what carries its node hop, NULL when not known ("nic": null). */
struct json_object *ctl_report_migration(const struct px_migration_info *mi,
					 const struct cv_report *cv, const struct ctl_nic_view *nic,
					 const struct ctl_env *env);
/* A "nic" object, or NULL for JSON null. */
struct json_object *ctl_report_nic(const struct ctl_nic_view *nic, const struct ctl_env *env);

#endif
