/* unicode.h — code-point classes for the hand-written pre-tokenisers (docs/FORMATS.md §8.1, §8.3): general-category
 * groups, Script=Han, White_Space and Python's isspace, looked up from the generated table in unicode_tables.c. */
#ifndef K3C_TOK_UNICODE_H
#define K3C_TOK_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* bits 0-2: the category group the regexes distinguish */
enum { UNI_OTHER = 0, UNI_LU = 1, UNI_LL = 2, UNI_LT = 3, UNI_LM = 4, UNI_LO = 5, UNI_M = 6, UNI_N = 7, UNI_GROUP = 7 };
enum {
    UNI_HAN = 8,      /* Script=Han */
    UNI_WHITE = 16,   /* White_Space: the regexes' \s */
    UNI_PYSPACE = 32, /* Python str.isspace(): the Kimi release's run splitting */
};

extern const uint8_t k3c_uni_latin1[256];
extern const uint32_t k3c_uni_runs[];
extern const int k3c_uni_nruns;

/* Code points past U+10FFFF stand for undecodable bytes (see uni_next) and have no class. */
static inline unsigned uni_flags(uint32_t cp) {
    if (cp < 256) return k3c_uni_latin1[cp];
    if (cp > 0x10FFFF) return 0;
    uint32_t key = cp << 8 | 0xFF;
    int lo = 0, hi = k3c_uni_nruns - 1; /* last run whose start <= cp */
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (k3c_uni_runs[mid] <= key)
            lo = mid;
        else
            hi = mid - 1;
    }
    return k3c_uni_runs[lo] & 0xFF;
}

/* Decodes the UTF-8 character at s[i] (i < n) into *cp and returns its length. A byte that does not start a valid,
 * shortest-form sequence decodes alone as 0x110000 + byte, so every input splits and round-trips exactly. */
static inline size_t uni_next(const unsigned char *s, size_t n, size_t i, uint32_t *cp) {
    unsigned c = s[i];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (len == 0 || c > 0xF4 || i + len > n) goto bad;
    uint32_t v = c & (0x3F >> (len - 1));
    for (size_t k = 1; k < len; k++) {
        if ((s[i + k] & 0xC0) != 0x80) goto bad;
        v = v << 6 | (s[i + k] & 0x3F);
    }
    if ((len == 3 && (v < 0x800 || (v >= 0xD800 && v < 0xE000))) || (len == 4 && (v < 0x10000 || v > 0x10FFFF)))
        goto bad;
    *cp = v;
    return len;
bad:
    *cp = 0x110000 + c;
    return 1;
}

#endif
