/* tp.c — tensor parallelism: the model's hook (sums over the TP group, the vocabulary-parallel embedding and
 * cross-entropy), the layout checks, and the gradient bookkeeping of replicated entries before the sum over ranks.
 * Spec: docs/PARALLEL.md "Tensor parallelism". */
#include "parallel/tp.h"

#include "base/check.h"
#include "model/config.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int k3c_tp_check(const k3c_config *cfg, int64_t tp, const char *file, k3c_err *err) {
    if (tp <= 1) return K3C_OK;
    const int64_t n[5] = {cfg->kda_heads, k3c_config_num_mla(cfg) ? cfg->mla_heads : 0, cfg->vocab_size,
                          cfg->intermediate_size, cfg->moe_intermediate_size * cfg->num_shared_experts};
    const char *what[5] = {"KDA heads", "MLA heads", "vocabulary rows (vocab_size)", "dense MLP intermediate rows",
                           "shared-expert intermediate rows"};
    for (int i = 0; i < 5; i++)
        if (n[i] % tp)
            return k3c_errf(err, K3C_ECONFIG, "%s: parallel.tp = %lld does not divide the model's %lld %s", file,
                            (long long)tp, (long long)n[i], what[i]);
    return K3C_OK;
}

static int tp_sum(void *ctx, k3c_dtype t, void *x, int64_t n, k3c_err *err) {
    k3c_tp *tp = ctx;
    return k3c_comm_allreduce(tp->comm, x, x, n, t, K3C_COMM_SUM, NULL, err);
}

/* The ids checked against the whole vocabulary V; [*v0, *v1): the rows this rank holds. */
static int vocab_rows(const k3c_tp *tp, const int32_t *ids, int64_t T, int64_t V, const char *op, int64_t *v0,
                      int64_t *v1, k3c_err *err) {
    for (int64_t t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= V)
            return k3c_errf(err, K3C_EINVAL, "%s (tensor-parallel): position %lld has id %d outside [0, %lld)", op,
                            (long long)t, ids[t], (long long)V);
    *v0 = tp->rank * (V / tp->size);
    *v1 = *v0 + V / tp->size;
    return K3C_OK;
}

/* Targets checked against the whole vocabulary; returns the counted ones (targets ≥ 0) through *count. */
static int xent_targets(const k3c_tp *tp, int64_t T, int64_t Vl, const int32_t *targets, int64_t *count, k3c_err *err) {
    int64_t n = 0;
    for (int64_t t = 0; t < T; t++) {
        if (targets[t] < 0) continue;
        if (targets[t] >= Vl * tp->size)
            return k3c_errf(err, K3C_EINVAL, "xent (tensor-parallel): position %lld has target %d outside [0, %lld)",
                            (long long)t, targets[t], (long long)(Vl * tp->size));
        n++;
    }
    *count = n;
    return K3C_OK;
}

static int red_buffer(k3c_tp *tp, int64_t n, k3c_err *err) {
    if (n <= tp->red_cap) return K3C_OK;
    free(tp->red);
    tp->red = malloc(sizeof(double) * (size_t)n);
    tp->red_cap = tp->red ? n : 0;
    return tp->red ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "tensor parallelism: cross-entropy reductions");
}

/* The loops of the vocabulary-parallel embedding and cross-entropy on the model's real (float or double), with the
 * arithmetic of the single-process ops (ops/embedding.c, ops/xent.c: exponentials in real, sums in double).
 * Embedding: y[t] = E[ids[t]] from the rank holding that row (E: its rows [V/size, D]; zero rows elsewhere; the caller
 * sums over the group); its backward dE[ids[t]] += dy[t] (row_add) for this rank's rows in token order. Cross-entropy over logits split by vocabulary
 * rows: per token the maximum over the group (all-reduce max), the sum of exponentials and the target's logit from its
 * owner (one all-reduce sum), then lse and the loss as the single-process op: every rank gets the whole loss and lse.
 * Its backward needs no communication: this rank's rows of the softmax from the global lse, the one-hot on the
 * target's owner. */
