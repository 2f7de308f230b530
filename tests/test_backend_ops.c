/* test_backend_ops.c — one table-driven harness for every op entry of the backend table (ops/backend.h), forward and
 * backward: the CPU float table against the CPU double one, and (built with -DK3C_CUDA, a GPU present) the CUDA table
 * against the CPU float one. docs/CODE.md "Ops" (one signature, every backend, stated tolerances).
 *
 * A case is a row of the table below: op, shape, variant flags, tolerances. Inputs are fresh seeded random numbers
 * (the seed is printed; argv[1] or K3C_SEED sets it, 20261203 by default so make test is reproducible), rounded to float so every backend reads the same values.
 * Outputs are NaN-poisoned before a forward; gradients, which the ops add into, are pre-filled with random values and
 * compared as increments (‖x − ref‖ / ‖ref − init‖). A backward reads the REFERENCE's forward outputs (rstd, lse, o,
 * ids, ...), so a forward difference cannot hide in it; only opaque saved buffers (MoE, MLP) come from the backend's
 * own forward.
 *
 * Tolerances (relative L2 error). CUDA against the CPU float table (1e-5 pointwise,
 * norms, conv, gates, cross-entropy, AttnRes, S_max; 1e-4 GEMM-based ops and the router; 1e-2 the bf16 tensor-core
 * KDA and attention, 2e-3 their fp16 variants, 1e-5 the fp32 checking kernels (the KDA recurrence against the CPU's
 * chunks: two fp32 algorithms, ≤ 1.6e-6 seen; 1e-4 with saturated gates, whose dg cancels: 2.1e-5 seen); 0 gathers,
 * moves and router ids). CPU float against CPU double: float
 * rounding (unit 6e-8) grown by each op's reduction length — TOL_F32_POINT 1e-6 for moves and adds, TOL_F32_TRANS 1e-5
 * for the sigmoid ops (a transcendental and the 1 − s cancellation), 1e-5
 * for row reductions (norms, conv, softmax statistics, GEMMs), 1e-4 for the chained KDA / attention backward
 * (long recurrences through decays and the (I+L)⁻¹ solve), ids exact. */
#include "test.h"

#include <stdint.h>

#include "model/model.h"
#include "ops/backend.h"
#ifdef K3C_CUDA
#include "cuda/cuda_ops.h"
#endif

#define TOL_F32_POINT 1e-6
#define TOL_F32_TRANS 1e-5 /* sigmoid and the sigmoid gate: expf, and 1 − s cancels near s = 1 (3.2e-6 seen) */
#define TOL_F32_ROW 1e-5
#define TOL_F32_CHAIN 1e-4
#define TOL_F16 2e-3

enum {
    OP_ZERO,
    OP_ADD,
    OP_COPY2D,
    OP_SIGMOID,
    OP_EMBEDDING,
    OP_RMSNORM,
    OP_LINEAR,
    OP_SIGMOID_GATE,
    OP_XENT,
    OP_L2NORM,
    OP_SHORT_CONV,
    OP_KDA_GATE,
    OP_KDA,
    OP_ATTENTION,
    OP_MAX_LOGIT,
    OP_ROUTER,
    OP_MOE,
    OP_MLP,
    OP_ATTNRES,
    OP_MOE_PERM,
    OP_BF16,
    OP_AUX_LOSS,
    OP_GELU,
    OP_ROPE2D,
    OP_POSEMB,
    OP_VIT_ATTN,
    OP_TPOOL,
    OP_COUNT
};
static const char *const op_names[OP_COUNT] = {"zero",    "add",       "copy2d",    "sigmoid", "embedding",  "rmsnorm",
                                               "linear",  "sig_gate",  "xent",      "l2norm",  "short_conv", "kda_gate",
                                               "kda",     "attention", "max_logit", "router",  "moe",        "mlp",
                                               "attnres", "moe_perm",  "bf16",      "aux_loss", "gelu",    "rope2d",
                                               "posemb",  "vit_attn",  "tpool"};

/* variant flags (meaning per op, see the rows) */
enum {
    F_ACC = 1 << 0,       /* accumulate into the output */
    F_ALIAS = 1 << 1,     /* add: x = y; attnres: dv entries alias each other */
    F_INPLACE = 1 << 2,   /* y = op(y); short_conv: state_out = state_in */
    F_GATED = 1 << 3,     /* rmsnorm: the sigmoid-gated form */
    F_NODX = 1 << 4,      /* the first input gradient not requested (NULL) */
    F_NODW = 1 << 5,      /* the weight gradient not requested */
    F_NODG = 1 << 6,      /* the gate / gamma gradient not requested */
    F_STATE = 1 << 7,     /* short_conv: state_in and state_out */
    F_STATE_OUT = 1 << 8, /* short_conv: state_out only */
    F_H0 = 1 << 9,        /* kda: an initial state */
    F_SAT = 1 << 10,      /* kda: gates saturated at the lower bound */
    F_FP16 = 1 << 11,     /* CUDA: the fp16 kernel variants (k3c_cuda_backend_kernels) */
    F_MASK = 1 << 12,     /* xent: a loss mask */
    F_NONE = 1 << 13,     /* xent: nothing counted */
    F_BIAS = 1 << 14,     /* router: a selection bias */
    F_CUTOFF = 1 << 15,   /* router: the QB cutoff output */
    F_SITU = 1 << 16,     /* moe, mlp: the SiTU GLU */
    F_NODV = 1 << 17,     /* attnres: no dv */
    F_NOSAVED = 1 << 18,  /* attnres, moe: the backward recomputes what the forward saves (rstd, α; the plan) */
    F_NODT = 1 << 19,     /* kda_gate: no dt_bias */
    F_NOA = 1 << 20,      /* kda_gate: no A_log */
    F_NORSTD = 1 << 21,   /* rmsnorm: rstd not saved (forward only) */
    F_ZEROROW = 1 << 22,  /* l2norm: an all-zero row */
    F_WEIGHT = 1 << 23,   /* xent: per-position loss weights */
    F_FP32K = 1 << 24,    /* CUDA: the fp32 checking kernels (KDA recurrence, attention_naive) */
    F_GELU = 1 << 25,     /* moe, mlp: the GELU GLU (GeGLU) */
    F_DROP = 1 << 26,     /* moe: about 6% of the slots dropped (id −1), the last expert left empty */
    F_WIDE = 1 << 27,     /* moe, mlp with F_SITU: K3's caps (4, 25), gate and up values of sd 4 and 30 (saturated) */
    F_BWDERR = 1 << 28,   /* error rows: the forward succeeds, the backward returns want_rc */
    F_INF = 1 << 29,      /* max_logit: one logit +inf (K3C_ENUMERIC) */
    F_SHIFT = 1 << 30,    /* xent: row offsets −40 … +40; with a mask, a masked-out target ≥ V (not an error) */
    /* bits shared by ops that never meet: the vision ops' flags */
    F_ERF = 1 << 26,     /* gelu: the exact (erf) form, else the tanh form */
    F_TAIL = 1 << 27,    /* gelu: the negative tail −9..−4, where 1 + erf and 1 + tanh cancel in float */
    F_BICUBIC = 1 << 29, /* posemb: bicubic interpolation, else bilinear */
};

typedef struct {
    int op;
    int64_t a, b, c, d, e; /* shape, by op (see add_rows) */
    int flags;
    double x, y; /* eps, bounds, norms, scales, dloss, by op */
    int ncu;     /* cu_seqlens entries (0 = one document) */
    int32_t cu[8];
    int ng;            /* the vision ops: packed items, (t, h, w) each */
    int64_t grid[12];
    double tol_cpu, tol_cuda;
    double tol_cpu_bwd, tol_cuda_bwd; /* the backward's, where it differs from the forward's (0 = the same) */
    int want_rc;                      /* the forward's expected status (error rows) */
    int bad[2];                       /* error rows: the tokens given bad ids / targets (−1 = none) */
} bo_case;

enum { BO_T_REAL, BO_T_F32, BO_T_I32, BO_T_U8, BO_T_I64 };
#define BO_MAX_T 17
typedef struct {
    const char *name;
    int type;
    size_t n;
    int phase;  /* −1 input, 0 written by the forward, 1 by the backward */
    int acc;    /* the op adds into it: pre-filled with init */
    int absent; /* passed as NULL */
    int exact;  /* compared exactly against the CPU float table (gathers, moves, ids) */
    double *h, *init;
} bo_tensor;
typedef struct {
    int n;
    bo_tensor t[BO_MAX_T];
    double loss;
    int64_t count;
    int rc;
    char msg[1024];
} bo_io;

static size_t bytes_real(size_t n, size_t es) { return n ? n * es : 64; }

/* attnres dv entries: some NULL (−1), some aliasing another source's buffer (adjacent,
 * distant, and across the CUDA kernel's 128-source launch groups); that buffer then receives both contributions. */
static int64_t bo_attnres_dv_slot(const bo_case *c, int64_t i) {
    const int64_t N = c->c;
    if (N == 2 && i == 1) return -1;
    if (N >= 3 && i == 2) return 1;
    if (N >= 4 && i == 3) return -1;
    if (N >= 9 && i == 8) return 0;
    if (N > 130 && i == 130) return 1;
    return i;
}

/* The vision ops' items: patches L = Σ t·h·w, merged tokens N = Σ (h/2)(w/2) (the 2 × 2 merge kernel). */
static int64_t bo_grid_L(const bo_case *c) {
    int64_t L = 0;
    for (int i = 0; i < c->ng; i++) L += c->grid[3 * i] * c->grid[3 * i + 1] * c->grid[3 * i + 2];
    return L;
}
static int64_t bo_grid_N(const bo_case *c) {
    int64_t N = 0;
    for (int i = 0; i < c->ng; i++) N += c->grid[3 * i + 1] / 2 * (c->grid[3 * i + 2] / 2);
    return N;
}

#define BO_REAL float
#define BO_BE k3c_backend_f32
#define BO_FN(name) name##_f32
#include "backend_ops_exec.h"
#undef BO_REAL
#undef BO_BE
#undef BO_FN
#define BO_REAL double
#define BO_BE k3c_backend_f64
#define BO_FN(name) name##_f64
#include "backend_ops_exec.h"
#undef BO_REAL
#undef BO_BE
#undef BO_FN

/* ---------------------------------------------------------------- inputs */
static double frand(k3c_rng *r, double sd) { return (double)(float)(k3c_rng_normal(r) * sd); }
static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

