/* params.c — exact parameter accounting of a kimi_linear / kimi_k3 config, tensor by tensor as the checkpoint stores
 * them (docs/FORMATS.md §1.1, §5.1, §5.2; docs/MODEL.md §2): totals, active per token, dtypes, tensor count. */
#include "plan/plan.h"

#include <string.h>

static const char *const comp_names[K3C_PC_COUNT] = {
    "embedding", "lm_head", "norms",  "kda",    "mla",    "attnres",   "dense_mlp",
    "router",    "latent",  "shared", "routed", "vision", "projector",
};

const char *k3c_plan_comp_name(int comp) { return comp >= 0 && comp < K3C_PC_COUNT ? comp_names[comp] : "?"; }

static int is_k3(const k3c_config *cfg) { return strcmp(cfg->model_type, "kimi_k3") == 0; }

/* Adds one tensor of n parameters to component c. */
static void add(k3c_plan_count *o, int c, int64_t n, int matrix, int f32) {
    o->n[c] += n;
    if (matrix) o->matrix[c] += n;
    if (f32) o->f32 += n;
    o->tensors++;
}

/* The same for a tensor tensor parallelism replicates (whole on every TP rank; src/model/tp_split.c). */
static void add_rep(k3c_plan_count *o, int c, int64_t n, int matrix, int f32) {
    add(o, c, n, matrix, f32);
    o->rep[c] += n;
    if (matrix) o->rep_matrix[c] += n;
}

void k3c_plan_count_add(k3c_plan_count *acc, const k3c_plan_count *x) {
    for (int c = 0; c < K3C_PC_COUNT; c++) {
        acc->n[c] += x->n[c], acc->matrix[c] += x->matrix[c];
        acc->rep[c] += x->rep[c], acc->rep_matrix[c] += x->rep_matrix[c];
    }
    acc->pad += x->pad;
    acc->frozen += x->frozen;
    acc->f32 += x->f32;
    acc->tensors += x->tensors;
}

#define NEED(cond, field, what)                                                                                        \
    do {                                                                                                               \
        if (!(cond)) return k3c_errf(err, K3C_ECONFIG, "config: %s %s", field, what);                                  \
    } while (0)

int k3c_plan_check_config(const k3c_config *cfg, k3c_err *err) {
    NEED(cfg->hidden_size > 0, "hidden_size", "must be positive");
    NEED(cfg->vocab_size > 0, "vocab_size", "must be positive");
    NEED(cfg->num_layers > 0 && cfg->num_layers <= K3C_MAX_LAYERS, "num_hidden_layers", "must be in 1..512");
    int n_kda = 0, n_mla = 0, n_moe = 0, n_dense = 0;
    for (int64_t l = 0; l < cfg->num_layers; l++) {
        if (cfg->mixer[l] > K3C_MIXER_MLA || cfg->ffn[l] > K3C_FFN_MOE)
            return k3c_errf(err, K3C_ECONFIG, "config: layer %lld has an unknown mixer/FFN kind", (long long)l);
        n_kda += cfg->mixer[l] == K3C_MIXER_KDA, n_mla += cfg->mixer[l] == K3C_MIXER_MLA;
        n_moe += cfg->ffn[l] == K3C_FFN_MOE, n_dense += cfg->ffn[l] == K3C_FFN_DENSE;
    }
    if (n_kda) {
        NEED(cfg->kda_heads > 0 && cfg->kda_head_dim > 0, "linear_attn_config.num_heads/head_dim",
             "must be positive when KDA layers exist");
        NEED(cfg->conv_kernel > 0, "linear_attn_config.short_conv_kernel_size", "must be positive");
    }
    if (n_mla) {
        NEED(cfg->mla_heads > 0, "num_attention_heads", "must be positive when MLA layers exist");
        NEED(cfg->kv_lora_rank > 0 && cfg->qk_nope_dim >= 0 && cfg->qk_rope_dim >= 0 && cfg->v_head_dim > 0,
             "kv_lora_rank/qk_nope_head_dim/qk_rope_head_dim/v_head_dim", "must be positive");
        NEED(cfg->qk_nope_dim + cfg->qk_rope_dim > 0, "qk_nope_head_dim + qk_rope_head_dim", "must be positive");
        NEED(cfg->q_lora_rank >= 0, "q_lora_rank", "must be null or positive");
    }
    if (n_dense) NEED(cfg->intermediate_size > 0, "intermediate_size", "must be positive (dense layers exist)");
    if (n_moe) {
        NEED(cfg->num_experts > 0, "num_experts", "must be positive when MoE layers exist");
        NEED(cfg->top_k > 0 && cfg->top_k <= cfg->num_experts, "num_experts_per_token", "must be in 1..num_experts");
        NEED(cfg->moe_intermediate_size > 0, "moe_intermediate_size", "must be positive");
        NEED(cfg->num_shared_experts >= 0 && cfg->latent_dim >= 0, "num_shared_experts/routed_expert_hidden_size",
             "must not be negative");
        NEED(!cfg->experts_mxfp4 || cfg->mxfp4_group > 0, "quantization_config group_size", "must be positive");
    }
    NEED(cfg->attn_res_block >= 0, "attn_res_block_size", "must not be negative");
    if (cfg->vision.present)
        NEED(cfg->vision.hidden > 0 && cfg->vision.layers > 0 && cfg->vision.patch_size > 0,
             "vision_config.vt_hidden_size/vt_num_hidden_layers/patch_size", "must be positive");
    return K3C_OK;
}

