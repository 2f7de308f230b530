/* layer_kda.c — the KDA token mixer of one decoder layer, forward and backward: q/k/v projections, short conv + SiLU,
 * L2 norm, β, the forget gate, the delta-rule core, gated head-wise RMSNorm, o_proj. Spec: docs/MODEL.md §3.1, §3.4. */
#include "base/check.h"
#include "base/real.h"
#include "model/layers.h"

typedef struct {
    int64_t T, D, H, dk, P, W;
} kda_shape;

/* This rank's heads (all of them alone; tensor parallelism: kda_heads / size). */
static kda_shape shape_of(const k3c_model *m, int64_t T) {
    const k3c_config *c = &m->cfg;
    int64_t H = c->kda_heads / k3c_tp_size(m);
    kda_shape s = {T, c->hidden_size, H, c->kda_head_dim, H * c->kda_head_dim, c->conv_kernel};
    return s;
}

static k3c_kda_dims core_dims(const k3c_model *m, int64_t T, int n_docs) {
    const k3c_config *c = &m->cfg;
    k3c_kda_dims d = {T,
                      c->kda_heads / k3c_tp_size(m),
                      c->kda_head_dim,
                      c->kda_head_dim,
                      n_docs,
                      m->kda_chunk,
                      0,
                      c->kda_gate == K3C_GATE_LOWER_BOUND ? c->gate_lower_bound : 0};
    return d;
}

size_t k3c_kda_scratch(const k3c_model *m, int64_t T, int n_docs) {
    const k3c_backend *be = k3c_model_backend(m);
    k3c_kda_dims d = core_dims(m, T, n_docs);
    k3c_short_conv_dims cd = {T, shape_of(m, T).P, (int)m->cfg.conv_kernel, n_docs};
    size_t a = be->kda_fwd_workspace(&d), b = be->kda_bwd_workspace(&d), c = be->short_conv_bwd_workspace(&cd);
    a = a > b ? a : b;
    return a > c ? a : c;
}

void k3c_kda_alloc(const k3c_model *m, int64_t T, k3c_acts_carver *c, k3c_kda_acts *a) {
    kda_shape s = shape_of(m, T);
    a->qh = K3C_CARVE_DEV(c, real, T * s.P);
    a->kh = K3C_CARVE_DEV(c, real, T * s.P);
    a->vh = K3C_CARVE_DEV(c, real, T * s.P);
    a->qn = K3C_CARVE_DEV(c, real, T * s.P);
    a->kn = K3C_CARVE_DEV(c, real, T * s.P);
    a->vc = K3C_CARVE_DEV(c, real, T * s.P);
    a->rq = K3C_CARVE_DEV(c, real, T * s.H);
    a->rk = K3C_CARVE_DEV(c, real, T * s.H);
    a->blog = K3C_CARVE_DEV(c, real, T * s.H);
    a->beta = K3C_CARVE_DEV(c, real, T * s.H);
    a->fa = K3C_CARVE_DEV(c, real, T * s.dk);
    a->z = K3C_CARVE_DEV(c, real, T * s.P);
    a->g = K3C_CARVE_DEV(c, real, T * s.P);
    a->o = K3C_CARVE_DEV(c, real, T * s.P);
    a->ga = m->cfg.kda_full_rank_gate ? NULL : K3C_CARVE_DEV(c, real, T * s.dk);
    a->gl = K3C_CARVE_DEV(c, real, T * s.P);
    a->y1 = K3C_CARVE_DEV(c, real, T * s.P);
    a->ro = K3C_CARVE_DEV(c, real, T * s.H);
}

/* Context parallelism (model.h k3c_context_exchange): the first local document piece may continue the previous rank's
 * last and the last continue into the next rank's first. Those two pieces run as their own calls, the first from the
 * received conv tail or KDA state, the last handing its final state on; the pieces between run as one call. */
typedef struct {
    int64_t t0, T;
    int n_docs;
    const int32_t *cu;
    int first, last; /* holds the first / last local piece */
} cp_seg;

/* The calls over the local tokens: one over all of them (cont 0), else the first piece, the pieces between (if any)
 * and the last piece. */
