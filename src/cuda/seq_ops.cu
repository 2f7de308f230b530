/* seq_ops.cu — fp32 CUDA twins of the short convolution + SiLU, the KDA forget gate, the sigmoid gate / sigmoid and the
 * masked cross-entropy. ARCHITECTURE.md §3.1 steps 2 and 6, §3.4 stage 6 and "Short-conv backward", §4.2;
 * TRAINING.md §5.3.
 * Formulas are the CPU float ops' (ops/short_conv.c, kda_gate.c, gates.c, xent.c), term by term; declarations in
 * cuda/cuda_seq.h. */
#include <cooperative_groups.h>
#include <limits.h>

#include "cuda/common.cuh"
#include "cuda/cuda_seq.h"

namespace cg = cooperative_groups;

namespace {

/* ================================================================ shared device helpers */
/* The CPU's overflow-free sigmoid (exp only of non-positive numbers), so both round the same way. */
__device__ __forceinline__ float sigm(float x) {
    if (x >= 0.f) return 1.f / (1.f + expf(-x));
    const float e = expf(x);
    return e / (1.f + e);
}
__device__ __forceinline__ float softplus(float x) { return (x > 0.f ? x : 0.f) + log1pf(expf(-fabsf(x))); }
/* e^x rounded once from double: the per-head decay scale a = e^{A_log} multiplies every element of a head, so a
 * systematic 1–2 ulp difference of expf from the CPU's (near correctly rounded) expf would bias whole dA_log sums. */
__device__ __forceinline__ float exp_cr(float x) { return (float)exp((double)x); }

struct op_sum {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct op_max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct op_min {
    __device__ long long operator()(long long a, long long b) const { return a < b ? a : b; }
};

/* Whole-block reduction (blockDim a multiple of 32): butterfly inside each warp, then the warps' results in warp order,
 * so the result is the same on every run and in every thread. red: 32 shared slots, reusable across calls. */
template <typename T, typename Op> __device__ T block_reduce(T v, Op op, T *red) {
    for (int o = 16; o; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    T r = red[0];
    for (int i = 1; i < nw; i++) r = op(r, red[i]);
    return r;
}

unsigned grid_for(int64_t n, int threads) {
    const int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}
/* Grids that loop over rows (tokens): one block per row up to 2^20 rows, then block-stride. */
unsigned grid_rows(int64_t rows) { return (unsigned)(rows < (1 << 20) ? (rows > 0 ? rows : 1) : (1 << 20)); }
/* Threads for a block that strides over a row of n values: enough warps to cover it, at most 256. */
int threads_for_row(int64_t n) { return n >= 256 ? 256 : (int)((n + 31) / 32) * 32; }

/* ================================================================ short convolution (short_conv.c)
 * Conv state entry j of a channel is the input W−1−j tokens before the document's first: position s < t0 maps to
 * entry s − t0 + W − 1 (always >= 0 for the positions a window can reach). */

/* The document holding token t: the last i with cu[i] <= t (so empty documents are skipped). */
__device__ __forceinline__ int doc_of(const int32_t *cu, int n_docs, int64_t t) {
    if (!cu) return 0;
    int lo = 0, hi = n_docs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (cu[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* a_t[c] in the CPU's order (j ascending, positions before the start from st or skipped). */
__device__ __forceinline__ float sc_preact(const float *x, const float *w, const float *st, int64_t C, int W,
                                           int64_t t0, int64_t t, int64_t c) {
    float a = 0.f;
    for (int j = 0; j < W; j++) {
        const int64_t s = t - W + 1 + j;
        if (s >= t0)
            a += w[c * W + j] * x[s * C + c];
        else if (st)
            a += w[c * W + j] * st[c * (W - 1) + (s - t0 + W - 1)];
    }
    return a;
}

/* One block per token (block-stride): the document search is shared by the block's channels. mode 0: y = SiLU(a);
 * mode 1: da = dy · SiLU'(a) into out (the backward's first pass). */
__global__ void sc_act_kernel(int64_t T, int64_t C, int W, int n_docs, const int32_t *cu, const float *x,
                              const float *w, const float *state_in, const float *dy, float *out, int mode) {
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const int doc = doc_of(cu, n_docs, t);
        const int64_t t0 = cu ? cu[doc] : 0;
        const float *st = state_in ? state_in + (int64_t)doc * C * (W - 1) : nullptr;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            const float a = sc_preact(x, w, st, C, W, t0, t, c), s = sigm(a);
            out[t * C + c] = mode == 0 ? a * s : dy[t * C + c] * s * (1.f + a * (1.f - s));
        }
    }
}

/* state_out[doc, c, j] = input at position t1 − W + 1 + j. One thread per (doc, channel), j ascending: entry j reads
 * old entry j + len >= j, so an in-place update (state_out == state_in) never reads what it already overwrote. */
__global__ void sc_state_kernel(int64_t nd, int64_t T, int64_t C, int W, const int32_t *cu, const float *x,
                                const float *state_in, float *state_out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nd * C; i += (int64_t)gridDim.x * blockDim.x) {
        const int doc = (int)(i / C);
        const int64_t c = i - (int64_t)doc * C;
        const int64_t t0 = cu ? cu[doc] : 0, t1 = cu ? cu[doc + 1] : T;
        const float *st = state_in ? state_in + (int64_t)doc * C * (W - 1) : nullptr;
        float *so = state_out + (int64_t)doc * C * (W - 1);
        for (int j = 0; j < W - 1; j++) {
            const int64_t s = t1 - W + 1 + j;
            float v = 0.f;
            if (s >= t0)
                v = x[s * C + c];
            else if (st && s - t0 + W - 1 >= 0)
                v = st[c * (W - 1) + (s - t0 + W - 1)];
            so[c * (W - 1) + j] = v;
        }
    }
}

/* dx_t[c] += Σ_j w[c, j] · da_{t+W−1−j}[c] over later tokens of the same document, j ascending as on the CPU. */
__global__ void sc_dx_kernel(int64_t T, int64_t C, int W, int n_docs, const int32_t *cu, const float *w,
                             const float *da, float *dx) {
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const int doc = doc_of(cu, n_docs, t);
        const int64_t t1 = cu ? cu[doc + 1] : T;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float acc = dx[t * C + c];
            for (int j = 0; j < W; j++) {
                const int64_t u = t + W - 1 - j;
                if (u < t1) acc += w[c * W + j] * da[u * C + c];
            }
            dx[t * C + c] = acc;
        }
    }
}

/* Pass 1 of dw: thread (segment blockIdx.y, channel) sums its segment's tokens in order into part[seg, c, 0..W−1].
 * Positions before a document's start use the conv state (skipped without one, as on the CPU). */
__global__ void sc_dw_part_kernel(int64_t T, int64_t C, int W, int n_docs, int64_t seg_len, const int32_t *cu,
                                  const float *x, const float *state_in, const float *da, float *part) {
    const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, seg = blockIdx.y;
    if (c >= C) return;
    const int64_t ta = seg * seg_len, tb = ta + seg_len < T ? ta + seg_len : T;
    float acc[K3C_SHORT_CONV_MAX_W];
#pragma unroll
    for (int j = 0; j < K3C_SHORT_CONV_MAX_W; j++) acc[j] = 0.f;
    int doc = doc_of(cu, n_docs, ta);
    int64_t t0 = cu ? cu[doc] : 0, t1 = cu ? cu[doc + 1] : T;
    for (int64_t t = ta; t < tb; t++) {
        while (t >= t1) { /* only with cu: t < T = cu[n_docs] stops this inside the table */
            doc++;
            t0 = cu[doc], t1 = cu[doc + 1];
        }
        const float *st = state_in ? state_in + (int64_t)doc * C * (W - 1) : nullptr;
        const float g = da[t * C + c];
#pragma unroll
        for (int j = 0; j < K3C_SHORT_CONV_MAX_W; j++) { /* unrolled so acc stays in registers */
            if (j < W) {
                const int64_t s = t - W + 1 + j;
                if (s >= t0)
                    acc[j] += g * x[s * C + c];
                else if (st)
                    acc[j] += g * st[c * (W - 1) + (s - t0 + W - 1)];
            }
        }
    }
    float *p = part + (seg * C + c) * W;
#pragma unroll
    for (int j = 0; j < K3C_SHORT_CONV_MAX_W; j++)
        if (j < W) p[j] = acc[j];
}

/* Pass 2 of dw: each weight adds its segments' partial sums in segment order. */
__global__ void sc_dw_sum_kernel(int64_t CW, int64_t nseg, const float *part, float *dw) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < CW; e += (int64_t)gridDim.x * blockDim.x) {
        float acc = dw[e];
        for (int64_t s = 0; s < nseg; s++) acc += part[s * CW + e];
        dw[e] = acc;
    }
}

