/* quantile_balance.cu — Quantile Balancing on the GPU: the CUDA twin of the backend table's quantile_balance entry
 * (k3c_qb_update of ops/quantile_balance.c over s = sigmoid(router logits)), exact and histogram, and of its baseline
 * arm bias_balance (ops/bias_balance.c, DeepSeek-V3's sign step). docs/MODEL.md §7.2–§7.3, docs/TRAINING.md §1.6.
 *
 * Everything stays on the device, so the trainer never waits for a router: scores s_ij = (float)sigmoid(double logit)
 * and r_ij = α_i − s_ij as on the CPU; exact: per expert one block finds the ascending order statistic q = ⌊m·k/n⌋ of
 * its column by a 4-pass radix select over order-preserving integer keys (the value is a function of the multiset, so
 * it equals the CPU quickselect's); histogram: the CPU's bins (range from the current bias, in double, without FMA
 * contraction) and read-out. The centring sums in double in expert order on one thread, as k3c_qb_centre does, so
 * given equal b̃ the new bias is bitwise the CPU's (scores may differ from glibc's exp by an ulp of the double, which
 * rounds away in float almost always). A non-finite score, cutoff or bias leaves b unchanged (the CPU returns
 * K3C_ENUMERIC), and m = 0 leaves it unchanged as on the CPU. */
#include "cuda/common.cuh"

extern "C" {
#include "cuda/cuda_optim.h"
}

namespace {

constexpr int NT = 256;

size_t align64(size_t b) { return (b + 63) / 64 * 64; }

/* ws: flags (int32: [0] bad input) | b̃ [n] | double range (lo, width) | r [n, m] (exact) or counts [n, bins] (hist) */
struct qb_ws {
    int32_t *flag;
    float *b_raw;
    double *range;
    float *r;
    unsigned long long *counts;
};

qb_ws carve(void *ws, int64_t m, int64_t n) {
    char *p = static_cast<char *>(ws);
    qb_ws w;
    w.flag = reinterpret_cast<int32_t *>(p), p += 64;
    w.b_raw = reinterpret_cast<float *>(p), p += align64(sizeof(float) * (size_t)n);
    w.range = reinterpret_cast<double *>(p), p += 64;
    w.r = reinterpret_cast<float *>(p);
    w.counts = reinterpret_cast<unsigned long long *>(p);
    return w;
}

__device__ float score(float logit) { /* k3c_sigmoid_d, rounded to float */
    const double x = (double)logit;
    if (x >= 0) return (float)(1.0 / (1.0 + exp(-x)));
    const double e = exp(x);
    return (float)(e / (1.0 + e));
}

/* r[j, i] = α_i − s_ij (transposed: one contiguous column per expert) */
__global__ void residual_kernel(const float *logits, const float *cutoff, int64_t m, int64_t n, float *r,
                                int32_t *flag) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < m * n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = idx / n, j = idx % n;
        const float v = __fsub_rn(cutoff[i], score(logits[idx]));
        if (!isfinite(v)) *flag = 1;
        r[j * m + i] = v;
    }
}

/* Order-preserving map float → uint32 (negative floats reversed), and back. */
__device__ uint32_t to_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ float from_key(uint32_t k) { return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

/* Block j: b̃_j = the element of ascending rank q of column j (radix select, 8 bits a pass from the top). */
__global__ void select_kernel(const float *r, int64_t m, int64_t q, float *b_raw, const int32_t *flag) {
    __shared__ uint32_t hist[256];
    __shared__ uint32_t prefix, mask;
    __shared__ int64_t rank;
    if (*flag) return;
    const float *col = r + (int64_t)blockIdx.x * m;
    if (threadIdx.x == 0) prefix = 0, mask = 0, rank = q;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
            const uint32_t k = to_key(col[i]);
            if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int64_t below = 0;
            int d = 0;
            while (below + hist[d] <= rank) below += hist[d++];
            rank -= below;
            prefix |= (uint32_t)d << shift;
            mask |= 255u << shift;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) b_raw[blockIdx.x] = from_key(prefix);
}

/* k3c_qb_hist_begin: lo = b_min − 1, width = (b_max − b_min + 2) / bins; a non-finite bias sets the flag. */
__global__ void range_kernel(const float *b, int64_t n, int64_t bins, double *range, int32_t *flag) {
    double bmin = INFINITY, bmax = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        if (!isfinite(b[j])) *flag = 1;
        bmin = b[j] < bmin ? b[j] : bmin;
        bmax = b[j] > bmax ? b[j] : bmax;
    }
    range[0] = __dsub_rn(bmin, 1.0);
    range[1] = __ddiv_rn(__dadd_rn(__dsub_rn(bmax, bmin), 2.0), (double)bins);
}

