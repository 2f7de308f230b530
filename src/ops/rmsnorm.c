/* rmsnorm.c — RMSNorm over rows with one shared weight vector (plain, per head) and the sigmoid-gated KDA output form.
 * Spec: docs/MODEL.md §1.2 (forward, backward), §1.3 (eps), §3.1 step 8 and §3.4 item 8 (gated form). */
#include "base/real.h"
#include "ops/basic.h"

static int check_sizes(const k3c_rmsnorm_sizes *s, const char *op, k3c_err *err) {
    if (!s || s->rows < 0 || s->D <= 0 || !(s->eps >= 0))
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (rows %lld, D %lld, eps %g)", op, s ? (long long)s->rows : -1,
                        s ? (long long)s->D : -1, s ? s->eps : 0.0);
    return K3C_OK;
}

/* The mean of squares is summed in double (the spec asks for at least fp32 statistics). */
static real row_rstd(const real *x, int64_t D, double eps) {
    double ss = 0;
    for (int64_t j = 0; j < D; j++) ss += (double)x[j] * x[j];
    return (real)(1.0 / sqrt(ss / (double)D + eps));
}

/* gate == NULL: y = w ⊙ x·r; otherwise y = (w ⊙ x·r) ⊙ σ(gate). */
static void rms_fwd(const k3c_rmsnorm_sizes *s, const real *x, const real *gate, const real *w, real *y, real *rstd) {
    const int64_t D = s->D;
    /* a decode step's few rows run on one thread: a fork/join costs more than they do */
#pragma omp parallel for schedule(static) if (s->rows * D > 32768)
    for (int64_t i = 0; i < s->rows; i++) {
        const real *xi = x + i * D;
        real r = row_rstd(xi, D, s->eps), *yi = y + i * D;
        if (rstd) rstd[i] = r;
        if (gate)
            for (int64_t j = 0; j < D; j++) yi[j] = w[j] * (xi[j] * r) * rsigmoid(gate[i * D + j]);
        else
            for (int64_t j = 0; j < D; j++) yi[j] = w[j] * (xi[j] * r);
    }
}

/* The effective upstream gradient of the normalisation: dy, or dy ⊙ σ(gate) in the gated form. */
static inline real eff_dy(const real *dy, const real *gate, int64_t idx) {
    return gate ? dy[idx] * rsigmoid(gate[idx]) : dy[idx];
}

/* dx and dgate: rows in parallel. dx = r (w⊙g − x̂ · mean(x̂⊙w⊙g)), g the effective dy. */
static void rms_bwd_rows(const k3c_rmsnorm_sizes *s, const real *x, const real *gate, const real *w, const real *rstd,
                         const real *dy, real *dx, real *dgate) {
    const int64_t D = s->D;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < s->rows; i++) {
        const real *xi = x + i * D;
        const double r = rstd[i];
        if (dgate)
            for (int64_t j = 0; j < D; j++) {
                double sg = rsigmoid(gate[i * D + j]);
                dgate[i * D + j] += (real)(dy[i * D + j] * (w[j] * xi[j] * r) * sg * (1 - sg));
            }
        if (!dx) continue;
        double c = 0;
        for (int64_t j = 0; j < D; j++) c += xi[j] * r * w[j] * eff_dy(dy, gate, i * D + j);
        c /= (double)D;
        for (int64_t j = 0; j < D; j++)
            dx[i * D + j] += (real)(r * (w[j] * eff_dy(dy, gate, i * D + j) - xi[j] * r * c));
    }
}

/* dw = Σ_rows g ⊙ x̂: column blocks in parallel, rows summed in order in double (deterministic, no workspace). */
static void rms_bwd_weight(const k3c_rmsnorm_sizes *s, const real *x, const real *gate, const real *rstd,
                           const real *dy, real *dw) {
    enum { CB = 64 };
    const int64_t D = s->D, nb = (D + CB - 1) / CB;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t c0 = b * CB, c1 = c0 + CB < D ? c0 + CB : D;
        double acc[CB] = {0};
        for (int64_t i = 0; i < s->rows; i++)
            for (int64_t j = c0; j < c1; j++)
                acc[j - c0] += (double)eff_dy(dy, gate, i * D + j) * x[i * D + j] * rstd[i];
        for (int64_t j = c0; j < c1; j++) dw[j] += (real)acc[j - c0];
    }
}

int k3c_rmsnorm_fwd(const k3c_rmsnorm_sizes *s, const real *x, const real *w, real *y, real *rstd, k3c_err *err) {
    int rc = check_sizes(s, "rmsnorm_fwd", err);
    if (rc) return rc;
    rms_fwd(s, x, NULL, w, y, rstd);
    return K3C_OK;
}

int k3c_rmsnorm_bwd(const k3c_rmsnorm_sizes *s, const real *x, const real *w, const real *rstd, const real *dy,
                    real *dx, real *dw, k3c_err *err) {
    int rc = check_sizes(s, "rmsnorm_bwd", err);
    if (rc) return rc;
    if (!rstd) return k3c_errf(err, K3C_EINVAL, "rmsnorm_bwd: rstd (saved by the forward) is required");
    if (dx) rms_bwd_rows(s, x, NULL, w, rstd, dy, dx, NULL);
    if (dw) rms_bwd_weight(s, x, NULL, rstd, dy, dw);
    return K3C_OK;
}

int k3c_gated_rmsnorm_fwd(const k3c_rmsnorm_sizes *s, const real *o, const real *gate, const real *w, real *y,
                          real *rstd, k3c_err *err) {
    int rc = check_sizes(s, "gated_rmsnorm_fwd", err);
    if (rc) return rc;
    rms_fwd(s, o, gate, w, y, rstd);
    return K3C_OK;
}

int k3c_gated_rmsnorm_bwd(const k3c_rmsnorm_sizes *s, const real *o, const real *gate, const real *w, const real *rstd,
                          const real *dy, real *do_, real *dgate, real *dw, k3c_err *err) {
    int rc = check_sizes(s, "gated_rmsnorm_bwd", err);
    if (rc) return rc;
    if (!rstd) return k3c_errf(err, K3C_EINVAL, "gated_rmsnorm_bwd: rstd (saved by the forward) is required");
    if (do_ || dgate) rms_bwd_rows(s, o, gate, w, rstd, dy, do_, dgate);
    if (dw) rms_bwd_weight(s, o, gate, rstd, dy, dw);
    return K3C_OK;
}