/* dstate_in[doc, c, js] += da_t · w[c, j] for the first W − 1 tokens of the document and the taps reaching before its
 * start, t then j ascending (the CPU's order); one thread per (doc, channel) owns those entries. */
__global__ void sc_dstate_kernel(int64_t nd, int64_t T, int64_t C, int W, const int32_t *cu, const float *w,
                                 const float *da, float *dstate) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nd * C; i += (int64_t)gridDim.x * blockDim.x) {
        const int doc = (int)(i / C);
        const int64_t c = i - (int64_t)doc * C;
        const int64_t t0 = cu ? cu[doc] : 0, t1 = cu ? cu[doc + 1] : T;
        const int64_t te = t0 + W - 1 < t1 ? t0 + W - 1 : t1;
        float *dst = dstate + ((int64_t)doc * C + c) * (W - 1);
        for (int64_t t = t0; t < te; t++)
            for (int j = 0; j < W; j++) {
                const int64_t s = t - W + 1 + j;
                if (s < t0) dst[s - t0 + W - 1] += da[t * C + c] * w[c * W + j];
            }
    }
}

/* Token segments of the dw pass: 256 tokens, longer when T would need more than 65535 (the grid's y limit). */
int64_t sc_segments(int64_t T, int64_t *seg_len) {
    int64_t L = 256;
    if ((T + L - 1) / L > 65535) L = (T + 65534) / 65535;
    *seg_len = L;
    return (T + L - 1) / L;
}