static int cp_segments(const k3c_step *st, int cont, cp_seg *seg) {
    const k3c_context_exchange *cx = st->m->context;
    if (!cont || st->n_docs == 1) {
        seg[0] = (cp_seg){0, st->T, st->n_docs, cont ? NULL : st->cu, 1, 1};
        return 1;
    }
    int64_t e0 = cx->first_len, e1 = e0 + cx->cu_rest[st->n_docs - 2];
    int n = 0;
    seg[n++] = (cp_seg){0, e0, 1, NULL, 1, 0};
    if (st->n_docs > 2) seg[n++] = (cp_seg){e0, e1 - e0, st->n_docs - 2, cx->cu_rest_ops, 0, 0};
    seg[n++] = (cp_seg){e1, st->T - e1, 1, NULL, 0, 1};
    return n;
}

/* Short conv + SiLU of x [T, C]; under context parallelism the first piece starts from the previous rank's tail. */
static int conv_fwd(k3c_step *st, int l, int i, int64_t C, int W, const real *x, const real *w, real *y, k3c_err *err) {
    const k3c_context_exchange *cx = st->m->context;
    void *state = NULL;
    if (cx) CHECK_RC(cx->conv_tail(cx->ctx, l, i, x, st->T, C, W, &state, err));
    cp_seg seg[3];
    int n = cp_segments(st, state != NULL, seg);
    for (int j = 0; j < n; j++) {
        k3c_short_conv_dims sd = {seg[j].T, C, W, seg[j].n_docs};
        CHECK_RC(st->be->short_conv_fwd(&sd, seg[j].cu, x + seg[j].t0 * C, w, seg[j].first ? state : NULL,
                                        y + seg[j].t0 * C, NULL, err));
    }
    return K3C_OK;
}

/* Its backward: dx, dw added; under context parallelism the tail's gradient goes back to the previous rank and the
 * next rank's comes into the last W − 1 rows of dx. dstate: [C, W − 1] zeroed scratch. */
static int conv_bwd(k3c_step *st, int l, int i, int64_t C, int W, const real *x, const real *w, const real *dy,
                    real *dx, real *dw, real *dstate, k3c_err *err) {
    const k3c_context_exchange *cx = st->m->context;
    void *state = NULL;
    if (cx) CHECK_RC(cx->conv_tail(cx->ctx, l, i, NULL, st->T, C, W, &state, err));
    cp_seg seg[3];
    int n = cp_segments(st, state != NULL, seg);
    for (int j = 0; j < n; j++) {
        k3c_short_conv_dims sd = {seg[j].T, C, W, seg[j].n_docs};
        int64_t o = seg[j].t0 * C;
        CHECK_RC(st->be->short_conv_bwd(&sd, seg[j].cu, x + o, w, seg[j].first ? state : NULL, dy + o, dx + o, dw,
                                        seg[j].first && state ? dstate : NULL, st->scratch, err));
    }
    return cx ? cx->conv_tail_bwd(cx->ctx, l, i, state ? dstate : NULL, dx, st->T, C, W, err) : K3C_OK;
}

/* The KDA core; under context parallelism the first piece starts from the previous rank's final state and the last
 * piece's final state goes to the next rank. */
static int core_fwd(k3c_step *st, int l, const k3c_kda_dims *kd, k3c_kda_acts *a, k3c_err *err) {
    const k3c_context_exchange *cx = st->m->context;
    const int cont = cx && (cx->cont_prev || cx->cont_next);
    if (cont && cx->cont_prev) CHECK_RC(cx->kda_pass(cx->ctx, l, K3C_CP_H0, err));
    const real *h0 = cont ? cx->kda_buf(cx->ctx, l, K3C_CP_H0) : NULL;
    real *ht = cont ? cx->kda_buf(cx->ctx, l, K3C_CP_HT) : NULL;
    cp_seg seg[3];
    int n = cp_segments(st, cont, seg);
    const int64_t P = kd->H * kd->dk, H = kd->H;
    for (int j = 0; j < n; j++) {
        k3c_kda_dims sd = *kd;
        sd.T = seg[j].T, sd.n_docs = seg[j].n_docs;
        int64_t o = seg[j].t0 * P;
        CHECK_RC(st->be->kda_fwd(&sd, seg[j].cu, a->qn + o, a->kn + o, a->vc + o, a->g + o, a->beta + seg[j].t0 * H,
                                 seg[j].first ? h0 : NULL, a->o + o, seg[j].last ? ht : NULL, st->scratch, err));
    }
    return ht ? cx->kda_pass(cx->ctx, l, K3C_CP_HT, err) : K3C_OK;
}

