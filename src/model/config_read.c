/* config_read.c — the strict reader of Hugging Face config.json files for kimi_linear and kimi_k3 checkpoints
 * (k3c_config_load / k3c_config_parse) and the layer plan they imply (docs/FORMATS.md §2, §3, §4 layer kinds).
 *
 * Both spellings of a kimi_linear text config are read: the released remote-code one (`linear_attn_config` with one-based
 * `kda_layers` / `full_attn_layers`, `num_experts`, `num_experts_per_token`, `moe_renormalize`, `model_max_length`, ...) and
 * the transformers-5.x one (`layer_types`, `mlp_layer_types`, `linear_num_heads`, `linear_head_dim`,
 * `linear_conv_kernel_dim`, `n_routed_experts`, `num_experts_per_tok`, `norm_topk_prob`, `n_group`,
 * `max_position_embeddings`). Where a config carries both spellings of one field they must agree. Unknown keys are
 * metadata and are ignored; `head_dim` (top level) is never read (docs/FORMATS.md §7 #16).
 *
 * Defaults — used only where a released or transformers-written config omits the key (everything else is required):
 *
 *   key (absent)                      value        why
 *   linear_attn_config.gate_lower_bound  none      → softplus KDA gate (Kimi Linear has no bound, §2 "keys absent")
 *   linear_attn_config.use_full_rank_gate  false   → low-rank g_a_proj/g_b_proj output gate (§2)
 *   mla_use_output_gate               false        no MLA output gate (§2)
 *   mla_use_nope                      true         transformers-5.x omits it and never rotates (golden README)
 *   routed_expert_hidden_size         0            no latent MoE (§2)
 *   latent_moe_use_norm               false        (§2)
 *   attn_res_block_size               0            plain residuals (§2)
 *   activation_situ_beta / _linear_beta  0         only read for "situ", where they are required
 *   moe_layer_freq                    1            transformers-5.x omits it (golden kimi_linear_tiny_a); release = 1
 *   moe_router_activation_func        "sigmoid"    transformers-5.x omits it; any other value is unsupported
 *   bos/eos/pad_token_id              -1           optional in PretrainedConfig
 *   quantization_config               none         unquantized checkpoint
 *   vision_config                     none         text-only checkpoint
 *   num_experts                       none         every layer dense (§4 "MoE iff num_experts set")
 *   mla_norm_eps (k3c extension key)  1e-6 (kimi_linear) / rms_norm_eps (kimi_k3)  docs/MODEL.md §1.3; written by
 *                                     k3c_config_save only when a caller changed it, so save→load is exact
 *   q_lora_rank: null                 0            single q_proj (§2); the key itself is required with MLA layers
 */
#include "model/config.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ================================================================ reading helpers */

/* If the string at s is present it must equal `want` (settings k3c implements only one way). */
static int expect_str(k3c_json_ctx *c, k3c_json_spot s, const char *want) {
    const char *v;
    int rc = k3c_json_get_str(c, K3C_JSON_OPT, s, &v);
    if (rc) return rc;
    if (v && strcmp(v, want) != 0)
        return k3c_errf(c->err, K3C_EUNSUPPORTED, "%s: %s%s: \"%s\" is not supported (k3c implements \"%s\")", c->file,
                        s.path, s.key, v, want);
    return 0;
}

/* If the boolean at s is present it must equal `want`. */
static int expect_bool(k3c_json_ctx *c, k3c_json_spot s, int want) {
    int v, present;
    int rc = k3c_json_get_bool(c, K3C_JSON_OPT, s, K3C_NOSPOT, &v, &present);
    if (rc) return rc;
    if (present && v != want)
        return k3c_errf(c->err, K3C_EUNSUPPORTED, "%s: %s%s: %s is not supported", c->file, s.path, s.key,
                        v ? "true" : "false");
    return 0;
}

/* ================================================================ the layer plan (§4) */

#define UNSET 0xFF

