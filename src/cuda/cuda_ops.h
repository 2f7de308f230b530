/* cuda_ops.h — the CUDA backend's one C interface: device memory, the cuBLASLt context and GEMMs, the CUDA twin of every
 * CPU op (src/cuda/<op>.cu beside src/ops/<op>.c) and the backend table. docs/CODE.md "Ops", "Precision policy"; docs/MODEL.md §1–§10.
 *
 * Conventions (beyond src/ops/ops.h):
 *  - A twin k3c_<op>_<fwd|bwd>_cuda takes the CPU op's arguments in float, every array (cu_seqlens included) a DEVICE
 *    pointer, the workspace a device buffer of k3c_<op>_workspace_cuda bytes. It runs on the calling thread's default
 *    stream (cudaStreamPerThread) and returns without synchronising; results are ordered on that stream.
 *  - Tensor-core paths store q/k/v in bf16 and accumulate in fp32 (gates, decays, states, softmax statistics fp32);
 *    the float twins convert their inputs into the workspace first. *_bf16_cuda entry points take bf16 tensors directly
 *    (uint16_t = raw bf16 bits) for the model and the benchmarks.
 *  - Every CUDA return code is checked; failures return K3C_EDEVICE with the call named in err. */
#ifndef K3C_CUDA_OPS_H
#define K3C_CUDA_OPS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "k3c.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "ops/attention.h"
#include "ops/attnres.h"
#include "ops/basic.h"
#include "ops/kda.h"
#include "ops/l2norm.h"
#include "ops/qmat.h"
#include "ops/short_conv.h"
#include "ops/vision_ops.h"

/* ---------------------------------------------------------------- weight views (qmat.cu) */
/* k3c_qmat_mul on the GPU: W's storage (w, scale), X [n, cols] and Y [n, rows] are device pointers. The weights are
 * decoded in registers (bf16 by a shift, MXFP4 E2M1 × 2^(s−127)), one warp per row, 8 inputs per pass; float sums. */
int k3c_qmat_mul_cuda(const k3c_qmat *W, const float *X, int64_t n, float *Y, int accumulate, k3c_err *err);

/* ---------------------------------------------------------------- device plumbing (device.cu) */
#define K3C_CUDA_LANES 8 /* at most this many side streams for runs of independent small GEMMs (the routed experts') */
#define K3C_CUDA_LANES_DEFAULT 4
typedef struct {
    int device;        /* CUDA ordinal */
    int sm_count;      /* multiprocessors */
    size_t smem_optin; /* largest dynamic shared memory a block may opt into */
    void *lt;          /* cublasLtHandle_t */
    void *lt_ws;       /* cuBLASLt workspace (device) */
    size_t lt_ws_bytes;
    /* Lanes: a small GEMM fills only part of the GPU (an expert's 2,048 × 512 output is 64 tiles of 128 × 128 for
       132 SMs), so independent ones run on `lanes` side streams at once, each with its own cuBLASLt workspace,
       between a fork from and a join into the calling thread's stream. 0: everything on that stream. */
    int lanes;
    void *lane[K3C_CUDA_LANES];        /* cudaStream_t */
    void *lane_ws[K3C_CUDA_LANES];     /* lt_ws_bytes each */
    void *lane_ev[K3C_CUDA_LANES + 1]; /* cudaEvent_t: each lane's join, then the fork */
    /* bf16 GEMM mode on float operands: 0 = cuBLASLt rounds them (FAST_16BF), 1 = products run on bf16 copies of
       both operands, 2 = on copies where that pays (gemm.cu bf16_copies_pay) */
    int bf16_copy;
    char name[128];
} k3c_cuda_ctx;

/* Selects `device`, reads its properties, creates the cuBLASLt handle and a workspace of lt_ws_bytes (0 = 32 MiB),
 * and the lanes (K3C_CUDA_LANES_DEFAULT of them; the environment's K3C_CUDA_LANES = 0..8 overrides, 0 turning them
 * off). bf16_copy is 2 (copies where they pay: the product does many multiply-adds per operand element; gemm.cu
 * bf16_copies_pay); the environment's K3C_CUDA_BF16_COPY = 0, 1 or 2 overrides. */
int k3c_cuda_init(k3c_cuda_ctx *ctx, int device, size_t lt_ws_bytes, k3c_err *err);
void k3c_cuda_destroy(k3c_cuda_ctx *ctx);
/* The lanes wait for the work queued so far on the calling thread's stream (fork), or that stream waits for
 * everything queued on the lanes (join). No-ops without lanes. */
int k3c_cuda_lanes_fork(k3c_cuda_ctx *ctx, k3c_err *err);
int k3c_cuda_lanes_join(k3c_cuda_ctx *ctx, k3c_err *err);

