/* tok_impl.h — the inside of k3c_tok shared by vocab.c, bpe.c, encode.c and train.c (docs/FORMATS.md §8.3:
 * bytes → rank hash map for encoding, rank → bytes for decoding, specials in a separate table). Not for other modules. */
#ifndef K3C_TOK_IMPL_H
#define K3C_TOK_IMPL_H

#include "tok/tok.h"

#include <string.h>

struct k3c_tok {
    k3c_tok_pattern pattern;
    int release_chunking;

    /* ranks: the bytes of rank r are blob[span[r].off ..][0 .. span[r].len); len 0 marks a gap */
    int32_t n_ranks;
    int32_t n_tokens; /* ranks in use (n_ranks minus gaps) */
    size_t max_len;   /* longest token in bytes */
    int32_t cap_ranks;
    struct {
        uint32_t off, len;
    } * span;
    unsigned char *blob;
    size_t blob_len, blob_cap;
    uint64_t *slots; /* open addressing on the bytes: (hash >> 32) << 32 | (rank + 1), 0 = empty */
    size_t n_slots;  /* power of two */
    int32_t byte_rank[256];

    /* specials, kept sorted by id */
    int n_sp, cap_sp;
    char **sp_str;
    size_t *sp_len;
    int32_t *sp_id;
    uint32_t *sp_slots; /* index + 1 */
    size_t n_sp_slots;
    unsigned char sp_first[256]; /* 1 if some special starts with this byte */
    size_t *sp_lens;             /* distinct spellings' lengths, longest first (matched longest first) */
    int n_sp_lens;
};

static inline uint64_t tok_hash(const unsigned char *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t k = 0; k < n; k++) w |= (uint64_t)p[k] << (8 * k);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 32;
    return h;
}

/* rank of bytes p[0..n), or -1 */
static inline int32_t tok_lookup(const struct k3c_tok *t, const unsigned char *p, size_t n) {
    size_t mask = t->n_slots - 1;
    uint64_t h = tok_hash(p, n), tag = h >> 32;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        uint64_t s = t->slots[i];
        if (s == 0) return -1;
        uint32_t r = (uint32_t)s - 1; /* the tag spares a trip to the token bytes for most non-matching slots */
        if (s >> 32 == tag && t->span[r].len == n && memcmp(t->blob + t->span[r].off, p, n) == 0) return (int32_t)r;
    }
}

/* Creates an empty tokenizer (no ranks, no specials). */
int tok_new(k3c_tok_pattern pat, k3c_tok **out, k3c_err *err);
/* Adds bytes with a rank; returns 0, K3C_ENOMEM, or 1 if the bytes are already a token (*existing gets its rank)
 * or 2 if the rank is already used. */
int tok_add_rank(k3c_tok *t, const unsigned char *p, size_t n, int32_t rank, int32_t *existing);
/* Checks that all 256 single bytes are ranks and fills byte_rank. */
int tok_finish_ranks(k3c_tok *t, const char *name, k3c_err *err);

/* BPE of one pre-token appended to out (algo as in k3c_tok_encode_piece); 0, K3C_ENOMEM or K3C_EINVAL. */
int tok_bpe_piece(const k3c_tok *t, const unsigned char *s, size_t n, int algo, k3c_tok_ids *out);
/* The merges alone on s[0..n) (no whole-piece shortcut): one stretch of a pre-token cut where no token can span. */
int tok_bpe_merge(const k3c_tok *t, const unsigned char *s, size_t n, k3c_tok_ids *out);

#endif
