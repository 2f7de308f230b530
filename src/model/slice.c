/* slice.c — sliced recompute: a recomputed layer's forward and backward run in slices of the sequence, as the ranks of
 * a context exchange (model.h k3c_context_exchange) that one process runs in turn, so the layer's working set is one
 * slice's. Spec: docs/TRAINING.md §1.4 "Sliced recompute"; docs/PARALLEL.md "Context parallelism" (the exchange). */
#include "base/check.h"
#include "base/real.h"
#include "model/acts.h"

#include <string.h>

int64_t k3c_slice_rows(const k3c_model *m, int l, int64_t T) {
    const int64_t S = m->recompute_slice;
    return m->recompute[l] && S > 0 && T > S ? S : T;
}

static int any_sliced(const k3c_model *m, int64_t T, int l0, int l1, int mixer) {
    for (int l = l0; l < l1; l++)
        if (k3c_slice_rows(m, l, T) < T && (mixer < 0 || m->cfg.mixer[l] == mixer)) return 1;
    return 0;
}

int k3c_slices_check(const k3c_model *m, int64_t T, k3c_err *err) {
    const int64_t S = m->recompute_slice, w1 = m->cfg.conv_kernel - 1;
    if (S < 0) return k3c_errf(err, K3C_EINVAL, "recompute_slice = %lld (tokens a slice, 0 = off)", (long long)S);
    if (!any_sliced(m, T, 0, (int)m->cfg.num_layers, -1)) return K3C_OK;
    if (S < w1)
        return k3c_errf(err, K3C_EINVAL, "recompute_slice = %lld: a slice must hold the short conv's tail of %lld",
                        (long long)S, (long long)w1);
    const char *with = m->context              ? "context parallelism"
                       : m->tp                 ? "tensor parallelism"
                       : m->experts            ? "expert parallelism"
                       : m->aux_loss_alpha > 0 ? "the auxiliary balancing loss (a function of the whole batch's routes)"
                                               : NULL;
    return with ? k3c_errf(err, K3C_EUNSUPPORTED, "recompute_slice = %lld with %s is not built", (long long)S, with)
                : K3C_OK;
}

/* ---------------------------------------------------------------- the plan */

void k3c_slices_carve(const k3c_model *m, int64_t T, int n_docs, int l0, int l1, k3c_acts_carver *cv, k3c_acts *a) {
    if (!any_sliced(m, T, l0, l1, -1)) return;
    const k3c_config *c = &m->cfg;
    const int64_t S = m->recompute_slice, n = (T + S - 1) / S, nd = n_docs + 2;
    const int64_t st = c->kda_heads * c->kda_head_dim * c->kda_head_dim; /* a state, a conv's tail */
    const int64_t tl = c->kda_heads * c->kda_head_dim * (c->conv_kernel > 1 ? c->conv_kernel - 1 : 1);
    k3c_slices *sl = K3C_CARVE_HOST(cv, k3c_slices, 1);
    k3c_slice *s = K3C_CARVE_HOST(cv, k3c_slice, n);
    int32_t *host = K3C_CARVE_HOST(cv, int32_t, 3 * n * nd), *ops = K3C_CARVE_DEV(cv, int32_t, 3 * n * nd);
    real **h = K3C_CARVE_HOST(cv, real *, c->num_layers), **tail = K3C_CARVE_HOST(cv, real *, c->num_layers);
    real *dh = NULL, *dtail = NULL, *lat = NULL, *dlat = NULL;
    for (int l = l0; l < l1; l++) {
        real *hl = NULL, *tl_ = NULL;
        if (k3c_slice_rows(m, l, T) < T && c->mixer[l] == K3C_MIXER_KDA) {
            hl = K3C_CARVE_DEV(cv, real, (n + 1) * st);
            tl_ = K3C_CARVE_DEV(cv, real, (n + 1) * 3 * tl);
        }
        if (!k3c_acts_measuring(cv)) h[l] = hl, tail[l] = tl_;
    }
    if (any_sliced(m, T, l0, l1, K3C_MIXER_KDA)) {
        dh = K3C_CARVE_DEV(cv, real, (n + 1) * st);
        dtail = K3C_CARVE_DEV(cv, real, (n + 1) * 3 * tl);
    }
    if (any_sliced(m, T, l0, l1, K3C_MIXER_MLA)) {
        lat = K3C_CARVE_DEV(cv, real, T * (c->kv_lora_rank + c->qk_rope_dim));
        dlat = K3C_CARVE_DEV(cv, real, T * (c->kv_lora_rank + c->qk_rope_dim));
    }
    if (k3c_acts_measuring(cv)) return;
    *sl = (k3c_slices){.n = (int)n,
                       .S = S,
                       .s = s,
                       .h = h,
                       .dh = dh,
                       .tail = tail,
                       .dtail = dtail,
                       .lat = lat,
                       .dlat = dlat,
                       .state_elems = st,
                       .tail_elems = tl};
    for (int64_t i = 0; i < n; i++)
        s[i] = (k3c_slice){.cu = host + 3 * i * nd,
                           .rest = host + (3 * i + 1) * nd,
                           .keys = host + (3 * i + 2) * nd,
                           .cu_ops = ops + 3 * i * nd,
                           .rest_ops = ops + (3 * i + 1) * nd,
                           .keys_ops = ops + (3 * i + 2) * nd};
    a->slices = sl;
}

