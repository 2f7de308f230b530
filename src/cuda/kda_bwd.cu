/* kda_bwd.cu — chunked KDA backward: forward recompute (kda_fwd.cu kernels, keeping T, Ṽ and the entering states), a
 * reverse state pass per (document, head, dv block) for dṼ and the state gradients, and a per-(chunk, head) kernel for
 * dq, dk, dv, dg, dβ (WY / inverse backward, intra-chunk pairwise terms, reverse cumsum of dG). docs/MODEL.md §3.4. */
#include "cuda/kda_internal.cuh"

namespace k3c_cu {
namespace K3C_ELEM_NS {

/* ---------------------------------------------------------------- reverse state pass
 * dS (gradient of the state leaving the current chunk) lives in fp32 accumulators as in the forward. Per chunk, last to
 * first: dh[c] = dS; dṼ = Aᵀ·dO + Kg·dS; dS ← Γ_C ⊙ dS + Qgᵀ·dO − Wᵀ·dṼ (§3.4 stage 2). */
struct rstate_args {
    const elem *w, *qg, *kg, *A, *dout;
    const float *gamma, *dht, *dscale; /* dscale: multiplies dht (fp16 gradient scaling), NULL = 1 */
    const int32_t *cu;
    const int *coff;
    int T, H, DV;
    float *dh0;
    elem *dh, *dvn;
};

template <int DK, int BV> struct rstate_layout {
    static constexpr int LDK = DK + 8, LDV = BV + 8, LDA = KDA_C + 8;
    static constexpr int W = 0, Q = W + 64 * LDK * 2, K = Q + 64 * LDK * 2, DO = K + 64 * LDK * 2,
                         A = DO + 64 * LDV * 2, GAM = A + 64 * LDA * 2, STAGE = GAM + DK * 4;
    static constexpr int SB = 2 * STAGE, VN = SB + DK * LDV * 2, BYTES = VN + 64 * LDV * 2;
};

template <int DK, int BV> __global__ void __launch_bounds__(256, 1) kda_rstate_kernel(rstate_args a) {
    using Ly = rstate_layout<DK, BV>;
    constexpr int LDK = Ly::LDK, LDV = Ly::LDV, LDA = Ly::LDA;
    /* 8 warps as in the forward state pass: wq = row quarter / m-tiles wq, wq+4, ..; wc = 16-column half */
    constexpr int MTT = DK / 16, MTW = (MTT + 3) / 4, NT = 2;
    static_assert(BV == 32, "reverse state pass: two 16-column halves");
    extern __shared__ __align__(16) unsigned char smem[];
    elem *Sb = (elem *)(smem + Ly::SB), *Vn = (elem *)(smem + Ly::VN);
    const int vb = blockIdx.x, h = blockIdx.y, n = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
    const int wq = warp & 3, cofs = 16 * (warp >> 2);
    const int bos = a.cu ? a.cu[n] : 0, eos = a.cu ? a.cu[n + 1] : a.T;
    const int c0 = a.coff[n], nc = a.coff[n + 1] - c0;
    const int64_t rs = a.H, vcol = (int64_t)vb * BV;
    const int64_t sbase = (((int64_t)n * a.H + h) * DK) * a.DV + vcol;
    const float dscale = a.dscale ? *a.dscale : 1.f;

    float S[MTW][NT][4];
#pragma unroll
    for (int i = 0; i < MTW; i++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int mt = wq + 4 * i, row = 16 * mt + g8 + (e >= 2 ? 8 : 0),
                          col = cofs + 8 * nt + 2 * t4 + (e & 1);
                S[i][nt][e] = (a.dht && mt < MTT) ? a.dht[sbase + (int64_t)row * a.DV + col] * dscale : 0.f;
            }

    auto prefetch = [&](int cc, int stage) {
        unsigned char *st = smem + stage * Ly::STAGE;
        const int t0 = bos + cc * KDA_C, len = min(KDA_C, eos - t0);
        const int64_t r0 = (int64_t)t0 * rs + h;
        tile_load_async((elem *)(st + Ly::W), LDK, a.w + r0 * DK, rs * DK, 64, DK, len, DK, tid, 256);
        tile_load_async((elem *)(st + Ly::Q), LDK, a.qg + r0 * DK, rs * DK, 64, DK, len, DK, tid, 256);
        tile_load_async((elem *)(st + Ly::K), LDK, a.kg + r0 * DK, rs * DK, 64, DK, len, DK, tid, 256);
        tile_load_async((elem *)(st + Ly::DO), LDV, a.dout + r0 * a.DV + vcol, rs * a.DV, 64, BV, len, BV, tid, 256);
        tile_load_async((elem *)(st + Ly::A), LDA, a.A + r0 * KDA_C, rs * KDA_C, 64, KDA_C, len, KDA_C, tid, 256);
        const float *gsrc = a.gamma + ((int64_t)(c0 + cc) * a.H + h) * DK;
        for (int i = tid; i < DK / 4; i += 256) cp_async16(st + Ly::GAM + 16 * i, gsrc + 4 * i, 16);
    };

    if (nc > 0) {
        prefetch(nc - 1, (nc - 1) & 1);
        cp_async_commit();
    }
    for (int cc = nc - 1; cc >= 0; cc--) {
        if (cc > 0) {
            prefetch(cc - 1, (cc - 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        unsigned char *st = smem + (cc & 1) * Ly::STAGE;
        const elem *Ws = (const elem *)(st + Ly::W), *Qs = (const elem *)(st + Ly::Q), *Ks = (const elem *)(st + Ly::K);
        const elem *dOs = (const elem *)(st + Ly::DO), *As = (const elem *)(st + Ly::A);
        const float *gam = (const float *)(st + Ly::GAM);
        const int t0 = bos + cc * KDA_C, len = min(KDA_C, eos - t0);

#pragma unroll
        for (int i = 0; i < MTW; i++) {
            const int mt = wq + 4 * i;
            if (mt >= MTT) continue;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int row = 16 * mt + g8, col = cofs + 8 * nt + 2 * t4;
                *reinterpret_cast<uint32_t *>(Sb + row * LDV + col) = pack_e(S[i][nt][0], S[i][nt][1]);
                *reinterpret_cast<uint32_t *>(Sb + (row + 8) * LDV + col) = pack_e(S[i][nt][2], S[i][nt][3]);
            }
        }
        __syncthreads();
        {
            elem *dst = a.dh + ((int64_t)(c0 + cc) * a.H + h) * DK * a.DV + vcol;
            for (int e = tid; e < DK * (BV / 8); e += 256) {
                const int r = e / (BV / 8), c8 = (e % (BV / 8)) * 8;
                *reinterpret_cast<uint4 *>(dst + (int64_t)r * a.DV + c8) =
                    *reinterpret_cast<const uint4 *>(Sb + r * LDV + c8);
            }
        }

        /* dṼ rows 16wq ..: Aᵀ·dO (A causal: only i-blocks from the warp's own) + Kg·dS */
        float dv[NT][4] = {};
        for (int k0 = 16 * wq; k0 < KDA_C; k0 += 16) {
            uint32_t aa[4], b[4];
            lda_trans(aa, As, LDA, 16 * wq, k0, lane);
            ldb_kmajor(b, dOs, LDV, cofs, k0, lane);
            mma16816(dv[0], aa, b[0], b[1]);
            mma16816(dv[1], aa, b[2], b[3]);
        }
#pragma unroll
        for (int k0 = 0; k0 < DK; k0 += 16) {
            uint32_t ak[4], b[4];
            lda_rowmajor(ak, Ks, LDK, 16 * wq, k0, lane);
            ldb_kmajor(b, Sb, LDV, cofs, k0, lane);
            mma16816(dv[0], ak, b[0], b[1]);
            mma16816(dv[1], ak, b[2], b[3]);
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int row = 16 * wq + g8 + 8 * hf, col = cofs + 8 * nt + 2 * t4;
                const uint32_t pk = pack_e(dv[nt][2 * hf], dv[nt][2 * hf + 1]);
                *reinterpret_cast<uint32_t *>(Vn + row * LDV + col) = pk;
                if (row < len)
                    *reinterpret_cast<uint32_t *>(a.dvn + ((int64_t)(t0 + row) * rs + h) * a.DV + vcol + col) = pk;
            }
        __syncthreads();

        /* dS ← Γ_C ⊙ dS + Qgᵀ·dO − Wᵀ·dṼ */
#pragma unroll
        for (int i = 0; i < MTW; i++) {
            const int mt = wq + 4 * i;
            if (mt >= MTT) continue;
            const float ga = gam[16 * mt + g8], gb = gam[16 * mt + g8 + 8];
            float neg[NT][4] = {};
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                S[i][nt][0] *= ga, S[i][nt][1] *= ga, S[i][nt][2] *= gb, S[i][nt][3] *= gb;
            }
#pragma unroll
            for (int k0 = 0; k0 < KDA_C; k0 += 16) {
                uint32_t aq[4], aw[4], b[4], c[4];
                lda_trans(aq, Qs, LDK, 16 * mt, k0, lane);
                lda_trans(aw, Ws, LDK, 16 * mt, k0, lane);
                ldb_kmajor(b, dOs, LDV, cofs, k0, lane);
                ldb_kmajor(c, Vn, LDV, cofs, k0, lane);
                mma16816(S[i][0], aq, b[0], b[1]);
                mma16816(S[i][1], aq, b[2], b[3]);
                mma16816(neg[0], aw, c[0], c[1]);
                mma16816(neg[1], aw, c[2], c[3]);
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) S[i][nt][e] -= neg[nt][e];
        }
        __syncthreads();
    }
    if (a.dh0)
#pragma unroll
        for (int i = 0; i < MTW; i++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int mt = wq + 4 * i, row = 16 * mt + g8 + (e >= 2 ? 8 : 0),
                              col = cofs + 8 * nt + 2 * t4 + (e & 1);
                    if (mt < MTT) a.dh0[sbase + (int64_t)row * a.DV + col] += S[i][nt][e];
                }
}

/* ---------------------------------------------------------------- per-chunk gradients
 * 256 threads per (chunk, head). Phase A (tensor cores, over 32-column dv slabs): warps 0–3 accumulate dA = dO·Ṽᵀ,
 * P1 = dṼ·Yᵀ (Y = β⊙V) and dW = −dṼ·hᵀ; warps 4–7 accumulate dQs = dO·hᵀ, dKs = Ṽ·dhᵀ and emit dv = β ⊙ Tᵀ·dṼ.
 * Then dT = P1 + dW·Xᵀ and dX = Tᵀ·dW on tensor cores, dL = −Tᵀ·dT·Tᵀ in fp32 on CUDA cores, the pairwise intra-chunk
 * terms (tensor cores off the diagonal, elementwise on it), and dG reverse-cumsummed into dg (§3.4 stages 3–5).
 * Each block owns its chunk's rows of every gradient, so it adds into them without atomics. */
struct cbwd_args {
    const elem *q, *k, *v, *dout, *vnew, *dvn, *hs, *dh;
    const float *g, *beta, *Tinv;
    const int32_t *cu;
    const int *coff;
    int T, H, N, DV;
    float scale;
    float *dq, *dk, *dv, *dg, *dbeta;
};

template <int DK> struct cbwd_layout {
    static constexpr int LDK = DK + 8, LDG = DK + 8, LDD = DK + 4, LDL = 65, LDT = KDA_C + 8, LDS = 40;
    static constexpr int G = 0, DG = G + 64 * LDG * 4, Q = DG + 64 * LDD * 4, K = Q + 64 * LDK * 2,
                         TF = K + 64 * LDK * 2, TB = TF + 64 * LDL * 4, SM = TB + 64 * LDT * 2;
    /* small vectors: β, dβ, then per-warp partial slots so that every sum is taken in a fixed order (no float
     * atomics: their commit order varies run to run). DBSP: dβ of the diagonal tiles, DK/32 slots of 64 (one per
     * 32-channel warp of a row block); CSUM: Σ_rows k⊙dKs, 4 slots of DK (one per warp 4–7); HDH: rowsum(h⊙dh),
     * 256/DK slots of DK (one per thread). Slots are summed slot 0 first at the end of the kernel. */
    static constexpr int BS = SM, DBS = BS + 64 * 4, DBSP = DBS + 64 * 4, CSUM = DBSP + (DK / 32) * 64 * 4,
                         HDH = CSUM + 4 * DK * 4, R1 = HDH + 256 * 4;
    /* R1: the slab tiles of phase A, then DA and DT (fp32 C×C) */
    static constexpr int SLAB = 4 * 64 * LDS * 2 + 2 * DK * LDS * 2, CC = 2 * 64 * LDL * 4;
    static constexpr int R2 = R1 + (SLAB > CC ? SLAB : CC);
    /* R2: dW and X in elem (C×dk each), then M1 = Tᵀ·dT (fp32 C×C) */
    static constexpr int R2B = 2 * 64 * LDK * 2 > 64 * LDL * 4 ? 2 * 64 * LDK * 2 : 64 * LDL * 4;
    static constexpr int BYTES = R2 + R2B;
};

__device__ __forceinline__ float bf(const elem x) { return from_e(x); }
/* The gradients are added into global memory as reductions (RED: the thread does not wait for the old value), not as
 * load–add–store, which stalled each thread on one memory round trip per add. Every address still has its adders in
 * a fixed order (one thread in program order, or threads separated by a barrier), so the sums are the same float
 * additions in the same order as before (float atomics flush subnormal values, below 1.2e-38, to zero). */
__device__ __forceinline__ void red2(float *p, float x, float y) {
    atomicAdd(reinterpret_cast<float2 *>(p), make_float2(x, y));
}

template <int DK> __global__ void __launch_bounds__(256, 1) kda_chunk_bwd_kernel(cbwd_args a) {
    using Ly = cbwd_layout<DK>;
    constexpr int LDK = Ly::LDK, LDG = Ly::LDG, LDD = Ly::LDD, LDL = Ly::LDL, LDT = Ly::LDT, LDS = Ly::LDS;
    constexpr int NTK = DK / 8, P = 256 / DK;
    extern __shared__ __align__(16) unsigned char smem[];
    float *Gs = (float *)(smem + Ly::G), *dGs = (float *)(smem + Ly::DG), *Tf = (float *)(smem + Ly::TF);
    elem *Qs = (elem *)(smem + Ly::Q), *Ks = (elem *)(smem + Ly::K), *Tb = (elem *)(smem + Ly::TB);
    float *bs = (float *)(smem + Ly::BS), *dbs = (float *)(smem + Ly::DBS), *csum = (float *)(smem + Ly::CSUM),
          *hdh = (float *)(smem + Ly::HDH), *dbsp = (float *)(smem + Ly::DBSP);
    elem *dOs = (elem *)(smem + Ly::R1), *Vts = dOs + 64 * LDS, *dVts = Vts + 64 * LDS, *Ys = dVts + 64 * LDS;
    elem *hsS = Ys + 64 * LDS, *dhS = hsS + DK * LDS;
    float *DA = (float *)(smem + Ly::R1), *DT = DA + 64 * LDL;
    elem *dWb = (elem *)(smem + Ly::R2), *Xb = dWb + 64 * LDK;
    float *M1 = (float *)(smem + Ly::R2);

    const int c = blockIdx.x, h = blockIdx.y;
    if (c >= a.coff[a.N]) return;
    const chunk_loc L = locate_chunk(a.coff, a.cu, a.N, a.T, c, KDA_C);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
    const int64_t row0 = (int64_t)L.t0 * a.H + h, rs = a.H;
    const int64_t hbase = ((int64_t)c * a.H + h) * DK * a.DV;

    /* ---- phase 0: q, k, G (cumsum, log2 units), β, T */
    tile_load_async(Qs, LDK, a.q + row0 * DK, rs * DK, 64, DK, L.len, DK, tid, 256);
    tile_load_async(Ks, LDK, a.k + row0 * DK, rs * DK, 64, DK, L.len, DK, tid, 256);
    cp_async_commit();
    for (int e = tid; e < 64 * (DK / 4); e += 256) {
        const int r = e / (DK / 4), c4 = (e % (DK / 4)) * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < L.len) v = *reinterpret_cast<const float4 *>(a.g + (row0 + r * rs) * DK + c4);
        *reinterpret_cast<float4 *>(Gs + r * LDG + c4) = v;
        *reinterpret_cast<float4 *>(dGs + r * LDD + c4) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (int e = tid; e < 64 * 64; e += 256) {
        const int r = e >> 6, cc = e & 63;
        const float t = r < L.len ? a.Tinv[(row0 + r * rs) * KDA_C + cc] : 0.f;
        Tf[r * LDL + cc] = t;
        Tb[r * LDT + cc] = to_e(t);
    }
    if (tid < 64) bs[tid] = tid < L.len ? a.beta[row0 + tid * rs] : 0.f, dbs[tid] = 0.f;
    /* csum, hdh, dbsp need no zeroing: every slot is stored exactly once before the final sums */
    __syncthreads();
    for (int col = tid; col < DK; col += 256) {
        float s = 0.f;
        for (int r = 0; r < 64; r++) {
            s += Gs[r * LDG + col] * LOG2E;
            Gs[r * LDG + col] = s;
        }
    }

    /* ---- phase A: products over dv, 32 columns at a time */
    const bool wa = warp < 4;
    const int wr = warp & 3, r0w = 16 * wr;
    float acc1[8][4] = {}, acc2[8][4] = {};     /* warps 0–3: dA, P1 */
    float acc3[NTK][4] = {}, acc4[NTK][4] = {}; /* warps 0–3: dW (negated later); warps 4–7: dQs, dKs */
    float dbv0 = 0.f, dbv1 = 0.f;               /* warps 4–7: Σ dY ⊙ V for rows r0w + g8 (+8) */
    float hdh_part = 0.f;
    for (int v0 = 0; v0 < a.DV; v0 += 32) {
        __syncthreads();
        tile_load_async(dOs, LDS, a.dout + row0 * a.DV + v0, rs * a.DV, 64, 32, L.len, 32, tid, 256);
        tile_load_async(Vts, LDS, a.vnew + row0 * a.DV + v0, rs * a.DV, 64, 32, L.len, 32, tid, 256);
        tile_load_async(dVts, LDS, a.dvn + row0 * a.DV + v0, rs * a.DV, 64, 32, L.len, 32, tid, 256);
        tile_load_async(hsS, LDS, a.hs + hbase + v0, a.DV, DK, 32, DK, 32, tid, 256);
        tile_load_async(dhS, LDS, a.dh + hbase + v0, a.DV, DK, 32, DK, 32, tid, 256);
        cp_async_commit();
        for (int e = tid; e < 64 * 4; e += 256) {
            const int r = e >> 2, c8 = (e & 3) * 8;
            uint4 vv = make_uint4(0u, 0u, 0u, 0u);
            if (r < L.len) {
                vv = *reinterpret_cast<const uint4 *>(a.v + (row0 + r * rs) * a.DV + v0 + c8);
                uint32_t *vw = reinterpret_cast<uint32_t *>(&vv);
#pragma unroll
                for (int p = 0; p < 4; p++) {
                    float2 f = unpack_e(vw[p]);
                    vw[p] = pack_e(bs[r] * f.x, bs[r] * f.y);
                }
            }
            *reinterpret_cast<uint4 *>(Ys + r * LDS + c8) = vv;
        }
        cp_async_wait<0>();
        __syncthreads();
        { /* rowsum(h ⊙ dh): P threads per row d, 32/P columns each */
            const int d = tid % DK, part = tid / DK;
            for (int j = part * (32 / P); j < (part + 1) * (32 / P); j++)
                hdh_part += bf(hsS[d * LDS + j]) * bf(dhS[d * LDS + j]);
        }
#pragma unroll
        for (int k0 = 0; k0 < 32; k0 += 16) {
            uint32_t aA[4], aB[4];
            if (wa) {
                lda_rowmajor(aA, dOs, LDS, r0w, k0, lane);  /* dO */
                lda_rowmajor(aB, dVts, LDS, r0w, k0, lane); /* dṼ */
#pragma unroll
                for (int n0 = 0; n0 < 64; n0 += 16) {
                    uint32_t b[4], y[4];
                    ldb_nmajor(b, Vts, LDS, n0, k0, lane);
                    ldb_nmajor(y, Ys, LDS, n0, k0, lane);
                    mma16816(acc1[n0 / 8], aA, b[0], b[1]);
                    mma16816(acc1[n0 / 8 + 1], aA, b[2], b[3]);
                    mma16816(acc2[n0 / 8], aB, y[0], y[1]);
                    mma16816(acc2[n0 / 8 + 1], aB, y[2], y[3]);
                }
#pragma unroll
                for (int n0 = 0; n0 < DK; n0 += 16) {
                    uint32_t b[4];
                    ldb_nmajor(b, hsS, LDS, n0, k0, lane);
                    mma16816(acc3[n0 / 8], aB, b[0], b[1]);
                    mma16816(acc3[n0 / 8 + 1], aB, b[2], b[3]);
                }
            } else {
                lda_rowmajor(aA, dOs, LDS, r0w, k0, lane); /* dO */
                lda_rowmajor(aB, Vts, LDS, r0w, k0, lane); /* Ṽ */
#pragma unroll
                for (int n0 = 0; n0 < DK; n0 += 16) {
                    uint32_t b[4], e[4];
                    ldb_nmajor(b, hsS, LDS, n0, k0, lane);
                    ldb_nmajor(e, dhS, LDS, n0, k0, lane);
                    mma16816(acc3[n0 / 8], aA, b[0], b[1]);
                    mma16816(acc3[n0 / 8 + 1], aA, b[2], b[3]);
                    mma16816(acc4[n0 / 8], aB, e[0], e[1]);
                    mma16816(acc4[n0 / 8 + 1], aB, e[2], e[3]);
                }
            }
        }
        if (!wa) { /* dY = Tᵀ·dṼ for rows r0w ..; dv = β ⊙ dY; dβ += Σ dY ⊙ V */
            float dy[4][4] = {};
            for (int k0 = r0w; k0 < KDA_C; k0 += 16) {
                uint32_t at[4];
                lda_trans(at, Tb, LDT, r0w, k0, lane);
#pragma unroll
                for (int n0 = 0; n0 < 32; n0 += 16) {
                    uint32_t b[4];
                    ldb_kmajor(b, dVts, LDS, n0, k0, lane);
                    mma16816(dy[n0 / 8], at, b[0], b[1]);
                    mma16816(dy[n0 / 8 + 1], at, b[2], b[3]);
                }
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int row = r0w + g8 + 8 * hf, col = v0 + nt * 8 + 2 * t4;
                    if (row >= L.len) continue;
                    const int64_t off = (row0 + row * rs) * a.DV + col;
                    const float y0 = dy[nt][2 * hf], y1 = dy[nt][2 * hf + 1];
                    const float2 vv = unpack_e(*reinterpret_cast<const uint32_t *>(a.v + off));
                    red2(a.dv + off, bs[row] * y0, bs[row] * y1);
                    (hf ? dbv1 : dbv0) += y0 * vv.x + y1 * vv.y;
                }
        }
    }
    __syncthreads();     /* R1 slab tiles dead */
    hdh[tid] = hdh_part; /* slot tid / DK of channel tid % DK */

    /* ---- phase B: X = β⊙K⊙Γ and dW in elem (for the tensor cores), dA parked in fp32; the state terms of dq, dk, dG */
    for (int e = tid; e < 64 * (DK / 2); e += 256) {
        const int r = e / (DK / 2), c2 = (e % (DK / 2)) * 2;
        const float2 kf = unpack_e(*reinterpret_cast<const uint32_t *>(Ks + r * LDK + c2));
        *reinterpret_cast<uint32_t *>(Xb + r * LDK + c2) =
            pack_e(bs[r] * kf.x * ex2(Gs[r * LDG + c2]), bs[r] * kf.y * ex2(Gs[r * LDG + c2 + 1]));
    }
    if (wa) {
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = r0w + g8 + (e >= 2 ? 8 : 0), col = nt * 8 + 2 * t4 + (e & 1);
                DA[row * LDL + col] = col <= row ? acc1[nt][e] : 0.f;
            }
#pragma unroll
        for (int nt = 0; nt < NTK; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int row = r0w + g8 + 8 * hf, col = nt * 8 + 2 * t4;
                *reinterpret_cast<uint32_t *>(dWb + row * LDK + col) = pack_e(-acc3[nt][2 * hf], -acc3[nt][2 * hf + 1]);
            }
    } else {
#pragma unroll
        for (int nt = 0; nt < NTK; nt++) {
            float cs0 = 0.f, cs1 = 0.f;
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int row = r0w + g8 + 8 * hf, col = nt * 8 + 2 * t4;
                const float *gr = Gs + row * LDG + col, *gl = Gs + 63 * LDG + col;
                const float dq0 = a.scale * acc3[nt][2 * hf] * ex2(gr[0]),
                            dq1 = a.scale * acc3[nt][2 * hf + 1] * ex2(gr[1]);
                const float dk0 = acc4[nt][2 * hf] * ex2(gl[0] - gr[0]),
                            dk1 = acc4[nt][2 * hf + 1] * ex2(gl[1] - gr[1]);
                const float q0 = bf(Qs[row * LDK + col]), q1 = bf(Qs[row * LDK + col + 1]);
                const float k0 = bf(Ks[row * LDK + col]), k1 = bf(Ks[row * LDK + col + 1]);
                dGs[row * LDD + col] += q0 * dq0 - k0 * dk0;
                dGs[row * LDD + col + 1] += q1 * dq1 - k1 * dk1;
                cs0 += k0 * dk0, cs1 += k1 * dk1;
                if (row < L.len) {
                    const int64_t off = (row0 + row * rs) * DK + col;
                    red2(a.dq + off, dq0, dq1);
                    red2(a.dk + off, dk0, dk1);
                }
            }
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) {
                cs0 += __shfl_xor_sync(0xffffffffu, cs0, o);
                cs1 += __shfl_xor_sync(0xffffffffu, cs1, o);
            }
            if (g8 == 0) csum[wr * DK + nt * 8 + 2 * t4] = cs0, csum[wr * DK + nt * 8 + 2 * t4 + 1] = cs1;
        }
        dbv0 += __shfl_xor_sync(0xffffffffu, dbv0, 1), dbv0 += __shfl_xor_sync(0xffffffffu, dbv0, 2);
        dbv1 += __shfl_xor_sync(0xffffffffu, dbv1, 1), dbv1 += __shfl_xor_sync(0xffffffffu, dbv1, 2);
        /* rows r0w + g8 (+8) belong to this warp alone: one adder per address */
        if (t4 == 0) dbs[r0w + g8] += dbv0, dbs[r0w + g8 + 8] += dbv1;
    }
    __syncthreads();

