/* test_constrain.c — constrained decoding (serve/constrain.h): the schema automaton accepts and refuses strings per
 * schema, unsupported keywords are named, the chat answers (think channel, JSON response, forced / named / banned tool
 * calls) accept and refuse markup, the trie mask equals the mask that tries every id on random walks (the test
 * vocabulary and the K3 tokenizer's), and 200 answers sampled at temperature 1 through the engine on a tiny random
 * model all parse and validate against their schema (an independent validator below). */
#include "test.h"

#include "serve_fixture.h"
#include "serve/constrain.h"

#include <math.h>

static k3c_tok *g_tok;

/* ---------------------------------------------------------------- an independent validator of the schema subset */
static int valid(const k3c_json *s, const k3c_json *v) {
    const k3c_json *t = k3c_json_get(s, "type"), *en = k3c_json_get(s, "enum"), *any = k3c_json_get(s, "anyOf");
    if (en) {
        for (size_t i = 0; i < en->n; i++) {
            k3c_sbuf a, b;
            k3c_sbuf_init(&a), k3c_sbuf_init(&b);
            k3c_sbuf_json_value(&a, &en->items[i], 0), k3c_sbuf_json_value(&b, v, 0);
            int eq = a.len == b.len && !memcmp(a.buf, b.buf, a.len);
            k3c_sbuf_free(&a), k3c_sbuf_free(&b);
            if (eq) return 1;
        }
        return 0;
    }
    if (any) {
        for (size_t i = 0; i < any->n; i++)
            if (valid(&any->items[i], v)) return 1;
        return 0;
    }
    if (!t) return 1;
    const char *ty = t->string;
    if (!strcmp(ty, "string")) return v->type == K3C_JSON_STRING;
    if (!strcmp(ty, "number")) return v->type == K3C_JSON_NUMBER;
    if (!strcmp(ty, "integer")) return v->type == K3C_JSON_NUMBER && v->is_integer;
    if (!strcmp(ty, "boolean")) return v->type == K3C_JSON_BOOL;
    if (!strcmp(ty, "null")) return v->type == K3C_JSON_NULL;
    if (!strcmp(ty, "array")) {
        if (v->type != K3C_JSON_ARRAY) return 0;
        for (size_t i = 0; i < v->n; i++)
            if (!valid(k3c_json_get(s, "items"), &v->items[i])) return 0;
        return 1;
    }
    if (v->type != K3C_JSON_OBJECT) return 0;
    const k3c_json *props = k3c_json_get(s, "properties"), *req = k3c_json_get(s, "required");
    for (size_t i = 0; req && i < req->n; i++)
        if (!k3c_json_get(v, req->items[i].string)) return 0;
    for (size_t i = 0; props && i < v->n; i++) {
        const k3c_json *ps = k3c_json_get(props, v->keys[i]);
        if (!ps || !valid(ps, &v->items[i])) return 0;
    }
    return 1;
}

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"score\":{\"type\":\"number\"},\"ok\":{\"type\":\"boolean\"},\"tags\":{\"type\":\"array\",\"items\":"
    "{\"type\":\"string\",\"enum\":[\"a\",\"ab\",\"b\"]}},\"note\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":"
    "\"null\"}]},\"opt\":{\"type\":\"integer\"},\"sub\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":"
    "\"number\"}},\"required\":[\"x\"],\"additionalProperties\":false}},"
    "\"required\":[\"name\",\"age\",\"score\",\"ok\",\"tags\",\"note\",\"sub\"],\"additionalProperties\":false}";

static k3c_json *parse(const char *s) {
    k3c_json *j = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_json_parse(s, strlen(s), "test", &j, &err), &err);
    return j;
}

static int feeds(const k3c_cgrammar *g, const char *s) {
    k3c_constraint *c = NULL;
    k3c_err err = {0};
    if (k3c_constraint_new(g, 0, &c, &err)) return -1;
    int ok = k3c_constraint_feed(c, s, strlen(s));
    c->release(c->ctx);
    return ok;
}

