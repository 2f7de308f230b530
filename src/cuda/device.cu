/* device.cu — CUDA device plumbing: context (properties, cuBLASLt handle + workspace), checked allocation and copies,
 * bf16 conversions and a 16-byte-wide copy kernel. docs/CODE.md "cuda/" and "Precision policy". */
#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/common.cuh"

using namespace k3c_cu;

extern "C" int k3c_cuda_init(k3c_cuda_ctx *ctx, int device, size_t lt_ws_bytes, k3c_err *err) {
    memset(ctx, 0, sizeof *ctx);
    ctx->device = device;
    K3C_CU(cudaSetDevice(device));
    cudaDeviceProp p;
    K3C_CU(cudaGetDeviceProperties(&p, device));
    ctx->sm_count = p.multiProcessorCount;
    ctx->smem_optin = p.sharedMemPerBlockOptin;
    snprintf(ctx->name, sizeof ctx->name, "%.127s", p.name);
    if (p.major < 8)
        return k3c_errf(err, K3C_EUNSUPPORTED, "cuda: %s is sm_%d%d; k3c needs sm_80 or newer", p.name, p.major,
                        p.minor);
    cublasLtHandle_t lt;
    cublasStatus_t st = cublasLtCreate(&lt);
    if (st != CUBLAS_STATUS_SUCCESS) return k3c_errf(err, K3C_EDEVICE, "cuda: cublasLtCreate: status %d", (int)st);
    ctx->lt = lt;
    ctx->lt_ws_bytes = lt_ws_bytes ? lt_ws_bytes : (size_t)32 << 20;
    cudaError_t e = cudaMalloc(&ctx->lt_ws, ctx->lt_ws_bytes);
    if (e != cudaSuccess) {
        cublasLtDestroy(lt);
        ctx->lt = NULL;
        return k3c_errf(err, K3C_EDEVICE, "cuda: cudaMalloc(%zu) for the cuBLASLt workspace: %s", ctx->lt_ws_bytes,
                        cudaGetErrorString(e));
    }
    const char *env = getenv("K3C_CUDA_LANES");
    const int lanes =
        env && *env >= '0' && *env <= '0' + K3C_CUDA_LANES && !env[1] ? *env - '0' : K3C_CUDA_LANES_DEFAULT;
    for (int i = 0; e == cudaSuccess && i < lanes; i++) {
        e = cudaStreamCreateWithFlags((cudaStream_t *)&ctx->lane[i], cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaMalloc(&ctx->lane_ws[i], ctx->lt_ws_bytes);
    }
    for (int i = 0; e == cudaSuccess && i <= lanes; i++) /* each lane's join, then the fork */
        e = cudaEventCreateWithFlags((cudaEvent_t *)&ctx->lane_ev[i], cudaEventDisableTiming);
    if (e != cudaSuccess) {
        k3c_cuda_destroy(ctx);
        return k3c_errf(err, K3C_EDEVICE, "cuda: %d GEMM lanes (streams, workspaces, events): %s", lanes,
                        cudaGetErrorString(e));
    }
    ctx->lanes = lanes;
    env = getenv("K3C_CUDA_BF16_COPY");
    ctx->bf16_copy = env && *env >= '0' && *env <= '2' && !env[1] ? *env - '0' : 2;
    return K3C_OK;
}

extern "C" int k3c_cuda_lanes_fork(k3c_cuda_ctx *ctx, k3c_err *err) {
    if (!ctx->lanes) return K3C_OK;
    cudaEvent_t fork = (cudaEvent_t)ctx->lane_ev[ctx->lanes];
    K3C_CU(cudaEventRecord(fork, K3C_STREAM));
    for (int i = 0; i < ctx->lanes; i++) K3C_CU(cudaStreamWaitEvent((cudaStream_t)ctx->lane[i], fork, 0));
    return K3C_OK;
}

extern "C" int k3c_cuda_lanes_join(k3c_cuda_ctx *ctx, k3c_err *err) {
    for (int i = 0; i < ctx->lanes; i++) {
        K3C_CU(cudaEventRecord((cudaEvent_t)ctx->lane_ev[i], (cudaStream_t)ctx->lane[i]));
        K3C_CU(cudaStreamWaitEvent(K3C_STREAM, (cudaEvent_t)ctx->lane_ev[i], 0));
    }
    return K3C_OK;
}

extern "C" void k3c_cuda_destroy(k3c_cuda_ctx *ctx) {
    if (!ctx) return;
    for (int i = 0; i < K3C_CUDA_LANES; i++) {
        if (ctx->lane[i]) cudaStreamDestroy((cudaStream_t)ctx->lane[i]);
        if (ctx->lane_ws[i]) cudaFree(ctx->lane_ws[i]);
        ctx->lane[i] = ctx->lane_ws[i] = NULL;
    }
    for (int i = 0; i <= K3C_CUDA_LANES; i++) {
        if (ctx->lane_ev[i]) cudaEventDestroy((cudaEvent_t)ctx->lane_ev[i]);
        ctx->lane_ev[i] = NULL;
    }
    ctx->lanes = 0;
    if (ctx->lt_ws) cudaFree(ctx->lt_ws);
    if (ctx->lt) cublasLtDestroy((cublasLtHandle_t)ctx->lt);
    ctx->lt = ctx->lt_ws = NULL;
}

extern "C" int k3c_cuda_malloc(void **p, size_t bytes, k3c_err *err) {
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess)
        return k3c_errf(err, K3C_ENOMEM, "cuda: cudaMalloc(%zu bytes): %s", bytes, cudaGetErrorString(e));
    return K3C_OK;
}
extern "C" void k3c_cuda_free(void *p) {
    if (p) cudaFree(p);
}
extern "C" int k3c_cuda_h2d(void *dst, const void *src, size_t bytes, k3c_err *err) {
    K3C_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, K3C_STREAM));
    K3C_CU(cudaStreamSynchronize(K3C_STREAM));
    return K3C_OK;
}
extern "C" int k3c_cuda_d2h(void *dst, const void *src, size_t bytes, k3c_err *err) {
    K3C_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, K3C_STREAM));
    K3C_CU(cudaStreamSynchronize(K3C_STREAM));
    return K3C_OK;
}
extern "C" int k3c_cuda_fill_u8(void *p, int byte, size_t bytes, k3c_err *err) {
    K3C_CU(cudaMemsetAsync(p, byte, bytes, K3C_STREAM));
    return K3C_OK;
}
extern "C" int k3c_cuda_sync(k3c_err *err) {
    K3C_CU(cudaStreamSynchronize(K3C_STREAM));
    return K3C_OK;
}

