/* qmat_simd.c — the vectorised products over weight views (AVX2/FMA): bf16 widened by a shift and MXFP4 decoded in
 * registers (E2M1 nibbles through a pshufb table, one E8M0 scale per 32 inputs). Implements docs/FORMATS.md §6. */
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

/* The table holds 2·E2M1 as int8 (integers, so pshufb can hold them); the half goes into the group scale:
 * 0.5 · 2^(s − 127) as float bits. s = 0 and 1 give the subnormals 2^−128 and 2^−127, as ldexp would. */
static inline float half_scale(uint8_t s) {
    uint32_t b = s >= 2 ? (uint32_t)(s - 1) << 23 : 0x00200000u << s;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* 32 columns of one MXFP4 row (16 packed bytes, low nibble = even column) → 2·E2M1 in column order, 4 × 8 floats. */
static inline void mx_decode32(const uint8_t *p, __m256 w[4]) {
    const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i m = _mm_set1_epi8(15);
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(v, m));
    __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(v, 4), m));
    __m128i a = _mm_unpacklo_epi8(lo, hi), b = _mm_unpackhi_epi8(lo, hi);
    w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a));
    w[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8)));
    w[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    w[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
}

/* ---------------------------------------------------------------- one stored row · one input */
static float dot_bf16(const uint16_t *w, const float *x, int64_t C) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t c = 0;
    for (; c + 32 <= C; c += 32) {
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

/* Per group: the 32 products in integer-valued weights, then one multiply-add by the group's scale. Two groups per
 * step, each with its own accumulator, so the scale FMAs do not wait on each other. */
static inline __m256 group_dot(const uint8_t *p, const float *x) {
    __m256 w[4];
    mx_decode32(p, w);
    __m256 t = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
    t = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), t);
    t = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), t);
    return _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), t);
}

static float dot_mxfp4(const uint8_t *p, const uint8_t *s, const float *x, int64_t C) {
    const int64_t G = C / K3C_MXFP4_GROUP, H = K3C_MXFP4_GROUP / 2;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t g = 0;
    for (; g + 2 <= G; g += 2) {
        __m256 t0 = group_dot(p + g * H, x + g * K3C_MXFP4_GROUP);
        __m256 t1 = group_dot(p + (g + 1) * H, x + (g + 1) * K3C_MXFP4_GROUP);
        a0 = _mm256_fmadd_ps(t0, _mm256_set1_ps(half_scale(s[g])), a0);
        a1 = _mm256_fmadd_ps(t1, _mm256_set1_ps(half_scale(s[g + 1])), a1);
    }
    if (g < G)
        a0 = _mm256_fmadd_ps(group_dot(p + g * H, x + g * K3C_MXFP4_GROUP), _mm256_set1_ps(half_scale(s[g])), a0);
    return hsum(_mm256_add_ps(a0, a1));
}

static float row_dot(const k3c_qmat *W, int64_t r, const float *x) {
    const int64_t C = W->cols;
    if (W->type == K3C_QMAT_BF16) return dot_bf16((const uint16_t *)W->w + r * C, x, C);
    return dot_mxfp4((const uint8_t *)W->w + r * (C / 2), W->scale + r * (C / K3C_MXFP4_GROUP), x, C);
}

static void put(float *y, float d, int accumulate) { *y = accumulate ? *y + d : d; }

/* Up to GEMM_MIN_N inputs (decode, batched decode): each row is read from memory once and stays in L1 while every
 * input takes its dot product with it, in the same order as a lone input would: a sequence's results do not depend on
 * which others share the step. */
static void gemv_rows(const k3c_qmat *W, const float *X, int64_t n, float *Y, int accumulate) {
    const int64_t R = W->rows, C = W->cols;
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && R * C >= PAR_MIN_WEIGHTS)
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < n; j++) put(&Y[j * R + r], row_dot(W, r, X + j * C), accumulate);
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
        __m256 w[4], m = _mm256_set1_ps(half_scale(s[g]));
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

#else /* no AVX2: the reference is the product */
void k3c_qmat_mul(const k3c_qmat *W, const float *X, int64_t n, float *Y, int accumulate) {
    k3c_qmat_mul_ref(W, X, n, Y, accumulate);
}
#endif
