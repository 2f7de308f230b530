/* memory.c — training memory per GPU for one pipeline stage: weights (bf16, MXFP4 experts), gradients, optimizer
 * state (AdamW / Muon, ZeRO 0–3), 1F1B activation stash per recomputation policy, transient buffers (docs/PLAN.md). */
#include "plan/plan.h"

#include <string.h>

#define U 2.0
#define F 4.0

double k3c_plan_opt_bytes(int optimizer, int is_matrix) { return optimizer == K3C_OPT_MUON && is_matrix ? 8.0 : 12.0; }

int64_t k3c_plan_dp_group_dense(const k3c_plan_layout *lay) { return lay->cp * lay->ep * lay->dp; }
int64_t k3c_plan_dp_group_expert(const k3c_plan_layout *lay) { return lay->tp * lay->cp * lay->dp; }

double k3c_plan_expert_weight_bytes(const k3c_config *cfg, int mxfp4) {
    int64_t g = cfg->mxfp4_group > 0 ? cfg->mxfp4_group : 32; /* 4-bit E2M1 + one E8M0 scale per group */
    return mxfp4 ? 0.5 + 1.0 / (double)g : U;
}

static void add_params(k3c_plan_stage_params *p, const k3c_plan_layer_sum *s, const k3c_plan_layout *lay, double wex) {
    double ne = (s->ne_tp - (lay->tp > 1 ? s->pad : 0)) / (double)lay->tp + s->ne_rep, ex = s->ex / (double)lay->ep;
    p->ne += ne;
    p->ne_mat += s->mat_tp / (double)lay->tp + s->mat_rep;
    p->ex += ex;
    p->frozen += s->frozen;
    double b = U * ne + wex * ex;
    if (b > p->max_layer_bytes) p->max_layer_bytes = b;
}

void k3c_plan_stage_params_of(const k3c_plan_model *m, const k3c_plan_layout *lay, int64_t s,
                              k3c_plan_stage_params *p) {
    int64_t first, count;
    k3c_plan_stage_layers(m->layers, lay->pp, s, &first, &count);
    double wex = k3c_plan_expert_weight_bytes(m->cfg, lay->experts_mxfp4);
    memset(p, 0, sizeof *p);
    if (s == 0) add_params(p, &m->first, lay, wex);
    if (s == lay->pp - 1) add_params(p, &m->last, lay, wex);
    for (int64_t l = first; l < first + count; l++) add_params(p, &m->layer[l], lay, wex);
}

/* Transient bytes while the heaviest layer of the stage runs, for one micro-batch of tok tokens per GPU. */
static double working_bytes(const k3c_plan_model *m, const k3c_plan_layout *lay, int64_t s, double tok) {
    const k3c_config *cfg = m->cfg;
    int64_t first, count;
    k3c_plan_stage_layers(m->layers, lay->pp, s, &first, &count);
    double worst = 0, seq_tokens = (double)(lay->micro_batch * lay->seq);
    /* a layer recomputed in slices holds one slice's activations and chunk states (MLA's latent stays whole) */
    const double sl =
        lay->recompute_slice > 0 && (double)lay->recompute_slice < tok ? (double)lay->recompute_slice : tok;
    for (int64_t l = first; l < first + count; l++) {
        const k3c_plan_layer_sum *L = &m->layer[l];
        double w = lay->recompute == K3C_RC_FULL ? sl * L->act[K3C_RC_NONE] : 0; /* the layer being recomputed */
        w += sl * L->kda_states;
        if (L->mla) { /* the whole sequence's latent KV; under CP also two remote blocks of expanded k, v (the
                       * local tokens' k, v are already counted among the activations) */
            double H = (double)cfg->mla_heads / (double)lay->tp;
            double qv = (double)(cfg->qk_nope_dim + cfg->qk_rope_dim + cfg->v_head_dim);
            w += seq_tokens * L->latent * U + (lay->cp > 1) * 2 * (seq_tokens / (double)lay->cp) * H * qv * U;
        }
        if (w > worst) worst = w;
    }
    /* fp32 gradient accumulators: the residual stream, plus one per AttnRes source alive at the stage's end */
    int64_t end = s == lay->pp - 1 ? cfg->num_layers : first + count;
    worst += tok * (double)cfg->hidden_size * F * (1 + (double)k3c_plan_attnres_sources(cfg, end));
    const double hc = lay->head_chunk > 0 && (double)lay->head_chunk < tok ? (double)lay->head_chunk : tok;
    if (s == lay->pp - 1) worst += hc * (double)cfg->vocab_size * U; /* bf16 logits: T/CP tokens (a chunk's) × V/TP */
    return worst;
}

