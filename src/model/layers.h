/* layers.h — internal to src/model: the activations each sublayer saves for its backward, and the per-layer forward /
 * backward of the KDA mixer, the gated MLA mixer and the FFN (dense or latent MoE). Include after base/real.h: these
 * structs are built on the `real` of the including file (every file here is compiled once per precision).
 * Spec: docs/MODEL.md §3.1 (KDA layer), §4.2 (gated NoPE MLA), §6.2 + §9.2 (MoE), §8 (SiTU). */
#ifndef K3C_MODEL_LAYERS_H
#define K3C_MODEL_LAYERS_H

#include "base/carve.h"
#include "base/check.h"
#include "model/model.h"
#include "model/weights.h"
#include "ops/backend.h"

/* A step's buffers are planned twice by the same code: once with measuring carvers (base/carve.h), then carved for
 * real. Tensors come from the free tail of the step's arena (backend memory, which the host may not address), the
 * host's own bookkeeping (pointer tables, per-layer structs) from the model's host block; both are 64-aligned like
 * k3c_arena_alloc, so the pieces land where successive arena allocations would. */
typedef struct {
    k3c_carver dev, host;
} k3c_acts_carver;

#define K3C_CARVE_DEV(c, type, count) K3C_CARVE(&(c)->dev, type, count)
#define K3C_CARVE_HOST(c, type, count) K3C_CARVE(&(c)->host, type, count)

static inline k3c_carver k3c_carver_arena(const k3c_arena *a) {
    size_t start = (a->used + 63) & ~(size_t)63;
    if (start > a->cap) start = a->cap;
    return k3c_carver_at(a->base + start, a->cap - start, 64);
}
/* Marks what c carved from a as used (after the carving, before any other allocation from a). */
static inline void k3c_arena_take(k3c_arena *a, const k3c_carver *c) {
    if (c->oom) return;
    a->used = (size_t)(c->base - a->base) + c->off;
    if (a->used > a->peak) a->peak = a->used;
}
static inline k3c_acts_carver k3c_acts_carver_measure(void) {
    k3c_acts_carver c = {k3c_carver_measure(64), k3c_carver_measure(64)};
    return c;
}
static inline k3c_acts_carver k3c_acts_carver_at(const k3c_arena *dev, const k3c_arena *host) {
    k3c_acts_carver c = {k3c_carver_arena(dev), k3c_carver_arena(host)};
    return c;
}
static inline int k3c_acts_measuring(const k3c_acts_carver *c) { return c->dev.base == NULL; }
/* Takes both carvings; K3C_ENOMEM-worthy (returns 1) when either did not fit. */
static inline int k3c_acts_carver_take(k3c_acts_carver *c, k3c_arena *dev, k3c_arena *host) {
    k3c_arena_take(dev, &c->dev);
    k3c_arena_take(host, &c->host);
    return c->dev.oom || c->host.oom;
}

/* A step of the inference engine (docs/ENGINE.md "The step"): its rows are segments of sequences, each read against
 * and advancing its decode state (KDA state and conv tails, MLA latent cache), and nothing is kept for a backward.
 * Float32 only. */
typedef struct {
    const k3c_dec_ops *ops;      /* the engine's ops of the step's backend (ops/decode.h) */
    const k3c_dec_batch *batch;  /* the segments, in host and backend memory */
    const k3c_dec_dims *dims;    /* the state's layout */
    const int *idx;              /* layer l's index among the layers of its mixer kind: its state / cache slot */
    void *kda_ws, *att_ws, *heads_ws, *moe_ws; /* the ops' workspaces */
    float *mlp_gate, *mlp_up, *mlp_h;          /* [rows, widest of the dense and shared intermediates] */
    float *qlat, *olat; /* absorbed MLA: queries [Hm, rows, rkv + rope] and outputs [Hm, rows, rkv] in latent space */
} k3c_decode;

/* What a step's layers share: the model, the batch layout, a scratch region for op workspaces, the error. */
typedef struct {
    k3c_model *m;
    const k3c_backend *be; /* runs every op of the step (m->backend or the CPU reference) */
    int64_t T;             /* rows (tokens of the batch; in a decode step every segment's) */
    int n_docs;
    const int32_t *cu;
    void *scratch; /* op workspaces (largest need of any op in the step) */
    size_t scratch_bytes;
    const real *w;             /* parameters (training: the backward reads them, and writes g) */
    real *g;                   /* gradients */
    double dloss;              /* the backward's scale of the loss (k3c_model_backward's `scale`) */
    const k3c_weights *views;  /* what the forward reads every weight through: views of w, or weights as stored */
    const k3c_decode *dec;     /* NULL: a training forward over whole documents; else a decode step */
    int64_t row0;              /* the first of these T rows in the batch (a slice's start; else 0): where the route
                                  statistics go */
    int no_stats;              /* 1: a sliced layer's recompute; the first forward recorded the step statistics */
} k3c_step;

