/* model.c — the per-layer summary the layout evaluation reads (parameters by sharding class, FLOPs, activation bytes
 * per recomputation policy), from the tensor inventory (docs/FORMATS.md §5) and docs/MODEL.md §3.4, §4, §5, §9. */
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

#define U 2.0 /* bf16 activation */
#define F 4.0 /* fp32 statistic */

/* What KDA keeps for backward (fla default, §3.4): pre-conv q/k/v, q/k rstd, f_a output, raw gate input, β,
 * A_qk and (I+L)⁻¹ [H, C] per token, the recurrence output, o_norm rstd, output-gate logits. The post-conv q/k/v,
 * the decay cumsum and the gated o_proj input are element-wise recomputable (dropped under selective). */
static void kda_act(const k3c_config *cfg, double *keep, double *drop) {
    double H = (double)cfg->kda_heads, dk = (double)cfg->kda_head_dim, P = H * dk, C = K3C_PLAN_KDA_CHUNK;
    *keep += 3 * P * U + 2 * H * F + dk * U + P * U + H * F + 2 * H * C * U + P * U + H * F + P * U;
    if (!cfg->kda_full_rank_gate) *keep += dk * U; /* g_a_proj output */
    *drop += 3 * P * U + P * F + P * U;
}

/* MLA (materialised training form, FlashAttention keeps only o and the log-sum-exp): q_a output, q, kv_a output,
 * k (k_pe shared by the heads), v, o, lse, gate logits. Normed latents and the gated o_proj input are dropped. */
static void mla_act(const k3c_config *cfg, double *keep, double *drop) {
    double H = (double)cfg->mla_heads, ql = (double)cfg->q_lora_rank, kvl = (double)cfg->kv_lora_rank;
    double rope = (double)cfg->qk_rope_dim, nope = (double)cfg->qk_nope_dim, vd = (double)cfg->v_head_dim;
    *keep += ql * U + H * (nope + rope) * U + (kvl + rope) * U + (H * nope + rope) * U + 2 * H * vd * U + H * F;
    *drop += ql * U + kvl * U;
    if (cfg->mla_output_gate) *keep += H * vd * U, *drop += H * vd * U;
}

/* Dense SiTU/SwiGLU MLP: gate and up outputs kept, their product recomputed. */
static void dense_act(const k3c_config *cfg, double *keep, double *drop) {
    double I = (double)cfg->intermediate_size;
    *keep += 2 * I * U;
    *drop += I * U;
}

/* MoE (§9.2): router scores (fp32), latent z, k dispatched inputs, k expert gate/up, k expert outputs (for the
 * router-weight gradient), combined u; shared-expert gate/up. Activation products and norm(u) are dropped. */
static void moe_act(const k3c_config *cfg, double *keep, double *drop) {
    double n = (double)cfg->num_experts, k = (double)cfg->top_k, lat = (double)cfg->latent_dim;
    double m = (double)cfg->moe_intermediate_size, ms = m * (double)cfg->num_shared_experts;
    double ein = lat > 0 ? lat : (double)cfg->hidden_size;
    *keep += n * F + 2 * lat * U + 2 * k * ein * U + 2 * k * m * U + 2 * ms * U;
    *drop += k * m * U + lat * U + ms * U;
}

double k3c_plan_layer_act_bytes(const k3c_config *cfg, int l, int recompute) {
    double d = (double)cfg->hidden_size;
    if (recompute == K3C_RC_FULL) return d * U; /* the layer's input: everything else is recomputed */
    double keep = 0, drop = 0;
    keep += 2 * (d * U + F); /* each sublayer's norm input and rstd */
    drop += 2 * d * U;       /* each sublayer's normed input (the projections' input) */
    if (cfg->attn_res_block > 0) {
        int64_t a, m;
        k3c_plan_attnres_mix_sources(cfg, l, &a, &m);
        keep += (a > 0) * d * U + d * U + (double)(a + m) * F; /* partial sums P and the softmax weights */
    }
    if (cfg->mixer[l] == K3C_MIXER_KDA)
        kda_act(cfg, &keep, &drop);
    else
        mla_act(cfg, &keep, &drop);
    if (cfg->ffn[l] == K3C_FFN_MOE)
        moe_act(cfg, &keep, &drop);
    else
        dense_act(cfg, &keep, &drop);
    return recompute == K3C_RC_NONE ? keep + drop : keep;
}

