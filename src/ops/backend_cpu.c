/* backend_cpu.c — the CPU reference's op table (ops/backend.h): the src/ops functions of this precision, with thin
 * adapters where a signature differs (void helpers, the ignored ctx, the KDA algorithm choice). docs/CODE.md "Ops". */
#include "base/real.h"
#include "ops/backend.h"

#include <string.h>

static void *cpu_alloc(size_t bytes) { return k3c_aligned_alloc(bytes); }
static void cpu_free(void *p) { k3c_aligned_free(p); }
static int cpu_sync(k3c_err *err) {
    (void)err;
    return K3C_OK;
}

static int cpu_copy(void *dst, const void *src, size_t bytes, k3c_err *err) {
    (void)err;
    if (bytes) memcpy(dst, src, bytes);
    return K3C_OK;
}

/* The CPU ops take every setting their sizes allow: any KDA chunk that is a multiple of 16 up to the maximum, or the
 * recurrence; any attention tile up to the maximum. */
static int cpu_supports(k3c_backend_feature f, int64_t v) {
    switch (f) {
    case K3C_FEATURE_KDA_CHUNK: return v == 0 || (v > 0 && v % 16 == 0 && v <= K3C_KDA_MAX_CHUNK);
    case K3C_FEATURE_ATTENTION_BLOCK: return v >= 0 && v <= K3C_ATTN_MAX_BLOCK;
    }
    return 0;
}

static int zero(real *x, int64_t n, k3c_err *err) {
    (void)err;
    k3c_zero(x, n);
    return K3C_OK;
}
static int add(int64_t n, const real *x, real *y, k3c_err *err) {
    if (n < 0) return k3c_errf(err, K3C_EINVAL, "add: n = %lld", (long long)n);
    k3c_add(n, x, y);
    return K3C_OK;
}
/* Rows may not overlap (ld ≥ cols) where there is more than one. */
static int copy2d(int64_t rows, int64_t cols, const real *src, int64_t ld_src, real *dst, int64_t ld_dst, int acc,
                  k3c_err *err) {
    if (rows < 0 || cols < 0 || (rows > 1 && (ld_src < cols || ld_dst < cols)))
        return k3c_errf(err, K3C_EINVAL, "copy2d: rows %lld, cols %lld, ld_src %lld, ld_dst %lld", (long long)rows,
                        (long long)cols, (long long)ld_src, (long long)ld_dst);
    k3c_copy2d(rows, cols, src, ld_src, dst, ld_dst, acc);
    return K3C_OK;
}
static int sigmoid(int64_t n, const real *x, real *y, k3c_err *err) {
    (void)err;
    k3c_sigmoid(n, x, y);
    return K3C_OK;
}
static int sigmoid_bwd(int64_t n, const real *y, const real *dy, real *dx, k3c_err *err) {
    (void)err;
    k3c_sigmoid_bwd(n, y, dy, dx);
    return K3C_OK;
}

static int linear_fwd(void *ctx, const k3c_linear_sizes *s, const real *x, const real *W, real *y, k3c_err *err) {
    (void)ctx;
    return k3c_linear_fwd(s, x, W, y, err);
}
static int linear_bwd(void *ctx, const k3c_linear_sizes *s, const real *x, const real *W, const real *dy, real *dx,
                      real *dW, k3c_err *err) {
    (void)ctx;
    return k3c_linear_bwd(s, x, W, dy, dx, dW, err);
}

/* ---------------------------------------------------------------- the training step (float tables) */
static int optim_open(void *ctx, const k3c_optim *o, const k3c_param_table *t, void **inst, k3c_err *err) {
    (void)ctx, (void)t;
    *inst = NULL; /* k3c_optim_init already allocated the Newton–Schulz workspace */
    return k3c_optim_check_cpu(o, err);
}
static void optim_close(void *inst) { (void)inst; }
static int optim_step(void *inst, k3c_optim *o, const k3c_param_table *t, int first, int last, float *w, const float *g,
                      float *state, double lr, int64_t step, k3c_err *err) {
    (void)inst;
    return k3c_optim_step_entries(o, t, first, last, w, g, state, lr, step, err);
}
static int clip_grad_norm(void *inst, const k3c_param_table *t, float *g, double max_norm, double *norm, k3c_err *err) {
    (void)inst, (void)err;
    *norm = max_norm > 0 ? k3c_clip_grad_norm(t, g, max_norm) : k3c_grad_norm(t, g);
    return K3C_OK;
}
/* The router logits in, the unbiased scores s = sigmoid(logit) computed in double and rounded to float (the router's
 * own rule) in front of k3c_qb_update's workspace. */
