/* response.c — writing OpenAI response objects and server-sent events (response.h). Field names and nesting follow
 * the OpenAI API reference for chat.completion, chat.completion.chunk and text_completion; reasoning goes into
 * `reasoning_content` as DeepSeek / vLLM servers send it. */
#include "serve/response.h"

#include <stdlib.h>
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
static void put(k3c_sbuf *s, const char *t) { k3c_sbuf_append(s, t, strlen(t)); }

/* ---------------------------------------------------------------- logprobs */

int k3c_api_logprobs_add(k3c_api_logprobs *lp, const k3c_sampled *t, k3c_err *err) {
    if (lp->n == lp->cap) {
        size_t cap = lp->cap ? 2 * lp->cap : 16;
        k3c_sampled *p = realloc(lp->t, cap * sizeof *p);
        if (!p) return k3c_errf(err, K3C_ENOMEM, "logprobs: out of memory");
        lp->t = p, lp->cap = cap;
    }
    lp->t[lp->n++] = *t;
    return K3C_OK;
}

void k3c_api_logprobs_free(k3c_api_logprobs *lp) {
    free(lp->t);
    memset(lp, 0, sizeof *lp);
}

/* Length of the UTF-8 character at b[0..n), 0 if it is not valid there (a valid character has no valid shorter
 * prefix but a single ASCII byte). */
static size_t utf8_len(const char *b, size_t n) {
    for (size_t k = 1; k <= 4 && k <= n; k++)
        if (k3c_utf8_valid(b, k)) return k;
    return 0;
}

/* A token's text as a JSON string: a token can end inside a character, so bytes that are not valid UTF-8 become
 * U+FFFD (the exact bytes go into "bytes"). */
static void token_string(k3c_sbuf *s, const char *b, size_t n) {
    k3c_sbuf t;
    k3c_sbuf_init(&t);
    for (size_t i = 0; i < n;) {
        size_t k = utf8_len(b + i, n - i);
        if (k)
            k3c_sbuf_append(&t, b + i, k);
        else
            put(&t, "\xEF\xBF\xBD");
        i += k ? k : 1;
    }
    k3c_sbuf_json_string(s, t.buf ? t.buf : "", t.len);
    k3c_sbuf_free(&t);
}

/* The bytes of one id (empty if the tokenizer cannot spell it); free *b. */
static size_t token_bytes(const k3c_tok *tok, int32_t id, char **b) {
    size_t n = 0;
    *b = NULL;
    if (k3c_tok_decode(tok, &id, 1, b, &n, NULL)) n = 0;
    return n;
}

/* {"token": T, "logprob": x, "bytes": [..]  — the caller closes it */
static void chat_logprob_head(k3c_sbuf *s, const k3c_tok *tok, int32_t id, float logprob) {
    char *b;
    size_t n = token_bytes(tok, id, &b);
    put(s, "{\"token\":");
    token_string(s, b, n);
    k3c_sbuf_printf(s, ",\"logprob\":%.9g,\"bytes\":[", (double)logprob);
    for (size_t i = 0; i < n; i++) k3c_sbuf_printf(s, "%s%u", i ? "," : "", (unsigned)(unsigned char)b[i]);
    put(s, "]");
    free(b);
}

/* chat: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]} */
static void chat_logprobs(k3c_sbuf *s, const k3c_api_logprobs *lp) {
    put(s, "{\"content\":[");
    for (size_t i = 0; i < lp->n; i++) {
        const k3c_sampled *t = &lp->t[i];
        if (i) put(s, ",");
        chat_logprob_head(s, lp->tok, t->id, t->logprob);
        put(s, ",\"top_logprobs\":[");
        for (int k = 0; k < t->n_top; k++) {
            if (k) put(s, ",");
            chat_logprob_head(s, lp->tok, t->top_id[k], t->top_logprob[k]);
            put(s, "}");
        }
        put(s, "]}");
    }
    put(s, "]}");
}