/* Marks each one-based layer of lac[key] as `kind` in owner[]; a layer claimed twice breaks the partition. */
static int read_layer_list(k3c_json_ctx *c, const k3c_json *lac, const char *path, const char *key, int64_t L,
                           uint8_t kind, uint8_t *owner) {
    k3c_json_spot s = K3C_SPOT(lac, path, key);
    const k3c_json *v = k3c_json_get(lac, key);
    if (!v || v->type == K3C_JSON_NULL) return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: missing", c->file, path, key);
    if (v->type != K3C_JSON_ARRAY) return k3c_json_bad_type(c, s, "an array of one-based layer numbers", v);
    for (size_t i = 0; i < v->n; i++) {
        const k3c_json *e = &v->items[i];
        if (e->type != K3C_JSON_NUMBER || !e->is_integer)
            return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s[%zu]: expected an integer, got %s", c->file, path, key, i,
                            k3c_json_type_name(e));
        if (e->integer < 1 || e->integer > L)
            return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s[%zu]: layer %lld outside 1..%lld (the lists are one-based)",
                            c->file, path, key, i, (long long)e->integer, (long long)L);
        uint8_t *o = &owner[e->integer - 1];
        if (*o != UNSET)
            return k3c_errf(
                c->err, K3C_ECONFIG,
                "%s: %s%s: layer %lld listed twice (kda_layers and full_attn_layers must partition 1..%lld)", c->file,
                path, key, (long long)e->integer, (long long)L);
        *o = kind;
    }
    return 0;
}

static int plan_from_lists(k3c_json_ctx *c, const k3c_json *lac, const char *path, int64_t L, uint8_t *mixer) {
    memset(mixer, UNSET, (size_t)L);
    int rc = read_layer_list(c, lac, path, "kda_layers", L, K3C_MIXER_KDA, mixer);
    if (!rc) rc = read_layer_list(c, lac, path, "full_attn_layers", L, K3C_MIXER_MLA, mixer);
    if (rc) return rc;
    for (int64_t l = 0; l < L; l++)
        if (mixer[l] == UNSET)
            return k3c_errf(c->err, K3C_ECONFIG,
                            "%s: %skda_layers / full_attn_layers: layer %lld (one-based) is in neither list "
                            "(they must partition 1..%lld)",
                            c->file, path, (long long)(l + 1), (long long)L);
    return 0;
}

/* Reads a per-layer string array (layer_types / mlp_layer_types) of length L whose entries are names[0] or names[1]. */
static int read_type_list(k3c_json_ctx *c, const k3c_json *obj, const char *path, const char *key, int64_t L,
                          const char *const names[2], uint8_t *out, int *present) {
    *present = 0;
    const k3c_json *v = k3c_json_get(obj, key);
    if (!v || v->type == K3C_JSON_NULL) return 0;
    if (v->type != K3C_JSON_ARRAY) return k3c_json_bad_type(c, K3C_SPOT(obj, path, key), "an array of strings", v);
    if ((int64_t)v->n != L)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: %zu entries but num_hidden_layers is %lld", c->file, path, key,
                        v->n, (long long)L);
    for (size_t i = 0; i < v->n; i++) {
        const k3c_json *e = &v->items[i];
        if (e->type != K3C_JSON_STRING)
            return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s[%zu]: expected a string, got %s", c->file, path, key, i,
                            k3c_json_type_name(e));
        if (strcmp(e->string, names[0]) == 0)
            out[i] = 0;
        else if (strcmp(e->string, names[1]) == 0)
            out[i] = 1;
        else
            return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s[%zu]: unknown layer type \"%s\" (expected \"%s\" or \"%s\")",
                            c->file, path, key, i, e->string, names[0], names[1]);
    }
    *present = 1;
    return 0;
}

/* ================================================================ the text model (kimi_linear, flat or text_config) */

typedef struct {
    k3c_json_ctx *c;
    const k3c_json *t;   /* the text config object */
    const char *tp;      /* its path: "" or "text_config." */
    const k3c_json *lac; /* linear_attn_config (may be NULL) */
    char lp[64];         /* its path */
} text_ctx;

#define T(k) K3C_SPOT(x->t, x->tp, (k))
#define LAC(k) K3C_SPOT(x->lac, x->lp, (k))