int k3c_cuda_malloc(void **p, size_t bytes, k3c_err *err);
void k3c_cuda_free(void *p);
int k3c_cuda_h2d(void *dst, const void *src, size_t bytes, k3c_err *err); /* synchronous */
int k3c_cuda_d2h(void *dst, const void *src, size_t bytes, k3c_err *err); /* synchronous */
int k3c_cuda_fill_u8(void *p, int byte, size_t bytes, k3c_err *err);      /* e.g. 0xFF poisons floats with NaN */
int k3c_cuda_sync(k3c_err *err);                                          /* the calling thread's stream */
/* Device-side conversions (stream-ordered). bf16 is stored as uint16_t bit patterns; rounding is to nearest even. */
int k3c_cuda_f32_to_bf16(const float *x, uint16_t *y, size_t n, k3c_err *err);
int k3c_cuda_bf16_to_f32(const uint16_t *x, float *y, size_t n, k3c_err *err);
/* fp16 bits; values beyond ±65504 become ±inf (the fp16 kernels' documented range). */
int k3c_cuda_f32_to_f16(const float *x, uint16_t *y, size_t n, k3c_err *err);
/* Gradient scaling for the fp16 kernels (fp16 has 5 exponent bits: gradients of ~1e-6 would be subnormal there).
 * s (3 device floats): s[0] = 2^-e, s[1] = 2^e with max(|x|, |y|) ∈ [2^(e-1), 2^e) (1 and 1 when every value is 0;
 * non-finite values are ignored), s[2] scratch. k3c_cuda_scale: x *= *s (exact for powers of two). */
int k3c_cuda_pow2_scale(const float *x, size_t n, const float *y, size_t ny, float *s, k3c_err *err);
int k3c_cuda_scale(float *x, size_t n, const float *s, k3c_err *err);
int k3c_cuda_f32_to_f16_scaled(const float *x, uint16_t *y, size_t n, const float *s, k3c_err *err);
/* A plain device-to-device copy with 16-byte accesses (the bandwidth ceiling the benchmarks quote). */
int k3c_cuda_copy(void *dst, const void *src, size_t bytes, k3c_err *err);

/* ---------------------------------------------------------------- GEMM through cuBLASLt (gemm.cu)
 * Row-major C[M,N] = alpha · op(A) op(B) + beta · C with op = transpose when trans_* is set (as k3c_matmul): A is [M,K]
 * or, transposed, [K,M]; B is [K,N] or [N,K]; rows are dense (leading dimension = stored row width).
 * k3c_gemm_bf16_cuda: A, B bf16, fp32 accumulation, C bf16 (c_f32 = 0) or float (c_f32 = 1).
 * k3c_matmul_cuda: the float twin of k3c_matmul at a k3c_gemm_mode: full fp32, TF32 tensor cores, or bf16 tensor cores
 * (A and B rounded to bf16 inside cuBLASLt, CUBLAS_COMPUTE_32F_FAST_16BF; fp32 accumulation, C stays float). */
typedef enum {
    K3C_GEMM_FP32 = 0, /* full fp32: the checking mode */
    K3C_GEMM_TF32 = 1, /* TF32 tensor cores (inputs rounded to 10 mantissa bits) */
    K3C_GEMM_BF16 = 2, /* bf16 tensor cores (inputs rounded to 7 mantissa bits), fp32 masters and accumulation */
} k3c_gemm_mode;
const char *k3c_gemm_mode_name(int gemm);
int k3c_gemm_bf16_cuda(k3c_cuda_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const uint16_t *A, const uint16_t *B, float beta, void *C, int c_f32, k3c_err *err);
/* batch bf16 products in one strided-batched call, out of place: C_i = alpha op(A_i) op(B_i) + beta C_in_i with A_i =
 * A + i·sA, B_i = B + i·sB, C_i = C + i·sC and C_in_i = C_in + i·sC (C_in NULL: C itself; C_in may be C). fp32
 * accumulation, and the epilogue alpha·AB + beta·C_in in fp32 before C's one rounding to bf16. Items 256-byte aligned
 * as for k3c_matmul_batched_cuda. */
int k3c_gemm_bf16_batched_cuda(k3c_cuda_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                               float alpha, const uint16_t *A, int64_t sA, const uint16_t *B, int64_t sB, float beta,
                               const uint16_t *C_in, uint16_t *C, int64_t sC, int32_t batch, k3c_err *err);
int k3c_matmul_cuda(k3c_cuda_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                    const float *A, const float *B, double beta, float *C, int gemm, k3c_err *err);
/* The same on lane `i` mod the lanes (between k3c_cuda_lanes_fork and _join), or on the thread's stream without. */
int k3c_matmul_lane_cuda(k3c_cuda_ctx *ctx, int i, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                         double alpha, const float *A, const float *B, double beta, float *C, int gemm, k3c_err *err);
/* batch products of k3c_matmul_cuda in one strided-batched call: item i reads A + i·sA, B + i·sB, writes C + i·sC
 * (element strides; 256-byte aligned items keep cuBLASLt's heuristics on their default assumptions). */
int k3c_matmul_batched_cuda(k3c_cuda_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                            const float *A, int64_t sA, const float *B, int64_t sB, double beta, float *C, int64_t sC,
                            int32_t batch, int gemm, k3c_err *err);