/* completions: {"tokens": [..], "token_logprobs": [..], "top_logprobs": [{token: logprob}], "text_offset": [..]} */
static void completion_logprobs(k3c_sbuf *s, k3c_api_logprobs *lp) {
    put(s, "{\"tokens\":[");
    for (size_t i = 0; i < lp->n; i++) {
        char *b;
        size_t n = token_bytes(lp->tok, lp->t[i].id, &b);
        if (i) put(s, ",");
        token_string(s, b, n);
        free(b);
    }
    put(s, "],\"token_logprobs\":[");
    for (size_t i = 0; i < lp->n; i++) k3c_sbuf_printf(s, "%s%.9g", i ? "," : "", (double)lp->t[i].logprob);
    put(s, "],\"top_logprobs\":[");
    for (size_t i = 0; i < lp->n; i++) {
        put(s, i ? ",{" : "{");
        k3c_sbuf key[K3C_MAX_LOGPROBS];
        for (int k = 0, first = 1; k < lp->t[i].n_top; k++) {
            char *b;
            size_t n = token_bytes(lp->tok, lp->t[i].top_id[k], &b);
            k3c_sbuf_init(&key[k]);
            token_string(&key[k], b, n);
            free(b);
            /* two ids can spell the same text (e.g. both U+FFFD): the object keeps the first, the more likely */
            int dup = 0;
            for (int q = 0; q < k; q++) dup |= key[q].len == key[k].len && !memcmp(key[q].buf, key[k].buf, key[k].len);
            if (dup) continue;
            if (!first) put(s, ",");
            k3c_sbuf_append(s, key[k].buf, key[k].len);
            k3c_sbuf_printf(s, ":%.9g", (double)lp->t[i].top_logprob[k]);
            first = 0;
        }
        for (int k = 0; k < lp->t[i].n_top; k++) k3c_sbuf_free(&key[k]);
        put(s, "}");
    }
    put(s, "],\"text_offset\":[");
    for (size_t i = 0; i < lp->n; i++) {
        char *b;
        k3c_sbuf_printf(s, "%s%lld", i ? "," : "", (long long)lp->text_offset);
        lp->text_offset += (int64_t)token_bytes(lp->tok, lp->t[i].id, &b);
        free(b);
    }
    put(s, "]}");
}

/* ,"logprobs": null or the tokens not yet reported (then dropped) */
static void logprobs_field(k3c_sbuf *s, k3c_api_meta *m) {
    put(s, ",\"logprobs\":");
    if (!m->lp) {
        put(s, "null");
        return;
    }
    if (m->chat)
        chat_logprobs(s, m->lp);
    else
        completion_logprobs(s, m->lp);
    m->lp->n = 0;
}

void k3c_api_error_json(k3c_sbuf *s, const k3c_api_error *e) {
    put(s, "{\"error\":{\"message\":");
    str(s, e->message);
    put(s, ",\"type\":");
    str(s, e->type ? e->type : "invalid_request_error");
    put(s, ",\"param\":");
    if (e->param[0])
        str(s, e->param);
    else
        put(s, "null");
    put(s, ",\"code\":");
    if (e->code)
        str(s, e->code);
    else
        put(s, "null");
    put(s, "}}");
}

void k3c_api_usage_json(k3c_sbuf *s, int64_t prompt, int64_t completion) {
    k3c_sbuf_printf(s, "{\"prompt_tokens\":%lld,\"completion_tokens\":%lld,\"total_tokens\":%lld}", (long long)prompt,
                    (long long)completion, (long long)(prompt + completion));
}

