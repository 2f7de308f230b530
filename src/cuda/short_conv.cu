/* short_conv.cu — fp32 CUDA twin of the causal short convolution + SiLU, forward and backward (ops/short_conv.c term by
 * term). docs/MODEL.md §3.1 step 2, §3.4 "Short-conv backward"; declarations in cuda/cuda_ops.h. */
#include <limits.h>

#include "cuda/kernels.cuh"

namespace {

/* ================================================================ short convolution (short_conv.c)
 * Conv state entry j of a channel is the input W−1−j tokens before the document's first: position s < t0 maps to
 * entry s − t0 + W − 1 (always >= 0 for the positions a window can reach). */


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
        const int doc = k3c_cu::doc_of(cu, n_docs, t);
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
        const int doc = k3c_cu::doc_of(cu, n_docs, t);
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
    int doc = k3c_cu::doc_of(cu, n_docs, ta);
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
