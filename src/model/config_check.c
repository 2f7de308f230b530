/* config_check.c — k3c_config_validate (dimensions positive, the plan complete, MoE / MLA / KDA / vision fields
 * consistent), the §4 MoE layer rule and the plan counts; part of the model config (docs/FORMATS.md §2–4). */
#include "model/config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int k3c_config_layer_is_moe(const k3c_config *cfg, int64_t l) {
    return cfg->num_experts > 0 && l >= cfg->first_k_dense && cfg->moe_layer_freq > 0 && l % cfg->moe_layer_freq == 0;
}

int k3c_config_num_mla(const k3c_config *cfg) {
    int n = 0;
    for (int64_t l = 0; l < cfg->num_layers && l < K3C_MAX_LAYERS; l++) n += cfg->mixer[l] == K3C_MIXER_MLA;
    return n;
}

int k3c_config_num_moe(const k3c_config *cfg) {
    int n = 0;
    for (int64_t l = 0; l < cfg->num_layers && l < K3C_MAX_LAYERS; l++) n += cfg->ffn[l] == K3C_FFN_MOE;
    return n;
}

typedef struct {
    const char *file, *tp; /* tp: "text_config." for kimi_k3 */
    k3c_err *err;
    int rc;
} vctx;

/* Records the first failure: "file: <tp>field: must be ... (got v)". */
static void need(vctx *v, int ok, const char *field, const char *rule, double got) {
    if (ok || v->rc) return;
    v->rc = k3c_errf(v->err, K3C_ECONFIG, "%s: %s%s: must be %s (got %.17g)", v->file, v->tp, field, rule, got);
}
#define POS(v, x, field) need((v), (x) > 0, (field), "positive", (double)(x))

/* Upper bounds of every dimension: several times the largest released model's (Kimi K3: vocab 163,840, hidden 7,168,
 * 896 experts, 96 heads, context 1M), small enough that no product of them overflows int64 and a mistyped or hostile
 * config fails here, naming the bound, instead of asking for terabytes. */
enum {
    MAX_VOCAB = 1 << 24,
    MAX_HIDDEN = 1 << 16,
    MAX_FFN = 1 << 18,
    MAX_EXPERTS = 1 << 14,
    MAX_SHARED = 64,
    MAX_HEADS = 1024,
    MAX_HEAD_DIM = 1024,
    MAX_RANK = 1 << 16,
    MAX_CONV = 64,
    MAX_POSITIONS = 1 << 26,
    MAX_PATCH = 1024,
    MAX_POS_EMB = 1 << 12,
};

/* x in lo..hi, the bounds stated in the error. */
static void range(vctx *v, int64_t x, int64_t lo, int64_t hi, const char *field) {
    char rule[64];
    snprintf(rule, sizeof rule, "in %lld..%lld", (long long)lo, (long long)hi);
    need(v, x >= lo && x <= hi, field, rule, (double)x);
}

static void validate_kda(vctx *v, const k3c_config *cfg, int any) {
    if (any) {
        POS(v, cfg->kda_heads, "linear_attn_config.num_heads");
        POS(v, cfg->kda_head_dim, "linear_attn_config.head_dim");
        POS(v, cfg->conv_kernel, "linear_attn_config.short_conv_kernel_size");
    }
    range(v, cfg->kda_heads, 0, MAX_HEADS, "linear_attn_config.num_heads");
    range(v, cfg->kda_head_dim, 0, MAX_HEAD_DIM, "linear_attn_config.head_dim");
    range(v, cfg->conv_kernel, 0, MAX_CONV, "linear_attn_config.short_conv_kernel_size");
    need(v, cfg->kda_gate == K3C_GATE_SOFTPLUS || cfg->kda_gate == K3C_GATE_LOWER_BOUND, "linear_attn_config.gate",
         "softplus (0) or lower bound (1)", cfg->kda_gate);
    if (cfg->kda_gate == K3C_GATE_LOWER_BOUND)
        need(v, cfg->gate_lower_bound >= -5.0 && cfg->gate_lower_bound < 0, "linear_attn_config.gate_lower_bound",
             "in [-5, 0)", cfg->gate_lower_bound);
    else
        need(v, cfg->gate_lower_bound == 0, "linear_attn_config.gate_lower_bound", "unset (0) with the softplus gate",
             cfg->gate_lower_bound);
    need(v, cfg->kda_full_rank_gate == 0 || cfg->kda_full_rank_gate == 1, "linear_attn_config.use_full_rank_gate",
         "0 or 1", cfg->kda_full_rank_gate);
}

