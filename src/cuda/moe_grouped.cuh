/* moe_grouped.cuh — the routed experts' products over all experts in one launch each (bf16 operands, fp32
 * accumulation): the bf16 GEMM mode of moe.cu. docs/MODEL.md §9.2. */
#ifndef K3C_CUDA_MOE_GROUPED_CUH
#define K3C_CUDA_MOE_GROUPED_CUH

#include "cuda/common.cuh"

/* Rows of one tile of a token product: the group table counts each expert's rows in tiles of this many. */
#define K3C_MOE_GG_ROWS 128

/* The experts' row groups on the device, int32 [3E + 1]: row0[e] (the expert's first row in the padded, expert-sorted
 * activations), rows[e], tile0[e] (its first row tile; tile0[E] = all tiles). */
struct k3c_moe_groups {
    const int32_t *table;
    int experts, tiles;
};

/* One grouped product. Token products (the experts' forward and input-gradient GEMMs), for expert e and its rows
 * r = row0[e] + i, i < rows[e]:
 *     C[r, j] = Σ_k A[r, k] · W_e(k, j),   W_e = B + e·sB read as [N][K] (b_kmajor 0: x·Wᵀ) or [K][N] (b_kmajor 1: x·W)
 * with columns j ≥ split written to C2[r, j − split] instead. Weight products (the weight gradients; K = the expert's
 * rows):
 *     C_e[i, j] += Σ_{t < rows[e]} A[row0[e] + t, i] · B[row0[e] + t, j],   C_e = C + e·sC
 * with rows i ≥ split added to C2 + e·sC at row i − split. Every leading dimension and M, N, K multiples of 8; A and B
 * 16-byte aligned. C or C2 NULL: those outputs are skipped. */
struct k3c_moe_gemm {
    const __nv_bfloat16 *A, *B;
    int64_t lda, ldb, sB;
    float *C, *C2;
    int64_t ldc, sC, split;
    int64_t M, N, K; /* token products: N, K (M is each expert's rows); weight products: M, N */
};

int k3c_moe_gemm_tokens_cuda(const k3c_moe_groups *g, const k3c_moe_gemm *p, int b_kmajor, k3c_err *err);
/* The token product with both operands K-major (b_kmajor 0) and the weight product (both operands token-major, read
 * MN-major) on Hopper's wgmma (moe_wgmma.cu); k3c_moe_gemm_tokens_cuda and k3c_moe_gemm_weights_cuda take them where
 * k3c_moe_wgmma_ok (the current device is sm_90), the mma.sync kernels elsewhere. Neither checks its arguments: the
 * callers' checks stand. */
int k3c_moe_wgmma_ok(void);
int k3c_moe_gemm_tokens_wgmma_cuda(const k3c_moe_groups *g, const k3c_moe_gemm *p, k3c_err *err);
int k3c_moe_gemm_weights_wgmma_cuda(const k3c_moe_groups *g, const k3c_moe_gemm *p, k3c_err *err);
int k3c_moe_gemm_weights_cuda(const k3c_moe_groups *g, const k3c_moe_gemm *p, k3c_err *err);

/* The experts' weights in bf16 for the grouped products: gu[e] = [w1[e]; w3[e]] ([2I][D]) and w2b = w2 ([E][D][I]). */
int k3c_moe_weights_bf16_cuda(int64_t E, int64_t D, int64_t I, const float *w1, const float *w3, const float *w2,
                              __nv_bfloat16 *gu, __nv_bfloat16 *w2b, k3c_err *err);
/* The same transposed, for the backward's token products with K-major weights: guT[e] = [w1[e]; w3[e]]ᵀ ([D][2I]) and
 * w2T[e] = w2[e]ᵀ ([I][D]). */
int k3c_moe_weights_bf16_t_cuda(int64_t E, int64_t D, int64_t I, const float *w1, const float *w3, const float *w2,
                                __nv_bfloat16 *guT, __nv_bfloat16 *w2T, k3c_err *err);

#endif
