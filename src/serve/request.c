/* request.c — validating OpenAI-style request bodies (request.h): every known field is type- and range-checked
 * (unknown fields are ignored, as OpenAI-compatible servers do), the prompt is rendered and tokenized, and its length
 * is checked against the context; errors carry the parameter's name. */
#include "serve/request.h"

#include "tok/tok.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Drops a character that a length limit cut in two from the end of str (at most 3 bytes of an incomplete sequence). */
static void utf8_cut(char *str) {
    size_t n = strlen(str), k = n;
    while (k > 0 && n - k < 4 && ((unsigned char)str[k - 1] & 0xc0) == 0x80) k--;
    if (k > 0 && (unsigned char)str[k - 1] >= 0xc0 && !k3c_utf8_valid(str + k - 1, n - k + 1)) str[k - 1] = '\0';
}

int k3c_api_fail(k3c_api_error *e, int status, const char *type, const char *code, const char *param, const char *fmt,
                 ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    if (len >= (int)sizeof e->message) utf8_cut(e->message); /* a quoted value cut inside a character */
    return status;
}

#define BAD_TYPE(e, key, want)                                                                                         \
    k3c_api_fail(e, 400, "invalid_request_error", "invalid_type", key, "'%s' must be %s", key, want)
#define BAD_VALUE(e, key, ...) k3c_api_fail(e, 400, "invalid_request_error", "invalid_value", key, __VA_ARGS__)

/* A field that is absent or null counts as not given. */
static const k3c_json *field(const k3c_json *o, const char *key) {
    const k3c_json *v = k3c_json_get(o, key);
    return v && v->type != K3C_JSON_NULL ? v : NULL;
}

/* Number field in [lo, hi]; *out unchanged when absent. */
static int num_in(const k3c_json *o, const char *key, double lo, double hi, double *out, k3c_api_error *e) {
    const k3c_json *v = field(o, key);
    if (!v) return 0;
    if (v->type != K3C_JSON_NUMBER) return BAD_TYPE(e, key, "a number");
    if (!(v->number >= lo && v->number <= hi))
        return BAD_VALUE(e, key, "'%s' must be in [%g, %g] (got %g)", key, lo, hi, v->number);
    *out = v->number;
    return 0;
}

static int int_in(const k3c_json *o, const char *key, int64_t lo, int64_t hi, int64_t *out, int *given,
                  k3c_api_error *e) {
    const k3c_json *v = field(o, key);
    if (given) *given = v != NULL;
    if (!v) return 0;
    if (v->type != K3C_JSON_NUMBER || !v->is_integer) return BAD_TYPE(e, key, "an integer");
    if (v->integer < lo || v->integer > hi)
        return BAD_VALUE(e, key, "'%s' must be in [%lld, %lld] (got %lld)", key, (long long)lo, (long long)hi,
                         (long long)v->integer);
    *out = v->integer;
    return 0;
}

static int bool_field(const k3c_json *o, const char *key, int *out, k3c_api_error *e) {
    const k3c_json *v = field(o, key);
    if (!v) return 0;
    if (v->type != K3C_JSON_BOOL) return BAD_TYPE(e, key, "a boolean");
    *out = v->boolean;
    return 0;
}

static int str_field(const k3c_json *o, const char *key, const char **out, k3c_api_error *e) {
    const k3c_json *v = field(o, key);
    if (!v) return 0;
    if (v->type != K3C_JSON_STRING) return BAD_TYPE(e, key, "a string");
    *out = v->string;
    return 0;
}

/* stop: a string or an array of at most 4 non-empty strings (OpenAI's limit). */
static int read_stop(const k3c_json *o, k3c_api_req *r, k3c_api_error *e) {
    const k3c_json *v = field(o, "stop");
    if (!v) return 0;
    const k3c_json *items = v->type == K3C_JSON_ARRAY ? v->items : v;
    size_t n = v->type == K3C_JSON_ARRAY ? v->n : 1;
    if (v->type != K3C_JSON_ARRAY && v->type != K3C_JSON_STRING)
        return BAD_TYPE(e, "stop", "a string or an array of strings");
    if (n > 4) return BAD_VALUE(e, "stop", "'stop' takes at most 4 strings (got %zu)", n);
    for (size_t i = 0; i < n; i++) {
        if (items[i].type != K3C_JSON_STRING) return BAD_TYPE(e, "stop", "a string or an array of strings");
        if (items[i].len == 0 || strlen(items[i].string) != items[i].len)
            return BAD_VALUE(e, "stop", "stop strings must be non-empty and contain no NUL");
        r->stop[r->nstop++] = items[i].string;
    }
    return 0;
}

