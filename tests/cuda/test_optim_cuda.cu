/* test_optim_cuda.cu — the GPU training step's tail against the CPU one: the optimizer (src/cuda/optim.cu vs ops/adamw.c,
 * muon.c, grad_norm.c: AdamW, (Per-Head) Muon with NS5 in fp32 and in bf16, the singular values of bf16 NS5's output,
 * entry sub-ranges, gradient-norm clipping), the backend table's
 * training entries in device memory, quantile balancing, the bias step of its baseline arm and QK-Clip
 * (cuda/quantile_balance.cu, qk_clip.cu vs the CPU table's entries), over parameter tables and several steps of state,
 * which the op rows of test_backend_ops do not model; prints the step's time on the model tables (batched and looped
 * GEMMs). docs/MODEL.md §7, §10, docs/TRAINING.md §1.6. Built by `make cuda-tests`, run by tools/device_cuda.sh.
 * Usage: test_optim_cuda [seed]. Needs configs/k3_test_tiny.json and configs/k3_tiny.json (skipped when absent). */
#include <algorithm>
#include <chrono>
#include <functional>

#include "cuda/testing.cuh"
#include "cuda/cuda_optim.h"
extern "C" {
#include "model/params.h"
}

/* Tolerances (relative to the CHANGE of each buffer over the steps, ‖x − ref‖ / ‖ref − x0‖):
 *  - AdamW entries, every optimizer state, untouched entries: 1e-6. The kernels use the CPU's float operations in the
 *    CPU's order without FMA contraction, so these agree bit for bit (the count of differing bits is printed).
 *  - Muon weights: 1e-4. NS5 runs on fp32 cuBLASLt GEMMs whose summation order differs from OpenBLAS' (and the
 *    Frobenius norm's double reduction order differs), ~1e-7 relative per GEMM, grown by the quintic iteration's
 *    coefficients (|a|, |b|, |c| up to 4.8) over 15 GEMMs and 3 steps. */
static const double TOL_EXACT = 1e-6, TOL_MUON = 1e-4;

/* bf16 Newton–Schulz (what K3C_MUON_AUTO runs on the GPU outside the fp32 GEMM mode) against the CPU's fp32 one.
 * bf16 keeps 8 significant bits (unit roundoff u = 2⁻⁹ ≈ 2e-3). Each iteration stores three products (P, B, X'), each
 * rounded once, and X' = aX + BX cancels (|BX| ≈ 2.7|X| against |X'| ≈ 0.7|X|), so every iteration adds a few u of
 * relative error, which NS5's map does not damp (|σφ'(σ)/φ(σ)| ≈ 1 over the band): about 5·3u ≈ 1.5% after five
 * iterations, whatever the size. A CPU emulation of exactly these roundings (docs/MODEL.md §10.4) stays within half
 * of the tolerance below. Hence:
 *  - TOL_MUON_BF16 = 5e-2 on ‖O − O_cpu‖_F / ‖O_cpu‖_F and on the Muon weights' change over the steps (the change is
 *    lr·scale·sqrt(max)·O plus the decay term both compute alike; the momentum does not depend on the weights, so the
 *    state stays bitwise equal);
 *  - and the bf16 error must EXCEED TOL_MUON: otherwise the fp32 path ran.
 * NS5's band: φ(σ) = aσ + bσ³ + cσ⁵ maps [0.68, 1.21] into itself (local minimum φ(1.05) = 0.683, maximum
 * φ(0.554) = 1.203), so a singular value that has entered it stays there. A block whose fp32 singular values all lie
 * in [0.68, 1.21] ("converged": inputs with σ_min/‖G‖_F ≳ 2e-3) must have its bf16 ones in [0.6, 1.25], each within
 * TOL_SIGMA = 0.1 of the fp32 one (twice the emulation's worst, §10.4). Blocks that have not converged
 * (ill-conditioned square blocks) are held to the Frobenius tolerance only. */
static const double TOL_MUON_BF16 = 5e-2, TOL_SIGMA = 0.1, BAND_LO = 0.6, BAND_HI = 1.25;

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
    tb.add("q_proj.weight", K3C_PK_MATRIX, 48, 24, 0, 12); /* 4 heads 12×24; whole 48×24 tall */
    tb.add("k_proj.weight", K3C_PK_MATRIX, 48, 24, 0, 12); /* same shape: grouped with q_proj */
    tb.add("v_proj.weight", K3C_PK_MATRIX, 48, 24, 0, 12);
    tb.add("g_proj.weight", K3C_PK_MATRIX, 48, 24, 0, 12); /* 16 blocks of 12×24 in the group */
    tb.add("o_proj.weight", K3C_PK_MATRIX, 24, 40);
    tb.add("input_layernorm.weight", K3C_PK_VECTOR, 24, 0);
    tb.add("A_log", K3C_PK_VECTOR, 16, 0, 0, 0, 5); /* padding beyond 5 stays as loaded */
    tb.add("gate.e_score_correction_bias", K3C_PK_ROUTER_BIAS, 8, 0);
    tb.add("experts.%d.w1.weight", K3C_PK_MATRIX, 20, 24, 6);    /* 6 experts, wide */
    tb.add("experts.%d.w2.weight", K3C_PK_MATRIX, 24, 20, 6);    /* 6 experts, tall */
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

