/* layout.c — TP×CP×PP×EP×DP layouts: defaults, the pipeline split of decoder layers, validity checks with clear
 * reasons (heads, experts, layers, sequence, batch), micro-batch count and the 1F1B bubble (docs/PLAN.md). */
#include "plan/plan.h"

#include "model/params.h"

#include <string.h>

static const char *const rc_names[] = {"none", "selective", "full"};
static const char *const opt_names[] = {"adamw", "muon"};

const char *k3c_plan_recompute_name(int rc) { return rc >= 0 && rc <= 2 ? rc_names[rc] : "?"; }
const char *k3c_plan_optimizer_name(int opt) { return opt >= 0 && opt <= 1 ? opt_names[opt] : "?"; }

void k3c_plan_hw_default(k3c_plan_hw *hw) {
    hw->gpu_mem_gb = 141; /* H200 */
    hw->nvlink_gbs = 900;
    hw->ib_gbps = 400;
    hw->peak_tflops = 989; /* dense BF16 (docs/PLAN.md §5) */
    hw->compute_eff = 0.5;
    hw->hbm_gbs = 4800;
    hw->gpus_per_node = 8;
}

void k3c_plan_layout_default(k3c_plan_layout *lay) {
    memset(lay, 0, sizeof *lay);
    lay->tp = lay->cp = lay->pp = lay->ep = lay->dp = 1;
    lay->zero = 1;
    lay->recompute = K3C_RC_SELECTIVE;
    lay->micro_batch = 1;
    lay->seq = 4096;
    lay->global_batch_tokens = (int64_t)1 << 26; /* ≈ DeepSeek-V3's 63M tokens per step; K3's is not public */
    lay->optimizer = K3C_OPT_ADAMW;
    lay->grad_bytes = 4;
}

int64_t k3c_plan_gpus(const k3c_plan_layout *lay) { return lay->tp * lay->cp * lay->pp * lay->ep * lay->dp; }

void k3c_plan_stage_layers(int64_t layers, int64_t pp, int64_t s, int64_t *first, int64_t *count) {
    k3c_stage_layers(layers, pp, s, first, count);
}

int64_t k3c_plan_micro_batches(const k3c_plan_layout *lay) {
    int64_t per = lay->micro_batch * lay->seq * lay->ep * lay->dp;
    if (per <= 0 || lay->global_batch_tokens <= 0 || lay->global_batch_tokens % per) return 0;
    return lay->global_batch_tokens / per;
}

double k3c_plan_bubble(int64_t pp, int64_t m) { return m > 0 ? (double)(pp - 1) / (double)(m + pp - 1) : 1.0; }

static int has_kind(const k3c_config *cfg, int mixer, int ffn) {
    for (int64_t l = 0; l < cfg->num_layers; l++)
        if ((mixer >= 0 && cfg->mixer[l] == mixer) || (ffn >= 0 && cfg->ffn[l] == ffn)) return 1;
    return 0;
}

/* TP splits attention heads, the dense / shared MLP widths and the latent projections. */
static int check_tp(const k3c_config *cfg, int64_t tp, k3c_err *err) {
    if (has_kind(cfg, K3C_MIXER_KDA, -1) && cfg->kda_heads % tp)
        return k3c_errf(err, K3C_EINVAL, "layout: TP = %lld does not divide the %lld KDA heads", (long long)tp,
                        (long long)cfg->kda_heads);
    if (has_kind(cfg, K3C_MIXER_MLA, -1) && cfg->mla_heads % tp)
        return k3c_errf(err, K3C_EINVAL, "layout: TP = %lld does not divide the %lld MLA heads", (long long)tp,
                        (long long)cfg->mla_heads);
    if (has_kind(cfg, -1, K3C_FFN_DENSE) && cfg->intermediate_size % tp)
        return k3c_errf(err, K3C_EINVAL, "layout: TP = %lld does not divide the dense intermediate size %lld",
                        (long long)tp, (long long)cfg->intermediate_size);
    if (has_kind(cfg, -1, K3C_FFN_MOE)) {
        int64_t ms = cfg->moe_intermediate_size * cfg->num_shared_experts;
        if (ms % tp)
            return k3c_errf(err, K3C_EINVAL, "layout: TP = %lld does not divide the shared-expert width %lld",
                            (long long)tp, (long long)ms);
        if (cfg->latent_dim > 0 && cfg->latent_dim % tp)
            return k3c_errf(err, K3C_EINVAL, "layout: TP = %lld does not divide the latent width %lld", (long long)tp,
                            (long long)cfg->latent_dim);
    }
    return K3C_OK;
}

