/* SPDX-License-Identifier: Apache-2.0 */
/* Reading a small file vmigd trusts (TLS key, certificate, CA, config) the way sshd reads its keys:
 * a regular file only, without blocking, of bounded size, owned and moded so that nobody else can
 * change it (or, for a secret, read it). Not for files on a migration's paths: those are not
 * ours to trust. */
#ifndef VM_FILE_H
#define VM_FILE_H

#include <stddef.h>

/* The largest file vm_file_read_checked() reads: far above any PEM bundle or config. */
#define VM_FILE_MAX (1024 * 1024)

enum vm_file_flags {
	VM_FILE_SECRET = 1 << 0, /* a private key: group and others may not read it either */
};

/*
 * Reads path (links followed: Kubernetes secret volumes are links into ..data) into a malloc'd
 * buffer, NUL-terminated, into *data and its length into *len. Refused (-errno, the reason in msg,
 * naming the file as "what path"): anything but a regular file (a FIFO, a device, a directory),
 * more than max bytes, a file owned by a uid other than root or our euid, writable by group or
 * others, or with VM_FILE_SECRET readable by them. Where such a mode or owner is on a read-only
 * mount (how the kubelet mounts secret volumes, whose modes the pod cannot change), the file is
 * read and 1 returned, with the problem in msg as a warning. 0: read, nothing to say.
 * *data and *len are written only when the return is 0 or 1.
 */
int vm_file_read_checked(const char *path, const char *what, unsigned int flags, size_t max,
			 char **data, size_t *len, char *msg, size_t msglen);

#endif
