/* config_write.c — k3c_config_save / k3c_config_to_json (config.json in the released spelling, read back to an equal
 * struct) and the compact layer-plan strings; part of the model config (docs/FORMATS.md §2–4). */
#include "model/config.h"

#include <string.h>

/* A minimal pretty JSON writer: one key per line, arrays of numbers on one line. */
typedef struct {
    k3c_sbuf *s;
    int depth;
    int first[8];
} jw;

static void jw_key(jw *w, const char *key) {
    k3c_sbuf_printf(w->s, "%s\n%*s", w->first[w->depth] ? "" : ",", 2 * w->depth, "");
    w->first[w->depth] = 0;
    k3c_sbuf_json_string(w->s, key, strlen(key));
    k3c_sbuf_append(w->s, ": ", 2);
}
/* Opens an object member (or, at depth 0, the root, which has no key). */
static void jw_open(jw *w, const char *key, char bracket) {
    if (w->depth > 0) jw_key(w, key);
    k3c_sbuf_append(w->s, &bracket, 1);
    w->first[++w->depth] = 1;
}
static void jw_close(jw *w, char bracket) {
    int empty = w->first[w->depth];
    w->depth--;
    if (!empty) k3c_sbuf_printf(w->s, "\n%*s", 2 * w->depth, "");
    k3c_sbuf_append(w->s, &bracket, 1);
}
static void jw_int(jw *w, const char *key, int64_t x) {
    jw_key(w, key);
    k3c_sbuf_printf(w->s, "%lld", (long long)x);
}
static void jw_num(jw *w, const char *key, double x) {
    jw_key(w, key);
    k3c_sbuf_json_number(w->s, x);
}
static void jw_bool(jw *w, const char *key, int b) {
    jw_key(w, key);
    k3c_sbuf_printf(w->s, "%s", b ? "true" : "false");
}
static void jw_null(jw *w, const char *key) {
    jw_key(w, key);
    k3c_sbuf_append(w->s, "null", 4);
}
static void jw_str(jw *w, const char *key, const char *v) {
    jw_key(w, key);
    k3c_sbuf_json_string(w->s, v, strlen(v));
}
static void jw_strs(jw *w, const char *key, const char *const *v, int n) {
    jw_key(w, key);
    k3c_sbuf_append(w->s, "[", 1);
    for (int i = 0; i < n; i++) {
        if (i) k3c_sbuf_append(w->s, ", ", 2);
        k3c_sbuf_json_string(w->s, v[i], strlen(v[i]));
    }
    k3c_sbuf_append(w->s, "]", 1);
}

/* Writes the one-based layer numbers whose mixer is `kind`. */
static void jw_layers(jw *w, const char *key, const k3c_config *cfg, int kind) {
    jw_key(w, key);
    k3c_sbuf_append(w->s, "[", 1);
    int n = 0;
    for (int64_t l = 0; l < cfg->num_layers; l++)
        if (cfg->mixer[l] == kind) k3c_sbuf_printf(w->s, "%s%lld", n++ ? ", " : "", (long long)(l + 1));
    k3c_sbuf_append(w->s, "]", 1);
}

static void jw_ids(jw *w, const k3c_config *cfg) {
    if (cfg->bos_token_id >= 0) jw_int(w, "bos_token_id", cfg->bos_token_id);
    if (cfg->eos_token_id >= 0) jw_int(w, "eos_token_id", cfg->eos_token_id);
    if (cfg->pad_token_id >= 0) jw_int(w, "pad_token_id", cfg->pad_token_id);
    jw_bool(w, "tie_word_embeddings", cfg->tie_word_embeddings);
}

static void write_linear_attn(jw *w, const k3c_config *cfg) {
    jw_open(w, "linear_attn_config", '{');
    if (cfg->kda_heads) jw_int(w, "num_heads", cfg->kda_heads);
    if (cfg->kda_head_dim) jw_int(w, "head_dim", cfg->kda_head_dim);
    if (cfg->conv_kernel) jw_int(w, "short_conv_kernel_size", cfg->conv_kernel);
    if (cfg->kda_gate == K3C_GATE_LOWER_BOUND) jw_num(w, "gate_lower_bound", cfg->gate_lower_bound);
    if (cfg->kda_full_rank_gate) jw_bool(w, "use_full_rank_gate", 1);
    jw_layers(w, "full_attn_layers", cfg, K3C_MIXER_MLA);
    jw_layers(w, "kda_layers", cfg, K3C_MIXER_KDA);
    jw_close(w, '}');
}

