/* kda_fwd.cu — chunked KDA forward on tensor cores: per-(chunk, head) intra kernel (cumsum, L and A on 16-row
 * sub-tiles, (I+L)⁻¹, WY/UT w and u) and a per-(document, head, dv block) sequential state pass that also emits o.
 * docs/MODEL.md §3.2 (steps 1–6), §3.3 (the lower-bound gate and the 16-row sub-tiles). */
#include <stdint.h>

#include "base/carve.h"
#include "cuda/kda_internal.cuh"

namespace k3c_cu {
namespace K3C_ELEM_NS {

/* ---------------------------------------------------------------- plan */
size_t kda_plan_layout(const k3c_kda_dims *d, void *ws, int want_inputs, int want_bwd, kda_plan *p) {
    kda_plan q = {};
    q.T = (int)d->T, q.H = (int)d->H, q.DK = (int)d->dk, q.DV = (int)d->dv;
    q.N = d->n_docs > 0 ? d->n_docs : 1;
    q.NCmax = (q.T + KDA_C - 1) / KDA_C + q.N;
    q.scale = (float)(d->scale != 0 ? d->scale : 1.0 / sqrt((double)d->dk));
    /* The bounded path's diagonal tiles factor e^{±(G − G_mid)} up to e^{40} (§3.3): within bf16's range, far beyond
     * fp16's 65504, so the fp16 variant computes those tiles elementwise. */
    q.bounded = !K3C_CU_F16 && d->gate_lower_bound < 0;
    const size_t tk = (size_t)q.T * q.H * q.DK, tv = (size_t)q.T * q.H * q.DV, ta = (size_t)q.T * q.H * KDA_C;
    /* 256-byte pieces: every operand starts where the tensor-core loads and cuBLASLt expect it. ws is this plan's
     * measured size, so the cap is not checked here. */
    k3c_carver c = ws ? k3c_carver_at(ws, SIZE_MAX, 256) : k3c_carver_measure(256);
    q.coff = K3C_CARVE(&c, int, q.N + 1);
    if (want_inputs) {
        q.qb = K3C_CARVE(&c, elem, tk);
        q.kb = K3C_CARVE(&c, elem, tk);
        q.vb = K3C_CARVE(&c, elem, tv);
    }
    q.w = K3C_CARVE(&c, elem, tk);
    q.u = K3C_CARVE(&c, elem, tv);
    q.qg = K3C_CARVE(&c, elem, tk);
    q.kg = K3C_CARVE(&c, elem, tk);
    q.A = K3C_CARVE(&c, elem, ta);
    q.gamma = K3C_CARVE(&c, float, (size_t)q.NCmax *q.H *q.DK);
    if (want_bwd) {
        q.Tinv = K3C_CARVE(&c, float, ta);
        q.vnew = K3C_CARVE(&c, elem, tv);
        q.hs = K3C_CARVE(&c, elem, (size_t)q.NCmax * q.H * q.DK * q.DV);
        q.dh = K3C_CARVE(&c, elem, (size_t)q.NCmax * q.H * q.DK * q.DV);
        q.dvn = K3C_CARVE(&c, elem, tv);
        if (want_inputs) q.dob = K3C_CARVE(&c, elem, tv);
        q.gscale = K3C_CARVE(&c, float, 4);
    }
    if (p) *p = q;
    return c.off;
}

int kda_check_dims(const k3c_kda_dims *d, const char *op, k3c_err *err) {
    if (!d || d->T < 0 || d->H <= 0 || d->T > (1 << 30))
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (T >= 0, H > 0 required)", op);
    if (d->dk != 32 && d->dk != 64 && d->dk != 128)
        return k3c_errf(err, K3C_EUNSUPPORTED, "%s: dk = %lld (the CUDA chunk path has dk 32, 64 or 128)", op,
                        (long long)d->dk);
    if (d->dv <= 0 || d->dv % 32 || d->dv > 256)
        return k3c_errf(err, K3C_EUNSUPPORTED, "%s: dv = %lld (the CUDA chunk path needs a multiple of 32 up to 256)",
                        op, (long long)d->dv);
    if (d->gate_lower_bound < K3C_KDA_MIN_BOUND)
        return k3c_errf(err, K3C_EINVAL, "%s: gate_lower_bound %g below %g", op, d->gate_lower_bound,
                        K3C_KDA_MIN_BOUND);
    return K3C_OK;
}

/* ---------------------------------------------------------------- chunk offsets */
__global__ void kda_coff_kernel(const int32_t *cu, int n_docs, int T, int *coff) {
    if (threadIdx.x || blockIdx.x) return;
    int acc = 0;
    for (int i = 0; i < n_docs; i++) {
        coff[i] = acc;
        int len = cu ? cu[i + 1] - cu[i] : T;
        acc += (len + KDA_C - 1) / KDA_C;
    }
    coff[n_docs] = acc;
}

/* ---------------------------------------------------------------- intra kernel
 * One block of 128 threads per (chunk, head). Warp w owns rows 16w .. 16w+15 of every 64-row matrix. G is the
 * chunk-local cumulative sum of g in log2 units (exp2 throughout). */
struct intra_args {
    const elem *q, *k, *v;
    const float *g, *beta;
    const int32_t *cu;
    const int *coff;
    int T, H, N, DV;
    float scale;
    elem *w, *u, *qg, *kg, *A;
    float *Tinv, *gamma;
};

/* Shared memory of the intra kernel. B1: q, then T = (I+L)⁻¹ (fp32). B2: L (fp32), then β⊙K⊙Γ (elem). KS: k, then
 * β⊙V in 32-column slabs. Every region is live only between the barriers that separate the phases below. */
template <int DK> struct intra_layout {
    static constexpr int LDK = DK + 8, LDG = DK + 8, LDL = 65, LDX = 40;
    static constexpr int RB = (64 * LDK * 2 > 64 * LDL * 4) ? 64 * LDK * 2 : 64 * LDL * 4;
    static constexpr int G = 0, B1 = G + 64 * LDG * 4, B2 = B1 + RB, KS = B2 + RB, BS = KS + 64 * LDK * 2;
    static constexpr int RT = BS + 64 * 4, BYTES = RT + 3 * 256 * 4; /* RT: off-diagonal products of the inverse */
};

/* x[row][c..c+1] ⊙ 2^(sign·(G[row] − Gref)) packed to elem: one operand of a factored decay (§3.3). */
__device__ __forceinline__ uint32_t decayed(const elem *x, int ldx, const float *G, int ldg, const float *gref, int row,
                                            int c, float sign) {
    float2 v = unpack_e(*reinterpret_cast<const uint32_t *>(x + row * ldx + c));
    float2 gg = *reinterpret_cast<const float2 *>(G + row * ldg + c);
    return pack_e(v.x * ex2(sign * (gg.x - gref[c])), v.y * ex2(sign * (gg.y - gref[c + 1])));
}

template <int DK, bool BOUNDED> __global__ void __launch_bounds__(128) kda_intra_kernel(intra_args a) {
    using Ly = intra_layout<DK>;
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int LDK = Ly::LDK, LDG = Ly::LDG, LDL = Ly::LDL, LDX = Ly::LDX;
    float *Gs = (float *)(smem + Ly::G);
    elem *Qs = (elem *)(smem + Ly::B1);
    float *Ts = (float *)(smem + Ly::B1);
    float *Ls = (float *)(smem + Ly::B2);
    elem *Xk = (elem *)(smem + Ly::B2);
    elem *Ks = (elem *)(smem + Ly::KS);
    elem *Xv = (elem *)(smem + Ly::KS);
    float *bs = (float *)(smem + Ly::BS), *Rs = (float *)(smem + Ly::RT);

    const int c = blockIdx.x, h = blockIdx.y;
    if (c >= a.coff[a.N]) return;
    const chunk_loc L = locate_chunk(a.coff, a.cu, a.N, a.T, c, KDA_C);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t row0 = (int64_t)L.t0 * a.H + h; /* (token, head) row of the chunk's first token */
    const int64_t rs = a.H;                       /* (token, head) rows per token */

    /* ---- loads: q, k (elem, async, zero-filled past the chunk), g (fp32), β */
    tile_load_async(Qs, LDK, a.q + row0 * DK, rs * DK, 64, DK, L.len, DK, tid, 128);
    tile_load_async(Ks, LDK, a.k + row0 * DK, rs * DK, 64, DK, L.len, DK, tid, 128);
    cp_async_commit();
    for (int e = tid; e < 64 * (DK / 4); e += 128) {
        const int r = e / (DK / 4), c4 = (e % (DK / 4)) * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < L.len) v = *reinterpret_cast<const float4 *>(a.g + (row0 + r * rs) * DK + c4);
        *reinterpret_cast<float4 *>(Gs + r * LDG + c4) = v;
    }
    if (tid < 64) bs[tid] = tid < L.len ? a.beta[row0 + tid * rs] : 0.f;
    __syncthreads();
    /* Zero-padded rows keep G constant past the last token, so row 63 holds G_C of the real chunk end. */
    for (int col = tid; col < DK; col += 128) {
        float s = 0.f;
        for (int r = 0; r < 64; r++) {
            s += Gs[r * LDG + col] * LOG2E;
            Gs[r * LDG + col] = s;
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    /* ---- qg = s·q⊙Γ, kg = k⊙Γ_C/Γ (both factors ≤ 1), gamma = Γ_C */
    for (int e = tid; e < 64 * (DK / 8); e += 128) {
        const int r = e / (DK / 8), c8 = (e % (DK / 8)) * 8;
        if (r >= L.len) continue;
        uint4 qv = *reinterpret_cast<const uint4 *>(Qs + r * LDK + c8);
        uint4 kv = *reinterpret_cast<const uint4 *>(Ks + r * LDK + c8);
        const uint32_t *qw = reinterpret_cast<const uint32_t *>(&qv), *kw = reinterpret_cast<const uint32_t *>(&kv);
        uint4 qo, ko;
        uint32_t *qow = reinterpret_cast<uint32_t *>(&qo), *kow = reinterpret_cast<uint32_t *>(&ko);
        const float *gr = Gs + r * LDG + c8, *gl = Gs + 63 * LDG + c8;
#pragma unroll
        for (int p = 0; p < 4; p++) {
            float2 qf = unpack_e(qw[p]), kf = unpack_e(kw[p]);
            qow[p] = pack_e(a.scale * qf.x * ex2(gr[2 * p]), a.scale * qf.y * ex2(gr[2 * p + 1]));
            kow[p] = pack_e(kf.x * ex2(gl[2 * p] - gr[2 * p]), kf.y * ex2(gl[2 * p + 1] - gr[2 * p + 1]));
        }
        const int64_t off = (row0 + r * rs) * DK + c8;
        *reinterpret_cast<uint4 *>(a.qg + off) = qo;
        *reinterpret_cast<uint4 *>(a.kg + off) = ko;
    }
    for (int col = tid; col < DK; col += 128) a.gamma[((int64_t)c * a.H + h) * DK + col] = ex2(Gs[63 * LDG + col]);

    /* ---- A (to global, elem) and L (Ls, fp32) on 16×16 tiles. Off-diagonal tiles (b < a) take the first row of block
     * a as reference, so both factors are ≤ 1 for any gate; warp a (≥ 1) does them all, its left operand built once
     * per k-step. Diagonal tiles: with the bound, the midpoint reference (every exponent within 8 steps of it); without,
     * elementwise. Diagonal owners balance the work: warp 0 takes tiles 0 and 3, warps 1 and 2 their own. */
    const int rb = warp, g8 = lane >> 2, t4 = lane & 3;
    const int ri0 = rb * 16 + g8, ri1 = ri0 + 8; /* this lane's rows in the w and u products below */
    elem *Ag = a.A + row0 * KDA_C;
    /* accq/acck [pair][n-tile] → A (scaled, masked on the diagonal) and L (β_i-scaled, strictly lower) */
    auto store_tile = [&](int ta, int tb, const float(*accq)[4], const float(*acck)[4]) {
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int row = ta * 16 + g8 + 8 * hf, col = tb * 16 + nt * 8 + 2 * t4;
                float a0 = accq[nt][2 * hf] * a.scale, a1 = accq[nt][2 * hf + 1] * a.scale;
                float l0 = acck[nt][2 * hf] * bs[row], l1 = acck[nt][2 * hf + 1] * bs[row];
                if (ta == tb) {
                    if (col > row) a0 = 0.f;
                    if (col + 1 > row) a1 = 0.f;
                    if (col >= row) l0 = 0.f;
                    if (col + 1 >= row) l1 = 0.f;
                }
                Ls[row * LDL + col] = l0, Ls[row * LDL + col + 1] = l1;
                if (row < L.len) *reinterpret_cast<uint32_t *>(Ag + row * rs * KDA_C + col) = pack_e(a0, a1);
            }
    };
    if (rb >= 1) {
        const int r0 = rb * 16 + g8, r1 = r0 + 8;
        const float *gref = Gs + rb * 16 * LDG;
        float accq[3][2][4] = {}, acck[3][2][4] = {};
        for (int k0 = 0; k0 < DK; k0 += 16) {
            const int kc = k0 + 2 * t4;
            uint32_t aq[4], ak[4];
            aq[0] = decayed(Qs, LDK, Gs, LDG, gref, r0, kc, 1.f);
            aq[1] = decayed(Qs, LDK, Gs, LDG, gref, r1, kc, 1.f);
            aq[2] = decayed(Qs, LDK, Gs, LDG, gref, r0, kc + 8, 1.f);
            aq[3] = decayed(Qs, LDK, Gs, LDG, gref, r1, kc + 8, 1.f);
            ak[0] = decayed(Ks, LDK, Gs, LDG, gref, r0, kc, 1.f);
            ak[1] = decayed(Ks, LDK, Gs, LDG, gref, r1, kc, 1.f);
            ak[2] = decayed(Ks, LDK, Gs, LDG, gref, r0, kc + 8, 1.f);
            ak[3] = decayed(Ks, LDK, Gs, LDG, gref, r1, kc + 8, 1.f);
#pragma unroll
            for (int b = 0; b < 3; b++) {
                if (b >= rb) break;
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    const int j = b * 16 + nt * 8 + g8;
                    const uint32_t b0 = decayed(Ks, LDK, Gs, LDG, gref, j, kc, -1.f);
                    const uint32_t b1 = decayed(Ks, LDK, Gs, LDG, gref, j, kc + 8, -1.f);
                    mma16816(accq[b][nt], aq, b0, b1);
                    mma16816(acck[b][nt], ak, b0, b1);
                }
            }
        }
#pragma unroll
        for (int b = 0; b < 3; b++)
            if (b < rb) store_tile(rb, b, accq[b], acck[b]);
    }
    for (int dt = rb; dt < 4; dt += 3) { /* diagonal tiles owned by this warp: rb, and 3 for warp 0 */
        if (dt == 3 && rb == 3) break;
        if (BOUNDED) {
            const int r0 = dt * 16 + g8, r1 = r0 + 8;
            const float *gref = Gs + (dt * 16 + 8) * LDG;
            float accq[2][4] = {}, acck[2][4] = {};
            for (int k0 = 0; k0 < DK; k0 += 16) {
                const int kc = k0 + 2 * t4;
                uint32_t aq[4], ak[4];
                aq[0] = decayed(Qs, LDK, Gs, LDG, gref, r0, kc, 1.f);
                aq[1] = decayed(Qs, LDK, Gs, LDG, gref, r1, kc, 1.f);
                aq[2] = decayed(Qs, LDK, Gs, LDG, gref, r0, kc + 8, 1.f);
                aq[3] = decayed(Qs, LDK, Gs, LDG, gref, r1, kc + 8, 1.f);
                ak[0] = decayed(Ks, LDK, Gs, LDG, gref, r0, kc, 1.f);
                ak[1] = decayed(Ks, LDK, Gs, LDG, gref, r1, kc, 1.f);
                ak[2] = decayed(Ks, LDK, Gs, LDG, gref, r0, kc + 8, 1.f);
                ak[3] = decayed(Ks, LDK, Gs, LDG, gref, r1, kc + 8, 1.f);
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    const int j = dt * 16 + nt * 8 + g8;
                    const uint32_t b0 = decayed(Ks, LDK, Gs, LDG, gref, j, kc, -1.f);
                    const uint32_t b1 = decayed(Ks, LDK, Gs, LDG, gref, j, kc + 8, -1.f);
                    mma16816(accq[nt], aq, b0, b1);
                    mma16816(acck[nt], ak, b0, b1);
                }
            }
            store_tile(dt, dt, accq, acck);
        } else { /* elementwise: lane → row dt·16 + lane/2, columns of one parity */
            const int i = dt * 16 + (lane >> 1);
            for (int s = 0; s < 8; s++) {
                const int j = dt * 16 + (lane & 1) + 2 * s;
                float va = 0.f, vl = 0.f;
                if (j <= i) {
                    for (int d = 0; d < DK; d += 2) {
                        const float2 gi = *reinterpret_cast<const float2 *>(Gs + i * LDG + d);
                        const float2 gj = *reinterpret_cast<const float2 *>(Gs + j * LDG + d);
                        const float2 qi = unpack_e(*reinterpret_cast<const uint32_t *>(Qs + i * LDK + d));
                        const float2 ki = unpack_e(*reinterpret_cast<const uint32_t *>(Ks + i * LDK + d));
                        const float2 kj = unpack_e(*reinterpret_cast<const uint32_t *>(Ks + j * LDK + d));
                        const float e0 = ex2(gi.x - gj.x), e1 = ex2(gi.y - gj.y);
                        va += qi.x * kj.x * e0 + qi.y * kj.y * e1;
                        vl += ki.x * kj.x * e0 + ki.y * kj.y * e1;
                    }
                }
                Ls[i * LDL + j] = j < i ? vl * bs[i] : 0.f;
                if (i < L.len) Ag[i * rs * KDA_C + j] = to_e(j <= i ? va * a.scale : 0.f);
            }
        }
    }
    for (int b = rb + 1; b < 4; b++) /* zeros above the diagonal blocks */
        for (int hf = 0; hf < 2; hf++) {
            const int row = rb * 16 + g8 + 8 * hf;
            if (row < L.len)
                for (int nt = 0; nt < 2; nt++)
                    *reinterpret_cast<uint32_t *>(Ag + row * rs * KDA_C + b * 16 + nt * 8 + 2 * t4) = 0u;
        }
    __syncthreads();

