/* anthropic_response.c — the Anthropic Messages API's answers (anthropic.h): message objects, content blocks, the
 * stream's named events and errors. docs/SERVING.md §8. */
#include "serve/anthropic.h"

#include <string.h>

static void put(k3c_sbuf *s, const char *t) { k3c_sbuf_append(s, t, strlen(t)); }
static void str(k3c_sbuf *s, const char *t, size_t n) { k3c_sbuf_json_string(s, t ? t : "", t ? n : 0); }

void k3c_anth_meta_init(k3c_anth_meta *m, const char *model, uint64_t unique) {
    memset(m, 0, sizeof *m);
    snprintf(m->id, sizeof m->id, "msg_%016llx", (unsigned long long)unique);
    m->model = model;
}

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    case 504: return "timeout_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

void k3c_anth_error_json(k3c_sbuf *s, const k3c_api_error *e) {
    k3c_sbuf_printf(s, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":", error_type(e->status));
    str(s, e->message, strlen(e->message));
    if (e->code && !strcmp(e->code, K3C_ANTH_THREAD_UNSUPPORTED))
        put(s, ",\"details\":{\"error_code\":\"" K3C_ANTH_THREAD_UNSUPPORTED "\"}");
    put(s, "}}");
}

const char *k3c_anth_stop_reason(k3c_finish why, size_t n_calls, int stop_string) {
    if (why == K3C_FINISH_LENGTH) return "max_tokens";
    if (n_calls) return "tool_use";
    return stop_string ? "stop_sequence" : "end_turn";
}

static void tool_use_head(k3c_sbuf *s, k3c_anth_meta *m, const char *name) {
    k3c_sbuf_printf(s, "{\"type\":\"tool_use\",\"id\":\"toolu_%s_%lld\",\"name\":", m->id + 4, (long long)m->serial++);
    str(s, name, strlen(name));
    put(s, ",\"input\":");
}

static void usage(k3c_sbuf *s, int64_t in, int64_t out) {
    k3c_sbuf_printf(s, "{\"input_tokens\":%lld,\"output_tokens\":%lld}", (long long)in, (long long)out);
}

static void stop_fields(k3c_sbuf *s, const char *stop_reason, const char *stop_sequence) {
    put(s, "\"stop_reason\":");
    if (stop_reason)
        k3c_sbuf_printf(s, "\"%s\"", stop_reason);
    else
        put(s, "null");
    put(s, ",\"stop_sequence\":");
    if (stop_sequence)
        str(s, stop_sequence, strlen(stop_sequence));
    else
        put(s, "null");
}

static void message_head(k3c_sbuf *s, const k3c_anth_meta *m) {
    k3c_sbuf_printf(s, "{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\",\"model\":", m->id);
    str(s, m->model, strlen(m->model));
    put(s, ",\"content\":[");
}

void k3c_anth_message_json(k3c_sbuf *s, k3c_anth_meta *m, const k3c_turn_msg *r, const char *stop_reason,
                           const char *stop_sequence, int64_t in, int64_t out) {
    message_head(s, m);
    int n = 0;
    if (r->reasoning.len) {
        put(s, "{\"type\":\"thinking\",\"thinking\":");
        str(s, r->reasoning.buf, r->reasoning.len);
        put(s, ",\"signature\":\"\"}");
        n++;
    }
    if (r->content.len || (!r->ncalls && !n)) {
        put(s, n++ ? ",{\"type\":\"text\",\"text\":" : "{\"type\":\"text\",\"text\":");
        str(s, r->content.buf, r->content.len);
        put(s, "}");
    }
    for (size_t i = 0; i < r->ncalls; i++) {
        if (n++) put(s, ",");
        tool_use_head(s, m, r->call_name[i]);
        /* a call cut off may hold arguments that are not an object: input is then {} */
        k3c_json *v = NULL;
        if (k3c_json_parse(r->call_args[i], strlen(r->call_args[i]), "input", &v, NULL) == K3C_OK &&
            v->type == K3C_JSON_OBJECT)
            k3c_sbuf_json_value(s, v, K3C_JSON_W_LEXEMES);
        else
            put(s, "{}");
        k3c_json_free(v);
        put(s, "}");
    }
    put(s, "],");
    stop_fields(s, stop_reason, stop_sequence);
    put(s, ",\"usage\":");
    usage(s, in, out);
    put(s, "}");
}

