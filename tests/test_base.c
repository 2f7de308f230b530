/* test_base.c — base services: dtype conversion, arena alignment/peak, counter-based rng, atomic writes. */
#include "test.h"

static void test_bf16_f16(void) {
    float vals[] = {0.0f, 1.0f, -2.5f, 3.14159265f, 1e-30f, 65504.0f, -1e20f, 6.1e-5f, 3e-7f};
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
        float v = vals[i];
        float b = k3c_bf16_to_f32(k3c_f32_to_bf16(v));
        CHECK(fabsf(b - v) <= fabsf(v) * (1.0f / 256), "bf16 round trip %g -> %g", v, b);
    }
    CHECK(k3c_f32_to_bf16(1.0f) == 0x3f80, "bf16(1) = %04x", k3c_f32_to_bf16(1.0f));
    /* 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0). */
    CHECK(k3c_f32_to_bf16(1.00390625f) == 0x3f80, "tie to even");
    CHECK(k3c_f32_to_bf16(1.01171875f) == 0x3f82, "tie to even (odd below)");
    CHECK(isnan(k3c_bf16_to_f32(k3c_f32_to_bf16(NAN))), "NaN stays NaN");
    CHECK(k3c_f32_to_f16(1.0f) == 0x3c00, "f16(1)");
    CHECK(k3c_f32_to_f16(65504.0f) == 0x7bff, "f16 max");
    CHECK(k3c_f32_to_f16(1e6f) == 0x7c00, "f16 overflow -> inf");
    CHECK(k3c_f16_to_f32(0x0001) == ldexpf(1, -24), "smallest f16 subnormal");
    int bad = -1;
    for (int h = 0; h < 0x7c00 && bad < 0; h++)
        if (k3c_f32_to_f16(k3c_f16_to_f32((uint16_t)h)) != h) bad = h;
    CHECK(bad < 0, "every finite f16 round-trips exactly (first failure %04x)", bad);
    k3c_dtype t;
    CHECK(k3c_dtype_parse("BF16", &t) == K3C_OK && t == K3C_BF16, "parse BF16");
    CHECK(k3c_dtype_parse("F8_E4M3", &t) != K3C_OK, "unknown dtype rejected");
}

static void test_arena(void) {
    k3c_arena a;
    k3c_err err = {0};
    CHECK_OK(k3c_arena_init(&a, 1000, &err), &err);
    void *p = k3c_arena_alloc(&a, 3);
    void *q = k3c_arena_alloc(&a, 100);
    CHECK(((uintptr_t)p & 63) == 0 && ((uintptr_t)q & 63) == 0, "64-byte alignment");
    size_t m = k3c_arena_mark(&a);
    CHECK(k3c_arena_alloc(&a, 600) != NULL, "fits");
    size_t peak = a.peak;
    k3c_arena_reset(&a, m);
    CHECK(a.used == m && a.peak == peak, "reset keeps peak");
    CHECK(k3c_arena_alloc(&a, 5000) == NULL, "overflow returns NULL");
    k3c_arena_free(&a);
}

static void test_rng(void) {
    k3c_rng r = {42, 0};
    double s = 0, s2 = 0;
    int n = 20000;
    for (int i = 0; i < n; i++) {
        double x = k3c_rng_normal(&r);
        s += x;
        s2 += x * x;
    }
    CHECK(fabs(s / n) < 0.03 && fabs(s2 / n - 1) < 0.05, "normal moments %g %g", s / n, s2 / n);
    CHECK(k3c_normal_at(42, 5) == k3c_normal_at(42, 5), "stateless");
    k3c_rng a = {7, 100}, b = {7, 100};
    CHECK(k3c_rng_u64(&a) == k3c_rng_u64(&b), "counter-based reproducibility");
    CHECK(k3c_uniform_at(1, 0) != k3c_uniform_at(2, 0), "seeds differ");
    /* Philox-4x32-10 known-answer test (Random123 kat_vectors: counter 0, key 0). */
    uint32_t o[4];
    k3c_philox(0, 0, o);
    CHECK(o[0] == 0x6627e8d5u && o[1] == 0xe169c58du && o[2] == 0xbc57ac4cu && o[3] == 0x9b00dbd8u,
          "philox KAT got %08x %08x %08x %08x", o[0], o[1], o[2], o[3]);
}

static void test_files(void) {
    const char *dir = test_tmpdir("base");
    char path[4200];
    snprintf(path, sizeof path, "%s/x.bin", dir);
    k3c_err err = {0};
    CHECK_OK(k3c_write_file_atomic(path, "hello", 5, &err), &err);
    char *data;
    size_t n;
    CHECK_OK(k3c_read_file(path, &data, &n, &err), &err);
    CHECK(n == 5 && memcmp(data, "hello", 5) == 0, "read back");
    free(data);
    CHECK(k3c_read_file("/nonexistent/file", &data, &n, &err) == K3C_EIO && strstr(err.msg, "/nonexistent/file"),
          "error names the file: %s", err.msg);
}

static void test_progress(void) {
    k3c_progress p;
    k3c_progress_init(&p, "train", 100, "tok", stdout, 0);
    k3c_progress_update(&p, 50, 1000, "loss 2.0");
    char line[256];
    k3c_progress_line(&p, "loss 2.0", line, sizeof line);
    CHECK(strstr(line, "50/100") && strstr(line, "tok/s") && strstr(line, "ETA") && strstr(line, "loss 2.0"), "%s",
          line);
}

int main(void) {
    test_bf16_f16();
    test_arena();
    test_rng();
    test_files();
    test_progress();
    return test_summary();
}
