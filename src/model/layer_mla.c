/* layer_mla.c — the gated NoPE multi-head latent attention mixer of one decoder layer, forward and backward: q (LoRA or
 * single projection), kv_a → [latent (RMSNorm) ; shared k_pe], kv_b → per-head k_nope, v; causal attention with document
 * masks; optional sigmoid output gate; o_proj. Spec: ARCHITECTURE.md §4.2 (no rotation anywhere), CHECKPOINTS.md §7. */
#include "base/real.h"
#include "model/layers.h"
#include "ops/attention.h"
#include "ops/basic.h"

#include <string.h>

#define CHECK_RC(expr) do { int rc_ = (expr); if (rc_) return rc_; } while (0)

typedef struct {
    int64_t T, D, H, nope, rope, dqk, dv, r, rkv;
} mla_shape;

static mla_shape shape_of(const k3c_model *m, int64_t T) {
    const k3c_config *c = &m->cfg;
    mla_shape s = {T, c->hidden_size, c->mla_heads, c->qk_nope_dim, c->qk_rope_dim, c->qk_nope_dim + c->qk_rope_dim,
                   c->v_head_dim, c->q_lora_rank, c->kv_lora_rank};
    return s;
}

static k3c_attention_sizes attn_sizes(const mla_shape *s, int n_docs) {
    k3c_attention_sizes a = {s->T, s->H, s->dqk, s->dv, n_docs, 1.0 / sqrt((double)s->dqk), 0, 0};
    return a;
}

size_t R(k3c_mla_scratch)(const k3c_model *m, int64_t T, int n_docs) {
    mla_shape s = shape_of(m, T);
    k3c_attention_sizes as = attn_sizes(&s, n_docs);
    return R(k3c_attention_workspace)(&as);
}

void R(k3c_mla_alloc)(const k3c_model *m, int64_t T, k3c_carver *c, k3c_mla_acts *a) {
    mla_shape s = shape_of(m, T);
    memset(a, 0, sizeof *a);
    if (s.r > 0) {
        a->qa = K3C_CARVE(c, real, T * s.r); a->qan = K3C_CARVE(c, real, T * s.r); a->rqa = K3C_CARVE(c, real, T);
    }
    a->q = K3C_CARVE(c, real, T * s.H * s.dqk);
    a->kva = K3C_CARVE(c, real, T * (s.rkv + s.rope));
    a->c = K3C_CARVE(c, real, T * s.rkv); a->cn = K3C_CARVE(c, real, T * s.rkv); a->rc = K3C_CARVE(c, real, T);
    a->kv = K3C_CARVE(c, real, T * s.H * (s.nope + s.dv));
    a->k = K3C_CARVE(c, real, T * s.H * s.dqk); a->v = K3C_CARVE(c, real, T * s.H * s.dv);
    a->o = K3C_CARVE(c, real, T * s.H * s.dv); a->lse = K3C_CARVE(c, real, T * s.H);
    if (m->cfg.mla_output_gate) { a->gl = K3C_CARVE(c, real, T * s.H * s.dv); a->og = K3C_CARVE(c, real, T * s.H * s.dv); }
}

#define QK_BLOCK 128

/* S_max of QK-Clip (§10.2) for this layer: the largest scaled q·k of each head over the causal, document-masked pairs,
 * computed from the queries and keys while they are live (recomputed layers share their buffers). */
static int max_logits(const k3c_step *st, const mla_shape *s, const real *q, const real *k, float *out, k3c_err *err) {
    int64_t H = s->H, dqk = s->dqk, T = s->T;
    double scale = 1.0 / sqrt((double)dqk);
    int nd = st->cu ? st->n_docs : 1, fail = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : fail)
    for (int64_t h = 0; h < H; h++) {
        real blk[QK_BLOCK * QK_BLOCK];
        double best = -INFINITY;
        for (int d = 0; d < nd; d++) {
            int64_t b0 = st->cu ? st->cu[d] : 0, e = st->cu ? st->cu[d + 1] : T;
            for (int64_t i0 = b0; i0 < e; i0 += QK_BLOCK)
                for (int64_t j0 = b0; j0 <= i0; j0 += QK_BLOCK) {
                    int64_t ni = e - i0 < QK_BLOCK ? e - i0 : QK_BLOCK, nj = e - j0 < QK_BLOCK ? e - j0 : QK_BLOCK;
                    /* blk = Q_h[i0:i0+ni] K_h[j0:j0+nj]ᵀ, heads strided by H·dqk */
                    cblas_rgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)ni, (int)nj, (int)dqk, 1,
                                q + (i0 * H + h) * dqk, (int)(H * dqk), k + (j0 * H + h) * dqk, (int)(H * dqk), 0, blk,
                                QK_BLOCK);
                    for (int64_t i = 0; i < ni; i++)
                        for (int64_t j = 0; j < nj && j0 + j <= i0 + i; j++)
                            if (blk[i * QK_BLOCK + j] * scale > best) best = blk[i * QK_BLOCK + j] * scale;
                }
        }
        out[h] = (float)best;
        if (!isfinite(best) && T > 0) fail = 1;
    }
    return fail ? k3c_errf(err, K3C_ENUMERIC, "MLA: non-finite attention logits") : K3C_OK;
}

