/* acts.h — internal to src/model: the activations of one forward pass kept for its backward, including the Block
 * AttnRes bookkeeping (which tensors each depth mix read). Spec: docs/MODEL.md §5.3 (control flow), §5.4. */
#ifndef K3C_MODEL_ACTS_H
#define K3C_MODEL_ACTS_H

#include "model/layers.h"

typedef struct {
    int n;       /* sources */
    int *src;    /* K3C_SRC_* indices */
    real *saved; /* the mix op's saved rstd and α */
    real *out;   /* the mix output [T, D] */
} k3c_mix;

/* One slice of a sliced recompute (docs/TRAINING.md §1.4 "Sliced recompute"): tokens [start, start + len) of the
 * batch, and its pieces of documents laid out as a context-parallel rank's range (model.h k3c_context_exchange). */
typedef struct {
    int64_t start, len;
    int n_docs;               /* pieces of documents in the slice */
    int cont_prev, cont_next; /* the first piece continues the previous slice's last / the last goes on */
    int64_t prev_len;         /* tokens of the first piece's document before start */
    int32_t *cu, *cu_ops;     /* the pieces' offsets from start (n_docs + 1; host, backend memory) */
    int32_t *rest, *rest_ops; /* the pieces after the first, from the second's start (n_docs − 1) */
    int n_docs_keys;          /* documents of the tokens [0, start + len) ... */
    int32_t *keys, *keys_ops; /* ... and their offsets (host, backend memory) */
} k3c_slice;

/* A step's slices and what the sliced layers hand from slice to slice: at boundary b (before slice b) each sliced KDA
 * layer's state [H, dk, dv] and three short-conv tails [3][C, W − 1] (from its first forward to its backward), their
 * gradients (shared: one layer's backward runs at a time); the MLA latent rows [T, kv_lora_rank + qk_rope_dim] and
 * their gradient (shared). */
typedef struct {
    int n;
    int64_t S; /* tokens a slice (the last may hold fewer) */
    k3c_slice *s;
    real **h, **tail;                /* per layer (NULL: not a sliced KDA layer), (n + 1) boundaries */
    real *dh, *dtail;                /* (n + 1) boundaries; NULL without sliced KDA layers */
    real *lat, *dlat;                /* NULL without sliced MLA layers */
    int64_t state_elems, tail_elems; /* a KDA state's reals, a conv tail's */
    int cur;                         /* the slice the exchange describes */
    const k3c_backend *be;
    k3c_context_exchange cx;
} k3c_slices;

struct k3c_acts {
    k3c_step st;
    int64_t T;
    int l0, l1;              /* the layers this forward ran, [l0, l1) (0, L: the whole model) */
    int32_t *ids, *targets;  /* copies of the batch's */
    float *weight;           /* the batch's loss weights in backend memory, or NULL */
    int32_t *cu;             /* copy of the batch's cu_seqlens (n_docs + 1) */
    real *emb;               /* [T, D] (l0 > 0: the caller's boundary tensor, or unused) */
    real **pmid, **pend;     /* [L] × [T, D] */
    real **axn, **arstd;     /* attention sublayer: normalised input [T, D], rstd [T] */
    real **mxn, **mrstd;     /* FFN sublayer */
    const real **ain, **min; /* the un-normalised sublayer inputs (a mix output or a stream tensor) */
    k3c_mix *amix, *mmix;    /* per layer (n = 0: no mix) */
    k3c_mix fmix;            /* the output mix before the final norm */
    int *boundary;           /* per layer: a block starts here (P restarts) */
    const real *hfin;
    real *hn, *rfin, *logits, *lse;
    k3c_kda_acts *kda;
    k3c_mla_acts *mla;
    k3c_ffn_acts *ffn;
    double loss_norm;
    int64_t n_embeds;         /* input-embedding overrides of the batch (k3c_model_batch) */
    const int32_t *embed_pos; /* the caller's positions */
    void *d_embeds;           /* the caller's host buffer for their gradient, or NULL */
    /* backward buffers, carved after the forward's */
    real *demb, **dpmid, **dpend;
    real *dxn, *din;  /* [T, D] scratch per sublayer */
    size_t tmp_mark;  /* arena mark where the backward's buffers start */
    size_t meta_mark; /* the same in the model's host block (k3c_model.meta) */
    k3c_arena *arena;
    k3c_slices *slices; /* NULL: no layer runs in slices */
};

/* Layers [a->l0, a->l1) over a's buffers and, on the range that ends the model, the output mix (a->hfin): the training
 * forward's walk, and a decode step's (model/decode.c) over buffers planned for one step. */
int k3c_acts_run_layers(k3c_acts *a, k3c_err *err);

/* Layer l's forward over a's T rows (the whole batch, or a slice's view), or of an MLA layer only what later slices read
 * (latent_only: the depth mix, norm and the latent rows); and the backward of a layer whose forward ran last. */
int k3c_acts_layer_fwd(k3c_acts *a, int l, int latent_only, k3c_err *err);
int k3c_acts_layer_bwd_rows(k3c_acts *a, int l, k3c_err *err);

/* Sliced recompute (model/slice.c). Rows of layer l's working set in a forward of T tokens: the slice's when the layer
 * runs in slices, else T. */
int64_t k3c_slice_rows(const k3c_model *m, int l, int64_t T);
/* K3C_EUNSUPPORTED / K3C_EINVAL naming the setting when the model's layers cannot run in slices of a batch of T. */
int k3c_slices_check(const k3c_model *m, int64_t T, k3c_err *err);
/* Carves the slices' tables and buffers of a forward of T tokens (none when no layer of [l0, l1) runs in slices). */
void k3c_slices_carve(const k3c_model *m, int64_t T, int n_docs, int l0, int l1, k3c_acts_carver *cv, k3c_acts *a);
/* The slices of the batch (its document offsets cu, or NULL for one document) into the tables. */
int k3c_slices_setup(k3c_acts *a, const int32_t *cu, k3c_err *err);
/* Layer l forward, slice after slice; its backward, slice after slice from the last (recomputing each slice's
 * forward first). */
int k3c_slice_layer_fwd(k3c_acts *a, int l, k3c_err *err);
int k3c_slice_layer_bwd(k3c_acts *a, int l, k3c_err *err);

/* The chunked head (model/head.c). Rows of the head's logits in a forward of T tokens: head_chunk when it chunks the
 * batch, else T. */
int64_t k3c_head_rows(const k3c_model *m, int64_t T);
/* K3C_EINVAL for a negative head_chunk, K3C_EUNSUPPORTED naming the setting when the head cannot run in chunks. */
int k3c_head_check(const k3c_model *m, int64_t T, k3c_err *err);
/* lm_head and the cross-entropy chunk by chunk over a->hn (a->loss_norm: the divisor of the whole batch): *loss and
 * a->lse; a->logits holds one chunk. */
int k3c_head_chunked_fwd(k3c_acts *a, double *loss, k3c_err *err);
/* Its backward: each chunk's logits again, its dlogits from the saved lse, then dxn [T, D] and the lm_head gradient
 * dW added to. */
int k3c_head_chunked_bwd(k3c_acts *a, double scale, real *dxn, real *dW, k3c_err *err);

#endif
