/* patch_merge.c — the `sd2_tpool` merge: each kh × kw block of patches concatenated into one token (kernel row major)
 * and averaged over the item's frames, forward and backward. Spec: docs/VISION.md "Merge" (tpool_patch_merger). */
#include "base/real.h"
#include "ops/vision_ops.h"

static int check(const k3c_grid_thw *g, int n, int64_t D, int64_t kh, int64_t kw, const char *op, k3c_err *err) {
    if (D <= 0 || kh <= 0 || kw <= 0) return k3c_errf(err, K3C_EINVAL, "%s: bad sizes", op);
    if (k3c_grid_tokens(g, n, err) < 0) return K3C_EINVAL;
    for (int m = 0; m < n; m++)
        if (g[m].h % kh || g[m].w % kw)
            return k3c_errf(err, K3C_EINVAL,
                            "%s: item %d grid %lldx%lld is not a multiple of the %lldx%lld merge kernel", op, m,
                            (long long)g[m].h, (long long)g[m].w, (long long)kh, (long long)kw);
    return K3C_OK;
}

/* Every (merged token, kernel slot) of the packed items with its source rows: item m's merged token ij of slot
 * (a, b) reads frame f at row off + f·h·w + (i·kh + a)·w + j·kw + b. dir > 0: forward (mean over frames into y),
 * dir < 0: backward (dx += dy / t). */
static void merge_walk(const k3c_grid_thw *g, int n, int64_t D, int64_t kh, int64_t kw, const real *src, real *dst,
                       int dir) {
    const int64_t K = kh * kw * D;
    int64_t off = 0, tok = 0;
    for (int m = 0; m < n; m++) {
        const int64_t t = g[m].t, h = g[m].h, w = g[m].w, nw = w / kw, ntok = (h / kh) * nw;
#pragma omp parallel for schedule(static)
        for (int64_t ij = 0; ij < ntok; ij++)
            for (int64_t a = 0; a < kh; a++)
                for (int64_t b = 0; b < kw; b++) {
                    const int64_t slot = (tok + ij) * K + (a * kw + b) * D;
                    for (int64_t c = 0; c < D; c++) {
                        double acc = 0;
                        for (int64_t f = 0; f < t; f++) {
                            const int64_t row = off + f * h * w + ((ij / nw) * kh + a) * w + (ij % nw) * kw + b;
                            if (dir > 0)
                                acc += src[row * D + c];
                            else
                                dst[row * D + c] += src[slot + c] / (real)t;
                        }
                        if (dir > 0) dst[slot + c] = (real)(acc / (double)t);
                    }
                }
        off += t * h * w;
        tok += ntok;
    }
}

int k3c_tpool_merge_fwd(const k3c_grid_thw *g, int n, int64_t D, int64_t kh, int64_t kw, const real *x, real *y,
                        k3c_err *err) {
    int rc = check(g, n, D, kh, kw, "tpool_merge_fwd", err);
    if (rc) return rc;
    merge_walk(g, n, D, kh, kw, x, y, 1);
    return K3C_OK;
}

int k3c_tpool_merge_bwd(const k3c_grid_thw *g, int n, int64_t D, int64_t kh, int64_t kw, const real *dy, real *dx,
                        k3c_err *err) {
    int rc = check(g, n, D, kh, kw, "tpool_merge_bwd", err);
    if (rc) return rc;
    merge_walk(g, n, D, kh, kw, dy, dx, -1);
    return K3C_OK;
}
