/* comm.c — per-stage communication (docs/PLAN.md §5): TP sequence-parallel gathers, CP latent-KV / KDA-state gathers,
 * EP dispatch + combine (docs/MODEL.md §9.2), PP sends with AttnRes sources (§5.2), DP sync under ZeRO 0–3. */
#include "plan/plan.h"

#include <string.h>

#define U 2.0
#define F 4.0

static const char *const comm_names[K3C_COMM_COUNT] = {"tp", "cp", "ep", "pp", "dp"};
const char *k3c_plan_comm_name(int kind) { return kind >= 0 && kind < K3C_COMM_COUNT ? comm_names[kind] : "?"; }

int64_t k3c_plan_ranks_per_node(const k3c_plan_layout *lay, unsigned mask, int64_t gpus_per_node) {
    const int64_t size[5] = {lay->tp, lay->ep, lay->cp, lay->dp, lay->pp};
    const unsigned bit[5] = {K3C_AX_TP, K3C_AX_EP, K3C_AX_CP, K3C_AX_DP, K3C_AX_PP};
    int64_t room = gpus_per_node, m = 1;
    for (int i = 0; i < 5 && room > 1; i++) {
        int64_t c = size[i] < room ? size[i] : room;
        if (mask & bit[i]) m *= c;
        room /= c;
    }
    return m;
}

static double nvlink_bps(const k3c_plan_hw *hw) { return hw->nvlink_gbs * 1e9; }
static double ib_bps(const k3c_plan_hw *hw) { return hw->ib_gbps * 1e9 / 8; }

static int64_t clamp_m(int64_t m, int64_t n) { return m < 1 ? 1 : (m > n ? n : m); }

double k3c_plan_allgather_s(double bytes, int64_t n, int64_t m, const k3c_plan_hw *hw) {
    if (n <= 1 || bytes <= 0) return 0;
    m = clamp_m(m, n);
    double nodes = (double)n / (double)m;
    double intra = (double)(m - 1) / (double)m * bytes / nvlink_bps(hw);
    double inter = nodes > 1 ? (nodes - 1) / nodes * bytes / (double)m / ib_bps(hw) : 0;
    return intra + inter;
}

double k3c_plan_allreduce_s(double bytes, int64_t n, int64_t m, const k3c_plan_hw *hw) {
    return 2 * k3c_plan_allgather_s(bytes, n, m, hw); /* reduce-scatter + all-gather */
}

double k3c_plan_alltoall_s(double bytes, int64_t n, int64_t m, const k3c_plan_hw *hw) {
    if (n <= 1 || bytes <= 0) return 0;
    m = clamp_m(m, n);
    double intra = bytes * (double)(m - 1) / (double)n / nvlink_bps(hw);
    double inter = bytes * (double)(n - m) / (double)n / ib_bps(hw);
    return intra > inter ? intra : inter;
}

/* Adds `count` collectives of one kind: time and bytes each GPU sends. */
static void add(double *sec, double *bytes, double count, double t, double sent) {
    *sec += count * t;
    *bytes += count * sent;
}

static double ag_sent(double b, int64_t n) { return n > 1 ? b * (double)(n - 1) / (double)n : 0; }

static void tp_cp_ep(const k3c_plan_model *m, const k3c_plan_layout *lay, const k3c_plan_hw *hw, int64_t s,
                     k3c_plan_comm *o) {
    const k3c_config *cfg = m->cfg;
    int64_t first, count, g = hw->gpus_per_node;
    k3c_plan_stage_layers(m->layers, lay->pp, s, &first, &count);
    double passes = 2 + (lay->recompute == K3C_RC_FULL); /* forward, backward, recomputed forward */
    double seq_tok = (double)(lay->micro_batch * lay->seq), tok = seq_tok / (double)(lay->tp * lay->cp);
    double d = (double)cfg->hidden_size;
    int64_t mtp = k3c_plan_ranks_per_node(lay, K3C_AX_TP, g), mcp = k3c_plan_ranks_per_node(lay, K3C_AX_CP, g);
    int64_t mep = k3c_plan_ranks_per_node(lay, K3C_AX_EP, g);
    /* sequence parallel: all-gather before and reduce-scatter after each sublayer, in every pass */
    double tp_buf = seq_tok / (double)lay->cp * d * U;
    add(&o->mb_seconds[K3C_COMM_TP], &o->mb_bytes[K3C_COMM_TP], (double)count * 2 * 2 * passes,
        k3c_plan_allgather_s(tp_buf, lay->tp, mtp, hw), ag_sent(tp_buf, lay->tp));
    for (int64_t l = first; l < first + count; l++) {
        const k3c_plan_layer_sum *L = &m->layer[l];
        double cp_buf = L->mla ? seq_tok * L->latent * U /* latent KV of the whole sequence */
                               : (double)lay->cp * (double)cfg->kda_heads / (double)lay->tp *
                                     (double)(2 * cfg->kda_head_dim * cfg->kda_head_dim) * F; /* state + transition */
        add(&o->mb_seconds[K3C_COMM_CP], &o->mb_bytes[K3C_COMM_CP], passes,
            k3c_plan_allgather_s(cp_buf, lay->cp, mcp, hw), ag_sent(cp_buf, lay->cp));
        if (!L->moe) continue;
        double ein = cfg->latent_dim > 0 ? (double)cfg->latent_dim : d;
        double ep_buf = tok * (double)cfg->top_k * ein * U; /* dispatch = combine payload per GPU */
        add(&o->mb_seconds[K3C_COMM_EP], &o->mb_bytes[K3C_COMM_EP], 2 * passes,
            k3c_plan_alltoall_s(ep_buf, lay->ep, mep, hw), ag_sent(ep_buf, lay->ep));
    }
}

