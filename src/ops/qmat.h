/* qmat.h — a weight matrix kept as the checkpoint stores it (float32, bf16, or MXFP4 packed) and the products the
 * inference engine needs from it, decoding inside the product. Implements docs/FORMATS.md §6 (MXFP4), used by src/serve/. */
#ifndef K3C_OPS_QMAT_H
#define K3C_OPS_QMAT_H

#include "base/base.h"

typedef enum {
    K3C_QMAT_F32 = 0, /* w: float [rows, cols] row-major */
    K3C_QMAT_BF16,    /* w: uint16 bf16 [rows, cols] row-major */
    K3C_QMAT_MXFP4,   /* w: packed U8 [rows, cols/2] (low nibble = even column), scale: UE8M0 U8 [rows, cols/32] */
    K3C_QMAT_F64,     /* w: double [rows, cols]: a float64 model's parameters, read by its training path only */
} k3c_qmat_type;

/* A view: the matrix does not own its storage (it points into a loaded or mmap'd checkpoint, or model parameters). */
typedef struct {
    int type; /* k3c_qmat_type */
    int64_t rows, cols;
    const void *w;
    const uint8_t *scale; /* MXFP4 only */
} k3c_qmat;

/* Checks the view: a known type, rows ≥ 1, cols ≥ 1 (a multiple of 32 for MXFP4), storage present. */
int k3c_qmat_check(const k3c_qmat *W, const char *what, k3c_err *err);

/* Y[n, rows] = X[n, cols] · Wᵀ, float accumulation; accumulate != 0 adds into Y. n = 1 is the decode GEMV.
 * Threads over rows (OpenMP) unless called inside a parallel region. The vectorised kernels (qmat_simd.c, AVX2/FMA):
 * they decode bf16 / E2M1+E8M0 in registers, read each weight row once for all n inputs, and never keep a decoded
 * copy beyond a per-thread tile of a few rows. Results equal k3c_qmat_mul_ref up to the order of float summation. */
void k3c_qmat_mul(const k3c_qmat *W, const float *X, int64_t n, float *Y, int accumulate);

/* One product of a batch: Y[n, W->rows] (+)= X[n, W->cols] · Wᵀ. */
typedef struct {
    const k3c_qmat *W;
    const float *X;
    int64_t n;
    float *Y;
    int accumulate;
} k3c_qmat_job;

/* The jobs' products, each equal bit for bit to k3c_qmat_mul of that job alone; the decode GEMVs among them share one
 * parallel region (work items: job × block of rows) instead of one each. Jobs must not write what another reads. */
void k3c_qmat_mul_many(const k3c_qmat_job *jobs, int njobs);

/* The scalar reference product (decode a row, then plain dot products; BLAS for float32): the kernels' oracle. */
void k3c_qmat_mul_ref(const k3c_qmat *W, const float *X, int64_t n, float *Y, int accumulate);

/* Decodes row r of W into out[cols] (the embedding lookup of a bf16 or float table). */
void k3c_qmat_row(const k3c_qmat *W, int64_t r, float *out);

#endif
