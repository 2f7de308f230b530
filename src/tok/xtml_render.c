/* xtml_render.c — k3c_chat_render: OpenAI-style messages + tools + options to the prompt string and its segments.
 * XTML (K3, a byte-exact port of the release's encoding_k3.py as docs/FORMATS.md §9.2 describes it) and the
 * K2-style envelope of Kimi Linear (§9.1, its chat_template.jinja). */
#include "tok/xtml.h"

#include <stdlib.h>
#include <string.h>

#define IMAGE_PLACEHOLDER "<|kimi_image_placeholder|>"

const char *const k3c_chat_specials[K3C_CHAT_N_SPECIALS] = {"<|endoftext|>",
                                                            "[EOS]",
                                                            "<|open|>",
                                                            "<|close|>",
                                                            "<|sep|>",
                                                            "<|end_of_msg|>",
                                                            "<|im_end|>",
                                                            "<|im_user|>",
                                                            "<|im_assistant|>",
                                                            "<|im_system|>",
                                                            "<|im_middle|>",
                                                            "<|tool_calls_section_begin|>",
                                                            "<|tool_calls_section_end|>",
                                                            "<|tool_call_begin|>",
                                                            "<|tool_call_argument_begin|>",
                                                            "<|tool_call_end|>"};

int k3c_chat_format_parse(const char *name, k3c_chat_format *out) {
    if (!strcmp(name, "xtml") || !strcmp(name, "k3"))
        *out = K3C_CHAT_XTML;
    else if (!strcmp(name, "k2") || !strcmp(name, "kimi_linear"))
        *out = K3C_CHAT_K2;
    else
        return K3C_EINVAL;
    return K3C_OK;
}

/* ---------------------------------------------------------------- segment builder */

typedef struct {
    k3c_sbuf text;
    k3c_chat_segment *segs;
    size_t nseg, cap;
    int nomem;
    const k3c_json *image_prompts; /* NULL: images render as the placeholder itself */
    size_t image_next;
    k3c_err *err;
} builder;

/* Empty runs are dropped, as upstream's _segment does: "" never becomes a segment (an empty attribute value leaves
 * ` key` `="` `"`). */
static void seg(builder *b, const char *s, size_t n, int markup) {
    if (!n) return;
    if (b->nseg == b->cap) {
        size_t nc = b->cap ? 2 * b->cap : 64;
        k3c_chat_segment *q = realloc(b->segs, nc * sizeof *q);
        if (!q) {
            b->nomem = 1;
            return;
        }
        b->segs = q;
        b->cap = nc;
    }
    b->segs[b->nseg++] = (k3c_chat_segment){b->text.len, n, markup};
    k3c_sbuf_append(&b->text, s, n);
}
static void text(builder *b, const char *s) { seg(b, s, strlen(s), 0); }
static void mark(builder *b, const char *s) { seg(b, s, strlen(s), 1); }

/* Python's str.isspace() for the characters a chat message realistically holds (ASCII, \x1c-\x1f, NEL, NBSP, the
 * U+2000 block, line/paragraph separators, ideographic space): decides whether a reasoning text counts as empty. */
static int py_blank(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) {
            i++;
            continue;
        }
        if (c == 0xc2 && i + 1 < n && (u[i + 1] == 0x85 || u[i + 1] == 0xa0)) {
            i += 2;
            continue;
        }
        if (c == 0xe1 && i + 2 < n && u[i + 1] == 0x9a && u[i + 2] == 0x80) {
            i += 3;
            continue;
        }
        if (c == 0xe2 && i + 2 < n && u[i + 1] == 0x80 &&
            (u[i + 2] <= 0x8a || u[i + 2] == 0xa8 || u[i + 2] == 0xa9 || u[i + 2] == 0xaf)) {
            i += 3;
            continue;
        }
        if (c == 0xe2 && i + 2 < n && u[i + 1] == 0x81 && u[i + 2] == 0x9f) {
            i += 3;
            continue;
        }
        if (c == 0xe3 && i + 2 < n && u[i + 1] == 0x80 && u[i + 2] == 0x80) {
            i += 3;
            continue;
        }
        return 0;
    }
    return 1;
}

/* Python's truthiness of a JSON value (upstream tests `if message.get("name")`, `if tool_calls`, ...). */
static int truthy(const k3c_json *v) {
    if (!v) return 0;
    switch (v->type) {
    case K3C_JSON_NULL: return 0;
    case K3C_JSON_BOOL: return v->boolean;
    case K3C_JSON_NUMBER: return v->number != 0;
    case K3C_JSON_STRING: return v->len > 0;
    default: return v->n > 0;
    }
}

/* Python's str(value) for scalars (upstream formats attribute values and text parts with str()). Containers would be
 * Python reprs ({'a': 1}), which no tokenizer-facing prompt should contain: refused. */
