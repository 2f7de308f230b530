/* traj.c — SFT trajectories: conversations validated, rendered through XTML / K2, tokenized segment by segment with a
 * loss mask from the segments' roles, read from JSONL (bad lines reported and skipped) and packed. TRAINING.md §5.3. */
#include "post/post.h"

#include "tok/tok.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- masks from segments */

static int seg_is(const k3c_chat_prompt *p, size_t i, int markup, const char *s) {
    const k3c_chat_segment *g = &p->segs[i];
    return g->markup == markup && g->len == strlen(s) && !memcmp(p->text + g->off, s, g->len);
}

/* XTML: a message header runs from the markup <|open|> + "message" to the next markup <|sep|>; its role is the text
 * segment after ` role` `="`. */
static void mask_xtml(const k3c_chat_prompt *p, uint8_t *mask) {
    size_t i = 0;
    while (i < p->nseg) {
        mask[i] = 0;
        if (!(seg_is(p, i, 1, "<|open|>") && i + 1 < p->nseg && seg_is(p, i + 1, 0, "message"))) {
            i++;
            continue;
        }
        int assistant = 0;
        size_t j = i + 1;
        for (; j < p->nseg && !seg_is(p, j, 1, "<|sep|>"); j++) {
            mask[j] = 0;
            if (j + 2 < p->nseg && seg_is(p, j, 0, " role") && seg_is(p, j + 1, 0, "=\""))
                assistant = seg_is(p, j + 2, 0, "assistant");
        }
        if (j < p->nseg) mask[j++] = 0;
        if (!assistant) {
            i = j;
            continue;
        }
        /* The first channel's opening is part of the generation prompt (the model starts inside it). */
        for (int k = 0; k < 3 && j < p->nseg; k++) mask[j++] = 0;
        for (; j < p->nseg; j++) {
            mask[j] = 1;
            if (seg_is(p, j, 1, "<|end_of_msg|>")) {
                j++;
                break;
            }
        }
        i = j;
    }
}

static void mask_k2(const k3c_chat_prompt *p, uint8_t *mask) {
    size_t i = 0;
    while (i < p->nseg) {
        mask[i] = 0;
        if (!seg_is(p, i, 1, "<|im_assistant|>")) {
            i++;
            continue;
        }
        size_t j = i + 1;
        for (; j < p->nseg && !seg_is(p, j, 1, "<|im_middle|>"); j++) mask[j] = 0;
        if (j < p->nseg) mask[j++] = 0;
        for (; j < p->nseg; j++) {
            mask[j] = 1;
            if (seg_is(p, j, 1, "<|im_end|>")) {
                j++;
                break;
            }
        }
        i = j;
    }
}

void k3c_traj_segment_mask(const k3c_chat_prompt *p, k3c_chat_format fmt, uint8_t *mask) {
    if (fmt == K3C_CHAT_K2)
        mask_k2(p, mask);
    else
        mask_xtml(p, mask);
}

/* ---------------------------------------------------------------- validation */

static int nonempty(const k3c_json *v) {
    if (!v || v->type == K3C_JSON_NULL) return 0;
    if (v->type == K3C_JSON_STRING || v->type == K3C_JSON_ARRAY)
        return v->type == K3C_JSON_STRING ? v->len > 0 : v->n > 0;
    return 1;
}

static int check_call(const k3c_json *tc, const char *w, k3c_err *err) {
    if (tc->type != K3C_JSON_OBJECT) return k3c_errf(err, K3C_EINVAL, "%s: expected an object", w);
    const k3c_json *fn = k3c_json_get(tc, "function");
    if (!fn) fn = tc;
    const k3c_json *name = k3c_json_get(fn, "name"), *args = k3c_json_get(fn, "arguments");
    if (fn->type != K3C_JSON_OBJECT || !name || name->type != K3C_JSON_STRING || !name->len)
        return k3c_errf(err, K3C_EINVAL, "%s.function.name: missing or not a non-empty string", w);
    if (!args || args->type == K3C_JSON_OBJECT) return K3C_OK;
    if (args->type != K3C_JSON_STRING)
        return k3c_errf(err, K3C_EINVAL, "%s.function.arguments: expected a JSON object or its text, got %s", w,
                        k3c_json_type_name(args));
    k3c_json *a = NULL;
    k3c_err e2 = {0};
    int rc = k3c_json_parse(args->string, args->len, "arguments", &a, &e2);
    int obj = !rc && a->type == K3C_JSON_OBJECT;
    k3c_json_free(a);
    if (!obj)
        return k3c_errf(err, K3C_EINVAL, "%s.function.arguments: not a JSON object (%s)", w,
                        rc ? e2.msg : "another JSON value");
    return K3C_OK;
}

