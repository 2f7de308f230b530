/* harness_optim.cu — the GPU optimizer (src/cuda/optim.cu) against the CPU one (train/adamw.c, muon.c, schedule.c):
 * AdamW, (Per-Head) Muon with NS5, entry sub-ranges, the trainer hook, gradient-norm clipping. ARCHITECTURE.md §10.
 * Usage: harness_optim [seed]. Needs configs/k3_test_tiny.json and configs/k3_tiny.json (skipped when absent). */
#include <chrono>

#include "cuda/testing.cuh"
#include "cuda/cuda_optim.h"

/* Tolerances (relative to the CHANGE of each buffer over the steps, ‖x − ref‖ / ‖ref − x0‖):
 *  - AdamW entries, every optimizer state, untouched entries: 1e-6. The kernels use the CPU's float operations in the
 *    CPU's order without FMA contraction, so these agree bit for bit (the count of differing bits is printed).
 *  - Muon weights: 1e-4. NS5 runs on fp32 cuBLASLt GEMMs whose summation order differs from OpenBLAS' (and the
 *    Frobenius norm's double reduction order differs), ~1e-7 relative per GEMM, grown by the quintic iteration's
 *    coefficients (|a|, |b|, |c| up to 4.8) over 15 GEMMs and 3 steps. */
static const double TOL_EXACT = 1e-6, TOL_MUON = 1e-4;

/* A hand-built parameter table: every entry kind, stacked experts, per-head blocks, rows > cols, odd shapes, A_log-style
 * padding (used < numel), a router bias, an entry over one 32K grad-norm block. */
struct table {
    std::vector<k3c_param> p;
    k3c_param_table t{};
    void add(const char *name, int kind, int64_t rows, int64_t cols, int64_t stack = 0, int64_t head_rows = 0,
             int64_t used = -1) {
        k3c_param q{};
        snprintf(q.name, sizeof q.name, "%s", name);
        q.ndim = cols > 0 ? 2 : 1;
        q.shape[0] = rows;
        q.shape[1] = cols > 0 ? cols : 0;
        q.stack = stack;
        q.numel = rows * (cols > 0 ? cols : 1) * (stack ? stack : 1);
        q.offset = t.total;
        q.kind = (uint8_t)kind;
        q.head_rows = head_rows;
        q.layer = -1;
        q.used = used >= 0 ? used : q.numel;
        t.total += (size_t)q.numel;
        p.push_back(q);
        t.p = p.data();
        t.n = (int)p.size();
    }
};

static void build_hand_table(table &tb) {
    tb.add("model.embed_tokens.weight", K3C_PK_EMBED, 37, 24);
    tb.add("q_proj.weight", K3C_PK_MATRIX, 48, 24, 0, 12); /* 4 heads 12×24; whole 48×24 transposed */
    tb.add("k_proj.weight", K3C_PK_MATRIX, 48, 24, 0, 12); /* same shape: grouped with q_proj */
    tb.add("v_proj.weight", K3C_PK_MATRIX, 48, 24, 0, 12);
    tb.add("g_proj.weight", K3C_PK_MATRIX, 48, 24, 0, 12); /* 16 blocks of 12×24 in the group */
    tb.add("o_proj.weight", K3C_PK_MATRIX, 24, 40);
    tb.add("input_layernorm.weight", K3C_PK_VECTOR, 24, 0);
    tb.add("A_log", K3C_PK_VECTOR, 16, 0, 0, 0, 5); /* padding beyond 5 stays as loaded */
    tb.add("gate.e_score_correction_bias", K3C_PK_ROUTER_BIAS, 8, 0);
    tb.add("experts.%d.w1.weight", K3C_PK_MATRIX, 20, 24, 6);    /* 6 experts, wide */
    tb.add("experts.%d.w2.weight", K3C_PK_MATRIX, 24, 20, 6);    /* 6 experts, tall (transposed) */
    tb.add("experts.%d.w3.weight", K3C_PK_MATRIX, 32, 24, 4, 8); /* heads inside expert slices */
    tb.add("kv_b_proj.weight", K3C_PK_MATRIX, 48, 16, 0, 16);    /* square 16×16 blocks */
    tb.add("odd.weight", K3C_PK_MATRIX, 33, 17, 0, 11);
    tb.add("big.weight", K3C_PK_MATRIX, 200, 130, 0, 40);
    tb.add("tall.weight", K3C_PK_MATRIX, 70, 6, 0, 35);
    tb.add("one_row.weight", K3C_PK_MATRIX, 1, 9);
    tb.add("lm_head.weight", K3C_PK_HEAD, 300, 250); /* 75000: three grad-norm blocks */
    tb.add("bias", K3C_PK_VECTOR, 7, 0);
}