static int parse_mixer_plan(text_ctx *x, k3c_config *cfg) {
    k3c_json_ctx *c = x->c;
    int64_t L = cfg->num_layers;
    int has_lists = x->lac && (k3c_json_get(x->lac, "full_attn_layers") || k3c_json_get(x->lac, "kda_layers"));
    uint8_t from_types[K3C_MAX_LAYERS];
    static const char *const mixer_names[2] = {"linear_attention", "full_attention"};
    int has_types, rc = read_type_list(c, x->t, x->tp, "layer_types", L, mixer_names, from_types, &has_types);
    if (rc) return rc;
    if (!has_lists && !has_types)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %slinear_attn_config.full_attn_layers (or %slayer_types): missing",
                        c->file, x->tp, x->tp);
    if (has_lists && (rc = plan_from_lists(c, x->lac, x->lp, L, cfg->mixer))) return rc;
    if (!has_lists) memcpy(cfg->mixer, from_types, (size_t)L);
    if (has_lists && has_types)
        for (int64_t l = 0; l < L; l++)
            if (cfg->mixer[l] != from_types[l])
                return k3c_errf(
                    c->err, K3C_ECONFIG,
                    "%s: %slayer_types[%lld] is \"%s\" but %sfull_attn_layers says %s (layer %lld one-based)", c->file,
                    x->tp, (long long)l, mixer_names[from_types[l]], x->lp,
                    cfg->mixer[l] == K3C_MIXER_MLA ? "MLA" : "KDA", (long long)(l + 1));
    return 0;
}

static int parse_ffn_plan(text_ctx *x, k3c_config *cfg) {
    k3c_json_ctx *c = x->c;
    for (int64_t l = 0; l < cfg->num_layers; l++)
        cfg->ffn[l] = k3c_config_layer_is_moe(cfg, l) ? K3C_FFN_MOE : K3C_FFN_DENSE;
    static const char *const ffn_names[2] = {"dense", "sparse"};
    uint8_t given[K3C_MAX_LAYERS];
    int has;
    int rc = read_type_list(c, x->t, x->tp, "mlp_layer_types", cfg->num_layers, ffn_names, given, &has);
    if (rc || !has) return rc;
    for (int64_t l = 0; l < cfg->num_layers; l++)
        if (given[l] != cfg->ffn[l])
            return k3c_errf(c->err, K3C_ECONFIG,
                            "%s: %smlp_layer_types[%lld] is \"%s\" but num_experts / first_k_dense_replace / "
                            "moe_layer_freq make layer %lld %s",
                            c->file, x->tp, (long long)l, ffn_names[given[l]], (long long)l,
                            cfg->ffn[l] == K3C_FFN_MOE ? "sparse (MoE)" : "dense");
    return 0;
}

static int parse_kda(text_ctx *x, k3c_config *cfg, int need) {
    k3c_json_ctx *c = x->c;
    int f = need ? K3C_JSON_REQ : K3C_JSON_OPT, rc, present;
    if ((rc = k3c_json_get_int(c, f, LAC("num_heads"), T("linear_num_heads"), &cfg->kda_heads, NULL)) ||
        (rc = k3c_json_get_int(c, f, LAC("head_dim"), T("linear_head_dim"), &cfg->kda_head_dim, NULL)) ||
        (rc = k3c_json_get_int(c, f, LAC("short_conv_kernel_size"), T("linear_conv_kernel_dim"), &cfg->conv_kernel,
                               NULL)) ||
        (rc = k3c_json_get_num(c, K3C_JSON_OPT, LAC("gate_lower_bound"), K3C_NOSPOT, &cfg->gate_lower_bound, &present)))
        return rc;
    cfg->kda_gate = present ? K3C_GATE_LOWER_BOUND : K3C_GATE_SOFTPLUS;
    return k3c_json_get_bool(c, K3C_JSON_OPT, LAC("use_full_rank_gate"), K3C_NOSPOT, &cfg->kda_full_rank_gate, NULL);
}

static int parse_mla(text_ctx *x, k3c_config *cfg, int need) {
    k3c_json_ctx *c = x->c;
    int f = need ? K3C_JSON_REQ : K3C_JSON_OPT, rc;
    if ((rc = k3c_json_get_int(c, f, T("num_attention_heads"), K3C_NOSPOT, &cfg->mla_heads, NULL)) ||
        (rc = k3c_json_get_int(c, f, T("num_key_value_heads"), K3C_NOSPOT, &cfg->mla_kv_heads, NULL)) ||
        (rc = k3c_json_get_int(c, f | K3C_JSON_NULL_ZERO, T("q_lora_rank"), K3C_NOSPOT, &cfg->q_lora_rank, NULL)) ||
        (rc = k3c_json_get_int(c, f, T("kv_lora_rank"), K3C_NOSPOT, &cfg->kv_lora_rank, NULL)) ||
        (rc = k3c_json_get_int(c, f, T("qk_nope_head_dim"), K3C_NOSPOT, &cfg->qk_nope_dim, NULL)) ||
        (rc = k3c_json_get_int(c, f, T("qk_rope_head_dim"), K3C_NOSPOT, &cfg->qk_rope_dim, NULL)) ||
        (rc = k3c_json_get_int(c, f, T("v_head_dim"), K3C_NOSPOT, &cfg->v_head_dim, NULL)) ||
        (rc = k3c_json_get_bool(c, K3C_JSON_OPT, T("mla_use_output_gate"), K3C_NOSPOT, &cfg->mla_output_gate, NULL)))
        return rc;
    /* k3c's MLA is NoPE (the 64-dim k_pe slot is never rotated, §7 #2): a config asking for RoPE is not ours. */
    return expect_bool(c, T("mla_use_nope"), 1);
}

