/* test_attention.c — causal document-masked attention (MLA, spec §4.2): flash forward/backward vs the materialised
 * reference and a brute-force oracle, float64 finite differences, float32 agreement, isolation, determinism, errors. */
#include "test.h"

#include "ops/attention.h"

#include <omp.h>

#define F64_TOL 1e-12 /* flash vs naive in float64 */
#define F32_TOL 1e-5  /* float32 vs float64 on the same inputs */
#define FD_TOL 1e-6
#define PREFILL 0.25

static uint64_t seed_ = 100;

static double *randn(size_t n, double sd) { return test_randn(seed_++, n, sd); }
static double *filled(size_t n, double v) { return test_filled(n, v); }
static float *to_f32(const double *x, size_t n) { return test_to_f32(x, n); }
static double rel_f32(const float *x, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - ref[i];
        num += d * d, den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
static void unfill(double *g, size_t n) {
    for (size_t i = 0; i < n; i++) g[i] -= PREFILL;
}
static int same_bits(const double *a, const double *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

/* One problem: packed documents of the given lengths, random q, k, v, dO. */
typedef struct {
    k3c_attention_sizes s;
    int32_t cu[16];
    double *q, *k, *v, *dout;
    size_t nq, nv, nl;
} problem;

static problem make_problem(const int *lens, int n_docs, int64_t H, int64_t dqk, int64_t dv, double qsd) {
    problem p;
    memset(&p, 0, sizeof p);
    int64_t T = 0;
    for (int d = 0; d < n_docs; d++) p.cu[d] = (int32_t)T, T += lens[d];
    p.cu[n_docs] = (int32_t)T;
    p.s = (k3c_attention_sizes){T, H, dqk, dv, n_docs, 1.0 / sqrt((double)dqk), 0, 0, 0};
    p.nq = (size_t)(T * H * dqk), p.nv = (size_t)(T * H * dv), p.nl = (size_t)(T * H);
    p.q = randn(p.nq, qsd), p.k = randn(p.nq, 1), p.v = randn(p.nv, 1), p.dout = randn(p.nv, 1);
    return p;
}
static void free_problem(problem *p) { free(p->q), free(p->k), free(p->v), free(p->dout); }

typedef struct {
    double *o, *lse, *dq, *dk, *dv;
} result;

static void free_result(result *r) { free(r->o), free(r->lse), free(r->dq), free(r->dk), free(r->dv); }

/* Runs forward + backward (flash or naive) in float64; gradients start at PREFILL and are un-prefilled after. */
static result run_f64(const problem *p, const k3c_attention_sizes *s, const int32_t *cu, int naive) {
    k3c_err err = {0};
    result r = {filled(p->nv, 0), filled(p->nl, 0), filled(p->nq, PREFILL), filled(p->nq, PREFILL),
                filled(p->nv, PREFILL)};
    size_t wsb = naive ? k3c_attention_naive_workspace_f64(s) : k3c_attention_workspace_f64(s);
    void *ws = malloc(wsb ? wsb : 1);
    if (naive) {
        CHECK_OK(k3c_attention_naive_fwd_f64(s, cu, p->q, p->k, p->v, r.o, r.lse, ws, &err), &err);
        CHECK_OK(k3c_attention_naive_bwd_f64(s, cu, p->q, p->k, p->v, r.o, r.lse, p->dout, r.dq, r.dk, r.dv, ws, &err),
                 &err);
    } else {
        CHECK_OK(k3c_attention_fwd_f64(s, cu, p->q, p->k, p->v, r.o, r.lse, NULL, &err), &err);
        CHECK_OK(k3c_attention_bwd_f64(s, cu, p->q, p->k, p->v, r.o, r.lse, p->dout, r.dq, r.dk, r.dv, ws, &err), &err);
    }
    unfill(r.dq, p->nq), unfill(r.dk, p->nq), unfill(r.dv, p->nv);
    free(ws);
    return r;
}

/* Brute-force oracle for o and lse: document ids from the lengths, a full score row per query, no blocking. */
static void oracle_fwd(const problem *p, double *o, double *lse) {
    const int64_t T = p->s.T, H = p->s.H, dqk = p->s.dqk, dv = p->s.dv;
    int *doc = malloc(sizeof(int) * (size_t)T);
    for (int d = 0; d < p->s.n_docs; d++)
        for (int t = p->cu[d]; t < p->cu[d + 1]; t++) doc[t] = d;
    double *sc = malloc(sizeof(double) * (size_t)T);
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < T; i++) {
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j <= i; j++) {
                if (doc[j] != doc[i]) continue;
                double s = 0;
                for (int64_t c = 0; c < dqk; c++) s += p->q[(i * H + h) * dqk + c] * p->k[(j * H + h) * dqk + c];
                sc[j] = s * p->s.scale;
                mx = fmax(mx, sc[j]);
            }
            for (int64_t c = 0; c < dv; c++) o[(i * H + h) * dv + c] = 0;
            for (int64_t j = 0; j <= i; j++) {
                if (doc[j] != doc[i]) continue;
                double e = exp(sc[j] - mx);
                sum += e;
                for (int64_t c = 0; c < dv; c++) o[(i * H + h) * dv + c] += e * p->v[(j * H + h) * dv + c];
            }
            for (int64_t c = 0; c < dv; c++) o[(i * H + h) * dv + c] /= sum;
            lse[i * H + h] = mx + log(sum);
        }
    free(doc), free(sc);
}