/* Roles, required fields, tool calls whose arguments are JSON objects, tool results after a call, and at least one
 * assistant turn (otherwise there is nothing to train on). */
static int validate_messages(const k3c_json *msgs, k3c_err *err) {
    if (!msgs || msgs->type != K3C_JSON_ARRAY || !msgs->n)
        return k3c_errf(err, K3C_EINVAL, "messages: expected a non-empty array of message objects");
    int assistants = 0, calls_seen = 0;
    char w[96];
    for (size_t i = 0; i < msgs->n; i++) {
        const k3c_json *m = &msgs->items[i];
        snprintf(w, sizeof w, "messages[%zu]", i);
        if (m->type != K3C_JSON_OBJECT) return k3c_errf(err, K3C_EINVAL, "%s: expected an object", w);
        const k3c_json *role = k3c_json_get(m, "role");
        if (!role || role->type != K3C_JSON_STRING) return k3c_errf(err, K3C_EINVAL, "%s.role: missing", w);
        const char *r = role->string;
        const k3c_json *content = k3c_json_get(m, "content");
        if (!strcmp(r, "assistant")) {
            const k3c_json *calls = k3c_json_get(m, "tool_calls");
            if (nonempty(calls)) {
                if (calls->type != K3C_JSON_ARRAY)
                    return k3c_errf(err, K3C_EINVAL, "%s.tool_calls: expected an array", w);
                for (size_t k = 0; k < calls->n; k++) {
                    char cw[160];
                    snprintf(cw, sizeof cw, "%s.tool_calls[%zu]", w, k);
                    int rc = check_call(&calls->items[k], cw, err);
                    if (rc) return rc;
                }
                calls_seen = 1;
            } else if (!nonempty(content) && !nonempty(k3c_json_get(m, "reasoning_content")) &&
                       !nonempty(k3c_json_get(m, "reasoning"))) {
                return k3c_errf(err, K3C_EINVAL, "%s: an assistant message needs content, reasoning or tool_calls", w);
            }
            assistants++;
        } else if (!strcmp(r, "tool")) {
            if (!calls_seen) return k3c_errf(err, K3C_EINVAL, "%s: a tool result before any assistant tool call", w);
            if (!content) return k3c_errf(err, K3C_EINVAL, "%s.content: missing", w);
        } else if (!strcmp(r, "system") || !strcmp(r, "user") || !strcmp(r, "state")) {
            if (!content && !(strcmp(r, "system") == 0 && k3c_json_get(m, "tools")))
                return k3c_errf(err, K3C_EINVAL, "%s.content: missing", w);
        } else {
            return k3c_errf(err, K3C_EINVAL,
                            "%s.role: unknown role \"%s\" (expected system, user, assistant, tool or state)", w, r);
        }
    }
    if (!assistants) return k3c_errf(err, K3C_EINVAL, "messages: no assistant message, nothing to train on");
    return K3C_OK;
}

/* ---------------------------------------------------------------- rendering with a mask */

/* Shallow JSON views (items copied by value, owned by the original document): free only the arrays. */
typedef struct {
    k3c_json msgs, opts;
    k3c_json *state_objs;
    k3c_json fmt, yes, no;
} views;

static void views_free(views *v) {
    if (v->state_objs)
        for (size_t i = 0; i < v->msgs.n; i++) {
            free(v->state_objs[i].items);
            free(v->state_objs[i].keys);
        }
    free(v->state_objs);
    free(v->msgs.items);
    free(v->opts.items);
    free(v->opts.keys);
}