static bool is_muon(const k3c_optim &o, const k3c_param &p) {
    return p.kind == K3C_PK_MATRIX && o.matrix_optimizer == K3C_MATRIX_MUON;
}

/* Random weights, and state as after some steps: momentum / m ~ N(0, 0.01²), v ~ |N(0, 1e-4)|. */
static void fill_state(k3c_rng *r, const k3c_optim &o, const k3c_param_table &t, std::vector<float> &st) {
    for (int i = 0; i < t.n; i++) {
        const k3c_param &p = t.p[i];
        if (p.kind == K3C_PK_ROUTER_BIAS) continue;
        float *s = st.data() + o.state_off[i];
        for (int64_t j = 0; j < p.numel; j++) s[j] = (float)(0.01 * k3c_rng_normal(r));
        if (!is_muon(o, p))
            for (int64_t j = 0; j < p.numel; j++) s[p.numel + j] = (float)(1e-4 * fabs(k3c_rng_normal(r)));
    }
}

static size_t bit_diffs(const float *a, const float *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(a + i, b + i, sizeof(float)) != 0;
    return d;
}

/* Entry by entry: w (Muon tolerance on Muon entries) and the state, against the CPU, relative to the change. */
static void compare_all(harness &h, const char *op, const std::string &cfg, const k3c_optim &o,
                        const k3c_param_table &t, const std::vector<float> &w, const std::vector<float> &wref,
                        const std::vector<float> &w0, const std::vector<float> &st, const std::vector<float> &stref,
                        const std::vector<float> &st0, bool per_entry) {
    size_t exact_diff = 0;
    if (!per_entry) { /* big tables: one line per buffer class */
        std::vector<float> a, b, c;
        for (int pass = 0; pass < 2; pass++) {
            a.clear(), b.clear(), c.clear();
            for (int i = 0; i < t.n; i++) {
                const k3c_param &p = t.p[i];
                if (is_muon(o, p) != (pass == 1)) continue;
                a.insert(a.end(), w.begin() + p.offset, w.begin() + p.offset + p.numel);
                b.insert(b.end(), wref.begin() + p.offset, wref.begin() + p.offset + p.numel);
                c.insert(c.end(), w0.begin() + p.offset, w0.begin() + p.offset + p.numel);
            }
            if (pass == 0) exact_diff += bit_diffs(a.data(), b.data(), a.size());
            h.compare(op, cfg, pass ? "w_muon" : "w_adam", a.data(), b.data(), a.size(), pass ? TOL_MUON : TOL_EXACT,
                      c.data());
        }
        h.compare(op, cfg, "state", st.data(), stref.data(), st.size(), TOL_EXACT, st0.data());
        exact_diff += bit_diffs(st.data(), stref.data(), st.size());
        printf("  %s %s: %zu non-Muon floats differ bitwise from the CPU\n", op, cfg.c_str(), exact_diff);
        return;
    }
    for (int i = 0; i < t.n; i++) {
        const k3c_param &p = t.p[i];
        const bool mu = is_muon(o, p);
        const std::string s = cfg + " " + p.name;
        h.compare(op, s, mu ? "w_muon" : "w", w.data() + p.offset, wref.data() + p.offset, (size_t)p.numel,
                  mu ? TOL_MUON : TOL_EXACT, w0.data() + p.offset);
        if (!mu) exact_diff += bit_diffs(w.data() + p.offset, wref.data() + p.offset, (size_t)p.numel);
        if (p.kind == K3C_PK_ROUTER_BIAS) continue;
        const size_t off = o.state_off[i], n = (size_t)p.numel * (mu ? 1 : 2);
        h.compare(op, s, "state", st.data() + off, stref.data() + off, n, TOL_EXACT, st0.data() + off);
        exact_diff += bit_diffs(st.data() + off, stref.data() + off, n);
    }
    printf("  %s %s: %zu non-Muon floats differ bitwise from the CPU\n", op, cfg.c_str(), exact_diff);
}

