/* bench_cuda.cu — times the CUDA ops against their anchors (fla chunk_kda, PyTorch SDPA flash, cuBLAS, copy) on
 * random device data: CUDA events after warm-up, median of many runs. Prints one table row per case; bench/RESULTS.md
 * records them. docs/CODE.md "cuda/"; docs/MODEL.md §3.2 (KDA FLOPs), §4.2 (MLA dims).
 * Usage: bench_cuda [cases: copy,gemm,kda,attn (the default) | gmodes: the training step's GEMM shapes in each float
 *        GEMM mode against bf16 operands | moe: the routed experts per GEMM mode against a dense bf16 GEMM | train:
 *        the step's other ops at training sizes against a copy of their minimum traffic | long | prof]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/cuda_ops.h"

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            printf("FATAL %s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                            \
            exit(2);                                                                                                   \
        }                                                                                                              \
    } while (0)
#define OK(x)                                                                                                          \
    do {                                                                                                               \
        int rc_ = (x);                                                                                                 \
        if (rc_) {                                                                                                     \
            printf("FATAL %s:%d %s: %s\n", __FILE__, __LINE__, #x, err.msg);                                           \
            exit(2);                                                                                                   \
        }                                                                                                              \
    } while (0)

static k3c_err err;

/* ---------------------------------------------------------------- random device data (counter hash, no zeros) */
__device__ __forceinline__ float hash_normal(uint64_t seed, uint64_t i) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
    float s = 0.f;
    for (int r = 0; r < 4; r++) { /* sum of four uniforms, centred: near-normal, sd 1 */
        x ^= x >> 31, x *= 0x94D049BB133111EBull, x ^= x >> 29, x += 0x9E3779B97F4A7C15ull;
        s += (float)(x >> 40) * (1.0f / 16777216.0f);
    }
    return (s - 2.f) * 1.7320508f;
}
enum { FILL_NORMAL, FILL_SIGMOID, FILL_LB_GATE };
__global__ void fill_kernel(void *p, size_t n, int bf, int kind, float sd, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float z = hash_normal(seed, i) * sd;
        if (kind == FILL_SIGMOID) z = 1.f / (1.f + expf(-z));
        if (kind == FILL_LB_GATE) z = -5.f / (1.f + expf(-1.5f * z));
        if (bf)
            ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(z);
        else
            ((float *)p)[i] = z;
    }
}
/* rows of width d scaled to unit norm (KDA q, k) */
__global__ void l2rows_kernel(__nv_bfloat16 *x, size_t rows, int d) {
    size_t r = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32;
    if (r >= rows) return;
    float s = 0.f;
    for (int i = threadIdx.x % 32; i < d; i += 32) s += __bfloat162float(x[r * d + i]) * __bfloat162float(x[r * d + i]);
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float inv = rsqrtf(s + 1e-6f);
    for (int i = threadIdx.x % 32; i < d; i += 32)
        x[r * d + i] = __float2bfloat16_rn(__bfloat162float(x[r * d + i]) * inv);
}

static void *dalloc(size_t bytes) {
    void *p;
    OK(k3c_cuda_malloc(&p, bytes, &err));
    return p;
}
static uint64_t g_seed = 12345;
static void fill(void *p, size_t n, int bf, int kind = FILL_NORMAL, float sd = 1.f) {
    fill_kernel<<<2048, 256>>>(p, n, bf, kind, sd, g_seed++);
    CK(cudaGetLastError());
}

