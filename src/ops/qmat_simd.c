/* qmat_simd.c — the vectorised products over weight views (AVX2/FMA): bf16 widened by a shift and MXFP4 decoded in
 * registers (E2M1 nibbles through a pshufb table to fp16, one E8M0 scale per 32 inputs). Implements docs/FORMATS.md §6. */
#include "ops/mxfp4.h"
#include "ops/qmat.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* Below this many weights a product runs on one thread: waking the team costs more than it saves. */
#define PAR_MIN_WEIGHTS 32768
/* From this many inputs on (prefill), decoded tiles of up to GEMM_TILE_BYTES go through BLAS. */
#define GEMM_MIN_N 32
#define GEMM_TILE_BYTES ((size_t)1 << 20)

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 bf16x8(const uint16_t *p) {
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

/* 2^(s − 127) as float bits (UE8M0; s = 0 gives the subnormal 2^−127, as ldexp would). */
static inline float e8m0_scale(uint8_t s) {
    uint32_t b = s ? (uint32_t)s << 23 : 0x00400000u;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* 32 columns of one MXFP4 row (16 packed bytes, low nibble = even column) → E2M1 in column order, 4 × 8 floats. Every
 * E2M1 value is an fp16 whose low byte is zero, so one pshufb gives the high bytes and F16C widens them: the nibbles are
 * interleaved into column order first (bytes), then each lands in the high byte of a 16-bit word. Nibble 8 (−0) → +0. */
static inline void mx_decode32(const uint8_t *p, __m256 w[4]) {
    const __m128i lut = _mm_setr_epi8(0, 0x38, 0x3c, 0x3e, 0x40, 0x42, 0x44, 0x46, 0, (char)0xb8, (char)0xbc,
                                      (char)0xbe, (char)0xc0, (char)0xc2, (char)0xc4, (char)0xc6);
    const __m128i m = _mm_set1_epi8(15), z = _mm_setzero_si128();
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    const __m128i h0 = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi)),
                  h1 = _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi));
    w[0] = _mm256_cvtph_ps(_mm_unpacklo_epi8(z, h0));
    w[1] = _mm256_cvtph_ps(_mm_unpackhi_epi8(z, h0));
    w[2] = _mm256_cvtph_ps(_mm_unpacklo_epi8(z, h1));
    w[3] = _mm256_cvtph_ps(_mm_unpackhi_epi8(z, h1));
}

/* ---------------------------------------------------------------- one stored row · one input */
/* A decode GEMV uses every weight byte once: the row is read as one sequential stream with a software prefetch
 * PREFETCH bytes ahead (crossing into the next row, which follows in memory), which keeps more lines in flight than
 * the hardware prefetcher alone (closer to a plain streaming sum's rate; 4 or 2 interleaved rows per pass were
 * slower: several streams at once defeat the prefetchers). */
#define PREFETCH 1024

__attribute__((noinline)) static float dot_bf16(const uint16_t *w, const float *x, int64_t C) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t c = 0;
    for (; c + 32 <= C; c += 32) {
        _mm_prefetch((const char *)(w + c) + PREFETCH, _MM_HINT_T0);
        a0 = _mm256_fmadd_ps(bf16x8(w + c), _mm256_loadu_ps(x + c), a0);
        a1 = _mm256_fmadd_ps(bf16x8(w + c + 8), _mm256_loadu_ps(x + c + 8), a1);
        a2 = _mm256_fmadd_ps(bf16x8(w + c + 16), _mm256_loadu_ps(x + c + 16), a2);
        a3 = _mm256_fmadd_ps(bf16x8(w + c + 24), _mm256_loadu_ps(x + c + 24), a3);
    }
    for (; c + 8 <= C; c += 8) a0 = _mm256_fmadd_ps(bf16x8(w + c), _mm256_loadu_ps(x + c), a0);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; c < C; c++) s += k3c_bf16_to_f32(w[c]) * x[c];
    return s;
}

/* One group's 32 products in E2M1 values (two partial sums, so the chain is short), before its scale. */
static inline __m256 group_dot(const uint8_t *p, const float *x) {
    __m256 w[4];
    mx_decode32(p, w);
    __m256 t0 = _mm256_mul_ps(w[0], _mm256_loadu_ps(x)), t1 = _mm256_mul_ps(w[1], _mm256_loadu_ps(x + 8));
    t0 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), t0);
    t1 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), t1);
    return _mm256_add_ps(t0, t1);
}

/* Per group: the products, then one multiply-add by the group's scale; two groups per step, each with its own
 * accumulator, so the scale FMAs do not wait on each other. */