static void count_kda(const k3c_config *cfg, k3c_plan_count *o) {
    int64_t d = cfg->hidden_size, H = cfg->kda_heads, dk = cfg->kda_head_dim, P = H * dk;
    int k3 = is_k3(cfg);
    for (int i = 0; i < 3; i++) add(o, K3C_PC_KDA, P * d, 1, 0);                 /* q/k/v_proj */
    for (int i = 0; i < 3; i++) add(o, K3C_PC_KDA, P * cfg->conv_kernel, 0, k3); /* q/k/v_conv1d [P,1,W] */
    add_rep(o, K3C_PC_KDA, dk * d, 1, 0);                                        /* f_a_proj */
    add(o, K3C_PC_KDA, P * dk, 1, 0);                                            /* f_b_proj */
    add(o, K3C_PC_KDA, H * d, 1, 0);                                             /* b_proj */
    /* A_log: Kimi Linear [1,1,H,1]; the K3 release pads it to head_dim (only the first H entries are used). */
    add(o, K3C_PC_KDA, k3 && dk > H ? dk : H, 0, 1);
    o->pad += k3 && dk > H ? dk - H : 0;
    add(o, K3C_PC_KDA, P, 0, 1);       /* dt_bias [P] */
    add_rep(o, K3C_PC_KDA, dk, 0, k3); /* o_norm [d_v], shared by heads */
    if (cfg->kda_full_rank_gate)
        add(o, K3C_PC_KDA, P * d, 1, 0); /* g_proj */
    else
        add_rep(o, K3C_PC_KDA, dk * d, 1, 0), add(o, K3C_PC_KDA, P * dk, 1, 0); /* g_a_proj, g_b_proj */
    add(o, K3C_PC_KDA, d * P, 1, 0);                                            /* o_proj */
}

static void count_mla(const k3c_config *cfg, k3c_plan_count *o) {
    int64_t d = cfg->hidden_size, H = cfg->mla_heads, qd = cfg->qk_nope_dim + cfg->qk_rope_dim;
    int64_t kvl = cfg->kv_lora_rank, ql = cfg->q_lora_rank;
    if (ql > 0) {
        add_rep(o, K3C_PC_MLA, ql * d, 1, 0);  /* q_a_proj */
        add_rep(o, K3C_PC_MLA, ql, 0, 0);      /* q_a_layernorm */
        add(o, K3C_PC_MLA, H * qd * ql, 1, 0); /* q_b_proj */
    } else {
        add(o, K3C_PC_MLA, H * qd * d, 1, 0); /* q_proj */
    }
    add_rep(o, K3C_PC_MLA, (kvl + cfg->qk_rope_dim) * d, 1, 0);                  /* kv_a_proj_with_mqa */
    add_rep(o, K3C_PC_MLA, kvl, 0, 0);                                           /* kv_a_layernorm */
    add(o, K3C_PC_MLA, H * (cfg->qk_nope_dim + cfg->v_head_dim) * kvl, 1, 0);    /* kv_b_proj */
    if (cfg->mla_output_gate) add(o, K3C_PC_MLA, H * cfg->v_head_dim * d, 1, 0); /* g_proj */
    add(o, K3C_PC_MLA, d * H * cfg->v_head_dim, 1, 0);                           /* o_proj */
}

