/* decode.cu — the CUDA twin of the inference engine's ops (ops/decode.h) in fp32: embedding rows, per-sequence short
 * conv and KDA recurrence against decode states in device memory (every segment of a step in one launch, read from the
 * step's segment table), the absorbed-MLA latent cache and attention, routed experts as per-slot products on the
 * expert's weights (no host round trip), and CUDA graphs of repeated decode steps.
 * Spec: docs/MODEL.md §3.1 step 7, §4.2 (absorbed form), §6.2 + §9.2; docs/ENGINE.md "The step". */
#include "cuda/common.cuh"
#include "cuda/kda_step.cuh"
#include "cuda/glu.cuh"

extern "C" {
#include "ops/decode.h"
}

namespace {

constexpr int DW = 8;        /* warps per block of the row-parallel products */
constexpr int MAXW = 16;     /* K3C_SHORT_CONV_MAX_W */
constexpr int ATT_WARPS = 4; /* warps per (row, head) of the latent attention */

using k3c_cu::bf16f;
using k3c_cu::e2m1;

/* Element c of row r of a [R, C] view of type TYPE (MXFP4: scale per 32 columns). */
template <int TYPE>
__device__ __forceinline__ float welem(const void *w, const uint8_t *scale, int64_t r, int64_t C, int64_t c) {
    if (TYPE == K3C_QMAT_F32) return ((const float *)w)[r * C + c];
    if (TYPE == K3C_QMAT_BF16) return bf16f(((const uint16_t *)w)[r * C + c]);
    const unsigned byte = ((const uint8_t *)w)[r * (C / 2) + c / 2];
    return e2m1(c & 1 ? byte >> 4 : byte & 15u) * ldexpf(1.f, (int)scale[r * (C / 32) + c / 32] - 127);
}

/* The lane-strided dot of row r with x [C], closed by a warp reduction (every lane gets it). */
template <int TYPE>
__device__ __forceinline__ float wdot(const void *w, const uint8_t *scale, int64_t r, int64_t C, const float *x) {
    float s = 0.f;
    for (int64_t c = threadIdx.x & 31; c < C; c += 32) s += welem<TYPE>(w, scale, r, C, c) * x[c];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

/* Elements 4·c4 .. 4·c4 + 3 of row r (C % 4 == 0; rows 16-byte aligned for float32, 8 for bf16, 2 for MXFP4). */
template <int TYPE>
__device__ __forceinline__ float4 welem4(const void *w, const uint8_t *scale, int64_t r, int64_t C, int64_t c4) {
    if (TYPE == K3C_QMAT_F32) return ((const float4 *)w)[r * (C / 4) + c4];
    if (TYPE == K3C_QMAT_BF16) {
        const uint2 v = ((const uint2 *)w)[r * (C / 4) + c4];
        return make_float4(bf16f((uint16_t)v.x), bf16f((uint16_t)(v.x >> 16)), bf16f((uint16_t)v.y),
                           bf16f((uint16_t)(v.y >> 16)));
    }
    const unsigned h = ((const uint16_t *)w)[r * (C / 4) + c4]; /* two bytes: four nibbles, low nibble first */
    const float sc = ldexpf(1.f, (int)scale[r * (C / 32) + c4 / 8] - 127);
    return make_float4(e2m1(h & 15u) * sc, e2m1((h >> 4) & 15u) * sc, e2m1((h >> 8) & 15u) * sc,
                       e2m1((h >> 12) & 15u) * sc);
}

/* acc[j] = row r · x[j] for j < NB, every lane-strided group of four columns in order (so an input's sum is the same
 * whatever NB is), U groups per lane loaded before any is used: a decode step's products are latency-bound, and this
 * keeps U·(NB + 1) 16-byte loads in flight per lane. Every x[j] must be a readable row (callers repeat a real one for
 * unused slots); C % 4 == 0 and the rows aligned as welem4 needs. */
template <int TYPE, int NB, int U>
__device__ __forceinline__ void row_dots(const void *w, const uint8_t *scale, int64_t r, int64_t C,
                                         const float *const *x, float *acc) {
    const int64_t C4 = C / 4;
#pragma unroll
    for (int j = 0; j < NB; j++) acc[j] = 0.f;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int64_t c0 = threadIdx.x & 31; c0 < C4; c0 += 32 * U) {
        float4 wv[U], xv[U][NB];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t c = c0 + 32 * u;
            wv[u] = c < C4 ? welem4<TYPE>(w, scale, r, C, c) : zero;
#pragma unroll
            for (int j = 0; j < NB; j++) xv[u][j] = c < C4 ? ((const float4 *)x[j])[c] : zero;
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int j = 0; j < NB; j++)
                acc[j] += wv[u].x * xv[u][j].x + wv[u].y * xv[u][j].y + wv[u].z * xv[u][j].z + wv[u].w * xv[u][j].w;
    }
#pragma unroll
    for (int j = 0; j < NB; j++)
        for (int o = 16; o > 0; o >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
}

template <int TYPE>
__global__ void embed_kernel(const void *w, const uint8_t *scale, int64_t C, const int32_t *ids, float *y) {
    const int64_t i = blockIdx.x;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) y[i * C + c] = welem<TYPE>(w, scale, ids[i], C, c);
}

__device__ __forceinline__ float conv_sigm(float x) { /* short_conv.c sigm */
    if (x >= 0) return 1.f / (1.f + expf(-x));
    const float e = expf(x);
    return e / (1.f + e);
}

/* KDA's three short convs in one launch: a block of dk threads per (head, segment, stream q/k/v), a thread per channel
 * with the W−1 previous inputs in registers (oldest first), seeded from the tails and written back as the segment's last
 * W−1 inputs, the CPU's summation order (oldest tap first); q and k rows then L2-normalised per head in the block
 * (l2norm.c: the sum of squares in double, y = x · float(1/sqrt(Σ + 1e-6))). */
struct qkv_args {
    const float *x[3], *w[3];
    float *y[3];
};

