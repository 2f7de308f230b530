/* attnres.h — the (Block) Attention-Residual depth mix: softmax over N sources of their RMS-normalised keys against a
 * learned pseudo-query, forward and backward. Implements docs/MODEL.md §5.1, §5.3, §5.4. */
#ifndef K3C_OPS_ATTNRES_H
#define K3C_OPS_ATTNRES_H

#include "ops/ops.h"

#define K3C_ATTNRES_MAX_SOURCES 256

/* Per token t, with sources v_0 .. v_{N−1} (each [T, D]), pseudo-query w [D] (`*_res_proj.weight`), key-norm weight
 * γ [D] (`*_res_norm.weight`), eps = rms_norm_eps:
 *   rstd_i = 1/sqrt(mean_d(v_i²) + eps),  z_i = (γ ⊙ w) · v_i · rstd_i,  α = softmax_i(z),  h = Σ_i α_i v_i.
 * The whole computation runs in `real` (fp32 or fp64), as §11 asks. */
typedef struct {
    int64_t tokens;  /* T */
    int64_t dim;     /* D */
    int64_t sources; /* N, 1 ≤ N ≤ K3C_ATTNRES_MAX_SOURCES */
    double eps;
} k3c_attnres_sizes;

/* saved (optional, k3c_attnres_saved_elems reals = 2·T·N): fwd writes rstd [T, N] then α [T, N]; bwd reads them
 *   instead of recomputing. NULL in bwd: recomputed from v (needs the workspace).
 * fwd: h [T, D] overwritten (must not alias a source).
 * bwd (§5.4): dv[i] [T, D] += ∂L/∂v_i (dv may be NULL, or any dv[i] NULL), dw [D] += γ ⊙ dŵ, dgamma [D] += w ⊙ dŵ,
 *   dŵ = Σ_t Σ_i dz_i k_i (summed by GEMMs over tokens, deterministic); ws: k3c_attnres_workspace bytes (64-aligned).
 *   A dv[i] may alias another dv[j] (a source read twice), but not a source or dh. */
#define K3C_ATTNRES_API(real, S)                                                                                       \
    size_t k3c_attnres_saved_elems_##S(const k3c_attnres_sizes *s);                                                    \
    size_t k3c_attnres_workspace_##S(const k3c_attnres_sizes *s);                                                      \
    int k3c_attnres_fwd_##S(const k3c_attnres_sizes *s, const real *const *v, const real *w, const real *gamma,        \
                            real *h, real *saved, k3c_err *err);                                                       \
    int k3c_attnres_bwd_##S(const k3c_attnres_sizes *s, const real *const *v, const real *w, const real *gamma,        \
                            const real *saved, const real *dh, real *const *dv, real *dw, real *dgamma, void *ws,      \
                            k3c_err *err);
K3C_DECLARE_REAL(K3C_ATTNRES_API)

#endif
