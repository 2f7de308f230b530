/* router.cu — fp32 CUDA twin of the sigmoid top-k router (selection with ties to the lower index, renormalised weights)
 * and its backward (ops/router.c), and of the auxiliary balancing loss's gradient (ops/aux_loss.c). docs/MODEL.md §6.2,
 * docs/TRAINING.md §1.6; declarations in cuda/cuda_ops.h. */
#include <limits.h>

#include "cuda/common.cuh"

namespace {

/* The CPU float op's sigmoid (router.c), so the selection agrees exactly. */
__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ================================================================ router */
/* (v, i) ranks before (w, j) when v > w, or v == w and i < j (§6.2: ties to the lower index). */
__device__ __forceinline__ bool ranks_before(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

/* One warp per token: k + 1 rounds of a warp arg-max, each over the experts ranking after the previous pick, so no
 * per-token marking is needed and the order is the CPU's. Each lane keeps its experts' scores in registers (up to
 * 32 · ROUTER_PER experts; more are re-read each round): the rounds are then shuffles, not dependent loads. */
constexpr int ROUTER_PER = 32;
__global__ void router_fwd_kernel(int64_t T, int n, int k, int renorm, float scale, const float *logits,
                                  const float *bias, int32_t *ids, float *w, float *cutoff, int *nonfinite) {
    const int lane = threadIdx.x & 31;
    const int64_t t = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= T) return;
    const float *lg = logits + t * n;
    bool bad = false;
    float sv[ROUTER_PER];
#pragma unroll
    for (int i = 0; i < ROUTER_PER; i++) sv[i] = -INFINITY;
    for (int e = lane; e < n; e += 32) {
        float v = sigm(lg[e]) + (bias ? bias[e] : 0.f);
        bad |= !isfinite(lg[e]) || !isfinite(v);
#pragma unroll
        for (int i = 0; i < ROUTER_PER; i++)
            if (e == lane + 32 * i) sv[i] = v;
            else if (32 * i > e) break;
    }
    if (__any_sync(0xffffffffu, bad)) {
        if (lane == 0 && nonfinite) atomicExch(nonfinite, 1);
        return;
    }
    const bool cached = n <= 32 * ROUTER_PER;
    float pv = 0.f, sum = 0.f; /* the previous pick (none in round 0) */
    int pi = 0;
    const int rounds = k < n ? k + 1 : k;
    for (int j = 0; j < rounds; j++) {
        float bv = -INFINITY;
        int bi = INT_MAX;
        if (cached) {
#pragma unroll
            for (int i = 0; i < ROUTER_PER; i++) {
                if (32 * i >= n) break; /* uniform: a round costs the experts there are, not ROUTER_PER */
                const int e = lane + 32 * i;
                if (e < n && (j == 0 || ranks_before(pv, pi, sv[i], e)) && ranks_before(sv[i], e, bv, bi))
                    bv = sv[i], bi = e;
            }
        } else {
            for (int e = lane; e < n; e += 32) {
                float v = sigm(lg[e]) + (bias ? bias[e] : 0.f);
                if ((j == 0 || ranks_before(pv, pi, v, e)) && ranks_before(v, e, bv, bi)) bv = v, bi = e;
            }
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

/* ================================================================ auxiliary balancing loss */
__global__ void aux_count_kernel(int64_t m, int n, const int32_t *ids, unsigned long long *counts) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m; i += (int64_t)gridDim.x * blockDim.x)
        if (ids[i] >= 0 && ids[i] < n) atomicAdd(counts + ids[i], 1ULL);
}

/* One thread per row (aux_loss.c's loop): w_e = n·c_e/(T²k), dlogit_tj += coef·(w_j − Σ_e w_e p_te)/S_t·s_j(1 − s_j). */
__global__ void aux_bwd_kernel(int64_t rows, int64_t row0, int n, double wscale, float coef, const float *logits,
                               const unsigned long long *counts, float *dlogits) {
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= rows) return;
    const float *lg = logits + (row0 + t) * n;
    float S = 0.f, dot = 0.f;
    for (int e = 0; e < n; e++) {
        const float se = sigm(lg[e]);
        S += se;
        dot += (float)(wscale * (double)counts[e]) * se;
    }
    dot /= S;
    for (int j = 0; j < n; j++) {
        const float sj = sigm(lg[j]);
        dlogits[t * n + j] += coef * ((float)(wscale * (double)counts[j]) - dot) / S * sj * (1.0f - sj);
    }
}

} // namespace

extern "C" size_t k3c_aux_loss_workspace_cuda(const k3c_router_sizes *s) {
    return s ? sizeof(unsigned long long) * (size_t)(s->experts > 0 ? s->experts : 1) : 0;
}

extern "C" int k3c_aux_loss_bwd_cuda(const k3c_router_sizes *s, const float *logits, const int32_t *topk_ids,
                                     double coef, int64_t row0, int64_t rows, float *dlogits, void *ws, k3c_err *err) {
    if (!s || s->tokens < 0 || s->experts < 1 || s->experts > INT32_MAX || s->top_k < 1 || s->top_k > s->experts)
        return k3c_errf(err, K3C_EINVAL, "aux_loss_bwd_cuda: bad sizes (need 1 <= k <= n)");
    if (row0 < 0 || rows < 0 || row0 + rows > s->tokens)
        return k3c_errf(err, K3C_EINVAL, "aux_loss_bwd_cuda: rows [%lld, %lld) outside the %lld tokens",
                        (long long)row0, (long long)(row0 + rows), (long long)s->tokens);
    if (!ws) return k3c_errf(err, K3C_EINVAL, "aux_loss_bwd_cuda: the workspace is required");
    if (!dlogits || rows == 0) return 0;
    const int64_t T = s->tokens, n = s->experts, mk = T * s->top_k;
    unsigned long long *counts = static_cast<unsigned long long *>(ws);
    K3C_CU(cudaMemsetAsync(counts, 0, sizeof *counts * (size_t)n, K3C_STREAM));
    const int64_t cb = (mk + 255) / 256;
    aux_count_kernel<<<(unsigned)(cb < 4096 ? (cb > 0 ? cb : 1) : 4096), 256, 0, K3C_STREAM>>>(mk, (int)n, topk_ids,
                                                                                               counts);
    K3C_CU_LAUNCHED("aux_loss counts");
    const double wscale = (double)n / ((double)T * (double)T * (double)s->top_k);
    aux_bwd_kernel<<<(unsigned)((rows + 127) / 128), 128, 0, K3C_STREAM>>>(rows, row0, (int)n, wscale, (float)coef,
                                                                           logits, counts, dlogits);
    K3C_CU_LAUNCHED("aux_loss backward");
    return 0;
}

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