static void test_automaton(void) {
    k3c_json *s = parse(SCHEMA);
    k3c_cgrammar *g = NULL;
    k3c_err err = {0};
    char path[256];
    CHECK_OK(k3c_cgrammar_new(g_tok, NULL, s, "", "<|end_of_msg|>", 0, &g, path, sizeof path, &err), &err);
    const char *good[] = {"{\"name\":\"A\\u00e9 \\\"q\\\" \xc3\xa9\",\"age\":-12,\"score\":1.5e+3,\"ok\":true,"
                          "\"tags\":[\"ab\",\"a\"],\"note\":null,\"sub\":{\"x\":0}}",
                          "{\"name\":\"\",\"age\":0,\"score\":-0.25,\"ok\":false,\"tags\":[],\"note\":\"n\",\"opt\":3,"
                          "\"sub\":{\"x\":2E5}}"};
    const char *bad[] = {"{\"age\":1}",                        /* out of order / missing */
                         "{\"name\":\"a<|b\"",                 /* a marker spelled inside text */
                         "{\"name\":\"\x01\"",                 /* raw control character */
                         "{\"name\":\"\xc3\x28\"",             /* broken UTF-8 */
                         "{\"name\":\"a\",\"age\":01",         /* leading zero */
                         "{\"name\":\"a\",\"age\":1.5",        /* not an integer */
                         "{\"name\":\"a\",\"age\":1,\"score\":1,\"ok\":true,\"tags\":[\"c\"", /* not in the enum */
                         "{\"name\":\"a\",\"age\":1,\"score\":1,\"ok\":true,\"tags\":[],\"note\":null,\"sub\":{}",
                         "{\"name\":\"a\", \"age\":1"};        /* compact: no spaces */
    for (size_t i = 0; i < 2; i++) CHECK(feeds(g, good[i]) == 1, "schema accepts good[%zu]", i);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CHECK(feeds(g, bad[i]) == 0, "schema refuses bad[%zu]", i);
    CHECK(k3c_cgrammar_min_tokens(g) > 40, "min tokens %lld", (long long)k3c_cgrammar_min_tokens(g));
    k3c_cgrammar_free(g);
    k3c_json_free(s);
    /* json_object, spaced separators */
    CHECK_OK(k3c_cgrammar_new(g_tok, NULL, NULL, "", "<|end_of_msg|>", 1, &g, path, sizeof path, &err), &err);
    CHECK(feeds(g, "{\"a\": [1, {\"b\": null}], \"c\": \"d\"}") == 1, "json_object accepts a spaced object");
    CHECK(feeds(g, "{\"a\":1}") == 0, "spaced refuses compact");
    CHECK(feeds(g, "[1]") == 0, "json_object refuses an array");
    k3c_cgrammar_free(g);
    /* unsupported keywords are named with their path */
    static const char *const unsup[][2] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"x\"}}}", "/properties/a/pattern"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}}}",
         "/properties/a/anyOf/1"},
        {"{\"type\":\"array\",\"minItems\":2}", "/minItems"}};
    for (size_t i = 0; i < 3; i++) {
        k3c_json *u = parse(unsup[i][0]);
        int rc = k3c_cgrammar_new(g_tok, NULL, u, "", "", 0, &g, path, sizeof path, &err);
        CHECK(rc == K3C_EUNSUPPORTED && !strcmp(path, unsup[i][1]), "unsupported %zu: rc %d path '%s' (%s)", i, rc,
              path, err.msg);
        k3c_json_free(u);
    }
}

