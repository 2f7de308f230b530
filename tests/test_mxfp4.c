/* test_mxfp4.c — MXFP4 decode: hand-made bytes at known positions (nibble order, s = 0, 254, 255), shape checks,
 * and one real expert tensor of the k3_tiny_a golden against values computed independently (docs/FORMATS.md §6). */
#include "ops/mxfp4.h"
#include "test.h"

#include <float.h>

static void test_lut(void) {
    const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    int ok = 1;
    for (unsigned i = 0; i < 16; i++) ok &= k3c_mxfp4_e2m1(i) == want[i];
    CHECK(ok, "E2M1 LUT");
    CHECK(signbit(k3c_mxfp4_e2m1(8)) && !signbit(k3c_mxfp4_e2m1(0)), "nibble 8 is -0, nibble 0 is +0");
}

/* Two rows of 64 columns: row 0 with scales (127, 0), row 1 with (254, 128). Each checked byte has different nibbles,
 * so a decoder with the nibble order swapped fails every position check. */
static void make_bytes(uint8_t packed[2][32], uint8_t scale[2][2]) {
    memset(packed, 0, 64);
    packed[0][0] = 0x71;  /* col 0 = nibble 1 = 0.5, col 1 = nibble 7 = 6 */
    packed[0][1] = 0xF8;  /* col 2 = nibble 8 = -0,  col 3 = nibble 15 = -6 */
    packed[0][16] = 0x27; /* col 32 = 6·2^-127,      col 33 = 1·2^-127 */
    packed[1][0] = 0x3A;  /* col 0 = -1·2^127,       col 1 = 1.5·2^127 */
    packed[1][16] = 0x5C; /* col 32 = -2·2 = -4,     col 33 = 3·2 = 6 */
    packed[1][31] = 0x9E; /* col 62 = -4·2 = -8,     col 63 = -0.5·2 = -1 */
    scale[0][0] = 127;
    scale[0][1] = 0;
    scale[1][0] = 254;
    scale[1][1] = 128;
}