    /* ---- T = (I+L)⁻¹ in fp32 (entries lie in [−1, 1]), blocked by 16: invert the diagonal blocks by forward
     * substitution (one column per thread), then T_ab = −T_aa · Σ_{c=b}^{a−1} L_ac T_cb one block diagonal at a time. */
    if (tid < 64) {
        const int a0 = (tid >> 4) * 16, cc = tid;
        for (int i = 0; i < a0; i++) Ts[i * LDL + cc] = 0.f;
        for (int i = a0; i < a0 + 16; i++) {
            float x = i == cc ? 1.f : 0.f;
            for (int j = cc; j < i; j++) x -= Ls[i * LDL + j] * Ts[j * LDL + cc];
            Ts[i * LDL + cc] = x;
        }
    }
    __syncthreads();
    for (int lvl = 1; lvl < 4; lvl++) {
        const int nblk = 4 - lvl; /* blocks (a, b = a − lvl), a = lvl .. 3 */
        for (int e = tid; e < nblk * 256; e += 128) {
            const int blk = e >> 8, r = (e >> 4) & 15, cc = e & 15, ab = lvl + blk, bb = blk;
            float x = 0.f;
            for (int m = 16 * bb; m < 16 * ab; m++) x += Ls[(16 * ab + r) * LDL + m] * Ts[m * LDL + 16 * bb + cc];
            Rs[e] = x;
        }
        __syncthreads();
        for (int e = tid; e < nblk * 256; e += 128) {
            const int blk = e >> 8, r = (e >> 4) & 15, cc = e & 15, ab = lvl + blk, bb = blk;
            float x = 0.f;
            for (int m = 0; m < 16; m++) x -= Ts[(16 * ab + r) * LDL + 16 * ab + m] * Rs[(blk << 8) + (m << 4) + cc];
            Ts[(16 * ab + r) * LDL + 16 * bb + cc] = x;
        }
        __syncthreads();
    }
    if (a.Tinv) /* kept for the backward, in fp32 */
        for (int e = tid; e < 64 * 64; e += 128) {
            const int r = e >> 6, cc = e & 63;
            if (r < L.len) a.Tinv[(row0 + r * rs) * KDA_C + cc] = Ts[r * LDL + cc];
        }

