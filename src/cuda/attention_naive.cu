/* attention_naive.cu — causal document-masked softmax attention in fp32 on the device, one warp per query (forward, dq)
 * or key row (dk, dv): the checking kernels of the backend table (k3c_cuda_backend_kernels). docs/MODEL.md §4, §11. */
#include "cuda/common.cuh"

namespace k3c_cu {

constexpr int NAIVE_MAX = 8; /* values per lane: dqk and dv up to 256 */

/* The document holding row i: [*bos, *eos). */
__device__ __forceinline__ void naive_doc(const int32_t *cu, int n_docs, int T, int i, int *bos, int *eos) {
    const int d = doc_of(cu, n_docs, i);
    *bos = cu ? cu[d] : 0, *eos = cu ? cu[d + 1] : T;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x; /* every lane the same sum: each butterfly step adds the same two numbers on both sides */
}

/* A row of width D, lane-strided into registers (zeros past D). */
__device__ __forceinline__ void naive_load(float (&x)[NAIVE_MAX], const float *row, int D, int lane) {
#pragma unroll
    for (int m = 0; m < NAIVE_MAX; m++) x[m] = lane + 32 * m < D ? row[lane + 32 * m] : 0.f;
}
__device__ __forceinline__ float naive_dot(const float (&x)[NAIVE_MAX], const float *row, int D, int lane) {
    float acc = 0.f;
#pragma unroll
    for (int m = 0; m < NAIVE_MAX; m++)
        if (lane + 32 * m < D) acc += x[m] * row[lane + 32 * m];
    return warp_sum(acc);
}

struct naive_args {
    const float *q, *k, *v, *o, *lse, *dout;
    float *out, *lse_out, *dq, *dk, *dv, *D;
    const int32_t *cu;
    int T, H, dqk, dvd, n_docs;
    float scale;
};

/* Two passes over the row's keys: the maximum, then the exponentials, their sum and o. */
__global__ void __launch_bounds__(128) attention_naive_fwd_kernel(naive_args a) {
    const int i = blockIdx.x * 4 + (threadIdx.x >> 5), h = blockIdx.y, lane = threadIdx.x & 31;
    if (i >= a.T) return;
    int bos, eos;
    naive_doc(a.cu, a.n_docs, a.T, i, &bos, &eos);
    const int64_t ldk = (int64_t)a.H * a.dqk, ldv = (int64_t)a.H * a.dvd;
    float qi[NAIVE_MAX], acc[NAIVE_MAX] = {};
    naive_load(qi, a.q + i * ldk + (int64_t)h * a.dqk, a.dqk, lane);
    float mx = -INFINITY, l = 0.f;
    for (int j = bos; j <= i; j++) mx = fmaxf(mx, a.scale * naive_dot(qi, a.k + j * ldk + (int64_t)h * a.dqk, a.dqk, lane));
    for (int j = bos; j <= i; j++) {
        const float p = expf(a.scale * naive_dot(qi, a.k + j * ldk + (int64_t)h * a.dqk, a.dqk, lane) - mx);
        const float *vj = a.v + j * ldv + (int64_t)h * a.dvd;
        l += p;
#pragma unroll
        for (int m = 0; m < NAIVE_MAX; m++)
            if (lane + 32 * m < a.dvd) acc[m] += p * vj[lane + 32 * m];
    }
    float *oi = a.out + i * ldv + (int64_t)h * a.dvd;
#pragma unroll
    for (int m = 0; m < NAIVE_MAX; m++)
        if (lane + 32 * m < a.dvd) oi[lane + 32 * m] = acc[m] / l;
    if (lane == 0) a.lse_out[(int64_t)i * a.H + h] = mx + logf(l);
}

/* P = exp(scale q·k − lse), dP = dO·v, D = rowsum(dO ⊙ O), dS = P (dP − D):
 * dq_i = scale Σ_j dS_ij k_j (this kernel, per query row; it also stores D), then dk_j = scale Σ_i dS_ij q_i and
 * dv_j = Σ_i P_ij dO_i (attention_naive_dkv_kernel, per key row). */
__global__ void __launch_bounds__(128) attention_naive_dq_kernel(naive_args a) {
    const int i = blockIdx.x * 4 + (threadIdx.x >> 5), h = blockIdx.y, lane = threadIdx.x & 31;
    if (i >= a.T) return;
    int bos, eos;
    naive_doc(a.cu, a.n_docs, a.T, i, &bos, &eos);
    const int64_t ldk = (int64_t)a.H * a.dqk, ldv = (int64_t)a.H * a.dvd, th = (int64_t)i * a.H + h;
    float qi[NAIVE_MAX], doi[NAIVE_MAX], acc[NAIVE_MAX] = {};
    naive_load(qi, a.q + i * ldk + (int64_t)h * a.dqk, a.dqk, lane);
    naive_load(doi, a.dout + i * ldv + (int64_t)h * a.dvd, a.dvd, lane);
    const float Di = naive_dot(doi, a.o + i * ldv + (int64_t)h * a.dvd, a.dvd, lane), li = a.lse[th];
    if (lane == 0) a.D[th] = Di;
    if (!a.dq) return;
    for (int j = bos; j <= i; j++) {
        const float *kj = a.k + j * ldk + (int64_t)h * a.dqk;
        const float p = expf(a.scale * naive_dot(qi, kj, a.dqk, lane) - li);
        const float ds = p * (naive_dot(doi, a.v + j * ldv + (int64_t)h * a.dvd, a.dvd, lane) - Di);
#pragma unroll
        for (int m = 0; m < NAIVE_MAX; m++)
            if (lane + 32 * m < a.dqk) acc[m] += ds * kj[lane + 32 * m];
    }
    float *dqi = a.dq + i * ldk + (int64_t)h * a.dqk;
#pragma unroll
    for (int m = 0; m < NAIVE_MAX; m++)
        if (lane + 32 * m < a.dqk) dqi[lane + 32 * m] += a.scale * acc[m];
}

__global__ void __launch_bounds__(128) attention_naive_dkv_kernel(naive_args a) {
    const int j = blockIdx.x * 4 + (threadIdx.x >> 5), h = blockIdx.y, lane = threadIdx.x & 31;
    if (j >= a.T) return;
    int bos, eos;
    naive_doc(a.cu, a.n_docs, a.T, j, &bos, &eos);
    const int64_t ldk = (int64_t)a.H * a.dqk, ldv = (int64_t)a.H * a.dvd;
    float kj[NAIVE_MAX], vj[NAIVE_MAX], gk[NAIVE_MAX] = {}, gv[NAIVE_MAX] = {};
    naive_load(kj, a.k + j * ldk + (int64_t)h * a.dqk, a.dqk, lane);
    naive_load(vj, a.v + j * ldv + (int64_t)h * a.dvd, a.dvd, lane);
    for (int i = j; i < eos; i++) {
        const int64_t th = (int64_t)i * a.H + h;
        const float *qi = a.q + i * ldk + (int64_t)h * a.dqk, *doi = a.dout + i * ldv + (int64_t)h * a.dvd;
        const float p = expf(a.scale * naive_dot(kj, qi, a.dqk, lane) - a.lse[th]);
        const float ds = p * (naive_dot(vj, doi, a.dvd, lane) - a.D[th]);
#pragma unroll
        for (int m = 0; m < NAIVE_MAX; m++) {
            if (lane + 32 * m < a.dqk) gk[m] += ds * qi[lane + 32 * m];
            if (lane + 32 * m < a.dvd) gv[m] += p * doi[lane + 32 * m];
        }
    }
#pragma unroll
    for (int m = 0; m < NAIVE_MAX; m++) {
        if (a.dk && lane + 32 * m < a.dqk) a.dk[j * ldk + (int64_t)h * a.dqk + lane + 32 * m] += a.scale * gk[m];
        if (a.dv && lane + 32 * m < a.dvd) a.dv[j * ldv + (int64_t)h * a.dvd + lane + 32 * m] += gv[m];
    }
}

} // namespace k3c_cu

