/* cp.c — context parallelism: the sequence split into contiguous token ranges, the KDA conv tails and chunk state
 * handed rank to rank (their gradients back), the MLA latent all-gathered and its gradient reduce-scattered.
 * Spec: docs/PARALLEL.md "Context parallelism", docs/MODEL.md §3.1 (short conv, KDA state), §4.2 (MLA latent). */
#include "parallel/cp.h"

#include "base/check.h"

#include <stdlib.h>
#include <string.h>

/* Message tags: per layer, 4 kinds × 3 convs plus the state pair. */
#define TAG(l, kind) ((l)*16 + (kind))

/* cu_keys' place in cu_ops: after cu_rest's T_cap + 1 entries, 256-byte aligned as the buffer itself */
static int64_t T_cap_keys(const k3c_cp *cp) { return (cp->T_cap + 64) / 64 * 64; }

/* Layer l's buffers, element `i` on (the model's precision: es bytes an element). */
static char *at(k3c_cp *cp, int l, int64_t i) { return cp->buf + (cp->layer_off[l] + i) * cp->es; }

/* A conv state [C, W−1] from src (rows [W−1, C] when rows, else the same layout), entries j < w1 − keep zeroed:
 * entry j is the input w1 − j tokens before the range, and those before the document's first token are no input. */
static void masked_tail(const k3c_cp *cp, const char *src, int rows, char *dst, int64_t C, int64_t w1, int64_t keep) {
    for (int64_t c = 0; c < C; c++)
        for (int64_t j = 0; j < w1; j++) {
            char *d = dst + (c * w1 + j) * cp->es;
            if (j >= w1 - keep)
                memcpy(d, src + (rows ? j * C + c : c * w1 + j) * cp->es, cp->es);
            else
                memset(d, 0, cp->es);
        }
}

/* Host scratch: [0, C·(W−1)) receives a neighbour's tail, the next block holds a host copy, the third what is sent. */
static char *scratch(k3c_cp *cp, int k, int64_t C, int64_t w1) { return cp->rows + (size_t)(k * C * w1) * cp->es; }

/* ---------------------------------------------------------------- short-conv tails */
static int conv_tail(void *ctx, int l, int i, const void *x, int64_t T, int64_t C, int W, void **state, k3c_err *err) {
    k3c_cp *cp = ctx;
    const k3c_context_exchange *cx = &cp->exchange;
    const int64_t w1 = W - 1;
    char *st = at(cp, l, 4 * cp->S + i * C * w1);
    *state = NULL;
    if (w1 <= 0) return K3C_OK;
    if (x) {
        k3c_comm_req *q = NULL;
        if (cx->cont_next)
            CHECK_RC(k3c_comm_send(cp->comm, (const char *)x + (T - w1) * C * cp->es, w1 * C, cp->dt, cp->rank + 1,
                                   TAG(l, i), &q, err));
        if (cx->cont_prev) { /* the masked tail is made on the host and goes where the conv op reads it */
            int e = k3c_comm_recv(cp->comm, scratch(cp, 0, C, w1), w1 * C, cp->dt, cp->rank - 1, TAG(l, i), NULL, err);
            if (!e) {
                masked_tail(cp, scratch(cp, 0, C, w1), 1, scratch(cp, 1, C, w1), C, w1, cp->prev_len);
                e = cp->mem.upload(st, scratch(cp, 1, C, w1), cp->es * (size_t)(C * w1), err);
            }
            if (e) {
                k3c_comm_wait(q, NULL);
                return e;
            }
        }
        CHECK_RC(k3c_comm_wait(q, err));
    }
    if (cx->cont_prev) *state = st;
    return K3C_OK;
}

