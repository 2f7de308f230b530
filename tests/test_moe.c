/* test_moe.c — SiLU/SiTU-GLU, the sigmoid router (top-k, bias, cutoff, weights), the dispatch plan, routed experts and
 * the dense GLU MLP: forward vs plain loops, float64 finite differences (docs/MODEL.md §6.2, §8, §9, §12). */
#include "ops/moe.h"
#include "test.h"

#include <float.h>

#define FD_TOL 1e-6 /* relative error of float64 central differences (preamble) */

static void randn(k3c_rng *r, double *x, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * k3c_rng_normal(r);
}

static double dot(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ================================================================ GLU */
typedef struct {
    k3c_glu_sizes s;
    double *g, *u, *R, *h;
} glu_ctx;

static double glu_loss(void *p) {
    glu_ctx *c = p;
    k3c_glu_fwd_f64(&c->s, c->g, c->u, c->h, NULL);
    return dot(c->h, c->R, (size_t)(c->s.rows * c->s.inter));
}

static void glu_fd_case(const char *name, k3c_glu_act act, const double *g0, const double *u0, int64_t rows,
                        int64_t inter, k3c_rng *rng) {
    size_t n = (size_t)(rows * inter);
    glu_ctx c = {{rows, inter, act}, malloc(n * 8), malloc(n * 8), malloc(n * 8), malloc(n * 8)};
    memcpy(c.g, g0, n * 8);
    memcpy(c.u, u0, n * 8);
    randn(rng, c.R, n, 1.0);
    double *dg = calloc(n, 8), *du = calloc(n, 8);
    k3c_err err = {0};
    CHECK_OK(k3c_glu_bwd_f64(&c.s, c.g, c.u, c.R, dg, du, &err), &err);
    char what[128];
    snprintf(what, sizeof what, "GLU %s dgate FD rel err", name);
    CHECK_LE(test_fd_rel_err(glu_loss, &c, c.g, n, dg), FD_TOL, what);
    snprintf(what, sizeof what, "GLU %s dup FD rel err", name);
    CHECK_LE(test_fd_rel_err(glu_loss, &c, c.u, n, du), FD_TOL, what);
    /* backward adds: a second call doubles the gradients */
    double *dg2 = malloc(n * 8);
    memcpy(dg2, dg, n * 8);
    k3c_glu_bwd_f64(&c.s, c.g, c.u, c.R, dg2, NULL, &err);
    int doubled = 1;
    for (size_t i = 0; i < n; i++) doubled &= dg2[i] == 2 * dg[i];
    CHECK(doubled, "GLU %s backward accumulates", name);
    free(c.g), free(c.u), free(c.R), free(c.h), free(dg), free(du), free(dg2);
}

static void test_glu(void) {
    k3c_rng rng = {101, 0};
    const k3c_glu_act silu = {K3C_ACT_SILU, 0, 0}, situ = {K3C_ACT_SITU, 4, 25}, gelu = {K3C_ACT_GELU, 0, 0};
    enum { ROWS = 5, INTER = 8, N = ROWS * INTER };
    double g[N], u[N];
    randn(&rng, g, N, 2.0);
    randn(&rng, u, N, 2.0);
    glu_fd_case("silu moderate", silu, g, u, ROWS, INTER, &rng);
    glu_fd_case("situ moderate", situ, g, u, ROWS, INTER, &rng);
    glu_fd_case("gelu moderate", gelu, g, u, ROWS, INTER, &rng);
    /* large |g|, |u|: tanh saturates (g/β1 up to 10, u/β2 up to 8) and the sigmoid saturates */
    const double big_g[] = {6, -6, 10, -10, 20, -20, 40, -40}, big_u[] = {40, -40, 80, -80, 200, -200, 30, -60};
    for (int i = 0; i < N; i++) {
        g[i] = big_g[i % 8] * (1 + 0.01 * (i / 8));
        u[i] = big_u[(i + 3) % 8] * (1 + 0.01 * (i / 8));
    }
    glu_fd_case("situ saturated", situ, g, u, ROWS, INTER, &rng);
    glu_fd_case("silu large", silu, g, u, ROWS, INTER, &rng);
    glu_fd_case("gelu large", gelu, g, u, ROWS, INTER, &rng);

    /* exact values at a few points (formulas of §8 evaluated here in double) */
    double gg[3] = {1.5, -3, 50}, uu[3] = {-2, 70, 0.5}, h[3];
    k3c_glu_sizes s3 = {1, 3, situ};
    k3c_glu_fwd_f64(&s3, gg, uu, h, NULL);
    double maxd = 0;
    for (int i = 0; i < 3; i++) {
        double a = 4 * tanh(gg[i] / 4) / (1 + exp(-gg[i])), c = 25 * tanh(uu[i] / 25);
        maxd = fmax(maxd, fabs(h[i] - a * c) / fabs(a * c));
    }
    CHECK_LE(maxd, 1e-15, "SiTU forward vs formula");
    k3c_glu_sizes s3l = {1, 3, silu};
    k3c_glu_fwd_f64(&s3l, gg, uu, h, NULL);
    maxd = 0;
    for (int i = 0; i < 3; i++) maxd = fmax(maxd, fabs(h[i] - gg[i] / (1 + exp(-gg[i])) * uu[i]) / fabs(h[i]));
    CHECK_LE(maxd, 1e-15, "SiLU forward vs formula");
    /* GeGLU: gelu(g)·u with Φ from erfc (an independent formula: Φ(g) = ½ erfc(−g/√2)) */
    k3c_glu_sizes s3g = {1, 3, gelu};
    k3c_glu_fwd_f64(&s3g, gg, uu, h, NULL);
    maxd = 0;
    for (int i = 0; i < 3; i++) {
        double want = gg[i] * 0.5 * erfc(-gg[i] / sqrt(2.0)) * uu[i];
        maxd = fmax(maxd, fabs(h[i] - want) / fabs(want));
    }
    CHECK_LE(maxd, 1e-14, "GELU forward vs formula");
    /* GELU(1) = 0.841344746068543 (Φ(1) = 0.841344746068543), GELU(-1) = -0.158655253931457 */
    double g1[2] = {1, -1}, u1[2] = {1, 1}, h1[2];
    k3c_glu_sizes s2g = {1, 2, gelu};
    k3c_glu_fwd_f64(&s2g, g1, u1, h1, NULL);
    CHECK(fabs(h1[0] - 0.841344746068543) < 1e-14 && fabs(h1[1] + 0.158655253931457) < 1e-14, "GELU(±1) = %.15f, %.15f",
          h1[0], h1[1]);

    k3c_err err = {0};
    k3c_glu_sizes bad = {1, 3, {K3C_ACT_SITU, 0, 25}};
    CHECK(k3c_glu_fwd_f64(&bad, gg, uu, h, &err) == K3C_EINVAL, "SiTU with beta1 = 0 rejected");
}

/* §8 / §12: min a ≈ −0.270, |a·c| ≤ β1·β2 = 100 approached for large g, u; SiTU → SiLU-GLU as β → ∞. */
static void test_situ_facts(void) {
    const k3c_glu_act situ = {K3C_ACT_SITU, 4, 25};
    enum { N = 100001, GRID = 317 * 316 }; /* GRID > N: the arrays hold both */
    double *g = malloc(GRID * 8), *u = malloc(GRID * 8), *h = malloc(GRID * 8);
    const double u1 = 25 * atanh(1.0 / 25); /* c(u1) = 1, so h = a(g) */
    for (int i = 0; i < N; i++) {
        g[i] = -5 + 5.0 * i / (N - 1);
        u[i] = u1;
    }
    k3c_glu_sizes s = {1, N, situ};
    k3c_glu_fwd_f64(&s, g, u, h, NULL);
    double mn = INFINITY, gmin = 0;
    for (int i = 0; i < N; i++)
        if (h[i] < mn) mn = h[i], gmin = g[i];
    CHECK(fabs(mn - (-0.2697690)) < 1e-6 && fabs(gmin + 1.2188) < 1e-3,
          "min a = %.7f at g = %.4f (want -0.2697690 at "
          "-1.2188)",
          mn, gmin);

    /* sweep a grid out to |g|, |u| = 1000: never above 100; close to 100 at the corners */
    double mx = 0;
    for (int i = 0; i < GRID; i++) {
        g[i] = -1000 + 2000.0 * (i % 317) / 316;
        u[i] = -1000 + 2000.0 * (i / 317) / 315;
    }
    s.inter = GRID;
    k3c_glu_fwd_f64(&s, g, u, h, NULL);
    for (int i = 0; i < GRID; i++) mx = fmax(mx, fabs(h[i]));
    CHECK(mx <= 100 && mx > 99.9999, "max |a·c| = %.7f (bound 100)", mx);
    double g60 = 60, u600 = 600, h1;
    k3c_glu_sizes s1 = {1, 1, situ};
    k3c_glu_fwd_f64(&s1, &g60, &u600, &h1, NULL);
    CHECK(h1 > 99.99999 && h1 <= 100, "a(60)·c(600) = %.10f", h1);
    double gneg = -40, hneg, uone = u1;
    k3c_glu_fwd_f64(&s1, &gneg, &uone, &hneg, NULL);
    CHECK(hneg < 0 && hneg > -1e-15, "a(-40) -> 0 from below: %g", hneg);

    /* β → ∞: SiTU-GLU → SwiGLU */
    k3c_glu_sizes wide = {1, 7, {K3C_ACT_SITU, 1e7, 1e7}}, swi = {1, 7, {K3C_ACT_SILU, 0, 0}};
    double gg[7] = {-3, -1, -0.2, 0, 0.4, 2, 5}, uu[7] = {1, -2, 3, 0.5, -0.7, 2, -1}, h7[7], hs[7];
    k3c_glu_fwd_f64(&wide, gg, uu, h7, NULL);
    k3c_glu_fwd_f64(&swi, gg, uu, hs, NULL);
    CHECK_LE(test_rel_err_d(h7, hs, 7), 1e-12, "SiTU(beta=1e7) vs SiLU-GLU");
    free(g), free(u), free(h);
}

/* ================================================================ router */
static double sig(double x) { return 1 / (1 + exp(-x)); }

/* Brute force: ranks experts by biased score (ties → lower index) with a selection sort. */
static void router_ref(const double *lg, const double *b, int64_t n, int64_t k, int renorm, double rsf, int32_t *ids,
                       double *w, double *cut) {
    char used[64] = {0};
    for (int64_t j = 0; j <= k && j < n; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            if (used[e]) continue;
            double v = sig(lg[e]) + (b ? b[e] : 0);
            if (best < 0 || v > sig(lg[best]) + (b ? b[best] : 0)) best = e;
        }
        used[best] = 1;
        if (j < k)
            ids[j] = best;
        else
            *cut = sig(lg[best]) + (b ? b[best] : 0);
    }
    if (k == n) *cut = -INFINITY;
    double sum = 0;
    for (int64_t j = 0; j < k; j++) sum += sig(lg[ids[j]]);
    for (int64_t j = 0; j < k; j++) w[j] = sig(lg[ids[j]]) * rsf / (renorm && k > 1 ? sum + 1e-20 : 1);
}

