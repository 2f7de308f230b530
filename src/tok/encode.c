/* encode.c — text → ids and ids → bytes (docs/FORMATS.md §8.1, §9.2): allowed special tokens are cut out first,
 * each ordinary run is pre-tokenised and BPE'd piece by piece; segment lists for chat templates; the Kimi release's
 * long-input chunking. */
#include "tok/tok_impl.h"
#include "tok/unicode.h"

#include <stdlib.h>

/* tokenization_kimi.py: TIKTOKEN_MAX_ENCODE_CHARS and MAX_NO_WHITESPACES_CHARS */
#define RELEASE_WINDOW_CHARS 400000
#define RELEASE_MAX_RUN_CHARS 25000

/* The leftmost special token at or after pos (longest spelling first at one position); 0 if there is none. */
static int find_special(const k3c_tok *t, const unsigned char *s, size_t n, size_t pos, size_t *at, size_t *len,
                        int32_t *id) {
    for (size_t k = pos; k < n; k++) {
        if (!t->sp_first[s[k]]) continue;
        for (int li = 0; li < t->n_sp_lens; li++) {
            size_t l = t->sp_lens[li];
            if (l > n - k) continue;
            size_t mask = t->n_sp_slots - 1;
            for (size_t h = tok_hash(s + k, l) & mask; t->sp_slots[h]; h = (h + 1) & mask) {
                uint32_t v = t->sp_slots[h] - 1;
                if (t->sp_len[v] == l && memcmp(t->sp_str[v], s + k, l) == 0) {
                    *at = k;
                    *len = l;
                    *id = t->sp_id[v];
                    return 1;
                }
            }
        }
    }
    return 0;
}

/* Pre-tokens longer than PIECE_MAX bytes are merged in stretches of at most PIECE_MAX bytes, so encoding takes bounded
 * memory whatever the input. A stretch ends at the first place at least PIECE_MAX / 4 bytes in where no token can span
 * (safe_cut): there the merges of the whole piece and of the two sides alone are the same, so the ids are exactly the
 * unbounded ones. Only a piece with no such place in PIECE_MAX bytes (e.g. megabytes of one repeated letter) is cut
 * at PIECE_MAX regardless, the one case where ids differ from merging the whole piece at once. */
#define PIECE_MAX ((size_t)1 << 20)

/* 1 if no part of the piece's BPE can ever span byte p (0 < p < n). Every part is a token, so the first part across
 * p would merge a token ending at p with a token starting at p into a token. rights (max_len bytes of scratch) caches
 * whether s[p, p + r) is a token: 0 unknown, 1 yes, 2 no. */
static int safe_cut(const k3c_tok *t, const unsigned char *s, size_t n, size_t p, unsigned char *rights) {
    size_t L = t->max_len;
    memset(rights, 0, L + 1);
    for (size_t l = 1; l < L && l <= p; l++) {
        if (tok_lookup(t, s + p - l, l) < 0) continue;
        for (size_t r = 1; l + r <= L && p + r <= n; r++) {
            if (!rights[r]) rights[r] = tok_lookup(t, s + p, r) >= 0 ? 1 : 2;
            if (rights[r] == 1 && tok_lookup(t, s + p - l, l + r) >= 0) return 0;
        }
    }
    return 1;
}

static int encode_long_piece(const k3c_tok *t, const unsigned char *s, size_t n, k3c_tok_ids *out) {
    unsigned char *rights = malloc(t->max_len + 1);
    if (!rights) return K3C_ENOMEM;
    int rc = K3C_OK;
    size_t start = 0;
    while (rc == K3C_OK && n - start > PIECE_MAX) {
        size_t cut = start + PIECE_MAX / 4;
        while (cut < start + PIECE_MAX && !safe_cut(t, s, n, cut, rights)) cut++;
        if (cut == start + PIECE_MAX) /* no safe place: cut at a character start (only the ids near it may differ) */
            for (int k = 0; k < 3 && (s[cut] & 0xC0) == 0x80; k++) cut--;
        rc = tok_bpe_merge(t, s + start, cut - start, out);
        start = cut;
    }
    if (rc == K3C_OK) rc = tok_bpe_merge(t, s + start, n - start, out);
    free(rights);
    return rc;
}

static int encode_ordinary(const k3c_tok *t, const unsigned char *s, size_t n, k3c_tok_ids *out) {
    for (size_t i = 0; i < n;) {
        size_t e = k3c_tok_pretok_next(t->pattern, s, n, i);
        int rc = e - i > PIECE_MAX && e - i > t->max_len ? encode_long_piece(t, s + i, e - i, out)
                                                         : tok_bpe_piece(t, s + i, e - i, 0, out);
        if (rc != K3C_OK) return rc;
        i = e;
    }
    return K3C_OK;
}

/* tiktoken's encode: ordinary runs between allowed specials. */
static int encode_plain(const k3c_tok *t, const unsigned char *s, size_t n, int allow, k3c_tok_ids *out) {
    size_t pos = 0;
    while (pos < n) {
        size_t at = n, len = 0;
        int32_t id = -1;
        int found = allow && t->n_sp && find_special(t, s, n, pos, &at, &len, &id);
        int rc = encode_ordinary(t, s + pos, at - pos, out);
        if (rc == K3C_OK && found) rc = k3c_tok_ids_push(out, id);
        if (rc != K3C_OK) return rc;
        if (!found) break;
        pos = at + len;
    }
    return K3C_OK;
}

