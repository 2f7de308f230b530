/* aux_loss.c — the Switch / GShard auxiliary load-balancing loss of a sigmoid router and its gradient into the logits,
 * a baseline arm against quantile balancing. Spec: docs/TRAINING.md §1.6 (balancing), docs/MODEL.md §6.2. */
#include "base/real.h"
#include "ops/moe.h"

#include <string.h>

/* Below this many element operations a parallel region costs more than it saves (tiny models, FD tests). */
#define PAR_MIN_WORK 32768

static int check(const k3c_router_sizes *s, const int32_t *ids, const char *op, k3c_err *err) {
    if (!s || s->tokens < 0 || s->experts < 1 || s->experts > INT32_MAX || s->top_k < 1 || s->top_k > s->experts)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (need 1 <= k <= n)", op);
    for (int64_t i = 0; i < s->tokens * s->top_k; i++)
        if (ids[i] < -1 || ids[i] >= s->experts)
            return k3c_errf(err, K3C_EINVAL, "%s: expert id %d at token %lld is outside [-1, %lld)", op, ids[i],
                            (long long)(i / s->top_k), (long long)s->experts);
    return 0;
}

size_t k3c_aux_loss_workspace(const k3c_router_sizes *s) {
    return s ? sizeof(double) * (size_t)(s->experts > 0 ? s->experts : 1) : 0;
}

static inline real sigmoid(real x) { return (real)1 / ((real)1 + rexp(-x)); }

/* w[e] = n·f_e/T = n·c_e/(T²·k) in double (the routes counted in id order); 0 for an empty batch. */
static void route_weights(const k3c_router_sizes *s, const int32_t *ids, double *w) {
    const int64_t T = s->tokens, n = s->experts, k = s->top_k;
    memset(w, 0, sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < T * k; i++)
        if (ids[i] >= 0) w[ids[i]] += 1;
    const double scale = T > 0 ? (double)n / ((double)T * (double)T * (double)k) : 0;
    for (int64_t e = 0; e < n; e++) w[e] *= scale;
}

int k3c_aux_loss_fwd(const k3c_router_sizes *s, const real *logits, const int32_t *topk_ids, double alpha, double *loss,
                     void *ws, k3c_err *err) {
    if (check(s, topk_ids, "aux_loss_fwd", err)) return K3C_EINVAL;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "aux_loss_fwd: the workspace is required");
    const int64_t T = s->tokens, n = s->experts;
    for (int64_t i = 0; i < T * n; i++)
        if (!isfinite(logits[i])) return k3c_errf(err, K3C_ENUMERIC, "aux_loss_fwd: non-finite router logit");
    double *w = ws, sum = 0;
    route_weights(s, topk_ids, w);
    for (int64_t t = 0; t < T; t++) { /* Σ_t Σ_e w_e p_te, in token order */
        const real *lg = logits + t * n;
        double S = 0, dot = 0;
        for (int64_t e = 0; e < n; e++) {
            double se = (double)sigmoid(lg[e]);
            S += se;
            dot += w[e] * se;
        }
        sum += dot / S;
    }
    *loss = alpha * sum;
    return 0;
}

int k3c_aux_loss_bwd(const k3c_router_sizes *s, const real *logits, const int32_t *topk_ids, double coef, int64_t row0,
                     int64_t rows, real *dlogits, void *ws, k3c_err *err) {
    if (check(s, topk_ids, "aux_loss_bwd", err)) return K3C_EINVAL;
    if (row0 < 0 || rows < 0 || row0 + rows > s->tokens)
        return k3c_errf(err, K3C_EINVAL, "aux_loss_bwd: rows [%lld, %lld) outside the %lld tokens", (long long)row0,
                        (long long)(row0 + rows), (long long)s->tokens);
    if (!ws) return k3c_errf(err, K3C_EINVAL, "aux_loss_bwd: the workspace is required");
    if (!dlogits || rows == 0) return 0;
    const int64_t n = s->experts;
    for (int64_t i = row0 * n; i < (row0 + rows) * n; i++) /* before anything is added */
        if (!isfinite(logits[i])) return k3c_errf(err, K3C_ENUMERIC, "aux_loss_bwd: non-finite router logit");
    const double *w = ws;
    route_weights(s, topk_ids, ws);
#pragma omp parallel for schedule(static) if (rows * n > PAR_MIN_WORK / 8)
    for (int64_t t = 0; t < rows; t++) {
        const real *lg = logits + (row0 + t) * n;
        real S = 0, dot = 0;
        for (int64_t e = 0; e < n; e++) {
            real se = sigmoid(lg[e]);
            S += se;
            dot += (real)w[e] * se;
        }
        dot /= S;
        for (int64_t j = 0; j < n; j++) {
            real sj = sigmoid(lg[j]);
            dlogits[t * n + j] += (real)coef * ((real)w[j] - dot) / S * sj * ((real)1 - sj);
        }
    }
    return 0;
}
