/* kda_recurrent.cu — the token-recurrent KDA forward in fp32 (decode steps and the reference on the device): one block
 * per (document, head, 32 state columns). docs/MODEL.md §3.1 step 7, §3.5. */
#include "cuda/common.cuh"
#include "cuda/kda_step.cuh"

namespace k3c_cu {

constexpr int REC_TILE = 16; /* tokens staged in shared memory per barrier pair */

/* Four consecutive lanes share column v of the state, each holding dk/4 of its rows in registers: r = Pᵀk and
 * o = s·Sᵀq are lane-partial sums closed by two shuffles; q, k and e^g of REC_TILE tokens are broadcast from shared
 * memory. */
template <int DK>
__global__ void __launch_bounds__(128)
    kda_recurrent_kernel(const float *q, const float *k, const float *v, const float *g, const float *beta,
                         const float *h0, float *o, float *ht, const int32_t *cu, int T, int H, int DV, float scale) {
    constexpr int KP = DK / 4;
    __shared__ float qs[REC_TILE][DK], ks[REC_TILE][DK], es[REC_TILE][DK], bs[REC_TILE];
    const int h = blockIdx.x, n = blockIdx.y, tid = threadIdx.x, part = tid & 3, col = blockIdx.z * 32 + (tid >> 2);
    const bool live = col < DV;
    const int bos = cu ? cu[n] : 0, eos = cu ? cu[n + 1] : T, i0 = part * KP;
    const int64_t sbase = ((int64_t)n * H + h) * DK * DV;
    float S[KP];
#pragma unroll
    for (int i = 0; i < KP; i++) S[i] = (live && h0) ? h0[sbase + (int64_t)(i0 + i) * DV + col] : 0.f;
    for (int t0 = bos; t0 < eos; t0 += REC_TILE) {
        const int n_t = min(REC_TILE, eos - t0);
        __syncthreads();
        for (int e = tid; e < n_t * DK; e += blockDim.x) {
            const int r = e / DK, i = e % DK;
            const int64_t off = ((int64_t)(t0 + r) * H + h) * DK + i;
            qs[r][i] = q[off] * scale, ks[r][i] = k[off], es[r][i] = expf(g[off]);
        }
        for (int r = tid; r < n_t; r += blockDim.x) bs[r] = beta[(int64_t)(t0 + r) * H + h];
        __syncthreads();
        for (int r = 0; r < n_t; r++) {
            const int64_t vo = ((int64_t)(t0 + r) * H + h) * DV + col;
            const float acc = kda_token_step<KP>(S, &es[r][i0], &ks[r][i0], &qs[r][i0], bs[r], v + vo, live);
            if (live && part == 0) o[vo] = acc;
        }
    }
    if (live && ht)
#pragma unroll
        for (int i = 0; i < KP; i++) ht[sbase + (int64_t)(i0 + i) * DV + col] = S[i];
}

} // namespace k3c_cu

using namespace k3c_cu;

extern "C" size_t k3c_kda_recurrent_fwd_workspace_cuda(const k3c_kda_dims *d) { return 0; }

template <int DK>
static int launch_recurrent(const k3c_kda_dims *d, const int32_t *cu, const float *q, const float *k, const float *v,
                            const float *g, const float *beta, const float *h0, float *o, float *ht, k3c_err *err) {
    const int N = cu ? d->n_docs : 1, threads = 128;
    const float scale = (float)(d->scale != 0 ? d->scale : 1.0 / sqrt((double)d->dk));
    kda_recurrent_kernel<DK>
        <<<dim3((unsigned)d->H, (unsigned)N, (unsigned)((d->dv + 31) / 32)), threads, 0, K3C_STREAM>>>(
            q, k, v, g, beta, h0, o, ht, cu, (int)d->T, (int)d->H, (int)d->dv, scale);
    K3C_CU_LAUNCHED("kda_recurrent");
    return K3C_OK;
}

extern "C" int k3c_kda_recurrent_fwd_cuda(const k3c_kda_dims *d, const int32_t *cu_seqlens, const float *q,
                                          const float *k, const float *v, const float *g, const float *beta,
                                          const float *h0, float *o, float *ht, void *ws, k3c_err *err) {
    if (!d || d->T < 0 || d->H <= 0 || d->dv <= 0 || d->dv > 1024 || (cu_seqlens && d->n_docs <= 0))
        return k3c_errf(err, K3C_EINVAL, "kda_recurrent_fwd_cuda: bad sizes (H > 0, 1 <= dv <= 1024, n_docs > 0)");
    switch (d->dk) {
    case 16: return launch_recurrent<16>(d, cu_seqlens, q, k, v, g, beta, h0, o, ht, err);
    case 32: return launch_recurrent<32>(d, cu_seqlens, q, k, v, g, beta, h0, o, ht, err);
    case 64: return launch_recurrent<64>(d, cu_seqlens, q, k, v, g, beta, h0, o, ht, err);
    case 128: return launch_recurrent<128>(d, cu_seqlens, q, k, v, g, beta, h0, o, ht, err);
    }
    return k3c_errf(err, K3C_EUNSUPPORTED, "kda_recurrent_fwd_cuda: dk = %lld (16, 32, 64 or 128)", (long long)d->dk);
}