size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

int sc_check(const k3c_short_conv_dims *d, const int32_t *cu, const char *op, k3c_err *err) {
    if (!d || d->T < 0 || d->C <= 0 || d->W < 1 || d->W > K3C_SHORT_CONV_MAX_W)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (T >= 0, C > 0, W in 1..%d)", op, K3C_SHORT_CONV_MAX_W);
    if (cu && d->n_docs <= 0) return k3c_errf(err, K3C_EINVAL, "%s: n_docs = %d with cu_seqlens given", op, d->n_docs);
    return 0;
}

/* ================================================================ KDA forget gate (kda_gate.c) */
__global__ void gate_fwd_kernel(int64_t n, int64_t P, int64_t dk, int lb, float gmin, const float *z,
                                const float *dt_bias, const float *A_log, float *g) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = i % P;
        const float a = A_log ? exp_cr(A_log[c / dk]) : 1.f;
        const float u = z[i] + (dt_bias ? dt_bias[c] : 0.f);
        g[i] = lb ? gmin * sigm(a * u) : -a * softplus(u);
    }
}

#define GATE_THREADS 512
#define GATE_CLUSTER 8 /* blocks per head: the portable cluster size */
/* One thread-block cluster per head (it owns that head's dt_bias channels and its A_log entry, so no reduction leaves
 * the cluster and no workspace is needed): lanes take 32 consecutive channels (coalesced), the cluster's warps take
 * every (8·nw)-th token. Rank 0 adds the partial ddt_bias sums of every block's warps, read through distributed shared
 * memory in (rank, warp) order, and dA_log (double, as on the CPU) from each block's reduction in rank order:
 * deterministic. Every branch around a cluster barrier depends on kernel arguments only, so all threads reach it. */
