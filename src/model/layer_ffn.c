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
        k3c_router_sizes rs = {T, s.E, s.k, 0, 1.0};
        size_t x = be->aux_loss_workspace(&rs);
        b = be->moe_workspace(&es);
        if (x > b) b = x;
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
    if (!ss || st->no_stats) return K3C_OK;
    const int64_t t0 = st->row0; /* a slice's rows go where the batch's would */
    if (t0 + s->T > ss->cap_T)
        return k3c_errf(err, K3C_EINVAL, "step statistics hold %lld tokens, the batch has %lld", (long long)ss->cap_T,
                        (long long)(t0 + s->T));
    k3c_route_stats *r = &ss->route[l];
    r->T = t0 + s->T, r->k = s->k, r->n = s->E;
    int32_t *ids = r->topk_ids + t0 * s->k;
    float *logits = r->logits + t0 * s->E, *cutoff = r->cutoff + t0;
#if K3C_REAL_DOUBLE /* double models run on the CPU reference only, whose memory the host addresses */
    for (int64_t i = 0; i < s->T * s->k; i++) ids[i] = a->ids[i];
    for (int64_t i = 0; i < s->T * s->E; i++) logits[i] = (float)a->logits[i];
    for (int64_t t = 0; t < s->T; t++) cutoff[t] = (float)a->cutoff[t];
    (void)err;
    return K3C_OK;
#else /* ids are moved as 32-bit words: copy2d is a bit-exact copy */
    CHECK_RC(st->be->copy2d(1, s->T * s->k, (const float *)a->ids, 0, (float *)ids, 0, 0, err));
    CHECK_RC(st->be->copy2d(1, s->T * s->E, a->logits, 0, logits, 0, 0, err));
    return st->be->copy2d(1, s->T, a->cutoff, 0, cutoff, 0, 0, err);
#endif
}

/* The dense MLP or the shared experts, y = down(act(gate x) · up x), split over the intermediate under tensor
 * parallelism (gate and up by rows, down by columns): this rank's part, which the caller sums over the group. In a
 * training forward the backend's MLP op (saving its pre-activations); in a decode step gate and up are already made
 * (in dec->mlp_gate / mlp_up, with the layer's other products of x): the GLU and the down product. */
static int dense_fwd(k3c_step *st, const ffn_shape *s, const real *xn, const k3c_qmat *gate, const k3c_qmat *up,
                     const k3c_qmat *down, void *saved, real *y, k3c_err *err) {
    k3c_mlp_sizes ms = mlp_sizes(st->m, s);
#if !K3C_REAL_DOUBLE
    const k3c_decode *d = st->dec;
    if (d) {
        k3c_glu_sizes gs = {s->T, ms.inter, ms.act};
        CHECK_RC(d->ops->glu(&gs, d->mlp_gate, d->mlp_up, d->mlp_h, err));
        return k3c_proj1(st, s->T, down, ms.inter, s->D, d->mlp_h, y, err);
    }
#endif
    return st->be->mlp_fwd(st->be->ctx, &ms, xn, gate->w, up->w, down->w, y, saved, st->scratch, err);
}

/* Under tensor parallelism the routed path (latent projections, experts, the router's backward) runs on this rank's
 * rows [*t0, *t0 + *n) of the T tokens only (rank r of size: r·T/size onwards), the other ranks on theirs: its output
 * and input gradient are zero elsewhere and complete in the group's sum, so no rank computes the routed experts
 * twice. Alone: every row. */
static void token_rows(const k3c_model *m, int64_t T, int64_t *t0, int64_t *n) {
    const int64_t r = k3c_tp_rank(m), P = k3c_tp_size(m);
    *t0 = r * T / P;
    *n = (r + 1) * T / P - *t0;
}

/* The routed experts of xin's n rows into u: expert parallelism's exchange, the backend's grouped experts (saving
 * what the backward needs), or in a decode step the engine's experts over the weights as stored. */
