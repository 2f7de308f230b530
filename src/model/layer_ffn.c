/* layer_ffn.c — the FFN of one decoder layer, forward and backward: the dense GLU MLP (layer 0), or the MoE: sigmoid router
 * with the selection-only bias, routed experts (on the latent z = W↓x with RMSNorm and W↑ in K3's Stable LatentMoE),
 * and shared experts on the full-width x. Spec: docs/MODEL.md §6.2, §8, §9.2. */
#include "base/check.h"
#include "base/real.h"
#include "model/layers.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t T, D, E, k, inter, lat, shw; /* lat: expert width (latent ℓ or D); shw: fused shared width */
    int moe, latent;
} ffn_shape;

static ffn_shape shape_of(const k3c_model *m, int l, int64_t T) {
    const k3c_config *c = &m->cfg;
    ffn_shape s = {T,
                   c->hidden_size,
                   c->num_experts,
                   c->top_k,
                   c->moe_intermediate_size,
                   c->latent_dim > 0 ? c->latent_dim : c->hidden_size,
                   c->moe_intermediate_size * c->num_shared_experts,
                   c->ffn[l] == K3C_FFN_MOE,
                   c->latent_dim > 0};
    if (!s.moe) s.inter = c->intermediate_size / k3c_tp_size(m);
    s.shw /= k3c_tp_size(m); /* tensor parallelism: this rank's rows of the intermediate (routed experts: all) */
    return s;
}

static k3c_mlp_sizes mlp_sizes(const k3c_model *m, const ffn_shape *s) {
    k3c_mlp_sizes ms = {s->T, s->D, s->moe ? s->shw : s->inter, k3c_glu_act_from_config(&m->cfg)};
    return ms;
}

static k3c_moe_sizes moe_sizes(const k3c_model *m, const ffn_shape *s) {
    k3c_moe_sizes ms = {s->T, s->lat, s->inter, s->E, s->k, k3c_glu_act_from_config(&m->cfg)};
    return ms;
}

size_t k3c_ffn_scratch(const k3c_model *m, int l, int64_t T) {
    ffn_shape s = shape_of(m, l, T);
    const k3c_backend *be = k3c_model_backend(m);
    size_t a = 0, b = 0;
    if (!s.moe || s.shw > 0) {
        k3c_mlp_sizes ms = mlp_sizes(m, &s);
        a = be->mlp_workspace(&ms);
    }
    if (s.moe) {
        k3c_moe_sizes es = moe_sizes(m, &s);
        b = be->moe_workspace(&es);
    }
    return a > b ? a : b;
}

void k3c_ffn_alloc(const k3c_model *m, int l, int64_t T, k3c_acts_carver *c, k3c_ffn_acts *a) {
    ffn_shape s = shape_of(m, l, T);
    const k3c_backend *be = k3c_model_backend(m);
    memset(a, 0, sizeof *a);
    if (!s.moe || s.shw > 0) {
        k3c_mlp_sizes ms = mlp_sizes(m, &s);
        a->mlp_saved = k3c_carve(&c->dev, be->mlp_saved_bytes(&ms));
    }
    if (!s.moe) return;
    k3c_moe_sizes es = moe_sizes(m, &s);
    a->logits = K3C_CARVE_DEV(c, real, T * s.E);
    a->ids = K3C_CARVE_DEV(c, int32_t, T * s.k);
    a->topw = K3C_CARVE_DEV(c, real, T * s.k);
    a->cutoff = K3C_CARVE_DEV(c, real, T);
    if (s.latent) a->zin = K3C_CARVE_DEV(c, real, T * s.lat);
    a->moe_saved = k3c_carve(&c->dev, be->moe_saved_bytes(&es));
    a->u = K3C_CARVE_DEV(c, real, T * s.lat);
    if (s.latent && m->cfg.latent_norm) {
        a->un = K3C_CARVE_DEV(c, real, T * s.lat);
        a->ru = K3C_CARVE_DEV(c, real, T);
    }
    if (s.shw > 0) a->ys = K3C_CARVE_DEV(c, real, T * s.D);
}

/* The step statistics of this layer's routing (QB and telemetry read them after the backward), written on the backend
 * by its own ops (plain copies), so the forward does not wait for the device. */
