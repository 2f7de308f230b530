/* test_backend_ops_decode.c — the table-driven harness of the inference engine's ops (the backend table's `decode`
 * entry, ops/decode.h): the CPU table against second implementations in double (the training ops' float64 forms, a
 * materialised softmax, per-token expert loops, the expected cache layout), and (built with -DK3C_CUDA, a GPU present)
 * the CUDA table against the CPU one. docs/CODE.md "Ops" and "Testing"; docs/ENGINE.md "Two backends, one engine".
 *
 * A case is a row of the table in add_rows: op, weight type, shape, the step's segments (decode: every segment one
 * token; prefill: one segment of many; mixed: several segments of different lengths at different positions, states in
 * and out), tolerances. Inputs are fresh seeded random numbers (the seed is printed; argv[1] or K3C_SEED sets it,
 * 20261207 by default), outputs NaN-poisoned, states and accumulated outputs pre-filled; every buffer lives in the
 * backend's memory and goes through its upload / download (tests/backend_ops_exec.h's rule), so one runner serves
 * both tables.
 *
 * Tolerances (relative L2 error ‖x − ref‖ / ‖ref − init‖; "exact": every element bit for bit). bf16 and MXFP4 weights
 * are decoded to the same float values on every side (the reference decodes them itself), so the error of a product
 * is float summation order alone. CPU against double: float rounding (unit 6e-8) grown by the reduction length —
 * TOL_ROW 1e-5 for the products (up to K3's 7168-term rows), conv + L2 norm, the GLU and attention over ≤ 64 cached tokens;
 * TOL_CHAIN 1e-4 for the KDA state and output (the CPU's chunked float form against the double recurrence over up to
 * 37 steps of decays); exact for embeddings, cache writes, conv tails and untouched state. CUDA against the CPU:
 * 1e-5 for the fp32 kernels (float sums in other orders, the KDA recurrence against the CPU's chunks), exact for
 * embeddings, cache writes and conv tails; a product both must refuse (MXFP4 rows not in blocks of 32) is refused. */
#include "test.h"

#include <stdint.h>

#include "ops/backend.h"
#include "ops/kda.h"
#include "ops/l2norm.h"
#include "ops/short_conv.h"
#ifdef K3C_CUDA
#include "cuda/cuda_ops.h"
#endif

#define TOL_ROW 1e-5
#define TOL_CUDA 1e-5

enum { D_QMAT, D_MANY, D_HEADS, D_EMBED, D_CONV, D_KDA, D_CACHE, D_ATTEND, D_MOE, D_GLU, D_GRAPH, D_COUNT };
static const char *const dop_names[D_COUNT] = {"qmat_mul", "qmat_many", "qmat_heads", "embed", "qkv_conv", "kda",
                                               "cache_put", "attend", "moe", "glu", "graph"};
static const char *const wnames[3] = {"f32", "bf16", "mxfp4"};

enum {
    F_ACC = 1,
    F_GAP = 2,
    F_SITU = 4,
    F_MIXED = 8,
    F_WIDE = 16,  /* qmat_mul: MXFP4 scales 118 … 135 (2^-9 … 2^8) */
    F_REFUSE = 32 /* qmat_mul: a product the backend must refuse with K3C_EINVAL */
};

#define MAXSEG 4
typedef struct {
    int op, wtype;
    int64_t a, b, c, d, e; /* shape, by op (see add_rows) */
    int flags;
    double x; /* kda: gate bound */
    int nseg;
    int64_t len[MAXSEG], pos[MAXSEG];
    double tol_cpu, tol_cuda;
} drow;

typedef struct {
    const char *name;
    const k3c_backend_f32 *be;
    int cuda;
    int rows[D_COUNT], passed[D_COUNT], failed[D_COUNT];
    void *mem[128];
    int nmem, bad;
    char msg[1200];
} dbe;

/* ---------------------------------------------------------------- backend memory */
static void *dput(dbe *b, const void *h, size_t bytes) {
    void *d = b->be->alloc(bytes ? bytes : 64);
    k3c_err err = {0};
    if (!d || b->nmem == 128) {
        if (!b->bad) snprintf(b->msg, sizeof b->msg, "harness: backend alloc of %zu bytes", bytes);
        b->bad = 1;
        if (d) b->be->free(d);
        return NULL;
    }
    b->mem[b->nmem++] = d;
    if (h && bytes && b->be->upload(d, h, bytes, &err)) {
        if (!b->bad) snprintf(b->msg, sizeof b->msg, "harness: upload: %s", err.msg);
        b->bad = 1;
    }
    return d;
}
static float *dnan(dbe *b, size_t n) { /* a NaN-poisoned float output */
    float *h = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    float *d = dput(b, h, sizeof(float) * n);
    free(h);
    return d;
}
static void dget(dbe *b, void *h, const void *d, size_t bytes) {
    k3c_err err = {0};
    if (!b->bad && d && bytes && b->be->download(h, d, bytes, &err)) {
        snprintf(b->msg, sizeof b->msg, "harness: download: %s", err.msg);
        b->bad = 1;
    }
}
static void dfree_all(dbe *b) {
    for (int i = 0; i < b->nmem; i++) b->be->free(b->mem[i]);
    b->nmem = 0;
}

/* ---------------------------------------------------------------- verdicts */
static void shape_of(const drow *r, char *s, size_t n) {
    int o = snprintf(s, n, "%s %lld,%lld,%lld,%lld,%lld%s%s", r->wtype >= 0 ? wnames[r->wtype] : "-", (long long)r->a,
                     (long long)r->b, (long long)r->c, (long long)r->d, (long long)r->e, r->flags & F_ACC ? " acc" : "",
                     r->flags & F_GAP     ? " gap"
                     : r->flags & F_SITU  ? " situ"
                     : r->flags & F_MIXED ? " mixed"
                     : r->flags & F_WIDE  ? " wide"
                                          : "");
    for (int i = 0; i < r->nseg && o < (int)n; i++)
        o += snprintf(s + o, n - (size_t)o, "%s%lld@%lld", i ? " " : " segs ", (long long)r->len[i],
                      (long long)r->pos[i]);
}

static void verdict(dbe *b, const drow *r, const char *what, double e, double tol, size_t nonfinite) {
    char s[200];
    shape_of(r, s, sizeof s);
    int pass = nonfinite == 0 && e <= tol;
    pass ? b->passed[r->op]++ : b->failed[r->op]++;
    CHECK(pass, "%s %s [%s] %s: err %.3e tol %.0e%s", b->name, dop_names[r->op], s, what, e, tol,
          nonfinite ? " (non-finite outputs)" : "");
    if (getenv("K3C_TEST_VERBOSE"))
        printf("  %-5s %-10s %-56s %-6s err %.3e tol %.0e\n", b->name, dop_names[r->op], s, what, e, tol);
}

/* x against ref over n values: ‖x − ref‖ / ‖ref − init‖ (init NULL: 0), or with tol 0 the count of elements that
 * differ from float(ref). */