__global__ void qkv_conv_kernel(const k3c_dec_seg *segs, int64_t off, int64_t P, int W, qkv_args a) {
    __shared__ double part[32];
    const int i = blockIdx.z, dk = blockDim.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const k3c_dec_seg sg = segs[blockIdx.y];
    const int64_t p = (int64_t)blockIdx.x * dk + threadIdx.x;
    const float *x = a.x[i], *w = a.w[i];
    float *y = a.y[i], *tail = sg.kda + off + (int64_t)i * P * (W - 1) + p * (W - 1);
    const unsigned mask = dk >= 32 ? 0xffffffffu : (1u << dk) - 1;
    float win[MAXW], wt[MAXW];
    for (int j = 0; j < W - 1; j++) win[j] = tail[j];
    for (int j = 0; j < W; j++) wt[j] = w[p * W + j];
    for (int64_t t = 0; t < sg.len; t++) {
        const float xt = x[(sg.row0 + t) * P + p];
        float c = 0.f;
        for (int j = 0; j < W - 1; j++) c += wt[j] * win[j];
        c += wt[W - 1] * xt;
        float v = c * conv_sigm(c);
        if (i < 2) { /* block-uniform */
            double ss = (double)v * v;
            for (int o = (dk < 32 ? dk : 32) / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(mask, ss, o);
            if (dk > 32) {
                if (lane == 0) part[warp] = ss;
                __syncthreads();
                ss = 0;
                for (int q = 0; q < dk / 32; q++) ss += part[q];
                __syncthreads(); /* part is rewritten by the next token */
            }
            v = v * (float)(1.0 / sqrt(ss + 1e-6));
        }
        y[(sg.row0 + t) * P + p] = v;
        for (int j = 0; j + 1 < W - 1; j++) win[j] = win[j + 1];
        if (W > 1) win[W - 2] = xt;
    }
    for (int j = 0; j < W - 1; j++) tail[j] = win[j];
}

/* The token recurrence of kda_recurrent.cu, one block per (head, segment, 32 state columns), its state at seg.kda + off
 * (in and out) and its tokens the segment's rows. */
template <int DK>
__global__ void __launch_bounds__(128)
    kda_kernel(const k3c_dec_seg *segs, int64_t off, const float *q, const float *k, const float *v, const float *g,
               const float *beta, float *o, int H, float scale) {
    constexpr int KP = DK / 4, TILE = 16;
    __shared__ float qs[TILE][DK], ks[TILE][DK], es[TILE][DK], bs[TILE];
    const k3c_dec_seg sg = segs[blockIdx.y];
    const int h = blockIdx.x, tid = threadIdx.x, part = tid & 3, col = blockIdx.z * 32 + (tid >> 2);
    const bool live = col < DK;
    const int i0 = part * KP;
    float *St = sg.kda + off + (int64_t)h * DK * DK;
    float S[KP];
#pragma unroll
    for (int i = 0; i < KP; i++) S[i] = live ? St[(int64_t)(i0 + i) * DK + col] : 0.f;
    const int64_t bos = sg.row0, eos = sg.row0 + sg.len;
    for (int64_t t0 = bos; t0 < eos; t0 += TILE) {
        const int n_t = (int)min((int64_t)TILE, eos - t0);
        __syncthreads();
        for (int e = tid; e < n_t * DK; e += blockDim.x) {
            const int r = e / DK, i = e % DK;
            const int64_t at = ((t0 + r) * H + h) * DK + i;
            qs[r][i] = q[at] * scale, ks[r][i] = k[at], es[r][i] = expf(g[at]);
        }
        for (int r = tid; r < n_t; r += blockDim.x) bs[r] = beta[(t0 + r) * H + h];
        __syncthreads();
        for (int r = 0; r < n_t; r++) {
            const int64_t vo = ((t0 + r) * H + h) * DK + col;
            const float acc = k3c_cu::kda_token_step<KP>(S, &es[r][i0], &ks[r][i0], &qs[r][i0], bs[r], v + vo, live);
            if (live && part == 0) o[vo] = acc;
        }
    }
    if (live)
#pragma unroll
        for (int i = 0; i < KP; i++) St[(int64_t)(i0 + i) * DK + col] = S[i];
}

__device__ __forceinline__ float *cache_of(const k3c_dec_seg &sg, int j, int64_t lw) {
    return sg.mla + ((int64_t)j * sg.cap) * lw;
}

/* One block per row: its [c_KV ; k_pe] into its segment's cache at pos + (row − row0). */
__global__ void cache_put_kernel(const k3c_dec_seg *segs, const int32_t *row_seg, int j, int64_t rkv, int64_t rope,
                                 const float *cn, const float *kva) {
    const int64_t r = blockIdx.x, lw = rkv + rope;
    const k3c_dec_seg sg = segs[row_seg[r]];
    float *dst = cache_of(sg, j, lw) + (sg.pos + r - sg.row0) * lw;
    for (int64_t e = threadIdx.x; e < lw; e += blockDim.x) dst[e] = e < rkv ? cn[r * rkv + e] : kva[r * lw + e];
}

/* One block per (row, head): ATT_WARPS warps take every ATT_WARPS-th cached token up to the row's position, each with
 * its own online softmax (running max, sum, accumulator in shared memory), merged at the end. */
__global__ void attend_kernel(const k3c_dec_seg *segs, const int32_t *row_seg, int j, int64_t n, int64_t rkv,
                              int64_t rope, const float *qlat, float scale, float *olat) {
    extern __shared__ float sm[];
    const int64_t r = blockIdx.x, h = blockIdx.y, lw = rkv + rope;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    float *qs = sm, *acc = qs + lw, *mw = acc + ATT_WARPS * rkv, *lw_sum = mw + ATT_WARPS;
    const k3c_dec_seg sg = segs[row_seg[r]];
    const float *cache = cache_of(sg, j, lw);
    const int64_t last = sg.pos + (r - sg.row0); /* keys 0 .. last */
    for (int64_t e = threadIdx.x; e < lw; e += blockDim.x) qs[e] = qlat[(h * n + r) * lw + e];
    float *aw = acc + warp * rkv;
    for (int64_t e = lane; e < rkv; e += 32) aw[e] = 0.f;
    __syncthreads();
    float m = -INFINITY, l = 0.f;
    for (int64_t t = warp; t <= last; t += ATT_WARPS) {
        const float *kt = cache + t * lw;
        float s = 0.f;
        for (int64_t e = lane; e < lw; e += 32) s += qs[e] * kt[e];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        s *= scale;
        const float mn = fmaxf(m, s), corr = m == -INFINITY ? 0.f : expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
        m = mn;
        for (int64_t e = lane; e < rkv; e += 32) aw[e] = aw[e] * corr + p * kt[e];
    }
    if (lane == 0) mw[warp] = m, lw_sum[warp] = l;
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, mw[w]);
    float L = 0.f, f[ATT_WARPS];
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = mw[w] == -INFINITY ? 0.f : expf(mw[w] - M);
        L += lw_sum[w] * f[w];
    }
    for (int64_t e = threadIdx.x; e < rkv; e += blockDim.x) {
        float a = 0.f;
        for (int w = 0; w < ATT_WARPS; w++) a += acc[w * rkv + e] * f[w];
        olat[(h * n + r) * rkv + e] = a / L;
    }
}

