/* engine_fwd.c — the engine's forward over a batch of sequence segments: weight products batched over every row of the
 * step, sequence mixing per segment against its decode state (short conv tails, KDA state, absorbed MLA over the latent
 * cache), MoE rows grouped by expert, Block AttnRes over the step's rows. Every op goes through the weights' backend:
 * its op table (ops/backend.h) and its engine ops (ops/decode.h), so the same step runs on the CPU and on the GPU.
 * Spec: docs/MODEL.md §3.1 (KDA), §4.2 (MLA, absorbed form), §5.3 (AttnRes control flow), §6.2 + §9.2 (MoE). */
#include "base/carve.h"
#include "base/check.h"
#include "serve/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void k3c_eng_dims_of(const k3c_config *c, k3c_eng_dims *d) {
    memset(d, 0, sizeof *d);
    d->L = (int)c->num_layers;
    for (int l = 0; l < d->L; l++) d->idx[l] = c->mixer[l] == K3C_MIXER_KDA ? d->n_kda++ : d->n_mla++;
    d->D = c->hidden_size, d->V = c->vocab_size;
    d->H = c->kda_heads, d->dk = c->kda_head_dim, d->P = d->H * d->dk, d->W = c->conv_kernel;
    d->Hm = c->mla_heads, d->nope = c->qk_nope_dim, d->rope = c->qk_rope_dim, d->dv = c->v_head_dim;
    d->rkv = c->kv_lora_rank, d->r = c->q_lora_rank;
    d->kda_floats = d->n_kda ? d->H * d->dk * d->dk + 3 * d->P * (d->W - 1) : 0;
    d->lat_w = d->rkv + d->rope;
}

/* The step's buffers for n rows in backend memory (measured, then carved: the same code sizes and lays them out). */
typedef struct {
    float *emb, *pa, *pb, *blk, *mixo, *xn, *y; /* [n, D]; blk: NS × [n, D] */
    float *img;                                 /* [n, D]: the step's image rows, uploaded (k3c_eng_seg.emb) */
    /* KDA */
    float *pre[3], *post[3], *blog, *beta, *fa, *z, *g, *o, *gl, *ga, *y1;
    void *kda_ws;
    /* MLA */
    float *qa, *q, *kva, *cn, *qlat, *olat, *mo, *mg;
    void *att_ws, *heads_ws;
    /* FFN */
    float *rlog, *topw, *zin, *fg, *fu, *fh, *ys, *u, *un;
    int32_t *ids;
    void *moe_ws;
    /* output */
    float *hsel, *hn, *logits;
    /* the step's inputs */
    int32_t *tok, *row_seg;
    k3c_dec_seg *segs;
} eng_bufs;

struct k3c_eng_ws {
    const k3c_weights *w;
    const k3c_backend_f32 *be;
    const k3c_dec_ops *ops;
    k3c_eng_dims d;
    k3c_dec_dims dd;
    int64_t max_rows, max_out;
    eng_bufs b;
    void *mem;
    void *graphs; /* ops->graph_open's holder */
    int use_graphs;
    /* host staging of the step's segments */
    k3c_dec_seg *hsegs;
    int32_t *hrow_seg;
    int64_t *img_row, n_img; /* the step rows whose embedding is an image row (b.img holds them in this order) */
    /* the step being run (step_body's arguments) */
    k3c_dec_batch batch;
    const int64_t *out_rows;
    int64_t n_out;
};

static int max_sources(const k3c_config *c) {
    return c->attn_res_block > 0 ? (int)((c->num_layers + c->attn_res_block - 1) / c->attn_res_block) + 1 : 0;
}

static k3c_dec_moe moe_of(const k3c_config *c, const k3c_weights_layer *L) {
    k3c_dec_moe m = {L ? L->w1 : NULL,
                     L ? L->w3 : NULL,
                     L ? L->w2 : NULL,
                     c->num_experts,
                     c->top_k > 0 ? c->top_k : 1,
                     c->latent_dim > 0 ? c->latent_dim : c->hidden_size,
                     c->moe_intermediate_size,
                     k3c_glu_act_from_config(c)};
    return m;
}

