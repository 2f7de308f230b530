/* attention.cu — causal softmax attention with packed-document masks (gated NoPE MLA core), FlashAttention-2 style on
 * elem tensor cores with fp32 softmax: forward (o, lse), backward as two race-free passes (dq; dk and dv).
 * docs/MODEL.md §4.2 (d_qk 192 = 128 + 64, d_v 128, scale (d_qk)^−1/2), §11 (fp32 softmax statistics). */
#include <math.h>

#include "cuda/common.cuh"

namespace k3c_cu {
namespace K3C_ELEM_NS {

constexpr float A_LOG2E = 1.4426950408889634f, A_LN2 = 0.6931471805599453f;

struct attn_args {
    const elem *q, *k, *v, *dout;
    const int32_t *cu;
    int T, H, N, dqk, dv;
    float scale, scale_log2;
    void *o;
    float *lse;          /* forward output (natural log) */
    const float *lse_in; /* backward input */
    const float *D;      /* backward: rowsum(dO ⊙ O) [T, H] */
    void *dq, *dk, *dvo;
};

/* First token of the document holding token i (cu NULL: one document). */
__device__ __forceinline__ int doc_start(const int32_t *cu, int N, int i) {
    if (!cu) return 0;
    int lo = 0, hi = N - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (cu[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return cu[lo];
}
__device__ __forceinline__ int doc_end(const int32_t *cu, int N, int T, int i) {
    if (!cu) return T;
    int lo = 0, hi = N - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (cu[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return cu[lo + 1];
}

template <typename OutT, bool ACC> __device__ __forceinline__ void out2(OutT *p, float x, float y);
template <> __device__ __forceinline__ void out2<float, false>(float *p, float x, float y) {
    *reinterpret_cast<float2 *>(p) = make_float2(x, y);
}
template <> __device__ __forceinline__ void out2<float, true>(float *p, float x, float y) {
    float2 o = *reinterpret_cast<float2 *>(p);
    *reinterpret_cast<float2 *>(p) = make_float2(o.x + x, o.y + y);
}
template <> __device__ __forceinline__ void out2<elem, false>(elem *p, float x, float y) {
    *reinterpret_cast<uint32_t *>(p) = pack_e(x, y);
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* ---------------------------------------------------------------- forward
 * Block: 64 query rows of one head (4 warps × 16 rows), key tiles of 64 double-buffered through cp.async. Query blocks
 * run last-first so the long causal rows start early. Keys span [doc_start(first row), last row]; tiles that cross the
 * diagonal, a document start or the end are masked elementwise. */
template <int DQK, int DV> struct fwd_layout {
    static constexpr int LDQ = DQK + 8, LDV = DV + 8;
    static constexpr int Q = 0, K = Q + 64 * LDQ * 2, V = K + 2 * 64 * LDQ * 2, BYTES = V + 2 * 64 * LDV * 2;
};

template <int DQK, int DV, typename OutT> __global__ void __launch_bounds__(128, 2) attn_fwd_kernel(attn_args a) {
    using Ly = fwd_layout<DQK, DV>;
    constexpr int LDQ = Ly::LDQ, LDV = Ly::LDV, BN = 64;
    extern __shared__ __align__(16) unsigned char smem[];
    elem *Qs = (elem *)(smem + Ly::Q);
    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
    const int q0 = qb * 64, qn = min(64, a.T - q0);
    const int64_t rq = (int64_t)a.H * a.dqk, rv = (int64_t)a.H * a.dv;
    const int k_lo = doc_start(a.cu, a.N, q0), k_hi = q0 + qn, ds_last = doc_start(a.cu, a.N, q0 + qn - 1);
    const int r0 = q0 + 16 * warp + g8, r1 = r0 + 8;
    const int ds0 = doc_start(a.cu, a.N, min(r0, a.T - 1)), ds1 = doc_start(a.cu, a.N, min(r1, a.T - 1));
    const int nkt = (k_hi - k_lo + BN - 1) / BN;

    auto load_kv = [&](int j, int stage) {
        const int kt0 = k_lo + j * BN, kn = k_hi - kt0;
        tile_load_async((elem *)(smem + Ly::K) + stage * 64 * LDQ, LDQ, a.k + ((int64_t)kt0 * a.H + h) * a.dqk, rq, BN,
                        DQK, kn, a.dqk, tid, 128);
        tile_load_async((elem *)(smem + Ly::V) + stage * 64 * LDV, LDV, a.v + ((int64_t)kt0 * a.H + h) * a.dv, rv, BN,
                        DV, kn, a.dv, tid, 128);
    };
    tile_load_async(Qs, LDQ, a.q + ((int64_t)q0 * a.H + h) * a.dqk, rq, 64, DQK, qn, a.dqk, tid, 128);
    load_kv(0, 0);
    cp_async_commit();

    uint32_t qf[DQK / 16][4];
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    float oacc[DV / 8][4];
#pragma unroll
    for (int i = 0; i < DV / 8; i++) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;

    for (int j = 0; j < nkt; j++) {
        if (j + 1 < nkt) {
            load_kv(j + 1, (j + 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (j == 0)
#pragma unroll
            for (int kk = 0; kk < DQK / 16; kk++) lda_rowmajor(qf[kk], Qs, LDQ, 16 * warp, 16 * kk, lane);
        const elem *Ks = (const elem *)(smem + Ly::K) + (j & 1) * 64 * LDQ;
        const elem *Vs = (const elem *)(smem + Ly::V) + (j & 1) * 64 * LDV;
        const int kt0 = k_lo + j * BN;

        float s[BN / 8][4];
#pragma unroll
        for (int i = 0; i < BN / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DQK / 16; kk++)
#pragma unroll
            for (int n0 = 0; n0 < BN; n0 += 16) {
                uint32_t b[4];
                ldb_nmajor(b, Ks, LDQ, n0, 16 * kk, lane);
                mma16816(s[n0 / 8], qf[kk], b[0], b[1]);
                mma16816(s[n0 / 8 + 1], qf[kk], b[2], b[3]);
            }
        const bool need_mask = kt0 + BN - 1 > q0 || kt0 < ds_last || kt0 + BN > k_hi;
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = s[nt][e] * a.scale_log2;
                if (need_mask) {
                    const int col = kt0 + nt * 8 + 2 * t4 + (e & 1), row = e < 2 ? r0 : r1, ds = e < 2 ? ds0 : ds1;
                    if (col > row || col < ds || col >= k_hi) x = -INFINITY;
                }
                s[nt][e] = x;
            }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) {
            mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
        }
        const float mn0 = fmaxf(m0, quad_max(mx0)), mn1 = fmaxf(m1, quad_max(mx1));
        const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
        const float al0 = ex2(m0 - mu0), al1 = ex2(m1 - mu1);
        m0 = mn0, m1 = mn1;
        l0 *= al0, l1 *= al1;
#pragma unroll
        for (int i = 0; i < DV / 8; i++) oacc[i][0] *= al0, oacc[i][1] *= al0, oacc[i][2] *= al1, oacc[i][3] *= al1;
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) {
            s[nt][0] = ex2(s[nt][0] - mu0), s[nt][1] = ex2(s[nt][1] - mu0);
            s[nt][2] = ex2(s[nt][2] - mu1), s[nt][3] = ex2(s[nt][3] - mu1);
            l0 += s[nt][0] + s[nt][1], l1 += s[nt][2] + s[nt][3];
        }
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t pa[4] = {pack_e(s[2 * kk][0], s[2 * kk][1]), pack_e(s[2 * kk][2], s[2 * kk][3]),
                              pack_e(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack_e(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int n0 = 0; n0 < DV; n0 += 16) {
                uint32_t b[4];
                ldb_kmajor(b, Vs, LDV, n0, 16 * kk, lane);
                mma16816(oacc[n0 / 8], pa, b[0], b[1]);
                mma16816(oacc[n0 / 8 + 1], pa, b[2], b[3]);
            }
        }
        __syncthreads();
    }
    l0 = quad_sum(l0), l1 = quad_sum(l1);
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
    OutT *o = (OutT *)a.o;
#pragma unroll
    for (int nt = 0; nt < DV / 8; nt++) {
        const int col = nt * 8 + 2 * t4;
        if (col < a.dv) {
            if (r0 < a.T)
                out2<OutT, false>(o + ((int64_t)r0 * a.H + h) * a.dv + col, oacc[nt][0] * inv0, oacc[nt][1] * inv0);
            if (r1 < a.T)
                out2<OutT, false>(o + ((int64_t)r1 * a.H + h) * a.dv + col, oacc[nt][2] * inv1, oacc[nt][3] * inv1);
        }
    }
    if (t4 == 0) {
        if (r0 < a.T) a.lse[(int64_t)r0 * a.H + h] = (m0 + log2f(l0)) * A_LN2;
        if (r1 < a.T) a.lse[(int64_t)r1 * a.H + h] = (m1 + log2f(l1)) * A_LN2;
    }
}

/* ---------------------------------------------------------------- backward: D = rowsum(dO ⊙ O), one warp per row */
template <typename InT>
__global__ void attn_bwd_d_kernel(const InT *o, const InT *dout, float *D, int64_t rows, int dv) {
    const int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + (threadIdx.x >> 5);
    if (row >= rows) return;
    float s = 0.f;
    for (int c = threadIdx.x & 31; c < dv; c += 32) s += (float)o[row * dv + c] * (float)dout[row * dv + c];
#pragma unroll
    for (int off = 16; off; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if ((threadIdx.x & 31) == 0) D[row] = s;
}

/* ---------------------------------------------------------------- backward: dq
 * Block: 64 query rows (4 warps × 16), key tiles of 32. P = exp(scale·q·k − lse), dP = dO·Vᵀ, dS = P ⊙ (dP − D),
 * dq = scale · dS·K. */
template <int DQK, int DV> struct dq_layout {
    static constexpr int LDQ = DQK + 8, LDV = DV + 8, BN = 32;
    static constexpr int Q = 0, DO = Q + 64 * LDQ * 2, K = DO + 64 * LDV * 2, V = K + 2 * BN * LDQ * 2,
                         BYTES = V + 2 * BN * LDV * 2;
};

template <int DQK, int DV, typename OutT, bool ACC>
__global__ void __launch_bounds__(128, 2) attn_bwd_dq_kernel(attn_args a) {
    using Ly = dq_layout<DQK, DV>;
    constexpr int LDQ = Ly::LDQ, LDV = Ly::LDV, BN = Ly::BN;
    extern __shared__ __align__(16) unsigned char smem[];
    const elem *Qs = (const elem *)(smem + Ly::Q), *dOs = (const elem *)(smem + Ly::DO);
    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
    const int q0 = qb * 64, qn = min(64, a.T - q0);
    const int64_t rq = (int64_t)a.H * a.dqk, rv = (int64_t)a.H * a.dv;
    const int k_lo = doc_start(a.cu, a.N, q0), k_hi = q0 + qn, ds_last = doc_start(a.cu, a.N, q0 + qn - 1);
    const int r0 = q0 + 16 * warp + g8, r1 = r0 + 8;
    const int ds0 = doc_start(a.cu, a.N, min(r0, a.T - 1)), ds1 = doc_start(a.cu, a.N, min(r1, a.T - 1));
    const float lse0 = r0 < a.T ? a.lse_in[(int64_t)r0 * a.H + h] * A_LOG2E : 0.f;
    const float lse1 = r1 < a.T ? a.lse_in[(int64_t)r1 * a.H + h] * A_LOG2E : 0.f;
    const float D0 = r0 < a.T ? a.D[(int64_t)r0 * a.H + h] : 0.f, D1 = r1 < a.T ? a.D[(int64_t)r1 * a.H + h] : 0.f;
    const int nkt = (k_hi - k_lo + BN - 1) / BN;

    auto load_kv = [&](int j, int stage) {
        const int kt0 = k_lo + j * BN, kn = k_hi - kt0;
        tile_load_async((elem *)(smem + Ly::K) + stage * BN * LDQ, LDQ, a.k + ((int64_t)kt0 * a.H + h) * a.dqk, rq, BN,
                        DQK, kn, a.dqk, tid, 128);
        tile_load_async((elem *)(smem + Ly::V) + stage * BN * LDV, LDV, a.v + ((int64_t)kt0 * a.H + h) * a.dv, rv, BN,
                        DV, kn, a.dv, tid, 128);
    };
    tile_load_async((elem *)Qs, LDQ, a.q + ((int64_t)q0 * a.H + h) * a.dqk, rq, 64, DQK, qn, a.dqk, tid, 128);
    tile_load_async((elem *)dOs, LDV, a.dout + ((int64_t)q0 * a.H + h) * a.dv, rv, 64, DV, qn, a.dv, tid, 128);
    load_kv(0, 0);
    cp_async_commit();

    float dq[DQK / 8][4];
#pragma unroll
    for (int i = 0; i < DQK / 8; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
    for (int j = 0; j < nkt; j++) {
        if (j + 1 < nkt) {
            load_kv(j + 1, (j + 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const elem *Ks = (const elem *)(smem + Ly::K) + (j & 1) * BN * LDQ;
        const elem *Vs = (const elem *)(smem + Ly::V) + (j & 1) * BN * LDV;
        const int kt0 = k_lo + j * BN;
        float s[BN / 8][4], dp[BN / 8][4];
#pragma unroll
        for (int i = 0; i < BN / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DQK / 16; kk++) {
            uint32_t af[4];
            lda_rowmajor(af, Qs, LDQ, 16 * warp, 16 * kk, lane);
#pragma unroll
            for (int n0 = 0; n0 < BN; n0 += 16) {
                uint32_t b[4];
                ldb_nmajor(b, Ks, LDQ, n0, 16 * kk, lane);
                mma16816(s[n0 / 8], af, b[0], b[1]);
                mma16816(s[n0 / 8 + 1], af, b[2], b[3]);
            }
        }
#pragma unroll
        for (int kk = 0; kk < DV / 16; kk++) {
            uint32_t af[4];
            lda_rowmajor(af, dOs, LDV, 16 * warp, 16 * kk, lane);
#pragma unroll
            for (int n0 = 0; n0 < BN; n0 += 16) {
                uint32_t b[4];
                ldb_nmajor(b, Vs, LDV, n0, 16 * kk, lane);
                mma16816(dp[n0 / 8], af, b[0], b[1]);
                mma16816(dp[n0 / 8 + 1], af, b[2], b[3]);
            }
        }
        const bool need_mask = kt0 + BN - 1 > q0 || kt0 < ds_last || kt0 + BN > k_hi;
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const bool lo = e < 2;
                float p = ex2(s[nt][e] * a.scale_log2 - (lo ? lse0 : lse1));
                if (need_mask) {
                    const int col = kt0 + nt * 8 + 2 * t4 + (e & 1), row = lo ? r0 : r1, ds = lo ? ds0 : ds1;
                    if (col > row || col < ds || col >= k_hi) p = 0.f;
                }
                s[nt][e] = p * (dp[nt][e] - (lo ? D0 : D1));
            }
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t pa[4] = {pack_e(s[2 * kk][0], s[2 * kk][1]), pack_e(s[2 * kk][2], s[2 * kk][3]),
                              pack_e(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack_e(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int n0 = 0; n0 < DQK; n0 += 16) {
                uint32_t b[4];
                ldb_kmajor(b, Ks, LDQ, n0, 16 * kk, lane);
                mma16816(dq[n0 / 8], pa, b[0], b[1]);
                mma16816(dq[n0 / 8 + 1], pa, b[2], b[3]);
            }
        }
        __syncthreads();
    }
    OutT *out = (OutT *)a.dq;
#pragma unroll
    for (int nt = 0; nt < DQK / 8; nt++) {
        const int col = nt * 8 + 2 * t4;
        if (col < a.dqk) {
            if (r0 < a.T)
                out2<OutT, ACC>(out + ((int64_t)r0 * a.H + h) * a.dqk + col, dq[nt][0] * a.scale, dq[nt][1] * a.scale);
            if (r1 < a.T)
                out2<OutT, ACC>(out + ((int64_t)r1 * a.H + h) * a.dqk + col, dq[nt][2] * a.scale, dq[nt][3] * a.scale);
        }
    }
}

/* ---------------------------------------------------------------- backward: dk, dv
 * Block: 64 keys (4 warps × 16) against query tiles of 32 from the first key to the end of the last key's document.
 * Computed transposed: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, dV += Pᵀ·dO, dK += scale · dSᵀ·Q. */
template <int DQK, int DV> struct dkv_layout {
    static constexpr int LDQ = DQK + 8, LDV = DV + 8, BM = 32;
    static constexpr int K = 0, V = K + 64 * LDQ * 2, Q = V + 64 * LDV * 2, DO = Q + 2 * BM * LDQ * 2,
                         ST = DO + 2 * BM * LDV * 2, BYTES = ST + 2 * 3 * BM * 4;
};

template <int DQK, int DV, typename OutT, bool ACC>
__global__ void __launch_bounds__(128, 2) attn_bwd_dkv_kernel(attn_args a) {
    using Ly = dkv_layout<DQK, DV>;
    constexpr int LDQ = Ly::LDQ, LDV = Ly::LDV, BM = Ly::BM;
    extern __shared__ __align__(16) unsigned char smem[];
    const elem *Ks = (const elem *)(smem + Ly::K), *Vs = (const elem *)(smem + Ly::V);
    float *stats = (float *)(smem + Ly::ST); /* per stage: lse (log2), D, doc start of each query */
    const int kb = blockIdx.x, h = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
    const int k0 = kb * 64, kn = min(64, a.T - k0);
    const int64_t rq = (int64_t)a.H * a.dqk, rv = (int64_t)a.H * a.dv;
    const int q_lo = k0, q_hi = doc_end(a.cu, a.N, a.T, k0 + kn - 1);
    const int j0 = k0 + 16 * warp + g8, j1 = j0 + 8;
    const int nqt = (q_hi - q_lo + BM - 1) / BM;

    auto load_q = [&](int it, int stage) {
        const int qt0 = q_lo + it * BM, qn = q_hi - qt0;
        tile_load_async((elem *)(smem + Ly::Q) + stage * BM * LDQ, LDQ, a.q + ((int64_t)qt0 * a.H + h) * a.dqk, rq, BM,
                        DQK, qn, a.dqk, tid, 128);
        tile_load_async((elem *)(smem + Ly::DO) + stage * BM * LDV, LDV, a.dout + ((int64_t)qt0 * a.H + h) * a.dv, rv,
                        BM, DV, qn, a.dv, tid, 128);
        if (tid < BM) {
            float *st = stats + stage * 3 * BM;
            const int i = qt0 + tid;
            const bool ok = i < q_hi;
            st[tid] = ok ? a.lse_in[(int64_t)i * a.H + h] * A_LOG2E : 0.f;
            st[BM + tid] = ok ? a.D[(int64_t)i * a.H + h] : 0.f;
            st[2 * BM + tid] = __int_as_float(ok ? doc_start(a.cu, a.N, i) : a.T);
        }
    };
    tile_load_async((elem *)Ks, LDQ, a.k + ((int64_t)k0 * a.H + h) * a.dqk, rq, 64, DQK, kn, a.dqk, tid, 128);
    tile_load_async((elem *)Vs, LDV, a.v + ((int64_t)k0 * a.H + h) * a.dv, rv, 64, DV, kn, a.dv, tid, 128);
    load_q(0, 0);
    cp_async_commit();

    float dk[DQK / 8][4], dv[DV / 8][4];
#pragma unroll
    for (int i = 0; i < DQK / 8; i++) dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.f;
#pragma unroll
    for (int i = 0; i < DV / 8; i++) dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.f;
    for (int it = 0; it < nqt; it++) {
        if (it + 1 < nqt) {
            load_q(it + 1, (it + 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const elem *Qs = (const elem *)(smem + Ly::Q) + (it & 1) * BM * LDQ;
        const elem *dOs = (const elem *)(smem + Ly::DO) + (it & 1) * BM * LDV;
        const float *st = stats + (it & 1) * 3 * BM;
        const int qt0 = q_lo + it * BM;
        float s[BM / 8][4], dp[BM / 8][4];
#pragma unroll
        for (int i = 0; i < BM / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DQK / 16; kk++) {
            uint32_t af[4];
            lda_rowmajor(af, Ks, LDQ, 16 * warp, 16 * kk, lane);
#pragma unroll
            for (int n0 = 0; n0 < BM; n0 += 16) {
                uint32_t b[4];
                ldb_nmajor(b, Qs, LDQ, n0, 16 * kk, lane);
                mma16816(s[n0 / 8], af, b[0], b[1]);
                mma16816(s[n0 / 8 + 1], af, b[2], b[3]);
            }
        }
#pragma unroll
        for (int kk = 0; kk < DV / 16; kk++) {
            uint32_t af[4];
            lda_rowmajor(af, Vs, LDV, 16 * warp, 16 * kk, lane);
#pragma unroll
            for (int n0 = 0; n0 < BM; n0 += 16) {
                uint32_t b[4];
                ldb_nmajor(b, dOs, LDV, n0, 16 * kk, lane);
                mma16816(dp[n0 / 8], af, b[0], b[1]);
                mma16816(dp[n0 / 8 + 1], af, b[2], b[3]);
            }
        }
        /* s becomes Pᵀ, dp becomes dSᵀ */
#pragma unroll
        for (int nt = 0; nt < BM / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qi = nt * 8 + 2 * t4 + (e & 1), i = qt0 + qi, key = e < 2 ? j0 : j1;
                const bool ok = i < q_hi && i >= key && key >= __float_as_int(st[2 * BM + qi]);
                const float p = ok ? ex2(s[nt][e] * a.scale_log2 - st[qi]) : 0.f;
                s[nt][e] = p;
                dp[nt][e] = p * (dp[nt][e] - st[BM + qi]);
            }
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++) {
            uint32_t pa[4] = {pack_e(s[2 * kk][0], s[2 * kk][1]), pack_e(s[2 * kk][2], s[2 * kk][3]),
                              pack_e(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack_e(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            uint32_t da[4] = {pack_e(dp[2 * kk][0], dp[2 * kk][1]), pack_e(dp[2 * kk][2], dp[2 * kk][3]),
                              pack_e(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                              pack_e(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
#pragma unroll
            for (int n0 = 0; n0 < DV; n0 += 16) {
                uint32_t b[4];
                ldb_kmajor(b, dOs, LDV, n0, 16 * kk, lane);
                mma16816(dv[n0 / 8], pa, b[0], b[1]);
                mma16816(dv[n0 / 8 + 1], pa, b[2], b[3]);
            }
#pragma unroll
            for (int n0 = 0; n0 < DQK; n0 += 16) {
                uint32_t b[4];
                ldb_kmajor(b, Qs, LDQ, n0, 16 * kk, lane);
                mma16816(dk[n0 / 8], da, b[0], b[1]);
                mma16816(dk[n0 / 8 + 1], da, b[2], b[3]);
            }
        }
        __syncthreads();
    }
    OutT *dko = (OutT *)a.dk, *dvo = (OutT *)a.dvo;
#pragma unroll
    for (int nt = 0; nt < DQK / 8; nt++) {
        const int col = nt * 8 + 2 * t4;
        if (col < a.dqk) {
            if (j0 < a.T)
                out2<OutT, ACC>(dko + ((int64_t)j0 * a.H + h) * a.dqk + col, dk[nt][0] * a.scale, dk[nt][1] * a.scale);
            if (j1 < a.T)
                out2<OutT, ACC>(dko + ((int64_t)j1 * a.H + h) * a.dqk + col, dk[nt][2] * a.scale, dk[nt][3] * a.scale);
        }
    }
#pragma unroll
    for (int nt = 0; nt < DV / 8; nt++) {
        const int col = nt * 8 + 2 * t4;
        if (col < a.dv) {
            if (j0 < a.T) out2<OutT, ACC>(dvo + ((int64_t)j0 * a.H + h) * a.dv + col, dv[nt][0], dv[nt][1]);
            if (j1 < a.T) out2<OutT, ACC>(dvo + ((int64_t)j1 * a.H + h) * a.dv + col, dv[nt][2], dv[nt][3]);
        }
    }
}

/* ---------------------------------------------------------------- host side */
static size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

static int attn_check(const k3c_attention_sizes *s, const char *op, k3c_err *err) {
    if (!s || s->T < 0 || s->T > (1 << 30) || s->H <= 0 || s->dqk <= 0 || s->dv <= 0 || !isfinite(s->scale))
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (T >= 0, H, dqk, dv > 0, scale finite)", op);
    if (s->dqk % 8 || s->dv % 8 || s->dqk > 192 || s->dv > 128)
        return k3c_errf(err, K3C_EUNSUPPORTED, "%s: dqk %lld, dv %lld (multiples of 8, at most 192 and 128)", op,
                        (long long)s->dqk, (long long)s->dv);
    return K3C_OK;
}

static attn_args make_args(const k3c_attention_sizes *s, const int32_t *cu) {
    attn_args a = {};
    a.cu = cu, a.T = (int)s->T, a.H = (int)s->H, a.N = cu ? (int)s->n_docs : 1, a.dqk = (int)s->dqk, a.dv = (int)s->dv;
    a.scale = (float)s->scale, a.scale_log2 = (float)(s->scale * 1.4426950408889634);
    return a;
}

enum { KIND_FWD, KIND_DQ, KIND_DKV };

template <int DQK, int DV, int KIND, typename OutT, bool ACC> static int launch_dims(const attn_args &a, k3c_err *err) {
    const dim3 grid((unsigned)((a.T + 63) / 64), (unsigned)a.H);
    if constexpr (KIND == KIND_FWD) {
        const int bytes = fwd_layout<DQK, DV>::BYTES;
        K3C_CU(
            cudaFuncSetAttribute(attn_fwd_kernel<DQK, DV, OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        attn_fwd_kernel<DQK, DV, OutT><<<grid, 128, bytes, K3C_STREAM>>>(a);
    } else if constexpr (KIND == KIND_DQ) {
        const int bytes = dq_layout<DQK, DV>::BYTES;
        K3C_CU(cudaFuncSetAttribute(attn_bwd_dq_kernel<DQK, DV, OutT, ACC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    bytes));
        attn_bwd_dq_kernel<DQK, DV, OutT, ACC><<<grid, 128, bytes, K3C_STREAM>>>(a);
    } else {
        const int bytes = dkv_layout<DQK, DV>::BYTES;
        K3C_CU(cudaFuncSetAttribute(attn_bwd_dkv_kernel<DQK, DV, OutT, ACC>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        attn_bwd_dkv_kernel<DQK, DV, OutT, ACC><<<grid, 128, bytes, K3C_STREAM>>>(a);
    }
    K3C_CU_LAUNCHED("attention");
    return K3C_OK;
}

/* Padded head dims: the smallest instantiated (dqk, dv) pair that holds the real ones (extra columns zero-filled):
 * (32, 32) and (64, 32) for the tiny test models, (128, 128) and (192, 128) for MLA. */
template <int KIND, typename OutT, bool ACC> static int launch(const attn_args &a, k3c_err *err) {
    if (a.dqk <= 32 && a.dv <= 32) return launch_dims<32, 32, KIND, OutT, ACC>(a, err);
    if (a.dqk <= 64 && a.dv <= 32) return launch_dims<64, 32, KIND, OutT, ACC>(a, err);
    if (a.dqk <= 128) return launch_dims<128, 128, KIND, OutT, ACC>(a, err);
    return launch_dims<192, 128, KIND, OutT, ACC>(a, err);
}

} // namespace K3C_ELEM_NS
} // namespace k3c_cu

using namespace k3c_cu;
using namespace k3c_cu::K3C_ELEM_NS;

#if !K3C_CU_F16 /* the workspace and the bf16 entries exist once */
extern "C" size_t k3c_attention_fwd_workspace_cuda(const k3c_attention_sizes *s) {
    const size_t tq = (size_t)s->T * s->H * s->dqk, tv = (size_t)s->T * s->H * s->dv;
    return 2 * al256(tq * 2) + al256(tv * 2);
}
extern "C" size_t k3c_attention_workspace_cuda(const k3c_attention_sizes *s) {
    const size_t tq = (size_t)s->T * s->H * s->dqk, tv = (size_t)s->T * s->H * s->dv;
    return 2 * al256(tq * 2) + 2 * al256(tv * 2) + al256((size_t)s->T * s->H * 4) + 256; /* + the fp16 grad scale */
}

extern "C" int k3c_attention_fwd_bf16_cuda(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const uint16_t *q,
                                           const uint16_t *k, const uint16_t *v, uint16_t *o, float *lse, void *ws,
                                           k3c_err *err) {
    int rc = attn_check(s, "attention_fwd_bf16_cuda", err);
    if (rc || s->T == 0) return rc;
    attn_args a = make_args(s, cu_seqlens);
    a.q = (const elem *)q, a.k = (const elem *)k, a.v = (const elem *)v, a.o = o, a.lse = lse;
    return launch<KIND_FWD, elem, false>(a, err);
}

#endif

extern "C" int K3C_KENTRY(k3c_attention_fwd)(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const float *q,
                                             const float *k, const float *v, float *o, float *lse, void *ws,
                                             k3c_err *err) {
    int rc = attn_check(s, "attention_fwd_cuda", err);
    if (rc || s->T == 0) return rc;
    const size_t tq = (size_t)s->T * s->H * s->dqk, tv = (size_t)s->T * s->H * s->dv;
    unsigned char *w = (unsigned char *)ws;
    elem *qb = (elem *)w, *kb = (elem *)(w + al256(tq * 2)), *vb = (elem *)(w + 2 * al256(tq * 2));
    if ((rc = f32_to_elem(q, qb, tq, err)) || (rc = f32_to_elem(k, kb, tq, err)) || (rc = f32_to_elem(v, vb, tv, err)))
        return rc;
    attn_args a = make_args(s, cu_seqlens);
    a.q = qb, a.k = kb, a.v = vb, a.o = o, a.lse = lse;
    return launch<KIND_FWD, float, false>(a, err);
}

template <typename InT> static int run_d(const InT *o, const InT *dout, float *D, int64_t rows, int dv, k3c_err *err) {
    attn_bwd_d_kernel<InT><<<(unsigned)((rows + 7) / 8), 256, 0, K3C_STREAM>>>(o, dout, D, rows, dv);
    K3C_CU_LAUNCHED("attention_d");
    return K3C_OK;
}

#if !K3C_CU_F16
extern "C" int k3c_attention_bwd_bf16_cuda(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const uint16_t *q,
                                           const uint16_t *k, const uint16_t *v, const uint16_t *o, const float *lse,
                                           const uint16_t *dout, uint16_t *dq, uint16_t *dk, uint16_t *dv, void *ws,
                                           k3c_err *err) {
    int rc = attn_check(s, "attention_bwd_bf16_cuda", err);
    if (rc || s->T == 0) return rc;
    const size_t tq = (size_t)s->T * s->H * s->dqk, tv = (size_t)s->T * s->H * s->dv;
    float *D = (float *)((unsigned char *)ws + 2 * al256(tq * 2) + 2 * al256(tv * 2));
    if ((rc = run_d<elem>((const elem *)o, (const elem *)dout, D, s->T * s->H, (int)s->dv, err))) return rc;
    attn_args a = make_args(s, cu_seqlens);
    a.q = (const elem *)q, a.k = (const elem *)k, a.v = (const elem *)v, a.dout = (const elem *)dout;
    a.lse_in = lse, a.D = D, a.dq = dq, a.dk = dk, a.dvo = dv;
    if (dq && (rc = launch<KIND_DQ, elem, false>(a, err))) return rc;
    if (dk && dv) return launch<KIND_DKV, elem, false>(a, err);
    if (dk || dv) return k3c_errf(err, K3C_EINVAL, "attention_bwd_bf16_cuda: dk and dv are produced together");
    return K3C_OK;
}

#endif

extern "C" int K3C_KENTRY(k3c_attention_bwd)(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const float *q,
                                             const float *k, const float *v, const float *o, const float *lse,
                                             const float *dout, float *dq, float *dk, float *dv, void *ws,
                                             k3c_err *err) {
    int rc = attn_check(s, "attention_bwd_cuda", err);
    if (rc || s->T == 0) return rc;
    const size_t tq = (size_t)s->T * s->H * s->dqk, tv = (size_t)s->T * s->H * s->dv;
    unsigned char *w = (unsigned char *)ws;
    elem *qb = (elem *)w, *kb = (elem *)(w + al256(tq * 2)), *vb = (elem *)(w + 2 * al256(tq * 2));
    elem *dob = (elem *)(w + 2 * al256(tq * 2) + al256(tv * 2));
    float *D = (float *)(w + 2 * al256(tq * 2) + 2 * al256(tv * 2));
    if (!dk != !dv) /* checked before anything is written */
        return k3c_errf(err, K3C_EINVAL, "attention_bwd_cuda: dk and dv are produced together (give both or neither)");
    if ((rc = f32_to_elem(q, qb, tq, err)) || (rc = f32_to_elem(k, kb, tq, err)) ||
        (rc = f32_to_elem(v, vb, tv, err)) || (rc = run_d<float>(o, dout, D, s->T * s->H, (int)s->dv, err)))
        return rc;
#if K3C_CU_F16
    /* gradient scaling as in the fp16 KDA backward: dout (and so D and dS) scaled by a power of two into fp16's
     * normal range, the gradient buffers scaled by it before the kernels add into them and unscaled after */
    const size_t tl = (size_t)s->T * s->H;
    float *gs = (float *)(w + 2 * al256(tq * 2) + 2 * al256(tv * 2) + al256(tl * 4));
    if ((rc = k3c_cuda_pow2_scale(dout, tv, nullptr, 0, gs, err)) ||
        (rc = k3c_cuda_f32_to_f16_scaled(dout, (uint16_t *)dob, tv, gs, err)) ||
        (rc = k3c_cuda_scale(D, tl, gs, err)) || (rc = k3c_cuda_scale(dq, tq, gs, err)) ||
        (rc = k3c_cuda_scale(dk, tq, gs, err)) || (rc = k3c_cuda_scale(dv, tv, gs, err)))
        return rc;
#else
    if ((rc = f32_to_elem(dout, dob, tv, err))) return rc;
#endif
    attn_args a = make_args(s, cu_seqlens);
    a.q = qb, a.k = kb, a.v = vb, a.dout = dob, a.lse_in = lse, a.D = D, a.dq = dq, a.dk = dk, a.dvo = dv;
    if (dq && (rc = launch<KIND_DQ, float, true>(a, err))) return rc;
    if (dk && (rc = launch<KIND_DKV, float, true>(a, err))) return rc;
#if K3C_CU_F16
    if ((rc = k3c_cuda_scale(dq, tq, gs + 1, err)) || (rc = k3c_cuda_scale(dk, tq, gs + 1, err)) ||
        (rc = k3c_cuda_scale(dv, tv, gs + 1, err)))
        return rc;
#endif
    return K3C_OK;
}
