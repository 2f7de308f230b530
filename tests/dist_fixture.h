/* dist_fixture.h — what the parallel-training tests share (test_dist_dp.c on the CPU, nccl/dist_nccl.c on the GPU):
 * the global batch (packed documents of the tiny K3 model's vocabulary, a layout whose context-parallel ranges cross
 * documents in every way, the same documents reversed for the fp32 floor), the 4-head variant for tp4, and the
 * parallel pieces of a runner set up in the trainer's rank order (docs/PARALLEL.md "Launch"). Include after test.h. */
#ifndef K3C_TEST_DIST_FIXTURE_H
#define K3C_TEST_DIST_FIXTURE_H

#include "base/check.h"
#include "parallel/cp.h"
#include "parallel/dp.h"
#include "parallel/ep.h"
#include "parallel/pp.h"
#include "parallel/tp.h"
#include "model/config.h"

#define T_BATCH 160
#define GRAD_CLIP 0.05 /* below the tiny model's gradient norm, so clipping scales every step */
#define QK_TAU 0.05    /* below its S_max, so QK-Clip scales heads */
#define LR 1e-3        /* a usual peak learning rate; 1e-2 would move the tiny model further per step */

typedef struct {
    int32_t ids[T_BATCH], targets[T_BATCH], cu[T_BATCH + 1];
    int n_docs;
} batch;

/* Documents of 1..29 tokens (a one-token document has no counted target), ids from a fixed LCG. */
static void make_batch(batch *b) {
    uint64_t s = 12345;
    int t = 0;
    b->n_docs = 0;
    b->cu[0] = 0;
    while (t < T_BATCH) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        int len = 1 + (int)((s >> 33) % 29);
        if (t + len > T_BATCH) len = T_BATCH - t;
        for (int i = 0; i < len; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            b->ids[t + i] = (int32_t)((s >> 35) % 32);
        }
        for (int i = 0; i < len; i++) b->targets[t + i] = i + 1 < len ? b->ids[t + i + 1] : -1;
        t += len;
        b->cu[++b->n_docs] = t;
    }
}

/* Documents laid out so that context-parallel ranges cross them in every way (cp2: boundary 80; cp4: 40, 80, 120;
 * cp2×dp2: the data-parallel split at 78, boundaries 39 and 119): a piece starting one token before a boundary (its
 * conv tail partly before the document), a piece starting at a boundary, pieces continuing across one, a piece
 * covering a whole rank (its state passes through), one-token pieces. */
static void make_batch_cp(batch *b) {
    static const int len[] = {5, 34, 2, 37, 47, 10, 1, 23, 1};
    uint64_t s = 777;
    int t = 0;
    b->n_docs = 0;
    b->cu[0] = 0;
    for (size_t d = 0; d < sizeof len / sizeof *len; d++) {
        for (int i = 0; i < len[d]; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            b->ids[t + i] = (int32_t)((s >> 35) % 32);
        }
        for (int i = 0; i < len[d]; i++) b->targets[t + i] = i + 1 < len[d] ? b->ids[t + i + 1] : -1;
        t += len[d];
        b->cu[++b->n_docs] = t;
    }
}

/* The same documents in reverse order: the same loss, gradients and updates in exact arithmetic, other fp32 sums. */
static void reverse_docs(const batch *a, batch *b) {
    int t = 0;
    b->n_docs = a->n_docs;
    b->cu[0] = 0;
    for (int d = a->n_docs - 1; d >= 0; d--) {
        int len = a->cu[d + 1] - a->cu[d];
        memcpy(b->ids + t, a->ids + a->cu[d], sizeof(int32_t) * (size_t)len);
        memcpy(b->targets + t, a->targets + a->cu[d], sizeof(int32_t) * (size_t)len);
        t += len;
        b->cu[a->n_docs - d] = t;
    }
}

/* The tiny model has 2 heads per mixer: 4 of each for tp4, MLA's head dims halved (2) so its widths stay those of the
 * 2-head model (with 4 heads of dims 4 its fp32 floor, test_dist_dp.c's fp32_floor, is 2.9e-5: the single process
 * differs from itself by more than the tests' 1e-5 there; 5.7e-6 here). */
static void tp_variant(k3c_config *cfg, int tp) {
    if (tp <= 2) return;
    cfg->kda_heads = cfg->mla_heads = cfg->mla_kv_heads = tp;
    cfg->qk_nope_dim = cfg->qk_rope_dim = cfg->v_head_dim = 2;
}

