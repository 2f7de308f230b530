/* bench_constrain.c — the cost of constrained decoding's token mask per generated token (docs/SERVING.md "Constrained
 * decoding"): random answers (seeded picks among the allowed ids) to a strict json_schema, a thinking json_object and a
 * forced tool call, over the test fixture's vocabulary (a 420-rank BPE trained as tests/serve_fixture.h trains it) and
 * the K3 tokenizer (../shared/golden/kimi_tokenizer, 163,840 ids); the trie mask's mean / p50 / p99 / max µs per
 * token, the cold table builds among them, against the mask that tries every id. The picks: one in ten a marker, three
 * a structural id, so the answers close. Not part of make test. */

/* Usage: bench_constrain [TOKENS (default 2000)] [SHARED (default ../shared or $K3C_SHARED)] */
#include "../tests/serve_corpus.h"
#include "serve/constrain.h"

#include "tok/tok.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_now(void) { /* thread CPU seconds: on a shared machine wall time measures the neighbours too */
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}

/* The fixture's tokenizer: tests/serve_fixture.h's corpus and its 420 ranks, the chat markers as specials. */
static k3c_tok *fixture_tok(k3c_err *err) {
    k3c_sbuf s;
    serve_corpus_text(&s);
    const char *texts[1] = {s.buf};
    size_t n = s.len;
    k3c_tok_train_opts o = {.vocab_size = SERVE_RANKS,
                            .pattern = K3C_TOK_PATTERN_KIMI,
                            .specials = k3c_chat_specials,
                            .n_specials = K3C_CHAT_N_SPECIALS};
    k3c_tok *t = NULL;
    int rc = k3c_tok_train(texts, &n, 1, &o, &t, err);
    k3c_sbuf_free(&s);
    return rc ? NULL : t;
}

/* 2 for a marker, 1 for bytes with JSON punctuation, else 0. */
static int is_structural(const k3c_tok *tok, int32_t id) {
    const unsigned char *b;
    size_t n;
    if (k3c_tok_is_special(tok, id)) return 2;
    if (k3c_tok_token_bytes(tok, id, &b, &n, NULL)) return 0;
    for (size_t i = 0; i < n; i++)
        if (b[i] && strchr("\"{}[],:", b[i])) return 1;
    return 0;
}

typedef struct {
    double mean, p50, p99, max, exact; /* µs per token; exact: the every-id mask's mean */
    int64_t tokens, answers;
} result;

/* ntok tokens of random answers to g: each step masks (timed), then takes a random allowed id. Every fifth step the
 * exact mask is timed too. */
static int run(const k3c_tok *tok, const k3c_cgrammar *g, int64_t V, int64_t ntok, result *res, k3c_err *err) {
    float *l = malloc(sizeof(float) * (size_t)V), *e = malloc(sizeof(float) * (size_t)V);
    double *t = malloc(sizeof(double) * (size_t)ntok), exact = 0;
    int64_t n_exact = 0, answers = 0, k = 0;
    k3c_constraint *c = NULL;
    int rc = !l || !e || !t ? k3c_errf(err, K3C_ENOMEM, "out of memory") : k3c_constraint_new(g, 0, &c, err);
    for (; !rc && k < ntok; k++) {
        for (int64_t i = 0; i < V; i++) l[i] = (float)(rnd() % 1000) * 1e-2f;
        const int64_t left = 100000;
        double t0 = cpu_now();
        rc = c->mask(c->ctx, l, V, left);
        t[k] = 1e6 * (cpu_now() - t0);
        if (!rc && k % 5 == 0) {
            for (int64_t i = 0; i < V; i++) e[i] = 0;
            t0 = cpu_now();
            rc = k3c_constraint_mask_exact(c, e, V, left);
            exact += 1e6 * (cpu_now() - t0), n_exact++;
        }
        int64_t n[3] = {0}; /* allowed ids: all, structural, markers */
        for (int64_t i = 0; i < V; i++)
            if (l[i] != -INFINITY) {
                int kind = is_structural(tok, (int32_t)i);
                n[0]++, n[1] += kind > 0, n[2] += kind == 2;
            }
        uint64_t u = rnd() % 10;
        int cat = u < 1 && n[2] ? 2 : u < 4 && n[1] ? 1 : 0;
        int64_t pick = n[cat] ? (int64_t)(rnd() % (uint64_t)n[cat]) : -1;
        for (int64_t i = 0; !rc && pick >= 0 && i < V; i++)
            if (l[i] != -INFINITY && is_structural(tok, (int32_t)i) >= cat && pick-- == 0) {
                rc = c->accept(c->ctx, (int32_t)i);
                break;
            }
        if (!rc && k3c_constraint_done(c)) {
            answers++;
            c->release(c->ctx);
            rc = k3c_constraint_new(g, 0, &c, err);
        }
    }
    if (c) c->release(c->ctx);
    if (!rc) {
        double sum = 0;
        for (int64_t i = 0; i < ntok; i++) sum += t[i];
        qsort(t, (size_t)ntok, sizeof *t, cmp_d);
        *res = (result){sum / (double)ntok, t[ntok / 2], t[ntok * 99 / 100], t[ntok - 1], exact / (double)n_exact,
                        ntok, answers};
    } else if (!err->code) {
        k3c_errf(err, rc, "constraint step %lld failed", (long long)k);
    }
    free(l), free(e), free(t);
    return rc;
}

