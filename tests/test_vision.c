/* test_vision.c — the vision tower and projector: every stage of the release-code golden (float32 and float64 builds,
 * both interpolation modes, packed images and a 2-frame clip), float64 finite differences of every vision op and of
 * the whole tower, and the errors of bad grids and checkpoints. Spec: docs/VISION.md. */
#include "test.h"

#include "ops/vision_ops.h"
#include "vision/vision.h"

#define GOLDEN_TOL 1e-5 /* norm-wise relative error of a float32 or float64 stage against the float32 golden */
#define FD_TOL 1e-6     /* float64 central differences vs the analytic backward */
#define PREFILL 0.25    /* gradient buffers start here: the backward must add */

static const char *golden_dir(void) { return test_shared("golden/k3_vision_tiny"); }

/* ---------------------------------------------------------------- golden helpers */
static double *st_f64(const k3c_safetensors *st, const char *name, size_t *n_out) {
    const k3c_st_tensor *t = k3c_st_find(st, name);
    if (!t) {
        CHECK(0, "golden tensor %s missing", name);
        return NULL;
    }
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    double *x = malloc(n * sizeof *x);
    k3c_err err = {0};
    CHECK_OK(k3c_st_read_f64(t, x, n, &err), &err);
    if (n_out) *n_out = n;
    return x;
}

static k3c_grid_thw *st_grid(const k3c_safetensors *st, const char *name, int *n) {
    const k3c_st_tensor *t = k3c_st_find(st, name);
    CHECK(t && t->dtype == K3C_I64 && t->ndim == 2 && t->shape[1] == 3, "%s: I64 [n, 3]", name);
    if (!t) return NULL;
    *n = (int)t->shape[0];
    k3c_grid_thw *g = malloc((size_t)*n * sizeof *g);
    memcpy(g, t->data, (size_t)*n * sizeof *g);
    return g;
}

/* Compares a stage (float or double, per `prec`) with the golden tensor; records the worst error. */
static double worst_[2];
static void cmp_stage(const k3c_safetensors *st, const char *name, const void *x, size_t n, k3c_dtype prec) {
    size_t gn = 0;
    double *ref = st_f64(st, name, &gn), *y = malloc((n ? n : 1) * sizeof *y);
    if (!ref) {
        free(y);
        return;
    }
    CHECK(gn == n, "%s: %zu elements, golden %zu", name, n, gn);
    for (size_t i = 0; i < n; i++) y[i] = prec == K3C_F64 ? ((const double *)x)[i] : ((const float *)x)[i];
    double e = test_rel_err_d(y, ref, n < gn ? n : gn);
    char what[160];
    snprintf(what, sizeof what, "%s %s", prec == K3C_F64 ? "f64" : "f32", name);
    CHECK_LE(e, GOLDEN_TOL, what);
    int k = prec == K3C_F64;
    worst_[k] = e > worst_[k] ? e : worst_[k];
    free(ref);
    free(y);
}

/* A tower of `prec` from the golden directory with the interpolation mode overridden. */
static k3c_vision *golden_tower(k3c_dtype prec, int interp) {
    k3c_err err = {0};
    k3c_config *cfg = calloc(1, sizeof *cfg);
    k3c_checkpoint *ck = NULL;
    k3c_vision *v = NULL;
    CHECK_OK(k3c_config_load(golden_dir(), cfg, &err), &err);
    CHECK(cfg->vision.present && cfg->vision.media_pad_id == 2040, "golden vision_config, media_placeholder 2040");
    cfg->vision.interp = interp;
    CHECK_OK(k3c_ckpt_open(golden_dir(), &ck, &err), &err);
    if (prec == K3C_F64) {
        CHECK_OK(k3c_vision_create_f64(&cfg->vision, 1, &v, &err), &err);
        if (v) CHECK_OK(k3c_vision_load_f64(v, ck, &err), &err);
    } else {
        CHECK_OK(k3c_vision_create_f32(&cfg->vision, 1, &v, &err), &err);
        if (v) CHECK_OK(k3c_vision_load_f32(v, ck, &err), &err);
    }
    k3c_ckpt_close(ck);
    free(cfg);
    return v;
}

