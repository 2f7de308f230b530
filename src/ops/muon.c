/* muon.c — Muon: momentum, Nesterov, the quintic Newton–Schulz orthogonalisation (NS5) and the Per-Head split of a
 * weight into row blocks that are orthogonalised separately. Spec: docs/MODEL.md §10.1 and §10.3. */
#include "ops/optim.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

size_t k3c_ns_workspace(int64_t rows, int64_t cols) {
    size_t r = (size_t)(rows < cols ? rows : cols), c = (size_t)(rows < cols ? cols : rows);
    return 2 * r * c + 2 * r * r; /* X, X_next [r, c]; P, B [r, r] */
}

/* X ← G/(‖G‖_F + eps), laid out short side first ([r, c], r ≤ c) so the Gram matrix P is the small one. */
static void ns_load(const float *G, int64_t rows, int64_t cols, float *X) {
    double ss = 0;
    for (int64_t i = 0; i < rows * cols; i++) ss += (double)G[i] * G[i];
    const float inv = (float)(1.0 / (sqrt(ss) + K3C_NS_EPS));
    if (rows <= cols) {
        for (int64_t i = 0; i < rows * cols; i++) X[i] = G[i] * inv;
    } else {
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) X[j * rows + i] = G[i * cols + j] * inv;
    }
}

int k3c_newton_schulz(const float *G, int64_t rows, int64_t cols, int steps, float *O, float *ws, k3c_err *err) {
    if (rows < 1 || cols < 1 || steps < 0 || rows > INT32_MAX || cols > INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "newton_schulz: bad shape [%lld, %lld] or steps %d", (long long)rows,
                        (long long)cols, steps);
    const int r = (int)(rows < cols ? rows : cols), c = (int)(rows < cols ? cols : rows);
    float *X = ws, *Xn = X + (size_t)r * c, *P = Xn + (size_t)r * c, *B = P + (size_t)r * r;
    ns_load(G, rows, cols, X);
    for (int it = 0; it < steps; it++) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r, r, c, 1.0f, X, c, X, c, 0.0f, P, r);
        for (size_t i = 0; i < (size_t)r * r; i++) B[i] = (float)K3C_NS_B * P[i];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, r, r, (float)K3C_NS_C, P, r, P, r, 1.0f, B, r);
        memcpy(Xn, X, (size_t)r * c * sizeof *X);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, c, r, 1.0f, B, r, X, c, (float)K3C_NS_A, Xn, c);
        float *tmp = X;
        X = Xn;
        Xn = tmp;
    }
    if (rows <= cols) {
        memcpy(O, X, (size_t)r * c * sizeof *X);
    } else {
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) O[i * cols + j] = X[j * rows + i];
    }
    return K3C_OK;
}

size_t k3c_muon_workspace(int64_t rows, int64_t cols, int64_t head_rows) {
    int64_t r = head_rows > 0 ? head_rows : rows;
    return (size_t)r * (size_t)cols + k3c_ns_workspace(r, cols);
}

int k3c_muon_update(const k3c_muon_hp *hp, float *w, const float *g, float *mom, int64_t rows, int64_t cols,
                    int64_t head_rows, double lr, double wd, float *ws, k3c_err *err) {
    if (rows < 1 || cols < 1 || head_rows < 0 || (head_rows > 0 && rows % head_rows != 0))
        return k3c_errf(err, K3C_EINVAL, "muon: bad shape [%lld, %lld] with head_rows %lld", (long long)rows,
                        (long long)cols, (long long)head_rows);
    const int64_t R = head_rows > 0 ? head_rows : rows, n = rows * cols, bn = R * cols;
    const float mu = (float)hp->momentum;
    for (int64_t i = 0; i < n; i++) mom[i] = mu * mom[i] + g[i];
    /* Per-Head Muon: the RMS-matching factor uses the block's own shape, so every head gets the same update scale. */
    const float step = (float)(lr * hp->scale * sqrt((double)(R > cols ? R : cols)));
    const float decay = (float)(1.0 - lr * wd);
    float *U = ws, *nsws = ws + bn;
    for (int64_t r0 = 0; r0 < rows; r0 += R) {
        const int64_t o = r0 * cols;
        for (int64_t i = 0; i < bn; i++) U[i] = hp->nesterov ? g[o + i] + mu * mom[o + i] : mom[o + i];
        int rc = k3c_newton_schulz(U, R, cols, hp->ns_steps, U, nsws, err);
        if (rc) return rc;
        for (int64_t i = 0; i < bn; i++) w[o + i] = w[o + i] * decay - step * U[i];
    }
    return K3C_OK;
}