/* The mask against brute force: every allowed id's bytes are accepted from the state, every refused one not. */
static void test_mask(k3c_cgrammar *g, int64_t V) {
    k3c_constraint *c = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_constraint_new(g, 0, &c, &err), &err);
    float *l = malloc(sizeof(float) * (size_t)V);
    for (int64_t i = 0; i < V; i++) l[i] = 0;
    CHECK_OK(c->mask(c->ctx, l, V, 1000), &err);
    int64_t bad = 0, n_ok = 0;
    for (int32_t id = 0; id < V; id++) {
        k3c_constraint *d = NULL;
        k3c_constraint_new(g, 0, &d, &err);
        int ok = d->accept(d->ctx, id) == 0;
        bad += ok != (l[id] == 0);
        n_ok += ok;
        d->release(d->ctx);
    }
    CHECK(bad == 0 && n_ok > 0, "mask equals per-token acceptance (%lld differ, %lld allowed)", (long long)bad,
          (long long)n_ok);
    free(l);
    c->release(c->ctx);
}

/* Encodes markup text (specials allowed) and feeds its ids: 1 when all are taken and the answer is complete. */
static int accepts(const k3c_tok *tok, const k3c_cgrammar *g, const char *text) {
    k3c_tok_ids ids = {0};
    k3c_err err = {0};
    k3c_constraint *c = NULL;
    CHECK_OK(k3c_tok_encode(tok, text, strlen(text), K3C_TOK_ALLOW_SPECIAL, &ids, &err), &err);
    CHECK_OK(k3c_constraint_new(g, 0, &c, &err), &err);
    int ok = 1;
    for (size_t i = 0; ok && i < ids.n; i++) ok = c->accept(c->ctx, ids.ids[i]) == 0;
    ok = ok && k3c_constraint_done(c);
    c->release(c->ctx);
    k3c_tok_ids_free(&ids);
    return ok;
}

#define TOOLS                                                                                                          \
    "[{\"type\":\"function\",\"function\":{\"name\":\"calc\",\"parameters\":{\"type\":\"object\",\"properties\":"      \
    "{\"expression\":{\"type\":\"string\"}},\"required\":[\"expression\"]}}},{\"type\":\"function\",\"function\":"     \
    "{\"name\":\"calculator\",\"parameters\":{\"type\":\"object\",\"properties\":{\"w\":{\"enum\":[1,2]},"           \
    "\"x\":{\"type\":\"string\",\"pattern\":\"a\"}}}}}]"
#define END "<|close|>message<|sep|><|end_of_msg|>"
#define CALL(name, k, args)                                                                                            \
    "<|open|>call tool=\"" name "\" index=\"" #k "\"<|sep|><|open|>json type=\"object\"<|sep|>" args                  \
    "<|close|>json<|sep|><|close|>call<|sep|>"
#define TOOLS_OPEN "<|close|>response<|sep|><|open|>tools<|sep|>"
#define TOOLS_END "<|close|>tools<|sep|>" END

static k3c_cgrammar *chat_grammar(const k3c_tok *tok, const k3c_vtrie *trie, const k3c_cchat *sp) {
    k3c_cgrammar *g = NULL;
    k3c_err err = {0};
    char path[128];
    CHECK_OK(k3c_cgrammar_chat(tok, trie, sp, &g, path, sizeof path, &err), &err);
    return g;
}