static size_t scores_bytes(int64_t m, int64_t n) { return ((size_t)(m * n) * sizeof(float) + 63) / 64 * 64; }
static size_t quantile_balance_workspace(int mode, int64_t m, int64_t n) {
    return scores_bytes(m, n) + k3c_qb_workspace(mode, m, n);
}
static int quantile_balance(void *ctx, int mode, const float *logits, const float *cutoff, int64_t m, int64_t n,
                            int64_t k, float *b, void *ws, k3c_err *err) {
    (void)ctx;
    float *s = ws;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m * n; i++) s[i] = (float)k3c_sigmoid_d((double)logits[i]);
    int64_t rc = k3c_qb_update(mode, s, cutoff, NULL, m, n, k, b, (char *)ws + scores_bytes(m, n), err);
    return rc < 0 ? (int)rc : K3C_OK;
}
static int bias_balance(void *ctx, const float *logits, int64_t m, int64_t n, int64_t k, double gamma, float *b,
                        void *ws, k3c_err *err) {
    (void)ctx;
    return k3c_bias_balance(logits, m, n, k, gamma, b, ws, err);
}
static int qk_clip(void *ctx, const k3c_config *cfg, const k3c_param_table *t, float *w, const float *s_max, double tau,
                   int32_t *n_clipped, k3c_err *err) {
    (void)ctx;
    int n = 0, rc = k3c_qk_clip(cfg, t, w, s_max, tau, &n, err);
    *n_clipped = rc == K3C_ENUMERIC ? -1 : n;
    return rc;
}

static size_t kda_fwd_ws(const k3c_kda_dims *d) {
    return d->chunk ? k3c_kda_chunk_fwd_workspace(d) : k3c_kda_recurrent_fwd_workspace(d);
}
static size_t kda_bwd_ws(const k3c_kda_dims *d) {
    return d->chunk ? k3c_kda_chunk_bwd_workspace(d) : k3c_kda_recurrent_bwd_workspace(d);
}
static int kda_fwd(const k3c_kda_dims *d, const int32_t *cu, const real *q, const real *k, const real *v, const real *g,
                   const real *beta, const real *h0, real *o, real *ht, void *ws, k3c_err *err) {
    return d->chunk ? k3c_kda_chunk_fwd(d, cu, q, k, v, g, beta, h0, o, ht, ws, err)
                    : k3c_kda_recurrent_fwd(d, cu, q, k, v, g, beta, h0, o, ht, ws, err);
}
static int kda_bwd(const k3c_kda_dims *d, const int32_t *cu, const real *q, const real *k, const real *v, const real *g,
                   const real *beta, const real *h0, const real *dout, const real *dht, real *dq, real *dk, real *dv,
                   real *dg, real *dbeta, real *dh0, void *ws, k3c_err *err) {
    return d->chunk
               ? k3c_kda_chunk_bwd(d, cu, q, k, v, g, beta, h0, dout, dht, dq, dk, dv, dg, dbeta, dh0, ws, err)
               : k3c_kda_recurrent_bwd(d, cu, q, k, v, g, beta, h0, dout, dht, dq, dk, dv, dg, dbeta, dh0, ws, err);
}

static size_t attention_fwd_ws(const k3c_attention_sizes *s) {
    (void)s;
    return 0;
}

