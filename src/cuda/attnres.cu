/* attnres.cu — fp32 CUDA twin of the AttnRes depth mix (softmax over sources of RMS-normalised values), forward and a
 * deterministic backward (ops/attnres.c). docs/MODEL.md §5.1, §5.3, §5.4; declarations in cuda/cuda_ops.h. */
#include <limits.h>
#include <math.h>

#include <vector>

#include "cuda/common.cuh"

namespace {

constexpr int MAXS = K3C_ATTNRES_MAX_SOURCES;

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

/* ================================================================ AttnRes
 * The source pointers travel by value in the kernel parameters (__grid_constant__: indexed in place, never copied to
 * local memory). Kernels that need both v and dv take them 128 sources at a time, so every parameter block stays
 * within the classic 4 KB limit. */
struct src_tab {
    const float *p[MAXS]; /* 2 KB */
};
constexpr int GRP = 128;
struct grp_tab {
    const float *v[GRP];
    float *dv[GRP]; /* NULL = that source's gradient is not needed */
};

constexpr int G = 4;        /* sources whose token statistics are reduced together */
constexpr int MAXWARPS = 8; /* per-token blocks have at most 256 threads */

/* One thread per feature column for D up to 256, else 256 threads striding over D. */
int token_block(int64_t D) {
    int64_t b = (D + 31) / 32 * 32;
    return (int)(b < 256 ? b : 256);
}

/* Block-wide sums over d of S statistics of every source at one token (off = t·D), G sources per pass:
 *   stat 0: Σ γ_d w_d x_d, stat 1: Σ x_d², stat 2 (S = 3): Σ dh_d x_d.
 * out[s·MAXS + i] receives stat s of source i. Fixed reduction order (deterministic). Ends synchronised. */
template <int S>
__device__ void token_stats(const src_tab &P, int N, int64_t off, int D, const float *w, const float *gamma,
                            const float *dhrow, float *red, float *out) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    for (int g0 = 0; g0 < N; g0 += G) {
        const int ng = min(G, N - g0);
        float acc[S][G];
#pragma unroll
        for (int s = 0; s < S; s++)
#pragma unroll
            for (int j = 0; j < G; j++) acc[s][j] = 0.f;
        for (int d = tid; d < D; d += blockDim.x) {
            const float gw = gamma[d] * w[d], g = S > 2 ? dhrow[d] : 0.f;
#pragma unroll
            for (int j = 0; j < G; j++) {
                if (j >= ng) break;
                const float x = P.p[g0 + j][off + d];
                acc[0][j] += gw * x;
                acc[1][j] += x * x;
                if (S > 2) acc[S - 1][j] += g * x;
            }
        }
#pragma unroll
        for (int s = 0; s < S; s++)
#pragma unroll
            for (int j = 0; j < G; j++) {
                const float v = warp_sum(acc[s][j]);
                if (lane == 0) red[(warp * S + s) * G + j] = v;
            }
        __syncthreads();
        if (tid < S * G) {
            const int s = tid / G, j = tid - s * G;
            if (j < ng) {
                float sum = 0.f;
                for (int wp = 0; wp < nw; wp++) sum += red[(wp * S + s) * G + j];
                out[s * MAXS + g0 + j] = sum;
            }
        }
        __syncthreads(); /* red is rewritten by the next group; out is read after the loop */
    }
}

/* Warp 0 only (all 32 lanes): rstd_i = 1/sqrt(ss_i/D + eps), z_i = dot_i·rstd_i, α = softmax(z), as mix_weights. */
__device__ void warp_softmax(int N, int D, float eps, const float *dot, const float *ss, float *rs, float *z,
                             float *al) {
    const int lane = threadIdx.x & 31;
    float zmax = -INFINITY, sum = 0.f;
    for (int i = lane; i < N; i += 32) {
        rs[i] = 1.0f / sqrtf(ss[i] / (float)D + eps);
        z[i] = dot[i] * rs[i];
        zmax = fmaxf(zmax, z[i]);
    }
    zmax = warp_max(zmax);
    for (int i = lane; i < N; i += 32) sum += al[i] = expf(z[i] - zmax);
    sum = warp_sum(sum);
    for (int i = lane; i < N; i += 32) al[i] /= sum;
}

/* One block per token: statistics, softmax weights, saved (rstd, α), then h = Σ_i α_i v_i in source order. */
__global__ void __launch_bounds__(256)
    attnres_fwd_kernel(const __grid_constant__ src_tab P, int T, int N, int D, float eps, const float *w,
                       const float *gamma, float *h, float *saved) {
    __shared__ float st[2 * MAXS], rs[MAXS], z[MAXS], al[MAXS];
    __shared__ float red[MAXWARPS * 2 * G];
    const int t = blockIdx.x;
    const int64_t off = (int64_t)t * D;
    token_stats<2>(P, N, off, D, w, gamma, nullptr, red, st);
    if (threadIdx.x < 32) warp_softmax(N, D, eps, st, st + MAXS, rs, z, al);
    __syncthreads();
    if (saved)
        for (int i = threadIdx.x; i < N; i += blockDim.x) {
            saved[(int64_t)t * N + i] = rs[i];
            saved[(int64_t)T * N + (int64_t)t * N + i] = al[i];
        }
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.f;
        for (int i = 0; i < N; i++) acc += al[i] * P.p[i][off + d];
        h[off + d] = acc;
    }
}