typedef struct {
    real *qh, *kh, *vh; /* projections before the short conv [T, P] */
    real *qn, *kn, *vc; /* conv + SiLU (q, k then L2-normalised) [T, P] */
    real *rq, *rk;      /* L2 rstd [T·H] */
    real *blog, *beta;  /* β logits and β [T, H] */
    real *fa, *z, *g;   /* gate: f_a output [T, dk], f_b output z [T, P], log-decay g [T, P] */
    real *o;            /* KDA core output [T, P] */
    real *ga, *gl;      /* output gate: low-rank inner [T, dk], logits [T, P] */
    real *y1, *ro;      /* gated RMSNorm output [T, P] and its rstd [T·H] */
} k3c_kda_acts;

typedef struct {
    real *qa, *qan, *rqa;    /* q LoRA: q_a output [T, r], normalised, rstd [T] */
    real *q;                 /* queries [T, H, dqk] */
    real *kva, *c, *cn, *rc; /* kv_a output [T, r_kv + rope], latent copy / normalised [T, r_kv], rstd [T] */
    real *cnk;               /* normalised latent of the key side [Tk, r_kv] (cn, or gathered: context parallelism) */
    real *kv;                /* kv_b output [T, H, nope + dv] */
    real *k, *v;             /* per-head keys [T, H, dqk] (shared k_pe slot concatenated), values [T, H, dv] */
    real *o, *lse;           /* attention output [T, H, dv], log-sum-exp [T, H] */
    real *gl, *og;           /* output gate logits [T, H·dv], gated output [T, H·dv] */
} k3c_mla_acts;

typedef struct {
    void *mlp_saved;     /* dense MLP / shared experts saved pre-activations */
    real *logits;        /* router logits [T, n] */
    int32_t *ids;        /* top-k [T, k] */
    real *topw, *cutoff; /* weights [T, k], QB cutoffs [T] */
    real *zin;           /* latent input z = W↓ x [T, ℓ] (K3) */
    void *moe_saved;
    real *u, *un, *ru; /* routed output [T, ℓ], normalised, rstd [T] */
    real *ys;          /* shared experts output [T, D] */
} k3c_ffn_acts;

#define K3C_LAYERS_API(real, S)                                                                                        \
    size_t k3c_kda_scratch_##S(const k3c_model *m, int64_t T, int n_docs);                                             \
    void k3c_kda_alloc_##S(const k3c_model *m, int64_t T, k3c_acts_carver *c, k3c_kda_acts *a);                        \
    int k3c_kda_layer_fwd_##S(k3c_step *st, int l, const real *xn, k3c_kda_acts *a, real *y, k3c_err *err);            \
    int k3c_kda_layer_bwd_##S(k3c_step *st, int l, const real *xn, k3c_kda_acts *a, const real *dy, real *dxn,         \
                              k3c_arena *tmp, k3c_err *err);                                                           \
    size_t k3c_kda_bwd_bytes_##S(const k3c_model *m, int64_t T);                                                       \
    size_t k3c_mla_scratch_##S(const k3c_model *m, int64_t Tk, int n_docs);                                            \
    void k3c_mla_alloc_##S(const k3c_model *m, int64_t T, int64_t Tk, k3c_acts_carver *c, k3c_mla_acts *a);            \
    int k3c_mla_layer_fwd_##S(k3c_step *st, int l, const real *xn, k3c_mla_acts *a, real *y, k3c_err *err);            \
    /* the latent rows alone, into the context exchange's (a sliced layer's slices before the last, model/slice.c) */ \
    int k3c_mla_layer_latent_##S(k3c_step *st, int l, const real *xn, k3c_mla_acts *a, k3c_err *err);                  \
    int k3c_mla_layer_bwd_##S(k3c_step *st, int l, const real *xn, k3c_mla_acts *a, const real *dy, real *dxn,         \
                              k3c_arena *tmp, k3c_err *err);                                                           \
    size_t k3c_mla_bwd_bytes_##S(const k3c_model *m, int64_t T, int64_t Tk);                                           \
    size_t k3c_ffn_scratch_##S(const k3c_model *m, int l, int64_t T);                                                  \
    void k3c_ffn_alloc_##S(const k3c_model *m, int l, int64_t T, k3c_acts_carver *c, k3c_ffn_acts *a);                 \
    int k3c_ffn_layer_fwd_##S(k3c_step *st, int l, const real *xn, k3c_ffn_acts *a, real *y, k3c_err *err);            \
    int k3c_ffn_layer_bwd_##S(k3c_step *st, int l, const real *xn, k3c_ffn_acts *a, const real *dy, real *dxn,         \
                              k3c_arena *tmp, k3c_err *err);                                                           \
    size_t k3c_ffn_bwd_bytes_##S(const k3c_model *m, int l, int64_t T);
K3C_DECLARE_REAL(K3C_LAYERS_API)