static int py_str(builder *b, const k3c_json *v, k3c_sbuf *out, const char *what) {
    switch (v ? v->type : K3C_JSON_NULL) {
    case K3C_JSON_STRING: k3c_sbuf_append(out, v->string, v->len); break;
    case K3C_JSON_NUMBER: k3c_sbuf_json_value(out, v, 0); break;
    case K3C_JSON_BOOL: k3c_sbuf_append(out, v->boolean ? "True" : "False", v->boolean ? 4 : 5); break;
    case K3C_JSON_NULL: k3c_sbuf_append(out, "None", 4); break;
    default:
        return k3c_errf(b->err, K3C_EINVAL, "%s: expected a string, got an %s", what,
                        v->type == K3C_JSON_ARRAY ? "array" : "object");
    }
    return K3C_OK;
}

static int next_image(builder *b, const char *what) {
    if (!b->image_prompts) {
        mark(b, IMAGE_PLACEHOLDER);
        return K3C_OK;
    }
    if (b->image_next >= b->image_prompts->n)
        return k3c_errf(b->err, K3C_EINVAL, "%s: more images than options.image_prompts (%zu)", what,
                        b->image_prompts->n);
    const k3c_json *p = &b->image_prompts->items[b->image_next++];
    seg(b, p->string, p->len, 1);
    return K3C_OK;
}

/* Caller text; with image_prompts given, each placeholder in it becomes the next media block (markup). */
static int append_text(builder *b, const char *s, size_t n, const char *what) {
    if (!b->image_prompts) {
        seg(b, s, n, 0);
        return K3C_OK;
    }
    const size_t pl = strlen(IMAGE_PLACEHOLDER);
    for (;;) {
        const char *hit = n >= pl ? memmem(s, n, IMAGE_PLACEHOLDER, pl) : NULL;
        if (!hit) break;
        seg(b, s, (size_t)(hit - s), 0);
        int rc = next_image(b, what);
        if (rc) return rc;
        n -= (size_t)(hit - s) + pl;
        s = hit + pl;
    }
    seg(b, s, n, 0);
    return K3C_OK;
}

static int append_value_text(builder *b, const k3c_json *v, const char *what) {
    k3c_sbuf t;
    k3c_sbuf_init(&t);
    int rc = py_str(b, v, &t, what);
    if (!rc) rc = append_text(b, t.buf ? t.buf : "", t.len, what);
    k3c_sbuf_free(&t);
    return rc;
}

/* ---------------------------------------------------------------- XTML elements */

/* `&` before `"`, or the ampersand of &quot; would be escaped again; < and > stay literal (the brackets are tokens). */
static void attr(builder *b, const char *key, const char *val, size_t n) {
    k3c_sbuf t;
    k3c_sbuf_init(&t);
    k3c_sbuf_append(&t, " ", 1);
    k3c_sbuf_append(&t, key, strlen(key));
    seg(b, t.buf ? t.buf : "", t.len, 0);
    text(b, "=\"");
    t.len = 0;
    for (size_t i = 0; i < n; i++) {
        if (val[i] == '&')
            k3c_sbuf_append(&t, "&amp;", 5);
        else if (val[i] == '"')
            k3c_sbuf_append(&t, "&quot;", 6);
        else
            k3c_sbuf_append(&t, val + i, 1);
    }
    seg(b, t.buf ? t.buf : "", t.len, 0);
    text(b, "\"");
    k3c_sbuf_free(&t);
}
static void attr_s(builder *b, const char *key, const char *val) { attr(b, key, val, strlen(val)); }
static void attr_i(builder *b, const char *key, long v) {
    char num[32];
    snprintf(num, sizeof num, "%ld", v);
    attr_s(b, key, num);
}
static int attr_v(builder *b, const char *key, const k3c_json *v, const char *what) {
    k3c_sbuf t;
    k3c_sbuf_init(&t);
    int rc = py_str(b, v, &t, what);
    if (!rc) attr(b, key, t.buf ? t.buf : "", t.len);
    k3c_sbuf_free(&t);
    return rc;
}

static void open_tag(builder *b, const char *tag) {
    mark(b, "<|open|>");
    text(b, tag);
}
static void open_done(builder *b) { mark(b, "<|sep|>"); }
static void close_tag(builder *b, const char *tag) {
    mark(b, "<|close|>");
    text(b, tag);
    mark(b, "<|sep|>");
}
static void end_message(builder *b) {
    close_tag(b, "message");
    mark(b, "<|end_of_msg|>");
}

static void system_note(builder *b, const char *type, const char *body) {
    open_tag(b, "message");
    attr_s(b, "role", "system");
    attr_s(b, "type", type);
    open_done(b);
    text(b, body);
    end_message(b);
}

static void tool_declare(builder *b, const k3c_json *tools, int dynamic) {
    k3c_sbuf t;
    k3c_sbuf_init(&t);
    if (dynamic) {
        const char *h = "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
                        "You have access to all existing and extended tools.\n"
                        "Here are the specs for the extended tools.\n\n```json\n";
        k3c_sbuf_append(&t, h, strlen(h));
    } else {
        const char *h = "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n";
        k3c_sbuf_append(&t, h, strlen(h));
    }
    /* Key-sorted so that the same tools in another key order give the same bytes (a prefix-cache hit). */
    k3c_sbuf_json_value(&t, tools, K3C_JSON_W_SORT_KEYS);
    k3c_sbuf_append(&t, "\n```", 4);
    open_tag(b, "message");
    attr_s(b, "role", "system");
    attr_s(b, "type", "tool-declare");
    open_done(b);
    seg(b, t.buf, t.len, 0);
    end_message(b);
    k3c_sbuf_free(&t);
}

