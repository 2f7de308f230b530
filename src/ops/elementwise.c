/* elementwise.c — the sigmoid backward and the activation moves (zero, add, strided 2-D copy, bf16 packing) a model
 * step needs between ops. docs/CODE.md "Ops" (a model step calls ops only, so every backend can run it). */
#include "base/real.h"
#include "ops/basic.h"

#include <string.h>

void k3c_sigmoid_bwd(int64_t n, const real *y, const real *dy, real *dx) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) dx[i] += dy[i] * y[i] * (1 - y[i]);
}

void k3c_zero(real *x, int64_t n) {
    if (n > 0) memset(x, 0, sizeof(real) * (size_t)n);
}

void k3c_add(int64_t n, const real *x, real *y) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void k3c_copy2d(int64_t rows, int64_t cols, const real *src, int64_t ld_src, real *dst, int64_t ld_dst,
                int accumulate) {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
    for (int64_t r = 0; r < rows; r++) {
        const real *s = src + r * ld_src;
        real *d = dst + r * ld_dst;
        if (accumulate)
            for (int64_t c = 0; c < cols; c++) d[c] += s[c];
        else
            memcpy(d, s, sizeof(real) * (size_t)cols);
    }
}

void k3c_to_bf16(int64_t n, const real *x, uint16_t *y) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) y[i] = k3c_f32_to_bf16((float)x[i]);
}

void k3c_from_bf16(int64_t n, const uint16_t *x, real *y) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) y[i] = (real)k3c_bf16_to_f32(x[i]);
}
