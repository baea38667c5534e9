/* SPDX-License-Identifier: Apache-2.0 */
/* The port map's JSON forms: the object `vmigctl target start` prints and `vmigctl source start
 * --target` takes back verbatim, in vmigd's own form or KubeVirt's (targetNodeAddress and
 * targetDirectMigrationNodePorts). Encoding, decoding and validation. */
#ifndef CTL_PORTMAP_H
#define CTL_PORTMAP_H

#include <json-c/json.h>
#include <stddef.h>

#include "px_portmap.h"

#define CTL_PORTMAP_VERSION 1

/* A new json object, owned by the caller (json_object_put). NULL on ENOMEM. */
struct json_object *ctl_portmap_to_json(const struct px_portmap *t);
/* 0, or -EINVAL with a one-line reason in err. *ret is written only on success. */
int ctl_portmap_from_json(struct json_object *o, struct px_portmap *ret, char *err, size_t errlen);

#endif