static void test_hand_bytes(void) {
    uint8_t packed[2][32], scale[2][2];
    make_bytes(packed, scale);
    double out[2 * 64];
    float outf[2 * 64];
    k3c_err err = {0};
    CHECK_OK(k3c_mxfp4_decode_f64(&packed[0][0], &scale[0][0], 2, 64, out, &err), &err);
    CHECK_OK(k3c_mxfp4_decode_f32(&packed[0][0], &scale[0][0], 2, 64, outf, &err), &err);
    const double p127 = ldexp(1.0, 127), m127 = ldexp(1.0, -127);
    struct {
        int r, c;
        double v;
    } want[] = {
        {0, 0, 0.5},        {0, 1, 6},         {0, 2, -0.0},      {0, 3, -6},  {0, 4, 0},
        {0, 31, 0},         {0, 32, 6 * m127}, {0, 33, 1 * m127}, {0, 34, 0},  {1, 0, -p127},
        {1, 1, 1.5 * p127}, {1, 32, -4},       {1, 33, 6},        {1, 62, -8}, {1, 63, -1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        double got = out[want[i].r * 64 + want[i].c];
        CHECK(got == want[i].v, "f64 [%d, %d] = %.17g, want %.17g", want[i].r, want[i].c, got, want[i].v);
        float gf = outf[want[i].r * 64 + want[i].c];
        CHECK(gf == (float)want[i].v, "f32 [%d, %d] = %.9g, want %.9g", want[i].r, want[i].c, gf, want[i].v);
    }
    CHECK(signbit(out[2]) && signbit(outf[2]), "nibble 8 decodes to -0");
    /* s = 0 is 2^-127, not 0 (the float-bits shortcut would give 0); in float it is a subnormal */
    CHECK(out[33] > 0 && outf[33] > 0 && outf[33] < FLT_MIN, "s = 0 -> 2^-127: %g (f32 %g)", out[33], (double)outf[33]);
    CHECK(out[32] == ldexp(3.0, -126), "6·2^-127 == 3·2^-126");
}

static void test_rejects(void) {
    uint8_t packed[2][32], scale[2][2];
    make_bytes(packed, scale);
    double out[2 * 64];
    for (int i = 0; i < 128; i++) out[i] = 12345;
    k3c_err err = {0};
    scale[1][1] = 255;
    int rc = k3c_mxfp4_decode_f64(&packed[0][0], &scale[0][0], 2, 64, out, &err);
    CHECK(rc == K3C_EFORMAT, "s = 255 must be rejected (rc %d)", rc);
    CHECK(strstr(err.msg, "row 1") && strstr(err.msg, "group 1"), "message names the place: %s", err.msg);
    int untouched = 1;
    for (int i = 0; i < 128; i++) untouched &= out[i] == 12345;
    CHECK(untouched, "nothing written on error");
    float outf[2 * 64];
    CHECK(k3c_mxfp4_decode_f32(&packed[0][0], &scale[0][0], 2, 64, outf, &err) == K3C_EFORMAT, "f32: s = 255");
    scale[1][1] = 128;
    CHECK(k3c_mxfp4_decode_f64(&packed[0][0], &scale[0][0], 2, 48, out, &err) == K3C_EINVAL, "cols 48 rejected");
    CHECK(k3c_mxfp4_decode_f64(&packed[0][0], &scale[0][0], 2, 0, out, &err) == K3C_EINVAL, "cols 0 rejected");

    /* the checkpoint-pair form checks dtypes and shapes */
    k3c_st_tensor tp = {.name = "x.weight_packed", .dtype = K3C_U8, .ndim = 2, .shape = {2, 32}, .data = packed};
    k3c_st_tensor ts = {.name = "x.weight_scale", .dtype = K3C_U8, .ndim = 2, .shape = {2, 2}, .data = scale};
    int64_t r = 0, c = 0;
    CHECK_OK(k3c_mxfp4_decode_st_f64(&tp, &ts, out, 128, &r, &c, &err), &err);
    CHECK(r == 2 && c == 64 && out[1] == 6, "st form: %lld x %lld", (long long)r, (long long)c);
    CHECK(k3c_mxfp4_decode_st_f64(&tp, &ts, out, 100, NULL, NULL, &err) == K3C_EINVAL, "wrong destination size");
    ts.shape[1] = 3;
    CHECK(k3c_mxfp4_decode_st_f64(&tp, &ts, out, 128, NULL, NULL, &err) == K3C_EFORMAT, "scale shape mismatch");
    CHECK(strstr(err.msg, "x.weight_scale") != NULL, "message names the tensor: %s", err.msg);
    ts.shape[1] = 2;
    ts.dtype = K3C_BF16;
    CHECK(k3c_mxfp4_decode_st_f64(&tp, &ts, out, 128, NULL, NULL, &err) == K3C_EFORMAT, "scale dtype");
}

/* Values computed independently with python3 struct from the same bytes (low nibble = even column,
 * value = E2M1 · 2^(s − 127)); scales in this tensor are 124 and 125. */
static void test_golden_tensor(void) {
    const char *path = test_shared("golden/k3_tiny_a/model.safetensors");
    k3c_safetensors *st = NULL;
    k3c_err err = {0};
    int rc = k3c_st_open(path, &st, &err);
    CHECK_OK(rc, &err);
    if (rc) return;
    const char *pre = "language_model.model.layers.1.block_sparse_moe.experts.0.w1.";
    char np[256], ns[256];
    snprintf(np, sizeof np, "%sweight_packed", pre);
    snprintf(ns, sizeof ns, "%sweight_scale", pre);
    const k3c_st_tensor *tp = k3c_st_find(st, np), *ts = k3c_st_find(st, ns);
    CHECK(tp && ts, "tensors present");
    if (tp && ts) {
        double w[64 * 64];
        float wf[64 * 64];
        int64_t rows = 0, cols = 0;
        CHECK_OK(k3c_mxfp4_decode_st_f64(tp, ts, w, 64 * 64, &rows, &cols, &err), &err);
        CHECK_OK(k3c_mxfp4_decode_st_f32(tp, ts, wf, 64 * 64, NULL, NULL, &err), &err);
        CHECK(rows == 64 && cols == 64, "logical shape %lld x %lld", (long long)rows, (long long)cols);
        struct {
            int r, c;
            double v;
        } want[] = {
            {0, 0, -0.125},    {0, 1, 0.5},    {0, 33, 0.375},  {3, 10, -0.5}, {3, 11, 0.0625}, {3, 44, 0.75},
            {5, 2, -0.5},      {5, 3, -0.125}, {5, 4, 0.125},   {5, 5, 1.0},   {17, 40, 0.375}, {31, 7, 0.375},
            {40, 31, -0.0625}, {40, 32, 0.5},  {63, 63, -0.25}, {5, 62, 0.0},
        };
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            double got = w[want[i].r * 64 + want[i].c];
            CHECK(got == want[i].v && wf[want[i].r * 64 + want[i].c] == (float)want[i].v, "w1[%d, %d] = %g, want %g",
                  want[i].r, want[i].c, got, want[i].v);
        }
        double sum = 0, wsum = 0;
        for (int i = 0; i < 64 * 64; i++) {
            sum += w[i];
            wsum += w[i] * (i % 97);
        }
        CHECK(sum == -35.5625 && wsum == -1276.25, "checksums %.17g %.17g (want -35.5625, -1276.25)", sum, wsum);
    }
    k3c_st_close(st);
}

int main(void) {
    test_lut();
    test_hand_bytes();
    test_rejects();
    test_golden_tensor();
    return test_summary();
}
