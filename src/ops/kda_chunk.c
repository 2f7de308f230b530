/* kda_chunk.c — the KDA chunkwise-parallel (WY/UT) algorithm, forward and backward, with 16-row intra-chunk tiles.
 * Spec: docs/MODEL.md §3.2 steps 1–6, §3.3 (tile references, lower-bound gate), §3.4 stages 1–5. */
#include "base/real.h"
#include "ops/kda.h"

#include <string.h>

#if defined(__GNUC__) && !defined(__clang__)
/* Lets GCC if-convert the clamps of kexp (we never read floating-point exception flags), so exp loops vectorise. */
#pragma GCC optimize("no-trapping-math")
#endif

#define PAR_MIN_WORK (1 << 17) /* below this many state elements × tokens, one thread (no fork/join cost) */

#define BC K3C_KDA_SUBTILE
#define SIMD _Pragma("omp simd")

/* OpenBLAS (pthreads build) runs a GEMM on its own thread pool once M·N·K exceeds 65536 · GEMM_MULTITHREAD_THRESHOLD
 * (4); called from inside our OpenMP loop that oversubscribes the cores and serialises on its server lock. Per-chunk
 * GEMMs are therefore split along N (or M) until each piece is below that size and runs on the calling thread. */
#define GEMM_ONE_THREAD_MNK (65536 * 4)

