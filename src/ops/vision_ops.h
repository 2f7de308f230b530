/* vision_ops.h — the CPU ops of the MoonViT-V2 vision tower: GELU (tanh and erf forms), 2D rotary embedding, the
 * interpolated `divided_fixed` position table, block-diagonal bidirectional attention, `sd2_tpool` patch merge.
 * Spec: docs/VISION.md (stages), ../shared/spec/TRAINING.md §6.2, CHECKPOINTS.md §3.4. */

/* Every op follows src/ops/ops.h (sizes, row-major token-major arrays, backward ADDS, NULL gradient = not needed) and
 * exists as _f32 and _f64. Packed media are described by grids: n items of (t, h, w) patches, an item's t·h·w tokens
 * stored frame-major, row-major inside a frame; attention never crosses items. None of these ops needs a workspace. */
#ifndef K3C_OPS_VISION_OPS_H
#define K3C_OPS_VISION_OPS_H

#include "ops/ops.h"

#include <stdint.h>

typedef enum { K3C_INTERP_BILINEAR = 0, K3C_INTERP_BICUBIC = 1 } k3c_interp_mode;

/* The position table [H0, W0, D] resized to each item's (h, w) as torch's F.interpolate(align_corners=False) does,
 * plus the fixed sin/cos time term of frame f when t > 1 (frames ≤ T0). */
typedef struct {
    int64_t H0, W0, T0, D;
    int mode; /* k3c_interp_mode */
} k3c_posemb_sizes;

typedef struct {
    int64_t L, H, dh; /* tokens, heads, head dim; q, k, v, o are [L, H, dh] */
    double scale;     /* score = scale · q·k */
} k3c_vit_attn_sizes;

#define K3C_VISION_OPS_API(real, S)                                                                                          \
    /* GELU, tanh form (gelu_pytorch_tanh): y = x/2 · (1 + tanh(√(2/π)(x + 0.044715 x³))); y may alias x. */            \
    void k3c_gelu_tanh_##S(int64_t n, const real *x, real *y);                                                               \
    void k3c_gelu_tanh_bwd_##S(int64_t n, const real *x, const real *dy, real *dx);                                          \
    /* GELU, exact form (nn.GELU()): y = x Φ(x). */                                                                         \
    void k3c_gelu_erf_##S(int64_t n, const real *x, real *y);                                                                \
    void k3c_gelu_erf_bwd_##S(int64_t n, const real *x, const real *dy, real *dx);                                           \
                                                                                                                             \
    /* 2D RoPE table cs[L, dh/2, 2] (cos, sin) for the packed items: pair 2i rotates by col·θ^(−4i/dh), pair 2i+1 by  \
       row·θ^(−4i/dh) (i < dh/4), the same for every frame. dh must be a multiple of 4. */  \
    int k3c_rope2d_table_##S(const k3c_grid_thw *g, int n, int64_t dh, double theta, real *cs, k3c_err *err);                \
    /* y = x rotated pairwise by cs ((x0 + i x1)(cos + i sin)) over rows × H heads of dh; y may alias x. */                 \
    void k3c_rope2d_fwd_##S(int64_t rows, int64_t H, int64_t dh, const real *cs, const real *x, real *y);                    \
    /* dx += the rotation of dy by −angle. */                                                                              \
    void k3c_rope2d_bwd_##S(int64_t rows, int64_t H, int64_t dh, const real *cs, const real *dy, real *dx);                  \
                                                                                                                             \
    /* x[L, D] += position embedding of every token of the n items (L = Σ t·h·w). */                                      \
    int k3c_posemb_fwd_##S(const k3c_posemb_sizes *s, const k3c_grid_thw *g, int n, const real *table, real *x,              \
                           k3c_err *err);                                                                                    \
    /* dtable += the transpose of the interpolation applied to dx[L, D] (the time term has no parameters). */                \
    int k3c_posemb_bwd_##S(const k3c_posemb_sizes *s, const k3c_grid_thw *g, int n, const real *dx, real *dtable,            \
                           k3c_err *err);                                                                                    \
                                                                                                                             \
    /* Non-causal softmax attention inside each item (cu: n + 1 token offsets); o[L, H, dh], lse[L, H] (natural log \
       of each row's denominator, scores scaled). Rows reduced in double in a fixed order. */        \
    int k3c_vit_attention_fwd_##S(const k3c_vit_attn_sizes *s, const int32_t *cu, int n, const real *q, const real *k,       \
                                  const real *v, real *o, real *lse, k3c_err *err);                                          \
    /* Recomputes P from lse; dq, dk, dv (each may be NULL) are ADDED to (queries, then keys, in parallel). */               \
    int k3c_vit_attention_bwd_##S(const k3c_vit_attn_sizes *s, const int32_t *cu, int n, const real *q, const real *k,       \
                                  const real *v, const real *o, const real *lse, const real *dout, real *dq, real *dk,       \
                                  real *dv, k3c_err *err);                                                                   \
                                                                                                                             \
    /* sd2_tpool: y[N, kh·kw·D], token (i, j) of item m = the kh × kw block at rows kh·i.., cols kw·j.., kernel row   \
       major, averaged over the item's t frames (N = Σ (h/kh)(w/kw)); h, w must be multiples of the kernel. */ \
    int k3c_tpool_merge_fwd_##S(const k3c_grid_thw *g, int n, int64_t D, int64_t kh, int64_t kw, const real *x,              \
                                real *y, k3c_err *err);                                                                      \
    int k3c_tpool_merge_bwd_##S(const k3c_grid_thw *g, int n, int64_t D, int64_t kh, int64_t kw, const real *dy,             \
                                real *dx, k3c_err *err);

K3C_DECLARE_REAL(K3C_VISION_OPS_API)

#endif
