/* engine_fwd.c — the engine's forward over a batch of sequence segments: weight products batched over every row of the
 * step (k3c_qmat_mul), sequence mixing per segment against its decode state (short conv tails, KDA state, absorbed MLA
 * over the latent cache), MoE rows grouped by expert, Block AttnRes over the step's rows.
 * Spec: docs/MODEL.md §3.1 (KDA), §4.2 (MLA, absorbed form), §5.3 (AttnRes control flow), §6.2 + §9.2 (MoE). */
#include "base/carve.h"
#include "base/check.h"
#include "ops/attnres.h"
#include "ops/basic.h"
#include "ops/glu.h"
#include "ops/kda.h"
#include "ops/l2norm.h"
#include "ops/moe.h"
#include "ops/short_conv.h"
#include "serve/engine.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define ATT_BQ 64 /* query rows per attention tile */
#define ATT_BK 64 /* cached tokens per key tile */
#define KDA_CHUNK 16

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

/* The step's buffers for n rows (measured, then carved: the same code sizes and lays them out). */
typedef struct {
    float *emb, *pa, *pb, *blk, *mixo, *xn, *y; /* [n, D]; blk: NS × [n, D] */
    /* KDA */
    float *pre[3], *post[3], *blog, *beta, *fa, *z, *g, *o, *gl, *ga, *y1;
    void *kda_ws;
    /* MLA */
    float *qa, *q, *kva, *cn, *qlat, *qtmp, *olat, *vh, *mo, *mg;
    float *att; /* per thread: scores [BQ, BK], acc [BQ, rkv], m, l [BQ] */
    /* FFN */
    float *rlog, *topw, *zin, *xg, *fg, *fu, *fh, *ys, *u, *un;
    int32_t *ids, *slot, *cnt;
    k3c_qmat_job *jobs; /* 2 × num_experts: the routed experts' products of one step */
    /* output */
    float *hsel, *hn;
} eng_bufs;

struct k3c_eng_ws {
    const k3c_weights *w;
    k3c_eng_dims d;
    int64_t max_rows;
    int nthr;
    size_t att_floats;
    eng_bufs b;
    void *mem;
};

static int max_sources(const k3c_config *c) {
    return c->attn_res_block > 0 ? (int)((c->num_layers + c->attn_res_block - 1) / c->attn_res_block) + 1 : 0;
}

static void plan(const k3c_config *c, const k3c_eng_dims *d, int64_t n, int nthr, size_t att, k3c_carver *cv,
                 eng_bufs *b) {
    int64_t D = d->D, P = d->P, E = c->num_experts, k = c->top_k > 0 ? c->top_k : 1;
    int64_t lat = c->latent_dim > 0 ? c->latent_dim : D, Im = c->moe_intermediate_size;
    int64_t S = c->num_shared_experts * Im, If = c->intermediate_size;
    int64_t wide = If > S ? If : S;
    int ns = max_sources(c);
#define F(count) K3C_CARVE(cv, float, (count))
    b->emb = F(n * D), b->pa = F(n * D), b->pb = F(n * D), b->blk = F((ns ? ns : 1) * n * D);
    b->mixo = F(n * D), b->xn = F(n * D), b->y = F(n * D);
    if (d->n_kda) {
        for (int i = 0; i < 3; i++) b->pre[i] = F(n * P), b->post[i] = F(n * P);
        b->blog = F(n * d->H), b->beta = F(n * d->H), b->fa = F(n * d->dk), b->z = F(n * P), b->g = F(n * P);
        b->o = F(n * P), b->gl = F(n * P), b->ga = F(n * d->dk), b->y1 = F(n * P);
        k3c_kda_dims kd = {n, d->H, d->dk, d->dk, 1, KDA_CHUNK, 0, 0};
        b->kda_ws = k3c_carve(cv, k3c_kda_chunk_fwd_workspace_f32(&kd));
    }
    if (d->n_mla) {
        int64_t Hm = d->Hm;
        b->qa = F(n * (d->r > 0 ? d->r : 1)), b->q = F(n * Hm * (d->nope + d->rope)), b->kva = F(n * d->lat_w);
        b->cn = F(n * d->rkv), b->qlat = F(Hm * n * d->lat_w), b->qtmp = F(n * d->nope);
        b->olat = F(Hm * n * d->rkv), b->vh = F(n * d->dv), b->mo = F(n * Hm * d->dv), b->mg = F(n * Hm * d->dv);
        b->att = F((int64_t)nthr * (int64_t)att);
    }
    if (E > 0) {
        b->rlog = F(n * E), b->topw = F(n * k), b->zin = F(n * lat), b->xg = F(n * k * lat);
        b->u = F(n * k * lat), b->un = F(n * lat);
        b->ids = K3C_CARVE(cv, int32_t, n * k), b->slot = K3C_CARVE(cv, int32_t, n * k);
        b->cnt = K3C_CARVE(cv, int32_t, E + 1);
        b->jobs = K3C_CARVE(cv, k3c_qmat_job, 2 * E);
    }
    int64_t gw = (E > 0 ? n * k * Im : 0) > n * wide ? n * k * Im : n * wide;
    b->fg = F(gw), b->fu = F(gw), b->fh = F(gw), b->ys = F(n * D);
    b->hsel = F(n * D), b->hn = F(n * D);
#undef F
}