/* C[M,N] = alpha op(A) op(B) + beta C, row-major; tolerates empty shapes. */
static void gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, real alpha, const real *A, int64_t lda, const real *B,
                 int64_t ldb, real beta, real *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0 ? 0 : beta * C[i * ldc + j];
        return;
    }
    if (M * N * K > GEMM_ONE_THREAD_MNK && (N >= 16 || M >= 16)) {
        if (N >= M) { /* columns of op(B) and C */
            const int64_t h = (N / 2 + 7) & ~(int64_t)7;
            gemm(ta, tb, M, h, K, alpha, A, lda, B, ldb, beta, C, ldc);
            gemm(ta, tb, M, N - h, K, alpha, A, lda, tb ? B + h * ldb : B + h, ldb, beta, C + h, ldc);
        } else { /* rows of op(A) and C */
            const int64_t h = (M / 2 + 7) & ~(int64_t)7;
            gemm(ta, tb, h, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            gemm(ta, tb, M - h, N, K, alpha, ta ? A + h : A + h * lda, lda, B, ldb, beta, C + h * ldc, ldc);
        }
        return;
    }
    cblas_rgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/* Solves (I + L) X = B (trans = 0, forward substitution) or (I + L)ᵀ X = B (trans = 1, backward) in place: L strictly
 * lower [n, n] (ld), B [n, nrhs]. Row axpys over the contiguous right-hand sides (n ≤ 256; no BLAS thread pool). */
static void unit_lower_solve(int trans, int64_t n, int64_t nrhs, const real *L, int64_t ld, real *B) {
    if (!trans) {
        for (int64_t i = 1; i < n; i++) {
            real *bi = B + i * nrhs;
            for (int64_t j = 0; j < i; j++) {
                const real l = L[i * ld + j], *bj = B + j * nrhs;
                if (l == 0) continue;
                SIMD for (int64_t e = 0; e < nrhs; e++) bi[e] -= l * bj[e];
            }
        }
    } else {
        for (int64_t i = n - 2; i >= 0; i--) {
            real *bi = B + i * nrhs;
            for (int64_t j = i + 1; j < n; j++) {
                const real l = L[j * ld + i], *bj = B + j * nrhs;
                if (l == 0) continue;
                SIMD for (int64_t e = 0; e < nrhs; e++) bi[e] -= l * bj[e];
            }
        }
    }
}

/* exp that vectorises inside `omp simd` loops and never takes libm's slow underflow path (e^G of a long saturated
 * chunk is far below the smallest normal). float: Cody–Waite reduction x = n ln2 + r and the Cephes degree-6
 * polynomial (≈ 1 ulp), 0 below −87; double: libm exp, 0 below −745. */
#if K3C_REAL_DOUBLE
static inline real kexp(real x) { return x < -745.0 ? 0.0 : exp(x); }
#else
static inline real kexp(real x) {
    const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = rintf(xc * 1.44269504088896341f);
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union {
        uint32_t u;
        float f;
    } sc = {(uint32_t)((int32_t)n + 127) << 23};
    return x < -87.0f ? 0.0f : p * sc.f;
}
#endif

/* ---------------------------------------------------------------- one chunk of one head */
typedef struct {
    int64_t n, m, dk, dv;             /* rows of this chunk; m = leading dimension of the n×n matrices */
    int64_t ldk, ldv, ldb;            /* row strides of q/k/g, v/o, beta: H·dk, H·dv, H */
    const real *q, *k, *v, *g, *beta; /* row 0 of the chunk for this head */
    real scale;
    int factored; /* diagonal tiles as GEMMs with the midpoint reference (needs the bounded gate) */
} chunk_in;

typedef struct {
    double *G;     /* [m, dk]: chunk-local cumsum, in double in both builds: G_i − G_j of nearby rows must
                                 not lose |G|·eps (|G| reaches 64·5 = 320 in a saturated 64-chunk) */
    real *Eg, *Ed; /* [m, dk]: Γ = e^G, e^{G_last − G} */
    real *W, *T1, *T2, *Fc, *Yc; /* [m, dk]: W = (I+L)⁻¹ Diag(β)(K⊙Γ); temporaries; tile column factor and operand */
    real *U, *Vn;                /* [m, dv]: U = (I+L)⁻¹ Diag(β) V; Ṽ = U − W S */
    real *A, *Lk, *L;            /* [m, m]: A = s·pair(Q,K) incl. diagonal; Lk = pair(K,K) strict; L = Diag(β) Lk */
    real *Fr, *Xr, *Tt;          /* tile: row factor [bc, dk], row operands [2bc, dk] (Q⊙F; K⊙F), output [2bc, m] */
    real *dQ, *dK, *dG, *dW, *Cc, *Rq; /* backward: [m, dk] ×5, Rq [2bc, dk] */
    real *dVn;                         /* [m, dv] */
    real *dA, *dL;                     /* [m, m] */
} chunk_ws;

#define ROW_DK                                                                                                         \
    19 /* reals per row and per dk of chunk scratch (counting the [bc, dk] tile buffers as rows and G as
                     two reals) */
#define ROW_DV 3
#define ROW_M 7

static int64_t rowsize(const k3c_kda_dims *d, int64_t C) {
    return (ROW_DK * d->dk + ROW_DV * d->dv + ROW_M * C + 15) & ~(int64_t)15;
}

static chunk_ws carve(real *p, int64_t m, int64_t dk, int64_t dv) {
    chunk_ws w;
    const int64_t bc = m < BC ? m : BC;
    w.G = (double *)p; /* first, so 8-byte aligned (item scratch starts on a 64-byte boundary) */
    p += m * dk * (int64_t)(sizeof(double) / sizeof(real));
    real **mk[] = {&w.Eg, &w.Ed, &w.W, &w.T1, &w.T2, &w.Fc, &w.Yc, &w.dQ, &w.dK, &w.dG, &w.dW, &w.Cc};
    for (size_t i = 0; i < sizeof mk / sizeof *mk; i++, p += m * dk) *mk[i] = p;
    w.Fr = p, p += bc * dk;
    w.Xr = p, p += 2 * bc * dk;
    w.Rq = p, p += 2 * bc * dk;
    w.U = p, p += m * dv;
    w.Vn = p, p += m * dv;
    w.dVn = p, p += m * dv;
    real **mm[] = {&w.A, &w.Lk, &w.L, &w.dA, &w.dL};
    for (size_t i = 0; i < sizeof mm / sizeof *mm; i++, p += m * m) *mm[i] = p;
    w.Tt = p;
    return w;
}

/* F[r, :] = exp(sign · (G[r, :] − Gref)) for `rows` rows. */
static void expfac(int64_t rows, int64_t dk, const double *G, const double *Gref, real sign, real *F) {
    for (int64_t r = 0; r < rows; r++)
        SIMD for (int64_t e = 0; e < dk; e++) F[r * dk + e] = kexp(sign * (real)(G[r * dk + e] - Gref[e]));
}

/* Rows [a, b) against columns [c0, c1) with reference row `ref`: Xr = [Q; K] ⊙ e^{G_i − G_ref} (row side), Yc = K ⊙
 * e^{G_ref − G_j} (column side). Off-diagonal tiles use ref = a, so both exponents are ≤ 0 for any gate (§3.3). */
static void tile_operands(const chunk_in *c, chunk_ws *w, int64_t a, int64_t b, int64_t c0, int64_t c1, int64_t ref) {
    const int64_t dk = c->dk, mb = b - a;
    const double *Gr = w->G + ref * dk;
    expfac(mb, dk, w->G + a * dk, Gr, 1, w->Fr);
    expfac(c1 - c0, dk, w->G + c0 * dk, Gr, -1, w->Fc);
    for (int64_t i = 0; i < mb; i++) SIMD for (int64_t e = 0; e < dk; e++) {
            w->Xr[i * dk + e] = c->q[(a + i) * c->ldk + e] * w->Fr[i * dk + e];
            w->Xr[(mb + i) * dk + e] = c->k[(a + i) * c->ldk + e] * w->Fr[i * dk + e];
        }
    for (int64_t j = 0; j < c1 - c0; j++)
        SIMD for (int64_t e = 0; e < dk; e++) w->Yc[j * dk + e] = c->k[(c0 + j) * c->ldk + e] * w->Fc[j * dk + e];
}

static void tile_fwd_factored(const chunk_in *c, chunk_ws *w, int64_t a, int64_t b, int64_t c0, int64_t c1, int64_t ref,
                              int diag) {
    const int64_t mb = b - a, nc = c1 - c0, m = c->m;
    tile_operands(c, w, a, b, c0, c1, ref);
    gemm(0, 1, 2 * mb, nc, c->dk, 1, w->Xr, c->dk, w->Yc, c->dk, 0, w->Tt, nc);
    for (int64_t i = a; i < b; i++)
        for (int64_t j = c0; j < c1; j++) {
            if (!diag || j <= i) w->A[i * m + j] = w->Tt[(i - a) * nc + (j - c0)];
            if (!diag || j < i) w->Lk[i * m + j] = w->Tt[(mb + i - a) * nc + (j - c0)];
        }
}

/* Diagonal tile with the exact pairwise exponent e^{G_i − G_j} ≤ 1 (unbounded gates). */
static void tile_fwd_pairwise(const chunk_in *c, chunk_ws *w, int64_t a, int64_t b) {
    const int64_t dk = c->dk, m = c->m;
    for (int64_t i = a; i < b; i++) {
        const real *qi = c->q + i * c->ldk, *ki = c->k + i * c->ldk;
        const double *Gi = w->G + i * dk;
        for (int64_t j = a; j <= i; j++) {
            const real *kj = c->k + j * c->ldk;
            const double *Gj = w->G + j * dk;
            real sa = 0, sl = 0;
            _Pragma("omp simd reduction(+ : sa, sl)") for (int64_t e = 0; e < dk; e++) {
                real x = kj[e] * kexp((real)(Gi[e] - Gj[e]));
                sa += qi[e] * x;
                sl += ki[e] * x;
            }
            w->A[i * m + j] = sa;
            if (j < i) w->Lk[i * m + j] = sl;
        }
    }
}

/* §3.2 steps 1 and 3: A[i,j] = Σ_d Q_id K_jd e^{G_id − G_jd} (j ≤ i), Lk the same on K, K (j < i). */
static void intra_fwd(const chunk_in *c, chunk_ws *w) {
    const int64_t n = c->n, m = c->m;
    for (int64_t i = 0; i < n; i++) {
        memset(w->A + i * m, 0, (size_t)n * sizeof(real));
        memset(w->Lk + i * m, 0, (size_t)n * sizeof(real));
    }
    for (int64_t a = 0; a < n; a += BC) {
        const int64_t b = a + BC < n ? a + BC : n;
        if (a > 0) tile_fwd_factored(c, w, a, b, 0, a, a, 0);
        if (c->factored)
            tile_fwd_factored(c, w, a, b, a, b, a + BC / 2 < b - 1 ? a + BC / 2 : b - 1, 1);
        else
            tile_fwd_pairwise(c, w, a, b);
    }
}

/* Everything of a chunk that does not depend on the entering state: G, Γ, e^{G_C − G}, A (with the scale), Lk, L and
 * the WY factors W, U by triangular solves with (I + L) (§3.2 steps 1–3). */
static void chunk_prepare(const chunk_in *c, chunk_ws *w) {
    const int64_t n = c->n, m = c->m, dk = c->dk, dv = c->dv;
    for (int64_t r = 0; r < n; r++)
        SIMD for (int64_t e = 0; e < dk; e++) w->G[r * dk + e] =
            (r ? w->G[(r - 1) * dk + e] : 0) + (double)c->g[r * c->ldk + e];
    const double *Gl = w->G + (n - 1) * dk;
    for (int64_t r = 0; r < n; r++) SIMD for (int64_t e = 0; e < dk; e++) {
            w->Eg[r * dk + e] = kexp((real)w->G[r * dk + e]);
            w->Ed[r * dk + e] = kexp((real)(Gl[e] - w->G[r * dk + e]));
        }
    intra_fwd(c, w);
    for (int64_t i = 0; i < n; i++) {
        const real bi = c->beta[i * c->ldb];
        for (int64_t j = 0; j < n; j++) {
            w->L[i * m + j] = bi * w->Lk[i * m + j];
            w->A[i * m + j] *= c->scale;
        }
        SIMD for (int64_t e = 0; e < dk; e++) w->W[i * dk + e] = bi * c->k[i * c->ldk + e] * w->Eg[i * dk + e];
        SIMD for (int64_t e = 0; e < dv; e++) w->U[i * dv + e] = bi * c->v[i * c->ldv + e];
    }
    unit_lower_solve(0, n, dk, w->L, m, w->W);
    unit_lower_solve(0, n, dv, w->L, m, w->U);
}

/* Ṽ = U − W S (§3.2 step 4). */
static void chunk_vnew(const chunk_in *c, chunk_ws *w, const real *S) {
    memcpy(w->Vn, w->U, (size_t)(c->n * c->dv) * sizeof(real));
    gemm(0, 0, c->n, c->dv, c->dk, -1, w->W, c->dk, S, c->dv, 1, w->Vn, c->dv);
}

/* S ← Diag(γ_C) S + (K ⊙ e^{G_C − G})ᵀ Ṽ (§3.2 step 6). */
static void chunk_state_step(const chunk_in *c, chunk_ws *w, real *S) {
    const int64_t n = c->n, dk = c->dk, dv = c->dv;
    for (int64_t i = 0; i < n; i++)
        SIMD for (int64_t e = 0; e < dk; e++) w->T1[i * dk + e] = c->k[i * c->ldk + e] * w->Ed[i * dk + e];
    for (int64_t e = 0; e < dk; e++) {
        const real gam = w->Eg[(n - 1) * dk + e];
        SIMD for (int64_t j = 0; j < dv; j++) S[e * dv + j] *= gam;
    }
    gemm(1, 0, dk, dv, n, 1, w->T1, dk, w->Vn, dv, 1, S, dv);
}

/* O = s (Q⊙Γ) S + A Ṽ (§3.2 step 5), written straight into o (row stride ldv). */
static void chunk_output(const chunk_in *c, chunk_ws *w, const real *S, real *o) {
    const int64_t n = c->n, dk = c->dk;
    for (int64_t i = 0; i < n; i++)
        SIMD for (int64_t e = 0; e < dk; e++) w->T2[i * dk + e] = c->scale * c->q[i * c->ldk + e] * w->Eg[i * dk + e];
    gemm(0, 0, n, c->dv, dk, 1, w->T2, dk, S, c->dv, 0, o, c->ldv);
    gemm(0, 0, n, c->dv, n, 1, w->A, c->m, w->Vn, c->dv, 1, o, c->ldv);
}

/* ---------------------------------------------------------------- intra-chunk backward (§3.4 stage 4) */
/* With dA = ∂/∂pair(Q,K) and dLk = ∂/∂pair(K,K) on a tile, row side R = dM · (K ⊙ e^{G_ref − G_j}) scaled by
 * e^{G_i − G_ref}, column side C = dMᵀ · ([Q;K] ⊙ e^{G_i − G_ref}) scaled by e^{G_ref − G_j}; dG gets X⊙(row part)
 * at rows and −K⊙(column part) at columns. */
static void tile_bwd_factored(const chunk_in *c, chunk_ws *w, int64_t a, int64_t b, int64_t c0, int64_t c1,
                              int64_t ref) {
    const int64_t mb = b - a, nc = c1 - c0, m = c->m, dk = c->dk;
    tile_operands(c, w, a, b, c0, c1, ref);
    const real *dA = w->dA + a * m + c0, *dL = w->dL + a * m + c0;
    gemm(0, 0, mb, dk, nc, 1, dA, m, w->Yc, dk, 0, w->Rq, dk);
    gemm(0, 0, mb, dk, nc, 1, dL, m, w->Yc, dk, 0, w->Rq + mb * dk, dk);
    gemm(1, 0, nc, dk, mb, 1, dA, m, w->Xr, dk, 0, w->Cc, dk);
    gemm(1, 0, nc, dk, mb, 1, dL, m, w->Xr + mb * dk, dk, 1, w->Cc, dk);
    for (int64_t i = 0; i < mb; i++) SIMD for (int64_t e = 0; e < dk; e++) {
            const int64_t x = (a + i) * dk + e;
            const real f = w->Fr[i * dk + e], rq = f * w->Rq[i * dk + e], rk = f * w->Rq[(mb + i) * dk + e];
            w->dQ[x] += rq;
            w->dK[x] += rk;
            w->dG[x] += c->q[(a + i) * c->ldk + e] * rq + c->k[(a + i) * c->ldk + e] * rk;
        }
    for (int64_t j = 0; j < nc; j++) SIMD for (int64_t e = 0; e < dk; e++) {
            const int64_t x = (c0 + j) * dk + e;
            const real cc = w->Fc[j * dk + e] * w->Cc[j * dk + e];
            w->dK[x] += cc;
            w->dG[x] -= c->k[(c0 + j) * c->ldk + e] * cc;
        }
}

static void tile_bwd_pairwise(const chunk_in *c, chunk_ws *w, int64_t a, int64_t b) {
    const int64_t mb = b - a, m = c->m, dk = c->dk;
    memset(w->Rq, 0, (size_t)(2 * mb * dk) * sizeof(real));
    memset(w->Cc, 0, (size_t)(mb * dk) * sizeof(real));
    for (int64_t i = a; i < b; i++) {
        const real *qi = c->q + i * c->ldk, *ki = c->k + i * c->ldk;
        const double *Gi = w->G + i * dk;
        real *rq = w->Rq + (i - a) * dk, *rk = w->Rq + (mb + i - a) * dk;
        for (int64_t j = a; j < i; j++) {
            const real cA = w->dA[i * m + j], cL = w->dL[i * m + j];
            if (cA == 0 && cL == 0) continue;
            const real *kj = c->k + j * c->ldk;
            const double *Gj = w->G + j * dk;
            real *cc = w->Cc + (j - a) * dk;
            SIMD for (int64_t e = 0; e < dk; e++) {
                const real x = kexp((real)(Gi[e] - Gj[e]));
                rq[e] += cA * kj[e] * x;
                rk[e] += cL * kj[e] * x;
                cc[e] += (cA * qi[e] + cL * ki[e]) * x;
            }
        }
    }
    for (int64_t i = 0; i < mb; i++) SIMD for (int64_t e = 0; e < dk; e++) {
            const int64_t x = (a + i) * dk + e;
            const real qv = c->q[(a + i) * c->ldk + e], kv = c->k[(a + i) * c->ldk + e];
            const real rq = w->Rq[i * dk + e], rk = w->Rq[(mb + i) * dk + e], cc = w->Cc[i * dk + e];
            w->dQ[x] += rq;
            w->dK[x] += rk + cc;
            w->dG[x] += qv * rq + kv * rk - kv * cc;
        }
}

/* The diagonal of A (j = i) has no exponent, hence no gate gradient: it is applied directly and removed from dA, so
 * the tiles never add +x and −x of O(1) into dG (in float32 their rounding would swamp dg, which is O(α) when the gate
 * saturates). */
static void intra_bwd(const chunk_in *c, chunk_ws *w) {
    const int64_t n = c->n, dk = c->dk;
    for (int64_t i = 0; i < n; i++) {
        real *d = w->dA + i * c->m + i;
        SIMD for (int64_t e = 0; e < dk; e++) {
            w->dQ[i * dk + e] += *d * c->k[i * c->ldk + e];
            w->dK[i * dk + e] += *d * c->q[i * c->ldk + e];
        }
        *d = 0;
    }
    for (int64_t a = 0; a < n; a += BC) {
        const int64_t b = a + BC < n ? a + BC : n;
        if (a > 0) tile_bwd_factored(c, w, a, b, 0, a, a);
        if (c->factored)
            tile_bwd_factored(c, w, a, b, a, b, a + BC / 2 < b - 1 ? a + BC / 2 : b - 1);
        else
            tile_bwd_pairwise(c, w, a, b);
    }
}

/* Output-side gradients (§3.4 stages 1–2 for one chunk): dA (w.r.t. the unscaled pair matrix, so ×s), dṼ = Aᵀ dO +
 * (K⊙e^{G_C−G}) dS, dQ from the inter-chunk read, dK_state, and the last-row gate terms. dS = ∂/∂(state after). */
static void chunk_bwd_outputs(const chunk_in *c, chunk_ws *w, const real *h, const real *dS, const real *dO) {
    const int64_t n = c->n, m = c->m, dk = c->dk, dv = c->dv;
    if (dO) {
        gemm(0, 1, n, n, dv, c->scale, dO, c->ldv, w->Vn, dv, 0, w->dA, m);
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = i + 1; j < n; j++) w->dA[i * m + j] = 0;
        gemm(1, 0, n, dv, n, 1, w->A, m, dO, c->ldv, 0, w->dVn, dv);
        gemm(0, 1, n, dk, dv, c->scale, dO, c->ldv, h, dv, 0, w->T2, dk); /* s dO hᵀ */
        for (int64_t i = 0; i < n; i++) SIMD for (int64_t e = 0; e < dk; e++) {
                const real dq = w->T2[i * dk + e] * w->Eg[i * dk + e];
                w->dQ[i * dk + e] += dq;
                w->dG[i * dk + e] += c->q[i * c->ldk + e] * dq;
            }
    } else {
        for (int64_t i = 0; i < n; i++) memset(w->dA + i * m, 0, (size_t)n * sizeof(real));
        memset(w->dVn, 0, (size_t)(n * dv) * sizeof(real));
    }
    for (int64_t i = 0; i < n; i++) /* T1 = K ⊙ e^{G_C − G} */
        SIMD for (int64_t e = 0; e < dk; e++) w->T1[i * dk + e] = c->k[i * c->ldk + e] * w->Ed[i * dk + e];
    gemm(0, 0, n, dv, dk, 1, w->T1, dk, dS, dv, 1, w->dVn, dv);
    gemm(0, 1, n, dk, dv, 1, w->Vn, dv, dS, dv, 0, w->T2, dk); /* Ṽ dSᵀ */
    real *last = w->dG + (n - 1) * dk;
    for (int64_t i = 0; i < n; i++) /* the last row's −kd and +kd cancel exactly: skipped (see intra_bwd) */
        SIMD for (int64_t e = 0; e < dk; e++) {
            const real dks = w->T2[i * dk + e] * w->Ed[i * dk + e], kd = c->k[i * c->ldk + e] * dks;
            w->dK[i * dk + e] += dks;
            if (i < n - 1) w->dG[i * dk + e] -= kd, last[e] += kd;
        }
    for (int64_t e = 0; e < dk; e++) {
        real acc = 0;
        _Pragma("omp simd reduction(+ : acc)") for (int64_t j = 0; j < dv; j++) acc += h[e * dv + j] * dS[e * dv + j];
        last[e] += w->Eg[(n - 1) * dk + e] * acc;
    }
}