void k3c_plan_stage_memory(const k3c_plan_model *m, const k3c_plan_layout *lay, int64_t s, k3c_plan_memory *o) {
    memset(o, 0, sizeof *o);
    k3c_plan_stage_params p;
    k3c_plan_stage_params_of(m, lay, s, &p);
    double gn = (double)k3c_plan_dp_group_dense(lay), ge = (double)k3c_plan_dp_group_expert(lay);
    double wex = k3c_plan_expert_weight_bytes(m->cfg, lay->experts_mxfp4), gb = (double)lay->grad_bytes;
    double tr_ne = p.ne - p.frozen;
    double opt_ne =
        p.ne_mat * k3c_plan_opt_bytes(lay->optimizer, 1) + (tr_ne - p.ne_mat) * k3c_plan_opt_bytes(lay->optimizer, 0);
    double opt_ex = p.ex * k3c_plan_opt_bytes(lay->optimizer, 1);
    int z = lay->zero;
    o->weights = z >= 3 ? U * p.ne / gn + wex * p.ex / ge : U * p.ne + wex * p.ex;
    o->grads = z >= 2 ? gb * (tr_ne / gn + p.ex / ge) : gb * (tr_ne + p.ex);
    o->optimizer = z >= 1 ? opt_ne / gn + opt_ex / ge : opt_ne + opt_ex;

    int64_t first, count;
    k3c_plan_stage_layers(m->layers, lay->pp, s, &first, &count);
    double tok = (double)(lay->micro_batch * lay->seq) / (double)(lay->tp * lay->cp);
    double per_token = 0;
    for (int64_t l = first; l < first + count; l++) per_token += m->layer[l].act[lay->recompute];
    per_token += m->layer[first].sources_in * (double)m->cfg->hidden_size * U; /* AttnRes sources received */
    int64_t mb = k3c_plan_micro_batches(lay);                                  /* ≥ 1 for a checked layout */
    o->in_flight = lay->pp - s < mb ? lay->pp - s : mb;
    o->stash_per_mb = tok * per_token;
    o->activations = (double)o->in_flight * o->stash_per_mb;
    o->working = working_bytes(m, lay, s, tok) + (z >= 3 ? 2 * p.max_layer_bytes : 0);
    o->total = o->weights + o->grads + o->optimizer + o->activations + o->working;
    o->stage = s;
    o->layers = count;
}

int k3c_plan_memory_train(const k3c_config *cfg, const k3c_plan_layout *lay, k3c_plan_memory *out, k3c_err *err) {
    int rc = k3c_plan_check_layout(cfg, lay, 0, err);
    if (rc) return rc;
    k3c_plan_model m;
    if ((rc = k3c_plan_model_init(&m, cfg, lay->seq, err))) return rc;
    memset(out, 0, sizeof *out);
    for (int64_t s = 0; s < lay->pp; s++) {
        k3c_plan_memory t;
        k3c_plan_stage_memory(&m, lay, s, &t);
        if (s == 0 || t.total > out->total) *out = t;
    }
    k3c_plan_model_free(&m);
    return K3C_OK;
}
