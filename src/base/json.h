/* json.h — a small strict JSON (RFC 8259) reader and writer for configs, safetensors headers, datasets and metrics.
 * Strict: no trailing commas, comments, NaN/Infinity, duplicate keys or invalid UTF-8; errors give line:column. */
#ifndef K3C_JSON_H
#define K3C_JSON_H

#include "k3c.h"

typedef enum {
    K3C_JSON_NULL,
    K3C_JSON_BOOL,
    K3C_JSON_NUMBER,
    K3C_JSON_STRING,
    K3C_JSON_ARRAY,
    K3C_JSON_OBJECT
} k3c_json_type;

typedef struct k3c_json k3c_json;
struct k3c_json {
    k3c_json_type type;
    int boolean;
    double number;  /* every number */
    int is_integer; /* the literal had no fraction/exponent and fits int64: `integer` is exact */
    int64_t integer;
    char *string; /* NUL-terminated UTF-8 (may contain \u0000 as an embedded NUL: use len) */
    size_t len;
    size_t n;        /* array / object element count */
    k3c_json *items; /* array elements or object values, in document order */
    char **keys;     /* object keys (n of them), in document order */
};

/* Parses text[0..n). `name` (a file name) prefixes error messages: "config.json:3:14: expected ','". */
int k3c_json_parse(const char *text, size_t n, const char *name, k3c_json **out, k3c_err *err);
/* Reads a whole file and parses it; error messages are prefixed with the path. */
int k3c_json_parse_file(const char *path, k3c_json **out, k3c_err *err);
void k3c_json_free(k3c_json *v);

/* 1 if s[0..n) is valid UTF-8 (RFC 3629: no overlongs, surrogates or code points past U+10FFFF), else 0. */
int k3c_utf8_valid(const char *s, size_t n);

const k3c_json *k3c_json_get(const k3c_json *obj, const char *key); /* NULL if absent or obj not an object */

/* A growable string for writing JSON (and other text). All appends are no-ops after an allocation failure (ok = 0). */
typedef struct {
    char *buf;
    size_t len, cap;
    int ok;
} k3c_sbuf;
void k3c_sbuf_init(k3c_sbuf *s);
void k3c_sbuf_free(k3c_sbuf *s);
void k3c_sbuf_append(k3c_sbuf *s, const char *str, size_t n);
void k3c_sbuf_printf(k3c_sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void k3c_sbuf_json_string(k3c_sbuf *s, const char *str, size_t n); /* quoted and escaped */
void k3c_sbuf_json_number(k3c_sbuf *s, double x);                  /* shortest round-trip form ("%.17g" fallback) */
void k3c_sbuf_json_number_py(k3c_sbuf *s, double x);               /* Python's repr(float): "1.0", "1e+16", "1e-05" */

/* Writes v the way Python's json.dumps(v, ensure_ascii=False) does (what chat templates hash and the model saw):
 * integers as written, other numbers as repr(float), non-ASCII raw; keys in document order unless SORT_KEYS;
 * "," and ":" unless SPACED (", " and ": ", Python's default separators). */
enum { K3C_JSON_W_SORT_KEYS = 1, K3C_JSON_W_SPACED = 2 };
void k3c_sbuf_json_value(k3c_sbuf *s, const k3c_json *v, int flags);

#endif
