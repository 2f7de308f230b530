/* xtml_parse.c — the streaming chat-output parser (k3c_chat_parser): reasoning, content and typed tool calls from what a
 * Kimi model generates after the generation prompt, in XTML (K3: think / response / tools channels, call and argument
 * elements) or the K2 envelope (Kimi Linear: <think>, tool-call section tokens, functions.name:idx ids). */
#include "tok/xtml.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Where the text being read goes. */
enum {
    CH_TOP,      /* between channels: stray text counts as content (a model that skipped the response channel) */
    CH_THINK,    /* reasoning */
    CH_RESPONSE, /* content */
    CH_TOOLS,    /* XTML <tools> / K2 tool-call section: whitespace between calls, dropped */
    CH_CALL,     /* XTML inside <call>, between arguments: kept, a model may write the arguments as one JSON block */
    CH_ARG,      /* XTML argument value, buffered */
    CH_JSON,     /* XTML json block, buffered */
    CH_CALL_ID,  /* K2 functions.name:idx, buffered */
    CH_CALL_ARGS /* K2 JSON arguments, buffered */
};

/* A tag header longer than this is not one: the model wrote text after a stray <|open|> / <|close|>. */
#define HEADER_MAX 1024

typedef struct {
    char *key, *json; /* the value as compact JSON text */
} arg_kv;

struct k3c_chat_parser {
    k3c_chat_parse_opts o;
    k3c_chat_delta_fn fn;
    void *ctx;
    k3c_sbuf pend;  /* input not yet decided (a possible marker start, an incomplete UTF-8 sequence, a tag header) */
    int header;     /* XTML: 0 reading text, 1 inside an open tag's header, 2 inside a close tag's name */
    int ch;         /* CH_* */
    int arg_back;   /* the channel an argument / json element returns to */
    k3c_sbuf value; /* buffered channel text (argument value, json block, K2 id / arguments) */
    k3c_sbuf reasoning, content;
    /* the call being read */
    int in_call, call_index, call_drop; /* call_drop: a call without a name, read and discarded */
    char *call_name;
    arg_kv *args;
    size_t nargs, cap_args;
    char *arg_key, *arg_type;
    char *json_args;    /* a json block's arguments (XTML) */
    k3c_sbuf call_text; /* XTML text inside the call outside its elements */
    k3c_sbuf streamed;  /* the arguments' pieces sent as CALL_ARGS so far */
    int diverged;       /* a later argument changed what was streamed: the rest of the call is not streamed */
    k3c_chat_result res;
    size_t cap_calls;
    int failed;
    k3c_err err;
};