/* Its backward: the state gradient comes back from the next rank and goes on to the previous one. */
static int core_bwd(k3c_step *st, int l, const k3c_kda_dims *kd, k3c_kda_acts *a, const real *d_o, real *dq, real *dk,
                    real *dv, real *dgate, real *dbeta, k3c_err *err) {
    const k3c_context_exchange *cx = st->m->context;
    const int cont = cx && (cx->cont_prev || cx->cont_next);
    if (cont && cx->cont_next) CHECK_RC(cx->kda_pass(cx->ctx, l, K3C_CP_DHT, err));
    const real *h0 = cont ? cx->kda_buf(cx->ctx, l, K3C_CP_H0) : NULL;
    const real *dht = cont ? cx->kda_buf(cx->ctx, l, K3C_CP_DHT) : NULL;
    real *dh0 = cont ? cx->kda_buf(cx->ctx, l, K3C_CP_DH0) : NULL;
    cp_seg seg[3];
    int n = cp_segments(st, cont, seg);
    const int64_t P = kd->H * kd->dk, H = kd->H;
    for (int j = 0; j < n; j++) {
        k3c_kda_dims sd = *kd;
        sd.T = seg[j].T, sd.n_docs = seg[j].n_docs;
        int64_t o = seg[j].t0 * P, ob = seg[j].t0 * H;
        CHECK_RC(st->be->kda_bwd(&sd, seg[j].cu, a->qn + o, a->kn + o, a->vc + o, a->g + o, a->beta + ob,
                                 seg[j].first ? h0 : NULL, d_o + o, seg[j].last ? dht : NULL, dq + o, dk + o, dv + o,
                                 dgate + o, dbeta + ob, seg[j].first ? dh0 : NULL, st->scratch, err));
    }
    return dh0 ? cx->kda_pass(cx->ctx, l, K3C_CP_DH0, err) : K3C_OK;
}

/* Short conv + SiLU of q, k and v, then q and k L2-normalised per head: in a decode step the engine's one op over every
 * segment from and into its conv tails (after S [H, dk, dk] in the layer's state block). */
static int conv_qkv_fwd(k3c_step *st, int l, const kda_shape *s, const k3c_weights_layer *L, k3c_kda_acts *a,
                        k3c_err *err) {
    const real *pre[3] = {a->qh, a->kh, a->vh}, *Wc[3] = {L->q_conv, L->k_conv, L->v_conv};
    real *post[3] = {a->qn, a->kn, a->vc};
#if !K3C_REAL_DOUBLE
    const k3c_decode *d = st->dec;
    if (d) {
        const int64_t off = (int64_t)d->idx[l] * d->dims->kda_floats + s->H * s->dk * s->dk;
        return d->ops->qkv_conv(d->batch, d->dims, off, pre, Wc, post, err);
    }
#endif
    for (int i = 0; i < 3; i++) CHECK_RC(conv_fwd(st, l, i, s->P, (int)s->W, pre[i], Wc[i], post[i], err));
    k3c_l2norm_dims ld = {s->T * s->H, s->dk, 1e-6};
    CHECK_RC(st->be->l2norm_fwd(&ld, a->qn, a->qn, a->rq, err));
    return st->be->l2norm_fwd(&ld, a->kn, a->kn, a->rk, err);
}

/* The delta-rule core: in a decode step per segment from and into its KDA state (the recurrence for one token, the
 * chunked form for a run of them), else over the batch's documents. */
static int core_any_fwd(k3c_step *st, int l, const k3c_kda_dims *kd, k3c_kda_acts *a, k3c_err *err) {
#if !K3C_REAL_DOUBLE
    const k3c_decode *d = st->dec;
    if (d)
        return d->ops->kda(d->batch, d->dims, (int64_t)d->idx[l] * d->dims->kda_floats, a->qn, a->kn, a->vc, a->g,
                           a->beta, kd->gate_lower_bound, a->o, d->kda_ws, err);
#endif
    CHECK_RC(k3c_model_check_backend(st->m, st->be, err)); /* kda_chunk may have changed since the backend was bound */
    return core_fwd(st, l, kd, a, err);
}