static void count_moe(const k3c_config *cfg, k3c_plan_count *o) {
    int64_t d = cfg->hidden_size, n = cfg->num_experts, lat = cfg->latent_dim, m = cfg->moe_intermediate_size;
    add(o, K3C_PC_ROUTER, n * d, 1, 0); /* gate.weight */
    add(o, K3C_PC_ROUTER, n, 0, 1);     /* gate.e_score_correction_bias: selection only, QB-updated */
    o->frozen += n;
    if (lat > 0) {
        add(o, K3C_PC_LATENT, lat * d, 1, 0); /* routed_expert_down_proj */
        add(o, K3C_PC_LATENT, lat, 0, 0);     /* routed_expert_norm */
        add(o, K3C_PC_LATENT, d * lat, 1, 0); /* routed_expert_up_proj */
    }
    int64_t ms = m * cfg->num_shared_experts; /* shared experts fused into one MLP */
    if (ms > 0)
        for (int i = 0; i < 3; i++) add(o, K3C_PC_SHARED, ms * d, 1, 0);
    int64_t ein = lat > 0 ? lat : d;
    o->n[K3C_PC_ROUTED] += n * 3 * ein * m;
    o->matrix[K3C_PC_ROUTED] += n * 3 * ein * m;
    o->tensors += n * 3 * (cfg->experts_mxfp4 ? 2 : 1);
}

int k3c_plan_layer_count(const k3c_config *cfg, int l, k3c_plan_count *o) {
    memset(o, 0, sizeof *o);
    if (l < 0 || l >= cfg->num_layers) return K3C_EINVAL;
    int64_t d = cfg->hidden_size;
    add(o, K3C_PC_NORM, d, 0, 0); /* input_layernorm */
    add(o, K3C_PC_NORM, d, 0, 0); /* post_attention_layernorm */
    if (cfg->attn_res_block > 0)  /* self_attention_res_{norm,proj}, mlp_res_{norm,proj}: [d] and [1, d] */
        for (int i = 0; i < 4; i++) add(o, K3C_PC_ATTNRES, d, 0, 0);
    if (cfg->mixer[l] == K3C_MIXER_KDA)
        count_kda(cfg, o);
    else
        count_mla(cfg, o);
    if (cfg->ffn[l] == K3C_FFN_MOE)
        count_moe(cfg, o);
    else
        for (int i = 0; i < 3; i++) add(o, K3C_PC_DENSE, cfg->intermediate_size * d, 1, 0);
    return K3C_OK;
}

static void count_vision(const k3c_vision_config *v, k3c_plan_count *o) {
    int64_t h = v->hidden;
    add(o, K3C_PC_VISION, h * 3 * v->patch_size * v->patch_size, 1, 0); /* patch_embed.proj [h, 3, p, p] */
    add(o, K3C_PC_VISION, v->pos_emb_h * v->pos_emb_w * h, 0, 0);       /* patch_embed.pos_emb [H, W, h] */
    for (int64_t b = 0; b < v->layers; b++) {
        add(o, K3C_PC_VISION, 3 * v->qkv_hidden * h, 1, 0); /* wqkv */
        add(o, K3C_PC_VISION, h * v->qkv_hidden, 1, 0);     /* wo */
        add(o, K3C_PC_VISION, v->intermediate * h, 1, 0);   /* mlp.fc0 */
        add(o, K3C_PC_VISION, h * v->intermediate, 1, 0);   /* mlp.fc1 */
        add(o, K3C_PC_VISION, h, 0, 0);                     /* norm0 */
        add(o, K3C_PC_VISION, h, 0, 0);                     /* norm1 */
    }
    add(o, K3C_PC_VISION, h, 0, 0);                                      /* encoder.final_layernorm */
    int64_t in = v->mm_hidden * v->merge_kernel[0] * v->merge_kernel[1]; /* 2×2 merged patches */
    add(o, K3C_PC_PROJECTOR, in * in, 1, 0);                             /* mm_projector.proj.0 */
    add(o, K3C_PC_PROJECTOR, v->text_hidden * in, 1, 0);                 /* mm_projector.proj.2 */
    add(o, K3C_PC_PROJECTOR, v->text_hidden, 0, 0);                      /* mm_projector.post_norm */
}

