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

static int tp_sum(void *ctx, float *x, int64_t n, k3c_err *err) {
    k3c_tp *tp = ctx;
    return k3c_comm_allreduce(tp->comm, x, x, n, K3C_F32, K3C_COMM_SUM, NULL, err);
}

static int check_ids(const int32_t *ids, int64_t T, int64_t V, const char *op, k3c_err *err) {
    for (int64_t t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= V)
            return k3c_errf(err, K3C_EINVAL, "%s: position %lld has id %d outside [0, %lld)", op, (long long)t, ids[t],
                            (long long)V);
    return K3C_OK;
}

/* y[t] = E[ids[t]] from the rank holding that vocabulary row (zero rows elsewhere), summed over the group. */
static int tp_embed_fwd(void *ctx, int64_t T, int64_t V, int64_t D, const int32_t *ids, const float *E, float *y,
                        k3c_err *err) {
    k3c_tp *tp = ctx;
    CHECK_RC(check_ids(ids, T, V, "embedding (tensor-parallel)", err));
    const int64_t v0 = tp->rank * (V / tp->size), v1 = v0 + V / tp->size;
    for (int64_t t = 0; t < T; t++) {
        if (ids[t] >= v0 && ids[t] < v1)
            memcpy(y + t * D, E + ids[t] * D, sizeof(float) * (size_t)D);
        else
            memset(y + t * D, 0, sizeof(float) * (size_t)D);
    }
    return tp_sum(tp, y, T * D, err);
}

/* dE[ids[t]] += dy[t] for the rows this rank holds, in token order (as the single-process op). */
static int tp_embed_bwd(void *ctx, int64_t T, int64_t V, int64_t D, const int32_t *ids, const float *dy, float *dE,
                        k3c_err *err) {
    k3c_tp *tp = ctx;
    CHECK_RC(check_ids(ids, T, V, "embedding backward (tensor-parallel)", err));
    const int64_t v0 = tp->rank * (V / tp->size), v1 = v0 + V / tp->size;
    for (int64_t t = 0; t < T; t++)
        if (ids[t] >= v0 && ids[t] < v1)
            for (int64_t j = 0; j < D; j++) dE[ids[t] * D + j] += dy[t * D + j];
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

/* The cross-entropy over logits split by vocabulary rows: per token the maximum over the group (all-reduce max), the
 * sum of exponentials and the target's logit from its owner (one all-reduce sum), then lse and the loss as the
 * single-process op computes them (ops/xent.c): every rank gets the whole loss and lse. */
static int tp_xent_fwd(void *ctx, int64_t T, int64_t Vl, double norm, const float *weight, const float *logits,
                       const int32_t *targets, float *lse, double *loss, k3c_err *err) {
    k3c_tp *tp = ctx;
    int64_t n = 0;
    CHECK_RC(xent_targets(tp, T, Vl, targets, &n, err));
    if (3 * T > tp->red_cap) {
        free(tp->red);
        tp->red = malloc(sizeof(double) * (size_t)(3 * T));
        tp->red_cap = tp->red ? 3 * T : 0;
        if (!tp->red) return k3c_errf(err, K3C_ENOMEM, "tensor parallelism: cross-entropy reductions");
    }
    double *mx = tp->red, *se = mx + T, *xt = se + T;
    const int64_t v0 = tp->rank * Vl;
    for (int64_t t = 0; t < T; t++) {
        const float *x = logits + t * Vl;
        float m = x[0];
        for (int64_t j = 1; j < Vl; j++) m = x[j] > m ? x[j] : m;
        mx[t] = m;
    }
    CHECK_RC(k3c_comm_allreduce(tp->comm, mx, mx, T, K3C_F64, K3C_COMM_MAX, NULL, err));
    for (int64_t t = 0; t < T; t++) {
        const float *x = logits + t * Vl, m = (float)mx[t];
        double s = 0;
        for (int64_t j = 0; j < Vl; j++) s += expf(x[j] - m);
        se[t] = s;
        xt[t] = targets[t] >= v0 && targets[t] < v0 + Vl ? x[targets[t] - v0] : 0;
    }
    CHECK_RC(k3c_comm_allreduce(tp->comm, se, se, 2 * T, K3C_F64, K3C_COMM_SUM, NULL, err));
    double sum = 0;
    for (int64_t t = 0; t < T; t++) {
        double l = mx[t] + log(se[t]);
        lse[t] = (float)l;
        if (targets[t] >= 0) sum += weight ? weight[t] * (l - xt[t]) : l - xt[t];
    }
    *loss = n ? sum / (norm > 0 ? norm : (double)n) : 0.0;
    return K3C_OK;
}

/* This rank's rows of dlogits: softmax from the global lse, minus the target's one-hot on its owner (no
 * communication). */
static int tp_xent_bwd(void *ctx, int64_t T, int64_t Vl, double norm, const float *weight, const float *logits,
                       const int32_t *targets, const float *lse, double dloss, float *dlogits, k3c_err *err) {
    k3c_tp *tp = ctx;
    int64_t n = 0;
    CHECK_RC(xent_targets(tp, T, Vl, targets, &n, err));
    if (n == 0) return K3C_OK;
    const double g = dloss / (norm > 0 ? norm : (double)n);
    const int64_t v0 = tp->rank * Vl;
    for (int64_t t = 0; t < T; t++) {
        if (targets[t] < 0) continue;
        const float *x = logits + t * Vl;
        float *d = dlogits + t * Vl;
        const double gt = weight ? g * weight[t] : g;
        for (int64_t j = 0; j < Vl; j++) d[j] += (float)(gt * expf(x[j] - lse[t]));
        if (targets[t] >= v0 && targets[t] < v0 + Vl) d[targets[t] - v0] -= (float)gt;
    }
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

void k3c_tp_dedup_grads(const k3c_tp *tp, const k3c_param_table *t, float *g) {
    if (tp->rank == 0) return;
    for (int i = 0; i < t->n; i++)
        if (tp->split[i] == K3C_TP_SAME) memset(g + t->p[i].offset, 0, sizeof(float) * (size_t)t->p[i].numel);
}

void k3c_tp_mask_smax(const k3c_tp *tp, const k3c_config *cfg, float *smax) {
    const int64_t H = cfg->mla_heads, Hl = H / tp->size;
    for (int64_t l = 0; smax && l < cfg->num_layers; l++)
        for (int64_t h = 0; h < H; h++)
            if (h / Hl != tp->rank) smax[l * H + h] = -FLT_MAX;
}