/* Expert e's view = base + e·stride (bytes; scale: + e·sstride). */
struct experts {
    const char *w;
    const uint8_t *scale;
    int64_t stride, sstride;
};

/* The step's routed slots grouped by expert on the device: order[] lists the slots expert by expert (any order within
 * an expert: every slot's sums are its own), tiles[] are (expert, first index into order, count ≤ MB) and ntile their
 * number. One block: atomics for the counts, then one warp lays out the experts 32 at a time (prefix sums of slots and
 * tiles by shuffles). */
constexpr int MB = 8; /* slots of one expert per warp pass: each weight is loaded once for MB inputs */
__global__ void moe_group_kernel(const int32_t *ids, int nk, int E, int32_t *order, int32_t *tiles, int32_t *ntile) {
    extern __shared__ int32_t cnt[]; /* [E] counts, then [E] cursors */
    int32_t *cur = cnt + E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < nk; i += blockDim.x) atomicAdd(&cnt[ids[i]], 1);
    __syncthreads();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        int at0 = 0, nt0 = 0;
        for (int e0 = 0; e0 < E; e0 += 32) {
            const int e = e0 + lane, c = e < E ? cnt[e] : 0, t = (c + MB - 1) / MB;
            int sc = c, st = t; /* inclusive prefix sums over the lanes */
            for (int o = 1; o < 32; o <<= 1) {
                const int a = __shfl_up_sync(0xffffffffu, sc, o), b = __shfl_up_sync(0xffffffffu, st, o);
                if (lane >= o) sc += a, st += b;
            }
            const int at = at0 + sc - c, nt = nt0 + st - t;
            if (e < E) {
                cur[e] = at;
                for (int i = 0; i < t; i++)
                    tiles[3 * (nt + i)] = e, tiles[3 * (nt + i) + 1] = at + i * MB,
                                      tiles[3 * (nt + i) + 2] = min(MB, c - i * MB);
            }
            at0 += __shfl_sync(0xffffffffu, sc, 31), nt0 += __shfl_sync(0xffffffffu, st, 31);
        }
        if (lane == 0) *ntile = nt0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nk; i += blockDim.x) order[atomicAdd(&cur[ids[i]], 1)] = i;
}

/* The warp's dots of row r of one expert's [R, C] matrix with the tile's inputs (MB at most, unused ones pointing at
 * a real row): 16-byte groups when vec (C % 4 == 0, aligned rows; one input alone is the decode step's case), else
 * lane-strided single elements. Reduced over the warp. */
