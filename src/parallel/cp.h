/* cp.h — context parallelism: a packed sequence split into contiguous token ranges over the ranks of a CP group; the
 * KDA layers hand their short-conv tails and chunk state rank to rank (gradients back), the MLA layers all-gather the
 * normalised latent and shared k_pe slot (gradient reduce-scattered). Plugs into the model as its
 * k3c_context_exchange; everything token-wise stays local, and the data-parallel hooks (parallel/dp.h, over every rank)
 * sum the gradients and gather the router statistics. Spec: docs/PARALLEL.md "Context parallelism". */
#ifndef K3C_DIST_CP_H
#define K3C_DIST_CP_H

#include "parallel/dp.h"

/* The memory moves of the model's backend table (float32 or float64: one of the zeros is set). */
typedef struct {
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    int (*upload)(void *dst, const void *host_src, size_t bytes, k3c_err *err);
    int (*download)(void *host_dst, const void *src, size_t bytes, k3c_err *err);
    int (*zero32)(float *x, int64_t n, k3c_err *err);
    int (*zero64)(double *x, int64_t n, k3c_err *err);
} k3c_cp_mem;

typedef struct {
    k3c_comm *comm; /* the CP group (not owned): rank r holds the r-th range of its data-parallel part */
    k3c_cp_mem mem; /* the model's backend memory (where buf and cu_ops live) */
    int rank, size;
    k3c_model *m;
    k3c_dtype dt;          /* the model's precision (F32 or F64) */
    size_t es;             /* its element size */
    int64_t P, W, S, lkva; /* KDA channels, conv width, state floats [H, dk, dv], MLA latent row width */
    int64_t T_cap;         /* most tokens of a sequence (a data-parallel part) */
    int64_t prev_len;      /* tokens of the first local piece on earlier ranks (its conv tail is masked before) */
    int64_t *layer_off;    /* [num_layers] offset of each layer's buffers in buf */
    char *buf;  /* backend memory: per layer, KDA: h0, ht, dht, dh0 [S] and 3 conv tails [P, W−1]; MLA: latent,
                   gradient [T_cap, lkva] */
    char *rows; /* host [max(3·(W−1)·P, T_cap·lkva)]: received tails and host copies, one rank's latent gradient */
    int32_t *cu_ops;                 /* backend memory: cu_rest, then cu_keys (aligned), where the ops read them */
    int64_t *counts, *displs;        /* [size] latent gather / scatter blocks */
    int32_t *cu, *cu_rest, *cu_keys; /* [T_cap + 1] each */
    k3c_context_exchange exchange;   /* what the model calls: set m->context = &cp->exchange */
} k3c_cp;

/* cp over `comm` for model m (float32, or float64 on the CPU; a device backend needs a device communicator),
 * sequences of up to T_cap tokens. With tensor parallelism (m->tp set first) the KDA state and conv tails are those of
 * this rank's heads, passed between the CP ranks of the same TP rank. */
int k3c_cp_init(k3c_cp *cp, k3c_comm *comm, k3c_model *m, int64_t T_cap, k3c_err *err);
void k3c_cp_free(k3c_cp *cp);

/* b (the global batch every rank loaded) becomes this rank's range: the data-parallel part of its group (dp over
 * every rank, cp innermost but for tp: the CP group of rank r of dp's group is the ranks sharing r / (cp·tp) and r % tp,
 * a TP group's ranks taking the same range; the parts split at document-piece
 * boundaries, at multiples of cp where there are such) cut into cp contiguous token ranges, equal when cp divides the
 * part (else at most one token apart); loss_norm = the counted targets of the whole batch; dp's token counts set for
 * the router gathers. K3C_EINVAL naming the sizes when a range would be shorter than the conv tail or the part exceeds
 * T_cap. */
int k3c_cp_split_batch(k3c_cp *cp, k3c_dp *dp, k3c_model_batch *b, k3c_err *err);
/* Its two halves, for the pipeline (which cuts the part into micro-batches and each of those into ranges): b ← the
 * data-parallel part of this rank's CP group (whole pieces, loss_norm the whole batch's); and b (whole pieces, cu from
 * 0) ← this rank's range of it, the exchange set for it (its conv-tail and state neighbours, the latent blocks) and
 * the gradient buffers zeroed: call it before each forward of that sequence (dp's token counts are the caller's:
 * k3c_dp_local_tokens). k3c_cp_range_len: the tokens of this rank's range of a sequence of T. */
int k3c_cp_part(k3c_cp *cp, k3c_dp *dp, k3c_model_batch *b, k3c_err *err);
int k3c_cp_range(k3c_cp *cp, k3c_model_batch *b, k3c_err *err);
int64_t k3c_cp_range_len(const k3c_cp *cp, int64_t T);
/* K3C_EINVAL naming the sizes unless a sequence of T tokens cuts into cp ranges of at least the conv tail and fits
 * T_cap (what k3c_cp_range checks; the pipeline checks every micro-batch before its first message). */
int k3c_cp_check_len(const k3c_cp *cp, int64_t T, k3c_err *err);

#endif