/* A message's content: a string, null, or OpenAI's list of parts ({type: text, text} / {type: image|image_url}). */
static int content(builder *b, const k3c_json *c, const char *what) {
    char w[160];
    if (!c || c->type == K3C_JSON_NULL) return K3C_OK;
    if (c->type == K3C_JSON_STRING) return append_text(b, c->string, c->len, what);
    if (c->type != K3C_JSON_ARRAY)
        return k3c_errf(b->err, K3C_EINVAL, "%s.content: expected a string, null or an array of parts", what);
    for (size_t i = 0; i < c->n; i++) {
        const k3c_json *part = &c->items[i];
        snprintf(w, sizeof w, "%s.content[%zu]", what, i);
        const k3c_json *type = k3c_json_get(part, "type");
        if (part->type != K3C_JSON_OBJECT || !type)
            return k3c_errf(b->err, K3C_EINVAL, "%s: expected an object with a \"type\"", w);
        int rc;
        if (type->type == K3C_JSON_STRING && (!strcmp(type->string, "image") || !strcmp(type->string, "image_url"))) {
            rc = next_image(b, w);
        } else {
            const k3c_json *t = k3c_json_get(part, "text");
            if (!t) return k3c_errf(b->err, K3C_EINVAL, "%s: a non-image part needs \"text\"", w);
            rc = append_value_text(b, t, w);
        }
        if (rc) return rc;
    }
    return K3C_OK;
}

/* OpenAI sends tool-call arguments as a JSON string. It is read as the release reads it (Python's json.loads: a
 * repeated key keeps its first position and its last value) and an object renders as typed `argument` children; text
 * that does not parse is kept verbatim in a `json` block (the model sees back what it emitted); anything else is an
 * error. */
static int call_arguments(builder *b, const k3c_json *a, k3c_json **parsed, const char **raw, size_t *raw_len,
                          const char *what) {
    *parsed = NULL;
    *raw = NULL;
    if (!a || a->type == K3C_JSON_NULL || a->type == K3C_JSON_OBJECT) return K3C_OK;
    if (a->type != K3C_JSON_STRING)
        return k3c_errf(b->err, K3C_EINVAL, "%s.arguments: expected an object or a JSON object string", what);
    if (py_blank(a->string, a->len)) return K3C_OK;
    k3c_err perr;
    if (k3c_json_parse_ex(a->string, a->len, "arguments", K3C_JSON_P_DUP_KEYS, parsed, &perr) != K3C_OK) {
        *raw = a->string;
        *raw_len = a->len;
        return K3C_OK;
    }
    if ((*parsed)->type != K3C_JSON_OBJECT) {
        k3c_json_free(*parsed);
        *parsed = NULL;
        return k3c_errf(b->err, K3C_EINVAL, "%s.arguments: must be a JSON object", what);
    }
    return K3C_OK;
}

static const char *xtml_type(const k3c_json *v) {
    switch (v->type) {
    case K3C_JSON_BOOL: return "boolean";
    case K3C_JSON_NULL: return "null";
    case K3C_JSON_NUMBER: return "number";
    case K3C_JSON_STRING: return "string";
    case K3C_JSON_OBJECT: return "object";
    default: return "array";
    }
}

/* The function object of a tool call: its "function" member when present (then it must be an object), else itself. */
static const k3c_json *call_function(const k3c_json *tc) {
    const k3c_json *f = k3c_json_get(tc, "function");
    return f ? f : tc;
}

static int xtml_tool_calls(builder *b, const k3c_json *calls, const char *what) {
    char w[160];
    open_tag(b, "tools");
    open_done(b);
    for (size_t i = 0; i < calls->n; i++) {
        snprintf(w, sizeof w, "%s.tool_calls[%zu]", what, i);
        const k3c_json *tc = &calls->items[i];
        if (tc->type != K3C_JSON_OBJECT) return k3c_errf(b->err, K3C_EINVAL, "%s: a tool call must be an object", w);
        const k3c_json *fn = call_function(tc);
        const k3c_json *name = k3c_json_get(fn, "name");
        if (fn->type != K3C_JSON_OBJECT || !name || name->type != K3C_JSON_STRING || !name->len)
            return k3c_errf(b->err, K3C_EINVAL, "%s: a tool call needs a non-empty function.name", w);
        open_tag(b, "call");
        attr(b, "tool", name->string, name->len);
        attr_i(b, "index", (long)i + 1);
        open_done(b);
        k3c_json *args;
        const char *raw;
        size_t raw_len;
        int rc = call_arguments(b, k3c_json_get(fn, "arguments"), &args, &raw, &raw_len, w);
        if (rc) return rc;
        const k3c_json *obj = args ? args : k3c_json_get(fn, "arguments");
        if (raw) {
            open_tag(b, "json");
            attr_s(b, "type", "object");
            open_done(b);
            rc = append_text(b, raw, raw_len, w);
            close_tag(b, "json");
        } else if (obj && obj->type == K3C_JSON_OBJECT) {
            k3c_sbuf v;
            k3c_sbuf_init(&v);
            for (size_t k = 0; k < obj->n && !rc; k++) {
                const k3c_json *val = &obj->items[k];
                open_tag(b, "argument");
                attr_s(b, "key", obj->keys[k]);
                attr_s(b, "type", xtml_type(val));
                open_done(b);
                /* Strings raw (the type attribute already says so), the rest as Python's json.dumps writes them. */
                if (val->type == K3C_JSON_STRING) {
                    rc = append_text(b, val->string, val->len, w);
                } else {
                    v.len = 0;
                    k3c_sbuf_json_value(&v, val, K3C_JSON_W_SPACED);
                    rc = append_text(b, v.buf, v.len, w);
                }
                close_tag(b, "argument");
            }
            k3c_sbuf_free(&v);
        }
        k3c_json_free(args);
        if (rc) return rc;
        close_tag(b, "call");
    }
    close_tag(b, "tools");
    return K3C_OK;
}

