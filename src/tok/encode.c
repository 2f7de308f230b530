/* encode.c — text → ids and ids → bytes (spec/CHECKPOINTS.md §8.1, §9.2): allowed special tokens are cut out first,
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

static int encode_ordinary(const k3c_tok *t, const unsigned char *s, size_t n, k3c_tok_ids *out) {
    for (size_t i = 0; i < n;) {
        size_t e = k3c_tok_pretok_next(t->pattern, s, n, i);
        int rc = tok_bpe_piece(t, s + i, e - i, 0, out);
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

int k3c_tok_encode(const k3c_tok *t, const void *text, size_t n, int flags, k3c_tok_ids *out, k3c_err *err) {
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