/* Backward, one block per token (§5.4): dp_i = dh·v_i, dz_i = α_i (dp_i − Σ_j α_j dp_j); writes the per-(t, i)
 * coefficients of dv_i += α_i dh + a_i γ⊙w − b_i v_i: cal = α_i, ca = a_i = dz_i·rstd_i (also the dŵ weight),
 * cb = b_i = dz_i·rstd_i·z_i·rstd_i / D. With saved, rstd and α are read and only z is recomputed (as the CPU op). */
__global__ void __launch_bounds__(256)
    attnres_coef_kernel(const __grid_constant__ src_tab P, int T, int N, int D, float eps, const float *w,
                        const float *gamma, const float *saved, const float *dh, float *cal, float *ca, float *cb) {
    __shared__ float st[3 * MAXS], rs[MAXS], z[MAXS], al[MAXS];
    __shared__ float red[MAXWARPS * 3 * G];
    const int t = blockIdx.x;
    const int64_t off = (int64_t)t * D;
    token_stats<3>(P, N, off, D, w, gamma, dh + off, red, st);
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    const float *dot = st, *dp = st + 2 * MAXS;
    if (saved) {
        for (int i = lane; i < N; i += 32) {
            rs[i] = saved[(int64_t)t * N + i];
            al[i] = saved[(int64_t)T * N + (int64_t)t * N + i];
            z[i] = dot[i] * rs[i];
        }
    } else {
        warp_softmax(N, D, eps, dot, st + MAXS, rs, z, al);
    }
    float hd = 0.f;
    for (int i = lane; i < N; i += 32) hd += al[i] * dp[i];
    hd = warp_sum(hd);
    for (int i = lane; i < N; i += 32) {
        const float dz = al[i] * (dp[i] - hd);
        const int64_t o = (int64_t)t * N + i;
        cal[o] = al[i];
        ca[o] = dz * rs[i];
        cb[o] = dz * rs[i] * z[i] * rs[i] / (float)D;
    }
}

/* Sources g0 .. g0+ng−1: thread d of token chunk p (tokens p·TC ..) adds each source's gradient at (t, d), source by
 * source in one thread (so aliased dv entries add up without a race), and, when part is given, the chunk's share of
 * dŵ_d = Σ_t Σ_i a_{t,i} v_i[t, d] in double; part[p, d] is overwritten by the first group and added to by later ones
 * (launches are stream-ordered, so the sum is deterministic). */
__global__ void attnres_dv_kernel(const __grid_constant__ grp_tab Q, int g0, int ng, int T, int N, int D, int TC,
                                  const float *w, const float *gamma, const float *dh, const float *cal,
                                  const float *ca, const float *cb, double *part, int first) {
    const int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D) return;
    const int p = blockIdx.y;
    const int64_t t0 = (int64_t)p * TC, t1 = min((int64_t)T, t0 + TC);
    const float gam = gamma[d], wd = w[d];
    double acc = 0.0;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t off = t * D + d, c0 = t * N + g0;
        const float g = dh[off];
        for (int j = 0; j < ng; j++) {
            const float x = Q.v[j][off], a = ca[c0 + j];
            if (Q.dv[j]) {
                float *o = Q.dv[j] + off;
                *o += cal[c0 + j] * g + a * gam * wd - cb[c0 + j] * x;
            }
            if (part) acc += (double)a * (double)x;
        }
    }
    if (part) {
        double *q = part + (int64_t)p * D + d;
        *q = first ? acc : *q + acc;
    }
}

/* dŵ_d = Σ_p part[p, d] (fixed order); dw += γ ⊙ dŵ, dgamma += w ⊙ dŵ (dŵ rounded to float first, as the CPU's). */
__global__ void attnres_dw_kernel(int D, int P, const double *part, const float *w, const float *gamma, float *dw,
                                  float *dgamma) {
    const int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D) return;
    double s = 0.0;
    for (int p = 0; p < P; p++) s += part[(int64_t)p * D + d];
    const float dwh = (float)s;
    if (dw) dw[d] += gamma[d] * dwh;
    if (dgamma) dgamma[d] += w[d] * dwh;
}

