/* test_basic_ops.c — embedding, RMSNorm (plain, per head, gated), linear / matmul, sigmoid gate, SiLU, softmax, masked
 * cross-entropy: float64 finite differences (rel ≤ 1e-6), backward adds, float32 agreement, edges (spec §1.2, §4.2). */
#include "test.h"

#include "ops/basic.h"

#define FD_TOL 1e-6  /* float64 central differences vs the analytic backward (norm-wise relative error) */
#define F32_TOL 1e-5 /* float32 op vs float64 op on the same inputs */
#define PREFILL 0.25 /* gradient buffers start here: the backward must add, not overwrite */

static uint64_t seed_ = 1;

static double *randn(size_t n, double sd) { return test_randn(seed_++, n, sd); }
static double *filled(size_t n, double v) { return test_filled(n, v); }
static float *to_f32(const double *x, size_t n) { return test_to_f32(x, n); }
static double *to_f64(const float *x, size_t n) {
    double *y = malloc((n ? n : 1) * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}
/* Removes the PREFILL offset so what remains is what the backward added. */
static void unfill(double *g, size_t n) {
    for (size_t i = 0; i < n; i++) g[i] -= PREFILL;
}
static double dotd(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
static double rel_f32(const float *x, const double *ref, size_t n) {
    double *y = to_f64(x, n), e = test_rel_err_d(y, ref, n);
    free(y);
    return e;
}

/* Central differences of loss() with respect to every element of x; returns the relative error against g. */
/* ---------------------------------------------------------------- embedding */
typedef struct {
    k3c_embedding_sizes s;
    const int32_t *ids;
    double *E, *y, *r;
} emb_ctx;

static double emb_loss(void *p) {
    emb_ctx *c = p;
    k3c_embedding_fwd_f64(&c->s, c->ids, c->E, c->y, NULL);
    return dotd(c->r, c->y, (size_t)(c->s.T * c->s.D));
}

static void test_embedding(void) {
    k3c_err err = {0};
    enum { T = 9, V = 5, D = 7 };
    int32_t ids[T] = {0, 4, 2, 2, 4, 1, 0, 2, 3};
    k3c_embedding_sizes s = {T, V, D};
    double *E = randn(V * D, 1), *y = filled(T * D, 0), *dy = randn(T * D, 1), *dE = filled(V * D, PREFILL);
    CHECK_OK(k3c_embedding_fwd_f64(&s, ids, E, y, &err), &err);
    int exact = 1;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < D; c++) exact &= y[t * D + c] == E[ids[t] * D + c];
    CHECK(exact, "embedding forward is a row gather");
    CHECK_OK(k3c_embedding_bwd_f64(&s, ids, dy, dE, &err), &err);
    unfill(dE, V * D);
    double maxd = 0;
    for (int v = 0; v < V; v++)
        for (int c = 0; c < D; c++) {
            double ref = 0;
            for (int t = 0; t < T; t++) ref += ids[t] == v ? dy[t * D + c] : 0;
            maxd = fmax(maxd, fabs(ref - dE[v * D + c]));
        }
    CHECK_LE(maxd, 1e-15, "embedding bwd scatter-add (repeated ids) max abs err");
    emb_ctx c = {s, ids, E, y, dy};
    CHECK_LE(test_fd_rel_err(emb_loss, &c, E, V * D, dE), FD_TOL, "embedding FD dE");
    /* one token, width 1, and a table wider than one 256-column block of the backward */
    int64_t shapes[2][3] = {{1, 3, 1}, {4, 2, 300}};
    for (int si = 0; si < 2; si++) {
        k3c_embedding_sizes s2 = {shapes[si][0], shapes[si][1], shapes[si][2]};
        int32_t ids2[4] = {2, 1, 1, 0};
        if (si == 1) ids2[0] = 1;
        size_t ne = (size_t)(s2.V * s2.D), ny = (size_t)(s2.T * s2.D);
        emb_ctx c2 = {s2, ids2, randn(ne, 1), filled(ny, 0), randn(ny, 1)};
        double *g = filled(ne, PREFILL);
        CHECK_OK(k3c_embedding_bwd_f64(&s2, ids2, c2.r, g, &err), &err);
        unfill(g, ne);
        CHECK_LE(test_fd_rel_err(emb_loss, &c2, c2.E, ne, g), FD_TOL, "embedding FD dE (other shapes)");
        free(c2.E), free(c2.y), free(c2.r), free(g);
    }

    int32_t bad[3] = {1, 5, 0};
    k3c_embedding_sizes s3 = {3, V, D};
    int rc = k3c_embedding_fwd_f64(&s3, bad, E, y, &err);
    CHECK(rc == K3C_EINVAL && strstr(err.msg, "token 1"), "id 5 >= V rejected, naming token 1 (rc %d, '%s')", rc,
          err.msg);
    bad[1] = -1;
    CHECK(k3c_embedding_bwd_f64(&s3, bad, dy, dE, &err) == K3C_EINVAL, "negative id rejected in backward");

    emb_loss(&c); /* y back at the unperturbed table */
    float *Ef = to_f32(E, V * D), *yf = malloc(T * D * sizeof *yf);
    CHECK_OK(k3c_embedding_fwd_f32(&s, ids, Ef, yf, &err), &err);
    CHECK_LE(rel_f32(yf, y, T * D), 1e-7, "embedding f32 vs f64");
    free(E), free(y), free(dy), free(dE), free(Ef), free(yf);
}

/* ---------------------------------------------------------------- RMSNorm and gated RMSNorm */
typedef struct {
    k3c_rmsnorm_sizes s;
    double *x, *gate, *w, *r, *y, *rstd;
} rms_ctx;

static double rms_loss(void *p) {
    rms_ctx *c = p;
    if (c->gate)
        k3c_gated_rmsnorm_fwd_f64(&c->s, c->x, c->gate, c->w, c->y, c->rstd, NULL);
    else
        k3c_rmsnorm_fwd_f64(&c->s, c->x, c->w, c->y, c->rstd, NULL);
    return dotd(c->r, c->y, (size_t)(c->s.rows * c->s.D));
}

static void check_rmsnorm(int64_t rows, int64_t D, double eps, int gated) {
    k3c_err err = {0};
    size_t n = (size_t)(rows * D);
    rms_ctx c = {{rows, D, eps}, randn(n, 1.5),  gated ? randn(n, 2) : NULL, randn(D, 1), randn(n, 1),
                 filled(n, 0),   filled(rows, 0)};
    for (int64_t j = 0; j < D; j++) c.w[j] += 1; /* near the ones init, but not exactly */
    double *dx = filled(n, PREFILL), *dw = filled(D, PREFILL), *dg = filled(n, PREFILL);
    rms_loss(&c);
    /* forward against the formula, spelled out */
    double fe = 0;
    for (int64_t i = 0; i < rows; i++) {
        double ss = 0;
        for (int64_t j = 0; j < D; j++) ss += c.x[i * D + j] * c.x[i * D + j];
        double r = 1 / sqrt(ss / D + eps);
        for (int64_t j = 0; j < D; j++) {
            double ref = c.w[j] * c.x[i * D + j] * r * (gated ? 1 / (1 + exp(-c.gate[i * D + j])) : 1);
            fe = fmax(fe, fabs(ref - c.y[i * D + j]));
        }
    }
    char what[128];
    snprintf(what, sizeof what, "%srmsnorm fwd %lldx%lld max abs err", gated ? "gated " : "", (long long)rows,
             (long long)D);
    CHECK_LE(fe, 1e-14, what);
    if (gated)
        CHECK_OK(k3c_gated_rmsnorm_bwd_f64(&c.s, c.x, c.gate, c.w, c.rstd, c.r, dx, dg, dw, &err), &err);
    else
        CHECK_OK(k3c_rmsnorm_bwd_f64(&c.s, c.x, c.w, c.rstd, c.r, dx, dw, &err), &err);
    unfill(dx, n), unfill(dw, D), unfill(dg, n);
    snprintf(what, sizeof what, "%srmsnorm %lldx%lld eps %g: FD dx", gated ? "gated " : "", (long long)rows,
             (long long)D, eps);
    CHECK_LE(test_fd_rel_err(rms_loss, &c, c.x, n, dx), FD_TOL, what);
    snprintf(what, sizeof what, "%srmsnorm %lldx%lld: FD dw", gated ? "gated " : "", (long long)rows, (long long)D);
    CHECK_LE(test_fd_rel_err(rms_loss, &c, c.w, D, dw), FD_TOL, what);
    if (gated) {
        snprintf(what, sizeof what, "gated rmsnorm %lldx%lld: FD dgate", (long long)rows, (long long)D);
        CHECK_LE(test_fd_rel_err(rms_loss, &c, c.gate, n, dg), FD_TOL, what);
    }
    /* float32 against float64 */
    float *xf = to_f32(c.x, n), *wf = to_f32(c.w, D), *gf = gated ? to_f32(c.gate, n) : NULL, *rf = to_f32(c.r, n);
    float *yf = calloc(n, sizeof *yf), *rsf = calloc(rows, sizeof *rsf), *dxf = calloc(n, sizeof *dxf),
          *dwf = calloc(D, sizeof *dwf), *dgf = calloc(n, sizeof *dgf);
    rms_loss(&c);
    if (gated) {
        k3c_gated_rmsnorm_fwd_f32(&c.s, xf, gf, wf, yf, rsf, &err);
        k3c_gated_rmsnorm_bwd_f32(&c.s, xf, gf, wf, rsf, rf, dxf, dgf, dwf, &err);
        CHECK_LE(rel_f32(dgf, dg, n), F32_TOL, "gated rmsnorm f32 dgate");
    } else {
        k3c_rmsnorm_fwd_f32(&c.s, xf, wf, yf, rsf, &err);
        k3c_rmsnorm_bwd_f32(&c.s, xf, wf, rsf, rf, dxf, dwf, &err);
    }
    CHECK_LE(rel_f32(yf, c.y, n), F32_TOL, "rmsnorm f32 y");
    CHECK_LE(rel_f32(dxf, dx, n), F32_TOL, "rmsnorm f32 dx");
    CHECK_LE(rel_f32(dwf, dw, D), F32_TOL, "rmsnorm f32 dw");
    free(c.x), free(c.gate), free(c.w), free(c.r), free(c.y), free(c.rstd), free(dx), free(dw), free(dg);
    free(xf), free(wf), free(gf), free(rf), free(yf), free(rsf), free(dxf), free(dwf), free(dgf);
}

static void test_rmsnorm(void) {
    /* D = 1 with a tiny eps is degenerate (dy/dx ∝ eps/|x|³ is all cancellation): the width-1 rows use a large eps */
    check_rmsnorm(1, 1, 0.5, 0);
    check_rmsnorm(3, 5, 1e-6, 0);
    check_rmsnorm(7, 33, 1e-5, 0);
    check_rmsnorm(5 * 3, 8, 1e-5, 0); /* per head: T = 5, H = 3, d = 8, one shared weight */
    check_rmsnorm(1, 1, 0.5, 1);
    check_rmsnorm(4 * 3, 7, 1e-5, 1); /* KDA output: T = 4, H = 3, dv = 7 */
    check_rmsnorm(3, 70, 1e-5, 1);    /* more than one 64-column block of dw */
    k3c_err err = {0};
    double x = 1, w = 1, y, rs;
    k3c_rmsnorm_sizes bad = {1, 0, 1e-5};
    CHECK(k3c_rmsnorm_fwd_f64(&bad, &x, &w, &y, &rs, &err) == K3C_EINVAL, "D = 0 rejected");
    k3c_rmsnorm_sizes ok = {1, 1, 1e-5};
    CHECK(k3c_rmsnorm_bwd_f64(&ok, &x, &w, NULL, &x, &y, &w, &err) == K3C_EINVAL, "backward without rstd rejected");
}

/* ---------------------------------------------------------------- linear and matmul */
typedef struct {
    k3c_linear_sizes s;
    double *x, *W, *y, *r;
} lin_ctx;

static double lin_loss(void *p) {
    lin_ctx *c = p;
    k3c_linear_fwd_f64(&c->s, c->x, c->W, c->y, NULL);
    return dotd(c->r, c->y, (size_t)(c->s.T * c->s.out));
}

static void check_linear(int64_t T, int64_t in, int64_t out) {
    k3c_err err = {0};
    size_t nx = (size_t)(T * in), nw = (size_t)(out * in), ny = (size_t)(T * out);
    lin_ctx c = {{T, in, out, 0}, randn(nx, 1), randn(nw, 0.5), filled(ny, 7), randn(ny, 1)};
    double *dx = filled(nx, PREFILL), *dW = filled(nw, PREFILL);
    lin_loss(&c);
    double fe = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t o = 0; o < out; o++)
            fe = fmax(fe, fabs(dotd(c.x + t * in, c.W + o * in, (size_t)in) - c.y[t * out + o]));
    CHECK_LE(fe, 1e-13, "linear fwd max abs err");
    CHECK_OK(k3c_linear_bwd_f64(&c.s, c.x, c.W, c.r, dx, dW, &err), &err);
    unfill(dx, nx), unfill(dW, nw);
    char what[96];
    snprintf(what, sizeof what, "linear %lldx%lld->%lld: FD dx", (long long)T, (long long)in, (long long)out);
    CHECK_LE(test_fd_rel_err(lin_loss, &c, c.x, nx, dx), FD_TOL, what);
    snprintf(what, sizeof what, "linear %lldx%lld->%lld: FD dW", (long long)T, (long long)in, (long long)out);
    CHECK_LE(test_fd_rel_err(lin_loss, &c, c.W, nw, dW), FD_TOL, what);
    /* accumulate: y += x Wᵀ (y recomputed at the unperturbed point first) */
    lin_loss(&c);
    double *y2 = filled(ny, 1.5);
    k3c_linear_sizes sa = c.s;
    sa.accumulate = 1;
    CHECK_OK(k3c_linear_fwd_f64(&sa, c.x, c.W, y2, &err), &err);
    double ae = 0;
    for (size_t i = 0; i < ny; i++) ae = fmax(ae, fabs(y2[i] - 1.5 - c.y[i]));
    CHECK_LE(ae, 1e-14, "linear accumulate adds");
    float *xf = to_f32(c.x, nx), *Wf = to_f32(c.W, nw), *yf = calloc(ny, sizeof *yf), *rf = to_f32(c.r, ny);
    float *dxf = calloc(nx, sizeof *dxf), *dWf = calloc(nw, sizeof *dWf);
    k3c_linear_fwd_f32(&c.s, xf, Wf, yf, &err);
    k3c_linear_bwd_f32(&c.s, xf, Wf, rf, dxf, dWf, &err);
    lin_loss(&c);
    CHECK_LE(rel_f32(yf, c.y, ny), F32_TOL, "linear f32 y");
    CHECK_LE(rel_f32(dxf, dx, nx), F32_TOL, "linear f32 dx");
    CHECK_LE(rel_f32(dWf, dW, nw), F32_TOL, "linear f32 dW");
    free(c.x), free(c.W), free(c.y), free(c.r), free(dx), free(dW), free(y2);
    free(xf), free(Wf), free(yf), free(rf), free(dxf), free(dWf);
}

