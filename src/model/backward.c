/* backward.c — the whole-model backward: cross-entropy → lm_head → final norm → output mix → per layer in reverse (FFN,
 * its depth mix, the token mixer, its depth mix), accumulating every parameter gradient into m->g; m->grads hears
 * when the head's and each layer's gradients are final.
 * Spec: docs/MODEL.md §1.2 (RMSNorm backward), §5.4 (AttnRes gradients), §3.4, §4.2, §9.2. */
#include "base/check.h"
#include "base/real.h"
#include "model/acts.h"

void k3c_acts_carve_backward(const k3c_model *m, k3c_acts_carver *cv, k3c_acts *a);
real *k3c_acts_src(const k3c_acts *a, int s);
int k3c_acts_embed_overrides_bwd(k3c_acts *a, int64_t D, k3c_err *err);

static real *src_grad(const k3c_acts *a, int s) {
    return s == K3C_SRC_EMB ? a->demb : s % 2 ? a->dpend[s / 2] : a->dpmid[s / 2];
}

/* Adds the mix's gradient w.r.t. each source into that source's gradient buffer. */
static int mix_bwd(const k3c_acts *a, const k3c_mix *mx, size_t proj, size_t norm, const real *dh, k3c_err *err) {
    const k3c_config *c = &a->st.m->cfg;
    const real *v[K3C_ATTNRES_MAX_SOURCES];
    real *dv[K3C_ATTNRES_MAX_SOURCES];
    for (int i = 0; i < mx->n; i++) {
        v[i] = k3c_acts_src(a, mx->src[i]);
        dv[i] = src_grad(a, mx->src[i]);
    }
    k3c_attnres_sizes s = {a->T, c->hidden_size, mx->n, c->rms_norm_eps};
    int rc = a->st.be->attnres_bwd(&s, v, a->st.w + proj, a->st.w + norm, mx->saved, dh, dv, a->st.g + proj,
                                   a->st.g + norm, a->st.scratch, err);
    return rc ? k3c_err_wrap(err, "AttnRes mix backward over %d sources", mx->n) : K3C_OK;
}

static int add_into(const k3c_acts *a, real *y, const real *x, int64_t n, k3c_err *err) {
    return a->st.be->add(n, x, y, err);
}

/* Backward of one sublayer: out = f(RMSNorm(in)); dout given; adds the gradient of `in` into din (zeroed here). */
typedef int (*sublayer_bwd)(k3c_acts *a, int l, const real *dout, real *dxn, k3c_arena *tmp, k3c_err *err);

static int mixer_bwd(k3c_acts *a, int l, const real *dout, real *dxn, k3c_arena *tmp, k3c_err *err) {
    if (a->st.m->cfg.mixer[l] == K3C_MIXER_KDA)
        CHECK_RC(k3c_kda_layer_bwd(&a->st, l, a->axn[l], &a->kda[l], dout, dxn, tmp, err));
    else
        CHECK_RC(k3c_mla_layer_bwd(&a->st, l, a->axn[l], &a->mla[l], dout, dxn, tmp, err));
    /* tensor parallelism: dxn is this rank's heads' part */
    return k3c_tp_sum(&a->st, dxn, a->T * a->st.m->cfg.hidden_size, err);
}

static int ffn_bwd(k3c_acts *a, int l, const real *dout, real *dxn, k3c_arena *tmp, k3c_err *err) {
    return k3c_ffn_layer_bwd(&a->st, l, a->mxn[l], &a->ffn[l], dout, dxn, tmp, err);
}

static int sublayer(k3c_acts *a, int l, sublayer_bwd f, const real *in, const real *rstd, size_t norm_w,
                    const real *dout, k3c_err *err) {
    int64_t TD = a->T * a->st.m->cfg.hidden_size;
    CHECK_RC(a->st.be->zero(a->dxn, TD, err));
    CHECK_RC(a->st.be->zero(a->din, TD, err));
    size_t mark = k3c_arena_mark(a->arena);
    int rc = f(a, l, dout, a->dxn, a->arena, err);
    k3c_arena_reset(a->arena, mark);
    if (rc) return rc;
    k3c_rmsnorm_sizes rs = {a->T, a->st.m->cfg.hidden_size, a->st.m->cfg.rms_norm_eps};
    return a->st.be->rmsnorm_bwd(&rs, in, a->st.w + norm_w, rstd, a->dxn, a->din, a->st.g + norm_w, err);
}