template <int TYPE>
__device__ __forceinline__ void tile_dots(const void *w, const uint8_t *scale, int64_t r, int64_t C,
                                          const float *const *x, int nb, bool vec, float *acc) {
    if (vec && nb == 1) return row_dots<TYPE, 1, 8>(w, scale, r, C, x, acc);
    if (vec) return row_dots<TYPE, MB, 2>(w, scale, r, C, x, acc);
#pragma unroll
    for (int j = 0; j < MB; j++) acc[j] = 0.f;
    for (int64_t c = threadIdx.x & 31; c < C; c += 32) {
        const float wv = welem<TYPE>(w, scale, r, C, c);
#pragma unroll
        for (int j = 0; j < MB; j++)
            if (j < nb) acc[j] += wv * x[j][c];
    }
#pragma unroll
    for (int j = 0; j < MB; j++)
        for (int o = 16; o > 0; o >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
}

/* Tile t's expert and its slots (slot 0 in the unused places, so every input row they point at is real); returns the
 * tile's slot count. */
__device__ __forceinline__ int tile_slots(const int32_t *order, const int32_t *tiles, int t, int64_t *e, int32_t *slot) {
    const int j0 = tiles[3 * t + 1], nb = tiles[3 * t + 2];
    *e = tiles[3 * t];
    for (int j = 0; j < MB; j++) slot[j] = j < nb ? order[j0 + j] : 0;
    return nb;
}

/* One warp per (tile, row of the gate and up products): h[slot, r] = act(w1[e] x) ⊙ c(w3[e] x) for the tile's slots. */
template <int TYPE>
__global__ void moe_up_kernel(experts w1, experts w3, int64_t I, int64_t lat, int64_t k, const float *x,
                              const int32_t *order, const int32_t *tiles, const int32_t *ntile, glu_params gq,
                              bool vec, float *hbuf) {
    const int t = blockIdx.x;
    const int64_t r = (int64_t)blockIdx.y * DW + threadIdx.x / 32;
    if (t >= *ntile || r >= I) return;
    int64_t e;
    int32_t slot[MB];
    const int nb = tile_slots(order, tiles, t, &e, slot);
    const float *xs[MB];
    for (int j = 0; j < MB; j++) xs[j] = x + (slot[j] / k) * lat;
    float g[MB], u[MB];
    tile_dots<TYPE>(w1.w + e * w1.stride, w1.scale + e * w1.sstride, r, lat, xs, nb, vec, g);
    tile_dots<TYPE>(w3.w + e * w3.stride, w3.scale + e * w3.sstride, r, lat, xs, nb, vec, u);
    if ((threadIdx.x & 31) == 0)
        for (int j = 0; j < nb; j++) {
            float a, c, da, dc;
            glu_point(gq, g[j], u[j], a, c, da, dc);
            hbuf[(int64_t)slot[j] * I + r] = a * c;
        }
}

/* One warp per (tile, output row): u[slot, r] = w2[e][r] · h[slot] for the tile's slots. */
template <int TYPE>
__global__ void moe_down_kernel(experts w2, int64_t I, int64_t lat, const int32_t *order, const int32_t *tiles,
                                const int32_t *ntile, const float *hbuf, bool vec, float *u) {
    const int t = blockIdx.x;
    const int64_t r = (int64_t)blockIdx.y * DW + threadIdx.x / 32;
    if (t >= *ntile || r >= lat) return;
    int64_t e;
    int32_t slot[MB];
    const int nb = tile_slots(order, tiles, t, &e, slot);
    const float *hs[MB];
    for (int j = 0; j < MB; j++) hs[j] = hbuf + (int64_t)slot[j] * I;
    float acc[MB];
    tile_dots<TYPE>(w2.w + e * w2.stride, w2.scale + e * w2.sstride, r, I, hs, nb, vec, acc);
    if ((threadIdx.x & 31) == 0)
        for (int j = 0; j < nb; j++) u[(int64_t)slot[j] * lat + r] = acc[j];
}

/* out[t] = Σ_j topw[t, j] u[t·k + j] in slot order (the CPU's): one thread per output, blocks over (token, columns). */
constexpr int COMBINE_THREADS = 128;
__global__ void moe_combine_kernel(int64_t k, int64_t lat, const float *topw, const float *u, float *out) {
    const int64_t t = blockIdx.x, e = (int64_t)blockIdx.y * COMBINE_THREADS + threadIdx.x;
    if (e >= lat) return;
    float a = 0.f;
#pragma unroll 8
    for (int64_t j = 0; j < k; j++) a += topw[t * k + j] * u[(t * k + j) * lat + e];
    out[t * lat + e] = a;
}

/* Up to MANY products of one storage type in one launch: Y_i[j, r] (+)= W_i[r] · X_i[j]. Job i owns blocks b0[i] ..
 * b0[i+1]; one warp per weight row, vector loads decoded in registers, P inputs per pass (one alone when n is 1), each
 * input's sum in the same order whatever n is (batched rows equal solo rows). */
constexpr int MANY = 8;
struct gemv_jobs {
    int nj;
    int64_t n;
    int32_t b0[MANY + 1];
    int64_t R[MANY], C[MANY];
    const void *W[MANY];
    const uint8_t *S[MANY];
    const float *X[MANY];
    float *Y[MANY];
    int acc[MANY];
};

template <int TYPE, int P, int U>
__global__ void gemv_many_kernel(const gemv_jobs J) {
    int i = 0;
    while (i + 1 < J.nj && (int32_t)blockIdx.x >= J.b0[i + 1]) i++;
    const int64_t R = J.R[i], C = J.C[i], r = (int64_t)(blockIdx.x - J.b0[i]) * DW + threadIdx.x / 32;
    if (r >= R) return;
    for (int64_t j0 = 0; j0 < J.n; j0 += P) {
        const int nb = (int)min((int64_t)P, J.n - j0);
        const float *x[P];
        float s[P];
#pragma unroll
        for (int j = 0; j < P; j++) x[j] = J.X[i] + (j0 + (j < nb ? j : 0)) * C;
        if (nb == 1)
            row_dots<TYPE, 1, 8>(J.W[i], J.S[i], r, C, x, s);
        else
            row_dots<TYPE, P, U>(J.W[i], J.S[i], r, C, x, s);
        if ((threadIdx.x & 31) == 0)
            for (int j = 0; j < nb; j++) {
                float *y = J.Y[i] + (j0 + j) * R + r;
                *y = J.acc[i] ? *y + s[j] : s[j];
            }
    }
}

/* One warp per (weight row, head) for n (< GEMM_ROWS) inputs: the absorbed MLA's per-head products in one launch, each
 * head's inputs and outputs read and written in place (row j of head h at X + h·hx + j·ldx, Y + h·hy + j·ldy); vector
 * loads when vec (every head's rows and inputs aligned as row_dots needs). */
template <int TYPE>
__global__ void gemv_heads_kernel(const char *W, int64_t hstride, int64_t R, int64_t C, const float *X, int64_t ldx,
                                  int64_t hx, int64_t n, float *Y, int64_t ldy, int64_t hy, bool vec) {
    const int64_t h = blockIdx.y, r = (int64_t)blockIdx.x * DW + threadIdx.x / 32;
    if (r >= R) return;
    const void *w = W + h * hstride;
    for (int64_t j = 0; j < n; j++) {
        const float *x = X + h * hx + j * ldx;
        float s = 0.f;
        if (vec) {
            row_dots<TYPE, 1, 8>(w, nullptr, r, C, &x, &s);
        } else {
#pragma unroll 8
            for (int64_t c = threadIdx.x & 31; c < C; c += 32) s += welem<TYPE>(w, nullptr, r, C, c) * x[c];
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        }
        if ((threadIdx.x & 31) == 0) Y[h * hy + j * ldy + r] = s;
    }
}

/* ---------------------------------------------------------------- host side */

/* Float32 views: from GEMM_ROWS rows cuBLAS(Lt) in full fp32 (the step is a GEMM: a GEMV kernel would re-read each
 * weight row per 8 inputs), below it a warp per weight row with vector loads (decode is bandwidth-bound); bf16 and
 * MXFP4 views: the same warp-per-row products decoded in registers below DEQ_ROWS inputs, a GEMM on the decoded rows
 * from there (dequant_gemm), k3c_qmat_mul_cuda when a view is not aligned for vector loads. */
constexpr int64_t GEMM_ROWS = 16;

/* From this many inputs a bf16 / MXFP4 product is a GEMM: W decoded to fp32 in row chunks of at most DEQ_FLOATS
 * (exact: both formats are subsets of fp32), then cuBLAS(Lt) in full fp32, as a float32 view of the same values runs. */
constexpr int64_t DEQ_ROWS = 32;
constexpr int64_t DEQ_FLOATS = (int64_t)16 << 20;

/* Whether W's rows are laid out as welem4 reads them (C % 4 == 0, rows aligned for the type's vector loads). */
bool vec_view(const k3c_qmat *W) {
    const uintptr_t w = (uintptr_t)W->w;
    if (W->cols % 4) return false;
    if (W->type == K3C_QMAT_F32) return !(w & 15);
    if (W->type == K3C_QMAT_BF16) return !(w & 7);
    return W->type == K3C_QMAT_MXFP4 && !(w & 1);
}

/* Whether the fused GEMV takes the job: vector loads (vec_view, inputs 16-byte aligned), below GEMM_ROWS inputs for
 * float32 views (cuBLAS above) and below DEQ_ROWS for bf16 / MXFP4 ones. */
bool gemv_fits(const k3c_qmat_job &j) {
    if (j.n <= 0 || !vec_view(j.W) || (uintptr_t)j.X & 15) return false;
    return j.n < (j.W->type == K3C_QMAT_F32 ? GEMM_ROWS : DEQ_ROWS);
}

template <int TYPE>
void gemv_kernel_launch(const gemv_jobs &J) {
    const unsigned blocks = (unsigned)J.b0[J.nj];
    if (J.n >= GEMM_ROWS) /* a batch: more inputs per pass, so each weight row is read fewer times */
        gemv_many_kernel<TYPE, 8, 2><<<blocks, 32 * DW, 0, K3C_STREAM>>>(J);
    else
        gemv_many_kernel<TYPE, 4, 4><<<blocks, 32 * DW, 0, K3C_STREAM>>>(J);
}

int gemv_launch(const k3c_qmat_job *jobs, int nj, k3c_err *err) {
    gemv_jobs J{};
    J.nj = nj, J.n = jobs[0].n;
    for (int i = 0; i < nj; i++) {
        const k3c_qmat *W = jobs[i].W;
        J.R[i] = W->rows, J.C[i] = W->cols, J.W[i] = W->w, J.S[i] = W->scale, J.X[i] = jobs[i].X, J.Y[i] = jobs[i].Y;
        J.acc[i] = jobs[i].accumulate;
        J.b0[i + 1] = J.b0[i] + (int32_t)((W->rows + DW - 1) / DW);
    }
    const int type = jobs[0].W->type;
    if (type == K3C_QMAT_F32)
        gemv_kernel_launch<K3C_QMAT_F32>(J);
    else if (type == K3C_QMAT_BF16)
        gemv_kernel_launch<K3C_QMAT_BF16>(J);
    else
        gemv_kernel_launch<K3C_QMAT_MXFP4>(J);
    K3C_CU_LAUNCHED("engine gemv");
    return K3C_OK;
}

/* out[r, c] = W[r0 + r, c] for r < rows: every group of four decoded as the products read it. */
template <int TYPE>
__global__ void dequant_kernel(const void *w, const uint8_t *scale, int64_t r0, int64_t rows, int64_t C, float *out) {
    const int64_t C4 = C / 4, n4 = rows * C4;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x)
        ((float4 *)out)[i] = welem4<TYPE>(w, scale, r0 + i / C4, C, i % C4);
}

