/* embedding.cu — fp32 CUDA twin of the token embedding: the gather (with the CPU op's bad-id error) and the scatter-add
 * backward (ops/embedding.c). docs/MODEL.md §1.1; declarations in cuda/cuda_ops.h. */
#include <limits.h>

#include "cuda/common.cuh"

/* The formulas below are the CPU float ops' (ops/embedding.c, rmsnorm.c, l2norm.c) operation by operation, including
 * where they widen to double. nvcc would fuse a float product into a following add (the CPU build does not contract),
 * so those products are written __fmul_rn to keep the twins within rounding of each other. */
namespace {

unsigned blocks_for(int64_t n, int64_t per_block) {
    const int64_t b = (n + per_block - 1) / per_block;
    return (unsigned)(b < (1 << 20) ? (b > 0 ? b : 1) : (1 << 20)); /* the kernels stride over the rest */
}

/* ================================================================ embedding */
/* first_bad ← min over tokens t with ids[t] ∉ [0, V) (left as initialised when all are valid). A thread's tokens
 * ascend, so its first bad one is its smallest. */
__global__ void embed_check_kernel(int64_t T, int64_t V, const int32_t *ids, int *first_bad) {
    __shared__ int blk;
    if (threadIdx.x == 0) blk = INT_MAX;
    __syncthreads();
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < T; t += (int64_t)gridDim.x * blockDim.x) {
        const int32_t id = ids[t];
        if (id < 0 || id >= V) {
            atomicMin(&blk, (int)t);
            break;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0 && blk != INT_MAX) atomicMin(first_bad, blk);
}

/* One block per token (striding): y[t,:] = E[ids[t],:]. Ids were validated before the launch. */
__global__ void embed_gather_kernel(int64_t T, int64_t D, const int32_t *ids, const float *E, float *y) {
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const float *src = E + (int64_t)ids[t] * D;
        float *dst = y + t * D;
        for (int64_t c = threadIdx.x; c < D; c += blockDim.x) dst[c] = src[c];
    }
}

/* dE[v,:] += dy[t,:] for every token t with ids[t] = v, in ascending t, as the CPU op does. Block b owns the vocabulary
 * rows [b·EMB_ROWS, (b+1)·EMB_ROWS): it scans the ids in chunks, lists the chunk's tokens that fall in its rows in token
 * order (warp ballots, warps in order), then adds their dy rows with thread c owning columns c, c + blockDim, ... So each
 * element of dE is summed by one thread in token order: no atomics, the same bits on every run (a float atomicAdd
 * commits in whatever order the hardware schedules). Ids outside [0, V) fall in no block: the backward cannot report,
 * so it skips them (the forward refuses them). */
constexpr int EMB_ROWS = 32, EMB_THREADS = 256;

__global__ void __launch_bounds__(EMB_THREADS)
    embed_scatter_kernel(int64_t T, int64_t V, int64_t D, const int32_t *ids, const float *dy, float *dE) {
    __shared__ int64_t list[EMB_THREADS];
    __shared__ int warp_base[EMB_THREADS / 32 + 1];
    const int64_t v0 = (int64_t)blockIdx.x * EMB_ROWS, v1 = v0 + EMB_ROWS < V ? v0 + EMB_ROWS : V;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t base = 0; base < T; base += EMB_THREADS) {
        const int64_t t = base + threadIdx.x;
        const int32_t id = t < T ? ids[t] : -1;
        const bool mine = id >= v0 && id < v1;
        const unsigned ballot = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) warp_base[warp + 1] = __popc(ballot);
        __syncthreads();
        if (threadIdx.x == 0) {
            warp_base[0] = 0;
            for (int w = 1; w <= EMB_THREADS / 32; w++) warp_base[w] += warp_base[w - 1];
        }
        __syncthreads();
        if (mine) list[warp_base[warp] + __popc(ballot & ((1u << lane) - 1))] = t;
        __syncthreads();
        const int n = warp_base[EMB_THREADS / 32];
        for (int i = 0; i < n; i++) {
            const int64_t tt = list[i];
            float *dst = dE + (int64_t)ids[tt] * D;
            const float *src = dy + tt * D;
            for (int64_t c = threadIdx.x; c < D; c += EMB_THREADS) dst[c] += src[c];
        }
        __syncthreads(); /* list and warp_base are refilled by the next chunk */
    }
}

} // namespace

extern "C" int k3c_embedding_fwd_cuda(const k3c_embedding_sizes *s, const int32_t *ids, const float *E, float *y,
                                      k3c_err *err) {
    /* y[0] doubles as the device flag, initialised to the byte pattern 0x7F7F7F7F, which no token index reaches. */
    const int none = 0x7F7F7F7F;
    const int64_t bound = ((int64_t)1 << 31) - ((int64_t)1 << 24); /* < 0x7F7F7F7F */
    if (!s || s->T < 0 || s->V <= 0 || s->D <= 0) return k3c_errf(err, K3C_EINVAL, "embedding_fwd_cuda: bad sizes");
    if (s->T >= bound)
        return k3c_errf(err, K3C_EINVAL, "embedding_fwd_cuda: %lld tokens (the CUDA twin takes fewer than %lld)",
                        (long long)s->T, (long long)bound);
    if (s->T == 0) return 0;
    int *flag = reinterpret_cast<int *>(y);
    K3C_CU(cudaMemsetAsync(flag, 0x7F, sizeof(int), K3C_STREAM));
    embed_check_kernel<<<blocks_for(s->T, 256), 256, 0, K3C_STREAM>>>(s->T, s->V, ids, flag);
    K3C_CU_LAUNCHED("embedding_check");
    int bad = none;
    K3C_CU(cudaMemcpyAsync(&bad, flag, sizeof(int), cudaMemcpyDeviceToHost, K3C_STREAM));
    K3C_CU(cudaStreamSynchronize(K3C_STREAM));
    if (bad != none) {
        int32_t id = 0;
        K3C_CU(cudaMemcpyAsync(&id, ids + bad, sizeof(int32_t), cudaMemcpyDeviceToHost, K3C_STREAM));
        K3C_CU(cudaStreamSynchronize(K3C_STREAM));
        return k3c_errf(err, K3C_EINVAL, "embedding_fwd_cuda: token %d has id %d outside [0, %lld)", bad, id,
                        (long long)s->V);
    }
    embed_gather_kernel<<<blocks_for(s->T, 1), 128, 0, K3C_STREAM>>>(s->T, s->D, ids, E, y);
    K3C_CU_LAUNCHED("embedding_gather");
    return 0;
}

extern "C" int k3c_embedding_bwd_cuda(const k3c_embedding_sizes *s, const int32_t *ids, const float *dy, float *dE,
                                      k3c_err *err) {
    if (!s || s->T < 0 || s->V <= 0 || s->D <= 0) return k3c_errf(err, K3C_EINVAL, "embedding_bwd_cuda: bad sizes");
    if (s->T == 0 || !dE) return 0;
    const int64_t blocks = (s->V + EMB_ROWS - 1) / EMB_ROWS;
    if (blocks > INT_MAX) return k3c_errf(err, K3C_EINVAL, "embedding_bwd_cuda: vocabulary of %lld", (long long)s->V);
    embed_scatter_kernel<<<(unsigned)blocks, EMB_THREADS, 0, K3C_STREAM>>>(s->T, s->V, s->D, ids, dy, dE);
    K3C_CU_LAUNCHED("embedding_scatter");
    return 0;
}
