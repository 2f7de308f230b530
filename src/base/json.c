/* json.c — a strict RFC 8259 JSON reader (exact int64 integers, number literals kept, UTF-8 validated, duplicate keys
 * rejected unless asked for Python's reading), the typed field getters every config reader uses, and the k3c_sbuf text
 * writer with round-trip number formatting (docs/FORMATS.md §1.2, §1.3). */
#include "base/json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 512

typedef struct {
    const unsigned char *s;
    size_t n, pos;
    int depth, flags;
    const char *name;
    k3c_err *err;
} parser;

/* Reports "name:line:col: reason" for the byte at `at`; line and column are 1-based, columns count bytes. */
static int fail_at(parser *p, size_t at, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail_at(parser *p, size_t at, int code, const char *fmt, ...) {
    if (!p->err) return code;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < p->n; i++) {
        if (p->s[i] == '\n') {
            line++;
            col = 1;
        } else
            col++;
    }
    char reason[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    return k3c_errf(p->err, code, "%s:%zu:%zu: %s", p->name, line, col, reason);
}
#define FAIL(p, ...) fail_at((p), (p)->pos, K3C_EFORMAT, __VA_ARGS__)
#define NOMEM(p) fail_at((p), (p)->pos, K3C_ENOMEM, "out of memory")

static void skip_ws(parser *p) {
    while (p->pos < p->n) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

/* Describes the byte at the cursor for messages ("end of input", "'x'", "byte 0xff"). */
static const char *describe(parser *p, char *buf, size_t n) {
    if (p->pos >= p->n) return "end of input";
    unsigned char c = p->s[p->pos];
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, n, "'%c'", c);
    else
        snprintf(buf, n, "byte 0x%02x", c);
    return buf;
}

static void free_value(k3c_json *v);

/* ------------------------------------------------------------------ strings */

/* Length of the valid UTF-8 sequence at s[0..avail) (RFC 3629: no overlongs, no surrogates, ≤ U+10FFFF), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t avail) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        cp = c & 0x07;
    } else
        return 0;
    if (avail < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return 0; /* overlong */
    if (cp >= 0xd800 && cp <= 0xdfff) return 0;
    if (cp > 0x10ffff) return 0;
    return len;
}

int k3c_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_len(u + i, n - i);
        if (k == 0) return 0;
        i += k;
    }
    return 1;
}

static size_t utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