static void compare(const result *a, const result *b, const problem *p, double tol, const char *what) {
    char buf[160];
    const char *names[5] = {"o", "lse", "dq", "dk", "dv"};
    const double *x[5] = {a->o, a->lse, a->dq, a->dk, a->dv}, *y[5] = {b->o, b->lse, b->dq, b->dk, b->dv};
    size_t n[5] = {p->nv, p->nl, p->nq, p->nq, p->nv};
    for (int i = 0; i < 5; i++) {
        snprintf(buf, sizeof buf, "%s: %s", what, names[i]);
        CHECK_LE(test_rel_err_d(x[i], y[i], n[i]), tol, buf);
    }
}

/* ---------------------------------------------------------------- flash vs naive vs oracle, float64 */
static void test_flash_vs_naive(void) {
    const int lens[5] = {1, 7, 64, 65, 130}; /* T = 267: documents shorter than, equal to and across block edges */
    problem p = make_problem(lens, 5, 2, 24, 16, 1.0);
    result ref = run_f64(&p, &p.s, p.cu, 1);
    double *oo = malloc(sizeof(double) * p.nv), *ol = malloc(sizeof(double) * p.nl);
    oracle_fwd(&p, oo, ol);
    CHECK_LE(test_rel_err_d(ref.o, oo, p.nv), F64_TOL, "naive vs oracle: o");
    CHECK_LE(test_rel_err_d(ref.lse, ol, p.nl), F64_TOL, "naive vs oracle: lse");
    int blocks[][2] = {{0, 0}, {48, 80}, {13, 7}, {1, 1}, {256, 256}, {64, 5}};
    for (int b = 0; b < 6; b++) {
        k3c_attention_sizes s = p.s;
        s.block_q = blocks[b][0], s.block_k = blocks[b][1];
        result r = run_f64(&p, &s, p.cu, 0);
        char what[64];
        snprintf(what, sizeof what, "flash(%d,%d) vs naive f64", s.block_q, s.block_k);
        compare(&r, &ref, &p, F64_TOL, what);
        if (b == 0) CHECK_LE(test_rel_err_d(r.o, oo, p.nv), F64_TOL, "flash vs oracle: o");
        free_result(&r);
    }
    free_result(&ref), free(oo), free(ol), free_problem(&p);

    /* MLA head dims (dqk = nope + rope = 128 + 64, dv = 128) and peaked scores (q × 6) */
    const int lens2[3] = {33, 1, 50};
    problem m = make_problem(lens2, 3, 2, 192, 128, 6.0);
    result a = run_f64(&m, &m.s, m.cu, 0), b = run_f64(&m, &m.s, m.cu, 1);
    compare(&a, &b, &m, F64_TOL, "MLA dims 192/128, peaked: flash vs naive");
    free_result(&a), free_result(&b), free_problem(&m);

    /* very large scores (q × 200): the online max keeps everything finite */
    const int lens3[2] = {40, 29};
    problem l = make_problem(lens3, 2, 1, 16, 8, 200.0);
    result fa = run_f64(&l, &l.s, l.cu, 0), na = run_f64(&l, &l.s, l.cu, 1);
    int fin = 1;
    for (size_t i = 0; i < l.nv; i++) fin &= isfinite(fa.o[i]) && isfinite(fa.dv[i]);
    CHECK(fin, "large scores: flash outputs finite");
    compare(&fa, &na, &l, F64_TOL, "large scores: flash vs naive");
    free_result(&fa), free_result(&na), free_problem(&l);
}

/* ---------------------------------------------------------------- finite differences */
typedef struct {
    const problem *p;
    double *o, *lse;
} fd_ctx;

