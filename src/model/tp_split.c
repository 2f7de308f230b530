/* tp_split.c — how tensor parallelism splits each parameter-table entry (rows, columns or replicated) and a table of one
 * rank's shares: the split entries cut to that rank's rows or columns. Spec: docs/PARALLEL.md "Tensor parallelism". */
#include "model/params.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define F(x) offsetof(k3c_layer_offsets, x)
/* Split by output rows, in per-head (or per-intermediate-row) blocks: each rank holds a contiguous run. */
static const size_t ROWS[] = {F(q_proj), F(k_proj), F(v_proj),   F(q_conv), F(k_conv),      F(v_conv),
                              F(f_b),    F(A_log),  F(dt_bias),  F(b_proj), F(g_proj),      F(g_b),
                              F(q_b),    F(kv_b),   F(mlp_gate), F(mlp_up), F(shared_gate), F(shared_up)};
/* Split by input columns: the row-parallel projections back to the hidden size. */
static const size_t COLS[] = {F(o_proj), F(mlp_down), F(shared_down)};
/* Replicated, with each rank's gradient its part of the sum: read by (or reading) every head, or the routed path of
 * the MoE, which each rank runs on its own rows of the tokens (model/layer_ffn.c token_rows). */
static const size_t PARTIAL[] = {F(f_a),       F(g_a),       F(o_norm), F(q_a),         F(q_a_norm),
                                 F(kv_a),      F(kv_a_norm), F(router), F(latent_down), F(latent_norm),
                                 F(latent_up), F(w1),        F(w3),     F(w2)};
#undef F

static size_t field(const k3c_layer_offsets *o, size_t at) { return *(const size_t *)((const char *)o + at); }

static int in_list(const k3c_layer_offsets *o, const size_t *list, size_t n, size_t off) {
    for (size_t i = 0; i < n; i++)
        if (field(o, list[i]) == off) return 1;
    return 0;
}

/* Entry i of a table in the whole layout (every present entry at its own offset). */
static k3c_tp_split classify(const k3c_param_table *t, int i) {
    const k3c_param *p = &t->p[i];
    if (p->layer < 0) return p->offset == t->glob.embed || p->offset == t->glob.lm_head ? K3C_TP_ROWS : K3C_TP_SAME;
    const k3c_layer_offsets *o = &t->layer[p->layer];
    if (in_list(o, ROWS, sizeof ROWS / sizeof *ROWS, p->offset)) return K3C_TP_ROWS;
    if (in_list(o, COLS, sizeof COLS / sizeof *COLS, p->offset)) return K3C_TP_COLS;
    if (in_list(o, PARTIAL, sizeof PARTIAL / sizeof *PARTIAL, p->offset)) return K3C_TP_PARTIAL;
    return K3C_TP_SAME;
}

/* The share of a row-split entry: 1/size of its leading dimension that is not 1 (A_log [1, 1, H, 1] splits H; K3's
 * padded A_log keeps only its H used elements, the padding being read by no one); a column split: 1/size of dim 1. */
static int cut(k3c_param *p, int size) {
    int d = 0;
    if (p->tp_split == K3C_TP_COLS)
        d = 1;
    else if (p->used < p->numel) /* K3's A_log [max(dk, H)]: H used */
        p->shape[0] = p->used;
    else
        while (d < p->ndim - 1 && p->shape[d] == 1) d++;
    if (p->shape[d] % size) return -1;
    p->shape[d] /= size;
    p->numel = 1;
    for (int d = 0; d < p->ndim; d++) p->numel *= p->shape[d];
    p->used = p->numel;
    p->tp_share = 1;
    return 0;
}

/* The element offset old → new: the new offset of any entry at old offset `at` (entries of no elements share their
 * successor's offset in both layouts), or the new total for the old total. */
static size_t remap(const k3c_param_table *t, const size_t *old, size_t old_total, size_t at) {
    if (at == K3C_NOPARAM) return at;
    if (at == old_total) return t->total;
    int lo = 0, hi = t->n - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (old[mid] < at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return t->p[lo].offset;
}

int k3c_params_tp_split(k3c_param_table *t, const k3c_config *cfg, int size) {
    for (int i = 0; i < t->n; i++) {
        k3c_param *p = &t->p[i];
        p->tp_split = (uint8_t)classify(t, i);
        memcpy(p->whole_shape, p->shape, sizeof p->shape);
        p->whole_numel = p->numel;
    }
    if (size <= 1) return 0;
    size_t *old = malloc(sizeof(size_t) * (size_t)(t->n > 0 ? t->n : 1)), old_total = t->total, off = 0;
    if (!old) return -1;
    for (int i = 0; i < t->n; i++) {
        k3c_param *p = &t->p[i];
        old[i] = p->offset;
        if (p->numel && (p->tp_split == K3C_TP_ROWS || p->tp_split == K3C_TP_COLS) && cut(p, size)) {
            free(old);
            return i + 1;
        }
        p->offset = off;
        off += (size_t)p->numel;
    }
    t->total = off;
    for (int l = 0; l < cfg->num_layers; l++) {
        size_t *f = (size_t *)&t->layer[l];
        for (size_t k = 0; k < sizeof t->layer[l] / sizeof *f; k++) f[k] = remap(t, old, old_total, f[k]);
    }
    size_t *g = (size_t *)&t->glob;
    for (size_t k = 0; k < sizeof t->glob / sizeof *g; k++) g[k] = remap(t, old, old_total, g[k]);
    free(old);
    return 0;
}

/* A share as rows × cols within rows × whole_cols of the whole tensor, starting at column col0 of each row. */
static void geometry(const k3c_param *p, int64_t part, int64_t *rows, int64_t *cols, int64_t *whole_cols,
                     int64_t *col0) {
    if (p->tp_split == K3C_TP_COLS) {
        *rows = p->shape[0], *cols = p->shape[1], *whole_cols = p->whole_shape[1];
    } else {
        *rows = 1, *cols = p->numel, *whole_cols = p->whole_numel;
    }
    *col0 = part * *cols;
}

void k3c_param_share_copy(const k3c_param *p, int part, size_t es, void *whole, void *share, int dir) {
    if (!p->tp_share) {
        if (dir)
            memcpy(whole, share, es * (size_t)p->numel);
        else
            memcpy(share, whole, es * (size_t)p->numel);
        return;
    }
    int64_t rows, cols, wc, c0;
    geometry(p, part, &rows, &cols, &wc, &c0);
    for (int64_t r = 0; r < rows; r++) {
        char *w = (char *)whole + es * (size_t)(r * wc + c0), *s = (char *)share + es * (size_t)(r * cols);
        memcpy(dir ? w : s, dir ? s : w, es * (size_t)cols);
    }
}

int64_t k3c_param_whole_index(const k3c_param_table *t, const k3c_param *p, int64_t j) {
    if (!p->tp_share) return j;
    int64_t rows, cols, wc, c0;
    geometry(p, t->res.tp_rank, &rows, &cols, &wc, &c0);
    return (j / cols) * wc + c0 + j % cols;
}