static bo_tensor *add_t(bo_io *io, const char *name, int type, size_t n, int phase, int acc) {
    bo_tensor *t = &io->t[io->n++];
    memset(t, 0, sizeof *t);
    t->name = name, t->type = type, t->n = n, t->phase = phase, t->acc = acc;
    t->h = calloc(n ? n : 1, sizeof(double));
    if (acc) t->init = calloc(n ? n : 1, sizeof(double));
    return t;
}
static bo_tensor *in_t(bo_io *io, const char *name, size_t n, k3c_rng *r, double sd) {
    bo_tensor *t = add_t(io, name, BO_T_REAL, n, -1, 0);
    for (size_t i = 0; i < n; i++) t->h[i] = frand(r, sd);
    return t;
}
static bo_tensor *out_t(bo_io *io, const char *name, size_t n, int phase) {
    return add_t(io, name, BO_T_REAL, n, phase, 0);
}
static bo_tensor *acc_t(bo_io *io, const char *name, size_t n, int phase, k3c_rng *r, int absent) {
    bo_tensor *t = add_t(io, name, BO_T_REAL, n, phase, 1);
    for (size_t i = 0; i < n; i++) t->init[i] = frand(r, 1.0);
    t->absent = absent;
    return t;
}
static bo_tensor *cu_t(bo_io *io, const bo_case *c) {
    bo_tensor *t = add_t(io, "cu", BO_T_I32, (size_t)c->ncu, -1, 0);
    for (int i = 0; i < c->ncu; i++) t->h[i] = c->cu[i];
    t->absent = c->ncu == 0;
    return t;
}
static void l2rows(double *x, size_t n, size_t d) {
    for (size_t r = 0; r < n / d; r++) {
        double s = 0;
        for (size_t i = 0; i < d; i++) s += x[r * d + i] * x[r * d + i];
        for (size_t i = 0; i < d; i++) x[r * d + i] = (double)(float)(x[r * d + i] / sqrt(s + 1e-6));
    }
}

/* A dispatch plan for moe_perm (T = c->a tokens, k = c->b slots, E = c->d experts, a fraction c->x of dead slots):
 * k distinct experts per token, pos and perm as k3c_moe_plan makes them (perm's tail past the live rows −1).
 * Returns the live rows. */
static size_t perm_plan(const bo_case *c, k3c_rng *r, double *pos, double *perm) {
    const int64_t T = c->a, k = c->b, E = c->d, S = T * k;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(S ? S : 1) * 3), *pe = ids + S, *po = pe + S;
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(E + 1));
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int32_t id, dup;
            do {
                id = (int32_t)floor(k3c_rng_uniform(r) * (double)E), dup = 0;
                for (int64_t i = 0; i < j; i++) dup |= ids[t * k + i] == id;
            } while (dup);
            ids[t * k + j] = id;
        }
    for (int64_t i = 0; i < S; i++)
        if (k3c_rng_uniform(r) < c->x) ids[i] = -1;
    k3c_err err = {0};
    size_t live = 0;
    if (k3c_moe_plan(T, k, E, ids, off, pe, po, &err) == K3C_OK) live = (size_t)off[E];
    for (int64_t i = 0; i < S; i++) pos[i] = po[i], perm[i] = (size_t)i < live ? pe[i] : -1;
    free(ids);
    free(off);
    return live;
}