static int hex4(parser *p, size_t at, uint32_t *out) {
    if (at + 4 > p->n) return -1;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p->s[at + (size_t)i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* Decodes the \u escape at the cursor (just past the backslash-u) into a code point, joining surrogate pairs. */
static int parse_u_escape(parser *p, uint32_t *cp) {
    size_t esc = p->pos - 2;
    uint32_t hi;
    if (hex4(p, p->pos, &hi) != 0) return fail_at(p, esc, K3C_EFORMAT, "invalid \\u escape (need 4 hex digits)");
    p->pos += 4;
    if (hi >= 0xdc00 && hi <= 0xdfff) return fail_at(p, esc, K3C_EFORMAT, "lone low surrogate \\u%04x", hi);
    if (hi < 0xd800 || hi > 0xdbff) {
        *cp = hi;
        return K3C_OK;
    }
    uint32_t lo;
    if (p->pos + 2 > p->n || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' || hex4(p, p->pos + 2, &lo) != 0 ||
        lo < 0xdc00 || lo > 0xdfff)
        return fail_at(p, esc, K3C_EFORMAT, "high surrogate \\u%04x not followed by a low surrogate", hi);
    p->pos += 6;
    *cp = 0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00);
    return K3C_OK;
}

/* Parses a string at the cursor (on the opening quote) into a fresh NUL-terminated buffer. */
static int parse_string(parser *p, char **out, size_t *out_len) {
    size_t start = ++p->pos, end = start;
    /* The decoded form is never longer than the source, so one scan finds the bound for the allocation. */
    while (end < p->n && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
    if (end >= p->n) return fail_at(p, start - 1, K3C_EFORMAT, "unterminated string");
    char *buf = malloc(end - start + 1);
    if (!buf) return NOMEM(p);
    size_t len = 0;
    int rc = K3C_OK;
    while (rc == K3C_OK) {
        unsigned char c = p->s[p->pos];
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20) {
            rc = FAIL(p, "control character 0x%02x in string (must be escaped)", c);
            break;
        }
        if (c == '\\') {
            unsigned char e = p->s[p->pos + 1];
            p->pos += 2;
            const char *simple = strchr("\"\\/bfnrt", e);
            if (e && simple) {
                static const char map[] = "\"\\/\b\f\n\r\t";
                buf[len++] = map[simple - "\"\\/bfnrt"];
            } else if (e == 'u') {
                uint32_t cp = 0;
                rc = parse_u_escape(p, &cp);
                if (rc == K3C_OK) len += utf8_put(cp, buf + len);
            } else {
                rc = fail_at(p, p->pos - 2, K3C_EFORMAT, "invalid escape '\\%c'", e >= 0x20 && e < 0x7f ? e : '?');
            }
            continue;
        }
        size_t k = utf8_len(p->s + p->pos, p->n - p->pos);
        if (k == 0) {
            rc = FAIL(p, "invalid UTF-8 in string (byte 0x%02x)", c);
            break;
        }
        memcpy(buf + len, p->s + p->pos, k);
        len += k;
        p->pos += k;
    }
    if (rc != K3C_OK) {
        free(buf);
        return rc;
    }
    buf[len] = 0;
    *out = buf;
    *out_len = len;
    return K3C_OK;
}

/* ------------------------------------------------------------------ numbers */

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int parse_number(parser *p, k3c_json *v) {
    size_t start = p->pos, i = p->pos;
    int neg = 0, integral = 1;
    if (i < p->n && p->s[i] == '-') {
        neg = 1;
        i++;
    }
    if (i >= p->n || !is_digit(p->s[i])) return fail_at(p, i, K3C_EFORMAT, "invalid number (expected a digit)");
    if (p->s[i] == '0' && i + 1 < p->n && is_digit(p->s[i + 1]))
        return fail_at(p, i, K3C_EFORMAT, "invalid number (leading zero)");
    size_t int_start = i;
    while (i < p->n && is_digit(p->s[i])) i++;
    size_t int_end = i;
    if (i < p->n && p->s[i] == '.') {
        integral = 0;
        if (++i >= p->n || !is_digit(p->s[i]))
            return fail_at(p, i, K3C_EFORMAT, "invalid number (digit expected after '.')");
        while (i < p->n && is_digit(p->s[i])) i++;
    }
    if (i < p->n && (p->s[i] == 'e' || p->s[i] == 'E')) {
        integral = 0;
        i++;
        if (i < p->n && (p->s[i] == '+' || p->s[i] == '-')) i++;
        if (i >= p->n || !is_digit(p->s[i]))
            return fail_at(p, i, K3C_EFORMAT, "invalid number (digit expected in exponent)");
        while (i < p->n && is_digit(p->s[i])) i++;
    }
    char small[64], *lex = small;
    size_t len = i - start;
    if (len >= sizeof small && !(lex = malloc(len + 1))) return NOMEM(p);
    memcpy(lex, p->s + start, len);
    lex[len] = 0;
    errno = 0;
    double x = strtod(lex, NULL);
    if (isinf(x)) {
        if (lex != small) free(lex);
        return fail_at(p, start, K3C_EFORMAT, "number out of range (overflows double)");
    }
    v->type = K3C_JSON_NUMBER;
    v->number = x;
    if (integral) {
        /* Accumulate negatively so that INT64_MIN is representable. */
        int64_t acc = 0;
        int fits = 1;
        for (size_t k = int_start; k < int_end && fits; k++) {
            int d = p->s[k] - '0';
            if (acc < (INT64_MIN + d) / 10)
                fits = 0;
            else
                acc = acc * 10 - d;
        }
        if (fits && !neg && acc == INT64_MIN) fits = 0;
        if (fits) {
            v->is_integer = 1;
            v->integer = neg ? acc : -acc;
        }
    }
    /* Most numbers are int64 integers that "%lld" spells again: they keep no copy of their literal. */
    char canon[24];
    int canonical = v->is_integer && snprintf(canon, sizeof canon, "%lld", (long long)v->integer) == (int)len &&
                    !memcmp(canon, lex, len);
    if (!canonical) {
        v->lexeme = lex != small ? lex : malloc(len + 1);
        if (!v->lexeme) return NOMEM(p);
        if (lex == small) memcpy(v->lexeme, small, len + 1);
    } else if (lex != small) {
        free(lex);
    }
    p->pos = i;
    return K3C_OK;
}

/* ------------------------------------------------------------------ values */

static int parse_value(parser *p, k3c_json *v);

static int grow(void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 4;
    while (nc < need) nc *= 2;
    void *q = realloc(*arr, nc * elem);
    if (!q) return -1;
    *arr = q;
    *cap = nc;
    return 0;
}

static int parse_array(parser *p, k3c_json *v) {
    v->type = K3C_JSON_ARRAY;
    p->pos++;
    size_t cap = 0;
    skip_ws(p);
    if (p->pos < p->n && p->s[p->pos] == ']') {
        p->pos++;
        return K3C_OK;
    }
    for (;;) {
        if (grow((void **)&v->items, &cap, v->n + 1, sizeof *v->items)) return NOMEM(p);
        k3c_json *item = &v->items[v->n];
        memset(item, 0, sizeof *item);
        skip_ws(p);
        if (p->pos < p->n && p->s[p->pos] == ']') return FAIL(p, "trailing comma in array");
        int rc = parse_value(p, item);
        if (rc != K3C_OK) {
            free_value(item);
            return rc;
        }
        v->n++;
        skip_ws(p);
        char d[32];
        if (p->pos < p->n && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->n && p->s[p->pos] == ']') {
            p->pos++;
            return K3C_OK;
        }
        return FAIL(p, "expected ',' or ']' in array, got %s", describe(p, d, sizeof d));
    }
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* Finds a repeated key (compared over its full length, embedded NULs included); returns its index or -1.
 * Objects can hold ~500k keys (a sharded safetensors header), so large objects use a hash table. */
static long find_duplicate(char **keys, const size_t *lens, size_t n, int *nomem) {
    if (n <= 16) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (lens[i] == lens[j] && memcmp(keys[i], keys[j], lens[i]) == 0) return (long)i;
        return -1;
    }
    size_t cap = 32;
    while (cap < 2 * n) cap *= 2;
    size_t *tab = calloc(cap, sizeof *tab); /* index + 1, 0 = empty */
    if (!tab) {
        *nomem = 1;
        return -1;
    }
    long dup = -1;
    for (size_t i = 0; i < n && dup < 0; i++) {
        size_t h = (size_t)hash_bytes(keys[i], lens[i]) & (cap - 1);
        for (; tab[h]; h = (h + 1) & (cap - 1)) {
            size_t j = tab[h] - 1;
            if (lens[i] == lens[j] && memcmp(keys[i], keys[j], lens[i]) == 0) {
                dup = (long)i;
                break;
            }
        }
        if (dup < 0) tab[h] = i + 1;
    }
    free(tab);
    return dup;
}

static int parse_members(parser *p, k3c_json *v, size_t **lens, size_t **at) {
    size_t cap = 0, cap_k = 0, cap_l = 0, cap_a = 0;
    for (;;) {
        skip_ws(p);
        char d[32];
        if (p->pos >= p->n || p->s[p->pos] != '"') {
            if (p->pos < p->n && p->s[p->pos] == '}' && v->n > 0) return FAIL(p, "trailing comma in object");
            return FAIL(p, "expected a string key in object, got %s", describe(p, d, sizeof d));
        }
        if (grow((void **)&v->items, &cap, v->n + 1, sizeof *v->items) ||
            grow((void **)&v->keys, &cap_k, v->n + 1, sizeof *v->keys) ||
            grow((void **)lens, &cap_l, v->n + 1, sizeof **lens) || grow((void **)at, &cap_a, v->n + 1, sizeof **at))
            return NOMEM(p);
        (*at)[v->n] = p->pos;
        char *key;
        int rc = parse_string(p, &key, &(*lens)[v->n]);
        if (rc != K3C_OK) return rc;
        k3c_json *item = &v->items[v->n];
        memset(item, 0, sizeof *item);
        v->keys[v->n] = key;
        skip_ws(p);
        if (p->pos >= p->n || p->s[p->pos] != ':') {
            free(key);
            return FAIL(p, "expected ':' after object key, got %s", describe(p, d, sizeof d));
        }
        p->pos++;
        skip_ws(p);
        rc = parse_value(p, item);
        if (rc != K3C_OK) {
            free(key);
            free_value(item);
            return rc;
        }
        v->n++;
        skip_ws(p);
        if (p->pos < p->n && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->n && p->s[p->pos] == '}') {
            p->pos++;
            return K3C_OK;
        }
        return FAIL(p, "expected ',' or '}' in object, got %s", describe(p, d, sizeof d));
    }
}

/* Python's dict semantics for a repeated key: the first position keeps the key, the last value wins. */
static void merge_duplicate(k3c_json *v, size_t *lens, size_t *at, size_t dup) {
    size_t j = 0;
    while (lens[j] != lens[dup] || memcmp(v->keys[j], v->keys[dup], lens[dup])) j++;
    free_value(&v->items[j]);
    v->items[j] = v->items[dup];
    free(v->keys[dup]);
    size_t tail = v->n - dup - 1;
    memmove(v->items + dup, v->items + dup + 1, tail * sizeof *v->items);
    memmove(v->keys + dup, v->keys + dup + 1, tail * sizeof *v->keys);
    memmove(lens + dup, lens + dup + 1, tail * sizeof *lens);
    memmove(at + dup, at + dup + 1, tail * sizeof *at);
    v->n--;
}

static int parse_object(parser *p, k3c_json *v) {
    v->type = K3C_JSON_OBJECT;
    p->pos++;
    skip_ws(p);
    if (p->pos < p->n && p->s[p->pos] == '}') {
        p->pos++;
        return K3C_OK;
    }
    size_t *lens = NULL, *at = NULL;
    int rc = parse_members(p, v, &lens, &at);
    while (rc == K3C_OK) {
        int nomem = 0;
        long dup = find_duplicate(v->keys, lens, v->n, &nomem);
        if (nomem)
            rc = NOMEM(p);
        else if (dup >= 0 && (p->flags & K3C_JSON_P_DUP_KEYS))
            merge_duplicate(v, lens, at, (size_t)dup);
        else if (dup >= 0)
            rc = fail_at(p, at[dup], K3C_EFORMAT, "duplicate key \"%.200s\"", v->keys[dup]);
        else
            break;
    }
    free(lens);
    free(at);
    return rc;
}

static int parse_literal(parser *p, const char *word, k3c_json *v, k3c_json_type type, int b) {
    size_t k = strlen(word);
    if (p->n - p->pos < k || memcmp(p->s + p->pos, word, k) != 0) return FAIL(p, "invalid literal (expected %s)", word);
    p->pos += k;
    v->type = type;
    v->boolean = b;
    return K3C_OK;
}

static int parse_value(parser *p, k3c_json *v) {
    char d[32];
    if (p->pos >= p->n) return FAIL(p, "unexpected end of input (expected a value)");
    unsigned char c = p->s[p->pos];
    switch (c) {
    case '{':
    case '[': {
        if (++p->depth > JSON_MAX_DEPTH) return FAIL(p, "nesting deeper than %d", JSON_MAX_DEPTH);
        int rc = c == '{' ? parse_object(p, v) : parse_array(p, v);
        p->depth--;
        return rc;
    }
    case '"': v->type = K3C_JSON_STRING; return parse_string(p, &v->string, &v->len);
    case 't': return parse_literal(p, "true", v, K3C_JSON_BOOL, 1);
    case 'f': return parse_literal(p, "false", v, K3C_JSON_BOOL, 0);
    case 'n': return parse_literal(p, "null", v, K3C_JSON_NULL, 0);
    case 'N': return FAIL(p, "NaN is not valid JSON");
    case 'I': return FAIL(p, "Infinity is not valid JSON");
    case '/': return FAIL(p, "comments are not valid JSON");
    default:
        if (c == '-' || is_digit(c)) {
            if (c == '-' && p->pos + 1 < p->n && p->s[p->pos + 1] == 'I') return FAIL(p, "Infinity is not valid JSON");
            return parse_number(p, v);
        }
        return FAIL(p, "unexpected %s (expected a value)", describe(p, d, sizeof d));
    }
}

int k3c_json_parse(const char *text, size_t n, const char *name, k3c_json **out, k3c_err *err) {
    return k3c_json_parse_ex(text, n, name, 0, out, err);
}

int k3c_json_parse_ex(const char *text, size_t n, const char *name, int flags, k3c_json **out, k3c_err *err) {
    *out = NULL;
    parser p = {(const unsigned char *)text, n, 0, 0, flags, name ? name : "<json>", err};
    if (!text && n) return k3c_errf(err, K3C_EINVAL, "%s: NULL text", p.name);
    k3c_json *v = calloc(1, sizeof *v);
    if (!v) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", p.name);
    skip_ws(&p);
    int rc = p.pos >= n ? FAIL(&p, "empty document") : parse_value(&p, v);
    if (rc == K3C_OK) {
        skip_ws(&p);
        char d[32];
        if (p.pos < n) rc = FAIL(&p, "trailing garbage after the document: %s", describe(&p, d, sizeof d));
    }
    if (rc != K3C_OK) {
        k3c_json_free(v);
        return rc;
    }
    *out = v;
    return K3C_OK;
}

int k3c_json_parse_file(const char *path, k3c_json **out, k3c_err *err) {
    char *text;
    size_t n;
    *out = NULL;
    int rc = k3c_read_file(path, &text, &n, err);
    if (rc != K3C_OK) return rc;
    rc = k3c_json_parse(text, n, path, out, err);
    free(text);
    return rc;
}

static void free_value(k3c_json *v) {
    if (v->type == K3C_JSON_ARRAY || v->type == K3C_JSON_OBJECT) {
        for (size_t i = 0; i < v->n; i++) {
            free_value(&v->items[i]);
            if (v->keys) free(v->keys[i]);
        }
    }
    free(v->items);
    free(v->keys);
    free(v->string);
    free(v->lexeme);
}

void k3c_json_free(k3c_json *v) {
    if (!v) return;
    free_value(v);
    free(v);
}

const k3c_json *k3c_json_get(const k3c_json *obj, const char *key) {
    if (!obj || obj->type != K3C_JSON_OBJECT || !key) return NULL;
    for (size_t i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
    return NULL;
}

/* ------------------------------------------------------------------ typed field getters */

enum { F_INT, F_NUM, F_BOOL };

const char *k3c_json_type_name(const k3c_json *v) {
    static const char *names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return names[v->type];
}

int k3c_json_is_integral(const k3c_json *v) {
    if (!v || v->type != K3C_JSON_NUMBER) return 0;
    return v->is_integer || (v->lexeme && !strpbrk(v->lexeme, ".eE"));
}

int k3c_json_bad_type(const k3c_json_ctx *c, k3c_json_spot s, const char *want, const k3c_json *v) {
    int number = v->type == K3C_JSON_NUMBER && strcmp(want, "an integer") == 0;
    const char *got = !number                   ? k3c_json_type_name(v)
                      : k3c_json_is_integral(v) ? "an integer beyond the 64-bit range"
                                                : "a number with a fraction or exponent";
    return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: expected %s, got %s", c->file, s.path, s.key, want, got);
}

/* Converts v (present, not null) to the requested kind into *d (and *i for integers / booleans). */
static int convert(const k3c_json_ctx *c, k3c_json_spot s, int kind, const k3c_json *v, int64_t *i, double *d) {
    if (kind == F_INT) {
        if (v->type != K3C_JSON_NUMBER || !v->is_integer) return k3c_json_bad_type(c, s, "an integer", v);
        *i = v->integer;
        *d = (double)v->integer;
    } else if (kind == F_NUM) {
        if (v->type != K3C_JSON_NUMBER) return k3c_json_bad_type(c, s, "a number", v);
        if (!isfinite(v->number)) return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: not finite", c->file, s.path, s.key);
        *d = v->number;
        *i = 0;
    } else {
        if (v->type != K3C_JSON_BOOL) return k3c_json_bad_type(c, s, "true or false", v);
        *i = v->boolean;
        *d = v->boolean;
    }
    return 0;
}

static int missing(const k3c_json_ctx *c, k3c_json_spot a, k3c_json_spot b, int nulls) {
    if (b.key && b.obj)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s (or %s%s): %s", c->file, a.path, a.key, b.path, b.key,
                        nulls ? "null" : "missing");
    return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: %s", c->file, a.path, a.key, nulls ? "null" : "missing");
}

/* Reads a field of `kind` spelled at a or b (see json.h). */
static int read_field(const k3c_json_ctx *c, int kind, int flags, k3c_json_spot a, k3c_json_spot b, int64_t *iout,
                      double *dout, int *present) {
    k3c_json_spot sp[2] = {a, b}, first = a;
    int found = 0, nulls = 0;
    int64_t i0 = 0;
    double d0 = 0;
    for (int k = 0; k < 2; k++) {
        if (!sp[k].key || !sp[k].obj) continue;
        const k3c_json *v = k3c_json_get(sp[k].obj, sp[k].key);
        if (!v) continue;
        int64_t i = 0;
        double d = 0;
        if (v->type == K3C_JSON_NULL) {
            nulls++;
            if (!(flags & K3C_JSON_NULL_ZERO)) continue;
        } else if (convert(c, sp[k], kind, v, &i, &d)) {
            return c->err ? c->err->code : K3C_ECONFIG;
        }
        if (!found) {
            i0 = i;
            d0 = d;
            first = sp[k];
            found = 1;
            continue;
        }
        if (i != i0 || d != d0)
            return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s (%.17g) and %s%s (%.17g) disagree", c->file, first.path,
                            first.key, d0, sp[k].path, sp[k].key, d);
    }
    if (!found && (flags & K3C_JSON_REQ)) return missing(c, a, b, nulls);
    if (iout) *iout = found ? i0 : 0;
    if (dout) *dout = found ? d0 : 0;
    if (present) *present = found;
    return 0;
}

