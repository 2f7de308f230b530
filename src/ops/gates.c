/* gates.c — the sigmoid output gate y = x ⊙ σ(z) of gated MLA and elementwise sigmoid / SiLU with backward.
 * Spec: docs/MODEL.md §4.2 (gate and its backward), §4.3, §3.1 step 2 (SiLU after the short conv). */
#include "base/real.h"
#include "ops/basic.h"

int k3c_sigmoid_gate_fwd(int64_t n, const real *x, const real *z, real *y, k3c_err *err) {
    if (n < 0) return k3c_errf(err, K3C_EINVAL, "sigmoid_gate_fwd: negative size %lld", (long long)n);
#pragma omp parallel for schedule(static) if (n > 65536) /* decode-sized vectors: one thread */
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * rsigmoid(z[i]);
    return K3C_OK;
}

int k3c_sigmoid_gate_bwd(int64_t n, const real *x, const real *z, const real *dy, real *dx, real *dz, k3c_err *err) {
    if (n < 0) return k3c_errf(err, K3C_EINVAL, "sigmoid_gate_bwd: negative size %lld", (long long)n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        real sg = rsigmoid(z[i]);
        if (dx) dx[i] += dy[i] * sg;
        if (dz) dz[i] += dy[i] * x[i] * sg * (1 - sg);
    }
    return K3C_OK;
}

void k3c_sigmoid(int64_t n, const real *x, real *y) {
#pragma omp parallel for schedule(static) if (n > 65536) /* decode-sized vectors: one thread */
    for (int64_t i = 0; i < n; i++) y[i] = rsigmoid(x[i]);
}

void k3c_silu(int64_t n, const real *x, real *y) {
#pragma omp parallel for schedule(static) if (n > 65536) /* decode-sized vectors: one thread */
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * rsigmoid(x[i]);
}

void k3c_silu_bwd(int64_t n, const real *x, const real *dy, real *dx) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        real sg = rsigmoid(x[i]);
        dx[i] += dy[i] * sg * (1 + x[i] * (1 - sg));
    }
}