int k3c_eng_ws_init(const k3c_weights *w, int64_t max_rows, k3c_eng_ws **out, k3c_err *err) {
    *out = NULL;
    k3c_eng_ws *ws = calloc(1, sizeof *ws);
    if (!ws) return k3c_errf(err, K3C_ENOMEM, "engine: out of memory");
    ws->w = w;
    k3c_eng_dims_of(&w->cfg, &ws->d);
    ws->max_rows = max_rows;
    ws->nthr = k3c_num_threads();
    ws->att_floats = (size_t)(ATT_BQ * ATT_BK + ATT_BQ * ws->d.rkv + 2 * ATT_BQ);
    k3c_carver m = k3c_carver_measure(64);
    plan(&w->cfg, &ws->d, max_rows, ws->nthr, ws->att_floats, &m, &ws->b);
    if (!(ws->mem = k3c_aligned_alloc(m.off))) {
        free(ws);
        return k3c_errf(err, K3C_ENOMEM, "engine: step buffers for %lld rows (%zu bytes)", (long long)max_rows, m.off);
    }
    k3c_carver c = k3c_carver_at(ws->mem, m.off, 64);
    plan(&w->cfg, &ws->d, max_rows, ws->nthr, ws->att_floats, &c, &ws->b);
    *out = ws;
    return K3C_OK;
}

void k3c_eng_ws_free(k3c_eng_ws *ws) {
    if (!ws) return;
    k3c_aligned_free(ws->mem);
    free(ws);
}

/* ---------------------------------------------------------------- KDA (§3.1) */

static float *kda_state(const k3c_eng_dims *d, k3c_eng_state *s, int l) {
    return s->kda + (size_t)d->idx[l] * (size_t)d->kda_floats;
}

