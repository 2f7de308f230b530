/* kda.h — Kimi Delta Attention on the CPU: the gated delta-rule core (token recurrence and WY/UT chunkwise form,
 * forward and backward) and the forget-gate activation. Spec: docs/MODEL.md §3.1 steps 6–7, §3.2–3.4.
 *
 * Layout (token-major over a packed batch, src/ops/ops.h): q, k [T, H, dk]; v, o [T, H, dv]; g [T, H, dk] = log-decay
 * (natural log, ≤ 0, already activated); beta [T, H]; states h0, ht [n_docs, H, dk, dv]. cu_seqlens holds n_docs + 1
 * int32 offsets 0 .. T (NULL = one document of T tokens); the state restarts from h0[doc] (NULL = zeros) at every
 * document.
 * The core takes q and k AS GIVEN (L2 normalisation is its own op, ops/l2norm.h) and applies `scale` to q:
 *     S_t = (I − β_t k_t k_tᵀ) Diag(e^{g_t}) S_{t−1} + β_t k_t v_tᵀ,   o_t = S_tᵀ (scale · q_t)   (read after write).
 * Backward ADDS into every gradient buffer; a NULL gradient is not computed; dout / dht NULL = zero.
 * All functions exist as _f32 and _f64 (base/real_decl.h) and return 0 or a k3c_status with `err` filled. */
#ifndef K3C_OPS_KDA_H
#define K3C_OPS_KDA_H

#include "ops/ops.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define K3C_KDA_SUBTILE 16 /* rows of an intra-chunk tile (§3.3): the bound is only safe over 16 tokens */
#define K3C_KDA_MAX_CHUNK 256
#define K3C_KDA_MIN_BOUND (-5.5)  /* most negative gate_lower_bound the factored tiles accept in float32 (§3.3) */
#define K3C_KDA_MAX_HEAD_DIM 1024 /* dk, dv limit (per-token vectors of the recurrence live on the stack) */

typedef struct {
    int64_t T, H, dk, dv;
    int n_docs;   /* entries of cu_seqlens minus one; ignored when cu_seqlens is NULL */
    int chunk;    /* chunked path: a multiple of 16 up to K3C_KDA_MAX_CHUNK (16 or 64 in practice; 0 = 64).
                     Recurrent backward: the checkpoint interval (0 = 64). */
    double scale; /* multiplies q; 0 = dk^−1/2 */
    /* 0 = unbounded gate (softplus form): diagonal 16×16 tiles of the intra-chunk matrices use the pairwise exponent
       e^{G_i − G_j} elementwise; off-diagonal tiles are GEMMs with the first row of the later tile as reference (both
       factors ≤ 1, exact for any gate). < 0 = every g ≥ this bound (lower-bound form, e.g. −5; at least
       K3C_KDA_MIN_BOUND): the diagonal tiles are GEMMs too, with the midpoint reference (row 8 of the tile). The op
       checks the bound and returns K3C_EINVAL naming the first violating element. The recurrence ignores this field. */
    double gate_lower_bound;
} k3c_kda_dims;

/* Forget gate (§3.1 step 6, §3.4 stage 6). u = z + dt_bias, a = exp(A_log[h]):
 *   K3C_GATE_SOFTPLUS:    g = −a · softplus(u)
 *   K3C_GATE_LOWER_BOUND: g = g_min · σ(a · u)        (g_min < 0; 0 = −5)
 * z, g [T, H·dk]; dt_bias [H·dk] (NULL = 0); A_log [H] (NULL = absent: a = 1). */
typedef struct {
    int64_t T, H, dk;
    int form;     /* k3c_kda_gate (k3c.h) */
    double g_min; /* lower-bound form only; 0 = −5 */
} k3c_kda_gate_dims;