/* Median milliseconds of fn over `reps` runs after `warm` runs, one event pair per run (default stream). */
static int g_prof; /* profiling mode (under ncu): every case runs once, untimed */
static double time_ms(const std::function<void()> &fn, int warm = 3, int reps = 15) {
    if (g_prof) {
        fn();
        CK(cudaDeviceSynchronize());
        return 0.0;
    }
    for (int i = 0; i < warm; i++) fn();
    CK(cudaDeviceSynchronize());
    std::vector<cudaEvent_t> ev(2 * reps);
    for (auto &e : ev) CK(cudaEventCreate(&e));
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(ev[2 * i], cudaStreamPerThread));
        fn();
        CK(cudaEventRecord(ev[2 * i + 1], cudaStreamPerThread));
    }
    CK(cudaDeviceSynchronize());
    std::vector<float> t(reps);
    for (int i = 0; i < reps; i++) CK(cudaEventElapsedTime(&t[i], ev[2 * i], ev[2 * i + 1]));
    for (auto &e : ev) CK(cudaEventDestroy(e));
    std::sort(t.begin(), t.end());
    return t[reps / 2];
}

static std::vector<std::string> rows;
static void row(const char *name, const std::string &shape, double ms, double anchor_ms, const std::string &extra) {
    char b[512];
    snprintf(b, sizeof b, "| %-28s | %-34s | %9.3f | %9.3f | %5.2fx | %s |", name, shape.c_str(), ms, anchor_ms,
             anchor_ms > 0 ? ms / anchor_ms : 0.0, extra.c_str());
    rows.push_back(b);
    printf("%s\n", b);
    fflush(stdout);
}
static std::string fmt(const char *f, double a, double b = 0, double c = 0) {
    char buf[256];
    snprintf(buf, sizeof buf, f, a, b, c);
    return buf;
}

/* ---------------------------------------------------------------- cases */
static void bench_copy() {
    const size_t bytes = (size_t)2 << 30;
    void *a = dalloc(bytes), *b = dalloc(bytes);
    fill(a, bytes / 4, 0);
    double ms = time_ms([&] { OK(k3c_cuda_copy(b, a, bytes, &err)); }, 3, 20);
    double tbs = 2.0 * bytes / (ms * 1e-3) / 1e12;
    /* anchor: 4.27 TB/s → the time it would take for the same bytes */
    row("copy d2d (16B/thread)", "2 GiB", ms, 2.0 * bytes / 4.27e12 * 1e3, fmt("%.2f TB/s (anchor 4.27)", tbs));
    k3c_cuda_free(a), k3c_cuda_free(b);
}

static void bench_gemm(k3c_cuda_ctx *ctx) {
    const int64_t n = 8192;
    void *A = dalloc(n * n * 2), *B = dalloc(n * n * 2), *C = dalloc(n * n * 2);
    fill(A, n * n, 1), fill(B, n * n, 1);
    double ms = time_ms(
        [&] { OK(k3c_gemm_bf16_cuda(ctx, 0, 1, n, n, n, 1.f, (uint16_t *)A, (uint16_t *)B, 0.f, C, 0, &err)); }, 3, 20);
    double tf = 2.0 * n * n * n / (ms * 1e-3) / 1e12;
    row("gemm bf16 cuBLASLt (NT)", "8192^3", ms, 2.0 * n * n * n / 716e12 * 1e3, fmt("%.0f TFLOP/s (anchor 716)", tf));
    k3c_cuda_free(A), k3c_cuda_free(B), k3c_cuda_free(C);
}

/* The whole-step GEMM shapes (kimi_linear_medium, 16,384 tokens) in each GEMM mode: float operands rounded by
 * cuBLASLt (the training default), TF32, and bf16 operands stored as bf16 (what bf16 activations and weight copies
 * would run), and float operands copied to bf16 before each product (ctx->bf16_copy). The anchor column is the
 * bf16-operand time. */