static int kda_layer(const k3c_eng_ws *ws, const k3c_weights_layer *L, int l, const k3c_eng_seg *segs, int nseg,
                     int64_t n, k3c_err *err) {
    const k3c_config *c = &ws->w->cfg;
    const k3c_eng_dims *d = &ws->d;
    const eng_bufs *b = &ws->b;
    const int64_t P = d->P, H = d->H, dk = d->dk, W = d->W;
    const k3c_qmat *Wp[3] = {&L->q_proj, &L->k_proj, &L->v_proj};
    const float *Wc[3] = {L->q_conv, L->k_conv, L->v_conv};
    /* every product that reads xn, as one batch (one parallel region) */
    const int full = c->kda_full_rank_gate;
    const k3c_qmat_job in[6] = {
        {Wp[0], b->xn, n, b->pre[0], 0}, {Wp[1], b->xn, n, b->pre[1], 0},
        {Wp[2], b->xn, n, b->pre[2], 0}, {&L->b_proj, b->xn, n, b->blog, 0},
        {&L->f_a, b->xn, n, b->fa, 0},   {full ? &L->g_proj : &L->g_a, b->xn, n, full ? b->gl : b->ga, 0}};
    k3c_qmat_mul_many(in, 6);
    for (int s = 0; s < nseg; s++) {
        const k3c_eng_seg *g = &segs[s];
        float *S = kda_state(d, g->st, l), *conv = S + H * dk * dk;
        k3c_short_conv_dims cd = {g->len, P, (int)W, 1};
        for (int i = 0; i < 3; i++) {
            float *tail = conv + (size_t)i * (size_t)(P * (W - 1));
            CHECK_RC(k3c_short_conv_fwd_f32(&cd, NULL, b->pre[i] + g->row0 * P, Wc[i], tail, b->post[i] + g->row0 * P,
                                            tail, err));
        }
    }
    k3c_l2norm_dims ld = {n * H, dk, 1e-6};
    CHECK_RC(k3c_l2norm_fwd_f32(&ld, b->post[0], b->post[0], NULL, err));
    CHECK_RC(k3c_l2norm_fwd_f32(&ld, b->post[1], b->post[1], NULL, err));
    k3c_sigmoid_f32(n * H, b->blog, b->beta);
    k3c_qmat_mul(&L->f_b, b->fa, n, b->z, 0);
    k3c_kda_gate_dims gd = {n, H, dk, c->kda_gate, c->gate_lower_bound};
    CHECK_RC(k3c_kda_gate_fwd_f32(&gd, b->z, L->dt_bias, L->A_log, b->g, err));
    double bound = c->kda_gate == K3C_GATE_LOWER_BOUND ? c->gate_lower_bound : 0;
    for (int s = 0; s < nseg; s++) {
        const k3c_eng_seg *g = &segs[s];
        float *S = kda_state(d, g->st, l);
        const int64_t o = g->row0 * P;
        k3c_kda_dims kd = {g->len, H, dk, dk, 1, KDA_CHUNK, 0, bound};
        /* one token: the recurrence is the decode step; a run of tokens: the chunked form, from and into the state */
        if (g->len == 1)
            CHECK_RC(k3c_kda_recurrent_fwd_f32(&kd, NULL, b->post[0] + o, b->post[1] + o, b->post[2] + o, b->g + o,
                                               b->beta + g->row0 * H, S, b->o + o, S, NULL, err));
        else
            CHECK_RC(k3c_kda_chunk_fwd_f32(&kd, NULL, b->post[0] + o, b->post[1] + o, b->post[2] + o, b->g + o,
                                           b->beta + g->row0 * H, S, b->o + o, S, b->kda_ws, err));
    }
    if (!full) k3c_qmat_mul(&L->g_b, b->ga, n, b->gl, 0);
    k3c_rmsnorm_sizes rs = {n * H, dk, c->rms_norm_eps};
    CHECK_RC(k3c_gated_rmsnorm_fwd_f32(&rs, b->o, b->gl, L->o_norm, b->y1, NULL, err));
    k3c_qmat_mul(&L->o_proj, b->y1, n, b->y, 0);
    return K3C_OK;
}

/* ---------------------------------------------------------------- MLA, absorbed (§4.2) */

/* One (segment, head): queries qlat [len, lat_w] at positions pos0.. attend over the cache [0, pos0+len) with an online
 * softmax over key tiles (MQA: every head reads the one cached [c_KV; k_pe] per token); out [len, rkv]. */