static void plan(const k3c_eng_ws *ws, int64_t n, k3c_carver *cv, eng_bufs *b) {
    const k3c_config *c = &ws->w->cfg;
    const k3c_eng_dims *d = &ws->d;
    int64_t D = d->D, P = d->P, E = c->num_experts, k = c->top_k > 0 ? c->top_k : 1;
    int64_t lat = c->latent_dim > 0 ? c->latent_dim : D;
    int64_t S = c->num_shared_experts * c->moe_intermediate_size, If = c->intermediate_size;
    int64_t wide = If > S ? If : S;
    int ns = max_sources(c);
#define F(count) K3C_CARVE(cv, float, (count))
    b->emb = F(n * D), b->img = F(n * D), b->pa = F(n * D), b->pb = F(n * D), b->blk = F((ns ? ns : 1) * n * D);
    b->mixo = F(n * D), b->xn = F(n * D), b->y = F(n * D);
    if (d->n_kda) {
        for (int i = 0; i < 3; i++) b->pre[i] = F(n * P), b->post[i] = F(n * P);
        b->blog = F(n * d->H), b->beta = F(n * d->H), b->fa = F(n * d->dk), b->z = F(n * P), b->g = F(n * P);
        b->o = F(n * P), b->gl = F(n * P), b->ga = F(n * d->dk), b->y1 = F(n * P);
        b->kda_ws = k3c_carve(cv, ws->ops->kda_workspace(&ws->dd, n));
    }
    if (d->n_mla) {
        int64_t Hm = d->Hm;
        b->qa = F(n * (d->r > 0 ? d->r : 1)), b->q = F(n * Hm * (d->nope + d->rope)), b->kva = F(n * d->lat_w);
        b->cn = F(n * d->rkv), b->qlat = F(Hm * n * d->lat_w);
        b->olat = F(Hm * n * d->rkv), b->mo = F(n * Hm * d->dv), b->mg = F(n * Hm * d->dv);
        b->att_ws = k3c_carve(cv, ws->ops->attend_workspace(&ws->dd));
        const k3c_qmat uk = {K3C_QMAT_F32, d->rkv, d->nope, NULL, NULL}, uv = {K3C_QMAT_F32, d->dv, d->rkv, NULL, NULL};
        const size_t hk = ws->ops->heads_workspace(&uk, n), hv = ws->ops->heads_workspace(&uv, n);
        b->heads_ws = k3c_carve(cv, hk > hv ? hk : hv);
    }
    if (E > 0) {
        k3c_dec_moe m = moe_of(c, NULL);
        b->rlog = F(n * E), b->topw = F(n * k), b->zin = F(n * lat), b->u = F(n * lat), b->un = F(n * lat);
        b->ids = K3C_CARVE(cv, int32_t, n * k);
        b->moe_ws = k3c_carve(cv, ws->ops->moe_workspace(&m, n));
    }
    b->fg = F(n * wide), b->fu = F(n * wide), b->fh = F(n * wide), b->ys = F(n * D);
    b->hsel = F(ws->max_out * D), b->hn = F(ws->max_out * D), b->logits = F(ws->max_out * d->V);
    b->tok = K3C_CARVE(cv, int32_t, n), b->row_seg = K3C_CARVE(cv, int32_t, n);
    b->segs = K3C_CARVE(cv, k3c_dec_seg, n);
#undef F
}

