/* optim.cu — the optimizer on the GPU: AdamW, (Per-Head) Muon with Newton–Schulz-5 on batched bf16 (fp32
 * accumulation) or fp32 GEMMs, and deterministic gradient-norm clipping; twins of ops/adamw.c, muon.c, grad_norm.c.
 * docs/MODEL.md §10.1, §10.3, §10.4. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cuda/common.cuh"
#include "cuda/cuda_optim.h"

using k3c_cu::bf16;
using k3c_cu::store_as;

namespace {

constexpr int NT = 256;                       /* threads of every kernel here (the reductions assume it) */
constexpr int64_t NORM_BLOCK = 1 << 15;       /* elements per grad-norm partial (the CPU's block) */
constexpr size_t WS_BUDGET = (size_t)1 << 26; /* floats of NS workspace beyond the largest single matrix */
constexpr int64_t MAX_GRID = 1 << 20;

/* Batch items start on 256-byte boundaries: cuBLASLt's heuristics assume aligned operands by default. */
template <class T> size_t ru256(size_t n) {
    const size_t q = 256 / sizeof(T);
    return (n + q - 1) / q * q;
}

int grid_for(int64_t n) { return (int)(n <= 0 ? 1 : ((n + NT - 1) / NT < MAX_GRID ? (n + NT - 1) / NT : MAX_GRID)); }

bool uses_muon(const k3c_optim *o, const k3c_param *p) {
    return p->kind == K3C_PK_MATRIX && o->matrix_optimizer == K3C_MATRIX_MUON;
}
bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }
bool ns_in_bf16(const k3c_optim_cuda *oc, const k3c_optim *o) {
    return o->muon_precision == K3C_MUON_BF16 || (o->muon_precision == K3C_MUON_AUTO && oc->auto_bf16);
}
int64_t block_rows(const k3c_optim *o, const k3c_param *p) { return o->per_head ? p->head_rows : 0; }

/* One Muon matrix shape: R × C blocks (a head's rows or the whole slice), r ≤ c its short and long side. A tall block
 * (R > C) stays as it is stored: NS5 on its transpose Y = Xᵀ, Y ← aY + (bP + cP²)Y with P = YYᵀ = XᵀX, is
 * X ← aX + X(bP + cP²) (P symmetric), so the products take X transposed instead of the loads and the update
 * transposing it with strided accesses. */
struct mshape {
    int64_t R, C;
    bool tall() const { return R > C; }
    size_t r() const { return (size_t)(R < C ? R : C); }
    size_t c() const { return (size_t)(R < C ? C : R); }
};
/* Strides (elements of T) of the X, X' and of the P, B items, and the workspace one matrix takes, in floats. The
 * workspace is sized for float elements; a bf16 matrix takes at most that (half, up to the alignment). */
template <class T> size_t stride_x(const mshape &s) { return ru256<T>(s.r() * s.c()); }
template <class T> size_t stride_p(const mshape &s) { return ru256<T>(s.r() * s.r()); }
template <class T> size_t need_floats(const mshape &s) {
    return (sizeof(T) * (2 * stride_x<T>(s) + 2 * stride_p<T>(s)) + sizeof(float) - 1) / sizeof(float);
}

/* ---------------------------------------------------------------- kernels
 * Float arithmetic through __f*_rn so nvcc never contracts into FMA: the CPU build (ISO C11) does not either, which
 * keeps AdamW and the elementwise parts of Muon bitwise equal to the CPU. */

__device__ __forceinline__ void adamw_point(float &w, float g, float &m, float &v, float b1, float b2, float omb1,
                                            float omb2, float eps, float step_size, float inv_sqrt_bc2, float decay) {
    m = __fadd_rn(__fmul_rn(b1, m), __fmul_rn(omb1, g));
    v = __fadd_rn(__fmul_rn(b2, v), __fmul_rn(__fmul_rn(omb2, g), g));
    const float den = __fadd_rn(__fmul_rn(__fsqrt_rn(v), inv_sqrt_bc2), eps);
    w = __fsub_rn(__fmul_rn(w, decay), __fdiv_rn(__fmul_rn(step_size, m), den));
}

