/* test.h — the tiny unit-test harness: CHECK macros, tolerances, the path to ../shared, and the closing
 * "N passed, N failed" line that tools/run_tests.sh sums. Each tests/test_*.c is one program. */
#ifndef K3C_TEST_H
#define K3C_TEST_H

#include "base/base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int test_passed_, test_failed_;

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (cond)                                                                                                      \
            test_passed_++;                                                                                            \
        else {                                                                                                         \
            test_failed_++;                                                                                            \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                                     \
            printf(__VA_ARGS__);                                                                                       \
            printf("\n");                                                                                              \
        }                                                                                                              \
    } while (0)

/* CHECK_OK(expr, err): expr returns a k3c_status; prints the library's message on failure. */
#define CHECK_OK(expr, errp) CHECK((expr) == K3C_OK, "%s", (errp)->msg)

/* A check whose value is reported even on success (for numbers the closing notes quote). */
#define CHECK_LE(val, tol, what)                                                                                       \
    do {                                                                                                               \
        double v_ = (val), t_ = (tol);                                                                                 \
        CHECK(v_ <= t_, "%s = %.3e > %.1e", what, v_, t_);                                                             \
        if (getenv("K3C_TEST_VERBOSE")) printf("  %s = %.3e (tol %.1e)\n", what, v_, t_);                              \
    } while (0)

static inline double test_rel_err_d(const double *x, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = x[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
static inline double test_rel_err_f(const float *x, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Relative error of an analytic gradient g against float64 central differences of loss(ctx) over x[0..n), the step
 * 1e-6 relative to |x_i| (at least 1e-6 absolute). x is perturbed in place and restored. */
typedef double (*test_loss_fn)(void *ctx);
static inline double test_fd_rel_err(test_loss_fn loss, void *ctx, double *x, size_t n, const double *g) {
    double *fd = malloc((n ? n : 1) * sizeof *fd);
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i], h = 1e-6 * fmax(1.0, fabs(x0));
        x[i] = x0 + h;
        double lp = loss(ctx);
        x[i] = x0 - h;
        double lm = loss(ctx);
        x[i] = x0;
        fd[i] = (lp - lm) / (2 * h);
    }
    double e = test_rel_err_d(g, fd, n);
    free(fd);
    return e;
}

/* Path of a file under ../shared (override with K3C_SHARED). Missing shared/ is a clear failure, not a skip. */
static inline const char *test_shared(const char *rel) {
    static char buf[8][4096];
    static int slot;
    const char *root = getenv("K3C_SHARED") ? getenv("K3C_SHARED") : "../shared";
    char *b = buf[slot++ & 7];
    snprintf(b, sizeof buf[0], "%s/%s", root, rel);
    if (access(b, R_OK) != 0) {
        printf("FAIL: %s not found: tests need ../shared beside the repository (or K3C_SHARED=/path/to/shared)\n", b);
        test_failed_++;
    }
    return b;
}

/* The k3c CLI binary for end-to-end tests (K3C_K3C_BIN overrides, e.g. the ASan build). */
static inline const char *test_k3c_bin(void) { return getenv("K3C_K3C_BIN") ? getenv("K3C_K3C_BIN") : "./k3c"; }

/* A per-test scratch directory under build/ (removed and recreated). */
static inline const char *test_tmpdir(const char *name) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "build/tmp/%s.%ld", name, (long)getpid());
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", buf, buf);
    if (system(cmd) != 0) printf("warning: cannot create %s\n", buf);
    return buf;
}

/* Fresh arrays for op tests (free with free()): n normal(0, sd) values of stream `seed`, n copies of v, a float copy. */
static inline double *test_randn(uint64_t seed, size_t n, double sd) {
    double *x = malloc((n ? n : 1) * sizeof *x);
    k3c_rng r = {seed, 0};
    for (size_t i = 0; i < n; i++) x[i] = sd * k3c_rng_normal(&r);
    return x;
}
static inline double *test_filled(size_t n, double v) {
    double *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = v;
    return x;
}
static inline float *test_to_f32(const double *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}

static inline int test_summary(void) {
    printf("%d passed, %d failed\n", test_passed_, test_failed_);
    return test_failed_ ? 1 : 0;
}

#endif
