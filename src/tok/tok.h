/* tok.h — internal to k3c's tokenizer (its public API: k3c.h and k3c/tok.h): byte-level BPE in the tiktoken format
 * with a separate special-token table, the cl100k and Kimi (K2/K3) pre-tokenisers, segment-wise encoding for chat
 * templates (docs/FORMATS.md §8, §9.2).
 *
 * Model: a vocabulary maps byte strings to ranks (rank = token id = merge priority, lower merges first); special tokens
 * live in their own table with ids that no rank uses. Encoding = cut the text at allowed special-token spellings, cut
 * each ordinary run into pre-tokens with the pattern's matcher, then BPE each pre-token on its own. A k3c_tok is
 * read-only once loaded, so any number of threads may encode and decode with it at the same time. */
#ifndef K3C_TOK_H
#define K3C_TOK_H

#include "base/base.h"
#include "k3c/tok.h"

/* ---------------------------------------------------------------- pre-tokenisation patterns */

/* End offset of the pre-token that starts at byte i of s[0..n) (i < n); the pieces tile the text exactly.
 * Invalid UTF-8 bytes are single characters of no class (they group with punctuation). */
size_t k3c_tok_pretok_next(k3c_tok_pattern pat, const unsigned char *s, size_t n, size_t i);

/* ---------------------------------------------------------------- the tokenizer object */
int k3c_tok_parse(const char *text, size_t n, const char *name, k3c_tok_pattern pat, int flags, k3c_tok **out,
                  k3c_err *err);

/* The Kimi tokenizer: tiktoken.model + a special table (table NULL = "kimi_k3"), Kimi pattern, and the release's
 * long-input chunking switched on (see k3c_tok_set_release_chunking). */
int k3c_tok_load_kimi(const char *model_path, const char *specials_json, const char *table, k3c_tok **out,
                      k3c_err *err);

/* ---------------------------------------------------------------- encoding and decoding */
/* A chat-template segment (docs/FORMATS.md §9.2): markup segments allow special tokens, content segments do not.
 * Each segment is encoded on its own (BPE never merges across segments) and the ids are concatenated. */
typedef struct {
    const char *text;
    size_t len;
    int allow_special;
} k3c_tok_segment;
/* Appends the ids of all segments; seg_end (NULL or nseg entries) receives out->n after each segment, so a caller can
 * give every segment's ids a loss mask. */
int k3c_tok_encode_segments(const k3c_tok *t, const k3c_tok_segment *segs, size_t nseg, k3c_tok_ids *out,
                            size_t *seg_end, k3c_err *err);

/* BPE of one pre-token (no pre-tokenisation, no specials): the tiktoken rule — the whole piece's rank if it is a
 * token, else repeatedly merge the adjacent pair whose concatenation has the lowest rank (leftmost on ties).
 * algo: 0 = automatic, 1 = linear rescans (short pieces), 2 = heap (long pieces); all give the same ids. */
int k3c_tok_encode_piece(const k3c_tok *t, const void *piece, size_t len, int algo, k3c_tok_ids *out, k3c_err *err);

#endif
