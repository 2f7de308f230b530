/* moe.cu — fp32 CUDA twin of the routed-expert MoE op: the dispatch plan, gather / combine and the per-expert GLU MLPs
 * through cuBLASLt, forward and backward. Implements docs/MODEL.md §9.2 (u = Σ p_i E_i(z)); ops/moe.h. */
#include <limits.h>
#include <stdint.h>

#include <vector>

#include "base/carve.h"
#include "cuda/glu.cuh"
#include "cuda/moe_grouped.cuh"

using k3c_cu::bf16;
using k3c_cu::store_as;

namespace {

__device__ __forceinline__ float block_sum(float v, float *red) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads(); /* red may still be read from a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.f;
    for (int w = 0; w < nw; w++) s += red[w]; /* fixed order: deterministic */
    return s;
}

/* ================================================================ plan: a stable counting sort over chunks
 * Three passes. plan_count: each block counts its chunk of PLAN_CHUNK slots per expert (cnt[b·E + e]) and records the
 * first bad id. plan_scan: expert-major prefix sums give offsets[e] and each (block, expert) its first row, so the
 * rows of an expert keep ascending slot order across blocks. plan_place: each block walks its chunk in order; inside
 * a warp __match_any gives each slot its rank among same-expert slots, and warps take their expert cursors in warp
 * order. An id outside [−1, E) leaves offsets[0] = −1 − (first bad slot). */
constexpr int PLAN_CHUNK = 1024, PLAN_THREADS = 256;
constexpr int PLAN_NO_BAD = 0x7f7f7f7f; /* what cudaMemsetAsync(0x7f) leaves: above every slot index */

__global__ void plan_count_kernel(int S, int E, const int32_t *ids, int *cnt, int *bad) {
    const int b = blockIdx.x, end = min(S, (b + 1) * PLAN_CHUNK);
    for (int i = b * PLAN_CHUNK + threadIdx.x; i < end; i += blockDim.x) {
        const int id = ids[i];
        if (id < -1 || id >= E)
            atomicMin(bad, i);
        else if (id >= 0)
            atomicAdd(&cnt[(size_t)b * E + id], 1);
    }
}

/* cnt[b·E + e] becomes the first row of block b's slots of expert e. */
__global__ void plan_scan_kernel(int E, int B, int *cnt, const int *bad, long long *off) {
    if (*bad != PLAN_NO_BAD) {
        if (threadIdx.x == 0) off[0] = -1 - (long long)*bad;
        return;
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x) { /* per expert: blocks' counts → offsets within the expert */
        int run = 0;
        for (int b = 0; b < B; b++) {
            const int c = cnt[(size_t)b * E + e];
            cnt[(size_t)b * E + e] = run, run += c;
        }
        off[e + 1] = run;
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* E is at most a few thousand: a serial scan of the totals */
        off[0] = 0;
        for (int e = 0; e < E; e++) off[e + 1] += off[e];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        for (int b = 0; b < B; b++) cnt[(size_t)b * E + e] += (int)off[e];
}

__global__ void plan_place_kernel(int S, int E, const int32_t *ids, int *cur, const int *bad, int32_t *perm,
                                  int32_t *pos) {
    if (*bad != PLAN_NO_BAD) return;
    const int b = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const int end = min(S, (b + 1) * PLAN_CHUNK);
    int *c = cur + (size_t)b * E; /* this block's cursors, touched by no other block */
    for (int base = b * PLAN_CHUNK; base < end; base += blockDim.x) {
        const int i = base + tid, id = i < end ? ids[i] : -2;
        const unsigned mask = __match_any_sync(0xffffffffu, id);
        const int leader = __ffs(mask) - 1, rank = __popc(mask & ((1u << lane) - 1));
        for (int w = 0; w < nw; w++) {
            if (warp == w) {
                int r = 0;
                if (lane == leader && id >= 0) r = c[id], c[id] = r + __popc(mask);
                r = __shfl_sync(0xffffffffu, r, leader);
                if (id >= 0)
                    perm[r + rank] = i, pos[i] = r + rank;
                else if (i < end)
                    pos[i] = -1;
            }
            __syncthreads();
        }
    }
}

/* Padded rows: expert e's rows start at a multiple of 64 rows (pstart), so every per-expert GEMM operand is 256-byte
 * aligned whatever D and I are (cuBLASLt's default alignment assumption). ppos[slot] / pperm[prow] as pos / perm;
 * padding rows keep pperm = −1. */
__global__ void pad_map_kernel(int S, const int32_t *ids, const int32_t *pos, const int32_t *delta, int32_t *ppos,
                               int32_t *pperm) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= S) return;
    const int r = pos[i];
    if (r < 0) {
        ppos[i] = -1;
        return;
    }
    const int pr = r + delta[ids[i]];
    ppos[i] = pr, pperm[pr] = i;
}

/* ================================================================ gather / combine / GLU */
/* xperm[row] = x[perm[row] / k] (float, or rounded to bf16 for the grouped products); rows with perm < 0 (padding) are
 * left alone. One block per row. */
