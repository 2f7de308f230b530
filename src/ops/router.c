/* router.c — the Kimi sigmoid router: top-k over biased sigmoid scores, (renormalised) unbiased weights, the QB cutoff.
 * Implements docs/MODEL.md §6.2 (forward and weight gradient) and the cutoff α_i of §7.2. */
#include "base/real.h"
#include "ops/moe.h"

#include <string.h>

/* Below this many element operations a parallel region costs more than it saves (tiny models, FD tests). */
#define PAR_MIN_WORK 32768

/* The renormalisation denominator's guard (§1.3): tiny enough to vanish in both precisions unless Σ s underflows. */
#define ROUTER_DENOM_EPS 1e-20

static int check_sizes(const k3c_router_sizes *s, const char *op, k3c_err *err) {
    if (!s) return k3c_errf(err, K3C_EINVAL, "%s: NULL sizes", op);
    /* the per-token arrays live on the stack, hence the cap on k */
    if (s->tokens < 0 || s->experts < 1 || s->experts > INT32_MAX || s->top_k < 1 || s->top_k > s->experts ||
        s->top_k > K3C_ROUTER_MAX_TOPK)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes T = %lld, n = %lld, k = %lld (need 1 <= k <= min(n, %d))", op,
                        (long long)s->tokens, (long long)s->experts, (long long)s->top_k, K3C_ROUTER_MAX_TOPK);
    return 0;
}

static inline real sigmoid(real x) { return (real)1 / ((real)1 + rexp(-x)); }

static inline int renormalises(const k3c_router_sizes *s) { return s->renormalize && s->top_k > 1; }

/* Keeps the m best (score, index) pairs of one token in descending order. Experts arrive in ascending index order and a
 * newcomer only displaces strictly smaller scores, so equal scores keep the lower index first. Returns -1 on a
 * non-finite score. */
static int top_m(const real *logits, const real *bias, int64_t n, int64_t m, real *best, int32_t *idx) {
    int64_t have = 0;
    for (int64_t e = 0; e < n; e++) {
        real v = sigmoid(logits[e]) + (bias ? bias[e] : 0);
        if (!isfinite(logits[e]) || !isfinite(v)) return -1;
        if (have == m && !(v > best[m - 1])) continue;
        int64_t p = have < m ? have : m - 1;
        while (p > 0 && v > best[p - 1]) {
            best[p] = best[p - 1];
            idx[p] = idx[p - 1];
            p--;
        }
        best[p] = v;
        idx[p] = (int32_t)e;
        if (have < m) have++;
    }
    return 0;
}

int k3c_router_fwd(const k3c_router_sizes *s, const real *logits, const real *bias, int32_t *topk_ids, real *topk_w,
                   real *cutoff, k3c_err *err) {
    if (check_sizes(s, "router_fwd", err)) return K3C_EINVAL;
    const int64_t T = s->tokens, n = s->experts, k = s->top_k;
    const int64_t m = k < n ? k + 1 : k; /* one extra pick gives the cutoff */
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (T * n > PAR_MIN_WORK / 4)
    for (int64_t t = 0; t < T; t++) {
        real best[k + 1];
        int32_t idx[k + 1];
        if (top_m(logits + t * n, bias, n, m, best, idx)) {
            bad = 1;
            continue;
        }
        real sum = 0;
        for (int64_t j = 0; j < k; j++) sum += sigmoid(logits[t * n + idx[j]]);
        real mult = renormalises(s) ? (real)s->scale / (sum + (real)ROUTER_DENOM_EPS) : (real)s->scale;
        for (int64_t j = 0; j < k; j++) {
            topk_ids[t * k + j] = idx[j];
            topk_w[t * k + j] = sigmoid(logits[t * n + idx[j]]) * mult;
        }
        if (cutoff) cutoff[t] = k < n ? best[k] : (real)-INFINITY;
    }
    if (bad) return k3c_errf(err, K3C_ENUMERIC, "router_fwd: non-finite router logit or correction bias");
    return 0;
}

/* With S = Σ_{j∈T} s_j and p̃ = s/S:  ds_j = rsf·(dp_j − Σ_i dp_i p̃_i)/S (renormalised) or rsf·dp_j, then
 * dlogit_j = ds_j·s_j(1 − s_j) (§6.2). */
int k3c_router_bwd(const k3c_router_sizes *s, const real *logits, const int32_t *topk_ids, const real *dtopk_w,
                   real *dlogits, k3c_err *err) {
    if (check_sizes(s, "router_bwd", err)) return K3C_EINVAL;
    const int64_t T = s->tokens, n = s->experts, k = s->top_k;
    for (int64_t i = 0; i < T * k; i++)
        if (topk_ids[i] < 0 || topk_ids[i] >= n)
            return k3c_errf(err, K3C_EINVAL, "router_bwd: expert id %d at token %lld is outside [0, %lld)", topk_ids[i],
                            (long long)(i / k), (long long)n);
    if (!dlogits) return 0;
    const real rsf = (real)s->scale;
#pragma omp parallel for schedule(static) if (T * k > PAR_MIN_WORK / 16)
    for (int64_t t = 0; t < T; t++) {
        const int32_t *id = topk_ids + t * k;
        const real *dp = dtopk_w + t * k;
        real sc[k];
        real sum = 0, dot = 0;
        for (int64_t j = 0; j < k; j++) sum += sc[j] = sigmoid(logits[t * n + id[j]]);
        const real denom = sum + (real)ROUTER_DENOM_EPS;
        for (int64_t j = 0; j < k; j++) dot += dp[j] * sc[j] / denom;
        for (int64_t j = 0; j < k; j++) {
            real ds = renormalises(s) ? rsf * (dp[j] - dot) / denom : rsf * dp[j];
            dlogits[t * n + id[j]] += ds * sc[j] * ((real)1 - sc[j]);
        }
    }
    return 0;
}
