/* mxfp4.c — MXFP4 decode (E2M1 nibbles × UE8M0 group scales) to float and double.
 * Implements docs/FORMATS.md §6; nibble order per §7 #11 (low nibble = even column). */
#include "ops/mxfp4.h"

#include <math.h>

static const float e2m1_lut[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float k3c_mxfp4_e2m1(unsigned nibble) { return e2m1_lut[nibble & 15u]; }

/* Checked before any write, so a rejected tensor leaves `out` untouched. */
static int check_args(const uint8_t *packed, const uint8_t *scale, int64_t rows, int64_t cols, const void *out,
                      k3c_err *err) {
    if (!packed || !scale || !out || rows < 0)
        return k3c_errf(err, K3C_EINVAL, "mxfp4 decode: NULL buffer or negative rows (%lld)", (long long)rows);
    if (cols <= 0 || cols % K3C_MXFP4_GROUP != 0)
        return k3c_errf(err, K3C_EINVAL, "mxfp4 decode: cols = %lld is not a positive multiple of %d", (long long)cols,
                        K3C_MXFP4_GROUP);
    int64_t groups = cols / K3C_MXFP4_GROUP;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < groups; g++)
            if (scale[r * groups + g] == 255)
                return k3c_errf(err, K3C_EFORMAT,
                                "mxfp4 decode: scale byte 255 (NaN in the OCP MX spec) at row %lld, group %lld",
                                (long long)r, (long long)g);
    return 0;
}

/* ldexp, not float bits built from s << 23: that would turn s = 0 into +0 instead of 2^−127. */
#define MXFP4_DECODE_BODY(T, LDEXP)                                                                                    \
    int rc = check_args(packed, scale, rows, cols, out, err);                                                          \
    if (rc) return rc;                                                                                                 \
    const int64_t groups = cols / K3C_MXFP4_GROUP, half = cols / 2;                                                    \
    _Pragma("omp parallel for schedule(static)") for (int64_t r = 0; r < rows; r++) {                                  \
        const uint8_t *p = packed + r * half;                                                                          \
        T *o = out + r * cols;                                                                                         \
        for (int64_t g = 0; g < groups; g++) {                                                                         \
            T mult = LDEXP((T)1, (int)scale[r * groups + g] - 127);                                                    \
            for (int64_t b = g * (K3C_MXFP4_GROUP / 2); b < (g + 1) * (K3C_MXFP4_GROUP / 2); b++) {                    \
                o[2 * b] = (T)e2m1_lut[p[b] & 15u] * mult;                                                             \
                o[2 * b + 1] = (T)e2m1_lut[p[b] >> 4] * mult;                                                          \
            }                                                                                                          \
        }                                                                                                              \
    }                                                                                                                  \
    return 0;

int k3c_mxfp4_decode_f32(const uint8_t *packed, const uint8_t *scale, int64_t rows, int64_t cols, float *out,
                         k3c_err *err) {
    MXFP4_DECODE_BODY(float, ldexpf)
}

int k3c_mxfp4_decode_f64(const uint8_t *packed, const uint8_t *scale, int64_t rows, int64_t cols, double *out,
                         k3c_err *err) {
    MXFP4_DECODE_BODY(double, ldexp)
}

static int check_st(const k3c_st_tensor *packed, const k3c_st_tensor *scale, size_t n, int64_t *rows, int64_t *cols,
                    k3c_err *err) {
    if (!packed || !scale) return k3c_errf(err, K3C_EINVAL, "mxfp4 decode: NULL tensor");
    const char *pn = packed->name ? packed->name : "weight_packed", *sn = scale->name ? scale->name : "weight_scale";
    if (packed->dtype != K3C_U8 || packed->ndim != 2)
        return k3c_errf(err, K3C_EFORMAT, "%s: expected a 2-D U8 tensor (MXFP4 packed nibbles)", pn);
    if (scale->dtype != K3C_U8 || scale->ndim != 2)
        return k3c_errf(err, K3C_EFORMAT, "%s: expected a 2-D U8 tensor (UE8M0 scales)", sn);
    *rows = packed->shape[0];
    *cols = packed->shape[1] * 2;
    if (*cols <= 0 || *cols % K3C_MXFP4_GROUP != 0)
        return k3c_errf(err, K3C_EFORMAT, "%s: logical width %lld is not a positive multiple of %d", pn,
                        (long long)*cols, K3C_MXFP4_GROUP);
    if (scale->shape[0] != *rows || scale->shape[1] != *cols / K3C_MXFP4_GROUP)
        return k3c_errf(err, K3C_EFORMAT,
                        "%s: shape [%lld, %lld] does not match %s [%lld, %lld] (expected [%lld, %lld])", sn,
                        (long long)scale->shape[0], (long long)scale->shape[1], pn, (long long)packed->shape[0],
                        (long long)packed->shape[1], (long long)*rows, (long long)(*cols / K3C_MXFP4_GROUP));
    if ((size_t)(*rows * *cols) != n)
        return k3c_errf(err, K3C_EINVAL, "%s: logical size %lld x %lld does not match the destination (%zu elements)",
                        pn, (long long)*rows, (long long)*cols, n);
    return 0;
}

/* Both precisions: the same checks, the decode of the requested one, the tensor named in an error. */
static int decode_st(const k3c_st_tensor *packed, const k3c_st_tensor *scale, float *out32, double *out64, size_t n,
                     int64_t *rows_out, int64_t *cols_out, k3c_err *err) {
    int64_t rows, cols;
    int rc = check_st(packed, scale, n, &rows, &cols, err);
    if (rc) return rc;
    rc = out64 ? k3c_mxfp4_decode_f64(packed->data, scale->data, rows, cols, out64, err)
               : k3c_mxfp4_decode_f32(packed->data, scale->data, rows, cols, out32, err);
    if (rc) {
        if (err && packed->name) k3c_err_wrap(err, "%s", packed->name);
        return rc;
    }
    if (rows_out) *rows_out = rows;
    if (cols_out) *cols_out = cols;
    return 0;
}

int k3c_mxfp4_decode_st_f32(const k3c_st_tensor *packed, const k3c_st_tensor *scale, float *out, size_t n,
                            int64_t *rows_out, int64_t *cols_out, k3c_err *err) {
    return decode_st(packed, scale, out, NULL, n, rows_out, cols_out, err);
}

int k3c_mxfp4_decode_st_f64(const k3c_st_tensor *packed, const k3c_st_tensor *scale, double *out, size_t n,
                            int64_t *rows_out, int64_t *cols_out, k3c_err *err) {
    return decode_st(packed, scale, NULL, out, n, rows_out, cols_out, err);
}
