/* forward.c — the whole-model forward: embedding → per layer (depth mix → RMSNorm → KDA/MLA; depth mix → RMSNorm → FFN)
 * → output mix → final RMSNorm → lm_head → cross-entropy; activations planned up front and carved from one arena.
 * Spec: docs/MODEL.md §1.1 (pre-norm residual), §5.3 (Block AttnRes control flow, K3). */
#include "base/check.h"
#include "base/real.h"
#include "model/acts.h"

#include <stdlib.h>
#include <string.h>

static real *src_ptr(const k3c_acts *a, int s) {
    return s == K3C_SRC_EMB ? a->emb : s % 2 ? a->pend[s / 2] : a->pmid[s / 2];
}

static size_t scratch_bytes(const k3c_model *m, int64_t T, int n_docs) {
    size_t need = 0;
    const k3c_config *c = &m->cfg;
    for (int l = 0; l < c->num_layers; l++) { /* a sliced layer's ops run over a slice; MLA's keys over all T */
        const int64_t Tl = k3c_slice_rows(m, l, T);
        size_t a = c->mixer[l] == K3C_MIXER_KDA ? k3c_kda_scratch(m, Tl, n_docs) : k3c_mla_scratch(m, T, n_docs);
        size_t f = k3c_ffn_scratch(m, l, Tl);
        if (a > need) need = a;
        if (f > need) need = f;
    }
    if (c->attn_res_block > 0) {
        k3c_attnres_sizes s = {
            T, c->hidden_size,
            K3C_ATTNRES_MAX_SOURCES < c->num_layers + 2 ? K3C_ATTNRES_MAX_SOURCES : c->num_layers + 2, c->rms_norm_eps};
        size_t r = k3c_model_backend(m)->attnres_workspace(&s);
        if (r > need) need = r;
    }
    return need;
}

/* Number of sources the mixes of a model can see at most: embedding + completed blocks + the partial sum. */
static int max_sources(const k3c_config *c) {
    return c->attn_res_block > 0 ? (int)((c->num_layers + c->attn_res_block - 1) / c->attn_res_block) + 1 : 0;
}

/* Carves every forward buffer of layers [l0, l1) (measure mode: only counts): the embedding when the range starts the
 * model, the head when it ends it; the tables stay indexed by layer. */
