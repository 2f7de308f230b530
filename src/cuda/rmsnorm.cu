/* rmsnorm.cu — fp32 CUDA twins of RMSNorm (plain, per head) and the sigmoid-gated RMSNorm, forward and backward
 * (ops/rmsnorm.c). docs/MODEL.md §1.2, §3.1 step 8, §3.4 items 7–8; declarations in cuda/cuda_ops.h. */
#include <limits.h>

#include "cuda/common.cuh"

/* The formulas below are the CPU float ops' (ops/embedding.c, rmsnorm.c, l2norm.c) operation by operation, including
 * where they widen to double. nvcc would fuse a float product into a following add (the CPU build does not contract),
 * so those products are written __fmul_rn to keep the twins within rounding of each other. */
namespace {

const int WARPS = 8; /* row kernels: one warp per row, 8 rows per block */

/* ops/basic.h k3c_sigmoid_f: exp only of a non-positive number. */
__device__ __forceinline__ float sigmoid_f(float x) {
    if (x >= 0) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

/* Butterfly sum: every lane gets the total, and the shuffle orders the lanes' earlier reads before any later write
 * (what makes y aliasing x safe in the forwards). */
__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The CPU's effective upstream gradient of the normalisation: dy, or dy ⊙ σ(gate) (a float product). */
__device__ __forceinline__ float eff_dy(const float *dy, const float *gate, int64_t idx) {
    return gate ? __fmul_rn(dy[idx], sigmoid_f(gate[idx])) : dy[idx];
}

unsigned blocks_for(int64_t n, int64_t per_block) {
    const int64_t b = (n + per_block - 1) / per_block;
    return (unsigned)(b < (1 << 20) ? (b > 0 ? b : 1) : (1 << 20)); /* the kernels stride over the rest */
}

/* ================================================================ RMSNorm (gate == NULL: plain; otherwise gated) */
/* One warp per row: r = 1/sqrt(Σx²/D + eps) in double, rounded to float; y = w ⊙ (x·r) [⊙ σ(gate)]. */
__global__ void rms_fwd_kernel(int64_t rows, int64_t D, double eps, const float *x, const float *gate, const float *w,
                               float *y, float *rstd) {
    const int lane = threadIdx.x & 31;
    for (int64_t i = blockIdx.x * (int64_t)WARPS + (threadIdx.x >> 5); i < rows; i += (int64_t)gridDim.x * WARPS) {
        const float *xi = x + i * D;
        double ss = 0;
        for (int64_t j = lane; j < D; j += 32) ss += (double)xi[j] * xi[j];
        ss = warp_sum(ss);
        const float r = (float)(1.0 / sqrt(ss / (double)D + eps));
        if (rstd && lane == 0) rstd[i] = r;
        float *yi = y + i * D;
        for (int64_t j = lane; j < D; j += 32) {
            float v = w[j] * (xi[j] * r);
            if (gate) v = v * sigmoid_f(gate[i * D + j]);
            yi[j] = v;
        }
    }
}

/* Few rows (the engine's decode steps): one block of RMS_BLOCK threads per row, so a row's loads are all in flight at
 * once (a warp alone walks a 1024-wide row in 32 dependent loads). The same formula; the sum in another order. */
constexpr int RMS_BLOCK = 256, RMS_FEW_ROWS = 1024;
__global__ void __launch_bounds__(RMS_BLOCK) rms_fwd_block_kernel(int64_t D, double eps, const float *x,
                                                                  const float *gate, const float *w, float *y,
                                                                  float *rstd) {
    __shared__ double part[RMS_BLOCK / 32];
    const int64_t i = blockIdx.x;
    const float *xi = x + i * D;
    double ss = 0;
    for (int64_t j = threadIdx.x; j < D; j += RMS_BLOCK) ss += (double)xi[j] * xi[j];
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads(); /* every read of x is done before any write of y (y may alias x) */
    double tot = 0;
    for (int k = 0; k < RMS_BLOCK / 32; k++) tot += part[k];
    const float r = (float)(1.0 / sqrt(tot / (double)D + eps));
    if (rstd && threadIdx.x == 0) rstd[i] = r;
    float *yi = y + i * D;
    for (int64_t j = threadIdx.x; j < D; j += RMS_BLOCK) {
        float v = w[j] * (xi[j] * r);
        if (gate) v = v * sigmoid_f(gate[i * D + j]);
        yi[j] = v;
    }
}

/* One warp per row (rmsnorm.c rms_bwd_rows): dgate += dy·(w·x·r)·σ(1−σ); dx += r (w⊙g − x·r·c), c = mean(x·r·w·g),
 * g = eff_dy. Either output may be NULL. */
__global__ void rms_bwd_rows_kernel(int64_t rows, int64_t D, const float *x, const float *gate, const float *w,
                                    const float *rstd, const float *dy, float *dx, float *dgate) {
    const int lane = threadIdx.x & 31;
    for (int64_t i = blockIdx.x * (int64_t)WARPS + (threadIdx.x >> 5); i < rows; i += (int64_t)gridDim.x * WARPS) {
        const float *xi = x + i * D;
        const double r = rstd[i];
        if (dgate)
            for (int64_t j = lane; j < D; j += 32) {
                const int64_t idx = i * D + j;
                const double sg = sigmoid_f(gate[idx]);
                dgate[idx] += (float)(dy[idx] * ((double)(w[j] * xi[j]) * r) * sg * (1 - sg));
            }
        if (!dx) continue;
        double c = 0;
        for (int64_t j = lane; j < D; j += 32) c += xi[j] * r * w[j] * eff_dy(dy, gate, i * D + j);
        c = warp_sum(c) / (double)D;
        for (int64_t j = lane; j < D; j += 32) {
            const int64_t idx = i * D + j;
            dx[idx] += (float)(r * ((double)(w[j] * eff_dy(dy, gate, idx)) - xi[j] * r * c));
        }
    }
}

/* dw[j] += Σ_rows g ⊙ x·r, in double, in two passes whose summation order the shape alone fixes (deterministic
 * without atomics): blocks of 32 columns × a chunk of rows each write a partial sum (row group k of DW_GROUPS sums rows
 * k, k + DW_GROUPS, .. of the chunk, then the groups in index order), then dw[j] += Σ_chunks in chunk order. The chunks
 * fill the GPU whatever D is (a per-head norm has D = 128 over T·H rows: one block per 32 columns gave it 4 blocks). */
const int DW_GROUPS = 8;
int64_t dw_chunk(int64_t rows) { /* at most 32,768 chunks (grid.y), at least 256 rows each */
    const int64_t c = (rows + 32767) / 32768;
    return c > 256 ? c : 256;
}
__global__ void rms_bwd_weight_part_kernel(int64_t rows, int64_t D, int64_t chunk, const float *x, const float *gate,
                                           const float *rstd, const float *dy, double *part) {
    __shared__ double red[DW_GROUPS][32];
    const int64_t j = blockIdx.x * (int64_t)32 + threadIdx.x, i0 = blockIdx.y * chunk;
    const int64_t i1 = i0 + chunk < rows ? i0 + chunk : rows;
    double acc = 0;
    if (j < D)
        for (int64_t i = i0 + threadIdx.y; i < i1; i += DW_GROUPS) {
            const int64_t idx = i * D + j;
            acc += (double)eff_dy(dy, gate, idx) * x[idx] * rstd[i];
        }
    red[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y != 0 || j >= D) return;
    double s = 0;
    for (int k = 0; k < DW_GROUPS; k++) s += red[k][threadIdx.x];
    part[blockIdx.y * D + j] = s;
}
__global__ void rms_bwd_weight_sum_kernel(int64_t D, int64_t chunks, const double *part, float *dw) {
    const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (j >= D) return;
    double s = 0;
    for (int64_t c = 0; c < chunks; c++) s += part[c * D + j];
    dw[j] += (float)s;
}

/* The two passes over a stream-ordered scratch block of chunks · D doubles. */
int rms_bwd_weight(const k3c_rmsnorm_sizes *s, const float *x, const float *gate, const float *rstd, const float *dy,
                   float *dw, const char *op, k3c_err *err) {
    const int64_t nb = (s->D + 31) / 32, chunk = dw_chunk(s->rows), chunks = (s->rows + chunk - 1) / chunk;
    if (nb > INT_MAX) return k3c_errf(err, K3C_EINVAL, "%s: D %lld too large", op, (long long)s->D);
    double *part = nullptr;
    K3C_CU(cudaMallocAsync((void **)&part, sizeof(double) * (size_t)(chunks * s->D), K3C_STREAM));
    rms_bwd_weight_part_kernel<<<dim3((unsigned)nb, (unsigned)chunks), dim3(32, DW_GROUPS), 0, K3C_STREAM>>>(
        s->rows, s->D, chunk, x, gate, rstd, dy, part);
    cudaError_t le = cudaGetLastError();
    if (le == cudaSuccess) {
        rms_bwd_weight_sum_kernel<<<(unsigned)((s->D + 255) / 256), 256, 0, K3C_STREAM>>>(s->D, chunks, part, dw);
        le = cudaGetLastError();
    }
    cudaError_t fe = cudaFreeAsync(part, K3C_STREAM);
    if (le != cudaSuccess) return k3c_errf(err, K3C_EDEVICE, "%s: weight gradient: %s", op, cudaGetErrorString(le));
    if (fe != cudaSuccess) return k3c_errf(err, K3C_EDEVICE, "%s: cudaFreeAsync: %s", op, cudaGetErrorString(fe));
    return 0;
}

int rms_check(const k3c_rmsnorm_sizes *s, const char *op, k3c_err *err) {
    if (!s || s->rows < 0 || s->D <= 0 || !(s->eps >= 0))
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (rows %lld, D %lld, eps %g)", op, s ? (long long)s->rows : -1,
                        s ? (long long)s->D : -1, s ? s->eps : 0.0);
    return 0;
}

int rms_fwd(const k3c_rmsnorm_sizes *s, const float *x, const float *gate, const float *w, float *y, float *rstd,
            const char *op, k3c_err *err) {
    int rc = rms_check(s, op, err);
    if (rc || s->rows == 0) return rc;
    if (s->rows <= RMS_FEW_ROWS)
        rms_fwd_block_kernel<<<(unsigned)s->rows, RMS_BLOCK, 0, K3C_STREAM>>>(s->D, s->eps, x, gate, w, y, rstd);
    else
        rms_fwd_kernel<<<blocks_for(s->rows, WARPS), 32 * WARPS, 0, K3C_STREAM>>>(s->rows, s->D, s->eps, x, gate, w,
                                                                                  y, rstd);
    K3C_CU_LAUNCHED(op);
    return 0;
}

int rms_bwd(const k3c_rmsnorm_sizes *s, const float *x, const float *gate, const float *w, const float *rstd,
            const float *dy, float *dx, float *dgate, float *dw, const char *op, k3c_err *err) {
    int rc = rms_check(s, op, err);
    if (rc) return rc;
    if (!rstd) return k3c_errf(err, K3C_EINVAL, "%s: rstd (saved by the forward) is required", op);
    if (s->rows == 0) return 0;
    if (dx || dgate) {
        rms_bwd_rows_kernel<<<blocks_for(s->rows, WARPS), 32 * WARPS, 0, K3C_STREAM>>>(s->rows, s->D, x, gate, w, rstd,
                                                                                       dy, dx, dgate);
        K3C_CU_LAUNCHED(op);
    }
    return dw ? rms_bwd_weight(s, x, gate, rstd, dy, dw, op, err) : 0;
}

} // namespace

