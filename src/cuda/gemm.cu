/* gemm.cu — dense GEMMs through cuBLASLt: row-major C = alpha op(A) op(B) + beta C in bf16 (fp32 accumulation) and
 * float (fp32, TF32, or bf16 tensor cores on operands rounded on the fly). docs/CODE.md "cuda/", "Precision policy" (bf16 storage, fp32 accumulation). */
#include <cublasLt.h>

#include "cuda/common.cuh"

using namespace k3c_cu;

#define K3C_LT(call)                                                                                                   \
    do {                                                                                                               \
        cublasStatus_t s_ = (call);                                                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                             \
            rc = k3c_errf(err, K3C_EDEVICE, "%s:%d: %s: cuBLAS status %d", __FILE__, __LINE__, #call, (int)s_);        \
            goto done;                                                                                                 \
        }                                                                                                              \
    } while (0)

/* cuBLASLt is column-major: the row-major product C = op(A) op(B) is computed as Cᵀ = op(B)ᵀ op(A)ᵀ, i.e. with the
 * operands swapped and each row-major buffer read as its column-major transpose. batch > 1: that many products at
 * element strides sA, sB, sC in one strided-batched call. C_in (NULL: C) is the beta term's input, of C's type and
 * layout: out of place, C = alpha op(A) op(B) + beta C_in. */
static int lt_gemm(k3c_cuda_ctx *ctx, int lane, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const void *A, const void *B, float beta, void *C, cudaDataType_t ab_type, cudaDataType_t c_type,
                   cublasComputeType_t compute, int32_t batch, int64_t sA, int64_t sB, int64_t sC, k3c_err *err,
                   const void *C_in = NULL) {
    if (M < 0 || N < 0 || K < 0)
        return k3c_errf(err, K3C_EINVAL, "gemm: negative size %lld %lld %lld", (long long)M, (long long)N,
                        (long long)K);
    if (M == 0 || N == 0) return K3C_OK;
    if (!ctx || !ctx->lt) return k3c_errf(err, K3C_EINVAL, "gemm: no cuBLASLt context (call k3c_cuda_init)");
    int rc = K3C_OK;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    /* Lt's "A" is our B: stored [K,N] (no transpose) reads as column-major N×K; stored [N,K] reads as K×N. */
    cublasOperation_t ta = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint64_t a_rows = trans_b ? K : N, a_cols = trans_b ? N : K;
    uint64_t b_rows = trans_a ? M : K, b_cols = trans_a ? K : M;
    K3C_LT(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F));
    K3C_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    K3C_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    K3C_LT(cublasLtMatrixLayoutCreate(&la, ab_type, a_rows, a_cols, (int64_t)a_rows));
    K3C_LT(cublasLtMatrixLayoutCreate(&lb, ab_type, b_rows, b_cols, (int64_t)b_rows));
    K3C_LT(cublasLtMatrixLayoutCreate(&lc, c_type, N, M, N));
    if (batch > 1) {
        cublasLtMatrixLayout_t lay[3] = {la, lb, lc};
        const int64_t stride[3] = {sB, sA, sC}; /* Lt's A is our B */
        for (int i = 0; i < 3; i++) {
            K3C_LT(cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
            K3C_LT(cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride[i],
                                                    sizeof stride[i]));
        }
    }
    K3C_LT(cublasLtMatmulPreferenceCreate(&pref));
    K3C_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ctx->lt_ws_bytes,
                                                sizeof ctx->lt_ws_bytes));
    K3C_LT(cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)ctx->lt, op, la, lb, lc, lc, pref, 1, &heur, &found));
    if (!found) {
        rc = k3c_errf(err, K3C_EUNSUPPORTED, "gemm: cuBLASLt found no algorithm for %d x %lldx%lldx%lld", (int)batch,
                      (long long)M, (long long)N, (long long)K);
        goto done;
    }
    K3C_LT(cublasLtMatmul((cublasLtHandle_t)ctx->lt, op, &alpha, B, la, A, lb, &beta, C_in ? C_in : C, lc, C, lc,
                          &heur.algo, lane < 0 ? ctx->lt_ws : ctx->lane_ws[lane], ctx->lt_ws_bytes,
                          lane < 0 ? K3C_STREAM : (cudaStream_t)ctx->lane[lane]));
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return rc;
}