static void test_linear(void) {
    check_linear(1, 1, 1);
    check_linear(5, 7, 3);
    check_linear(9, 13, 17);
    k3c_err err = {0};
    double y[6] = {1, 2, 3, 4, 5, 6}, x = 0, W = 0;
    k3c_linear_sizes s0 = {2, 0, 3, 0}; /* in = 0: an empty product, y must become 0 */
    CHECK_OK(k3c_linear_fwd_f64(&s0, &x, &W, y, &err), &err);
    CHECK(y[0] == 0 && y[5] == 0, "in = 0 gives y = 0");
    k3c_linear_sizes sT = {0, 4, 3, 0};
    CHECK_OK(k3c_linear_fwd_f64(&sT, &x, &W, y, &err), &err);

    /* matmul, all four transpose combinations, against loops */
    enum { M = 4, N = 5, K = 3 };
    double *A = randn(M * K, 1), *B = randn(K * N, 1), *C = randn(M * N, 1), *C0 = malloc(sizeof(double) * M * N);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            memcpy(C0, C, sizeof(double) * M * N);
            CHECK_OK(k3c_matmul_f64(ta, tb, M, N, K, 2.0, A, B, 0.5, C0, &err), &err);
            double e = 0;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double s = 0;
                    for (int l = 0; l < K; l++)
                        s += (ta ? A[l * M + i] : A[i * K + l]) * (tb ? B[j * K + l] : B[l * N + j]);
                    e = fmax(e, fabs(2 * s + 0.5 * C[i * N + j] - C0[i * N + j]));
                }
            CHECK(e <= 1e-14, "matmul trans_a %d trans_b %d max err %.2e", ta, tb, e);
        }
    free(A), free(B), free(C), free(C0);
}

