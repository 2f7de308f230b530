/* moe.c — routed experts (plan → gather → per-expert GLU MLP → weighted combine) and the dense GLU MLP, fwd and bwd.
 * Implements docs/MODEL.md §9.2 (u = Σ p_i E_i(z) and its backward), with §8 for the expert activation. */
#include "base/carve.h"
#include "base/real.h"
#include "ops/moe.h"

#include <stdint.h>
#include <string.h>

/* Below this many element operations a parallel region costs more than it saves (tiny models, FD tests). */
#define PAR_MIN_WORK 32768

/* cblas.h pulls in <complex.h>, whose macro I would shadow the spec's name for the intermediate width */
#undef I

/* ---------------------------------------------------------------- dispatch plan (plain C: compiled once) */
#if !K3C_REAL_DOUBLE
int k3c_moe_plan(int64_t tokens, int64_t top_k, int64_t experts, const int32_t *topk_ids, int64_t *offsets,
                 int32_t *perm, int32_t *pos, k3c_err *err) {
    if (tokens < 0 || top_k < 1 || experts < 1 || tokens * top_k >= INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "moe_plan: bad sizes T = %lld, k = %lld, E = %lld (T·k must be < 2^31)",
                        (long long)tokens, (long long)top_k, (long long)experts);
    const int64_t S = tokens * top_k;
    for (int64_t i = 0; i < S; i++)
        if (topk_ids[i] < -1 || topk_ids[i] >= experts)
            return k3c_errf(err, K3C_EINVAL, "moe_plan: expert id %d at token %lld, slot %lld is outside [-1, %lld)",
                            topk_ids[i], (long long)(i / top_k), (long long)(i % top_k), (long long)experts);
    /* counting sort by expert; one serial pass keeps rows in ascending slot order within each expert. offsets[e] serves
     * as expert e's fill cursor and ends at its end = the next expert's start, hence the final shift. */
    memset(offsets, 0, (size_t)(experts + 1) * sizeof *offsets);
    for (int64_t i = 0; i < S; i++)
        if (topk_ids[i] >= 0) offsets[topk_ids[i] + 1]++;
    for (int64_t e = 0; e < experts; e++) offsets[e + 1] += offsets[e];
    for (int64_t i = 0; i < S; i++) {
        int32_t e = topk_ids[i];
        pos[i] = -1;
        if (e < 0) continue;
        int64_t row = offsets[e]++;
        perm[row] = (int32_t)i;
        pos[i] = (int32_t)row;
    }
    for (int64_t e = experts - 1; e > 0; e--) offsets[e] = offsets[e - 1];
    offsets[0] = 0;
    return 0;
}
#endif

/* ---------------------------------------------------------------- permutation steps */
void k3c_moe_gather(int64_t rows, int64_t top_k, int64_t dim, const int32_t *perm, const real *x, real *xperm) {
#pragma omp parallel for schedule(static) if (rows * dim > PAR_MIN_WORK)
    for (int64_t r = 0; r < rows; r++)
        memcpy(xperm + r * dim, x + (int64_t)(perm[r] / top_k) * dim, (size_t)dim * sizeof(real));
}

void k3c_moe_combine(int64_t tokens, int64_t top_k, int64_t dim, const int32_t *pos, const real *w, const real *yperm,
                     real *y) {
#pragma omp parallel for schedule(static) if (tokens * top_k * dim > PAR_MIN_WORK)
    for (int64_t t = 0; t < tokens; t++) {
        real *yt = y + t * dim;
        memset(yt, 0, (size_t)dim * sizeof(real));
        for (int64_t j = 0; j < top_k; j++) {
            int32_t r = pos[t * top_k + j];
            if (r < 0) continue;
            const real p = w[t * top_k + j], *src = yperm + (int64_t)r * dim;
            for (int64_t d = 0; d < dim; d++) yt[d] += p * src[d];
        }
    }
}

void k3c_moe_gather_bwd(int64_t tokens, int64_t top_k, int64_t dim, const int32_t *pos, const real *dxperm, real *dx) {
#pragma omp parallel for schedule(static) if (tokens * top_k * dim > PAR_MIN_WORK)
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t j = 0; j < top_k; j++) {
            int32_t r = pos[t * top_k + j];
            if (r < 0) continue;
            const real *src = dxperm + (int64_t)r * dim;
            for (int64_t d = 0; d < dim; d++) dx[t * dim + d] += src[d];
        }
}

