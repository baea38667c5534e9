// SPDX-License-Identifier: Apache-2.0
/* libFuzzer target for the frames of a resumable node hop (transport/xp_frame.h): every 16-byte
 * header of the input decoded; what decodes is within the protocol's bounds and re-encodes to
 * the same bytes, what does not leaves the output alone. */
#include <errno.h>
#include <string.h>

#include "fuzz.h"
#include "xp_frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	for (size_t at = 0; at + XP_FRAME_LEN <= size; at += XP_FRAME_LEN) {
		struct xp_frame f, canary;
		uint8_t buf[XP_FRAME_LEN];
		int r;

		memset(&f, 0xa5, sizeof(f));
		canary = f;
		r = xp_frame_get(data + at, &f);
		FUZZ_CHECK(r == 0 || r == -EBADMSG);
		if (r < 0) {
			FUZZ_CHECK(memcmp(&f, &canary, sizeof(f)) == 0);
			continue;
		}
		FUZZ_CHECK(f.type == XP_FRAME_DATA || f.type == XP_FRAME_ACK || f.type == XP_FRAME_END ||
			   f.type == XP_FRAME_GONE || f.type == XP_FRAME_PING ||
			   f.type == XP_FRAME_ZDATA);
		FUZZ_CHECK(f.type == XP_FRAME_DATA    ? f.len >= 1 && f.len <= XP_FRAME_MAX
			   : f.type == XP_FRAME_ZDATA ? f.len >= 1 && f.len <= XP_FRAME_ZMAX
						      : f.len == 0);
		xp_frame_put(&f, buf);
		FUZZ_CHECK(memcmp(buf, data + at, XP_FRAME_LEN) == 0);
	}
	return 0;
}
