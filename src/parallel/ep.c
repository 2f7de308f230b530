/* ep.c — expert parallelism: dropless dispatch of every routed slot's token row to the rank holding its expert, the
 * local experts run on what arrived (the backend's routed-expert op with k = 1), the outputs sent back and combined
 * with the gate weights on the token's own rank; the backward sends the weighted output gradients the same way and
 * returns the input gradients. Spec: docs/PARALLEL.md "Expert parallelism", docs/MODEL.md §9.2. */
#include "parallel/ep.h"

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

/* ep->ones [R] (backend memory) ← 1: the unit gate weights of the received rows, one slot each. Filled (by an upload)
 * only when it grows: the buffer keeps its ones between layers. */
static int unit_gates(k3c_ep *ep, int64_t R, k3c_err *err) {
    if ((size_t)R <= ep->ones_cap && ep->ones) return K3C_OK;
    CHECK_RC(grow_be(ep->be, (void **)&ep->ones, &ep->ones_cap, (size_t)R, sizeof(float), err));
    float *one = malloc(sizeof(float) * ep->ones_cap);
    if (!one) return k3c_errf(err, K3C_ENOMEM, "expert parallelism: %zu unit gates", ep->ones_cap);
    for (size_t r = 0; r < ep->ones_cap; r++) one[r] = 1.0f;
    int rc = ep->be->upload(ep->ones, one, sizeof(float) * ep->ones_cap, err);
    if (!rc) rc = ep->be->sync(err); /* the upload reads `one` */
    free(one);
    return rc;
}

/* Exchanges rows: send[scount[p]·width] to each p, recv[rcount[p]·width] from each p, in rank order. Started and
 * waited for at once: on NCCL the wait puts the exchange before the backend stream's next op without stopping the host
 * (a blocking call would synchronise); a host buffer (the local expert ids) is staged and still returns in order. */
static int exchange(k3c_ep *ep, const void *send, const int64_t *scount, void *recv, const int64_t *rcount,
                    int64_t width, k3c_dtype t, k3c_err *err) {
    int P = ep->size;
    int64_t *sc = ep->tmp, *sd = sc + P, *rc = sd + P, *rd = rc + P, so = 0, ro = 0;
    for (int p = 0; p < P; p++) {
        sc[p] = scount[p] * width, sd[p] = so, so += sc[p];
        rc[p] = rcount[p] * width, rd[p] = ro, ro += rc[p];
    }
    k3c_comm_req *req = NULL;
    CHECK_RC(k3c_comm_alltoall(ep->comm, send, sc, sd, recv, rc, rd, t, &req, err));
    return k3c_comm_wait(req, err);
}

static int64_t total(const int64_t *count, int P) {
    int64_t n = 0;
    for (int p = 0; p < P; p++) n += count[p];
    return n;
}

/* Rows of width D in backend memory (float32 both ends) over the wire: float32, or bf16 when the backend's kernels
 * round activations to bf16 anyway (be->wire_bf16, or the ep's forced choice); the rounding happens once, at the
 * sender, and everything after the wire (the experts, the combines) sums in float32. */
static int wire(k3c_ep *ep, const float *src, const int64_t *scount, float *dst, const int64_t *rcount, int64_t D,
                k3c_err *err) {
    const k3c_backend_f32 *be = ep->be;
    if (!(ep->wire_bf16 < 0 ? be->wire_bf16 : ep->wire_bf16))
        return exchange(ep, src, scount, dst, rcount, D, K3C_F32, err);
    const int64_t ns = total(scount, ep->size) * D, nr = total(rcount, ep->size) * D;
    CHECK_RC(grow_be(be, (void **)&ep->w16, &ep->w16_cap, (size_t)(ns + nr), sizeof(uint16_t), err));
    uint16_t *s16 = ep->w16, *r16 = s16 + ns;
    CHECK_RC(be->to_bf16(ns, src, s16, err));
    CHECK_RC(exchange(ep, s16, scount, r16, rcount, D, K3C_BF16, err));
    return be->from_bf16(nr, r16, dst, err);
}

/* The send order of this layer's live slots (grouped by the rank of their expert) into host order / pos, the row
 * counts both ways (an all-to-all of one count per peer), and order / pos uploaded for the backend's row moves. */