struct optim_cfg {
    const char *name;
    int matrix, per_head, nesterov, ns_steps, decay_vectors, batched;
    int tight_ws; /* shrink the workspace to the largest single matrix: chunks split entries and mix them */
};

/* The workspace floats one Muon matrix takes in optim.cu (X, X', P, B, items rounded up to 64 floats); duplicated
 * here only to make the workspace as small as the device code accepts. */
static size_t largest_need(const k3c_optim &o, const k3c_param_table &t) {
    size_t best = 0;
    for (int i = 0; i < t.n; i++) {
        const k3c_param &p = t.p[i];
        if (!is_muon(o, p)) continue;
        const size_t R = (size_t)(o.per_head && p.head_rows > 0 ? p.head_rows : p.shape[0]), C = (size_t)p.shape[1];
        const size_t r = R < C ? R : C, c = R < C ? C : R,
                     need = 2 * ((r * c + 63) / 64 * 64) + 2 * ((r * r + 63) / 64 * 64);
        if (need > best) best = need;
    }
    return best;
}

/* nsteps steps of the CPU optimizer and the device twin from the same random start, entries [first, last). */
static void run_case(harness &h, k3c_cuda_ctx &ctx, k3c_rng *rng, const k3c_param_table &t, const optim_cfg &c,
                     int nsteps, int first, int last, bool per_entry, const char *op) {
    k3c_optim o;
    k3c_optim_defaults(&o);
    o.matrix_optimizer = c.matrix;
    o.per_head = c.per_head;
    o.nesterov = c.nesterov;
    o.ns_steps = c.ns_steps;
    o.decay_vectors = c.decay_vectors;
    o.weight_decay = 0.1;
    h.ok(k3c_optim_init(&o, &t, &h.err), "k3c_optim_init");
    k3c_optim_cuda oc;
    h.ok(k3c_optim_cuda_init(&oc, &ctx, nullptr, nullptr, &o, &t, &h.err), "k3c_optim_cuda_init");
    oc.batched = c.batched;
    if (c.tight_ws) oc.ws_numel = largest_need(o, t); /* the buffer stays as allocated; only chunks shrink */
    /* padding and stale values in the workspace must never be read */
    if (oc.ws) h.ok(k3c_cuda_fill_u8(oc.ws, 0xFF, sizeof(float) * oc.ws_numel, &h.err), "poison ws");
    std::vector<float> w0 = randn(rng, t.total, 0.05), st0(o.state_numel ? o.state_numel : 1, 0.0f);
    fill_state(rng, o, t, st0);
    std::vector<float> w = w0, st = st0;
    dbuf dw(h, w0.data(), w0.size() * 4), dst(h, st0.data(), st0.size() * 4), dg(h, t.total * 4);
    const int64_t step0 = 7; /* bias corrections of a later step */
    for (int s = 1; s <= nsteps; s++) {
        std::vector<float> g = randn(rng, t.total, 0.1);
        h.ok(k3c_cuda_h2d(dg.p, g.data(), g.size() * 4, &h.err), "h2d g");
        const double lr = 0.02 / s;
        h.ok(k3c_optim_step_entries(&o, &t, first, last, w.data(), g.data(), st.data(), lr, step0 + s, &h.err),
             "k3c_optim_step_entries (cpu)");
        h.ok(k3c_optim_step_entries_cuda(&oc, &o, &t, first, last, dw.as<float>(), dg.as<float>(), dst.as<float>(), lr,
                                         step0 + s, &h.err),
             "k3c_optim_step_entries_cuda");
    }
    h.ok(k3c_cuda_sync(&h.err), "sync");
    const std::string cfg = fmt("%s [%d,%d)", c.name, first, last);
    compare_all(h, op, cfg, o, t, download<float>(h, dw), w, w0, download<float>(h, dst), st, st0, per_entry);
    k3c_optim_cuda_free(&oc);
    k3c_optim_free(&o);
}