static void validate_mla(vctx *v, const k3c_config *cfg, int any) {
    if (any) {
        POS(v, cfg->mla_heads, "num_attention_heads");
        POS(v, cfg->kv_lora_rank, "kv_lora_rank");
        POS(v, cfg->qk_nope_dim, "qk_nope_head_dim");
        POS(v, cfg->qk_rope_dim, "qk_rope_head_dim");
        POS(v, cfg->v_head_dim, "v_head_dim");
        /* MLA shares one latent across heads; k3c has no grouped-query MLA. */
        need(v, cfg->mla_kv_heads == cfg->mla_heads, "num_key_value_heads", "equal to num_attention_heads (MLA)",
             (double)cfg->mla_kv_heads);
        POS(v, cfg->mla_norm_eps, "mla_norm_eps");
    }
    need(v, cfg->q_lora_rank >= 0, "q_lora_rank", "null (0) or positive", (double)cfg->q_lora_rank);
    range(v, cfg->q_lora_rank, 0, MAX_RANK, "q_lora_rank");
    range(v, cfg->mla_heads, 0, MAX_HEADS, "num_attention_heads");
    range(v, cfg->mla_kv_heads, 0, MAX_HEADS, "num_key_value_heads");
    range(v, cfg->kv_lora_rank, 0, MAX_RANK, "kv_lora_rank");
    range(v, cfg->qk_nope_dim, 0, MAX_HEAD_DIM, "qk_nope_head_dim");
    range(v, cfg->qk_rope_dim, 0, MAX_HEAD_DIM, "qk_rope_head_dim");
    range(v, cfg->v_head_dim, 0, MAX_HEAD_DIM, "v_head_dim");
    need(v, cfg->mla_output_gate == 0 || cfg->mla_output_gate == 1, "mla_use_output_gate", "0 or 1",
         cfg->mla_output_gate);
}

static void validate_moe(vctx *v, const k3c_config *cfg) {
    range(v, cfg->num_experts, 0, MAX_EXPERTS, "num_experts");
    if (cfg->num_experts > 0 && !v->rc) {
        need(v, cfg->top_k >= 1 && cfg->top_k <= cfg->num_experts, "num_experts_per_token", "in 1..num_experts",
             (double)cfg->top_k);
        range(v, cfg->num_shared_experts, 0, MAX_SHARED, "num_shared_experts");
        range(v, cfg->moe_intermediate_size, 1, MAX_FFN, "moe_intermediate_size");
        POS(v, cfg->routed_scaling_factor, "routed_scaling_factor");
        POS(v, cfg->num_expert_group, "num_expert_group");
        need(v, cfg->num_expert_group > 0 && cfg->num_experts % cfg->num_expert_group == 0, "num_expert_group",
             "a divisor of num_experts", (double)cfg->num_expert_group);
        need(v, cfg->topk_group >= 1 && cfg->topk_group <= cfg->num_expert_group, "topk_group",
             "in 1..num_expert_group", (double)cfg->topk_group);
        range(v, cfg->first_k_dense, 0, K3C_MAX_LAYERS, "first_k_dense_replace");
        range(v, cfg->moe_layer_freq, 1, K3C_MAX_LAYERS, "moe_layer_freq");
        range(v, cfg->latent_dim, 0, MAX_HIDDEN, "routed_expert_hidden_size");
        need(v, cfg->renormalize == 0 || cfg->renormalize == 1, "moe_renormalize", "0 or 1", cfg->renormalize);
    }
    need(v, !cfg->latent_norm || cfg->latent_dim > 0, "latent_moe_use_norm", "false without routed_expert_hidden_size",
         cfg->latent_norm);
    vctx q = *v; /* quantization_config may sit at the top level or in text_config: name it without a prefix */
    q.tp = "";
    if (cfg->experts_mxfp4) {
        need(&q, cfg->num_experts > 0, "quantization_config", "absent without routed experts",
             (double)cfg->num_experts);
        need(&q, cfg->mxfp4_group == K3C_CFG_MXFP4_GROUP, "quantization_config.config_groups.*.weights.group_size",
             "32 (the MXFP4 block)", (double)cfg->mxfp4_group);
        int64_t in1 = cfg->latent_dim > 0 ? cfg->latent_dim : cfg->hidden_size;
        need(v, in1 % K3C_CFG_MXFP4_GROUP == 0 && cfg->moe_intermediate_size % K3C_CFG_MXFP4_GROUP == 0,
             "moe_intermediate_size", "such that every expert input width is a multiple of 32 (MXFP4 groups)",
             (double)cfg->moe_intermediate_size);
    } else {
        need(&q, cfg->mxfp4_group == 0, "quantization_config.group_size", "0 without MXFP4", (double)cfg->mxfp4_group);
    }
    v->rc = q.rc;
}

