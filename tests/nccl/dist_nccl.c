/* dist_nccl.c — the parallel training step on the CUDA backend over the NCCL communicator (src/parallel/, comm_nccl.cu)
 * equals the single-process CUDA step, and the CPU's: the tiny K3 model (configs/k3_test_tiny.json: KDA + MLA, 4
 * experts top-2, AttnRes) trained for 3 steps (Per-Head Muon + AdamW with clipping active, QK-Clip clipping heads, exact
 * quantile balancing) on one global batch of packed documents, for each of dp, ep, tp, pp (4 micro-batches, 1F1B) and cp
 * over all the ranks there are, and on 4 ranks dp2×ep2, dp2×tp2, dp2×pp2, tp2×pp2, dp2×cp2 and ep2×cp2 (the layouts of
 * test_dist_dp.c). Docs: docs/PARALLEL.md "Communicator", "Launch".
 *
 * Not a test_*.c (`make test` has no GPU): `make nccl` builds it as build/nccl/test_dist_nccl; run it from the
 * repository root. Alone it runs on GPU 0 over the one-rank NCCL communicator: every layout of one rank (dp1, ep1, tp1,
 * pp1, cp1) runs the whole parallel code path (the hooks, the host copies, the staged host buffers, EP's device-side
 * row moves), every collective a copy. Under `mpirun -np N` (one GPU per rank: GPU = the rank on its node) the NCCL id
 * travels over MPI.
 * `--cpu` runs the same layouts with the CPU backend in the GPU's place over MPI or one rank (where there is no GPU).
 *
 * The backend runs the fp32 checking kernels (K3C_KERNELS_FP32: the KDA recurrence and attention_naive) and fp32
 * GEMMs, so the whole step is fp32 as on the CPU: the bf16 tensor-core kernels round their operands, and a rounding
 * that flips with the summation order of a split grows through Muon and AdamW to 0.1–0.3 after 3 steps (measured),
 * which would hide any fault of the parallel code. The model is the CPU tests' (the fp32 kernels take its
 * 8-wide heads); `--config FILE` runs another. On the make-run model (configs/k3_tiny.json: 8 layers, width 128) the
 * GPU's own fp32 floor after 3 steps (documents reversed) is 8e-6, and ep1 and pp1 land at 1.2e-5 and 1.6e-5 (cuBLASLt
 * picks other algorithms for the split shapes): above this test's 1e-5 by the floor's width, not by a fault.
 *
 * Tolerances (relative ‖x − ref‖₂/‖ref‖₂ per parameter-table entry; router biases absolute, on the scale of the scores
 * they shift, as test_dist_dp.c explains): against the single-process CUDA step 1e-5, the CPU tests' tolerance (what
 * differs is the summation order of the split, as on the CPU; the GPU's own floor, one process on the documents
 * reversed, is printed next to it); against the single-process CPU step 1e-4 (both fp32: another KDA algorithm,
 * cuBLASLt's summation order), on the loss, the step-1 gradients, the weights that
 * start non-zero and the router biases (absolute). A tensor that starts at zero (the AttnRes pseudo-queries) is all
 * update, and AdamW's first steps are ±lr wherever a gradient element is within rounding of zero; the optimizer
 * state's second moments square the gradients' differences: both are printed against the CPU, checked only against
 * the CUDA process. A host-memory communicator is refused for device memory. */
#include "test.h"

#include "cuda/cuda_ops.h"

#include "dist_fixture.h"

#include <cuda_runtime_api.h>

#define STEPS 3
#define TOL 1e-5     /* against the single-process CUDA step */
#define CPU_TOL 1e-4 /* against the single-process CPU step (both fp32; ≤ 6.8e-6 seen) */
#define MICRO 4      /* pipeline micro-batches per step */
#define CONFIG "configs/k3_test_tiny.json" /* the CPU tests' model (test_dist_dp.c); --config FILE runs another */

/* A layout: the degrees of the parallel pieces over the communicator's ranks (0: the piece is not used; 1: it is,
 * over a group of one rank), dp being what remains. */
typedef struct {
    int ep, tp, pp, cp;
} layout;

