/* dp.c — data parallelism with ZeRO-1: batch split at document boundaries with the global loss normalisation,
 * gradients reduce-scattered to the owners of their entries (after the backward, or piece by piece during it) and
 * clipped by the global norm, optimizer state sharded by whole table entries with the parameters all-gathered after
 * the step, global S_max and router statistics. Spec: docs/PARALLEL.md "Data parallelism (ZeRO-1)", docs/TRAINING.md
 * §1.5. */
#include "parallel/dp.h"

#include "base/check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static size_t entry_end(const k3c_param_table *t, int i) { return i < t->n ? t->p[i].offset : t->total; }
static size_t state_end(const k3c_optim *o, int i) { return i < o->n_entries ? o->state_off[i] : o->state_numel; }

/* Entry i's class: 1 summed and owned inside the expert group (a stacked routed-expert entry under an expert
 * residency), 2 inside the ranks of this TP rank (a tensor-parallel share), 0 over the group. */
static int class_of(const k3c_dp *dp, const k3c_param_table *t, int i) {
    return dp->xcomm && t->p[i].stack > 0 ? 1 : dp->tcomm && t->p[i].tp_share ? 2 : 0;
}
static k3c_comm *comm_of(const k3c_dp *dp, int x) { return x == 1 ? dp->xcomm : x == 2 ? dp->tcomm : dp->comm; }
static int rank_of(const k3c_dp *dp, int x) { return comm_of(dp, x)->rank; }

/* Owners: the entries of [e0, e1) of one class (class_of: over its comm) in order, rank r of its comm taking entries until the running element count reaches (r + 1)/size of the
 * class's elements, so each rank updates (and stores state for) about 1/size of them; an entry is never split. */
static void assign_owners(k3c_dp *dp, const k3c_param_table *t, int e0, int e1, int x) {
    const int size = comm_of(dp, x)->size;
    size_t total = 0, done = 0;
    for (int i = e0; i < e1; i++) total += class_of(dp, t, i) == x ? (size_t)t->p[i].numel : 0;
    int r = 0;
    for (int i = e0; i < e1; i++) {
        if (class_of(dp, t, i) != x) continue;
        while (r < size - 1 && !(done + (size_t)t->p[i].numel / 2 < (size_t)((double)total * (r + 1) / size))) r++;
        dp->owner[i] = r;
        done += (size_t)t->p[i].numel;
    }
}

/* The pieces: the runs of entries of [e0, e1) of one layer and one class (the embedding before the layers, layer −1;
 * the final mix, norm and lm_head after them, the head, layer num_layers, which the backward completes first), each
 * with every rank's share of its elements and optimizer state. Owners are assigned in order, so inside a piece each
 * rank's entries are consecutive and in rank order, where the piece's reduce-scatter and all-gathers put them. */
