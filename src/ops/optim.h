/* optim.h — AdamW, Per-Head Muon (Newton–Schulz-5), k3c_optim over a parameter table and gradient-norm clipping: the
 * optimizer ops of a training step (CPU here; CUDA twins in cuda/optim.cu). Spec: docs/MODEL.md §10.1, §10.3,
 * docs/TRAINING.md §1.3 (defaults). Below the backend table (ops/backend.h), so every backend's step shares this layout. */
#ifndef K3C_OPS_OPTIM_H
#define K3C_OPS_OPTIM_H

#include "base/base.h"
#include "ops/param_table.h"

/* Everything here works on float32 buffers laid out like the parameter table: w, g are table.total floats. */

/* ================================================================ AdamW (decoupled weight decay)
 *   m ← β1 m + (1 − β1) g;  v ← β2 v + (1 − β2) g²;  m̂ = m / (1 − β1^t);  v̂ = v / (1 − β2^t)
 *   w ← w (1 − lr·wd) − lr · m̂ / (sqrt(v̂) + eps)
 * This is torch.optim.AdamW's form (eps outside the bias-corrected root). Moonlight's toy AdamW adds eps before the
 * bias correction, which equals eps' = eps·sqrt(1 − β2^t) here; the difference only matters while sqrt(v̂) ~ eps.
 * t = step ≥ 1 counts the updates including this one. Elementwise, so the result does not depend on the thread
 * count. */
typedef struct {
    double beta1, beta2, eps;
} k3c_adamw_hp;

void k3c_adamw_update(const k3c_adamw_hp *hp, float *w, const float *g, float *m, float *v, int64_t n, double lr,
                      double wd, int64_t step);

/* ================================================================ Muon (§10.1) and Per-Head Muon (§10.3)
 * NS5: X ← G / (‖G‖_F + 1e-7), transposed when rows > cols; `steps` times: P = X Xᵀ; X ← aX + (bP + cP²)X;
 * transposed back.
 * Float32 with cblas_sgemm: bitwise reproducible for a fixed OpenBLAS thread count. */
#define K3C_NS_A 3.4445
#define K3C_NS_B (-4.7750)
#define K3C_NS_C 2.0315
#define K3C_NS_EPS 1e-7

/* Floats of workspace k3c_newton_schulz needs for a [rows, cols] matrix. */
size_t k3c_ns_workspace(int64_t rows, int64_t cols);
/* O = NS(G) ([rows, cols] both; O may alias G). steps = 0 returns the normalised G. */
int k3c_newton_schulz(const float *G, int64_t rows, int64_t cols, int steps, float *O, float *ws, k3c_err *err);

typedef struct {
    double momentum; /* μ = 0.95 */
    int nesterov;    /* 1: orthogonalise G + μM (default); 0: orthogonalise M */
    int ns_steps;    /* 5 */
    double scale;    /* 0.2: the update is scale·sqrt(max(rows, cols))·O, the AdamW-matching RMS of §10.1 */
} k3c_muon_hp;

/* Floats of workspace k3c_muon_update needs for one [rows, cols] matrix in row blocks of head_rows (0 = whole). */
size_t k3c_muon_workspace(int64_t rows, int64_t cols, int64_t head_rows);
/* One Muon step on one matrix W [rows, cols] with gradient G and momentum M (same shape):
 *   M ← μM + G;  G̃ = G + μM (Nesterov) or M;  W ← W(1 − lr·wd) − lr · scale · sqrt(max(A, B)) · NS(G̃)
 * With head_rows > 0 the matrix is rows/head_rows row blocks [head_rows, cols]; each is orthogonalised on its own and
 * scaled with A = head_rows, B = cols (Per-Head Muon). K3C_EINVAL if head_rows does not divide rows. */
int k3c_muon_update(const k3c_muon_hp *hp, float *w, const float *g, float *mom, int64_t rows, int64_t cols,
                    int64_t head_rows, double lr, double wd, float *ws, k3c_err *err);

/* ================================================================ the combined optimizer
 * MATRIX entries: Muon (or AdamW when matrix_optimizer = ADAMW), weight decay; stacked experts: one matrix per slice.
 * EMBED, HEAD: AdamW with weight decay. VECTOR: AdamW, no weight decay unless decay_vectors (params.h; Moonlight decays
 * everything). ROUTER_BIAS: never touched (QB owns it). Only the first `used` elements of an entry are updated (A_log
 * padding stays as loaded). The same lr drives Muon and AdamW (Moonlight), the per-entry split is table order. */
typedef enum { K3C_MATRIX_MUON = 0, K3C_MATRIX_ADAMW = 1 } k3c_matrix_optimizer;
/* The Newton–Schulz precision (docs/MODEL.md §10.4): AUTO is the backend's own (the GPU: bf16 products with fp32
 * accumulation, as the Muon reference runs them, except in its fp32 GEMM checking mode; the CPU: fp32); FP32
 * everywhere; BF16 only on the GPU (the CPU's step returns K3C_EUNSUPPORTED rather than run something else than
 * asked). */