/* be NULL: the CPU; comm NULL: one process, else the layout's pieces over comm (test_dist_dp.c's rank order). */
static int runner_init(runner *r, const k3c_config *cfg, const k3c_backend_f32 *be, k3c_comm *comm, layout lay,
                       k3c_err *err) {
    memset(r, 0, sizeof *r);
    /* EP: this rank's experts only, PP: its stage's layers only */
    const k3c_residency res = residency_of(cfg, comm ? comm->rank : 0, comm ? comm->size : 1, comm ? lay.ep : 1, lay.tp,
                                           comm ? lay.pp : 1, lay.cp);
    CHECK_RC(k3c_model_create_resident_f32(cfg, 1, &res, &r->m, err));
    k3c_model_init_f32(&r->m, 7, 0.1);
    r->m.kda_chunk = 64; /* the CUDA kernels' chunk */
    if (be) CHECK_RC(k3c_model_use_backend_f32(&r->m, be, err));
    r->be = k3c_model_backend_f32(&r->m);
    k3c_optim_defaults(&r->opt);
    CHECK_RC(k3c_optim_init(&r->opt, &r->m.table, err));
    CHECK_RC(pieces_init(&r->d, &r->m, r->be, &r->opt, comm, lay.ep, lay.tp, lay.pp, lay.cp, MICRO, T_BATCH, err));
    const k3c_optim *o = r->d.dist ? &r->d.dp.shard : &r->opt;
    size_t n_state = o->state_numel ? o->state_numel : 1;
    r->state = r->be->alloc(sizeof(float) * n_state);
    if (!r->state) return k3c_errf(err, K3C_ENOMEM, "optimizer state");
    CHECK_RC(r->be->optim_open(r->be->ctx, o, &r->m.table, &r->inst, err));
    CHECK_RC(k3c_step_stats_init_f32(&r->m, T_BATCH, &r->stats, err));
    r->m.stats = &r->stats;
    return k3c_model_arena_init_f32(&r->m, k3c_model_plan_bytes_f32(&r->m, T_BATCH, T_BATCH), &r->ar, err);
}

static void runner_free(runner *r) {
    const k3c_backend_f32 *be = r->be;
    if (!be) return;
    be->sync(NULL);
    if (r->inst) be->optim_close(r->inst);
    k3c_model_arena_free_f32(&r->m, &r->ar);
    k3c_step_stats_free_f32(&r->m, &r->stats);
    if (r->state) be->free(r->state);
    if (r->qb_ws) be->free(r->qb_ws);
    pieces_free(&r->d);
    k3c_model_free_f32(&r->m);
    k3c_optim_free(&r->opt);
}

/* Host copies of a runner's weights and full optimizer state of what it holds (under ZeRO-1 gathered from the shards;
 * a pipeline stage's entries only). */
static int fetch(runner *r, float *w, float *state, k3c_err *err) {
    if (r->d.dist) {
        CHECK_RC(k3c_dp_gather_state(&r->d.dp, r->state, state, err));
    } else if (state) {
        CHECK_RC(r->be->download(state, r->state, sizeof(float) * r->opt.state_numel, err));
    }
    return r->be->download(w, r->m.w, sizeof(float) * r->m.table.total, err);
}

typedef struct {
    double loss, grad, w, bias_abs, bias_rel, state;
    const char *worst_g, *worst_w;
} diffs;

/* w0 (or NULL): the weights before the steps; the entries that start at zero are then left out (all their value is
 * update, see the tolerances). */
static void weights_diff(const k3c_param_table *t, const float *x, const float *ref, const float *w0, diffs *d) {
    for (int i = 0; i < t->n; i++) {
        const k3c_param *p = &t->p[i];
        int64_t nz = 0;
        for (int64_t j = 0; w0 && p->kind != K3C_PK_ROUTER_BIAS && j < p->numel; j++) nz += w0[p->offset + j] != 0;
        if (w0 && p->kind != K3C_PK_ROUTER_BIAS && nz == 0) continue;
        double r = test_rel_err_f(x + p->offset, ref + p->offset, (size_t)p->numel);
        if (p->kind == K3C_PK_ROUTER_BIAS) {
            d->bias_rel = fmax(d->bias_rel, r);
            for (int64_t j = 0; j < p->numel; j++)
                d->bias_abs = fmax(d->bias_abs, fabs((double)x[p->offset + j] - ref[p->offset + j]));
        } else if (r > d->w) {
            d->w = r, d->worst_w = p->name;
        }
    }
}

