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
    k3c_attention_sizes a = {s->T, s->H, s->dqk, s->dv, n_docs, 1.0 / sqrt((double)s->dqk), 0, 0, 0};
    return a;
}

/* Tokens of the key side: T, or under context parallelism (model.h k3c_context_exchange) the sequence up to this
 * rank's last token; the queries then sit at rows [start, start + T) of zero-padded buffers of that many rows (the
 * padding rows have zero queries and zero output gradients, so they add nothing to the keys' and values' gradients,
 * and attention_max_logit skips them). Planned for the sequence's capacity, or for Tk: the whole sequence when the
 * layer runs in slices of it (sliced recompute). */
static int64_t keys_cap(const k3c_model *m, int64_t Tk) {
    return m->context && m->context->T_cap > Tk ? m->context->T_cap : Tk;
}

size_t k3c_mla_scratch(const k3c_model *m, int64_t Tk, int n_docs) {
    mla_shape s = shape_of(m, keys_cap(m, Tk));
    k3c_attention_sizes as = attn_sizes(&s, n_docs);
    const k3c_backend *be = k3c_model_backend(m);
    size_t f = be->attention_fwd_workspace(&as), b = be->attention_bwd_workspace(&as);
    return f > b ? f : b;
}

void k3c_mla_alloc(const k3c_model *m, int64_t T, int64_t Tk, k3c_acts_carver *c, k3c_mla_acts *a) {
    mla_shape s = shape_of(m, T);
    Tk = keys_cap(m, Tk);
    memset(a, 0, sizeof *a);
    if (s.r > 0) {
        a->qa = K3C_CARVE_DEV(c, real, T * s.r);
        a->qan = K3C_CARVE_DEV(c, real, T * s.r);
        a->rqa = K3C_CARVE_DEV(c, real, T);
    }
    a->q = K3C_CARVE_DEV(c, real, Tk * s.H * s.dqk);
    a->kva = K3C_CARVE_DEV(c, real, T * (s.rkv + s.rope));
    a->c = K3C_CARVE_DEV(c, real, T * s.rkv);
    a->cn = K3C_CARVE_DEV(c, real, T * s.rkv);
    a->rc = K3C_CARVE_DEV(c, real, T);
    a->cnk = m->context || Tk > T ? K3C_CARVE_DEV(c, real, Tk * s.rkv) : a->cn;
    a->kv = K3C_CARVE_DEV(c, real, Tk * s.H * (s.nope + s.dv));
    a->k = K3C_CARVE_DEV(c, real, Tk * s.H * s.dqk);
    a->v = K3C_CARVE_DEV(c, real, Tk * s.H * s.dv);
    a->o = K3C_CARVE_DEV(c, real, Tk * s.H * s.dv);
    a->lse = K3C_CARVE_DEV(c, real, Tk * s.H);
    if (m->cfg.mla_output_gate) {
        a->gl = K3C_CARVE_DEV(c, real, T * s.H * s.dv);
        a->og = K3C_CARVE_DEV(c, real, T * s.H * s.dv);
    }
}

/* The latent c = kv_a x's first rkv columns, normalised (k_pe, the rest of kva, stays where it is). */
static int latent_norm(k3c_step *st, const mla_shape *s, const k3c_weights_layer *L, k3c_mla_acts *a, k3c_err *err) {
    const int64_t lkva = s->rkv + s->rope;
    CHECK_RC(st->be->copy2d(s->T, s->rkv, a->kva, lkva, a->c, s->rkv, 0, err));
    k3c_rmsnorm_sizes rc = {s->T, s->rkv, st->m->cfg.mla_norm_eps};
    return st->be->rmsnorm_fwd(&rc, a->c, L->kv_a_norm, a->cn, a->rc, err);
}