static void test_chat(void) {
    k3c_json *tools = parse(TOOLS), *schema = parse("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                                                    "\"required\":[\"a\"]}");
    k3c_cchat sp = {.format = K3C_CHAT_XTML, .thinking = 1, .json = 1, .schema = schema};
    k3c_cgrammar *g = chat_grammar(g_tok, NULL, &sp);
    const char *think = "I think 東京<|close|>think<|sep|><|open|>response<|sep|>";
    char t[1024];
    snprintf(t, sizeof t, "%s{\"a\": 12}<|close|>response<|sep|>" END, think);
    CHECK(g && accepts(g_tok, g, t), "thinking + json_schema accepts: %s", t);
    CHECK(g && !accepts(g_tok, g, "{\"a\": 12}<|close|>response<|sep|>" END), "thinking: the think channel comes first");
    snprintf(t, sizeof t, "%s{\"a\": \"x\"}<|close|>response<|sep|>" END, think);
    CHECK(g && !accepts(g_tok, g, t), "thinking + json_schema refuses a string for an integer");
    CHECK(g && !accepts(g_tok, g, "a<|b<|close|>think<|sep|><|open|>response<|sep|>{\"a\": 1}<|close|>response<|sep|>" END),
          "think text never spells a marker");
    k3c_cgrammar_free(g);
    sp = (k3c_cchat){.format = K3C_CHAT_XTML, .tools_mode = K3C_CTOOLS_REQUIRED, .tools = tools};
    g = chat_grammar(g_tok, NULL, &sp);
    CHECK(g && accepts(g_tok, g, TOOLS_OPEN CALL("calc", 1, "{\"expression\": \"6 * 7\"}") TOOLS_END),
          "required: one call of calc with its schema");
    CHECK(g && accepts(g_tok, g, TOOLS_OPEN CALL("calculator", 1, "{\"y\": [1]}") TOOLS_END),
          "required: a tool whose schema is outside the subset takes any object");
    CHECK(g && accepts(g_tok, g, TOOLS_OPEN CALL("calc", 1, "{\"expression\": \"1\"}")
                                     CALL("calculator", 2, "{}") TOOLS_END),
          "required: parallel calls, indexed");
    CHECK(g && !accepts(g_tok, g, TOOLS_OPEN CALL("calc", 1, "{}") TOOLS_END), "required: calc needs expression");
    CHECK(g && !accepts(g_tok, g, TOOLS_OPEN CALL("other", 1, "{}") TOOLS_END), "required: an unknown tool");
    CHECK(g && !accepts(g_tok, g, "Hello<|close|>response<|sep|>" END), "required: a plain answer is refused");
    CHECK(g && !accepts(g_tok, g, TOOLS_OPEN TOOLS_END), "required: at least one call");
    k3c_cgrammar_free(g);
    sp.one_call = 1;
    g = chat_grammar(g_tok, NULL, &sp);
    CHECK(g && !accepts(g_tok, g, TOOLS_OPEN CALL("calc", 1, "{\"expression\": \"1\"}")
                                      CALL("calculator", 2, "{}") TOOLS_END),
          "parallel_tool_calls false: one call");
    k3c_cgrammar_free(g);
    sp = (k3c_cchat){.format = K3C_CHAT_XTML, .tools_mode = K3C_CTOOLS_NAMED, .tool_name = "calculator", .tools = tools};
    g = chat_grammar(g_tok, NULL, &sp);
    CHECK(g && accepts(g_tok, g, TOOLS_OPEN CALL("calculator", 1, "{}") TOOLS_END), "named: that tool");
    CHECK(g && !accepts(g_tok, g, TOOLS_OPEN CALL("calc", 1, "{\"expression\": \"1\"}") TOOLS_END),
          "named: another tool is refused");
    k3c_cgrammar_free(g);
    sp = (k3c_cchat){.format = K3C_CHAT_XTML, .tools_mode = K3C_CTOOLS_NONE, .tools = tools};
    g = chat_grammar(g_tok, NULL, &sp);
    CHECK(g && accepts(g_tok, g, "Hello \"world\" {}<|close|>response<|sep|>" END), "none: a plain answer");
    CHECK(g && !accepts(g_tok, g, TOOLS_OPEN CALL("calc", 1, "{\"expression\": \"1\"}") TOOLS_END),
          "none: the tools channel is refused");
    k3c_cgrammar_free(g);
    sp = (k3c_cchat){.format = K3C_CHAT_XTML};
    k3c_err err = {0};
    char path[64];
    CHECK(k3c_cgrammar_chat(g_tok, NULL, &sp, &g, path, sizeof path, &err) == 0 && !g, "auto, no format: none");
    k3c_json_free(tools);
    k3c_json_free(schema);
}

static uint64_t g_rng = 88172645463325252ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}