int k3c_eng_ws_init(const k3c_weights *w, int64_t max_rows, int64_t max_out, k3c_eng_ws **out, k3c_err *err) {
    *out = NULL;
    const k3c_backend_f32 *be = w->be ? w->be : k3c_backend_cpu_f32();
    if (!be->decode) return k3c_errf(err, K3C_EUNSUPPORTED, "engine: backend '%s' has no engine ops", be->name);
    if (max_rows < 1 || max_out < 1 || max_out > max_rows)
        return k3c_errf(err, K3C_EINVAL, "engine: step of %lld rows with %lld logits rows", (long long)max_rows,
                        (long long)max_out);
    k3c_eng_ws *ws = calloc(1, sizeof *ws);
    if (!ws) return k3c_errf(err, K3C_ENOMEM, "engine: out of memory");
    ws->w = w, ws->be = be, ws->ops = be->decode;
    k3c_eng_dims_of(&w->cfg, &ws->d);
    const k3c_eng_dims *d = &ws->d;
    ws->dd = (k3c_dec_dims){d->H, d->dk, d->W, d->kda_floats, d->Hm, d->rkv, d->rope};
    ws->max_rows = max_rows, ws->max_out = max_out, ws->use_graphs = 1;
    k3c_carver m = k3c_carver_measure(64);
    plan(ws, max_rows, &m, &ws->b);
    ws->hsegs = malloc(sizeof(k3c_dec_seg) * (size_t)max_rows);
    ws->hrow_seg = malloc(sizeof(int32_t) * (size_t)max_rows);
    ws->img_row = malloc(sizeof(int64_t) * (size_t)max_rows);
    ws->graphs = ws->ops->graph_open();
    if (!ws->hsegs || !ws->hrow_seg || !ws->img_row || !(ws->mem = be->alloc(m.off))) {
        k3c_eng_ws_free(ws);
        return k3c_errf(err, K3C_ENOMEM, "engine: step buffers for %lld rows (%zu bytes, %s memory)",
                        (long long)max_rows, m.off, be->name);
    }
    k3c_carver c = k3c_carver_at(ws->mem, m.off, 64);
    plan(ws, max_rows, &c, &ws->b);
    *out = ws;
    return K3C_OK;
}

void k3c_eng_ws_use_graphs(k3c_eng_ws *ws, int on) { ws->use_graphs = on; }

void k3c_eng_ws_free(k3c_eng_ws *ws) {
    if (!ws) return;
    ws->ops->graph_close(ws->graphs);
    if (ws->mem) ws->be->free(ws->mem);
    free(ws->hsegs);
    free(ws->hrow_seg);
    free(ws->img_row);
    free(ws);
}

/* ---------------------------------------------------------------- KDA (§3.1) */

static int kda_layer(const k3c_eng_ws *ws, const k3c_weights_layer *L, int l, int64_t n, float *y, k3c_err *err) {
    const k3c_config *c = &ws->w->cfg;
    const k3c_eng_dims *d = &ws->d;
    const eng_bufs *b = &ws->b;
    const k3c_backend_f32 *be = ws->be;
    const k3c_dec_ops *op = ws->ops;
    const int64_t H = d->H, dk = d->dk, off = (int64_t)d->idx[l] * d->kda_floats;
    const k3c_qmat *Wp[3] = {&L->q_proj, &L->k_proj, &L->v_proj};
    const float *Wc[3] = {L->q_conv, L->k_conv, L->v_conv};
    /* every product of xn in one pass: q, k, v, β's logits, the gate's first factor, the output gate's */
    const int full = c->kda_full_rank_gate;
    const k3c_qmat_job xj[6] = {{Wp[0], b->xn, n, b->pre[0], 0},
                                {Wp[1], b->xn, n, b->pre[1], 0},
                                {Wp[2], b->xn, n, b->pre[2], 0},
                                {&L->b_proj, b->xn, n, b->blog, 0},
                                {&L->f_a, b->xn, n, b->fa, 0},
                                {full ? &L->g_proj : &L->g_a, b->xn, n, full ? b->gl : b->ga, 0}};
    CHECK_RC(op->qmat_mul_many(ws->be->ctx, xj, 6, err));
    const float *const pre[3] = {b->pre[0], b->pre[1], b->pre[2]};
    CHECK_RC(op->qkv_conv(&ws->batch, &ws->dd, off + H * dk * dk, pre, Wc, b->post, err)); /* tails after S [H, dk, dk] */
    CHECK_RC(be->sigmoid(n * H, b->blog, b->beta, err));
    const k3c_qmat_job sj[2] = {{&L->f_b, b->fa, n, b->z, 0}, {&L->g_b, b->ga, n, b->gl, 0}};
    CHECK_RC(op->qmat_mul_many(ws->be->ctx, sj, full ? 1 : 2, err));
    k3c_kda_gate_dims gd = {n, H, dk, c->kda_gate, c->gate_lower_bound};
    CHECK_RC(be->kda_gate_fwd(&gd, b->z, L->dt_bias, L->A_log, b->g, err));
    double bound = c->kda_gate == K3C_GATE_LOWER_BOUND ? c->gate_lower_bound : 0;
    CHECK_RC(op->kda(&ws->batch, &ws->dd, off, b->post[0], b->post[1], b->post[2], b->g, b->beta, bound, b->o,
                     b->kda_ws, err));
    k3c_rmsnorm_sizes rs = {n * H, dk, c->rms_norm_eps};
    CHECK_RC(be->gated_rmsnorm_fwd(&rs, b->o, b->gl, L->o_norm, b->y1, NULL, err));
    return op->qmat_mul(ws->be->ctx, &L->o_proj, b->y1, n, y, 0, err);
}

