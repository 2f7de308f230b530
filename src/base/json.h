/* json.h — a small strict JSON (RFC 8259) reader and writer for configs, safetensors headers, datasets and metrics.
 * Strict: no trailing commas, comments, NaN/Infinity, duplicate keys or invalid UTF-8; errors give line:column.
 * Numbers keep their literal, so a value is never changed on its way through (docs/FORMATS.md §1.3). */
#ifndef K3C_JSON_H
#define K3C_JSON_H

#include "base/base.h"

typedef enum {
    K3C_JSON_NULL,
    K3C_JSON_BOOL,
    K3C_JSON_NUMBER,
    K3C_JSON_STRING,
    K3C_JSON_ARRAY,
    K3C_JSON_OBJECT
} k3c_json_type;

struct k3c_json { /* k3c.h names it */
    k3c_json_type type;
    int boolean;
    double number;  /* every number (the nearest double) */
    int is_integer; /* the literal had no fraction/exponent and fits int64: `integer` is exact */
    int64_t integer;
    char *lexeme; /* numbers: the literal as written when `integer` does not spell it (a fraction, an exponent, an
                   * integer beyond int64, -0); NULL otherwise. Writers re-emit it, so no digit is lost. */
    char *string; /* NUL-terminated UTF-8 (may contain \u0000 as an embedded NUL: use len) */
    size_t len;
    size_t n;        /* array / object element count */
    k3c_json *items; /* array elements or object values, in document order */
    char **keys;     /* object keys (n of them), in document order */
};

/* Parses text[0..n). `name` (a file name) prefixes error messages: "config.json:3:14: expected ','". */
int k3c_json_parse(const char *text, size_t n, const char *name, k3c_json **out, k3c_err *err);
/* K3C_JSON_P_DUP_KEYS: a repeated object key is not an error; as Python's json.loads reads it, the key keeps its first
 * position and takes the last value (how chat renderers read tool-call arguments a client sent as text). */
enum { K3C_JSON_P_DUP_KEYS = 1 };
int k3c_json_parse_ex(const char *text, size_t n, const char *name, int flags, k3c_json **out, k3c_err *err);
/* Reads a whole file and parses it; error messages are prefixed with the path. */
int k3c_json_parse_file(const char *path, k3c_json **out, k3c_err *err);
void k3c_json_free(k3c_json *v);

/* 1 if s[0..n) is valid UTF-8 (RFC 3629: no overlongs, surrogates or code points past U+10FFFF), else 0. */
int k3c_utf8_valid(const char *s, size_t n);

const k3c_json *k3c_json_get(const k3c_json *obj, const char *key); /* NULL if absent or obj not an object */
/* 1 if v is a number written without fraction or exponent (an integer of any size), else 0. */
int k3c_json_is_integral(const k3c_json *v);

/* ---------------------------------------------------------------- typed field getters
 * The one reader of config fields (model config.json, run configs): every message names the file and the field,
 * "<file>: <path><key>: <reason>", e.g. "config.json: text_config.hidden_size: expected an integer, got a string".
 * A field may have two spellings (a, b; b.key NULL for one): when both are present they must agree. JSON null counts
 * as absent unless flags has K3C_JSON_NULL_ZERO (then it reads as 0). *present (may be NULL) says whether it was found;
 * an absent optional field leaves *out 0 (numbers, booleans) or NULL (strings, objects). */
typedef struct {
    const char *file; /* name for messages */
    k3c_err *err;
} k3c_json_ctx;

typedef struct {
    const k3c_json *obj; /* NULL: this spelling is not available */
    const char *path;    /* "" or "text_config." */
    const char *key;
} k3c_json_spot;

#define K3C_SPOT(o, p, k) ((k3c_json_spot){(o), (p), (k)})
#define K3C_NOSPOT ((k3c_json_spot){NULL, "", NULL})

enum { K3C_JSON_OPT = 0, K3C_JSON_REQ = 1, K3C_JSON_NULL_ZERO = 2 };

int k3c_json_get_int(const k3c_json_ctx *c, int flags, k3c_json_spot a, k3c_json_spot b, int64_t *out, int *present);
int k3c_json_get_num(const k3c_json_ctx *c, int flags, k3c_json_spot a, k3c_json_spot b, double *out, int *present);
int k3c_json_get_bool(const k3c_json_ctx *c, int flags, k3c_json_spot a, k3c_json_spot b, int *out, int *present);
int k3c_json_get_str(const k3c_json_ctx *c, int flags, k3c_json_spot s, const char **out);
int k3c_json_get_obj(const k3c_json_ctx *c, k3c_json_spot s, const k3c_json **out); /* absent: *out NULL, 0 */
const char *k3c_json_type_name(const k3c_json *v); /* "null", "a boolean", "a number", ... */
/* "<file>: <path><key>: expected <want>, got <v's type>"; returns K3C_ECONFIG. */
int k3c_json_bad_type(const k3c_json_ctx *c, k3c_json_spot s, const char *want, const k3c_json *v);

/* Appending to a k3c_sbuf (k3c.h). */
void k3c_sbuf_append(k3c_sbuf *s, const char *str, size_t n);
void k3c_sbuf_printf(k3c_sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void k3c_sbuf_json_string(k3c_sbuf *s, const char *str, size_t n); /* quoted and escaped */
void k3c_sbuf_json_number(k3c_sbuf *s, double x);                  /* shortest round-trip form ("%.17g" fallback) */
void k3c_sbuf_json_number_py(k3c_sbuf *s, double x);               /* Python's repr(float): "1.0", "1e+16", "1e-05" */

/* Writes v the way Python's json.dumps(json.loads(text), ensure_ascii=False) does (what chat templates hash and the
 * model saw): integers exactly as written (any size), other numbers as repr(float), non-ASCII raw; keys in document
 * order unless SORT_KEYS; "," and ":" unless SPACED (", " and ": ", Python's default separators). LEXEMES: every
 * number exactly as it was written (0.10, 1E5, 12345678901234567890 unchanged), for JSON passed on, not re-rendered. */
enum { K3C_JSON_W_SORT_KEYS = 1, K3C_JSON_W_SPACED = 2, K3C_JSON_W_LEXEMES = 4 };
void k3c_sbuf_json_value(k3c_sbuf *s, const k3c_json *v, int flags);

#endif