static int parse_moe(text_ctx *x, k3c_config *cfg) {
    k3c_json_ctx *c = x->c;
    int rc, present;
    if ((rc = k3c_json_get_int(c, K3C_JSON_OPT, T("num_experts"), T("n_routed_experts"), &cfg->num_experts, &present)))
        return rc;
    if (present && cfg->num_experts < 1)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %snum_experts: must be >= 1 (got %lld; omit it for a dense model)",
                        c->file, x->tp, (long long)cfg->num_experts);
    if (!present) return 0; /* a dense model: every MoE field stays 0 */
    int64_t freq = 1;
    int has_freq;
    if ((rc = k3c_json_get_int(c, K3C_JSON_REQ, T("num_experts_per_token"), T("num_experts_per_tok"), &cfg->top_k,
                               NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, T("num_shared_experts"), K3C_NOSPOT, &cfg->num_shared_experts, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, T("moe_intermediate_size"), K3C_NOSPOT, &cfg->moe_intermediate_size,
                               NULL)) ||
        (rc = k3c_json_get_bool(c, K3C_JSON_REQ, T("moe_renormalize"), T("norm_topk_prob"), &cfg->renormalize, NULL)) ||
        (rc = k3c_json_get_num(c, K3C_JSON_REQ, T("routed_scaling_factor"), K3C_NOSPOT, &cfg->routed_scaling_factor,
                               NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, T("num_expert_group"), T("n_group"), &cfg->num_expert_group, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, T("topk_group"), K3C_NOSPOT, &cfg->topk_group, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, T("first_k_dense_replace"), K3C_NOSPOT, &cfg->first_k_dense, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_OPT, T("moe_layer_freq"), K3C_NOSPOT, &freq, &has_freq)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_OPT, T("routed_expert_hidden_size"), K3C_NOSPOT, &cfg->latent_dim, NULL)) ||
        (rc = k3c_json_get_bool(c, K3C_JSON_OPT, T("latent_moe_use_norm"), K3C_NOSPOT, &cfg->latent_norm, NULL)) ||
        (rc = expect_str(c, T("moe_router_activation_func"), "sigmoid")))
        return rc;
    cfg->moe_layer_freq = has_freq ? freq : 1;
    return 0;
}

static int parse_act(text_ctx *x, k3c_config *cfg) {
    k3c_json_ctx *c = x->c;
    const char *act;
    int rc = k3c_json_get_str(c, K3C_JSON_REQ, T("hidden_act"), &act);
    if (rc) return rc;
    if (strcmp(act, "silu") == 0)
        cfg->act = K3C_ACT_SILU;
    else if (strcmp(act, "situ") == 0)
        cfg->act = K3C_ACT_SITU;
    else if (strcmp(act, "gelu") == 0) /* GeGLU with the exact erf GELU (Hugging Face's "gelu") */
        cfg->act = K3C_ACT_GELU;
    else
        return k3c_errf(c->err, K3C_ECONFIG,
                        "%s: %shidden_act: unknown activation \"%s\" (expected \"silu\", \"situ\" or \"gelu\")",
                        c->file, x->tp, act);
    int f = cfg->act == K3C_ACT_SITU ? K3C_JSON_REQ : K3C_JSON_OPT;
    if ((rc = k3c_json_get_num(c, f, T("activation_situ_beta"), K3C_NOSPOT, &cfg->situ_beta, NULL))) return rc;
    return k3c_json_get_num(c, f, T("activation_situ_linear_beta"), K3C_NOSPOT, &cfg->situ_linear_beta, NULL);
}

