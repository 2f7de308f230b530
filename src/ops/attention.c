/* attention.c — causal document-masked attention for gated NoPE MLA: flash-style forward (online softmax over query ×
 * key tiles), FlashAttention-2 style backward, and a materialised reference. Spec: docs/MODEL.md §4.2, §11. */
#include "base/real.h"
#include "ops/attention.h"

#include <limits.h>
#include <string.h>

/* One call's resolved sizes. cu always points at valid offsets (a two-entry {0, T} for a single document). */
typedef struct {
    int64_t T, H, dqk, dv, bq, bk, nqb, nkb, n_docs;
    real scale;
    const int32_t *cu;
} attn_plan;

/* cu_seqlens (when given): n_docs + 1 entries from 0 to T, never decreasing. */
static int check_cu(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const char *op, k3c_err *err) {
    if (!cu_seqlens) return K3C_OK;
    if (s->n_docs <= 0)
        return k3c_errf(err, K3C_EINVAL, "%s: cu_seqlens given with n_docs %lld", op, (long long)s->n_docs);
    if (cu_seqlens[0] != 0 || cu_seqlens[s->n_docs] != s->T)
        return k3c_errf(err, K3C_EINVAL, "%s: cu_seqlens must run from 0 to T = %lld (got %d .. %d)", op,
                        (long long)s->T, cu_seqlens[0], cu_seqlens[s->n_docs]);
    for (int64_t d = 0; d < s->n_docs; d++)
        if (cu_seqlens[d + 1] < cu_seqlens[d])
            return k3c_errf(err, K3C_EINVAL, "%s: cu_seqlens decreases at entry %lld", op, (long long)d + 1);
    return K3C_OK;
}

static int make_plan(const k3c_attention_sizes *s, const int32_t *cu_seqlens, int32_t one_doc[2], attn_plan *p,
                     const char *op, k3c_err *err) {
    if (!s || s->T < 0 || s->T > INT32_MAX || s->H <= 0 || s->dqk <= 0 || s->dv <= 0 || !isfinite(s->scale))
        return k3c_errf(err, K3C_EINVAL, "%s: bad sizes (T, H, dqk, dv must be positive, scale finite)", op);
    if (s->H * s->dqk > INT_MAX || s->H * s->dv > INT_MAX)
        return k3c_errf(err, K3C_EINVAL, "%s: H·dqk or H·dv exceeds INT_MAX", op);
    if (s->block_q < 0 || s->block_q > K3C_ATTN_MAX_BLOCK || s->block_k < 0 || s->block_k > K3C_ATTN_MAX_BLOCK)
        return k3c_errf(err, K3C_EINVAL, "%s: block sizes %d, %d outside [0, %d]", op, s->block_q, s->block_k,
                        K3C_ATTN_MAX_BLOCK);
    p->T = s->T, p->H = s->H, p->dqk = s->dqk, p->dv = s->dv, p->scale = (real)s->scale;
    p->bq = s->block_q ? s->block_q : K3C_ATTN_DEFAULT_BLOCK;
    p->bk = s->block_k ? s->block_k : K3C_ATTN_DEFAULT_BLOCK;
    if (s->dqk + s->dv > K3C_ATTN_SCRATCH)
        return k3c_errf(err, K3C_EUNSUPPORTED, "%s: dqk + dv = %lld exceeds %d", op, (long long)(s->dqk + s->dv),
                        K3C_ATTN_SCRATCH);
    if (p->bk * (s->dqk + s->dv) > K3C_ATTN_SCRATCH) p->bk = K3C_ATTN_SCRATCH / (s->dqk + s->dv);
    p->nqb = (p->T + p->bq - 1) / p->bq, p->nkb = (p->T + p->bk - 1) / p->bk;
    if (!cu_seqlens) {
        one_doc[0] = 0, one_doc[1] = (int32_t)s->T;
        p->cu = one_doc, p->n_docs = 1;
        return K3C_OK;
    }
    int rc = check_cu(s, cu_seqlens, op, err);
    if (rc) return rc;
    p->cu = cu_seqlens, p->n_docs = s->n_docs;
    return K3C_OK;
}