/* The saved stages of one forward, as untyped pointers, so one walk serves both precisions. */
#define STAGE_FIELDS(X)                                                                                                \
    X(in)                                                                                                              \
    X(norm0)                                                                                                           \
    X(wqkv) X(q_rope) X(k_rope) X(v) X(attn_core) X(attn_out) X(resid1) X(norm1) X(fc0) X(mlp_act) X(mlp_out) X(out)

typedef struct {
    const char *name;
    int64_t cols;
} stage_col;

#define WALK(acts_t, A, PREC)                                                                                          \
    do {                                                                                                               \
        const acts_t *a_ = (A);                                                                                        \
        const int64_t L = a_->L, N = a_->N;                                                                            \
        char nm[160];                                                                                                  \
        if (!full) {                                                                                                   \
            snprintf(nm, sizeof nm, "%s.merged", pre);                                                                 \
            cmp_stage(st, nm, a_->merged, (size_t)(N * M), PREC);                                                      \
            snprintf(nm, sizeof nm, "%s.proj.out", pre);                                                               \
            cmp_stage(st, nm, a_->embeds, (size_t)(N * E), PREC);                                                      \
            break;                                                                                                     \
        }                                                                                                              \
        snprintf(nm, sizeof nm, "%s.patch_embed.conv", pre);                                                           \
        cmp_stage(st, nm, a_->conv, (size_t)(L * D), PREC);                                                            \
        snprintf(nm, sizeof nm, "%s.patch_embed.out", pre);                                                            \
        cmp_stage(st, nm, a_->embed, (size_t)(L * D), PREC);                                                           \
        snprintf(nm, sizeof nm, "%s.rope.freqs_cis_real_imag", pre);                                                   \
        cmp_stage(st, nm, a_->rope, (size_t)(L * dh), PREC);                                                           \
        for (int64_t l = 0; l < layers; l++) {                                                                         \
            const int64_t cols[] = {D, D, 3 * Q, Q, Q, Q, Q, D, D, D, F, F, D, D};                                     \
            const void *ptr[] = {a_->blk[l].in,      a_->blk[l].norm0, a_->blk[l].wqkv,      a_->blk[l].q_rope,        \
                                 a_->blk[l].k_rope,  a_->blk[l].v,     a_->blk[l].attn_core, a_->blk[l].attn_out,      \
                                 a_->blk[l].resid1,  a_->blk[l].norm1, a_->blk[l].fc0,       a_->blk[l].mlp_act,       \
                                 a_->blk[l].mlp_out, a_->blk[l].out};                                                  \
            static const char *const names[] = {"in",  "norm0",     "wqkv",     "q_rope", "k_rope",                    \
                                                "v",   "attn_core", "attn_out", "resid1", "norm1",                     \
                                                "fc0", "mlp_act",   "mlp_out",  "out"};                                \
            for (int k = 0; k < 14; k++) {                                                                             \
                snprintf(nm, sizeof nm, "%s.blocks.%lld.%s", pre, (long long)l, names[k]);                             \
                cmp_stage(st, nm, ptr[k], (size_t)(L * cols[k]), PREC);                                                \
            }                                                                                                          \
        }                                                                                                              \
        snprintf(nm, sizeof nm, "%s.encoder.final_norm", pre);                                                         \
        cmp_stage(st, nm, a_->final_norm, (size_t)(L * D), PREC);                                                      \
        const void *pp[] = {a_->merged, a_->merged, a_->proj_fc0, a_->proj_gelu, a_->proj_fc1, a_->embeds};            \
        const int64_t pc[] = {M, M, M, M, E, E};                                                                       \
        static const char *const pn[] = {"merged", "proj.in", "proj.fc0", "proj.gelu", "proj.fc1", "proj.out"};        \
        for (int k = 0; k < 6; k++) {                                                                                  \
            snprintf(nm, sizeof nm, "%s.%s", pre, pn[k]);                                                              \
            cmp_stage(st, nm, pp[k], (size_t)(N * pc[k]), PREC);                                                       \
        }                                                                                                              \
    } while (0)