__global__ void adamw_kernel(float *w, const float *g, float *m, float *v, int64_t n, float b1, float b2, float omb1,
                             float omb2, float eps, float step_size, float inv_sqrt_bc2, float decay) {
    for (int64_t i = blockIdx.x * (int64_t)NT + threadIdx.x; i < n; i += (int64_t)gridDim.x * NT)
        adamw_point(w[i], g[i], m[i], v[i], b1, b2, omb1, omb2, eps, step_size, inv_sqrt_bc2, decay);
}

/* The same four elements at a time (16-byte accesses; n4 = n / 4, every pointer 16-byte aligned): the scalar kernel
 * read the 28 bytes an element moves well below the memory bandwidth, and an expert stack's update is most of the
 * optimizer's time in a step. */
__global__ void adamw4_kernel(float4 *w, const float4 *g, float4 *m, float4 *v, int64_t n4, float b1, float b2,
                              float omb1, float omb2, float eps, float step_size, float inv_sqrt_bc2, float decay) {
    for (int64_t i = blockIdx.x * (int64_t)NT + threadIdx.x; i < n4; i += (int64_t)gridDim.x * NT) {
        float4 wi = w[i], mi = m[i], vi = v[i];
        const float4 gi = g[i];
        adamw_point(wi.x, gi.x, mi.x, vi.x, b1, b2, omb1, omb2, eps, step_size, inv_sqrt_bc2, decay);
        adamw_point(wi.y, gi.y, mi.y, vi.y, b1, b2, omb1, omb2, eps, step_size, inv_sqrt_bc2, decay);
        adamw_point(wi.z, gi.z, mi.z, vi.z, b1, b2, omb1, omb2, eps, step_size, inv_sqrt_bc2, decay);
        adamw_point(wi.w, gi.w, mi.w, vi.w, b1, b2, omb1, omb2, eps, step_size, inv_sqrt_bc2, decay);
        w[i] = wi, m[i] = mi, v[i] = vi;
    }
}

__global__ void momentum_kernel(float *mom, const float *g, int64_t n, float mu) {
    for (int64_t i = blockIdx.x * (int64_t)NT + threadIdx.x; i < n; i += (int64_t)gridDim.x * NT)
        mom[i] = __fadd_rn(__fmul_rn(mu, mom[i]), g[i]);
}

__device__ __forceinline__ float muon_input(float g, float m, int nesterov, float mu) {
    return nesterov ? __fadd_rn(g, __fmul_rn(mu, m)) : m;
}

/* Fixed-shape tree over NT doubles in shared memory; every thread gets the total. */
__device__ double block_sum(double s, double *red) {
    red[threadIdx.x] = s;
    __syncthreads();
    for (int h = NT / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) red[threadIdx.x] = __dadd_rn(red[threadIdx.x], red[threadIdx.x + h]);
        __syncthreads();
    }
    const double total = red[0];
    __syncthreads();
    return total;
}

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }

/* One thread block per R × C matrix b (consecutive in g / mom): U = G + μM (Nesterov) or M, X_b = U / (‖U‖_F + eps)
 * (the norm in double, X_b rounded once to T), in U's layout. */
template <class T>
__global__ void ns_load_kernel(const float *g, const float *mom, int64_t R, int64_t C, int nesterov, float mu, T *X,
                               int64_t sx) {
    __shared__ double red[NT];
    const int64_t n = R * C, b = blockIdx.x;
    const float *gb = g + b * n, *mb = mom + b * n;
    T *xb = X + b * sx;
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += NT) {
        const double u = muon_input(gb[i], mb[i], nesterov, mu);
        s = __dadd_rn(s, __dmul_rn(u, u));
    }
    const double ss = block_sum(s, red);
    const float inv = (float)(1.0 / (sqrt(ss) + K3C_NS_EPS));
    for (int64_t i = threadIdx.x; i < n; i += NT)
        store_as(&xb[i], __fmul_rn(muon_input(gb[i], mb[i], nesterov, mu), inv));
}

