/* linear.c — the bias-free linear layer y = x Wᵀ with the checkpoint layout W[out, in], its backward, and a row-major
 * GEMM helper, all through cblas_rgemm (OpenBLAS). Spec: docs/MODEL.md §1.1, §3.1 step 1, §4.2 (projections). */
#include "base/real.h"
#include "ops/basic.h"

#include <limits.h>
#include <string.h>

int k3c_matmul(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, double alpha, const real *A, const real *B,
               double beta, real *C, k3c_err *err) {
    if (M < 0 || N < 0 || K < 0 || M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return k3c_errf(err, K3C_EINVAL, "matmul: sizes M %lld N %lld K %lld outside [0, INT_MAX]", (long long)M,
                        (long long)N, (long long)K);
    if (M == 0 || N == 0) return K3C_OK;
    if (K == 0) { /* BLAS rejects a zero leading dimension; the product is empty, so only beta acts */
        if (beta == 0)
            memset(C, 0, (size_t)(M * N) * sizeof(real));
        else if (beta != 1)
            for (int64_t i = 0; i < M * N; i++) C[i] = (real)(beta * C[i]);
        return K3C_OK;
    }
    cblas_rgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                (int)K, (real)alpha, A, (int)(trans_a ? M : K), B, (int)(trans_b ? K : N), (real)beta, C, (int)N);
    return K3C_OK;
}

static int check_sizes(const k3c_linear_sizes *s, const char *op, k3c_err *err) {
    if (!s || s->T < 0 || s->in < 0 || s->out < 0) return k3c_errf(err, K3C_EINVAL, "%s: negative size", op);
    return K3C_OK;
}

int k3c_linear_fwd(const k3c_linear_sizes *s, const real *x, const real *W, real *y, k3c_err *err) {
    int rc = check_sizes(s, "linear_fwd", err);
    if (rc) return rc;
    return k3c_matmul(0, 1, s->T, s->out, s->in, 1.0, x, W, s->accumulate ? 1.0 : 0.0, y, err);
}

int k3c_linear_bwd(const k3c_linear_sizes *s, const real *x, const real *W, const real *dy, real *dx, real *dW,
                   k3c_err *err) {
    int rc = check_sizes(s, "linear_bwd", err);
    if (rc) return rc;
    if (dx && (rc = k3c_matmul(0, 0, s->T, s->in, s->out, 1.0, dy, W, 1.0, dx, err))) return rc;
    if (dW && (rc = k3c_matmul(1, 0, s->out, s->in, s->T, 1.0, dy, x, 1.0, dW, err))) return rc;
    return K3C_OK;
}