static int record_routes(const k3c_step *st, int l, const ffn_shape *s, const k3c_ffn_acts *a, k3c_err *err) {
    k3c_step_stats *ss = st->m->stats;
    if (!ss) return K3C_OK;
    if (s->T > ss->cap_T)
        return k3c_errf(err, K3C_EINVAL, "step statistics hold %lld tokens, the batch has %lld", (long long)ss->cap_T,
                        (long long)s->T);
    k3c_route_stats *r = &ss->route[l];
    r->T = s->T, r->k = s->k, r->n = s->E;
#if K3C_REAL_DOUBLE /* double models run on the CPU reference only, whose memory the host addresses */
    for (int64_t i = 0; i < s->T * s->k; i++) r->topk_ids[i] = a->ids[i];
    for (int64_t i = 0; i < s->T * s->E; i++) r->logits[i] = (float)a->logits[i];
    for (int64_t t = 0; t < s->T; t++) r->cutoff[t] = (float)a->cutoff[t];
    (void)err;
    return K3C_OK;
#else /* ids are moved as 32-bit words: copy2d is a bit-exact copy */
    CHECK_RC(st->be->copy2d(1, s->T * s->k, (const float *)a->ids, 0, (float *)r->topk_ids, 0, 0, err));
    CHECK_RC(st->be->copy2d(1, s->T * s->E, a->logits, 0, r->logits, 0, 0, err));
    return st->be->copy2d(1, s->T, a->cutoff, 0, r->cutoff, 0, 0, err);
#endif
}

/* The dense MLP or the shared experts: y = down(act(gate x) · up x), split over the intermediate under tensor
 * parallelism (gate and up by rows, down by columns) and summed over the group. */
static int dense_fwd(k3c_step *st, const ffn_shape *s, const real *xn, size_t og, size_t ou, size_t od, void *saved,
                     real *y, k3c_err *err) {
    const real *w = st->w;
    k3c_mlp_sizes ms = mlp_sizes(st->m, s);
    CHECK_RC(st->be->mlp_fwd(st->be->ctx, &ms, xn, w + og, w + ou, w + od, y, saved, st->scratch, err));
    return k3c_tp_sum(st, y, s->T * s->D, err);
}

int k3c_ffn_layer_fwd(k3c_step *st, int l, const real *xn, k3c_ffn_acts *a, real *y, k3c_err *err) {
    k3c_model *m = st->m;
    const k3c_config *c = &m->cfg;
    const k3c_layer_offsets *o = &m->table.layer[l];
    const real *w = st->w;
    ffn_shape s = shape_of(m, l, st->T);
    int64_t T = s.T;
    if (!s.moe) {
        int rc = dense_fwd(st, &s, xn, o->mlp_gate, o->mlp_up, o->mlp_down, a->mlp_saved, y, err);
        return rc ? k3c_err_wrap(err, "layer %d: dense MLP", l) : K3C_OK;
    }
    CHECK_RC(k3c_lin(st, T, s.D, s.E, xn, w + o->router, a->logits, 0, err));
    k3c_router_sizes rs = {T, s.E, s.k, c->renormalize, c->routed_scaling_factor};
    int rc = st->be->router_fwd(&rs, a->logits, w + o->router_bias, a->ids, a->topw, a->cutoff, err);
    if (rc) return k3c_err_wrap(err, "layer %d: router", l);
    CHECK_RC(record_routes(st, l, &s, a, err));
    const real *xin = xn;
    if (s.latent) {
        CHECK_RC(k3c_lin(st, T, s.D, s.lat, xn, w + o->latent_down, a->zin, 0, err));
        xin = a->zin;
    }
    k3c_moe_sizes es = moe_sizes(m, &s);
    real *u = s.latent ? a->u : y;
    const k3c_expert_exchange *ex = m->experts; /* expert parallelism: the experts on their ranks */
    rc = ex ? ex->fwd(ex->ctx, l, (int)sizeof(real), &es, xin, a->ids, a->topw, w + o->w1, w + o->w3, w + o->w2, u, err)
            : st->be->moe_fwd(st->be->ctx, &es, xin, a->ids, a->topw, w + o->w1, w + o->w3, w + o->w2, u, a->moe_saved,
                              st->scratch, err);
    if (rc) return k3c_err_wrap(err, "layer %d: routed experts", l);
    if (s.latent) {
        const real *un = u;
        if (c->latent_norm) {
            k3c_rmsnorm_sizes ns = {T, s.lat, c->rms_norm_eps};
            CHECK_RC(st->be->rmsnorm_fwd(&ns, u, w + o->latent_norm, a->un, a->ru, err));
            un = a->un;
        }
        CHECK_RC(k3c_lin(st, T, s.lat, s.D, un, w + o->latent_up, y, 0, err));
    }
    if (s.shw > 0) {
        rc = dense_fwd(st, &s, xn, o->shared_gate, o->shared_up, o->shared_down, a->mlp_saved, a->ys, err);
        if (rc) return k3c_err_wrap(err, "layer %d: shared experts", l);
        CHECK_RC(st->be->add(T * s.D, a->ys, y, err));
    }
    return K3C_OK;
}

size_t k3c_ffn_bwd_bytes(const k3c_model *m, int l, int64_t T) {
    ffn_shape s = shape_of(m, l, T);
    return s.moe ? sizeof(real) * (size_t)(T * (s.k + s.E + 3 * s.lat)) + 8 * 64 : 0;
}