void k3c_moe_combine_bwd(int64_t tokens, int64_t top_k, int64_t dim, const int32_t *pos, const real *w,
                         const real *yperm, const real *dy, real *dyperm, real *dw) {
#pragma omp parallel for schedule(static) if (tokens * top_k * dim > PAR_MIN_WORK)
    for (int64_t i = 0; i < tokens * top_k; i++) {
        int32_t r = pos[i];
        if (r < 0) continue;
        const real *g = dy + (i / top_k) * dim, *o = yperm + (int64_t)r * dim;
        if (dw) {
            real acc = 0;
            for (int64_t d = 0; d < dim; d++) acc += g[d] * o[d];
            dw[i] += acc;
        }
        if (dyperm)
            for (int64_t d = 0; d < dim; d++) dyperm[(int64_t)r * dim + d] = w[i] * g[d];
    }
}

/* ---------------------------------------------------------------- one expert on a block of n contiguous rows */
/* G = X W1ᵀ, U = X W3ᵀ [n, I]; the activation H = act(G) ⊙ c(U). */
static void expert_gate_up(int64_t n, int64_t D, int64_t I, const real *X, const real *W1, const real *W3, real *G,
                           real *U) {
    const int in = (int)n, iD = (int)D, iI = (int)I;
    cblas_rgemm(CblasRowMajor, CblasNoTrans, CblasTrans, in, iI, iD, 1, X, iD, W1, iD, 0, G, iI);
    cblas_rgemm(CblasRowMajor, CblasNoTrans, CblasTrans, in, iI, iD, 1, X, iD, W3, iD, 0, U, iI);
}

/* Y [n, D] = H W2ᵀ with H = glu(G, U) left in H. */
static void expert_down(int64_t n, int64_t D, int64_t I, const k3c_glu_act *act, const real *G, const real *U,
                        const real *W2, real *H, real *Y) {
    k3c_glu_sizes gs = {n, I, *act};
    k3c_glu_fwd(&gs, G, U, H, NULL); /* act was checked by the caller */
    cblas_rgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)D, (int)I, 1, H, (int)I, W2, (int)I, 0, Y,
                (int)D);
}

typedef struct {
    real *dW1, *dW3, *dW2; /* this expert's slices, ADDED to; NULL = not needed */
    real *dp;              /* [n] per-row router-weight gradients, ADDED to; NULL = not needed */
    real *dX;              /* [n, D], written as beta_dx·dX + ∂L/∂X; NULL = not needed */
    real beta_dx;
} expert_grads;

/* Backward of y_r = p_r · W2 (act(W1 x_r) ⊙ c(W3 x_r)) for the n rows (p = NULL: all 1). Scratch H, dH, dU [n, I].
 * dp_r = ⟨dy_r, W2 h_r⟩ = ⟨W2ᵀ dy_r, h_r⟩, so the expert output E(x) need not be kept. */
static void expert_bwd(int64_t n, int64_t D, int64_t I, const k3c_glu_act *act, const real *X, const real *W1,
                       const real *W3, const real *W2, const real *G, const real *U, const real *p, const real *dY,
                       const expert_grads *g, real *H, real *dH, real *dU) {
    const int in = (int)n, iD = (int)D, iI = (int)I;
    k3c_glu_sizes gs = {n, I, *act};
    k3c_glu_fwd(&gs, G, U, H, NULL);
    cblas_rgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, in, iI, iD, 1, dY, iD, W2, iI, 0, dH, iI);
    if (p) {
#pragma omp parallel for schedule(static) if (n * I > PAR_MIN_WORK)
        for (int64_t r = 0; r < n; r++) {
            real *h = H + r * I, *dh = dH + r * I, dot = 0;
            for (int64_t i = 0; i < I; i++) dot += dh[i] * h[i];
            if (g->dp) g->dp[r] += dot;
            for (int64_t i = 0; i < I; i++) {
                h[i] *= p[r];
                dh[i] *= p[r];
            }
        }
    }
    /* H now holds p ⊙ h, the effective input of W2 */
    if (g->dW2) cblas_rgemm(CblasRowMajor, CblasTrans, CblasNoTrans, iD, iI, in, 1, dY, iD, H, iI, 1, g->dW2, iI);
    if (!g->dW1 && !g->dW3 && !g->dX) return;
    real *dG = H; /* H is dead from here on */
    memset(dG, 0, (size_t)(n * I) * sizeof(real));
    memset(dU, 0, (size_t)(n * I) * sizeof(real));
    k3c_glu_bwd(&gs, G, U, dH, dG, dU, NULL);
    if (g->dW1) cblas_rgemm(CblasRowMajor, CblasTrans, CblasNoTrans, iI, iD, in, 1, dG, iI, X, iD, 1, g->dW1, iD);
    if (g->dW3) cblas_rgemm(CblasRowMajor, CblasTrans, CblasNoTrans, iI, iD, in, 1, dU, iI, X, iD, 1, g->dW3, iD);
    if (g->dX) {
        cblas_rgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, in, iD, iI, 1, dG, iI, W1, iD, g->beta_dx, g->dX, iD);
        cblas_rgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, in, iD, iI, 1, dU, iI, W3, iD, 1, g->dX, iD);
    }
}

