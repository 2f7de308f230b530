/* pp.c — pipeline parallelism: contiguous stages of layers (what each stage's model holds), micro-batches at document
 * boundaries under a 1F1B schedule, the Block AttnRes boundary state sent forward and its gradients back, stage-level
 * recomputation. Spec: docs/PARALLEL.md "Pipeline parallelism", docs/MODEL.md §5.3 (the state a boundary carries). */
#include "parallel/pp.h"

#include "base/check.h"
#include "parallel/dp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The first table entry of layer l (the table is ordered embedding, layers, head: entries of one layer together). */
static int first_entry(const k3c_param_table *t, int l) {
    int i = 0;
    while (i < t->n && t->p[i].layer != l) i++;
    return i;
}

void k3c_pp_layers(const k3c_config *cfg, int stage, int stages, int *l0, int *l1) {
    int64_t first, count; /* the split k3c plan sizes (one formula for both) */
    k3c_stage_layers(cfg->num_layers, stages, stage, &first, &count);
    *l0 = (int)first;
    *l1 = (int)(first + count);
}

int k3c_pp_init(k3c_pp *pp, k3c_comm *comm, const k3c_config *cfg, const k3c_param_table *t, int micro,
                const k3c_backend_f32 *be, k3c_err *err) {
    memset(pp, 0, sizeof *pp);
    const int L = (int)cfg->num_layers, P = comm->size;
    CHECK_RC(k3c_comm_check_memory(comm, be->name, "pipeline parallelism", err));
    if (P > L || micro < 1)
        return k3c_errf(err, K3C_EINVAL, "pipeline parallelism: %d stages for %d layers, %d micro-batches", P, L,
                        micro);
    pp->comm = comm;
    pp->be = be;
    CHECK_RC(k3c_comm_split(comm, 0, comm->rank, &pp->back, err));
    pp->stage = comm->rank;
    pp->stages = P;
    k3c_pp_layers(cfg, pp->stage, P, &pp->l0, &pp->l1);
    if (t->res.layer0 != pp->l0 || t->res.layer1 != pp->l1)
        return k3c_errf(err, K3C_EINVAL,
                        "pipeline parallelism: stage %d runs layers [%d, %d) but its model holds [%d, %d)", pp->stage,
                        pp->l0, pp->l1, t->res.layer0, t->res.layer1);
    pp->e0 = pp->l0 == 0 ? 0 : first_entry(t, pp->l0);
    pp->e1 = pp->l1 == L ? t->n : first_entry(t, pp->l1);
    pp->micro = micro;
    int src[K3C_ATTNRES_MAX_SOURCES];
    pp->n_in = pp->l0 > 0 ? k3c_boundary_sources(cfg, pp->l0, src) : 0;
    pp->n_out = pp->l1 < L ? k3c_boundary_sources(cfg, pp->l1, src) : 0;
    pp->D = cfg->hidden_size;
    const int64_t smax_n = k3c_config_num_mla(cfg) ? cfg->num_layers * cfg->mla_heads : 1;
    pp->smax = be->alloc(sizeof(float) * (size_t)smax_n);
    pp->smax_host = malloc(2 * sizeof(float) * (size_t)smax_n);
    pp->req = calloc((size_t)(2 * micro), sizeof *pp->req);
    if (!pp->smax || !pp->smax_host || !pp->req) {
        k3c_pp_free(pp);
        return k3c_errf(err, K3C_ENOMEM, "pipeline parallelism: out of memory");
    }
    return K3C_OK;
}

void k3c_pp_free(k3c_pp *pp) {
    if (pp->buf) pp->be->free(pp->buf);
    if (pp->smax) pp->be->free(pp->smax);
    free(pp->cu);
    free(pp->smax_host);
    free(pp->req);
    k3c_comm_free(pp->back);
    memset(pp, 0, sizeof *pp);
}

/* dst ← src, n floats of backend memory (the boundary tensors into the step's buffers and out of them). */
static int copy_be(const k3c_pp *pp, float *dst, const float *src, int64_t n, k3c_err *err) {
    return pp->be->copy2d(1, n, src, n, dst, n, 0, err);
}

/* The caller's S_max ← the maximum of it and this micro-batch's over the stage's MLA heads (i = 0: this one's), on
 * host copies (the backend's memory may be a device's). */
