/* l2norm.h — row-wise L2 normalisation y = x / sqrt(Σx² + eps) (KDA q and k per head), forward and backward.
 * Spec: docs/MODEL.md §3.1 step 4, §3.4 stage 7. Symbols exist as _f32 and _f64; no workspace. */
#ifndef K3C_OPS_L2NORM_H
#define K3C_OPS_L2NORM_H

#include "ops/ops.h"

#include <stdint.h>

typedef struct {
    int64_t rows, dim; /* KDA: rows = T·H, dim = dk */
    double eps;        /* 0 = 1e-6 */
} k3c_l2norm_dims;

#define K3C_L2NORM_API(real, S)                                                                                        \
    /* y[rows, dim] (may alias x); rstd[rows] = 1/sqrt(Σx² + eps) (may be NULL). Sums in double. */                  \
    int k3c_l2norm_fwd_##S(const k3c_l2norm_dims *d, const real *x, real *y, real *rstd, k3c_err *err);                \
    /* dx += rstd · (dy − y (y·dy)), from the saved y and rstd (exact, eps included). */                           \
    int k3c_l2norm_bwd_##S(const k3c_l2norm_dims *d, const real *y, const real *rstd, const real *dy, real *dx,        \
                           k3c_err *err);

K3C_DECLARE_REAL(K3C_L2NORM_API)

#endif