static int build_views(const k3c_json *msgs, const k3c_json *opts, const k3c_traj_opts *o, views *v, k3c_err *err) {
    *v = (views){0};
    v->fmt = (k3c_json){.type = K3C_JSON_STRING, .string = o->format == K3C_CHAT_K2 ? "k2" : "xtml"};
    v->fmt.len = strlen(v->fmt.string);
    v->yes = (k3c_json){.type = K3C_JSON_BOOL, .boolean = o->thinking};
    v->no = (k3c_json){.type = K3C_JSON_BOOL, .boolean = 0};
    size_t nopt = opts ? opts->n : 0;
    v->msgs = (k3c_json){.type = K3C_JSON_ARRAY, .n = msgs->n, .items = calloc(msgs->n, sizeof(k3c_json))};
    v->state_objs = calloc(msgs->n, sizeof(k3c_json));
    v->opts = (k3c_json){
        .type = K3C_JSON_OBJECT, .items = calloc(nopt + 3, sizeof(k3c_json)), .keys = calloc(nopt + 3, sizeof(char *))};
    if (!v->msgs.items || !v->state_objs || !v->opts.items || !v->opts.keys) {
        views_free(v);
        return k3c_errf(err, K3C_ENOMEM, "out of memory");
    }
    int has_thinking = 0;
    for (size_t i = 0; i < nopt; i++) {
        const char *k = opts->keys[i];
        if (!strcmp(k, "format") || !strcmp(k, "add_generation_prompt")) {
            views_free(v);
            return k3c_errf(err, K3C_EINVAL, "options.%s: set by the run for every trajectory, not per line", k);
        }
        has_thinking |= !strcmp(k, "thinking");
        v->opts.keys[v->opts.n] = opts->keys[i];
        v->opts.items[v->opts.n++] = opts->items[i];
    }
    v->opts.keys[v->opts.n] = "format";
    v->opts.items[v->opts.n++] = v->fmt;
    v->opts.keys[v->opts.n] = "add_generation_prompt";
    v->opts.items[v->opts.n++] = v->no;
    if (!has_thinking && o->format != K3C_CHAT_K2) {
        v->opts.keys[v->opts.n] = "thinking";
        v->opts.items[v->opts.n++] = v->yes;
    }
    static char *state_keys[] = {"role", "name", "content"};
    static k3c_json sys = {.type = K3C_JSON_STRING, .string = "system", .len = 6};
    static k3c_json state = {.type = K3C_JSON_STRING, .string = "state", .len = 5};
    for (size_t i = 0; i < msgs->n; i++) {
        const k3c_json *m = &msgs->items[i], *role = k3c_json_get(m, "role");
        if (strcmp(role->string, "state")) {
            v->msgs.items[i] = *m;
            continue;
        }
        /* A state snapshot is context the model reads: a system message named "state" (masked like any system). */
        k3c_json *s = &v->state_objs[i];
        *s = (k3c_json){
            .type = K3C_JSON_OBJECT, .n = 3, .items = calloc(3, sizeof(k3c_json)), .keys = malloc(sizeof state_keys)};
        if (!s->items || !s->keys) {
            views_free(v);
            return k3c_errf(err, K3C_ENOMEM, "out of memory");
        }
        memcpy(s->keys, state_keys, sizeof state_keys);
        s->items[0] = sys;
        s->items[1] = state;
        s->items[2] = *k3c_json_get(m, "content");
        v->msgs.items[i] = *s;
    }
    return K3C_OK;
}

/* Tokenizes each segment on its own; every markup segment must give special tokens only (a tokenizer without the
 * chat specials would spell them out as text and train on garbage). */
static int encode_masked(const k3c_tok *tok, const k3c_chat_prompt *p, const uint8_t *segmask, k3c_traj *out,
                         k3c_err *err) {
    k3c_tok_segment *segs = calloc(p->nseg ? p->nseg : 1, sizeof *segs);
    size_t *end = calloc(p->nseg ? p->nseg : 1, sizeof *end);
    k3c_tok_ids ids = {0};
    int rc = !segs || !end ? k3c_errf(err, K3C_ENOMEM, "out of memory") : K3C_OK;
    for (size_t i = 0; !rc && i < p->nseg; i++)
        segs[i] = (k3c_tok_segment){p->text + p->segs[i].off, p->segs[i].len, p->segs[i].markup};
    if (!rc) rc = k3c_tok_encode_segments(tok, segs, p->nseg, &ids, end, err);
    if (!rc && !(out->mask = malloc(ids.n ? ids.n : 1))) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    for (size_t i = 0, t = 0; !rc && i < p->nseg; i++)
        for (; t < end[i]; t++) {
            if (p->segs[i].markup && !k3c_tok_is_special(tok, ids.ids[t])) {
                rc = k3c_errf(err, K3C_EINVAL, "the tokenizer has no special token for the markup \"%.*s\"",
                              (int)p->segs[i].len, p->text + p->segs[i].off);
                break;
            }
            out->mask[t] = segmask[i];
        }
    free(segs);
    free(end);
    if (rc) {
        free(out->mask);
        out->mask = NULL;
        k3c_tok_ids_free(&ids);
        return rc;
    }
    out->ids = ids.ids;
    out->n = (int64_t)ids.n;
    return K3C_OK;
}

