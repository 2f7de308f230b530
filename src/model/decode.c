/* decode.c — the model's decode step (decode.h): buffers planned once for the largest step, the walk of forward.c and
 * the layers of layer_kda.c / layer_mla.c / layer_ffn.c in their decode mode, the embedding rows and the logits of
 * the rows to be sampled. Float32 only (the double build of this file is empty). docs/ENGINE.md "The step". */
#include "base/real.h"

#if !K3C_REAL_DOUBLE
#include "model/acts.h"
#include "model/decode.h"

#include <stdlib.h>
#include <string.h>

/* The step's buffers in backend memory. */
typedef struct {
    float *emb, *xn, *mid, *rot[2], *blk, *mixo; /* [n, D]; blk: completed blocks, NS × [n, D] */
    float *hsel, *hn;                            /* [max_out, D] */
    k3c_kda_acts kda;
    k3c_mla_acts mla;
    k3c_ffn_acts ffn;
    k3c_decode dec;
    k3c_decode_inputs in;
} step_bufs;

struct k3c_decode_step {
    k3c_model shell; /* the config the layer code reads, with no parameters (the weights are views) nor hooks */
    const k3c_weights *w;
    const k3c_backend_f32 *be;
    const k3c_dec_ops *ops;
    k3c_dec_dims dd;
    int idx[K3C_MAX_LAYERS]; /* layer l's index among the layers of its mixer kind */
    int64_t max_rows, max_out;
    step_bufs b;
    void *mem;  /* the backend block the buffers are carved from */
    void *host; /* the walk's per-layer tables (k3c_acts) */
    k3c_acts a;
};

static int max_sources(const k3c_config *c) {
    return c->attn_res_block > 0 ? (int)((c->num_layers + c->attn_res_block - 1) / c->attn_res_block) + 1 : 0;
}

static void plan(const k3c_decode_step *s, int64_t n, k3c_carver *cv, step_bufs *b) {
    const k3c_config *c = &s->w->cfg;
    const k3c_dec_dims *d = &s->dd;
    const k3c_dec_ops *op = s->ops;
    const int64_t D = c->hidden_size, P = d->H * d->dk, dk = d->dk, H = d->H, E = c->num_experts;
    const int64_t k = c->top_k > 0 ? c->top_k : 1, lat = c->latent_dim > 0 ? c->latent_dim : D;
    const int64_t S = c->num_shared_experts * c->moe_intermediate_size, If = c->intermediate_size;
    const int64_t wide = If > S ? If : S, ns = max_sources(c);
    int n_kda = 0, n_mla = 0;
    for (int l = 0; l < c->num_layers; l++) c->mixer[l] == K3C_MIXER_KDA ? n_kda++ : n_mla++;
    memset(b, 0, sizeof *b);
#define F(count) K3C_CARVE(cv, float, (count))
    b->emb = F(n * D), b->xn = F(n * D), b->mid = F(n * D), b->rot[0] = F(n * D), b->rot[1] = F(n * D);
    b->blk = F((ns ? ns : 1) * n * D), b->mixo = F(n * D);
    if (n_kda) {
        k3c_kda_acts *a = &b->kda;
        a->qh = F(n * P), a->kh = F(n * P), a->vh = F(n * P), a->qn = F(n * P), a->kn = F(n * P), a->vc = F(n * P);
        a->blog = F(n * H), a->beta = F(n * H), a->fa = F(n * dk), a->z = F(n * P), a->g = F(n * P);
        a->o = F(n * P), a->ga = F(n * dk), a->gl = F(n * P), a->y1 = F(n * P);
        b->dec.kda_ws = k3c_carve(cv, op->kda_workspace(d, n));
    }
    if (n_mla) {
        k3c_mla_acts *a = &b->mla;
        const int64_t Hm = d->Hm, dqk = c->qk_nope_dim + c->qk_rope_dim, dv = c->v_head_dim, lw = d->rkv + d->rope;
        const int64_t r = c->q_lora_rank > 0 ? c->q_lora_rank : 1;
        a->qa = F(n * r), a->qan = F(n * r), a->q = F(n * Hm * dqk), a->kva = F(n * lw), a->c = F(n * d->rkv);
        a->cn = a->cnk = F(n * d->rkv), a->o = F(n * Hm * dv), a->gl = a->og = F(n * Hm * dv);
        b->dec.qlat = F(Hm * n * lw), b->dec.olat = F(Hm * n * d->rkv);
        b->dec.att_ws = k3c_carve(cv, op->attend_workspace(d));
        const k3c_qmat uk = {K3C_QMAT_F32, d->rkv, c->qk_nope_dim, NULL, NULL}, uv = {K3C_QMAT_F32, dv, d->rkv, NULL, NULL};
        const size_t hk = op->heads_workspace(&uk, n), hv = op->heads_workspace(&uv, n);
        b->dec.heads_ws = k3c_carve(cv, hk > hv ? hk : hv);
    }
    if (E > 0) {
        k3c_ffn_acts *a = &b->ffn;
        const k3c_dec_moe m = {NULL, NULL, NULL, E, k, lat, c->moe_intermediate_size, k3c_glu_act_from_config(c)};
        a->logits = F(n * E), a->topw = F(n * k), a->zin = F(n * lat), a->u = F(n * lat), a->un = F(n * lat);
        a->ids = K3C_CARVE(cv, int32_t, n * k);
        a->ys = F(n * D);
        b->dec.moe_ws = k3c_carve(cv, op->moe_workspace(&m, n));
    }
    b->dec.mlp_gate = F(n * wide), b->dec.mlp_up = F(n * wide), b->dec.mlp_h = F(n * wide);
    b->hsel = F(s->max_out * D), b->hn = F(s->max_out * D);
    b->in.logits = F(s->max_out * c->vocab_size), b->in.img = F(n * D);
    b->in.tok = K3C_CARVE(cv, int32_t, n), b->in.row_seg = K3C_CARVE(cv, int32_t, n);
    b->in.segs = K3C_CARVE(cv, k3c_dec_seg, n);
#undef F
}

