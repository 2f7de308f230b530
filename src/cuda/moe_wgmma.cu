/* moe_wgmma.cu — the routed experts' token and weight products on Hopper's warpgroup MMA (wgmma, sm_90a): bf16 operands
 * from 128-byte-swizzled shared memory, fp32 accumulators in registers. docs/MODEL.md §9.2. */
#include "cuda/moe_grouped.cuh"

using namespace k3c_cu;

namespace {

/* A 128 × 128 output tile per block of two warpgroups (64 rows each, one m64n128k16 per 16-deep step), K in steps of
 * 64: a tile row of one stage is exactly one 128-byte swizzle row, 16-byte chunk c of row r stored at chunk c ^ (r % 8)
 * (what the descriptors' 128-byte swizzle mode reads; the stage tiles are 1024-byte aligned). 3 stages of cp.async, two
 * blocks per SM. Token products: both operands K-major, A [rows][K], B per expert [N][K]. Weight products: both
 * MN-major, A [tokens][M] and B [tokens][N], a stage being 64 tokens × 128 columns stored as two 64-column halves. */
constexpr int BM = K3C_MOE_GG_ROWS, BN = 128, STAGES = 3, THREADS = 256;
constexpr int TILE_BYTES = 128 * 128; /* 128 rows × 64 bf16 */
constexpr size_t SMEM = 2 * STAGES * TILE_BYTES + 1024; /* + slack to align the tiles to 1024 bytes */
static_assert(BM == 128, "two warpgroups of 64 rows");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) /* the device pass for sm_90a: the rest have only the trap below */
constexpr int BK = 64;
constexpr int HALF_BYTES = 64 * 128; /* weight products: one 64-column half of a stage, 64 tokens × 128 bytes */

/* Shared-memory matrix descriptor, K-major with the 128-byte swizzle: start address, leading offset unused (1),
 * stride 1024 bytes between 8-row groups, swizzle mode 1 in bits 62–63. */
__device__ __forceinline__ uint64_t desc_sw128(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

/* 128 rows × 64 columns of g (row stride gld) into the swizzled tile s; rows ≥ valid_rows and columns ≥ valid_cols
 * (multiples of 8) are zero-filled. */
__device__ __forceinline__ void load_sw128(unsigned char *s, const bf16 *g, int64_t gld, int valid_rows, int valid_cols,
                                           int tid) {
#pragma unroll
    for (int c = tid; c < 128 * 8; c += THREADS) {
        const int r = c >> 3, ch = c & 7;
        const bool ok = r < valid_rows && ch * 8 < valid_cols;
        cp_async16(s + r * 128 + ((ch ^ (r & 7)) << 4), ok ? g + (int64_t)r * gld + ch * 8 : g, ok ? 16 : 0);
    }
}

/* Shared-memory matrix descriptor, MN-major with the 128-byte swizzle (CuTe's canonical MN-major SW128 layout, in
 * 16-byte units ((8,n),(8,k)):((1,LBO),(8,SBO)), cute/atom/mma_traits_sm90_gmma.hpp make_gmma_desc<Major::MN>): one
 * swizzle atom is 64 MN-elements (one 128-byte row) × 8 K-rows (1024 bytes). Leading offset = the stride between atoms
 * along MN (PTX: "stride from the first (swizzle-byte-size/16) rows to the next"), here between the two 64-column halves
 * of a stage, 64 rows × 128 bytes = 8192 bytes (only B's N = 128 spans both; A's 64 rows lie in one half). Stride
 * offset = between 8-token groups, 8 × 128 = 1024 bytes. Swizzle mode 1 (128 bytes) in bits 62–63; base offset 0, every
 * start address (stage, half, 16-token step of 2048 bytes) being 1024-byte aligned. */
__device__ __forceinline__ uint64_t desc_mn_sw128(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)(HALF_BYTES >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

/* 64 rows × 128 columns of g (row stride gld) into the two swizzled halves of s (columns 64h.. at s + h·HALF_BYTES);
 * rows ≥ valid_rows (the token tail: it must add zeros) and columns ≥ valid_cols (a multiple of 8) are zero-filled. */
__device__ __forceinline__ void load_mn_sw128(unsigned char *s, const bf16 *g, int64_t gld, int valid_rows,
                                              int valid_cols, int tid) {
#pragma unroll
    for (int c = tid; c < 64 * 16; c += THREADS) {
        const int r = c >> 4, ch = c & 15, h = ch >> 3, cc = ch & 7;
        const bool ok = r < valid_rows && ch * 8 < valid_cols;
        cp_async16(s + h * HALF_BYTES + r * 128 + ((cc ^ (r & 7)) << 4), ok ? g + (int64_t)r * gld + ch * 8 : g,
                   ok ? 16 : 0);
    }
}

/* TNSP 0: a and b K-major; 1: both MN-major (imm-trans-a = imm-trans-b = 1). */
template <int TNSP> __device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db) {
    /* scale-d = 1 (d += a·b: the accumulators start at zero), a and b unscaled */
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1, %66, %66;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "n"(TNSP));
}
/* Keeps the compiler from moving accumulator reads or writes across the asynchronous MMAs. */
__device__ __forceinline__ void fence_acc(float (&d)[64]) {
#pragma unroll
    for (int i = 0; i < 64; i++) asm volatile("" : "+f"(d[i])::"memory");
}
#endif