static char *dupn(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static int opt_bool(const k3c_json *v, const char *key, int *out, k3c_err *err) {
    if (v->type != K3C_JSON_BOOL) return k3c_errf(err, K3C_EINVAL, "parse_options.%s: expected true or false", key);
    *out = v->boolean;
    return K3C_OK;
}

int k3c_chat_parse_opts_from_json(const k3c_json *o, k3c_chat_parse_opts *out, k3c_err *err) {
    *out = (k3c_chat_parse_opts){K3C_CHAT_XTML, 0, 0, 0};
    if (!o || o->type == K3C_JSON_NULL) return K3C_OK;
    if (o->type != K3C_JSON_OBJECT) return k3c_errf(err, K3C_EINVAL, "parse_options: expected an object");
    for (size_t i = 0; i < o->n; i++) {
        const k3c_json *v = &o->items[i];
        const char *k = o->keys[i];
        int rc = K3C_OK;
        if (!strcmp(k, "format")) {
            if (v->type != K3C_JSON_STRING || k3c_chat_format_parse(v->string, &out->format))
                rc = k3c_errf(err, K3C_EINVAL, "parse_options.format: expected \"xtml\" or \"k2\"");
        } else if (!strcmp(k, "in_think")) {
            rc = opt_bool(v, k, &out->in_think, err);
        } else if (!strcmp(k, "in_response")) {
            rc = opt_bool(v, k, &out->in_response, err);
        } else if (!strcmp(k, "strict")) {
            rc = opt_bool(v, k, &out->strict, err);
        } else {
            rc = k3c_errf(err, K3C_EINVAL, "parse_options.%s: unknown option", k);
        }
        if (rc) return rc;
    }
    if (out->in_think && out->in_response)
        return k3c_errf(err, K3C_EINVAL, "parse_options: in_think and in_response exclude each other");
    return K3C_OK;
}

/* The parser stops at its first error; later feeds return the same error. */
static int fail(k3c_chat_parser *p, k3c_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(k3c_chat_parser *p, k3c_err *err, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    p->failed = 1;
    p->err.code = code;
    vsnprintf(p->err.msg, sizeof p->err.msg, fmt, ap);
    va_end(ap);
    if (err) *err = p->err;
    return code;
}

/* Output that breaks the markup: an error for strict parsing (format checks), else read past. */
#define MALFORMED(p, err, ...) ((p)->o.strict ? fail((p), (err), K3C_EFORMAT, __VA_ARGS__) : K3C_OK)

static void emit(k3c_chat_parser *p, k3c_chat_delta d) {
    if (p->fn) p->fn(p->ctx, &d);
}

/* Channel text, routed to reasoning, content, a buffer, or dropped. */
static void sink(k3c_chat_parser *p, const char *s, size_t n) {
    if (!n) return;
    switch (p->ch) {
    case CH_THINK:
        k3c_sbuf_append(&p->reasoning, s, n);
        emit(p, (k3c_chat_delta){.kind = K3C_CHAT_DELTA_REASONING, .text = s, .len = n});
        break;
    case CH_TOP:
    case CH_RESPONSE:
        k3c_sbuf_append(&p->content, s, n);
        emit(p, (k3c_chat_delta){.kind = K3C_CHAT_DELTA_CONTENT, .text = s, .len = n});
        break;
    case CH_CALL: k3c_sbuf_append(&p->call_text, s, n); break;
    case CH_ARG:
    case CH_JSON:
    case CH_CALL_ID:
    case CH_CALL_ARGS: k3c_sbuf_append(&p->value, s, n); break;
    default: break;
    }
}

/* ---------------------------------------------------------------- calls */

static void clear_call(k3c_chat_parser *p) {
    for (size_t i = 0; i < p->nargs; i++) {
        free(p->args[i].key);
        free(p->args[i].json);
    }
    p->nargs = 0;
    free(p->call_name);
    free(p->arg_key);
    free(p->arg_type);
    free(p->json_args);
    p->call_name = p->arg_key = p->arg_type = p->json_args = NULL;
    p->call_text.len = p->streamed.len = 0;
    p->in_call = p->call_drop = p->diverged = 0;
}

/* name NULL: a call without a name, whose arguments are read and discarded. */
static int begin_call(k3c_chat_parser *p, const char *name, size_t n, int index) {
    clear_call(p);
    p->in_call = 1;
    p->call_index = index;
    if (!name) {
        p->call_drop = 1;
        return K3C_OK;
    }
    p->call_name = dupn(name, n);
    if (!p->call_name) return K3C_ENOMEM;
    emit(p, (k3c_chat_delta){.kind = K3C_CHAT_DELTA_CALL_BEGIN, .name = p->call_name, .index = index});
    return K3C_OK;
}

/* Text as a JSON value: parsed when it is JSON (of any type when `any`, else only an object), else a JSON string.
 * Read as Python's json.loads reads it and written as json.dumps writes it: integers of any size exact. */
static char *as_json(const char *s, size_t n, int want_string, int any) {
    k3c_sbuf t;
    k3c_sbuf_init(&t);
    k3c_json *v = NULL;
    if (!want_string && k3c_json_parse_ex(s, n, "value", K3C_JSON_P_DUP_KEYS, &v, NULL) == K3C_OK &&
        (any || v->type == K3C_JSON_OBJECT))
        k3c_sbuf_json_value(&t, v, 0);
    else
        k3c_sbuf_json_string(&t, s, n);
    k3c_json_free(v);
    if (!t.ok) {
        k3c_sbuf_free(&t);
        return NULL;
    }
    return t.buf;
}

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\n", s[i])) return 0;
    return 1;
}

/* An argument with a repeated key replaces the earlier value (as a JSON object read by Python would). */
static int add_arg(k3c_chat_parser *p, const char *key, char *json) {
    if (!json) return K3C_ENOMEM;
    for (size_t i = 0; i < p->nargs; i++)
        if (!strcmp(p->args[i].key, key)) {
            p->diverged = 1;
            free(p->args[i].json);
            p->args[i].json = json;
            return K3C_OK;
        }
    if (p->nargs == p->cap_args) {
        size_t nc = p->cap_args ? 2 * p->cap_args : 8;
        arg_kv *q = realloc(p->args, nc * sizeof *q);
        if (!q) {
            free(json);
            return K3C_ENOMEM;
        }
        p->args = q;
        p->cap_args = nc;
    }
    p->args[p->nargs].key = dupn(key, strlen(key));
    p->args[p->nargs].json = json;
    if (!p->args[p->nargs].key) {
        free(json);
        return K3C_ENOMEM;
    }
    p->nargs++;
    return K3C_OK;
}

/* The call's arguments as compact JSON object text: a json block, typed arguments, or a bare JSON block. */
static void call_arguments(k3c_chat_parser *p, k3c_sbuf *t) {
    if (p->json_args) {
        k3c_sbuf_append(t, p->json_args, strlen(p->json_args));
        return;
    }
    if (!p->nargs && !blank(p->call_text.buf ? p->call_text.buf : "", p->call_text.len)) {
        char *j = as_json(p->call_text.buf, p->call_text.len, 0, 0);
        if (!j) t->ok = 0;
        k3c_sbuf_append(t, j ? j : "", j ? strlen(j) : 0);
        free(j);
        return;
    }
    k3c_sbuf_append(t, "{", 1);
    for (size_t i = 0; i < p->nargs; i++) {
        if (i) k3c_sbuf_append(t, ",", 1);
        k3c_sbuf_json_string(t, p->args[i].key, strlen(p->args[i].key));
        k3c_sbuf_append(t, ":", 1);
        k3c_sbuf_append(t, p->args[i].json, strlen(p->args[i].json));
    }
    k3c_sbuf_append(t, "}", 1);
}

/* The arguments' next piece as a CALL_ARGS delta (while what was streamed is still a prefix of the arguments). */
static void stream_args(k3c_chat_parser *p, const char *s, size_t n) {
    if (!n || p->diverged) return;
    size_t at = p->streamed.len;
    k3c_sbuf_append(&p->streamed, s, n);
    emit(p, (k3c_chat_delta){.kind = K3C_CHAT_DELTA_CALL_ARGS, .text = p->streamed.buf + at, .len = n});
}

/* A typed argument joined the call: `{"key":value` or `,"key":value`, the closing brace comes with the call's end. */
static void stream_arg(k3c_chat_parser *p) {
    if (p->json_args || p->diverged) return;
    const arg_kv *a = &p->args[p->nargs - 1];
    k3c_sbuf t;
    k3c_sbuf_init(&t);
    k3c_sbuf_append(&t, p->nargs == 1 ? "{" : ",", 1);
    k3c_sbuf_json_string(&t, a->key, strlen(a->key));
    k3c_sbuf_append(&t, ":", 1);
    k3c_sbuf_append(&t, a->json, strlen(a->json));
    if (t.ok) stream_args(p, t.buf, t.len);
    k3c_sbuf_free(&t);
}

/* finished 0: the output ended inside the call; it is returned with the arguments read so far. */
static int end_call(k3c_chat_parser *p, int finished) {
    if (p->call_drop) {
        clear_call(p);
        return K3C_OK;
    }
    k3c_sbuf t;
    k3c_sbuf_init(&t);
    call_arguments(p, &t);
    if (p->res.ncalls == p->cap_calls) {
        size_t nc = p->cap_calls ? 2 * p->cap_calls : 4;
        k3c_chat_tool_call *q = realloc(p->res.calls, nc * sizeof *q);
        if (!q)
            t.ok = 0;
        else {
            p->res.calls = q;
            p->cap_calls = nc;
        }
    }
    if (!t.ok) {
        k3c_sbuf_free(&t);
        return K3C_ENOMEM;
    }
    /* what was not streamed yet: the closing brace, or all of arguments read as one block */
    if (!p->diverged &&
        (t.len < p->streamed.len || (p->streamed.len && memcmp(t.buf, p->streamed.buf, p->streamed.len))))
        p->diverged = 1;
    stream_args(p, t.buf + p->streamed.len, t.len - p->streamed.len);
    const int diverged = p->diverged;
    k3c_chat_tool_call *c = &p->res.calls[p->res.ncalls++];
    c->name = p->call_name;
    c->index = p->call_index;
    c->arguments = t.buf;
    c->finished = finished;
    p->call_name = NULL;
    clear_call(p);
    emit(p, (k3c_chat_delta){.kind = K3C_CHAT_DELTA_CALL,
                             .name = c->name,
                             .index = c->index,
                             .arguments = c->arguments,
                             .partial = !finished,
                             .diverged = diverged});
    return K3C_OK;
}

/* The end of an argument or json element: its value joins the call (discarded outside a call or without a key). */
static int close_value(k3c_chat_parser *p) {
    const char *v = p->value.buf ? p->value.buf : "";
    int rc = K3C_OK;
    if (p->in_call && !p->call_drop && p->ch == CH_ARG && p->arg_key) {
        /* Strings are written raw, every other type as JSON; a value that does not parse stays a string. */
        const char *ty = p->arg_type ? p->arg_type : "string";
        rc = add_arg(p, p->arg_key, as_json(v, p->value.len, !strcmp(ty, "string"), 1));
        if (!rc) stream_arg(p);
    } else if (p->in_call && !p->call_drop && p->ch == CH_JSON) {
        free(p->json_args);
        p->json_args = as_json(v, p->value.len, 0, 0);
        if (!p->json_args) rc = K3C_ENOMEM;
    }
    free(p->arg_key);
    free(p->arg_type);
    p->arg_key = p->arg_type = NULL;
    p->value.len = 0;
    p->ch = p->arg_back;
    return rc;
}

/* Ends what structure left open: an element value, then the call (finished 0: cut off by the end of the output). */
static int settle(k3c_chat_parser *p, int finished) {
    int rc = K3C_OK;
    if (p->ch == CH_ARG || p->ch == CH_JSON) rc = close_value(p);
    if (!rc && p->ch == CH_CALL_ARGS && p->in_call) {
        free(p->json_args);
        p->json_args = as_json(p->value.buf ? p->value.buf : "", p->value.len, 0, 0);
        if (!p->json_args) rc = K3C_ENOMEM;
    }
    if (!rc && p->in_call) rc = end_call(p, finished);
    return rc;
}

static void finish_msg(k3c_chat_parser *p) {
    if (p->res.finished) return;
    p->res.finished = 1;
    emit(p, (k3c_chat_delta){.kind = K3C_CHAT_DELTA_FINISHED});
}

/* ---------------------------------------------------------------- XTML */

/* The value of attribute `key` in a tag header (tag k="v" ...), &quot; and &amp; undone; NULL if absent. */
static char *header_attr(const char *h, size_t n, const char *key) {
    size_t kl = strlen(key);
    for (size_t i = 0; i + kl + 2 < n + 1; i++) {
        if (h[i] != ' ' || i + 1 + kl + 2 > n || memcmp(h + i + 1, key, kl) || memcmp(h + i + 1 + kl, "=\"", 2))
            continue;
        size_t s = i + 1 + kl + 2, e = s;
        while (e < n && h[e] != '"') e++;
        char *v = malloc(e - s + 1);
        if (!v) return NULL;
        size_t o = 0;
        for (size_t j = s; j < e;) {
            if (!strncmp(h + j, "&quot;", 6) && j + 6 <= e)
                v[o++] = '"', j += 6;
            else if (!strncmp(h + j, "&amp;", 5) && j + 5 <= e)
                v[o++] = '&', j += 5;
            else
                v[o++] = h[j++];
        }
        v[o] = 0;
        return v;
    }
    return NULL;
}

static int tag_is(const char *h, size_t n, const char *tag) {
    size_t tl = strlen(tag);
    return n >= tl && !memcmp(h, tag, tl) && (n == tl || h[tl] == ' ');
}

static int xtml_open_call(k3c_chat_parser *p, const char *h, size_t n, k3c_err *err) {
    char *name = header_attr(h, n, "tool"), *idx = header_attr(h, n, "index");
    int index = idx && *idx ? atoi(idx) : (int)p->res.ncalls + 1;
    free(idx);
    int rc = K3C_OK;
    if (!name || !*name)
        rc = MALFORMED(p, err, "model output: a tool call without a name (<|open|>call has no tool=\"...\")");
    if (!rc && begin_call(p, name && *name ? name : NULL, name ? strlen(name) : 0, index))
        rc = fail(p, err, K3C_ENOMEM, "out of memory");
    free(name);
    p->ch = CH_CALL;
    return rc;
}

static int xtml_open_value(k3c_chat_parser *p, const char *h, size_t n, int is_arg, k3c_err *err) {
    const char *tag = is_arg ? "argument" : "json";
    if (!p->in_call) {
        int rc = MALFORMED(p, err, "model output: <|open|>%s outside a tool call", tag);
        if (rc) return rc;
    }
    p->arg_back = p->in_call ? CH_CALL : p->ch;
    p->value.len = 0;
    p->ch = is_arg ? CH_ARG : CH_JSON;
    if (!is_arg) return K3C_OK;
    p->arg_key = header_attr(h, n, "key");
    p->arg_type = header_attr(h, n, "type");
    if (!p->arg_key && p->in_call)
        return MALFORMED(p, err, "model output: an argument of tool call \"%s\" without key=\"...\"",
                         p->call_name ? p->call_name : "");
    return K3C_OK;
}

static int xtml_open(k3c_chat_parser *p, const char *h, size_t n, k3c_err *err) {
    char tag[48];
    size_t tl = 0;
    while (tl < n && tl < sizeof tag - 1 && h[tl] != ' ') tag[tl] = h[tl], tl++;
    tag[tl] = 0;
    int chan = tag_is(h, n, "think") || tag_is(h, n, "response") || tag_is(h, n, "tools") || tag_is(h, n, "message");
    int value = tag_is(h, n, "argument") || tag_is(h, n, "json");
    if (!chan && !value && !tag_is(h, n, "call"))
        return MALFORMED(p, err, "model output: unknown XTML element <|open|>%s", tag);
    /* An element the model left open ends where the next one begins (a channel, a call, an argument). */
    int rc = K3C_OK;
    if (p->ch == CH_ARG || p->ch == CH_JSON) rc = close_value(p);
    if (!rc && (chan || tag_is(h, n, "call")) && p->in_call) rc = end_call(p, 1);
    if (rc) return fail(p, err, rc, "out of memory");
    if (tag_is(h, n, "think"))
        p->ch = CH_THINK;
    else if (tag_is(h, n, "response"))
        p->ch = CH_RESPONSE;
    else if (tag_is(h, n, "tools"))
        p->ch = CH_TOOLS;
    else if (tag_is(h, n, "message"))
        p->ch = CH_TOP;
    else if (value)
        return xtml_open_value(p, h, n, tag[0] == 'a', err);
    else
        return xtml_open_call(p, h, n, err);
    return K3C_OK;
}

static int xtml_close(k3c_chat_parser *p, const char *h, size_t n, k3c_err *err) {
    char tag[48];
    snprintf(tag, sizeof tag, "%.*s", (int)(n < 40 ? n : 40), h);
    int rc = K3C_OK;
    if (!strcmp(tag, "think") || !strcmp(tag, "response") || !strcmp(tag, "tools")) {
        rc = settle(p, 1);
        p->ch = CH_TOP;
    } else if ((!strcmp(tag, "argument") && p->ch == CH_ARG) || (!strcmp(tag, "json") && p->ch == CH_JSON)) {
        rc = close_value(p);
    } else if (!strcmp(tag, "call") && p->in_call) {
        rc = settle(p, 1);
        p->ch = CH_TOOLS;
    } else if (!strcmp(tag, "message")) {
        rc = settle(p, 1);
        finish_msg(p);
        p->ch = CH_TOP;
    } else if (strcmp(tag, "argument") && strcmp(tag, "json") && strcmp(tag, "call")) {
        return MALFORMED(p, err, "model output: unknown XTML element <|close|>%s", tag);
    } else {
        return MALFORMED(p, err, "model output: <|close|>%s without its <|open|>%s", tag, tag);
    }
    if (rc) return fail(p, err, rc, "out of memory");
    return K3C_OK;
}

/* A complete tag header h[0..n) (surrounding whitespace is not part of it). */
static int xtml_header(k3c_chat_parser *p, int kind, const char *h, size_t n, k3c_err *err) {
    while (n && strchr(" \t\r\n", *h)) h++, n--;
    while (n && strchr(" \t\r\n", h[n - 1])) n--;
    return kind == 1 ? xtml_open(p, h, n, err) : xtml_close(p, h, n, err);
}

/* ---------------------------------------------------------------- K2 */

static int k2_call_id(k3c_chat_parser *p, k3c_err *err) {
    /* functions.{name}:{idx} (K2's guidance splits on the first '.' and the ':'); whitespace around is allowed. */
    const char *s = p->value.buf ? p->value.buf : "";
    size_t n = p->value.len;
    while (n && strchr(" \t\r\n", *s)) s++, n--;
    while (n && strchr(" \t\r\n", s[n - 1])) n--;
    const char *colon = NULL;
    for (size_t i = 0; i < n; i++)
        if (s[i] == ':') colon = s + i;
    const char *end = colon ? colon : s + n;
    const char *dot = memchr(s, '.', (size_t)(end - s));
    const char *name = dot ? dot + 1 : s;
    int index = (int)p->res.ncalls;
    if (colon) index = atoi(colon + 1);
    int rc = K3C_OK;
    if (end == name) rc = MALFORMED(p, err, "model output: a tool call without a name (id \"%.*s\")", (int)n, s);
    if (rc) return rc;
    rc = begin_call(p, end == name ? NULL : name, (size_t)(end - name), index);
    p->value.len = 0;
    return rc ? fail(p, err, K3C_ENOMEM, "out of memory") : K3C_OK;
}

static int k2_marker(k3c_chat_parser *p, const char *m, k3c_err *err) {
    int rc = K3C_OK;
    if (!strcmp(m, "<think>"))
        p->ch = CH_THINK;
    else if (!strcmp(m, "</think>"))
        p->ch = CH_TOP;
    else if (!strcmp(m, "<|tool_calls_section_begin|>"))
        p->ch = CH_TOOLS;
    else if (!strcmp(m, "<|tool_calls_section_end|>")) {
        rc = settle(p, 1);
        p->ch = CH_TOP;
    } else if (!strcmp(m, "<|tool_call_begin|>")) {
        rc = settle(p, 1);
        p->ch = CH_CALL_ID;
        p->value.len = 0;
    } else if (!strcmp(m, "<|tool_call_argument_begin|>")) {
        if (p->ch != CH_CALL_ID) return MALFORMED(p, err, "model output: %s outside a tool call", m);
        if ((rc = k2_call_id(p, err))) return rc;
        p->ch = CH_CALL_ARGS;
    } else if (!strcmp(m, "<|tool_call_end|>")) {
        if (p->ch != CH_CALL_ARGS) {
            p->ch = p->ch == CH_CALL_ID ? CH_TOOLS : p->ch; /* an id without arguments is no call */
            return MALFORMED(p, err, "model output: %s without %s", m, "<|tool_call_argument_begin|>");
        }
        rc = settle(p, 1);
        p->ch = CH_TOOLS;
    } else if (!strcmp(m, "<|im_end|>")) {
        if (p->ch == CH_CALL_ARGS) rc = settle(p, 1);
        finish_msg(p);
    }
    return rc ? fail(p, err, rc, "out of memory") : K3C_OK;
}

/* ---------------------------------------------------------------- the marker scanner */

/* Every chat control token is structure or dropped, never text; K2's <think> tags count where reasoning or content is
 * read (elsewhere, e.g. inside tool arguments, they are text). */
static size_t markers(const k3c_chat_parser *p, const char **ms) {
    size_t n = 0;
    for (int i = 0; i < K3C_CHAT_N_SPECIALS; i++) ms[n++] = k3c_chat_specials[i];
    if (p->o.format == K3C_CHAT_K2 && (p->ch == CH_TOP || p->ch == CH_THINK)) {
        ms[n++] = "<think>";
        ms[n++] = "</think>";
    }
    return n;
}

static int on_marker(k3c_chat_parser *p, const char *m, const char *h, size_t hn, k3c_err *err) {
    if (p->o.format == K3C_CHAT_K2) return k2_marker(p, m, err);
    int kind = p->header;
    if (!strcmp(m, "<|sep|>")) {
        p->header = 0;
        return kind ? xtml_header(p, kind, h, hn, err) : K3C_OK; /* a separator without a header: dropped */
    }
    /* Any other marker inside a header abandons it (it was no tag). */
    p->header = !strcmp(m, "<|open|>") ? 1 : !strcmp(m, "<|close|>") ? 2 : 0;
    if (!strcmp(m, "<|end_of_msg|>")) {
        int rc = settle(p, 1);
        if (rc) return fail(p, err, rc, "out of memory");
        finish_msg(p);
    }
    return K3C_OK;
}

/* The first marker in s[0..n) (*which: which one), NULL if none. Every marker starts with '<' or '[', so one pass over
 * the text finds it: reading an output stays linear in its length however many markers it has. */
static const char *find_marker(const char *s, size_t n, const char *const *ms, size_t nm, const char **which) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '<' && s[i] != '[') continue;
        for (size_t j = 0; j < nm; j++) {
            size_t ml = strlen(ms[j]);
            if (ml <= n - i && !memcmp(s + i, ms[j], ml)) {
                *which = ms[j];
                return s + i;
            }
        }
    }
    return NULL;
}

