/* moe.h — the Kimi sigmoid router, the routed-expert MoE op (dispatch → per-expert GLU MLP → weighted combine) and the
 * dense GLU MLP (layer 0, shared experts). Implements docs/MODEL.md §6.2, §7.2 (the cutoff α), §8, §9. */
#ifndef K3C_OPS_MOE_H
#define K3C_OPS_MOE_H

#include "ops/glu.h"
#include "ops/ops.h"

/* ================================================================ router (§6.2)
 * The model computes logits = x W_rᵀ itself (full hidden x, also in K3's latent MoE), then:
 *   s = σ(logits);  T = TopK_k(s + bias);  p_i = s_i / (Σ_{j∈T} s_j + 1e-20) · scale   (renormalise && k > 1)
 *                                          p_i = s_i · scale                            (otherwise)
 * Selection uses the biased score, weights the UNbiased s (docs/FORMATS.md §7 #4).
 * Order of the k outputs per token: descending biased score; ties go to the LOWER expert index (so selection is a pure
 * function of the scores, the same on every backend and rank).
 * cutoff (optional, [T]): the (k+1)-th largest biased score per token = the QB cutoff α_i of §7.2 (same tie rule);
 * -INFINITY when k == n. Non-finite logits or bias → K3C_ENUMERIC. */
#define K3C_ROUTER_MAX_TOPK 1024
typedef struct {
    int64_t tokens;  /* T */
    int64_t experts; /* n */
    int64_t top_k;   /* k, 1 ≤ k ≤ min(n, K3C_ROUTER_MAX_TOPK) */
    int renormalize; /* moe_renormalize; applied only when k > 1 (as HF / mlx / NeMo) */
    double scale;    /* routed_scaling_factor (2.446 Kimi Linear, 1.0 K3) */
} k3c_router_sizes;

/* fwd: logits [T, n], bias [n] or NULL → topk_ids int32 [T, k], topk_w [T, k], cutoff [T] or NULL (all overwritten).
 * bwd: dlogits [T, n] += ∂L/∂logits given dtopk_w [T, k] (the selection and bias are constants; s recomputed from
 *      logits). topk_ids: the forward's, unmodified (every id in [0, n); marking dropped slots −1 is for the MoE op
 *      only, the renormalisation still ran over all k). Non-selected experts get 0 added. */
#define K3C_ROUTER_API(real, S)                                                                                        \
    int k3c_router_fwd_##S(const k3c_router_sizes *s, const real *logits, const real *bias, int32_t *topk_ids,         \
                           real *topk_w, real *cutoff, k3c_err *err);                                                  \
    int k3c_router_bwd_##S(const k3c_router_sizes *s, const real *logits, const int32_t *topk_ids,                     \
                           const real *dtopk_w, real *dlogits, k3c_err *err);
K3C_DECLARE_REAL(K3C_ROUTER_API)

/* ================================================================ Switch / GShard auxiliary load-balancing loss
 * A baseline arm for quantile balancing (docs/TRAINING.md §1.6): with f_e = c_e / (T·k) the fraction of the T·k routes
 * that went to expert e (c_e counted from topk_ids, a constant of the loss) and P_e = (1/T) Σ_t p_te the mean router
 * probability, p_te = s_te / Σ_j s_tj the sigmoid scores normalised over all n experts (DeepSeek-V3's form for a sigmoid
 * router),  L_aux = α · n · Σ_e f_e P_e  (1·α at perfect balance).
 * fwd: *loss = L_aux over all T tokens (host double).
 * bwd: dlogits [rows, n] += coef · ∂(L_aux/α)/∂logits for tokens [row0, row0 + rows) (coef = α · the loss's scale):
 *      ∂/∂s_tj = (w_j − Σ_e w_e p_te) / Σ_e s_te with w_e = n·f_e/T, then · s_tj(1 − s_tj). f counts every token, so a
 *      caller that owns only some rows (tensor parallelism) still gets the whole batch's loss gradient for its rows.
 * topk_ids [T, k]: −1 = a dropped slot (not counted); others must be in [0, n) (K3C_EINVAL). ws: aux_loss_workspace
 * bytes. Non-finite logits → K3C_ENUMERIC. */
