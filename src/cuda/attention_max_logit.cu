/* attention_max_logit.cu — fp32 CUDA twin of k3c_attention_max_logit: the per-head maximum causal attention logit
 * S_max that QK-Clip reads (ops/attention.c). docs/MODEL.md §10.2; declarations in cuda/cuda_ops.h. */
#include <limits.h>
#include <math.h>

#include <vector>

#include "cuda/common.cuh"

namespace {

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ================================================================ QK-Clip S_max
 * One block per (query tile of 128, head), 256 threads: 128×128 score tiles built from k-chunks of 16 staged
 * transposed in shared memory (the next chunk prefetched into registers meanwhile), an 8×8 register tile per thread
 * (rows ty·4 + {0..3, 64..67}, columns likewise: conflict-free float4 reads), the causal / document mask applied to
 * the scaled scores (rows before q_begin are context parallelism's padding, no queries), and the block's maximum
 * merged into smax through atomicMax on order-preserving integer keys (decoded in place afterwards). */
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
    const int b = cu[k3c_cu::doc_of(cu, n_docs, i)];
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

__global__ void __launch_bounds__(256)
    max_logit_kernel(int T, int H, int dqk, int n_docs, const int32_t *cu, int q_begin, float scale, const float *q,
                     const float *k, int *key) {
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
                if (rows[r] < T && rows[r] >= q_begin && j <= rows[r] && j >= bos[r])
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

} // namespace

/* ================================================================ C entry point: QK-Clip S_max */
extern "C" int k3c_attention_max_logit_cuda(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const float *q,
                                            const float *k, float *smax, k3c_err *err) {
    if (!s || s->T < 0 || s->T > (1 << 30) || s->H <= 0 || s->H > 65535 || s->dqk <= 0 || s->H * s->dqk > INT32_MAX ||
        !isfinite(s->scale))
        return k3c_errf(err, K3C_EINVAL,
                        "attention_max_logit_cuda: bad sizes (0 <= T <= 2^30, 0 < H <= 65535, dqk > 0, "
                        "scale finite)");
    if (!smax) return k3c_errf(err, K3C_EINVAL, "attention_max_logit_cuda: NULL smax");
    if (s->q_begin < 0 || s->q_begin > s->T)
        return k3c_errf(err, K3C_EINVAL, "attention_max_logit_cuda: q_begin %lld outside [0, T = %lld]",
                        (long long)s->q_begin, (long long)s->T);
    if (cu_seqlens && (s->n_docs <= 0 || s->n_docs > INT32_MAX - 1))
        return k3c_errf(err, K3C_EINVAL, "attention_max_logit_cuda: cu_seqlens given with n_docs %lld",
                        (long long)s->n_docs);
    const int T = (int)s->T, H = (int)s->H, nd = cu_seqlens ? (int)s->n_docs : 1;
    int *key = reinterpret_cast<int *>(smax);
    smax_init_kernel<<<(H + 255) / 256, 256, 0, K3C_STREAM>>>(H, key);
    K3C_CU_LAUNCHED("max_logit_init");
    if (T > 0) {
        max_logit_kernel<<<dim3((unsigned)((T + BM - 1) / BM), (unsigned)H), 256, 0, K3C_STREAM>>>(
            T, H, (int)s->dqk, nd, cu_seqlens, (int)s->q_begin, (float)s->scale, q, k, key);
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
