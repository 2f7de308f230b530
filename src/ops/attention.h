/* attention.h — causal document-masked softmax attention for (gated NoPE) MLA: flash-style forward, FlashAttention-2
 * style backward (memory linear in T), materialised reference. Spec: docs/MODEL.md §4, §11; docs/TRAINING.md §2. */

/* Layout (token-major, src/ops/ops.h): q, k [T, H, dqk]; v [T, H, dv]; o [T, H, dv]; lse [T, H] (natural log of the
 * softmax denominator of each (token, head), scores already scaled). Token i attends to the tokens j of its own
 * document with j <= i (cu_seqlens: n_docs + 1 offsets 0 .. T; NULL = one document). The MLA caller concatenates the
 * shared k_pe slot into every head's k before calling, and sums dk over heads for it afterwards (§4.2). */
#ifndef K3C_OPS_ATTENTION_H
#define K3C_OPS_ATTENTION_H

#include "ops/ops.h"

#include <stddef.h>
#include <stdint.h>

#define K3C_ATTN_DEFAULT_BLOCK 64
#define K3C_ATTN_MAX_BLOCK 256
/* Reals of the per-thread stack tile that holds one key tile and one value tile transposed: block_k is capped at
 * K3C_ATTN_SCRATCH / (dqk + dv) rows (64 at MLA's 192 + 128), and dqk + dv may not exceed it (K3C_EUNSUPPORTED). */
#define K3C_ATTN_SCRATCH 20480

typedef struct {
    int64_t T, H, dqk, dv;
    int64_t n_docs;       /* entries of cu_seqlens minus one; ignored when cu_seqlens is NULL */
    double scale;         /* score = scale · q·k; MLA: (qk_nope + qk_rope)^−1/2 */
    int block_q, block_k; /* tile sizes, 0 = K3C_ATTN_DEFAULT_BLOCK, at most K3C_ATTN_MAX_BLOCK; need not divide T */
    /* Rows before q_begin are padding, not queries (context parallelism: a rank's queries over the sequence's keys):
       attention_max_logit skips them; the forward and backward compute them like any row (the caller zeroes their
       queries and output gradients, so they add nothing to dk, dv). */
    int64_t q_begin;
} k3c_attention_sizes;

#define K3C_ATTENTION_API(real, S)                                                                                          \
    /* Workspace bytes of the backward (D = rowsum(dO ⊙ O): T·H reals); the forward needs none (ws may be NULL). */      \
    size_t k3c_attention_workspace_##S(const k3c_attention_sizes *s);                                                       \
    /* Workspace bytes of the materialised reference, forward and backward: two T×T matrices. */                           \
    size_t k3c_attention_naive_workspace_##S(const k3c_attention_sizes *s);                                                 \
    /* Online-softmax forward over query blocks × key blocks, OpenMP over (head, query block); writes o and lse. */        \
    int k3c_attention_fwd_##S(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const real *q, const real *k,        \
                              const real *v, real *o, real *lse, void *ws, k3c_err *err);                                   \
    /* Recomputes P = exp(scale q·k − lse); dq, dk, dv (each may be NULL) are ADDED to. Two race-free passes: (head,   \
       key block) for dk, dv, then (head, query block) for dq. ws: k3c_attention_workspace bytes. */ \
    int k3c_attention_bwd_##S(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const real *q, const real *k,        \
                              const real *v, const real *o, const real *lse, const real *dout, real *dq, real *dk,          \
                              real *dv, void *ws, k3c_err *err);                                                            \
    /* S_max of QK-Clip (§10.2): smax[h] (overwritten) = the largest s->scale · q_i·k_j of head h over the causal,     \
       document-masked pairs j ≤ i. K3C_ENUMERIC if a head's maximum is not finite (T > 0). */ \
    int k3c_attention_max_logit_##S(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const real *q,                 \
                                    const real *k, float *smax, k3c_err *err);                                              \
    /* Reference: materialises the masked T×T softmax per head (tests and benchmarks only). Same outputs. */               \
    int k3c_attention_naive_fwd_##S(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const real *q,                 \
                                    const real *k, const real *v, real *o, real *lse, void *ws, k3c_err *err);              \
    int k3c_attention_naive_bwd_##S(const k3c_attention_sizes *s, const int32_t *cu_seqlens, const real *q,                 \
                                    const real *k, const real *v, const real *o, const real *lse, const real *dout,         \
                                    real *dq, real *dk, real *dv, void *ws, k3c_err *err);

K3C_DECLARE_REAL(K3C_ATTENTION_API)

#endif
