/* params.h — the parameter inventory of a model built from its config (the table's types: ops/param_table.h): every
 * tensor under its checkpoint name with shape, offset into one flat buffer, and optimizer metadata; per-layer offset
 * tables that forward/backward bind to weights or gradients.
 * Spec: docs/FORMATS.md §5 (tensor names and shapes), docs/MODEL.md §10 (which tensors Muon / AdamW / QK-Clip touch). */
#ifndef K3C_MODEL_PARAMS_H
#define K3C_MODEL_PARAMS_H

#include "base/base.h"
#include "ops/param_table.h"

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
/* The layers [first, first + count) of pipeline stage s of pp over `layers` layers: the first layers % pp stages hold one
 * layer more (the trainer's stages and `k3c plan`'s are this one split). */
static inline void k3c_stage_layers(int64_t layers, int64_t pp, int64_t s, int64_t *first, int64_t *count) {
    const int64_t base = layers / pp, extra = layers % pp;
    *count = base + (s < extra);
    *first = s * base + (s < extra ? s : extra);
}

/* Trainable element count (excludes router correction biases and A_log padding). */
int64_t k3c_params_trainable(const k3c_param_table *t);

#endif