static void bench_gemm_modes(k3c_cuda_ctx *ctx) {
    struct shape {
        const char *what;
        int ta, tb;
        int64_t M, N, K;
    } sh[] = {
        {"proj fwd x·Wt", 0, 1, 16384, 1024, 1024}, {"proj dX dY·W", 0, 0, 16384, 1024, 1024},
        {"proj dW dYt·X", 1, 0, 1024, 1024, 16384}, {"lm head fwd", 0, 1, 16384, 32768, 1024},
        {"lm head dW", 1, 0, 32768, 1024, 16384},   {"expert up fwd", 0, 1, 2048, 512, 1024},
        {"expert down fwd", 0, 1, 2048, 1024, 512}, {"expert up dW", 1, 0, 512, 1024, 2048},
    };
    for (auto &s : sh) {
        const size_t na = (size_t)s.M * s.K, nb = (size_t)s.K * s.N, nc = (size_t)s.M * s.N;
        void *A = dalloc(na * 4), *B = dalloc(nb * 4), *C = dalloc(nc * 4);
        void *Ah = dalloc(na * 2), *Bh = dalloc(nb * 2);
        fill(A, na, 0), fill(B, nb, 0), fill(Ah, na, 1), fill(Bh, nb, 1);
        const double fl = 2.0 * s.M * s.N * s.K;
        double bf = time_ms([&] {
            OK(k3c_gemm_bf16_cuda(ctx, s.ta, s.tb, s.M, s.N, s.K, 1.f, (uint16_t *)Ah, (uint16_t *)Bh, 0.f, C, 1,
                                  &err));
        });
        const char *what[3] = {"gemm f32-in, Lt rounds (bf16)", "gemm f32-in, bf16 copies", "gemm tf32"};
        for (int v = 0; v < 3; v++) {
            const int keep = ctx->bf16_copy;
            ctx->bf16_copy = v == 1;
            double ms = time_ms([&] {
                OK(k3c_matmul_cuda(ctx, s.ta, s.tb, s.M, s.N, s.K, 1.0, (float *)A, (float *)B, 0.0, (float *)C,
                                   v < 2 ? K3C_GEMM_BF16 : K3C_GEMM_TF32, &err));
            });
            ctx->bf16_copy = keep;
            row(what[v],
                std::string(s.what) + " " + std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K),
                ms, bf, fmt("%.0f vs %.0f TFLOP/s", fl / (ms * 1e-3) / 1e12, fl / (bf * 1e-3) / 1e12));
        }
        k3c_cuda_free(A), k3c_cuda_free(B), k3c_cuda_free(C), k3c_cuda_free(Ah), k3c_cuda_free(Bh);
    }
}

