/* vision.cu — fp32 CUDA twins of the vision tower's ops (ops/gelu.c, rope2d.c, posemb.c, vit_attention.c,
 * patch_merge.c): GELU (tanh, erf), 2D rotary, the interpolated position table and its transpose, block-diagonal
 * attention and the sd2_tpool merge. docs/VISION.md "Stages"; declarations in cuda/cuda_ops.h. Plain one-thread-per-
 * output kernels, every reduction in a fixed order (deterministic, no atomics); grids, cu offsets and the rope table
 * are device arrays the caller validated on the host (k3c_grid_tokens). */
#include "cuda/kernels.cuh"

namespace {

#define GRID_STRIDE(i, n)                                                                                              \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

constexpr float GELU_C = 0.7978845608028654f, GELU_A = 0.044715f, INV_SQRT2 = 0.7071067811865476f,
                INV_SQRT_2PI = 0.3989422804014327f;
constexpr int MAX_DH = 256;

/* ================================================================ GELU
 * 1 + erf(z) and 1 + tanh(u) cancel to 0 in float for negative inputs (erff(−3.9) rounds to −1), where the CPU's double
 * keeps the tiny tail; so the kernels use erfc(−z) and 1 + tanh(u) = 2σ(2u), 1 − tanh²(u) = 4σ(2u)(1 − σ(2u)) with
 * σ and 1 − σ both from e = exp(−2u), accurate on both sides. */
__device__ inline void tanh_parts(float u, float *s, float *one_minus_s) {
    const float e = expf(-2.f * u); /* inf for very negative u: s = 0, 1 − s = 1 (nan-free) */
    *s = 1.f / (1.f + e);
    *one_minus_s = isinf(e) ? 1.f : e / (1.f + e);
}

__global__ void gelu_kernel(int64_t n, const float *x, float *y, int erf_form) {
    GRID_STRIDE(i, n) {
        const float v = x[i];
        if (erf_form) {
            y[i] = 0.5f * v * erfcf(-v * INV_SQRT2);
        } else {
            float s, r;
            tanh_parts(GELU_C * (v + GELU_A * v * v * v), &s, &r);
            y[i] = v * s;
        }
    }
}
__global__ void gelu_bwd_kernel(int64_t n, const float *x, const float *dy, float *dx, int erf_form) {
    GRID_STRIDE(i, n) {
        const float v = x[i];
        float d;
        if (erf_form) {
            d = 0.5f * erfcf(-v * INV_SQRT2) + v * INV_SQRT_2PI * expf(-0.5f * v * v);
        } else {
            float s, r;
            tanh_parts(GELU_C * (v + GELU_A * v * v * v), &s, &r);
            d = s + 2.f * v * s * r * GELU_C * (1.f + 3.f * GELU_A * v * v);
        }
        dx[i] += dy[i] * d;
    }
}

/* ================================================================ 2D rotary: one thread per (row, head, pair) */
__global__ void rope_kernel(int64_t rows, int64_t H, int64_t dh, const float *cs, const float *x, float *y, int bwd) {
    const int64_t np = dh / 2;
    GRID_STRIDE(i, rows * H * np) {
        const int64_t r = i / (H * np), p = i % np;
        const float c = cs[(r * np + p) * 2], s = cs[(r * np + p) * 2 + 1];
        const int64_t o = (i / np) * dh + 2 * p;
        const float a = x[o], b = x[o + 1];
        if (bwd) {
            y[o] += a * c + b * s;
            y[o + 1] += -a * s + b * c;
        } else {
            y[o] = a * c - b * s;
            y[o + 1] = a * s + b * c;
        }
    }
}

/* ================================================================ position table */
/* The taps of output position o on an axis in → out, as posemb.c (float source coordinate, torch's formulas). */
__device__ int axis_taps(int64_t in, int64_t out, int mode, int64_t o, int64_t idx[4], float wt[4]) {
    const float scale = (float)in / (float)out, src = scale * ((float)o + 0.5f) - 0.5f;
    if (mode == K3C_INTERP_BILINEAR) {
        const float s = src < 0 ? 0 : src;
        int64_t i0 = (int64_t)floorf(s);
        if (i0 > in - 1) i0 = in - 1;
        float l1 = fminf(fmaxf(s - (float)i0, 0.f), 1.f);
        idx[0] = i0, idx[1] = i0 + (i0 < in - 1 ? 1 : 0), wt[0] = 1.f - l1, wt[1] = l1;
        return 2;
    }
    int64_t i0 = (int64_t)floorf(src);
    if (i0 > in - 1) i0 = in - 1;
    const double t = fmin(fmax((double)(src - (float)i0), 0.0), 1.0), A = -0.75, x1 = t + 1, x2 = t, x3 = 1 - t,
                 x4 = 2 - t;
    wt[0] = (float)(((A * x1 - 5 * A) * x1 + 8 * A) * x1 - 4 * A);
    wt[1] = (float)(((A + 2) * x2 - (A + 3)) * x2 * x2 + 1);
    wt[2] = (float)(((A + 2) * x3 - (A + 3)) * x3 * x3 + 1);
    wt[3] = (float)(((A * x4 - 5 * A) * x4 + 8 * A) * x4 - 4 * A);
    for (int k = 0; k < 4; k++) {
        const int64_t j = i0 - 1 + k;
        idx[k] = j < 0 ? 0 : j > in - 1 ? in - 1 : j;
    }
    return 4;
}

/* Weight of source index r in output position o's taps (clamped taps may repeat an index). */
__device__ float tap_weight(int64_t in, int64_t out, int mode, int64_t o, int64_t r) {
    int64_t idx[4];
    float wt[4];
    const int n = axis_taps(in, out, mode, o, idx, wt);
    float w = 0;
    for (int k = 0; k < n; k++) w += idx[k] == r ? wt[k] : 0.f;
    return w;
}

/* Which item holds token i, its offset, and its frame-local patch. */
__device__ int item_of(const k3c_grid_thw *g, int n, int64_t i, int64_t *off) {
    int64_t o = 0;
    for (int m = 0; m < n; m++) {
        const int64_t len = g[m].t * g[m].h * g[m].w;
        if (i < o + len) {
            *off = o;
            return m;
        }
        o += len;
    }
    *off = o;
    return n - 1;
}

__global__ void posemb_fwd_kernel(k3c_posemb_sizes s, const k3c_grid_thw *g, int n, int64_t L, const float *table,
                                  float *x) {
    const int64_t D = s.D;
    GRID_STRIDE(i, L * D) {
        const int64_t tok = i / D, j = i % D;
        int64_t off;
        const k3c_grid_thw it = g[item_of(g, n, tok, &off)];
        const int64_t hw = it.h * it.w, f = (tok - off) / hw, p = (tok - off) % hw;
        int64_t iy[4], ix[4];
        float wy[4], wx[4];
        const int ny = axis_taps(s.H0, it.h, s.mode, p / it.w, iy, wy),
                  nx = axis_taps(s.W0, it.w, s.mode, p % it.w, ix, wx);
        double acc = 0;
        for (int a = 0; a < ny; a++) {
            double row = 0;
            for (int b = 0; b < nx; b++) row += (double)wx[b] * table[(iy[a] * s.W0 + ix[b]) * D + j];
            acc += wy[a] * row;
        }
        if (it.t > 1) {
            const int64_t half = D / 2, jj = j < half ? j : j - half;
            const double a = (double)f / pow(10000.0, (double)jj / (double)half);
            acc += j < half ? sin(a) : cos(a);
        }
        x[i] += (float)acc;
    }
}

/* dtable[r, c, j] = Σ_items Σ_{y, x} wy(y→r) wx(x→c) Σ_frames dx: a gather per table cell (no atomics). */
__global__ void posemb_bwd_kernel(k3c_posemb_sizes s, const k3c_grid_thw *g, int n, const float *dx, float *dtable) {
    const int64_t D = s.D;
    GRID_STRIDE(i, s.H0 * s.W0 * D) {
        const int64_t r = i / (s.W0 * D), c = (i / D) % s.W0, j = i % D;
        double acc = 0;
        int64_t off = 0;
        for (int m = 0; m < n; m++) {
            const k3c_grid_thw it = g[m];
            for (int64_t y = 0; y < it.h; y++) {
                const float wy = tap_weight(s.H0, it.h, s.mode, y, r);
                if (wy == 0.f) continue;
                for (int64_t xx = 0; xx < it.w; xx++) {
                    const float wx = tap_weight(s.W0, it.w, s.mode, xx, c);
                    if (wx == 0.f) continue;
                    double d = 0;
                    for (int64_t f = 0; f < it.t; f++) d += dx[(off + (f * it.h + y) * it.w + xx) * D + j];
                    acc += (double)wy * wx * d;
                }
            }
            off += it.t * it.h * it.w;
        }
        dtable[i] += (float)acc;
    }
}

/* ================================================================ attention inside each item */
__device__ float dotf(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t k = 0; k < n; k++) s += a[k] * b[k];
    return s;
}