static void compare(dbe *b, const drow *r, const char *what, const float *x, const double *ref, const double *init,
                    size_t n, double tol) {
    double num = 0, den = 0;
    size_t bad = 0, diff = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i]) && isfinite(ref[i])) bad++;
        const double d = (double)x[i] - ref[i], z = ref[i] - (init ? init[i] : 0);
        num += d * d, den += z * z;
        diff += x[i] != (float)ref[i];
    }
    if (tol == 0)
        verdict(b, r, what, (double)diff, 0, bad);
    else
        verdict(b, r, what, den > 0 ? sqrt(num / den) : sqrt(num), tol, bad);
}
static double *widen(const float *x, size_t n) {
    double *d = malloc(sizeof(double) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* ---------------------------------------------------------------- inputs */
static float frand(k3c_rng *r, double sd) { return (float)(k3c_rng_normal(r) * sd); }
static float *randv(k3c_rng *r, size_t n, double sd) {
    float *v = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) v[i] = frand(r, sd);
    return v;
}
static int64_t irand(k3c_rng *r, int64_t n) { return (int64_t)floor(k3c_rng_uniform(r) * (double)n) % n; }

/* count matrices [rows, cols] of one storage type, stored back to back (or, QM_GAP, with a hole after every second),
 * and their values decoded here (E2M1 × 2^(s−127), bf16 by a shift): the reference reads these. MXFP4 scales are
 * 118 … 127 (2^-9 … 2^0), with QM_WIDE 118 … 135. */
enum { QM_GAP = 1, QM_WIDE = 2 };
typedef struct {
    int type;
    int64_t count, rows, cols;
    size_t wbytes, sbytes; /* one matrix's */
    int64_t *slot;         /* matrix i's place in the storage, in matrices */
    int64_t nslot;
    uint8_t *w, *s;
    float *dec; /* [count, rows, cols] */
} qm;

static float e2m1(unsigned v) {
    static const float m[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    return v & 8 ? -m[v & 7] : m[v & 7];
}
static float bf16_bits(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void qm_make(qm *q, k3c_rng *r, int type, int64_t count, int64_t rows, int64_t cols, double sd, int opts) {
    const int gap = (opts & QM_GAP) != 0;
    memset(q, 0, sizeof *q);
    q->type = type, q->count = count, q->rows = rows, q->cols = cols;
    const int64_t RC = rows * cols;
    q->wbytes = (size_t)(type == K3C_QMAT_F32 ? 4 * RC : type == K3C_QMAT_BF16 ? 2 * RC : RC / 2);
    q->sbytes = type == K3C_QMAT_MXFP4 ? (size_t)(RC / 32) : 0;
    q->slot = malloc(sizeof(int64_t) * (size_t)count);
    for (int64_t i = 0; i < count; i++) q->slot[i] = gap ? i + i / 2 : i, q->nslot = q->slot[i] + 1;
    q->w = calloc((size_t)q->nslot, q->wbytes);
    q->s = calloc((size_t)q->nslot, q->sbytes ? q->sbytes : 1);
    q->dec = malloc(sizeof(float) * (size_t)(count * RC));
    for (int64_t m = 0; m < count; m++) {
        uint8_t *w = q->w + (size_t)q->slot[m] * q->wbytes, *s = q->s + (size_t)q->slot[m] * q->sbytes;
        float *dec = q->dec + m * RC;
        for (int64_t i = 0; i < RC; i++) {
            if (type == K3C_QMAT_F32) {
                float v = frand(r, sd);
                memcpy(w + 4 * i, &v, 4), dec[i] = v;
            } else if (type == K3C_QMAT_BF16) {
                uint16_t h = k3c_f32_to_bf16(frand(r, sd));
                memcpy(w + 2 * i, &h, 2), dec[i] = bf16_bits(h);
            }
        }
        if (type != K3C_QMAT_MXFP4) continue;
        for (size_t i = 0; i < q->sbytes; i++) s[i] = (uint8_t)(118 + k3c_rng_u64(r) % (opts & QM_WIDE ? 18 : 10));
        for (int64_t i = 0; i < RC / 2; i++) w[i] = (uint8_t)(k3c_rng_u64(r) & 255u);
        for (int64_t i = 0; i < RC; i++) { /* low nibble = even column */
            const int64_t row = i / cols, c = i % cols;
            const unsigned nib = c & 1 ? w[i / 2] >> 4 : w[i / 2] & 15u;
            dec[i] = e2m1(nib) * ldexpf(1.f, (int)s[row * (cols / 32) + c / 32] - 127);
        }
    }
}
static void qm_free(qm *q) { free(q->slot), free(q->w), free(q->s), free(q->dec); }

/* The views of q's matrices over a copy of its storage in b's memory (k3c_qmat: views, not owners). */
static k3c_qmat *qm_up(dbe *b, const qm *q) {
    uint8_t *w = dput(b, q->w, q->wbytes * (size_t)q->nslot), *s = q->sbytes ? dput(b, q->s, q->sbytes * (size_t)q->nslot) : NULL;
    k3c_qmat *v = calloc((size_t)q->count, sizeof *v);
    for (int64_t m = 0; m < q->count && w; m++)
        v[m] = (k3c_qmat){q->type, q->rows, q->cols, w + (size_t)q->slot[m] * q->wbytes,
                          s ? s + (size_t)q->slot[m] * q->sbytes : NULL};
    return v;
}

/* Y [n, rows] (+)= X [n, cols] · Wᵀ in double over the decoded values, X row j at X + j·ldx, Y row j at Y + j·ldy. */
static void ref_mul(const float *W, int64_t R, int64_t C, const float *X, int64_t ldx, int64_t n, double *Y,
                    int64_t ldy, int acc) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < R; i++) {
            double s = acc ? Y[j * ldy + i] : 0;
            for (int64_t c = 0; c < C; c++) s += (double)W[i * C + c] * X[j * ldx + c];
            Y[j * ldy + i] = s;
        }
}

/* ---------------------------------------------------------------- qmat_mul, qmat_mul_many, qmat_mul_heads */
/* qmat_mul: a = rows, b = cols, c = n */
static void case_qmat(dbe *bes[2], const drow *r, k3c_rng *rng) {
    const int64_t R = r->a, C = r->b, n = r->c;
    const int acc = (r->flags & F_ACC) != 0;
    qm q;
    qm_make(&q, rng, r->wtype, 1, R, C, 1.0 / sqrt((double)C), r->flags & F_WIDE ? QM_WIDE : 0);
    float *X = randv(rng, (size_t)(n * C), 1.0), *Y0 = randv(rng, (size_t)(n * R), 1.0), *Y = malloc(sizeof(float) * (size_t)(n * R));
    double *ref = calloc((size_t)(n * R), 8), *init = acc ? widen(Y0, (size_t)(n * R)) : NULL, *cpu = NULL;
    if (acc) memcpy(ref, init, sizeof(double) * (size_t)(n * R));
    ref_mul(q.dec, R, C, X, C, n, ref, R, acc);
    for (int k = 0; k < 2 && bes[k]; k++) {
        dbe *b = bes[k];
        b->rows[r->op]++;
        k3c_qmat *W = qm_up(b, &q);
        float *dX = dput(b, X, sizeof(float) * (size_t)(n * C));
        float *dY = acc ? dput(b, Y0, sizeof(float) * (size_t)(n * R)) : dnan(b, (size_t)(n * R));
        k3c_err err = {0};
        int rc = b->bad ? K3C_ENOMEM : b->be->decode->qmat_mul(b->be->ctx, W, dX, n, dY, acc, &err);
        if (r->flags & F_REFUSE) {
            verdict(b, r, "refused", rc == K3C_EINVAL && !b->bad ? 0 : 1, 0, 0);
            dfree_all(b), free(W);
            continue;
        }
        if (!rc) rc = b->be->sync(&err);
        dget(b, Y, dY, sizeof(float) * (size_t)(n * R));
        CHECK(rc == K3C_OK && !b->bad, "%s qmat_mul: %s %s", b->name, err.msg, b->msg);
        if (!rc && !b->bad) compare(b, r, "Y", Y, k ? cpu : ref, init, (size_t)(n * R), k ? r->tol_cuda : r->tol_cpu);
        if (k == 0) cpu = widen(Y, (size_t)(n * R));
        dfree_all(b), free(W);
    }
    qm_free(&q), free(X), free(Y0), free(Y), free(ref), free(init), free(cpu);
}

/* qmat_mul_many: a jobs, b = base rows, c = cols, d = n (F_MIXED: every third job 3 rows more); types cycle through
 * the three when wtype < 0; every fourth job accumulates. */
#define MAXJ 12
static void case_many(dbe *bes[2], const drow *r, k3c_rng *rng) {
    const int nj = (int)r->a;
    qm q[MAXJ];
    int64_t n[MAXJ], Ro[MAXJ], xo[MAXJ], yo[MAXJ], nx = 0, ny = 0;
    int acc[MAXJ];
    for (int j = 0; j < nj; j++) {
        const int64_t R = r->b + 8 * j, C = r->c + (r->wtype == K3C_QMAT_MXFP4 || r->wtype < 0 ? 32 : 4) * (j % 3);
        n[j] = r->d + ((r->flags & F_MIXED) && j % 3 == 2 ? 3 : 0), acc[j] = j % 4 == 3;
        qm_make(&q[j], rng, r->wtype >= 0 ? r->wtype : j % 3, 1, R, C, 1.0 / sqrt((double)C), 0);
        Ro[j] = R, xo[j] = nx, yo[j] = ny, nx += n[j] * C, ny += n[j] * R;
    }
    float *X = randv(rng, (size_t)nx, 1.0), *Y0 = randv(rng, (size_t)ny, 1.0), *Y = malloc(sizeof(float) * (size_t)ny);
    double *ref = widen(Y0, (size_t)ny), *init = widen(Y0, (size_t)ny), *cpu = NULL;
    for (int j = 0; j < nj; j++) {
        if (!acc[j]) /* overwritten: compared from 0 */
            for (int64_t i = 0; i < n[j] * Ro[j]; i++) init[yo[j] + i] = 0;
        ref_mul(q[j].dec, Ro[j], q[j].cols, X + xo[j], q[j].cols, n[j], ref + yo[j], Ro[j], acc[j]);
    }
    for (int k = 0; k < 2 && bes[k]; k++) {
        dbe *b = bes[k];
        b->rows[r->op]++;
        float *Yp = malloc(sizeof(float) * (size_t)ny);
        for (int64_t i = 0; i < ny; i++) Yp[i] = Y0[i];
        for (int j = 0; j < nj; j++)
            if (!acc[j])
                for (int64_t i = 0; i < n[j] * Ro[j]; i++) Yp[yo[j] + i] = NAN;
        float *dX = dput(b, X, sizeof(float) * (size_t)nx), *dY = dput(b, Yp, sizeof(float) * (size_t)ny);
        k3c_qmat *W[MAXJ];
        k3c_qmat_job jobs[MAXJ];
        for (int j = 0; j < nj; j++) {
            W[j] = qm_up(b, &q[j]);
            jobs[j] = (k3c_qmat_job){W[j], dX ? dX + xo[j] : NULL, n[j], dY ? dY + yo[j] : NULL, acc[j]};
        }
        k3c_err err = {0};
        int rc = b->bad ? K3C_ENOMEM : b->be->decode->qmat_mul_many(b->be->ctx, jobs, nj, &err);
        if (!rc) rc = b->be->sync(&err);
        dget(b, Y, dY, sizeof(float) * (size_t)ny);
        CHECK(rc == K3C_OK && !b->bad, "%s qmat_mul_many: %s %s", b->name, err.msg, b->msg);
        if (!rc && !b->bad) compare(b, r, "Y", Y, k ? cpu : ref, init, (size_t)ny, k ? r->tol_cuda : r->tol_cpu);
        if (k == 0) cpu = widen(Y, (size_t)ny);
        dfree_all(b), free(Yp);
        for (int j = 0; j < nj; j++) free(W[j]);
    }
    for (int j = 0; j < nj; j++) qm_free(&q[j]);
    free(X), free(Y0), free(Y), free(ref), free(init), free(cpu);
}

/* qmat_mul_heads: a heads, b rows, c cols, d n; X rows [n, heads·cols + 3], Y rows [n, heads·rows + 5] (each head's
 * block in place, the padding untouched); F_GAP: the heads' storage unevenly spaced */
static void case_heads(dbe *bes[2], const drow *r, k3c_rng *rng) {
    const int64_t H = r->a, R = r->b, C = r->c, n = r->d, ldx = H * C + 3, ldy = H * R + 5;
    qm q;
    qm_make(&q, rng, r->wtype, H, R, C, 1.0 / sqrt((double)C), r->flags & F_GAP ? QM_GAP : 0);
    float *X = randv(rng, (size_t)(n * ldx), 1.0), *Y0 = randv(rng, (size_t)(n * ldy), 1.0);
    float *Y = malloc(sizeof(float) * (size_t)(n * ldy));
    double *ref = widen(Y0, (size_t)(n * ldy)), *cpu = NULL;
    for (int64_t h = 0; h < H; h++) ref_mul(q.dec + h * R * C, R, C, X + h * C, ldx, n, ref + h * R, ldy, 0);
    for (int64_t j = 0; j < n; j++) /* the written blocks start from NaN */
        for (int64_t i = 0; i < H * R; i++) Y0[j * ldy + i] = NAN;
    for (int k = 0; k < 2 && bes[k]; k++) {
        dbe *b = bes[k];
        b->rows[r->op]++;
        k3c_qmat *W = qm_up(b, &q);
        float *dX = dput(b, X, sizeof(float) * (size_t)(n * ldx)), *dY = dput(b, Y0, sizeof(float) * (size_t)(n * ldy));
        void *ws = dput(b, NULL, b->be->decode->heads_workspace(W, n));
        k3c_err err = {0};
        int rc = b->bad ? K3C_ENOMEM
                        : b->be->decode->qmat_mul_heads(b->be->ctx, W, H, dX, ldx, C, n, dY, ldy, R, ws, &err);
        if (!rc) rc = b->be->sync(&err);
        dget(b, Y, dY, sizeof(float) * (size_t)(n * ldy));
        CHECK(rc == K3C_OK && !b->bad, "%s qmat_mul_heads: %s %s", b->name, err.msg, b->msg);
        if (!rc && !b->bad) {
            const double *want = k ? cpu : ref;
            size_t pad = 0, nonfin = 0;
            double num = 0, den = 0;
            for (int64_t j = 0; j < n; j++)
                for (int64_t i = 0; i < ldy; i++) {
                    const size_t e = (size_t)(j * ldy + i);
                    if (i >= H * R) {
                        pad += Y[e] != (float)want[e];
                        continue;
                    }
                    nonfin += !isfinite(Y[e]);
                    num += (Y[e] - want[e]) * (Y[e] - want[e]), den += want[e] * want[e];
                }
            verdict(b, r, "Y", sqrt(num / den), k ? r->tol_cuda : r->tol_cpu, nonfin);
            verdict(b, r, "pad", (double)pad, 0, 0);
        }
        if (k == 0) cpu = widen(Y, (size_t)(n * ldy));
        dfree_all(b), free(W);
    }
    qm_free(&q), free(X), free(Y0), free(Y), free(ref), free(cpu);
}

/* embed: a = V, b = cols, c = n (ids hit both ends of the table and repeat); exact */
static void case_embed(dbe *bes[2], const drow *r, k3c_rng *rng) {
    const int64_t V = r->a, C = r->b, n = r->c;
    qm q;
    qm_make(&q, rng, r->wtype, 1, V, C, 1.0, 0);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(i % 3 == 2 ? ids[i - 1] : irand(rng, V));
    ids[0] = (int32_t)(V - 1), ids[n - 1] = 0;
    double *ref = malloc(sizeof(double) * (size_t)(n * C));
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < C; c++) ref[i * C + c] = q.dec[ids[i] * C + c];
    float *y = malloc(sizeof(float) * (size_t)(n * C));
    for (int k = 0; k < 2 && bes[k]; k++) {
        dbe *b = bes[k];
        b->rows[r->op]++;
        k3c_qmat *E = qm_up(b, &q);
        int32_t *did = dput(b, ids, sizeof(int32_t) * (size_t)n);
        float *dy = dnan(b, (size_t)(n * C));
        k3c_err err = {0};
        int rc = b->bad ? K3C_ENOMEM : b->be->decode->embed(E, did, n, dy, &err);
        if (!rc) rc = b->be->sync(&err);
        dget(b, y, dy, sizeof(float) * (size_t)(n * C));
        CHECK(rc == K3C_OK && !b->bad, "%s embed: %s %s", b->name, err.msg, b->msg);
        if (!rc && !b->bad) compare(b, r, "y", y, ref, NULL, (size_t)(n * C), 0);
        dfree_all(b), free(E);
    }
    qm_free(&q), free(ids), free(ref), free(y);
}