__global__ void scale_copy_kernel(const float *x, float *y, int64_t n, float a) {
    for (int64_t i = blockIdx.x * (int64_t)NT + threadIdx.x; i < n; i += (int64_t)gridDim.x * NT)
        y[i] = __fmul_rn(a, x[i]);
}

/* W ← W·decay − step·O over nb consecutive R × C matrices, O read back from the batch (items sx apart). */
template <class T>
__global__ void muon_apply_kernel(float *w, const T *X, int64_t R, int64_t C, int64_t sx, int64_t nb, float decay,
                                  float step) {
    const int64_t n = R * C, total = nb * n;
    for (int64_t i = blockIdx.x * (int64_t)NT + threadIdx.x; i < total; i += (int64_t)gridDim.x * NT) {
        const int64_t b = i / n, k = i - b * n;
        const float o = to_f(X[b * sx + k]);
        w[i] = __fsub_rn(__fmul_rn(w[i], decay), __fmul_rn(step, o));
    }
}

/* Σg² of grad-norm piece blockIdx.x, in double. */
__global__ void sumsq_kernel(const float *g, const int64_t *pieces, double *partials) {
    __shared__ double red[NT];
    const int64_t p = blockIdx.x, off = pieces[2 * p], len = pieces[2 * p + 1];
    double s = 0;
    for (int64_t i = threadIdx.x; i < len; i += NT) {
        const double x = g[off + i];
        s = __dadd_rn(s, __dmul_rn(x, x));
    }
    const double total = block_sum(s, red);
    if (threadIdx.x == 0) partials[p] = total;
}

/* The partials summed by one block in a fixed order (thread t takes t, t + NT, ...; then the tree). */
__global__ void final_sum_kernel(const double *partials, int64_t n, double *out) {
    __shared__ double red[NT];
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += NT) s = __dadd_rn(s, partials[i]);
    const double total = block_sum(s, red);
    if (threadIdx.x == 0) *out = total;
}

__global__ void clip_kernel(float *g, const int64_t *pieces, float c) {
    const int64_t p = blockIdx.x, off = pieces[2 * p], len = pieces[2 * p + 1];
    for (int64_t i = threadIdx.x; i < len; i += NT) g[off + i] = __fmul_rn(g[off + i], c);
}

/* ---------------------------------------------------------------- memory and GEMMs */

void *dev_alloc(const k3c_optim_cuda *oc, size_t bytes) {
    if (oc->alloc) return oc->alloc(bytes);
    void *p = nullptr;
    return k3c_cuda_malloc(&p, bytes, nullptr) == K3C_OK ? p : nullptr;
}
void dev_free(const k3c_optim_cuda *oc, void *p) {
    if (!p) return;
    if (oc->free)
        oc->free(p);
    else
        k3c_cuda_free(p);
}

int bgemm(const k3c_optim_cuda *oc, int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha, const float *A,
          size_t sA, const float *B, size_t sB, double beta, float *C, size_t sC, int64_t batch, k3c_err *err) {
    if (oc->batched && batch > 1)
        return k3c_matmul_batched_cuda(oc->cu, ta, tb, M, N, K, alpha, A, (int64_t)sA, B, (int64_t)sB, beta, C,
                                       (int64_t)sC, (int32_t)batch, 0, err);
    for (int64_t i = 0; i < batch; i++) {
        int rc = k3c_matmul_cuda(oc->cu, ta, tb, M, N, K, alpha, A + i * sA, B + i * sB, beta, C + i * sC, 0, err);
        if (rc) return rc;
    }
    return K3C_OK;
}

