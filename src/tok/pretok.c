/* pretok.c — hand-written matchers for the cl100k and Kimi pre-tokenisation regexes (docs/FORMATS.md §8.1, §8.3;
 * docs/TRAINING.md §7.4): each alternative is tried in order at the current position with the regex's exact backtracking result. */
#include "tok/tok.h"
#include "tok/unicode.h"

#include <string.h>

/* One decoded character: its class flags and byte length. */
typedef struct {
    uint32_t cp;
    unsigned f;
    size_t len;
} uchar;

static inline uchar at(const unsigned char *s, size_t n, size_t i) {
    uchar c;
    c.len = uni_next(s, n, i, &c.cp);
    c.f = uni_flags(c.cp);
    return c;
}

static inline int is_letter(unsigned f) {
    unsigned g = f & UNI_GROUP;
    return g >= UNI_LU && g <= UNI_LO;
}
static inline int is_number(unsigned f) { return (f & UNI_GROUP) == UNI_N; }
static inline int is_white(unsigned f) { return (f & UNI_WHITE) != 0; }
static inline int is_newline(uint32_t cp) { return cp == '\r' || cp == '\n'; }
/* [^\r\n\p{L}\p{N}]: the optional one-character prefix of a word */
static inline int is_prefix(uchar c) { return !is_newline(c.cp) && !is_letter(c.f) && !is_number(c.f); }
/* [^\s\p{L}\p{N}]: punctuation and symbols (marks included) */
static inline int is_punct(unsigned f) { return !is_white(f) && !is_letter(f) && !is_number(f); }

/* Kimi's A = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] and B = [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] */
static inline int kimi_a(unsigned f) {
    unsigned g = f & UNI_GROUP;
    return !(f & UNI_HAN) && (g == UNI_LU || g == UNI_LT || g == UNI_LM || g == UNI_LO || g == UNI_M);
}
static inline int kimi_b(unsigned f) {
    unsigned g = f & UNI_GROUP;
    return !(f & UNI_HAN) && (g == UNI_LL || g == UNI_LM || g == UNI_LO || g == UNI_M);
}

/* End of the maximal run of characters satisfying pred, starting at i. */
static size_t run_end(const unsigned char *s, size_t n, size_t i, int (*pred)(unsigned)) {
    while (i < n) {
        uchar c = at(s, n, i);
        if (!pred(c.f)) break;
        i += c.len;
    }
    return i;
}

static int is_han(unsigned f) { return (f & UNI_HAN) != 0; }

static inline int fold_eq(uchar c, char lower) {
    if (c.cp == (uint32_t)lower || c.cp == (uint32_t)(lower - 32)) return 1;
    return lower == 's' && c.cp == 0x17F; /* simple case folding: LATIN SMALL LETTER LONG S folds to s */
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) at i: the end of the match, or i when there is none. Unicode case-insensitive, as
 * tiktoken's fancy-regex matches it. */
static size_t contraction(const unsigned char *s, size_t n, size_t i) {
    if (i + 1 >= n || s[i] != '\'') return i;
    uchar a = at(s, n, i + 1);
    if (fold_eq(a, 's') || fold_eq(a, 't') || fold_eq(a, 'm') || fold_eq(a, 'd')) return i + 1 + a.len;
    if (i + 1 + a.len >= n) return i;
    uchar b = at(s, n, i + 1 + a.len);
    if ((fold_eq(a, 'r') && fold_eq(b, 'e')) || (fold_eq(a, 'v') && fold_eq(b, 'e')) ||
        (fold_eq(a, 'l') && fold_eq(b, 'l')))
        return i + 1 + a.len + b.len;
    return i;
}

/* ` ?[^\s\p{L}\p{N}]+[\r\n]*` at i, or 0. */
static size_t punct_run(const unsigned char *s, size_t n, size_t i) {
    size_t j = i;
    if (s[i] == ' ' && i + 1 < n && is_punct(at(s, n, i + 1).f)) j = i + 1;
    if (!is_punct(at(s, n, j).f)) return 0;
    size_t e = run_end(s, n, j, is_punct);
    while (e < n && (s[e] == '\r' || s[e] == '\n')) e++;
    return e;
}

/* `\s*[\r\n]+|\s+(?!\S)|\s+` at i (a whitespace character): through the run's last CR/LF if it has one; else the whole
 * run at the end of the text; else the run minus its last character (left to precede the next word), unless the run is
 * a single character. */
static size_t white_run(const unsigned char *s, size_t n, size_t i) {
    size_t e = i, last_nl_end = 0, last_start = i;
    while (e < n) {
        uchar c = at(s, n, e);
        if (!is_white(c.f)) break;
        if (is_newline(c.cp)) last_nl_end = e + 1;
        last_start = e;
        e += c.len;
    }
    if (last_nl_end) return last_nl_end;
    if (e == n) return e;
    return last_start > i ? last_start : e;
}