__global__ void vit_attn_fwd_kernel(k3c_vit_attn_sizes s, const int32_t *cu, int n, const float *q, const float *k,
                                    const float *v, float *o, float *lse) {
    const int64_t H = s.H, dh = s.dh, ld = H * dh;
    GRID_STRIDE(r, s.L * H) {
        const int64_t i = r / H, h = r % H;
        const int d = k3c_cu::doc_of(cu, n, i);
        const float *qi = q + i * ld + h * dh;
        float mx = -INFINITY, sum = 0, acc[MAX_DH];
        for (int64_t c = 0; c < dh; c++) acc[c] = 0;
        for (int64_t j = cu[d]; j < cu[d + 1]; j++) mx = fmaxf(mx, (float)s.scale * dotf(qi, k + j * ld + h * dh, dh));
        for (int64_t j = cu[d]; j < cu[d + 1]; j++) {
            const float p = expf((float)s.scale * dotf(qi, k + j * ld + h * dh, dh) - mx);
            sum += p;
            for (int64_t c = 0; c < dh; c++) acc[c] += p * v[j * ld + h * dh + c];
        }
        for (int64_t c = 0; c < dh; c++) o[i * ld + h * dh + c] = acc[c] / sum;
        lse[i * H + h] = mx + logf(sum);
    }
}

