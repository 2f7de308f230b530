/* anthropic.h — the Anthropic Messages API's request read as the OpenAI chat request the rest of the serving path
 * takes (docs/SERVING.md §8): one request layer, one engine, one parser for both APIs. */
#ifndef K3C_SERVE_ANTHROPIC_H
#define K3C_SERVE_ANTHROPIC_H

#include "serve/request.h"
#include "serve/turn.h"

/* Writes the chat-completions body equivalent to the Messages request `o` into out: system (a string or text blocks)
 * as the first message; text / image / tool_use / tool_result / thinking blocks as content parts, tool_calls, tool
 * messages and reasoning_content; tools' input_schema as parameters; tool_choice auto / any / tool / none as auto /
 * required / a named function / none (disable_parallel_tool_use as parallel_tool_calls false); thinking enabled /
 * disabled; max_tokens (required), stop_sequences, temperature, top_p, top_k, stream (with usage). Returns 0, or an
 * error status >= 400 with e filled (Anthropic's error types). Numbers keep their digits. */
int k3c_anthropic_chat_body(const k3c_json *o, k3c_sbuf *out, k3c_api_error *e);
/* The error code of a request with a `thread` (server-held conversations, which this server does not hold); the
 * error body names it as error.details.error_code, which tells Anthropic's SDKs to send the full history instead. */
#define K3C_ANTH_THREAD_UNSUPPORTED "thread_unsupported_request"

/* The answer's side: one message's id and the stream's open content block. */
typedef struct {
    char id[48]; /* "msg_…" */
    const char *model;
    int blocks; /* content blocks started so far (the next one's index) */
    int open;   /* the open block: 0 none, 1 thinking, 2 text, 3 tool_use */
    int64_t serial;
} k3c_anth_meta;

void k3c_anth_meta_init(k3c_anth_meta *m, const char *model, uint64_t unique);
/* {"type":"error","error":{"type","message"}}; the type follows the status (invalid_request_error,
 * authentication_error, not_found_error, request_too_large, overloaded_error, api_error, timeout_error); with
 * "details":{"error_code"} for K3C_ANTH_THREAD_UNSUPPORTED, the one code of Anthropic's own this server answers. */
void k3c_anth_error_json(k3c_sbuf *s, const k3c_api_error *e);
/* end_turn, max_tokens, stop_sequence (a stop string ended it) or tool_use. */
const char *k3c_anth_stop_reason(k3c_finish why, size_t n_calls, int stop_string);
/* The whole answer: {"id","type":"message","role":"assistant","model","content":[blocks],"stop_reason",
 * "stop_sequence","usage":{"input_tokens","output_tokens"}}. stop_sequence NULL: null. */
void k3c_anth_message_json(k3c_sbuf *s, k3c_anth_meta *m, const k3c_turn_msg *r, const char *stop_reason,
                           const char *stop_sequence, int64_t in, int64_t out);
/* Streaming, as named events ("event: NAME\ndata: {...}\n\n"): message_start and a ping; each delta (thinking_delta,
 * text_delta, input_json_delta, each in its content_block_start .. content_block_stop); the end (message_delta with
 * stop_reason and usage, message_stop); an error event. */
void k3c_anth_sse_start(k3c_sbuf *s, k3c_anth_meta *m, int64_t in);
void k3c_anth_sse_delta(k3c_sbuf *s, k3c_anth_meta *m, const k3c_chat_delta *d);
void k3c_anth_sse_finish(k3c_sbuf *s, k3c_anth_meta *m, const char *stop_reason, const char *stop_sequence,
                         int64_t out);
void k3c_anth_sse_error(k3c_sbuf *s, const k3c_api_error *e);

#endif