#define TP_LOOPS(real, S, EXP)                                                                                         \
    static void row_add_##S(int64_t D, const void *dy, void *dE) { /* dE row += dy row */                              \
        for (int64_t j = 0; j < D; j++) ((real *)dE)[j] += ((const real *)dy)[j];                                      \
    }                                                                                                                  \
    static int xent_fwd_##S(k3c_tp *tp, int64_t T, int64_t Vl, const real *logits, const int32_t *targets,             \
                            const float *weight, real *lse, double *sum, k3c_err *err) {                               \
        double *mx = tp->red, *se = mx + T, *xt = se + T;                                                              \
        const int64_t v0 = tp->rank * Vl;                                                                              \
        for (int64_t t = 0; t < T; t++) {                                                                              \
            const real *x = logits + t * Vl;                                                                           \
            real m = x[0];                                                                                             \
            for (int64_t j = 1; j < Vl; j++) m = x[j] > m ? x[j] : m;                                                  \
            mx[t] = m;                                                                                                 \
        }                                                                                                              \
        CHECK_RC(k3c_comm_allreduce(tp->comm, mx, mx, T, K3C_F64, K3C_COMM_MAX, NULL, err));                           \
        for (int64_t t = 0; t < T; t++) {                                                                              \
            const real *x = logits + t * Vl, m = (real)mx[t];                                                          \
            double s = 0;                                                                                              \
            for (int64_t j = 0; j < Vl; j++) s += EXP(x[j] - m);                                                       \
            se[t] = s;                                                                                                 \
            xt[t] = targets[t] >= v0 && targets[t] < v0 + Vl ? x[targets[t] - v0] : 0;                                 \
        }                                                                                                              \
        CHECK_RC(k3c_comm_allreduce(tp->comm, se, se, 2 * T, K3C_F64, K3C_COMM_SUM, NULL, err));                       \
        *sum = 0;                                                                                                      \
        for (int64_t t = 0; t < T; t++) {                                                                              \
            double l = mx[t] + log(se[t]);                                                                             \
            lse[t] = (real)l;                                                                                          \
            if (targets[t] >= 0) *sum += weight ? weight[t] * (l - xt[t]) : l - xt[t];                                 \
        }                                                                                                              \
        return K3C_OK;                                                                                                 \
    }                                                                                                                  \
    static void xent_bwd_##S(const k3c_tp *tp, int64_t T, int64_t Vl, const real *logits, const int32_t *targets,      \
                             const float *weight, const real *lse, double g, real *dlogits) {                          \
        const int64_t v0 = tp->rank * Vl;                                                                              \
        for (int64_t t = 0; t < T; t++) {                                                                              \
            if (targets[t] < 0) continue;                                                                              \
            const real *x = logits + t * Vl;                                                                           \
            real *d = dlogits + t * Vl;                                                                                \
            const double gt = weight ? g * weight[t] : g;                                                              \
            for (int64_t j = 0; j < Vl; j++) d[j] += (real)(gt * EXP(x[j] - lse[t]));                                  \
            if (targets[t] >= v0 && targets[t] < v0 + Vl) d[targets[t] - v0] -= (real)gt;                              \
        }                                                                                                              \
    }
TP_LOOPS(float, f32, expf)
TP_LOOPS(double, f64, exp)
#undef TP_LOOPS

/* The hooks run their loops on host copies (the backend's memory may be a device's): tp->host holds them, carved in
 * 8-byte-aligned pieces by `take`. */
static int host_room(k3c_tp *tp, size_t bytes, k3c_err *err) {
    tp->host_used = 0;
    if (bytes <= tp->host_cap) return K3C_OK;
    free(tp->host);
    tp->host = malloc(bytes);
    tp->host_cap = tp->host ? bytes : 0;
    return tp->host ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "tensor parallelism: %zu bytes of host copies", bytes);
}

static void *take(k3c_tp *tp, size_t bytes) {
    void *p = tp->host + tp->host_used;
    tp->host_used += (bytes + 7) & ~(size_t)7;
    return p;
}

#define ROOM(bytes) (((size_t)(bytes) + 7) & ~(size_t)7)

