/* backend.cu — the CUDA backend's op table (ops/backend.h, float): every op a model or training step calls, run by its
 * CUDA twin on the calling thread's stream, with parameters and activations in device memory. docs/CODE.md "Ops". */
#include "cuda/common.cuh"

extern "C" {
#include "cuda/cuda_optim.h"
}

namespace {

k3c_cuda_backend *self(void *ctx) { return static_cast<k3c_cuda_backend *>(ctx); }

/* Device memory, zeroed: the host reaches it only through upload / download (ops/backend.h). The memset is ordered on
 * the stream, before any op the caller enqueues on it. */
void *device_alloc(size_t bytes) {
    void *p = nullptr;
    bytes = (bytes + 63) / 64 * 64 + 64;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
    if (cudaMemsetAsync(p, 0, bytes, K3C_STREAM) != cudaSuccess) {
        cudaFree(p);
        return nullptr;
    }
    return p;
}
void device_free(void *p) { /* cudaFree waits for the device, so no op still reads p */
    if (p) cudaFree(p);
}
int stream_sync(k3c_err *err) {
    K3C_CU(cudaStreamSynchronize(K3C_STREAM));
    return K3C_OK;
}
int upload(void *dst, const void *src, size_t bytes, k3c_err *err) {
    if (bytes) K3C_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, K3C_STREAM));
    return K3C_OK;
}
int download(void *dst, const void *src, size_t bytes, k3c_err *err) {
    if (bytes) K3C_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, K3C_STREAM));
    K3C_CU(cudaStreamSynchronize(K3C_STREAM));
    return K3C_OK;
}
/* KDA runs on the chunk-64 kernels only (no recurrence, no chunk 16); attention on fixed 64-row tiles. */
int cuda_supports(k3c_backend_feature f, int64_t v) {
    switch (f) {
    case K3C_FEATURE_KDA_CHUNK: return v == 64;
    case K3C_FEATURE_ATTENTION_BLOCK: return v == 0 || v == 64;
    }
    return 0;
}

int zero(float *x, int64_t n, k3c_err *err) {
    if (n > 0) K3C_CU(cudaMemsetAsync(x, 0, sizeof(float) * (size_t)n, K3C_STREAM));
    return K3C_OK;
}

int linear_fwd(void *ctx, const k3c_linear_sizes *s, const float *x, const float *W, float *y, k3c_err *err) {
    k3c_cuda_backend *b = self(ctx);
    return k3c_matmul_cuda(&b->cu, 0, 1, s->T, s->out, s->in, 1.0, x, W, s->accumulate ? 1.0 : 0.0, y, b->gemm, err);
}
int linear_bwd(void *ctx, const k3c_linear_sizes *s, const float *x, const float *W, const float *dy, float *dx,
               float *dW, k3c_err *err) {
    k3c_cuda_backend *b = self(ctx);
    int rc = dx ? k3c_matmul_cuda(&b->cu, 0, 0, s->T, s->in, s->out, 1.0, dy, W, 1.0, dx, b->gemm, err) : K3C_OK;
    if (!rc && dW) rc = k3c_matmul_cuda(&b->cu, 1, 0, s->out, s->in, s->T, 1.0, dy, x, 1.0, dW, b->gemm, err);
    return rc;
}

int router_fwd(const k3c_router_sizes *s, const float *logits, const float *bias, int32_t *ids, float *w, float *cutoff,
               k3c_err *err) {
    return k3c_router_fwd_cuda(s, logits, bias, ids, w, cutoff, nullptr, err);
}

int moe_fwd(void *ctx, const k3c_moe_sizes *s, const float *x, const int32_t *ids, const float *w, const float *w1,
            const float *w3, const float *w2, float *y, void *saved, void *ws, k3c_err *err) {
    k3c_cuda_backend *b = self(ctx);
    return k3c_moe_fwd_cuda(&b->cu, s, x, ids, w, w1, w3, w2, y, saved, ws, b->gemm, err);
}
int moe_bwd(void *ctx, const k3c_moe_sizes *s, const float *x, const int32_t *ids, const float *w, const float *w1,
            const float *w3, const float *w2, const void *saved, const float *dy, float *dx, float *dw1, float *dw3,
            float *dw2, float *dw, void *ws, k3c_err *err) {
    k3c_cuda_backend *b = self(ctx);
    return k3c_moe_bwd_cuda(&b->cu, s, x, ids, w, w1, w3, w2, saved, dy, dx, dw1, dw3, dw2, dw, ws, b->gemm, err);
}