/* The tensors of case c (inputs drawn from r), in the order backend_ops_exec.h indexes them. */
static void setup(const bo_case *c, bo_io *io, k3c_rng *r) {
    memset(io, 0, sizeof *io);
    const int f = c->flags;
    const size_t A = c->a > 0 ? (size_t)c->a : 0, B = (size_t)c->b, C = (size_t)c->c, D = (size_t)c->d,
                 E = (size_t)c->e;
    switch (c->op) {
    case OP_ZERO: out_t(io, "x", A, 0)->exact = 1; break;
    case OP_ADD:
        in_t(io, "x", A, r, 1.0);
        acc_t(io, "y", A, 0, r, 0)->exact = 1;
        break;
    case OP_COPY2D: {
        size_t ns = A * (C > B ? C : B), nd = A * (D > B ? D : B);
        in_t(io, "src", ns ? ns : 1, r, 1.0);
        acc_t(io, "dst", nd ? nd : 1, 0, r, 0)->exact = 1; /* gaps between rows keep their values */
        break;
    }
    case OP_SIGMOID:
        in_t(io, "x", A, r, 3.0);
        out_t(io, "y", A, 0);
        in_t(io, "dy", A, r, 1.0);
        acc_t(io, "dx", A, 1, r, 0);
        break;
    case OP_EMBEDDING: {
        bo_tensor *ids = add_t(io, "ids", BO_T_I32, A, -1, 0);
        for (size_t t = 0; t < A; t++) /* a fraction x of hot ids from the first 20 rows (many repeats) */
            ids->h[t] = floor(k3c_rng_uniform(r) * (k3c_rng_uniform(r) < c->x ? (B < 20 ? B : 20) : B));
        if (A > 1) ids->h[0] = (double)(B - 1), ids->h[A - 1] = 0;
        if (c->bad[0] >= 0) ids->h[c->bad[0]] = -7;
        if (c->bad[1] >= 0) ids->h[c->bad[1]] = (double)B + (c->bad[0] >= 0 ? 5 : 0);
        in_t(io, "E", B * C, r, 1.0);
        out_t(io, "y", A * C, 0)->exact = 1;
        in_t(io, "dy", A * C, r, 1.0);
        acc_t(io, "dE", B * C, 1, r, 0);
        break;
    }
    case OP_RMSNORM: {
        int g = (f & F_GATED) != 0;
        in_t(io, "x", A * B, r, 1.5);
        bo_tensor *w = in_t(io, "w", B, r, 0.3);
        for (size_t i = 0; i < B; i++) w->h[i] = (double)(float)(w->h[i] + 1.0);
        in_t(io, "gate", A * B, r, 2.0)->absent = !g;
        out_t(io, "y", A * B, 0);
        out_t(io, "rstd", A, 0)->absent = (f & F_NORSTD) != 0;
        in_t(io, "dy", A * B, r, 1.0);
        acc_t(io, "dx", A * B, 1, r, (f & F_NODX) != 0);
        acc_t(io, "dw", B, 1, r, (f & F_NODW) != 0);
        acc_t(io, "dgate", A * B, 1, r, !g || (f & F_NODG));
        break;
    }
    case OP_LINEAR:
        in_t(io, "x", A * B, r, 1.0);
        in_t(io, "W", C * B, r, 1.0 / sqrt((double)B));
        if (f & F_ACC)
            acc_t(io, "y", A * C, 0, r, 0);
        else
            out_t(io, "y", A * C, 0);
        in_t(io, "dy", A * C, r, 1.0);
        acc_t(io, "dx", A * B, 1, r, (f & F_NODX) != 0);
        acc_t(io, "dW", C * B, 1, r, (f & F_NODW) != 0);
        break;
    case OP_SIGMOID_GATE:
        in_t(io, "x", A, r, 1.0);
        in_t(io, "z", A, r, 3.0);
        out_t(io, "y", A, 0);
        in_t(io, "dy", A, r, 1.0);
        acc_t(io, "dx", A, 1, r, (f & F_NODX) != 0);
        acc_t(io, "dz", A, 1, r, (f & F_NODG) != 0);
        break;
    case OP_XENT: {
        bo_tensor *lg = in_t(io, "logits", A * B, r, f & F_SHIFT ? 3.0 : 2.0);
        for (size_t t = 0; (f & F_SHIFT) && t < A; t++) /* rows far from zero: the max subtraction matters */
            for (size_t j = 0; j < B; j++) lg->h[t * B + j] = (double)(float)(lg->h[t * B + j] + 20.0 * (t % 5) - 40);
        bo_tensor *tg = add_t(io, "targets", BO_T_I32, A, -1, 0), *m = add_t(io, "mask", BO_T_U8, A, -1, 0);
        for (size_t t = 0; t < A; t++) {
            tg->h[t] = (f & F_NONE) || k3c_rng_uniform(r) < 0.1 ? -1 : floor(k3c_rng_uniform(r) * B);
            m->h[t] = k3c_rng_uniform(r) < 0.7;
        }
        if ((f & F_SHIFT) && (f & F_MASK) && A > 6) tg->h[6] = (double)B + 3, m->h[6] = 0;
        if (c->bad[0] >= 0) tg->h[c->bad[0]] = (double)B, m->h[c->bad[0]] = 1;
        m->absent = !(f & F_MASK);
        out_t(io, "lse", A, 0);
        acc_t(io, "dlogits", A * B, 1, r, 0);
        bo_tensor *w = add_t(io, "weight", BO_T_F32, A, -1, 0); /* signed, as the RL update's −∂L/∂logp */
        for (size_t t = 0; t < A; t++) w->h[t] = (float)(4 * k3c_rng_uniform(r) - 2);
        w->absent = !(f & F_WEIGHT);
        break;
    }
    case OP_L2NORM: {
        bo_tensor *x = in_t(io, "x", A * B, r, 0.7);
        if ((f & F_ZEROROW) && A > 1)
            for (size_t i = 0; i < B; i++) x->h[B + i] = 0; /* rstd = 1/sqrt(eps) */
        out_t(io, "y", A * B, 0);
        out_t(io, "rstd", A, 0)->absent = (f & F_NORSTD) != 0;
        in_t(io, "dy", A * B, r, 1.0);
        acc_t(io, "dx", A * B, 1, r, (f & F_NODX) != 0);
        break;
    }
    case OP_SHORT_CONV: {
        size_t nd = c->ncu ? (size_t)c->ncu - 1 : 1, S = nd * B * (C - 1);
        int sin = (f & F_STATE) != 0, sout = (f & (F_STATE | F_STATE_OUT)) != 0;
        cu_t(io, c);
        in_t(io, "x", A * B, r, 1.0);
        in_t(io, "w", B * C, r, 0.6);
        in_t(io, "state_in", S, r, 1.0)->absent = !sin;
        out_t(io, "y", A * B, 0);
        bo_tensor *so = out_t(io, "state_out", S, 0);
        so->absent = !sout, so->exact = 1;
        in_t(io, "dy", A * B, r, 1.0);
        acc_t(io, "dx", A * B, 1, r, (f & F_NODX) != 0);
        acc_t(io, "dw", B * C, 1, r, (f & F_NODW) != 0);
        acc_t(io, "dstate_in", S, 1, r, !sin);
        break;
    }
    case OP_KDA_GATE:
        in_t(io, "z", A * B * C, r, 1.5);
        in_t(io, "dt_bias", B * C, r, 0.5)->absent = (f & F_NODT) != 0;
        in_t(io, "A_log", B, r, 0.5)->absent = (f & F_NOA) != 0;
        out_t(io, "g", A * B * C, 0);
        /* dg with mean 0.5: dA_log sums T·dk of its terms, which zero-mean values would cancel down to their rounding
         * noise */
        bo_tensor *dg = in_t(io, "dg", A * B * C, r, 1.0);
        for (size_t i = 0; i < A * B * C; i++) dg->h[i] = (double)(float)(dg->h[i] + 0.5);
        acc_t(io, "dz", A * B * C, 1, r, 0);
        acc_t(io, "ddt_bias", B * C, 1, r, (f & F_NODT) != 0);
        acc_t(io, "dA_log", B, 1, r, (f & F_NOA) != 0);
        break;
    case OP_KDA: {
        size_t nd = c->ncu ? (size_t)c->ncu - 1 : 1, tk = A * B * C, tv = A * B * D, ns = nd * B * C * D;
        cu_t(io, c);
        l2rows(in_t(io, "q", tk, r, 1.0)->h, tk, C);
        l2rows(in_t(io, "k", tk, r, 1.0)->h, tk, C);
        in_t(io, "v", tv, r, 1.0);
        bo_tensor *g = in_t(io, "g", tk, r, 1.0);
        for (size_t i = 0; i < tk; i++) {
            double z = k3c_rng_normal(r);
            g->h[i] = c->x < 0 ? c->x * sigm(f & F_SAT ? 6.0 + 0.5 * z : 1.5 * z)
                               : -exp(3.0 * k3c_rng_uniform(r)) * log1p(exp(z)); /* −a·softplus(u), a ∈ [1, 20] */
            g->h[i] = (double)(float)g->h[i];
        }
        bo_tensor *beta = in_t(io, "beta", A * B, r, 1.0);
        for (size_t i = 0; i < A * B; i++) beta->h[i] = (double)(float)sigm(beta->h[i]);
        in_t(io, "h0", ns, r, 0.5)->absent = !(f & F_H0);
        out_t(io, "o", tv, 0);
        out_t(io, "ht", ns, 0);
        in_t(io, "dout", tv, r, 1.0);
        in_t(io, "dht", ns, r, 0.3);
        acc_t(io, "dq", tk, 1, r, 0);
        acc_t(io, "dk", tk, 1, r, 0);
        acc_t(io, "dv", tv, 1, r, 0);
        acc_t(io, "dg", tk, 1, r, 0);
        acc_t(io, "dbeta", A * B, 1, r, 0);
        acc_t(io, "dh0", ns, 1, r, !(f & F_H0));
        break;
    }
    case OP_ATTENTION:
        cu_t(io, c);
        in_t(io, "q", A * B * C, r, 1.5);
        in_t(io, "k", A * B * C, r, 1.5);
        in_t(io, "v", A * B * D, r, 1.0);
        out_t(io, "o", A * B * D, 0);
        out_t(io, "lse", A * B, 0);
        in_t(io, "dout", A * B * D, r, 1.0);
        acc_t(io, "dq", A * B * C, 1, r, 0);
        acc_t(io, "dk", A * B * C, 1, r, 0);
        acc_t(io, "dv", A * B * D, 1, r, 0);
        break;
    case OP_MAX_LOGIT: {
        /* With one token S_max is one dot product, whose zero-mean terms may cancel to their rounding noise: there q
         * and k get a common offset of 1, so the float-vs-double comparison measures the op, not the cancellation. */
        cu_t(io, c);
        bo_tensor *q = in_t(io, "q", A * B * C, r, 1.0), *k = in_t(io, "k", A * B * C, r, 1.0);
        for (size_t i = 0; A == 1 && i < A * B * C; i++) q->h[i] += 1, k->h[i] += 1;
        if (f & F_INF) { /* the last token of a long document, last head: its logit with itself is +inf */
            size_t t = c->ncu > 3 ? (size_t)c->cu[3] - 1 : A - 1;
            q->h[(t * B + B - 1) * C] = INFINITY, k->h[(t * B + B - 1) * C] = 1;
        }
        add_t(io, "smax", BO_T_F32, B, 0, 0);
        break;
    }
    case OP_ROUTER: {
        bo_tensor *lg = in_t(io, "logits", A * B, r, 1.0), *bias = in_t(io, "bias", B, r, 0.3);
        bias->absent = !(f & F_BIAS);
        /* The selection compares biased scores: a near tie (closer than float rounding) would pick different experts
         * in float and double, which is not an error of either. Redraw a token's logits until its biased scores are
         * 1e-4 apart. */
        for (size_t t = 0; t < A; t++)
            for (int again = 1; again;) {
                again = 0;
                for (size_t i = 0; i < B && !again; i++)
                    for (size_t j = 0; j < i && !again; j++) {
                        double bi = bias->absent ? 0 : bias->h[i], bj = bias->absent ? 0 : bias->h[j];
                        double si = 1 / (1 + exp(-lg->h[t * B + i])) + bi, sj = 1 / (1 + exp(-lg->h[t * B + j])) + bj;
                        again = fabs(si - sj) < 1e-4;
                    }
                for (size_t i = 0; again && i < B; i++) lg->h[t * B + i] = frand(r, 1.0);
            }
        add_t(io, "ids", BO_T_I32, A * C, 0, 0)->exact = 1;
        out_t(io, "w", A * C, 0);
        out_t(io, "cutoff", A, 0)->absent = !(f & F_CUTOFF);
        in_t(io, "dtopk_w", A * C, r, 1.0);
        acc_t(io, "dlogits", A * B, 1, r, 0);
        break;
    }
    case OP_AUX_LOSS: { /* T, n, k, row0, rows; x = coef; some slots dropped (−1) */
        in_t(io, "logits", A * B, r, 1.5);
        bo_tensor *ids = add_t(io, "ids", BO_T_I32, A * C, -1, 0);
        for (size_t i = 0; i < A * C; i++) ids->h[i] = i % 7 == 3 ? -1 : floor(k3c_rng_uniform(r) * (double)B);
        acc_t(io, "dlogits", E * B, 0, r, 0);
        break;
    }
    case OP_MOE: {
        in_t(io, "x", A * B, r, 1.0);
        bo_tensor *ids = add_t(io, "ids", BO_T_I32, A * E, -1, 0);
        const size_t pick = f & F_DROP ? D - 1 : D; /* F_DROP: the last expert receives nothing */
        for (size_t t = 0; t < A; t++) /* k distinct experts per token */
            for (size_t j = 0; j < E; j++) {
                int32_t id, dup;
                do {
                    id = (int32_t)floor(k3c_rng_uniform(r) * pick), dup = 0;
                    for (size_t i = 0; i < j; i++) dup |= ids->h[t * E + i] == id;
                } while (dup);
                ids->h[t * E + j] = id;
            }
        for (size_t i = 0; (f & F_DROP) && i < A * E; i++)
            if (k3c_rng_uniform(r) < 0.06) ids->h[i] = -1;
        if (c->bad[0] >= 0) ids->h[c->bad[0]] = (double)D;
        bo_tensor *w = in_t(io, "topk_w", A * E, r, 1.0);
        for (size_t i = 0; i < A * E; i++) w->h[i] = (double)(float)sigm(w->h[i]);
        in_t(io, "w1", D * C * B, r, (f & F_WIDE ? 4.0 : 1.0) / sqrt((double)B));
        in_t(io, "w3", D * C * B, r, (f & F_WIDE ? 30.0 : 1.0) / sqrt((double)B));
        out_t(io, "y", A * B, 0);
        in_t(io, "w2", D * B * C, r, 1.0 / sqrt((double)C));
        in_t(io, "dy", A * B, r, 1.0);
        acc_t(io, "dx", A * B, 1, r, 0);
        acc_t(io, "dw1", D * C * B, 1, r, 0);
        acc_t(io, "dw3", D * C * B, 1, r, 0);
        acc_t(io, "dw2", D * B * C, 1, r, 0);
        acc_t(io, "dtopk_w", A * E, 1, r, 0);
        break;
    }
    case OP_MOE_PERM: { /* T, k, D, E; x = the fraction of dead slots (id −1) */
        bo_tensor *pos = add_t(io, "pos", BO_T_I32, A * B, -1, 0), *perm = add_t(io, "perm", BO_T_I32, A * B, -1, 0);
        size_t live = perm_plan(c, r, pos->h, perm->h);
        in_t(io, "x", A * C, r, 1.0);
        bo_tensor *w = in_t(io, "w", A * B, r, 1.0);
        for (size_t i = 0; i < A * B; i++) w->h[i] = (double)(float)sigm(w->h[i]);
        out_t(io, "xperm", live * C, 0)->exact = 1;
        out_t(io, "y", A * C, 0);
        in_t(io, "yperm", live * C, r, 1.0);
        in_t(io, "dy", A * C, r, 1.0);
        in_t(io, "dxperm", live * C, r, 1.0);
        acc_t(io, "dx", A * C, 1, r, 0)->exact = 1; /* added slot by slot in slot order on every backend */
        bo_tensor *dyp = out_t(io, "dyperm", live * C, 1);
        dyp->exact = 1, dyp->absent = (f & F_NODX) != 0;
        acc_t(io, "dw", A * B, 1, r, (f & F_NODW) != 0);
        break;
    }
    case OP_BF16: { /* the round trip real → bf16 → real, with ties to even, zeros, huge and tiny values */
        bo_tensor *x = in_t(io, "x", A, r, 3.0);
        static const double special[8] = {1.00390625, 1.01171875, -0.0, 0.0, 3.0e38, -1.0e-38, 65504.0, -2.5};
        for (size_t i = 0; i < A && i < 8; i++) x->h[i] = special[i];
        out_t(io, "y", A, 0)->exact = 1;
        break;
    }
    case OP_MLP:
        in_t(io, "x", A * B, r, 1.0);
        in_t(io, "w_gate", C * B, r, (f & F_WIDE ? 4.0 : 1.0) / sqrt((double)B));
        in_t(io, "w_up", C * B, r, (f & F_WIDE ? 30.0 : 1.0) / sqrt((double)B));
        in_t(io, "w_down", B * C, r, 1.0 / sqrt((double)C));
        out_t(io, "y", A * B, 0);
        in_t(io, "dy", A * B, r, 1.0);
        acc_t(io, "dx", A * B, 1, r, 0);
        acc_t(io, "dw_gate", C * B, 1, r, 0);
        acc_t(io, "dw_up", C * B, 1, r, 0);
        acc_t(io, "dw_down", B * C, 1, r, 0);
        break;
    case OP_GELU: { /* n; F_ERF, F_TAIL */
        bo_tensor *x = in_t(io, "x", A, r, 2.5);
        for (size_t i = 0; (f & F_TAIL) && i < A; i++) x->h[i] = -9.0 + 0.125 * (double)i;
        out_t(io, "y", A, 0);
        in_t(io, "dy", A, r, 1.0);
        bo_tensor *dx = acc_t(io, "dx", A, 1, r, 0); /* the tail's increments are tiny: added onto zeros */
        for (size_t i = 0; (f & F_TAIL) && i < A; i++) dx->init[i] = 0;
        break;
    }
    case OP_ROPE2D: { /* H, dh; the items' table cs [L, dh/2, 2] made as the tower makes it, rounded to float */
        const size_t L = (size_t)bo_grid_L(c);
        bo_tensor *cs = add_t(io, "cs", BO_T_REAL, L * B, -1, 0);
        k3c_err err = {0};
        if (k3c_rope2d_table_f64((const k3c_grid_thw *)c->grid, c->ng, c->b, 10000.0, cs->h, &err))
            CHECK(0, "rope table: %s", err.msg);
        for (size_t i = 0; i < L * B; i++) cs->h[i] = (double)(float)cs->h[i];
        in_t(io, "x", L * A * B, r, 1.0);
        out_t(io, "y", L * A * B, 0);
        in_t(io, "dy", L * A * B, r, 1.0);
        acc_t(io, "dx", L * A * B, 1, r, 0);
        break;
    }
    case OP_POSEMB: { /* D; a 6 × 5 table with 4 frames' time terms; F_BICUBIC */
        const size_t L = (size_t)bo_grid_L(c), nt = 6 * 5 * A;
        bo_tensor *g = add_t(io, "grid", BO_T_I64, (size_t)(3 * c->ng), -1, 0);
        for (int i = 0; i < 3 * c->ng; i++) g->h[i] = (double)c->grid[i];
        in_t(io, "table", nt, r, 1.0);
        acc_t(io, "x", L * A, 0, r, 0); /* x += pe */
        in_t(io, "dx", L * A, r, 1.0);
        acc_t(io, "dtable", nt, 1, r, 0);
        break;
    }
    case OP_VIT_ATTN: { /* H, dh; attention inside each item */
        const size_t L = (size_t)bo_grid_L(c), nq = L * A * B;
        bo_tensor *cu = add_t(io, "cu", BO_T_I32, (size_t)c->ng + 1, -1, 0);
        for (int i = 0; i < c->ng; i++)
            cu->h[i + 1] = cu->h[i] + (double)(c->grid[3 * i] * c->grid[3 * i + 1] * c->grid[3 * i + 2]);
        in_t(io, "q", nq, r, 1.0);
        in_t(io, "k", nq, r, 1.0);
        in_t(io, "v", nq, r, 1.0);
        out_t(io, "o", nq, 0);
        out_t(io, "lse", L * A, 0);
        in_t(io, "dout", nq, r, 1.0);
        acc_t(io, "dq", nq, 1, r, 0);
        acc_t(io, "dk", nq, 1, r, 0);
        acc_t(io, "dv", nq, 1, r, 0);
        break;
    }
    case OP_TPOOL: { /* D; the 2 × 2 merge, frames averaged */
        const size_t L = (size_t)bo_grid_L(c), N = (size_t)bo_grid_N(c);
        bo_tensor *g = add_t(io, "grid", BO_T_I64, (size_t)(3 * c->ng), -1, 0);
        for (int i = 0; i < 3 * c->ng; i++) g->h[i] = (double)c->grid[i];
        in_t(io, "x", L * A, r, 1.0);
        out_t(io, "y", N * 4 * A, 0);
        in_t(io, "dy", N * 4 * A, r, 1.0);
        acc_t(io, "dx", L * A, 1, r, 0);
        break;
    }
    case OP_ATTNRES: {
        k3c_attnres_sizes s = {c->a, c->b, c->c, c->x};
        bo_tensor *v = in_t(io, "v", C * A * B, r, 1.0);
        for (size_t i = 0; i < C; i++) { /* sources of different scales */
            double sc = 0.5 + 1.5 * k3c_rng_uniform(r);
            for (size_t j = 0; j < A * B; j++) v->h[i * A * B + j] = (double)(float)(v->h[i * A * B + j] * sc);
        }
        in_t(io, "w", B, r, 2.0 / sqrt((double)B)); /* pseudo-query logits of order one, softmax not saturated */
        bo_tensor *g = in_t(io, "gamma", B, r, 0.2);
        for (size_t i = 0; i < B; i++) g->h[i] = (double)(float)(g->h[i] * 1.5 + 1.0); /* 1 + 0.3·N(0, 1) */
        out_t(io, "h", A * B, 0);
        out_t(io, "saved", k3c_attnres_saved_elems_f64(&s), 0);
        in_t(io, "dh", A * B, r, 1.0);
        acc_t(io, "dw", B, 1, r, (f & F_NODW) != 0);
        acc_t(io, "dv", C * A * B, 1, r, (f & F_NODV) != 0);
        acc_t(io, "dgamma", B, 1, r, (f & F_NODG) != 0);
        break;
    }
    }
}