/* ---------------------------------------------------------------- MLA, absorbed (§4.2) */

static int mla_layer(const k3c_eng_ws *ws, const k3c_weights_layer *L, int l, int64_t n, float *y, k3c_err *err) {
    const k3c_config *c = &ws->w->cfg;
    const k3c_eng_dims *d = &ws->d;
    const eng_bufs *b = &ws->b;
    const k3c_backend_f32 *be = ws->be;
    const k3c_dec_ops *op = ws->ops;
    const int64_t Hm = d->Hm, nope = d->nope, rope = d->rope, dqk = nope + rope, dv = d->dv, rkv = d->rkv;
    const int64_t lw = d->lat_w;
    const k3c_qmat_job xj[3] = {{&L->kv_a, b->xn, n, b->kva, 0}, /* every product of xn in one pass */
                                {d->r > 0 ? &L->q_a : &L->q_proj, b->xn, n, d->r > 0 ? b->qa : b->q, 0},
                                {&L->g_proj, b->xn, n, b->mg, 0}};
    CHECK_RC(op->qmat_mul_many(ws->be->ctx, xj, c->mla_output_gate ? 3 : 2, err));
    if (d->r > 0) {
        k3c_rmsnorm_sizes rq = {n, d->r, c->mla_norm_eps};
        CHECK_RC(be->rmsnorm_fwd(&rq, b->qa, L->q_a_norm, b->qa, NULL, err));
        CHECK_RC(op->qmat_mul(ws->be->ctx, &L->q_b, b->qa, n, b->q, 0, err));
    }
    CHECK_RC(be->copy2d(n, rkv, b->kva, lw, b->cn, rkv, 0, err));
    k3c_rmsnorm_sizes rc = {n, rkv, c->mla_norm_eps};
    CHECK_RC(be->rmsnorm_fwd(&rc, b->cn, L->kv_a_norm, b->cn, NULL, err));
    /* the cache gets [c_KV (normalised) ; k_pe] of every new token before anyone attends (a token sees itself) */
    CHECK_RC(op->cache_put(&ws->batch, &ws->dd, d->idx[l], b->cn, b->kva, err));
    /* queries in latent space per head: [W_UK,hᵀ q_nope,h ; q_pe,h], laid out [Hm, n, lw] */
    CHECK_RC(op->qmat_mul_heads(ws->be->ctx, L->uk_t, Hm, b->q, Hm * dqk, dqk, n, b->qlat, lw, n * lw, b->heads_ws, err));
    if (n <= Hm) /* the rope parts: one strided copy per row or per head, whichever is fewer */
        for (int64_t j = 0; j < n; j++)
            CHECK_RC(be->copy2d(Hm, rope, b->q + j * Hm * dqk + nope, dqk, b->qlat + j * lw + rkv, n * lw, 0, err));
    else
        for (int64_t h = 0; h < Hm; h++)
            CHECK_RC(be->copy2d(n, rope, b->q + h * dqk + nope, Hm * dqk, b->qlat + h * n * lw + rkv, lw, 0, err));
    const float scale = (float)(1.0 / sqrt((double)dqk));
    CHECK_RC(op->attend(&ws->batch, &ws->dd, d->idx[l], b->qlat, scale, b->olat, b->att_ws, err));
    /* values out of latent space per head, o_h = W_UV,h õ_h, straight into their columns of mo [n, Hm·dv] */
    CHECK_RC(op->qmat_mul_heads(ws->be->ctx, L->uv, Hm, b->olat, rkv, n * rkv, n, b->mo, Hm * dv, dv, b->heads_ws, err));
    const float *out = b->mo;
    if (c->mla_output_gate) {
        CHECK_RC(be->sigmoid_gate_fwd(n * Hm * dv, b->mo, b->mg, b->mg, err));
        out = b->mg;
    }
    return op->qmat_mul(ws->be->ctx, &L->o_proj, out, n, y, 0, err);
}

