/* dp.h — data parallelism with ZeRO-1 for the trainer: the run config's "parallel" layout checked against the world
 * and the model, the global batch split at document boundaries, gradients reduce-scattered to their owners, the optimizer state
 * sharded by whole parameter-table entries (one owner rank per entry: Per-Head Muon's head blocks and expert slices
 * never straddle ranks), parameters all-gathered after the step, QK-Clip's S_max and quantile balancing's router
 * statistics taken over the global batch. Spec: docs/PARALLEL.md "Data parallelism (ZeRO-1)". */
#ifndef K3C_DIST_DP_H
#define K3C_DIST_DP_H

#include "parallel/comm.h"
#include "parallel/tp.h"
#include "model/model.h"
#include "ops/backend.h"

/* ---------------------------------------------------------------- data parallelism with ZeRO-1 (dp.c) */
/* A piece of the overlapped gradient reduce-scatter: a run of table entries that one layer's backward completes (or
 * the embedding's, or the head's), reduce-scattered on its own to the owners of its elements. */
typedef struct {
    int e0, e1;     /* its table entries (one layer's, one class: expert entries or the others) */
    int x;          /* its class: 1 expert entries, summed and owned inside the expert group (xcomm); 2 tensor-
                          parallel shares, inside the ranks of this TP rank (tcomm); 0 the others, over comm */
    int layer;      /* the layer whose backward completes them; num_layers: the head (completed first); −1: the
                          embedding (started by k3c_dp_grads_finish) */
    int64_t off;    /* its first element in w and g */
    int64_t *count; /* [its group's size] elements of it each rank owns (in rank order, consecutive) */
    int64_t *displ; /* [size] where each rank's elements start, from off */
    int64_t s_off;  /* its first optimizer-state float in the full (single-process) layout */
    int64_t *s_count, *s_displ; /* [size] the same for its optimizer state */
    int64_t at, s_at;           /* where this rank's part lands in g_shard, in the state shard */
    k3c_comm_req *req;          /* in flight, or NULL */
    int started;
} k3c_dp_piece;

typedef struct {
    k3c_comm *comm;            /* the data-parallel group (not owned) */
    k3c_comm *xcomm;           /* expert residency: the ranks holding this rank's experts (not owned); NULL: none */
    k3c_comm *tcomm;           /* tensor-parallel shares: the ranks of comm with this rank's TP rank (not owned) */
    k3c_comm *tpcomm;          /* the TP group (not owned); NULL: no tensor parallelism */
    const k3c_backend_f32 *be; /* whose memory holds w, g, the state and the gathered router statistics */
    int rank, size;
    int part, parts;      /* this rank's part of the batch (rank, size; tensor parallelism: rank / tp, size / tp) */
    int replica;          /* 1: a TP rank other than the group's first, whose loss and router statistics repeat its */
    int *owner;           /* [t->n] the owner of each entry (a rank of comm, of xcomm for expert entries); −1: none */
    uint8_t *mine;        /* [t->n] 1: this rank owns the entry (steps it, holds its state) */
    size_t g_off, g_len;  /* the elements of the group's entries (all of them, or a pipeline stage's) */
    int64_t g_mine;       /* elements this rank owns */
    int64_t *ones, *iota; /* [size] 1, 1, …; 0, 1, … (counts of one-element gathers) */
    k3c_optim shard;      /* the optimizer restricted to this rank's entries: state offsets into its shard */
    int32_t *cu;          /* the local batch's cu_seqlens */
    int cu_cap;
    int64_t T_local;  /* tokens of this rank's part of the last training batch (0 on a TP replica) */
    int64_t *T_all;   /* [size] tokens of every rank's part */
    float *route_buf; /* gathered router logits and cutoffs of one layer (backend memory) */
    size_t route_cap;
    float *g_shard; /* this rank's entries of the reduce-scattered gradient (backend memory, g_mine floats, in piece
                       order) */
    k3c_dp_piece *piece; /* the group's entries cut at layer (and class) boundaries */
    int n_pieces;
    int hooked;    /* pieces the last backward started (layer_done); the rest start in _finish */
    int in_flight; /* pieces started and not yet waited for */
    float *ov_g;   /* the gradient being reduced between _begin and _finish; NULL: none */
    const k3c_param_table *ov_t;
    const k3c_tp *ov_tp; /* tensor parallelism: replicated entries counted once (k3c_tp_dedup_grads_range) */
    k3c_grad_hook hook;  /* what the model calls while _begin holds it */
    /* Muon of a tensor-parallel share that needs its whole matrix (whole-matrix Muon, or a column share): each owner
       gathers the entry's weight, gradient and momentum over the TP group, one rank of the group (in turn) steps the
       whole matrix and broadcasts it, and each keeps its share. whole: a table of those entries at their whole shape (all at offset
       0: one staging of the largest), its optimizer and backend instance; stage: 4 · whole.total floats. */
    uint8_t *whole_step; /* [t->n] 1: one of those entries */
    int *whole_at;       /* [t->n] its entry in `whole` */
    k3c_param_table whole;
    k3c_optim whole_opt;
    void *whole_inst;
    float *stage;
} k3c_dp;

