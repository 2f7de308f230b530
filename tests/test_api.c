/* test_api.c — the public header is enough: a program that includes only k3c.h opens a model directory for serving,
 * generates greedily, runs a forward, reads config / safetensors / a run config and round-trips text through a
 * tokenizer (no internal header, so a declaration missing from k3c.h fails the build). */
#include "k3c.h"
#include "k3c/train.h"

#include <stdlib.h>
#include <string.h>

static int passed, failed;
#define EXPECT(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (cond)                                                                                                      \
            passed++;                                                                                                  \
        else {                                                                                                         \
            failed++;                                                                                                  \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                                     \
            printf(__VA_ARGS__);                                                                                       \
            printf("\n");                                                                                              \
        }                                                                                                              \
    } while (0)

static const char *shared(const char *rel, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s", getenv("K3C_SHARED") ? getenv("K3C_SHARED") : "../shared", rel);
    return buf;
}

static int count(void *ctx, int32_t id, int64_t i) {
    (void)id, (void)i;
    ++*(int *)ctx;
    return 0;
}

/* Serving: open, generate (the ids `k3c generate --greedy` prints for the golden prompt), one forward. */
static void serve(void) {
    static const int32_t want[4] = {413, 960, 1151, 279};
    char dir[4096], gpath[4200];
    shared("golden/k3_tiny_a", dir, sizeof dir);
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    k3c_err err = {0};
    k3c_serve sv;
    int32_t *ids = NULL;
    int64_t B = 0, T = 0, len = 0;
    int rc = k3c_serve_open(dir, 0, NULL, &sv, &err);
    EXPECT(rc == 0 && sv.weights && !sv.tok, "serve_open: %s", err.msg);
    if (rc) return;
    rc = k3c_st_read_ids(gpath, "prompt_ids", &ids, &B, &T, &err);
    EXPECT(rc == 0 && B == 1 && T > 0, "prompt_ids: %s", err.msg);
    int32_t *seq = rc ? NULL : malloc(sizeof(int32_t) * (size_t)(T + 4));
    int streamed = 0;
    k3c_gen_opts o = {.sampler = {.top_p = 1}, .max_new = 4, .stop_id = -1, .on_token = count, .ctx = &streamed};
    if (seq) memcpy(seq, ids, sizeof(int32_t) * (size_t)T);
    EXPECT(seq && k3c_generate(sv.weights, seq, T, &o, &len, &err) == 0 && len == T + 4 && streamed == 4 &&
               memcmp(seq + T, want, sizeof want) == 0,
           "generate: %s", err.msg);
    k3c_model *m = NULL;
    rc = k3c_model_load_dir_f32(dir, 0, &m, &err);
    EXPECT(rc == 0, "model_open: %s", err.msg);
    if (rc) seq = (free(seq), NULL);
    k3c_arena arena = {0};
    k3c_acts *acts;
    float *logits;
    double loss = 0;
    k3c_model_batch b = {T, 1, ids, NULL, NULL, 0, 0, NULL, NULL, NULL, NULL};
    rc = seq ? k3c_model_arena_init_f32(m, k3c_model_plan_bytes_f32(m, T, 1), &arena, &err) : 1;
    EXPECT(rc == 0 && k3c_model_forward_f32(m, &b, &arena, &acts, &loss, &logits, &err) == 0 && loss > 0,
           "forward: %s", err.msg);
    if (m) k3c_model_arena_free_f32(m, &arena);
    k3c_model_close_f32(m);
    free(seq);
    free(ids);
    k3c_serve_close(&sv);
}

/* Config, a run config and a tokenizer round trip. */
static void files(void) {
    char p[4096];
    k3c_err err = {0};
    k3c_config cfg;
    EXPECT(k3c_config_load(shared("golden/kimi_linear_tiny_a", p, sizeof p), &cfg, &err) == 0 &&
               strcmp(cfg.model_type, "kimi_linear") == 0,
           "config: %s", err.msg);
    k3c_run_config rc;
    EXPECT(k3c_run_config_load("configs/demo_run.json", &rc, &err) == 0 && rc.n_stages > 0, "run config: %s", err.msg);
    k3c_tok *t = NULL;
    shared("golden/kimi_tokenizer/tiktoken.model", p, sizeof p);
    EXPECT(k3c_tok_load(p, K3C_TOK_PATTERN_KIMI, 0, &t, &err) == 0, "tokenizer: %s", err.msg);
    if (!t) return;
    const char *text = "Hello, world: 12345 tokens.";
    k3c_tok_ids v = {0};
    char *back = NULL;
    size_t n = 0;
    EXPECT(k3c_tok_encode(t, text, strlen(text), 0, &v, &err) == 0 && v.n > 0 &&
               k3c_tok_decode(t, v.ids, v.n, &back, &n, &err) == 0 && n == strlen(text) && memcmp(back, text, n) == 0,
           "round trip: %s", err.msg);
    free(back);
    k3c_tok_ids_free(&v);
    k3c_tok_free(t);
}

int main(void) {
    serve();
    files();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
