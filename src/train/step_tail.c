/* step_tail.c — the tail of a training step over parameter groups: clipping → the non-finite guard → the optimizer
 * (Per-Head Muon + AdamW) → QK-Clip → router-bias balancing, every op an entry of the model's backend table, so the
 * same tail runs on the CPU and a device for pretraining, SFT, RL and vision training. Spec: docs/TRAINING.md "The
 * step's tail", §1.3, §1.6, docs/MODEL.md §7.2 (QB after the optimizer step), §10. */
#include "train/step_tail.h"

#include "base/check.h"
#include "k3c/train.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int k3c_flat_group_open(k3c_flat_group *f, const k3c_backend_f32 *be, const char *name, float *w, float *g, size_t n,
                        const k3c_optim *hp, k3c_err *err) {
    memset(f, 0, sizeof *f);
    f->be = be;
    k3c_param *p = &f->entry;
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = 1;
    p->shape[0] = p->whole_shape[0] = (int64_t)n;
    p->numel = p->used = p->whole_numel = (int64_t)n;
    p->kind = K3C_PK_VECTOR;
    p->layer = -1;
    f->table = (k3c_param_table){.p = p, .n = 1, .cap = 1, .total = n};
    f->opt = *hp;
    f->opt.state_off = NULL, f->opt.ws = NULL;
    f->opt.decay_vectors = 1; /* weight decay on every element, as on the model's matrices */
    CHECK_RC(k3c_optim_init(&f->opt, &f->table, err));
    f->group = (k3c_param_group){&f->table, &f->opt, NULL, w, g, NULL};
    const size_t ns = f->opt.state_numel ? f->opt.state_numel : 1;
    f->group.state = be->alloc(sizeof(float) * ns);
    if (!f->group.state) return k3c_errf(err, K3C_ENOMEM, "%s: cannot allocate the optimizer state", name);
    CHECK_RC(be->zero(f->group.state, (int64_t)ns, err));
    return be->optim_open(be->ctx, &f->opt, &f->table, &f->group.inst, err);
}

void k3c_flat_group_close(k3c_flat_group *f) {
    if (!f->be) return;
    if (f->group.inst) f->be->optim_close(f->group.inst);
    if (f->group.state && f->be->sync(NULL) == K3C_OK) f->be->free(f->group.state);
    k3c_optim_free(&f->opt);
    memset(f, 0, sizeof *f);
}

static int clip(k3c_step_tail *t, const k3c_backend_f32 *be, int i, double max_norm, double *norm, k3c_err *err) {
    const k3c_param_group *pg = &t->group[i];
    if (i == 0 && t->par && t->par->dp) /* the owners' parts, summed */
        return k3c_dp_clip_grad_norm(t->par->dp, t->par->pp_comm, pg->inst, pg->table, pg->g, max_norm, norm, err);
    return be->clip_grad_norm(pg->inst, pg->table, pg->g, max_norm, norm, err);
}

static int update(k3c_step_tail *t, const k3c_backend_f32 *be, int i, double lr, int64_t step, k3c_err *err) {
    const k3c_param_group *pg = &t->group[i];
    if (i == 0 && t->par && t->par->dp) /* this rank's shard, then every rank's entries gathered */
        return k3c_dp_optim_step(t->par->dp, be, pg->inst, pg->table, pg->w, pg->g, pg->state, lr, step, err);
    return be->optim_step(pg->inst, pg->opt, pg->table, 0, pg->table->n, pg->w, pg->g, pg->state, lr, step, err);
}

/* S_max of every MLA head (the same on every rank), then the heads above τ scaled; the count lands in the step
 * statistics' telemetry (a non-finite S_max: −1 there, read by the caller). */
