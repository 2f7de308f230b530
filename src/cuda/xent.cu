/* xent.cu — fp32 CUDA twin of the masked (optionally per-position weighted) cross-entropy, forward (loss, lse) and
 * backward (ops/xent.c term by term). docs/TRAINING.md §5.3; declarations in cuda/cuda_ops.h. */
#include <limits.h>

#include "cuda/kernels.cuh"

namespace {

/* ================================================================ masked cross-entropy (xent.c) */
__device__ __forceinline__ bool xcounted(const int32_t *targets, const uint8_t *mask, int64_t t) {
    return targets[t] >= 0 && (!mask || mask[t]);
}

/* What the forward brings back to the host. */
struct xent_head {
    double sum;          /* Σ over counted rows of lse − logit[target] */
    long long count;     /* counted rows */
    long long bad;       /* first counted row with target >= V, or LLONG_MAX */
    int bad_target, pad; /* its target */
};

/* One block per row: each thread keeps a running max m and Σ e^{x − m} (in double, rescaled when m grows: one read of
 * the row), then the block combines them around the row max M. lse = M + log Σ (double, stored as float, as the CPU);
 * contrib[t] = lse − x[target] in double for counted rows with a valid target (read only for those). */
__global__ void xent_rows_kernel(int64_t T, int64_t V, const float *logits, const int32_t *targets, const uint8_t *mask,
                                 const float *weight, float *lse, double *contrib) {
    __shared__ float redf[32];
    __shared__ double redd[32];
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const float *x = logits + t * V;
        float m = -INFINITY;
        double s = 0;
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
            const float v = x[j];
            if (v > m) s *= exp((double)m - (double)v), m = v; /* from m = −inf: s = 0 stays 0 */
            if (m != -INFINITY) s += (double)expf(v - m);      /* m = −inf: v = −inf, whose term is 0 */
        }
        const float M = block_reduce(m, op_max(), redf);
        const double S = block_reduce(m == -INFINITY ? 0.0 : s * exp((double)m - (double)M), op_sum(), redd);
        if (threadIdx.x == 0) {
            const double l = (double)M + log(S);
            lse[t] = (float)l;
            if (contrib) {
                const int32_t tg = targets[t];
                const double c = xcounted(targets, mask, t) && tg < V ? l - (double)x[tg] : 0.0;
                contrib[t] = weight ? (double)weight[t] * c : c; /* the CPU's order: w · (lse − x) */
            }
        }
    }
}

/* One block: count, loss sum (double, fixed order) and the first bad target over all rows. */
__global__ void xent_total_kernel(int64_t T, int64_t V, const int32_t *targets, const uint8_t *mask,
                                  const double *contrib, xent_head *out) {
    __shared__ double redd[32];
    __shared__ long long redl[32];
    double s = 0;
    long long n = 0, bad = LLONG_MAX;
    for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
        if (!xcounted(targets, mask, t)) continue;
        if (targets[t] >= V)
            bad = bad < t ? bad : t;
        else
            n++, s += contrib[t];
    }
    s = block_reduce(s, op_sum(), redd);
    n = block_reduce(n, op_sum(), redl);
    bad = block_reduce(bad, op_min(), redl);
    if (threadIdx.x == 0) {
        out->sum = s, out->count = n, out->bad = bad, out->pad = 0;
        out->bad_target = bad < T ? targets[bad] : 0;
    }
}

/* One block: the number of counted rows with a valid target (the backward's divisor when norm = 0). */
__global__ void xent_count_kernel(int64_t T, int64_t V, const int32_t *targets, const uint8_t *mask, long long *count) {
    __shared__ long long redl[32];
    long long n = 0;
    for (int64_t t = threadIdx.x; t < T; t += blockDim.x) n += xcounted(targets, mask, t) && targets[t] < V;
    n = block_reduce(n, op_sum(), redl);
    if (threadIdx.x == 0) *count = n;
}

/* dlogits[t, j] += (float)(g · e^{x_j − lse_t}), then −= (float)g at the target, g = dloss / divisor in double
 * (the CPU's rounding steps). count (device) given: divisor = *count; else divisor = norm. Rows are skipped
 * block-uniformly. */
__global__ void xent_bwd_kernel(int64_t T, int64_t V, const float *logits, const int32_t *targets, const uint8_t *mask,
                                const float *weight, const float *lse, double dloss, double norm,
                                const long long *count, float *dlogits) {
    double g;
    if (count) {
        const long long n = *count;
        if (n == 0) return;
        g = dloss / (double)n;
    } else {
        g = dloss / norm;
    }
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const int32_t tg = targets[t];
        if (!xcounted(targets, mask, t) || tg >= V) continue;
        const double gt = weight ? g * (double)weight[t] : g; /* per row, as the CPU */
        const float gf = (float)gt;
        const float l = lse[t];
        const float *x = logits + t * V;
        float *d = dlogits + t * V;
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
            float v = d[j] + (float)(gt * (double)expf(x[j] - l));
            if (j == tg) v -= gf;
            d[j] = v;
        }
    }
}