/* One (interpolation, case, precision) run: forward on the golden inputs and compare every stage the golden has. */
static void golden_case(const k3c_safetensors *st, int interp, const char *cs, k3c_dtype prec) {
    k3c_vision *v = golden_tower(prec, interp);
    if (!v) return;
    char nm[128], pre[96];
    snprintf(nm, sizeof nm, "input.%s.grid_thws", cs);
    int n = 0;
    k3c_grid_thw *g = st_grid(st, nm, &n);
    snprintf(nm, sizeof nm, "input.%s.pixel_values", cs);
    size_t np = 0;
    double *px = st_f64(st, nm, &np);
    snprintf(pre, sizeof pre, "%s.f32.%s", interp == K3C_VISION_BICUBIC ? "bicubic" : "bilinear", cs);
    const int full = interp == K3C_VISION_BILINEAR; /* the golden keeps every stage of the bilinear runs */
    const k3c_vision_config *c = &v->cfg;
    const int64_t D = c->hidden, Q = c->qkv_hidden, F = c->intermediate, dh = Q / c->heads, layers = c->layers,
                  M = 4 * D, E = c->text_hidden;
    k3c_err err = {0};
    int64_t N = 0;
    if (g && px && prec == K3C_F64) {
        k3c_vision_acts_f64 *a = NULL;
        CHECK_OK(k3c_vision_forward_f64(v, px, g, n, &a, NULL, NULL, &N, &err), &err);
        if (a) WALK(struct k3c_vision_acts_f64, a, K3C_F64);
        k3c_vision_acts_free_f64(a);
    } else if (g && px) {
        float *pf = test_to_f32(px, np);
        k3c_vision_acts_f32 *a = NULL;
        CHECK_OK(k3c_vision_forward_f32(v, pf, g, n, &a, NULL, NULL, &N, &err), &err);
        if (a) WALK(struct k3c_vision_acts_f32, a, K3C_F32);
        k3c_vision_acts_free_f32(a);
        free(pf);
    }
    snprintf(nm, sizeof nm, "%s.tokens_per_item", pre);
    const k3c_st_tensor *tpi = k3c_st_find(st, nm);
    int64_t sum = 0;
    for (int64_t i = 0; tpi && tpi->dtype == K3C_I64 && i < tpi->shape[0]; i++) sum += ((const int64_t *)tpi->data)[i];
    CHECK(tpi && sum == N, "%s: %lld merged tokens, golden %lld", pre, (long long)N, (long long)sum);
    free(px);
    free(g);
    k3c_vision_free(v);
}

/* The stand-alone position tables (identity, down- and up-sampling, frames with the time term). */
static void golden_posemb(const k3c_safetensors *st) {
    k3c_vision *v = golden_tower(K3C_F64, K3C_VISION_BILINEAR);
    if (!v) return;
    static const k3c_grid_thw grids[] = {{1, 64, 64}, {1, 4, 6}, {1, 2, 2}, {1, 70, 40}, {3, 5, 7}, {4, 3, 3}};
    const k3c_posemb_sizes ps = {v->cfg.pos_emb_h, v->cfg.pos_emb_w, v->cfg.pos_emb_t, v->cfg.hidden,
                                 K3C_INTERP_BILINEAR};
    const double *table = (const double *)v->w + v->p[VP_POS].off;
    for (size_t i = 0; i < sizeof grids / sizeof *grids; i++) {
        const k3c_grid_thw *g = &grids[i];
        size_t n = (size_t)(g->t * g->h * g->w * ps.D);
        double *x = calloc(n, sizeof *x);
        float *xf = calloc(n, sizeof *xf), *tf = test_to_f32(table, v->p[VP_POS].n);
        k3c_err err = {0};
        CHECK_OK(k3c_posemb_fwd_f64(&ps, g, 1, table, x, &err), &err);
        CHECK_OK(k3c_posemb_fwd_f32(&ps, g, 1, tf, xf, &err), &err);
        char nm[96];
        snprintf(nm, sizeof nm, "bilinear.f32.posemb.%lldx%lldx%lld", (long long)g->t, (long long)g->h,
                 (long long)g->w);
        cmp_stage(st, nm, x, n, K3C_F64);
        cmp_stage(st, nm, xf, n, K3C_F32);
        free(x);
        free(xf);
        free(tf);
    }
    k3c_vision_free(v);
}

static void test_golden(void) {
    k3c_safetensors *st = NULL;
    k3c_err err = {0};
    char path[4200];
    snprintf(path, sizeof path, "%s/golden.safetensors", golden_dir());
    CHECK_OK(k3c_st_open(path, &st, &err), &err);
    if (!st) return;
    golden_posemb(st);
    static const char *const cases[] = {"img", "vid"};
    for (int interp = 0; interp < 2; interp++)
        for (int c = 0; c < 2; c++) {
            golden_case(st, interp, cases[c], K3C_F32);
            golden_case(st, interp, cases[c], K3C_F64);
        }
    printf("golden: worst stage relative error %.2e (float32 build), %.2e (float64 build)\n", worst_[0], worst_[1]);
    k3c_st_close(st);
}