static int make_pieces(k3c_dp *dp, const k3c_param_table *t, const k3c_optim *o, int e0, int e1) {
    const int R = dp->size;
    int n = 0, L = 0;
    for (int i = 0; i < t->n; i++)
        if (t->p[i].layer + 1 > L) L = t->p[i].layer + 1;
    for (int i = e0; i < e1; i++)
        n += i == e0 || t->p[i].layer != t->p[i - 1].layer || class_of(dp, t, i) != class_of(dp, t, i - 1);
    dp->piece = calloc((size_t)(n > 0 ? n : 1), sizeof *dp->piece);
    int64_t *counts = calloc((size_t)(n > 0 ? n : 1) * (size_t)R * 4, sizeof(int64_t));
    if (!dp->piece || !counts) {
        free(counts);
        return K3C_ENOMEM;
    }
    dp->piece[0].count = counts; /* one block for all: k3c_dp_free frees it through the first piece */
    int64_t at = 0, s_at = 0;
    for (int i = e0; i < e1; i++) {
        const int x = class_of(dp, t, i);
        if (i > e0 && t->p[i].layer == t->p[i - 1].layer && x == class_of(dp, t, i - 1)) continue;
        k3c_dp_piece *q = &dp->piece[dp->n_pieces];
        q->count = counts + (size_t)dp->n_pieces++ * (size_t)R * 4;
        q->displ = q->count + R, q->s_count = q->displ + R, q->s_displ = q->s_count + R;
        q->e0 = i;
        q->x = x;
        for (q->e1 = i + 1; q->e1 < e1 && t->p[q->e1].layer == t->p[i].layer && class_of(dp, t, q->e1) == x;) q->e1++;
        q->layer = t->p[i].layer >= 0 || t->p[i].offset == 0 ? t->p[i].layer : L; /* the head after the layers */
        q->off = (int64_t)entry_end(t, q->e0);
        q->s_off = (int64_t)state_end(o, q->e0);
        for (int j = q->e0; j < q->e1; j++) {
            q->count[dp->owner[j]] += t->p[j].numel;
            q->s_count[dp->owner[j]] += (int64_t)(state_end(o, j + 1) - o->state_off[j]);
        }
        const int size = comm_of(dp, x)->size, me = rank_of(dp, x);
        for (int r = 1; r < size; r++)
            q->displ[r] = q->displ[r - 1] + q->count[r - 1], q->s_displ[r] = q->s_displ[r - 1] + q->s_count[r - 1];
        q->at = at, q->s_at = s_at;
        for (int j = q->e0; j < q->e1; j++) /* the shard's state: its entries' state, in table order */
            if (dp->owner[j] == me)
                dp->shard.state_off[j] = (size_t)s_at + o->state_off[j] - (size_t)(q->s_off + q->s_displ[me]);
        at += q->count[me], s_at += q->s_count[me];
    }
    dp->g_mine = at;
    dp->shard.state_numel = (size_t)s_at;
    return K3C_OK;
}

int k3c_dp_init(k3c_dp *dp, k3c_comm *comm, const k3c_backend_f32 *be, const k3c_optim *o, const k3c_param_table *t,
                k3c_err *err) {
    return k3c_dp_init_experts(dp, comm, NULL, be, o, t, 0, t->n, err);
}

int k3c_dp_init_range(k3c_dp *dp, k3c_comm *comm, const k3c_backend_f32 *be, const k3c_optim *o,
                      const k3c_param_table *t, int e0, int e1, k3c_err *err) {
    return k3c_dp_init_experts(dp, comm, NULL, be, o, t, e0, e1, err);
}

int k3c_dp_init_experts(k3c_dp *dp, k3c_comm *comm, k3c_comm *xcomm, const k3c_backend_f32 *be, const k3c_optim *o,
                        const k3c_param_table *t, int e0, int e1, k3c_err *err) {
    const k3c_dp_groups g = {comm, xcomm, NULL, NULL};
    return k3c_dp_init_groups(dp, &g, be, o, t, e0, e1, err);
}

/* A share whose Muon reads the whole matrix: whole-matrix Muon, or row blocks cut by a column split. */
static int needs_whole(const k3c_optim *o, const k3c_param *p) {
    return p->tp_share && p->kind == K3C_PK_MATRIX && o->matrix_optimizer == K3C_MATRIX_MUON &&
           !(p->tp_split == K3C_TP_ROWS && o->per_head && p->head_rows > 0);
}

/* The table of this rank's entries that need_whole at their whole shape (all at offset 0), its optimizer (state at 0)
 * and backend instance, and the staging. */
static int whole_init(k3c_dp *dp, const k3c_optim *o, const k3c_param_table *t, k3c_err *err) {
    int n = 0;
    dp->whole_step = calloc((size_t)(t->n > 0 ? t->n : 1), 1);
    dp->whole_at = calloc((size_t)(t->n > 0 ? t->n : 1), sizeof(int));
    if (!dp->whole_step || !dp->whole_at) return k3c_errf(err, K3C_ENOMEM, "data parallelism: out of memory");
    for (int i = 0; i < t->n; i++) n += dp->whole_step[i] = (uint8_t)(dp->mine[i] && needs_whole(o, &t->p[i]));
    if (!n) return K3C_OK;
    dp->whole.p = calloc((size_t)n, sizeof *dp->whole.p);
    if (!dp->whole.p) return k3c_errf(err, K3C_ENOMEM, "data parallelism: out of memory");
    for (int i = 0; i < t->n; i++) {
        if (!dp->whole_step[i]) continue;
        k3c_param *q = &dp->whole.p[dp->whole.n];
        *q = t->p[i];
        memcpy(q->shape, q->whole_shape, sizeof q->shape);
        q->numel = q->used = q->whole_numel;
        q->offset = 0;
        q->tp_share = 0;
        dp->whole_at[i] = dp->whole.n++;
        if ((size_t)q->numel > dp->whole.total) dp->whole.total = (size_t)q->numel;
    }
    dp->whole_opt = *o;
    CHECK_RC(k3c_optim_init(&dp->whole_opt, &dp->whole, err));
    for (int k = 0; k < dp->whole.n; k++) dp->whole_opt.state_off[k] = 0; /* one staging: entry by entry */
    dp->whole_opt.state_numel = dp->whole.total;
    dp->stage = dp->be->alloc(sizeof(float) * 4 * dp->whole.total);
    if (!dp->stage)
        return k3c_errf(err, K3C_ENOMEM, "data parallelism: whole-matrix Muon staging (%zu floats)",
                        4 * dp->whole.total);
    return dp->be->optim_open(dp->be->ctx, &dp->whole_opt, &dp->whole, &dp->whole_inst, err);
}