static void bench_kda(int T, double anchor_fwd, double anchor_fb) {
    const int H = 32, D = 128;
    k3c_kda_dims d = {};
    d.T = T, d.H = H, d.dk = D, d.dv = D, d.chunk = 64, d.gate_lower_bound = -5;
    const size_t tk = (size_t)T * H * D;
    void *q = dalloc(tk * 2), *k = dalloc(tk * 2), *v = dalloc(tk * 2), *o = dalloc(tk * 2);
    float *g = (float *)dalloc(tk * 4), *beta = (float *)dalloc((size_t)T * H * 4),
          *ht = (float *)dalloc((size_t)H * D * D * 4);
    fill(q, tk, 1), fill(k, tk, 1), fill(v, tk, 1);
    l2rows_kernel<<<(unsigned)((T * (size_t)H + 7) / 8), 256>>>((__nv_bfloat16 *)q, (size_t)T * H, D);
    l2rows_kernel<<<(unsigned)((T * (size_t)H + 7) / 8), 256>>>((__nv_bfloat16 *)k, (size_t)T * H, D);
    fill(g, tk, 0, FILL_LB_GATE), fill(beta, (size_t)T * H, 0, FILL_SIGMOID);
    CK(cudaGetLastError());
    void *ws = dalloc(k3c_kda_chunk_fwd_workspace_cuda(&d));
    double ms = time_ms([&] {
        OK(k3c_kda_chunk_fwd_bf16_cuda(&d, nullptr, (uint16_t *)q, (uint16_t *)k, (uint16_t *)v, g, beta, nullptr,
                                       (uint16_t *)o, ht, ws, &err));
    });
    /* bytes that must move: q k v o (bf16), g (fp32), beta */
    const double gb = (tk * 2.0 * 4 + tk * 4.0) / 1e9;
    row("kda chunk fwd (bf16, lb -5)", fmt("B1 H32 d128 T%.0f", T), ms, anchor_fwd,
        fmt("%.0f GB/s of min traffic", gb / (ms * 1e-3)));
    /* forward + backward: bf16 inputs, fp32 gradients added into zeroed buffers */
    const size_t tb = (size_t)T * H;
    float *dq = (float *)dalloc(tk * 4), *dk = (float *)dalloc(tk * 4), *dv = (float *)dalloc(tk * 4);
    float *dg = (float *)dalloc(tk * 4), *db = (float *)dalloc(tb * 4);
    void *dout = dalloc(tk * 2), *wsb = dalloc(k3c_kda_chunk_bwd_workspace_cuda(&d));
    fill(dout, tk, 1);
    double ms2 = time_ms(
        [&] {
            OK(k3c_kda_chunk_fwd_bf16_cuda(&d, nullptr, (uint16_t *)q, (uint16_t *)k, (uint16_t *)v, g, beta, nullptr,
                                           (uint16_t *)o, ht, ws, &err));
            OK(k3c_kda_chunk_bwd_bf16_cuda(&d, nullptr, (uint16_t *)q, (uint16_t *)k, (uint16_t *)v, g, beta, nullptr,
                                           (uint16_t *)dout, nullptr, dq, dk, dv, dg, db, nullptr, wsb, &err));
        },
        2, 7);
    row("kda chunk fwd+bwd", fmt("B1 H32 d128 T%.0f", T), ms2, anchor_fb, "fp32 grads");
    k3c_cuda_free(dq), k3c_cuda_free(dk), k3c_cuda_free(dv), k3c_cuda_free(dg), k3c_cuda_free(db);
    k3c_cuda_free(dout), k3c_cuda_free(wsb);
    k3c_cuda_free(q), k3c_cuda_free(k), k3c_cuda_free(v), k3c_cuda_free(o), k3c_cuda_free(g), k3c_cuda_free(beta);
    k3c_cuda_free(ht), k3c_cuda_free(ws);
}

static void bench_attn(int T, int dqk, double anchor_fwd, double anchor_fb) {
    const int H = 32, dv = 128;
    k3c_attention_sizes s = {};
    s.T = T, s.H = H, s.dqk = dqk, s.dv = dv, s.scale = 1.0 / sqrt((double)dqk);
    const size_t tq = (size_t)T * H * dqk, tv = (size_t)T * H * dv;
    void *q = dalloc(tq * 2), *k = dalloc(tq * 2), *v = dalloc(tv * 2), *o = dalloc(tv * 2), *dout = dalloc(tv * 2);
    void *dq = dalloc(tq * 2), *dk = dalloc(tq * 2), *dvv = dalloc(tv * 2);
    float *lse = (float *)dalloc((size_t)T * H * 4);
    fill(q, tq, 1), fill(k, tq, 1), fill(v, tv, 1), fill(dout, tv, 1);
    void *ws = dalloc(k3c_attention_workspace_cuda(&s));
    auto fwd = [&] {
        OK(k3c_attention_fwd_bf16_cuda(&s, nullptr, (uint16_t *)q, (uint16_t *)k, (uint16_t *)v, (uint16_t *)o, lse, ws,
                                       &err));
    };
    auto bwd = [&] {
        OK(k3c_attention_bwd_bf16_cuda(&s, nullptr, (uint16_t *)q, (uint16_t *)k, (uint16_t *)v, (uint16_t *)o, lse,
                                       (uint16_t *)dout, (uint16_t *)dq, (uint16_t *)dk, (uint16_t *)dvv, ws, &err));
    };
    const double flops_f = (double)T * T * H * (dqk + dv); /* causal: half of 2·T²·(dqk + dv) */
    double ms = time_ms(fwd);
    row("attention fwd (bf16 causal)", fmt("H32 dqk%.0f dv128 T%.0f", dqk, T), ms, anchor_fwd,
        fmt("%.0f TFLOP/s", flops_f / (ms * 1e-3) / 1e12));
    double ms2 = time_ms([&] { fwd(), bwd(); }, 2, 7);
    /* standard count, causal: fwd QKᵀ + PV, bwd QKᵀ + dO·Vᵀ + Pᵀ·dO + dS·K + dSᵀ·Q, each T²·d (half of 2·T²·d) */
    const double flops_fb = (double)T * T * H * (4.0 * dqk + 3.0 * dv);
    row("attention fwd+bwd (bf16)", fmt("H32 dqk%.0f dv128 T%.0f", dqk, T), ms2, anchor_fb,
        fmt("%.0f TFLOP/s (std count)", flops_fb / (ms2 * 1e-3) / 1e12));
    k3c_cuda_free(q), k3c_cuda_free(k), k3c_cuda_free(v), k3c_cuda_free(o), k3c_cuda_free(dout), k3c_cuda_free(dq);
    k3c_cuda_free(dk), k3c_cuda_free(dvv), k3c_cuda_free(lse), k3c_cuda_free(ws);
}