/* Bytes at the end of s[0..n) that might still become a marker, or complete a UTF-8 character: held back. */
static size_t holdback(const char *s, size_t n, const char *const *ms, size_t nm) {
    size_t h = 0;
    for (size_t j = 0; j < nm; j++) {
        size_t ml = strlen(ms[j]);
        for (size_t k = ml - 1; k > h; k--)
            if (k <= n && !memcmp(s + n - k, ms[j], k)) {
                h = k;
                break;
            }
    }
    /* an incomplete UTF-8 sequence before the held-back part */
    size_t e = n - h, i = e;
    while (i > 0 && e - i < 4 && ((unsigned char)s[i - 1] & 0xc0) == 0x80) i--;
    if (i > 0) {
        unsigned char c = (unsigned char)s[i - 1];
        size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        if (need > 1 && e - (i - 1) < need) h = n - (i - 1);
    }
    return h;
}

static int scan(k3c_chat_parser *p, int final, k3c_err *err) {
    size_t used = 0;
    if (!p->pend.buf) return K3C_OK;
    while (!p->res.finished && !p->failed) {
        const char *s = p->pend.buf + used;
        size_t n = p->pend.len - used;
        const char *ms[K3C_CHAT_N_SPECIALS + 2];
        size_t nm = markers(p, ms);
        const char *bm = NULL, *best = find_marker(s, n, ms, nm, &bm);
        /* bytes that may still begin a marker do not count, so a split input decides as a whole one does */
        size_t keep = best || final ? 0 : holdback(s, n, ms, nm);
        if (p->header && (best ? (size_t)(best - s) : n - keep) > HEADER_MAX) {
            p->header = 0; /* no tag: what follows the stray marker is channel text */
            continue;
        }
        if (!best) {
            if (p->header) break; /* a tag header is structure: wait for its <|sep|> */
            sink(p, s, n - keep);
            used += n - keep;
            break;
        }
        size_t pos = (size_t)(best - s);
        if (!p->header) sink(p, s, pos);
        used += pos + strlen(bm);
        int rc = on_marker(p, bm, s, pos, err);
        if (rc) return rc;
    }
    if (p->res.finished) used = p->pend.len; /* after the end of the message nothing more is read */
    memmove(p->pend.buf, p->pend.buf + used, p->pend.len - used);
    p->pend.len -= used;
    if (p->pend.buf) p->pend.buf[p->pend.len] = 0;
    return K3C_OK;
}