static void io_free(bo_io *io) {
    for (int i = 0; i < io->n; i++) free(io->t[i].h), free(io->t[i].init);
}
static void io_copy(bo_io *dst, const bo_io *src) {
    *dst = *src;
    for (int i = 0; i < src->n; i++) {
        size_t n = src->t[i].n ? src->t[i].n : 1;
        dst->t[i].h = malloc(n * sizeof(double));
        memcpy(dst->t[i].h, src->t[i].h, n * sizeof(double));
        dst->t[i].init = NULL;
        if (src->t[i].init) {
            dst->t[i].init = malloc(n * sizeof(double));
            memcpy(dst->t[i].init, src->t[i].init, n * sizeof(double));
        }
    }
}

/* ---------------------------------------------------------------- the case table */
typedef struct {
    bo_case *v;
    int n, cap;
} bo_rows;

static bo_case *row(bo_rows *R, int op, int64_t a, int64_t b, int64_t c, int64_t d, int64_t e, int flags,
                    double tol_cpu, double tol_cuda) {
    if (R->n == R->cap) {
        R->cap = R->cap ? 2 * R->cap : 256;
        R->v = realloc(R->v, (size_t)R->cap * sizeof *R->v);
    }
    bo_case *k = &R->v[R->n++];
    memset(k, 0, sizeof *k);
    k->op = op, k->a = a, k->b = b, k->c = c, k->d = d, k->e = e, k->flags = flags;
    k->tol_cpu = tol_cpu, k->tol_cuda = tol_cuda;
    k->bad[0] = k->bad[1] = -1;
    return k;
}
static bo_case *set_cu(bo_case *c, int n, const int32_t *cu) {
    c->ncu = n;
    for (int i = 0; i < n; i++) c->cu[i] = cu[i];
    return c;
}

/* A vision op's row over ng packed items g[3·ng] (t, h, w). */
static void vrow(bo_rows *R, int op, int64_t a, int64_t b, int flags, const int64_t *g, int ng, double tol_cpu,
                 double tol_cuda) {
    bo_case *c = row(R, op, a, b, 0, 0, 0, flags, tol_cpu, tol_cuda);
    c->ng = ng;
    memcpy(c->grid, g, sizeof(int64_t) * (size_t)(3 * ng));
}

/* The vision tower's ops (what the per-op vision harness checked): GELU both forms (with the cancelling negative tail),
 * 2D RoPE, the interpolated position table both ways, block-diagonal attention and the 2 × 2 merge, on the golden
 * tower's images, frames of several sizes, and the release's head dim. CUDA against the CPU's float table (which sums
 * in double): the old 1e-5 for pointwise ops and the merge, 1e-4 for the attention (float dot products and softmax
 * sums) and the position table (float taps). */
static void add_vision_rows(bo_rows *R) {
    const double P = TOL_F32_POINT, S = TOL_F32_TRANS, W = TOL_F32_ROW;
    static const int64_t gn[4] = {1, 1000, 1 << 20, 41};
    for (int erf_form = 0; erf_form < 2; erf_form++)
        for (int i = 0; i < 4; i++) row(R, OP_GELU, gn[i], 0, 0, 0, 0, (erf_form ? F_ERF : 0) | (i == 3 ? F_TAIL : 0), S, 1e-5);
    static const int64_t g1[6] = {1, 4, 6, 1, 2, 2}, g2[9] = {2, 2, 4, 3, 8, 6, 1, 12, 10}, g3[3] = {1, 32, 32};
    const struct {
        const int64_t *g;
        int n;
        int64_t H, dh, D;
    } items[3] = {{g1, 2, 4, 24, 64}, {g2, 3, 2, 16, 32}, {g3, 1, 12, 128, 96}}; /* the golden's; frames; release dh */
    for (int i = 0; i < 3; i++) {
        vrow(R, OP_ROPE2D, items[i].H, items[i].dh, 0, items[i].g, items[i].n, P, 1e-5);
        for (int mode = 0; mode < 2; mode++)
            vrow(R, OP_POSEMB, items[i].D, 0, mode ? F_BICUBIC : 0, items[i].g, items[i].n, W, 1e-4);
        vrow(R, OP_VIT_ATTN, items[i].H, items[i].dh, 0, items[i].g, items[i].n, W, 1e-4);
        vrow(R, OP_TPOOL, items[i].D, 0, 0, items[i].g, items[i].n, P, 1e-5);
    }
}

/* The rows: every op at the shapes its kernels branch on (tiles, launch groups, plan chunks, documents), its optional
 * inputs and gradients, in place and aliased forms, edge sizes and the errors the CPU and CUDA twins must both give;
 * the CUDA kernel variants (bf16, fp16, fp32 checking) and the CPU-only KDA algorithms (chunk 16, the recurrence). */