static void attend(const k3c_eng_dims *d, const float *cache, int64_t pos0, const float *qlat, int64_t len, float scale,
                   float *out, float *scr) {
    const int64_t lw = d->lat_w, rkv = d->rkv;
    float *Sb = scr, *acc = Sb + ATT_BQ * ATT_BK, *mx = acc + ATT_BQ * rkv, *sum = mx + ATT_BQ;
    for (int64_t q0 = 0; q0 < len; q0 += ATT_BQ) {
        const int64_t nq = len - q0 < ATT_BQ ? len - q0 : ATT_BQ, last = pos0 + q0 + nq; /* keys [0, last) */
        for (int64_t i = 0; i < nq; i++) mx[i] = -INFINITY, sum[i] = 0;
        memset(acc, 0, sizeof(float) * (size_t)(nq * rkv));
        for (int64_t k0 = 0; k0 < last; k0 += ATT_BK) {
            const int64_t nk = last - k0 < ATT_BK ? last - k0 : ATT_BK;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nk, (int)lw, scale, qlat + q0 * lw,
                        (int)lw, cache + k0 * lw, (int)lw, 0.0f, Sb, ATT_BK);
            for (int64_t i = 0; i < nq; i++) {
                const int64_t p = pos0 + q0 + i; /* the query's position: keys j <= p */
                float *s = Sb + i * ATT_BK, m = mx[i];
                for (int64_t j = 0; j < nk; j++)
                    if (k0 + j > p)
                        s[j] = -INFINITY;
                    else if (s[j] > m)
                        m = s[j];
                const float corr = mx[i] == -INFINITY ? 0.0f : expf(mx[i] - m);
                float z = 0;
                for (int64_t j = 0; j < nk; j++) z += s[j] = k0 + j > p ? 0.0f : expf(s[j] - m);
                sum[i] = sum[i] * corr + z;
                mx[i] = m;
                if (corr != 1.0f)
                    for (int64_t e = 0; e < rkv; e++) acc[i * rkv + e] *= corr;
            }
            /* values are the cached latents themselves: the first rkv entries of each cached row */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, (int)rkv, (int)nk, 1.0f, Sb, ATT_BK,
                        cache + k0 * lw, (int)lw, 1.0f, acc, (int)rkv);
        }
        for (int64_t i = 0; i < nq; i++)
            for (int64_t e = 0; e < rkv; e++) out[(q0 + i) * rkv + e] = acc[i * rkv + e] / sum[i];
    }
}

static float *mla_cache(const k3c_eng_dims *d, const k3c_eng_state *s, int l) {
    return s->mla + (size_t)d->idx[l] * (size_t)(s->cap * d->lat_w);
}

static int mla_layer(const k3c_eng_ws *ws, const k3c_weights_layer *L, int l, const k3c_eng_seg *segs, int nseg,
                     int64_t n, k3c_err *err) {
    const k3c_config *c = &ws->w->cfg;
    const k3c_eng_dims *d = &ws->d;
    const eng_bufs *b = &ws->b;
    const int64_t Hm = d->Hm, nope = d->nope, rope = d->rope, dqk = nope + rope, dv = d->dv, rkv = d->rkv;
    const int64_t lw = d->lat_w;
    if (d->r > 0) {
        k3c_qmat_mul(&L->q_a, b->xn, n, b->qa, 0);
        k3c_rmsnorm_sizes rq = {n, d->r, c->mla_norm_eps};
        CHECK_RC(k3c_rmsnorm_fwd_f32(&rq, b->qa, L->q_a_norm, b->qa, NULL, err));
        k3c_qmat_mul(&L->q_b, b->qa, n, b->q, 0);
    } else {
        k3c_qmat_mul(&L->q_proj, b->xn, n, b->q, 0);
    }
    k3c_qmat_mul(&L->kv_a, b->xn, n, b->kva, 0);
    k3c_copy2d_f32(n, rkv, b->kva, lw, b->cn, rkv, 0);
    k3c_rmsnorm_sizes rc = {n, rkv, c->mla_norm_eps};
    CHECK_RC(k3c_rmsnorm_fwd_f32(&rc, b->cn, L->kv_a_norm, b->cn, NULL, err));
    /* the cache gets [c_KV (normalised) ; k_pe] of every new token before anyone attends (a token sees itself) */
    for (int s = 0; s < nseg; s++) {
        const k3c_eng_seg *g = &segs[s];
        float *cache = mla_cache(d, g->st, l) + g->st->pos * lw;
        k3c_copy2d_f32(g->len, rkv, b->cn + g->row0 * rkv, rkv, cache, lw, 0);
        k3c_copy2d_f32(g->len, rope, b->kva + g->row0 * lw + rkv, lw, cache + rkv, lw, 0);
    }
    /* queries in latent space per head: [W_UK,hᵀ q_nope,h ; q_pe,h], laid out [Hm, n, lw] */
    for (int64_t h = 0; h < Hm; h++) {
        float *qh = b->qlat + h * n * lw;
        k3c_copy2d_f32(n, nope, b->q + h * dqk, Hm * dqk, b->qtmp, nope, 0);
        k3c_qmat_mul(&L->uk_t[h], b->qtmp, n, b->olat, 0); /* olat as scratch [n, rkv] */
        k3c_copy2d_f32(n, rkv, b->olat, rkv, qh, lw, 0);
        k3c_copy2d_f32(n, rope, b->q + h * dqk + nope, Hm * dqk, qh + rkv, lw, 0);
    }
    const float scale = (float)(1.0 / sqrt((double)dqk));
    const int64_t jobs = (int64_t)nseg * Hm;
#pragma omp parallel for schedule(dynamic) num_threads(ws->nthr) if (jobs > 1)
    for (int64_t job = 0; job < jobs; job++) {
        const k3c_eng_seg *g = &segs[job / Hm];
        const int64_t h = job % Hm;
        attend(d, mla_cache(d, g->st, l), g->st->pos, b->qlat + (h * n + g->row0) * lw, g->len, scale,
               b->olat + (h * n + g->row0) * rkv, b->att + (size_t)omp_get_thread_num() * ws->att_floats);
    }
    /* values out of latent space per head: o_h = W_UV,h õ_h */
    for (int64_t h = 0; h < Hm; h++) {
        k3c_qmat_mul(&L->uv[h], b->olat + h * n * rkv, n, b->vh, 0);
        k3c_copy2d_f32(n, dv, b->vh, dv, b->mo + h * dv, Hm * dv, 0);
    }
    const float *out = b->mo;
    if (c->mla_output_gate) {
        k3c_qmat_mul(&L->g_proj, b->xn, n, b->mg, 0);
        CHECK_RC(k3c_sigmoid_gate_fwd_f32(n * Hm * dv, b->mo, b->mg, b->mg, err));
        out = b->mg;
    }
    k3c_qmat_mul(&L->o_proj, out, n, b->y, 0);
    return K3C_OK;
}

