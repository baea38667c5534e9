/* SPDX-License-Identifier: Apache-2.0 */
/* One-line logging to stderr for the daemon and its tools. Not for the data path's hot loop:
 * callers there log only on errors and at connection end. */
#ifndef VM_LOG_H
#define VM_LOG_H

enum vm_log_level { VM_LOG_ERR, VM_LOG_WARN, VM_LOG_INFO, VM_LOG_DEBUG };

void vm_log_setup(const char *ident, enum vm_log_level level);
int vm_log_level_parse(const char *s, enum vm_log_level *ret);
void vm_log(enum vm_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_err(...)   vm_log(VM_LOG_ERR, __VA_ARGS__)
#define log_warn(...)  vm_log(VM_LOG_WARN, __VA_ARGS__)
#define log_info(...)  vm_log(VM_LOG_INFO, __VA_ARGS__)
#define log_debug(...) vm_log(VM_LOG_DEBUG, __VA_ARGS__)

#endif