/* ---------------------------------------------------------------- the step's segments and states */
/* The KDA block of every segment: n_kda = 2 layers of kda_floats = H·dk² + 3·P·(W−1) + 5 (a pad the ops never touch);
 * the rows test layer 1. The latent cache: n_mla = 2 layers of cap = pos + len + 3 tokens; the rows test layer 1. */
typedef struct {
    int nseg;
    int64_t n, max_len, cap[MAXSEG];
    k3c_dec_seg seg[MAXSEG]; /* host: row0, len, pos, cap; pointers filled per backend */
    int32_t *row_seg;
    k3c_dec_dims dims;
    int64_t kblock, mblock[MAXSEG], mtot; /* floats of one segment's KDA block; of its cache, and all caches */
} steps;

static void steps_make(steps *s, const drow *r, const k3c_dec_dims *d) {
    memset(s, 0, sizeof *s);
    s->dims = *d, s->nseg = r->nseg;
    const int64_t P = d->H * d->dk, lw = d->rkv + d->rope;
    s->dims.kda_floats = d->H * d->dk * d->dk + 3 * P * (d->W - 1) + 5;
    s->kblock = 2 * s->dims.kda_floats;
    for (int i = 0; i < r->nseg; i++) {
        k3c_dec_seg *g = &s->seg[i];
        g->len = r->len[i], g->pos = r->pos[i], g->row0 = s->n, g->cap = g->pos + g->len + 3;
        s->n += g->len, s->max_len = g->len > s->max_len ? g->len : s->max_len;
        s->mblock[i] = 2 * g->cap * lw, s->mtot += s->mblock[i];
    }
    s->row_seg = malloc(sizeof(int32_t) * (size_t)(s->n ? s->n : 1));
    for (int i = 0; i < r->nseg; i++)
        for (int64_t t = 0; t < s->seg[i].len; t++) s->row_seg[s->seg[i].row0 + t] = i;
}