int k3c_json_get_int(const k3c_json_ctx *c, int flags, k3c_json_spot a, k3c_json_spot b, int64_t *out, int *present) {
    return read_field(c, F_INT, flags, a, b, out, NULL, present);
}

int k3c_json_get_num(const k3c_json_ctx *c, int flags, k3c_json_spot a, k3c_json_spot b, double *out, int *present) {
    return read_field(c, F_NUM, flags, a, b, NULL, out, present);
}

int k3c_json_get_bool(const k3c_json_ctx *c, int flags, k3c_json_spot a, k3c_json_spot b, int *out, int *present) {
    int64_t v = 0;
    int rc = read_field(c, F_BOOL, flags, a, b, &v, NULL, present);
    *out = (int)v;
    return rc;
}

int k3c_json_get_str(const k3c_json_ctx *c, int flags, k3c_json_spot s, const char **out) {
    *out = NULL;
    const k3c_json *v = s.obj ? k3c_json_get(s.obj, s.key) : NULL;
    if (!v || v->type == K3C_JSON_NULL) {
        if (flags & K3C_JSON_REQ)
            return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: %s", c->file, s.path, s.key, v ? "null" : "missing");
        return 0;
    }
    if (v->type != K3C_JSON_STRING) return k3c_json_bad_type(c, s, "a string", v);
    *out = v->string;
    return 0;
}