static void validate_plan(vctx *v, const k3c_config *cfg) {
    for (int64_t l = 0; l < cfg->num_layers && !v->rc; l++) {
        if (cfg->mixer[l] > K3C_MIXER_MLA)
            v->rc = k3c_errf(v->err, K3C_ECONFIG, "%s: layer %lld: mixer %d is neither KDA nor MLA", v->file,
                             (long long)l, cfg->mixer[l]);
        else if (cfg->ffn[l] != (k3c_config_layer_is_moe(cfg, l) ? K3C_FFN_MOE : K3C_FFN_DENSE))
            v->rc = k3c_errf(v->err, K3C_ECONFIG,
                             "%s: layer %lld: ffn %s contradicts num_experts / first_k_dense_replace / moe_layer_freq",
                             v->file, (long long)l, cfg->ffn[l] == K3C_FFN_MOE ? "MoE" : "dense");
    }
}

static void validate_vision(vctx *v, const k3c_config *cfg) {
    const k3c_vision_config *vc = &cfg->vision;
    if (!vc->present) return;
    vctx vv = *v;
    vv.tp = "vision_config.";
    range(&vv, vc->patch_size, 1, MAX_PATCH, "patch_size");
    range(&vv, vc->hidden, 1, MAX_HIDDEN, "vt_hidden_size");
    range(&vv, vc->intermediate, 1, MAX_FFN, "vt_intermediate_size");
    range(&vv, vc->heads, 1, MAX_HEADS, "vt_num_attention_heads");
    range(&vv, vc->layers, 1, K3C_MAX_LAYERS, "vt_num_hidden_layers");
    range(&vv, vc->qkv_hidden, 1, MAX_HIDDEN, "qkv_hidden_size");
    need(&vv, vc->heads > 0 && vc->qkv_hidden % vc->heads == 0, "qkv_hidden_size",
         "a multiple of vt_num_attention_heads", (double)vc->qkv_hidden);
    need(&vv, vc->heads > 0 && (vc->qkv_hidden / vc->heads) % 4 == 0, "qkv_hidden_size",
         "heads of a multiple of 4 (2D rotary pairs per axis)", (double)vc->qkv_hidden);
    range(&vv, vc->mm_hidden, 1, MAX_FFN, "mm_hidden_size");
    need(&vv, vc->mm_hidden == vc->hidden, "mm_hidden_size", "equal to vt_hidden_size (the merged patches' width)",
         (double)vc->mm_hidden);
    need(&vv, vc->interp == K3C_VISION_BILINEAR || vc->interp == K3C_VISION_BICUBIC, "pos_emb_interpolation_mode",
         "bilinear or bicubic", (double)vc->interp);
    need(&vv, vc->media_pad_id >= -1 && vc->media_pad_id < cfg->vocab_size, "media_placeholder_token_id",
         "-1 (absent) or a token id below vocab_size", (double)vc->media_pad_id);
    need(&vv, vc->text_hidden == cfg->hidden_size, "text_hidden_size", "equal to the text hidden_size",
         (double)vc->text_hidden);
    range(&vv, vc->merge_kernel[0], 1, MAX_CONV, "merge_kernel_size[0]");
    range(&vv, vc->merge_kernel[1], 1, MAX_CONV, "merge_kernel_size[1]");
    range(&vv, vc->pos_emb_h, 1, MAX_POS_EMB, "init_pos_emb_height");
    range(&vv, vc->pos_emb_w, 1, MAX_POS_EMB, "init_pos_emb_width");
    range(&vv, vc->pos_emb_t, 1, MAX_POS_EMB, "init_pos_emb_time");
    POS(&vv, vc->ln_eps, "projector_ln_eps");
    need(&vv, strcmp(cfg->model_type, K3C_CFG_KIMI_K3) == 0, "present", "only with model_type kimi_k3", 1);
    v->rc = vv.rc;
}

