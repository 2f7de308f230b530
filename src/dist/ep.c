/* ep.c — expert parallelism: dropless dispatch of every routed slot's token row to the rank holding its expert, the
 * local experts run on what arrived (the backend's routed-expert op with k = 1), the outputs sent back and combined
 * with the gate weights on the token's own rank; the backward sends the weighted output gradients the same way and
 * returns the input gradients. Spec: docs/PARALLEL.md "Expert parallelism", docs/MODEL.md §9.2. */
#include "dist/ep.h"

#include "base/check.h"

#include <stdlib.h>
#include <string.h>

/* *p holds at least n elements of `size` bytes (grown, contents dropped; 64-aligned, zeroed): host memory. */
static int grow(void **p, size_t *cap, size_t n, size_t size, k3c_err *err) {
    if (n <= *cap && *p) return K3C_OK;
    k3c_aligned_free(*p);
    *p = k3c_aligned_alloc((n ? n : 1) * size);
    *cap = *p ? n : 0;
    return *p ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "expert parallelism: %zu bytes", n * size);
}

/* The same in the backend's memory (what its expert op reads and writes: device memory on a GPU). */
static int grow_be(const k3c_backend_f32 *be, void **p, size_t *cap, size_t n, size_t size, k3c_err *err) {
    if (n <= *cap && *p) return K3C_OK;
    if (*p) be->free(*p);
    *p = be->alloc((n ? n : 1) * size);
    *cap = *p ? n : 0;
    return *p ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "expert parallelism: %zu bytes of %s memory", n * size, be->name);
}

/* ep->ones [R] (backend memory) ← 1: the unit gate weights of the received rows, one slot each. */
static int unit_gates(k3c_ep *ep, int64_t R, k3c_err *err) {
    CHECK_RC(grow_be(ep->be, (void **)&ep->ones, &ep->ones_cap, (size_t)R, sizeof(float), err));
    CHECK_RC(grow((void **)&ep->rows, &ep->rows_cap, (size_t)R, sizeof(float), err));
    for (int64_t r = 0; r < R; r++) ep->rows[r] = 1.0f;
    return ep->be->upload(ep->ones, ep->rows, sizeof(float) * (size_t)R, err);
}

/* Exchanges rows: send[scount[p]·width] to each p, recv[rcount[p]·width] from each p, in rank order. */
static int exchange(k3c_ep *ep, const void *send, const int64_t *scount, void *recv, const int64_t *rcount,
                    int64_t width, k3c_dtype t, k3c_err *err) {
    int P = ep->size;
    int64_t *sc = ep->tmp, *sd = sc + P, *rc = sd + P, *rd = rc + P, so = 0, ro = 0;
    for (int p = 0; p < P; p++) {
        sc[p] = scount[p] * width, sd[p] = so, so += sc[p];
        rc[p] = rcount[p] * width, rd[p] = ro, ro += rc[p];
    }
    return k3c_comm_alltoall(ep->comm, send, sc, sd, recv, rc, rd, t, NULL, err);
}

/* The send order of this layer's live slots (grouped by the rank of their expert) and the row counts both ways. */
static int plan(k3c_ep *ep, k3c_ep_layer *L, int64_t T, int64_t k, const int32_t *ids, k3c_err *err) {
    int P = ep->size;
    size_t S = (size_t)(T * k);
    CHECK_RC(grow((void **)&L->order, &L->cap_slots, S, sizeof(int32_t) * 2, err));
    L->pos = L->order + L->cap_slots;
    int64_t *off = ep->tmp; /* [P + 1] running offsets */
    memset(L->scount, 0, sizeof(int64_t) * (size_t)P);
    for (size_t i = 0; i < S; i++) {
        if (ids[i] < -1 || ids[i] >= ep->E)
            return k3c_errf(err, K3C_EINVAL, "expert parallelism: expert id %d outside [-1, %lld)", ids[i],
                            (long long)ep->E);
        if (ids[i] >= 0) L->scount[ids[i] / ep->local]++;
    }
    off[0] = 0;
    for (int p = 0; p < P; p++) off[p + 1] = off[p] + L->scount[p];
    for (size_t i = 0; i < S; i++) { /* stable: ascending slot id inside a destination */
        L->pos[i] = -1;
        if (ids[i] < 0) continue;
        int64_t row = off[ids[i] / ep->local]++;
        L->pos[i] = (int32_t)row;
        L->order[row] = (int32_t)i;
    }
    int64_t *one = ep->tmp + P + 1, *iota = one + P; /* one count per peer */
    for (int p = 0; p < P; p++) one[p] = 1, iota[p] = p;
    CHECK_RC(k3c_comm_alltoall(ep->comm, L->scount, one, iota, L->rcount, one, iota, K3C_I64, NULL, err));
    L->R = 0;
    for (int p = 0; p < P; p++) L->R += L->rcount[p];
    return K3C_OK;
}