static int smax_fold(const k3c_pp *pp, const k3c_config *c, float *full, int i, k3c_err *err) {
    const int64_t H = c->mla_heads, n = c->num_layers * H;
    float *v = pp->smax_host, *s = v + n;
    CHECK_RC(pp->be->download(v, pp->smax, sizeof(float) * (size_t)n, err));
    CHECK_RC(pp->be->download(s, full, sizeof(float) * (size_t)n, err));
    for (int l = pp->l0; l < pp->l1; l++)
        for (int64_t h = 0; c->mixer[l] == K3C_MIXER_MLA && h < H; h++)
            s[l * H + h] = i == 0 || v[l * H + h] > s[l * H + h] ? v[l * H + h] : s[l * H + h];
    return pp->be->upload(full, s, sizeof(float) * (size_t)n, err);
}

/* One step in progress: the micro-batches and where their boundary tensors live. */
typedef struct {
    k3c_pp *pp;
    k3c_model *m;
    k3c_arena *arena;
    k3c_model_batch *mb; /* [n] */
    int64_t *off, *T;    /* [n] first token of each among this rank's tokens, and how many it runs (with CP: its
                            range of the micro-batch) */
    int cut;             /* 1: context parallelism cuts each micro-batch into ranges (pp->cp with m->context) */
    int n;
    float *in, *out, *dout, *din; /* [n_in or n_out, T, D] regions of pp->buf, micro-batch i at its offset */
    k3c_step_stats *full, view;   /* the caller's statistics, and micro-batch i's view of them */
    k3c_acts *acts;
    int live; /* the micro-batch whose activations the arena holds (-1: none) */
    double loss;
} pipe;

static float *region(const pipe *p, float *base, int nt, int i) { return base + (size_t)nt * p->off[i] * p->pp->D; }

/* Micro-batch i's statistics land at its tokens' rows of the caller's buffers (QB sees the batch in token order). */
static void set_view(pipe *p, int i) {
    if (!p->full) return;
    const k3c_config *c = &p->m->cfg;
    p->view = *p->full;
    p->view.cap_T = p->full->cap_T - p->off[i];
    for (int l = p->pp->l0; l < p->pp->l1; l++)
        if (c->ffn[l] == K3C_FFN_MOE) {
            k3c_route_stats *r = &p->view.route[l];
            r->topk_ids += p->off[i] * c->top_k;
            r->logits += p->off[i] * c->num_experts;
            r->cutoff += p->off[i];
        }
    if (p->full->smax) p->view.smax = p->pp->smax;
    p->m->stats = &p->view;
}

/* Micro-batch i's forward (before its backward too, unless the arena still holds it): with CP its range is set for
 * the exchange first, which the backward that follows also reads. */
static int run_forward(pipe *p, int i, k3c_err *err) {
    k3c_pp *pp = p->pp;
    float *in[K3C_ATTNRES_MAX_SOURCES];
    int64_t TD = p->T[i] * pp->D;
    for (int k = 0; k < pp->n_in; k++) in[k] = region(p, p->in, pp->n_in, i) + k * TD;
    set_view(p, i);
    k3c_arena_reset(p->arena, 0);
    double loss;
    p->live = -1;
    k3c_model_batch b = p->mb[i];
    if (p->cut) CHECK_RC(k3c_cp_range(pp->cp, &b, err));
    CHECK_RC(k3c_model_forward_range_f32(p->m, &b, pp->l0, pp->l1, in, p->arena, &p->acts, &loss, err));
    p->live = i;
    p->loss += pp->l1 == (int)p->m->cfg.num_layers ? loss : 0;
    return K3C_OK;
}

/* Forward of micro-batch i: receive its boundary, run the stage, send the next boundary on (asynchronously). */
static int forward(pipe *p, int i, k3c_err *err) {
    k3c_pp *pp = p->pp;
    int64_t TD = p->T[i] * pp->D;
    if (pp->n_in)
        CHECK_RC(k3c_comm_recv(pp->comm, region(p, p->in, pp->n_in, i), pp->n_in * TD, K3C_F32, pp->stage - 1, 2 * i,
                               NULL, err));
    CHECK_RC(run_forward(p, i, err));
    if (p->full && p->full->smax) /* S_max of the batch: the maximum over its micro-batches */
        CHECK_RC(smax_fold(pp, &p->m->cfg, p->full->smax, i, err));
    if (!pp->n_out) return K3C_OK;
    float *x[K3C_ATTNRES_MAX_SOURCES], *o = region(p, p->out, pp->n_out, i);
    k3c_acts_boundary_f32(p->acts, 0, x);
    for (int k = 0; k < pp->n_out; k++) CHECK_RC(copy_be(pp, o + k * TD, x[k], TD, err));
    return k3c_comm_send(pp->comm, o, pp->n_out * TD, K3C_F32, pp->stage + 1, 2 * i, &pp->req[i], err);
}