__global__ void __cluster_dims__(GATE_CLUSTER, 1, 1)
    gate_bwd_kernel(int64_t T, int64_t P, int64_t dk, int lb, float gmin, const float *__restrict__ z,
                    const float *__restrict__ dt_bias, const float *__restrict__ A_log, const float *__restrict__ dg,
                    float *__restrict__ dz, float *__restrict__ ddt_bias, float *__restrict__ dA_log) {
    __shared__ float part[GATE_THREADS / 32][33];
    __shared__ double red[32];
    __shared__ double block_dA;
    cg::cluster_group cl = cg::this_cluster();
    const unsigned rank = cl.block_rank();
    const int64_t h = blockIdx.x / GATE_CLUSTER, cend = (h + 1) * dk;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t tstride = (int64_t)nw * GATE_CLUSTER;
    const float a = A_log ? exp_cr(A_log[h]) : 1.f;
    double dA = 0;
    for (int64_t c0 = h * dk; c0 < cend; c0 += 32) {
        const int64_t c = c0 + lane;
        float db = 0.f;
        if (c < cend) {
            const float bias = dt_bias ? dt_bias[c] : 0.f;
#pragma unroll 4
            for (int64_t t = rank * nw + warp; t < T; t += tstride) {
                const float u = z[t * P + c] + bias, G = dg[t * P + c];
                float du, dlogA;
                if (lb) { /* g = g_min σ(a u): ∂g/∂u = g_min a σ(1−σ); ∂g/∂A_log = g_min σ(1−σ) a u */
                    const float s = sigm(a * u), ds = gmin * s * (1.f - s);
                    du = ds * a;
                    dlogA = ds * a * u;
                } else { /* g = −a softplus(u): ∂g/∂u = −a σ(u); ∂g/∂A_log = g */
                    du = -a * sigm(u);
                    dlogA = -a * softplus(u);
                }
                if (dz) dz[t * P + c] += G * du;
                db += G * du;
                dA += (double)(G * dlogA);
            }
        }
        if (ddt_bias) {
            cl.sync(); /* rank 0 has finished reading every block's part for the previous channel group */
            part[warp][lane] = db;
            cl.sync();
            if (rank == 0 && warp == 0 && c < cend) {
                float s = ddt_bias[c];
                for (unsigned r = 0; r < GATE_CLUSTER; r++) {
                    const float *pr = cl.map_shared_rank(&part[0][0], r);
                    for (int i = 0; i < nw; i++) s += pr[i * 33 + lane];
                }
                ddt_bias[c] = s;
            }
        }
    }
    if (dA_log && A_log) {
        dA = block_reduce(dA, op_sum(), red);
        if (threadIdx.x == 0) block_dA = dA;
        cl.sync();
        if (rank == 0 && threadIdx.x == 0) {
            double s = 0;
            for (unsigned r = 0; r < GATE_CLUSTER; r++) s += *cl.map_shared_rank(&block_dA, r);
            dA_log[h] += (float)s;
        }
    }
    cl.sync(); /* no block leaves while rank 0 may still read its shared memory */
}

int gate_check(const k3c_kda_gate_dims *d, const char *op, k3c_err *err) {
    if (!d || d->T < 0 || d->H <= 0 || d->dk <= 0)
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (T >= 0, H > 0, dk > 0)", op);
    if (d->H > INT_MAX / 8) return k3c_errf(err, K3C_EINVAL, "%s: H = %lld heads is too many", op, (long long)d->H);
    if (d->form != K3C_GATE_SOFTPLUS && d->form != K3C_GATE_LOWER_BOUND)
        return k3c_errf(err, K3C_EINVAL, "%s: unknown gate form %d", op, d->form);
    if (d->form == K3C_GATE_LOWER_BOUND && d->g_min > 0)
        return k3c_errf(err, K3C_EINVAL, "%s: g_min = %g must be < 0", op, d->g_min);
    return 0;
}

/* ================================================================ sigmoid gate, sigmoid (gates.c) */
__global__ void sgate_fwd_kernel(int64_t n, const float *x, const float *z, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = x[i] * sigm(z[i]);
}
__global__ void sgate_bwd_kernel(int64_t n, const float *x, const float *z, const float *dy, float *dx, float *dz) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float sg = sigm(z[i]);
        if (dx) dx[i] += dy[i] * sg;
        if (dz) dz[i] += dy[i] * x[i] * sg * (1.f - sg);
    }
}
/* No __restrict__: y may alias x (each element is read before it is written, by the same thread). */
__global__ void sigmoid_kernel(int64_t n, const float *x, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = sigm(x[i]);
}
__global__ void sigmoid_bwd_kernel(int64_t n, const float *y, const float *dy, float *dx) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dx[i] += dy[i] * y[i] * (1.f - y[i]);
}

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
                                 float *lse, double *contrib) {
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
                contrib[t] = xcounted(targets, mask, t) && tg < V ? l - (double)x[tg] : 0.0;
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
                                const float *lse, double dloss, double norm, const long long *count, float *dlogits) {
    double g;
    if (count) {
        const long long n = *count;
        if (n == 0) return;
        g = dloss / (double)n;
    } else {
        g = dloss / norm;
    }
    const float gf = (float)g;
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const int32_t tg = targets[t];
        if (!xcounted(targets, mask, t) || tg >= V) continue;
        const float l = lse[t];
        const float *x = logits + t * V;
        float *d = dlogits + t * V;
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
            float v = d[j] + (float)(g * (double)expf(x[j] - l));
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
    xent_rows_kernel<<<grid_rows(s->T), xent_threads(s->V), 0, K3C_STREAM>>>(s->T, s->V, logits, targets, mask, lse,
                                                                             contrib);
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
    xent_bwd_kernel<<<grid_rows(s->T), xent_threads(s->V), 0, K3C_STREAM>>>(s->T, s->V, logits, targets, mask, lse,
                                                                            dloss, s->norm, count, dlogits);
    K3C_CU_LAUNCHED("xent_bwd");
    return 0;
}