/* Where this rank's experts start in the stacked w1 / w3 / w2 (and their gradients) the model passes: at slice 0 when
 * the model holds only them (expert residency, ep->resident), else at slice rank·local of the whole stack. */
static size_t local_experts_at(const k3c_ep *ep, const k3c_moe_sizes *s) {
    return ep->resident ? 0 : (size_t)(ep->rank * ep->local * s->inter * s->dim);
}

/* The local experts' op sizes for R received rows (one slot each) and its workspace. */
static int local_sizes(k3c_ep *ep, const k3c_moe_sizes *s, int64_t R, k3c_moe_sizes *ls, k3c_err *err) {
    *ls = (k3c_moe_sizes){R, s->dim, s->inter, ep->local, 1, s->act};
    return grow_be(ep->be, &ep->ws, &ep->ws_bytes, ep->be->moe_workspace(ls), 1, err);
}

/* The host works on copies of the model's tensors (the backend's memory may be a device's): the routing plan, the
 * row gathers and the combine run on the host, the local experts in the backend's memory; the communicator moves
 * either kind. */
static int ep_fwd(void *ctx, int l, int real_bytes, const k3c_moe_sizes *s, const void *xv, const int32_t *ids_be,
                  const void *wv, const void *w1, const void *w3, const void *w2, void *yv, k3c_err *err) {
    k3c_ep *ep = ctx;
    const k3c_backend_f32 *be = ep->be;
    if (real_bytes != (int)sizeof(float) || l < 0 || l >= ep->n_layers || s->experts != ep->E)
        return k3c_errf(err, K3C_EUNSUPPORTED, "expert parallelism: float32 models of %lld experts only",
                        (long long)ep->E);
    k3c_ep_layer *L = &ep->layer[l];
    const int64_t T = s->tokens, k = s->top_k, D = s->dim;
    L->T = T, L->k = k, L->D = D;
    CHECK_RC(grow((void **)&ep->host, &ep->host_cap, (size_t)(T * D + 2 * T * k), sizeof(float), err));
    float *x = ep->host, *w = x + T * D, *y = x; /* y overwrites x once the rows are gathered */
    int32_t *ids = (int32_t *)(w + T * k);
    CHECK_RC(be->download(ids, ids_be, sizeof(int32_t) * (size_t)(T * k), err));
    CHECK_RC(be->download(x, xv, sizeof(float) * (size_t)(T * D), err));
    CHECK_RC(be->download(w, wv, sizeof(float) * (size_t)(T * k), err));
    CHECK_RC(plan(ep, L, T, k, ids, err));
    const int64_t nsend = T * k, R = L->R; /* rows out (live or not: dead slots have no row) and rows in */
    /* rows: the sent rows and their expert ids */
    CHECK_RC(grow((void **)&ep->rows, &ep->rows_cap, (size_t)((nsend > R ? nsend : R) * (D + 1)), sizeof(float), err));
    CHECK_RC(grow_be(be, (void **)&L->xr, &L->cap_xr, (size_t)(R * D + R), sizeof(float), err));
    CHECK_RC(grow((void **)&L->back, &L->cap_back, (size_t)(nsend * D), sizeof(float), err));
    L->idr = (int32_t *)(L->xr + R * D);
    int64_t live = 0;
    for (int p = 0; p < ep->size; p++) live += L->scount[p];
    int32_t *sid = (int32_t *)(ep->rows + live * D); /* the local expert id of each row, after the rows */
    for (int64_t r = 0; r < live; r++) {
        int32_t slot = L->order[r], e = ids[slot];
        memcpy(ep->rows + r * D, x + (slot / k) * D, sizeof(float) * (size_t)D);
        sid[r] = (int32_t)(e % ep->local);
    }
    CHECK_RC(exchange(ep, ep->rows, L->scount, L->xr, L->rcount, D, K3C_F32, err));
    CHECK_RC(exchange(ep, sid, L->scount, L->idr, L->rcount, 1, K3C_I32, err));
    k3c_moe_sizes ls;
    CHECK_RC(local_sizes(ep, s, R, &ls, err));
    CHECK_RC(grow_be(be, &L->saved, &L->cap_saved, be->moe_saved_bytes(&ls), 1, err));
    CHECK_RC(unit_gates(ep, R, err));
    CHECK_RC(grow_be(be, (void **)&ep->out, &ep->out_cap, (size_t)(R * D), sizeof(float), err));
    const size_t off = local_experts_at(ep, s);
    if (R)
        CHECK_RC(be->moe_fwd(be->ctx, &ls, L->xr, L->idr, ep->ones, (const float *)w1 + off, (const float *)w3 + off,
                             (const float *)w2 + off, ep->out, L->saved, ep->ws, err));
    CHECK_RC(exchange(ep, ep->out, L->rcount, L->back, L->scount, D, K3C_F32, err));
    /* combine in slot order, as the one-process op does (ops/moe.c k3c_moe_combine) */
    for (int64_t t = 0; t < T; t++) {
        float *yt = y + t * D;
        memset(yt, 0, sizeof(float) * (size_t)D);
        for (int64_t j = 0; j < k; j++) {
            int32_t r = L->pos[t * k + j];
            if (r < 0) continue;
            const float p = w[t * k + j], *src = L->back + (int64_t)r * D;
            for (int64_t d = 0; d < D; d++) yt[d] += p * src[d];
        }
    }
    return be->upload(yv, y, sizeof(float) * (size_t)(T * D), err);
}