void k3c_plan_head_count(const k3c_config *cfg, k3c_plan_count *first, k3c_plan_count *last) {
    memset(first, 0, sizeof *first);
    memset(last, 0, sizeof *last);
    int64_t d = cfg->hidden_size, vd = cfg->vocab_size * d;
    add(first, K3C_PC_EMBED, vd, 0, 0);
    if (cfg->vision.present) count_vision(&cfg->vision, first);
    add(last, K3C_PC_NORM, d, 0, 0); /* model.norm */
    if (cfg->attn_res_block > 0) add(last, K3C_PC_ATTNRES, d, 0, 0), add(last, K3C_PC_ATTNRES, d, 0, 0);
    if (!cfg->tie_word_embeddings) add(last, K3C_PC_LM_HEAD, vd, 0, 0);
}

int k3c_plan_count_params(const k3c_config *cfg, k3c_plan_params *p, k3c_err *err) {
    memset(p, 0, sizeof *p);
    int rc = k3c_plan_check_config(cfg, err);
    if (rc) return rc;
    k3c_plan_count all, first, last, lc;
    memset(&all, 0, sizeof all);
    k3c_plan_head_count(cfg, &first, &last);
    k3c_plan_count_add(&all, &first);
    k3c_plan_count_add(&all, &last);
    for (int l = 0; l < cfg->num_layers; l++) {
        k3c_plan_layer_count(cfg, l, &lc);
        k3c_plan_count_add(&all, &lc);
    }
    for (int c = 0; c < K3C_PC_COUNT; c++) {
        p->total[c] = all.n[c];
        p->total_all += all.n[c];
        p->active[c] = all.n[c];
    }
    /* Active per text token: the embedding lookup reads one row (not counted); k of n routed experts; the vision
     * tower and projector only run on images. A tied lm_head is the embedding matrix used as the output projection. */
    p->active[K3C_PC_EMBED] = cfg->tie_word_embeddings ? all.n[K3C_PC_EMBED] : 0;
    p->active[K3C_PC_ROUTED] = cfg->num_experts > 0 ? all.n[K3C_PC_ROUTED] / cfg->num_experts * cfg->top_k : 0;
    p->active[K3C_PC_VISION] = p->active[K3C_PC_PROJECTOR] = 0;
    for (int c = 0; c < K3C_PC_COUNT; c++) p->active_all += p->active[c];
    p->vision_total = all.n[K3C_PC_VISION] + all.n[K3C_PC_PROJECTOR];
    p->text_total = p->total_all - p->vision_total;
    p->frozen = all.frozen;
    p->trainable = p->total_all - all.frozen;
    p->tensors = all.tensors;
    p->f32 = all.f32;
    p->mxfp4 = cfg->experts_mxfp4 ? all.n[K3C_PC_ROUTED] : 0;
    p->bf16 = p->total_all - p->f32 - p->mxfp4;
    double fp4 = cfg->experts_mxfp4 ? 0.5 + 1.0 / (double)cfg->mxfp4_group : 0;
    p->ckpt_bytes = 2.0 * (double)p->bf16 + 4.0 * (double)p->f32 + fp4 * (double)p->mxfp4;
    return K3C_OK;
}