__global__ void __launch_bounds__(THREADS, 2) moe_wgmma_kernel(k3c_moe_groups g, k3c_moe_gemm p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    unsigned char *sa = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023), *sb = sa + STAGES * TILE_BYTES;
    const int E = g.experts, tid = threadIdx.x, wg = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31;
    /* the N tiles of a row tile side by side, as in moe_grouped.cu */
    const int ntiles = (int)((p.N + BN - 1) / BN), mt = blockIdx.x / ntiles, n0 = (blockIdx.x - mt * ntiles) * BN;
    const int e = last_at_most(g.table + 2 * E, E, mt), m0 = (mt - g.table[2 * E + e]) * BM;
    const int mvalid = g.table[E + e] - m0, nvalid = (int)p.N - n0, K = (int)p.K;
    const int64_t row0 = g.table[e];
    const bf16 *Ag = p.A + (row0 + m0) * p.lda, *Bg = p.B + e * p.sB + (int64_t)n0 * p.ldb;
    auto load = [&](int slot, int k0) {
        load_sw128(sa + slot * TILE_BYTES, Ag + k0, p.lda, mvalid, K - k0, tid);
        load_sw128(sb + slot * TILE_BYTES, Bg + k0, p.ldb, nvalid, K - k0, tid);
    };
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; i++) d[i] = 0.f;
    const int nk = (K + BK - 1) / BK;
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nk) load(s, s * BK);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<STAGES - 2>();
        /* this thread's copies of tile kt, written through the generic proxy, made visible to the MMAs' async proxy;
         * the barrier then publishes every thread's, and (each warpgroup having waited for its MMAs of kt − 1) frees
         * the slot refilled below */
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (kt + STAGES - 1 < nk) load((kt + STAGES - 1) % STAGES, (kt + STAGES - 1) * BK);
        cp_async_commit();
        const uint32_t a0 = smem_u32(sa + (kt % STAGES) * TILE_BYTES + wg * 64 * 128),
                       b0 = smem_u32(sb + (kt % STAGES) * TILE_BYTES);
        fence_acc(d);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) /* 16 bf16 = 32 bytes along the swizzled row */
            wgmma_m64n128k16<0>(d, desc_sw128(a0 + kk * 32), desc_sw128(b0 + kk * 32));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        fence_acc(d);
    }
    cp_async_wait<0>();
    /* accumulator i of the m64n128 tile: row 16·warp + lane/4 (+ 8 for bit 1 of i), column 8·(i/4) + 2·(lane % 4)
     * (+ 1 for bit 0) */
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int m = wg * 64 + w * 16 + (lane >> 2) + 8 * h, n = j * 8 + 2 * (lane & 3);
            if (m >= mvalid || n >= nvalid) continue;
            const int64_t row = row0 + m0 + m, col = n0 + n;
            float *dst = col < p.split ? (p.C ? p.C + row * p.ldc + col : nullptr)
                                       : (p.C2 ? p.C2 + row * p.ldc + col - p.split : nullptr);
            if (dst) *(float2 *)dst = make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
        }
#else
    __trap(); /* built for sm_90a only; k3c_moe_wgmma_ok keeps other devices off this kernel */
#endif
}

/* The weight product: grid (N tiles, M tiles, experts), K = the expert's rows, any count (the last stage's token tail
 * is zero-filled). Each output element is summed by one thread over the tokens in order and added to C once, so the
 * result does not depend on the schedule. */