/* The routed experts of one MoE layer (T tokens, top-k of E experts, dim D, intermediate I, SiTU), forward and forward +
 * backward, per GEMM mode: tf32 runs one cuBLASLt product per expert, bf16 the grouped products (moe_grouped.cu). The
 * anchor is a dense bf16 cuBLASLt GEMM of the same FLOPs ([T·k × D]·[D × 3I]), so ours/anchor ≤ 1.43 is the target
 * "≥ 70% of the dense bf16 GEMM rate". Routes come from the CUDA router on random logits. */
static void bench_moe(k3c_cuda_ctx *ctx, int64_t T, int64_t D, int64_t I, int64_t E, int64_t k) {
    k3c_moe_sizes s = {T, D, I, E, k, {K3C_ACT_SITU, 4.0, 25.0}};
    k3c_router_sizes rs = {T, E, k, 1, 1.0};
    const size_t W = (size_t)E * I * D, S = (size_t)(T * k);
    void *x = dalloc(T * D * 4), *y = dalloc(T * D * 4), *dy = dalloc(T * D * 4), *dx = dalloc(T * D * 4);
    void *w[3], *dw[3], *lg = dalloc(T * E * 4), *ids = dalloc(S * 4), *tw = dalloc(S * 4), *dtw = dalloc(S * 4);
    void *sv = dalloc(k3c_moe_saved_bytes_cuda(&s)), *ws = dalloc(k3c_moe_workspace_cuda(&s));
    for (int i = 0; i < 3; i++) {
        w[i] = dalloc(W * 4), dw[i] = dalloc(W * 4);
        fill(w[i], W, 0, FILL_NORMAL, 1.f / sqrtf((float)(i == 2 ? I : D))), fill(dw[i], W, 0);
    }
    fill(x, T * D, 0), fill(dy, T * D, 0), fill(lg, T * E, 0), fill(dx, T * D, 0), fill(dtw, S, 0);
    OK(k3c_router_fwd_cuda(&rs, (float *)lg, nullptr, (int32_t *)ids, (float *)tw, nullptr, nullptr, &err));
    /* the anchor: [S × D]·[D × 3I] on bf16 operands (the MoE forward's multiply-adds), fp32 out */
    const double flops = 2.0 * S * 3.0 * D * I;
    void *A = dalloc(S * D * 2), *B = dalloc(D * 3 * I * 2), *C = dalloc(S * 3 * I * 4);
    fill(A, S * D, 1), fill(B, D * 3 * I, 1);
    const double dense = time_ms([&] {
        OK(k3c_gemm_bf16_cuda(ctx, 0, 0, S, 3 * I, D, 1.f, (uint16_t *)A, (uint16_t *)B, 0.f, C, 1, &err));
    });
    k3c_cuda_free(A), k3c_cuda_free(B), k3c_cuda_free(C);
    const std::string shape = fmt("T%.0f D%.0f I%.0f", T, D, I) + fmt(" E%.0f k%.0f", E, k);
    for (int gemm : {K3C_GEMM_TF32, K3C_GEMM_BF16}) {
        if (g_prof && gemm != K3C_GEMM_BF16) continue; /* under ncu: the grouped products only */
        auto fwd = [&] {
            OK(k3c_moe_fwd_cuda(ctx, &s, (float *)x, (int32_t *)ids, (float *)tw, (float *)w[0], (float *)w[1],
                                (float *)w[2], (float *)y, sv, ws, gemm, &err));
        };
        auto bwd = [&] {
            OK(k3c_moe_bwd_cuda(ctx, &s, (float *)x, (int32_t *)ids, (float *)tw, (float *)w[0], (float *)w[1],
                                (float *)w[2], sv, (float *)dy, (float *)dx, (float *)dw[0], (float *)dw[1],
                                (float *)dw[2], (float *)dtw, ws, gemm, &err));
        };
        const double f = time_ms(fwd, 2, 7), fb = time_ms([&] { fwd(), bwd(); }, 2, 7);
        const std::string name = std::string("moe experts ") + k3c_gemm_mode_name(gemm);
        row((name + " fwd").c_str(), shape, f, dense, fmt("%.0f TFLOP/s; dense bf16 %.0f", flops / (f * 1e-3) / 1e12,
                                                           flops / (dense * 1e-3) / 1e12));
        row((name + " fwd+bwd").c_str(), shape, fb, 3 * dense, fmt("%.0f TFLOP/s", 3 * flops / (fb * 1e-3) / 1e12));
    }
    for (void *p : {x, y, dy, dx, lg, ids, tw, dtw, sv, ws, w[0], w[1], w[2], dw[0], dw[1], dw[2]}) k3c_cuda_free(p);
}

