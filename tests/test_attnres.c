/* test_attnres.c — the AttnRes depth mix: forward against plain loops and float64 finite differences for every source,
 * the pseudo-query w and the key-norm weight γ, N = 1..9 (docs/MODEL.md §5.1, §5.4, §12). */
#include "ops/attnres.h"
#include "test.h"

#define FD_TOL 1e-6 /* relative error of float64 central differences (preamble) */
#define MAXN 9

static void randn(k3c_rng *r, double *x, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * k3c_rng_normal(r);
}

typedef struct {
    k3c_attnres_sizes s;
    const double *v[MAXN + 1];
    double *w, *g, *R, *h;
} ar_ctx;

static double ar_loss(void *p) {
    ar_ctx *c = p;
    k3c_attnres_fwd_f64(&c->s, c->v, c->w, c->g, c->h, NULL, NULL);
    double l = 0;
    for (int64_t i = 0; i < c->s.tokens * c->s.dim; i++) l += c->h[i] * c->R[i];
    return l;
}

/* h_t = Σ_i softmax_i(Σ_d γ_d w_d v_id / rms(v_i)) v_i, directly */
static void ar_ref(const ar_ctx *c, double *h) {
    const int64_t T = c->s.tokens, D = c->s.dim, N = c->s.sources;
    for (int64_t t = 0; t < T; t++) {
        double z[MAXN + 1], zmax = -INFINITY, sum = 0;
        for (int64_t i = 0; i < N; i++) {
            double ss = 0, dt = 0;
            for (int64_t d = 0; d < D; d++) {
                double x = c->v[i][t * D + d];
                ss += x * x;
                dt += c->g[d] * c->w[d] * x;
            }
            z[i] = dt / sqrt(ss / D + c->s.eps);
            zmax = fmax(zmax, z[i]);
        }
        for (int64_t i = 0; i < N; i++) sum += z[i] = exp(z[i] - zmax);
        for (int64_t d = 0; d < D; d++) {
            double acc = 0;
            for (int64_t i = 0; i < N; i++) acc += z[i] / sum * c->v[i][t * D + d];
            h[t * D + d] = acc;
        }
    }
}

static void test_case(int N, k3c_rng *rng) {
    enum { T = 5, D = 8 };
    ar_ctx c = {.s = {T, D, N, 1e-5}};
    double *src[MAXN], w[D], g[D], R[T * D], h[T * D], href[T * D];
    for (int i = 0; i < N; i++) {
        src[i] = malloc(T * D * 8);
        randn(rng, src[i], T * D, 0.3 * (i + 1)); /* sources of different scales, as block sums are */
        c.v[i] = src[i];
    }
    if (N > 1)
        for (int d = 0; d < D; d++) src[1][2 * D + d] = 0; /* a zero row: rms = sqrt(eps) */
    randn(rng, w, D, 0.7);
    for (int d = 0; d < D; d++) g[d] = 1 + 0.2 * k3c_rng_normal(rng);
    randn(rng, R, T * D, 1.0);
    c.w = w, c.g = g, c.R = R, c.h = h;
    k3c_err err = {0};
    double *saved = malloc(k3c_attnres_saved_elems_f64(&c.s) * 8);
    CHECK_OK(k3c_attnres_fwd_f64(&c.s, c.v, w, g, h, saved, &err), &err);
    ar_ref(&c, href);
    char what[96];
    snprintf(what, sizeof what, "attnres N=%d forward vs loops", N);
    CHECK_LE(test_rel_err_d(h, href, T * D), 1e-14, what);

    size_t wsb = k3c_attnres_workspace_f64(&c.s);
    void *ws = k3c_aligned_alloc(wsb);
    memset(ws, 0xff, wsb);
    double *dv[MAXN], dw[D] = {0}, dg[D] = {0};
    for (int i = 0; i < N; i++) dv[i] = calloc(T * D, 8);
    CHECK_OK(k3c_attnres_bwd_f64(&c.s, c.v, w, g, NULL, R, dv, dw, dg, ws, &err), &err);
    /* from the saved statistics: the same numbers */
    double *dv2[MAXN], dw2[D] = {0}, dg2[D] = {0};
    for (int i = 0; i < N; i++) dv2[i] = calloc(T * D, 8);
    CHECK_OK(k3c_attnres_bwd_f64(&c.s, c.v, w, g, saved, R, dv2, dw2, dg2, ws, &err), &err);
    double dmax = 0;
    for (int i = 0; i < N; i++) dmax = fmax(dmax, test_rel_err_d(dv2[i], dv[i], T * D));
    dmax = fmax(dmax, fmax(test_rel_err_d(dw2, dw, D), test_rel_err_d(dg2, dg, D)));
    snprintf(what, sizeof what, "attnres N=%d saved vs recomputed backward", N);
    CHECK_LE(dmax, 1e-15, what);

    double emax = 0;
    for (int i = 0; i < N; i++) emax = fmax(emax, test_fd_rel_err(ar_loss, &c, src[i], T * D, dv[i]));
    snprintf(what, sizeof what, "attnres N=%d dv (all sources) FD", N);
    CHECK_LE(emax, FD_TOL, what);
    snprintf(what, sizeof what, "attnres N=%d dw FD", N);
    CHECK_LE(test_fd_rel_err(ar_loss, &c, w, D, dw), FD_TOL, what);
    snprintf(what, sizeof what, "attnres N=%d dgamma FD", N);
    CHECK_LE(test_fd_rel_err(ar_loss, &c, g, D, dg), FD_TOL, what);

    /* float build of the forward */
    float vf[MAXN][T * D], wf[D], gf[D], hf[T * D];
    const float *vp[MAXN];
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < T * D; j++) vf[i][j] = (float)src[i][j];
        vp[i] = vf[i];
    }
    for (int d = 0; d < D; d++) wf[d] = (float)w[d], gf[d] = (float)g[d];
    CHECK_OK(k3c_attnres_fwd_f32(&c.s, vp, wf, gf, hf, NULL, &err), &err);
    double hfd[T * D];
    for (int j = 0; j < T * D; j++) hfd[j] = hf[j];
    CHECK_LE(test_rel_err_d(hfd, href, T * D), 1e-6, "attnres f32 forward vs f64");

    for (int i = 0; i < N; i++) free(src[i]), free(dv[i]), free(dv2[i]);
    free(saved);
    k3c_aligned_free(ws);
}

