/* gelu.c — GELU in the tanh form (the vision tower's gelu_pytorch_tanh) and the exact erf form (the projector's
 * nn.GELU()), forward and backward. Spec: docs/VISION.md "Blocks" and "Projector". */
#include "base/real.h"
#include "ops/vision_ops.h"

#define GELU_C 0.7978845608028654 /* √(2/π) */
#define GELU_A 0.044715
#define INV_SQRT2 0.7071067811865476
#define INV_SQRT_2PI 0.3989422804014327

void k3c_gelu_tanh(int64_t n, const real *x, real *y) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        y[i] = (real)(0.5 * v * (1.0 + tanh(GELU_C * (v + GELU_A * v * v * v))));
    }
}

void k3c_gelu_tanh_bwd(int64_t n, const real *x, const real *dy, real *dx) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        double v = x[i], t = tanh(GELU_C * (v + GELU_A * v * v * v));
        double d = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * v * v);
        dx[i] += (real)(dy[i] * d);
    }
}

void k3c_gelu_erf(int64_t n, const real *x, real *y) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        y[i] = (real)(0.5 * v * (1.0 + erf(v * INV_SQRT2)));
    }
}

void k3c_gelu_erf_bwd(int64_t n, const real *x, const real *dy, real *dx) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        double v = x[i], d = 0.5 * (1.0 + erf(v * INV_SQRT2)) + v * INV_SQRT_2PI * exp(-0.5 * v * v);
        dx[i] += (real)(dy[i] * d);
    }
}