int k3c_json_get_obj(const k3c_json_ctx *c, k3c_json_spot s, const k3c_json **out) {
    *out = NULL;
    const k3c_json *v = s.obj ? k3c_json_get(s.obj, s.key) : NULL;
    if (!v || v->type == K3C_JSON_NULL) return 0;
    if (v->type != K3C_JSON_OBJECT) return k3c_json_bad_type(c, s, "an object", v);
    *out = v;
    return 0;
}

/* ------------------------------------------------------------------ writer */

void k3c_sbuf_init(k3c_sbuf *s) {
    s->buf = NULL;
    s->len = s->cap = 0;
    s->ok = 1;
}

void k3c_sbuf_free(k3c_sbuf *s) {
    free(s->buf);
    k3c_sbuf_init(s);
}

/* Ensures room for `extra` more bytes plus the NUL that keeps buf a C string. */
static int sbuf_reserve(k3c_sbuf *s, size_t extra) {
    if (!s->ok) return 0;
    if (s->len + extra + 1 <= s->cap) return 1;
    size_t nc = s->cap ? s->cap : 64;
    while (nc < s->len + extra + 1) nc *= 2;
    char *q = realloc(s->buf, nc);
    if (!q) {
        s->ok = 0;
        return 0;
    }
    s->buf = q;
    s->cap = nc;
    return 1;
}