    /* ---- w = T · (β ⊙ K ⊙ Γ) */
    for (int e = tid; e < 64 * (DK / 8); e += 128) {
        const int r = e / (DK / 8), c8 = (e % (DK / 8)) * 8;
        uint4 kv = *reinterpret_cast<const uint4 *>(Ks + r * LDK + c8);
        const uint32_t *kw = reinterpret_cast<const uint32_t *>(&kv);
        uint4 xo;
        uint32_t *xw = reinterpret_cast<uint32_t *>(&xo);
        const float *gr = Gs + r * LDG + c8;
#pragma unroll
        for (int p = 0; p < 4; p++) {
            float2 kf = unpack_e(kw[p]);
            xw[p] = pack_e(bs[r] * kf.x * ex2(gr[2 * p]), bs[r] * kf.y * ex2(gr[2 * p + 1]));
        }
        *reinterpret_cast<uint4 *>(Xk + r * LDK + c8) = xo;
    }
    __syncthreads();
    {
        float acc[DK / 8][4] = {};
        for (int k0 = 0; k0 <= rb * 16; k0 += 16) {
            uint32_t af[4];
            lda_f32(af, Ts, LDL, rb * 16, k0, lane);
#pragma unroll
            for (int n0 = 0; n0 < DK; n0 += 16) {
                uint32_t bfr[4];
                ldb_kmajor(bfr, Xk, LDK, n0, k0, lane);
                mma16816(acc[n0 / 8], af, bfr[0], bfr[1]);
                mma16816(acc[n0 / 8 + 1], af, bfr[2], bfr[3]);
            }
        }
#pragma unroll
        for (int nt = 0; nt < DK / 8; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int row = hf ? ri1 : ri0;
                if (row < L.len)
                    *reinterpret_cast<uint32_t *>(a.w + (row0 + row * rs) * DK + nt * 8 + 2 * t4) =
                        pack_e(acc[nt][2 * hf], acc[nt][2 * hf + 1]);
            }
    }