static int xtml_assistant(builder *b, const k3c_json *m, int thinking, const char *what) {
    char w[160];
    /* With thinking on the think channel is structural (present even when empty); with it off, absent. */
    if (thinking) {
        const k3c_json *r = k3c_json_get(m, "reasoning_content");
        if (!truthy(r)) r = k3c_json_get(m, "reasoning");
        open_tag(b, "think");
        open_done(b);
        if (r && r->type != K3C_JSON_NULL) {
            k3c_sbuf t;
            k3c_sbuf_init(&t);
            snprintf(w, sizeof w, "%s.reasoning_content", what);
            int rc = py_str(b, r, &t, w);
            if (!rc && !py_blank(t.buf ? t.buf : "", t.len)) rc = append_text(b, t.buf, t.len, w);
            k3c_sbuf_free(&t);
            if (rc) return rc;
        }
        close_tag(b, "think");
    }
    open_tag(b, "response");
    open_done(b);
    int rc = content(b, k3c_json_get(m, "content"), what);
    if (rc) return rc;
    close_tag(b, "response");
    const k3c_json *calls = k3c_json_get(m, "tool_calls");
    if (truthy(calls)) {
        if (calls->type != K3C_JSON_ARRAY)
            return k3c_errf(b->err, K3C_EINVAL, "%s.tool_calls: expected an array", what);
        rc = xtml_tool_calls(b, calls, what);
    }
    return rc;
}

/* ---------------------------------------------------------------- tool-result ordering */

/* One message as rendered: the original object, and for a tool result re-bound to its call, that call's name. */
typedef struct {
    const k3c_json *m;
    const k3c_json *tool; /* overrides the message's own tool/name when non-NULL */
} msg_ref;

/* str(v) for ids (strings and numbers), else 0. */
static int id_str(const k3c_json *v, char *buf, size_t n) {
    if (!v) return 0;
    if (v->type == K3C_JSON_STRING)
        snprintf(buf, n, "%s", v->string);
    else if (v->type == K3C_JSON_NUMBER && v->is_integer)
        snprintf(buf, n, "%lld", (long long)v->integer);
    else
        return 0;
    return 1;
}

/* The 1-based position of the call with this id among the assistant's tool_calls (first occurrence), and its
 * function name; 0 if none. Every entry advances the position, even one without an id. */
static size_t call_position(const k3c_json *calls, const char *id, const k3c_json **name) {
    char buf[512];
    if (!calls || calls->type != K3C_JSON_ARRAY) return 0;
    for (size_t i = 0; i < calls->n; i++) {
        const k3c_json *tc = &calls->items[i];
        if (tc->type != K3C_JSON_OBJECT || !id_str(k3c_json_get(tc, "id"), buf, sizeof buf)) continue;
        if (strcmp(buf, id)) continue;
        const k3c_json *f = k3c_json_get(tc, "function");
        *name = (f && f->type == K3C_JSON_OBJECT) ? k3c_json_get(f, "name") : k3c_json_get(tc, "name");
        if (*name && (*name)->type == K3C_JSON_NULL) *name = NULL;
        return i + 1;
    }
    return 0;
}

static int role_is(const k3c_json *m, const char *role) {
    const k3c_json *r = k3c_json_get(m, "role");
    return r && r->type == K3C_JSON_STRING && !strcmp(r->string, role);
}

/* XTML binds tool results to calls by position, OpenAI clients by tool_call_id: each run of consecutive tool messages
 * is sorted into the order of the preceding assistant's tool_calls (stable), and each takes its call's name. A run
 * with any message that cannot be matched is left as it is. */