int k3c_dp_init_groups(k3c_dp *dp, const k3c_dp_groups *gr, const k3c_backend_f32 *be, const k3c_optim *o,
                       const k3c_param_table *t, int e0, int e1, k3c_err *err) {
    k3c_comm *comm = gr->comm, *xcomm = gr->xcomm;
    memset(dp, 0, sizeof *dp);
    CHECK_RC(k3c_comm_check_memory(comm, be->name, "data parallelism", err));
    for (int i = 0; i < t->n; i++)
        if (t->p[i].offset != (i ? t->p[i - 1].offset + (size_t)t->p[i - 1].numel : 0))
            return k3c_errf(err, K3C_EINVAL, "data parallelism: parameter %s is not contiguous with the one before",
                            t->p[i].name);
    if (xcomm && (comm->size % xcomm->size || xcomm->size > comm->size))
        return k3c_errf(err, K3C_EINVAL, "data parallelism: an expert group of %d ranks in a group of %d", xcomm->size,
                        comm->size);
    const int tp = gr->tpcomm ? gr->tpcomm->size : 1;
    if (tp > K3C_TP_MAX)
        return k3c_errf(err, K3C_EUNSUPPORTED, "data parallelism: a TP group of %d ranks (at most %d)", tp, K3C_TP_MAX);
    if (tp != (t->res.tp_size > 1 ? t->res.tp_size : 1) ||
        (tp > 1 && (!gr->tcomm || gr->tcomm->size * tp != comm->size)))
        return k3c_errf(err, K3C_EINVAL,
                        "data parallelism: a TP group of %d ranks (of %d, %d with this TP rank) for a table of "
                        "tensor-parallel shares of %d",
                        tp, comm->size, gr->tcomm ? gr->tcomm->size : 0, t->res.tp_size);
    dp->comm = comm;
    dp->xcomm = xcomm;
    dp->tcomm = tp > 1 ? gr->tcomm : NULL;
    dp->tpcomm = tp > 1 ? gr->tpcomm : NULL;
    dp->be = be;
    dp->rank = comm->rank;
    dp->size = comm->size;
    int R = dp->size;
    dp->ones = calloc((size_t)R * 2, sizeof(int64_t));
    dp->T_all = calloc((size_t)R, sizeof(int64_t));
    dp->owner = malloc(sizeof(int) * (size_t)(t->n > 0 ? t->n : 1));
    dp->mine = calloc((size_t)(t->n > 0 ? t->n : 1), 1);
    dp->shard = *o;
    dp->shard.state_off = calloc((size_t)(t->n > 0 ? t->n : 1), sizeof(size_t));
    if (!dp->ones || !dp->T_all || !dp->owner || !dp->mine || !dp->shard.state_off) {
        k3c_dp_free(dp);
        return k3c_errf(err, K3C_ENOMEM, "data parallelism: out of memory");
    }
    dp->iota = dp->ones + R;
    for (int r = 0; r < R; r++) dp->ones[r] = 1, dp->iota[r] = r;
    for (int i = 0; i < t->n; i++) dp->owner[i] = -1;
    for (int x = 0; x < 3; x++)
        if (comm_of(dp, x)) assign_owners(dp, t, e0, e1, x);
    for (int i = e0; i < e1; i++) dp->mine[i] = dp->owner[i] == rank_of(dp, class_of(dp, t, i));
    dp->g_off = entry_end(t, e0);
    dp->g_len = entry_end(t, e1) - dp->g_off;
    dp->part = dp->rank / tp; /* TP innermost: a TP group takes one part of the batch */
    dp->parts = dp->size / tp;
    dp->replica = dp->rank % tp != 0;
    /* the shard's state offsets (make_pieces) count this rank's entries only; other owners' are never stepped here */
    if (make_pieces(dp, t, o, e0, e1)) {
        k3c_dp_free(dp);
        return k3c_errf(err, K3C_ENOMEM, "data parallelism: out of memory");
    }
    dp->g_shard = be->alloc(sizeof(float) * (size_t)(dp->g_mine > 0 ? dp->g_mine : 1));
    if (!dp->g_shard) {
        k3c_dp_free(dp);
        return k3c_errf(err, K3C_ENOMEM, "data parallelism: the gradient shard (%lld floats)", (long long)dp->g_mine);
    }
    int e = whole_init(dp, o, t, err);
    if (e) k3c_dp_free(dp);
    return e;
}

