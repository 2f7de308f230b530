/* k3c/tok.h — the public API of the tokenizer beyond k3c.h's loading, encoding and decoding: special tokens, the
 * vocabulary's numbers, UTF-8 checks, saving and the BPE trainer (docs/FORMATS.md §8); and chat prompts for Kimi
 * models: render OpenAI-style messages + tools to the exact prompt and its segments, and parse (also while streaming)
 * model output back into reasoning, content and typed tool calls, in K3's XTML (§9.2) or the K2-style envelope Kimi
 * Linear uses (§9.1). */
#ifndef K3C_TOK_PUBLIC_H
#define K3C_TOK_PUBLIC_H

#include "k3c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- the tokenizer (docs/FORMATS.md §8) */
/* Adds one special token. Its id must not be a rank and neither id nor spelling may repeat. */
int k3c_tok_add_special(k3c_tok *t, const char *str, size_t len, int32_t id, k3c_err *err);

/* Adds every special token of a JSON object, read from `path` (descending first into key `table` when non-NULL, e.g.
 * "kimi_k3" in the golden special_tokens.json or "added_tokens_decoder" in a tokenizer_config.json). Accepted entry
 * shapes: "163586": "<|end_of_msg|>" (id → spelling), "163586": {"content": "..."} (tokenizer_config), and
 * "<|endoftext|>": 4096 (spelling → id, the trainer's sidecar). */
int k3c_tok_load_specials_json(k3c_tok *t, const char *path, const char *table, k3c_err *err);

/* tokenization_kimi.py's encode cuts the text into 400,000-character windows and cuts runs of more than 25,000
 * consecutive str.isspace() / non-space characters, encoding each piece on its own; on = do the same (default off). */
void k3c_tok_set_release_chunking(k3c_tok *t, int on);

k3c_tok_pattern k3c_tok_get_pattern(const k3c_tok *t);
int32_t k3c_tok_n_ranks(const k3c_tok *t); /* largest rank + 1 */
int k3c_tok_n_specials(const k3c_tok *t);
/* The i-th special token in id order (0 <= i < n_specials). */
void k3c_tok_special_at(const k3c_tok *t, int i, const char **str, size_t *len, int32_t *id);
int32_t k3c_tok_rank_of(const k3c_tok *t, const void *bytes, size_t len); /* -1 if those bytes are not a token */

/* Offset of the first byte of s[0..n) that does not start a valid shortest-form UTF-8 sequence (a stray continuation
 * byte, an overlong form, a surrogate, a code point past U+10FFFF, a sequence cut short), or n if all of it is valid. */
size_t k3c_utf8_check(const void *s, size_t n);
/* A malloc'd copy of s[0..n) with each such byte replaced by U+FFFD (EF BF BD); *n_bad (may be NULL) counts them. */
int k3c_utf8_replace(const void *s, size_t n, char **out, size_t *out_len, size_t *n_bad, k3c_err *err);

/* Writes the ranks as a tiktoken file (atomically) and, when there are specials, "<path>.specials.json" with
 * spelling → id (also atomically). */
int k3c_tok_save(const k3c_tok *t, const char *path, k3c_err *err);

/* Strict standard base64 (RFC 4648 alphabet, '=' padding, canonical), as tiktoken files and data: URLs spell it;
 * out needs 3*(n/4) bytes. 0 or K3C_EFORMAT. */
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

/* ---------------------------------------------------------------- chat formats (docs/FORMATS.md §9) */
typedef enum {
    K3C_CHAT_XTML = 0, /* Kimi K3: <|open|>tag attr="v"<|sep|> ... <|close|>tag<|sep|>, <|end_of_msg|> */
    K3C_CHAT_K2 = 1,   /* Kimi Linear / K2: <|im_user|>user<|im_middle|> ... <|im_end|>, tool-call section tokens */
} k3c_chat_format;

/* "xtml" / "k3" or "k2" / "kimi_linear"; K3C_EINVAL otherwise. */
int k3c_chat_format_parse(const char *name, k3c_chat_format *out);

/* The special tokens the two chat formats render (K3's XTML markers, then the K2-style ones), in the order a vocabulary
 * built for serving lists them: a tokenizer trained with these as specials can encode every rendered prompt. */
#define K3C_CHAT_N_SPECIALS 16
extern const char *const k3c_chat_specials[K3C_CHAT_N_SPECIALS];

/* ---------------------------------------------------------------- rendering */

/* A run of the prompt: text[off, off+len). Markup runs are control tokens (tokenize with specials allowed); the others
 * are ordinary text (a "<|sep|>" a user typed stays text). Each run is tokenized on its own: BPE never merges across
 * run borders, so ` role` `="` `user` are separate runs exactly as the release's encoder emits them. */
typedef struct {
    size_t off, len;
    int markup;
} k3c_chat_segment;

typedef struct {
    char *text; /* the whole prompt, NUL-terminated (concatenation of the segments) */
    size_t len;
    k3c_chat_segment *segs;
    size_t nseg;
} k3c_chat_prompt;