/* ---------------------------------------------------------------- sigmoid gate, SiLU */
typedef struct {
    int64_t n;
    double *x, *z, *y, *r;
    int silu;
} gate_ctx;

static double gate_loss(void *p) {
    gate_ctx *c = p;
    if (c->silu)
        k3c_silu_f64(c->n, c->x, c->y);
    else
        k3c_sigmoid_gate_fwd_f64(c->n, c->x, c->z, c->y, NULL);
    return dotd(c->r, c->y, (size_t)c->n);
}

static void test_gates(void) {
    k3c_err err = {0};
    int64_t sizes[] = {1, 17, 130};
    for (int si = 0; si < 3; si++) {
        int64_t n = sizes[si];
        gate_ctx c = {n, randn(n, 1.5), randn(n, 3), filled(n, 0), randn(n, 1), 0};
        double *dx = filled(n, PREFILL), *dz = filled(n, PREFILL);
        gate_loss(&c);
        double fe = 0;
        for (int64_t i = 0; i < n; i++) fe = fmax(fe, fabs(c.x[i] / (1 + exp(-c.z[i])) - c.y[i]));
        CHECK_LE(fe, 1e-15, "sigmoid gate fwd");
        CHECK_OK(k3c_sigmoid_gate_bwd_f64(n, c.x, c.z, c.r, dx, dz, &err), &err);
        unfill(dx, n), unfill(dz, n);
        CHECK_LE(test_fd_rel_err(gate_loss, &c, c.x, n, dx), FD_TOL, "sigmoid gate FD dx");
        CHECK_LE(test_fd_rel_err(gate_loss, &c, c.z, n, dz), FD_TOL, "sigmoid gate FD dz");
        c.silu = 1;
        double *ds = filled(n, PREFILL);
        k3c_silu_bwd_f64(n, c.x, c.r, ds);
        unfill(ds, n);
        CHECK_LE(test_fd_rel_err(gate_loss, &c, c.x, n, ds), FD_TOL, "silu FD dx");
        float *xf = to_f32(c.x, n), *zf = to_f32(c.z, n), *yf = calloc(n, sizeof *yf);
        c.silu = 0, gate_loss(&c);
        k3c_sigmoid_gate_fwd_f32(n, xf, zf, yf, &err);
        CHECK_LE(rel_f32(yf, c.y, n), F32_TOL, "sigmoid gate f32");
        free(c.x), free(c.z), free(c.y), free(c.r), free(dx), free(dz), free(ds), free(xf), free(zf), free(yf);
    }
    /* saturation: no overflow to inf / NaN at |z| = 800 (float exp overflows at 89) */
    float zf[4] = {-800, 800, -100, 100}, yf[4], xf[4] = {1, 1, 1, 1}, dxf[4] = {0}, dzf[4] = {0}, df[4] = {1, 1, 1, 1};
    k3c_sigmoid_f32(4, zf, yf);
    CHECK(yf[0] == 0 && yf[1] == 1 && yf[2] >= 0 && yf[3] == 1, "sigmoid saturates: %g %g %g %g", yf[0], yf[1], yf[2],
          yf[3]);
    k3c_sigmoid_gate_bwd_f32(4, xf, zf, df, dxf, dzf, &err);
    int fin = 1;
    for (int i = 0; i < 4; i++) fin &= isfinite(dxf[i]) && isfinite(dzf[i]);
    CHECK(fin, "sigmoid gate backward finite at |z| = 800");
}