    /* ---- phase C (warps 0–3): dT = P1 + dW·Xᵀ.  phase D (warps 4–7): dX = Tᵀ·dW → dk += β Γ dX, dG += X ⊙ dX,
     * dβ += Σ_d dX ⊙ K ⊙ Γ. */
    if (wa) {
#pragma unroll
        for (int k0 = 0; k0 < DK; k0 += 16) {
            uint32_t af[4];
            lda_rowmajor(af, dWb, LDK, r0w, k0, lane);
#pragma unroll
            for (int n0 = 0; n0 < 64; n0 += 16) {
                uint32_t b[4];
                ldb_nmajor(b, Xb, LDK, n0, k0, lane);
                mma16816(acc2[n0 / 8], af, b[0], b[1]);
                mma16816(acc2[n0 / 8 + 1], af, b[2], b[3]);
            }
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = r0w + g8 + (e >= 2 ? 8 : 0), col = nt * 8 + 2 * t4 + (e & 1);
                DT[row * LDL + col] = acc2[nt][e];
            }
    } else {
#pragma unroll
        for (int nt = 0; nt < NTK; nt++) acc3[nt][0] = acc3[nt][1] = acc3[nt][2] = acc3[nt][3] = 0.f;
        for (int k0 = r0w; k0 < KDA_C; k0 += 16) { /* T[i][j] = 0 for i < j */
            uint32_t at[4];
            lda_trans(at, Tb, LDT, r0w, k0, lane);
#pragma unroll
            for (int n0 = 0; n0 < DK; n0 += 16) {
                uint32_t b[4];
                ldb_kmajor(b, dWb, LDK, n0, k0, lane);
                mma16816(acc3[n0 / 8], at, b[0], b[1]);
                mma16816(acc3[n0 / 8 + 1], at, b[2], b[3]);
            }
        }
        float db0 = 0.f, db1 = 0.f;
#pragma unroll
        for (int nt = 0; nt < NTK; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int j = r0w + g8 + 8 * hf, d = nt * 8 + 2 * t4;
                const float ga0 = ex2(Gs[j * LDG + d]), ga1 = ex2(Gs[j * LDG + d + 1]);
                const float kg0 = bf(Ks[j * LDK + d]) * ga0, kg1 = bf(Ks[j * LDK + d + 1]) * ga1;
                const float x0 = acc3[nt][2 * hf], x1 = acc3[nt][2 * hf + 1];
                (hf ? db1 : db0) += x0 * kg0 + x1 * kg1;
                dGs[j * LDD + d] += bs[j] * kg0 * x0;
                dGs[j * LDD + d + 1] += bs[j] * kg1 * x1;
                if (j < L.len) red2(a.dk + (row0 + j * rs) * DK + d, bs[j] * ga0 * x0, bs[j] * ga1 * x1);
            }
        db0 += __shfl_xor_sync(0xffffffffu, db0, 1), db0 += __shfl_xor_sync(0xffffffffu, db0, 2);
        db1 += __shfl_xor_sync(0xffffffffu, db1, 1), db1 += __shfl_xor_sync(0xffffffffu, db1, 2);
        if (t4 == 0) dbs[r0w + g8] += db0, dbs[r0w + g8 + 8] += db1; /* one adder per row, after phase B's */
    }
    __syncthreads();