int k3c_acts_layer_bwd_rows(k3c_acts *a, int l, k3c_err *err) {
    const k3c_model *m = a->st.m;
    const k3c_layer_offsets *o = &m->table.layer[l];
    int64_t TD = a->T * m->cfg.hidden_size;
    /* FFN: pend = ffn(norm(min)) + pmid */
    CHECK_RC(add_into(a, a->dpmid[l], a->dpend[l], TD, err));
    CHECK_RC(sublayer(a, l, ffn_bwd, a->min[l], a->mrstd[l], o->post_norm, a->dpend[l], err));
    if (a->mmix[l].n)
        CHECK_RC(mix_bwd(a, &a->mmix[l], o->mlp_res_proj, o->mlp_res_norm, a->din, err));
    else
        CHECK_RC(add_into(a, a->dpmid[l], a->din, TD, err));
    /* token mixer: pmid = mixer(norm(ain)) (+ P_prev unless a block starts here) */
    real *dprev = l > 0 ? a->dpend[l - 1] : a->demb;
    if (!a->boundary[l]) CHECK_RC(add_into(a, dprev, a->dpmid[l], TD, err));
    CHECK_RC(sublayer(a, l, mixer_bwd, a->ain[l], a->arstd[l], o->input_norm, a->dpmid[l], err));
    if (a->amix[l].n)
        CHECK_RC(mix_bwd(a, &a->amix[l], o->attn_res_proj, o->attn_res_norm, a->din, err));
    else
        CHECK_RC(add_into(a, dprev, a->din, TD, err));
    return K3C_OK;
}

static int layer_bwd(k3c_acts *a, int l, k3c_err *err) {
    const k3c_model *m = a->st.m;
    if (a->slices && k3c_slice_rows(m, l, a->T) < a->T) return k3c_slice_layer_bwd(a, l, err);
    /* a recomputed layer kept only its stream outputs: run its forward again (same inputs, same bits) */
    if (m->recompute[l]) CHECK_RC(k3c_acts_layer_fwd(a, l, 0, err));
    return k3c_acts_layer_bwd_rows(a, l, err);
}

/* The unchunked head's dlogits [T, V] (this rank's vocabulary rows), then dxn and the lm_head gradient. */
static int whole_head_bwd(k3c_model *m, k3c_acts *a, double scale, k3c_err *err) {
    const k3c_backend *be = a->st.be;
    int64_t T = a->T, D = m->cfg.hidden_size, V = m->cfg.vocab_size, Vl = V / k3c_tp_size(m);
    const size_t head = m->table.glob.lm_head;
    size_t mark = k3c_arena_mark(a->arena);
    real *dlogits = k3c_tmp_zeros(&a->st, a->arena, T * Vl, err);
    if (!dlogits) return k3c_errf(err, K3C_ENOMEM, "backward: activation arena too small for dlogits");
    k3c_xent_sizes xs = {T, V, a->loss_norm, a->weight};
    int rc;
    if (m->tp) /* the vocabulary-parallel cross-entropy: this rank's rows of dlogits */
        rc = m->tp->xent_bwd(m->tp->ctx, REAL_DTYPE, T, Vl, a->loss_norm, a->weight, a->logits, a->targets, a->lse,
                             scale, dlogits, err);
    else
        rc = be->xent_bwd(&xs, a->logits, a->targets, NULL, a->lse, scale, dlogits, err);
    k3c_linear_sizes ls = {T, D, Vl, 0};
    if (!rc)
        rc = be->linear_bwd(be->ctx, &ls, a->hn, (const real *)m->w + head, dlogits, a->dxn, (real *)m->g + head, err);
    k3c_arena_reset(a->arena, mark);
    return rc;
}

