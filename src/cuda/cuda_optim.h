/* cuda_optim.h — the training-step ops on the GPU: the optimizer step (AdamW + Per-Head Muon with Newton–Schulz-5) and
 * gradient-norm clipping (device twins of k3c_optim_step[_entries], k3c_grad_norm and k3c_clip_grad_norm of
 * ops/optim.h, in optim.cu), quantile balancing (quantile_balance.cu) and QK-Clip (qk_clip.cu). docs/MODEL.md §7, §10.
 *
 * w, g and state are DEVICE pointers laid out exactly as for the CPU functions: the k3c_optim state layout
 * (Muon: momentum; AdamW: m, then v) is unchanged, so optimizer checkpoints are the same whichever device stepped.
 * Semantics are the CPU ones: AdamW is elementwise with the CPU's float operations in the CPU's order (no FMA
 * contraction), so it matches bit for bit; Muon's momentum / Nesterov / update are elementwise the same, the Frobenius
 * norm is a deterministic double reduction (one thread block per matrix, fixed tree). NS5 runs at o->muon_precision
 * (docs/MODEL.md §10.4): bf16 (X, P, B stored bf16, bf16 cuBLASLt GEMMs with fp32 accumulation, the Muon reference's
 * precision: a few percent from the CPU's fp32) or fp32 (fp32 cuBLASLt GEMMs, never TF32, whose summation order
 * differs from OpenBLAS: agreement to ~1e-5 relative, not bitwise); K3C_MUON_AUTO is bf16 unless auto_bf16 = 0.
 * The many small Muon matrices (per-head row blocks, per-expert slices) are gathered by shape into one workspace and
 * orthogonalised with strided-batched GEMMs (batched = 0: a loop of single GEMMs, the plain reference).
 * Everything runs on K3C_STREAM and returns without synchronising, except the grad-norm functions, which SYNCHRONISE
 * (the host needs the norm). */
#ifndef K3C_CUDA_OPTIM_H
#define K3C_CUDA_OPTIM_H

#include "cuda/cuda_ops.h"
#include "k3c.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "ops/optim.h"
#include "ops/qk_clip.h"
#include "ops/quantile_balance.h"

typedef struct {
    k3c_cuda_ctx *cu;             /* cuBLASLt handle of the NS GEMMs (not owned) */
    void *(*alloc)(size_t bytes); /* where the workspace comes from (NULL: cudaMalloc); allocated once, at init */
    void (*free)(void *p);
    int batched;   /* 1 (default): strided-batched GEMMs; 0: one GEMM per matrix */
    int auto_bf16; /* what K3C_MUON_AUTO runs: 1 (k3c_optim_cuda_init's default) bf16; 0 fp32 (the backend table's
                      instance in the fp32 GEMM mode, the checking mode) */
    float *ws;     /* Newton–Schulz workspace: X, X', P, B of a batch of same-shape matrices */
    size_t ws_numel;
    double *ss; /* [n_ss]: per-matrix Σx² of the batch (deterministic, in double) */
    size_t n_ss;
    int64_t *pieces;  /* [2 n_pieces] device: (offset, length) of the grad-norm blocks, table order */
    double *partials; /* [n_pieces + 1]: Σg² per block, then the total */
    int64_t n_pieces;
    int n_entries; /* the table the pieces were built for */
    size_t total;
} k3c_optim_cuda;

/* Allocates the workspace for optimizer o (after k3c_optim_init) over table t through alloc (NULL = cudaMalloc). */
int k3c_optim_cuda_init(k3c_optim_cuda *oc, k3c_cuda_ctx *cu, void *(*alloc)(size_t), void (*free_fn)(void *),
                        const k3c_optim *o, const k3c_param_table *t, k3c_err *err);
void k3c_optim_cuda_free(k3c_optim_cuda *oc);

/* Twins of k3c_optim_step_entries / k3c_optim_step (same checks, same errors). Asynchronous. */
int k3c_optim_step_entries_cuda(k3c_optim_cuda *oc, k3c_optim *o, const k3c_param_table *t, int first, int last,
                                float *w, const float *g, float *state, double lr, int64_t step, k3c_err *err);
int k3c_optim_step_cuda(k3c_optim_cuda *oc, k3c_optim *o, const k3c_param_table *t, float *w, const float *g,
                        float *state, double lr, int64_t step, k3c_err *err);

/* Twins of k3c_grad_norm / k3c_clip_grad_norm: the norm goes to *norm (ROUTER_BIAS excluded; fixed 32K-element blocks
 * in double, their partials summed in a fixed tree: the same value on every run, equal to the CPU's up to the order of
 * that last sum). A non-finite norm leaves g untouched.
 * SYNCHRONISE the stream. */
int k3c_grad_norm_cuda(k3c_optim_cuda *oc, const k3c_param_table *t, const float *g, double *norm, k3c_err *err);
int k3c_clip_grad_norm_cuda(k3c_optim_cuda *oc, const k3c_param_table *t, float *g, double max_norm, double *norm,
                            k3c_err *err);

/* Sets the optimizer entries of b's table (optim_open/close/step, clip_grad_norm): the instance is a k3c_optim_cuda
 * with its workspace from b's allocator and its GEMMs on b's cuBLASLt. */
void k3c_cuda_optim_entries(k3c_cuda_backend *b);

/* The table's quantile_balance entry (ops/backend.h): k3c_qb_update over s = sigmoid(logits), asynchronous, b
 * unchanged for a non-finite input. ws: k3c_quantile_balance_workspace_cuda bytes of device memory. */
size_t k3c_quantile_balance_workspace_cuda(int mode, int64_t m, int64_t n);
int k3c_quantile_balance_cuda(void *ctx, int mode, const float *logits, const float *cutoff, int64_t m, int64_t n,
                              int64_t k, float *b, void *ws, k3c_err *err);
/* The table's bias_balance entry (ops/quantile_balance.h k3c_bias_balance): the routes from k3c_router_fwd_cuda's
 * selection (the forward's own), counted on the device, then the sign step; b unchanged for a non-finite logit or bias.
 * ws: k3c_bias_balance_workspace_cuda bytes of device memory. Asynchronous. */
size_t k3c_bias_balance_workspace_cuda(int64_t m, int64_t n, int64_t k);
int k3c_bias_balance_cuda(void *ctx, const float *logits, int64_t m, int64_t n, int64_t k, double gamma, float *b,
                          void *ws, k3c_err *err);
/* The table's qk_clip entry: k3c_qk_clip with S_max and the count in device memory (*n_clipped = −1 for a non-finite
 * S_max, that layer untouched). Asynchronous. */
int k3c_qk_clip_cuda(void *ctx, const k3c_config *cfg, const k3c_param_table *t, float *w, const float *s_max,
                     double tau, int32_t *n_clipped, k3c_err *err);

#ifdef __cplusplus
}
#endif
#endif