/* ---------------------------------------------------------------- FFN (§6.2, §8, §9.2) */

static int glu_mlp(const k3c_config *c, const eng_bufs *b, const k3c_qmat *gate, const k3c_qmat *up,
                   const k3c_qmat *down, const float *x, int64_t n, float *y, int acc, k3c_err *err) {
    const k3c_qmat_job gu[2] = {{gate, x, n, b->fg, 0}, {up, x, n, b->fu, 0}};
    k3c_qmat_mul_many(gu, 2);
    k3c_glu_sizes gs = {n, gate->rows, k3c_glu_act_from_config(c)};
    CHECK_RC(k3c_glu_fwd_f32(&gs, b->fg, b->fu, b->fh, err));
    k3c_qmat_mul(down, b->fh, n, y, acc);
    return K3C_OK;
}

/* The routed experts over the grouped rows (b->cnt: start offsets): the gate and up products of every active expert as
 * one batch of jobs, the GLU over all rows, then the down products as one batch, so the top-k experts of a decode token
 * are one parallel region each time instead of three per expert. Each row's products are those of a lone call. */
static int routed_experts(const k3c_eng_ws *ws, const k3c_weights_layer *L, int64_t lat, int64_t rows, k3c_err *err) {
    const k3c_config *c = &ws->w->cfg;
    const eng_bufs *b = &ws->b;
    const int64_t E = c->num_experts, Im = c->moe_intermediate_size;
    k3c_qmat_job *jobs = b->jobs;
    int nj = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t r0 = b->cnt[e], nr = b->cnt[e + 1] - r0;
        if (nr == 0) continue;
        jobs[nj++] = (k3c_qmat_job){&L->w1[e], b->xg + r0 * lat, nr, b->fg + r0 * Im, 0};
        jobs[nj++] = (k3c_qmat_job){&L->w3[e], b->xg + r0 * lat, nr, b->fu + r0 * Im, 0};
    }
    k3c_qmat_mul_many(jobs, nj);
    k3c_glu_sizes gs = {rows, Im, k3c_glu_act_from_config(c)};
    CHECK_RC(k3c_glu_fwd_f32(&gs, b->fg, b->fu, b->fh, err));
    nj = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t r0 = b->cnt[e], nr = b->cnt[e + 1] - r0;
        if (nr > 0) jobs[nj++] = (k3c_qmat_job){&L->w2[e], b->fh + r0 * Im, nr, b->u + r0 * lat, 0};
    }
    k3c_qmat_mul_many(jobs, nj);
    return K3C_OK;
}

