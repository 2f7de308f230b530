/* gemm.cu — dense GEMMs through cuBLASLt: row-major C = alpha op(A) op(B) + beta C in bf16 (fp32 accumulation) and
 * float (fp32, TF32, or bf16 tensor cores on operands rounded on the fly). docs/CODE.md "cuda/", "Precision policy" (bf16 storage, fp32 accumulation). */
#include <cublasLt.h>
#include <string.h>

#include <mutex>
#include <new>

#include "cuda/common.cuh"

/* ---------------------------------------------------------------- plans
 * Choosing an algorithm (cublasLtMatmulAlgoGetHeuristic) and building the four descriptors costs the host tens of
 * microseconds, more than many of the step's GEMMs take on the GPU (the routed experts' are ~5 µs each), so each shape
 * is planned once per context and reused. The table only grows (a step has a few hundred shapes; the MoE rounds its
 * per-expert row counts to 64 so they repeat); when it is full a shape is planned per call as before. */
namespace {

struct lt_key { /* memcmp-compared: built zeroed */
    int64_t M, N, K, sA, sB, sC;
    int32_t batch, trans_a, trans_b, ab_type, c_type, compute;
};
struct lt_plan {
    lt_key key;
    int used;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};
const int LT_SLOTS = 2048; /* a power of two; filled to 3/4 at most */
struct lt_plans {
    std::mutex mu;
    int n;
    lt_plan slot[LT_SLOTS];
};

uint64_t key_hash(const lt_key &k) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    const unsigned char *b = (const unsigned char *)&k;
    for (size_t i = 0; i < sizeof k; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

void plan_destroy(lt_plan *p) {
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    p->op = NULL, p->la = p->lb = p->lc = NULL;
}

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
 * element strides sA, sB, sC in one strided-batched call. On failure p holds nothing. */
int plan_build(k3c_cuda_ctx *ctx, const lt_key &k, lt_plan *p, k3c_err *err) {
    int rc = K3C_OK, found = 0;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    const cudaDataType_t ab = (cudaDataType_t)k.ab_type, ct = (cudaDataType_t)k.c_type;
    /* Lt's "A" is our B: stored [K,N] (no transpose) reads as column-major N×K; stored [N,K] reads as K×N. */
    cublasOperation_t ta = k.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = k.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const uint64_t a_rows = k.trans_b ? k.K : k.N, a_cols = k.trans_b ? k.N : k.K;
    const uint64_t b_rows = k.trans_a ? k.M : k.K, b_cols = k.trans_a ? k.K : k.M;
    memset(p, 0, sizeof *p);
    p->key = k;
    K3C_LT(cublasLtMatmulDescCreate(&p->op, (cublasComputeType_t)k.compute, CUDA_R_32F));
    K3C_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    K3C_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    K3C_LT(cublasLtMatrixLayoutCreate(&p->la, ab, a_rows, a_cols, (int64_t)a_rows));
    K3C_LT(cublasLtMatrixLayoutCreate(&p->lb, ab, b_rows, b_cols, (int64_t)b_rows));
    K3C_LT(cublasLtMatrixLayoutCreate(&p->lc, ct, k.N, k.M, k.N));
    if (k.batch > 1) {
        cublasLtMatrixLayout_t lay[3] = {p->la, p->lb, p->lc};
        const int64_t stride[3] = {k.sB, k.sA, k.sC}; /* Lt's A is our B */
        for (int i = 0; i < 3; i++) {
            K3C_LT(cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &k.batch,
                                                    sizeof k.batch));
            K3C_LT(cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride[i],
                                                    sizeof stride[i]));
        }
    }
    K3C_LT(cublasLtMatmulPreferenceCreate(&pref));
    K3C_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ctx->lt_ws_bytes,
                                                sizeof ctx->lt_ws_bytes));
    K3C_LT(cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)ctx->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &heur,
                                          &found));
    if (!found)
        rc = k3c_errf(err, K3C_EUNSUPPORTED, "gemm: cuBLASLt found no algorithm for %d x %lldx%lldx%lld", (int)k.batch,
                      (long long)k.M, (long long)k.N, (long long)k.K);
    else
        p->algo = heur.algo;
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (rc) plan_destroy(p);
    return rc;
}

/* The plan of key k: from the table, else built (and kept while the table has room; else in *tmp, which the caller
 * destroys). */
int plan_get(k3c_cuda_ctx *ctx, const lt_key &k, const lt_plan **out, lt_plan *tmp, k3c_err *err) {
    lt_plans *t = (lt_plans *)ctx->lt_plans;
    std::lock_guard<std::mutex> lock(t->mu);
    uint64_t i = key_hash(k) & (LT_SLOTS - 1);
    for (; t->slot[i].used; i = (i + 1) & (LT_SLOTS - 1))
        if (!memcmp(&t->slot[i].key, &k, sizeof k)) {
            *out = &t->slot[i];
            return K3C_OK;
        }
    const int keep = t->n < LT_SLOTS / 4 * 3;
    lt_plan *p = keep ? &t->slot[i] : tmp;
    int rc = plan_build(ctx, k, p, err);
    if (rc) return rc;
    if (keep) p->used = 1, t->n++;
    *out = p;
    return K3C_OK;
}

