/* elementwise.cu — fp32 CUDA twins of the activation moves zero, add and the strided 2-D copy (ops/elementwise.c).
 * docs/CODE.md "Ops"; declarations in cuda/cuda_ops.h. */
#include "cuda/common.cuh"

namespace {

unsigned grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

/* ================================================================ activation moves */
__global__ void add_kernel(int64_t n, const float *x, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

/* Flat element index e → (row, column); Idx = uint32_t whenever rows·cols fits (cheaper division). */
template <typename Idx>
__global__ void copy2d_kernel(Idx rows, Idx cols, const float *src, int64_t lds, float *dst, int64_t ldd,
                              int accumulate) {
    const Idx n = rows * cols;
    for (Idx e = blockIdx.x * (Idx)blockDim.x + threadIdx.x; e < n; e += (Idx)gridDim.x * blockDim.x) {
        const Idx r = e / cols, c = e - r * cols;
        const float v = src[(int64_t)r * lds + (int64_t)c];
        float *o = dst + (int64_t)r * ldd + (int64_t)c;
        *o = accumulate ? *o + v : v;
    }
}

} // namespace

/* ================================================================ C entry points: activation moves */
extern "C" int k3c_zero_cuda(float *x, int64_t n, k3c_err *err) {
    if (n < 0 || (n > 0 && !x)) return k3c_errf(err, K3C_EINVAL, "zero_cuda: n = %lld", (long long)n);
    if (n == 0) return 0;
    K3C_CU(cudaMemsetAsync(x, 0, (size_t)n * sizeof(float), K3C_STREAM));
    return 0;
}

extern "C" int k3c_add_cuda(int64_t n, const float *x, float *y, k3c_err *err) {
    if (n < 0) return k3c_errf(err, K3C_EINVAL, "add_cuda: n = %lld", (long long)n);
    if (n == 0) return 0;
    add_kernel<<<grid_for(n, 256), 256, 0, K3C_STREAM>>>(n, x, y);
    K3C_CU_LAUNCHED("add");
    return 0;
}

extern "C" int k3c_copy2d_cuda(int64_t rows, int64_t cols, const float *src, int64_t ld_src, float *dst, int64_t ld_dst,
                               int accumulate, k3c_err *err) {
    if (rows < 0 || cols < 0 || (rows > 1 && (ld_src < cols || ld_dst < cols)) || (cols > 0 && rows > INT64_MAX / cols))
        return k3c_errf(err, K3C_EINVAL, "copy2d_cuda: rows %lld, cols %lld, ld_src %lld, ld_dst %lld", (long long)rows,
                        (long long)cols, (long long)ld_src, (long long)ld_dst);
    const int64_t n = rows * cols;
    if (n == 0) return 0;
    if (n <= INT32_MAX)
        copy2d_kernel<uint32_t><<<grid_for(n, 256), 256, 0, K3C_STREAM>>>((uint32_t)rows, (uint32_t)cols, src, ld_src,
                                                                          dst, ld_dst, accumulate);
    else
        copy2d_kernel<uint64_t><<<grid_for(n, 256), 256, 0, K3C_STREAM>>>((uint64_t)rows, (uint64_t)cols, src, ld_src,
                                                                          dst, ld_dst, accumulate);
    K3C_CU_LAUNCHED("copy2d");
    return 0;
}
