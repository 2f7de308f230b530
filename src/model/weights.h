/* weights.h — a model's weights as the forward reads them: one k3c_qmat VIEW per matrix (the model's float32 / float64
 * parameters, or a checkpoint's bf16 / MXFP4 / float32 tensors kept as stored), vectors, per-expert views and the
 * absorbed MLA up-projections of decoding. Spec: docs/MODEL.md §3.1 (KDA), §4.2 (MLA, absorbed form), §5.3 (AttnRes),
 * §6.2 + §9.2 (MoE); docs/ENGINE.md "Weights". */
#ifndef K3C_MODEL_WEIGHTS_H
#define K3C_MODEL_WEIGHTS_H

#include "base/base.h"
#include "model/params.h"
#include "ops/backend.h"
#include "ops/qmat.h"

/* One decoder layer. A matrix absent from the layer has w == NULL; a vector absent is NULL. Matrices keep the
 * checkpoint layout W[out, in] (y = x Wᵀ); vectors are float32 (a loader converts bf16 ones once). */
typedef struct {
    const void *input_norm, *post_norm;                                      /* [D] */
    const void *attn_res_norm, *attn_res_proj, *mlp_res_norm, *mlp_res_proj; /* [D], AttnRes models only */

    /* KDA (MODEL.md §3.1): P = kda_heads · kda_head_dim */
    k3c_qmat q_proj, k_proj, v_proj;       /* [P, D] (q_proj is also MLA's single query projection: [H·dqk, D]) */
    const void *q_conv, *k_conv, *v_conv; /* [P, conv_kernel] */
    k3c_qmat f_a, f_b;                     /* [dk, D], [P, dk] */
    const void *A_log;                    /* [kda_heads] (only the first H entries of a padded tensor) */
    const void *dt_bias;                  /* [P] */
    k3c_qmat b_proj;                       /* [H, D] */
    k3c_qmat g_proj;                       /* KDA full-rank output gate [P, D], or MLA output gate [H·dv, D] */
    k3c_qmat g_a, g_b;                     /* KDA low-rank output gate [dk, D], [P, dk] */
    const void *o_norm;                   /* [dk] */

    /* MLA (MODEL.md §4.2), NoPE: the shared key slot is never rotated */
    k3c_qmat q_a, q_b;      /* [q_lora_rank, D], [H·dqk, q_lora_rank] (q_lora_rank 0: q_proj above) */
    const void *q_a_norm;  /* [q_lora_rank] */
    k3c_qmat kv_a;          /* [kv_lora_rank + qk_rope, D] */
    const void *kv_a_norm; /* [kv_lora_rank] */
    k3c_qmat kv_b;          /* [H·(nope + dv), kv_lora_rank]: per head k_nope rows then v rows (as stored) */
    k3c_qmat *uk_t;         /* [H] absorbed key side: W_UK,hᵀ [kv_lora_rank, nope] (k3c_weights_absorb makes them) */
    k3c_qmat *uv;           /* [H] absorbed value side: W_UV,h [dv, kv_lora_rank], row views into kv_b */
    k3c_qmat o_proj;        /* both mixers: [D, P] or [D, H·dv] */

    /* FFN: dense GLU MLP, or MoE (router + routed experts on the latent + fused shared experts) */
    k3c_qmat mlp_gate, mlp_up, mlp_down;          /* [I, D], [I, D], [D, I] */
    k3c_qmat router;                              /* [E, D] */
    const void *router_bias;                     /* [E] e_score_correction_bias (selection only) */
    k3c_qmat *w1, *w2, *w3;                       /* [E] per expert: gate [I, lat], down [lat, I], up [I, lat] */
    k3c_qmat shared_gate, shared_up, shared_down; /* [S·I, D], [S·I, D], [D, S·I] */
    k3c_qmat latent_down, latent_up;              /* K3 LatentMoE: [lat, D], [D, lat] */
    const void *latent_norm;                     /* [lat] */
} k3c_weights_layer;

/* The whole model. Views point into storage someone else keeps alive (model parameters, an mmap'd checkpoint);
 * what the builder allocates itself (view arrays, absorbed copies, converted vectors) is listed in owned[]. */
struct k3c_weights {
    k3c_config cfg;
    k3c_qmat embed;                           /* [V, D], read by k3c_qmat_row */
    k3c_qmat lm_head;                         /* [V, D] (the embedding when tied) */
    const void *final_norm;                  /* [D] */
    const void *out_res_norm, *out_res_proj; /* [D], AttnRes models only */
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
    const void *(*vec)(void *ctx, size_t off);
    void *ctx;
} k3c_weights_src;
/* Fills every view of w the config's layer plan names from src (w zeroed by the caller; per-expert view arrays are
 * owned by w). Shapes are checked afterwards by k3c_weights_check. */
int k3c_weights_fill(k3c_weights *w, const k3c_config *c, const k3c_param_table *tab, const k3c_weights_src *src,
                     k3c_err *err);
/* Views into a flat parameter buffer laid out by tab (elements of es bytes: 4 for float32, 8 for float64; qmat type
 * K3C_QMAT_F32 or K3C_QMAT_F64), in backend be's memory (NULL: the host); the stacked routed experts as the experts the
 * table holds. Nothing is copied. */
int k3c_weights_of_params(const k3c_config *c, const k3c_param_table *tab, const void *w, size_t es,
                          const k3c_backend_f32 *be, k3c_weights *out, k3c_err *err);
void k3c_weights_free(k3c_weights *w);

#endif
