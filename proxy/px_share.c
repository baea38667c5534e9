// SPDX-License-Identifier: Apache-2.0
/* Water-filling: repeatedly hand every migration whose limit is below the current equal share its
 * limit, and split what is left equally among the rest. O(n^2) for n migrations; n is small. */
#include <stdbool.h>

#include "px_share.h"

#define UNSET UINT64_MAX

static uint64_t limit_of(const struct px_share_in *in)
{
	uint64_t cap = in->cap ? in->cap : UINT64_MAX;

	return in->demand < cap ? in->demand : cap;
}

void px_share(uint64_t total, unsigned int n, const struct px_share_in *in, uint64_t *out)
{
	unsigned int left = n;
	uint64_t rest = total, level;
	bool changed = true;

	if (total == 0) {
		for (unsigned int i = 0; i < n; i++)
			out[i] = in[i].cap;
		return;
	}
	for (unsigned int i = 0; i < n; i++)
		out[i] = UNSET;
	while (left > 0 && changed) {
		changed = false;
		level = rest / left;
		for (unsigned int i = 0; i < n; i++) {
			uint64_t lim = limit_of(&in[i]);

			if (out[i] != UNSET || lim > level)
				continue;
			out[i] = lim;
			rest -= lim;
			left--;
			changed = true;
		}
	}
	level = left ? rest / left : 0;
	for (unsigned int i = 0; i < n; i++) {
		if (out[i] == UNSET)
			out[i] = level;
		if (out[i] == 0)
			out[i] = 1;
	}
}
