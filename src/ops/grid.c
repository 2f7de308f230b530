/* grid.c — sizes of packed vision items (t, h, w patches each): the token count shared by the vision ops.
 * Spec: docs/VISION.md "Packing". */
#include "ops/vision_ops.h"

int64_t k3c_grid_tokens(const k3c_grid_thw *g, int n, k3c_err *err) {
    if (n < 0 || (n > 0 && !g)) return k3c_errf(err, K3C_EINVAL, "vision grid: %d items", n), -1;
    int64_t L = 0;
    for (int i = 0; i < n; i++) {
        if (g[i].t <= 0 || g[i].h <= 0 || g[i].w <= 0 || g[i].t > (1 << 20) || g[i].h > (1 << 20) || g[i].w > (1 << 20))
            return k3c_errf(err, K3C_EINVAL,
                            "vision grid: item %d has (t, h, w) = (%lld, %lld, %lld); each must be in [1, 2^20]", i,
                            (long long)g[i].t, (long long)g[i].h, (long long)g[i].w),
                   -1;
        L += g[i].t * g[i].h * g[i].w;
        if (L > ((int64_t)1 << 40))
            return k3c_errf(err, K3C_EINVAL, "vision grid: more than 2^40 patches by item %d", i), -1;
    }
    return L;
}
