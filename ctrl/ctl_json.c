// SPDX-License-Identifier: Apache-2.0
/* json-c helpers for ctrl/: strings that are safe to use as C strings. */
#include <string.h>

#include "ctl_json.h"

/* A JSON string may hold NUL; a C string would silently end there, so refuse it. */
const char *ctl_json_cstring(struct json_object *v)
{
	const char *s;

	if (!json_object_is_type(v, json_type_string))
		return NULL;
	s = json_object_get_string(v);
	return strlen(s) == (size_t)json_object_get_string_len(v) ? s : NULL;
}

const char *ctl_json_member_cstring(struct json_object *o, const char *name)
{
	struct json_object *v;

	return json_object_object_get_ex(o, name, &v) ? ctl_json_cstring(v) : NULL;
}