/* Everything a kimi_linear text config holds (the flat kimi_linear file, or kimi_k3's text_config). */
static int parse_text(k3c_json_ctx *c, const k3c_json *t, const char *tp, k3c_config *cfg) {
    text_ctx xs = {c, t, tp, NULL, {0}}, *x = &xs;
    snprintf(x->lp, sizeof x->lp, "%slinear_attn_config.", tp);
    int rc;
    if ((rc = k3c_json_get_obj(c, T("linear_attn_config"), &x->lac))) return rc;
    if ((rc = k3c_json_get_int(c, K3C_JSON_REQ, T("vocab_size"), K3C_NOSPOT, &cfg->vocab_size, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, T("hidden_size"), K3C_NOSPOT, &cfg->hidden_size, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, T("num_hidden_layers"), K3C_NOSPOT, &cfg->num_layers, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, T("intermediate_size"), K3C_NOSPOT, &cfg->intermediate_size, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, T("model_max_length"), T("max_position_embeddings"),
                               &cfg->max_positions, NULL)) ||
        (rc = k3c_json_get_num(c, K3C_JSON_REQ, T("rms_norm_eps"), K3C_NOSPOT, &cfg->rms_norm_eps, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_OPT, T("attn_res_block_size"), K3C_NOSPOT, &cfg->attn_res_block, NULL)))
        return rc;
    if (cfg->num_layers < 1 || cfg->num_layers > K3C_MAX_LAYERS)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %snum_hidden_layers: %lld outside 1..%d (K3C_MAX_LAYERS)", c->file,
                        tp, (long long)cfg->num_layers, K3C_MAX_LAYERS);
    if ((rc = parse_mixer_plan(x, cfg)) || (rc = parse_moe(x, cfg)) || (rc = parse_ffn_plan(x, cfg)) ||
        (rc = parse_act(x, cfg)))
        return rc;
    int nmla = k3c_config_num_mla(cfg);
    if ((rc = parse_kda(x, cfg, nmla < cfg->num_layers)) || (rc = parse_mla(x, cfg, nmla > 0))) return rc;
    int has_eps;
    if ((rc = k3c_json_get_num(c, K3C_JSON_OPT, T("mla_norm_eps"), K3C_NOSPOT, &cfg->mla_norm_eps, &has_eps)))
        return rc;
    if (!has_eps) cfg->mla_norm_eps = strcmp(cfg->model_type, K3C_CFG_KIMI_K3) == 0 ? cfg->rms_norm_eps : 1e-6;
    return 0;
}

/* ================================================================ quantization_config (§3.3) and vision_config (§3.4) */

/* Reads one quantization_config object into (*mxfp4, *group). Only compressed-tensors MXFP4 is understood. */
static int parse_quant(k3c_json_ctx *c, const k3c_json *q, const char *path, int *mxfp4, int64_t *group) {
    const char *method, *format;
    int rc;
    if ((rc = k3c_json_get_str(c, K3C_JSON_REQ, K3C_SPOT(q, path, "quant_method"), &method)) ||
        (rc = k3c_json_get_str(c, K3C_JSON_REQ, K3C_SPOT(q, path, "format"), &format)))
        return rc;
    if (strcmp(method, "compressed-tensors") != 0 || strcmp(format, K3C_CFG_MXFP4_FORMAT) != 0)
        return k3c_errf(c->err, K3C_EUNSUPPORTED,
                        "%s: %squant_method/format: \"%s\" / \"%s\" is not supported (k3c reads compressed-tensors %s)",
                        c->file, path, method, format, K3C_CFG_MXFP4_FORMAT);
    const k3c_json *groups;
    char gpath[160], wpath[192];
    snprintf(gpath, sizeof gpath, "%sconfig_groups", path);
    if ((rc = k3c_json_get_obj(c, K3C_SPOT(q, path, "config_groups"), &groups))) return rc;
    if (!groups || groups->n == 0) return k3c_errf(c->err, K3C_ECONFIG, "%s: %s: missing or empty", c->file, gpath);
    *group = 0;
    for (size_t g = 0; g < groups->n; g++) {
        const k3c_json *gr = &groups->items[g], *w;
        snprintf(gpath, sizeof gpath, "%sconfig_groups.%s.", path, groups->keys[g]);
        if (gr->type != K3C_JSON_OBJECT) return k3c_json_bad_type(c, K3C_SPOT(groups, gpath, ""), "an object", gr);
        if ((rc = expect_str(c, K3C_SPOT(gr, gpath, "format"), K3C_CFG_MXFP4_FORMAT)) ||
            (rc = k3c_json_get_obj(c, K3C_SPOT(gr, gpath, "weights"), &w)))
            return rc;
        if (!w) return k3c_errf(c->err, K3C_ECONFIG, "%s: %sweights: missing", c->file, gpath);
        snprintf(wpath, sizeof wpath, "%sweights.", gpath);
        int64_t bits, gs;
        if ((rc = k3c_json_get_int(c, K3C_JSON_REQ, K3C_SPOT(w, wpath, "num_bits"), K3C_NOSPOT, &bits, NULL)) ||
            (rc = k3c_json_get_int(c, K3C_JSON_REQ, K3C_SPOT(w, wpath, "group_size"), K3C_NOSPOT, &gs, NULL)) ||
            (rc = expect_str(c, K3C_SPOT(w, wpath, "type"), "float")))
            return rc;
        if (bits != 4)
            return k3c_errf(c->err, K3C_EUNSUPPORTED, "%s: %snum_bits: %lld (MXFP4 has 4)", c->file, wpath,
                            (long long)bits);
        if (*group && gs != *group)
            return k3c_errf(c->err, K3C_ECONFIG, "%s: %sgroup_size: %lld disagrees with another group's %lld", c->file,
                            wpath, (long long)gs, (long long)*group);
        *group = gs;
    }
    *mxfp4 = 1;
    return 0;
}