    /* ---- u = T · (β ⊙ V), 32 columns at a time */
    for (int v0 = 0; v0 < a.DV; v0 += 32) {
        __syncthreads(); /* Ks (first slab) or the previous slab is no longer read */
        for (int e = tid; e < 64 * 4; e += 128) {
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
            *reinterpret_cast<uint4 *>(Xv + r * LDX + c8) = vv;
        }
        __syncthreads();
        float acc[4][4] = {};
        for (int k0 = 0; k0 <= rb * 16; k0 += 16) {
            uint32_t af[4];
            lda_f32(af, Ts, LDL, rb * 16, k0, lane);
#pragma unroll
            for (int n0 = 0; n0 < 32; n0 += 16) {
                uint32_t bfr[4];
                ldb_kmajor(bfr, Xv, LDX, n0, k0, lane);
                mma16816(acc[n0 / 8], af, bfr[0], bfr[1]);
                mma16816(acc[n0 / 8 + 1], af, bfr[2], bfr[3]);
            }
        }
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int row = hf ? ri1 : ri0;
                if (row < L.len)
                    *reinterpret_cast<uint32_t *>(a.u + (row0 + row * rs) * a.DV + v0 + nt * 8 + 2 * t4) =
                        pack_e(acc[nt][2 * hf], acc[nt][2 * hf + 1]);
            }
    }
}