static double fd_loss(void *ctx) {
    fd_ctx *c = ctx;
    k3c_attention_fwd_f64(&c->p->s, c->p->cu, c->p->q, c->p->k, c->p->v, c->o, c->lse, NULL, NULL);
    double L = 0;
    for (size_t i = 0; i < c->p->nv; i++) L += c->p->dout[i] * c->o[i];
    return L;
}

static void test_fd(void) {
    const int lens[3] = {1, 3, 5};
    problem p = make_problem(lens, 3, 2, 5, 3, 1.5);
    p.s.scale = 0.4, p.s.block_q = 2, p.s.block_k = 3;
    result r = run_f64(&p, &p.s, p.cu, 0);
    fd_ctx c = {&p, filled(p.nv, 0), filled(p.nl, 0)};
    CHECK_LE(test_fd_rel_err(fd_loss, &c, p.q, p.nq, r.dq), FD_TOL, "attention FD dq");
    CHECK_LE(test_fd_rel_err(fd_loss, &c, p.k, p.nq, r.dk), FD_TOL, "attention FD dk");
    CHECK_LE(test_fd_rel_err(fd_loss, &c, p.v, p.nv, r.dv), FD_TOL, "attention FD dv");
    free(c.o), free(c.lse), free_result(&r), free_problem(&p);
}

/* ---------------------------------------------------------------- float32 */
static void test_f32(void) {
    k3c_err err = {0};
    const int lens[5] = {1, 7, 64, 65, 130};
    problem p = make_problem(lens, 5, 2, 24, 16, 1.0);
    p.s.block_q = 48, p.s.block_k = 80;
    float *qf = to_f32(p.q, p.nq), *kf = to_f32(p.k, p.nq), *vf = to_f32(p.v, p.nv), *df = to_f32(p.dout, p.nv);
    for (size_t i = 0; i < p.nq; i++) p.q[i] = qf[i], p.k[i] = kf[i]; /* same rounded inputs for float64 */
    for (size_t i = 0; i < p.nv; i++) p.v[i] = vf[i], p.dout[i] = df[i];
    result ref = run_f64(&p, &p.s, p.cu, 1);
    float *o = calloc(p.nv, 4), *lse = calloc(p.nl, 4), *dq = calloc(p.nq, 4), *dk = calloc(p.nq, 4),
          *dv = calloc(p.nv, 4);
    void *ws = malloc(k3c_attention_naive_workspace_f32(&p.s));
    for (int naive = 0; naive < 2; naive++) {
        memset(dq, 0, p.nq * 4), memset(dk, 0, p.nq * 4), memset(dv, 0, p.nv * 4);
        if (naive) {
            CHECK_OK(k3c_attention_naive_fwd_f32(&p.s, p.cu, qf, kf, vf, o, lse, ws, &err), &err);
            CHECK_OK(k3c_attention_naive_bwd_f32(&p.s, p.cu, qf, kf, vf, o, lse, df, dq, dk, dv, ws, &err), &err);
        } else {
            CHECK_OK(k3c_attention_fwd_f32(&p.s, p.cu, qf, kf, vf, o, lse, NULL, &err), &err);
            CHECK_OK(k3c_attention_bwd_f32(&p.s, p.cu, qf, kf, vf, o, lse, df, dq, dk, dv, ws, &err), &err);
        }
        const char *tag = naive ? "naive f32 vs f64" : "flash f32 vs f64";
        const char *names[5] = {"o", "lse", "dq", "dk", "dv"};
        const float *got[5] = {o, lse, dq, dk, dv};
        const double *want[5] = {ref.o, ref.lse, ref.dq, ref.dk, ref.dv};
        size_t n[5] = {p.nv, p.nl, p.nq, p.nq, p.nv};
        for (int i = 0; i < 5; i++) {
            char w[64];
            snprintf(w, sizeof w, "%s: %s", tag, names[i]);
            CHECK_LE(rel_f32(got[i], want[i], n[i]), F32_TOL, w);
        }
    }
    free(qf), free(kf), free(vf), free(df), free(o), free(lse), free(dq), free(dk), free(dv), free(ws);
    free_result(&ref), free_problem(&p);
}