/* Activations to and from bf16 bits (the expert-parallel wire), n elements in the table's int64_t. */
int to_bf16(int64_t n, const float *x, uint16_t *y, k3c_err *err) {
    return n > 0 ? k3c_cuda_f32_to_bf16(x, y, (size_t)n, err) : K3C_OK;
}
int from_bf16(int64_t n, const uint16_t *x, float *y, k3c_err *err) {
    return n > 0 ? k3c_cuda_bf16_to_f32(x, y, (size_t)n, err) : K3C_OK;
}

/* ---------------------------------------------------------------- dense GLU MLP from GEMMs and the GLU twin
 * saved: G = x W_gateᵀ, U = x W_upᵀ [T, I] each (required: the backward does not recompute them); ws: H, dG, dU. */
size_t ti_bytes(const k3c_mlp_sizes *s) { return ((size_t)(s->tokens * s->inter) * sizeof(float) + 255) / 256 * 256; }
size_t mlp_saved_bytes(const k3c_mlp_sizes *s) { return 2 * ti_bytes(s); }
size_t mlp_workspace(const k3c_mlp_sizes *s) { return 3 * ti_bytes(s); }

int mlp_fwd(void *ctx, const k3c_mlp_sizes *s, const float *x, const float *wg, const float *wu, const float *wd,
            float *y, void *saved, void *ws, k3c_err *err) {
    k3c_cuda_backend *b = self(ctx);
    if (!saved || !ws) return k3c_errf(err, K3C_EINVAL, "mlp_fwd (cuda): saved and ws are required");
    const int64_t T = s->tokens, D = s->dim, I = s->inter;
    float *G = (float *)saved, *U = (float *)((char *)saved + ti_bytes(s)), *H = (float *)ws;
    k3c_glu_sizes gs = {T, I, s->act};
    int rc = k3c_matmul_cuda(&b->cu, 0, 1, T, I, D, 1.0, x, wg, 0.0, G, b->gemm, err);
    if (!rc) rc = k3c_matmul_cuda(&b->cu, 0, 1, T, I, D, 1.0, x, wu, 0.0, U, b->gemm, err);
    if (!rc) rc = k3c_glu_fwd_cuda(&gs, G, U, H, err);
    if (!rc) rc = k3c_matmul_cuda(&b->cu, 0, 1, T, D, I, 1.0, H, wd, 0.0, y, b->gemm, err);
    return rc;
}

int mlp_bwd(void *ctx, const k3c_mlp_sizes *s, const float *x, const float *wg, const float *wu, const float *wd,
            const void *saved, const float *dy, float *dx, float *dwg, float *dwu, float *dwd, void *ws, k3c_err *err) {
    k3c_cuda_backend *b = self(ctx);
    if (!saved || !ws) return k3c_errf(err, K3C_EINVAL, "mlp_bwd (cuda): saved and ws are required");
    const int64_t T = s->tokens, D = s->dim, I = s->inter;
    const float *G = (const float *)saved, *U = (const float *)((const char *)saved + ti_bytes(s));
    float *H = (float *)ws, *dG = (float *)((char *)ws + ti_bytes(s)), *dU = (float *)((char *)ws + 2 * ti_bytes(s));
    k3c_glu_sizes gs = {T, I, s->act};
    int rc = K3C_OK;
    if (dwd) { /* dW_down += dyᵀ H (H recomputed from the saved pre-activations) */
        rc = k3c_glu_fwd_cuda(&gs, G, U, H, err);
        if (!rc) rc = k3c_matmul_cuda(&b->cu, 1, 0, D, I, T, 1.0, dy, H, 1.0, dwd, b->gemm, err);
    }
    float *dH = H; /* H is consumed */
    if (!rc) rc = k3c_matmul_cuda(&b->cu, 0, 0, T, I, D, 1.0, dy, wd, 0.0, dH, b->gemm, err);
    if (!rc) rc = zero(dG, T * I, err);
    if (!rc) rc = zero(dU, T * I, err);
    if (!rc) rc = k3c_glu_bwd_cuda(&gs, G, U, dH, dG, dU, err);
    if (!rc && dx) rc = k3c_matmul_cuda(&b->cu, 0, 0, T, D, I, 1.0, dG, wg, 1.0, dx, b->gemm, err);
    if (!rc && dx) rc = k3c_matmul_cuda(&b->cu, 0, 0, T, D, I, 1.0, dU, wu, 1.0, dx, b->gemm, err);
    if (!rc && dwg) rc = k3c_matmul_cuda(&b->cu, 1, 0, I, D, T, 1.0, dG, x, 1.0, dwg, b->gemm, err);
    if (!rc && dwu) rc = k3c_matmul_cuda(&b->cu, 1, 0, I, D, T, 1.0, dU, x, 1.0, dwu, b->gemm, err);
    return rc;
}

} // namespace