static void fill_layer(const k3c_config *cfg, int l, double keys, k3c_plan_layer_sum *s) {
    k3c_plan_count c;
    k3c_plan_layer_count(cfg, l, &c);
    /* as k3c train splits them (src/model/tp_split.c): the latent projections and the mixers' shared tensors whole */
    static const int tp_comps[] = {K3C_PC_KDA, K3C_PC_MLA, K3C_PC_DENSE, K3C_PC_SHARED};
    static const int rep_comps[] = {K3C_PC_NORM, K3C_PC_ATTNRES, K3C_PC_ROUTER, K3C_PC_LATENT};
    memset(s, 0, sizeof *s);
    for (size_t i = 0; i < sizeof tp_comps / sizeof *tp_comps; i++) {
        const int k = tp_comps[i];
        s->ne_tp += (double)(c.n[k] - c.rep[k]);
        s->mat_tp += (double)(c.matrix[k] - c.rep_matrix[k]);
        s->ne_rep += (double)c.rep[k];
        s->mat_rep += (double)c.rep_matrix[k];
    }
    s->pad = (double)c.pad;
    for (size_t i = 0; i < sizeof rep_comps / sizeof *rep_comps; i++) {
        s->ne_rep += (double)c.n[rep_comps[i]];
        s->mat_rep += (double)c.matrix[rep_comps[i]];
    }
    s->ex = (double)c.n[K3C_PC_ROUTED];
    s->frozen = (double)c.frozen;
    s->fwd = k3c_plan_layer_fwd_flops(cfg, l, keys);
    for (int r = 0; r < 3; r++) s->act[r] = k3c_plan_layer_act_bytes(cfg, l, r);
    s->mla = cfg->mixer[l] == K3C_MIXER_MLA;
    s->moe = cfg->ffn[l] == K3C_FFN_MOE;
    if (s->mla)
        s->latent = (double)(cfg->kv_lora_rank + cfg->qk_rope_dim);
    else
        s->kda_states = (double)cfg->kda_heads * (double)(cfg->kda_head_dim * cfg->kda_head_dim) / K3C_PLAN_KDA_CHUNK *
                        U; /* [NT, H, d_k, d_v] entering states, bf16 */
    s->sources_in = (double)k3c_plan_attnres_sources(cfg, l);
}

int k3c_plan_model_init(k3c_plan_model *m, const k3c_config *cfg, int64_t seq, k3c_err *err) {
    memset(m, 0, sizeof *m);
    int rc = k3c_plan_flops_train(cfg, seq, &m->flops, err);
    if (rc) return rc;
    m->cfg = cfg;
    m->seq = seq;
    m->layers = cfg->num_layers;
    m->layer = calloc((size_t)m->layers, sizeof *m->layer);
    if (!m->layer) return k3c_errf(err, K3C_ENOMEM, "plan: out of memory");
    double keys = ((double)seq + 1) / 2;
    for (int l = 0; l < cfg->num_layers; l++) fill_layer(cfg, l, keys, &m->layer[l]);
    k3c_plan_count first, last;
    k3c_plan_head_count(cfg, &first, &last);
    m->first.ne_tp = (double)(first.n[K3C_PC_EMBED] + first.n[K3C_PC_VISION] + first.n[K3C_PC_PROJECTOR]);
    m->first.mat_tp = (double)(first.matrix[K3C_PC_VISION] + first.matrix[K3C_PC_PROJECTOR]);
    m->last.ne_tp = (double)last.n[K3C_PC_LM_HEAD];
    m->last.ne_rep = (double)(last.n[K3C_PC_NORM] + last.n[K3C_PC_ATTNRES]);
    m->last.fwd = k3c_plan_head_fwd_flops(cfg);
    m->sources_out = cfg->attn_res_block > 0 ? (double)k3c_plan_attnres_sources(cfg, cfg->num_layers) + 1 : 0;
    return K3C_OK;
}

void k3c_plan_model_free(k3c_plan_model *m) {
    free(m->layer);
    m->layer = NULL;
}