int k3c_kda_layer_fwd(k3c_step *st, int l, const real *xn, k3c_kda_acts *a, real *y, k3c_err *err) {
    const k3c_model *m = st->m;
    const k3c_config *c = &m->cfg;
    const k3c_weights_layer *L = &st->views->layer[l];
    kda_shape s = shape_of(m, st->T);
    int64_t T = s.T;
    const int full = c->kda_full_rank_gate;
    /* every product of xn in one pass: q, k, v, β's logits, the forget gate's first factor, the output gate's */
    const k3c_proj_job xj[6] = {{&L->q_proj, xn, a->qh, s.D, s.P},
                                {&L->k_proj, xn, a->kh, s.D, s.P},
                                {&L->v_proj, xn, a->vh, s.D, s.P},
                                {&L->b_proj, xn, a->blog, s.D, s.H},
                                {&L->f_a, xn, a->fa, s.D, s.dk},
                                full ? (k3c_proj_job){&L->g_proj, xn, a->gl, s.D, s.P}
                                     : (k3c_proj_job){&L->g_a, xn, a->ga, s.D, s.dk}};
    CHECK_RC(k3c_proj(st, T, xj, 6, err));
    CHECK_RC(conv_qkv_fwd(st, l, &s, L, a, err));
    CHECK_RC(st->be->sigmoid(T * s.H, a->blog, a->beta, err));
    /* the second factors: the forget gate's z = f_b f_a x and the low-rank output gate's logits */
    const k3c_proj_job sj[2] = {{&L->f_b, a->fa, a->z, s.dk, s.P}, {&L->g_b, a->ga, a->gl, s.dk, s.P}};
    CHECK_RC(k3c_proj(st, T, sj, full ? 1 : 2, err));
    k3c_kda_gate_dims gd = {T, s.H, s.dk, c->kda_gate, c->gate_lower_bound};
    CHECK_RC(st->be->kda_gate_fwd(&gd, a->z, L->dt_bias, L->A_log, a->g, err));
    k3c_kda_dims kd = core_dims(m, T, st->n_docs);
    CHECK_RC(core_any_fwd(st, l, &kd, a, err));
    k3c_rmsnorm_sizes rs = {T * s.H, s.dk, c->rms_norm_eps};
    CHECK_RC(st->be->gated_rmsnorm_fwd(&rs, a->o, a->gl, L->o_norm, a->y1, a->ro, err));
    /* row-parallel under tensor parallelism: the caller sums y */
    return k3c_proj1(st, T, &L->o_proj, c->kda_heads * s.dk / k3c_tp_size(m), s.D, a->y1, y, err);
}

size_t k3c_kda_bwd_bytes(const k3c_model *m, int64_t T) {
    kda_shape s = shape_of(m, T);
    return sizeof(real) * (size_t)(T * (7 * s.P + 3 * s.dk + 2 * s.H) + s.P * s.W) + 17 * 64;
}

