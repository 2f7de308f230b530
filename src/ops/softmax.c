/* softmax.c — max-subtracted softmax over the rows of a matrix and its backward (used by AttnRes mixes and tests).
 * Spec: docs/MODEL.md §5 (depth softmax), §11 (softmax statistics in at least fp32). */
#include "base/real.h"
#include "ops/basic.h"

static int check_sizes(const k3c_softmax_sizes *s, const char *op, k3c_err *err) {
    if (!s || s->rows < 0 || s->n <= 0) return k3c_errf(err, K3C_EINVAL, "%s: bad sizes", op);
    return K3C_OK;
}

int k3c_softmax_fwd(const k3c_softmax_sizes *s, const real *x, real *y, k3c_err *err) {
    int rc = check_sizes(s, "softmax_fwd", err);
    if (rc) return rc;
    const int64_t n = s->n;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < s->rows; i++) {
        const real *xi = x + i * n;
        real *yi = y + i * n, mx = xi[0];
        for (int64_t j = 1; j < n; j++) mx = xi[j] > mx ? xi[j] : mx;
        double sum = 0;
        for (int64_t j = 0; j < n; j++) sum += (yi[j] = rexp(xi[j] - mx));
        real inv = (real)(1.0 / sum);
        for (int64_t j = 0; j < n; j++) yi[j] *= inv;
    }
    return K3C_OK;
}

int k3c_softmax_bwd(const k3c_softmax_sizes *s, const real *y, const real *dy, real *dx, k3c_err *err) {
    int rc = check_sizes(s, "softmax_bwd", err);
    if (rc || !dx) return rc;
    const int64_t n = s->n;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < s->rows; i++) {
        const real *yi = y + i * n, *gi = dy + i * n;
        double dot = 0;
        for (int64_t j = 0; j < n; j++) dot += (double)yi[j] * gi[j];
        for (int64_t j = 0; j < n; j++) dx[i * n + j] += (real)(yi[j] * (gi[j] - dot));
    }
    return K3C_OK;
}
