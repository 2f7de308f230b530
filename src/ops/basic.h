/* basic.h — basic CPU ops: embedding, RMSNorm (plain, per head, gated), linear / matmul, sigmoid gate, SiLU, softmax,
 * masked cross-entropy. Spec: docs/MODEL.md §1.2, §1.3, §3.1 step 8, §3.4 item 8, §4.2; docs/TRAINING.md §5.3 (masks). */

/* Every op follows src/ops/ops.h: sizes struct (const pointer), row-major token-major arrays, returns 0 or a k3c_status
 * with `err` filled; backward ADDS into every gradient it is given, NULL gradient = not needed. Symbols exist as _f32
 * and _f64 (see base/real_decl.h); none of these ops needs a workspace. */
#ifndef K3C_OPS_BASIC_H
#define K3C_OPS_BASIC_H

#include "ops/ops.h"

#include <math.h>
#include <stdint.h>

/* ---------------------------------------------------------------- scalar helpers (both precisions) */
/* Overflow-free logistic sigmoid: exp is only ever taken of a non-positive number. */
static inline double k3c_sigmoid_d(double x) {
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}
static inline float k3c_sigmoid_f(float x) {
    if (x >= 0) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

/* rsigmoid: the sigmoid of the current `real` inside files that include base/real.h before this header. */
#if defined(K3C_REAL_H) && !defined(rsigmoid)
#if K3C_REAL_DOUBLE
#define rsigmoid k3c_sigmoid_d
#else
#define rsigmoid k3c_sigmoid_f
#endif
#endif

/* ---------------------------------------------------------------- sizes */
typedef struct {
    int64_t T; /* tokens */
    int64_t V; /* rows of the table (vocabulary) */
    int64_t D; /* row width (hidden size) */
} k3c_embedding_sizes;

/* RMSNorm over `rows` rows of width D with ONE weight vector w[D]. Per-head use (KDA o_norm): rows = T·H, D = d. */
typedef struct {
    int64_t rows, D;
    double eps;
} k3c_rmsnorm_sizes;

typedef struct {
    int64_t T, in, out;
    int accumulate; /* forward: 1 = y += x Wᵀ, 0 = y = x Wᵀ */
} k3c_linear_sizes;

typedef struct {
    int64_t rows, n; /* softmax over each row of n values */
} k3c_softmax_sizes;

typedef struct {
    int64_t T, V;
    double norm; /* the loss divisor; 0 = the number of counted positions (a per-call mean). Give the global count of a
                    batch split into micro-batches or ranks so the summed gradients equal the full-batch mean. */
    const float *weight; /* per-position loss weights w[T] in the op's memory (host, or the device's); NULL = all 1.
                            The RL update puts −∂L/∂logp here (docs/POST.md "RL math"). */
} k3c_xent_sizes;

/* ---------------------------------------------------------------- API */
#define K3C_BASIC_API(real, S)                                                                                                \
    /* y[t,:] = E[ids[t],:]. K3C_EINVAL (naming the token) if an id is outside [0, V). */                                     \
    int k3c_embedding_fwd_##S(const k3c_embedding_sizes *s, const int32_t *ids, const real *E, real *y, k3c_err *err);        \
    /* dE[ids[t],:] += dy[t,:] (deterministic: column blocks in parallel, tokens in order). */                                \
    int k3c_embedding_bwd_##S(const k3c_embedding_sizes *s, const int32_t *ids, const real *dy, real *dE,                     \
                              k3c_err *err);                                                                                  \
                                                                                                                              \
    /* y = w ⊙ x · r, r = 1/sqrt(mean(x²) + eps) per row (sums in double); rstd[rows] (may be NULL) saves r. */           \
    int k3c_rmsnorm_fwd_##S(const k3c_rmsnorm_sizes *s, const real *x, const real *w, real *y, real *rstd,                    \
                            k3c_err *err);                                                                                    \
    /* dx += r (w⊙dy − x̂ mean(x̂⊙w⊙dy)); dw += Σ_rows dy⊙x̂ (x̂ = x·r). rstd: the forward's (required). */   \
    int k3c_rmsnorm_bwd_##S(const k3c_rmsnorm_sizes *s, const real *x, const real *w, const real *rstd,                       \
                            const real *dy, real *dx, real *dw, k3c_err *err);                                                \
                                                                                                                              \
    /* KDA output (§3.1 step 8): y = RMSNorm_w(o) ⊙ σ(gate), rows = T·H of width dv, o and gate both [rows, dv]        \
       (gate [T, H·dv] is that layout), w[dv] shared by all heads. rstd[rows] may be NULL. */ \
    int k3c_gated_rmsnorm_fwd_##S(const k3c_rmsnorm_sizes *s, const real *o, const real *gate, const real *w, real *y,        \
                                  real *rstd, k3c_err *err);                                                                  \
    /* dgate += dy ⊙ w⊙x̂ ⊙ σ(1−σ); then RMSNorm backward of dy ⊙ σ(gate) into do_, dw. rstd required. */       \
    int k3c_gated_rmsnorm_bwd_##S(const k3c_rmsnorm_sizes *s, const real *o, const real *gate, const real *w,                 \
                                  const real *rstd, const real *dy, real *do_, real *dgate, real *dw, k3c_err *err);          \
                                                                                                                              \
    /* y[T,out] = x[T,in] Wᵀ (+ y if s->accumulate), W[out,in], via cblas_rgemm. */                                         \
    int k3c_linear_fwd_##S(const k3c_linear_sizes *s, const real *x, const real *W, real *y, k3c_err *err);                   \
    /* dx += dy W; dW += dyᵀ x. */                                                                                          \
    int k3c_linear_bwd_##S(const k3c_linear_sizes *s, const real *x, const real *W, const real *dy, real *dx,                 \
                           real *dW, k3c_err *err);                                                                           \
    /* Row-major C[M,N] = alpha · op(A) op(B) + beta · C, op = transpose when trans_* is set; A is [M,K] (or [K,M]     \
       transposed), B is [K,N] (or [N,K]); leading dimensions are the stored row widths. Any size may be 0. */    \
    int k3c_matmul_##S(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, double alpha, const real *A,                \
                       const real *B, double beta, real *C, k3c_err *err);                                                    \
                                                                                                                              \
    /* Output gate (§4.2): y = x ⊙ σ(z) over n elements. */                                                               \
    int k3c_sigmoid_gate_fwd_##S(int64_t n, const real *x, const real *z, real *y, k3c_err *err);                             \
    /* dx += dy ⊙ σ(z); dz += dy ⊙ x ⊙ σ(z)(1 − σ(z)). */                                                          \
    int k3c_sigmoid_gate_bwd_##S(int64_t n, const real *x, const real *z, const real *dy, real *dx, real *dz,                 \
                                 k3c_err *err);                                                                               \
    /* Elementwise helpers (y may alias x in the forwards). */                                                                \
    void k3c_sigmoid_##S(int64_t n, const real *x, real *y);                                                                  \
    void k3c_silu_##S(int64_t n, const real *x, real *y);                                                                     \
    /* dx += dy ⊙ σ(x)(1 + x(1 − σ(x))). */                                                                             \
    void k3c_silu_bwd_##S(int64_t n, const real *x, const real *dy, real *dx);                                                \
                                                                                                                              \
    /* dx += dy ⊙ y(1 − y), y = σ(x) the forward's output. */                                                            \
    void k3c_sigmoid_bwd_##S(int64_t n, const real *y, const real *dy, real *dx);                                             \
    /* Moves of activations, so a model step never touches tensor memory from its own loops (a backend does):         \
       x = 0; y += x; dst[r·ld_dst + c] = (or += when accumulate) src[r·ld_src + c] for r < rows, c < cols. */       \
    void k3c_zero_##S(real *x, int64_t n);                                                                                    \
    void k3c_add_##S(int64_t n, const real *x, real *y);                                                                      \
    void k3c_copy2d_##S(int64_t rows, int64_t cols, const real *src, int64_t ld_src, real *dst, int64_t ld_dst,               \
                        int accumulate);                                                                                      \
    /* Activations to and from bf16 bits (uint16_t) for a wire that moves them at half width: real → float → bf16,     \
       rounded to nearest even (k3c_f32_to_bf16); back exactly. */                                                         \
    void k3c_to_bf16_##S(int64_t n, const real *x, uint16_t *y);                                                              \
    void k3c_from_bf16_##S(int64_t n, const uint16_t *x, real *y);                                                            \
                                                                                                                              \
    /* y = softmax(x) per row (max-subtracted); y may alias x. */                                                             \
    int k3c_softmax_fwd_##S(const k3c_softmax_sizes *s, const real *x, real *y, k3c_err *err);                                \
    /* dx += y ⊙ (dy − Σ dy⊙y). */                                                                                     \
    int k3c_softmax_bwd_##S(const k3c_softmax_sizes *s, const real *y, const real *dy, real *dx, k3c_err *err);               \
                                                                                                                              \
    /* Masked mean cross-entropy over logits[T,V]. Position t counts iff targets[t] >= 0 and (mask == NULL or          \
       mask[t] != 0); K3C_EINVAL if a counted target is >= V. *loss = Σ_counted w_t (lse_t − logit[t,target]) / divisor \
       (divisor = s->norm, or the count when 0; loss 0 when nothing counts). lse[T] (required) saves the row           \
       log-sum-exp (every row, counted or not); *count (may be NULL) gets the number of counted positions. */      \
    int k3c_xent_fwd_##S(const k3c_xent_sizes *s, const real *logits, const int32_t *targets, const uint8_t *mask,            \
                         real *lse, double *loss, int64_t *count, k3c_err *err);                                              \
    /* dlogits[t,:] += (softmax(logits[t,:]) − onehot(target)) · w_t · dloss / divisor on counted rows only          \
       (w_t = s->weight[t], or 1; the divisor still counts positions, not weights). */                                 \
    int k3c_xent_bwd_##S(const k3c_xent_sizes *s, const real *logits, const int32_t *targets, const uint8_t *mask,            \
                         const real *lse, double dloss, real *dlogits, k3c_err *err);

K3C_DECLARE_REAL(K3C_BASIC_API)

#endif
