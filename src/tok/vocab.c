/* vocab.c — the tokenizer's tables: tiktoken rank files (load, save), base64, the bytes → rank hash map and the special
 * token table with its JSON forms (docs/FORMATS.md §8.1–8.3; tiktoken `load.py` format). */
#include "tok/tok_impl.h"

#include "base/json.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- base64 */
static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

int k3c_base64_decode(const char *s, size_t n, unsigned char *out, size_t *out_len) {
    if (n % 4 != 0) return K3C_EFORMAT;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)s[i + k];
            if (c == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
                continue;
            }
            if (pad) return K3C_EFORMAT; /* data after padding */
            if ((v[k] = b64_value(c)) < 0) return K3C_EFORMAT;
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        /* canonical: the bits that padding drops must be zero */
        if ((pad == 1 && (w & 0xFF)) || (pad == 2 && (w & 0xFFFF))) return K3C_EFORMAT;
        out[o++] = (unsigned char)(w >> 16);
        if (pad < 2) out[o++] = (unsigned char)(w >> 8);
        if (pad < 1) out[o++] = (unsigned char)w;
    }
    *out_len = o;
    return K3C_OK;
}

size_t k3c_base64_encode(const unsigned char *in, size_t n, char *out) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) | (i + 2 < n ? in[i + 2] : 0);
        out[o++] = abc[w >> 18 & 63];
        out[o++] = abc[w >> 12 & 63];
        out[o++] = i + 1 < n ? abc[w >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? abc[w & 63] : '=';
    }
    return o;
}

/* ---------------------------------------------------------------- ranks */
int tok_new(k3c_tok_pattern pat, k3c_tok **out, k3c_err *err) {
    k3c_tok *t = calloc(1, sizeof *t);
    if (!t) return k3c_errf(err, K3C_ENOMEM, "tokenizer: out of memory");
    t->pattern = pat;
    t->n_slots = 1024;
    t->slots = calloc(t->n_slots, sizeof *t->slots);
    t->n_sp_slots = 64;
    t->sp_slots = calloc(t->n_sp_slots, sizeof *t->sp_slots);
    if (!t->slots || !t->sp_slots) {
        k3c_tok_free(t);
        return k3c_errf(err, K3C_ENOMEM, "tokenizer: out of memory");
    }
    for (int b = 0; b < 256; b++) t->byte_rank[b] = -1;
    *out = t;
    return K3C_OK;
}

void k3c_tok_free(k3c_tok *t) {
    if (!t) return;
    free(t->span);
    free(t->blob);
    free(t->slots);
    for (int i = 0; i < t->n_sp; i++) free(t->sp_str[i]);
    free(t->sp_str);
    free(t->sp_len);
    free(t->sp_id);
    free(t->sp_slots);
    free(t->sp_lens);
    free(t);
}

static int grow_slots(k3c_tok *t) {
    size_t n = t->n_slots * 2;
    uint64_t *s = calloc(n, sizeof *s);
    if (!s) return K3C_ENOMEM;
    for (int32_t r = 0; r < t->n_ranks; r++) {
        if (t->span[r].len == 0) continue;
        uint64_t h = tok_hash(t->blob + t->span[r].off, t->span[r].len);
        size_t i = h & (n - 1);
        while (s[i]) i = (i + 1) & (n - 1);
        s[i] = (h >> 32) << 32 | ((uint64_t)r + 1);
    }
    free(t->slots);
    t->slots = s;
    t->n_slots = n;
    return K3C_OK;
}

static int reserve_ranks(k3c_tok *t, int32_t need) {
    if (need <= t->cap_ranks) return K3C_OK;
    int32_t cap = t->cap_ranks ? t->cap_ranks : 1024;
    while (cap < need) cap = cap > (1 << 29) ? need : cap * 2;
    void *span = realloc(t->span, (size_t)cap * sizeof *t->span);
    if (!span) return K3C_ENOMEM;
    t->span = span;
    memset(t->span + t->cap_ranks, 0, (size_t)(cap - t->cap_ranks) * sizeof *t->span);
    t->cap_ranks = cap;
    return K3C_OK;
}

