/* model.h — internal to the library: the k3c_model struct behind include/k3c.h's model API (config, parameter table,
 * weights and gradients on any backend, ops/backend.h) and its routing statistics. Spec: docs/MODEL.md §1, §3–§9. */
#ifndef K3C_MODEL_MODEL_H
#define K3C_MODEL_MODEL_H

#include "base/real_decl.h"
#include "model/params.h"
#include "ops/moe.h"

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

/* Routed experts that live on other ranks (expert parallelism, src/parallel/ep.c): replaces the backend's moe_fwd /
 * moe_bwd of every MoE layer with the same contract (ops/moe.h: y overwritten; dx, dw*, dtopk_w added), exchanging
 * token rows with the ranks that hold the experts. Float32 models only (real_bytes 4); layer l keeps what its
 * backward needs until the next forward of l. */
typedef struct {
    int (*fwd)(void *ctx, int l, int real_bytes, const k3c_moe_sizes *s, const void *x, const int32_t *ids,
               const void *w, const void *w1, const void *w3, const void *w2, void *y, k3c_err *err);
    int (*bwd)(void *ctx, int l, int real_bytes, const k3c_moe_sizes *s, const void *x, const int32_t *ids,
               const void *w, const void *w1, const void *w3, const void *w2, const void *dy, void *dx, void *dw1,
               void *dw3, void *dw2, void *dw, k3c_err *err);
    void *ctx;
} k3c_expert_exchange;

/* Tensor parallelism (src/parallel/tp.c, docs/PARALLEL.md "Tensor parallelism"): the model holds only its rank's share of
 * every split tensor (k3c_residency.tp_rank, tp_size) and computes with it: rank r of `size` the KDA and MLA heads
 * [r·H/size, (r+1)·H/size), the same share of the rows of the dense MLP's and the shared experts' intermediate, of the
 * vocabulary rows of the embedding and lm_head (k3c_tp_split). sum() adds a partial result over the TP group in place
 * (after o_proj, the MLPs' down projections, and the input gradients of their backward); the embedding and the cross-
 * entropy are the vocabulary-parallel ones of the hook: y, lse, loss and dlogits with the layout of the ops they
 * replace (embedding_fwd / _bwd over this rank's rows E [V/size, D], ids global; xent over this rank's logits [T,
 * V/size], targets global). Buffers hold the model's real (t: K3C_F32 or K3C_F64) in the backend's memory, as the ops
 * they replace. */
typedef struct {
    int rank, size;
    int (*sum)(void *ctx, k3c_dtype t, void *x, int64_t n, k3c_err *err);
    int (*embed_fwd)(void *ctx, k3c_dtype t, int64_t T, int64_t V, int64_t D, const int32_t *ids, const void *E,
                     void *y, k3c_err *err);
    int (*embed_bwd)(void *ctx, k3c_dtype t, int64_t T, int64_t V, int64_t D, const int32_t *ids, const void *dy,
                     void *dE, k3c_err *err);
    int (*xent_fwd)(void *ctx, k3c_dtype t, int64_t T, int64_t V, double norm, const float *weight, const void *logits,
                    const int32_t *targets, void *lse, double *loss, k3c_err *err);
    int (*xent_bwd)(void *ctx, k3c_dtype t, int64_t T, int64_t V, double norm, const float *weight, const void *logits,
                    const int32_t *targets, const void *lse, double dloss, void *dlogits, k3c_err *err);
    void *ctx;
} k3c_tensor_parallel;

/* Context parallelism (src/parallel/cp.c, docs/PARALLEL.md "Context parallelism"): the batch's sequence is split into
 * contiguous token ranges over the ranks of a CP group, and the sequence-mixing layers exchange what crosses a range
 * boundary through this hook: the short-conv tails and the KDA state go rank to rank (their gradients back), MLA
 * gathers the normalised latent and the shared k_pe slot of every token (its gradient reduce-scattered back). The
 * fields describe this rank's range of the last split batch; the buffers hold the model's `real`, in the backend's
 * memory. */