static void carve_forward(const k3c_model *m, int64_t T, int n_docs, int l0, int l1, k3c_acts_carver *cv, k3c_acts *a) {
    const k3c_config *c = &m->cfg;
    int L = (int)c->num_layers, NS = max_sources(c);
    int64_t D = c->hidden_size;
    a->ids = K3C_CARVE_DEV(cv, int32_t, T);
    a->cu = K3C_CARVE_DEV(cv, int32_t, n_docs + 1);
    a->targets = K3C_CARVE_DEV(cv, int32_t, T);
    a->weight = K3C_CARVE_DEV(cv, float, T);
    real *emb = l0 == 0 ? K3C_CARVE_DEV(cv, real, T * D) : NULL;
    if (!k3c_acts_measuring(cv)) a->emb = emb;
    a->pmid = K3C_CARVE_HOST(cv, real *, L);
    a->pend = K3C_CARVE_HOST(cv, real *, L);
    a->axn = K3C_CARVE_HOST(cv, real *, L);
    a->arstd = K3C_CARVE_HOST(cv, real *, L);
    a->mxn = K3C_CARVE_HOST(cv, real *, L);
    a->mrstd = K3C_CARVE_HOST(cv, real *, L);
    a->ain = K3C_CARVE_HOST(cv, const real *, L);
    a->min = K3C_CARVE_HOST(cv, const real *, L);
    a->amix = K3C_CARVE_HOST(cv, k3c_mix, L);
    a->mmix = K3C_CARVE_HOST(cv, k3c_mix, L);
    a->boundary = K3C_CARVE_HOST(cv, int, L);
    a->kda = K3C_CARVE_HOST(cv, k3c_kda_acts, L);
    a->mla = K3C_CARVE_HOST(cv, k3c_mla_acts, L);
    a->ffn = K3C_CARVE_HOST(cv, k3c_ffn_acts, L);
    k3c_kda_acts kd;
    k3c_mla_acts ml;
    k3c_ffn_acts ff;
    /* Layers that recompute share one set of activation buffers per kind (carved on first use), of one slice's rows
       when they run in slices. */
    struct {
        int have;
        real *ax, *ar, *mx, *mr;
        k3c_mix am, mm;
    } slot = {0};
    int slot_kda = -1, slot_mla = -1, slot_ffn[2] = {-1, -1};
    for (int l = l0; l < l1; l++) {
        real *pm = K3C_CARVE_DEV(cv, real, T * D), *pe = K3C_CARVE_DEV(cv, real, T * D);
        int rec = m->recompute[l], fresh = !rec || !slot.have;
        const int64_t Tl = k3c_slice_rows(m, l, T);
        k3c_attnres_sizes ms = {Tl, D, NS, c->rms_norm_eps};
        size_t mix_saved = NS ? k3c_model_backend(m)->attnres_saved_elems(&ms) : 0;
        real *ax = slot.ax, *ar = slot.ar, *mx = slot.mx, *mr = slot.mr;
        k3c_mix am = slot.am, mm = slot.mm;
        if (fresh) {
            ax = K3C_CARVE_DEV(cv, real, Tl * D);
            ar = K3C_CARVE_DEV(cv, real, Tl);
            mx = K3C_CARVE_DEV(cv, real, Tl * D);
            mr = K3C_CARVE_DEV(cv, real, Tl);
            memset(&am, 0, sizeof am);
            memset(&mm, 0, sizeof mm);
            if (NS) {
                am.src = K3C_CARVE_HOST(cv, int, NS);
                am.saved = K3C_CARVE_DEV(cv, real, mix_saved);
                am.out = K3C_CARVE_DEV(cv, real, Tl * D);
                mm.src = K3C_CARVE_HOST(cv, int, NS);
                mm.saved = K3C_CARVE_DEV(cv, real, mix_saved);
                mm.out = K3C_CARVE_DEV(cv, real, Tl * D);
            }
            if (rec) {
                slot.have = 1;
                slot.ax = ax;
                slot.ar = ar;
                slot.mx = mx;
                slot.mr = mr;
                slot.am = am;
                slot.mm = mm;
            }
        }
        int kda = c->mixer[l] == K3C_MIXER_KDA, moe = c->ffn[l] == K3C_FFN_MOE;
        int *sm = kda ? &slot_kda : &slot_mla, *sf = &slot_ffn[moe];
        if (!rec || *sm < 0) {
            if (kda)
                k3c_kda_alloc(m, Tl, cv, k3c_acts_measuring(cv) ? &kd : &a->kda[l]);
            else
                k3c_mla_alloc(m, Tl, T, cv, k3c_acts_measuring(cv) ? &ml : &a->mla[l]);
            if (rec) *sm = l;
        } else if (!k3c_acts_measuring(cv)) {
            if (kda)
                a->kda[l] = a->kda[*sm];
            else
                a->mla[l] = a->mla[*sm];
        }
        if (!rec || *sf < 0) {
            k3c_ffn_alloc(m, l, Tl, cv, k3c_acts_measuring(cv) ? &ff : &a->ffn[l]);
            if (rec) *sf = l;
        } else if (!k3c_acts_measuring(cv)) {
            a->ffn[l] = a->ffn[*sf];
        }
        if (!k3c_acts_measuring(cv)) {
            a->pmid[l] = pm;
            a->pend[l] = pe;
            a->axn[l] = ax;
            a->arstd[l] = ar;
            a->mxn[l] = mx;
            a->mrstd[l] = mr;
            a->amix[l] = am;
            a->mmix[l] = mm;
        }
    }
    k3c_mix fm = {0};
    k3c_attnres_sizes ms = {T, D, NS, c->rms_norm_eps};
    size_t mix_saved = NS ? k3c_model_backend(m)->attnres_saved_elems(&ms) : 0;
    real *hn = NULL, *rf = NULL, *lg = NULL, *lse = NULL;
    if (l1 == L) {
        if (NS) {
            fm.src = K3C_CARVE_HOST(cv, int, NS);
            fm.saved = K3C_CARVE_DEV(cv, real, mix_saved);
            fm.out = K3C_CARVE_DEV(cv, real, T * D);
        }
        hn = K3C_CARVE_DEV(cv, real, T * D);
        rf = K3C_CARVE_DEV(cv, real, T);
        /* this rank's vocabulary rows, of one chunk's tokens when the head runs in chunks */
        lg = K3C_CARVE_DEV(cv, real, k3c_head_rows(m, T) * (c->vocab_size / k3c_tp_size(m)));
        lse = K3C_CARVE_DEV(cv, real, T);
    }
    void *scr = k3c_carve(&cv->dev, scratch_bytes(m, T, n_docs));
    k3c_slices_carve(m, T, n_docs, l0, l1, cv, a);
    if (!k3c_acts_measuring(cv)) {
        a->fmix = fm;
        a->hn = hn;
        a->rfin = rf;
        a->logits = lg;
        a->lse = lse;
        a->st.scratch = scr;
    }
}