/* Slice i's pieces of the documents (cu: the batch's offsets), as k3c_cp_range lays out a rank's range. */
static void slice_of(k3c_slice *sl, const int32_t *cu, int64_t s, int64_t e, int64_t T) {
    int f = 0, z = 0; /* the documents holding the slice's first and last token */
    while (cu[f + 1] <= s) f++;
    while (cu[z + 1] < e) z++;
    const int n = z - f + 1;
    sl->start = s, sl->len = e - s, sl->n_docs = n;
    sl->cu[0] = 0;
    for (int d = 1; d < n; d++) sl->cu[d] = (int32_t)(cu[f + d] - s);
    sl->cu[n] = (int32_t)(e - s);
    for (int d = 0; d < n; d++) sl->rest[d] = sl->cu[d + 1] - sl->cu[1];
    sl->prev_len = s - cu[f];
    sl->cont_prev = sl->prev_len > 0;
    sl->cont_next = e < T && cu[z + 1] > e;
    sl->n_docs_keys = z + 1;
}

static void exchange_init(k3c_slices *ss, int64_t T);

int k3c_slices_setup(k3c_acts *a, const int32_t *cu, k3c_err *err) {
    k3c_slices *ss = a->slices;
    const k3c_backend *be = a->st.be;
    const int32_t one[2] = {0, (int32_t)a->T};
    if (!cu) cu = one;
    ss->be = be;
    exchange_init(ss, a->T);
    for (int i = 0; i < ss->n; i++) { /* host tables live through the step: the uploads may read them later */
        k3c_slice *sl = &ss->s[i];
        const int64_t s = (int64_t)i * ss->S, e = s + ss->S < a->T ? s + ss->S : a->T;
        slice_of(sl, cu, s, e, a->T);
        const int z = sl->n_docs_keys - 1;
        for (int d = 0; d <= z; d++) sl->keys[d] = cu[d];
        sl->keys[z + 1] = (int32_t)e;
        CHECK_RC(be->upload(sl->cu_ops, sl->cu, sizeof(int32_t) * (size_t)(sl->n_docs + 1), err));
        CHECK_RC(be->upload(sl->rest_ops, sl->rest, sizeof(int32_t) * (size_t)sl->n_docs, err));
        CHECK_RC(be->upload(sl->keys_ops, sl->keys, sizeof(int32_t) * (size_t)(z + 2), err));
    }
    return K3C_OK;
}

/* ---------------------------------------------------------------- the exchange between consecutive slices */

/* Conv i's tail [C, W − 1] at boundary b (before slice b), or its gradient. */
static real *tail_at(const k3c_slices *ss, real *base, int b, int i) {
    return base + ((int64_t)b * 3 + i) * ss->tail_elems;
}

/* Entries j of a tail hold the input w1 − j tokens before the slice; those before its document's start are none. */
static int64_t tail_keep(const k3c_slice *next, int64_t w1) { return next->prev_len < w1 ? next->prev_len : w1; }

