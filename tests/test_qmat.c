/* test_qmat.c — the weight-view products of ops/qmat.h: each stored format (float32, bf16, MXFP4), the vectorised
 * kernels and the scalar reference, against decoding the whole matrix first and multiplying in double, for n = 1
 * (decode) and n > 1 (batched decode, prefill), odd shapes, threads, accumulation, extreme scales; the view checks. */
#include "ops/mxfp4.h"
#include "ops/qmat.h"
#include "test.h"

#include <math.h>
#include <omp.h>
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

/* Both products (vectorised and reference) against double, element by element, within the a-priori bound of a float
 * sum in any order: |y − y*| ≤ (C + 2) u Σ|w x| (u = 2^−24; +2 for the group scale and the accumulated term). */
static int within_sum_bound(const float *y, const double *ref, const double *mag, int64_t m, int64_t C) {
    const double u = ldexp(1.0, -24);
    for (int64_t i = 0; i < m; i++)
        if (fabs((double)y[i] - ref[i]) > (double)(C + 2) * u * mag[i] + 1e-30) return 0;
    return 1;
}

static void check_shape(int type, int64_t R, int64_t C, int in_team) {
    void *store = NULL;
    uint8_t *scale = NULL;
    const int64_t N = 33; /* n = 1..17, then 33: the decoded-tile BLAS path of prefill */
    double *dense = malloc(sizeof(double) * (size_t)(R * C)), *ref = malloc(sizeof(double) * (size_t)(N * R));
    double *mag = malloc(sizeof(double) * (size_t)(N * R)), *xd = test_randn(77 + (uint64_t)C, (size_t)(N * C), 1.0);
    float *x = malloc(sizeof(float) * (size_t)(N * C)), *y = malloc(sizeof(float) * (size_t)(N * R));
    k3c_qmat W = make(type, R, C, 1000 + (uint64_t)(R * 7 + C), &store, &scale, dense);
    for (int64_t i = 0; i < N * C; i++) x[i] = (float)xd[i];
    int ok = 1;
    for (int64_t n = 1; n <= N && ok; n = n < 17 ? n + 1 : n == 17 ? N : N + 1)
        for (int acc = 0; acc < 2 && ok; acc++)
            for (int path = 0; path < 2 && ok; path++) {
                for (int64_t i = 0; i < n; i++)
                    for (int64_t r = 0; r < R; r++) {
                        double s = acc ? 0.25 * (double)(i - r) : 0, a = fabs(s);
                        for (int64_t c = 0; c < C; c++) {
                            s += dense[r * C + c] * x[i * C + c];
                            a += fabs(dense[r * C + c] * x[i * C + c]);
                        }
                        ref[i * R + r] = s;
                        mag[i * R + r] = a;
                        y[i * R + r] = 0.25f * (float)(i - r);
                    }
                if (in_team) {
#pragma omp parallel num_threads(2)
                    {
#pragma omp single
                        (path ? k3c_qmat_mul_ref : k3c_qmat_mul)(&W, x, n, y, acc);
                    }
                } else {
                    (path ? k3c_qmat_mul_ref : k3c_qmat_mul)(&W, x, n, y, acc);
                }
                ok = within_sum_bound(y, ref, mag, n * R, C);
                if (!ok)
                    fprintf(stderr, "  first failure at n = %lld, accumulate = %d, %s\n", (long long)n, acc,
                            path ? "reference" : "kernel");
            }
    CHECK(ok,
          "type %d [%lld x %lld]%s: kernel and reference within the float-sum bound, n = 1..17 and 33, +/- accumulate",
          type, (long long)R, (long long)C, in_team ? " inside a parallel region" : "");
    free(store);
    free(scale);
    free(dense);
    free(ref);
    free(mag);
    free(xd);
    free(x);
    free(y);
}

static void test_kernels(void) {
    static const int64_t shapes[][2] = {{1, 32},   {37, 96},  {3, 64},   {129, 1056},
                                        {300, 64}, {65, 512}, {1, 2048}, {3, 16416}};
    for (int type = K3C_QMAT_F32; type <= K3C_QMAT_MXFP4; type++)
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) check_shape(type, shapes[k][0], shapes[k][1], 0);
    static const int64_t odd[][2] = {{5, 1}, {7, 7}, {33, 13}, {9, 45}, {130, 301}, {2, 1000}};
    for (int type = K3C_QMAT_F32; type <= K3C_QMAT_BF16; type++)
        for (size_t k = 0; k < sizeof odd / sizeof odd[0]; k++) check_shape(type, odd[k][0], odd[k][1], 0);
    check_shape(K3C_QMAT_MXFP4, 129, 1056, 1);
    check_shape(K3C_QMAT_MXFP4, 1, 262176, 0); /* wider than a prefill tile: row by row */
    check_shape(K3C_QMAT_BF16, 1, 262176, 0);
    check_shape(K3C_QMAT_BF16, 130, 301, 1);
}

/* Every nibble under the extreme scales (0 and 1: subnormal multipliers; 252: the largest whose 6 · 2^(s−127) is finite) decodes exactly through
 * every path: X = identity reads the matrix back column by column (n = 1, the small-n kernel, the BLAS tile). */
