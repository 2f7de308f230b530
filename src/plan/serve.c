/* serve.c — serving plan on TP×PP×EP×DP GPUs: weights in the checkpoint's dtypes, MLA latent cache (576 values per
 * token per layer), KDA recurrent states and conv tails (docs/MODEL.md §2.2, §3.5, §4.1), decode-step estimate. */
#include "plan/plan.h"

#include <math.h>
#include <string.h>

#define PREFILL_CHUNK 8192.0 /* tokens per chunked-prefill step: sizes the transient activations */

int k3c_plan_check_serve(const k3c_config *cfg, const k3c_plan_serve_layout *lay, int64_t gpus, k3c_err *err) {
    int rc = k3c_plan_check_config(cfg, err);
    if (rc) return rc;
    if (lay->tp < 1 || lay->pp < 1 || lay->ep < 1 || lay->dp < 1)
        return k3c_errf(err, K3C_EINVAL, "layout: TP, PP, EP and DP must all be at least 1");
    int64_t n = lay->tp * lay->pp * lay->ep * lay->dp;
    if (gpus > 0 && n != gpus)
        return k3c_errf(err, K3C_EINVAL, "layout: TP×PP×EP×DP = %lld×%lld×%lld×%lld = %lld, not the %lld GPUs",
                        (long long)lay->tp, (long long)lay->pp, (long long)lay->ep, (long long)lay->dp, (long long)n,
                        (long long)gpus);
    if (lay->context < 1 || lay->batch < 1)
        return k3c_errf(err, K3C_EINVAL, "serve: --context and --batch must be positive");
    if (lay->experts_mxfp4 && cfg->num_experts <= 0)
        return k3c_errf(err, K3C_EINVAL, "serve: MXFP4 experts requested but the model has no routed experts");
    return k3c_plan_check_grid(cfg, lay->tp, lay->pp, lay->ep, err);
}

/* Per-stage quantities for one GPU. */
typedef struct {
    double weights, kv, kda, working;
    double read, flops, comm_s;
} stage_serve;

static void serve_stage(const k3c_config *cfg, const k3c_plan_serve_layout *lay, const k3c_plan_hw *hw, int64_t s,
                        stage_serve *o) {
    memset(o, 0, sizeof *o);
    double tp = (double)lay->tp, ep = (double)lay->ep, d = (double)cfg->hidden_size;
    double seqs = ceil((double)lay->batch / (double)(lay->ep * lay->dp)); /* attention is data-parallel over EP·DP */
    double group_tokens = ceil((double)lay->batch / (double)lay->dp);     /* tokens meeting in one EP group */
    double wex = k3c_plan_expert_weight_bytes(cfg, lay->experts_mxfp4);
    int64_t first, count;
    k3c_plan_stage_layers(cfg->num_layers, lay->pp, s, &first, &count);
    k3c_plan_count acc, c, head_first, head_last;
    memset(&acc, 0, sizeof acc);
    k3c_plan_head_count(cfg, &head_first, &head_last);
    if (s == 0) k3c_plan_count_add(&acc, &head_first);
    if (s == lay->pp - 1) k3c_plan_count_add(&acc, &head_last), o->flops += k3c_plan_head_fwd_flops(cfg) * seqs / tp;
    double worst_act = 0, n_moe = 0;
    for (int64_t l = first; l < first + count; l++) {
        k3c_plan_layer_count(cfg, (int)l, &c);
        k3c_plan_count_add(&acc, &c);
        double a = k3c_plan_layer_act_bytes(cfg, (int)l, K3C_RC_NONE);
        if (a > worst_act) worst_act = a;
        o->flops += k3c_plan_layer_decode_flops(cfg, (int)l, lay->context) * seqs / tp;
        if (cfg->mixer[l] == K3C_MIXER_MLA) { /* absorbed cache [c_KV ; k_pe], replicated over TP */
            o->kv += seqs * (double)lay->context * (double)(cfg->kv_lora_rank + cfg->qk_rope_dim) * 2;
        } else { /* fp32 state [H, d_k, d_v] and bf16 conv tails [3P, W − 1], split over TP by heads */
            double H = (double)cfg->kda_heads, dk = (double)cfg->kda_head_dim;
            o->kda += seqs * (H * dk * dk * 4 + 3 * H * dk * (double)(cfg->conv_kernel - 1) * 2) / tp;
        }
        n_moe += cfg->ffn[l] == K3C_FFN_MOE;
    }
    double ne_rep = (double)(acc.n[K3C_PC_NORM] + acc.n[K3C_PC_ATTNRES] + acc.n[K3C_PC_ROUTER]);
    double ne_tp = 0;
    for (int k = 0; k < K3C_PC_COUNT; k++) ne_tp += (double)acc.n[k];
    ne_tp -= ne_rep + (double)acc.n[K3C_PC_ROUTED];
    o->weights = 2 * (ne_tp / tp + ne_rep) + 2 * (double)acc.f32 / tp + wex * (double)acc.n[K3C_PC_ROUTED] / ep;
    o->working = PREFILL_CHUNK / tp * worst_act;

    /* one decode step: every resident non-expert weight, the experts the batch touches, the caches */
    double touched = 0, ein = cfg->latent_dim > 0 ? (double)cfg->latent_dim : d;
    if (cfg->num_experts > 0) {
        double n = (double)cfg->num_experts, k = (double)cfg->top_k;
        touched = n * (1 - pow(1 - k / n, group_tokens)) / ep * (double)acc.n[K3C_PC_ROUTED] / n;
    }
    o->read = 2 * (ne_tp / tp + ne_rep) + wex * touched + o->kv + 2 * o->kda;
    k3c_plan_layout grid;
    k3c_plan_layout_default(&grid);
    grid.tp = lay->tp, grid.pp = lay->pp, grid.ep = lay->ep, grid.dp = lay->dp;
    int64_t mtp = k3c_plan_ranks_per_node(&grid, K3C_AX_TP, hw->gpus_per_node);
    int64_t mep = k3c_plan_ranks_per_node(&grid, K3C_AX_EP, hw->gpus_per_node);
    o->comm_s = (double)count * 2 * k3c_plan_allreduce_s(seqs * d * 2, lay->tp, mtp, hw) +
                n_moe * 2 * k3c_plan_alltoall_s(seqs / tp * (double)cfg->top_k * ein * 2, lay->ep, mep, hw);
    if (s < lay->pp - 1) o->comm_s += seqs / tp * d * 2 / (hw->ib_gbps * 1e9 / 8);
}