template <typename T> __global__ void gather_kernel(int k, int64_t D, const int32_t *perm, const float *x, T *xp) {
    const int64_t row = blockIdx.x;
    const int s = perm[row];
    if (s < 0) return;
    const float *src = x + (int64_t)(s / k) * D;
    T *dst = xp + row * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) store_as(dst + d, src[d]);
}

__device__ __forceinline__ void store8(float *p, float4 a, float4 b) {
    reinterpret_cast<float4 *>(p)[0] = a, reinterpret_cast<float4 *>(p)[1] = b;
}
__device__ __forceinline__ void store8(bf16 *p, float4 a, float4 b) {
    const __nv_bfloat162 v[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                                 __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
    *reinterpret_cast<uint4 *>(p) = *reinterpret_cast<const uint4 *>(v);
}

/* The same, 8 values per thread and step (two 16-byte loads, one 16- or 32-byte store): the scalar kernel's 2-byte
 * stores held it at a fraction of the memory bandwidth (ncu). */
template <typename T> __global__ void gather8_kernel(int k, int64_t D, const int32_t *perm, const float *x, T *xp) {
    const int64_t row = blockIdx.x;
    const int s = perm[row];
    if (s < 0) return;
    const float4 *src = reinterpret_cast<const float4 *>(x + (int64_t)(s / k) * D);
    T *dst = xp + row * D;
    for (int64_t d = threadIdx.x; d < D / 8; d += blockDim.x) store8(dst + 8 * d, src[2 * d], src[2 * d + 1]);
}

/* gather_kernel or, where the rows allow 16-byte accesses, gather8_kernel. */
template <typename T> void gather_rows(int k, int64_t D, int64_t rows, const int32_t *perm, const float *x, T *xp) {
    if (rows <= 0) return;
    if (D % 8 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)xp % 16 == 0)
        gather8_kernel<<<(unsigned)rows, 128, 0, K3C_STREAM>>>(k, D, perm, x, xp);
    else
        gather_kernel<<<(unsigned)rows, 128, 0, K3C_STREAM>>>(k, D, perm, x, xp);
}

/* y[t] (accumulate = 0: overwritten; 1: added to) = Σ_j w[t, j] · yp[pos[t·k + j]] in slot order; w = NULL: weight 1. */
__global__ void combine_kernel(int k, int64_t D, const int32_t *pos, const float *w, const float *yp, float *y,
                               int accumulate) {
    const int64_t t = blockIdx.x;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < k; j++) {
            const int r = pos[t * k + j];
            if (r < 0) continue;
            const float v = yp[(int64_t)r * D + d];
            acc += w ? w[t * k + j] * v : v;
        }
        y[t * D + d] = accumulate ? y[t * D + d] + acc : acc;
    }
}

/* dx[t] += dxp[pos[t·k + j]] for t's live slots, added one slot at a time in slot order (the CPU op's rounding). */
__global__ void gather_bwd_kernel(int k, int64_t D, const int32_t *pos, const float *dxp, float *dx) {
    const int64_t t = blockIdx.x;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        float v = dx[t * D + d];
        for (int j = 0; j < k; j++) {
            const int r = pos[t * k + j];
            if (r >= 0) v += dxp[(int64_t)r * D + d];
        }
        dx[t * D + d] = v;
    }
}

/* One block per slot i (row r = pos[i]): dyp[r] = w[i]·dy[i / k]; dw[i] += ⟨dy[i / k], yp[r]⟩ (fixed-order block sum). */
__global__ void combine_bwd_kernel(int k, int64_t D, const int32_t *pos, const float *w, const float *yp,
                                   const float *dy, float *dyp, float *dw) {
    __shared__ float red[32];
    const int64_t i = blockIdx.x;
    const int r = pos[i];
    if (r < 0) return;
    const float *g = dy + (i / k) * D, *o = yp + (int64_t)r * D;
    const float p = dyp ? w[i] : 0.f;
    float dot = 0.f;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        if (dw) dot += g[d] * o[d];
        if (dyp) dyp[(int64_t)r * D + d] = p * g[d];
    }
    if (!dw) return;
    dot = block_sum(dot, red);
    if (threadIdx.x == 0) dw[i] += dot;
}

/* The fused middle of the expert backward, one block per padded row r of slot s = pperm[r] (p = topk_w[s]):
 *   dtopk_w[s] += ⟨dH_r, h_r⟩ with h = glu(G, U);  H_r = p·h_r (W2's effective input);
 *   dG_r = p·dH_r ⊙ c ⊙ act';  dU_r = p·dH_r ⊙ act ⊙ c'.
 * T = float: dG is dH itself (in place), rows of I; T = bf16 (the grouped products): H, and dG | dU side by side in
 * rows of ldd = 2I, so that one product forms dX = [dG dU]·[W1; W3]. */