/* ‖x − ref‖² and ‖ref − base‖² over the Muon entries (the relative error of their change is sqrt(num / den)). */
struct err_sum {
    double num = 0, den = 0;
    void add(const float *x, const float *ref, const float *base, size_t n) {
        for (size_t i = 0; i < n; i++) {
            const double d = (double)x[i] - ref[i], c = (double)ref[i] - base[i];
            num += d * d, den += c * c;
        }
    }
    double rel() const { return den > 0 ? sqrt(num / den) : sqrt(num); }
};

/* Entry by entry: w (tolerance tol_muon on Muon entries) and the state, against the CPU, relative to the change.
 * Returns the relative error of the Muon weights' change, all Muon entries together. */
static double compare_all(harness &h, const char *op, const std::string &cfg, const k3c_optim &o,
                          const k3c_param_table &t, const std::vector<float> &w, const std::vector<float> &wref,
                          const std::vector<float> &w0, const std::vector<float> &st, const std::vector<float> &stref,
                          const std::vector<float> &st0, bool per_entry, double tol_muon) {
    size_t exact_diff = 0;
    err_sum mu_err;
    for (int i = 0; i < t.n; i++)
        if (is_muon(o, t.p[i]))
            mu_err.add(w.data() + t.p[i].offset, wref.data() + t.p[i].offset, w0.data() + t.p[i].offset,
                       (size_t)t.p[i].numel);
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
            h.compare(op, cfg, pass ? "w_muon" : "w_adam", a.data(), b.data(), a.size(), pass ? tol_muon : TOL_EXACT,
                      c.data());
        }
        h.compare(op, cfg, "state", st.data(), stref.data(), st.size(), TOL_EXACT, st0.data());
        exact_diff += bit_diffs(st.data(), stref.data(), st.size());
        printf("  %s %s: %zu non-Muon floats differ bitwise from the CPU\n", op, cfg.c_str(), exact_diff);
        return mu_err.rel();
    }
    for (int i = 0; i < t.n; i++) {
        const k3c_param &p = t.p[i];
        const bool mu = is_muon(o, p);
        const std::string s = cfg + " " + p.name;
        h.compare(op, s, mu ? "w_muon" : "w", w.data() + p.offset, wref.data() + p.offset, (size_t)p.numel,
                  mu ? tol_muon : TOL_EXACT, w0.data() + p.offset);
        if (!mu) exact_diff += bit_diffs(w.data() + p.offset, wref.data() + p.offset, (size_t)p.numel);
        if (p.kind == K3C_PK_ROUTER_BIAS) continue;
        const size_t off = o.state_off[i], n = (size_t)p.numel * (mu ? 1 : 2);
        h.compare(op, s, "state", st.data() + off, stref.data() + off, n, TOL_EXACT, st0.data() + off);
        exact_diff += bit_diffs(st.data() + off, stref.data() + off, n);
    }
    printf("  %s %s: %zu non-Muon floats differ bitwise from the CPU\n", op, cfg.c_str(), exact_diff);
    return mu_err.rel();
}

struct optim_cfg {
    const char *name;
    int matrix, per_head, nesterov, ns_steps, decay_vectors, batched;
    int tight_ws; /* shrink the workspace to the largest single matrix: chunks split entries and mix them */
    int prec;     /* k3c_muon_precision */
};

static bool ns_bf16(const optim_cfg &c) { return c.matrix == K3C_MATRIX_MUON && c.prec != K3C_MUON_FP32; }

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
    k3c_optim cpu_o = o; /* the CPU's twin steps in fp32 whatever the device's precision */
    cpu_o.muon_precision = K3C_MUON_FP32;
    o.muon_precision = c.prec;
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
        h.ok(k3c_optim_step_entries(&cpu_o, &t, first, last, w.data(), g.data(), st.data(), lr, step0 + s, &h.err),
             "k3c_optim_step_entries (cpu)");
        h.ok(k3c_optim_step_entries_cuda(&oc, &o, &t, first, last, dw.as<float>(), dg.as<float>(), dst.as<float>(), lr,
                                         step0 + s, &h.err),
             "k3c_optim_step_entries_cuda");
    }
    h.ok(k3c_cuda_sync(&h.err), "sync");
    const std::string cfg = fmt("%s [%d,%d)", c.name, first, last);
    const bool bf = ns_bf16(c);
    const double mu_err = compare_all(h, op, cfg, o, t, download<float>(h, dw), w, w0, download<float>(h, dst), st, st0,
                                      per_entry, bf ? TOL_MUON_BF16 : TOL_MUON);
    if (bf && c.ns_steps > 0) /* the bf16 products ran: no fp32 agreement */
        h.check_le(op, cfg, "bf16on", TOL_MUON / mu_err, 1.0);
    k3c_optim_cuda_free(&oc);
    k3c_optim_free(&o);
}