/* quantization_config may sit at the top level and/or inside text_config (§3.3); when both exist they must agree. */
static int parse_quant_both(k3c_json_ctx *c, const k3c_json *root, const k3c_json *text, k3c_config *cfg) {
    const k3c_json *qa = NULL, *qb = NULL;
    int rc = k3c_json_get_obj(c, K3C_SPOT(root, "", "quantization_config"), &qa);
    if (!rc && text != root) rc = k3c_json_get_obj(c, K3C_SPOT(text, "text_config.", "quantization_config"), &qb);
    if (rc) return rc;
    int ma = 0, mb = 0;
    int64_t ga = 0, gb = 0;
    if (qa && (rc = parse_quant(c, qa, "quantization_config.", &ma, &ga))) return rc;
    if (qb && (rc = parse_quant(c, qb, "text_config.quantization_config.", &mb, &gb))) return rc;
    if (qa && qb && (ma != mb || ga != gb))
        return k3c_errf(c->err, K3C_ECONFIG,
                        "%s: quantization_config and text_config.quantization_config disagree "
                        "(group_size %lld vs %lld)",
                        c->file, (long long)ga, (long long)gb);
    cfg->experts_mxfp4 = qa ? ma : mb;
    cfg->mxfp4_group = qa ? ga : gb;
    return 0;
}

/* vision_config string/bool settings k3c implements one way only (§3.4); a different value is a different model. The
 * writer (config_write.c) writes the same tables. */
const k3c_cfg_fixed k3c_vision_fixed[K3C_VISION_FIXED] = {
    {"merge_type", "sd2_tpool"},
    {"mm_projector_type", "patchmergerv2"},
    {"mlp_type", "mlp2"},
    {"activation_func", "gelu_pytorch_tanh"},
    {"projector_hidden_act", "gelu"},
    {"norm_type", "rmsnorm"},
    {"pos_emb_type", "divided_fixed"},
};
/* pos_emb_interpolation_mode, indexed by K3C_VISION_BILINEAR / _BICUBIC (the release says bilinear; ports differ). */
const char *const k3c_vision_interp[2] = {"bilinear", "bicubic"};
const char *const k3c_vision_no_bias[K3C_VISION_NO_BIAS] = {"attn_bias", "linear_bias", "patch_embed_proj_bias"};