/* ---------------------------------------------------------------- softmax */
typedef struct {
    k3c_softmax_sizes s;
    double *x, *y, *r;
} sm_ctx;

static double sm_loss(void *p) {
    sm_ctx *c = p;
    k3c_softmax_fwd_f64(&c->s, c->x, c->y, NULL);
    return dotd(c->r, c->y, (size_t)(c->s.rows * c->s.n));
}

static void test_softmax(void) {
    k3c_err err = {0};
    int64_t shapes[][2] = {{1, 1}, {3, 5}, {6, 31}};
    for (int si = 0; si < 3; si++) {
        int64_t rows = shapes[si][0], n = shapes[si][1];
        size_t nn = (size_t)(rows * n);
        sm_ctx c = {{rows, n}, randn(nn, 2), filled(nn, 0), randn(nn, 1)};
        double *dx = filled(nn, PREFILL);
        sm_loss(&c);
        double se = 0;
        for (int64_t i = 0; i < rows; i++) {
            double s = 0;
            for (int64_t j = 0; j < n; j++) s += c.y[i * n + j];
            se = fmax(se, fabs(s - 1));
        }
        CHECK_LE(se, 1e-15, "softmax rows sum to 1");
        CHECK_OK(k3c_softmax_bwd_f64(&c.s, c.y, c.r, dx, &err), &err);
        unfill(dx, nn);
        CHECK_LE(test_fd_rel_err(sm_loss, &c, c.x, nn, dx), FD_TOL, "softmax FD dx");
        free(c.x), free(c.y), free(c.r), free(dx);
    }
    float big[3] = {1000, 1001, 999}, yb[3];
    k3c_softmax_sizes s = {1, 3};
    k3c_softmax_fwd_f32(&s, big, yb, &err);
    double e1 = exp(1.0), ref = e1 / (1 + e1 + 1 / e1);
    CHECK(fabs(yb[1] - ref) < 1e-6, "softmax of 1000-scale logits stable: %g vs %g", yb[1], ref);
}