int tok_add_rank(k3c_tok *t, const unsigned char *p, size_t n, int32_t rank, int32_t *existing) {
    int32_t r0 = tok_lookup(t, p, n);
    if (r0 >= 0) {
        if (existing) *existing = r0;
        return 1;
    }
    if (rank < t->n_ranks && t->span[rank].len != 0) {
        if (existing) *existing = rank;
        return 2;
    }
    if (reserve_ranks(t, rank + 1) != K3C_OK) return K3C_ENOMEM;
    if (t->blob_len + n > t->blob_cap) {
        size_t cap = t->blob_cap ? t->blob_cap * 2 : 65536;
        while (cap < t->blob_len + n) cap *= 2;
        if (cap > UINT32_MAX) return K3C_ENOMEM;
        unsigned char *b = realloc(t->blob, cap);
        if (!b) return K3C_ENOMEM;
        t->blob = b;
        t->blob_cap = cap;
    }
    if ((size_t)(t->n_tokens + 1) * 2 > t->n_slots && grow_slots(t) != K3C_OK) return K3C_ENOMEM;
    memcpy(t->blob + t->blob_len, p, n);
    t->span[rank].off = (uint32_t)t->blob_len;
    t->span[rank].len = (uint32_t)n;
    t->blob_len += n;
    t->n_tokens++;
    if (n > t->max_len) t->max_len = n;
    if (rank >= t->n_ranks) t->n_ranks = rank + 1;
    uint64_t h = tok_hash(p, n);
    size_t mask = t->n_slots - 1, i = h & mask;
    while (t->slots[i]) i = (i + 1) & mask;
    t->slots[i] = (h >> 32) << 32 | ((uint64_t)rank + 1);
    return K3C_OK;
}

int tok_finish_ranks(k3c_tok *t, const char *name, k3c_err *err) {
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        t->byte_rank[b] = tok_lookup(t, &c, 1);
        if (t->byte_rank[b] < 0)
            return k3c_errf(err, K3C_EFORMAT, "%s: the single byte 0x%02x has no rank (a byte-level BPE needs all 256)",
                            name, b);
    }
    return K3C_OK;
}

/* With K3C_TOK_LOAD_ALLOW_GAPS, ranks may run at most this far past the number of lines (all gaps together). */
#define MAX_GAP (1 << 20)

/* One `base64 SP rank` line (without its LF). */
static int parse_line(k3c_tok *t, const char *line, size_t n, long lineno, const char *name, int flags,
                      int64_t max_rank, unsigned char *buf, k3c_err *err) {
    const char *sp = memchr(line, ' ', n);
    if (!sp) return k3c_errf(err, K3C_EFORMAT, "%s:%ld: line without a space (expected 'base64 rank')", name, lineno);
    size_t blen = (size_t)(sp - line);
    size_t tl;
    if (blen == 0) return k3c_errf(err, K3C_EFORMAT, "%s:%ld: empty token", name, lineno);
    if (k3c_base64_decode(line, blen, buf, &tl) != K3C_OK)
        return k3c_errf(err, K3C_EFORMAT, "%s:%ld: bad base64 '%.*s'", name, lineno, (int)(blen > 80 ? 80 : blen),
                        line);
    const char *r = sp + 1, *end = line + n;
    if (r == end) return k3c_errf(err, K3C_EFORMAT, "%s:%ld: missing rank after the token", name, lineno);
    int64_t rank = 0;
    for (const char *q = r; q < end; q++) {
        if (*q < '0' || *q > '9' || rank > INT32_MAX / 10)
            return k3c_errf(err, K3C_EFORMAT, "%s:%ld: bad rank '%.*s'", name, lineno,
                            (int)(end - r > 40 ? 40 : end - r), r);
        rank = rank * 10 + (*q - '0');
    }
    if (rank >= INT32_MAX)
        return k3c_errf(err, K3C_EFORMAT, "%s:%ld: rank %lld too large", name, lineno, (long long)rank);
    if (rank > max_rank) /* the rank table is sized by the largest rank: a tiny file must not ask for gigabytes */
        return k3c_errf(err, K3C_EFORMAT, "%s:%ld: rank %lld is more than %d past the file's line count", name, lineno,
                        (long long)rank, MAX_GAP);
    if (!(flags & K3C_TOK_LOAD_ALLOW_GAPS) && rank != t->n_ranks)
        return k3c_errf(err, K3C_EFORMAT, "%s:%ld: rank %lld out of order: ranks must be 0, 1, 2, ... (expected %d)",
                        name, lineno, (long long)rank, t->n_ranks);
    int32_t other = -1;
    int rc = tok_add_rank(t, buf, tl, (int32_t)rank, &other);
    if (rc == 1) return k3c_errf(err, K3C_EFORMAT, "%s:%ld: duplicate token (already rank %d)", name, lineno, other);
    if (rc == 2) return k3c_errf(err, K3C_EFORMAT, "%s:%ld: duplicate rank %lld", name, lineno, (long long)rank);
    if (rc != K3C_OK) return k3c_errf(err, K3C_ENOMEM, "%s:%ld: out of memory", name, lineno);
    return K3C_OK;
}

