/* api_anthropic.c — the Anthropic Messages API's request as the equivalent chat-completions request (anthropic.h), so
 * both APIs share validation, rendering, the engine and the parser. docs/SERVING.md §8. */
#include "serve/anthropic.h"

#include <string.h>

#define BAD(e, param, ...) k3c_api_fail(e, 400, "invalid_request_error", "invalid_value", param, __VA_ARGS__)

static const k3c_json *get(const k3c_json *o, const char *key) {
    const k3c_json *v = k3c_json_get(o, key);
    return v && v->type != K3C_JSON_NULL ? v : NULL;
}

static int is(const k3c_json *v, const char *s) { return v && v->type == K3C_JSON_STRING && !strcmp(v->string, s); }

static void put(k3c_sbuf *s, const char *t) { k3c_sbuf_append(s, t, strlen(t)); }
static void val(k3c_sbuf *s, const k3c_json *v) { k3c_sbuf_json_value(s, v, K3C_JSON_W_LEXEMES); }

/* The text of a string or of an array of text blocks (system, tool_result content), joined by newlines. */
static int text_of(const k3c_json *v, const char *param, k3c_sbuf *t, k3c_api_error *e) {
    if (v->type == K3C_JSON_STRING) {
        k3c_sbuf_append(t, v->string, v->len);
        return 0;
    }
    if (v->type != K3C_JSON_ARRAY) return BAD(e, param, "'%s' must be a string or an array of text blocks", param);
    for (size_t i = 0; i < v->n; i++) {
        const k3c_json *b = &v->items[i], *tx = get(b, "text");
        if (!is(get(b, "type"), "text") || !tx || tx->type != K3C_JSON_STRING)
            return BAD(e, param, "'%s[%zu]' must be a text block", param, i);
        if (i) k3c_sbuf_append(t, "\n", 1);
        k3c_sbuf_append(t, tx->string, tx->len);
    }
    return 0;
}

static void str_field(k3c_sbuf *s, const char *key, const char *v, size_t n) {
    k3c_sbuf_printf(s, "\"%s\":", key);
    k3c_sbuf_json_string(s, v, n);
}

/* {"type":"image","source":{"type":"base64","media_type":M,"data":D}} as an image_url part with a data: URL. */
static int image_part(const k3c_json *b, const char *param, k3c_sbuf *s, k3c_api_error *e) {
    const k3c_json *src = get(b, "source"), *mt = get(src, "media_type"), *data = get(src, "data");
    if (!is(get(src, "type"), "base64") || !mt || mt->type != K3C_JSON_STRING || !data || data->type != K3C_JSON_STRING)
        return BAD(e, param, "'%s' must be an image block with a base64 source", param);
    k3c_sbuf u;
    k3c_sbuf_init(&u);
    k3c_sbuf_printf(&u, "data:%s;base64,", mt->string);
    k3c_sbuf_append(&u, data->string, data->len);
    put(s, "{\"type\":\"image_url\",\"image_url\":{");
    str_field(s, "url", u.buf ? u.buf : "", u.len);
    put(s, "}}");
    k3c_sbuf_free(&u);
    return 0;
}

/* One message's blocks: tool results first become tool messages (they answer the previous assistant turn), then the
 * message itself with its text / image parts, tool_use blocks as tool_calls and thinking as reasoning_content. */
