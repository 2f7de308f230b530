/* kernels.cuh — device helpers shared by the fp32 op twins split out of one file (short_conv.cu, kda_gate.cu, gates.cu,
 * xent.cu, elementwise.cu): the CPU's sigmoid / softplus, deterministic block reductions and grid sizing. docs/CODE.md "Ops". */
#ifndef K3C_CUDA_KERNELS_CUH
#define K3C_CUDA_KERNELS_CUH

#include "cuda/common.cuh"

/* An anonymous namespace: each op file gets its own copy, as when these lived in one file. */
namespace {

/* The CPU's overflow-free sigmoid (exp only of non-positive numbers), so both round the same way. */
__device__ __forceinline__ float sigm(float x) {
    if (x >= 0.f) return 1.f / (1.f + expf(-x));
    const float e = expf(x);
    return e / (1.f + e);
}
__device__ __forceinline__ float softplus(float x) { return (x > 0.f ? x : 0.f) + log1pf(expf(-fabsf(x))); }
/* e^x rounded once from double: the per-head decay scale a = e^{A_log} multiplies every element of a head, so a
 * systematic 1–2 ulp difference of expf from the CPU's (near correctly rounded) expf would bias whole dA_log sums. */
__device__ __forceinline__ float exp_cr(float x) { return (float)exp((double)x); }

struct op_sum {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct op_max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct op_min {
    __device__ long long operator()(long long a, long long b) const { return a < b ? a : b; }
};

/* Whole-block reduction (blockDim a multiple of 32): butterfly inside each warp, then the warps' results in warp order,
 * so the result is the same on every run and in every thread. red: 32 shared slots, reusable across calls. */
template <typename T, typename Op> __device__ T block_reduce(T v, Op op, T *red) {
    for (int o = 16; o; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    T r = red[0];
    for (int i = 1; i < nw; i++) r = op(r, red[i]);
    return r;
}

inline unsigned grid_for(int64_t n, int threads) {
    const int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}
/* Grids that loop over rows (tokens): one block per row up to 2^20 rows, then block-stride. */
inline unsigned grid_rows(int64_t rows) { return (unsigned)(rows < (1 << 20) ? (rows > 0 ? rows : 1) : (1 << 20)); }

} // namespace

#endif
