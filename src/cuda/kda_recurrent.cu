/* kda_recurrent.cu — the token-recurrent KDA forward and backward in fp32 (decode steps, and the fp32 checking kernels
 * of the backend table): one block per (document, head, 32 state columns). docs/MODEL.md §3.1 step 7, §3.4, §3.5. */
#include "base/carve.h"
#include "cuda/common.cuh"
#include "cuda/kda_step.cuh"

namespace k3c_cu {

constexpr int REC_TILE = 16; /* tokens staged in shared memory per barrier pair */

/* Four consecutive lanes share column v of the state, each holding dk/4 of its rows in registers: r = Pᵀk and
 * o = s·Sᵀq are lane-partial sums closed by two shuffles; q, k and e^g of REC_TILE tokens are broadcast from shared
 * memory. */
template <int DK>
__global__ void __launch_bounds__(128)
    kda_recurrent_kernel(const float *q, const float *k, const float *v, const float *g, const float *beta,
                         const float *h0, float *o, float *ht, const int32_t *cu, int T, int H, int DV, float scale) {
    constexpr int KP = DK / 4;
    __shared__ float qs[REC_TILE][DK], ks[REC_TILE][DK], es[REC_TILE][DK], bs[REC_TILE];
    const int h = blockIdx.x, n = blockIdx.y, tid = threadIdx.x, part = tid & 3, col = blockIdx.z * 32 + (tid >> 2);
    const bool live = col < DV;
    const int bos = cu ? cu[n] : 0, eos = cu ? cu[n + 1] : T, i0 = part * KP;
    const int64_t sbase = ((int64_t)n * H + h) * DK * DV;
    float S[KP];
#pragma unroll
    for (int i = 0; i < KP; i++) S[i] = (live && h0) ? h0[sbase + (int64_t)(i0 + i) * DV + col] : 0.f;
    for (int t0 = bos; t0 < eos; t0 += REC_TILE) {
        const int n_t = min(REC_TILE, eos - t0);
        __syncthreads();
        for (int e = tid; e < n_t * DK; e += blockDim.x) {
            const int r = e / DK, i = e % DK;
            const int64_t off = ((int64_t)(t0 + r) * H + h) * DK + i;
            qs[r][i] = q[off] * scale, ks[r][i] = k[off], es[r][i] = expf(g[off]);
        }
        for (int r = tid; r < n_t; r += blockDim.x) bs[r] = beta[(int64_t)(t0 + r) * H + h];
        __syncthreads();
        for (int r = 0; r < n_t; r++) {
            const int64_t vo = ((int64_t)(t0 + r) * H + h) * DV + col;
            const float acc = kda_token_step<KP>(S, &es[r][i0], &ks[r][i0], &qs[r][i0], bs[r], v + vo, live);
            if (live && part == 0) o[vo] = acc;
        }
    }
    if (live && ht)
#pragma unroll
        for (int i = 0; i < KP; i++) ht[sbase + (int64_t)(i0 + i) * DV + col] = S[i];
}


/* ---------------------------------------------------------------- backward
 * The CPU's token-level backward (ops/kda_recurrent.c, §3.4) on the forward's block layout: a state checkpoint at the
 * start of every segment of `seg` tokens, then segment by segment from the last the segment's states recomputed into
 * the workspace and its tokens walked back with dS in registers. dv and dh0 belong to one state column and are added
 * directly; dq, dk, dg and dβ sum over the columns: over a warp's 8 by shuffles, the block's 4 warps in shared memory,
 * then the column blocks by kda_rec_sum_kernel, each in a fixed order, so the result does not depend on scheduling. */
struct kda_rec_bwd_args {
    const float *q, *k, *v, *g, *beta, *h0, *dout, *dht;
    float *dv, *dh0;
    float *ck, *st;             /* checkpoints [H][nseg_cap][DK][DV]; segment states [N][H][rows][DK][DV] */
    float *pq, *pk, *pg, *pb;   /* per column block: [NCB][T][H][DK] (dq, dk, dg), [NCB][T][H] (dβ) */
    const int32_t *cu;
    int T, H, DV, seg, rows;
    int64_t nseg_cap;
    float scale;
};

/* S ← the state after token t (this thread's rows i0.. of column col; dead columns stay 0). */
template <int KP>
__device__ __forceinline__ void kda_rec_state_step(const kda_rec_bwd_args &a, float (&S)[KP], int t, int h, int i0,
                                                   int col, bool live, int DK) {
    const int64_t xk = ((int64_t)t * a.H + h) * DK + i0;
    float rr = 0.f;
#pragma unroll
    for (int i = 0; i < KP; i++) {
        S[i] *= expf(a.g[xk + i]);
        rr += S[i] * a.k[xk + i];
    }
    rr += __shfl_xor_sync(0xffffffffu, rr, 1);
    rr += __shfl_xor_sync(0xffffffffu, rr, 2);
    const float delta = live ? a.beta[(int64_t)t * a.H + h] * (a.v[((int64_t)t * a.H + h) * a.DV + col] - rr) : 0.f;
#pragma unroll
    for (int i = 0; i < KP; i++) S[i] += a.k[xk + i] * delta;
}

/* Σ over the 8 columns of a warp (lanes 4 apart), the same value left in each of them. */
__device__ __forceinline__ float kda_rec_col_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    x += __shfl_xor_sync(0xffffffffu, x, 8);
    x += __shfl_xor_sync(0xffffffffu, x, 16);
    return x;
}