/* Norm, clip that triggers / does not / max_norm = 0, NaN gradient, router bias excluded. */
static void test_clip(harness &h, k3c_cuda_ctx &ctx, k3c_rng *rng, const k3c_param_table &t, const char *tname) {
    k3c_optim o;
    k3c_optim_defaults(&o);
    h.ok(k3c_optim_init(&o, &t, &h.err), "k3c_optim_init");
    k3c_optim_cuda oc;
    h.ok(k3c_optim_cuda_init(&oc, &ctx, nullptr, nullptr, &o, &t, &h.err), "k3c_optim_cuda_init");
    std::vector<float> g0 = randn(rng, t.total, 0.3);
    for (int i = 0; i < t.n; i++) /* a huge router-bias gradient must not count */
        if (t.p[i].kind == K3C_PK_ROUTER_BIAS)
            for (int64_t j = 0; j < t.p[i].numel; j++) g0[t.p[i].offset + j] = 1e3f;
    dbuf dg(h, g0.data(), g0.size() * 4);
    const double ref = k3c_grad_norm(&t, g0.data());
    double n = NAN;
    h.ok(k3c_grad_norm_cuda(&oc, &t, dg.as<float>(), &n, &h.err), "k3c_grad_norm_cuda");
    h.check_le("grad_norm", tname, "rel", fabs(n - ref) / ref, TOL_EXACT);
    const double limits[3] = {0.5 * ref, 2.0 * ref, 0.0}; /* triggers, does not, no clipping */
    const char *what[3] = {"clip", "noclip", "max0"};
    for (int k = 0; k < 3; k++) {
        std::vector<float> g = g0;
        h.ok(k3c_cuda_h2d(dg.p, g0.data(), g0.size() * 4, &h.err), "h2d g");
        const double pre = k3c_clip_grad_norm(&t, g.data(), limits[k]);
        h.ok(k3c_clip_grad_norm_cuda(&oc, &t, dg.as<float>(), limits[k], &n, &h.err), "k3c_clip_grad_norm_cuda");
        h.check_le("clip_grad_norm", fmt("%s %s", tname, what[k]), "norm", fabs(n - pre) / pre, TOL_EXACT);
        std::vector<float> gd = download<float>(h, dg);
        h.compare("clip_grad_norm", fmt("%s %s", tname, what[k]), "g", gd.data(), g.data(), g.size(), TOL_EXACT);
        if (k > 0)
            h.check_le("clip_grad_norm", fmt("%s %s", tname, what[k]), "touched",
                       (double)bit_diffs(gd.data(), g0.data(), g0.size()), 0);
    }
    /* a NaN gradient: the norm is non-finite and g stays as it was (the caller skips the step) */
    std::vector<float> gn = g0;
    int victim = t.n - 1;
    while (victim > 0 && t.p[victim].kind == K3C_PK_ROUTER_BIAS) victim--;
    gn[t.p[victim].offset + t.p[victim].numel / 2] = NAN;
    h.ok(k3c_cuda_h2d(dg.p, gn.data(), gn.size() * 4, &h.err), "h2d g");
    h.ok(k3c_clip_grad_norm_cuda(&oc, &t, dg.as<float>(), 1.0, &n, &h.err), "k3c_clip_grad_norm_cuda (nan)");
    h.check_le("clip_grad_norm", fmt("%s nan", tname), "finite", isfinite(n) ? 1.0 : 0.0, 0);
    h.check_le("clip_grad_norm", fmt("%s nan", tname), "cpu_fin",
               isfinite(k3c_clip_grad_norm(&t, gn.data(), 1.0)) ? 1.0 : 0.0, 0);
    std::vector<float> gd = download<float>(h, dg);
    h.check_le("clip_grad_norm", fmt("%s nan", tname), "touched", (double)bit_diffs(gd.data(), gn.data(), gn.size()),
               0);
    k3c_optim_cuda_free(&oc);
    k3c_optim_free(&o);
}

