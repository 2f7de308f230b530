/* layer_mla.c — the gated NoPE multi-head latent attention mixer of one decoder layer, forward and backward: q (LoRA or
 * single projection), kv_a → [latent (RMSNorm) ; shared k_pe], kv_b → per-head k_nope, v; causal attention with document
 * masks; optional sigmoid output gate; o_proj. Spec: docs/MODEL.md §4.2 (no rotation anywhere), docs/FORMATS.md §7. */
#include "base/check.h"
#include "base/real.h"
#include "model/layers.h"

#include <string.h>

typedef struct {
    int64_t T, D, H, nope, rope, dqk, dv, r, rkv;
} mla_shape;

/* This rank's heads (all of them alone; tensor parallelism: mla_heads / size). */
static mla_shape shape_of(const k3c_model *m, int64_t T) {
    const k3c_config *c = &m->cfg;
    mla_shape s = {T,
                   c->hidden_size,
                   c->mla_heads / k3c_tp_size(m),
                   c->qk_nope_dim,
                   c->qk_rope_dim,
                   c->qk_nope_dim + c->qk_rope_dim,
                   c->v_head_dim,
                   c->q_lora_rank,
                   c->kv_lora_rank};
    return s;
}

static k3c_attention_sizes attn_sizes(const mla_shape *s, int n_docs) {
    k3c_attention_sizes a = {s->T, s->H, s->dqk, s->dv, n_docs, 1.0 / sqrt((double)s->dqk), 0, 0};
    return a;
}

size_t k3c_mla_scratch(const k3c_model *m, int64_t T, int n_docs) {
    mla_shape s = shape_of(m, T);
    k3c_attention_sizes as = attn_sizes(&s, n_docs);
    const k3c_backend *be = k3c_model_backend(m);
    size_t f = be->attention_fwd_workspace(&as), b = be->attention_bwd_workspace(&as);
    size_t o = k3c_tp_cols_bytes(m, s.D, m->cfg.mla_heads * s.dv); /* o_proj's columns */
    f = f > b ? f : b;
    return f > o ? f : o;
}

void k3c_mla_alloc(const k3c_model *m, int64_t T, k3c_acts_carver *c, k3c_mla_acts *a) {
    mla_shape s = shape_of(m, T);
    memset(a, 0, sizeof *a);
    if (s.r > 0) {
        a->qa = K3C_CARVE_DEV(c, real, T * s.r);
        a->qan = K3C_CARVE_DEV(c, real, T * s.r);
        a->rqa = K3C_CARVE_DEV(c, real, T);
    }
    a->q = K3C_CARVE_DEV(c, real, T * s.H * s.dqk);
    a->kva = K3C_CARVE_DEV(c, real, T * (s.rkv + s.rope));
    a->c = K3C_CARVE_DEV(c, real, T * s.rkv);
    a->cn = K3C_CARVE_DEV(c, real, T * s.rkv);
    a->rc = K3C_CARVE_DEV(c, real, T);
    a->kv = K3C_CARVE_DEV(c, real, T * s.H * (s.nope + s.dv));
    a->k = K3C_CARVE_DEV(c, real, T * s.H * s.dqk);
    a->v = K3C_CARVE_DEV(c, real, T * s.H * s.dv);
    a->o = K3C_CARVE_DEV(c, real, T * s.H * s.dv);
    a->lse = K3C_CARVE_DEV(c, real, T * s.H);
    if (m->cfg.mla_output_gate) {
        a->gl = K3C_CARVE_DEV(c, real, T * s.H * s.dv);
        a->og = K3C_CARVE_DEV(c, real, T * s.H * s.dv);
    }
}

