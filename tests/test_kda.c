/* test_kda.c — KDA core (recurrence and chunked, pairwise and factored tiles), gate, L2 norm: the fla golden, float64
 * finite differences, chunk-vs-recurrence agreement, float32 agreement, decoding, argument checks, `k3c check-kda`. */
#include "test.h"

#include "model/golden.h"
#include "ops/kda.h"
#include "ops/l2norm.h"

#define GOLD_TOL 1e-5   /* vs the fla golden (computed in float32 internally) */
#define FD_TOL 1e-6     /* float64 central differences vs the analytic backward (norm-wise relative) */
#define AGREE_TOL 1e-12 /* chunked vs recurrent in float64 */
#define F32_TOL 1e-5    /* float32 vs float64 on the same inputs */
#define PREFILL 0.25    /* gradient buffers start here: the backward must add, not overwrite */

enum { REC, CHUNK };

/* ---------------------------------------------------------------- helpers */
static uint64_t seed_ = 7;
static double *randn(size_t n, double sd) {
    double *x = malloc((n ? n : 1) * sizeof *x);
    k3c_rng r = {seed_++, 0};
    for (size_t i = 0; i < n; i++) x[i] = sd * k3c_rng_normal(&r);
    return x;
}
static double *unif(size_t n, double lo, double hi) {
    double *x = malloc((n ? n : 1) * sizeof *x);
    k3c_rng r = {seed_++, 0};
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * k3c_rng_uniform(&r);
    return x;
}
static double *dupd(const double *x, size_t n) {
    if (!x) return NULL;
    double *y = malloc((n ? n : 1) * sizeof *y);
    memcpy(y, x, n * sizeof *y);
    return y;
}
static float *to_f32(const double *x, size_t n) {
    if (!x) return NULL;
    float *y = malloc((n ? n : 1) * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}
static double rel_f32(const float *x, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]), den += ref[i] * ref[i];
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
static void l2rows(double *x, size_t rows, size_t dim) {
    for (size_t r = 0; r < rows; r++) {
        double s = 0;
        for (size_t i = 0; i < dim; i++) s += x[r * dim + i] * x[r * dim + i];
        for (size_t i = 0; i < dim; i++) x[r * dim + i] /= sqrt(s);
    }
}

/* One KDA problem: inputs, upstream gradients and sizes. */
typedef struct {
    k3c_kda_dims d;
    int32_t cu[8];
    int use_cu;
    double *q, *k, *v, *g, *beta, *h0, *dout, *dht;
} kcase;

static size_t nk(const kcase *c) { return (size_t)(c->d.T * c->d.H * c->d.dk); }
static size_t nv(const kcase *c) { return (size_t)(c->d.T * c->d.H * c->d.dv); }
static size_t nb(const kcase *c) { return (size_t)(c->d.T * c->d.H); }
static size_t ns(const kcase *c) { return (size_t)(c->d.n_docs * c->d.H * c->d.dk * c->d.dv); }

typedef struct {
    double *o, *ht, *dq, *dk, *dv, *dg, *dbeta, *dh0;
} kout;

static void kout_alloc(kout *r, const kcase *c) {
    r->o = calloc(nv(c), sizeof(double));
    r->ht = calloc(ns(c), sizeof(double));
    double **gs[] = {&r->dq, &r->dk, &r->dg};
    for (int i = 0; i < 3; i++) {
        *gs[i] = malloc(nk(c) * sizeof(double));
        for (size_t j = 0; j < nk(c); j++) (*gs[i])[j] = PREFILL;
    }
    r->dv = malloc(nv(c) * sizeof(double));
    for (size_t j = 0; j < nv(c); j++) r->dv[j] = PREFILL;
    r->dbeta = malloc(nb(c) * sizeof(double));
    for (size_t j = 0; j < nb(c); j++) r->dbeta[j] = PREFILL;
    r->dh0 = malloc(ns(c) * sizeof(double));
    for (size_t j = 0; j < ns(c); j++) r->dh0[j] = PREFILL;
}
static void kout_unfill(kout *r, const kcase *c) {
    size_t n[] = {nk(c), nk(c), nv(c), nk(c), nb(c), ns(c)};
    double *p[] = {r->dq, r->dk, r->dv, r->dg, r->dbeta, r->dh0};
    for (int i = 0; i < 6; i++)
        for (size_t j = 0; j < n[i]; j++) p[i][j] -= PREFILL;
}
static void kout_free(kout *r) {
    double *p[] = {r->o, r->ht, r->dq, r->dk, r->dv, r->dg, r->dbeta, r->dh0};
    for (int i = 0; i < 8; i++) free(p[i]);
}

static const int32_t *cu_of(const kcase *c) { return c->use_cu ? c->cu : NULL; }

