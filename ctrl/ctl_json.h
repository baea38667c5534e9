/* SPDX-License-Identifier: Apache-2.0 */
/* Small json-c helpers shared by the control protocol and the port map's JSON form, and the two
 * checks json-c does not make: a key given twice, and replies that must be valid UTF-8. */
#ifndef CTL_JSON_H
#define CTL_JSON_H

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * The C string of a JSON string, or NULL when v is not a string or holds a NUL, where a C string
 * would silently end. The _member form looks up name in object o first.
 */
const char *ctl_json_cstring(struct json_object *v);
const char *ctl_json_member_cstring(struct json_object *o, const char *name);

/* The value of hex digit c (either case), -1 when it is none. */
int ctl_json_hex_digit(char c);
/* len bytes as a JSON string of lower-case hex; NULL when out of memory. */
struct json_object *ctl_json_new_hex(const uint8_t *b, size_t len);
/* The bytes hex string s spells (lower case only, or either), at most max of them: how many, or
 * -EINVAL for an odd length, a character that is no such digit, or more than max bytes. */
int ctl_json_hex_decode(const char *s, bool lower_only, uint8_t *buf, size_t max);

/*
 * Whether text[0, len), JSON that json-c has parsed, has an object holding one key twice, at any
 * depth: json-c keeps the last value silently, so {"op":"list","op":"target-stop"} would stop.
 * Keys are compared decoded ("op" and "\u006fp" are the same). 1 with the key (decoded, cut to
 * keylen - 1 bytes) in key; 0 when every key is once; -ENOMEM; -EINVAL for text that is not JSON.
 */
int ctl_json_duplicate_key(const char *text, size_t len, char *key, size_t keylen);

/* Whether text[0, len) is well-formed UTF-8 (RFC 3629: no overlong form, surrogate, or code point
 * above U+10FFFF; json-c's own check lets those through). */
bool ctl_json_utf8_valid(const char *text, size_t len);

/*
 * Serialized JSON text as valid UTF-8: every byte that does not start a well-formed sequence
 * (overlong, surrogate, above U+10FFFF, cut short) becomes "\ufffd". json-c writes bytes >= 0x80
 * of a string as they are, and a reply can carry text from elsewhere (a path, QEMU's or
 * libvirt's words, a request cut in the middle of a character). Takes text; returns it or a new
 * string (text freed), NULL (text freed) when out of memory.
 */
char *ctl_json_utf8_fix(char *text);

/* Errors quote client text: control characters become '?', so that s stays the one line the
 * protocol promises. */
void ctl_json_one_line(char *s);

#endif