int k3c_mla_layer_fwd(k3c_step *st, int l, const real *xn, k3c_mla_acts *a, real *y, k3c_err *err) {
    const k3c_model *m = st->m;
    const k3c_config *c = &m->cfg;
    k3c_layer_offsets ob;
    const k3c_layer_offsets *o = k3c_tp_offsets(m, l, &ob);
    const real *w = st->w;
    mla_shape s = shape_of(m, st->T);
    int64_t T = s.T, H = s.H;
    if (s.r > 0) {
        CHECK_RC(k3c_lin(st, T, s.D, s.r, xn, w + o->q_a, a->qa, 0, err));
        k3c_rmsnorm_sizes rs = {T, s.r, c->mla_norm_eps};
        CHECK_RC(st->be->rmsnorm_fwd(&rs, a->qa, w + o->q_a_norm, a->qan, a->rqa, err));
        CHECK_RC(k3c_lin(st, T, s.r, H * s.dqk, a->qan, w + o->q_b, a->q, 0, err));
    } else {
        CHECK_RC(k3c_lin(st, T, s.D, H * s.dqk, xn, w + o->q_proj, a->q, 0, err));
    }
    CHECK_RC(k3c_lin(st, T, s.D, s.rkv + s.rope, xn, w + o->kv_a, a->kva, 0, err));
    const int64_t lkva = s.rkv + s.rope, lkv = s.nope + s.dv;
    CHECK_RC(st->be->copy2d(T, s.rkv, a->kva, lkva, a->c, s.rkv, 0, err));
    k3c_rmsnorm_sizes rc = {T, s.rkv, c->mla_norm_eps};
    CHECK_RC(st->be->rmsnorm_fwd(&rc, a->c, w + o->kv_a_norm, a->cn, a->rc, err));
    CHECK_RC(k3c_lin(st, T, s.rkv, H * (s.nope + s.dv), a->cn, w + o->kv_b, a->kv, 0, err));
    /* per head: k = [k_nope_h ; k_pe] (k_pe shared by all heads, never rotated), v = v_h */
    CHECK_RC(st->be->copy2d(T * H, s.nope, a->kv, lkv, a->k, s.dqk, 0, err));
    for (int64_t h = 0; h < H; h++)
        CHECK_RC(st->be->copy2d(T, s.rope, a->kva + s.rkv, lkva, a->k + h * s.dqk + s.nope, H * s.dqk, 0, err));
    CHECK_RC(st->be->copy2d(T * H, s.dv, a->kv + s.nope, lkv, a->v, s.dv, 0, err));
    k3c_attention_sizes as = attn_sizes(&s, st->n_docs);
    CHECK_RC(st->be->attention_fwd(&as, st->cu, a->q, a->k, a->v, a->o, a->lse, st->scratch, err));
    /* S_max of QK-Clip (§10.2) from the queries and keys while they are live (recomputed layers share buffers) */
    if (m->stats && m->stats->smax)
        CHECK_RC(st->be->attention_max_logit(&as, st->cu, a->q, a->k,
                                             m->stats->smax + (size_t)(l * c->mla_heads + k3c_tp_rank(m) * H), err));
    const real *out = a->o;
    if (c->mla_output_gate) {
        CHECK_RC(k3c_lin(st, T, s.D, H * s.dv, xn, w + o->g_proj, a->gl, 0, err));
        CHECK_RC(st->be->sigmoid_gate_fwd(T * H * s.dv, a->o, a->gl, a->og, err));
        out = a->og;
    }
    /* row-parallel under tensor parallelism (the caller sums y); the scratch is free again after the attention */
    return k3c_lin_rowpar(st, T, c->mla_heads * s.dv, s.D, out, w + o->o_proj, st->scratch, y, err);
}

size_t k3c_mla_bwd_bytes(const k3c_model *m, int64_t T) {
    mla_shape s = shape_of(m, T);
    int64_t n = 2 * T * s.H * s.dv + 2 * T * s.H * s.dqk + T * s.H * s.dv + T * s.H * (s.nope + s.dv) +
                T * (s.rkv + s.rope) + 2 * T * s.rkv + 2 * T * s.r;
    return sizeof(real) * (size_t)n + 16 * 64 + 2 * k3c_tp_cols_bytes(m, s.D, m->cfg.mla_heads * s.dv);
}