static_assert(sizeof(xent_head) == 32, "xent_head: the contributions that follow it must stay 8-byte aligned");

} // namespace

/* ================================================================ C entry points: short convolution */
extern "C" int k3c_short_conv_fwd_cuda(const k3c_short_conv_dims *d, const int32_t *cu_seqlens, const float *x,
                                       const float *w, const float *state_in, float *y, float *state_out,
                                       k3c_err *err) {
    int rc = sc_check(d, cu_seqlens, "short_conv_fwd_cuda", err);
    if (rc) return rc;
    const int64_t nd = cu_seqlens ? d->n_docs : 1;
    if (d->T > 0) {
        sc_act_kernel<<<grid_rows(d->T), threads_for_row(d->C), 0, K3C_STREAM>>>(
            d->T, d->C, d->W, d->n_docs, cu_seqlens, x, w, state_in, nullptr, y, 0);
        K3C_CU_LAUNCHED("short_conv_fwd");
    }
    /* After the output kernel (stream order): state_out may be state_in, which that kernel reads. Runs for T = 0 too
     * (empty documents pass their state through). */
    if (state_out && d->W > 1) {
        sc_state_kernel<<<grid_for(nd * d->C, 256), 256, 0, K3C_STREAM>>>(nd, d->T, d->C, d->W, cu_seqlens, x, state_in,
                                                                          state_out);
        K3C_CU_LAUNCHED("short_conv_state");
    }
    return 0;
}

extern "C" size_t k3c_short_conv_bwd_workspace_cuda(const k3c_short_conv_dims *d) {
    if (!d || d->T <= 0 || d->C <= 0 || d->W < 1) return 0;
    int64_t L;
    const int64_t nseg = sc_segments(d->T, &L);
    return align256((size_t)(d->T * d->C) * sizeof(float)) + align256((size_t)(nseg * d->C * d->W) * sizeof(float));
}

extern "C" int k3c_short_conv_bwd_cuda(const k3c_short_conv_dims *d, const int32_t *cu_seqlens, const float *x,
                                       const float *w, const float *state_in, const float *dy, float *dx, float *dw,
                                       float *dstate_in, void *ws, k3c_err *err) {
    int rc = sc_check(d, cu_seqlens, "short_conv_bwd_cuda", err);
    if (rc) return rc;
    if (d->T == 0) return 0; /* no token: no gradient anywhere */
    if (!ws) return k3c_errf(err, K3C_EINVAL, "short_conv_bwd_cuda: ws is NULL");
    const int64_t T = d->T, C = d->C, nd = cu_seqlens ? d->n_docs : 1;
    const int W = d->W;
    float *da = (float *)ws;
    sc_act_kernel<<<grid_rows(T), threads_for_row(C), 0, K3C_STREAM>>>(T, C, W, d->n_docs, cu_seqlens, x, w, state_in,
                                                                       dy, da, 1);
    K3C_CU_LAUNCHED("short_conv_da");
    if (dx) {
        sc_dx_kernel<<<grid_rows(T), threads_for_row(C), 0, K3C_STREAM>>>(T, C, W, d->n_docs, cu_seqlens, w, da, dx);
        K3C_CU_LAUNCHED("short_conv_dx");
    }
    if (dw) {
        int64_t L;
        const int64_t nseg = sc_segments(T, &L);
        float *part = (float *)((char *)ws + align256((size_t)(T * C) * sizeof(float)));
        const dim3 grid((unsigned)((C + 127) / 128), (unsigned)nseg);
        sc_dw_part_kernel<<<grid, 128, 0, K3C_STREAM>>>(T, C, W, d->n_docs, L, cu_seqlens, x, state_in, da, part);
        K3C_CU_LAUNCHED("short_conv_dw_part");
        sc_dw_sum_kernel<<<grid_for(C * W, 256), 256, 0, K3C_STREAM>>>(C * W, nseg, part, dw);
        K3C_CU_LAUNCHED("short_conv_dw_sum");
    }
    if (dstate_in && W > 1) {
        sc_dstate_kernel<<<grid_for(nd * C, 256), 256, 0, K3C_STREAM>>>(nd, T, C, W, cu_seqlens, w, da, dstate_in);
        K3C_CU_LAUNCHED("short_conv_dstate");
    }
    return 0;
}