void k3c_dp_free(k3c_dp *dp) {
    free(dp->ones);
    free(dp->owner);
    free(dp->mine);
    free(dp->T_all);
    free(dp->shard.state_off); /* the workspace belongs to the full optimizer */
    free(dp->cu);
    if (dp->route_buf) dp->be->free(dp->route_buf);
    /* pieces still in flight (a backward that failed: the job ends) may yet write the shard, so it is left */
    if (dp->g_shard && !dp->in_flight) dp->be->free(dp->g_shard);
    if (dp->piece) free(dp->piece[0].count);
    free(dp->piece);
    if (dp->whole_inst) dp->be->optim_close(dp->whole_inst);
    if (dp->stage) dp->be->free(dp->stage);
    k3c_optim_free(&dp->whole_opt);
    k3c_params_free(&dp->whole);
    free(dp->whole_step);
    free(dp->whole_at);
    memset(dp, 0, sizeof *dp);
}

/* Rank r's first piece: the boundary nearest r·T/size that leaves at least one piece to every rank (among the
 * boundaries at multiples of `mult` when there are any). */
static int split_point(const int32_t *cu, int n_docs, int64_t T, int r, int size, int lo, int mult) {
    int best = lo, aligned = -1;
    double goal = (double)T * r / size;
    for (int d = lo; d <= n_docs - (size - r); d++) {
        if (fabs(cu[d] - goal) < fabs(cu[best] - goal)) best = d;
        if (cu[d] % mult == 0 && (aligned < 0 || fabs(cu[d] - goal) < fabs(cu[aligned] - goal))) aligned = d;
    }
    return aligned >= 0 ? aligned : best;
}

void k3c_batch_part_aligned(const int32_t *cu, int n_docs, int64_t T, int part, int parts, int mult, int *d0, int *d1) {
    *d0 = 0;
    *d1 = n_docs;
    for (int r = 1; r <= part; r++) *d0 = split_point(cu, n_docs, T, r, parts, *d0 + 1, mult);
    if (part < parts - 1) *d1 = split_point(cu, n_docs, T, part + 1, parts, *d0 + 1, mult);
}

void k3c_batch_part(const int32_t *cu, int n_docs, int64_t T, int part, int parts, int *d0, int *d1) {
    k3c_batch_part_aligned(cu, n_docs, T, part, parts, 1, d0, d1);
}