    /* ---- phase E: M1 = Tᵀ·dT; phase F: dL = −M1·Tᵀ, strictly lower (into DT). TF32 tensor cores (10-bit mantissa):
     * warp w owns rows 16(w mod 4) .. and columns 32(w div 4) .. of each 64×64 product. */
    {
        const int m0 = 16 * (warp & 3), c0 = 32 * (warp >> 2);
        float acc[4][4] = {};
        for (int k0 = (m0 / 8) * 8; k0 < 64; k0 += 8) { /* T[i][j] = 0 for i < j */
            uint32_t af[4];
            af[0] = to_tf32(Tf[(k0 + t4) * LDL + m0 + g8]);
            af[1] = to_tf32(Tf[(k0 + t4) * LDL + m0 + g8 + 8]);
            af[2] = to_tf32(Tf[(k0 + t4 + 4) * LDL + m0 + g8]);
            af[3] = to_tf32(Tf[(k0 + t4 + 4) * LDL + m0 + g8 + 8]);
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int n = c0 + 8 * nt + g8;
                mma1688_tf32(acc[nt], af, to_tf32(DT[(k0 + t4) * LDL + n]), to_tf32(DT[(k0 + t4 + 4) * LDL + n]));
            }
        }
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                M1[(m0 + g8 + (e >= 2 ? 8 : 0)) * LDL + c0 + 8 * nt + 2 * t4 + (e & 1)] = acc[nt][e];
        __syncthreads();
#pragma unroll
        for (int nt = 0; nt < 4; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
        for (int k0 = 0; k0 < 64; k0 += 8) {
            uint32_t af[4];
            af[0] = to_tf32(M1[(m0 + g8) * LDL + k0 + t4]);
            af[1] = to_tf32(M1[(m0 + g8 + 8) * LDL + k0 + t4]);
            af[2] = to_tf32(M1[(m0 + g8) * LDL + k0 + t4 + 4]);
            af[3] = to_tf32(M1[(m0 + g8 + 8) * LDL + k0 + t4 + 4]);
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int n = c0 + 8 * nt + g8;
                mma1688_tf32(acc[nt], af, to_tf32(Tf[n * LDL + k0 + t4]), to_tf32(Tf[n * LDL + k0 + t4 + 4]));
            }
        }
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = m0 + g8 + (e >= 2 ? 8 : 0), col = c0 + 8 * nt + 2 * t4 + (e & 1);
                DT[row * LDL + col] = col < row ? -acc[nt][e] : 0.f; /* DT (= dT) was last read before the barrier */
            }
    }
    __syncthreads();
    const float *DL = DT;

    /* ---- phase G: intra-chunk pairwise terms (§3.4 stage 4). Off-diagonal 16×16 tiles on tensor cores, factored
     * around the first row n of the later tile (e^{G_i − G_j} = e^{G_i − G_n} e^{G_n − G_j}, both ≤ 1 for any gate):
     * warps 0–3 the row terms of row block a (dq_i += s Σ_j dA_ij k_j e, dk_i += β_i Σ_j dL_ij k_j e), warps 4–7 the
     * column terms of column block b (dk_j += Σ_i (s dA_ij q_i + β_i dL_ij k_i) e). Diagonal tiles elementwise. */
    float acc5[NTK][4] = {};
    if (wa) {
        /* off-diagonal tiles of row block a, around its first row; block 0 has none */
        if (wr > 0) {
            const float *gref = Gs + r0w * LDG;
#pragma unroll
            for (int nt = 0; nt < NTK; nt++) {
                acc3[nt][0] = acc3[nt][1] = acc3[nt][2] = acc3[nt][3] = 0.f;
                acc5[nt][0] = acc5[nt][1] = acc5[nt][2] = acc5[nt][3] = 0.f;
            }
            for (int b = 0; b < wr; b++) {
                uint32_t fa[4], fl[4];
                lda_f32(fa, DA, LDL, r0w, 16 * b, lane);
                lda_f32(fl, DL, LDL, r0w, 16 * b, lane);
                const int j = 16 * b + 2 * t4;
#pragma unroll
                for (int nt = 0; nt < NTK; nt++) {
                    const int d = nt * 8 + g8;
                    const float gr = gref[d];
                    const uint32_t b0 = pack_e(bf(Ks[j * LDK + d]) * ex2(gr - Gs[j * LDG + d]),
                                               bf(Ks[(j + 1) * LDK + d]) * ex2(gr - Gs[(j + 1) * LDG + d]));
                    const uint32_t b1 = pack_e(bf(Ks[(j + 8) * LDK + d]) * ex2(gr - Gs[(j + 8) * LDG + d]),
                                               bf(Ks[(j + 9) * LDK + d]) * ex2(gr - Gs[(j + 9) * LDG + d]));
                    mma16816(acc3[nt], fa, b0, b1);
                    mma16816(acc5[nt], fl, b0, b1);
                }
            }
            float pb0 = 0.f, pb1 = 0.f;
#pragma unroll
            for (int nt = 0; nt < NTK; nt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int i = r0w + g8 + 8 * hf, d = nt * 8 + 2 * t4;
                    const float f0 = ex2(Gs[i * LDG + d] - gref[d]), f1 = ex2(Gs[i * LDG + d + 1] - gref[d + 1]);
                    const float dq0 = a.scale * f0 * acc3[nt][2 * hf], dq1 = a.scale * f1 * acc3[nt][2 * hf + 1];
                    const float ak0 = f0 * acc5[nt][2 * hf], ak1 = f1 * acc5[nt][2 * hf + 1];
                    const float k0 = bf(Ks[i * LDK + d]), k1 = bf(Ks[i * LDK + d + 1]);
                    const float q0 = bf(Qs[i * LDK + d]), q1 = bf(Qs[i * LDK + d + 1]);
                    dGs[i * LDD + d] += q0 * dq0 + k0 * bs[i] * ak0;
                    dGs[i * LDD + d + 1] += q1 * dq1 + k1 * bs[i] * ak1;
                    (hf ? pb1 : pb0) += k0 * ak0 + k1 * ak1; /* dβ_i += Σ_j dL_ij L_ij / β_i */
                    if (i < L.len) {
                        const int64_t off = (row0 + i * rs) * DK + d;
                        red2(a.dq + off, dq0, dq1);
                        red2(a.dk + off, bs[i] * ak0, bs[i] * ak1);
                    }
                }
            pb0 += __shfl_xor_sync(0xffffffffu, pb0, 1), pb0 += __shfl_xor_sync(0xffffffffu, pb0, 2);
            pb1 += __shfl_xor_sync(0xffffffffu, pb1, 1), pb1 += __shfl_xor_sync(0xffffffffu, pb1, 2);
            if (t4 == 0) dbs[r0w + g8] += pb0, dbs[r0w + g8 + 8] += pb1; /* one adder per row */
        }
    } else {
        for (int ab = wr + 1; ab < 4; ab++) {
            const float *gref = Gs + 16 * ab * LDG;
            float t[NTK][4] = {};
            uint32_t fa[4], fl[4];
            lda_f32_trans(fa, DA, LDL, r0w, 16 * ab, lane);
            lda_f32_trans(fl, DL, LDL, r0w, 16 * ab, lane);
            const int i = 16 * ab + 2 * t4;
#pragma unroll
            for (int nt = 0; nt < NTK; nt++) {
                const int d = nt * 8 + g8;
                const float gr = gref[d];
                const float e0 = ex2(Gs[i * LDG + d] - gr), e1 = ex2(Gs[(i + 1) * LDG + d] - gr);
                const float e8 = ex2(Gs[(i + 8) * LDG + d] - gr), e9 = ex2(Gs[(i + 9) * LDG + d] - gr);
                const uint32_t q0 =
                    pack_e(a.scale * bf(Qs[i * LDK + d]) * e0, a.scale * bf(Qs[(i + 1) * LDK + d]) * e1);
                const uint32_t q1 =
                    pack_e(a.scale * bf(Qs[(i + 8) * LDK + d]) * e8, a.scale * bf(Qs[(i + 9) * LDK + d]) * e9);
                const uint32_t k0 =
                    pack_e(bs[i] * bf(Ks[i * LDK + d]) * e0, bs[i + 1] * bf(Ks[(i + 1) * LDK + d]) * e1);
                const uint32_t k1 =
                    pack_e(bs[i + 8] * bf(Ks[(i + 8) * LDK + d]) * e8, bs[i + 9] * bf(Ks[(i + 9) * LDK + d]) * e9);
                mma16816(t[nt], fa, q0, q1);
                mma16816(t[nt], fl, k0, k1);
            }
#pragma unroll
            for (int nt = 0; nt < NTK; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int j = r0w + g8 + (e >= 2 ? 8 : 0), d = nt * 8 + 2 * t4 + (e & 1);
                    acc5[nt][e] += t[nt][e] * ex2(gref[d] - Gs[j * LDG + d]);
                }
        }
    }
    __syncthreads();
    if (!wa) /* the column terms land after the row terms: both touch dk and dG of the same rows */