/* ---------------------------------------------------------------- public API */

int k3c_chat_parser_new(const k3c_chat_parse_opts *opts, k3c_chat_delta_fn on_delta, void *ctx, k3c_chat_parser **out,
                        k3c_err *err) {
    k3c_chat_parser *p = calloc(1, sizeof *p);
    if (!p) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    p->o = opts ? *opts : (k3c_chat_parse_opts){K3C_CHAT_XTML, 0, 0, 0};
    p->fn = on_delta;
    p->ctx = ctx;
    k3c_sbuf_init(&p->pend);
    k3c_sbuf_init(&p->value);
    k3c_sbuf_init(&p->call_text);
    k3c_sbuf_init(&p->streamed);
    k3c_sbuf_init(&p->reasoning);
    k3c_sbuf_init(&p->content);
    k3c_sbuf_append(&p->reasoning, "", 0);
    k3c_sbuf_append(&p->content, "", 0);
    /* The channel the generation prompt opened; none: text before any marker is content. */
    p->ch = p->o.in_think ? CH_THINK : p->o.in_response ? CH_RESPONSE : CH_TOP;
    *out = p;
    return K3C_OK;
}

static void sync_result(k3c_chat_parser *p) {
    p->res.reasoning = p->reasoning.buf;
    p->res.reasoning_len = p->reasoning.len;
    p->res.content = p->content.buf;
    p->res.content_len = p->content.len;
}

