/* mxfp4.h — decoding of MXFP4 ("mxfp4-pack-quantized") routed-expert weights: E2M1 nibbles with one UE8M0 scale per 32
 * inputs. Implements docs/FORMATS.md §6 (and §7 #11: low nibble = even column). */
#ifndef K3C_OPS_MXFP4_H
#define K3C_OPS_MXFP4_H

#include "base/base.h"

#define K3C_MXFP4_GROUP 32

/* The E2M1 value of a nibble (0..15): 0, 0.5, 1, 1.5, 2, 3, 4, 6, then the same negated (nibble 8 = −0). */
float k3c_mxfp4_e2m1(unsigned nibble);

/* Decodes a logical [rows, cols] matrix: packed U8 [rows, cols/2] (byte c of a row holds column 2c in bits 0–3 and
 * column 2c+1 in bits 4–7), scale U8 [rows, cols/32]; out[r, c] = E2M1 · 2^(s − 127) computed with ldexp (s = 0 →
 * 2^−127, a subnormal in float, exact in double). Errors: cols not a positive multiple of 32 → K3C_EINVAL; a scale
 * byte of 255 (NaN in the OCP MX spec) → K3C_EFORMAT naming the row and group; nothing is written to out on error.
 * Threads over rows (OpenMP). */
int k3c_mxfp4_decode_f32(const uint8_t *packed, const uint8_t *scale, int64_t rows, int64_t cols, float *out,
                         k3c_err *err);
int k3c_mxfp4_decode_f64(const uint8_t *packed, const uint8_t *scale, int64_t rows, int64_t cols, double *out,
                         k3c_err *err);

/* The same from a checkpoint pair `<name>.weight_packed` / `<name>.weight_scale`: checks both are U8 2-D with matching
 * rows, packed cols = cols/2 and scale cols = cols/32 (cols = 2 · packed cols), and that n == rows·cols; writes the
 * logical shape to rows_out / cols_out when non-NULL. Errors name the tensors. */
int k3c_mxfp4_decode_st_f32(const k3c_st_tensor *packed, const k3c_st_tensor *scale, float *out, size_t n,
                            int64_t *rows_out, int64_t *cols_out, k3c_err *err);
int k3c_mxfp4_decode_st_f64(const k3c_st_tensor *packed, const k3c_st_tensor *scale, double *out, size_t n,
                            int64_t *rows_out, int64_t *cols_out, k3c_err *err);

#endif