/* These tokens' [latent ; k_pe] rows into the sequence's rows of the context exchange (model.h). */
static int latent_put(k3c_step *st, int l, const mla_shape *s, const k3c_mla_acts *a, k3c_err *err) {
    const k3c_context_exchange *cx = st->m->context;
    const int64_t lkva = s->rkv + s->rope, t0 = cx->start;
    real *lat = cx->mla_buf(cx->ctx, l, 0);
    CHECK_RC(st->be->copy2d(s->T, s->rkv, a->cn, s->rkv, lat + t0 * lkva, lkva, 0, err));
    return st->be->copy2d(s->T, s->rope, a->kva + s->rkv, lkva, lat + t0 * lkva + s->rkv, lkva, 0, err);
}

int k3c_mla_layer_latent(k3c_step *st, int l, const real *xn, k3c_mla_acts *a, k3c_err *err) {
    const mla_shape s = shape_of(st->m, st->T);
    const k3c_weights_layer *L = &st->views->layer[l];
    CHECK_RC(k3c_proj1(st, s.T, &L->kv_a, s.D, s.rkv + s.rope, xn, a->kva, err));
    CHECK_RC(latent_norm(st, &s, L, a, err));
    return latent_put(st, l, &s, a, err);
}

/* Attention over the keys of a training forward: the latent expanded by kv_b into per-head keys [k_nope_h ; k_pe]
 * (k_pe shared by all heads, never rotated) and values, causal attention inside the documents (context parallelism:
 * over the sequence's keys up to this rank's last token), and QK-Clip's S_max. *out: the heads' outputs [T, H·dv]. */
static int attend_expanded(k3c_step *st, int l, const mla_shape *s, const k3c_weights_layer *L, k3c_mla_acts *a,
                           const real **out, k3c_err *err) {
    const k3c_model *m = st->m;
    const k3c_context_exchange *cx = m->context;
    const int64_t T = s->T, H = s->H, t0 = cx ? cx->start : 0, Tk = cx ? cx->T_keys : T;
    const int64_t lkva = s->rkv + s->rope, lkv = s->nope + s->dv;
    const real *kva = a->kva; /* [Tk, rkv + rope]: the normalised latent is read from cnk, k_pe from here */
    if (cx) {                 /* this rank's [latent ; k_pe] rows into the sequence's, gathered from every rank */
        real *lat = cx->mla_buf(cx->ctx, l, 0);
        CHECK_RC(latent_put(st, l, s, a, err));
        CHECK_RC(cx->mla_gather(cx->ctx, l, err));
        CHECK_RC(st->be->copy2d(Tk, s->rkv, lat, lkva, a->cnk, s->rkv, 0, err));
        kva = lat;
    }
    CHECK_RC(k3c_proj1(st, Tk, &L->kv_b, s->rkv, H * lkv, a->cnk, a->kv, err));
    CHECK_RC(st->be->copy2d(Tk * H, s->nope, a->kv, lkv, a->k, s->dqk, 0, err));
    for (int64_t h = 0; h < H; h++)
        CHECK_RC(st->be->copy2d(Tk, s->rope, kva + s->rkv, lkva, a->k + h * s->dqk + s->nope, H * s->dqk, 0, err));
    CHECK_RC(st->be->copy2d(Tk * H, s->dv, a->kv + s->nope, lkv, a->v, s->dv, 0, err));
    k3c_attention_sizes as = attn_sizes(s, cx ? cx->n_docs_keys : st->n_docs);
    const int32_t *cu = cx ? cx->cu_keys : st->cu;
    as.T = Tk, as.q_begin = t0;
    CHECK_RC(st->be->attention_fwd(&as, cu, a->q, a->k, a->v, a->o, a->lse, st->scratch, err));
    /* S_max of QK-Clip (§10.2) from the queries and keys while they are live (recomputed layers share buffers); a
       sliced layer's at its last slice, when the rows before it hold the earlier slices' queries */
    k3c_attention_sizes ms = as;
    if (cx && cx->sliced) ms.q_begin = 0;
    if (m->stats && m->stats->smax && !st->no_stats && (!cx || !cx->sliced || t0 + T == cx->T_cap))
        CHECK_RC(st->be->attention_max_logit(
            &ms, cu, a->q, a->k, m->stats->smax + (size_t)(l * m->cfg.mla_heads + k3c_tp_rank(m) * H), err));
    *out = a->o + t0 * H * s->dv;
    return K3C_OK;
}