/* ---------------------------------------------------------------- finite differences of each op */
typedef struct {
    int op; /* 0 gelu_tanh, 1 gelu_erf, 2 rope2d, 3 posemb, 4 attention, 5 merge */
    int64_t n_in, n_out;
    double *x, *r;  /* input being differentiated, random projection of the output */
    double *aux[3]; /* other inputs */
    const k3c_grid_thw *g;
    int ng;
    k3c_posemb_sizes ps;
    k3c_vit_attn_sizes as;
    int32_t cu[4];
    int which; /* attention: the input differentiated (0 q, 1 k, 2 v) */
} op_ctx;

static void op_fwd(op_ctx *c, double *y) {
    k3c_err err = {0};
    switch (c->op) {
    case 0: k3c_gelu_tanh_f64(c->n_in, c->x, y); break;
    case 1: k3c_gelu_erf_f64(c->n_in, c->x, y); break;
    case 2: k3c_rope2d_fwd_f64(c->as.L, c->as.H, c->as.dh, c->aux[0], c->x, y); break;
    case 3:
        memset(y, 0, (size_t)c->n_out * sizeof *y);
        k3c_posemb_fwd_f64(&c->ps, c->g, c->ng, c->x, y, &err);
        break;
    case 4: {
        double *qkv[3] = {c->aux[0], c->aux[1], c->aux[2]}, *lse = malloc((size_t)(c->as.L * c->as.H) * sizeof *lse);
        qkv[c->which] = c->x;
        k3c_vit_attention_fwd_f64(&c->as, c->cu, c->ng, qkv[0], qkv[1], qkv[2], y, lse, &err);
        free(lse);
        break;
    }
    default: k3c_tpool_merge_fwd_f64(c->g, c->ng, c->as.dh, 2, 2, c->x, y, &err);
    }
}

static double op_loss(void *ctx) {
    op_ctx *c = ctx;
    double *y = malloc((size_t)c->n_out * sizeof *y), s = 0;
    op_fwd(c, y);
    for (int64_t i = 0; i < c->n_out; i++) s += y[i] * c->r[i];
    free(y);
    return s;
}

static void op_bwd(op_ctx *c, double *dx) {
    k3c_err err = {0};
    switch (c->op) {
    case 0: k3c_gelu_tanh_bwd_f64(c->n_in, c->x, c->r, dx); break;
    case 1: k3c_gelu_erf_bwd_f64(c->n_in, c->x, c->r, dx); break;
    case 2: k3c_rope2d_bwd_f64(c->as.L, c->as.H, c->as.dh, c->aux[0], c->r, dx); break;
    case 3: CHECK_OK(k3c_posemb_bwd_f64(&c->ps, c->g, c->ng, c->r, dx, &err), &err); break;
    case 4: {
        const int64_t n = c->as.L * c->as.H * c->as.dh;
        double *qkv[3] = {c->aux[0], c->aux[1], c->aux[2]}, *o = malloc((size_t)n * sizeof *o),
               *lse = malloc((size_t)(c->as.L * c->as.H) * sizeof *lse);
        qkv[c->which] = c->x;
        k3c_vit_attention_fwd_f64(&c->as, c->cu, c->ng, qkv[0], qkv[1], qkv[2], o, lse, &err);
        double *d[3] = {NULL, NULL, NULL};
        d[c->which] = dx;
        CHECK_OK(k3c_vit_attention_bwd_f64(&c->as, c->cu, c->ng, qkv[0], qkv[1], qkv[2], o, lse, c->r, d[0], d[1], d[2],
                                           &err),
                 &err);
        free(o);
        free(lse);
        break;
    }
    default: CHECK_OK(k3c_tpool_merge_bwd_f64(c->g, c->ng, c->as.dh, 2, 2, c->r, dx, &err), &err);
    }
}