static int parse_vision(k3c_json_ctx *c, const k3c_json *v, k3c_vision_config *vc) {
    const char *p = "vision_config.";
#define V(k) K3C_SPOT(v, p, (k))
    int rc;
    if ((rc = k3c_json_get_int(c, K3C_JSON_REQ, V("patch_size"), K3C_NOSPOT, &vc->patch_size, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, V("vt_hidden_size"), K3C_NOSPOT, &vc->hidden, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, V("vt_intermediate_size"), K3C_NOSPOT, &vc->intermediate, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, V("vt_num_attention_heads"), K3C_NOSPOT, &vc->heads, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, V("vt_num_hidden_layers"), K3C_NOSPOT, &vc->layers, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, V("qkv_hidden_size"), K3C_NOSPOT, &vc->qkv_hidden, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, V("mm_hidden_size"), K3C_NOSPOT, &vc->mm_hidden, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, V("text_hidden_size"), K3C_NOSPOT, &vc->text_hidden, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, V("init_pos_emb_height"), K3C_NOSPOT, &vc->pos_emb_h, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, V("init_pos_emb_width"), K3C_NOSPOT, &vc->pos_emb_w, NULL)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_REQ, V("init_pos_emb_time"), K3C_NOSPOT, &vc->pos_emb_t, NULL)) ||
        (rc = k3c_json_get_num(c, K3C_JSON_REQ, V("projector_ln_eps"), K3C_NOSPOT, &vc->ln_eps, NULL)))
        return rc;
    for (size_t i = 0; i < K3C_VISION_FIXED; i++)
        if ((rc = expect_str(c, V(k3c_vision_fixed[i].key), k3c_vision_fixed[i].value))) return rc;
    for (size_t i = 0; i < K3C_VISION_NO_BIAS; i++)
        if ((rc = expect_bool(c, V(k3c_vision_no_bias[i]), 0))) return rc;
    const char *mode;
    if ((rc = k3c_json_get_str(c, K3C_JSON_REQ, V("pos_emb_interpolation_mode"), &mode))) return rc;
    if (strcmp(mode, k3c_vision_interp[0]) && strcmp(mode, k3c_vision_interp[1]))
        return k3c_errf(c->err, K3C_ECONFIG,
                        "%s: vision_config.pos_emb_interpolation_mode: \"%s\" (expected \"bilinear\" or \"bicubic\")",
                        c->file, mode);
    vc->interp = strcmp(mode, k3c_vision_interp[0]) ? K3C_VISION_BICUBIC : K3C_VISION_BILINEAR;
    const k3c_json *mk = k3c_json_get(v, "merge_kernel_size");
    if (!mk) return k3c_errf(c->err, K3C_ECONFIG, "%s: vision_config.merge_kernel_size: missing", c->file);
    if (mk->type != K3C_JSON_ARRAY || mk->n != 2 || mk->items[0].type != K3C_JSON_NUMBER || !mk->items[0].is_integer ||
        mk->items[1].type != K3C_JSON_NUMBER || !mk->items[1].is_integer)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: vision_config.merge_kernel_size: expected [height, width] integers",
                        c->file);
    vc->merge_kernel[0] = mk->items[0].integer;
    vc->merge_kernel[1] = mk->items[1].integer;
    vc->present = 1;
    return 0;
#undef V
}

/* ================================================================ top level */

/* Token ids and tie_word_embeddings: kimi_k3 keeps them in text_config and/or at the top level (they must agree). */
static int parse_ids(k3c_json_ctx *c, const k3c_json *root, const k3c_json *text, k3c_config *cfg) {
    k3c_json_spot top_b = K3C_SPOT(root, "", "bos_token_id"), top_e = K3C_SPOT(root, "", "eos_token_id"),
                  top_p = K3C_SPOT(root, "", "pad_token_id"), top_t = K3C_SPOT(root, "", "tie_word_embeddings");
    int k3 = text != root;
    const char *tp = k3 ? "text_config." : "";
    int rc, pb, pe, pp;
    if ((rc = k3c_json_get_int(c, K3C_JSON_OPT, K3C_SPOT(text, tp, "bos_token_id"), k3 ? top_b : K3C_NOSPOT,
                               &cfg->bos_token_id, &pb)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_OPT, K3C_SPOT(text, tp, "eos_token_id"), k3 ? top_e : K3C_NOSPOT,
                               &cfg->eos_token_id, &pe)) ||
        (rc = k3c_json_get_int(c, K3C_JSON_OPT, K3C_SPOT(text, tp, "pad_token_id"), k3 ? top_p : K3C_NOSPOT,
                               &cfg->pad_token_id, &pp)) ||
        (rc = k3c_json_get_bool(c, K3C_JSON_REQ, K3C_SPOT(text, tp, "tie_word_embeddings"), k3 ? top_t : K3C_NOSPOT,
                                &cfg->tie_word_embeddings, NULL)))
        return rc;
    if (!pb) cfg->bos_token_id = -1;
    if (!pe) cfg->eos_token_id = -1;
    if (!pp) cfg->pad_token_id = -1;
    return 0;
}