/* Attention over the latent cache of a decode step (MODEL.md §4.2 "Absorbed form"): [c_KV (normalised) ; k_pe] of every
 * new row appended to its sequence's cache before anyone attends (a token sees itself); per head the query moves into
 * latent space, q̃_h = [W_UK,hᵀ q_nope,h ; q_pe,h], attends over the cached rows (MQA: values are the cached latents),
 * and the output returns with W_UV,h. Keys and values are never expanded. *out: [n, H·dv]. */
static int attend_absorbed(k3c_step *st, int l, const mla_shape *s, const k3c_weights_layer *L, k3c_mla_acts *a,
                           const real **out, k3c_err *err) {
#if K3C_REAL_DOUBLE
    (void)l, (void)s, (void)L, (void)a, (void)out;
    return k3c_errf(err, K3C_EUNSUPPORTED, "decode step: float32 only");
#else
    const k3c_decode *d = st->dec;
    const k3c_dec_ops *op = d->ops;
    const int64_t n = s->T, H = s->H, nope = s->nope, rope = s->rope, dqk = s->dqk, rkv = s->rkv;
    const int64_t lw = rkv + rope;
    const int j = d->idx[l];
    CHECK_RC(op->cache_put(d->batch, d->dims, j, a->cn, a->kva, err));
    CHECK_RC(op->qmat_mul_heads(st->be->ctx, L->uk_t, H, a->q, H * dqk, dqk, n, d->qlat, lw, n * lw, d->heads_ws, err));
    if (n <= H) /* the rope parts: one strided copy per row or per head, whichever is fewer */
        for (int64_t r = 0; r < n; r++)
            CHECK_RC(st->be->copy2d(H, rope, a->q + r * H * dqk + nope, dqk, d->qlat + r * lw + rkv, n * lw, 0, err));
    else
        for (int64_t h = 0; h < H; h++)
            CHECK_RC(st->be->copy2d(n, rope, a->q + h * dqk + nope, H * dqk, d->qlat + h * n * lw + rkv, lw, 0, err));
    const float scale = (float)(1.0 / sqrt((double)dqk));
    CHECK_RC(op->attend(d->batch, d->dims, j, d->qlat, scale, d->olat, d->att_ws, err));
    /* the head outputs o_h = W_UV,h õ_h straight into their columns of o [n, H·dv] */
    CHECK_RC(op->qmat_mul_heads(st->be->ctx, L->uv, H, d->olat, rkv, n * rkv, n, a->o, H * s->dv, s->dv, d->heads_ws,
                                err));
    *out = a->o;
    return K3C_OK;
#endif
}

int k3c_mla_layer_fwd(k3c_step *st, int l, const real *xn, k3c_mla_acts *a, real *y, k3c_err *err) {
    const k3c_model *m = st->m;
    const k3c_config *c = &m->cfg;
    const k3c_weights_layer *L = &st->views->layer[l];
    mla_shape s = shape_of(m, st->T);
    int64_t T = s.T, H = s.H;
    const k3c_context_exchange *cx = m->context;
    const int64_t t0 = cx ? cx->start : 0, Tk = cx ? cx->T_keys : T; /* queries: rows [t0, t0 + T) of Tk */
    if (cx && !cx->sliced) CHECK_RC(st->be->zero(a->q, Tk * H * s.dqk, err));
    real *q = a->q + t0 * H * s.dqk;
    /* every product of xn in one pass: the query's first factor, [latent ; k_pe], the output gate's logits */
    k3c_proj_job xj[3] = {s.r > 0 ? (k3c_proj_job){&L->q_a, xn, a->qa, s.D, s.r}
                                  : (k3c_proj_job){&L->q_proj, xn, q, s.D, H * s.dqk},
                          {&L->kv_a, xn, a->kva, s.D, s.rkv + s.rope},
                          {&L->g_proj, xn, a->gl, s.D, H * s.dv}};
    CHECK_RC(k3c_proj(st, T, xj, c->mla_output_gate ? 3 : 2, err));
    if (s.r > 0) {
        k3c_rmsnorm_sizes rs = {T, s.r, c->mla_norm_eps};
        CHECK_RC(st->be->rmsnorm_fwd(&rs, a->qa, L->q_a_norm, a->qan, a->rqa, err));
        CHECK_RC(k3c_proj1(st, T, &L->q_b, s.r, H * s.dqk, a->qan, q, err));
    }
    CHECK_RC(latent_norm(st, &s, L, a, err));
    const real *out = NULL;
    CHECK_RC(st->dec ? attend_absorbed(st, l, &s, L, a, &out, err) : attend_expanded(st, l, &s, L, a, &out, err));
    if (c->mla_output_gate) {
        CHECK_RC(st->be->sigmoid_gate_fwd(T * H * s.dv, out, a->gl, a->og, err));
        out = a->og;
    }
    /* row-parallel under tensor parallelism: the caller sums y */
    return k3c_proj1(st, T, &L->o_proj, c->mla_heads * s.dv / k3c_tp_size(m), s.D, out, y, err);
}

