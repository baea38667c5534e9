// SPDX-License-Identifier: Apache-2.0
/* json-c helpers for ctrl/: strings that are safe to use as C strings, a scan of the raw text for
 * keys given twice (json-c keeps the last), and replies made valid UTF-8. Not a JSON parser:
 * the scan looks at text json-c has accepted. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_json.h"

/* A JSON string may hold NUL; a C string would silently end there, so refuse it. */
const char *ctl_json_cstring(struct json_object *v)
{
	const char *s;

	if (!json_object_is_type(v, json_type_string))
		return NULL;
	s = json_object_get_string(v);
	return strlen(s) == (size_t)json_object_get_string_len(v) ? s : NULL;
}

const char *ctl_json_member_cstring(struct json_object *o, const char *name)
{
	struct json_object *v;

	return json_object_object_get_ex(o, name, &v) ? ctl_json_cstring(v) : NULL;
}

/* ---- duplicate keys ---- */

/* json-c's default depth; deeper text is refused by it before we are asked. */
#define DUP_DEPTH 64

struct dup_key {
	const char *p;
	size_t len;
};

struct dup_scan {
	const char *s;
	size_t len, i;
	char *arena; /* the decoded keys of the open objects; never longer than the text */
	size_t alen;
	struct dup_key *keys;
	size_t nkeys, cap;
};

int ctl_json_hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

struct json_object *ctl_json_new_hex(const uint8_t *b, size_t len)
{
	static const char digits[] = "0123456789abcdef";
	char *s = malloc(2 * len + 1);
	struct json_object *o;

	if (!s)
		return NULL;
	for (size_t i = 0; i < len; i++) {
		s[2 * i] = digits[b[i] >> 4];
		s[2 * i + 1] = digits[b[i] & 15];
	}
	s[2 * len] = '\0';
	o = json_object_new_string(s);
	free(s);
	return o;
}

static bool upper_hex(char c)
{
	return c >= 'A' && c <= 'F';
}

int ctl_json_hex_decode(const char *s, bool lower_only, uint8_t *buf, size_t max)
{
	size_t n = strlen(s);

	if (n % 2 || n / 2 > max)
		return -EINVAL;
	for (size_t i = 0; i < n; i += 2) {
		int hi = ctl_json_hex_digit(s[i]), lo = ctl_json_hex_digit(s[i + 1]);

		if (hi < 0 || lo < 0 || (lower_only && (upper_hex(s[i]) || upper_hex(s[i + 1]))))
			return -EINVAL;
		buf[i / 2] = (uint8_t)(hi << 4 | lo);
	}
	return (int)(n / 2);
}

static int hex4(const char *s, unsigned int *out)
{
	unsigned int v = 0;

	for (int k = 0; k < 4; k++) {
		int d = ctl_json_hex_digit(s[k]);

		if (d < 0)
			return -EINVAL;
		v = v << 4 | (unsigned int)d;
	}
	*out = v;
	return 0;
}

static void put_utf8(struct dup_scan *d, unsigned int cp)
{
	char *o = d->arena + d->alen;

	if (cp < 0x80) {
		o[0] = (char)cp;
		d->alen += 1;
	} else if (cp < 0x800) {
		o[0] = (char)(0xc0 | cp >> 6);
		o[1] = (char)(0x80 | (cp & 0x3f));
		d->alen += 2;
	} else if (cp < 0x10000) {
		o[0] = (char)(0xe0 | cp >> 12);
		o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
		o[2] = (char)(0x80 | (cp & 0x3f));
		d->alen += 3;
	} else {
		o[0] = (char)(0xf0 | cp >> 18);
		o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
		o[2] = (char)(0x80 | (cp >> 6 & 0x3f));
		o[3] = (char)(0x80 | (cp & 0x3f));
		d->alen += 4;
	}
}

/*
 * The string whose quote (" or ', as json-c takes both) is at s[i - 1], to its closing quote; with
 * key, decoded as json-c decodes it (a lone surrogate as U+FFFD) onto the arena. Each escape
 * decodes to no more bytes than it takes in the text, so the arena (as long as the text) holds all.
 */