static void validate_ids(vctx *v, const k3c_config *cfg) {
    const int64_t ids[3] = {cfg->bos_token_id, cfg->eos_token_id, cfg->pad_token_id};
    static const char *names[3] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    for (int i = 0; i < 3; i++)
        need(v, ids[i] >= -1 && ids[i] < cfg->vocab_size, names[i], "-1 (absent) or a token id below vocab_size",
             (double)ids[i]);
}

int k3c_config_validate(const k3c_config *cfg, const char *name_for_errors, k3c_err *err) {
    const char *file = name_for_errors ? name_for_errors : "config";
    if (!cfg) return k3c_errf(err, K3C_EINVAL, "%s: NULL config", file);
    int k3 = strcmp(cfg->model_type, K3C_CFG_KIMI_K3) == 0;
    if (!k3 && strcmp(cfg->model_type, K3C_CFG_KIMI_LINEAR) != 0)
        return k3c_errf(err, K3C_ECONFIG, "%s: model_type: unknown \"%.31s\"", file, cfg->model_type);
    if (strcmp(cfg->tensor_prefix, k3 ? K3C_CFG_K3_PREFIX : "") != 0)
        return k3c_errf(err, K3C_ECONFIG, "%s: tensor prefix \"%.31s\" does not match model_type %s", file,
                        cfg->tensor_prefix, cfg->model_type);
    vctx v = {file, k3 ? "text_config." : "", err, 0};
    need(&v, cfg->num_layers >= 1 && cfg->num_layers <= K3C_MAX_LAYERS, "num_hidden_layers",
         "in 1..512 (K3C_MAX_LAYERS)", (double)cfg->num_layers);
    if (v.rc) return v.rc;
    range(&v, cfg->vocab_size, 1, MAX_VOCAB, "vocab_size");
    range(&v, cfg->hidden_size, 1, MAX_HIDDEN, "hidden_size");
    range(&v, cfg->max_positions, 1, MAX_POSITIONS, k3 ? "max_position_embeddings" : "model_max_length");
    need(&v, cfg->rms_norm_eps > 0 && cfg->rms_norm_eps < 1, "rms_norm_eps", "in (0, 1)", cfg->rms_norm_eps);
    need(&v, cfg->tie_word_embeddings == 0 || cfg->tie_word_embeddings == 1, "tie_word_embeddings", "0 or 1",
         cfg->tie_word_embeddings);
    int nmla = k3c_config_num_mla(cfg), nmoe = k3c_config_num_moe(cfg);
    if (nmoe < cfg->num_layers) range(&v, cfg->intermediate_size, 1, MAX_FFN, "intermediate_size");
    validate_kda(&v, cfg, nmla < cfg->num_layers);
    validate_mla(&v, cfg, nmla > 0);
    validate_moe(&v, cfg);
    validate_plan(&v, cfg); /* after the MoE fields, so that an out-of-range one is named as such */
    need(&v, cfg->act == K3C_ACT_SILU || cfg->act == K3C_ACT_SITU || cfg->act == K3C_ACT_GELU, "hidden_act",
         "silu (0), situ (1) or gelu (2)", cfg->act);
    if (cfg->act == K3C_ACT_SITU) {
        POS(&v, cfg->situ_beta, "activation_situ_beta");
        POS(&v, cfg->situ_linear_beta, "activation_situ_linear_beta");
    }
    range(&v, cfg->attn_res_block, 0, K3C_MAX_LAYERS, "attn_res_block_size");
    validate_ids(&v, cfg);
    validate_vision(&v, cfg);
    return v.rc;
}
