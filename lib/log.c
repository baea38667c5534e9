// SPDX-License-Identifier: Apache-2.0
/* One-line logging to stderr: "IDENT[PID]: LEVEL: message", or "<PRIORITY>LEVEL: message" where
 * stderr is the journal (sd-daemon(3)'s prefixes; the journal adds ident and pid itself).
 * Thread-safe because each line is formatted into one buffer and written with a single write(2). */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

static const char *log_ident = "vmigd";
static enum vm_log_level log_max = VM_LOG_INFO;
static const char *const level_names[] = { "error", "warning", "info", "debug" };
/* syslog(3)'s LOG_ERR, LOG_WARNING, LOG_INFO and LOG_DEBUG */
static const char level_prio[] = { '3', '4', '6', '7' };
static bool log_journal;

/* systemd sets $JOURNAL_STREAM to "DEV:INO" of the stream it connects to stderr; a stderr that
 * is something else (redirected, or inherited by a child) is not the journal. */
static bool stderr_is_journal(void)
{
	const char *e = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;
	char tail;

	if (!e || sscanf(e, "%llu:%llu%c", &dev, &ino, &tail) != 2)
		return false;
	if (fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void vm_log_setup(const char *ident, enum vm_log_level level)
{
	log_ident = ident;
	log_max = level;
	log_journal = stderr_is_journal();
}

void vm_log_early(enum vm_log_level level, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	int n = 0;

	if (stderr_is_journal())
		n = snprintf(line, sizeof(line), "<%c>", level_prio[level]);
	n += snprintf(line + n, sizeof(line) - n, "%s: %s", log_ident,
		      level == VM_LOG_ERR    ? ""
		      : level == VM_LOG_WARN ? "warning: "
					     : "");
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, n) < 0) {
		/* nowhere left to report it */
	}
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

static void vm_vlog(enum vm_log_level level, const char *fmt, va_list ap)
{
	char line[1024];
	int saved = errno;
	int n;

	if (level > log_max)
		return;
	if (log_journal)
		n = snprintf(line, sizeof(line), "<%c>%s: ", level_prio[level], level_names[level]);
	else
		n = snprintf(line, sizeof(line), "%s[%d]: %s: ", log_ident, (int)getpid(),
			     level_names[level]);
	n += vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	if (n > (int)sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, n) < 0) {
		/* nowhere left to report it */
	}
	errno = saved;
}

void vm_log(enum vm_log_level level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vm_vlog(level, fmt, ap);
	va_end(ap);
}

void vm_log_limit_flush(struct vm_log_limit *l, uint64_t now_ms)
{
	if (now_ms - l->start_ms < VM_LOG_LIMIT_WINDOW_MS)
		return;
	if (l->dropped)
		vm_log(VM_LOG_WARN,
		       "%u more %s in the last %llu s were not logged (at most %u lines per %u s; "
		       "%llu not logged since start)",
		       l->dropped, l->what, (unsigned long long)(now_ms - l->start_ms) / 1000,
		       VM_LOG_LIMIT_BURST, VM_LOG_LIMIT_WINDOW_MS / 1000,
		       (unsigned long long)l->dropped_total);
	l->start_ms = now_ms;
	l->lines = 0;
	l->dropped = 0;
}

void vm_log_limited(struct vm_log_limit *l, uint64_t now_ms, enum vm_log_level level,
		    const char *fmt, ...)
{
	va_list ap;

	vm_log_limit_flush(l, now_ms);
	if (l->lines >= VM_LOG_LIMIT_BURST) {
		l->dropped++;
		l->dropped_total++;
		return;
	}
	l->lines++;
	va_start(ap, fmt);
	vm_vlog(level, fmt, ap);
	va_end(ap);
}