static int message(const k3c_json *m, size_t i, k3c_sbuf *s, int *first, k3c_api_error *e) {
    char param[48];
    snprintf(param, sizeof param, "messages[%zu]", i);
    const k3c_json *role = get(m, "role"), *c = get(m, "content");
    if (m->type != K3C_JSON_OBJECT || !(is(role, "user") || is(role, "assistant")))
        return BAD(e, "messages", "'%s.role' must be \"user\" or \"assistant\"", param);
    if (!c)
        return k3c_api_fail(e, 400, "invalid_request_error", "missing_required_parameter", "messages",
                            "'%s.content' is missing", param);
    const int assistant = is(role, "assistant");
    if (c->type == K3C_JSON_STRING) {
        k3c_sbuf_printf(s, "%s{\"role\":\"%s\",", *first ? "" : ",", role->string);
        str_field(s, "content", c->string, c->len);
        put(s, "}");
        *first = 0;
        return 0;
    }
    if (c->type != K3C_JSON_ARRAY) return BAD(e, "messages", "'%s.content' must be a string or an array", param);
    k3c_sbuf parts, calls, think;
    k3c_sbuf_init(&parts), k3c_sbuf_init(&calls), k3c_sbuf_init(&think);
    int rc = 0, np = 0, nc = 0, nres = 0;
    for (size_t k = 0; !rc && k < c->n; k++) {
        const k3c_json *b = &c->items[k], *ty = get(b, "type");
        char bp[96];
        snprintf(bp, sizeof bp, "%s.content[%zu]", param, k);
        if (is(ty, "text")) {
            const k3c_json *tx = get(b, "text");
            if (!tx || tx->type != K3C_JSON_STRING) rc = BAD(e, "messages", "'%s.text' must be a string", bp);
            if (!rc) {
                put(&parts, np++ ? ",{\"type\":\"text\"," : "{\"type\":\"text\",");
                str_field(&parts, "text", tx->string, tx->len);
                put(&parts, "}");
            }
        } else if (is(ty, "image") && !assistant) {
            if (np++) put(&parts, ",");
            rc = image_part(b, bp, &parts, e);
        } else if (is(ty, "thinking") && assistant) {
            const k3c_json *th = get(b, "thinking");
            if (th && th->type == K3C_JSON_STRING) k3c_sbuf_append(&think, th->string, th->len);
        } else if (is(ty, "redacted_thinking") && assistant) {
            /* opaque to this server: nothing to render */
        } else if (is(ty, "tool_use") && assistant) {
            const k3c_json *id = get(b, "id"), *name = get(b, "name"), *in = get(b, "input");
            if (!id || id->type != K3C_JSON_STRING || !name || name->type != K3C_JSON_STRING ||
                (in && in->type != K3C_JSON_OBJECT))
                rc = BAD(e, "messages", "'%s' must have a string id and name and an object input", bp);
            if (!rc) {
                put(&calls, nc++ ? ",{" : "{");
                str_field(&calls, "id", id->string, id->len);
                put(&calls, ",\"type\":\"function\",\"function\":{");
                str_field(&calls, "name", name->string, name->len);
                put(&calls, ",\"arguments\":");
                if (in)
                    val(&calls, in);
                else
                    put(&calls, "{}");
                put(&calls, "}}");
            }
        } else if (is(ty, "tool_result") && !assistant) {
            const k3c_json *id = get(b, "tool_use_id"), *rc_ = get(b, "content");
            k3c_sbuf t;
            k3c_sbuf_init(&t);
            if (!id || id->type != K3C_JSON_STRING) rc = BAD(e, "messages", "'%s.tool_use_id' must be a string", bp);
            if (!rc && rc_) rc = text_of(rc_, "messages", &t, e);
            if (!rc) {
                nres++;
                k3c_sbuf_printf(s, "%s{\"role\":\"tool\",", *first ? "" : ",");
                str_field(s, "tool_call_id", id->string, id->len);
                put(s, ",");
                str_field(s, "content", t.buf ? t.buf : "", t.len);
                put(s, "}");
                *first = 0;
            }
            k3c_sbuf_free(&t);
        } else {
            rc = BAD(e, "messages", "'%s.type' is not a block a %s message takes", bp, role->string);
        }
    }
    if (!rc && (np || nc || think.len || (!assistant && !nres))) { /* tool results alone are the turn */
        k3c_sbuf_printf(s, "%s{\"role\":\"%s\",\"content\":", *first ? "" : ",", role->string);
        if (np) {
            put(s, "[");
            k3c_sbuf_append(s, parts.buf, parts.len);
            put(s, "]");
        } else {
            put(s, assistant ? "null" : "\"\"");
        }
        if (nc) {
            put(s, ",\"tool_calls\":[");
            k3c_sbuf_append(s, calls.buf, calls.len);
            put(s, "]");
        }
        if (think.len) {
            put(s, ",");
            str_field(s, "reasoning_content", think.buf, think.len);
        }
        put(s, "}");
        *first = 0;
    }
    k3c_sbuf_free(&parts), k3c_sbuf_free(&calls), k3c_sbuf_free(&think);
    return rc;
}

static int tools(const k3c_json *t, k3c_sbuf *s, k3c_api_error *e) {
    if (t->type != K3C_JSON_ARRAY) return BAD(e, "tools", "'tools' must be an array");
    put(s, ",\"tools\":[");
    for (size_t i = 0; i < t->n; i++) {
        const k3c_json *name = get(&t->items[i], "name"), *d = get(&t->items[i], "description");
        const k3c_json *sc = get(&t->items[i], "input_schema");
        if (!name || name->type != K3C_JSON_STRING || !sc || sc->type != K3C_JSON_OBJECT)
            return BAD(e, "tools", "'tools[%zu]' needs a string name and an object input_schema", i);
        put(s, i ? ",{\"type\":\"function\",\"function\":{" : "{\"type\":\"function\",\"function\":{");
        str_field(s, "name", name->string, name->len);
        if (d && d->type == K3C_JSON_STRING) {
            put(s, ",");
            str_field(s, "description", d->string, d->len);
        }
        put(s, ",\"parameters\":");
        val(s, sc);
        put(s, "}}");
    }
    put(s, "]");
    return 0;
}