/* dS ← Diag(γ_C) dS + s (Q⊙Γ)ᵀ dO − Wᵀ dṼ (§3.4 stage 2): the gradient w.r.t. the state entering the chunk. */
static void chunk_bwd_state(const chunk_in *c, chunk_ws *w, real *dS, const real *dO) {
    const int64_t n = c->n, dk = c->dk, dv = c->dv;
    for (int64_t e = 0; e < dk; e++) {
        const real gam = w->Eg[(n - 1) * dk + e];
        SIMD for (int64_t j = 0; j < dv; j++) dS[e * dv + j] *= gam;
    }
    if (dO) {
        for (int64_t i = 0; i < n; i++)
            SIMD for (int64_t e = 0; e < dk; e++) w->T2[i * dk + e] =
                c->scale * c->q[i * c->ldk + e] * w->Eg[i * dk + e];
        gemm(1, 0, dk, dv, n, 1, w->T2, dk, dO, c->ldv, 1, dS, dv);
    }
    gemm(1, 0, dk, dv, n, -1, w->W, dk, w->dVn, dv, 1, dS, dv);
}

/* WY and inverse backward (§3.4 stage 3): dX = (I+L)⁻ᵀ dW, dY = (I+L)⁻ᵀ dṼ, dL = −StrictTril(dX Wᵀ + dY Uᵀ)
 * (= −Tᵀ dT Tᵀ without forming T), then the β, K, V, Γ terms of X = Diag(β)(K⊙Γ), Y = Diag(β)V and L = Diag(β) Lk.
 * On return dL holds ∂/∂Lk = Diag(β) dL (strictly lower), ready for intra_bwd. */
