/* tp.h — tensor parallelism: the KDA and MLA heads, the dense MLP's and shared experts' intermediate and the vocabulary
 * split over the ranks of a TP group (column-parallel input projections, row-parallel output projections summed over the
 * group, a vocabulary-parallel embedding and cross-entropy); the model calls it through its k3c_tensor_parallel hook.
 * Spec: docs/PARALLEL.md "Tensor parallelism". */
#ifndef K3C_DIST_TP_H
#define K3C_DIST_TP_H

#include "parallel/comm.h"
#include "model/model.h"
#include "ops/backend.h"

#define K3C_TP_MAX 64 /* ranks of a TP group (the gathers' counts live on the stack) */

typedef struct {
    k3c_comm *comm; /* the TP group (not owned) */
    int rank, size;
    const k3c_backend_f32 *be; /* whose memory holds the model's tensors (the hooks work on host copies) */
    double *red;               /* per-token reductions of the cross-entropy [3·T] */
    int64_t red_cap;
    char *host; /* host copies of a hook's tensors */
    size_t host_cap, host_used;
    float *stage;      /* k3c_tp_gather_entry's shares (the backend's memory) */
    float *stage_host; /* rank 0: their host copy */
    size_t stage_cap;
    k3c_tensor_parallel hook; /* what the model calls: set m->tp = &tp->hook */
} k3c_tp;

/* Checks, naming the layout: the group's size divides every KDA and MLA head count, the vocabulary, the dense MLP's
 * and the shared experts' intermediate (K3C_ECONFIG otherwise). */
int k3c_tp_check(const k3c_config *cfg, int64_t tp, const char *file, k3c_err *err);
/* tp over `comm` for a model on backend be (float32 tables; a float64 model on the CPU passes the CPU's float32 table:
 * the hooks use only its memory moves); a device backend needs a device communicator. t: the model's table, holding
 * share comm->rank of comm->size (k3c_residency.tp_rank, tp_size; K3C_EINVAL otherwise). */
int k3c_tp_init(k3c_tp *tp, k3c_comm *comm, const k3c_backend_f32 *be, const k3c_config *cfg, const k3c_param_table *t,
                k3c_err *err);
void k3c_tp_free(k3c_tp *tp);
/* The whole tensor of a tensor-parallel share p from every rank of the group (checkpoints write whole tensors): x
 * (host memory) holds this rank's `blocks` consecutive tensors of p's shape (a weight: 1; optimizer state: its
 * blocks), and rank 0 gets out (host memory, blocks × p->whole_numel floats) ← the same blocks whole (elements no
 * share holds, K3's A_log padding, zero). Every rank of the group calls it for the same entries in the same order. */
int k3c_tp_gather_entry(k3c_tp *tp, const k3c_param *p, const float *x, int64_t blocks, float *out, k3c_err *err);
/* Room for gathers of up to `floats` per rank, agreed over the group first (a collective: every rank gets the same
 * success or failure, so none is left waiting in a gather another skips). */
int k3c_tp_gather_room(k3c_tp *tp, size_t floats, k3c_err *err);
/* Before the replicated entries' gradients are summed over every rank: an entry replicated with the same gradient on
 * each rank of the group keeps it on TP rank 0 only, so the sum counts it once (partial ones hold this rank's part:
 * the sum completes them; shares are summed over the ranks of the same TP rank). g: the model's real (K3C_F32 or
 * K3C_F64). */
int k3c_tp_dedup_grads(const k3c_tp *tp, const k3c_param_table *t, void *g, k3c_dtype dt, k3c_err *err);
/* The same over the table entries [e0, e1) only (one layer's, as its backward completes them: docs/PARALLEL.md "Data
 * parallelism (ZeRO-1)", the overlapped reduce-scatter). */
int k3c_tp_dedup_grads_range(const k3c_tp *tp, const k3c_param_table *t, void *g, k3c_dtype dt, int e0, int e1,
                             k3c_err *err);
/* S_max [L, H] of the MLA heads other ranks own set to −FLT_MAX (this rank's forward wrote only its own), before the
 * maximum over the ranks. */
int k3c_tp_mask_smax(k3c_tp *tp, const k3c_config *cfg, float *smax, k3c_err *err);

#endif