int k3c_tok_parse(const char *text, size_t n, const char *name, k3c_tok_pattern pat, int flags, k3c_tok **out,
                  k3c_err *err) {
    *out = NULL;
    k3c_tok *t;
    int rc = tok_new(pat, &t, err);
    if (rc != K3C_OK) return rc;
    size_t longest = 0;
    int64_t lines = 0;
    for (size_t i = 0, ls = 0; i <= n; i++)
        if (i == n || text[i] == '\n') {
            if (i - ls > longest) longest = i - ls;
            ls = i + 1;
            lines++;
        }
    unsigned char *buf = malloc(longest / 4 * 3 + 4);
    if (!buf) {
        k3c_tok_free(t);
        return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", name);
    }
    long lineno = 0;
    for (size_t i = 0; i < n && rc == K3C_OK;) {
        const char *nl = memchr(text + i, '\n', n - i);
        size_t e = nl ? (size_t)(nl - text) : n, le = e;
        lineno++;
        if (le > i && text[le - 1] == '\r') le--; /* tolerate CRLF files */
        if (le > i) rc = parse_line(t, text + i, le - i, lineno, name, flags, lines + MAX_GAP, buf, err);
        i = e + 1;
    }
    free(buf);
    if (rc == K3C_OK && t->n_ranks == 0) rc = k3c_errf(err, K3C_EFORMAT, "%s: no ranks", name);
    if (rc == K3C_OK) rc = tok_finish_ranks(t, name, err);
    if (rc != K3C_OK) {
        k3c_tok_free(t);
        return rc;
    }
    *out = t;
    return K3C_OK;
}

int k3c_tok_load(const char *path, k3c_tok_pattern pat, int flags, k3c_tok **out, k3c_err *err) {
    char *text;
    size_t n;
    *out = NULL;
    int rc = k3c_read_file(path, &text, &n, err);
    if (rc != K3C_OK) return rc;
    rc = k3c_tok_parse(text, n, path, pat, flags, out, err);
    free(text);
    return rc;
}

/* ---------------------------------------------------------------- specials */
static int sp_find(const k3c_tok *t, const void *s, size_t n) {
    size_t mask = t->n_sp_slots - 1;
    for (size_t i = tok_hash(s, n) & mask;; i = (i + 1) & mask) {
        uint32_t v = t->sp_slots[i];
        if (v == 0) return -1;
        if (t->sp_len[v - 1] == n && memcmp(t->sp_str[v - 1], s, n) == 0) return (int)v - 1;
    }
}

static int sp_rehash(k3c_tok *t, size_t n_slots) {
    uint32_t *s = calloc(n_slots, sizeof *s);
    if (!s) return K3C_ENOMEM;
    for (int k = 0; k < t->n_sp; k++) {
        size_t i = tok_hash((const unsigned char *)t->sp_str[k], t->sp_len[k]) & (n_slots - 1);
        while (s[i]) i = (i + 1) & (n_slots - 1);
        s[i] = (uint32_t)k + 1;
    }
    free(t->sp_slots);
    t->sp_slots = s;
    t->n_sp_slots = n_slots;
    return K3C_OK;
}

static int sp_reserve(k3c_tok *t) {
    if (t->n_sp < t->cap_sp) return K3C_OK;
    int cap = t->cap_sp ? t->cap_sp * 2 : 32;
    char **s = realloc(t->sp_str, (size_t)cap * sizeof *s);
    if (s) t->sp_str = s;
    size_t *l = realloc(t->sp_len, (size_t)cap * sizeof *l);
    if (l) t->sp_len = l;
    int32_t *id = realloc(t->sp_id, (size_t)cap * sizeof *id);
    if (id) t->sp_id = id;
    size_t *ls = realloc(t->sp_lens, (size_t)cap * sizeof *ls);
    if (ls) t->sp_lens = ls;
    if (!s || !l || !id || !ls) return K3C_ENOMEM;
    t->cap_sp = cap;
    return K3C_OK;
}