/* The trainer's path: k3c_cuda_optim_backend on a k3c_cuda_backend, buffers in its managed memory. */
static void test_hook(harness &h, k3c_rng *rng, const k3c_param_table &t) {
    k3c_cuda_backend *b = (k3c_cuda_backend *)calloc(1, sizeof *b);
    h.ok(k3c_cuda_backend_init(b, 0, 0, &h.err), "k3c_cuda_backend_init");
    k3c_optim_backend ob;
    k3c_cuda_optim_backend(b, &ob);
    k3c_optim o;
    k3c_optim_defaults(&o);
    h.ok(k3c_optim_init(&o, &t, &h.err), "k3c_optim_init");
    void *inst = nullptr;
    h.ok(ob.open(ob.ctx, &o, &t, &inst, &h.err), "hook open");
    float *w = (float *)b->table.alloc(t.total * 4), *g = (float *)b->table.alloc(t.total * 4);
    float *st = (float *)b->table.alloc(o.state_numel * 4);
    if (!w || !g || !st) h.ok(k3c_errf(&h.err, K3C_ENOMEM, "managed alloc"), "hook alloc");
    std::vector<float> w0 = randn(rng, t.total, 0.05), g0 = randn(rng, t.total, 0.3), st0(o.state_numel);
    fill_state(rng, o, t, st0);
    memcpy(w, w0.data(), t.total * 4), memcpy(g, g0.data(), t.total * 4), memcpy(st, st0.data(), o.state_numel * 4);
    std::vector<float> wr = w0, gr = g0, sr = st0;
    const double pre = k3c_clip_grad_norm(&t, gr.data(), 1.0);
    h.ok(k3c_optim_step(&o, &t, wr.data(), gr.data(), sr.data(), 1e-2, 3, &h.err), "cpu step");
    double n = NAN;
    h.ok(ob.clip_grad_norm(inst, &t, g, 1.0, &n, &h.err), "hook clip");
    h.ok(ob.step_entries(inst, &o, &t, 0, t.n, w, g, st, 1e-2, 3, &h.err), "hook step");
    h.ok(b->table.sync(&h.err), "backend sync");
    h.check_le("hook(managed)", "clip 1.0", "norm", fabs(n - pre) / pre, TOL_EXACT);
    compare_all(h, "hook(managed)", "muon ph1", o, t, std::vector<float>(w, w + t.total), wr, w0,
                std::vector<float>(st, st + o.state_numel), sr, st0, false);
    ob.close(inst);
    b->table.free(w), b->table.free(g), b->table.free(st);
    k3c_optim_free(&o);
    k3c_cuda_backend_destroy(b);
    free(b);
}