static int conv_tail_bwd(void *ctx, int l, int i, const void *dstate, void *dx, int64_t T, int64_t C, int W,
                         k3c_err *err) {
    k3c_cp *cp = ctx;
    const k3c_context_exchange *cx = &cp->exchange;
    const int64_t w1 = W - 1;
    if (w1 <= 0) return K3C_OK;
    k3c_comm_req *q = NULL;
    char *send = scratch(cp, 2, C, w1), *tail = scratch(cp, 1, C, w1), *got = scratch(cp, 0, C, w1);
    if (cx->cont_prev && dstate) {
        CHECK_RC(cp->mem.download(tail, dstate, cp->es * (size_t)(C * w1), err));
        masked_tail(cp, tail, 0, send, C, w1, cp->prev_len);
        CHECK_RC(k3c_comm_send(cp->comm, send, w1 * C, cp->dt, cp->rank - 1, TAG(l, 4 + i), &q, err));
    }
    if (cx->cont_next) { /* the next rank's tail gradient into dx's last W − 1 rows (a host copy of them) */
        char *rows = (char *)dx + (size_t)((T - w1) * C) * cp->es;
        int e = k3c_comm_recv(cp->comm, got, w1 * C, cp->dt, cp->rank + 1, TAG(l, 4 + i), NULL, err);
        if (!e) e = cp->mem.download(tail, rows, cp->es * (size_t)(C * w1), err);
        if (e) {
            k3c_comm_wait(q, NULL);
            return e;
        }
        for (int64_t j = 0; j < w1; j++)
            for (int64_t c = 0; c < C; c++) {
                int64_t to = j * C + c, from = c * w1 + j;
                if (cp->es == 8)
                    ((double *)tail)[to] += ((const double *)got)[from];
                else
                    ((float *)tail)[to] += ((const float *)got)[from];
            }
        e = cp->mem.upload(rows, tail, cp->es * (size_t)(C * w1), err);
        if (e) {
            k3c_comm_wait(q, NULL);
            return e;
        }
    }
    return k3c_comm_wait(q, err);
}

/* ---------------------------------------------------------------- KDA state */
static void *kda_buf(void *ctx, int l, int which) {
    k3c_cp *cp = ctx;
    int live = which == K3C_CP_H0 || which == K3C_CP_DH0 ? cp->exchange.cont_prev : cp->exchange.cont_next;
    return live ? at(cp, l, which * cp->S) : NULL; /* DH0 was zeroed with the step's split (k3c_cp_split_batch) */
}

static int kda_pass(void *ctx, int l, int which, k3c_err *err) {
    k3c_cp *cp = ctx;
    char *b = at(cp, l, which * cp->S);
    switch (which) {
    case K3C_CP_H0: return k3c_comm_recv(cp->comm, b, cp->S, cp->dt, cp->rank - 1, TAG(l, 12), NULL, err);
    case K3C_CP_HT: return k3c_comm_send(cp->comm, b, cp->S, cp->dt, cp->rank + 1, TAG(l, 12), NULL, err);
    case K3C_CP_DHT: return k3c_comm_recv(cp->comm, b, cp->S, cp->dt, cp->rank + 1, TAG(l, 13), NULL, err);
    default: return k3c_comm_send(cp->comm, b, cp->S, cp->dt, cp->rank - 1, TAG(l, 13), NULL, err);
    }
}

/* ---------------------------------------------------------------- MLA latent */
static void *mla_buf(void *ctx, int l, int which) {
    k3c_cp *cp = ctx; /* the gradient (which 1) was zeroed with the step's split */
    return at(cp, l, which * cp->T_cap * cp->lkva);
}

static int mla_gather(void *ctx, int l, k3c_err *err) {
    k3c_cp *cp = ctx;
    return k3c_comm_allgather(cp->comm, NULL, at(cp, l, 0), cp->counts, cp->displs, cp->dt, NULL, err);
}

static int mla_scatter(void *ctx, int l, k3c_err *err) {
    k3c_cp *cp = ctx;
    char *d = at(cp, l, cp->T_cap * cp->lkva);
    CHECK_RC(k3c_comm_reduce_scatter(cp->comm, d, cp->rows, cp->counts, cp->dt, K3C_COMM_SUM, NULL, err));
    return cp->mem.upload(d + cp->displs[cp->rank] * cp->es, cp->rows, cp->es * (size_t)cp->counts[cp->rank], err);
}

/* The gradient buffers the backward adds into, zeroed once a step: every KDA layer's dh0, every MLA layer's latent
 * gradient. */
static int zero_grads(k3c_cp *cp, k3c_err *err) {
    const k3c_config *c = &cp->m->cfg;
    for (int l = 0; l < c->num_layers; l++) {
        const int kda = c->mixer[l] == K3C_MIXER_KDA;
        const int64_t off = kda ? K3C_CP_DH0 * cp->S : cp->T_cap * cp->lkva, n = kda ? cp->S : cp->T_cap * cp->lkva;
        void *p = at(cp, l, off);
        CHECK_RC(cp->dt == K3C_F64 ? cp->mem.zero64(p, n, err) : cp->mem.zero32(p, n, err));
    }
    return K3C_OK;
}