/* ---------------------------------------------------------------- FFN (§6.2, §8, §9.2) */

/* h = act(gate) ⊙ up of the products already made, then y = down(h) */
static int glu_down(const k3c_eng_ws *ws, const k3c_qmat *down, int64_t inter, int64_t n, float *y, k3c_err *err) {
    const eng_bufs *b = &ws->b;
    k3c_glu_sizes gs = {n, inter, k3c_glu_act_from_config(&ws->w->cfg)};
    CHECK_RC(ws->ops->glu(&gs, b->fg, b->fu, b->fh, err));
    return ws->ops->qmat_mul(ws->be->ctx, down, b->fh, n, y, 0, err);
}

/* The FFN of xn, added into the residual stream M. Its products never accumulate into M: a GEMM with β = 1 sums in
 * another order than the GEMV of a lone row, and a batched row must equal its solo run. */
static int ffn_layer(const k3c_eng_ws *ws, const k3c_weights_layer *L, int l, int64_t n, float *M, k3c_err *err) {
    const k3c_config *c = &ws->w->cfg;
    const eng_bufs *b = &ws->b;
    const k3c_backend_f32 *be = ws->be;
    const k3c_dec_ops *op = ws->ops;
    const int64_t D = ws->d.D;
    k3c_qmat_job xj[4]; /* every product of xn in one pass */
    int nj = 0;
    if (c->ffn[l] == K3C_FFN_DENSE) {
        xj[nj++] = (k3c_qmat_job){&L->mlp_gate, b->xn, n, b->fg, 0};
        xj[nj++] = (k3c_qmat_job){&L->mlp_up, b->xn, n, b->fu, 0};
        CHECK_RC(op->qmat_mul_many(ws->be->ctx, xj, nj, err));
        CHECK_RC(glu_down(ws, &L->mlp_down, L->mlp_gate.rows, n, b->y, err));
        return be->add(n * D, b->y, M, err);
    }
    const k3c_dec_moe m = moe_of(c, L);
    xj[nj++] = (k3c_qmat_job){&L->router, b->xn, n, b->rlog, 0};
    if (c->latent_dim > 0) xj[nj++] = (k3c_qmat_job){&L->latent_down, b->xn, n, b->zin, 0};
    if (c->num_shared_experts > 0) {
        xj[nj++] = (k3c_qmat_job){&L->shared_gate, b->xn, n, b->fg, 0};
        xj[nj++] = (k3c_qmat_job){&L->shared_up, b->xn, n, b->fu, 0};
    }
    CHECK_RC(op->qmat_mul_many(ws->be->ctx, xj, nj, err));
    k3c_router_sizes rs = {n, m.E, m.k, c->renormalize, c->routed_scaling_factor};
    CHECK_RC(be->router_fwd(&rs, b->rlog, L->router_bias, b->ids, b->topw, NULL, err));
    const float *xin = c->latent_dim > 0 ? b->zin : b->xn;
    float *u = c->latent_dim > 0 ? b->u : b->y;
    CHECK_RC(op->moe(&m, xin, n, b->ids, b->topw, u, b->moe_ws, err));
    if (c->latent_dim > 0) {
        const float *un = u;
        if (c->latent_norm) {
            k3c_rmsnorm_sizes ns = {n, m.lat, c->rms_norm_eps};
            CHECK_RC(be->rmsnorm_fwd(&ns, u, L->latent_norm, b->un, NULL, err));
            un = b->un;
        }
        CHECK_RC(op->qmat_mul(ws->be->ctx, &L->latent_up, un, n, b->y, 0, err));
    }
    if (c->num_shared_experts > 0) {
        CHECK_RC(glu_down(ws, &L->shared_down, L->shared_gate.rows, n, b->ys, err));
        CHECK_RC(be->add(n * D, b->ys, b->y, err));
    }
    return be->add(n * D, b->y, M, err);
}

/* ---------------------------------------------------------------- the layer walk (§5.3) */

