/* gates.cu — fp32 CUDA twins of the sigmoid output gate and the plain sigmoid, forward and backward (ops/gates.c,
 * ops/basic.h). docs/MODEL.md §4.2; declarations in cuda/cuda_ops.h. */
#include <limits.h>

#include "cuda/kernels.cuh"

namespace {

/* ================================================================ sigmoid gate, sigmoid (gates.c) */
__global__ void sgate_fwd_kernel(int64_t n, const float *x, const float *z, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = x[i] * sigm(z[i]);
}
__global__ void sgate_bwd_kernel(int64_t n, const float *x, const float *z, const float *dy, float *dx, float *dz) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float sg = sigm(z[i]);
        if (dx) dx[i] += dy[i] * sg;
        if (dz) dz[i] += dy[i] * x[i] * sg * (1.f - sg);
    }
}
/* No __restrict__: y may alias x (each element is read before it is written, by the same thread). */
__global__ void sigmoid_kernel(int64_t n, const float *x, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = sigm(x[i]);
}
__global__ void sigmoid_bwd_kernel(int64_t n, const float *y, const float *dy, float *dx) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dx[i] += dy[i] * y[i] * (1.f - y[i]);
}

} // namespace

/* ================================================================ C entry points: sigmoid gate, sigmoid */
extern "C" int k3c_sigmoid_gate_fwd_cuda(int64_t n, const float *x, const float *z, float *y, k3c_err *err) {
    if (n < 0) return k3c_errf(err, K3C_EINVAL, "sigmoid_gate_fwd_cuda: negative size %lld", (long long)n);
    if (n == 0) return 0;
    sgate_fwd_kernel<<<grid_for(n, 256), 256, 0, K3C_STREAM>>>(n, x, z, y);
    K3C_CU_LAUNCHED("sigmoid_gate_fwd");
    return 0;
}

extern "C" int k3c_sigmoid_gate_bwd_cuda(int64_t n, const float *x, const float *z, const float *dy, float *dx,
                                         float *dz, k3c_err *err) {
    if (n < 0) return k3c_errf(err, K3C_EINVAL, "sigmoid_gate_bwd_cuda: negative size %lld", (long long)n);
    if (n == 0 || (!dx && !dz)) return 0;
    sgate_bwd_kernel<<<grid_for(n, 256), 256, 0, K3C_STREAM>>>(n, x, z, dy, dx, dz);
    K3C_CU_LAUNCHED("sigmoid_gate_bwd");
    return 0;
}

extern "C" int k3c_sigmoid_cuda(int64_t n, const float *x, float *y, k3c_err *err) {
    if (n < 0) return k3c_errf(err, K3C_EINVAL, "sigmoid_cuda: negative size %lld", (long long)n);
    if (n == 0) return 0;
    sigmoid_kernel<<<grid_for(n, 256), 256, 0, K3C_STREAM>>>(n, x, y);
    K3C_CU_LAUNCHED("sigmoid");
    return 0;
}

extern "C" int k3c_sigmoid_bwd_cuda(int64_t n, const float *y, const float *dy, float *dx, k3c_err *err) {
    if (n < 0) return k3c_errf(err, K3C_EINVAL, "sigmoid_bwd_cuda: negative size %lld", (long long)n);
    if (n == 0 || !dx) return 0;
    sigmoid_bwd_kernel<<<grid_for(n, 256), 256, 0, K3C_STREAM>>>(n, y, dy, dx);
    K3C_CU_LAUNCHED("sigmoid_bwd");
    return 0;
}
