/* weights.h — the inference engine's weights: one k3c_qmat VIEW per matrix (float32, bf16 or MXFP4, kept as stored),
 * float vectors for norms, biases, gates and conv kernels, per-expert views, and the absorbed MLA up-projections.
 * Spec: docs/MODEL.md §3.1 (KDA), §4.2 (MLA, absorbed form), §5.3 (AttnRes), §6.2 + §9.2 (MoE); docs/ENGINE.md. */
#ifndef K3C_SERVE_WEIGHTS_H
#define K3C_SERVE_WEIGHTS_H

#include "base/base.h"
#include "model/params.h"
#include "ops/backend.h"
#include "ops/qmat.h"

/* One decoder layer. A matrix absent from the layer has w == NULL; a vector absent is NULL. Matrices keep the
 * checkpoint layout W[out, in] (y = x Wᵀ); vectors are float32 (a loader converts bf16 ones once). */
typedef struct {
    const float *input_norm, *post_norm;                                      /* [D] */
    const float *attn_res_norm, *attn_res_proj, *mlp_res_norm, *mlp_res_proj; /* [D], AttnRes models only */

    /* KDA (MODEL.md §3.1): P = kda_heads · kda_head_dim */
    k3c_qmat q_proj, k_proj, v_proj;       /* [P, D] (q_proj is also MLA's single query projection: [H·dqk, D]) */
    const float *q_conv, *k_conv, *v_conv; /* [P, conv_kernel] */
    k3c_qmat f_a, f_b;                     /* [dk, D], [P, dk] */
    const float *A_log;                    /* [kda_heads] (only the first H entries of a padded tensor) */
    const float *dt_bias;                  /* [P] */
    k3c_qmat b_proj;                       /* [H, D] */
    k3c_qmat g_proj;                       /* KDA full-rank output gate [P, D], or MLA output gate [H·dv, D] */
    k3c_qmat g_a, g_b;                     /* KDA low-rank output gate [dk, D], [P, dk] */
    const float *o_norm;                   /* [dk] */

    /* MLA (MODEL.md §4.2), NoPE: the shared key slot is never rotated */
    k3c_qmat q_a, q_b;      /* [q_lora_rank, D], [H·dqk, q_lora_rank] (q_lora_rank 0: q_proj above) */
    const float *q_a_norm;  /* [q_lora_rank] */
    k3c_qmat kv_a;          /* [kv_lora_rank + qk_rope, D] */
    const float *kv_a_norm; /* [kv_lora_rank] */
    k3c_qmat kv_b;          /* [H·(nope + dv), kv_lora_rank]: per head k_nope rows then v rows (as stored) */
    k3c_qmat *uk_t;         /* [H] absorbed key side: W_UK,hᵀ [kv_lora_rank, nope] (k3c_weights_absorb makes them) */
    k3c_qmat *uv;           /* [H] absorbed value side: W_UV,h [dv, kv_lora_rank], row views into kv_b */
    k3c_qmat o_proj;        /* both mixers: [D, P] or [D, H·dv] */

    /* FFN: dense GLU MLP, or MoE (router + routed experts on the latent + fused shared experts) */
    k3c_qmat mlp_gate, mlp_up, mlp_down;          /* [I, D], [I, D], [D, I] */
    k3c_qmat router;                              /* [E, D] */
    const float *router_bias;                     /* [E] e_score_correction_bias (selection only) */
    k3c_qmat *w1, *w2, *w3;                       /* [E] per expert: gate [I, lat], down [lat, I], up [I, lat] */
    k3c_qmat shared_gate, shared_up, shared_down; /* [S·I, D], [S·I, D], [D, S·I] */
    k3c_qmat latent_down, latent_up;              /* K3 LatentMoE: [lat, D], [D, lat] */
    const float *latent_norm;                     /* [lat] */
} k3c_weights_layer;

/* The whole model. Views point into storage someone else keeps alive (model parameters, an mmap'd checkpoint);
 * what the builder allocates itself (view arrays, absorbed copies, converted vectors) is listed in owned[]. */