static int tp_embed_fwd(void *ctx, k3c_dtype dt, int64_t T, int64_t V, int64_t D, const int32_t *ids_be, const void *E,
                        void *y, k3c_err *err) {
    k3c_tp *tp = ctx;
    const k3c_backend_f32 *be = tp->be;
    const size_t es = k3c_comm_dtype_size(dt), row = es * (size_t)D;
    int64_t v0 = 0, v1 = 0;
    CHECK_RC(host_room(tp, ROOM(sizeof(int32_t) * T) + row * (size_t)T, err));
    int32_t *ids = take(tp, sizeof(int32_t) * (size_t)T);
    char *yh = take(tp, row * (size_t)T);
    CHECK_RC(be->download(ids, ids_be, sizeof(int32_t) * (size_t)T, err));
    CHECK_RC(vocab_rows(tp, ids, T, V, "embedding", &v0, &v1, err));
    for (int64_t t = 0; t < T; t++) { /* its row from the rank holding it, zero rows elsewhere */
        if (ids[t] >= v0 && ids[t] < v1)
            CHECK_RC(be->download(yh + row * t, (const char *)E + row * (ids[t] - v0), row, err));
        else
            memset(yh + row * t, 0, row);
    }
    CHECK_RC(be->upload(y, yh, row * (size_t)T, err));
    return tp_sum(tp, dt, y, T * D, err);
}

static int tp_embed_bwd(void *ctx, k3c_dtype dt, int64_t T, int64_t V, int64_t D, const int32_t *ids_be, const void *dy,
                        void *dE, k3c_err *err) {
    k3c_tp *tp = ctx;
    const k3c_backend_f32 *be = tp->be;
    const size_t es = k3c_comm_dtype_size(dt), row = es * (size_t)D;
    int64_t v0 = 0, v1 = 0;
    CHECK_RC(host_room(tp, ROOM(sizeof(int32_t) * T) + ROOM(row * (size_t)T) + row, err));
    int32_t *ids = take(tp, sizeof(int32_t) * (size_t)T);
    char *dyh = take(tp, row * (size_t)T), *r = take(tp, row);
    CHECK_RC(be->download(ids, ids_be, sizeof(int32_t) * (size_t)T, err));
    CHECK_RC(vocab_rows(tp, ids, T, V, "embedding backward", &v0, &v1, err));
    CHECK_RC(be->download(dyh, dy, row * (size_t)T, err));
    for (int64_t t = 0; t < T; t++) { /* dE[ids[t]] += dy[t] for this rank's rows, in token order */
        if (ids[t] < v0 || ids[t] >= v1) continue;
        char *dst = (char *)dE + row * (ids[t] - v0);
        CHECK_RC(be->download(r, dst, row, err));
        if (dt == K3C_F64)
            row_add_f64(D, dyh + row * t, r);
        else
            row_add_f32(D, dyh + row * t, r);
        CHECK_RC(be->upload(dst, r, row, err));
    }
    return K3C_OK;
}

/* Host copies of the cross-entropy's inputs: logits [T, Vl], targets, weights (or NULL), lse [T]. */
typedef struct {
    void *logits, *lse;
    int32_t *targets;
    float *weight;
} xent_host;

static int xent_copies(k3c_tp *tp, k3c_dtype dt, int64_t T, int64_t Vl, const float *weight, const void *logits,
                       const int32_t *targets, const void *lse, size_t extra, xent_host *h, k3c_err *err) {
    const k3c_backend_f32 *be = tp->be;
    const size_t es = k3c_comm_dtype_size(dt), nl = es * (size_t)(T * Vl);
    CHECK_RC(host_room(tp, ROOM(nl) + ROOM(es * T) + 2 * ROOM(4 * T) + extra, err));
    h->logits = take(tp, nl);
    h->lse = take(tp, es * (size_t)T);
    h->targets = take(tp, sizeof(int32_t) * (size_t)T);
    h->weight = weight ? take(tp, sizeof(float) * (size_t)T) : NULL;
    CHECK_RC(be->download(h->logits, logits, nl, err));
    CHECK_RC(be->download(h->targets, targets, sizeof(int32_t) * (size_t)T, err));
    if (weight) CHECK_RC(be->download(h->weight, weight, sizeof(float) * (size_t)T, err));
    return lse ? be->download(h->lse, lse, es * (size_t)T, err) : K3C_OK;
}