static int ffn_layer(const k3c_eng_ws *ws, const k3c_weights_layer *L, int l, int64_t n, k3c_err *err) {
    const k3c_config *c = &ws->w->cfg;
    const eng_bufs *b = &ws->b;
    const int64_t D = ws->d.D;
    if (c->ffn[l] == K3C_FFN_DENSE)
        return glu_mlp(c, b, &L->mlp_gate, &L->mlp_up, &L->mlp_down, b->xn, n, b->y, 0, err);
    const int64_t E = c->num_experts, k = c->top_k, lat = c->latent_dim > 0 ? c->latent_dim : D;
    k3c_qmat_mul(&L->router, b->xn, n, b->rlog, 0);
    k3c_router_sizes rs = {n, E, k, c->renormalize, c->routed_scaling_factor};
    CHECK_RC(k3c_router_fwd_f32(&rs, b->rlog, L->router_bias, b->ids, b->topw, NULL, err));
    const float *xin = b->xn;
    if (c->latent_dim > 0) {
        k3c_qmat_mul(&L->latent_down, b->xn, n, b->zin, 0);
        xin = b->zin;
    }
    /* group the routed slots by expert (counting sort, stable): one product per expert over all its rows */
    memset(b->cnt, 0, sizeof(int32_t) * (size_t)(E + 1));
    for (int64_t i = 0; i < n * k; i++) b->cnt[b->ids[i] + 1]++;
    for (int64_t e = 0; e < E; e++) b->cnt[e + 1] += b->cnt[e];
    for (int64_t i = 0; i < n * k; i++) {
        int32_t at = b->slot[i] = b->cnt[b->ids[i]]++; /* slot i's row in the grouped buffers */
        memcpy(b->xg + at * lat, xin + (i / k) * lat, sizeof(float) * (size_t)lat);
    }
    for (int64_t e = E; e > 0; e--) b->cnt[e] = b->cnt[e - 1]; /* back to start offsets */
    b->cnt[0] = 0;
    CHECK_RC(routed_experts(ws, L, lat, n * k, err));
    /* combine each token's k expert outputs in slot order */
    float *u = c->latent_dim > 0 ? b->zin : b->y; /* zin is free again */
    for (int64_t t = 0; t < n; t++) {
        float *ut = u + t * lat;
        memset(ut, 0, sizeof(float) * (size_t)lat);
        for (int64_t j = 0; j < k; j++) {
            const float wj = b->topw[t * k + j], *src = b->u + (int64_t)b->slot[t * k + j] * lat;
            for (int64_t e = 0; e < lat; e++) ut[e] += wj * src[e];
        }
    }
    if (c->latent_dim > 0) {
        const float *un = u;
        if (c->latent_norm) {
            k3c_rmsnorm_sizes ns = {n, lat, c->rms_norm_eps};
            CHECK_RC(k3c_rmsnorm_fwd_f32(&ns, u, L->latent_norm, b->un, NULL, err));
            un = b->un;
        }
        k3c_qmat_mul(&L->latent_up, un, n, b->y, 0);
    }
    if (c->num_shared_experts > 0) {
        CHECK_RC(glu_mlp(c, b, &L->shared_gate, &L->shared_up, &L->shared_down, b->xn, n, b->ys, 0, err));
        k3c_add_f32(n * D, b->ys, b->y);
    }
    return K3C_OK;
}

/* ---------------------------------------------------------------- the layer walk (§5.3) */

static int mix(const k3c_eng_ws *ws, const float *const *src, int ns, const float *proj, const float *norm, int64_t n,
               float *out, k3c_err *err) {
    k3c_attnres_sizes s = {n, ws->d.D, ns, ws->w->cfg.rms_norm_eps};
    return k3c_attnres_fwd_f32(&s, src, proj, norm, out, NULL, err);
}