#define K3C_AUX_LOSS_API(real, S)                                                                                      \
    size_t k3c_aux_loss_workspace_##S(const k3c_router_sizes *s);                                                      \
    int k3c_aux_loss_fwd_##S(const k3c_router_sizes *s, const real *logits, const int32_t *topk_ids, double alpha,     \
                             double *loss, void *ws, k3c_err *err);                                                    \
    int k3c_aux_loss_bwd_##S(const k3c_router_sizes *s, const real *logits, const int32_t *topk_ids, double coef,      \
                             int64_t row0, int64_t rows, real *dlogits, void *ws, k3c_err *err);
K3C_DECLARE_REAL(K3C_AUX_LOSS_API)

/* ================================================================ dispatch plan (the future EP all-to-all)
 * A routed slot is (t, j), slot id t·k + j. The plan sorts live slots by expert (counting sort, stable: ascending slot
 * id inside an expert, so deterministic): rows offsets[e] .. offsets[e+1]−1 of the permuted buffers belong to expert e,
 * perm[row] = slot id, pos[slot] = row. An id of −1 marks a dropped slot (padding token, capacity drop): it gets no
 * row, pos = −1, contributes nothing and receives no gradient. offsets[E] = number of live rows.
 * Returns K3C_EINVAL for an id outside [−1, E) or T·k ≥ 2^31. Plain (not real-typed). */
int k3c_moe_plan(int64_t tokens, int64_t top_k, int64_t experts, const int32_t *topk_ids, int64_t *offsets,
                 int32_t *perm, int32_t *pos, k3c_err *err);

/* gather:  xperm[row] = x[perm[row] / k] for row < rows (dispatch).
 * gather_bwd (its adjoint): dx[t] += yperm[pos[t·k + j]] for each live slot j of t, added into dx one slot at a time
 *          in slot order (as k3c_moe_bwd's un-permute).
 * combine: y[t] = Σ_j w[t, j] · yperm[pos[t·k + j]] over live slots (overwrites y; a token with no live slot gets 0);
 *          summed in slot order, so the result is deterministic for any thread count.
 * combine_bwd: for each live slot i = t·k + j (r = pos[i]): dyperm[r] = w[i] · dy[t] (rows of no live slot untouched)
 *          and dw[i] += ⟨dy[t], yperm[r]⟩ (summed over d in order, then added); dyperm or dw may be NULL.
 * Each row belongs to at most one slot (a plan's pos), so every output element has one writer. */
#define K3C_MOE_PERM_API(real, S)                                                                                      \
    void k3c_moe_gather_##S(int64_t rows, int64_t top_k, int64_t dim, const int32_t *perm, const real *x,              \
                            real *xperm);                                                                              \
    void k3c_moe_gather_bwd_##S(int64_t tokens, int64_t top_k, int64_t dim, const int32_t *pos, const real *dxperm,    \
                                real *dx);                                                                             \
    void k3c_moe_combine_##S(int64_t tokens, int64_t top_k, int64_t dim, const int32_t *pos, const real *w,            \
                             const real *yperm, real *y);                                                              \
    void k3c_moe_combine_bwd_##S(int64_t tokens, int64_t top_k, int64_t dim, const int32_t *pos, const real *w,        \
                                 const real *yperm, const real *dy, real *dyperm, real *dw);
K3C_DECLARE_REAL(K3C_MOE_PERM_API)