/* The batch over states in b's memory (kda: nseg KDA blocks, mla: the caches back to back). */
static k3c_dec_batch steps_up(dbe *b, steps *s, float *kda, float *mla, k3c_dec_seg *segs) {
    int64_t mo = 0;
    for (int i = 0; i < s->nseg; i++) {
        segs[i] = s->seg[i];
        segs[i].kda = kda ? kda + i * s->kblock : NULL, segs[i].mla = mla ? mla + mo : NULL;
        mo += s->mblock[i];
    }
    k3c_dec_batch bt = {segs, dput(b, segs, sizeof(k3c_dec_seg) * (size_t)s->nseg),
                        dput(b, s->row_seg, sizeof(int32_t) * (size_t)(s->n ? s->n : 1)), s->nseg, s->n, s->max_len};
    return bt;
}

/* qkv_conv: dims (a = H, b = dk, c = W); exact conv tails and untouched state */
static void case_conv(dbe *bes[2], const drow *r, k3c_rng *rng) {
    const k3c_dec_dims dd = {r->a, r->b, r->c, 0, 1, 1, 1};
    steps s;
    steps_make(&s, r, &dd);
    const int64_t P = dd.H * dd.dk, n = s.n, Wd = dd.W, off = s.dims.kda_floats + dd.H * dd.dk * dd.dk,
                  K = s.kblock * s.nseg;
    float *x[3], *w[3], *st = randv(rng, (size_t)K, 1.0), *y = malloc(sizeof(float) * (size_t)(3 * n * P));
    float *stg = malloc(sizeof(float) * (size_t)K);
    double *ref = malloc(sizeof(double) * (size_t)(3 * n * P)), *sref = widen(st, (size_t)K), *cy = NULL, *cs = NULL;
    for (int i = 0; i < 3; i++) x[i] = randv(rng, (size_t)(n * P), 1.0), w[i] = randv(rng, (size_t)(P * Wd), 0.6);
    k3c_err err = {0};
    for (int i = 0; i < 3; i++) { /* the training op's float64 form per segment, then L2-normalised q and k */
        double *xd = widen(x[i], (size_t)(n * P)), *wd = widen(w[i], (size_t)(P * Wd));
        for (int g = 0; g < s.nseg; g++) {
            const k3c_dec_seg *sg = &s.seg[g];
            double *tail = sref + g * s.kblock + off + i * P * (Wd - 1), *tin = malloc(sizeof(double) * (size_t)(P * Wd));
            memcpy(tin, tail, sizeof(double) * (size_t)(P * (Wd - 1)));
            k3c_short_conv_dims cd = {sg->len, P, (int)Wd, 1};
            CHECK_OK(k3c_short_conv_fwd_f64(&cd, NULL, xd + sg->row0 * P, wd, tin, ref + i * n * P + sg->row0 * P, tail,
                                            &err),
                     &err);
            free(tin);
        }
        if (i < 2) {
            k3c_l2norm_dims ld = {n * dd.H, dd.dk, 1e-6};
            double *rstd = malloc(sizeof(double) * (size_t)(n * dd.H + 1));
            CHECK_OK(k3c_l2norm_fwd_f64(&ld, ref + i * n * P, ref + i * n * P, rstd, &err), &err);
            free(rstd);
        }
        free(xd), free(wd);
    }
    for (int k = 0; k < 2 && bes[k]; k++) {
        dbe *b = bes[k];
        b->rows[r->op]++;
        k3c_dec_seg segs[MAXSEG];
        float *dst = dput(b, st, sizeof(float) * (size_t)K);
        const float *dx[3], *dw[3];
        float *dy[3];
        for (int i = 0; i < 3; i++)
            dx[i] = dput(b, x[i], sizeof(float) * (size_t)(n * P)), dw[i] = dput(b, w[i], sizeof(float) * (size_t)(P * Wd)),
            dy[i] = dnan(b, (size_t)(n * P));
        k3c_dec_batch bt = steps_up(b, &s, dst, NULL, segs);
        int rc = b->bad ? K3C_ENOMEM : b->be->decode->qkv_conv(&bt, &s.dims, off, dx, dw, dy, &err);
        if (!rc) rc = b->be->sync(&err);
        for (int i = 0; i < 3; i++) dget(b, y + i * n * P, dy[i], sizeof(float) * (size_t)(n * P));
        dget(b, stg, dst, sizeof(float) * (size_t)K);
        CHECK(rc == K3C_OK && !b->bad, "%s qkv_conv: %s %s", b->name, err.msg, b->msg);
        if (!rc && !b->bad) {
            const double tol = k ? r->tol_cuda : r->tol_cpu;
            compare(b, r, "q", y, k ? cy : ref, NULL, (size_t)(n * P), tol);
            compare(b, r, "k", y + n * P, (k ? cy : ref) + n * P, NULL, (size_t)(n * P), tol);
            compare(b, r, "v", y + 2 * n * P, (k ? cy : ref) + 2 * n * P, NULL, (size_t)(n * P), tol);
            compare(b, r, "state", stg, k ? cs : sref, NULL, (size_t)K, 0);
        }
        if (k == 0) cy = widen(y, (size_t)(3 * n * P)), cs = widen(stg, (size_t)K);
        dfree_all(b);
    }
    for (int i = 0; i < 3; i++) free(x[i]), free(w[i]);
    free(st), free(y), free(stg), free(ref), free(sref), free(cy), free(cs), free(s.row_seg);
}