/* NS5 on nb loaded matrices of shape s in the workspace (X at ws); returns where the result lies (X or X'). fp32. */
int ns_batch(const k3c_optim_cuda *oc, const mshape &s, int64_t nb, int steps, float *ws, float **out, k3c_err *err) {
    const size_t r = s.r(), c = s.c(), sx = stride_x<float>(s), sp = stride_p<float>(s);
    const int tall = s.tall();
    float *X = ws, *Xn = X + nb * sx, *P = Xn + nb * sx, *B = P + nb * sp;
    for (int it = 0; it < steps; it++) {
        int rc = bgemm(oc, tall, !tall, r, r, c, 1.0, X, sx, X, sx, 0.0, P, sp, nb, err); /* P = X Xᵀ (tall: XᵀX) */
        if (rc) return rc;
        scale_copy_kernel<<<grid_for(nb * sp), NT, 0, K3C_STREAM>>>(P, B, nb * sp, (float)K3C_NS_B);
        K3C_CU_LAUNCHED("ns scale");
        rc = bgemm(oc, 0, 0, r, r, r, (float)K3C_NS_C, P, sp, P, sp, 1.0, B, sp, nb, err); /* B = bP + cP² */
        if (rc) return rc;
        K3C_CU(cudaMemcpyAsync(Xn, X, sizeof(float) * nb * sx, cudaMemcpyDeviceToDevice, K3C_STREAM));
        rc = tall ? bgemm(oc, 0, 0, c, r, r, 1.0, X, sx, B, sp, (float)K3C_NS_A, Xn, sx, nb, err)  /* aX + X B */
                  : bgemm(oc, 0, 0, r, c, r, 1.0, B, sp, X, sx, (float)K3C_NS_A, Xn, sx, nb, err); /* aX + B X */
        if (rc) return rc;
        float *t = X;
        X = Xn;
        Xn = t;
    }
    *out = X;
    return K3C_OK;
}

int bgemm16(const k3c_optim_cuda *oc, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16 *A,
            size_t sA, const bf16 *B, size_t sB, float beta, const bf16 *C_in, bf16 *C, size_t sC, int64_t batch,
            k3c_err *err) {
    const uint16_t *a = (const uint16_t *)A, *b = (const uint16_t *)B, *ci = (const uint16_t *)C_in;
    uint16_t *c = (uint16_t *)C;
    if (oc->batched)
        return k3c_gemm_bf16_batched_cuda(oc->cu, ta, tb, M, N, K, alpha, a, (int64_t)sA, b, (int64_t)sB, beta, ci, c,
                                          (int64_t)sC, (int32_t)batch, err);
    for (int64_t i = 0; i < batch; i++) {
        int rc = k3c_gemm_bf16_batched_cuda(oc->cu, ta, tb, M, N, K, alpha, a + i * sA, 0, b + i * sB, 0, beta,
                                            ci ? ci + i * sC : nullptr, c + i * sC, 0, 1, err);
        if (rc) return rc;
    }
    return K3C_OK;
}

/* The same in bf16, as the Muon reference runs it: X, P, B stored bf16, every product on bf16 tensor cores with fp32
 * accumulation. The polynomial's combinations ride in the GEMMs' fp32 epilogue (B = c·PP + b·P and X' = B·X + a·X,
 * out of place), each rounded once to bf16 where the reference's bf16 tensors round every term: no extra pass over
 * memory, and no more rounding than the reference. */
