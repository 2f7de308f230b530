/* moe_grouped.cu — grouped GEMMs over the routed experts: one launch per product for all experts, bf16 operands through
 * mma.sync m16n8k16 with fp32 accumulation, a 4-stage cp.async pipeline. docs/MODEL.md §9.2. */
#include "cuda/moe_grouped.cuh"

using namespace k3c_cu;

namespace {

/* A 128 × 128 output tile per block of 8 warps (2 along M × 4 along N, 64 × 32 each), K in steps of 32. A token
 * product's tiles never straddle two experts (each expert's rows are their own tiles), so one launch serves experts of
 * any sizes without padding the work to the largest. */
constexpr int BM = K3C_MOE_GG_ROWS, BN = 128, BK = 32, STAGES = 4, THREADS = 256;
constexpr int LD_K = BK + 8; /* [rows][K] tiles: 80-byte rows, an odd multiple of 16 (ldmatrix without conflicts) */
constexpr int LD_R = BM + 8; /* [K][rows] tiles: 272-byte rows */
constexpr int TILE = BM * LD_K > BK * LD_R ? BM * LD_K : BK * LD_R;
constexpr size_t SMEM = 2 * STAGES * TILE * sizeof(bf16);

/* WEIGHTS = 0: a token product (A [rows][K], B per expert [N][K] or, B_KMAJOR, [K][N]); 1: a weight product (A and B
 * both [tokens][·], read transposed along the tokens). */
template <bool WEIGHTS, bool B_KMAJOR>
__global__ void __launch_bounds__(THREADS, 2) moe_gemm_kernel(k3c_moe_groups g, k3c_moe_gemm p) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sa = (bf16 *)smem, *sb = sa + STAGES * TILE;
    const int E = g.experts, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
    int e, m0, mvalid, K, n0;
    if (!WEIGHTS) {
        /* one dimension, the N tiles of a row tile side by side: they share its rows of A in L2, and a wave of blocks
         * covers few experts, so A is read from memory about once (2-D with the row tiles fastest read it N/BN times) */
        const int ntiles = (int)((p.N + BN - 1) / BN), mt = blockIdx.x / ntiles;
        n0 = (blockIdx.x - mt * ntiles) * BN;
        e = last_at_most(g.table + 2 * E, E, mt); /* the expert holding row tile mt (tile0, nonempty) */
        m0 = (mt - g.table[2 * E + e]) * BM;
        mvalid = g.table[E + e] - m0, K = (int)p.K;
    } else {
        e = blockIdx.z, m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
        mvalid = (int)p.M - m0, K = g.table[E + e];
        if (K == 0) return; /* C += nothing */
    }
    const int64_t row0 = g.table[e];
    const bf16 *Ag = WEIGHTS ? p.A + row0 * p.lda + m0 : p.A + (row0 + m0) * p.lda;
    const bf16 *Bg = WEIGHTS ? p.B + row0 * p.ldb + n0 : p.B + e * p.sB + (B_KMAJOR ? n0 : n0 * p.ldb);
    const int nvalid = (int)p.N - n0;
    auto load = [&](int slot, int k0) {
        bf16 *a = sa + slot * TILE, *b = sb + slot * TILE;
        if (WEIGHTS)
            tile_load_async(a, LD_R, Ag + (int64_t)k0 * p.lda, p.lda, BK, BM, K - k0, mvalid, tid, THREADS);
        else
            tile_load_async(a, LD_K, Ag + k0, p.lda, BM, BK, mvalid, K - k0, tid, THREADS);
        if (B_KMAJOR)
            tile_load_async(b, LD_R, Bg + (int64_t)k0 * p.ldb, p.ldb, BK, BN, K - k0, nvalid, tid, THREADS);
        else
            tile_load_async(b, LD_K, Bg + k0, p.ldb, BN, BK, nvalid, K - k0, tid, THREADS);
    };
    float acc[4][4][4] = {};
    const int nk = (K + BK - 1) / BK;
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nk) load(s, s * BK);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads(); /* tile kt landed for every thread; the slot refilled below was read at kt − 1 */
        if (kt + STAGES - 1 < nk) load((kt + STAGES - 1) % STAGES, (kt + STAGES - 1) * BK);
        cp_async_commit();
        const bf16 *as = sa + (kt % STAGES) * TILE, *bs = sb + (kt % STAGES) * TILE;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t a[4][4], b[2][4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if (WEIGHTS)
                    lda_trans(a[i], as, LD_R, wm * 64 + i * 16, kk, lane);
                else
                    lda_rowmajor(a[i], as, LD_K, wm * 64 + i * 16, kk, lane);
            }