static void chunk_bwd_wy(const chunk_in *c, chunk_ws *w, const real *h, real *dv, real *dbeta) {
    const int64_t n = c->n, m = c->m, dk = c->dk, DV = c->dv;
    gemm(0, 1, n, dk, DV, -1, w->dVn, DV, h, DV, 0, w->dW, dk); /* dW = −dṼ hᵀ */
    unit_lower_solve(1, n, DV, w->L, m, w->dVn);                /* dY */
    unit_lower_solve(1, n, dk, w->L, m, w->dW);                 /* dX */
    gemm(0, 1, n, n, dk, -1, w->dW, dk, w->W, dk, 0, w->dL, m);
    gemm(0, 1, n, n, DV, -1, w->dVn, DV, w->U, DV, 1, w->dL, m);
    for (int64_t i = 0; i < n; i++) {
        const real bi = c->beta[i * c->ldb];
        real db = 0;
        _Pragma("omp simd reduction(+ : db)") for (int64_t e = 0; e < DV; e++) db +=
            w->dVn[i * DV + e] * c->v[i * c->ldv + e];
        if (dv) SIMD for (int64_t e = 0; e < DV; e++) dv[i * c->ldv + e] += bi * w->dVn[i * DV + e];
        _Pragma("omp simd reduction(+ : db)") for (int64_t e = 0; e < dk; e++) {
            const int64_t x = i * dk + e;
            const real kg = c->k[i * c->ldk + e] * w->Eg[x], dx = w->dW[x];
            db += dx * kg;
            w->dK[x] += bi * w->Eg[x] * dx;
            w->dG[x] += bi * kg * dx;
        }
        for (int64_t j = 0; j < n; j++) {
            real *dl = w->dL + i * m + j;
            if (j < i) {
                db += *dl * w->Lk[i * m + j];
                *dl *= bi;
            } else
                *dl = 0;
        }
        if (dbeta) dbeta[i * c->ldb] += db;
    }
}

