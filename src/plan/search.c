/* search.c — evaluates a training layout (memory of the heaviest stage, step time of the slowest one under 1F1B,
 * communication share, MFU) and enumerates TP×CP×PP×EP×DP × ZeRO × recomputation × micro-batch for N GPUs. */
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

/* Memory part of the evaluation: the heaviest stage. */
static void eval_memory(const k3c_plan_model *m, const k3c_plan_layout *lay, k3c_plan_eval *o) {
    for (int64_t s = 0; s < lay->pp; s++) {
        k3c_plan_memory t;
        k3c_plan_stage_memory(m, lay, s, &t);
        if (s == 0 || t.total > o->mem.total) o->mem = t;
    }
}

/* Forward + backward (+ recomputed forward) FLOPs of one micro-batch on one GPU of stage s. */
static double stage_mb_flops(const k3c_plan_model *m, const k3c_plan_layout *lay, int64_t s) {
    int64_t first, count;
    k3c_plan_stage_layers(m->layers, lay->pp, s, &first, &count);
    double fwd = s == lay->pp - 1 ? m->last.fwd : 0;
    for (int64_t l = first; l < first + count; l++) fwd += m->layer[l].fwd;
    double passes = 3 + (lay->recompute == K3C_RC_FULL);
    return fwd * passes * (double)(lay->micro_batch * lay->seq) / (double)(lay->tp * lay->cp);
}

static void eval_time(const k3c_plan_model *m, const k3c_plan_layout *lay, const k3c_plan_hw *hw, k3c_plan_eval *o) {
    int64_t mb = o->micro_batches;
    double flops_s = hw->peak_tflops * 1e12 * hw->compute_eff, worst = -1, sync = -1;
    k3c_plan_comm sync_comm;
    memset(&sync_comm, 0, sizeof sync_comm);
    for (int64_t s = 0; s < lay->pp; s++) {
        k3c_plan_comm c;
        k3c_plan_stage_comm(m, lay, hw, s, &c);
        double tc = stage_mb_flops(m, lay, s) / flops_s;
        if (tc + c.mb_total_s > worst) worst = tc + c.mb_total_s, o->comm = c, o->mb_compute_s = tc, o->slow_stage = s;
        if (c.step_total_s > sync) sync = c.step_total_s, sync_comm = c;
    }
    /* DP sync runs on every stage at once after the last backward: the longest one counts */
    memcpy(o->comm.step_seconds, sync_comm.step_seconds, sizeof o->comm.step_seconds);
    memcpy(o->comm.step_bytes, sync_comm.step_bytes, sizeof o->comm.step_bytes);
    o->comm.step_total_s = sync;
    o->compute_s = (double)mb * o->mb_compute_s;
    o->comm_s = (double)mb * o->comm.mb_total_s + sync;
    o->bubble_s = (double)(lay->pp - 1) * worst;
    o->step_s = o->compute_s + o->comm_s + o->bubble_s;
    for (int k = 0; k < K3C_COMM_COUNT; k++) {
        o->comm_kind_s[k] = (double)mb * o->comm.mb_seconds[k] + o->comm.step_seconds[k];
        o->comm_kind_bytes[k] = (double)mb * o->comm.mb_bytes[k] + o->comm.step_bytes[k];
    }
    o->bubble_frac = k3c_plan_bubble(lay->pp, mb);
    o->comm_share = o->step_s > 0 ? o->comm_s / o->step_s : 0;
    o->tokens_per_s = o->step_s > 0 ? (double)lay->global_batch_tokens / o->step_s : 0;
    o->mfu = k3c_plan_mfu(o->model_flops_per_token, (double)lay->global_batch_tokens, o->step_s, k3c_plan_gpus(lay),
                          hw->peak_tflops * 1e12);
}

static void eval_model(const k3c_plan_model *m, const k3c_plan_layout *lay, const k3c_plan_hw *hw, int timing,
                       k3c_plan_eval *o) {
    memset(o, 0, sizeof *o);
    o->layout = *lay;
    o->micro_batches = k3c_plan_micro_batches(lay);
    o->model_flops_per_token = m->flops.model_total;
    o->hw_flops_per_token = m->flops.fwd_total * (3 + (lay->recompute == K3C_RC_FULL));
    eval_memory(m, lay, o);
    o->fits = o->mem.total <= hw->gpu_mem_gb * 1e9;
    if (timing) eval_time(m, lay, hw, o);
}

int k3c_plan_evaluate(const k3c_config *cfg, const k3c_plan_layout *lay, const k3c_plan_hw *hw, k3c_plan_eval *out,
                      k3c_err *err) {
    int rc = k3c_plan_check_layout(cfg, lay, 0, err);
    if (rc) return rc;
    k3c_plan_model m;
    if ((rc = k3c_plan_model_init(&m, cfg, lay->seq, err))) return rc;
    eval_model(&m, lay, hw, 1, out);
    k3c_plan_model_free(&m);
    return K3C_OK;
}

/* ---------------------------------------------------------------- search */
static int divisors(int64_t n, int64_t *out, int cap) {
    int k = 0;
    for (int64_t d = 1; d <= n && k < cap; d++)
        if (n % d == 0) out[k++] = d;
    return k;
}