static void order_tool_results(const k3c_json *messages, msg_ref *out) {
    const k3c_json *calls = NULL;
    size_t i = 0, n = messages->n;
    while (i < n) {
        const k3c_json *m = &messages->items[i];
        if (role_is(m, "assistant")) calls = k3c_json_get(m, "tool_calls");
        if (!role_is(m, "tool")) {
            out[i] = (msg_ref){m, NULL};
            i++;
            continue;
        }
        size_t j = i, unresolved = 0;
        while (j < n && role_is(&messages->items[j], "tool")) j++;
        size_t *pos = calloc(j - i, sizeof *pos);
        const k3c_json **names = calloc(j - i, sizeof *names);
        for (size_t k = i; k < j; k++) {
            const k3c_json *tm = &messages->items[k];
            const k3c_json *id = k3c_json_get(tm, "tool_call_id");
            if (!id) id = k3c_json_get(tm, "id");
            char buf[512];
            if (!pos || !names || !id_str(id, buf, sizeof buf) ||
                !(pos[k - i] = call_position(calls, buf, &names[k - i])))
                unresolved = 1;
        }
        for (size_t k = i; k < j; k++) out[k] = (msg_ref){&messages->items[k], NULL};
        if (!unresolved) {
            /* insertion sort by position: stable, runs are short */
            for (size_t k = 0; k < j - i; k++) {
                size_t p = pos[k];
                const k3c_json *nm = names[k], *mm = &messages->items[i + k];
                size_t q = k;
                while (q > 0 && pos[q - 1] > p) {
                    pos[q] = pos[q - 1];
                    names[q] = names[q - 1];
                    out[i + q] = out[i + q - 1];
                    q--;
                }
                pos[q] = p;
                names[q] = nm;
                out[i + q] = (msg_ref){mm, nm};
            }
        }
        free(pos);
        free(names);
        i = j;
    }
}

/* ---------------------------------------------------------------- options */

typedef struct {
    k3c_chat_format format;
    int add_generation_prompt, thinking;
    const char *thinking_effort, *tool_choice, *default_system;
    const k3c_json *response_format, *response_schema, *image_prompts;
} render_opts;

static int opt_bool(const k3c_json *v, const char *key, int *out, k3c_err *err) {
    if (v->type != K3C_JSON_BOOL) return k3c_errf(err, K3C_EINVAL, "options.%s: expected true or false", key);
    *out = v->boolean;
    return K3C_OK;
}

static int read_opts(const k3c_json *o, render_opts *r, k3c_err *err) {
    *r = (render_opts){K3C_CHAT_XTML, 1, 1, NULL, NULL, NULL, NULL, NULL, NULL};
    if (!o || o->type == K3C_JSON_NULL) return K3C_OK;
    if (o->type != K3C_JSON_OBJECT) return k3c_errf(err, K3C_EINVAL, "options: expected an object");
    for (size_t i = 0; i < o->n; i++) {
        const char *k = o->keys[i];
        const k3c_json *v = &o->items[i];
        int rc = K3C_OK;
        if (!strcmp(k, "format")) {
            if (v->type != K3C_JSON_STRING || k3c_chat_format_parse(v->string, &r->format))
                rc = k3c_errf(err, K3C_EINVAL, "options.format: expected \"xtml\" or \"k2\"");
        } else if (!strcmp(k, "add_generation_prompt")) {
            rc = opt_bool(v, k, &r->add_generation_prompt, err);
        } else if (!strcmp(k, "thinking")) {
            rc = opt_bool(v, k, &r->thinking, err);
        } else if (!strcmp(k, "thinking_effort")) {
            if (v->type == K3C_JSON_NULL) continue;
            if (v->type != K3C_JSON_STRING)
                return k3c_errf(err, K3C_EINVAL, "options.thinking_effort: expected \"low\", \"high\" or \"max\"");
            r->thinking_effort = v->string;
        } else if (!strcmp(k, "tool_choice")) {
            r->tool_choice = v->type == K3C_JSON_STRING ? v->string : NULL; /* objects / "auto": no note, as upstream */
        } else if (!strcmp(k, "response_format")) {
            r->response_format = v->type == K3C_JSON_NULL ? NULL : v;
        } else if (!strcmp(k, "response_schema")) {
            r->response_schema = v->type == K3C_JSON_NULL ? NULL : v;
        } else if (!strcmp(k, "image_prompts")) {
            if (v->type == K3C_JSON_NULL) continue;
            if (v->type != K3C_JSON_ARRAY) return k3c_errf(err, K3C_EINVAL, "options.image_prompts: expected an array");
            for (size_t j = 0; j < v->n; j++)
                if (v->items[j].type != K3C_JSON_STRING)
                    return k3c_errf(err, K3C_EINVAL, "options.image_prompts[%zu]: expected a string", j);
            r->image_prompts = v;
        } else if (!strcmp(k, "default_system")) {
            if (v->type != K3C_JSON_STRING)
                return k3c_errf(err, K3C_EINVAL, "options.default_system: expected a string");
            r->default_system = v->string;
        } else {
            rc = k3c_errf(err, K3C_EINVAL, "options.%s: unknown option", k);
        }
        if (rc) return rc;
    }
    return K3C_OK;
}

/* The schema inside an OpenAI response_format: json_schema.schema, json_schema.json_schema, or json_schema itself. */
static const k3c_json *response_schema(const render_opts *o) {
    if (o->response_schema) return o->response_schema;
    const k3c_json *js = k3c_json_get(o->response_format, "json_schema");
    if (!js || js->type == K3C_JSON_NULL) return NULL;
    if (js->type != K3C_JSON_OBJECT) return js;
    const k3c_json *s = k3c_json_get(js, "schema");
    if (s) return s;
    s = k3c_json_get(js, "json_schema");
    return s ? s : js;
}

