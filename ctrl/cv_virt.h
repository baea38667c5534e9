/* SPDX-License-Identifier: Apache-2.0 */
/* The libvirt backend's pure part, for its unit test: libvirt's job statistics and domain state
 * to a cv_job. Only in a build with libvirt; the rest of the tree uses cv_backend.h. */
#ifndef CV_VIRT_H
#define CV_VIRT_H

#include <libvirt/libvirt.h>

#include "cv_backend.h"

/*
 * type: virDomainGetJobStats's job type (virDomainJobType), params/nparams its typed parameters
 * (NULL/0: none); state/reason: virDomainGetState's. Fills all of *job. -EPROTO for a job type
 * this libvirt does not know; *job is then untouched.
 */
int cv_virt_parse_job(int type, const virTypedParameter *params, int nparams, int state, int reason,
		      struct cv_job *job);

#endif