/* The singular values of an r × c block x (r ≤ c, row-major, double): square roots of the eigenvalues of x xᵀ by cyclic
 * Jacobi rotations, ascending. */
static std::vector<double> singular_values(const std::vector<double> &x, int r, int c) {
    std::vector<double> a((size_t)r * r);
    for (int i = 0; i < r; i++)
        for (int j = 0; j < r; j++) {
            double s = 0;
            for (int k = 0; k < c; k++) s += x[(size_t)i * c + k] * x[(size_t)j * c + k];
            a[(size_t)i * r + j] = s;
        }
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0, diag = 0;
        for (int i = 0; i < r; i++) {
            diag += a[(size_t)i * r + i] * a[(size_t)i * r + i];
            for (int j = i + 1; j < r; j++) off += a[(size_t)i * r + j] * a[(size_t)i * r + j];
        }
        if (off <= 1e-28 * diag) break;
        for (int p = 0; p < r; p++)
            for (int q = p + 1; q < r; q++) {
                const double apq = a[(size_t)p * r + q];
                if (apq == 0) continue;
                const double th = (a[(size_t)q * r + q] - a[(size_t)p * r + p]) / (2 * apq);
                const double tn = (th >= 0 ? 1.0 : -1.0) / (fabs(th) + sqrt(th * th + 1));
                const double cs = 1 / sqrt(tn * tn + 1), sn = tn * cs;
                for (int k = 0; k < r; k++) {
                    const double kp = a[(size_t)k * r + p], kq = a[(size_t)k * r + q];
                    a[(size_t)k * r + p] = cs * kp - sn * kq, a[(size_t)k * r + q] = sn * kp + cs * kq;
                }
                for (int k = 0; k < r; k++) {
                    const double pk = a[(size_t)p * r + k], qk = a[(size_t)q * r + k];
                    a[(size_t)p * r + k] = cs * pk - sn * qk, a[(size_t)q * r + k] = sn * pk + cs * qk;
                }
            }
    }
    std::vector<double> sv((size_t)r);
    for (int i = 0; i < r; i++) sv[(size_t)i] = sqrt(fabs(a[(size_t)i * r + i]));
    std::sort(sv.begin(), sv.end());
    return sv;
}

/* Calls f(block index, R, C, pointer into v) for every Muon block of t (per-head row blocks, expert slices). */
static void each_block(const k3c_optim &o, const k3c_param_table &t, const std::vector<float> &v,
                       const std::function<void(int64_t, int64_t, const float *)> &f) {
    for (int i = 0; i < t.n; i++) {
        const k3c_param &p = t.p[i];
        if (!is_muon(o, p)) continue;
        const int64_t R = o.per_head && p.head_rows > 0 ? p.head_rows : p.shape[0], C = p.shape[1];
        for (int64_t b = 0; b < p.numel / (R * C); b++) f(R, C, v.data() + p.offset + b * R * C);
    }
}

/* One block of O = NS5(G) from w = −lr·scale·sqrt(max(R, C))·O, short side first, in double. */
static std::vector<double> block_O(const float *w, int64_t R, int64_t C, const k3c_optim &o) {
    const double step = (float)(o.muon_scale * sqrt((double)(R > C ? R : C))); /* lr = 1, as optim.cu rounds it */
    std::vector<double> x((size_t)(R * C));
    for (int64_t i = 0; i < R; i++)
        for (int64_t j = 0; j < C; j++) x[(size_t)(R > C ? j * R + i : i * C + j)] = -w[i * C + j] / step;
    return x;
}

/* NS5's output itself on fresh Gaussian gradients: one Muon step from w = 0 with zero momentum, no Nesterov, no decay
 * and lr = 1 leaves w = −scale·sqrt(max(R, C))·NS5(G) on every block. The device's O (precision prec) against the CPU's
 * fp32 O block by block: the relative Frobenius error, and for the blocks whose CPU singular values lie in NS5's band,
 * the device's in [BAND_LO, BAND_HI] and each within TOL_SIGMA of the CPU's (fp32: within 1e-3). */