static void add_rows(bo_rows *R) {
    const double P = TOL_F32_POINT, S = TOL_F32_TRANS, W = TOL_F32_ROW, K = TOL_F32_CHAIN;
    /* moves */
    row(R, OP_ZERO, 12345, 0, 0, 0, 0, 0, 0, 0);
    for (int i = 0; i < 2; i++) {
        int64_t n = i ? 100003 : 1;
        row(R, OP_ADD, n, 0, 0, 0, 0, 0, P, 0);
        row(R, OP_ADD, n, 0, 0, 0, 0, F_ALIAS, P, 0); /* x = y: y doubles */
    }
    {
        int64_t cc[6][4] = {{37, 53, 61, 59}, {1000, 3, 5, 7}, {1, 77, 0, 0},
                            {5, 64, 64, 64},  {0, 9, 9, 9},    {7, 0, 3, 3}};
        for (int i = 0; i < 6; i++)
            for (int acc = 0; acc < 2; acc++) /* rows, cols, ld_src, ld_dst */
                row(R, OP_COPY2D, cc[i][0], cc[i][1], cc[i][2], cc[i][3], 0, acc ? F_ACC : 0, P, 0);
        row(R, OP_COPY2D, 3, 8, 4, 8, 0, 0, 0, 0)->want_rc = K3C_EINVAL; /* ld_src < cols */
        row(R, OP_ADD, -1, 0, 0, 0, 0, 0, 0, 0)->want_rc = K3C_EINVAL;
    }
    /* sigmoid: out of place, in place, backward */
    static const int64_t sn[3] = {1, 777, 100003};
    for (int i = 0; i < 3; i++) {
        int64_t n = sn[i];
        row(R, OP_SIGMOID, n, 0, 0, 0, 0, 0, S, 1e-5);
        row(R, OP_SIGMOID, n, 0, 0, 0, 0, F_INPLACE, S, 1e-5);
        row(R, OP_SIGMOID_GATE, n, 0, 0, 0, 0, 0, S, 1e-5);
        row(R, OP_SIGMOID_GATE, n, 0, 0, 0, 0, F_NODG, S, 1e-5); /* dz not requested: untouched */
    }
    /* embedding: repeats, bad ids (the first bad token named) */
    {
        int64_t sh[2][4] = {{1000, 513, 96, 50}, {50, 100003, 8, 0}}; /* V, T, D, hot % */
        for (int i = 0; i < 2; i++) {
            int64_t V = sh[i][0], T = sh[i][1], D = sh[i][2];
            row(R, OP_EMBEDDING, T, V, D, 0, 0, 0, W, 1e-5)->x = sh[i][3] / 100.0;
            bo_case *c = row(R, OP_EMBEDDING, T, V, D, 0, 0, 0, 0, 0);
            c->want_rc = K3C_EINVAL, c->bad[1] = (int)(T * 2 / 3);
            c = row(R, OP_EMBEDDING, T, V, D, 0, 0, 0, 0, 0);
            c->want_rc = K3C_EINVAL, c->bad[0] = (int)(T * 7 / 12), c->bad[1] = (int)(T * 2 / 3);
        }
    }
    /* RMSNorm plain and gated, every subset of the gradients */
    {
        int64_t rows[3] = {1, 37, 1000}, Ds[5] = {16, 32, 48, 128, 7168 / 8};
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 5; j++) {
                for (int pass = 0; pass < 2; pass++)
                    row(R, OP_RMSNORM, rows[i], Ds[j], 0, 0, 0, pass ? F_NODW : 0, W, 1e-5)->x = 1e-6;
                row(R, OP_RMSNORM, rows[i], Ds[j], 0, 0, 0, F_NODX, W, 1e-5)->x = 1e-6;
            }
        row(R, OP_RMSNORM, 37, 128, 0, 0, 0, F_NORSTD, W, 1e-5)->x = 1e-6;
        int64_t gc[5][3] = {{1, 3, 32}, {37, 2, 48}, {250, 4, 128}, {1000, 1, 16}, {37, 1, 7168 / 8}};
        for (int i = 0; i < 5; i++)
            for (int pass = 0; pass < 3; pass++) {
                int fl = F_GATED | (pass == 1 ? F_NODG | F_NODW : pass == 2 ? F_NODX : 0);
                row(R, OP_RMSNORM, gc[i][0] * gc[i][1], gc[i][2], 0, 0, 0, fl, W, 1e-5)->x = 1e-6;
            }
    }
    /* edges: no rows runs and leaves everything as it was; bad sizes and a backward without rstd are K3C_EINVAL */
    row(R, OP_RMSNORM, 0, 16, 0, 0, 0, 0, W, 1e-5)->x = 1e-6;
    row(R, OP_RMSNORM, 0, 16, 0, 0, 0, F_GATED, W, 1e-5)->x = 1e-6;
    row(R, OP_L2NORM, 0, 32, 0, 0, 0, 0, W, 1e-5);
    row(R, OP_EMBEDDING, 0, 10, 8, 0, 0, 0, W, 1e-5);
    row(R, OP_RMSNORM, 4, 0, 0, 0, 0, 0, 0, 0)->want_rc = K3C_EINVAL;
    bo_case *e = row(R, OP_RMSNORM, 4, 16, 0, 0, 0, F_GATED, 0, 0);
    e->want_rc = K3C_EINVAL, e->x = NAN;
    row(R, OP_L2NORM, 4, 0, 0, 0, 0, 0, 0, 0)->want_rc = K3C_EINVAL;
    e = row(R, OP_L2NORM, 4, 32, 0, 0, 0, 0, 0, 0);
    e->want_rc = K3C_EINVAL, e->x = -1;
    row(R, OP_EMBEDDING, 4, 0, 8, 0, 0, 0, 0, 0)->want_rc = K3C_EINVAL;
    row(R, OP_RMSNORM, 37, 128, 0, 0, 0, F_GATED | F_NORSTD, W, 1e-5)->x = 1e-6;
    for (int g = 0; g < 2; g++) {
        e = row(R, OP_RMSNORM, 4, 16, 0, 0, 0, (g ? F_GATED : 0) | F_NORSTD | F_BWDERR, 0, 0);
        e->want_rc = K3C_EINVAL, e->x = 1e-6;
    }
    row(R, OP_L2NORM, 4, 32, 0, 0, 0, F_NORSTD | F_BWDERR, 0, 0)->want_rc = K3C_EINVAL;
    /* L2 norm: a zero row, eps, in place, no dx */
    for (int64_t dk = 32; dk <= 128; dk *= 4) {
        row(R, OP_L2NORM, 1 * 2, dk, 0, 0, 0, F_ZEROROW, W, 1e-5);
        row(R, OP_L2NORM, 37 * 3, dk, 0, 0, 0, F_ZEROROW, W, 1e-5);
        row(R, OP_L2NORM, 37 * 3, dk, 0, 0, 0, F_ZEROROW | F_INPLACE, W, 1e-5);
        row(R, OP_L2NORM, 1000 * 4, dk, 0, 0, 0, F_ZEROROW, W, 1e-5)->x = dk == 32 ? 1e-3 : 0.0;
    }
    row(R, OP_L2NORM, 37 * 3, 32, 0, 0, 0, F_NODX, W, 1e-5);
    /* linear (CUDA: cuBLASLt fp32 GEMMs, 1e-4) */
    {
        int64_t sh[4][3] = {{1, 16, 8}, {77, 96, 130}, {300, 128, 192}, {64, 513, 64}};
        for (int i = 0; i < 4; i++) {
            row(R, OP_LINEAR, sh[i][0], sh[i][1], sh[i][2], 0, 0, 0, W, 1e-4);
            row(R, OP_LINEAR, sh[i][0], sh[i][1], sh[i][2], 0, 0, F_ACC | F_NODX, W, 1e-4);
            row(R, OP_LINEAR, sh[i][0], sh[i][1], sh[i][2], 0, 0, F_NODW, W, 1e-4);
        }
    }
    /* cross-entropy: masks, norms, the full vocabulary, nothing counted, a bad target, rows far from zero */
    {
        int64_t Vs[3] = {10, 5000, 163840 / 16};
        for (int i = 0; i < 3; i++)
            for (int m = 0; m < 2; m++)
                for (int nm = 0; nm < 2; nm++) {
                    bo_case *c = row(R, OP_XENT, 77, Vs[i], 0, 0, 0, m ? F_MASK : 0, W, 1e-5);
                    c->x = nm ? 123.0 : 0.0, c->y = 0.75;
                }
        row(R, OP_XENT, 8, 163840, 0, 0, 0, F_MASK, W, 1e-5)->y = 1.0;
        row(R, OP_XENT, 77, 10, 0, 0, 0, F_NONE, W, 1e-5)->y = 1.0;
        row(R, OP_XENT, 77, 5000, 0, 0, 0, F_MASK | F_WEIGHT, W, 1e-5)->y = 0.75;
        row(R, OP_XENT, 77, 163840 / 16, 0, 0, 0, F_WEIGHT, W, 1e-5)->x = 123.0;
        for (int i = 0; i < 3; i++)
            for (int m = 0; m < 2; m++) {
                bo_case *c = row(R, OP_XENT, 77, Vs[i], 0, 0, 0, F_SHIFT | (m ? F_MASK : 0), W, 1e-5);
                c->x = m ? 0.0 : 123.0, c->y = 0.7;
            }
        bo_case *c = row(R, OP_XENT, 77, 5000, 0, 0, 0, F_MASK, 0, 0);
        c->want_rc = K3C_EINVAL, c->bad[0] = 40;
    }
    /* short convolution: empty documents, documents shorter than W − 1, one crossing
     * the 256-token dw segment, three segments with odd W, the three state modes and the in-place state */
    {
        static const int32_t d1[] = {0, 0, 1}, d2[] = {0, 2, 2, 50, 51, 100}, d3[] = {0, 1, 150, 150, 298, 300},
                             d4[] = {0, 5, 5, 5, 400, 401, 700};
        struct {
            int64_t T;
            int n;
            const int32_t *cu;
        } docs[5] = {{1, 0, NULL}, {1, 3, d1}, {100, 6, d2}, {300, 0, NULL}, {300, 6, d3}};
        for (int i = 0; i < 5; i++) {
            for (int ci = 0; ci < 3; ci++)
                for (int Wd = 2; Wd <= 4; Wd += 2) {
                    int64_t C = ci == 0 ? 3 : ci == 1 ? 64 : 96;
                    for (int mode = 0; mode < 2; mode++)
                        set_cu(row(R, OP_SHORT_CONV, docs[i].T, C, Wd, 0, 0, mode ? F_STATE : 0, W, 1e-5), docs[i].n,
                               docs[i].cu);
                }
            set_cu(row(R, OP_SHORT_CONV, docs[i].T, 96, 4, 0, 0, F_STATE_OUT, W, 1e-5), docs[i].n, docs[i].cu);
            set_cu(row(R, OP_SHORT_CONV, docs[i].T, 96, 4, 0, 0, F_STATE | F_INPLACE, W, 1e-5), docs[i].n, docs[i].cu);
        }
        set_cu(row(R, OP_SHORT_CONV, 700, 33, 3, 0, 0, F_STATE, W, 1e-5), 7, d4);
        set_cu(row(R, OP_SHORT_CONV, 700, 33, 3, 0, 0, F_STATE | F_NODX, W, 1e-5), 7, d4);
        set_cu(row(R, OP_SHORT_CONV, 700, 33, 3, 0, 0, F_STATE | F_NODW, W, 1e-5), 7, d4);
        static const int32_t d0[] = {0, 0, 0};
        set_cu(row(R, OP_SHORT_CONV, 0, 5, 4, 0, 0, F_STATE, W, 1e-5), 3, d0); /* T = 0: states pass through */
    }
    /* KDA forget gate: both forms, g_min 0 = −5, no dt_bias, no A_log, one token, long.
     * dA_log sums T·dk terms (38400 here) of both signs: measured against Σ|term| (terms_scale2), as every tensor at
     * 1e-5 on every backend. */
    {
        int64_t gc[12][6] = {/* T, H, dk, form, flags, g_min·(−1) */
                             {300, 1, 32, K3C_GATE_LOWER_BOUND, 0, 5},     {300, 1, 128, K3C_GATE_LOWER_BOUND, 0, 5},
                             {300, 4, 32, K3C_GATE_LOWER_BOUND, 0, 5},     {300, 4, 128, K3C_GATE_LOWER_BOUND, 0, 5},
                             {300, 1, 32, K3C_GATE_SOFTPLUS, 0, 0},        {300, 1, 128, K3C_GATE_SOFTPLUS, 0, 0},
                             {300, 4, 32, K3C_GATE_SOFTPLUS, 0, 0},        {300, 4, 128, K3C_GATE_SOFTPLUS, 0, 0},
                             {77, 4, 32, K3C_GATE_LOWER_BOUND, F_NODT, 0}, {77, 1, 128, K3C_GATE_SOFTPLUS, F_NOA, 0},
                             {1, 4, 48, K3C_GATE_LOWER_BOUND, 0, 3},       {2000, 2, 128, K3C_GATE_SOFTPLUS, 0, 0}};
        for (int i = 0; i < 12; i++) {
            bo_case *c = row(R, OP_KDA_GATE, gc[i][0], gc[i][1], gc[i][2], gc[i][3], 0, (int)gc[i][4], W, 1e-5);
            c->x = -(double)gc[i][5];
        }
    }
    /* KDA chunked: documents incl. an empty one, lower-bound and unbounded gates, saturated
     * gates, an initial state; chunk 64 on every backend (bf16, fp16 and fp32 kernels on CUDA), chunk 16 and the token
     * recurrence where the backend supports them */
    {
        static const int32_t k1[] = {0, 37, 37, 200, 300}, k3[] = {0, 65, 190}, k5[] = {0, 120, 200};
        struct {
            int64_t T, H, dk, dv;
            int n;
            const int32_t *cu;
            double lb;
            int fl;
        } kc[5] = {{300, 3, 128, 128, 5, k1, -5, F_H0},
                   {256, 2, 128, 128, 0, NULL, -5, F_SAT},
                   {190, 2, 64, 64, 3, k3, 0, F_H0},
                   {129, 2, 32, 64, 0, NULL, -5, F_H0},
                   {200, 2, 128, 256, 3, k5, 0, 0}};
        for (int i = 0; i < 5; i++) {
            /* Gates saturated at the bound: dg sums many terms of opposite sign, so float32 loses more of it (3–6e-4
             * measured, the same for the recurrence as for either chunk size: conditioning, not an algorithm error). */
            double ksat = kc[i].fl & F_SAT ? 1e-3 : K;
            for (int v = 0; v < 3; v++) { /* CUDA: bf16, fp16 and the fp32 checking kernels */
                static const int fl[3] = {0, F_FP16, F_FP32K};
                bo_case *c = row(R, OP_KDA, kc[i].T, kc[i].H, kc[i].dk, kc[i].dv, 64, kc[i].fl | fl[v], K,
                                 v == 0 ? 1e-2 : v == 1 ? TOL_F16 : kc[i].fl & F_SAT ? K : W);
                c->x = kc[i].lb, set_cu(c, kc[i].n, kc[i].cu);
            }
            for (int chunk = 0; chunk <= 16; chunk += 16) {
                bo_case *c = row(R, OP_KDA, kc[i].T, kc[i].H, kc[i].dk, kc[i].dv, chunk, kc[i].fl, ksat, 1e-2);
                c->x = kc[i].lb, set_cu(c, kc[i].n, kc[i].cu);
            }
        }
        /* the test model's narrow heads (dk 8: test_dist_nccl's config), on the fp32 kernels only */
        bo_case *c = row(R, OP_KDA, 200, 2, 8, 8, 64, F_H0 | F_FP32K, K, W);
        c->x = -5, set_cu(c, 3, k5);
    }
    /* attention: MLA dims, documents incl. an empty one, small zero-padded dims */
    {
        static const int32_t a1[] = {0, 100, 100, 257, 333}, a3[] = {0, 64, 200}, a4[] = {0, 70, 150};
        struct {
            int64_t T, H, dqk, dv;
            int n;
            const int32_t *cu;
        } ac[5] = {{333, 2, 192, 128, 5, a1},
                   {300, 2, 192, 128, 0, NULL},
                   {200, 3, 128, 128, 3, a3},
                   {150, 2, 48, 32, 3, a4},
                   {130, 2, 24, 16, 0, NULL}};
        for (int i = 0; i < 5; i++)
            for (int v = 0; v < 3; v++) {
                static const int fl[3] = {0, F_FP16, F_FP32K};
                set_cu(row(R, OP_ATTENTION, ac[i].T, ac[i].H, ac[i].dqk, ac[i].dv, 0, fl[v], K,
                           v == 0 ? 1e-2 : v == 1 ? TOL_F16 : W),
                       ac[i].n, ac[i].cu);
            }
    }
    /* QK-Clip S_max: every other case with documents, an empty one; every third from
       query row T/3 on (q_begin: context parallelism's padding rows before it) */
    {
        int idx = 0;
        static const int64_t Ts[3] = {1, 200, 1000};
        for (int ti = 0; ti < 3; ti++)
            for (int64_t H = 1, T = Ts[ti]; H <= 4; H += 3)
                for (int64_t dqk = 48; dqk <= 192; dqk *= 4) {
                    bo_case *c = row(R, OP_MAX_LOGIT, T, H, dqk, idx % 3 == 1 ? T / 3 : 0, 0, 0, W, 1e-5);
                    if (idx++ % 2 == 0) {
                        int32_t one[3] = {0, 0, 1},
                                many[6] = {
                                    0,         (int32_t)T / 3, (int32_t)T / 3, (int32_t)(T - 1 - T / 7), (int32_t)T - 1,
                                    (int32_t)T};
                        if (T == 1)
                            set_cu(c, 3, one);
                        else
                            set_cu(c, 6, many);
                    }
                    if (T > 1) { /* a +inf logit (in a long document where there are documents) */
                        int32_t cu[8];
                        const int n = c->ncu;
                        memcpy(cu, c->cu, sizeof cu);
                        set_cu(row(R, OP_MAX_LOGIT, T, H, dqk, 0, 0, F_INF, 0, 0), n, cu)->want_rc = K3C_ENUMERIC;
                    }
                }
        row(R, OP_MAX_LOGIT, 0, 3, 48, 0, 0, 0, W, 1e-5);                                /* no tokens: −inf */
        static const int32_t b0[4] = {0, 3, 1, 4}, b1[3] = {0, 2, 3}, b2[3] = {1, 2, 4}; /* not 0 … T ascending */
        set_cu(row(R, OP_MAX_LOGIT, 4, 3, 48, 0, 0, 0, 0, 0), 4, b0)->want_rc = K3C_EINVAL;
        set_cu(row(R, OP_MAX_LOGIT, 4, 3, 48, 0, 0, 0, 0, 0), 3, b1)->want_rc = K3C_EINVAL;
        set_cu(row(R, OP_MAX_LOGIT, 4, 3, 48, 0, 0, 0, 0, 0), 3, b2)->want_rc = K3C_EINVAL;
    }
    /* router, MoE, dense MLP (and the GLU inside both) */
    {
        struct {
            int64_t T, n, k;
            int renorm, bias;
            double scale;
        } rc[3] = {{300, 64, 8, 1, 1, 2.446}, {100, 16, 1, 1, 0, 1.0}, {77, 40, 6, 0, 1, 1.5}};
        for (int i = 0; i < 3; i++)
            row(R, OP_ROUTER, rc[i].T, rc[i].n, rc[i].k, rc[i].renorm, 0,
                (rc[i].bias ? F_BIAS : 0) | (rc[i].k < rc[i].n ? F_CUTOFF : 0), W, 1e-4)
                ->x = rc[i].scale;
        /* the auxiliary balancing loss's gradient: all rows, and a range of them (tensor parallelism's share) */
        row(R, OP_AUX_LOSS, 300, 64, 8, 0, 300, 0, W, 1e-5)->x = 0.01;
        row(R, OP_AUX_LOSS, 77, 40, 6, 20, 33, 0, W, 1e-5)->x = 0.7;
        row(R, OP_AUX_LOSS, 5, 3, 1, 4, 1, 0, W, 1e-5)->x = 1.0;
        /* the last: over 128 rows per expert (the CUDA grouped products' row tiles, moe_grouped.cu) */
        int64_t mc[4][6] = {
            {150, 128, 192, 8, 3, 1}, {97, 96, 80, 5, 2, 0}, {64, 64, 64, 33, 4, 1}, {300, 64, 96, 4, 2, 0}};
        for (int i = 0; i < 4; i++)
            row(R, OP_MOE, mc[i][0], mc[i][1], mc[i][2], mc[i][3], mc[i][4], mc[i][5] ? F_SITU : 0, W, 1e-4);
        row(R, OP_MOE, mc[1][0], mc[1][1], mc[1][2], mc[1][3], mc[1][4], F_GELU, W, 1e-4);
        static const int act_flag[3] = {0, F_SITU, F_GELU};
        for (int a = 0; a < 3; a++) {
            row(R, OP_MLP, 150, 128, 192, 0, 0, act_flag[a], W, 1e-4);
            row(R, OP_MLP, 33, 64, 80, 0, 0, act_flag[a], W, 1e-4);
        }
        row(R, OP_MLP, 150, 128, 192, 0, 0, F_SITU | F_WIDE, W, 1e-4);
        row(R, OP_MLP, 33, 64, 80, 0, 0, F_SITU | F_WIDE, W, 1e-4);
        /* dropped slots and an empty expert, K3's SiTU caps in their saturated range, the backward recomputing the
           plan; plans over many chunks of slots (T·k = 32792) and over K3's 896 experts; a bad id named */
        for (int i = 0; i < 3; i++)
            for (int sv = 0; sv < 2; sv++)
                row(R, OP_MOE, mc[i][0], mc[i][1], mc[i][2], mc[i][3], mc[i][4],
                    F_DROP | (sv ? F_NOSAVED : 0) | (mc[i][5] ? F_SITU | F_WIDE : 0), W, 1e-4);
        row(R, OP_MOE, 4099, 16, 16, 64, 8, F_DROP, W, 1e-4);
        row(R, OP_MOE, 700, 16, 16, 896, 8, F_DROP | F_SITU, W, 1e-4);
        bo_case *e = row(R, OP_MOE, 97, 96, 80, 5, 2, 0, 0, 0);
        e->want_rc = K3C_EINVAL, e->bad[0] = 97;
    }
    /* the permutation steps of expert parallelism on their own (moe_gather / _bwd, moe_combine / _bwd) and the
     * bf16 packing of its wire. Gathers, the slot-order adds of gather_bwd, dyperm and the round trip are exact
     * against the CPU float table; combine (k products summed) 1e-6; dw (a D-long dot) the row reductions' 1e-5. */
    {
        int64_t pc[5][4] = {{150, 8, 128, 64}, {97, 2, 96, 5}, {64, 4, 33, 16}, {1, 1, 7, 3}, {0, 2, 16, 4}};
        for (int i = 0; i < 5; i++)
            for (int v = 0; v < 3; v++) {
                bo_case *c = row(R, OP_MOE_PERM, pc[i][0], pc[i][1], pc[i][2], pc[i][3], 0,
                                 v == 1 ? F_NODW : v == 2 ? F_NODX : 0, P, 1e-6);
                c->x = v == 0 ? 0.0 : 0.25, c->tol_cpu_bwd = W, c->tol_cuda_bwd = W;
            }
        static const int64_t bn[3] = {8, 1000, 100003};
        for (int i = 0; i < 3; i++) row(R, OP_BF16, bn[i], 0, 0, 0, 0, 0, 0, 0);
    }
    /* AttnRes: NULL and aliased dv entries, gradient subsets, 200 sources (two 128-source
     * groups), many token chunks; every case with the saved statistics and recomputing them. CUDA tolerances:
     * 1e-5 forward, 1e-4 backward. dw, dγ sum softmax-weighted deviations from the mean score, which cancel: a single
     * token in float32 keeps 3e-5 of them (measured), so the float backward's tolerance is 1e-4 as well. With one token
     * nothing averages them: for two sources dŵ ∝ s₁ − s₂, which float keeps to u·|s| / |s₁ − s₂|, unbounded as a draw
     * makes the scores close (1.1e-3 seen in 30 seeds): 1e-2 there, the CUDA comparison staying at 1e-4. */
    {
        static const int64_t Ts[3] = {1, 50, 333}, Ds[3] = {16, 128, 200}, Ns[4] = {1, 2, 5, 9};
        int64_t more[4][4] = {
            {50, 128, 5, F_NODV | F_NODG}, {50, 200, 9, F_NODW | F_NODG}, {7, 40, 200, 0}, {1500, 72, 3, 0}};
        for (int sv = 0; sv < 2; sv++) {
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 3; j++)
                    for (int k = 0; k < 4; k++) {
                        bo_case *c = row(R, OP_ATTNRES, Ts[i], Ds[j], Ns[k], 0, 0, sv ? F_NOSAVED : 0, W, 1e-5);
                        c->x = 1e-5, c->tol_cuda_bwd = 1e-4, c->tol_cpu_bwd = Ts[i] == 1 ? 1e-2 : K;
                    }
            for (int i = 0; i < 4; i++) {
                bo_case *c = row(R, OP_ATTNRES, more[i][0], more[i][1], more[i][2], 0, 0,
                                 (int)more[i][3] | (sv ? F_NOSAVED : 0), W, 1e-5);
                c->x = 1e-5, c->tol_cuda_bwd = 1e-4, c->tol_cpu_bwd = K;
            }
        }
        row(R, OP_ATTNRES, 0, 3, 2, 0, 0, 0, W, 1e-5)->x = 1e-6;          /* no tokens: nothing written, dw as it was */
        row(R, OP_ATTNRES, 4, 8, 0, 0, 0, 0, 0, 0)->want_rc = K3C_EINVAL; /* no sources */
        row(R, OP_ATTNRES, 4, 8, K3C_ATTNRES_MAX_SOURCES + 1, 0, 0, 0, 0, 0)->want_rc = K3C_EINVAL;
        bo_case *e = row(R, OP_ATTNRES, 4, 8, 1, 0, 0, 0, 0, 0);
        e->want_rc = K3C_EINVAL, e->x = -1;
    }
}