static int mix(const k3c_eng_ws *ws, const float *const *src, int ns, const float *proj, const float *norm, int64_t n,
               float *out, k3c_err *err) {
    k3c_attnres_sizes s = {n, ws->d.D, ns, ws->w->cfg.rms_norm_eps};
    return ws->be->attnres_fwd(&s, src, proj, norm, out, NULL, err);
}

/* The whole step from the uploaded ids and segments to the logits in backend memory: everything it reads per step sits
 * at fixed addresses of the workspace, so a backend may capture it once per batch shape and replay it. */
static int step_body(void *arg, k3c_err *err) {
    const k3c_eng_ws *ws = arg;
    const k3c_weights *w = ws->w;
    const k3c_config *c = &w->cfg;
    const k3c_eng_dims *d = &ws->d;
    const eng_bufs *b = &ws->b;
    const k3c_backend_f32 *be = ws->be;
    const int64_t D = d->D, S = c->attn_res_block, n = ws->batch.n;
    CHECK_RC(ws->ops->embed(&w->embed, b->tok, n, b->emb, err));
    for (int64_t j = 0; j < ws->n_img; j++) /* image rows replace their placeholders' token embeddings */
        CHECK_RC(be->copy2d(1, D, b->img + j * D, D, b->emb + ws->img_row[j] * D, D, 0, err));
    const float *R[K3C_ATTNRES_MAX_SOURCES + 1];
    int nR = 0;
    const float *P = b->emb;
    k3c_rmsnorm_sizes rs = {n, D, c->rms_norm_eps};
    for (int l = 0; l < d->L; l++) {
        const k3c_weights_layer *L = &w->layer[l];
        const int boundary = S > 0 && l % S == 0;
        const float *ain = P;
        if (S > 0 && l > 0) {
            R[nR] = P;
            CHECK_RC(mix(ws, R, nR + 1, L->attn_res_proj, L->attn_res_norm, n, b->mixo, err));
            ain = b->mixo;
        }
        if (boundary) { /* P becomes a completed source; the block's partial sum restarts */
            float *keep = b->blk + (size_t)nR * (size_t)(n * D);
            if (P != b->emb) CHECK_RC(be->copy2d(1, n * D, P, n * D, keep, n * D, 0, err));
            R[nR++] = P == b->emb ? b->emb : keep;
        }
        CHECK_RC(be->rmsnorm_fwd(&rs, ain, L->input_norm, b->xn, NULL, err));
        float *M = P == b->pa ? b->pb : b->pa; /* the mixer's output, then the residual stream after this layer */
        if (c->mixer[l] == K3C_MIXER_KDA)
            CHECK_RC(kda_layer(ws, L, l, n, M, err));
        else
            CHECK_RC(mla_layer(ws, L, l, n, M, err));
        if (!boundary) CHECK_RC(be->add(n * D, P, M, err));
        const float *min = M;
        if (S > 0) {
            R[nR] = M;
            CHECK_RC(mix(ws, R, nR + 1, L->mlp_res_proj, L->mlp_res_norm, n, b->mixo, err));
            min = b->mixo;
        }
        CHECK_RC(be->rmsnorm_fwd(&rs, min, L->post_norm, b->xn, NULL, err));
        CHECK_RC(ffn_layer(ws, L, l, n, M, err));
        P = M;
    }
    const float *h = P;
    if (S > 0) {
        R[nR] = P;
        CHECK_RC(mix(ws, R, nR + 1, w->out_res_proj, w->out_res_norm, n, b->mixo, err));
        h = b->mixo;
    }
    if (ws->n_out == 0) return K3C_OK; /* a prompt chunk that samples nothing */
    const float *hs = h;               /* every row's logits in row order: no gather */
    if (ws->out_rows) {
        for (int64_t i = 0; i < ws->n_out; i++)
            CHECK_RC(be->copy2d(1, D, h + ws->out_rows[i] * D, D, b->hsel + i * D, D, 0, err));
        hs = b->hsel;
    }
    k3c_rmsnorm_sizes fs = {ws->n_out, D, c->rms_norm_eps};
    CHECK_RC(be->rmsnorm_fwd(&fs, hs, w->final_norm, b->hn, NULL, err));
    return ws->ops->qmat_mul(ws->be->ctx, &w->lm_head, b->hn, ws->n_out, b->logits, 0, err);
}