int R(k3c_mla_layer_fwd)(k3c_step *st, int l, const real *xn, k3c_mla_acts *a, real *y, k3c_err *err) {
    const k3c_model *m = st->m;
    const k3c_config *c = &m->cfg;
    const k3c_layer_offsets *o = &m->table.layer[l];
    const real *w = st->w;
    mla_shape s = shape_of(m, st->T);
    int64_t T = s.T, H = s.H;
    if (s.r > 0) {
        CHECK_RC(k3c_lin(T, s.D, s.r, xn, w + o->q_a, a->qa, 0, err));
        k3c_rmsnorm_sizes rs = {T, s.r, c->mla_norm_eps};
        CHECK_RC(R(k3c_rmsnorm_fwd)(&rs, a->qa, w + o->q_a_norm, a->qan, a->rqa, err));
        CHECK_RC(k3c_lin(T, s.r, H * s.dqk, a->qan, w + o->q_b, a->q, 0, err));
    } else {
        CHECK_RC(k3c_lin(T, s.D, H * s.dqk, xn, w + o->q_proj, a->q, 0, err));
    }
    CHECK_RC(k3c_lin(T, s.D, s.rkv + s.rope, xn, w + o->kv_a, a->kva, 0, err));
    for (int64_t t = 0; t < T; t++) memcpy(a->c + t * s.rkv, a->kva + t * (s.rkv + s.rope), sizeof(real) * s.rkv);
    k3c_rmsnorm_sizes rc = {T, s.rkv, c->mla_norm_eps};
    CHECK_RC(R(k3c_rmsnorm_fwd)(&rc, a->c, w + o->kv_a_norm, a->cn, a->rc, err));
    CHECK_RC(k3c_lin(T, s.rkv, H * (s.nope + s.dv), a->cn, w + o->kv_b, a->kv, 0, err));
    /* per head: k = [k_nope_h ; k_pe] (k_pe shared by all heads, never rotated), v = v_h */
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            const real *kv = a->kv + (t * H + h) * (s.nope + s.dv);
            real *k = a->k + (t * H + h) * s.dqk;
            memcpy(k, kv, sizeof(real) * s.nope);
            memcpy(k + s.nope, a->kva + t * (s.rkv + s.rope) + s.rkv, sizeof(real) * s.rope);
            memcpy(a->v + (t * H + h) * s.dv, kv + s.nope, sizeof(real) * s.dv);
        }
    k3c_attention_sizes as = attn_sizes(&s, st->n_docs);
    CHECK_RC(R(k3c_attention_fwd)(&as, st->cu, a->q, a->k, a->v, a->o, a->lse, NULL, err));
    if (m->mla_smax) CHECK_RC(max_logits(st, &s, a->q, a->k, m->mla_smax + (size_t)l * (size_t)H, err));
    const real *out = a->o;
    if (c->mla_output_gate) {
        CHECK_RC(k3c_lin(T, s.D, H * s.dv, xn, w + o->g_proj, a->gl, 0, err));
        CHECK_RC(R(k3c_sigmoid_gate_fwd)(T * H * s.dv, a->o, a->gl, a->og, err));
        out = a->og;
    }
    return k3c_lin(T, H * s.dv, s.D, out, w + o->o_proj, y, 0, err);
}

size_t R(k3c_mla_bwd_bytes)(const k3c_model *m, int64_t T) {
    mla_shape s = shape_of(m, T);
    int64_t n = 2 * T * s.H * s.dv + 2 * T * s.H * s.dqk + T * s.H * s.dv + T * s.H * (s.nope + s.dv) +
                T * (s.rkv + s.rope) + 2 * T * s.rkv + 2 * T * s.r;
    return sizeof(real) * (size_t)n + 16 * 64;
}