#pragma unroll
            for (int j = 0; j < 2; j++) {
                if (B_KMAJOR)
                    ldb_kmajor(b[j], bs, LD_R, wn * 32 + j * 16, kk, lane);
                else
                    ldb_nmajor(b[j], bs, LD_K, wn * 32 + j * 16, kk, lane);
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    mma16816(acc[i][2 * j], a[i], b[j][0], b[j][1]);
                    mma16816(acc[i][2 * j + 1], a[i], b[j][2], b[j][3]);
                }
        }
    }
    cp_async_wait<0>();
    /* fragment (i, j): rows wm·64 + 16i + lane/4 (+ 8), columns wn·32 + 8j + 2·(lane % 4) (+ 1) */
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int m = wm * 64 + i * 16 + (lane >> 2) + 8 * h, n = wn * 32 + j * 8 + 2 * (lane & 3);
                if (m >= mvalid || n >= nvalid) continue;
                const int64_t col = n0 + n;
                float *dst;
                if (!WEIGHTS) {
                    const int64_t row = row0 + m0 + m;
                    dst = col < p.split ? (p.C ? p.C + row * p.ldc + col : nullptr)
                                        : (p.C2 ? p.C2 + row * p.ldc + col - p.split : nullptr);
                } else {
                    const int64_t row = m0 + m;
                    dst = row < p.split ? (p.C ? p.C + e * p.sC + row * p.ldc + col : nullptr)
                                        : (p.C2 ? p.C2 + e * p.sC + (row - p.split) * p.ldc + col : nullptr);
                }
                if (!dst) continue;
                float2 v = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                if (WEIGHTS) {
                    const float2 o = *(float2 *)dst;
                    v.x += o.x, v.y += o.y;
                }
                *(float2 *)dst = v;
            }
}

int check(const k3c_moe_groups *g, const k3c_moe_gemm *p, const char *op, k3c_err *err) {
    if (!g || !p || !g->table || g->experts < 1 || !p->A || !p->B)
        return k3c_errf(err, K3C_EINVAL, "%s: missing groups or operands", op);
    const int64_t v[7] = {p->lda, p->ldb, p->ldc, p->split, p->M, p->N, p->K};
    for (int i = 0; i < 7; i++)
        if (v[i] < 0 || v[i] % 8)
            return k3c_errf(err, K3C_EINVAL, "%s: sizes and strides must be multiples of 8 (lda %lld ldb %lld ldc %lld "
                                             "split %lld M %lld N %lld K %lld)",
                            op, (long long)p->lda, (long long)p->ldb, (long long)p->ldc, (long long)p->split,
                            (long long)p->M, (long long)p->N, (long long)p->K);
    if (((uintptr_t)p->A | (uintptr_t)p->B) & 15) return k3c_errf(err, K3C_EINVAL, "%s: operands not 16-byte aligned", op);
    return 0;
}

template <bool WEIGHTS, bool B_KMAJOR>
int launch(dim3 grid, const k3c_moe_groups *g, const k3c_moe_gemm *p, k3c_err *err) {
    K3C_CU(cudaFuncSetAttribute(moe_gemm_kernel<WEIGHTS, B_KMAJOR>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)SMEM));
    moe_gemm_kernel<WEIGHTS, B_KMAJOR><<<grid, THREADS, SMEM, K3C_STREAM>>>(*g, *p);
    K3C_CU_LAUNCHED("moe grouped gemm");
    return 0;
}

__global__ void weights_bf16_kernel(int64_t E, int64_t ID, const float *w1, const float *w3, const float *w2, bf16 *gu,
                                    bf16 *w2b) {
    const float *src = blockIdx.y == 0 ? w1 : blockIdx.y == 1 ? w3 : w2;
    const int64_t q4 = ID / 4, n = E * q4;
    for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < n; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t e = q / q4, r = q - e * q4;
        const float4 v = ((const float4 *)(src + e * ID))[r];
        bf16 *dst = blockIdx.y == 2 ? w2b + e * ID + 4 * r : gu + e * 2 * ID + blockIdx.y * ID + 4 * r;
        uint2 o;
        o.x = pack_bf16(v.x, v.y), o.y = pack_bf16(v.z, v.w);
        *(uint2 *)dst = o;
    }
}

/* dst[e][c][r] (row stride ldd) = src[e][r][c] for an fp32 [R][C] per expert, rounded to bf16: 32 × 32 tiles through
 * shared memory, so both the reads and the writes are coalesced. */