/* ================================================================ routed experts (§9.2 inner part: u = Σ p_i E_i(z))
 *   y[t] = Σ_{j<k} p[t,j] · w2_e (act(w1_e x_t) ⊙ c(w3_e x_t)),  e = topk_ids[t, j]
 * x [T, D] (D = hidden for Kimi Linear, latent ℓ for K3), experts stacked in checkpoint layout:
 * w1 (gate) [E, I, D], w3 (up) [E, I, D], w2 (down) [E, D, I]. The router weight is applied after the down projection
 * (NeMo's apply_router_weight_after_down; mathematically equal to folding it in before).
 * Steps: plan → gather → per expert 3 GEMMs (cblas_rgemm) + GLU → combine.
 *
 * saved (optional): k3c_moe_saved_bytes bytes, 64-aligned. fwd stores the plan and the gate/up pre-activations there;
 *   bwd given the same buffer (and the same x, ids) skips recomputing them (2 of the 3 forward GEMMs). NULL: bwd
 *   recomputes.
 * ws: k3c_moe_workspace bytes, 64-aligned, scratch for one fwd or one bwd call (sized for the recompute case).
 * fwd overwrites y. bwd ADDS into dx [T, D], dw1, dw3, dw2 (stacked as the weights) and dtopk_w [T, k] where
 *   dtopk_w[t, j] += ⟨dy_t, E_e(x_t)⟩; any of them may be NULL. Dropped slots (id −1) get nothing. */
typedef struct {
    int64_t tokens;  /* T */
    int64_t dim;     /* D */
    int64_t inter;   /* I (moe_intermediate_size) */
    int64_t experts; /* E (experts held here) */
    int64_t top_k;   /* k */
    k3c_glu_act act;
} k3c_moe_sizes;

#define K3C_MOE_API(real, S)                                                                                           \
    size_t k3c_moe_saved_bytes_##S(const k3c_moe_sizes *s);                                                            \
    size_t k3c_moe_workspace_##S(const k3c_moe_sizes *s);                                                              \
    int k3c_moe_fwd_##S(const k3c_moe_sizes *s, const real *x, const int32_t *topk_ids, const real *topk_w,            \
                        const real *w1, const real *w3, const real *w2, real *y, void *saved, void *ws, k3c_err *err); \
    int k3c_moe_bwd_##S(const k3c_moe_sizes *s, const real *x, const int32_t *topk_ids, const real *topk_w,            \
                        const real *w1, const real *w3, const real *w2, const void *saved, const real *dy, real *dx,   \
                        real *dw1, real *dw3, real *dw2, real *dtopk_w, void *ws, k3c_err *err);
K3C_DECLARE_REAL(K3C_MOE_API)

/* ================================================================ dense GLU MLP (layer 0, fused shared experts)
 *   y = w_down (act(w_gate x) ⊙ c(w_up x)) on every token; w_gate, w_up [I, D], w_down [D, I].
 * The same GEMM + GLU path as one routed expert with every token at weight 1, without the permutation.
 * saved (optional, k3c_mlp_saved_bytes): gate/up pre-activations [T, I] each; ws: k3c_mlp_workspace bytes.
 * fwd overwrites y; bwd ADDS into dx, dw_gate, dw_up, dw_down (each may be NULL). */
typedef struct {
    int64_t tokens; /* T */
    int64_t dim;    /* D */
    int64_t inter;  /* I */
    k3c_glu_act act;
} k3c_mlp_sizes;

#define K3C_MLP_API(real, S)                                                                                           \
    size_t k3c_mlp_saved_bytes_##S(const k3c_mlp_sizes *s);                                                            \
    size_t k3c_mlp_workspace_##S(const k3c_mlp_sizes *s);                                                              \
    int k3c_mlp_fwd_##S(const k3c_mlp_sizes *s, const real *x, const real *w_gate, const real *w_up,                   \
                        const real *w_down, real *y, void *saved, void *ws, k3c_err *err);                             \
    int k3c_mlp_bwd_##S(const k3c_mlp_sizes *s, const real *x, const real *w_gate, const real *w_up,                   \
                        const real *w_down, const void *saved, const real *dy, real *dx, real *dw_gate, real *dw_up,   \
                        real *dw_down, void *ws, k3c_err *err);
K3C_DECLARE_REAL(K3C_MLP_API)

#endif