static const k3c_tok *g_walk_tok;
static int is_structural(const k3c_tok *tok, int64_t id) {
    const unsigned char *b;
    size_t n;
    if (k3c_tok_is_special(tok, (int32_t)id)) return 1;
    if (k3c_tok_token_bytes(tok, (int32_t)id, &b, &n, NULL)) return 0;
    for (size_t i = 0; i < n; i++)
        if (strchr("\"{}[],:", b[i]) && b[i]) return 1;
    return 0;
}

/* A random walk through g (random logits with holes, budgets from tight to loose, a random allowed id taken): at each
 * step the trie mask equals the exact one. Returns the steps compared. */
static int fast_equals_exact(const k3c_cgrammar *g, int64_t V, int steps, const char *what) {
    k3c_constraint *c = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_constraint_new(g, 0, &c, &err), &err);
    float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
    int64_t n_out = 0, bad = 0;
    int s = 0, answers = 0;
    static const int64_t lefts[] = {1, 3, 12, 40, 1000000};
    for (; s < steps && !bad; s++) {
        for (int64_t i = 0; i < V; i++) a[i] = b[i] = rnd() % 20 == 0 ? -INFINITY : (float)(rnd() % 1000) / 100.f;
        int64_t left = lefts[rnd() % 5];
        int ra = c->mask(c->ctx, a, V, left), rb = k3c_constraint_mask_exact(c, b, V, left);
        for (int64_t i = 0; i < V; i++) bad += a[i] != b[i] && !(isinf(a[i]) && isinf(b[i]));
        if (ra != rb) bad++;
        if (bad) CHECK(0, "%s: step %d (left %lld): masks differ (rc %d / %d, %lld ids)", what, s, (long long)left,
                       ra, rb, (long long)bad);
        /* the budget's promise: the shortest completion's tokens are really there, so with exactly that many left
           some id takes one off it */
        int64_t need = k3c_constraint_cost(c);
        for (int64_t i = 0; i < V; i++) a[i] = 0;
        if (!k3c_constraint_done(c) && c->mask(c->ctx, a, V, need)) {
            CHECK(0, "%s: step %d: nothing allowed with left = the cost %lld", what, s, (long long)need);
            bad++;
        }
        /* go on with a loose budget so the walk gets deep: re-mask loosely when the tight one left nothing */
        for (int64_t i = 0; i < V; i++) a[i] = 0;
        if (c->mask(c->ctx, a, V, 1000000 - n_out)) break;
        /* often a structural id (a marker, or bytes with JSON punctuation), so walks leave free text */
        int structural = rnd() % 5 < 2;
        int64_t n_ok = 0, n_st = 0, pick;
        for (int64_t i = 0; i < V; i++) n_ok += a[i] == 0, n_st += a[i] == 0 && is_structural(g_walk_tok, i);
        if (!n_st) structural = 0;
        pick = (int64_t)(rnd() % (uint64_t)(structural ? n_st : n_ok));
        for (int64_t i = 0; i < V; i++)
            if (a[i] == 0 && (!structural || is_structural(g_walk_tok, i)) && pick-- == 0) {
                CHECK_OK(c->accept(c->ctx, (int32_t)i), &err);
                break;
            }
        n_out++;
        if (k3c_constraint_done(c)) { /* a fresh answer */
            answers++;
            c->release(c->ctx);
            CHECK_OK(k3c_constraint_new(g, 0, &c, &err), &err);
        }
    }
    c->release(c->ctx);
    free(a), free(b);
    CHECK(bad == 0, "%s: trie mask equals the exact mask over %d steps (%d answers completed)", what, s, answers);
    printf("%s: %d steps compared, %d answers completed\n", what, s, answers);
    return s;
}

/* Random answers (the trie mask, random picks) within a budget of the grammar's minimum plus 0..4 tokens: every one
 * completes within it, the markup counted in the vocabulary's tokens. */