static void test_router_select(void) {
    k3c_rng rng = {202, 0};
    enum { T = 9, NE = 12, K = 4 };
    double lg[T * NE], b[NE], w[T * K], cut[T], rw[K], rc = 0;
    int32_t ids[T * K], rid[K];
    randn(&rng, lg, T * NE, 1.5);
    randn(&rng, b, NE, 0.3);
    /* ties: token 0 has four equal logits, token 1 equal biased scores through the bias */
    for (int e = 2; e < 6; e++) lg[e] = 2.0;
    lg[NE + 3] = lg[NE + 7] = 3.0;
    k3c_err err = {0};
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        double *bb = with_bias ? b : NULL;
        if (with_bias) b[3] = b[7] = 1.0; /* well above every other biased score of token 1 */
        k3c_router_sizes s = {T, NE, K, 1, 2.446};
        CHECK_OK(k3c_router_fwd_f64(&s, lg, bb, ids, w, cut, &err), &err);
        int same = 1;
        double werr = 0;
        for (int t = 0; t < T; t++) {
            router_ref(lg + t * NE, bb, NE, K, 1, 2.446, rid, rw, &rc);
            for (int j = 0; j < K; j++) {
                same &= ids[t * K + j] == rid[j];
                werr = fmax(werr, fabs(w[t * K + j] - rw[j]));
            }
            same &= cut[t] == rc;
        }
        CHECK(same, "router ids / order / cutoff vs brute force (bias %d)", with_bias);
        CHECK_LE(werr, 1e-15, "router weights vs brute force");
        if (!with_bias) CHECK(ids[0] == 2 && ids[1] == 3 && ids[2] == 4 && ids[3] == 5, "ties -> lower index first");
        if (with_bias)
            CHECK(ids[K] == 3 && ids[K + 1] == 7, "biased ties -> lower index first (%d %d)", ids[K], ids[K + 1]);
    }
}