static void fd_op(op_ctx *c, const char *what) {
    double *g = test_filled((size_t)c->n_in, PREFILL);
    op_bwd(c, g);
    for (int64_t i = 0; i < c->n_in; i++) g[i] -= PREFILL;
    CHECK_LE(test_fd_rel_err(op_loss, c, c->x, (size_t)c->n_in, g), FD_TOL, what);
    free(g);
}

static void test_ops_fd(void) {
    static const k3c_grid_thw grids[3] = {{1, 2, 4}, {2, 2, 2}, {3, 4, 2}};
    const int64_t L = 8 + 8 + 24, H = 2, dh = 8;
    k3c_err err = {0};
    op_ctx c = {0};
    c.g = grids;
    c.ng = 3;
    c.as = (k3c_vit_attn_sizes){L, H, dh, 0.35};
    c.cu[0] = 0;
    for (int i = 0; i < 3; i++) c.cu[i + 1] = c.cu[i] + (int32_t)(grids[i].t * grids[i].h * grids[i].w);
    for (int op = 0; op < 2; op++) { /* GELUs */
        c.op = op;
        c.n_in = c.n_out = 200;
        c.x = test_randn(11, 200, 2.0);
        c.r = test_randn(12, 200, 1.0);
        fd_op(&c, op ? "fd gelu_erf" : "fd gelu_tanh");
        free(c.x);
        free(c.r);
    }
    c.op = 2; /* rope */
    c.n_in = c.n_out = L * H * dh;
    c.aux[0] = malloc((size_t)(L * dh) * sizeof(double));
    CHECK_OK(k3c_rope2d_table_f64(grids, 3, dh, 10000.0, c.aux[0], &err), &err);
    c.x = test_randn(13, (size_t)c.n_in, 1.0);
    c.r = test_randn(14, (size_t)c.n_out, 1.0);
    fd_op(&c, "fd rope2d");
    free(c.aux[0]);
    free(c.x);
    free(c.r);
    for (int mode = 0; mode < 2; mode++) { /* position table: down-, up-sampling, frames */
        c.op = 3;
        c.ps = (k3c_posemb_sizes){3, 3, 3, 6, mode};
        c.n_in = 3 * 3 * 6;
        c.n_out = L * 6;
        c.x = test_randn(15, (size_t)c.n_in, 1.0);
        c.r = test_randn(16, (size_t)c.n_out, 1.0);
        fd_op(&c, mode ? "fd posemb bicubic" : "fd posemb bilinear");
        free(c.x);
        free(c.r);
    }
    c.op = 4; /* attention, each input */
    c.n_in = c.n_out = L * H * dh;
    for (int k = 0; k < 3; k++) c.aux[k] = test_randn(17 + (uint64_t)k, (size_t)c.n_in, 1.0);
    c.r = test_randn(20, (size_t)c.n_out, 1.0);
    for (int w = 0; w < 3; w++) {
        c.which = w;
        c.x = test_randn(21 + (uint64_t)w, (size_t)c.n_in, 1.0);
        fd_op(&c, w == 0 ? "fd vit_attention dq" : w == 1 ? "fd vit_attention dk" : "fd vit_attention dv");
        free(c.x);
    }
    for (int k = 0; k < 3; k++) free(c.aux[k]);
    free(c.r);
    c.op = 5; /* merge: D = dh */
    c.n_in = L * dh;
    c.n_out = 5 * 4 * dh; /* 1·2 + 1·1 + 2·1 merged tokens */
    c.x = test_randn(24, (size_t)c.n_in, 1.0);
    c.r = test_randn(25, (size_t)c.n_out, 1.0);
    fd_op(&c, "fd tpool_merge");
    free(c.x);
    free(c.r);
}

/* ---------------------------------------------------------------- the whole tower, float64 */
static k3c_vision_config tiny_config(int interp) {
    k3c_vision_config vc = {0};
    vc.present = 1;
    vc.patch_size = 2;
    vc.hidden = vc.mm_hidden = 8;
    vc.intermediate = 12;
    vc.heads = 2;
    vc.layers = 2;
    vc.qkv_hidden = 16;
    vc.text_hidden = 6;
    vc.merge_kernel[0] = vc.merge_kernel[1] = 2;
    vc.pos_emb_h = vc.pos_emb_w = vc.pos_emb_t = 3;
    vc.ln_eps = 1e-5;
    vc.interp = interp;
    vc.media_pad_id = -1;
    return vc;
}