/* ---------------------------------------------------------------- workspace and the (doc, head) loop */
typedef struct {
    int64_t *pre_rows, *pre_nc; /* [nd + 1] prefix sums over documents of min(len, C) and of the chunk count */
    real *states, *fixed, *rows;
    int64_t rows_total, nc_total, rowsize, C;
} ck_layout;

static int64_t chunk_len(const k3c_kda_dims *d) { return d->chunk > 0 ? d->chunk : 64; }
static size_t header_bytes(int64_t nd) { return ((size_t)(2 * (nd + 1)) * sizeof(int64_t) + 63) & ~(size_t)63; }

static size_t ck_workspace(const k3c_kda_dims *d, int with_states) {
    const int64_t nd = d->n_docs > 0 ? d->n_docs : 1, C = chunk_len(d), SS = d->dk * d->dv;
    const int64_t rows = d->T < nd * C ? d->T : nd * C, nc = with_states ? d->T / C + nd : 0;
    return header_bytes(nd) + 64 + (size_t)(d->H * (nc * SS + nd * 2 * SS + rows * rowsize(d, C))) * sizeof(real);
}
size_t k3c_kda_chunk_fwd_workspace(const k3c_kda_dims *d) { return ck_workspace(d, 0); }
size_t k3c_kda_chunk_bwd_workspace(const k3c_kda_dims *d) { return ck_workspace(d, 1); }