static void test_ns_band(harness &h, k3c_cuda_ctx &ctx, k3c_rng *rng, const k3c_param_table &t, int per_head,
                         int prec) {
    k3c_optim o;
    k3c_optim_defaults(&o);
    o.per_head = per_head, o.nesterov = 0, o.weight_decay = 0;
    h.ok(k3c_optim_init(&o, &t, &h.err), "k3c_optim_init");
    k3c_optim_cuda oc;
    h.ok(k3c_optim_cuda_init(&oc, &ctx, nullptr, nullptr, &o, &t, &h.err), "k3c_optim_cuda_init");
    std::vector<float> g = randn(rng, t.total, 0.1), w(t.total, 0.0f), st(o.state_numel ? o.state_numel : 1, 0.0f);
    dbuf dw(h, w.data(), w.size() * 4), dst(h, st.data(), st.size() * 4), dg(h, g.data(), g.size() * 4);
    o.muon_precision = K3C_MUON_FP32;
    h.ok(k3c_optim_step(&o, &t, w.data(), g.data(), st.data(), 1.0, 1, &h.err), "k3c_optim_step (cpu)");
    o.muon_precision = prec;
    h.ok(k3c_optim_step_cuda(&oc, &o, &t, dw.as<float>(), dg.as<float>(), dst.as<float>(), 1.0, 1, &h.err),
         "k3c_optim_step_cuda");
    const std::vector<float> wd = download<float>(h, dw);
    const bool bf = prec != K3C_MUON_FP32;
    const double tol_o = bf ? TOL_MUON_BF16 : TOL_MUON, tol_s = bf ? TOL_SIGMA : 1e-3;
    double worst_o = 0, worst_s = 0, lo = INFINITY, hi = 0, out_of_band = 0;
    int64_t blocks = 0, converged = 0;
    std::vector<const float *> dev_at;
    each_block(o, t, wd, [&](int64_t, int64_t, const float *p) { dev_at.push_back(p); });
    each_block(o, t, w, [&](int64_t R, int64_t C, const float *pc) {
        const std::vector<double> xc = block_O(pc, R, C, o), xd = block_O(dev_at[(size_t)blocks++], R, C, o);
        double num = 0, den = 0;
        for (size_t i = 0; i < xc.size(); i++) num += (xd[i] - xc[i]) * (xd[i] - xc[i]), den += xc[i] * xc[i];
        worst_o = std::max(worst_o, sqrt(num / den));
        const int r = (int)(R < C ? R : C), c = (int)(R < C ? C : R);
        const std::vector<double> sc = singular_values(xc, r, c), sd = singular_values(xd, r, c);
        if (!(sc.front() >= 0.68 && sc.back() <= 1.21)) return; /* not yet in the band after ns_steps */
        converged++;
        for (int i = 0; i < r; i++) {
            worst_s = std::max(worst_s, fabs(sd[(size_t)i] - sc[(size_t)i]));
            lo = std::min(lo, sd[(size_t)i]), hi = std::max(hi, sd[(size_t)i]);
            out_of_band += !(sd[(size_t)i] >= BAND_LO && sd[(size_t)i] <= BAND_HI);
        }
    });
    const std::string name = fmt("%s ph%d", bf ? "bf16" : "fp32", per_head);
    printf("  ns5 %s: %lld blocks, %lld in the band on the CPU; device singular values [%.3f, %.3f]\n", name.c_str(),
           (long long)blocks, (long long)converged, lo, hi);
    h.check_le("ns5 output", name, "O_rel", worst_o, tol_o);
    if (bf) h.check_le("ns5 output", name, "bf16on", TOL_MUON / worst_o, 1.0);
    h.check_le("ns5 output", name, "sigma", worst_s, tol_s);
    h.check_le("ns5 output", name, "band", out_of_band, 0);
    h.check_le("ns5 output", name, "conv", 2.0 * (double)converged < (double)blocks ? 1.0 : 0.0, 0);
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

/* n floats of host data into fresh memory of table be (the CUDA table's memory is device memory). */
static float *put(harness &h, const k3c_backend_f32 *be, const float *src, size_t n) {
    float *p = (float *)be->alloc(sizeof(float) * (n ? n : 1));
    if (!p) h.ok(k3c_errf(&h.err, K3C_ENOMEM, "backend alloc"), "alloc");
    if (n) h.ok(be->upload(p, src, sizeof(float) * n, &h.err), "upload");
    return p;
}
template <class T> static std::vector<T> get(harness &h, const k3c_backend_f32 *be, const T *src, size_t n) {
    std::vector<T> v(n);
    if (n) h.ok(be->download(v.data(), src, sizeof(T) * n, &h.err), "download");
    return v;
}

/* The trainer's path: the CUDA table's optimizer entries (optim_open, clip_grad_norm, optim_step) on its device memory
 * against the CPU table's, at the default K3C_MUON_AUTO: fp32 Newton–Schulz in the table's fp32 GEMM mode, bf16 in the
 * others (auto_bf16). */
static void test_table(harness &h, k3c_cuda_backend *b, k3c_rng *rng, const k3c_param_table &t) {
    const bool bf = b->gemm != K3C_GEMM_FP32;
    const k3c_backend_f32 *gpu = &b->table, *cpu = k3c_backend_cpu_f32();
    k3c_optim o;
    k3c_optim_defaults(&o);
    h.ok(k3c_optim_init(&o, &t, &h.err), "k3c_optim_init");
    void *inst = nullptr, *cinst = nullptr;
    h.ok(gpu->optim_open(gpu->ctx, &o, &t, &inst, &h.err), "optim_open (cuda)");
    h.ok(cpu->optim_open(cpu->ctx, &o, &t, &cinst, &h.err), "optim_open (cpu)");
    std::vector<float> w0 = randn(rng, t.total, 0.05), g0 = randn(rng, t.total, 0.3), st0(o.state_numel);
    fill_state(rng, o, t, st0);
    float *w = put(h, gpu, w0.data(), t.total), *g = put(h, gpu, g0.data(), t.total);
    float *st = put(h, gpu, st0.data(), o.state_numel);
    std::vector<float> wr = w0, gr = g0, sr = st0;
    double pre = NAN, n = NAN;
    h.ok(cpu->clip_grad_norm(cinst, &t, gr.data(), 1.0, &pre, &h.err), "clip (cpu table)");
    h.ok(cpu->optim_step(cinst, &o, &t, 0, t.n, wr.data(), gr.data(), sr.data(), 1e-2, 3, &h.err), "step (cpu table)");
    h.ok(gpu->clip_grad_norm(inst, &t, g, 1.0, &n, &h.err), "clip (cuda table)");
    h.ok(gpu->optim_step(inst, &o, &t, 0, t.n, w, g, st, 1e-2, 3, &h.err), "step (cuda table)");
    h.check_le("table optim", "clip 1.0", "norm", fabs(n - pre) / pre, TOL_EXACT);
    const std::string cfg = fmt("muon ph1 auto, %s GEMMs", k3c_gemm_mode_name(b->gemm));
    const double mu_err = compare_all(h, "table optim", cfg, o, t, get(h, gpu, w, t.total), wr, w0,
                                      get(h, gpu, st, o.state_numel), sr, st0, false, bf ? TOL_MUON_BF16 : TOL_MUON);
    if (bf) h.check_le("table optim", cfg, "bf16on", TOL_MUON / mu_err, 1.0);
    gpu->optim_close(inst), cpu->optim_close(cinst);
    gpu->free(w), gpu->free(g), gpu->free(st);
    k3c_optim_free(&o);
}

/* ---------------------------------------------------------------- quantile balancing
 * Tolerance: ‖b_gpu − b_cpu‖ / ‖b_cpu − b0‖ ≤ 1e-5. The order statistic, the bins and the centring are the CPU's
 * operations (agreement is normally bitwise: the count of differing floats is printed); only exp in double may differ
 * from glibc's by an ulp, which can move a score by one float ulp in rare cases. */
static const double TOL_QB = 1e-5;

/* Router outputs of m random tokens: logits ~ N(0, sd²) (with some exact ties), cutoff = the (k+1)-th largest biased
 * score s + b, as the router writes it. */
static void route_inputs(k3c_rng *r, int64_t m, int64_t n, int64_t k, double sd, const std::vector<float> &b,
                         std::vector<float> &logits, std::vector<float> &cutoff) {
    logits = randn(r, (size_t)(m * n), sd);
    for (size_t i = 0; i < logits.size(); i += 97) logits[i] = 0.25f; /* repeated values: ties in the order statistic */
    cutoff.assign((size_t)m, 0.0f);
    std::vector<float> z((size_t)n);
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            const double x = logits[(size_t)(i * n + j)];
            const float s = (float)(x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)));
            z[(size_t)j] = s + b[(size_t)j];
        }
        std::nth_element(z.begin(), z.begin() + k, z.end(), [](float a, float c) { return a > c; });
        cutoff[(size_t)i] = z[(size_t)k];
    }
}

