/* common.cuh — shared CUDA helpers for src/cuda: return-code checking, bf16 packing, ldmatrix / mma.sync / cp.async
 * wrappers over the 16-bit element type (bf16, or fp16 for the precise variant) and per-document chunk indexing. Implements the device plumbing of docs/CODE.md "Precision policy" (bf16 storage,
 * fp32 accumulation); the fragment layouts are those of PTX mma.m16n8k16 (row.col, bf16 or fp16 → f32). */
#ifndef K3C_CUDA_COMMON_CUH
#define K3C_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuda_ops.h"

/* Every CUDA call is checked; a failure becomes K3C_EDEVICE with the call, file and line in err. */
#define K3C_CU(call)                                                                                                   \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess)                                                                                         \
            return k3c_errf(err, K3C_EDEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_));     \
    } while (0)

/* After every launch: launch-configuration errors surface here, asynchronous faults at the next synchronising call. */
#define K3C_CU_LAUNCHED(what) K3C_CU(cudaGetLastError())

/* Ops run on the calling thread's default stream: the op signatures match the CPU ones (no stream argument), and
 * per-thread streams keep host threads from serialising each other without any global state. */
#define K3C_STREAM cudaStreamPerThread

namespace k3c_cu {

typedef __nv_bfloat16 bf16;

/* The last i < n with a[i] <= v over ascending offsets a (a[0] <= v), so empty ranges are passed over. */
__device__ __forceinline__ int last_at_most(const int32_t *a, int n, int64_t v) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (a[mid] <= v)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* The document holding token t of cu_seqlens cu (n_docs + 1 offsets): the last d with cu[d] <= t, so empty documents
 * are passed over; 0 when cu is NULL (one document). */
__device__ __forceinline__ int doc_of(const int32_t *cu, int n_docs, int64_t t) {
    return cu ? last_at_most(cu, n_docs, t) : 0;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
/* Stored weight elements decoded in registers (k3c_qmat views: the engine's and qmat.cu's products): a bf16 value's
 * bits, and E2M1 (bit 3 sign, bits 2–1 exponent, bit 0 mantissa): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives. */
__device__ __forceinline__ float bf16f(uint16_t h) { return __int_as_float((int)((unsigned)h << 16)); }
__device__ __forceinline__ float e2m1(unsigned nib) {
    const unsigned e = (nib >> 1) & 3u, m = nib & 1u;
    const float v = e == 0 ? 0.5f * (float)m : __int_as_float((int)(((e + 126u) << 23) | (m << 22)));
    return nib & 8u ? -v : v;
}

/* A float result stored as the output's element type (float, or bf16 rounded to nearest). */
__device__ __forceinline__ void store_as(float *p, float v) { *p = v; }
__device__ __forceinline__ void store_as(bf16 *p, float v) { *p = __float2bfloat16_rn(v); }

__device__ __forceinline__ float2 unpack_bf16(uint32_t u) {
    __nv_bfloat162 v = *reinterpret_cast<__nv_bfloat162 *>(&u);
    return __bfloat1622float2(v);
}

/* The 16-bit element of the tensor-core kernels (KDA, attention). bf16 by default; a translation unit that defines
 * K3C_CU_F16 = 1 before including this header (kda_f16.cu, attention_f16.cu) compiles the same kernels with fp16 elements: 3 more
 * mantissa bits (rounding 8× finer) for a range of ±65504, the precise variant. Its kernels live in namespace
 * k3c_cu::f16 and its entry points are named *_f16_cuda (K3C_KENTRY), so both variants link into one library. */
#ifndef K3C_CU_F16
#define K3C_CU_F16 0
#endif
#if K3C_CU_F16
typedef __half elem;
#define K3C_ELEM_NS f16
#define K3C_KENTRY(base) base##_f16_cuda
__device__ __forceinline__ uint32_t pack_e(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
__device__ __forceinline__ float2 unpack_e(uint32_t u) { return __half22float2(*reinterpret_cast<__half2 *>(&u)); }
__device__ __forceinline__ elem to_e(float x) { return __float2half_rn(x); }
__device__ __forceinline__ float from_e(elem x) { return __half2float(x); }
#define K3C_MMA_TYPES "f16.f16"
/* float inputs → the kernels' element type (stream-ordered) */
static inline int f32_to_elem(const float *x, elem *y, size_t n, k3c_err *err) {
    return k3c_cuda_f32_to_f16(x, (uint16_t *)y, n, err);
}
#else
typedef bf16 elem;
#define K3C_ELEM_NS b16
#define K3C_KENTRY(base) base##_cuda
__device__ __forceinline__ uint32_t pack_e(float lo, float hi) { return pack_bf16(lo, hi); }
__device__ __forceinline__ float2 unpack_e(uint32_t u) { return unpack_bf16(u); }
__device__ __forceinline__ elem to_e(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ float from_e(elem x) { return __bfloat162float(x); }
#define K3C_MMA_TYPES "bf16.bf16"
static inline int f32_to_elem(const float *x, elem *y, size_t n, k3c_err *err) {
    return k3c_cuda_f32_to_bf16(x, (uint16_t *)y, n, err);
}
#endif

/* 2^x in one MUFU instruction; subnormal results flush to 0 (harmless for decays, which are ≤ 1 and used as factors). */
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* ldmatrix: lane l supplies the address of row (l % 8) of matrix (l / 8); register i receives matrix i. */
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

/* d += a · b for one m16n8k16 tile of elems. a: 4 regs (rows g, g+8 × cols 2t.., 2t+8..), b: 2 regs, d: 4 floats. */
__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." K3C_MMA_TYPES ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* d += a · b for one m16n8k8 TF32 tile (fp32 in, rounded to tf32; layouts as m16n8k16 with k halved: a0 (g, t),
 * a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); b0 (k=t, n=g), b1 (k=t+4, n=g)). */
__device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ void mma1688_tf32(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Fragment loaders from padded row-major shared tiles (row stride `ld` elements, 2·ld bytes an odd multiple of 16, so
 * the eight rows of one ldmatrix land in distinct bank groups).
 * A (16×16 at row r0, col k0) from a row-major [M][K] tile. */
__device__ __forceinline__ void lda_rowmajor(uint32_t a[4], const elem *s, int ld, int r0, int k0, int lane) {
    ldsm_x4(a, s + (r0 + (lane & 15)) * ld + k0 + ((lane >> 4) << 3));
}
/* A (16×16) where A[m][k] = X[k][m], X stored row-major [K][M] (a transposed operand such as Kᵀ). */
__device__ __forceinline__ void lda_trans(uint32_t a[4], const elem *x, int ld, int m0, int k0, int lane) {
    ldsm_x4_t(a, x + (k0 + (lane & 7) + ((lane >> 4) << 3)) * ld + m0 + (((lane >> 3) & 1) << 3));
}
/* B for two n-tiles (n0 .. n0+15) × k0 .. k0+15 where B[k][n] = X[n][k], X stored row-major [N][K] (e.g. K in Q·Kᵀ).
 * b[0], b[1]: n-tile n0; b[2], b[3]: n-tile n0 + 8. */
__device__ __forceinline__ void ldb_nmajor(uint32_t b[4], const elem *x, int ld, int n0, int k0, int lane) {
    ldsm_x4(b, x + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + (((lane >> 3) & 1) << 3));
}
/* B for two n-tiles where B is stored row-major [K][N] (e.g. V in P·V). Same register order as ldb_nmajor. */
__device__ __forceinline__ void ldb_kmajor(uint32_t b[4], const elem *x, int ld, int n0, int k0, int lane) {
    ldsm_x4_t(b, x + (k0 + (lane & 7) + (((lane >> 3) & 1) << 3)) * ld + n0 + ((lane >> 4) << 3));
}

/* A fragment (rows r0.., cols k0..k0+15) of a row-major fp32 shared matrix, rounded to elem. */
__device__ __forceinline__ void lda_f32(uint32_t a[4], const float *s, int ld, int r0, int k0, int lane) {
    const int r = r0 + (lane >> 2), c = k0 + 2 * (lane & 3);
    a[0] = pack_e(s[r * ld + c], s[r * ld + c + 1]);
    a[1] = pack_e(s[(r + 8) * ld + c], s[(r + 8) * ld + c + 1]);
    a[2] = pack_e(s[r * ld + c + 8], s[r * ld + c + 9]);
    a[3] = pack_e(s[(r + 8) * ld + c + 8], s[(r + 8) * ld + c + 9]);
}
/* A fragment of Xᵀ (A[m][k] = X[k][m]) from a row-major fp32 shared X, rounded to elem. */
__device__ __forceinline__ void lda_f32_trans(uint32_t a[4], const float *x, int ld, int m0, int k0, int lane) {
    const int m = m0 + (lane >> 2), k = k0 + 2 * (lane & 3);
    a[0] = pack_e(x[k * ld + m], x[(k + 1) * ld + m]);
    a[1] = pack_e(x[k * ld + m + 8], x[(k + 1) * ld + m + 8]);
    a[2] = pack_e(x[(k + 8) * ld + m], x[(k + 9) * ld + m]);
    a[3] = pack_e(x[(k + 8) * ld + m + 8], x[(k + 9) * ld + m + 8]);
}

/* cp.async 16 bytes; src_bytes = 0 zero-fills the destination (rows past the end of a document or tensor). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* Copies a rows×cols elem tile (cols a multiple of 8) from global (row stride gld elements) into shared (row stride
 * sld); rows >= valid_rows and columns >= valid_cols are zero-filled. All threads of the block take part. */
__device__ __forceinline__ void tile_load_async(elem *s, int sld, const elem *g, int64_t gld, int rows, int cols,
                                                int valid_rows, int valid_cols, int tid, int nthreads) {
    const int cpr = cols >> 3; /* 16-byte chunks per row */
    for (int c = tid; c < rows * cpr; c += nthreads) {
        int r = c / cpr, col = (c - r * cpr) << 3;
        bool ok = r < valid_rows && col < valid_cols;
        const elem *src = ok ? g + (int64_t)r * gld + col : g;
        cp_async16(s + r * sld + col, src, ok ? 16 : 0);
    }
}

/* The document holding chunk c of the packed batch, and that chunk's first token and length, from the per-document
 * chunk offsets coff[0..n_docs] (documents split into chunks of `chunk` tokens; empty documents hold none). */
struct chunk_loc {
    int doc, t0, len, idx; /* idx: chunk number inside the document */
};
__device__ __forceinline__ chunk_loc locate_chunk(const int *coff, const int32_t *cu, int n_docs, int T, int c,
                                                  int chunk) {
    int lo = 0, hi = n_docs - 1;
    while (lo < hi) { /* last doc with coff[doc] <= c */
        int mid = (lo + hi + 1) >> 1;
        if (coff[mid] <= c)
            lo = mid;
        else
            hi = mid - 1;
    }
    chunk_loc r;
    int bos = cu ? cu[lo] : 0, eos = cu ? cu[lo + 1] : T;
    r.doc = lo, r.idx = c - coff[lo], r.t0 = bos + r.idx * chunk;
    r.len = min(chunk, eos - r.t0);
    return r;
}

} // namespace k3c_cu

#endif