/* The parallel pieces of one runner. */
typedef struct {
    k3c_dp dp; /* data parallelism with ZeRO-1 over the ranks (pipeline: over the stage's) */
    int dist;
    k3c_comm *ep_comm; /* expert parallelism over groups of ep ranks */
    k3c_ep ep;
    k3c_comm *x_comm; /* expert residency: the ranks holding this rank's experts (ZeRO-1's group for them) */
    k3c_comm *stage_comm, *pp_comm; /* pipeline parallelism: the stage's DP group, the pipeline group */
    k3c_pp pp;
    int use_pp;
    k3c_comm *tp_comm; /* tensor parallelism over tp consecutive ranks */
    k3c_tp tp;
    k3c_comm *t_comm;  /* the ranks of the DP group with this TP rank (ZeRO-1's group for its shares) */
    k3c_comm *cp_comm; /* context parallelism over cp consecutive ranks */
    k3c_cp cp;
} dist_pieces;

/* What world rank `rank` of `size` holds (docs/PARALLEL.md "Residency"): the experts of its EP rank (EP groups: ep
 * consecutive ranks, or every tp-th or cp-th next to TP or CP, k3c_ep_place; ep < 2: all), the layers of its
 * pipeline stage (stages outermost: rank / (size / pp); pp < 2: all) and its TP rank's shares (TP innermost: rank %
 * tp; tp < 2: whole tensors). */
static k3c_residency residency_of(const k3c_config *cfg, int rank, int size, int ep, int tp, int pp, int cp) {
    k3c_residency r = k3c_residency_whole(cfg);
    int ep_rank, color;
    k3c_ep_place(rank, ep > 1 ? ep : 1, (tp > 1 ? tp : 1) * (cp > 1 ? cp : 1), &ep_rank, &color);
    if (ep > 1) k3c_ep_experts(cfg, ep_rank, ep, &r.expert0, &r.experts);
    if (pp > 1) k3c_pp_layers(cfg, rank / (size / pp), pp, &r.layer0, &r.layer1);
    if (tp > 1) r.tp_rank = rank % tp, r.tp_size = tp;
    return r;
}

/* dst (the layout of held, a table with a residency) ← src (the layout of whole, the same model's whole table): what the
 * held table's entries hold of the whole model's (nothing of an absent entry; a tensor-parallel share its part). */
static void held_part(const k3c_param_table *whole, const k3c_param_table *held, const float *src, float *dst) {
    for (int i = 0; i < held->n; i++) {
        const k3c_param *p = &held->p[i], *q = &whole->p[i];
        k3c_param_share_copy(p, held->res.tp_rank, sizeof(float),
                             (void *)(src + q->offset + (size_t)(p->stack0 * k3c_param_slice_numel(p))),
                             dst + p->offset, 0);
    }
}

/* The same for optimizer state (whole's layout wo → held's ho): each entry's blocks (momentum; m, v) in turn. */
static void held_state(const k3c_param_table *whole, const k3c_optim *wo, const k3c_param_table *held,
                       const k3c_optim *ho, const float *src, float *dst) {
    for (int i = 0; i < held->n; i++) {
        const k3c_param *p = &held->p[i], *q = &whole->p[i];
        const size_t len = (i + 1 < ho->n_entries ? ho->state_off[i + 1] : ho->state_numel) - ho->state_off[i];
        for (size_t b = 0; p->numel && b < len / (size_t)p->numel; b++)
            k3c_param_share_copy(p, held->res.tp_rank, sizeof(float),
                                 (void *)(src + wo->state_off[i] + b * (size_t)q->numel +
                                          (size_t)(p->stack0 * k3c_param_slice_numel(p))),
                                 dst + ho->state_off[i] + b * (size_t)p->numel, 0);
    }
}

/* The pieces over comm (NULL: none) for model m on backend be with optimizer o (the full table's): DP always, then
 * each of ep, tp, pp, cp whose degree is not 0 (1: over a group of one rank), the hooks set on m; stages outermost,
 * CP innermost, EP next to it, TP innermost without CP; pp runs `micro` micro-batches, cp sequences up to T_cap.
 * The model holds what residency_of gives its rank; one holding only its EP rank's experts gets ZeRO-1 over the ranks
 * holding the same ones for them. */