/* ---------------------------------------------------------------- state pass
 * One block of 256 threads per (dv block of BV columns, head, document), sequential over the document's chunks with
 * the next chunk's tiles prefetched (cp.async, two stages). The state S [dk, BV] lives in fp32 MMA accumulators: warp w
 * owns the 16-row m-tiles w mod 4, +4, .. of one 16-column half (w div 4).
 * Per chunk: Ṽ = U − W·S, O = Qg·S + A·Ṽ, S = Γ_C ⊙ S + Kgᵀ·Ṽ. */
struct state_args {
    const elem *w, *u, *qg, *kg, *A;
    const float *gamma, *h0;
    const int32_t *cu;
    const int *coff;
    int T, H, DV;
    void *o;
    float *ht;
    elem *hs, *vnew;
};

template <int DK, int BV> struct state_layout {
    static constexpr int LDK = DK + 8, LDV = BV + 8, LDA = KDA_C + 8;
    static constexpr int W = 0, Q = W + 64 * LDK * 2, K = Q + 64 * LDK * 2, U = K + 64 * LDK * 2, A = U + 64 * LDV * 2,
                         GAM = A + 64 * LDA * 2, STAGE = GAM + DK * 4;
    static constexpr int SB = 2 * STAGE, VN = SB + DK * LDV * 2, BYTES = VN + 64 * LDV * 2;
};