/* ---------------------------------------------------------------- masks, NULLs, determinism, errors */
static void test_structure(void) {
    k3c_err err = {0};
    const int lens[4] = {5, 17, 1, 9};
    problem p = make_problem(lens, 4, 3, 8, 4, 1.0);
    p.s.block_q = 4, p.s.block_k = 6;
    result all = run_f64(&p, &p.s, p.cu, 0);

    /* each document alone (cu_seqlens NULL) gives the packed result: nothing leaks across a boundary */
    double maxd = 0;
    for (int d = 0; d < 4; d++) {
        const int64_t t0 = p.cu[d], H = p.s.H, dqk = p.s.dqk, dvn = p.s.dv;
        problem one = p;
        one.s.T = lens[d], one.s.n_docs = 0;
        one.q = p.q + t0 * H * dqk, one.k = p.k + t0 * H * dqk;
        one.v = p.v + t0 * H * dvn, one.dout = p.dout + t0 * H * dvn;
        one.nq = (size_t)(lens[d] * H * dqk), one.nv = (size_t)(lens[d] * H * dvn), one.nl = (size_t)(lens[d] * H);
        result r = run_f64(&one, &one.s, NULL, 0);
        for (size_t i = 0; i < one.nv; i++) maxd = fmax(maxd, fabs(r.o[i] - all.o[t0 * H * dvn + i]));
        for (size_t i = 0; i < one.nv; i++) maxd = fmax(maxd, fabs(r.dv[i] - all.dv[t0 * H * dvn + i]));
        for (size_t i = 0; i < one.nq; i++) maxd = fmax(maxd, fabs(r.dk[i] - all.dk[t0 * H * dqk + i]));
        for (size_t i = 0; i < one.nq; i++) maxd = fmax(maxd, fabs(r.dq[i] - all.dq[t0 * H * dqk + i]));
        free_result(&r);
    }
    CHECK_LE(maxd, 1e-14, "packed vs per-document runs (max abs diff of o, dq, dk, dv)");

    /* empty documents in cu_seqlens change nothing (bitwise) */
    problem e = p;
    int32_t cu_e[8] = {0, 0, 5, 22, 22, 23, 32, 32};
    e.s.n_docs = 7;
    result re = run_f64(&e, &e.s, cu_e, 0);
    CHECK(same_bits(re.o, all.o, p.nv) && same_bits(re.dq, all.dq, p.nq) && same_bits(re.dk, all.dk, p.nq),
          "empty documents are harmless");
    free_result(&re);

    /* NULL cu_seqlens == {0, T} (bitwise) */
    problem w = p;
    int32_t cu1[2] = {0, (int32_t)p.s.T};
    w.s.n_docs = 1;
    result r1 = run_f64(&w, &w.s, cu1, 0), r0 = run_f64(&w, &w.s, NULL, 0);
    CHECK(same_bits(r1.o, r0.o, p.nv) && same_bits(r1.dk, r0.dk, p.nq), "NULL cu_seqlens is one document");
    free_result(&r1), free_result(&r0);

    /* one thread vs two: bitwise identical (no reductions across threads) */
    int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    result t1 = run_f64(&p, &p.s, p.cu, 0);
    omp_set_num_threads(2);
    result t2 = run_f64(&p, &p.s, p.cu, 0);
    omp_set_num_threads(nt);
    CHECK(same_bits(t1.o, t2.o, p.nv) && same_bits(t1.lse, t2.lse, p.nl) && same_bits(t1.dq, t2.dq, p.nq) &&
              same_bits(t1.dk, t2.dk, p.nq) && same_bits(t1.dv, t2.dv, p.nv),
          "1 and 2 threads give identical bits");
    free_result(&t1), free_result(&t2);

    /* NULL gradients: each one alone matches the full backward */
    void *ws = malloc(k3c_attention_workspace_f64(&p.s));
    double *g = filled(p.nq, 0);
    CHECK_OK(k3c_attention_bwd_f64(&p.s, p.cu, p.q, p.k, p.v, all.o, all.lse, p.dout, g, NULL, NULL, ws, &err), &err);
    CHECK(test_rel_err_d(g, all.dq, p.nq) <= 1e-15, "dq alone");
    memset(g, 0, p.nq * sizeof *g);
    CHECK_OK(k3c_attention_bwd_f64(&p.s, p.cu, p.q, p.k, p.v, all.o, all.lse, p.dout, NULL, g, NULL, ws, &err), &err);
    CHECK(test_rel_err_d(g, all.dk, p.nq) <= 1e-15, "dk alone");
    double *gv = filled(p.nv, 0);
    CHECK_OK(k3c_attention_bwd_f64(&p.s, p.cu, p.q, p.k, p.v, all.o, all.lse, p.dout, NULL, NULL, gv, ws, &err), &err);
    CHECK(test_rel_err_d(gv, all.dv, p.nv) <= 1e-15, "dv alone");
    CHECK(k3c_attention_workspace_f64(&p.s) == (size_t)(p.s.T * p.s.H) * 8 &&
              k3c_attention_workspace_f32(&p.s) == (size_t)(p.s.T * p.s.H) * 4,
          "backward workspace is T·H reals");

    /* errors */
    double *o = filled(p.nv, 0), *lse = filled(p.nl, 0);
    int32_t bad_end[5] = {0, 5, 22, 23, 31};
    CHECK(k3c_attention_fwd_f64(&p.s, bad_end, p.q, p.k, p.v, o, lse, NULL, &err) == K3C_EINVAL,
          "cu_seqlens not ending at T rejected");
    int32_t bad_dec[5] = {0, 6, 5, 23, 32};
    CHECK(k3c_attention_fwd_f64(&p.s, bad_dec, p.q, p.k, p.v, o, lse, NULL, &err) == K3C_EINVAL,
          "decreasing cu_seqlens rejected");
    k3c_attention_sizes big = p.s;
    big.block_k = K3C_ATTN_MAX_BLOCK + 1;
    CHECK(k3c_attention_fwd_f64(&big, p.cu, p.q, p.k, p.v, o, lse, NULL, &err) == K3C_EINVAL, "block too large");
    CHECK(k3c_attention_bwd_f64(&p.s, p.cu, p.q, p.k, p.v, o, lse, p.dout, g, NULL, NULL, NULL, &err) == K3C_EINVAL,
          "backward without workspace rejected");
    k3c_attention_sizes empty = p.s;
    empty.T = 0, empty.n_docs = 0;
    CHECK_OK(k3c_attention_fwd_f64(&empty, NULL, p.q, p.k, p.v, o, lse, NULL, &err), &err);
    free(ws), free(g), free(gv), free(o), free(lse), free_result(&all), free_problem(&p);
}

