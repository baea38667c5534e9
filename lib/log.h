/* SPDX-License-Identifier: Apache-2.0 */
/* One-line logging to stderr for the daemon and its tools. Not for the data path's hot loop:
 * callers there log only on errors and at connection end. */
#ifndef VM_LOG_H
#define VM_LOG_H

#include <stdint.h>

enum vm_log_level { VM_LOG_ERR, VM_LOG_WARN, VM_LOG_INFO, VM_LOG_DEBUG };

void vm_log_setup(const char *ident, enum vm_log_level level);
/* A program's start-up error or warning, before vm_log_setup(): "IDENT: message" (warnings
 * "IDENT: warning: message"), with its priority prefix where stderr is the journal. */
void vm_log_early(enum vm_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
int vm_log_level_parse(const char *s, enum vm_log_level *ret);
void vm_log(enum vm_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * A budget for lines that anyone who can reach a port can cause (refusals before or after
 * authentication): at most VM_LOG_LIMIT_BURST lines per VM_LOG_LIMIT_WINDOW_MS. The rest are
 * counted; vm_log_limit_flush(), called from a periodic timer, reports how many once their
 * window has passed, so a flood costs a few lines per window and its size is still told.
 */
#define VM_LOG_LIMIT_BURST     20
#define VM_LOG_LIMIT_WINDOW_MS 10000

struct vm_log_limit {
	const char *what; /* plural noun for the summary line: "node-hop refusals" */
	uint64_t start_ms;
	unsigned int lines, dropped;
	uint64_t dropped_total;
};

void vm_log_limited(struct vm_log_limit *l, uint64_t now_ms, enum vm_log_level level,
		    const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void vm_log_limit_flush(struct vm_log_limit *l, uint64_t now_ms);

#define log_err(...)   vm_log(VM_LOG_ERR, __VA_ARGS__)
#define log_warn(...)  vm_log(VM_LOG_WARN, __VA_ARGS__)
#define log_info(...)  vm_log(VM_LOG_INFO, __VA_ARGS__)
#define log_debug(...) vm_log(VM_LOG_DEBUG, __VA_ARGS__)

#endif