/* kda: dims (a = H, b = dk), x = the gate bound (0: unbounded gates); S of layer 1 in and out */
static void case_kda(dbe *bes[2], const drow *r, k3c_rng *rng) {
    const k3c_dec_dims dd = {r->a, r->b, 4, 0, 1, 1, 1};
    steps s;
    steps_make(&s, r, &dd);
    const int64_t H = dd.H, dk = dd.dk, P = H * dk, n = s.n, off = s.dims.kda_floats, K = s.kblock * s.nseg,
                  SS = H * dk * dk;
    float *q = randv(rng, (size_t)(n * P), 1.0), *kk = randv(rng, (size_t)(n * P), 1.0);
    float *v = randv(rng, (size_t)(n * P), 1.0), *g = malloc(sizeof(float) * (size_t)(n * P));
    float *beta = malloc(sizeof(float) * (size_t)(n * H)), *st = randv(rng, (size_t)K, 0.3);
    for (int64_t i = 0; i < n * H; i++) { /* q, k unit rows as the conv leaves them */
        double a = 0, c = 0;
        for (int64_t e = 0; e < dk; e++) a += q[i * dk + e] * q[i * dk + e], c += kk[i * dk + e] * kk[i * dk + e];
        for (int64_t e = 0; e < dk; e++) q[i * dk + e] = (float)(q[i * dk + e] / sqrt(a)), kk[i * dk + e] = (float)(kk[i * dk + e] / sqrt(c));
        beta[i] = (float)(1 / (1 + exp(-k3c_rng_normal(rng))));
    }
    for (int64_t i = 0; i < n * P; i++) /* bounded: g in [bound, 0]; unbounded: −softplus-like, some near 0 */
        g[i] = r->x < 0 ? (float)(r->x * k3c_rng_uniform(rng)) : (float)(-0.4 * exp(k3c_rng_normal(rng)));
    double *o_ref = malloc(sizeof(double) * (size_t)(n * P)), *s_ref = widen(st, (size_t)K), *co = NULL, *cs = NULL;
    double *qd = widen(q, (size_t)(n * P)), *kd = widen(kk, (size_t)(n * P)), *vd = widen(v, (size_t)(n * P)),
           *gd = widen(g, (size_t)(n * P)), *bd = widen(beta, (size_t)(n * H));
    k3c_err err = {0};
    for (int i = 0; i < s.nseg; i++) { /* the training op's double token recurrence from the segment's state */
        const k3c_dec_seg *sg = &s.seg[i];
        k3c_kda_dims kdd = {sg->len, H, dk, dk, 1, 0, 0, 0};
        double *S = s_ref + i * s.kblock + off, *h0 = malloc(sizeof(double) * (size_t)SS);
        memcpy(h0, S, sizeof(double) * (size_t)SS);
        const int64_t o = sg->row0 * P;
        CHECK_OK(k3c_kda_recurrent_fwd_f64(&kdd, NULL, qd + o, kd + o, vd + o, gd + o, bd + sg->row0 * H, h0,
                                           o_ref + o, S, NULL, &err),
                 &err);
        free(h0);
    }
    float *o = malloc(sizeof(float) * (size_t)(n * P)), *stg = malloc(sizeof(float) * (size_t)K);
    for (int k = 0; k < 2 && bes[k]; k++) {
        dbe *b = bes[k];
        b->rows[r->op]++;
        k3c_dec_seg segs[MAXSEG];
        float *dst = dput(b, st, sizeof(float) * (size_t)K), *dq = dput(b, q, sizeof(float) * (size_t)(n * P));
        float *dk_ = dput(b, kk, sizeof(float) * (size_t)(n * P)), *dv = dput(b, v, sizeof(float) * (size_t)(n * P));
        float *dg = dput(b, g, sizeof(float) * (size_t)(n * P)), *db = dput(b, beta, sizeof(float) * (size_t)(n * H));
        float *dO = dnan(b, (size_t)(n * P));
        void *ws = dput(b, NULL, b->be->decode->kda_workspace(&s.dims, n));
        k3c_dec_batch bt = steps_up(b, &s, dst, NULL, segs);
        int rc = b->bad ? K3C_ENOMEM : b->be->decode->kda(&bt, &s.dims, off, dq, dk_, dv, dg, db, r->x, dO, ws, &err);
        if (!rc) rc = b->be->sync(&err);
        dget(b, o, dO, sizeof(float) * (size_t)(n * P));
        dget(b, stg, dst, sizeof(float) * (size_t)K);
        CHECK(rc == K3C_OK && !b->bad, "%s kda: %s %s", b->name, err.msg, b->msg);
        if (!rc && !b->bad) {
            const double tol = k ? r->tol_cuda : r->tol_cpu, *sw = k ? cs : s_ref;
            compare(b, r, "o", o, k ? co : o_ref, NULL, (size_t)(n * P), tol);
            /* S of layer 1 per segment as a change from its initial value; everything else untouched */
            float *sg = malloc(sizeof(float) * (size_t)(s.nseg * SS));
            double *sr = malloc(sizeof(double) * (size_t)(s.nseg * SS)), *s0 = malloc(sizeof(double) * (size_t)(s.nseg * SS));
            double *rest = malloc(sizeof(double) * (size_t)K);
            float *restg = malloc(sizeof(float) * (size_t)K);
            for (int64_t e = 0; e < K; e++) rest[e] = sw[e], restg[e] = stg[e];
            for (int i = 0; i < s.nseg; i++)
                for (int64_t e = 0; e < SS; e++) {
                    const int64_t at = i * s.kblock + off + e;
                    sg[i * SS + e] = stg[at], sr[i * SS + e] = sw[at], s0[i * SS + e] = st[at];
                    rest[at] = 0, restg[at] = 0;
                }
            compare(b, r, "S", sg, sr, s0, (size_t)(s.nseg * SS), tol);
            compare(b, r, "rest", restg, rest, NULL, (size_t)K, 0);
            free(sg), free(sr), free(s0), free(rest), free(restg);
        }
        if (k == 0) co = widen(o, (size_t)(n * P)), cs = widen(stg, (size_t)K);
        dfree_all(b);
    }
    free(q), free(kk), free(v), free(g), free(beta), free(st), free(o), free(stg), free(o_ref), free(s_ref), free(co),
        free(cs), free(qd), free(kd), free(vd), free(gd), free(bd), free(s.row_seg);
}

/* cache_put: dims (a = rkv, b = rope); layer 1's rows at each segment's positions; exact, the rest untouched */
static void case_cache(dbe *bes[2], const drow *r, k3c_rng *rng) {
    const k3c_dec_dims dd = {1, 16, 4, 0, 1, r->a, r->b};
    steps s;
    steps_make(&s, r, &dd);
    const int64_t rkv = dd.rkv, lw = dd.rkv + dd.rope, n = s.n, M = s.mtot;
    float *cn = randv(rng, (size_t)(n * rkv), 1.0), *kva = randv(rng, (size_t)(n * lw), 1.0), *mla = randv(rng, (size_t)M, 1.0);
    float *got = malloc(sizeof(float) * (size_t)M);
    double *ref = widen(mla, (size_t)M);
    int64_t mo = 0;
    for (int i = 0; i < s.nseg; i++) { /* layer j's token t at mla + (j·cap + t)·lw */
        const k3c_dec_seg *g = &s.seg[i];
        for (int64_t t = 0; t < g->len; t++) {
            double *row = ref + mo + (1 * g->cap + g->pos + t) * lw;
            for (int64_t e = 0; e < rkv; e++) row[e] = cn[(g->row0 + t) * rkv + e];
            for (int64_t e = rkv; e < lw; e++) row[e] = kva[(g->row0 + t) * lw + e];
        }
        mo += s.mblock[i];
    }
    for (int k = 0; k < 2 && bes[k]; k++) {
        dbe *b = bes[k];
        b->rows[r->op]++;
        k3c_dec_seg segs[MAXSEG];
        float *dm = dput(b, mla, sizeof(float) * (size_t)M);
        float *dcn = dput(b, cn, sizeof(float) * (size_t)(n * rkv)), *dkva = dput(b, kva, sizeof(float) * (size_t)(n * lw));
        k3c_dec_batch bt = steps_up(b, &s, NULL, dm, segs);
        k3c_err err = {0};
        int rc = b->bad ? K3C_ENOMEM : b->be->decode->cache_put(&bt, &s.dims, 1, dcn, dkva, &err);
        if (!rc) rc = b->be->sync(&err);
        dget(b, got, dm, sizeof(float) * (size_t)M);
        CHECK(rc == K3C_OK && !b->bad, "%s cache_put: %s %s", b->name, err.msg, b->msg);
        if (!rc && !b->bad) compare(b, r, "cache", got, ref, NULL, (size_t)M, 0);
        dfree_all(b);
    }
    free(cn), free(kva), free(mla), free(got), free(ref), free(s.row_seg);
}

/* attend: dims (a = Hm, b = rkv, c = rope); layer 1's cache valid up to each segment's pos + len, NaN past it and in
 * layer 0 (never read); against the materialised softmax in double */
