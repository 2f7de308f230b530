/* test_weights_load.c — release checkpoints served as stored (serve/weights_load.c): k3_tiny_a (bf16 trunk, MXFP4
 * experts) mmap'd is within 1e-5 of the float64 forward (or twice float32's own error) and near the float32 model,
 * views point into the mapping, a sharded copy (index + 2 shards) loads identically, and bad sharded checkpoints fail
 * with errors naming the index, shard, tensor. */
#include "model/model.h"
#include "serve/engine.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Logits [T, V] of ids through the engine in pieces of `piece` tokens (1: every token a decode step). */
static float *logits_of(const k3c_weights *w, const int32_t *ids, int64_t T, int64_t piece, k3c_err *err) {
    k3c_eng_dims d;
    k3c_eng_dims_of(&w->cfg, &d);
    k3c_eng_state st;
    k3c_eng_ws *ws = NULL;
    float *out = malloc(sizeof(float) * (size_t)(T * d.V));
    int rc = k3c_eng_state_init(&st, &d, T, err);
    if (!rc) rc = k3c_eng_ws_init(w, T, T, &ws, err);
    for (int64_t t = 0; !rc && t < T; t += piece) {
        k3c_eng_seg seg = {&st, 0, piece < T - t ? piece : T - t, NULL};
        rc = k3c_eng_forward(w, ws, ids + t, &seg, 1, NULL, seg.len, out + t * d.V, err);
    }
    k3c_eng_ws_free(ws);
    k3c_eng_state_free(&st);
    if (rc) {
        free(out);
        return NULL;
    }
    return out;
}

/* Logits [T, V] of the float32 training forward (f64 == NULL) or the float64 one, as float. */
static float *forward_logits(k3c_model *m32, k3c_model *m64, const int32_t *ids, int64_t T, k3c_err *err) {
    k3c_arena ar;
    k3c_model *m = m64 ? m64 : m32;
    size_t bytes = m64 ? k3c_model_plan_bytes_f64(m, T, 1) : k3c_model_plan_bytes_f32(m, T, 1);
    if ((m64 ? k3c_model_arena_init_f64 : k3c_model_arena_init_f32)(m, bytes, &ar, err)) return NULL;
    k3c_model_batch b = {.T = T, .n_docs = 1, .ids = ids};
    k3c_acts *acts;
    const int64_t n = T * m->cfg.vocab_size;
    float *out = malloc(sizeof(float) * (size_t)n), *l32;
    double *l64;
    int rc = m64 ? k3c_model_forward_f64(m, &b, &ar, &acts, NULL, &l64, err)
                 : k3c_model_forward_f32(m, &b, &ar, &acts, NULL, &l32, err);
    for (int64_t i = 0; !rc && i < n; i++) out[i] = m64 ? (float)l64[i] : l32[i];
    (m64 ? k3c_model_arena_free_f64 : k3c_model_arena_free_f32)(m, &ar);
    if (rc) {
        free(out);
        return NULL;
    }
    return out;
}

/* Worst row-wise relative error (L2 over the vocabulary). */
static double worst_row(const float *got, const float *ref, int64_t T, int64_t V) {
    double worst = 0;
    for (int64_t t = 0; t < T; t++) {
        double e = test_rel_err_f(got + t * V, ref + t * V, (size_t)V);
        if (!(e <= worst)) worst = e; /* NaN sticks */
    }
    return worst;
}

/* How write_sharded spoils its copy (all NULL / 0: a faithful copy). */
typedef struct {
    const char *drop;      /* a tensor left out of the shards and the index */
    const char *nan_scale; /* a weight_scale tensor whose first byte becomes 255 */
    int ghost_shard;       /* the index maps the last tensor to a shard file that does not exist */
} spoil;