static int parse_root(k3c_json_ctx *c, const k3c_json *root, k3c_config *cfg) {
    if (root->type != K3C_JSON_OBJECT)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: expected a JSON object, got %s", c->file, k3c_json_type_name(root));
    const char *mt;
    int rc = k3c_json_get_str(c, K3C_JSON_REQ, K3C_SPOT(root, "", "model_type"), &mt);
    if (rc) return rc;
    const k3c_json *text = root, *vision = NULL;
    int has_pad = 0;
    if (strcmp(mt, K3C_CFG_KIMI_K3) == 0) {
        snprintf(cfg->tensor_prefix, sizeof cfg->tensor_prefix, "%s", K3C_CFG_K3_PREFIX);
        if ((rc = k3c_json_get_obj(c, K3C_SPOT(root, "", "text_config"), &text))) return rc;
        if (!text) return k3c_errf(c->err, K3C_ECONFIG, "%s: text_config: missing", c->file);
        if ((rc = expect_str(c, K3C_SPOT(text, "text_config.", "model_type"), K3C_CFG_KIMI_LINEAR)) ||
            (rc = k3c_json_get_obj(c, K3C_SPOT(root, "", "vision_config"), &vision)))
            return rc;
    } else if (strcmp(mt, K3C_CFG_KIMI_LINEAR) == 0) {
        if (k3c_json_get(root, "text_config") || k3c_json_get(root, "vision_config"))
            return k3c_errf(c->err, K3C_ECONFIG,
                            "%s: model_type \"kimi_linear\" is a flat text config; "
                            "text_config / vision_config belong to model_type \"kimi_k3\"",
                            c->file);
    } else {
        return k3c_errf(c->err, K3C_ECONFIG, "%s: model_type: unknown \"%s\" (expected \"kimi_linear\" or \"kimi_k3\")",
                        c->file, mt);
    }
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", mt);
    if ((rc = parse_text(c, text, text == root ? "" : "text_config.", cfg)) || (rc = parse_ids(c, root, text, cfg)) ||
        (rc = parse_quant_both(c, root, text, cfg)))
        return rc;
    if (vision && (rc = parse_vision(c, vision, &cfg->vision))) return rc;
    if (vision && (rc = k3c_json_get_int(c, K3C_JSON_OPT, K3C_SPOT(root, "", "media_placeholder_token_id"), K3C_NOSPOT,
                                         &cfg->vision.media_pad_id, &has_pad)))
        return rc;
    if (vision && !has_pad) cfg->vision.media_pad_id = -1;
    return k3c_config_validate(cfg, c->file, c->err);
}

int k3c_config_parse(const char *json, size_t n, const char *name_for_errors, k3c_config *cfg, k3c_err *err) {
    if (!json || !cfg) return k3c_errf(err, K3C_EINVAL, "k3c_config_parse: NULL argument");
    const char *name = name_for_errors ? name_for_errors : "config.json";
    memset(cfg, 0, sizeof *cfg);
    k3c_json *root = NULL;
    int rc = k3c_json_parse(json, n, name, &root, err);
    if (rc) return rc;
    k3c_json_ctx c = {name, err};
    rc = parse_root(&c, root, cfg);
    k3c_json_free(root);
    if (rc) memset(cfg, 0, sizeof *cfg);
    return rc;
}

int k3c_config_load(const char *path, k3c_config *cfg, k3c_err *err) {
    if (!path || !cfg) return k3c_errf(err, K3C_EINVAL, "k3c_config_load: NULL argument");
    struct stat st;
    size_t len = strlen(path);
    char *file = malloc(len + sizeof "/config.json");
    if (!file) return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path);
    /* A directory, or a path that names no file and no .json: read <path>/config.json (and say so if missing). */
    int slash = len && path[len - 1] == '/', exists = stat(path, &st) == 0;
    int json = len >= 5 && strcmp(path + len - 5, ".json") == 0;
    if (slash || (exists && S_ISDIR(st.st_mode)) || (!exists && !json))
        snprintf(file, len + sizeof "/config.json", "%s%sconfig.json", path, slash ? "" : "/");
    else
        memcpy(file, path, len + 1);
    char *text = NULL;
    size_t n = 0;
    int rc = k3c_read_file(file, &text, &n, err);
    if (!rc) rc = k3c_config_parse(text, n, file, cfg, err);
    free(text);
    free(file);
    return rc;
}