static double grads_diff(const k3c_param_table *t, const float *x, const float *ref, const char **worst) {
    double m = 0;
    for (int i = 0; i < t->n; i++) {
        double r = test_rel_err_f(x + t->p[i].offset, ref + t->p[i].offset, (size_t)t->p[i].numel);
        if (r > m) m = r, *worst = t->p[i].name;
    }
    return m;
}

static double state_diff(const k3c_optim *o, const float *x, const float *ref) {
    double m = 0;
    for (int i = 0; i < o->n_entries; i++) {
        size_t a = o->state_off[i], b = i + 1 < o->n_entries ? o->state_off[i + 1] : o->state_numel;
        m = fmax(m, test_rel_err_f(x + a, ref + a, b - a));
    }
    return m;
}

/* The runners' 3 steps from the same state: *loss the largest relative loss difference, step-1 gradients into g. */
static int run_steps(runner *r, const batch *gb, double *losses, float *g1, double *norm1, int *clipped) {
    k3c_err err = {0};
    *clipped = 0;
    for (int64_t s = 1; s <= STEPS; s++) {
        double nn;
        int c;
        int ok = step(r, gb, s, K3C_QB_EXACT, &losses[s - 1], s == 1 ? g1 : NULL, &nn, &c, &err) == K3C_OK;
        CHECK(ok, "step %lld on %s: %s", (long long)s, r->be->name, err.msg);
        if (!ok) return 0;
        *clipped += c;
        if (s == 1) *norm1 = nn;
    }
    return 1;
}

/* The single CUDA process against itself on the documents reversed: the GPU's fp32 floor after 3 steps (printed). */
static double gpu_floor(const k3c_config *cfg, const k3c_backend_f32 *be, const batch *gb, const float *w_ref) {
    k3c_err err = {0};
    batch rb;
    reverse_docs(gb, &rb);
    runner r;
    double losses[STEPS], n1, d = NAN;
    int c;
    size_t n = 0;
    float *w = NULL;
    if (runner_init(&r, cfg, be, NULL, (layout){0}, &err) == K3C_OK && run_steps(&r, &rb, losses, NULL, &n1, &c)) {
        n = r.m.table.total;
        w = malloc(sizeof(float) * n);
        if (w && fetch(&r, w, NULL, &err) == K3C_OK) {
            diffs dd = {0};
            weights_diff(&r.m.table, w, w_ref, NULL, &dd);
            d = dd.w;
        }
    }
    free(w);
    runner_free(&r);
    return d;
}

