/* l2norm.cu — fp32 CUDA twin of the row-wise L2 norm (KDA q, k), forward and backward (ops/l2norm.c).
 * docs/MODEL.md §1.3, §3.1 step 4; declarations in cuda/cuda_ops.h. */
#include <limits.h>

#include "cuda/common.cuh"

/* The formulas below are the CPU float ops' (ops/embedding.c, rmsnorm.c, l2norm.c) operation by operation, including
 * where they widen to double. nvcc would fuse a float product into a following add (the CPU build does not contract),
 * so those products are written __fmul_rn to keep the twins within rounding of each other. */
namespace {

const int WARPS = 8; /* row kernels: one warp per row, 8 rows per block */

/* Butterfly sum: every lane gets the total, and the shuffle orders the lanes' earlier reads before any later write
 * (what makes y aliasing x safe in the forwards). */
__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

unsigned blocks_for(int64_t n, int64_t per_block) {
    const int64_t b = (n + per_block - 1) / per_block;
    return (unsigned)(b < (1 << 20) ? (b > 0 ? b : 1) : (1 << 20)); /* the kernels stride over the rest */
}

/* ================================================================ L2 norm */
/* One warp per row: rs = 1/sqrt(Σx² + eps) in double, rounded to float; y = x·rs. x and y may be the same array. */
__global__ void l2_fwd_kernel(int64_t rows, int64_t n, double eps, const float *x, float *y, float *rstd) {
    const int lane = threadIdx.x & 31;
    for (int64_t r = blockIdx.x * (int64_t)WARPS + (threadIdx.x >> 5); r < rows; r += (int64_t)gridDim.x * WARPS) {
        double ss = 0;
        for (int64_t i = lane; i < n; i += 32) ss += (double)x[r * n + i] * x[r * n + i];
        ss = warp_sum(ss);
        const float rs = (float)(1.0 / sqrt(ss + eps));
        for (int64_t i = lane; i < n; i += 32) y[r * n + i] = x[r * n + i] * rs;
        if (rstd && lane == 0) rstd[r] = rs;
    }
}

/* dx += rs · (dy − y·(float)(y·dy)), the dot in double. */
__global__ void l2_bwd_kernel(int64_t rows, int64_t n, const float *y, const float *rstd, const float *dy, float *dx) {
    const int lane = threadIdx.x & 31;
    for (int64_t r = blockIdx.x * (int64_t)WARPS + (threadIdx.x >> 5); r < rows; r += (int64_t)gridDim.x * WARPS) {
        double yd = 0;
        for (int64_t i = lane; i < n; i += 32) yd += (double)y[r * n + i] * dy[r * n + i];
        const float ydf = (float)warp_sum(yd), rs = rstd[r];
        for (int64_t i = lane; i < n; i += 32) {
            const int64_t k = r * n + i;
            dx[k] += __fmul_rn(rs, dy[k] - __fmul_rn(y[k], ydf));
        }
    }
}

int l2_check(const k3c_l2norm_dims *d, const char *op, k3c_err *err) {
    if (!d || d->rows < 0 || d->dim <= 0 || d->eps < 0)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (rows >= 0, dim > 0, eps >= 0)", op);
    return 0;
}

} // namespace

extern "C" int k3c_l2norm_fwd_cuda(const k3c_l2norm_dims *d, const float *x, float *y, float *rstd, k3c_err *err) {
    int rc = l2_check(d, "l2norm_fwd_cuda", err);
    if (rc || d->rows == 0) return rc;
    const double eps = d->eps > 0 ? d->eps : 1e-6;
    l2_fwd_kernel<<<blocks_for(d->rows, WARPS), 32 * WARPS, 0, K3C_STREAM>>>(d->rows, d->dim, eps, x, y, rstd);
    K3C_CU_LAUNCHED("l2norm_fwd");
    return 0;
}

extern "C" int k3c_l2norm_bwd_cuda(const k3c_l2norm_dims *d, const float *y, const float *rstd, const float *dy,
                                   float *dx, k3c_err *err) {
    int rc = l2_check(d, "l2norm_bwd_cuda", err);
    if (rc || !dx || d->rows == 0) return rc;
    if (!rstd) return k3c_errf(err, K3C_EINVAL, "l2norm_bwd_cuda: rstd (saved by the forward) is required");
    l2_bwd_kernel<<<blocks_for(d->rows, WARPS), 32 * WARPS, 0, K3C_STREAM>>>(d->rows, d->dim, y, rstd, dy, dx);
    K3C_CU_LAUNCHED("l2norm_bwd");
    return 0;
}