static int fwd64(const kcase *c, int impl, double *o, double *ht, k3c_err *e) {
    size_t wsz = impl == REC ? k3c_kda_recurrent_fwd_workspace_f64(&c->d) : k3c_kda_chunk_fwd_workspace_f64(&c->d);
    void *ws = k3c_aligned_alloc(wsz);
    int rc = impl == REC
                 ? k3c_kda_recurrent_fwd_f64(&c->d, cu_of(c), c->q, c->k, c->v, c->g, c->beta, c->h0, o, ht, ws, e)
                 : k3c_kda_chunk_fwd_f64(&c->d, cu_of(c), c->q, c->k, c->v, c->g, c->beta, c->h0, o, ht, ws, e);
    k3c_aligned_free(ws);
    return rc;
}

/* Forward and backward in float64; gradients come back without the PREFILL offset. */
static int run64(const kcase *c, int impl, kout *r, k3c_err *e) {
    kout_alloc(r, c);
    int rc = fwd64(c, impl, r->o, r->ht, e);
    if (rc) return rc;
    size_t wsz = impl == REC ? k3c_kda_recurrent_bwd_workspace_f64(&c->d) : k3c_kda_chunk_bwd_workspace_f64(&c->d);
    void *ws = k3c_aligned_alloc(wsz);
    rc = (impl == REC ? k3c_kda_recurrent_bwd_f64
                      : k3c_kda_chunk_bwd_f64)(&c->d, cu_of(c), c->q, c->k, c->v, c->g, c->beta, c->h0, c->dout, c->dht,
                                               r->dq, r->dk, r->dv, r->dg, r->dbeta, r->dh0, ws, e);
    k3c_aligned_free(ws);
    kout_unfill(r, c);
    return rc;
}

/* The same in float32 (inputs rounded), results widened to double. */
static int run32(const kcase *c, int impl, kout *r, k3c_err *e) {
    size_t n[] = {nk(c), nk(c), nv(c), nk(c), nb(c), ns(c), nv(c), ns(c)};
    const double *in[] = {c->q, c->k, c->v, c->g, c->beta, c->h0, c->dout, c->dht};
    float *f[8];
    for (int i = 0; i < 8; i++) f[i] = to_f32(in[i], n[i]);
    float *o = calloc(nv(c), 4), *ht = calloc(ns(c), 4);
    float *gr[6];
    size_t gn[] = {nk(c), nk(c), nv(c), nk(c), nb(c), ns(c)};
    for (int i = 0; i < 6; i++) gr[i] = calloc(gn[i], 4);
    void *ws = k3c_aligned_alloc(impl == REC ? k3c_kda_recurrent_bwd_workspace_f32(&c->d)
                                             : k3c_kda_chunk_bwd_workspace_f32(&c->d));
    void *wf = k3c_aligned_alloc(impl == REC ? k3c_kda_recurrent_fwd_workspace_f32(&c->d)
                                             : k3c_kda_chunk_fwd_workspace_f32(&c->d));
    int rc = impl == REC ? k3c_kda_recurrent_fwd_f32(&c->d, cu_of(c), f[0], f[1], f[2], f[3], f[4], f[5], o, ht, wf, e)
                         : k3c_kda_chunk_fwd_f32(&c->d, cu_of(c), f[0], f[1], f[2], f[3], f[4], f[5], o, ht, wf, e);
    if (!rc)
        rc = (impl == REC ? k3c_kda_recurrent_bwd_f32 : k3c_kda_chunk_bwd_f32)(&c->d, cu_of(c), f[0], f[1], f[2], f[3],
                                                                               f[4], f[5], f[6], f[7], gr[0], gr[1],
                                                                               gr[2], gr[3], gr[4], gr[5], ws, e);
    r->o = malloc(nv(c) * 8), r->ht = malloc(ns(c) * 8);
    for (size_t i = 0; i < nv(c); i++) r->o[i] = o[i];
    for (size_t i = 0; i < ns(c); i++) r->ht[i] = ht[i];
    double **dst[] = {&r->dq, &r->dk, &r->dv, &r->dg, &r->dbeta, &r->dh0};
    for (int i = 0; i < 6; i++) {
        *dst[i] = malloc(gn[i] * 8);
        for (size_t j = 0; j < gn[i]; j++) (*dst[i])[j] = gr[i][j];
        free(gr[i]);
    }
    for (int i = 0; i < 8; i++) free(f[i]);
    free(o), free(ht), k3c_aligned_free(ws), k3c_aligned_free(wf);
    return rc;
}

static const char *const out_names[] = {"o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"};
/* Worst relative error over the 8 outputs of a against b; names the worst in *which. */
static double kout_err(const kout *a, const kout *b, const kcase *c, const char **which) {
    const double *pa[] = {a->o, a->ht, a->dq, a->dk, a->dv, a->dg, a->dbeta, a->dh0};
    const double *pb[] = {b->o, b->ht, b->dq, b->dk, b->dv, b->dg, b->dbeta, b->dh0};
    size_t n[] = {nv(c), ns(c), nk(c), nk(c), nv(c), nk(c), nb(c), ns(c)};
    double worst = 0;
    *which = "-";
    for (int i = 0; i < 8; i++) {
        double e = test_rel_err_d(pa[i], pb[i], n[i]);
        if (!(e <= worst)) worst = e, *which = out_names[i];
    }
    return worst;
}