/* role 0: dq of query rows; role 1: dk, dv of key rows. */
__global__ void vit_attn_bwd_kernel(k3c_vit_attn_sizes s, const int32_t *cu, int n, const float *q, const float *k,
                                    const float *v, const float *o, const float *lse, const float *dout, float *dq,
                                    float *dk, float *dv, int role) {
    const int64_t H = s.H, dh = s.dh, ld = H * dh;
    const float sc = (float)s.scale;
    GRID_STRIDE(r, s.L * H) {
        const int64_t me = r / H, h = r % H;
        const int d = k3c_cu::doc_of(cu, n, me);
        float a1[MAX_DH], a2[MAX_DH];
        for (int64_t c = 0; c < dh; c++) a1[c] = a2[c] = 0;
        for (int64_t other = cu[d]; other < cu[d + 1]; other++) {
            const int64_t i = role ? other : me, j = role ? me : other;
            const float *qi = q + i * ld + h * dh, *kj = k + j * ld + h * dh, *di = dout + i * ld + h * dh;
            const float p = expf(sc * dotf(qi, kj, dh) - lse[i * H + h]);
            const float ds = p * (dotf(di, v + j * ld + h * dh, dh) - dotf(di, o + i * ld + h * dh, dh)) * sc;
            for (int64_t c = 0; c < dh; c++) {
                if (role) {
                    a1[c] += ds * qi[c];
                    a2[c] += p * di[c];
                } else
                    a1[c] += ds * kj[c];
            }
        }
        for (int64_t c = 0; c < dh; c++) {
            if (!role) dq[me * ld + h * dh + c] += a1[c];
            if (role && dk) dk[me * ld + h * dh + c] += a1[c];
            if (role && dv) dv[me * ld + h * dh + c] += a2[c];
        }
    }
}

