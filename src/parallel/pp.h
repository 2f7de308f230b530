/* pp.h — pipeline parallelism: the layers split into contiguous stages, one per rank of a pipeline group; a step's
 * batch split into micro-batches at document boundaries and run with a 1F1B schedule; the Block AttnRes boundary state
 * (completed blocks and the partial sum) sent forward between stages and its gradients backward; each stage keeps
 * only its boundary inputs per micro-batch in flight and recomputes its forward before the backward.
 * Spec: docs/PARALLEL.md "Pipeline parallelism". */
#ifndef K3C_DIST_PP_H
#define K3C_DIST_PP_H

#include "parallel/comm.h"
#include "parallel/cp.h"
#include "model/model.h"
#include "ops/backend.h"

typedef struct {
    k3c_comm *comm; /* the pipeline group, one rank per stage in stage order (not owned): boundaries forward */
    k3c_comm *back; /* the same ranks (owned): boundary gradients backward, so that on a device communicator each
                          direction has its own stream and an unreceived send never holds up a receive behind it */
    const k3c_backend_f32 *be; /* whose memory holds the boundary tensors and S_max */
    int stage, stages;         /* this rank's stage */
    int l0, l1;                /* its layers [l0, l1) */
    int e0, e1;      /* its table entries [e0, e1): its layers, the embedding or the head on the first or last stage */
    int micro;       /* micro-batches per step */
    int n_in, n_out; /* boundary tensors before l0 (received) and before l1 (sent) */
    int64_t D;       /* hidden size */
    float *buf;      /* per step: boundary inputs, outputs and both gradients of every micro-batch (backend memory) */
    size_t buf_cap;
    int32_t *cu; /* the micro-batches' cu_seqlens */
    int cu_cap;
    float *smax;        /* [L·H] S_max of one micro-batch's forward (backend memory) */
    float *smax_host;   /* [2·L·H] host copies of it and of the batch's S_max, to take their maximum */
    k3c_comm_req **req; /* [2·micro] sends in flight */
    k3c_cp *cp;         /* NULL, or context parallelism inside the stage (set by the caller, with m->context): each
                           micro-batch is cut into this rank's range of it before each of its forwards */
    int64_t T_local;    /* tokens this rank ran in the last step (its ranges, or the batch) */
} k3c_pp;

/* The layers [*l0, *l1) of stage `stage` of `stages` (at most cfg's layers): L / stages each, the first L mod stages
 * stages one more (k3c_plan_stage_layers, docs/PLAN.md's split; K3's 93 layers on 32 stages: 29 of 3, 3 of 2); what
 * its model holds (k3c_residency.layer0, layer1; docs/PARALLEL.md "Residency"). */
void k3c_pp_layers(const k3c_config *cfg, int stage, int stages, int *l0, int *l1);
/* pp over `comm` (its size = the stages, at most cfg's layers; the stage is comm's rank), `micro` micro-batches per
 * step (>= 1); the boundary tensors live in be's memory (a device backend needs a device communicator). t: the
 * stage's model's table, holding the stage's layers only (k3c_pp_layers). */
int k3c_pp_init(k3c_pp *pp, k3c_comm *comm, const k3c_config *cfg, const k3c_param_table *t, int micro,
                const k3c_backend_f32 *be, k3c_err *err);
void k3c_pp_free(k3c_pp *pp);

/* One step's forward and backward of this stage over b (this rank's batch, explicit targets and cu_seqlens; its
 * loss_norm, or else its counted targets, normalises every micro-batch; with pp->cp and m->context set, its CP
 * group's data-parallel part, each micro-batch run as this rank's range of it), 1F1B over pp->micro micro-batches;
 * gradients ADDED into m->g (this stage's entries). *loss: the batch loss (summed on the last stage, sent to every
 * stage). With m->stats set, its route statistics of this stage's MoE layers cover b in token order (with CP: this
 * rank's ranges of the micro-batches, one after another) and its S_max is the maximum over the micro-batches. backward 0: forward only (validation; one micro-batch, nothing kept). */
int k3c_pp_step(k3c_pp *pp, k3c_model *m, const k3c_model_batch *b, k3c_arena *arena, int backward, double *loss,
                k3c_err *err);

#endif