template <int DK>
__global__ void __launch_bounds__(128) kda_recurrent_bwd_kernel(kda_rec_bwd_args a) {
    constexpr int KP = DK / 4;
    __shared__ float red[3][4][DK], redb[4];
    const int h = blockIdx.x, n = blockIdx.y, cb = blockIdx.z, tid = threadIdx.x, part = tid & 3;
    const int col = cb * 32 + (tid >> 2), warp = tid >> 5, lane = tid & 31, H = a.H, DV = a.DV;
    const bool live = col < DV;
    const int bos = a.cu ? a.cu[n] : 0, eos = a.cu ? a.cu[n + 1] : a.T, i0 = part * KP;
    const int nseg = (eos - bos + a.seg - 1) / a.seg;
    const int64_t SS = (int64_t)DK * DV, sbase = ((int64_t)n * H + h) * SS, me = (int64_t)i0 * DV + col;
    /* a document's checkpoints start at bos/seg + n: documents never overlap there (ceil(len/seg) ≤ ⌊len/seg⌋ + 1) */
    float *ck = a.ck + ((int64_t)h * a.nseg_cap + bos / a.seg + n) * SS + me;
    float *st = a.st + ((int64_t)n * H + h) * a.rows * SS + me;
    const int64_t NT = (int64_t)a.T * H;
    float S[KP], dS[KP];
#pragma unroll
    for (int i = 0; i < KP; i++) S[i] = (live && a.h0) ? a.h0[sbase + me + (int64_t)i * DV] : 0.f;
    for (int s = 0; s < nseg; s++) { /* forward: the state entering every segment */
        if (live)
#pragma unroll
            for (int i = 0; i < KP; i++) ck[s * SS + (int64_t)i * DV] = S[i];
        if (s == nseg - 1) break;
        for (int t = bos + s * a.seg; t < bos + (s + 1) * a.seg; t++) kda_rec_state_step<KP>(a, S, t, h, i0, col, live, DK);
    }
#pragma unroll
    for (int i = 0; i < KP; i++) dS[i] = (live && a.dht) ? a.dht[sbase + me + (int64_t)i * DV] : 0.f;
    for (int s = nseg - 1; s >= 0; s--) {
        const int t0 = bos + s * a.seg, t1 = min(t0 + a.seg, eos);
#pragma unroll
        for (int i = 0; i < KP; i++) S[i] = live ? ck[s * SS + (int64_t)i * DV] : 0.f;
        for (int t = t0; t < t1; t++) { /* the segment's states: st[r] = the state after token t0 + r − 1 */
            if (live)
#pragma unroll
                for (int i = 0; i < KP; i++) st[(t - t0) * SS + (int64_t)i * DV] = S[i];
            kda_rec_state_step<KP>(a, S, t, h, i0, col, live, DK);
        }
        for (int t = t1 - 1; t >= t0; t--) {
            const int64_t th = (int64_t)t * H + h, xk = th * DK + i0, xv = th * DV + col;
            const float *sp = st + (t - t0) * SS;
            const float doj = live && a.dout ? a.dout[xv] : 0.f, bt = a.beta[th];
            float cq[KP], r = 0.f, dd = 0.f;
#pragma unroll
            for (int i = 0; i < KP; i++) { /* readout into dS and dq; r = Pᵀk; dδ = dSᵀk (Sc = S_t = P + kδᵀ) */
                const float spi = live ? sp[(int64_t)i * DV] : 0.f, ai = expf(a.g[xk + i]), ki = a.k[xk + i];
                dS[i] += a.scale * a.q[xk + i] * doj;
                r += ki * ai * spi;
                dd += ki * dS[i];
                S[i] = spi; /* S now holds S_{t−1} */
            }
            r += __shfl_xor_sync(0xffffffffu, r, 1);
            r += __shfl_xor_sync(0xffffffffu, r, 2);
            dd += __shfl_xor_sync(0xffffffffu, dd, 1);
            dd += __shfl_xor_sync(0xffffffffu, dd, 2);
            const float vr = live ? a.v[xv] - r : 0.f, delta = bt * vr, dr = -bt * dd;
#pragma unroll
            for (int i = 0; i < KP; i++) { /* o_t = S_tᵀ(s q): dq = s S_t do with S_t = P + k δᵀ */
                const float ai = expf(a.g[xk + i]), ki = a.k[xk + i], P = ai * S[i];
                cq[i] = (P + ki * delta) * doj;
            }
            if (live && part == 0 && a.dv) a.dv[xv] += bt * dd;
            float cb_beta = kda_rec_col_sum(dd * vr);
#pragma unroll
            for (int i = 0; i < KP; i++) { /* dk = dS δ + P dr; dP = dS + k drᵀ; dg = Σ P⊙dP; dS_prev = α dP */
                const float ai = expf(a.g[xk + i]), ki = a.k[xk + i], P = ai * S[i], dP = dS[i] + ki * dr;
                const float sq = kda_rec_col_sum(cq[i]), sk = kda_rec_col_sum(dS[i] * delta + P * dr),
                            sg = kda_rec_col_sum(P * dP);
                if (lane < 4) red[0][warp][i0 + i] = sq, red[1][warp][i0 + i] = sk, red[2][warp][i0 + i] = sg;
                dS[i] = ai * dP;
            }
            if (lane == 0) redb[warp] = cb_beta;
            __syncthreads();
            for (int e = tid; e < 3 * DK; e += blockDim.x) {
                const int w = e / DK, i = e % DK;
                const float sum = ((red[w][0][i] + red[w][1][i]) + red[w][2][i]) + red[w][3][i];
                float *p = w == 0 ? a.pq : w == 1 ? a.pk : a.pg;
                p[((int64_t)cb * NT + th) * DK + i] = w == 0 ? a.scale * sum : sum;
            }
            if (tid == 0) a.pb[(int64_t)cb * NT + th] = ((redb[0] + redb[1]) + redb[2]) + redb[3];
            __syncthreads();
        }
    }
    if (live && a.dh0)
#pragma unroll
        for (int i = 0; i < KP; i++) a.dh0[sbase + me + (int64_t)i * DV] += dS[i];
}

