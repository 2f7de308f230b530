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

/* Per-MoE-layer routing statistics of one forward (inputs of quantile balancing and load telemetry), in backend
 * memory. */
typedef struct {
    int64_t T, k, n;   /* T = tokens of the last forward (0: not an MoE layer, or nothing recorded yet) */
    int32_t *topk_ids; /* [T, k] */
    float *logits;     /* [T, n] router logits (QB takes the unbiased scores s = sigmoid(logits) from them) */
    float *cutoff;     /* [T] (k+1)-th biased score α_i */
} k3c_route_stats;

/* What a forward records for the step that follows it (QB, QK-Clip, telemetry): a caller-owned struct whose buffers
 * live in the backend's memory (k3c_step_stats_init), written by the forward's ops on the backend's stream, never
 * read by the model itself, so the forward needs no host synchronisation for them. The topk_ids of every MoE layer
 * come first and contiguous, followed by qk_clipped, so the host can fetch the telemetry with one download
 * (telemetry_bytes from mem). */
typedef struct {
    int64_t cap_T; /* tokens the buffers hold */
    k3c_route_stats route[K3C_MAX_LAYERS];
    float *smax;         /* [num_layers, mla_heads] largest scaled logit per MLA head (QK-Clip's S_max); NULL: none */
    int32_t *qk_clipped; /* [1] written by the backend's qk_clip */
    void *mem;
    size_t telemetry_bytes;
} k3c_step_stats;

typedef struct {
    k3c_config cfg;
    k3c_dtype precision; /* K3C_F32 or K3C_F64: the `real` of w and g */
    k3c_param_table table;
    void *w;                           /* parameters, table.total reals */
    void *g;                           /* gradients (same layout) or NULL */
    int kda_chunk;                     /* 0 = token recurrence, else chunk size (16 or 64) */
    uint8_t recompute[K3C_MAX_LAYERS]; /* 1 = keep only the layer's residual-stream outputs; the backward re-runs its
                                          forward (activation memory of one layer instead of all of them) */
    k3c_arena meta;        /* host memory of the last forward's bookkeeping (its k3c_acts, pointer tables), reused by
                              every forward: one model runs one step at a time */
    k3c_step_stats *stats; /* NULL, or where every forward records route statistics and S_max (owned by the caller,
                              in this model's backend memory; float models only) */
    const void *backend;   /* the k3c_backend_f32/_f64 (ops/backend.h) that runs the ops and owns w, g and the arenas
                               of k3c_model_arena_init; NULL = the CPU reference of this precision */
} k3c_model;

struct k3c_backend_f32;
struct k3c_backend_f64;

/* Per-step activations, planned up front from the batch shape (k3c_model_plan_bytes) and carved from one arena. */
typedef struct k3c_acts k3c_acts;

#define K3C_MODEL_API(real, S)                                                                                            \
    /* Creates a model with zeroed parameters (and gradients when with_grad). */                                          \
    int k3c_model_create_##S(const k3c_config *cfg, int with_grad, k3c_model *m, k3c_err *err);                           \
    /* Random initialisation for training from scratch (seed; std = initializer_range). Writes w from the host: call \
       it (and k3c_model_load) before k3c_model_use_backend moves the model to a device. */    \
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
       every later forward and backward there. The host reads and writes them through be->download / be->upload. */    \
    int k3c_model_use_backend_##S(k3c_model *m, const void *be, k3c_err *err);                                            \
    /* The backend the model runs on (its own, or the CPU reference of this precision). */                                \
    const struct k3c_backend_##S *k3c_model_backend_##S(const k3c_model *m);                                              \
    /* Step statistics for forwards of up to T tokens in the model's backend memory (with S_max when the model has MLA \
       layers); free them with k3c_step_stats_free while that backend is still the model's. */  \
    int k3c_step_stats_init_##S(const k3c_model *m, int64_t T, k3c_step_stats *s, k3c_err *err);                          \
    void k3c_step_stats_free_##S(const k3c_model *m, k3c_step_stats *s);                                                  \
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
