/* test_dist_dp.c — data parallelism with ZeRO-1 (src/parallel/dp.c) and expert parallelism (src/parallel/ep.c) equal one
 * process: the tiny K3 model (configs/k3_test_tiny.json: KDA + MLA, 4 experts top-2, AttnRes) trained for 3 steps on
 * one global batch of packed documents, once whole on every rank (the reference: the trainer's single-process step)
 * and once split over the ranks (the trainer's parallel step) at every layout of the ranks: dp = N, ep = N, dp2×ep2,
 * pp = N (4 micro-batches, 1F1B), dp2×pp2, ep2×pp2, tp = N (src/parallel/tp.c; tp4 on a 4-head variant), dp2×tp2,
 * tp2×pp2, ep2×tp2, cp = N (src/parallel/cp.c), dp2×cp2, cp2×ep2, cp2×pp2 and cp2×tp2; on 8 ranks ep2×tp2×pp2,
 * cp2×tp2×pp2 and ep2×cp2×tp2; on 16 ranks ep2×tp2×pp2×cp2 (2 micro-batches).
 * fp32; relative difference of a tensor = ‖x − ref‖₂ / ‖ref‖₂ per parameter-table entry (test_rel_err), tolerance
 * 1e-5 for the loss, every gradient of step 1 (after the sum over ranks) and every weight and optimizer-state entry
 * after 3 steps (Muon + AdamW with clipping active, QK-Clip clipping heads, exact quantile balancing; router biases
 * on the scale of the scores, see compare()); histogram balancing over one step. In float64 the data split's loss and
 * gradients equal the whole batch's to 1e-12. Runs on the self communicator here and on 2, 4, 8 and 16 MPI ranks. */
#include "test.h"

#include "dist_fixture.h"
#include "mpi_launch.h"

#define STEPS 3
#define TOL 1e-5
#define MICRO 4 /* pipeline micro-batches per step */

static int runner_init(runner *r, const k3c_config *cfg, k3c_comm *comm, int ep, int pp, int tp, int cp, k3c_err *err) {
    memset(r, 0, sizeof *r);
    /* on 16 ranks (ep2×tp2×pp2×cp2: two data parts of 80 tokens) 2 micro-batches, whose cp2 ranges stay longer than
       the conv tail */
    const int micro = comm && comm->size == 16 ? 2 : MICRO;
    /* EP: this rank's experts only, PP: its stage's layers only */
    const k3c_residency res =
        residency_of(cfg, comm ? comm->rank : 0, comm ? comm->size : 1, comm ? ep : 1, tp, comm ? pp : 1, cp);
    CHECK_RC(k3c_model_create_resident_f32(cfg, 1, &res, &r->m, err));
    k3c_model_init_f32(&r->m, 7, 0.1);
    r->m.kda_chunk = 16;
    r->be = k3c_model_backend_f32(&r->m);
    k3c_optim_defaults(&r->opt);
    CHECK_RC(k3c_optim_init(&r->opt, &r->m.table, err));
    CHECK_RC(pieces_init(&r->d, &r->m, r->be, &r->opt, comm, ep > 1 ? ep : 0, tp > 1 ? tp : 0, pp > 1 ? pp : 0,
                         cp > 1 ? cp : 0, micro, T_BATCH, err));
    size_t n_state = r->d.dist ? r->d.dp.shard.state_numel : r->opt.state_numel;
    r->state = calloc(n_state ? n_state : 1, sizeof(float));
    CHECK_RC(k3c_step_stats_init_f32(&r->m, T_BATCH, &r->stats, err));
    r->m.stats = &r->stats;
    return k3c_arena_init(&r->ar, k3c_model_plan_bytes_f32(&r->m, T_BATCH, T_BATCH), err);
}

static void runner_free(runner *r) {
    k3c_arena_free(&r->ar);
    k3c_step_stats_free_f32(&r->m, &r->stats);
    pieces_free(&r->d);
    k3c_model_free_f32(&r->m);
    k3c_optim_free(&r->opt);
    free(r->state);
    if (r->qb_ws) r->be->free(r->qb_ws);
}

/* Largest per-entry relative difference of x against ref over the table entries of kind `kind` (−1: all). */
static double max_rel(const k3c_param_table *t, const float *x, const float *ref, int kind, const char **worst) {
    double m = 0;
    for (int i = 0; i < t->n; i++) {
        const k3c_param *p = &t->p[i];
        if (kind >= 0 && p->kind != kind) continue;
        double rel = test_rel_err_f(x + p->offset, ref + p->offset, (size_t)p->numel);
        if (rel > m) m = rel, *worst = p->name;
    }
    return m;
}

/* The same over the optimizer state, entry by entry (state_off layout). */
static double max_rel_state(const k3c_optim *o, const float *x, const float *ref) {
    double m = 0;
    for (int i = 0; i < o->n_entries; i++) {
        size_t a = o->state_off[i], b = i + 1 < o->n_entries ? o->state_off[i + 1] : o->state_numel;
        double rel = test_rel_err_f(x + a, ref + a, b - a);
        if (rel > m) m = rel;
    }
    return m;
}

/* Runs `steps` steps of the reference and the parallel runner from the same state; returns 0 on a failed step. */
static int run_both(runner *ref, runner *par, const batch *gb, int steps, int qb_mode, float *g_ref, float *g_par,
                    double *loss_rel, double *norm1, int *clipped) {
    k3c_err err = {0};
    for (int64_t s = 1; s <= steps; s++) {
        double l_ref, l_par, n_ref, n_par;
        int c_ref, c_par;
        int ok = step(ref, gb, s, qb_mode, &l_ref, s == 1 ? g_ref : NULL, &n_ref, &c_ref, &err) == K3C_OK;
        CHECK(ok, "reference step %lld: %s", (long long)s, err.msg);
        ok = ok && step(par, gb, s, qb_mode, &l_par, s == 1 ? g_par : NULL, &n_par, &c_par, &err) == K3C_OK;
        CHECK(ok, "parallel step %lld: %s", (long long)s, err.msg);
        if (!ok) return 0;
        *loss_rel = fmax(*loss_rel, fabs(l_par - l_ref) / fabs(l_ref));
        CHECK(c_par == c_ref, "step %lld: QK-Clip scaled %d heads, one process %d", (long long)s, c_par, c_ref);
        *clipped += c_ref;
        if (s == 1) *norm1 = n_ref;
    }
    return 1;
}

/* The single process against itself on the same documents in reverse order (exact arithmetic: the same step): how
 * far fp32 summation order alone moves the 3-step result. Printed for context, not checked. */
