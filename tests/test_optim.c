/* test_optim.c — AdamW, Newton–Schulz / (Per-Head) Muon, the combined optimizer over a parameter table, gradient-norm
 * clipping, the learning-rate schedule and QK-Clip. Spec: docs/MODEL.md §10, docs/TRAINING.md §1.3. */
#include "model/params.h"
#include "test.h"
#include "ops/backend.h"
#include "ops/optim.h"
#include "ops/qk_clip.h"
#include "train/schedule.h"

#include <omp.h>

/* ---------------------------------------------------------------- helpers */

static void fill_normal(float *x, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)k3c_normal_at(seed, (uint64_t)i);
}

/* Eigenvalues of a symmetric n×n matrix (cyclic Jacobi, double); a is destroyed, ev[n] gets the diagonal. */
static void jacobi_eigenvalues(double *a, int n, double *ev) {
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0;
        for (int p = 0; p < n; p++)
            for (int q = p + 1; q < n; q++) off += a[p * n + q] * a[p * n + q];
        if (off < 1e-26) break;
        for (int p = 0; p < n; p++)
            for (int q = p + 1; q < n; q++) {
                double apq = a[p * n + q];
                if (fabs(apq) < 1e-300) continue;
                double theta = (a[q * n + q] - a[p * n + p]) / (2 * apq);
                double t = (theta >= 0 ? 1 : -1) / (fabs(theta) + sqrt(theta * theta + 1));
                double c = 1 / sqrt(t * t + 1), s = t * c;
                for (int k = 0; k < n; k++) { /* A ← Jᵀ A J: columns p, q then rows p, q */
                    double akp = a[k * n + p], akq = a[k * n + q];
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for (int k = 0; k < n; k++) {
                    double apk = a[p * n + k], aqk = a[q * n + k];
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
            }
    }
    for (int i = 0; i < n; i++) ev[i] = a[i * n + i];
}

/* Singular values of O [rows, cols] via eigenvalues of the short-side Gram matrix. */
static void singular_values(const float *O, int rows, int cols, double *sv) {
    int r = rows < cols ? rows : cols;
    double *gm = calloc((size_t)r * r, sizeof *gm);
    for (int i = 0; i < r; i++)
        for (int j = 0; j < r; j++) {
            double acc = 0;
            if (rows <= cols)
                for (int k = 0; k < cols; k++) acc += (double)O[i * cols + k] * O[j * cols + k];
            else
                for (int k = 0; k < rows; k++) acc += (double)O[k * cols + i] * O[k * cols + j];
            gm[i * r + j] = acc;
        }
    jacobi_eigenvalues(gm, r, sv);
    for (int i = 0; i < r; i++) sv[i] = sqrt(sv[i] > 0 ? sv[i] : 0);
    free(gm);
}

/* Double-precision NS5 by plain loops (the reference for the cblas version). */
static void ns_ref(const float *G, int rows, int cols, int steps, double *O) {
    int tr = rows > cols, r = tr ? cols : rows, c = tr ? rows : cols;
    double *X = malloc(sizeof(double) * r * c), *P = malloc(sizeof(double) * r * r);
    double *B = malloc(sizeof(double) * r * r), *Y = malloc(sizeof(double) * r * c);
    double ss = 0;
    for (int i = 0; i < rows * cols; i++) ss += (double)G[i] * G[i];
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++) X[i * c + j] = (tr ? G[j * cols + i] : G[i * cols + j]) / (sqrt(ss) + 1e-7);
    for (int it = 0; it < steps; it++) {
        for (int i = 0; i < r; i++)
            for (int j = 0; j < r; j++) {
                double acc = 0;
                for (int k = 0; k < c; k++) acc += X[i * c + k] * X[j * c + k];
                P[i * r + j] = acc;
            }
        for (int i = 0; i < r; i++)
            for (int j = 0; j < r; j++) {
                double acc = 0;
                for (int k = 0; k < r; k++) acc += P[i * r + k] * P[k * r + j];
                B[i * r + j] = K3C_NS_B * P[i * r + j] + K3C_NS_C * acc;
            }
        for (int i = 0; i < r; i++)
            for (int j = 0; j < c; j++) {
                double acc = 0;
                for (int k = 0; k < r; k++) acc += B[i * r + k] * X[k * c + j];
                Y[i * c + j] = K3C_NS_A * X[i * c + j] + acc;
            }
        memcpy(X, Y, sizeof(double) * r * c);
    }
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) O[i * cols + j] = tr ? X[j * r + i] : X[i * cols + j];
    free(X);
    free(P);
    free(B);
    free(Y);
}