static void write_mla(jw *w, const k3c_config *cfg) {
    if (k3c_config_num_mla(cfg) == 0 && cfg->mla_heads == 0) return;
    jw_int(w, "num_attention_heads", cfg->mla_heads);
    jw_int(w, "num_key_value_heads", cfg->mla_kv_heads);
    if (cfg->q_lora_rank)
        jw_int(w, "q_lora_rank", cfg->q_lora_rank);
    else
        jw_null(w, "q_lora_rank");
    jw_int(w, "kv_lora_rank", cfg->kv_lora_rank);
    jw_int(w, "qk_nope_head_dim", cfg->qk_nope_dim);
    jw_int(w, "qk_rope_head_dim", cfg->qk_rope_dim);
    jw_int(w, "v_head_dim", cfg->v_head_dim);
    jw_bool(w, "mla_use_nope", 1);
    if (cfg->mla_output_gate) jw_bool(w, "mla_use_output_gate", 1);
}

static void write_moe(jw *w, const k3c_config *cfg) {
    if (cfg->num_experts == 0) return;
    jw_int(w, "num_experts", cfg->num_experts);
    jw_int(w, "num_experts_per_token", cfg->top_k);
    jw_int(w, "num_shared_experts", cfg->num_shared_experts);
    jw_int(w, "moe_intermediate_size", cfg->moe_intermediate_size);
    if (cfg->latent_dim) jw_int(w, "routed_expert_hidden_size", cfg->latent_dim);
    if (cfg->latent_norm) jw_bool(w, "latent_moe_use_norm", 1);
    jw_str(w, "moe_router_activation_func", "sigmoid");
    jw_bool(w, "moe_renormalize", cfg->renormalize);
    jw_num(w, "routed_scaling_factor", cfg->routed_scaling_factor);
    jw_bool(w, "use_grouped_topk", 1);
    jw_int(w, "num_expert_group", cfg->num_expert_group);
    jw_int(w, "topk_group", cfg->topk_group);
    jw_int(w, "first_k_dense_replace", cfg->first_k_dense);
    jw_int(w, "moe_layer_freq", cfg->moe_layer_freq);
}

/* The compressed-tensors block of the K3 release (§3.3), with the group size k3c holds. */
static void write_quant(jw *w, const k3c_config *cfg) {
    static const char *const targets[] = {"Linear"};
    static const char *const ignore[] = {"re:.*self_attn.*",
                                         "re:.*shared_experts.*",
                                         "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                                         "re:.*lm_head.*",
                                         "re:.*vision_tower.*",
                                         "re:.*mm_projector.*",
                                         "re:.*block_sparse_moe\\.gate$",
                                         "re:.*routed_expert_(up|down)_proj$"};
    jw_open(w, "quantization_config", '{');
    jw_str(w, "quant_method", "compressed-tensors");
    jw_str(w, "format", K3C_CFG_MXFP4_FORMAT);
    jw_str(w, "quantization_status", "compressed");
    jw_open(w, "config_groups", '{');
    jw_open(w, "group_0", '{');
    jw_str(w, "format", K3C_CFG_MXFP4_FORMAT);
    jw_strs(w, "targets", targets, 1);
    jw_null(w, "input_activations");
    jw_null(w, "output_activations");
    jw_open(w, "weights", '{');
    jw_int(w, "num_bits", 4);
    jw_str(w, "type", "float");
    jw_bool(w, "symmetric", 1);
    jw_str(w, "strategy", "group");
    jw_int(w, "group_size", cfg->mxfp4_group);
    jw_str(w, "scale_dtype", "torch.uint8");
    jw_bool(w, "dynamic", 0);
    jw_close(w, '}');
    jw_close(w, '}');
    jw_close(w, '}');
    jw_strs(w, "ignore", ignore, (int)(sizeof ignore / sizeof *ignore));
    jw_close(w, '}');
}

/* The text-model keys (flat kimi_linear file or kimi_k3's text_config). */
static void write_text(jw *w, const k3c_config *cfg, int k3) {
    jw_int(w, "vocab_size", cfg->vocab_size);
    jw_int(w, "hidden_size", cfg->hidden_size);
    jw_int(w, "num_hidden_layers", cfg->num_layers);
    jw_int(w, "intermediate_size", cfg->intermediate_size);
    jw_int(w, k3 ? "max_position_embeddings" : "model_max_length", cfg->max_positions);
    jw_num(w, "rms_norm_eps", cfg->rms_norm_eps);
    if (cfg->mla_norm_eps != (k3 ? cfg->rms_norm_eps : 1e-6)) jw_num(w, "mla_norm_eps", cfg->mla_norm_eps);
    jw_str(w, "hidden_act", cfg->act == K3C_ACT_SITU ? "situ" : cfg->act == K3C_ACT_GELU ? "gelu" : "silu");
    if (cfg->act == K3C_ACT_SITU || cfg->situ_beta) jw_num(w, "activation_situ_beta", cfg->situ_beta);
    if (cfg->act == K3C_ACT_SITU || cfg->situ_linear_beta)
        jw_num(w, "activation_situ_linear_beta", cfg->situ_linear_beta);
    write_mla(w, cfg);
    write_moe(w, cfg);
    if (cfg->attn_res_block) jw_int(w, "attn_res_block_size", cfg->attn_res_block);
    jw_int(w, "num_nextn_predict_layers", 0);
    jw_ids(w, cfg);
    write_linear_attn(w, cfg);
}