using namespace k3c_cu;

static int naive_check(const k3c_attention_sizes *s, const int32_t *cu, const char *op, k3c_err *err) {
    if (!s || s->T < 0 || s->T > (1 << 30) || s->H <= 0 || s->H > 65535 || s->dqk <= 0 || s->dv <= 0 ||
        !isfinite(s->scale) || (cu && s->n_docs <= 0))
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (T >= 0, 0 < H <= 65535, dqk, dv, n_docs > 0, scale finite)",
                        op);
    if (s->dqk > 32 * NAIVE_MAX || s->dv > 32 * NAIVE_MAX)
        return k3c_errf(err, K3C_EUNSUPPORTED, "%s: dqk %lld, dv %lld (at most %d)", op, (long long)s->dqk,
                        (long long)s->dv, 32 * NAIVE_MAX);
    return K3C_OK;
}

static naive_args naive_make(const k3c_attention_sizes *s, const int32_t *cu) {
    naive_args a = {};
    a.cu = cu, a.T = (int)s->T, a.H = (int)s->H, a.dqk = (int)s->dqk, a.dvd = (int)s->dv;
    a.n_docs = cu ? (int)s->n_docs : 1, a.scale = (float)s->scale;
    return a;
}

extern "C" size_t k3c_attention_naive_fwd_workspace_cuda(const k3c_attention_sizes *s) { return 0; }
extern "C" size_t k3c_attention_naive_workspace_cuda(const k3c_attention_sizes *s) {
    return s && s->T > 0 && s->H > 0 ? (size_t)(s->T * s->H) * sizeof(float) : 0;
}

