/* test_head_chunk.c — the chunked head (docs/TRAINING.md §1.4 "Chunked head"): a tiny K3 model whose lm_head and
 * cross-entropy run in chunks of tokens gives the loss and every gradient of the unchunked model (float64 within 1e-12
 * relative, float32 within the golden tests' tolerance), chunks of 1, 7, T − 1, T and more than T, over packed
 * documents, with given targets masked out, per-position loss weights and a given divisor, and together with sliced
 * recompute; the logits are refused when only one chunk is kept; bad settings are clear errors; the planned arena
 * drops. */
#include "test.h"
#include "ops/backend.h"
#include "model/model.h"
#include "model_step.h"

#define T_TEST 43
static const int32_t CU[5] = {0, 11, 24, 39, 43}; /* packed documents of 11, 13, 15 and 4 tokens */

typedef struct {
    double loss;
    double *g;
    size_t n; /* gradient entries */
    int rc;
    char msg[1024];
} run_out;

/* The batch's variants: 0 next-token targets; 1 given targets (every fifth masked out) with loss weights; 2 the same
   with a given divisor. */
typedef struct {
    int variant;
    int64_t head_chunk, slice;
    int recompute;
} run_opts;

static int load_cfg(k3c_config *cfg) {
    k3c_err err = {0};
    int rc = k3c_config_load("configs/k3_test_tiny.json", cfg, &err);
    CHECK(rc == K3C_OK, "%s", err.msg);
    return rc;
}

static void make_batch(int variant, int32_t *ids, int32_t *tg, float *w, k3c_model_batch *b) {
    for (int t = 0; t < T_TEST; t++) {
        ids[t] = (int32_t)((t * 7 + 5) % 32);
        tg[t] = t % 5 == 3 ? -1 : (int32_t)((t * 11 + 2) % 32);
        w[t] = 0.25f + 0.5f * (float)(t % 4);
    }
    *b = (k3c_model_batch){T_TEST, 4, ids, CU, NULL, 0, 0, NULL, NULL, NULL, NULL};
    if (variant >= 1) {
        b->targets = tg;
        b->weight = w;
    }
    if (variant == 2) b->loss_norm = 57.0;
}

/* One forward + backward with the model's gradients zeroed first. */
#define RUN_BODY(S)                                                                                                    \
    static void run_##S(const k3c_config *cfg, const run_opts *op, run_out *o) {                                       \
        k3c_err err = {0};                                                                                             \
        int32_t ids[T_TEST], tg[T_TEST];                                                                               \
        float w[T_TEST];                                                                                               \
        k3c_model_batch b;                                                                                             \
        make_batch(op->variant, ids, tg, w, &b);                                                                       \
        k3c_model m;                                                                                                   \
        memset(o, 0, sizeof *o);                                                                                       \
        if ((o->rc = k3c_model_create_##S(cfg, 1, &m, &err))) {                                                        \
            snprintf(o->msg, sizeof o->msg, "%s", err.msg);                                                            \
            return;                                                                                                    \
        }                                                                                                              \
        k3c_model_init_##S(&m, 3, 0.3);                                                                                \
        m.kda_chunk = 16;                                                                                              \
        m.head_chunk = op->head_chunk;                                                                                 \
        m.recompute_slice = op->slice;                                                                                 \
        for (int l = 0; l < cfg->num_layers; l++) m.recompute[l] = (uint8_t)op->recompute;                             \
        o->rc = test_model_step_##S(&m, &b, &o->loss, &o->g, &err);                                                    \
        if (!o->rc)                                                                                                    \
            o->n = m.table.total;                                                                                      \
        else                                                                                                           \
            snprintf(o->msg, sizeof o->msg, "%s", err.msg);                                                            \
        k3c_model_free_##S(&m);                                                                                        \
    }
RUN_BODY(f64)
RUN_BODY(f32)