static void write_vision(jw *w, const k3c_vision_config *vc) {
    jw_open(w, "vision_config", '{');
    jw_int(w, "patch_size", vc->patch_size);
    jw_int(w, "vt_hidden_size", vc->hidden);
    jw_int(w, "vt_intermediate_size", vc->intermediate);
    jw_int(w, "vt_num_attention_heads", vc->heads);
    jw_int(w, "vt_num_hidden_layers", vc->layers);
    jw_int(w, "qkv_hidden_size", vc->qkv_hidden);
    jw_int(w, "mm_hidden_size", vc->mm_hidden);
    jw_int(w, "text_hidden_size", vc->text_hidden);
    jw_key(w, "merge_kernel_size");
    k3c_sbuf_printf(w->s, "[%lld, %lld]", (long long)vc->merge_kernel[0], (long long)vc->merge_kernel[1]);
    for (size_t i = 0; i < K3C_VISION_FIXED; i++) jw_str(w, k3c_vision_fixed[i].key, k3c_vision_fixed[i].value);
    jw_str(w, "pos_emb_interpolation_mode", k3c_vision_interp[vc->interp == K3C_VISION_BICUBIC]);
    jw_num(w, "projector_ln_eps", vc->ln_eps);
    jw_int(w, "init_pos_emb_height", vc->pos_emb_h);
    jw_int(w, "init_pos_emb_width", vc->pos_emb_w);
    jw_int(w, "init_pos_emb_time", vc->pos_emb_t);
    for (size_t i = 0; i < K3C_VISION_NO_BIAS; i++) jw_bool(w, k3c_vision_no_bias[i], 0);
    jw_close(w, '}');
}

int k3c_config_to_json(const k3c_config *cfg, k3c_sbuf *out, k3c_err *err) {
    int rc = k3c_config_validate(cfg, "config", err);
    if (rc) return rc;
    int k3 = strcmp(cfg->model_type, K3C_CFG_KIMI_K3) == 0;
    jw w = {out, 0, {0}};
    jw_open(&w, NULL, '{');
    static const char *const arch_k3[] = {"KimiK3ForConditionalGeneration"}, *const arch_kl[] = {
                                                                                 "KimiLinearForCausalLM"};
    jw_strs(&w, "architectures", k3 ? arch_k3 : arch_kl, 1);
    jw_str(&w, "model_type", cfg->model_type);
    if (k3) {
        jw_ids(&w, cfg);
        if (cfg->vision.present && cfg->vision.media_pad_id >= 0)
            jw_int(&w, "media_placeholder_token_id", cfg->vision.media_pad_id);
        jw_open(&w, "text_config", '{');
        jw_str(&w, "model_type", K3C_CFG_KIMI_LINEAR);
        jw_strs(&w, "architectures", arch_kl, 1);
    }
    write_text(&w, cfg, k3);
    if (cfg->experts_mxfp4) write_quant(&w, cfg);
    if (k3) jw_close(&w, '}');
    if (cfg->vision.present) write_vision(&w, &cfg->vision);
    jw_close(&w, '}');
    k3c_sbuf_append(out, "\n", 1);
    return out->ok ? 0 : k3c_errf(err, K3C_ENOMEM, "config: out of memory writing JSON");
}

int k3c_config_save(const k3c_config *cfg, const char *path, k3c_err *err) {
    if (!cfg || !path) return k3c_errf(err, K3C_EINVAL, "k3c_config_save: NULL argument");
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    int rc = k3c_config_to_json(cfg, &s, err);
    if (rc)
        k3c_err_wrap(err, "%s", path);
    else
        rc = k3c_write_file_atomic(path, s.buf, s.len, err);
    k3c_sbuf_free(&s);
    return rc;
}

/* ================================================================ plan strings */

void k3c_config_plan_string(const k3c_config *cfg, int ffn, char *buf, size_t n) {
    if (!n) return;
    size_t p = 0;
    for (int64_t l = 0; l < cfg->num_layers && l < K3C_MAX_LAYERS; l++) {
        if (p + 5 >= n) { /* room for " ..." and the NUL */
            snprintf(buf + p, n - p, "...");
            return;
        }
        if (l && l % 4 == 0) buf[p++] = ' ';
        buf[p++] = ffn ? (cfg->ffn[l] == K3C_FFN_MOE ? 'E' : 'D') : (cfg->mixer[l] == K3C_MIXER_MLA ? 'M' : 'K');
    }
    buf[p] = 0;
}