/* The document holding token i: the last d with cu[d] <= i (this skips empty documents). */
static int64_t doc_of(const attn_plan *p, int64_t i) {
    int64_t lo = 0, hi = p->n_docs - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (p->cu[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static inline real dot(const real *a, const real *b, int64_t n) {
    real s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < n; c++) s += a[c] * b[c];
    return s;
}

static inline void axpy(real a, const real *x, real *y, int64_t n) {
#pragma omp simd
    for (int64_t c = 0; c < n; c++) y[c] += a * x[c];
}

/* exp written so that `omp simd` loops vectorise it (libm's is a scalar call and dominated the profile): Cody–Waite
 * reduction x = n ln2 + r, |r| <= ln2/2, Taylor polynomial in r, 2^n built in the exponent bits. The degrees keep the
 * truncation below half an ulp (r^8/8! < 5e-9 in float, r^14/14! < 4e-18 in double). Arguments are clamped to the
 * normal range, so exp of a very negative score is a harmless ~1e-38 (float) / 1e-308 (double) instead of 0. */
#if K3C_REAL_DOUBLE
typedef uint64_t rbits;
#define EXP_LO (-708.0)
#define EXP_HI 709.0
#define EXP_SHIFT 0x1.8p52
#define EXP_MANT 52
#define EXP_BIAS 1023
#define LN2_HI 6.93147180369123816490e-01
#define LN2_LO 1.90821492927058770002e-10
/* Taylor coefficients 1/k!, Horner form, written out so the compiler vectorises it */
#define EXP_POLY(r)                                                                                                    \
    (1 +                                                                                                               \
     r * (1 + r * (1 / 2. +                                                                                            \
                   r * (1 / 6. +                                                                                       \
                        r * (1 / 24. +                                                                                 \
                             r * (1 / 120. +                                                                           \
                                  r * (1 / 720. +                                                                      \
                                       r * (1 / 5040. +                                                                \
                                            r * (1 / 40320. +                                                          \
                                                 r * (1 / 362880. +                                                    \
                                                      r * (1 / 3628800. + r * (1 / 39916800. +                         \
                                                                               r * (1 / 479001600. +                   \
                                                                                    r * (1 / 6227020800.))))))))))))))
#else
typedef uint32_t rbits;
#define EXP_LO (-87.0f)
#define EXP_HI 88.0f
#define EXP_SHIFT 0x1.8p23f
#define EXP_MANT 23
#define EXP_BIAS 127
#define LN2_HI 0.693359375f
#define LN2_LO (-2.12194440e-4f)
#define EXP_POLY(r)                                                                                                    \
    (1 + r * (1 + r * (0.5f + r * (1 / 6.f + r * (1 / 24.f + r * (1 / 120.f + r * (1 / 720.f + r * (1 / 5040.f))))))))
#endif

/* Requires EXP_LO <= x <= EXP_HI (see shift_clamp: clamping here would keep gcc from vectorising the caller). */
static inline real vexp(real x) {
    const real shift = (real)EXP_SHIFT;
    real t = x * (real)1.4426950408889634 + shift, n = t - shift; /* n = round(x / ln2), exactly */
    real r = x - n * (real)LN2_HI - n * (real)LN2_LO, f;
    rbits ti, si;
    memcpy(&ti, &t, sizeof t), memcpy(&si, &shift, sizeof si);
    ti = (ti - si + EXP_BIAS) << EXP_MANT; /* the integer n sits in the low mantissa bits of t */
    memcpy(&f, &ti, sizeof f);
    return EXP_POLY(r) * f;
}

/* s[jj] = clamp(s[jj] − sub, EXP_LO, EXP_HI) for jj in [a, b]: the argument of vexp. */
static inline void shift_clamp(real *s, int64_t a, int64_t b, real sub) {
#pragma omp simd
    for (int64_t jj = a; jj <= b; jj++) {
        real x = s[jj] - sub;
        x = x < (real)EXP_LO ? (real)EXP_LO : x;
        s[jj] = x > (real)EXP_HI ? (real)EXP_HI : x;
    }
}

/* out[jj] = alpha · Σ_c x[c] · yT[c·nk + jj] for jj in [a, b]: one row against a transposed tile, vectorised over keys.
 * Four c at a time, so that out[] is loaded and stored a quarter as often (gcc does not vectorise the outer loop). */
static inline void row_times_tile(const real *x, const real *yT, int64_t dim, int64_t nk, int64_t a, int64_t b,
                                  real alpha, real *out) {
    for (int64_t jj = a; jj <= b; jj++) out[jj] = 0;
    int64_t c = 0;
    for (; c + 4 <= dim; c += 4) {
        const real x0 = alpha * x[c], x1 = alpha * x[c + 1], x2 = alpha * x[c + 2], x3 = alpha * x[c + 3];
        const real *y0 = yT + c * nk, *y1 = y0 + nk, *y2 = y1 + nk, *y3 = y2 + nk;
#pragma omp simd
        for (int64_t jj = a; jj <= b; jj++) out[jj] += x0 * y0[jj] + x1 * y1[jj] + x2 * y2[jj] + x3 * y3[jj];
    }
    for (; c < dim; c++) {
        const real xc = alpha * x[c], *yc = yT + c * nk;
#pragma omp simd
        for (int64_t jj = a; jj <= b; jj++) out[jj] += xc * yc[jj];
    }
}

/* y[c] = beta · y[c] + Σ_jj w[jj] · rows[jj·ld + c] for jj in [a, b]: a weighted sum of tile rows (o += P v,
 * dq += dS k), vectorised over c, four rows at a time. */
static inline void tile_rows_sum(const real *w, const real *rows, int64_t ld, int64_t dim, int64_t a, int64_t b,
                                 real beta, real *y) {
    if (beta != 1)
        for (int64_t c = 0; c < dim; c++) y[c] *= beta;
    int64_t jj = a;
    for (; jj + 4 <= b + 1; jj += 4) {
        const real w0 = w[jj], w1 = w[jj + 1], w2 = w[jj + 2], w3 = w[jj + 3];
        const real *r0 = rows + jj * ld, *r1 = r0 + ld, *r2 = r1 + ld, *r3 = r2 + ld;
#pragma omp simd
        for (int64_t c = 0; c < dim; c++) y[c] += w0 * r0[c] + w1 * r1[c] + w2 * r2[c] + w3 * r3[c];
    }
    for (; jj <= b; jj++) axpy(w[jj], rows + jj * ld, y, dim);
}

/* xT[c·nk + jj] = x[(j0 + jj)·ld + c]: a key (or value) tile of one head, transposed. */
static void load_tile_T(const real *x, int64_t ld, int64_t dim, int64_t j0, int64_t nk, real *xT) {
    for (int64_t jj = 0; jj < nk; jj++)
        for (int64_t c = 0; c < dim; c++) xT[c * nk + jj] = x[(j0 + jj) * ld + c];
}

/* First key each row of query block [i0, i1) may see (its document start); returns that of row i0, the smallest. */
static int64_t row_starts(const attn_plan *p, int64_t i0, int64_t i1, int64_t *start) {
    int64_t d = doc_of(p, i0), first = p->cu[d];
    for (int64_t i = i0; i < i1; i++) {
        while (p->cu[d + 1] <= i) d++;
        start[i - i0] = p->cu[d];
    }
    return first;
}

/* ---------------------------------------------------------------- flash forward */

/* One (head, query block): the output rows accumulate in o itself (they belong to this block alone) with the running
 * max m and denominator l; key tiles run from the first row's document start to the last row. */
static void fwd_block(const attn_plan *p, int64_t h, int64_t qb, const real *q, const real *k, const real *v, real *o,
                      real *lse) {
    const int64_t H = p->H, dqk = p->dqk, dv = p->dv, i0 = qb * p->bq, i1 = min64(i0 + p->bq, p->T);
    int64_t start[K3C_ATTN_MAX_BLOCK];
    real m[K3C_ATTN_MAX_BLOCK], sc[K3C_ATTN_MAX_BLOCK], kT[K3C_ATTN_SCRATCH];
    double l[K3C_ATTN_MAX_BLOCK];
    const int64_t first = row_starts(p, i0, i1, start);
    for (int64_t i = i0; i < i1; i++) {
        m[i - i0] = -INFINITY, l[i - i0] = 0;
        memset(o + (i * H + h) * dv, 0, (size_t)dv * sizeof(real));
    }
    for (int64_t kb = first / p->bk; kb <= (i1 - 1) / p->bk; kb++) {
        const int64_t j0 = kb * p->bk, nk = min64(p->bk, p->T - j0);
        load_tile_T(k + h * dqk, H * dqk, dqk, j0, nk, kT);
        for (int64_t i = i0; i < i1; i++) {
            const int64_t r = i - i0, a = max64(start[r], j0) - j0, b = min64(i - j0, nk - 1);
            if (a > b) continue;
            real *oi = o + (i * H + h) * dv, mx = m[r];
            row_times_tile(q + (i * H + h) * dqk, kT, dqk, nk, a, b, p->scale, sc);
            for (int64_t jj = a; jj <= b; jj++) mx = sc[jj] > mx ? sc[jj] : mx;
            real alpha = rexp(m[r] - mx), lsum = 0; /* alpha = 0 on the row's first tile (m = −inf) */
            shift_clamp(sc, a, b, mx);
#pragma omp simd reduction(+ : lsum)
            for (int64_t jj = a; jj <= b; jj++) lsum += (sc[jj] = vexp(sc[jj]));
            l[r] = l[r] * alpha + lsum;
            tile_rows_sum(sc, v + (j0 * H + h) * dv, H * dv, dv, a, b, alpha, oi);
            m[r] = mx;
        }
    }
    for (int64_t i = i0; i < i1; i++) { /* every row sees at least itself, so l > 0 */
        real inv = (real)(1.0 / l[i - i0]), *oi = o + (i * H + h) * dv;
        for (int64_t c = 0; c < dv; c++) oi[c] *= inv;
        lse[i * H + h] = (real)(m[i - i0] + log(l[i - i0]));
    }
}

size_t k3c_attention_workspace(const k3c_attention_sizes *s) {
    return s && s->T > 0 && s->H > 0 ? (size_t)(s->T * s->H) * sizeof(real) : 0;
}

int k3c_attention_fwd(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const real *q, const real *k,
                      const real *v, real *o, real *lse, void *ws, k3c_err *err) {
    attn_plan p;
    int32_t one[2];
    int rc = make_plan(s, cu_seqlens, one, &p, "attention_fwd", err);
    if (rc) return rc;
    const int64_t n = p.H * p.nqb;
    /* Later query blocks see more keys: hand them out first. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t it = 0; it < n; it++) fwd_block(&p, it % p.H, p.nqb - 1 - it / p.H, q, k, v, o, lse);
    return K3C_OK;
}

/* ---------------------------------------------------------------- flash backward
 * With P = exp(scale q·k − lse), dP = dO·v, D = rowsum(dO ⊙ O) = rowsum(P ⊙ dP), dS = P (dP − D):
 * dv_j = Σ_i P_ij dO_i, dk_j = scale Σ_i dS_ij q_i, dq_i = scale Σ_j dS_ij k_j. */

/* P and dS of row i against keys [a, b] of a tile whose k and v are loaded transposed. */
static void row_probs(const attn_plan *p, const real *qi, const real *doi, real li, real Di, const real *kT,
                      const real *vT, int64_t nk, int64_t a, int64_t b, real *pr, real *ds) {
    row_times_tile(qi, kT, p->dqk, nk, a, b, p->scale, pr);
    row_times_tile(doi, vT, p->dv, nk, a, b, 1, ds);
    shift_clamp(pr, a, b, li);
#pragma omp simd
    for (int64_t jj = a; jj <= b; jj++) {
        pr[jj] = vexp(pr[jj]);
        ds[jj] = pr[jj] * (ds[jj] - Di);
    }
}

/* One (head, key tile) for dk, dv. The queries that see key j are i in [j, end of j's document); they are taken
 * KV_ROWS at a time with P and scale·dS stored per key (PT[jj][r]), so each dk_j, dv_j row is updated once per chunk
 * by tile_rows_sum instead of once per query. */
enum { KV_ROWS = 16 };
static void bwd_kv_block(const attn_plan *p, int64_t h, int64_t kb, const real *q, const real *k, const real *v,
                         const real *lse, const real *dout, const real *Dr, real *dk, real *dvg) {
    const int64_t H = p->H, dqk = p->dqk, dv = p->dv, j0 = kb * p->bk, nk = min64(p->bk, p->T - j0);
    real kT[K3C_ATTN_SCRATCH], pr[K3C_ATTN_MAX_BLOCK], ds[K3C_ATTN_MAX_BLOCK], *vT = kT + dqk * nk;
    real PT[K3C_ATTN_MAX_BLOCK * KV_ROWS], ST[K3C_ATTN_MAX_BLOCK * KV_ROWS];
    int64_t kend[K3C_ATTN_MAX_BLOCK], d = doc_of(p, j0);
    for (int64_t jj = 0; jj < nk; jj++) {
        while (p->cu[d + 1] <= j0 + jj) d++;
        kend[jj] = p->cu[d + 1];
    }
    load_tile_T(k + h * dqk, H * dqk, dqk, j0, nk, kT);
    load_tile_T(v + h * dv, H * dv, dv, j0, nk, vT);
    d = doc_of(p, j0);
    for (int64_t i0 = j0; i0 < kend[nk - 1]; i0 += KV_ROWS) {
        const int64_t i1 = min64(i0 + KV_ROWS, kend[nk - 1]);
        for (int64_t i = i0; i < i1; i++) {
            while (p->cu[d + 1] <= i) d++;
            const int64_t a = max64(p->cu[d], j0) - j0, b = min64(i - j0, nk - 1);
            if (a > b) continue;
            row_probs(p, q + (i * H + h) * dqk, dout + (i * H + h) * dv, lse[i * H + h], Dr[i * H + h], kT, vT, nk, a,
                      b, pr, ds);
            for (int64_t jj = a; jj <= b; jj++)
                PT[jj * KV_ROWS + (i - i0)] = pr[jj], ST[jj * KV_ROWS + (i - i0)] = p->scale * ds[jj];
        }
        for (int64_t jj = 0; jj < nk; jj++) { /* rows [ra, rb] of the chunk see key jj (and were filled above) */
            const int64_t ra = max64(j0 + jj, i0) - i0, rb = min64(i1, kend[jj]) - 1 - i0;
            if (ra > rb) continue;
            if (dvg)
                tile_rows_sum(PT + jj * KV_ROWS, dout + (i0 * H + h) * dv, H * dv, dv, ra, rb, 1,
                              dvg + ((j0 + jj) * H + h) * dv);
            if (dk)
                tile_rows_sum(ST + jj * KV_ROWS, q + (i0 * H + h) * dqk, H * dqk, dqk, ra, rb, 1,
                              dk + ((j0 + jj) * H + h) * dqk);
        }
    }
}

/* One (head, query block) for dq. */
static void bwd_q_block(const attn_plan *p, int64_t h, int64_t qb, const real *q, const real *k, const real *v,
                        const real *lse, const real *dout, const real *Dr, real *dq) {
    const int64_t H = p->H, dqk = p->dqk, dv = p->dv, i0 = qb * p->bq, i1 = min64(i0 + p->bq, p->T);
    int64_t start[K3C_ATTN_MAX_BLOCK];
    real kT[K3C_ATTN_SCRATCH], pr[K3C_ATTN_MAX_BLOCK], ds[K3C_ATTN_MAX_BLOCK];
    const int64_t first = row_starts(p, i0, i1, start);
    for (int64_t kb = first / p->bk; kb <= (i1 - 1) / p->bk; kb++) {
        const int64_t j0 = kb * p->bk, nk = min64(p->bk, p->T - j0);
        real *vT = kT + dqk * nk;
        load_tile_T(k + h * dqk, H * dqk, dqk, j0, nk, kT);
        load_tile_T(v + h * dv, H * dv, dv, j0, nk, vT);
        for (int64_t i = i0; i < i1; i++) {
            const int64_t a = max64(start[i - i0], j0) - j0, b = min64(i - j0, nk - 1);
            if (a > b) continue;
            real *dqi = dq + (i * H + h) * dqk;
            row_probs(p, q + (i * H + h) * dqk, dout + (i * H + h) * dv, lse[i * H + h], Dr[i * H + h], kT, vT, nk, a,
                      b, pr, ds);
            for (int64_t jj = a; jj <= b; jj++) ds[jj] *= p->scale;
            tile_rows_sum(ds, k + (j0 * H + h) * dqk, H * dqk, dqk, a, b, 1, dqi);
        }
    }
}

int k3c_attention_bwd(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const real *q, const real *k,
                      const real *v, const real *o, const real *lse, const real *dout, real *dq, real *dk, real *dv,
                      void *ws, k3c_err *err) {
    attn_plan p;
    int32_t one[2];
    int rc = make_plan(s, cu_seqlens, one, &p, "attention_bwd", err);
    if (rc) return rc;
    if (p.T == 0 || (!dq && !dk && !dv)) return K3C_OK;
    if (!ws)
        return k3c_errf(err, K3C_EINVAL, "attention_bwd: workspace of %zu bytes required", k3c_attention_workspace(s));
    real *Dr = ws;
    const int64_t TH = p.T * p.H;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < TH; r++) Dr[r] = dot(dout + r * p.dv, o + r * p.dv, p.dv);
    if (dk || dv) {
        const int64_t n = p.H * p.nkb; /* earlier key tiles are seen by more queries: first */
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t it = 0; it < n; it++) bwd_kv_block(&p, it % p.H, it / p.H, q, k, v, lse, dout, Dr, dk, dv);
    }
    if (dq) {
        const int64_t n = p.H * p.nqb;
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t it = 0; it < n; it++) bwd_q_block(&p, it % p.H, p.nqb - 1 - it / p.H, q, k, v, lse, dout, Dr, dq);
    }
    return K3C_OK;
}