/* The fields chat and completions share: model, n, stream, sampling, stop. */
static int read_common(const k3c_json *o, const k3c_api_limits *lim, k3c_api_req *r, int64_t *max_tokens,
                       int *max_given, k3c_api_error *e) {
    const char *model = NULL;
    int rc = str_field(o, "model", &model, e);
    if (rc) return rc;
    if (model && strcmp(model, lim->model_name))
        return k3c_api_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                            "The model '%s' does not exist (this server serves '%s')", model, lim->model_name);
    int64_t n = 1, seed = -1, top_k = 0, top_logprobs = 0;
    int seed_given = 0, mt2 = 0;
    k3c_sampler *p = &r->gen.sampler;
    const k3c_json *so = field(o, "stream_options");
    if ((rc = int_in(o, "n", 1, K3C_API_MAX_N, &n, NULL, e)) || (rc = bool_field(o, "stream", &r->stream, e)) ||
        (rc = num_in(o, "temperature", 0, 2, &p->temperature, e)) || (rc = num_in(o, "top_p", 0, 1, &p->top_p, e)) ||
        (rc = num_in(o, "min_p", 0, 1, &p->min_p, e)) || (rc = int_in(o, "top_k", -1, 1 << 30, &top_k, NULL, e)) ||
        (rc = num_in(o, "presence_penalty", -2, 2, &p->presence_penalty, e)) ||
        (rc = num_in(o, "frequency_penalty", -2, 2, &p->frequency_penalty, e)) ||
        (rc = num_in(o, "repetition_penalty", 1e-3, 10, &p->repetition_penalty, e)) ||
        (rc = int_in(o, "seed", INT64_MIN, INT64_MAX, &seed, &seed_given, e)) ||
        (rc = int_in(o, "top_logprobs", 0, 20, &top_logprobs, NULL, e)) ||
        (rc = int_in(o, "max_tokens", 1, INT64_MAX, max_tokens, max_given, e)) ||
        (rc = int_in(o, "max_completion_tokens", 1, INT64_MAX, max_tokens, &mt2, e)) || (rc = read_stop(o, r, e)))
        return rc;
    if (p->top_p == 0) return BAD_VALUE(e, "top_p", "'top_p' must be in (0, 1] (got 0)");
    *max_given |= mt2;
    p->top_k = top_k < 0 ? 0 : top_k;
    p->logprobs = (int)top_logprobs;
    p->seed = seed_given ? (uint64_t)seed : (uint64_t)(k3c_now() * 1e9);
    r->n = (int)n;
    if (so && so->type != K3C_JSON_OBJECT) return BAD_TYPE(e, "stream_options", "an object");
    if (so && !r->stream)
        return BAD_VALUE(e, "stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (so && (rc = bool_field(so, "include_usage", &r->include_usage, e))) return rc;
    return 0;
}

/* Ids must name tokens of both the model and the tokenizer. */
static int check_ids(const k3c_json *a, const char *key, const k3c_api_limits *lim, k3c_tok_ids *out,
                     k3c_api_error *e) {
    for (size_t i = 0; i < a->n; i++) {
        const k3c_json *v = &a->items[i];
        if (v->type != K3C_JSON_NUMBER || !v->is_integer) return BAD_TYPE(e, key, "an array of integer token ids");
        const unsigned char *b;
        size_t nb;
        if (v->integer < 0 || v->integer >= lim->n_vocab ||
            k3c_tok_token_bytes(lim->tok, (int32_t)v->integer, &b, &nb, NULL))
            return BAD_VALUE(e, key, "token id %lld at position %zu is not in the vocabulary (0..%lld)",
                             (long long)v->integer, i, (long long)lim->n_vocab - 1);
        if (k3c_tok_ids_push(out, (int32_t)v->integer))
            return k3c_api_fail(e, 500, "server_error", NULL, "", "out of memory");
    }
    return 0;
}