static ck_layout ck_lay(const k3c_kda_dims *d, const int32_t *cu, int nd, void *ws, int with_states) {
    ck_layout l;
    l.C = chunk_len(d);
    l.rowsize = rowsize(d, l.C);
    l.pre_rows = (int64_t *)ws;
    l.pre_nc = l.pre_rows + nd + 1;
    l.pre_rows[0] = l.pre_nc[0] = 0;
    for (int i = 0; i < nd; i++) {
        const int64_t len = k3c_kda_bos_(cu, d->T, i + 1) - k3c_kda_bos_(cu, d->T, i);
        l.pre_rows[i + 1] = l.pre_rows[i] + (len < l.C ? len : l.C);
        l.pre_nc[i + 1] = l.pre_nc[i] + (len + l.C - 1) / l.C;
    }
    l.rows_total = l.pre_rows[nd];
    l.nc_total = with_states ? l.pre_nc[nd] : 0;
    l.states = (real *)((char *)ws + header_bytes(nd));
    l.fixed = l.states + d->H * l.nc_total * d->dk * d->dv;
    l.rows = l.fixed + (int64_t)nd * d->H * 2 * d->dk * d->dv;
    l.rows = (real *)(((uintptr_t)l.rows + 63) & ~(uintptr_t)63); /* rowsize is a multiple of 16 reals */
    return l;
}