__global__ void __launch_bounds__(THREADS, 2) moe_wgmma_weights_kernel(k3c_moe_groups g, k3c_moe_gemm p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    unsigned char *sa = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023), *sb = sa + STAGES * TILE_BYTES;
    const int E = g.experts, tid = threadIdx.x, wg = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31;
    const int e = blockIdx.z, m0 = blockIdx.y * BM, n0 = blockIdx.x * BN, K = g.table[E + e];
    if (K == 0) return; /* C += nothing */
    const int mvalid = (int)p.M - m0, nvalid = (int)p.N - n0;
    const int64_t row0 = g.table[e];
    const bf16 *Ag = p.A + row0 * p.lda + m0, *Bg = p.B + row0 * p.ldb + n0;
    auto load = [&](int slot, int k0) {
        load_mn_sw128(sa + slot * TILE_BYTES, Ag + (int64_t)k0 * p.lda, p.lda, K - k0, mvalid, tid);
        load_mn_sw128(sb + slot * TILE_BYTES, Bg + (int64_t)k0 * p.ldb, p.ldb, K - k0, nvalid, tid);
    };
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; i++) d[i] = 0.f;
    const int nk = (K + BK - 1) / BK;
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nk) load(s, s * BK);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<STAGES - 2>();
        /* as in moe_wgmma_kernel: this thread's copies made visible to the async proxy, then everyone's published and
         * the slot of kt − 1 freed for the refill below */
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (kt + STAGES - 1 < nk) load((kt + STAGES - 1) % STAGES, (kt + STAGES - 1) * BK);
        cp_async_commit();
        /* A is MN-major, so warpgroup wg's 64 rows of M are the stage's A half wg (its own swizzle atoms column); B's
         * 128 columns are both halves, reached through the descriptor's leading offset */
        const uint32_t a0 = smem_u32(sa + (kt % STAGES) * TILE_BYTES + wg * HALF_BYTES),
                       b0 = smem_u32(sb + (kt % STAGES) * TILE_BYTES);
        fence_acc(d);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) /* 16 tokens = two 8-row groups = 2048 bytes down the halves */
            wgmma_m64n128k16<1>(d, desc_mn_sw128(a0 + kk * 2048), desc_mn_sw128(b0 + kk * 2048));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        fence_acc(d);
    }
    cp_async_wait<0>();
    /* the accumulator layout of moe_wgmma_kernel; rows i ≥ split go to C2 at row i − split */
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int m = wg * 64 + w * 16 + (lane >> 2) + 8 * h, n = j * 8 + 2 * (lane & 3);
            if (m >= mvalid || n >= nvalid) continue;
            const int64_t row = m0 + m, col = n0 + n;
            float *dst = row < p.split ? (p.C ? p.C + e * p.sC + row * p.ldc + col : nullptr)
                                       : (p.C2 ? p.C2 + e * p.sC + (row - p.split) * p.ldc + col : nullptr);
            if (!dst) continue;
            float2 v = *(float2 *)dst;
            v.x += d[4 * j + 2 * h], v.y += d[4 * j + 2 * h + 1];
            *(float2 *)dst = v;
        }
#else
    __trap(); /* built for sm_90a only; k3c_moe_wgmma_ok keeps other devices off this kernel */
#endif
}

} // namespace

int k3c_moe_wgmma_ok(void) {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) return 0;
    return major == 9 && minor == 0;
}

int k3c_moe_gemm_tokens_wgmma_cuda(const k3c_moe_groups *g, const k3c_moe_gemm *p, k3c_err *err) {
    if (g->tiles == 0 || p->N == 0) return 0;
    const int64_t blocks = (int64_t)g->tiles * ((p->N + BN - 1) / BN);
    if (blocks > INT32_MAX) return k3c_errf(err, K3C_EINVAL, "moe_gemm_tokens_wgmma_cuda: %lld tiles", (long long)blocks);
    K3C_CU(cudaFuncSetAttribute(moe_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM));
    moe_wgmma_kernel<<<(unsigned)blocks, THREADS, SMEM, K3C_STREAM>>>(*g, *p);
    K3C_CU_LAUNCHED("moe wgmma gemm");
    return 0;
}

/* k3c_moe_gemm_weights_cuda has checked the sizes: M, N > 0, experts ≤ 65535 (the grid's z) */
int k3c_moe_gemm_weights_wgmma_cuda(const k3c_moe_groups *g, const k3c_moe_gemm *p, k3c_err *err) {
    const dim3 grid((unsigned)((p->N + BN - 1) / BN), (unsigned)((p->M + BM - 1) / BM), (unsigned)g->experts);
    K3C_CU(cudaFuncSetAttribute(moe_wgmma_weights_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM));
    moe_wgmma_weights_kernel<<<grid, THREADS, SMEM, K3C_STREAM>>>(*g, *p);
    K3C_CU_LAUNCHED("moe wgmma weights gemm");
    return 0;
}