static int tp_xent_fwd(void *ctx, k3c_dtype dt, int64_t T, int64_t Vl, double norm, const float *weight,
                       const void *logits, const int32_t *targets, void *lse, double *loss, k3c_err *err) {
    k3c_tp *tp = ctx;
    int64_t n = 0;
    double sum = 0;
    xent_host h;
    CHECK_RC(xent_copies(tp, dt, T, Vl, weight, logits, targets, NULL, 0, &h, err));
    CHECK_RC(xent_targets(tp, T, Vl, h.targets, &n, err));
    CHECK_RC(red_buffer(tp, 3 * T, err));
    CHECK_RC(dt == K3C_F64 ? xent_fwd_f64(tp, T, Vl, h.logits, h.targets, h.weight, h.lse, &sum, err)
                           : xent_fwd_f32(tp, T, Vl, h.logits, h.targets, h.weight, h.lse, &sum, err));
    *loss = n ? sum / (norm > 0 ? norm : (double)n) : 0.0;
    return tp->be->upload(lse, h.lse, k3c_comm_dtype_size(dt) * (size_t)T, err);
}

static int tp_xent_bwd(void *ctx, k3c_dtype dt, int64_t T, int64_t Vl, double norm, const float *weight,
                       const void *logits, const int32_t *targets, const void *lse, double dloss, void *dlogits,
                       k3c_err *err) {
    k3c_tp *tp = ctx;
    int64_t n = 0;
    const size_t nl = k3c_comm_dtype_size(dt) * (size_t)(T * Vl);
    xent_host h;
    CHECK_RC(xent_copies(tp, dt, T, Vl, weight, logits, targets, lse, ROOM(nl), &h, err));
    CHECK_RC(xent_targets(tp, T, Vl, h.targets, &n, err));
    if (n == 0) return K3C_OK;
    void *d = take(tp, nl);
    CHECK_RC(tp->be->download(d, dlogits, nl, err));
    const double g = dloss / (norm > 0 ? norm : (double)n);
    if (dt == K3C_F64)
        xent_bwd_f64(tp, T, Vl, h.logits, h.targets, h.weight, h.lse, g, d);
    else
        xent_bwd_f32(tp, T, Vl, h.logits, h.targets, h.weight, h.lse, g, d);
    return tp->be->upload(dlogits, d, nl, err);
}

int k3c_tp_init(k3c_tp *tp, k3c_comm *comm, const k3c_backend_f32 *be, const k3c_config *cfg, const k3c_param_table *t,
                k3c_err *err) {
    memset(tp, 0, sizeof *tp);
    CHECK_RC(k3c_comm_check_memory(comm, be->name, "tensor parallelism", err));
    CHECK_RC(k3c_tp_check(cfg, comm->size, "tensor parallelism", err));
    if (comm->size > K3C_TP_MAX)
        return k3c_errf(err, K3C_EUNSUPPORTED, "tensor parallelism over %d ranks (at most %d)", comm->size, K3C_TP_MAX);
    if (t->res.tp_size != comm->size || t->res.tp_rank != comm->rank)
        return k3c_errf(err, K3C_EINVAL,
                        "tensor parallelism: rank %d of a TP group of %d needs a model holding share %d of %d "
                        "(k3c_residency.tp_rank, tp_size), not share %d of %d",
                        comm->rank, comm->size, comm->rank, comm->size, t->res.tp_rank, t->res.tp_size);
    tp->comm = comm;
    tp->be = be;
    tp->rank = comm->rank;
    tp->size = comm->size;
    tp->hook =
        (k3c_tensor_parallel){tp->rank, tp->size, tp_sum, tp_embed_fwd, tp_embed_bwd, tp_xent_fwd, tp_xent_bwd, tp};
    return K3C_OK;
}

int k3c_tp_gather_room(k3c_tp *tp, size_t floats, k3c_err *err) {
    const size_t all = floats * (size_t)tp->size;
    int bad = 0;
    if (all > tp->stage_cap) { /* the group's shares, in the backend's memory (a device communicator's) */
        if (tp->stage) tp->be->free(tp->stage);
        free(tp->stage_host);
        tp->stage = tp->be->alloc(sizeof(float) * all);
        tp->stage_host = tp->rank == 0 ? malloc(sizeof(float) * all) : NULL; /* where rank 0 reads them */
        tp->stage_cap = tp->stage && (tp->rank != 0 || tp->stage_host) ? all : 0;
        bad = tp->stage_cap == 0;
    }
    int32_t any = bad; /* every rank learns whether one failed, so all skip the gathers alike */
    CHECK_RC(k3c_comm_allreduce(tp->comm, &any, &any, 1, K3C_I32, K3C_COMM_MAX, NULL, err));
    if (bad) return k3c_errf(err, K3C_ENOMEM, "tensor parallelism: room to gather %zu floats", all);
    return any ? k3c_errf(err, K3C_ENOMEM, "tensor parallelism: another rank of the group has no room to gather")
               : K3C_OK;
}