static int experts_fwd(k3c_step *st, int l, const ffn_shape *s, const k3c_weights_layer *L, const real *xin,
                       const int32_t *ids, const real *topw, int64_t n, void *saved, real *u, k3c_err *err) {
    ffn_shape rs = *s;
    rs.T = n;
    k3c_moe_sizes es = moe_sizes(st->m, &rs);
#if !K3C_REAL_DOUBLE
    if (st->dec) {
        const k3c_dec_moe dm = {L->w1, L->w3, L->w2, s->E, s->k, s->lat, s->inter, es.act};
        return st->dec->ops->moe(&dm, xin, n, ids, topw, u, st->dec->moe_ws, err);
    }
#endif
    const k3c_expert_exchange *ex = st->m->experts; /* expert parallelism: the experts on their ranks */
    const void *w1 = L->w1[0].w, *w3 = L->w3[0].w, *w2 = L->w2[0].w; /* stacked: expert e at e · rows · cols */
    return ex ? ex->fwd(ex->ctx, l, (int)sizeof(real), &es, xin, ids, topw, w1, w3, w2, u, err)
              : st->be->moe_fwd(st->be->ctx, &es, xin, ids, topw, w1, w3, w2, u, saved, st->scratch, err);
}

/* The routed experts of rows [t0, t0 + n) (on the latent with its norm, K3) into those rows of y; the latent input
 * z = W↓x is made already (a->zin). */
static int routed_fwd(k3c_step *st, int l, const ffn_shape *s, const real *xn, k3c_ffn_acts *a, int64_t t0, int64_t n,
                      real *y, k3c_err *err) {
    const k3c_config *c = &st->m->cfg;
    const k3c_weights_layer *L = &st->views->layer[l];
    const real *xin = s->latent ? a->zin + t0 * s->lat : xn + t0 * s->D;
    real *u = s->latent ? a->u + t0 * s->lat : y + t0 * s->D;
    CHECK_RC(experts_fwd(st, l, s, L, xin, a->ids + t0 * s->k, a->topw + t0 * s->k, n, a->moe_saved, u, err));
    if (!s->latent) return K3C_OK;
    const real *un = u;
    if (c->latent_norm) {
        k3c_rmsnorm_sizes ns = {n, s->lat, c->rms_norm_eps};
        CHECK_RC(st->be->rmsnorm_fwd(&ns, u, L->latent_norm, a->un + t0 * s->lat, a->ru ? a->ru + t0 : NULL, err));
        un = a->un + t0 * s->lat;
    }
    return k3c_proj1(st, n, &L->latent_up, s->lat, s->D, un, y + t0 * s->D, err);
}

int k3c_ffn_layer_fwd(k3c_step *st, int l, const real *xn, k3c_ffn_acts *a, real *y, k3c_err *err) {
    k3c_model *m = st->m;
    const k3c_config *c = &m->cfg;
    const k3c_weights_layer *L = &st->views->layer[l];
    ffn_shape s = shape_of(m, l, st->T);
    int64_t T = s.T, t0, n;
    /* every product of xn in one pass where the step allows it: the router, the latent down-projection, and in a
       decode step the dense or shared experts' gate and up (training: inside the backend's MLP op) */
    k3c_proj_job xj[4] = {{0}};
    int nj = 0;
    const k3c_qmat *gate = s.moe ? &L->shared_gate : &L->mlp_gate, *up = s.moe ? &L->shared_up : &L->mlp_up;
    token_rows(m, T, &t0, &n);
    if (s.moe) {
        xj[nj++] = (k3c_proj_job){&L->router, xn, a->logits, s.D, s.E};
        if (s.latent && n == T) xj[nj++] = (k3c_proj_job){&L->latent_down, xn, a->zin, s.D, s.lat};
    }
#if !K3C_REAL_DOUBLE
    if (st->dec && (!s.moe || s.shw > 0)) {
        xj[nj++] = (k3c_proj_job){gate, xn, st->dec->mlp_gate, s.D, mlp_sizes(m, &s).inter};
        xj[nj++] = (k3c_proj_job){up, xn, st->dec->mlp_up, s.D, mlp_sizes(m, &s).inter};
    }
#endif
    CHECK_RC(k3c_proj(st, T, xj, nj, err));
    if (!s.moe) {
        int rc = dense_fwd(st, &s, xn, gate, up, &L->mlp_down, a->mlp_saved, y, err);
        if (!rc) rc = k3c_tp_sum(st, y, T * s.D, err);
        return rc ? k3c_err_wrap(err, "layer %d: dense MLP", l) : K3C_OK;
    }
    /* the router on every row (its statistics are the whole batch's on every rank), the experts on this rank's */
    k3c_router_sizes rs = {T, s.E, s.k, c->renormalize, c->routed_scaling_factor};
    int rc = st->be->router_fwd(&rs, a->logits, L->router_bias, a->ids, a->topw, a->cutoff, err);
    if (rc) return k3c_err_wrap(err, "layer %d: router", l);
    CHECK_RC(record_routes(st, l, &s, a, err));
    if (n < T) CHECK_RC(st->be->zero(y, T * s.D, err)); /* the other ranks' rows: theirs */
    if (s.latent && n < T)
        CHECK_RC(k3c_proj1(st, n, &L->latent_down, s.D, s.lat, xn + t0 * s.D, a->zin + t0 * s.lat, err));
    if ((rc = routed_fwd(st, l, &s, xn, a, t0, n, y, err))) return k3c_err_wrap(err, "layer %d: routed experts", l);
    if (s.shw > 0) {
        rc = dense_fwd(st, &s, xn, gate, up, &L->shared_down, a->mlp_saved, a->ys, err);
        if (rc) return k3c_err_wrap(err, "layer %d: shared experts", l);
        CHECK_RC(st->be->add(T * s.D, a->ys, y, err));
    }
    return k3c_tp_sum(st, y, T * s.D, err); /* the shared experts' parts and the routed rows of every rank */
}

