/* test_qmat.c — the weight-view products of ops/qmat.h: each stored format (float32, bf16, MXFP4) against decoding the
 * whole matrix first and multiplying in double, for n = 1 (decode) and n > 1 (prefill), and the view checks. */
#include "ops/mxfp4.h"
#include "ops/qmat.h"
#include "test.h"

#include <stdlib.h>

/* Random storage of each type and its exact float values (dense[rows, cols]). */
static k3c_qmat make(int type, int64_t R, int64_t C, uint64_t seed, void **store, uint8_t **scale, double *dense) {
    k3c_qmat W = {type, R, C, NULL, NULL};
    double *g = test_randn(seed, (size_t)(R * C), 1.0);
    if (type == K3C_QMAT_F32) {
        float *w = malloc(sizeof(float) * (size_t)(R * C));
        for (int64_t i = 0; i < R * C; i++) dense[i] = w[i] = (float)g[i];
        *store = w;
    } else if (type == K3C_QMAT_BF16) {
        uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(R * C));
        for (int64_t i = 0; i < R * C; i++) dense[i] = k3c_bf16_to_f32(w[i] = k3c_f32_to_bf16((float)g[i]));
        *store = w;
    } else {
        uint8_t *p = malloc((size_t)(R * C / 2)), *s = malloc((size_t)(R * C / 32));
        for (int64_t i = 0; i < R * C / 2; i++)
            p[i] = (uint8_t)(((uint64_t)(int64_t)(g[2 * i] * 1e6) ^ (uint64_t)i * 2654435761u) & 255u);
        for (int64_t i = 0; i < R * C / 32; i++) s[i] = (uint8_t)(120 + (i * 7) % 14);
        k3c_err err = {0};
        float *f = malloc(sizeof(float) * (size_t)(R * C));
        CHECK_OK(k3c_mxfp4_decode_f32(p, s, R, C, f, &err), &err);
        for (int64_t i = 0; i < R * C; i++) dense[i] = f[i];
        free(f);
        *store = p;
        *scale = s;
    }
    free(g);
    W.w = *store;
    W.scale = *scale;
    return W;
}

static void test_products(int type, const char *name) {
    const int64_t R = 37, C = 96, N = 5;
    void *store = NULL;
    uint8_t *scale = NULL;
    double *dense = malloc(sizeof(double) * (size_t)(R * C));
    k3c_qmat W = make(type, R, C, 11 + (uint64_t)type, &store, &scale, dense);
    k3c_err err = {0};
    CHECK_OK(k3c_qmat_check(&W, name, &err), &err);
    double *xd = test_randn(5, (size_t)(N * C), 1.0);
    float x[N * C], y[N * R], y0[N * R], ref[N * R], row[C];
    for (int64_t i = 0; i < N * C; i++) x[i] = (float)xd[i];
    for (int64_t i = 0; i < N; i++)
        for (int64_t r = 0; r < R; r++) {
            double acc = 0;
            for (int64_t c = 0; c < C; c++) acc += dense[r * C + c] * x[i * C + c];
            ref[i * R + r] = (float)acc;
        }
    for (int64_t n = 1; n <= N; n += N - 1) {
        k3c_qmat_mul(&W, x, n, y, 0);
        CHECK_LE(test_rel_err_f(y, ref, (size_t)(n * R)), 1e-6, "product");
        for (int64_t i = 0; i < n * R; i++) y0[i] = y[i] = 1.5f;
        k3c_qmat_mul(&W, x, n, y, 1);
        for (int64_t i = 0; i < n * R; i++) y0[i] += ref[i];
        CHECK_LE(test_rel_err_f(y, y0, (size_t)(n * R)), 1e-6, "accumulated product");
    }
    k3c_qmat_row(&W, 20, row);
    int same = 1;
    for (int64_t c = 0; c < C; c++) same &= row[c] == (float)dense[20 * C + c];
    CHECK(same, "%s: row 20 decodes exactly", name);
    free(xd);
    free(dense);
    free(store);
    free(scale);
}

static void test_check(void) {
    k3c_err err = {0};
    uint8_t buf[64] = {0};
    k3c_qmat bad = {K3C_QMAT_MXFP4, 2, 48, buf, buf};
    CHECK(k3c_qmat_check(&bad, "w1", &err) == K3C_EINVAL && strstr(err.msg, "w1"), "MXFP4 cols 48 refused: %s",
          err.msg);
    k3c_qmat none = {K3C_QMAT_F32, 2, 2, NULL, NULL};
    CHECK(k3c_qmat_check(&none, "lm_head", &err) == K3C_EINVAL, "missing storage refused");
    k3c_qmat odd = {7, 2, 2, buf, NULL};
    CHECK(k3c_qmat_check(&odd, "x", &err) == K3C_EINVAL, "unknown type refused");
}

int main(void) {
    test_products(K3C_QMAT_F32, "f32");
    test_products(K3C_QMAT_BF16, "bf16");
    test_products(K3C_QMAT_MXFP4, "mxfp4");
    test_check();
    return test_summary();
}