int R(k3c_mla_layer_bwd)(k3c_step *st, int l, const real *xn, k3c_mla_acts *a, const real *dy, real *dxn,
                         k3c_arena *tmp, k3c_err *err) {
    const k3c_model *m = st->m;
    const k3c_config *c = &m->cfg;
    const k3c_layer_offsets *o = &m->table.layer[l];
    const real *w = st->w;
    real *g = st->g;
    mla_shape s = shape_of(m, st->T);
    int64_t T = s.T, H = s.H;
#define TMP(n) ((real *)k3c_arena_calloc(tmp, sizeof(real) * (size_t)(n)))
    real *dout = TMP(T * H * s.dv), *d_o = TMP(T * H * s.dv);
    real *dq = TMP(T * H * s.dqk), *dk = TMP(T * H * s.dqk), *dv = TMP(T * H * s.dv);
    real *dkv = TMP(T * H * (s.nope + s.dv)), *dkva = TMP(T * (s.rkv + s.rope)), *dc = TMP(T * s.rkv);
    real *dcn = TMP(T * s.rkv), *dqa = s.r > 0 ? TMP(T * s.r) : NULL, *dqan = s.r > 0 ? TMP(T * s.r) : NULL;
#undef TMP
    if (!dout || !d_o || !dq || !dk || !dv || !dkv || !dkva || !dc || !dcn || (s.r > 0 && (!dqa || !dqan)))
        return k3c_errf(err, K3C_ENOMEM, "layer %d: MLA backward scratch (arena %zu of %zu used)", l, tmp->used, tmp->cap);
    const real *out = c->mla_output_gate ? a->og : a->o;
    CHECK_RC(k3c_lin_bwd(T, H * s.dv, s.D, out, w + o->o_proj, dy, dout, g + o->o_proj, err));
    if (c->mla_output_gate) {
        real *dgl = dv; /* borrow: same size, zeroed, refilled below */
        CHECK_RC(R(k3c_sigmoid_gate_bwd)(T * H * s.dv, a->o, a->gl, dout, d_o, dgl, err));
        CHECK_RC(k3c_lin_bwd(T, s.D, H * s.dv, xn, w + o->g_proj, dgl, dxn, g + o->g_proj, err));
        memset(dv, 0, sizeof(real) * (size_t)(T * H * s.dv));
    } else {
        memcpy(d_o, dout, sizeof(real) * (size_t)(T * H * s.dv));
    }
    k3c_attention_sizes as = attn_sizes(&s, st->n_docs);
    CHECK_RC(R(k3c_attention_bwd)(&as, st->cu, a->q, a->k, a->v, a->o, a->lse, d_o, dq, dk, dv, st->scratch, err));
    /* split dk back into k_nope (per head) and the shared k_pe (summed over heads), dv into kv_b's v rows */
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            real *dkvh = dkv + (t * H + h) * (s.nope + s.dv);
            const real *dkh = dk + (t * H + h) * s.dqk;
            for (int64_t i = 0; i < s.nope; i++) dkvh[i] += dkh[i];
            for (int64_t i = 0; i < s.dv; i++) dkvh[s.nope + i] += dv[(t * H + h) * s.dv + i];
            real *dpe = dkva + t * (s.rkv + s.rope) + s.rkv;
            for (int64_t i = 0; i < s.rope; i++) dpe[i] += dkh[s.nope + i];
        }
    CHECK_RC(k3c_lin_bwd(T, s.rkv, H * (s.nope + s.dv), a->cn, w + o->kv_b, dkv, dcn, g + o->kv_b, err));
    k3c_rmsnorm_sizes rc = {T, s.rkv, c->mla_norm_eps};
    CHECK_RC(R(k3c_rmsnorm_bwd)(&rc, a->c, w + o->kv_a_norm, a->rc, dcn, dc, g + o->kv_a_norm, err));
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < s.rkv; i++) dkva[t * (s.rkv + s.rope) + i] += dc[t * s.rkv + i];
    CHECK_RC(k3c_lin_bwd(T, s.D, s.rkv + s.rope, xn, w + o->kv_a, dkva, dxn, g + o->kv_a, err));
    if (s.r > 0) {
        CHECK_RC(k3c_lin_bwd(T, s.r, H * s.dqk, a->qan, w + o->q_b, dq, dqan, g + o->q_b, err));
        k3c_rmsnorm_sizes rs = {T, s.r, c->mla_norm_eps};
        CHECK_RC(R(k3c_rmsnorm_bwd)(&rs, a->qa, w + o->q_a_norm, a->rqa, dqan, dqa, g + o->q_a_norm, err));
        CHECK_RC(k3c_lin_bwd(T, s.D, s.r, xn, w + o->q_a, dqa, dxn, g + o->q_a, err));
    } else {
        CHECK_RC(k3c_lin_bwd(T, s.D, H * s.dqk, xn, w + o->q_proj, dq, dxn, g + o->q_proj, err));
    }
    return K3C_OK;
}