static int conv_tail(void *ctx, int l, int i, const void *xv, int64_t T, int64_t C, int W, void **state, k3c_err *err) {
    k3c_slices *ss = ctx;
    const k3c_slice *sl = &ss->s[ss->cur];
    const int64_t w1 = W - 1;
    const real *x = xv;
    *state = NULL;
    if (w1 <= 0) return K3C_OK;
    if (x && sl->cont_next) { /* the last w1 rows of x, transposed, for the next slice */
        real *t = tail_at(ss, ss->tail[l], ss->cur + 1, i);
        const int64_t keep = tail_keep(sl + 1, w1);
        CHECK_RC(ss->be->zero(t, C * w1, err));
        for (int64_t j = w1 - keep; j < w1; j++)
            CHECK_RC(ss->be->copy2d(C, 1, x + (T - w1 + j) * C, 1, t + j, w1, 0, err));
    }
    if (sl->cont_prev) *state = tail_at(ss, ss->tail[l], ss->cur, i);
    return K3C_OK;
}

static int conv_tail_bwd(void *ctx, int l, int i, const void *dstate, void *dxv, int64_t T, int64_t C, int W,
                         k3c_err *err) {
    k3c_slices *ss = ctx;
    const k3c_slice *sl = &ss->s[ss->cur];
    const int64_t w1 = W - 1;
    real *dx = dxv;
    if (w1 <= 0) return K3C_OK;
    if (sl->cont_prev && dstate)
        CHECK_RC(ss->be->copy2d(1, C * w1, dstate, 0, tail_at(ss, ss->dtail, ss->cur, i), 0, 0, err));
    if (sl->cont_next) { /* the next slice's tail gradient (its backward ran first) into dx's last w1 rows */
        const real *t = tail_at(ss, ss->dtail, ss->cur + 1, i);
        for (int64_t j = w1 - tail_keep(sl + 1, w1); j < w1; j++)
            CHECK_RC(ss->be->copy2d(C, 1, t + j, w1, dx + (T - w1 + j) * C, 1, 1, err));
    }
    return K3C_OK;
}

static void *kda_buf(void *ctx, int l, int which) {
    k3c_slices *ss = ctx;
    const k3c_slice *sl = &ss->s[ss->cur];
    const int prev = which == K3C_CP_H0 || which == K3C_CP_DH0;
    if (!(prev ? sl->cont_prev : sl->cont_next)) return NULL;
    real *base = which == K3C_CP_H0 || which == K3C_CP_HT ? ss->h[l] : ss->dh;
    return base + (int64_t)(ss->cur + !prev) * ss->state_elems;
}

/* The slices share the buffers: nothing moves. */
static int kda_pass(void *ctx, int l, int which, k3c_err *err) {
    (void)ctx;
    return K3C_OK;
}

static void *mla_buf(void *ctx, int l, int which) {
    k3c_slices *ss = ctx;
    return which ? ss->dlat : ss->lat;
}

static int mla_keep(void *ctx, int l, k3c_err *err) {
    (void)ctx;
    return K3C_OK;
}

/* Slice cur's range in the exchange's fields (what the layers read). */
static void exchange_at(k3c_slices *ss, int cur) {
    const k3c_slice *sl = &ss->s[cur];
    k3c_context_exchange *x = &ss->cx;
    ss->cur = cur;
    x->start = sl->start;
    x->first_len = sl->cu[1];
    x->cont_prev = sl->cont_prev;
    x->cont_next = sl->cont_next;
    x->cu_rest = sl->rest;
    x->cu_rest_ops = sl->rest_ops;
    x->T_keys = sl->start + sl->len;
    x->n_docs_keys = sl->n_docs_keys;
    x->cu_keys = sl->keys_ops;
}

static void exchange_init(k3c_slices *ss, int64_t T) {
    ss->cx = (k3c_context_exchange){.T_cap = T,
                                    .sliced = 1,
                                    .conv_tail = conv_tail,
                                    .conv_tail_bwd = conv_tail_bwd,
                                    .kda_buf = kda_buf,
                                    .kda_pass = kda_pass,
                                    .mla_buf = mla_buf,
                                    .mla_gather = mla_keep,
                                    .mla_scatter = mla_keep,
                                    .ctx = ss};
}

/* ---------------------------------------------------------------- the sliced layer */

/* a's tensors seen from slice i: the stream tensors (and their gradients) layer l reads and writes, offset to the
 * slice's rows; the layer's own buffers (one slice's rows) as they are. */
typedef struct {
    k3c_acts a;
    real *pmid[K3C_MAX_LAYERS], *pend[K3C_MAX_LAYERS], *dpmid[K3C_MAX_LAYERS], *dpend[K3C_MAX_LAYERS];
} slice_view;