/* ---------------------------------------------------------------- cross-entropy */
typedef struct {
    k3c_xent_sizes s;
    double *logits, *lse;
    const int32_t *targets;
    const uint8_t *mask;
} xent_ctx;

static double xent_loss(void *p) {
    xent_ctx *c = p;
    double loss = 0;
    k3c_xent_fwd_f64(&c->s, c->logits, c->targets, c->mask, c->lse, &loss, NULL, NULL);
    return loss;
}

static void test_xent(void) {
    k3c_err err = {0};
    enum { T = 7, V = 11 };
    int32_t targets[T] = {3, -1, 10, 0, 5, 5, 2};
    uint8_t mask[T] = {1, 1, 1, 0, 1, 1, 1}; /* counted: t = 0, 2, 4, 5, 6 (t=1 target −1, t=3 mask 0) */
    xent_ctx c = {{T, V, 0, NULL}, randn(T * V, 3), filled(T, 0), targets, mask};
    double loss = 0;
    int64_t count = -1;
    CHECK_OK(k3c_xent_fwd_f64(&c.s, c.logits, targets, mask, c.lse, &loss, &count, &err), &err);
    CHECK(count == 5, "counted positions %lld (expect 5)", (long long)count);
    double ref = 0;
    for (int t = 0; t < T; t++) {
        if (targets[t] < 0 || !mask[t]) continue;
        double s = 0;
        for (int j = 0; j < V; j++) s += exp(c.logits[t * V + j]);
        ref += log(s) - c.logits[t * V + targets[t]];
    }
    CHECK_LE(fabs(loss - ref / 5), 1e-14, "xent loss = mean over counted positions");
    double *dl = filled(T * V, PREFILL);
    CHECK_OK(k3c_xent_bwd_f64(&c.s, c.logits, targets, mask, c.lse, 1.0, dl, &err), &err);
    unfill(dl, T * V);
    int zero_ignored = 1;
    for (int j = 0; j < V; j++) zero_ignored &= dl[1 * V + j] == 0 && dl[3 * V + j] == 0;
    CHECK(zero_ignored, "ignored positions get no gradient");
    CHECK_LE(test_fd_rel_err(xent_loss, &c, c.logits, T * V, dl), FD_TOL, "xent FD dlogits (masked)");

    /* other shapes: V = 1 (loss 0, gradient 0), a wide row, no mask */
    int64_t shapes[2][2] = {{3, 1}, {5, 257}};
    for (int si = 0; si < 2; si++) {
        const int64_t T2 = shapes[si][0], V2 = shapes[si][1];
        int32_t tg[5] = {0, 0, 0, 0, 0};
        if (si == 1) tg[0] = 256, tg[1] = 3, tg[2] = -1, tg[3] = 100, tg[4] = 0;
        xent_ctx x2 = {{T2, V2, 0, NULL}, randn((size_t)(T2 * V2), 2), filled(T2, 0), tg, NULL};
        double *g = filled((size_t)(T2 * V2), PREFILL), l2 = 1;
        CHECK_OK(k3c_xent_fwd_f64(&x2.s, x2.logits, tg, NULL, x2.lse, &l2, NULL, &err), &err);
        CHECK_OK(k3c_xent_bwd_f64(&x2.s, x2.logits, tg, NULL, x2.lse, 1.0, g, &err), &err);
        unfill(g, (size_t)(T2 * V2));
        if (si == 0) CHECK(fabs(l2) < 1e-15, "V = 1: loss %g is 0", l2);
        CHECK_LE(test_fd_rel_err(xent_loss, &x2, x2.logits, (size_t)(T2 * V2), g), FD_TOL,
                 "xent FD dlogits (other shapes)");
        free(x2.logits), free(x2.lse), free(g);
    }

    /* divisor override and dloss scaling: norm = 20 → loss·5/20, gradient scales the same way */
    xent_ctx c2 = c;
    c2.s.norm = 20;
    double loss2 = 0, *dl2 = filled(T * V, 0);
    CHECK_OK(k3c_xent_fwd_f64(&c2.s, c.logits, targets, mask, c.lse, &loss2, NULL, &err), &err);
    CHECK_LE(fabs(loss2 - loss * 5 / 20), 1e-14, "xent norm override");
    CHECK_OK(k3c_xent_bwd_f64(&c2.s, c.logits, targets, mask, c.lse, 3.0, dl2, &err), &err);
    double se = 0;
    for (int i = 0; i < T * V; i++) se = fmax(se, fabs(dl2[i] - dl[i] * 3 * 5 / 20));
    CHECK_LE(se, 1e-15, "xent bwd scales with dloss / norm");

    /* per-position weights (signed, as the RL update's −∂L/∂logp): loss = Σ w_t CE_t / count, checked against the
       hand sum and by finite differences; all-ones weights reproduce the unweighted loss and gradient bit for bit */
    float w[T] = {0.5f, 9.0f, -1.25f, 7.0f, 2.0f, 0.0f, -0.75f};
    xent_ctx cw = c;
    cw.s.weight = w;
    double wref = 0, lw = 0, *dlw = filled(T * V, PREFILL);
    for (int t = 0; t < T; t++) {
        if (targets[t] < 0 || !mask[t]) continue;
        double s = 0;
        for (int j = 0; j < V; j++) s += exp(c.logits[t * V + j]);
        wref += w[t] * (log(s) - c.logits[t * V + targets[t]]);
    }
    CHECK_OK(k3c_xent_fwd_f64(&cw.s, c.logits, targets, mask, c.lse, &lw, NULL, &err), &err);
    CHECK_LE(fabs(lw - wref / 5), 1e-14, "weighted xent loss = Σ w·CE / count");
    CHECK_OK(k3c_xent_bwd_f64(&cw.s, c.logits, targets, mask, c.lse, 1.0, dlw, &err), &err);
    unfill(dlw, T * V);
    CHECK_LE(test_fd_rel_err(xent_loss, &cw, c.logits, T * V, dlw), FD_TOL, "weighted xent FD dlogits");
    int zero_w = 1;
    for (int j = 0; j < V; j++) zero_w &= dlw[5 * V + j] == 0;
    CHECK(zero_w, "weight 0: no gradient");
    float ones[T] = {1, 1, 1, 1, 1, 1, 1};
    cw.s.weight = ones;
    double *dl1 = filled(T * V, 0), *dl0 = filled(T * V, 0);
    CHECK_OK(k3c_xent_fwd_f64(&cw.s, c.logits, targets, mask, c.lse, &lw, NULL, &err), &err);
    CHECK_OK(k3c_xent_bwd_f64(&cw.s, c.logits, targets, mask, c.lse, 1.0, dl1, &err), &err);
    CHECK_OK(k3c_xent_bwd_f64(&c.s, c.logits, targets, mask, c.lse, 1.0, dl0, &err), &err);
    CHECK(lw == loss && !memcmp(dl1, dl0, sizeof *dl * T * V), "weights of 1 == no weights, bit for bit");
    free(dlw), free(dl1), free(dl0);

    /* NULL mask: only target −1 is ignored */
    int64_t cnt = 0;
    CHECK_OK(k3c_xent_fwd_f64(&c.s, c.logits, targets, NULL, c.lse, &loss2, &cnt, &err), &err);
    CHECK(cnt == 6, "NULL mask counts %lld (expect 6)", (long long)cnt);
    /* nothing counted: loss 0, no gradient, no division by zero */
    uint8_t none[T] = {0};
    double *dl3 = filled(T * V, 0);
    CHECK_OK(k3c_xent_fwd_f64(&c.s, c.logits, targets, none, c.lse, &loss2, &cnt, &err), &err);
    CHECK_OK(k3c_xent_bwd_f64(&c.s, c.logits, targets, none, c.lse, 1.0, dl3, &err), &err);
    double mx = 0;
    for (int i = 0; i < T * V; i++) mx = fmax(mx, fabs(dl3[i]));
    CHECK(loss2 == 0 && cnt == 0 && mx == 0, "all masked: loss %g count %lld max grad %g", loss2, (long long)cnt, mx);
    /* a counted target >= V is an error; a masked one is not even looked at */
    int32_t bad[T] = {3, -1, 11, 0, 5, 5, 2};
    CHECK(k3c_xent_fwd_f64(&c.s, c.logits, bad, mask, c.lse, &loss2, NULL, &err) == K3C_EINVAL &&
              strstr(err.msg, "position 2"),
          "target 11 >= V rejected: '%s'", err.msg);
    bad[2] = 2, bad[3] = 99;
    CHECK_OK(k3c_xent_fwd_f64(&c.s, c.logits, bad, mask, c.lse, &loss2, NULL, &err), &err);

    /* float32 vs float64 on the same (rounded) inputs: plain logits for the gradient, then logits offset by 1e4 for
       the loss (no overflow; a float lse that large carries ~1e-3 absolute error: its gradient is checked finite only) */
    float *lf32 = to_f32(c.logits, T * V), lsef[T], *dlf = calloc(T * V, sizeof *dlf);
    double *big = to_f64(lf32, T * V), lf = 0, ld = 0, *dld = filled(T * V, 0);
    CHECK_OK(k3c_xent_fwd_f32(&c.s, lf32, targets, mask, lsef, &lf, NULL, &err), &err);
    CHECK_OK(k3c_xent_fwd_f64(&c.s, big, targets, mask, c.lse, &ld, NULL, &err), &err);
    CHECK_OK(k3c_xent_bwd_f32(&c.s, lf32, targets, mask, lsef, 1.0, dlf, &err), &err);
    CHECK_OK(k3c_xent_bwd_f64(&c.s, big, targets, mask, c.lse, 1.0, dld, &err), &err);
    CHECK(fabs(lf - ld) <= F32_TOL * fabs(ld), "xent f32 loss %.9g vs f64 %.9g", lf, ld);
    CHECK_LE(rel_f32(dlf, dld, T * V), F32_TOL, "xent f32 dlogits");
    for (int i = 0; i < T * V; i++) lf32[i] += (i % V == 0) ? 1e4f : 0.0f, big[i] = lf32[i], dlf[i] = 0;
    CHECK_OK(k3c_xent_fwd_f32(&c.s, lf32, targets, mask, lsef, &lf, NULL, &err), &err);
    CHECK_OK(k3c_xent_fwd_f64(&c.s, big, targets, mask, c.lse, &ld, NULL, &err), &err);
    CHECK_OK(k3c_xent_bwd_f32(&c.s, lf32, targets, mask, lsef, 1.0, dlf, &err), &err);
    int fin = 1;
    for (int i = 0; i < T * V; i++) fin &= isfinite(dlf[i]);
    CHECK(fin && fabs(lf - ld) <= F32_TOL * fabs(ld), "xent f32 at logits 1e4: loss %.9g vs %.9g, grads finite %d", lf,
          ld, fin);
    free(c.logits), free(c.lse), free(dl), free(dl2), free(dl3), free(big), free(lf32), free(dlf), free(dld);
}