/* k3c_qb_hist_add: block j counts its expert's r_ij into bins (shared counters, then one row of counts). */
__global__ void count_kernel(const float *logits, const float *cutoff, int64_t m, int64_t n, const double *range,
                             unsigned long long *counts, int32_t *flag) {
    __shared__ unsigned long long row[K3C_QB_BINS];
    if (*flag) return; /* a non-finite bias: no range to bin into (the whole block returns) */
    const int64_t j = blockIdx.x;
    for (int b = threadIdx.x; b < K3C_QB_BINS; b += blockDim.x) row[b] = 0;
    __syncthreads();
    const double lo = range[0], inv_w = __ddiv_rn(1.0, range[1]);
    for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
        const double r = __dsub_rn((double)cutoff[i], (double)score(logits[i * n + j]));
        if (!isfinite(r)) {
            *flag = 1;
            continue;
        }
        const double x = floor(__dmul_rn(__dsub_rn(r, lo), inv_w));
        const int bin = x < 0 ? 0 : x >= (double)K3C_QB_BINS ? K3C_QB_BINS - 1 : (int)x;
        atomicAdd(&row[bin], 1ull);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < K3C_QB_BINS; b += blockDim.x) counts[j * K3C_QB_BINS + b] = row[b];
}

/* k3c_qb_hist_readout: thread j walks its row to the bin where the ascending count reaches ⌈q⌉, q = tokens·k/n. */
__global__ void readout_kernel(const unsigned long long *counts, int64_t n, int64_t k, const double *range,
                               float *b_raw, int32_t *flag) {
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n || *flag) return;
    int64_t tokens = 0;
    for (int b = 0; b < K3C_QB_BINS; b++) tokens += (int64_t)counts[b];
    const double q = __ddiv_rn(__dmul_rn((double)tokens, (double)k), (double)n);
    const int64_t target = (tokens * k + n - 1) / n;
    const unsigned long long *row = counts + j * K3C_QB_BINS;
    int64_t c = 0;
    int bin = 0;
    while (bin < K3C_QB_BINS && c + (int64_t)row[bin] < target) c += (int64_t)row[bin++];
    if (bin == K3C_QB_BINS) { /* cannot happen: every expert holds every token once */
        *flag = 2;
        return;
    }
    double frac = __ddiv_rn(__dsub_rn(q, (double)c), (double)row[bin]);
    frac = frac < 0 ? 0 : frac > 1 ? 1 : frac;
    b_raw[j] = (float)__dadd_rn(range[0], __dmul_rn(__dadd_rn((double)bin, frac), range[1]));
}

/* k3c_qb_centre into b, unless the input was bad: the double sum in expert order, as on the CPU. */
__global__ void centre_kernel(const float *b_raw, int64_t n, float *b, const int32_t *flag) {
    if (*flag) return;
    double sum = 0;
    for (int64_t j = 0; j < n; j++) sum = __dadd_rn(sum, (double)b_raw[j]);
    const double mean = __ddiv_rn(sum, (double)n);
    for (int64_t j = 0; j < n; j++) b[j] = (float)__dsub_rn((double)b_raw[j], mean);
}

/* ---------------------------------------------------------------- the auxiliary-loss-free bias step */
__global__ void route_count_kernel(int64_t mk, int64_t n, const int32_t *ids, unsigned long long *loads) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < mk; i += (int64_t)gridDim.x * blockDim.x)
        if (ids[i] >= 0 && ids[i] < n) atomicAdd(loads + ids[i], 1ULL);
}

/* b_j += γ·sign(Σ loads − n·load_j), the sign decided in integers (k3c_bias_update); a flagged input leaves b as it was. */
__global__ void bias_step_kernel(const unsigned long long *loads, int64_t n, double gamma, float *b, const int *flag) {
    if (*flag) return;
    long long total = 0;
    for (int64_t j = 0; j < n; j++) total += (long long)loads[j];
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const long long d = total - n * (long long)loads[j];
        b[j] = (float)__dadd_rn((double)b[j], d > 0 ? gamma : d < 0 ? -gamma : 0.0);
    }
}

} // namespace

extern "C" size_t k3c_bias_balance_workspace_cuda(int64_t m, int64_t n, int64_t k) {
    const size_t mk = (size_t)(m > 0 ? m : 0) * (size_t)(k > 0 ? k : 0);
    return 64 + align64(sizeof(int32_t) * mk) + align64(sizeof(float) * mk) +
           sizeof(unsigned long long) * (size_t)(n > 0 ? n : 1);
}