/* Backward buffers: gradients of every stream tensor of layers [l0, l1) and of the boundary before l0, two [T, D]
 * scratch rows, then per-layer scratch. */
static void carve_backward(const k3c_model *m, int64_t T, int l0, int l1, k3c_acts_carver *cv, k3c_acts *a) {
    const k3c_config *c = &m->cfg;
    int L = (int)c->num_layers, bsrc[K3C_ATTNRES_MAX_SOURCES], nb = k3c_boundary_sources(c, l0, bsrc);
    int64_t D = c->hidden_size;
    real *demb = l0 == 0 || bsrc[0] == K3C_SRC_EMB ? K3C_CARVE_DEV(cv, real, T * D) : NULL;
    a->dpmid = K3C_CARVE_HOST(cv, real *, L);
    a->dpend = K3C_CARVE_HOST(cv, real *, L);
    if (!k3c_acts_measuring(cv)) a->demb = demb;
    for (int i = 0; i < nb; i++) /* the boundary's stream tensors (their layers ran on another stage) */
        if (bsrc[i] != K3C_SRC_EMB) {
            real *y = K3C_CARVE_DEV(cv, real, T * D);
            if (!k3c_acts_measuring(cv)) a->dpend[bsrc[i] / 2] = y;
        }
    for (int l = l0; l < l1; l++) {
        real *x = K3C_CARVE_DEV(cv, real, T * D), *y = K3C_CARVE_DEV(cv, real, T * D);
        if (!k3c_acts_measuring(cv)) {
            a->dpmid[l] = x;
            a->dpend[l] = y;
        }
    }
    a->dxn = K3C_CARVE_DEV(cv, real, T * D);
    a->din = K3C_CARVE_DEV(cv, real, T * D);
}

static size_t layer_tmp_bytes(const k3c_model *m, int64_t T) {
    size_t need =
        sizeof(real) * (size_t)(k3c_head_rows(m, T) * (m->cfg.vocab_size / k3c_tp_size(m))) + 64; /* dlogits */
    for (int l = 0; l < m->cfg.num_layers; l++) {
        const int64_t Tl = k3c_slice_rows(m, l, T);
        size_t a = m->cfg.mixer[l] == K3C_MIXER_KDA ? k3c_kda_bwd_bytes(m, Tl) : k3c_mla_bwd_bytes(m, Tl, T);
        size_t f = k3c_ffn_bwd_bytes(m, l, Tl);
        if (a > need) need = a;
        if (f > need) need = f;
    }
    return need;
}

/* The host block of a step's bookkeeping (k3c_acts, pointer tables, per-layer structs): the host reads and writes
 * them, so they never live in the activation arena (backend memory). Reused by every forward of the model. */