/* out[e] += Σ_cb part[cb][e] in the order of the column blocks (out may be NULL). */
__global__ void kda_rec_sum_kernel(int64_t n, int ncb, const float *part, float *out) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        float acc = 0.f;
        for (int cb = 0; cb < ncb; cb++) acc += part[cb * n + e];
        out[e] += acc;
    }
}

} // namespace k3c_cu

using namespace k3c_cu;

extern "C" size_t k3c_kda_recurrent_fwd_workspace_cuda(const k3c_kda_dims *d) { return 0; }

template <int DK>
static int launch_recurrent(const k3c_kda_dims *d, const int32_t *cu, const float *q, const float *k, const float *v,
                            const float *g, const float *beta, const float *h0, float *o, float *ht, k3c_err *err) {
    const int N = cu ? d->n_docs : 1, threads = 128;
    const float scale = (float)(d->scale != 0 ? d->scale : 1.0 / sqrt((double)d->dk));
    kda_recurrent_kernel<DK>
        <<<dim3((unsigned)d->H, (unsigned)N, (unsigned)((d->dv + 31) / 32)), threads, 0, K3C_STREAM>>>(
            q, k, v, g, beta, h0, o, ht, cu, (int)d->T, (int)d->H, (int)d->dv, scale);
    K3C_CU_LAUNCHED("kda_recurrent");
    return K3C_OK;
}