int k3c_chat_parser_feed(k3c_chat_parser *p, const char *s, size_t n, k3c_err *err) {
    if (p->failed) {
        if (err) *err = p->err;
        return p->err.code;
    }
    if (p->res.finished) return K3C_OK;
    k3c_sbuf_append(&p->pend, s, n);
    int rc = scan(p, 0, err);
    if (!rc && !(p->pend.ok && p->value.ok && p->call_text.ok && p->streamed.ok && p->reasoning.ok && p->content.ok))
        rc = fail(p, err, K3C_ENOMEM, "out of memory");
    sync_result(p);
    return rc;
}

int k3c_chat_parser_finish(k3c_chat_parser *p, k3c_err *err) {
    if (p->failed) {
        if (err) *err = p->err;
        return p->err.code;
    }
    int rc = scan(p, 1, err);
    p->pend.len = 0; /* an unterminated tag header was structure, never text */
    p->header = 0;
    /* a tool call cut off by the token limit is returned with the arguments read so far */
    if (!rc && !p->res.finished && (rc = settle(p, 0))) rc = fail(p, err, rc, "out of memory");
    sync_result(p);
    return rc;
}

const k3c_chat_result *k3c_chat_parser_result(const k3c_chat_parser *p) { return &p->res; }

void k3c_chat_parser_free(k3c_chat_parser *p) {
    if (!p) return;
    clear_call(p);
    free(p->args);
    k3c_sbuf_free(&p->pend);
    k3c_sbuf_free(&p->value);
    k3c_sbuf_free(&p->call_text);
    k3c_sbuf_free(&p->streamed);
    p->res.reasoning = p->res.content = NULL;
    k3c_sbuf_free(&p->reasoning);
    k3c_sbuf_free(&p->content);
    k3c_chat_result_free(&p->res);
    free(p);
}