static int ensure_meta(k3c_model *m, int64_t T, int n_docs, int l0, int l1, k3c_err *err) {
    k3c_acts_carver cv = k3c_acts_carver_measure();
    k3c_acts dummy;
    carve_forward(m, T, n_docs, l0, l1, &cv, &dummy);
    carve_backward(m, T, l0, l1, &cv, &dummy);
    const size_t need = cv.host.off + sizeof(k3c_acts) + 128;
    if (m->meta.cap < need) {
        k3c_arena_free(&m->meta);
        CHECK_RC(k3c_arena_init(&m->meta, need, err));
    }
    k3c_arena_reset(&m->meta, 0);
    return K3C_OK;
}

size_t k3c_model_plan_bytes_range(const k3c_model *m, int64_t T, int n_docs, int l0, int l1) {
    k3c_acts_carver cv = k3c_acts_carver_measure();
    k3c_acts dummy;
    cv.dev.off = sizeof(k3c_acts) + 64;
    carve_forward(m, T, n_docs, l0, l1, &cv, &dummy);
    carve_backward(m, T, l0, l1, &cv, &dummy);
    return cv.dev.off + layer_tmp_bytes(m, T) + 4096;
}

size_t k3c_model_plan_bytes(const k3c_model *m, int64_t T, int n_docs) {
    return k3c_model_plan_bytes_range(m, T, n_docs, 0, (int)m->cfg.num_layers);
}

/* h = Mix(sources) with the layer's (or the output's) pseudo-query and key norm. */
static int run_mix(const k3c_acts *a, k3c_mix *mx, const real *proj, const real *norm, k3c_err *err) {
    const k3c_config *c = &a->st.m->cfg;
    const real *v[K3C_ATTNRES_MAX_SOURCES];
    for (int i = 0; i < mx->n; i++) v[i] = src_ptr(a, mx->src[i]);
    k3c_attnres_sizes s = {a->T, c->hidden_size, mx->n, c->rms_norm_eps};
    int rc = a->st.be->attnres_fwd(&s, v, proj, norm, mx->out, mx->saved, err);
    return rc ? k3c_err_wrap(err, "AttnRes mix over %d sources", mx->n) : K3C_OK;
}

static void set_sources(k3c_mix *mx, const int *R_, int nR, int P) {
    for (int i = 0; i < nR; i++) mx->src[i] = R_[i];
    mx->src[nR] = P;
    mx->n = nR + 1;
}

static void next_token_targets(const k3c_model_batch *b, int32_t *tg) {
    for (int d = 0; d < (b->cu_seqlens ? b->n_docs : 1); d++) {
        int64_t s = b->cu_seqlens ? b->cu_seqlens[d] : 0, e = b->cu_seqlens ? b->cu_seqlens[d + 1] : b->T;
        for (int64_t t = s; t < e; t++) tg[t] = t + 1 < e ? b->ids[t + 1] : -1;
    }
}

/* The batch into backend memory (the host cannot address it on a device): offsets, ids and targets (next-token
 * targets are built on the host first). */
static int upload_batch(const k3c_backend *be, const k3c_model_batch *b, int n_docs, k3c_acts *a, k3c_err *err) {
    const size_t T = (size_t)b->T;
    if (b->cu_seqlens) CHECK_RC(be->upload(a->cu, b->cu_seqlens, sizeof(int32_t) * (size_t)(n_docs + 1), err));
    CHECK_RC(be->upload(a->ids, b->ids, sizeof(int32_t) * T, err));
    if (b->weight)
        CHECK_RC(be->upload(a->weight, b->weight, sizeof(float) * T, err));
    else
        a->weight = NULL;
    if (b->targets) return be->upload(a->targets, b->targets, sizeof(int32_t) * T, err);
    int32_t *tg = malloc(sizeof(int32_t) * T);
    if (!tg) return k3c_errf(err, K3C_ENOMEM, "forward: out of memory");
    next_token_targets(b, tg);
    int rc = be->upload(a->targets, tg, sizeof(int32_t) * T, err);
    if (!rc) rc = be->sync(err); /* tg is freed next */
    free(tg);
    return rc;
}