/* The training step's memory-bound ops at training sizes (short conv, KDA gate, cross-entropy, AttnRes), each against
 * a device copy of the bytes it must move at least (inputs read once, outputs written once, gradients read and
 * written) in the same run; QK-Clip's S_max, which is compute-bound, without an anchor. */
static double copy_ms(double bytes) { /* reads and writes bytes / 2 each */
    const size_t n = ((size_t)(bytes / 2) + 15) / 16 * 16;
    void *a = dalloc(n), *b = dalloc(n);
    const double ms = time_ms([&] { OK(k3c_cuda_copy(b, a, n, &err)); });
    k3c_cuda_free(a), k3c_cuda_free(b);
    return ms;
}
static void traffic_row(const char *name, const std::string &shape, double bytes, const std::function<void()> &fn) {
    const double ms = time_ms(fn);
    row(name, shape, ms, copy_ms(bytes), fmt("%.2f TB/s of the minimum traffic", bytes / (ms * 1e-3) / 1e12));
}
static float *dfilled(size_t n, float sd = 1.f) {
    float *p = (float *)dalloc(n * 4);
    fill(p, n, 0, FILL_NORMAL, sd);
    return p;
}

static void bench_train_ops() {
    { /* short conv: 8 documents, with their states */
        const int64_t T = 16384, C = 4096;
        const k3c_short_conv_dims d = {T, C, 4, 8};
        int32_t cu[9];
        for (int i = 0; i <= 8; i++) cu[i] = (int32_t)(i * T / 8);
        int32_t *dcu = (int32_t *)dalloc(sizeof cu);
        OK(k3c_cuda_h2d(dcu, cu, sizeof cu, &err));
        float *x = dfilled(T * C), *w = dfilled(C * 4, 0.5f), *st = dfilled(8 * C * 3), *y = dfilled(T * C),
              *dx = dfilled(T * C), *dw = dfilled(C * 4), *ds = dfilled(8 * C * 3);
        void *ws = dalloc(k3c_short_conv_bwd_workspace_cuda(&d));
        const double tc = 4.0 * T * C;
        traffic_row("short_conv fwd (+state)", "T16384 C4096 W4 8 docs", 2 * tc,
                    [&] { OK(k3c_short_conv_fwd_cuda(&d, dcu, x, w, st, y, nullptr, &err)); });
        traffic_row("short_conv bwd (dx dw dstate)", "T16384 C4096 W4 8 docs", 4 * tc,
                    [&] { OK(k3c_short_conv_bwd_cuda(&d, dcu, x, w, st, y, dx, dw, ds, ws, &err)); });
        for (void *p :
             {(void *)dcu, (void *)x, (void *)w, (void *)st, (void *)y, (void *)dx, (void *)dw, (void *)ds, ws})
            k3c_cuda_free(p);
    }
    for (int form : {K3C_GATE_LOWER_BOUND, K3C_GATE_SOFTPLUS}) { /* KDA forget gate */
        const int64_t T = 16384, H = 32, dk = 128, P = H * dk;
        const k3c_kda_gate_dims d = {T, H, dk, form, 0.0};
        float *z = dfilled(T * P, 2.f), *b = dfilled(P, 0.5f), *al = dfilled(H, 0.5f), *g = dfilled(T * P),
              *dz = dfilled(T * P), *db = dfilled(P), *dA = dfilled(H);
        const double tp = 4.0 * T * P;
        const char *f = form == K3C_GATE_LOWER_BOUND ? "T16384 H32 dk128 lower bound" : "T16384 H32 dk128 softplus";
        traffic_row("kda_gate fwd", f, 2 * tp, [&] { OK(k3c_kda_gate_fwd_cuda(&d, z, b, al, g, &err)); });
        traffic_row("kda_gate bwd", f, 4 * tp, [&] { OK(k3c_kda_gate_bwd_cuda(&d, z, b, al, g, dz, db, dA, &err)); });
        for (float *p : {z, b, al, g, dz, db, dA}) k3c_cuda_free(p);
    }
    { /* cross-entropy over K3's vocabulary */
        const int64_t T = 4096, V = 163840;
        const k3c_xent_sizes s = {T, V, 0.0, nullptr};
        std::vector<int32_t> tg((size_t)T);
        for (int64_t t = 0; t < T; t++) tg[(size_t)t] = (int32_t)((t * 7919) % V);
        int32_t *dt = (int32_t *)dalloc(tg.size() * 4);
        OK(k3c_cuda_h2d(dt, tg.data(), tg.size() * 4, &err));
        float *lg = dfilled(T * V, 3.f), *lse = dfilled(T), *d = dfilled(T * V);
        const double tv = 4.0 * T * V;
        double loss;
        int64_t count;
        traffic_row("xent fwd (synchronises)", "T4096 V163840", tv,
                    [&] { OK(k3c_xent_fwd_cuda(&s, lg, dt, nullptr, lse, &loss, &count, &err)); });
        traffic_row("xent bwd", "T4096 V163840", 3 * tv,
                    [&] { OK(k3c_xent_bwd_cuda(&s, lg, dt, nullptr, lse, 1.0, d, &err)); });
        for (void *p : {(void *)dt, (void *)lg, (void *)lse, (void *)d}) k3c_cuda_free(p);
    }
    { /* AttnRes at model size, every dv its own buffer */
        const int T = 8192, D = 4096, N = 9;
        const k3c_attnres_sizes s = {T, D, N, 1e-6};
        const size_t td = (size_t)T * D;
        std::vector<const float *> vp;
        std::vector<float *> gp;
        for (int i = 0; i < N; i++) vp.push_back(dfilled(td, 0.5f + 0.1f * i)), gp.push_back(dfilled(td));
        float *w = dfilled(D, 0.03f), *g = dfilled(D), *dw = dfilled(D), *dg = dfilled(D), *h = dfilled(td),
              *dh = dfilled(td), *sv = dfilled(2 * (size_t)T * N);
        void *ws = dalloc(k3c_attnres_workspace_cuda(&s));
        traffic_row("attnres fwd", "T8192 D4096 N9", 4.0 * td * (2 * N + 1),
                    [&] { OK(k3c_attnres_fwd_cuda(&s, vp.data(), w, g, h, sv, &err)); });
        traffic_row("attnres bwd", "T8192 D4096 N9", 4.0 * td * (4 * N + 2),
                    [&] { OK(k3c_attnres_bwd_cuda(&s, vp.data(), w, g, sv, dh, gp.data(), dw, dg, ws, &err)); });
        for (int i = 0; i < N; i++) k3c_cuda_free((void *)vp[(size_t)i]), k3c_cuda_free(gp[(size_t)i]);
        for (void *p : {(void *)w, (void *)g, (void *)dw, (void *)dg, (void *)h, (void *)dh, (void *)sv, ws})
            k3c_cuda_free(p);
    }
    for (int H : {1, 4}) { /* QK-Clip's S_max over one long document */
        k3c_attention_sizes s = {};
        s.T = 65536, s.H = H, s.dqk = 192, s.dv = 192, s.scale = 1.0 / sqrt(192.0);
        const size_t tq = (size_t)s.T * H * s.dqk;
        float *q = dfilled(tq), *k = dfilled(tq), *m = dfilled((size_t)H);
        const double ms = time_ms([&] { OK(k3c_attention_max_logit_cuda(&s, nullptr, q, k, m, &err)); });
        const double flops = 2.0 * s.dqk * H * ((double)s.T * (s.T + 1) / 2);
        row("attention_max_logit", fmt("T65536 H%.0f dqk192", H), ms, NAN,
            fmt("%.1f TFLOP/s useful fp32", flops / (ms * 1e-3) / 1e12));
        for (float *p : {q, k, m}) k3c_cuda_free(p);
    }
}

