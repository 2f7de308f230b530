/* qk_clip.cu — QK-Clip on the GPU: the CUDA twin of k3c_qk_clip (ops/qk_clip.c), the backend table's qk_clip entry.
 * Scales the query/key rows of MLA heads whose S_max exceeded τ after the optimizer step. docs/MODEL.md §10.2.
 *
 * S_max stays on the device (the forward wrote it there): each kernel reads it, so the host never waits. γ, sqrt(γ) and
 * the row products are the CPU's operations in the CPU's precision (IEEE division and square root in double, one
 * float multiply per element), so the result is bitwise the CPU's. A layer with a non-finite S_max is left untouched
 * and *n_clipped becomes −1 (the CPU returns K3C_ENUMERIC at that layer); the host reads the count with the step's
 * telemetry. */
#include "cuda/common.cuh"

extern "C" {
#include "cuda/cuda_optim.h"
}

namespace {

constexpr int NT = 256;

/* 1 iff every S_max of the layer is finite (each thread checks all H: H is small and this avoids a second launch). */
__device__ bool layer_finite(const float *s_max, int64_t H) {
    for (int64_t h = 0; h < H; h++)
        if (!isfinite(s_max[h])) return false;
    return true;
}

struct clip_rows {
    int64_t H, nope, rope, dv, q_cols, kv_cols;
    int64_t h0; /* the first head held (a tensor-parallel share holds heads [h0, h0 + gridDim.y) from row 0) */
};

/* blockIdx.y = head, blockIdx.z = part (0: q nope rows × sqrt γ, 1: q rope rows × γ, 2: k nope rows of kv_b × sqrt γ) */
__global__ void clip_kernel(float *q, float *kvb, const float *s_max, double tau, clip_rows d) {
    const int64_t h = blockIdx.y;
    const int part = (int)blockIdx.z;
    if (!(s_max[d.h0 + h] > tau) || !layer_finite(s_max, d.H)) return;
    const double gamma = tau / (double)s_max[d.h0 + h];
    const float f = part == 1 ? (float)gamma : (float)sqrt(gamma);
    float *x;
    int64_t n;
    if (part == 0) {
        x = q + h * (d.nope + d.rope) * d.q_cols, n = d.nope * d.q_cols;
    } else if (part == 1) {
        x = q + (h * (d.nope + d.rope) + d.nope) * d.q_cols, n = d.rope * d.q_cols;
    } else {
        x = kvb + h * (d.nope + d.dv) * d.kv_cols, n = d.nope * d.kv_cols;
    }
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], f);
}

/* One thread, stream-ordered after the layer's clip: adds the layer's clipped heads of [h0, h0 + hn) (−1 sticks). */
__global__ void count_kernel(const float *s_max, int64_t H, int64_t h0, int64_t hn, double tau, int32_t *n_clipped) {
    if (*n_clipped < 0) return;
    if (!layer_finite(s_max, H)) {
        *n_clipped = -1;
        return;
    }
    int32_t c = 0;
    for (int64_t h = h0; h < h0 + hn; h++) c += s_max[h] > tau;
    *n_clipped += c;
}

} // namespace

extern "C" int k3c_qk_clip_cuda(void *ctx, const k3c_config *cfg, const k3c_param_table *t, float *w,
                                const float *s_max, double tau, int32_t *n_clipped, k3c_err *err) {
    (void)ctx;
    if (!(tau > 0)) return k3c_errf(err, K3C_EINVAL, "qk_clip: tau must be > 0 (got %g)", tau);
    const int lora = cfg->q_lora_rank > 0;
    const clip_rows d = {cfg->mla_heads,
                         cfg->qk_nope_dim,
                         cfg->qk_rope_dim,
                         cfg->v_head_dim,
                         lora ? cfg->q_lora_rank : cfg->hidden_size,
                         cfg->kv_lora_rank,
                         t->res.tp_rank * (cfg->mla_heads / t->res.tp_size)};
    const int64_t hn = cfg->mla_heads / t->res.tp_size; /* a TP share: its heads */
    K3C_CU(cudaMemsetAsync(n_clipped, 0, sizeof *n_clipped, K3C_STREAM));
    for (int l = t->res.layer0; l < t->res.layer1; l++) { /* the held layers (another stage clips its own) */
        if (cfg->mixer[l] != K3C_MIXER_MLA) continue;
        const k3c_layer_offsets *o = &t->layer[l];
        const size_t q_off = lora ? o->q_b : o->q_proj;
        if (q_off == K3C_NOPARAM || o->kv_b == K3C_NOPARAM)
            return k3c_errf(err, K3C_EINVAL, "layer %d: qk_clip: layer has no %s or kv_b_proj", l,
                            lora ? "q_b_proj" : "q_proj");
        const float *sm = s_max + (size_t)l * (size_t)d.H;
        const int64_t most = (d.nope > d.rope ? d.nope : d.rope) * (d.q_cols > d.kv_cols ? d.q_cols : d.kv_cols);
        const unsigned bx = (unsigned)((most + NT - 1) / NT < 1024 ? (most + NT - 1) / NT : 1024);
        clip_kernel<<<dim3(bx ? bx : 1, (unsigned)hn, 3), NT, 0, K3C_STREAM>>>(w + q_off, w + o->kv_b, sm, tau, d);
        K3C_CU_LAUNCHED("qk_clip");
        count_kernel<<<1, 1, 0, K3C_STREAM>>>(sm, d.H, d.h0, hn, tau, n_clipped);
        K3C_CU_LAUNCHED("qk_clip count");
    }
    return K3C_OK;
}