static void test_quantile_balance(harness &h, k3c_cuda_backend *bk, k3c_rng *rng) {
    const k3c_backend_f32 *gpu = &bk->table, *cpu = k3c_backend_cpu_f32();
    struct shape {
        int64_t m, n, k;
        double sd;
    } shapes[] = {{4096, 64, 6, 1.5}, {1000, 8, 2, 0.5}, {777, 33, 5, 3.0}, {3, 16, 1, 1.0}, {20000, 4, 1, 0.05}};
    for (const shape &sh : shapes)
        for (int mode = K3C_QB_EXACT; mode <= K3C_QB_HISTOGRAM; mode++) {
            const std::string name = fmt("%s m=%lld n=%lld k=%lld", mode ? "hist" : "exact", (long long)sh.m,
                                         (long long)sh.n, (long long)sh.k);
            std::vector<float> b0 = randn(rng, (size_t)sh.n, 0.05), lg, cut;
            route_inputs(rng, sh.m, sh.n, sh.k, sh.sd, b0, lg, cut);
            std::vector<float> bc = b0, wsc(cpu->quantile_balance_workspace(mode, sh.m, sh.n) / 4 + 1);
            h.ok(cpu->quantile_balance(cpu->ctx, mode, lg.data(), cut.data(), sh.m, sh.n, sh.k, bc.data(), wsc.data(),
                                       &h.err),
                 "quantile_balance (cpu table)");
            float *dl = put(h, gpu, lg.data(), lg.size()), *dc = put(h, gpu, cut.data(), cut.size());
            float *db = put(h, gpu, b0.data(), b0.size());
            void *ws = gpu->alloc(gpu->quantile_balance_workspace(mode, sh.m, sh.n));
            if (!ws) h.ok(k3c_errf(&h.err, K3C_ENOMEM, "qb workspace"), "alloc");
            h.ok(gpu->quantile_balance(gpu->ctx, mode, dl, dc, sh.m, sh.n, sh.k, db, ws, &h.err),
                 "quantile_balance (cuda table)");
            std::vector<float> bg = get(h, gpu, db, b0.size());
            h.compare("quantile_balance", name, "b", bg.data(), bc.data(), bc.size(), TOL_QB, b0.data());
            printf("  quantile_balance %s: %zu of %lld bias values differ bitwise from the CPU\n", name.c_str(),
                   bit_diffs(bg.data(), bc.data(), bc.size()), (long long)sh.n);
            /* a non-finite logit: the CPU reports K3C_ENUMERIC, the device leaves the bias as it was */
            lg[lg.size() / 2] = NAN;
            h.ok(gpu->upload(dl, lg.data(), sizeof(float) * lg.size(), &h.err), "upload");
            h.ok(gpu->quantile_balance(gpu->ctx, mode, dl, dc, sh.m, sh.n, sh.k, db, ws, &h.err), "qb nan (cuda)");
            std::vector<float> bn = get(h, gpu, db, b0.size()), bcn = bc;
            h.check_le("quantile_balance", name + " nan", "changed", (double)bit_diffs(bn.data(), bg.data(), bg.size()),
                       0);
            k3c_err e{};
            const int rc = cpu->quantile_balance(cpu->ctx, mode, lg.data(), cut.data(), sh.m, sh.n, sh.k, bcn.data(),
                                                 wsc.data(), &e);
            h.check_le("quantile_balance", name + " nan", "cpu_ok", rc == K3C_ENUMERIC ? 0.0 : 1.0, 0);
            gpu->free(dl), gpu->free(dc), gpu->free(db), gpu->free(ws);
        }
}