int k3c_eng_forward(const k3c_weights *w, k3c_eng_ws *ws, const int32_t *ids, const k3c_eng_seg *segs, int nseg,
                    const int64_t *out_rows, int64_t n_out, float *logits, k3c_err *err) {
    const k3c_config *c = &w->cfg;
    const k3c_eng_dims *d = &ws->d;
    const eng_bufs *b = &ws->b;
    const int64_t D = d->D, V = d->V, S = c->attn_res_block;
    int64_t n = 0;
    for (int s = 0; s < nseg; s++) {
        if (segs[s].row0 != n || segs[s].len < 1 || segs[s].st->pos + segs[s].len > segs[s].st->cap)
            return k3c_errf(err, K3C_EINVAL, "engine: segment %d (rows %lld+%lld at position %lld) does not fit", s,
                            (long long)segs[s].row0, (long long)segs[s].len, (long long)segs[s].st->pos);
        n += segs[s].len;
    }
    if (n > ws->max_rows)
        return k3c_errf(err, K3C_EINVAL, "engine: %lld rows, the step buffers hold %lld", (long long)n,
                        (long long)ws->max_rows);
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= V)
            return k3c_errf(err, K3C_EINVAL, "engine: token id %d at row %lld is outside [0, %lld)", ids[i],
                            (long long)i, (long long)V);
        k3c_qmat_row(&w->embed, ids[i], b->emb + i * D);
    }
    for (int s = 0; s < nseg; s++) /* image rows: their embeddings replace the placeholder's */
        for (int64_t i = 0; segs[s].emb && i < segs[s].len; i++)
            if (segs[s].emb[i]) memcpy(b->emb + (segs[s].row0 + i) * D, segs[s].emb[i], sizeof(float) * (size_t)D);
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
            if (P != b->emb) memcpy(keep, P, sizeof(float) * (size_t)(n * D));
            R[nR++] = P == b->emb ? b->emb : keep;
        }
        CHECK_RC(k3c_rmsnorm_fwd_f32(&rs, ain, L->input_norm, b->xn, NULL, err));
        if (c->mixer[l] == K3C_MIXER_KDA)
            CHECK_RC(kda_layer(ws, L, l, segs, nseg, n, err));
        else
            CHECK_RC(mla_layer(ws, L, l, segs, nseg, n, err));
        float *M = P == b->pa ? b->pb : b->pa;
        memcpy(M, b->y, sizeof(float) * (size_t)(n * D));
        if (!boundary) k3c_add_f32(n * D, P, M);
        const float *min = M;
        if (S > 0) {
            R[nR] = M;
            CHECK_RC(mix(ws, R, nR + 1, L->mlp_res_proj, L->mlp_res_norm, n, b->mixo, err));
            min = b->mixo;
        }
        CHECK_RC(k3c_rmsnorm_fwd_f32(&rs, min, L->post_norm, b->xn, NULL, err));
        CHECK_RC(ffn_layer(ws, L, l, n, err));
        k3c_add_f32(n * D, b->y, M);
        P = M;
    }
    for (int s = 0; s < nseg; s++) segs[s].st->pos += segs[s].len;
    const float *h = P;
    if (S > 0) {
        R[nR] = P;
        CHECK_RC(mix(ws, R, nR + 1, w->out_res_proj, w->out_res_norm, n, b->mixo, err));
        h = b->mixo;
    }
    if (!out_rows) n_out = n;
    for (int64_t i = 0; i < n_out; i++) {
        int64_t r = out_rows ? out_rows[i] : i;
        if (r < 0 || r >= n) return k3c_errf(err, K3C_EINVAL, "engine: output row %lld outside the step", (long long)r);
        memcpy(b->hsel + i * D, h + r * D, sizeof(float) * (size_t)D);
    }
    k3c_rmsnorm_sizes fs = {n_out, D, c->rms_norm_eps};
    CHECK_RC(k3c_rmsnorm_fwd_f32(&fs, b->hsel, w->final_norm, b->hn, NULL, err));
    k3c_qmat_mul(&w->lm_head, b->hn, n_out, logits, 0);
    return K3C_OK;
}
