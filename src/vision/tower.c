/* tower.c — the vision tower and projector, forward and backward, on `real`: patch embedding, position embedding,
 * pre-norm blocks with 2D-rotary block-diagonal attention and an mlp2, the final norm, the sd2_tpool merge and the
 * patchmergerv2 projector; every op through the tower's backend table (docs/CODE.md "Ops"), so the same code runs
 * on the CPU reference and on CUDA. Spec: docs/VISION.md (every stage, in order); ../shared/spec/TRAINING.md §6.2. */
#include "base/carve.h"
#include "base/check.h"
#include "base/real.h"
#include "ops/backend.h"
#include "vision/vision.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t L, N, D, Q, F, H, dh, P, M, E;
} dims;

static dims dims_of(const k3c_vision *v, int64_t L, int64_t N) {
    const k3c_vision_config *c = &v->cfg;
    dims d = {L,
              N,
              c->hidden,
              c->qkv_hidden,
              c->intermediate,
              c->heads,
              c->qkv_hidden / c->heads,
              3 * c->patch_size * c->patch_size,
              c->hidden * c->merge_kernel[0] * c->merge_kernel[1],
              c->text_hidden};
    return d;
}

static const k3c_backend *BE(const k3c_vision *v) { return v->backend ? v->backend : k3c_backend_cpu(); }
static const real *W(const k3c_vision *v, int slot) { return (const real *)v->w + v->p[slot].off; }
static real *G(k3c_vision *v, int slot) { return (real *)v->g + v->p[slot].off; }

/* The acts plan: run over a measuring carver, then over the block (base/carve.h). */
static void carve_acts(k3c_carver *c, struct k3c_vision_acts *a, const dims *d, int n) {
    a->g = K3C_CARVE(c, k3c_grid_thw, n);
    a->cu = K3C_CARVE(c, int32_t, n + 1);
    a->pixels = K3C_CARVE(c, real, d->L * d->P);
    a->conv = K3C_CARVE(c, real, d->L * d->D);
    a->embed = K3C_CARVE(c, real, d->L * d->D);
    a->rope = K3C_CARVE(c, real, d->L * d->dh);
}

static void carve_block(k3c_carver *c, k3c_vit_block_acts *b, const dims *d) {
    const int64_t L = d->L;
    b->norm0 = K3C_CARVE(c, real, L * d->D);
    b->rstd0 = K3C_CARVE(c, real, L);
    b->wqkv = K3C_CARVE(c, real, L * 3 * d->Q);
    b->q_rope = K3C_CARVE(c, real, L * d->Q);
    b->k_rope = K3C_CARVE(c, real, L * d->Q);
    b->v = K3C_CARVE(c, real, L * d->Q);
    b->attn_core = K3C_CARVE(c, real, L * d->Q);
    b->lse = K3C_CARVE(c, real, L * d->H);
    b->attn_out = K3C_CARVE(c, real, L * d->D);
    b->resid1 = K3C_CARVE(c, real, L * d->D);
    b->norm1 = K3C_CARVE(c, real, L * d->D);
    b->rstd1 = K3C_CARVE(c, real, L);
    b->fc0 = K3C_CARVE(c, real, L * d->F);
    b->mlp_act = K3C_CARVE(c, real, L * d->F);
    b->mlp_out = K3C_CARVE(c, real, L * d->D);
    b->out = K3C_CARVE(c, real, L * d->D);
}

static void carve_tail(k3c_carver *c, struct k3c_vision_acts *a, const dims *d) {
    a->final_norm = K3C_CARVE(c, real, d->L * d->D);
    a->rstd_final = K3C_CARVE(c, real, d->L);
    a->merged = K3C_CARVE(c, real, d->N * d->M);
    a->proj_fc0 = K3C_CARVE(c, real, d->N * d->M);
    a->proj_gelu = K3C_CARVE(c, real, d->N * d->M);
    a->proj_fc1 = K3C_CARVE(c, real, d->N * d->E);
    a->embeds = K3C_CARVE(c, real, d->N * d->E);
    a->rstd_post = K3C_CARVE(c, real, d->N);
}

static void carve_all(k3c_carver *c, struct k3c_vision_acts *a, const dims *d, int n, int64_t layers) {
    carve_acts(c, a, d, n);
    for (int64_t l = 0; l < layers; l++) carve_block(c, &a->blk[l], d);
    carve_tail(c, a, d);
}