static double fp32_floor(const k3c_config *cfg, const batch *gb, const runner *ref, int qb_mode) {
    k3c_err err = {0};
    batch rb;
    reverse_docs(gb, &rb);
    runner r2;
    double l, nn, d = NAN;
    int cc, ok = runner_init(&r2, cfg, NULL, 1, 1, 1, 1, &err) == K3C_OK;
    for (int64_t s = 1; ok && s <= STEPS; s++) ok = step(&r2, &rb, s, qb_mode, &l, NULL, &nn, &cc, &err) == K3C_OK;
    const char *worst;
    if (ok) d = max_rel(&ref->m.table, r2.m.w, ref->m.w, -1, &worst);
    runner_free(&r2);
    return d;
}

/* Exact QB: 3 steps, loss, step-1 gradients, then every weight, router bias and optimizer-state entry within TOL.
 * A router bias is a mean-free offset on sigmoid scores in (0, 1), computed from differences of those scores, that
 * shrinks towards 0 as the router balances: its own magnitude is no scale for its error (relative to itself the fp32
 * floor below reaches 1.7e-5), the scores it shifts are, so biases are compared on that scale (absolute, scale 1);
 * the relative figure is printed too.
 * Histogram QB is a step function of the scores (a score one ulp across a bin edge moves the bias by up to a bin
 * width, and the next step routes differently), so it is compared over one step: loss, gradients and weights within
 * TOL, router biases within one bin width (the estimator's resolution, docs/MODEL.md §7.3). */
/* Residency: an EP rank holds its E/ep experts' w1, w3, w2 of every MoE layer and nothing more of them, a pipeline
 * stage its layers' entries (with the embedding or the head on the first or last stage) and nothing of the others, and
 * both start from the values the one-process init gives them (held_part); returns 1 when that fails. */
static int held_check(const runner *ref, const runner *par, k3c_comm *comm) {
    const k3c_param_table *w = &ref->m.table, *h = &par->m.table;
    const k3c_config *c = &ref->m.cfg;
    const k3c_residency *r = &h->res;
    if (h->total == w->total) return 0;
    int64_t fewer = 0, I = c->moe_intermediate_size, L = c->latent_dim > 0 ? c->latent_dim : c->hidden_size;
    for (int i = 0; i < w->n; i++) { /* what the residency leaves out, entry by entry */
        const k3c_param *p = &w->p[i];
        const int at = p->layer >= 0 ? p->layer : i == 0 ? 0 : (int)c->num_layers - 1;
        if (at < r->layer0 || at >= r->layer1)
            fewer += p->numel;
        else if (p->stack)
            fewer += (w->experts - r->experts) * I * L; /* (E − E/ep) matrices of I·L */
        else if (r->tp_size > 1 && (p->tp_split == K3C_TP_ROWS || p->tp_split == K3C_TP_COLS))
            fewer += p->numel - p->used / r->tp_size; /* its TP share (K3's A_log: of the used part) */
    }
    CHECK(w->total - h->total == (size_t)fewer && r->experts * (w->experts / r->experts) == w->experts,
          "rank %d holds experts [%lld, %lld) of %lld, layers [%d, %d) and TP share %d of %d: %zu parameters, one "
          "process %zu (want %lld fewer)",
          comm->rank, (long long)r->expert0, (long long)(r->expert0 + r->experts), (long long)w->experts, r->layer0,
          r->layer1, r->tp_rank, r->tp_size, h->total, w->total, (long long)fewer);
    k3c_model fresh; /* the one-process init at this rank's residency equals its part of the whole init */
    k3c_err err = {0};
    int bad = k3c_model_create_resident_f32(&ref->m.cfg, 0, r, &fresh, &err) != K3C_OK;
    float *part = malloc(sizeof(float) * h->total);
    if (!bad) {
        k3c_model whole;
        bad = k3c_model_create_f32(&ref->m.cfg, 0, &whole, &err) != K3C_OK;
        if (!bad) {
            k3c_model_init_f32(&whole, 7, 0.1);
            k3c_model_init_f32(&fresh, 7, 0.1);
            held_part(&whole.table, h, whole.w, part);
            bad = memcmp(part, fresh.w, sizeof(float) * h->total) != 0;
            k3c_model_free_f32(&whole);
        }
        k3c_model_free_f32(&fresh);
    }
    free(part);
    CHECK(!bad, "rank %d: the held part's init differs from the one-process init (%s)", comm->rank, err.msg);
    if (comm->rank == 0 && !bad)
        printf("residency: rank 0 holds experts [%lld, %lld), layers [%d, %d), TP share %d of %d: %zu parameters, one "
               "process %zu\n",
               (long long)r->expert0, (long long)(r->expert0 + r->experts), r->layer0, r->layer1, r->tp_rank,
               r->tp_size, h->total, w->total);
    return bad;
}

/* out (the layout of t: par's table with whole tensors; so: its state layout, NULL for weights or gradients) ← x
 * (par's layout; xo: its state layout, NULL likewise), a TP group's shares gathered whole on its TP rank 0 (the other
 * TP ranks' out is not written for them). */
static int whole_of(runner *par, const k3c_param_table *t, const k3c_optim *xo, const k3c_optim *so, const float *x,
                    float *out, k3c_err *err) {
    const k3c_param_table *h = &par->m.table;
    size_t most = 1; /* per rank: an entry's numel times its blocks */
    for (int i = 0; par->d.tp_comm && i < h->n; i++) {
        const size_t len = xo ? k3c_optim_entry_floats(xo, i) : (size_t)h->p[i].numel;
        most = len > most ? len : most;
    }
    if (par->d.tp_comm) CHECK_RC(k3c_tp_gather_room(&par->d.tp, most, err));
    for (int i = 0; i < h->n; i++) {
        const k3c_param *p = &h->p[i];
        const size_t len = xo ? k3c_optim_entry_floats(xo, i) : (size_t)p->numel;
        const float *src = x + (xo ? xo->state_off[i] : p->offset);
        float *dst = out + (so ? so->state_off[i] : t->p[i].offset);
        if (!p->numel || !len) continue;
        if (p->tp_share)
            CHECK_RC(k3c_tp_gather_entry(&par->d.tp, p, src, (int64_t)(len / (size_t)p->numel), dst, err));
        else
            memcpy(dst, src, sizeof(float) * len);
    }
    return K3C_OK;
}