void k3c_sbuf_append(k3c_sbuf *s, const char *str, size_t n) {
    if (!sbuf_reserve(s, n)) return;
    if (n) memcpy(s->buf + s->len, str, n);
    s->len += n;
    s->buf[s->len] = 0;
}

void k3c_sbuf_printf(k3c_sbuf *s, const char *fmt, ...) {
    if (!s->ok) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
        s->ok = 0;
        return;
    }
    if (!sbuf_reserve(s, (size_t)k)) return;
    va_start(ap, fmt);
    vsnprintf(s->buf + s->len, (size_t)k + 1, fmt, ap);
    va_end(ap);
    s->len += (size_t)k;
}

void k3c_sbuf_json_string(k3c_sbuf *s, const char *str, size_t n) {
    k3c_sbuf_append(s, "\"", 1);
    size_t run = 0; /* bytes that need no escaping are copied in runs */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)str[i];
        if (c >= 0x80) {
            /* JSON text is UTF-8 (RFC 8259 §8.1): a byte that starts no valid sequence (e.g. a message cut inside a
             * character) is written as U+FFFD, so the document stays parseable. */
            size_t k = utf8_len((const unsigned char *)str + i, n - i);
            if (k) {
                i += k - 1;
                continue;
            }
            k3c_sbuf_append(s, str + run, i - run);
            run = i + 1;
            k3c_sbuf_append(s, "\\ufffd", 6);
            continue;
        }
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        k3c_sbuf_append(s, str + run, i - run);
        run = i + 1;
        switch (c) {
        case '"': k3c_sbuf_append(s, "\\\"", 2); break;
        case '\\': k3c_sbuf_append(s, "\\\\", 2); break;
        case '\n': k3c_sbuf_append(s, "\\n", 2); break;
        case '\r': k3c_sbuf_append(s, "\\r", 2); break;
        case '\t': k3c_sbuf_append(s, "\\t", 2); break;
        case '\b': k3c_sbuf_append(s, "\\b", 2); break;
        case '\f': k3c_sbuf_append(s, "\\f", 2); break;
        default: k3c_sbuf_printf(s, "\\u%04x", c); break;
        }
    }
    k3c_sbuf_append(s, str + run, n - run);
    k3c_sbuf_append(s, "\"", 1);
}