/* The saved stages live in the backend's memory (one block); the struct and its block table on the host. */
static struct k3c_vision_acts *acts_new(const k3c_vision *v, const dims *d, int n, k3c_err *err) {
    struct k3c_vision_acts *a = calloc(1, sizeof *a);
    k3c_vit_block_acts *blk = calloc((size_t)v->cfg.layers, sizeof *blk);
    if (!a || !blk) goto oom;
    a->blk = blk;
    a->backend = BE(v);
    k3c_carver m = k3c_carver_measure(64);
    carve_all(&m, a, d, n, v->cfg.layers);
    a->mem = BE(v)->alloc(m.off ? m.off : 64);
    if (!a->mem) goto oom;
    k3c_carver c = k3c_carver_at(a->mem, m.off, 64);
    carve_all(&c, a, d, n, v->cfg.layers);
    a->n = n;
    a->L = d->L;
    a->N = d->N;
    return a;
oom:
    free(blk);
    free(a);
    k3c_errf(err, K3C_ENOMEM, "vision_forward: out of memory for the activations of %lld patches", (long long)d->L);
    return NULL;
}

void k3c_vision_acts_free(struct k3c_vision_acts *a) {
    if (!a) return;
    if (a->mem) ((const k3c_backend *)a->backend)->free(a->mem);
    free(a->blk);
    free(a);
}

/* One pre-norm block: x + attn(norm0 x), then + mlp(norm1 ·). */
static int block_fwd(const k3c_vision *v, int64_t l, const dims *d, const struct k3c_vision_acts *a,
                     k3c_vit_block_acts *b, k3c_err *err) {
    const k3c_backend *be = BE(v);
    const int64_t L = d->L, Q = d->Q;
    const k3c_rmsnorm_sizes ns = {L, d->D, K3C_VISION_NORM_EPS};
    const k3c_linear_sizes qkv = {L, d->D, 3 * Q, 0}, wo = {L, Q, d->D, 0}, f0 = {L, d->D, d->F, 0},
                           f1 = {L, d->F, d->D, 0};
    const k3c_vit_attn_sizes as = {L, d->H, d->dh, 1.0 / sqrt((double)d->dh)};
    CHECK_RC(be->rmsnorm_fwd(&ns, b->in, W(v, k3c_vision_bslot(l, VB_NORM0)), b->norm0, b->rstd0, err));
    CHECK_RC(be->linear_fwd(be->ctx, &qkv, b->norm0, W(v, k3c_vision_bslot(l, VB_WQKV)), b->wqkv, err));
    CHECK_RC(be->copy2d(L, Q, b->wqkv, 3 * Q, b->q_rope, Q, 0, err));
    CHECK_RC(be->copy2d(L, Q, b->wqkv + Q, 3 * Q, b->k_rope, Q, 0, err));
    CHECK_RC(be->copy2d(L, Q, b->wqkv + 2 * Q, 3 * Q, b->v, Q, 0, err));
    CHECK_RC(be->rope2d_fwd(L, d->H, d->dh, a->rope, b->q_rope, b->q_rope, err));
    CHECK_RC(be->rope2d_fwd(L, d->H, d->dh, a->rope, b->k_rope, b->k_rope, err));
    CHECK_RC(be->vit_attention_fwd(&as, a->cu, a->n, b->q_rope, b->k_rope, b->v, b->attn_core, b->lse, err));
    CHECK_RC(be->linear_fwd(be->ctx, &wo, b->attn_core, W(v, k3c_vision_bslot(l, VB_WO)), b->attn_out, err));
    CHECK_RC(be->copy2d(1, L * d->D, b->in, L * d->D, b->resid1, L * d->D, 0, err));
    CHECK_RC(be->add(L * d->D, b->attn_out, b->resid1, err));
    CHECK_RC(be->rmsnorm_fwd(&ns, b->resid1, W(v, k3c_vision_bslot(l, VB_NORM1)), b->norm1, b->rstd1, err));
    CHECK_RC(be->linear_fwd(be->ctx, &f0, b->norm1, W(v, k3c_vision_bslot(l, VB_FC0)), b->fc0, err));
    CHECK_RC(be->gelu_tanh(L * d->F, b->fc0, b->mlp_act, err));
    CHECK_RC(be->linear_fwd(be->ctx, &f1, b->mlp_act, W(v, k3c_vision_bslot(l, VB_FC1)), b->mlp_out, err));
    CHECK_RC(be->copy2d(1, L * d->D, b->resid1, L * d->D, b->out, L * d->D, 0, err));
    CHECK_RC(be->add(L * d->D, b->mlp_out, b->out, err));
    return K3C_OK;
}