/* ---------------------------------------------------------------- materialised reference */

size_t k3c_attention_naive_workspace(const k3c_attention_sizes *s) {
    return s && s->T > 0 ? 2 * (size_t)(s->T * s->T) * sizeof(real) : 0;
}

/* P[T,T] of head h: scale q kᵀ by BLAS, then the masked softmax; lse is written (fill_lse) or read. */
static void naive_probs(const attn_plan *p, int64_t h, const real *q, const real *k, real *P, real *lse, int fill_lse) {
    const int T = (int)p->T, ld = (int)(p->H * p->dqk);
    cblas_rgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, (int)p->dqk, p->scale, q + h * p->dqk, ld,
                k + h * p->dqk, ld, 0, P, T);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < T; i++) {
        real *row = P + i * T;
        const int64_t st = p->cu[doc_of(p, i)];
        double l = lse[i * p->H + h];
        if (fill_lse) {
            real mx = row[st];
            for (int64_t j = st; j <= i; j++) mx = row[j] > mx ? row[j] : mx;
            double sum = 0;
            for (int64_t j = st; j <= i; j++) sum += exp((double)row[j] - mx);
            l = mx + log(sum);
            lse[i * p->H + h] = (real)l;
        }
        for (int64_t j = 0; j < T; j++) row[j] = j >= st && j <= i ? (real)exp((double)row[j] - l) : 0;
    }
}