template <typename T>
__global__ void expert_mid_bwd_kernel(int64_t I, glu_params q, const int32_t *pperm, const float *topk_w,
                                      const float *G, const float *U, T *H, const float *dH, T *dG, T *dU, int64_t ldd,
                                      float *dtopk_w) {
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    const int s = pperm[r];
    if (s < 0) return;
    const float p = topk_w[s];
    const float *g = G + r * I, *u = U + r * I, *dh = dH + r * I;
    T *h = H + r * I, *dg = dG + r * ldd, *du = dU + r * ldd;
    float dot = 0.f;
    for (int64_t i = threadIdx.x; i < I; i += blockDim.x) {
        float a, c, da, dc;
        glu_point(q, g[i], u[i], a, c, da, dc);
        const float d = dh[i];
        dot += d * a * c;
        store_as(h + i, p * (a * c));
        store_as(dg + i, p * d * c * da);
        store_as(du + i, p * d * a * dc);
    }
    dot = block_sum(dot, red);
    if (threadIdx.x == 0 && dtopk_w) dtopk_w[s] += dot;
}

unsigned grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

} // namespace

extern "C" int k3c_moe_plan_cuda(int64_t tokens, int64_t top_k, int64_t experts, const int32_t *topk_ids,
                                 int64_t *offsets, int32_t *perm, int32_t *pos, int64_t *offsets_host, k3c_err *err) {
    if (tokens < 0 || top_k < 1 || experts < 1 || experts > INT32_MAX || tokens * top_k >= INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "moe_plan_cuda: bad sizes T = %lld, k = %lld, E = %lld (T·k must be < 2^31)",
                        (long long)tokens, (long long)top_k, (long long)experts);
    const int S = (int)(tokens * top_k), E = (int)experts;
    const int B = S > 0 ? (S + PLAN_CHUNK - 1) / PLAN_CHUNK : 0;
    const size_t cnt_bytes = (size_t)B * E * sizeof(int);
    void *scratch = NULL; /* [B·E] counts, then the bad-slot flag */
    K3C_CU(cudaMallocAsync(&scratch, cnt_bytes + sizeof(int), K3C_STREAM));
    int *cnt = (int *)scratch, *bad = (int *)((char *)scratch + cnt_bytes);
    K3C_CU(cudaMemsetAsync(cnt, 0, cnt_bytes, K3C_STREAM));
    K3C_CU(cudaMemsetAsync(bad, 0x7f, sizeof(int), K3C_STREAM));
    if (B) plan_count_kernel<<<B, PLAN_THREADS, 0, K3C_STREAM>>>(S, E, topk_ids, cnt, bad);
    plan_scan_kernel<<<1, 1024, 0, K3C_STREAM>>>(E, B, cnt, bad, (long long *)offsets);
    if (B) plan_place_kernel<<<B, PLAN_THREADS, 0, K3C_STREAM>>>(S, E, topk_ids, cnt, bad, perm, pos);
    K3C_CU_LAUNCHED("moe_plan");
    K3C_CU(cudaFreeAsync(scratch, K3C_STREAM));
    std::vector<int64_t> tmp;
    if (!offsets_host) tmp.resize((size_t)E + 1), offsets_host = tmp.data();
    K3C_CU(
        cudaMemcpyAsync(offsets_host, offsets, ((size_t)E + 1) * sizeof(int64_t), cudaMemcpyDeviceToHost, K3C_STREAM));
    K3C_CU(cudaStreamSynchronize(K3C_STREAM));
    if (offsets_host[0] < 0) {
        const int64_t i = -1 - offsets_host[0];
        return k3c_errf(err, K3C_EINVAL, "moe_plan_cuda: expert id at token %lld, slot %lld is outside [-1, %lld)",
                        (long long)(i / top_k), (long long)(i % top_k), (long long)experts);
    }
    return 0;
}

extern "C" int k3c_moe_gather_cuda(int64_t rows, int64_t top_k, int64_t dim, const int32_t *perm, const float *x,
                                   float *xperm, k3c_err *err) {
    if (rows < 0 || top_k < 1 || dim < 1 || rows > INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "moe_gather_cuda: bad sizes");
    if (rows == 0) return 0;
    gather_rows((int)top_k, dim, rows, perm, x, xperm);
    K3C_CU_LAUNCHED("moe_gather");
    return 0;
}

extern "C" int k3c_moe_combine_cuda(int64_t tokens, int64_t top_k, int64_t dim, const int32_t *pos, const float *w,
                                    const float *yperm, float *y, k3c_err *err) {
    if (tokens < 0 || top_k < 1 || dim < 1 || tokens > INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "moe_combine_cuda: bad sizes");
    if (tokens == 0) return 0;
    combine_kernel<<<(unsigned)tokens, 128, 0, K3C_STREAM>>>((int)top_k, dim, pos, w, yperm, y, 0);
    K3C_CU_LAUNCHED("moe_combine");
    return 0;
}

extern "C" int k3c_moe_gather_bwd_cuda(int64_t tokens, int64_t top_k, int64_t dim, const int32_t *pos,
                                       const float *dxperm, float *dx, k3c_err *err) {
    if (tokens < 0 || top_k < 1 || dim < 1 || tokens > INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "moe_gather_bwd_cuda: bad sizes");
    if (tokens == 0) return 0;
    gather_bwd_kernel<<<(unsigned)tokens, 128, 0, K3C_STREAM>>>((int)top_k, dim, pos, dxperm, dx);
    K3C_CU_LAUNCHED("moe_gather_bwd");
    return 0;
}