extern "C" int k3c_attention_naive_fwd_cuda(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const float *q,
                                            const float *k, const float *v, float *o, float *lse, void *ws,
                                            k3c_err *err) {
    int rc = naive_check(s, cu_seqlens, "attention_naive_fwd_cuda", err);
    if (rc || s->T == 0) return rc;
    naive_args a = naive_make(s, cu_seqlens);
    a.q = q, a.k = k, a.v = v, a.out = o, a.lse_out = lse;
    attention_naive_fwd_kernel<<<dim3((unsigned)((s->T + 3) / 4), (unsigned)s->H), 128, 0, K3C_STREAM>>>(a);
    K3C_CU_LAUNCHED("attention_naive_fwd");
    return K3C_OK;
}

extern "C" int k3c_attention_naive_bwd_cuda(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const float *q,
                                            const float *k, const float *v, const float *o, const float *lse,
                                            const float *dout, float *dq, float *dk, float *dv, void *ws,
                                            k3c_err *err) {
    int rc = naive_check(s, cu_seqlens, "attention_naive_bwd_cuda", err);
    if (rc || s->T == 0) return rc;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "attention_naive_bwd_cuda: ws is NULL (k3c_attention_naive_workspace_cuda bytes)");
    naive_args a = naive_make(s, cu_seqlens);
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse, a.dout = dout, a.dq = dq, a.dk = dk, a.dv = dv;
    a.D = (float *)ws;
    const dim3 grid((unsigned)((s->T + 3) / 4), (unsigned)s->H);
    attention_naive_dq_kernel<<<grid, 128, 0, K3C_STREAM>>>(a);
    K3C_CU_LAUNCHED("attention_naive_dq");
    if (dk || dv) {
        attention_naive_dkv_kernel<<<grid, 128, 0, K3C_STREAM>>>(a);
        K3C_CU_LAUNCHED("attention_naive_dkv");
    }
    return K3C_OK;
}