/* ================================================================ sd2_tpool merge */
/* One thread per (merged token, slot, channel) forward; per source element backward (each maps to one output). */
__global__ void merge_fwd_kernel(const k3c_grid_thw *g, int n, int64_t N, int64_t D, int64_t kh, int64_t kw,
                                 const float *x, float *y) {
    const int64_t K = kh * kw * D;
    GRID_STRIDE(i, N * K) {
        int64_t tok = i / K, slot = (i % K) / D, c = i % D, off = 0, base = 0;
        int m = 0;
        for (; m < n; m++) { /* the item of merged token tok */
            const int64_t nt = (g[m].h / kh) * (g[m].w / kw);
            if (tok < base + nt) break;
            base += nt;
            off += g[m].t * g[m].h * g[m].w;
        }
        const k3c_grid_thw it = g[m];
        const int64_t ij = tok - base, nw = it.w / kw, a = slot / kw, b = slot % kw;
        double acc = 0;
        for (int64_t f = 0; f < it.t; f++)
            acc += x[(off + f * it.h * it.w + ((ij / nw) * kh + a) * it.w + (ij % nw) * kw + b) * D + c];
        y[i] = (float)(acc / (double)it.t);
    }
}

__global__ void merge_bwd_kernel(const k3c_grid_thw *g, int n, int64_t L, int64_t D, int64_t kh, int64_t kw,
                                 const float *dy, float *dx) {
    const int64_t K = kh * kw * D;
    GRID_STRIDE(i, L * D) {
        const int64_t row = i / D, c = i % D;
        int64_t off = 0, base = 0;
        int m = 0;
        for (; m < n; m++) {
            const int64_t len = g[m].t * g[m].h * g[m].w;
            if (row < off + len) break;
            off += len;
            base += (g[m].h / kh) * (g[m].w / kw);
        }
        const k3c_grid_thw it = g[m];
        const int64_t p = (row - off) % (it.h * it.w), y = p / it.w, x = p % it.w;
        const int64_t tok = base + (y / kh) * (it.w / kw) + x / kw, slot = (y % kh) * kw + x % kw;
        dx[i] += dy[tok * K + slot * D + c] / (float)it.t;
    }
}

} // namespace