static int pieces_init(dist_pieces *d, k3c_model *m, const k3c_backend_f32 *be, const k3c_optim *o, k3c_comm *comm,
                       int ep, int tp, int pp, int cp, int micro, int64_t T_cap, k3c_err *err) {
    memset(d, 0, sizeof *d);
    if (!comm) return K3C_OK;
    if (ep) { /* the EP group: ep consecutive ranks (as docs/PLAN.md orders ranks), or every tp-th or cp-th next to TP
                 or CP (k3c_ep_place) */
        int ep_rank, color;
        k3c_ep_place(comm->rank, ep, (tp ? tp : 1) * (cp ? cp : 1), &ep_rank, &color);
        CHECK_RC(k3c_comm_split(comm, color, comm->rank, &d->ep_comm, err));
        CHECK_RC(k3c_ep_init(&d->ep, d->ep_comm, be, &m->cfg, err));
        d->ep.resident = m->table.res.experts < m->table.experts;
        m->experts = &d->ep.exchange;
    }
    k3c_comm *group = comm; /* the DP group: every rank, or a stage's */
    int e0 = 0, e1 = m->table.n;
    if (pp) { /* stage = rank / (ranks per stage), DP (and ZeRO-1) inside a stage, EP groups inside it too */
        int per = comm->size / pp;
        CHECK_RC(k3c_comm_split(comm, comm->rank / per, comm->rank, &d->stage_comm, err));
        CHECK_RC(k3c_comm_split(comm, comm->rank % per, comm->rank, &d->pp_comm, err));
        CHECK_RC(k3c_pp_init(&d->pp, d->pp_comm, &m->cfg, &m->table, micro, be, err));
        d->use_pp = 1;
        group = d->stage_comm, e0 = d->pp.e0, e1 = d->pp.e1;
    }
    if (ep && d->ep.resident) /* the ranks of the DP group holding the same experts */
        CHECK_RC(k3c_comm_split(group, d->ep_comm->rank, group->rank, &d->x_comm, err));
    if (tp) { /* the TP group: ranks that share rank / tp; the group takes one part of the batch */
        CHECK_RC(k3c_comm_split(comm, comm->rank / tp, comm->rank, &d->tp_comm, err));
        CHECK_RC(k3c_comm_split(group, group->rank % tp, group->rank, &d->t_comm, err));
        CHECK_RC(k3c_tp_init(&d->tp, d->tp_comm, be, &m->cfg, &m->table, err));
        m->tp = &d->tp.hook;
    }
    const k3c_dp_groups g = {group, d->x_comm, d->t_comm, d->tp_comm};
    CHECK_RC(k3c_dp_init_groups(&d->dp, &g, be, o, &m->table, e0, e1, err));
    d->dist = 1;
    if (cp) { /* the CP group: ranks that share rank / (tp·cp) and rank % tp, each a range of its DP part's tokens */
        const int t = tp ? tp : 1; /* every tp-th rank with TP innermost */
        CHECK_RC(k3c_comm_split(comm, comm->rank / (t * cp) * t + comm->rank % t, comm->rank, &d->cp_comm, err));
        CHECK_RC(k3c_cp_init(&d->cp, d->cp_comm, m, T_cap, err));
        m->context = &d->cp.exchange;
        if (pp) d->pp.cp = &d->cp; /* inside the stages: each micro-batch cut into ranges */
    }
    return K3C_OK;
}

static void pieces_free(dist_pieces *d) {
    if (d->dist) k3c_dp_free(&d->dp);
    if (d->ep_comm) {
        k3c_ep_free(&d->ep);
        k3c_comm_free(d->ep_comm);
    }
    k3c_comm_free(d->x_comm);
    if (d->tp_comm) {
        k3c_tp_free(&d->tp);
        k3c_comm_free(d->tp_comm);
    }
    k3c_comm_free(d->t_comm);
    if (d->cp_comm) {
        k3c_cp_free(&d->cp);
        k3c_comm_free(d->cp_comm);
    }
    if (d->use_pp) k3c_pp_free(&d->pp);
    k3c_comm_free(d->pp_comm);
    k3c_comm_free(d->stage_comm);
}

/* A model with its optimizer and step buffers on a backend, and its parallel pieces (none for the reference). */
typedef struct {
    k3c_model m;
    k3c_optim opt;
    const k3c_backend_f32 *be;
    void *inst; /* the backend's optimizer instance (NULL on the CPU) */
    float *state;
    k3c_step_stats stats;
    k3c_arena ar;
    void *qb_ws; /* the backend's memory */
    size_t qb_ws_bytes;
    dist_pieces d;
} runner;

/* One training step in the trainer's order (src/train/trainer.c train_step), the parallel hooks where the runner has
 * pieces; g_out (host memory): the step's summed gradients. */