extern "C" int k3c_bias_balance_cuda(void *ctx, const float *logits, int64_t m, int64_t n, int64_t k, double gamma,
                                     float *b, void *ws, k3c_err *err) {
    (void)ctx;
    if (m < 0 || n < 2 || k < 1 || k >= n || k > K3C_ROUTER_MAX_TOPK)
        return k3c_errf(err, K3C_EINVAL, "bias_balance: bad sizes m = %lld, n = %lld, k = %lld (need 1 <= k < n)",
                        (long long)m, (long long)n, (long long)k);
    if (!(gamma > 0) || !isfinite(gamma))
        return k3c_errf(err, K3C_EINVAL, "bias_balance: gamma %g, must be finite and > 0", gamma);
    if (m == 0) return K3C_OK;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "bias_balance (cuda): the workspace is required");
    const size_t mk = (size_t)m * (size_t)k;
    char *p = static_cast<char *>(ws);
    int *flag = reinterpret_cast<int *>(p);
    int32_t *ids = reinterpret_cast<int32_t *>(p + 64);
    float *w = reinterpret_cast<float *>(p + 64 + align64(sizeof(int32_t) * mk));
    unsigned long long *loads =
        reinterpret_cast<unsigned long long *>(p + 64 + align64(sizeof(int32_t) * mk) + align64(sizeof(float) * mk));
    K3C_CU(cudaMemsetAsync(flag, 0, sizeof *flag, K3C_STREAM));
    K3C_CU(cudaMemsetAsync(loads, 0, sizeof *loads * (size_t)n, K3C_STREAM));
    k3c_router_sizes rs = {m, n, k, 0, 1.0};
    const int rc = k3c_router_fwd_cuda(&rs, logits, b, ids, w, nullptr, flag, err);
    if (rc) return rc;
    const int64_t blocks = ((int64_t)mk + NT - 1) / NT;
    route_count_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), NT, 0, K3C_STREAM>>>((int64_t)mk, n, ids, loads);
    K3C_CU_LAUNCHED("bias_balance counts");
    bias_step_kernel<<<1, NT, 0, K3C_STREAM>>>(loads, n, gamma, b, flag);
    K3C_CU_LAUNCHED("bias_balance step");
    return K3C_OK;
}

extern "C" size_t k3c_quantile_balance_workspace_cuda(int mode, int64_t m, int64_t n) {
    const size_t head = 64 + align64(sizeof(float) * (size_t)n) + 64;
    if (mode == K3C_QB_HISTOGRAM) return head + sizeof(unsigned long long) * (size_t)n * K3C_QB_BINS;
    return head + sizeof(float) * (size_t)m * (size_t)n;
}

extern "C" int k3c_quantile_balance_cuda(void *ctx, int mode, const float *logits, const float *cutoff, int64_t m,
                                         int64_t n, int64_t k, float *b, void *ws, k3c_err *err) {
    (void)ctx;
    if (m < 0 || n < 2 || k < 1 || k >= n)
        return k3c_errf(err, K3C_EINVAL, "qb_update: bad sizes m = %lld, n = %lld, k = %lld (need 1 <= k < n)",
                        (long long)m, (long long)n, (long long)k);
    if (mode != K3C_QB_EXACT && mode != K3C_QB_HISTOGRAM)
        return k3c_errf(err, K3C_EINVAL, "qb_update: unknown mode %d", mode);
    if (m == 0) return K3C_OK; /* no counted token: b unchanged */
    if (!ws) return k3c_errf(err, K3C_EINVAL, "qb_update (cuda): the workspace is required");
    qb_ws w = carve(ws, m, n);
    K3C_CU(cudaMemsetAsync(w.flag, 0, sizeof *w.flag, K3C_STREAM));
    const unsigned grid = (unsigned)((m * n + NT - 1) / NT < 4096 ? (m * n + NT - 1) / NT : 4096);
    if (mode == K3C_QB_EXACT) {
        residual_kernel<<<grid, NT, 0, K3C_STREAM>>>(logits, cutoff, m, n, w.r, w.flag);
        K3C_CU_LAUNCHED("qb residuals");
        select_kernel<<<(unsigned)n, NT, 0, K3C_STREAM>>>(w.r, m, m * k / n, w.b_raw, w.flag);
        K3C_CU_LAUNCHED("qb select");
    } else {
        range_kernel<<<1, 1, 0, K3C_STREAM>>>(b, n, K3C_QB_BINS, w.range, w.flag);
        K3C_CU_LAUNCHED("qb range");
        count_kernel<<<(unsigned)n, NT, 0, K3C_STREAM>>>(logits, cutoff, m, n, w.range, w.counts, w.flag);
        K3C_CU_LAUNCHED("qb counts");
        readout_kernel<<<(unsigned)((n + NT - 1) / NT), NT, 0, K3C_STREAM>>>(w.counts, n, k, w.range, w.b_raw, w.flag);
        K3C_CU_LAUNCHED("qb readout");
    }
    centre_kernel<<<1, 1, 0, K3C_STREAM>>>(w.b_raw, n, b, w.flag);
    K3C_CU_LAUNCHED("qb centre");
    return K3C_OK;
}