static double max_abs_diff(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

/* A hand-made parameter table: entries appended in order. */
static void tab_add(k3c_param_table *t, const char *name, int kind, int64_t r, int64_t c, int64_t stack, int64_t hr) {
    k3c_param *p = &t->p[t->n++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = c ? 2 : 1;
    p->shape[0] = r;
    p->shape[1] = c;
    p->stack = stack;
    p->numel = r * (c ? c : 1) * (stack ? stack : 1);
    p->used = p->numel;
    p->offset = t->total;
    p->kind = (uint8_t)kind;
    p->head_rows = hr;
    p->layer = -1;
    t->total += (size_t)p->numel;
}

static void test_table(k3c_param_table *t) {
    memset(t, 0, sizeof *t);
    t->cap = 16;
    t->p = calloc((size_t)t->cap, sizeof *t->p);
    tab_add(t, "a.weight", K3C_PK_MATRIX, 24, 40, 0, 0);
    tab_add(t, "q.weight", K3C_PK_MATRIX, 12, 10, 0, 4);
    tab_add(t, "experts.%d.w1.weight", K3C_PK_MATRIX, 6, 4, 3, 0);
    tab_add(t, "embed.weight", K3C_PK_EMBED, 5, 4, 0, 0);
    tab_add(t, "norm.weight", K3C_PK_VECTOR, 7, 0, 0, 0);
    tab_add(t, "gate.e_score_correction_bias", K3C_PK_ROUTER_BIAS, 4, 0, 0, 0);
    tab_add(t, "lm_head.weight", K3C_PK_HEAD, 3, 4, 0, 0);
}

/* ---------------------------------------------------------------- AdamW */

static void test_adamw_hand(void) {
    /* Two steps by hand (lr 0.1, β = (0.9, 0.999), eps 1e-8, wd 0.1):
     * w0 = 1, g = 0.5 then −0.25:  step 1: m = 0.05, v = 2.5e-4, m̂ = 0.5, v̂ = 0.25 → w1 = 0.99 − 0.1·0.5/(0.5 + 1e-8)
     *   = 0.890000002; step 2: m = 0.02, v = 3.1225e-4, m̂ = 0.02/0.19, v̂ = 3.1225e-4/0.001999 → w2 = 0.854466299.
     * w0 = −2, g = −1 then 3: w1 = −1.880000001, m2 = 0.21, v2 = 0.009999, w2 = −1.910618984. */
    const k3c_adamw_hp hp = {0.9, 0.999, 1e-8};
    float w[2] = {1.0f, -2.0f}, m[2] = {0, 0}, v[2] = {0, 0};
    const float g1[2] = {0.5f, -1.0f}, g2[2] = {-0.25f, 3.0f};
    k3c_adamw_update(&hp, w, g1, m, v, 2, 0.1, 0.1, 1);
    CHECK(fabs(w[0] - 0.890000002) < 1e-6 && fabs(w[1] + 1.880000001) < 1e-6, "step 1: w = %.9f %.9f", w[0], w[1]);
    CHECK(fabs(m[0] - 0.05) < 1e-8 && fabs(v[0] - 2.5e-4) < 1e-10, "step 1: m %g v %g", m[0], v[0]);
    k3c_adamw_update(&hp, w, g2, m, v, 2, 0.1, 0.1, 2);
    CHECK(fabs(w[0] - 0.8544662987) < 1e-6, "step 2: w0 = %.9f (want 0.854466299)", w[0]);
    CHECK(fabs(w[1] + 1.9106189841) < 1e-6, "step 2: w1 = %.9f (want -1.910618984)", w[1]);
    CHECK(fabs(m[0] - 0.02) < 1e-8 && fabs(v[0] - 3.1225e-4) < 1e-9, "step 2: m %g v %g", m[0], v[0]);
    CHECK(fabs(m[1] - 0.21) < 1e-7 && fabs(v[1] - 0.009999) < 1e-8, "step 2: m %g v %g", m[1], v[1]);
}

/* ---------------------------------------------------------------- Newton–Schulz */

static void test_ns5(void) {
    k3c_err err = {0};
    const int R = 24, C = 40;
    float *G = malloc(sizeof(float) * R * C), *Gt = malloc(sizeof(float) * R * C), *O = malloc(sizeof(float) * R * C),
          *Ot = malloc(sizeof(float) * R * C), *ws = malloc(sizeof(float) * k3c_ns_workspace(R, C));
    double *ref = malloc(sizeof(double) * R * C), sv[24];
    fill_normal(G, R * C, 11);
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) Gt[j * R + i] = G[i * C + j];
    CHECK_OK(k3c_newton_schulz(G, R, C, 5, O, ws, &err), &err);
    singular_values(O, R, C, sv);
    double lo = 1e9, hi = 0;
    for (int i = 0; i < R; i++) {
        lo = fmin(lo, sv[i]);
        hi = fmax(hi, sv[i]);
    }
    CHECK(lo >= 0.5 && hi <= 1.5, "NS5 singular values in [%.3f, %.3f], want within [0.5, 1.5]", lo, hi);
    if (getenv("K3C_TEST_VERBOSE")) printf("  NS5 singular values of a 24x40 Gaussian: [%.4f, %.4f]\n", lo, hi);
    /* against the double loop reference */
    ns_ref(G, R, C, 5, ref);
    double num = 0, den = 0;
    for (int i = 0; i < R * C; i++) {
        num += (O[i] - ref[i]) * (O[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    CHECK_LE(sqrt(num / den), 1e-5, "NS5 float32 vs double reference (rel)");
    /* the tall case is the transpose of the wide one, bit for bit (same internal layout) */
    CHECK_OK(k3c_newton_schulz(Gt, C, R, 5, Ot, ws, &err), &err);
    int same = 1;
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) same &= Ot[j * R + i] == O[i * C + j];
    CHECK(same, "NS5 of the transpose is not the transpose of NS5");
    singular_values(Ot, C, R, sv);
    lo = 1e9, hi = 0;
    for (int i = 0; i < R; i++) {
        lo = fmin(lo, sv[i]);
        hi = fmax(hi, sv[i]);
    }
    CHECK(lo >= 0.5 && hi <= 1.5, "tall NS5 singular values in [%.3f, %.3f]", lo, hi);
    /* steps = 0: just G / (‖G‖ + 1e-7); in place (O aliases G) */
    memcpy(O, G, sizeof(float) * R * C);
    CHECK_OK(k3c_newton_schulz(O, R, C, 0, O, ws, &err), &err);
    double fn = 0;
    for (int i = 0; i < R * C; i++) fn += (double)O[i] * O[i];
    CHECK(fabs(sqrt(fn) - 1) < 1e-6, "normalised Frobenius norm %.9f", sqrt(fn));
    CHECK(k3c_newton_schulz(G, 0, C, 5, O, ws, &err) == K3C_EINVAL, "empty matrix accepted");
    free(G);
    free(Gt);
    free(O);
    free(Ot);
    free(ws);
    free(ref);
}

/* ---------------------------------------------------------------- Muon */

static void test_muon_hand(void) {
    /* W [1, 2] = (1, 2), lr 0.1, wd 0, ns_steps 0 (O = G̃/(‖G̃‖ + 1e-7)), scale 0.2·sqrt(2); g = (3, 4) then (1, 0).
     * Nesterov: M1 = (3, 4), G̃1 = 1.95·(3, 4) → O = (0.6, 0.8) → W1 = (0.98302944, 1.97737258);
     *           M2 = 0.95·(3, 4) + (1, 0) = (3.85, 3.8), G̃2 = (1, 0) + 0.95·M2 = (4.6575, 3.61)
     *           → W2 = (0.96067414, 1.96004513).
     * Plain momentum: G̃2 = M2 → W2 = (0.96289915, 1.95750373). */
    k3c_err err = {0};
    float ws[64];
    for (int nest = 0; nest <= 1; nest++) {
        k3c_muon_hp hp = {0.95, nest, 0, 0.2};
        float w[2] = {1, 2}, mom[2] = {0, 0};
        const float g1[2] = {3, 4}, g2[2] = {1, 0};
        CHECK_OK(k3c_muon_update(&hp, w, g1, mom, 1, 2, 0, 0.1, 0.0, ws, &err), &err);
        CHECK(fabs(w[0] - 0.9830294375) < 1e-6 && fabs(w[1] - 1.9773725833) < 1e-6, "nesterov %d step 1: %.8f %.8f",
              nest, w[0], w[1]);
        CHECK_OK(k3c_muon_update(&hp, w, g2, mom, 1, 2, 0, 0.1, 0.0, ws, &err), &err);
        CHECK(fabs(mom[0] - 3.85) < 1e-6 && fabs(mom[1] - 3.8) < 1e-6, "momentum %.7f %.7f", mom[0], mom[1]);
        double e0 = nest ? 0.9606741409 : 0.9628991490, e1 = nest ? 1.9600451285 : 1.9575037272;
        CHECK(fabs(w[0] - e0) < 1e-6 && fabs(w[1] - e1) < 1e-6, "nesterov %d step 2: %.8f %.8f want %.8f %.8f", nest,
              w[0], w[1], e0, e1);
    }
    /* weight decay is decoupled: zero gradient → W·(1 − lr·wd) exactly */
    k3c_muon_hp hp = {0.95, 1, 5, 0.2};
    float w[6] = {1, -2, 3, 4, 5, -6}, g[6] = {0}, mom[6] = {0};
    CHECK_OK(k3c_muon_update(&hp, w, g, mom, 2, 3, 0, 0.5, 0.1, ws, &err), &err);
    CHECK(fabs(w[5] + 6 * 0.95) < 1e-6 && fabs(w[0] - 0.95) < 1e-7, "decay only: %.7f %.7f", w[0], w[5]);
}

/* The update of one [R, C] block by hand from k3c_newton_schulz: W·decay − lr·0.2·sqrt(max(R, C))·NS(g + μ·g). */
static void expected_block(const float *w0, const float *g, int64_t R, int64_t C, double lr, double wd, float *out) {
    k3c_err err = {0};
    float *U = malloc(sizeof(float) * R * C), *ws = malloc(sizeof(float) * k3c_ns_workspace(R, C));
    for (int64_t i = 0; i < R * C; i++) U[i] = g[i] + 0.95f * g[i]; /* first step: M = g, Nesterov */
    k3c_newton_schulz(U, R, C, 5, U, ws, &err);
    float step = (float)(lr * 0.2 * sqrt((double)(R > C ? R : C))), decay = (float)(1 - lr * wd);
    for (int64_t i = 0; i < R * C; i++) out[i] = w0[i] * decay - step * U[i];
    free(U);
    free(ws);
}

static void test_muon_per_head(void) {
    k3c_err err = {0};
    const int64_t R = 12, C = 10, HR = 4;
    k3c_muon_hp hp = {0.95, 1, 5, 0.2};
    float w0[120], g[120], w[120], mom[120] = {0}, want[120], whole[120], mom2[120] = {0};
    float *ws = malloc(sizeof(float) * k3c_muon_workspace(R, C, 0));
    fill_normal(w0, R * C, 21);
    fill_normal(g, R * C, 22);
    for (int h = 0; h < 3; h++) g[h * HR * C] *= 1 + 10 * h; /* heads of different gradient scale */
    memcpy(w, w0, sizeof w);
    CHECK_OK(k3c_muon_update(&hp, w, g, mom, R, C, HR, 0.02, 0.1, ws, &err), &err);
    for (int h = 0; h < 3; h++) expected_block(w0 + h * HR * C, g + h * HR * C, HR, C, 0.02, 0.1, want + h * HR * C);
    CHECK_LE(max_abs_diff(w, want, R * C), 1e-7, "per-head Muon vs NS5 per block");
    /* scale factor of each block is 0.2·sqrt(max(4, 10)): the update RMS of every head is the same */
    double rms[3];
    for (int h = 0; h < 3; h++) {
        double s = 0;
        for (int i = 0; i < HR * C; i++) {
            double d = (w[h * HR * C + i] - w0[h * HR * C + i] * (1 - 0.002)) / (0.02 * 0.2 * sqrt(10.0));
            s += d * d;
        }
        rms[h] = sqrt(s / (HR * C));
    }
    CHECK(fabs(rms[0] - rms[2]) < 0.2 * rms[0], "per-head update RMS differs: %.4f %.4f %.4f", rms[0], rms[1], rms[2]);
    /* whole-matrix Muon is different (and scaled by sqrt(max(12, 10))) */
    memcpy(whole, w0, sizeof whole);
    CHECK_OK(k3c_muon_update(&hp, whole, g, mom2, R, C, 0, 0.02, 0.1, ws, &err), &err);
    expected_block(w0, g, R, C, 0.02, 0.1, want);
    CHECK_LE(max_abs_diff(whole, want, R * C), 1e-7, "whole-matrix Muon vs NS5 with 0.2*sqrt(12)");
    CHECK(max_abs_diff(whole, w, R * C) > 1e-4, "per-head equals whole-matrix Muon");
    CHECK(k3c_muon_update(&hp, w, g, mom, R, C, 5, 0.02, 0.1, ws, &err) == K3C_EINVAL, "head_rows 5 of 12 accepted");
    free(ws);
}

static void test_muon_scale(void) {
    /* Wide and tall whole matrices: update = lr·0.2·sqrt(max(A, B))·NS5(G̃), the same sqrt(40) for 24x40 and 40x24. */
    k3c_err err = {0};
    const int64_t A = 24, B = 40;
    float *w0 = malloc(sizeof(float) * A * B), *g = malloc(sizeof(float) * A * B), *w = malloc(sizeof(float) * A * B),
          *mom = calloc((size_t)(A * B), sizeof(float)), *want = malloc(sizeof(float) * A * B),
          *ws = malloc(sizeof(float) * k3c_muon_workspace(B, A, 0));
    fill_normal(w0, A * B, 31);
    fill_normal(g, A * B, 32);
    k3c_muon_hp hp = {0.95, 1, 5, 0.2};
    for (int tall = 0; tall <= 1; tall++) {
        int64_t r = tall ? B : A, c = tall ? A : B;
        memcpy(w, w0, sizeof(float) * A * B);
        memset(mom, 0, sizeof(float) * A * B);
        CHECK_OK(k3c_muon_update(&hp, w, g, mom, r, c, 0, 0.01, 0.0, ws, &err), &err);
        expected_block(w0, g, r, c, 0.01, 0.0, want);
        CHECK_LE(max_abs_diff(w, want, A * B), 1e-7, tall ? "tall Muon update" : "wide Muon update");
        /* the RMS of O is about sqrt(min/ (min·max))·σ ≈ 1/sqrt(max): the scaled update RMS is ≈ 0.2·lr */
        double s = 0;
        for (int64_t i = 0; i < A * B; i++) s += (double)(w[i] - w0[i]) * (w[i] - w0[i]);
        double rms = sqrt(s / (double)(A * B)) / 0.01;
        CHECK(rms > 0.1 && rms < 0.3, "update RMS / lr = %.4f, want about 0.2", rms);
    }
    free(w0);
    free(g);
    free(w);
    free(mom);
    free(want);
    free(ws);
}

/* ---------------------------------------------------------------- the combined optimizer */

static void test_optim_table(void) {
    k3c_err err = {0};
    k3c_param_table t;
    test_table(&t);
    k3c_optim o;
    k3c_optim_defaults(&o);
    /* Muon state: 960 + 120 + 72 (one float per matrix element); AdamW: 2·(20 + 7 + 12); router bias: none */
    size_t want_state = 960 + 120 + 72 + 2 * (20 + 7 + 12);
    size_t got_state = k3c_optim_state_numel(&o, &t);
    CHECK(got_state == want_state, "state %zu, want %zu", got_state, want_state);
    CHECK_OK(k3c_optim_init(&o, &t, &err), &err);
    float *w0 = malloc(sizeof(float) * t.total), *g = malloc(sizeof(float) * t.total),
          *w = malloc(sizeof(float) * t.total), *w2 = malloc(sizeof(float) * t.total),
          *st = calloc(o.state_numel, sizeof(float)), *st2 = calloc(o.state_numel, sizeof(float)),
          *want = malloc(sizeof(float) * t.total);
    fill_normal(w0, (int64_t)t.total, 41);
    fill_normal(g, (int64_t)t.total, 42);
    memcpy(w, w0, sizeof(float) * t.total);
    const double lr = 0.01;
    CHECK_OK(k3c_optim_step(&o, &t, w, g, st, lr, 1, &err), &err);
    /* whole matrix, per-head matrix, and each expert slice on its own */
    expected_block(w0 + t.p[0].offset, g + t.p[0].offset, 24, 40, lr, 0.1, want);
    CHECK_LE(max_abs_diff(w + t.p[0].offset, want, 960), 1e-7, "MATRIX entry via k3c_optim_step");
    for (int h = 0; h < 3; h++)
        expected_block(w0 + t.p[1].offset + h * 40, g + t.p[1].offset + h * 40, 4, 10, lr, 0.1, want + h * 40);
    CHECK_LE(max_abs_diff(w + t.p[1].offset, want, 120), 1e-7, "per-head entry via k3c_optim_step");
    for (int e = 0; e < 3; e++)
        expected_block(w0 + t.p[2].offset + e * 24, g + t.p[2].offset + e * 24, 6, 4, lr, 0.1, want + e * 24);
    CHECK_LE(max_abs_diff(w + t.p[2].offset, want, 72), 1e-7, "stacked experts: one Muon matrix per slice");
    /* AdamW entries: EMBED and HEAD decayed, VECTOR not */
    const k3c_adamw_hp hp = {0.9, 0.95, 1e-8};
    const int adam_idx[3] = {3, 4, 6};
    const double adam_wd[3] = {0.1, 0.0, 0.1};
    for (int a = 0; a < 3; a++) {
        const k3c_param *p = &t.p[adam_idx[a]];
        float mm[32] = {0}, vv[32] = {0};
        memcpy(want, w0 + p->offset, sizeof(float) * p->numel);
        k3c_adamw_update(&hp, want, g + p->offset, mm, vv, p->numel, lr, adam_wd[a], 1);
        CHECK(max_abs_diff(w + p->offset, want, p->numel) == 0, "%s: AdamW mismatch", p->name);
    }
    /* the router bias is never touched */
    const k3c_param *rb = &t.p[5];
    CHECK(memcmp(w + rb->offset, w0 + rb->offset, sizeof(float) * rb->numel) == 0, "router bias changed");
    /* bit-for-bit reproducible */
    memcpy(w2, w0, sizeof(float) * t.total);
    CHECK_OK(k3c_optim_step(&o, &t, w2, g, st2, lr, 1, &err), &err);
    CHECK(memcmp(w, w2, sizeof(float) * t.total) == 0 && memcmp(st, st2, sizeof(float) * o.state_numel) == 0,
          "two identical steps differ");
    CHECK(k3c_optim_step(&o, &t, w2, g, st2, lr, 0, &err) == K3C_EINVAL, "step 0 accepted");
    /* the Newton–Schulz precision: the CPU's auto is fp32; bf16 is refused before anything is written */
    int mp = -1;
    static const char *const prec[3] = {"auto", "fp32", "bf16"};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(k3c_optim_parse_muon_precision(prec[i], &mp, &err), &err);
        CHECK(mp == i, "muon precision %s parsed as %d", prec[i], mp);
    }
    CHECK(k3c_optim_parse_muon_precision("fp16", &mp, &err) == K3C_EINVAL && mp == 2 && strstr(err.msg, "fp16"),
          "muon precision fp16 accepted (%d, '%s')", mp, err.msg);
    memcpy(w2, w0, sizeof(float) * t.total);
    memset(st2, 0, sizeof(float) * o.state_numel);
    o.muon_precision = K3C_MUON_FP32;
    CHECK_OK(k3c_optim_step(&o, &t, w2, g, st2, lr, 1, &err), &err);
    CHECK(memcmp(w, w2, sizeof(float) * t.total) == 0 && memcmp(st, st2, sizeof(float) * o.state_numel) == 0,
          "muon precision fp32 differs from auto on the CPU");
    memcpy(w2, w0, sizeof(float) * t.total);
    memset(st2, 0, sizeof(float) * o.state_numel);
    o.muon_precision = K3C_MUON_BF16;
    const k3c_backend_f32 *cpu = k3c_backend_cpu_f32();
    void *inst = NULL;
    CHECK(cpu->optim_open(cpu->ctx, &o, &t, &inst, &err) == K3C_EUNSUPPORTED && strstr(err.msg, "bf16"),
          "CPU table opened a bf16 Muon: '%s'", err.msg);
    CHECK(k3c_optim_step(&o, &t, w2, g, st2, lr, 1, &err) == K3C_EUNSUPPORTED, "CPU stepped a bf16 Muon");
    int untouched = memcmp(w2, w0, sizeof(float) * t.total) == 0;
    for (size_t i = 0; i < o.state_numel; i++) untouched &= st2[i] == 0;
    CHECK(untouched, "a refused bf16 step wrote weights or state");
    k3c_optim_free(&o);
    k3c_optim bad;
    k3c_optim_defaults(&bad);
    bad.muon_precision = 3;
    CHECK(k3c_optim_init(&bad, &t, &err) == K3C_EINVAL, "muon precision 3 accepted");

    /* matrices on AdamW: twice the state, and a matrix entry equals plain AdamW with decay */
    int mo = -1;
    CHECK_OK(k3c_optim_parse_matrix("adamw", &mo, &err), &err);
    CHECK(k3c_optim_parse_matrix("sgd", &mo, &err) == K3C_EINVAL, "unknown optimizer name accepted");
    k3c_optim_defaults(&o);
    o.matrix_optimizer = K3C_MATRIX_ADAMW;
    CHECK_OK(k3c_optim_init(&o, &t, &err), &err);
    CHECK(o.state_numel == 2 * (960 + 120 + 72 + 20 + 7 + 12), "adamw state %zu", o.state_numel);
    float *st3 = calloc(o.state_numel, sizeof(float));
    memcpy(w, w0, sizeof(float) * t.total);
    CHECK_OK(k3c_optim_step(&o, &t, w, g, st3, lr, 1, &err), &err);
    float *mm = calloc(120, sizeof(float)), *vv = calloc(120, sizeof(float));
    memcpy(want, w0 + t.p[1].offset, sizeof(float) * 120);
    k3c_adamw_update(&hp, want, g + t.p[1].offset, mm, vv, 120, lr, 0.1, 1);
    CHECK(max_abs_diff(w + t.p[1].offset, want, 120) == 0, "matrix on AdamW mismatch");
    CHECK(memcmp(w + rb->offset, w0 + rb->offset, sizeof(float) * rb->numel) == 0, "router bias changed (adamw)");
    k3c_optim_free(&o);
    free(w0);
    free(g);
    free(w);
    free(w2);
    free(st);
    free(st2);
    free(st3);
    free(want);
    free(mm);
    free(vv);
    free(t.p);
}

/* ---------------------------------------------------------------- clipping */

static void test_clip(void) {
    k3c_param_table t;
    memset(&t, 0, sizeof t);
    t.cap = 4;
    t.p = calloc(4, sizeof *t.p);
    tab_add(&t, "big.weight", K3C_PK_MATRIX, 300, 1000, 0, 0); /* 300K elements: several norm blocks */
    tab_add(&t, "bias", K3C_PK_ROUTER_BIAS, 8, 0, 0, 0);
    tab_add(&t, "norm.weight", K3C_PK_VECTOR, 5, 0, 0, 0);
    float *g = malloc(sizeof(float) * t.total), *g0 = malloc(sizeof(float) * t.total);
    fill_normal(g, (int64_t)t.total, 51);
    for (int i = 0; i < 8; i++) g[t.p[1].offset + i] = 1e6f; /* excluded from the norm */
    double ss = 0;
    for (int i = 0; i < 2; i++) {
        const k3c_param *p = &t.p[i == 0 ? 0 : 2];
        for (int64_t j = 0; j < p->numel; j++) ss += (double)g[p->offset + j] * g[p->offset + j];
    }
    const double ref = sqrt(ss);
    memcpy(g0, g, sizeof(float) * t.total);
    omp_set_num_threads(1);
    double n1 = k3c_grad_norm(&t, g);
    omp_set_num_threads(2);
    double n2 = k3c_grad_norm(&t, g);
    CHECK(n1 == n2, "grad norm depends on threads: %.17g vs %.17g", n1, n2);
    CHECK_LE(fabs(n1 - ref) / ref, 1e-13, "grad norm vs sequential double sum (rel)");
    /* no clipping when below the threshold */
    double pre = k3c_clip_grad_norm(&t, g, 2 * ref);
    CHECK(pre == n1 && memcmp(g, g0, sizeof(float) * t.total) == 0, "clip changed g below threshold");
    pre = k3c_clip_grad_norm(&t, g, 0.5 * ref);
    CHECK(pre == n1, "clip returned %.9g, want the pre-clip norm %.9g", pre, n1);
    CHECK_LE(fabs(k3c_grad_norm(&t, g) - 0.5 * ref) / (0.5 * ref), 1e-6, "post-clip norm vs max_norm (rel)");
    CHECK(g[t.p[1].offset] == 1e6f, "router bias gradient scaled");
    CHECK(fabs(g[t.p[2].offset] - 0.5 * g0[t.p[2].offset]) < 1e-6 * fabs(g0[t.p[2].offset]) + 1e-12,
          "vector gradient not scaled by 0.5");
    g[3] = NAN;
    memcpy(g0, g, sizeof(float) * t.total);
    pre = k3c_clip_grad_norm(&t, g, 1.0);
    CHECK(isnan(pre) && memcmp(g, g0, sizeof(float) * t.total) == 0, "NaN gradient: norm %g, g changed", pre);
    free(g);
    free(g0);
    free(t.p);
}

/* ---------------------------------------------------------------- schedule */

static void test_schedule(void) {
    k3c_err err = {0};
    k3c_schedule s = {K3C_SCHED_COSINE, 1e-3, 10, 110, 0.1};
    CHECK(k3c_schedule_lr(&s, 0) == 0, "lr(0) = %g", k3c_schedule_lr(&s, 0));
    CHECK(fabs(k3c_schedule_lr(&s, 5) - 5e-4) < 1e-15, "warmup midpoint %g", k3c_schedule_lr(&s, 5));
    CHECK(fabs(k3c_schedule_lr(&s, 10) - 1e-3) < 1e-15, "peak %g", k3c_schedule_lr(&s, 10));
    CHECK(fabs(k3c_schedule_lr(&s, 35) - (1e-4 + 0.45e-3 * (1 + sqrt(0.5)))) < 1e-15, "cosine quarter %g",
          k3c_schedule_lr(&s, 35));
    CHECK(fabs(k3c_schedule_lr(&s, 60) - 5.5e-4) < 1e-15, "cosine midpoint %g", k3c_schedule_lr(&s, 60));
    CHECK(fabs(k3c_schedule_lr(&s, 110) - 1e-4) < 1e-15, "end %g", k3c_schedule_lr(&s, 110));
    CHECK(fabs(k3c_schedule_lr(&s, 500) - 1e-4) < 1e-15, "after end %g", k3c_schedule_lr(&s, 500));
    s.kind = K3C_SCHED_LINEAR;
    CHECK(fabs(k3c_schedule_lr(&s, 35) - 7.75e-4) < 1e-15, "linear quarter %g", k3c_schedule_lr(&s, 35));
    CHECK(fabs(k3c_schedule_lr(&s, 110) - 1e-4) < 1e-15, "linear end %g", k3c_schedule_lr(&s, 110));
    s.kind = K3C_SCHED_CONSTANT;
    CHECK(k3c_schedule_lr(&s, 100) == 1e-3 && fabs(k3c_schedule_lr(&s, 3) - 3e-4) < 1e-15, "constant %g",
          k3c_schedule_lr(&s, 100));
    k3c_schedule nw = {K3C_SCHED_LINEAR, 2e-4, 0, 100, 0.0}; /* an annealing stage: no warmup, decay to 0 */
    CHECK(k3c_schedule_lr(&nw, 0) == 2e-4 && fabs(k3c_schedule_lr(&nw, 50) - 1e-4) < 1e-16 &&
              k3c_schedule_lr(&nw, 100) == 0,
          "anneal stage %g %g %g", k3c_schedule_lr(&nw, 0), k3c_schedule_lr(&nw, 50), k3c_schedule_lr(&nw, 100));
    int kind = -1;
    CHECK(k3c_schedule_parse("linear", &kind, &err) == 0 && kind == K3C_SCHED_LINEAR, "parse linear");
    CHECK(k3c_schedule_parse("wsd", &kind, &err) == K3C_EINVAL, "parse wsd accepted");
}

/* ---------------------------------------------------------------- QK-Clip */

/* Expected factor of every row of q [H·(nope+rope)] and kv_b [H·(nope+dv)] given per-head γ (1 = untouched). */
static void check_clip_rows(const float *w, const float *w0, size_t q_off, int64_t q_cols, size_t kv_off,
                            int64_t kv_cols, const double *gamma, const char *what) {
    const int H = 3, nope = 4, rope = 2, dv = 3;
    int bad = 0;
    for (int h = 0; h < H; h++)
        for (int r = 0; r < nope + rope; r++) {
            double f = r < nope ? sqrt(gamma[h]) : gamma[h];
            for (int c = 0; c < q_cols; c++) {
                size_t i = q_off + (size_t)((h * (nope + rope) + r) * q_cols + c);
                bad += fabs(w[i] - (float)(w0[i] * f)) > 1e-6;
            }
        }
    for (int h = 0; h < H; h++)
        for (int r = 0; r < nope + dv; r++) {
            double f = r < nope ? sqrt(gamma[h]) : 1.0;
            for (int c = 0; c < kv_cols; c++) {
                size_t i = kv_off + (size_t)((h * (nope + dv) + r) * kv_cols + c);
                bad += fabs(w[i] - (float)(w0[i] * f)) > 1e-6;
            }
        }
    CHECK(bad == 0, "%s: %d elements scaled wrongly", what, bad);
}

static void test_qk_clip(void) {
    k3c_err err = {0};
    k3c_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.mla_heads = 3;
    cfg.qk_nope_dim = 4;
    cfg.qk_rope_dim = 2;
    cfg.v_head_dim = 3;
    cfg.hidden_size = 5;
    cfg.kv_lora_rank = 6;
    /* buffer: kv_a [8, 5] (k_pe lives here: untouched), q_proj [18, 5], kv_b [21, 6], q_b [18, 3] */
    const size_t kv_a = 0, q_proj = 40, kv_b = q_proj + 90, q_b = kv_b + 126, total = q_b + 54;
    float w0[310], w[310];
    fill_normal(w0, (int64_t)total, 61);
    k3c_layer_offsets o;
    memset(&o, 0xff, sizeof o); /* every offset K3C_NOPARAM */
    o.kv_a = kv_a;
    o.q_proj = q_proj;
    o.kv_b = kv_b;
    /* head 0 below τ, head 1 at 4τ (γ = 1/4: nope × 1/2, rope × 1/4), head 2 exactly τ (not clipped: strict >) */
    const float smax[3] = {50, 400, 100};
    const double gamma[3] = {1, 0.25, 1};
    memcpy(w, w0, sizeof w);
    int nc = -1;
    CHECK_OK(k3c_qk_clip_layer(&cfg, &o, w, smax, K3C_QK_CLIP_TAU, &nc, &err), &err);
    CHECK(nc == 1, "clipped %d heads, want 1", nc);
    check_clip_rows(w, w0, q_proj, 5, kv_b, 6, gamma, "q_proj layer");
    CHECK(memcmp(w + kv_a, w0 + kv_a, 40 * sizeof(float)) == 0 && memcmp(w + q_b, w0 + q_b, 54 * sizeof(float)) == 0,
          "kv_a (k_pe) or an unrelated tensor changed");
    /* the logit q·k of head 1 shrinks by exactly γ: nope part sqrt(γ)², rope part γ with k_pe untouched */

    /* q_lora_rank > 0: q_b_proj [18, 3]; the whole-model wrapper over a KDA layer and an MLA layer */
    cfg.q_lora_rank = 3;
    cfg.num_layers = 2;
    cfg.mixer[0] = K3C_MIXER_KDA;
    cfg.mixer[1] = K3C_MIXER_MLA;
    k3c_layer_offsets lay[2];
    memset(lay, 0xff, sizeof lay);
    lay[1].q_b = q_b;
    lay[1].kv_b = kv_b;
    lay[1].kv_a = kv_a;
    k3c_param_table t;
    memset(&t, 0, sizeof t);
    t.layer = lay;
    t.res = k3c_residency_whole(&cfg);
    const float smax2[6] = {1e9f, 1e9f, 1e9f, /* layer 0 (KDA): not read */ 200, 10, 1000};
    const double gamma2[3] = {0.5, 1, 0.1};
    memcpy(w, w0, sizeof w);
    CHECK_OK(k3c_qk_clip(&cfg, &t, w, smax2, 100.0, &nc, &err), &err);
    CHECK(nc == 2, "clipped %d heads, want 2", nc);
    check_clip_rows(w, w0, q_b, 3, kv_b, 6, gamma2, "q_b layer");
    CHECK(memcmp(w + q_proj, w0 + q_proj, 90 * sizeof(float)) == 0, "q_proj changed in the q_lora case");
    const float bad[3] = {1, NAN, 1};
    CHECK(k3c_qk_clip_layer(&cfg, &lay[1], w, bad, 100.0, &nc, &err) == K3C_ENUMERIC, "NaN S_max accepted");
    CHECK(k3c_qk_clip_layer(&cfg, &lay[1], w, smax, 0.0, &nc, &err) == K3C_EINVAL, "tau 0 accepted");
}

/* The CPU backend table's training entries (ops/backend.h) are the direct functions: optimizer step, clipping and
 * QK-Clip over the tiny K3 test model's parameter table give the same bits. */
static void test_backend_entries(void) {
    k3c_err err = {0};
    k3c_config cfg;
    k3c_param_table t;
    if (k3c_config_load("configs/k3_test_tiny.json", &cfg, &err) || k3c_params_build(&cfg, &t, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    const k3c_backend_f32 *be = k3c_backend_cpu_f32();
    k3c_optim o;
    k3c_optim_defaults(&o);
    CHECK_OK(k3c_optim_init(&o, &t, &err), &err);
    const size_t n = t.total, ns = o.state_numel;
    float *w = malloc(4 * n), *w2 = malloc(4 * n), *g = malloc(4 * n), *g2 = malloc(4 * n);
    float *st = calloc(ns, 4), *st2 = calloc(ns, 4);
    fill_normal(w, (int64_t)n, 71);
    fill_normal(g, (int64_t)n, 72);
    memcpy(w2, w, 4 * n);
    memcpy(g2, g, 4 * n);
    void *inst = (void *)1;
    CHECK_OK(be->optim_open(be->ctx, &o, &t, &inst, &err), &err);
    double norm = 0;
    for (int step = 1; step <= 2; step++) {
        const double ref = k3c_clip_grad_norm(&t, g, 0.5);
        CHECK_OK(k3c_optim_step(&o, &t, w, g, st, 1e-2, step, &err), &err);
        CHECK_OK(be->clip_grad_norm(inst, &t, g2, 0.5, &norm, &err), &err);
        CHECK_OK(be->optim_step(inst, &o, &t, 0, t.n, w2, g2, st2, 1e-2, step, &err), &err);
        CHECK(norm == ref && ref > 0.5, "step %d: table grad norm %.9g vs %.9g", step, norm, ref);
    }
    CHECK(memcmp(w, w2, 4 * n) == 0 && memcmp(g, g2, 4 * n) == 0 && memcmp(st, st2, 4 * ns) == 0,
          "the table's optimizer differs from k3c_optim_step");
    CHECK_OK(be->clip_grad_norm(inst, &t, g2, 0, &norm, &err), &err);
    CHECK(norm == k3c_grad_norm(&t, g) && memcmp(g, g2, 4 * n) == 0, "max_norm 0: not the plain norm, or g changed");
    be->optim_close(inst);
    /* QK-Clip: S_max in [50, 200) around τ = 100 */
    const size_t nh = (size_t)(cfg.num_layers * cfg.mla_heads);
    float *smax = malloc(4 * (nh ? nh : 1));
    for (size_t i = 0; i < nh; i++) smax[i] = (float)(50 + 150 * k3c_uniform_at(73, i));
    memcpy(w2, w, 4 * n);
    int nc = 0;
    int32_t nt = 0;
    CHECK_OK(k3c_qk_clip(&cfg, &t, w, smax, 100.0, &nc, &err), &err);
    CHECK_OK(be->qk_clip(be->ctx, &cfg, &t, w2, smax, 100.0, &nt, &err), &err);
    CHECK(nc > 0 && nt == nc && memcmp(w, w2, 4 * n) == 0, "table qk_clip: %d heads vs %d, or other weights", nt, nc);
    for (int l = 0; l < cfg.num_layers; l++) /* the first MLA layer's first head (KDA layers' rows are not read) */
        if (cfg.mixer[l] == K3C_MIXER_MLA) {
            smax[(size_t)l * (size_t)cfg.mla_heads] = NAN;
            break;
        }
    CHECK(be->qk_clip(be->ctx, &cfg, &t, w2, smax, 100.0, &nt, &err) == K3C_ENUMERIC && nt == -1,
          "table qk_clip accepted a NaN S_max (count %d)", nt);
    free(w), free(w2), free(g), free(g2), free(st), free(st2), free(smax);
    k3c_optim_free(&o);
    k3c_params_free(&t);
}

int main(void) {
    test_adamw_hand();
    test_ns5();
    test_muon_hand();
    test_muon_per_head();
    test_muon_scale();
    test_optim_table();
    test_clip();
    test_schedule();
    test_qk_clip();
    test_backend_entries();
    return test_summary();
}