#define K3C_KDA_API(real, S)                                                                                                  \
    /* ---- token recurrence (§3.1 step 7; the reference, and the decode step: T = n_docs tokens, cu = 0,1,..,n) */          \
    /* Workspace bytes of the forward: the running states when ht is NULL (ws may be NULL when ht is given). */               \
    size_t k3c_kda_recurrent_fwd_workspace_##S(const k3c_kda_dims *d);                                                        \
    /* o [T,H,dv]; ht (may be NULL, may be the same pointer as h0 for in-place decoding). OpenMP over (doc, head). */         \
    int k3c_kda_recurrent_fwd_##S(const k3c_kda_dims *d, const int32_t *cu_seqlens, const real *q, const real *k,             \
                                  const real *v, const real *g, const real *beta, const real *h0, real *o, real *ht,          \
                                  void *ws, k3c_err *err);                                                                    \
    /* Workspace bytes of the recurrent backward: a state checkpoint every d->chunk tokens plus the states of one      \
       segment per (doc, head), recomputed forward from its checkpoint (the recurrence is never run backwards). */      \
    size_t k3c_kda_recurrent_bwd_workspace_##S(const k3c_kda_dims *d);                                                        \
    /* Token-level backward (§3.4 "token-level reference backward"). dout [T,H,dv], dht [n_docs,H,dk,dv]; adds into    \
       dq dk dv dg [like their inputs], dbeta [T,H], dh0 [n_docs,H,dk,dv] (each may be NULL). */     \
    int k3c_kda_recurrent_bwd_##S(const k3c_kda_dims *d, const int32_t *cu_seqlens, const real *q, const real *k,             \
                                  const real *v, const real *g, const real *beta, const real *h0, const real *dout,           \
                                  const real *dht, real *dq, real *dk, real *dv, real *dg, real *dbeta, real *dh0,            \
                                  void *ws, k3c_err *err);                                                                    \
                                                                                                                              \
    /* ---- chunkwise WY/UT form (§3.2; training and prefill). Per chunk: BLAS GEMMs, triangular solves for (I+L)⁻¹.   \
       On the CPU, chunk 16 is the fastest setting (bench/bench_kda_cpu.c). Workspace sizes depend on every field but  \
       scale and gate_lower_bound: recompute them when chunk changes. */  \
    size_t k3c_kda_chunk_fwd_workspace_##S(const k3c_kda_dims *d);                                                            \
    /* Same contract as k3c_kda_recurrent_fwd (ht may be NULL or alias h0). OpenMP over (doc, head). */                       \
    int k3c_kda_chunk_fwd_##S(const k3c_kda_dims *d, const int32_t *cu_seqlens, const real *q, const real *k,                 \
                              const real *v, const real *g, const real *beta, const real *h0, real *o, real *ht,              \
                              void *ws, k3c_err *err);                                                                        \
    /* Workspace bytes of the chunk backward: the state entering every chunk (recomputed by a forward state pass) and  \
       per-(doc, head) chunk scratch. */      \
    size_t k3c_kda_chunk_bwd_workspace_##S(const k3c_kda_dims *d);                                                            \
    /* §3.4 stages 1–5 (intra terms, reverse state pass, WY / inverse backward, pairwise terms, reverse cumsum of dG). \
       Same arguments and accumulation contract as k3c_kda_recurrent_bwd. */   \
    int k3c_kda_chunk_bwd_##S(const k3c_kda_dims *d, const int32_t *cu_seqlens, const real *q, const real *k,                 \
                              const real *v, const real *g, const real *beta, const real *h0, const real *dout,               \
                              const real *dht, real *dq, real *dk, real *dv, real *dg, real *dbeta, real *dh0,                \
                              void *ws, k3c_err *err);                                                                        \
                                                                                                                              \
    /* ---- forget gate (§3.1 step 6): g[T, H·dk] from z[T, H·dk]. */                                                      \
    int k3c_kda_gate_fwd_##S(const k3c_kda_gate_dims *d, const real *z, const real *dt_bias, const real *A_log,               \
                             real *g, k3c_err *err);                                                                          \
    /* §3.4 stage 6: adds dz [T, H·dk], ddt_bias [H·dk] (Σ over tokens), dA_log [H] (Σ over tokens and channels); each \
       may be NULL. Deterministic (reductions in a fixed order). */ \
    int k3c_kda_gate_bwd_##S(const k3c_kda_gate_dims *d, const real *z, const real *dt_bias, const real *A_log,               \
                             const real *dg, real *dz, real *ddt_bias, real *dA_log, k3c_err *err);

K3C_DECLARE_REAL(K3C_KDA_API)

/* ---------------------------------------------------------------- internal to src/ops/kda_*.c */
static inline int k3c_kda_ndocs_(const k3c_kda_dims *d, const int32_t *cu) { return cu ? d->n_docs : 1; }
/* Offset of document i's first token (i = n_docs gives T). */
static inline int64_t k3c_kda_bos_(const int32_t *cu, int64_t T, int i) { return cu ? (int64_t)cu[i] : (i ? T : 0); }
static inline double k3c_kda_scale_(const k3c_kda_dims *d) {
    return d->scale != 0 ? d->scale : 1.0 / sqrt((double)d->dk);
}

/* Sizes and document offsets; `op` names the caller in the message. */
static inline int k3c_kda_check_(const k3c_kda_dims *d, const int32_t *cu, const char *op, k3c_err *err) {
    if (!d || d->T < 0 || d->H <= 0 || d->dk <= 0 || d->dv <= 0 || d->dk > K3C_KDA_MAX_HEAD_DIM ||
        d->dv > K3C_KDA_MAX_HEAD_DIM)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (T, H, dk, dv must be >= 0, > 0, 1..%d, 1..%d)", op,
                        K3C_KDA_MAX_HEAD_DIM, K3C_KDA_MAX_HEAD_DIM);
    if (!cu) return 0;
    if (d->n_docs <= 0) return k3c_errf(err, K3C_EINVAL, "%s: n_docs = %d with cu_seqlens given", op, d->n_docs);
    if (cu[0] != 0 || cu[d->n_docs] != d->T)
        return k3c_errf(err, K3C_EINVAL, "%s: cu_seqlens must run from 0 to T = %lld (got %d .. %d)", op,
                        (long long)d->T, cu[0], cu[d->n_docs]);
    for (int i = 0; i < d->n_docs; i++)
        if (cu[i + 1] < cu[i]) return k3c_errf(err, K3C_EINVAL, "%s: cu_seqlens[%d] < cu_seqlens[%d]", op, i + 1, i);
    return 0;
}

#endif
