// SPDX-License-Identifier: Apache-2.0
/* The libvirt backend in a build without libvirt: it says so and how to get it. The real one is
 * cv_virt.c; meson picks one of the two (option libvirt). */
#include <errno.h>
#include <stdio.h>

#include "cv_backend.h"

bool cv_virt_available(void)
{
	return false;
}

int cv_virt_open(const char *uri, const char *domain, unsigned int timeout_ms,
		 struct cv_backend **ret, char *err, size_t errlen)
{
	if (err && errlen)
		snprintf(err, errlen,
			 "vmigd was built without libvirt (install libvirt-dev and rebuild)");
	return -ENOTSUP;
}