/* The head's backward: cross-entropy → lm_head → final norm → output mix, into the last layer's stream gradients. */
static int head_bwd(k3c_model *m, k3c_acts *a, double scale, k3c_err *err) {
    const k3c_config *c = &m->cfg;
    const k3c_backend *be = a->st.be;
    int64_t T = a->T, D = c->hidden_size;
    const real *w = m->w;
    real *g = m->g;
    const k3c_global_offsets *go = &m->table.glob;
    const size_t head = go->lm_head; /* this rank's vocabulary rows */
    CHECK_RC(be->zero(a->dxn, T * D, err));
    if (k3c_head_rows(m, T) < T)
        CHECK_RC(k3c_head_chunked_bwd(a, scale, a->dxn, g + head, err));
    else
        CHECK_RC(whole_head_bwd(m, a, scale, err));
    CHECK_RC(k3c_tp_sum(&a->st, a->dxn, T * D, err));
    CHECK_RC(be->zero(a->din, T * D, err));
    k3c_rmsnorm_sizes rs = {T, D, c->rms_norm_eps};
    CHECK_RC(be->rmsnorm_bwd(&rs, a->hfin, w + go->final_norm, a->rfin, a->dxn, a->din, g + go->final_norm, err));
    int L = (int)c->num_layers;
    if (a->fmix.n) return mix_bwd(a, &a->fmix, go->out_res_proj, go->out_res_norm, a->din, err);
    return add_into(a, L > 0 ? a->dpend[L - 1] : a->demb, a->din, T * D, err);
}

int k3c_model_backward_range(k3c_model *m, k3c_acts *a, double scale, const real *const *dout, k3c_err *err) {
    if (!m->g) return k3c_errf(err, K3C_EINVAL, "backward: model was created without gradients");
    const k3c_config *c = &m->cfg;
    int64_t T = a->T, D = c->hidden_size, V = c->vocab_size;
    int L = (int)c->num_layers, bsrc[K3C_ATTNRES_MAX_SOURCES];
    if (a->l1 < L && !dout)
        return k3c_errf(err, K3C_EINVAL, "backward: layers [%d, %d) need the gradients of the boundary after them",
                        a->l0, a->l1);
    k3c_arena_reset(a->arena, a->tmp_mark);
    k3c_arena_reset(&m->meta, a->meta_mark);
    k3c_acts_carver cv = k3c_acts_carver_at(a->arena, &m->meta);
    k3c_acts_carve_backward(m, &cv, a);
    if (k3c_acts_carver_take(&cv, a->arena, &m->meta))
        return k3c_errf(err, K3C_ENOMEM, "backward: activation arena too small");
    const k3c_backend *be = a->st.be;
    a->st.dloss = scale; /* terms the layers add to the objective themselves (the routers' auxiliary loss) */
    if (a->demb) CHECK_RC(be->zero(a->demb, T * D, err));
    int nb = k3c_boundary_sources(c, a->l0, bsrc);
    for (int i = 0; a->l0 > 0 && i < nb; i++)
        if (bsrc[i] != K3C_SRC_EMB) CHECK_RC(be->zero(a->dpend[bsrc[i] / 2], T * D, err));
    for (int l = a->l0; l < a->l1; l++) {
        CHECK_RC(be->zero(a->dpmid[l], T * D, err));
        CHECK_RC(be->zero(a->dpend[l], T * D, err));
    }
    if (a->l1 == L) {
        CHECK_RC(head_bwd(m, a, scale, err));
        if (m->grads) CHECK_RC(m->grads->layer_done(m->grads->ctx, L, err)); /* the head's gradients are final */
    } else { /* the later stages' gradients of the boundary tensors (some of them from before l0, passed through) */
        nb = k3c_boundary_sources(c, a->l1, bsrc);
        for (int i = 0; i < nb; i++) CHECK_RC(add_into(a, src_grad(a, bsrc[i]), dout[i], T * D, err));
    }
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        CHECK_RC(layer_bwd(a, l, err));
        if (m->grads) CHECK_RC(m->grads->layer_done(m->grads->ctx, l, err)); /* layer l's gradients are final */
    }
    if (a->l0 == 0) {
        CHECK_RC(k3c_acts_embed_overrides_bwd(a, D, err));
        k3c_embedding_sizes es = {T, V, D};
        real *dE = (real *)m->g + m->table.glob.embed;
        if (m->tp) { /* this rank's vocabulary rows */
            CHECK_RC(be->sync(err));
            CHECK_RC(m->tp->embed_bwd(m->tp->ctx, REAL_DTYPE, T, V, D, a->ids, a->demb, dE, err));
        } else {
            CHECK_RC(be->embedding_bwd(&es, a->ids, a->demb, dE, err));
        }
    }
    return be->sync(err); /* the caller reads m->g next (optimizer, checks) */
}

int k3c_model_backward(k3c_model *m, k3c_acts *a, double scale, k3c_err *err) {
    return k3c_model_backward_range(m, a, scale, NULL, err);
}