int k3c_dp_take_part(k3c_dp *dp, k3c_model_batch *b, int part, int parts, int mult, const char *who, k3c_err *err) {
    int n = b->cu_seqlens ? b->n_docs : 1;
    if (!b->targets || !b->cu_seqlens)
        return k3c_errf(err, K3C_EINVAL, "%s: the batch needs explicit targets and cu_seqlens", who);
    if (n < parts)
        return k3c_errf(err, K3C_EINVAL,
                        "%s: the batch has %d document pieces for %d %s (each needs a whole piece: lower the stage's "
                        "seq_len or raise tokens_per_step)",
                        who, n, parts, mult > 1 ? "data-parallel parts" : "ranks");
    if (b->n_embeds)
        return k3c_errf(err, K3C_EINVAL, "%s: input-embedding overrides (image rows) are not split yet", who);
    if (b->weight) return k3c_errf(err, K3C_EINVAL, "%s: per-position loss weights are not split yet", who);
    int64_t counted = 0;
    for (int64_t t = 0; t < b->T; t++) counted += b->targets[t] >= 0;
    if (!counted) return k3c_errf(err, K3C_EINVAL, "%s: the batch has no counted target", who);
    int d0, d1;
    k3c_batch_part_aligned(b->cu_seqlens, n, b->T, part, parts, mult, &d0, &d1);
    if (d1 - d0 + 1 > dp->cu_cap) {
        free(dp->cu);
        dp->cu_cap = d1 - d0 + 1;
        dp->cu = malloc(sizeof(int32_t) * (size_t)dp->cu_cap);
        if (!dp->cu) {
            dp->cu_cap = 0;
            return k3c_errf(err, K3C_ENOMEM, "%s: out of memory", who);
        }
    }
    int32_t t0 = b->cu_seqlens[d0];
    for (int d = d0; d <= d1; d++) dp->cu[d - d0] = b->cu_seqlens[d] - t0;
    b->T = b->cu_seqlens[d1] - t0;
    b->n_docs = d1 - d0;
    b->ids += t0;
    b->targets += t0;
    b->cu_seqlens = dp->cu;
    b->loss_norm = (double)counted;
    return K3C_OK;
}

int k3c_dp_local_tokens(k3c_dp *dp, int64_t T, k3c_err *err) {
    dp->T_local = T;
    return k3c_comm_allgather(dp->comm, &dp->T_local, dp->T_all, dp->ones, dp->iota, K3C_I64, NULL, err);
}

int k3c_dp_split_batch(k3c_dp *dp, k3c_model_batch *b, k3c_err *err) {
    CHECK_RC(k3c_dp_take_part(dp, b, dp->part, dp->parts, 1, "data parallelism", err));
    return k3c_dp_local_tokens(dp, dp->replica ? 0 : b->T, err); /* the router statistics: once per part */
}

int k3c_dp_sum(k3c_dp *dp, double *x, k3c_err *err) {
    if (dp->replica) *x = 0; /* its TP group's first rank adds the same value */
    return k3c_comm_allreduce(dp->comm, x, x, 1, K3C_F64, K3C_COMM_SUM, NULL, err);
}

/* After the reduce-scatter: the group's entries of g zeroed, this rank's own sums (g_shard) put back in place. */
static int shard_into_place(k3c_dp *dp, float *g, k3c_err *err) {
    CHECK_RC(dp->be->zero(g + dp->g_off, (int64_t)dp->g_len, err));
    for (int p = 0; p < dp->n_pieces; p++) {
        const k3c_dp_piece *q = &dp->piece[p];
        const int me = rank_of(dp, q->x);
        const int64_t mine = q->count[me];
        if (mine) CHECK_RC(dp->be->copy2d(1, mine, dp->g_shard + q->at, mine, g + q->off + q->displ[me], mine, 0, err));
    }
    return K3C_OK;
}

static int start_piece(k3c_dp *dp, int p, k3c_err *err);
static int wait_pieces(k3c_dp *dp, int e, k3c_err *err);

int k3c_dp_reduce_grads(k3c_dp *dp, float *g, k3c_err *err) {
    if (dp->ov_g || dp->in_flight)
        return k3c_errf(err, K3C_EINVAL, "data parallelism: k3c_dp_reduce_grads between _begin and _finish");
    dp->ov_g = g;
    dp->ov_t = NULL;
    dp->ov_tp = NULL;
    int e = K3C_OK;
    for (int p = 0; !e && p < dp->n_pieces; p++) e = start_piece(dp, p, err);
    e = wait_pieces(dp, e, err);
    dp->ov_g = NULL;
    return e ? e : shard_into_place(dp, g, err);
}

/* Starts piece p's reduce-scatter (once): its entries of ov_g, deduplicated over the TP group first, to the owners'
 * places in g_shard. The communicator orders its reads after the compute issued so far (NCCL: after_compute). */