/* Positions of the batch whose target counts (the cross-entropy's default divisor over the whole batch). */
static int64_t counted_targets(const k3c_model_batch *b) {
    int64_t n = 0;
    if (b->targets) {
        for (int64_t t = 0; t < b->T; t++) n += b->targets[t] >= 0;
        return n;
    }
    for (int d = 0; d < (b->cu_seqlens ? b->n_docs : 1); d++) {
        int64_t len = b->cu_seqlens ? b->cu_seqlens[d + 1] - b->cu_seqlens[d] : b->T;
        n += len > 0 ? len - 1 : 0; /* every position but the document's last */
    }
    return n;
}

/* Calls fn(a, i0, i1) for each run of consecutive positions embed_pos[i0..i1) (one run per image). */
#define FOR_EMBED_RUNS(n, pos, body)                                                                                   \
    for (int64_t i0 = 0, i1; i0 < (n); i0 = i1) {                                                                      \
        for (i1 = i0 + 1; i1 < (n) && (pos)[i1] == (pos)[i1 - 1] + 1; i1++) {}                                         \
        body;                                                                                                          \
    }

/* The token embeddings (tensor parallelism: the vocabulary-parallel lookup, summed over the group). */
static int embed_fwd(const k3c_model *m, const k3c_backend *be, int64_t T, k3c_acts *a, k3c_err *err) {
    const k3c_config *c = &m->cfg;
    const real *E = (const real *)m->w + m->table.glob.embed;
    if (!m->tp) {
        k3c_embedding_sizes es = {T, c->vocab_size, c->hidden_size};
        return be->embedding_fwd(&es, a->ids, E, a->emb, err);
    }
    CHECK_RC(be->sync(err));
    return m->tp->embed_fwd(m->tp->ctx, REAL_DTYPE, T, c->vocab_size, c->hidden_size, a->ids, E, a->emb, err);
}

/* Input-embedding overrides (image tokens): the given rows are copied over the token embeddings of their positions. */
static int embed_overrides(const k3c_backend *be, const k3c_model_batch *b, int64_t D, k3c_acts *a, k3c_err *err) {
    a->n_embeds = b->n_embeds;
    a->embed_pos = b->embed_pos;
    a->d_embeds = b->d_embeds;
    if (b->n_embeds <= 0) return K3C_OK;
    if (!b->embed_pos || !b->embeds) return k3c_errf(err, K3C_EINVAL, "forward: n_embeds set without positions / rows");
    for (int64_t i = 0; i < b->n_embeds; i++)
        if (b->embed_pos[i] < 0 || b->embed_pos[i] >= b->T || (i && b->embed_pos[i] <= b->embed_pos[i - 1]))
            return k3c_errf(err, K3C_EINVAL, "forward: embed_pos[%lld] = %d (must ascend strictly inside [0, %lld))",
                            (long long)i, b->embed_pos[i], (long long)b->T);
    const real *rows = b->embeds;
    const int32_t *pos = b->embed_pos;
    FOR_EMBED_RUNS(b->n_embeds, pos,
                   CHECK_RC(be->upload(a->emb + (int64_t)pos[i0] * D, rows + i0 * D,
                                       sizeof(real) * (size_t)((i1 - i0) * D), err)));
    return K3C_OK;
}

/* Backward side: their gradient to the caller, and nothing to the embedding table (the rows are zeroed in demb). */
int k3c_acts_embed_overrides_bwd(k3c_acts *a, int64_t D, k3c_err *err) {
    const k3c_backend *be = a->st.be;
    const int32_t *pos = a->embed_pos;
    real *d = a->d_embeds;
    FOR_EMBED_RUNS(a->n_embeds, pos, {
        const size_t bytes = sizeof(real) * (size_t)((i1 - i0) * D);
        if (d) CHECK_RC(be->download(d + i0 * D, a->demb + (int64_t)pos[i0] * D, bytes, err));
        CHECK_RC(be->zero(a->demb + (int64_t)pos[i0] * D, (i1 - i0) * D, err));
    });
    return K3C_OK;
}