int k3c_mla_layer_bwd(k3c_step *st, int l, const real *xn, k3c_mla_acts *a, const real *dy, real *dxn, k3c_arena *tmp,
                      k3c_err *err) {
    const k3c_model *m = st->m;
    const k3c_config *c = &m->cfg;
    k3c_layer_offsets ob;
    const k3c_layer_offsets *o = k3c_tp_offsets(m, l, &ob);
    const real *w = st->w;
    real *g = st->g;
    mla_shape s = shape_of(m, st->T);
    int64_t T = s.T, H = s.H;
#define TMP(n) k3c_tmp_zeros(st, tmp, (n), err)
    real *dout = TMP(T * H * s.dv), *d_o = TMP(T * H * s.dv);
    real *dq = TMP(T * H * s.dqk), *dk = TMP(T * H * s.dqk), *dv = TMP(T * H * s.dv);
    real *dkv = TMP(T * H * (s.nope + s.dv)), *dkva = TMP(T * (s.rkv + s.rope)), *dc = TMP(T * s.rkv);
    real *dcn = TMP(T * s.rkv), *dqa = s.r > 0 ? TMP(T * s.r) : NULL, *dqan = s.r > 0 ? TMP(T * s.r) : NULL;
#undef TMP
    if (!dout || !d_o || !dq || !dk || !dv || !dkv || !dkva || !dc || !dcn || (s.r > 0 && (!dqa || !dqan)))
        return k3c_errf(err, K3C_ENOMEM, "layer %d: MLA backward scratch (arena %zu of %zu used)", l, tmp->used,
                        tmp->cap);
    const real *out = c->mla_output_gate ? a->og : a->o;
    CHECK_RC(
        k3c_lin_rowpar_bwd(st, T, c->mla_heads * s.dv, s.D, out, w + o->o_proj, dy, dout, g + o->o_proj, tmp, err));
    if (c->mla_output_gate) {
        real *dgl = dv; /* borrow: same size, zeroed, refilled below */
        CHECK_RC(st->be->sigmoid_gate_bwd(T * H * s.dv, a->o, a->gl, dout, d_o, dgl, err));
        CHECK_RC(k3c_lin_bwd(st, T, s.D, H * s.dv, xn, w + o->g_proj, dgl, dxn, g + o->g_proj, err));
        CHECK_RC(st->be->zero(dv, T * H * s.dv, err));
    } else {
        CHECK_RC(st->be->copy2d(1, T * H * s.dv, dout, 0, d_o, 0, 0, err));
    }
    k3c_attention_sizes as = attn_sizes(&s, st->n_docs);
    CHECK_RC(st->be->attention_bwd(&as, st->cu, a->q, a->k, a->v, a->o, a->lse, d_o, dq, dk, dv, st->scratch, err));
    /* split dk back into k_nope (per head) and the shared k_pe (summed over heads in order), dv into kv_b's v rows */
    const int64_t lkva = s.rkv + s.rope, lkv = s.nope + s.dv;
    CHECK_RC(st->be->copy2d(T * H, s.nope, dk, s.dqk, dkv, lkv, 1, err));
    CHECK_RC(st->be->copy2d(T * H, s.dv, dv, s.dv, dkv + s.nope, lkv, 1, err));
    for (int64_t h = 0; h < H; h++)
        CHECK_RC(st->be->copy2d(T, s.rope, dk + h * s.dqk + s.nope, H * s.dqk, dkva + s.rkv, lkva, 1, err));
    CHECK_RC(k3c_lin_bwd(st, T, s.rkv, H * (s.nope + s.dv), a->cn, w + o->kv_b, dkv, dcn, g + o->kv_b, err));
    k3c_rmsnorm_sizes rc = {T, s.rkv, c->mla_norm_eps};
    CHECK_RC(st->be->rmsnorm_bwd(&rc, a->c, w + o->kv_a_norm, a->rc, dcn, dc, g + o->kv_a_norm, err));
    CHECK_RC(st->be->copy2d(T, s.rkv, dc, s.rkv, dkva, lkva, 1, err));
    CHECK_RC(k3c_lin_bwd(st, T, s.D, s.rkv + s.rope, xn, w + o->kv_a, dkva, dxn, g + o->kv_a, err));
    if (s.r > 0) {
        CHECK_RC(k3c_lin_bwd(st, T, s.r, H * s.dqk, a->qan, w + o->q_b, dq, dqan, g + o->q_b, err));
        k3c_rmsnorm_sizes rs = {T, s.r, c->mla_norm_eps};
        CHECK_RC(st->be->rmsnorm_bwd(&rs, a->qa, w + o->q_a_norm, a->rqa, dqan, dqa, g + o->q_a_norm, err));
        CHECK_RC(k3c_lin_bwd(st, T, s.D, s.r, xn, w + o->q_a, dqa, dxn, g + o->q_a, err));
    } else {
        CHECK_RC(k3c_lin_bwd(st, T, s.D, H * s.dqk, xn, w + o->q_proj, dq, dxn, g + o->q_proj, err));
    }
    return K3C_OK;
}