/* Copies dir's config.json and model.safetensors into out as model.safetensors.index.json + 2 shards. */
static int write_sharded(const char *dir, const char *out, const spoil *sp, k3c_err *err) {
    char path[4600], cmd[9400];
    snprintf(cmd, sizeof cmd, "cp '%s/config.json' '%s/'", dir, out);
    if (system(cmd) != 0) return k3c_errf(err, K3C_EIO, "%s", cmd);
    k3c_checkpoint *ck;
    int rc = k3c_ckpt_open(dir, &ck, err);
    if (rc) return rc;
    const int n = k3c_ckpt_count(ck), half = n / 2;
    static const char *const shard[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    k3c_st_entry *e = calloc((size_t)n, sizeof *e);
    uint8_t *poisoned = NULL;
    int ne[2] = {0, 0};
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
    FILE *ix = fopen(path, "w");
    fprintf(ix, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    for (int s = 0, first = 1; s < 2; s++) {
        for (int i = s ? half : 0; i < (s ? n : half); i++) {
            const k3c_st_tensor *t = k3c_ckpt_at(ck, i);
            if (sp->drop && !strcmp(t->name, sp->drop)) continue;
            k3c_st_entry *x = &e[ne[s]++];
            x->name = t->name;
            x->dtype = t->dtype;
            x->ndim = t->ndim;
            memcpy(x->shape, t->shape, sizeof x->shape);
            x->data = t->data;
            if (sp->nan_scale && !strcmp(t->name, sp->nan_scale)) {
                poisoned = malloc(t->nbytes);
                memcpy(poisoned, t->data, t->nbytes);
                poisoned[0] = 255;
                x->data = poisoned;
            }
            const char *file = sp->ghost_shard && i == n - 1 ? "model-00003-of-00002.safetensors" : shard[s];
            fprintf(ix, "%s\n  \"%s\": \"%s\"", first ? "" : ",", t->name, file);
            first = 0;
        }
        snprintf(path, sizeof path, "%s/%s", out, shard[s]);
        if (!rc) rc = k3c_st_write(path, e, ne[s], NULL, err);
        ne[s] = 0;
    }
    fprintf(ix, "\n}}\n");
    fclose(ix);
    free(poisoned);
    free(e);
    k3c_ckpt_close(ck);
    return rc;
}

/* Counts matrices of each stored type and checks every view of a stored matrix points into the mapping. */
static void check_views(const k3c_weights *w) {
    int n_mx = 0, n_bf = 0, n_f32 = 0, inside = 1;
    for (int l = 0; l < w->cfg.num_layers; l++) {
        const k3c_weights_layer *L = &w->layer[l];
        for (int64_t e = 0; L->w1 && e < w->cfg.num_experts; e++) {
            const k3c_qmat *q[3] = {&L->w1[e], &L->w2[e], &L->w3[e]};
            for (int k = 0; k < 3; k++) {
                n_mx += q[k]->type == K3C_QMAT_MXFP4;
                char name[200];
                snprintf(name, sizeof name, "%smodel.layers.%d.block_sparse_moe.experts.%lld.w%d.weight_packed",
                         w->cfg.tensor_prefix, l, (long long)e,
                         k == 0   ? 1
                         : k == 1 ? 2
                                  : 3);
                const k3c_st_tensor *t = k3c_ckpt_find(w->ckpt, name);
                inside &= t && t->data == q[k]->w;
            }
        }
        const k3c_qmat *trunk[] = {&L->q_proj, &L->k_proj, &L->v_proj, &L->o_proj, &L->g_proj, &L->kv_a, &L->kv_b};
        for (size_t k = 0; k < sizeof trunk / sizeof trunk[0]; k++) {
            n_bf += trunk[k]->w && trunk[k]->type == K3C_QMAT_BF16;
            n_f32 += trunk[k]->w && trunk[k]->type == K3C_QMAT_F32;
        }
    }
    CHECK(n_mx == 3 * 16 * 12 && inside, "k3_tiny_a: %d MXFP4 expert views, all into the mapping (%d)", n_mx, inside);
    CHECK(n_bf > 0 && n_f32 == 0 && w->lm_head.type == K3C_QMAT_BF16, "k3_tiny_a: trunk kept bf16 (%d views, %d f32)",
          n_bf, n_f32);
}

static void test_tiny(void) {
    const char *dir = test_shared("golden/k3_tiny_a");
    char gpath[4200];
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    k3c_err err = {0};
    int32_t *ids = NULL;
    int64_t B, T;
    CHECK_OK(k3c_st_read_ids(gpath, "prompt_ids", &ids, &B, &T, &err), &err);
    k3c_model m, m64;
    k3c_weights wm, wq, ws;
    CHECK_OK(k3c_model_open_f32(dir, 0, &m, &err), &err);
    CHECK_OK(k3c_model_open_f64(dir, 0, &m64, &err), &err);
    /* The engine's exactness bound against the float64 training forward: 1e-5 relative, or twice the float32 training
     * forward's own distance from float64 where float32 rounding alone exceeds half of it (the rule of test_engine.c).
     * Two float32 paths each within it of the exact logits are within twice it of each other: the bound of the pair.
     * (Measured in the -O2 build: the pair within 6.7e-6, under 1e-5 itself; the -O1 sanitizer build vectorises the
     * reference ops' `omp simd` reductions differently and the pair reaches 1.3e-5.) */
    float *f32 = forward_logits(&m, NULL, ids, T, &err), *f64 = forward_logits(&m, &m64, ids, T, &err);
    CHECK(f32 && f64, "training forwards: %s", err.msg);
    const double floor32 = f32 && f64 ? worst_row(f32, f64, T, m.cfg.vocab_size) : 0, tol = fmax(1e-5, 2 * floor32);
    if (getenv("K3C_TEST_VERBOSE")) printf("  float32 training forward vs float64: %.3e\n", floor32);
    free(f32);
    CHECK_OK(k3c_weights_from_model(&m, &wm, &err), &err);
    CHECK_OK(k3c_weights_open(dir, &wq, &err), &err);
    check_views(&wq);
    const int64_t V = m.cfg.vocab_size;
    static const int64_t pieces[] = {1, 1 << 30, 5};
    static const char *const how[] = {"token by token", "one prefill", "prefill in pieces of 5"};
    for (int k = 0; k < 3; k++) {
        float *ref = logits_of(&wm, ids, T, pieces[k], &err), *got = logits_of(&wq, ids, T, pieces[k], &err);
        CHECK(ref && got, "%s", err.msg);
        char what[128];
        snprintf(what, sizeof what, "k3_tiny_a mmap'd (bf16 + MXFP4) vs float64 forward, %s: worst row", how[k]);
        if (got && f64) CHECK_LE(worst_row(got, f64, T, V), tol, what);
        if (ref && f64 && getenv("K3C_TEST_VERBOSE"))
            printf("  (the float32 model's engine vs float64, %s: %.3e)\n", how[k], worst_row(ref, f64, T, V));
        snprintf(what, sizeof what, "k3_tiny_a mmap'd (bf16 + MXFP4) vs float32 model, %s: worst row", how[k]);
        if (ref && got) CHECK_LE(worst_row(got, ref, T, V), 2 * tol, what);
        free(ref);
        free(got);
    }
    /* the sharded copy: the same tensors, so bit for bit the same logits */
    const char *sdir = test_tmpdir("test_weights_load");
    spoil none = {NULL, NULL, 0};
    CHECK_OK(write_sharded(dir, sdir, &none, &err), &err);
    CHECK_OK(k3c_weights_open(sdir, &ws, &err), &err);
    float *a = logits_of(&wq, ids, T, 5, &err), *b = logits_of(&ws, ids, T, 5, &err);
    CHECK(a && b && !memcmp(a, b, sizeof(float) * (size_t)(T * V)), "sharded copy (index + 2 shards): same logits");
    free(a);
    free(b);
    free(f64);
    k3c_weights_free(&ws);
    k3c_weights_free(&wq);
    k3c_weights_free(&wm);
    k3c_model_free_f32(&m);
    k3c_model_free_f64(&m64);
    free(ids);
}

/* Spoiled sharded copies: each refused with the reason, naming the file and the tensor; nothing stays open. */
static void test_bad(void) {
    const char *dir = test_shared("golden/k3_tiny_a");
    static const struct {
        spoil sp;
        const char *want[2];
    } cases[] = {
        {{"language_model.model.layers.3.self_attn.o_proj.weight", NULL, 0},
         {"model.safetensors.index.json: no tensor language_model.model.layers.3.self_attn.o_proj.weight", ""}},
        {{NULL, "language_model.model.layers.5.block_sparse_moe.experts.7.w2.weight_scale", 0},
         {"experts.7.w2.weight_scale: scale byte 255", "row 0, group 0"}},
        {{NULL, NULL, 1}, {"model.safetensors.index.json", "model-00003-of-00002.safetensors"}},
        {{"language_model.model.layers.2.block_sparse_moe.experts.0.w1.weight_scale", NULL, 0},
         {"experts.0.w1.weight_packed has no", "experts.0.w1.weight_scale"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char sub[64];
        snprintf(sub, sizeof sub, "test_weights_load_bad%zu", i);
        const char *out = test_tmpdir(sub);
        k3c_err err = {0};
        CHECK_OK(write_sharded(dir, out, &cases[i].sp, &err), &err);
        k3c_weights w;
        int rc = k3c_weights_open(out, &w, &err);
        CHECK(rc != K3C_OK && strstr(err.msg, cases[i].want[0]) && strstr(err.msg, cases[i].want[1]) && !w.ckpt,
              "spoiled copy %zu refused: %s", i, err.msg);
    }
}

int main(void) {
    test_tiny();
    test_bad();
    return test_summary();
}