/* The depth-mix sources before layer l (§5.3): completed blocks R and the running partial sum P (model.h). */
static void sources_before(const k3c_config *c, int l, int *Rsrc, int *nR, int *P) {
    *nR = k3c_boundary_sources(c, l, Rsrc) - 1;
    *P = Rsrc[*nR];
}

/* Layer l's forward: writes pmid[l], pend[l] and the layer's activations (latent_only, an MLA layer: up to its latent
 * rows, k3c_mla_layer_latent). */
static int layer_fwd(k3c_acts *a, int l, int latent_only, k3c_err *err) {
    k3c_step *st = &a->st;
    const k3c_model *m = st->m;
    const k3c_config *c = &m->cfg;
    const k3c_weights_layer *L = &st->views->layer[l];
    int64_t T = a->T, D = c->hidden_size, S = c->attn_res_block;
    int Rsrc[K3C_ATTNRES_MAX_SOURCES], nR, P;
    sources_before(c, l, Rsrc, &nR, &P);
    a->amix[l].n = a->mmix[l].n = 0;
    a->boundary[l] = S > 0 && l % S == 0;
    if (S > 0 && l > 0) {
        set_sources(&a->amix[l], Rsrc, nR, P);
        CHECK_RC(run_mix(a, &a->amix[l], L->attn_res_proj, L->attn_res_norm, err));
        a->ain[l] = a->amix[l].out;
    } else {
        a->ain[l] = src_ptr(a, P);
    }
    if (a->boundary[l]) Rsrc[nR++] = P;
    k3c_rmsnorm_sizes rs = {T, D, c->rms_norm_eps};
    CHECK_RC(st->be->rmsnorm_fwd(&rs, a->ain[l], L->input_norm, a->axn[l], a->arstd[l], err));
    if (latent_only) return k3c_mla_layer_latent(st, l, a->axn[l], &a->mla[l], err);
    if (c->mixer[l] == K3C_MIXER_KDA)
        CHECK_RC(k3c_kda_layer_fwd(st, l, a->axn[l], &a->kda[l], a->pmid[l], err));
    else
        CHECK_RC(k3c_mla_layer_fwd(st, l, a->axn[l], &a->mla[l], a->pmid[l], err));
    CHECK_RC(k3c_tp_sum(st, a->pmid[l], T * D, err)); /* tensor parallelism: o_proj's partial sums */
    if (!a->boundary[l]) CHECK_RC(st->be->add(T * D, src_ptr(a, P), a->pmid[l], err));
    if (S > 0) {
        set_sources(&a->mmix[l], Rsrc, nR, K3C_SRC_MID(l));
        CHECK_RC(run_mix(a, &a->mmix[l], L->mlp_res_proj, L->mlp_res_norm, err));
        a->min[l] = a->mmix[l].out;
    } else {
        a->min[l] = a->pmid[l];
    }
    CHECK_RC(st->be->rmsnorm_fwd(&rs, a->min[l], L->post_norm, a->mxn[l], a->mrstd[l], err));
    CHECK_RC(k3c_ffn_layer_fwd(st, l, a->mxn[l], &a->ffn[l], a->pend[l], err));
    CHECK_RC(st->be->add(T * D, a->pmid[l], a->pend[l], err));
    return K3C_OK;
}

int k3c_acts_run_layers(k3c_acts *a, k3c_err *err) {
    const k3c_model *m = a->st.m;
    const k3c_config *c = &m->cfg;
    int L = (int)c->num_layers;
    for (int l = a->l0; l < a->l1; l++)
        CHECK_RC(a->slices && k3c_slice_rows(m, l, a->T) < a->T ? k3c_slice_layer_fwd(a, l, err)
                                                                : layer_fwd(a, l, 0, err));
    a->fmix.n = 0;
    if (a->l1 < L) return K3C_OK; /* the head runs on the range that ends the model */
    if (c->attn_res_block > 0) {
        int Rsrc[K3C_ATTNRES_MAX_SOURCES], nR, P;
        sources_before(c, L, Rsrc, &nR, &P); /* the output mix sees the sources a layer L would */
        set_sources(&a->fmix, Rsrc, nR, P);
        CHECK_RC(run_mix(a, &a->fmix, a->st.views->out_res_proj, a->st.views->out_res_norm, err));
        a->hfin = a->fmix.out;
    } else {
        a->hfin = src_ptr(a, K3C_SRC_END(L - 1));
    }
    return K3C_OK;
}