size_t k3c_ffn_bwd_bytes(const k3c_model *m, int l, int64_t T) {
    ffn_shape s = shape_of(m, l, T);
    return s.moe ? sizeof(real) * (size_t)(T * (s.k + s.E + 3 * s.lat)) + 8 * 64 : 0;
}

/* The MLP's backward: its input gradient added into dxn (under tensor parallelism this rank's part, which the caller
 * sums over the group). */
static int dense_bwd(k3c_step *st, const ffn_shape *s, const real *xn, size_t og, size_t ou, size_t od, void *saved,
                     const real *dy, real *dxn, k3c_err *err) {
    const real *w = st->w;
    real *g = st->g;
    k3c_mlp_sizes ms = mlp_sizes(st->m, s);
    return st->be->mlp_bwd(st->be->ctx, &ms, xn, w + og, w + ou, w + od, saved, dy, dxn, g + og, g + ou, g + od,
                           st->scratch, err);
}

/* The routed path's backward over rows [t0, t0 + n) (routed_fwd's): its weights' gradients (this rank's rows' part
 * under tensor parallelism) and its input gradient added into those rows of dxn. */
static int routed_bwd(k3c_step *st, int l, const ffn_shape *s, const real *xn, k3c_ffn_acts *a, const real *dy,
                      real *dxn, int64_t t0, int64_t n, k3c_arena *tmp, k3c_err *err) {
    const k3c_model *m = st->m;
    const k3c_config *c = &m->cfg;
    const k3c_layer_offsets *o = &m->table.layer[l];
    const real *w = st->w;
    real *g = st->g;
    real *dtopw = k3c_tmp_zeros(st, tmp, n * s->k, err), *dlogits = k3c_tmp_zeros(st, tmp, n * s->E, err);
    real *du = NULL, *dun = NULL, *dz = NULL;
    if (s->latent) {
        du = k3c_tmp_zeros(st, tmp, n * s->lat, err);
        dun = k3c_tmp_zeros(st, tmp, n * s->lat, err);
        dz = k3c_tmp_zeros(st, tmp, n * s->lat, err);
        if (!du || !dun || !dz) return k3c_errf(err, K3C_ENOMEM, "MoE backward scratch");
    }
    if (!dtopw || !dlogits) return k3c_errf(err, K3C_ENOMEM, "MoE backward scratch");
    const real *du_moe = dy + t0 * s->D, *xin = xn + t0 * s->D;
    real *dxin = dxn + t0 * s->D;
    if (s->latent) {
        const real *un = (c->latent_norm ? a->un : a->u) + t0 * s->lat;
        CHECK_RC(k3c_lin_bwd(st, n, s->lat, s->D, un, w + o->latent_up, dy + t0 * s->D, c->latent_norm ? dun : du,
                             g + o->latent_up, err));
        if (c->latent_norm) {
            k3c_rmsnorm_sizes ns = {n, s->lat, c->rms_norm_eps};
            CHECK_RC(st->be->rmsnorm_bwd(&ns, a->u + t0 * s->lat, w + o->latent_norm, a->ru + t0, dun, du,
                                         g + o->latent_norm, err));
        }
        du_moe = du;
        xin = a->zin + t0 * s->lat;
        dxin = dz;
    }
    ffn_shape rs = *s;
    rs.T = n;
    k3c_moe_sizes es = moe_sizes(m, &rs);
    const int32_t *ids = a->ids + t0 * s->k;
    const real *topw = a->topw + t0 * s->k;
    const k3c_expert_exchange *ex = m->experts;
    int rc = ex ? ex->bwd(ex->ctx, l, (int)sizeof(real), &es, xin, ids, topw, w + o->w1, w + o->w3, w + o->w2, du_moe,
                          dxin, g + o->w1, g + o->w3, g + o->w2, dtopw, err)
                : st->be->moe_bwd(st->be->ctx, &es, xin, ids, topw, w + o->w1, w + o->w3, w + o->w2, a->moe_saved,
                                  du_moe, dxin, g + o->w1, g + o->w3, g + o->w2, dtopw, st->scratch, err);
    if (rc) return k3c_err_wrap(err, "routed experts backward");
    if (s->latent)
        CHECK_RC(k3c_lin_bwd(st, n, s->D, s->lat, xn + t0 * s->D, w + o->latent_down, dz, dxn + t0 * s->D,
                             g + o->latent_down, err));
    k3c_router_sizes rs2 = {n, s->E, s->k, c->renormalize, c->routed_scaling_factor};
    rc = st->be->router_bwd(&rs2, a->logits + t0 * s->E, ids, dtopw, dlogits, err);
    if (rc) return k3c_err_wrap(err, "router backward");
    if (m->aux_loss_alpha > 0) { /* the whole batch's routes and probabilities, this rank's rows of the gradient */
        k3c_router_sizes ra = {s->T, s->E, s->k, 0, 1.0};
        rc = st->be->aux_loss_bwd(&ra, a->logits, a->ids, m->aux_loss_alpha * st->dloss, t0, n, dlogits, st->scratch,
                                  err);
        if (rc) return k3c_err_wrap(err, "auxiliary balancing loss backward");
    }
    return k3c_lin_bwd(st, n, s->D, s->E, xn + t0 * s->D, w + o->router, dlogits, dxn + t0 * s->D, g + o->router, err);
}