static void view_at(const k3c_acts *a, int l, int i, int no_stats, slice_view *v) {
    const k3c_config *c = &a->st.m->cfg;
    const k3c_slice *sl = &a->slices->s[i];
    const int64_t off = sl->start * c->hidden_size;
    int src[K3C_ATTNRES_MAX_SOURCES + 2], n = k3c_boundary_sources(c, l, src);
    src[n++] = K3C_SRC_MID(l);
    src[n++] = K3C_SRC_END(l);
    v->a = *a;
    v->a.T = v->a.st.T = sl->len;
    v->a.st.n_docs = sl->n_docs;
    v->a.st.cu = sl->cu_ops;
    v->a.st.row0 = sl->start;
    v->a.st.no_stats = no_stats;
    v->a.emb = a->emb ? a->emb + off : NULL;
    v->a.demb = a->demb ? a->demb + off : NULL;
    for (int j = 0; j < n; j++) {
        if (src[j] == K3C_SRC_EMB) continue;
        const int k = src[j] / 2, end = src[j] % 2;
        real *x = (end ? a->pend : a->pmid)[k], *dx = a->dpend ? (end ? a->dpend : a->dpmid)[k] : NULL;
        (end ? v->pend : v->pmid)[k] = x + off;
        (end ? v->dpend : v->dpmid)[k] = dx ? dx + off : NULL;
    }
    v->a.pmid = v->pmid;
    v->a.pend = v->pend;
    v->a.dpmid = a->dpend ? v->dpmid : NULL;
    v->a.dpend = a->dpend ? v->dpend : NULL;
}

/* Runs f over the slices in the exchange (the model's context hook points at it meanwhile). */
typedef int (*slice_fn)(k3c_acts *v, int l, k3c_err *err);

static int fwd_all(k3c_acts *v, int l, k3c_err *err) { return k3c_acts_layer_fwd(v, l, 0, err); }
static int fwd_latent(k3c_acts *v, int l, k3c_err *err) { return k3c_acts_layer_fwd(v, l, 1, err); }
static int recompute_bwd(k3c_acts *v, int l, k3c_err *err) {
    k3c_slices *ss = v->slices;
    if (ss->dh) CHECK_RC(v->st.be->zero(ss->dh + (int64_t)ss->cur * ss->state_elems, ss->state_elems, err));
    CHECK_RC(k3c_acts_layer_fwd(v, l, 0, err));
    return k3c_acts_layer_bwd_rows(v, l, err);
}

static int over_slices(k3c_acts *a, int l, int i0, int i1, int step, int no_stats, slice_fn f, k3c_err *err) {
    k3c_model *m = a->st.m;
    const k3c_context_exchange *own = m->context; /* NULL: k3c_slices_check refuses context parallelism */
    slice_view v;
    int rc = K3C_OK;
    m->context = &a->slices->cx;
    for (int i = i0; i != i1 && !rc; i += step) {
        exchange_at(a->slices, i);
        view_at(a, l, i, no_stats, &v);
        rc = f(&v.a, l, err);
        if (rc)
            rc = k3c_err_wrap(err, "layer %d, slice %d of %d (tokens %lld..)", l, i, a->slices->n,
                              (long long)a->slices->s[i].start);
    }
    m->context = own;
    return rc;
}

int k3c_slice_layer_fwd(k3c_acts *a, int l, k3c_err *err) {
    return over_slices(a, l, 0, a->slices->n, 1, 0, fwd_all, err);
}

/* From the last slice back: each slice's forward again, then its backward, whose state, tail and latent gradients
 * are complete for the slice before it. A KDA layer's slices start from the states its first forward left; an MLA
 * layer's keys read the whole latent, whose rows before the last slice are made again first. */
int k3c_slice_layer_bwd(k3c_acts *a, int l, k3c_err *err) {
    k3c_slices *ss = a->slices;
    if (a->st.m->cfg.mixer[l] == K3C_MIXER_MLA) {
        const k3c_config *c = &a->st.m->cfg;
        CHECK_RC(over_slices(a, l, 0, ss->n - 1, 1, 1, fwd_latent, err));
        CHECK_RC(a->st.be->zero(ss->dlat, a->T * (c->kv_lora_rank + c->qk_rope_dim), err));
    }
    return over_slices(a, l, ss->n - 1, -1, -1, 1, recompute_bwd, err);
}