static const char *response_format_type(const render_opts *o) {
    const k3c_json *rf = o->response_format;
    if (!rf) return NULL;
    if (rf->type == K3C_JSON_STRING) return rf->string;
    const k3c_json *t = k3c_json_get(rf, "type");
    return t && t->type == K3C_JSON_STRING ? t->string : NULL;
}

/* ---------------------------------------------------------------- XTML */

static int xtml_message(builder *b, const msg_ref *ref, size_t i, const render_opts *o, const k3c_json **calls,
                        long *tool_index) {
    char w[64];
    snprintf(w, sizeof w, "messages[%zu]", i);
    const k3c_json *m = ref->m, *role = k3c_json_get(m, "role");
    /* The release's encoder passes over what it does not know: a message that is not an object, a role it has no
     * rendering for (the server maps OpenAI's "developer" to "system" before it gets here). */
    if (m->type != K3C_JSON_OBJECT) return K3C_OK;
    if (!role) return k3c_errf(b->err, K3C_EINVAL, "%s.role: missing", w);
    if (role->type != K3C_JSON_STRING) return K3C_OK;
    const char *r = role->string;
    const k3c_json *name = k3c_json_get(m, "name");
    int rc = K3C_OK;
    if (!strcmp(r, "system") && truthy(k3c_json_get(m, "tools"))) {
        tool_declare(b, k3c_json_get(m, "tools"), 1); /* lazily loaded tools announced mid-conversation */
        return K3C_OK;
    }
    if (!strcmp(r, "user") || !strcmp(r, "system") || !strcmp(r, "assistant")) {
        open_tag(b, "message");
        attr_s(b, "role", r);
        if (truthy(name) && (rc = attr_v(b, "name", name, w))) return rc;
        open_done(b);
        if (!strcmp(r, "assistant")) {
            *calls = k3c_json_get(m, "tool_calls");
            *tool_index = 0;
            rc = xtml_assistant(b, m, o->thinking, w);
        } else {
            rc = content(b, k3c_json_get(m, "content"), w);
        }
        if (rc) return rc;
        end_message(b);
        return K3C_OK;
    }
    if (!strcmp(r, "tool")) {
        ++*tool_index;
        const k3c_json *tn = ref->tool;
        if (!tn) tn = k3c_json_get(m, "tool");
        if (!tn && !ref->tool && !k3c_json_get(m, "tool")) tn = name;
        if (tn && tn->type == K3C_JSON_NULL) tn = NULL;
        /* No name: the call at the same position in the preceding assistant turn. */
        if (!tn && *calls && (*calls)->type == K3C_JSON_ARRAY && (size_t)*tool_index <= (*calls)->n) {
            const k3c_json *tc = &(*calls)->items[*tool_index - 1];
            tn = tc->type == K3C_JSON_OBJECT ? k3c_json_get(call_function(tc), "name") : NULL;
            if (tn && tn->type == K3C_JSON_NULL) tn = NULL;
        }
        if (!tn)
            return k3c_errf(b->err, K3C_EINVAL,
                            "%s: a tool result needs a tool name: carry \"tool\"/\"name\", a tool_call_id of the "
                            "preceding assistant's tool_calls, or follow it in call order",
                            w);
        open_tag(b, "message");
        attr_s(b, "role", "tool");
        if ((rc = attr_v(b, "tool", tn, w))) return rc;
        attr_i(b, "index", *tool_index);
        open_done(b);
        if ((rc = content(b, k3c_json_get(m, "content"), w))) return rc;
        end_message(b);
        return K3C_OK;
    }
    return K3C_OK;
}