/* The MLP's backward; under tensor parallelism its input gradient is this rank's part, summed over the group while
 * dxn holds nothing else (the MLP's backward runs first, into a zeroed dxn). */
static int dense_bwd(k3c_step *st, const ffn_shape *s, const real *xn, size_t og, size_t ou, size_t od, void *saved,
                     const real *dy, real *dxn, k3c_arena *tmp, k3c_err *err) {
    const real *w = st->w;
    real *g = st->g;
    k3c_mlp_sizes ms = mlp_sizes(st->m, s);
    CHECK_RC(st->be->mlp_bwd(st->be->ctx, &ms, xn, w + og, w + ou, w + od, saved, dy, dxn, g + og, g + ou, g + od,
                             st->scratch, err));
    return k3c_tp_sum(st, dxn, s->T * s->D, err);
}

int k3c_ffn_layer_bwd(k3c_step *st, int l, const real *xn, k3c_ffn_acts *a, const real *dy, real *dxn, k3c_arena *tmp,
                      k3c_err *err) {
    const k3c_model *m = st->m;
    const k3c_config *c = &m->cfg;
    const k3c_layer_offsets *o = &m->table.layer[l];
    const real *w = st->w;
    real *g = st->g;
    ffn_shape s = shape_of(m, l, st->T);
    int64_t T = s.T;
    int rc;
    if (!s.moe || s.shw > 0) {
        size_t og = s.moe ? o->shared_gate : o->mlp_gate, ou = s.moe ? o->shared_up : o->mlp_up;
        size_t od = s.moe ? o->shared_down : o->mlp_down;
        rc = dense_bwd(st, &s, xn, og, ou, od, a->mlp_saved, dy, dxn, tmp, err);
        if (rc) return k3c_err_wrap(err, "layer %d: MLP backward", l);
        if (!s.moe) return K3C_OK;
    }
    real *dtopw = k3c_tmp_zeros(st, tmp, T * s.k, err), *dlogits = k3c_tmp_zeros(st, tmp, T * s.E, err);
    real *du = NULL, *dun = NULL, *dz = NULL;
    if (s.latent) {
        du = k3c_tmp_zeros(st, tmp, T * s.lat, err);
        dun = k3c_tmp_zeros(st, tmp, T * s.lat, err);
        dz = k3c_tmp_zeros(st, tmp, T * s.lat, err);
        if (!du || !dun || !dz) return k3c_errf(err, K3C_ENOMEM, "layer %d: MoE backward scratch", l);
    }
    if (!dtopw || !dlogits) return k3c_errf(err, K3C_ENOMEM, "layer %d: MoE backward scratch", l);
    const real *du_moe = dy, *xin = xn;
    real *dxin = dxn;
    if (s.latent) {
        const real *un = c->latent_norm ? a->un : a->u;
        CHECK_RC(
            k3c_lin_bwd(st, T, s.lat, s.D, un, w + o->latent_up, dy, c->latent_norm ? dun : du, g + o->latent_up, err));
        if (c->latent_norm) {
            k3c_rmsnorm_sizes ns = {T, s.lat, c->rms_norm_eps};
            CHECK_RC(st->be->rmsnorm_bwd(&ns, a->u, w + o->latent_norm, a->ru, dun, du, g + o->latent_norm, err));
        }
        du_moe = du;
        xin = a->zin;
        dxin = dz;
    }
    k3c_moe_sizes es = moe_sizes(m, &s);
    const k3c_expert_exchange *ex = m->experts;
    rc = ex ? ex->bwd(ex->ctx, l, (int)sizeof(real), &es, xin, a->ids, a->topw, w + o->w1, w + o->w3, w + o->w2, du_moe,
                      dxin, g + o->w1, g + o->w3, g + o->w2, dtopw, err)
            : st->be->moe_bwd(st->be->ctx, &es, xin, a->ids, a->topw, w + o->w1, w + o->w3, w + o->w2, a->moe_saved,
                              du_moe, dxin, g + o->w1, g + o->w3, g + o->w2, dtopw, st->scratch, err);
    if (rc) return k3c_err_wrap(err, "layer %d: routed experts backward", l);
    if (s.latent) CHECK_RC(k3c_lin_bwd(st, T, s.D, s.lat, xn, w + o->latent_down, dz, dxn, g + o->latent_down, err));
    k3c_router_sizes rs = {T, s.E, s.k, c->renormalize, c->routed_scaling_factor};
    rc = st->be->router_bwd(&rs, a->logits, a->ids, dtopw, dlogits, err);
    if (rc) return k3c_err_wrap(err, "layer %d: router backward", l);
    return k3c_lin_bwd(st, T, s.D, s.E, xn, w + o->router, dlogits, dxn, g + o->router, err);
}