/* ---------------------------------------------------------------- set-up */
int k3c_cp_init(k3c_cp *cp, k3c_comm *comm, k3c_model *m, int64_t T_cap, k3c_err *err) {
    memset(cp, 0, sizeof *cp);
    const char *be;
    if (m->precision == K3C_F64) { /* the memory moves of the model's backend table (either precision) */
        const k3c_backend_f64 *b = k3c_model_backend_f64(m);
        be = b->name;
        cp->mem = (k3c_cp_mem){b->alloc, b->free, b->upload, b->download, NULL, b->zero};
    } else {
        const k3c_backend_f32 *b = k3c_model_backend_f32(m);
        be = b->name;
        cp->mem = (k3c_cp_mem){b->alloc, b->free, b->upload, b->download, b->zero, NULL};
    }
    CHECK_RC(k3c_comm_check_memory(comm, be, "context parallelism", err));
    const k3c_config *c = &m->cfg;
    cp->comm = comm;
    cp->rank = comm->rank;
    cp->size = comm->size;
    cp->m = m;
    cp->dt = m->precision;
    cp->es = m->precision == K3C_F64 ? 8 : 4;
    cp->T_cap = T_cap;
    const int64_t tp = m->tp ? m->tp->size : 1; /* tensor parallelism: this rank's KDA heads (the latent is whole) */
    cp->P = c->kda_heads / tp * c->kda_head_dim;
    cp->W = c->conv_kernel;
    cp->S = c->kda_heads / tp * c->kda_head_dim * c->kda_head_dim;
    cp->lkva = c->kv_lora_rank + c->qk_rope_dim;
    int L = c->num_layers;
    cp->layer_off = calloc((size_t)L, sizeof(int64_t));
    cp->counts = calloc(2 * (size_t)cp->size, sizeof(int64_t));
    cp->cu = malloc(3 * sizeof(int32_t) * (size_t)(T_cap + 1));
    int64_t total = 0, rows = 3 * (cp->W - 1) * cp->P; /* the conv tails' scratch, or one rank's latent rows */
    if (T_cap * cp->lkva > rows) rows = T_cap * cp->lkva;
    for (int l = 0; l < L && cp->layer_off; l++) {
        cp->layer_off[l] = total;
        total += c->mixer[l] == K3C_MIXER_KDA ? 4 * cp->S + 3 * cp->P * (cp->W - 1) : 2 * T_cap * cp->lkva;
    }
    cp->buf = cp->mem.alloc((size_t)(total ? total : 1) * cp->es);
    cp->cu_ops = cp->mem.alloc(2 * sizeof(int32_t) * (size_t)T_cap_keys(cp));
    cp->rows = calloc((size_t)(rows ? rows : 1), cp->es);
    if (!cp->layer_off || !cp->counts || !cp->cu || !cp->buf || !cp->cu_ops || !cp->rows) {
        k3c_cp_free(cp);
        return k3c_errf(err, K3C_ENOMEM, "context parallelism: buffers for sequences of %lld tokens", (long long)T_cap);
    }
    cp->displs = cp->counts + cp->size;
    cp->cu_rest = cp->cu + T_cap + 1;
    cp->cu_keys = cp->cu_rest + T_cap + 1;
    k3c_context_exchange *x = &cp->exchange;
    x->T_cap = T_cap;
    x->conv_tail = conv_tail;
    x->conv_tail_bwd = conv_tail_bwd;
    x->kda_buf = kda_buf;
    x->kda_pass = kda_pass;
    x->mla_buf = mla_buf;
    x->mla_gather = mla_gather;
    x->mla_scatter = mla_scatter;
    x->ctx = cp;
    return K3C_OK;
}

void k3c_cp_free(k3c_cp *cp) {
    free(cp->layer_off);
    free(cp->counts);
    free(cp->cu);
    if (cp->buf) cp->mem.free(cp->buf);
    if (cp->cu_ops) cp->mem.free(cp->cu_ops);
    free(cp->rows);
    memset(cp, 0, sizeof *cp);
}

/* ---------------------------------------------------------------- the batch split */

int64_t k3c_cp_range_len(const k3c_cp *cp, int64_t T) {
    return (cp->rank + 1) * T / cp->size - cp->rank * T / cp->size;
}

int k3c_cp_check_len(const k3c_cp *cp, int64_t T, k3c_err *err) {
    if (T / cp->size < cp->W - 1 || T < cp->size)
        return k3c_errf(err, K3C_EINVAL,
                        "context parallelism: %lld tokens for %d ranks: a range must hold at least one token and the "
                        "short conv's tail of %lld",
                        (long long)T, cp->size, (long long)(cp->W - 1));
    if (T > cp->T_cap)
        return k3c_errf(err, K3C_EINVAL, "context parallelism: a sequence of %lld tokens exceeds the %lld planned",
                        (long long)T, (long long)cp->T_cap);
    return K3C_OK;
}