extern "C" int k3c_cuda_backend_init(k3c_cuda_backend *b, int device, int gemm, k3c_err *err) {
    memset(b, 0, sizeof *b);
    int rc = k3c_cuda_init(&b->cu, device, 0, err);
    if (rc) return rc;
    b->gemm = gemm;
    k3c_backend_f32 &t = b->table;
    t.name = "cuda";
    t.ctx = b;
    t.alloc = device_alloc, t.free = device_free, t.sync = stream_sync;
    t.upload = upload, t.download = download, t.supports = cuda_supports;
    t.zero = zero, t.add = k3c_add_cuda, t.copy2d = k3c_copy2d_cuda;
    t.sigmoid = k3c_sigmoid_cuda, t.sigmoid_bwd = k3c_sigmoid_bwd_cuda;
    t.embedding_fwd = k3c_embedding_fwd_cuda, t.embedding_bwd = k3c_embedding_bwd_cuda;
    t.rmsnorm_fwd = k3c_rmsnorm_fwd_cuda, t.rmsnorm_bwd = k3c_rmsnorm_bwd_cuda;
    t.gated_rmsnorm_fwd = k3c_gated_rmsnorm_fwd_cuda, t.gated_rmsnorm_bwd = k3c_gated_rmsnorm_bwd_cuda;
    t.linear_fwd = linear_fwd, t.linear_bwd = linear_bwd;
    t.sigmoid_gate_fwd = k3c_sigmoid_gate_fwd_cuda, t.sigmoid_gate_bwd = k3c_sigmoid_gate_bwd_cuda;
    t.xent_fwd = k3c_xent_fwd_cuda, t.xent_bwd = k3c_xent_bwd_cuda;
    t.l2norm_fwd = k3c_l2norm_fwd_cuda, t.l2norm_bwd = k3c_l2norm_bwd_cuda;
    t.short_conv_fwd = k3c_short_conv_fwd_cuda, t.short_conv_bwd_workspace = k3c_short_conv_bwd_workspace_cuda;
    t.short_conv_bwd = k3c_short_conv_bwd_cuda;
    t.kda_gate_fwd = k3c_kda_gate_fwd_cuda, t.kda_gate_bwd = k3c_kda_gate_bwd_cuda;
    k3c_cuda_backend_kernels(b, K3C_KERNELS_BF16);
    t.attention_max_logit = k3c_attention_max_logit_cuda;
    t.router_fwd = router_fwd, t.router_bwd = k3c_router_bwd_cuda;
    t.aux_loss_workspace = k3c_aux_loss_workspace_cuda, t.aux_loss_bwd = k3c_aux_loss_bwd_cuda;
    t.moe_saved_bytes = k3c_moe_saved_bytes_cuda, t.moe_workspace = k3c_moe_workspace_cuda;
    t.moe_fwd = moe_fwd, t.moe_bwd = moe_bwd;
    t.moe_gather = k3c_moe_gather_cuda, t.moe_gather_bwd = k3c_moe_gather_bwd_cuda;
    t.moe_combine = k3c_moe_combine_cuda, t.moe_combine_bwd = k3c_moe_combine_bwd_cuda;
    t.to_bf16 = to_bf16, t.from_bf16 = from_bf16;
    t.mlp_saved_bytes = mlp_saved_bytes, t.mlp_workspace = mlp_workspace, t.mlp_fwd = mlp_fwd, t.mlp_bwd = mlp_bwd;
    t.attnres_saved_elems = k3c_attnres_saved_elems_f32, t.attnres_workspace = k3c_attnres_workspace_cuda;
    t.attnres_fwd = k3c_attnres_fwd_cuda, t.attnres_bwd = k3c_attnres_bwd_cuda;
    t.decode = &k3c_dec_cuda;
    k3c_cuda_optim_entries(b);
    t.quantile_balance_workspace = k3c_quantile_balance_workspace_cuda, t.quantile_balance = k3c_quantile_balance_cuda;
    t.bias_balance_workspace = k3c_bias_balance_workspace_cuda, t.bias_balance = k3c_bias_balance_cuda;
    t.qk_clip = k3c_qk_clip_cuda;
    t.gelu_tanh = k3c_gelu_tanh_cuda, t.gelu_tanh_bwd = k3c_gelu_tanh_bwd_cuda;
    t.gelu_erf = k3c_gelu_erf_cuda, t.gelu_erf_bwd = k3c_gelu_erf_bwd_cuda;
    t.rope2d_fwd = k3c_rope2d_fwd_cuda, t.rope2d_bwd = k3c_rope2d_bwd_cuda;
    t.posemb_fwd = k3c_posemb_fwd_cuda, t.posemb_bwd = k3c_posemb_bwd_cuda;
    t.vit_attention_fwd = k3c_vit_attention_fwd_cuda, t.vit_attention_bwd = k3c_vit_attention_bwd_cuda;
    t.tpool_merge_fwd = k3c_tpool_merge_fwd_cuda, t.tpool_merge_bwd = k3c_tpool_merge_bwd_cuda;
    return K3C_OK;
}

