// SPDX-License-Identifier: Apache-2.0
/* One-line logging to stderr: "IDENT[PID]: LEVEL: message". Thread-safe because each line is
 * formatted into one buffer and written with a single write(2). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

static const char *log_ident = "vmigd";
static enum vm_log_level log_max = VM_LOG_INFO;
static const char *const level_names[] = { "error", "warning", "info", "debug" };

void vm_log_setup(const char *ident, enum vm_log_level level)
{
	log_ident = ident;
	log_max = level;
}

int vm_log_level_parse(const char *s, enum vm_log_level *ret)
{
	for (unsigned int i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
		if (strcmp(s, level_names[i]) == 0 ||
		    (i == VM_LOG_WARN && strcmp(s, "warn") == 0) ||
		    (i == VM_LOG_ERR && strcmp(s, "err") == 0)) {
			*ret = i;
			return 0;
		}
	}
	return -EINVAL;
}

void vm_log(enum vm_log_level level, const char *fmt, ...)
{
	char line[1024];
	int saved = errno;
	va_list ap;
	int n;

	if (level > log_max)
		return;
	n = snprintf(line, sizeof(line), "%s[%d]: %s: ", log_ident, (int)getpid(),
		     level_names[level]);
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, n) < 0) {
		/* nowhere left to report it */
	}
	errno = saved;
}