static int ep_bwd(void *ctx, int l, int real_bytes, const k3c_moe_sizes *s, const void *xv, const int32_t *ids,
                  const void *wv, const void *w1, const void *w3, const void *w2, const void *dyv, void *dxv, void *dw1,
                  void *dw3, void *dw2, void *dwv, k3c_err *err) {
    k3c_ep *ep = ctx;
    const k3c_backend_f32 *be = ep->be;
    const k3c_ep_layer *L = l >= 0 && l < ep->n_layers ? &ep->layer[l] : NULL;
    if (real_bytes != (int)sizeof(float) || !L || L->T != s->tokens || L->k != s->top_k || L->D != s->dim)
        return k3c_errf(err, K3C_EINVAL, "expert parallelism: layer %d backward without its forward", l);
    const int64_t T = L->T, k = L->k, D = L->D, R = L->R;
    CHECK_RC(grow((void **)&ep->host, &ep->host_cap, (size_t)(2 * T * D + 2 * T * k), sizeof(float), err));
    float *dy = ep->host, *dx = dy + T * D, *w = dx + T * D, *dw = w + T * k; /* host copies */
    CHECK_RC(be->download(dy, dyv, sizeof(float) * (size_t)(T * D), err));
    CHECK_RC(be->download(w, wv, sizeof(float) * (size_t)(T * k), err));
    int64_t live = 0;
    for (int p = 0; p < ep->size; p++) live += L->scount[p];
    if (dwv) { /* the gate weights' gradient from the expert outputs (before back is reused) */
        CHECK_RC(be->download(dw, dwv, sizeof(float) * (size_t)(T * k), err));
        for (int64_t i = 0; i < T * k; i++) {
            int32_t r = L->pos[i];
            if (r < 0) continue;
            const float *o = L->back + (int64_t)r * D, *g = dy + (i / k) * D;
            float acc = 0;
            for (int64_t d = 0; d < D; d++) acc += g[d] * o[d];
            dw[i] += acc;
        }
        CHECK_RC(be->upload(dwv, dw, sizeof(float) * (size_t)(T * k), err));
    }
    for (int64_t r = 0; r < live; r++) { /* each slot's output gradient: its gate weight times the token's dy */
        int32_t slot = L->order[r];
        const float p = w[slot], *g = dy + (slot / k) * D;
        float *o = ep->rows + r * D;
        for (int64_t d = 0; d < D; d++) o[d] = p * g[d];
    }
    CHECK_RC(grow_be(be, (void **)&ep->dyr, &ep->dyr_cap, (size_t)(R * D), sizeof(float), err));
    CHECK_RC(exchange(ep, ep->rows, L->scount, ep->dyr, L->rcount, D, K3C_F32, err));
    k3c_moe_sizes ls;
    CHECK_RC(local_sizes(ep, s, R, &ls, err));
    CHECK_RC(grow_be(be, (void **)&ep->out, &ep->out_cap, (size_t)(R * D), sizeof(float), err));
    float *dxr = ep->out;
    CHECK_RC(be->zero(dxr, R * D, err));
    CHECK_RC(unit_gates(ep, R, err));
    const size_t off = local_experts_at(ep, s);
    if (R)
        CHECK_RC(be->moe_bwd(be->ctx, &ls, L->xr, L->idr, ep->ones, (const float *)w1 + off, (const float *)w3 + off,
                             (const float *)w2 + off, L->saved, ep->dyr, dxr, (float *)dw1 + off, (float *)dw3 + off,
                             (float *)dw2 + off, NULL, ep->ws, err));
    CHECK_RC(exchange(ep, dxr, L->rcount, L->back, L->scount, D, K3C_F32, err));
    if (!dxv) return K3C_OK;
    CHECK_RC(be->download(dx, dxv, sizeof(float) * (size_t)(T * D), err));
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int32_t r = L->pos[t * k + j];
            if (r < 0) continue;
            const float *src = L->back + (int64_t)r * D;
            for (int64_t d = 0; d < D; d++) dx[t * D + d] += src[d];
        }
    (void)xv, (void)ids;
    return be->upload(dxv, dx, sizeof(float) * (size_t)(T * D), err);
}