static int qk_clip(k3c_step_tail *t, const k3c_backend_f32 *be, double tau, k3c_err *err) {
    k3c_model *m = t->m;
    k3c_step_stats *s = m->stats;
    if (!(tau > 0) || !k3c_config_num_mla(&m->cfg) || !s) return K3C_OK;
    if (t->par && t->par->tp) CHECK_RC(k3c_tp_mask_smax(t->par->tp, &m->cfg, s->smax, err)); /* others' heads */
    if (t->par && t->par->dp) CHECK_RC(k3c_dp_max_smax(t->par->dp, s->smax, m->cfg.num_layers * m->cfg.mla_heads, err));
    return be->qk_clip(be->ctx, &m->cfg, &m->table, m->w, s->smax, tau, s->qk_clipped, err);
}

/* The router biases' update after the optimizer step (docs/TRAINING.md §1.6), from this step's router logits and
 * cutoffs: quantile balancing (§7.2) or the auxiliary-loss-free sign step. The new bias routes the next batch, never
 * this one. */
static int balance(k3c_step_tail *t, const k3c_backend_f32 *be, const k3c_tail_config *c, k3c_err *err) {
    k3c_model *m = t->m;
    const k3c_config *cfg = &m->cfg;
    const int qb = c->balancing == K3C_BALANCE_QUANTILE;
    if ((!qb && c->balancing != K3C_BALANCE_BIAS) || !m->stats) return K3C_OK;
    const char *what = qb ? "quantile balancing" : "bias balancing";
    k3c_dp *dp = t->par ? t->par->dp : NULL;
    for (int l = 0; l < cfg->num_layers; l++) {
        const k3c_route_stats *r = &m->stats->route[l];
        if (cfg->ffn[l] != K3C_FFN_MOE || r->T == 0) continue;
        const float *logits = r->logits, *cutoff = r->cutoff;
        int64_t T = r->T; /* data parallelism: the whole batch's statistics, so every rank sets the same bias */
        if (dp && k3c_dp_gather_route(dp, r, r->n, (float **)&logits, (float **)&cutoff, &T, err))
            return k3c_err_wrap(err, "layer %d: %s", l, what);
        size_t need = qb ? be->quantile_balance_workspace(c->qb_mode, T, r->n) : be->bias_balance_workspace(T, r->n, r->k);
        if (need > t->ws_bytes) {
            if (t->ws) be->free(t->ws);
            t->ws = be->alloc(need);
            t->ws_bytes = t->ws ? need : 0;
            if (!t->ws) return k3c_errf(err, K3C_ENOMEM, "%s workspace", what);
        }
        float *bias = (float *)m->w + m->table.layer[l].router_bias;
        int e = qb ? be->quantile_balance(be->ctx, c->qb_mode, logits, cutoff, T, r->n, r->k, bias, t->ws, err)
                   : be->bias_balance(be->ctx, logits, T, r->n, r->k, c->bias_gamma, bias, t->ws, err);
        if (e) {
            k3c_err_wrap(err, "layer %d: %s", l, what);
            return e;
        }
    }
    return K3C_OK;
}

int k3c_step_tail_run(k3c_step_tail *t, const k3c_tail_config *c, const double *lr, int64_t step, k3c_tail_result *r,
                      k3c_err *err) {
    const k3c_backend_f32 *be = k3c_model_backend_f32(t->m);
    memset(r, 0, sizeof *r);
    for (int i = 0; i < t->n_groups; i++) CHECK_RC(clip(t, be, i, c->grad_clip, &r->grad_norm[i], err));
    for (int i = 0; i < t->n_groups && !r->skipped; i++)
        if (!isfinite(r->grad_norm[i])) {
            r->skipped = 1;
            snprintf(r->why, sizeof r->why, "gradient norm is %g", r->grad_norm[i]);
        }
    if (r->skipped) return K3C_OK;
    for (int i = 0; i < t->n_groups; i++) CHECK_RC(update(t, be, i, lr[i], step, err));
    CHECK_RC(qk_clip(t, be, c->qk_clip_tau, err));
    return balance(t, be, c, err);
}

void k3c_step_tail_free(k3c_step_tail *t) {
    const k3c_backend_f32 *be = t->m ? k3c_model_backend_f32(t->m) : NULL;
    if (t->ws && be->sync(NULL) == K3C_OK) be->free(t->ws); /* never memory a device may still use */
    t->ws = NULL;
    t->ws_bytes = 0;
}