extern "C" int k3c_rmsnorm_fwd_cuda(const k3c_rmsnorm_sizes *s, const float *x, const float *w, float *y, float *rstd,
                                    k3c_err *err) {
    return rms_fwd(s, x, nullptr, w, y, rstd, "rmsnorm_fwd_cuda", err);
}

extern "C" int k3c_rmsnorm_bwd_cuda(const k3c_rmsnorm_sizes *s, const float *x, const float *w, const float *rstd,
                                    const float *dy, float *dx, float *dw, k3c_err *err) {
    return rms_bwd(s, x, nullptr, w, rstd, dy, dx, nullptr, dw, "rmsnorm_bwd_cuda", err);
}

extern "C" int k3c_gated_rmsnorm_fwd_cuda(const k3c_rmsnorm_sizes *s, const float *o, const float *gate, const float *w,
                                          float *y, float *rstd, k3c_err *err) {
    return rms_fwd(s, o, gate, w, y, rstd, "gated_rmsnorm_fwd_cuda", err);
}

extern "C" int k3c_gated_rmsnorm_bwd_cuda(const k3c_rmsnorm_sizes *s, const float *o, const float *gate, const float *w,
                                          const float *rstd, const float *dy, float *do_, float *dgate, float *dw,
                                          k3c_err *err) {
    return rms_bwd(s, o, gate, w, rstd, dy, do_, dgate, dw, "gated_rmsnorm_bwd_cuda", err);
}
