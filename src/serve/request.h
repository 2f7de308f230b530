/* request.h — the OpenAI-compatible request layer: a JSON body → a validated request (sampling parameters, stop
 * strings, the prompt ids, rendered through the chat format for chat completions) or an OpenAI-style error naming the
 * parameter. No I/O: the HTTP layer and the fuzz target call it alike. */
#ifndef K3C_SERVE_REQUEST_H
#define K3C_SERVE_REQUEST_H

#include "serve/constrain.h"
#include "serve/sched.h"
#include "serve/stop.h"
#include "tok/xtml.h"

typedef enum { K3C_API_CHAT, K3C_API_COMPLETION, K3C_API_TOKENIZE, K3C_API_DETOKENIZE } k3c_api_kind;

#define K3C_API_MAX_N 16 /* choices per request at most */

/* An error answer: HTTP status and the body's {"error": {"message", "type", "param", "code"}}. */
typedef struct {
    int status;
    const char *type; /* "invalid_request_error", "authentication_error", "not_found_error", "server_error", ... */
    const char
        *code;      /* "invalid_type", "invalid_value", "missing_required_parameter", "context_length_exceeded", ... */
    char param[64]; /* "" when no single parameter is to blame */
    char message[768];
} k3c_api_error;

int k3c_api_fail(k3c_api_error *e, int status, const char *type, const char *code, const char *param, const char *fmt,
                 ...) __attribute__((format(printf, 6, 7)));

/* What the server serves: the model and the limits requests are checked against. */
typedef struct {
    const k3c_tok *tok;
    k3c_chat_format format;
    const char *model_name;
    int64_t n_vocab;        /* the model's vocabulary: prompt ids must be below it */
    int64_t max_context;    /* prompt + completion tokens */
    int64_t max_tokens_cap; /* completion tokens per request at most (also the default) */
    /* images (docs/VISION.md "Serving images"): the tower, NULL when the model reads none */
    const k3c_vision *vision;
    int max_images;           /* per request */
    size_t max_image_bytes;   /* encoded bytes of one image */
    int64_t max_image_pixels; /* decoded pixels of one image */
    int thinking_off;         /* XTML requests default to thinking off (a checkpoint fine-tuned without it) */
} k3c_api_limits;

/* The image limits a server and `k3c chat` apply: 16 images of 2 MiB and 16 Mpixel each. */
#define K3C_API_MAX_IMAGES 16
#define K3C_API_MAX_IMAGE_BYTES ((size_t)2 << 20)
#define K3C_API_MAX_IMAGE_PIXELS ((int64_t)1 << 24)

typedef struct {
    k3c_api_kind kind;
    k3c_json *root;
    int stream, include_usage;
    /* what the engine is asked for: sampling, max_new (after capping), the image rows (pointing at embeds /
     * embed_pos below); the server adds its stop ids and time limits */
    k3c_request gen;
    int logprobs; /* report each token's logprob (and gen.sampler.logprobs alternatives) */
    int n;        /* choices: n sequences of the prompt, sampled with seeds gen.sampler.seed + 0 .. n-1 */
    int nstop;
    const char *stop[K3C_STOP_MAX]; /* point into root */
    k3c_tok_ids prompt;             /* chat, completion, tokenize: the ids */
    char *text;                     /* detokenize: the decoded text */
    size_t text_len;
    k3c_chat_parse_opts parse; /* chat: how to parse the model's output */
    int has_tools;
    int one_call;       /* parallel_tool_calls false: generation ends after the first complete tool call */
    k3c_cgrammar *grammar;  /* response_format / tool_choice as constrained decoding (NULL: none); the call takes it */
    const k3c_vtrie *trie;  /* the vocabulary trie the grammar is built over (NULL: its mask tries every id) */
    float *embeds;      /* chat with images: [n_embeds, hidden] image embeddings for the prompt rows embed_pos */
    int32_t *embed_pos; /* the <|media_pad|> positions, ascending */
    int64_t n_embeds;
} k3c_api_req;

/* Parses and validates body[0..n) as a request of `kind`; on error fills e and returns its status (>= 400), else 0.
 * The request owns its memory (k3c_api_req_free, also after an error). */
int k3c_api_parse(k3c_api_kind kind, const char *body, size_t n, const k3c_api_limits *lim, k3c_api_req *out,
                  k3c_api_error *e);
/* The same with the server's vocabulary trie for constrained decoding (k3c_api_parse: none). */
int k3c_api_parse_trie(k3c_api_kind kind, const char *body, size_t n, const k3c_api_limits *lim,
                       const k3c_vtrie *trie, k3c_api_req *out, k3c_api_error *e);
void k3c_api_req_free(k3c_api_req *r);

/* images.c: runs every image part of msgs through lim->vision (r->embeds, n_embeds) and writes their prompts as a JSON
 * array of strings into prompts (the renderer's image_prompts). Returns the image count, or an error status >= 400 (a
 * model without vision, a remote or malformed URL, bad base64, not a PNG / JPEG, too large). */
int k3c_api_images(const k3c_json *msgs, const k3c_api_limits *lim, k3c_api_req *r, k3c_sbuf *prompts,
                   k3c_api_error *e);
/* After tokenizing: r->embed_pos from the prompt's <|media_pad|> ids, which must number r->n_embeds. */
int k3c_api_image_rows(const k3c_api_limits *lim, k3c_api_req *r, k3c_api_error *e);

#endif