static void compare(const k3c_config *cfg, const char *what, const run_out *o, const run_out *ref, double tol) {
    char name[200];
    if (o->rc || ref->rc) {
        CHECK(0, "%s: %s", what, o->rc ? o->msg : ref->msg);
        return;
    }
    const double dl = fabs(o->loss - ref->loss) / fabs(ref->loss);
    double head = INFINITY, worst = test_worst_param_err(cfg, o->g, ref->g, &head);
    printf("  %s: loss rel err %.2e, worst gradient %.2e, lm_head %.2e\n", what, dl, worst, head);
    snprintf(name, sizeof name, "%s: loss rel err", what);
    CHECK_LE(dl, tol, name);
    snprintf(name, sizeof name, "%s: worst gradient rel err", what);
    CHECK_LE(worst, tol, name);
    snprintf(name, sizeof name, "%s: lm_head gradient rel err", what);
    CHECK_LE(head, tol, name);
}

static void chunked_equals_whole(void) {
    k3c_config cfg;
    if (load_cfg(&cfg)) return;
    const int64_t chunks[5] = {1, 7, T_TEST - 1, T_TEST, T_TEST + 21};
    for (int v = 0; v < 3; v++) {
        run_out ref;
        run_f64(&cfg, &(run_opts){v, 0, 0, 0}, &ref);
        CHECK(ref.rc == 0 && ref.loss > 0, "variant %d reference: %s", v, ref.msg);
        for (int c = 0; c < 5; c++) {
            run_out o;
            char what[128];
            run_f64(&cfg, &(run_opts){v, chunks[c], 0, 0}, &o);
            snprintf(what, sizeof what, "f64 batch %d, head_chunk %lld", v, (long long)chunks[c]);
            compare(&cfg, what, &o, &ref, 1e-12);
            if (chunks[c] >= T_TEST && !o.rc && !ref.rc) /* one chunk of the whole batch: today's head, bit for bit */
                CHECK(o.loss == ref.loss && o.n == ref.n && memcmp(o.g, ref.g, sizeof(double) * o.n) == 0,
                      "%s: not bitwise the unchunked head", what);
            free(o.g);
        }
        /* with every layer recomputed in slices of 8 tokens */
        run_out o;
        run_f64(&cfg, &(run_opts){v, 7, 8, 1}, &o);
        char what[128];
        snprintf(what, sizeof what, "f64 batch %d, head_chunk 7 with recompute_slice 8", v);
        compare(&cfg, what, &o, &ref, 1e-12);
        free(o.g);
        free(ref.g);
    }
    /* float32: the chunks sum the loss and the lm_head gradient in another order; the golden tests' tolerance */
    run_out ref, o;
    run_f32(&cfg, &(run_opts){1, 0, 0, 0}, &ref);
    run_f32(&cfg, &(run_opts){1, 7, 0, 0}, &o);
    compare(&cfg, "f32 batch 1, head_chunk 7", &o, &ref, 1e-4);
    free(o.g);
    free(ref.g);
}

/* The logits of a forward that kept one chunk are refused (nothing run); of one chunk of the whole batch, returned.
 * A negative chunk and tensor parallelism are clear errors naming the setting. */