int dequant_launch(const k3c_qmat *W, int64_t r0, int64_t rows, float *out, k3c_err *err) {
    const int64_t n4 = rows * (W->cols / 4), blocks = (n4 + 255) / 256;
    const unsigned g = (unsigned)(blocks < 8192 ? blocks : 8192);
    if (W->type == K3C_QMAT_BF16)
        dequant_kernel<K3C_QMAT_BF16><<<g, 256, 0, K3C_STREAM>>>(W->w, W->scale, r0, rows, W->cols, out);
    else
        dequant_kernel<K3C_QMAT_MXFP4><<<g, 256, 0, K3C_STREAM>>>(W->w, W->scale, r0, rows, W->cols, out);
    K3C_CU_LAUNCHED("engine weight decode");
    return K3C_OK;
}

/* Y (+)= X·Wᵀ for a bf16 / MXFP4 view (vec_view) and n ≥ DEQ_ROWS inputs: rows of W decoded into stream-ordered scratch
 * (legal inside a captured graph), one fp32 GEMM per chunk, written into Y directly when one chunk holds W, else
 * through a [n, chunk] block copied (or added) into Y's columns. */
int dequant_gemm(k3c_cuda_backend *b, const k3c_qmat *W, const float *X, int64_t n, float *Y, int acc, k3c_err *err) {
    const int64_t R = W->rows, C = W->cols;
    int64_t rc = DEQ_FLOATS / (C + n);
    rc = rc >= R ? R : rc / 8 * 8;
    if (rc < 8) return k3c_qmat_mul_cuda(W, X, n, Y, acc, err); /* inputs beyond any chunk: the plain kernel */
    const bool whole = rc == R;
    const int64_t wfl = (rc * C + 63) / 64 * 64, yfl = whole ? 0 : n * rc;
    float *ws = nullptr;
    K3C_CU(cudaMallocAsync((void **)&ws, sizeof(float) * (size_t)(wfl + yfl), K3C_STREAM));
    int rc_ = K3C_OK;
    for (int64_t r0 = 0; r0 < R && !rc_; r0 += rc) {
        const int64_t rr = R - r0 < rc ? R - r0 : rc;
        rc_ = dequant_launch(W, r0, rr, ws, err);
        if (!rc_ && whole)
            rc_ = k3c_matmul_cuda(&b->cu, 0, 1, n, R, C, 1.0, X, ws, acc ? 1.0 : 0.0, Y, K3C_GEMM_FP32, err);
        else if (!rc_) {
            rc_ = k3c_matmul_cuda(&b->cu, 0, 1, n, rr, C, 1.0, X, ws, 0.0, ws + wfl, K3C_GEMM_FP32, err);
            if (!rc_) rc_ = k3c_copy2d_cuda(n, rr, ws + wfl, rr, Y + r0, R, acc, err);
        }
    }
    const cudaError_t e = cudaFreeAsync(ws, K3C_STREAM);
    if (!rc_ && e != cudaSuccess)
        rc_ = k3c_errf(err, K3C_EDEVICE, "engine weight decode: cudaFreeAsync: %s", cudaGetErrorString(e));
    return rc_;
}