/* ---------------------------------------------------------------- buffers carved from saved / ws */
static size_t al64(size_t b) { return (b + 63) & ~(size_t)63; }

/* Layouts are carved with base/carve.h over memory the caller sized with the same layout (a NULL base only measures),
 * so the cap is not checked here. */
static k3c_carver carver_at(void *base) { return k3c_carver_at(base, SIZE_MAX, 64); }

typedef struct {
    int64_t *offsets;    /* [E + 1] */
    int32_t *perm, *pos; /* [S] */
    real *G, *U;         /* [S, I] gate / up pre-activations in permuted order */
} moe_saved;

typedef struct {
    real *X, *Y;       /* [S, D]: gathered x; fwd: expert outputs; bwd: gathered dy */
    real *H, *dH, *dU; /* [S, I] */
    real *p, *dp;      /* [S] permuted router weights and their gradients */
} moe_scratch;

/* BLAS takes int sizes, and the plan int32 rows */
static int moe_check(const k3c_moe_sizes *s, const char *op, k3c_err *err) {
    if (!s) return k3c_errf(err, K3C_EINVAL, "%s: NULL sizes", op);
    if (s->tokens < 0 || s->dim < 1 || s->inter < 1 || s->experts < 1 || s->top_k < 1 || s->dim > INT32_MAX ||
        s->inter > INT32_MAX || s->tokens * s->top_k >= INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes T = %lld, D = %lld, I = %lld, E = %lld, k = %lld", op,
                        (long long)s->tokens, (long long)s->dim, (long long)s->inter, (long long)s->experts,
                        (long long)s->top_k);
    if (!k3c_glu_act_ok(&s->act))
        return k3c_errf(err, K3C_EINVAL,
                        "%s: activation %d with betas (%g, %g) is not SiLU, GELU or SiTU with betas > 0", op,
                        s->act.act, s->act.beta1, s->act.beta2);
    return 0;
}

static size_t moe_saved_layout(const k3c_moe_sizes *s, void *base, moe_saved *sv) {
    const size_t S = (size_t)(s->tokens * s->top_k), SI = S * (size_t)s->inter * sizeof(real);
    k3c_carver p = carver_at(base);
    moe_saved tmp;
    if (!sv) sv = &tmp;
    sv->offsets = k3c_carve(&p, (size_t)(s->experts + 1) * sizeof(int64_t));
    sv->perm = k3c_carve(&p, S * sizeof(int32_t));
    sv->pos = k3c_carve(&p, S * sizeof(int32_t));
    sv->G = k3c_carve(&p, SI);
    sv->U = k3c_carve(&p, SI);
    return p.off;
}

static size_t moe_scratch_layout(const k3c_moe_sizes *s, void *base, moe_scratch *sc) {
    const size_t S = (size_t)(s->tokens * s->top_k);
    const size_t SD = S * (size_t)s->dim * sizeof(real), SI = S * (size_t)s->inter * sizeof(real);
    k3c_carver p = carver_at(base);
    moe_scratch tmp;
    if (!sc) sc = &tmp;
    sc->X = k3c_carve(&p, SD);
    sc->Y = k3c_carve(&p, SD);
    sc->H = k3c_carve(&p, SI);
    sc->dH = k3c_carve(&p, SI);
    sc->dU = k3c_carve(&p, SI);
    sc->p = k3c_carve(&p, S * sizeof(real));
    sc->dp = k3c_carve(&p, S * sizeof(real));
    return p.off;
}

size_t k3c_moe_saved_bytes(const k3c_moe_sizes *s) {
    return moe_check(s, "moe_saved_bytes", NULL) ? 0 : moe_saved_layout(s, NULL, NULL);
}

/* Scratch, then room for the plan and G/U when the caller keeps no saved buffer. */
size_t k3c_moe_workspace(const k3c_moe_sizes *s) {
    if (moe_check(s, "moe_workspace", NULL)) return 0;
    return moe_scratch_layout(s, NULL, NULL) + moe_saved_layout(s, NULL, NULL);
}