static int moe_fwd(void *ctx, const k3c_moe_sizes *s, const real *x, const int32_t *ids, const real *w, const real *w1,
                   const real *w3, const real *w2, real *y, void *saved, void *ws, k3c_err *err) {
    (void)ctx;
    return k3c_moe_fwd(s, x, ids, w, w1, w3, w2, y, saved, ws, err);
}
static int moe_bwd(void *ctx, const k3c_moe_sizes *s, const real *x, const int32_t *ids, const real *w, const real *w1,
                   const real *w3, const real *w2, const void *saved, const real *dy, real *dx, real *dw1, real *dw3,
                   real *dw2, real *dw, void *ws, k3c_err *err) {
    (void)ctx;
    return k3c_moe_bwd(s, x, ids, w, w1, w3, w2, saved, dy, dx, dw1, dw3, dw2, dw, ws, err);
}
/* The permutation steps and the bf16 packing (void helpers) for expert parallelism. */
static int moe_gather(int64_t rows, int64_t k, int64_t dim, const int32_t *perm, const real *x, real *xperm,
                      k3c_err *err) {
    (void)err;
    k3c_moe_gather(rows, k, dim, perm, x, xperm);
    return K3C_OK;
}
static int moe_gather_bwd(int64_t tokens, int64_t k, int64_t dim, const int32_t *pos, const real *dxperm, real *dx,
                          k3c_err *err) {
    (void)err;
    k3c_moe_gather_bwd(tokens, k, dim, pos, dxperm, dx);
    return K3C_OK;
}
static int moe_combine(int64_t tokens, int64_t k, int64_t dim, const int32_t *pos, const real *w, const real *yperm,
                       real *y, k3c_err *err) {
    (void)err;
    k3c_moe_combine(tokens, k, dim, pos, w, yperm, y);
    return K3C_OK;
}
static int moe_combine_bwd(int64_t tokens, int64_t k, int64_t dim, const int32_t *pos, const real *w, const real *yperm,
                           const real *dy, real *dyperm, real *dw, k3c_err *err) {
    (void)err;
    k3c_moe_combine_bwd(tokens, k, dim, pos, w, yperm, dy, dyperm, dw);
    return K3C_OK;
}
static int to_bf16(int64_t n, const real *x, uint16_t *y, k3c_err *err) {
    (void)err;
    k3c_to_bf16(n, x, y);
    return K3C_OK;
}
static int from_bf16(int64_t n, const uint16_t *x, real *y, k3c_err *err) {
    (void)err;
    k3c_from_bf16(n, x, y);
    return K3C_OK;
}
static int mlp_fwd(void *ctx, const k3c_mlp_sizes *s, const real *x, const real *wg, const real *wu, const real *wd,
                   real *y, void *saved, void *ws, k3c_err *err) {
    (void)ctx;
    return k3c_mlp_fwd(s, x, wg, wu, wd, y, saved, ws, err);
}
static int mlp_bwd(void *ctx, const k3c_mlp_sizes *s, const real *x, const real *wg, const real *wu, const real *wd,
                   const void *saved, const real *dy, real *dx, real *dwg, real *dwu, real *dwd, void *ws,
                   k3c_err *err) {
    (void)ctx;
    return k3c_mlp_bwd(s, x, wg, wu, wd, saved, dy, dx, dwg, dwu, dwd, ws, err);
}

/* Vision ops: the void elementwise helpers return 0; L and N are implied by the host grids. */
static int gelu_tanh(int64_t n, const real *x, real *y, k3c_err *err) {
    (void)err;
    k3c_gelu_tanh(n, x, y);
    return K3C_OK;
}
static int gelu_tanh_bwd(int64_t n, const real *x, const real *dy, real *dx, k3c_err *err) {
    (void)err;
    k3c_gelu_tanh_bwd(n, x, dy, dx);
    return K3C_OK;
}
static int gelu_erf(int64_t n, const real *x, real *y, k3c_err *err) {
    (void)err;
    k3c_gelu_erf(n, x, y);
    return K3C_OK;
}
static int gelu_erf_bwd(int64_t n, const real *x, const real *dy, real *dx, k3c_err *err) {
    (void)err;
    k3c_gelu_erf_bwd(n, x, dy, dx);
    return K3C_OK;
}
static int rope2d_fwd(int64_t rows, int64_t H, int64_t dh, const real *cs, const real *x, real *y, k3c_err *err) {
    (void)err;
    k3c_rope2d_fwd(rows, H, dh, cs, x, y);
    return K3C_OK;
}
static int rope2d_bwd(int64_t rows, int64_t H, int64_t dh, const real *cs, const real *dy, real *dx, k3c_err *err) {
    (void)err;
    k3c_rope2d_bwd(rows, H, dh, cs, dy, dx);
    return K3C_OK;
}
static int posemb_fwd(const k3c_posemb_sizes *s, const k3c_grid_thw *g, int n, int64_t L, const real *table, real *x,
                      k3c_err *err) {
    (void)L;
    return k3c_posemb_fwd(s, g, n, table, x, err);
}
static int merge_fwd(const k3c_grid_thw *g, int n, int64_t N, int64_t D, int64_t kh, int64_t kw, const real *x, real *y,
                     k3c_err *err) {
    (void)N;
    return k3c_tpool_merge_fwd(g, n, D, kh, kw, x, y, err);
}
static int merge_bwd(const k3c_grid_thw *g, int n, int64_t L, int64_t D, int64_t kh, int64_t kw, const real *dy,
                     real *dx, k3c_err *err) {
    (void)L;
    return k3c_tpool_merge_bwd(g, n, D, kh, kw, dy, dx, err);
}