int k3c_tok_add_special(k3c_tok *t, const char *str, size_t len, int32_t id, k3c_err *err) {
    if (len == 0) return k3c_errf(err, K3C_EINVAL, "special token %d: empty spelling", id);
    if (id < 0) return k3c_errf(err, K3C_EINVAL, "special token '%.*s': negative id %d", (int)len, str, id);
    if (id < t->n_ranks && t->span[id].len != 0)
        return k3c_errf(err, K3C_EINVAL, "special token '%.*s': id %d is already a merge rank", (int)len, str, id);
    if (k3c_tok_is_special(t, id))
        return k3c_errf(err, K3C_EINVAL, "special token '%.*s': id %d is already special", (int)len, str, id);
    if (sp_find(t, str, len) >= 0)
        return k3c_errf(err, K3C_EINVAL, "special token '%.*s' defined twice", (int)len, str);
    char *copy = malloc(len + 1);
    if (!copy || sp_reserve(t) != K3C_OK) {
        free(copy);
        return k3c_errf(err, K3C_ENOMEM, "special tokens: out of memory");
    }
    memcpy(copy, str, len);
    copy[len] = 0;
    int at = t->n_sp; /* keep the table sorted by id */
    while (at > 0 && t->sp_id[at - 1] > id) at--;
    memmove(t->sp_str + at + 1, t->sp_str + at, (size_t)(t->n_sp - at) * sizeof *t->sp_str);
    memmove(t->sp_len + at + 1, t->sp_len + at, (size_t)(t->n_sp - at) * sizeof *t->sp_len);
    memmove(t->sp_id + at + 1, t->sp_id + at, (size_t)(t->n_sp - at) * sizeof *t->sp_id);
    t->sp_str[at] = copy;
    t->sp_len[at] = len;
    t->sp_id[at] = id;
    t->n_sp++;
    if (sp_rehash(t, (size_t)t->n_sp * 4 > t->n_sp_slots ? t->n_sp_slots * 2 : t->n_sp_slots) != K3C_OK)
        return k3c_errf(err, K3C_ENOMEM, "special tokens: out of memory");
    t->sp_first[(unsigned char)str[0]] = 1;
    int k = 0;
    while (k < t->n_sp_lens && t->sp_lens[k] > len) k++;
    if (k == t->n_sp_lens || t->sp_lens[k] != len) {
        memmove(t->sp_lens + k + 1, t->sp_lens + k, (size_t)(t->n_sp_lens - k) * sizeof *t->sp_lens);
        t->sp_lens[k] = len;
        t->n_sp_lens++;
    }
    return K3C_OK;
}

static int add_special_entry(k3c_tok *t, const char *key, const k3c_json *v, const char *where, k3c_err *err) {
    char *end;
    errno = 0;
    long long id = strtoll(key, &end, 10);
    int key_is_id = *key && *end == 0 && errno == 0 && id >= 0 && id < INT32_MAX;
    const k3c_json *content = v->type == K3C_JSON_OBJECT ? k3c_json_get(v, "content") : NULL;
    int rc;
    if (key_is_id && v->type == K3C_JSON_STRING)
        rc = k3c_tok_add_special(t, v->string, v->len, (int32_t)id, err);
    else if (key_is_id && content && content->type == K3C_JSON_STRING)
        rc = k3c_tok_add_special(t, content->string, content->len, (int32_t)id, err);
    else if (v->type == K3C_JSON_NUMBER && v->is_integer && v->integer >= 0 && v->integer < INT32_MAX)
        rc = k3c_tok_add_special(t, key, strlen(key), (int32_t)v->integer, err);
    else
        return k3c_errf(err, K3C_EFORMAT,
                        "%s: entry '%s': expected \"id\": \"spelling\", \"id\": {\"content\": ...} or "
                        "\"spelling\": id",
                        where, key);
    if (rc != K3C_OK) k3c_err_wrap(err, "%s", where);
    return rc;
}

int k3c_tok_load_specials_json(k3c_tok *t, const char *path, const char *table, k3c_err *err) {
    k3c_json *doc;
    int rc = k3c_json_parse_file(path, &doc, err);
    if (rc != K3C_OK) return rc;
    const k3c_json *obj = table ? k3c_json_get(doc, table) : doc;
    if (!obj || obj->type != K3C_JSON_OBJECT)
        rc = k3c_errf(err, K3C_EFORMAT, "%s: %s%s%s is not an object", path, table ? "key '" : "the document",
                      table ? table : "", table ? "'" : "");
    for (size_t i = 0; rc == K3C_OK && i < obj->n; i++)
        rc = add_special_entry(t, obj->keys[i], &obj->items[i], path, err);
    k3c_json_free(doc);
    return rc;
}

int k3c_tok_load_kimi(const char *model_path, const char *specials_json, const char *table, k3c_tok **out,
                      k3c_err *err) {
    int rc = k3c_tok_load(model_path, K3C_TOK_PATTERN_KIMI, 0, out, err);
    if (rc != K3C_OK) return rc;
    if (specials_json) rc = k3c_tok_load_specials_json(*out, specials_json, table ? table : "kimi_k3", err);
    if (rc != K3C_OK) {
        k3c_tok_free(*out);
        *out = NULL;
        return rc;
    }
    k3c_tok_set_release_chunking(*out, 1);
    return K3C_OK;
}