static int has_bwd(int op) {
    return op != OP_ZERO && op != OP_ADD && op != OP_COPY2D && op != OP_MAX_LOGIT && op != OP_BF16 &&
           op != OP_AUX_LOSS; /* a gradient on its own: its one call is phase 0 */
}

static void shape_of(const bo_case *c, char *s, size_t n) {
    int k = snprintf(s, n, "%lld,%lld,%lld,%lld,%lld f%x", (long long)c->a, (long long)c->b, (long long)c->c,
                     (long long)c->d, (long long)c->e, (unsigned)c->flags);
    if (c->x != 0 && k > 0 && (size_t)k < n) k += snprintf(s + k, n - (size_t)k, " x%g", c->x);
    for (int i = 0; i < c->ncu && k > 0 && (size_t)k < n; i++)
        k += snprintf(s + k, n - (size_t)k, "%s%d", i ? "," : " cu:", c->cu[i]);
    for (int i = 0; i < c->ng && k > 0 && (size_t)k < n; i++)
        k += snprintf(s + k, n - (size_t)k, "%s%lldx%lldx%lld", i ? "," : " items:", (long long)c->grid[3 * i],
                      (long long)c->grid[3 * i + 1], (long long)c->grid[3 * i + 2]);
}

/* ---------------------------------------------------------------- backends and comparison */
typedef struct {
    const char *name;
    const k3c_backend_f32 *f32;
    const k3c_backend_f64 *f64;
    void *cuda;      /* k3c_cuda_backend * when this is the CUDA table */
    double gemm_tol; /* > 0: a table with bf16 GEMMs, run on the GEMM-based ops only, at this tolerance */
    int rows[OP_COUNT], passed[OP_COUNT], failed[OP_COUNT], skipped;
} bo_backend;