static int plan(k3c_ep *ep, k3c_ep_layer *L, int64_t S, const int32_t *ids, int32_t *order, int32_t *pos,
                k3c_err *err) {
    int P = ep->size;
    int64_t *off = ep->tmp; /* [P + 1] running offsets */
    memset(L->scount, 0, sizeof(int64_t) * (size_t)P);
    for (int64_t i = 0; i < S; i++) {
        if (ids[i] < -1 || ids[i] >= ep->E)
            return k3c_errf(err, K3C_EINVAL, "expert parallelism: expert id %d outside [-1, %lld)", ids[i],
                            (long long)ep->E);
        if (ids[i] >= 0) L->scount[ids[i] / ep->local]++;
    }
    off[0] = 0;
    for (int p = 0; p < P; p++) off[p + 1] = off[p] + L->scount[p];
    for (int64_t i = 0; i < S; i++) { /* stable: ascending slot id inside a destination */
        pos[i] = -1;
        if (ids[i] < 0) continue;
        int64_t row = off[ids[i] / ep->local]++;
        pos[i] = (int32_t)row;
        order[row] = (int32_t)i;
    }
    L->live = off[P];
    CHECK_RC(grow_be(ep->be, (void **)&L->idx, &L->cap_idx, (size_t)(2 * S), sizeof(int32_t), err));
    CHECK_RC(ep->be->upload(L->idx, order, sizeof(int32_t) * (size_t)S, err));
    CHECK_RC(ep->be->upload(L->idx + S, pos, sizeof(int32_t) * (size_t)S, err));
    int64_t *one = ep->tmp + P + 1, *iota = one + P; /* one count per peer */
    for (int p = 0; p < P; p++) one[p] = 1, iota[p] = p;
    CHECK_RC(k3c_comm_alltoall(ep->comm, L->scount, one, iota, L->rcount, one, iota, K3C_I64, NULL, err));
    L->R = total(L->rcount, P);
    return K3C_OK;
}

/* Where this rank's experts start in the stacked w1 / w3 / w2 (and their gradients) the model passes: at slice 0 when
 * the model holds only them (expert residency, ep->resident), else at slice rank·local of the whole stack. */
static size_t local_experts_at(const k3c_ep *ep, const k3c_moe_sizes *s) {
    return ep->resident ? 0 : (size_t)(ep->rank * ep->local * s->inter * s->dim);
}

/* Routing: the expert ids come down to the host — the one synchronisation of an expert-parallel layer, because the
 * all-to-all(v) sizes must be known on the host before any row can move — the plan is made there and the local expert
 * id of every sent row travels to its rank (into L->idr, after the received rows' room L->xr). */
static int route(k3c_ep *ep, k3c_ep_layer *L, const int32_t *ids_be, k3c_err *err) {
    const int64_t S = L->T * L->k, D = L->D;
    if (S >= INT32_MAX) return k3c_errf(err, K3C_EINVAL, "expert parallelism: %lld slots (≥ 2^31)", (long long)S);
    CHECK_RC(grow((void **)&ep->host, &ep->host_cap, (size_t)(4 * S), sizeof(int32_t), err));
    int32_t *ids = ep->host, *order = ids + S, *pos = order + S, *sid = pos + S;
    CHECK_RC(ep->be->download(ids, ids_be, sizeof(int32_t) * (size_t)S, err));
    CHECK_RC(plan(ep, L, S, ids, order, pos, err));
    for (int64_t r = 0; r < L->live; r++) sid[r] = (int32_t)(ids[order[r]] % ep->local);
    const int64_t R = L->R;
    CHECK_RC(grow_be(ep->be, (void **)&L->xr, &L->cap_xr, (size_t)(R * D + R), sizeof(float), err));
    L->idr = (int32_t *)(L->xr + R * D);
    return exchange(ep, sid, L->scount, L->idr, L->rcount, 1, K3C_I32, err);
}

/* The local experts' op sizes for R received rows (one slot each) and its workspace. */
static int local_sizes(k3c_ep *ep, const k3c_moe_sizes *s, int64_t R, k3c_moe_sizes *ls, k3c_err *err) {
    *ls = (k3c_moe_sizes){R, s->dim, s->inter, ep->local, 1, s->act};
    return grow_be(ep->be, &ep->ws, &ep->ws_bytes, ep->be->moe_workspace(ls), 1, err);
}