static void tight_walks(const k3c_cgrammar *g, int64_t V, const char *what) {
    float *a = malloc(sizeof(float) * (size_t)V);
    int completed = 0;
    k3c_err err = {0};
    for (int w = 0; w < 5; w++) {
        int64_t budget = k3c_cgrammar_min_tokens(g) + w, n = 0;
        k3c_constraint *c = NULL;
        CHECK_OK(k3c_constraint_new(g, 0, &c, &err), &err);
        while (n < budget && !k3c_constraint_done(c)) {
            for (int64_t i = 0; i < V; i++) a[i] = 0;
            if (c->mask(c->ctx, a, V, budget - n)) break;
            int64_t n_ok = 0, pick;
            for (int64_t i = 0; i < V; i++) n_ok += a[i] == 0;
            pick = (int64_t)(rnd() % (uint64_t)n_ok);
            for (int64_t i = 0; i < V; i++)
                if (a[i] == 0 && pick-- == 0) {
                    c->accept(c->ctx, (int32_t)i);
                    break;
                }
            n++;
        }
        completed += k3c_constraint_done(c);
        c->release(c->ctx);
    }
    free(a);
    CHECK(completed == 5, "%s: %d of 5 answers complete within min_tokens (%lld) + 0..4", what, completed,
          (long long)k3c_cgrammar_min_tokens(g));
}

/* The grammars of the walks: a schema, json_object, the chat answers. */
static void test_fast_mask(const k3c_tok *tok, int64_t V, int steps, const char *what) {
    k3c_vtrie *trie = NULL;
    k3c_err err = {0};
    g_walk_tok = tok;
    CHECK_OK(k3c_vtrie_new(tok, V, &trie, &err), &err);
    k3c_json *s = parse(SCHEMA), *tools = parse(TOOLS);
    k3c_cchat specs[] = {{.format = K3C_CHAT_XTML, .json = 1, .schema = s},
                         {.format = K3C_CHAT_XTML, .thinking = 1, .json = 1},
                         {.format = K3C_CHAT_XTML, .thinking = 1, .tools_mode = K3C_CTOOLS_REQUIRED, .tools = tools},
                         {.format = K3C_CHAT_XTML, .tools_mode = K3C_CTOOLS_NONE, .tools = tools},
                         {.format = K3C_CHAT_K2, .json = 1, .schema = s}};
    for (size_t i = 0; trie && i < sizeof specs / sizeof *specs; i++) {
        if (specs[i].format == K3C_CHAT_K2 && k3c_tok_special_id(tok, "<|im_end|>") < 0) continue;
        k3c_cgrammar *g = chat_grammar(tok, trie, &specs[i]);
        char w[96];
        snprintf(w, sizeof w, "%s, grammar %zu", what, i);
        if (g) fast_equals_exact(g, V, steps, w);
        if (g) tight_walks(g, V, w);
        k3c_cgrammar_free(g);
    }
    k3c_json_free(s), k3c_json_free(tools);
    k3c_vtrie_free(trie);
}