static int step(runner *r, const batch *gb, int64_t step_no, int qb_mode, double *loss, float *g_out, double *norm,
                int *clipped, k3c_err *err) {
    const k3c_backend_f32 *be = r->be;
    k3c_dp *dp = r->d.dist ? &r->d.dp : NULL;
    k3c_model_batch b = {T_BATCH, gb->n_docs, gb->ids, gb->cu, gb->targets, 0, 0, NULL, NULL, NULL, NULL};
    if (r->d.cp_comm && r->d.use_pp)
        CHECK_RC(k3c_cp_part(&r->d.cp, dp, &b, err)); /* k3c_pp_step cuts its micro-batches into ranges */
    else if (r->d.cp_comm)
        CHECK_RC(k3c_cp_split_batch(&r->d.cp, dp, &b, err));
    else if (dp)
        CHECK_RC(k3c_dp_split_batch(dp, &b, err));
    CHECK_RC(be->zero(r->m.g, (int64_t)r->m.table.total, err));
    k3c_arena_reset(&r->ar, 0);
    k3c_acts *acts;
    if (dp) CHECK_RC(k3c_dp_grads_begin(dp, &r->m, r->d.tp_comm ? &r->d.tp : NULL, err)); /* layer by layer */
    if (r->d.use_pp) {
        CHECK_RC(k3c_pp_step(&r->d.pp, &r->m, &b, &r->ar, 1, loss, err));
        if (r->d.cp_comm) CHECK_RC(k3c_dp_local_tokens(dp, dp->replica ? 0 : r->d.pp.T_local, err));
    } else {
        CHECK_RC(k3c_model_forward_f32(&r->m, &b, &r->ar, &acts, loss, NULL, err));
        CHECK_RC(k3c_model_backward_f32(&r->m, acts, 1.0, err));
    }
    if (dp) CHECK_RC(k3c_dp_sum(dp, loss, err));
    if (dp) CHECK_RC(k3c_dp_grads_finish(dp, &r->m, err));
    if (g_out && dp) { /* the owners' parts gathered: the whole gradient of what the rank holds (its stage's) */
        float *whole = be->alloc(sizeof(float) * r->m.table.total);
        int e = whole ? k3c_dp_gather_grads(dp, &r->m.table, r->m.g, whole, err) : k3c_errf(err, K3C_ENOMEM, "grads");
        if (!e) e = be->download(g_out, whole, sizeof(float) * r->m.table.total, err);
        if (whole) be->free(whole);
        CHECK_RC(e);
    } else if (g_out) {
        CHECK_RC(be->download(g_out, r->m.g, sizeof(float) * r->m.table.total, err));
    }
    if (dp)
        CHECK_RC(k3c_dp_clip_grad_norm(dp, r->d.use_pp ? r->d.pp_comm : NULL, r->inst, &r->m.table, r->m.g, GRAD_CLIP,
                                       norm, err));
    else
        CHECK_RC(be->clip_grad_norm(r->inst, &r->m.table, r->m.g, GRAD_CLIP, norm, err));
    if (dp)
        CHECK_RC(k3c_dp_optim_step(dp, be, r->inst, &r->m.table, r->m.w, r->m.g, r->state, LR, step_no, err));
    else
        CHECK_RC(
            be->optim_step(r->inst, &r->opt, &r->m.table, 0, r->m.table.n, r->m.w, r->m.g, r->state, LR, step_no, err));
    const k3c_config *c = &r->m.cfg;
    if (r->d.tp_comm) CHECK_RC(k3c_tp_mask_smax(&r->d.tp, c, r->stats.smax, err));
    if (dp) CHECK_RC(k3c_dp_max_smax(dp, r->stats.smax, c->num_layers * c->mla_heads, err));
    CHECK_RC(be->qk_clip(be->ctx, c, &r->m.table, r->m.w, r->stats.smax, QK_TAU, r->stats.qk_clipped, err));
    int32_t n;
    CHECK_RC(be->download(&n, r->stats.qk_clipped, sizeof n, err));
    if (r->d.use_pp)
        CHECK_RC(k3c_comm_allreduce(r->d.pp_comm, &n, &n, 1, K3C_I32, K3C_COMM_SUM, NULL, err)); /* stages */
    if (r->d.tp_comm) /* each TP rank clips its own heads */
        CHECK_RC(k3c_comm_allreduce(r->d.tp_comm, &n, &n, 1, K3C_I32, K3C_COMM_SUM, NULL, err));
    *clipped = n;
    for (int l = 0; l < c->num_layers; l++) {
        const k3c_route_stats *rs = &r->stats.route[l];
        if (c->ffn[l] != K3C_FFN_MOE || rs->T == 0) continue; /* T = 0: another stage's layer */
        float *logits = rs->logits, *cutoff = rs->cutoff;
        int64_t T = rs->T;
        if (dp) CHECK_RC(k3c_dp_gather_route(dp, rs, rs->n, &logits, &cutoff, &T, err));
        size_t need = be->quantile_balance_workspace(qb_mode, T, rs->n);
        if (need > r->qb_ws_bytes) {
            if (r->qb_ws) be->free(r->qb_ws);
            r->qb_ws = be->alloc(need);
            r->qb_ws_bytes = r->qb_ws ? need : 0;
            if (!r->qb_ws) return k3c_errf(err, K3C_ENOMEM, "quantile balancing workspace");
        }
        CHECK_RC(be->quantile_balance(be->ctx, qb_mode, logits, cutoff, T, rs->n, rs->k,
                                      (float *)r->m.w + r->m.table.layer[l].router_bias, r->qb_ws, err));
    }
    return be->sync(err);
}

#endif