static int start_piece(k3c_dp *dp, int p, k3c_err *err) {
    k3c_dp_piece *q = &dp->piece[p];
    if (q->started) return K3C_OK;
    if (dp->ov_tp) CHECK_RC(k3c_tp_dedup_grads_range(dp->ov_tp, dp->ov_t, dp->ov_g, K3C_F32, q->e0, q->e1, err));
    CHECK_RC(k3c_comm_reduce_scatter(comm_of(dp, q->x), dp->ov_g + q->off, dp->g_shard + q->at, q->count, K3C_F32,
                                     K3C_COMM_SUM, &q->req, err));
    q->started = 1;
    dp->in_flight++;
    return K3C_OK;
}

static int layer_done(void *ctx, int l, k3c_err *err) {
    k3c_dp *dp = ctx;
    for (int p = 0; p < dp->n_pieces; p++)
        if (dp->piece[p].layer == l && !dp->piece[p].started) {
            CHECK_RC(start_piece(dp, p, err));
            dp->hooked++;
        }
    return K3C_OK;
}

int k3c_dp_grads_begin(k3c_dp *dp, k3c_model *m, const k3c_tp *tp, k3c_err *err) {
    if (m->precision != K3C_F32 || !m->g)
        return k3c_errf(err, K3C_EINVAL, "data parallelism: overlapping the gradient sum needs float32 gradients");
    if (dp->ov_g || dp->in_flight)
        return k3c_errf(err, K3C_EINVAL, "data parallelism: k3c_dp_grads_begin again before k3c_dp_grads_finish");
    for (int p = 0; p < dp->n_pieces; p++) dp->piece[p].started = 0, dp->piece[p].req = NULL;
    dp->hooked = 0;
    dp->ov_g = m->g;
    dp->ov_t = &m->table;
    dp->ov_tp = tp;
    dp->hook = (k3c_grad_hook){layer_done, dp};
    m->grads = &dp->hook;
    return K3C_OK;
}

/* Waits for every started piece, even after an error (e: the first one so far); returns the first error. */
static int wait_pieces(k3c_dp *dp, int e, k3c_err *err) {
    for (int p = 0; p < dp->n_pieces; p++) {
        k3c_dp_piece *q = &dp->piece[p];
        if (!q->started) continue;
        int e2 = k3c_comm_wait(q->req, e ? NULL : err);
        q->req = NULL;
        q->started = 0;
        dp->in_flight--;
        if (!e) e = e2;
    }
    return e;
}

int k3c_dp_grads_finish(k3c_dp *dp, k3c_model *m, k3c_err *err) {
    m->grads = NULL;
    if (!dp->ov_g) return k3c_errf(err, K3C_EINVAL, "data parallelism: k3c_dp_grads_finish without k3c_dp_grads_begin");
    int e = K3C_OK;
    for (int p = 0; !e && p < dp->n_pieces; p++) e = start_piece(dp, p, err); /* the embedding's */
    e = wait_pieces(dp, e, err);
    float *g = dp->ov_g;
    dp->ov_g = NULL;
    return e ? e : shard_into_place(dp, g, err);
}

int k3c_dp_clip_grad_norm(k3c_dp *dp, k3c_comm *pp_comm, void *inst, const k3c_param_table *t, float *g,
                          double max_norm, double *norm, k3c_err *err) {
    double local, ss;
    CHECK_RC(dp->be->clip_grad_norm(inst, t, g, 0, &local, err));
    ss = local * local;
    CHECK_RC(k3c_comm_allreduce(dp->comm, &ss, &ss, 1, K3C_F64, K3C_COMM_SUM, NULL, err));
    if (pp_comm) CHECK_RC(k3c_comm_allreduce(pp_comm, &ss, &ss, 1, K3C_F64, K3C_COMM_SUM, NULL, err));
    *norm = sqrt(ss);
    if (!isfinite(*norm) || !(max_norm > 0) || *norm <= max_norm || !(local > 0)) return K3C_OK;
    /* the backend scales by bound / (its norm + 1e-6) of the norm it measures, here this rank's part: the bound that
       makes that the global coefficient max_norm / (norm + 1e-6) */
    double again;
    return dp->be->clip_grad_norm(inst, t, g, max_norm * (local + 1e-6) / (*norm + 1e-6), &again, err);
}