/* Random case: docs of the given lengths; q raw, k unit rows; gates uniform in [glo, ghi]. */
static kcase make_case(int ndocs, const int *lens, int64_t H, int64_t dk, int64_t dv, int h0, double glo, double ghi) {
    kcase c;
    memset(&c, 0, sizeof c);
    c.use_cu = 1;
    c.cu[0] = 0;
    for (int i = 0; i < ndocs; i++) c.cu[i + 1] = c.cu[i] + lens[i];
    c.d = (k3c_kda_dims){.T = c.cu[ndocs], .H = H, .dk = dk, .dv = dv, .n_docs = ndocs, .chunk = 16};
    c.q = randn(nk(&c), 1.0);
    c.k = randn(nk(&c), 1.0);
    l2rows(c.k, nb(&c), (size_t)dk);
    c.v = randn(nv(&c), 1.0);
    c.g = unif(nk(&c), glo, ghi);
    c.beta = unif(nb(&c), 0.05, 0.95);
    c.h0 = h0 ? randn(ns(&c), 0.5) : NULL;
    c.dout = randn(nv(&c), 1.0);
    c.dht = randn(ns(&c), 1.0);
    return c;
}
static void free_case(kcase *c) {
    double *p[] = {c->q, c->k, c->v, c->g, c->beta, c->h0, c->dout, c->dht};
    for (int i = 0; i < 8; i++) free(p[i]);
}

/* ---------------------------------------------------------------- golden */
static double *gold(k3c_safetensors *st, const char *name, size_t n) {
    const k3c_st_tensor *t = k3c_st_find(st, name);
    double *x = calloc(n ? n : 1, sizeof *x);
    k3c_err e = {0};
    CHECK(t != NULL, "golden tensor %s missing", name);
    if (t) CHECK_OK(k3c_st_read_f64(t, x, n, &e), &e);
    return x;
}

static void test_golden(void) {
    k3c_safetensors *st = NULL;
    k3c_err e = {0};
    const char *path = test_shared("golden/kda_fp64_small.safetensors");
    CHECK_OK(k3c_st_open(path, &st, &e), &e);
    if (!st) return;
    const k3c_st_tensor *tq = k3c_st_find(st, "q");
    CHECK(tq && tq->ndim == 4, "q must be [B, T, H, dk]");
    if (!tq || tq->ndim != 4) {
        k3c_st_close(st);
        return;
    }
    const int64_t B = tq->shape[0], T = tq->shape[1];
    kcase c;
    memset(&c, 0, sizeof c);
    c.use_cu = 1;
    for (int i = 0; i <= B; i++) c.cu[i] = (int32_t)(i * T);
    c.d = (k3c_kda_dims){.T = B * T, .H = tq->shape[2], .dk = tq->shape[3], .dv = 24, .n_docs = (int)B};
    const k3c_st_tensor *tv = k3c_st_find(st, "v");
    if (tv) c.d.dv = tv->shape[3];
    c.q = gold(st, "q", nk(&c)), c.k = gold(st, "k", nk(&c)), c.v = gold(st, "v", nv(&c));
    c.g = gold(st, "g", nk(&c)), c.beta = gold(st, "beta", nb(&c)), c.h0 = gold(st, "h0", ns(&c));
    c.dout = gold(st, "do", nv(&c)), c.dht = gold(st, "dht", ns(&c));
    kout ref = {gold(st, "o", nv(&c)),  gold(st, "ht", ns(&c)), gold(st, "dq", nk(&c)),    gold(st, "dk", nk(&c)),
                gold(st, "dv", nv(&c)), gold(st, "dg", nk(&c)), gold(st, "dbeta", nb(&c)), gold(st, "dh0", ns(&c))};
    struct {
        const char *name;
        int impl, chunk;
        double bound;
    } runs[] = {
        {"recurrent", REC, 0, 0},
        {"chunk16 pairwise", CHUNK, 16, 0},
        {"chunk64 pairwise", CHUNK, 64, 0},
        {"chunk16 factored", CHUNK, 16, -5},
        {"chunk64 factored", CHUNK, 64, -5},
        {"chunk32 factored", CHUNK, 32, -5},
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        c.d.chunk = runs[i].chunk;
        c.d.gate_lower_bound = runs[i].bound;
        kout r;
        CHECK_OK(run64(&c, runs[i].impl, &r, &e), &e);
        const char *which;
        char what[96];
        double err = kout_err(&r, &ref, &c, &which);
        snprintf(what, sizeof what, "golden %s worst (%s)", runs[i].name, which);
        CHECK_LE(err, GOLD_TOL, what);
        kout_free(&r);
    }
    kout_free(&ref);
    free_case(&c);
    k3c_st_close(st);
}

/* ---------------------------------------------------------------- finite differences */
typedef struct {
    kcase *c;
    int impl;
    double *o, *ht;
} fd_ctx;