#pragma unroll
        for (int nt = 0; nt < NTK; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int j = r0w + g8 + 8 * hf, d = nt * 8 + 2 * t4;
                dGs[j * LDD + d] -= bf(Ks[j * LDK + d]) * acc5[nt][2 * hf];
                dGs[j * LDD + d + 1] -= bf(Ks[j * LDK + d + 1]) * acc5[nt][2 * hf + 1];
                if (j < L.len) red2(a.dk + (row0 + j * rs) * DK + d, acc5[nt][2 * hf], acc5[nt][2 * hf + 1]);
            }
    __syncthreads();
    /* diagonal tiles elementwise, thread → (channel d, block); row sums in registers, column sums in a 16-entry
     * register array. Not on tensor cores even with the bound: dg is a reverse cumsum in which each pair adds +X_ij to
     * row i and −X_ij to row j; the i = j terms must cancel exactly, which needs the same fp32 product on both sides
     * (elem operands factored around a reference round the two sides differently; measured dg error 0.9 when g ≈ −5). */
    for (int combo = tid; combo < 4 * DK; combo += 256) {
        const int d = combo % DK, j0 = 16 * (combo / DK);
        float colk[16];
#pragma unroll
        for (int jj = 0; jj < 16; jj++) colk[jj] = 0.f;
#pragma unroll
        for (int ii = 0; ii < 16; ii++) {
            const int i = j0 + ii;
            const float gi = Gs[i * LDG + d], qi = bf(Qs[i * LDK + d]), ki = bf(Ks[i * LDK + d]), bi = bs[i];
            float rq = 0.f, rk = 0.f;
#pragma unroll
            for (int jj = 0; jj <= ii; jj++) {
                const int j = j0 + jj;
                const float e = ex2(gi - Gs[j * LDG + d]), kj = bf(Ks[j * LDK + d]) * e;
                const float da = DA[i * LDL + j], dl = DL[i * LDL + j];
                rq += da * kj, rk += dl * kj;
                colk[jj] += (a.scale * da * qi + dl * bi * ki) * e;
            }
            const float dqi = a.scale * rq, dki = bi * rk;
            dGs[i * LDD + d] += qi * dqi + ki * dki;
            if (i < L.len) {
                atomicAdd(a.dq + (row0 + i * rs) * DK + d, dqi);
                atomicAdd(a.dk + (row0 + i * rs) * DK + d, dki);
            }
            float pb = ki * rk;
#pragma unroll
            for (int o = 16; o; o >>= 1) pb += __shfl_xor_sync(0xffffffffu, pb, o);
            if (lane == 0) dbsp[((combo % DK) >> 5) * 64 + i] = pb; /* DK/32 warps share row i: own slot each */
        }
#pragma unroll
        for (int jj = 0; jj < 16; jj++) {
            const int j = j0 + jj;
            dGs[j * LDD + d] -= bf(Ks[j * LDK + d]) * colk[jj];
            if (j < L.len) atomicAdd(a.dk + (row0 + j * rs) * DK + d, colk[jj]);
        }
    }
    __syncthreads();
    /* ---- last-row terms, reverse cumsum into dg, dβ */
    for (int d = tid; d < DK; d += 256) {
        float cs = csum[d], hd = hdh[d];
#pragma unroll
        for (int w = 1; w < 4; w++) cs += csum[w * DK + d];
#pragma unroll
        for (int p = 1; p < P; p++) hd += hdh[p * DK + d];
        float s = dGs[63 * LDD + d] + cs + ex2(Gs[63 * LDG + d]) * hd;
        dGs[63 * LDD + d] = s;
        s = 0.f;
        for (int i = 63; i >= 0; i--) {
            s += dGs[i * LDD + d];
            if (i < L.len) atomicAdd(a.dg + (row0 + i * rs) * DK + d, s);
        }
    }
    if (tid < L.len) {
        float db = dbs[tid];
#pragma unroll
        for (int p = 0; p < DK / 32; p++) db += dbsp[p * 64 + tid];
        a.dbeta[row0 + tid * rs] += db;
    }
}

