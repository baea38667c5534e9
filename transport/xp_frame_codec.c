// SPDX-License-Identifier: Apache-2.0
/* The frame codec of a resumable link's node hop (xp_frame.h): a header to bytes and back, with
 * every check a receiver makes before it believes one. No I/O. */
#include <errno.h>

#include "util.h"
#include "xp_frame.h"

void xp_frame_put(const struct xp_frame *f, uint8_t buf[XP_FRAME_LEN])
{
	vm_put_be16(buf, XP_FRAME_MAGIC);
	buf[2] = (uint8_t)f->type;
	buf[3] = 0;
	vm_put_be32(buf + 4, f->len);
	vm_put_be64(buf + 8, f->off);
}

int xp_frame_get(const uint8_t buf[XP_FRAME_LEN], struct xp_frame *ret)
{
	struct xp_frame f = { .type = buf[2],
			      .len = vm_get_be32(buf + 4),
			      .off = vm_get_be64(buf + 8) };

	if (vm_get_be16(buf) != XP_FRAME_MAGIC || buf[3] != 0)
		return -EBADMSG;
	switch (f.type) {
	case XP_FRAME_DATA:
		if (f.len == 0 || f.len > XP_FRAME_MAX)
			return -EBADMSG;
		break;
	case XP_FRAME_ZDATA:
		if (f.len == 0 || f.len > XP_FRAME_ZMAX)
			return -EBADMSG;
		break;
	case XP_FRAME_ACK:
	case XP_FRAME_END:
	case XP_FRAME_GONE:
	case XP_FRAME_PING:
		if (f.len != 0)
			return -EBADMSG;
		break;
	default:
		return -EBADMSG;
	}
	*ret = f;
	return 0;
}
