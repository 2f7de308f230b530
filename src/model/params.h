/* params.h — the parameter inventory of a model: every tensor under its checkpoint name with shape, offset into one flat
 * buffer, and optimizer metadata; per-layer offset tables that forward/backward bind to weights or gradients.
 * Spec: docs/FORMATS.md §5 (tensor names and shapes), docs/MODEL.md §10 (which tensors Muon / AdamW / QK-Clip touch). */
#ifndef K3C_MODEL_PARAMS_H
#define K3C_MODEL_PARAMS_H

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

/* Builds the inventory for cfg (names carry cfg->tensor_prefix). */
int k3c_params_build(const k3c_config *cfg, k3c_param_table *t, k3c_err *err);
/* The same for a part of the model (docs/PARALLEL.md "Residency"): every stacked routed-expert entry (w1, w3, w2 of
 * each MoE layer) holds only experts [e0, e0 + n) as slices 0..n−1 (stack = n, stack0 = e0), and the entries outside
 * the layers [layer0, layer1) (the embedding unless layer0 is 0, the head unless layer1 is the last) are absent: name,
 * shape and position in the entry order kept, no elements. Entry indices are those of the whole model's table;
 * k3c_residency_whole(cfg) is k3c_params_build. */
int k3c_params_build_resident(const k3c_config *cfg, const k3c_residency *r, k3c_param_table *t, k3c_err *err);
void k3c_params_free(k3c_param_table *t);
#define K3C_PARAM_NOT_HELD (-2)
/* The entry whose name (or stacked pattern expanded for some expert) equals `name`; *expert gets the slice (−1 if not
 * stacked): expert e is slice e − stack0. Returns the entry index, −1 for an unknown name, or K3C_PARAM_NOT_HELD for
 * a tensor of the model outside the table's residency (another rank's expert or layer). Also accepts the transformers
 * spelling of the dense layer-0 MLP ("block_sparse_moe.{gate,up,down}_proj" for "mlp.*"). */
int k3c_params_lookup(const k3c_param_table *t, const char *name, int *expert);
/* Writes the checkpoint name of slice e of entry p (stacked: expert stack0 + e). */
void k3c_params_name(const k3c_param *p, int64_t expert, char *buf, size_t n);
/* Elements of one slice (= numel for unstacked entries). */
static inline int64_t k3c_param_slice_numel(const k3c_param *p) { return p->stack ? p->numel / p->stack : p->numel; }
/* Sets every entry's tp_split and whole shape; size > 1: cuts the split entries to share t->res.tp_rank (their rows
 * or columns) and lays the table out again (k3c_params_build_resident calls it). Returns 0, −1 when out of memory, or
 * 1 + the index of an entry whose split dimension size does not divide. */
int k3c_params_tp_split(k3c_param_table *t, const k3c_config *cfg, int size);
/* Share `part` of a tensor-parallel entry (p->tp_share; its shape is every share's) and the whole tensor, both of
 * element size es: dir 0 copies the share's elements out of whole (whole_numel elements) into share (numel), dir 1
 * puts them back into whole. An entry without shares: a plain copy. */
void k3c_param_share_copy(const k3c_param *p, int part, size_t es, void *whole, void *share, int dir);
/* Index in the whole tensor of element j of entry p (j itself unless p->tp_share). */
int64_t k3c_param_whole_index(const k3c_param_table *t, const k3c_param *p, int64_t j);
/* How tensor parallelism treats entry i (its tp_split). */
static inline k3c_tp_split k3c_tp_split_of(const k3c_param_table *t, int i) { return (k3c_tp_split)t->p[i].tp_split; }
/* Writes entries [e0, e1) of a table without tensor-parallel shares to the safetensors file path (F32, checkpoint
 * names, one tensor per expert; experts_only: the stacked routed-expert entries alone) atomically; x (host memory)
 * holds their elements from entry e0's offset on. */
int k3c_params_write(const k3c_param_table *t, const float *x, const char *path, int e0, int e1, int experts_only,
                     k3c_err *err);
/* Trainable element count (excludes router correction biases and A_log padding). */
int64_t k3c_params_trainable(const k3c_param_table *t);

#endif