/* ---------------------------------------------------------------- KDA (kda_fwd.cu, kda_bwd.cu, kda_recurrent.cu)
 * Chunked twins of k3c_kda_chunk_{fwd,bwd} (ops/kda.h): chunk 64 built from 16-row sub-tiles, whatever d->chunk says.
 * Tensor-core path: dk ∈ {32, 64, 128}, dv a multiple of 32 up to 256. With d->gate_lower_bound < 0 (≥ −5.5) the diagonal
 * 16×16 tiles are bf16 MMAs around the tile midpoint (§3.3); with 0 they are computed elementwise (any gate). */
size_t k3c_kda_chunk_fwd_workspace_cuda(const k3c_kda_dims *d);
int k3c_kda_chunk_fwd_cuda(const k3c_kda_dims *d, const int32_t *cu_seqlens, const float *q, const float *k,
                           const float *v, const float *g, const float *beta, const float *h0, float *o, float *ht,
                           void *ws, k3c_err *err);
/* bf16 q, k, v, o; fp32 g, beta, h0, ht (the training / prefill entry). Workspace as above. */
int k3c_kda_chunk_fwd_bf16_cuda(const k3c_kda_dims *d, const int32_t *cu_seqlens, const uint16_t *q, const uint16_t *k,
                                const uint16_t *v, const float *g, const float *beta, const float *h0, uint16_t *o,
                                float *ht, void *ws, k3c_err *err);
/* The backward recomputes the forward (keeping (I+L)⁻¹, Ṽ and the chunk-entering states), runs the state gradient in
 * reverse per (document, head), then one block per (chunk, head) adds into every gradient. dout, dq, dk, dv, dg and
 * dbeta are required here (NULL is only allowed for dht and dh0). */
size_t k3c_kda_chunk_bwd_workspace_cuda(const k3c_kda_dims *d);
int k3c_kda_chunk_bwd_cuda(const k3c_kda_dims *d, const int32_t *cu_seqlens, const float *q, const float *k,
                           const float *v, const float *g, const float *beta, const float *h0, const float *dout,
                           const float *dht, float *dq, float *dk, float *dv, float *dg, float *dbeta, float *dh0,
                           void *ws, k3c_err *err);
/* bf16 q, k, v, dout; fp32 g, beta, h0, dht; fp32 gradients, ADDED to (dq, dk, dv, dg, dbeta required; dh0 optional).
 * Workspace: k3c_kda_chunk_bwd_workspace_cuda. */
int k3c_kda_chunk_bwd_bf16_cuda(const k3c_kda_dims *d, const int32_t *cu_seqlens, const uint16_t *q, const uint16_t *k,
                                const uint16_t *v, const float *g, const float *beta, const float *h0,
                                const uint16_t *dout, const float *dht, float *dq, float *dk, float *dv, float *dg,
                                float *dbeta, float *dh0, void *ws, k3c_err *err);
/* Token recurrence in fp32 (decode: T = n_docs tokens, cu = 0, 1, .., n_docs; ht may alias h0 for in-place decode;
 * and the fp32 checking kernels). dk ∈ {8, 16, 32, 64, 128}, dv ≤ 1024. The forward needs no workspace (ws may be NULL).
 * The backward is k3c_kda_recurrent_bwd's (a state checkpoint every d->chunk tokens, 0 = 64; gradients ADDED to, each
 * may be NULL), deterministic: the sums over state columns run in a fixed order. */
size_t k3c_kda_recurrent_fwd_workspace_cuda(const k3c_kda_dims *d);
int k3c_kda_recurrent_fwd_cuda(const k3c_kda_dims *d, const int32_t *cu_seqlens, const float *q, const float *k,
                               const float *v, const float *g, const float *beta, const float *h0, float *o, float *ht,
                               void *ws, k3c_err *err);
size_t k3c_kda_recurrent_bwd_workspace_cuda(const k3c_kda_dims *d);
int k3c_kda_recurrent_bwd_cuda(const k3c_kda_dims *d, const int32_t *cu_seqlens, const float *q, const float *k,
                               const float *v, const float *g, const float *beta, const float *h0, const float *dout,
                               const float *dht, float *dq, float *dk, float *dv, float *dg, float *dbeta, float *dh0,
                               void *ws, k3c_err *err);

/* ---------------------------------------------------------------- attention (attention.cu)
 * Twins of k3c_attention_{fwd,bwd} (ops/attention.h): FlashAttention-2 style, bf16 tensor cores, fp32 softmax and lse.
 * dqk and dv multiples of 8, dqk ≤ 192, dv ≤ 128 (MLA: 192 = 128 + 64 and 128; small dims are zero-padded to 32 / 64).
 * block_q / block_k are ignored (64-row tiles). */
size_t k3c_attention_fwd_workspace_cuda(const k3c_attention_sizes *s);
size_t k3c_attention_workspace_cuda(const k3c_attention_sizes *s); /* backward */
int k3c_attention_fwd_cuda(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const float *q, const float *k,
                           const float *v, float *o, float *lse, void *ws, k3c_err *err);