static double loss_of(void *ctx) {
    fd_ctx *f = ctx;
    k3c_err e = {0};
    if (fwd64(f->c, f->impl, f->o, f->ht, &e)) return NAN;
    double s = 0;
    for (size_t i = 0; i < nv(f->c); i++) s += f->o[i] * f->c->dout[i];
    for (size_t i = 0; i < ns(f->c); i++) s += f->ht[i] * f->c->dht[i];
    return s;
}

static void fd_case(const char *label, kcase *c, int impl) {
    k3c_err e = {0};
    kout r;
    CHECK_OK(run64(c, impl, &r, &e), &e);
    fd_ctx f = {c, impl, malloc(nv(c) * 8), malloc(ns(c) * 8)};
    struct {
        const char *name;
        double *x;
        size_t n;
        const double *g;
    } ts[] = {
        {"q", c->q, nk(c), r.dq}, {"k", c->k, nk(c), r.dk},          {"v", c->v, nv(c), r.dv},
        {"g", c->g, nk(c), r.dg}, {"beta", c->beta, nb(c), r.dbeta}, {"h0", c->h0, ns(c), r.dh0},
    };
    double worst = 0;
    const char *wn = "-";
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) {
        if (!ts[i].x) continue;
        double err = test_fd_rel_err(loss_of, &f, ts[i].x, ts[i].n, ts[i].g);
        if (!(err <= worst)) worst = err, wn = ts[i].name;
    }
    char what[128];
    snprintf(what, sizeof what, "FD %s %s worst (d%s)", label, impl == REC ? "recurrent" : "chunk", wn);
    CHECK_LE(worst, FD_TOL, what);
    free(f.o), free(f.ht);
    kout_free(&r);
}

/* Chunked vs recurrent (float64), then float32 of each vs the float64 recurrence. */
static void agree_case(const char *label, kcase *c) {
    k3c_err e = {0};
    kout rr, rc, fr, fc;
    const char *which;
    char what[128];
    CHECK_OK(run64(c, REC, &rr, &e), &e);
    CHECK_OK(run64(c, CHUNK, &rc, &e), &e);
    snprintf(what, sizeof what, "%s chunk vs recurrent f64", label);
    double err = kout_err(&rc, &rr, c, &which);
    CHECK_LE(err, AGREE_TOL, what);
    if (err > AGREE_TOL) printf("  worst: %s\n", which);
    CHECK_OK(run32(c, REC, &fr, &e), &e);
    CHECK_OK(run32(c, CHUNK, &fc, &e), &e);
    snprintf(what, sizeof what, "%s recurrent f32 vs f64", label);
    CHECK_LE(kout_err(&fr, &rr, c, &which), F32_TOL, what);
    snprintf(what, sizeof what, "%s chunk f32 vs f64", label);
    err = kout_err(&fc, &rr, c, &which);
    CHECK_LE(err, F32_TOL, what);
    if (err > F32_TOL) printf("  worst: %s\n", which);
    kout_free(&rr), kout_free(&rc), kout_free(&fr), kout_free(&fc);
}

static void test_core_cases(void) {
    static const int one[] = {37}, three[] = {5, 23, 17}, two[] = {70, 9}, big[] = {150, 43}, empty[] = {5, 0, 23, 0};
    struct {
        const char *label;
        int ndocs;
        const int *lens;
        int64_t H, dk, dv;
        int h0, chunk;
        double glo, ghi, bound;
        int fd;
    } cs[] = {
        {"1doc softplus c16", 1, one, 2, 8, 6, 1, 16, -20, -0.001, 0, 1},
        {"3docs saturated c16 factored", 3, three, 2, 8, 5, 0, 16, -4.99, -4.9, -5, 1},
        {"3docs softplus c16 no-h0", 3, three, 2, 8, 5, 0, 16, -20, -0.01, 0, 1},
        {"2docs bounded c64 factored", 2, two, 1, 6, 4, 1, 64, -4.99, -0.01, -5, 1},
        {"2docs softplus c64 pairwise", 2, two, 1, 6, 4, 1, 64, -20, -0.001, 0, 1},
        {"2docs saturated c64 factored", 2, two, 1, 6, 4, 0, 64, -4.99, -4.9, -5, 1},
        {"long c64 mild factored", 2, big, 4, 16, 12, 1, 64, -0.5, -0.001, -5, 0},
        {"long c64 mild pairwise", 2, big, 4, 16, 12, 1, 64, -0.5, -0.001, 0, 0},
        {"long c32 softplus", 2, big, 4, 16, 12, 1, 32, -8, -0.0001, 0, 0},
        {"empty docs c16 factored", 4, empty, 2, 8, 5, 1, 16, -4.99, -0.01, -5, 0},
    }; /* the "long" cases (T·H·dk·dv > 2^17) take the OpenMP path */
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        kcase c = make_case(cs[i].ndocs, cs[i].lens, cs[i].H, cs[i].dk, cs[i].dv, cs[i].h0, cs[i].glo, cs[i].ghi);
        c.d.chunk = cs[i].chunk;
        c.d.gate_lower_bound = cs[i].bound;
        if (cs[i].fd) {
            fd_case(cs[i].label, &c, CHUNK);
            if (i < 2) fd_case(cs[i].label, &c, REC);
        }
        agree_case(cs[i].label, &c);
        free_case(&c);
    }
}