template <typename OutT> __device__ __forceinline__ void store2(OutT *p, float x, float y);
template <> __device__ __forceinline__ void store2<float>(float *p, float x, float y) {
    *reinterpret_cast<float2 *>(p) = make_float2(x, y);
}
template <> __device__ __forceinline__ void store2<elem>(elem *p, float x, float y) {
    *reinterpret_cast<uint32_t *>(p) = pack_e(x, y);
}

template <int DK, int BV, typename OutT> __global__ void __launch_bounds__(256, 1) kda_state_kernel(state_args a) {
    using Ly = state_layout<DK, BV>;
    constexpr int LDK = Ly::LDK, LDV = Ly::LDV, LDA = Ly::LDA;
    /* 8 warps: wq = row quarter (16 chunk rows; state m-tiles wq, wq+4, ..), wc = 16-column half of the dv block */
    constexpr int MTT = DK / 16, MTW = (MTT + 3) / 4, NT = 2;
    static_assert(BV == 32, "state pass: two 16-column halves");
    extern __shared__ __align__(16) unsigned char smem[];
    elem *Sb = (elem *)(smem + Ly::SB), *Vn = (elem *)(smem + Ly::VN);
    const int vb = blockIdx.x, h = blockIdx.y, n = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
    const int wq = warp & 3, cofs = 16 * (warp >> 2);
    const int bos = a.cu ? a.cu[n] : 0, eos = a.cu ? a.cu[n + 1] : a.T;
    const int c0 = a.coff[n], nc = a.coff[n + 1] - c0;
    const int64_t rs = a.H, vcol = (int64_t)vb * BV;
    const int64_t sbase = (((int64_t)n * a.H + h) * DK) * a.DV + vcol; /* h0 / ht [n, h, :, vb·BV ..] */

    float S[MTW][NT][4];
#pragma unroll
    for (int i = 0; i < MTW; i++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int mt = wq + 4 * i, row = 16 * mt + g8 + (e >= 2 ? 8 : 0),
                          col = cofs + 8 * nt + 2 * t4 + (e & 1);
                S[i][nt][e] = (a.h0 && mt < MTT) ? a.h0[sbase + (int64_t)row * a.DV + col] : 0.f;
            }

    auto prefetch = [&](int cc, int stage) {
        unsigned char *st = smem + stage * Ly::STAGE;
        const int t0 = bos + cc * KDA_C, len = min(KDA_C, eos - t0);
        const int64_t r0 = (int64_t)t0 * rs + h;
        tile_load_async((elem *)(st + Ly::W), LDK, a.w + r0 * DK, rs * DK, 64, DK, len, DK, tid, 256);
        tile_load_async((elem *)(st + Ly::Q), LDK, a.qg + r0 * DK, rs * DK, 64, DK, len, DK, tid, 256);
        tile_load_async((elem *)(st + Ly::K), LDK, a.kg + r0 * DK, rs * DK, 64, DK, len, DK, tid, 256);
        tile_load_async((elem *)(st + Ly::U), LDV, a.u + r0 * a.DV + vcol, rs * a.DV, 64, BV, len, BV, tid, 256);
        tile_load_async((elem *)(st + Ly::A), LDA, a.A + r0 * KDA_C, rs * KDA_C, 64, KDA_C, len, KDA_C, tid, 256);
        const float *gsrc = a.gamma + ((int64_t)(c0 + cc) * a.H + h) * DK;
        for (int i = tid; i < DK / 4; i += 256) cp_async16(st + Ly::GAM + 16 * i, gsrc + 4 * i, 16);
    };

    if (nc > 0) {
        prefetch(0, 0);
        cp_async_commit();
    }
    for (int cc = 0; cc < nc; cc++) {
        if (cc + 1 < nc) {
            prefetch(cc + 1, (cc + 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        unsigned char *st = smem + (cc & 1) * Ly::STAGE;
        const elem *Ws = (const elem *)(st + Ly::W), *Qs = (const elem *)(st + Ly::Q), *Ks = (const elem *)(st + Ly::K);
        const elem *Us = (const elem *)(st + Ly::U), *As = (const elem *)(st + Ly::A);
        const float *gam = (const float *)(st + Ly::GAM);
        const int t0 = bos + cc * KDA_C, len = min(KDA_C, eos - t0);

        /* S → elem operand */
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
        if (a.hs) { /* state entering this chunk, for the backward */
            elem *dst = a.hs + ((int64_t)(c0 + cc) * a.H + h) * DK * a.DV + vcol;
            for (int e = tid; e < DK * (BV / 8); e += 256) {
                const int r = e / (BV / 8), c8 = (e % (BV / 8)) * 8;
                *reinterpret_cast<uint4 *>(dst + (int64_t)r * a.DV + c8) =
                    *reinterpret_cast<const uint4 *>(Sb + r * LDV + c8);
            }
        }

        /* Ṽ = U − W·S and the inter-chunk output Qg·S; warp (wq, wc) owns rows 16wq .., columns cofs .. */
        float av[NT][4] = {}, ao[NT][4] = {};
#pragma unroll
        for (int k0 = 0; k0 < DK; k0 += 16) {
            uint32_t aw[4], aq[4], b[4];
            lda_rowmajor(aw, Ws, LDK, 16 * wq, k0, lane);
            lda_rowmajor(aq, Qs, LDK, 16 * wq, k0, lane);
            ldb_kmajor(b, Sb, LDV, cofs, k0, lane);
            mma16816(av[0], aw, b[0], b[1]);
            mma16816(av[1], aw, b[2], b[3]);
            mma16816(ao[0], aq, b[0], b[1]);
            mma16816(ao[1], aq, b[2], b[3]);
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int row = 16 * wq + g8 + 8 * hf, col = cofs + 8 * nt + 2 * t4;
                const float2 uu = unpack_e(*reinterpret_cast<const uint32_t *>(Us + row * LDV + col));
                *reinterpret_cast<uint32_t *>(Vn + row * LDV + col) =
                    pack_e(uu.x - av[nt][2 * hf], uu.y - av[nt][2 * hf + 1]);
            }
        __syncthreads();
        if (a.vnew)
            for (int e = tid; e < 64 * (BV / 8); e += 256) {
                const int r = e / (BV / 8), c8 = (e % (BV / 8)) * 8;
                if (r < len)
                    *reinterpret_cast<uint4 *>(a.vnew + ((int64_t)(t0 + r) * rs + h) * a.DV + vcol + c8) =
                        *reinterpret_cast<const uint4 *>(Vn + r * LDV + c8);
            }

        /* O = Qg·S + A·Ṽ (A is causal: only k-blocks up to the warp's own) */
        if (a.o) {
            for (int k0 = 0; k0 <= 16 * wq; k0 += 16) {
                uint32_t aa[4], b[4];
                lda_rowmajor(aa, As, LDA, 16 * wq, k0, lane);
                ldb_kmajor(b, Vn, LDV, cofs, k0, lane);
                mma16816(ao[0], aa, b[0], b[1]);
                mma16816(ao[1], aa, b[2], b[3]);
            }
            OutT *o = (OutT *)a.o;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int row = 16 * wq + g8 + 8 * hf, col = cofs + 8 * nt + 2 * t4;
                    if (row < len)
                        store2<OutT>(o + ((int64_t)(t0 + row) * rs + h) * a.DV + vcol + col, ao[nt][2 * hf],
                                     ao[nt][2 * hf + 1]);
                }
        }

        /* S = Γ_C ⊙ S + Kgᵀ·Ṽ */
#pragma unroll
        for (int i = 0; i < MTW; i++) {
            const int mt = wq + 4 * i;
            if (mt >= MTT) continue;
            const float ga = gam[16 * mt + g8], gb = gam[16 * mt + g8 + 8];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                S[i][nt][0] *= ga, S[i][nt][1] *= ga, S[i][nt][2] *= gb, S[i][nt][3] *= gb;
            }
#pragma unroll
            for (int k0 = 0; k0 < KDA_C; k0 += 16) {
                uint32_t ak[4], b[4];
                lda_trans(ak, Ks, LDK, 16 * mt, k0, lane);
                ldb_kmajor(b, Vn, LDV, cofs, k0, lane);
                mma16816(S[i][0], ak, b[0], b[1]);
                mma16816(S[i][1], ak, b[2], b[3]);
            }
        }
        __syncthreads();
    }
    if (a.ht)
#pragma unroll
        for (int i = 0; i < MTW; i++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int mt = wq + 4 * i, row = 16 * mt + g8 + (e >= 2 ? 8 : 0),
                              col = cofs + 8 * nt + 2 * t4 + (e & 1);
                    if (mt < MTT) a.ht[sbase + (int64_t)row * a.DV + col] = S[i][nt][e];
                }
}

/* ---------------------------------------------------------------- launchers */
int kda_convert_inputs(const kda_plan *p, const float *q, const float *k, const float *v, k3c_err *err) {
    const size_t tk = (size_t)p->T * p->H * p->DK, tv = (size_t)p->T * p->H * p->DV;
    int rc;
    if ((rc = f32_to_elem(q, p->qb, tk, err)) || (rc = f32_to_elem(k, p->kb, tk, err)) ||
        (rc = f32_to_elem(v, p->vb, tv, err)))
        return rc;
    return K3C_OK;
}

template <int DK, bool B> static int launch_intra(const kda_plan *p, const intra_args &a, k3c_err *err) {
    const int bytes = intra_layout<DK>::BYTES;
    K3C_CU(cudaFuncSetAttribute(kda_intra_kernel<DK, B>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    kda_intra_kernel<DK, B><<<dim3(p->NCmax, p->H), 128, bytes, K3C_STREAM>>>(a);
    K3C_CU_LAUNCHED("kda_intra");
    return K3C_OK;
}

int kda_run_intra(const kda_plan *p, const elem *q, const elem *k, const elem *v, const float *g, const float *beta,
                  int want_bwd, k3c_err *err) {
    kda_coff_kernel<<<1, 1, 0, K3C_STREAM>>>(p->cu, p->N, p->T, p->coff);
    K3C_CU_LAUNCHED("kda_coff");
    if (p->T == 0) return K3C_OK;
    intra_args a = {q,       k,     v,        g,    beta, p->cu, p->coff, p->T, p->H,
                    p->N,    p->DV, p->scale, p->w, p->u, p->qg, p->kg,   p->A, want_bwd ? p->Tinv : nullptr,
                    p->gamma};
    switch (p->DK * 2 + (p->bounded ? 1 : 0)) {
    case 64: return launch_intra<32, false>(p, a, err);
    case 65: return launch_intra<32, true>(p, a, err);
    case 128: return launch_intra<64, false>(p, a, err);
    case 129: return launch_intra<64, true>(p, a, err);
    case 256: return launch_intra<128, false>(p, a, err);
    case 257: return launch_intra<128, true>(p, a, err);
    }
    return k3c_errf(err, K3C_EUNSUPPORTED, "kda: dk %d", p->DK);
}

template <int DK, typename OutT> static int launch_state(const kda_plan *p, const state_args &a, k3c_err *err) {
    constexpr int BV = 32;
    const int bytes = state_layout<DK, BV>::BYTES;
    K3C_CU(cudaFuncSetAttribute(kda_state_kernel<DK, BV, OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    kda_state_kernel<DK, BV, OutT><<<dim3(p->DV / BV, p->H, p->N), 256, bytes, K3C_STREAM>>>(a);
    K3C_CU_LAUNCHED("kda_state");
    return K3C_OK;
}

int kda_run_state(const kda_plan *p, const float *h0, void *o, int o_f32, float *ht, int want_bwd, k3c_err *err) {
    state_args a = {p->w,
                    p->u,
                    p->qg,
                    p->kg,
                    p->A,
                    p->gamma,
                    h0,
                    p->cu,
                    p->coff,
                    p->T,
                    p->H,
                    p->DV,
                    o,
                    ht,
                    want_bwd ? p->hs : nullptr,
                    want_bwd ? p->vnew : nullptr};
    switch (p->DK * 2 + (o_f32 ? 1 : 0)) {
    case 64: return launch_state<32, elem>(p, a, err);
    case 65: return launch_state<32, float>(p, a, err);
    case 128: return launch_state<64, elem>(p, a, err);
    case 129: return launch_state<64, float>(p, a, err);
    case 256: return launch_state<128, elem>(p, a, err);
    case 257: return launch_state<128, float>(p, a, err);
    }
    return k3c_errf(err, K3C_EUNSUPPORTED, "kda: dk %d", p->DK);
}

} // namespace K3C_ELEM_NS
} // namespace k3c_cu

using namespace k3c_cu;
using namespace k3c_cu::K3C_ELEM_NS;

#if !K3C_CU_F16 /* one layout for both element types */
extern "C" size_t k3c_kda_chunk_fwd_workspace_cuda(const k3c_kda_dims *d) {
    return kda_plan_layout(d, NULL, 1, 0, NULL);
}
#endif

static int kda_fwd_common(const k3c_kda_dims *d, const int32_t *cu, const elem *q, const elem *k, const elem *v,
                          const float *g, const float *beta, const float *h0, void *o, int o_f32, float *ht,
                          const kda_plan *p, k3c_err *err) {
    int rc = kda_run_intra(p, q, k, v, g, beta, 0, err);
    if (rc) return rc;
    return kda_run_state(p, h0, o, o_f32, ht, 0, err);
}

extern "C" int K3C_KENTRY(k3c_kda_chunk_fwd)(const k3c_kda_dims *d, const int32_t *cu_seqlens, const float *q,
                                             const float *k, const float *v, const float *g, const float *beta,
                                             const float *h0, float *o, float *ht, void *ws, k3c_err *err) {
    int rc = kda_check_dims(d, "kda_chunk_fwd_cuda", err);
    if (rc) return rc;
    kda_plan p;
    kda_plan_layout(d, ws, 1, 0, &p);
    p.cu = cu_seqlens;
    if (!cu_seqlens) p.N = 1;
    if ((rc = kda_convert_inputs(&p, q, k, v, err))) return rc;
    return kda_fwd_common(d, cu_seqlens, p.qb, p.kb, p.vb, g, beta, h0, o, 1, ht, &p, err);
}

#if !K3C_CU_F16
extern "C" int k3c_kda_chunk_fwd_bf16_cuda(const k3c_kda_dims *d, const int32_t *cu_seqlens, const uint16_t *q,
                                           const uint16_t *k, const uint16_t *v, const float *g, const float *beta,
                                           const float *h0, uint16_t *o, float *ht, void *ws, k3c_err *err) {
    int rc = kda_check_dims(d, "kda_chunk_fwd_bf16_cuda", err);
    if (rc) return rc;
    kda_plan p;
    /* the bf16 entry needs no input copies, but shares the float twin's layout so one workspace serves both */
    kda_plan_layout(d, ws, 1, 0, &p);
    p.cu = cu_seqlens;
    if (!cu_seqlens) p.N = 1;
    return kda_fwd_common(d, cu_seqlens, (const elem *)q, (const elem *)k, (const elem *)v, g, beta, h0, o, 0, ht, &p,
                          err);
}
#endif
