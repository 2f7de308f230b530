/* attnres.c — the AttnRes depth mix h = Σ_i softmax_i((γ⊙w)·v_i/rms(v_i)) v_i over N sources, forward and backward.
 * Implements docs/MODEL.md §5.1 (the mix), §5.3 (used by Block AttnRes) and §5.4 (gradients). */
#include "base/real.h"
#include "ops/attnres.h"

#include <string.h>

/* Below this many element operations a parallel region costs more than it saves (tiny models, FD tests). */
#define PAR_MIN_WORK 32768

static int check_sizes(const k3c_attnres_sizes *s, const char *op, k3c_err *err) {
    if (!s) return k3c_errf(err, K3C_EINVAL, "%s: NULL sizes", op);
    if (s->tokens < 0 || s->dim < 1 || s->sources < 1 || s->sources > K3C_ATTNRES_MAX_SOURCES || !(s->eps >= 0) ||
        s->tokens > INT32_MAX || s->dim > INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes T = %lld, D = %lld, N = %lld (1..%d), eps = %g", op,
                        (long long)s->tokens, (long long)s->dim, (long long)s->sources, K3C_ATTNRES_MAX_SOURCES,
                        s->eps);
    return 0;
}

static size_t al64(size_t b) { return (b + 63) & ~(size_t)63; }

size_t k3c_attnres_saved_elems(const k3c_attnres_sizes *s) {
    return check_sizes(s, "attnres_saved_elems", NULL) ? 0 : (size_t)(2 * s->tokens * s->sources);
}

/* c [T, N] = dz·rstd (the GEMM operand for dŵ), dŵ [D], then rstd and α [T, N] each when recomputed */
size_t k3c_attnres_workspace(const k3c_attnres_sizes *s) {
    if (check_sizes(s, "attnres_workspace", NULL)) return 0;
    const size_t tn = (size_t)(s->tokens * s->sources) * sizeof(real);
    return al64(tn) + al64((size_t)s->dim * sizeof(real)) + al64(2 * tn);
}

/* One token: rstd_i, α_i (and z_i when z != NULL) from the N source rows at token t. */
static void mix_weights(const k3c_attnres_sizes *s, const real *const *v, const real *w, const real *gamma, int64_t t,
                        real *rstd, real *alpha, real *z) {
    const int64_t N = s->sources, D = s->dim;
    real zz[K3C_ATTNRES_MAX_SOURCES], zmax = -INFINITY, sum = 0;
    for (int64_t i = 0; i < N; i++) {
        const real *x = v[i] + t * D;
        real ss = 0, dot = 0;
        for (int64_t d = 0; d < D; d++) {
            ss += x[d] * x[d];
            dot += gamma[d] * w[d] * x[d];
        }
        rstd[i] = (real)1 / rsqrt(ss / (real)D + (real)s->eps);
        zz[i] = dot * rstd[i];
        if (zz[i] > zmax) zmax = zz[i];
    }
    for (int64_t i = 0; i < N; i++) sum += alpha[i] = rexp(zz[i] - zmax);
    for (int64_t i = 0; i < N; i++) alpha[i] /= sum;
    if (z) memcpy(z, zz, (size_t)N * sizeof(real));
}

int k3c_attnres_fwd(const k3c_attnres_sizes *s, const real *const *v, const real *w, const real *gamma, real *h,
                    real *saved, k3c_err *err) {
    if (check_sizes(s, "attnres_fwd", err)) return K3C_EINVAL;
    const int64_t T = s->tokens, N = s->sources, D = s->dim;
#pragma omp parallel for schedule(static) if (T * N * D > PAR_MIN_WORK)
    for (int64_t t = 0; t < T; t++) {
        real rstd[K3C_ATTNRES_MAX_SOURCES], alpha[K3C_ATTNRES_MAX_SOURCES];
        mix_weights(s, v, w, gamma, t, rstd, alpha, NULL);
        real *ht = h + t * D;
        memset(ht, 0, (size_t)D * sizeof(real));
        for (int64_t i = 0; i < N; i++) {
            const real *x = v[i] + t * D;
            for (int64_t d = 0; d < D; d++) ht[d] += alpha[i] * x[d];
        }
        if (saved) {
            memcpy(saved + t * N, rstd, (size_t)N * sizeof(real));
            memcpy(saved + T * N + t * N, alpha, (size_t)N * sizeof(real));
        }
    }
    return 0;
}