int k3c_ep_init(k3c_ep *ep, k3c_comm *comm, const k3c_backend_f32 *be, const k3c_config *cfg, k3c_err *err) {
    memset(ep, 0, sizeof *ep);
    if (cfg->num_experts < 1 || cfg->num_experts % comm->size)
        return k3c_errf(err, K3C_ECONFIG, "expert parallelism: %d ranks do not divide the %lld routed experts",
                        comm->size, (long long)cfg->num_experts);
    CHECK_RC(k3c_comm_check_memory(comm, be->name, "expert parallelism", err));
    ep->comm = comm;
    ep->rank = comm->rank;
    ep->size = comm->size;
    ep->E = cfg->num_experts;
    ep->local = ep->E / ep->size;
    ep->be = be;
    ep->n_layers = (int)cfg->num_layers;
    ep->layer = calloc((size_t)ep->n_layers, sizeof *ep->layer);
    ep->tmp = calloc((size_t)(4 * ep->size + 1), sizeof(int64_t));
    int64_t *counts = calloc((size_t)(2 * ep->size * ep->n_layers), sizeof(int64_t));
    if (!ep->layer || !ep->tmp || !counts) {
        free(counts);
        k3c_ep_free(ep);
        return k3c_errf(err, K3C_ENOMEM, "expert parallelism: out of memory");
    }
    for (int l = 0; l < ep->n_layers; l++) {
        ep->layer[l].scount = counts + (size_t)(2 * l * ep->size);
        ep->layer[l].rcount = ep->layer[l].scount + ep->size;
    }
    ep->exchange = (k3c_expert_exchange){ep_fwd, ep_bwd, ep};
    return K3C_OK;
}

void k3c_ep_experts(const k3c_config *cfg, int rank, int size, int64_t *e0, int64_t *n) {
    *n = cfg->num_experts / size;
    *e0 = (int64_t)rank * *n;
}

void k3c_ep_free(k3c_ep *ep) {
    const k3c_backend_f32 *be = ep->be;
    for (int l = 0; ep->layer && l < ep->n_layers; l++) {
        k3c_ep_layer *L = &ep->layer[l];
        k3c_aligned_free(L->order);
        k3c_aligned_free(L->back);
        if (L->xr) be->free(L->xr);
        if (L->saved) be->free(L->saved);
    }
    if (ep->layer) free(ep->layer[0].scount);
    free(ep->layer);
    free(ep->tmp);
    void *dev[] = {ep->ws, ep->out, ep->dyr, ep->ones};
    for (int i = 0; i < 4; i++)
        if (dev[i]) be->free(dev[i]);
    k3c_aligned_free(ep->rows);
    k3c_aligned_free(ep->host);
    memset(ep, 0, sizeof *ep);
}