/* Every piece's owners' parts of x gathered in place over the piece's group. */
static int gather_pieces(k3c_dp *dp, float *x, k3c_err *err) {
    for (int p = 0; p < dp->n_pieces; p++) {
        const k3c_dp_piece *q = &dp->piece[p];
        CHECK_RC(k3c_comm_allgather(comm_of(dp, q->x), NULL, x + q->off, q->count, q->displ, K3C_F32, NULL, err));
    }
    return K3C_OK;
}

int k3c_dp_gather_grads(k3c_dp *dp, const k3c_param_table *t, const float *g, float *out, k3c_err *err) {
    CHECK_RC(dp->be->zero(out, (int64_t)t->total, err));
    for (int p = 0; p < dp->n_pieces; p++) {
        const k3c_dp_piece *q = &dp->piece[p];
        const int64_t mine = q->count[rank_of(dp, q->x)], at = q->off + q->displ[rank_of(dp, q->x)];
        if (mine) CHECK_RC(dp->be->copy2d(1, mine, g + at, mine, out + at, mine, 0, err));
    }
    CHECK_RC(dp->be->sync(err));
    return gather_pieces(dp, out, err);
}

/* whole (the entry's whole layout) ← its shares of x over the TP group, in rank order (tmp: room for them). */
static int gather_whole(k3c_dp *dp, const k3c_param *p, const float *x, float *whole, float *tmp, k3c_err *err) {
    const int tp = dp->tpcomm->size;
    int64_t cnt[2 * K3C_TP_MAX], *dsp = cnt + K3C_TP_MAX;
    for (int r = 0; r < tp; r++) cnt[r] = p->numel, dsp[r] = r * p->numel;
    const int cols = p->tp_split == K3C_TP_COLS;
    CHECK_RC(k3c_comm_allgather(dp->tpcomm, x, cols ? tmp : whole, cnt, dsp, K3C_F32, NULL, err));
    for (int r = 0; cols && r < tp; r++) /* share r: columns [r·c, (r + 1)·c) of every row */
        CHECK_RC(dp->be->copy2d(p->shape[0], p->shape[1], tmp + r * p->numel, p->shape[1], whole + r * p->shape[1],
                                p->whole_shape[1], 0, err));
    return K3C_OK;
}

/* x (this rank's share) ← its part of whole. */
static int keep_share(k3c_dp *dp, const k3c_param *p, const float *whole, float *x, k3c_err *err) {
    const int64_t me = dp->tpcomm->rank;
    if (p->tp_split == K3C_TP_COLS)
        return dp->be->copy2d(p->shape[0], p->shape[1], whole + me * p->shape[1], p->whole_shape[1], x, p->shape[1], 0,
                              err);
    return dp->be->copy2d(1, p->numel, whole + me * p->numel, p->numel, x, p->numel, 0, err);
}

/* Entry i (this rank's, whole_step): weight, gradient and momentum gathered whole over the TP group, one Muon step of
 * the whole matrix on one rank of the group, this rank's share of the broadcast weight and momentum kept. */
static int step_whole(k3c_dp *dp, const k3c_param_table *t, int i, float *w, const float *g, float *state, double lr,
                      int64_t step, k3c_err *err) {
    const k3c_param *p = &t->p[i];
    const size_t n = dp->whole.total;
    float *W = dp->stage, *G = W + n, *M = G + n, *tmp = M + n, *mom = state + dp->shard.state_off[i];
    CHECK_RC(gather_whole(dp, p, w + p->offset, W, tmp, err));
    CHECK_RC(gather_whole(dp, p, g + p->offset, G, tmp, err));
    CHECK_RC(gather_whole(dp, p, mom, M, tmp, err));
    /* the group's ranks take turns (the k-th such entry on TP rank k mod tp, the same list on each): one
       Newton–Schulz per entry in the group, its whole weight and momentum broadcast */
    const int k = dp->whole_at[i], root = k % dp->tpcomm->size;
    if (dp->tpcomm->rank == root)
        CHECK_RC(dp->be->optim_step(dp->whole_inst, &dp->whole_opt, &dp->whole, k, k + 1, W, G, M, lr, step, err));
    CHECK_RC(dp->be->sync(err)); /* the broadcast reads the update */
    CHECK_RC(k3c_comm_bcast(dp->tpcomm, W, p->whole_numel, K3C_F32, root, NULL, err));
    CHECK_RC(k3c_comm_bcast(dp->tpcomm, M, p->whole_numel, K3C_F32, root, NULL, err));
    CHECK_RC(keep_share(dp, p, W, w + p->offset, err));
    CHECK_RC(keep_share(dp, p, M, mom, err));
    return dp->be->sync(err); /* the staging is reused by the next entry's gathers */
}

