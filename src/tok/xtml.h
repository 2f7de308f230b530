/* xtml.h — chat prompts for Kimi models: render OpenAI-style messages + tools to the exact prompt and its segments, and
 * parse (also while streaming) model output back into reasoning, content and typed tool calls. Two formats: K3's XTML
 * (docs/FORMATS.md §9.2) and the K2-style envelope Kimi Linear uses (§9.1). */
#ifndef K3C_XTML_H
#define K3C_XTML_H

#include "k3c.h"
#include "base/json.h"

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

#endif