/* The head: final norm → lm_head → cross-entropy (*loss may be NULL), whole or in chunks of tokens. */
static int head_fwd(k3c_model *m, const k3c_model_batch *b, k3c_acts *a, double *loss, k3c_err *err) {
    const k3c_config *c = &m->cfg;
    const k3c_backend *be = a->st.be;
    const k3c_weights *views = a->st.views;
    const int64_t T = a->T, D = c->hidden_size, V = c->vocab_size, Vl = V / k3c_tp_size(m); /* this rank's rows */
    k3c_rmsnorm_sizes rs = {T, D, c->rms_norm_eps};
    CHECK_RC(be->rmsnorm_fwd(&rs, a->hfin, views->final_norm, a->hn, a->rfin, err));
    double l = 0;
    a->loss_norm = b->loss_norm;
    if (k3c_head_rows(m, T) < T) { /* each chunk's loss takes the whole batch's divisor */
        if (!(b->loss_norm > 0)) a->loss_norm = (double)counted_targets(b);
        CHECK_RC(k3c_head_chunked_fwd(a, &l, err));
    } else {
        CHECK_RC(k3c_proj1(&a->st, T, &views->lm_head, D, Vl, a->hn, a->logits, err));
        k3c_xent_sizes xs = {T, V, b->loss_norm, a->weight};
        if (m->tp)
            CHECK_RC(m->tp->xent_fwd(m->tp->ctx, REAL_DTYPE, T, Vl, b->loss_norm, a->weight, a->logits, a->targets,
                                     a->lse, &l, err));
        else
            CHECK_RC(be->xent_fwd(&xs, a->logits, a->targets, NULL, a->lse, &l, NULL, err));
    }
    if (loss) *loss = l;
    return K3C_OK;
}