/* ---------------------------------------------------------------- the auxiliary-loss-free bias step
 * Bitwise: the routes are the router twin's (ids equal to the CPU's), the sign is decided on integer loads and the step
 * is one double add per expert. Near ties of biased scores (closer than float rounding) are redrawn, since either
 * pick would be right there. */
static void test_bias_balance(harness &h, k3c_cuda_backend *bk, k3c_rng *rng) {
    const k3c_backend_f32 *gpu = &bk->table, *cpu = k3c_backend_cpu_f32();
    struct shape {
        int64_t m, n, k;
        double sd, bsd;
    } shapes[] = {{4096, 64, 6, 1.5, 0.05}, {1000, 8, 2, 0.5, 0}, {777, 33, 5, 3.0, 0.2}, {3, 16, 1, 1.0, 0.01}};
    for (const shape &sh : shapes) {
        const std::string name = fmt("m=%lld n=%lld k=%lld", (long long)sh.m, (long long)sh.n, (long long)sh.k);
        std::vector<float> b0 = randn(rng, (size_t)sh.n, sh.bsd), lg = randn(rng, (size_t)(sh.m * sh.n), sh.sd);
        for (int64_t i = 0; i < sh.m; i++)
            for (bool again = true; again;) {
                again = false;
                float *row = lg.data() + i * sh.n;
                for (int64_t a = 0; a < sh.n && !again; a++)
                    for (int64_t c = 0; c < a && !again; c++) {
                        const double va = 1 / (1 + exp(-(double)row[a])) + b0[(size_t)a];
                        const double vc = 1 / (1 + exp(-(double)row[c])) + b0[(size_t)c];
                        again = fabs(va - vc) < 1e-5;
                    }
                if (again) {
                    std::vector<float> fresh = randn(rng, (size_t)sh.n, sh.sd);
                    std::copy(fresh.begin(), fresh.end(), row);
                }
            }
        std::vector<float> bc = b0, wsc(cpu->bias_balance_workspace(sh.m, sh.n, sh.k) / 4 + 1);
        h.ok(cpu->bias_balance(cpu->ctx, lg.data(), sh.m, sh.n, sh.k, 0.001, bc.data(), wsc.data(), &h.err),
             "bias_balance (cpu table)");
        float *dl = put(h, gpu, lg.data(), lg.size()), *db = put(h, gpu, b0.data(), b0.size());
        void *ws = gpu->alloc(gpu->bias_balance_workspace(sh.m, sh.n, sh.k));
        if (!ws) h.ok(k3c_errf(&h.err, K3C_ENOMEM, "bias_balance workspace"), "alloc");
        h.ok(gpu->bias_balance(gpu->ctx, dl, sh.m, sh.n, sh.k, 0.001, db, ws, &h.err), "bias_balance (cuda table)");
        std::vector<float> bg = get(h, gpu, db, b0.size());
        h.check_le("bias_balance", name, "bit_diffs", (double)bit_diffs(bg.data(), bc.data(), bc.size()), 0);
        /* a non-finite logit leaves the bias as it was */
        lg[lg.size() / 2] = NAN;
        h.ok(gpu->upload(dl, lg.data(), sizeof(float) * lg.size(), &h.err), "upload");
        h.ok(gpu->bias_balance(gpu->ctx, dl, sh.m, sh.n, sh.k, 0.001, db, ws, &h.err), "bias_balance nan (cuda)");
        std::vector<float> bn = get(h, gpu, db, b0.size());
        h.check_le("bias_balance", name + " nan", "changed", (double)bit_diffs(bn.data(), bg.data(), bg.size()), 0);
        gpu->free(dl), gpu->free(db), gpu->free(ws);
    }
}