static void refusals(void) {
    k3c_config cfg;
    if (load_cfg(&cfg)) return;
    k3c_err err = {0};
    k3c_model m;
    CHECK_OK(k3c_model_create_f64(&cfg, 1, &m, &err), &err);
    k3c_model_init_f64(&m, 3, 0.3);
    int32_t ids[T_TEST], tg[T_TEST];
    float w[T_TEST];
    k3c_model_batch b;
    make_batch(0, ids, tg, w, &b);
    k3c_arena ar;
    k3c_acts *acts = NULL;
    double loss = -1, *logits = NULL, *whole = malloc(sizeof(double) * (size_t)(T_TEST * cfg.vocab_size));
    CHECK_OK(k3c_arena_init(&ar, k3c_model_plan_bytes_f64(&m, T_TEST, 4), &err), &err);
    CHECK_OK(k3c_model_forward_f64(&m, &b, &ar, &acts, &loss, &logits, &err), &err);
    memcpy(whole, logits, sizeof(double) * (size_t)(T_TEST * cfg.vocab_size));
    m.head_chunk = 7;
    acts = NULL, logits = NULL, loss = -1;
    int rc = k3c_model_forward_f64(&m, &b, &ar, &acts, &loss, &logits, &err);
    CHECK(rc == K3C_EUNSUPPORTED && strstr(err.msg, "logits_out") && strstr(err.msg, "head_chunk = 7") && !acts &&
              !logits && loss == -1,
          "logits of a chunked head: rc %d '%s'", rc, err.msg);
    m.head_chunk = T_TEST;
    k3c_arena_reset(&ar, 0); /* the arena of one step */
    CHECK_OK(k3c_model_forward_f64(&m, &b, &ar, &acts, &loss, &logits, &err), &err);
    CHECK(logits && memcmp(logits, whole, sizeof(double) * (size_t)(T_TEST * cfg.vocab_size)) == 0,
          "a chunk of the whole batch returns other logits");
    m.head_chunk = -3;
    k3c_arena_reset(&ar, 0);
    rc = k3c_model_forward_f64(&m, &b, &ar, &acts, &loss, NULL, &err);
    CHECK(rc == K3C_EINVAL && strstr(err.msg, "head_chunk = -3"), "negative chunk: rc %d '%s'", rc, err.msg);
    k3c_tensor_parallel tp = {0, 1, NULL, NULL, NULL, NULL, NULL, NULL}; /* refused before any hook is called */
    m.tp = &tp;
    m.head_chunk = 7;
    rc = k3c_model_forward_f64(&m, &b, &ar, &acts, &loss, NULL, &err);
    CHECK(rc == K3C_EUNSUPPORTED && strstr(err.msg, "head_chunk = 7") && strstr(err.msg, "tensor parallelism"),
          "chunks with tensor parallelism: rc %d '%s'", rc, err.msg);
    m.tp = NULL;
    free(whole);
    k3c_arena_free(&ar);
    k3c_model_free_f64(&m);
}

/* Planned activation bytes of a model (no gradients, weights never touched) at T tokens. */
static size_t plan_of(const char *config, int64_t T, int64_t slice, int64_t chunk) {
    k3c_config cfg;
    k3c_err err = {0};
    k3c_model m;
    if (k3c_config_load(config, &cfg, &err) || k3c_model_create_f32(&cfg, 0, &m, &err)) {
        CHECK(0, "%s: %s", config, err.msg);
        return 0;
    }
    m.kda_chunk = 64;
    for (int l = 0; slice && l < cfg.num_layers; l++) m.recompute[l] = 1;
    m.recompute_slice = slice;
    m.head_chunk = chunk;
    size_t b = k3c_model_plan_bytes_f32(&m, T, 1);
    k3c_model_free_f32(&m);
    return b;
}

/* The planned arena drops by the logits and dlogits [T, V] less one chunk's each. */
static void plan_drops(void) {
    size_t whole = plan_of("configs/k3_test_tiny.json", 4096, 512, 0);
    size_t chunked = plan_of("configs/k3_test_tiny.json", 4096, 512, 256);
    size_t one = plan_of("configs/k3_test_tiny.json", 4096, 512, 4096);
    printf("  planned bytes, k3_test_tiny, T = 4096, slices of 512: head whole %zu, in chunks of 256 %zu\n", whole,
           chunked);
    CHECK(chunked < whole, "chunks of 256 plan %zu bytes, the whole head %zu", chunked, whole);
    CHECK(one == whole, "a chunk of the whole batch plans %zu bytes, not the unchunked %zu", one, whole);
    const char *medium = test_shared("bench/kimi_linear_medium.json");
    const int64_t T = 1 << 20;
    size_t mw = plan_of(medium, T, 8192, 0), mc = plan_of(medium, T, 8192, 8192);
    printf("  planned bytes, kimi_linear_medium, T = %lld, recompute_slice 8192: head whole %zu (%.1f GB), "
           "head_chunk 8192 %zu (%.1f GB)\n",
           (long long)T, mw, (double)mw / 1e9, mc, (double)mc / 1e9);
    /* the logits and dlogits, fp32, of all T tokens against one chunk's */
    k3c_config cfg;
    k3c_err err = {0};
    CHECK_OK(k3c_config_load(medium, &cfg, &err), &err);
    const double head = 2.0 * 4 * (double)cfg.vocab_size * (double)(T - 8192);
    CHECK(mc < mw && (double)(mw - mc) >= 0.5 * head, "head_chunk 8192 saves %zu bytes of %zu", mw - mc, mw);
}

int main(void) {
    chunked_equals_whole();
    refusals();
    plan_drops();
    return test_summary();
}
