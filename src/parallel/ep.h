/* ep.h — expert parallelism: the routed experts of every MoE layer split over the ranks of an EP group, tokens
 * dispatched to their experts' ranks and the outputs combined back with all-to-all(v), dropless (every routed slot is
 * computed). Plugs into the model as its k3c_expert_exchange. Spec: docs/PARALLEL.md "Expert parallelism". */
#ifndef K3C_DIST_EP_H
#define K3C_DIST_EP_H

#include "parallel/comm.h"
#include "model/model.h"
#include "ops/backend.h"

/* What one MoE layer's forward keeps for its backward. */
typedef struct {
    int64_t T, k, D; /* tokens, slots per token, row width of the last forward */
    int32_t *idx;    /* [2·T·k] (backend memory): order, the slot ids in send order (grouped by destination rank,
                        ascending slot id inside), then pos, the send row of each slot (−1: a dead slot) */
    int64_t live;    /* rows sent (the live slots) */
    int64_t *scount; /* [P] rows sent to each rank */
    int64_t *rcount; /* [P] rows received from each rank */
    int64_t R;       /* rows received (computed here) */
    float *xr;       /* [R, D] received token rows (backend memory) */
    int32_t *idr;    /* [R] their local expert ids (backend memory, after xr) */
    float *back;     /* [live, D] expert outputs of this rank's slots, in send order (backend memory) */
    void *saved;     /* the local expert op's saved buffer for R rows (backend memory) */
    size_t cap_idx, cap_xr, cap_back, cap_saved;
} k3c_ep_layer;

typedef struct {
    k3c_comm *comm; /* the EP group (not owned) */
    int rank, size;
    int64_t E, local;          /* experts in the model, experts per rank */
    int resident;              /* 1: the model's table holds only this rank's experts (k3c_model_create_resident with
                                  k3c_ep_experts): the expert weights it passes start at them; 0: every expert */
    const k3c_backend_f32 *be; /* runs the local experts and the row moves; its memory holds the model's tensors */
    k3c_ep_layer *layer;       /* [num_layers] */
    int n_layers;
    int64_t *tmp;  /* [4·P + 1] displacements */
    int wire_bf16; /* −1 (k3c_ep_init): the backend's be->wire_bf16; 0: rows travel as float32; 1: as bf16 (a test
                      forces it on the CPU) */
    void *ws;      /* the local expert op's workspace (backend memory) */
    size_t ws_bytes;
    int32_t *host;           /* host: the expert ids [T·k], the plan's order and pos [2·T·k], the sent rows' local
                                expert ids [T·k] */
    float *rows;             /* backend: rows to send (gathered token rows, weighted output gradients) */
    uint16_t *w16;           /* backend: the bf16 wire's send and receive rows */
    float *out, *dyr, *ones; /* backend memory: the local experts' outputs (or input gradients), the received
                                  output gradients, the unit gate weights */
    size_t host_cap, rows_cap, w16_cap, out_cap, dyr_cap, ones_cap;
    k3c_expert_exchange exchange; /* what the model calls: set m->experts = &ep->exchange */
} k3c_ep;

/* ep over `comm` (its size divides cfg's routed experts; rank r holds experts [r·E/P, (r+1)·E/P)). */
int k3c_ep_init(k3c_ep *ep, k3c_comm *comm, const k3c_backend_f32 *be, const k3c_config *cfg, k3c_err *err);
void k3c_ep_free(k3c_ep *ep);
/* The experts rank `rank` of an EP group of `size` holds: [*e0, *e0 + *n) (size divides cfg's routed experts). */
void k3c_ep_experts(const k3c_config *cfg, int rank, int size, int64_t *e0, int64_t *n);
/* Where world rank `rank` sits in the EP groups of `ep` ranks (docs/PARALLEL.md "Launch"): a group takes every
 * inner-th rank, inner being the TP or CP group's size (those innermost; 1 without them), so its ranks share
 * rank / (ep·inner) and rank % inner; *ep_rank: its rank in the group, *color: the group's (k3c_comm_split). */
void k3c_ep_place(int rank, int ep, int inner, int *ep_rank, int *color);

#endif