int ns_batch(const k3c_optim_cuda *oc, const mshape &s, int64_t nb, int steps, bf16 *ws, bf16 **out, k3c_err *err) {
    const size_t r = s.r(), c = s.c(), sx = stride_x<bf16>(s), sp = stride_p<bf16>(s);
    const int tall = s.tall();
    const float a = (float)K3C_NS_A, b = (float)K3C_NS_B, cc = (float)K3C_NS_C;
    bf16 *X = ws, *Xn = X + nb * sx, *P = Xn + nb * sx, *B = P + nb * sp;
    for (int it = 0; it < steps; it++) {
        int rc = bgemm16(oc, tall, !tall, r, r, c, 1.0f, X, sx, X, sx, 0.0f, nullptr, P, sp, nb, err); /* X Xᵀ, XᵀX */
        if (!rc) rc = bgemm16(oc, 0, 0, r, r, r, cc, P, sp, P, sp, b, P, B, sp, nb, err); /* B = c PP + b P */
        if (!rc)
            rc = tall ? bgemm16(oc, 0, 0, c, r, r, 1.0f, X, sx, B, sp, a, X, Xn, sx, nb, err)  /* X' = X B + a X */
                      : bgemm16(oc, 0, 0, r, c, r, 1.0f, B, sp, X, sx, a, X, Xn, sx, nb, err); /* X' = B X + a X */
        if (rc) return rc;
        bf16 *t = X;
        X = Xn;
        Xn = t;
    }
    *out = X;
    return K3C_OK;
}

/* A run of consecutive matrices of one entry placed at batch index `at` of the current chunk. */
struct piece {
    float *w;
    const float *g;
    float *mom;
    int64_t nb, at;
};

/* Every Muon entry of one shape, in chunks of as many matrices as the workspace holds: load, NS5 on T elements,
 * apply. */
template <class T>
int muon_group(const k3c_optim_cuda *oc, const k3c_optim *o, const k3c_param_table *t, const mshape &s,
               const std::vector<int> &entries, float *w, const float *g, float *state, double lr, k3c_err *err) {
    const size_t cap_ws = oc->ws_numel / need_floats<T>(s), sxs = stride_x<T>(s);
    T *ws = (T *)oc->ws;
    if (cap_ws == 0)
        return k3c_errf(err, K3C_EINVAL,
                        "optimizer (cuda): a %lldx%lld Muon block needs %zu workspace floats, have %zu "
                        "(optimizer settings changed after k3c_optim_cuda_init?)",
                        (long long)s.R, (long long)s.C, need_floats<T>(s), oc->ws_numel);
    const int64_t cap = cap_ws < (size_t)INT32_MAX ? (int64_t)cap_ws : INT32_MAX;
    const float mu = (float)o->muon_momentum;
    const float step = (float)(lr * o->muon_scale * sqrt((double)(s.R > s.C ? s.R : s.C)));
    const float decay = (float)(1.0 - lr * o->weight_decay);
    std::vector<piece> chunk;
    int64_t filled = 0;
    auto flush = [&]() -> int {
        T *O = nullptr;
        int rc = filled ? ns_batch(oc, s, filled, o->ns_steps, ws, &O, err) : K3C_OK;
        for (size_t i = 0; !rc && i < chunk.size(); i++) {
            const piece &pc = chunk[i];
            muon_apply_kernel<<<grid_for(pc.nb * s.R * s.C), NT, 0, K3C_STREAM>>>(pc.w, O + pc.at * sxs, s.R, s.C,
                                                                                  (int64_t)sxs, pc.nb, decay, step);
            K3C_CU_LAUNCHED("muon apply");
        }
        chunk.clear();
        filled = 0;
        return rc;
    };
    for (int i : entries) {
        const k3c_param *p = &t->p[i];
        const int64_t bn = s.R * s.C, nb = p->numel / bn;
        float *pw = w + p->offset, *mom = state + o->state_off[i];
        const float *pg = g + p->offset;
        for (int64_t j = 0; j < nb;) {
            const int64_t take = nb - j < cap - filled ? nb - j : cap - filled;
            ns_load_kernel<<<(unsigned)take, NT, 0, K3C_STREAM>>>(pg + j * bn, mom + j * bn, s.R, s.C, o->nesterov, mu,
                                                                  ws + filled * sxs, (int64_t)sxs);
            K3C_CU_LAUNCHED("ns load");
            chunk.push_back({pw + j * bn, pg + j * bn, mom + j * bn, take, filled});
            filled += take;
            j += take;
            if (filled == cap) {
                int rc = flush();
                if (rc) return rc;
            }
        }
    }
    return flush();
}