__attribute__((noinline)) static float dot_mxfp4(const uint8_t *p, const uint8_t *s, const float *x, int64_t C) {
    const int64_t G = C / K3C_MXFP4_GROUP, H = K3C_MXFP4_GROUP / 2;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t g = 0;
    for (; g + 2 <= G; g += 2) {
        _mm_prefetch((const char *)(p + g * H) + PREFETCH / 2, _MM_HINT_T0);
        __m256 t0 = group_dot(p + g * H, x + g * K3C_MXFP4_GROUP);
        __m256 t1 = group_dot(p + (g + 1) * H, x + (g + 1) * K3C_MXFP4_GROUP);
        a0 = _mm256_fmadd_ps(t0, _mm256_set1_ps(e8m0_scale(s[g])), a0);
        a1 = _mm256_fmadd_ps(t1, _mm256_set1_ps(e8m0_scale(s[g + 1])), a1);
    }
    if (g < G)
        a0 = _mm256_fmadd_ps(group_dot(p + g * H, x + g * K3C_MXFP4_GROUP), _mm256_set1_ps(e8m0_scale(s[g])), a0);
    return hsum(_mm256_add_ps(a0, a1));
}

/* ---------------------------------------------------------------- MXFP4 · an input permuted for it (decode) */
/* The fast MXFP4 GEMV decodes two groups (64 columns, 32 bytes) per step in 256-bit registers, one group per 128-bit
 * lane, never crossing lanes: even and odd nibbles go through two pshufb tables (the high and low byte of the E2M1 value
 * as bf16), byte and word unpacks with zero make floats. The columns come out in the order
 *   vector k (0..7), lane L, element i  ←  column (g + L)·32 + [0, 8, 16, 24][k mod 4] + (k ≥ 4) + 2i,
 * so the input is permuted into that order once per product (perm_mx), not per row. ~20 instructions decode 64 weights
 * (the column-order decode above: ~40), which is what bounds an MXFP4 GEMV on one core. */
#define XP_FLOATS 8192 /* stack room for permuted inputs (32 KiB); wider rows use dot_mxfp4 */

static int64_t mx_padded(int64_t C) { return (C + 63) / 64 * 64; }

/* x[C] → xp[mx_padded(C)] in the decode order, zero past C (an odd last group pairs with a zero group). */
static void perm_mx(const float *x, int64_t C, float *xp) {
    const int64_t Cp = mx_padded(C);
    for (int64_t b = 0; b < Cp; b += 64)
        for (int k = 0; k < 8; k++)
            for (int L = 0; L < 2; L++)
                for (int i = 0; i < 4; i++) {
                    const int64_t c = b + L * 32 + (k & 3) * 8 + (k >> 2) + 2 * i;
                    xp[b + k * 8 + L * 4 + i] = c < C ? x[c] : 0.0f;
                }
}

__attribute__((noinline)) static float dot_mxfp4_perm(const uint8_t *p, const uint8_t *s, const float *xp, int64_t C) {
    const __m256i lut_h = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 0x3f, 0x3f, 0x3f, 0x40, 0x40, 0x40, 0x40, 0,
                                                                    (char)0xbf, (char)0xbf, (char)0xbf, (char)0xc0,
                                                                    (char)0xc0, (char)0xc0, (char)0xc0));
    const __m256i lut_l =
        _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 0, (char)0x80, (char)0xc0, 0, 0x40, (char)0x80, (char)0xc0, 0, 0,
                                                  (char)0x80, (char)0xc0, 0, 0x40, (char)0x80, (char)0xc0));
    const __m256i m = _mm256_set1_epi8(15), z = _mm256_setzero_si256();
    const int64_t G = C / K3C_MXFP4_GROUP;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g += 2, p += 32, xp += 64) {
        const int pair = g + 1 < G;
        _mm_prefetch((const char *)p + PREFETCH / 2, _MM_HINT_T0);
        const __m256i v =
            pair ? _mm256_loadu_si256((const __m256i *)p) : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)p));
        const __m256i lo = _mm256_and_si256(v, m), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
        const __m256i el = _mm256_shuffle_epi8(lut_l, lo), eh = _mm256_shuffle_epi8(lut_h, lo);
        const __m256i ol = _mm256_shuffle_epi8(lut_l, hi), oh = _mm256_shuffle_epi8(lut_h, hi);
        const __m256i w16[4] = {_mm256_unpacklo_epi8(el, eh), _mm256_unpackhi_epi8(el, eh),
                                _mm256_unpacklo_epi8(ol, oh), _mm256_unpackhi_epi8(ol, oh)};
        __m256 t0 = _mm256_setzero_ps(), t1 = t0;
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            t0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, w16[k])), _mm256_loadu_ps(xp + 16 * k),
                                 t0);
            t1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(z, w16[k])),
                                 _mm256_loadu_ps(xp + 16 * k + 8), t1);
        }
        const __m256 sc =
            _mm256_set_m128(_mm_set1_ps(pair ? e8m0_scale(s[g + 1]) : 0.0f), _mm_set1_ps(e8m0_scale(s[g])));
        acc = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), sc, acc);
    }
    return hsum(acc);
}