int k3c_tp_gather_entry(k3c_tp *tp, const k3c_param *p, const float *x, int64_t blocks, float *out, k3c_err *err) {
    const int R = tp->size;
    const size_t n = (size_t)p->numel * (size_t)blocks, all = n * (size_t)R;
    if (all > tp->stage_cap)
        return k3c_errf(err, K3C_EINVAL, "tensor parallelism: gathering %s needs k3c_tp_gather_room(%zu)", p->name, n);
    int64_t cnt[2 * K3C_TP_MAX], *dsp = cnt + K3C_TP_MAX;
    for (int r = 0; r < R; r++) cnt[r] = (int64_t)n, dsp[r] = r * (int64_t)n;
    float *h = tp->stage_host;
    CHECK_RC(tp->be->upload(tp->stage + (size_t)tp->rank * n, x, sizeof(float) * n, err));
    CHECK_RC(tp->be->sync(err));
    CHECK_RC(k3c_comm_allgather(tp->comm, NULL, tp->stage, cnt, dsp, K3C_F32, NULL, err));
    if (tp->rank != 0) return K3C_OK;
    CHECK_RC(tp->be->download(h, tp->stage, sizeof(float) * all, err));
    memset(out, 0, sizeof(float) * (size_t)p->whole_numel * (size_t)blocks); /* K3's A_log padding: no share's */
    for (int r = 0; r < R; r++)
        for (int64_t b = 0; b < blocks; b++)
            k3c_param_share_copy(p, r, sizeof(float), out + (size_t)b * (size_t)p->whole_numel,
                                 h + (size_t)r * n + (size_t)b * (size_t)p->numel, 1);
    return K3C_OK;
}

void k3c_tp_free(k3c_tp *tp) {
    if (tp->stage) tp->be->free(tp->stage);
    free(tp->stage_host);
    free(tp->red);
    free(tp->host);
    memset(tp, 0, sizeof *tp);
}

int k3c_tp_dedup_grads(const k3c_tp *tp, const k3c_param_table *t, void *g, k3c_dtype dt, k3c_err *err) {
    return k3c_tp_dedup_grads_range(tp, t, g, dt, 0, t->n, err);
}

int k3c_tp_dedup_grads_range(const k3c_tp *tp, const k3c_param_table *t, void *g, k3c_dtype dt, int e0, int e1,
                             k3c_err *err) {
    const size_t es = k3c_comm_dtype_size(dt);
    if (tp->rank == 0) return K3C_OK;
    for (int i = e0; i < e1; i++) /* zero bits are a zero of either precision: es / 4 floats an element */
        if (k3c_tp_split_of(t, i) == K3C_TP_SAME)
            CHECK_RC(tp->be->zero((float *)((char *)g + es * t->p[i].offset), t->p[i].numel * (int64_t)(es / 4), err));
    return K3C_OK;
}

int k3c_tp_mask_smax(k3c_tp *tp, const k3c_config *cfg, float *smax, k3c_err *err) {
    const int64_t H = cfg->mla_heads, Hl = H / tp->size, n = cfg->num_layers * H;
    if (!smax) return K3C_OK;
    CHECK_RC(host_room(tp, sizeof(float) * (size_t)n, err));
    float *s = take(tp, sizeof(float) * (size_t)n);
    CHECK_RC(tp->be->download(s, smax, sizeof(float) * (size_t)n, err));
    for (int64_t l = 0; l < cfg->num_layers; l++)
        for (int64_t h = 0; h < H; h++)
            if (h / Hl != tp->rank) s[l * H + h] = -FLT_MAX;
    return tp->be->upload(smax, s, sizeof(float) * (size_t)n, err);
}
