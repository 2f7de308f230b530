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
    CH_CALL,     /* XTML inside <call>, between arguments: dropped */
    CH_ARG,      /* XTML argument value, buffered */
    CH_JSON,     /* XTML json block, buffered */
    CH_CALL_ID,  /* K2 functions.name:idx, buffered */
    CH_CALL_ARGS /* K2 JSON arguments, buffered */
};

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
    k3c_sbuf value; /* buffered channel text (argument value, json block, K2 id / arguments) */
    k3c_sbuf reasoning, content;
    /* the call being read */
    int in_call, call_index;
    char *call_name;
    arg_kv *args;
    size_t nargs, cap_args;
    char *arg_key, *arg_type;
    char *json_args; /* a json block's arguments (XTML) */
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

int k3c_chat_parse_opts_from_json(const k3c_json *o, k3c_chat_parse_opts *out, k3c_err *err) {
    *out = (k3c_chat_parse_opts){K3C_CHAT_XTML, -1};
    if (o && o->type != K3C_JSON_NULL) {
        if (o->type != K3C_JSON_OBJECT) return k3c_errf(err, K3C_EINVAL, "parse_options: expected an object");
        for (size_t i = 0; i < o->n; i++) {
            const k3c_json *v = &o->items[i];
            if (!strcmp(o->keys[i], "format")) {
                if (v->type != K3C_JSON_STRING || k3c_chat_format_parse(v->string, &out->format))
                    return k3c_errf(err, K3C_EINVAL, "parse_options.format: expected \"xtml\" or \"k2\"");
            } else if (!strcmp(o->keys[i], "in_think")) {
                if (v->type != K3C_JSON_BOOL)
                    return k3c_errf(err, K3C_EINVAL, "parse_options.in_think: expected true or false");
                out->in_think = v->boolean;
            } else {
                return k3c_errf(err, K3C_EINVAL, "parse_options.%s: unknown option", o->keys[i]);
            }
        }
    }
    /* XTML's default prompt (thinking on) ends inside <|open|>think<|sep|>; K2's ends before any channel. */
    if (out->in_think < 0) out->in_think = out->format == K3C_CHAT_XTML;
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
    p->in_call = 0;
}

static int begin_call(k3c_chat_parser *p, const char *name, size_t n, int index) {
    clear_call(p);
    p->call_name = dupn(name, n);
    if (!p->call_name) return K3C_ENOMEM;
    p->in_call = 1;
    p->call_index = index;
    emit(p, (k3c_chat_delta){.kind = K3C_CHAT_DELTA_CALL_BEGIN, .name = p->call_name, .index = index});
    return K3C_OK;
}

