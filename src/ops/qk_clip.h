/* qk_clip.h — QK-Clip (the "clip" of MuonClip) for MLA layers after the optimizer step: CPU reference of the backend
 * table's qk_clip entry (CUDA twin: cuda/qk_clip.cu). Spec: docs/MODEL.md §10.2. */
#ifndef K3C_OPS_QK_CLIP_H
#define K3C_OPS_QK_CLIP_H

#include "k3c.h"
#include "ops/param_table.h"

/* ================================================================ QK-Clip for MLA (§10.2)
 * After the optimizer step, for each head h with S_max^h > τ, γ = τ / S_max^h:
 *   q nope rows of head h (q_b_proj, or q_proj when q_lora_rank = 0) × sqrt(γ); q rope rows × γ;
 *   k nope rows of head h in kv_b_proj × sqrt(γ); value rows and the shared k_pe (kv_a_proj_with_mqa) untouched.
 * Layouts (docs/MODEL.md §4.2): q rows per head [nope | rope], kv_b rows per head [k_nope | v]. */
#define K3C_QK_CLIP_TAU 100.0

/* One MLA layer: s_max [mla_heads]. *n_clipped (may be NULL) gets the number of heads scaled. K3C_ENUMERIC for a
 * non-finite S_max, K3C_EINVAL for τ ≤ 0 or missing offsets. */
int k3c_qk_clip_layer(const k3c_config *cfg, const k3c_layer_offsets *o, float *w, const float *s_max, double tau,
                      int *n_clipped, k3c_err *err);
/* Every MLA layer of t: s_max [num_layers, mla_heads] indexed by decoder layer (rows of KDA layers are not read); a
 * table of tensor-parallel shares clips (and counts) the heads of its share. */
int k3c_qk_clip(const k3c_config *cfg, const k3c_param_table *t, float *w, const float *s_max, double tau,
                int *n_clipped, k3c_err *err);

#endif