/* S_max of QK-Clip against a plain loop over the causal, document-masked pairs (documents of 0, 1 and many tokens);
 * with q_begin (context parallelism's padding rows) over the query rows from there on only. */
static void test_max_logit(void) {
    const int64_t T = 150, H = 3, d = 12;
    const int32_t cu[5] = {0, 0, 1, 90, 150};
    double *q = randn((size_t)(T * H * d), 1.0), *k = randn((size_t)(T * H * d), 1.0);
    k3c_attention_sizes s = {T, H, d, d, 4, 0.3, 0, 0, 0};
    float got[3], got32[3];
    k3c_err err = {0};
    float *q32 = to_f32(q, (size_t)(T * H * d)), *k32 = to_f32(k, (size_t)(T * H * d));
    static const int64_t begins[] = {0, 1, 95, 140};
    for (size_t b = 0; b < sizeof begins / sizeof *begins; b++) {
        s.q_begin = begins[b];
        CHECK_OK(k3c_attention_max_logit_f64(&s, cu, q, k, got, &err), &err);
        CHECK_OK(k3c_attention_max_logit_f32(&s, cu, q32, k32, got32, &err), &err);
        for (int64_t h = 0; h < H; h++) {
            double best = -INFINITY;
            for (int doc = 0; doc < 4; doc++)
                for (int64_t i = cu[doc] > s.q_begin ? cu[doc] : s.q_begin; i < cu[doc + 1]; i++)
                    for (int64_t j = cu[doc]; j <= i; j++) {
                        double dot = 0;
                        for (int64_t c = 0; c < d; c++) dot += q[(i * H + h) * d + c] * k[(j * H + h) * d + c];
                        if (0.3 * dot > best) best = 0.3 * dot;
                    }
            CHECK(fabs(got[h] - best) <= 1e-6 * fabs(best) && fabs(got32[h] - best) <= 1e-5 * fabs(best),
                  "q_begin %lld head %lld: S_max %.9g (f32 %.9g), loop %.9g", (long long)s.q_begin, (long long)h,
                  got[h], got32[h], best);
        }
    }
    s.q_begin = 0;
    q[(100 * H + 1) * d] = INFINITY; /* one channel: ±inf logits (never inf − inf), an infinite maximum is reported */
    CHECK(k3c_attention_max_logit_f64(&s, cu, q, k, got, &err) == K3C_ENUMERIC, "infinite logits not reported");
    free(q), free(k), free(q32), free(k32);
}

int main(void) {
    test_flash_vs_naive();
    test_fd();
    test_f32();
    test_structure();
    test_max_logit(); /* last: the earlier tests keep their random streams */
    return test_summary();
}