__global__ void f32_to_bf16_kernel(const float *x, bf16 *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}
__global__ void bf16_to_f32_kernel(const bf16 *x, float *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __bfloat162float(x[i]);
}

__global__ void f32_to_f16_kernel(const float *x, __half *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2half_rn(x[i]);
}

static unsigned grid_for(size_t n) {
    size_t b = (n + 255) / 256;
    return (unsigned)(b < 65536 ? (b ? b : 1) : 65536);
}

extern "C" int k3c_cuda_f32_to_bf16(const float *x, uint16_t *y, size_t n, k3c_err *err) {
    if (!n) return K3C_OK;
    f32_to_bf16_kernel<<<grid_for(n), 256, 0, K3C_STREAM>>>(x, (bf16 *)y, n);
    K3C_CU_LAUNCHED("f32_to_bf16");
    return K3C_OK;
}
extern "C" int k3c_cuda_f32_to_f16(const float *x, uint16_t *y, size_t n, k3c_err *err) {
    if (!n) return K3C_OK;
    f32_to_f16_kernel<<<grid_for(n), 256, 0, K3C_STREAM>>>(x, (__half *)y, n);
    K3C_CU_LAUNCHED("f32_to_f16");
    return K3C_OK;
}
extern "C" int k3c_cuda_bf16_to_f32(const uint16_t *x, float *y, size_t n, k3c_err *err) {
    if (!n) return K3C_OK;
    bf16_to_f32_kernel<<<grid_for(n), 256, 0, K3C_STREAM>>>((const bf16 *)x, y, n);
    K3C_CU_LAUNCHED("bf16_to_f32");
    return K3C_OK;
}