int k3c_traj_from_json(const k3c_json *obj, const k3c_tok *tok, const k3c_traj_opts *o, k3c_traj *out, k3c_err *err) {
    *out = (k3c_traj){0};
    if (!obj || obj->type != K3C_JSON_OBJECT) return k3c_errf(err, K3C_EINVAL, "expected a JSON object");
    for (size_t i = 0; i < obj->n; i++) {
        const char *k = obj->keys[i];
        if (strcmp(k, "messages") && strcmp(k, "tools") && strcmp(k, "options") && strcmp(k, "id") && strcmp(k, "meta"))
            return k3c_errf(err, K3C_EINVAL, "%s: unknown field (expected messages, tools, options, id, meta)", k);
    }
    const k3c_json *msgs = k3c_json_get(obj, "messages"), *opts = k3c_json_get(obj, "options");
    int rc = validate_messages(msgs, err);
    if (rc) return rc;
    if (opts && opts->type != K3C_JSON_OBJECT) return k3c_errf(err, K3C_EINVAL, "options: expected an object");
    views v;
    if ((rc = build_views(msgs, opts, o, &v, err))) return rc;
    k3c_chat_prompt p;
    rc = k3c_chat_render(&v.msgs, k3c_json_get(obj, "tools"), &v.opts, &p, err);
    views_free(&v);
    if (rc) return rc;
    uint8_t *segmask = malloc(p.nseg ? p.nseg : 1);
    if (!segmask) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    if (!rc) {
        k3c_traj_segment_mask(&p, o->format == K3C_CHAT_K2 ? K3C_CHAT_K2 : K3C_CHAT_XTML, segmask);
        rc = encode_masked(tok, &p, segmask, out, err);
    }
    free(segmask);
    k3c_chat_prompt_free(&p);
    if (!rc && o->max_tokens > 0 && out->n > o->max_tokens) {
        rc = k3c_errf(err, K3C_EINVAL, "messages: %lld tokens, more than max_tokens %lld", (long long)out->n,
                      (long long)o->max_tokens);
        k3c_traj_free(out);
    }
    return rc;
}

void k3c_traj_free(k3c_traj *t) {
    if (!t) return;
    free(t->ids);
    free(t->mask);
    *t = (k3c_traj){0};
}

/* ---------------------------------------------------------------- JSONL */

static void report(k3c_traj_set *s, const char *path, int64_t line, const char *msg) {
    k3c_sbuf b = {.buf = s->report, .len = s->report_len, .cap = s->report_len, .ok = 1};
    if (!b.buf) k3c_sbuf_init(&b);
    k3c_sbuf_printf(&b, "%s:%lld: %s\n", path, (long long)line, msg);
    s->report = b.buf;
    s->report_len = b.len;
    s->bad++;
}

static int push(k3c_traj_set *s, const k3c_traj *t) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        k3c_traj *it = realloc(s->items, cap * sizeof *it);
        if (!it) return K3C_ENOMEM;
        s->items = it;
        s->cap = cap;
    }
    s->items[s->n++] = *t;
    return K3C_OK;
}

static void one_line(k3c_traj_set *s, const char *path, int64_t ln, const char *line, size_t len, const k3c_tok *tok,
                     const k3c_traj_opts *o) {
    k3c_err e = {0};
    k3c_json *j = NULL;
    char msg[1200];
    if (k3c_json_parse(line, len, "column", &j, &e)) {
        /* The parser names "column:1:COL" for a one-line text: keep the column. */
        const char *c = strncmp(e.msg, "column:1:", 9) ? e.msg : e.msg + 9;
        snprintf(msg, sizeof msg, "invalid JSON at column %s", c);
        report(s, path, ln, msg);
        return;
    }
    k3c_traj t;
    if (k3c_traj_from_json(j, tok, o, &t, &e)) {
        report(s, path, ln, e.msg);
    } else {
        t.line = ln;
        if (push(s, &t)) {
            k3c_traj_free(&t);
            report(s, path, ln, "out of memory");
        }
    }
    k3c_json_free(j);
}