int k3c_attention_naive_fwd(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const real *q, const real *k,
                            const real *v, real *o, real *lse, void *ws, k3c_err *err) {
    attn_plan p;
    int32_t one[2];
    int rc = make_plan(s, cu_seqlens, one, &p, "attention_naive_fwd", err);
    if (rc || p.T == 0) return rc;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "attention_naive_fwd: workspace required");
    real *P = ws;
    const int T = (int)p.T, ldv = (int)(p.H * p.dv);
    for (int64_t h = 0; h < p.H; h++) {
        naive_probs(&p, h, q, k, P, lse, 1);
        cblas_rgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, (int)p.dv, T, 1, P, T, v + h * p.dv, ldv, 0,
                    o + h * p.dv, ldv);
    }
    return K3C_OK;
}

/* dS = P ⊙ (dP − rowsum(P ⊙ dP)): the row sum is taken from P and dP here, not from O, so it checks the flash D. */
int k3c_attention_naive_bwd(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const real *q, const real *k,
                            const real *v, const real *o, const real *lse, const real *dout, real *dq, real *dk,
                            real *dv, void *ws, k3c_err *err) {
    attn_plan p;
    int32_t one[2];
    int rc = make_plan(s, cu_seqlens, one, &p, "attention_naive_bwd", err);
    if (rc || p.T == 0) return rc;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "attention_naive_bwd: workspace required");
    real *P = ws, *G = P + p.T * p.T;
    const int T = (int)p.T, ldk = (int)(p.H * p.dqk), ldv = (int)(p.H * p.dv), dqk = (int)p.dqk, dvn = (int)p.dv;
    for (int64_t h = 0; h < p.H; h++) {
        naive_probs(&p, h, q, k, P, (real *)lse, 0);
        if (dv)
            cblas_rgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, dvn, T, 1, P, T, dout + h * p.dv, ldv, 1,
                        dv + h * p.dv, ldv);
        if (!dq && !dk) continue;
        cblas_rgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, dvn, 1, dout + h * p.dv, ldv, v + h * p.dv, ldv, 0,
                    G, T);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < T; i++) {
            double rs = 0;
            for (int64_t j = 0; j < T; j++) rs += (double)P[i * T + j] * G[i * T + j];
            for (int64_t j = 0; j < T; j++) G[i * T + j] = (real)(P[i * T + j] * (G[i * T + j] - rs));
        }
        if (dq)
            cblas_rgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, dqk, T, p.scale, G, T, k + h * p.dqk, ldk, 1,
                        dq + h * p.dqk, ldk);
        if (dk)
            cblas_rgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, dqk, T, p.scale, G, T, q + h * p.dqk, ldk, 1,
                        dk + h * p.dqk, ldk);
    }
    return K3C_OK;
}