extern "C" int k3c_moe_combine_bwd_cuda(int64_t tokens, int64_t top_k, int64_t dim, const int32_t *pos, const float *w,
                                        const float *yperm, const float *dy, float *dyperm, float *dw, k3c_err *err) {
    if (tokens < 0 || top_k < 1 || dim < 1 || tokens * top_k > INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "moe_combine_bwd_cuda: bad sizes");
    if (tokens == 0 || (!dyperm && !dw)) return 0;
    combine_bwd_kernel<<<(unsigned)(tokens * top_k), 128, 0, K3C_STREAM>>>((int)top_k, dim, pos, w, yperm, dy, dyperm,
                                                                           dw);
    K3C_CU_LAUNCHED("moe_combine_bwd");
    return 0;
}

/* ================================================================ the routed-expert op */
namespace {

const int64_t ROW_ALIGN = 64; /* rows; 64 floats = 256 bytes */

/* 256-byte pieces (base/carve.h): base NULL measures; otherwise base holds the measured size, so the cap is not
 * checked. */
k3c_carver carver_of(void *base) { return base ? k3c_carver_at(base, SIZE_MAX, 256) : k3c_carver_measure(256); }

/* S = T·k slots, Sp = S + 64·E padded rows (each expert's start rounded up to 64 rows). */
struct moe_dims {
    int64_t T, k, D, I, E, S, Sp;
};
moe_dims dims_of(const k3c_moe_sizes *s) {
    moe_dims m = {s->tokens, s->top_k, s->dim, s->inter, s->experts, s->tokens * s->top_k, 0};
    m.Sp = m.S + ROW_ALIGN * m.E;
    return m;
}

struct moe_saved_d {
    int64_t *offsets; /* [E + 1] (unpadded, as the CPU plan) */
    int32_t *ppos;    /* [S] slot → padded row or −1 */
    int32_t *pperm;   /* [Sp] padded row → slot or −1 */
    float *G, *U;     /* [Sp, I] */
};
struct moe_scratch_d {
    int32_t *perm, *pos, *delta; /* the plain plan [S], [S]; per-expert row shift [E] */
    int32_t *groups;             /* the grouped products' table [3E + 1] (moe_grouped.cuh k3c_moe_groups) */
    float *X, *Y;                /* [Sp, D] */
    float *H, *dH, *dU;          /* [Sp, I] */
};

size_t saved_layout(const moe_dims &m, void *base, moe_saved_d *sv) {
    k3c_carver c = carver_of(base);
    moe_saved_d t;
    if (!sv) sv = &t;
    sv->offsets = K3C_CARVE(&c, int64_t, m.E + 1);
    sv->ppos = K3C_CARVE(&c, int32_t, m.S);
    sv->pperm = K3C_CARVE(&c, int32_t, m.Sp);
    sv->G = K3C_CARVE(&c, float, m.Sp *m.I);
    sv->U = K3C_CARVE(&c, float, m.Sp *m.I);
    return c.off;
}
size_t scratch_layout(const moe_dims &m, void *base, moe_scratch_d *sc) {
    k3c_carver c = carver_of(base);
    moe_scratch_d t;
    if (!sc) sc = &t;
    sc->perm = K3C_CARVE(&c, int32_t, m.S);
    sc->pos = K3C_CARVE(&c, int32_t, m.S);
    sc->delta = K3C_CARVE(&c, int32_t, m.E);
    sc->groups = K3C_CARVE(&c, int32_t, 3 * m.E + 1);
    sc->X = K3C_CARVE(&c, float, m.Sp *m.D);
    sc->Y = K3C_CARVE(&c, float, m.Sp *m.D);
    sc->H = K3C_CARVE(&c, float, m.Sp *m.I);
    sc->dH = K3C_CARVE(&c, float, m.Sp *m.I);
    sc->dU = K3C_CARVE(&c, float, m.Sp *m.I);
    return c.off;
}

int moe_check(const k3c_moe_sizes *s, const char *op, glu_params *q, k3c_err *err) {
    if (!s) return k3c_errf(err, K3C_EINVAL, "%s: NULL sizes", op);
    if (s->tokens < 0 || s->dim < 1 || s->inter < 1 || s->experts < 1 || s->top_k < 1 ||
        s->tokens * s->top_k + ROW_ALIGN * s->experts >= INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes T = %lld, D = %lld, I = %lld, E = %lld, k = %lld", op,
                        (long long)s->tokens, (long long)s->dim, (long long)s->inter, (long long)s->experts,
                        (long long)s->top_k);
    return glu_params_of(&s->act, q, op, err) ? K3C_EINVAL : 0;
}

/* The bf16 GEMM mode runs small experts as grouped products on bf16 operands (moe_grouped.cu): the activations are
 * gathered, and the GLU and its backward write, straight into bf16 (in the float scratch's space), and the weights are
 * rounded once per call. Other modes, widths that are not multiples of 8, and large experts take one cuBLASLt product
 * per expert: bench_cuda moe has the grouped layer faster at D 1,024 x I 512 but slower at
 * K3's latent 3,584 x 3,072, where each expert's product already fills the GPU and the grouped kernel's mma.sync
 * tiles lose to cuBLASLt's. The bound between the two is not measured. */
constexpr int64_t GROUPED_MAX_DI = (int64_t)1 << 20;
bool grouped_mode(const moe_dims &m, int gemm) {
    return gemm == K3C_GEMM_BF16 && m.D % 8 == 0 && m.I % 8 == 0 && m.D * m.I <= GROUPED_MAX_DI;
}

/* The experts' weights in bf16 for one call, stream-ordered memory: the forward's gu [E][2I][D] = [W1_e; W3_e] and
 * w2 [E][D][I], or (t, the backward's) their transposes gu [E][D][2I] and w2 [E][I][D], so that every token product
 * of either direction reads K-major weights (the wgmma kernel's layout, moe_wgmma.cu). */
struct weights_bf16 {
    bf16 *gu = nullptr, *w2 = nullptr;
    bool t = false;
    ~weights_bf16() {
        if (gu) cudaFreeAsync(gu, K3C_STREAM);
    }
    int make(const moe_dims &m, const float *w1, const float *w3, const float *w2_f, bool transposed, k3c_err *err) {
        const size_t n = (size_t)(m.E * m.I * m.D);
        K3C_CU(cudaMallocAsync((void **)&gu, 3 * n * sizeof(bf16), K3C_STREAM));
        w2 = gu + 2 * n, t = transposed;
        return t ? k3c_moe_weights_bf16_t_cuda(m.E, m.D, m.I, w1, w3, w2_f, gu, w2, err)
                 : k3c_moe_weights_bf16_cuda(m.E, m.D, m.I, w1, w3, w2_f, gu, w2, err);
    }
    /* *wb = these weights, made, where the call runs the grouped products (grouped_mode); NULL otherwise. */
    int make_for(const moe_dims &m, int gemm, const float *w1, const float *w3, const float *w2_f, bool transposed,
                 const weights_bf16 **wb, k3c_err *err) {
        *wb = nullptr;
        if (!grouped_mode(m, gemm)) return 0;
        const int rc = make(m, w1, w3, w2_f, transposed, err);
        if (!rc) *wb = this;
        return rc;
    }
};

/* Host copy of the plan's offsets → padded starts pstart[E + 1]; uploads delta[e] = pstart[e] − offsets[e] and, for
 * the grouped products (groups non-NULL), their row groups. */
int pad_plan(const moe_dims &m, const std::vector<int64_t> &off, std::vector<int64_t> &pstart, const moe_scratch_d &sc,
             k3c_moe_groups *groups, k3c_err *err) {
    pstart.assign((size_t)m.E + 1, 0);
    std::vector<int32_t> delta_h((size_t)m.E), table(groups ? 3 * (size_t)m.E + 1 : 0);
    int64_t tiles = 0;
    for (int64_t e = 0; e < m.E; e++) {
        const int64_t n = off[e + 1] - off[e];
        pstart[e + 1] = pstart[e] + (n + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
        delta_h[e] = (int32_t)(pstart[e] - off[e]);
        if (!groups) continue;
        table[e] = (int32_t)pstart[e], table[m.E + e] = (int32_t)n, table[2 * m.E + e] = (int32_t)tiles;
        tiles += (n + K3C_MOE_GG_ROWS - 1) / K3C_MOE_GG_ROWS;
    }
    /* pageable sources: the copies have consumed delta_h and table when cudaMemcpyAsync returns */
    K3C_CU(cudaMemcpyAsync(sc.delta, delta_h.data(), (size_t)m.E * sizeof(int32_t), cudaMemcpyHostToDevice, K3C_STREAM));
    if (groups) {
        table[3 * m.E] = (int32_t)tiles;
        K3C_CU(cudaMemcpyAsync(sc.groups, table.data(), table.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                               K3C_STREAM));
        *groups = {sc.groups, (int)m.E, (int)tiles};
    }
    return 0;
}

/* G = X W1ᵀ and U = X W3ᵀ of the gathered rows: per expert, or (wb non-NULL) as one grouped product on bf16 X. */
int front_gemms(k3c_cuda_ctx *ctx, const moe_dims &m, const float *w1, const float *w3, const weights_bf16 *wb,
                const k3c_moe_groups &groups, const moe_saved_d &sv, const moe_scratch_d &sc,
                const std::vector<int64_t> &off, const std::vector<int64_t> &pstart, int gemm, k3c_err *err) {
    if (wb) { /* the backward's recompute has the transposed weights, [K = D][N = 2I] */
        const k3c_moe_gemm p = {(const bf16 *)sc.X, wb->gu, m.D, wb->t ? 2 * m.I : m.D, 2 * m.I * m.D, sv.G, sv.U, m.I,
                                0, m.I, 0, 2 * m.I, m.D};
        return k3c_moe_gemm_tokens_cuda(&groups, &p, wb->t ? 1 : 0, err);
    }
    int rc;
    if ((rc = k3c_cuda_lanes_fork(ctx, err))) return rc; /* the experts' GEMMs side by side (cuda_ops.h "Lanes") */
    for (int64_t e = 0; e < m.E; e++) {
        const int64_t r0 = pstart[e], n = off[e + 1] - off[e];
        if (n == 0) continue;
        if ((rc = k3c_matmul_lane_cuda(ctx, (int)e, 0, 1, n, m.I, m.D, 1.0, sc.X + r0 * m.D, w1 + e * m.I * m.D, 0.0,
                                       sv.G + r0 * m.I, gemm, err)))
            return rc;
        if ((rc = k3c_matmul_lane_cuda(ctx, (int)e, 0, 1, n, m.I, m.D, 1.0, sc.X + r0 * m.D, w3 + e * m.I * m.D, 0.0,
                                       sv.U + r0 * m.I, gemm, err)))
            return rc;
    }
    return k3c_cuda_lanes_join(ctx, err);
}

/* x gathered into expert order: float, or bf16 for the grouped products. */
void gather_x(const moe_dims &m, int64_t rows, const int32_t *pperm, const float *x, const moe_scratch_d &sc,
              bool grouped) {
    if (grouped)
        gather_rows((int)m.k, m.D, rows, pperm, x, (bf16 *)sc.X);
    else
        gather_rows((int)m.k, m.D, rows, pperm, x, sc.X);
}

/* Plan, padded map, gather x, G and U (the part the backward may recompute). */
int moe_front(k3c_cuda_ctx *ctx, const moe_dims &m, const float *x, const int32_t *ids, const float *w1,
              const float *w3, const weights_bf16 *wb, k3c_moe_groups *groups, const moe_saved_d &sv,
              const moe_scratch_d &sc, std::vector<int64_t> &off, std::vector<int64_t> &pstart, int gemm,
              k3c_err *err) {
    off.assign((size_t)m.E + 1, 0);
    int rc = k3c_moe_plan_cuda(m.T, m.k, m.E, ids, sv.offsets, sc.perm, sc.pos, off.data(), err);
    if (rc) return rc;
    if ((rc = pad_plan(m, off, pstart, sc, wb ? groups : nullptr, err))) return rc;
    K3C_CU(cudaMemsetAsync(sv.pperm, 0xFF, (size_t)m.Sp * sizeof(int32_t), K3C_STREAM));
    pad_map_kernel<<<grid_for(m.S, 256), 256, 0, K3C_STREAM>>>((int)m.S, ids, sc.pos, sc.delta, sv.ppos, sv.pperm);
    K3C_CU_LAUNCHED("moe pad_map");
    gather_x(m, pstart[m.E], sv.pperm, x, sc, wb != nullptr);
    K3C_CU_LAUNCHED("moe gather");
    return front_gemms(ctx, m, w1, w3, wb, *groups, sv, sc, off, pstart, gemm, err);
}

} // namespace

extern "C" size_t k3c_moe_saved_bytes_cuda(const k3c_moe_sizes *s) {
    glu_params q;
    return moe_check(s, "moe_saved_bytes_cuda", &q, nullptr) ? 0 : saved_layout(dims_of(s), nullptr, nullptr);
}

extern "C" size_t k3c_moe_workspace_cuda(const k3c_moe_sizes *s) {
    glu_params q;
    if (moe_check(s, "moe_workspace_cuda", &q, nullptr)) return 0;
    const moe_dims m = dims_of(s);
    return scratch_layout(m, nullptr, nullptr) + saved_layout(m, nullptr, nullptr);
}

namespace {

/* The W2 products per expert, or grouped with bf16 operands: forward Y = H·W2ᵀ (N = D, K = I); backward
 * dH = dY·W2 (N = I, K = D; grouped: W2ᵀ from the transposed weights, K-major), unscaled by p. */
int w2_gemms(k3c_cuda_ctx *ctx, const moe_dims &m, bool bwd, const float *w2, const weights_bf16 *wb,
             const k3c_moe_groups &groups, const moe_scratch_d &sc, const std::vector<int64_t> &off,
             const std::vector<int64_t> &pstart, int gemm, k3c_err *err) {
    const float *A = bwd ? sc.Y : sc.H;
    float *C = bwd ? sc.dH : sc.Y;
    const int64_t N = bwd ? m.I : m.D, K = bwd ? m.D : m.I;
    if (wb) {
        const k3c_moe_gemm p = {(const bf16 *)A, wb->w2, K, K, m.D * m.I, C, nullptr, N, 0, N, 0, N, K};
        return k3c_moe_gemm_tokens_cuda(&groups, &p, 0, err);
    }
    int rc;
    if ((rc = k3c_cuda_lanes_fork(ctx, err))) return rc;
    for (int64_t e = 0; e < m.E; e++) {
        const int64_t r0 = pstart[e], n = off[e + 1] - off[e];
        if (n == 0) continue;
        if ((rc = k3c_matmul_lane_cuda(ctx, (int)e, 0, bwd ? 0 : 1, n, N, K, 1.0, A + r0 * K, w2 + e * m.D * m.I,
                                       0.0, C + r0 * N, gemm, err)))
            return rc;
    }
    return k3c_cuda_lanes_join(ctx, err);
}

} // namespace

extern "C" int k3c_moe_fwd_cuda(k3c_cuda_ctx *ctx, const k3c_moe_sizes *s, const float *x, const int32_t *topk_ids,
                                const float *topk_w, const float *w1, const float *w3, const float *w2, float *y,
                                void *saved, void *ws, int gemm, k3c_err *err) {
    glu_params q;
    if (moe_check(s, "moe_fwd_cuda", &q, err)) return K3C_EINVAL;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "moe_fwd_cuda: no workspace (k3c_moe_workspace_cuda bytes)");
    if (s->tokens == 0) return 0;
    const moe_dims m = dims_of(s);
    moe_scratch_d sc;
    moe_saved_d sv;
    const size_t nsc = scratch_layout(m, ws, &sc);
    saved_layout(m, saved ? saved : (unsigned char *)ws + nsc, &sv);
    weights_bf16 wbuf;
    const weights_bf16 *wb;
    int rc;
    if ((rc = wbuf.make_for(m, gemm, w1, w3, w2, false, &wb, err))) return rc;
    std::vector<int64_t> pstart, off;
    k3c_moe_groups groups = {};
    if ((rc = moe_front(ctx, m, x, topk_ids, w1, w3, wb, &groups, sv, sc, off, pstart, gemm, err))) return rc;
    const int64_t rows = pstart[m.E];
    if (rows > 0) {
        if (wb)
            glu_fwd_kernel<<<grid_for(rows * m.I, 256), 256, 0, K3C_STREAM>>>(rows * m.I, m.I, q, sv.G, sv.U,
                                                                              (bf16 *)sc.H, sv.pperm);
        else
            glu_fwd_kernel<<<grid_for(rows * m.I, 256), 256, 0, K3C_STREAM>>>(rows * m.I, m.I, q, sv.G, sv.U, sc.H,
                                                                              sv.pperm);
        K3C_CU_LAUNCHED("moe glu_fwd");
    }
    if ((rc = w2_gemms(ctx, m, false, w2, wb, groups, sc, off, pstart, gemm, err))) return rc;
    combine_kernel<<<(unsigned)m.T, 128, 0, K3C_STREAM>>>((int)m.k, m.D, sv.ppos, topk_w, sc.Y, y, 0);
    K3C_CU_LAUNCHED("moe combine");
    return 0;
}