/* Completion budget: an explicit max_tokens must fit the context; otherwise what the context leaves (both capped). */
static int budget(k3c_api_req *r, const k3c_api_limits *lim, int64_t max_tokens, int max_given, const char *what,
                  k3c_api_error *e) {
    int64_t np = (int64_t)r->prompt.n, room = lim->max_context - np;
    if (np == 0) return BAD_VALUE(e, what, "the prompt is empty");
    for (int64_t i = 0; i < np;
         i++) /* a tokenizer larger than the model's vocabulary: the server's setup, not the client */
        if (r->prompt.ids[i] >= lim->n_vocab)
            return k3c_api_fail(e, 500, "server_error", NULL, what,
                                "the prompt encodes to token id %d at position %lld, outside the model's vocabulary "
                                "of %lld ids (tokenizer and model disagree)",
                                r->prompt.ids[i], (long long)i, (long long)lim->n_vocab);
    if (room < 1 || (max_given && max_tokens > room))
        return k3c_api_fail(e, 400, "invalid_request_error", "context_length_exceeded", what,
                            "This model's maximum context length is %lld tokens; the prompt has %lld tokens%s",
                            (long long)lim->max_context, (long long)np,
                            max_given ? " and the completion asks for more than the rest" : "");
    r->gen.max_new = max_given ? max_tokens : room;
    if (r->gen.max_new > lim->max_tokens_cap) r->gen.max_new = lim->max_tokens_cap;
    return 0;
}

/* The render options of a chat request: thinking (extension, also inside chat_template_kwargs), thinking / reasoning
 * effort, tool_choice and response_format (XTML only), as a JSON object text. */