/* The recurrent backward with a checkpoint interval (d.chunk) that does not divide the documents. */
static void test_recurrent_segments(void) {
    static const int lens[] = {5, 23, 17};
    kcase c = make_case(3, lens, 2, 8, 5, 1, -3, -0.01);
    k3c_err e = {0};
    kout a, b;
    c.d.chunk = 64;
    CHECK_OK(run64(&c, REC, &a, &e), &e);
    c.d.chunk = 7;
    CHECK_OK(run64(&c, REC, &b, &e), &e);
    const char *which;
    CHECK_LE(kout_err(&b, &a, &c, &which), 1e-14, "recurrent bwd checkpoint 7 vs 64");
    fd_case("recurrent seg7", &c, REC);
    kout_free(&a), kout_free(&b);
    free_case(&c);
}

/* Prefill by chunks then continue token by token (decode, h0 == ht in place) = one recurrence over everything. */
static void test_decode_continuation(void) {
    const int64_t H = 2, dk = 8, dv = 6, T = 29, T1 = 20;
    static const int lens[] = {29};
    kcase c = make_case(1, lens, H, dk, dv, 1, -5, -0.01);
    k3c_err e = {0};
    double *o_all = calloc(nv(&c), 8), *ht_all = calloc(ns(&c), 8);
    CHECK_OK(fwd64(&c, REC, o_all, ht_all, &e), &e);
    double *o = calloc(nv(&c), 8), *S = dupd(c.h0, ns(&c));
    k3c_kda_dims d1 = c.d;
    d1.T = T1, d1.n_docs = 1, d1.chunk = 16, d1.gate_lower_bound = -5;
    void *ws = k3c_aligned_alloc(k3c_kda_chunk_fwd_workspace_f64(&d1));
    CHECK_OK(k3c_kda_chunk_fwd_f64(&d1, NULL, c.q, c.k, c.v, c.g, c.beta, S, o, S, ws, &e), &e);
    k3c_aligned_free(ws);
    k3c_kda_dims d2 = c.d;
    d2.T = 1, d2.n_docs = 1;
    for (int64_t t = T1; t < T; t++) {
        const int64_t xk = t * H * dk, xv = t * H * dv;
        CHECK_OK(k3c_kda_recurrent_fwd_f64(&d2, NULL, c.q + xk, c.k + xk, c.v + xv, c.g + xk, c.beta + t * H, S, o + xv,
                                           S, NULL, &e),
                 &e);
    }
    CHECK_LE(test_rel_err_d(o, o_all, nv(&c)), 1e-13, "chunk prefill + decode steps: o");
    CHECK_LE(test_rel_err_d(S, ht_all, ns(&c)), 1e-13, "chunk prefill + decode steps: state");
    free(o_all), free(ht_all), free(o), free(S);
    free_case(&c);
}

/* Context parallelism (docs/PARALLEL.md "Context parallelism"): one document cut between two ranks at a token that is
 * no chunk boundary. The first part runs from h0 and hands its final state on; the second starts from it; backward, the
 * second part's dh0 is the first part's dht. Outputs, final state and every gradient equal the unsplit chunked KDA's
 * (float64, 1e-12), and the second part's state gradient (the path a rank sends back) passes the FD check. */
static void test_context_split(void) {
    static const int lens[] = {45};
    const int64_t t1 = 21, H = 2, dk = 8, dv = 6;
    kcase c = make_case(1, lens, H, dk, dv, 1, -6, -0.01);
    k3c_err e = {0};
    kout w;
    CHECK_OK(run64(&c, CHUNK, &w, &e), &e);
    kcase part[2];
    for (int i = 0; i < 2; i++) { /* views into c: tokens [0, t1) and [t1, T) */
        int64_t t0 = i ? t1 : 0;
        part[i] = c;
        part[i].use_cu = 0;
        part[i].d.T = i ? c.d.T - t1 : t1;
        part[i].q = c.q + t0 * H * dk, part[i].k = c.k + t0 * H * dk, part[i].g = c.g + t0 * H * dk;
        part[i].v = c.v + t0 * H * dv, part[i].dout = c.dout + t0 * H * dv, part[i].beta = c.beta + t0 * H;
    }
    kout a, b;
    double *hand = calloc(ns(&c), 8), *o0 = calloc(nv(&part[0]), 8); /* the state the first rank sends */
    CHECK_OK(fwd64(&part[0], CHUNK, o0, hand, &e), &e);
    part[1].h0 = hand;
    CHECK_OK(run64(&part[1], CHUNK, &b, &e), &e);
    part[0].dht = b.dh0; /* the state gradient the second rank sends back */
    CHECK_OK(run64(&part[0], CHUNK, &a, &e), &e);
    double worst = 0;
    const double *whole[] = {w.o, w.dq, w.dk, w.dv, w.dg, w.dbeta};
    const double *pa[] = {a.o, a.dq, a.dk, a.dv, a.dg, a.dbeta}, *pb[] = {b.o, b.dq, b.dk, b.dv, b.dg, b.dbeta};
    const int64_t width[] = {H * dv, H * dk, H * dk, H * dv, H * dk, H};
    for (int i = 0; i < 6; i++) {
        worst = fmax(worst, test_rel_err_d(pa[i], whole[i], (size_t)(t1 * width[i])));
        worst = fmax(worst, test_rel_err_d(pb[i], whole[i] + t1 * width[i], (size_t)((c.d.T - t1) * width[i])));
    }
    worst = fmax(worst, test_rel_err_d(b.ht, w.ht, ns(&c)));
    worst = fmax(worst, test_rel_err_d(a.dh0, w.dh0, ns(&c)));
    CHECK_LE(worst, 1e-12, "KDA split at token 21 of 45 (state handed on) vs unsplit: o, ht and every gradient");
    fd_case("second part from the handed state", &part[1], CHUNK);
    kout_free(&a), kout_free(&b), kout_free(&w);
    free(hand), free(o0);
    free_case(&c);
}

