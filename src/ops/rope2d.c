/* rope2d.c — the vision tower's 2D rotary embedding: the per-token (cos, sin) table from the packed grids and the
 * pairwise rotation of q and k, forward and backward. Spec: docs/VISION.md "Blocks" (Rope2DPosEmbRepeated). */
#include "base/real.h"
#include "ops/vision_ops.h"

/* The angle is formed as the release does in its working precision (pos · freq, both `real`), then cos / sin are taken
 * in double, so the float table matches a float32 torch table to rounding. */
int k3c_rope2d_table(const k3c_grid_thw *g, int n, int64_t dh, double theta, real *cs, k3c_err *err) {
    if (dh <= 0 || dh % 4)
        return k3c_errf(err, K3C_EINVAL, "rope2d: head dim %lld is not a multiple of 4", (long long)dh);
    if (k3c_grid_tokens(g, n, err) < 0) return K3C_EINVAL;
    const int64_t np = dh / 2;
    int64_t off = 0;
    for (int m = 0; m < n; m++) {
        const int64_t hw = g[m].h * g[m].w;
        for (int64_t f = 0; f < g[m].t; f++)
            for (int64_t p = 0; p < hw; p++) {
                real row = (real)(p / g[m].w), col = (real)(p % g[m].w);
                real *c = cs + (off + f * hw + p) * np * 2;
                for (int64_t i = 0; i < dh / 4; i++) {
                    real freq = (real)(1.0 / pow(theta, (double)((real)(4 * i) / (real)dh)));
                    double ax = (double)(real)(col * freq), ay = (double)(real)(row * freq);
                    c[4 * i + 0] = (real)cos(ax);
                    c[4 * i + 1] = (real)sin(ax);
                    c[4 * i + 2] = (real)cos(ay);
                    c[4 * i + 3] = (real)sin(ay);
                }
            }
        off += g[m].t * hw;
    }
    return K3C_OK;
}

/* y (+)= R(±θ) x per pair: the forward rotates by θ, the backward (the transpose) by −θ and adds into dx. */
static void rotate(int64_t rows, int64_t H, int64_t dh, const real *cs, const real *x, real *y, real sign,
                   int accumulate) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t p = 0; p < dh / 2; p++) {
                const real c = cs[(r * (dh / 2) + p) * 2], s = sign * cs[(r * (dh / 2) + p) * 2 + 1];
                const int64_t o = (r * H + h) * dh + 2 * p;
                const real a = x[o], b = x[o + 1], u = a * c - b * s, v = a * s + b * c;
                y[o] = accumulate ? y[o] + u : u;
                y[o + 1] = accumulate ? y[o + 1] + v : v;
            }
}

void k3c_rope2d_fwd(int64_t rows, int64_t H, int64_t dh, const real *cs, const real *x, real *y) {
    rotate(rows, H, dh, cs, x, y, 1, 0);
}

void k3c_rope2d_bwd(int64_t rows, int64_t H, int64_t dh, const real *cs, const real *dy, real *dx) {
    rotate(rows, H, dh, cs, dy, dx, -1, 1);
}