__global__ void transpose_bf16_kernel(int64_t R, int64_t C, const float *src, bf16 *dst, int64_t ldd, int64_t s_dst) {
    __shared__ float t[32][33];
    const int64_t e = blockIdx.z, r0 = blockIdx.y * 32LL, c0 = blockIdx.x * 32LL;
    const float *s = src + e * R * C;
    for (int i = threadIdx.y; i < 32; i += blockDim.y)
        if (r0 + i < R && c0 + threadIdx.x < C) t[i][threadIdx.x] = s[(r0 + i) * C + c0 + threadIdx.x];
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += blockDim.y)
        if (c0 + i < C && r0 + threadIdx.x < R)
            dst[e * s_dst + (c0 + i) * ldd + r0 + threadIdx.x] = __float2bfloat16_rn(t[threadIdx.x][i]);
}

int transpose_bf16(int64_t E, int64_t R, int64_t C, const float *src, bf16 *dst, int64_t ldd, int64_t s_dst,
                   k3c_err *err) {
    const dim3 grid((unsigned)((C + 31) / 32), (unsigned)((R + 31) / 32), (unsigned)E);
    transpose_bf16_kernel<<<grid, dim3(32, 8), 0, K3C_STREAM>>>(R, C, src, dst, ldd, s_dst);
    K3C_CU_LAUNCHED("moe transpose_bf16");
    return 0;
}

} // namespace

int k3c_moe_gemm_tokens_cuda(const k3c_moe_groups *g, const k3c_moe_gemm *p, int b_kmajor, k3c_err *err) {
    if (check(g, p, "moe_gemm_tokens_cuda", err)) return K3C_EINVAL;
    if (g->tiles == 0 || p->N == 0) return 0;
    const int64_t blocks = (int64_t)g->tiles * ((p->N + BN - 1) / BN);
    if (blocks > INT32_MAX) return k3c_errf(err, K3C_EINVAL, "moe_gemm_tokens_cuda: %lld tiles", (long long)blocks);
    if (!b_kmajor && k3c_moe_wgmma_ok()) return k3c_moe_gemm_tokens_wgmma_cuda(g, p, err);
    const dim3 grid((unsigned)blocks);
    return b_kmajor ? launch<false, true>(grid, g, p, err) : launch<false, false>(grid, g, p, err);
}

int k3c_moe_gemm_weights_cuda(const k3c_moe_groups *g, const k3c_moe_gemm *p, k3c_err *err) {
    if (check(g, p, "moe_gemm_weights_cuda", err)) return K3C_EINVAL;
    if (p->M == 0 || p->N == 0) return 0;
    if (g->experts > 65535) return k3c_errf(err, K3C_EINVAL, "moe_gemm_weights_cuda: %d experts > 65535", g->experts);
    if (k3c_moe_wgmma_ok()) return k3c_moe_gemm_weights_wgmma_cuda(g, p, err);
    const dim3 grid((unsigned)((p->N + BN - 1) / BN), (unsigned)((p->M + BM - 1) / BM), (unsigned)g->experts);
    return launch<true, true>(grid, g, p, err);
}

int k3c_moe_weights_bf16_cuda(int64_t E, int64_t D, int64_t I, const float *w1, const float *w3, const float *w2,
                              bf16 *gu, bf16 *w2b, k3c_err *err) {
    if (E < 1 || D < 1 || I < 1 || (D * I) % 4)
        return k3c_errf(err, K3C_EINVAL, "moe_weights_bf16_cuda: bad sizes E %lld D %lld I %lld", (long long)E,
                        (long long)D, (long long)I);
    const int64_t n = E * D * I / 4, blocks = (n + 255) / 256;
    weights_bf16_kernel<<<dim3((unsigned)(blocks < 8192 ? blocks : 8192), 3), 256, 0, K3C_STREAM>>>(E, D * I, w1, w3,
                                                                                                   w2, gu, w2b);
    K3C_CU_LAUNCHED("moe weights_bf16");
    return 0;
}

int k3c_moe_weights_bf16_t_cuda(int64_t E, int64_t D, int64_t I, const float *w1, const float *w3, const float *w2,
                                bf16 *guT, bf16 *w2T, k3c_err *err) {
    if (E < 1 || D < 1 || I < 1 || E > 65535 || (D + 31) / 32 > 65535 || (I + 31) / 32 > 65535)
        return k3c_errf(err, K3C_EINVAL, "moe_weights_bf16_t_cuda: bad sizes E %lld D %lld I %lld", (long long)E,
                        (long long)D, (long long)I);
    int rc;
    if ((rc = transpose_bf16(E, I, D, w1, guT, 2 * I, 2 * I * D, err))) return rc;     /* [I][D] → columns 0..I−1 */
    if ((rc = transpose_bf16(E, I, D, w3, guT + I, 2 * I, 2 * I * D, err))) return rc; /* → columns I..2I−1 */
    return transpose_bf16(E, D, I, w2, w2T, D, I * D, err);                            /* [D][I] → [I][D] */
}