int k3c_attention_bwd_cuda(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const float *q, const float *k,
                           const float *v, const float *o, const float *lse, const float *dout, float *dq, float *dk,
                           float *dv, void *ws, k3c_err *err);
/* bf16 entries (o, dq, dk, dv bf16 and OVERWRITTEN, not accumulated; lse fp32). Workspace: the same functions. */
int k3c_attention_fwd_bf16_cuda(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const uint16_t *q,
                                const uint16_t *k, const uint16_t *v, uint16_t *o, float *lse, void *ws, k3c_err *err);
int k3c_attention_bwd_bf16_cuda(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const uint16_t *q,
                                const uint16_t *k, const uint16_t *v, const uint16_t *o, const float *lse,
                                const uint16_t *dout, uint16_t *dq, uint16_t *dk, uint16_t *dv, void *ws, k3c_err *err);

/* fp32 twins with no tensor cores (attention_naive.cu; the checking kernels): one warp per query row for o, lse and dq,
 * one per key row for dk and dv, every sum in a fixed order. dqk, dv ≤ 256; o, lse written, dq, dk, dv ADDED to (each
 * may be NULL). The backward's workspace holds D = rowsum(dO ⊙ O) (T·H floats); the forward needs none. */
size_t k3c_attention_naive_fwd_workspace_cuda(const k3c_attention_sizes *s);
size_t k3c_attention_naive_workspace_cuda(const k3c_attention_sizes *s); /* backward */
int k3c_attention_naive_fwd_cuda(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const float *q,
                                 const float *k, const float *v, float *o, float *lse, void *ws, k3c_err *err);
int k3c_attention_naive_bwd_cuda(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const float *q,
                                 const float *k, const float *v, const float *o, const float *lse, const float *dout,
                                 float *dq, float *dk, float *dv, void *ws, k3c_err *err);

/* ---------------------------------------------------------------- the fp16 variants (kda_f16.cu, attention_f16.cu)
 * The same kernels compiled with fp16 elements instead of bf16 (q, k, v, dout and every 16-bit intermediate: the
 * decayed operands, (I+L)⁻¹ and WY blocks, Ṽ, the chunk states, P and dS): rounding 8× finer, range ±65504 (larger
 * values become ±inf; in the backward, dout and dht are scaled into [1/2, 1) and the state gradients kept in fp16 grow
 * with document length where gates decay slowly, so very long documents belong on the bf16 kernels). Same signatures
 * and workspaces as the float twins above. The precise choice where activations
 * are known to be bounded, and what checks a whole model against the CPU inside a tight tolerance. */
int k3c_kda_chunk_fwd_f16_cuda(const k3c_kda_dims *d, const int32_t *cu_seqlens, const float *q, const float *k,
                               const float *v, const float *g, const float *beta, const float *h0, float *o, float *ht,
                               void *ws, k3c_err *err);
int k3c_kda_chunk_bwd_f16_cuda(const k3c_kda_dims *d, const int32_t *cu_seqlens, const float *q, const float *k,
                               const float *v, const float *g, const float *beta, const float *h0, const float *dout,
                               const float *dht, float *dq, float *dk, float *dv, float *dg, float *dbeta, float *dh0,
                               void *ws, k3c_err *err);
int k3c_attention_fwd_f16_cuda(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const float *q, const float *k,
                               const float *v, float *o, float *lse, void *ws, k3c_err *err);
int k3c_attention_bwd_f16_cuda(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const float *q, const float *k,
                               const float *v, const float *o, const float *lse, const float *dout, float *dq,
                               float *dk, float *dv, void *ws, k3c_err *err);

/* ---------------------------------------------------------------- router, GLU, MoE (router.cu, glu.cu, moe.cu)
 * fp32 twins of ops/moe.h and ops/glu.h (every array a device pointer). Selection and the GLU use the CPU float op's
 * formulas (its tanh included), so ids agree exactly and values within rounding. */
#include "ops/moe.h"
/* Router: nonfinite (device int, optional) is set to 1 when a logit or bias is non-finite (the CPU op's K3C_ENUMERIC;
 * checked by the caller when it next synchronises); that token's outputs are left unwritten. The backward skips ids
 * outside [0, n) instead of failing (it cannot see them without a synchronisation). */
int k3c_router_fwd_cuda(const k3c_router_sizes *s, const float *logits, const float *bias, int32_t *topk_ids,
                        float *topk_w, float *cutoff, int *nonfinite, k3c_err *err);
int k3c_router_bwd_cuda(const k3c_router_sizes *s, const float *logits, const int32_t *topk_ids, const float *dtopk_w,
                        float *dlogits, k3c_err *err);
/* The auxiliary balancing loss's gradient (k3c_aux_loss_bwd): ws holds the route counts (k3c_aux_loss_workspace_cuda
 * bytes). Ids outside [0, n) count nothing (the CPU's K3C_EINVAL needs a synchronisation); the logits are the router's,
 * which its forward already found finite. Asynchronous. */