/* 200 answers through the engine at temperature 1; each must parse and validate, within a tight max_tokens. */
static void test_engine(const char *dir) {
    char p[4400];
    snprintf(p, sizeof p, "%s/config.json", dir);
    k3c_config cfg;
    k3c_model m;
    k3c_err err = {0};
    CHECK_OK(k3c_config_load(p, &cfg, &err), &err);
    CHECK_OK(k3c_model_create_f32(&cfg, 0, &m, &err), &err);
    k3c_model_init_f32(&m, 7, 0.5);
    k3c_engine *e = NULL;
    k3c_engine_opts o = {.max_seqs = 8, .max_ctx = 512};
    CHECK_OK(k3c_engine_open(&m, &o, &e, &err), &err);
    k3c_json *s = parse(SCHEMA);
    k3c_cgrammar *g = NULL;
    char path[256];
    const char *suffix = "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>";
    CHECK_OK(k3c_cgrammar_new(g_tok, NULL, s, "", suffix, 0, &g, path, sizeof path, &err), &err);
    test_mask(g, cfg.vocab_size);
    int32_t prompt[8];
    for (int i = 0; i < 8; i++) prompt[i] = (int32_t)(i * 37 % 200);
    const int N = 200;
    int64_t *ids = calloc(N, sizeof *ids);
    k3c_sbuf *out = calloc(N, sizeof *out);
    int done = 0, parsed = 0, validated = 0, errors = 0;
    for (int i = 0; i < N; i++) {
        k3c_request r = {.sampler = {.temperature = 1, .top_p = 1, .repetition_penalty = 1, .seed = (uint64_t)i},
                         .max_new = k3c_cgrammar_min_tokens(g) + i % 3 * 40, .n_stop = 1};
        r.stop_ids[0] = k3c_tok_special_id(g_tok, "<|end_of_msg|>");
        CHECK_OK(k3c_constraint_new(g, 0, &r.constraint, &err), &err);
        k3c_sbuf_init(&out[i]);
        CHECK_OK(k3c_engine_submit(e, prompt, 8, &r, &ids[i], &err), &err);
    }
    k3c_engine_event ev[64];
    int nev;
    while (k3c_engine_pending(e) > 0) {
        if (k3c_engine_step(e, ev, 64, &nev, &err)) break;
        for (int k = 0; k < nev; k++) {
            int i = (int)(ev[k].seq - ids[0]);
            if (ev[k].finish == K3C_FINISH_ERROR) errors++;
            const unsigned char *b;
            size_t len;
            if (ev[k].token.id >= 0 && ev[k].token.id < k3c_tok_n_ranks(g_tok) &&
                !k3c_tok_token_bytes(g_tok, ev[k].token.id, &b, &len, NULL))
                k3c_sbuf_append(&out[i], (const char *)b, len);
            else if (ev[k].token.id >= 0) k3c_sbuf_append(&out[i], "\x01", 1); /* a marker */
            done += ev[k].finish == K3C_FINISH_STOP;
        }
    }
    for (int i = 0; i < N; i++) {
        /* the JSON is the text before the first marker, and the answer ends with the closing markup */
        const char *txt = out[i].buf ? out[i].buf : "";
        const char *mk = memchr(txt, '\x01', out[i].len);
        size_t jl = mk ? (size_t)(mk - txt) : out[i].len;
        k3c_json *v = NULL;
        k3c_err pe = {0};
        if (k3c_json_parse(txt, jl, "answer", &v, &pe) == 0) {
            parsed++;
            int ok = valid(s, v);
            validated += ok;
            if (!ok) CHECK(0, "answer %d does not validate: %.*s", i, (int)jl, txt);
        } else if (parsed == i) {
            CHECK(0, "answer %d does not parse: %.*s (%s)", i, (int)jl, txt, pe.msg);
        }
        k3c_json_free(v);
        k3c_sbuf_free(&out[i]);
    }
    CHECK(done == N && parsed == N && validated == N && errors == 0,
          "200 sampled answers: %d stopped, %d parse, %d validate, %d errors", done, parsed, validated, errors);
    free(out), free(ids);
    k3c_cgrammar_free(g);
    k3c_json_free(s);
    k3c_engine_close(e);
    k3c_model_free_f32(&m);
}

int main(void) {
    const char *dir = test_tmpdir("constrain");
    k3c_err err = {0};
    if (serve_model_dir(dir) == 0 && k3c_tok_load_dir(dir, NULL, &g_tok, &err) == 0) {
        test_automaton();
        test_chat();
        test_fast_mask(g_tok, k3c_tok_n_vocab(g_tok), 400, "test vocabulary");
        test_engine(dir);
    } else {
        CHECK(0, "fixture: %s", err.msg);
    }
    k3c_tok_free(g_tok);
    k3c_tok *k3 = NULL;
    CHECK_OK(k3c_tok_load_kimi(test_shared("golden/kimi_tokenizer/tiktoken.model"),
                               test_shared("golden/kimi_tokenizer/special_tokens.json"), "kimi_k3", &k3, &err),
             &err);
    if (k3) test_fast_mask(k3, k3c_tok_n_vocab(k3), 40, "K3 vocabulary");
    k3c_tok_free(k3);
    return test_summary();
}
