/* moe.cu — CUDA twins (fp32) of the sigmoid router, the dispatch plan, gather / combine, the SiLU/SiTU-GLU and the
 * routed-expert MoE op. Implements spec/ARCHITECTURE.md §6.2 (router), §8 (GLU), §9.2 (u = Σ p_i E_i(z)); ops/moe.h. */
#include <limits.h>

#include <vector>

#include "cuda/common.cuh"

/* ================================================================ shared device math (bitwise the CPU float formulas) */
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
    int situ;
    float b1, b2;
};

/* a = act(g), c = c(u) and their derivatives (glu.c glu_point). */
__device__ __forceinline__ void glu_point(const glu_params &q, float g, float u, float &a, float &c, float &da,
                                          float &dc) {
    float sg = sigm(g);
    if (!q.situ) {
        a = g * sg, da = sg + g * sg * (1.0f - sg), c = u, dc = 1.0f;
    } else {
        float t = tanh_glu(g / q.b1), tau = tanh_glu(u / q.b2);
        a = q.b1 * t * sg;
        da = (1.0f - t * t) * sg + q.b1 * t * sg * (1.0f - sg);
        c = q.b2 * tau, dc = 1.0f - tau * tau;
    }
}

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

/* ================================================================ router */
/* (v, i) ranks before (w, j) when v > w, or v == w and i < j (§6.2: ties to the lower index). */
__device__ __forceinline__ bool ranks_before(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

/* One warp per token: k + 1 rounds of a warp arg-max, each over the experts ranking after the previous pick, so no
 * per-token marking is needed and the order is the CPU's. */
__global__ void router_fwd_kernel(int64_t T, int n, int k, int renorm, float scale, const float *logits,
                                  const float *bias, int32_t *ids, float *w, float *cutoff, int *nonfinite) {
    const int lane = threadIdx.x & 31;
    const int64_t t = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= T) return;
    const float *lg = logits + t * n;
    bool bad = false;
    for (int e = lane; e < n; e += 32) {
        float v = sigm(lg[e]) + (bias ? bias[e] : 0.f);
        bad |= !isfinite(lg[e]) || !isfinite(v);
    }
    if (__any_sync(0xffffffffu, bad)) {
        if (lane == 0 && nonfinite) atomicExch(nonfinite, 1);
        return;
    }
    float pv = 0.f, sum = 0.f; /* the previous pick (none in round 0) */
    int pi = 0;
    const int rounds = k < n ? k + 1 : k;
    for (int j = 0; j < rounds; j++) {
        float bv = -INFINITY;
        int bi = INT_MAX;
        for (int e = lane; e < n; e += 32) {
            float v = sigm(lg[e]) + (bias ? bias[e] : 0.f);
            if ((j == 0 || ranks_before(pv, pi, v, e)) && ranks_before(v, e, bv, bi)) bv = v, bi = e;
        }
        for (int o = 16; o; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ranks_before(ov, oi, bv, bi)) bv = ov, bi = oi;
        }
        pv = bv, pi = bi;
        if (lane == 0) {
            if (j < k)
                ids[t * k + j] = bi, sum += sigm(lg[bi]);
            else if (cutoff)
                cutoff[t] = bv;
        }
    }
    if (lane != 0) return;
    if (cutoff && k == n) cutoff[t] = -INFINITY;
    const float mult = renorm ? scale / (sum + 1e-20f) : scale;
    for (int j = 0; j < k; j++) w[t * k + j] = sigm(lg[ids[t * k + j]]) * mult;
}

/* One thread per token (ids of a token are distinct, so its dlogits entries have one writer). */
__global__ void router_bwd_kernel(int64_t T, int n, int k, int renorm, float rsf, const float *logits,
                                  const int32_t *ids, const float *dp, float *dlogits) {
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= T) return;
    const int32_t *id = ids + t * k;
    const float *lg = logits + t * n, *d = dp + t * k;
    float sum = 0.f, dot = 0.f;
    for (int j = 0; j < k; j++)
        if (id[j] >= 0 && id[j] < n) sum += sigm(lg[id[j]]);
    const float denom = sum + 1e-20f;
    for (int j = 0; j < k; j++)
        if (id[j] >= 0 && id[j] < n) dot += d[j] * sigm(lg[id[j]]) / denom;
    for (int j = 0; j < k; j++) {
        if (id[j] < 0 || id[j] >= n) continue;
        const float sc = sigm(lg[id[j]]), ds = renorm ? rsf * (d[j] - dot) / denom : rsf * d[j];
        dlogits[t * n + id[j]] += ds * sc * (1.0f - sc);
    }
}