size_t k3c_aux_loss_workspace_cuda(const k3c_router_sizes *s);
int k3c_aux_loss_bwd_cuda(const k3c_router_sizes *s, const float *logits, const int32_t *topk_ids, double coef,
                          int64_t row0, int64_t rows, float *dlogits, void *ws, k3c_err *err);
/* The stable counting-sort plan of k3c_moe_plan, on the device (one block). SYNCHRONISES: it copies offsets[0..E]
 * to offsets_host (optional, host memory) to report bad ids as K3C_EINVAL and because the per-expert GEMMs need them. */
int k3c_moe_plan_cuda(int64_t tokens, int64_t top_k, int64_t experts, const int32_t *topk_ids, int64_t *offsets,
                      int32_t *perm, int32_t *pos, int64_t *offsets_host, k3c_err *err);
int k3c_moe_gather_cuda(int64_t rows, int64_t top_k, int64_t dim, const int32_t *perm, const float *x, float *xperm,
                        k3c_err *err);
int k3c_moe_combine_cuda(int64_t tokens, int64_t top_k, int64_t dim, const int32_t *pos, const float *w,
                         const float *yperm, float *y, k3c_err *err);
/* The adjoints of gather and combine (ops/moe.h k3c_moe_gather_bwd, k3c_moe_combine_bwd): gather_bwd adds slot by
 * slot in slot order as the CPU does (equal bits); combine_bwd's dw sums over d in a fixed block order. */
int k3c_moe_gather_bwd_cuda(int64_t tokens, int64_t top_k, int64_t dim, const int32_t *pos, const float *dxperm,
                            float *dx, k3c_err *err);
int k3c_moe_combine_bwd_cuda(int64_t tokens, int64_t top_k, int64_t dim, const int32_t *pos, const float *w,
                             const float *yperm, const float *dy, float *dyperm, float *dw, k3c_err *err);
int k3c_glu_fwd_cuda(const k3c_glu_sizes *s, const float *gate, const float *up, float *h, k3c_err *err);
int k3c_glu_bwd_cuda(const k3c_glu_sizes *s, const float *gate, const float *up, const float *dh, float *dgate,
                     float *dup, k3c_err *err);
/* Routed experts: k3c_moe_fwd / k3c_moe_bwd with the cuBLASLt context for the per-expert GEMMs (a host loop over
 * experts at GEMM mode `gemm`, a k3c_gemm_mode). Each call synchronises once (the plan's offsets).
 * Inside, expert rows start at multiples of 64 rows (256-byte aligned GEMM operands for any D, I), so saved / ws
 * have their own sizes: k3c_moe_saved_bytes_cuda, k3c_moe_workspace_cuda (the saved buffer is not the CPU op's). */
size_t k3c_moe_saved_bytes_cuda(const k3c_moe_sizes *s);
size_t k3c_moe_workspace_cuda(const k3c_moe_sizes *s);
int k3c_moe_fwd_cuda(k3c_cuda_ctx *ctx, const k3c_moe_sizes *s, const float *x, const int32_t *topk_ids,
                     const float *topk_w, const float *w1, const float *w3, const float *w2, float *y, void *saved,
                     void *ws, int gemm, k3c_err *err);
int k3c_moe_bwd_cuda(k3c_cuda_ctx *ctx, const k3c_moe_sizes *s, const float *x, const int32_t *topk_ids,
                     const float *topk_w, const float *w1, const float *w3, const float *w2, const void *saved,
                     const float *dy, float *dx, float *dw1, float *dw3, float *dw2, float *dtopk_w, void *ws, int gemm,
                     k3c_err *err);

/* ================================================================ the fp32 twins of the sequence ops (short_conv.cu,
 * kda_gate.cu, gates.cu, xent.cu). Backward twins ADD into every gradient they are given (NULL = not needed), as the
 * CPU ops do. Sizes are checked on the host; cu_seqlens lives on the device and is NOT validated (it must hold n_docs + 1
 * non-decreasing offsets from 0 to T, as the CPU op checks). Every parameter-gradient reduction is deterministic. */
#include "ops/basic.h"
#include "ops/kda.h"
#include "ops/short_conv.h"

/* ---------------------------------------------------------------- short convolution + SiLU (ops/short_conv.h)
 * Forward: y [T, C]; state_in / state_out [n_docs, C, W−1] optional, state_out may be the same pointer as state_in. */
int k3c_short_conv_fwd_cuda(const k3c_short_conv_dims *d, const int32_t *cu_seqlens, const float *x, const float *w,
                            const float *state_in, float *y, float *state_out, k3c_err *err);
/* Workspace bytes of the backward: the pre-activation gradient (T·C floats) plus per-segment partial sums of dw
 * (one segment = 64 tokens or more; ⌈T / segment⌉ · C · W floats), each part 256-byte aligned. The first part is
 * used only for dstate_in. */