static int supports(const bo_backend *b, k3c_backend_feature f, int64_t v) {
    return b->f64 ? b->f64->supports(f, v) : b->f32->supports(f, v);
}

static int run(bo_backend *b, const bo_case *c, bo_io *io, int phase) {
#ifdef K3C_CUDA
    if (b->cuda)
        k3c_cuda_backend_kernels((k3c_cuda_backend *)b->cuda, c->flags & F_FP16    ? K3C_KERNELS_FP16
                                                              : c->flags & F_FP32K ? K3C_KERNELS_FP32
                                                                                   : K3C_KERNELS_BF16);
#endif
    return b->f64 ? exec_f64(b->f64, c, io, phase) : exec_f32(b->f32, c, io, phase);
}

/* Both phases on one backend, the backward from its own forward: a reference run. */
static int run_ref(bo_backend *b, const bo_case *c, bo_io *io) {
    int rc = run(b, c, io, 0);
    if (!rc && has_bwd(c->op) && !(c->flags & F_NORSTD)) rc = run(b, c, io, 1);
    return rc;
}

static void verdict(bo_backend *b, const bo_case *c, const char *shape, const char *what, double e, double tol,
                    size_t nonfinite) {
    int pass = nonfinite == 0 && e <= tol;
    pass ? b->passed[c->op]++ : b->failed[c->op]++;
    CHECK(pass, "%s %s [%s] %s: rel_err %.3e tol %.0e%s", b->name, op_names[c->op], shape, what, e, tol,
          nonfinite ? " (non-finite outputs)" : "");
    if (getenv("K3C_TEST_VERBOSE"))
        printf("  %-5s %-10s %-44s %-9s rel_err %.3e tol %.0e\n", b->name, op_names[c->op], shape, what, e, tol);
}

/* Outputs that are one sum of many terms of both signs are measured against Σ|term| (the scale of a float sum's
 * error, whatever the terms cancel to), not against the sum: kda_gate's dA_log sums T·dk terms per head, each
 * dz·u (lower-bound form, u = z + dt_bias) or dg·g (softplus form), from the reference's own values. Returns
 * Σ_h (Σ|term|)² for tensor i, or −1 where the sum itself is the scale. */
static double terms_scale2(const bo_case *c, const bo_io *ref, int i) {
    if (c->op != OP_KDA_GATE || strcmp(ref->t[i].name, "dA_log") != 0) return -1;
    const bo_tensor *z = &ref->t[0], *dt = &ref->t[1], *g = &ref->t[3], *dg = &ref->t[4], *dz = &ref->t[5];
    const int lb = c->d == K3C_GATE_LOWER_BOUND;
    double s2 = 0;
    for (int64_t h = 0; h < c->b; h++) {
        double s = 0;
        for (int64_t t = 0; t < c->a; t++)
            for (int64_t k = 0; k < c->c; k++) {
                const size_t j = (size_t)((t * c->b + h) * c->c + k), ch = (size_t)(h * c->c + k);
                s += lb ? fabs(dz->h[j] * (z->h[j] + (dt->absent ? 0 : dt->h[ch]))) : fabs(dg->h[j] * g->h[j]);
            }
        s2 += s * s;
    }
    return s2;
}

/* ‖x − ref‖ / ‖ref − init‖ over the tensors phase `phase` wrote (ids: the count of mismatches). Against the double
 * table a float result also carries the rounding of its stored value (2^-24 of ‖ref‖), which no increment can beat
 * when it is small beside the pre-filled contents: that bound is added to the float tolerance. */
static void compare(bo_backend *b, const bo_case *c, const char *shape, const bo_io *x, const bo_io *ref, int phase,
                    double tol) {
    for (int i = 0; i < x->n; i++) {
        const bo_tensor *t = &x->t[i], *r = &ref->t[i];
        if (t->absent || t->phase != phase) continue;
        double num = 0, den = 0, all = 0;
        size_t bad = 0;
        for (size_t j = 0; j < t->n; j++) {
            if (isinf(t->h[j]) && t->h[j] == r->h[j]) continue; /* S_max of no pairs: −inf on both */
            if (!isfinite(t->h[j])) {
                bad++;
                continue;
            }
            double base = t->init ? t->init[j] : 0, d = t->h[j] - r->h[j];
            if (t->type == BO_T_I32)
                num += d != 0;
            else
                num += d * d, den += (r->h[j] - base) * (r->h[j] - base), all += r->h[j] * r->h[j];
        }
        const double ts2 = terms_scale2(c, ref, i);
        if (ts2 > 0) den = ts2;
        double e = t->type == BO_T_I32 ? num : den > 0 ? sqrt(num / den) : sqrt(num);
        double allow = t->type == BO_T_I32 || (t->exact && b->cuda) ? 0 : tol;
        if (!b->cuda && allow > 0 && den > 0) allow += 0x1p-24 * sqrt(all / den);
        verdict(b, c, shape, t->name, e, allow, bad);
    }
    if (c->op == OP_XENT && phase == 0) {
        verdict(b, c, shape, "loss", fabs(x->loss - ref->loss) / fmax(fabs(ref->loss), 1e-30), tol, 0);
        verdict(b, c, shape, "count", (double)llabs((long long)(x->count - ref->count)), 0, 0);
    }
}

/* One case on backend b against the reference backend ref. */
static void run_case(bo_backend *b, bo_backend *ref, const bo_case *c, const bo_io *tmpl) {
    char shape[160];
    shape_of(c, shape, sizeof shape);
    if (c->op == OP_KDA && !supports(b, K3C_FEATURE_KDA_CHUNK, c->e)) {
        b->skipped++; /* the backend refuses this chunk through supports (checked in check_supports) */
        return;
    }
    if ((c->flags & (F_FP16 | F_FP32K)) && !b->cuda) return; /* a CUDA kernel variant: nothing to run on the CPU */
    b->rows[c->op]++;
    bo_io x, r;
    io_copy(&x, tmpl);
    if (c->want_rc) { /* an error row: the status and the message naming the first bad element */
        int rc = run(b, c, &x, 0);
        if (!rc && (c->flags & F_BWDERR)) rc = run(b, c, &x, 1);
        int first = c->bad[0] >= 0 ? c->bad[0] : c->bad[1];
        char want[64] = ""; /* size errors: the status alone */
        if (first >= 0 && c->op == OP_EMBEDDING)
            snprintf(want, sizeof want, "token %d has id %d ", first, c->bad[0] >= 0 ? -7 : (int)c->b);
        else if (first >= 0 && c->op == OP_MOE)
            snprintf(want, sizeof want, "at token %d, slot %d is outside", first / (int)c->e, first % (int)c->e);
        else if (first >= 0)
            snprintf(want, sizeof want, "position %d has target %d ", first, (int)c->b);
        int pass = rc == c->want_rc && strstr(x.msg, want) != NULL;
        pass ? b->passed[c->op]++ : b->failed[c->op]++;
        CHECK(pass, "%s %s [%s]: status %s, message \"%s\", want %s and \"%s\"", b->name, op_names[c->op], shape,
              k3c_status_name(rc), x.msg, k3c_status_name(c->want_rc), want);
        io_free(&x);
        return;
    }
    io_copy(&r, tmpl);
    double tol = b->gemm_tol > 0 ? b->gemm_tol : b->cuda ? c->tol_cuda : c->tol_cpu;
    int rc = run_ref(ref, c, &r);
    CHECK(rc == K3C_OK, "%s reference %s [%s]: %s", ref->name, op_names[c->op], shape, r.msg);
    if (!rc) rc = run(b, c, &x, 0);
    CHECK(rc == K3C_OK, "%s %s [%s] forward: %s", b->name, op_names[c->op], shape, x.msg);
    if (!rc) compare(b, c, shape, &x, &r, 0, tol);
    if (!rc && has_bwd(c->op) && !(c->flags & F_NORSTD)) {
        for (int i = 0; i < x.n; i++) /* the backward reads the reference's forward outputs */
            if (x.t[i].phase == 0) memcpy(x.t[i].h, r.t[i].h, x.t[i].n * sizeof(double));
        rc = run(b, c, &x, 1);
        CHECK(rc == K3C_OK, "%s %s [%s] backward: %s", b->name, op_names[c->op], shape, x.msg);
        double tb = b->gemm_tol > 0 ? b->gemm_tol : b->cuda ? c->tol_cuda_bwd : c->tol_cpu_bwd;
        if (!rc) compare(b, c, shape, &x, &r, 1, tb > 0 ? tb : tol);
    }
    io_free(&x);
    io_free(&r);
}

/* ---------------------------------------------------------------- supports */
static int refuse_16(k3c_backend_feature f, int64_t v) { return f == K3C_FEATURE_KDA_CHUNK ? v == 64 : 1; }