/* One product through the path above that fits it. */
int cu_qmat_mul(void *ctx, const k3c_qmat *W, const float *X, int64_t n, float *Y, int acc, k3c_err *err) {
    if (k3c_qmat_check(W, "qmat_mul (cuda)", err)) return K3C_EINVAL;
    const k3c_qmat_job j = {W, X, n, Y, acc};
    if (gemv_fits(j)) return gemv_launch(&j, 1, err);
    if (W->type != K3C_QMAT_F32 && n >= DEQ_ROWS && vec_view(W))
        return dequant_gemm((k3c_cuda_backend *)ctx, W, X, n, Y, acc, err);
    if (W->type != K3C_QMAT_F32 || n <= 0) return k3c_qmat_mul_cuda(W, X, n, Y, acc, err);
    if (n >= GEMM_ROWS) {
        k3c_cuda_backend *b = (k3c_cuda_backend *)ctx;
        return k3c_matmul_cuda(&b->cu, 0, 1, n, W->rows, W->cols, 1.0, X, (const float *)W->w, acc ? 1.0 : 0.0, Y, 0,
                               err);
    }
    return k3c_qmat_mul_cuda(W, X, n, Y, acc, err);
}

/* Runs of consecutive jobs the fused GEMV takes (same n and storage type, at most MANY) go in one launch; the rest one
 * by one. */
int cu_qmat_mul_many(void *ctx, const k3c_qmat_job *jobs, int nj, k3c_err *err) {
    for (int i = 0; i < nj; i++) /* every view checked before any product runs */
        if (k3c_qmat_check(jobs[i].W, "qmat_mul_many (cuda)", err)) return K3C_EINVAL;
    for (int i = 0; i < nj;) {
        int e = i;
        while (e < nj && e - i < MANY && gemv_fits(jobs[e]) && jobs[e].n == jobs[i].n &&
               jobs[e].W->type == jobs[i].W->type)
            e++;
        int rc = e > i ? gemv_launch(jobs + i, e - i, err)
                       : cu_qmat_mul(ctx, jobs[i].W, jobs[i].X, jobs[i].n, jobs[i].Y, jobs[i].accumulate, err);
        if (rc) return rc;
        i = e > i ? e : i + 1;
    }
    return K3C_OK;
}

size_t cu_heads_ws(const k3c_qmat *W, int64_t n) { return sizeof(float) * (size_t)(n * (W->rows + W->cols)); }

/* Few rows and evenly spaced float32 / bf16 heads (uk_t is one block, uv row views of kv_b): one launch. Otherwise each
 * head through a dense block in ws, as the CPU table does. */
int cu_qmat_mul_heads(void *ctx, const k3c_qmat *W, int64_t heads, const float *X, int64_t ldx, int64_t hx, int64_t n,
                      float *Y, int64_t ldy, int64_t hy, void *ws, k3c_err *err) {
    if (n <= 0 || heads <= 0) return K3C_OK;
    const int64_t R = W->rows, C = W->cols;
    const int64_t hs = heads > 1 ? (const char *)W[1].w - (const char *)W[0].w : 0;
    bool one = n < GEMM_ROWS && (W->type == K3C_QMAT_F32 || W->type == K3C_QMAT_BF16) && heads < 65536;
    for (int64_t h = 1; one && h < heads; h++)
        one = W[h].type == W->type && W[h].rows == R && W[h].cols == C && (const char *)W[h].w == (const char *)W->w + h * hs;
    if (one) {
        const dim3 grid((unsigned)((R + DW - 1) / DW), (unsigned)heads);
        /* every head's rows as welem4 reads them (the second head's start aligned makes the stride so) */
        const bool vec = vec_view(W) && (heads == 1 || vec_view(&W[1])) && !((uintptr_t)X & 15) && ldx % 4 == 0 &&
                         hx % 4 == 0;
        if (W->type == K3C_QMAT_F32)
            gemv_heads_kernel<K3C_QMAT_F32><<<grid, 32 * DW, 0, K3C_STREAM>>>((const char *)W->w, hs, R, C, X, ldx, hx, n,
                                                                              Y, ldy, hy, vec);
        else
            gemv_heads_kernel<K3C_QMAT_BF16><<<grid, 32 * DW, 0, K3C_STREAM>>>((const char *)W->w, hs, R, C, X, ldx, hx,
                                                                               n, Y, ldy, hy, vec);
        K3C_CU_LAUNCHED("engine per-head products");
        return K3C_OK;
    }
    float *xs = (float *)ws, *ys = xs + n * C;
    for (int64_t h = 0; h < heads; h++) {
        int rc = k3c_copy2d_cuda(n, C, X + h * hx, ldx, xs, C, 0, err);
        if (!rc) rc = cu_qmat_mul(ctx, &W[h], xs, n, ys, 0, err);
        if (!rc) rc = k3c_copy2d_cuda(n, R, ys, R, Y + h * hy, ldy, 0, err);
        if (rc) return rc;
    }
    return K3C_OK;
}

int cu_embed(const k3c_qmat *E, const int32_t *ids, int64_t n, float *y, k3c_err *err) {
    if (n <= 0) return K3C_OK;
    if (E->type == K3C_QMAT_F32)
        embed_kernel<K3C_QMAT_F32><<<(unsigned)n, 256, 0, K3C_STREAM>>>(E->w, nullptr, E->cols, ids, y);
    else if (E->type == K3C_QMAT_BF16)
        embed_kernel<K3C_QMAT_BF16><<<(unsigned)n, 256, 0, K3C_STREAM>>>(E->w, nullptr, E->cols, ids, y);
    else if (E->type == K3C_QMAT_MXFP4)
        embed_kernel<K3C_QMAT_MXFP4><<<(unsigned)n, 256, 0, K3C_STREAM>>>(E->w, E->scale, E->cols, ids, y);
    else
        return k3c_errf(err, K3C_EUNSUPPORTED, "engine embed (cuda): storage type %d", E->type);
    K3C_CU_LAUNCHED("engine embed");
    return K3C_OK;
}

