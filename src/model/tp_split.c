/* tp_split.c — how tensor parallelism splits each parameter-table entry: rows (column-parallel), columns
 * (row-parallel) or replicated, and the offsets of one rank's share of a layer. Spec: docs/PARALLEL.md "Tensor
 * parallelism". */
#include "model/model.h"

#include <stddef.h>

#define F(x) offsetof(k3c_layer_offsets, x)
/* Split by output rows, in per-head (or per-intermediate-row) blocks: each rank reads a contiguous run. */
static const size_t ROWS[] = {F(q_proj), F(k_proj), F(v_proj),   F(q_conv), F(k_conv),      F(v_conv),
                              F(f_b),    F(A_log),  F(dt_bias),  F(b_proj), F(g_proj),      F(g_b),
                              F(q_b),    F(kv_b),   F(mlp_gate), F(mlp_up), F(shared_gate), F(shared_up)};
/* Split by input columns: the row-parallel projections back to the hidden size. */
static const size_t COLS[] = {F(o_proj), F(mlp_down), F(shared_down)};
/* Replicated, read by (or reading) every head: each rank's gradient is its heads' part of the sum. */
static const size_t PARTIAL[] = {F(f_a), F(g_a), F(o_norm), F(q_a), F(q_a_norm), F(kv_a), F(kv_a_norm)};
#undef F

static size_t field(const k3c_layer_offsets *o, size_t at) { return *(const size_t *)((const char *)o + at); }

static int in_list(const k3c_layer_offsets *o, const size_t *list, size_t n, size_t off) {
    for (size_t i = 0; i < n; i++)
        if (field(o, list[i]) == off) return 1;
    return 0;
}

k3c_tp_split k3c_tp_split_of(const k3c_param_table *t, int entry) {
    const k3c_param *p = &t->p[entry];
    if (p->layer < 0) return p->offset == t->glob.embed || p->offset == t->glob.lm_head ? K3C_TP_ROWS : K3C_TP_SAME;
    const k3c_layer_offsets *o = &t->layer[p->layer];
    if (in_list(o, ROWS, sizeof ROWS / sizeof *ROWS, p->offset)) return K3C_TP_ROWS;
    if (in_list(o, COLS, sizeof COLS / sizeof *COLS, p->offset)) return K3C_TP_COLS;
    if (in_list(o, PARTIAL, sizeof PARTIAL / sizeof *PARTIAL, p->offset)) return K3C_TP_PARTIAL;
    return K3C_TP_SAME;
}

/* The entry starting at element offset off (entries are laid out in table order). */
static const k3c_param *entry_at(const k3c_param_table *t, size_t off) {
    int lo = 0, hi = t->n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (t->p[mid].offset <= off)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &t->p[lo];
}

void k3c_tp_layer_offsets(const k3c_param_table *t, int l, int rank, int size, k3c_layer_offsets *out) {
    *out = t->layer[l];
    for (size_t i = 0; i < sizeof ROWS / sizeof *ROWS; i++) {
        size_t *f = (size_t *)((char *)out + ROWS[i]);
        if (*f != K3C_NOPARAM) *f += (size_t)rank * (size_t)(entry_at(t, *f)->used / size);
    }
}