/* The bias moves the selection; the weights still use the unbiased s. */
static void test_router_bias(void) {
    double lg[6] = {3.0, 2.0, 1.0, 0.0, -1.0, -2.0}, b[6] = {-1.0, 0, 0, 0, 0, 0.9}, w[2], cut;
    int32_t ids[2];
    k3c_err err = {0};
    k3c_router_sizes s = {1, 6, 2, 1, 1.0};
    CHECK_OK(k3c_router_fwd_f64(&s, lg, NULL, ids, w, &cut, &err), &err);
    CHECK(ids[0] == 0 && ids[1] == 1, "unbiased pick (0, 1): got (%d, %d)", ids[0], ids[1]);
    CHECK_OK(k3c_router_fwd_f64(&s, lg, b, ids, w, &cut, &err), &err);
    /* biased: s+b = {-0.047, 0.881, 0.731, 0.5, 0.269, 1.019} → (5, 1), cutoff = s2 + 0 */
    CHECK(ids[0] == 5 && ids[1] == 1, "biased pick (5, 1): got (%d, %d)", ids[0], ids[1]);
    double s5 = sig(-2.0), s1 = sig(2.0);
    CHECK(fabs(w[0] - s5 / (s5 + s1)) < 1e-15 && fabs(w[1] - s1 / (s5 + s1)) < 1e-15,
          "weights from unbiased s: %.15f %.15f", w[0], w[1]);
    CHECK(fabs(cut - sig(1.0)) < 1e-15, "cutoff = 3rd biased score %.15f", cut);
    /* no renormalisation: p = s·rsf; k = 1 with the flag: not renormalised (HF) */
    k3c_router_sizes s2 = {1, 6, 2, 0, 2.5};
    k3c_router_fwd_f64(&s2, lg, b, ids, w, &cut, &err);
    CHECK(fabs(w[0] - 2.5 * s5) < 1e-15 && fabs(w[1] - 2.5 * s1) < 1e-15, "unnormalised weights");
    k3c_router_sizes s3 = {1, 6, 1, 1, 2.5};
    k3c_router_fwd_f64(&s3, lg, b, ids, w, &cut, &err);
    CHECK(ids[0] == 5 && fabs(w[0] - 2.5 * s5) < 1e-15, "k = 1 keeps s·rsf: %g", w[0]);
    k3c_router_sizes s4 = {1, 6, 6, 1, 1.0};
    double w6[6];
    int32_t id6[6];
    k3c_router_fwd_f64(&s4, lg, b, id6, w6, &cut, &err);
    CHECK(isinf(cut) && cut < 0, "k = n: cutoff -inf");
    /* float build agrees */
    float lf[6], bf[6], wf[2], cf;
    for (int i = 0; i < 6; i++) lf[i] = (float)lg[i], bf[i] = (float)b[i];
    CHECK_OK(k3c_router_fwd_f32(&s, lf, bf, ids, wf, &cf, &err), &err);
    CHECK(ids[0] == 5 && ids[1] == 1 && fabsf(wf[0] - (float)(s5 / (s5 + s1))) < 1e-6f, "f32 router");
    lg[2] = NAN;
    CHECK(k3c_router_fwd_f64(&s, lg, b, ids, w, &cut, &err) == K3C_ENUMERIC, "NaN logit -> ENUMERIC");
    k3c_router_sizes sk = {1, 6, 7, 1, 1.0};
    CHECK(k3c_router_fwd_f64(&sk, lg, b, ids, w, &cut, &err) == K3C_EINVAL, "k > n rejected");
}