int k3c_model_forward_range(k3c_model *m, const k3c_model_batch *b, int l0, int l1, real *const *in, k3c_arena *arena,
                            k3c_acts **acts_out, double *loss, k3c_err *err) {
    const k3c_config *c = &m->cfg;
    int64_t T = b->T, D = c->hidden_size;
    if (loss) *loss = 0;
    if (l0 < 0 || l1 <= l0 || l1 > c->num_layers || (l0 > 0 && !in))
        return k3c_errf(err, K3C_EINVAL, "forward: layers [%d, %d) of %lld%s", l0, l1, (long long)c->num_layers,
                        l0 > 0 && !in ? " without the boundary tensors before them" : "");
    if (T <= 0) return k3c_errf(err, K3C_EINVAL, "forward: empty batch");
    if (b->cu_seqlens) { /* validate before anything is written through these offsets */
        if (b->n_docs < 1 || b->cu_seqlens[0] != 0 || b->cu_seqlens[b->n_docs] != T)
            return k3c_errf(err, K3C_EINVAL, "forward: cu_seqlens must run from 0 to T = %lld over n_docs = %d entries",
                            (long long)T, b->n_docs);
        for (int d = 0; d < b->n_docs; d++)
            if (b->cu_seqlens[d + 1] < b->cu_seqlens[d])
                return k3c_errf(err, K3C_EINVAL, "forward: cu_seqlens[%d] < cu_seqlens[%d]", d + 1, d);
    }
    if (max_sources(c) > K3C_ATTNRES_MAX_SOURCES)
        return k3c_errf(err, K3C_EUNSUPPORTED, "forward: too many AttnRes blocks");
    CHECK_RC(k3c_slices_check(m, T, err));
    CHECK_RC(k3c_head_check(m, T, err));
    const k3c_backend *be = k3c_model_backend(m);
    const k3c_weights *views = k3c_model_views(m, err);
    if (!views) return err->code;
    CHECK_RC(ensure_meta(m, T, b->n_docs, l0, l1, err));
    k3c_acts *a = k3c_arena_calloc(&m->meta, sizeof *a);
    k3c_acts_carver cv = k3c_acts_carver_at(arena, &m->meta);
    if (a) carve_forward(m, T, b->n_docs, l0, l1, &cv, a);
    if (!a || k3c_acts_carver_take(&cv, arena, &m->meta))
        return k3c_errf(err, K3C_ENOMEM, "forward: activation arena too small (%zu bytes; plan %zu)", arena->cap,
                        k3c_model_plan_bytes_range(m, T, b->n_docs, l0, l1));
    a->T = T;
    a->l0 = l0;
    a->l1 = l1;
    int n_docs = b->cu_seqlens ? b->n_docs : 1;
    a->st = (k3c_step){.m = m,
                       .be = be,
                       .T = T,
                       .n_docs = n_docs,
                       .cu = b->cu_seqlens ? a->cu : NULL,
                       .scratch = a->st.scratch,
                       .w = m->w,
                       .g = m->g,
                       .views = views};
    CHECK_RC(upload_batch(be, b, n_docs, a, err));
    if (a->slices) CHECK_RC(k3c_slices_setup(a, b->cu_seqlens, err));
    if (l0 == 0) {
        CHECK_RC(embed_fwd(m, be, T, a, err));
        CHECK_RC(embed_overrides(be, b, D, a, err));
    } else { /* the boundary tensors stand for the stream tensors of the layers before l0, read in place */
        int bsrc[K3C_ATTNRES_MAX_SOURCES], nb = k3c_boundary_sources(c, l0, bsrc);
        for (int i = 0; i < nb; i++) *(bsrc[i] == K3C_SRC_EMB ? &a->emb : &a->pend[bsrc[i] / 2]) = in[i];
    }
    CHECK_RC(k3c_acts_run_layers(a, err));
    if (l1 == c->num_layers) CHECK_RC(head_fwd(m, b, a, loss, err));
    CHECK_RC(be->sync(err)); /* the loss (or the boundary tensors) are read next */
    a->tmp_mark = k3c_arena_mark(arena);
    a->meta_mark = k3c_arena_mark(&m->meta);
    a->arena = arena;
    *acts_out = a;
    return K3C_OK;
}

int k3c_model_forward(k3c_model *m, const k3c_model_batch *b, k3c_arena *arena, k3c_acts **acts_out, double *loss,
                      real **logits_out, k3c_err *err) {
    if (logits_out && k3c_head_rows(m, b->T) < b->T) /* before anything runs */
        return k3c_errf(err, K3C_EUNSUPPORTED,
                        "forward: logits_out with head_chunk = %lld < T = %lld (the head keeps one chunk's logits; "
                        "head_chunk 0 keeps them all)",
                        (long long)m->head_chunk, (long long)b->T);
    CHECK_RC(k3c_model_forward_range(m, b, 0, (int)m->cfg.num_layers, NULL, arena, acts_out, loss, err));
    if (logits_out) *logits_out = (*acts_out)->logits;
    return K3C_OK;
}

int k3c_acts_boundary(const k3c_acts *a, int grads, real **x) {
    int bsrc[K3C_ATTNRES_MAX_SOURCES], nb = k3c_boundary_sources(&a->st.m->cfg, grads ? a->l0 : a->l1, bsrc);
    for (int i = 0; i < nb; i++) {
        int s = bsrc[i];
        x[i] = s == K3C_SRC_EMB ? (grads ? a->demb : a->emb) : s % 2 ? (grads ? a->dpend : a->pend)[s / 2] : NULL;
    }
    return nb;
}

/* Exposed to backward.c (same precision). */
int k3c_acts_layer_fwd(k3c_acts *a, int l, int latent_only, k3c_err *err) { return layer_fwd(a, l, latent_only, err); }
void k3c_acts_carve_backward(const k3c_model *m, k3c_acts_carver *cv, k3c_acts *a) {
    carve_backward(m, a->T, a->l0, a->l1, cv, a);
}
real *k3c_acts_src(const k3c_acts *a, int s) { return src_ptr(a, s); }