static int scan_string(struct dup_scan *d, char quote, struct dup_key *key)
{
	size_t start = d->alen;
	unsigned int cp, lo;

	while (d->i < d->len) {
		char c = d->s[d->i++];

		if (c == quote) {
			if (key)
				*key = (struct dup_key){ d->arena + start, d->alen - start };
			else
				d->alen = start;
			return 0;
		}
		if (c != '\\') {
			if (key)
				d->arena[d->alen++] = c;
			continue;
		}
		if (d->i >= d->len)
			return -EINVAL;
		c = d->s[d->i++];
		switch (c) {
		case '"':
		case '\\':
		case '/':
			break;
		case 'b':
			c = '\b';
			break;
		case 'f':
			c = '\f';
			break;
		case 'n':
			c = '\n';
			break;
		case 'r':
			c = '\r';
			break;
		case 't':
			c = '\t';
			break;
		case 'u':
			if (d->len - d->i < 4 || hex4(d->s + d->i, &cp) < 0)
				return -EINVAL;
			d->i += 4;
			if (cp >= 0xd800 && cp < 0xdc00 && d->len - d->i >= 6 &&
			    d->s[d->i] == '\\' && d->s[d->i + 1] == 'u' &&
			    hex4(d->s + d->i + 2, &lo) == 0 && lo >= 0xdc00 && lo < 0xe000) {
				d->i += 6;
				cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
			} else if (cp >= 0xd800 && cp < 0xe000) {
				cp = 0xfffd;
			}
			if (key)
				put_utf8(d, cp);
			continue;
		default:
			return -EINVAL;
		}
		if (key)
			d->arena[d->alen++] = c;
	}
	return -EINVAL;
}

static int key_cmp(const void *a, const void *b)
{
	const struct dup_key *x = a, *y = b;
	int c = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);

	return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* The keys of the object that just closed, keys[first, nkeys): the first one given twice. */
static const struct dup_key *twice(struct dup_scan *d, size_t first)
{
	struct dup_key *k = d->keys + first;
	size_t n = d->nkeys - first;

	qsort(k, n, sizeof(*k), key_cmp);
	for (size_t j = 1; j < n; j++)
		if (key_cmp(&k[j - 1], &k[j]) == 0)
			return &k[j];
	return NULL;
}

/*
 * Past a block comment whose opening '*' is s[i]: where json-c ends it. json-c takes the byte
 * after each '*' in a comment as read, so a '*' that follows a '*' cannot start the end ("**" and
 * then '/' goes on): ending it anywhere else would read as JSON what json-c skips, or the other
 * way round.
 */
static int skip_comment(struct dup_scan *d)
{
	size_t j = d->i + 1;

	while (j < d->len) {
		if (d->s[j] != '*') {
			j++;
			continue;
		}
		if (j + 1 < d->len && d->s[j + 1] == '/') {
			d->i = j + 2;
			return 0;
		}
		j += 2;
	}
	return -EINVAL;
}