/* The walk's tables: every layer's stream tensors, norms and mixes on the step's few buffers. pmid[l] is one buffer,
 * pend[l] alternates between two, except the last layer of a block, whose output is a source of every later mix and
 * keeps a buffer of its own (docs/MODEL.md §5.3): no stream tensor is overwritten while a later op still reads it. */
static int tables(k3c_decode_step *s, k3c_err *err) {
    const k3c_config *c = &s->w->cfg;
    const int L = (int)c->num_layers, NS = max_sources(c), S = (int)c->attn_res_block;
    k3c_acts *a = &s->a;
    /* pointer-sized entries first, the int arrays last: every table stays aligned */
    const size_t per = 6 * sizeof(real *) + 2 * sizeof(const real *) + 2 * sizeof(k3c_mix) + sizeof(k3c_kda_acts) +
                       sizeof(k3c_mla_acts) + sizeof(k3c_ffn_acts) + sizeof(int) + 2 * (size_t)NS * sizeof(int);
    char *h = s->host = calloc(1, (size_t)L * per + (size_t)NS * sizeof(int) + 64);
    if (!h) return k3c_errf(err, K3C_ENOMEM, "decode step: out of memory");
#define TAKE(field, type) (a->field = (type *)(void *)h, h += sizeof(type) * (size_t)L)
    TAKE(pmid, real *), TAKE(pend, real *), TAKE(axn, real *), TAKE(arstd, real *), TAKE(mxn, real *);
    TAKE(mrstd, real *), TAKE(ain, const real *), TAKE(min, const real *), TAKE(amix, k3c_mix), TAKE(mmix, k3c_mix);
    TAKE(kda, k3c_kda_acts), TAKE(mla, k3c_mla_acts), TAKE(ffn, k3c_ffn_acts), TAKE(boundary, int);
#undef TAKE
    const int64_t nD = s->max_rows * c->hidden_size;
    for (int l = 0; l < L; l++) {
        const int keep = S > 0 && (l + 1) % S == 0 && l + 1 < L; /* the block's output: a completed source */
        a->pmid[l] = s->b.mid;
        a->pend[l] = keep ? s->b.blk + (size_t)((l + 1) / S - 1) * (size_t)nD : s->b.rot[l % 2];
        a->axn[l] = a->mxn[l] = s->b.xn;
        a->amix[l] = (k3c_mix){0, (int *)(void *)h, NULL, s->b.mixo}, h += sizeof(int) * (size_t)NS;
        a->mmix[l] = (k3c_mix){0, (int *)(void *)h, NULL, s->b.mixo}, h += sizeof(int) * (size_t)NS;
        a->kda[l] = s->b.kda, a->mla[l] = s->b.mla, a->ffn[l] = s->b.ffn;
    }
    a->fmix = (k3c_mix){0, (int *)(void *)h, NULL, s->b.mixo};
    a->emb = s->b.emb;
    a->l0 = 0, a->l1 = L;
    return K3C_OK;
}

