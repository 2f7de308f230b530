/* short_conv.cu — fp32 CUDA twin of the causal short convolution + SiLU, forward and backward in one pass over the
 * tokens each (ops/short_conv.c term by term). docs/MODEL.md §3.1 step 2, §3.4 "Short-conv backward"; declarations
 * in cuda/cuda_ops.h. */
#include "cuda/kernels.cuh"

namespace {

/* ================================================================ short convolution (short_conv.c)
 * Conv state entry j of a channel is the input W−1−j tokens before the document's first: position s < t0 maps to
 * entry s − t0 + W − 1 (always >= 0 for the positions a window can reach). */

/* Each thread walks one channel through a segment of consecutive tokens with the channel's window of inputs (and, in
 * the backward, of pre-activation gradients) in registers, so every input is read from memory once. MW is the window
 * the registers hold: W itself (EXACT, the usual W = 4) or K3C_SHORT_CONV_MAX_W for any W; logical tap j of the W taps
 * sits in slot MW − W + j. */
constexpr int SC_SEG = 64;      /* tokens per thread */
constexpr int SC_THREADS = 128; /* channels per block */

/* v[i] = the input at position u − (MW − 1) + i for i < MW − 1 (slot MW − 1 takes x_u itself): positions before the
 * document's start t0 come from its conv state st (zero without one, or out of the state's reach). */
template <int MW>
__device__ __forceinline__ void sc_fill(float (&v)[MW], const float *x, const float *st, int64_t C, int W, int64_t t0,
                                        int64_t u, int64_t c) {
#pragma unroll
    for (int i = 0; i < MW - 1; i++) {
        const int64_t s = u - (MW - 1) + i;
        float val = 0.f;
        if (s >= t0)
            val = x[s * C + c];
        else if (st && s - t0 + W - 1 >= 0)
            val = st[c * (W - 1) + (s - t0 + W - 1)];
        v[i] = val;
    }
}

/* A segment's walk over documents: the document of its first token, then the next non-empty one when a token
 * reaches the current one's end (empty documents hold no token). */
struct sc_docs {
    const int32_t *cu;
    const float *state_in;
    int64_t C, T, t0, t1;
    int W, doc;
    __device__ sc_docs(const int32_t *cu_, int n_docs, const float *st, int64_t C_, int64_t T_, int W_, int64_t t)
        : cu(cu_), state_in(st), C(C_), T(T_), W(W_), doc(k3c_cu::doc_of(cu_, n_docs, t)) {
        t0 = cu ? cu[doc] : 0, t1 = cu ? cu[doc + 1] : T;
    }
    __device__ const float *state() const { return state_in ? state_in + (int64_t)doc * C * (W - 1) : nullptr; }
    /* true when token t opens a later document (only with cu: t < T = cu[n_docs] stops inside the table) */
    __device__ bool advance(int64_t t) {
        if (t < t1) return false;
        while (t >= t1) doc++, t0 = cu[doc], t1 = cu[doc + 1];
        return true;
    }
};

/* a = Σ_j w_j · window_j, j ascending (the CPU's order); wr[MW − W + j] = w[c, j]. */
template <int MW> __device__ __forceinline__ float sc_dot(const float (&wr)[MW], const float (&v)[MW], int W) {
    float a = 0.f;
#pragma unroll
    for (int i = 0; i < MW; i++)
        if (i >= MW - W) a += wr[i] * v[i];
    return a;
}

template <int MW> __device__ __forceinline__ void sc_shift(float (&v)[MW]) {
#pragma unroll
    for (int i = 0; i < MW - 1; i++) v[i] = v[i + 1];
}

/* y_t = SiLU(a_t) for the segment blockIdx.y of seg_len tokens, channel blockIdx.x · blockDim.x + threadIdx.x. */
template <int MW, bool EXACT>
__global__ void sc_fwd_kernel(int64_t T, int64_t C, int W_, int n_docs, int64_t seg_len, const int32_t *cu,
                              const float *x, const float *w, const float *state_in, float *y) {
    const int W = EXACT ? MW : W_;
    const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, ta = (int64_t)blockIdx.y * seg_len;
    if (c >= C || ta >= T) return;
    const int64_t tb = ta + seg_len < T ? ta + seg_len : T;
    float wr[MW], v[MW];
#pragma unroll
    for (int i = 0; i < MW; i++) wr[i] = i >= MW - W ? w[c * W + i - (MW - W)] : 0.f;
    sc_docs dc(cu, n_docs, state_in, C, T, W, ta);
    sc_fill(v, x, dc.state(), C, W, dc.t0, ta, c);
    for (int64_t t = ta; t < tb; t++) {
        if (dc.advance(t)) sc_fill(v, x, dc.state(), C, W, dc.t0, t, c);
        v[MW - 1] = x[t * C + c];
        const float a = sc_dot(wr, v, W);
        y[t * C + c] = a * sigm(a);
        sc_shift(v);
    }
}

/* The whole backward of segment blockIdx.y in one walk: for each token u of the segment and the W − 1 after it,
 * da_u = dy_u · SiLU'(a_u) (recomputed from x); the segment's dw partial sums Σ_u da_u · window_u (u in the segment,
 * ascending) into part[seg, c, 0..W−1]; dx_t += Σ_j w_j · da_{t+W−1−j} over the same document, j ascending, once
 * da_{t+W−1} is known. da_out (for the state gradient) receives the segment's da. */
template <int MW, bool EXACT>
__global__ void sc_bwd_kernel(int64_t T, int64_t C, int W_, int n_docs, int64_t seg_len, const int32_t *cu,
                              const float *x, const float *w, const float *state_in, const float *dy, float *dx,
                              float *part, float *da_out) {
    const int W = EXACT ? MW : W_;
    const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, ta = (int64_t)blockIdx.y * seg_len;
    if (c >= C || ta >= T) return;
    const int64_t tb = ta + seg_len < T ? ta + seg_len : T;
    float wr[MW], wx[MW], v[MW], acc[MW], dr[MW];
    int dd[MW]; /* the document of each da in dr; −1: no token */
#pragma unroll
    for (int i = 0; i < MW; i++) {
        wr[i] = i >= MW - W ? w[c * W + i - (MW - W)] : 0.f;
        wx[i] = i >= MW - W ? w[c * W + (W - 1) - (i - (MW - W))] : 0.f; /* dr slot i holds da_{t+i−(MW−W)}: tap W−1−· */
        acc[i] = dr[i] = 0.f, dd[i] = -1;
    }
    sc_docs dc(cu, n_docs, state_in, C, T, W, ta);
    sc_fill(v, x, dc.state(), C, W, dc.t0, ta, c);
    for (int64_t u = ta; u < tb + W - 1; u++) {
        float da = 0.f;
        int du = -1;
        if (u < T) {
            if (dc.advance(u)) sc_fill(v, x, dc.state(), C, W, dc.t0, u, c);
            v[MW - 1] = x[u * C + c];
            const float a = sc_dot(wr, v, W), s = sigm(a);
            da = dy[u * C + c] * s * (1.f + a * (1.f - s)), du = dc.doc;
            if (u < tb) {
#pragma unroll
                for (int i = 0; i < MW; i++)
                    if (i >= MW - W) acc[i] += da * v[i];
                if (da_out) da_out[u * C + c] = da;
            }
            sc_shift(v);
        }
        sc_shift(dr);
#pragma unroll
        for (int i = 0; i < MW - 1; i++) dd[i] = dd[i + 1];
        dr[MW - 1] = da, dd[MW - 1] = du;
        const int64_t t = u - (W - 1);
        if (dx && t >= ta) {
            const int doc = dd[MW - W];
            float g = dx[t * C + c];
#pragma unroll
            for (int i = MW - 1; i >= 0; i--) /* j = W − 1 − (i − (MW − W)) ascending */
                if (i >= MW - W && dd[i] == doc) g += wx[i] * dr[i];
            dx[t * C + c] = g;
        }
    }
    float *p = part + ((int64_t)blockIdx.y * C + c) * W;
#pragma unroll
    for (int i = 0; i < MW; i++)
        if (i >= MW - W) p[i - (MW - W)] = acc[i];
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

/* Pass 2 of dw: dw[e] += Σ_seg part[seg, e]. A block serves 32 weights (one per lane, coalesced); warp k sums the
 * segments k, k + 8, ... in order, then the eight sums are added in warp order (deterministic). */
__global__ void sc_dw_sum_kernel(int64_t CW, int64_t nseg, const float *part, float *dw) {
    __shared__ float red[8][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t e = blockIdx.x * 32LL + lane;
    float acc = 0.f;
    if (e < CW)
        for (int64_t s = warp; s < nseg; s += 8) acc += part[s * CW + e];
    red[warp][lane] = acc;
    __syncthreads();
    if (warp || e >= CW) return;
    float sum = dw[e];
    for (int k = 0; k < 8; k++) sum += red[k][lane];
    dw[e] = sum;
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

/* Token segments of the segment kernels: SC_SEG tokens, longer when T would need more than 65535 (the grid's y limit). */
int64_t sc_segments(int64_t T, int64_t *seg_len) {
    int64_t L = SC_SEG;
    if ((T + L - 1) / L > 65535) L = (T + 65534) / 65535;
    *seg_len = L;
    return (T + L - 1) / L;
}

dim3 sc_grid(int64_t C, int64_t nseg) { return dim3((unsigned)((C + SC_THREADS - 1) / SC_THREADS), (unsigned)nseg); }

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
        int64_t L;
        const dim3 grid = sc_grid(d->C, sc_segments(d->T, &L));
        if (d->W == 4)
            sc_fwd_kernel<4, true><<<grid, SC_THREADS, 0, K3C_STREAM>>>(d->T, d->C, d->W, d->n_docs, L, cu_seqlens, x,
                                                                        w, state_in, y);
        else
            sc_fwd_kernel<K3C_SHORT_CONV_MAX_W, false><<<grid, SC_THREADS, 0, K3C_STREAM>>>(
                d->T, d->C, d->W, d->n_docs, L, cu_seqlens, x, w, state_in, y);
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
    int64_t L;
    const int64_t nseg = sc_segments(T, &L);
    /* da is stored only for the state gradient; the partial sums of dw always have their place */
    float *da = dstate_in && W > 1 ? (float *)ws : nullptr;
    float *part = (float *)((char *)ws + align256((size_t)(T * C) * sizeof(float)));
    const dim3 grid = sc_grid(C, nseg);
    if (W == 4)
        sc_bwd_kernel<4, true><<<grid, SC_THREADS, 0, K3C_STREAM>>>(T, C, W, d->n_docs, L, cu_seqlens, x, w, state_in,
                                                                    dy, dx, part, da);
    else
        sc_bwd_kernel<K3C_SHORT_CONV_MAX_W, false><<<grid, SC_THREADS, 0, K3C_STREAM>>>(
            T, C, W, d->n_docs, L, cu_seqlens, x, w, state_in, dy, dx, part, da);
    K3C_CU_LAUNCHED("short_conv_bwd");
    if (dw) {
        sc_dw_sum_kernel<<<(unsigned)((C * W + 31) / 32), 256, 0, K3C_STREAM>>>(C * W, nseg, part, dw);
        K3C_CU_LAUNCHED("short_conv_dw_sum");
    }
    if (dstate_in && W > 1) {
        sc_dstate_kernel<<<grid_for(nd * C, 256), 256, 0, K3C_STREAM>>>(nd, T, C, W, cu_seqlens, w, da, dstate_in);
        K3C_CU_LAUNCHED("short_conv_dstate");
    }
    return 0;
}