extern "C" int k3c_kda_recurrent_fwd_cuda(const k3c_kda_dims *d, const int32_t *cu_seqlens, const float *q,
                                          const float *k, const float *v, const float *g, const float *beta,
                                          const float *h0, float *o, float *ht, void *ws, k3c_err *err) {
    if (!d || d->T < 0 || d->H <= 0 || d->dv <= 0 || d->dv > 1024 || (cu_seqlens && d->n_docs <= 0))
        return k3c_errf(err, K3C_EINVAL, "kda_recurrent_fwd_cuda: bad sizes (H > 0, 1 <= dv <= 1024, n_docs > 0)");
    switch (d->dk) {
    case 8: return launch_recurrent<8>(d, cu_seqlens, q, k, v, g, beta, h0, o, ht, err);
    case 16: return launch_recurrent<16>(d, cu_seqlens, q, k, v, g, beta, h0, o, ht, err);
    case 32: return launch_recurrent<32>(d, cu_seqlens, q, k, v, g, beta, h0, o, ht, err);
    case 64: return launch_recurrent<64>(d, cu_seqlens, q, k, v, g, beta, h0, o, ht, err);
    case 128: return launch_recurrent<128>(d, cu_seqlens, q, k, v, g, beta, h0, o, ht, err);
    }
    return k3c_errf(err, K3C_EUNSUPPORTED, "kda_recurrent_fwd_cuda: dk = %lld (8, 16, 32, 64 or 128)", (long long)d->dk);
}

/* The backward's workspace (256-byte pieces): checkpoints, one segment's states per (document, head), and the
 * per-column-block partial sums of dq, dk, dg, dβ. */
struct kda_rec_ws {
    float *ck, *st, *pq, *pk, *pg, *pb;
    int seg, rows;
    int64_t nseg_cap;
};
static size_t kda_rec_ws_layout(const k3c_kda_dims *d, void *ws, kda_rec_ws *w) {
    const int64_t N = d->n_docs > 0 ? d->n_docs : 1, SS = d->dk * d->dv, ncb = (d->dv + 31) / 32;
    kda_rec_ws q = {};
    q.seg = d->chunk > 0 ? d->chunk : 64;
    q.rows = (int)(d->T < q.seg ? d->T : q.seg) + 1;
    q.nseg_cap = d->T / q.seg + N + 1;
    k3c_carver c = ws ? k3c_carver_at(ws, SIZE_MAX, 256) : k3c_carver_measure(256);
    q.ck = K3C_CARVE(&c, float, d->H * q.nseg_cap * SS);
    q.st = K3C_CARVE(&c, float, N * d->H * q.rows * SS);
    q.pq = K3C_CARVE(&c, float, ncb * d->T * d->H * d->dk);
    q.pk = K3C_CARVE(&c, float, ncb * d->T * d->H * d->dk);
    q.pg = K3C_CARVE(&c, float, ncb * d->T * d->H * d->dk);
    q.pb = K3C_CARVE(&c, float, ncb * d->T * d->H);
    if (w) *w = q;
    return c.off;
}