int k3c_plan_serve_evaluate(const k3c_config *cfg, const k3c_plan_serve_layout *lay, const k3c_plan_hw *hw,
                            k3c_plan_serve_eval *o, k3c_err *err) {
    int rc = k3c_plan_check_serve(cfg, lay, 0, err);
    if (rc) return rc;
    memset(o, 0, sizeof *o);
    o->layout = *lay;
    for (int64_t s = 0; s < lay->pp; s++) {
        stage_serve st;
        serve_stage(cfg, lay, hw, s, &st);
        double total = st.weights + st.kv + st.kda + st.working;
        if (s == 0 || total > o->total)
            o->stage = (int)s, o->weights = st.weights, o->kv_cache = st.kv, o->kda_state = st.kda,
            o->working = st.working, o->total = total;
        double t_mem = st.read / (hw->hbm_gbs * 1e9), t_fl = st.flops / (hw->peak_tflops * 1e12 * hw->compute_eff);
        o->step_s += (t_mem > t_fl ? t_mem : t_fl) + st.comm_s; /* a token crosses the stages one after another */
        o->read_bytes += st.read;
    }
    for (int l = 0; l < cfg->num_layers; l++) {
        if (cfg->mixer[l] == K3C_MIXER_MLA)
            o->kv_bytes_per_token += (double)(cfg->kv_lora_rank + cfg->qk_rope_dim) * 2;
        else {
            double H = (double)cfg->kda_heads, dk = (double)cfg->kda_head_dim;
            o->kda_bytes_per_seq += H * dk * dk * 4 + 3 * H * dk * (double)(cfg->conv_kernel - 1) * 2;
        }
    }
    o->decode_flops_per_token = k3c_plan_flops_decode(cfg, lay->context);
    o->tokens_per_s = o->step_s > 0 ? (double)lay->batch / o->step_s : 0;
    o->fits = o->total <= hw->gpu_mem_gb * 1e9;
    return K3C_OK;
}

int k3c_plan_serve_search(const k3c_config *cfg, int64_t gpus, const k3c_plan_serve_layout *fixed,
                          const k3c_plan_hw *hw, k3c_plan_serve_eval *best, int top, int *n_best, int64_t *valid,
                          k3c_err *err) {
    *n_best = 0, *valid = 0;
    if (gpus < 1 || top < 1) return k3c_errf(err, K3C_EINVAL, "plan: --gpus and --top must be positive");
    for (int64_t tp = 1; tp <= gpus; tp++) {
        if (gpus % tp || (fixed->tp > 0 ? tp != fixed->tp : tp > hw->gpus_per_node)) continue;
        for (int64_t pp = 1; pp <= gpus / tp; pp++) {
            if ((gpus / tp) % pp || (fixed->pp > 0 && pp != fixed->pp)) continue;
            for (int64_t ep = 1; ep <= gpus / (tp * pp); ep++) {
                int64_t rest = gpus / (tp * pp);
                if (rest % ep || (fixed->ep > 0 && ep != fixed->ep) || (fixed->dp > 0 && rest / ep != fixed->dp))
                    continue;
                k3c_plan_serve_layout lay = *fixed;
                lay.tp = tp, lay.pp = pp, lay.ep = ep, lay.dp = rest / ep;
                k3c_err e;
                k3c_plan_serve_eval ev;
                if (k3c_plan_serve_evaluate(cfg, &lay, hw, &ev, &e)) continue;
                ++*valid;
                if (!ev.fits) continue;
                int i = *n_best < top ? *n_best : top - 1;
                if (*n_best == top && ev.step_s >= best[top - 1].step_s) continue;
                while (i > 0 && best[i - 1].step_s > ev.step_s) best[i] = best[i - 1], i--;
                best[i] = ev;
                if (*n_best < top) ++*n_best;
            }
        }
    }
    return K3C_OK;
}
