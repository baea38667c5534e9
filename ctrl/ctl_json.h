/* SPDX-License-Identifier: Apache-2.0 */
/* Small json-c helpers shared by the control protocol and the port map's JSON form. */
#ifndef CTL_JSON_H
#define CTL_JSON_H

#include <json-c/json.h>

/*
 * The C string of a JSON string, or NULL when v is not a string or holds a NUL, where a C string
 * would silently end. The _member form looks up name in object o first.
 */
const char *ctl_json_cstring(struct json_object *v);
const char *ctl_json_member_cstring(struct json_object *o, const char *name);

#endif
