/* test_short_conv.c — depthwise causal short conv + SiLU: naive reference with document resets, conv state carried
 * across calls (split = one call, in-place state), float64 finite differences for dx, dw, dstate, float32 agreement. */
#include "test.h"

#include "ops/short_conv.h"

#define FD_TOL 1e-6
#define F32_TOL 1e-5
#define EXACT_TOL 1e-15 /* same arithmetic in another order */
#define PREFILL 0.25

static uint64_t seed_ = 11;
static double *randn(size_t n, double sd) {
    double *x = malloc((n ? n : 1) * sizeof *x);
    k3c_rng r = {seed_++, 0};
    for (size_t i = 0; i < n; i++) x[i] = sd * k3c_rng_normal(&r);
    return x;
}

/* Straight from the spec: a_t[c] = Σ_j w[c,j] x_{t−W+1+j}[c] inside the document, state entries before it. */
static void naive(int64_t T, int64_t C, int W, int nd, const int32_t *cu, const double *x, const double *w,
                  const double *st, double *y) {
    for (int doc = 0; doc < nd; doc++)
        for (int64_t t = cu[doc]; t < cu[doc + 1]; t++)
            for (int64_t c = 0; c < C; c++) {
                double a = 0;
                for (int j = 0; j < W; j++) {
                    int64_t s = t - W + 1 + j;
                    double xv = 0;
                    if (s >= cu[doc])
                        xv = x[s * C + c];
                    else if (st && s - cu[doc] + W - 1 >= 0)
                        xv = st[(doc * C + c) * (W - 1) + (s - cu[doc] + W - 1)];
                    a += w[c * W + j] * xv;
                }
                y[t * C + c] = a / (1 + exp(-a));
            }
}

typedef struct {
    k3c_short_conv_dims d;
    const int32_t *cu;
    double *x, *w, *st, *dy, *y;
} sc_ctx;

static double sc_loss(void *ctx) {
    sc_ctx *c = ctx;
    k3c_err e = {0};
    k3c_short_conv_fwd_f64(&c->d, c->cu, c->x, c->w, c->st, c->y, NULL, &e);
    double s = 0;
    for (int64_t i = 0; i < c->d.T * c->d.C; i++) s += c->y[i] * c->dy[i];
    return s;
}

static void test_fwd_bwd(int W, int with_state) {
    static const int32_t cu[] = {0, 5, 6, 6, 15}; /* a 1-token and an empty document between two longer ones */
    const int nd = 4;
    const int64_t T = 15, C = 6, SN = (int64_t)nd * C * (W - 1);
    sc_ctx c = {{T, C, W, nd},
                cu,
                randn(T * C, 1.0),
                randn(C * W, 0.7),
                with_state ? randn(SN ? SN : 1, 1.0) : NULL,
                randn(T * C, 1.0),
                calloc(T * C, 8)};
    k3c_err e = {0};
    double *ref = calloc(T * C, 8);
    naive(T, C, W, nd, cu, c.x, c.w, c.st, ref);
    sc_loss(&c);
    char what[96];
    snprintf(what, sizeof what, "short_conv W=%d state=%d vs naive", W, with_state);
    CHECK_LE(test_rel_err_d(c.y, ref, T * C), EXACT_TOL, what);
    double *dx = malloc(T * C * 8), *dw = malloc(C * W * 8), *dst = malloc((SN ? SN : 1) * 8);
    for (int64_t i = 0; i < T * C; i++) dx[i] = PREFILL;
    for (int64_t i = 0; i < C * W; i++) dw[i] = PREFILL;
    for (int64_t i = 0; i < SN; i++) dst[i] = PREFILL;
    void *ws = k3c_aligned_alloc(k3c_short_conv_bwd_workspace_f64(&c.d));
    CHECK_OK(k3c_short_conv_bwd_f64(&c.d, cu, c.x, c.w, c.st, c.dy, dx, dw, with_state ? dst : NULL, ws, &e), &e);
    for (int64_t i = 0; i < T * C; i++) dx[i] -= PREFILL;
    for (int64_t i = 0; i < C * W; i++) dw[i] -= PREFILL;
    for (int64_t i = 0; i < SN; i++) dst[i] -= PREFILL;
    double err = fmax(test_fd_rel_err(sc_loss, &c, c.x, T * C, dx), test_fd_rel_err(sc_loss, &c, c.w, C * W, dw));
    if (with_state && SN) err = fmax(err, test_fd_rel_err(sc_loss, &c, c.st, SN, dst));
    snprintf(what, sizeof what, "FD short_conv W=%d state=%d (dx, dw%s)", W, with_state, with_state ? ", dstate" : "");
    CHECK_LE(err, FD_TOL, what);
    /* float32 */
    float *xf = malloc(T * C * 4), *wf = malloc(C * W * 4), *sf = malloc((SN ? SN : 1) * 4), *yf = malloc(T * C * 4);
    for (int64_t i = 0; i < T * C; i++) xf[i] = (float)c.x[i];
    for (int64_t i = 0; i < C * W; i++) wf[i] = (float)c.w[i];
    for (int64_t i = 0; i < SN; i++) sf[i] = with_state ? (float)c.st[i] : 0;
    CHECK_OK(k3c_short_conv_fwd_f32(&c.d, cu, xf, wf, with_state ? sf : NULL, yf, NULL, &e), &e);
    double num = 0, den = 0;
    for (int64_t i = 0; i < T * C; i++) num += (yf[i] - c.y[i]) * (yf[i] - c.y[i]), den += c.y[i] * c.y[i];
    snprintf(what, sizeof what, "short_conv W=%d f32 vs f64", W);
    CHECK_LE(sqrt(num / den), F32_TOL, what);
    free(xf), free(wf), free(sf), free(yf);
    k3c_aligned_free(ws);
    free(dx), free(dw), free(dst), free(ref), free(c.x), free(c.w), free(c.st), free(c.dy), free(c.y);
}