size_t k3c_mla_bwd_bytes(const k3c_model *m, int64_t T, int64_t Tk) {
    mla_shape s = shape_of(m, T);
    Tk = keys_cap(m, Tk);
    int64_t n = T * s.H * s.dv + Tk * s.H * s.dv + Tk * s.H * s.dqk + Tk * s.H * s.dqk + Tk * s.H * s.dv +
                Tk * s.H * (s.nope + s.dv) + T * (s.rkv + s.rope) + 2 * T * s.rkv + 2 * T * s.r +
                (m->context || Tk > T ? Tk * s.rkv : 0);
    return sizeof(real) * (size_t)n + 17 * 64;
}

int k3c_mla_layer_bwd(k3c_step *st, int l, const real *xn, k3c_mla_acts *a, const real *dy, real *dxn, k3c_arena *tmp,
                      k3c_err *err) {
    const k3c_model *m = st->m;
    const k3c_config *c = &m->cfg;
    const k3c_layer_offsets *o = &m->table.layer[l];
    const real *w = st->w;
    real *g = st->g;
    mla_shape s = shape_of(m, st->T);
    int64_t T = s.T, H = s.H;
    const k3c_context_exchange *cx = m->context;
    const int64_t t0 = cx ? cx->start : 0, Tk = cx ? cx->T_keys : T; /* as in the forward */
#define TMP(n) k3c_tmp_zeros(st, tmp, (n), err)
    real *dout = TMP(T * H * s.dv), *d_o = TMP(Tk * H * s.dv);
    real *dq = TMP(Tk * H * s.dqk), *dk = TMP(Tk * H * s.dqk), *dv = TMP(Tk * H * s.dv);
    real *dkv = TMP(Tk * H * (s.nope + s.dv)), *dkva = TMP(T * (s.rkv + s.rope)), *dc = TMP(T * s.rkv);
    real *dcn = TMP(T * s.rkv), *dqa = s.r > 0 ? TMP(T * s.r) : NULL, *dqan = s.r > 0 ? TMP(T * s.r) : NULL;
    real *dcnk = cx ? TMP(Tk * s.rkv) : dcn;
#undef TMP
    if (!dout || !d_o || !dq || !dk || !dv || !dkv || !dkva || !dc || !dcn || !dcnk || (s.r > 0 && (!dqa || !dqan)))
        return k3c_errf(err, K3C_ENOMEM, "layer %d: MLA backward scratch (arena %zu of %zu used)", l, tmp->used,
                        tmp->cap);
    const real *out = c->mla_output_gate ? a->og : a->o + t0 * H * s.dv; /* as in the forward */
    CHECK_RC(k3c_lin_rowpar_bwd(st, T, c->mla_heads * s.dv, s.D, out, w + o->o_proj, dy, dout, g + o->o_proj, err));
    real *d_oq = d_o + t0 * H * s.dv; /* the queries' rows; the padding rows keep a zero output gradient */
    if (c->mla_output_gate) {
        real *dgl = dv; /* borrow: same size, zeroed, refilled below */
        CHECK_RC(st->be->sigmoid_gate_bwd(T * H * s.dv, a->o + t0 * H * s.dv, a->gl, dout, d_oq, dgl, err));
        CHECK_RC(k3c_lin_bwd(st, T, s.D, H * s.dv, xn, w + o->g_proj, dgl, dxn, g + o->g_proj, err));
        CHECK_RC(st->be->zero(dv, T * H * s.dv, err));
    } else {
        CHECK_RC(st->be->copy2d(1, T * H * s.dv, dout, 0, d_oq, 0, 0, err));
    }
    k3c_attention_sizes as = attn_sizes(&s, cx ? cx->n_docs_keys : st->n_docs);
    as.T = Tk, as.q_begin = t0;
    CHECK_RC(st->be->attention_bwd(&as, cx ? cx->cu_keys : st->cu, a->q, a->k, a->v, a->o, a->lse, d_o, dq, dk, dv,
                                   st->scratch, err));
    /* split dk back into k_nope (per head) and the shared k_pe (summed over heads in order), dv into kv_b's v rows;
       the key side's [latent ; k_pe] gradient collects in dlat (context parallelism: the sequence's, then summed
       over the ranks and this rank's rows taken) */
    const int64_t lkva = s.rkv + s.rope, lkv = s.nope + s.dv;
    real *dlat = cx ? cx->mla_buf(cx->ctx, l, 1) : dkva;
    CHECK_RC(st->be->copy2d(Tk * H, s.nope, dk, s.dqk, dkv, lkv, 1, err));
    CHECK_RC(st->be->copy2d(Tk * H, s.dv, dv, s.dv, dkv + s.nope, lkv, 1, err));
    for (int64_t h = 0; h < H; h++)
        CHECK_RC(st->be->copy2d(Tk, s.rope, dk + h * s.dqk + s.nope, H * s.dqk, dlat + s.rkv, lkva, 1, err));
    CHECK_RC(k3c_lin_bwd(st, Tk, s.rkv, H * (s.nope + s.dv), a->cnk, w + o->kv_b, dkv, dcnk, g + o->kv_b, err));
    if (cx) {
        CHECK_RC(st->be->copy2d(Tk, s.rkv, dcnk, s.rkv, dlat, lkva, 1, err));
        CHECK_RC(cx->mla_scatter(cx->ctx, l, err));
        CHECK_RC(st->be->copy2d(T, s.rkv, dlat + t0 * lkva, lkva, dcn, s.rkv, 0, err));
        CHECK_RC(st->be->copy2d(T, s.rope, dlat + t0 * lkva + s.rkv, lkva, dkva + s.rkv, lkva, 0, err));
    }
    k3c_rmsnorm_sizes rc = {T, s.rkv, c->mla_norm_eps};
    CHECK_RC(st->be->rmsnorm_bwd(&rc, a->c, w + o->kv_a_norm, a->rc, dcn, dc, g + o->kv_a_norm, err));
    CHECK_RC(st->be->copy2d(T, s.rkv, dc, s.rkv, dkva, lkva, 1, err));
    CHECK_RC(k3c_lin_bwd(st, T, s.D, s.rkv + s.rope, xn, w + o->kv_a, dkva, dxn, g + o->kv_a, err));
    const real *dqq = dq + t0 * H * s.dqk;
    if (s.r > 0) {
        CHECK_RC(k3c_lin_bwd(st, T, s.r, H * s.dqk, a->qan, w + o->q_b, dqq, dqan, g + o->q_b, err));
        k3c_rmsnorm_sizes rs = {T, s.r, c->mla_norm_eps};
        CHECK_RC(st->be->rmsnorm_bwd(&rs, a->qa, w + o->q_a_norm, a->rqa, dqan, dqa, g + o->q_a_norm, err));
        CHECK_RC(k3c_lin_bwd(st, T, s.D, s.r, xn, w + o->q_a, dqa, dxn, g + o->q_a, err));
    } else {
        CHECK_RC(k3c_lin_bwd(st, T, s.D, H * s.dqk, xn, w + o->q_proj, dqq, dxn, g + o->q_proj, err));
    }
    return K3C_OK;
}