/* Per token (§5.4): dp_i = dh·v_i, dz_i = α_i (dp_i − Σ_j α_j dp_j),
 * dv_i += α_i dh + dz_i·rstd_i·(ŵ − z_i·k_i/D) with k_i = v_i·rstd_i; dŵ = Σ_t Σ_i dz_i k_i via one GEMM per source. */
int k3c_attnres_bwd(const k3c_attnres_sizes *s, const real *const *v, const real *w, const real *gamma,
                    const real *saved, const real *dh, real *const *dv, real *dw, real *dgamma, void *ws,
                    k3c_err *err) {
    if (check_sizes(s, "attnres_bwd", err)) return K3C_EINVAL;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "attnres_bwd: no workspace (k3c_attnres_workspace bytes)");
    const int64_t T = s->tokens, N = s->sources, D = s->dim;
    const size_t tn = (size_t)(T * N) * sizeof(real);
    real *c = ws, *dwh = (real *)((unsigned char *)ws + al64(tn));
    real *rec = (real *)((unsigned char *)ws + al64(tn) + al64((size_t)D * sizeof(real)));
#pragma omp parallel for schedule(static) if (T * N * D > PAR_MIN_WORK)
    for (int64_t t = 0; t < T; t++) {
        real rs[K3C_ATTNRES_MAX_SOURCES], al[K3C_ATTNRES_MAX_SOURCES], z[K3C_ATTNRES_MAX_SOURCES];
        real dp[K3C_ATTNRES_MAX_SOURCES], hd = 0;
        if (saved) { /* the forward's statistics; only the logits z are recomputed (one dot per source) */
            memcpy(rs, saved + t * N, (size_t)N * sizeof(real));
            memcpy(al, saved + T * N + t * N, (size_t)N * sizeof(real));
            for (int64_t i = 0; i < N; i++) {
                const real *x = v[i] + t * D;
                real dot = 0;
                for (int64_t d = 0; d < D; d++) dot += gamma[d] * w[d] * x[d];
                z[i] = dot * rs[i];
            }
        } else {
            mix_weights(s, v, w, gamma, t, rs, al, z);
            memcpy(rec + t * N, rs, (size_t)N * sizeof(real));
            memcpy(rec + T * N + t * N, al, (size_t)N * sizeof(real));
        }
        const real *g = dh + t * D;
        for (int64_t i = 0; i < N; i++) {
            const real *x = v[i] + t * D;
            real acc = 0;
            for (int64_t d = 0; d < D; d++) acc += g[d] * x[d];
            dp[i] = acc;
            hd += al[i] * acc;
        }
        for (int64_t i = 0; i < N; i++) {
            const real dz = al[i] * (dp[i] - hd), a = dz * rs[i], b = dz * rs[i] * z[i] * rs[i] / (real)D;
            c[t * N + i] = a;
            if (!dv || !dv[i]) continue;
            const real *x = v[i] + t * D;
            real *o = dv[i] + t * D;
            for (int64_t d = 0; d < D; d++) o[d] += al[i] * g[d] + a * gamma[d] * w[d] - b * x[d];
        }
    }
    if (!dw && !dgamma) return 0;
    memset(dwh, 0, (size_t)D * sizeof(real));
    if (T > 0)
        for (int64_t i = 0; i < N; i++) /* dŵ[1, D] += c[:, i]ᵀ v_i */
            cblas_rgemm(CblasRowMajor, CblasTrans, CblasNoTrans, 1, (int)D, (int)T, 1, c + i, (int)N, v[i], (int)D, 1,
                        dwh, (int)D);
    for (int64_t d = 0; d < D; d++) {
        if (dw) dw[d] += gamma[d] * dwh[d];
        if (dgamma) dgamma[d] += w[d] * dwh[d];
    }
    return 0;
}