typedef struct {
    int64_t start;          /* this rank's first token in its sequence */
    int64_t first_len;      /* tokens of the first local document piece */
    int cont_prev;          /* 1: the first local piece continues a document of the previous rank */
    int cont_next;          /* 1: the next rank's first piece continues this rank's last */
    const int32_t *cu_rest; /* offsets of the local pieces after the first, from the second's start (n_docs − 1) */
    const int32_t *cu_rest_ops; /* the same in the backend's memory (what the ops read) */
    int64_t T_keys;             /* MLA keys: the tokens [0, start + T) of the sequence ... */
    int n_docs_keys;
    const int32_t *cu_keys; /* ... and their document offsets (backend memory) */
    int64_t T_cap;          /* most tokens of a sequence (sizes the activation plan's key-side buffers) */
    /* 1: the "ranks" are one process's slices of the sequence, run in turn (sliced recompute, model/slice.c): the
       query rows before start hold the earlier slices' queries of the same layer, S_max is taken at the last slice */
    int sliced;
    /* Short conv i (0..2: q, k, v) of layer l: sends the last W−1 rows of x [T, C] to the next rank (cont_next) and
       points *state at the previous rank's (cont_prev; [C, W−1], zero before the document's start), else NULL. */
    int (*conv_tail)(void *ctx, int l, int i, const void *x, int64_t T, int64_t C, int W, void **state, k3c_err *err);
    /* Its backward: sends dstate [C, W−1] to the previous rank (cont_prev) and adds the next rank's into the last W−1
       rows of dx [T, C] (cont_next). */
    int (*conv_tail_bwd)(void *ctx, int l, int i, const void *dstate, void *dx, int64_t T, int64_t C, int W,
                         k3c_err *err);
    /* KDA state [H, dk, dv] of layer l: buffer `which` (K3C_CP_H0 .. K3C_CP_DH0; NULL when that side has no
       neighbour in the document), and the pass that fills or sends it (H0: receive from the previous rank, HT: send
       to the next, DHT: receive from the next, DH0: send to the previous; DH0, which the backward adds into, is zero at
       the step's start). */
    void *(*kda_buf)(void *ctx, int l, int which);
    int (*kda_pass)(void *ctx, int l, int which, k3c_err *err);
    /* MLA layer l: the latent rows [T_cap, kv_lora_rank + qk_rope_dim] of the whole sequence (which 0; this rank
       writes rows start.., mla_gather fills the others) and their gradient (which 1; zero at the step's start, every rank
       adds the rows it used, mla_scatter sums them over the group, leaving this rank's rows at start). */
    void *(*mla_buf)(void *ctx, int l, int which);
    int (*mla_gather)(void *ctx, int l, k3c_err *err);
    int (*mla_scatter)(void *ctx, int l, k3c_err *err);
    void *ctx;
} k3c_context_exchange;

enum { K3C_CP_H0 = 0, K3C_CP_HT = 1, K3C_CP_DHT = 2, K3C_CP_DH0 = 3 };

/* Called by the backward after layer l's backward (l from l1 − 1 down to l0), and with l = num_layers after the head's
 * (a range that ends at the last layer): every gradient entry of layer l (table entries with layer == l; for
 * num_layers the final mix, norm and lm_head after the layers) is final for this backward, nothing later in it writes
 * them, so the caller may start reducing them while the backward goes on (data parallelism, src/parallel/dp.c,
 * docs/PARALLEL.md "Data parallelism (ZeRO-1)"). On a device backend the gradients may still be in flight on the
 * backend's stream: the callee orders its reads after it (the NCCL communicator does). */
typedef struct {
    int (*layer_done)(void *ctx, int l, k3c_err *err);
    void *ctx;
} k3c_grad_hook;

/* A residual-stream tensor of a step, by index: the embedding, P after layer l's attention (pmid), or after its FFN
 * (pend). Depth mixes list their sources this way so the backward finds each source's gradient buffer. */
#define K3C_SRC_EMB (-1)
#define K3C_SRC_MID(l) (2 * (l))
#define K3C_SRC_END(l) (2 * (l) + 1)

/* The state at the boundary before layer l (MODEL.md §5.3): the completed blocks R (the embedding, then each block's
 * last P) and the running partial sum P, in that order, as K3C_SRC_* indices (src holds K3C_ATTNRES_MAX_SOURCES);
 * returns their count (without AttnRes 1: P, the plain residual stream). A pure function of l, so a recomputed layer
 * sees the same sources, and the layers from l on read nothing else of the layers before it: a pipeline stage passes
 * exactly these tensors on (docs/PARALLEL.md "Pipeline parallelism"). */