typedef struct {
    k3c_vision *v;
    double *pixels, *r;
    const k3c_grid_thw *g;
    int n;
    int64_t N;
} tower_ctx;

static double tower_loss(void *ctx) {
    tower_ctx *t = ctx;
    k3c_err err = {0};
    k3c_vision_acts_f64 *a = NULL;
    const double *y = NULL;
    int64_t N = 0;
    double s = 0;
    if (k3c_vision_forward_f64(t->v, t->pixels, t->g, t->n, &a, NULL, &y, &N, &err) == K3C_OK)
        for (int64_t i = 0; i < N * t->v->cfg.text_hidden; i++) s += y[i] * t->r[i];
    k3c_vision_acts_free_f64(a);
    return s;
}

static void test_tower_fd(int interp) {
    static const k3c_grid_thw grids[3] = {{1, 2, 4}, {2, 2, 2}, {3, 4, 2}}; /* down- and up-sampled, 2 and 3 frames */
    k3c_vision_config vc = tiny_config(interp);
    k3c_err err = {0};
    tower_ctx t = {0};
    CHECK_OK(k3c_vision_create_f64(&vc, 1, &t.v, &err), &err);
    if (!t.v) return;
    k3c_vision_init_f64(t.v, 7);
    t.g = grids;
    t.n = 3;
    const int64_t L = k3c_grid_tokens(grids, 3, &err), P = 3 * vc.patch_size * vc.patch_size;
    t.N = k3c_vision_merged_tokens(&vc, grids, 3, &err);
    CHECK(L == 40 && t.N == 5, "tiny grid sizes %lld %lld", (long long)L, (long long)t.N);
    t.pixels = test_randn(31, (size_t)(L * P), 1.0);
    t.r = test_randn(32, (size_t)(t.N * vc.text_hidden), 1.0);
    k3c_vision_acts_f64 *a = NULL;
    CHECK_OK(k3c_vision_forward_f64(t.v, t.pixels, grids, 3, &a, NULL, NULL, NULL, &err), &err);
    double *g = k3c_vision_grads(t.v), *w = k3c_vision_weights(t.v);
    const size_t np = k3c_vision_param_count(t.v);
    for (size_t i = 0; i < np; i++) g[i] = PREFILL;
    double *dpix = test_filled((size_t)(L * P), PREFILL);
    if (a) CHECK_OK(k3c_vision_backward_f64(t.v, a, t.r, dpix, &err), &err);
    k3c_vision_acts_free_f64(a);
    for (size_t i = 0; i < np; i++) g[i] -= PREFILL;
    for (int64_t i = 0; i < L * P; i++) dpix[i] -= PREFILL;
    char what[160];
    for (int i = 0; i < t.v->n; i++) { /* each parameter on its own, so a failure names the tensor */
        const k3c_vision_param *p = &t.v->p[i];
        snprintf(what, sizeof what, "fd tower %s %s", interp ? "bicubic" : "bilinear", p->name);
        CHECK_LE(test_fd_rel_err(tower_loss, &t, w + p->off, p->n, g + p->off), FD_TOL, what);
    }
    snprintf(what, sizeof what, "fd tower %s pixels", interp ? "bicubic" : "bilinear");
    CHECK_LE(test_fd_rel_err(tower_loss, &t, t.pixels, (size_t)(L * P), dpix), FD_TOL, what);
    free(dpix);
    free(t.pixels);
    free(t.r);
    k3c_vision_free(t.v);
}

