/* tp.c — tensor parallelism: the model's hook (sums over the TP group, the vocabulary-parallel embedding and
 * cross-entropy), the layout checks, and the gradient bookkeeping of replicated entries before the sum over ranks.
 * Spec: docs/PARALLEL.md "Tensor parallelism". */
#include "dist/tp.h"

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
 * Embedding: y[t] = E[ids[t]] from the rank holding that row (zero rows elsewhere; the caller sums over the group);
 * its backward dE[ids[t]] += dy[t] for this rank's rows in token order. Cross-entropy over logits split by vocabulary
 * rows: per token the maximum over the group (all-reduce max), the sum of exponentials and the target's logit from its
 * owner (one all-reduce sum), then lse and the loss as the single-process op: every rank gets the whole loss and lse.
 * Its backward needs no communication: this rank's rows of the softmax from the global lse, the one-hot on the
 * target's owner. */
#define TP_LOOPS(real, S, EXP)                                                                                         \
    static void embed_rows_##S(int64_t T, int64_t D, int64_t v0, int64_t v1, const int32_t *ids, const real *E,        \
                               real *y) {                                                                              \
        for (int64_t t = 0; t < T; t++) {                                                                              \
            if (ids[t] >= v0 && ids[t] < v1)                                                                           \
                memcpy(y + t * D, E + ids[t] * D, sizeof(real) * (size_t)D);                                           \
            else                                                                                                       \
                memset(y + t * D, 0, sizeof(real) * (size_t)D);                                                        \
        }                                                                                                              \
    }                                                                                                                  \
    static void embed_grad_##S(int64_t T, int64_t D, int64_t v0, int64_t v1, const int32_t *ids, const real *dy,       \
                               real *dE) {                                                                             \
        for (int64_t t = 0; t < T; t++)                                                                                \
            if (ids[t] >= v0 && ids[t] < v1)                                                                           \
                for (int64_t j = 0; j < D; j++) dE[ids[t] * D + j] += dy[t * D + j];                                   \
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

static int tp_embed_fwd(void *ctx, k3c_dtype dt, int64_t T, int64_t V, int64_t D, const int32_t *ids, const void *E,
                        void *y, k3c_err *err) {
    k3c_tp *tp = ctx;
    int64_t v0 = 0, v1 = 0;
    CHECK_RC(vocab_rows(tp, ids, T, V, "embedding", &v0, &v1, err));
    if (dt == K3C_F64)
        embed_rows_f64(T, D, v0, v1, ids, E, y);
    else
        embed_rows_f32(T, D, v0, v1, ids, E, y);
    return tp_sum(tp, dt, y, T * D, err);
}

static int tp_embed_bwd(void *ctx, k3c_dtype dt, int64_t T, int64_t V, int64_t D, const int32_t *ids, const void *dy,
                        void *dE, k3c_err *err) {
    k3c_tp *tp = ctx;
    int64_t v0 = 0, v1 = 0;
    CHECK_RC(vocab_rows(tp, ids, T, V, "embedding backward", &v0, &v1, err));
    if (dt == K3C_F64)
        embed_grad_f64(T, D, v0, v1, ids, dy, dE);
    else
        embed_grad_f32(T, D, v0, v1, ids, dy, dE);
    return K3C_OK;
}

static int tp_xent_fwd(void *ctx, k3c_dtype dt, int64_t T, int64_t Vl, double norm, const float *weight,
                       const void *logits, const int32_t *targets, void *lse, double *loss, k3c_err *err) {
    k3c_tp *tp = ctx;
    int64_t n = 0;
    double sum = 0;
    CHECK_RC(xent_targets(tp, T, Vl, targets, &n, err));
    CHECK_RC(red_buffer(tp, 3 * T, err));
    CHECK_RC(dt == K3C_F64 ? xent_fwd_f64(tp, T, Vl, logits, targets, weight, lse, &sum, err)
                           : xent_fwd_f32(tp, T, Vl, logits, targets, weight, lse, &sum, err));
    *loss = n ? sum / (norm > 0 ? norm : (double)n) : 0.0;
    return K3C_OK;
}

static int tp_xent_bwd(void *ctx, k3c_dtype dt, int64_t T, int64_t Vl, double norm, const float *weight,
                       const void *logits, const int32_t *targets, const void *lse, double dloss, void *dlogits,
                       k3c_err *err) {
    k3c_tp *tp = ctx;
    int64_t n = 0;
    CHECK_RC(xent_targets(tp, T, Vl, targets, &n, err));
    if (n == 0) return K3C_OK;
    const double g = dloss / (norm > 0 ? norm : (double)n);
    if (dt == K3C_F64)
        xent_bwd_f64(tp, T, Vl, logits, targets, weight, lse, g, dlogits);
    else
        xent_bwd_f32(tp, T, Vl, logits, targets, weight, lse, g, dlogits);
    return K3C_OK;
}

int k3c_tp_init(k3c_tp *tp, k3c_comm *comm, const k3c_backend_f32 *be, const k3c_config *cfg, const k3c_param_table *t,
                k3c_err *err) {
    memset(tp, 0, sizeof *tp);
    if (strcmp(be->name, "cpu"))
        return k3c_errf(err, K3C_EUNSUPPORTED,
                        "tensor parallelism on the %s backend needs a device communicator (NCCL); the %s communicator "
                        "moves host memory",
                        be->name, comm->ops->name);
    CHECK_RC(k3c_tp_check(cfg, comm->size, "tensor parallelism", err));
    tp->comm = comm;
    tp->rank = comm->rank;
    tp->size = comm->size;
    tp->n_entries = t->n;
    tp->split = malloc((size_t)(t->n > 0 ? t->n : 1));
    if (!tp->split) return k3c_errf(err, K3C_ENOMEM, "tensor parallelism: out of memory");
    for (int i = 0; i < t->n; i++) tp->split[i] = (uint8_t)k3c_tp_split_of(t, i);
    tp->hook =
        (k3c_tensor_parallel){tp->rank, tp->size, tp_sum, tp_embed_fwd, tp_embed_bwd, tp_xent_fwd, tp_xent_bwd, tp};
    return K3C_OK;
}

void k3c_tp_free(k3c_tp *tp) {
    free(tp->split);
    free(tp->red);
    memset(tp, 0, sizeof *tp);
}

void k3c_tp_dedup_grads(const k3c_tp *tp, const k3c_param_table *t, void *g, k3c_dtype dt) {
    const size_t es = k3c_comm_dtype_size(dt);
    if (tp->rank == 0) return;
    for (int i = 0; i < t->n; i++)
        if (tp->split[i] == K3C_TP_SAME) memset((char *)g + es * t->p[i].offset, 0, es * (size_t)t->p[i].numel);
}

void k3c_tp_mask_smax(const k3c_tp *tp, const k3c_config *cfg, float *smax) {
    const int64_t H = cfg->mla_heads, Hl = H / tp->size;
    for (int64_t l = 0; smax && l < cfg->num_layers; l++)
        for (int64_t h = 0; h < H; h++)
            if (h / Hl != tp->rank) smax[l * H + h] = -FLT_MAX;
}