int k3c_dp_optim_step(k3c_dp *dp, const k3c_backend_f32 *be, void *inst, const k3c_param_table *t, float *w,
                      const float *g, float *state_shard, double lr, int64_t step, k3c_err *err) {
    for (int i = 0; i < t->n;) { /* each run of this rank's entries (those stepped whole after) */
        if (!dp->mine[i] || dp->whole_step[i]) {
            i++;
            continue;
        }
        int j = i + 1;
        while (j < t->n && dp->mine[j] && !dp->whole_step[j]) j++;
        CHECK_RC(be->optim_step(inst, &dp->shard, t, i, j, w, g, state_shard, lr, step, err));
        i = j;
    }
    CHECK_RC(be->sync(err)); /* the owners' updates are read by the all-gather */
    for (int i = 0; i < t->n; i++)
        if (dp->whole_step[i]) CHECK_RC(step_whole(dp, t, i, w, g, state_shard, lr, step, err));
    return gather_pieces(dp, w, err);
}

int k3c_dp_max_smax(k3c_dp *dp, float *smax, int64_t n, k3c_err *err) {
    return k3c_comm_allreduce(dp->comm, smax, smax, n, K3C_F32, K3C_COMM_MAX, NULL, err);
}

int k3c_dp_gather_route(k3c_dp *dp, const k3c_route_stats *r, int64_t n, float **logits, float **cutoff, int64_t *T,
                        k3c_err *err) {
    int R = dp->size;
    int64_t total = 0;
    for (int i = 0; i < R; i++) total += dp->T_all[i];
    size_t need = (size_t)total * (size_t)(n + 1);
    if (need > dp->route_cap) {
        if (dp->route_buf) dp->be->free(dp->route_buf);
        dp->route_buf = dp->be->alloc(sizeof(float) * (need ? need : 1)); /* where quantile_balance reads */
        dp->route_cap = dp->route_buf ? need : 0;
        if (!dp->route_buf)
            return k3c_errf(err, K3C_ENOMEM, "data parallelism: router statistics of %lld tokens", (long long)total);
    }
    int64_t *cnt = malloc(sizeof(int64_t) * 3 * (size_t)R); /* logits counts, displacements; cutoff displacements */
    if (!cnt) return k3c_errf(err, K3C_ENOMEM, "data parallelism: out of memory");
    int64_t *dsp = cnt + R, *tok = cnt + 2 * R, off = 0;
    for (int i = 0; i < R; i++) cnt[i] = dp->T_all[i] * n, dsp[i] = off * n, tok[i] = off, off += dp->T_all[i];
    k3c_comm_req *q = NULL; /* the logits travel while the cutoffs are gathered */
    int e = k3c_comm_allgather(dp->comm, r->logits, dp->route_buf, cnt, dsp, K3C_F32, &q, err);
    if (!e) e = k3c_comm_allgather(dp->comm, r->cutoff, dp->route_buf + total * n, dp->T_all, tok, K3C_F32, NULL, err);
    int e2 = k3c_comm_wait(q, e ? NULL : err);
    free(cnt);
    if (e || e2) return e ? e : e2;
    *logits = dp->route_buf;
    *cutoff = dp->route_buf + total * n;
    *T = total;
    return K3C_OK;
}

int k3c_dp_gather_state(k3c_dp *dp, const float *state_shard, float *full, k3c_err *err) {
    for (int p = 0; p < dp->n_pieces; p++) {
        const k3c_dp_piece *q = &dp->piece[p];
        CHECK_RC(k3c_comm_allgather(comm_of(dp, q->x), state_shard + q->s_at, full + q->s_off, q->s_count, q->s_displ,
                                    K3C_F32, NULL, err));
    }
    return K3C_OK;
}