int k3c_kda_layer_bwd(k3c_step *st, int l, const real *xn, k3c_kda_acts *a, const real *dy, real *dxn, k3c_arena *tmp,
                      k3c_err *err) {
    const k3c_model *m = st->m;
    const k3c_config *c = &m->cfg;
    const k3c_layer_offsets *o = &m->table.layer[l];
    const real *w = st->w;
    real *g = st->g;
    kda_shape s = shape_of(m, st->T);
    int64_t T = s.T;
    real *dy1 = k3c_tmp_zeros(st, tmp, T * s.P, err), *d_o = k3c_tmp_zeros(st, tmp, T * s.P, err);
    real *dgl = k3c_tmp_zeros(st, tmp, T * s.P, err), *dlow = k3c_tmp_zeros(st, tmp, T * s.dk, err);
    if (!dy1 || !d_o || !dgl || !dlow) return k3c_errf(err, K3C_ENOMEM, "layer %d: KDA backward scratch", l);
    CHECK_RC(k3c_lin_rowpar_bwd(st, T, c->kda_heads * s.dk, s.D, a->y1, w + o->o_proj, dy, dy1, g + o->o_proj, err));
    k3c_rmsnorm_sizes rs = {T * s.H, s.dk, c->rms_norm_eps};
    CHECK_RC(st->be->gated_rmsnorm_bwd(&rs, a->o, a->gl, w + o->o_norm, a->ro, dy1, d_o, dgl, g + o->o_norm, err));
    if (c->kda_full_rank_gate) {
        CHECK_RC(k3c_lin_bwd(st, T, s.D, s.P, xn, w + o->g_proj, dgl, dxn, g + o->g_proj, err));
    } else {
        CHECK_RC(k3c_lin_bwd(st, T, s.dk, s.P, a->ga, w + o->g_b, dgl, dlow, g + o->g_b, err));
        CHECK_RC(k3c_lin_bwd(st, T, s.D, s.dk, xn, w + o->g_a, dlow, dxn, g + o->g_a, err));
    }
    /* the core: gradients w.r.t. the normalised q, k, the conv output v, the log-decay and β */
    real *dq = dy1, *dk = dgl; /* reuse: both consumed above */
    CHECK_RC(st->be->zero(dq, T * s.P, err));
    CHECK_RC(st->be->zero(dk, T * s.P, err));
    real *dv = k3c_tmp_zeros(st, tmp, T * s.P, err), *dgate = k3c_tmp_zeros(st, tmp, T * s.P, err);
    real *dbeta = k3c_tmp_zeros(st, tmp, T * s.H, err), *dblog = k3c_tmp_zeros(st, tmp, T * s.H, err);
    if (!dv || !dgate || !dbeta || !dblog) return k3c_errf(err, K3C_ENOMEM, "layer %d: KDA backward scratch", l);
    k3c_kda_dims kd = core_dims(m, T, st->n_docs);
    CHECK_RC(core_bwd(st, l, &kd, a, d_o, dq, dk, dv, dgate, dbeta, err));
    CHECK_RC(st->be->sigmoid_bwd(T * s.H, a->beta, dbeta, dblog, err));
    CHECK_RC(k3c_lin_bwd(st, T, s.D, s.H, xn, w + o->b_proj, dblog, dxn, g + o->b_proj, err));
    /* forget gate: g ← gate(z + dt_bias; A_log), z = f_b f_a x */
    real *dz = d_o; /* consumed by the core backward */
    CHECK_RC(st->be->zero(dz, T * s.P, err));
    CHECK_RC(st->be->zero(dlow, T * s.dk, err));
    k3c_kda_gate_dims gd = {T, s.H, s.dk, c->kda_gate, c->gate_lower_bound};
    CHECK_RC(
        st->be->kda_gate_bwd(&gd, a->z, w + o->dt_bias, w + o->A_log, dgate, dz, g + o->dt_bias, g + o->A_log, err));
    CHECK_RC(k3c_lin_bwd(st, T, s.dk, s.P, a->fa, w + o->f_b, dz, dlow, g + o->f_b, err));
    CHECK_RC(k3c_lin_bwd(st, T, s.D, s.dk, xn, w + o->f_a, dlow, dxn, g + o->f_a, err));
    /* q, k: L2 norm, then conv + SiLU, then projection; v: conv + SiLU, projection */
    k3c_l2norm_dims ld = {T * s.H, s.dk, 1e-6};
    real *dconv = dgate, *dpre = dz; /* both consumed */
    const real *dpost[3] = {dq, dk, dv};
    const real *post[3] = {a->qn, a->kn, NULL}, *rstd[3] = {a->rq, a->rk, NULL};
    const real *pre[3] = {a->qh, a->kh, a->vh};
    size_t Wc[3] = {o->q_conv, o->k_conv, o->v_conv}, Wp[3] = {o->q_proj, o->k_proj, o->v_proj};
    real *dstate = k3c_tmp_zeros(st, tmp, s.P * (s.W - 1 > 0 ? s.W - 1 : 1), err);
    if (!dstate) return k3c_errf(err, K3C_ENOMEM, "layer %d: KDA backward scratch", l);
    for (int i = 0; i < 3; i++) {
        const real *dc = dpost[i];
        if (post[i]) {
            CHECK_RC(st->be->zero(dconv, T * s.P, err));
            CHECK_RC(st->be->l2norm_bwd(&ld, post[i], rstd[i], dpost[i], dconv, err));
            dc = dconv;
        }
        CHECK_RC(st->be->zero(dpre, T * s.P, err));
        if (i) CHECK_RC(st->be->zero(dstate, s.P * (s.W - 1 > 0 ? s.W - 1 : 1), err));
        CHECK_RC(conv_bwd(st, l, i, s.P, (int)s.W, pre[i], w + Wc[i], dc, dpre, g + Wc[i], dstate, err));
        CHECK_RC(k3c_lin_bwd(st, T, s.D, s.P, xn, w + Wp[i], dpre, dxn, g + Wp[i], err));
    }
    return K3C_OK;
}