namespace {

/* The backward's products after dH on bf16 operands, one grouped launch each: dW2 += dYᵀ·H, [dW1; dW3] += [dG dU]ᵀ·X
 * and dX = [dG dU]·[W1; W3] (into the float Y: the bf16 dY read by dW2 is dead by then). */
int bwd_grouped(const moe_dims &m, const weights_bf16 &wb, const k3c_moe_groups &groups, const moe_scratch_d &sc,
                float *dx, float *dw1, float *dw3, float *dw2, k3c_err *err) {
    const int64_t D = m.D, I = m.I;
    const bf16 *dY = (const bf16 *)sc.Y, *H = (const bf16 *)sc.H, *dGU = (const bf16 *)sc.dU, *X = (const bf16 *)sc.X;
    int rc;
    const k3c_moe_gemm pw2 = {dY, H, D, I, 0, dw2, nullptr, I, D * I, D, D, I, 0};
    if (dw2 && (rc = k3c_moe_gemm_weights_cuda(&groups, &pw2, err))) return rc;
    const k3c_moe_gemm pw13 = {dGU, X, 2 * I, D, 0, dw1, dw3, D, I * D, I, 2 * I, D, 0};
    if ((dw1 || dw3) && (rc = k3c_moe_gemm_weights_cuda(&groups, &pw13, err))) return rc;
    if (!dx) return 0;
    const k3c_moe_gemm px = {dGU, wb.gu, 2 * I, 2 * I, 2 * I * D, sc.Y, nullptr, D, 0, D, 0, D, 2 * I}; /* [W1; W3]ᵀ */
    return k3c_moe_gemm_tokens_cuda(&groups, &px, 0, err);
}

/* The same per expert through cuBLASLt (float operands), an expert's five GEMMs in order on its lane. */
int bwd_per_expert(k3c_cuda_ctx *ctx, const moe_dims &m, const float *w1, const float *w3, const moe_scratch_d &sc,
                   const std::vector<int64_t> &off, const std::vector<int64_t> &pstart, float *dx, float *dw1,
                   float *dw3, float *dw2, int gemm, k3c_err *err) {
    const int64_t D = m.D, I = m.I;
    int rc;
    if ((rc = k3c_cuda_lanes_fork(ctx, err))) return rc;
    for (int64_t e = 0; e < m.E; e++) {
        const int64_t r0 = pstart[e], n = off[e + 1] - off[e];
        const int L = (int)e;
        if (n == 0) continue;
        const float *Xe = sc.X + r0 * D, *dYe = sc.Y + r0 * D, *He = sc.H + r0 * I, *dGe = sc.dH + r0 * I,
                    *dUe = sc.dU + r0 * I;
        if (dw2 && (rc = k3c_matmul_lane_cuda(ctx, L, 1, 0, D, I, n, 1.0, dYe, He, 1.0, dw2 + e * D * I, gemm, err)))
            return rc;
        if (dw1 && (rc = k3c_matmul_lane_cuda(ctx, L, 1, 0, I, D, n, 1.0, dGe, Xe, 1.0, dw1 + e * I * D, gemm, err)))
            return rc;
        if (dw3 && (rc = k3c_matmul_lane_cuda(ctx, L, 1, 0, I, D, n, 1.0, dUe, Xe, 1.0, dw3 + e * I * D, gemm, err)))
            return rc;
        if (!dx) continue;
        /* dX of these rows overwrites the gathered dy, dead once dW2 is formed */
        float *dXe = sc.Y + r0 * D;
        if ((rc = k3c_matmul_lane_cuda(ctx, L, 0, 0, n, D, I, 1.0, dGe, w1 + e * I * D, 0.0, dXe, gemm, err)))
            return rc;
        if ((rc = k3c_matmul_lane_cuda(ctx, L, 0, 0, n, D, I, 1.0, dUe, w3 + e * I * D, 1.0, dXe, gemm, err)))
            return rc;
    }
    return k3c_cuda_lanes_join(ctx, err);
}

} // namespace