/* Renders `messages` (a JSON array of {role, content, ...}), `tools` (an array of OpenAI tool objects, a mapping of name
 * to tool, or NULL / null) and `options` (an object or NULL):
 *   format                  "xtml" (default) or "k2"
 *   add_generation_prompt   bool, default true
 *   thinking                bool, default true (XTML: think channel on every assistant turn and in the prompt)
 *   thinking_effort         "low" | "high" | "max"; absent: no thinking-effort turn (XTML, thinking on)
 *   tool_choice             "required" | "none" add a tool-choice turn; other values add nothing (XTML)
 *   response_format         {"type": "json_object"} or {"type": "json_schema", "json_schema": {...}} (XTML)
 *   response_schema         the schema itself, overriding the one inside response_format (XTML)
 *   image_prompts           array of strings spliced (as markup) at each image part / placeholder (XTML)
 *   default_system          K2: the system turn added when the first message is not a system one
 * XTML reproduces the release's encoding_k3.py byte for byte (including tool results re-sorted into call order,
 * key-sorted compact tool JSON, argument values as Python's json.dumps writes them: exact integers of any size, floats
 * in repr, arguments sent as text read as json.loads reads them). Like the release, XTML skips messages that are not
 * objects and roles other than system, user, assistant and tool. Errors name the message index and field. `out` is
 * owned by the caller (k3c_chat_prompt_free). */
int k3c_chat_render(const k3c_json *messages, const k3c_json *tools, const k3c_json *options, k3c_chat_prompt *out,
                    k3c_err *err);
void k3c_chat_prompt_free(k3c_chat_prompt *p);

/* ---------------------------------------------------------------- parsing model output */

/* Where the output starts: in the channel the generation prompt opened (think, or XTML's response), or outside any
 * (text before the first marker is then content). Output that breaks the markup — a close without its open, a missing
 * or unexpected channel marker, an element the format does not have, a call without a name — is read past: tool calls
 * and content are recovered, and no chat control token ever lands in reasoning or content. `strict` makes such output
 * an error instead (format checks that score it). */
typedef struct {
    k3c_chat_format format;
    int in_think;    /* the prompt opened the think channel (XTML thinking on; K2 prompt ending in <think>) */
    int in_response; /* XTML: the prompt opened the response channel (thinking off) */
    int strict;
} k3c_chat_parse_opts;

/* From a JSON object {"format": "xtml"|"k2", "in_think": bool, "in_response": bool, "strict": bool} (absent: false;
 * NULL: XTML, neither channel open). */
int k3c_chat_parse_opts_from_json(const k3c_json *o, k3c_chat_parse_opts *out, k3c_err *err);

typedef struct {
    char *name;
    int index;       /* as written in the output: XTML's index attribute (1-based), K2's functions.name:IDX (0-based) */
    char *arguments; /* compact JSON object text, values typed ({"n":3,"s":"x"}, integers of any size exact); a JSON
                      * string if unparsable. XTML reads typed arguments, one json element, or a bare JSON block. */
    int finished;    /* 0: the output ended inside the call (the arguments read so far) */
} k3c_chat_tool_call;

typedef struct {
    char *reasoning, *content; /* NUL-terminated, never NULL once parsing started */
    size_t reasoning_len, content_len;
    k3c_chat_tool_call *calls;
    size_t ncalls;
    int finished; /* the assistant message was closed (<|close|>message / <|end_of_msg|> / <|im_end|>) */
} k3c_chat_result;

typedef enum {
    K3C_CHAT_DELTA_REASONING,  /* text, len */
    K3C_CHAT_DELTA_CONTENT,    /* text, len */
    K3C_CHAT_DELTA_CALL_BEGIN, /* name, index: a tool call started (CALL follows, unless the output is cut off) */
    K3C_CHAT_DELTA_CALL_ARGS,  /* text, len: the next piece of the call's arguments (JSON text) as it is read; the
                                  pieces add up to CALL's arguments unless `diverged` is set on CALL */
    K3C_CHAT_DELTA_CALL,       /* name, index, arguments (JSON text): a tool call is complete (partial: cut off) */
    K3C_CHAT_DELTA_FINISHED,
} k3c_chat_delta_kind;

typedef struct {
    k3c_chat_delta_kind kind;
    const char *text;
    size_t len;
    const char *name;
    int index;
    const char *arguments;
    int partial;  /* CALL: the output ended inside this call */
    int diverged; /* CALL: the streamed pieces are not its arguments (a repeated key, a json block after typed ones) */
} k3c_chat_delta;
typedef void (*k3c_chat_delta_fn)(void *ctx, const k3c_chat_delta *d);

/* A streaming parser: feed it the decoded output in pieces of any size (bytes, token strings); text that could still
 * be the start of a marker, or an incomplete UTF-8 sequence, is held back until the next piece decides it, so a marker
 * split across decode steps never leaks into content. The concatenation of the deltas equals the final result. */
typedef struct k3c_chat_parser k3c_chat_parser;
int k3c_chat_parser_new(const k3c_chat_parse_opts *opts, k3c_chat_delta_fn on_delta, void *ctx, k3c_chat_parser **out,
                        k3c_err *err);
int k3c_chat_parser_feed(k3c_chat_parser *p, const char *s, size_t n, k3c_err *err);
/* End of output: releases held-back text (an unfinished marker was text after all, an unfinished tag header was not);
 * a tool call left open is returned with the arguments read so far (finished 0). */
int k3c_chat_parser_finish(k3c_chat_parser *p, k3c_err *err);
const k3c_chat_result *k3c_chat_parser_result(const k3c_chat_parser *p);
void k3c_chat_parser_free(k3c_chat_parser *p);

/* One-shot: parse the whole output into `out` (free with k3c_chat_result_free). */
int k3c_chat_parse(const k3c_chat_parse_opts *opts, const char *s, size_t n, k3c_chat_result *out, k3c_err *err);
void k3c_chat_result_free(k3c_chat_result *r);
/* {"reasoning":...,"content":...,"tool_calls":[{"name":...,"index":...,"arguments":{...}}],"finished":...} */
void k3c_chat_result_json(k3c_sbuf *s, const k3c_chat_result *r);

#ifdef __cplusplus
}
#endif
#endif