/* The groups of data parallelism with ZeRO-1 (see k3c_dp_init_groups). */
typedef struct {
    k3c_comm *comm;   /* the data-parallel group (every rank, or a pipeline stage's) */
    k3c_comm *xcomm;  /* expert residency: the ranks of comm holding this rank's experts; NULL: none */
    k3c_comm *tcomm;  /* tensor parallelism: the ranks of comm with this rank's TP rank; NULL: none */
    k3c_comm *tpcomm; /* tensor parallelism: this rank's TP group (consecutive ranks of comm); NULL: none */
} k3c_dp_groups;

/* o: the optimizer initialised for t (full layout); the shard shares its workspace. Owners: consecutive entries, about
 * 1/size of the elements each, an entry never split. w, g, the state and the router
 * statistics live in be's memory: a device backend needs a device communicator (k3c_comm_check_memory). */
int k3c_dp_init(k3c_dp *dp, k3c_comm *comm, const k3c_backend_f32 *be, const k3c_optim *o, const k3c_param_table *t,
                k3c_err *err);
/* The same over the table entries [e0, e1) only (a pipeline stage's parameters): the owners split them, the gradient
 * sum and the gathers cover them alone. */
int k3c_dp_init_range(k3c_dp *dp, k3c_comm *comm, const k3c_backend_f32 *be, const k3c_optim *o,
                      const k3c_param_table *t, int e0, int e1, k3c_err *err);
/* The same under an expert residency (expert parallelism, k3c_model_create_resident): the stacked routed-expert
 * entries of t hold this rank's experts, and xcomm is the ranks of comm that hold the same ones (one per data-parallel
 * replica): those entries are summed, owned and gathered over xcomm, the others over comm. Every rank's global norm
 * then counts each expert once. xcomm NULL: k3c_dp_init_range. */
int k3c_dp_init_experts(k3c_dp *dp, k3c_comm *comm, k3c_comm *xcomm, const k3c_backend_f32 *be, const k3c_optim *o,
                        const k3c_param_table *t, int e0, int e1, k3c_err *err);
/* The same with tensor parallelism inside the group (g->tpcomm: tp consecutive ranks sharing one part of the batch,
 * rank r taking part r / tp; only the first rank of each TP group adds its loss to k3c_dp_sum and its router
 * statistics to k3c_dp_gather_route). t holds this rank's tensor-parallel shares (k3c_residency.tp_rank, tp_size):
 * the split entries are summed, owned and gathered over g->tcomm (owner d of share t on the rank of TP rank t in
 * replica d, so a TP group owns all shares of an entry or none), the replicated ones over g->comm. */
int k3c_dp_init_groups(k3c_dp *dp, const k3c_dp_groups *g, const k3c_backend_f32 *be, const k3c_optim *o,
                       const k3c_param_table *t, int e0, int e1, k3c_err *err);
void k3c_dp_free(k3c_dp *dp);

/* Part `part` of `parts` of a packed batch: its document pieces [*d0, *d1), consecutive and whole, the split points the
 * piece boundaries nearest to equal token shares, at least one piece each (n_docs >= parts). */
void k3c_batch_part(const int32_t *cu, int n_docs, int64_t T, int part, int parts, int *d0, int *d1);
/* The same with every split point at a token offset that is a multiple of mult where such a boundary exists (context
 * parallelism: parts that cp divides). */
void k3c_batch_part_aligned(const int32_t *cu, int n_docs, int64_t T, int part, int parts, int mult, int *d0, int *d1);

/* b (the global batch every rank loaded) becomes this rank's part: consecutive whole document pieces, the split
 * points the piece boundaries nearest to equal token shares; loss_norm = the counted targets of the whole batch, so
 * the ranks' losses and gradients add up to the single-process mean. K3C_EINVAL when the batch has fewer pieces than
 * ranks. */
