// SPDX-License-Identifier: Apache-2.0
/* Logical port ids as operators write them. The port map's JSON form is in ctrl/ctl_portmap.c. */
#include <errno.h>
#include <string.h>

#include "px_portmap.h"

int px_port_parse(const char *s, uint32_t *ret)
{
	uint32_t n = 0;

	if (!*s || strlen(s) > 5)
		return -EINVAL;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -EINVAL;
		n = n * 10 + (*s - '0');
	}
	if (n > PX_PORT_MAX)
		return -EINVAL;
	*ret = n;
	return 0;
}