/* ---------------------------------------------------------------- host side */
template <int DK>
static int launch_bwd_kernels(const kda_plan *p, const cbwd_args &ca, const rstate_args &ra, k3c_err *err) {
    constexpr int BV = 32;
    const int rb = rstate_layout<DK, BV>::BYTES;
    K3C_CU(cudaFuncSetAttribute(kda_rstate_kernel<DK, BV>, cudaFuncAttributeMaxDynamicSharedMemorySize, rb));
    kda_rstate_kernel<DK, BV><<<dim3(p->DV / BV, p->H, p->N), 256, rb, K3C_STREAM>>>(ra);
    K3C_CU_LAUNCHED("kda_rstate");
    const int cb = cbwd_layout<DK>::BYTES;
    K3C_CU(cudaFuncSetAttribute(kda_chunk_bwd_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, cb));
    kda_chunk_bwd_kernel<DK><<<dim3(p->NCmax, p->H), 256, cb, K3C_STREAM>>>(ca);
    K3C_CU_LAUNCHED("kda_chunk_bwd");
    return K3C_OK;
}

static int kda_bwd_run(const kda_plan *p, const elem *q, const elem *k, const elem *v, const float *g,
                       const float *beta, const float *h0, const elem *dout, const float *dht, float *dq, float *dk,
                       float *dv, float *dg, float *dbeta, float *dh0, k3c_err *err) {
    int rc = kda_run_intra(p, q, k, v, g, beta, 1, err);
    if (rc || (rc = kda_run_state(p, h0, nullptr, 0, nullptr, 1, err))) return rc;
    if (p->T == 0 && !dh0) return K3C_OK;
    rstate_args ra = {p->w,  p->qg,   p->kg, p->A, dout,  p->gamma, dht,   p->gscale,
                      p->cu, p->coff, p->T,  p->H, p->DV, dh0,      p->dh, p->dvn};
    cbwd_args ca = {q,       k,    v,    dout, p->vnew, p->dvn,   p->hs, p->dh, g,  beta, p->Tinv, p->cu,
                    p->coff, p->T, p->H, p->N, p->DV,   p->scale, dq,    dk,    dv, dg,   dbeta};
    switch (p->DK) {
    case 32: return launch_bwd_kernels<32>(p, ca, ra, err);
    case 64: return launch_bwd_kernels<64>(p, ca, ra, err);
    case 128: return launch_bwd_kernels<128>(p, ca, ra, err);
    }
    return k3c_errf(err, K3C_EUNSUPPORTED, "kda bwd: dk %d", p->DK);
}

} // namespace K3C_ELEM_NS
} // namespace k3c_cu