/* ---------------------------------------------------------------- QK-Clip
 * Tolerance: bitwise (γ and sqrt γ in double, one float multiply per element, as on the CPU); the number of heads
 * clipped equal. A non-finite S_max: the CPU returns K3C_ENUMERIC, the device reports −1 and leaves that layer as is. */
static void test_qk_clip(harness &h, k3c_cuda_backend *bk, k3c_rng *rng, const char *path) {
    const k3c_backend_f32 *gpu = &bk->table, *cpu = k3c_backend_cpu_f32();
    k3c_config cfg;
    k3c_param_table t{};
    k3c_err e{};
    if (k3c_config_load(path, &cfg, &e) || k3c_params_build(&cfg, &t, &e) || !k3c_config_num_mla(&cfg)) {
        printf("SKIP qk_clip %s: %s\n", path, e.msg[0] ? e.msg : "no MLA layer");
        k3c_params_free(&t);
        return;
    }
    const size_t ns = (size_t)(cfg.num_layers * cfg.mla_heads);
    for (int bad = 0; bad < 2; bad++) {
        std::vector<float> w0 = randn(rng, t.total, 0.05), smax(ns);
        for (size_t i = 0; i < ns; i++) smax[i] = (float)(50.0 + 150.0 * k3c_rng_uniform(rng)); /* τ = 100: ~2/3 */
        int bad_layer = -1;
        for (int l = 0; bad && l < cfg.num_layers && bad_layer < 0; l++)
            if (cfg.mixer[l] == K3C_MIXER_MLA) bad_layer = l;
        if (bad) smax[(size_t)bad_layer * (size_t)cfg.mla_heads] = INFINITY;
        std::vector<float> wc = w0;
        int32_t nc = 0;
        const int rc = cpu->qk_clip(cpu->ctx, &cfg, &t, wc.data(), smax.data(), 100.0, &nc, &e);
        float *dw = put(h, gpu, w0.data(), t.total), *ds = put(h, gpu, smax.data(), ns);
        int32_t *dn = (int32_t *)gpu->alloc(sizeof(int32_t));
        if (!dn) h.ok(k3c_errf(&h.err, K3C_ENOMEM, "alloc"), "alloc");
        h.ok(gpu->qk_clip(gpu->ctx, &cfg, &t, dw, ds, 100.0, dn, &h.err), "qk_clip (cuda table)");
        std::vector<float> wg = get(h, gpu, dw, t.total);
        const int32_t ng = get(h, gpu, dn, 1)[0];
        const std::string name = fmt("%s%s", path, bad ? " inf" : "");
        if (!bad) {
            h.check_le("qk_clip", name, "bits", (double)bit_diffs(wg.data(), wc.data(), t.total), 0);
            h.check_le("qk_clip", name, "count", fabs((double)ng - nc) + (nc > 0 ? 0 : 1), 0);
            h.check_le("qk_clip", name, "changed", bit_diffs(wg.data(), w0.data(), t.total) > 0 ? 0.0 : 1.0, 0);
        } else { /* the first MLA layer is the bad one: the CPU touched nothing, the device only later layers */
            const k3c_layer_offsets &o = t.layer[bad_layer];
            const size_t q = cfg.q_lora_rank > 0 ? o.q_b : o.q_proj;
            h.check_le("qk_clip", name, "cpu_err", rc == K3C_ENUMERIC && nc == -1 ? 0.0 : 1.0, 0);
            h.check_le("qk_clip", name, "count", ng == -1 ? 0.0 : 1.0, 0);
            h.check_le("qk_clip", name, "layer", (double)bit_diffs(wg.data() + q, w0.data() + q, 16), 0);
            h.check_le("qk_clip", name, "layer_kv", (double)bit_diffs(wg.data() + o.kv_b, w0.data() + o.kv_b, 16), 0);
        }
        gpu->free(dw), gpu->free(ds), gpu->free(dn);
    }
    k3c_params_free(&t);
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
    for (int run = 0; run < 4; run++) { /* bf16 and fp32 NS5, batched and looped GEMMs */
        const int batched = run % 2 == 0;
        o.muon_precision = run < 2 ? K3C_MUON_BF16 : K3C_MUON_FP32;
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
        printf("  timing %s (%zu params, %d entries, ws %.1f MiB): clip + step %.2f ms (%s NS5, %s GEMMs)\n", tname,
               t.total, t.n, oc.ws_numel * 4.0 / (1 << 20), best, run < 2 ? "bf16" : "fp32",
               batched ? "batched" : "looped");
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
    /* name, matrix optimizer, per_head, nesterov, ns_steps, decay_vectors, batched, tight_ws, muon precision */
    const int F = K3C_MUON_FP32, B = K3C_MUON_BF16;
    const optim_cfg cfgs[] = {
        {"muon ph1", K3C_MATRIX_MUON, 1, 1, 5, 0, 1, 0, F},
        {"muon ph0", K3C_MATRIX_MUON, 0, 1, 5, 0, 1, 0, F},
        {"muon ph1 loop", K3C_MATRIX_MUON, 1, 0, 5, 1, 0, 0, F},
        {"muon ph0 loop", K3C_MATRIX_MUON, 0, 1, 5, 0, 0, 0, F},
        {"muon ns0", K3C_MATRIX_MUON, 1, 1, 0, 0, 1, 0, F},
        {"adamw ph1", K3C_MATRIX_ADAMW, 1, 1, 5, 0, 1, 0, F},
        {"adamw ph0 dv", K3C_MATRIX_ADAMW, 0, 1, 5, 1, 1, 0, F},
        {"muon ph1 tight", K3C_MATRIX_MUON, 1, 1, 5, 0, 1, 1, F},
        {"muon ph1 tight ns2", K3C_MATRIX_MUON, 1, 0, 2, 0, 1, 1, F},
        {"muon bf16 ph1", K3C_MATRIX_MUON, 1, 1, 5, 0, 1, 0, B}, /* [9]: the model tables' bf16 case */
        {"muon bf16 ph0", K3C_MATRIX_MUON, 0, 1, 5, 0, 1, 0, B},
        {"muon auto ph1 loop", K3C_MATRIX_MUON, 1, 0, 5, 1, 0, 0, K3C_MUON_AUTO},
        {"muon bf16 ph0 loop", K3C_MATRIX_MUON, 0, 1, 5, 0, 0, 0, B},
        {"muon bf16 ns0", K3C_MATRIX_MUON, 1, 1, 0, 0, 1, 0, B},
        {"adamw bf16 ph1", K3C_MATRIX_ADAMW, 1, 1, 5, 0, 1, 0, B}, /* no Muon entry: the precision is moot */
        {"muon bf16 ph1 tight", K3C_MATRIX_MUON, 1, 1, 5, 0, 1, 1, B},
        {"muon bf16 ph1 tight ns2", K3C_MATRIX_MUON, 1, 0, 2, 0, 1, 1, B},
    };
    for (const optim_cfg &c : cfgs) run_case(h, ctx, &rng, t, c, 3, 0, t.n, true, "optim_step");
    /* entries [2, 10) only: the rest must stay exactly as they were */
    run_case(h, ctx, &rng, t, cfgs[0], 3, 2, 12, true, "optim_step_entries");
    run_case(h, ctx, &rng, t, cfgs[5], 2, 7, 15, true, "optim_step_entries");
    run_case(h, ctx, &rng, t, cfgs[9], 3, 2, 12, true, "optim_step_entries");
    for (int per_head = 1; per_head >= 0; per_head--)
        for (int prec = K3C_MUON_FP32; prec <= K3C_MUON_BF16; prec++) test_ns_band(h, ctx, &rng, t, per_head, prec);
    test_clip(h, ctx, &rng, t, "hand");
    k3c_cuda_backend *bk = (k3c_cuda_backend *)calloc(1, sizeof *bk);
    h.ok(k3c_cuda_backend_init(bk, 0, 0, &h.err), "k3c_cuda_backend_init");
    test_table(h, bk, &rng, t);
    k3c_cuda_backend *bk16 = (k3c_cuda_backend *)calloc(1, sizeof *bk16);
    h.ok(k3c_cuda_backend_init(bk16, 0, K3C_GEMM_BF16, &h.err), "k3c_cuda_backend_init (bf16 GEMMs)");
    test_table(h, bk16, &rng, t);
    k3c_cuda_backend_destroy(bk16);
    free(bk16);
    test_quantile_balance(h, bk, &rng);
    test_bias_balance(h, bk, &rng);
    test_qk_clip(h, bk, &rng, "configs/k3_test_tiny.json");
    test_qk_clip(h, bk, &rng, "configs/k3_tiny.json");
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
        run_case(h, ctx, &rng, mt, cfgs[9], small ? 3 : 1, 0, mt.n, false, models[mi]);
        test_clip(h, ctx, &rng, mt, models[mi]);
        time_steps(h, ctx, &rng, mt, models[mi]);
        k3c_params_free(&mt);
    }
    k3c_cuda_backend_destroy(bk);
    free(bk);
    k3c_cuda_destroy(&ctx);
    return h.summary();
}