int k3c_cp_range(k3c_cp *cp, k3c_model_batch *b, k3c_err *err) {
    const int C = cp->size;
    const int32_t *cu = b->cu_seqlens;
    for (int l = 0; l < cp->m->cfg.num_layers; l++)
        if (cp->m->recompute[l])
            return k3c_errf(err, K3C_EUNSUPPORTED, "context parallelism: layer %d recomputes its forward", l);
    /* rank r: tokens [r·Td/C, (r+1)·Td/C), equal ranges when C divides Td (at most one token apart) */
    const int64_t Td = b->T, s = cp->rank * Td / C, e = (cp->rank + 1) * Td / C, Tl = e - s;
    CHECK_RC(k3c_cp_check_len(cp, Td, err));
    int f = 0, z = 0; /* the pieces holding the range's first and last token */
    while (cu[f + 1] <= s) f++;
    while (cu[z + 1] < e) z++;
    k3c_context_exchange *x = &cp->exchange;
    int n = z - f + 1;
    cp->cu[0] = 0;
    for (int d = 1; d < n; d++) cp->cu[d] = (int32_t)(cu[f + d] - s);
    cp->cu[n] = (int32_t)Tl;
    for (int d = 0; d < n; d++) cp->cu_rest[d] = cp->cu[d + 1] - cp->cu[1];
    for (int d = 0; d <= z; d++) cp->cu_keys[d] = cu[d];
    cp->cu_keys[z + 1] = (int32_t)e;
    cp->prev_len = s - cu[f];
    x->start = s;
    x->first_len = cp->cu[1];
    x->cont_prev = cp->prev_len > 0;
    x->cont_next = e < Td && cu[z + 1] > e;
    x->cu_rest = cp->cu_rest;
    x->cu_rest_ops = cp->cu_ops;
    x->T_keys = e;
    x->n_docs_keys = z + 1;
    x->cu_keys = cp->cu_ops + T_cap_keys(cp);
    CHECK_RC(cp->mem.upload(cp->cu_ops, cp->cu_rest, sizeof(int32_t) * (size_t)n, err)); /* what the ops read */
    CHECK_RC(cp->mem.upload(cp->cu_ops + T_cap_keys(cp), cp->cu_keys, sizeof(int32_t) * (size_t)(z + 2), err));
    CHECK_RC(zero_grads(cp, err));
    for (int r = 0; r < C; r++)
        cp->displs[r] = r * Td / C * cp->lkva, cp->counts[r] = (r + 1) * Td / C * cp->lkva - cp->displs[r];
    b->T = Tl;
    b->n_docs = n;
    b->ids += s;
    b->targets += s;
    b->cu_seqlens = cp->cu;
    return K3C_OK;
}

/* The ranks of a data-parallel part: cp·tp consecutive ones of the DP group (TP innermost, then CP). */
static int part_ranks(const k3c_cp *cp, const k3c_dp *dp) { return cp->size * (dp->tpcomm ? dp->tpcomm->size : 1); }

int k3c_cp_part(k3c_cp *cp, k3c_dp *dp, k3c_model_batch *b, k3c_err *err) {
    const int C = cp->size, R = part_ranks(cp, dp);
    if (dp->size % R || dp->rank % R / (R / C) != cp->rank)
        return k3c_errf(err, K3C_EINVAL,
                        "context parallelism: the CP group must be the ranks sharing rank / (cp·tp) and rank %% tp");
    if (b->n_embeds || b->weight)
        return k3c_errf(err, K3C_EINVAL, "context parallelism: embedding overrides and loss weights are not split yet");
    return k3c_dp_take_part(dp, b, dp->rank / R, dp->size / R, C, "context parallelism", err);
}

int k3c_cp_split_batch(k3c_cp *cp, k3c_dp *dp, k3c_model_batch *b, k3c_err *err) {
    CHECK_RC(k3c_cp_part(cp, dp, b, err));
    const int R = part_ranks(cp, dp);
    int e = k3c_cp_range(cp, b, err);
    if (e) return err ? k3c_err_wrap(err, "data-parallel part %d of %d", dp->rank / R, dp->size / R) : e;
    return k3c_dp_local_tokens(dp, dp->replica ? 0 : b->T, err); /* a TP group's tokens once */
}