extern "C" int k3c_gemm_bf16_cuda(k3c_cuda_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                  float alpha, const uint16_t *A, const uint16_t *B, float beta, void *C, int c_f32,
                                  k3c_err *err) {
    return lt_gemm(ctx, -1, trans_a, trans_b, M, N, K, alpha, A, B, beta, C, CUDA_R_16BF,
                   c_f32 ? CUDA_R_32F : CUDA_R_16BF, CUBLAS_COMPUTE_32F, 1, 0, 0, 0, err);
}

extern "C" int k3c_gemm_bf16_batched_cuda(k3c_cuda_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                          float alpha, const uint16_t *A, int64_t sA, const uint16_t *B, int64_t sB,
                                          float beta, const uint16_t *C_in, uint16_t *C, int64_t sC, int32_t batch,
                                          k3c_err *err) {
    if (batch < 0) return k3c_errf(err, K3C_EINVAL, "gemm: negative batch %d", (int)batch);
    if (batch == 0) return K3C_OK;
    return lt_gemm(ctx, -1, trans_a, trans_b, M, N, K, alpha, A, B, beta, C, CUDA_R_16BF, CUDA_R_16BF,
                   CUBLAS_COMPUTE_32F, batch, sA, sB, sC, err, C_in);
}

extern "C" const char *k3c_gemm_mode_name(int gemm) {
    return gemm == K3C_GEMM_BF16 ? "bf16" : gemm == K3C_GEMM_TF32 ? "tf32" : "fp32";
}

/* K3C_GEMM_BF16 with the operands left in float asks cuBLASLt to round them itself (CUBLAS_COMPUTE_32F_FAST_16BF).
 * cuBLASLt runs that as its TF32 kernels on float loads (sm90_xmma_gemm_f32f32_tf32f32, and sm80 CUTLASS TF32 kernels
 * for long reductions), clearly slower than the same product on bf16 operands (bench_cuda gmodes). */
static cublasComputeType_t float_compute(int gemm) {
    return gemm == K3C_GEMM_TF32   ? CUBLAS_COMPUTE_32F_FAST_TF32
           : gemm == K3C_GEMM_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                   : CUBLAS_COMPUTE_32F;
}

/* Both float operands rounded to bf16 in one launch (blockIdx.y picks the operand): 16-byte loads where the source
 * and the copy allow them, element by element otherwise. */
struct bf16_copy_job {
    const float *src[2];
    bf16 *dst[2];
    int64_t n[2];
};
__global__ void bf16_copy_kernel(bf16_copy_job j) {
    const float *x = j.src[blockIdx.y];
    bf16 *y = j.dst[blockIdx.y];
    const int64_t n = j.n[blockIdx.y], stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t i0 = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (((uintptr_t)x & 15) == 0 && ((uintptr_t)y & 7) == 0) {
        for (int64_t i = i0; i < n / 4; i += stride) {
            const float4 v = ((const float4 *)x)[i];
            __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
            uint2 o;
            o.x = *(uint32_t *)&a, o.y = *(uint32_t *)&b;
            ((uint2 *)y)[i] = o;
        }
        if (blockIdx.x) return; /* the tail (< 4 elements) by the first block */
        for (int64_t i = n / 4 * 4 + threadIdx.x; i < n; i += blockDim.x) y[i] = __float2bfloat16_rn(x[i]);
        return;
    }
    for (int64_t i = i0; i < n; i += stride) y[i] = __float2bfloat16_rn(x[i]);
}

/* Whether a float product in bf16 mode runs on bf16 copies of its operands (ctx->bf16_copy: 0 never, 1 always,
 * 2 where it pays). Copying reads 4 and writes 2 bytes per operand element, so it pays where the product has many
 * multiply-adds per operand element: long reductions (a weight gradient over the tokens, e.g.
 * 1,024 x 1,024 x 16,384) and wide outputs (the LM head); a 16,384 x 1,024 x 1,024 projection breaks even and an
 * expert's 2,048 x 512 x 1,024 loses (bench_cuda gmodes). */
static int bf16_copies_pay(const k3c_cuda_ctx *ctx, int64_t M, int64_t N, int64_t K) {
    if (ctx->bf16_copy != 2) return ctx->bf16_copy == 1;
    return K >= 4096 || (M >= 8192 && N >= 8192);
}