int k3c_decode_step_init(const k3c_weights *w, int64_t max_rows, int64_t max_out, k3c_decode_step **out,
                         k3c_err *err) {
    *out = NULL;
    const k3c_backend_f32 *be = w->be ? w->be : k3c_backend_cpu_f32();
    const k3c_config *c = &w->cfg;
    if (!be->decode) return k3c_errf(err, K3C_EUNSUPPORTED, "decode step: backend '%s' has no engine ops", be->name);
    if (max_rows < 1 || max_out < 1 || max_out > max_rows)
        return k3c_errf(err, K3C_EINVAL, "decode step: %lld rows with %lld logits rows", (long long)max_rows,
                        (long long)max_out);
    if (max_sources(c) > K3C_ATTNRES_MAX_SOURCES)
        return k3c_errf(err, K3C_EUNSUPPORTED, "decode step: too many AttnRes blocks");
    k3c_decode_step *s = calloc(1, sizeof *s);
    if (!s) return k3c_errf(err, K3C_ENOMEM, "decode step: out of memory");
    s->w = w, s->be = be, s->ops = be->decode, s->max_rows = max_rows, s->max_out = max_out;
    s->shell.cfg = *c, s->shell.precision = K3C_F32, s->shell.backend = w->be;
    int n_kda = 0, n_mla = 0;
    for (int l = 0; l < c->num_layers; l++) s->idx[l] = c->mixer[l] == K3C_MIXER_KDA ? n_kda++ : n_mla++;
    const int64_t P = c->kda_heads * c->kda_head_dim;
    s->dd = (k3c_dec_dims){c->kda_heads, c->kda_head_dim, c->conv_kernel,
                           n_kda ? c->kda_heads * c->kda_head_dim * c->kda_head_dim + 3 * P * (c->conv_kernel - 1) : 0,
                           c->mla_heads, c->kv_lora_rank, c->qk_rope_dim};
    k3c_carver m = k3c_carver_measure(64);
    plan(s, max_rows, &m, &s->b);
    int rc = (s->mem = be->alloc(m.off)) ? K3C_OK
                                         : k3c_errf(err, K3C_ENOMEM, "decode step: buffers for %lld rows (%zu bytes, "
                                                                     "%s memory)", (long long)max_rows, m.off, be->name);
    if (!rc) {
        k3c_carver cv = k3c_carver_at(s->mem, m.off, 64);
        plan(s, max_rows, &cv, &s->b);
        rc = tables(s, err);
    }
    if (rc) {
        k3c_decode_step_free(s);
        return rc;
    }
    *out = s;
    return K3C_OK;
}

void k3c_decode_step_free(k3c_decode_step *s) {
    if (!s) return;
    if (s->mem) s->be->free(s->mem);
    free(s->host);
    free(s);
}

const k3c_decode_inputs *k3c_decode_step_inputs(const k3c_decode_step *s) { return &s->b.in; }
const k3c_dec_dims *k3c_decode_step_dims(const k3c_decode_step *s) { return &s->dd; }
const k3c_dec_ops *k3c_decode_step_ops(const k3c_decode_step *s) { return s->ops; }

int k3c_decode_step_run(k3c_decode_step *s, const k3c_dec_batch *b, const int64_t *img_row, int64_t n_img,
                        const int64_t *out_rows, int64_t n_out, k3c_err *err) {
    const k3c_weights *w = s->w;
    const k3c_config *c = &w->cfg;
    const k3c_backend_f32 *be = s->be;
    const int64_t D = c->hidden_size, n = b->n;
    step_bufs *sb = &s->b;
    CHECK_RC(s->ops->embed(&w->embed, sb->in.tok, n, sb->emb, err));
    for (int64_t j = 0; j < n_img; j++) /* image rows replace their placeholders' token embeddings */
        CHECK_RC(be->copy2d(1, D, sb->in.img + j * D, D, sb->emb + img_row[j] * D, D, 0, err));
    sb->dec.ops = s->ops, sb->dec.batch = b, sb->dec.dims = &s->dd, sb->dec.idx = s->idx;
    k3c_acts *a = &s->a;
    a->T = n;
    a->st = (k3c_step){.m = &s->shell, .be = be, .T = n, .n_docs = 1, .views = w, .dec = &sb->dec};
    CHECK_RC(k3c_acts_run_layers(a, err));
    if (n_out == 0) return K3C_OK; /* a prompt chunk that samples nothing */
    const float *h = a->hfin;      /* every row's logits in row order: no gather */
    if (out_rows) {
        for (int64_t i = 0; i < n_out; i++)
            CHECK_RC(be->copy2d(1, D, h + out_rows[i] * D, D, sb->hsel + i * D, D, 0, err));
        h = sb->hsel;
    }
    k3c_rmsnorm_sizes fs = {n_out, D, c->rms_norm_eps};
    CHECK_RC(be->rmsnorm_fwd(&fs, h, w->final_norm, sb->hn, NULL, err));
    return k3c_proj1(&a->st, n_out, &w->lm_head, D, c->vocab_size, sb->hn, sb->in.logits, err);
}

#else
typedef int k3c_decode_step_double_build_is_empty;
#endif
