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
};

/* Layers [a->l0, a->l1) over a's buffers and, on the range that ends the model, the output mix (a->hfin): the training
 * forward's walk, and a decode step's (model/decode.c) over buffers planned for one step. */
int k3c_acts_run_layers(k3c_acts *a, k3c_err *err);

#endif