/* JSON has no NaN or infinity: they are written as null (the reader then sees a non-number, never a wrong one). */
void k3c_sbuf_json_number(k3c_sbuf *s, double x) {
    if (!isfinite(x)) {
        k3c_sbuf_append(s, "null", 4);
        return;
    }
    char buf[40];
    static const char *fmts[] = {"%.15g", "%.16g", "%.17g"};
    for (int i = 0; i < 3; i++) {
        snprintf(buf, sizeof buf, fmts[i], x);
        if (i == 2 || strtod(buf, NULL) == x) break;
    }
    k3c_sbuf_append(s, buf, strlen(buf));
}

/* Python's repr(float) (CPython's 'r' format): the shortest round-trip digits, positional with a ".0" when the value is
 * integral and 1e-4 <= |x| < 1e16, else d.ddde+XX. Chat renderers (XTML, K2) must reproduce Python's json.dumps bytes. */
void k3c_sbuf_json_number_py(k3c_sbuf *s, double x) {
    if (!isfinite(x)) {
        k3c_sbuf_append(s, "null", 4);
        return;
    }
    char buf[48];
    for (int p = 0; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p, x);
        if (strtod(buf, NULL) == x) break;
    }
    const char *q = buf;
    if (*q == '-') k3c_sbuf_append(s, q++, 1);
    char dig[24];
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') dig[nd++] = *q;
    int decpt = atoi(q + 1) + 1; /* value = 0.DIGITS x 10^decpt */
    if (decpt > 16 || decpt < -3) {
        k3c_sbuf_append(s, dig, 1);
        if (nd > 1) {
            k3c_sbuf_append(s, ".", 1);
            k3c_sbuf_append(s, dig + 1, (size_t)nd - 1);
        }
        k3c_sbuf_printf(s, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
    } else if (decpt <= 0) {
        k3c_sbuf_append(s, "0.", 2);
        for (int i = 0; i < -decpt; i++) k3c_sbuf_append(s, "0", 1);
        k3c_sbuf_append(s, dig, (size_t)nd);
    } else if (decpt >= nd) {
        k3c_sbuf_append(s, dig, (size_t)nd);
        for (int i = nd; i < decpt; i++) k3c_sbuf_append(s, "0", 1);
        k3c_sbuf_append(s, ".0", 2);
    } else {
        k3c_sbuf_append(s, dig, (size_t)decpt);
        k3c_sbuf_append(s, ".", 1);
        k3c_sbuf_append(s, dig + decpt, (size_t)(nd - decpt));
    }
}