static void test_arg_checks(void) {
    static const int lens[] = {20};
    kcase c = make_case(1, lens, 1, 4, 3, 0, -6, -5.5);
    k3c_err e = {0};
    double *o = calloc(nv(&c), 8), *ht = calloc(ns(&c), 8);
    c.d.gate_lower_bound = -5;
    CHECK(fwd64(&c, CHUNK, o, ht, &e) == K3C_EINVAL && strstr(e.msg, "below gate_lower_bound"),
          "a gate below the declared bound is refused: %s", e.msg);
    c.d.gate_lower_bound = -7;
    CHECK(fwd64(&c, CHUNK, o, ht, &e) == K3C_EINVAL, "bound -7 is refused");
    c.d.gate_lower_bound = 0;
    c.d.chunk = 24;
    CHECK(fwd64(&c, CHUNK, o, ht, &e) == K3C_EINVAL, "chunk 24 is refused");
    c.d.chunk = 16;
    c.cu[1] = 19;
    CHECK(fwd64(&c, REC, o, ht, &e) == K3C_EINVAL && strstr(e.msg, "cu_seqlens"), "bad cu_seqlens: %s", e.msg);
    c.cu[1] = 20;
    CHECK(k3c_kda_recurrent_fwd_f64(&c.d, c.cu, c.q, c.k, c.v, c.g, c.beta, NULL, o, NULL, NULL, &e) == K3C_EINVAL,
          "no ht and no workspace is refused");
    free(o), free(ht);
    free_case(&c);
    /* an empty batch: the state passes through, dh0 = dht */
    static const int none[] = {0};
    kcase z = make_case(1, none, 2, 4, 3, 1, -1, -0.1);
    for (int impl = REC; impl <= CHUNK; impl++) {
        kout r;
        CHECK_OK(run64(&z, impl, &r, &e), &e);
        CHECK(test_rel_err_d(r.ht, z.h0, ns(&z)) == 0 && test_rel_err_d(r.dh0, z.dht, ns(&z)) < 1e-15,
              "T = 0 (%s): ht = h0 and dh0 = dht (up to the PREFILL round trip)", impl == REC ? "recurrent" : "chunk");
        kout_free(&r);
    }
    free_case(&z);
}

/* ---------------------------------------------------------------- gate and L2 norm */
typedef struct {
    k3c_kda_gate_dims d;
    double *z, *dtb, *alog, *w, *g;
} gate_ctx;

static double gate_loss(void *ctx) {
    gate_ctx *c = ctx;
    k3c_err e = {0};
    k3c_kda_gate_fwd_f64(&c->d, c->z, c->dtb, c->alog, c->g, &e);
    double s = 0;
    for (int64_t i = 0; i < c->d.T * c->d.H * c->d.dk; i++) s += c->g[i] * c->w[i];
    return s;
}