/* Faster first; equal times (e.g. selective vs no recomputation, same FLOPs) prefer less memory. */
static int better(const k3c_plan_eval *a, const k3c_plan_eval *b) {
    if (a->step_s != b->step_s) return a->step_s < b->step_s;
    return a->mem.total < b->mem.total;
}

static void insert_best(k3c_plan_search_result *r, int top, const k3c_plan_eval *e) {
    int i = r->n_best < top ? r->n_best : top - 1;
    if (r->n_best == top && !better(e, &r->best[top - 1])) return;
    while (i > 0 && better(e, &r->best[i - 1])) r->best[i] = r->best[i - 1], i--;
    r->best[i] = *e;
    if (r->n_best < top) r->n_best++;
}

typedef struct {
    const k3c_config *cfg;
    const k3c_plan_model *m;
    const k3c_plan_search_opts *o;
    const k3c_plan_hw *hw;
    k3c_plan_search_result *r;
} search_ctx;

/* All ZeRO stages, recomputation policies and micro-batch sizes for one parallel grid. */
static void try_grid(search_ctx *c, k3c_plan_layout lay) {
    const k3c_plan_layout *f = &c->o->fixed;
    for (int z = 0; z <= 3; z++) {
        if (f->zero >= 0 && z != f->zero) continue;
        for (int rc = 0; rc <= 2; rc++) {
            if (f->recompute >= 0 && rc != f->recompute) continue;
            for (int64_t b = 1; b * lay.seq * lay.ep * lay.dp <= lay.global_batch_tokens; b *= 2) {
                if (f->micro_batch > 0 && b != f->micro_batch) continue;
                lay.zero = z, lay.recompute = rc, lay.micro_batch = b;
                c->r->tried++;
                k3c_err e;
                if (k3c_plan_check_layout(c->cfg, &lay, c->o->gpus, &e)) continue;
                c->r->valid++;
                k3c_plan_eval ev;
                eval_model(c->m, &lay, c->hw, 0, &ev);
                if (c->r->min_mem == 0 || ev.mem.total < c->r->min_mem) c->r->min_mem = ev.mem.total;
                if (!ev.fits) continue;
                c->r->fitting++;
                eval_time(c->m, &lay, c->hw, &ev);
                insert_best(c->r, c->o->top, &ev);
            }
        }
    }
}

static int pick(int64_t fixed, int64_t v) { return fixed <= 0 || fixed == v; }

int k3c_plan_search(const k3c_config *cfg, const k3c_plan_search_opts *o, const k3c_plan_hw *hw,
                    k3c_plan_search_result *r, k3c_err *err) {
    r->n_best = 0, r->tried = r->valid = r->fitting = 0, r->min_mem = 0;
    if (o->gpus < 1) return k3c_errf(err, K3C_EINVAL, "plan: --gpus must be positive");
    if (o->top < 1 || !r->best) return k3c_errf(err, K3C_EINVAL, "plan: the search needs room for one layout");
    const int64_t fixed[5] = {o->fixed.tp, o->fixed.cp, o->fixed.pp, o->fixed.ep, o->fixed.dp};
    static const char *const names[5] = {"TP", "CP", "PP", "EP", "DP"};
    for (int i = 0; i < 5; i++)
        if (fixed[i] > 0 && o->gpus % fixed[i])
            return k3c_errf(err, K3C_EINVAL, "layout: %s = %lld does not divide the %lld GPUs", names[i],
                            (long long)fixed[i], (long long)o->gpus);
    k3c_plan_model m;
    int rc = k3c_plan_model_init(&m, cfg, o->fixed.seq, err);
    if (rc) return rc;
    int64_t dv[1024];
    int nd = divisors(o->gpus, dv, 1024);
    search_ctx c = {cfg, &m, o, hw, r};
    for (int a = 0; a < nd; a++) {
        int64_t tp = dv[a];
        /* unless asked for, TP stays inside a node: its collectives run every sublayer */
        if (!pick(o->fixed.tp, tp) || (o->fixed.tp <= 0 && tp > hw->gpus_per_node)) continue;
        for (int b = 0; b < nd; b++) {
            int64_t cp = dv[b];
            if (!pick(o->fixed.cp, cp) || (o->gpus / tp) % cp || o->fixed.seq % (tp * cp)) continue;
            for (int e = 0; e < nd; e++) {
                int64_t pp = dv[e];
                if (!pick(o->fixed.pp, pp) || (o->gpus / (tp * cp)) % pp || pp > cfg->num_layers) continue;
                int64_t rest = o->gpus / (tp * cp * pp);
                for (int f = 0; f < nd; f++) {
                    int64_t ep = dv[f];
                    if (!pick(o->fixed.ep, ep) || rest % ep || !pick(o->fixed.dp, rest / ep)) continue;
                    k3c_plan_layout lay = o->fixed;
                    lay.tp = tp, lay.cp = cp, lay.pp = pp, lay.ep = ep, lay.dp = rest / ep;
                    try_grid(&c, lay);
                }
            }
        }
    }
    k3c_plan_model_free(&m);
    return K3C_OK;
}