/* Everything stays in the backend's memory (a device's on the GPU): the row gathers, the combines and the wire
 * conversions are backend ops, the communicator moves backend memory; only the expert ids come to the host (route). */
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
    CHECK_RC(route(ep, L, ids_be, err));
    const int64_t S = T * k, R = L->R;
    CHECK_RC(grow_be(be, (void **)&ep->rows, &ep->rows_cap, (size_t)((S > R ? S : R) * D), sizeof(float), err));
    CHECK_RC(be->moe_gather(L->live, k, D, L->idx, xv, ep->rows, err));
    CHECK_RC(wire(ep, ep->rows, L->scount, L->xr, L->rcount, D, err));
    k3c_moe_sizes ls;
    CHECK_RC(local_sizes(ep, s, R, &ls, err));
    CHECK_RC(grow_be(be, &L->saved, &L->cap_saved, be->moe_saved_bytes(&ls), 1, err));
    CHECK_RC(unit_gates(ep, R, err));
    CHECK_RC(grow_be(be, (void **)&ep->out, &ep->out_cap, (size_t)(R * D), sizeof(float), err));
    const size_t off = local_experts_at(ep, s);
    if (R)
        CHECK_RC(be->moe_fwd(be->ctx, &ls, L->xr, L->idr, ep->ones, (const float *)w1 + off, (const float *)w3 + off,
                             (const float *)w2 + off, ep->out, L->saved, ep->ws, err));
    CHECK_RC(grow_be(be, (void **)&L->back, &L->cap_back, (size_t)(L->live * D), sizeof(float), err));
    CHECK_RC(wire(ep, ep->out, L->rcount, L->back, L->scount, D, err));
    /* combined in slot order, as the one-process op does (ops/moe.c k3c_moe_combine) */
    return be->moe_combine(T, k, D, L->idx + S, wv, L->back, yv, err);
}

/* The backward: the gate weights' gradient from the returned outputs and each slot's weighted output gradient
 * (moe_combine_bwd), those rows over the wire, the local experts' backward, the input gradients back and added to dx
 * in slot order (moe_gather_bwd). */
static int ep_bwd(void *ctx, int l, int real_bytes, const k3c_moe_sizes *s, const void *xv, const int32_t *ids,
                  const void *wv, const void *w1, const void *w3, const void *w2, const void *dyv, void *dxv, void *dw1,
                  void *dw3, void *dw2, void *dwv, k3c_err *err) {
    k3c_ep *ep = ctx;
    const k3c_backend_f32 *be = ep->be;
    const k3c_ep_layer *L = l >= 0 && l < ep->n_layers ? &ep->layer[l] : NULL;
    if (real_bytes != (int)sizeof(float) || !L || L->T != s->tokens || L->k != s->top_k || L->D != s->dim)
        return k3c_errf(err, K3C_EINVAL, "expert parallelism: layer %d backward without its forward", l);
    const int64_t T = L->T, k = L->k, D = L->D, R = L->R;
    const int32_t *pos = L->idx + T * k;
    CHECK_RC(be->moe_combine_bwd(T, k, D, pos, wv, L->back, dyv, ep->rows, dwv, err));
    CHECK_RC(grow_be(be, (void **)&ep->dyr, &ep->dyr_cap, (size_t)(R * D), sizeof(float), err));
    CHECK_RC(wire(ep, ep->rows, L->scount, ep->dyr, L->rcount, D, err));
    k3c_moe_sizes ls;
    CHECK_RC(local_sizes(ep, s, R, &ls, err));
    float *dxr = ep->out; /* sized by the forward */
    CHECK_RC(be->zero(dxr, R * D, err));
    CHECK_RC(unit_gates(ep, R, err));
    const size_t off = local_experts_at(ep, s);
    if (R)
        CHECK_RC(be->moe_bwd(be->ctx, &ls, L->xr, L->idr, ep->ones, (const float *)w1 + off, (const float *)w3 + off,
                             (const float *)w2 + off, L->saved, ep->dyr, dxr, (float *)dw1 + off, (float *)dw3 + off,
                             (float *)dw2 + off, NULL, ep->ws, err));
    CHECK_RC(wire(ep, dxr, L->rcount, L->back, L->scount, D, err)); /* the outputs in back are spent */
    (void)xv, (void)ids;
    return dxv ? be->moe_gather_bwd(T, k, D, pos, L->back, dxv, err) : K3C_OK;
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
    ep->wire_bf16 = -1;
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

void k3c_ep_place(int rank, int ep, int inner, int *ep_rank, int *color) {
    *ep_rank = rank % (ep * inner) / inner;
    *color = rank / (ep * inner) * inner + rank % inner;
}

void k3c_ep_free(k3c_ep *ep) {
    const k3c_backend_f32 *be = ep->be;
    for (int l = 0; ep->layer && l < ep->n_layers; l++) {
        k3c_ep_layer *L = &ep->layer[l];
        void *dev[] = {L->idx, L->back, L->xr, L->saved};
        for (int i = 0; i < 4; i++)
            if (dev[i]) be->free(dev[i]);
    }
    if (ep->layer) free(ep->layer[0].scount);
    free(ep->layer);
    free(ep->tmp);
    void *dev[] = {ep->ws, ep->rows, ep->w16, ep->out, ep->dyr, ep->ones};
    for (int i = 0; i < 6; i++)
        if (dev[i]) be->free(dev[i]);
    k3c_aligned_free(ep->host);
    memset(ep, 0, sizeof *ep);
}