static void case_attend(dbe *bes[2], const drow *r, k3c_rng *rng) {
    const k3c_dec_dims dd = {1, 16, 4, 0, r->a, r->b, r->c};
    steps s;
    steps_make(&s, r, &dd);
    const int64_t Hm = dd.Hm, rkv = dd.rkv, lw = rkv + dd.rope, n = s.n, M = s.mtot;
    const float scale = (float)(1.0 / sqrt((double)(lw)));
    float *mla = randv(rng, (size_t)M, 1.0), *qlat = randv(rng, (size_t)(Hm * n * lw), 1.0);
    int64_t mo = 0;
    for (int i = 0; i < s.nseg; i++) {
        const k3c_dec_seg *g = &s.seg[i];
        for (int64_t t = 0; t < 2 * g->cap; t++)
            if (t < g->cap || t - g->cap >= g->pos + g->len)
                for (int64_t e = 0; e < lw; e++) mla[mo + t * lw + e] = NAN;
        mo += s.mblock[i];
    }
    double *ref = calloc((size_t)(Hm * n * rkv), 8), *cpu = NULL, *p = malloc(sizeof(double) * 4096);
    mo = 0;
    for (int i = 0; i < s.nseg; i++) {
        const k3c_dec_seg *g = &s.seg[i];
        const float *cache = mla + mo + g->cap * lw;
        for (int64_t h = 0; h < Hm; h++)
            for (int64_t t = 0; t < g->len; t++) {
                const int64_t row = h * n + g->row0 + t, last = g->pos + t;
                double m = -INFINITY, z = 0;
                for (int64_t u = 0; u <= last; u++) {
                    double a = 0;
                    for (int64_t e = 0; e < lw; e++) a += (double)qlat[row * lw + e] * cache[u * lw + e];
                    p[u] = scale * a, m = p[u] > m ? p[u] : m;
                }
                for (int64_t u = 0; u <= last; u++) z += p[u] = exp(p[u] - m);
                for (int64_t u = 0; u <= last; u++)
                    for (int64_t e = 0; e < rkv; e++) ref[row * rkv + e] += p[u] / z * cache[u * lw + e];
            }
        mo += s.mblock[i];
    }
    float *o = malloc(sizeof(float) * (size_t)(Hm * n * rkv));
    for (int k = 0; k < 2 && bes[k]; k++) {
        dbe *b = bes[k];
        b->rows[r->op]++;
        k3c_dec_seg segs[MAXSEG];
        float *dm = dput(b, mla, sizeof(float) * (size_t)M), *dq = dput(b, qlat, sizeof(float) * (size_t)(Hm * n * lw));
        float *dO = dnan(b, (size_t)(Hm * n * rkv));
        void *ws = dput(b, NULL, b->be->decode->attend_workspace(&s.dims));
        k3c_dec_batch bt = steps_up(b, &s, NULL, dm, segs);
        k3c_err err = {0};
        int rc = b->bad ? K3C_ENOMEM : b->be->decode->attend(&bt, &s.dims, 1, dq, scale, dO, ws, &err);
        if (!rc) rc = b->be->sync(&err);
        dget(b, o, dO, sizeof(float) * (size_t)(Hm * n * rkv));
        CHECK(rc == K3C_OK && !b->bad, "%s attend: %s %s", b->name, err.msg, b->msg);
        if (!rc && !b->bad) compare(b, r, "olat", o, k ? cpu : ref, NULL, (size_t)(Hm * n * rkv), k ? r->tol_cuda : r->tol_cpu);
        if (k == 0) cpu = widen(o, (size_t)(Hm * n * rkv));
        dfree_all(b);
    }
    free(mla), free(qlat), free(ref), free(cpu), free(p), free(o), free(s.row_seg);
}

/* ---------------------------------------------------------------- moe, glu */
static k3c_glu_act act_of(const drow *r) {
    k3c_glu_act a = {r->flags & F_SITU ? K3C_ACT_SITU : K3C_ACT_SILU, r->flags & F_SITU ? 4.0 : 0,
                     r->flags & F_SITU ? 25.0 : 0};
    return a;
}

/* moe: a = E, b = k, c = lat, d = inter, e = n; against a per-token loop of the GLU experts in double */
static void case_moe(dbe *bes[2], const drow *r, k3c_rng *rng) {
    const int64_t E = r->a, kx = r->b, lat = r->c, I = r->d, n = r->e;
    qm w1, w3, w2;
    qm_make(&w1, rng, r->wtype, E, I, lat, 1.0 / sqrt((double)lat), 0);
    qm_make(&w3, rng, r->wtype, E, I, lat, 1.0 / sqrt((double)lat), 0);
    qm_make(&w2, rng, r->wtype, E, lat, I, 1.0 / sqrt((double)I), 0);
    float *x = randv(rng, (size_t)(n * lat), 1.0), *topw = malloc(sizeof(float) * (size_t)(n * kx));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n * kx));
    for (int64_t t = 0; t < n; t++) /* k distinct experts per token; expert E − 1 never chosen, expert 0 often */
        for (int64_t j = 0; j < kx; j++) {
            int32_t id, dup;
            do {
                id = (int32_t)(k3c_rng_uniform(rng) < 0.3 ? 0 : irand(rng, E - 1)), dup = 0;
                for (int64_t i = 0; i < j; i++) dup |= ids[t * kx + i] == id;
            } while (dup);
            ids[t * kx + j] = id, topw[t * kx + j] = (float)(0.2 + k3c_rng_uniform(rng));
        }
    const k3c_glu_act act = act_of(r);
    double *ref = calloc((size_t)(n * lat), 8), *gd = malloc(sizeof(double) * (size_t)(3 * I)), *ud = gd + I, *hd = ud + I,
           *cpu = NULL;
    k3c_err err = {0};
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < kx; j++) {
            const int64_t e = ids[t * kx + j];
            for (int64_t i = 0; i < I; i++) gd[i] = ud[i] = 0;
            ref_mul(w1.dec + e * I * lat, I, lat, x + t * lat, lat, 1, gd, I, 0);
            ref_mul(w3.dec + e * I * lat, I, lat, x + t * lat, lat, 1, ud, I, 0);
            k3c_glu_sizes gs = {1, I, act};
            CHECK_OK(k3c_glu_fwd_f64(&gs, gd, ud, hd, &err), &err);
            for (int64_t c = 0; c < lat; c++) {
                double a = 0;
                for (int64_t i = 0; i < I; i++) a += (double)w2.dec[(e * lat + c) * I + i] * hd[i];
                ref[t * lat + c] += topw[t * kx + j] * a;
            }
        }
    float *out = malloc(sizeof(float) * (size_t)(n * lat));
    for (int k = 0; k < 2 && bes[k]; k++) {
        dbe *b = bes[k];
        b->rows[r->op]++;
        k3c_qmat *v1 = qm_up(b, &w1), *v3 = qm_up(b, &w3), *v2 = qm_up(b, &w2);
        k3c_dec_moe m = {v1, v3, v2, E, kx, lat, I, act};
        float *dx = dput(b, x, sizeof(float) * (size_t)(n * lat)), *dw = dput(b, topw, sizeof(float) * (size_t)(n * kx));
        int32_t *di = dput(b, ids, sizeof(int32_t) * (size_t)(n * kx));
        float *dO = dnan(b, (size_t)(n * lat));
        void *ws = dput(b, NULL, b->be->decode->moe_workspace(&m, n));
        int rc = b->bad ? K3C_ENOMEM : b->be->decode->moe(&m, dx, n, di, dw, dO, ws, &err);
        if (!rc) rc = b->be->sync(&err);
        dget(b, out, dO, sizeof(float) * (size_t)(n * lat));
        CHECK(rc == K3C_OK && !b->bad, "%s moe: %s %s", b->name, err.msg, b->msg);
        if (!rc && !b->bad) compare(b, r, "out", out, k ? cpu : ref, NULL, (size_t)(n * lat), k ? r->tol_cuda : r->tol_cpu);
        if (k == 0) cpu = widen(out, (size_t)(n * lat));
        dfree_all(b), free(v1), free(v3), free(v2);
    }
    qm_free(&w1), qm_free(&w3), qm_free(&w2);
    free(x), free(topw), free(ids), free(ref), free(gd), free(cpu), free(out);
}