struct group {
    mshape s;
    std::vector<int> entries;
};

int check_muon_entry(const k3c_optim *o, const k3c_param *p, k3c_err *err) {
    const int64_t hr = block_rows(o, p);
    if (p->ndim != 2 || p->shape[0] < 1 || p->shape[1] < 1 || hr < 0 || (hr > 0 && p->shape[0] % hr != 0) ||
        p->shape[0] > INT32_MAX || p->shape[1] > INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "optimizer: %s slice 0: muon: bad shape [%lld, %lld] with head_rows %lld",
                        p->name, (long long)p->shape[0], (long long)p->shape[1], (long long)hr);
    return K3C_OK;
}

mshape shape_of(const k3c_optim *o, const k3c_param *p) {
    const int64_t hr = block_rows(o, p);
    return mshape{hr > 0 ? hr : p->shape[0], p->shape[1]};
}

} // namespace

/* ================================================================ public entry points */

extern "C" int k3c_optim_cuda_init(k3c_optim_cuda *oc, k3c_cuda_ctx *cu, void *(*alloc)(size_t),
                                   void (*free_fn)(void *), const k3c_optim *o, const k3c_param_table *t,
                                   k3c_err *err) {
    memset(oc, 0, sizeof *oc);
    oc->cu = cu;
    oc->alloc = alloc;
    oc->free = free_fn;
    oc->batched = 1;
    oc->auto_bf16 = 1;
    size_t max_need = 0, sum_need = 0;
    for (int i = 0; i < t->n; i++) {
        const k3c_param *p = &t->p[i];
        if (!uses_muon(o, p)) continue;
        int rc = check_muon_entry(o, p, err);
        if (rc) return rc;
        const mshape s = shape_of(o, p);
        const size_t need = need_floats<float>(s); /* either precision's */
        if (need > max_need) max_need = need;
        sum_need += need * (size_t)(p->numel / (s.R * s.C));
    }
    oc->ws_numel = sum_need < WS_BUDGET ? sum_need : WS_BUDGET;
    if (max_need > oc->ws_numel) oc->ws_numel = max_need;
    std::vector<int64_t> pieces;
    for (int i = 0; i < t->n; i++) {
        const k3c_param *p = &t->p[i];
        if (p->kind == K3C_PK_ROUTER_BIAS) continue;
        for (int64_t o0 = 0; o0 < p->numel; o0 += NORM_BLOCK) {
            pieces.push_back((int64_t)p->offset + o0);
            pieces.push_back(p->numel - o0 < NORM_BLOCK ? p->numel - o0 : NORM_BLOCK);
        }
    }
    oc->n_pieces = (int64_t)pieces.size() / 2;
    if (oc->n_pieces > INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "optimizer (cuda): %lld grad-norm blocks", (long long)oc->n_pieces);
    oc->n_entries = t->n;
    oc->total = t->total;
    oc->ws = oc->ws_numel ? (float *)dev_alloc(oc, sizeof(float) * oc->ws_numel) : nullptr;
    oc->partials = (double *)dev_alloc(oc, sizeof(double) * (size_t)(oc->n_pieces + 1));
    oc->pieces = oc->n_pieces ? (int64_t *)dev_alloc(oc, sizeof(int64_t) * pieces.size()) : nullptr;
    if ((oc->ws_numel && !oc->ws) || !oc->partials || (oc->n_pieces && !oc->pieces)) {
        k3c_optim_cuda_free(oc);
        return k3c_errf(err, K3C_ENOMEM, "optimizer (cuda): cannot allocate %zu workspace floats", oc->ws_numel);
    }
    int rc = oc->n_pieces ? k3c_cuda_h2d(oc->pieces, pieces.data(), sizeof(int64_t) * pieces.size(), err) : K3C_OK;
    if (rc) k3c_optim_cuda_free(oc);
    return rc;
}

