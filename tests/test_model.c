/* test_model.c — whole models against external references: Kimi-Linear (transformers) logits, loss and every gradient;
 * Kimi-K3 (independent C engine + float64 reference) logits, greedy tokens, loss and gradients; and a float64
 * finite-difference check of a tiny K3 model (lower-bound KDA, gated MLA, two AttnRes blocks, latent SiTU MoE); the
 * model as a chain of layer ranges (pipeline stages) equals the whole bit for bit. */
#include "test.h"
#include "ops/backend.h"
#include "model/golden.h"
#include "model/model.h"

static int32_t *read_i32(const k3c_safetensors *st, const char *name, int64_t *n) {
    const k3c_st_tensor *t = k3c_st_find(st, name);
    if (!t || t->dtype != K3C_I32) return NULL;
    *n = (int64_t)(t->nbytes / 4);
    int32_t *v = malloc(t->nbytes);
    memcpy(v, t->data, t->nbytes);
    return v;
}

/* Forward + backward of a golden model in float32; checks logits, loss and every gradient. */
static void golden_model(const char *dir, int chunk, double tol_out, double tol_grad) {
    char gpath[512];
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    k3c_err err = {0};
    k3c_model m;
    k3c_safetensors *gs;
    if (k3c_model_open_f32(dir, 1, &m, &err) != K3C_OK) {
        CHECK(0, "open %s: %s", dir, err.msg);
        return;
    }
    if (k3c_st_open(gpath, &gs, &err) != K3C_OK) {
        CHECK(0, "%s", err.msg);
        k3c_model_free_f32(&m);
        return;
    }
    m.kda_chunk = chunk;
    const k3c_st_tensor *ids_t = k3c_st_find(gs, "input_ids");
    int64_t n, B = ids_t->ndim == 2 ? ids_t->shape[0] : 1, T = ids_t->shape[ids_t->ndim - 1];
    int32_t *ids = read_i32(gs, "input_ids", &n);
    int32_t cu[17];
    for (int b = 0; b <= B; b++) cu[b] = (int32_t)(b * T);
    k3c_arena ar;
    CHECK_OK(k3c_arena_init(&ar, k3c_model_plan_bytes_f32(&m, B * T, (int)B), &err), &err);
    k3c_model_batch batch = {B * T, (int)B, ids, cu, NULL, 0, 0, NULL, NULL, NULL, NULL};
    k3c_acts *acts;
    float *logits;
    double loss;
    CHECK_OK(k3c_model_forward_f32(&m, &batch, &ar, &acts, &loss, &logits, &err), &err);
    CHECK_OK(k3c_model_backward_f32(&m, acts, 1.0, &err), &err);
    const k3c_st_tensor *gl = k3c_st_find(gs, "logits");
    size_t nl = (size_t)(B * T * m.cfg.vocab_size);
    float *ref = malloc(nl * sizeof *ref);
    CHECK_OK(k3c_st_read_f32(gl, ref, nl, &err), &err);
    char what[600];
    snprintf(what, sizeof what, "%s logits rel err (kda chunk %d)", dir, chunk);
    CHECK_LE(test_rel_err_f(logits, ref, nl), tol_out, what);
    double gloss;
    CHECK_OK(k3c_st_read_f64(k3c_st_find(gs, "loss"), &gloss, 1, &err), &err);
    snprintf(what, sizeof what, "%s loss rel err", dir);
    CHECK_LE(fabs(loss - gloss) / gloss, tol_out, what);
    k3c_golden_row *rows = calloc(2048, sizeof *rows);
    int nr = 0;
    CHECK_OK(k3c_golden_grads_f32(&m, gs, rows, 2048, &nr, &err), &err);
    double worst = 0;
    int bad = 0;
    for (int i = 0; i < nr; i++) {
        int zero = rows[i].ref_norm == 0;
        int ok = zero ? rows[i].abs_err == 0 : rows[i].rel_err <= tol_grad;
        if (!zero && rows[i].rel_err > worst) worst = rows[i].rel_err;
        if (!ok) {
            bad++;
            printf("  grad %s: rel %.3e abs %.3e\n", rows[i].name, rows[i].rel_err, rows[i].abs_err);
        }
    }
    CHECK(nr >= 70 && bad == 0, "%s: %d of %d gradients off", dir, bad, nr);
    snprintf(what, sizeof what, "%s worst gradient rel err over %d tensors", dir, nr);
    CHECK_LE(worst, tol_grad, what);
    free(rows);
    free(ref);
    free(ids);
    k3c_arena_free(&ar);
    k3c_st_close(gs);
    k3c_model_free_f32(&m);
}

