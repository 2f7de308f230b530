/* backend.h — the table of ops a model step calls, one per backend with one signature: the CPU reference (float and
 * double, ops/backend_cpu.c) and CUDA (float, cuda/backend.cu). docs/CODE.md "Ops" (two backends, one signature).
 *
 * A model step (src/model) and a training step (src/train) call ops only through this table and never touch tensor
 * memory themselves, so the same step code runs on either backend. Memory comes from the backend's alloc: host memory
 * on the CPU, device memory (cudaMalloc) on the GPU, which the host cannot address: everything the host reads or
 * writes (checkpoints, logits, telemetry, tests) goes through upload / download. Ops are ordered on the backend's
 * stream; download (and `sync`) wait for them.
 * The GEMM-based ops take the backend's ctx (the CUDA one holds the cuBLASLt handle); the CPU ignores it. */
#ifndef K3C_OPS_BACKEND_H
#define K3C_OPS_BACKEND_H

#include "ops/attention.h"
#include "ops/decode.h"
#include "ops/attnres.h"
#include "ops/basic.h"
#include "ops/glu.h"
#include "ops/kda.h"
#include "ops/l2norm.h"
#include "ops/moe.h"
#include "ops/optim.h"
#include "ops/qk_clip.h"
#include "ops/quantile_balance.h"
#include "ops/short_conv.h"
#include "ops/vision_ops.h"

/* Settings carried in an op's sizes that a backend may implement only in part. supports(f, value) is 1 when the
 * backend computes what the setting asks for, 0 when it would compute something else or fail; a caller that binds a
 * model to a backend asks first, so an ignored setting is an error instead of a silent change of algorithm. */
typedef enum {
    K3C_FEATURE_KDA_CHUNK = 1,   /* the model's kda_chunk (k3c_kda_dims.chunk): 0 = token recurrence, else the chunk */
    K3C_FEATURE_ATTENTION_BLOCK, /* k3c_attention_sizes.block_q / block_k: 0 = the backend's default tile */
} k3c_backend_feature;

static inline const char *k3c_backend_feature_name(k3c_backend_feature f) {
    switch (f) {
    case K3C_FEATURE_KDA_CHUNK: return "kda_chunk";
    case K3C_FEATURE_ATTENTION_BLOCK: return "attention block";
    }
    return "unknown feature";
}