#define QK_BLOCK 128

int k3c_attention_max_logit(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const real *q, const real *k,
                            float *smax, k3c_err *err) {
    int rc = check_cu(s, cu_seqlens, "attention_max_logit", err);
    if (rc) return rc;
    int64_t H = s->H, dqk = s->dqk, T = s->T;
    int nd = cu_seqlens ? (int)s->n_docs : 1, fail = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : fail)
    for (int64_t h = 0; h < H; h++) {
        real blk[QK_BLOCK * QK_BLOCK];
        double best = -INFINITY;
        for (int d = 0; d < nd; d++) {
            int64_t b0 = cu_seqlens ? cu_seqlens[d] : 0, e = cu_seqlens ? cu_seqlens[d + 1] : T;
            for (int64_t i0 = b0; i0 < e; i0 += QK_BLOCK)
                for (int64_t j0 = b0; j0 <= i0; j0 += QK_BLOCK) {
                    int64_t ni = e - i0 < QK_BLOCK ? e - i0 : QK_BLOCK, nj = e - j0 < QK_BLOCK ? e - j0 : QK_BLOCK;
                    /* blk = Q_h[i0:i0+ni] K_h[j0:j0+nj]ᵀ, heads strided by H·dqk */
                    cblas_rgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)ni, (int)nj, (int)dqk, 1,
                                q + (i0 * H + h) * dqk, (int)(H * dqk), k + (j0 * H + h) * dqk, (int)(H * dqk), 0, blk,
                                QK_BLOCK);
                    for (int64_t i = i0 < s->q_begin ? s->q_begin - i0 : 0; i < ni; i++)
                        for (int64_t j = 0; j < nj && j0 + j <= i0 + i; j++)
                            if (blk[i * QK_BLOCK + j] * s->scale > best) best = blk[i * QK_BLOCK + j] * s->scale;
                }
        }
        smax[h] = (float)best;
        if (!isfinite(best) && T > 0) fail = 1;
    }
    return fail ? k3c_errf(err, K3C_ENUMERIC, "attention: non-finite logits") : K3C_OK;
}