static int chat_options(const k3c_json *o, const k3c_api_limits *lim, const char *images, k3c_sbuf *s, int *thinking,
                        k3c_api_error *e) {
    const k3c_json *kw = field(o, "chat_template_kwargs");
    if (kw && kw->type != K3C_JSON_OBJECT) return BAD_TYPE(e, "chat_template_kwargs", "an object");
    int rc = bool_field(o, "thinking", thinking, e);
    if (!rc && kw) rc = bool_field(kw, "thinking", thinking, e);
    const char *effort = NULL;
    if (!rc) rc = str_field(o, "reasoning_effort", &effort, e);
    if (!rc) rc = str_field(o, "thinking_effort", &effort, e);
    if (rc) return rc;
    const k3c_json *tc = field(o, "tool_choice"), *rf = field(o, "response_format");
    if (tc && tc->type != K3C_JSON_STRING && tc->type != K3C_JSON_OBJECT)
        return BAD_TYPE(e, "tool_choice", "a string or an object");
    if (tc && tc->type == K3C_JSON_STRING && strcmp(tc->string, "none") && strcmp(tc->string, "auto") &&
        strcmp(tc->string, "required"))
        return BAD_VALUE(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or an object");
    if (rf && rf->type != K3C_JSON_OBJECT) return BAD_TYPE(e, "response_format", "an object");
    int xtml = lim->format == K3C_CHAT_XTML;
    k3c_sbuf_printf(s, "{\"format\":\"%s\",\"thinking\":%s", xtml ? "xtml" : "k2", *thinking ? "true" : "false");
    if (xtml && effort) {
        k3c_sbuf_append(s, ",\"thinking_effort\":", 19);
        k3c_sbuf_json_string(s, effort, strlen(effort));
    }
    if (xtml && tc && tc->type == K3C_JSON_STRING) k3c_sbuf_printf(s, ",\"tool_choice\":\"%s\"", tc->string);
    if (xtml && rf) {
        const k3c_json *t = k3c_json_get(rf, "type");
        if (!(t && t->type == K3C_JSON_STRING && !strcmp(t->string, "text"))) {
            k3c_sbuf_append(s, ",\"response_format\":", 19);
            k3c_sbuf_json_value(s, rf, 0);
        }
    }
    if (images) k3c_sbuf_printf(s, ",\"image_prompts\":%s", images);
    k3c_sbuf_append(s, "}", 1);
    return s->ok ? 0 : k3c_api_fail(e, 500, "server_error", NULL, "", "out of memory");
}

/* The tool tool_choice names ({"type": "function", "function": {"name": N}}), which must be one of tools. */
static int named_tool(const k3c_json *tc, const k3c_json *tools, const char **name, k3c_api_error *e) {
    const k3c_json *ty = k3c_json_get(tc, "type"), *fn = k3c_json_get(tc, "function");
    const k3c_json *n = fn && fn->type == K3C_JSON_OBJECT ? k3c_json_get(fn, "name") : NULL;
    if (!ty || ty->type != K3C_JSON_STRING || strcmp(ty->string, "function") || !n || n->type != K3C_JSON_STRING)
        return BAD_VALUE(e, "tool_choice",
                         "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    for (size_t i = 0; tools && i < tools->n; i++) {
        const k3c_json *t = &tools->items[i], *f = k3c_json_get(t, "function");
        const k3c_json *tn = k3c_json_get(f && f->type == K3C_JSON_OBJECT ? f : t, "name");
        if (tn && tn->type == K3C_JSON_STRING && !strcmp(tn->string, n->string)) return *name = n->string, 0;
    }
    return BAD_VALUE(e, "tool_choice", "'tool_choice' names the function '%.100s', which is not in 'tools'",
                     n->string);
}

/* response_format and tool_choice as what the answer must be (constrained decoding, docs/SERVING.md "Constrained
 * decoding"): a schema outside the supported subset is refused, never served unconstrained. */
static int read_constraint(const k3c_json *o, const k3c_api_limits *lim, int thinking, k3c_api_req *r,
                           k3c_api_error *e) {
    const k3c_json *rf = field(o, "response_format"), *tc = field(o, "tool_choice"), *tools = field(o, "tools");
    k3c_cchat sp = {.format = lim->format, .thinking = thinking, .tools = tools, .one_call = r->one_call};
    if (rf) {
        const k3c_json *t = k3c_json_get(rf, "type"), *js = field(rf, "json_schema");
        const char *ty = t && t->type == K3C_JSON_STRING ? t->string : "";
        if (strcmp(ty, "text") && strcmp(ty, "json_object") && strcmp(ty, "json_schema"))
            return BAD_VALUE(e, "response_format",
                             "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
        if (!strcmp(ty, "json_schema") && (!js || js->type != K3C_JSON_OBJECT))
            return BAD_TYPE(e, "response_format", "an object with 'json_schema' an object for type json_schema");
        sp.json = strcmp(ty, "text") != 0;
        sp.schema = js ? field(js, "schema") : NULL;
        if (sp.schema && sp.schema->type != K3C_JSON_OBJECT && sp.schema->type != K3C_JSON_BOOL)
            return BAD_TYPE(e, "response_format", "'response_format.json_schema.schema' must be an object");
    }
    if (tc && r->has_tools) {
        if (tc->type == K3C_JSON_OBJECT) {
            int rc = named_tool(tc, tools, &sp.tool_name, e);
            if (rc) return rc;
            sp.tools_mode = K3C_CTOOLS_NAMED;
        } else {
            sp.tools_mode = !strcmp(tc->string, "required") ? K3C_CTOOLS_REQUIRED
                            : !strcmp(tc->string, "none")   ? K3C_CTOOLS_NONE
                                                            : K3C_CTOOLS_ANY;
        }
    } else if (tc && (tc->type == K3C_JSON_OBJECT || !strcmp(tc->string, "required"))) {
        return BAD_VALUE(e, "tool_choice", "'tool_choice' asks for a tool call but the request has no 'tools'");
    }
    /* the K2 envelope's tool-call section has no grammar: a forced call would go unenforced, so it is refused */
    if (lim->format == K3C_CHAT_K2 && sp.tools_mode >= K3C_CTOOLS_REQUIRED)
        return BAD_VALUE(e, "tool_choice",
                         "'tool_choice' \"required\" or a named function is enforced for XTML (Kimi K3) models only; "
                         "this model's chat format is K2: use \"auto\"");
    char path[256];
    k3c_err err = {0};
    int rc = k3c_cgrammar_chat(lim->tok, r->trie, &sp, &r->grammar, path, sizeof path, &err);
    if (rc == K3C_EUNSUPPORTED)
        return k3c_api_fail(e, 400, "invalid_request_error", "unsupported_schema",
                            sp.tools_mode >= K3C_CTOOLS_REQUIRED && !sp.json ? "tools" : "response_format",
                            "%s%s (constrained decoding supports type, properties, required, additionalProperties "
                            "false, items, enum, const, anyOf with distinct first characters and $ref to $defs)",
                            path[0] || !sp.json ? "" : "response_format.json_schema.schema: ", err.msg);
    if (rc == K3C_ENOMEM) return k3c_api_fail(e, 500, "server_error", NULL, "", "out of memory");
    if (rc) return BAD_VALUE(e, sp.json ? "response_format" : "tool_choice", "%s", err.msg);
    return 0;
}

/* Every message is an object with a known role; OpenAI's "developer" (system instructions for current models) is
 * read as "system", which is what the chat formats have. The role is rewritten in the request's own tree. */
static int check_roles(k3c_json *msgs, k3c_api_error *e) {
    static const char *const known[] = {"system", "user", "assistant", "tool"};
    for (size_t i = 0; i < msgs->n; i++) {
        k3c_json *m = &msgs->items[i], *role = NULL;
        if (m->type != K3C_JSON_OBJECT) return BAD_TYPE(e, "messages", "an array of objects");
        for (size_t k = 0; k < m->n; k++)
            if (!strcmp(m->keys[k], "role")) role = &m->items[k];
        if (!role)
            return k3c_api_fail(e, 400, "invalid_request_error", "missing_required_parameter", "messages",
                                "'messages[%zu].role' is missing", i);
        if (role->type != K3C_JSON_STRING)
            return BAD_TYPE(e, "messages", "an array of messages whose role is a string");
        if (!strcmp(role->string, "developer")) {
            char *sys = strdup("system");
            if (!sys) return k3c_api_fail(e, 500, "server_error", NULL, "", "out of memory");
            free(role->string);
            role->string = sys;
            role->len = strlen(sys);
        }
        int ok = 0;
        for (size_t k = 0; k < sizeof known / sizeof *known; k++) ok |= !strcmp(role->string, known[k]);
        if (!ok)
            return BAD_VALUE(e, "messages",
                             "'messages[%zu].role' is '%s'; supported roles are system, developer, user, assistant "
                             "and tool",
                             i, role->string);
    }
    return 0;
}

static int parse_chat(const k3c_json *o, const k3c_api_limits *lim, k3c_api_req *r, k3c_api_error *e) {
    const k3c_json *msgs = field(o, "messages"), *tools = field(o, "tools");
    if (!msgs)
        return k3c_api_fail(e, 400, "invalid_request_error", "missing_required_parameter", "messages",
                            "Missing required parameter: 'messages'");
    if (msgs->type != K3C_JSON_ARRAY) return BAD_TYPE(e, "messages", "an array");
    if (msgs->n == 0) return BAD_VALUE(e, "messages", "'messages' must not be empty");
    int rc = check_roles((k3c_json *)msgs, e); /* msgs lies in r->root, which the request owns */
    if (rc) return rc;
    if (tools && tools->type != K3C_JSON_ARRAY) return BAD_TYPE(e, "tools", "an array");
    r->has_tools = tools && tools->n > 0;
    int thinking = lim->format == K3C_CHAT_XTML && !lim->thinking_off, logprobs = 0, parallel = 1;
    k3c_sbuf opts, images;
    k3c_sbuf_init(&opts);
    k3c_sbuf_init(&images);
    rc = bool_field(o, "logprobs", &logprobs, e);
    if (!rc) rc = bool_field(o, "parallel_tool_calls", &parallel, e);
    r->one_call = !parallel;
    int n_img = rc ? 0 : k3c_api_images(msgs, lim, r, &images, e);
    if (n_img >= 400) rc = n_img;
    if (!rc) rc = chat_options(o, lim, n_img ? images.buf : NULL, &opts, &thinking, e);
    r->logprobs = logprobs;
    if (!rc && r->gen.sampler.logprobs && !logprobs)
        rc = BAD_VALUE(e, "top_logprobs", "'top_logprobs' needs 'logprobs' to be true");
    k3c_json *oj = NULL;
    k3c_err err = {0};
    k3c_chat_prompt pr = {0};
    if (!rc && k3c_json_parse(opts.buf, opts.len, "options", &oj, &err))
        rc = k3c_api_fail(e, 500, "server_error", NULL, "", "%s", err.msg);
    if (!rc && k3c_chat_render(msgs, tools, oj, &pr, &err)) rc = BAD_VALUE(e, "messages", "%s", err.msg);
    k3c_tok_segment *segs = rc ? NULL : calloc(pr.nseg ? pr.nseg : 1, sizeof *segs);
    if (!rc && !segs) rc = k3c_api_fail(e, 500, "server_error", NULL, "", "out of memory");
    for (size_t i = 0; !rc && i < pr.nseg; i++)
        segs[i] = (k3c_tok_segment){pr.text + pr.segs[i].off, pr.segs[i].len, pr.segs[i].markup};
    if (!rc && k3c_tok_encode_segments(lim->tok, segs, pr.nseg, &r->prompt, NULL, &err))
        rc = BAD_VALUE(e, "messages", "%s", err.msg);
    if (!rc) rc = k3c_api_image_rows(lim, r, e);
    if (!rc) {
        /* the channel the generation prompt opened: XTML's think (thinking on) or response, K2's <think> if it ends
         * there; output that does not fit it is recovered, never passed on as markup */
        int xtml = lim->format == K3C_CHAT_XTML;
        r->parse = (k3c_chat_parse_opts){lim->format, 0, 0, 0};
        r->parse.in_think = xtml ? thinking : pr.len >= 7 && !memcmp(pr.text + pr.len - 7, "<think>", 7);
        r->parse.in_response = xtml && !thinking;
        rc = read_constraint(o, lim, xtml ? thinking : 0, r, e);
    }
    free(segs);
    k3c_chat_prompt_free(&pr);
    k3c_json_free(oj);
    k3c_sbuf_free(&opts);
    k3c_sbuf_free(&images);
    return rc;
}

/* prompt: a string, an array of ids, or a one-element array of either (batches of prompts are not served). */
static int parse_completion(const k3c_json *o, const k3c_api_limits *lim, k3c_api_req *r, k3c_api_error *e) {
    const k3c_json *p = field(o, "prompt");
    int64_t logprobs = 0;
    int rc = int_in(o, "logprobs", 0, 5, &logprobs, NULL, e);
    if (rc) return rc;
    r->logprobs = logprobs > 0;
    r->gen.sampler.logprobs = (int)logprobs;
    if (!p)
        return k3c_api_fail(e, 400, "invalid_request_error", "missing_required_parameter", "prompt",
                            "Missing required parameter: 'prompt'");
    if (p->type == K3C_JSON_ARRAY && p->n == 1 &&
        (p->items[0].type == K3C_JSON_STRING || p->items[0].type == K3C_JSON_ARRAY))
        p = &p->items[0];
    if (p->type == K3C_JSON_STRING) {
        k3c_err err = {0};
        if (k3c_tok_encode(lim->tok, p->string, p->len, 0, &r->prompt, &err))
            return BAD_VALUE(e, "prompt", "%s", err.msg);
        return 0;
    }
    if (p->type != K3C_JSON_ARRAY) return BAD_TYPE(e, "prompt", "a string or an array of token ids");
    if (p->n && p->items[0].type != K3C_JSON_NUMBER)
        return BAD_VALUE(e, "prompt", "only one prompt per request is served");
    return check_ids(p, "prompt", lim, &r->prompt, e);
}

/* /tokenize: {"prompt" | "content": text}; /detokenize: {"tokens": [ids]}. */
static int parse_tokenize(const k3c_json *o, const k3c_api_limits *lim, k3c_api_req *r, k3c_api_error *e) {
    const k3c_json *p = field(o, "prompt");
    if (!p) p = field(o, "content");
    if (!p)
        return k3c_api_fail(e, 400, "invalid_request_error", "missing_required_parameter", "prompt",
                            "Missing required parameter: 'prompt'");
    if (p->type != K3C_JSON_STRING) return BAD_TYPE(e, "prompt", "a string");
    int special = 0, rc = bool_field(o, "add_special", &special, e);
    k3c_err err = {0};
    if (!rc && k3c_tok_encode(lim->tok, p->string, p->len, special ? K3C_TOK_ALLOW_SPECIAL : 0, &r->prompt, &err))
        rc = BAD_VALUE(e, "prompt", "%s", err.msg);
    return rc;
}

static int parse_detokenize(const k3c_json *o, const k3c_api_limits *lim, k3c_api_req *r, k3c_api_error *e) {
    const k3c_json *t = field(o, "tokens");
    if (!t)
        return k3c_api_fail(e, 400, "invalid_request_error", "missing_required_parameter", "tokens",
                            "Missing required parameter: 'tokens'");
    if (t->type != K3C_JSON_ARRAY) return BAD_TYPE(e, "tokens", "an array of integer token ids");
    int rc = check_ids(t, "tokens", lim, &r->prompt, e);
    k3c_err err = {0};
    if (!rc && k3c_tok_decode(lim->tok, r->prompt.ids, r->prompt.n, &r->text, &r->text_len, &err))
        rc = BAD_VALUE(e, "tokens", "%s", err.msg);
    return rc;
}

int k3c_api_parse(k3c_api_kind kind, const char *body, size_t n, const k3c_api_limits *lim, k3c_api_req *r,
                  k3c_api_error *e) {
    return k3c_api_parse_trie(kind, body, n, lim, NULL, r, e);
}

int k3c_api_parse_trie(k3c_api_kind kind, const char *body, size_t n, const k3c_api_limits *lim,
                       const k3c_vtrie *trie, k3c_api_req *r, k3c_api_error *e) {
    memset(r, 0, sizeof *r);
    r->trie = trie;
    r->kind = kind;
    r->n = 1;
    r->gen.sampler = (k3c_sampler){.temperature = 1, .top_p = 1, .repetition_penalty = 1};
    k3c_err err = {0};
    if (k3c_json_parse(body, n, "body", &r->root, &err))
        return k3c_api_fail(e, 400, "invalid_request_error", "invalid_json", "",
                            "We could not parse the JSON body of your request (%s)", err.msg);
    if (r->root->type != K3C_JSON_OBJECT)
        return k3c_api_fail(e, 400, "invalid_request_error", "invalid_json", "",
                            "The request body must be a JSON object");
    const k3c_json *o = r->root;
    if (kind == K3C_API_TOKENIZE) return parse_tokenize(o, lim, r, e);
    if (kind == K3C_API_DETOKENIZE) return parse_detokenize(o, lim, r, e);
    int64_t max_tokens = 0;
    int max_given = 0;
    int rc = read_common(o, lim, r, &max_tokens, &max_given, e);
    if (!rc) rc = kind == K3C_API_CHAT ? parse_chat(o, lim, r, e) : parse_completion(o, lim, r, e);
    if (!rc) rc = budget(r, lim, max_tokens, max_given, kind == K3C_API_CHAT ? "messages" : "prompt", e);
    if (!rc && r->grammar && k3c_cgrammar_min_tokens(r->grammar) > r->gen.max_new)
        rc = BAD_VALUE(e, "max_tokens",
                       "the shortest answer that response_format / tool_choice allow takes %lld tokens; the "
                       "completion may take %lld",
                       (long long)k3c_cgrammar_min_tokens(r->grammar), (long long)r->gen.max_new);
    r->gen.n_embeds = r->n_embeds, r->gen.embed_pos = r->embed_pos, r->gen.embeds = r->embeds;
    return rc;
}

void k3c_api_req_free(k3c_api_req *r) {
    k3c_json_free(r->root);
    k3c_cgrammar_free(r->grammar);
    k3c_tok_ids_free(&r->prompt);
    free(r->text);
    free(r->embeds);
    free(r->embed_pos);
    memset(r, 0, sizeof *r);
}