size_t k3c_short_conv_bwd_workspace_cuda(const k3c_short_conv_dims *d);
/* Adds dx [T, C], dw [C, W], dstate_in [n_docs, C, W−1] (each may be NULL). One pass over the tokens (dx, da and the dw
 * partial sums together). dw: each (token segment, channel) sums its tokens in order, then each weight sums its
 * segments in a fixed order (deterministic; the CPU sums all tokens in one run, so the two agree within float rounding
 * of that order). ws: k3c_short_conv_bwd_workspace_cuda bytes (may be NULL when
 * T = 0). */
int k3c_short_conv_bwd_cuda(const k3c_short_conv_dims *d, const int32_t *cu_seqlens, const float *x, const float *w,
                            const float *state_in, const float *dy, float *dx, float *dw, float *dstate_in, void *ws,
                            k3c_err *err);

/* ---------------------------------------------------------------- KDA forget gate (ops/kda.h), both forms */
int k3c_kda_gate_fwd_cuda(const k3c_kda_gate_dims *d, const float *z, const float *dt_bias, const float *A_log,
                          float *g, k3c_err *err);
/* Adds dz [T, H·dk], ddt_bias [H·dk] (Σ over tokens), dA_log [H] (Σ over tokens and channels, in double; only when
 * A_log is given). One cluster of 8 blocks per head (sm_90 thread-block clusters, distributed shared memory for the
 * partial sums): deterministic. dz must not overlap z or dg. */
int k3c_kda_gate_bwd_cuda(const k3c_kda_gate_dims *d, const float *z, const float *dt_bias, const float *A_log,
                          const float *dg, float *dz, float *ddt_bias, float *dA_log, k3c_err *err);

/* ---------------------------------------------------------------- vision tower (ops/vision_ops.h, cuda/vision.cu) */
/* Grids, cu offsets and the rope table are device arrays; L / N are the grids' patches / merged tokens. */
int k3c_gelu_tanh_cuda(int64_t n, const float *x, float *y, k3c_err *err);
int k3c_gelu_tanh_bwd_cuda(int64_t n, const float *x, const float *dy, float *dx, k3c_err *err);
int k3c_gelu_erf_cuda(int64_t n, const float *x, float *y, k3c_err *err);
int k3c_gelu_erf_bwd_cuda(int64_t n, const float *x, const float *dy, float *dx, k3c_err *err);
int k3c_rope2d_fwd_cuda(int64_t rows, int64_t H, int64_t dh, const float *cs, const float *x, float *y, k3c_err *err);
int k3c_rope2d_bwd_cuda(int64_t rows, int64_t H, int64_t dh, const float *cs, const float *dy, float *dx, k3c_err *err);
int k3c_posemb_fwd_cuda(const k3c_posemb_sizes *s, const k3c_grid_thw *g, int n, int64_t L, const float *table,
                        float *x, k3c_err *err);
int k3c_posemb_bwd_cuda(const k3c_posemb_sizes *s, const k3c_grid_thw *g, int n, const float *dx, float *dtable,
                        k3c_err *err);
int k3c_vit_attention_fwd_cuda(const k3c_vit_attn_sizes *s, const int32_t *cu, int n, const float *q, const float *k,
                               const float *v, float *o, float *lse, k3c_err *err);
int k3c_vit_attention_bwd_cuda(const k3c_vit_attn_sizes *s, const int32_t *cu, int n, const float *q, const float *k,
                               const float *v, const float *o, const float *lse, const float *dout, float *dq,
                               float *dk, float *dv, k3c_err *err);
int k3c_tpool_merge_fwd_cuda(const k3c_grid_thw *g, int n, int64_t N, int64_t D, int64_t kh, int64_t kw, const float *x,
                             float *y, k3c_err *err);
int k3c_tpool_merge_bwd_cuda(const k3c_grid_thw *g, int n, int64_t L, int64_t D, int64_t kh, int64_t kw,
                             const float *dy, float *dx, k3c_err *err);

/* ---------------------------------------------------------------- sigmoid gate and sigmoid (ops/basic.h) */
int k3c_sigmoid_gate_fwd_cuda(int64_t n, const float *x, const float *z, float *y, k3c_err *err);
int k3c_sigmoid_gate_bwd_cuda(int64_t n, const float *x, const float *z, const float *dy, float *dx, float *dz,
                              k3c_err *err);
/* y = σ(x) (y may alias x). Returns int, unlike the CPU k3c_sigmoid (launch errors need a channel). */
int k3c_sigmoid_cuda(int64_t n, const float *x, float *y, k3c_err *err);
/* dx += dy · y · (1 − y), y = σ(x) being the forward's OUTPUT (dx may be NULL: nothing to do). */
int k3c_sigmoid_bwd_cuda(int64_t n, const float *y, const float *dy, float *dx, k3c_err *err);

/* ---------------------------------------------------------------- masked cross-entropy (ops/basic.h)
 * Forward: lse [T] on the device; loss and count are HOST pointers (count may be NULL). One block per row (online max /
 * sum, the sum in double), then one block sums the counted rows in double in a fixed order. SYNCHRONISES (to return
 * the loss and to report a counted target >= V as K3C_EINVAL naming it; lse is written even then) and ALLOCATES
 * T·8 + 32 bytes of stream-ordered scratch (cudaMallocAsync / cudaFreeAsync, no device-wide synchronisation). */