int cu_qkv_conv(const k3c_dec_batch *b, const k3c_dec_dims *d, int64_t off, const float *const x[3],
                const float *const w[3], float *const y[3], k3c_err *err) {
    const int64_t P = d->H * d->dk;
    if (d->W < 1 || d->W > MAXW) return k3c_errf(err, K3C_EINVAL, "engine conv (cuda): kernel %lld", (long long)d->W);
    if (d->dk < 1 || d->dk > 1024 || (d->dk < 32 ? (d->dk & (d->dk - 1)) : d->dk % 32))
        return k3c_errf(err, K3C_EUNSUPPORTED, "engine conv (cuda): head dim %lld (a power of two below 32 or a multiple "
                        "of 32 up to 1024)", (long long)d->dk);
    const qkv_args a = {{x[0], x[1], x[2]}, {w[0], w[1], w[2]}, {y[0], y[1], y[2]}};
    qkv_conv_kernel<<<dim3((unsigned)d->H, (unsigned)b->nseg, 3), (unsigned)d->dk, 0, K3C_STREAM>>>(b->dsegs, off, P,
                                                                                                  (int)d->W, a);
    K3C_CU_LAUNCHED("engine conv");
    return K3C_OK;
}

size_t cu_kda_ws(const k3c_dec_dims *, int64_t) { return 0; }

/* Decode and prefill alike run the recurrence (any dk of 16, 32, 64, 128; the chunk kernels take dk 64/128 only). */
int cu_kda(const k3c_dec_batch *b, const k3c_dec_dims *d, int64_t off, const float *q, const float *k, const float *v,
           const float *g, const float *beta, double, float *o, void *, k3c_err *err) {
    const dim3 grid((unsigned)d->H, (unsigned)b->nseg, (unsigned)((d->dk + 31) / 32));
    const float scale = (float)(1.0 / sqrt((double)d->dk));
    const int H = (int)d->H;
    switch (d->dk) {
    case 16: kda_kernel<16><<<grid, 128, 0, K3C_STREAM>>>(b->dsegs, off, q, k, v, g, beta, o, H, scale); break;
    case 32: kda_kernel<32><<<grid, 128, 0, K3C_STREAM>>>(b->dsegs, off, q, k, v, g, beta, o, H, scale); break;
    case 64: kda_kernel<64><<<grid, 128, 0, K3C_STREAM>>>(b->dsegs, off, q, k, v, g, beta, o, H, scale); break;
    case 128: kda_kernel<128><<<grid, 128, 0, K3C_STREAM>>>(b->dsegs, off, q, k, v, g, beta, o, H, scale); break;
    default:
        return k3c_errf(err, K3C_EUNSUPPORTED, "engine KDA (cuda): dk = %lld (16, 32, 64 or 128)", (long long)d->dk);
    }
    K3C_CU_LAUNCHED("engine kda");
    return K3C_OK;
}

int cu_cache_put(const k3c_dec_batch *b, const k3c_dec_dims *d, int j, const float *cn, const float *kva,
                 k3c_err *err) {
    cache_put_kernel<<<(unsigned)b->n, 128, 0, K3C_STREAM>>>(b->dsegs, b->row_seg, j, d->rkv, d->rope, cn, kva);
    K3C_CU_LAUNCHED("engine cache_put");
    return K3C_OK;
}

size_t cu_attend_ws(const k3c_dec_dims *) { return 0; }

int cu_attend(const k3c_dec_batch *b, const k3c_dec_dims *d, int j, const float *qlat, float scale, float *olat, void *,
              k3c_err *err) {
    const size_t smem = sizeof(float) * (size_t)(d->rkv + d->rope + ATT_WARPS * d->rkv + 2 * ATT_WARPS);
    if (smem > 48 * 1024)
        return k3c_errf(err, K3C_EUNSUPPORTED, "engine attention (cuda): latent width %lld", (long long)d->rkv);
    attend_kernel<<<dim3((unsigned)b->n, (unsigned)d->Hm), 32 * ATT_WARPS, smem, K3C_STREAM>>>(
        b->dsegs, b->row_seg, j, b->n, d->rkv, d->rope, qlat, scale, olat);
    K3C_CU_LAUNCHED("engine attend");
    return K3C_OK;
}

/* The experts of one matrix as base + e·stride; K3C_EUNSUPPORTED when the views are not evenly spaced (the model's
 * stacked parameters and an uploaded checkpoint are). */
int experts_of(const k3c_qmat *v, int64_t E, experts *x, k3c_err *err) {
    const char *w0 = (const char *)v[0].w;
    x->w = w0, x->scale = v[0].scale;
    x->stride = E > 1 ? (const char *)v[1].w - w0 : 0;
    x->sstride = E > 1 && v[0].scale ? v[1].scale - v[0].scale : 0;
    for (int64_t e = 1; e < E; e++)
        if (v[e].type != v[0].type || (const char *)v[e].w != w0 + e * x->stride ||
            (v[0].scale && v[e].scale != v[0].scale + e * x->sstride))
            return k3c_errf(err, K3C_EUNSUPPORTED, "engine experts (cuda): expert %lld is not evenly spaced",
                            (long long)e);
    return K3C_OK;
}

/* h [n·k, I], u [n·k, lat], then order [n·k], tiles [3 · (n·k/MB + E)], ntile */
size_t cu_moe_ws(const k3c_dec_moe *m, int64_t n) {
    const int64_t nk = n * m->k;
    return sizeof(float) * (size_t)(nk * (m->inter + m->lat)) +
           sizeof(int32_t) * (size_t)(nk + 3 * (nk / MB + m->E) + 1);
}

/* 16-byte groups need C % 4 == 0 and every row start aligned (float32 16 bytes, bf16 8, MXFP4 2). */
bool aligned_rows(const experts &x, int64_t C, int type) {
    const int64_t a = type == K3C_QMAT_F32 ? 16 : type == K3C_QMAT_BF16 ? 8 : 2;
    const int64_t row = type == K3C_QMAT_F32 ? 4 * C : type == K3C_QMAT_BF16 ? 2 * C : C / 2;
    return C % 4 == 0 && (uintptr_t)x.w % a == 0 && x.stride % a == 0 && row % a == 0;
}