#define K3C_BACKEND_STRUCT(real, S)                                                                                      \
    typedef struct k3c_backend_##S {                                                                                     \
        const char *name; /* "cpu" or "cuda" */                                                                          \
        void *ctx;        /* backend state (CUDA: device, cuBLASLt handle, TF32 policy); NULL on the CPU */              \
        /* backend memory: zeroed, 64-byte aligned, NULL when out of memory. Host memory on the CPU; on CUDA device \
           memory the host must not dereference (use upload / download) */    \
        void *(*alloc)(size_t bytes);                                                                                    \
        void (*free)(void *p);                                                                                           \
        int (*sync)(k3c_err * err);                                                                                      \
        /* host <-> backend memory (CPU: memcpy). upload is ordered on the stream; download waits for it. */             \
        int (*upload)(void *dst, const void *host_src, size_t bytes, k3c_err *err);                                      \
        int (*download)(void *host_dst, const void *src, size_t bytes, k3c_err *err);                                    \
        /* 1 when this backend honours feature f set to value (see k3c_backend_feature), else 0 */                       \
        int (*supports)(k3c_backend_feature f, int64_t value);                                                           \
        /* 1 when this instance's kernels already round activations to bf16 (the CUDA bf16 kernel mode, set by        \
           k3c_cuda_backend_kernels): activation rows crossing ranks may then travel as bf16 (parallel/ep.c); 0 (the     \
           CPU tables, the GPU's fp16 and fp32 checking modes): as real */                                           \
        int wire_bf16;                                                                                                   \
        /* moves and elementwise (ops/elementwise.c) */                                                                  \
        int (*zero)(real * x, int64_t n, k3c_err *err);                                                                  \
        int (*add)(int64_t n, const real *x, real *y, k3c_err *err);                                                     \
        int (*copy2d)(int64_t rows, int64_t cols, const real *src, int64_t ld_src, real *dst, int64_t ld_dst,            \
                      int accumulate, k3c_err *err);                                                                     \
        int (*sigmoid)(int64_t n, const real *x, real *y, k3c_err *err);                                                 \
        int (*sigmoid_bwd)(int64_t n, const real *y, const real *dy, real *dx, k3c_err *err);                            \
        /* ops/basic.h */                                                                                                \
        int (*embedding_fwd)(const k3c_embedding_sizes *s, const int32_t *ids, const real *E, real *y, k3c_err *err);    \
        int (*embedding_bwd)(const k3c_embedding_sizes *s, const int32_t *ids, const real *dy, real *dE,                 \
                             k3c_err *err);                                                                              \
        int (*rmsnorm_fwd)(const k3c_rmsnorm_sizes *s, const real *x, const real *w, real *y, real *rstd,                \
                           k3c_err *err);                                                                                \
        int (*rmsnorm_bwd)(const k3c_rmsnorm_sizes *s, const real *x, const real *w, const real *rstd, const real *dy,   \
                           real *dx, real *dw, k3c_err *err);                                                            \
        int (*gated_rmsnorm_fwd)(const k3c_rmsnorm_sizes *s, const real *o, const real *gate, const real *w, real *y,    \
                                 real *rstd, k3c_err *err);                                                              \
        int (*gated_rmsnorm_bwd)(const k3c_rmsnorm_sizes *s, const real *o, const real *gate, const real *w,             \
                                 const real *rstd, const real *dy, real *do_, real *dgate, real *dw, k3c_err *err);      \
        int (*linear_fwd)(void *ctx, const k3c_linear_sizes *s, const real *x, const real *W, real *y, k3c_err *err);    \
        int (*linear_bwd)(void *ctx, const k3c_linear_sizes *s, const real *x, const real *W, const real *dy,            \
                          real *dx, real *dW, k3c_err *err);                                                             \
        int (*sigmoid_gate_fwd)(int64_t n, const real *x, const real *z, real *y, k3c_err *err);                         \
        int (*sigmoid_gate_bwd)(int64_t n, const real *x, const real *z, const real *dy, real *dx, real *dz,             \
                                k3c_err *err);                                                                           \
        int (*xent_fwd)(const k3c_xent_sizes *s, const real *logits, const int32_t *targets, const uint8_t *mask,        \
                        real *lse, double *loss, int64_t *count, k3c_err *err);                                          \
        int (*xent_bwd)(const k3c_xent_sizes *s, const real *logits, const int32_t *targets, const uint8_t *mask,        \
                        const real *lse, double dloss, real *dlogits, k3c_err *err);                                     \
        /* ops/l2norm.h, ops/short_conv.h */                                                                             \
        int (*l2norm_fwd)(const k3c_l2norm_dims *d, const real *x, real *y, real *rstd, k3c_err *err);                   \
        int (*l2norm_bwd)(const k3c_l2norm_dims *d, const real *y, const real *rstd, const real *dy, real *dx,           \
                          k3c_err *err);                                                                                 \
        int (*short_conv_fwd)(const k3c_short_conv_dims *d, const int32_t *cu_seqlens, const real *x, const real *w,     \
                              const real *state_in, real *y, real *state_out, k3c_err *err);                             \
        size_t (*short_conv_bwd_workspace)(const k3c_short_conv_dims *d);                                                \
        int (*short_conv_bwd)(const k3c_short_conv_dims *d, const int32_t *cu_seqlens, const real *x, const real *w,     \
                              const real *state_in, const real *dy, real *dx, real *dw, real *dstate_in, void *ws,       \
                              k3c_err *err);                                                                             \
        /* ops/kda.h: kda_fwd / kda_bwd are the chunked algorithm (d->chunk > 0) or the token recurrence (0) where the \
           backend has it (supports(K3C_FEATURE_KDA_CHUNK, chunk)); the CUDA backend has only its chunk-64 kernels */ \
        int (*kda_gate_fwd)(const k3c_kda_gate_dims *d, const real *z, const real *dt_bias, const real *A_log,           \
                            real *g, k3c_err *err);                                                                      \
        int (*kda_gate_bwd)(const k3c_kda_gate_dims *d, const real *z, const real *dt_bias, const real *A_log,           \
                            const real *dg, real *dz, real *ddt_bias, real *dA_log, k3c_err *err);                       \
        size_t (*kda_fwd_workspace)(const k3c_kda_dims *d);                                                              \
        size_t (*kda_bwd_workspace)(const k3c_kda_dims *d);                                                              \
        int (*kda_fwd)(const k3c_kda_dims *d, const int32_t *cu_seqlens, const real *q, const real *k, const real *v,    \
                       const real *g, const real *beta, const real *h0, real *o, real *ht, void *ws, k3c_err *err);      \
        int (*kda_bwd)(const k3c_kda_dims *d, const int32_t *cu_seqlens, const real *q, const real *k, const real *v,    \
                       const real *g, const real *beta, const real *h0, const real *dout, const real *dht, real *dq,     \
                       real *dk, real *dv, real *dg, real *dbeta, real *dh0, void *ws, k3c_err *err);                    \
        /* ops/attention.h */                                                                                            \
        size_t (*attention_fwd_workspace)(const k3c_attention_sizes *s);                                                 \
        size_t (*attention_bwd_workspace)(const k3c_attention_sizes *s);                                                 \
        int (*attention_fwd)(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const real *q, const real *k,      \
                             const real *v, real *o, real *lse, void *ws, k3c_err *err);                                 \
        int (*attention_bwd)(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const real *q, const real *k,      \
                             const real *v, const real *o, const real *lse, const real *dout, real *dq, real *dk,        \
                             real *dv, void *ws, k3c_err *err);                                                          \
        int (*attention_max_logit)(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const real *q,               \
                                   const real *k, float *smax, k3c_err *err);                                            \
        /* ops/moe.h (router, routed experts, dense GLU MLP) */                                                          \
        int (*router_fwd)(const k3c_router_sizes *s, const real *logits, const real *bias, int32_t *topk_ids,            \
                          real *topk_w, real *cutoff, k3c_err *err);                                                     \
        int (*router_bwd)(const k3c_router_sizes *s, const real *logits, const int32_t *topk_ids, const real *dtopk_w,   \
                          real *dlogits, k3c_err *err);                                                                  \
        /* the auxiliary balancing loss's gradient (k3c_aux_loss_bwd); ws: aux_loss_workspace bytes */                   \
        size_t (*aux_loss_workspace)(const k3c_router_sizes *s);                                                         \
        int (*aux_loss_bwd)(const k3c_router_sizes *s, const real *logits, const int32_t *topk_ids, double coef,         \
                            int64_t row0, int64_t rows, real *dlogits, void *ws, k3c_err *err);                          \
        size_t (*moe_saved_bytes)(const k3c_moe_sizes *s);                                                               \
        size_t (*moe_workspace)(const k3c_moe_sizes *s);                                                                 \
        int (*moe_fwd)(void *ctx, const k3c_moe_sizes *s, const real *x, const int32_t *topk_ids, const real *topk_w,    \
                       const real *w1, const real *w3, const real *w2, real *y, void *saved, void *ws, k3c_err *err);    \
        int (*moe_bwd)(void *ctx, const k3c_moe_sizes *s, const real *x, const int32_t *topk_ids, const real *topk_w,    \
                       const real *w1, const real *w3, const real *w2, const void *saved, const real *dy, real *dx,      \
                       real *dw1, real *dw3, real *dw2, real *dtopk_w, void *ws, k3c_err *err);                          \
        /* The permutation steps of ops/moe.h on their own (expert parallelism, parallel/ep.c), in slot order: moe_gather \
           (xperm[r] = x[perm[r] / k], r < rows), moe_gather_bwd (its adjoint: dx[t] += the rows pos[t·k + j] of t's \
           live slots, added one by one), moe_combine (k3c_moe_combine: overwrites y), moe_combine_bwd (dyperm,     \
           dw each may be NULL: dyperm[pos[i]] = w[i]·dy[i / k], dw[i] += ⟨dy[i / k], yperm[pos[i]]⟩ for each live \
           slot i; other rows untouched). to_bf16 / from_bf16: real ↔ bf16 bits (via float, nearest even). */       \
        int (*moe_gather)(int64_t rows, int64_t top_k, int64_t dim, const int32_t *perm, const real *x, real *xperm,     \
                          k3c_err *err);                                                                                 \
        int (*moe_gather_bwd)(int64_t tokens, int64_t top_k, int64_t dim, const int32_t *pos, const real *dxperm,        \
                              real *dx, k3c_err *err);                                                                   \
        int (*moe_combine)(int64_t tokens, int64_t top_k, int64_t dim, const int32_t *pos, const real *w,                \
                           const real *yperm, real *y, k3c_err *err);                                                    \
        int (*moe_combine_bwd)(int64_t tokens, int64_t top_k, int64_t dim, const int32_t *pos, const real *w,            \
                               const real *yperm, const real *dy, real *dyperm, real *dw, k3c_err *err);                 \
        int (*to_bf16)(int64_t n, const real *x, uint16_t *y, k3c_err *err);                                             \
        int (*from_bf16)(int64_t n, const uint16_t *x, real *y, k3c_err *err);                                           \
        size_t (*mlp_saved_bytes)(const k3c_mlp_sizes *s);                                                               \
        size_t (*mlp_workspace)(const k3c_mlp_sizes *s);                                                                 \
        int (*mlp_fwd)(void *ctx, const k3c_mlp_sizes *s, const real *x, const real *w_gate, const real *w_up,           \
                       const real *w_down, real *y, void *saved, void *ws, k3c_err *err);                                \
        int (*mlp_bwd)(void *ctx, const k3c_mlp_sizes *s, const real *x, const real *w_gate, const real *w_up,           \
                       const real *w_down, const void *saved, const real *dy, real *dx, real *dw_gate, real *dw_up,      \
                       real *dw_down, void *ws, k3c_err *err);                                                           \
        /* ops/attnres.h */                                                                                              \
        size_t (*attnres_saved_elems)(const k3c_attnres_sizes *s);                                                       \
        size_t (*attnres_workspace)(const k3c_attnres_sizes *s);                                                         \
        int (*attnres_fwd)(const k3c_attnres_sizes *s, const real *const *v, const real *w, const real *gamma,           \
                           real *h, real *saved, k3c_err *err);                                                          \
        int (*attnres_bwd)(const k3c_attnres_sizes *s, const real *const *v, const real *w, const real *gamma,           \
                           const real *saved, const real *dh, real *const *dv, real *dw, real *dgamma, void *ws,         \
                           k3c_err *err);                                                                                \
        /* The training step (ops/optim.h, ops/quantile_balance.h, ops/qk_clip.h) on float32 parameter tables (w, g, \
           state: float whatever `real` is; the trainer is float). optim_open makes the backend's instance for o over \
           t once after k3c_optim_init (CPU: none, *inst = NULL). optim_step: k3c_optim_step_entries; asynchronous. \
           clip_grad_norm: *norm = the pre-clip norm (max_norm <= 0: the norm only); waits for the device (the host \
           logs the norm). */   \
        int (*optim_open)(void *ctx, const k3c_optim *o, const k3c_param_table *t, void **inst, k3c_err *err);           \
        void (*optim_close)(void *inst);                                                                                 \
        int (*optim_step)(void *inst, k3c_optim *o, const k3c_param_table *t, int first, int last, float *w,             \
                          const float *g, float *state, double lr, int64_t step, k3c_err *err);                          \
        int (*clip_grad_norm)(void *inst, const k3c_param_table *t, float *g, double max_norm, double *norm,             \
                              k3c_err *err);                                                                             \
        /* One router's bias update from one step's route statistics: k3c_qb_update over the scores                  \
           s = sigmoid(logits) (computed in double, rounded to float: the router's rule) with logits [m, n],         \
           cutoff [m], b [n] in and out, every token counted; ws: quantile_balance_workspace bytes of backend memory. \
           Asynchronous. */   \
        size_t (*quantile_balance_workspace)(int mode, int64_t m, int64_t n);                                            \
        int (*quantile_balance)(void *ctx, int mode, const float *logits, const float *cutoff, int64_t m, int64_t n,     \
                                int64_t k, float *b, void *ws, k3c_err *err);                                            \
        /* The auxiliary-loss-free bias step instead (k3c_bias_balance: the router's selection over logits [m, n]        \
           with b, then b_j += gamma * sign(mean load - load_j)); ws: bias_balance_workspace bytes. Async. */            \
        size_t (*bias_balance_workspace)(int64_t m, int64_t n, int64_t k);                                               \
        int (*bias_balance)(void *ctx, const float *logits, int64_t m, int64_t n, int64_t k, double gamma, float *b,     \
                            void *ws, k3c_err *err);                                                                     \
        /* k3c_qk_clip over every MLA layer of t (s_max [num_layers, mla_heads]); *n_clipped (backend memory) gets the \
           heads scaled, or -1 for a non-finite S_max (the CPU also returns K3C_ENUMERIC; CUDA leaves those heads  \
           untouched and reports it only through *n_clipped, the host reads it with the step's telemetry). */ \
        int (*qk_clip)(void *ctx, const k3c_config *cfg, const k3c_param_table *t, float *w, const float *s_max,         \
                       double tau, int32_t *n_clipped, k3c_err *err);                                                    \
        /* ops/vision_ops.h (the vision tower; grids, cu and the rope table in backend memory; L / N: the grids'     \
           patches / merged tokens, which a device cannot read from the grids without a copy back) */   \
        int (*gelu_tanh)(int64_t n, const real *x, real *y, k3c_err *err);                                               \
        int (*gelu_tanh_bwd)(int64_t n, const real *x, const real *dy, real *dx, k3c_err *err);                          \
        int (*gelu_erf)(int64_t n, const real *x, real *y, k3c_err *err);                                                \
        int (*gelu_erf_bwd)(int64_t n, const real *x, const real *dy, real *dx, k3c_err *err);                           \
        int (*rope2d_fwd)(int64_t rows, int64_t H, int64_t dh, const real *cs, const real *x, real *y, k3c_err *err);    \
        int (*rope2d_bwd)(int64_t rows, int64_t H, int64_t dh, const real *cs, const real *dy, real *dx,                 \
                          k3c_err *err);                                                                                 \
        int (*posemb_fwd)(const k3c_posemb_sizes *s, const k3c_grid_thw *g, int n, int64_t L, const real *table,         \
                          real *x, k3c_err *err);                                                                        \
        int (*posemb_bwd)(const k3c_posemb_sizes *s, const k3c_grid_thw *g, int n, const real *dx, real *dtable,         \
                          k3c_err *err);                                                                                 \
        int (*vit_attention_fwd)(const k3c_vit_attn_sizes *s, const int32_t *cu, int n, const real *q, const real *k,    \
                                 const real *v, real *o, real *lse, k3c_err *err);                                       \
        int (*vit_attention_bwd)(const k3c_vit_attn_sizes *s, const int32_t *cu, int n, const real *q, const real *k,    \
                                 const real *v, const real *o, const real *lse, const real *dout, real *dq, real *dk,    \
                                 real *dv, k3c_err *err);                                                                \
        int (*tpool_merge_fwd)(const k3c_grid_thw *g, int n, int64_t N, int64_t D, int64_t kh, int64_t kw,               \
                               const real *x, real *y, k3c_err *err);                                                    \
        int (*tpool_merge_bwd)(const k3c_grid_thw *g, int n, int64_t L, int64_t D, int64_t kh, int64_t kw,               \
                               const real *dy, real *dx, k3c_err *err);                                                  \
        /* the inference engine's ops on this backend (ops/decode.h); NULL in the double tables */                        \
        const struct k3c_dec_ops *decode;                                                                                \
    } k3c_backend_##S;                                                                                                   \
    /* The CPU reference of this precision (a constant table). */                                                        \
    const k3c_backend_##S *k3c_backend_cpu_##S(void);

K3C_DECLARE_REAL(K3C_BACKEND_STRUCT)

#endif