using namespace k3c_cu;
using namespace k3c_cu::K3C_ELEM_NS;

#if !K3C_CU_F16 /* one layout for both element types */
extern "C" size_t k3c_kda_chunk_bwd_workspace_cuda(const k3c_kda_dims *d) {
    return kda_plan_layout(d, NULL, 1, 1, NULL);
}
#endif

/* Every gradient must be given (the kernels add into all of them); dh0 only when h0 matters to the caller. */
static int check_grads(const float *dq, const float *dk, const float *dv, const float *dg, const float *dbeta,
                       const char *op, k3c_err *err) {
    if (!dq || !dk || !dv || !dg || !dbeta)
        return k3c_errf(err, K3C_EUNSUPPORTED, "%s: dq, dk, dv, dg and dbeta are all required on the GPU", op);
    return K3C_OK;
}

extern "C" int K3C_KENTRY(k3c_kda_chunk_bwd)(const k3c_kda_dims *d, const int32_t *cu_seqlens, const float *q,
                                             const float *k, const float *v, const float *g, const float *beta,
                                             const float *h0, const float *dout, const float *dht, float *dq, float *dk,
                                             float *dv, float *dg, float *dbeta, float *dh0, void *ws, k3c_err *err) {
    int rc = kda_check_dims(d, "kda_chunk_bwd_cuda", err);
    if (rc || (rc = check_grads(dq, dk, dv, dg, dbeta, "kda_chunk_bwd_cuda", err))) return rc;
    if (!dout) return k3c_errf(err, K3C_EUNSUPPORTED, "kda_chunk_bwd_cuda: dout is required on the GPU");
    kda_plan p;
    kda_plan_layout(d, ws, 1, 1, &p);
    p.cu = cu_seqlens;
    if (!cu_seqlens) p.N = 1;
    if ((rc = kda_convert_inputs(&p, q, k, v, err))) return rc;
    const size_t tv = (size_t)p.T * p.H * p.DV;
#if K3C_CU_F16
    const size_t tk = (size_t)p.T * p.H * p.DK, ns = (size_t)p.N * p.H * p.DK * p.DV;
    /* fp16 has 5 exponent bits and gradients are often ~1e-6: dout and dht are scaled by the power of two that brings
     * their largest magnitude into [1/2, 1), and every gradient buffer is multiplied by it before the kernels add into
     * it and by its inverse after (both exact in fp32), so only the fp16 rounding of the incoming gradient changes. */
    float *gi = p.gscale + 1;
    if ((rc = k3c_cuda_pow2_scale(dout, tv, dht, dht ? ns : 0, p.gscale, err)) ||
        (rc = k3c_cuda_f32_to_f16_scaled(dout, (uint16_t *)p.dob, tv, p.gscale, err)))
        return rc;
    for (int pass = 0; pass < 2; pass++) {
        const float *f = pass ? gi : p.gscale;
        if ((rc = k3c_cuda_scale(dq, tk, f, err)) || (rc = k3c_cuda_scale(dk, tk, f, err)) ||
            (rc = k3c_cuda_scale(dv, tv, f, err)) || (rc = k3c_cuda_scale(dg, tk, f, err)) ||
            (rc = k3c_cuda_scale(dbeta, (size_t)p.T * p.H, f, err)) || (rc = k3c_cuda_scale(dh0, ns, f, err)))
            return rc;
        if (!pass && (rc = kda_bwd_run(&p, p.qb, p.kb, p.vb, g, beta, h0, p.dob, dht, dq, dk, dv, dg, dbeta, dh0, err)))
            return rc;
    }
    return K3C_OK;
#else
    p.gscale = nullptr;
    if ((rc = f32_to_elem(dout, p.dob, tv, err))) return rc;
    return kda_bwd_run(&p, p.qb, p.kb, p.vb, g, beta, h0, p.dob, dht, dq, dk, dv, dg, dbeta, dh0, err);
#endif
}

#if !K3C_CU_F16
extern "C" int k3c_kda_chunk_bwd_bf16_cuda(const k3c_kda_dims *d, const int32_t *cu_seqlens, const uint16_t *q,
                                           const uint16_t *k, const uint16_t *v, const float *g, const float *beta,
                                           const float *h0, const uint16_t *dout, const float *dht, float *dq,
                                           float *dk, float *dv, float *dg, float *dbeta, float *dh0, void *ws,
                                           k3c_err *err) {
    int rc = kda_check_dims(d, "kda_chunk_bwd_bf16_cuda", err);
    if (rc || (rc = check_grads(dq, dk, dv, dg, dbeta, "kda_chunk_bwd_bf16_cuda", err))) return rc;
    kda_plan p;
    kda_plan_layout(d, ws, 1, 1, &p);
    p.gscale = nullptr;
    p.cu = cu_seqlens;
    if (!cu_seqlens) p.N = 1;
    return kda_bwd_run(&p, (const elem *)q, (const elem *)k, (const elem *)v, g, beta, h0, (const elem *)dout, dht, dq,
                       dk, dv, dg, dbeta, dh0, err);
}
#endif