static int scan(struct dup_scan *d, char *key, size_t keylen)
{
	struct {
		bool object;
		size_t first_key, arena;
	} stack[DUP_DEPTH];
	unsigned int depth = 0;
	bool want_key = false;
	const struct dup_key *dup;
	struct dup_key k;
	int r;

	while (d->i < d->len) {
		char c = d->s[d->i++];

		switch (c) {
		case '{':
		case '[':
			if (depth == DUP_DEPTH)
				return -EINVAL;
			stack[depth].object = c == '{';
			stack[depth].first_key = d->nkeys;
			stack[depth].arena = d->alen;
			depth++;
			want_key = c == '{';
			break;
		case '}':
		case ']':
			if (!depth || stack[depth - 1].object != (c == '}'))
				return -EINVAL;
			depth--;
			dup = c == '}' ? twice(d, stack[depth].first_key) : NULL;
			if (dup) {
				snprintf(key, keylen, "%.*s", (int)dup->len, dup->p);
				return 1;
			}
			d->nkeys = stack[depth].first_key;
			d->alen = stack[depth].arena;
			want_key = false;
			break;
		case ',':
			want_key = depth && stack[depth - 1].object;
			break;
		case '"':
		case '\'':
			r = scan_string(d, c, want_key ? &k : NULL);
			if (r < 0)
				return r;
			if (want_key) {
				if (d->nkeys == d->cap)
					return -EINVAL; /* more keys than the text can hold */
				d->keys[d->nkeys++] = k;
				want_key = false;
			}
			break;
		case '/': /* json-c takes comments, so a quote in one is no string */
			if (d->i < d->len && d->s[d->i] == '*') {
				r = skip_comment(d);
				if (r < 0)
					return r;
			} else if (d->i < d->len && d->s[d->i] == '/') {
				const char *end = memchr(d->s + d->i, '\n', d->len - d->i);

				d->i = end ? (size_t)(end - d->s) + 1 : d->len;
			} else {
				return -EINVAL;
			}
			break;
		default: /* white space, ':', numbers, literals */
			break;
		}
	}
	return depth ? -EINVAL : 0;
}

int ctl_json_duplicate_key(const char *text, size_t len, char *key, size_t keylen)
{
	/* A key takes at least two bytes of text ("" or ''). */
	struct dup_scan d = { .s = text, .len = len, .cap = len / 2 + 1 };
	int r = -ENOMEM;

	d.arena = malloc(len + 1);
	d.keys = malloc(d.cap * sizeof(*d.keys));
	if (d.arena && d.keys)
		r = scan(&d, key, keylen);
	free(d.arena);
	free(d.keys);
	return r;
}

/* ---- UTF-8 ---- */

/* The length of the well-formed UTF-8 sequence at p (of n bytes), 0 if there is none. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
	unsigned char c = p[0];
	size_t len;
	unsigned int lo = 0x80, hi = 0xbf; /* the second byte's range (RFC 3629, table 3-7) */

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2;
	else if (c >= 0xe0 && c <= 0xef)
		len = 3;
	else if (c >= 0xf0 && c <= 0xf4)
		len = 4;
	else
		return 0;
	if (c == 0xe0)
		lo = 0xa0;
	else if (c == 0xed)
		hi = 0x9f;
	else if (c == 0xf0)
		lo = 0x90;
	else if (c == 0xf4)
		hi = 0x8f;
	if (n < len || p[1] < lo || p[1] > hi)
		return 0;
	for (size_t k = 2; k < len; k++)
		if ((p[k] & 0xc0) != 0x80)
			return 0;
	return len;
}

bool ctl_json_utf8_valid(const char *text, size_t len)
{
	const unsigned char *s = (const unsigned char *)text;
	size_t l;

	for (size_t i = 0; i < len; i += l)
		if (!(l = utf8_len(s + i, len - i)))
			return false;
	return true;
}

char *ctl_json_utf8_fix(char *text)
{
	static const char repl[] = "\\ufffd";
	const unsigned char *s = (const unsigned char *)text;
	size_t n = strlen(text), bad = 0, i, l, o = 0;
	char *out;

	for (i = 0; i < n; i += l ? l : 1)
		if (!(l = utf8_len(s + i, n - i)))
			bad++;
	if (!bad)
		return text;
	out = malloc(n + bad * (sizeof(repl) - 2) + 1);
	if (!out) {
		free(text);
		return NULL;
	}
	for (i = 0; i < n; i += l ? l : 1) {
		l = utf8_len(s + i, n - i);
		if (l) {
			memcpy(out + o, s + i, l);
			o += l;
		} else {
			memcpy(out + o, repl, sizeof(repl) - 1);
			o += sizeof(repl) - 1;
		}
	}
	out[o] = '\0';
	free(text);
	return out;
}

void ctl_json_one_line(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = '?';
}