static const k3c_backend cpu_table = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .sync = cpu_sync,
    .upload = cpu_copy,
    .download = cpu_copy,
    .supports = cpu_supports,
    .zero = zero,
    .add = add,
    .copy2d = copy2d,
    .sigmoid = sigmoid,
    .sigmoid_bwd = sigmoid_bwd,
    .embedding_fwd = k3c_embedding_fwd,
    .embedding_bwd = k3c_embedding_bwd,
    .rmsnorm_fwd = k3c_rmsnorm_fwd,
    .rmsnorm_bwd = k3c_rmsnorm_bwd,
    .gated_rmsnorm_fwd = k3c_gated_rmsnorm_fwd,
    .gated_rmsnorm_bwd = k3c_gated_rmsnorm_bwd,
    .linear_fwd = linear_fwd,
    .linear_bwd = linear_bwd,
    .sigmoid_gate_fwd = k3c_sigmoid_gate_fwd,
    .sigmoid_gate_bwd = k3c_sigmoid_gate_bwd,
    .xent_fwd = k3c_xent_fwd,
    .xent_bwd = k3c_xent_bwd,
    .l2norm_fwd = k3c_l2norm_fwd,
    .l2norm_bwd = k3c_l2norm_bwd,
    .short_conv_fwd = k3c_short_conv_fwd,
    .short_conv_bwd_workspace = k3c_short_conv_bwd_workspace,
    .short_conv_bwd = k3c_short_conv_bwd,
    .kda_gate_fwd = k3c_kda_gate_fwd,
    .kda_gate_bwd = k3c_kda_gate_bwd,
    .kda_fwd_workspace = kda_fwd_ws,
    .kda_bwd_workspace = kda_bwd_ws,
    .kda_fwd = kda_fwd,
    .kda_bwd = kda_bwd,
    .attention_fwd_workspace = attention_fwd_ws,
    .attention_bwd_workspace = k3c_attention_workspace,
    .attention_fwd = k3c_attention_fwd,
    .attention_bwd = k3c_attention_bwd,
    .attention_max_logit = k3c_attention_max_logit,
    .router_fwd = k3c_router_fwd,
    .router_bwd = k3c_router_bwd,
    .aux_loss_workspace = k3c_aux_loss_workspace,
    .aux_loss_bwd = k3c_aux_loss_bwd,
    .moe_saved_bytes = k3c_moe_saved_bytes,
    .moe_workspace = k3c_moe_workspace,
    .moe_fwd = moe_fwd,
    .moe_bwd = moe_bwd,
    .moe_gather = moe_gather,
    .moe_gather_bwd = moe_gather_bwd,
    .moe_combine = moe_combine,
    .moe_combine_bwd = moe_combine_bwd,
    .to_bf16 = to_bf16,
    .from_bf16 = from_bf16,
    .mlp_saved_bytes = k3c_mlp_saved_bytes,
    .mlp_workspace = k3c_mlp_workspace,
    .mlp_fwd = mlp_fwd,
    .mlp_bwd = mlp_bwd,
    .attnres_saved_elems = k3c_attnres_saved_elems,
    .attnres_workspace = k3c_attnres_workspace,
    .attnres_fwd = k3c_attnres_fwd,
    .attnres_bwd = k3c_attnres_bwd,
    .optim_open = optim_open,
    .optim_close = optim_close,
    .optim_step = optim_step,
    .clip_grad_norm = clip_grad_norm,
    .quantile_balance_workspace = quantile_balance_workspace,
    .quantile_balance = quantile_balance,
    .bias_balance_workspace = k3c_bias_balance_workspace,
    .bias_balance = bias_balance,
    .qk_clip = qk_clip,
    .gelu_tanh = gelu_tanh,
    .gelu_tanh_bwd = gelu_tanh_bwd,
    .gelu_erf = gelu_erf,
    .gelu_erf_bwd = gelu_erf_bwd,
    .rope2d_fwd = rope2d_fwd,
    .rope2d_bwd = rope2d_bwd,
    .posemb_fwd = posemb_fwd,
    .posemb_bwd = k3c_posemb_bwd,
    .vit_attention_fwd = k3c_vit_attention_fwd,
    .vit_attention_bwd = k3c_vit_attention_bwd,
    .tpool_merge_fwd = merge_fwd,
    .tpool_merge_bwd = merge_bwd,
#if !K3C_REAL_DOUBLE
    .decode = &k3c_dec_cpu, /* the engine runs in float */
#endif
};

const k3c_backend *k3c_backend_cpu(void) { return &cpu_table; }