/* layers > 0: the model's first `layers` layers only (3: pipeline stages of uneven depth, 2 + 1). */
static void compare_layers(k3c_comm *comm, int layers, int ep, int pp, int tp, int cp, int qb_mode) {
    k3c_err err = {0};
    k3c_config cfg;
    if (k3c_config_load("configs/k3_test_tiny.json", &cfg, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    tp_variant(&cfg, tp);
    if (layers > 0) cfg.num_layers = layers; /* the per-layer plan of the first ones stays as it is */
    batch gb;
    if (cp > 1)
        make_batch_cp(&gb);
    else
        make_batch(&gb);
    runner ref, par;
    int ok = runner_init(&ref, &cfg, NULL, 1, 1, 1, 1, &err) == K3C_OK;
    ok = ok && runner_init(&par, &cfg, comm, ep, pp, tp, cp, &err) == K3C_OK;
    CHECK(ok, "setup: %s", err.msg);
    if (!ok) return;
    const int steps = qb_mode == K3C_QB_EXACT ? STEPS : 1;
    /* everything compared in the parallel rank's layout (with EP its experts only, with PP its stage's layers) with
       whole tensors (TP: its TP group's shares gathered, on its TP rank 0): the reference's part of it */
    k3c_param_table wt = {0};
    k3c_optim wo = par.opt;
    wo.state_off = NULL, wo.ws = NULL;
    if (tp > 1) {
        k3c_residency r = par.m.table.res;
        r.tp_rank = 0, r.tp_size = 1;
        ok = k3c_params_build_resident(&cfg, &r, &wt, &err) == K3C_OK && k3c_optim_layout(&wo, &wt, &err) == K3C_OK;
        CHECK(ok, "whole table: %s", err.msg);
    }
    const k3c_param_table *t = tp > 1 ? &wt : &par.m.table;
    const k3c_optim *so = tp > 1 ? &wo : &par.opt;
    const int judge = tp < 2 || par.d.tp.rank == 0; /* a TP group's figures from its rank 0 (the others' are 0) */
    size_t n = t->total, N = ref.m.table.total;
    float *g_ref = malloc(sizeof(float) * N), *g_par = malloc(sizeof(float) * (par.m.table.total + 1)),
          *b0 = malloc(sizeof(float) * n), *rw = malloc(sizeof(float) * n), *rg = malloc(sizeof(float) * n),
          *rs = malloc(sizeof(float) * (so->state_numel + 1)), *pw = malloc(sizeof(float) * n),
          *pg = malloc(sizeof(float) * n), *ps = malloc(sizeof(float) * (so->state_numel + 1));
    float *st = malloc(sizeof(float) * (par.opt.state_numel + 1)); /* each stage its own entries' (residency) */
    held_part(&ref.m.table, t, ref.m.w, b0); /* the biases before the step set the histogram range */
    double loss_rel = 0, norm1 = 0;
    int clipped = 0, bias_moved = 0;
    if (!ok || !run_both(&ref, &par, &gb, steps, qb_mode, g_ref, g_par, &loss_rel, &norm1, &clipped)) goto out;
    held_part(&ref.m.table, t, ref.m.w, rw);
    held_part(&ref.m.table, t, g_ref, rg);
    held_state(&ref.m.table, &ref.opt, t, so, ref.state, rs);
    if (held_check(&ref, &par, comm)) goto out;
    CHECK_OK(k3c_dp_gather_state(&par.d.dp, par.state, st, &err), &err);
    CHECK_OK(whole_of(&par, t, NULL, NULL, par.m.w, pw, &err), &err);
    CHECK_OK(whole_of(&par, t, NULL, NULL, g_par, pg, &err), &err);
    CHECK_OK(whole_of(&par, t, &par.opt, so, st, ps, &err), &err);
    const char *wg = "-", *ww = "-", *wb = "-";
    double g_rel = judge ? max_rel(t, pg, rg, -1, &wg) : 0, w_rel = 0, b_rel = 0, b_abs = 0, b_bins = 0;
    for (int i = 0; judge && i < t->n; i++) { /* weights other than the router biases */
        const k3c_param *p = &t->p[i];
        double r = test_rel_err_f(pw + p->offset, rw + p->offset, (size_t)p->numel);
        if (p->kind != K3C_PK_ROUTER_BIAS && r > w_rel) w_rel = r, ww = p->name;
    }
    b_rel = judge ? max_rel(t, pw, rw, K3C_PK_ROUTER_BIAS, &wb) : 0;
    for (int l = t->res.layer0; judge && l < t->res.layer1; l++) { /* the rank's layers (a stage holds its own) */
        if (cfg.ffn[l] != K3C_FFN_MOE) continue;
        const float *bp = pw + t->layer[l].router_bias, *br = rw + t->layer[l].router_bias,
                    *bb = b0 + t->layer[l].router_bias;
        float lo = bb[0], hi = bb[0];
        for (int j = 0; j < cfg.num_experts; j++) lo = fminf(lo, bb[j]), hi = fmaxf(hi, bb[j]);
        double width = (hi - lo + 2.0) / K3C_QB_BINS; /* k3c_qb_hist_begin's range */
        for (int j = 0; j < cfg.num_experts; j++) {
            b_abs = fmax(b_abs, fabs((double)bp[j] - br[j]));
            b_bins = fmax(b_bins, fabs((double)bp[j] - br[j]) / width);
            bias_moved |= br[j] != 0;
        }
    }
    double s_rel = judge ? max_rel_state(so, ps, rs) : 0;
    /* each rank compares the part it holds: the figures are the worst rank's */
    double fig[8] = {loss_rel, g_rel, w_rel, b_rel, b_abs, b_bins, s_rel, bias_moved};
    CHECK_OK(k3c_comm_allreduce(comm, fig, fig, 8, K3C_F64, K3C_COMM_MAX, NULL, &err), &err);
    loss_rel = fig[0], g_rel = fig[1], w_rel = fig[2], b_rel = fig[3], b_abs = fig[4], b_bins = fig[5], s_rel = fig[6];
    bias_moved = fig[7] > 0;
    CHECK(loss_rel <= TOL, "loss: relative difference %.3e", loss_rel);
    CHECK(g_rel <= TOL, "step-1 gradients: relative difference %.3e (%s)", g_rel, wg);
    CHECK(w_rel <= TOL, "weights after %d steps: relative difference %.3e (%s)", steps, w_rel, ww);
    if (qb_mode == K3C_QB_EXACT) /* on the scale of the scores the bias shifts (see the comment above) */
        CHECK(b_abs <= TOL, "router biases after %d steps: difference %.3e (relative to themselves %.3e, %s)", steps,
              b_abs, b_rel, wb);
    else
        CHECK(b_bins <= 1.0, "router biases after one step: %.3g histogram bins apart", b_bins);
    /* the test must exercise what it claims: clipping, QK-Clip and balancing all acted */
    CHECK(norm1 > GRAD_CLIP && clipped > 0 && bias_moved, "clipping (norm %.3g), QK-Clip (%d heads) or QB did not act",
          norm1, clipped);
    CHECK(s_rel <= TOL, "optimizer state after %d steps: relative difference %.3e", steps, s_rel);
    /* ZeRO-1 keeps every rank's weights identical: the all-gathered w has no spread across the ranks holding them (all
       ranks, or a stage's; for the experts under EP, the ranks holding the same ones; for TP shares, the ranks of the
       same TP rank) */
    const k3c_param_table *pt = &par.m.table;
    float *lo = malloc(sizeof(float) * pt->total), *hi = malloc(sizeof(float) * pt->total);
    for (int pass = 0; pass < 3; pass++) {
        k3c_comm *c = pass == 1 ? par.d.x_comm : pass == 2 ? par.d.t_comm : par.d.use_pp ? par.d.stage_comm : comm;
        if (!c) continue;
        CHECK_OK(k3c_comm_allreduce(c, par.m.w, lo, (int64_t)pt->total, K3C_F32, K3C_COMM_MIN, NULL, &err), &err);
        CHECK_OK(k3c_comm_allreduce(c, par.m.w, hi, (int64_t)pt->total, K3C_F32, K3C_COMM_MAX, NULL, &err), &err);
        size_t spread = 0;
        for (int i = 0; i < pt->n; i++) {
            const int cls = par.d.x_comm && pt->p[i].stack ? 1 : pt->p[i].tp_share ? 2 : 0;
            if (cls == pass)
                spread +=
                    memcmp(lo + pt->p[i].offset, hi + pt->p[i].offset, sizeof(float) * (size_t)pt->p[i].numel) != 0;
        }
        CHECK(spread == 0, "weights differ between ranks (%zu entries%s)", spread,
              pass == 1   ? ", experts"
              : pass == 2 ? ", TP shares"
                          : "");
    }
    CHECK(par.d.dp.shard.state_numel < ref.opt.state_numel || comm->size == 1,
          "ZeRO-1: rank %d holds %zu of %zu state floats", comm->rank, par.d.dp.shard.state_numel, ref.opt.state_numel);
    if (comm->rank == 0) {
        printf("%d layers, dp=%d ep=%d tp=%d pp=%d cp=%d qb=%s, %d step%s: relative differences loss %.2e, step-1 "
               "gradients "
               "%.2e, weights %.2e, router biases %.2e (absolute %.2e, %.2g bins), optimizer state %.2e; ZeRO-1 "
               "state %zu of %zu floats on rank 0\n",
               (int)cfg.num_layers, comm->size / ep / pp / tp / cp, ep, tp, pp, cp, qb_mode ? "histogram" : "exact",
               steps, steps > 1 ? "s" : "", loss_rel, g_rel, w_rel, b_rel, b_abs, b_bins, s_rel,
               par.d.dp.shard.state_numel, ref.opt.state_numel);
        if (qb_mode == K3C_QB_EXACT && comm->size > 1)
            printf("  fp32 floor: one process on the documents reversed differs from itself by %.2e\n",
                   fp32_floor(&cfg, &gb, &ref, qb_mode));
    }
    free(lo);
    free(hi);
out:
    free(st);
    free(g_ref);
    free(g_par);
    free(b0);
    free(rw), free(rg), free(rs), free(pw), free(pg), free(ps);
    k3c_params_free(&wt);
    k3c_optim_free(&wo);
    runner_free(&ref);
    runner_free(&par);
}

static void compare(k3c_comm *comm, int ep, int pp, int tp, int cp, int qb_mode) {
    compare_layers(comm, 0, ep, pp, tp, cp, qb_mode);
}

/* One float64 forward and backward of m (initialised like the runners) over b: *loss, gradients in m->g. */
static void f64_loss_grad(k3c_model *m, const k3c_model_batch *b, double *loss) {
    k3c_err err = {0};
    k3c_arena ar;
    k3c_acts *acts;
    k3c_model_init_f64(m, 7, 0.1);
    m->kda_chunk = 16;
    CHECK_OK(k3c_arena_init(&ar, k3c_model_plan_bytes_f64(m, b->T, b->n_docs), &err), &err);
    CHECK_OK(k3c_model_forward_f64(m, b, &ar, &acts, loss, NULL, &err), &err);
    CHECK_OK(k3c_model_backward_f64(m, acts, 1.0, &err), &err);
    k3c_arena_free(&ar);
}

/* Largest per-entry relative difference of two float64 models' gradients (*worst: its entry). */
static double f64_grad_rel(const k3c_model *x, const k3c_model *ref, const char **worst) {
    double m = 0;
    for (int i = 0; i < ref->table.n; i++) {
        const k3c_param *p = &ref->table.p[i];
        double r = test_rel_err_d((double *)x->g + p->offset, (double *)ref->g + p->offset, (size_t)p->numel);
        if (r > m) m = r, *worst = p->name;
    }
    return m;
}

/* In float64 the decomposition itself is checked: the ranks' losses (each over its share, normalised by the global
 * count of targets) and gradients summed over the ranks equal the whole batch's to 1e-12; with cp > 1 the shares are
 * context-parallel token ranges (the state, conv tails and latents exchanged), and with `trim` the batch loses its
 * last (one-token) piece, 159 tokens, so the ranges are uneven (one token apart). */
static void f64_exact(k3c_comm *comm, int cp, int trim) {
    k3c_err err = {0};
    k3c_config cfg;
    k3c_model whole, part;
    k3c_optim o;
    k3c_dp dp;
    k3c_cp cpx;
    k3c_comm *cp_comm = NULL;
    batch gb;
    if (cp > 1)
        make_batch_cp(&gb);
    else
        make_batch(&gb);
    const int64_t T = trim ? gb.cu[--gb.n_docs] : T_BATCH;
    if (k3c_config_load("configs/k3_test_tiny.json", &cfg, &err) || k3c_model_create_f64(&cfg, 1, &whole, &err) ||
        k3c_model_create_f64(&cfg, 1, &part, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    k3c_optim_defaults(&o);
    CHECK_OK(k3c_optim_init(&o, &whole.table, &err), &err);
    CHECK_OK(k3c_dp_init(&dp, comm, k3c_backend_cpu_f32(), &o, &whole.table, &err), &err);
    if (cp > 1) {
        CHECK_OK(k3c_comm_split(comm, comm->rank / cp, comm->rank, &cp_comm, &err), &err);
        CHECK_OK(k3c_cp_init(&cpx, cp_comm, &part, T_BATCH, &err), &err);
        part.context = &cpx.exchange;
    }
    k3c_model *m[2] = {&whole, &part};
    double loss[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        k3c_model_batch b = {T, gb.n_docs, gb.ids, gb.cu, gb.targets, 0, 0, NULL, NULL, NULL, NULL};
        if (i) CHECK_OK(cp > 1 ? k3c_cp_split_batch(&cpx, &dp, &b, &err) : k3c_dp_split_batch(&dp, &b, &err), &err);
        f64_loss_grad(m[i], &b, &loss[i]);
    }
    CHECK_OK(k3c_dp_sum(&dp, &loss[1], &err), &err);
    CHECK_OK(k3c_comm_allreduce(comm, part.g, part.g, (int64_t)part.table.total, K3C_F64, K3C_COMM_SUM, NULL, &err),
             &err);
    const char *worst = "-";
    double g_rel = f64_grad_rel(&part, &whole, &worst), l_rel = fabs(loss[1] - loss[0]) / fabs(loss[0]);
    CHECK(l_rel <= 1e-12 && g_rel <= 1e-12, "float64: loss %.3e, gradients %.3e relative (%s)", l_rel, g_rel, worst);
    if (comm->rank == 0)
        printf("dp=%d cp=%d float64, %lld tokens: loss %.2e, gradients %.2e (relative differences; the decomposition "
               "is exact)\n",
               comm->size / cp, cp, (long long)T, l_rel, g_rel);
    if (cp_comm) {
        k3c_cp_free(&cpx);
        k3c_comm_free(cp_comm);
    }
    k3c_dp_free(&dp);
    k3c_optim_free(&o);
    k3c_model_free_f64(&whole);
    k3c_model_free_f64(&part);
}

/* Tensor parallelism in float64 over all the ranks: the loss on every rank and the gradients (the ranks' shares summed,
 * replicated entries counted once) equal the single process's to 1e-12: the split itself is exact, only the order of
 * the sums differs. */
static void f64_tp(k3c_comm *comm) {
    const int tp = comm->size;
    k3c_err err = {0};
    k3c_config cfg;
    k3c_model whole, part;
    batch gb;
    make_batch(&gb);
    if (tp < 2) return;
    if (k3c_config_load("configs/k3_test_tiny.json", &cfg, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    tp_variant(&cfg, tp);
    k3c_residency share = k3c_residency_whole(&cfg);
    share.tp_rank = comm->rank, share.tp_size = tp;
    if (k3c_model_create_f64(&cfg, 1, &whole, &err) || k3c_model_create_resident_f64(&cfg, 1, &share, &part, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    k3c_tp t;
    CHECK_OK(k3c_tp_init(&t, comm, k3c_backend_cpu_f32(), &cfg, &part.table, &err), &err);
    part.tp = &t.hook;
    k3c_model_batch b = {T_BATCH, gb.n_docs, gb.ids, gb.cu, gb.targets, 0, 0, NULL, NULL, NULL, NULL};
    double loss[2] = {0, 0};
    f64_loss_grad(&whole, &b, &loss[0]);
    f64_loss_grad(&part, &b, &loss[1]); /* every rank the whole batch, its heads, widths and vocabulary rows */
    CHECK_OK(k3c_tp_dedup_grads(&t, &part.table, part.g, K3C_F64, &err), &err);
    const char *worst = "-";
    double g_rel = 0, l_rel = fabs(loss[1] - loss[0]) / fabs(loss[0]);
    for (int i = 0; i < part.table.n; i++) { /* a share's gradient is its rows' (or columns') whole one already */
        const k3c_param *p = &part.table.p[i];
        double *g = (double *)part.g + p->offset, *ref = malloc(sizeof(double) * (size_t)(p->numel + 1));
        if (!p->tp_share) CHECK_OK(k3c_comm_allreduce(comm, g, g, p->numel, K3C_F64, K3C_COMM_SUM, NULL, &err), &err);
        k3c_param_share_copy(p, comm->rank, sizeof(double), (double *)whole.g + whole.table.p[i].offset, ref, 0);
        double rel = test_rel_err_d(g, ref, (size_t)p->numel);
        if (rel > g_rel) g_rel = rel, worst = p->name;
        free(ref);
    }
    CHECK_OK(k3c_comm_allreduce(comm, &g_rel, &g_rel, 1, K3C_F64, K3C_COMM_MAX, NULL, &err), &err);
    CHECK(l_rel <= 1e-12 && g_rel <= 1e-12, "tp%d float64: loss %.3e, gradients %.3e relative (%s)", tp, l_rel, g_rel,
          worst);
    if (comm->rank == 0)
        printf("tp=%d float64: loss %.2e, gradients %.2e (relative differences; the split is exact)\n", tp, l_rel,
               g_rel);
    k3c_tp_free(&t);
    k3c_model_free_f64(&whole);
    k3c_model_free_f64(&part);
}

/* The tiny model (no gradients), its optimizer and ZeRO-1 over comm, for the split checks; 0 when the model failed. */
static int split_setup(k3c_comm *comm, k3c_model *m, k3c_optim *o, k3c_dp *dp) {
    k3c_err err = {0};
    k3c_config cfg;
    if (k3c_config_load("configs/k3_test_tiny.json", &cfg, &err) || k3c_model_create_f32(&cfg, 0, m, &err)) {
        CHECK(0, "%s", err.msg);
        return 0;
    }
    k3c_optim_defaults(o);
    CHECK_OK(k3c_optim_init(o, &m->table, &err), &err);
    CHECK_OK(k3c_dp_init(dp, comm, k3c_backend_cpu_f32(), o, &m->table, &err), &err);
    return 1;
}

static void split_free(k3c_model *m, k3c_optim *o, k3c_dp *dp) {
    k3c_dp_free(dp);
    k3c_optim_free(o);
    k3c_model_free_f32(m);
}

/* The batch split: consecutive whole pieces covering the batch, and a clear error for fewer pieces than ranks. */
static void split_rules(k3c_comm *comm) {
    k3c_err err = {0};
    batch gb;
    make_batch(&gb);
    k3c_model m;
    k3c_optim o;
    k3c_dp dp;
    if (!split_setup(comm, &m, &o, &dp)) return;
    k3c_model_batch b = {T_BATCH, gb.n_docs, gb.ids, gb.cu, gb.targets, 0, 0, NULL, NULL, NULL, NULL};
    CHECK_OK(k3c_dp_split_batch(&dp, &b, &err), &err);
    int64_t sum = 0, start = b.ids - gb.ids, before = 0;
    for (int r = 0; r < comm->size; r++) sum += dp.T_all[r], before += r < comm->rank ? dp.T_all[r] : 0;
    CHECK(sum == T_BATCH && start == before && b.cu_seqlens[0] == 0 && b.cu_seqlens[b.n_docs] == b.T,
          "split: %lld tokens in all, this rank's start %lld vs %lld", (long long)sum, (long long)start,
          (long long)before);
    k3c_model_batch one = {T_BATCH, 1, gb.ids, (int32_t[]){0, T_BATCH}, gb.targets, 0, 0, NULL, NULL, NULL, NULL};
    if (comm->size > 1)
        CHECK(k3c_dp_split_batch(&dp, &one, &err) == K3C_EINVAL && strstr(err.msg, "document pieces"),
              "one piece for %d ranks: %s", comm->size, err.msg);
    split_free(&m, &o, &dp);
}

/* ZeRO-1's gradient reduce-scatter: each rank's entries hold the sum over the ranks (rank r adds r + 1 times a
 * pattern: exact in float), everything else is zero; the global clip norm counts every entry once; the gather gives
 * every rank the whole sum. */
static void reduce_scatter_rules(k3c_comm *comm) {
    k3c_err err = {0};
    k3c_model m;
    k3c_optim o;
    k3c_dp dp;
    if (!split_setup(comm, &m, &o, &dp)) return;
    const size_t n = m.table.total;
    const int R = comm->size;
    float *g = malloc(sizeof(float) * n), *whole = malloc(sizeof(float) * n);
    void *inst = NULL;
    const k3c_backend_f32 *be = k3c_backend_cpu_f32();
    CHECK_OK(be->optim_open(be->ctx, &o, &m.table, &inst, &err), &err);
    for (size_t i = 0; i < n; i++) g[i] = (float)((comm->rank + 1) * (int)(i % 7 + 1));
    CHECK_OK(k3c_dp_reduce_grads(&dp, g, &err), &err);
    const float tri = (float)(R * (R + 1) / 2); /* Σ_r (r + 1) */
    size_t bad = 0, owned = 0;
    double ss = 0;
    for (int e = 0; e < m.table.n; e++)
        for (size_t i = m.table.p[e].offset; i < m.table.p[e].offset + (size_t)m.table.p[e].numel; i++) {
            const float want = tri * (float)(i % 7 + 1);
            bad += dp.mine[e] ? g[i] != want : g[i] != 0;
            owned += dp.mine[e];
            ss += (double)want * want;
        }
    CHECK(bad == 0, "reduce-scatter: %zu entries wrong on rank %d (owner of %zu elements)", bad, comm->rank, owned);
    double norm = 0;
    CHECK_OK(k3c_dp_clip_grad_norm(&dp, NULL, inst, &m.table, g, 0, &norm, &err), &err);
    double ref = 0; /* the router biases are not clipped (k3c_grad_norm) */
    for (int i = 0; i < m.table.n; i++)
        for (int64_t j = 0; m.table.p[i].kind != K3C_PK_ROUTER_BIAS && j < m.table.p[i].numel; j++) {
            const double x = tri * (double)((m.table.p[i].offset + (size_t)j) % 7 + 1);
            ref += x * x;
        }
    CHECK(fabs(norm - sqrt(ref)) <= 1e-12 * sqrt(ref), "global norm %.17g, want %.17g", norm, sqrt(ref));
    CHECK_OK(k3c_dp_gather_grads(&dp, &m.table, g, whole, &err), &err);
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += whole[i] != tri * (float)(i % 7 + 1);
    CHECK(bad == 0 && ss > 0, "gathered gradient: %zu entries wrong", bad);
    be->optim_close(inst);
    free(g), free(whole);
    split_free(&m, &o, &dp);
}

/* The gradient sum overlapped with the backward (k3c_dp_grads_begin / _finish) on a real step of the tiny model over
 * the ranks (dp, or with pp stages / tp groups inside): every layer's piece and the head's are started by the backward
 * itself (the hook ran once per layer of the stage and for its head, and those pieces are still in flight when the
 * backward returns), and the
 * reduced gradient equals k3c_dp_reduce_grads' (after k3c_tp_dedup_grads) of the same local gradients within 1e-6
 * per entry (the same elements summed over the same ranks; only the collective's summation order may differ). */
static void overlap_rules(k3c_comm *comm, int pp, int tp) {
    k3c_err err = {0};
    k3c_config cfg;
    if (k3c_config_load("configs/k3_test_tiny.json", &cfg, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    tp_variant(&cfg, tp);
    batch gb;
    make_batch(&gb);
    runner r;
    if (runner_init(&r, &cfg, comm, 1, pp, tp, 1, &err)) {
        CHECK(0, "overlap setup: %s", err.msg);
        runner_free(&r);
        return;
    }
    k3c_dp *dp = &r.d.dp;
    const size_t n = r.m.table.total;
    float *local = malloc(sizeof(float) * n), *over = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n);
    k3c_model_batch b = {T_BATCH, gb.n_docs, gb.ids, gb.cu, gb.targets, 0, 0, NULL, NULL, NULL, NULL};
    k3c_acts *acts;
    double loss;
    CHECK_OK(k3c_dp_split_batch(dp, &b, &err), &err);
    CHECK_OK(r.be->zero(r.m.g, (int64_t)n, &err), &err);
    CHECK_OK(k3c_dp_grads_begin(dp, &r.m, tp > 1 ? &r.d.tp : NULL, &err), &err);
    if (pp > 1) {
        CHECK_OK(k3c_pp_step(&r.d.pp, &r.m, &b, &r.ar, 1, &loss, &err), &err);
    } else {
        CHECK_OK(k3c_model_forward_f32(&r.m, &b, &r.ar, &acts, &loss, NULL, &err), &err);
        CHECK_OK(k3c_model_backward_f32(&r.m, acts, 1.0, &err), &err);
    }
    const int head = pp < 2 || r.d.pp.stage == r.d.pp.stages - 1; /* the stage ends with the head */
    /* every piece of the stage's layers and its head (a layer's entries of several classes: several pieces) */
    int pieces = 0;
    for (int p = 0; p < dp->n_pieces; p++) pieces += dp->piece[p].layer >= 0;
    const int hooked = dp->hooked, flying = dp->in_flight, layers = (int)cfg.num_layers / (pp > 1 ? pp : 1) + head;
    memcpy(local, r.m.g, sizeof(float) * n); /* the started pieces only read it */
    CHECK_OK(k3c_dp_grads_finish(dp, &r.m, &err), &err);
    memcpy(over, r.m.g, sizeof(float) * n);
    memcpy(r.m.g, local, sizeof(float) * n); /* the same local gradients, summed after the backward */
    if (tp > 1) CHECK_OK(k3c_tp_dedup_grads(&r.d.tp, &r.m.table, r.m.g, K3C_F32, &err), &err);
    CHECK_OK(k3c_dp_reduce_grads(dp, r.m.g, &err), &err);
    memcpy(ref, r.m.g, sizeof(float) * n);
    CHECK(hooked == pieces && pieces >= layers && flying == hooked && r.m.grads == NULL,
          "pp%d tp%d: %d pieces started during the backward (%d in flight at its end), %d of %d layers and heads", pp,
          tp, hooked, flying, pieces, layers);
    const char *worst = "-";
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) differ += memcmp(&over[i], &ref[i], sizeof(float)) != 0;
    double rel = max_rel(&r.m.table, over, ref, -1, &worst);
    CHECK(rel <= 1e-6, "pp%d tp%d: overlapped gradient sum %.3e from k3c_dp_reduce_grads' (%s)", pp, tp, rel, worst);
    if (comm->rank == 0)
        printf("overlap dp=%d pp=%d tp=%d: %d of %d pieces started during the backward; reduced gradients %s "
               "k3c_dp_reduce_grads' (%zu elements differ on rank 0, largest relative difference %.2e)\n",
               comm->size / (pp > 1 ? pp : 1) / (tp > 1 ? tp : 1), pp, tp, hooked, dp->n_pieces,
               differ ? "differ from" : "equal bit for bit", differ, rel);
    free(local), free(over), free(ref);
    runner_free(&r);
}

/* The context-parallel split: contiguous ranges in rank order covering the batch, pieces continued across them, and a
 * clear error for ranges shorter than the short conv's tail. */
static void cp_split_rules(k3c_comm *comm) {
    k3c_err err = {0};
    batch gb;
    make_batch_cp(&gb);
    k3c_model m;
    k3c_optim o;
    k3c_dp dp;
    k3c_cp cp;
    if (!split_setup(comm, &m, &o, &dp)) return;
    CHECK_OK(k3c_cp_init(&cp, comm, &m, T_BATCH, &err), &err);
    k3c_model_batch b = {T_BATCH, gb.n_docs, gb.ids, gb.cu, gb.targets, 0, 0, NULL, NULL, NULL, NULL};
    CHECK_OK(k3c_cp_split_batch(&cp, &dp, &b, &err), &err);
    const k3c_context_exchange *x = &cp.exchange;
    int64_t sum = 0, start = b.ids - gb.ids, before = 0;
    for (int r = 0; r < comm->size; r++) sum += dp.T_all[r], before += r < comm->rank ? dp.T_all[r] : 0;
    CHECK(sum == T_BATCH && start == before && x->start == start && x->T_keys == start + b.T &&
              b.cu_seqlens[b.n_docs] == b.T && b.loss_norm == T_BATCH - gb.n_docs,
          "cp split: %lld tokens in all, this rank's start %lld vs %lld", (long long)sum, (long long)start,
          (long long)before);
    CHECK(x->cont_prev == (comm->rank > 0) && x->cont_next == (comm->rank < comm->size - 1),
          "cp split: every boundary of this batch cuts a piece (rank %d: %d %d)", comm->rank, x->cont_prev,
          x->cont_next);
    int32_t cu_short[2] = {0, (int32_t)(2 * comm->size)};
    k3c_model_batch tiny = {2 * comm->size, 1, gb.ids, cu_short, gb.targets, 0, 0, NULL, NULL, NULL, NULL};
    CHECK(k3c_cp_split_batch(&cp, &dp, &tiny, &err) == K3C_EINVAL && strstr(err.msg, "short conv's tail of 3"),
          "ranges of 2 tokens: %s", err.msg);
    k3c_cp_free(&cp);
    split_free(&m, &o, &dp);
}

/* The run config's parallel block against the world and the model. */
static void layouts(void) {
    k3c_err err = {0};
    k3c_config cfg;
    if (k3c_config_load("configs/k3_test_tiny.json", &cfg, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    k3c_parallel out;
    CHECK(k3c_parallel_resolve(&(k3c_parallel){0}, &cfg, 4, "run.json", &out, &err) == 0 && out.dp == 4 && out.ep == 1,
          "no block: dp = world (%s)", err.msg);
    CHECK(k3c_parallel_resolve(&(k3c_parallel){2, 1, 1, 1, 1, 0}, &cfg, 4, "run.json", &out, &err) == K3C_ECONFIG &&
              strstr(err.msg, "run.json") && strstr(err.msg, "4"),
          "product vs world: %s", err.msg);
    CHECK(k3c_parallel_resolve(&(k3c_parallel){1, 3, 1, 1, 1, 0}, &cfg, 3, "run.json", &out, &err) == K3C_ECONFIG &&
              strstr(err.msg, "4 routed experts"),
          "ep not dividing experts: %s", err.msg);
    CHECK(k3c_parallel_resolve(&(k3c_parallel){1, 1, 4, 1, 1, 0}, &cfg, 4, "run.json", &out, &err) == K3C_ECONFIG &&
              strstr(err.msg, "heads"),
          "tp not dividing heads: %s", err.msg);
    k3c_config odd = cfg; /* tp2 divides the heads but not 31 vocabulary rows, nor 15 rows of the dense MLP */
    odd.vocab_size = 31;
    CHECK(k3c_parallel_resolve(&(k3c_parallel){1, 1, 2, 1, 1, 0}, &odd, 2, "run.json", &out, &err) == K3C_ECONFIG &&
              strstr(err.msg, "parallel.tp = 2 does not divide the model's 31 vocabulary rows"),
          "tp not dividing the vocabulary: %s", err.msg);
    odd = cfg;
    odd.intermediate_size = 15;
    CHECK(k3c_parallel_resolve(&(k3c_parallel){1, 1, 2, 1, 1, 0}, &odd, 2, "run.json", &out, &err) == K3C_ECONFIG &&
              strstr(err.msg, "15 dense MLP intermediate rows"),
          "tp not dividing the MLP: %s", err.msg);
    CHECK(k3c_parallel_resolve(&(k3c_parallel){2, 1, 2, 1, 1, 0}, &cfg, 4, "run.json", &out, &err) == 0 && out.tp == 2,
          "dp2×tp2 on 4 ranks: %s", err.msg);
    CHECK(k3c_parallel_resolve(&(k3c_parallel){1, 2, 2, 1, 1, 0}, &cfg, 4, "run.json", &out, &err) == 0 &&
              out.ep == 2 && out.tp == 2,
          "ep2×tp2 on 4 ranks: %s", err.msg);
    CHECK(k3c_parallel_resolve(&(k3c_parallel){1, 1, 1, 3, 1, 0}, &cfg, 3, "run.json", &out, &err) == 0 && out.pp == 3,
          "pp3 of 4 layers (stages 2 + 1 + 1): %s", err.msg);
    CHECK(k3c_parallel_resolve(&(k3c_parallel){1, 1, 1, 5, 1, 0}, &cfg, 5, "run.json", &out, &err) == K3C_ECONFIG &&
              strstr(err.msg, "parallel.pp = 5 is more stages than the model's 4 layers"),
          "pp beyond the layers: %s", err.msg);
    CHECK(k3c_parallel_resolve(&(k3c_parallel){1, 1, 2, 1, 2, 0}, &cfg, 4, "run.json", &out, &err) == 0 &&
              out.cp == 2 && out.tp == 2,
          "cp2×tp2 on 4 ranks: %s", err.msg);
    CHECK(k3c_parallel_resolve(&(k3c_parallel){1, 1, 1, 2, 2, 0}, &cfg, 4, "run.json", &out, &err) == 0 &&
              out.cp == 2 && out.pp == 2,
          "cp2×pp2 on 4 ranks: %s", err.msg);
    CHECK(k3c_parallel_resolve(&(k3c_parallel){2, 1, 1, 1, 2, 0}, &cfg, 4, "run.json", &out, &err) == 0 && out.cp == 2,
          "dp2×cp2 on 4 ranks: %s", err.msg);
    CHECK(k3c_parallel_resolve(&(k3c_parallel){2, 1, 1, 2, 1, 0}, &cfg, 4, "run.json", &out, &err) == 0 &&
              out.pp == 2 && out.micro_batches == 2,
          "dp2×pp2 on 4 ranks: %s", err.msg);
    CHECK(k3c_parallel_resolve(&(k3c_parallel){1, 2, 1, 2, 1, 0}, &cfg, 4, "run.json", &out, &err) == 0 &&
              out.ep == 2 && out.pp == 2,
          "ep2×pp2 on 4 ranks: %s", err.msg);
}

/* The bf16 wire of expert parallelism, forced on the CPU (whose tables leave wire_bf16 at 0): ep = size against one
 * float32 process over one step. Every row that crosses ranks (token rows, expert outputs, output and input
 * gradients) is rounded once to bf16 — a relative 2^-9 = 2.0e-3 at most per element — and all sums stay float32, so
 * the loss and the step-1 gradients may differ by that rounding carried through the layers, not more: BF16_TOL
 * 1e-2 (five units of the bf16 rounding; measured below it, printed). The difference must also exceed the float32
 * wire's TOL, or the rows did not travel as bf16. */
#define BF16_TOL 1e-2
static void ep_bf16_wire(k3c_comm *comm) {
    k3c_err err = {0};
    k3c_config cfg;
    if (k3c_config_load("configs/k3_test_tiny.json", &cfg, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    batch gb;
    make_batch(&gb);
    runner ref, par;
    int ok = runner_init(&ref, &cfg, NULL, 1, 1, 1, 1, &err) == K3C_OK;
    ok = ok && runner_init(&par, &cfg, comm, comm->size, 1, 1, 1, &err) == K3C_OK;
    CHECK(ok, "setup: %s", err.msg);
    if (!ok) return;
    par.d.ep.wire_bf16 = 1;
    const k3c_param_table *t = &par.m.table; /* this rank's layout (its experts only): the reference's part of it */
    float *g_ref = malloc(sizeof(float) * ref.m.table.total), *g_par = malloc(sizeof(float) * t->total),
          *rg = malloc(sizeof(float) * t->total);
    double loss_rel = 0, norm1 = 0;
    int clipped = 0;
    if (run_both(&ref, &par, &gb, 1, K3C_QB_EXACT, g_ref, g_par, &loss_rel, &norm1, &clipped)) {
        const char *wg = "-";
        held_part(&ref.m.table, t, g_ref, rg);
        double g_rel = max_rel(t, g_par, rg, -1, &wg);
        CHECK(loss_rel <= BF16_TOL, "bf16 wire, ep=%d: loss relative difference %.3e", comm->size, loss_rel);
        CHECK(g_rel <= BF16_TOL, "bf16 wire, ep=%d: step-1 gradients %.3e (%s)", comm->size, g_rel, wg);
        CHECK(g_rel > TOL, "bf16 wire, ep=%d: gradients %.3e within the float32 tolerance: no bf16 on the wire?",
              comm->size, g_rel);
        if (comm->rank == 0)
            printf("ep=%d with the bf16 wire, 1 step: relative differences loss %.2e, step-1 gradients %.2e (%s); "
                   "tolerance %g\n",
                   comm->size, loss_rel, g_rel, wg, BF16_TOL);
    }
    free(g_ref);
    free(g_par);
    free(rg);
    runner_free(&ref);
    runner_free(&par);
}

/* Every layout of the ranks there are: dp, ep, pp, tp and cp = size; on 4 ranks dp2×ep2, dp2×pp2, dp2×tp2, tp2×pp2,
 * ep2×pp2, ep2×tp2, dp2×cp2 and cp2×ep2; on 8 ranks ep2×tp2×pp2 only. */
static void run_all(k3c_comm *comm) {
    if (comm->size == 16) { /* the four kinds that split the model, at once (K3's layouts at scale) */
        compare(comm, 2, 2, 2, 2, K3C_QB_EXACT);
        return;
    }
    if (comm->size == 8) { /* three-way only: ep2×tp2×pp2 (EP beside TP inside the stages), cp2×tp2×pp2, ep2×cp2×tp2 */
        compare(comm, 2, 2, 2, 1, K3C_QB_EXACT);
        compare(comm, 1, 2, 2, 2, K3C_QB_EXACT);
        compare(comm, 2, 1, 2, 2, K3C_QB_EXACT);
        return;
    }
    split_rules(comm);
    reduce_scatter_rules(comm);
    overlap_rules(comm, 1, 1);
    for (int pp = 2; pp <= comm->size && pp <= 2; pp *= 2) overlap_rules(comm, pp, 1); /* pp2, dp2×pp2 */
    for (int tp = 2; tp <= comm->size && tp <= 2; tp *= 2) overlap_rules(comm, 1, tp); /* tp2, dp2×tp2 */
    if (comm->size == 4) overlap_rules(comm, 2, 2);                                    /* tp2×pp2 */
    f64_exact(comm, 1, 0);
    f64_tp(comm);
    if (comm->size > 1) cp_split_rules(comm);
    for (int cp = 2; cp <= comm->size; cp *= 2) f64_exact(comm, cp, 0), f64_exact(comm, cp, 1);
    for (int ep = 1; ep <= comm->size; ep *= 2) {
        if (ep > 1 && ep < comm->size && ep != 2) continue;
        compare(comm, ep, 1, 1, 1, K3C_QB_EXACT);
        compare(comm, ep, 1, 1, 1, K3C_QB_HISTOGRAM);
    }
    if (comm->size > 1) ep_bf16_wire(comm);
    for (int pp = 2; pp <= comm->size; pp *= 2) /* pp = size, and dp2×pp2 on 4 ranks */
        compare(comm, 1, pp, 1, 1, K3C_QB_EXACT);
    for (int tp = 2; tp <= comm->size; tp *= 2) /* tp = size, and dp2×tp2 on 4 ranks */
        compare(comm, 1, 1, tp, 1, K3C_QB_EXACT);
    if (comm->size == 4) compare(comm, 1, 2, 2, 1, K3C_QB_EXACT);          /* tp2×pp2 */
    if (comm->size == 4) compare(comm, 2, 2, 1, 1, K3C_QB_EXACT);          /* ep2×pp2 */
    if (comm->size > 1) compare_layers(comm, 3, 1, 2, 1, 1, K3C_QB_EXACT); /* pp2 (dp2×pp2 on 4) of 2 + 1 layers */
    if (comm->size == 4) compare(comm, 2, 1, 2, 1, K3C_QB_EXACT);          /* ep2×tp2 */
    for (int cp = 2; cp <= comm->size; cp *= 2)                            /* cp = size, and cp2×dp2 on 4 ranks */
        compare(comm, 1, 1, 1, cp, K3C_QB_EXACT);
    if (comm->size == 4) compare(comm, 2, 1, 1, 2, K3C_QB_EXACT); /* cp2×ep2 */
    if (comm->size == 4) compare(comm, 1, 2, 1, 2, K3C_QB_EXACT); /* cp2×pp2: ranges of each micro-batch */
    if (comm->size == 4) compare(comm, 1, 1, 2, 2, K3C_QB_EXACT); /* cp2×tp2: a TP group per range */
}

int main(int argc, char **argv) {
    if (!k3c_comm_mpi_launched()) layouts();          /* the parent only: no communication */
    return test_mpi_main_ranks(argv[0], run_all, 16); /* 8: the three-way layouts, 16: the four-way one */
}