/* Plan, gather x, and the gate/up GEMMs for every expert: the part of the forward that the backward may recompute. */
static int moe_front(const k3c_moe_sizes *s, const real *x, const int32_t *ids, const real *w1, const real *w3,
                     const moe_saved *sv, const moe_scratch *sc, k3c_err *err) {
    const int64_t D = s->dim, I = s->inter;
    int rc = k3c_moe_plan(s->tokens, s->top_k, s->experts, ids, sv->offsets, sv->perm, sv->pos, err);
    if (rc) return rc;
    k3c_moe_gather(sv->offsets[s->experts], s->top_k, D, sv->perm, x, sc->X);
    for (int64_t e = 0; e < s->experts; e++) {
        const int64_t r0 = sv->offsets[e], n = sv->offsets[e + 1] - r0;
        if (n == 0) continue;
        expert_gate_up(n, D, I, sc->X + r0 * D, w1 + e * I * D, w3 + e * I * D, sv->G + r0 * I, sv->U + r0 * I);
    }
    return 0;
}

int k3c_moe_fwd(const k3c_moe_sizes *s, const real *x, const int32_t *topk_ids, const real *topk_w, const real *w1,
                const real *w3, const real *w2, real *y, void *saved, void *ws, k3c_err *err) {
    if (moe_check(s, "moe_fwd", err)) return K3C_EINVAL;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "moe_fwd: no workspace (k3c_moe_workspace bytes)");
    const int64_t D = s->dim, I = s->inter;
    moe_scratch sc;
    moe_saved sv;
    size_t nsc = moe_scratch_layout(s, ws, &sc);
    moe_saved_layout(s, saved ? saved : (unsigned char *)ws + nsc, &sv);
    int rc = moe_front(s, x, topk_ids, w1, w3, &sv, &sc, err);
    if (rc) return rc;
    for (int64_t e = 0; e < s->experts; e++) {
        const int64_t r0 = sv.offsets[e], n = sv.offsets[e + 1] - r0;
        if (n == 0) continue;
        expert_down(n, D, I, &s->act, sv.G + r0 * I, sv.U + r0 * I, w2 + e * D * I, sc.H + r0 * I, sc.Y + r0 * D);
    }
    k3c_moe_combine(s->tokens, s->top_k, D, sv.pos, topk_w, sc.Y, y);
    return 0;
}

int k3c_moe_bwd(const k3c_moe_sizes *s, const real *x, const int32_t *topk_ids, const real *topk_w, const real *w1,
                const real *w3, const real *w2, const void *saved, const real *dy, real *dx, real *dw1, real *dw3,
                real *dw2, real *dtopk_w, void *ws, k3c_err *err) {
    if (moe_check(s, "moe_bwd", err)) return K3C_EINVAL;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "moe_bwd: no workspace (k3c_moe_workspace bytes)");
    const int64_t T = s->tokens, k = s->top_k, D = s->dim, I = s->inter;
    moe_scratch sc;
    moe_saved sv;
    size_t nsc = moe_scratch_layout(s, ws, &sc);
    if (saved) {
        moe_saved_layout(s, (void *)saved, &sv); /* only read below */
        k3c_moe_gather(sv.offsets[s->experts], k, D, sv.perm, x, sc.X);
    } else {
        moe_saved_layout(s, (unsigned char *)ws + nsc, &sv);
        int rc = moe_front(s, x, topk_ids, w1, w3, &sv, &sc, err);
        if (rc) return rc;
    }
    const int64_t rows = sv.offsets[s->experts];
    k3c_moe_gather(rows, k, D, sv.perm, dy, sc.Y);
#pragma omp parallel for schedule(static) if (rows > PAR_MIN_WORK)
    for (int64_t r = 0; r < rows; r++) {
        sc.p[r] = topk_w[sv.perm[r]];
        sc.dp[r] = 0;
    }
    for (int64_t e = 0; e < s->experts; e++) {
        const int64_t r0 = sv.offsets[e], n = sv.offsets[e + 1] - r0;
        if (n == 0) continue;
        /* dX overwrites this expert's rows of the gathered x, which are dead once dW1/dW3 are formed */
        expert_grads g = {dw1 ? dw1 + e * I * D : NULL, dw3 ? dw3 + e * I * D : NULL,
                          dw2 ? dw2 + e * D * I : NULL, sc.dp + r0,
                          dx ? sc.X + r0 * D : NULL,    0};
        expert_bwd(n, D, I, &s->act, sc.X + r0 * D, w1 + e * I * D, w3 + e * I * D, w2 + e * D * I, sv.G + r0 * I,
                   sv.U + r0 * I, sc.p + r0, sc.Y + r0 * D, &g, sc.H + r0 * I, sc.dH + r0 * I, sc.dU + r0 * I);
    }
    /* un-permute, summing each token's slots in slot order (deterministic) */