/* Final norm, merge, projector (Linear → GELU(erf) → Linear → RMSNorm). */
static int tail_fwd(const k3c_vision *v, const dims *d, struct k3c_vision_acts *a, const real *x, k3c_err *err) {
    const k3c_backend *be = BE(v);
    const k3c_vision_config *c = &v->cfg;
    const k3c_rmsnorm_sizes fs = {d->L, d->D, K3C_VISION_NORM_EPS}, ps = {d->N, d->E, c->ln_eps};
    const k3c_linear_sizes p0 = {d->N, d->M, d->M, 0}, p2 = {d->N, d->M, d->E, 0};
    CHECK_RC(be->rmsnorm_fwd(&fs, x, W(v, k3c_vision_tslot(v, VT_FINAL)), a->final_norm, a->rstd_final, err));
    CHECK_RC(be->tpool_merge_fwd(a->g, a->n, d->N, d->D, c->merge_kernel[0], c->merge_kernel[1], a->final_norm,
                                 a->merged, err));
    CHECK_RC(be->linear_fwd(be->ctx, &p0, a->merged, W(v, k3c_vision_tslot(v, VT_PROJ0)), a->proj_fc0, err));
    CHECK_RC(be->gelu_erf(d->N * d->M, a->proj_fc0, a->proj_gelu, err));
    CHECK_RC(be->linear_fwd(be->ctx, &p2, a->proj_gelu, W(v, k3c_vision_tslot(v, VT_PROJ2)), a->proj_fc1, err));
    return be->rmsnorm_fwd(&ps, a->proj_fc1, W(v, k3c_vision_tslot(v, VT_POST)), a->embeds, a->rstd_post, err);
}

static k3c_posemb_sizes posemb_sizes(const k3c_vision_config *c) {
    k3c_posemb_sizes s = {c->pos_emb_h, c->pos_emb_w, c->pos_emb_t, c->hidden,
                          c->interp == K3C_VISION_BICUBIC ? K3C_INTERP_BICUBIC : K3C_INTERP_BILINEAR};
    return s;
}

static int forward(const k3c_vision *v, const dims *d, struct k3c_vision_acts *a, k3c_err *err) {
    const k3c_backend *be = BE(v);
    const k3c_vision_config *c = &v->cfg;
    const k3c_linear_sizes pe = {d->L, d->P, d->D, 0};
    const k3c_posemb_sizes pos = posemb_sizes(c);
    CHECK_RC(be->linear_fwd(be->ctx, &pe, a->pixels, W(v, VP_PATCH), a->conv, err));
    CHECK_RC(be->copy2d(1, d->L * d->D, a->conv, d->L * d->D, a->embed, d->L * d->D, 0, err));
    CHECK_RC(be->posemb_fwd(&pos, a->g, a->n, d->L, W(v, VP_POS), a->embed, err));
    const real *x = a->embed;
    for (int64_t l = 0; l < c->layers; l++) {
        a->blk[l].in = (real *)x;
        int rc = block_fwd(v, l, d, a, &a->blk[l], err);
        if (rc) return k3c_err_wrap(err, "vision block %lld", (long long)l), rc;
        x = a->blk[l].out;
    }
    return tail_fwd(v, d, a, x, err);
}

/* The inputs in the backend's memory: grids, item offsets, the rope table (made on the host) and the pixels. */
static int upload_inputs(const k3c_vision *v, const dims *d, const k3c_grid_thw *g, int n, const real *pixels,
                         struct k3c_vision_acts *a, k3c_err *err) {
    const k3c_backend *be = BE(v);
    int32_t *cu = malloc((size_t)(n + 1) * sizeof *cu);
    real *rope = malloc((size_t)(d->L * d->dh) * sizeof *rope);
    int rc = !cu || !rope ? k3c_errf(err, K3C_ENOMEM, "vision_forward: out of memory") : K3C_OK;
    if (!rc) {
        cu[0] = 0;
        for (int i = 0; i < n; i++) cu[i + 1] = cu[i] + (int32_t)(g[i].t * g[i].h * g[i].w);
        rc = k3c_rope2d_table(g, n, d->dh, K3C_VISION_ROPE_THETA, rope, err);
    }
    if (!rc) rc = be->upload(a->g, g, (size_t)n * sizeof *g, err);
    if (!rc) rc = be->upload(a->cu, cu, (size_t)(n + 1) * sizeof *cu, err);
    if (!rc) rc = be->upload(a->rope, rope, (size_t)(d->L * d->dh) * sizeof *rope, err);
    if (!rc) rc = be->upload(a->pixels, pixels, (size_t)(d->L * d->P) * sizeof *pixels, err);
    if (!rc) rc = be->sync(err); /* the host buffers are freed next */
    free(cu);
    free(rope);
    return rc;
}