/* One call over 13 tokens = a call over the first n1 carrying its state into a call over the rest (in place). */
static void test_split(int64_t n1) {
    const int W = 4;
    const int64_t T = 13, C = 5, SN = C * (W - 1);
    double *x = randn(T * C, 1.0), *w = randn(C * W, 0.7), *s0 = randn(SN, 1.0);
    double *y_all = calloc(T * C, 8), *st_all = calloc(SN, 8), *y = calloc(T * C, 8), *st = malloc(SN * 8);
    memcpy(st, s0, SN * 8);
    k3c_err e = {0};
    k3c_short_conv_dims d = {T, C, W, 1};
    CHECK_OK(k3c_short_conv_fwd_f64(&d, NULL, x, w, s0, y_all, st_all, &e), &e);
    k3c_short_conv_dims d1 = {n1, C, W, 1}, d2 = {T - n1, C, W, 1};
    CHECK_OK(k3c_short_conv_fwd_f64(&d1, NULL, x, w, st, y, st, &e), &e);
    CHECK_OK(k3c_short_conv_fwd_f64(&d2, NULL, x + n1 * C, w, st, y + n1 * C, st, &e), &e);
    char what[64];
    snprintf(what, sizeof what, "short_conv split at %lld: y", (long long)n1);
    CHECK_LE(test_rel_err_d(y, y_all, T * C), EXACT_TOL, what);
    snprintf(what, sizeof what, "short_conv split at %lld: state", (long long)n1);
    CHECK_LE(test_rel_err_d(st, st_all, SN), 0, what);
    /* the final state is the last W−1 inputs, oldest first */
    int ok = 1;
    for (int64_t c = 0; c < C; c++)
        for (int j = 0; j < W - 1; j++) ok &= st_all[c * (W - 1) + j] == x[(T - W + 1 + j) * C + c];
    CHECK(ok, "state_out holds the last W-1 inputs, oldest first");
    free(x), free(w), free(s0), free(y_all), free(st_all), free(y), free(st);
}

/* Decoding token by token with the state equals the prefill over the same tokens, per document. */
static void test_decode(void) {
    const int W = 4, nd = 2;
    const int64_t C = 3, L = 6, SN = nd * C * (W - 1);
    const int32_t cu[] = {0, 6, 12};
    double *x = randn(2 * L * C, 1.0), *w = randn(C * W, 0.7), *y_all = calloc(2 * L * C, 8);
    k3c_err e = {0};
    k3c_short_conv_dims d = {2 * L, C, W, nd};
    CHECK_OK(k3c_short_conv_fwd_f64(&d, cu, x, w, NULL, y_all, NULL, &e), &e);
    double *st = calloc(SN, 8), *xt = malloc(nd * C * 8), *yt = malloc(nd * C * 8), err = 0;
    const int32_t cu1[] = {0, 1, 2};
    k3c_short_conv_dims d1 = {nd, C, W, nd};
    for (int64_t t = 0; t < L; t++) {
        for (int doc = 0; doc < nd; doc++) memcpy(xt + doc * C, x + (doc * L + t) * C, C * 8);
        CHECK_OK(k3c_short_conv_fwd_f64(&d1, cu1, xt, w, st, yt, st, &e), &e);
        for (int doc = 0; doc < nd; doc++)
            for (int64_t c = 0; c < C; c++) err = fmax(err, fabs(yt[doc * C + c] - y_all[(doc * L + t) * C + c]));
    }
    CHECK_LE(err, EXACT_TOL, "short_conv decode steps vs prefill (max abs)");
    free(x), free(w), free(y_all), free(st), free(xt), free(yt);
}

static void test_args(void) {
    k3c_err e = {0};
    double x = 0, w = 0, y = 0;
    k3c_short_conv_dims d = {1, 1, 0, 1};
    CHECK(k3c_short_conv_fwd_f64(&d, NULL, &x, &w, NULL, &y, NULL, &e) == K3C_EINVAL, "W = 0 is refused");
    d.W = 1;
    const int32_t cu[] = {0, 2};
    CHECK(k3c_short_conv_fwd_f64(&d, cu, &x, &w, NULL, &y, NULL, &e) == K3C_EINVAL, "cu_seqlens not ending at T");
}

int main(void) {
    test_fwd_bwd(4, 0);
    test_fwd_bwd(4, 1);
    test_fwd_bwd(2, 1);
    test_fwd_bwd(1, 0);
    test_split(6);
    test_split(2);
    test_split(0);
    test_decode();
    test_args();
    return test_summary();
}