static void test_gate(void) {
    const int64_t T = 9, H = 3, dk = 5, P = H * dk;
    for (int form = 0; form < 2; form++) {
        gate_ctx c = {{T, H, dk, form, form ? -5 : 0},
                      randn(T * P, 2.0),
                      randn(P, 1.0),
                      unif(H, -1, 2.7),
                      randn(T * P, 1.0),
                      calloc(T * P, 8)};
        k3c_err e = {0};
        double *dz = calloc(T * P, 8), *ddt = calloc(P, 8), *dal = calloc(H, 8);
        for (int64_t i = 0; i < T * P; i++) dz[i] = PREFILL;
        CHECK_OK(k3c_kda_gate_bwd_f64(&c.d, c.z, c.dtb, c.alog, c.w, dz, ddt, dal, &e), &e);
        for (int64_t i = 0; i < T * P; i++) dz[i] -= PREFILL;
        gate_loss(&c);
        double gmin = 0, gmax = -1e300;
        for (int64_t i = 0; i < T * P; i++) gmin = fmin(gmin, c.g[i]), gmax = fmax(gmax, c.g[i]);
        CHECK(gmax < 0 && (form == 0 || gmin >= -5), "gate range [%g, %g]", gmin, gmax);
        char what[64];
        double err =
            fmax(fmax(test_fd_rel_err(gate_loss, &c, c.z, T * P, dz), test_fd_rel_err(gate_loss, &c, c.dtb, P, ddt)),
                 test_fd_rel_err(gate_loss, &c, c.alog, H, dal));
        snprintf(what, sizeof what, "FD gate %s (z, dt_bias, A_log)", form ? "lower-bound" : "softplus");
        CHECK_LE(err, FD_TOL, what);
        /* A_log absent (fla >= PR #1107): a = 1 */
        double *g1 = calloc(T * P, 8), *zero = calloc(H, 8);
        CHECK_OK(k3c_kda_gate_fwd_f64(&c.d, c.z, c.dtb, NULL, g1, &e), &e);
        CHECK_OK(k3c_kda_gate_fwd_f64(&c.d, c.z, c.dtb, zero, c.g, &e), &e);
        CHECK(test_rel_err_d(g1, c.g, T * P) == 0, "A_log NULL equals A_log = 0");
        /* float32 */
        float *zf = to_f32(c.z, T * P), *bf = to_f32(c.dtb, P), *af = to_f32(c.alog, H), *gf = calloc(T * P, 4);
        CHECK_OK(k3c_kda_gate_fwd_f32(&c.d, zf, bf, af, gf, &e), &e);
        gate_loss(&c);
        snprintf(what, sizeof what, "gate %s f32 vs f64", form ? "lower-bound" : "softplus");
        CHECK_LE(rel_f32(gf, c.g, T * P), F32_TOL, what);
        free(zf), free(bf), free(af), free(gf), free(g1), free(zero);
        free(dz), free(ddt), free(dal), free(c.z), free(c.dtb), free(c.alog), free(c.w), free(c.g);
    }
    /* spec values: lower-bound form at u = 0 gives g_min/2; softplus at u = 0 gives −a·ln 2 */
    k3c_kda_gate_dims d = {1, 1, 1, K3C_GATE_LOWER_BOUND, 0};
    double z = 0, a = 0, g = 0;
    k3c_err e = {0};
    CHECK_OK(k3c_kda_gate_fwd_f64(&d, &z, NULL, &a, &g, &e), &e);
    CHECK(fabs(g + 2.5) < 1e-15, "lower-bound gate at 0 = %g (want -2.5)", g);
    d.form = K3C_GATE_SOFTPLUS;
    a = log(3.0);
    CHECK_OK(k3c_kda_gate_fwd_f64(&d, &z, NULL, &a, &g, &e), &e);
    CHECK(fabs(g + 3 * log(2.0)) < 1e-14, "softplus gate at 0 = %g (want -3 ln 2)", g);
}

typedef struct {
    k3c_l2norm_dims d;
    double *x, *w, *y;
} l2_ctx;
static double l2_loss(l2_ctx *c) {
    k3c_err e = {0};
    k3c_l2norm_fwd_f64(&c->d, c->x, c->y, NULL, &e);
    double s = 0;
    for (int64_t i = 0; i < c->d.rows * c->d.dim; i++) s += c->y[i] * c->w[i];
    return s;
}

static void test_l2norm(void) {
    const int64_t rows = 7, dim = 16, n = rows * dim;
    l2_ctx c = {{rows, dim, 0}, randn(n, 1.0), randn(n, 1.0), calloc(n, 8)};
    c.x[3] = c.x[4] = 0; /* rows near zero keep the eps term honest */
    for (int64_t i = 0; i < dim; i++) c.x[5 * dim + i] *= 1e-3;
    double *rstd = calloc(rows, 8), *dx = calloc(n, 8), *y = calloc(n, 8);
    k3c_err e = {0};
    CHECK_OK(k3c_l2norm_fwd_f64(&c.d, c.x, y, rstd, &e), &e);
    for (int64_t i = 0; i < n; i++) dx[i] = PREFILL;
    CHECK_OK(k3c_l2norm_bwd_f64(&c.d, y, rstd, c.w, dx, &e), &e);
    for (int64_t i = 0; i < n; i++) dx[i] -= PREFILL;
    double *fd = calloc(n, 8);
    for (int64_t i = 0; i < n; i++) {
        double x0 = c.x[i], h = 1e-6 * fmax(1.0, fabs(x0));
        c.x[i] = x0 + h;
        double lp = l2_loss(&c);
        c.x[i] = x0 - h;
        double lm = l2_loss(&c);
        c.x[i] = x0;
        fd[i] = (lp - lm) / (2 * h);
    }
    CHECK_LE(test_rel_err_d(dx, fd, n), FD_TOL, "FD l2norm");
    double ss = 0;
    for (int64_t i = 0; i < dim; i++) ss += y[i] * y[i];
    CHECK(fabs(ss - 1) < 1e-5, "row 0 has unit norm (%g)", ss);
    float *xf = to_f32(c.x, n), *yf = calloc(n, 4);
    CHECK_OK(k3c_l2norm_fwd_f32(&c.d, xf, yf, NULL, &e), &e);
    CHECK_LE(rel_f32(yf, y, n), F32_TOL, "l2norm f32 vs f64");
    free(xf), free(yf), free(fd), free(rstd), free(dx), free(y), free(c.x), free(c.w), free(c.y);
}