/* The float product on bf16 copies of A and B (stream-ordered scratch on the GEMM's stream), fp32 accumulation and
 * output: the same rounding of the operands as FAST_16BF asks for, on cuBLASLt's bf16 kernels. */
static int gemm_on_bf16_copies(k3c_cuda_ctx *ctx, int lane, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                               float alpha, const float *A, const float *B, float beta, float *C, k3c_err *err) {
    cudaStream_t st = lane < 0 ? K3C_STREAM : (cudaStream_t)ctx->lane[lane];
    const int64_t na = M * K, nb = K * N, na_pad = (na + 7) / 8 * 8;
    bf16 *scratch = NULL;
    K3C_CU(cudaMallocAsync((void **)&scratch, sizeof(bf16) * (size_t)(na_pad + nb), st));
    bf16_copy_job j = {{A, B}, {scratch, scratch + na_pad}, {na, nb}};
    const int64_t most = na > nb ? na : nb, blocks = (most / 4 + 255) / 256;
    bf16_copy_kernel<<<dim3((unsigned)(blocks < 4096 ? (blocks ? blocks : 1) : 4096), 2), 256, 0, st>>>(j);
    cudaError_t e = cudaGetLastError();
    int rc =
        e == cudaSuccess ? K3C_OK : k3c_errf(err, K3C_EDEVICE, "gemm: bf16 operand copies: %s", cudaGetErrorString(e));
    if (!rc)
        rc = lt_gemm(ctx, lane, trans_a, trans_b, M, N, K, alpha, j.dst[0], j.dst[1], beta, C, CUDA_R_16BF, CUDA_R_32F,
                     CUBLAS_COMPUTE_32F, 1, 0, 0, 0, err);
    e = cudaFreeAsync(scratch, st);
    if (!rc && e != cudaSuccess) rc = k3c_errf(err, K3C_EDEVICE, "gemm: cudaFreeAsync: %s", cudaGetErrorString(e));
    return rc;
}

/* One float product at a GEMM mode, on the thread's stream (lane < 0) or a lane. */
static int float_gemm(k3c_cuda_ctx *ctx, int lane, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                      double alpha, const float *A, const float *B, double beta, float *C, int gemm, k3c_err *err) {
    if (gemm == K3C_GEMM_BF16 && M > 0 && N > 0 && K > 0 && ctx && ctx->lt && bf16_copies_pay(ctx, M, N, K))
        return gemm_on_bf16_copies(ctx, lane, trans_a, trans_b, M, N, K, (float)alpha, A, B, (float)beta, C, err);
    return lt_gemm(ctx, lane, trans_a, trans_b, M, N, K, (float)alpha, A, B, (float)beta, C, CUDA_R_32F, CUDA_R_32F,
                   float_compute(gemm), 1, 0, 0, 0, err);
}

extern "C" int k3c_matmul_batched_cuda(k3c_cuda_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                       double alpha, const float *A, int64_t sA, const float *B, int64_t sB,
                                       double beta, float *C, int64_t sC, int32_t batch, int gemm, k3c_err *err) {
    if (batch < 0) return k3c_errf(err, K3C_EINVAL, "gemm: negative batch %d", (int)batch);
    if (batch == 0) return K3C_OK;
    if (batch == 1) return float_gemm(ctx, -1, trans_a, trans_b, M, N, K, alpha, A, B, beta, C, gemm, err);
    return lt_gemm(ctx, -1, trans_a, trans_b, M, N, K, (float)alpha, A, B, (float)beta, C, CUDA_R_32F, CUDA_R_32F,
                   float_compute(gemm), batch, sA, sB, sC, err);
}

extern "C" int k3c_matmul_lane_cuda(k3c_cuda_ctx *ctx, int i, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                    double alpha, const float *A, const float *B, double beta, float *C, int gemm,
                                    k3c_err *err) {
    const int lane = ctx && ctx->lanes > 0 && i >= 0 ? i % ctx->lanes : -1;
    return float_gemm(ctx, lane, trans_a, trans_b, M, N, K, alpha, A, B, beta, C, gemm, err);
}

extern "C" int k3c_matmul_cuda(k3c_cuda_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                               double alpha, const float *A, const float *B, double beta, float *C, int gemm,
                               k3c_err *err) {
    return k3c_matmul_batched_cuda(ctx, trans_a, trans_b, M, N, K, alpha, A, 0, B, 0, beta, C, 0, 1, gemm, err);
}
