/* SPDX-License-Identifier: Apache-2.0 */
/* The port map a target hands to its source: the JSON object `vmigctl target start` prints and
 * `vmigctl source start --target` takes back verbatim. Encoding, decoding and validation. */
#ifndef PX_TARGET_H
#define PX_TARGET_H

#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>

#include "px_preamble.h"

#define PX_PORTS_MAX	  8
#define PX_TARGET_VERSION 1
#define PX_HOST_MAX	  64

struct px_target_info {
	char key[PX_KEY_MAX + 1];
	char address[PX_HOST_MAX]; /* numeric IPv4 or IPv6 address, no brackets */
	unsigned int port;	   /* node-hop TCP port */
	unsigned int nports;
	uint32_t ports[PX_PORTS_MAX]; /* logical ports */
};

/* A new json object, owned by the caller (json_object_put). NULL on ENOMEM. */
struct json_object *px_target_to_json(const struct px_target_info *t);
/* 0, or -EINVAL with a one-line reason in err. *ret is written only on success. */
int px_target_from_json(struct json_object *o, struct px_target_info *ret, char *err,
			size_t errlen);
/*
 * The C string of a JSON string, or NULL when v is not a string or holds a NUL, where a C string
 * would silently end. The _member form looks up name in object o first.
 */
const char *px_json_cstring(struct json_object *v);
const char *px_json_member_cstring(struct json_object *o, const char *name);
/* Parses a logical port id ("49152"): 0 or -EINVAL. */
int px_port_parse(const char *s, uint32_t *ret);

#endif