/* Kimi alternative 2 body from j: A*B+ then an optional contraction; 0 if B+ cannot match. Backtracking A* to the
 * rightmost place where B+ can start: the character after the A run if it is B, else the last A run character that is
 * also B (and then B+ is that one character, since what follows it is A but not B). */
static size_t kimi_lower_word(const unsigned char *s, size_t n, size_t j) {
    size_t k = j, last_ab_end = 0;
    while (k < n) {
        uchar c = at(s, n, k);
        if (!kimi_a(c.f)) break;
        if (kimi_b(c.f)) last_ab_end = k + c.len;
        k += c.len;
    }
    size_t e;
    if (k < n && kimi_b(at(s, n, k).f))
        e = run_end(s, n, k, kimi_b);
    else if (last_ab_end)
        e = last_ab_end;
    else
        return 0;
    return contraction(s, n, e);
}

/* Kimi alternative 3 body from j: A+B* then an optional contraction; 0 if A+ cannot match. */
static size_t kimi_upper_word(const unsigned char *s, size_t n, size_t j) {
    if (j >= n || !kimi_a(at(s, n, j).f)) return 0;
    size_t e = run_end(s, n, run_end(s, n, j, kimi_a), kimi_b);
    return contraction(s, n, e);
}

static size_t number_run(const unsigned char *s, size_t n, size_t i) {
    size_t e = i;
    for (int k = 0; k < 3 && e < n; k++) {
        uchar c = at(s, n, e);
        if (!is_number(c.f)) break;
        e += c.len;
    }
    return e;
}

/* [\p{Han}]+ | P?A*B+C? | P?A+B*C? | \p{N}{1,3} | ` ?[^\s\p{L}\p{N}]+[\r\n]*` | \s*[\r\n]+ | \s+(?!\S) | \s+ */
static size_t kimi_next(const unsigned char *s, size_t n, size_t i) {
    uchar c = at(s, n, i);
    if (c.f & UNI_HAN) return run_end(s, n, i, is_han);
    size_t e;
    int pre = is_prefix(c);
    if (pre && (e = kimi_lower_word(s, n, i + c.len))) return e;
    if ((e = kimi_lower_word(s, n, i))) return e;
    if (pre && (e = kimi_upper_word(s, n, i + c.len))) return e;
    if ((e = kimi_upper_word(s, n, i))) return e;
    if (is_number(c.f)) return number_run(s, n, i);
    if ((e = punct_run(s, n, i))) return e;
    if (is_white(c.f)) return white_run(s, n, i);
    return i + c.len; /* unreachable: the alternatives cover every character */
}

static int letter_pred(unsigned f) { return is_letter(f); }

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} | ` ?[^\s\p{L}\p{N}]+[\r\n]*` | \s*[\r\n]+ |
 * \s+(?!\S) | \s+  (gpt-tokenizer's rewrite `…|\s+$|\s*[\r\n]|\s+(?!\S)|\s` cuts trailing whitespace differently but
 * gives the same ids with cl100k's ranks, which hold no token with whitespace after a newline) */
static size_t cl100k_next(const unsigned char *s, size_t n, size_t i) {
    size_t e = contraction(s, n, i);
    if (e > i) return e;
    uchar c = at(s, n, i);
    if (is_prefix(c) && i + c.len < n && is_letter(at(s, n, i + c.len).f)) return run_end(s, n, i + c.len, letter_pred);
    if (is_letter(c.f)) return run_end(s, n, i, letter_pred);
    if (is_number(c.f)) return number_run(s, n, i);
    if ((e = punct_run(s, n, i))) return e;
    if (is_white(c.f)) return white_run(s, n, i);
    return i + c.len;
}

size_t k3c_tok_pretok_next(k3c_tok_pattern pat, const unsigned char *s, size_t n, size_t i) {
    return pat == K3C_TOK_PATTERN_CL100K ? cl100k_next(s, n, i) : kimi_next(s, n, i);
}

int k3c_tok_pattern_parse(const char *name, k3c_tok_pattern *out) {
    if (strcmp(name, "kimi") == 0) {
        *out = K3C_TOK_PATTERN_KIMI;
        return K3C_OK;
    }
    if (strcmp(name, "cl100k") == 0) {
        *out = K3C_TOK_PATTERN_CL100K;
        return K3C_OK;
    }
    return K3C_EINVAL;
}

const char *k3c_tok_pattern_name(k3c_tok_pattern p) { return p == K3C_TOK_PATTERN_CL100K ? "cl100k" : "kimi"; }