int lt_gemm(k3c_cuda_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
            const void *B, float beta, void *C, cudaDataType_t ab_type, cudaDataType_t c_type,
            cublasComputeType_t compute, int32_t batch, int64_t sA, int64_t sB, int64_t sC, k3c_err *err) {
    if (M < 0 || N < 0 || K < 0)
        return k3c_errf(err, K3C_EINVAL, "gemm: negative size %lld %lld %lld", (long long)M, (long long)N,
                        (long long)K);
    if (M == 0 || N == 0) return K3C_OK;
    if (!ctx || !ctx->lt || !ctx->lt_plans)
        return k3c_errf(err, K3C_EINVAL, "gemm: no cuBLASLt context (call k3c_cuda_init)");
    lt_key k;
    memset(&k, 0, sizeof k);
    k.M = M, k.N = N, k.K = K, k.batch = batch > 1 ? batch : 1, k.trans_a = trans_a != 0, k.trans_b = trans_b != 0;
    if (k.batch > 1) k.sA = sA, k.sB = sB, k.sC = sC;
    k.ab_type = (int32_t)ab_type, k.c_type = (int32_t)c_type, k.compute = (int32_t)compute;
    const lt_plan *p = NULL;
    lt_plan tmp;
    memset(&tmp, 0, sizeof tmp);
    int rc = plan_get(ctx, k, &p, &tmp, err);
    if (!rc) {
        cublasStatus_t s = cublasLtMatmul((cublasLtHandle_t)ctx->lt, p->op, &alpha, B, p->la, A, p->lb, &beta, C,
                                          p->lc, C, p->lc, &p->algo, ctx->lt_ws, ctx->lt_ws_bytes, K3C_STREAM);
        if (s != CUBLAS_STATUS_SUCCESS)
            rc = k3c_errf(err, K3C_EDEVICE, "gemm: cublasLtMatmul %d x %lldx%lldx%lld: cuBLAS status %d", (int)batch,
                          (long long)M, (long long)N, (long long)K, (int)s);
    }
    plan_destroy(&tmp);
    return rc;
}

} // namespace

extern "C" int k3c_cuda_lt_plans_new(k3c_cuda_ctx *ctx, k3c_err *err) {
    lt_plans *t = new (std::nothrow) lt_plans();
    if (!t) return k3c_errf(err, K3C_ENOMEM, "cuda: the GEMM plan table (%zu bytes)", sizeof(lt_plans));
    ctx->lt_plans = t;
    return K3C_OK;
}

extern "C" void k3c_cuda_lt_plans_free(k3c_cuda_ctx *ctx) {
    lt_plans *t = (lt_plans *)ctx->lt_plans;
    if (!t) return;
    for (int i = 0; i < LT_SLOTS; i++)
        if (t->slot[i].used) plan_destroy(&t->slot[i]);
    delete t;
    ctx->lt_plans = NULL;
}

extern "C" int k3c_gemm_bf16_cuda(k3c_cuda_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                  float alpha, const uint16_t *A, const uint16_t *B, float beta, void *C, int c_f32,
                                  k3c_err *err) {
    return lt_gemm(ctx, trans_a, trans_b, M, N, K, alpha, A, B, beta, C, CUDA_R_16BF, c_f32 ? CUDA_R_32F : CUDA_R_16BF,
                   CUBLAS_COMPUTE_32F, 1, 0, 0, 0, err);
}

extern "C" const char *k3c_gemm_mode_name(int gemm) {
    return gemm == K3C_GEMM_BF16 ? "bf16" : gemm == K3C_GEMM_TF32 ? "tf32" : "fp32";
}

/* K3C_GEMM_BF16 asks cuBLASLt to round the float operands to bf16 itself (CUBLAS_COMPUTE_32F_FAST_16BF): the same
 * products as converting into bf16 scratch copies first, without the copies (kimi_linear_medium 16K step on the H200,
 * 2026-12-04: 213.7 ms with the copies, 204.5 ms without; bench/RESULTS.md). */
static cublasComputeType_t float_compute(int gemm) {
    return gemm == K3C_GEMM_TF32   ? CUBLAS_COMPUTE_32F_FAST_TF32
           : gemm == K3C_GEMM_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                   : CUBLAS_COMPUTE_32F;
}

extern "C" int k3c_matmul_batched_cuda(k3c_cuda_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                       double alpha, const float *A, int64_t sA, const float *B, int64_t sB,
                                       double beta, float *C, int64_t sC, int32_t batch, int gemm, k3c_err *err) {
    if (batch < 0) return k3c_errf(err, K3C_EINVAL, "gemm: negative batch %d", (int)batch);
    if (batch == 0) return K3C_OK;
    return lt_gemm(ctx, trans_a, trans_b, M, N, K, (float)alpha, A, B, (float)beta, C, CUDA_R_32F, CUDA_R_32F,
                   float_compute(gemm), batch, sA, sB, sC, err);
}

extern "C" int k3c_matmul_cuda(k3c_cuda_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                               double alpha, const float *A, const float *B, double beta, float *C, int gemm,
                               k3c_err *err) {
    return k3c_matmul_batched_cuda(ctx, trans_a, trans_b, M, N, K, alpha, A, 0, B, 0, beta, C, 0, 1, gemm, err);
}