/* glu: a = rows, b = inter; against the training op's float64 form */
static void case_glu(dbe *bes[2], const drow *r, k3c_rng *rng) {
    const int64_t N = r->a, I = r->b;
    float *g = randv(rng, (size_t)(N * I), 3.0), *u = randv(rng, (size_t)(N * I), 10.0), *h = malloc(sizeof(float) * (size_t)(N * I));
    double *gd = widen(g, (size_t)(N * I)), *ud = widen(u, (size_t)(N * I)), *ref = malloc(sizeof(double) * (size_t)(N * I)),
           *cpu = NULL;
    k3c_glu_sizes gs = {N, I, act_of(r)};
    k3c_err err = {0};
    CHECK_OK(k3c_glu_fwd_f64(&gs, gd, ud, ref, &err), &err);
    for (int k = 0; k < 2 && bes[k]; k++) {
        dbe *b = bes[k];
        b->rows[r->op]++;
        float *dg = dput(b, g, sizeof(float) * (size_t)(N * I)), *du = dput(b, u, sizeof(float) * (size_t)(N * I));
        float *dh = dnan(b, (size_t)(N * I));
        int rc = b->bad ? K3C_ENOMEM : b->be->decode->glu(&gs, dg, du, dh, &err);
        if (!rc) rc = b->be->sync(&err);
        dget(b, h, dh, sizeof(float) * (size_t)(N * I));
        CHECK(rc == K3C_OK && !b->bad, "%s glu: %s %s", b->name, err.msg, b->msg);
        if (!rc && !b->bad) compare(b, r, "h", h, k ? cpu : ref, NULL, (size_t)(N * I), k ? r->tol_cuda : r->tol_cpu);
        if (k == 0) cpu = widen(h, (size_t)(N * I));
        dfree_all(b);
    }
    free(g), free(u), free(h), free(gd), free(ud), free(ref), free(cpu);
}

/* ---------------------------------------------------------------- graph_open / run / close */
typedef struct {
    const k3c_backend_f32 *be;
    const k3c_qmat *W;
    const float *X;
    float *Y;
    int64_t n;
    int fail;
} graph_arg;
static int graph_fn(void *p, k3c_err *err) {
    graph_arg *a = p;
    if (a->fail) return k3c_errf(err, K3C_EINVAL, "graph test: step refused");
    return a->be->decode->qmat_mul(a->be->ctx, a->W, a->X, a->n, a->Y, 0, err);
}

/* A step (one product into fixed buffers) run directly (key 0), then under key 3 three times with new inputs
 * uploaded in between (CUDA: captured once, replayed after, reading the new inputs at the same addresses), then a
 * failing step with key 0 and a fresh key: its status comes back. a = rows, b = cols, c = n. */
static void case_graph(dbe *bes[2], const drow *r, k3c_rng *rng) {
    const int64_t R = r->a, C = r->b, n = r->c;
    qm q;
    qm_make(&q, rng, K3C_QMAT_F32, 1, R, C, 1.0 / sqrt((double)C), 0);
    float *X[4], *Y = malloc(sizeof(float) * (size_t)(n * R));
    double *ref[4];
    for (int i = 0; i < 4; i++) {
        X[i] = randv(rng, (size_t)(n * C), 1.0), ref[i] = calloc((size_t)(n * R), 8);
        ref_mul(q.dec, R, C, X[i], C, n, ref[i], R, 0);
    }
    for (int k = 0; k < 2 && bes[k]; k++) {
        dbe *b = bes[k];
        b->rows[r->op]++;
        k3c_qmat *W = qm_up(b, &q);
        float *dX = dput(b, X[0], sizeof(float) * (size_t)(n * C)), *dY = dnan(b, (size_t)(n * R));
        void *g = b->be->decode->graph_open();
        graph_arg a = {b->be, W, dX, dY, n, 0};
        k3c_err err = {0};
        for (int i = 0; i < 4 && !b->bad; i++) {
            if (i > 0 && b->be->upload(dX, X[i], sizeof(float) * (size_t)(n * C), &err)) break;
            int rc = b->be->decode->run(g, i == 0 ? 0 : 3, graph_fn, &a, &err);
            if (!rc) rc = b->be->sync(&err);
            dget(b, Y, dY, sizeof(float) * (size_t)(n * R));
            CHECK(rc == K3C_OK && !b->bad, "%s graph run %d: %s %s", b->name, i, err.msg, b->msg);
            if (!rc && !b->bad)
                compare(b, r, i == 0 ? "direct" : i == 1 ? "capture" : "replay", Y, ref[i], NULL, (size_t)(n * R),
                        k ? r->tol_cuda : r->tol_cpu);
        }
        a.fail = 1;
        for (int key = 0; key <= 9; key += 9) {
            err.msg[0] = 0;
            int rc = b->be->decode->run(g, key, graph_fn, &a, &err);
            int pass = rc == K3C_EINVAL && strstr(err.msg, "step refused");
            pass ? b->passed[r->op]++ : b->failed[r->op]++;
            CHECK(pass, "%s graph: a failing step under key %d returns %s \"%s\"", b->name, key, k3c_status_name(rc),
                  err.msg);
        }
        b->be->decode->graph_close(g);
        b->be->sync(&err);
        dfree_all(b), free(W);
    }
    for (int i = 0; i < 4; i++) free(X[i]), free(ref[i]);
    qm_free(&q), free(Y);
}

/* ---------------------------------------------------------------- rows */
typedef struct {
    drow *v;
    int n, cap;
} drows;
static drow *add(drows *R, int op, int wtype, int64_t a, int64_t b, int64_t c, int64_t d, int64_t e, int flags,
                 double tc, double tg) {
    if (R->n == R->cap) R->v = realloc(R->v, sizeof(drow) * (size_t)(R->cap = R->cap ? 2 * R->cap : 64));
    drow *r = &R->v[R->n++];
    *r = (drow){op, wtype, a, b, c, d, e, flags, 0, 0, {0}, {0}, tc, tg};
    return r;
}
static drow *segs(drow *r, int nseg, const int64_t *len, const int64_t *pos) {
    r->nseg = nseg;
    for (int i = 0; i < nseg; i++) r->len[i] = len[i], r->pos[i] = pos[i];
    return r;
}

/* The step shapes: decode (every segment one token, at different positions), prefill (one segment of many tokens,
 * past the CPU's 16-token KDA chunk and its 64-row attention tile), mixed (several segments of different lengths at
 * different positions: a prompt continued, a decode token, a fresh prompt). */
static const int64_t dec_len[3] = {1, 1, 1}, dec_pos[3] = {0, 5, 17};
static const int64_t pre_len[1] = {37}, pre_pos[1] = {0}, long_len[1] = {70}, long_pos[1] = {3};
static const int64_t mix_len[4] = {1, 9, 4, 2}, mix_pos[4] = {12, 0, 3, 40};
static void with_steps(drows *R, drow proto) {
    *add(R, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0) = proto, segs(&R->v[R->n - 1], 3, dec_len, dec_pos);
    *add(R, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0) = proto, segs(&R->v[R->n - 1], 1, pre_len, pre_pos);
    *add(R, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0) = proto, segs(&R->v[R->n - 1], 4, mix_len, mix_pos);
}

