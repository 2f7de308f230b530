/* xent.c — masked (optionally per-position weighted) mean cross-entropy over vocabulary logits (the LM loss), max-subtracted, with its backward.
 * Spec: docs/TRAINING.md §2 packing table (boundary targets masked) and §5.3 (loss masks); docs/MODEL.md §11. */
#include "base/real.h"
#include "ops/basic.h"

static inline int counted(const int32_t *targets, const uint8_t *mask, int64_t t) {
    return targets[t] >= 0 && (!mask || mask[t]);
}

/* Validates sizes and targets; returns the number of counted positions through *count. */
static int check_targets(const k3c_xent_sizes *s, const int32_t *targets, const uint8_t *mask, const char *op,
                         int64_t *count, k3c_err *err) {
    if (!s || s->T < 0 || s->V <= 0 || !(s->norm >= 0)) return k3c_errf(err, K3C_EINVAL, "%s: bad sizes", op);
    int64_t n = 0;
    for (int64_t t = 0; t < s->T; t++) {
        if (!counted(targets, mask, t)) continue;
        if (targets[t] >= s->V)
            return k3c_errf(err, K3C_EINVAL, "%s: position %lld has target %d outside [0, %lld)", op, (long long)t,
                            targets[t], (long long)s->V);
        n++;
    }
    *count = n;
    return K3C_OK;
}

static double divisor(const k3c_xent_sizes *s, int64_t count) { return s->norm > 0 ? s->norm : (double)count; }

int k3c_xent_fwd(const k3c_xent_sizes *s, const real *logits, const int32_t *targets, const uint8_t *mask, real *lse,
                 double *loss, int64_t *count, k3c_err *err) {
    int64_t n = 0;
    int rc = check_targets(s, targets, mask, "xent_fwd", &n, err);
    if (rc) return rc;
    const int64_t V = s->V;
    double sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
    for (int64_t t = 0; t < s->T; t++) {
        const real *x = logits + t * V;
        real mx = x[0];
        for (int64_t j = 1; j < V; j++) mx = x[j] > mx ? x[j] : mx;
        double se = 0;
        for (int64_t j = 0; j < V; j++) se += rexp(x[j] - mx);
        double l = mx + log(se);
        lse[t] = (real)l;
        if (counted(targets, mask, t)) sum += s->weight ? s->weight[t] * (l - x[targets[t]]) : l - x[targets[t]];
    }
    if (count) *count = n;
    *loss = n ? sum / divisor(s, n) : 0.0;
    return K3C_OK;
}

int k3c_xent_bwd(const k3c_xent_sizes *s, const real *logits, const int32_t *targets, const uint8_t *mask,
                 const real *lse, double dloss, real *dlogits, k3c_err *err) {
    int64_t n = 0;
    int rc = check_targets(s, targets, mask, "xent_bwd", &n, err);
    if (rc || !dlogits || n == 0) return rc;
    const int64_t V = s->V;
    const double g = dloss / divisor(s, n);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < s->T; t++) {
        if (!counted(targets, mask, t)) continue;
        const real *x = logits + t * V;
        real *d = dlogits + t * V;
        const double gt = s->weight ? g * s->weight[t] : g;
        for (int64_t j = 0; j < V; j++) d[j] += (real)(gt * rexp(x[j] - lse[t]));
        d[targets[t]] -= (real)gt;
    }
    return K3C_OK;
}
