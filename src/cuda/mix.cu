/* mix.cu — CUDA twins (fp32) of the AttnRes depth mix (ops/attnres.c), of the QK-Clip S_max reduction
 * (k3c_attention_max_logit) and of the activation moves zero / add / copy2d. Spec: ARCHITECTURE.md §5.1, §5.3, §5.4,
 * §10.2; DESIGN.md "Ops". */
#include <limits.h>
#include <math.h>

#include <vector>

#include "cuda/common.cuh"
#include "cuda/cuda_mix.h"

namespace {

/* ================================================================ shared helpers */
constexpr int MAXS = K3C_ATTNRES_MAX_SOURCES;

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

unsigned grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
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

/* ================================================================ QK-Clip S_max
 * One block per (query tile of 128, head), 256 threads: 128×128 score tiles built from k-chunks of 16 staged
 * transposed in shared memory (the next chunk prefetched into registers meanwhile), an 8×8 register tile per thread
 * (rows ty·4 + {0..3, 64..67}, columns likewise: conflict-free float4 reads), the causal / document mask applied to
 * the scaled scores, and the block's maximum merged into smax through atomicMax on order-preserving integer keys
 * (decoded in place afterwards). */
constexpr int BM = 128, BN = 128, BK = 16;

/* Signed-integer order equals float order (non-NaN); the map is its own inverse. */
__device__ __forceinline__ int fkey(float f) {
    const int b = __float_as_int(f);
    return b >= 0 ? b : b ^ 0x7FFFFFFF;
}

/* The first token of i's document: cu[last d with cu[d] <= i] (skips empty documents), clamped into [0, i] so that
 * malformed offsets (reported by the host after the kernel) cannot send a read out of bounds. */
__device__ __forceinline__ int doc_start(const int32_t *cu, int n_docs, int i) {
    if (!cu) return 0;
    int lo = 0, hi = n_docs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (cu[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int b = cu[lo];
    return b < 0 ? 0 : (b > i ? i : b);
}

__global__ void smax_init_kernel(int H, int *key) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h < H) key[h] = fkey(-INFINITY);
}

__global__ void smax_decode_kernel(int H, int *key) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h < H) {
        const int k = key[h];
        reinterpret_cast<float *>(key)[h] = __int_as_float(k >= 0 ? k : k ^ 0x7FFFFFFF);
    }
}

__global__ void __launch_bounds__(256) max_logit_kernel(int T, int H, int dqk, int n_docs, const int32_t *cu,
                                                        float scale, const float *q, const float *k, int *key) {
    __shared__ __align__(16) float Qs[BK][BM];
    __shared__ __align__(16) float Ks[BK][BN];
    __shared__ float red[8];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int h = blockIdx.y;
    const int i0 = (gridDim.x - 1 - blockIdx.x) * BM; /* the longest (last) query tiles start first */
    const int iend = min(T, i0 + BM);
    const int lr = tid >> 1, lk = (tid & 1) * 8; /* loader: row lr, columns lk .. lk+7 of the k-chunk */
    int rows[8], bos[8];
#pragma unroll
    for (int r = 0; r < 8; r++) {
        rows[r] = i0 + ty * 4 + (r & 3) + (r >> 2) * 64;
        bos[r] = rows[r] < T ? doc_start(cu, n_docs, rows[r]) : 0;
    }
    const int qi = i0 + lr;
    const float *qrow = q + ((int64_t)qi * H + h) * dqk;
    float best = -INFINITY;
    for (int j0 = doc_start(cu, n_docs, i0); j0 < iend; j0 += BN) {
        const int kj = j0 + lr;
        const float *krow = k + ((int64_t)kj * H + h) * dqk;
        float qa[8], ka[8]; /* the next k-chunk, global → registers */
        auto fetch = [&](int k0) {
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int c = k0 + lk + u;
                qa[u] = qi < T && c < dqk ? qrow[c] : 0.f;
                ka[u] = kj < T && c < dqk ? krow[c] : 0.f;
            }
        };
        float acc[8][8];
#pragma unroll
        for (int r = 0; r < 8; r++)
#pragma unroll
            for (int c = 0; c < 8; c++) acc[r][c] = 0.f;
        fetch(0);
        for (int k0 = 0; k0 < dqk; k0 += BK) {
#pragma unroll
            for (int u = 0; u < 8; u++) Qs[lk + u][lr] = qa[u], Ks[lk + u][lr] = ka[u];
            __syncthreads();
            if (k0 + BK < dqk) fetch(k0 + BK);
#pragma unroll
            for (int kk = 0; kk < BK; kk++) {
                const float4 a0 = *reinterpret_cast<const float4 *>(&Qs[kk][ty * 4]);
                const float4 a1 = *reinterpret_cast<const float4 *>(&Qs[kk][64 + ty * 4]);
                const float4 b0 = *reinterpret_cast<const float4 *>(&Ks[kk][tx * 4]);
                const float4 b1 = *reinterpret_cast<const float4 *>(&Ks[kk][64 + tx * 4]);
                const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
                for (int r = 0; r < 8; r++)
#pragma unroll
                    for (int c = 0; c < 8; c++) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
            }
            __syncthreads();
        }
#pragma unroll
        for (int r = 0; r < 8; r++)
#pragma unroll
            for (int c = 0; c < 8; c++) {
                const int j = j0 + tx * 4 + (c & 3) + (c >> 2) * 64;
                if (rows[r] < T && j <= rows[r] && j >= bos[r])
                    best = fmaxf(best, acc[r][c] * scale); /* NaN never wins (as the CPU's comparison) */
            }
    }
    best = warp_max(best);
    if ((tid & 31) == 0) red[tid >> 5] = best;
    __syncthreads();
    if (tid == 0) {
        float m = red[0];
        for (int wp = 1; wp < (int)(blockDim.x >> 5); wp++) m = fmaxf(m, red[wp]);
        if (m > -INFINITY) atomicMax(key + h, fkey(m));
    }
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

