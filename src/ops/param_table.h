/* param_table.h — the layout of a model's parameters as the step's tail ops address them (the optimizer, gradient
 * clipping, QK-Clip): entries with checkpoint names, shapes, offsets into one flat buffer and optimizer metadata, and
 * the per-layer offset tables. Plain data; model/params.c builds it from a config. Spec: docs/FORMATS.md §5,
 * docs/MODEL.md §10, docs/CODE.md "Layers". */
#ifndef K3C_OPS_PARAM_TABLE_H
#define K3C_OPS_PARAM_TABLE_H

#include "base/base.h"

#define K3C_NOPARAM ((size_t)-1)
#define K3C_PARAM_NAME 160

typedef enum {
    K3C_PK_MATRIX = 0,  /* hidden 2-D weight: Muon (or AdamW), weight decay */
    K3C_PK_EMBED,       /* token embedding: AdamW */
    K3C_PK_HEAD,        /* lm_head: AdamW */
    K3C_PK_VECTOR,      /* norms, biases, A_log, dt_bias, conv kernels, AttnRes pseudo-queries: AdamW, no decay */
    K3C_PK_ROUTER_BIAS, /* e_score_correction_bias: not trained by gradient (quantile balancing owns it) */
} k3c_param_kind;

/* How tensor parallelism treats an entry (src/model/tp_split.c): split by rows (column-parallel projections, per-head
 * vectors, vocabulary rows), by columns (the row-parallel o_proj and down projections), or replicated: with the same
 * gradient on every rank (its inputs and output gradients are the whole ones: norms, AttnRes, router, latent
 * projections, routed experts) or with a partial one (it feeds or reads every head: KDA's f_a, g_a and o_norm, MLA's
 * q_a, kv_a and their norms), which the ranks sum. */
typedef enum { K3C_TP_SAME = 0, K3C_TP_PARTIAL, K3C_TP_ROWS, K3C_TP_COLS } k3c_tp_split;

typedef struct {
    char name[K3C_PARAM_NAME]; /* checkpoint name; for stacked experts the pattern "...experts.%d.w1.weight" */
    int ndim;
    int64_t shape[4];  /* stored (checkpoint) shape; stacked experts: the per-expert shape */
    int64_t stack;     /* 0, or the number of consecutive per-expert slices held (E; n under an expert residency) */
    int64_t stack0;    /* stacked: the expert id of slice 0 (residency [e0, e0 + n): e0; else 0) */
    int64_t numel;     /* total elements (all slices) */
    size_t offset;     /* element offset into the flat buffer */
    uint8_t kind;      /* k3c_param_kind */
    int64_t head_rows; /* Per-Head Muon: rows per head block (0 = orthogonalise the whole matrix) */
    int layer;         /* -1 for global tensors */
    uint8_t mxfp4;     /* stored as MXFP4 (weight_packed + weight_scale) in the source checkpoint */
    int64_t used;      /* leading elements the model reads (A_log padding: only the first H); = numel else */
    uint8_t absent;    /* 1: outside the table's residency (another pipeline stage's): numel 0, no elements */
    uint8_t tp_split;  /* k3c_tp_split */
    uint8_t tp_share;  /* 1: holds share res.tp_rank of res.tp_size of the whole tensor (rows or columns) */
    int64_t whole_shape[4], whole_numel; /* the whole tensor's (the checkpoint's); = shape, numel unless tp_share */
} k3c_param;

/* Offsets (elements into the flat buffer; K3C_NOPARAM when absent) of one decoder layer. */
typedef struct {
    size_t input_norm, post_norm;
    size_t attn_res_norm, attn_res_proj, mlp_res_norm, mlp_res_proj;
    /* KDA */
    size_t q_proj, k_proj, v_proj, q_conv, k_conv, v_conv, f_a, f_b, A_log, dt_bias, b_proj, g_proj, g_a, g_b, o_norm;
    /* MLA (q_proj above is reused when q_lora_rank is 0) */
    size_t q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b;
    size_t o_proj; /* both mixers */
    /* FFN: dense MLP or MoE */
    size_t mlp_gate, mlp_up, mlp_down;
    size_t router, router_bias, w1, w2, w3, shared_gate, shared_up, shared_down, latent_down, latent_norm, latent_up;
} k3c_layer_offsets;

typedef struct {
    size_t embed, final_norm, out_res_norm, out_res_proj, lm_head;
} k3c_global_offsets;

typedef struct {
    k3c_param *p;
    int n, cap;
    size_t total; /* elements */
    k3c_global_offsets glob;
    k3c_layer_offsets *layer; /* cfg->num_layers entries */
    int *slot;                /* open-addressing hash of entry names (stacked entries under their "%d" pattern) */
    int64_t experts;          /* cfg->num_experts: the routed experts of the whole model */
    k3c_residency res;        /* what the entries hold: the stacked ones experts [res.expert0, + res.experts), the
                                 layers [res.layer0, res.layer1) (the others are absent) */
    int n_slots;              /* a power of two, > 2·n */
} k3c_param_table;

/* Elements of one slice (= numel for unstacked entries). */
static inline int64_t k3c_param_slice_numel(const k3c_param *p) { return p->stack ? p->numel / p->stack : p->numel; }

#endif
