/* decode.h — the inference engine's own ops (k3c_dec_ops): weight-view products, embedding rows, the per-sequence
 * short conv and KDA against a decode state, the absorbed-MLA latent cache and attention, routed experts, the GLU, the
 * capture of a repeated step; a CPU table (ops/decode_cpu.c) and a CUDA twin (cuda/decode.cu) with one signature.
 * Spec: docs/MODEL.md §3.1 (KDA), §4.2 (absorbed MLA), §6.2 + §9.2 (MoE); docs/ENGINE.md "The step". */
#ifndef K3C_OPS_DECODE_H
#define K3C_OPS_DECODE_H

#include "ops/glu.h"
#include "ops/qmat.h"

/* One sequence's run of rows row0 .. row0+len−1 inside a step, and its decode state in backend memory: kda = its
 * n_kda × kda_floats block (per KDA layer: S [H, dk, dk], then the q, k, v conv tails [3][P, W−1]); mla = its latent
 * cache, n_mla × cap × lat_w (layer j's token t at mla + (j·cap + t)·lat_w); pos = tokens before this step. */
typedef struct {
    float *kda, *mla;
    int64_t pos, cap, row0, len;
} k3c_dec_seg;

/* A step's segments: segs in host memory, dsegs the same table in backend memory (CPU: the same pointer) and row_seg
 * [n] (backend memory) the segment of every row; max_len the longest segment. */
typedef struct {
    const k3c_dec_seg *segs, *dsegs;
    const int32_t *row_seg;
    int nseg;
    int64_t n, max_len;
} k3c_dec_batch;

typedef struct {
    int64_t H, dk, W, kda_floats; /* KDA heads, head dim, conv kernel; P = H·dk */
    int64_t Hm, rkv, rope;        /* MLA heads, latent rank, shared key width; lat_w = rkv + rope */
} k3c_dec_dims;

/* Routed experts of one MoE layer: per-expert views (w1 gate [inter, lat], w3 up [inter, lat], w2 down [lat, inter]). */
typedef struct {
    const k3c_qmat *w1, *w3, *w2;
    int64_t E, k, lat, inter;
    k3c_glu_act act;
} k3c_dec_moe;

typedef struct k3c_dec_ops {
    const char *name;
    /* Y [n, W.rows] (+)= X [n, W.cols] · Wᵀ, W's storage in backend memory (k3c_qmat_mul); ctx: the backend's */
    int (*qmat_mul)(void *ctx, const k3c_qmat *W, const float *X, int64_t n, float *Y, int accumulate, k3c_err *err);
    /* The jobs' products (k3c_qmat_mul_many: each equal to its k3c_qmat_mul alone), in as few launches as the backend
     * can: the step's products of one input (q, k, v, gates; router and shared expert) share one pass */
    int (*qmat_mul_many)(void *ctx, const k3c_qmat_job *jobs, int njobs, k3c_err *err);
    /* Per head h < heads: Y_h [n, W[h].rows] = X_h [n, W[h].cols] · W[h]ᵀ, row j of X_h read at X + h·hx + j·ldx and
     * row j of Y_h written at Y + h·hy + j·ldy (the absorbed MLA's per-head up-projections, in place in the step's
     * buffers). Every W[h] has W[0]'s type and shape. ws: heads_workspace(W, n) bytes */
    size_t (*heads_workspace)(const k3c_qmat *W, int64_t n);
    int (*qmat_mul_heads)(void *ctx, const k3c_qmat *W, int64_t heads, const float *X, int64_t ldx, int64_t hx,
                          int64_t n, float *Y, int64_t ldy, int64_t hy, void *ws, k3c_err *err);
    /* y [n, cols] = rows ids[0..n) of E (ids in backend memory, checked by the caller) */
    int (*embed)(const k3c_qmat *E, const int32_t *ids, int64_t n, float *y, k3c_err *err);
    /* KDA's q, k, v short convs: for i < 3 the causal depthwise conv of x[i] [n, P] with w[i] [P, W] per segment,
     * continuing from the tails at seg.kda + off + i·P·(W−1) ([P, W−1], updated to the segment's last W−1 inputs),
     * into y[i] [n, P] (ops/short_conv.h); then q and k (y[0], y[1]) L2-normalised per dk-wide head (k3c_l2norm_fwd,
     * eps 1e-6) */
    int (*qkv_conv)(const k3c_dec_batch *b, const k3c_dec_dims *d, int64_t off, const float *const x[3],
                    const float *const w[3], float *const y[3], k3c_err *err);
    /* The delta-rule core per segment from and into S at seg.kda + off: o [n, P] from q, k (normalised), v, g [n, P]
     * and beta [n, H]; gate_bound as k3c_kda_dims.bound. ws: kda_workspace(d, n) bytes of backend memory */
    size_t (*kda_workspace)(const k3c_dec_dims *d, int64_t n);
    int (*kda)(const k3c_dec_batch *b, const k3c_dec_dims *d, int64_t off, const float *q, const float *k,
               const float *v, const float *g, const float *beta, double gate_bound, float *o, void *ws, k3c_err *err);
    /* Appends [cn (normalised c_KV) [n, rkv] ; kva's last rope columns ([n, rkv + rope])] of every row to layer j's
     * cache of its segment at position pos + (row − row0) */
    int (*cache_put)(const k3c_dec_batch *b, const k3c_dec_dims *d, int j, const float *cn, const float *kva,
                     k3c_err *err);
    /* Per row and head: the latent query qlat [Hm, n, lat_w] attends over its segment's layer-j cache up to its own
     * position (softmax of scale · q·cache_t), olat [Hm, n, rkv] = Σ p_t c_KV,t. ws: attend_workspace bytes */
    size_t (*attend_workspace)(const k3c_dec_dims *d);
    int (*attend)(const k3c_dec_batch *b, const k3c_dec_dims *d, int j, const float *qlat, float scale, float *olat,
                  void *ws, k3c_err *err);
    /* out [n, lat] = Σ_j topw[t, j] · w2[e] (act(w1[e] x_t) ⊙ w3[e] x_t), e = ids[t, j], in slot order;
     * ws: moe_workspace bytes */
    size_t (*moe_workspace)(const k3c_dec_moe *m, int64_t n);
    int (*moe)(const k3c_dec_moe *m, const float *x, int64_t n, const int32_t *ids, const float *topw, float *out,
               void *ws, k3c_err *err);
    int (*glu)(const k3c_glu_sizes *s, const float *gate, const float *up, float *h, k3c_err *err);
    /* Runs fn(arg) (the enqueueing of a whole step). CUDA: with key > 0, captured once into a graph per key and
     * replayed after (everything fn reads per step must sit at fixed addresses); key 0 or a failed capture run it
     * directly. g: a holder made by graph_open (CPU: NULL). */
    void *(*graph_open)(void);
    void (*graph_close)(void *g);
    int (*run)(void *g, int64_t key, int (*fn)(void *arg, k3c_err *err), void *arg, k3c_err *err);
} k3c_dec_ops;

extern const k3c_dec_ops k3c_dec_cpu; /* the CPU table (ops/decode_cpu.c) */

#endif