int k3c_xent_fwd_cuda(const k3c_xent_sizes *s, const float *logits, const int32_t *targets, const uint8_t *mask,
                      float *lse, double *loss, int64_t *count, k3c_err *err);
/* dlogits[t, :] += (softmax − onehot(target)) · dloss / divisor on counted rows. Does not synchronise, so it cannot
 * report a counted target >= V (the forward does): such a row is skipped and not counted. With s->norm = 0 the divisor
 * (the count) is computed on the device into 8 bytes of stream-ordered scratch (cudaMallocAsync / cudaFreeAsync). */
int k3c_xent_bwd_cuda(const k3c_xent_sizes *s, const float *logits, const int32_t *targets, const uint8_t *mask,
                      const float *lse, double dloss, float *dlogits, k3c_err *err);

/* ================================================================ embedding, RMSNorm, L2 norm (embedding.cu, rmsnorm.cu,
 * l2norm.cu). Size checks, NULL-gradient rules and formulas are the CPU op's; reductions the CPU does in double are done
 * in double. None needs a workspace: parameter gradients (dw) are reduced by a column kernel whose summation order is
 * fixed by the launch shape alone; the embedding backward sums each row's tokens in token order, like the CPU. */
#include "ops/basic.h"
#include "ops/l2norm.h"

/* y[t,:] = E[ids[t],:]. SYNCHRONISES: the ids are validated on the device first and the result is read back, so an id
 * outside [0, V) returns K3C_EINVAL naming the first bad token and its id, as the CPU op does. On that error y is not
 * gathered, but its first element has served as the device flag and is left unspecified. Needs T < 2^31 − 2^24. */
int k3c_embedding_fwd_cuda(const k3c_embedding_sizes *s, const int32_t *ids, const float *E, float *y, k3c_err *err);
/* dE[ids[t],:] += dy[t,:] with atomicAdd (order among repeated ids is not fixed). It does not synchronise, so it cannot
 * report bad ids: tokens whose id is outside [0, V) are skipped (the forward has already rejected them). */
int k3c_embedding_bwd_cuda(const k3c_embedding_sizes *s, const int32_t *ids, const float *dy, float *dE, k3c_err *err);

/* y = w ⊙ x · r per row, r = 1/sqrt(mean(x²) + eps) summed in double; rstd (may be NULL) saves r. y may alias x. */
int k3c_rmsnorm_fwd_cuda(const k3c_rmsnorm_sizes *s, const float *x, const float *w, float *y, float *rstd,
                         k3c_err *err);
/* dx += r (w⊙dy − x̂ mean(x̂⊙w⊙dy)); dw += Σ_rows dy⊙x̂. rstd required; dx and dw may each be NULL. */
int k3c_rmsnorm_bwd_cuda(const k3c_rmsnorm_sizes *s, const float *x, const float *w, const float *rstd, const float *dy,
                         float *dx, float *dw, k3c_err *err);
/* y = RMSNorm_w(o) ⊙ σ(gate) over rows = T·H of width D = dv; rstd may be NULL. */
int k3c_gated_rmsnorm_fwd_cuda(const k3c_rmsnorm_sizes *s, const float *o, const float *gate, const float *w, float *y,
                               float *rstd, k3c_err *err);
/* dgate += dy ⊙ w⊙x̂ ⊙ σ(1−σ); RMSNorm backward of dy ⊙ σ(gate) into do_, dw. rstd required; do_, dgate, dw each may be
 * NULL. */
int k3c_gated_rmsnorm_bwd_cuda(const k3c_rmsnorm_sizes *s, const float *o, const float *gate, const float *w,
                               const float *rstd, const float *dy, float *do_, float *dgate, float *dw, k3c_err *err);

/* y = x / sqrt(Σx² + eps) per row (eps 0 = 1e-6, sums in double); y may alias x (the model normalises q, k in place);
 * rstd may be NULL. */
int k3c_l2norm_fwd_cuda(const k3c_l2norm_dims *d, const float *x, float *y, float *rstd, k3c_err *err);
/* dx += rstd · (dy − y (y·dy)). dx NULL = nothing to do; otherwise rstd is required (K3C_EINVAL if NULL). */
int k3c_l2norm_bwd_cuda(const k3c_l2norm_dims *d, const float *y, const float *rstd, const float *dy, float *dx,
                        k3c_err *err);

/* ================================================================ AttnRes (attnres.cu), QK-Clip S_max (attention_max_logit.cu),
 * activation moves (elementwise.cu). Backward ADDS into every gradient it is given. */
#include "ops/attention.h"
#include "ops/attnres.h"