/* Text as a JSON value: parsed when it is JSON (of any type when `any`, else only an object), else a JSON string. */
static char *as_json(const char *s, size_t n, int want_string, int any) {
    k3c_sbuf t;
    k3c_sbuf_init(&t);
    k3c_json *v = NULL;
    if (!want_string && k3c_json_parse(s, n, "value", &v, NULL) == K3C_OK && (any || v->type == K3C_JSON_OBJECT))
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

/* An argument with a repeated key replaces the earlier value (as a JSON object read by Python would). */
static int add_arg(k3c_chat_parser *p, const char *key, char *json) {
    if (!json) return K3C_ENOMEM;
    for (size_t i = 0; i < p->nargs; i++)
        if (!strcmp(p->args[i].key, key)) {
            free(p->args[i].json);
            p->args[i].json = json;
            return K3C_OK;
        }
    if (p->nargs == p->cap_args) {
        size_t nc = p->cap_args ? 2 * p->cap_args : 8;
        arg_kv *q = realloc(p->args, nc * sizeof *q);
        if (!q) return K3C_ENOMEM;
        p->args = q;
        p->cap_args = nc;
    }
    p->args[p->nargs].key = dupn(key, strlen(key));
    p->args[p->nargs].json = json;
    if (!p->args[p->nargs].key) return K3C_ENOMEM;
    p->nargs++;
    return K3C_OK;
}

static int end_call(k3c_chat_parser *p) {
    k3c_sbuf t;
    k3c_sbuf_init(&t);
    if (p->json_args) {
        k3c_sbuf_append(&t, p->json_args, strlen(p->json_args));
    } else {
        k3c_sbuf_append(&t, "{", 1);
        for (size_t i = 0; i < p->nargs; i++) {
            if (i) k3c_sbuf_append(&t, ",", 1);
            k3c_sbuf_json_string(&t, p->args[i].key, strlen(p->args[i].key));
            k3c_sbuf_append(&t, ":", 1);
            k3c_sbuf_append(&t, p->args[i].json, strlen(p->args[i].json));
        }
        k3c_sbuf_append(&t, "}", 1);
    }
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
    k3c_chat_tool_call *c = &p->res.calls[p->res.ncalls++];
    c->name = p->call_name;
    c->index = p->call_index;
    c->arguments = t.buf;
    p->call_name = NULL;
    clear_call(p);
    emit(p,
         (k3c_chat_delta){.kind = K3C_CHAT_DELTA_CALL, .name = c->name, .index = c->index, .arguments = c->arguments});
    return K3C_OK;
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

static int xtml_open(k3c_chat_parser *p, const char *h, size_t n, k3c_err *err) {
    char tag[48];
    size_t tl = 0;
    while (tl < n && tl < sizeof tag - 1 && h[tl] != ' ') tag[tl] = h[tl], tl++;
    tag[tl] = 0;
    if (tag_is(h, n, "think"))
        p->ch = CH_THINK;
    else if (tag_is(h, n, "response"))
        p->ch = CH_RESPONSE;
    else if (tag_is(h, n, "tools"))
        p->ch = CH_TOOLS;
    else if (tag_is(h, n, "message"))
        p->ch = CH_TOP;
    else if (tag_is(h, n, "call")) {
        char *name = header_attr(h, n, "tool"), *idx = header_attr(h, n, "index");
        int index = idx && *idx ? atoi(idx) : (int)p->res.ncalls + 1;
        free(idx);
        if (!name || !*name) {
            free(name);
            return fail(p, err, K3C_EFORMAT,
                        "model output: a tool call without a name (<|open|>call has no tool=\"...\")");
        }
        int rc = begin_call(p, name, strlen(name), index);
        free(name);
        if (rc) return fail(p, err, rc, "out of memory");
        p->ch = CH_CALL;
    } else if (tag_is(h, n, "argument") || tag_is(h, n, "json")) {
        if (!p->in_call) return fail(p, err, K3C_EFORMAT, "model output: <|open|>%s outside a tool call", tag);
        if (tag[0] == 'a') {
            free(p->arg_key);
            free(p->arg_type);
            p->arg_key = header_attr(h, n, "key");
            p->arg_type = header_attr(h, n, "type");
            if (!p->arg_key)
                return fail(p, err, K3C_EFORMAT, "model output: an argument of tool call \"%s\" without key=\"...\"",
                            p->call_name);
            p->ch = CH_ARG;
        } else {
            p->ch = CH_JSON;
        }
        p->value.len = 0;
    } else {
        return fail(p, err, K3C_EFORMAT, "model output: unknown XTML element <|open|>%s", tag);
    }
    return K3C_OK;
}

static int xtml_close(k3c_chat_parser *p, const char *h, size_t n, k3c_err *err) {
    char tag[48];
    snprintf(tag, sizeof tag, "%.*s", (int)(n < 40 ? n : 40), h);
    int rc = K3C_OK;
    if (!strcmp(tag, "think") || !strcmp(tag, "response") || !strcmp(tag, "tools")) {
        p->ch = CH_TOP;
    } else if (!strcmp(tag, "argument") && p->ch == CH_ARG) {
        /* Strings are written raw, every other type as JSON; a value that does not parse stays a string. */
        const char *ty = p->arg_type ? p->arg_type : "string";
        rc = add_arg(p, p->arg_key, as_json(p->value.buf ? p->value.buf : "", p->value.len, !strcmp(ty, "string"), 1));
        p->ch = CH_CALL;
    } else if (!strcmp(tag, "json") && p->ch == CH_JSON) {
        free(p->json_args);
        p->json_args = as_json(p->value.buf ? p->value.buf : "", p->value.len, 0, 0);
        if (!p->json_args) rc = K3C_ENOMEM;
        p->ch = CH_CALL;
    } else if (!strcmp(tag, "call") && p->in_call) {
        rc = end_call(p);
        p->ch = CH_TOOLS;
    } else if (!strcmp(tag, "message")) {
        finish_msg(p);
        p->ch = CH_TOP;
    } else if (strcmp(tag, "argument") && strcmp(tag, "json") && strcmp(tag, "call")) {
        return fail(p, err, K3C_EFORMAT, "model output: unknown XTML element <|close|>%s", tag);
    } else {
        return fail(p, err, K3C_EFORMAT, "model output: <|close|>%s without its <|open|>%s", tag, tag);
    }
    if (rc) return fail(p, err, rc, "out of memory");
    return K3C_OK;
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
    if (end == name)
        return fail(p, err, K3C_EFORMAT, "model output: a tool call without a name (id \"%.*s\")", (int)n, s);
    p->value.len = 0;
    if (begin_call(p, name, (size_t)(end - name), index)) return fail(p, err, K3C_ENOMEM, "out of memory");
    return K3C_OK;
}

/* ---------------------------------------------------------------- the marker scanner */

static const char *const XTML_MARKERS[] = {"<|open|>", "<|close|>", "<|end_of_msg|>", NULL};
static const char *const XTML_HEADER[] = {"<|sep|>", NULL};
static const char *const K2_TEXT[] = {"<think>",    "</think>", "<|tool_calls_section_begin|>", "<|tool_call_begin|>",
                                      "<|im_end|>", NULL};
static const char *const K2_CALLS[] = {"<|tool_calls_section_begin|>",
                                       "<|tool_calls_section_end|>",
                                       "<|tool_call_begin|>",
                                       "<|tool_call_argument_begin|>",
                                       "<|tool_call_end|>",
                                       "<|im_end|>",
                                       NULL};

static const char *const *markers(const k3c_chat_parser *p) {
    if (p->o.format == K3C_CHAT_XTML) return p->header ? XTML_HEADER : XTML_MARKERS;
    /* <think> is plain text in K2, so it is a marker only where reasoning or content is being read */
    return (p->ch == CH_TOP || p->ch == CH_THINK) ? K2_TEXT : K2_CALLS;
}

static int on_marker(k3c_chat_parser *p, const char *m, const char *h, size_t hn, k3c_err *err) {
    if (p->o.format == K3C_CHAT_XTML) {
        if (!strcmp(m, "<|open|>"))
            p->header = 1;
        else if (!strcmp(m, "<|close|>"))
            p->header = 2;
        else if (!strcmp(m, "<|end_of_msg|>"))
            finish_msg(p);
        else { /* <|sep|>: the header h[0..hn) is complete */
            int kind = p->header;
            p->header = 0;
            return kind == 1 ? xtml_open(p, h, hn, err) : xtml_close(p, h, hn, err);
        }
        return K3C_OK;
    }
    if (!strcmp(m, "<think>"))
        p->ch = CH_THINK;
    else if (!strcmp(m, "</think>"))
        p->ch = CH_TOP;
    else if (!strcmp(m, "<|tool_calls_section_begin|>"))
        p->ch = CH_TOOLS;
    else if (!strcmp(m, "<|tool_calls_section_end|>"))
        p->ch = CH_TOP;
    else if (!strcmp(m, "<|tool_call_begin|>")) {
        p->ch = CH_CALL_ID;
        p->value.len = 0;
    } else if (!strcmp(m, "<|tool_call_argument_begin|>")) {
        if (p->ch != CH_CALL_ID) return fail(p, err, K3C_EFORMAT, "model output: %s outside a tool call", m);
        int rc = k2_call_id(p, err);
        if (rc) return rc;
        p->ch = CH_CALL_ARGS;
    } else if (!strcmp(m, "<|tool_call_end|>")) {
        if (p->ch != CH_CALL_ARGS)
            return fail(p, err, K3C_EFORMAT, "model output: %s without %s", m, "<|tool_call_argument_begin|>");
        p->json_args = as_json(p->value.buf ? p->value.buf : "", p->value.len, 0, 0);
        if (!p->json_args || end_call(p)) return fail(p, err, K3C_ENOMEM, "out of memory");
        p->ch = CH_TOOLS;
    } else if (!strcmp(m, "<|im_end|>")) {
        finish_msg(p);
    }
    return K3C_OK;
}

/* Bytes at the end of s[0..n) that might still become a marker, or complete a UTF-8 character: held back. */
static size_t holdback(const char *s, size_t n, const char *const *ms) {
    size_t h = 0;
    for (const char *const *m = ms; *m; m++) {
        size_t ml = strlen(*m);
        for (size_t k = ml - 1; k > h; k--)
            if (k <= n && !memcmp(s + n - k, *m, k)) {
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
        const char *const *ms = markers(p);
        const char *best = NULL, *bm = NULL;
        for (const char *const *m = ms; *m; m++) {
            const char *hit = memmem(s, n, *m, strlen(*m));
            if (hit && (!best || hit < best)) best = hit, bm = *m;
        }
        if (!best) {
            if (p->header) break; /* a tag header is structure: wait for its <|sep|> */
            size_t keep = final ? 0 : holdback(s, n, ms);
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
    p->o = opts ? *opts : (k3c_chat_parse_opts){K3C_CHAT_XTML, 1};
    p->fn = on_delta;
    p->ctx = ctx;
    k3c_sbuf_init(&p->pend);
    k3c_sbuf_init(&p->value);
    k3c_sbuf_init(&p->reasoning);
    k3c_sbuf_init(&p->content);
    k3c_sbuf_append(&p->reasoning, "", 0);
    k3c_sbuf_append(&p->content, "", 0);
    p->ch = p->o.in_think ? CH_THINK : (p->o.format == K3C_CHAT_XTML ? CH_RESPONSE : CH_TOP);
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
    if (!rc && !(p->pend.ok && p->value.ok && p->reasoning.ok && p->content.ok))
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
    clear_call(p);   /* a tool call cut off by the token limit is not a call */
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