/* y[T, out] = x[T, in] Wᵀ (+ y when acc); the backward adds dx += dy W, dW += dyᵀ x. */
static inline int k3c_lin(const k3c_step *st, int64_t T, int64_t in, int64_t out, const real *x, const real *W, real *y,
                          int acc, k3c_err *err) {
    k3c_linear_sizes s = {T, in, out, acc};
    return st->be->linear_fwd(st->be->ctx, &s, x, W, y, err);
}
static inline int k3c_lin_bwd(const k3c_step *st, int64_t T, int64_t in, int64_t out, const real *x, const real *W,
                              const real *dy, real *dx, real *dW, k3c_err *err) {
    k3c_linear_sizes s = {T, in, out, 0};
    return st->be->linear_bwd(st->be->ctx, &s, x, W, dy, dx, dW, err);
}

/* One product of a layer's input: Y [rows, out] = X [rows, in] · Wᵀ (in, out: this rank's share under tensor
 * parallelism; a view's shape is the whole tensor's). */
typedef struct {
    const k3c_qmat *W;
    const real *X;
    real *Y;
    int64_t in, out;
} k3c_proj_job;

/* The products of one layer input, through the weights' views: in a training forward each a GEMM of the backend's
 * linear op over real-typed views of the parameters; in a decode step one pass over all of them (the engine's
 * qmat_mul_many over the weights as stored: each weight row read once for every row of the step). */
static inline int k3c_proj(const k3c_step *st, int64_t T, const k3c_proj_job *jobs, int n, k3c_err *err) {
#if !K3C_REAL_DOUBLE
    if (st->dec) {
        k3c_qmat_job q[8];
        if (n == 1) return st->dec->ops->qmat_mul(st->be->ctx, jobs[0].W, jobs[0].X, T, jobs[0].Y, 0, err);
        if (n > 8) return k3c_errf(err, K3C_EINVAL, "decode step: %d products of one input (at most 8)", n);
        for (int i = 0; i < n; i++) q[i] = (k3c_qmat_job){jobs[i].W, jobs[i].X, T, jobs[i].Y, 0};
        return st->dec->ops->qmat_mul_many(st->be->ctx, q, n, err);
    }
#endif
    for (int i = 0; i < n; i++) {
        k3c_linear_sizes s = {T, jobs[i].in, jobs[i].out, 0};
        CHECK_RC(st->be->linear_fwd(st->be->ctx, &s, jobs[i].X, (const real *)jobs[i].W->w, jobs[i].Y, err));
    }
    return K3C_OK;
}
/* One product: k3c_proj of a single job. */
static inline int k3c_proj1(const k3c_step *st, int64_t T, const k3c_qmat *W, int64_t in, int64_t out, const real *x,
                            real *y, k3c_err *err) {
    const k3c_proj_job j = {W, x, y, in, out};
    return k3c_proj(st, T, &j, 1, err);
}

/* ---------------------------------------------------------------- tensor parallelism (model.h k3c_tensor_parallel)
 * Alone: size 1, rank 0, and every helper is the plain op. */
static inline int64_t k3c_tp_size(const k3c_model *m) { return m->tp ? m->tp->size : 1; }
static inline int64_t k3c_tp_rank(const k3c_model *m) { return m->tp ? m->tp->rank : 0; }
/* x ← Σ over the TP group of this rank's partial x (after the ops that wrote it have finished). */
static inline int k3c_tp_sum(const k3c_step *st, real *x, int64_t n, k3c_err *err) {
    const k3c_tensor_parallel *tp = st->m->tp;
    if (!tp) return K3C_OK;
    CHECK_RC(st->be->sync(err));
    return tp->sum(tp->ctx, REAL_DTYPE, x, n, err);
}
/* n zeroed reals from the step's temporary arena (NULL when it is full or zeroing failed). */
static inline real *k3c_tmp_zeros(const k3c_step *st, k3c_arena *tmp, int64_t n, k3c_err *err) {
    real *p = (real *)k3c_arena_alloc(tmp, sizeof(real) * (size_t)n);
    return p && st->be->zero(p, n, err) == K3C_OK ? p : NULL;
}

/* The row-parallel projection y[T, out] = x[T, in/size] Wᵀ, W [out, in/size] this rank's columns (a share table holds
 * just them; alone: the whole W); the caller sums y over the group. */
static inline int k3c_lin_rowpar(const k3c_step *st, int64_t T, int64_t in, int64_t out, const real *x, const real *W,
                                 real *y, k3c_err *err) {
    return k3c_lin(st, T, in / k3c_tp_size(st->m), out, x, W, y, 0, err);
}
/* Its backward: dx += dy W, dW += dyᵀ x (this rank's columns). */
static inline int k3c_lin_rowpar_bwd(const k3c_step *st, int64_t T, int64_t in, int64_t out, const real *x,
                                     const real *W, const real *dy, real *dx, real *dW, k3c_err *err) {
    return k3c_lin_bwd(st, T, in / k3c_tp_size(st->m), out, x, W, dy, dx, dW, err);
}

/* Pointer to parameter (or gradient) block `off` of base; NULL when the model has no such tensor. */
#define K3C_PW(base, off) ((off) == K3C_NOPARAM || !(base) ? NULL : (base) + (off))

#endif
