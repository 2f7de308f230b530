/* response.h — OpenAI-compatible response bodies: error objects, chat completions and completions, their streamed
 * chunk objects as server-sent events ("data: {...}\n\n", closed by "data: [DONE]"), and usage. */
#ifndef K3C_SERVE_RESPONSE_H
#define K3C_SERVE_RESPONSE_H

#include "serve/request.h"
#include "serve/turn.h"

/* The logprobs of a response's tokens not yet written out (OpenAI `logprobs`): each event or object that writes a
 * "logprobs" field reports and drops them, so a stream spreads them over its chunks and a whole answer has them all. */
typedef struct {
    const k3c_tok *tok; /* to spell the tokens */
    k3c_sampled *t;
    size_t n, cap;
    int64_t text_offset; /* completions: bytes of text before the next token */
} k3c_api_logprobs;

/* Keeps a token's logprobs for the next object written (K3C_ENOMEM when out of memory). */
int k3c_api_logprobs_add(k3c_api_logprobs *lp, const k3c_sampled *t, k3c_err *err);
void k3c_api_logprobs_free(k3c_api_logprobs *lp);

/* What every object of one response repeats, and the streaming state of a chat response. */
typedef struct {
    char id[48]; /* "chatcmpl-…" / "cmpl-…" */
    long long created;
    const char *model;
    int chat;             /* chat.completion(.chunk) rather than text_completion */
    int index;            /* the choice these objects are of (n > 1: one meta per choice, the same id) */
    int role_sent;        /* the first chunk (role "assistant") went out */
    int n_calls;          /* tool calls streamed so far: their OpenAI index */
    int64_t serial;       /* counter for tool call ids */
    char call_id[96];     /* the id of the tool call being streamed */
    k3c_api_logprobs *lp; /* NULL: "logprobs": null (not asked for) */
} k3c_api_meta;

void k3c_api_meta_init(k3c_api_meta *m, int chat, const char *model, uint64_t unique);

/* {"error": {"message", "type", "param", "code"}} */
void k3c_api_error_json(k3c_sbuf *s, const k3c_api_error *e);
void k3c_api_usage_json(k3c_sbuf *s, int64_t prompt, int64_t completion);

/* Streaming. Each appends whole SSE events to s. */
void k3c_sse_chat_delta(k3c_sbuf *s, k3c_api_meta *m, const k3c_chat_delta *d); /* reasoning / content / tool call */
void k3c_sse_text(k3c_sbuf *s, k3c_api_meta *m, const char *text, size_t n);    /* completions: a text piece */
/* The closing events: the finish reason, the usage chunk when include_usage, "data: [DONE]". */
void k3c_sse_finish(k3c_sbuf *s, k3c_api_meta *m, const char *finish_reason, int include_usage, int64_t prompt,
                    int64_t completion);
/* The same in two parts, for n choices: each choice's finish event, then once the usage chunk and [DONE]. */
void k3c_sse_choice_finish(k3c_sbuf *s, k3c_api_meta *m, const char *finish_reason);
void k3c_sse_end(k3c_sbuf *s, const k3c_api_meta *m, int include_usage, int64_t prompt, int64_t completion);
/* An error after the stream started: an error event, then [DONE]. */
void k3c_sse_error(k3c_sbuf *s, const k3c_api_error *e);

/* Whole responses. */
void k3c_api_chat_json(k3c_sbuf *s, k3c_api_meta *m, const k3c_turn_msg *r, const char *finish_reason, int64_t prompt,
                       int64_t completion);
void k3c_api_completion_json(k3c_sbuf *s, k3c_api_meta *m, const char *text, size_t n, const char *finish_reason,
                             int64_t prompt, int64_t completion);
/* The same in parts, for n choices: the head, each choice (its meta's index; the first has first set), the usage. */
void k3c_api_choices_begin(k3c_sbuf *s, const k3c_api_meta *m);
void k3c_api_chat_choice(k3c_sbuf *s, k3c_api_meta *m, const k3c_turn_msg *r, const char *finish_reason, int first);
void k3c_api_completion_choice(k3c_sbuf *s, k3c_api_meta *m, const char *text, size_t n, const char *finish_reason,
                               int first);
void k3c_api_choices_end(k3c_sbuf *s, int64_t prompt, int64_t completion);

/* The chat finish reason: "tool_calls" when the message called tools and stopped, else the scheduler's. */
const char *k3c_api_chat_finish(k3c_finish why, size_t n_calls);

#endif