static void event(k3c_sbuf *s, const char *name) { k3c_sbuf_printf(s, "event: %s\ndata: ", name); }

void k3c_anth_sse_start(k3c_sbuf *s, k3c_anth_meta *m, int64_t in) {
    event(s, "message_start");
    put(s, "{\"type\":\"message_start\",\"message\":");
    message_head(s, m);
    put(s, "],");
    stop_fields(s, NULL, NULL);
    put(s, ",\"usage\":");
    usage(s, in, 0);
    put(s, "}}\n\n");
    event(s, "ping");
    put(s, "{\"type\":\"ping\"}\n\n");
}

static void block_stop(k3c_sbuf *s, k3c_anth_meta *m) {
    if (!m->open) return;
    if (m->open == 1) { /* the SDKs expect a signature on a thinking block; this server signs nothing */
        event(s, "content_block_delta");
        k3c_sbuf_printf(s,
                        "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"signature_delta\","
                        "\"signature\":\"\"}}\n\n",
                        m->blocks - 1);
    }
    event(s, "content_block_stop");
    k3c_sbuf_printf(s, "{\"type\":\"content_block_stop\",\"index\":%d}\n\n", m->blocks - 1);
    m->open = 0;
}

static void block_start(k3c_sbuf *s, k3c_anth_meta *m, int kind, const char *name) {
    block_stop(s, m);
    event(s, "content_block_start");
    k3c_sbuf_printf(s, "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":", m->blocks++);
    if (kind == 1) put(s, "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}");
    if (kind == 2) put(s, "{\"type\":\"text\",\"text\":\"\"}");
    if (kind == 3) {
        tool_use_head(s, m, name);
        put(s, "{}}");
    }
    put(s, "}\n\n");
    m->open = kind;
}

void k3c_anth_sse_delta(k3c_sbuf *s, k3c_anth_meta *m, const k3c_chat_delta *d) {
    static const char *const type[] = {"", "thinking_delta", "text_delta", "input_json_delta"};
    static const char *const field[] = {"", "thinking", "text", "partial_json"};
    int kind = d->kind == K3C_CHAT_DELTA_REASONING   ? 1
               : d->kind == K3C_CHAT_DELTA_CONTENT   ? 2
               : d->kind == K3C_CHAT_DELTA_CALL_ARGS ? 3
                                                     : 0;
    if (d->kind == K3C_CHAT_DELTA_CALL_BEGIN) block_start(s, m, 3, d->name);
    if (d->kind == K3C_CHAT_DELTA_CALL) block_stop(s, m);
    if (!kind || !d->len || (kind == 3 && m->open != 3)) return;
    if (m->open != kind) block_start(s, m, kind, NULL);
    event(s, "content_block_delta");
    k3c_sbuf_printf(s,
                    "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"%s\",\"%s\":", m->blocks - 1,
                    type[kind], field[kind]);
    str(s, d->text, d->len);
    put(s, "}}\n\n");
}

void k3c_anth_sse_finish(k3c_sbuf *s, k3c_anth_meta *m, const char *stop_reason, const char *stop_sequence,
                         int64_t out) {
    block_stop(s, m);
    event(s, "message_delta");
    put(s, "{\"type\":\"message_delta\",\"delta\":{");
    stop_fields(s, stop_reason, stop_sequence);
    k3c_sbuf_printf(s, "},\"usage\":{\"output_tokens\":%lld}}\n\n", (long long)out);
    event(s, "message_stop");
    put(s, "{\"type\":\"message_stop\"}\n\n");
}

void k3c_anth_sse_error(k3c_sbuf *s, const k3c_api_error *e) {
    event(s, "error");
    k3c_anth_error_json(s, e);
    put(s, "\n\n");
}