static int render_xtml(builder *b, const k3c_json *messages, const k3c_json *tools, const render_opts *o) {
    if (truthy(tools)) tool_declare(b, tools, 0);
    if (o->thinking && o->thinking_effort) {
        const char *e = o->thinking_effort;
        /* The note names four values but the release's encoder accepts three: "medium" is refused there too. */
        if (strcmp(e, "low") && strcmp(e, "high") && strcmp(e, "max"))
            return k3c_errf(b->err, K3C_EINVAL,
                            "options.thinking_effort: unsupported value \"%s\" (supported: low, high, max)", e);
        char body[512];
        snprintf(body, sizeof body,
                 "`thinking_effort` guides on how much to think in your thinking channel (not including the response "
                 "channel), supported values include `low`, `medium`, `high`, and `max`.\n"
                 "Now the system is invoked with `thinking_effort=%s`.",
                 e);
        system_note(b, "thinking-effort", body);
    }
    msg_ref *refs = calloc(messages->n ? messages->n : 1, sizeof *refs);
    if (!refs) return k3c_errf(b->err, K3C_ENOMEM, "out of memory");
    order_tool_results(messages, refs);
    const k3c_json *calls = NULL;
    long tool_index = 0;
    int rc = K3C_OK;
    for (size_t i = 0; i < messages->n && !rc; i++) rc = xtml_message(b, &refs[i], i, o, &calls, &tool_index);
    free(refs);
    if (rc) return rc;
    /* One-shot options come after the history so a per-request change keeps the cached prefix valid. */
    if (o->tool_choice && !strcmp(o->tool_choice, "required"))
        system_note(b, "tool-choice",
                    "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.");
    else if (o->tool_choice && !strcmp(o->tool_choice, "none"))
        system_note(b, "tool-choice",
                    "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.");
    const char *rft = response_format_type(o);
    const char *raw_json = "The system is invoked with `response_format=%s`.\nYour response must be raw JSON data "
                           "without markdown code blocks (```json) or any additional formatting.";
    if (rft && !strcmp(rft, "json_object")) {
        char body[512];
        snprintf(body, sizeof body, raw_json, "json_object");
        system_note(b, "response-format", body);
    } else if (rft && !strcmp(rft, "json_schema")) {
        k3c_sbuf t;
        k3c_sbuf_init(&t);
        k3c_sbuf_printf(&t, raw_json, "json_schema");
        k3c_sbuf_printf(&t, "\nThe JSON data must match the following schema:\n```json\n");
        const k3c_json *s = response_schema(o);
        if (s)
            k3c_sbuf_json_value(&t, s, K3C_JSON_W_SORT_KEYS);
        else
            k3c_sbuf_append(&t, "null", 4);
        k3c_sbuf_append(&t, "\n```", 4);
        system_note(b, "response-format", t.buf ? t.buf : "");
        k3c_sbuf_free(&t);
    }
    if (o->add_generation_prompt) {
        /* The floor is handed over with an unclosed assistant message; the opened channel decides think-first. */
        open_tag(b, "message");
        attr_s(b, "role", "assistant");
        open_done(b);
        open_tag(b, o->thinking ? "think" : "response");
        open_done(b);
    }
    if (b->image_prompts && b->image_next != b->image_prompts->n)
        return k3c_errf(b->err, K3C_EINVAL, "options.image_prompts: %zu given but %zu images in the messages",
                        b->image_prompts->n, b->image_next);
    return K3C_OK;
}

/* ---------------------------------------------------------------- K2 envelope (Kimi Linear) */

static int k2_content(builder *b, const k3c_json *c, const char *what) {
    if (c && c->type == K3C_JSON_ARRAY)
        for (size_t i = 0; i < c->n; i++) {
            const k3c_json *t = k3c_json_get(&c->items[i], "type");
            if (t && t->type == K3C_JSON_STRING && strcmp(t->string, "text"))
                return k3c_errf(b->err, K3C_EUNSUPPORTED,
                                "%s.content[%zu]: \"%s\" parts are not supported by the k2 format", what, i, t->string);
        }
    return content(b, c, what);
}

