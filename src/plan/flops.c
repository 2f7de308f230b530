/* flops.c — FLOPs per token by component: projections (2 per weight), MLA scores/values (quadratic in context),
 * KDA chunked recurrence (Kimi Linear paper Eq. 13; docs/MODEL.md §3.2), AttnRes mixes (§5.4), MoE (§9), MFU. */
#include "plan/plan.h"

#include <string.h>

double k3c_plan_kda_head_flops(int64_t d, int64_t chunk) {
    double dh = (double)d, c = (double)chunk;
    return 6 * dh * dh + 3 * c * dh + c * c;
}

/* Completed AttnRes sources before layer l: one per block start l' < l (the first one is the embedding). */
int64_t k3c_plan_attnres_sources(const k3c_config *cfg, int64_t l) {
    int64_t S = cfg->attn_res_block;
    return S > 0 ? (l + S - 1) / S : 0;
}

/* Sources read by the two mixes of layer l (docs/MODEL.md §5.3): layer 0's attention input is the embedding
 * itself (no mix); otherwise R ∪ {P}, and the MLP mix sees R after the block-start append. */
void k3c_plan_attnres_mix_sources(const k3c_config *cfg, int64_t l, int64_t *attn, int64_t *mlp) {
    *attn = *mlp = 0;
    if (cfg->attn_res_block <= 0) return;
    int64_t r = k3c_plan_attnres_sources(cfg, l);
    *attn = r > 0 ? r + 1 : 0;
    *mlp = r + (l % cfg->attn_res_block == 0) + 1;
}

static int64_t attnres_mix_sources(const k3c_config *cfg, int64_t l) {
    int64_t a, m;
    k3c_plan_attnres_mix_sources(cfg, l, &a, &m);
    return a + m;
}

/* Per-token cost of one depth mix over n sources: ≈ 3·n·d forward (docs/MODEL.md §5.4). */
static double attnres_flops(const k3c_config *cfg, int64_t sources) {
    return 3.0 * (double)sources * (double)cfg->hidden_size;
}

/* Forward FLOPs of layer l per component; keys = keys each query attends to on average (MLA). kda_step: use the
 * single-token recurrent step instead of the chunked form; mla_absorbed: decode-time absorbed MLA. */
static void layer_flops(const k3c_config *cfg, int l, double keys, int decode, double out[K3C_PC_COUNT],
                        double *mla_core, double *kda_core) {
    k3c_plan_count c;
    k3c_plan_layer_count(cfg, l, &c);
    for (int i = 0; i < K3C_PC_COUNT; i++) out[i] = 2.0 * (double)c.matrix[i];
    out[K3C_PC_ROUTED] = cfg->num_experts > 0 ? out[K3C_PC_ROUTED] / (double)cfg->num_experts * (double)cfg->top_k : 0;
    out[K3C_PC_ATTNRES] = attnres_flops(cfg, attnres_mix_sources(cfg, l));
    double core = 0;
    if (cfg->mixer[l] == K3C_MIXER_KDA) {
        double H = (double)cfg->kda_heads, dk = (double)cfg->kda_head_dim;
        out[K3C_PC_KDA] += 2.0 * (double)cfg->conv_kernel * 3 * H * dk; /* depthwise short conv on q, k, v */
        /* one recurrent step: decay, r = Pᵀk, rank-1 write, read-out: 7·d_k·d_v per head */
        core = decode ? H * 7 * dk * dk : H * k3c_plan_kda_head_flops(cfg->kda_head_dim, K3C_PLAN_KDA_CHUNK);
        out[K3C_PC_KDA] += core;
        if (kda_core) *kda_core += core;
    } else {
        double H = (double)cfg->mla_heads, kvl = (double)cfg->kv_lora_rank, rope = (double)cfg->qk_rope_dim;
        double qd = (double)(cfg->qk_nope_dim + cfg->qk_rope_dim), vd = (double)cfg->v_head_dim;
        /* training: q·k over 192 dims and p·v over 128 per head; absorbed decode: scores over the 576-value latent
         * and values over its 512-value part, one shared cache "head" read by all H query heads (§4.1) */
        core = decode ? 2 * H * (2 * kvl + rope) * keys : 2 * H * (qd + vd) * keys;
        out[K3C_PC_MLA] += core;
        if (mla_core) *mla_core += core;
    }
}

double k3c_plan_layer_fwd_flops(const k3c_config *cfg, int l, double keys) {
    double f[K3C_PC_COUNT], s = 0;
    layer_flops(cfg, l, keys, 0, f, NULL, NULL);
    for (int i = 0; i < K3C_PC_COUNT; i++) s += f[i];
    return s;
}

/* lm_head and the output AttnRes mix (the embedding is a lookup: 0 FLOPs). */
static void head_flops(const k3c_config *cfg, double out[K3C_PC_COUNT]) {
    out[K3C_PC_LM_HEAD] += 2.0 * (double)cfg->vocab_size * (double)cfg->hidden_size;
    if (cfg->attn_res_block > 0)
        out[K3C_PC_ATTNRES] += attnres_flops(cfg, k3c_plan_attnres_sources(cfg, cfg->num_layers) + 1);
}

int k3c_plan_flops_train(const k3c_config *cfg, int64_t seq, k3c_plan_flops *o, k3c_err *err) {
    memset(o, 0, sizeof *o);
    int rc = k3c_plan_check_config(cfg, err);
    if (rc) return rc;
    if (seq < 1) return k3c_errf(err, K3C_EINVAL, "plan: sequence length must be positive (got %lld)", (long long)seq);
    double keys = ((double)seq + 1) / 2; /* causal: query t attends t + 1 keys */
    for (int l = 0; l < cfg->num_layers; l++) {
        double f[K3C_PC_COUNT];
        layer_flops(cfg, l, keys, 0, f, &o->mla_core, &o->kda_core);
        for (int i = 0; i < K3C_PC_COUNT; i++) o->fwd[i] += f[i];
    }
    head_flops(cfg, o->fwd);
    for (int i = 0; i < K3C_PC_COUNT; i++) o->fwd_total += o->fwd[i];
    o->model_total = 3 * o->fwd_total;
    return K3C_OK;
}

double k3c_plan_layer_decode_flops(const k3c_config *cfg, int l, int64_t ctx) {
    double f[K3C_PC_COUNT], s = 0;
    layer_flops(cfg, l, (double)ctx, 1, f, NULL, NULL);
    for (int i = 0; i < K3C_PC_COUNT; i++) s += f[i];
    return s;
}

double k3c_plan_flops_decode(const k3c_config *cfg, int64_t ctx) {
    double total = k3c_plan_head_fwd_flops(cfg);
    for (int l = 0; l < cfg->num_layers; l++) total += k3c_plan_layer_decode_flops(cfg, l, ctx);
    return total;
}

double k3c_plan_head_fwd_flops(const k3c_config *cfg) {
    double f[K3C_PC_COUNT] = {0}, s = 0;
    head_flops(cfg, f);
    for (int i = 0; i < K3C_PC_COUNT; i++) s += f[i];
    return s;
}

double k3c_plan_mfu(double model_flops_per_token, double tokens, double step_s, int64_t gpus, double peak_flops) {
    if (step_s <= 0 || gpus <= 0 || peak_flops <= 0) return 0;
    return model_flops_per_token * tokens / (step_s * (double)gpus * peak_flops);
}
