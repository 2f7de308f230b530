/* qmat.cu — the CUDA twin of k3c_qmat_mul (ops/qmat.h): Y = X·Wᵀ over a weight view kept as stored (float32, bf16, or
 * MXFP4 packed E2M1 + UE8M0 scales), the weights decoded in registers, never dequantised in memory (W4A16 for MXFP4).
 * docs/FORMATS.md §6; declared in cuda/cuda_ops.h. */
#include "cuda/common.cuh"

namespace {

constexpr int QM_WARPS = 4; /* rows per block: one warp per weight row */
constexpr int QM_NB = 8;    /* inputs per pass: each weight is loaded once for QM_NB inputs */

using k3c_cu::bf16f;
using k3c_cu::e2m1;

/* Lane-strided partial sums of row r against inputs j0 .. j0+nb−1, then a warp reduction; lane 0 writes. */
template <int TYPE>
__global__ void qmat_kernel(int64_t R, int64_t C, const void *w, const uint8_t *scale, const float *X, int64_t n,
                            float *Y, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * QM_WARPS + threadIdx.x / 32;
    if (r >= R) return;
    for (int64_t j0 = 0; j0 < n; j0 += QM_NB) {
        const int nb = n - j0 < QM_NB ? (int)(n - j0) : QM_NB;
        const float *x = X + j0 * C;
        float acc[QM_NB];
#pragma unroll
        for (int k = 0; k < QM_NB; k++) acc[k] = 0.f;
        if (TYPE == K3C_QMAT_MXFP4) {
            const uint8_t *p = (const uint8_t *)w + r * (C / 2);
            for (int64_t g = lane; g < C / 32; g += 32) {
                const float sc = ldexpf(1.f, (int)scale[r * (C / 32) + g] - 127);
                for (int b = 0; b < 16; b++) {
                    const unsigned byte = p[g * 16 + b];
                    const float w0 = e2m1(byte & 15u) * sc, w1 = e2m1(byte >> 4) * sc;
                    const int64_t c = g * 32 + 2 * b;
#pragma unroll
                    for (int k = 0; k < QM_NB; k++)
                        if (k < nb) acc[k] += w0 * x[k * C + c] + w1 * x[k * C + c + 1];
                }
            }
        } else {
            for (int64_t c = lane; c < C; c += 32) {
                const float wv =
                    TYPE == K3C_QMAT_BF16 ? bf16f(((const uint16_t *)w)[r * C + c]) : ((const float *)w)[r * C + c];
#pragma unroll
                for (int k = 0; k < QM_NB; k++)
                    if (k < nb) acc[k] += wv * x[k * C + c];
            }
        }
#pragma unroll
        for (int k = 0; k < QM_NB; k++) {
            float s = acc[k];
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == 0 && k < nb) {
                float *y = Y + (j0 + k) * R + r;
                *y = accumulate ? *y + s : s;
            }
        }
    }
}

} // namespace

extern "C" int k3c_qmat_mul_cuda(const k3c_qmat *W, const float *X, int64_t n, float *Y, int accumulate, k3c_err *err) {
    if (k3c_qmat_check(W, "qmat_mul_cuda", err)) return K3C_EINVAL;
    if (n < 0) return k3c_errf(err, K3C_EINVAL, "qmat_mul_cuda: negative n %lld", (long long)n);
    if (n == 0) return 0;
    const int64_t blocks = (W->rows + QM_WARPS - 1) / QM_WARPS;
    if (blocks > INT32_MAX) return k3c_errf(err, K3C_EINVAL, "qmat_mul_cuda: %lld rows", (long long)W->rows);
    const dim3 grid((unsigned)blocks), block(32 * QM_WARPS);
    if (W->type == K3C_QMAT_MXFP4)
        qmat_kernel<K3C_QMAT_MXFP4>
            <<<grid, block, 0, K3C_STREAM>>>(W->rows, W->cols, W->w, W->scale, X, n, Y, accumulate);
    else if (W->type == K3C_QMAT_BF16)
        qmat_kernel<K3C_QMAT_BF16>
            <<<grid, block, 0, K3C_STREAM>>>(W->rows, W->cols, W->w, W->scale, X, n, Y, accumulate);
    else
        qmat_kernel<K3C_QMAT_F32>
            <<<grid, block, 0, K3C_STREAM>>>(W->rows, W->cols, W->w, W->scale, X, n, Y, accumulate);
    K3C_CU_LAUNCHED("qmat_mul");
    return 0;
}
