/* qmat.c — the view check, row decode and the reference products over float32 / bf16 / MXFP4 weight views: BLAS for
 * float32, a row-by-row decode for the stored formats. Implements docs/FORMATS.md §6; qmat_simd.c must match these. */
#include "ops/qmat.h"
#include "ops/mxfp4.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

int k3c_qmat_check(const k3c_qmat *W, const char *what, k3c_err *err) {
    if (!W || !W->w) return k3c_errf(err, K3C_EINVAL, "%s: no weight storage", what);
    if (W->type < K3C_QMAT_F32 || W->type > K3C_QMAT_MXFP4)
        return k3c_errf(err, K3C_EINVAL, "%s: unknown weight type %d", what, W->type);
    if (W->rows < 1 || W->cols < 1)
        return k3c_errf(err, K3C_EINVAL, "%s: shape [%lld, %lld] is empty", what, (long long)W->rows,
                        (long long)W->cols);
    if (W->type == K3C_QMAT_MXFP4 && (W->cols % K3C_MXFP4_GROUP || !W->scale))
        return k3c_errf(err, K3C_EINVAL, "%s: MXFP4 needs cols (%lld) a multiple of %d and a scale tensor", what,
                        (long long)W->cols, K3C_MXFP4_GROUP);
    return 0;
}

void k3c_qmat_row(const k3c_qmat *W, int64_t r, float *out) {
    const int64_t C = W->cols;
    if (W->type == K3C_QMAT_F32) {
        memcpy(out, (const float *)W->w + r * C, sizeof(float) * (size_t)C);
    } else if (W->type == K3C_QMAT_BF16) {
        const uint16_t *w = (const uint16_t *)W->w + r * C;
        for (int64_t c = 0; c < C; c++) out[c] = k3c_bf16_to_f32(w[c]);
    } else {
        const uint8_t *p = (const uint8_t *)W->w + r * (C / 2), *s = W->scale + r * (C / K3C_MXFP4_GROUP);
        for (int64_t c = 0; c < C; c += 2) {
            float mult = ldexpf(1.0f, (int)s[c / K3C_MXFP4_GROUP] - 127);
            out[c] = k3c_mxfp4_e2m1(p[c / 2] & 15u) * mult;
            out[c + 1] = k3c_mxfp4_e2m1(p[c / 2] >> 4) * mult;
        }
    }
}

/* The stored formats: decode one row at a time into a per-thread buffer, then a dot product per input row. */
static void mul_decoded(const k3c_qmat *W, const float *X, int64_t n, float *Y, int accumulate) {
    const int64_t R = W->rows, C = W->cols;
#pragma omp parallel if (!omp_in_parallel() && R * C * n > 65536)
    {
        float *row = malloc(sizeof(float) * (size_t)C);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++) {
            k3c_qmat_row(W, r, row);
            for (int64_t i = 0; i < n; i++) {
                const float *x = X + i * C;
                double acc = 0; /* the reference sums in double: the kernels are held to it, not the other way */
                for (int64_t c = 0; c < C; c++) acc += (double)row[c] * x[c];
                Y[i * R + r] = accumulate ? (float)(Y[i * R + r] + acc) : (float)acc;
            }
        }
        free(row);
    }
}

void k3c_qmat_mul_ref(const k3c_qmat *W, const float *X, int64_t n, float *Y, int accumulate) {
    if (W->type != K3C_QMAT_F32) {
        mul_decoded(W, X, n, Y, accumulate);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)W->rows, (int)W->cols, 1.0f, X, (int)W->cols,
                (const float *)W->w, (int)W->cols, accumulate ? 1.0f : 0.0f, Y, (int)W->rows);
}