int k3c_vision_forward(const k3c_vision *v, const real *pixels, const k3c_grid_thw *g, int n,
                       struct k3c_vision_acts **acts, const real **merged, const real **embeds, int64_t *N_out,
                       k3c_err *err) {
    *acts = NULL;
    if (v->precision != REAL_DTYPE) return k3c_errf(err, K3C_EINVAL, "vision_forward: tower of the other precision");
    const int64_t L = k3c_grid_tokens(g, n, err), N = L < 0 ? -1 : k3c_vision_merged_tokens(&v->cfg, g, n, err);
    if (L < 0 || N < 0) return err->code ? err->code : K3C_EINVAL;
    if (L > INT32_MAX) return k3c_errf(err, K3C_EINVAL, "vision_forward: %lld patches is too many", (long long)L);
    for (int i = 0; i < n; i++)
        if (g[i].t > v->cfg.pos_emb_t)
            return k3c_errf(err, K3C_EINVAL, "vision_forward: item %d has %lld frames, the time table has %lld", i,
                            (long long)g[i].t, (long long)v->cfg.pos_emb_t);
    const dims d = dims_of(v, L, N);
    struct k3c_vision_acts *a = acts_new(v, &d, n, err);
    if (!a) return K3C_ENOMEM;
    int rc = upload_inputs(v, &d, g, n, pixels, a, err);
    if (!rc) rc = forward(v, &d, a, err);
    if (rc) {
        k3c_vision_acts_free(a);
        return rc;
    }
    *acts = a;
    if (merged) *merged = a->merged;
    if (embeds) *embeds = a->embeds;
    if (N_out) *N_out = N;
    return K3C_OK;
}

/* ---------------------------------------------------------------- backward */

/* Scratch of the backward, one block at a time. */
typedef struct {
    real *dy, *dx, *dr1, *dt, *dq, *dk, *dv, *dqkv, *df, *dpix;
} bwd_scratch;

static void carve_scratch(k3c_carver *c, bwd_scratch *s, const dims *d) {
    const int64_t L = d->L, rowsM = d->N * d->M, LD = L * d->D, LQ = L * d->Q;
    s->dy = K3C_CARVE(c, real, d->N * d->E);
    s->dpix = K3C_CARVE(c, real, L * d->P);
    s->dx = K3C_CARVE(c, real, LD > rowsM ? LD : rowsM);
    s->dr1 = K3C_CARVE(c, real, LD);
    s->dt = K3C_CARVE(c, real, LD > rowsM ? (LD > LQ ? LD : LQ) : (rowsM > LQ ? rowsM : LQ));
    s->dq = K3C_CARVE(c, real, L * d->Q);
    s->dk = K3C_CARVE(c, real, L * d->Q);
    s->dv = K3C_CARVE(c, real, L * d->Q);
    s->dqkv = K3C_CARVE(c, real, L * 3 * d->Q);
    const int64_t nf = L * d->F > d->N * d->E ? L * d->F : d->N * d->E;
    s->df = K3C_CARVE(c, real, 2 * (nf > rowsM ? nf : rowsM));
}