/* ================================================================ plan: stable counting sort in one block
 * Histogram, serial scan (E is at most a few hundred), then placement in chunks of blockDim slots: inside a warp,
 * __match_any gives each slot its rank among same-expert slots; warps take their expert cursors in warp order, so rows
 * keep ascending slot order inside an expert. An id outside [−1, E) leaves offsets[0] = −1 − (first bad slot). */
__global__ void plan_kernel(int S, int E, const int32_t *ids, long long *off, int32_t *perm, int32_t *pos) {
    __shared__ int bad;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    if (tid == 0) bad = INT_MAX;
    for (int e = tid; e <= E; e += blockDim.x) off[e] = 0;
    __syncthreads();
    for (int i = tid; i < S; i += blockDim.x) {
        const int id = ids[i];
        if (id < -1 || id >= E)
            atomicMin(&bad, i);
        else if (id >= 0)
            atomicAdd((unsigned long long *)&off[id + 1], 1ull);
    }
    __syncthreads();
    if (bad != INT_MAX) {
        if (tid == 0) off[0] = -1 - (long long)bad;
        return;
    }
    if (tid == 0)
        for (int e = 0; e < E; e++) off[e + 1] += off[e];
    __syncthreads();
    /* off[e] now serves as expert e's fill cursor */
    for (int base = 0; base < S; base += blockDim.x) {
        const int i = base + tid, id = i < S ? ids[i] : -2;
        const unsigned mask = __match_any_sync(0xffffffffu, id);
        const int leader = __ffs(mask) - 1, rank = __popc(mask & ((1u << lane) - 1));
        for (int w = 0; w < nw; w++) {
            if (warp == w) {
                long long b = 0;
                if (lane == leader && id >= 0) b = off[id], off[id] = b + __popc(mask);
                b = __shfl_sync(0xffffffffu, b, leader);
                if (id >= 0)
                    perm[b + rank] = i, pos[i] = (int32_t)(b + rank);
                else if (i < S)
                    pos[i] = -1;
            }
            __syncthreads();
        }
    }
    if (tid == 0) {
        for (int e = E; e > 0; e--) off[e] = off[e - 1];
        off[0] = 0;
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
/* xperm[row] = x[perm[row] / k]; rows with perm < 0 (padding) are left alone. One block per row. */
__global__ void gather_kernel(int k, int64_t D, const int32_t *perm, const float *x, float *xp) {
    const int64_t row = blockIdx.x;
    const int s = perm[row];
    if (s < 0) return;
    const float *src = x + (int64_t)(s / k) * D;
    float *dst = xp + row * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dst[d] = src[d];
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

/* h = act(g) ⊙ c(u) over rows × I; rowmap (optional): rows whose entry is < 0 are skipped (padding). */
__global__ void glu_fwd_kernel(int64_t n, int64_t I, glu_params q, const float *g, const float *u, float *h,
                               const int32_t *rowmap) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        if (rowmap && rowmap[i / I] < 0) continue;
        float a, c, da, dc;
        glu_point(q, g[i], u[i], a, c, da, dc);
        h[i] = a * c;
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

/* The fused middle of the expert backward, one block per padded row r of slot s = pperm[r] (p = topk_w[s]):
 *   dtopk_w[s] += ⟨dH_r, h_r⟩ with h = glu(G, U);  H_r = p·h_r (W2's effective input);
 *   dH_r ← p·dH_r ⊙ c ⊙ act' (= dG, in place);  dU_r = p·dH_r ⊙ act ⊙ c'. */
__global__ void expert_mid_bwd_kernel(int64_t I, glu_params q, const int32_t *pperm, const float *topk_w,
                                      const float *G, const float *U, float *H, float *dH, float *dU, float *dtopk_w) {
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    const int s = pperm[r];
    if (s < 0) return;
    const float p = topk_w[s];
    const float *g = G + r * I, *u = U + r * I;
    float *h = H + r * I, *dh = dH + r * I, *du = dU + r * I;
    float dot = 0.f;
    for (int64_t i = threadIdx.x; i < I; i += blockDim.x) {
        float a, c, da, dc;
        glu_point(q, g[i], u[i], a, c, da, dc);
        const float d = dh[i];
        dot += d * a * c;
        h[i] = p * (a * c);
        dh[i] = p * d * c * da;
        du[i] = p * d * a * dc;
    }
    dot = block_sum(dot, red);
    if (threadIdx.x == 0 && dtopk_w) dtopk_w[s] += dot;
}

int glu_params_of(const k3c_glu_act *a, glu_params *q, const char *op, k3c_err *err) {
    if (a->act == K3C_ACT_SILU) {
        *q = {0, 0.f, 0.f};
        return 0;
    }
    if (a->act == K3C_ACT_SITU && a->beta1 > 0 && a->beta2 > 0) {
        *q = {1, (float)a->beta1, (float)a->beta2};
        return 0;
    }
    return k3c_errf(err, K3C_EINVAL, "%s: activation %d with betas (%g, %g): need SiLU, or SiTU with betas > 0", op,
                    a->act, a->beta1, a->beta2);
}

unsigned grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

} // namespace

/* ================================================================ C entry points: router, plan, gather, combine, GLU */
extern "C" int k3c_router_fwd_cuda(const k3c_router_sizes *s, const float *logits, const float *bias, int32_t *topk_ids,
                                   float *topk_w, float *cutoff, int *nonfinite, k3c_err *err) {
    if (!s || s->tokens < 0 || s->experts < 1 || s->experts > INT32_MAX || s->top_k < 1 || s->top_k > s->experts ||
        s->top_k > K3C_ROUTER_MAX_TOPK)
        return k3c_errf(err, K3C_EINVAL, "router_fwd_cuda: bad sizes (need 1 <= k <= min(n, %d))", K3C_ROUTER_MAX_TOPK);
    if (s->tokens == 0) return 0;
    const int per_block = 8;
    router_fwd_kernel<<<(unsigned)((s->tokens + per_block - 1) / per_block), 32 * per_block, 0, K3C_STREAM>>>(
        s->tokens, (int)s->experts, (int)s->top_k, s->renormalize && s->top_k > 1, (float)s->scale, logits, bias,
        topk_ids, topk_w, cutoff, nonfinite);
    K3C_CU_LAUNCHED("router_fwd");
    return 0;
}

extern "C" int k3c_router_bwd_cuda(const k3c_router_sizes *s, const float *logits, const int32_t *topk_ids,
                                   const float *dtopk_w, float *dlogits, k3c_err *err) {
    if (!s || s->tokens < 0 || s->experts < 1 || s->experts > INT32_MAX || s->top_k < 1 || s->top_k > s->experts)
        return k3c_errf(err, K3C_EINVAL, "router_bwd_cuda: bad sizes");
    if (s->tokens == 0 || !dlogits) return 0;
    router_bwd_kernel<<<(unsigned)((s->tokens + 127) / 128), 128, 0, K3C_STREAM>>>(
        s->tokens, (int)s->experts, (int)s->top_k, s->renormalize && s->top_k > 1, (float)s->scale, logits, topk_ids,
        dtopk_w, dlogits);
    K3C_CU_LAUNCHED("router_bwd");
    return 0;
}

extern "C" int k3c_moe_plan_cuda(int64_t tokens, int64_t top_k, int64_t experts, const int32_t *topk_ids,
                                 int64_t *offsets, int32_t *perm, int32_t *pos, int64_t *offsets_host, k3c_err *err) {
    if (tokens < 0 || top_k < 1 || experts < 1 || experts > INT32_MAX || tokens * top_k >= INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "moe_plan_cuda: bad sizes T = %lld, k = %lld, E = %lld (T·k must be < 2^31)",
                        (long long)tokens, (long long)top_k, (long long)experts);
    const int S = (int)(tokens * top_k), E = (int)experts;
    plan_kernel<<<1, 1024, 0, K3C_STREAM>>>(S, E, topk_ids, (long long *)offsets, perm, pos);
    K3C_CU_LAUNCHED("moe_plan");
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
    gather_kernel<<<(unsigned)rows, 128, 0, K3C_STREAM>>>((int)top_k, dim, perm, x, xperm);
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

extern "C" int k3c_glu_fwd_cuda(const k3c_glu_sizes *s, const float *gate, const float *up, float *h, k3c_err *err) {
    glu_params q;
    if (!s || s->rows < 0 || s->inter < 0) return k3c_errf(err, K3C_EINVAL, "glu_fwd_cuda: bad sizes");
    if (glu_params_of(&s->act, &q, "glu_fwd_cuda", err)) return K3C_EINVAL;
    const int64_t n = s->rows * s->inter;
    if (n == 0) return 0;
    glu_fwd_kernel<<<grid_for(n, 256), 256, 0, K3C_STREAM>>>(n, s->inter, q, gate, up, h, nullptr);
    K3C_CU_LAUNCHED("glu_fwd");
    return 0;
}

extern "C" int k3c_glu_bwd_cuda(const k3c_glu_sizes *s, const float *gate, const float *up, const float *dh,
                                float *dgate, float *dup, k3c_err *err) {
    glu_params q;
    if (!s || s->rows < 0 || s->inter < 0) return k3c_errf(err, K3C_EINVAL, "glu_bwd_cuda: bad sizes");
    if (glu_params_of(&s->act, &q, "glu_bwd_cuda", err)) return K3C_EINVAL;
    const int64_t n = s->rows * s->inter;
    if (n == 0 || (!dgate && !dup)) return 0;
    glu_bwd_kernel<<<grid_for(n, 256), 256, 0, K3C_STREAM>>>(n, q, gate, up, dh, dgate, dup);
    K3C_CU_LAUNCHED("glu_bwd");
    return 0;
}

/* ================================================================ the routed-expert op */
namespace {

const int64_t ROW_ALIGN = 64; /* rows; 64 floats = 256 bytes */

size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

struct carver {
    unsigned char *base;
    size_t off;
    template <typename T> T *take(size_t n) {
        T *r = base ? (T *)(base + off) : nullptr;
        off += al256(n * sizeof(T));
        return r;
    }
};

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
    float *X, *Y;                /* [Sp, D] */
    float *H, *dH, *dU;          /* [Sp, I] */
};

size_t saved_layout(const moe_dims &m, void *base, moe_saved_d *sv) {
    carver c = {(unsigned char *)base, 0};
    moe_saved_d t;
    if (!sv) sv = &t;
    sv->offsets = c.take<int64_t>(m.E + 1);
    sv->ppos = c.take<int32_t>(m.S);
    sv->pperm = c.take<int32_t>(m.Sp);
    sv->G = c.take<float>(m.Sp * m.I);
    sv->U = c.take<float>(m.Sp * m.I);
    return c.off;
}
size_t scratch_layout(const moe_dims &m, void *base, moe_scratch_d *sc) {
    carver c = {(unsigned char *)base, 0};
    moe_scratch_d t;
    if (!sc) sc = &t;
    sc->perm = c.take<int32_t>(m.S);
    sc->pos = c.take<int32_t>(m.S);
    sc->delta = c.take<int32_t>(m.E);
    sc->X = c.take<float>(m.Sp * m.D);
    sc->Y = c.take<float>(m.Sp * m.D);
    sc->H = c.take<float>(m.Sp * m.I);
    sc->dH = c.take<float>(m.Sp * m.I);
    sc->dU = c.take<float>(m.Sp * m.I);
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

/* Host copy of the plan's offsets → padded starts pstart[E + 1]; uploads delta[e] = pstart[e] − offsets[e]. */
int pad_plan(const moe_dims &m, const std::vector<int64_t> &off, std::vector<int64_t> &pstart, int32_t *delta_d,
             std::vector<int32_t> &delta_h, k3c_err *err) {
    pstart.assign((size_t)m.E + 1, 0);
    delta_h.resize((size_t)m.E);
    for (int64_t e = 0; e < m.E; e++) {
        const int64_t n = off[e + 1] - off[e];
        pstart[e + 1] = pstart[e] + (n + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
        delta_h[e] = (int32_t)(pstart[e] - off[e]);
    }
    /* pageable source: the copy has consumed delta_h when cudaMemcpyAsync returns */
    K3C_CU(cudaMemcpyAsync(delta_d, delta_h.data(), (size_t)m.E * sizeof(int32_t), cudaMemcpyHostToDevice, K3C_STREAM));
    return 0;
}

/* Plan, padded map, gather x, G = X W1ᵀ and U = X W3ᵀ per expert (the part the backward may recompute). */
int moe_front(k3c_cuda_ctx *ctx, const moe_dims &m, const float *x, const int32_t *ids, const float *w1,
              const float *w3, const moe_saved_d &sv, const moe_scratch_d &sc, std::vector<int64_t> &off,
              std::vector<int64_t> &pstart, int tf32, k3c_err *err) {
    off.assign((size_t)m.E + 1, 0);
    std::vector<int32_t> delta_h;
    int rc = k3c_moe_plan_cuda(m.T, m.k, m.E, ids, sv.offsets, sc.perm, sc.pos, off.data(), err);
    if (rc) return rc;
    if ((rc = pad_plan(m, off, pstart, sc.delta, delta_h, err))) return rc;
    K3C_CU(cudaMemsetAsync(sv.pperm, 0xFF, (size_t)m.Sp * sizeof(int32_t), K3C_STREAM));
    pad_map_kernel<<<grid_for(m.S, 256), 256, 0, K3C_STREAM>>>((int)m.S, ids, sc.pos, sc.delta, sv.ppos, sv.pperm);
    K3C_CU_LAUNCHED("moe pad_map");
    const int64_t rows = pstart[m.E];
    if (rows > 0) gather_kernel<<<(unsigned)rows, 128, 0, K3C_STREAM>>>((int)m.k, m.D, sv.pperm, x, sc.X);
    K3C_CU_LAUNCHED("moe gather");
    for (int64_t e = 0; e < m.E; e++) {
        const int64_t r0 = pstart[e], n = off[e + 1] - off[e];
        if (n == 0) continue;
        if ((rc = k3c_matmul_cuda(ctx, 0, 1, n, m.I, m.D, 1.0, sc.X + r0 * m.D, w1 + e * m.I * m.D, 0.0,
                                  sv.G + r0 * m.I, tf32, err)))
            return rc;
        if ((rc = k3c_matmul_cuda(ctx, 0, 1, n, m.I, m.D, 1.0, sc.X + r0 * m.D, w3 + e * m.I * m.D, 0.0,
                                  sv.U + r0 * m.I, tf32, err)))
            return rc;
    }
    return 0;
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

extern "C" int k3c_moe_fwd_cuda(k3c_cuda_ctx *ctx, const k3c_moe_sizes *s, const float *x, const int32_t *topk_ids,
                                const float *topk_w, const float *w1, const float *w3, const float *w2, float *y,
                                void *saved, void *ws, int tf32, k3c_err *err) {
    glu_params q;
    if (moe_check(s, "moe_fwd_cuda", &q, err)) return K3C_EINVAL;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "moe_fwd_cuda: no workspace (k3c_moe_workspace_cuda bytes)");
    if (s->tokens == 0) return 0;
    const moe_dims m = dims_of(s);
    moe_scratch_d sc;
    moe_saved_d sv;
    const size_t nsc = scratch_layout(m, ws, &sc);
    saved_layout(m, saved ? saved : (unsigned char *)ws + nsc, &sv);
    std::vector<int64_t> pstart, off;
    int rc = moe_front(ctx, m, x, topk_ids, w1, w3, sv, sc, off, pstart, tf32, err);
    if (rc) return rc;
    const int64_t rows = pstart[m.E];
    if (rows > 0) {
        glu_fwd_kernel<<<grid_for(rows * m.I, 256), 256, 0, K3C_STREAM>>>(rows * m.I, m.I, q, sv.G, sv.U, sc.H,
                                                                          sv.pperm);
        K3C_CU_LAUNCHED("moe glu_fwd");
    }
    for (int64_t e = 0; e < m.E; e++) {
        const int64_t r0 = pstart[e], n = off[e + 1] - off[e];
        if (n == 0) continue;
        if ((rc = k3c_matmul_cuda(ctx, 0, 1, n, m.D, m.I, 1.0, sc.H + r0 * m.I, w2 + e * m.D * m.I, 0.0,
                                  sc.Y + r0 * m.D, tf32, err)))
            return rc;
    }
    combine_kernel<<<(unsigned)m.T, 128, 0, K3C_STREAM>>>((int)m.k, m.D, sv.ppos, topk_w, sc.Y, y, 0);
    K3C_CU_LAUNCHED("moe combine");
    return 0;
}

extern "C" int k3c_moe_bwd_cuda(k3c_cuda_ctx *ctx, const k3c_moe_sizes *s, const float *x, const int32_t *topk_ids,
                                const float *topk_w, const float *w1, const float *w3, const float *w2,
                                const void *saved, const float *dy, float *dx, float *dw1, float *dw3, float *dw2,
                                float *dtopk_w, void *ws, int tf32, k3c_err *err) {
    glu_params q;
    if (moe_check(s, "moe_bwd_cuda", &q, err)) return K3C_EINVAL;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "moe_bwd_cuda: no workspace (k3c_moe_workspace_cuda bytes)");
    if (s->tokens == 0) return 0;
    const moe_dims m = dims_of(s);
    const int64_t D = m.D, I = m.I;
    moe_scratch_d sc;
    moe_saved_d sv;
    const size_t nsc = scratch_layout(m, ws, &sc);
    std::vector<int64_t> pstart, off((size_t)m.E + 1);
    int rc;
    if (saved) {
        saved_layout(m, (void *)saved, &sv); /* only read below */
        std::vector<int32_t> delta_h;
        K3C_CU(
            cudaMemcpyAsync(off.data(), sv.offsets, off.size() * sizeof(int64_t), cudaMemcpyDeviceToHost, K3C_STREAM));
        K3C_CU(cudaStreamSynchronize(K3C_STREAM));
        if ((rc = pad_plan(m, off, pstart, sc.delta, delta_h, err))) return rc;
        if (pstart[m.E] > 0)
            gather_kernel<<<(unsigned)pstart[m.E], 128, 0, K3C_STREAM>>>((int)m.k, D, sv.pperm, x, sc.X);
        K3C_CU_LAUNCHED("moe gather x");
    } else {
        saved_layout(m, (unsigned char *)ws + nsc, &sv);
        if ((rc = moe_front(ctx, m, x, topk_ids, w1, w3, sv, sc, off, pstart, tf32, err))) return rc;
    }
    const int64_t rows = pstart[m.E];
    if (rows == 0) return 0;
    gather_kernel<<<(unsigned)rows, 128, 0, K3C_STREAM>>>((int)m.k, D, sv.pperm, dy, sc.Y);
    K3C_CU_LAUNCHED("moe gather dy");
    for (int64_t e = 0; e < m.E; e++) { /* dH = dY W2 (unscaled by p) */
        const int64_t r0 = pstart[e], n = off[e + 1] - off[e];
        if (n == 0) continue;
        if ((rc = k3c_matmul_cuda(ctx, 0, 0, n, I, D, 1.0, sc.Y + r0 * D, w2 + e * D * I, 0.0, sc.dH + r0 * I, tf32,
                                  err)))
            return rc;
    }
    expert_mid_bwd_kernel<<<(unsigned)rows, 256, 0, K3C_STREAM>>>(I, q, sv.pperm, topk_w, sv.G, sv.U, sc.H, sc.dH,
                                                                  sc.dU, dtopk_w);
    K3C_CU_LAUNCHED("moe expert_mid_bwd");
    for (int64_t e = 0; e < m.E; e++) {
        const int64_t r0 = pstart[e], n = off[e + 1] - off[e];
        if (n == 0) continue;
        const float *Xe = sc.X + r0 * D, *dYe = sc.Y + r0 * D, *He = sc.H + r0 * I, *dGe = sc.dH + r0 * I,
                    *dUe = sc.dU + r0 * I;
        if (dw2 && (rc = k3c_matmul_cuda(ctx, 1, 0, D, I, n, 1.0, dYe, He, 1.0, dw2 + e * D * I, tf32, err))) return rc;
        if (dw1 && (rc = k3c_matmul_cuda(ctx, 1, 0, I, D, n, 1.0, dGe, Xe, 1.0, dw1 + e * I * D, tf32, err))) return rc;
        if (dw3 && (rc = k3c_matmul_cuda(ctx, 1, 0, I, D, n, 1.0, dUe, Xe, 1.0, dw3 + e * I * D, tf32, err))) return rc;
        if (!dx) continue;
        /* dX of these rows overwrites the gathered dy, dead once dW2 is formed */
        float *dXe = sc.Y + r0 * D;
        if ((rc = k3c_matmul_cuda(ctx, 0, 0, n, D, I, 1.0, dGe, w1 + e * I * D, 0.0, dXe, tf32, err))) return rc;
        if ((rc = k3c_matmul_cuda(ctx, 0, 0, n, D, I, 1.0, dUe, w3 + e * I * D, 1.0, dXe, tf32, err))) return rc;
    }
    if (dx) {
        combine_kernel<<<(unsigned)m.T, 128, 0, K3C_STREAM>>>((int)m.k, D, sv.ppos, nullptr, sc.Y, dx, 1);
        K3C_CU_LAUNCHED("moe dx un-permute");
    }
    return 0;
}