static float row_dot(const k3c_qmat *W, int64_t r, const float *x) {
    const int64_t C = W->cols;
    if (W->type == K3C_QMAT_BF16) return dot_bf16((const uint16_t *)W->w + r * C, x, C);
    return dot_mxfp4((const uint8_t *)W->w + r * (C / 2), W->scale + r * (C / K3C_MXFP4_GROUP), x, C);
}

static void put(float *y, float d, int accumulate) { *y = accumulate ? *y + d : d; }

/* ---------------------------------------------------------------- GEMV jobs (decode, batched decode) */
/* Up to GEMM_MIN_N inputs: each row is read from memory once and stays in L1 while every input takes its dot product
 * with it, in the same order as a lone input would: a sequence's results do not depend on which others share the step,
 * nor on the thread count or on which jobs share a parallel region. Several products (the top-k experts of a layer, the
 * projections that read the same input) run as one region over (job, block of rows) items, so two threads share the
 * work of a layer with one fork/join instead of one per 512-row matrix. */
#define BATCH_JOBS 64 /* jobs per parallel region */
#define ITEM_ROWS 32  /* rows per work item */

static int fast_mx(const k3c_qmat *W) { return W->type == K3C_QMAT_MXFP4 && mx_padded(W->cols) <= XP_FLOATS; }

/* Rows [r0, r1) of one job; xp: its permuted inputs (MXFP4 fast path) or NULL. */
static void job_rows(const k3c_qmat_job *J, const float *xp, int64_t r0, int64_t r1) {
    const k3c_qmat *W = J->W;
    const int64_t R = W->rows, C = W->cols, Cp = mx_padded(C), G = C / K3C_MXFP4_GROUP;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t j = 0; j < J->n; j++) {
            const float d = xp ? dot_mxfp4_perm((const uint8_t *)W->w + r * (C / 2), W->scale + r * G, xp + j * Cp, C)
                               : row_dot(W, r, J->X + j * C);
            put(&J->Y[j * R + r], d, J->accumulate);
        }
}

/* One parallel region over jobs[0, nj): their MXFP4 inputs permuted into xp (sized by the caller), then the items. */
static void run_batch(const k3c_qmat_job *jobs, int nj, float *xp) {
    const float *xps[BATCH_JOBS];
    int64_t first[BATCH_JOBS + 1], weights = 0, used = 0;
    first[0] = 0;
    for (int i = 0; i < nj; i++) {
        const k3c_qmat *W = jobs[i].W;
        xps[i] = NULL;
        if (fast_mx(W)) {
            const int64_t Cp = mx_padded(W->cols);
            for (int64_t j = 0; j < jobs[i].n; j++) perm_mx(jobs[i].X + j * W->cols, W->cols, xp + used + j * Cp);
            xps[i] = xp + used;
            used += jobs[i].n * Cp;
        }
        first[i + 1] = first[i] + (W->rows + ITEM_ROWS - 1) / ITEM_ROWS;
        weights += W->rows * W->cols * jobs[i].n;
    }
#pragma omp parallel for schedule(dynamic, 1) if (!omp_in_parallel() && weights >= PAR_MIN_WEIGHTS)
    for (int64_t it = 0; it < first[nj]; it++) {
        int i = 0;
        while (first[i + 1] <= it) i++;
        const int64_t r0 = (it - first[i]) * ITEM_ROWS, R = jobs[i].W->rows;
        job_rows(&jobs[i], xps[i], r0, r0 + ITEM_ROWS < R ? r0 + ITEM_ROWS : R);
    }
}

/* One GEMV job, its inputs in batches whose permuted copies fit the stack buffer (each batch reads the rows again). */
static void gemv_rows(const k3c_qmat *W, const float *X, int64_t n, float *Y, int accumulate) {
    float xp[XP_FLOATS];
    const int64_t per = fast_mx(W) ? XP_FLOATS / mx_padded(W->cols) : n;
    for (int64_t j0 = 0; j0 < n; j0 += per) {
        const k3c_qmat_job J = {W, X + j0 * W->cols, n - j0 < per ? n - j0 : per, Y + j0 * W->rows, accumulate};
        run_batch(&J, 1, xp);
    }
}