int attnres_check(const k3c_attnres_sizes *s, const float *const *v, const char *op, k3c_err *err) {
    if (!s || s->tokens < 0 || s->dim < 1 || s->sources < 1 || s->sources > MAXS || !(s->eps >= 0) ||
        s->tokens > INT32_MAX || s->dim > INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (T >= 0, D >= 1, N in 1..%d, eps >= 0)", op, MAXS);
    if (!v) return k3c_errf(err, K3C_EINVAL, "%s: NULL source array", op);
    for (int64_t i = 0; i < s->sources; i++)
        if (!v[i]) return k3c_errf(err, K3C_EINVAL, "%s: source %lld is NULL", op, (long long)i);
    return K3C_OK;
}

/* The dŵ reduction's token chunks: a function of T alone (so the summation order is too), at most 512 chunks. */
void token_chunks(int64_t T, int64_t *tc, int64_t *np) {
    int64_t c = (T + 511) / 512;
    if (c < 16) c = 16;
    *tc = c, *np = (T + c - 1) / c;
}

} // namespace

/* ================================================================ C entry points: AttnRes */
extern "C" size_t k3c_attnres_workspace_cuda(const k3c_attnres_sizes *s) {
    if (!s || s->tokens < 0 || s->dim < 1 || s->sources < 1 || s->sources > MAXS || s->tokens > INT32_MAX ||
        s->dim > INT32_MAX)
        return 0;
    int64_t tc, np;
    token_chunks(s->tokens, &tc, &np);
    const size_t tn = (size_t)(s->tokens * s->sources) * sizeof(float);
    return 3 * al256(tn) + al256((size_t)np * (size_t)s->dim * sizeof(double));
}

extern "C" int k3c_attnres_fwd_cuda(const k3c_attnres_sizes *s, const float *const *v, const float *w,
                                    const float *gamma, float *h, float *saved, k3c_err *err) {
    if (attnres_check(s, v, "attnres_fwd_cuda", err)) return K3C_EINVAL;
    if (s->tokens == 0) return 0;
    src_tab P = {};
    for (int64_t i = 0; i < s->sources; i++) P.p[i] = v[i];
    attnres_fwd_kernel<<<(unsigned)s->tokens, token_block(s->dim), 0, K3C_STREAM>>>(
        P, (int)s->tokens, (int)s->sources, (int)s->dim, (float)s->eps, w, gamma, h, saved);
    K3C_CU_LAUNCHED("attnres_fwd");
    return 0;
}

extern "C" int k3c_attnres_bwd_cuda(const k3c_attnres_sizes *s, const float *const *v, const float *w,
                                    const float *gamma, const float *saved, const float *dh, float *const *dv,
                                    float *dw, float *dgamma, void *ws, k3c_err *err) {
    if (attnres_check(s, v, "attnres_bwd_cuda", err)) return K3C_EINVAL;
    const int64_t T = s->tokens, N = s->sources, D = s->dim;
    bool need_dv = false;
    for (int64_t i = 0; dv && i < N; i++) need_dv |= dv[i] != nullptr;
    const bool need_w = dw || dgamma;
    if (T == 0 || (!need_dv && !need_w)) return 0;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "attnres_bwd_cuda: no workspace (k3c_attnres_workspace_cuda bytes)");
    int64_t tc, np;
    token_chunks(T, &tc, &np);
    const size_t tn = al256((size_t)(T * N) * sizeof(float));
    unsigned char *base = (unsigned char *)ws;
    float *cal = (float *)base, *ca = (float *)(base + tn), *cb = (float *)(base + 2 * tn);
    double *part = need_w ? (double *)(base + 3 * tn) : nullptr;

    src_tab P = {};
    for (int64_t i = 0; i < N; i++) P.p[i] = v[i];
    const int bd = token_block(D);
    attnres_coef_kernel<<<(unsigned)T, bd, 0, K3C_STREAM>>>(P, (int)T, (int)N, (int)D, (float)s->eps, w, gamma, saved,
                                                            dh, cal, ca, cb);
    K3C_CU_LAUNCHED("attnres_coef");
    const dim3 grid((unsigned)((D + bd - 1) / bd), (unsigned)np);
    bool first = true;
    for (int64_t g0 = 0; g0 < N; g0 += GRP) {
        const int ng = (int)(N - g0 < GRP ? N - g0 : GRP);
        grp_tab Q = {};
        bool any = false;
        for (int j = 0; j < ng; j++) {
            Q.v[j] = v[g0 + j];
            Q.dv[j] = dv ? dv[g0 + j] : nullptr;
            any |= Q.dv[j] != nullptr;
        }
        if (!any && !need_w) continue;
        attnres_dv_kernel<<<grid, bd, 0, K3C_STREAM>>>(Q, (int)g0, ng, (int)T, (int)N, (int)D, (int)tc, w, gamma, dh,
                                                       cal, ca, cb, part, first);
        K3C_CU_LAUNCHED("attnres_dv");
        first = false;
    }
    if (need_w) {
        attnres_dw_kernel<<<(unsigned)((D + 255) / 256), 256, 0, K3C_STREAM>>>((int)D, (int)np, part, w, gamma, dw,
                                                                               dgamma);
        K3C_CU_LAUNCHED("attnres_dw");
    }
    return 0;
}