int k3c_dp_split_batch(k3c_dp *dp, k3c_model_batch *b, k3c_err *err);
/* The split alone: b ← part `part` of `parts` (split points at multiples of mult where there are such; the pieces'
 * offsets in dp's buffer), loss_norm = the counted targets of the whole batch; errors name `who`. */
int k3c_dp_take_part(k3c_dp *dp, k3c_model_batch *b, int part, int parts, int mult, const char *who, k3c_err *err);
/* This rank ran T tokens of the step's batch (its router statistics): every rank's count gathered for
 * k3c_dp_gather_route. */
int k3c_dp_local_tokens(k3c_dp *dp, int64_t T, k3c_err *err);
/* *x ← the sum of x over the ranks (the loss). */
int k3c_dp_sum(k3c_dp *dp, double *x, k3c_err *err);
/* ZeRO-1's gradient reduce-scatter: this rank's entries (mine) of g ← their sum over the ranks, the rest of the
 * group's entries zeroed (every entry then lives on its owner alone, so norms over the table count it once). */
int k3c_dp_reduce_grads(k3c_dp *dp, float *g, k3c_err *err);
/* The same reduce-scatter overlapped with the backward: _begin attaches a hook to m (m->grads) that, as the backward
 * completes the head's gradients and then each layer's, starts the reduce-scatter of those entries (with tp: their
 * replicated entries zeroed first on TP ranks other than 0, as k3c_tp_dedup_grads does) and returns at once; _finish
 * detaches it, starts the rest (the embedding), waits for every piece and leaves g as k3c_dp_reduce_grads does (the
 * same sums, each over the same ranks' same elements). Float32 models; every rank of the group calls both around
 * the same backwards. Under pipeline parallelism only the last micro-batch's backward may complete a layer (pp.c
 * passes the hook to it alone). Between the two, m->g's entries of started pieces must stay untouched. */
int k3c_dp_grads_begin(k3c_dp *dp, k3c_model *m, const k3c_tp *tp, k3c_err *err);
int k3c_dp_grads_finish(k3c_dp *dp, k3c_model *m, k3c_err *err);
/* Global-norm clipping of the owners' gradients: this rank's squared norm (its entries) summed over the group and,
 * pp_comm non-NULL, over the pipeline's stages; then its entries scaled by the coefficient of the global norm.
 * *norm: the global norm before clipping (max_norm <= 0: the norm only). */
int k3c_dp_clip_grad_norm(k3c_dp *dp, k3c_comm *pp_comm, void *inst, const k3c_param_table *t, float *g,
                          double max_norm, double *norm, k3c_err *err);
/* out (backend memory, t->total floats) ← every owner's reduced entries of the group's range, zero elsewhere (the
 * whole gradient of the group; tests and debugging: the step itself needs only the owners' parts). */
int k3c_dp_gather_grads(k3c_dp *dp, const k3c_param_table *t, const float *g, float *out, k3c_err *err);
/* The optimizer step of this rank's entries on its state shard (a share whose Muon needs the whole matrix: gathered
 * over the TP group, stepped whole, its share kept), then every rank's updated entries gathered into w. */
int k3c_dp_optim_step(k3c_dp *dp, const k3c_backend_f32 *be, void *inst, const k3c_param_table *t, float *w,
                      const float *g, float *state_shard, double lr, int64_t step, k3c_err *err);
/* S_max [n] ← its maximum over the ranks (QK-Clip then clips the same heads on every rank). */
int k3c_dp_max_smax(k3c_dp *dp, float *smax, int64_t n, k3c_err *err);
/* One MoE layer's router statistics of the whole batch, in rank (= token) order: *logits [T, n] and *cutoff [T] in
 * dp's buffer (backend memory, valid until the next call), *T the global token count; r: this rank's statistics
 * (T_local tokens). */
int k3c_dp_gather_route(k3c_dp *dp, const k3c_route_stats *r, int64_t n, float **logits, float **cutoff, int64_t *T,
                        k3c_err *err);
/* The full optimizer state (single-process layout, every rank gets it) from the shards: for tests against one process
 * (checkpoints gather nothing: every rank writes its own shard, train/checkpoint.h). */
int k3c_dp_gather_state(k3c_dp *dp, const float *state_shard, float *full, k3c_err *err);

#endif