/* On entry s->dx holds the gradient of block l's out; on return, that of its in. */
static int block_bwd(k3c_vision *v, int64_t l, const dims *d, const struct k3c_vision_acts *a, bwd_scratch *s,
                     k3c_err *err) {
    const k3c_backend *be = BE(v);
    const k3c_vit_block_acts *b = &a->blk[l];
    const int64_t L = d->L, Q = d->Q, LD = L * d->D;
    const k3c_rmsnorm_sizes ns = {L, d->D, K3C_VISION_NORM_EPS};
    const k3c_linear_sizes qkv = {L, d->D, 3 * Q, 0}, wo = {L, Q, d->D, 0}, f0 = {L, d->D, d->F, 0},
                           f1 = {L, d->F, d->D, 0};
    const k3c_vit_attn_sizes as = {L, d->H, d->dh, 1.0 / sqrt((double)d->dh)};
    real *dact = s->df, *dfc0 = s->df + L * d->F;
    /* MLP half: out = resid1 + fc1(gelu(fc0(norm1(resid1)))) */
    CHECK_RC(be->copy2d(1, LD, s->dx, LD, s->dr1, LD, 0, err));
    CHECK_RC(be->zero(dact, 2 * L * d->F, err));
    CHECK_RC(be->linear_bwd(be->ctx, &f1, b->mlp_act, W(v, k3c_vision_bslot(l, VB_FC1)), s->dx, dact,
                            G(v, k3c_vision_bslot(l, VB_FC1)), err));
    CHECK_RC(be->gelu_tanh_bwd(L * d->F, b->fc0, dact, dfc0, err));
    CHECK_RC(be->zero(s->dt, LD, err));
    CHECK_RC(be->linear_bwd(be->ctx, &f0, b->norm1, W(v, k3c_vision_bslot(l, VB_FC0)), dfc0, s->dt,
                            G(v, k3c_vision_bslot(l, VB_FC0)), err));
    CHECK_RC(be->rmsnorm_bwd(&ns, b->resid1, W(v, k3c_vision_bslot(l, VB_NORM1)), b->rstd1, s->dt, s->dr1,
                             G(v, k3c_vision_bslot(l, VB_NORM1)), err));
    /* attention half: resid1 = in + wo(attn(rope(q), rope(k), v)) */
    CHECK_RC(be->copy2d(1, LD, s->dr1, LD, s->dx, LD, 0, err));
    CHECK_RC(be->zero(s->dt, L * Q, err));
    CHECK_RC(be->linear_bwd(be->ctx, &wo, b->attn_core, W(v, k3c_vision_bslot(l, VB_WO)), s->dr1, s->dt,
                            G(v, k3c_vision_bslot(l, VB_WO)), err));
    CHECK_RC(be->zero(s->dq, L * Q, err));
    CHECK_RC(be->zero(s->dk, L * Q, err));
    CHECK_RC(be->zero(s->dv, L * Q, err));
    CHECK_RC(be->vit_attention_bwd(&as, a->cu, a->n, b->q_rope, b->k_rope, b->v, b->attn_core, b->lse, s->dt, s->dq,
                                   s->dk, s->dv, err));
    CHECK_RC(be->zero(s->dt, L * Q, err)); /* un-rotate dq and dk, then lay q, k, v side by side as wqkv's output is */
    CHECK_RC(be->rope2d_bwd(L, d->H, d->dh, a->rope, s->dq, s->dt, err));
    CHECK_RC(be->copy2d(L, Q, s->dt, Q, s->dqkv, 3 * Q, 0, err));
    CHECK_RC(be->zero(s->dt, L * Q, err));
    CHECK_RC(be->rope2d_bwd(L, d->H, d->dh, a->rope, s->dk, s->dt, err));
    CHECK_RC(be->copy2d(L, Q, s->dt, Q, s->dqkv + Q, 3 * Q, 0, err));
    CHECK_RC(be->copy2d(L, Q, s->dv, Q, s->dqkv + 2 * Q, 3 * Q, 0, err));
    CHECK_RC(be->zero(s->dt, LD, err));
    CHECK_RC(be->linear_bwd(be->ctx, &qkv, b->norm0, W(v, k3c_vision_bslot(l, VB_WQKV)), s->dqkv, s->dt,
                            G(v, k3c_vision_bslot(l, VB_WQKV)), err));
    return be->rmsnorm_bwd(&ns, b->in, W(v, k3c_vision_bslot(l, VB_NORM0)), b->rstd0, s->dt, s->dx,
                           G(v, k3c_vision_bslot(l, VB_NORM0)), err);
}

