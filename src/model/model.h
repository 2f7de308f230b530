/* model.h — a Kimi-Linear / Kimi-K3 model on any backend (ops/backend.h): config → layer plan → parameters under
 * checkpoint names → forward to logits and loss → backward to every parameter gradient.
 * Spec: ARCHITECTURE.md §1, §3–§9; CHECKPOINTS.md §4–§7. */
#ifndef K3C_MODEL_MODEL_H
#define K3C_MODEL_MODEL_H

#include "base/real_decl.h"
#include "model/params.h"

/* A batch: T tokens packed as documents (cu_seqlens: n_docs + 1 offsets). targets[t] = the id to predict at t (−1 =
 * not counted); NULL targets = next token inside each document. */
typedef struct {
    int64_t T;
    int n_docs;
    const int32_t *ids;
    const int32_t *cu_seqlens;
    const int32_t *targets;
    double loss_norm; /* divisor of the summed loss (0 = the number of counted targets in this batch) */
} k3c_model_batch;

/* Per-MoE-layer routing statistics of the last forward (inputs of quantile balancing and load telemetry). */
typedef struct {
    int64_t T, k, n;
    int32_t *topk_ids; /* [T, k] */
    float *scores;     /* [T, n] sigmoid router scores s (unbiased) */
    float *cutoff;     /* [T] (k+1)-th biased score α_i */
} k3c_route_stats;

typedef struct {
    k3c_config cfg;
    k3c_dtype precision; /* K3C_F32 or K3C_F64: the `real` of w and g */
    k3c_param_table table;
    void *w;                           /* parameters, table.total reals */
    void *g;                           /* gradients (same layout) or NULL */
    int kda_chunk;                     /* 0 = token recurrence, else chunk size (16 or 64) */
    uint8_t recompute[K3C_MAX_LAYERS]; /* 1 = keep only the layer's residual-stream outputs; the backward re-runs its
                                          forward (activation memory of one layer instead of all of them) */
    k3c_route_stats *route; /* [num_layers] (entries of non-MoE layers stay empty); written by every forward, so one
                               model runs one forward at a time (threads parallelise inside the ops) */
    float *mla_smax;        /* NULL, or [num_layers, mla_heads]: each forward stores every MLA head's largest scaled
                               logit (S_max of QK-Clip) here; set by the trainer, owned by the caller */
    const void *backend;    /* the k3c_backend_f32/_f64 (ops/backend.h) that runs the ops and owns w, g and the arenas
                               of k3c_model_arena_init; NULL = the CPU reference of this precision */
} k3c_model;

/* Per-step activations, planned up front from the batch shape (k3c_model_plan_bytes) and carved from one arena. */
typedef struct k3c_acts k3c_acts;

#define K3C_MODEL_API(real, S)                                                                                            \
    /* Creates a model with zeroed parameters (and gradients when with_grad). */                                          \
    int k3c_model_create_##S(const k3c_config *cfg, int with_grad, k3c_model *m, k3c_err *err);                           \
    /* Random initialisation for training from scratch (seed; std = initializer_range). */                                \
    void k3c_model_init_##S(k3c_model *m, uint64_t seed, double std);                                                     \
    /* Loads every tensor of a checkpoint dir (F32/BF16/F16/F64; MXFP4 experts decoded exactly). Every parameter must   \
       be present and every tensor known; mismatches are errors naming the tensor. */ \
    int k3c_model_load_##S(k3c_model *m, const k3c_checkpoint *ck, k3c_err *err);                                         \
    /* Writes <dir>/model.safetensors (F32, checkpoint names, per-expert tensors) atomically. */                          \
    int k3c_model_save_##S(const k3c_model *m, const char *path, k3c_err *err);                                           \
    void k3c_model_free_##S(k3c_model *m);                                                                                \
    /* config.json + checkpoint of a directory → a loaded model. */                                                     \
    int k3c_model_open_##S(const char *dir, int with_grad, k3c_model *m, k3c_err *err);                                   \
    /* Moves w and g into memory of backend `be` (a const k3c_backend_##S *, ops/backend.h; NULL = the CPU) and runs \
       every later forward and backward there. The host can still read and write w and g (after be->sync). */    \
    int k3c_model_use_backend_##S(k3c_model *m, const void *be, k3c_err *err);                                            \
    /* K3C_EUNSUPPORTED naming the backend and the setting when backend `be` (NULL = the CPU) would ignore a setting of \
       m (its kda_chunk); use_backend and every KDA layer forward ask it. */ \
    int k3c_model_check_backend_##S(const k3c_model *m, const void *be, k3c_err *err);                                    \
    /* An activation arena of `bytes` (k3c_model_plan_bytes or more) in the backend's memory; release it with         \
       k3c_model_arena_free. */   \
    int k3c_model_arena_init_##S(const k3c_model *m, size_t bytes, k3c_arena *a, k3c_err *err);                           \
    void k3c_model_arena_free_##S(const k3c_model *m, k3c_arena *a);                                                      \
    /* Bytes of activations a forward+backward over T tokens needs. */                                                    \
    size_t k3c_model_plan_bytes_##S(const k3c_model *m, int64_t T, int n_docs);                                           \
    /* Forward to logits [T, V] (written to *logits_out if non-NULL, pointing into the arena) and the mean loss.       \
       `arena` must hold k3c_model_plan_bytes; activations stay there for the backward. */  \
    int k3c_model_forward_##S(k3c_model *m, const k3c_model_batch *b, k3c_arena *arena, k3c_acts **acts, double *loss,    \
                              real **logits_out, k3c_err *err);                                                           \
    /* Backward of the loss of the last forward: ADDS every parameter gradient into m->g (dloss = 1 · scale). */         \
    int k3c_model_backward_##S(k3c_model *m, k3c_acts *acts, double scale, k3c_err *err);

K3C_DECLARE_REAL(K3C_MODEL_API)

#endif
