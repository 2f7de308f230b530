/* glu.cuh — the SiLU / SiTU / GELU GLU pointwise math and kernels (bitwise the CPU float formulas of ops/glu.c), shared by the
 * GLU twin (glu.cu) and the routed experts (moe.cu). docs/MODEL.md §8. */
#ifndef K3C_CUDA_GLU_CUH
#define K3C_CUDA_GLU_CUH

#include "cuda/common.cuh"

/* An anonymous namespace: each includer gets its own copy, as when these lived in one file. */
namespace {

/* The CPU float op's tanh (glu.c tanh_glu): odd Taylor polynomial below 0.125, one expf above; copying it keeps the
 * twins within rounding of each other rather than within the two tanh approximations' difference. */
__device__ __forceinline__ float tanh_glu(float x) {
    float a = fabsf(x);
    if (a < 0.125f) {
        float x2 = x * x;
        return x * (1.0f + x2 * (-1.0f / 3 + x2 * (2.0f / 15 + x2 * (-17.0f / 315 + x2 * (62.0f / 2835)))));
    }
    float e = expf(-2.0f * a), t = (1.0f - e) / (1.0f + e);
    return x < 0 ? -t : t;
}
__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

struct glu_params {
    int act; /* k3c_act */
    float b1, b2;
};

/* a = act(g), c = c(u) and their derivatives (glu.c glu_point). */
__device__ __forceinline__ void glu_point(const glu_params &q, float g, float u, float &a, float &c, float &da,
                                          float &dc) {
    if (q.act == K3C_ACT_GELU) { /* exact erf GELU: Φ = ½(1 + erf(g/√2)), a' = Φ + g·φ(g) */
        const float phi = 0.5f * (1.0f + erff(g * 0.7071067811865476f));
        a = g * phi, da = phi + g * 0.3989422804014327f * expf(-0.5f * g * g), c = u, dc = 1.0f;
        return;
    }
    float sg = sigm(g);
    if (q.act == K3C_ACT_SILU) {
        a = g * sg, da = sg + g * sg * (1.0f - sg), c = u, dc = 1.0f;
    } else {
        float t = tanh_glu(g / q.b1), tau = tanh_glu(u / q.b2);
        a = q.b1 * t * sg;
        da = (1.0f - t * t) * sg + q.b1 * t * sg * (1.0f - sg);
        c = q.b2 * tau, dc = 1.0f - tau * tau;
    }
}

/* h = act(g) ⊙ c(u) over rows × I; rowmap (optional): rows whose entry is < 0 are skipped (padding). */
template <typename T>
__global__ void glu_fwd_kernel(int64_t n, int64_t I, glu_params q, const float *g, const float *u, T *h,
                               const int32_t *rowmap) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        if (rowmap && rowmap[i / I] < 0) continue;
        float a, c, da, dc;
        glu_point(q, g[i], u[i], a, c, da, dc);
        k3c_cu::store_as(h + i, a * c);
    }
}

__global__ void glu_bwd_kernel(int64_t n, glu_params q, const float *g, const float *u, const float *dh, float *dg,
                               float *du) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float a, c, da, dc;
        glu_point(q, g[i], u[i], a, c, da, dc);
        if (dg) dg[i] += dh[i] * c * da;
        if (du) du[i] += dh[i] * a * dc;
    }
}

inline int glu_params_of(const k3c_glu_act *a, glu_params *q, const char *op, k3c_err *err) {
    if (k3c_glu_act_ok(a)) {
        const bool situ = a->act == K3C_ACT_SITU;
        *q = {a->act, situ ? (float)a->beta1 : 0.f, situ ? (float)a->beta2 : 0.f};
        return 0;
    }
    return k3c_errf(err, K3C_EINVAL, "%s: activation %d with betas (%g, %g): need SiLU, GELU, or SiTU with betas > 0",
                    op, a->act, a->beta1, a->beta2);
}

} // namespace

#endif