static int is_pyspace(const unsigned char *s, size_t n, size_t i, size_t *len) {
    uint32_t cp;
    *len = uni_next(s, n, i, &cp);
    return (uni_flags(cp) & UNI_PYSPACE) != 0;
}

/* TikTokenTokenizer._split_whitespaces_or_nonwhitespaces over one window: a run of more than RELEASE_MAX_RUN_CHARS
 * characters of one kind (str.isspace() or not) is cut every RELEASE_MAX_RUN_CHARS characters. */
static int encode_window(const k3c_tok *t, const unsigned char *s, size_t n, int allow, k3c_tok_ids *out) {
    size_t start = 0, len;
    int cur_space = n ? is_pyspace(s, n, 0, &len) : 0;
    long run = 0;
    for (size_t i = 0; i < n; i += len) {
        int sp = is_pyspace(s, n, i, &len);
        if (sp != cur_space) {
            run = 1;
            cur_space = sp;
            continue;
        }
        if (++run > RELEASE_MAX_RUN_CHARS) {
            int rc = encode_plain(t, s + start, i - start, allow, out);
            if (rc != K3C_OK) return rc;
            start = i;
            run = 1;
        }
    }
    return encode_plain(t, s + start, n - start, allow, out);
}

static int encode_release(const k3c_tok *t, const unsigned char *s, size_t n, int allow, k3c_tok_ids *out) {
    for (size_t w = 0; w < n;) {
        size_t e = w;
        uint32_t cp;
        for (long chars = 0; e < n && chars < RELEASE_WINDOW_CHARS; chars++) e += uni_next(s, n, e, &cp);
        int rc = encode_window(t, s + w, e - w, allow, out);
        if (rc != K3C_OK) return rc;
        w = e;
    }
    return K3C_OK;
}

size_t k3c_utf8_check(const void *s, size_t n) {
    const unsigned char *p = s;
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        size_t l = uni_next(p, n, i, &cp);
        if (cp > 0x10FFFF) return i;
        i += l;
    }
    return n;
}

int k3c_utf8_replace(const void *s, size_t n, char **out, size_t *out_len, size_t *n_bad, k3c_err *err) {
    const unsigned char *p = s;
    size_t bad = 0, o = 0;
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        size_t l = uni_next(p, n, i, &cp);
        bad += cp > 0x10FFFF;
        i += l;
    }
    if (n_bad) *n_bad = bad;
    char *b = malloc(n + 2 * bad + 1);
    if (!b) return k3c_errf(err, K3C_ENOMEM, "utf8_replace: cannot allocate %zu bytes", n + 2 * bad + 1);
    for (size_t i = 0; i < n;) {
        size_t l = uni_next(p, n, i, &cp);
        if (cp > 0x10FFFF) {
            memcpy(b + o, "\xEF\xBF\xBD", 3);
            o += 3;
        } else {
            memcpy(b + o, p + i, l);
            o += l;
        }
        i += l;
    }
    b[o] = 0;
    *out = b;
    if (out_len) *out_len = o;
    return K3C_OK;
}

int k3c_tok_encode(const k3c_tok *t, const void *text, size_t n, int flags, k3c_tok_ids *out, k3c_err *err) {
    if (flags & K3C_TOK_STRICT_UTF8) {
        size_t bad = k3c_utf8_check(text, n);
        if (bad < n)
            return k3c_errf(err, K3C_EFORMAT, "encode: invalid UTF-8 at byte %zu (0x%02X)", bad,
                            ((const unsigned char *)text)[bad]);
    }
    int allow = (flags & K3C_TOK_ALLOW_SPECIAL) != 0;
    int rc = t->release_chunking && !(flags & K3C_TOK_NO_CHUNKING) ? encode_release(t, text, n, allow, out)
                                                                   : encode_plain(t, text, n, allow, out);
    if (rc != K3C_OK) return k3c_errf(err, rc, "encode: out of memory (%zu bytes of text)", n);
    return K3C_OK;
}

int k3c_tok_encode_segments(const k3c_tok *t, const k3c_tok_segment *segs, size_t nseg, k3c_tok_ids *out,
                            size_t *seg_end, k3c_err *err) {
    for (size_t i = 0; i < nseg; i++) {
        int rc =
            k3c_tok_encode(t, segs[i].text, segs[i].len, segs[i].allow_special ? K3C_TOK_ALLOW_SPECIAL : 0, out, err);
        if (rc != K3C_OK) {
            k3c_err_wrap(err, "segment %zu", i);
            return rc;
        }
        if (seg_end) seg_end[i] = out->n;
    }
    return K3C_OK;
}

int k3c_tok_decode(const k3c_tok *t, const int32_t *ids, size_t n, char **bytes, size_t *len, k3c_err *err) {
    *bytes = NULL;
    size_t total = 0;
    const unsigned char *p;
    size_t l;
    for (size_t i = 0; i < n; i++) {
        if (k3c_tok_token_bytes(t, ids[i], &p, &l, err) != K3C_OK) return k3c_err_wrap(err, "decode: position %zu", i);
        total += l;
    }
    char *buf = malloc(total + 1);
    if (!buf) return k3c_errf(err, K3C_ENOMEM, "decode: cannot allocate %zu bytes", total);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        k3c_tok_token_bytes(t, ids[i], &p, &l, NULL);
        memcpy(buf + o, p, l);
        o += l;
    }
    buf[o] = 0;
    *bytes = buf;
    if (len) *len = o;
    return K3C_OK;
}