/* The moves a model step makes through its backend, and the sigmoid backward. */
static void test_moves(void) {
    double src[6 * 5], dst[4 * 7], y[10], dy[10], dx[10];
    for (int i = 0; i < 30; i++) src[i] = i + 1;
    for (int i = 0; i < 28; i++) dst[i] = -1;
    k3c_copy2d_f64(4, 3, src + 1, 5, dst + 2, 7, 0);
    int ok = 1;
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 7; c++) ok &= dst[r * 7 + c] == (c >= 2 && c < 5 ? src[r * 5 + 1 + c - 2] : -1);
    k3c_copy2d_f64(4, 3, src + 1, 5, dst + 2, 7, 1);
    for (int r = 0; r < 4; r++) ok &= dst[r * 7 + 2] == 2 * src[r * 5 + 1] && dst[r * 7 + 1] == -1;
    CHECK(ok, "copy2d: strided copy / accumulate wrong");
    double before[28];
    memcpy(before, dst, sizeof before);
    k3c_add_f64(5, src, dst);
    ok = 1;
    for (int i = 0; i < 28; i++) ok &= dst[i] == before[i] + (i < 5 ? src[i] : 0);
    CHECK(ok, "add: y += x over the first n entries only");
    k3c_zero_f64(dst, 28);
    ok = 1;
    for (int i = 0; i < 28; i++) ok &= dst[i] == 0;
    CHECK(ok, "zero");
    for (int i = 0; i < 10; i++) {
        y[i] = k3c_sigmoid_d(i - 4.5);
        dy[i] = 0.1 * i - 0.3;
        dx[i] = 1;
    }
    k3c_sigmoid_bwd_f64(10, y, dy, dx);
    double worst = 0;
    for (int i = 0; i < 10; i++) {
        double h = 1e-6, fd = (k3c_sigmoid_d(i - 4.5 + h) - k3c_sigmoid_d(i - 4.5 - h)) / (2 * h) * dy[i];
        worst = fmax(worst, fabs(dx[i] - 1 - fd));
    }
    CHECK_LE(worst, 1e-9, "sigmoid_bwd vs finite differences");
}

int main(void) {
    test_moves();
    test_embedding();
    test_rmsnorm();
    test_linear();
    test_gates();
    test_softmax();
    test_xent();
    return test_summary();
}
