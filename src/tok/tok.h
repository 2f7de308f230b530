/* tok.h — k3c's tokenizer: byte-level BPE in the tiktoken format with a separate special-token table, the cl100k and
 * Kimi (K2/K3) pre-tokenisers, segment-wise encoding for chat templates, and a BPE trainer (docs/FORMATS.md §8, §9.2).
 *
 * Model: a vocabulary maps byte strings to ranks (rank = token id = merge priority, lower merges first); special tokens
 * live in their own table with ids that no rank uses. Encoding = cut the text at allowed special-token spellings, cut
 * each ordinary run into pre-tokens with the pattern's matcher, then BPE each pre-token on its own. A k3c_tok is
 * read-only once loaded, so any number of threads may encode and decode with it at the same time. */
#ifndef K3C_TOK_H
#define K3C_TOK_H

#include "base/base.h"

/* ---------------------------------------------------------------- pre-tokenisation patterns */

/* End offset of the pre-token that starts at byte i of s[0..n) (i < n); the pieces tile the text exactly.
 * Invalid UTF-8 bytes are single characters of no class (they group with punctuation). */
size_t k3c_tok_pretok_next(k3c_tok_pattern pat, const unsigned char *s, size_t n, size_t i);

/* ---------------------------------------------------------------- the tokenizer object */
int k3c_tok_parse(const char *text, size_t n, const char *name, k3c_tok_pattern pat, int flags, k3c_tok **out,
                  k3c_err *err);

/* Adds one special token. Its id must not be a rank and neither id nor spelling may repeat. */
int k3c_tok_add_special(k3c_tok *t, const char *str, size_t len, int32_t id, k3c_err *err);
/* Adds every special token of a JSON object, read from `path` (descending first into key `table` when non-NULL, e.g.
 * "kimi_k3" in the golden special_tokens.json or "added_tokens_decoder" in a tokenizer_config.json). Accepted entry
 * shapes: "163586": "<|end_of_msg|>" (id → spelling), "163586": {"content": "..."} (tokenizer_config), and
 * "<|endoftext|>": 4096 (spelling → id, the trainer's sidecar). */
int k3c_tok_load_specials_json(k3c_tok *t, const char *path, const char *table, k3c_err *err);
/* The Kimi tokenizer: tiktoken.model + a special table (table NULL = "kimi_k3"), Kimi pattern, and the release's
 * long-input chunking switched on (see k3c_tok_set_release_chunking). */
int k3c_tok_load_kimi(const char *model_path, const char *specials_json, const char *table, k3c_tok **out,
                      k3c_err *err);
/* tokenization_kimi.py's encode cuts the text into 400,000-character windows and cuts runs of more than 25,000
 * consecutive str.isspace() / non-space characters, encoding each piece on its own; on = do the same (default off). */
void k3c_tok_set_release_chunking(k3c_tok *t, int on);

k3c_tok_pattern k3c_tok_get_pattern(const k3c_tok *t);
int32_t k3c_tok_n_ranks(const k3c_tok *t); /* largest rank + 1 */
int k3c_tok_n_specials(const k3c_tok *t);
/* The i-th special token in id order (0 <= i < n_specials). */
void k3c_tok_special_at(const k3c_tok *t, int i, const char **str, size_t *len, int32_t *id);
int32_t k3c_tok_rank_of(const k3c_tok *t, const void *bytes, size_t len); /* -1 if those bytes are not a token */

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

/* Offset of the first byte of s[0..n) that does not start a valid shortest-form UTF-8 sequence (a stray continuation
 * byte, an overlong form, a surrogate, a code point past U+10FFFF, a sequence cut short), or n if all of it is valid. */
size_t k3c_utf8_check(const void *s, size_t n);
/* A malloc'd copy of s[0..n) with each such byte replaced by U+FFFD (EF BF BD); *n_bad (may be NULL) counts them. */
int k3c_utf8_replace(const void *s, size_t n, char **out, size_t *out_len, size_t *n_bad, k3c_err *err);

/* ---------------------------------------------------------------- files */
/* Writes the ranks as a tiktoken file (atomically) and, when there are specials, "<path>.specials.json" with
 * spelling → id (also atomically). */
int k3c_tok_save(const k3c_tok *t, const char *path, k3c_err *err);

/* Strict standard base64 (RFC 4648 alphabet, '=' padding, canonical); out needs 3*(n/4) bytes. 0 or K3C_EFORMAT. */
int k3c_base64_decode(const char *s, size_t n, unsigned char *out, size_t *out_len);
size_t k3c_base64_encode(const unsigned char *in, size_t n,
                         char *out); /* out needs 4*ceil(n/3) bytes; returns length */

/* ---------------------------------------------------------------- training */
typedef struct {
    int32_t vocab_size; /* ranks to learn, including the 256 single bytes (>= 256) */
    k3c_tok_pattern pattern;
    const char *const *specials; /* spellings given the ids right after the learned ranks (vocab_size, vocab_size + 1,
                                  * ... unless the corpus ran out of pairs); cut out of the corpus before counting */
    int n_specials;
    /* optional progress report every few merges: done / total merges */
    void (*progress)(void *ctx, int32_t done, int32_t total);
    void *progress_ctx;
} k3c_tok_train_opts;

/* Learns a byte-level BPE from the given texts: ranks 0..255 are the bytes 0x00..0xFF, then one rank per merge in the
 * order learned (most frequent adjacent pair first, ties to the smaller (left, right) ids). Stops early when no pair
 * occurs twice; k3c_tok_n_ranks tells how many were learned. Deterministic. */
int k3c_tok_train(const char *const *texts, const size_t *lens, int ntexts, const k3c_tok_train_opts *opts,
                  k3c_tok **out, k3c_err *err);

#endif