static int tool_choice(const k3c_json *tc, k3c_sbuf *s, k3c_api_error *e) {
    const k3c_json *ty = get(tc, "type"), *name = get(tc, "name"), *dp = get(tc, "disable_parallel_tool_use");
    if (tc->type != K3C_JSON_OBJECT || !ty || ty->type != K3C_JSON_STRING)
        return BAD(e, "tool_choice", "'tool_choice' must be an object with a type");
    if (is(ty, "auto") || is(ty, "none"))
        k3c_sbuf_printf(s, ",\"tool_choice\":\"%s\"", ty->string);
    else if (is(ty, "any"))
        put(s, ",\"tool_choice\":\"required\"");
    else if (is(ty, "tool") && name && name->type == K3C_JSON_STRING) {
        put(s, ",\"tool_choice\":{\"type\":\"function\",\"function\":{");
        str_field(s, "name", name->string, name->len);
        put(s, "}}");
    } else
        return BAD(e, "tool_choice", "'tool_choice.type' must be auto, any, tool (with a name) or none");
    if (dp && dp->type == K3C_JSON_BOOL && dp->boolean) put(s, ",\"parallel_tool_calls\":false");
    return 0;
}

/* The sampling and limit fields, copied under their chat names (the chat layer checks their types and ranges). */
static int scalars(const k3c_json *o, k3c_sbuf *s, k3c_api_error *e) {
    static const char *const same[] = {"model", "max_tokens", "temperature", "top_p", "top_k", "stream"};
    const k3c_json *mt = get(o, "max_tokens"), *ss = get(o, "stop_sequences"), *th = get(o, "thinking");
    if (!mt)
        return k3c_api_fail(e, 400, "invalid_request_error", "missing_required_parameter", "max_tokens",
                            "max_tokens: Field required");
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        const k3c_json *v = get(o, same[i]);
        if (!v) continue;
        k3c_sbuf_printf(s, ",\"%s\":", same[i]);
        val(s, v);
    }
    const k3c_json *st = get(o, "stream");
    if (st && st->type == K3C_JSON_BOOL && st->boolean) put(s, ",\"stream_options\":{\"include_usage\":true}");
    if (ss) {
        put(s, ",\"stop\":");
        val(s, ss);
    }
    if (th) {
        const k3c_json *ty = get(th, "type");
        if (!is(ty, "enabled") && !is(ty, "disabled"))
            return BAD(e, "thinking", "'thinking.type' must be \"enabled\" or \"disabled\"");
        k3c_sbuf_printf(s, ",\"thinking\":%s", is(ty, "enabled") ? "true" : "false");
    }
    return 0;
}

int k3c_anthropic_chat_body(const k3c_json *o, k3c_sbuf *out, k3c_api_error *e) {
    if (o->type != K3C_JSON_OBJECT)
        return k3c_api_fail(e, 400, "invalid_request_error", "invalid_json", "",
                            "The request body must be a JSON object");
    const k3c_json *msgs = get(o, "messages"), *sys = get(o, "system"), *t = get(o, "tools"),
                   *tc = get(o, "tool_choice");
    if (!msgs)
        return k3c_api_fail(e, 400, "invalid_request_error", "missing_required_parameter", "messages",
                            "messages: Field required");
    if (msgs->type != K3C_JSON_ARRAY) return BAD(e, "messages", "'messages' must be an array");
    /* a thread continued would send only the new messages: answering it as the whole conversation would be wrong; the
     * SDKs answered this way resend the full history without `thread` */
    if (get(o, "thread"))
        return k3c_api_fail(e, 400, "invalid_request_error", K3C_ANTH_THREAD_UNSUPPORTED, "thread",
                            "This server holds no message threads: send the whole conversation without 'thread'");
    put(out, "{\"messages\":[");
    int first = 1, rc = 0;
    if (sys) {
        k3c_sbuf st;
        k3c_sbuf_init(&st);
        rc = text_of(sys, "system", &st, e);
        if (!rc) {
            put(out, "{\"role\":\"system\",");
            str_field(out, "content", st.buf ? st.buf : "", st.len);
            put(out, "}");
            first = 0;
        }
        k3c_sbuf_free(&st);
    }
    for (size_t i = 0; !rc && i < msgs->n; i++) rc = message(&msgs->items[i], i, out, &first, e);
    if (!rc) put(out, "]");
    if (!rc) rc = scalars(o, out, e);
    if (!rc && t) rc = tools(t, out, e);
    if (!rc && tc) rc = tool_choice(tc, out, e);
    if (!rc) put(out, "}");
    if (!rc && !out->ok) rc = k3c_api_fail(e, 500, "api_error", NULL, "", "out of memory");
    return rc;
}
