/* cuda_norms.h — CUDA twins (fp32) of the embedding gather / scatter-add, RMSNorm (plain, per head, gated) and the
 * row-wise L2 norm. ARCHITECTURE.md §1.1, §1.2, §1.3, §3.1 steps 4 and 8, §3.4 items 7–8; ops/basic.h, ops/l2norm.h.
 *
 * Each k3c_<op>_<fwd|bwd>_cuda takes exactly the CPU op's float arguments, every array a DEVICE pointer (the
 * src/cuda/cuda_ops.h conventions): it runs on cudaStreamPerThread and returns without synchronising, except
 * k3c_embedding_fwd_cuda (below).
 * Size checks, NULL-gradient rules and formulas are the CPU op's; reductions the CPU does in double are done in double.
 * None needs a workspace: parameter gradients (dw) are reduced by a column kernel whose summation order is fixed by the
 * launch shape alone, so results are deterministic; only the embedding backward uses atomicAdd. */
#ifndef K3C_CUDA_NORMS_H
#define K3C_CUDA_NORMS_H

#include <stdint.h>

#include "k3c.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "ops/basic.h"
#include "ops/l2norm.h"

/* y[t,:] = E[ids[t],:]. SYNCHRONISES: the ids are validated on the device first and the result is read back, so an id
 * outside [0, V) returns K3C_EINVAL naming the first bad token and its id, as the CPU op does. On that error y is not
 * gathered, but its first element has served as the device flag and is left unspecified. Needs T < 2^31 − 2^24. */
int k3c_embedding_fwd_cuda(const k3c_embedding_sizes *s, const int32_t *ids, const float *E, float *y, k3c_err *err);
/* dE[ids[t],:] += dy[t,:] with atomicAdd (order among repeated ids is not fixed). It does not synchronise, so it cannot
 * report bad ids: tokens whose id is outside [0, V) are skipped (the forward has already rejected them). */
int k3c_embedding_bwd_cuda(const k3c_embedding_sizes *s, const int32_t *ids, const float *dy, float *dE, k3c_err *err);

/* y = w ⊙ x · r per row, r = 1/sqrt(mean(x²) + eps) summed in double; rstd (may be NULL) saves r. y may alias x. */
int k3c_rmsnorm_fwd_cuda(const k3c_rmsnorm_sizes *s, const float *x, const float *w, float *y, float *rstd,
                         k3c_err *err);
/* dx += r (w⊙dy − x̂ mean(x̂⊙w⊙dy)); dw += Σ_rows dy⊙x̂. rstd required; dx and dw may each be NULL. */
int k3c_rmsnorm_bwd_cuda(const k3c_rmsnorm_sizes *s, const float *x, const float *w, const float *rstd, const float *dy,
                         float *dx, float *dw, k3c_err *err);
/* y = RMSNorm_w(o) ⊙ σ(gate) over rows = T·H of width D = dv; rstd may be NULL. */
int k3c_gated_rmsnorm_fwd_cuda(const k3c_rmsnorm_sizes *s, const float *o, const float *gate, const float *w, float *y,
                               float *rstd, k3c_err *err);
/* dgate += dy ⊙ w⊙x̂ ⊙ σ(1−σ); RMSNorm backward of dy ⊙ σ(gate) into do_, dw. rstd required; do_, dgate, dw each may be
 * NULL. */
int k3c_gated_rmsnorm_bwd_cuda(const k3c_rmsnorm_sizes *s, const float *o, const float *gate, const float *w,
                               const float *rstd, const float *dy, float *do_, float *dgate, float *dw, k3c_err *err);

/* y = x / sqrt(Σx² + eps) per row (eps 0 = 1e-6, sums in double); y may alias x (the model normalises q, k in place);
 * rstd may be NULL. */
int k3c_l2norm_fwd_cuda(const k3c_l2norm_dims *d, const float *x, float *y, float *rstd, k3c_err *err);
/* dx += rstd · (dy − y (y·dy)). dx NULL = nothing to do; otherwise rstd is required (K3C_EINVAL if NULL). */
int k3c_l2norm_bwd_cuda(const k3c_l2norm_dims *d, const float *y, const float *rstd, const float *dy, float *dx,
                        k3c_err *err);

#ifdef __cplusplus
}
#endif
#endif