/* ================================================================ C entry point: QK-Clip S_max */
extern "C" int k3c_attention_max_logit_cuda(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const float *q,
                                            const float *k, float *smax, k3c_err *err) {
    if (!s || s->T < 0 || s->T > (1 << 30) || s->H <= 0 || s->H > 65535 || s->dqk <= 0 || s->H * s->dqk > INT32_MAX ||
        !isfinite(s->scale))
        return k3c_errf(err, K3C_EINVAL,
                        "attention_max_logit_cuda: bad sizes (0 <= T <= 2^30, 0 < H <= 65535, dqk > 0, "
                        "scale finite)");
    if (!smax) return k3c_errf(err, K3C_EINVAL, "attention_max_logit_cuda: NULL smax");
    if (cu_seqlens && (s->n_docs <= 0 || s->n_docs > INT32_MAX - 1))
        return k3c_errf(err, K3C_EINVAL, "attention_max_logit_cuda: cu_seqlens given with n_docs %lld",
                        (long long)s->n_docs);
    const int T = (int)s->T, H = (int)s->H, nd = cu_seqlens ? (int)s->n_docs : 1;
    int *key = reinterpret_cast<int *>(smax);
    smax_init_kernel<<<(H + 255) / 256, 256, 0, K3C_STREAM>>>(H, key);
    K3C_CU_LAUNCHED("max_logit_init");
    if (T > 0) {
        max_logit_kernel<<<dim3((unsigned)((T + BM - 1) / BM), (unsigned)H), 256, 0, K3C_STREAM>>>(
            T, H, (int)s->dqk, nd, cu_seqlens, (float)s->scale, q, k, key);
        K3C_CU_LAUNCHED("max_logit");
    }
    smax_decode_kernel<<<(H + 255) / 256, 256, 0, K3C_STREAM>>>(H, key);
    K3C_CU_LAUNCHED("max_logit_decode");
    if (T == 0) return 0;

    std::vector<float> host((size_t)H);
    std::vector<int32_t> cu(cu_seqlens ? (size_t)nd + 1 : 0);
    K3C_CU(cudaMemcpyAsync(host.data(), smax, host.size() * sizeof(float), cudaMemcpyDeviceToHost, K3C_STREAM));
    if (cu_seqlens)
        K3C_CU(cudaMemcpyAsync(cu.data(), cu_seqlens, cu.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, K3C_STREAM));
    K3C_CU(cudaStreamSynchronize(K3C_STREAM));
    if (cu_seqlens) {
        if (cu[0] != 0 || cu[(size_t)nd] != T)
            return k3c_errf(err, K3C_EINVAL,
                            "attention_max_logit_cuda: cu_seqlens must run from 0 to T = %d (got %d "
                            ".. %d)",
                            T, cu[0], cu[(size_t)nd]);
        for (int d = 0; d < nd; d++)
            if (cu[(size_t)d + 1] < cu[(size_t)d])
                return k3c_errf(err, K3C_EINVAL, "attention_max_logit_cuda: cu_seqlens decreases at entry %d", d + 1);
    }
    for (int h = 0; h < H; h++)
        if (!isfinite(host[(size_t)h]))
            return k3c_errf(err, K3C_ENUMERIC, "attention_max_logit_cuda: non-finite attention logits (head %d: %g)", h,
                            (double)host[(size_t)h]);
    return 0;
}

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