#pragma omp parallel for schedule(static) if (T * k * D > PAR_MIN_WORK)
    for (int64_t t = 0; t < T; t++) {
        for (int64_t j = 0; j < k; j++) {
            int32_t r = sv.pos[t * k + j];
            if (r < 0) continue;
            if (dtopk_w) dtopk_w[t * k + j] += sc.dp[r];
            if (dx)
                for (int64_t d = 0; d < D; d++) dx[t * D + d] += sc.X[(int64_t)r * D + d];
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- dense GLU MLP */
static int mlp_check(const k3c_mlp_sizes *s, const char *op, k3c_err *err) {
    if (!s) return k3c_errf(err, K3C_EINVAL, "%s: NULL sizes", op);
    if (s->tokens < 0 || s->dim < 1 || s->inter < 1 || s->tokens > INT32_MAX || s->dim > INT32_MAX ||
        s->inter > INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes T = %lld, D = %lld, I = %lld", op, (long long)s->tokens,
                        (long long)s->dim, (long long)s->inter);
    if (!k3c_glu_act_ok(&s->act))
        return k3c_errf(err, K3C_EINVAL,
                        "%s: activation %d with betas (%g, %g) is not SiLU, GELU or SiTU with betas > 0", op,
                        s->act.act, s->act.beta1, s->act.beta2);
    return 0;
}

static size_t mlp_ti_bytes(const k3c_mlp_sizes *s) { return al64((size_t)(s->tokens * s->inter) * sizeof(real)); }

size_t k3c_mlp_saved_bytes(const k3c_mlp_sizes *s) {
    return mlp_check(s, "mlp_saved_bytes", NULL) ? 0 : 2 * mlp_ti_bytes(s);
}

/* H, dH, dU, then G and U when nothing was saved */
size_t k3c_mlp_workspace(const k3c_mlp_sizes *s) {
    return mlp_check(s, "mlp_workspace", NULL) ? 0 : 5 * mlp_ti_bytes(s);
}

int k3c_mlp_fwd(const k3c_mlp_sizes *s, const real *x, const real *w_gate, const real *w_up, const real *w_down,
                real *y, void *saved, void *ws, k3c_err *err) {
    if (mlp_check(s, "mlp_fwd", err)) return K3C_EINVAL;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "mlp_fwd: no workspace (k3c_mlp_workspace bytes)");
    if (s->tokens == 0) return 0;
    const size_t b = mlp_ti_bytes(s);
    k3c_carver p = carver_at(ws), q = carver_at(saved ? saved : (unsigned char *)ws + 3 * b);
    real *H = k3c_carve(&p, b), *G = k3c_carve(&q, b), *U = k3c_carve(&q, b);
    expert_gate_up(s->tokens, s->dim, s->inter, x, w_gate, w_up, G, U);
    expert_down(s->tokens, s->dim, s->inter, &s->act, G, U, w_down, H, y);
    return 0;
}

int k3c_mlp_bwd(const k3c_mlp_sizes *s, const real *x, const real *w_gate, const real *w_up, const real *w_down,
                const void *saved, const real *dy, real *dx, real *dw_gate, real *dw_up, real *dw_down, void *ws,
                k3c_err *err) {
    if (mlp_check(s, "mlp_bwd", err)) return K3C_EINVAL;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "mlp_bwd: no workspace (k3c_mlp_workspace bytes)");
    if (s->tokens == 0) return 0;
    const size_t b = mlp_ti_bytes(s);
    k3c_carver p = carver_at(ws), q = carver_at(saved ? (unsigned char *)saved : (unsigned char *)ws + 3 * b);
    real *H = k3c_carve(&p, b), *dH = k3c_carve(&p, b), *dU = k3c_carve(&p, b), *G = k3c_carve(&q, b),
         *U = k3c_carve(&q, b);
    if (!saved) expert_gate_up(s->tokens, s->dim, s->inter, x, w_gate, w_up, G, U);
    expert_grads g = {dw_gate, dw_up, dw_down, NULL, dx, 1};
    expert_bwd(s->tokens, s->dim, s->inter, &s->act, x, w_gate, w_up, w_down, G, U, NULL, dy, &g, H, dH, dU);
    return 0;
}