/* ================================================================ C entry points */
#define LAUNCH(n, kernel, ...)                                                                                         \
    do {                                                                                                               \
        if ((n) > 0) {                                                                                                 \
            kernel<<<grid_for((n), 256), 256, 0, K3C_STREAM>>>(__VA_ARGS__);                                           \
            K3C_CU_LAUNCHED(#kernel);                                                                                  \
        }                                                                                                              \
    } while (0)

extern "C" int k3c_gelu_tanh_cuda(int64_t n, const float *x, float *y, k3c_err *err) {
    LAUNCH(n, gelu_kernel, n, x, y, 0);
    return 0;
}
extern "C" int k3c_gelu_tanh_bwd_cuda(int64_t n, const float *x, const float *dy, float *dx, k3c_err *err) {
    LAUNCH(n, gelu_bwd_kernel, n, x, dy, dx, 0);
    return 0;
}
extern "C" int k3c_gelu_erf_cuda(int64_t n, const float *x, float *y, k3c_err *err) {
    LAUNCH(n, gelu_kernel, n, x, y, 1);
    return 0;
}
extern "C" int k3c_gelu_erf_bwd_cuda(int64_t n, const float *x, const float *dy, float *dx, k3c_err *err) {
    LAUNCH(n, gelu_bwd_kernel, n, x, dy, dx, 1);
    return 0;
}

extern "C" int k3c_rope2d_fwd_cuda(int64_t rows, int64_t H, int64_t dh, const float *cs, const float *x, float *y,
                                   k3c_err *err) {
    if (dh % 4) return k3c_errf(err, K3C_EINVAL, "rope2d_fwd_cuda: head dim %lld not a multiple of 4", (long long)dh);
    LAUNCH(rows * H * (dh / 2), rope_kernel, rows, H, dh, cs, x, y, 0);
    return 0;
}
extern "C" int k3c_rope2d_bwd_cuda(int64_t rows, int64_t H, int64_t dh, const float *cs, const float *dy, float *dx,
                                   k3c_err *err) {
    if (dh % 4) return k3c_errf(err, K3C_EINVAL, "rope2d_bwd_cuda: head dim %lld not a multiple of 4", (long long)dh);
    LAUNCH(rows * H * (dh / 2), rope_kernel, rows, H, dh, cs, dy, dx, 1);
    return 0;
}

extern "C" int k3c_posemb_fwd_cuda(const k3c_posemb_sizes *s, const k3c_grid_thw *g, int n, int64_t L,
                                   const float *table, float *x, k3c_err *err) {
    LAUNCH(L * s->D, posemb_fwd_kernel, *s, g, n, L, table, x);
    return 0;
}
extern "C" int k3c_posemb_bwd_cuda(const k3c_posemb_sizes *s, const k3c_grid_thw *g, int n, const float *dx,
                                   float *dtable, k3c_err *err) {
    LAUNCH(s->H0 * s->W0 * s->D, posemb_bwd_kernel, *s, g, n, dx, dtable);
    return 0;
}

extern "C" int k3c_vit_attention_fwd_cuda(const k3c_vit_attn_sizes *s, const int32_t *cu, int n, const float *q,
                                          const float *k, const float *v, float *o, float *lse, k3c_err *err) {
    if (s->dh > MAX_DH) return k3c_errf(err, K3C_EUNSUPPORTED, "vit_attention_cuda: head dim above %d", MAX_DH);
    LAUNCH(s->L * s->H, vit_attn_fwd_kernel, *s, cu, n, q, k, v, o, lse);
    return 0;
}
extern "C" int k3c_vit_attention_bwd_cuda(const k3c_vit_attn_sizes *s, const int32_t *cu, int n, const float *q,
                                          const float *k, const float *v, const float *o, const float *lse,
                                          const float *dout, float *dq, float *dk, float *dv, k3c_err *err) {
    if (s->dh > MAX_DH) return k3c_errf(err, K3C_EUNSUPPORTED, "vit_attention_cuda: head dim above %d", MAX_DH);
    if (dq) LAUNCH(s->L * s->H, vit_attn_bwd_kernel, *s, cu, n, q, k, v, o, lse, dout, dq, dk, dv, 0);
    if (dk || dv) LAUNCH(s->L * s->H, vit_attn_bwd_kernel, *s, cu, n, q, k, v, o, lse, dout, dq, dk, dv, 1);
    return 0;
}

extern "C" int k3c_tpool_merge_fwd_cuda(const k3c_grid_thw *g, int n, int64_t N, int64_t D, int64_t kh, int64_t kw,
                                        const float *x, float *y, k3c_err *err) {
    LAUNCH(N * kh * kw * D, merge_fwd_kernel, g, n, N, D, kh, kw, x, y);
    return 0;
}
extern "C" int k3c_tpool_merge_bwd_cuda(const k3c_grid_thw *g, int n, int64_t L, int64_t D, int64_t kh, int64_t kw,
                                        const float *dy, float *dx, k3c_err *err) {
    LAUNCH(L * D, merge_bwd_kernel, g, n, L, D, kh, kw, dy, dx);
    return 0;
}