/* Greedy continuation of the K3 golden's prompt must reproduce greedy_ids. */
static void k3_greedy(void) {
    const char *dir = test_shared("golden/k3_tiny_a");
    char gpath[512];
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    k3c_err err = {0};
    k3c_model m;
    k3c_safetensors *gs;
    if (k3c_model_open_f32(dir, 0, &m, &err) || k3c_st_open(gpath, &gs, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    int64_t np, ng;
    int32_t *prompt = read_i32(gs, "prompt_ids", &np), *want = read_i32(gs, "greedy_ids", &ng);
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(np + ng));
    memcpy(seq, prompt, sizeof(int32_t) * (size_t)np);
    k3c_arena ar;
    CHECK_OK(k3c_arena_init(&ar, k3c_model_plan_bytes_f32(&m, np + ng, 1), &err), &err);
    int same = 1;
    for (int64_t i = 0; i < ng && same; i++) {
        k3c_arena_reset(&ar, 0);
        k3c_model_batch b = {np + i, 1, seq, NULL, NULL, 0, 0, NULL, NULL, NULL, NULL};
        k3c_acts *acts;
        float *lg;
        if (k3c_model_forward_f32(&m, &b, &ar, &acts, NULL, &lg, &err)) {
            CHECK(0, "%s", err.msg);
            break;
        }
        const float *last = lg + (np + i - 1) * m.cfg.vocab_size;
        int32_t best = 0;
        for (int64_t v = 1; v < m.cfg.vocab_size; v++)
            if (last[v] > last[best]) best = (int32_t)v;
        seq[np + i] = best;
        same = best == want[i];
    }
    CHECK(same, "greedy continuation differs from greedy_ids");
    free(seq);
    free(prompt);
    free(want);
    k3c_arena_free(&ar);
    k3c_st_close(gs);
    k3c_model_free_f32(&m);
}

/* Loss of the f64 model on a fixed batch. */
static double loss_f64(k3c_model *m, const k3c_model_batch *b, k3c_arena *ar, k3c_acts **acts) {
    k3c_err err = {0};
    double loss = NAN;
    k3c_arena_reset(ar, 0);
    if (k3c_model_forward_f64(m, b, ar, acts, &loss, NULL, &err)) printf("forward: %s\n", err.msg);
    return loss;
}

/* Central finite differences of the whole tiny K3 model in float64, a few entries of every tensor. */
static void k3_tiny_fd(int chunk) {
    k3c_err err = {0};
    k3c_config cfg;
    if (k3c_config_load("configs/k3_test_tiny.json", &cfg, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    k3c_model m;
    CHECK_OK(k3c_model_create_f64(&cfg, 1, &m, &err), &err);
    m.kda_chunk = chunk;
    k3c_model_init_f64(&m, 7, 0.3);
    double *w = m.w;
    for (int i = 0; i < m.table.n; i++) { /* make every tensor (norms, AttnRes queries, router bias) non-trivial */
        const k3c_param *p = &m.table.p[i];
        for (int64_t j = 0; j < p->used; j++) {
            double r = k3c_normal_at(99 + (uint64_t)i, (uint64_t)j);
            if (strstr(p->name, "norm.weight"))
                w[p->offset + j] = 1 + 0.2 * r;
            else if (strstr(p->name, "res_proj") || strstr(p->name, "correction_bias"))
                w[p->offset + j] = 0.3 * r;
            else if (strstr(p->name, "A_log"))
                w[p->offset + j] = 0.5 * r;
        }
    }
    int32_t ids[13], cu[3] = {0, 7, 13};
    for (int t = 0; t < 13; t++) ids[t] = (int32_t)((t * 11 + 3) % 32);
    k3c_model_batch b = {13, 2, ids, cu, NULL, 0, 0, NULL, NULL, NULL, NULL};
    k3c_arena ar;
    CHECK_OK(k3c_arena_init(&ar, k3c_model_plan_bytes_f64(&m, 13, 2), &err), &err);
    k3c_acts *acts;
    loss_f64(&m, &b, &ar, &acts);
    memset(m.g, 0, m.table.total * sizeof(double));
    CHECK_OK(k3c_model_backward_f64(&m, acts, 1.0, &err), &err);
    double *g = m.g, worst = 0, num = 0, den = 0;
    const char *worst_name = "";
    int checked = 0;
    for (int i = 0; i < m.table.n; i++) {
        const k3c_param *p = &m.table.p[i];
        if (p->kind == K3C_PK_ROUTER_BIAS) continue;
        for (int k = 0; k < 3; k++) {
            int64_t j = (int64_t)(k3c_uniform_at(5 + (uint64_t)i, (uint64_t)k) * (double)p->used);
            double *x = &w[p->offset + j], x0 = *x, h = 2e-6 * (fabs(x0) > 1 ? fabs(x0) : 1);
            *x = x0 + h;
            double lp = loss_f64(&m, &b, &ar, &acts);
            *x = x0 - h;
            double lm = loss_f64(&m, &b, &ar, &acts);
            *x = x0;
            double fd = (lp - lm) / (2 * h), an = g[p->offset + j];
            /* round-off of the loss difference is ~1e-16·|loss|/h ≈ 1e-10 absolute: entries far below that scale
               are judged absolutely, the rest relatively */
            double e = fabs(fd - an) / fmax(fmax(fabs(fd), fabs(an)), 1e-4);
            num += (fd - an) * (fd - an);
            den += an * an;
            if (e > worst) {
                worst = e;
                worst_name = p->name;
            }
            checked++;
        }
    }
    char what[256];
    snprintf(what, sizeof what, "tiny K3 f64 finite differences, normwise over %d entries (chunk %d)", checked, chunk);
    CHECK_LE(sqrt(num / den), 1e-7, what);
    /* per entry, round-off (~1e-16·|loss|/h) dominates the small entries: bound set from that, not from the result */
    snprintf(what, sizeof what, "tiny K3 f64 finite differences, worst entry (%s)", worst_name);
    CHECK_LE(worst, 1e-5, what);
    k3c_arena_free(&ar);
    k3c_model_free_f64(&m);
}

/* Per-layer recomputation gives the same gradients bit for bit and needs less activation memory. */
static void recompute_same(void) {
    k3c_err err = {0};
    k3c_config cfg;
    if (k3c_config_load("configs/k3_test_tiny.json", &cfg, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    int32_t ids[40], cu[4] = {0, 11, 29, 40};
    for (int t = 0; t < 40; t++) ids[t] = (int32_t)((t * 7 + 5) % 32);
    k3c_model_batch b = {40, 3, ids, cu, NULL, 0, 0, NULL, NULL, NULL, NULL};
    double *g[3] = {NULL, NULL, NULL}, loss[3];
    float smax[3][64];
    size_t plan[3], total = 0;
    const int n_smax = (int)(cfg.num_layers * cfg.mla_heads);
    for (int mode = 0; mode < 3; mode++) {
        k3c_model m;
        CHECK_OK(k3c_model_create_f32(&cfg, 1, &m, &err), &err);
        k3c_model_init_f32(&m, 3, 0.3);
        m.kda_chunk = 16;
        for (int l = 0; l < cfg.num_layers; l++) m.recompute[l] = mode == 2 || (mode == 1 && l % 2 == 1);
        for (int i = 0; i < 64; i++) smax[mode][i] = 0;
        k3c_step_stats stats; /* QK-Clip statistics must not depend on recomputation either */
        CHECK_OK(k3c_step_stats_init_f32(&m, 40, &stats, &err), &err);
        CHECK(stats.smax && n_smax <= 64, "step statistics have no room for S_max (%d heads)", n_smax);
        m.stats = &stats;
        plan[mode] = k3c_model_plan_bytes_f32(&m, 40, 3);
        k3c_arena ar;
        CHECK_OK(k3c_arena_init(&ar, plan[mode], &err), &err);
        k3c_acts *acts;
        CHECK_OK(k3c_model_forward_f32(&m, &b, &ar, &acts, &loss[mode], NULL, &err), &err);
        CHECK_OK(k3c_model_backward_f32(&m, acts, 1.0, &err), &err);
        total = m.table.total;
        g[mode] = malloc(total * sizeof(double));
        for (size_t i = 0; i < total; i++) g[mode][i] = ((float *)m.g)[i];
        if (stats.smax && n_smax <= 64) memcpy(smax[mode], stats.smax, sizeof(float) * (size_t)n_smax);
        k3c_arena_free(&ar);
        k3c_step_stats_free_f32(&m, &stats);
        k3c_model_free_f32(&m);
    }
    for (int mode = 1; mode < 3; mode++) {
        CHECK(loss[mode] == loss[0], "recompute mode %d: loss %.9g vs %.9g", mode, loss[mode], loss[0]);
        CHECK(memcmp(g[mode], g[0], total * sizeof(double)) == 0, "recompute mode %d: gradients differ", mode);
        CHECK(memcmp(smax[mode], smax[0], sizeof smax[0]) == 0 && smax[0][2 * 2] != 0,
              "recompute mode %d: MLA S_max differs", mode);
        CHECK(plan[mode] < plan[mode - 1], "recompute mode %d plans %zu bytes, not less than %zu", mode, plan[mode],
              plan[mode - 1]);
    }
    /* Through another backend table (a copy of the CPU reference: ops/backend.h): the model moves its parameters into
     * that backend's memory and back, takes its arena from it, and computes the same bits. */
    k3c_backend_f32 copy = *k3c_backend_cpu_f32();
    k3c_model m;
    CHECK_OK(k3c_model_create_f32(&cfg, 1, &m, &err), &err);
    k3c_model_init_f32(&m, 3, 0.3);
    m.kda_chunk = 16;
    float smax_b[64] = {0};
    void *w0 = m.w;
    CHECK_OK(k3c_model_use_backend_f32(&m, &copy, &err), &err);
    k3c_step_stats stats_b; /* in the backend's memory: the host reads it through download */
    CHECK_OK(k3c_step_stats_init_f32(&m, 40, &stats_b, &err), &err);
    m.stats = &stats_b;
    CHECK(m.backend == &copy && m.w != w0, "use_backend did not move the parameters");
    k3c_arena ar;
    CHECK_OK(k3c_model_arena_init_f32(&m, plan[0], &ar, &err), &err);
    k3c_acts *acts;
    double loss_b;
    CHECK_OK(k3c_model_forward_f32(&m, &b, &ar, &acts, &loss_b, NULL, &err), &err);
    CHECK_OK(k3c_model_backward_f32(&m, acts, 1.0, &err), &err);
    if (stats_b.smax && n_smax <= 64)
        CHECK_OK(copy.download(smax_b, stats_b.smax, sizeof(float) * (size_t)n_smax, &err), &err);
    k3c_model_arena_free_f32(&m, &ar);
    k3c_step_stats_free_f32(&m, &stats_b);
    m.stats = NULL;
    CHECK_OK(k3c_model_use_backend_f32(&m, NULL, &err), &err);
    int same = loss_b == loss[0] && memcmp(smax_b, smax[0], sizeof smax_b) == 0;
    for (size_t i = 0; i < total; i++) same &= ((float *)m.g)[i] == g[0][i];
    CHECK(same && m.backend == NULL, "a copy of the CPU backend table gives different results");
    k3c_model_free_f32(&m);
    for (int mode = 0; mode < 3; mode++) free(g[mode]);
}

/* The model as a chain of layer ranges (pipeline stages, parallel/pp.c): each stage its own model and arena, the boundary
 * tensors (AttnRes blocks and partial sum) copied forward and their gradients back. The loss and the gradients summed
 * over the stages equal the whole model's bit for bit: every stream gradient is summed in the same order. */
static void ranges_same(void) {
    k3c_err err = {0};
    k3c_config cfg;
    if (k3c_config_load("configs/k3_test_tiny.json", &cfg, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    enum { T = 40, MAXS = 5 };
    int32_t ids[T], cu[4] = {0, 11, 29, T};
    for (int t = 0; t < T; t++) ids[t] = (int32_t)((t * 7 + 5) % 32);
    k3c_model_batch b = {.T = T, .n_docs = 3, .ids = ids, .cu_seqlens = cu};
    static const int cuts[][MAXS] = {{0, 4}, {0, 2, 4}, {0, 1, 2, 3, 4}, {0, 3, 4}, {0, 1, 4}};
    static const int n_cuts[] = {2, 3, 5, 3, 3};
    const int64_t D = cfg.hidden_size;
    float *ref = NULL;
    double ref_loss = 0;
    for (int c = 0; c < 5; c++) {
        const int S = n_cuts[c] - 1;
        k3c_model m[MAXS];
        k3c_arena ar[MAXS];
        k3c_acts *acts[MAXS];
        float *bnd[MAXS], *grd[MAXS]; /* boundary after stage s, its gradient */
        double loss = 0;
        for (int s = 0; s < S; s++) {
            CHECK_OK(k3c_model_create_f32(&cfg, 1, &m[s], &err), &err);
            k3c_model_init_f32(&m[s], 3, 0.3);
            m[s].kda_chunk = 16;
            CHECK_OK(
                k3c_arena_init(&ar[s], k3c_model_plan_bytes_range_f32(&m[s], T, 3, cuts[c][s], cuts[c][s + 1]), &err),
                &err);
            float *in[K3C_ATTNRES_MAX_SOURCES], *x[K3C_ATTNRES_MAX_SOURCES];
            for (int k = 0; s > 0 && k < K3C_ATTNRES_MAX_SOURCES; k++) in[k] = bnd[s - 1] + k * T * D;
            double l;
            CHECK_OK(k3c_model_forward_range_f32(&m[s], &b, cuts[c][s], cuts[c][s + 1], in, &ar[s], &acts[s], &l, &err),
                     &err);
            loss += l;
            int n = s + 1 < S ? k3c_acts_boundary_f32(acts[s], 0, x) : 0;
            bnd[s] = malloc(sizeof(float) * (size_t)(n * T * D + 1));
            grd[s] = malloc(sizeof(float) * (size_t)(n * T * D + 1));
            for (int k = 0; k < n; k++) memcpy(bnd[s] + k * T * D, x[k], sizeof(float) * T * D);
        }
        float *g = calloc(m[0].table.total, sizeof(float));
        for (int s = S - 1; s >= 0; s--) {
            const float *dout[K3C_ATTNRES_MAX_SOURCES];
            float *dx[K3C_ATTNRES_MAX_SOURCES];
            for (int k = 0; k < K3C_ATTNRES_MAX_SOURCES; k++) dout[k] = grd[s] + k * T * D;
            CHECK_OK(k3c_model_backward_range_f32(&m[s], acts[s], 1.0, s + 1 < S ? dout : NULL, &err), &err);
            int n = s > 0 ? k3c_acts_boundary_f32(acts[s], 1, dx) : 0;
            for (int k = 0; k < n; k++) memcpy(grd[s - 1] + k * T * D, dx[k], sizeof(float) * T * D);
            for (size_t i = 0; i < m[s].table.total; i++) g[i] += ((float *)m[s].g)[i];
        }
        if (c == 0) {
            ref = g, ref_loss = loss;
        } else {
            CHECK(loss == ref_loss && memcmp(g, ref, sizeof(float) * m[0].table.total) == 0,
                  "stages at %d..%d: loss %.9g vs %.9g, gradients %s", cuts[c][1], cuts[c][S - 1], loss, ref_loss,
                  memcmp(g, ref, sizeof(float) * m[0].table.total) ? "differ" : "equal");
            free(g);
        }
        for (int s = 0; s < S; s++) {
            free(bnd[s]);
            free(grd[s]);
            k3c_arena_free(&ar[s]);
            k3c_model_free_f32(&m[s]);
        }
    }
    free(ref);
    k3c_err bad = {0};
    k3c_model m;
    k3c_arena ar = {0};
    k3c_acts *acts;
    CHECK_OK(k3c_model_create_f32(&cfg, 1, &m, &err), &err);
    CHECK(k3c_model_forward_range_f32(&m, &b, 2, 4, NULL, &ar, &acts, NULL, &bad) == K3C_EINVAL &&
              strstr(bad.msg, "without the boundary"),
          "a later stage without its boundary: %s", bad.msg);
    k3c_model_free_f32(&m);
}

/* Checkpoint-name lookup: plain names, per-expert slices of stacked entries, the transformers dense-MLP alias. */
static void name_lookup(void) {
    k3c_err err = {0};
    k3c_config cfg;
    if (k3c_config_load("configs/k3_test_tiny.json", &cfg, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    k3c_param_table t;
    CHECK_OK(k3c_params_build(&cfg, &t, &err), &err);
    int e;
    int i = k3c_params_lookup(&t, "language_model.model.layers.1.block_sparse_moe.experts.3.w2.weight", &e);
    CHECK(i >= 0 && e == 3 && t.p[i].stack == 4, "expert slice lookup (i %d e %d)", i, e);
    CHECK(k3c_params_lookup(&t, "language_model.model.layers.1.block_sparse_moe.experts.4.w2.weight", &e) < 0,
          "expert 4 of 4");
    CHECK(k3c_params_lookup(&t, "language_model.model.layers.1.block_sparse_moe.experts.03.w2.weight", &e) < 0,
          "leading zero");
    CHECK(k3c_params_lookup(&t, "language_model.model.layers.1.block_sparse_moe.experts.%d.w2.weight", &e) < 0,
          "pattern itself");
    i = k3c_params_lookup(&t, "language_model.model.layers.0.block_sparse_moe.up_proj.weight", &e);
    CHECK(i >= 0 && e == -1 && strstr(t.p[i].name, "layers.0.mlp.up_proj.weight"), "dense alias");
    i = k3c_params_lookup(&t, "language_model.lm_head.weight", &e);
    CHECK(i == t.n - 1 && e == -1, "lm_head is the last entry");
    CHECK(k3c_params_lookup(&t, "language_model.lm_head.bias", &e) < 0, "unknown name");
    k3c_params_free(&t);
}

int main(void) {
    name_lookup();
    recompute_same();
    ranges_same();
    golden_model(test_shared("golden/kimi_linear_tiny_a"), 64, 1e-4, 1e-3);
    golden_model(test_shared("golden/kimi_linear_tiny_a"), 0, 1e-4, 1e-3);
    golden_model(test_shared("golden/k3_tiny_a"), 16, 1e-4, 1e-3);
    golden_model(test_shared("golden/k3_tiny_a"), 64, 1e-4, 1e-3);
    k3_greedy();
    k3_tiny_fd(64);
    k3_tiny_fd(16);
    k3_tiny_fd(0);
    return test_summary();
}