template <int TYPE>
void moe_launch(const k3c_dec_moe *m, const experts &w1, const experts &w3, const experts &w2, glu_params gq,
                const float *x, int64_t n, const int32_t *order, const int32_t *tiles, const int32_t *ntile,
                float *hbuf, float *u) {
    const unsigned max_tiles = (unsigned)(n * m->k / MB + m->E);
    const bool vec_up = aligned_rows(w1, m->lat, TYPE) && aligned_rows(w3, m->lat, TYPE) && (uintptr_t)x % 16 == 0;
    const bool vec_down = aligned_rows(w2, m->inter, TYPE) && (uintptr_t)hbuf % 16 == 0;
    moe_up_kernel<TYPE><<<dim3(max_tiles, (unsigned)((m->inter + DW - 1) / DW)), 32 * DW, 0, K3C_STREAM>>>(
        w1, w3, m->inter, m->lat, m->k, x, order, tiles, ntile, gq, vec_up, hbuf);
    moe_down_kernel<TYPE><<<dim3(max_tiles, (unsigned)((m->lat + DW - 1) / DW)), 32 * DW, 0, K3C_STREAM>>>(
        w2, m->inter, m->lat, order, tiles, ntile, hbuf, vec_down, u);
}

int cu_moe(const k3c_dec_moe *m, const float *x, int64_t n, const int32_t *ids, const float *topw, float *out, void *ws,
           k3c_err *err) {
    experts w1, w3, w2;
    glu_params gq{};
    if (experts_of(m->w1, m->E, &w1, err) || experts_of(m->w3, m->E, &w3, err) || experts_of(m->w2, m->E, &w2, err))
        return K3C_EUNSUPPORTED;
    if (glu_params_of(&m->act, &gq, "engine experts (cuda)", err)) return K3C_EINVAL;
    if (m->w3[0].type != m->w1[0].type || m->w2[0].type != m->w1[0].type)
        return k3c_errf(err, K3C_EUNSUPPORTED, "engine experts (cuda): mixed storage types");
    const int64_t nk = n * m->k;
    if (m->E > 4096) return k3c_errf(err, K3C_EUNSUPPORTED, "engine experts (cuda): %lld experts", (long long)m->E);
    float *hbuf = (float *)ws, *u = hbuf + nk * m->inter;
    int32_t *order = (int32_t *)(u + nk * m->lat), *tiles = order + nk, *ntile = tiles + 3 * (nk / MB + m->E);
    moe_group_kernel<<<1, 1024, sizeof(int32_t) * (size_t)(2 * m->E), K3C_STREAM>>>(ids, (int)nk, (int)m->E, order,
                                                                                    tiles, ntile);
    K3C_CU_LAUNCHED("engine experts grouping");
    switch (m->w1[0].type) {
    case K3C_QMAT_F32: moe_launch<K3C_QMAT_F32>(m, w1, w3, w2, gq, x, n, order, tiles, ntile, hbuf, u); break;
    case K3C_QMAT_BF16: moe_launch<K3C_QMAT_BF16>(m, w1, w3, w2, gq, x, n, order, tiles, ntile, hbuf, u); break;
    default: moe_launch<K3C_QMAT_MXFP4>(m, w1, w3, w2, gq, x, n, order, tiles, ntile, hbuf, u); break;
    }
    K3C_CU_LAUNCHED("engine experts");
    moe_combine_kernel<<<dim3((unsigned)n, (unsigned)((m->lat + COMBINE_THREADS - 1) / COMBINE_THREADS)),
                         COMBINE_THREADS, 0, K3C_STREAM>>>(m->k, m->lat, topw, u, out);
    K3C_CU_LAUNCHED("engine experts combine");
    return K3C_OK;
}

/* Captured steps, one per key (the batch's row count); a key whose capture failed runs directly from then on. */
constexpr int MAX_GRAPHS = 64;
struct graph_set {
    int n;
    int64_t key[MAX_GRAPHS];
    cudaGraphExec_t ex[MAX_GRAPHS]; /* nullptr: capture failed, run directly */
};

void *cu_graph_open(void) { return calloc(1, sizeof(graph_set)); }
void cu_graph_close(void *g) {
    graph_set *s = (graph_set *)g;
    if (!s) return;
    for (int i = 0; i < s->n; i++)
        if (s->ex[i]) cudaGraphExecDestroy(s->ex[i]);
    free(s);
}

int cu_run(void *g, int64_t key, int (*fn)(void *, k3c_err *), void *arg, k3c_err *err) {
    graph_set *s = (graph_set *)g;
    if (!s || key <= 0) return fn(arg, err);
    for (int i = 0; i < s->n; i++)
        if (s->key[i] == key) {
            if (!s->ex[i]) return fn(arg, err);
            K3C_CU(cudaGraphLaunch(s->ex[i], K3C_STREAM));
            return K3C_OK;
        }
    if (s->n == MAX_GRAPHS) return fn(arg, err);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t ex = nullptr;
    K3C_CU(cudaStreamBeginCapture(K3C_STREAM, cudaStreamCaptureModeThreadLocal));
    int rc = fn(arg, err);
    cudaError_t e = cudaStreamEndCapture(K3C_STREAM, &graph);
    if (!rc && e == cudaSuccess && graph) e = cudaGraphInstantiate(&ex, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError(); /* a failed capture leaves its error behind */
    s->key[s->n] = key, s->ex[s->n] = (!rc && e == cudaSuccess) ? ex : nullptr;
    s->n++;
    if (!s->ex[s->n - 1]) return fn(arg, err); /* the fallback: the same step, enqueued directly */
    K3C_CU(cudaGraphLaunch(ex, K3C_STREAM));
    return K3C_OK;
}

int cu_glu(const k3c_glu_sizes *s, const float *gate, const float *up, float *h, k3c_err *err) {
    return k3c_glu_fwd_cuda(s, gate, up, h, err);
}

} // namespace

extern "C" const k3c_dec_ops k3c_dec_cuda = {
    "cuda",    cu_qmat_mul, cu_qmat_mul_many, cu_heads_ws, cu_qmat_mul_heads, cu_embed, cu_qkv_conv, cu_kda_ws,     cu_kda,         cu_cache_put, cu_attend_ws,
    cu_attend, cu_moe_ws,   cu_moe,   cu_glu,  cu_graph_open, cu_graph_close, cu_run,
};