static void check_supports(const bo_backend *cuda) {
    const k3c_backend_f64 *cpu = k3c_backend_cpu_f64();
    CHECK(cpu->supports(K3C_FEATURE_KDA_CHUNK, 0) && cpu->supports(K3C_FEATURE_KDA_CHUNK, 16) &&
              cpu->supports(K3C_FEATURE_KDA_CHUNK, 64),
          "the CPU runs the recurrence and chunks 16 and 64");
    CHECK(!cpu->supports(K3C_FEATURE_KDA_CHUNK, 8) && !cpu->supports(K3C_FEATURE_KDA_CHUNK, -16) &&
              !cpu->supports(K3C_FEATURE_KDA_CHUNK, K3C_KDA_MAX_CHUNK + 16),
          "the CPU refuses chunks that are not multiples of 16 up to the maximum");
    CHECK(k3c_backend_cpu_f32()->supports(K3C_FEATURE_ATTENTION_BLOCK, 0) &&
              !k3c_backend_cpu_f32()->supports(K3C_FEATURE_ATTENTION_BLOCK, K3C_ATTN_MAX_BLOCK + 1),
          "attention tiles up to the maximum");
    if (cuda)
        CHECK(cuda->f32->supports(K3C_FEATURE_KDA_CHUNK, 64) && !cuda->f32->supports(K3C_FEATURE_KDA_CHUNK, 16) &&
                  !cuda->f32->supports(K3C_FEATURE_KDA_CHUNK, 0),
              "CUDA runs chunk 64 only");

    /* The wire dtype: bf16 only where the kernels round activations to bf16 anyway (the CUDA bf16 mode) */
    CHECK(k3c_backend_cpu_f32()->wire_bf16 == 0 && k3c_backend_cpu_f64()->wire_bf16 == 0, "the CPU wire is float");
#ifdef K3C_CUDA
    if (cuda) {
        k3c_cuda_backend *cb = (k3c_cuda_backend *)cuda->cuda;
        int w[3];
        for (int mode = 0; mode < 3; mode++) k3c_cuda_backend_kernels(cb, mode), w[mode] = cb->table.wire_bf16;
        k3c_cuda_backend_kernels(cb, K3C_KERNELS_BF16);
        CHECK(w[K3C_KERNELS_BF16] == 1 && w[K3C_KERNELS_FP16] == 0 && w[K3C_KERNELS_FP32] == 0,
              "CUDA wire_bf16 by kernel mode: bf16 %d, fp16 %d, fp32 %d", w[0], w[1], w[2]);
    }
#endif

    /* Binding a model: a backend that ignores its kda_chunk is refused, naming the backend and the setting. A CPU
     * table that claims chunk 64 only stands in for one (the CUDA table's answer). */
    k3c_model m;
    k3c_err err = {0};
    if (k3c_model_open_f64(test_shared("golden/k3_tiny_a"), 0, &m, &err)) {
        CHECK(0, "open k3_tiny_a: %s", err.msg);
        return;
    }
    k3c_backend_f64 only64 = *cpu;
    only64.name = "only64";
    only64.supports = refuse_16;
    m.kda_chunk = 16;
    int rc = k3c_model_use_backend_f64(&m, &only64, &err);
    CHECK(rc == K3C_EUNSUPPORTED && strstr(err.msg, "only64") && strstr(err.msg, "kda_chunk = 16"),
          "use_backend refuses kda_chunk 16: %s (%s)", k3c_status_name(rc), err.msg);
    CHECK(m.backend == NULL, "the model stays on the CPU");
    m.kda_chunk = 0;
    rc = k3c_model_use_backend_f64(&m, &only64, &err);
    CHECK(rc == K3C_EUNSUPPORTED && strstr(err.msg, "token recurrence"), "and the recurrence: %s", err.msg);
    m.kda_chunk = 64;
    CHECK_OK(k3c_model_use_backend_f64(&m, &only64, &err), &err);
    m.kda_chunk = 16; /* changed after binding: the layer's check catches it */
    CHECK(k3c_model_check_backend_f64(&m, m.backend, &err) == K3C_EUNSUPPORTED, "check after binding");
    m.kda_chunk = 64;
    CHECK_OK(k3c_model_use_backend_f64(&m, NULL, &err), &err);
    k3c_model_free_f64(&m);
}

/* The permutation steps against their adjoints in float64 (the CPU double table, host memory), on a plan with dead
 * slots: ⟨gather(x), u⟩ = ⟨x, gather_bwd(u)⟩, and combine's output y = combine(w, yperm) is linear in yperm and in w,
 * so ⟨y, v⟩ = ⟨yperm, dyperm(v)⟩ = Σ_i w_i · dw_i(v). Relative tolerance 1e-12 (sums of a few thousand doubles). */
static double dot(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
static void check_perm_adjoint(uint64_t seed) {
    const k3c_backend_f64 *be = k3c_backend_cpu_f64();
    bo_case c = {.op = OP_MOE_PERM, .a = 37, .b = 3, .c = 24, .d = 8, .x = 0.2};
    const int64_t T = c.a, k = c.b, D = c.c, S = T * k;
    k3c_rng r = {seed ^ 0x5eed, 0};
    double *pd = malloc(sizeof(double) * (size_t)(2 * S)), *h = calloc((size_t)(6 * T * D + 6 * S * D + 2 * S), 8);
    const int64_t live = (int64_t)perm_plan(&c, &r, pd, pd + S), n = live * D;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(2 * S)), *perm = pos + S;
    for (int64_t i = 0; i < 2 * S; i++) pos[i] = (int32_t)pd[i];
    double *x = h, *dx = x + T * D, *y = dx + T * D, *v = y + T * D, *u = v + T * D, *xp = u + n, *yp = xp + n,
           *dyp = yp + n, *w = dyp + n, *dw = w + S;
    for (int64_t i = 0; i < T * D; i++) x[i] = k3c_rng_normal(&r), v[i] = k3c_rng_normal(&r);
    for (int64_t i = 0; i < n; i++) u[i] = k3c_rng_normal(&r), yp[i] = k3c_rng_normal(&r);
    for (int64_t i = 0; i < S; i++) w[i] = k3c_rng_uniform(&r);
    k3c_err err = {0};
    CHECK_OK(be->moe_gather(live, k, D, perm, x, xp, &err), &err);
    CHECK_OK(be->moe_gather_bwd(T, k, D, pos, u, dx, &err), &err);
    CHECK_OK(be->moe_combine(T, k, D, pos, w, yp, y, &err), &err);
    CHECK_OK(be->moe_combine_bwd(T, k, D, pos, w, yp, v, dyp, dw, &err), &err);
    double g1 = dot(xp, u, n), g2 = dot(x, dx, T * D), c1 = dot(y, v, T * D), c2 = dot(yp, dyp, n), c3 = dot(w, dw, S);
    CHECK(live > 0 && live < S, "the plan has live and dead slots (%lld of %lld live)", (long long)live, (long long)S);
    CHECK(fabs(g1 - g2) <= 1e-12 * fabs(g1), "gather adjoint: %.17g vs %.17g", g1, g2);
    CHECK(fabs(c1 - c2) <= 1e-12 * fabs(c1), "combine adjoint in yperm: %.17g vs %.17g", c1, c2);
    CHECK(fabs(c1 - c3) <= 1e-12 * fabs(c1), "combine adjoint in w: %.17g vs %.17g", c1, c3);
    free(pd), free(h), free(pos);
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1             ? strtoull(argv[1], NULL, 0)
                    : getenv("K3C_SEED") ? strtoull(getenv("K3C_SEED"), NULL, 0)
                                         : (uint64_t)20261203; /* make test is reproducible; the GPU runs pass
                                                                                  a fresh seed (tools/device_cuda.sh) */
    printf("test_backend_ops: seed %llu (repeat with K3C_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    bo_rows R = {0};
    add_rows(&R);
    add_vision_rows(&R);
    bo_backend cpu64 = {.name = "cpu64", .f64 = k3c_backend_cpu_f64()};
    bo_backend cpu32 = {.name = "cpu32", .f32 = k3c_backend_cpu_f32()};
    bo_backend *cuda = NULL, *cuda_bf16 = NULL, *cuda_bf16c = NULL;
#ifdef K3C_CUDA
    static k3c_cuda_backend cb, cbf, cbc;
    /* bf16 GEMMs: operands rounded to 8 significant bits, sums in fp32 — 1e-2 as the bf16 KDA and attention; once as
       the backend is set up (K3C_CUDA_BF16_COPY, default 2: copies where they pay), once with every
       product on bf16 copies of its operands (gemm.cu bf16_copy 1) */
    bo_backend cudab = {.name = "cuda"}, cudabf = {.name = "cuda-bf16", .gemm_tol = 1e-2};
    bo_backend cudabc = {.name = "cuda-bf16-copies", .gemm_tol = 1e-2};
    k3c_err cerr = {0};
    if (k3c_cuda_backend_init(&cb, 0, K3C_GEMM_FP32, &cerr) == K3C_OK &&
        k3c_cuda_backend_init(&cbf, 0, K3C_GEMM_BF16, &cerr) == K3C_OK &&
        k3c_cuda_backend_init(&cbc, 0, K3C_GEMM_BF16, &cerr) == K3C_OK) {
        cbc.cu.bf16_copy = 1;
        cudab.f32 = &cb.table, cudab.cuda = &cb, cuda = &cudab;
        cudabf.f32 = &cbf.table, cudabf.cuda = &cbf, cuda_bf16 = &cudabf;
        cudabc.f32 = &cbc.table, cudabc.cuda = &cbc, cuda_bf16c = &cudabc;
        printf("CUDA backend on %s: every case also runs on it against the CPU float table, the GEMM-based ones "
               "also with bf16 GEMMs\n",
               cb.cu.name);
    } else
        printf("built with CUDA but no usable GPU (%s): CPU cases only\n", cerr.msg);
#endif
    check_supports(cuda);
    check_perm_adjoint(seed);
    k3c_rng rng = {seed, 0};
    for (int i = 0; i < R.n; i++) {
        bo_io tmpl;
        setup(&R.v[i], &tmpl, &rng);
        run_case(&cpu32, &cpu64, &R.v[i], &tmpl);
        if (cuda) run_case(cuda, &cpu32, &R.v[i], &tmpl);
        const int op = R.v[i].op;
        if (cuda_bf16 && (op == OP_LINEAR || op == OP_MLP || op == OP_MOE)) run_case(cuda_bf16, &cpu32, &R.v[i], &tmpl);
        if (cuda_bf16c && (op == OP_LINEAR || op == OP_MLP || op == OP_MOE))
            run_case(cuda_bf16c, &cpu32, &R.v[i], &tmpl);
        io_free(&tmpl);
    }
    bo_backend *bes[4] = {&cpu32, cuda, cuda_bf16, cuda_bf16c};
    for (int k = 0; k < 4; k++) {
        if (!bes[k]) continue;
        printf("%s against %s (%d rows skipped as unsupported):\n", bes[k]->name, k ? "cpu32" : "cpu64",
               bes[k]->skipped);
        for (int op = 0; op < OP_COUNT; op++)
            printf("  %-10s %4d cases  %5d checks passed  %d failed\n", op_names[op], bes[k]->rows[op],
                   bes[k]->passed[op], bes[k]->failed[op]);
    }
#ifdef K3C_CUDA
    if (cuda) k3c_cuda_backend_destroy(&cb), k3c_cuda_backend_destroy(&cbf), k3c_cuda_backend_destroy(&cbc);
#endif
    free(R.v);
    return test_summary();
}