int k3c_plan_check_grid(const k3c_config *cfg, int64_t tp, int64_t pp, int64_t ep, k3c_err *err) {
    int rc = check_tp(cfg, tp, err);
    if (rc) return rc;
    int moe = has_kind(cfg, -1, K3C_FFN_MOE);
    if (ep > 1 && !moe)
        return k3c_errf(err, K3C_EINVAL, "layout: EP = %lld but the model has no routed experts", (long long)ep);
    if (moe && cfg->num_experts % ep)
        return k3c_errf(err, K3C_EINVAL, "layout: EP = %lld does not divide the %lld routed experts", (long long)ep,
                        (long long)cfg->num_experts);
    if (pp > cfg->num_layers)
        return k3c_errf(err, K3C_EINVAL, "layout: PP = %lld exceeds the %lld decoder layers (a stage needs one)",
                        (long long)pp, (long long)cfg->num_layers);
    return K3C_OK;
}

int k3c_plan_check_layout(const k3c_config *cfg, const k3c_plan_layout *lay, int64_t gpus, k3c_err *err) {
    int rc = k3c_plan_check_config(cfg, err);
    if (rc) return rc;
    if (lay->tp < 1 || lay->cp < 1 || lay->pp < 1 || lay->ep < 1 || lay->dp < 1)
        return k3c_errf(err, K3C_EINVAL, "layout: TP, CP, PP, EP and DP must all be at least 1");
    if (gpus > 0 && k3c_plan_gpus(lay) != gpus)
        return k3c_errf(err, K3C_EINVAL, "layout: TP×CP×PP×EP×DP = %lld×%lld×%lld×%lld×%lld = %lld, not the %lld GPUs",
                        (long long)lay->tp, (long long)lay->cp, (long long)lay->pp, (long long)lay->ep,
                        (long long)lay->dp, (long long)k3c_plan_gpus(lay), (long long)gpus);
    if ((rc = k3c_plan_check_grid(cfg, lay->tp, lay->pp, lay->ep, err))) return rc;
    int moe = has_kind(cfg, -1, K3C_FFN_MOE);
    if (lay->seq < 1 || lay->micro_batch < 1)
        return k3c_errf(err, K3C_EINVAL, "layout: sequence length and micro-batch must be positive");
    if (lay->seq % (lay->tp * lay->cp))
        return k3c_errf(err, K3C_EINVAL,
                        "layout: sequence %lld is not divisible by TP×CP = %lld (sequence parallelism splits tokens "
                        "over both)",
                        (long long)lay->seq, (long long)(lay->tp * lay->cp));
    if (lay->zero < 0 || lay->zero > 3) return k3c_errf(err, K3C_EINVAL, "layout: ZeRO stage must be 0..3");
    if (lay->recompute < 0 || lay->recompute > 2)
        return k3c_errf(err, K3C_EINVAL, "layout: recomputation must be none, selective or full");
    if (lay->recompute_slice < 0 || (lay->recompute_slice > 0 && lay->recompute != K3C_RC_FULL))
        return k3c_errf(err, K3C_EINVAL, "layout: recompute slice %lld (tokens, 0 = off; only with full recompute)",
                        (long long)lay->recompute_slice);
    if (lay->head_chunk < 0)
        return k3c_errf(err, K3C_EINVAL, "layout: head chunk %lld (tokens, 0 = off)", (long long)lay->head_chunk);
    if (lay->optimizer < 0 || lay->optimizer > 1) return k3c_errf(err, K3C_EINVAL, "layout: unknown optimizer");
    if (lay->grad_bytes != 2 && lay->grad_bytes != 4)
        return k3c_errf(err, K3C_EINVAL, "layout: gradient bytes must be 2 (bf16) or 4 (fp32)");
    if (lay->experts_mxfp4 && !moe)
        return k3c_errf(err, K3C_EINVAL, "layout: MXFP4 experts requested but the model has no routed experts");
    if (!k3c_plan_micro_batches(lay))
        return k3c_errf(err, K3C_EINVAL,
                        "layout: global batch %lld tokens is not a positive multiple of micro-batch × seq × EP × DP = "
                        "%lld × %lld × %lld × %lld",
                        (long long)lay->global_batch_tokens, (long long)lay->micro_batch, (long long)lay->seq,
                        (long long)lay->ep, (long long)lay->dp);
    return K3C_OK;
}
