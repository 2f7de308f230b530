/* posemb.c — the `divided_fixed` position embedding: the learnable [H0, W0, D] table resized to each item's patch grid
 * (bilinear or bicubic, torch F.interpolate with align_corners=False) plus a fixed sin/cos time term for frames, and the
 * transpose of the resize for the table's gradient. Spec: docs/VISION.md "Position embedding". */
#include "base/real.h"
#include "ops/vision_ops.h"

#define CUBIC_A (-0.75) /* torch's bicubic kernel */

/* Up to 4 source taps (index, weight) of output position o on an axis of `in` → `out`. The source coordinate is formed in
 * `real` as torch does in the working precision: scale = in/out, src = scale·(o + ½) − ½. */
static int axis_taps(int64_t in, int64_t out, int mode, int64_t o, int64_t idx[4], double wt[4]) {
    const real scale = (real)in / (real)out, src = scale * ((real)o + (real)0.5) - (real)0.5;
    if (mode == K3C_INTERP_BILINEAR) {
        const real s = src < 0 ? 0 : src;
        int64_t i0 = (int64_t)floor((double)s);
        if (i0 > in - 1) i0 = in - 1;
        real l1 = s - (real)i0;
        l1 = l1 < 0 ? 0 : l1 > 1 ? 1 : l1;
        idx[0] = i0;
        idx[1] = i0 + (i0 < in - 1 ? 1 : 0);
        wt[0] = (double)((real)1 - l1);
        wt[1] = (double)l1;
        return 2;
    }
    int64_t i0 = (int64_t)floor((double)src);
    if (i0 > in - 1) i0 = in - 1;
    real t = src - (real)i0;
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    const double A = CUBIC_A, x1 = (double)t + 1, x2 = (double)t, x3 = 1 - (double)t, x4 = 2 - (double)t;
    wt[0] = ((A * x1 - 5 * A) * x1 + 8 * A) * x1 - 4 * A;
    wt[1] = ((A + 2) * x2 - (A + 3)) * x2 * x2 + 1;
    wt[2] = ((A + 2) * x3 - (A + 3)) * x3 * x3 + 1;
    wt[3] = ((A * x4 - 5 * A) * x4 + 8 * A) * x4 - 4 * A;
    for (int k = 0; k < 4; k++) {
        int64_t j = i0 - 1 + k;
        idx[k] = j < 0 ? 0 : j > in - 1 ? in - 1 : j;
    }
    return 4;
}

/* Time term of frame f (only when the item has t > 1): [sin(f ω_j), cos(f ω_j)], ω_j = 10000^(−j/(D/2)). */
static double time_term(int64_t f, int64_t j, int64_t D) {
    const int64_t half = D / 2, jj = j < half ? j : j - half;
    const double w = 1.0 / pow(10000.0, (double)jj / (double)half), a = (double)f * w;
    return j < half ? sin(a) : cos(a);
}

static int check(const k3c_posemb_sizes *s, const k3c_grid_thw *g, int n, const char *op, k3c_err *err) {
    if (!s || s->H0 <= 0 || s->W0 <= 0 || s->T0 <= 0 || s->D <= 0 || s->D % 2 ||
        (s->mode != K3C_INTERP_BILINEAR && s->mode != K3C_INTERP_BICUBIC))
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes or interpolation mode", op);
    if (k3c_grid_tokens(g, n, err) < 0) return K3C_EINVAL;
    for (int m = 0; m < n; m++)
        if (g[m].t > s->T0)
            return k3c_errf(err, K3C_EINVAL, "%s: item %d has %lld frames, the time table has %lld", op, m,
                            (long long)g[m].t, (long long)s->T0);
    return K3C_OK;
}

/* The row and column taps of patch p of an item. */
typedef struct {
    int ny, nx;
    int64_t iy[4], ix[4];
    double wy[4], wx[4];
} taps2d;

static void item_taps(const k3c_posemb_sizes *s, const k3c_grid_thw *g, int64_t p, taps2d *tp) {
    tp->ny = axis_taps(s->H0, g->h, s->mode, p / g->w, tp->iy, tp->wy);
    tp->nx = axis_taps(s->W0, g->w, s->mode, p % g->w, tp->ix, tp->wx);
}

int k3c_posemb_fwd(const k3c_posemb_sizes *s, const k3c_grid_thw *g, int n, const real *table, real *x, k3c_err *err) {
    int rc = check(s, g, n, "posemb_fwd", err);
    if (rc) return rc;
    const int64_t D = s->D;
    int64_t off = 0;
    for (int m = 0; m < n; m++) {
        const int64_t hw = g[m].h * g[m].w;
#pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < hw; p++) {
            taps2d tp;
            item_taps(s, &g[m], p, &tp);
            for (int64_t j = 0; j < D; j++) {
                double acc = 0;
                for (int a = 0; a < tp.ny; a++) {
                    double row = 0;
                    for (int b = 0; b < tp.nx; b++) row += tp.wx[b] * table[(tp.iy[a] * s->W0 + tp.ix[b]) * D + j];
                    acc += tp.wy[a] * row;
                }
                for (int64_t f = 0; f < g[m].t; f++)
                    x[(off + f * hw + p) * D + j] += (real)(acc + (g[m].t > 1 ? time_term(f, j, D) : 0.0));
            }
        }
        off += g[m].t * hw;
    }
    return K3C_OK;
}

/* Serial over tokens so the scatter into the shared table is race-free and summed in a fixed order; parallel over
 * column blocks of D. */
int k3c_posemb_bwd(const k3c_posemb_sizes *s, const k3c_grid_thw *g, int n, const real *dx, real *dtable,
                   k3c_err *err) {
    int rc = check(s, g, n, "posemb_bwd", err);
    if (rc) return rc;
    const int64_t D = s->D;
    int64_t off = 0;
    for (int m = 0; m < n; m++) {
        const int64_t hw = g[m].h * g[m].w;
        for (int64_t p = 0; p < hw; p++) {
            taps2d tp;
            item_taps(s, &g[m], p, &tp);
#pragma omp parallel for schedule(static)
            for (int64_t j = 0; j < D; j++) {
                double d = 0;
                for (int64_t f = 0; f < g[m].t; f++) d += dx[(off + f * hw + p) * D + j];
                for (int a = 0; a < tp.ny; a++)
                    for (int b = 0; b < tp.nx; b++)
                        dtable[(tp.iy[a] * s->W0 + tp.ix[b]) * D + j] += (real)(tp.wy[a] * tp.wx[b] * d);
            }
        }
        off += g[m].t * hw;
    }
    return K3C_OK;
}