static int ck_check(const k3c_kda_dims *d, const int32_t *cu, const real *g, void *ws, const char *op, k3c_err *err) {
    int rc = k3c_kda_check_(d, cu, op, err);
    if (rc) return rc;
    const int64_t C = chunk_len(d);
    if (C % BC != 0 || C > K3C_KDA_MAX_CHUNK)
        return k3c_errf(err, K3C_EINVAL, "%s: chunk = %d must be a multiple of %d up to %d", op, d->chunk, BC,
                        K3C_KDA_MAX_CHUNK);
    if (!ws) return k3c_errf(err, K3C_EINVAL, "%s: ws is NULL", op);
    if (d->gate_lower_bound > 0 || (d->gate_lower_bound < 0 && d->gate_lower_bound < K3C_KDA_MIN_BOUND))
        return k3c_errf(err, K3C_EINVAL, "%s: gate_lower_bound = %g outside [%g, 0]", op, d->gate_lower_bound,
                        K3C_KDA_MIN_BOUND);
    if (d->gate_lower_bound < 0) { /* the factored diagonal tiles are only finite when the bound really holds */
        const int64_t n = d->T * d->H * d->dk;
        const real lb = (real)d->gate_lower_bound;
        int64_t bad = n;
#pragma omp parallel for reduction(min : bad) if (n > PAR_MIN_WORK)
        for (int64_t i = 0; i < n; i++)
            if (!(g[i] >= lb) && i < bad) bad = i;
        if (bad < n)
            return k3c_errf(err, K3C_EINVAL, "%s: g[%lld] = %g below gate_lower_bound %g (token %lld, head %lld)", op,
                            (long long)bad, (double)g[bad], d->gate_lower_bound, (long long)(bad / (d->H * d->dk)),
                            (long long)(bad / d->dk % d->H));
    }
    return 0;
}

/* The chunk [t, t + n) of head h. */
static chunk_in chunk_at(const k3c_kda_dims *d, int64_t h, int64_t t, int64_t n, int64_t m, const real *q,
                         const real *k, const real *v, const real *g, const real *beta) {
    const int64_t H = d->H, xk = (t * H + h) * d->dk;
    chunk_in c = {n,
                  m,
                  d->dk,
                  d->dv,
                  H * d->dk,
                  H * d->dv,
                  H,
                  q + xk,
                  k + xk,
                  v + (t * H + h) * d->dv,
                  g + xk,
                  beta + t * H + h,
                  (real)k3c_kda_scale_(d),
                  d->gate_lower_bound < 0};
    return c;
}

int k3c_kda_chunk_fwd(const k3c_kda_dims *d, const int32_t *cu_seqlens, const real *q, const real *k, const real *v,
                      const real *g, const real *beta, const real *h0, real *o, real *ht, void *ws, k3c_err *err) {
    int rc = ck_check(d, cu_seqlens, g, ws, "kda_chunk_fwd", err);
    if (rc) return rc;
    const int nd = k3c_kda_ndocs_(d, cu_seqlens);
    const ck_layout l = ck_lay(d, cu_seqlens, nd, ws, 0);
    const int64_t H = d->H, SS = d->dk * d->dv, items = (int64_t)nd * H;
#pragma omp parallel for schedule(dynamic, 1) if (d->T * H * SS > PAR_MIN_WORK)
    for (int64_t it = 0; it < items; it++) {
        const int doc = (int)(it / H);
        const int64_t h = it % H, m = l.pre_rows[doc + 1] - l.pre_rows[doc];
        const int64_t t0 = k3c_kda_bos_(cu_seqlens, d->T, doc), t1 = k3c_kda_bos_(cu_seqlens, d->T, doc + 1);
        real *S = ht ? ht + it * SS : l.fixed + it * 2 * SS;
        if (!h0)
            memset(S, 0, (size_t)SS * sizeof(real));
        else if (h0 + it * SS != S)
            memcpy(S, h0 + it * SS, (size_t)SS * sizeof(real));
        chunk_ws w = carve(l.rows + (h * l.rows_total + l.pre_rows[doc]) * l.rowsize, m, d->dk, d->dv);
        for (int64_t t = t0; t < t1; t += l.C) {
            const chunk_in c = chunk_at(d, h, t, t + l.C < t1 ? l.C : t1 - t, m, q, k, v, g, beta);
            chunk_prepare(&c, &w);
            chunk_vnew(&c, &w, S);
            chunk_output(&c, &w, S, o + (t * H + h) * d->dv);
            chunk_state_step(&c, &w, S);
        }
    }
    return 0;
}

