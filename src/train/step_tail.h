/* step_tail.h — internal to the library: the tail of every training step after the backward (gradient clipping, the
 * guard against a non-finite gradient norm, the optimizer update, QK-Clip, the router-bias balancing) over parameter
 * groups, for pretraining (trainer.c), SFT and RL (post/) and vision training (vision/train.c), every op through the
 * backend table. Spec: docs/TRAINING.md "The step's tail". */
#ifndef K3C_TRAIN_STEP_TAIL_H
#define K3C_TRAIN_STEP_TAIL_H

#include "model/model.h"
#include "ops/backend.h"
#include "ops/optim.h"
#include "parallel/dp.h"
#include "parallel/tp.h"

#define K3C_TAIL_GROUPS 2 /* the text model's parameters, and the vision tower's */

/* Parameters the optimizer steps together: a table over the flat buffers w and g, the optimizer's layout and
 * hyper-parameters for it, its state, and the backend's optimizer instance (be->optim_open(opt, table)); the buffers
 * and the state in the backend's memory. */
typedef struct {
    const k3c_param_table *table;
    k3c_optim *opt;
    void *inst;
    float *w, *g, *state;
} k3c_param_group;

/* A group over n parameters held as one flat vector (the vision tower): a one-entry table, AdamW with weight decay on
 * every element, zeroed state and the instance on be. Owns its table, layout, state and instance. */
typedef struct {
    k3c_param_group group;
    k3c_param entry;
    k3c_param_table table;
    k3c_optim opt;
    const k3c_backend_f32 *be;
} k3c_flat_group;
int k3c_flat_group_open(k3c_flat_group *f, const k3c_backend_f32 *be, const char *name, float *w, float *g, size_t n,
                        const k3c_optim *hp, k3c_err *err);
void k3c_flat_group_close(k3c_flat_group *f);

/* What the tail does besides the update. */
typedef struct {
    double grad_clip;   /* each group's gradient clipped to this norm on its own (0: measured, not clipped) */
    double qk_clip_tau; /* QK-Clip's threshold over the model's MLA heads (0: off); needs the model's step statistics */
    int balancing;      /* k3c_balancing: QUANTILE and BIAS update the router biases from the model's step statistics;
                           AUX and NONE leave them */
    int qb_mode;        /* QUANTILE: the k3c_qb_mode */
    double bias_gamma;  /* BIAS: the step γ */
} k3c_tail_config;

/* The parallel step's hooks (NULL members: this process alone): data parallelism clips and steps group 0 (the model)
 * over its owners, tensor parallelism masks the other ranks' heads before QK-Clip. */
typedef struct {
    k3c_dp *dp;
    k3c_comm *pp_comm; /* pipeline stages: the norm summed over them */
    k3c_tp *tp;
} k3c_tail_parallel;

/* The tail of one model: group[0] is the model's parameters (m->table over m->w, m->g), further groups follow it
 * (the vision tower). The balancing workspace is kept between steps (backend memory). */
typedef struct {
    k3c_model *m;
    k3c_param_group group[K3C_TAIL_GROUPS];
    int n_groups;
    const k3c_tail_parallel *par; /* NULL: alone */
    void *ws;
    size_t ws_bytes;
} k3c_step_tail;

typedef struct {
    double grad_norm[K3C_TAIL_GROUPS]; /* each group's norm before clipping */
    int skipped;                       /* 1: a norm was not finite; nothing was updated */
    char why[64];                      /* then: "gradient norm is nan" (the guard's words) */
} k3c_tail_result;

/* One tail: clip every group (norms to r), skip the update when a norm is not finite, else step group i with
 * learning rate lr[i] (step ≥ 1, the update count), QK-Clip the model's MLA heads and balance its routers. The host
 * waits for the device once per group, for its norm. */
int k3c_step_tail_run(k3c_step_tail *t, const k3c_tail_config *c, const double *lr, int64_t step, k3c_tail_result *r,
                      k3c_err *err);
/* Frees the workspace (before the model: it is the model's backend's memory). */
void k3c_step_tail_free(k3c_step_tail *t);

#endif