struct k3c_weights {
    k3c_config cfg;
    k3c_qmat embed;                           /* [V, D], read by k3c_qmat_row */
    k3c_qmat lm_head;                         /* [V, D] (the embedding when tied) */
    const float *final_norm;                  /* [D] */
    const float *out_res_norm, *out_res_proj; /* [D], AttnRes models only */
    k3c_weights_layer *layer;                 /* [num_layers] */
    k3c_checkpoint *ckpt;                     /* the mapping the views point into (k3c_weights_open), or NULL */
    const k3c_backend_f32 *be;                /* the backend whose memory every view points into (NULL: the CPU) */
    void **owned;
    int n_owned, cap_owned;
    void **owned_be; /* blocks of be's memory (the absorbed key side of a model on the GPU, an uploaded copy) */
    int n_owned_be, cap_owned_be;
    size_t bytes; /* of an uploaded copy (k3c_weights_to_backend): the one block of be's memory it fills */
};
typedef struct k3c_weights k3c_weights;

/* Rows r0 .. r0+n−1 of W as a view (row-major storage: also for MXFP4, whose rows are whole groups). */
static inline k3c_qmat k3c_qmat_sub_rows(const k3c_qmat *W, int64_t r0, int64_t n) {
    k3c_qmat s = *W;
    s.rows = n;
    if (W->type == K3C_QMAT_F32) s.w = (const float *)W->w + r0 * W->cols;
    if (W->type == K3C_QMAT_BF16) s.w = (const uint16_t *)W->w + r0 * W->cols;
    if (W->type == K3C_QMAT_MXFP4) {
        s.w = (const uint8_t *)W->w + r0 * (W->cols / 2);
        s.scale = W->scale + r0 * (W->cols / 32);
    }
    return s;
}

/* A zeroed block of `bytes` owned by w (freed by k3c_weights_free); NULL when out of memory. */
void *k3c_weights_alloc(k3c_weights *w, size_t bytes);
/* Where a builder's views come from: a matrix or vector of the parameter table, by its element offset (K3C_NOPARAM:
 * absent → an empty view / NULL). */
typedef struct {
    k3c_qmat (*mat)(void *ctx, size_t off, int64_t rows, int64_t cols);
    const float *(*vec)(void *ctx, size_t off);
    void *ctx;
} k3c_weights_src;
/* Fills every view of w the config's layer plan names from src (w zeroed by the caller; per-expert view arrays are
 * owned by w). Shapes are checked afterwards by k3c_weights_check. */
int k3c_weights_fill(k3c_weights *w, const k3c_config *c, const k3c_param_table *tab, const k3c_weights_src *src,
                     k3c_err *err);
/* Views into the float32 parameters of an opened model, on its backend (nothing copied but the absorbed key side,
 * made in the backend's memory). The model must outlive the weights. */
int k3c_weights_from_model(const k3c_model *m, k3c_weights *w, k3c_err *err);
/* Derives uk_t / uv of every MLA layer from kv_b (a loader calls it after filling kv_b): uk_t is a transposed copy in
 * kv_b's type (float32 or bf16; exact), uv are row views. */
int k3c_weights_absorb(k3c_weights *w, k3c_err *err);
/* Checks every view the config needs is present with the right shape (names the layer and tensor). */
int k3c_weights_check(const k3c_weights *w, k3c_err *err);
/* The weights of a release checkpoint directory (config.json + model.safetensors, or model.safetensors.index.json +
 * shards), mmap'd read-only: bf16 / float32 matrices and MXFP4 experts (weight_packed + weight_scale) are views into
 * the mapping, kept as stored; vectors (norms, biases, A_log, conv kernels) are converted to float. Nothing is
 * dequantised. On failure nothing stays open and the error names the file and tensor. */
int k3c_weights_open(const char *dir, k3c_weights *w, k3c_err *err);
/* A copy of host weights (k3c_weights_open's, as stored) in backend be's memory: one block, every matrix in its stored
 * type (bf16, float32, MXFP4 and its scales), each MoE matrix's experts evenly spaced, vectors as float. src stays
 * as it was; the caller may free it once this returns. */
int k3c_weights_to_backend(const k3c_weights *src, const k3c_backend_f32 *be, k3c_weights *dst, k3c_err *err);
void k3c_weights_free(k3c_weights *w);

#endif