/* Projector, merge and final norm backward: leaves the gradient of the last block's out in s->dx. */
static int tail_bwd(k3c_vision *v, const dims *d, const struct k3c_vision_acts *a, const real *dy, bwd_scratch *s,
                    k3c_err *err) {
    const k3c_backend *be = BE(v);
    const k3c_vision_config *c = &v->cfg;
    const k3c_rmsnorm_sizes fs = {d->L, d->D, K3C_VISION_NORM_EPS}, ps = {d->N, d->E, c->ln_eps};
    const k3c_linear_sizes p0 = {d->N, d->M, d->M, 0}, p2 = {d->N, d->M, d->E, 0};
    const real *last = c->layers ? a->blk[c->layers - 1].out : a->embed;
    real *dfc1 = s->df, *dgelu = s->df + d->N * d->E, *dfc0 = s->dt, *dmerged = s->dx;
    CHECK_RC(be->zero(dfc1, d->N * d->E, err));
    CHECK_RC(be->rmsnorm_bwd(&ps, a->proj_fc1, W(v, k3c_vision_tslot(v, VT_POST)), a->rstd_post, dy, dfc1,
                             G(v, k3c_vision_tslot(v, VT_POST)), err));
    CHECK_RC(be->zero(dgelu, d->N * d->M, err));
    CHECK_RC(be->linear_bwd(be->ctx, &p2, a->proj_gelu, W(v, k3c_vision_tslot(v, VT_PROJ2)), dfc1, dgelu,
                            G(v, k3c_vision_tslot(v, VT_PROJ2)), err));
    CHECK_RC(be->zero(dfc0, d->N * d->M, err));
    CHECK_RC(be->gelu_erf_bwd(d->N * d->M, a->proj_fc0, dgelu, dfc0, err));
    CHECK_RC(be->zero(dmerged, d->N * d->M, err));
    CHECK_RC(be->linear_bwd(be->ctx, &p0, a->merged, W(v, k3c_vision_tslot(v, VT_PROJ0)), dfc0, dmerged,
                            G(v, k3c_vision_tslot(v, VT_PROJ0)), err));
    CHECK_RC(be->zero(s->dr1, d->L * d->D, err));
    CHECK_RC(be->tpool_merge_bwd(a->g, a->n, d->L, d->D, c->merge_kernel[0], c->merge_kernel[1], dmerged, s->dr1, err));
    CHECK_RC(be->zero(s->dx, d->L * d->D, err));
    return be->rmsnorm_bwd(&fs, last, W(v, k3c_vision_tslot(v, VT_FINAL)), a->rstd_final, s->dr1, s->dx,
                           G(v, k3c_vision_tslot(v, VT_FINAL)), err);
}

int k3c_vision_backward(k3c_vision *v, const struct k3c_vision_acts *a, const real *d_embeds, real *d_pixels,
                        k3c_err *err) {
    if (v->precision != REAL_DTYPE || !v->g)
        return k3c_errf(err, K3C_EINVAL, "vision_backward: the tower has no gradients of this precision");
    const k3c_backend *be = BE(v);
    const dims d = dims_of(v, a->L, a->N);
    bwd_scratch s;
    k3c_carver m = k3c_carver_measure(64);
    carve_scratch(&m, &s, &d);
    void *mem = be->alloc(m.off);
    real *host = d_pixels ? malloc((size_t)(d.L * d.P) * sizeof *host) : NULL;
    if (!mem || (d_pixels && !host)) {
        if (mem) be->free(mem);
        free(host);
        return k3c_errf(err, K3C_ENOMEM, "vision_backward: out of memory");
    }
    k3c_carver c = k3c_carver_at(mem, m.off, 64);
    carve_scratch(&c, &s, &d);
    int rc = be->upload(s.dy, d_embeds, (size_t)(d.N * d.E) * sizeof *d_embeds, err);
    if (!rc) rc = tail_bwd(v, &d, a, s.dy, &s, err);
    for (int64_t l = v->cfg.layers - 1; l >= 0 && !rc; l--)
        if ((rc = block_bwd(v, l, &d, a, &s, err))) k3c_err_wrap(err, "vision block %lld backward", (long long)l);
    const k3c_posemb_sizes pos = posemb_sizes(&v->cfg);
    const k3c_linear_sizes pe = {d.L, d.P, d.D, 0};
    if (!rc) rc = be->posemb_bwd(&pos, a->g, a->n, s.dx, G(v, VP_POS), err);
    if (!rc && d_pixels) rc = be->zero(s.dpix, d.L * d.P, err);
    if (!rc)
        rc = be->linear_bwd(be->ctx, &pe, a->pixels, W(v, VP_PATCH), s.dx, d_pixels ? s.dpix : NULL, G(v, VP_PATCH),
                            err);
    if (!rc && d_pixels) rc = be->download(host, s.dpix, (size_t)(d.L * d.P) * sizeof *host, err);
    for (int64_t i = 0; !rc && d_pixels && i < d.L * d.P; i++) d_pixels[i] += host[i];
    if (!rc) rc = be->sync(err);
    be->free(mem);
    free(host);
    return rc;
}