/* ms per optimizer step (clip + step, synchronised) on a model's table, batched and looped GEMMs. */
static void time_steps(harness &h, k3c_cuda_ctx &ctx, k3c_rng *rng, const k3c_param_table &t, const char *tname) {
    k3c_optim o;
    k3c_optim_defaults(&o);
    h.ok(k3c_optim_init(&o, &t, &h.err), "k3c_optim_init");
    k3c_optim_cuda oc;
    h.ok(k3c_optim_cuda_init(&oc, &ctx, nullptr, nullptr, &o, &t, &h.err), "k3c_optim_cuda_init");
    std::vector<float> w0 = randn(rng, t.total, 0.05), st0(o.state_numel);
    fill_state(rng, o, t, st0);
    dbuf dw(h, w0.data(), w0.size() * 4), dst(h, st0.data(), st0.size() * 4), dg(h, w0.data(), w0.size() * 4);
    for (int batched = 1; batched >= 0; batched--) {
        oc.batched = batched;
        double best = 1e30, n;
        for (int it = 0; it < 6; it++) {
            auto t0 = std::chrono::steady_clock::now();
            h.ok(k3c_clip_grad_norm_cuda(&oc, &t, dg.as<float>(), 1e30, &n, &h.err), "clip");
            h.ok(k3c_optim_step_cuda(&oc, &o, &t, dw.as<float>(), dg.as<float>(), dst.as<float>(), 1e-5, 10 + it,
                                     &h.err),
                 "step");
            h.ok(k3c_cuda_sync(&h.err), "sync");
            const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            if (it > 0 && ms < best) best = ms;
        }
        printf("  timing %s (%zu params, %d entries, ws %.1f MiB): clip + step %.2f ms (%s GEMMs)\n", tname, t.total,
               t.n, oc.ws_numel * 4.0 / (1 << 20), best, batched ? "batched" : "looped");
    }
    k3c_optim_cuda_free(&oc);
    k3c_optim_free(&o);
}

int main(int argc, char **argv) {
    harness h;
    k3c_cuda_ctx ctx;
    k3c_rng rng = harness_start(h, ctx, argc, argv);
    table hand;
    build_hand_table(hand);
    const k3c_param_table &t = hand.t;
    /* name, matrix optimizer, per_head, nesterov, ns_steps, decay_vectors, batched, tight_ws */
    const optim_cfg cfgs[] = {
        {"muon ph1", K3C_MATRIX_MUON, 1, 1, 5, 0, 1, 0},
        {"muon ph0", K3C_MATRIX_MUON, 0, 1, 5, 0, 1, 0},
        {"muon ph1 loop", K3C_MATRIX_MUON, 1, 0, 5, 1, 0, 0},
        {"muon ph0 loop", K3C_MATRIX_MUON, 0, 1, 5, 0, 0, 0},
        {"muon ns0", K3C_MATRIX_MUON, 1, 1, 0, 0, 1, 0},
        {"adamw ph1", K3C_MATRIX_ADAMW, 1, 1, 5, 0, 1, 0},
        {"adamw ph0 dv", K3C_MATRIX_ADAMW, 0, 1, 5, 1, 1, 0},
        {"muon ph1 tight", K3C_MATRIX_MUON, 1, 1, 5, 0, 1, 1},
        {"muon ph1 tight ns2", K3C_MATRIX_MUON, 1, 0, 2, 0, 1, 1},
    };
    for (const optim_cfg &c : cfgs) run_case(h, ctx, &rng, t, c, 3, 0, t.n, true, "optim_step");
    /* entries [2, 10) only: the rest must stay exactly as they were */
    run_case(h, ctx, &rng, t, cfgs[0], 3, 2, 12, true, "optim_step_entries");
    run_case(h, ctx, &rng, t, cfgs[5], 2, 7, 15, true, "optim_step_entries");
    test_clip(h, ctx, &rng, t, "hand");
    test_hook(h, &rng, t);
    /* the model tables the trainer steps */
    const char *models[2] = {"configs/k3_test_tiny.json", "configs/k3_tiny.json"};
    for (int mi = 0; mi < 2; mi++) {
        k3c_config cfg;
        k3c_param_table mt{};
        k3c_err e{};
        if (k3c_config_load(models[mi], &cfg, &e) || k3c_params_build(&cfg, &mt, &e)) {
            printf("SKIP %s: %s\n", models[mi], e.msg);
            continue;
        }
        const bool small = mi == 0;
        run_case(h, ctx, &rng, mt, cfgs[0], small ? 3 : 1, 0, mt.n, false, models[mi]);
        if (small) run_case(h, ctx, &rng, mt, cfgs[1], 3, 0, mt.n, false, models[mi]);
        test_clip(h, ctx, &rng, mt, models[mi]);
        time_steps(h, ctx, &rng, mt, models[mi]);
        k3c_params_free(&mt);
    }
    k3c_cuda_destroy(&ctx);
    return h.summary();
}
