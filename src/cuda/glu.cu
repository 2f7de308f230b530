/* glu.cu — fp32 CUDA twin of the SiLU / SiTU / GELU gated linear unit h = act(gate) ⊙ c(up), forward and backward
 * (ops/glu.c). docs/MODEL.md §8; declarations in cuda/cuda_ops.h. */
#include "cuda/glu.cuh"

namespace {

unsigned grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

} // namespace

extern "C" int k3c_glu_fwd_cuda(const k3c_glu_sizes *s, const float *gate, const float *up, float *h, k3c_err *err) {
    glu_params q;
    if (!s || s->rows < 0 || s->inter < 0) return k3c_errf(err, K3C_EINVAL, "glu_fwd_cuda: bad sizes");
    if (glu_params_of(&s->act, &q, "glu_fwd_cuda", err)) return K3C_EINVAL;
    const int64_t n = s->rows * s->inter;
    if (n == 0) return 0;
    glu_fwd_kernel<<<grid_for(n, 256), 256, 0, K3C_STREAM>>>(n, s->inter, q, gate, up, h, nullptr);
    K3C_CU_LAUNCHED("glu_fwd");
    return 0;
}

extern "C" int k3c_glu_bwd_cuda(const k3c_glu_sizes *s, const float *gate, const float *up, const float *dh,
                                float *dgate, float *dup, k3c_err *err) {
    glu_params q;
    if (!s || s->rows < 0 || s->inter < 0) return k3c_errf(err, K3C_EINVAL, "glu_bwd_cuda: bad sizes");
    if (glu_params_of(&s->act, &q, "glu_bwd_cuda", err)) return K3C_EINVAL;
    const int64_t n = s->rows * s->inter;
    if (n == 0 || (!dgate && !dup)) return 0;
    glu_bwd_kernel<<<grid_for(n, 256), 256, 0, K3C_STREAM>>>(n, q, gate, up, dh, dgate, dup);
    K3C_CU_LAUNCHED("glu_bwd");
    return 0;
}