extern "C" void k3c_optim_cuda_free(k3c_optim_cuda *oc) {
    dev_free(oc, oc->ws);
    dev_free(oc, oc->partials);
    dev_free(oc, oc->pieces);
    oc->ws = nullptr;
    oc->partials = nullptr;
    oc->pieces = nullptr;
    oc->ws_numel = 0;
    oc->n_pieces = 0;
}

extern "C" int k3c_optim_step_entries_cuda(k3c_optim_cuda *oc, k3c_optim *o, const k3c_param_table *t, int first,
                                           int last, float *w, const float *g, float *state, double lr, int64_t step,
                                           k3c_err *err) {
    if (int e = k3c_optim_check_step(o, t, first, last, lr, step, err)) return e;
    /* AdamW's scalars exactly as k3c_adamw_update forms them (double, then rounded once to float). */
    const float b1 = (float)o->beta1, b2 = (float)o->beta2, eps = (float)o->eps;
    const float omb1 = (float)(1.0 - o->beta1), omb2 = (float)(1.0 - o->beta2);
    const double bc1 = 1.0 - pow(o->beta1, (double)step), bc2 = 1.0 - pow(o->beta2, (double)step);
    const float step_size = (float)(lr / bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    std::vector<group> groups;
    for (int i = first; i < last; i++) {
        const k3c_param *p = &t->p[i];
        float *pw = w + p->offset, *st = state + o->state_off[i];
        const float *pg = g + p->offset;
        if (p->kind == K3C_PK_ROUTER_BIAS) continue;
        if (uses_muon(o, p)) {
            int rc = check_muon_entry(o, p, err);
            if (rc) return rc;
            /* M ← μM + G over every slice first; the blocks then read the new momentum. */
            momentum_kernel<<<grid_for(p->numel), NT, 0, K3C_STREAM>>>(st, pg, p->numel, (float)o->muon_momentum);
            K3C_CU_LAUNCHED("momentum");
            const mshape s = shape_of(o, p);
            size_t k = 0;
            while (k < groups.size() && !(groups[k].s.R == s.R && groups[k].s.C == s.C)) k++;
            if (k == groups.size()) groups.push_back(group{s, {}});
            groups[k].entries.push_back(i);
            continue;
        }
        const double wd = (p->kind == K3C_PK_VECTOR && !o->decay_vectors) ? 0.0 : o->weight_decay;
        if (p->used <= 0) continue;
        const float decay = (float)(1.0 - lr * wd);
        float *pm = st, *pv = st + p->numel;
        if (p->used % 4 == 0 && aligned16(pw) && aligned16(pg) && aligned16(pm) && aligned16(pv))
            adamw4_kernel<<<grid_for(p->used / 4), NT, 0, K3C_STREAM>>>((float4 *)pw, (const float4 *)pg, (float4 *)pm,
                                                                        (float4 *)pv, p->used / 4, b1, b2, omb1, omb2,
                                                                        eps, step_size, inv_sqrt_bc2, decay);
        else
            adamw_kernel<<<grid_for(p->used), NT, 0, K3C_STREAM>>>(pw, pg, pm, pv, p->used, b1, b2, omb1, omb2, eps,
                                                                   step_size, inv_sqrt_bc2, decay);
        K3C_CU_LAUNCHED("adamw");
    }
    for (const group &gr : groups) {
        int rc = ns_in_bf16(oc, o) ? muon_group<bf16>(oc, o, t, gr.s, gr.entries, w, g, state, lr, err)
                                   : muon_group<float>(oc, o, t, gr.s, gr.entries, w, g, state, lr, err);
        if (rc) return rc;
    }
    return K3C_OK;
}

extern "C" int k3c_optim_step_cuda(k3c_optim_cuda *oc, k3c_optim *o, const k3c_param_table *t, float *w, const float *g,
                                   float *state, double lr, int64_t step, k3c_err *err) {
    return k3c_optim_step_entries_cuda(oc, o, t, 0, t->n, w, g, state, lr, step, err);
}

extern "C" int k3c_grad_norm_cuda(k3c_optim_cuda *oc, const k3c_param_table *t, const float *g, double *norm,
                                  k3c_err *err) {
    if (t->n != oc->n_entries || t->total != oc->total)
        return k3c_errf(err, K3C_EINVAL, "grad norm (cuda): table of %d entries / %zu floats, initialised for %d / %zu",
                        t->n, t->total, oc->n_entries, oc->total);
    double ss = 0;
    if (oc->n_pieces) {
        sumsq_kernel<<<(unsigned)oc->n_pieces, NT, 0, K3C_STREAM>>>(g, oc->pieces, oc->partials);
        K3C_CU_LAUNCHED("grad norm partials");
        final_sum_kernel<<<1, NT, 0, K3C_STREAM>>>(oc->partials, oc->n_pieces, oc->partials + oc->n_pieces);
        K3C_CU_LAUNCHED("grad norm total");
        K3C_CU(cudaMemcpyAsync(&ss, oc->partials + oc->n_pieces, sizeof ss, cudaMemcpyDeviceToHost, K3C_STREAM));
        K3C_CU(cudaStreamSynchronize(K3C_STREAM));
    }
    *norm = sqrt(ss);
    return K3C_OK;
}

extern "C" int k3c_clip_grad_norm_cuda(k3c_optim_cuda *oc, const k3c_param_table *t, float *g, double max_norm,
                                       double *norm, k3c_err *err) {
    int rc = k3c_grad_norm_cuda(oc, t, g, norm, err);
    if (rc || !isfinite(*norm) || !(max_norm > 0) || *norm <= max_norm) return rc;
    const float c = (float)(max_norm / (*norm + 1e-6));
    clip_kernel<<<(unsigned)oc->n_pieces, NT, 0, K3C_STREAM>>>(g, oc->pieces, c);
    K3C_CU_LAUNCHED("clip");
    return K3C_OK;
}

/* ================================================================ the backend table's optimizer entries */
namespace {

int ob_open(void *ctx, const k3c_optim *o, const k3c_param_table *t, void **inst, k3c_err *err) {
    k3c_cuda_backend *b = static_cast<k3c_cuda_backend *>(ctx);
    k3c_optim_cuda *oc = static_cast<k3c_optim_cuda *>(calloc(1, sizeof *oc));
    if (!oc) return k3c_errf(err, K3C_ENOMEM, "optimizer (cuda): out of memory");
    int rc = k3c_optim_cuda_init(oc, &b->cu, b->table.alloc, b->table.free, o, t, err);
    if (rc) {
        free(oc);
        return rc;
    }
    /* the fp32 GEMM mode is the checking mode, in which the whole step follows the CPU's fp32 */
    oc->auto_bf16 = b->gemm != K3C_GEMM_FP32;
    *inst = oc;
    return K3C_OK;
}
void ob_close(void *inst) {
    if (!inst) return;
    k3c_optim_cuda_free(static_cast<k3c_optim_cuda *>(inst));
    free(inst);
}
int ob_step(void *inst, k3c_optim *o, const k3c_param_table *t, int first, int last, float *w, const float *g,
            float *state, double lr, int64_t step, k3c_err *err) {
    return k3c_optim_step_entries_cuda(static_cast<k3c_optim_cuda *>(inst), o, t, first, last, w, g, state, lr, step,
                                       err);
}
int ob_clip(void *inst, const k3c_param_table *t, float *g, double max_norm, double *norm, k3c_err *err) {
    return k3c_clip_grad_norm_cuda(static_cast<k3c_optim_cuda *>(inst), t, g, max_norm, norm, err);
}

} // namespace

extern "C" void k3c_cuda_optim_entries(k3c_cuda_backend *b) {
    k3c_backend_f32 &t = b->table;
    t.optim_open = ob_open;
    t.optim_close = ob_close;
    t.optim_step = ob_step;
    t.clip_grad_norm = ob_clip;
}
