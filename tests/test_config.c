/* test_config.c — the strict config.json reader (docs/FORMATS.md §2–4): the three golden configs, both spellings of
 * kimi_linear (released remote code / transformers 5.x), save→load round trips, and malformed configs. */
#include "test.h"

/* JSON in this file is written with ' for " so that it stays readable; js() turns it into real JSON (caller frees). */
static char *js(const char *s) {
    char *o = strdup(s);
    for (char *p = o; *p; p++)
        if (*p == '\'') *p = '"';
    return o;
}

/* base with the first occurrence of `from` replaced by `to` (both in ' notation); a missing `from` fails the test. */
static char *subst(const char *base, const char *from, const char *to) {
    const char *at = strstr(base, from);
    CHECK(at != NULL, "test bug: '%s' not in the base config", from);
    if (!at) return js(base);
    size_t nb = strlen(base), nf = strlen(from), nt = strlen(to);
    char *o = malloc(nb - nf + nt + 1);
    memcpy(o, base, (size_t)(at - base));
    memcpy(o + (at - base), to, nt);
    memcpy(o + (at - base) + nt, at + nf, nb - (size_t)(at - base) - nf + 1);
    char *r = js(o);
    free(o);
    return r;
}

static int parse_str(const char *json_q, k3c_config *cfg, k3c_err *err) {
    char *j = js(json_q);
    int rc = k3c_config_parse(j, strlen(j), "config.json", cfg, err);
    free(j);
    return rc;
}