/* Backward of micro-batch i: its forward again unless the arena still holds it (the last stage runs F and B back to
 * back), the later stages' boundary gradients in, this stage's boundary gradients back. */
static int backward(pipe *p, int i, k3c_err *err) {
    k3c_pp *pp = p->pp;
    int64_t TD = p->T[i] * pp->D;
    if (p->live != i) CHECK_RC(run_forward(p, i, err));
    const float *dout[K3C_ATTNRES_MAX_SOURCES];
    float *d = region(p, p->dout, pp->n_out, i);
    if (pp->n_out) CHECK_RC(k3c_comm_recv(pp->back, d, pp->n_out * TD, K3C_F32, pp->stage + 1, 2 * i + 1, NULL, err));
    for (int k = 0; k < pp->n_out; k++) dout[k] = d + k * TD;
    /* the micro-batches' gradients add up: only the last backward completes a layer's (m->grads, k3c_dp_grads_begin) */
    const k3c_grad_hook *hook = p->m->grads;
    if (i + 1 < p->n) p->m->grads = NULL;
    int e = k3c_model_backward_range_f32(p->m, p->acts, 1.0, pp->n_out ? dout : NULL, err);
    p->m->grads = hook;
    CHECK_RC(e);
    p->live = -1; /* the backward's buffers overwrote the arena's tail */
    if (!pp->n_in) return K3C_OK;
    float *x[K3C_ATTNRES_MAX_SOURCES], *o = region(p, p->din, pp->n_in, i);
    k3c_acts_boundary_f32(p->acts, 1, x);
    for (int k = 0; k < pp->n_in; k++) CHECK_RC(copy_be(pp, o + k * TD, x[k], TD, err));
    return k3c_comm_send(pp->back, o, pp->n_in * TD, K3C_F32, pp->stage - 1, 2 * i + 1, &pp->req[pp->micro + i], err);
}

/* 1F1B: stage s runs stages − 1 − s forwards ahead, then alternates one forward and one backward, then drains. */
static int schedule(pipe *p, int backward_too, k3c_err *err) {
    const k3c_pp *pp = p->pp;
    int warm = pp->stages - 1 - pp->stage, f = 0, b = 0;
    if (!backward_too) warm = p->n;
    for (; f < p->n && f < warm; f++) CHECK_RC(forward(p, f, err));
    for (; f < p->n; f++, b++) {
        CHECK_RC(forward(p, f, err));
        CHECK_RC(backward(p, b, err));
    }
    for (; backward_too && b < p->n; b++) CHECK_RC(backward(p, b, err));
    return K3C_OK;
}