extern "C" int k3c_moe_bwd_cuda(k3c_cuda_ctx *ctx, const k3c_moe_sizes *s, const float *x, const int32_t *topk_ids,
                                const float *topk_w, const float *w1, const float *w3, const float *w2,
                                const void *saved, const float *dy, float *dx, float *dw1, float *dw3, float *dw2,
                                float *dtopk_w, void *ws, int gemm, k3c_err *err) {
    glu_params q;
    if (moe_check(s, "moe_bwd_cuda", &q, err)) return K3C_EINVAL;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "moe_bwd_cuda: no workspace (k3c_moe_workspace_cuda bytes)");
    if (s->tokens == 0) return 0;
    const moe_dims m = dims_of(s);
    const int64_t D = m.D, I = m.I;
    moe_scratch_d sc;
    moe_saved_d sv;
    const size_t nsc = scratch_layout(m, ws, &sc);
    weights_bf16 wbuf;
    const weights_bf16 *wb;
    int rc;
    if ((rc = wbuf.make_for(m, gemm, w1, w3, w2, true, &wb, err))) return rc;
    std::vector<int64_t> pstart, off((size_t)m.E + 1);
    k3c_moe_groups groups = {};
    if (saved) {
        saved_layout(m, (void *)saved, &sv); /* only read below */
        K3C_CU(
            cudaMemcpyAsync(off.data(), sv.offsets, off.size() * sizeof(int64_t), cudaMemcpyDeviceToHost, K3C_STREAM));
        K3C_CU(cudaStreamSynchronize(K3C_STREAM));
        if ((rc = pad_plan(m, off, pstart, sc, wb ? &groups : nullptr, err))) return rc;
        gather_x(m, pstart[m.E], sv.pperm, x, sc, wb != nullptr);
        K3C_CU_LAUNCHED("moe gather x");
    } else {
        saved_layout(m, (unsigned char *)ws + nsc, &sv);
        if ((rc = moe_front(ctx, m, x, topk_ids, w1, w3, wb, &groups, sv, sc, off, pstart, gemm, err))) return rc;
    }
    const int64_t rows = pstart[m.E];
    if (rows == 0) return 0;
    if (wb)
        gather_rows((int)m.k, D, rows, sv.pperm, dy, (bf16 *)sc.Y);
    else
        gather_rows((int)m.k, D, rows, sv.pperm, dy, sc.Y);
    K3C_CU_LAUNCHED("moe gather dy");
    if ((rc = w2_gemms(ctx, m, true, w2, wb, groups, sc, off, pstart, gemm, err))) return rc;
    if (wb) {
        bf16 *dGU = (bf16 *)sc.dU;
        expert_mid_bwd_kernel<<<(unsigned)rows, 256, 0, K3C_STREAM>>>(I, q, sv.pperm, topk_w, sv.G, sv.U, (bf16 *)sc.H,
                                                                      sc.dH, dGU, dGU + I, 2 * I, dtopk_w);
    } else {
        expert_mid_bwd_kernel<<<(unsigned)rows, 256, 0, K3C_STREAM>>>(I, q, sv.pperm, topk_w, sv.G, sv.U, sc.H, sc.dH,
                                                                      sc.dH, sc.dU, I, dtopk_w);
    }
    K3C_CU_LAUNCHED("moe expert_mid_bwd");
    rc = wb ? bwd_grouped(m, *wb, groups, sc, dx, dw1, dw3, dw2, err)
            : bwd_per_expert(ctx, m, w1, w3, sc, off, pstart, dx, dw1, dw3, dw2, gemm, err);
    if (rc) return rc;
    if (dx) {
        combine_kernel<<<(unsigned)m.T, 128, 0, K3C_STREAM>>>((int)m.k, D, sv.ppos, nullptr, sc.Y, dx, 1);
        K3C_CU_LAUNCHED("moe dx un-permute");
    }
    return 0;
}