/* One layout against one CUDA process and one CPU process. */
static void compare(k3c_comm *comm, const k3c_backend_f32 *cuda, const char *config, layout lay) {
    k3c_err err = {0};
    k3c_config cfg;
    if (k3c_config_load(config, &cfg, &err)) {
        CHECK(0, "%s (run from the repository root)", err.msg);
        return;
    }
    tp_variant(&cfg, lay.tp);
    char name[96];
    const int dp =
        comm->size / (lay.ep ? lay.ep : 1) / (lay.tp ? lay.tp : 1) / (lay.pp ? lay.pp : 1) / (lay.cp ? lay.cp : 1);
    snprintf(name, sizeof name, "dp%d ep%d tp%d pp%d cp%d", dp, lay.ep, lay.tp, lay.pp, lay.cp);
    batch gb;
    if (lay.cp)
        make_batch_cp(&gb);
    else
        make_batch(&gb);
    runner cpu, ref, par;
    memset(&ref, 0, sizeof ref), memset(&par, 0, sizeof par);
    int ok = runner_init(&cpu, &cfg, NULL, NULL, (layout){0}, &err) == K3C_OK;
    ok = ok && runner_init(&ref, &cfg, cuda, NULL, (layout){0}, &err) == K3C_OK;
    ok = ok && runner_init(&par, &cfg, cuda, comm, lay, &err) == K3C_OK;
    CHECK(ok, "setup (%s): %s", name, err.msg);
    const k3c_param_table *t = &cpu.m.table;
    const size_t n = t->total, ns = cpu.opt.state_numel;
    float *buf = malloc(sizeof(float) * (7 * n + 3 * ns));
    float *g_cpu = buf, *g_ref = buf + n, *g_par = buf + 2 * n, *w_cpu = buf + 3 * n, *w_ref = buf + 4 * n,
          *w_par = buf + 5 * n, *w0 = buf + 6 * n, *s_cpu = buf + 7 * n, *s_ref = s_cpu + ns, *s_par = s_ref + ns;
    if (ok && buf) memcpy(w0, cpu.m.w, sizeof(float) * n); /* the CPU runner's weights are host memory */
    double l_cpu[STEPS], l_ref[STEPS], l_par[STEPS], n_cpu, n_ref, n_par;
    int c_cpu, c_ref, c_par;
    ok = ok && buf && run_steps(&cpu, &gb, l_cpu, g_cpu, &n_cpu, &c_cpu) &&
         run_steps(&ref, &gb, l_ref, g_ref, &n_ref, &c_ref) && run_steps(&par, &gb, l_par, g_par, &n_par, &c_par);
    ok = ok && fetch(&cpu, w_cpu, s_cpu, &err) == K3C_OK && fetch(&ref, w_ref, s_ref, &err) == K3C_OK &&
         fetch(&par, w_par, s_par, &err) == K3C_OK;
    CHECK(ok, "%s: %s", name, err.msg);
    /* compared in the parallel rank's layout (with EP its experts, with PP its stage's only): the one-process runs' part
       of it */
    float *whole = malloc(sizeof(float) * (5 * n + 2 * ns + 1)), *w_ref_whole = w_ref;
    if (ok && whole) {
        const k3c_param_table *h = &par.m.table;
        float *x[] = {g_cpu, g_ref, w_cpu, w_ref, w0};
        for (int k = 0; k < 5; k++) held_part(t, h, x[k], whole + (size_t)k * n), x[k] = whole + (size_t)k * n;
        g_cpu = x[0], g_ref = x[1], w_cpu = x[2], w_ref = x[3], w0 = x[4];
        held_state(t, &cpu.opt, h, &par.opt, s_cpu, whole + 5 * n);
        held_state(t, &cpu.opt, h, &par.opt, s_ref, whole + 5 * n + ns);
        s_cpu = whole + 5 * n, s_ref = whole + 5 * n + ns;
        t = h;
    }
    ok = ok && whole;
    if (ok) {
        const size_t n = t->total; /* the parallel rank's */
        diffs dg = {0}, dc = {0};  /* against the CUDA process, against the CPU process */
        for (int s = 0; s < STEPS; s++) {
            dg.loss = fmax(dg.loss, fabs(l_par[s] - l_ref[s]) / fabs(l_ref[s]));
            dc.loss = fmax(dc.loss, fabs(l_par[s] - l_cpu[s]) / fabs(l_cpu[s]));
        }
        dg.grad = grads_diff(t, g_par, g_ref, &dg.worst_g);
        dc.grad = grads_diff(t, g_par, g_cpu, &dc.worst_g);
        weights_diff(t, w_par, w_ref, NULL, &dg);
        weights_diff(t, w_par, w_cpu, w0, &dc);
        diffs dz = {0}; /* against the CPU, every weight (printed) */
        weights_diff(t, w_par, w_cpu, NULL, &dz);
        dg.state = state_diff(&par.opt, s_par, s_ref);
        dc.state = state_diff(&par.opt, s_par, s_cpu);
        CHECK(dg.loss <= TOL && dg.grad <= TOL && dg.w <= TOL && dg.bias_abs <= TOL && dg.state <= TOL,
              "%s vs one CUDA process: loss %.3e, step-1 gradients %.3e (%s), weights %.3e (%s), router biases "
              "%.3e, optimizer state %.3e (tolerance %g)",
              name, dg.loss, dg.grad, dg.worst_g, dg.w, dg.worst_w, dg.bias_abs, dg.state, TOL);
        CHECK(dc.loss <= CPU_TOL && dc.grad <= CPU_TOL && dc.w <= CPU_TOL && dc.bias_abs <= CPU_TOL,
              "%s vs one CPU process: loss %.3e, step-1 gradients %.3e (%s), weights that start non-zero %.3e (%s), "
              "router biases %.3e (tolerance %g)",
              name, dc.loss, dc.grad, dc.worst_g, dc.w, dc.worst_w, dc.bias_abs, CPU_TOL);
        CHECK(c_par == c_ref && n_par > GRAD_CLIP && c_par > 0,
              "%s: QK-Clip scaled %d heads (one process %d), norm %.3g", name, c_par, c_ref, n_par);
        int moved = 0; /* quantile balancing acted */
        for (int i = 0; i < t->n; i++)
            for (int64_t j = 0; t->p[i].kind == K3C_PK_ROUTER_BIAS && j < t->p[i].numel; j++)
                moved |= w_ref[t->p[i].offset + j] != 0;
        CHECK_OK(k3c_comm_allreduce(comm, &moved, &moved, 1, K3C_I32, K3C_COMM_MAX, NULL, &err), &err); /* stages */
        CHECK(moved, "quantile balancing left every router bias at 0");
        /* ZeRO-1: identical on every rank holding them (a stage's ranks; the experts under EP: the ranks holding the
           same ones) */
        float *lo = malloc(sizeof(float) * n), *hi = malloc(sizeof(float) * n);
        for (int pass = 0; lo && hi && pass < 2; pass++) {
            k3c_comm *c = pass && par.d.x_comm ? par.d.x_comm : par.d.use_pp ? par.d.stage_comm : comm;
            CHECK_OK(k3c_comm_allreduce(c, w_par, lo, (int64_t)n, K3C_F32, K3C_COMM_MIN, NULL, &err), &err);
            CHECK_OK(k3c_comm_allreduce(c, w_par, hi, (int64_t)n, K3C_F32, K3C_COMM_MAX, NULL, &err), &err);
            size_t spread = 0;
            for (int i = 0; i < t->n; i++)
                if (!par.d.x_comm || !t->p[i].stack == !pass)
                    spread +=
                        memcmp(lo + t->p[i].offset, hi + t->p[i].offset, sizeof(float) * (size_t)t->p[i].numel) != 0;
            CHECK(spread == 0, "%s: weights differ between ranks (%zu entries)", name, spread);
        }
        CHECK(lo && hi, "out of memory");
        free(lo), free(hi);
        if (comm->rank == 0)
            printf("%s, %d steps on %s: vs one such process loss %.2e, step-1 gradients %.2e, weights %.2e, router "
                   "biases %.2e (relative %.2e), state %.2e; vs one CPU process loss %.2e, gradients %.2e, weights "
                   "that start non-zero %.2e (all %.2e, %s), biases %.2e, state %.2e; its floor (documents reversed) "
                   "%.2e\n",
                   name, STEPS, cuda->name, dg.loss, dg.grad, dg.w, dg.bias_abs, dg.bias_rel, dg.state, dc.loss,
                   dc.grad, dc.w, dz.w, dz.worst_w ? dz.worst_w : "-", dc.bias_abs, dc.state,
                   gpu_floor(&cfg, cuda, &gb, w_ref_whole));
    }
    free(whole);
    free(buf);
    runner_free(&cpu);
    runner_free(&ref);
    runner_free(&par);
}