static void test_extreme_scales(void) {
    const int64_t R = 8, C = 64;
    uint8_t p[8 * 32], s[8 * 2];
    static const uint8_t sc[4] = {0, 1, 2, 252};
    for (int i = 0; i < R * C / 2; i++) p[i] = (uint8_t)(i * 37 + 11);
    for (int i = 0; i < R * C / 32; i++) s[i] = sc[i % 4];
    k3c_qmat W = {K3C_QMAT_MXFP4, R, C, p, s};
    float *dense = malloc(sizeof(float) * R * C), *eye = calloc((size_t)(C * C), sizeof(float));
    float *y = malloc(sizeof(float) * (size_t)(C * R));
    k3c_err err = {0};
    CHECK_OK(k3c_mxfp4_decode_f32(p, s, R, C, dense, &err), &err);
    for (int64_t j = 0; j < C; j++) eye[j * C + j] = 1;
    static const int64_t ns[] = {1, 3, 16, 64};
    for (size_t k = 0; k < 4; k++) {
        int same = 1;
        for (int64_t j0 = 0; j0 + ns[k] <= C; j0 += ns[k]) {
            k3c_qmat_mul(&W, eye + j0 * C, ns[k], y, 0);
            for (int64_t j = 0; j < ns[k]; j++)
                for (int64_t r = 0; r < R; r++) same &= y[j * R + r] == dense[r * C + j0 + j];
        }
        CHECK(same, "MXFP4 with scales 0, 1, 2, 252: exact read-back through n = %lld", (long long)ns[k]);
    }
    free(dense);
    free(eye);
    free(y);
}

/* k3c_qmat_mul_many equals k3c_qmat_mul of each job alone, bit for bit: a mix of types, input counts (1, 3, 17, and 40
 * on the BLAS tile path), MXFP4 inputs that overflow one region's permuted-input room (so the jobs split into several
 * regions), accumulation, and inside a parallel region. */
static void test_many(void) {
    enum { NJ = 12 };
    static const int types[NJ] = {K3C_QMAT_MXFP4, K3C_QMAT_MXFP4, K3C_QMAT_BF16,  K3C_QMAT_F32,
                                  K3C_QMAT_MXFP4, K3C_QMAT_BF16,  K3C_QMAT_MXFP4, K3C_QMAT_MXFP4,
                                  K3C_QMAT_BF16,  K3C_QMAT_MXFP4, K3C_QMAT_MXFP4, K3C_QMAT_BF16};
    static const int64_t rows[NJ] = {70, 33, 65, 9, 512, 3, 40, 1, 130, 64, 8, 7};
    static const int64_t cols[NJ] = {512, 96, 100, 64, 512, 1000, 2048, 16416, 64, 4096, 160, 33};
    static const int64_t ns[NJ] = {1, 3, 1, 2, 17, 1, 3, 1, 40, 2, 40, 5};
    void *store[NJ] = {0};
    uint8_t *scale[NJ] = {0};
    k3c_qmat W[NJ];
    k3c_qmat_job jobs[NJ];
    float *x[NJ], *y[NJ], *ref[NJ];
    for (int i = 0; i < NJ; i++) {
        double *dense = malloc(sizeof(double) * (size_t)(rows[i] * cols[i]));
        W[i] = make(types[i], rows[i], cols[i], 500 + (uint64_t)i, &store[i], &scale[i], dense);
        free(dense);
        double *xd = test_randn(900 + (uint64_t)i, (size_t)(ns[i] * cols[i]), 1.0);
        x[i] = malloc(sizeof(float) * (size_t)(ns[i] * cols[i]));
        y[i] = malloc(sizeof(float) * (size_t)(ns[i] * rows[i]));
        ref[i] = malloc(sizeof(float) * (size_t)(ns[i] * rows[i]));
        for (int64_t k = 0; k < ns[i] * cols[i]; k++) x[i][k] = (float)xd[k];
        free(xd);
        jobs[i] = (k3c_qmat_job){&W[i], x[i], ns[i], y[i], i % 3 == 1};
    }
    for (int team = 0; team < 2; team++) {
        for (int i = 0; i < NJ; i++)
            for (int64_t k = 0; k < ns[i] * rows[i]; k++) y[i][k] = ref[i][k] = 0.5f * (float)(k % 7);
        /* the reference in the same context: BLAS may split its sums differently inside a team */
        if (team) {
#pragma omp parallel num_threads(2)
            {
#pragma omp single
                {
                    for (int i = 0; i < NJ; i++) k3c_qmat_mul(&W[i], x[i], ns[i], ref[i], jobs[i].accumulate);
                    k3c_qmat_mul_many(jobs, NJ);
                }
            }
        } else {
            for (int i = 0; i < NJ; i++) k3c_qmat_mul(&W[i], x[i], ns[i], ref[i], jobs[i].accumulate);
            k3c_qmat_mul_many(jobs, NJ);
        }
        int same = 1;
        for (int i = 0; i < NJ; i++) same &= !memcmp(y[i], ref[i], sizeof(float) * (size_t)(ns[i] * rows[i]));
        CHECK(same, "k3c_qmat_mul_many equals k3c_qmat_mul job by job, bit for bit%s",
              team ? " (inside a parallel region)" : "");
    }
    for (int i = 0; i < NJ; i++) free(store[i]), free(scale[i]), free(x[i]), free(y[i]), free(ref[i]);
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
    test_kernels();
    test_extreme_scales();
    test_many();
    test_check();
    return test_summary();
}