static int render_k2(builder *b, const k3c_json *messages, const k3c_json *tools, const render_opts *o) {
    if (o->thinking_effort || o->tool_choice || o->response_format || o->response_schema || o->image_prompts)
        return k3c_errf(b->err, K3C_EUNSUPPORTED,
                        "options: thinking_effort, tool_choice, response_format, response_schema and image_prompts "
                        "are XTML (K3) options, not supported by the k2 format");
    if (truthy(tools)) {
        k3c_sbuf t;
        k3c_sbuf_init(&t);
        k3c_sbuf_json_value(&t, tools, 0); /* the template's tojson(separators=(',', ':')): document key order */
        mark(b, "<|im_system|>");
        text(b, "tool_declare");
        mark(b, "<|im_middle|>");
        seg(b, t.buf, t.len, 0);
        mark(b, "<|im_end|>");
        k3c_sbuf_free(&t);
    }
    char w[64];
    for (size_t i = 0; i < messages->n; i++) {
        const k3c_json *m = &messages->items[i], *role = k3c_json_get(m, "role");
        snprintf(w, sizeof w, "messages[%zu]", i);
        if (m->type != K3C_JSON_OBJECT) return k3c_errf(b->err, K3C_EINVAL, "%s: expected an object", w);
        if (!role || role->type != K3C_JSON_STRING)
            return k3c_errf(b->err, K3C_EINVAL, "%s.role: missing or not a string", w);
        const char *r = role->string;
        int is_user = !strcmp(r, "user"), is_asst = !strcmp(r, "assistant"), is_tool = !strcmp(r, "tool");
        if (!is_user && !is_asst && !is_tool && strcmp(r, "system"))
            return k3c_errf(b->err, K3C_EINVAL,
                            "%s.role: unknown role \"%s\" (expected system, user, assistant or tool)", w, r);
        if (i == 0 && strcmp(r, "system")) {
            mark(b, "<|im_system|>");
            text(b, "system");
            mark(b, "<|im_middle|>");
            text(b, o->default_system ? o->default_system : "You are a helpful assistant");
            mark(b, "<|im_end|>");
        }
        mark(b, is_user ? "<|im_user|>" : is_asst ? "<|im_assistant|>" : "<|im_system|>");
        const k3c_json *name = k3c_json_get(m, "name");
        int rc = K3C_OK;
        if (truthy(name))
            rc = append_value_text(b, name, w);
        else
            text(b, r);
        if (rc) return rc;
        mark(b, "<|im_middle|>");
        const k3c_json *calls = k3c_json_get(m, "tool_calls");
        if (is_asst && truthy(calls)) {
            if (calls->type != K3C_JSON_ARRAY)
                return k3c_errf(b->err, K3C_EINVAL, "%s.tool_calls: expected an array", w);
            if ((rc = k2_content(b, k3c_json_get(m, "content"), w))) return rc;
            mark(b, "<|tool_calls_section_begin|>");
            for (size_t k = 0; k < calls->n; k++) {
                char cw[128];
                snprintf(cw, sizeof cw, "%s.tool_calls[%zu]", w, k);
                const k3c_json *tc = &calls->items[k];
                const k3c_json *fn = tc->type == K3C_JSON_OBJECT ? call_function(tc) : NULL;
                const k3c_json *fname = fn ? k3c_json_get(fn, "name") : NULL;
                if (!fn || fn->type != K3C_JSON_OBJECT || !fname || fname->type != K3C_JSON_STRING || !fname->len)
                    return k3c_errf(b->err, K3C_EINVAL, "%s: a tool call needs a non-empty function.name", cw);
                mark(b, "<|tool_call_begin|>");
                const k3c_json *id = k3c_json_get(tc, "id");
                if (id && id->type == K3C_JSON_STRING && id->len) {
                    text(b, id->string);
                } else { /* K2's id convention: functions.{name}:{0-based index in the turn} */
                    k3c_sbuf t;
                    k3c_sbuf_init(&t);
                    k3c_sbuf_printf(&t, "functions.%s:%zu", fname->string, k);
                    seg(b, t.buf ? t.buf : "", t.len, 0);
                    k3c_sbuf_free(&t);
                }
                mark(b, "<|tool_call_argument_begin|>");
                const k3c_json *a = k3c_json_get(fn, "arguments");
                if (a && a->type == K3C_JSON_STRING) {
                    seg(b, a->string, a->len, 0);
                } else if (a) {
                    k3c_sbuf t;
                    k3c_sbuf_init(&t);
                    k3c_sbuf_json_value(&t, a, K3C_JSON_W_SPACED);
                    seg(b, t.buf, t.len, 0);
                    k3c_sbuf_free(&t);
                } else {
                    text(b, "{}");
                }
                mark(b, "<|tool_call_end|>");
            }
            mark(b, "<|tool_calls_section_end|>");
        } else if (is_tool) {
            const k3c_json *id = k3c_json_get(m, "tool_call_id");
            k3c_sbuf t;
            k3c_sbuf_init(&t);
            k3c_sbuf_append(&t, "## Return of ", 13);
            if (id) rc = py_str(b, id, &t, w);
            k3c_sbuf_append(&t, "\n", 1);
            if (!rc) seg(b, t.buf, t.len, 0);
            k3c_sbuf_free(&t);
            if (!rc) rc = k2_content(b, k3c_json_get(m, "content"), w);
        } else {
            rc = k2_content(b, k3c_json_get(m, "content"), w);
        }
        if (rc) return rc;
        mark(b, "<|im_end|>");
    }
    if (o->add_generation_prompt) {
        mark(b, "<|im_assistant|>");
        text(b, "assistant");
        mark(b, "<|im_middle|>");
    }
    return K3C_OK;
}

/* ---------------------------------------------------------------- entry point */

int k3c_chat_render(const k3c_json *messages, const k3c_json *tools, const k3c_json *options, k3c_chat_prompt *out,
                    k3c_err *err) {
    *out = (k3c_chat_prompt){0};
    if (!messages || messages->type != K3C_JSON_ARRAY)
        return k3c_errf(err, K3C_EINVAL, "messages: expected an array of message objects");
    /* A mapping of name to tool is declared as it stands, as the release's encoder does. */
    if (tools && tools->type != K3C_JSON_NULL && tools->type != K3C_JSON_ARRAY && tools->type != K3C_JSON_OBJECT)
        return k3c_errf(err, K3C_EINVAL,
                        "tools: expected an array of tool objects, a mapping of name to tool, or null");
    render_opts o;
    int rc = read_opts(options, &o, err);
    if (rc) return rc;
    builder b = {.err = err, .image_prompts = o.image_prompts};
    k3c_sbuf_init(&b.text);
    rc = o.format == K3C_CHAT_K2 ? render_k2(&b, messages, tools, &o) : render_xtml(&b, messages, tools, &o);
    if (!rc && (b.nomem || !b.text.ok)) rc = k3c_errf(err, K3C_ENOMEM, "out of memory rendering the prompt");
    if (rc) {
        k3c_sbuf_free(&b.text);
        free(b.segs);
        return rc;
    }
    if (!b.text.buf) k3c_sbuf_append(&b.text, "", 0);
    out->text = b.text.buf ? b.text.buf : calloc(1, 1);
    out->len = b.text.len;
    out->segs = b.segs;
    out->nseg = b.nseg;
    return K3C_OK;
}

void k3c_chat_prompt_free(k3c_chat_prompt *p) {
    if (!p) return;
    free(p->text);
    free(p->segs);
    *p = (k3c_chat_prompt){0};
}
