/* dtype.c — element types and bf16/f16 conversion (docs/CODE.md "Precision policy"). */
#include "base/base.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[K3C_DTYPE_COUNT] = {
    [K3C_F64] = {"F64", 8}, [K3C_F32] = {"F32", 4}, [K3C_BF16] = {"BF16", 2}, [K3C_F16] = {"F16", 2},
    [K3C_I64] = {"I64", 8}, [K3C_I32] = {"I32", 4}, [K3C_U8] = {"U8", 1},
};

size_t k3c_dtype_size(k3c_dtype t) { return (unsigned)t < K3C_DTYPE_COUNT ? dtypes[t].size : 0; }
const char *k3c_dtype_name(k3c_dtype t) { return (unsigned)t < K3C_DTYPE_COUNT ? dtypes[t].name : "?"; }

int k3c_dtype_parse(const char *name, k3c_dtype *out) {
    for (int i = 0; i < K3C_DTYPE_COUNT; i++)
        if (strcmp(name, dtypes[i].name) == 0) {
            *out = (k3c_dtype)i;
            return K3C_OK;
        }
    return K3C_EFORMAT;
}

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float k3c_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t k3c_f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                          /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float k3c_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return u2f(sign | 0x7f800000u | (man << 13));
    if (exp == 0) return (sign ? -1.0f : 1.0f) * ldexpf((float)man, -24); /* zero or subnormal */
    return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t k3c_f32_to_f16(float f) {
    uint32_t u = f2u(f), sign = (u >> 16) & 0x8000u;
    float a = fabsf(f);
    if (isnan(f)) return (uint16_t)(sign | 0x7e00u);
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00u); /* rounds to infinity */
    if (a < 6.103515625e-05f) {                           /* subnormal: units of 2^-24 */
        return (uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.0f));
    }
    uint32_t au = u & 0x7fffffffu;
    uint32_t r = au + 0xfffu + ((au >> 13) & 1u); /* round mantissa to 10 bits, nearest even */
    return (uint16_t)(sign | ((r >> 13) - (112u << 10)));
}

#define CONVERT_BODY(OUT_T)                                                                                            \
    switch (t) {                                                                                                       \
    case K3C_F64:                                                                                                      \
        for (size_t i = 0; i < n; i++) dst[i] = (OUT_T)((const double *)src)[i];                                       \
        break;                                                                                                         \
    case K3C_F32:                                                                                                      \
        for (size_t i = 0; i < n; i++) dst[i] = (OUT_T)((const float *)src)[i];                                        \
        break;                                                                                                         \
    case K3C_BF16:                                                                                                     \
        for (size_t i = 0; i < n; i++) dst[i] = (OUT_T)k3c_bf16_to_f32(((const uint16_t *)src)[i]);                    \
        break;                                                                                                         \
    case K3C_F16:                                                                                                      \
        for (size_t i = 0; i < n; i++) dst[i] = (OUT_T)k3c_f16_to_f32(((const uint16_t *)src)[i]);                     \
        break;                                                                                                         \
    default: return K3C_EINVAL;                                                                                        \
    }                                                                                                                  \
    return K3C_OK;

int k3c_convert_to_f32(k3c_dtype t, const void *src, float *dst, size_t n) { CONVERT_BODY(float) }
int k3c_convert_to_f64(k3c_dtype t, const void *src, double *dst, size_t n){CONVERT_BODY(double)}