/* One buffer read as two sources (pointer repeated): its gradient is the sum of both uses. Zero w: uniform weights. */
static void test_alias_and_uniform(void) {
    enum { T = 3, D = 6, N = 3 };
    k3c_rng rng = {77, 0};
    double a[T * D], b[T * D], w[D], g[D], R[T * D], h[T * D];
    randn(&rng, a, T * D, 1.0);
    randn(&rng, b, T * D, 2.0);
    randn(&rng, w, D, 1.0);
    randn(&rng, g, D, 1.0);
    randn(&rng, R, T * D, 1.0);
    ar_ctx c = {.s = {T, D, N, 1e-5}, .v = {a, b, a}, .w = w, .g = g, .R = R, .h = h};
    double da[T * D] = {0}, db[T * D] = {0}, dw[D] = {0};
    double *dv[N] = {da, db, da};
    size_t wsb = k3c_attnres_workspace_f64(&c.s);
    void *ws = k3c_aligned_alloc(wsb);
    k3c_err err = {0};
    CHECK_OK(k3c_attnres_bwd_f64(&c.s, c.v, w, g, NULL, R, dv, dw, NULL, ws, &err), &err);
    CHECK_LE(test_fd_rel_err(ar_loss, &c, a, T * D, da), FD_TOL, "attnres source read twice: dv FD");
    CHECK_LE(test_fd_rel_err(ar_loss, &c, w, D, dw), FD_TOL, "attnres dw FD (dgamma not requested)");

    double zero[D] = {0};
    c.w = zero;
    k3c_attnres_fwd_f64(&c.s, c.v, zero, g, h, NULL, &err);
    double emax = 0;
    for (int i = 0; i < T * D; i++) emax = fmax(emax, fabs(h[i] - (2 * a[i] + b[i]) / 3));
    CHECK_LE(emax, 1e-15, "zero pseudo-query: uniform mix");

    /* huge logits: softmax saturates without overflow */
    double big[D];
    for (int d = 0; d < D; d++) big[d] = 1e4 * w[d];
    k3c_attnres_fwd_f64(&c.s, c.v, big, g, h, NULL, &err);
    int finite = 1;
    for (int i = 0; i < T * D; i++) finite &= isfinite(h[i]);
    CHECK(finite, "large logits stay finite");

    k3c_attnres_sizes bad = {T, D, 0, 1e-5};
    CHECK(k3c_attnres_fwd_f64(&bad, c.v, w, g, h, NULL, &err) == K3C_EINVAL, "N = 0 rejected");
    bad.sources = K3C_ATTNRES_MAX_SOURCES + 1;
    CHECK(k3c_attnres_fwd_f64(&bad, c.v, w, g, h, NULL, &err) == K3C_EINVAL, "N too large rejected");
    CHECK(k3c_attnres_bwd_f64(&c.s, c.v, w, g, NULL, R, dv, dw, NULL, NULL, &err) == K3C_EINVAL, "NULL ws rejected");
    k3c_aligned_free(ws);
}

int main(void) {
    k3c_rng rng = {2026, 0};
    for (int N = 1; N <= MAXN; N++) test_case(N, &rng);
    test_alias_and_uniform();
    return test_summary();
}