extern "C" size_t k3c_kda_recurrent_bwd_workspace_cuda(const k3c_kda_dims *d) {
    return d && d->T >= 0 && d->H > 0 && d->dk > 0 && d->dv > 0 ? kda_rec_ws_layout(d, nullptr, nullptr) : 0;
}

template <int DK> static int launch_recurrent_bwd(const k3c_kda_dims *d, int N, kda_rec_bwd_args a, k3c_err *err) {
    kda_recurrent_bwd_kernel<DK><<<dim3((unsigned)d->H, (unsigned)N, (unsigned)((d->dv + 31) / 32)), 128, 0,
                                   K3C_STREAM>>>(a);
    K3C_CU_LAUNCHED("kda_recurrent_bwd");
    return K3C_OK;
}

extern "C" int k3c_kda_recurrent_bwd_cuda(const k3c_kda_dims *d, const int32_t *cu_seqlens, const float *q,
                                          const float *k, const float *v, const float *g, const float *beta,
                                          const float *h0, const float *dout, const float *dht, float *dq, float *dk,
                                          float *dv, float *dg, float *dbeta, float *dh0, void *ws, k3c_err *err) {
    if (!d || d->T < 0 || d->H <= 0 || d->dv <= 0 || d->dv > 1024 || (cu_seqlens && d->n_docs <= 0) || d->chunk < 0)
        return k3c_errf(err, K3C_EINVAL,
                        "kda_recurrent_bwd_cuda: bad sizes (H > 0, 1 <= dv <= 1024, n_docs > 0, chunk >= 0)");
    if (d->dk != 8 && d->dk != 16 && d->dk != 32 && d->dk != 64 && d->dk != 128)
        return k3c_errf(err, K3C_EUNSUPPORTED, "kda_recurrent_bwd_cuda: dk = %lld (8, 16, 32, 64 or 128)",
                        (long long)d->dk);
    if (!ws) return k3c_errf(err, K3C_EINVAL, "kda_recurrent_bwd_cuda: ws is NULL (k3c_kda_recurrent_bwd_workspace_cuda bytes)");
    if (d->T == 0) return K3C_OK;
    kda_rec_ws w;
    kda_rec_ws_layout(d, ws, &w);
    const int N = cu_seqlens ? d->n_docs : 1, ncb = (int)((d->dv + 31) / 32);
    kda_rec_bwd_args a = {q,   k,    v,    g,    beta, h0,   dout, dht,        dv,         dh0,       w.ck,
                          w.st, w.pq, w.pk, w.pg, w.pb, cu_seqlens, (int)d->T, (int)d->H, (int)d->dv, w.seg, w.rows,
                          w.nseg_cap, (float)(d->scale != 0 ? d->scale : 1.0 / sqrt((double)d->dk))};
    int rc = K3C_OK;
    switch (d->dk) {
    case 8: rc = launch_recurrent_bwd<8>(d, N, a, err); break;
    case 16: rc = launch_recurrent_bwd<16>(d, N, a, err); break;
    case 32: rc = launch_recurrent_bwd<32>(d, N, a, err); break;
    case 64: rc = launch_recurrent_bwd<64>(d, N, a, err); break;
    default: rc = launch_recurrent_bwd<128>(d, N, a, err); break;
    }
    const int64_t nk = d->T * d->H * d->dk, nb = d->T * d->H;
    const float *part[4] = {w.pq, w.pk, w.pg, w.pb};
    float *out[4] = {dq, dk, dg, dbeta};
    for (int i = 0; i < 4 && !rc; i++) {
        if (!out[i]) continue;
        const int64_t n = i < 3 ? nk : nb;
        kda_rec_sum_kernel<<<(unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096), 256, 0, K3C_STREAM>>>(
            n, ncb, part[i], out[i]);
        K3C_CU_LAUNCHED("kda_rec_sum");
    }
    return rc;
}