/* The bf16 wire of expert parallelism (ep = N, forced: the fp32 checking kernels leave the table's wire_bf16 at 0)
 * against one process over one step, as test_dist_dp.c does on the CPU: every row crossing ranks rounded once to bf16,
 * sums in fp32, so the loss and step-1 gradients within BF16_TOL (1e-2; 4.1e-3 on the CPU), and the gradients further
 * than TOL from the fp32 process (else the rows did not travel as bf16). */
#define BF16_TOL 1e-2
static void ep_bf16_wire(k3c_comm *comm, const k3c_backend_f32 *be, const char *config) {
    k3c_err err = {0};
    k3c_config cfg;
    if (k3c_config_load(config, &cfg, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    batch gb;
    make_batch(&gb);
    runner ref, par;
    memset(&par, 0, sizeof par);
    int ok = runner_init(&ref, &cfg, be, NULL, (layout){0}, &err) == K3C_OK;
    ok = ok && runner_init(&par, &cfg, be, comm, (layout){comm->size, 0, 0, 0}, &err) == K3C_OK;
    CHECK(ok, "setup (bf16 wire): %s", err.msg);
    /* compared in the parallel rank's layout (with EP its experts only): the one-process gradients' part of it */
    const size_t n = ok ? par.m.table.total : 1;
    float *g_ref = malloc(sizeof(float) * (ok ? ref.m.table.total : 1)), *g_par = malloc(sizeof(float) * n),
          *rg = malloc(sizeof(float) * n);
    double l_ref, l_par, nn;
    int c;
    if (ok) par.d.ep.wire_bf16 = 1;
    ok = ok && g_ref && g_par && rg && step(&ref, &gb, 1, K3C_QB_EXACT, &l_ref, g_ref, &nn, &c, &err) == K3C_OK &&
         step(&par, &gb, 1, K3C_QB_EXACT, &l_par, g_par, &nn, &c, &err) == K3C_OK;
    CHECK(ok, "bf16 wire step: %s", err.msg);
    if (ok) {
        const char *worst = "-";
        held_part(&ref.m.table, &par.m.table, g_ref, rg);
        double dl = fabs(l_par - l_ref) / fabs(l_ref), dg = grads_diff(&par.m.table, g_par, rg, &worst);
        CHECK(dl <= BF16_TOL && dg <= BF16_TOL && dg > TOL,
              "ep%d with the bf16 wire vs one process: loss %.3e, step-1 gradients %.3e (%s): want within %g and "
              "above %g",
              comm->size, dl, dg, worst, BF16_TOL, TOL);
        if (comm->rank == 0)
            printf("ep%d with the bf16 wire, 1 step on %s: vs one such process loss %.2e, step-1 gradients %.2e (%s)\n",
                   comm->size, be->name, dl, dg, worst);
    }
    free(g_ref), free(g_par), free(rg);
    runner_free(&ref);
    runner_free(&par);
}

/* Device memory never meets a host-memory communicator: the one-rank "self" one is refused with a clear message. */
static void refusals(const k3c_backend_f32 *cuda, const char *config) {
    k3c_err err = {0};
    k3c_config cfg;
    k3c_model m;
    if (k3c_config_load(config, &cfg, &err) || k3c_model_create_f32(&cfg, 1, &m, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    m.kda_chunk = 64;
    CHECK_OK(k3c_model_use_backend_f32(&m, cuda, &err), &err);
    k3c_comm *self = NULL;
    k3c_optim o;
    k3c_optim_defaults(&o);
    CHECK_OK(k3c_optim_init(&o, &m.table, &err), &err);
    CHECK_OK(k3c_comm_self(&self, &err), &err);
    k3c_dp dp;
    k3c_ep ep;
    int rc = k3c_dp_init(&dp, self, cuda, &o, &m.table, &err);
    CHECK(rc == K3C_EUNSUPPORTED && strstr(err.msg, "needs a device communicator"), "dp over self on CUDA: %d %s", rc,
          err.msg);
    rc = k3c_ep_init(&ep, self, cuda, &cfg, &err);
    CHECK(rc == K3C_EUNSUPPORTED && strstr(err.msg, "needs a device communicator"), "ep over self on CUDA: %d %s", rc,
          err.msg);
    k3c_comm_free(self);
    k3c_optim_free(&o);
    k3c_model_free_f32(&m);
}

/* Host buffers through the NCCL communicator (staged): the parallel step's counts and scalars. */
static void host_buffers(k3c_comm *c) {
    k3c_err err = {0};
    double x = 1.5 + c->rank;
    CHECK_OK(k3c_comm_allreduce(c, &x, &x, 1, K3C_F64, K3C_COMM_SUM, NULL, &err), &err);
    CHECK(x == 1.5 * c->size + c->size * (c->size - 1) / 2.0, "host allreduce: %g", x);
    int64_t mine = 10 + c->rank, all[64], ones[64], iota[64];
    for (int r = 0; r < c->size && r < 64; r++) ones[r] = 1, iota[r] = r, all[r] = -1;
    CHECK_OK(k3c_comm_allgather(c, &mine, all, ones, iota, K3C_I64, NULL, &err), &err);
    int bad = 0;
    for (int r = 0; r < c->size && r < 64; r++) bad += all[r] != 10 + r;
    CHECK(bad == 0, "host allgather: %d wrong", bad);
}

/* Each piece over all the ranks (ep, tp and pp where N divides the model's widths), and on 4 ranks the combinations
 * of test_dist_dp.c. */
static void run_all(k3c_comm *c, const k3c_backend_f32 *cuda, const char *config, int device) {
    const int N = c->size;
    host_buffers(c);
    if (device) refusals(cuda, config);
    compare(c, cuda, config, (layout){0, 0, 0, 0}); /* dp = N */
    if (4 % N == 0) { /* the tiny model's 4 experts, 2 heads (4 in the tp4 variant) and 4 layers */
        compare(c, cuda, config, (layout){N, 0, 0, 0}); /* ep = N (one rank: the expert exchange over itself) */
        ep_bf16_wire(c, cuda, config);
        compare(c, cuda, config, (layout){0, N, 0, 0});
        compare(c, cuda, config, (layout){0, 0, N, 0});
    }
    compare(c, cuda, config, (layout){0, 0, 0, N});
    if (N == 1) compare(c, cuda, config, (layout){1, 0, 1, 0}); /* ep×pp: the expert exchange inside a stage */
    if (N == 1) compare(c, cuda, config, (layout){1, 1, 0, 0}); /* ep×tp: the expert exchange beside TP */
    if (N != 4) return;
    static const layout pairs[] = {{2, 0, 0, 0}, {0, 2, 0, 0}, {0, 0, 2, 0}, {0, 2, 2, 0},
                                   {2, 0, 2, 0}, {2, 2, 0, 0}, {0, 0, 0, 2}, {2, 0, 0, 2}};
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) compare(c, cuda, config, pairs[i]);
}

/* --cpu: the same layouts and checks with the CPU backend standing in for the GPU, over the MPI world (under mpirun)
 * or the one-rank communicator: a check of this program where there is no GPU. */
int main(int argc, char **argv) {
    k3c_err err = {0};
    int cpu = 0;
    const char *config = CONFIG;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--cpu") == 0)
            cpu = 1;
        else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            config = argv[++i];
        else {
            fprintf(stderr, "usage: test_dist_nccl [--cpu] [--config MODEL.json] (unknown argument '%s')\n", argv[i]);
            return 2;
        }
    }
    int gpus = 0;
    if (!cpu && (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1)) {
        printf("FAIL: no GPU (--cpu runs the checks on the CPU backend)\n0 passed, 1 failed\n");
        return 1;
    }
    k3c_comm *boot = NULL, *c = NULL;
    if (k3c_comm_mpi_launched()) CHECK_OK(k3c_comm_mpi_world(&boot, &err), &err);
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    int rank = boot ? boot->rank : 0, device = cpu ? 0 : (lr ? atoi(lr) : rank) % gpus;
    k3c_cuda_backend cb;
    int ok = cpu || k3c_cuda_backend_init(&cb, device, K3C_GEMM_FP32, &err) == K3C_OK;
    CHECK(ok, "CUDA backend on GPU %d: %s", device, err.msg);
    if (ok && !cpu) k3c_cuda_backend_kernels(&cb, K3C_KERNELS_FP32);
    if (cpu && !boot)
        CHECK_OK(k3c_comm_self(&c, &err), &err);
    else if (ok)
        CHECK_OK(cpu ? k3c_comm_split(boot, 0, rank, &c, &err)
                     : k3c_comm_nccl(boot, NULL, rank, boot ? boot->size : 1, device, &c, &err),
                 &err);
    if (c) {
        run_all(c, cpu ? k3c_backend_cpu_f32() : &cb.table, config, !cpu);
        k3c_comm_free(c);
    }
    if (ok && !cpu) k3c_cuda_backend_destroy(&cb);
    if (boot) {
        printf("rank %d: ", rank);
        k3c_comm_free(boot);
        k3c_comm_mpi_finalize();
    }
    printf("%d passed, %d failed\n", test_passed_, test_failed_);
    return test_failed_ ? 1 : 0;
}
