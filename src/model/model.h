/* model.h — internal to the library: the k3c_model struct behind include/k3c.h's model API (config, parameter table,
 * weights and gradients on any backend, ops/backend.h) and its routing statistics. Spec: ARCHITECTURE.md §1, §3–§9. */
#ifndef K3C_MODEL_MODEL_H
#define K3C_MODEL_MODEL_H

#include "base/real_decl.h"
#include "model/params.h"

/* Per-MoE-layer routing statistics of the last forward (inputs of quantile balancing and load telemetry). */
typedef struct {
    int64_t T, k, n;
    int32_t *topk_ids; /* [T, k] */
    float *scores;     /* [T, n] sigmoid router scores s (unbiased) */
    float *cutoff;     /* [T] (k+1)-th biased score α_i */
} k3c_route_stats;

/* The struct behind k3c.h's k3c_model: parameters, plan and the backend that runs them. */
typedef struct k3c_model {
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

#endif