/* Adds a chunk's dQ, dK and the reverse cumsum of dG (§3.4 stage 5) into the strided outputs. */
static void chunk_bwd_emit(const chunk_in *c, const chunk_ws *w, real *dq, real *dk, real *dg) {
    const int64_t n = c->n, DK = c->dk;
    for (int64_t i = 0; i < n; i++) SIMD for (int64_t e = 0; e < DK; e++) {
            if (dq) dq[i * c->ldk + e] += w->dQ[i * DK + e];
            if (dk) dk[i * c->ldk + e] += w->dK[i * DK + e];
        }
    if (!dg) return;
    for (int64_t e = 0; e < DK; e++) {
        real acc = 0;
        for (int64_t i = n - 1; i >= 0; i--) {
            acc += w->dG[i * DK + e];
            dg[i * c->ldk + e] += acc;
        }
    }
}

int k3c_kda_chunk_bwd(const k3c_kda_dims *d, const int32_t *cu_seqlens, const real *q, const real *k, const real *v,
                      const real *g, const real *beta, const real *h0, const real *dout, const real *dht, real *dq,
                      real *dk, real *dv, real *dg, real *dbeta, real *dh0, void *ws, k3c_err *err) {
    int rc = ck_check(d, cu_seqlens, g, ws, "kda_chunk_bwd", err);
    if (rc) return rc;
    const int nd = k3c_kda_ndocs_(d, cu_seqlens);
    const ck_layout l = ck_lay(d, cu_seqlens, nd, ws, 1);
    const int64_t H = d->H, DK = d->dk, DV = d->dv, SS = DK * DV, items = (int64_t)nd * H;
#pragma omp parallel for schedule(dynamic, 1) if (d->T * H * SS > PAR_MIN_WORK)
    for (int64_t it = 0; it < items; it++) {
        const int doc = (int)(it / H);
        const int64_t h = it % H, m = l.pre_rows[doc + 1] - l.pre_rows[doc];
        const int64_t t0 = k3c_kda_bos_(cu_seqlens, d->T, doc), t1 = k3c_kda_bos_(cu_seqlens, d->T, doc + 1);
        const int64_t nc = l.pre_nc[doc + 1] - l.pre_nc[doc];
        real *hs = l.states + (h * l.nc_total + l.pre_nc[doc]) * SS, *S = l.fixed + it * 2 * SS, *dS = S + SS;
        chunk_ws w = carve(l.rows + (h * l.rows_total + l.pre_rows[doc]) * l.rowsize, m, DK, DV);
        /* Forward state pass: the state entering every chunk. */
        if (h0)
            memcpy(S, h0 + it * SS, (size_t)SS * sizeof(real));
        else
            memset(S, 0, (size_t)SS * sizeof(real));
        for (int64_t ci = 0; ci < nc; ci++) {
            const int64_t t = t0 + ci * l.C;
            memcpy(hs + ci * SS, S, (size_t)SS * sizeof(real));
            if (ci == nc - 1) break;
            const chunk_in c = chunk_at(d, h, t, l.C, m, q, k, v, g, beta);
            chunk_prepare(&c, &w);
            chunk_vnew(&c, &w, S);
            chunk_state_step(&c, &w, S);
        }
        if (dht)
            memcpy(dS, dht + it * SS, (size_t)SS * sizeof(real));
        else
            memset(dS, 0, (size_t)SS * sizeof(real));
        for (int64_t ci = nc - 1; ci >= 0; ci--) {
            const int64_t t = t0 + ci * l.C, n = t + l.C < t1 ? l.C : t1 - t;
            const chunk_in c = chunk_at(d, h, t, n, m, q, k, v, g, beta);
            const real *hc = hs + ci * SS, *dO = dout ? dout + (t * H + h) * DV : NULL;
            chunk_prepare(&c, &w);
            chunk_vnew(&c, &w, hc);
            memset(w.dQ, 0, (size_t)(n * DK) * sizeof(real));
            memset(w.dK, 0, (size_t)(n * DK) * sizeof(real));
            memset(w.dG, 0, (size_t)(n * DK) * sizeof(real));
            chunk_bwd_outputs(&c, &w, hc, dS, dO);
            chunk_bwd_state(&c, &w, dS, dO);
            const int64_t xv = (t * H + h) * DV, xk = (t * H + h) * DK;
            chunk_bwd_wy(&c, &w, hc, dv ? dv + xv : NULL, dbeta ? dbeta + t * H + h : NULL);
            intra_bwd(&c, &w);
            chunk_bwd_emit(&c, &w, dq ? dq + xk : NULL, dk ? dk + xk : NULL, dg ? dg + xk : NULL);
        }
        if (dh0)
            for (int64_t e = 0; e < SS; e++) dh0[it * SS + e] += dS[e];
    }
    return 0;
}