int main(int argc, char **argv) {
    k3c_cuda_ctx ctx;
    OK(k3c_cuda_init(&ctx, 0, 0, &err));
    const char *only = argc > 1 ? argv[1] : "copy,gemm,kda,attn";
    printf("device %s (%d SMs)\n", ctx.name, ctx.sm_count);
    printf("| case | shape | ours ms | anchor ms | ours/anchor | note |\n|---|---|---|---|---|---|\n");
    if (strstr(only, "copy")) bench_copy();
    if (strstr(only, "gemm")) bench_gemm(&ctx);
    if (strstr(only, "gmodes")) bench_gemm_modes(&ctx);
    if (strstr(only, "train")) bench_train_ops();
    if (strstr(only, "moe") && !strstr(only, "prof")) {
        bench_moe(&ctx, 16384, 1024, 512, 64, 8); /* kimi_linear_medium's routed experts */
        if (!strstr(only, "moemed")) /* moemed: the medium shape alone */
            bench_moe(&ctx, 16384, 3584, 3072, 64, 8); /* K3's latent expert (ℓ 3584, I 3072), 64 of its 896 experts */
    }
    if (strstr(only, "prof")) { /* one call of each op at T = 16K, for ncu */
        g_prof = 1;
        if (strstr(only, "kda")) bench_kda(16384, 1.89, 8.71);
        if (strstr(only, "attn")) bench_attn(16384, 192, 5.30, 31.8);
        if (strstr(only, "moe")) bench_moe(&ctx, 16384, 1024, 512, 64, 8);
        return 0;
    }
    if (strstr(only, "kda")) {
        bench_kda(4096, 1.37, 5.50);
        bench_kda(16384, 1.89, 8.71);
        bench_kda(65536, 7.44, 34.3);
    }
    if (strstr(only, "long")) { /* flatness of tokens/s up to 1M tokens; no anchor at these lengths */
        bench_kda(262144, NAN, NAN);
        bench_kda(1048576, NAN, NAN);
    }
    if (strstr(only, "attn")) {
        bench_attn(16384, 192, 5.30, 31.8);
        bench_attn(16384, 128, 3.80, 14.4);
    }
    printf("\n==== bench table ====\n| case | shape | ours ms | anchor ms | ours/anchor | note "
           "|\n|---|---|---|---|---|---|\n");
    for (auto &r : rows) printf("%s\n", r.c_str());
    k3c_cuda_destroy(&ctx);
    return 0;
}