typedef enum { K3C_MUON_AUTO = 0, K3C_MUON_FP32 = 1, K3C_MUON_BF16 = 2 } k3c_muon_precision;

typedef struct {
    /* hyper-parameters (k3c_optim_defaults sets the Moonlight values of docs/TRAINING.md §1.3) */
    double lr; /* peak lr, for the caller's schedule; k3c_optim_step takes the current lr */
    double beta1, beta2, eps;
    double weight_decay; /* λ = 0.1 */
    int decay_vectors;   /* 0 */
    double muon_momentum;
    int nesterov;
    int ns_steps;
    double muon_scale;    /* 0.2 */
    int per_head;         /* honour k3c_param.head_rows (1, K3) or orthogonalise whole matrices (0, Moonlight) */
    int matrix_optimizer; /* k3c_matrix_optimizer */
    int muon_precision;   /* k3c_muon_precision (AUTO) */
    /* filled by k3c_optim_init (read-only for callers) */
    int n_entries;
    size_t *state_off;  /* [n_entries]: float offset of entry i's state (Muon: momentum; AdamW: m, then v) */
    size_t state_numel; /* floats of optimizer state */
    float *ws;          /* Newton–Schulz workspace for the largest matrix */
    size_t ws_numel;
} k3c_optim;

void k3c_optim_defaults(k3c_optim *o);
/* "muon" / "adamw" → k3c_matrix_optimizer; K3C_EINVAL otherwise. */
int k3c_optim_parse_matrix(const char *name, int *out, k3c_err *err);
/* "auto" / "fp32" / "bf16" → k3c_muon_precision; K3C_EINVAL otherwise. */
int k3c_optim_parse_muon_precision(const char *name, int *out, k3c_err *err);
/* K3C_EUNSUPPORTED when o asks for a Newton–Schulz precision the CPU does not run (bf16); every CPU step checks it. */
int k3c_optim_check_cpu(const k3c_optim *o, k3c_err *err);
/* Floats of state for table t under o's hyper-parameters (the caller allocates and zeroes them: zero = step 0). */
size_t k3c_optim_state_numel(const k3c_optim *o, const k3c_param_table *t);
/* Validates the hyper-parameters against t and allocates the layout and workspace (k3c_optim_free before re-init). */
int k3c_optim_init(k3c_optim *o, const k3c_param_table *t, k3c_err *err);
/* Floats of entry i's state under o's layout (Muon: numel; AdamW: 2·numel; the router bias: 0). */
static inline size_t k3c_optim_entry_floats(const k3c_optim *o, int i) {
    return (i + 1 < o->n_entries ? o->state_off[i + 1] : o->state_numel) - o->state_off[i];
}
/* The state layout alone (state_off, state_numel; no workspace: it cannot step): where entries' state lies, e.g. in a
 * checkpoint of another table. */
int k3c_optim_layout(k3c_optim *o, const k3c_param_table *t, k3c_err *err);
void k3c_optim_free(k3c_optim *o);
/* One update of every entry of t (w, g: t->total floats; state: k3c_optim_state_numel floats) with learning rate lr;
 * step ≥ 1 is the 1-based update count (AdamW bias correction). g is not modified. */
int k3c_optim_step(k3c_optim *o, const k3c_param_table *t, float *w, const float *g, float *state, double lr,
                   int64_t step, k3c_err *err);
/* K3C_EINVAL unless o was initialised for t, 0 ≤ first ≤ last ≤ t->n, step ≥ 1 and lr is finite (every backend's step
 * checks its arguments with this). */
int k3c_optim_check_step(const k3c_optim *o, const k3c_param_table *t, int first, int last, double lr, int64_t step,
                         k3c_err *err);
/* The same for entries [first, last) only (pipeline stages or ZeRO owners step their own entries). */
int k3c_optim_step_entries(k3c_optim *o, const k3c_param_table *t, int first, int last, float *w, const float *g,
                           float *state, double lr, int64_t step, k3c_err *err);

/* ================================================================ gradient-norm clipping
 * ‖g‖₂ over every entry except ROUTER_BIAS, accumulated in double over fixed 32K-element blocks summed in order, so the
 * value is bitwise the same for any thread count. */
double k3c_grad_norm(const k3c_param_table *t, const float *g);
/* Returns the pre-clip norm; when max_norm > 0 and the norm exceeds it, scales those entries of g by
 * max_norm / (norm + 1e-6) (torch's clip_grad_norm_). A non-finite norm is returned with g untouched (skip the
 * step). */
double k3c_clip_grad_norm(const k3c_param_table *t, float *g, double max_norm);

#endif
