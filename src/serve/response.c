/* response.c — writing OpenAI response objects and server-sent events (response.h). Field names and nesting follow
 * the OpenAI API reference for chat.completion, chat.completion.chunk and text_completion; reasoning goes into
 * `reasoning_content` as DeepSeek / vLLM servers send it. */
#include "serve/response.h"

#include <string.h>
#include <time.h>

void k3c_api_meta_init(k3c_api_meta *m, int chat, const char *model, uint64_t unique) {
    memset(m, 0, sizeof *m);
    snprintf(m->id, sizeof m->id, "%s-%016llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)unique);
    m->created = (long long)time(NULL);
    m->model = model;
    m->chat = chat;
}

static void str(k3c_sbuf *s, const char *t) { k3c_sbuf_json_string(s, t, strlen(t)); }

void k3c_api_error_json(k3c_sbuf *s, const k3c_api_error *e) {
    k3c_sbuf_append(s, "{\"error\":{\"message\":", 20);
    str(s, e->message);
    k3c_sbuf_append(s, ",\"type\":", 8);
    str(s, e->type ? e->type : "invalid_request_error");
    k3c_sbuf_append(s, ",\"param\":", 9);
    if (e->param[0])
        str(s, e->param);
    else
        k3c_sbuf_append(s, "null", 4);
    k3c_sbuf_append(s, ",\"code\":", 8);
    if (e->code)
        str(s, e->code);
    else
        k3c_sbuf_append(s, "null", 4);
    k3c_sbuf_append(s, "}}", 2);
}

void k3c_api_usage_json(k3c_sbuf *s, int64_t prompt, int64_t completion) {
    k3c_sbuf_printf(s, "{\"prompt_tokens\":%lld,\"completion_tokens\":%lld,\"total_tokens\":%lld}", (long long)prompt,
                    (long long)completion, (long long)(prompt + completion));
}

/* {"id":..,"object":..,"created":..,"model":..,"choices":[   — the caller closes it */
static void head(k3c_sbuf *s, const k3c_api_meta *m, const char *object) {
    k3c_sbuf_printf(s, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", m->id, object, m->created);
    str(s, m->model);
    k3c_sbuf_append(s, ",\"choices\":[", 12);
}

static const char *chunk_object(const k3c_api_meta *m) { return m->chat ? "chat.completion.chunk" : "text_completion"; }

/* data: {... "choices":[{"index":0,"delta":{<delta>},"logprobs":null,"finish_reason":null}]}\n\n */
static void chat_event_begin(k3c_sbuf *s, k3c_api_meta *m) {
    k3c_sbuf_append(s, "data: ", 6);
    head(s, m, chunk_object(m));
    k3c_sbuf_append(s, "{\"index\":0,\"delta\":{", 20);
    if (!m->role_sent) k3c_sbuf_append(s, "\"role\":\"assistant\",", 19);
    m->role_sent = 1;
}
static void chat_event_end(k3c_sbuf *s, const char *finish) {
    k3c_sbuf_printf(s, "},\"logprobs\":null,\"finish_reason\":%s%s%s}]}\n\n", finish ? "\"" : "",
                    finish ? finish : "null", finish ? "\"" : "");
}

static void tool_call_json(k3c_sbuf *s, k3c_api_meta *m, int index, const char *name, const char *arguments) {
    k3c_sbuf_printf(s, "{\"index\":%d,\"id\":\"call_%s_%lld\",\"type\":\"function\",\"function\":{\"name\":", index,
                    m->id + (m->chat ? 9 : 5), (long long)m->serial++);
    str(s, name);
    k3c_sbuf_append(s, ",\"arguments\":", 13);
    str(s, arguments); /* OpenAI sends the arguments as a JSON string */
    k3c_sbuf_append(s, "}}", 2);
}

void k3c_sse_chat_delta(k3c_sbuf *s, k3c_api_meta *m, const k3c_chat_delta *d) {
    if ((d->kind == K3C_CHAT_DELTA_REASONING || d->kind == K3C_CHAT_DELTA_CONTENT) && d->len == 0) return;
    if (d->kind == K3C_CHAT_DELTA_CALL_BEGIN || d->kind == K3C_CHAT_DELTA_FINISHED) return;
    chat_event_begin(s, m);
    if (d->kind == K3C_CHAT_DELTA_CALL) {
        k3c_sbuf_append(s, "\"tool_calls\":[", 14);
        tool_call_json(s, m, m->n_calls++, d->name, d->arguments);
        k3c_sbuf_append(s, "]", 1);
    } else {
        k3c_sbuf_printf(s, "\"%s\":", d->kind == K3C_CHAT_DELTA_REASONING ? "reasoning_content" : "content");
        k3c_sbuf_json_string(s, d->text, d->len);
    }
    chat_event_end(s, NULL);
}

void k3c_sse_text(k3c_sbuf *s, k3c_api_meta *m, const char *text, size_t n) {
    if (n == 0) return;
    k3c_sbuf_append(s, "data: ", 6);
    head(s, m, chunk_object(m));
    k3c_sbuf_append(s, "{\"index\":0,\"text\":", 18);
    k3c_sbuf_json_string(s, text, n);
    k3c_sbuf_append(s, ",\"logprobs\":null,\"finish_reason\":null}]}\n\n", 42);
}

void k3c_sse_finish(k3c_sbuf *s, k3c_api_meta *m, const char *finish_reason, int include_usage, int64_t prompt,
                    int64_t completion) {
    if (m->chat) {
        chat_event_begin(s, m);
        chat_event_end(s, finish_reason);
    } else {
        k3c_sbuf_append(s, "data: ", 6);
        head(s, m, chunk_object(m));
        k3c_sbuf_printf(s, "{\"index\":0,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"%s\"}]}\n\n",
                        finish_reason);
    }
    if (include_usage) {
        k3c_sbuf_append(s, "data: ", 6);
        head(s, m, chunk_object(m));
        k3c_sbuf_append(s, "],\"usage\":", 10);
        k3c_api_usage_json(s, prompt, completion);
        k3c_sbuf_append(s, "}\n\n", 3);
    }
    k3c_sbuf_append(s, "data: [DONE]\n\n", 14);
}

void k3c_sse_error(k3c_sbuf *s, const k3c_api_error *e) {
    k3c_sbuf_append(s, "data: ", 6);
    k3c_api_error_json(s, e);
    k3c_sbuf_append(s, "\n\ndata: [DONE]\n\n", 16);
}

void k3c_api_chat_json(k3c_sbuf *s, k3c_api_meta *m, const k3c_turn_msg *r, const char *finish_reason, int64_t prompt,
                       int64_t completion) {
    head(s, m, "chat.completion");
    k3c_sbuf_append(s, "{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":", 51);
    k3c_sbuf_json_string(s, r->content.buf ? r->content.buf : "", r->content.len);
    if (r->reasoning.len) {
        k3c_sbuf_append(s, ",\"reasoning_content\":", 21);
        k3c_sbuf_json_string(s, r->reasoning.buf, r->reasoning.len);
    }
    if (r->ncalls) {
        k3c_sbuf_append(s, ",\"tool_calls\":[", 15);
        for (size_t i = 0; i < r->ncalls; i++) {
            if (i) k3c_sbuf_append(s, ",", 1);
            tool_call_json(s, m, (int)i, r->call_name[i], r->call_args[i]);
        }
        k3c_sbuf_append(s, "]", 1);
    }
    k3c_sbuf_printf(s, "},\"logprobs\":null,\"finish_reason\":\"%s\"}],\"usage\":", finish_reason);
    k3c_api_usage_json(s, prompt, completion);
    k3c_sbuf_append(s, "}", 1);
}

void k3c_api_completion_json(k3c_sbuf *s, k3c_api_meta *m, const char *text, size_t n, const char *finish_reason,
                             int64_t prompt, int64_t completion) {
    head(s, m, "text_completion");
    k3c_sbuf_append(s, "{\"index\":0,\"text\":", 18);
    k3c_sbuf_json_string(s, text, n);
    k3c_sbuf_printf(s, ",\"logprobs\":null,\"finish_reason\":\"%s\"}],\"usage\":", finish_reason);
    k3c_api_usage_json(s, prompt, completion);
    k3c_sbuf_append(s, "}", 1);
}

const char *k3c_api_chat_finish(k3c_sched_finish why, size_t n_calls) {
    return why == K3C_SCHED_FINISH_STOP && n_calls ? "tool_calls" : k3c_sched_finish_name(why);
}