static inline int k3c_boundary_sources(const k3c_config *c, int l, int *src) {
    int n = 0;
    for (int j = 0; c->attn_res_block > 0 && j < l; j++)
        if (j % c->attn_res_block == 0) src[n++] = j == 0 ? K3C_SRC_EMB : K3C_SRC_END(j - 1);
    src[n++] = l == 0 ? K3C_SRC_EMB : K3C_SRC_END(l - 1);
    return n;
}

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
    int64_t recompute_slice; /* > 0: a recomputed layer runs its forward and its backward in slices of this many
                                tokens (TRAINING.md §1.4 "Sliced recompute"): its working set is one slice's; 0 = off */
    int64_t head_chunk;      /* > 0: the head computes its logits, loss and gradients in chunks of this many tokens
                                (TRAINING.md §1.4 "Chunked head"): it keeps lse [T], never the logits [T, V]; 0 = off */
    double aux_loss_alpha; /* > 0: every router's auxiliary balancing loss α·L_aux (ops/moe.h) is part of the objective;
                              the backward adds its gradient, the reported loss stays the cross-entropy (0 = none) */
    k3c_arena meta;        /* host memory of the last forward's bookkeeping (its k3c_acts, pointer tables), reused by
                              every forward: one model runs one step at a time */
    k3c_step_stats *stats; /* NULL, or where every forward records route statistics and S_max (owned by the caller,
                              in this model's backend memory; float models only) */
    const void *backend;   /* the k3c_backend_f32/_f64 (ops/backend.h) that runs the ops and owns w, g and the arenas
                               of k3c_model_arena_init; NULL = the CPU reference of this precision */
    const k3c_expert_exchange *experts;  /* NULL, or expert parallelism: the routed experts of every MoE layer */
    const k3c_tensor_parallel *tp;       /* NULL, or tensor parallelism: this rank's heads, widths and vocabulary */
    const k3c_context_exchange *context; /* NULL, or context parallelism: this rank holds a range of the sequence */
    const k3c_grad_hook *grads;          /* NULL, or called as the head's and each layer's gradients are final */
    struct k3c_weights *views;           /* views of w the forward reads its weights through (model/weights.h) */
    const void *views_of;                /* the w they were built over (rebuilt when w moves to another backend) */
} k3c_model;

/* Step statistics for forwards of up to T tokens in the model's backend memory (with S_max when the model has MLA
 * layers); free them with k3c_step_stats_free while that backend is still the model's. */
int k3c_step_stats_init_f32(const k3c_model *m, int64_t T, k3c_step_stats *s, k3c_err *err);
void k3c_step_stats_free_f32(const k3c_model *m, k3c_step_stats *s);
int k3c_step_stats_init_f64(const k3c_model *m, int64_t T, k3c_step_stats *s, k3c_err *err);
void k3c_step_stats_free_f64(const k3c_model *m, k3c_step_stats *s);
/* K3C_EUNSUPPORTED naming the backend and the setting when backend `be` (NULL = the CPU) would ignore a setting of m
 * (its kda_chunk); use_backend and every KDA layer forward ask it. */
int k3c_model_check_backend_f32(const k3c_model *m, const void *be, k3c_err *err);
int k3c_model_check_backend_f64(const k3c_model *m, const void *be, k3c_err *err);

/* The views of m's parameters a forward reads (model/weights.h), built on first use and again after w moved. */
#define K3C_MODEL_VIEWS_API(real, S) const struct k3c_weights *k3c_model_views_##S(k3c_model *m, k3c_err *err);
K3C_DECLARE_REAL(K3C_MODEL_VIEWS_API)

/* The model over a range of layers [l0, l1) (0 <= l0 < l1 <= L; k3c_model_forward / backward are the range [0, L)).
 * l0 == 0 starts from the embedding of b->ids, else from `in`: the k3c_boundary_sources(l0) tensors [T, D] in backend
 * memory, read in place (keep them until the backward). l1 == L ends with the final mix, norm, lm_head and the loss
 * (*loss; else 0); else the boundary tensors before l1 stay in the acts (k3c_acts_boundary). The backward adds dout
 * (l1 < L: the gradients of the tensors after the range, k3c_boundary_sources(l1) order) and leaves the gradients of
 * the tensors before it (l0 > 0) in the acts. */
#define K3C_MODEL_RANGE_API(real, S)                                                                                   \
    size_t k3c_model_plan_bytes_range_##S(const k3c_model *m, int64_t T, int n_docs, int l0, int l1);                  \
    int k3c_model_forward_range_##S(k3c_model *m, const k3c_model_batch *b, int l0, int l1, real *const *in,           \
                                    k3c_arena *arena, k3c_acts **acts, double *loss, k3c_err *err);                    \
    int k3c_model_backward_range_##S(k3c_model *m, k3c_acts *a, double scale, const real *const *dout, k3c_err *err);  \
    /* The boundary after the range (grads 0: the tensors a forward left) or the gradients of the boundary before it \
       (grads 1, after the backward): x[i] for each k3c_boundary_sources entry; returns their count. */ \
    int k3c_acts_boundary_##S(const k3c_acts *a, int grads, real **x);
K3C_DECLARE_REAL(K3C_MODEL_RANGE_API)

#endif