/* {"id":..,"object":..,"created":..,"model":..,"choices":[   — the caller closes it */
static void head(k3c_sbuf *s, const k3c_api_meta *m, const char *object) {
    k3c_sbuf_printf(s, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", m->id, object, m->created);
    str(s, m->model);
    put(s, ",\"choices\":[");
}

static const char *chunk_object(const k3c_api_meta *m) { return m->chat ? "chat.completion.chunk" : "text_completion"; }

/* data: {... "choices":[{"index":0,"delta":{<delta>},"logprobs":null,"finish_reason":null}]}\n\n; 1 when the delta
 * holds the role (the first event), so a field after it needs a comma: a stream that is all markup ends with a
 * finish event whose delta is the role alone. */
static int chat_event_begin(k3c_sbuf *s, k3c_api_meta *m) {
    put(s, "data: ");
    head(s, m, chunk_object(m));
    k3c_sbuf_printf(s, "{\"index\":%d,\"delta\":{", m->index);
    int first = !m->role_sent;
    if (first) put(s, "\"role\":\"assistant\"");
    m->role_sent = 1;
    return first;
}
static void chat_event_end(k3c_sbuf *s, k3c_api_meta *m, const char *finish) {
    put(s, "}");
    logprobs_field(s, m);
    k3c_sbuf_printf(s, ",\"finish_reason\":%s%s%s}]}\n\n", finish ? "\"" : "", finish ? finish : "null",
                    finish ? "\"" : "");
}

static void new_call_id(k3c_api_meta *m) {
    if (m->index) /* the choices of one response share its id: theirs tell them apart */
        snprintf(m->call_id, sizeof m->call_id, "call_%s_%d_%lld", m->id + (m->chat ? 9 : 5), m->index,
                 (long long)m->serial++);
    else
        snprintf(m->call_id, sizeof m->call_id, "call_%s_%lld", m->id + (m->chat ? 9 : 5), (long long)m->serial++);
}

static void tool_call_json(k3c_sbuf *s, k3c_api_meta *m, int index, const char *name, const char *arguments) {
    new_call_id(m);
    k3c_sbuf_printf(s, "{\"index\":%d,\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":", index, m->call_id);
    str(s, name);
    put(s, ",\"arguments\":");
    str(s, arguments); /* OpenAI sends the arguments as a JSON string */
    put(s, "}}");
}

/* A tool call streams as OpenAI streams it: the first delta has its index, id, type and name (arguments ""), the
 * next ones the arguments' pieces as the parser reads them. */
void k3c_sse_chat_delta(k3c_sbuf *s, k3c_api_meta *m, const k3c_chat_delta *d) {
    if ((d->kind == K3C_CHAT_DELTA_REASONING || d->kind == K3C_CHAT_DELTA_CONTENT ||
         d->kind == K3C_CHAT_DELTA_CALL_ARGS) &&
        d->len == 0)
        return;
    if (d->kind == K3C_CHAT_DELTA_FINISHED) return;
    if (d->kind == K3C_CHAT_DELTA_CALL) {
        m->n_calls++;
        return;
    }
    if (chat_event_begin(s, m)) put(s, ",");
    if (d->kind == K3C_CHAT_DELTA_CALL_BEGIN) {
        put(s, "\"tool_calls\":[");
        tool_call_json(s, m, m->n_calls, d->name, "");
        put(s, "]");
    } else if (d->kind == K3C_CHAT_DELTA_CALL_ARGS) {
        k3c_sbuf_printf(s, "\"tool_calls\":[{\"index\":%d,\"function\":{\"arguments\":", m->n_calls);
        k3c_sbuf_json_string(s, d->text, d->len);
        put(s, "}}]");
    } else {
        k3c_sbuf_printf(s, "\"%s\":", d->kind == K3C_CHAT_DELTA_REASONING ? "reasoning_content" : "content");
        k3c_sbuf_json_string(s, d->text, d->len);
    }
    chat_event_end(s, m, NULL);
}

void k3c_sse_text(k3c_sbuf *s, k3c_api_meta *m, const char *text, size_t n) {
    if (n == 0) return;
    put(s, "data: ");
    head(s, m, chunk_object(m));
    k3c_sbuf_printf(s, "{\"index\":%d,\"text\":", m->index);
    k3c_sbuf_json_string(s, text, n);
    logprobs_field(s, m);
    put(s, ",\"finish_reason\":null}]}\n\n");
}

void k3c_sse_choice_finish(k3c_sbuf *s, k3c_api_meta *m, const char *finish_reason) {
    if (m->chat) {
        chat_event_begin(s, m);
        chat_event_end(s, m, finish_reason);
        return;
    }
    put(s, "data: ");
    head(s, m, chunk_object(m));
    k3c_sbuf_printf(s, "{\"index\":%d,\"text\":\"\"", m->index);
    logprobs_field(s, m);
    k3c_sbuf_printf(s, ",\"finish_reason\":\"%s\"}]}\n\n", finish_reason);
}

void k3c_sse_end(k3c_sbuf *s, const k3c_api_meta *m, int include_usage, int64_t prompt, int64_t completion) {
    if (include_usage) {
        put(s, "data: ");
        head(s, m, chunk_object(m));
        put(s, "],\"usage\":");
        k3c_api_usage_json(s, prompt, completion);
        put(s, "}\n\n");
    }
    put(s, "data: [DONE]\n\n");
}

void k3c_sse_finish(k3c_sbuf *s, k3c_api_meta *m, const char *finish_reason, int include_usage, int64_t prompt,
                    int64_t completion) {
    k3c_sse_choice_finish(s, m, finish_reason);
    k3c_sse_end(s, m, include_usage, prompt, completion);
}

void k3c_sse_error(k3c_sbuf *s, const k3c_api_error *e) {
    put(s, "data: ");
    k3c_api_error_json(s, e);
    put(s, "\n\ndata: [DONE]\n\n");
}

void k3c_api_choices_begin(k3c_sbuf *s, const k3c_api_meta *m) {
    head(s, m, m->chat ? "chat.completion" : "text_completion");
}

void k3c_api_chat_choice(k3c_sbuf *s, k3c_api_meta *m, const k3c_turn_msg *r, const char *finish_reason, int first) {
    k3c_sbuf_printf(s, "%s{\"index\":%d,\"message\":{\"role\":\"assistant\",\"content\":", first ? "" : ",", m->index);
    k3c_sbuf_json_string(s, r->content.buf ? r->content.buf : "", r->content.len);
    if (r->reasoning.len) {
        put(s, ",\"reasoning_content\":");
        k3c_sbuf_json_string(s, r->reasoning.buf, r->reasoning.len);
    }
    if (r->ncalls) {
        put(s, ",\"tool_calls\":[");
        for (size_t i = 0; i < r->ncalls; i++) {
            if (i) put(s, ",");
            tool_call_json(s, m, (int)i, r->call_name[i], r->call_args[i]);
        }
        put(s, "]");
    }
    put(s, "}");
    logprobs_field(s, m);
    k3c_sbuf_printf(s, ",\"finish_reason\":\"%s\"}", finish_reason);
}

void k3c_api_completion_choice(k3c_sbuf *s, k3c_api_meta *m, const char *text, size_t n, const char *finish_reason,
                               int first) {
    k3c_sbuf_printf(s, "%s{\"index\":%d,\"text\":", first ? "" : ",", m->index);
    k3c_sbuf_json_string(s, text, n);
    logprobs_field(s, m);
    k3c_sbuf_printf(s, ",\"finish_reason\":\"%s\"}", finish_reason);
}

void k3c_api_choices_end(k3c_sbuf *s, int64_t prompt, int64_t completion) {
    put(s, "],\"usage\":");
    k3c_api_usage_json(s, prompt, completion);
    put(s, "}");
}

void k3c_api_chat_json(k3c_sbuf *s, k3c_api_meta *m, const k3c_turn_msg *r, const char *finish_reason, int64_t prompt,
                       int64_t completion) {
    k3c_api_choices_begin(s, m);
    k3c_api_chat_choice(s, m, r, finish_reason, 1);
    k3c_api_choices_end(s, prompt, completion);
}

void k3c_api_completion_json(k3c_sbuf *s, k3c_api_meta *m, const char *text, size_t n, const char *finish_reason,
                             int64_t prompt, int64_t completion) {
    k3c_api_choices_begin(s, m);
    k3c_api_completion_choice(s, m, text, n, finish_reason, 1);
    k3c_api_choices_end(s, prompt, completion);
}

const char *k3c_api_chat_finish(k3c_finish why, size_t n_calls) {
    return why == K3C_FINISH_STOP && n_calls ? "tool_calls" : k3c_finish_name(why);
}