#define SCHEMA                                                                                                         \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"            \
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\"]}},\"ok\":{\"type\":\"boolean\"},"          \
    "\"note\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}},"                                              \
    "\"required\":[\"name\",\"age\",\"tags\",\"ok\",\"note\"],\"additionalProperties\":false}"
#define TOOLS                                                                                                          \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","               \
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}}}]"

static int bench_vocab(const char *label, const k3c_tok *tok, int64_t ntok, k3c_err *err) {
    int64_t V = k3c_tok_n_vocab(tok);
    k3c_vtrie *trie = NULL;
    double t0 = cpu_now();
    int rc = k3c_vtrie_new(tok, V, &trie, err);
    double build = 1e3 * (cpu_now() - t0);
    if (rc) return rc;
    printf("%s: %lld ids, trie built in %.1f ms CPU\n", label, (long long)V, build);
    k3c_json *schema = NULL, *tools = NULL;
    rc = k3c_json_parse(SCHEMA, strlen(SCHEMA), "schema", &schema, err);
    if (!rc) rc = k3c_json_parse(TOOLS, strlen(TOOLS), "tools", &tools, err);
    const k3c_cchat specs[3] = {{.format = K3C_CHAT_XTML, .json = 1, .schema = schema},
                                {.format = K3C_CHAT_XTML, .thinking = 1, .json = 1},
                                {.format = K3C_CHAT_XTML, .thinking = 1, .tools_mode = K3C_CTOOLS_REQUIRED, .tools = tools}};
    static const char *const names[3] = {"json_schema strict", "thinking + json_object", "thinking + tool_choice required"};
    for (int s = 0; !rc && s < 3; s++) {
        k3c_cgrammar *g = NULL;
        char path[128];
        result r;
        rc = k3c_cgrammar_chat(tok, trie, &specs[s], &g, path, sizeof path, err);
        if (!rc) rc = run(tok, g, V, ntok, &r, err);
        if (!rc)
            printf("  %-32s trie mask %8.1f µs/token mean, p50 %7.1f, p99 %8.1f, max %8.1f; every-id mask %9.1f µs "
                   "(%.0f×); %lld tokens, %lld answers, shortest answer %lld tokens\n",
                   names[s], r.mean, r.p50, r.p99, r.max, r.exact, r.exact / r.mean, (long long)r.tokens,
                   (long long)r.answers, (long long)k3c_cgrammar_min_tokens(g));
        k3c_cgrammar_free(g);
    }
    k3c_json_free(schema), k3c_json_free(tools);
    k3c_vtrie_free(trie);
    return rc;
}

int main(int argc, char **argv) {
    int64_t ntok = argc > 1 ? atoll(argv[1]) : 2000;
    const char *shared = argc > 2 ? argv[2] : getenv("K3C_SHARED") ? getenv("K3C_SHARED") : "../shared";
    k3c_err err = {0};
    k3c_tok *tiny = fixture_tok(&err), *k3 = NULL;
    int rc = tiny ? bench_vocab("test fixture vocabulary", tiny, ntok, &err) : err.code;
    char m[4096], sp[4096];
    snprintf(m, sizeof m, "%s/golden/kimi_tokenizer/tiktoken.model", shared);
    snprintf(sp, sizeof sp, "%s/golden/kimi_tokenizer/special_tokens.json", shared);
    if (!rc) rc = k3c_tok_load_kimi(m, sp, "kimi_k3", &k3, &err);
    if (!rc) rc = bench_vocab("K3 tokenizer", k3, ntok, &err);
    k3c_tok_free(tiny), k3c_tok_free(k3);
    if (rc) fprintf(stderr, "bench_constrain: %s\n", err.msg);
    return rc ? 1 : 0;
}
