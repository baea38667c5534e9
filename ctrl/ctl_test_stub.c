// SPDX-License-Identifier: Apache-2.0
/* The product's ctl_test.h: no test options, figures, request fields or wrapped port. vmigd-test
 * links ctl_test.c. */
#include <stddef.h>

#include "ctl_test.h"

int ctl_test_init(int *argc, char **argv)
{
	return 0;
}

const struct xp_dhop_wrap *ctl_test_hop_wrap(void)
{
	return NULL;
}

void ctl_test_start(struct xp_loop *loop)
{
}