int k3c_ffn_layer_bwd(k3c_step *st, int l, const real *xn, k3c_ffn_acts *a, const real *dy, real *dxn, k3c_arena *tmp,
                      k3c_err *err) {
    const k3c_model *m = st->m;
    const k3c_layer_offsets *o = &m->table.layer[l];
    ffn_shape s = shape_of(m, l, st->T);
    int64_t T = s.T, t0, n;
    int rc;
    if (!s.moe || s.shw > 0) {
        size_t og = s.moe ? o->shared_gate : o->mlp_gate, ou = s.moe ? o->shared_up : o->mlp_up;
        size_t od = s.moe ? o->shared_down : o->mlp_down;
        rc = dense_bwd(st, &s, xn, og, ou, od, a->mlp_saved, dy, dxn, err);
        if (rc) return k3c_err_wrap(err, "layer %d: MLP backward", l);
    }
    if (s.moe) {
        token_rows(m, T, &t0, &n);
        if ((rc = routed_bwd(st, l, &s, xn, a, dy, dxn, t0, n, tmp, err))) return k3c_err_wrap(err, "layer %d", l);
    }
    /* this rank's parts (the MLP's, its routed rows') summed over the group; dxn held nothing else (zeroed) */
    return k3c_tp_sum(st, dxn, T * s.D, err);
}