/* The micro-batches of b (consecutive whole document pieces) and the step's boundary buffers. */
static int plan(pipe *p, const k3c_model_batch *b, int n, k3c_err *err) {
    k3c_pp *pp = p->pp;
    int nd = b->n_docs;
    if (nd < n)
        return k3c_errf(err, K3C_EINVAL,
                        "pipeline parallelism: the batch has %d document pieces for %d micro-batches (each needs a "
                        "whole piece: lower the stage's seq_len or raise tokens_per_step)",
                        nd, n);
    if (b->n_embeds)
        return k3c_errf(err, K3C_EINVAL,
                        "pipeline parallelism: input-embedding overrides (image rows) are not split yet");
    if (b->weight)
        return k3c_errf(err, K3C_EINVAL, "pipeline parallelism: per-position loss weights are not split yet");
    double norm = b->loss_norm;
    if (!(norm > 0)) {
        int64_t counted = 0;
        for (int64_t t = 0; t < b->T; t++) counted += b->targets[t] >= 0;
        norm = (double)counted;
    }
    size_t need = (size_t)b->T * (size_t)pp->D * (size_t)(2 * pp->n_in + 2 * pp->n_out) + 1;
    if (need > pp->buf_cap) { /* the model reads and writes the boundary tensors in place: backend memory */
        if (pp->buf) pp->be->free(pp->buf);
        pp->buf = pp->be->alloc(sizeof(float) * need);
        pp->buf_cap = pp->buf ? need : 0;
    }
    if (nd + n > pp->cu_cap) {
        free(pp->cu);
        pp->cu = malloc(sizeof(int32_t) * (size_t)(nd + n));
        pp->cu_cap = pp->cu ? nd + n : 0;
    }
    p->mb = malloc(sizeof *p->mb * (size_t)n);
    p->off = malloc(sizeof *p->off * 2 * (size_t)n);
    if (!pp->buf || !pp->cu || !p->mb || !p->off) return k3c_errf(err, K3C_ENOMEM, "pipeline parallelism: buffers");
    p->T = p->off + n;
    p->in = pp->buf;
    p->din = p->in + (size_t)b->T * pp->D * pp->n_in;
    p->out = p->din + (size_t)b->T * pp->D * pp->n_in;
    p->dout = p->out + (size_t)b->T * pp->D * pp->n_out;
    int32_t *cu = pp->cu;
    for (int i = 0, at = 0; i < n; i++) {
        int d0, d1;
        k3c_batch_part(b->cu_seqlens, nd, b->T, i, n, &d0, &d1);
        int32_t t0 = b->cu_seqlens[d0];
        for (int d = d0; d <= d1; d++) cu[d - d0] = b->cu_seqlens[d] - t0;
        p->off[i] = at;
        p->T[i] = p->cut ? k3c_cp_range_len(pp->cp, b->cu_seqlens[d1] - t0) : b->cu_seqlens[d1] - t0;
        if (p->cut) { /* every micro-batch's ranges checked before the first message */
            int e = k3c_cp_check_len(pp->cp, b->cu_seqlens[d1] - t0, err);
            if (e) return err ? k3c_err_wrap(err, "pipeline micro-batch %d of %d", i, n) : e;
        }
        at += (int)p->T[i];
        p->mb[i] = (k3c_model_batch){.T = b->cu_seqlens[d1] - t0,
                                     .n_docs = d1 - d0,
                                     .ids = b->ids + t0,
                                     .cu_seqlens = cu,
                                     .targets = b->targets + t0,
                                     .loss_norm = norm};
        cu += d1 - d0 + 1;
    }
    p->n = n;
    return K3C_OK;
}

int k3c_pp_step(k3c_pp *pp, k3c_model *m, const k3c_model_batch *b, k3c_arena *arena, int backward, double *loss,
                k3c_err *err) {
    if (!b->targets || !b->cu_seqlens)
        return k3c_errf(err, K3C_EINVAL, "pipeline parallelism: the batch needs explicit targets and cu_seqlens");
    pipe p = {.pp = pp, .m = m, .arena = arena, .full = m->stats, .live = -1, .cut = pp->cp && m->context};
    int e = plan(&p, b, backward ? pp->micro : 1, err);
    if (!e) e = schedule(&p, backward, err);
    for (int i = 0; i < 2 * pp->micro; i++) { /* every send completes before its buffer is reused */
        int e2 = k3c_comm_wait(pp->req[i], e ? NULL : err);
        pp->req[i] = NULL;
        if (!e) e = e2;
    }
    m->stats = p.full;
    pp->T_local = e ? 0 : p.off[p.n - 1] + p.T[p.n - 1];
    for (int l = pp->l0; !e && p.full && l < pp->l1; l++)
        if (m->cfg.ffn[l] == K3C_FFN_MOE) { /* the whole batch's statistics, at the caller's pointers */
            p.full->route[l].T = pp->T_local;
            p.full->route[l].k = p.view.route[l].k;
            p.full->route[l].n = p.view.route[l].n;
        }
    free(p.mb);
    free(p.off);
    if (e) return e; /* the loss: the last stage's sum of its micro-batches, to every stage */
    CHECK_RC(k3c_comm_allreduce(pp->comm, &p.loss, loss, 1, K3C_F64, K3C_COMM_SUM, NULL, err));
    return K3C_OK;
}