int k3c_eng_forward(const k3c_weights *w, k3c_eng_ws *ws, const int32_t *ids, const k3c_eng_seg *segs, int nseg,
                    const int64_t *out_rows, int64_t n_out, float *logits, k3c_err *err) {
    const k3c_eng_dims *d = &ws->d;
    const int64_t V = d->V;
    if (w != ws->w) return k3c_errf(err, K3C_EINVAL, "engine: the step buffers belong to other weights");
    int64_t n = 0, max_len = 0;
    for (int s = 0; s < nseg; s++) {
        if (segs[s].row0 != n || segs[s].len < 1 || segs[s].st->pos + segs[s].len > segs[s].st->cap ||
            n + segs[s].len > ws->max_rows)
            return k3c_errf(
                err, K3C_EINVAL,
                "engine: segment %d (rows %lld+%lld at position %lld) does not fit (step buffers: %lld rows)", s,
                (long long)segs[s].row0, (long long)segs[s].len, (long long)segs[s].st->pos, (long long)ws->max_rows);
        const k3c_eng_state *st = segs[s].st;
        ws->hsegs[s] = (k3c_dec_seg){st->kda, st->mla, st->pos, st->cap, segs[s].row0, segs[s].len};
        for (int64_t r = n; r < n + segs[s].len; r++) ws->hrow_seg[r] = s;
        n += segs[s].len;
        if (segs[s].len > max_len) max_len = segs[s].len;
    }
    if (n < 1) return k3c_errf(err, K3C_EINVAL, "engine: a step of no rows");
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return k3c_errf(err, K3C_EINVAL, "engine: token id %d at row %lld is outside [0, %lld)", ids[i],
                            (long long)i, (long long)V);
    if (!out_rows) n_out = n;
    if (n_out < 0 || n_out > ws->max_out)
        return k3c_errf(err, K3C_EINVAL, "engine: %lld logits rows, the step buffers hold %lld", (long long)n_out,
                        (long long)ws->max_out);
    int identity = n_out == n; /* out_rows 0, 1, .., n−1: the step's shape depends on n alone */
    for (int64_t i = 0; out_rows && i < n_out; i++) {
        if (out_rows[i] < 0 || out_rows[i] >= n)
            return k3c_errf(err, K3C_EINVAL, "engine: output row %lld outside the step", (long long)out_rows[i]);
        identity &= out_rows[i] == i;
    }
    const eng_bufs *b = &ws->b;
    CHECK_RC(ws->be->upload(b->tok, ids, sizeof(int32_t) * (size_t)n, err));
    CHECK_RC(ws->be->upload(b->segs, ws->hsegs, sizeof(k3c_dec_seg) * (size_t)nseg, err));
    CHECK_RC(ws->be->upload(b->row_seg, ws->hrow_seg, sizeof(int32_t) * (size_t)n, err));
    ws->n_img = 0;
    for (int s = 0; s < nseg; s++)
        for (int64_t i = 0; segs[s].emb && i < segs[s].len; i++)
            if (segs[s].emb[i]) {
                CHECK_RC(
                    ws->be->upload(b->img + ws->n_img * ws->d.D, segs[s].emb[i], sizeof(float) * (size_t)ws->d.D, err));
                ws->img_row[ws->n_img++] = segs[s].row0 + i;
            }
    ws->batch = (k3c_dec_batch){ws->hsegs, b->segs, b->row_seg, nseg, n, max_len};
    ws->out_rows = identity ? NULL : out_rows, ws->n_out = n_out;
    /* a decode step (one token per sequence, every row's logits) repeats its shape: key it by its row count */
    const int64_t key = ws->use_graphs && max_len == 1 && identity && !ws->n_img ? n : 0; /* image rows: not captured */
    CHECK_RC(ws->ops->run(ws->graphs, key, step_body, ws, err));
    for (int s = 0; s < nseg; s++) segs[s].st->pos += segs[s].len;
    return n_out ? ws->be->download(logits, b->logits, sizeof(float) * (size_t)(n_out * V), err) : ws->be->sync(err);
}