extern "C" void k3c_cuda_backend_kernels(k3c_cuda_backend *b, int mode) {
    k3c_backend_f32 &t = b->table;
    b->kernels = mode;
    /* the bf16 kernels round activations to bf16 anyway: expert-parallel rows may travel so (ops/backend.h) */
    t.wire_bf16 = mode == K3C_KERNELS_BF16;
    if (mode == K3C_KERNELS_FP32) {
        t.kda_fwd_workspace = k3c_kda_recurrent_fwd_workspace_cuda;
        t.kda_bwd_workspace = k3c_kda_recurrent_bwd_workspace_cuda;
        t.kda_fwd = k3c_kda_recurrent_fwd_cuda, t.kda_bwd = k3c_kda_recurrent_bwd_cuda;
        t.attention_fwd_workspace = k3c_attention_naive_fwd_workspace_cuda;
        t.attention_bwd_workspace = k3c_attention_naive_workspace_cuda;
        t.attention_fwd = k3c_attention_naive_fwd_cuda, t.attention_bwd = k3c_attention_naive_bwd_cuda;
        return;
    }
    const bool f16 = mode == K3C_KERNELS_FP16;
    t.kda_fwd_workspace = k3c_kda_chunk_fwd_workspace_cuda;
    t.kda_bwd_workspace = k3c_kda_chunk_bwd_workspace_cuda;
    t.kda_fwd = f16 ? k3c_kda_chunk_fwd_f16_cuda : k3c_kda_chunk_fwd_cuda;
    t.kda_bwd = f16 ? k3c_kda_chunk_bwd_f16_cuda : k3c_kda_chunk_bwd_cuda;
    t.attention_fwd_workspace = k3c_attention_fwd_workspace_cuda;
    t.attention_bwd_workspace = k3c_attention_workspace_cuda;
    t.attention_fwd = f16 ? k3c_attention_fwd_f16_cuda : k3c_attention_fwd_cuda;
    t.attention_bwd = f16 ? k3c_attention_bwd_f16_cuda : k3c_attention_bwd_cuda;
}

extern "C" void k3c_cuda_backend_destroy(k3c_cuda_backend *b) {
    cudaStreamSynchronize(K3C_STREAM);
    k3c_cuda_destroy(&b->cu);
    memset(b, 0, sizeof *b);
}