static void pp_sends(const k3c_plan_model *m, const k3c_plan_layout *lay, const k3c_plan_hw *hw, int64_t s,
                     k3c_plan_comm *o) {
    if (lay->pp <= 1) return;
    double tok = (double)(lay->micro_batch * lay->seq) / (double)(lay->tp * lay->cp);
    double row = tok * (double)m->cfg->hidden_size * U;
    double bw = k3c_plan_ranks_per_node(lay, K3C_AX_PP, hw->gpus_per_node) > 1 ? nvlink_bps(hw) : ib_bps(hw);
    int64_t first, count;
    if (s < lay->pp - 1) { /* activations forward: the partial sum and every completed AttnRes source */
        k3c_plan_stage_layers(m->layers, lay->pp, s + 1, &first, &count);
        double b = row * (1 + m->layer[first].sources_in);
        add(&o->mb_seconds[K3C_COMM_PP], &o->mb_bytes[K3C_COMM_PP], 1, b / bw, b);
    }
    if (s > 0) { /* their gradients backward */
        k3c_plan_stage_layers(m->layers, lay->pp, s, &first, &count);
        double b = row * (1 + m->layer[first].sources_in);
        add(&o->mb_seconds[K3C_COMM_PP], &o->mb_bytes[K3C_COMM_PP], 1, b / bw, b);
    }
}

/* One gradient reduction (all-reduce for ZeRO-0, else reduce-scatter) and one parameter all-gather per group. */
static void dp_sync(const k3c_plan_model *m, const k3c_plan_layout *lay, const k3c_plan_hw *hw, int64_t s,
                    k3c_plan_comm *o) {
    k3c_plan_stage_params p;
    k3c_plan_stage_params_of(m, lay, s, &p);
    int64_t gn = k3c_plan_dp_group_dense(lay), ge = k3c_plan_dp_group_expert(lay), g = hw->gpus_per_node;
    int64_t mn = k3c_plan_ranks_per_node(lay, K3C_AX_CP | K3C_AX_EP | K3C_AX_DP, g);
    int64_t me = k3c_plan_ranks_per_node(lay, K3C_AX_TP | K3C_AX_CP | K3C_AX_DP, g);
    double gb = (double)lay->grad_bytes, wex = k3c_plan_expert_weight_bytes(m->cfg, lay->experts_mxfp4);
    double Gn = gb * (p.ne - p.frozen), Ge = gb * p.ex, Wn = U * p.ne, We = wex * p.ex;
    double rs_t = k3c_plan_allgather_s(Gn, gn, mn, hw) + k3c_plan_allgather_s(Ge, ge, me, hw);
    double rs_b = ag_sent(Gn, gn) + ag_sent(Ge, ge);
    double ag_t = k3c_plan_allgather_s(Wn, gn, mn, hw) + k3c_plan_allgather_s(We, ge, me, hw);
    double ag_b = ag_sent(Wn, gn) + ag_sent(We, ge);
    double *ms = &o->mb_seconds[K3C_COMM_DP], *mb = &o->mb_bytes[K3C_COMM_DP];
    double *ss = &o->step_seconds[K3C_COMM_DP], *sb = &o->step_bytes[K3C_COMM_DP];
    double passes = 2 + (lay->recompute == K3C_RC_FULL);
    switch (lay->zero) {
    case 0: add(ss, sb, 2, rs_t, rs_b); break; /* all-reduce = reduce-scatter + all-gather of the gradients */
    case 1: add(ss, sb, 1, rs_t, rs_b), add(ss, sb, 1, ag_t, ag_b); break;
    case 2: add(ms, mb, 1, rs_t, rs_b), add(ss, sb, 1, ag_t, ag_b); break;
    default: add(ms, mb, 1, rs_t, rs_b), add(ms, mb, passes, ag_t, ag_b); break; /* gather before each pass */
    }
}

void k3c_plan_stage_comm(const k3c_plan_model *m, const k3c_plan_layout *lay, const k3c_plan_hw *hw, int64_t s,
                         k3c_plan_comm *o) {
    memset(o, 0, sizeof *o);
    tp_cp_ep(m, lay, hw, s, o);
    pp_sends(m, lay, hw, s, o);
    dp_sync(m, lay, hw, s, o);
    for (int k = 0; k < K3C_COMM_COUNT; k++) o->mb_total_s += o->mb_seconds[k], o->step_total_s += o->step_seconds[k];
}