/* ---------------------------------------------------------------- AttnRes (ops/attnres.h)
 * v and dv are HOST arrays of `sources` DEVICE pointers (dv itself, or any dv[i], may be NULL; a dv[i] may alias
 * another dv[j] and then receives both contributions; no dv[i] may alias a source or dh). saved has the CPU layout
 * (k3c_attnres_saved_elems_f32 floats: rstd [T, N] then α [T, N]); the forward writes it when non-NULL, the backward
 * reads it when non-NULL and otherwise recomputes rstd and α from v (as the CPU op).
 * ws: k3c_attnres_workspace_cuda bytes (256-aligned): the per-(token, source) coefficients of dv (α, dz·rstd,
 * dz·rstd²·z/D) and per-token-chunk partial sums of dŵ in double, so dw and dgamma are reduced over tokens in a fixed
 * order (deterministic, no atomics). It may be NULL only when T = 0 or no gradient is requested. Its size is not the
 * CPU op's k3c_attnres_workspace_f32. */
size_t k3c_attnres_workspace_cuda(const k3c_attnres_sizes *s);
int k3c_attnres_fwd_cuda(const k3c_attnres_sizes *s, const float *const *v, const float *w, const float *gamma,
                         float *h, float *saved, k3c_err *err);
int k3c_attnres_bwd_cuda(const k3c_attnres_sizes *s, const float *const *v, const float *w, const float *gamma,
                         const float *saved, const float *dh, float *const *dv, float *dw, float *dgamma, void *ws,
                         k3c_err *err);

/* ---------------------------------------------------------------- QK-Clip S_max (ops/attention.h)
 * Twin of k3c_attention_max_logit_f32: smax[h] (H floats, DEVICE, overwritten) = max of s->scale · q_i·k_j over the
 * causal pairs j ≤ i inside each document (q, k [T, H, dqk], fp32 dot products). T = 0: smax = −inf, returns 0 without
 * synchronising. Otherwise it SYNCHRONISES the stream once: it copies smax and cu_seqlens back to check them and
 * returns K3C_EINVAL for malformed cu_seqlens (not from 0 to T, decreasing) and K3C_ENUMERIC when a head's maximum is
 * not finite (smax is written either way). Needs no workspace; T ≤ 2^30, H ≤ 65535. */
int k3c_attention_max_logit_cuda(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const float *q,
                                 const float *k, float *smax, k3c_err *err);

/* ---------------------------------------------------------------- activation moves (ops/basic.h k3c_zero / add / copy2d)
 * x = 0 (n floats); y += x (x may equal y); dst[r·ld_dst + c] = src[r·ld_src + c] (accumulate = 0) or += (1) for
 * r < rows, c < cols; ld_src, ld_dst ≥ cols when rows > 1; src and dst must not overlap. */
int k3c_zero_cuda(float *x, int64_t n, k3c_err *err);
int k3c_add_cuda(int64_t n, const float *x, float *y, k3c_err *err);
int k3c_copy2d_cuda(int64_t rows, int64_t cols, const float *src, int64_t ld_src, float *dst, int64_t ld_dst,
                    int accumulate, k3c_err *err);

/* ---------------------------------------------------------------- the backend table (backend.cu)
 * Every op a model or training step calls (ops/backend.h), on device `device`: parameters, gradients, optimizer
 * state and activation arenas in device memory (cudaMalloc; the host reaches them through the table's upload and
 * download); GEMMs through cuBLASLt at the backend's k3c_gemm_mode (fp32 by default); KDA and attention on the kernels
 * of its k3c_kernel_mode (k3c_cuda_backend_kernels). The model's kda_chunk is 64 in every mode (the chunk of the
 * tensor-core kernels; the checkpoint interval of the fp32 recurrence). k3c_model_use_backend_f32(m, &b->table, err)
 * moves a model there; switch modes before a model plans its workspaces (their sizes differ). */
typedef enum {
    K3C_KERNELS_BF16 = 0, /* KDA on the chunk-64 tensor-core kernels, attention on the flash kernels, bf16 operands */
    K3C_KERNELS_FP16 = 1, /* the same kernels with fp16 operands (finer mantissa, scaled gradients) */
    K3C_KERNELS_FP32 = 2  /* the checking mode: the fp32 KDA recurrence and attention_naive, no tensor cores */
} k3c_kernel_mode;
#include "ops/backend.h"
typedef struct {
    k3c_cuda_ctx cu;
    int gemm;    /* k3c_gemm_mode of every GEMM-based op (linear, MLP, MoE experts) */
    int kernels; /* k3c_kernel_mode of KDA and attention */
    k3c_backend_f32 table;
} k3c_cuda_backend;
int k3c_cuda_backend_init(k3c_cuda_backend *b, int device, int gemm, k3c_err *err);
/* The inference engine's ops on the GPU (decode.cu): the table's `decode` entry. */
extern const k3c_dec_ops k3c_dec_cuda;
/* Puts KDA and attention on the kernels of `mode` (a k3c_kernel_mode; K3C_KERNELS_BF16 after init) and sets the
 * table's wire_bf16 (1 in the bf16 mode only: expert-parallel rows travel as bf16 there). */
void k3c_cuda_backend_kernels(k3c_cuda_backend *b, int mode);
void k3c_cuda_backend_destroy(k3c_cuda_backend *b);

#ifdef __cplusplus
}
#endif
#endif