/* ================================================================ C entry points: KDA gate */
extern "C" int k3c_kda_gate_fwd_cuda(const k3c_kda_gate_dims *d, const float *z, const float *dt_bias,
                                     const float *A_log, float *g, k3c_err *err) {
    int rc = gate_check(d, "kda_gate_fwd_cuda", err);
    if (rc) return rc;
    const int64_t P = d->H * d->dk, n = d->T * P;
    if (n == 0) return 0;
    const float gmin = d->g_min != 0 ? (float)d->g_min : -5.f;
    gate_fwd_kernel<<<grid_for(n, 256), 256, 0, K3C_STREAM>>>(n, P, d->dk, d->form == K3C_GATE_LOWER_BOUND, gmin, z,
                                                              dt_bias, A_log, g);
    K3C_CU_LAUNCHED("kda_gate_fwd");
    return 0;
}

extern "C" int k3c_kda_gate_bwd_cuda(const k3c_kda_gate_dims *d, const float *z, const float *dt_bias,
                                     const float *A_log, const float *dg, float *dz, float *ddt_bias, float *dA_log,
                                     k3c_err *err) {
    int rc = gate_check(d, "kda_gate_bwd_cuda", err);
    if (rc) return rc;
    if (d->T == 0 || (!dz && !ddt_bias && !(dA_log && A_log))) return 0;
    const float gmin = d->g_min != 0 ? (float)d->g_min : -5.f;
    gate_bwd_kernel<<<(unsigned)(d->H * GATE_CLUSTER), GATE_THREADS, 0, K3C_STREAM>>>(
        d->T, d->H * d->dk, d->dk, d->form == K3C_GATE_LOWER_BOUND, gmin, z, dt_bias, A_log, dg, dz, ddt_bias, dA_log);
    K3C_CU_LAUNCHED("kda_gate_bwd");
    return 0;
}

/* ================================================================ C entry points: sigmoid gate, sigmoid */
extern "C" int k3c_sigmoid_gate_fwd_cuda(int64_t n, const float *x, const float *z, float *y, k3c_err *err) {
    if (n < 0) return k3c_errf(err, K3C_EINVAL, "sigmoid_gate_fwd_cuda: negative size %lld", (long long)n);
    if (n == 0) return 0;
    sgate_fwd_kernel<<<grid_for(n, 256), 256, 0, K3C_STREAM>>>(n, x, z, y);
    K3C_CU_LAUNCHED("sigmoid_gate_fwd");
    return 0;
}

extern "C" int k3c_sigmoid_gate_bwd_cuda(int64_t n, const float *x, const float *z, const float *dy, float *dx,
                                         float *dz, k3c_err *err) {
    if (n < 0) return k3c_errf(err, K3C_EINVAL, "sigmoid_gate_bwd_cuda: negative size %lld", (long long)n);
    if (n == 0 || (!dx && !dz)) return 0;
    sgate_bwd_kernel<<<grid_for(n, 256), 256, 0, K3C_STREAM>>>(n, x, z, dy, dx, dz);
    K3C_CU_LAUNCHED("sigmoid_gate_bwd");
    return 0;
}

extern "C" int k3c_sigmoid_cuda(int64_t n, const float *x, float *y, k3c_err *err) {
    if (n < 0) return k3c_errf(err, K3C_EINVAL, "sigmoid_cuda: negative size %lld", (long long)n);
    if (n == 0) return 0;
    sigmoid_kernel<<<grid_for(n, 256), 256, 0, K3C_STREAM>>>(n, x, y);
    K3C_CU_LAUNCHED("sigmoid");
    return 0;
}

extern "C" int k3c_sigmoid_bwd_cuda(int64_t n, const float *y, const float *dy, float *dx, k3c_err *err) {
    if (n < 0) return k3c_errf(err, K3C_EINVAL, "sigmoid_bwd_cuda: negative size %lld", (long long)n);
    if (n == 0 || !dx) return 0;
    sigmoid_bwd_kernel<<<grid_for(n, 256), 256, 0, K3C_STREAM>>>(n, y, dy, dx);
    K3C_CU_LAUNCHED("sigmoid_bwd");
    return 0;
}

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
