/* testing.cuh — helpers of the CUDA test and benchmark programs (tests/cuda, bench/cuda): device buffers with checked
 * transfers, output poisoning, fresh random inputs and the result table. docs/CODE.md "Ops" (one harness, every backend, stated tolerances). */
#ifndef K3C_CUDA_TESTING_CUH
#define K3C_CUDA_TESTING_CUH

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <string>
#include <vector>

#include "cuda/cuda_ops.h"

struct harness {
    int passed = 0, failed = 0;
    std::vector<std::string> table;
    k3c_err err{};

    /* A failed CUDA call ends the program: later results would be meaningless. */
    void ok(int rc, const char *what) {
        if (rc) {
            printf("FATAL %s: %s (%s)\n", what, err.msg, k3c_status_name(rc));
            fflush(stdout);
            exit(2);
        }
    }
    /* ‖x − ref‖ / ‖ref‖ over n values; every x must be finite (outputs are poisoned with NaN before each run). */
    void compare(const char *op, const std::string &shape, const char *what, const float *x, const float *ref, size_t n,
                 double tol, const float *base = nullptr) {
        size_t bad = 0;
        double num = 0, den = 0;
        for (size_t i = 0; i < n; i++) {
            if (!isfinite(x[i])) {
                bad++;
                continue;
            }
            const double b = base ? base[i] : 0.0, d = (double)x[i] - ref[i];
            num += d * d, den += ((double)ref[i] - b) * ((double)ref[i] - b);
        }
        const double e = den > 0 ? sqrt(num / den) : sqrt(num);
        const bool pass = bad == 0 && e <= tol;
        pass ? passed++ : failed++;
        char line[512];
        snprintf(line, sizeof line, "%-22s %-34s %-6s rel_err %.3e  tol %.0e  %s%s", op, shape.c_str(), what, e, tol,
                 pass ? "PASS" : "FAIL", bad ? "  (non-finite outputs)" : "");
        table.push_back(line);
        printf("%s\n", line);
        fflush(stdout);
    }
    /* A derived quantity (e.g. an error ratio) against an upper limit; NaN fails. */
    void check_le(const char *op, const std::string &shape, const char *what, double value, double limit) {
        const bool pass = value <= limit;
        pass ? passed++ : failed++;
        char line[512];
        snprintf(line, sizeof line, "%-22s %-34s %-6s value   %.3e  max %.0e  %s", op, shape.c_str(), what, value,
                 limit, pass ? "PASS" : "FAIL");
        table.push_back(line);
        printf("%s\n", line);
        fflush(stdout);
    }
    int summary() {
        printf("\n==== CUDA op harness: %d passed, %d failed ====\n", passed, failed);
        for (auto &l : table) printf("%s\n", l.c_str());
        printf("%d passed, %d failed\n", passed, failed);
        return failed ? 1 : 0;
    }
};

/* The start of every harness program: device 0 and the seed (argv[1], else the clock), both printed. */
static inline k3c_rng harness_start(harness &h, k3c_cuda_ctx &ctx, int argc, char **argv) {
    h.ok(k3c_cuda_init(&ctx, 0, 0, &h.err), "k3c_cuda_init");
    const uint64_t seed = argc > 1 ? strtoull(argv[1], nullptr, 0) : (uint64_t)time(nullptr);
    printf("device %s, %d SMs, seed %llu\n", ctx.name, ctx.sm_count, (unsigned long long)seed);
    return k3c_rng{seed, 0};
}

/* A device buffer that frees itself. */
struct dbuf {
    void *p = nullptr;
    size_t bytes = 0;
    dbuf() = default;
    dbuf(harness &h, size_t n) : bytes(n) { h.ok(k3c_cuda_malloc(&p, n, &h.err), "cudaMalloc"); }
    dbuf(harness &h, const void *src, size_t n) : dbuf(h, n) { h.ok(k3c_cuda_h2d(p, src, n, &h.err), "h2d"); }
    ~dbuf() { k3c_cuda_free(p); }
    dbuf(const dbuf &) = delete;
    dbuf &operator=(const dbuf &) = delete;
    template <typename T> T *as() const { return (T *)p; }
    void poison(harness &h) { h.ok(k3c_cuda_fill_u8(p, 0xFF, bytes, &h.err), "poison"); }
    void get(harness &h, void *dst) const { h.ok(k3c_cuda_d2h(dst, p, bytes, &h.err), "d2h"); }
};

template <typename T> static dbuf *upload(harness &h, const std::vector<T> &v) {
    return new dbuf(h, v.data(), v.size() * sizeof(T));
}
template <typename T> static std::vector<T> download(harness &h, const dbuf &b) {
    std::vector<T> v(b.bytes / sizeof(T));
    b.get(h, v.data());
    return v;
}

static inline std::vector<float> randn(k3c_rng *r, size_t n, double sd = 1.0) {
    std::vector<float> v(n);
    for (auto &x : v) x = (float)(k3c_rng_normal(r) * sd);
    return v;
}
static inline double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

/* Rows of width d scaled to unit L2 norm (KDA q, k after their l2norm op). */
static inline void l2rows(std::vector<float> &x, size_t d) {
    for (size_t r = 0; r < x.size() / d; r++) {
        double s = 0;
        for (size_t i = 0; i < d; i++) s += (double)x[r * d + i] * x[r * d + i];
        const double inv = 1.0 / sqrt(s + 1e-6);
        for (size_t i = 0; i < d; i++) x[r * d + i] = (float)(x[r * d + i] * inv);
    }
}

static inline std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static inline std::string fmt(const char *f, ...) {
    char b[256];
    va_list ap;
    va_start(ap, f);
    vsnprintf(b, sizeof b, f, ap);
    va_end(ap);
    return b;
}

#endif