int xent_check(const k3c_xent_sizes *s, const int32_t *targets, const char *op, k3c_err *err) {
    if (!s || s->T < 0 || s->V <= 0 || !(s->norm >= 0)) return k3c_errf(err, K3C_EINVAL, "%s: bad sizes", op);
    if (s->V > INT32_MAX) return k3c_errf(err, K3C_EINVAL, "%s: V = %lld exceeds int32 targets", op, (long long)s->V);
    if (s->T > 0 && !targets) return k3c_errf(err, K3C_EINVAL, "%s: targets is NULL", op);
    return 0;
}

/* Threads for a row of V logits: wide rows get whole 1024-thread blocks (one row per block is the parallelism). */
int xent_threads(int64_t V) { return V > 16384 ? 1024 : V > 1024 ? 256 : 128; }

/* Forward launches into scratch (head + T doubles), then brings the head back (synchronising). */
int xent_fwd_run(const k3c_xent_sizes *s, const float *logits, const int32_t *targets, const uint8_t *mask, float *lse,
                 void *scratch, xent_head *head, k3c_err *err) {
    xent_head *dhead = (xent_head *)scratch;
    double *contrib = (double *)((char *)scratch + sizeof(xent_head));
    xent_rows_kernel<<<grid_rows(s->T), xent_threads(s->V), 0, K3C_STREAM>>>(s->T, s->V, logits, targets, mask,
                                                                             s->weight, lse, contrib);
    K3C_CU_LAUNCHED("xent_rows");
    xent_total_kernel<<<1, 1024, 0, K3C_STREAM>>>(s->T, s->V, targets, mask, contrib, dhead);
    K3C_CU_LAUNCHED("xent_total");
    K3C_CU(cudaMemcpyAsync(head, dhead, sizeof *head, cudaMemcpyDeviceToHost, K3C_STREAM));
    K3C_CU(cudaStreamSynchronize(K3C_STREAM));
    return 0;
}

int xent_bwd_run(const k3c_xent_sizes *s, const float *logits, const int32_t *targets, const uint8_t *mask,
                 const float *lse, double dloss, long long *count, float *dlogits, k3c_err *err) {
    if (count) {
        xent_count_kernel<<<1, 1024, 0, K3C_STREAM>>>(s->T, s->V, targets, mask, count);
        K3C_CU_LAUNCHED("xent_count");
    }
    xent_bwd_kernel<<<grid_rows(s->T), xent_threads(s->V), 0, K3C_STREAM>>>(s->T, s->V, logits, targets, mask,
                                                                            s->weight, lse, dloss, s->norm, count,
                                                                            dlogits);
    K3C_CU_LAUNCHED("xent_bwd");
    return 0;
}

static_assert(sizeof(xent_head) == 32, "xent_head: the contributions that follow it must stay 8-byte aligned");

} // namespace

/* ================================================================ C entry points: cross-entropy */
extern "C" int k3c_xent_fwd_cuda(const k3c_xent_sizes *s, const float *logits, const int32_t *targets,
                                 const uint8_t *mask, float *lse, double *loss, int64_t *count, k3c_err *err) {
    int rc = xent_check(s, targets, "xent_fwd_cuda", err);
    if (rc) return rc;
    if (!loss || (s->T > 0 && !lse)) return k3c_errf(err, K3C_EINVAL, "xent_fwd_cuda: loss or lse is NULL");
    if (s->T == 0) {
        *loss = 0;
        if (count) *count = 0;
        return 0;
    }
    void *scratch = nullptr;
    K3C_CU(cudaMallocAsync(&scratch, sizeof(xent_head) + (size_t)s->T * sizeof(double), K3C_STREAM));
    xent_head head;
    rc = xent_fwd_run(s, logits, targets, mask, lse, scratch, &head, err);
    const cudaError_t fe = cudaFreeAsync(scratch, K3C_STREAM); /* on every path: the runs above may have failed */
    if (rc) return rc;
    if (fe != cudaSuccess)
        return k3c_errf(err, K3C_EDEVICE, "xent_fwd_cuda: cudaFreeAsync: %s", cudaGetErrorString(fe));
    if (head.bad != LLONG_MAX)
        return k3c_errf(err, K3C_EINVAL, "xent_fwd_cuda: position %lld has target %d outside [0, %lld)", head.bad,
                        head.bad_target, (long long)s->V);
    const int64_t n = head.count;
    if (count) *count = n;
    *loss = n ? head.sum / (s->norm > 0 ? s->norm : (double)n) : 0.0;
    return 0;
}

extern "C" int k3c_xent_bwd_cuda(const k3c_xent_sizes *s, const float *logits, const int32_t *targets,
                                 const uint8_t *mask, const float *lse, double dloss, float *dlogits, k3c_err *err) {
    int rc = xent_check(s, targets, "xent_bwd_cuda", err);
    if (rc || !dlogits || s->T == 0) return rc;
    if (s->norm > 0) return xent_bwd_run(s, logits, targets, mask, lse, dloss, nullptr, dlogits, err);
    void *scratch = nullptr; /* the count, as the divisor */
    K3C_CU(cudaMallocAsync(&scratch, sizeof(long long), K3C_STREAM));
    rc = xent_bwd_run(s, logits, targets, mask, lse, dloss, (long long *)scratch, dlogits, err);
    const cudaError_t fe = cudaFreeAsync(scratch, K3C_STREAM);
    if (rc) return rc;
    if (fe != cudaSuccess)
        return k3c_errf(err, K3C_EDEVICE, "xent_bwd_cuda: cudaFreeAsync: %s", cudaGetErrorString(fe));
    return 0;
}