/* Field-by-field equality (padding-independent); names the first differing field in why. */
static int cfg_equal(const k3c_config *a, const k3c_config *b, char *why, size_t n) {
#define EQ(f)                                                                                                          \
    if (a->f != b->f) {                                                                                                \
        snprintf(why, n, "%s: %.17g vs %.17g", #f, (double)a->f, (double)b->f);                                        \
        return 0;                                                                                                      \
    }
    if (strcmp(a->model_type, b->model_type) || strcmp(a->tensor_prefix, b->tensor_prefix)) {
        snprintf(why, n, "model_type/tensor_prefix");
        return 0;
    }
    EQ(vocab_size)
    EQ(hidden_size) EQ(num_layers) EQ(intermediate_size) EQ(max_positions) EQ(bos_token_id) EQ(eos_token_id)
        EQ(pad_token_id) EQ(rms_norm_eps) EQ(mla_norm_eps)
            EQ(tie_word_embeddings) for (int l = 0; l < K3C_MAX_LAYERS; l++){EQ(mixer[l]) EQ(ffn[l])} EQ(kda_heads)
                EQ(kda_head_dim) EQ(conv_kernel) EQ(kda_gate) EQ(gate_lower_bound) EQ(kda_full_rank_gate) EQ(mla_heads)
                    EQ(mla_kv_heads) EQ(q_lora_rank) EQ(kv_lora_rank) EQ(qk_nope_dim) EQ(qk_rope_dim) EQ(v_head_dim)
                        EQ(mla_output_gate) EQ(num_experts) EQ(top_k) EQ(num_shared_experts) EQ(moe_intermediate_size)
                            EQ(latent_dim) EQ(latent_norm) EQ(renormalize) EQ(routed_scaling_factor)
                                EQ(num_expert_group) EQ(topk_group) EQ(first_k_dense) EQ(moe_layer_freq) EQ(act)
                                    EQ(situ_beta) EQ(situ_linear_beta) EQ(attn_res_block) EQ(experts_mxfp4)
                                        EQ(mxfp4_group) EQ(vision.present) EQ(vision.patch_size) EQ(vision.hidden)
                                            EQ(vision.intermediate) EQ(vision.heads) EQ(vision.layers)
                                                EQ(vision.qkv_hidden) EQ(vision.mm_hidden) EQ(vision.text_hidden)
                                                    EQ(vision.merge_kernel[0]) EQ(vision.merge_kernel[1])
                                                        EQ(vision.pos_emb_h) EQ(vision.pos_emb_w) EQ(vision.pos_emb_t)
                                                            EQ(vision.ln_eps) EQ(vision.interp) EQ(vision.media_pad_id)
#undef EQ
                                                                return 1;
}

static void check_same(const k3c_config *a, const k3c_config *b, const char *what) {
    char why[256] = "";
    CHECK(cfg_equal(a, b, why, sizeof why), "%s: structs differ at %s", what, why);
}

/* ---------------------------------------------------------------- golden configs */

static void plan_is(const k3c_config *c, const char *mix, const char *ffn, const char *what) {
    int ok = (int)strlen(mix) == c->num_layers;
    for (int l = 0; ok && l < c->num_layers; l++)
        ok = c->mixer[l] == (mix[l] == 'M' ? K3C_MIXER_MLA : K3C_MIXER_KDA) &&
             c->ffn[l] == (ffn[l] == 'E' ? K3C_FFN_MOE : K3C_FFN_DENSE);
    CHECK(ok, "%s: layer plan differs from %s / %s", what, mix, ffn);
}

static void test_kimi_linear_tiny(k3c_config *c) {
    k3c_err err = {0};
    CHECK_OK(k3c_config_load(test_shared("golden/kimi_linear_tiny_a"), c, &err), &err);
    CHECK(strcmp(c->model_type, "kimi_linear") == 0 && c->tensor_prefix[0] == 0, "type %s prefix '%s'", c->model_type,
          c->tensor_prefix);
    CHECK(c->hidden_size == 64 && c->num_layers == 4 && c->vocab_size == 512, "hidden/layers/vocab");
    plan_is(c, "KKKM", "DEEE", "kimi_linear_tiny_a");
    CHECK(c->kda_heads == 4 && c->kda_head_dim == 16 && c->conv_kernel == 4, "KDA 4x16 conv 4");
    CHECK(c->kda_gate == K3C_GATE_SOFTPLUS && c->gate_lower_bound == 0 && c->kda_full_rank_gate == 0,
          "softplus, low-rank");
    CHECK(c->mla_heads == 4 && c->mla_kv_heads == 4 && c->q_lora_rank == 0 && c->kv_lora_rank == 32, "MLA heads/ranks");
    CHECK(c->qk_nope_dim == 16 && c->qk_rope_dim == 8 && c->v_head_dim == 16 && c->mla_output_gate == 0, "MLA dims");
    CHECK(c->num_experts == 8 && c->top_k == 2 && c->num_shared_experts == 1 && c->moe_intermediate_size == 32, "MoE");
    CHECK(c->intermediate_size == 128 && c->routed_scaling_factor == 2.446 && c->renormalize == 1, "inter/rsf/renorm");
    CHECK(c->num_expert_group == 1 && c->topk_group == 1 && c->first_k_dense == 1 && c->moe_layer_freq == 1, "groups");
    CHECK(c->latent_dim == 0 && c->latent_norm == 0 && c->attn_res_block == 0 && c->experts_mxfp4 == 0, "no K3 extras");
    CHECK(c->rms_norm_eps == 1e-5 && c->mla_norm_eps == 1e-6, "eps %g / mla %g", c->rms_norm_eps, c->mla_norm_eps);
    CHECK(c->act == K3C_ACT_SILU && c->max_positions == 4096 && c->tie_word_embeddings == 0, "act/positions/tie");
    CHECK(c->bos_token_id == 1 && c->eos_token_id == 2 && c->pad_token_id == 0, "ids");
    CHECK(k3c_config_num_mla(c) == 1 && k3c_config_num_moe(c) == 3, "counts");
    CHECK(!c->vision.present, "no vision");
}

static void test_k3_tiny(k3c_config *c) {
    k3c_err err = {0};
    CHECK_OK(k3c_config_load(test_shared("golden/k3_tiny_a/config.json"), c, &err), &err);
    CHECK(strcmp(c->model_type, "kimi_k3") == 0 && strcmp(c->tensor_prefix, "language_model.") == 0, "type/prefix");
    CHECK(c->num_layers == 13 && c->hidden_size == 128 && c->vocab_size == 2048, "layers/hidden/vocab");
    plan_is(c, "KKKMKKKMKKKMM", "DEEEEEEEEEEEE", "k3_tiny_a");
    CHECK(c->kda_gate == K3C_GATE_LOWER_BOUND && c->gate_lower_bound == -5.0, "lower bound %g", c->gate_lower_bound);
    CHECK(c->kda_full_rank_gate == 1 && c->mla_output_gate == 1, "full-rank KDA gate and MLA gate");
    CHECK(c->kda_heads == 6 && c->kda_head_dim == 32 && c->conv_kernel == 4, "KDA 6x32");
    CHECK(c->mla_heads == 6 && c->q_lora_rank == 64 && c->kv_lora_rank == 32, "MLA ranks");
    CHECK(c->qk_nope_dim == 32 && c->qk_rope_dim == 16 && c->v_head_dim == 32, "MLA dims");
    CHECK(c->num_experts == 16 && c->top_k == 4 && c->num_shared_experts == 2 && c->moe_intermediate_size == 64, "MoE");
    CHECK(c->latent_dim == 64 && c->latent_norm == 1 && c->intermediate_size == 512, "latent");
    CHECK(c->act == K3C_ACT_SITU && c->situ_beta == 4.0 && c->situ_linear_beta == 25.0, "situ %g %g", c->situ_beta,
          c->situ_linear_beta);
    CHECK(c->attn_res_block == 5 && c->experts_mxfp4 == 1 && c->mxfp4_group == 32, "attnres / mxfp4");
    CHECK(c->routed_scaling_factor == 1.0 && c->rms_norm_eps == 1e-5 && c->mla_norm_eps == 1e-5, "rsf / eps");
    CHECK(c->bos_token_id == 1 && c->eos_token_id == 2 && c->pad_token_id == 0 && c->max_positions == 4096, "ids");
    CHECK(!c->vision.present, "no vision in k3_tiny_a");
}

static void test_k3_release(k3c_config *c) {
    k3c_err err = {0};
    CHECK_OK(k3c_config_load(test_shared("golden/kimi_k3_config.json"), c, &err), &err);
    CHECK(c->num_layers == 93 && k3c_config_num_mla(c) == 24 && k3c_config_num_moe(c) == 92,
          "93 layers, 24 MLA, 92 MoE");
    CHECK(c->mixer[91] == K3C_MIXER_MLA && c->mixer[92] == K3C_MIXER_MLA && c->mixer[90] == K3C_MIXER_KDA &&
              c->mixer[3] == K3C_MIXER_MLA && c->mixer[0] == K3C_MIXER_KDA,
          "91 and 92 both MLA");
    CHECK(c->num_experts == 896 && c->top_k == 16 && c->num_shared_experts == 2 && c->latent_dim == 3584, "MoE");
    CHECK(c->hidden_size == 7168 && c->intermediate_size == 33792 && c->moe_intermediate_size == 3072, "widths");
    CHECK(c->mla_heads == 96 && c->q_lora_rank == 1536 && c->kv_lora_rank == 512 && c->attn_res_block == 12, "MLA");
    CHECK(c->experts_mxfp4 && c->mxfp4_group == 32, "mxfp4 from text_config.quantization_config");
    CHECK(c->bos_token_id == 163584 && c->eos_token_id == 163586 && c->pad_token_id == 163839, "ids");
    CHECK(c->max_positions == 1048576, "positions");
    const k3c_vision_config *v = &c->vision;
    CHECK(v->present && v->patch_size == 14 && v->hidden == 1024 && v->intermediate == 4096 && v->heads == 12 &&
              v->layers == 27,
          "vision tower");
    CHECK(v->qkv_hidden == 1536 && v->mm_hidden == 1024 && v->text_hidden == 7168 && v->merge_kernel[0] == 2 &&
              v->merge_kernel[1] == 2,
          "vision projector");
    CHECK(v->pos_emb_h == 64 && v->pos_emb_w == 64 && v->pos_emb_t == 4 && v->ln_eps == 1e-5, "vision pos emb");
    CHECK(v->interp == K3C_VISION_BILINEAR && v->media_pad_id == 163605, "interpolation mode, <|media_pad|> id");
}

/* ---------------------------------------------------------------- the other spelling of each golden */

/* kimi_linear_tiny_a (transformers-5.x file) written in the released remote-code spelling. */
static const char *KL_RELEASED =
    "{'architectures': ['KimiLinearForCausalLM'], 'model_type': 'kimi_linear', 'vocab_size': 512, 'hidden_size': 64,"
    " 'num_hidden_layers': 4, 'intermediate_size': 128, 'hidden_act': 'silu', 'rms_norm_eps': 1e-05,"
    " 'model_max_length': 4096, 'bos_token_id': 1, 'eos_token_id': 2, 'pad_token_id': 0, 'tie_word_embeddings': false,"
    " 'num_attention_heads': 4, 'num_key_value_heads': 4, 'q_lora_rank': null, 'kv_lora_rank': 32,"
    " 'qk_nope_head_dim': 16, 'qk_rope_head_dim': 8, 'v_head_dim': 16, 'mla_use_nope': true, 'head_dim': 72,"
    " 'rope_theta': 10000.0, 'rope_scaling': null,"
    " 'num_experts': 8, 'num_experts_per_token': 2, 'num_shared_experts': 1, 'moe_intermediate_size': 32,"
    " 'moe_router_activation_func': 'sigmoid', 'moe_renormalize': true, 'routed_scaling_factor': 2.446,"
    " 'use_grouped_topk': true, 'num_expert_group': 1, 'topk_group': 1, 'first_k_dense_replace': 1,"
    " 'moe_layer_freq': 1, 'num_nextn_predict_layers': 0,"
    " 'linear_attn_config': {'num_heads': 4, 'head_dim': 16, 'short_conv_kernel_size': 4, 'kda_layers': [1, 2, 3],"
    " 'full_attn_layers': [4]}}";

/* k3_tiny_a written the transformers way: layer_types, renamed MoE keys, quantization_config inside text_config. */
static const char *K3_TRANSFORMERS =
    "{'model_type': 'kimi_k3', 'bos_token_id': 1, 'eos_token_id': 2, 'pad_token_id': 0, 'tie_word_embeddings': false,"
    " 'text_config': {'model_type': 'kimi_linear', 'hidden_size': 128, 'num_hidden_layers': 13, 'vocab_size': 2048,"
    " 'rms_norm_eps': 1e-05, 'hidden_act': 'situ', 'activation_situ_beta': 4.0, 'activation_situ_linear_beta': 25.0,"
    " 'num_attention_heads': 6, 'num_key_value_heads': 6, 'q_lora_rank': 64, 'kv_lora_rank': 32,"
    " 'qk_nope_head_dim': 32, 'qk_rope_head_dim': 16, 'v_head_dim': 32, 'mla_use_output_gate': true,"
    " 'n_routed_experts': 16, 'num_experts_per_tok': 4, 'num_shared_experts': 2, 'routed_expert_hidden_size': 64,"
    " 'moe_intermediate_size': 64, 'latent_moe_use_norm': true, 'norm_topk_prob': true, 'routed_scaling_factor': 1.0,"
    " 'n_group': 1, 'topk_group': 1, 'first_k_dense_replace': 1, 'intermediate_size': 512, 'attn_res_block_size': 5,"
    " 'max_position_embeddings': 4096, 'linear_num_heads': 6, 'linear_head_dim': 32, 'linear_conv_kernel_dim': 4,"
    " 'linear_attn_config': {'gate_lower_bound': -5.0, 'use_full_rank_gate': true},"
    " 'layer_types': ['linear_attention', 'linear_attention', 'linear_attention', 'full_attention',"
    "   'linear_attention', 'linear_attention', 'linear_attention', 'full_attention',"
    "   'linear_attention', 'linear_attention', 'linear_attention', 'full_attention', 'full_attention'],"
    " 'mlp_layer_types': ['dense', 'sparse', 'sparse', 'sparse', 'sparse', 'sparse', 'sparse', 'sparse', 'sparse',"
    "   'sparse', 'sparse', 'sparse', 'sparse'],"
    " 'quantization_config': {'quant_method': 'compressed-tensors', 'format': 'mxfp4-pack-quantized',"
    "   'config_groups': {'group_0': {'format': 'mxfp4-pack-quantized', 'targets': ['Linear'],"
    "   'weights': {'num_bits': 4, 'type': 'float', 'group_size': 32}}}}}}";

static void test_spellings(const k3c_config *kl, const k3c_config *k3) {
    k3c_config c;
    k3c_err err = {0};
    CHECK_OK(parse_str(KL_RELEASED, &c, &err), &err);
    check_same(&c, kl, "kimi_linear released spelling vs transformers golden");
    CHECK_OK(parse_str(K3_TRANSFORMERS, &c, &err), &err);
    check_same(&c, k3, "kimi_k3 transformers spelling vs released golden");
    /* Both spellings at once, agreeing, are accepted. */
    char *both = subst(KL_RELEASED, "'num_experts': 8,",
                       "'num_experts': 8, 'n_routed_experts': 8, 'num_experts_per_tok': 2, 'norm_topk_prob': true,"
                       " 'max_position_embeddings': 4096, 'linear_num_heads': 4, 'linear_head_dim': 16,"
                       " 'linear_conv_kernel_dim': 4, 'n_group': 1,"
                       " 'layer_types': ['linear_attention', 'linear_attention', 'linear_attention', 'full_attention'],"
                       " 'mlp_layer_types': ['dense', 'sparse', 'sparse', 'sparse'],");
    CHECK_OK(k3c_config_parse(both, strlen(both), "config.json", &c, &err), &err);
    check_same(&c, kl, "both spellings");
    free(both);
}

/* ---------------------------------------------------------------- save / load */

static void round_trip(const k3c_config *c, const char *dir, const char *name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    k3c_err err = {0};
    k3c_config back;
    CHECK_OK(k3c_config_save(c, path, &err), &err);
    CHECK_OK(k3c_config_load(path, &back, &err), &err);
    check_same(&back, c, name);
}

static void test_round_trips(const k3c_config *kl, const k3c_config *k3t, const k3c_config *k3) {
    const char *dir = test_tmpdir("config");
    round_trip(kl, dir, "kimi_linear_tiny_a");
    round_trip(k3t, dir, "k3_tiny_a");
    round_trip(k3, dir, "kimi_k3");
    /* Non-default values that the released files never show: no ids, another MLA eps, a dense-only model. */
    k3c_config v = *kl;
    v.bos_token_id = v.eos_token_id = v.pad_token_id = -1;
    v.mla_norm_eps = 1e-5;
    v.moe_layer_freq = 2;
    for (int l = 0; l < v.num_layers; l++) v.ffn[l] = (l >= 1 && l % 2 == 0) ? K3C_FFN_MOE : K3C_FFN_DENSE;
    round_trip(&v, dir, "variant");
    k3c_config d = *kl;
    d.num_experts = d.top_k = d.num_shared_experts = d.moe_intermediate_size = 0;
    d.renormalize = 0;
    d.routed_scaling_factor = 0;
    d.num_expert_group = d.topk_group = d.first_k_dense = d.moe_layer_freq = 0;
    for (int l = 0; l < d.num_layers; l++) d.ffn[l] = K3C_FFN_DENSE;
    round_trip(&d, dir, "dense");
    /* A config directory is accepted as well as a file; the saved file is what load reads. */
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    k3c_err err = {0};
    k3c_config back;
    CHECK_OK(k3c_config_save(k3, path, &err), &err);
    CHECK_OK(k3c_config_load(dir, &back, &err), &err);
    check_same(&back, k3, "load(dir)");
    /* save refuses an invalid struct instead of writing a file load would reject. */
    k3c_config bad = *kl;
    bad.top_k = 99;
    CHECK(k3c_config_save(&bad, path, &err) == K3C_ECONFIG && strstr(err.msg, "num_experts_per_token"), "save: %s",
          err.msg);
}

/* The experiment arms a config can express (docs/TRAINING.md §1.6): activation, KDA gate, hybrid layout, AttnRes.
 * Each variant of the tiny K3 config must save and load back to an equal struct. */
static void test_arm_round_trips(const k3c_config *k3t) {
    const char *dir = test_tmpdir("config_arms");
    char name[64];
    static const int acts[3] = {K3C_ACT_SITU, K3C_ACT_SILU, K3C_ACT_GELU};
    for (int i = 0; i < 3; i++) {
        k3c_config a = *k3t;
        a.act = acts[i];
        if (a.act != K3C_ACT_SITU) a.situ_beta = a.situ_linear_beta = 0;
        snprintf(name, sizeof name, "act%d", a.act);
        round_trip(&a, dir, name);
    }
    static const double bounds[4] = {0, -5, -2.5, -0.5}; /* 0: Kimi Linear's unbounded softplus gate */
    for (int i = 0; i < 4; i++) {
        k3c_config g = *k3t;
        g.kda_gate = bounds[i] ? K3C_GATE_LOWER_BOUND : K3C_GATE_SOFTPLUS;
        g.gate_lower_bound = bounds[i];
        snprintf(name, sizeof name, "gate%d", i);
        round_trip(&g, dir, name);
    }
    /* layouts: all KDA, all MLA, alternating 1:1, MLA first then KDA, 3:1 with MLA at every 4th (any placement) */
    static const char *const plans[5] = {"all_kda", "all_mla", "alternate", "mla_first", "ratio_3_1"};
    for (int i = 0; i < 5; i++) {
        k3c_config h = *k3t;
        char mix[K3C_MAX_LAYERS + 1], ffn[K3C_MAX_LAYERS + 1];
        for (int l = 0; l < h.num_layers; l++) {
            const int mla = i == 1 || (i == 2 && l % 2) || (i == 3 && l == 0) || (i == 4 && l % 4 == 3);
            h.mixer[l] = mla ? K3C_MIXER_MLA : K3C_MIXER_KDA;
            mix[l] = mla ? 'M' : 'K';
            ffn[l] = h.ffn[l] == K3C_FFN_MOE ? 'E' : 'D';
        }
        mix[h.num_layers] = ffn[h.num_layers] = 0;
        round_trip(&h, dir, plans[i]);
        k3c_err err = {0};
        k3c_config back;
        char path[4200];
        snprintf(path, sizeof path, "%s/%s.json", dir, plans[i]);
        CHECK_OK(k3c_config_load(path, &back, &err), &err);
        plan_is(&back, mix, ffn, plans[i]);
        CHECK(k3c_config_num_mla(&back) == (i == 0   ? 0
                                            : i == 1 ? h.num_layers
                                                     : k3c_config_num_mla(&h)),
              "%s: %d MLA layers", plans[i], k3c_config_num_mla(&back));
    }
    for (int64_t blk = 0; blk <= 4; blk += 1) {
        k3c_config r = *k3t;
        r.attn_res_block = blk; /* 0: plain residuals */
        snprintf(name, sizeof name, "attnres%lld", (long long)blk);
        round_trip(&r, dir, name);
    }
}

/* ---------------------------------------------------------------- malformed configs */

/* Parses base with one substitution and expects failure `code` with every one of needles in the message. */
static void expect_fail(const char *what, const char *base, const char *from, const char *to, int code,
                        const char *needle1, const char *needle2) {
    char *j = subst(base, from, to);
    k3c_config c;
    k3c_err err = {0};
    int rc = k3c_config_parse(j, strlen(j), "config.json", &c, &err);
    CHECK(rc == code, "%s: rc %d (want %d): %s", what, rc, code, err.msg);
    CHECK(strstr(err.msg, needle1) != NULL, "%s: message lacks '%s': %s", what, needle1, err.msg);
    if (needle2) CHECK(strstr(err.msg, needle2) != NULL, "%s: message lacks '%s': %s", what, needle2, err.msg);
    if (getenv("K3C_TEST_VERBOSE")) printf("  %-28s %s\n", what, err.msg);
    free(j);
}

static void test_malformed(void) {
    const char *B = KL_RELEASED, *K = K3_TRANSFORMERS;
    const int E = K3C_ECONFIG;
    expect_fail("bad JSON", B, "'model_max_length': 4096,", "'model_max_length': 4096,,", K3C_EFORMAT,
                "config.json:1:", NULL);
    expect_fail("missing field", B, "'hidden_size': 64,", "", E, "config.json: hidden_size: missing", NULL);
    expect_fail("missing in text_config", K, "'num_attention_heads': 6,", "", E,
                "config.json: text_config.num_attention_heads: missing", NULL);
    expect_fail("unknown model_type", B, "'model_type': 'kimi_linear'", "'model_type': 'deepseek_v3'", E, "model_type",
                "deepseek_v3");
    expect_fail("layer in both lists", B, "'kda_layers': [1, 2, 3]", "'kda_layers': [1, 2, 3, 4]", E,
                "full_attn_layers", "listed twice");
    expect_fail("layer in neither list", B, "'kda_layers': [1, 2, 3]", "'kda_layers': [1, 3]", E, "layer 2", "neither");
    expect_fail("zero-based list", B, "'full_attn_layers': [4]", "'full_attn_layers': [0]", E, "full_attn_layers[0]",
                "one-based");
    expect_fail("string for number", B, "'hidden_size': 64,", "'hidden_size': '64',", E, "hidden_size",
                "expected an integer, got a string");
    expect_fail("float for integer", B, "'num_hidden_layers': 4,", "'num_hidden_layers': 4.0,", E, "num_hidden_layers",
                "expected an integer");
    expect_fail("bool type", B, "'moe_renormalize': true", "'moe_renormalize': 1", E, "moe_renormalize",
                "true or false");
    expect_fail("layer_types length", K, "'full_attention', 'full_attention'],", "'full_attention'],", E,
                "text_config.layer_types", "12 entries");
    expect_fail("layer_types vs lists", B, "'num_experts': 8,",
                "'num_experts': 8, 'layer_types': ['linear_attention', 'full_attention', 'linear_attention',"
                " 'full_attention'],",
                E, "layer_types[1]", "full_attn_layers");
    expect_fail("mlp_layer_types", K, "'mlp_layer_types': ['dense', 'sparse'", "'mlp_layer_types': ['dense', 'dense'",
                E, "text_config.mlp_layer_types[1]", NULL);
    expect_fail("top_k > num_experts", B, "'num_experts_per_token': 2", "'num_experts_per_token': 9", E,
                "num_experts_per_token", "1..num_experts");
    expect_fail("unknown hidden_act", B, "'hidden_act': 'silu'", "'hidden_act': 'relu'", E, "hidden_act", "relu");
    expect_fail("gate bound below -5", K, "'gate_lower_bound': -5.0", "'gate_lower_bound': -6.0", E,
                "text_config.linear_attn_config.gate_lower_bound", "[-5, 0)");
    expect_fail("gate bound not negative", K, "'gate_lower_bound': -5.0", "'gate_lower_bound': 0.0", E,
                "gate_lower_bound", "[-5, 0)");
    expect_fail("duplicate spellings disagree", B, "'num_experts': 8,", "'num_experts': 8, 'n_routed_experts': 4,", E,
                "num_experts", "disagree");
    expect_fail("duplicate spellings disagree (KDA)", B, "'num_experts': 8,",
                "'num_experts': 8, 'linear_num_heads': 8,", E, "linear_num_heads", "disagree");
    expect_fail("too many layers", B, "'num_hidden_layers': 4,", "'num_hidden_layers': 600,", E, "num_hidden_layers",
                "512");
    expect_fail("kv_lora_rank 0", B, "'kv_lora_rank': 32", "'kv_lora_rank': 0", E, "kv_lora_rank", "positive");
    expect_fail("situ without beta", K, "'activation_situ_beta': 4.0,", "", E, "text_config.activation_situ_beta",
                "missing");
    expect_fail("quant group", K, "'group_size': 32", "'group_size': 16", E, "group_size", "32");
    expect_fail("quant format", K, "'format': 'mxfp4-pack-quantized',", "'format': 'int4-pack-quantized',",
                K3C_EUNSUPPORTED, "quantization_config", "int4-pack-quantized");
    expect_fail("router softmax", B, "'moe_router_activation_func': 'sigmoid'",
                "'moe_router_activation_func': 'softmax'", K3C_EUNSUPPORTED, "moe_router_activation_func", NULL);
    expect_fail("RoPE MLA", B, "'mla_use_nope': true", "'mla_use_nope': false", K3C_EUNSUPPORTED, "mla_use_nope", NULL);
    expect_fail("text_config missing", K, "'text_config'", "'text_confg'", E, "text_config: missing", NULL);
    expect_fail("ids disagree", K, "'text_config': {", "'text_config': {'eos_token_id': 3, ", E, "eos_token_id",
                "disagree");
    expect_fail("null required", B, "'vocab_size': 512", "'vocab_size': null", E, "vocab_size: null", NULL);
    expect_fail("pad id beyond vocab", B, "'pad_token_id': 0", "'pad_token_id': 512", E, "pad_token_id", "vocab_size");
    expect_fail("not an object", B, "'linear_attn_config': {", "'linear_attn_config': 3, 'x': {", E,
                "linear_attn_config", "expected an object");

    k3c_config c;
    k3c_err err = {0};
    int rc = k3c_config_load("build/cfg-no-such-dir/", &c, &err);
    CHECK(rc == K3C_EIO && strstr(err.msg, "cfg-no-such-dir/config.json"), "missing file: rc %d %s", rc, err.msg);
}

int main(void) {
    k3c_config kl, k3t, k3;
    test_kimi_linear_tiny(&kl);
    test_k3_tiny(&k3t);
    test_k3_release(&k3);
    test_spellings(&kl, &k3t);
    test_round_trips(&kl, &k3t, &k3);
    test_arm_round_trips(&k3t);
    test_malformed();
    return test_summary();
}