/* Bad inputs are errors naming the problem, never a crash. */
static void test_errors(void) {
    k3c_vision_config vc = tiny_config(K3C_VISION_BILINEAR);
    k3c_err err = {0};
    k3c_vision *v = NULL;
    CHECK_OK(k3c_vision_create_f32(&vc, 0, &v, &err), &err);
    if (!v) return;
    float px[4 * 3 * 12] = {0};
    k3c_vision_acts_f32 *a = NULL;
    const k3c_grid_thw odd = {1, 1, 4}, frames = {4, 2, 2}, zero = {1, 0, 2};
    CHECK(k3c_vision_forward_f32(v, px, &odd, 1, &a, NULL, NULL, NULL, &err) == K3C_EINVAL && !a &&
              strstr(err.msg, "merge kernel"),
          "odd grid: %s", err.msg);
    CHECK(k3c_vision_forward_f32(v, px, &frames, 1, &a, NULL, NULL, NULL, &err) == K3C_EINVAL && !a &&
              strstr(err.msg, "frames"),
          "too many frames: %s", err.msg);
    CHECK(k3c_vision_forward_f32(v, px, &zero, 1, &a, NULL, NULL, NULL, &err) == K3C_EINVAL && !a, "empty grid: %s",
          err.msg);
    CHECK(k3c_vision_backward_f32(v, a, px, NULL, &err) != K3C_OK, "no gradients: refused");
    k3c_vision_free(v);
    /* the golden's config with a text checkpoint that has no vision tensors */
    k3c_config *cfg = calloc(1, sizeof *cfg);
    k3c_checkpoint *ck = NULL;
    CHECK_OK(k3c_config_load(golden_dir(), cfg, &err), &err);
    CHECK_OK(k3c_ckpt_open(test_shared("golden/k3_tiny_a"), &ck, &err), &err);
    if (ck && cfg->vision.present && k3c_vision_create_f32(&cfg->vision, 0, &v, &err) == K3C_OK) {
        CHECK(k3c_vision_load_f32(v, ck, &err) == K3C_EFORMAT &&
                  strstr(err.msg, "vision_tower.patch_embed.proj.weight"),
              "missing vision tensor named: %s", err.msg);
        k3c_vision_free(v);
    }
    k3c_ckpt_close(ck);
    free(cfg);
}

/* `k3c vision encode` on the golden's packed images and clip: the written tensors match the golden's float32 run. */
static void test_cli_encode(const char *cs) {
    const char *dir = golden_dir(), *tmp = test_tmpdir("vision_encode");
    char cmd[9000], out[4200], gold[4200];
    snprintf(out, sizeof out, "%s/%s.safetensors", tmp, cs);
    snprintf(gold, sizeof gold, "%s/golden.safetensors", dir);
    snprintf(cmd, sizeof cmd,
             "%s vision encode --model %s --input %s --pixels input.%s.pixel_values --grid input.%s.grid_thws --out %s "
             ">/dev/null 2>&1",
             test_k3c_bin(), dir, gold, cs, cs, out);
    CHECK(system(cmd) == 0, "%s", cmd);
    k3c_safetensors *o = NULL, *g = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_st_open(out, &o, &err), &err);
    CHECK_OK(k3c_st_open(gold, &g, &err), &err);
    if (o && g) {
        static const char *const mine[2] = {"merged", "image_embeds"}, *const theirs[2] = {"merged", "proj.out"};
        for (int k = 0; k < 2; k++) {
            const k3c_st_tensor *t = k3c_st_find(o, mine[k]);
            CHECK(t && t->dtype == K3C_F32 && t->ndim == 2, "encode output %s: F32 [N, width]", mine[k]);
            if (!t || t->dtype != K3C_F32) continue;
            char nm[96];
            snprintf(nm, sizeof nm, "bilinear.f32.%s.%s", cs, theirs[k]);
            cmp_stage(g, nm, t->data, (size_t)(t->shape[0] * t->shape[1]), K3C_F32);
        }
    }
    k3c_st_close(o);
    k3c_st_close(g);
    snprintf(cmd, sizeof cmd,
             "%s vision encode --model %s --input %s --pixels input.img.pixel_values --grid "
             "input.vid.grid_thws --out %s/bad.safetensors 2>&1",
             test_k3c_bin(), dir, gold, tmp);
    FILE *p = popen(cmd, "r");
    char buf[1024] = {0};
    size_t nr = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
    int rc = p ? pclose(p) : -1;
    CHECK(nr > 0 && rc != 0 && strstr(buf, "input.img.pixel_values") && strstr(buf, "[16, 3, 14, 14]"),
          "mismatched pixels and grid: clear error, got '%s'", buf);
    snprintf(cmd, sizeof cmd, "%s/bad.safetensors", tmp);
    CHECK(access(cmd, F_OK) != 0, "no output written on error");
}

int main(void) {
    test_golden();
    test_cli_encode("img");
    test_cli_encode("vid");
    k3c_set_num_threads(1); /* the FD sizes are tiny: on a shared machine threads cost far more than they save */
    test_ops_fd();
    test_tower_fd(K3C_VISION_BILINEAR);
    test_tower_fd(K3C_VISION_BICUBIC);
    test_errors();
    return test_summary();
}