/* ---- power-of-two gradient scaling for the fp16 kernels (cuda_ops.h) */
__global__ void absmax_kernel(const float *x, size_t n, unsigned *mx) {
    unsigned m = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float a = fabsf(x[i]);
        if (a <= 3.0e38f) m = max(m, __float_as_uint(a)); /* NaN and inf are left to the kernels to propagate */
    }
    for (int o = 16; o; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0 && m) atomicMax(mx, m);
}
__global__ void pow2_scale_kernel(float *s) {
    const float m = s[2]; /* the absmax kernels' atomicMax over the bits of non-negative floats */
    int e = 0;
    if (m > 0.f) frexpf(m, &e); /* m = f · 2^e, f ∈ [1/2, 1) */
    e = max(-120, min(120, e)); /* both factors stay finite (subnormal or huge maxima get a partial scale) */
    s[0] = ldexpf(1.f, -e), s[1] = ldexpf(1.f, e);
}
__global__ void scale_kernel(float *x, size_t n, const float *s) {
    const float f = *s;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= f;
}
__global__ void f32_to_f16_scaled_kernel(const float *x, __half *y, size_t n, const float *s) {
    const float f = *s;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2half_rn(x[i] * f);
}

extern "C" int k3c_cuda_pow2_scale(const float *x, size_t n, const float *y, size_t ny, float *s, k3c_err *err) {
    K3C_CU(cudaMemsetAsync(s, 0, 3 * sizeof(float), K3C_STREAM));
    if (n) absmax_kernel<<<grid_for(n), 256, 0, K3C_STREAM>>>(x, n, (unsigned *)(s + 2));
    if (y && ny) absmax_kernel<<<grid_for(ny), 256, 0, K3C_STREAM>>>(y, ny, (unsigned *)(s + 2));
    pow2_scale_kernel<<<1, 1, 0, K3C_STREAM>>>(s);
    K3C_CU_LAUNCHED("pow2_scale");
    return K3C_OK;
}
extern "C" int k3c_cuda_scale(float *x, size_t n, const float *s, k3c_err *err) {
    if (!x || !n) return K3C_OK;
    scale_kernel<<<grid_for(n), 256, 0, K3C_STREAM>>>(x, n, s);
    K3C_CU_LAUNCHED("scale");
    return K3C_OK;
}
extern "C" int k3c_cuda_f32_to_f16_scaled(const float *x, uint16_t *y, size_t n, const float *s, k3c_err *err) {
    if (!n) return K3C_OK;
    f32_to_f16_scaled_kernel<<<grid_for(n), 256, 0, K3C_STREAM>>>(x, (__half *)y, n, s);
    K3C_CU_LAUNCHED("f32_to_f16_scaled");
    return K3C_OK;
}

/* Four independent 16-byte loads in flight per thread before the first store. */
__global__ void copy16_kernel(const uint4 *__restrict__ src, uint4 *__restrict__ dst, size_t n16) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
        dst[i] = a, dst[i + stride] = b, dst[i + 2 * stride] = c, dst[i + 3 * stride] = d;
    }
    for (; i < n16; i += stride) dst[i] = src[i];
}

extern "C" int k3c_cuda_copy(void *dst, const void *src, size_t bytes, k3c_err *err) {
    if (((uintptr_t)dst | (uintptr_t)src | bytes) & 15) {
        K3C_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, K3C_STREAM));
        return K3C_OK;
    }
    int dev, sms;
    K3C_CU(cudaGetDevice(&dev));
    K3C_CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    copy16_kernel<<<sms * 8, 512, 0, K3C_STREAM>>>((const uint4 *)src, (uint4 *)dst, bytes / 16);
    K3C_CU_LAUNCHED("copy16");
    return K3C_OK;
}
