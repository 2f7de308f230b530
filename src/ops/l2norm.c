/* l2norm.c — row-wise L2 normalisation y = x / sqrt(Σx² + eps), forward and backward.
 * Spec: docs/MODEL.md §3.1 step 4 (eps 1e-6), §3.4 stage 7 (fla l2norm_bwd_kernel). */
#include "base/real.h"
#include "ops/l2norm.h"

#define PAR_MIN_WORK 32768 /* elements below which a loop runs on one thread */

static int l2_check(const k3c_l2norm_dims *d, const char *op, k3c_err *err) {
    if (!d || d->rows < 0 || d->dim <= 0 || d->eps < 0)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (rows >= 0, dim > 0, eps >= 0)", op);
    return 0;
}

int k3c_l2norm_fwd(const k3c_l2norm_dims *d, const real *x, real *y, real *rstd, k3c_err *err) {
    int rc = l2_check(d, "l2norm_fwd", err);
    if (rc) return rc;
    const int64_t n = d->dim;
    const double eps = d->eps > 0 ? d->eps : 1e-6;
#pragma omp parallel for schedule(static) if (d->rows * n > PAR_MIN_WORK)
    for (int64_t r = 0; r < d->rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)x[r * n + i] * x[r * n + i];
        const real rs = (real)(1.0 / sqrt(ss + eps));
        for (int64_t i = 0; i < n; i++) y[r * n + i] = x[r * n + i] * rs;
        if (rstd) rstd[r] = rs;
    }
    return 0;
}

int k3c_l2norm_bwd(const k3c_l2norm_dims *d, const real *y, const real *rstd, const real *dy, real *dx, k3c_err *err) {
    int rc = l2_check(d, "l2norm_bwd", err);
    if (rc) return rc;
    if (!dx || d->rows == 0) return 0;
    if (!rstd) return k3c_errf(err, K3C_EINVAL, "l2norm_bwd: rstd (saved by the forward) is required");
    const int64_t n = d->dim;
#pragma omp parallel for schedule(static) if (d->rows * n > PAR_MIN_WORK)
    for (int64_t r = 0; r < d->rows; r++) {
        double yd = 0;
        for (int64_t i = 0; i < n; i++) yd += (double)y[r * n + i] * dy[r * n + i];
        const real rs = rstd[r];
        for (int64_t i = 0; i < n; i++) dx[r * n + i] += rs * (dy[r * n + i] - y[r * n + i] * (real)yd);
    }
    return 0;
}