int k3c_chat_parse(const k3c_chat_parse_opts *opts, const char *s, size_t n, k3c_chat_result *out, k3c_err *err) {
    *out = (k3c_chat_result){0};
    k3c_chat_parser *p;
    int rc = k3c_chat_parser_new(opts, NULL, NULL, &p, err);
    if (rc) return rc;
    rc = k3c_chat_parser_feed(p, s, n, err);
    if (!rc) rc = k3c_chat_parser_finish(p, err);
    if (!rc) {
        /* hand the buffers over to the caller */
        *out = p->res;
        p->res = (k3c_chat_result){0};
        k3c_sbuf_init(&p->reasoning);
        k3c_sbuf_init(&p->content);
    }
    k3c_chat_parser_free(p);
    return rc;
}

void k3c_chat_result_free(k3c_chat_result *r) {
    if (!r) return;
    free(r->reasoning);
    free(r->content);
    for (size_t i = 0; i < r->ncalls; i++) {
        free(r->calls[i].name);
        free(r->calls[i].arguments);
    }
    free(r->calls);
    *r = (k3c_chat_result){0};
}

void k3c_chat_result_json(k3c_sbuf *s, const k3c_chat_result *r) {
    k3c_sbuf_append(s, "{\"reasoning\":", 13);
    k3c_sbuf_json_string(s, r->reasoning ? r->reasoning : "", r->reasoning_len);
    k3c_sbuf_append(s, ",\"content\":", 11);
    k3c_sbuf_json_string(s, r->content ? r->content : "", r->content_len);
    k3c_sbuf_append(s, ",\"tool_calls\":[", 15);
    for (size_t i = 0; i < r->ncalls; i++) {
        if (i) k3c_sbuf_append(s, ",", 1);
        k3c_sbuf_append(s, "{\"name\":", 8);
        k3c_sbuf_json_string(s, r->calls[i].name, strlen(r->calls[i].name));
        k3c_sbuf_printf(s, ",\"index\":%d,\"arguments\":%s}", r->calls[i].index, r->calls[i].arguments);
    }
    k3c_sbuf_printf(s, "],\"finished\":%s}", r->finished ? "true" : "false");
}