/* ---------------------------------------------------------------- decoded tiles through BLAS (prefill) */
/* Decodes rows [r0, r0 + nr) into out[nr, cols] (exact: bf16 and E2M1 · 2^k are floats). */
static void decode_rows(const k3c_qmat *W, int64_t r0, int64_t nr, float *out) {
    const int64_t C = W->cols;
    if (W->type == K3C_QMAT_BF16) {
        const uint16_t *w = (const uint16_t *)W->w + r0 * C;
        int64_t i = 0;
        for (; i + 8 <= nr * C; i += 8) _mm256_storeu_ps(out + i, bf16x8(w + i));
        for (; i < nr * C; i++) out[i] = k3c_bf16_to_f32(w[i]);
        return;
    }
    const int64_t G = nr * C / K3C_MXFP4_GROUP;
    const uint8_t *p = (const uint8_t *)W->w + r0 * (C / 2), *s = W->scale + r0 * (C / K3C_MXFP4_GROUP);
    for (int64_t g = 0; g < G; g++) {
        __m256 w[4], m = _mm256_set1_ps(e8m0_scale(s[g]));
        float *o = out + g * K3C_MXFP4_GROUP;
        mx_decode32(p + g * (K3C_MXFP4_GROUP / 2), w);
        _mm256_storeu_ps(o, _mm256_mul_ps(w[0], m));
        _mm256_storeu_ps(o + 8, _mm256_mul_ps(w[1], m));
        _mm256_storeu_ps(o + 16, _mm256_mul_ps(w[2], m));
        _mm256_storeu_ps(o + 24, _mm256_mul_ps(w[3], m));
    }
}

/* Prefill (n ≥ GEMM_MIN_N): each thread decodes tiles of rows (up to GEMM_TILE_BYTES) into its own buffer and hands
 * tile × all n inputs to BLAS, so each stored row is read from memory once. Rows wider than a tile, or no memory for
 * one: row by row. */
static void gemm_tiled(const k3c_qmat *W, const float *X, int64_t n, float *Y, int accumulate) {
    const int64_t R = W->rows, C = W->cols;
    const int64_t cap = (int64_t)(GEMM_TILE_BYTES / sizeof(float)), rb = C <= cap ? cap / C : 1, nt = (R + rb - 1) / rb;
#pragma omp parallel if (!omp_in_parallel() && R * C >= PAR_MIN_WEIGHTS)
    {
        float *wt = C <= cap ? malloc(sizeof(float) * (size_t)(rb * C)) : NULL;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < nt; t++) {
            int64_t r0 = t * rb, nr = R - r0 < rb ? R - r0 : rb;
            if (wt) {
                decode_rows(W, r0, nr, wt);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)nr, (int)C, 1.0f, X, (int)C, wt,
                            (int)C, accumulate ? 1.0f : 0.0f, Y + r0, (int)R);
            } else {
                for (int64_t r = r0; r < r0 + nr; r++)
                    for (int64_t j = 0; j < n; j++) put(&Y[j * R + r], row_dot(W, r, X + j * C), accumulate);
            }
        }
        free(wt);
    }
}

/* Float32 views stay on BLAS for every n: that is the training forward's order, which the engine's float32 results are
 * compared with, and BLAS reads the matrix once for all n. */
void k3c_qmat_mul(const k3c_qmat *W, const float *X, int64_t n, float *Y, int accumulate) {
    if (W->type == K3C_QMAT_F32)
        k3c_qmat_mul_ref(W, X, n, Y, accumulate);
    else if (n < GEMM_MIN_N)
        gemv_rows(W, X, n, Y, accumulate);
    else
        gemm_tiled(W, X, n, Y, accumulate);
}

/* GEMV jobs go into batches (up to BATCH_JOBS, their permuted inputs within XP_FLOATS); any other job runs alone. */
void k3c_qmat_mul_many(const k3c_qmat_job *jobs, int njobs) {
    float xp[XP_FLOATS];
    int b0 = 0;
    int64_t used = 0;
    for (int i = 0; i <= njobs; i++) {
        const k3c_qmat_job *J = &jobs[i];
        const int gemv = i < njobs && J->W->type != K3C_QMAT_F32 && J->n < GEMM_MIN_N;
        const int64_t need = gemv && fast_mx(J->W) ? J->n * mx_padded(J->W->cols) : 0;
        if (i == njobs || !gemv || need > XP_FLOATS || used + need > XP_FLOATS || i - b0 == BATCH_JOBS) {
            if (i > b0) run_batch(jobs + b0, i - b0, xp);
            b0 = i, used = 0;
        }
        if (i == njobs) break;
        if (!gemv || need > XP_FLOATS) {
            k3c_qmat_mul(J->W, J->X, J->n, J->Y, J->accumulate);
            b0 = i + 1;
        } else {
            used += need;
        }
    }
}

#else /* no AVX2: the reference is the product */
void k3c_qmat_mul(const k3c_qmat *W, const float *X, int64_t n, float *Y, int accumulate) {
    k3c_qmat_mul_ref(W, X, n, Y, accumulate);
}

void k3c_qmat_mul_many(const k3c_qmat_job *jobs, int njobs) {
    for (int i = 0; i < njobs; i++) k3c_qmat_mul_ref(jobs[i].W, jobs[i].X, jobs[i].n, jobs[i].Y, jobs[i].accumulate);
}
#endif