/* ---------------------------------------------------------------- CLI */
static void test_cli(void) {
    const char *bin = test_k3c_bin(), *gold_path = test_shared("golden/kda_fp64_small.safetensors");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s check-kda %s > /dev/null 2>&1", bin, gold_path);
    CHECK(system(cmd) == 0, "`%s` exits 0", cmd);
    snprintf(cmd, sizeof cmd, "%s check-kda %s --chunk 16 > /dev/null 2>&1", bin, gold_path);
    CHECK(system(cmd) == 0, "`%s` exits 0", cmd);
    snprintf(cmd, sizeof cmd, "%s check-kda --help > /dev/null 2>&1", bin);
    CHECK(system(cmd) == 0, "check-kda --help exits 0");
    /* A copy with one output perturbed by 1e-4 relative must fail. */
    k3c_safetensors *st = NULL;
    k3c_err e = {0};
    if (k3c_st_open(gold_path, &st, &e) != 0) {
        CHECK(0, "%s", e.msg);
        return;
    }
    int n = k3c_st_count(st);
    k3c_st_entry *ents = calloc((size_t)n, sizeof *ents);
    double *dg = NULL;
    for (int i = 0; i < n; i++) {
        const k3c_st_tensor *t = k3c_st_at(st, i);
        ents[i] = (k3c_st_entry){t->name, t->dtype, t->ndim, {0}, t->data};
        memcpy(ents[i].shape, t->shape, sizeof t->shape);
        if (strcmp(t->name, "dg") == 0 && t->dtype == K3C_F64) {
            size_t m = t->nbytes / 8;
            dg = malloc(t->nbytes);
            memcpy(dg, t->data, t->nbytes);
            for (size_t j = 0; j < m; j += 2) dg[j] *= 1 + 2e-4;
            ents[i].data = dg;
        }
    }
    char bad[4200];
    snprintf(bad, sizeof bad, "%s/bad.safetensors", test_tmpdir("kda_cli"));
    CHECK_OK(k3c_st_write(bad, ents, n, NULL, &e), &e);
    snprintf(cmd, sizeof cmd, "%s check-kda %s > /dev/null 2>&1", bin, bad);
    CHECK(dg && system(cmd) != 0, "check-kda on a perturbed dg exits non-zero");
    free(dg), free(ents);
    k3c_st_close(st);
}

/* k3c_kda_golden_check (the library behind check-kda): every implementation runs on the golden (its gates are above
 * the factored bound) within 1e-5 of every reference; --chunk 16 runs the two 16-row ones; a missing file errors. */
static void test_golden_check_lib(void) {
    const char *path = test_shared("golden/kda_fp64_small.safetensors");
    k3c_kda_check c;
    k3c_err err = {0};
    CHECK_OK(k3c_kda_golden_check(path, -1, &c, &err), &err);
    CHECK(c.dims.n_docs == 2 && c.dims.T == 74 && c.g_min < 0 && c.g_min >= -5, "dims B %d T %lld, g_min %g",
          c.dims.n_docs, (long long)c.dims.T, c.g_min);
    for (int r = 0; r < K3C_KDA_CHECK_RUNS; r++) {
        CHECK(c.run[r].ran && c.run[r].status == 0, "%s did not run: %s", c.run[r].name, c.run[r].why.msg);
        for (int i = 0; i < K3C_KDA_CHECK_TENSORS; i++)
            CHECK(c.run[r].rel[i] >= 0 && c.run[r].rel[i] <= 1e-5, "%s %s: %g", c.run[r].name, k3c_kda_check_tensor[i],
                  c.run[r].rel[i]);
    }
    CHECK_OK(k3c_kda_golden_check(path, 16, &c, &err), &err);
    int ran = 0;
    for (int r = 0; r < K3C_KDA_CHECK_RUNS; r++) ran += c.run[r].ran ? 1 << r : 0;
    CHECK(ran == (1 << 1 | 1 << 3), "--chunk 16 ran %#x", ran);
    CHECK(k3c_kda_golden_check("build/no/such.safetensors", -1, &c, &err) == K3C_ENOTFOUND && strstr(err.msg, "such"),
          "missing file: %s", err.msg);
}

int main(void) {
    test_golden();
    test_core_cases();
    test_recurrent_segments();
    test_decode_continuation();
    test_context_split();
    test_arg_checks();
    test_gate();
    test_l2norm();
    test_cli();
    test_golden_check_lib();
    return test_summary();
}