static void add_rows(drows *R) {
    for (int t = 0; t < 3; t++) {
        /* products: the decode GEMV, a few rows, a GEMM's worth (CUDA: cuBLAS from 16 rows), accumulation */
        add(R, D_QMAT, t, 96, 256, 1, 0, 0, 0, TOL_ROW, TOL_CUDA);
        add(R, D_QMAT, t, 50, 96, 5, 0, 0, F_ACC, TOL_ROW, TOL_CUDA);
        add(R, D_QMAT, t, 64, 448, 17, 0, 0, 0, TOL_ROW, TOL_CUDA);
        if (t != K3C_QMAT_MXFP4) add(R, D_QMAT, t, 33, 70, 2, 0, 0, F_ACC, TOL_ROW, TOL_CUDA); /* cols % 4 != 0 */
        /* the product's paths by rows of X (1, 2, 8 | 9, 17 | CUDA bf16 / MXFP4: a GEMM on decoded rows from 32) and by
           shape, up to K3's 7168-wide rows; MXFP4 scales up to 2^8 */
        static const int64_t qs[6][2] = {{1, 32}, {37, 96}, {129, 1056}, {512, 512}, {1024, 1024}, {3, 7168}};
        static const int64_t qn[7] = {1, 2, 8, 9, 17, 33, 64};
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 7; j++)
                for (int acc = 0; acc < 2; acc++)
                    add(R, D_QMAT, t, qs[i][0], qs[i][1], qn[j], 0, 0,
                        (acc ? F_ACC : 0) | (t == K3C_QMAT_MXFP4 ? F_WIDE : 0), TOL_ROW, TOL_CUDA);
        static const int64_t odd[3] = {1, 13, 301}; /* widths no multiple of 32 */
        for (int i = 0; i < 3 && t != K3C_QMAT_MXFP4; i++)
            add(R, D_QMAT, t, 33, odd[i], 3, 0, 0, F_ACC, TOL_ROW, TOL_CUDA);
        if (t == K3C_QMAT_MXFP4) add(R, D_QMAT, t, 2, 48, 1, 0, 0, F_REFUSE, 0, 0); /* blocks of 32 only */
        /* CUDA: a view larger than one decoded chunk (16M floats), its rows in several GEMMs, the last one short */
        if (t != K3C_QMAT_F32) add(R, D_QMAT, t, 4104, 4096, 33, 0, 0, F_ACC, TOL_ROW, TOL_CUDA);
        /* batches: more jobs than one fused launch takes, decode and prefill, mixed row counts */
        add(R, D_MANY, t, 10, 40, 64, 1, 0, 0, TOL_ROW, TOL_CUDA);
        add(R, D_MANY, t, 5, 24, 96, 6, 0, F_MIXED, TOL_ROW, TOL_CUDA);
        /* per-head products in place: one launch (evenly spaced, few rows), the per-head fallback (many rows, uneven) */
        add(R, D_HEADS, t, 3, 24, 64, 1, 0, 0, TOL_ROW, TOL_CUDA);
        add(R, D_HEADS, t, 4, 16, 32, 5, 0, 0, TOL_ROW, TOL_CUDA);
        add(R, D_HEADS, t, 3, 24, 64, 20, 0, 0, TOL_ROW, TOL_CUDA);
        add(R, D_HEADS, t, 3, 24, 64, 3, 0, F_GAP, TOL_ROW, TOL_CUDA);
        /* embedding rows: a decode token, a prompt */
        add(R, D_EMBED, t, 300, 64, 1, 0, 0, 0, 0, 0);
        add(R, D_EMBED, t, 1000, 96, 57, 0, 0, 0, 0, 0);
        /* routed experts: a decode token, a prompt past one expert pass of 8 slots, SiTU with k = 4 */
        add(R, D_MOE, t, 8, 2, 64, 96, 1, 0, TOL_ROW, TOL_CUDA);
        add(R, D_MOE, t, 8, 2, 64, 96, 19, 0, TOL_ROW, TOL_CUDA);
        add(R, D_MOE, t, 16, 4, 96, 64, 6, F_SITU, TOL_ROW, TOL_CUDA);
    }
    /* the sequence mixing over every step shape: conv (K3's W 4, and W 2 where one token fills the tail), KDA
       (unbounded and bounded gates, dk 32 and 64), the latent cache and its attention */
    with_steps(R, (drow){.op = D_CONV, .wtype = -1, .a = 2, .b = 32, .c = 4, .tol_cpu = TOL_ROW, .tol_cuda = TOL_CUDA});
    with_steps(R, (drow){.op = D_CONV, .wtype = -1, .a = 3, .b = 16, .c = 2, .tol_cpu = TOL_ROW, .tol_cuda = TOL_CUDA});
    with_steps(R, (drow){.op = D_KDA, .wtype = -1, .a = 2, .b = 32, .tol_cpu = TOL_ROW, .tol_cuda = TOL_CUDA});
    with_steps(R, (drow){.op = D_KDA, .wtype = -1, .a = 1, .b = 64, .x = -5, .tol_cpu = TOL_ROW, .tol_cuda = TOL_CUDA});
    with_steps(R, (drow){.op = D_CACHE, .wtype = -1, .a = 64, .b = 16});
    with_steps(R, (drow){.op = D_ATTEND, .wtype = -1, .a = 3, .b = 64, .c = 16, .tol_cpu = TOL_ROW, .tol_cuda = TOL_CUDA});
    segs(add(R, D_ATTEND, -1, 2, 32, 8, 0, 0, 0, TOL_ROW, TOL_CUDA), 1, long_len, long_pos); /* two key tiles */
    add(R, D_GLU, -1, 1, 96, 0, 0, 0, 0, TOL_ROW, TOL_CUDA);
    add(R, D_GLU, -1, 37, 200, 0, 0, 0, F_SITU, TOL_ROW, TOL_CUDA);
    add(R, D_GRAPH, -1, 48, 64, 1, 0, 0, 0, TOL_ROW, TOL_CUDA);
}

static void run_row(dbe *bes[2], const drow *r, k3c_rng *rng) {
    switch (r->op) {
    case D_QMAT: case_qmat(bes, r, rng); break;
    case D_MANY: case_many(bes, r, rng); break;
    case D_HEADS: case_heads(bes, r, rng); break;
    case D_EMBED: case_embed(bes, r, rng); break;
    case D_CONV: case_conv(bes, r, rng); break;
    case D_KDA: case_kda(bes, r, rng); break;
    case D_CACHE: case_cache(bes, r, rng); break;
    case D_ATTEND: case_attend(bes, r, rng); break;
    case D_MOE: case_moe(bes, r, rng); break;
    case D_GLU: case_glu(bes, r, rng); break;
    case D_GRAPH: case_graph(bes, r, rng); break;
    }
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0)
                    : getenv("K3C_SEED") ? strtoull(getenv("K3C_SEED"), NULL, 0)
                                         : (uint64_t)20261207; /* make test is reproducible; the GPU runs pass a fresh
                                                                  seed (tools/device_cuda.sh) */
    printf("test_backend_ops_decode: seed %llu (repeat with K3C_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    static dbe cpu = {.name = "cpu"};
    cpu.be = k3c_backend_cpu_f32();
    dbe *bes[2] = {&cpu, NULL};
    CHECK(cpu.be->decode == &k3c_dec_cpu && k3c_backend_cpu_f64()->decode == NULL,
          "the CPU float table's decode entry is k3c_dec_cpu; the double table has none");
#ifdef K3C_CUDA
    static k3c_cuda_backend cb;
    static dbe cuda = {.name = "cuda", .cuda = 1};
    k3c_err cerr = {0};
    if (k3c_cuda_backend_init(&cb, 0, K3C_GEMM_FP32, &cerr) == K3C_OK) {
        cuda.be = &cb.table, bes[1] = &cuda;
        CHECK(cb.table.decode != NULL, "the CUDA table has a decode entry");
        printf("CUDA backend on %s: every row also runs on it against the CPU decode table\n", cb.cu.name);
    } else
        printf("built with CUDA but no usable GPU (%s): CPU rows only\n", cerr.msg);
#endif
    drows R = {0};
    add_rows(&R);
    k3c_rng rng = {seed, 0};
    for (int i = 0; i < R.n; i++) run_row(bes, &R.v[i], &rng);
    for (int k = 0; k < 2; k++) {
        if (!bes[k]) continue;
        printf("%s against %s:\n", bes[k]->name, k ? "the CPU table" : "double references");
        for (int op = 0; op < D_COUNT; op++)
            printf("  %-10s %4d cases  %5d checks passed  %d failed\n", dop_names[op], bes[k]->rows[op],
                   bes[k]->passed[op], bes[k]->failed[op]);
    }
#ifdef K3C_CUDA
    if (bes[1]) k3c_cuda_backend_destroy(&cb);
#endif
    free(R.v);
    return test_summary();
}
