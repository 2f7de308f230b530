/* glu.h — the gated activations of every FFN: SiLU-GLU (SwiGLU, Kimi Linear), SiTU-GLU (K3) and GELU-GLU (GeGLU, an
 * experiment arm), forward and backward.
 * Implements docs/MODEL.md §8 (SiTU / SiTU-GLU); follows the op convention of ops/ops.h. */
#ifndef K3C_OPS_GLU_H
#define K3C_OPS_GLU_H

#include "ops/ops.h"

/* Which activation, with its caps. SiLU-GLU: h = silu(g)·u (betas ignored).
 * SiTU-GLU: h = a(g)·c(u), a(g) = β1·tanh(g/β1)·σ(g), c(u) = β2·tanh(u/β2)
 *           (β1 = situ_beta = 4, β2 = situ_linear_beta = 25 in K3).
 * GELU-GLU: h = gelu(g)·u with the exact erf GELU, gelu(g) = g·Φ(g) (betas ignored). */
typedef struct {
    int act;      /* k3c_act: K3C_ACT_SILU, K3C_ACT_SITU or K3C_ACT_GELU */
    double beta1; /* SiTU gate cap (> 0 when act == SITU) */
    double beta2; /* SiTU up cap (> 0 when act == SITU) */
} k3c_glu_act;

/* 1 when the activation is one the GLU implements, with its caps where it has them. */
static inline int k3c_glu_act_ok(const k3c_glu_act *a) {
    return a->act == K3C_ACT_SILU || a->act == K3C_ACT_GELU || (a->act == K3C_ACT_SITU && a->beta1 > 0 && a->beta2 > 0);
}

/* The activation a model config asks for (cfg->act, cfg->situ_beta, cfg->situ_linear_beta). */
static inline k3c_glu_act k3c_glu_act_from_config(const k3c_config *cfg) {
    k3c_glu_act a = {cfg->act, cfg->situ_beta, cfg->situ_linear_beta};
    return a;
}

typedef struct {
    int64_t rows;  /* N (tokens, or routed slots) */
    int64_t inter; /* I (intermediate width) */
    k3c_glu_act act;
} k3c_glu_sizes;

/* Forward:  h[N, I] = act(gate) ⊙ c(up); gate and up are separate [N, I] arrays; h is overwritten (may alias neither).
 * Backward: dgate += dh ⊙ c(up) ⊙ act'(gate), dup += dh ⊙ act(gate) ⊙ c'(up) (exact derivatives of §8; recomputed from
 *           gate/up, nothing saved). Either gradient may be NULL. Returns K3C_EINVAL on bad sizes / betas. */
#define K3C_GLU_API(real, S)                                                                                           \
    int k3c_glu_fwd_##S(const k3c_glu_sizes *s, const real *gate, const real *up, real *h, k3c_err *err);              \
    int k3c_glu_bwd_##S(const k3c_glu_sizes *s, const real *gate, const real *up, const real *dh, real *dgate,         \
                        real *dup, k3c_err *err);
K3C_DECLARE_REAL(K3C_GLU_API)

#endif