/* ---------------------------------------------------------------- queries */
void k3c_tok_set_release_chunking(k3c_tok *t, int on) { t->release_chunking = on != 0; }
k3c_tok_pattern k3c_tok_get_pattern(const k3c_tok *t) { return t->pattern; }
int32_t k3c_tok_n_ranks(const k3c_tok *t) { return t->n_ranks; }
int k3c_tok_n_specials(const k3c_tok *t) { return t->n_sp; }

int32_t k3c_tok_n_vocab(const k3c_tok *t) {
    int32_t n = t->n_ranks;
    if (t->n_sp && t->sp_id[t->n_sp - 1] + 1 > n) n = t->sp_id[t->n_sp - 1] + 1;
    return n;
}

int32_t k3c_tok_special_id(const k3c_tok *t, const char *str) {
    int k = sp_find(t, str, strlen(str));
    return k < 0 ? -1 : t->sp_id[k];
}

void k3c_tok_special_at(const k3c_tok *t, int i, const char **str, size_t *len, int32_t *id) {
    if (str) *str = t->sp_str[i];
    if (len) *len = t->sp_len[i];
    if (id) *id = t->sp_id[i];
}

static int sp_index_of_id(const k3c_tok *t, int32_t id) {
    int lo = 0, hi = t->n_sp - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (t->sp_id[mid] == id) return mid;
        if (t->sp_id[mid] < id)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

int k3c_tok_is_special(const k3c_tok *t, int32_t id) { return sp_index_of_id(t, id) >= 0; }

int32_t k3c_tok_rank_of(const k3c_tok *t, const void *bytes, size_t len) { return tok_lookup(t, bytes, len); }

int k3c_tok_token_bytes(const k3c_tok *t, int32_t id, const unsigned char **bytes, size_t *len, k3c_err *err) {
    if (id >= 0 && id < t->n_ranks && t->span[id].len != 0) {
        *bytes = t->blob + t->span[id].off;
        *len = t->span[id].len;
        return K3C_OK;
    }
    int k = sp_index_of_id(t, id);
    if (k < 0) return k3c_errf(err, K3C_EINVAL, "token id %d is neither a rank nor a special token", id);
    *bytes = (const unsigned char *)t->sp_str[k];
    *len = t->sp_len[k];
    return K3C_OK;
}

/* ---------------------------------------------------------------- saving */
static int save_specials(const k3c_tok *t, const char *path, k3c_err *err) {
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_sbuf_append(&s, "{\n", 2);
    for (int i = 0; i < t->n_sp; i++) {
        k3c_sbuf_append(&s, "  ", 2);
        k3c_sbuf_json_string(&s, t->sp_str[i], t->sp_len[i]);
        k3c_sbuf_printf(&s, ": %d%s\n", t->sp_id[i], i + 1 < t->n_sp ? "," : "");
    }
    k3c_sbuf_append(&s, "}\n", 2);
    char side[4096];
    int rc = snprintf(side, sizeof side, "%s.specials.json", path) >= (int)sizeof side
                 ? k3c_errf(err, K3C_EINVAL, "%s: path too long", path)
             : !s.ok ? k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path)
                     : k3c_write_file_atomic(side, s.buf, s.len, err);
    k3c_sbuf_free(&s);
    return rc;
}

int k3c_tok_save(const k3c_tok *t, const char *path, k3c_err *err) {
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    char *b64 = malloc(4 * (65536 / 3 + 2));
    size_t b64_cap = 4 * (65536 / 3 + 1);
    int rc = b64 ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path);
    for (int32_t r = 0; rc == K3C_OK && r < t->n_ranks; r++) {
        if (t->span[r].len == 0) continue;
        if (4 * ((size_t)t->span[r].len / 3 + 1) > b64_cap) {
            rc = k3c_errf(err, K3C_EINVAL, "%s: token %d longer than 64 KiB", path, r);
            break;
        }
        size_t n = k3c_base64_encode(t->blob + t->span[r].off, t->span[r].len, b64);
        k3c_sbuf_append(&s, b64, n);
        k3c_sbuf_printf(&s, " %d\n", r);
    }
    if (rc == K3C_OK && !s.ok) rc = k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path);
    if (rc == K3C_OK) rc = k3c_write_file_atomic(path, s.buf, s.len, err);
    if (rc == K3C_OK && t->n_sp) rc = save_specials(t, path, err);
    free(b64);
    k3c_sbuf_free(&s);
    return rc;
}