int k3c_traj_load_jsonl(const char *path, const k3c_tok *tok, const k3c_traj_opts *o, k3c_traj_set *out, k3c_err *err) {
    *out = (k3c_traj_set){0};
    char *data = NULL;
    size_t n = 0;
    int rc = k3c_read_file(path, &data, &n, err);
    if (rc) return rc;
    int64_t ln = 0;
    for (size_t at = 0; at < n;) {
        const char *line = data + at, *nl = memchr(line, '\n', n - at);
        size_t len = nl ? (size_t)(nl - line) : n - at;
        at += len + 1;
        ln++;
        size_t k = 0;
        while (k < len && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r')) k++;
        if (k == len) continue;
        out->lines++;
        one_line(out, path, ln, line, len, tok, o);
    }
    free(data);
    if (!out->n) {
        rc = k3c_errf(err, K3C_EINVAL, "%s: no usable trajectory (%lld lines, %lld refused)%s%.600s", path,
                      (long long)out->lines, (long long)out->bad, out->report ? "; first: " : "",
                      out->report ? out->report : "");
        k3c_traj_set_free(out);
    }
    return rc;
}

void k3c_traj_set_free(k3c_traj_set *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) k3c_traj_free(&s->items[i]);
    free(s->items);
    free(s->report);
    *s = (k3c_traj_set){0};
}

/* ---------------------------------------------------------------- packing */

static int packed_reserve(k3c_packed *p, int64_t T, int docs) {
    if (T > p->cap) {
        int32_t *a = realloc(p->ids, T * sizeof *a), *b = a ? realloc(p->targets, T * sizeof *b) : NULL;
        if (a) p->ids = a;
        if (b) p->targets = b;
        if (!a || !b) return K3C_ENOMEM;
        p->cap = T;
    }
    if (docs + 1 > p->cap_docs) {
        int32_t *c = realloc(p->cu_seqlens, (docs + 1) * sizeof *c);
        if (!c) return K3C_ENOMEM;
        p->cu_seqlens = c;
        p->cap_docs = docs + 1;
    }
    return K3C_OK;
}

int k3c_traj_pack(const k3c_traj *t, size_t n, size_t *next, int64_t seq_len, k3c_packed *out, k3c_err *err) {
    if (!n) return k3c_errf(err, K3C_EINVAL, "packing: no trajectories");
    if (packed_reserve(out, seq_len, 1)) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    out->T = 0;
    out->n_docs = 0;
    out->n_counted = 0;
    out->cu_seqlens[0] = 0;
    size_t i = *next % n;
    if (t[i].n > seq_len)
        return k3c_errf(err, K3C_EINVAL, "trajectory %zu (line %lld): %lld tokens do not fit seq_len %lld", i,
                        (long long)t[i].line, (long long)t[i].n, (long long)seq_len);
    /* Each trajectory at most once per batch, so a short set never repeats within one sequence. */
    for (size_t used = 0; used < n && out->T + t[i].n <= seq_len; used++) {
        if (packed_reserve(out, seq_len, out->n_docs + 1)) return k3c_errf(err, K3C_ENOMEM, "out of memory");
        const k3c_traj *x = &t[i];
        for (int64_t k = 0; k < x->n; k++) {
            out->ids[out->T + k] = x->ids[k];
            int counted = k + 1 < x->n && x->mask[k + 1];
            out->targets[out->T + k] = counted ? x->ids[k + 1] : -1;
            out->n_counted += counted;
        }
        out->T += x->n;
        out->cu_seqlens[++out->n_docs] = (int32_t)out->T;
        i = (i + 1) % n;
    }
    *next = i;
    return K3C_OK;
}

void k3c_packed_free(k3c_packed *p) {
    if (!p) return;
    free(p->ids);
    free(p->targets);
    free(p->cu_seqlens);
    *p = (k3c_packed){0};
}