static int key_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b); /* UTF-8 byte order = code point order */
}

/* Python's json.dumps(v, ensure_ascii=False, ...): integers as written, other numbers as repr(float), non-ASCII raw;
 * or, with LEXEMES, every number as written. */
void k3c_sbuf_json_value(k3c_sbuf *s, const k3c_json *v, int flags) {
    const char *comma = (flags & K3C_JSON_W_SPACED) ? ", " : ",", *colon = (flags & K3C_JSON_W_SPACED) ? ": " : ":";
    switch (v->type) {
    case K3C_JSON_NULL: k3c_sbuf_append(s, "null", 4); break;
    case K3C_JSON_BOOL: v->boolean ? k3c_sbuf_append(s, "true", 4) : k3c_sbuf_append(s, "false", 5); break;
    case K3C_JSON_NUMBER:
        /* Python reads an integer literal as an exact int of any size, and "-0" as 0. */
        if (v->is_integer && !(flags & K3C_JSON_W_LEXEMES))
            k3c_sbuf_printf(s, "%lld", (long long)v->integer);
        else if (v->lexeme && ((flags & K3C_JSON_W_LEXEMES) || k3c_json_is_integral(v)))
            k3c_sbuf_append(s, v->lexeme, strlen(v->lexeme));
        else if (v->is_integer)
            k3c_sbuf_printf(s, "%lld", (long long)v->integer);
        else
            k3c_sbuf_json_number_py(s, v->number);
        break;
    case K3C_JSON_STRING: k3c_sbuf_json_string(s, v->string, v->len); break;
    case K3C_JSON_ARRAY:
        k3c_sbuf_append(s, "[", 1);
        for (size_t i = 0; i < v->n; i++) {
            if (i) k3c_sbuf_append(s, comma, strlen(comma));
            k3c_sbuf_json_value(s, &v->items[i], flags);
        }
        k3c_sbuf_append(s, "]", 1);
        break;
    case K3C_JSON_OBJECT: {
        /* Sorting permutes key pointers; each key's value is found again by its (unique) position. */
        const char **order = malloc((v->n ? v->n : 1) * sizeof *order);
        if (!order) {
            s->ok = 0;
            return;
        }
        for (size_t i = 0; i < v->n; i++) order[i] = v->keys[i];
        if (flags & K3C_JSON_W_SORT_KEYS) qsort(order, v->n, sizeof *order, key_cmp);
        k3c_sbuf_append(s, "{", 1);
        for (size_t i = 0; i < v->n; i++) {
            size_t j = 0;
            while (v->keys[j] != order[i]) j++;
            if (i) k3c_sbuf_append(s, comma, strlen(comma));
            k3c_sbuf_json_string(s, order[i], strlen(order[i]));
            k3c_sbuf_append(s, colon, strlen(colon));
            k3c_sbuf_json_value(s, &v->items[j], flags);
        }
        k3c_sbuf_append(s, "}", 1);
        free(order);
        break;
    }
    }
}