typedef struct {
    k3c_router_sizes s;
    double *lg, *b, *R, *w, *cut;
    int32_t *ids, *ids0;
    int changed;
} router_ctx;

static double router_loss(void *p) {
    router_ctx *c = p;
    k3c_router_fwd_f64(&c->s, c->lg, c->b, c->ids, c->w, c->cut, NULL);
    size_t n = (size_t)(c->s.tokens * c->s.top_k);
    if (memcmp(c->ids, c->ids0, n * sizeof(int32_t))) c->changed = 1;
    return dot(c->w, c->R, n);
}

static void test_router_grad(void) {
    k3c_rng rng = {303, 0};
    enum { T = 6, NE = 10 };
    const struct {
        int k, renorm;
        double rsf;
    } cases[] = {{3, 1, 2.446}, {3, 0, 1.5}, {1, 1, 1.0}, {10, 1, 1.0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int K = cases[ci].k;
        router_ctx c = {.s = {T, NE, K, cases[ci].renorm, cases[ci].rsf}};
        c.lg = malloc(T * NE * 8), c.b = malloc(NE * 8), c.R = malloc(T * K * 8), c.w = malloc(T * K * 8);
        c.cut = malloc(T * 8), c.ids = malloc(T * K * 4), c.ids0 = malloc(T * K * 4);
        randn(&rng, c.lg, T * NE, 1.5);
        randn(&rng, c.b, NE, 0.3);
        randn(&rng, c.R, T * K, 1.0);
        k3c_router_fwd_f64(&c.s, c.lg, c.b, c.ids0, c.w, c.cut, NULL);
        double *dl = calloc(T * NE, 8);
        k3c_err err = {0};
        CHECK_OK(k3c_router_bwd_f64(&c.s, c.lg, c.ids0, c.R, dl, &err), &err);
        char what[96];
        snprintf(what, sizeof what, "router dlogits FD (k %d, renorm %d, rsf %g)", K, cases[ci].renorm, cases[ci].rsf);
        CHECK_LE(test_fd_rel_err(router_loss, &c, c.lg, T * NE, dl), FD_TOL, what);
        CHECK(!c.changed, "selection stayed fixed under the FD steps");
        free(c.lg), free(c.b), free(c.R), free(c.w), free(c.cut), free(c.ids), free(c.ids0), free(dl);
    }
}

/* ================================================================ plan */
static void test_plan(void) {
    /* T = 4, k = 2, E = 3; token 2's second slot dropped */
    int32_t ids[8] = {2, 0, 1, 2, 0, -1, 2, 1}, perm[8], pos[8];
    int64_t off[4];
    k3c_err err = {0};
    CHECK_OK(k3c_moe_plan(4, 2, 3, ids, off, perm, pos, &err), &err);
    CHECK(off[0] == 0 && off[1] == 2 && off[2] == 4 && off[3] == 7, "offsets %lld %lld %lld %lld", (long long)off[0],
          (long long)off[1], (long long)off[2], (long long)off[3]);
    const int32_t want_perm[7] = {1, 4, 2, 7, 0, 3, 6}; /* expert 0: slots 1, 4; 1: 2, 7; 2: 0, 3, 6 */
    int ok = 1;
    for (int r = 0; r < 7; r++) ok &= perm[r] == want_perm[r] && pos[perm[r]] == r;
    CHECK(ok && pos[5] == -1, "perm / pos (sorted by expert, ascending slot id inside)");
    ids[3] = 3;
    CHECK(k3c_moe_plan(4, 2, 3, ids, off, perm, pos, &err) == K3C_EINVAL, "id >= E rejected");
    ids[3] = -2;
    CHECK(k3c_moe_plan(4, 2, 3, ids, off, perm, pos, &err) == K3C_EINVAL, "id -2 rejected");
}

/* ================================================================ routed experts */
typedef struct {
    k3c_moe_sizes s;
    double *x, *w, *w1, *w3, *w2, *R, *y;
    int32_t *ids;
    void *ws;
} moe_ctx;

static double moe_loss(void *p) {
    moe_ctx *c = p;
    k3c_moe_fwd_f64(&c->s, c->x, c->ids, c->w, c->w1, c->w3, c->w2, c->y, NULL, c->ws, NULL);
    return dot(c->y, c->R, (size_t)(c->s.tokens * c->s.dim));
}

/* y_t = Σ_j p_tj · w2_e(act(w1_e x) ⊙ c(w3_e x)) by plain loops */
static void moe_ref(const moe_ctx *c, double *y) {
    const int64_t T = c->s.tokens, D = c->s.dim, I = c->s.inter, K = c->s.top_k;
    const double b1 = c->s.act.beta1, b2 = c->s.act.beta2;
    double hid[64];
    for (int64_t t = 0; t < T; t++) {
        for (int64_t d = 0; d < D; d++) y[t * D + d] = 0;
        for (int64_t j = 0; j < K; j++) {
            int e = c->ids[t * K + j];
            if (e < 0) continue;
            for (int64_t i = 0; i < I; i++) {
                double g = 0, u = 0;
                for (int64_t d = 0; d < D; d++) {
                    g += c->w1[(e * I + i) * D + d] * c->x[t * D + d];
                    u += c->w3[(e * I + i) * D + d] * c->x[t * D + d];
                }
                hid[i] = c->s.act.act == K3C_ACT_SITU ? b1 * tanh(g / b1) * sig(g) * b2 * tanh(u / b2) : g * sig(g) * u;
            }
            for (int64_t d = 0; d < D; d++) {
                double o = 0;
                for (int64_t i = 0; i < I; i++) o += c->w2[(e * D + d) * I + i] * hid[i];
                y[t * D + d] += c->w[t * K + j] * o;
            }
        }
    }
}

static void *ws_alloc(size_t bytes) {
    void *p = k3c_aligned_alloc(bytes ? bytes : 64);
    memset(p, 0xff, bytes); /* NaN bytes: an op reading scratch it did not write shows up */
    return p;
}

static void test_moe_case(const char *name, k3c_glu_act act, int dropped) {
    enum { T = 7, D = 6, I = 5, E = 4, K = 2 };
    k3c_rng rng = {404 + (uint64_t)dropped, 0};
    moe_ctx c = {.s = {T, D, I, E, K, act}};
    c.x = malloc(T * D * 8), c.w = malloc(T * K * 8), c.w1 = malloc(E * I * D * 8), c.w3 = malloc(E * I * D * 8);
    c.w2 = malloc(E * D * I * 8), c.R = malloc(T * D * 8), c.y = malloc(T * D * 8), c.ids = malloc(T * K * 4);
    randn(&rng, c.x, T * D, 1.0);
    randn(&rng, c.w, T * K, 0.5);
    randn(&rng, c.w1, E * I * D, 0.8);
    randn(&rng, c.w3, E * I * D, 0.8);
    randn(&rng, c.w2, E * D * I, 0.5);
    randn(&rng, c.R, T * D, 1.0);
    /* experts 0..2 used (expert 3 idle: its gradients must stay 0), distinct ids per token */
    for (int t = 0; t < T; t++) {
        c.ids[t * K] = t % 3;
        c.ids[t * K + 1] = (t % 3 + 1 + (t / 3) % 2) % 3;
    }
    if (dropped) c.ids[3 * K + 1] = -1;
    c.ws = ws_alloc(k3c_moe_workspace_f64(&c.s));
    k3c_err err = {0};
    double yref[T * D];
    CHECK_OK(k3c_moe_fwd_f64(&c.s, c.x, c.ids, c.w, c.w1, c.w3, c.w2, c.y, NULL, c.ws, &err), &err);
    moe_ref(&c, yref);
    char what[128];
    snprintf(what, sizeof what, "moe %s forward vs loops", name);
    CHECK_LE(test_rel_err_d(c.y, yref, T * D), 1e-14, what);

    /* backward, once recomputing and once from the saved buffer: identical */
    double *dx = calloc(T * D, 8), *dw = calloc(T * K, 8), *d1 = calloc(E * I * D, 8), *d3 = calloc(E * I * D, 8);
    double *d2 = calloc(E * D * I, 8);
    CHECK_OK(k3c_moe_bwd_f64(&c.s, c.x, c.ids, c.w, c.w1, c.w3, c.w2, NULL, c.R, dx, d1, d3, d2, dw, c.ws, &err), &err);
    void *saved = ws_alloc(k3c_moe_saved_bytes_f64(&c.s));
    double *y2 = malloc(T * D * 8), *dx2 = calloc(T * D, 8), *dw2 = calloc(T * K, 8), *dd1 = calloc(E * I * D, 8);
    double *dd3 = calloc(E * I * D, 8), *dd2 = calloc(E * D * I, 8);
    k3c_moe_fwd_f64(&c.s, c.x, c.ids, c.w, c.w1, c.w3, c.w2, y2, saved, c.ws, &err);
    memset(c.ws, 0xff, k3c_moe_workspace_f64(&c.s));
    CHECK_OK(k3c_moe_bwd_f64(&c.s, c.x, c.ids, c.w, c.w1, c.w3, c.w2, saved, c.R, dx2, dd1, dd3, dd2, dw2, c.ws, &err),
             &err);
    CHECK(!memcmp(y2, c.y, T * D * 8) && !memcmp(dx, dx2, T * D * 8) && !memcmp(dw, dw2, T * K * 8) &&
              !memcmp(d1, dd1, E * I * D * 8) && !memcmp(d2, dd2, E * D * I * 8) && !memcmp(d3, dd3, E * I * D * 8),
          "moe %s: saved and recomputed backward agree bitwise", name);

    snprintf(what, sizeof what, "moe %s dx FD", name);
    CHECK_LE(test_fd_rel_err(moe_loss, &c, c.x, T * D, dx), FD_TOL, what);
    snprintf(what, sizeof what, "moe %s dw1 FD", name);
    CHECK_LE(test_fd_rel_err(moe_loss, &c, c.w1, E * I * D, d1), FD_TOL, what);
    snprintf(what, sizeof what, "moe %s dw3 FD", name);
    CHECK_LE(test_fd_rel_err(moe_loss, &c, c.w3, E * I * D, d3), FD_TOL, what);
    snprintf(what, sizeof what, "moe %s dw2 FD", name);
    CHECK_LE(test_fd_rel_err(moe_loss, &c, c.w2, E * D * I, d2), FD_TOL, what);
    snprintf(what, sizeof what, "moe %s dweights FD", name);
    CHECK_LE(test_fd_rel_err(moe_loss, &c, c.w, T * K, dw), FD_TOL, what);
    double idle = 0;
    for (int i = 3 * I * D; i < 4 * I * D; i++) idle += fabs(d1[i]) + fabs(d3[i]) + fabs(d2[i]);
    CHECK(idle == 0, "idle expert gets zero gradient");
    if (dropped) CHECK(dw[3 * K + 1] == 0, "dropped slot gets no weight gradient");

    /* accumulation: a second backward into the same buffers doubles them */
    CHECK_OK(k3c_moe_bwd_f64(&c.s, c.x, c.ids, c.w, c.w1, c.w3, c.w2, saved, c.R, dx2, dd1, dd3, dd2, dw2, c.ws, &err),
             &err);
    /* (not bitwise: the second call adds its terms one by one onto the first result) */
    double twice[E * I * D];
    for (int i = 0; i < T * D; i++) twice[i] = 2 * dx[i];
    CHECK_LE(test_rel_err_d(dx2, twice, T * D), 1e-15, "moe backward accumulates dx");
    for (int i = 0; i < E * I * D; i++) twice[i] = 2 * d1[i];
    CHECK_LE(test_rel_err_d(dd1, twice, E * I * D), 1e-15, "moe backward accumulates dw1");

    /* float build: same forward to float precision */
    float xf[T * D], wf[T * K], yf[T * D], *w1f = malloc(E * I * D * 4), *w3f = malloc(E * I * D * 4);
    float *w2f = malloc(E * D * I * 4);
    for (int i = 0; i < T * D; i++) xf[i] = (float)c.x[i];
    for (int i = 0; i < T * K; i++) wf[i] = (float)c.w[i];
    for (int i = 0; i < E * I * D; i++) w1f[i] = (float)c.w1[i], w3f[i] = (float)c.w3[i], w2f[i] = (float)c.w2[i];
    void *wsf = ws_alloc(k3c_moe_workspace_f32(&c.s));
    CHECK_OK(k3c_moe_fwd_f32(&c.s, xf, c.ids, wf, w1f, w3f, w2f, yf, NULL, wsf, &err), &err);
    double yfd[T * D];
    for (int i = 0; i < T * D; i++) yfd[i] = yf[i];
    CHECK_LE(test_rel_err_d(yfd, yref, T * D), 1e-5, "moe f32 forward vs f64 loops");
    k3c_aligned_free(wsf);
    free(w1f), free(w3f), free(w2f);
    free(c.x), free(c.w), free(c.w1), free(c.w3), free(c.w2), free(c.R), free(c.y), free(c.ids);
    free(dx), free(dw), free(d1), free(d3), free(d2), free(y2), free(dx2), free(dw2), free(dd1), free(dd3), free(dd2);
    k3c_aligned_free(c.ws);
    k3c_aligned_free(saved);
}

static void test_moe_errors(void) {
    k3c_moe_sizes s = {2, 4, 3, 2, 1, {K3C_ACT_SILU, 0, 0}};
    double x[8] = {0}, w[2] = {1, 1}, w1[24] = {0}, w3[24] = {0}, w2[24] = {0}, y[8];
    int32_t ids[2] = {0, 2};
    void *ws = ws_alloc(k3c_moe_workspace_f64(&s));
    k3c_err err = {0};
    CHECK(k3c_moe_fwd_f64(&s, x, ids, w, w1, w3, w2, y, NULL, ws, &err) == K3C_EINVAL, "expert id 2 of 2 rejected");
    CHECK(strstr(err.msg, "token 1") != NULL, "message names the token: %s", err.msg);
    CHECK(k3c_moe_fwd_f64(&s, x, ids, w, w1, w3, w2, y, NULL, NULL, &err) == K3C_EINVAL, "NULL workspace rejected");
    k3c_moe_sizes s0 = s;
    s0.tokens = 0;
    ids[1] = 1;
    CHECK_OK(k3c_moe_fwd_f64(&s0, x, ids, w, w1, w3, w2, y, NULL, ws, &err), &err);
    k3c_aligned_free(ws);
}

/* ================================================================ dense MLP */
typedef struct {
    k3c_mlp_sizes s;
    double *x, *wg, *wu, *wd, *R, *y;
    void *ws;
} mlp_ctx;

static double mlp_loss(void *p) {
    mlp_ctx *c = p;
    k3c_mlp_fwd_f64(&c->s, c->x, c->wg, c->wu, c->wd, c->y, NULL, c->ws, NULL);
    return dot(c->y, c->R, (size_t)(c->s.tokens * c->s.dim));
}

static void test_mlp(void) {
    enum { T = 5, D = 6, I = 7 };
    k3c_rng rng = {505, 0};
    mlp_ctx c = {.s = {T, D, I, {K3C_ACT_SITU, 4, 25}}};
    double x[T * D], wg[I * D], wu[I * D], wd[D * I], R[T * D], y[T * D], ym[T * D];
    c.x = x, c.wg = wg, c.wu = wu, c.wd = wd, c.R = R, c.y = y;
    randn(&rng, x, T * D, 1.5);
    randn(&rng, wg, I * D, 1.0);
    randn(&rng, wu, I * D, 3.0);
    randn(&rng, wd, D * I, 0.5);
    randn(&rng, R, T * D, 1.0);
    c.ws = ws_alloc(k3c_mlp_workspace_f64(&c.s));
    k3c_err err = {0};
    CHECK_OK(k3c_mlp_fwd_f64(&c.s, x, wg, wu, wd, y, NULL, c.ws, &err), &err);
    /* the same as one routed expert with every token at weight 1 */
    k3c_moe_sizes ms = {T, D, I, 1, 1, c.s.act};
    int32_t ids[T] = {0};
    double ones[T] = {1, 1, 1, 1, 1};
    void *mws = ws_alloc(k3c_moe_workspace_f64(&ms));
    k3c_moe_fwd_f64(&ms, x, ids, ones, wg, wu, wd, ym, NULL, mws, &err);
    CHECK_LE(test_rel_err_d(y, ym, T * D), 1e-15, "mlp == moe with E = 1, weight 1");
    double dx[T * D] = {0}, dg[I * D] = {0}, du[I * D] = {0}, dd[D * I] = {0};
    CHECK_OK(k3c_mlp_bwd_f64(&c.s, x, wg, wu, wd, NULL, R, dx, dg, du, dd, c.ws, &err), &err);
    CHECK_LE(test_fd_rel_err(mlp_loss, &c, x, T * D, dx), FD_TOL, "mlp dx FD");
    CHECK_LE(test_fd_rel_err(mlp_loss, &c, wg, I * D, dg), FD_TOL, "mlp dw_gate FD");
    CHECK_LE(test_fd_rel_err(mlp_loss, &c, wu, I * D, du), FD_TOL, "mlp dw_up FD");
    CHECK_LE(test_fd_rel_err(mlp_loss, &c, wd, D * I, dd), FD_TOL, "mlp dw_down FD");
    /* saved path, accumulating on top of the first result */
    void *saved = ws_alloc(k3c_mlp_saved_bytes_f64(&c.s));
    k3c_mlp_fwd_f64(&c.s, x, wg, wu, wd, y, saved, c.ws, &err);
    double dx2[T * D], dd2[D * I];
    memcpy(dx2, dx, sizeof dx);
    memcpy(dd2, dd, sizeof dd);
    CHECK_OK(k3c_mlp_bwd_f64(&c.s, x, wg, wu, wd, saved, R, dx2, NULL, NULL, dd2, c.ws, &err), &err);
    double twice[D * I];
    for (int i = 0; i < T * D; i++) twice[i] = 2 * dx[i];
    CHECK_LE(test_rel_err_d(dx2, twice, T * D), 1e-15, "mlp backward from saved accumulates dx");
    for (int i = 0; i < D * I; i++) twice[i] = 2 * dd[i];
    CHECK_LE(test_rel_err_d(dd2, twice, D * I), 1e-15, "mlp backward from saved accumulates dw_down");
    k3c_aligned_free(c.ws);
    k3c_aligned_free(mws);
    k3c_aligned_free(saved);
}

/* ---------------------------------------------------------------- the Switch / GShard auxiliary loss */

typedef struct {
    k3c_router_sizes s;
    double *lg;
    const int32_t *ids;
    double alpha, ws[16];
} aux_ctx;

static double aux_loss(void *p) {
    aux_ctx *c = p;
    double l = NAN;
    k3c_aux_loss_fwd_f64(&c->s, c->lg, c->ids, c->alpha, &l, c->ws, NULL);
    return l;
}

static void test_aux_loss(void) {
    k3c_err err = {0};
    double ws[16], loss = 0;
    /* Hand-computed: token 0 logits (ln 3, 0, −ln 3) give s = (3/4, 1/2, 1/4), p = (1/2, 1/3, 1/6); token 1 all 0 gives
     * p = 1/3 each. Routes {0, 1}, {2, 0}: f = (1/2, 1/4, 1/4), P = (5/12, 1/3, 1/4), Σ f P = 17/48, L = α·3·17/48. */
    double lg[6] = {log(3.0), 0, -log(3.0), 0, 0, 0};
    int32_t ids[4] = {0, 1, 2, 0};
    k3c_router_sizes s = {2, 3, 2, 1, 1.0};
    CHECK_OK(k3c_aux_loss_fwd_f64(&s, lg, ids, 0.01, &loss, ws, &err), &err);
    CHECK(fabs(loss - 0.01 * 17.0 / 16.0) < 1e-15, "aux loss %.17g, want 0.01·17/16", loss);
    /* perfect balance (uniform p, each expert equally routed): L = α */
    double lg0[6] = {0, 0, 0, 0, 0, 0};
    int32_t ids0[3] = {0, 1, 2};
    k3c_router_sizes s1 = {3, 3, 1, 0, 1.0};
    double lg3[9] = {0};
    CHECK_OK(k3c_aux_loss_fwd_f64(&s1, lg3, ids0, 0.5, &loss, ws, &err), &err);
    CHECK(fabs(loss - 0.5) < 1e-15, "balanced aux loss %.17g, want α = 0.5", loss);
    /* Gradient of token 1 (s = 1/2, S = 3/2, p = 1/3): w = n f / T = (3/4, 3/8, 3/8), Σ w p = 1/2,
     * ∂/∂s = (w − 1/2)/S = (1/6, −1/12, −1/12), times s(1 − s) = 1/4 and coef. Rows [1, 2) only. */
    double d[3] = {1, 2, 3};
    CHECK_OK(k3c_aux_loss_bwd_f64(&s, lg0, ids, 0.02, 1, 1, d, ws, &err), &err);
    const double want[3] = {1 + 0.02 / 24, 2 - 0.02 / 48, 3 - 0.02 / 48};
    CHECK(fabs(d[0] - want[0]) < 1e-15 && fabs(d[1] - want[1]) < 1e-15 && fabs(d[2] - want[2]) < 1e-15,
          "aux gradient (%.17g, %.17g, %.17g) (adds to the buffer)", d[0], d[1], d[2]);

    /* float64 finite differences on random logits, routes from the router (constants of the loss) */
    enum { T = 9, NE = 6, K = 2 };
    k3c_rng rng = {2718, 0};
    double L[T * NE], full[T * NE], part[T * NE];
    randn(&rng, L, T * NE, 1.5);
    int32_t rid[T * K];
    double tw[T * K];
    k3c_router_sizes rs = {T, NE, K, 1, 1.0};
    CHECK_OK(k3c_router_fwd_f64(&rs, L, NULL, rid, tw, NULL, &err), &err);
    rid[3] = -1; /* a dropped slot counts nothing */
    aux_ctx c = {rs, L, rid, 0.3, {0}};
    memset(full, 0, sizeof full);
    CHECK_OK(k3c_aux_loss_bwd_f64(&rs, L, rid, 0.3, 0, T, full, ws, &err), &err);
    CHECK_LE(test_fd_rel_err(aux_loss, &c, L, T * NE, full), FD_TOL, "aux loss dlogits FD rel err");
    /* rows [2, 7) alone give those rows of the whole gradient (tensor parallelism's split) */
    memset(part, 0, sizeof part);
    CHECK_OK(k3c_aux_loss_bwd_f64(&rs, L, rid, 0.3, 2, 5, part, ws, &err), &err);
    double md = 0;
    for (int i = 0; i < 5 * NE; i++) md = fmax(md, fabs(part[i] - full[2 * NE + i]));
    CHECK(md == 0, "aux gradient of rows [2, 7) differs from the whole batch's by %g", md);
    /* errors: an id outside [-1, n), rows outside the batch, a non-finite logit (nothing written) */
    rid[0] = NE;
    CHECK(k3c_aux_loss_bwd_f64(&rs, L, rid, 0.3, 0, T, part, ws, &err) == K3C_EINVAL && strstr(err.msg, "expert id"),
          "bad id: %s", err.msg);
    rid[0] = 0;
    CHECK(k3c_aux_loss_bwd_f64(&rs, L, rid, 0.3, 5, 5, part, ws, &err) == K3C_EINVAL, "rows outside the batch");
    memcpy(part, full, sizeof part);
    L[4] = INFINITY;
    CHECK(k3c_aux_loss_bwd_f64(&rs, L, rid, 0.3, 0, T, part, ws, &err) == K3C_ENUMERIC &&
              memcmp(part, full, sizeof part) == 0,
          "non-finite logit: rc and untouched gradient");
}

int main(void) {
    test_glu();
    test_situ_facts();
    test_router_select();
    test_router_bias();
    test_router_grad();
    test_aux_loss();
    test_plan();
    test_moe_case("silu", (k3c_glu_act){K3C_ACT_SILU, 0, 0}, 0);
    test_moe_case("situ", (k3c_glu_act){K3C_ACT_SITU, 4, 25}, 0);
    test_moe_case("situ+drop", (k3c_glu_act){K3C_ACT_SITU, 4, 25}, 1);
    test_moe_errors();
    test_mlp();
    return test_summary();
}
